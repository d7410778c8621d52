/* test-rules.c — the rules the simulator, the executor, the GPU operator library and the
 * search share (sim/shard.c): which tensors of a shard hold partial sums, and which ops
 * apply a nonlinear function in their epilogue.  Each was once derived in its user; the
 * copies of those derivations below are the reference the shared rule must reproduce on
 * every operator of every model of the zoo, at the model's default size. */
#include <criterion/criterion.h>
#include <string.h>

#include "parasol-sim.h"
#include "sim-private.h"

/* sim/lower.c: the tensor map of the tensor does not name the dimension. */
static gboolean lower_indexes(const SimGraph *g, int op, SimTensorRole role, int i, int d)
{
  const SimOp *o = sim_graph_op_get(g, op);
  const SimTensorMap *map = role == SIM_TENSOR_OUTPUT ? sim_space_output_map(o, i)
                                                      : sim_space_input_map(o, i);
  for (int k = 0; k < map->ndim; k++)
    if (map->map[k].dim == d || map->map[k].kdim == d)
      return TRUE;
  return FALSE;
}

/* exec/compile.c: restricting the range along the dimension changes the tensor's region. */
static gboolean exec_indexes(const SimGraph *g, int op, SimTensorRole role, int i, int d)
{
  int nd = sim_graph_op_n_dims(g, op);
  int64_t lo[SIM_MAX_ITER] = { 0 }, hi[SIM_MAX_ITER];
  for (int k = 0; k < nd; k++)
    hi[k] = sim_graph_op_dim_size(g, op, k);
  SimRegion full, part;
  sim_graph_op_shard_region(g, op, role, i, lo, hi, &full);
  hi[d] = 1;
  sim_graph_op_shard_region(g, op, role, i, lo, hi, &part);
  return !sim_region_equal(&full, &part);
}

/* Whether tensor @i of @role lies wholly at index 0 of dimension @d: shards past index 0
 * touch none of it. */
static gboolean only_at_zero(const SimGraph *g, int op, SimTensorRole role, int i, int d)
{
  int nd = sim_graph_op_n_dims(g, op);
  int64_t lo[SIM_MAX_ITER] = { 0 }, hi[SIM_MAX_ITER];
  for (int k = 0; k < nd; k++)
    hi[k] = sim_graph_op_dim_size(g, op, k);
  lo[d] = 1;
  SimRegion rest;
  sim_graph_op_shard_region(g, op, role, i, lo, hi, &rest);
  return sim_region_volume(&rest) == 0;
}

/* profile/cuda/desc.c: a split of a reduction dimension other than the first, or of
 * attention's heads, leaves the outputs partial sums. */
static gboolean desc_splits_reduction(const SimGraph *g, int op, int d)
{
  if (sim_graph_op_dim_role(g, op, d) == SIM_ROLE_REDUCTION && d != 0)
    return TRUE;
  return sim_graph_op_type(g, op) == SIM_OP_ATTENTION &&
         !strcmp(sim_graph_op_dim_name(g, op, d), "h");
}

/* search/configs.c: an "activation" other than identity. */
static gboolean configs_fused(const SimGraph *g, int op)
{
  g_autoptr(SimAttrs) a = sim_graph_op_attrs(g, op);
  int64_t act = SIM_UNARY_IDENTITY;
  return sim_attrs_get_int(a, "activation", &act) && act != SIM_UNARY_IDENTITY;
}

/* exec/compile.c: an "activation" other than identity and scale, or a fused relu. */
static gboolean exec_fused(const SimGraph *g, int op)
{
  g_autoptr(SimAttrs) a = sim_graph_op_attrs(g, op);
  int64_t act = SIM_UNARY_IDENTITY, relu = 0;
  sim_attrs_get_int(a, "activation", &act);
  sim_attrs_get_int(a, "relu", &relu);
  return (act != SIM_UNARY_IDENTITY && act != SIM_UNARY_SCALE) || relu;
}

static SimGraph *zoo_model(int m)
{
  g_autoptr(SimModelParams) p = sim_model_params_new();
  g_autoptr(GError) error = NULL;
  SimGraph *g = sim_zoo_build(sim_zoo_model_name(m), p, &error);
  cr_assert_not_null(g, "%s: %s", sim_zoo_model_name(m), error ? error->message : "");
  return g;
}

/* Degrees with dimension @d split in two and every other whole. */
static void split_one(int *degree, int d)
{
  for (int k = 0; k < SIM_MAX_ITER; k++)
    degree[k] = k == d ? 2 : 1;
}

Test(partial, matches_lowering_and_executor_on_the_zoo)
{
  int checked = 0, differ = 0;
  for (int m = 0; m < sim_zoo_n_models(); m++) {
    g_autoptr(SimGraph) g = zoo_model(m);
    for (int op = 0; op < sim_graph_n_ops(g); op++) {
      if (sim_graph_op_type(g, op) == SIM_OP_INPUT)
        continue;
      for (int d = 0; d < sim_graph_op_n_dims(g, op); d++) {
        int degree[SIM_MAX_ITER];
        split_one(degree, d);
        /* Strategies split only splittable dimensions of more than one index. */
        gboolean splittable = sim_graph_op_dim_splittable(g, op, d) &&
                              sim_graph_op_dim_size(g, op, d) > 1;
        for (int r = 0; r < 2; r++) {
          SimTensorRole role = r ? SIM_TENSOR_OUTPUT : SIM_TENSOR_INPUT;
          int n = r ? sim_graph_op_n_outputs(g, op) : sim_graph_op_n_inputs(g, op);
          for (int i = 0; i < n; i++) {
            gboolean got = sim_graph_op_tensor_partial(g, op, role, i, degree);
            cr_assert_eq(got, !lower_indexes(g, op, role, i, d),
                         "%s op '%s' %s %d dim %d: the lowering's rule differs",
                         sim_zoo_model_name(m), sim_graph_op_name(g, op),
                         r ? "output" : "input", i, d);
            cr_assert_eq(got, !sim_graph_op_dim_indexes(g, op, role, i, d));
            if (splittable && got != !exec_indexes(g, op, role, i, d)) {
              /* The executor's probe (a range of one index) could not tell a dimension
               * that does not index the tensor from one along which the whole tensor
               * lies at index 0, as the first input of a concatenation of width 1
               * does: only the shard holding index 0 touches that tensor, so it holds
               * no partial sum, as the shared rule says. */
              cr_assert_not(got, "%s op '%s' %s %d dim %d: the executor's rule differs",
                            sim_zoo_model_name(m), sim_graph_op_name(g, op),
                            r ? "output" : "input", i, d);
              cr_assert(only_at_zero(g, op, role, i, d));
              differ++;
            }
            checked++;
          }
        }
      }
    }
  }
  cr_assert_gt(checked, 1000, "only %d cases", checked);
  cr_assert_lt(differ, 10, "%d cases where the executor's probe differs", differ);
}

Test(partial, matches_gpu_descriptions_on_the_zoo)
{
  int checked = 0;
  for (int m = 0; m < sim_zoo_n_models(); m++) {
    g_autoptr(SimGraph) g = zoo_model(m);
    for (int op = 0; op < sim_graph_n_ops(g); op++) {
      /* The GPU operator library (gpu/) has no kernels for the LLaMA-style operators,
       * and its old rule never described them: a gated MLP split on its width 'f' sums
       * partial products in its down projection, as the shared rule says. */
      SimOpType type = sim_graph_op_type(g, op);
      if (type == SIM_OP_INPUT || type == SIM_OP_RMSNORM || type == SIM_OP_GATED_MLP ||
          type == SIM_OP_MOE)
        continue;
      for (int d = 0; d < sim_graph_op_n_dims(g, op); d++) {
        if (!sim_graph_op_dim_splittable(g, op, d) || sim_graph_op_dim_size(g, op, d) < 2)
          continue;
        int degree[SIM_MAX_ITER];
        split_one(degree, d);
        gboolean got = FALSE;
        for (int j = 0; j < sim_graph_op_n_outputs(g, op); j++)
          got = got || sim_graph_op_tensor_partial(g, op, SIM_TENSOR_OUTPUT, j, degree);
        cr_assert_eq(got, desc_splits_reduction(g, op, d),
                     "%s op '%s' (%s) dim %d '%s': the GPU descriptions' rule differs",
                     sim_zoo_model_name(m), sim_graph_op_name(g, op),
                     sim_op_type_name(sim_graph_op_type(g, op)), d,
                     sim_graph_op_dim_name(g, op, d));
        checked++;
      }
    }
  }
  cr_assert_gt(checked, 1000, "only %d cases", checked);
}

/* The search used its rule to keep reduction dimensions whole: the same dimensions must
 * stay whole.  The executor refused a partial output under its rule. */
Test(fused, matches_search_and_executor_on_the_zoo)
{
  int fused = 0;
  for (int m = 0; m < sim_zoo_n_models(); m++) {
    g_autoptr(SimGraph) g = zoo_model(m);
    for (int op = 0; op < sim_graph_n_ops(g); op++) {
      gboolean got = sim_graph_op_fused_nonlinear(g, op);
      for (int d = 0; d < sim_graph_op_n_dims(g, op); d++) {
        gboolean reduction = sim_graph_op_dim_role(g, op, d) == SIM_ROLE_REDUCTION;
        cr_assert_eq(got && reduction, configs_fused(g, op) && reduction,
                     "%s op '%s' dim %d: the search's rule differs", sim_zoo_model_name(m),
                     sim_graph_op_name(g, op), d);
      }
      cr_assert_eq(got, exec_fused(g, op), "%s op '%s': the executor's rule differs",
                   sim_zoo_model_name(m), sim_graph_op_name(g, op));
      fused += got;
    }
  }
  cr_assert_gt(fused, 0, "no zoo operator fuses a nonlinear function");
}

/* A linear layer y[b, n] = sum_k x[b, k] w[k, n]: a split of k leaves partial outputs, a
 * split of n partial input gradients, a split of b neither. */
Test(partial, linear_layer_by_hand)
{
  g_autoptr(SimGraph) g = sim_graph_new("one");
  int64_t dims[2] = { 8, 16 };
  int x = sim_graph_input(g, "x", SIM_DTYPE_FP32, 2, dims);
  sim_graph_linear(g, "fc", x, 4, TRUE, SIM_UNARY_GELU);
  sim_graph_linear(g, "plain", x, 4, FALSE, SIM_UNARY_IDENTITY);
  sim_graph_linear(g, "scaled", x, 4, FALSE, SIM_UNARY_SCALE);
  int op = sim_graph_op_by_name(g, "fc");
  cr_assert_geq(op, 0);
  const char *names[3] = { "b", "n", "k" };
  gboolean out_partial[3] = { FALSE, FALSE, TRUE };
  gboolean in_partial[3] = { FALSE, TRUE, FALSE };
  for (int k = 0; k < 3; k++) {
    int d = -1;
    for (int e = 0; e < sim_graph_op_n_dims(g, op); e++)
      if (!strcmp(sim_graph_op_dim_name(g, op, e), names[k]))
        d = e;
    cr_assert_geq(d, 0, "no dimension %s", names[k]);
    int degree[SIM_MAX_ITER];
    split_one(degree, d);
    cr_assert_eq(sim_graph_op_tensor_partial(g, op, SIM_TENSOR_OUTPUT, 0, degree),
                 out_partial[k], "output, split of %s", names[k]);
    cr_assert_eq(sim_graph_op_tensor_partial(g, op, SIM_TENSOR_INPUT, 0, degree),
                 in_partial[k], "input, split of %s", names[k]);
  }
  int whole[SIM_MAX_ITER];
  split_one(whole, -1);
  cr_assert_not(sim_graph_op_tensor_partial(g, op, SIM_TENSOR_OUTPUT, 0, whole));
  cr_assert_not(sim_graph_op_tensor_partial(g, op, SIM_TENSOR_OUTPUT, 1, whole),
                "an output the op does not have");
  cr_assert(sim_graph_op_fused_nonlinear(g, op));
  cr_assert_not(sim_graph_op_fused_nonlinear(g, sim_graph_op_by_name(g, "plain")));
  cr_assert_not(sim_graph_op_fused_nonlinear(g, sim_graph_op_by_name(g, "scaled")),
                "a scale is linear: partial sums go through it");
}
