/* pipeline-dp.c — pipeline stage partitioning over device groups (in the manner of
 * PipeDream's and Alpa's inter-operator passes), joined with the dynamic program for the
 * operators' own configurations.
 *
 * For S stages the devices form S consecutive groups; the operators, in topological order,
 * are cut into S contiguous runs by a dynamic program that minimizes the slowest stage:
 * its operators' data-parallel time on the group (estimate.c) plus the activations it
 * sends on.  Cuts go after layer ends (ops marked as checkpoints) when the model marks
 * enough of them, else anywhere, priced by what crosses.  The number of micro-batches is
 * chosen among a few multiples of S by simulating each; Megatron's pipelines (even layers
 * per stage, tensor parallelism inside) are candidates too.  The search compares the best
 * pipeline with the best single-stage strategy (S = 1: data parallelism or the dynamic
 * program's), refines both by a sweep of local search, then the better one further
 * (within its stage groups for a pipeline). */
#include "distributed.h"

#include <string.h>

/* Bytes of activations that cross a cut after op @i: tensors made at or before @i and read
 * after it (data sources excepted, which enter where they are read). */
static double *cut_bytes(const SimGraph *g)
{
  int n = sim_graph_n_ops(g);
  double *cross = g_new0(double, MAX(n, 1));
  for (int op = 0; op < n; op++) {
    if (sim_graph_op_type(g, op) == SIM_OP_INPUT)
      continue;
    for (int o = 0; o < sim_graph_op_n_outputs(g, op); o++) {
      int t = sim_graph_op_output(g, op, o);
      int last = op;
      for (int c = 0; c < sim_graph_tensor_n_consumers(g, t); c++)
        last = MAX(last, sim_graph_tensor_consumer(g, t, c));
      SimShape sh = sim_graph_tensor_shape(g, t);
      double bytes = (double)sim_shape_numel(&sh) * MAX(1, sim_dtype_size(sim_graph_tensor_dtype(g, t)));
      for (int i = op; i < last; i++)
        cross[i] += bytes;
    }
  }
  return cross;
}

/* The stage of every op for @S stages by the min-max partition; FALSE if impossible. */
static gboolean partition(const SearchProblem *p, SearchEstimate *e, int S, int *op_stage)
{
  const SimGraph *g = p->g;
  int n = sim_graph_n_ops(g);
  int group = p->n_devices / S;
  g_autofree double *w = g_new0(double, n + 1);
  for (int op = 0; op < n; op++)
    w[op + 1] = w[op] + search_estimate_dp_compute(e, op, group);
  g_autofree double *cross = cut_bytes(g);
  /* Allowed cuts: after layer ends (checkpoint marks, or the cuts one tensor crosses:
   * sim_graph_layer_ends()) when there are enough of them, else after any op. */
  g_autofree int *ends = g_new(int, MAX(n, 1));
  int marks = sim_graph_layer_ends(g, ends);
  g_autofree gboolean *is_end = g_new0(gboolean, n + 1);
  for (int i = 0; i < marks; i++)
    is_end[ends[i]] = TRUE;
  g_autofree gboolean *allowed = g_new0(gboolean, n + 1);
  for (int op = 0; op + 1 < n; op++)
    allowed[op + 1] = marks >= S - 1 ? is_end[op] : TRUE;
  int d0 = p->devices[0], d1 = p->devices[MIN(group, p->n_devices - 1)];
  double bw = d0 != d1 ? sim_machine_bandwidth(p->m, d0, d1) : 1e12;
  if (!(bw > 0))
    bw = 1e9;

  /* best[s][j]: the slowest stage when the first j ops form s stages; cut[s][j] the start
   * of the last of them. */
  gsize stride = (gsize)n + 1;
  g_autofree double *best = g_new(double, (gsize)(S + 1) * stride);
  g_autofree int *cut = g_new0(int, (gsize)(S + 1) * stride);
  for (gsize i = 0; i < (gsize)(S + 1) * stride; i++)
    best[i] = INFINITY;
  best[0] = 0;
  for (int s = 1; s <= S; s++)
    for (int j = 1; j <= n; j++) {
      if (j < n && !allowed[j])
        continue;
      for (int i = s - 1; i < j; i++) {
        double prev = best[(gsize)(s - 1) * stride + i];
        if (!isfinite(prev) || (i > 0 && !allowed[i]))
          continue;
        /* A stage sends its last op's crossing activations forward and receives their
         * gradients back. */
        double stage = w[j] - w[i] + (j < n ? 2 * cross[j - 1] / bw : 0);
        double v = MAX(prev, stage);
        if (v < best[(gsize)s * stride + j]) {
          best[(gsize)s * stride + j] = v;
          cut[(gsize)s * stride + j] = i;
        }
      }
    }
  if (!isfinite(best[(gsize)S * stride + n]))
    return FALSE;
  int j = n;
  for (int s = S; s >= 1; s--) {
    int i = cut[(gsize)s * stride + j];
    for (int op = i; op < j; op++)
      op_stage[op] = s - 1;
    j = i;
  }
  /* Data sources enter at the stage of their first reader. */
  for (int op = 0; op < n; op++) {
    if (sim_graph_op_type(g, op) != SIM_OP_INPUT)
      continue;
    int first = -1;
    for (int o = 0; o < sim_graph_op_n_outputs(g, op); o++) {
      int t = sim_graph_op_output(g, op, o);
      for (int c = 0; c < sim_graph_tensor_n_consumers(g, t); c++) {
        int st = op_stage[sim_graph_tensor_consumer(g, t, c)];
        first = first < 0 ? st : MIN(first, st);
      }
    }
    if (first >= 0)
      op_stage[op] = first;
  }
  for (int s = 0; s < S; s++) {
    gboolean any = FALSE;
    for (int op = 0; op < n && !any; op++)
      any = op_stage[op] == s;
    if (!any)
      return FALSE;
  }
  return TRUE;
}

/* The pipeline of @S stages and @mb micro-batches, each op data parallel on its stage's
 * group as far as its batch per micro-batch divides (transfer full; NULL if invalid). */
static SimStrategy *pipeline_strategy(const SearchProblem *p, int S, const int *op_stage, int mb)
{
  const SimGraph *g = p->g;
  int n = sim_graph_n_ops(g);
  int group = p->n_devices / S;
  g_autoptr(SimStrategy) s = search_problem_new_strategy(p);
  sim_strategy_set_microbatches(s, mb);
  for (int op = 0; op < n; op++) {
    int64_t per = sim_graph_op_dim_size(g, op, 0);
    if (per % mb != 0)
      return NULL;
    per /= mb;
    SearchConfig c = { .start = op_stage[op] * group };
    for (int d = 0; d < SEARCH_MAX_DIMS; d++)
      c.degree[d] = 1;
    for (int k = group; k >= 1; k--)
      if (group % k == 0 && per % k == 0 && sim_graph_op_dim_splittable(g, op, 0)) {
        c.degree[0] = k;
        break;
      }
    c.n = c.degree[0];
    if (!search_problem_apply_config(p, s, op, &c, NULL))
      return NULL;
  }
  g_autofree const int **groups = g_new(const int *, S);
  g_autofree int *sizes = g_new(int, S);
  for (int st = 0; st < S; st++) {
    groups[st] = p->devices + st * group;
    sizes[st] = group;
  }
  if (!sim_strategy_set_stages(s, S, op_stage, groups, sizes, NULL))
    return NULL;
  if (!sim_strategy_validate(s, g, p->m, NULL))
    return NULL;
  return g_steal_pointer(&s);
}

static gboolean pipeline_run(const SearchAlgorithm *self, SearchContext *ctx, GError **error)
{
  const SearchProblem *p = search_context_get_problem(ctx);
  const SimGraph *g = p->g;
  int n = sim_graph_n_ops(g);
  int max_stages = search_context_get_option_int_in(ctx, "max-stages", 16, 1, G_MAXINT);
  int cands = search_context_get_option_int_in(ctx, "cands", 8, 1, G_MAXINT);
  SearchEstimate *e = search_estimate_new(p);

  /* S = 1: data parallelism, the expert's plan and the dynamic program's strategy. */
  double flat_cost = INFINITY;
  g_autoptr(SimStrategy) flat = search_start_data_parallel(ctx, &flat_cost, error);
  if (!flat) {
    search_estimate_free(e);
    return FALSE;
  }
  search_prefer_expert(ctx, TRUE, &flat, &flat_cost);
  {
    g_autofree int *cfg = g_new(int, MAX(n, 1));
    search_dp_unity(p, e, cands, TRUE, cfg);
    g_autoptr(SimStrategy) s = search_problem_strategy_from_configs(p, cfg, error);
    if (!s) {
      search_estimate_free(e);
      return FALSE;
    }
    double c = search_fit(ctx, &s);
    if (c < flat_cost) {
      flat_cost = c;
      g_clear_pointer(&flat, sim_strategy_free);
      flat = g_steal_pointer(&s);
    }
  }

  /* S > 1: Megatron's pipelines first (even layers per stage, tensor parallelism inside),
   * then the partitions of the dynamic program with a few numbers of micro-batches. */
  double pipe_cost = INFINITY;
  g_autoptr(SimStrategy) pipe = NULL;
  if (p->kinds & SEARCH_KIND_PIPELINE) {
    g_autoptr(GPtrArray) expert = g_ptr_array_new_with_free_func((GDestroyNotify)sim_strategy_free);
    g_autoptr(GArray) opts = g_array_new(FALSE, TRUE, sizeof(SimMegatronOptions));
    search_expert_candidates(p, expert, NULL, opts);
    SimMegatronOptions best_opts = { 0 };
    for (guint i = 0; i < expert->len && !search_dist_should_stop(ctx); i++) {
      SimStrategy *s = g_ptr_array_index(expert, i);
      if (sim_strategy_n_stages(s) < 2)
        continue;
      double c = search_fit(ctx, &s);
      g_ptr_array_index(expert, i) = s;
      if (c < pipe_cost) {
        pipe_cost = c;
        g_clear_pointer(&pipe, sim_strategy_free);
        pipe = sim_strategy_copy(s);
        best_opts = g_array_index(opts, SimMegatronOptions, i);
        best_opts.memory = sim_strategy_get_memory(s);
      }
    }
    /* The best of them refined in Megatron's plan space, within a quarter of what is left
     * of the budget. */
    search_refine_pipeline(ctx, 0.25, &pipe, &pipe_cost, &best_opts);
  }

  int64_t batch = sim_graph_batch_size(g);
  g_autofree int *op_stage = g_new(int, MAX(n, 1));
  for (int S = 2; S <= MIN(p->n_devices, max_stages) && (p->kinds & SEARCH_KIND_PIPELINE); S++) {
    if (p->n_devices % S != 0 || search_dist_should_stop(ctx))
      continue;
    if (!partition(p, e, S, op_stage))
      continue;
    for (int f = 1; f <= 8; f *= 2) {
      int mb = S * f;
      if (batch % mb != 0 || search_dist_should_stop(ctx))
        continue;
      g_autoptr(SimStrategy) s = pipeline_strategy(p, S, op_stage, mb);
      if (!s)
        continue;
      double c = search_fit(ctx, &s);
      if (c < pipe_cost) {
        pipe_cost = c;
        g_clear_pointer(&pipe, sim_strategy_free);
        pipe = g_steal_pointer(&s);
      }
    }
  }

  /* Local search: one sweep over each of the two, then the better one on. */
  if (search_context_get_option_int_in(ctx, "polish", 1, 0, 1)) {
    GArray **lists = g_new(GArray *, MAX(n, 1));
    for (int op = 0; op < n; op++)
      lists[op] = search_polish_candidates(p, e, op, MAX(cands, 16));
    if (!search_dist_should_stop(ctx))
      flat_cost = search_polish(ctx, &flat, lists, 1, 0);
    /* In a pipeline an op's candidates are those on its stage's devices that divide its
     * micro-batch; the evaluator rejects the others, so all are offered. */
    if (pipe && !search_dist_should_stop(ctx))
      pipe_cost = search_polish(ctx, &pipe, NULL, 1, 0);
    if (!search_dist_should_stop(ctx)) {
      if (pipe && pipe_cost < flat_cost)
        search_polish(ctx, &pipe, NULL, 0, 0);
      else
        search_polish(ctx, &flat, lists, 0, 0);
    }
    for (int op = 0; op < n; op++)
      g_array_unref(lists[op]);
    g_free(lists);
  }
  search_estimate_free(e);
  return TRUE;
}

static const SearchOptionSpec pipeline_options[] = {
  { "max-stages", "the most pipeline stages tried (default 16)" },
  { "cands", "candidates per operator for the single-stage dynamic program (default 8)" },
  { "polish", "1: refine the best by local search with the simulator (default), 0: not" },
  { NULL, NULL },
};

const SearchAlgorithm search_algo_pipeline = {
  .api_version = SEARCH_ALGORITHM_API_VERSION,
  .name = "pipeline",
  .description = "pipeline stage partitioning over device groups by dynamic programming, "
                 "against the single-stage dynamic program",
  .run = pipeline_run,
  .options = pipeline_options,
};
