/* mcmc.c — FlexFlow's search (Jia et al. MLSys'19): Metropolis-Hastings over the
 * per-operator configurations.
 *
 * A proposal redraws one operator's configuration uniformly among its candidates and,
 * with probability "propagate", gives its neighbours the matching configuration (same
 * devices, same split of the batch).  A proposal whose cost is new and the current cost is
 * cur is accepted with probability min(1, exp(-beta * (new - cur) / cur)): beta is relative
 * to the current time, so one setting suits models whose iterations take microseconds or
 * seconds.  Each step is a delta simulation (SimSession).  The acceptance number u is read
 * ahead of the simulation: the proposal is accepted exactly when its cost is below
 * cur - cur ln(u) / beta, so the simulation stops once it passes that bound (most
 * proposals late in a search are rejected).
 *
 * While the current plan trades time for memory (recomputation, ZeRO, micro-batches),
 * a proposal changes the whole plan instead with probability "plan-moves": the number of
 * micro-batches (gradient accumulation) doubled or halved, activation recomputation or
 * ZeRO stepped (none, ZeRO-1, ZeRO-3).  These decide between memory and time where per-operator moves cannot
 * (an LLM that fits only with recomputation may run faster with smaller micro-batches and
 * none); each is a full simulation, taken only when it is faster.  On a model with
 * self-attention over long sequences or with a mixture of experts, a plan of Megatron's
 * space (an expert start, say) also moves its knobs with the same probability: the
 * context-parallel degree traded against another, the expert-parallel degree doubled or
 * halved, the ZeRO stage (1, 2, 3) one up or down, or under sequence parallelism its
 * collectives' overlap with their GEMMs turned on or off (search_megatron_knob_neighbours());
 * any other plan steps its ZeRO stage.
 *
 * Several chains run on the worker threads, each with its own random stream and its own
 * share of the evaluation budget.  They meet after every epoch: a chain that did not
 * improve during the epoch restarts from the best strategy found so far.  Under MPI the
 * chains are divided among the ranks by index, and the ranks exchange their best at the
 * end of every epoch (distributed.h): an epoch is a number of steps, so the exchanges
 * fall at the same evaluations however many ranks there are. */
#include "search-private.h"
#include "distributed.h"

#include <string.h>

typedef struct {
  SearchEvaluator *ev;
  GRand *rng;
  gint64 share;      /* evaluations this chain may use; 0: no cap */
  gint64 used;       /* by evaluators it dropped at restarts       */
  double cur;
  double best;
  gboolean improved;
  gboolean done;
} Chain;

typedef struct {
  SearchContext *ctx;
  const SearchProblem *p;
  Chain *chains;
  int n_chains;
  const SimStrategy *restart;   /* the best so far, for restart()                   */
  double restart_cost;
  int epoch;
  double beta;
  double propagate;
  double plan_moves;    /* probability of a move of the whole plan                      */
  gboolean knobs;       /* Megatron's knobs are moved (long context, experts)          */
  double pipelines;     /* share of the budget for expert plans with a pipeline         */
  gboolean stop_early;  /* simulations stop at the acceptance bound                   */
  GArray **nbrs;     /* per op: neighbouring ops                   */
  int *movable;      /* ops with more than one candidate           */
  int n_movable;
} Mcmc;

typedef struct {
  int op;
  int degree[SEARCH_MAX_DIMS];
  int n;
  int *devices;
} Undo;

static void save(const SearchEvaluator *ev, int op, Undo *u)
{
  const SimStrategy *s = search_evaluator_get_strategy(ev);
  u->op = op;
  memcpy(u->degree, sim_strategy_op_degrees(s, op), sizeof u->degree);
  const int *dev = sim_strategy_op_devices(s, op, &u->n);
  u->devices = g_memdup2(dev, sizeof(int) * (gsize)MAX(u->n, 1));
}

/* The cost below which a candidate is accepted for the chain's next number u: cur - cur
 * ln(u) / beta (a hair above, so that rounding never turns away a candidate the rule
 * accepts).  u is read ahead on a copy of the stream: the chain still draws it only for a
 * move uphill.  INFINITY when simulations are not to stop early. */
static double acceptance_bound(const Mcmc *m, const Chain *c)
{
  if (!m->stop_early || !isfinite(c->cur) || c->cur <= 0 || m->beta <= 0)
    return INFINITY;
  GRand *ahead = g_rand_copy(c->rng);
  double u = g_rand_double(ahead);
  g_rand_free(ahead);
  return u > 0 ? (c->cur - c->cur * log(u) / m->beta) * (1 + 1e-9) : INFINITY;
}

/* Metropolis-Hastings' rule for a candidate of @cost; updates the chain when it is taken. */
static gboolean accept_cost(const Mcmc *m, Chain *c, double cost)
{
  gboolean accept = cost <= c->cur;
  if (!accept && isfinite(cost) && isfinite(c->cur) && c->cur > 0)
    accept = g_rand_double(c->rng) < exp(-m->beta * (cost - c->cur) / c->cur);
  if (!accept && !isfinite(c->cur))
    accept = TRUE;
  if (accept) {
    c->cur = cost;
    if (cost < c->best) {
      c->best = cost;
      c->improved = TRUE;
    }
  }
  return accept;
}

/* Runs @s in an evaluator of its own; NULL when the plan is not valid (a count of
 * micro-batches the batch or a split does not allow).  *@raw gets the unpenalized cost
 * (INFINITY when it does not fit). */
static SearchEvaluator *try_plan(Mcmc *m, Chain *c, int i, const SimStrategy *s, double *raw)
{
  SearchEvaluator *ev = search_evaluator_new(m->ctx, s, (guint32)i, NULL);
  if (!ev)
    return NULL;
  gint64 used = c->used + search_evaluator_get_evals(c->ev);
  if (c->share > 0)
    search_evaluator_set_limit(ev, MAX(1, c->share - used));
  /* Only a faster plan is taken, so a run may stop at the current cost. */
  *raw = search_evaluator_run_bounded(ev, m->stop_early ? c->cur : INFINITY);
  return ev;
}

/* A plan simulated in full beside the chain (@ev, its raw time @raw): the chain's plan
 * from now on when it is faster and accepted, else dropped; its evaluations count. */
static void keep_if_faster(Mcmc *m, Chain *c, SearchEvaluator *ev, double raw)
{
  double cost = search_penalized(ev, raw);
  if (cost < c->cur && accept_cost(m, c, cost)) {
    c->used += search_evaluator_get_evals(c->ev);
    search_evaluator_free(c->ev);
    c->ev = ev;
  } else {
    c->used += search_evaluator_get_evals(ev);
    search_evaluator_free(ev);
  }
}

/* A move of the whole plan (see the top).  Switching recomputation or ZeRO off doubles
 * the micro-batches until the plan fits again (the memory it saved must come from
 * somewhere), so that the two steps, neither faster alone, are one move.  The candidate
 * runs in an evaluator of its own, which replaces the chain's when the move is taken. */
static void plan_move(Mcmc *m, Chain *c, int i)
{
  const SimStrategy *cur = search_evaluator_get_strategy(c->ev);
  g_autoptr(SimStrategy) s = sim_strategy_copy(cur);
  int mb = sim_strategy_get_microbatches(s);
  SimMemoryOptions mo = sim_strategy_get_memory(s);
  gboolean relax = FALSE;
  switch (g_rand_int_range(c->rng, 0, 4)) {
  case 0:
    mb *= 2;
    break;
  case 1:
    if (mb == 1)
      return;
    mb /= 2;
    break;
  case 2:
    relax = mo.recompute != SIM_RECOMPUTE_NONE;
    mo.recompute = relax ? SIM_RECOMPUTE_NONE : SIM_RECOMPUTE_FULL;
    break;
  default:
    /* ZeRO in turn: none, ZeRO-1, ZeRO-3 (weights sharded too), none. */
    relax = mo.zero3;
    mo.zero3 = mo.zero1 && !mo.zero3;
    mo.zero2 = mo.zero3;
    mo.zero1 = !relax;
    /* Back to no ZeRO brings the optimizer back from the host too. */
    if (relax)
      mo.offload = 0;
    break;
  }
  sim_strategy_set_memory(s, &mo);
  SearchEvaluator *ev = NULL;
  double raw = INFINITY;
  for (int tries = 0; tries < (relax ? 8 : 1); tries++, mb *= 2) {
    if (ev) {
      c->used += search_evaluator_get_evals(ev);
      search_evaluator_free(ev);
    }
    sim_strategy_set_microbatches(s, mb);
    ev = try_plan(m, c, i, s, &raw);
    if (!ev || isfinite(raw) || search_evaluator_last_memory(ev) <= 1)
      break;
  }
  if (!ev)
    return;
  keep_if_faster(m, c, ev, raw);
}

/* A move of Megatron's knobs (see the top): the current plan, when it is a plan of
 * Megatron's space exactly, replaced by one of its neighbours there that changes the
 * context-parallel degree, the expert-parallel degree, the ZeRO stage or the overlap of
 * tensor-parallel communication; a full
 * simulation, taken only when it is faster. */
static void knob_move(Mcmc *m, Chain *c, int i)
{
  const SimStrategy *cur = search_evaluator_get_strategy(c->ev);
  SimMegatronOptions o, cand[SEARCH_KNOB_MAX];
  g_autoptr(SimStrategy) s = NULL;
  if (search_megatron_options_of(m->p, cur, &o)) {
    int n = search_megatron_knob_neighbours(m->p, &o, cand);
    if (n == 0)
      return;
    s = search_megatron_plan(m->p, &cand[g_rand_int_range(c->rng, 0, n)]);
  } else {
    /* A plan of its own operators' configurations: its ZeRO stage one up or down. */
    SimMemoryOptions mo = sim_strategy_get_memory(cur);
    int z = mo.zero3 ? 3 : mo.zero2 ? 2 : mo.zero1 ? 1 : 0;
    z = z == 0 ? 1 : z == 3 ? 2 : z + (g_rand_boolean(c->rng) ? 1 : -1);
    mo.zero1 = z >= 1;
    mo.zero2 = z >= 2;
    mo.zero3 = z >= 3;
    s = sim_strategy_copy(cur);
    sim_strategy_set_memory(s, &mo);
  }
  if (!s)
    return;
  double raw = INFINITY;
  SearchEvaluator *ev = try_plan(m, c, i, s, &raw);
  if (!ev)
    return;
  keep_if_faster(m, c, ev, raw);
}

static void chain_epoch(int i, gpointer data)
{
  Mcmc *m = data;
  Chain *c = &m->chains[i];
  const SearchProblem *p = m->p;
  c->improved = FALSE;
  Undo undo[16];
  for (int step = 0; step < m->epoch; step++) {
    if (search_evaluator_should_stop(c->ev)) {
      c->done = TRUE;
      break;
    }
    /* On a long sequence or a mixture of experts (only there, so that other searches
     * draw what they drew before), Megatron's knobs move as often as a plan. */
    if (m->knobs && m->plan_moves > 0 && g_rand_double(c->rng) < m->plan_moves) {
      knob_move(m, c, i);
      if (i == 0)
        search_context_set_current(m->ctx, c->cur);
      continue;
    }
    /* Only a plan that saves memory can gain by a plan move: a chain whose plan fits
     * without savings draws none. */
    if (m->plan_moves > 0 &&
        search_plan_saves_memory(search_evaluator_get_strategy(c->ev)) &&
        g_rand_double(c->rng) < m->plan_moves) {
      plan_move(m, c, i);
      if (i == 0)
        search_context_set_current(m->ctx, c->cur);
      continue;
    }
    int op = m->movable[g_rand_int_range(c->rng, 0, m->n_movable)];
    int n = search_problem_n_configs(p, op);
    int cur = search_problem_config_of(p, search_evaluator_get_strategy(c->ev), op);
    int pick = g_rand_int_range(c->rng, 0, cur >= 0 ? n - 1 : n);
    if (cur >= 0 && pick >= cur)
      pick++;
    const SearchConfig *cfg = search_problem_config(p, op, pick);
    int n_undo = 0;
    save(c->ev, op, &undo[n_undo++]);
    if (!search_evaluator_set_config(c->ev, op, cfg)) {
      g_free(undo[0].devices);
      continue;
    }
    if (g_rand_double(c->rng) < m->propagate) {
      GArray *nb = m->nbrs[op];
      for (guint k = 0; k < nb->len && n_undo < (int)G_N_ELEMENTS(undo); k++) {
        int u = g_array_index(nb, int, k);
        int j = search_matching_config(p, u, cfg);
        if (j < 0 || j == search_problem_config_of(p, search_evaluator_get_strategy(c->ev), u))
          continue;
        save(c->ev, u, &undo[n_undo]);
        if (search_evaluator_set_config(c->ev, u, search_problem_config(p, u, j)))
          n_undo++;
        else
          g_free(undo[n_undo].devices);
      }
    }
    /* The candidate is accepted if its cost is at most cur, or else if the next number u
     * of the chain's stream is below exp(-beta (cost - cur) / cur): exactly when its cost
     * is below cur - cur ln(u) / beta, so a simulation that passes that bound is rejected
     * without being finished. */
    double cost = search_penalized(c->ev,
                                   search_evaluator_run_bounded(c->ev, acceptance_bound(m, c)));
    if (!accept_cost(m, c, cost)) {
      for (int k = n_undo - 1; k >= 0; k--)
        search_evaluator_set_op(c->ev, undo[k].op, undo[k].degree, undo[k].devices);
    }
    for (int k = 0; k < n_undo; k++)
      g_free(undo[k].devices);
    if (i == 0)
      search_context_set_current(m->ctx, c->cur);
  }
}

/* Between epochs: chain @i, unless it improved (or is done, or at the best), restarts
 * from the best strategy found so far. */
static void restart(int i, gpointer data)
{
  Mcmc *m = data;
  Chain *c = &m->chains[i];
  if (c->done || c->improved || c->cur <= m->restart_cost)
    return;
  gint64 used = c->used + search_evaluator_get_evals(c->ev);
  if (c->share > 0 && used >= c->share)
    return;
  SearchEvaluator *ev = search_evaluator_new(m->ctx, m->restart, (guint32)i, NULL);
  if (!ev)
    return;
  search_evaluator_free(c->ev);
  c->used = used;
  c->ev = ev;
  search_evaluator_set_limit(ev, c->share > 0 ? c->share - used : 0);
  c->cur = search_penalized(ev, search_evaluator_run(ev));
}

/* The best expert plan with a pipeline found within a share @share of what is left of
 * the budget, or NULL. */
static SimStrategy *pipelined_expert(Mcmc *m, double share, double *cost, gboolean *complete,
                                     SimMegatronOptions *o)
{
  *cost = INFINITY;
  *complete = FALSE;
  memset(o, 0, sizeof *o);
  SearchContext *in = search_context_new_share(m->ctx, share);
  if (!in)
    return NULL;
  SimStrategy *s = search_start_expert_stages(in, 2, cost, complete, o);
  search_context_free_inner(in);
  return s;
}

/* A first strategy for chain @i: data parallelism, the best expert plan (as FlexFlow
 * starts from expert-designed strategies: every single-stage one, then those with a
 * pipeline as far as the "pipelines" share of the budget goes, a pipelined winner refined
 * in Megatron's plan space within the same share of what is left), or random. */
static SimStrategy *start_for(Mcmc *m, int i, GRand *rng, gboolean *fitted)
{
  *fitted = FALSE;
  const SearchProblem *p = m->p;
  if (i % 3 == 1) {
    double flat = INFINITY, piped = INFINITY;
    gboolean flat_done = FALSE, piped_done = FALSE;
    SimMegatronOptions fo, po;
    SimStrategy *s = search_start_expert_stages(m->ctx, 1, &flat, &flat_done, &fo);
    SimStrategy *t = m->pipelines > 0 && (p->kinds & SEARCH_KIND_PIPELINE)
                       ? pipelined_expert(m, m->pipelines, &piped, &piped_done, &po)
                       : NULL;
    if (t && piped < flat) {
      sim_strategy_free(s);
      s = t;
      fo = po;
    } else if (t) {
      sim_strategy_free(t);
    }
    /* Every expert plan simulated: the yardstick `parasol search` reports. */
    if (s && flat_done && piped_done)
      search_context_keep_expert(m->ctx, s, MIN(flat, piped));
    /* Only a pipeline is refined: the chains' own moves reach a single-stage plan's
     * operators and its memory savings, and a global change made for the expert plan
     * (ZeRO-1, say) can be the wrong one for the plan the chains go on to find. */
    if (m->pipelines > 0) {
      double c = MIN(flat, piped);
      search_refine_pipeline(m->ctx, m->pipelines, &s, &c, &fo);
    }
    if (s)
      return s;
  }
  if (i % 3 == 2) {
    int n = sim_graph_n_ops(p->g);
    g_autofree int *cfg = g_new(int, MAX(n, 1));
    for (int op = 0; op < n; op++)
      cfg[op] = g_rand_int_range(rng, 0, search_problem_n_configs(p, op));
    return search_problem_strategy_from_configs(p, cfg, NULL);
  }
  /* Where data parallelism cannot fit at all (every device holding the 16-bit weights and
   * gradients of the whole model), the chain starts from the plan of Megatron's space
   * (interleaved chunks, sequence parallelism, recomputation, ZeRO-1 around the expert
   * plans) that the closed-form estimate ranks first among those the simulator finds to
   * fit; with an evaluation budget, from the expert plan the estimate ranks second (the
   * expert start simulates the first one first). */
  SimMegatronOptions whole = { .tp = 1, .pp = 1, .dp = p->n_devices };
  if (p->kinds == SEARCH_KIND_ALL && search_megatron_cannot_fit(p, &whole)) {
    if (m->ctx->deadline < G_MAXDOUBLE) {
      double c;
      SimStrategy *s = search_start_estimated(m->ctx, 3, &c, NULL);
      *fitted = s != NULL;
      if (s)
        return s;
    }
    SimStrategy *s = search_ranked_expert_plan(p, 1);
    if (s)
      return s;
  }
  return search_problem_data_parallel(p, NULL);
}

static gboolean mcmc_run(const SearchAlgorithm *self, SearchContext *ctx, GError **error)
{
  const SearchProblem *p = search_context_get_problem(ctx);
  int n = sim_graph_n_ops(p->g);
  Mcmc m = { .ctx = ctx, .p = p };
  m.n_chains = search_context_get_option_int_in(ctx, "chains", search_context_get_threads(ctx),
                                                1, 1024);
  m.beta = search_context_get_option_double_in(ctx, "beta", 20, 1e-3, INFINITY);
  m.propagate = search_context_get_option_double_in(ctx, "propagate", 0.2, 0, 1);
  m.stop_early = search_context_get_option_int_in(ctx, "stop-early", 1, 0, 1) != 0;
  m.plan_moves = search_context_get_option_double_in(ctx, "plan-moves", 0.05, 0, 1);
  m.pipelines = search_context_get_option_double_in(ctx, "pipelines", 0.25, 0, 1);
  m.knobs = search_long_context(p->g) || search_has_experts(p->g);
  m.movable = g_new(int, MAX(n, 1));
  m.nbrs = g_new(GArray *, MAX(n, 1));
  for (int op = 0; op < n; op++) {
    m.nbrs[op] = g_array_new(FALSE, FALSE, sizeof(int));
    if (search_problem_n_configs(p, op) > 1)
      m.movable[m.n_movable++] = op;
  }
  for (int op = 0; op < n; op++)
    for (int i = 0; i < sim_graph_op_n_inputs(p->g, op); i++) {
      int src = sim_graph_tensor_producer(p->g, sim_graph_op_input(p->g, op, i));
      if (src < 0 || src == op)
        continue;
      g_array_append_val(m.nbrs[op], src);
      g_array_append_val(m.nbrs[src], op);
    }
  m.epoch = search_context_get_option_int_in(ctx, "epoch", MAX(100, 2 * m.n_movable), 1, G_MAXINT);
  gboolean ok = TRUE;
  if (m.n_movable == 0) {
    g_autoptr(SimStrategy) s = search_problem_data_parallel(p, error);
    ok = s != NULL;
    if (ok)
      search_context_evaluate(ctx, s);
    goto out;
  }

  /* First strategies, made to fit where they can, one chain after the other. */
  m.chains = g_new0(Chain, m.n_chains);
  SimStrategy **starts = g_new0(SimStrategy *, m.n_chains);
  for (int i = 0; i < m.n_chains && ok; i++) {
    m.chains[i].rng = search_context_rand_new(ctx, (guint32)i);
    gboolean fitted;
    starts[i] = start_for(&m, i, m.chains[i].rng, &fitted);
    if (!starts[i])
      starts[i] = search_problem_data_parallel(p, error);
    if (!starts[i])
      ok = FALSE;
    else if (!fitted)
      search_fit(ctx, &starts[i]);
  }
  /* Then each chain its share of the evaluations left, so no chain's pace changes
   * another's work. */
  gint64 left = search_context_evals_left(ctx);
  for (int i = 0; i < m.n_chains && ok; i++) {
    Chain *c = &m.chains[i];
    if (left != G_MAXINT64)
      c->share = MAX(1, left / m.n_chains + (i < left % m.n_chains ? 1 : 0));
    c->ev = search_evaluator_new(ctx, starts[i], (guint32)i, error);
    if (!c->ev) {
      ok = FALSE;
      break;
    }
    search_evaluator_set_limit(c->ev, c->share);
    c->cur = c->best = search_evaluator_should_stop(c->ev)
                         ? INFINITY : search_penalized(c->ev, search_evaluator_run(c->ev));
  }
  for (int i = 0; i < m.n_chains; i++)
    if (starts[i])
      sim_strategy_free(starts[i]);
  g_free(starts);
  if (!ok)
    goto out;

  while (!search_dist_should_stop(ctx)) {
    /* Under MPI each rank runs its chains, then the ranks exchange which are done, the
     * evaluations and the best. */
    search_dist_parallel(ctx, m.n_chains, chain_epoch, &m);
    search_dist_share(ctx, m.n_chains, &m.chains[0].done, sizeof(Chain), sizeof(gboolean));
    search_dist_sync(ctx);
    gboolean all_done = TRUE;
    for (int i = 0; i < m.n_chains; i++)
      all_done = all_done && m.chains[i].done;
    if (all_done)
      break;
    /* Restarts from the best so far, each chain where it runs. */
    g_autoptr(SimStrategy) best = NULL;
    m.restart_cost = search_context_get_best(ctx, &best);
    if (!best)
      continue;
    m.restart = best;
    search_dist_parallel(ctx, m.n_chains, restart, &m);
    search_dist_sync(ctx);
    m.restart = NULL;
  }

out:
  for (int i = 0; m.chains && i < m.n_chains; i++) {
    search_evaluator_free(m.chains[i].ev);
    if (m.chains[i].rng)
      g_rand_free(m.chains[i].rng);
  }
  g_free(m.chains);
  for (int op = 0; op < n; op++)
    g_array_unref(m.nbrs[op]);
  g_free(m.nbrs);
  g_free(m.movable);
  return ok;
}

static const SearchOptionSpec mcmc_options[] = {
  { "chains", "Markov chains, run on the worker threads (default: --threads)" },
  { "beta", "acceptance sharpness, relative to the current time (default 20)" },
  { "propagate", "probability that a move also reconfigures the neighbours (default 0.2)" },
  { "epoch", "steps between restarts from the best (default max(100, 2 x operators))" },
  { "stop-early", "1: a proposal's simulation stops once it is past the acceptance bound, "
                  "which decides the same; 0: every simulation runs to its end (default 1)" },
  { "plan-moves", "probability that a move changes the whole plan: micro-batches doubled or "
                  "halved, recomputation or ZeRO-1 switched, while the plan trades time for memory (default 0.05; 0: none)" },
  { "pipelines", "share of the budget left after the single-stage expert plans that the "
                 "expert plans with a pipeline may take to give a chain its start, and "
                 "then of what is left that refining the winner in Megatron's plan space "
                 "may take (default 0.25; 0: neither)" },
  { NULL, NULL },
};

const SearchAlgorithm search_algo_mcmc = {
  .api_version = SEARCH_ALGORITHM_API_VERSION,
  .name = "mcmc",
  .description = "FlexFlow's Metropolis-Hastings search over per-operator configurations "
                 "with delta simulation and restarts from the best",
  .run = mcmc_run,
  .options = mcmc_options,
};
