/* test-strategy.c — strategies: lifecycle, per-operator configurations, shard ranges,
 * validation, the JSON format and its errors, and the data-parallel and Megatron builders.
 *
 * About 1,200 lines: one program per module (tests/meson.build); the file format's
 * errors and the builders share the fixtures below. */
#include <criterion/criterion.h>
#include <glib/gstdio.h>
#include <string.h>

#include "sim-private.h"

/* ---------------------------------------------------------------------------------- */
/* Fixtures                                                                           */

/* A small classifier: x[8, 64] -> fc1 (256, relu) -> fc2 (16) -> loss with labels[8]. */
static SimGraph *tiny_graph(int64_t batch)
{
  SimGraph *g = sim_graph_new("tiny");
  int64_t xd[] = { batch, 64 };
  int x = sim_graph_input(g, "x", SIM_DTYPE_FP32, 2, xd);
  int h = sim_graph_linear(g, "fc1", x, 256, TRUE, SIM_UNARY_RELU);
  int y = sim_graph_linear(g, "fc2", h, 16, TRUE, SIM_UNARY_IDENTITY);
  int64_t ld[] = { batch };
  int labels = sim_graph_input(g, "labels", SIM_DTYPE_INT32, 1, ld);
  sim_graph_cross_entropy(g, "loss", y, labels);
  GError *error = NULL;
  cr_assert(sim_graph_check(g, &error), "tiny graph: %s", error ? error->message : "");
  return g;
}

static SimMachine *machine(const char *name)
{
  GError *error = NULL;
  SimMachine *m = sim_machine_load(name, &error);
  cr_assert_not_null(m, "machine %s: %s", name, error ? error->message : "");
  return m;
}

static SimGraph *zoo(const char *name, const char *params)
{
  g_autoptr(SimModelParams) p = sim_model_params_new();
  GError *error = NULL;
  cr_assert(sim_model_params_parse(p, params, &error), "%s", error ? error->message : "");
  SimGraph *g = sim_zoo_build(name, p, &error);
  cr_assert_not_null(g, "%s: %s", name, error ? error->message : "");
  return g;
}

static int op_id(const SimGraph *g, const char *name)
{
  int op = sim_graph_op_by_name(g, name);
  cr_assert_geq(op, 0, "no op %s", name);
  return op;
}

static int dim_named(const SimGraph *g, int op, const char *name)
{
  for (int d = 0; d < sim_graph_op_n_dims(g, op); d++)
    if (strcmp(sim_graph_op_dim_name(g, op, d), name) == 0)
      return d;
  cr_assert_fail("op %s has no dimension %s", sim_graph_op_name(g, op), name);
  return -1;
}

static int dim_with_role(const SimGraph *g, int op, SimDimRole role)
{
  for (int d = 0; d < sim_graph_op_n_dims(g, op); d++)
    if (sim_graph_op_dim_role(g, op, d) == role)
      return d;
  return -1;
}

/* The degree of @op on its dimension @name. */
static int degree_on(const SimStrategy *s, const SimGraph *g, const char *op, const char *name)
{
  int o = op_id(g, op);
  return sim_strategy_op_degrees(s, o)[dim_named(g, o, name)];
}

/* Degrees of 1 everywhere except @d, which gets @k. */
static void degrees_one(int *deg, int d, int k)
{
  for (int i = 0; i < SIM_MAX_ITER; i++)
    deg[i] = 1;
  if (d >= 0)
    deg[d] = k;
}

#define assert_error(err, code_, text)                                                  \
  do {                                                                                  \
    cr_assert_not_null((err), "expected an error containing \"%s\"", (text));           \
    cr_assert_eq((err)->code, (code_), "code %d, message: %s", (err)->code,            \
                 (err)->message);                                                       \
    cr_assert(strstr((err)->message, (text)) != NULL, "\"%s\" not in \"%s\"", (text),   \
              (err)->message);                                                          \
  } while (0)

/* ---------------------------------------------------------------------------------- */
/* Lifecycle                                                                          */

Test(strategy, new_has_the_documented_defaults)
{
  g_autoptr(SimGraph) g = tiny_graph(8);
  g_autoptr(SimMachine) m = machine("dgx-a100");
  g_autoptr(SimStrategy) s = sim_strategy_new(g, m);

  for (int op = 0; op < sim_graph_n_ops(g); op++) {
    int n = 0;
    const int *dev = sim_strategy_op_devices(s, op, &n);
    cr_assert_eq(n, 1);
    cr_assert_eq(dev[0], 0);
    cr_assert_eq(sim_strategy_op_n_shards(s, op), 1);
    for (int d = 0; d < SIM_MAX_ITER; d++)
      cr_assert_eq(sim_strategy_op_degrees(s, op)[d], 1);
    cr_assert_eq(sim_strategy_op_stage(s, op), 0);
  }
  cr_assert_eq(sim_strategy_n_stages(s), 1);
  cr_assert_eq(s->stage_n_devices[0], 1);
  cr_assert_eq(s->stage_devices[0][0], 0);
  cr_assert_eq(sim_strategy_get_microbatches(s), 1);
  int chunks = 0;
  cr_assert_eq(sim_strategy_get_schedule(s, &chunks), SIM_SCHEDULE_1F1B);
  cr_assert_eq(chunks, 1);
  SimSyncOptions sync = sim_strategy_get_sync(s);
  cr_assert_eq(sync.algorithm, SIM_ALLREDUCE_RING);
  cr_assert_eq(sync.bucket_bytes, 0);
  cr_assert(sync.overlap);
  SimMemoryOptions mem = sim_strategy_get_memory(s);
  cr_assert_eq(mem.recompute, SIM_RECOMPUTE_NONE);
  cr_assert_not(mem.zero1);
  cr_assert_eq(mem.precision, SIM_PRECISION_FP32);
  cr_assert_eq(mem.optimizer, SIM_OPTIMIZER_ADAM);
  cr_assert_not(sim_strategy_get_sequence_parallel(s));

  GError *error = NULL;
  cr_assert(sim_strategy_validate(s, g, m, &error), "%s", error ? error->message : "");
}

Test(strategy, copy_is_deep_and_equal)
{
  g_autoptr(SimGraph) g = tiny_graph(8);
  g_autoptr(SimMachine) m = machine("dgx-a100");
  g_autoptr(SimStrategy) s = sim_strategy_new(g, m);
  sim_strategy_add_rewrite(s, "fuse-bias");
  g_autoptr(SimStrategy) c = sim_strategy_copy(s);
  cr_assert(sim_strategy_equal(s, c));

  int fc1 = op_id(g, "fc1");
  int deg[SIM_MAX_ITER];
  degrees_one(deg, dim_named(g, fc1, "n"), 4);
  int dev[] = { 0, 1, 2, 3 };
  cr_assert(sim_strategy_set_op(c, fc1, deg, dev, NULL));
  cr_assert_not(sim_strategy_equal(s, c));
  cr_assert_eq(sim_strategy_op_n_shards(s, fc1), 1, "the original is untouched");

  g_autoptr(SimStrategy) d = sim_strategy_copy(s);
  sim_strategy_set_microbatches(d, 2);
  cr_assert_not(sim_strategy_equal(s, d));
  g_autoptr(SimStrategy) e = sim_strategy_copy(s);
  sim_strategy_clear_rewrites(e);
  cr_assert_not(sim_strategy_equal(s, e));
}

Test(strategy, enum_names)
{
  cr_assert_str_eq(sim_schedule_name(SIM_SCHEDULE_INTERLEAVED), "interleaved");
  cr_assert_str_eq(sim_allreduce_algo_name(SIM_ALLREDUCE_HIERARCHICAL), "hierarchical");
  cr_assert_str_eq(sim_recompute_name(SIM_RECOMPUTE_SELECTIVE), "selective");
  cr_assert_str_eq(sim_precision_name(SIM_PRECISION_MIXED_BF16), "mixed-bf16");
  cr_assert_eq(sim_schedule_from_name("1F1B"), SIM_SCHEDULE_1F1B);
  cr_assert_eq(sim_precision_from_name("fp64"), -1);
}

/* ---------------------------------------------------------------------------------- */
/* Per-operator configurations                                                        */

Test(strategy, set_op_accepts_a_valid_configuration)
{
  g_autoptr(SimGraph) g = tiny_graph(8);
  g_autoptr(SimMachine) m = machine("dgx-a100");
  g_autoptr(SimStrategy) s = sim_strategy_new(g, m);
  int fc1 = op_id(g, "fc1");
  int deg[SIM_MAX_ITER];
  degrees_one(deg, dim_named(g, fc1, "b"), 2);
  deg[dim_named(g, fc1, "n")] = 4;
  /* Two shards may share a device: shards 6 and 7 both run on device 0. */
  int dev[] = { 0, 1, 2, 3, 4, 5, 0, 0 };
  GError *error = NULL;
  cr_assert(sim_strategy_set_op(s, fc1, deg, dev, &error), "%s", error ? error->message : "");
  cr_assert_eq(sim_strategy_op_n_shards(s, fc1), 8);
  int n = 0;
  const int *got = sim_strategy_op_devices(s, fc1, &n);
  cr_assert_eq(n, 8);
  cr_assert_arr_eq(got, dev, sizeof dev);
}

Test(strategy, set_op_rejects_bad_configurations)
{
  g_autoptr(SimGraph) g = tiny_graph(8);
  g_autoptr(SimMachine) m = machine("dgx-a100");
  g_autoptr(SimStrategy) s = sim_strategy_new(g, m);
  int fc1 = op_id(g, "fc1");
  int n_dim = dim_named(g, fc1, "n");
  int deg[SIM_MAX_ITER];
  int dev[8] = { 0, 1, 2, 3, 4, 5, 6, 7 };
  GError *error = NULL;

  /* 256 outputs do not split 3 ways. */
  degrees_one(deg, n_dim, 3);
  cr_assert_not(sim_strategy_set_op(s, fc1, deg, dev, &error));
  assert_error(error, SIM_ERROR_INVALID,
               "op 'fc1' (linear): degree 3 on dimension 'n' does not divide its size 256");
  g_clear_error(&error);

  degrees_one(deg, n_dim, 0);
  cr_assert_not(sim_strategy_set_op(s, fc1, deg, dev, &error));
  assert_error(error, SIM_ERROR_INVALID, "degree 0 on dimension 'n' is not positive");
  g_clear_error(&error);

  /* Device 8 does not exist on an 8-GPU machine. */
  degrees_one(deg, n_dim, 2);
  int bad[] = { 0, 8 };
  cr_assert_not(sim_strategy_set_op(s, fc1, deg, bad, &error));
  assert_error(error, SIM_ERROR_INVALID, "shard 1 on device 8");
  g_clear_error(&error);

  /* Nothing changed after the failures. */
  cr_assert_eq(sim_strategy_op_n_shards(s, fc1), 1);
}

Test(strategy, replicated_shards)
{
  g_autoptr(SimGraph) g = tiny_graph(8);
  g_autoptr(SimMachine) m = machine("dgx-a100");
  g_autoptr(SimStrategy) s = sim_strategy_new(g, m);
  int fc1 = op_id(g, "fc1");
  int deg[SIM_MAX_ITER];
  degrees_one(deg, 0, 2);
  GError *error = NULL;
  /* Two data-parallel shards, each computed by 3 copies: 6 devices, the copies of shard 0
   * first. */
  int dev[] = { 0, 1, 2, 4, 5, 6 };
  cr_assert(sim_strategy_set_op_replicated(s, fc1, deg, 3, dev, &error), "%s",
            error ? error->message : "");
  cr_assert_eq(sim_strategy_op_n_shards(s, fc1), 6);
  cr_assert_eq(sim_strategy_op_replicas(s, fc1), 3);

  /* Copies of one shard on one device would compute it twice there. */
  int twice[] = { 0, 1, 0, 4, 5, 6 };
  cr_assert_not(sim_strategy_set_op_replicated(s, fc1, deg, 3, twice, &error));
  assert_error(error, SIM_ERROR_INVALID, "copies 0 and 2 of shard 0 are both on device 0");
  g_clear_error(&error);
  cr_assert_not(sim_strategy_set_op_replicated(s, fc1, deg, 0, dev, &error));
  assert_error(error, SIM_ERROR_INVALID, "0 replicas");
  g_clear_error(&error);

  /* The public setter means one copy again. */
  cr_assert(sim_strategy_set_op(s, fc1, deg, dev, NULL));
  cr_assert_eq(sim_strategy_op_replicas(s, fc1), 1);
  cr_assert_eq(sim_strategy_op_n_shards(s, fc1), 2);
}

Test(strategy, set_op_rejects_splitting_an_unsplittable_dimension)
{
  /* An LSTM's time steps depend on each other: its sequence dimension cannot be split. */
  g_autoptr(SimGraph) g = sim_graph_new("rnn");
  int64_t xd[] = { 8, 16, 32 };
  int x = sim_graph_input(g, "x", SIM_DTYPE_FP32, 3, xd);
  sim_graph_lstm(g, "lstm", x, 64);
  cr_assert(sim_graph_check(g, NULL));
  g_autoptr(SimMachine) m = machine("dgx-a100");
  g_autoptr(SimStrategy) s = sim_strategy_new(g, m);
  int op = op_id(g, "lstm");
  int d = -1;
  for (int k = 0; k < sim_graph_op_n_dims(g, op); k++)
    if (!sim_graph_op_dim_splittable(g, op, k))
      d = k;
  cr_assert_geq(d, 0, "the LSTM has a dimension that cannot be split");
  int deg[SIM_MAX_ITER];
  degrees_one(deg, d, 2);
  int dev[] = { 0, 1 };
  GError *error = NULL;
  cr_assert_not(sim_strategy_set_op(s, op, deg, dev, &error));
  g_autofree char *want = g_strdup_printf("degree 2 on dimension '%s', which cannot be split",
                                          sim_graph_op_dim_name(g, op, d));
  assert_error(error, SIM_ERROR_INVALID, want);
  g_clear_error(&error);
}

Test(strategy, shard_coordinates_are_row_major)
{
  /* Degrees (2, 1, 4) over dimensions (b, ., n): shard 5 = 1 * 4 + 1 has coordinates
   * (1, 0, 1); shard 6 has (1, 0, 2). */
  SimOpConfig c = { .degree = { 2, 1, 4, 1, 1, 1, 1, 1 }, .n_shards = 8 };
  int coords[3];
  sim_config_shard_coords(&c, 3, 5, coords);
  cr_assert_eq(coords[0], 1);
  cr_assert_eq(coords[1], 0);
  cr_assert_eq(coords[2], 1);
  sim_config_shard_coords(&c, 3, 6, coords);
  cr_assert_eq(coords[2], 2);
}

Test(strategy, shard_range_is_within_one_microbatch)
{
  g_autoptr(SimGraph) g = tiny_graph(8);
  int fc1 = op_id(g, "fc1");
  const SimOp *op = sim_graph_op_get(g, fc1);
  int b = dim_named(g, fc1, "b"), n = dim_named(g, fc1, "n");
  SimOpConfig c = { .n_shards = 8 };
  for (int d = 0; d < SIM_MAX_ITER; d++)
    c.degree[d] = 1;
  c.degree[b] = 2;
  c.degree[n] = 4;
  int coords[SIM_MAX_ITER] = { 0 };
  coords[b] = 1;
  coords[n] = 3;
  int64_t lo[SIM_MAX_ITER], hi[SIM_MAX_ITER];
  /* 8 samples in 2 micro-batches are 4 per micro-batch; degree 2 gives shard b=1 the
   * samples [2, 4) of its micro-batch.  256 outputs over 4: shard n=3 covers [192, 256). */
  sim_config_shard_range(op, &c, coords, 2, lo, hi);
  cr_assert_eq(lo[b], 2);
  cr_assert_eq(hi[b], 4);
  cr_assert_eq(lo[n], 192);
  cr_assert_eq(hi[n], 256);
  int k = dim_named(g, fc1, "k");
  cr_assert_eq(lo[k], 0);
  cr_assert_eq(hi[k], 64);
}

/* ---------------------------------------------------------------------------------- */
/* Validation                                                                         */

Test(strategy, validate_checks_microbatches)
{
  g_autoptr(SimGraph) g = tiny_graph(8);
  g_autoptr(SimMachine) m = machine("dgx-a100");
  g_autoptr(SimStrategy) s = sim_strategy_new(g, m);
  GError *error = NULL;

  sim_strategy_set_microbatches(s, 3);
  cr_assert_not(sim_strategy_validate(s, g, m, &error));
  assert_error(error, SIM_ERROR_INVALID, "the batch of 8 samples does not split into 3");
  g_clear_error(&error);

  /* Degree 4 on the batch is fine for the whole batch (8) but not per micro-batch: 4
   * micro-batches hold 2 samples each. */
  int fc1 = op_id(g, "fc1");
  int deg[SIM_MAX_ITER];
  degrees_one(deg, 0, 4);
  int dev[] = { 0, 1, 2, 3 };
  cr_assert(sim_strategy_set_op(s, fc1, deg, dev, NULL));
  int zero_to_three[] = { 0, 1, 2, 3 };
  int stage[8] = { 0 };
  const int *groups[] = { zero_to_three };
  int n_group = 4;
  cr_assert(sim_strategy_set_stages(s, 1, stage, groups, &n_group, NULL));
  sim_strategy_set_microbatches(s, 4);
  cr_assert_not(sim_strategy_validate(s, g, m, &error));
  assert_error(error, SIM_ERROR_INVALID,
               "op 'fc1' (linear): degree 4 on dimension 'b' does not divide its size 2 per "
               "micro-batch");
  g_clear_error(&error);
  sim_strategy_set_microbatches(s, 2);
  cr_assert(sim_strategy_validate(s, g, m, &error), "%s", error ? error->message : "");
}

Test(strategy, validate_checks_devices_against_the_machine)
{
  g_autoptr(SimGraph) g = tiny_graph(8);
  g_autoptr(SimMachine) big = machine("dgx-a100:2");
  g_autoptr(SimMachine) small = machine("dgx-a100");
  g_autoptr(SimStrategy) s = sim_strategy_new(g, big);
  int fc1 = op_id(g, "fc1");
  int deg[SIM_MAX_ITER];
  degrees_one(deg, 0, 2);
  int dev[] = { 0, 12 };
  cr_assert(sim_strategy_set_op(s, fc1, deg, dev, NULL));
  int group[] = { 0, 12 };
  const int *groups[] = { group };
  int n = 2;
  int stage[8] = { 0 };
  cr_assert(sim_strategy_set_stages(s, 1, stage, groups, &n, NULL));
  cr_assert(sim_strategy_validate(s, g, big, NULL));
  GError *error = NULL;
  cr_assert_not(sim_strategy_validate(s, g, small, &error));
  assert_error(error, SIM_ERROR_INVALID, "device 12");
  g_clear_error(&error);
}

Test(strategy, validate_checks_stages)
{
  g_autoptr(SimGraph) g = tiny_graph(8);
  g_autoptr(SimMachine) m = machine("dgx-a100");
  int n_ops = sim_graph_n_ops(g);
  int x = op_id(g, "x"), fc1 = op_id(g, "fc1"), fc2 = op_id(g, "fc2");
  int labels = op_id(g, "labels"), loss = op_id(g, "loss");
  int g0[] = { 0 }, g1[] = { 1 };
  const int *groups[] = { g0, g1 };
  int sizes[] = { 1, 1 };
  GError *error = NULL;

  /* Two stages: x and fc1 on device 0, the rest on device 1. */
  g_autoptr(SimStrategy) s = sim_strategy_new(g, m);
  int stage[8] = { 0 };
  stage[x] = stage[fc1] = 0;
  stage[fc2] = stage[labels] = stage[loss] = 1;
  cr_assert(sim_strategy_set_stages(s, 2, stage, groups, sizes, NULL));
  /* Every op still runs on device 0, outside stage 1's group {1}. */
  cr_assert_not(sim_strategy_validate(s, g, m, &error));
  assert_error(error, SIM_ERROR_INVALID, "not in the device group of its stage 1");
  g_clear_error(&error);
  int deg[SIM_MAX_ITER];
  degrees_one(deg, -1, 1);
  int one[] = { 1 };
  for (int op = 0; op < n_ops; op++)
    if (stage[op] == 1)
      cr_assert(sim_strategy_set_op(s, op, deg, one, NULL));
  cr_assert(sim_strategy_validate(s, g, m, &error), "%s", error ? error->message : "");

  /* A change to one operator is checked alone: fc2 (stage 1) moved to device 0, which is
   * stage 0's, is refused as the whole strategy's check refuses it; moved back, it passes. */
  g_autoptr(SimStrategy) moved = sim_strategy_copy(s);
  cr_assert(sim_strategy_set_op(moved, fc2, deg, g0, NULL));
  cr_assert_not(sim_strategy_validate_op(moved, g, m, fc2, &error));
  assert_error(error, SIM_ERROR_INVALID,
               "op 'fc2' (linear): shard 0 on device 0, which is not in the device group of "
               "its stage 1");
  g_clear_error(&error);
  cr_assert_not(sim_strategy_validate(moved, g, m, &error));
  assert_error(error, SIM_ERROR_INVALID, "not in the device group of its stage 1");
  g_clear_error(&error);
  cr_assert(sim_strategy_set_op(moved, fc2, deg, one, NULL));
  cr_assert(sim_strategy_validate_op(moved, g, m, fc2, &error), "%s",
            error ? error->message : "");

  /* fc1 in stage 1 feeding fc2 in stage 0 sends activations backwards through the
   * pipeline. */
  g_autoptr(SimStrategy) back = sim_strategy_copy(s);
  int rev[8];
  memcpy(rev, stage, sizeof rev);
  rev[fc1] = 1;
  rev[fc2] = 0;
  cr_assert(sim_strategy_set_op(back, fc1, deg, one, NULL));
  cr_assert(sim_strategy_set_op(back, fc2, deg, g0, NULL));
  cr_assert(sim_strategy_set_stages(back, 2, rev, groups, sizes, NULL));
  cr_assert_not(sim_strategy_validate(back, g, m, &error));
  assert_error(error, SIM_ERROR_INVALID, "consumes the output of op 'fc1' in the later stage 1");
  g_clear_error(&error);

  /* A stage without operators. */
  g_autoptr(SimStrategy) empty = sim_strategy_new(g, m);
  int all0[8] = { 0 };
  int g2[] = { 2 };
  const int *groups3[] = { g0, g1, g2 };
  int sizes3[] = { 1, 1, 1 };
  cr_assert(sim_strategy_set_stages(empty, 3, all0, groups3, sizes3, NULL));
  cr_assert_not(sim_strategy_validate(empty, g, m, &error));
  assert_error(error, SIM_ERROR_INVALID, "stage 1 has no operators");
  g_clear_error(&error);

  /* 1F1B with two stages sharing device 0. */
  g_autoptr(SimStrategy) shared = sim_strategy_new(g, m);
  const int *same[] = { g0, g0 };
  cr_assert(sim_strategy_set_stages(shared, 2, stage, same, sizes, NULL));
  cr_assert_not(sim_strategy_validate(shared, g, m, &error));
  assert_error(error, SIM_ERROR_INVALID, "stages 0 and 1 share device 0");
  g_clear_error(&error);

  /* The same layout is the interleaved schedule with 2 chunks on one device group. */
  sim_strategy_set_schedule(shared, SIM_SCHEDULE_INTERLEAVED, 2);
  cr_assert(sim_strategy_validate(shared, g, m, &error), "%s", error ? error->message : "");
  /* ... but not with chunks that do not divide the stages. */
  sim_strategy_set_schedule(shared, SIM_SCHEDULE_INTERLEAVED, 3);
  cr_assert_not(sim_strategy_validate(shared, g, m, &error));
  assert_error(error, SIM_ERROR_INVALID, "multiple of the 3 model chunks");
  g_clear_error(&error);
  /* Interleaved with 2 chunks over 2 stages on different groups: stage 1 must run on
   * the group of stage 1 % (2 / 2) = 0. */
  sim_strategy_set_schedule(s, SIM_SCHEDULE_INTERLEAVED, 2);
  cr_assert_not(sim_strategy_validate(s, g, m, &error));
  assert_error(error, SIM_ERROR_INVALID, "stage 1 must run on the devices of stage 0");
  g_clear_error(&error);

  /* set_stages itself rejects what no strategy can hold. */
  int out_of_range[8] = { 0 };
  out_of_range[loss] = 2;
  cr_assert_not(sim_strategy_set_stages(s, 2, out_of_range, groups, sizes, &error));
  assert_error(error, SIM_ERROR_INVALID, "op 'loss' is in stage 2");
  g_clear_error(&error);
  int nine[] = { 9 };
  const int *bad_groups[] = { g0, nine };
  cr_assert_not(sim_strategy_set_stages(s, 2, stage, bad_groups, sizes, &error));
  assert_error(error, SIM_ERROR_INVALID, "stage 1: device 9");
  g_clear_error(&error);
}

/* ---------------------------------------------------------------------------------- */
/* JSON                                                                               */

static void assert_round_trip(const SimStrategy *s, const SimGraph *g, const SimMachine *m)
{
  g_autofree char *a = sim_strategy_to_json(s, g);
  GError *error = NULL;
  g_autoptr(SimStrategy) r = sim_strategy_from_json(a, "a.json", g, m, &error);
  cr_assert_not_null(r, "%s\n%s", error ? error->message : "", a);
  cr_assert(sim_strategy_equal(s, r), "strategies differ after a round trip:\n%s", a);
  g_autofree char *b = sim_strategy_to_json(r, g);
  cr_assert_str_eq(a, b);
}

Test(strategy_json, round_trips)
{
  g_autoptr(SimGraph) g = tiny_graph(8);
  g_autoptr(SimMachine) m = machine("dgx-a100");

  g_autoptr(SimStrategy) s = sim_strategy_new(g, m);
  assert_round_trip(s, g, m);

  g_autoptr(SimStrategy) dp = sim_strategy_data_parallel(g, m, 8, NULL);
  cr_assert_not_null(dp);
  /* Options off their defaults, and a bucket size that is not whole mebibytes. */
  sim_strategy_set_microbatches(dp, 1);
  SimSyncOptions sync = { SIM_ALLREDUCE_HIERARCHICAL, 1000, FALSE };
  sim_strategy_set_sync(dp, &sync);
  SimMemoryOptions mem = { SIM_RECOMPUTE_FULL, TRUE, SIM_PRECISION_MIXED_BF16,
                           SIM_OPTIMIZER_SGD };
  sim_strategy_set_memory(dp, &mem);
  sim_strategy_set_sequence_parallel(dp, TRUE);
  sim_strategy_add_rewrite(dp, "fuse-linear-relu");
  sim_strategy_add_rewrite(dp, "merge \"quoted\"");
  assert_round_trip(dp, g, m);
  /* ZeRO-2 ("zero": 2) implies ZeRO-1's sharding and survives the round trip. */
  mem.zero1 = FALSE;
  mem.zero2 = TRUE;
  sim_strategy_set_memory(dp, &mem);
  cr_assert(sim_strategy_get_memory(dp).zero1);
  assert_round_trip(dp, g, m);
  /* ZeRO-3 ("zero": 3) implies ZeRO-2's and ZeRO-1's and survives it too. */
  mem.zero2 = FALSE;
  mem.zero3 = TRUE;
  sim_strategy_set_memory(dp, &mem);
  cr_assert(sim_strategy_get_memory(dp).zero1 && sim_strategy_get_memory(dp).zero2);
  assert_round_trip(dp, g, m);
  /* The optimizer offloaded, in part ("offload_optimizer": 0.25) and whole (true). */
  mem.offload = 0.25;
  sim_strategy_set_memory(dp, &mem);
  assert_round_trip(dp, g, m);
  g_autofree char *quarter = sim_strategy_to_json(dp, g);
  cr_assert(strstr(quarter, "\"offload_optimizer\": 0.25"), "%s", quarter);
  mem.offload = 1;
  sim_strategy_set_memory(dp, &mem);
  assert_round_trip(dp, g, m);
  g_autofree char *whole = sim_strategy_to_json(dp, g);
  cr_assert(strstr(whole, "\"offload_optimizer\": true"), "%s", whole);
  cr_assert_null(strstr(whole, "offload_overlap"), "%s", whole);
  /* Its gradients copied during the backward ("offload_overlap": true). */
  mem.offload_overlap = TRUE;
  sim_strategy_set_memory(dp, &mem);
  assert_round_trip(dp, g, m);
  g_autofree char *overlapped = sim_strategy_to_json(dp, g);
  cr_assert(strstr(overlapped, "\"offload_overlap\": true"), "%s", overlapped);
  mem.offload = 0;
  sim_strategy_set_memory(dp, &mem);
  g_autofree char *none = sim_strategy_to_json(dp, g);
  cr_assert_null(strstr(none, "offload_optimizer"), "%s", none);

  /* Uneven device lists and two pipeline stages. */
  g_autoptr(SimStrategy) pipe = sim_strategy_new(g, m);
  int stage[8] = { 0 };
  stage[op_id(g, "fc2")] = stage[op_id(g, "labels")] = stage[op_id(g, "loss")] = 1;
  int g0[] = { 0, 3 }, g1[] = { 5, 6 };
  const int *groups[] = { g0, g1 };
  int sizes[] = { 2, 2 };
  cr_assert(sim_strategy_set_stages(pipe, 2, stage, groups, sizes, NULL));
  int deg[SIM_MAX_ITER];
  int fc1 = op_id(g, "fc1");
  degrees_one(deg, dim_named(g, fc1, "n"), 2);
  cr_assert(sim_strategy_set_op(pipe, fc1, deg, g0, NULL));
  degrees_one(deg, -1, 1);
  for (int op = 0; op < sim_graph_n_ops(g); op++)
    if (stage[op] == 1)
      cr_assert(sim_strategy_set_op(pipe, op, deg, g1, NULL));
  sim_strategy_set_microbatches(pipe, 4);
  sim_strategy_set_schedule(pipe, SIM_SCHEDULE_GPIPE, 1);
  cr_assert(sim_strategy_validate(pipe, g, m, NULL));
  assert_round_trip(pipe, g, m);
}

Test(strategy_json, round_trips_megatron)
{
  g_autoptr(SimGraph) g = zoo("gpt", "layers=4,hidden=256,heads=8,seq=64,vocab=1000,batch=16");
  g_autoptr(SimMachine) m = machine("dgx-a100");
  SimMegatronOptions o = sim_megatron_options_default();
  o.dp = 2;
  o.tp = 2;
  o.pp = 2;
  o.schedule = SIM_SCHEDULE_INTERLEAVED;
  o.chunks = 2;
  GError *error = NULL;
  g_autoptr(SimStrategy) s = sim_strategy_megatron(g, m, &o, &error);
  cr_assert_not_null(s, "%s", error ? error->message : "");
  assert_round_trip(s, g, m);
  /* Pipeline messages scatter-gathered: written, read back, and not equal to whole ones. */
  o.scatter_gather = TRUE;
  g_autoptr(SimStrategy) sg = sim_strategy_megatron(g, m, &o, &error);
  cr_assert_not_null(sg, "%s", error ? error->message : "");
  cr_assert(sim_strategy_get_scatter_gather(sg));
  g_autofree char *text = sim_strategy_to_json(sg, g);
  cr_assert(strstr(text, "\"pipeline_scatter_gather\": true"), "%s", text);
  assert_round_trip(sg, g, m);
  cr_assert_not(sim_strategy_equal(s, sg));
  /* Tensor-parallel overlap under sequence parallelism: the same. */
  o.scatter_gather = FALSE;
  o.sequence_parallel = TRUE;
  g_autoptr(SimStrategy) sp = sim_strategy_megatron(g, m, &o, &error);
  o.tp_comm_overlap = TRUE;
  g_autoptr(SimStrategy) ov = sim_strategy_megatron(g, m, &o, &error);
  cr_assert(sp && ov);
  cr_assert_not(sim_strategy_get_tp_comm_overlap(sp));
  cr_assert(sim_strategy_get_tp_comm_overlap(ov));
  g_autofree char *ovt = sim_strategy_to_json(ov, g);
  cr_assert(strstr(ovt, "\"tp_comm_overlap\": true"), "%s", ovt);
  cr_assert_null(strstr(ovt, "tp_overlap\""), "the default parameters are not written: %s", ovt);
  assert_round_trip(ov, g, m);
  cr_assert_not(sim_strategy_equal(sp, ov));
  /* The overlap's parameters (SimTpOverlap) default to NeMo's 24 and 16 SMs, chunks the
   * tensor-parallel degree; set, they are written, read back and tell plans apart. */
  SimTpOverlap d = sim_strategy_get_tp_overlap(ov);
  cr_assert(d.chunks == 0 && d.sms_attention == 24 && d.sms_other == 16);
  o.tp_overlap = (SimTpOverlap){ .chunks = 4, .sms_attention = 20, .sms_other = 8 };
  g_autoptr(SimStrategy) set = sim_strategy_megatron(g, m, &o, &error);
  cr_assert_not_null(set);
  g_autofree char *st = sim_strategy_to_json(set, g);
  cr_assert(strstr(st, "\"tp_overlap\": {\"chunks\": 4, \"sms_attention\": 20, "
                       "\"sms_other\": 8}"), "%s", st);
  assert_round_trip(set, g, m);
  cr_assert_not(sim_strategy_equal(set, ov));
  o.tp_overlap.sms_other = -1;
  cr_assert_null(sim_strategy_megatron(g, m, &o, &error));
  cr_assert(error && strstr(error->message, "none may be negative"), "%s",
            error ? error->message : "");
  g_clear_error(&error);
}

/* Context parallelism in Megatron's order (tp, cp, dp, pp): with tp 2, cp 2, dp 2 a
 * stage's ranks are 8 consecutive devices, replica r's on 4 r .. 4 r + 3; the attention
 * shard of positions chunk c and heads t sits on 4 r + 2 c + t, a sequence-parallel
 * norm's chunk k (chunk k / 2 of the context split, part k % 2 of it) on 4 r + k.  The
 * degree is written ("context_parallel": 2), read back, and makes another strategy. */
Test(strategy_json, context_parallel_places_position_chunks_between_tensor_and_data_ranks)
{
  g_autoptr(SimGraph) g = zoo("llama", "layers=2,hidden=256,heads=4,kv_heads=2,ffn=512,seq=64,"
                                       "vocab=512,batch=8");
  g_autoptr(SimMachine) m = machine("dgx-a100");
  SimMegatronOptions o = sim_megatron_options_default();
  o.dp = 2;
  o.tp = 2;
  o.cp = 2;
  o.microbatch_size = 1;
  o.sequence_parallel = TRUE;
  GError *error = NULL;
  g_autoptr(SimStrategy) s = sim_strategy_megatron(g, m, &o, &error);
  cr_assert_not_null(s, "%s", error ? error->message : "");
  cr_assert_eq(sim_strategy_get_context_parallel(s), 2);
  int checked = 0;
  for (int op = 0; op < sim_graph_n_ops(g); op++) {
    SimOpType t = sim_graph_op_type(g, op);
    if (t != SIM_OP_ATTENTION && t != SIM_OP_RMSNORM)
      continue;
    int sd = dim_named(g, op, "s"), hd = t == SIM_OP_ATTENTION ? dim_named(g, op, "h") : -1;
    const int *deg = sim_strategy_op_degrees(s, op);
    int n;
    const int *devs = sim_strategy_op_devices(s, op, &n);
    cr_assert_eq(deg[0], 2, "op %d: %d replicas", op, deg[0]);
    cr_assert_eq(deg[sd], t == SIM_OP_ATTENTION ? 2 : 4, "op %d: %d position chunks", op,
                 deg[sd]);
    cr_assert_eq(n, 8);
    for (int sh = 0; sh < n; sh++) {
      int r, k;
      if (t == SIM_OP_ATTENTION) {
        cr_assert_eq(deg[hd], 2);
        r = sh / 4;
        k = (sh / 2) % 2 * 2 + sh % 2; /* 2 c + t */
      } else {
        r = sh / 4;
        k = sh % 4;
      }
      cr_expect_eq(devs[sh], 4 * r + k, "op %d shard %d on %d", op, sh, devs[sh]);
    }
    checked++;
  }
  cr_assert(checked >= 3);
  g_autofree char *text = sim_strategy_to_json(s, g);
  cr_assert(strstr(text, "\"context_parallel\": 2"), "%s", text);
  assert_round_trip(s, g, m);
  g_autoptr(SimStrategy) flat = sim_strategy_copy(s);
  sim_strategy_set_context_parallel(flat, 1);
  cr_assert_not(sim_strategy_equal(s, flat));
}

Test(strategy_json, writes_compact_device_ranges)
{
  g_autoptr(SimGraph) g = tiny_graph(8);
  g_autoptr(SimMachine) m = machine("dgx-a100");
  g_autoptr(SimStrategy) s = sim_strategy_data_parallel(g, m, 8, NULL);
  g_autofree char *text = sim_strategy_to_json(s, g);
  cr_assert(strstr(text, "\"format\": \"parasol-strategy\"") != NULL);
  cr_assert(strstr(text, "\"fc1\": {\"degrees\": {\"b\": 8}, \"devices\": {\"start\": 0, "
                         "\"count\": 8, \"stride\": 1}}") != NULL, "%s", text);
}

static const char *const tiny_ops =
  "\"x\": {\"devices\": [0]}, \"fc1\": {\"devices\": [0]}, \"fc2\": {\"devices\": [0]},"
  "\"labels\": {\"devices\": [0]}, \"loss\": {\"devices\": [0]}";

/* Reads a strategy for the tiny graph from @body (the members after format and version)
 * and returns the error, or NULL. */
static GError *read_error(const char *body)
{
  g_autoptr(SimGraph) g = tiny_graph(8);
  g_autoptr(SimMachine) m = machine("dgx-a100");
  g_autofree char *text =
    g_strdup_printf("{\"format\": \"parasol-strategy\", \"version\": 1%s%s}", *body ? ", " : "",
                    body);
  GError *error = NULL;
  g_autoptr(SimStrategy) s = sim_strategy_from_json(text, "s.json", g, m, &error);
  cr_assert((s == NULL) == (error != NULL));
  return error;
}

Test(strategy_json, reads_a_hand_written_file)
{
  g_autoptr(SimGraph) g = tiny_graph(8);
  g_autoptr(SimMachine) m = machine("dgx-a100");
  /* The default covers the operators not listed; b is 'b' in every op of this graph, and
   * the labels' and loss's own dimension names are whatever they are. */
  const char *text =
    "{\"format\": \"parasol-strategy\", \"version\": 1, \"model\": \"tiny\",\n"
    " \"microbatches\": 2, \"schedule\": \"gpipe\",\n"
    " \"sync\": {\"algorithm\": \"tree\", \"bucket_MB\": 25, \"overlap\": false},\n"
    " \"memory\": {\"recompute\": \"selective\", \"zero\": 1, \"precision\": \"mixed-fp16\"},\n"
    " \"default\": {\"devices\": [0]},\n"
    " \"ops\": {\"fc1\": {\"degrees\": {\"b\": 2, \"n\": 2},\n"
    "                   \"devices\": {\"start\": 0, \"count\": 4, \"stride\": 2}},\n"
    "         \"fc2\": {\"replicas\": 2, \"devices\": [0, 2]}}}\n";
  GError *error = NULL;
  g_autoptr(SimStrategy) s = sim_strategy_from_json(text, "h.json", g, m, &error);
  cr_assert_not_null(s, "%s", error ? error->message : "");
  cr_assert_eq(sim_strategy_get_microbatches(s), 2);
  cr_assert_eq(sim_strategy_get_schedule(s, NULL), SIM_SCHEDULE_GPIPE);
  cr_assert_eq(sim_strategy_get_sync(s).algorithm, SIM_ALLREDUCE_TREE);
  cr_assert_eq(sim_strategy_get_sync(s).bucket_bytes, 25 * 1048576);
  cr_assert_not(sim_strategy_get_sync(s).overlap);
  cr_assert_eq(sim_strategy_get_memory(s).recompute, SIM_RECOMPUTE_SELECTIVE);
  cr_assert(sim_strategy_get_memory(s).zero1);
  cr_assert_eq(sim_strategy_get_memory(s).optimizer, SIM_OPTIMIZER_ADAM, "unchanged default");
  int fc1 = op_id(g, "fc1");
  int n = 0;
  const int *dev = sim_strategy_op_devices(s, fc1, &n);
  int want[] = { 0, 2, 4, 6 };
  cr_assert_eq(n, 4);
  cr_assert_arr_eq(dev, want, sizeof want);
  cr_assert_eq(degree_on(s, g, "fc1", "n"), 2);
  cr_assert_eq(sim_strategy_op_replicas(s, op_id(g, "fc2")), 2);
  /* Without "stages", the one stage runs on the devices the ops use. */
  cr_assert_eq(s->stage_n_devices[0], 4);
}

Test(strategy_json, default_degrees_apply_where_the_dimension_exists)
{
  g_autoptr(SimGraph) g = tiny_graph(8);
  g_autoptr(SimMachine) m = machine("dgx-a100");
  /* fc1 and fc2 have a dimension 'n'; the other ops do not, and keep degree 1. */
  const char *text = "{\"format\": \"parasol-strategy\", \"version\": 1,"
                     " \"default\": {\"degrees\": {\"n\": 2}, \"devices\": [0, 1]},"
                     " \"ops\": {\"x\": {\"devices\": [0]}, \"labels\": {\"devices\": [0]},"
                     "          \"loss\": {\"devices\": [0]}}}";
  GError *error = NULL;
  g_autoptr(SimStrategy) s = sim_strategy_from_json(text, "d.json", g, m, &error);
  cr_assert_not_null(s, "%s", error ? error->message : "");
  cr_assert_eq(degree_on(s, g, "fc1", "n"), 2);
  cr_assert_eq(degree_on(s, g, "fc2", "n"), 2);
}

Test(strategy_json, malformed_json_names_line_and_column)
{
  g_autoptr(SimGraph) g = tiny_graph(8);
  g_autoptr(SimMachine) m = machine("dgx-a100");
  GError *error = NULL;
  g_autoptr(SimStrategy) s =
    sim_strategy_from_json("{\n  \"format\": \"parasol-strategy\",\n  \"version\": 1,,\n}",
                           "bad.json", g, m, &error);
  cr_assert_null(s);
  assert_error(error, SIM_ERROR_PARSE, "bad.json:3:");
  cr_assert_null(strstr(error->message, "<data>"));
  g_clear_error(&error);
}

Test(strategy_json, errors_name_the_file_and_the_place)
{
  GError *e;
  g_autofree char *base = g_strdup(tiny_ops);

  e = read_error("\"pipeline_scatter_gather\": 1");
  assert_error(e, SIM_ERROR_PARSE, "s.json: pipeline_scatter_gather: expected true or false");
  g_error_free(e);

  e = read_error("\"tp_comm_overlap\": \"yes\"");
  assert_error(e, SIM_ERROR_PARSE, "s.json: tp_comm_overlap: expected true or false");
  g_error_free(e);

  e = read_error("\"tp_overlap\": {\"chunks\": -2}");
  cr_assert_not_null(e);
  cr_assert(strstr(e->message, "s.json") && strstr(e->message, "tp_overlap.chunks"), "%s",
            e->message);
  g_error_free(e);

  e = read_error("\"tp_overlap\": {\"splits\": 4}");
  cr_assert_not_null(e);
  cr_assert(strstr(e->message, "s.json") && strstr(e->message, "splits"), "%s", e->message);
  g_error_free(e);

  e = read_error("\"ops\": {\"fc9\": {\"devices\": [0]}}");
  assert_error(e, SIM_ERROR_UNKNOWN, "s.json: ops.fc9: no such operator in model 'tiny'");
  g_error_free(e);

  e = read_error("\"ops\": {\"fc1\": {\"degrees\": {\"q\": 2}, \"devices\": [0, 1]}}");
  assert_error(e, SIM_ERROR_UNKNOWN, "s.json: ops.fc1.degrees.q: op 'fc1' (linear) has no "
                                     "dimension 'q'");
  g_error_free(e);

  g_autofree char *div = g_strdup_printf(
    "\"ops\": {%s, \"fc1\": {\"degrees\": {\"n\": 3}, \"devices\": [0, 1, 2]}}", base);
  e = read_error(div);
  assert_error(e, SIM_ERROR_INVALID,
               "s.json: ops.fc1.degrees.n: op 'fc1' (linear): degree 3 on dimension 'n' does "
               "not divide its size 256");
  g_error_free(e);

  e = read_error("\"ops\": {\"fc1\": {\"degrees\": {\"n\": 2}, \"devices\": [0, 8]}}");
  assert_error(e, SIM_ERROR_INVALID, "s.json: ops.fc1.devices[1]: device 8 does not exist");
  g_error_free(e);

  e = read_error("\"ops\": {\"fc1\": {\"degrees\": {\"n\": 2}, \"devices\": [0]}}");
  assert_error(e, SIM_ERROR_INVALID, "1 devices for 2 shards");
  g_error_free(e);

  e = read_error("\"ops\": {\"fc1\": {\"replicas\": 2, \"devices\": [0, 1, 2]}}");
  assert_error(e, SIM_ERROR_INVALID, "3 devices for 1 shards (the product of the degrees) x 2 "
                                     "replicas");
  g_error_free(e);

  e = read_error("\"ops\": {\"fc1\": {\"replicas\": 2, \"devices\": [3, 3]}}");
  assert_error(e, SIM_ERROR_INVALID, "s.json: ops.fc1.devices[1]: op 'fc1' (linear): copies 0 "
                                     "and 1 of shard 0 are both on device 3");
  g_error_free(e);

  e = read_error("\"ops\": {\"fc1\": {\"devices\": [0]}}");
  assert_error(e, SIM_ERROR_INVALID, "s.json: ops: no configuration for op 'x' (input)");
  g_error_free(e);

  g_autofree char *stages = g_strdup_printf(
    "\"stages\": [{\"devices\": [0]}, {\"devices\": [1]}], \"ops\": {%s}", base);
  e = read_error(stages);
  assert_error(e, SIM_ERROR_INVALID, "has no \"stage\", but the strategy has 2 stages");
  g_error_free(e);

  g_autofree char *stage_range = g_strdup_printf(
    "\"ops\": {\"x\": {\"devices\": [0], \"stage\": 1}, \"fc1\": {\"devices\": [0]}}");
  e = read_error(stage_range);
  assert_error(e, SIM_ERROR_INVALID, "s.json: ops.x.stage: stage 1 does not exist");
  g_error_free(e);

  g_autofree char *algo =
    g_strdup_printf("\"sync\": {\"algorithm\": \"rin\"}, \"ops\": {%s}", base);
  e = read_error(algo);
  assert_error(e, SIM_ERROR_UNKNOWN, "s.json: sync.algorithm: unknown value 'rin'; expected "
                                     "one of: ring, tree, hierarchical");
  g_error_free(e);

  g_autofree char *sched = g_strdup_printf("\"schedule\": \"zigzag\", \"ops\": {%s}", base);
  e = read_error(sched);
  assert_error(e, SIM_ERROR_UNKNOWN, "expected one of: 1f1b, gpipe, interleaved");
  g_error_free(e);

  g_autofree char *prec =
    g_strdup_printf("\"memory\": {\"precision\": \"fp64\"}, \"ops\": {%s}", base);
  e = read_error(prec);
  assert_error(e, SIM_ERROR_UNKNOWN, "memory.precision: unknown value 'fp64'");
  g_error_free(e);

  g_autofree char *zero = g_strdup_printf("\"memory\": {\"zero\": 4}, \"ops\": {%s}", base);
  e = read_error(zero);
  assert_error(e, SIM_ERROR_INVALID, "memory.zero: expected an integer from 0 to 3, got 4");
  g_error_free(e);

  g_autofree char *off = g_strdup_printf("\"memory\": {\"offload_optimizer\": 1.5}, "
                                         "\"ops\": {%s}", base);
  e = read_error(off);
  assert_error(e, SIM_ERROR_INVALID, "s.json: memory.offload_optimizer: expected true, false or "
                                     "a number from 0 to 1, got 1.5");
  g_error_free(e);
  g_autofree char *offs = g_strdup_printf("\"memory\": {\"offload_optimizer\": \"cpu\"}, "
                                          "\"ops\": {%s}", base);
  e = read_error(offs);
  assert_error(e, SIM_ERROR_PARSE, "memory.offload_optimizer: expected true, false or a number "
                                   "from 0 to 1, got \"cpu\"");
  g_error_free(e);
  g_autofree char *ovl = g_strdup_printf("\"memory\": {\"offload_overlap\": true}, "
                                         "\"ops\": {%s}", base);
  e = read_error(ovl);
  assert_error(e, SIM_ERROR_INVALID, "s.json: memory.offload_overlap: true needs a share of the "
                                     "optimizer on the host (memory.offload_optimizer)");
  g_error_free(e);
  g_autofree char *ovls = g_strdup_printf("\"memory\": {\"offload_optimizer\": true, "
                                          "\"offload_overlap\": 1}, \"ops\": {%s}", base);
  e = read_error(ovls);
  assert_error(e, SIM_ERROR_PARSE, "memory.offload_overlap: expected true or false, got 1");
  g_error_free(e);

  /* Too large is not "below 1" (it once said so). */
  e = read_error("\"microbatches\": 1e12, \"ops\": {}");
  assert_error(e, SIM_ERROR_INVALID, "microbatches: expected an integer from 1 to 2147483647, "
               "got 1e+12");
  g_error_free(e);

  g_autofree char *key = g_strdup_printf("\"microbatch\": 4, \"ops\": {%s}", base);
  e = read_error(key);
  assert_error(e, SIM_ERROR_PARSE, "s.json: microbatch: unknown key");
  g_error_free(e);

  g_autofree char *mb = g_strdup_printf("\"microbatches\": 3, \"ops\": {%s}", base);
  e = read_error(mb);
  assert_error(e, SIM_ERROR_INVALID,
               "s.json: microbatches: the batch of 8 samples does not split into 3");
  g_error_free(e);

  g_autofree char *type = g_strdup_printf("\"microbatches\": \"two\", \"ops\": {%s}", base);
  e = read_error(type);
  assert_error(e, SIM_ERROR_PARSE, "s.json: microbatches: expected an integer >= 1, got \"");
  g_error_free(e);

  g_autofree char *def = g_strdup_printf(
    "\"default\": {\"degrees\": {\"zz\": 2}, \"devices\": [0, 1]}, \"ops\": {%s}", base);
  e = read_error(def);
  assert_error(e, SIM_ERROR_UNKNOWN, "default.degrees.zz: no operator of model 'tiny' has a "
                                     "dimension 'zz'");
  g_error_free(e);

  e = read_error("\"ops\": {\"x\": {\"devices\": {\"start\": 6, \"count\": 3}}}");
  assert_error(e, SIM_ERROR_INVALID, "s.json: ops.x.devices: device 8 (entry 2) does not exist");
  g_error_free(e);
}

Test(strategy_json, format_and_version_are_checked)
{
  g_autoptr(SimGraph) g = tiny_graph(8);
  g_autoptr(SimMachine) m = machine("dgx-a100");
  GError *error = NULL;
  cr_assert_null(sim_strategy_from_json("{\"format\": \"parasol-graph\", \"version\": 1}",
                                        "f.json", g, m, &error));
  assert_error(error, SIM_ERROR_PARSE,
               "f.json: format: expected \"parasol-strategy\", got \"parasol-graph\"");
  g_clear_error(&error);
  cr_assert_null(sim_strategy_from_json("{\"format\": \"parasol-strategy\", \"version\": 2}",
                                        "f.json", g, m, &error));
  assert_error(error, SIM_ERROR_PARSE, "f.json: version: expected 1, got 2");
  g_clear_error(&error);
  cr_assert_null(sim_strategy_from_json("[1, 2]", "f.json", g, m, &error));
  assert_error(error, SIM_ERROR_PARSE, "f.json: expected a JSON object");
  g_clear_error(&error);
}

Test(strategy_json, save_and_load)
{
  g_autoptr(SimGraph) g = tiny_graph(8);
  g_autoptr(SimMachine) m = machine("dgx-a100");
  g_autoptr(SimStrategy) s = sim_strategy_data_parallel(g, m, 4, NULL);
  g_autofree char *dir = g_dir_make_tmp("parasol-strategy-XXXXXX", NULL);
  cr_assert_not_null(dir);
  g_autofree char *path = g_build_filename(dir, "s.json", NULL);
  GError *error = NULL;
  cr_assert(sim_strategy_save(s, g, path, &error), "%s", error ? error->message : "");
  g_autoptr(SimStrategy) r = sim_strategy_load(path, g, m, &error);
  cr_assert_not_null(r, "%s", error ? error->message : "");
  cr_assert(sim_strategy_equal(s, r));
  g_unlink(path);
  g_rmdir(dir);

  cr_assert_null(sim_strategy_load(path, g, m, &error));
  assert_error(error, SIM_ERROR_IO, path);
  g_clear_error(&error);
}

/* ---------------------------------------------------------------------------------- */
/* Builders                                                                           */

Test(strategy_build, data_parallel_splits_the_batch)
{
  g_autoptr(SimGraph) g = tiny_graph(8);
  g_autoptr(SimMachine) m = machine("dgx-a100");
  GError *error = NULL;
  g_autoptr(SimStrategy) s = sim_strategy_data_parallel(g, m, 4, &error);
  cr_assert_not_null(s, "%s", error ? error->message : "");
  for (int op = 0; op < sim_graph_n_ops(g); op++) {
    const int *deg = sim_strategy_op_degrees(s, op);
    cr_assert_eq(deg[0], 4, "op %s", sim_graph_op_name(g, op));
    for (int d = 1; d < SIM_MAX_ITER; d++)
      cr_assert_eq(deg[d], 1);
    int n = 0;
    const int *dev = sim_strategy_op_devices(s, op, &n);
    cr_assert_eq(n, 4);
    for (int i = 0; i < 4; i++)
      cr_assert_eq(dev[i], i);
  }
  cr_assert_eq(s->stage_n_devices[0], 4);
}

Test(strategy_build, data_parallel_takes_the_largest_divisor)
{
  /* A batch of 12 over 8 devices: 6 is the largest degree <= 8 that divides 12. */
  g_autoptr(SimGraph) g = tiny_graph(12);
  g_autoptr(SimMachine) m = machine("dgx-a100");
  g_autoptr(SimStrategy) s = sim_strategy_data_parallel(g, m, 8, NULL);
  cr_assert_not_null(s);
  cr_assert_eq(sim_strategy_op_degrees(s, op_id(g, "fc1"))[0], 6);
  cr_assert_eq(sim_strategy_op_n_shards(s, op_id(g, "fc1")), 6);

  GError *error = NULL;
  cr_assert_null(sim_strategy_data_parallel(g, m, 9, &error));
  assert_error(error, SIM_ERROR_INVALID, "data parallelism over 9 devices");
  g_clear_error(&error);
}

#define GPT_SMALL "layers=4,hidden=256,heads=8,seq=64,vocab=1000,batch=16"

static SimStrategy *megatron(const SimGraph *g, const SimMachine *m, int dp, int tp, int pp,
                             gboolean sp)
{
  SimMegatronOptions o = sim_megatron_options_default();
  o.dp = dp;
  o.tp = tp;
  o.pp = pp;
  o.sequence_parallel = sp;
  GError *error = NULL;
  SimStrategy *s = sim_strategy_megatron(g, m, &o, &error);
  cr_assert_not_null(s, "%s", error ? error->message : "");
  return s;
}

static void assert_devices(const SimStrategy *s, const SimGraph *g, const char *op,
                           const int *want, int n_want)
{
  int n = 0;
  const int *dev = sim_strategy_op_devices(s, op_id(g, op), &n);
  cr_assert_eq(n, n_want, "op %s: %d shards", op, n);
  for (int i = 0; i < n; i++)
    cr_assert_eq(dev[i], want[i], "op %s shard %d on %d, not %d", op, i, dev[i], want[i]);
}

Test(strategy_build, megatron_options_default)
{
  SimMegatronOptions o = sim_megatron_options_default();
  cr_assert_eq(o.dp, 1);
  cr_assert_eq(o.tp, 1);
  cr_assert_eq(o.pp, 1);
  cr_assert_eq(o.microbatches, 0);
  cr_assert_eq(o.microbatch_size, 1);
  cr_assert_eq(o.schedule, SIM_SCHEDULE_1F1B);
  cr_assert_eq(o.chunks, 1);
  cr_assert_eq(o.sync.algorithm, SIM_ALLREDUCE_RING);
  cr_assert(o.sync.overlap);
  cr_assert_eq(o.memory.recompute, SIM_RECOMPUTE_NONE);
  cr_assert_eq(o.memory.precision, SIM_PRECISION_MIXED_FP16);
  cr_assert_eq(o.memory.optimizer, SIM_OPTIMIZER_ADAM);
}

Test(strategy_build, megatron_gpt_tp2_pp2_dp2)
{
  g_autoptr(SimGraph) g = zoo("gpt", GPT_SMALL);
  g_autoptr(SimMachine) m = machine("dgx-a100");
  g_autoptr(SimStrategy) s = megatron(g, m, 2, 2, 2, FALSE);

  /* Column-parallel fc1 (outputs split), row-parallel fc2 (inputs split). */
  for (int l = 0; l < 4; l++) {
    g_autofree char *fc1 = g_strdup_printf("layer%d.mlp.fc1", l);
    g_autofree char *fc2 = g_strdup_printf("layer%d.mlp.fc2", l);
    g_autofree char *attn = g_strdup_printf("layer%d.attn", l);
    g_autofree char *ln = g_strdup_printf("layer%d.ln1", l);
    int o1 = op_id(g, fc1), o2 = op_id(g, fc2), oa = op_id(g, attn), ol = op_id(g, ln);
    cr_assert_eq(sim_strategy_op_degrees(s, o1)[dim_with_role(g, o1, SIM_ROLE_PARAMETER)], 2);
    cr_assert_eq(sim_strategy_op_degrees(s, o1)[dim_with_role(g, o1, SIM_ROLE_REDUCTION)], 1);
    cr_assert_eq(sim_strategy_op_degrees(s, o2)[dim_with_role(g, o2, SIM_ROLE_REDUCTION)], 2);
    cr_assert_eq(sim_strategy_op_degrees(s, o2)[dim_with_role(g, o2, SIM_ROLE_PARAMETER)], 1);
    /* Attention: 8 heads over tp 2. */
    int heads = -1;
    for (int d = 0; d < sim_graph_op_n_dims(g, oa); d++)
      if (strcmp(sim_graph_op_dim_name(g, oa, d), "heads") == 0)
        heads = d;
    if (heads < 0)
      heads = dim_with_role(g, oa, SIM_ROLE_PARAMETER);
    cr_assert_eq(sim_strategy_op_degrees(s, oa)[heads], 2);
    /* Every op: dp 2 on the sample dimension; layer norms computed by both tp ranks:
     * 2 shards x 2 copies. */
    cr_assert_eq(sim_strategy_op_degrees(s, o1)[0], 2);
    cr_assert_eq(sim_strategy_op_n_shards(s, o1), 4);
    cr_assert_eq(sim_strategy_op_replicas(s, o1), 1);
    cr_assert_eq(sim_strategy_op_degrees(s, ol)[0], 2);
    for (int d = 1; d < SIM_MAX_ITER; d++)
      cr_assert_eq(sim_strategy_op_degrees(s, ol)[d], 1);
    cr_assert_eq(sim_strategy_op_replicas(s, ol), 2);
    cr_assert_eq(sim_strategy_op_n_shards(s, ol), 4);
    /* Two layers per stage. */
    cr_assert_eq(sim_strategy_op_stage(s, o1), l / 2);
    cr_assert_eq(sim_strategy_op_stage(s, oa), l / 2);
  }

  /* Ranks as Megatron numbers them: pp_idx * (dp * tp) + dp_idx * tp + tp_idx (its 16-GPU
   * example with tp 2, pp 4: data-parallel groups [0, 2], [1, 3], ..., pipeline groups
   * [0, 4, 8, 12], ...).  Stage 0 holds ranks {0, 1} (dp 0) and {2, 3} (dp 1); stage 1
   * holds {4, 5} and {6, 7}.  Shards are in row-major order of (b, ..., n): (dp 0, tp 0),
   * (dp 0, tp 1), (dp 1, tp 0), (dp 1, tp 1). */
  int stage0[] = { 0, 1, 2, 3 }, stage1[] = { 4, 5, 6, 7 };
  assert_devices(s, g, "layer0.mlp.fc1", stage0, 4);
  assert_devices(s, g, "layer1.mlp.fc2", stage0, 4);
  assert_devices(s, g, "layer3.mlp.fc1", stage1, 4);
  /* Replicated over tp: the copies of data-parallel shard d on ranks (d, p, 0..1). */
  assert_devices(s, g, "layer0.ln1", stage0, 4);
  assert_devices(s, g, "layer3.ln2", stage1, 4);
  assert_devices(s, g, "layer2.mlp.residual", stage1, 4);
  cr_assert_eq(sim_strategy_n_stages(s), 2);
  cr_assert_arr_eq(s->stage_devices[0], stage0, sizeof stage0);
  cr_assert_arr_eq(s->stage_devices[1], stage1, sizeof stage1);

  /* The embedding (vocab 1000 over tp 2) before the first layer is in stage 0; the final
   * norm, the head (column-parallel) and the vocabulary-parallel loss, and the labels
   * they use, in the last stage. */
  int embed = op_id(g, "embed");
  cr_assert_eq(sim_strategy_op_stage(s, embed), 0);
  cr_assert_eq(sim_strategy_op_degrees(s, embed)[dim_with_role(g, embed, SIM_ROLE_REDUCTION)], 2);
  cr_assert_eq(sim_strategy_op_stage(s, op_id(g, "tokens")), 0);
  cr_assert_eq(sim_strategy_op_stage(s, op_id(g, "final_ln")), 1);
  int head = op_id(g, "lm_head"), loss = op_id(g, "loss");
  cr_assert_eq(sim_strategy_op_stage(s, head), 1);
  cr_assert_eq(sim_strategy_op_stage(s, loss), 1);
  cr_assert_eq(sim_strategy_op_stage(s, op_id(g, "labels")), 1);
  cr_assert_eq(sim_strategy_op_degrees(s, head)[dim_with_role(g, head, SIM_ROLE_PARAMETER)], 2);
  cr_assert_eq(sim_strategy_op_n_shards(s, loss), 4, "dp 2 x tp 2 over the classes");
  assert_devices(s, g, "lm_head", stage1, 4);

  /* 16 samples over dp 2 in micro-batches of 1 sample: 8 micro-batches. */
  cr_assert_eq(sim_strategy_get_microbatches(s), 8);
  cr_assert_eq(sim_strategy_get_memory(s).precision, SIM_PRECISION_MIXED_FP16);
  GError *error = NULL;
  cr_assert(sim_strategy_validate(s, g, m, &error), "%s", error ? error->message : "");
}

/* Expert parallelism: Megatron's plan with tp 2, dp 4 and ep 2 on a mixture of 4 experts.
 * Every MoE op splits its samples over dp / ep = 2 groups, its experts over ep 2 and each
 * expert's width over tp 2: shard (i, j, t) on replica i ep + j, rank t, which is the
 * devices' plain order 0..7.  The router, attention and norms stay data parallel. */
Test(strategy_build, megatron_expert_parallel)
{
  g_autoptr(SimGraph) g = zoo("moe", "layers=2,hidden=64,heads=4,kv_heads=2,experts=4,top_k=2,"
                                     "expert_ffn=32,seq=16,vocab=128,batch=8");
  g_autoptr(SimMachine) m = machine("dgx-a100");
  SimMegatronOptions o = sim_megatron_options_default();
  cr_assert_eq(o.ep, 1);
  o.dp = 4;
  o.tp = 2;
  o.ep = 2;
  GError *error = NULL;
  g_autoptr(SimStrategy) s = sim_strategy_megatron(g, m, &o, &error);
  cr_assert_not_null(s, "%s", error ? error->message : "");
  int moe = op_id(g, "layer1.moe");
  const int *deg = sim_strategy_op_degrees(s, moe);
  cr_assert_eq(deg[0], 2);
  cr_assert_eq(deg[dim_named(g, moe, "x")], 2);
  cr_assert_eq(deg[dim_named(g, moe, "f")], 2);
  cr_assert_eq(sim_strategy_op_replicas(s, moe), 1);
  int all[] = { 0, 1, 2, 3, 4, 5, 6, 7 };
  assert_devices(s, g, "layer1.moe", all, 8);
  int router = op_id(g, "layer1.router");
  cr_assert_eq(sim_strategy_op_degrees(s, router)[0], 4);
  cr_assert_eq(sim_strategy_op_replicas(s, router), 2);
  cr_assert(sim_strategy_validate(s, g, m, &error), "%s", error ? error->message : "");

  /* ep must divide dp and the experts. */
  o.ep = 3;
  cr_assert_null(sim_strategy_megatron(g, m, &o, &error));
  cr_assert(strstr(error->message, "ep 3: the expert-parallel degree must divide dp 4"), "%s",
            error->message);
  g_clear_error(&error);
  o.dp = 8;
  o.tp = 1;
  o.ep = 8;
  cr_assert_null(sim_strategy_megatron(g, m, &o, &error));
  cr_assert(strstr(error->message, "ep 8 does not divide the 4 experts of op 'layer0.moe'"),
            "%s", error->message);
  g_clear_error(&error);
}

/* Expert tensor parallelism other than tp (Megatron-Core's --expert-tensor-parallel-size):
 * tp 2, dp 4, pp 2 on 16 GPUs, ep 4 and etp 1.  A stage's 8 ranks form 8 / (4 x 1) = 2
 * expert groups of 4 consecutive GPUs (the two tensor-parallel ranks of two replicas), so
 * a MoE op splits its samples 2 ways, its experts 4 and not their width: shard (i, j) on
 * stage rank 4 i + j, each GPU holding one whole expert.  With etp 2 = tp the layout is
 * the plain one (samples over dp / ep).  Bad degrees are refused. */
Test(strategy_build, megatron_expert_tensor_parallel_degree)
{
  g_autoptr(SimGraph) g = zoo("moe", "layers=2,hidden=64,heads=4,kv_heads=2,experts=4,top_k=2,"
                                     "expert_ffn=36,seq=16,vocab=128,batch=8");
  g_autoptr(SimMachine) m = machine("dgx-a100:2");
  SimMegatronOptions o = sim_megatron_options_default();
  cr_assert_eq(o.etp, 0);
  o.dp = 4;
  o.tp = 2;
  o.pp = 2;
  o.ep = 4;
  o.etp = 1;
  o.sequence_parallel = TRUE;
  GError *error = NULL;
  g_autoptr(SimStrategy) s = sim_strategy_megatron(g, m, &o, &error);
  cr_assert_not_null(s, "%s", error ? error->message : "");
  for (int l = 0; l < 2; l++) {
    g_autofree char *name = g_strdup_printf("layer%d.moe", l);
    int moe = op_id(g, name);
    const int *deg = sim_strategy_op_degrees(s, moe);
    cr_assert_eq(deg[0], 2);
    cr_assert_eq(deg[dim_named(g, moe, "x")], 4);
    cr_assert_eq(deg[dim_named(g, moe, "f")], 1, "each GPU holds whole experts");
    cr_assert_eq(sim_strategy_op_replicas(s, moe), 1);
    int stage = sim_strategy_op_stage(s, moe), want[8];
    for (int i = 0; i < 8; i++)
      want[i] = 8 * stage + i;
    assert_devices(s, g, name, want, 8);
  }
  cr_assert(sim_strategy_validate(s, g, m, &error), "%s", error ? error->message : "");
  /* A strategy file holds the layout as every op's degrees and devices. */
  assert_round_trip(s, g, m);

  /* etp = tp: the plan of megatron_expert_parallel (ep 2 over dp 4, width over tp). */
  o.ep = 2;
  o.etp = 2;
  g_autoptr(SimStrategy) same = sim_strategy_megatron(g, m, &o, &error);
  cr_assert_not_null(same, "%s", error ? error->message : "");
  int moe = op_id(g, "layer1.moe");
  cr_assert_eq(sim_strategy_op_degrees(same, moe)[0], 2);
  cr_assert_eq(sim_strategy_op_degrees(same, moe)[dim_named(g, moe, "f")], 2);

  /* An expert group must hold whole tensor-parallel groups and divide the stage. */
  o.ep = 1;
  o.etp = 1;
  cr_assert_null(sim_strategy_megatron(g, m, &o, &error));
  cr_assert(strstr(error->message, "ep 1 x etp 1 = 1: an expert group must be a multiple of "
                                   "tp 2 that divides dp 4 x tp 2"), "%s", error->message);
  g_clear_error(&error);
  o.ep = 4;
  o.etp = 4;
  cr_assert_null(sim_strategy_megatron(g, m, &o, &error));
  cr_assert(strstr(error->message, "ep 4 x etp 4 = 16"), "%s", error->message);
  g_clear_error(&error);
  /* etp must divide each expert's width (36). */
  o.ep = 1;
  o.etp = 8;
  cr_assert_null(sim_strategy_megatron(g, m, &o, &error));
  cr_assert(strstr(error->message, "ep 1 and etp 8 must divide the 4 experts of width 36"),
            "%s", error->message);
  g_clear_error(&error);
  /* Not with context parallelism. */
  o.dp = 2;
  o.cp = 2;
  o.ep = 2;
  o.etp = 1;
  cr_assert_null(sim_strategy_megatron(g, m, &o, &error));
  cr_assert(strstr(error->message, "etp 1 with cp 2"), "%s", error->message);
  g_clear_error(&error);
}

/* Expert and context parallelism together: dp 4, ep 2, cp 2, tp 1 on 8 devices, replica r's
 * context rank c on device 2 r + c.  A MoE op's shard (sample group i, positions c,
 * experts j) sits on replica 2 i + j, context rank c: 4 i + 2 j + c, so that each expert
 * group's replicas (2 i and 2 i + 1) exchange the tokens of one context rank. */
Test(strategy_build, megatron_expert_and_context_parallel)
{
  g_autoptr(SimGraph) g = zoo("moe", "layers=2,hidden=64,heads=4,kv_heads=2,experts=4,top_k=2,"
                                     "expert_ffn=32,seq=16,vocab=128,batch=8");
  g_autoptr(SimMachine) m = machine("dgx-a100");
  SimMegatronOptions o = sim_megatron_options_default();
  o.dp = 4;
  o.ep = 2;
  o.cp = 2;
  o.microbatch_size = 1;
  GError *error = NULL;
  g_autoptr(SimStrategy) s = sim_strategy_megatron(g, m, &o, &error);
  cr_assert_not_null(s, "%s", error ? error->message : "");
  int moe = op_id(g, "layer1.moe");
  const int *deg = sim_strategy_op_degrees(s, moe);
  cr_assert_eq(deg[0], 2);
  cr_assert_eq(deg[dim_named(g, moe, "s")], 2);
  cr_assert_eq(deg[dim_named(g, moe, "x")], 2);
  int want[8], n = 0;
  for (int i = 0; i < 2; i++)
    for (int c = 0; c < 2; c++)
      for (int j = 0; j < 2; j++)
        want[n++] = 4 * i + 2 * j + c;
  assert_devices(s, g, "layer1.moe", want, 8);
  cr_assert(sim_strategy_validate(s, g, m, &error), "%s", error ? error->message : "");
}

Test(strategy_build, megatron_sequence_parallel_splits_norms_on_the_sequence)
{
  g_autoptr(SimGraph) g = zoo("gpt", GPT_SMALL);
  g_autoptr(SimMachine) m = machine("dgx-a100");
  g_autoptr(SimStrategy) s = megatron(g, m, 1, 4, 1, TRUE);
  cr_assert(sim_strategy_get_sequence_parallel(s));
  int ln = op_id(g, "layer1.ln2");
  int seq = dim_with_role(g, ln, SIM_ROLE_ATTRIBUTE);
  cr_assert_geq(seq, 0);
  cr_assert_eq(sim_strategy_op_degrees(s, ln)[seq], 4);
  cr_assert_eq(sim_strategy_op_replicas(s, ln), 1, "split, not replicated");
  int add = op_id(g, "layer1.mlp.residual");
  cr_assert_eq(sim_strategy_op_degrees(s, add)[dim_with_role(g, add, SIM_ROLE_ATTRIBUTE)], 4);
  int ranks[] = { 0, 1, 2, 3 };
  assert_devices(s, g, "layer1.ln2", ranks, 4);
}

Test(strategy_build, megatron_interleaved_assigns_chunks_round_robin)
{
  g_autoptr(SimGraph) g = zoo("gpt", GPT_SMALL);
  g_autoptr(SimMachine) m = machine("dgx-a100");
  SimMegatronOptions o = sim_megatron_options_default();
  o.pp = 2;
  o.schedule = SIM_SCHEDULE_INTERLEAVED;
  o.chunks = 2;
  o.microbatches = 4;
  GError *error = NULL;
  g_autoptr(SimStrategy) s = sim_strategy_megatron(g, m, &o, &error);
  cr_assert_not_null(s, "%s", error ? error->message : "");
  /* pp 2 x 2 chunks = 4 model chunks of one layer each; chunk c on pipeline rank c % 2,
   * which is device c % 2 (dp 1, tp 1). */
  cr_assert_eq(sim_strategy_n_stages(s), 4);
  for (int l = 0; l < 4; l++) {
    g_autofree char *fc1 = g_strdup_printf("layer%d.mlp.fc1", l);
    cr_assert_eq(sim_strategy_op_stage(s, op_id(g, fc1)), l);
    int want[] = { l % 2 };
    assert_devices(s, g, fc1, want, 1);
  }
  int chunks = 0;
  cr_assert_eq(sim_strategy_get_schedule(s, &chunks), SIM_SCHEDULE_INTERLEAVED);
  cr_assert_eq(chunks, 2);
  cr_assert_eq(sim_strategy_get_microbatches(s), 4, "given, not derived");

  /* Micro-batches go through the 2 device groups in rounds: a single one cannot. */
  o.microbatches = 1;
  cr_assert_null(sim_strategy_megatron(g, m, &o, &error));
  assert_error(error, SIM_ERROR_INVALID, "the 1 micro-batches to be a multiple of the 2 device "
                                         "groups");
  g_clear_error(&error);
}

Test(strategy_build, megatron_errors)
{
  g_autoptr(SimGraph) g = zoo("gpt", GPT_SMALL);
  g_autoptr(SimMachine) m = machine("dgx-a100");
  SimMegatronOptions o = sim_megatron_options_default();
  GError *error = NULL;

  o.tp = 3;
  cr_assert_null(sim_strategy_megatron(g, m, &o, &error));
  assert_error(error, SIM_ERROR_INVALID, "tp 3 does not divide dimension");
  g_clear_error(&error);

  o = sim_megatron_options_default();
  o.pp = 8;
  cr_assert_null(sim_strategy_megatron(g, m, &o, &error));
  assert_error(error, SIM_ERROR_INVALID, "pp 8 stages, but model 'gpt' has 4 layers");
  g_clear_error(&error);

  o = sim_megatron_options_default();
  o.dp = 4;
  o.tp = 2;
  o.pp = 2;
  cr_assert_null(sim_strategy_megatron(g, m, &o, &error));
  assert_error(error, SIM_ERROR_INVALID, "dp 4 x tp 2 x pp 2 = 16 devices, but machine");
  g_clear_error(&error);

  o = sim_megatron_options_default();
  o.dp = 2;
  o.microbatch_size = 3;
  cr_assert_null(sim_strategy_megatron(g, m, &o, &error));
  assert_error(error, SIM_ERROR_INVALID, "does not split into dp 2 replicas x micro-batches of 3");
  g_clear_error(&error);

  o = sim_megatron_options_default();
  o.pp = 2;
  o.schedule = SIM_SCHEDULE_INTERLEAVED;
  o.chunks = 4;
  cr_assert_null(sim_strategy_megatron(g, m, &o, &error));
  assert_error(error, SIM_ERROR_INVALID, "pp 2 x 4 chunks = 8 model chunks");
  g_clear_error(&error);
}

Test(strategy_build, megatron_reads_structure_not_names)
{
  /* Layers with no transformer names pair up as column then row by the way one feeds the
   * next: a (gelu) -> b -> c (relu) -> d.  A linear with a fused activation is never
   * made row-parallel, since the activation would apply to partial sums: in Unity's MLP,
   * whose layers all fuse a relu, nothing pairs. */
  g_autoptr(SimGraph) g = sim_graph_new("pairs");
  int64_t dims[2] = { 8, 64 };
  int x = sim_graph_input(g, "x", SIM_DTYPE_FP32, 2, dims);
  x = sim_graph_linear(g, "a", x, 128, TRUE, SIM_UNARY_GELU);
  x = sim_graph_linear(g, "b", x, 64, TRUE, SIM_UNARY_IDENTITY);
  x = sim_graph_linear(g, "c", x, 128, TRUE, SIM_UNARY_RELU);
  x = sim_graph_linear(g, "d", x, 64, TRUE, SIM_UNARY_IDENTITY);
  cr_assert(sim_graph_check(g, NULL));
  g_autoptr(SimMachine) m = machine("dgx-a100");
  g_autoptr(SimStrategy) s = megatron(g, m, 1, 2, 1, FALSE);
  const char *col[] = { "a", "c" };
  const char *row[] = { "b", "d" };
  for (int i = 0; i < 2; i++) {
    int c = op_id(g, col[i]), r = op_id(g, row[i]);
    cr_assert_eq(sim_strategy_op_degrees(s, c)[dim_with_role(g, c, SIM_ROLE_PARAMETER)], 2,
                 "%s column-parallel", col[i]);
    cr_assert_eq(sim_strategy_op_degrees(s, r)[dim_with_role(g, r, SIM_ROLE_REDUCTION)], 2,
                 "%s row-parallel", row[i]);
  }
  g_autoptr(SimGraph) mlp = zoo("mlp", "batch=8,layers=4,hidden=64,input=32,classes=16,towers=1");
  g_autoptr(SimStrategy) t = megatron(mlp, m, 1, 2, 1, FALSE);
  int fc1 = op_id(mlp, "tower0.fc1");
  cr_assert_eq(sim_strategy_op_degrees(t, fc1)[dim_with_role(mlp, fc1, SIM_ROLE_REDUCTION)], 1,
               "a relu layer keeps its reduction whole");
  GError *error = NULL;
  cr_assert(sim_strategy_validate(t, mlp, m, &error), "%s", error ? error->message : "");
}
