/* expert.c — the expert plans and Megatron's plan space: the candidates Megatron's rules
 * give (baselines.c describes them), simulated a round at a time for the searches that
 * start from the fastest, and the local search past those rules (micro-batch size,
 * recomputation, the ZeRO stage, sequence parallelism, interleaving, gradient buckets, the
 * TP/PP/DP split, the context- and expert-parallel degrees).  The algorithms of baselines.c and the searches call it; it calls the
 * local search of local.c. */
#include "search-private.h"
#include "distributed.h"

#include <string.h>

static gboolean has_conv(const SimGraph *g)
{
  for (int op = 0; op < sim_graph_n_ops(g); op++)
    if (sim_graph_op_type(g, op) == SIM_OP_CONV2D)
      return TRUE;
  return FALSE;
}

/* ---------------------------------------------------------------------------------- */
/* Megatron rules                                                                     */

/* Layers: the checkpoint marks, or the cuts one tensor crosses (sim/layers.c). */
static int n_checkpoints(const SimGraph *g)
{
  return sim_graph_layer_ends(g, NULL);
}

SimStrategy *search_megatron_plan(const SearchProblem *p, const SimMegatronOptions *o)
{
  /* A device subset is numbered 0..n-1 for the builder and mapped back afterwards. */
  g_autoptr(SimStrategy) s = sim_strategy_megatron(p->g, p->m, o, NULL);
  return s ? search_problem_map_devices(p, s, NULL) : NULL;
}

/* Adds the plan of options @o to @out (and @o to @opts, when given); with @lazy, only its
 * options (its strategy NULL, built when simulated). */
static void add_plan(const SearchProblem *p, const SimMegatronOptions *o, GPtrArray *out,
                     GArray *opts, gboolean lazy)
{
  if (lazy) {
    g_ptr_array_add(out, NULL);
    g_array_append_val(opts, *o);
    return;
  }
  SimStrategy *mapped = search_megatron_plan(p, o);
  if (mapped) {
    g_ptr_array_add(out, mapped);
    if (opts)
      g_array_append_val(opts, *o);
  }
}

/* With @lazy, only the plan's options (its strategy NULL, built when simulated). */
static void add_megatron(const SearchProblem *p, int dp, int tp, int pp, int64_t mbs,
                         SimRecompute recompute, int ep, int etp, GPtrArray *out, GArray *opts,
                         gboolean lazy)
{
  int64_t batch = sim_graph_batch_size(p->g);
  if (batch % ((int64_t)dp * mbs) != 0)
    return;
  SimMegatronOptions o = sim_megatron_options_default();
  o.dp = dp;
  o.tp = tp;
  o.pp = pp;
  o.microbatch_size = mbs;
  o.microbatches = (int)(batch / ((int64_t)dp * mbs));
  o.sync = p->sync;
  o.memory = p->memory;
  o.memory.recompute = recompute;
  o.ep = ep;
  o.etp = etp;
  add_plan(p, &o, out, opts, lazy);
}

/* The largest expert-parallel degree for @dp replicas: a power of two that divides @dp
 * and the experts of every mixture-of-experts operator (1 without such operators). */
static int widest_ep(const SimGraph *g, int dp)
{
  int ep = 0;
  for (int op = 0; op < sim_graph_n_ops(g); op++) {
    if (sim_graph_op_type(g, op) != SIM_OP_MOE)
      continue;
    int64_t experts = 0;
    for (int d = 0; d < sim_graph_op_n_dims(g, op); d++)
      if (!strcmp(sim_graph_op_dim_name(g, op, d), "x"))
        experts = sim_graph_op_dim_size(g, op, d);
    int e = 1;
    while (dp % (e * 2) == 0 && experts % (e * 2) == 0)
      e *= 2;
    ep = ep ? MIN(ep, e) : e;
  }
  return MAX(ep, 1);
}

/* A plan of add_megatron() and, for a mixture of experts, the same with the experts split
 * over as many of its replicas as they divide into (Megatron-Core's Mixtral recipes: one
 * expert, or a few, per GPU of a replica group); under tensor parallelism, also with
 * each expert whole on a GPU (expert tensor parallelism 1, Megatron-Core's "MoE parallel
 * folding", which its MoE guide prefers to splitting experts in width,
 * megatron/core/transformer/moe/README.md) wherever the expert-parallel degree covers a
 * replica's tensor-parallel ranks: ep the widest power of two dividing the stage's dp x
 * tp ranks and the experts, at least tp (sim/strategy-build.c's expert groups, whole
 * replicas). */
static void add_megatron_ep(const SearchProblem *p, int dp, int tp, int pp, int64_t mbs,
                            SimRecompute recompute, GPtrArray *out, GArray *opts,
                            gboolean lazy)
{
  add_megatron(p, dp, tp, pp, mbs, recompute, 1, 0, out, opts, lazy);
  int ep = widest_ep(p->g, dp);
  if (ep > 1)
    add_megatron(p, dp, tp, pp, mbs, recompute, ep, 0, out, opts, lazy);
  int ep1 = tp > 1 && search_has_experts(p->g) ? widest_ep(p->g, dp * tp) : 0;
  if (ep1 >= tp && ep1 % tp == 0)
    add_megatron(p, dp, tp, pp, mbs, recompute, ep1, 1, out, opts, lazy);
}

static void expert_candidates(const SearchProblem *p, GPtrArray *out, GArray *parents,
                              GArray *opts, gboolean lazy);

/* Sequences from which the expert rules use context parallelism (Megatron-Core's long-
 * context recipes: 8K tokens and more per sample) for the devices that the batch leaves
 * to no data-parallel replica. */
#define LONG_CONTEXT 8192

gboolean search_long_context(const SimGraph *g)
{
  if (sim_graph_tokens_per_sample(g) < LONG_CONTEXT)
    return FALSE;
  for (int op = 0; op < sim_graph_n_ops(g); op++)
    if (sim_graph_op_type(g, op) == SIM_OP_ATTENTION)
      return TRUE;
  return FALSE;
}

/* The @n = @dp ranks beside tensor parallelism that the batch does not split into: as
 * few context-parallel ranks as leave data-parallel replicas that divide it, each
 * replica's whole batch in one micro-batch. */
static void add_context_parallel(const SearchProblem *p, int n, int tp, GPtrArray *out,
                                 GArray *opts, gboolean lazy)
{
  int64_t batch = sim_graph_batch_size(p->g);
  for (int cp = 2; cp <= n && n % cp == 0; cp *= 2) {
    int dp = n / cp;
    if (batch % dp != 0)
      continue;
    SimMegatronOptions o = sim_megatron_options_default();
    o.dp = dp;
    o.tp = tp;
    o.cp = cp;
    o.microbatch_size = batch / dp;
    o.microbatches = 1;
    o.sync = p->sync;
    o.memory = p->memory;
    add_plan(p, &o, out, opts, lazy);
    return;
  }
}

void search_expert_candidates(const SearchProblem *p, GPtrArray *out, GArray *parents,
                              GArray *opts)
{
  expert_candidates(p, out, parents, opts, FALSE);
}

void search_expert_candidates_lazy(const SearchProblem *p, GPtrArray *out, GArray *parents,
                                   GArray *opts)
{
  /* Building a plan walks the whole graph (seconds for thousands of GPUs and a hundred
   * and fifty plans), so the plans are built as they are simulated. */
  expert_candidates(p, out, parents, opts, TRUE);
}

static void expert_candidates(const SearchProblem *p, GPtrArray *out, GArray *parents,
                              GArray *opts, gboolean lazy)
{
  int n = p->n_devices;
  int node_size = sim_machine_node_n_devices(p->m, sim_machine_device_node(p->m, p->devices[0]));
  int layers = n_checkpoints(p->g);
  int64_t batch = sim_graph_batch_size(p->g);
  for (int tp = 1; tp <= MIN(node_size, n); tp *= 2) {
    if (n % tp != 0)
      continue;
    for (int pp = 1; pp <= n / tp; pp++) {
      if ((n / tp) % pp != 0 || (pp > 1 && pp > layers))
        continue;
      int dp = n / (tp * pp);
      if (pp == 1) {
        /* Without a pipeline one micro-batch holds the replica's whole batch, or, as
         * Megatron runs a batch too large for memory, micro-batches of 1 to 8 samples
         * accumulate their gradients (those when @parents is given: each is the
         * whole-batch plan's variant, worth a look only where that plan does not fit). */
        guint whole = out->len;
        if (batch % dp == 0)
          add_megatron_ep(p, dp, tp, pp, batch / dp, p->memory.recompute, out, opts, lazy);
        else if (search_long_context(p->g))
          add_context_parallel(p, dp, tp, out, opts, lazy);
        if (!parents || out->len == whole)
          continue;
        int parent = (int)whole;
        while (parents->len < out->len) {
          int none = -1;
          g_array_append_val(parents, none);
        }
        for (int64_t mbs = 1; mbs <= 8 && mbs * dp < batch; mbs *= 2) {
          add_megatron_ep(p, dp, tp, pp, mbs, p->memory.recompute, out, opts, lazy);
          while (parents->len < out->len)
            g_array_append_val(parents, parent);
        }
        continue;
      }
      /* Micro-batch sizes 1 to 8, as Narayanan et al. sweep them, that leave at least as
       * many micro-batches as stages, so the pipeline can fill. */
      for (int64_t mbs = 1; mbs <= 8 && mbs * dp * pp <= batch; mbs *= 2)
        add_megatron_ep(p, dp, tp, pp, mbs, p->memory.recompute, out, opts, lazy);
    }
  }
  if (has_conv(p->g)) {
    SimStrategy *owt = search_owt_strategy(p, NULL);
    if (owt) {
      g_ptr_array_add(out, owt);
      if (opts) {
        SimMegatronOptions none = { 0 };
        g_array_append_val(opts, none);
      }
    }
  }
  while (parents && parents->len < out->len) {
    int none = -1;
    g_array_append_val(parents, none);
  }
}

/* ---------------------------------------------------------------------------------- */
/* Expert plans, simulated                                                            */

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
  int8_t *step;           /* per candidate: the step of the ladder it took, -1 none   */
} ExpertRound;

/* What a task of a round found, sent to the other ranks (distributed.h). */
typedef struct {
  double cost;
  int8_t fit;
  int8_t step;
} ExpertOutcome;

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
    for (int step = 0; step < SEARCH_MEMORY_STEPS; step++) {
      SimMemoryOptions m = search_memory_step(base, step);
      if (m.zero1 == base.zero1 && m.recompute == base.recompute && m.offload == base.offload)
        continue;
      g_autoptr(SimStrategy) v = sim_strategy_copy(*s);
      sim_strategy_set_memory(v, &m);
      gboolean vfit;
      c = expert_eval(r->ctx, v, stream + 1 + (guint32)step, r->bound, &vfit);
      if (vfit) {
        sim_strategy_free(*s);
        *s = g_steal_pointer(&v);
        r->step[i] = (int8_t)step;
        break;
      }
    }
  }
  r->cost[i] = c;
}

/* The plan that task @k of a round run on another rank settled on, built here (not
 * simulated) from what that rank sent. */
static void expert_round_rebuild(ExpertRound *r, int k, const ExpertOutcome *o)
{
  int i = r->round[k];
  SimStrategy **s = (SimStrategy **)&g_ptr_array_index(r->cands, i);
  const SearchProblem *p = search_context_get_problem(r->ctx);
  r->cost[i] = o->cost;
  r->fit[i] = (uint8_t)o->fit;
  r->step[i] = o->step;
  if (!*s && !search_megatron_cannot_fit(p, &r->opts[i]))
    *s = search_megatron_plan(p, &r->opts[i]);
  if (*s && o->step >= 0) {
    SimMemoryOptions m = search_memory_step(sim_strategy_get_memory(*s), o->step);
    sim_strategy_set_memory(*s, &m);
  }
}

/* Simulates the candidates @idx in rounds, lowering *@best_cost (and *@best, the index)
 * with each round's results in index order. */
static int expert_rounds(SearchContext *ctx, GPtrArray *cands, const SimMegatronOptions *opts,
                         GArray *idx, gboolean ladder, double *costs, uint8_t *fit,
                         double *best_cost, int *best, gboolean track)
{
  int threads = MAX(1, search_context_get_threads(ctx));
  int simulated = 0;
  g_autofree int8_t *step = g_new(int8_t, MAX(cands->len, 1));
  memset(step, -1, MAX(cands->len, 1));
  /* Under a deadline in seconds the first round is the most promising plan alone: on a
   * large machine (or a busy one) it ends sooner than two plans sharing the cores, and its
   * time bounds the rounds after it. */
  gboolean timed = ctx->deadline < G_MAXDOUBLE;
  for (guint at = 0, width = timed ? 1 : (guint)threads;
       at < idx->len && !search_dist_should_stop(ctx); at += width, width = (guint)threads) {
    int n = (int)MIN(width, idx->len - at);
    ExpertRound r = { .ctx = ctx, .cands = cands, .opts = opts,
                      .round = &g_array_index(idx, int, at),
                      .bound = *best_cost, .cost = costs, .fit = fit, .ladder = ladder,
                      .step = step };
    search_dist_parallel(ctx, n, expert_round_task, &r);
    /* Shared among MPI ranks, each rank has the plans it ran; the others' come over. */
    if (search_dist_on(ctx)) {
      g_autofree ExpertOutcome *out = g_new0(ExpertOutcome, n);
      for (int k = 0; k < n; k++) {
        int i = r.round[k];
        out[k] = (ExpertOutcome){ costs[i], (int8_t)fit[i], step[i] };
      }
      search_dist_share(ctx, n, out, sizeof *out, sizeof *out);
      for (int k = 0; k < n; k++)
        if (!search_dist_mine(ctx, k))
          expert_round_rebuild(&r, k, &out[k]);
      search_dist_sync(ctx);
    }
    /* A round that a deadline or a signal cut short (its simulations cancelled) counts
     * none of its plans as simulated, nor do they compete. */
    if (search_dist_any(ctx, search_context_should_stop(ctx) && ctx->root->watch &&
                               search_watch_fired(ctx->root->watch)))
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
 * micro-batches fill every stage), with and without sequence parallelism (and with it,
 * with and without the tensor-parallel overlap, which the estimate counts), each
 * recomputation, and ZeRO-1 where there are replicas; appended to @out. */
static void plan_space(const SearchProblem *p, const SimMegatronOptions *expert, guint n,
                       const GArray *parents, GArray *out)
{
  int layers = sim_graph_layer_ends(p->g, NULL);
  for (guint i = 0; i < n; i++) {
    const SimMegatronOptions *o = &expert[i];
    if ((parents && g_array_index(parents, int, i) >= 0) || o->dp < 1 ||
        search_megatron_cannot_fit(p, o))
      continue;
    for (int v = 1; v <= 8; v++) {
      if (v > 1 && (o->pp < 2 || !(p->kinds & SEARCH_KIND_PIPELINE) ||
                    layers % (o->pp * v) != 0 || o->microbatches % o->pp != 0))
        continue;
      for (int sp = 0; sp <= (o->tp > 1) * 2; sp++)
        for (int r = SIM_RECOMPUTE_NONE; r <= SIM_RECOMPUTE_FULL; r++)
          for (int z = 0; z <= (o->dp > 1); z++) {
            SimMegatronOptions c = *o;
            c.schedule = v > 1 ? SIM_SCHEDULE_INTERLEAVED : c.schedule;
            c.chunks = v;
            /* sp 2: sequence parallelism with the overlap. */
            c.sequence_parallel = sp > 0;
            c.tp_comm_overlap = sp == 2;
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
    if (g_log_writer_default_would_drop(G_LOG_LEVEL_DEBUG, G_LOG_DOMAIN) == FALSE) {
      SearchPlanSummary sum;
      search_plan_summarize(p->g, s, &sum);
      g_autofree char *t = search_plan_summary_text(&sum);
      gboolean fits = FALSE;
      double e = search_megatron_estimate(p, &best[k], &fits);
      g_debug("estimated plan %d: %s (estimate %.3f s%s)", k, t, e, fits ? "" : ", may not fit");
    }
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
  gboolean done = !search_dist_should_stop(ctx);
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

/* Whether the expert layout of @v builds: with an expert tensor-parallel degree of its
 * own (etp other than tp), expert groups of ep x etp ranks, a multiple of tp dividing
 * dp x tp, and no context ranks (sim/strategy-build.c); otherwise ep dividing dp. */
static gboolean experts_fit(const SimMegatronOptions *v)
{
  int ep = MAX(v->ep, 1);
  if (v->etp > 0 && v->etp != v->tp)
    return MAX(v->cp, 1) == 1 && (ep * v->etp) % v->tp == 0 &&
           ((int64_t)v->dp * v->tp) % (ep * v->etp) == 0;
  return v->dp % ep == 0;
}

/* After a change of the degrees: the experts' own tensor-parallel degree dropped (back to
 * tp) where it no longer fits, then the expert-parallel degree halved until it does. */
static void fit_experts(SimMegatronOptions *v)
{
  if (v->etp > 0 && (v->etp == v->tp || !experts_fit(v)))
    v->etp = 0;
  while (v->ep > 1 && !experts_fit(v))
    v->ep /= 2;
}

#define REFINE_STREAM 0xfd0000u
#define REFINE_MAX SEARCH_KNOB_MAX
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
gboolean search_has_experts(const SimGraph *g)
{
  for (int op = 0; op < sim_graph_n_ops(g); op++)
    if (sim_graph_op_type(g, op) == SIM_OP_MOE)
      return TRUE;
  return FALSE;
}

/* Whether @g has a self-attention operator, whose positions context parallelism splits. */
static gboolean has_attention(const SimGraph *g)
{
  for (int op = 0; op < sim_graph_n_ops(g); op++)
    if (sim_graph_op_type(g, op) == SIM_OP_ATTENTION)
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
    v.tp_comm_overlap = FALSE;
    out[n++] = v;
  }
  if (o->tp > 1 && o->sequence_parallel) {
    /* Sequence parallelism's collectives overlapped with their GEMMs, or not. */
    v = *o;
    v.tp_comm_overlap = !o->tp_comm_overlap;
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
      v.sequence_parallel = v.tp_comm_overlap = FALSE;
    /* Expert parallelism stays within the data-parallel replicas (the expert groups
     * within a stage). */
    fit_experts(&v);
    out[n++] = v;
  }
  /* With experts split over ep x tp GPUs: tensor for data parallelism both ways, the
   * expert-parallel degree scaled against tp so that as many GPUs still split each
   * expert (the experts' share of a GPU kept; through pipeline parallelism this takes
   * two trades, each of which may lose alone). */
  if (may_dp && may_tp && o->ep > 1 && (o->etp == 0 || o->etp == o->tp) &&
      search_has_experts(p->g)) {
    for (int k = 0; k < 2; k++) {
      v = *o;
      if (k == 0 && o->tp % 2 == 0) {
        v.tp = o->tp / 2;
        v.dp = o->dp * 2;
        v.ep = o->ep * 2;
      } else if (k == 1 && o->dp % 2 == 0 && o->ep % 2 == 0) {
        v.tp = o->tp * 2;
        v.dp = o->dp / 2;
        v.ep = o->ep / 2;
      } else {
        continue;
      }
      v.etp = 0;
      if (v.tp == 1)
        v.sequence_parallel = v.tp_comm_overlap = FALSE;
      /* Twice the replicas may hold half the micro-batch each. */
      gboolean fits = fill_microbatches(&v, batch);
      if (!fits && k == 0 && v.microbatch_size % 2 == 0) {
        v.microbatch_size /= 2;
        fits = fill_microbatches(&v, batch);
      }
      if (fits && experts_fit(&v))
        out[n++] = v;
    }
  }
  /* The experts over twice or half as many data-parallel replicas (or expert groups);
   * with tensor parallelism, each expert whole on a GPU (Megatron-Core's expert tensor
   * parallelism 1) or split like the rest (etp = tp). */
  if (may_dp && search_has_experts(p->g)) {
    int ep = MAX(o->ep, 1);
    for (int k = 0; k < 2; k++) {
      v = *o;
      v.ep = k == 0 ? ep * 2 : ep / 2;
      if (v.ep >= 1 && v.ep != ep && experts_fit(&v))
        out[n++] = v;
    }
    if (o->tp > 1 && ep > 1) {
      v = *o;
      v.etp = o->etp > 0 && o->etp != o->tp ? 0 : 1;
      if (experts_fit(&v))
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
    /* The ZeRO stage one up and one down (0: none; 3 shards the weights too). */
    const SimMemoryOptions *mo = &o->memory;
    int z = mo->zero3 ? 3 : mo->zero2 ? 2 : mo->zero1 ? 1 : 0;
    for (int k = -1; k <= 1; k += 2) {
      if (z + k < 0 || z + k > 3)
        continue;
      v = *o;
      v.memory.zero1 = z + k >= 1;
      v.memory.zero2 = z + k >= 2;
      v.memory.zero3 = z + k >= 3;
      out[n++] = v;
    }
  }
  /* The optimizer offloaded to the host (ZeRO-Offload) where the plan is not expected to
   * fit without it, and back on the devices where it is offloaded. */
  gboolean fits = TRUE;
  if (o->memory.offload > 0 ||
      (p->memory_limit && (search_megatron_estimate(p, o, &fits), !fits))) {
    v = *o;
    v.memory.offload = o->memory.offload > 0 ? 0 : 1;
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
  /* Context parallelism: the devices traded between it and tensor, pipeline or data
   * parallelism, both ways (models with self-attention, whose sequence may split, over
   * long sequences as the expert rules take them, or a plan that has it already). */
  if ((p->kinds & SEARCH_KIND_ATTRIBUTE) && has_attention(p->g) &&
      (o->cp > 1 || search_long_context(p->g))) {
    gboolean may[3] = { may_tp, may_pp, may_dp };
    for (int k = 0; k < 6; k++) {
      int other = k / 2, d[3] = { o->tp, o->pp, o->dp }, cp = MAX(o->cp, 1);
      if (k % 2 == 0 && d[other] % 2 == 0) {
        d[other] /= 2;
        cp *= 2;
      } else if (k % 2 == 1 && cp % 2 == 0 && may[other]) {
        d[other] *= 2;
        cp /= 2;
      } else {
        continue;
      }
      v = *o;
      v.tp = d[0];
      v.pp = d[1];
      v.dp = d[2];
      v.cp = cp;
      if (!fill_microbatches(&v, batch))
        continue;
      if (v.pp == 1) {
        v.schedule = SIM_SCHEDULE_1F1B;
        v.chunks = 1;
      }
      /* Tensor parallelism brought in beside the context ranks keeps the activations
       * split by position between its GEMMs (sequence parallelism), as they are. */
      if (v.tp == 1)
        v.sequence_parallel = v.tp_comm_overlap = FALSE;
      else if (o->tp == 1 && v.cp > 1)
        v.sequence_parallel = TRUE;
      fit_experts(&v);
      out[n++] = v;
    }
  }
  g_assert(n <= REFINE_MAX);
  return n;
}

int search_megatron_knob_neighbours(const SearchProblem *p, const SimMegatronOptions *o,
                                    SimMegatronOptions *out)
{
  SimMegatronOptions all[REFINE_MAX];
  int n = refine_neighbours(p, o, all), k = 0;
  const SimMemoryOptions *a = &o->memory;
  int z = a->zero3 ? 3 : a->zero2 ? 2 : a->zero1 ? 1 : 0;
  for (int i = 0; i < n; i++) {
    const SimMegatronOptions *v = &all[i];
    const SimMemoryOptions *b = &v->memory;
    int zv = b->zero3 ? 3 : b->zero2 ? 2 : b->zero1 ? 1 : 0;
    gboolean same = v->tp == o->tp && v->pp == o->pp && v->dp == o->dp;
    gboolean overlap = v->sequence_parallel == o->sequence_parallel &&
                       !v->tp_comm_overlap != !o->tp_comm_overlap;
    /* The experts' trade of tensor for data parallelism (ep scaled against tp). */
    gboolean expert_trade = v->pp == o->pp && v->tp != o->tp && v->dp != o->dp &&
                            MAX(v->ep, 1) != MAX(o->ep, 1) && MAX(o->ep, 1) > 1;
    if (MAX(v->cp, 1) != MAX(o->cp, 1) || expert_trade ||
        (same && (MAX(v->ep, 1) != MAX(o->ep, 1) || v->etp != o->etp || zv != z || overlap ||
                  v->memory.offload != a->offload)))
      out[k++] = *v;
  }
  return k;
}

gboolean search_megatron_options_of(const SearchProblem *p, const SimStrategy *s,
                                    SimMegatronOptions *out)
{
  SearchPlanSummary sum;
  search_plan_summarize(p->g, s, &sum);
  if (!sum.uniform || sum.microbatch_size <= 0)
    return FALSE;
  SimMegatronOptions o = sim_megatron_options_default();
  o.tp = sum.tp;
  o.cp = sum.cp;
  o.pp = sum.pp;
  o.dp = sum.dp;
  o.ep = sum.ep;
  o.etp = sum.etp != sum.tp ? sum.etp : 0;
  o.microbatches = sum.microbatches;
  o.microbatch_size = sum.microbatch_size;
  o.schedule = sum.schedule;
  o.chunks = sum.chunks;
  o.sequence_parallel = sum.sequence_parallel;
  o.tp_comm_overlap = sum.tp_comm_overlap;
  o.tp_overlap = sim_strategy_get_tp_overlap(s);
  o.memory = sim_strategy_get_memory(s);
  o.sync = sim_strategy_get_sync(s);
  /* Whether pipeline messages are scatter-gathered shows only in the plan built. */
  for (int sg = 0; sg < (o.tp > 1 && o.pp > 1 ? 2 : 1); sg++) {
    o.scatter_gather = sg;
    g_autoptr(SimStrategy) b = search_megatron_plan(p, &o);
    if (b && sim_strategy_equal(b, s)) {
      *out = o;
      return TRUE;
    }
  }
  return FALSE;
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
  search_dist_parallel(ctx, n, refine_task, &r);
  search_dist_share(ctx, n, r.cost, sizeof r.cost[0], sizeof r.cost[0]);
  search_dist_sync(ctx);
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
  while (timed && !search_dist_should_stop(ctx)) {
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
    for (guint at = 0; at < order->len && !moved && !search_dist_should_stop(ctx);
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
  while (!timed && !search_dist_should_stop(ctx)) {
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
