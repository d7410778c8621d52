/* baselines.c — the plans a practitioner writes by hand, as algorithms and as the
 * yardsticks `parasol search` reports speedups against:
 *   - data parallelism over every device;
 *   - Megatron-style expert plans after Narayanan et al. (SC'21): tensor parallelism inside
 *     a node (powers of two up to the node's size), pipeline stages across the rest, data
 *     parallelism for what remains, micro-batch sizes 1 to 8 (without a pipeline also the
 *     whole batch in one), and, for a plan that would not fit otherwise, the distributed
 *     optimizer and full recomputation; the fastest;
 *   - "one weird trick" (Krizhevsky 2014) for networks with convolutions: the layers up to
 *     the first dense one data parallel, the dense layers model parallel. */
#include "search-private.h"

#include <string.h>

/* ---------------------------------------------------------------------------------- */
/* One weird trick                                                                    */

static int largest_divisor(int64_t size, int n)
{
  for (int k = n; k > 1; k--)
    if (size % k == 0 && n % k == 0)
      return k;
  return 1;
}

SimStrategy *search_owt_strategy(const SearchProblem *p, GError **error)
{
  const SimGraph *g = p->g;
  int n_ops = sim_graph_n_ops(g);
  int first_dense = n_ops;
  for (int op = 0; op < n_ops && first_dense == n_ops; op++)
    if (sim_graph_op_type(g, op) == SIM_OP_LINEAR)
      first_dense = op;
  g_autoptr(SimStrategy) s = search_problem_data_parallel(p, error);
  if (!s)
    return NULL;
  for (int op = first_dense; op < n_ops; op++) {
    if (sim_graph_op_type(g, op) != SIM_OP_LINEAR)
      continue;
    /* The dense layer's output features split over every device: its weights are divided
     * instead of replicated, and its input is gathered from the data-parallel layers. */
    int nd = sim_graph_op_n_dims(g, op);
    int degrees[SEARCH_MAX_DIMS];
    for (int d = 0; d < SEARCH_MAX_DIMS; d++)
      degrees[d] = 1;
    for (int d = 0; d < nd; d++) {
      if (sim_graph_op_dim_role(g, op, d) == SIM_ROLE_PARAMETER &&
          sim_graph_op_dim_splittable(g, op, d)) {
        degrees[d] = largest_divisor(sim_graph_op_dim_size(g, op, d), p->n_devices);
        break;
      }
    }
    int k = 1;
    for (int d = 0; d < nd; d++)
      k *= degrees[d];
    if (k > 1 && !sim_strategy_set_op(s, op, degrees, p->devices, error))
      return NULL;
  }
  return g_steal_pointer(&s);
}

SimStrategy *search_problem_expert(const SearchProblem *p, double *time, GError **error)
{
  g_return_val_if_fail(p != NULL, NULL);
  if (time)
    *time = INFINITY;
  /* The expert plans as the expert algorithm simulates them, with no budget. */
  SearchRunOptions o = search_run_options_default();
  o.time_budget = 0;
  o.eval_budget = G_MAXINT64 / 2;
  o.progress = FALSE;
  o.handle_sigint = FALSE;
  g_autoptr(SearchResult) r = search_run(&search_algo_expert, (SearchProblem *)p, &o, error);
  if (!r)
    return NULL;
  double best = INFINITY;
  const SimStrategy *e = search_result_get_expert(r, &best);
  SimStrategy *winner = e ? sim_strategy_copy(e) : NULL;
  /* Data parallelism, saving memory as the expert plans do when it does not fit. */
  SimStrategy *dp = search_problem_data_parallel(p, error);
  if (!dp) {
    g_clear_pointer(&winner, sim_strategy_free);
    return NULL;
  }
  double c = search_problem_simulate(p, dp, NULL, NULL);
  if (!isfinite(c) && p->memory_limit) {
    SimMemoryOptions base = sim_strategy_get_memory(dp);
    for (int k = 0; k < SEARCH_MEMORY_STEPS && !isfinite(c); k++) {
      SimMemoryOptions m = search_memory_step(base, k);
      sim_strategy_set_memory(dp, &m);
      c = search_problem_simulate(p, dp, NULL, NULL);
    }
  }
  if (c < best) {
    best = c;
    g_clear_pointer(&winner, sim_strategy_free);
    winner = dp;
  } else {
    sim_strategy_free(dp);
  }
  if (time)
    *time = best;
  return winner;
}

/* ---------------------------------------------------------------------------------- */
/* The algorithms                                                                     */

static gboolean data_parallel_run(const SearchAlgorithm *self, SearchContext *ctx,
                                  GError **error)
{
  g_autoptr(SimStrategy) s = search_problem_data_parallel(search_context_get_problem(ctx), error);
  if (!s)
    return FALSE;
  search_context_evaluate(ctx, s);
  return TRUE;
}

static gboolean expert_run(const SearchAlgorithm *self, SearchContext *ctx, GError **error)
{
  /* Every candidate is simulated (and recorded): the best is the search's result. */
  sim_strategy_free(search_start_expert(ctx, FALSE, NULL));
  return TRUE;
}

static gboolean megatron_run(const SearchAlgorithm *self, SearchContext *ctx, GError **error)
{
  /* The expert plans first (every one simulated and recorded, the yardstick), then the
   * winner's neighbourhood in Megatron's plan space. */
  SimMegatronOptions o;
  double cost = INFINITY;
  g_autoptr(SimStrategy) s = NULL;
  if (search_context_get_time_budget(ctx) > 0) {
    /* With a budget in seconds the plan of Megatron's space that the closed-form estimate
     * ranks first is simulated first (on a thousand GPUs one simulation can take most of
     * a minute), then the expert plans, the most promising first, get half of what is
     * left, so that the refinement has the rest; it starts from the faster of the two. */
    SimMegatronOptions eo;
    double ec = INFINITY;
    g_autoptr(SimStrategy) e = search_start_estimated(ctx, 3, &ec, &eo);
    SearchContext *in = search_context_new_share(ctx, 0.5);
    if (in)
      s = search_start_expert_stages(in, 0, &cost, NULL, &o);
    search_context_free_inner(in);
    if (e && ec <= cost) {
      g_clear_pointer(&s, sim_strategy_free);
      s = g_steal_pointer(&e);
      cost = ec;
      o = eo;
    }
  } else {
    s = search_start_expert_stages(ctx, 0, &cost, NULL, &o);
  }
  if (s)
    search_refine_megatron(ctx, &s, &cost, &o);
  return TRUE;
}

static gboolean owt_run(const SearchAlgorithm *self, SearchContext *ctx, GError **error)
{
  g_autoptr(SimStrategy) s = search_owt_strategy(search_context_get_problem(ctx), error);
  if (!s)
    return FALSE;
  search_context_evaluate(ctx, s);
  return TRUE;
}

const SearchAlgorithm search_algo_data_parallel = {
  .api_version = SEARCH_ALGORITHM_API_VERSION,
  .name = "data-parallel",
  .description = "every operator data parallel over every device (the baseline)",
  .run = data_parallel_run,
};

const SearchAlgorithm search_algo_expert = {
  .api_version = SEARCH_ALGORITHM_API_VERSION,
  .name = "expert",
  .description = "the fastest expert plan: Megatron-style (tensor parallel in a node, "
                 "pipeline across, data parallel for the rest) or one weird trick",
  .run = expert_run,
};

const SearchAlgorithm search_algo_megatron = {
  .api_version = SEARCH_ALGORITHM_API_VERSION,
  .name = "megatron",
  .description = "Megatron's plan space past its rules: the fastest expert plan, then a local "
                 "search over interleaved model chunks, sequence parallelism, micro-batch "
                 "size, recomputation, ZeRO-1, gradient buckets and the TP/PP/DP split",
  .run = megatron_run,
};

const SearchAlgorithm search_algo_owt = {
  .api_version = SEARCH_ALGORITHM_API_VERSION,
  .name = "owt",
  .description = "one weird trick: data parallel up to the first dense layer, model "
                 "parallel dense layers",
  .run = owt_run,
};
