/* local.c — local search with the simulator: the refinement the constructive algorithms
 * (dynamic programs, beam, pipeline partitioning) end with, since their own cost models
 * see neither overlap nor contention. */
#include "distributed.h"

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
  return mo.recompute != SIM_RECOMPUTE_NONE || mo.zero1 || mo.offload > 0 ||
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
    if (!search_plan_saves_memory(now) || search_dist_should_stop(ctx))
      break;
    g_autoptr(SimStrategy) s = sim_strategy_copy(now);
    SimMemoryOptions mo = sim_strategy_get_memory(s);
    int mb = sim_strategy_get_microbatches(s);
    gboolean relax = kind < 2;
    if (kind == 0 && mo.offload > 0)
      mo.offload = 0; /* the optimizer back on the devices first */
    else if (kind == 0 && mo.recompute != SIM_RECOMPUTE_NONE)
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
    for (int tries = 0; tries < (relax ? 8 : 1) && !search_dist_should_stop(ctx);
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

/* ---------------------------------------------------------------------------------- */
/* The polish's rounds                                                                */

/* The trials of an operator (its candidates alone, or with the producers only it reads)
 * are a round: each is simulated on an evaluator of the pool that holds the current plan
 * (as main has it, replicated shards included, and put back so after each trial),
 * on the search's threads, or divided among MPI ranks (distributed.h).  The round keeps
 * the fastest that beats the plan, the first on a tie, as trying them one after the other
 * would: a trial's time depends on nothing but the plan and the trial, and its tie key on
 * its place in the round.  Only the bounds the simulations stop at depend on the threads'
 * timing: a trial is bounded by the plan and by the trials before it that are done, never
 * by a later one, so the first of the fastest always runs to its end. */
typedef struct {
  SearchContext *ctx;
  SearchEvaluator *main;  /* the plan; the moves kept are made on it, no trial runs  */
  guint32 stream;
  GMutex lock;
  GPtrArray *all;         /* the trials' evaluators (SearchEvaluator*)               */
  GPtrArray *idle;        /* those not in use                                        */
} Pool;

typedef struct {
  double cost;            /* search_penalized(); +inf where not simulated            */
  double raw;             /* what the run returned, recorded as the best if it wins  */
} TrialOut;

typedef struct {
  Pool *pool;
  const SearchProblem *p;
  int op;
  const int *cfg;         /* the trials' configurations of op                        */
  const SimStrategy *plan;/* main's, unchanged during the round                        */
  GArray *group;          /* NULL: op alone; else the producers moved along            */
  gint64 base;            /* trial k runs as the evaluator's run base + k + 1         */
  double best;            /* the plan's time, then the trial kept's                   */
  TrialOut *out;          /* written under the pool's lock                            */
} Round;

static void pool_init(Pool *pool, SearchContext *ctx, SearchEvaluator *main, guint32 stream)
{
  pool->ctx = ctx;
  pool->main = main;
  pool->stream = stream;
  g_mutex_init(&pool->lock);
  pool->all = g_ptr_array_new_with_free_func((GDestroyNotify)search_evaluator_free);
  pool->idle = g_ptr_array_new();
}

/* Drops the other evaluators (after the plan changed as a whole). */
static void pool_reset(Pool *pool, SearchEvaluator *main)
{
  g_ptr_array_set_size(pool->idle, 0);
  g_ptr_array_set_size(pool->all, 0);
  pool->main = main;
}

static void pool_clear(Pool *pool)
{
  g_ptr_array_unref(pool->idle);
  g_ptr_array_unref(pool->all);
  g_mutex_clear(&pool->lock);
}

/* Brings the trials' evaluators to the plan: each op that differs from main's. */
static void pool_sync(Pool *pool, int n)
{
  const SimStrategy *want = search_evaluator_get_strategy(pool->main);
  for (guint i = 0; i < pool->all->len; i++) {
    SearchEvaluator *ev = g_ptr_array_index(pool->all, i);
    const SimStrategy *have = search_evaluator_get_strategy(ev);
    for (int op = 0; op < n; op++) {
      const int *da = sim_strategy_op_degrees(want, op), *db = sim_strategy_op_degrees(have, op);
      int na = 0, nb = 0;
      const int *va = sim_strategy_op_devices(want, op, &na);
      const int *vb = sim_strategy_op_devices(have, op, &nb);
      if (memcmp(da, db, sizeof(int) * SEARCH_MAX_DIMS) != 0 || na != nb ||
          memcmp(va, vb, sizeof(int) * (gsize)na) != 0)
        search_evaluator_copy_op(ev, op, want);
    }
  }
}

/* Before a round (no trial running): as many evaluators as @workers threads take, copies
 * of the plan. */
static void pool_grow(Pool *pool, int workers)
{
  while ((int)pool->all->len < workers) {
    SearchEvaluator *ev = search_evaluator_new(pool->ctx,
                                               search_evaluator_get_strategy(pool->main),
                                               pool->stream, NULL);
    if (!ev)
      break;
    g_ptr_array_add(pool->all, ev);
    g_ptr_array_add(pool->idle, ev);
  }
}

/* An evaluator holding the plan, or NULL (none could be made): a trial changes it and
 * puts it back as it was. */
static SearchEvaluator *pool_take(Pool *pool)
{
  g_mutex_lock(&pool->lock);
  SearchEvaluator *ev = pool->idle->len ? g_ptr_array_steal_index_fast(pool->idle,
                                                                     pool->idle->len - 1)
                                        : NULL;
  g_mutex_unlock(&pool->lock);
  return ev;
}

static void pool_give(Pool *pool, SearchEvaluator *ev)
{
  g_mutex_lock(&pool->lock);
  g_ptr_array_add(pool->idle, ev);
  g_mutex_unlock(&pool->lock);
}

/* Past the deadline, or after a signal: the round's other trials are skipped.  An
 * evaluation budget is never looked at inside a round (its trials are counted out
 * before), where what runs must not depend on the threads' timing. */
static gboolean round_late(const SearchContext *ctx)
{
  const SearchContext *root = ctx->root;
  return atomic_load(&root->interrupted) || search_signals_seen() > 0 ||
         (root->watch && search_watch_fired(root->watch)) ||
         (ctx->deadline < G_MAXDOUBLE && search_context_elapsed(ctx) >= ctx->deadline);
}

static void round_task(int k, gpointer data)
{
  Round *r = data;
  Pool *pool = r->pool;
  const SearchProblem *p = r->p;
  if (round_late(pool->ctx))
    return;
  SearchEvaluator *ev = pool_take(pool);
  if (!ev)
    return;
  const SearchConfig *c = search_problem_config(p, r->op, r->cfg[k]);
  gboolean run = TRUE;
  if (r->group) {
    gboolean moved = FALSE;
    for (guint g = 0; g < r->group->len; g++) {
      int u = g_array_index(r->group, int, g);
      int j = search_matching_config(p, u, c);
      if (j >= 0 && search_evaluator_set_config(ev, u, search_problem_config(p, u, j)))
        moved = TRUE;
    }
    run = moved;
  }
  if (run && search_evaluator_set_config(ev, r->op, c)) {
    /* Bounded by the plan and the trials before this one that are done, never by a later
     * one: the first of the fastest is then never stopped at its bound, and is offered as
     * the best before any other of its time (by its key), as in turn. */
    g_mutex_lock(&pool->lock);
    double bound = r->best;
    for (int j = 0; j < k; j++)
      bound = MIN(bound, r->out[j].cost);
    g_mutex_unlock(&pool->lock);
    search_evaluator_set_runs(ev, r->base + k);
    double raw = search_evaluator_run_bounded(ev, bound);
    double cost = search_penalized(ev, raw);
    g_mutex_lock(&pool->lock);
    r->out[k].raw = raw;
    r->out[k].cost = cost;
    g_mutex_unlock(&pool->lock);
  }
  search_evaluator_copy_op(ev, r->op, r->plan);
  for (guint g = 0; r->group && g < r->group->len; g++)
    search_evaluator_copy_op(ev, g_array_index(r->group, int, g), r->plan);
  pool_give(pool, ev);
}

/* Runs the round of @m trials and returns the one kept (the fastest below r->best, the
 * first on a tie), or -1.  Every rank then holds every trial's time, and the one kept is
 * recorded as the best where another rank simulated it. */
static int run_round(Round *r, int m, int n_ops)
{
  Pool *pool = r->pool;
  SearchContext *ctx = pool->ctx;
  pool_grow(pool, MIN(search_dist_threads(ctx), m));
  pool_sync(pool, n_ops);
  r->plan = search_evaluator_get_strategy(pool->main);
  r->base = search_evaluator_get_evals(pool->main);
  r->out = g_new(TrialOut, MAX(m, 1));
  for (int k = 0; k < m; k++)
    r->out[k].cost = r->out[k].raw = INFINITY;
  double bound = r->best;
  search_dist_parallel(ctx, m, round_task, r);
  search_dist_share(ctx, m, r->out, sizeof(TrialOut), sizeof(TrialOut));
  search_evaluator_set_runs(pool->main, r->base + m);
  int best = -1;
  for (int k = 0; k < m; k++)
    if (r->out[k].cost < (best < 0 ? bound : r->out[best].cost))
      best = k;
  r->best = best >= 0 ? r->out[best].cost : bound;
  return best;
}

/* After run_round() chose @k, which the plan now is: recorded where another rank ran it,
 * then the evaluations and the best exchanged. */
static void end_round(Round *r, int k)
{
  Pool *pool = r->pool;
  if (k >= 0 && !search_dist_mine(pool->ctx, k))
    search_context_record(pool->ctx, r->p, search_evaluator_get_strategy(pool->main),
                          r->out[k].raw, search_key(pool->stream, r->base + k + 1));
  search_dist_sync(pool->ctx);
  g_clear_pointer(&r->out, g_free);
}

/* The trials of @op: its candidates but the plan's own, as many as the evaluation budget
 * has left.  Returns their number. */
static int round_trials(SearchContext *ctx, const SearchProblem *p, GArray *const *cands,
                        int op, int orig_idx, int *cfg)
{
  int m = cands ? (int)cands[op]->len : search_problem_n_configs(p, op);
  gint64 left = search_context_evals_left(ctx);
  int n = 0;
  for (int k = 0; k < m && n < left; k++) {
    int i = cands ? g_array_index(cands[op], int, k) : k;
    if (i != orig_idx)
      cfg[n++] = i;
  }
  return n;
}

double search_polish(SearchContext *ctx, SimStrategy **s, GArray *const *cands, int max_sweeps,
                     guint32 stream)
{
  const SearchProblem *p = search_context_get_problem(ctx);
  int n = sim_graph_n_ops(p->g);
  SearchEvaluator *ev = search_evaluator_new(ctx, *s, stream, NULL);
  if (!ev)
    return INFINITY;
  Pool pool;
  pool_init(&pool, ctx, ev, stream);
  SearchEstimate *e = search_estimate_new(p);
  double cur = search_penalized(ev, search_evaluator_run(ev));
  int max_trials = 1;
  for (int op = 0; op < n; op++)
    max_trials = MAX(max_trials, cands ? (int)cands[op]->len : search_problem_n_configs(p, op));
  g_autofree int *cfg = g_new(int, max_trials);
  gboolean stop = FALSE;
  for (int sweep = 0; (max_sweeps <= 0 || sweep < max_sweeps) && !stop; sweep++) {
    gboolean improved = FALSE;
    for (int op = 0; op < n && !stop; op++) {
      if (search_dist_should_stop(ctx)) {
        stop = TRUE;
        break;
      }
      int orig_idx = search_problem_config_of(p, search_evaluator_get_strategy(ev), op);
      Round r = { .pool = &pool, .p = p, .op = op, .cfg = cfg, .best = cur };
      int m = round_trials(ctx, p, cands, op, orig_idx, cfg);
      int k = run_round(&r, m, n);
      if (k >= 0) {
        search_evaluator_set_config(ev, op, search_problem_config(p, op, cfg[k]));
        cur = r.best;
        improved = TRUE;
      }
      end_round(&r, k);
      if (k >= 0)
        continue;
      /* Group moves: the op with the producers only it reads (its data, a private chain
       * of layers), all to matching configurations, which no single move can reach when
       * each step alone would add a transfer. */
      g_autoptr(GArray) group = g_array_new(FALSE, FALSE, sizeof(int));
      private_producers(p->g, op, group);
      if (group->len == 0)
        continue;
      if (search_dist_should_stop(ctx)) {
        stop = TRUE;
        break;
      }
      r.group = group;
      m = round_trials(ctx, p, cands, op, orig_idx, cfg);
      k = run_round(&r, m, n);
      if (k >= 0) {
        const SearchConfig *c = search_problem_config(p, op, cfg[k]);
        for (guint g = 0; g < group->len; g++) {
          int u = g_array_index(group, int, g);
          int j = search_matching_config(p, u, c);
          if (j >= 0)
            search_evaluator_set_config(ev, u, search_problem_config(p, u, j));
        }
        search_evaluator_set_config(ev, op, c);
        cur = r.best;
        improved = TRUE;
      }
      end_round(&r, k);
    }
    /* Resource splits at every op where branches meet: one after the other, the same on
     * every rank. */
    for (int op = 0; op < n && !stop; op++) {
      if (sim_graph_op_n_inputs(p->g, op) < 2)
        continue;
      if (search_dist_should_stop(ctx)) {
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
      if (ev != pool.main)
        pool_reset(&pool, ev);
    }
    if (!improved)
      break;
  }
  search_estimate_free(e);
  sim_strategy_free(*s);
  *s = sim_strategy_copy(search_evaluator_get_strategy(ev));
  pool_clear(&pool);
  search_evaluator_free(ev);
  return cur;
}

SimMemoryOptions search_memory_step(SimMemoryOptions base, int step)
{
  if (step == 0 || step == 2)
    base.zero1 = TRUE;
  if (step == 1 || step == 2)
    base.recompute = SIM_RECOMPUTE_FULL;
  if (step == 3) {
    /* Last, what is left: the optimizer to the host too (ZeRO-Offload). */
    base.zero1 = TRUE;
    base.recompute = SIM_RECOMPUTE_FULL;
    base.offload = 1;
  }
  return base;
}

double search_fit(SearchContext *ctx, SimStrategy **s)
{
  double cost = search_context_evaluate(ctx, *s);
  if (isfinite(cost) || !search_problem_get_memory_limit(search_context_get_problem(ctx)))
    return cost;
  SimMemoryOptions base = sim_strategy_get_memory(*s);
  for (int i = 0; i < SEARCH_MEMORY_STEPS && !search_dist_should_stop(ctx); i++) {
    SimMemoryOptions m = search_memory_step(base, i);
    if (m.zero1 == base.zero1 && m.recompute == base.recompute && m.offload == base.offload)
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
