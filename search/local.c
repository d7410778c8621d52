/* local.c — local search with the simulator: the refinement the constructive algorithms
 * (dynamic programs, beam, pipeline partitioning) end with, since their own cost models
 * see neither overlap nor contention. */
#include "search-private.h"

#include <string.h>

double search_penalized(const SearchEvaluator *ev, double cost)
{
  if (isfinite(cost))
    return cost;
  double t = search_evaluator_last_time(ev);
  if (!isfinite(t))
    return INFINITY;
  return 1e3 * t * (1 + MAX(0, search_evaluator_last_memory(ev) - 1));
}

/* The configuration @s gives @op, as set_op arguments, to put it back after a trial;
 * saved_clear() frees its devices. */
typedef struct {
  int degree[SEARCH_MAX_DIMS];
  int n;
  int *devices;
} Saved;

static void save_op(const SimStrategy *s, int op, Saved *out)
{
  const int *deg = sim_strategy_op_degrees(s, op);
  for (int d = 0; d < SEARCH_MAX_DIMS; d++)
    out->degree[d] = deg[d];
  const int *dev = sim_strategy_op_devices(s, op, &out->n);
  out->devices = g_memdup2(dev, sizeof(int) * (gsize)MAX(out->n, 1));
}

static void saved_free_all(Saved *saved, guint n)
{
  for (guint i = 0; i < n; i++)
    g_free(saved[i].devices);
  g_free(saved);
}

/* The producers of @op whose outputs only @op reads, and theirs, up the graph: the ops
 * that move with @op when it moves to other devices (its data sources, a private chain of
 * layers before it).  Appends them to @out. */
static void private_producers(const SimGraph *g, int op, GArray *out)
{
  for (int i = 0; i < sim_graph_op_n_inputs(g, op); i++) {
    int t = sim_graph_op_input(g, op, i);
    int src = sim_graph_tensor_producer(g, t);
    if (src < 0 || src == op)
      continue;
    gboolean private = TRUE;
    for (int o = 0; o < sim_graph_op_n_outputs(g, src) && private; o++) {
      int u = sim_graph_op_output(g, src, o);
      for (int c = 0; c < sim_graph_tensor_n_consumers(g, u); c++)
        private = private && sim_graph_tensor_consumer(g, u, c) == op;
    }
    gboolean seen = FALSE;
    for (guint k = 0; k < out->len && !seen; k++)
      seen = g_array_index(out, int, k) == src;
    if (private && !seen && out->len < 16) {
      g_array_append_val(out, src);
      private_producers(g, src, out);
    }
  }
}

int search_matching_config(const SearchProblem *p, int op, const SearchConfig *c)
{
  int n = search_problem_n_configs(p, op);
  for (int i = 0; i < n; i++) {
    const SearchConfig *x = search_problem_config(p, op, i);
    if (x->start == c->start && x->n == c->n && x->degree[0] == c->degree[0])
      return i;
  }
  return -1;
}

/* Candidates per op when a resource split reconfigures a branch. */
#define SPLIT_CANDS 8

/* Chooses configurations for @ops jointly by the estimate (variable elimination), each
 * among @allowed[i], every other op fixed at its configuration in @s.  Writes them to
 * @choice. */
static void reoptimize(SearchEstimate *e, const SearchProblem *p, const SimStrategy *s,
                       GArray *ops, GArray **allowed, int *choice)
{
  int n = (int)ops->len;
  g_autofree int *k = g_new(int, n);
  for (int i = 0; i < n; i++)
    k[i] = (int)allowed[i]->len;
  SearchVE *ve = search_ve_new(n, k);
  for (int i = 0; i < n; i++) {
    int op = g_array_index(ops, int, i);
    g_autofree double *u = g_new(double, k[i]);
    for (int x = 0; x < k[i]; x++)
      u[x] = search_estimate_node(e, op, g_array_index(allowed[i], int, x));
    /* Edges to ops outside the set, whose configurations stay. */
    int ne = 0;
    const int *edges = search_estimate_op_edges(e, op, &ne);
    for (int q = 0; q < ne; q++) {
      int src, dst;
      search_estimate_edge_ends(e, edges[q], &src, &dst);
      int other = src == op ? dst : src;
      gboolean inside = FALSE;
      for (int j = 0; j < n && !inside; j++)
        inside = g_array_index(ops, int, j) == other;
      int oc = inside ? -1 : search_problem_config_of(p, s, other);
      if (oc < 0)
        continue;
      for (int x = 0; x < k[i]; x++) {
        int c = g_array_index(allowed[i], int, x);
        u[x] += src == op ? search_estimate_edge(e, edges[q], c, oc)
                          : search_estimate_edge(e, edges[q], oc, c);
      }
    }
    search_ve_add_unary(ve, i, u);
  }
  for (int i = 0; i < n; i++)
    for (int j = 0; j < n; j++) {
      int a = g_array_index(ops, int, i), b = g_array_index(ops, int, j);
      int ne = 0;
      const int *edges = search_estimate_op_edges(e, a, &ne);
      for (int q = 0; q < ne; q++) {
        int src, dst;
        search_estimate_edge_ends(e, edges[q], &src, &dst);
        if (src != a || dst != b)
          continue;
        g_autofree double *m = g_new(double, (gsize)k[i] * k[j]);
        for (int x = 0; x < k[i]; x++)
          for (int y = 0; y < k[j]; y++)
            m[(gsize)x * k[j] + y] = search_estimate_edge(e, edges[q],
                                                          g_array_index(allowed[i], int, x),
                                                          g_array_index(allowed[j], int, y));
        search_ve_add_pair(ve, i, j, m);
      }
    }
  search_ve_solve(ve, NULL);
  g_autofree int *values = g_new0(int, n);
  search_ve_assign(ve, NULL, values);
  for (int i = 0; i < n; i++)
    choice[i] = g_array_index(allowed[i], int, values[i]);
  search_ve_free(ve);
}

/* Splits the devices among the branches that meet at @join (the producers of its inputs
 * with the producers only they read): branch b on the b-th of as many equal blocks, its
 * ops configured inside the block by the estimate's dynamic program (reoptimize).
 * Unity's resource split, as a move: two towers that each cost more than they save when
 * moved alone pay off when they move together.  Returns the new cost, keeping the move,
 * or @cur after undoing it. */
static double try_split(SearchEvaluator *ev, SearchEstimate *e, const SearchProblem *p, int join,
                        double cur)
{
  const SimGraph *g = p->g;
  int k = 0;
  g_autoptr(GArray) ops = g_array_new(FALSE, FALSE, sizeof(int));
  g_autoptr(GArray) branch = g_array_new(FALSE, FALSE, sizeof(int));
  for (int i = 0; i < sim_graph_op_n_inputs(g, join); i++) {
    int src = sim_graph_tensor_producer(g, sim_graph_op_input(g, join, i));
    gboolean dup = src < 0;
    for (guint x = 0; x < ops->len && !dup; x++)
      dup = g_array_index(ops, int, x) == src;
    if (dup)
      continue;
    GArray *members = g_array_new(FALSE, FALSE, sizeof(int));
    g_array_append_val(members, src);
    private_producers(g, src, members);
    for (guint x = 0; x < members->len; x++) {
      g_array_append_val(ops, g_array_index(members, int, x));
      g_array_append_val(branch, k);
    }
    g_array_unref(members);
    k++;
  }
  if (k < 2 || k > p->n_devices || p->n_devices % k != 0)
    return cur;
  int size = p->n_devices / k;
  int n = (int)ops->len;
  /* Each op's candidates: its configurations on all or part of its block, at the block's
   * first device, the cheapest few by the estimate with data parallelism always there
   * (placements inside the block change nothing the estimate sees). */
  GArray **allowed = g_new(GArray *, n);
  for (int x = 0; x < n; x++) {
    int op = g_array_index(ops, int, x);
    int lo = g_array_index(branch, int, x) * size;
    allowed[x] = g_array_new(FALSE, FALSE, sizeof(int));
    int dp = search_problem_dp_config(p, op, lo, size);
    g_array_append_val(allowed[x], dp);
    g_autoptr(GArray) pool = g_array_new(FALSE, FALSE, sizeof(int));
    for (int i = 0; i < search_problem_n_configs(p, op); i++) {
      const SearchConfig *c = search_problem_config(p, op, i);
      if (c->start == lo && c->n <= size && i != dp)
        g_array_append_val(pool, i);
    }
    for (int picked = 1; picked < SPLIT_CANDS && pool->len; picked++) {
      guint best = 0;
      for (guint j = 1; j < pool->len; j++)
        if (search_estimate_node(e, op, g_array_index(pool, int, j)) <
            search_estimate_node(e, op, g_array_index(pool, int, best)))
          best = j;
      g_array_append_val(allowed[x], g_array_index(pool, int, best));
      g_array_remove_index(pool, best);
    }
  }
  g_autofree int *choice = g_new(int, n);
  reoptimize(e, p, search_evaluator_get_strategy(ev), ops, allowed, choice);
  for (int x = 0; x < n; x++)
    g_array_unref(allowed[x]);
  g_free(allowed);

  Saved *saved = g_new(Saved, n);
  gboolean ok = TRUE;
  for (int x = 0; x < n; x++)
    save_op(search_evaluator_get_strategy(ev), g_array_index(ops, int, x), &saved[x]);
  for (int x = 0; x < n && ok; x++) {
    int op = g_array_index(ops, int, x);
    ok = search_evaluator_set_config(ev, op, search_problem_config(p, op, choice[x]));
  }
  /* Only a cost below cur is kept: a simulation past it can stop (see
   * search_evaluator_run_bounded()). */
  double cost = ok ? search_penalized(ev, search_evaluator_run_bounded(ev, cur)) : INFINITY;
  if (cost < cur) {
    saved_free_all(saved, (guint)n);
    return cost;
  }
  for (int x = 0; x < n; x++)
    search_evaluator_set_op(ev, g_array_index(ops, int, x), saved[x].degree, saved[x].devices);
  saved_free_all(saved, (guint)n);
  return cur;
}

gboolean search_plan_saves_memory(const SimStrategy *s)
{
  SimMemoryOptions mo = sim_strategy_get_memory(s);
  return mo.recompute != SIM_RECOMPUTE_NONE || mo.zero1 ||
         (sim_strategy_get_microbatches(s) > 1 && sim_strategy_n_stages(s) == 1);
}

/* Changes of the whole plan for a plan that saves memory, tried in turn and kept when
 * faster: recomputation off, ZeRO-1 off (each doubling the micro-batches until the plan
 * fits again), half and twice the micro-batches.  Replaces *@ev with the evaluator of the
 * plan kept; returns its cost (@cur when nothing was faster). */
static double improve_plan(SearchContext *ctx, SearchEvaluator **ev, double cur, guint32 stream)
{
  for (int kind = 0; kind < 4; kind++) {
    const SimStrategy *now = search_evaluator_get_strategy(*ev);
    if (!search_plan_saves_memory(now) || search_evaluator_should_stop(*ev))
      break;
    g_autoptr(SimStrategy) s = sim_strategy_copy(now);
    SimMemoryOptions mo = sim_strategy_get_memory(s);
    int mb = sim_strategy_get_microbatches(s);
    gboolean relax = kind < 2;
    if (kind == 0 && mo.recompute != SIM_RECOMPUTE_NONE)
      mo.recompute = SIM_RECOMPUTE_NONE;
    else if (kind == 1 && mo.zero1)
      mo.zero1 = FALSE;
    else if (kind == 2 && mb > 1)
      mb /= 2;
    else if (kind == 3)
      mb *= 2;
    else
      continue;
    sim_strategy_set_memory(s, &mo);
    SearchEvaluator *best_ev = NULL;
    for (int tries = 0; tries < (relax ? 8 : 1) && !search_context_should_stop(ctx);
         tries++, mb *= 2) {
      sim_strategy_set_microbatches(s, mb);
      SearchEvaluator *t = search_evaluator_new(ctx, s, stream, NULL);
      if (!t)
        break;
      double raw = search_evaluator_run_bounded(t, cur);
      double c = search_penalized(t, raw);
      gboolean fits = isfinite(raw) || search_evaluator_last_memory(t) <= 1;
      if (c < cur) {
        cur = c;
        best_ev = t;
        break;
      }
      search_evaluator_free(t);
      if (fits)
        break;
    }
    if (best_ev) {
      search_evaluator_free(*ev);
      *ev = best_ev;
      kind = -1; /* from the first kind again, on the new plan */
    }
  }
  return cur;
}

double search_polish(SearchContext *ctx, SimStrategy **s, GArray *const *cands, int max_sweeps,
                     guint32 stream)
{
  const SearchProblem *p = search_context_get_problem(ctx);
  int n = sim_graph_n_ops(p->g);
  g_autoptr(SearchEvaluator) ev = search_evaluator_new(ctx, *s, stream, NULL);
  if (!ev)
    return INFINITY;
  SearchEstimate *e = search_estimate_new(p);
  double cur = search_penalized(ev, search_evaluator_run(ev));
  gboolean stop = FALSE;
  for (int sweep = 0; (max_sweeps <= 0 || sweep < max_sweeps) && !stop; sweep++) {
    gboolean improved = FALSE;
    for (int op = 0; op < n && !stop; op++) {
      Saved orig;
      save_op(search_evaluator_get_strategy(ev), op, &orig);
      g_autofree int *orig_devices = orig.devices;
      int orig_idx = search_problem_config_of(p, search_evaluator_get_strategy(ev), op);
      int m = cands ? (int)cands[op]->len : search_problem_n_configs(p, op);
      int best_i = -1;
      double best = cur;
      for (int k = 0; k < m; k++) {
        int i = cands ? g_array_index(cands[op], int, k) : k;
        if (i == orig_idx)
          continue;
        if (search_evaluator_should_stop(ev)) {
          stop = TRUE;
          break;
        }
        if (!search_evaluator_set_config(ev, op, search_problem_config(p, op, i)))
          continue;
        double c = search_penalized(ev, search_evaluator_run_bounded(ev, best));
        if (c < best) {
          best = c;
          best_i = i;
        }
      }
      /* The best trial if one was better, else the original; the session re-simulates
       * what changed on its next run. */
      if (best_i >= 0) {
        search_evaluator_set_config(ev, op, search_problem_config(p, op, best_i));
        cur = best;
        improved = TRUE;
        continue;
      }
      search_evaluator_set_op(ev, op, orig.degree, orig.devices);
      if (stop)
        break;
      /* Group moves: the op with the producers only it reads (its data, a private chain
       * of layers), all to matching configurations, which no single move can reach when
       * each step alone would add a transfer. */
      g_autoptr(GArray) group = g_array_new(FALSE, FALSE, sizeof(int));
      private_producers(p->g, op, group);
      if (group->len == 0)
        continue;
      Saved *saved = g_new(Saved, group->len);
      for (guint g = 0; g < group->len; g++)
        save_op(search_evaluator_get_strategy(ev), g_array_index(group, int, g), &saved[g]);
      int best_g = -1;
      for (int k = 0; k < m && !stop; k++) {
        int i = cands ? g_array_index(cands[op], int, k) : k;
        if (i == orig_idx)
          continue;
        if (search_evaluator_should_stop(ev)) {
          stop = TRUE;
          break;
        }
        const SearchConfig *c = search_problem_config(p, op, i);
        gboolean moved = FALSE;
        for (guint g = 0; g < group->len; g++) {
          int u = g_array_index(group, int, g);
          int j = search_matching_config(p, u, c);
          if (j >= 0 && search_evaluator_set_config(ev, u, search_problem_config(p, u, j)))
            moved = TRUE;
        }
        if (moved && search_evaluator_set_config(ev, op, c)) {
          double cost = search_penalized(ev, search_evaluator_run_bounded(ev, best));
          if (cost < best) {
            best = cost;
            best_g = i;
          }
        }
        search_evaluator_set_op(ev, op, orig.degree, orig.devices);
        for (guint g = 0; g < group->len; g++)
          search_evaluator_set_op(ev, g_array_index(group, int, g), saved[g].degree,
                                  saved[g].devices);
      }
      if (best_g >= 0) {
        const SearchConfig *c = search_problem_config(p, op, best_g);
        for (guint g = 0; g < group->len; g++) {
          int u = g_array_index(group, int, g);
          int j = search_matching_config(p, u, c);
          if (j >= 0)
            search_evaluator_set_config(ev, u, search_problem_config(p, u, j));
        }
        search_evaluator_set_config(ev, op, c);
        cur = best;
        improved = TRUE;
      }
      saved_free_all(saved, group->len);
    }
    /* Resource splits at every op where branches meet. */
    for (int op = 0; op < n && !stop; op++) {
      if (sim_graph_op_n_inputs(p->g, op) < 2)
        continue;
      if (search_evaluator_should_stop(ev)) {
        stop = TRUE;
        break;
      }
      double c = try_split(ev, e, p, op, cur);
      if (c < cur) {
        cur = c;
        improved = TRUE;
      }
    }
    if (!improved && !stop) {
      /* Nothing more per operator: a change of the whole plan may open more. */
      double c = improve_plan(ctx, &ev, cur, stream);
      improved = c < cur;
      cur = c;
    }
    if (!improved)
      break;
  }
  search_estimate_free(e);
  sim_strategy_free(*s);
  *s = sim_strategy_copy(search_evaluator_get_strategy(ev));
  return cur;
}

SimMemoryOptions search_memory_step(SimMemoryOptions base, int step)
{
  if (step == 0 || step == 2)
    base.zero1 = TRUE;
  if (step == 1 || step == 2)
    base.recompute = SIM_RECOMPUTE_FULL;
  return base;
}

double search_fit(SearchContext *ctx, SimStrategy **s)
{
  double cost = search_context_evaluate(ctx, *s);
  if (isfinite(cost) || !search_problem_get_memory_limit(search_context_get_problem(ctx)))
    return cost;
  SimMemoryOptions base = sim_strategy_get_memory(*s);
  for (int i = 0; i < 3 && !search_context_should_stop(ctx); i++) {
    SimMemoryOptions m = search_memory_step(base, i);
    if (m.zero1 == base.zero1 && m.recompute == base.recompute)
      continue;
    g_autoptr(SimStrategy) v = sim_strategy_copy(*s);
    sim_strategy_set_memory(v, &m);
    cost = search_context_evaluate(ctx, v);
    if (isfinite(cost)) {
      sim_strategy_free(*s);
      *s = g_steal_pointer(&v);
      return cost;
    }
  }
  return INFINITY;
}

SimStrategy *search_start_data_parallel(SearchContext *ctx, double *cost, GError **error)
{
  SimStrategy *s = search_problem_data_parallel(search_context_get_problem(ctx), error);
  if (s) {
    double c = search_fit(ctx, &s);
    if (cost)
      *cost = c;
  }
  return s;
}

/* Expert plans are simulated a round at a time, as many in a round as the search has
 * threads, each run bounded by the best time of the rounds before: a plan that cannot
 * beat it stops early.  A round's bound does not depend on how its threads are timed,
 * so neither do the runs nor the result, which is the one that simulating every plan to
 * its end gives (its time is below every bound).  Whether a plan stopped early fits is
 * read from the memory it had taken by then: if nothing had overflowed, it is taken to
 * fit, and its memory savings, slower than the bound, are not tried. */
#define EXPERT_STREAM 0xfe0000u
#define ESTIMATED_STREAM 0xfc0000u

typedef struct {
  SearchContext *ctx;
  GPtrArray *cands;       /* SimStrategy* (NULL: not built yet), replaced by the variant
                           * that fits                                                */
  const SimMegatronOptions *opts; /* per candidate, to build it                        */
  const int *round;       /* the candidates of this round                             */
  double bound;
  double *cost;           /* per candidate: its time, +inf if it does not fit or lost */
  uint8_t *fit;           /* per candidate: it fitted as it was                       */
  gboolean ladder;        /* the round's plans get the memory ladder when they do not fit */
} ExpertRound;

/* One plan bounded by @bound: its cost (+inf when it does not fit or is slower than
 * @bound); whether it fits (or, stopped early, had not overflowed) goes to @fit. */
static double expert_eval(SearchContext *ctx, const SimStrategy *s, guint32 stream,
                          double bound, gboolean *fit)
{
  const SearchProblem *p = search_context_get_problem(ctx);
  gboolean cut, overflowed;
  double c = search_context_evaluate_bounded(ctx, s, bound, search_key(stream, 1), &cut,
                                             &overflowed);
  *fit = cut ? !overflowed || !search_problem_get_memory_limit(p) : isfinite(c);
  return c;
}

static void expert_round_task(int k, gpointer data)
{
  ExpertRound *r = data;
  int i = r->round[k];
  SimStrategy **s = (SimStrategy **)&g_ptr_array_index(r->cands, i);
  guint32 stream = EXPERT_STREAM + (guint32)i * 4;
  if (!*s && search_megatron_cannot_fit(search_context_get_problem(r->ctx), &r->opts[i])) {
    /* Its weights and gradients alone overflow a device: not simulated, and no memory
     * saving (nor micro-batches) changes that. */
    r->fit[i] = 1;
    r->cost[i] = INFINITY;
    return;
  }
  if (!*s)
    *s = search_megatron_plan(search_context_get_problem(r->ctx), &r->opts[i]);
  if (!*s) {
    /* The builder refused it: no plan. */
    r->fit[i] = 1;
    r->cost[i] = INFINITY;
    return;
  }
  gboolean fit;
  double c = expert_eval(r->ctx, *s, stream, r->bound, &fit);
  r->fit[i] = (uint8_t)fit;
  /* A plan that does not fit saves memory as Megatron would: the distributed optimizer,
   * then full recomputation, then both; the first that fits is the plan. */
  const SearchProblem *p = search_context_get_problem(r->ctx);
  if (!fit && r->ladder && search_problem_get_memory_limit(p)) {
    SimMemoryOptions base = sim_strategy_get_memory(*s);
    /* No look at the budget inside a round: where the rounds stop must not depend on
     * how the round's threads are timed. */
    for (int step = 0; step < 3; step++) {
      SimMemoryOptions m = search_memory_step(base, step);
      if (m.zero1 == base.zero1 && m.recompute == base.recompute)
        continue;
      g_autoptr(SimStrategy) v = sim_strategy_copy(*s);
      sim_strategy_set_memory(v, &m);
      gboolean vfit;
      c = expert_eval(r->ctx, v, stream + 1 + (guint32)step, r->bound, &vfit);
      if (vfit) {
        sim_strategy_free(*s);
        *s = g_steal_pointer(&v);
        break;
      }
    }
  }
  r->cost[i] = c;
}

/* Simulates the candidates @idx in rounds, lowering *@best_cost (and *@best, the index)
 * with each round's results in index order. */
static int expert_rounds(SearchContext *ctx, GPtrArray *cands, const SimMegatronOptions *opts,
                         GArray *idx, gboolean ladder, double *costs, uint8_t *fit,
                         double *best_cost, int *best, gboolean track)
{
  int threads = MAX(1, search_context_get_threads(ctx));
  int simulated = 0;
  /* Under a deadline in seconds the first round is the most promising plan alone: on a
   * large machine (or a busy one) it ends sooner than two plans sharing the cores, and its
   * time bounds the rounds after it. */
  gboolean timed = ctx->deadline < G_MAXDOUBLE;
  for (guint at = 0, width = timed ? 1 : (guint)threads;
       at < idx->len && !search_context_should_stop(ctx); at += width, width = (guint)threads) {
    int n = (int)MIN(width, idx->len - at);
    ExpertRound r = { .ctx = ctx, .cands = cands, .opts = opts,
                      .round = &g_array_index(idx, int, at),
                      .bound = *best_cost, .cost = costs, .fit = fit, .ladder = ladder };
    search_context_parallel(ctx, n, expert_round_task, &r);
    /* A round that a deadline or a signal cut short (its simulations cancelled) counts
     * none of its plans as simulated, nor do they compete. */
    if (search_context_should_stop(ctx) && ctx->root->watch &&
        search_watch_fired(ctx->root->watch))
      break;
    simulated += n;
    if (track) {
      /* The progress, for a search that is left behind at its deadline. */
      g_mutex_lock(&ctx->root->lock);
      ctx->root->expert_simulated += n;
      g_mutex_unlock(&ctx->root->lock);
    }
    for (int k = 0; k < n; k++) {
      int i = r.round[k];
      if (costs[i] < *best_cost || (costs[i] == *best_cost && isfinite(costs[i]) && i < *best)) {
        *best_cost = costs[i];
        *best = i;
      }
    }
  }
  return simulated;
}

typedef struct {
  int index;
  int fits;     /* 1: expected to fit, 0: not expected to, -1: cannot */
  double time;
} Ranked;

static int compare_ranked(const void *a, const void *b)
{
  const Ranked *x = a, *y = b;
  if (x->fits != y->fits)
    return x->fits > y->fits ? -1 : 1;
  if (x->time != y->time)
    return x->time < y->time ? -1 : 1;
  return (x->index > y->index) - (x->index < y->index);
}

/* Sorts the candidate indices @idx by search_megatron_estimate() of their options @o
 * (one weird trick, of no options, last). */
static void rank_by_estimate(const SearchProblem *p, const SimMegatronOptions *o, GArray *idx)
{
  int n = (int)idx->len;
  g_autofree Ranked *r = g_new(Ranked, MAX(n, 1));
  for (int k = 0; k < n; k++) {
    int i = g_array_index(idx, int, k);
    r[k].index = i;
    gboolean fits = FALSE;
    r[k].time = o[i].dp > 0 ? search_megatron_estimate(p, &o[i], &fits) : INFINITY;
    r[k].fits = fits ? 1 : 0;
    /* Those that cannot fit at all go last (they are not simulated). */
    if (o[i].dp > 0 && search_megatron_cannot_fit(p, &o[i]))
      r[k].fits = -1;
  }
  qsort(r, (size_t)n, sizeof *r, compare_ranked);
  for (int k = 0; k < n; k++)
    g_array_index(idx, int, k) = r[k].index;
}

SimStrategy *search_ranked_expert_plan(const SearchProblem *p, int rank)
{
  g_autoptr(GPtrArray) cands = g_ptr_array_new_with_free_func((GDestroyNotify)sim_strategy_free);
  g_autoptr(GArray) parents = g_array_new(FALSE, FALSE, sizeof(int));
  g_autoptr(GArray) options = g_array_new(FALSE, TRUE, sizeof(SimMegatronOptions));
  search_expert_candidates_lazy(p, cands, parents, options);
  const SimMegatronOptions *o = &g_array_index(options, SimMegatronOptions, 0);
  g_autoptr(GArray) idx = g_array_new(FALSE, FALSE, sizeof(int));
  for (guint i = 0; i < cands->len; i++)
    if (g_array_index(parents, int, i) < 0 && o[i].dp > 0 && !search_megatron_cannot_fit(p, &o[i]))
      g_array_append_val(idx, i);
  if (idx->len == 0)
    return NULL;
  rank_by_estimate(p, o, idx);
  int k = g_array_index(idx, int, MIN((guint)rank, idx->len - 1));
  return search_megatron_plan(p, &o[k]);
}

/* Megatron's plan space around the expert plans that can fit: each with 1 to 8 model
 * chunks per stage (the interleaved schedule, where the stage's layers divide evenly and the
 * micro-batches fill every stage), with and without sequence parallelism, each
 * recomputation, and ZeRO-1 where there are replicas; appended to @out. */
static void plan_space(const SearchProblem *p, const SimMegatronOptions *expert, guint n,
                       const GArray *parents, GArray *out)
{
  int layers = 0;
  for (int op = 0; op < sim_graph_n_ops(p->g); op++)
    layers += sim_graph_op_is_checkpoint(p->g, op);
  for (guint i = 0; i < n; i++) {
    const SimMegatronOptions *o = &expert[i];
    if ((parents && g_array_index(parents, int, i) >= 0) || o->dp < 1 ||
        search_megatron_cannot_fit(p, o))
      continue;
    for (int v = 1; v <= 8; v++) {
      if (v > 1 && (o->pp < 2 || !(p->kinds & SEARCH_KIND_PIPELINE) ||
                    layers % (o->pp * v) != 0 || o->microbatches % o->pp != 0))
        continue;
      for (int sp = 0; sp <= (o->tp > 1); sp++)
        for (int r = SIM_RECOMPUTE_NONE; r <= SIM_RECOMPUTE_FULL; r++)
          for (int z = 0; z <= (o->dp > 1); z++) {
            SimMegatronOptions c = *o;
            c.schedule = v > 1 ? SIM_SCHEDULE_INTERLEAVED : c.schedule;
            c.chunks = v;
            c.sequence_parallel = sp;
            c.memory.recompute = (SimRecompute)r;
            c.memory.zero1 = z || o->memory.zero1;
            g_array_append_val(out, c);
          }
    }
  }
}

int search_estimated_plans(const SearchProblem *p, int max, SimMegatronOptions *out)
{
  g_autoptr(GPtrArray) cands = g_ptr_array_new_with_free_func((GDestroyNotify)sim_strategy_free);
  g_autoptr(GArray) parents = g_array_new(FALSE, FALSE, sizeof(int));
  g_autoptr(GArray) options = g_array_new(FALSE, TRUE, sizeof(SimMegatronOptions));
  search_expert_candidates_lazy(p, cands, parents, options);
  g_autoptr(GArray) space = g_array_new(FALSE, TRUE, sizeof(SimMegatronOptions));
  plan_space(p, (const SimMegatronOptions *)(void *)options->data, options->len, parents,
             space);
  g_autoptr(GArray) idx = g_array_new(FALSE, FALSE, sizeof(int));
  for (guint i = 0; i < space->len; i++)
    g_array_append_val(idx, i);
  const SimMegatronOptions *o = (const SimMegatronOptions *)(void *)space->data;
  rank_by_estimate(p, o, idx);
  int n = 0;
  for (guint k = 0; k < idx->len && n < max; k++)
    out[n++] = o[g_array_index(idx, int, k)];
  return n;
}

SimStrategy *search_start_estimated(SearchContext *ctx, int tries, double *cost,
                                    SimMegatronOptions *opts)
{
  const SearchProblem *p = search_context_get_problem(ctx);
  *cost = INFINITY;
  g_autofree SimMegatronOptions *best = g_new(SimMegatronOptions, MAX(tries, 1));
  int n = search_estimated_plans(p, tries, best);
  for (int k = 0; k < n && !search_context_should_stop(ctx); k++) {
    SimStrategy *s = search_megatron_plan(p, &best[k]);
    if (!s)
      continue;
    /* Stopped where it first overflows its memory: a plan that does not fit costs little. */
    gboolean cut, overflowed;
    double c = search_context_evaluate_bounded(ctx, s, INFINITY, search_key(ESTIMATED_STREAM, k),
                                               &cut, &overflowed);
    if (isfinite(c)) {
      *cost = c;
      if (opts)
        *opts = best[k];
      return s;
    }
    sim_strategy_free(s);
  }
  return NULL;
}

/* Whether candidate @s (NULL: not built, of options @o) is of the stages asked for: 0 all,
 * 1 single-stage, 2 pipelined. */
static gboolean expert_of(const SimStrategy *s, const SimMegatronOptions *o, int stages)
{
  int n = s ? sim_strategy_n_stages(s) : o->pp;
  return stages == 0 || (stages == 1) == (n == 1);
}

SimStrategy *search_start_expert(SearchContext *ctx, gboolean single_stage, double *cost)
{
  return search_start_expert_stages(ctx, single_stage ? 1 : 0, cost, NULL, NULL);
}

SimStrategy *search_start_expert_stages(SearchContext *ctx, int stages, double *cost,
                                        gboolean *complete, SimMegatronOptions *opts)
{
  g_autoptr(GPtrArray) cands = g_ptr_array_new_with_free_func((GDestroyNotify)sim_strategy_free);
  g_autoptr(GArray) parents = g_array_new(FALSE, FALSE, sizeof(int));
  g_autoptr(GArray) options = g_array_new(FALSE, TRUE, sizeof(SimMegatronOptions));
  search_expert_candidates_lazy(search_context_get_problem(ctx), cands, parents, options);
  const SimMegatronOptions *o = &g_array_index(options, SimMegatronOptions, 0);
  guint n = cands->len;
  g_autofree uint8_t *fit = g_new0(uint8_t, MAX(n, 1));
  g_autofree double *costs = g_new(double, MAX(n, 1));
  for (guint i = 0; i < n; i++)
    costs[i] = INFINITY;
  /* First every plan (with its memory savings when it does not fit), then the
   * micro-batched variants of the whole-batch plans that did not fit as they were: each
   * is a memory saving itself, so it gets no ladder of its own. */
  g_autoptr(GArray) first = g_array_new(FALSE, FALSE, sizeof(int));
  for (guint i = 0; i < n; i++) {
    SimStrategy *s = g_ptr_array_index(cands, i);
    if (g_array_index(parents, int, i) < 0 && expert_of(s, &o[i], stages))
      g_array_append_val(first, i);
  }
  /* The most promising first, by a closed-form estimate (plans it expects to fit, then
   * the fastest): a sweep cut short by its deadline has simulated those; one that ends
   * finds the same best, which does not depend on the order. */
  rank_by_estimate(search_context_get_problem(ctx), o, first);
  double best_cost = INFINITY;
  int best = -1;
  gboolean track = stages == 0 && ctx->problem == ctx->root->problem;
  if (track) {
    g_mutex_lock(&ctx->root->lock);
    ctx->root->expert_plans = (int)first->len;
    ctx->root->expert_simulated = 0;
    g_mutex_unlock(&ctx->root->lock);
  }
  int simulated =
    expert_rounds(ctx, cands, o, first, TRUE, costs, fit, &best_cost, &best, track);
  g_autoptr(GArray) variants = g_array_new(FALSE, FALSE, sizeof(int));
  for (guint i = 0; i < n; i++) {
    int parent = g_array_index(parents, int, i);
    if (parent >= 0 && !fit[parent] && expert_of(g_ptr_array_index(cands, i), &o[i], stages))
      g_array_append_val(variants, i);
  }
  if (track) {
    g_mutex_lock(&ctx->root->lock);
    ctx->root->expert_plans += (int)variants->len;
    g_mutex_unlock(&ctx->root->lock);
  }
  simulated +=
    expert_rounds(ctx, cands, o, variants, FALSE, costs, fit, &best_cost, &best, track);
  /* Every candidate simulated: the yardstick `parasol search` reports. */
  gboolean done = !search_context_should_stop(ctx);
  if (complete)
    *complete = done;
  if (stages == 0 && done && best >= 0)
    search_context_keep_expert(ctx, g_ptr_array_index(cands, best), best_cost);
  else if (stages == 0 && best >= 0)
    search_context_keep_partial_expert(ctx, g_ptr_array_index(cands, best), best_cost);
  if (cost)
    *cost = best_cost;
  if (opts) {
    memset(opts, 0, sizeof *opts);
    if (best >= 0) {
      /* The memory savings the winner took on its way to fitting. */
      *opts = g_array_index(options, SimMegatronOptions, best);
      opts->memory = sim_strategy_get_memory(g_ptr_array_index(cands, best));
    }
  }
  return best >= 0 ? g_ptr_array_steal_index(cands, best) : NULL;
}

/* ---------------------------------------------------------------------------------- */
/* Megatron's plan space past its rules                                               */

#define REFINE_STREAM 0xfd0000u
#define REFINE_MAX 20
#define REFINE_GAIN 1e-5

typedef struct {
  SearchContext *ctx;
  SimMegatronOptions opt[REFINE_MAX];
  SimStrategy *plan[REFINE_MAX];
  double cost[REFINE_MAX];
  double bound;
  gint64 key;
} RefineRound;

static void refine_task(int i, gpointer data)
{
  RefineRound *r = data;
  /* Past a deadline in seconds the round's other neighbours are skipped (on a large
   * machine a round takes several seconds); an evaluation budget is never looked at
   * inside a round, where the runs must not depend on the threads' timing. */
  if (r->ctx->deadline < G_MAXDOUBLE && search_context_elapsed(r->ctx) >= r->ctx->deadline) {
    r->cost[i] = INFINITY;
    return;
  }
  gboolean cut, overflowed;
  r->cost[i] = search_context_evaluate_bounded(r->ctx, r->plan[i], r->bound,
                                               search_key(REFINE_STREAM, r->key + i), &cut,
                                               &overflowed);
}

/* Sets @v's number of micro-batches from its data-parallel degree and micro-batch size;
 * FALSE where they do not divide the batch or leave a pipeline fewer micro-batches than
 * stages. */
static gboolean fill_microbatches(SimMegatronOptions *v, int64_t batch)
{
  if (batch % ((int64_t)v->dp * v->microbatch_size) != 0)
    return FALSE;
  v->microbatches = (int)(batch / ((int64_t)v->dp * v->microbatch_size));
  return v->pp == 1 || v->microbatches >= v->pp;
}

/* Whether @g has a mixture-of-experts operator, whose experts expert parallelism splits. */
static gboolean has_experts(const SimGraph *g)
{
  for (int op = 0; op < sim_graph_n_ops(g); op++)
    if (sim_graph_op_type(g, op) == SIM_OP_MOE)
      return TRUE;
  return FALSE;
}

/* The neighbours of @o: each one change of the plan, as far as the batch allows (the
 * builder refuses the rest). */
static int refine_neighbours(const SearchProblem *p, const SimMegatronOptions *o,
                             SimMegatronOptions *out)
{
  int n = 0;
  int64_t batch = sim_graph_batch_size(p->g);
  int chunks = o->schedule == SIM_SCHEDULE_INTERLEAVED ? o->chunks : 1;
  /* Only the kinds of parallelism the problem allows grow (tensor parallelism splits
   * parameters and reductions). */
  gboolean may_pp = (p->kinds & SEARCH_KIND_PIPELINE) != 0;
  gboolean may_tp = (p->kinds & SEARCH_KIND_PARAMETER) && (p->kinds & SEARCH_KIND_REDUCTION);
  gboolean may_dp = (p->kinds & SEARCH_KIND_DATA) != 0;
  SimMegatronOptions v;
  if (o->pp > 1 && may_pp) {
    /* More model chunks per stage: a smaller pipeline bubble for more transfers. */
    v = *o;
    v.schedule = SIM_SCHEDULE_INTERLEAVED;
    v.chunks = chunks * 2;
    out[n++] = v;
    if (chunks > 1) {
      v = *o;
      v.chunks = chunks / 2;
      v.schedule = v.chunks > 1 ? SIM_SCHEDULE_INTERLEAVED : SIM_SCHEDULE_1F1B;
      out[n++] = v;
    }
  }
  if (o->tp > 1) {
    v = *o;
    v.sequence_parallel = !o->sequence_parallel;
    out[n++] = v;
  }
  /* The devices traded between two kinds of parallelism, everything else kept: tensor
   * for pipeline parallelism and pipeline for data parallelism, both ways (the expert
   * rules tried each split, but not with the knobs above). */
  static const int trades[4][3] = { { 1, -1, 0 }, { -1, 1, 0 }, { 0, 1, -1 }, { 0, -1, 1 } };
  for (int k = 0; k < 4; k++) {
    /* (TP, PP, DP), each doubled (1), halved (-1) or kept (0). */
    int d[3] = { o->tp, o->pp, o->dp };
    gboolean ok = TRUE;
    for (int i = 0; i < 3; i++) {
      if (trades[k][i] > 0)
        d[i] *= 2;
      else if (trades[k][i] < 0 && d[i] % 2 == 0)
        d[i] /= 2;
      else if (trades[k][i] < 0)
        ok = FALSE;
    }
    if ((d[0] > o->tp && !may_tp) || (d[1] > o->pp && !may_pp) || (d[2] > o->dp && !may_dp))
      ok = FALSE;
    v = *o;
    v.tp = d[0];
    v.pp = d[1];
    v.dp = d[2];
    if (!ok || !fill_microbatches(&v, batch))
      continue;
    if (v.pp == 1) {
      v.schedule = SIM_SCHEDULE_1F1B;
      v.chunks = 1;
    }
    if (v.tp == 1)
      v.sequence_parallel = FALSE;
    /* Expert parallelism stays within the data-parallel replicas. */
    while (v.ep > 1 && v.dp % v.ep != 0)
      v.ep /= 2;
    out[n++] = v;
  }
  /* The experts over twice or half as many data-parallel replicas. */
  if (may_dp && has_experts(p->g)) {
    int ep = MAX(o->ep, 1);
    for (int k = 0; k < 2; k++) {
      v = *o;
      v.ep = k == 0 ? ep * 2 : ep / 2;
      if (v.ep >= 1 && v.ep != ep && o->dp % v.ep == 0)
        out[n++] = v;
    }
  }
  for (int k = 0; k < 2; k++) {
    v = *o;
    v.microbatch_size = k == 0 ? o->microbatch_size * 2 : o->microbatch_size / 2;
    if (v.microbatch_size >= 1 && fill_microbatches(&v, batch))
      out[n++] = v;
  }
  for (int r = SIM_RECOMPUTE_NONE; r <= SIM_RECOMPUTE_FULL; r++)
    if (r != (int)o->memory.recompute) {
      v = *o;
      v.memory.recompute = (SimRecompute)r;
      out[n++] = v;
    }
  if (o->dp > 1) {
    v = *o;
    v.memory.zero1 = !o->memory.zero1;
    out[n++] = v;
  }
  if (o->sync.bucket_bytes > 0) {
    for (int k = 0; k < 2; k++) {
      v = *o;
      v.sync.bucket_bytes = k == 0 ? o->sync.bucket_bytes * 2 : o->sync.bucket_bytes / 2;
      if (v.sync.bucket_bytes >= (1 << 20))
        out[n++] = v;
    }
  }
  g_assert(n <= REFINE_MAX);
  return n;
}

/* One round of the refinement: the candidates @cand[@idx[0 .. n_idx - 1]] are simulated on
 * the search's threads, bounded by *@cost, under keys from @key.  A change is kept for a
 * gain of at least REFINE_GAIN of the time, not for the last bits of a sum: the fastest
 * such candidate (the first on a tie) replaces *@s, *@cost and *@cur, and TRUE is
 * returned. */
static gboolean refine_round(SearchContext *ctx, const SimMegatronOptions *cand,
                             const int *idx, int n_idx, gint64 key, SimMegatronOptions *cur,
                             SimStrategy **s, double *cost)
{
  const SearchProblem *p = search_context_get_problem(ctx);
  RefineRound r = { .ctx = ctx, .bound = *cost, .key = key };
  int n = 0;
  for (int k = 0; k < n_idx; k++) {
    SimStrategy *plan = search_megatron_plan(p, &cand[idx[k]]);
    if (!plan)
      continue;
    r.opt[n] = cand[idx[k]];
    r.plan[n] = plan;
    r.cost[n] = INFINITY;
    n++;
  }
  search_context_parallel(ctx, n, refine_task, &r);
  int best = -1;
  for (int i = 0; i < n; i++)
    if (r.cost[i] < *cost * (1 - REFINE_GAIN) && (best < 0 || r.cost[i] < r.cost[best]))
      best = i;
  if (best >= 0) {
    *cost = r.cost[best];
    *cur = r.opt[best];
    sim_strategy_free(*s);
    *s = g_steal_pointer(&r.plan[best]);
  }
  for (int i = 0; i < n; i++)
    g_clear_pointer(&r.plan[i], sim_strategy_free);
  return best >= 0;
}

int search_refine_megatron(SearchContext *ctx, SimStrategy **s, double *cost,
                           const SimMegatronOptions *o)
{
  const SearchProblem *p = search_context_get_problem(ctx);
  if (!o || o->dp < 1 || !isfinite(*cost))
    return 0;
  SimMegatronOptions cur = *o;
  gint64 key = 0;
  int kept = 0;
  /* Steepest descent: every neighbour of a round is simulated, bounded by the current
   * cost, on the search's threads; the fastest (the first on a tie) is kept.  Neither
   * depends on how the threads are timed. */
  /* With a deadline in seconds the neighbours go in the order of their estimates, as many
   * at a time as there are threads, and the first such group that gains is taken: on a
   * large machine a simulation takes seconds, and a round of all of them could take the
   * whole budget.  Otherwise each round simulates them all (steepest descent). */
  gboolean timed = ctx->deadline < G_MAXDOUBLE;
  int width = MAX(1, search_context_get_threads(ctx));
  while (timed && !search_context_should_stop(ctx)) {
    SimMegatronOptions cand[REFINE_MAX];
    int m = refine_neighbours(p, &cur, cand);
    GArray *order = g_array_new(FALSE, FALSE, sizeof(int));
    for (int i = 0; i < m; i++)
      g_array_append_val(order, i);
    rank_by_estimate(p, cand, order);
    for (guint k = order->len; k-- > 0;)
      if (search_megatron_cannot_fit(p, &cand[g_array_index(order, int, k)]))
        g_array_remove_index(order, k);
    gboolean moved = FALSE;
    for (guint at = 0; at < order->len && !moved && !search_context_should_stop(ctx);
         at += (guint)width) {
      int n_idx = (int)MIN((guint)width, order->len - at);
      moved = refine_round(ctx, cand, &g_array_index(order, int, at), n_idx, key, &cur, s,
                           cost);
      key += REFINE_MAX;
      kept += moved;
    }
    g_array_unref(order);
    if (!moved)
      break;
  }
  while (!timed && !search_context_should_stop(ctx)) {
    SimMegatronOptions cand[REFINE_MAX];
    int m = refine_neighbours(p, &cur, cand);
    int all[REFINE_MAX];
    for (int i = 0; i < m; i++)
      all[i] = i;
    gboolean moved = refine_round(ctx, cand, all, m, key, &cur, s, cost);
    key += REFINE_MAX;
    kept += moved;
    if (!moved)
      break;
  }
  return kept;
}

void search_refine_pipeline(SearchContext *ctx, double share, SimStrategy **s, double *cost,
                            const SimMegatronOptions *o)
{
  if (!*s || o->pp < 2)
    return;
  SearchContext *in = search_context_new_share(ctx, share);
  if (in)
    search_refine_megatron(in, s, cost, o);
  search_context_free_inner(in);
}

void search_prefer_expert(SearchContext *ctx, gboolean single_stage, SimStrategy **best,
                          double *cost)
{
  double ec = INFINITY;
  SimMegatronOptions o;
  SimStrategy *expert = search_start_expert_stages(ctx, single_stage ? 1 : 0, &ec, NULL, &o);
  /* A pipelined winner is refined within a quarter of what is left of the budget (as MCMC
   * does for its start). */
  if (ec < *cost)
    search_refine_pipeline(ctx, 0.25, &expert, &ec, &o);
  if (expert && ec < *cost) {
    *cost = ec;
    sim_strategy_free(*best);
    *best = expert;
  } else if (expert) {
    sim_strategy_free(expert);
  }
}
