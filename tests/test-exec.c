/* test-exec.c — the executor: every parallelization kind computes what one device does.
 *
 * Each test builds a small model and a parallel strategy for it, runs three training
 * steps with the CPU reference back end, runs the same steps on one device (the same
 * micro-batches, optimizer and data), and checks that the loss, every weight gradient of
 * the last step and every updated weight agree to 1e-5 relative error (max |a - b| over
 * max |b|, per tensor).  Activations are poisoned with NaN before each step, so a plan
 * that reads data nobody delivered fails loudly instead of reading last step's values. */
#include <criterion/criterion.h>
#include <glib/gstdio.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "parasol-exec.h"

#define TOL 1e-5
#define STEPS 3

/* ---------------------------------------------------------------------------------- */
/* Fixtures                                                                           */

static SimMachine *machine(void)
{
  GError *error = NULL;
  SimMachine *m = sim_machine_load("dgx-a100", &error);
  cr_assert_not_null(m, "%s", error ? error->message : "");
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

static SimGraph *mlp(void)
{
  return zoo("mlp", "batch=16,layers=3,hidden=32,input=16,classes=12,towers=2");
}

/* conv (3x3, pad 1, bias) -> relu -> max pool -> conv (3x3, pad 1) -> batch norm + relu
 * -> average pool -> flatten -> linear -> cross entropy, over [8, 3, 16, 16] images.  The
 * convolution before batch norm has no bias, as is usual: batch norm would cancel it, and
 * its gradient would be rounding noise. */
static SimGraph *small_cnn(void)
{
  SimGraph *g = sim_graph_new("small-cnn");
  int64_t xd[] = { 8, 3, 16, 16 };
  int x = sim_graph_input(g, "images", SIM_DTYPE_FP32, 4, xd);
  SimConvParams c1 = sim_conv_params(8, 3, 3);
  c1.padding[0] = c1.padding[1] = 1;
  c1.bias = TRUE;
  x = sim_graph_conv2d(g, "conv1", x, &c1);
  x = sim_graph_unary(g, "relu1", x, SIM_UNARY_RELU);
  x = sim_graph_pool2d(g, "pool1", x, SIM_POOL_MAX, 2, 2, 2, 2, 0, 0);
  SimConvParams c2 = sim_conv_params(8, 3, 3);
  c2.padding[0] = c2.padding[1] = 1;
  x = sim_graph_conv2d(g, "conv2", x, &c2);
  x = sim_graph_batchnorm(g, "bn2", x, TRUE);
  x = sim_graph_pool2d(g, "pool2", x, SIM_POOL_AVG, 2, 2, 2, 2, 0, 0);
  int64_t flat[] = { 8, 8 * 4 * 4 };
  x = sim_graph_reshape(g, "flatten", x, 2, flat);
  x = sim_graph_linear(g, "fc", x, 10, TRUE, SIM_UNARY_IDENTITY);
  int64_t ld[] = { 8 };
  int labels = sim_graph_input(g, "labels", SIM_DTYPE_INT32, 1, ld);
  sim_graph_cross_entropy(g, "loss", x, labels);
  GError *error = NULL;
  cr_assert(sim_graph_check(g, &error), "%s", error ? error->message : "");
  return g;
}

static SimGraph *gpt(void)
{
  return zoo("gpt", "layers=2,hidden=64,heads=4,seq=16,vocab=128,batch=8");
}

static SimGraph *rnnlm(void)
{
  return zoo("rnnlm", "batch=4,seq=8,chunk=4,layers=2,hidden=16,vocab=32");
}

static int dim_named(const SimGraph *g, int op, const char *name)
{
  for (int d = 0; d < sim_graph_op_n_dims(g, op); d++)
    if (strcmp(sim_graph_op_dim_name(g, op, d), name) == 0)
      return d;
  return -1;
}

/* Splits op @op along the dimension named @dim @n ways over devices @first.. (one shard
 * per device); ops without that dimension stay as they are. */
/* Every linear layer split in two along samples and two along output features, its four
 * shards (samples major) on @devices. */
static void split_linears_2x2(SimStrategy *s, const SimGraph *g, const int devices[4])
{
  static const int degrees[8] = { 2, 2, 1, 1, 1, 1, 1, 1 };
  for (int op = 0; op < sim_graph_n_ops(g); op++)
    if (sim_graph_op_type(g, op) == SIM_OP_LINEAR)
      cr_assert(sim_strategy_set_op(s, op, degrees, devices, NULL));
}

static void split(SimStrategy *s, const SimGraph *g, int op, const char *dim, int n, int first)
{
  int d = dim_named(g, op, dim);
  if (d < 0)
    return;
  int degrees[8] = { 1, 1, 1, 1, 1, 1, 1, 1 };
  degrees[d] = n;
  int devices[8];
  for (int k = 0; k < n; k++)
    devices[k] = first + k;
  GError *error = NULL;
  cr_assert(sim_strategy_set_op(s, op, degrees, devices, &error), "%s: %s",
            sim_graph_op_name(g, op), error ? error->message : "");
}

/* A pipeline: the ops, in graph order, cut into @stages stages of consecutive ops, stage k
 * on device k % @devices (more stages than devices interleave), @mb micro-batches. */
static void pipeline(SimStrategy *s, const SimGraph *g, int stages, int devices, int mb,
                     SimSchedule sched)
{
  int n = sim_graph_n_ops(g), real = 0, k = 0;
  for (int op = 0; op < n; op++)
    real += sim_graph_op_type(g, op) != SIM_OP_INPUT;
  g_autofree int *stage = g_new0(int, (size_t)MAX(n, 1));
  for (int op = 0; op < n; op++)
    if (sim_graph_op_type(g, op) != SIM_OP_INPUT)
      stage[op] = k++ * stages / real;
  /* A graph input belongs to the stage of its first reader. */
  for (int op = 0; op < n; op++)
    if (sim_graph_op_type(g, op) == SIM_OP_INPUT)
      stage[op] = stage[sim_graph_tensor_consumer(g, sim_graph_op_output(g, op, 0), 0)];
  for (int op = 0; op < n; op++)
    split(s, g, op, "b", 1, stage[op] % devices);
  int devs[16], ndev[16];
  const int *groups[16];
  for (int st = 0; st < stages; st++) {
    devs[st] = st % devices;
    groups[st] = &devs[st];
    ndev[st] = 1;
  }
  GError *error = NULL;
  cr_assert(sim_strategy_set_stages(s, stages, stage, groups, ndev, &error), "%s",
            error ? error->message : "");
  sim_strategy_set_microbatches(s, mb);
  sim_strategy_set_schedule(s, sched, stages / devices);
}

static void set_recompute(SimStrategy *s, SimRecompute r)
{
  SimMemoryOptions mo = sim_strategy_get_memory(s);
  mo.recompute = r;
  sim_strategy_set_memory(s, &mo);
}

static void set_optimizer(SimStrategy *s, SimOptimizer opt)
{
  SimMemoryOptions mo = sim_strategy_get_memory(s);
  mo.optimizer = opt;
  sim_strategy_set_memory(s, &mo);
}

/* With one stage, makes its device group every device an op uses. */
static void cover_devices(SimStrategy *s, const SimGraph *g)
{
  if (sim_strategy_n_stages(s) > 1)
    return;
  gboolean used[64] = { FALSE };
  for (int op = 0; op < sim_graph_n_ops(g); op++) {
    int n;
    const int *dev = sim_strategy_op_devices(s, op, &n);
    for (int k = 0; k < n; k++)
      used[dev[k]] = TRUE;
  }
  int devs[64], n = 0;
  for (int d = 0; d < 64; d++)
    if (used[d])
      devs[n++] = d;
  g_autofree int *stage = g_new0(int, (size_t)MAX(sim_graph_n_ops(g), 1));
  const int *groups[1] = { devs };
  GError *error = NULL;
  cr_assert(sim_strategy_set_stages(s, 1, stage, groups, &n, &error), "%s",
            error ? error->message : "");
}

/* Ring attention's causal work per device: the (query, key) pairs that the forward ring
 * steps of a run with counting on leave unmasked, from the positions the kernels are
 * given (include/parasol-exec.h: ring_half, ring_q_lo, ring_lo, ...) times the shard's
 * samples and key-value heads.  Each device's slots run in that device's thread, so
 * each counter has one writer. */
#define MAX_COUNTED 16
static gint64 ring_pairs[MAX_COUNTED];
static gboolean count_ring_pairs;
static gboolean (*cpu_kernel_slot)(ExecBackend *, int, const ExecKernelArgs *, GError **);

static int64_t counted_qpos(const ExecKernelArgs *a, int64_t i)
{
  if (a->ring_half <= 0)
    return a->lo[1] + i;
  return i < a->ring_half ? a->ring_q_lo + i : a->ring_q_lo2 + i - a->ring_half;
}

static int64_t counted_kpos(const ExecKernelArgs *a, int64_t j)
{
  if (a->ring_half <= 0)
    return a->ring_lo + j;
  return j < a->ring_half ? a->ring_lo + j : a->ring_lo2 + j - a->ring_half;
}

static gboolean counting_kernel(ExecBackend *self, int dev, const ExecKernelArgs *a,
                                GError **error)
{
  if (a->phase == EXEC_KERNEL_RING_STEP && dev < MAX_COUNTED) {
    int64_t ns = a->hi[1] - a->lo[1], nk = a->ring->box.hi[2] - a->ring->box.lo[2];
    int64_t pairs = 0;
    for (int64_t i = 0; i < ns; i++)
      for (int64_t j = 0; j < nk; j++)
        pairs += counted_kpos(a, j) <= counted_qpos(a, i);
    ring_pairs[dev] += pairs * (a->hi[0] - a->lo[0]) * (a->hi[2] - a->lo[2]);
  }
  return cpu_kernel_slot(self, dev, a, error);
}

/* Runs @s and the one-device reference for STEPS steps and checks they agree. */
static void check(const SimGraph *g, SimMachine *m, SimStrategy *s, SimOptimizer opt)
{
  GError *error = NULL;
  set_optimizer(s, opt);
  cover_devices(s, g);
  cr_assert(sim_strategy_validate(s, g, m, &error), "%s", error ? error->message : "");
  g_autoptr(SimPlan) plan = sim_plan_new(g, m, s, NULL, &error);
  cr_assert_not_null(plan, "%s", error ? error->message : "");
  g_autoptr(SimStrategy) rs = exec_reference_strategy(plan, m, &error);
  cr_assert_not_null(rs, "%s", error ? error->message : "");
  g_autoptr(SimPlan) rplan = sim_plan_new(g, m, rs, NULL, &error);
  cr_assert_not_null(rplan, "%s", error ? error->message : "");
  g_autoptr(ExecBackend) b = exec_backend_new("cpu", &error);
  g_autoptr(ExecBackend) rb = exec_backend_new("cpu", &error);
  cr_assert_not_null(b);
  static ExecBackendClass counting;
  if (count_ring_pairs) {
    counting = *b->klass;
    cpu_kernel_slot = counting.kernel;
    counting.kernel = counting_kernel;
    b->klass = &counting;
    memset(ring_pairs, 0, sizeof ring_pairs);
  }
  /* Adam divides each gradient by its own magnitude, so the rounding noise of a small
   * gradient (different in every strategy: sums run in other orders) moves a weight by up
   * to the learning rate; attention's key bias, whose exact gradient is zero (softmax
   * ignores a constant added to a row), gets nothing but noise.  A larger epsilon and a
   * smaller learning rate bound that to well under the tolerance. */
  ExecOptions o = exec_options_default();
  if (opt == SIM_OPTIMIZER_ADAM) {
    o.eps = 1e-5;
    o.lr = 1e-4;
  }
  g_autoptr(ExecRun) run = exec_run_new(b, plan, &o, &error);
  cr_assert_not_null(run, "%s", error ? error->message : "");
  g_autoptr(ExecRun) ref = exec_run_new(rb, rplan, &o, &error);
  cr_assert_not_null(ref, "%s", error ? error->message : "");
  for (int k = 0; k < STEPS; k++) {
    cr_assert(exec_run_step(run, &error), "step %d: %s", k + 1, error ? error->message : "");
    cr_assert(exec_run_step(ref, &error), "reference step %d: %s", k + 1,
              error ? error->message : "");
    cr_assert(isfinite(exec_run_loss(ref)), "reference loss %g", exec_run_loss(ref));
  }
  ExecDiff diff;
  cr_assert(exec_run_compare(run, ref, &diff, &error), "%s", error ? error->message : "");
  if (g_getenv("EXEC_TEST_VERBOSE"))
    g_printerr("loss %.9g ref %.9g | errors: loss %.3g grads %.3g weights %.3g (%s)\n",
               exec_run_loss(run), exec_run_loss(ref), diff.loss, diff.grads, diff.weights,
               diff.worst);
  cr_expect_leq(diff.loss, TOL, "loss %.9g vs %.9g: relative error %g", exec_run_loss(run),
                exec_run_loss(ref), diff.loss);
  cr_expect_leq(diff.grads, TOL, "gradients: relative error %g (worst: %s)", diff.grads,
                diff.worst);
  cr_expect_leq(diff.weights, TOL, "weights: relative error %g (worst: %s)", diff.weights,
                diff.worst);
}

/* LLaMA-style blocks: RMS norm, grouped-query attention with rotary embeddings (4 query
 * heads, 2 key-value heads), SwiGLU; and the same with a mixture of 4 experts, top 2. */
static SimGraph *llama(void)
{
  return zoo("llama", "layers=2,hidden=32,heads=4,kv_heads=2,ffn=48,seq=8,vocab=64,batch=4");
}

static SimGraph *moe(void)
{
  return zoo("moe", "layers=2,hidden=32,heads=4,kv_heads=2,experts=4,top_k=2,expert_ffn=16,"
                    "seq=8,vocab=64,batch=4");
}

/* ---------------------------------------------------------------------------------- */
/* Data parallelism                                                                    */

Test(exec, mlp_data_parallel)
{
  g_autoptr(SimGraph) g = mlp();
  g_autoptr(SimMachine) m = machine();
  GError *error = NULL;
  g_autoptr(SimStrategy) s = sim_strategy_data_parallel(g, m, 4, &error);
  cr_assert_not_null(s, "%s", error ? error->message : "");
  check(g, m, s, SIM_OPTIMIZER_SGD);
}

Test(exec, mlp_data_parallel_adam)
{
  g_autoptr(SimGraph) g = mlp();
  g_autoptr(SimMachine) m = machine();
  g_autoptr(SimStrategy) s = sim_strategy_data_parallel(g, m, 4, NULL);
  check(g, m, s, SIM_OPTIMIZER_ADAM);
}

Test(exec, mlp_zero1)
{
  g_autoptr(SimGraph) g = mlp();
  g_autoptr(SimMachine) m = machine();
  g_autoptr(SimStrategy) s = sim_strategy_data_parallel(g, m, 4, NULL);
  SimMemoryOptions mo = sim_strategy_get_memory(s);
  mo.zero1 = TRUE;
  sim_strategy_set_memory(s, &mo);
  check(g, m, s, SIM_OPTIMIZER_ADAM);
}

/* Two shards of every linear layer on each of two devices, feature halves of one sample
 * half: each device holds two weight regions, each synchronized (reduce-scattered) with
 * the other device on its own. */
Test(exec, mlp_zero1_two_regions_per_device)
{
  g_autoptr(SimGraph) g = mlp();
  g_autoptr(SimMachine) m = machine();
  g_autoptr(SimStrategy) s = sim_strategy_new(g, m);
  static const int devices[4] = { 0, 0, 1, 1 };
  split_linears_2x2(s, g, devices);
  SimMemoryOptions mo = sim_strategy_get_memory(s);
  mo.zero1 = TRUE;
  sim_strategy_set_memory(s, &mo);
  check(g, m, s, SIM_OPTIMIZER_ADAM);
}

/* ---------------------------------------------------------------------------------- */
/* Parameter and reduction splits                                                      */

/* Every linear layer's output features over two devices (column-parallel), the rest on
 * device 0. */
Test(exec, mlp_parameter_split)
{
  g_autoptr(SimGraph) g = mlp();
  g_autoptr(SimMachine) m = machine();
  g_autoptr(SimStrategy) s = sim_strategy_new(g, m);
  for (int op = 0; op < sim_graph_n_ops(g); op++)
    if (sim_graph_op_type(g, op) == SIM_OP_LINEAR)
      split(s, g, op, "n", 2, 0);
  check(g, m, s, SIM_OPTIMIZER_SGD);
}

/* Samples and features at once: 2 x 2 shards on four devices. */
Test(exec, mlp_sample_and_parameter)
{
  g_autoptr(SimGraph) g = mlp();
  g_autoptr(SimMachine) m = machine();
  g_autoptr(SimStrategy) s = sim_strategy_new(g, m);
  static const int devices[4] = { 0, 1, 2, 3 };
  split_linears_2x2(s, g, devices);
  check(g, m, s, SIM_OPTIMIZER_ADAM);
}

/* The towers' last layers (no activation) split their input features: partial sums,
 * summed by an all-reduce (row-parallel); the loss splits its classes (vocabulary-
 * parallel cross entropy). */
Test(exec, mlp_reduction_split)
{
  g_autoptr(SimGraph) g = mlp();
  g_autoptr(SimMachine) m = machine();
  g_autoptr(SimStrategy) s = sim_strategy_new(g, m);
  split(s, g, sim_graph_op_by_name(g, "tower0.fc2"), "k", 2, 0);
  split(s, g, sim_graph_op_by_name(g, "tower1.fc2"), "k", 2, 2);
  split(s, g, sim_graph_op_by_name(g, "loss"), "c", 3, 1);
  check(g, m, s, SIM_OPTIMIZER_SGD);
}

/* ---------------------------------------------------------------------------------- */
/* Convolutions: samples, spatial halos, channels, input channels                       */

/* Batch norm keeps its batch whole (split, it would normalize per shard). */
Test(exec, cnn_data_parallel)
{
  g_autoptr(SimGraph) g = small_cnn();
  g_autoptr(SimMachine) m = machine();
  g_autoptr(SimStrategy) s = sim_strategy_new(g, m);
  for (int op = 0; op < sim_graph_n_ops(g); op++)
    if (sim_graph_op_type(g, op) != SIM_OP_BATCHNORM)
      split(s, g, op, "b", 4, 0);
  check(g, m, s, SIM_OPTIMIZER_SGD);
}

/* Output rows over two devices: each convolution reads its neighbour's halo rows and
 * sends back their gradients; batch norm splits its channels. */
Test(exec, cnn_spatial)
{
  g_autoptr(SimGraph) g = small_cnn();
  g_autoptr(SimMachine) m = machine();
  g_autoptr(SimStrategy) s = sim_strategy_new(g, m);
  for (int op = 0; op < sim_graph_n_ops(g); op++) {
    SimOpType t = sim_graph_op_type(g, op);
    if (t == SIM_OP_CONV2D || t == SIM_OP_POOL2D)
      split(s, g, op, "h", 2, 0);
    else if (t == SIM_OP_BATCHNORM)
      split(s, g, op, "c", 2, 1);
    else
      split(s, g, op, "b", 2, 2);
  }
  check(g, m, s, SIM_OPTIMIZER_ADAM);
}

/* Output channels split (parameter), the first convolution's three input channels over
 * three devices (reduction: partial sums, the bias added once). */
Test(exec, cnn_channels)
{
  g_autoptr(SimGraph) g = small_cnn();
  g_autoptr(SimMachine) m = machine();
  g_autoptr(SimStrategy) s = sim_strategy_new(g, m);
  split(s, g, sim_graph_op_by_name(g, "conv1"), "cin", 3, 0);
  split(s, g, sim_graph_op_by_name(g, "relu1"), "d1", 2, 1);
  split(s, g, sim_graph_op_by_name(g, "pool1"), "c", 4, 0);
  split(s, g, sim_graph_op_by_name(g, "conv2"), "cout", 2, 2);
  split(s, g, sim_graph_op_by_name(g, "bn2"), "c", 2, 1);
  split(s, g, sim_graph_op_by_name(g, "pool2"), "c", 2, 2);
  check(g, m, s, SIM_OPTIMIZER_SGD);
}

/* ---------------------------------------------------------------------------------- */
/* Transformers                                                                         */

Test(exec, gpt_data_parallel)
{
  g_autoptr(SimGraph) g = gpt();
  g_autoptr(SimMachine) m = machine();
  g_autoptr(SimStrategy) s = sim_strategy_data_parallel(g, m, 4, NULL);
  check(g, m, s, SIM_OPTIMIZER_ADAM);
}

/* Sequence parallelism: every op splits its positions in two; attention's query shards
 * read whole key and value sequences and mask causally by global position. */
Test(exec, gpt_sequence_split)
{
  g_autoptr(SimGraph) g = gpt();
  g_autoptr(SimMachine) m = machine();
  g_autoptr(SimStrategy) s = sim_strategy_new(g, m);
  for (int op = 0; op < sim_graph_n_ops(g); op++) {
    if (dim_named(g, op, "s") >= 0)
      split(s, g, op, "s", 2, 0);
    else
      split(s, g, op, "d1", 2, 0);
  }
  check(g, m, s, SIM_OPTIMIZER_SGD);
}

/* Attention heads over two devices: partial outputs summed, the output bias once. */
Test(exec, gpt_heads_split)
{
  g_autoptr(SimGraph) g = gpt();
  g_autoptr(SimMachine) m = machine();
  g_autoptr(SimStrategy) s = sim_strategy_new(g, m);
  for (int op = 0; op < sim_graph_n_ops(g); op++)
    if (sim_graph_op_type(g, op) == SIM_OP_ATTENTION)
      split(s, g, op, "h", 2, 1);
  check(g, m, s, SIM_OPTIMIZER_ADAM);
}

/* Vocabulary-parallel embedding, output layer (tied to the embedding) and loss. */
Test(exec, gpt_vocab_parallel)
{
  g_autoptr(SimGraph) g = gpt();
  g_autoptr(SimMachine) m = machine();
  g_autoptr(SimStrategy) s = sim_strategy_new(g, m);
  split(s, g, sim_graph_op_by_name(g, "embed"), "v", 2, 0);
  split(s, g, sim_graph_op_by_name(g, "lm_head"), "n", 2, 0);
  split(s, g, sim_graph_op_by_name(g, "loss"), "c", 2, 0);
  check(g, m, s, SIM_OPTIMIZER_SGD);
}

Test(exec, gpt_megatron_tp)
{
  g_autoptr(SimGraph) g = gpt();
  g_autoptr(SimMachine) m = machine();
  SimMegatronOptions o = sim_megatron_options_default();
  o.tp = 4;
  GError *error = NULL;
  g_autoptr(SimStrategy) s = sim_strategy_megatron(g, m, &o, &error);
  cr_assert_not_null(s, "%s", error ? error->message : "");
  check(g, m, s, SIM_OPTIMIZER_ADAM);
}

/* Megatron's tensor parallelism on LLaMA blocks: key-value heads and the SwiGLU's width
 * split in two, with two data-parallel replicas. */
Test(exec, llama_megatron_tp_dp)
{
  g_autoptr(SimGraph) g = llama();
  g_autoptr(SimMachine) m = machine();
  SimMegatronOptions o = sim_megatron_options_default();
  o.tp = 2;
  o.dp = 2;
  GError *error = NULL;
  g_autoptr(SimStrategy) s = sim_strategy_megatron(g, m, &o, &error);
  cr_assert_not_null(s, "%s", error ? error->message : "");
  check(g, m, s, SIM_OPTIMIZER_ADAM);
}

/* Query positions split in two: rotary angles and causal masks by global position. */
Test(exec, llama_sequence_split)
{
  g_autoptr(SimGraph) g = llama();
  g_autoptr(SimMachine) m = machine();
  g_autoptr(SimStrategy) s = sim_strategy_new(g, m);
  for (int op = 0; op < sim_graph_n_ops(g); op++) {
    if (dim_named(g, op, "s") >= 0)
      split(s, g, op, "s", 2, 0);
    else
      split(s, g, op, "d1", 2, 0);
  }
  check(g, m, s, SIM_OPTIMIZER_SGD);
}

/* The experts of every MoE layer over two devices (each holds two, routes every token and
 * adds its experts' share), then experts and their width over four. */
Test(exec, moe_experts_split)
{
  g_autoptr(SimGraph) g = moe();
  g_autoptr(SimMachine) m = machine();
  g_autoptr(SimStrategy) s = sim_strategy_new(g, m);
  for (int op = 0; op < sim_graph_n_ops(g); op++)
    if (sim_graph_op_type(g, op) == SIM_OP_MOE)
      split(s, g, op, "x", 2, 0);
  check(g, m, s, SIM_OPTIMIZER_ADAM);
}

Test(exec, moe_experts_and_width_split)
{
  g_autoptr(SimGraph) g = moe();
  g_autoptr(SimMachine) m = machine();
  g_autoptr(SimStrategy) s = sim_strategy_new(g, m);
  for (int op = 0; op < sim_graph_n_ops(g); op++) {
    if (sim_graph_op_type(g, op) != SIM_OP_MOE)
      continue;
    int degrees[8] = { 1, 1, 2, 2, 1, 1, 1, 1 };
    GError *error = NULL;
    cr_assert_eq(dim_named(g, op, "x"), 2);
    cr_assert_eq(dim_named(g, op, "f"), 3);
    cr_assert(sim_strategy_set_op(s, op, degrees, (int[]){ 0, 1, 2, 3 }, &error), "%s",
              error ? error->message : "");
  }
  check(g, m, s, SIM_OPTIMIZER_SGD);
}

/* Megatron's expert parallelism: dp 4, ep 2 (each pair of replicas splits the experts,
 * each replica's tokens reach both halves), and with tp 2 on top. */
Test(exec, moe_megatron_expert_parallel)
{
  g_autoptr(SimGraph) g = moe();
  g_autoptr(SimMachine) m = machine();
  for (int tp = 1; tp <= 2; tp++) {
    SimMegatronOptions o = sim_megatron_options_default();
    o.dp = 4;
    o.ep = 2;
    o.tp = tp;
    GError *error = NULL;
    g_autoptr(SimStrategy) s = sim_strategy_megatron(g, m, &o, &error);
    cr_assert_not_null(s, "%s", error ? error->message : "");
    check(g, m, s, SIM_OPTIMIZER_ADAM);
  }
}

/* Expert tensor parallelism 1 beside tp 2 (Megatron-Core's expert layout with its own
 * degrees): dp 4, tp 2 on 8 devices, ep 4, etp 1, with and without sequence parallelism:
 * two expert groups of four devices, each holding one whole expert and exchanging the
 * tokens of its group's two replicas.  Then ep 2, etp 1: four groups of one replica's two
 * tensor-parallel ranks. */
Test(exec, moe_megatron_expert_tensor_parallel_one)
{
  g_autoptr(SimGraph) g = moe();
  g_autoptr(SimMachine) m = machine();
  for (int ep = 2; ep <= 4; ep *= 2)
    for (int sp = 0; sp <= 1; sp++) {
      SimMegatronOptions o = sim_megatron_options_default();
      o.dp = 4;
      o.tp = 2;
      o.ep = ep;
      o.etp = 1;
      o.sequence_parallel = sp;
      GError *error = NULL;
      g_autoptr(SimStrategy) s = sim_strategy_megatron(g, m, &o, &error);
      cr_assert_not_null(s, "%s", error ? error->message : "");
      check(g, m, s, SIM_OPTIMIZER_ADAM);
    }
}

/* Megatron's plan on the mixture: tp 2 splits every expert's width, dp 2. */
Test(exec, moe_megatron_tp_dp)
{
  g_autoptr(SimGraph) g = moe();
  g_autoptr(SimMachine) m = machine();
  SimMegatronOptions o = sim_megatron_options_default();
  o.tp = 2;
  o.dp = 2;
  GError *error = NULL;
  g_autoptr(SimStrategy) s = sim_strategy_megatron(g, m, &o, &error);
  cr_assert_not_null(s, "%s", error ? error->message : "");
  check(g, m, s, SIM_OPTIMIZER_ADAM);
}

/* Megatron's plan with TP 2, PP 2, DP 2, pipeline messages whole or scatter-gathered. */
static SimStrategy *megatron_3d(const SimGraph *g, SimMachine *m, gboolean scatter_gather)
{
  SimMegatronOptions o = sim_megatron_options_default();
  o.tp = 2;
  o.pp = 2;
  o.dp = 2;
  o.scatter_gather = scatter_gather;
  GError *error = NULL;
  SimStrategy *s = sim_strategy_megatron(g, m, &o, &error);
  cr_assert_not_null(s, "%s", error ? error->message : "");
  return s;
}

Test(exec, gpt_megatron_3d)
{
  g_autoptr(SimGraph) g = gpt();
  g_autoptr(SimMachine) m = machine();
  g_autoptr(SimStrategy) s = megatron_3d(g, m, FALSE);
  check(g, m, s, SIM_OPTIMIZER_SGD);
}

/* Megatron's scatter-gather of pipeline messages: the activations and gradients that
 * cross stages travel in parts, which the receiving ranks pass on to each other; the run
 * still matches one device. */
Test(exec, gpt_megatron_3d_scatter_gather)
{
  g_autoptr(SimGraph) g = gpt();
  g_autoptr(SimMachine) m = machine();
  g_autoptr(SimStrategy) s = megatron_3d(g, m, TRUE);
  GError *error = NULL;
  g_autoptr(SimPlan) plan = sim_plan_new(g, m, s, NULL, &error);
  cr_assert_not_null(plan, "%s", error ? error->message : "");
  int relays[2] = { 0, 0 };
  for (int i = 0; i < sim_plan_n_tasks(plan); i++) {
    SimPlanTask t;
    sim_plan_task(plan, i, &t);
    if (t.kind == SIM_PLAN_COPY && t.relay)
      relays[t.grad]++;
  }
  cr_assert_gt(relays[0], 0, "activations passed on");
  cr_assert_gt(relays[1], 0, "gradients passed on");
  check(g, m, s, SIM_OPTIMIZER_ADAM);
}

/* BERT ties its output layer to the embedding and gives it a bias of its own, which data
 * parallelism must synchronize like any weight. */
Test(exec, bert_data_parallel)
{
  g_autoptr(SimGraph) g = zoo("bert-base", "layers=1,hidden=32,heads=2,seq=8,vocab=64,batch=4,"
                                           "positions=8");
  g_autoptr(SimMachine) m = machine();
  g_autoptr(SimStrategy) s = sim_strategy_data_parallel(g, m, 2, NULL);
  check(g, m, s, SIM_OPTIMIZER_SGD);
}

/* The encoder-decoder Transformer: cross attention over the encoder's output, heads split. */
Test(exec, transformer_heads_split)
{
  g_autoptr(SimGraph) g = zoo("transformer", "encoder_layers=1,decoder_layers=1,hidden=32,"
                                             "ffn=64,heads=2,seq=8,vocab=64,batch=4");
  g_autoptr(SimMachine) m = machine();
  g_autoptr(SimStrategy) s = sim_strategy_new(g, m);
  for (int op = 0; op < sim_graph_n_ops(g); op++)
    if (sim_graph_op_type(g, op) == SIM_OP_ATTENTION)
      split(s, g, op, "h", 2, 0);
  check(g, m, s, SIM_OPTIMIZER_ADAM);
}

/* ---------------------------------------------------------------------------------- */
/* Recurrent networks                                                                   */

Test(exec, rnnlm_data_parallel)
{
  g_autoptr(SimGraph) g = rnnlm();
  g_autoptr(SimMachine) m = machine();
  g_autoptr(SimStrategy) s = sim_strategy_data_parallel(g, m, 2, NULL);
  check(g, m, s, SIM_OPTIMIZER_ADAM);
}

/* Each LSTM chunk on its own device: the chunks of a layer share its weights across
 * devices, and the copies exchange gradients. */
Test(exec, rnnlm_chunks_on_devices)
{
  g_autoptr(SimGraph) g = rnnlm();
  g_autoptr(SimMachine) m = machine();
  g_autoptr(SimStrategy) s = sim_strategy_new(g, m);
  int k = 0;
  for (int op = 0; op < sim_graph_n_ops(g); op++)
    if (sim_graph_op_type(g, op) == SIM_OP_LSTM)
      split(s, g, op, "b", 1, k++ % 4);
  check(g, m, s, SIM_OPTIMIZER_SGD);
}

/* ---------------------------------------------------------------------------------- */
/* Pipelines                                                                            */

Test(exec, mlp_pipeline_1f1b)
{
  g_autoptr(SimGraph) g = mlp();
  g_autoptr(SimMachine) m = machine();
  g_autoptr(SimStrategy) s = sim_strategy_new(g, m);
  pipeline(s, g, 3, 3, 4, SIM_SCHEDULE_1F1B);
  check(g, m, s, SIM_OPTIMIZER_SGD);
}

Test(exec, cnn_pipeline_gpipe)
{
  g_autoptr(SimGraph) g = small_cnn();
  g_autoptr(SimMachine) m = machine();
  g_autoptr(SimStrategy) s = sim_strategy_new(g, m);
  pipeline(s, g, 2, 2, 2, SIM_SCHEDULE_GPIPE);
  check(g, m, s, SIM_OPTIMIZER_ADAM);
}

/* The tied embedding and output layer sit on the first and last stages: the last keeps a
 * copy of the table and exchanges gradients with the first. */
Test(exec, gpt_pipeline_gpipe)
{
  g_autoptr(SimGraph) g = gpt();
  g_autoptr(SimMachine) m = machine();
  g_autoptr(SimStrategy) s = sim_strategy_new(g, m);
  pipeline(s, g, 2, 2, 4, SIM_SCHEDULE_GPIPE);
  check(g, m, s, SIM_OPTIMIZER_SGD);
}

Test(exec, gpt_pipeline_1f1b)
{
  g_autoptr(SimGraph) g = gpt();
  g_autoptr(SimMachine) m = machine();
  g_autoptr(SimStrategy) s = sim_strategy_new(g, m);
  pipeline(s, g, 4, 4, 4, SIM_SCHEDULE_1F1B);
  check(g, m, s, SIM_OPTIMIZER_ADAM);
}

/* Four stages on two devices, two model chunks each. */
Test(exec, gpt_pipeline_interleaved)
{
  g_autoptr(SimGraph) g = gpt();
  g_autoptr(SimMachine) m = machine();
  g_autoptr(SimStrategy) s = sim_strategy_new(g, m);
  pipeline(s, g, 4, 2, 4, SIM_SCHEDULE_INTERLEAVED);
  check(g, m, s, SIM_OPTIMIZER_SGD);
}

/* The LSTM chunks of one layer land on different stages and share the layer's weights. */
Test(exec, rnnlm_pipeline)
{
  g_autoptr(SimGraph) g = rnnlm();
  g_autoptr(SimMachine) m = machine();
  g_autoptr(SimStrategy) s = sim_strategy_new(g, m);
  pipeline(s, g, 3, 3, 2, SIM_SCHEDULE_1F1B);
  check(g, m, s, SIM_OPTIMIZER_ADAM);
}

/* ---------------------------------------------------------------------------------- */
/* Recomputation and sharded optimizer states                                           */

/* Every layer recomputed from its checkpointed input before its backward pass; the
 * executor poisons the dropped activations, so only recomputed values can be used. */
Test(exec, gpt_recompute_full)
{
  g_autoptr(SimGraph) g = gpt();
  g_autoptr(SimMachine) m = machine();
  g_autoptr(SimStrategy) s = sim_strategy_data_parallel(g, m, 2, NULL);
  sim_strategy_set_microbatches(s, 2);
  set_recompute(s, SIM_RECOMPUTE_FULL);
  check(g, m, s, SIM_OPTIMIZER_SGD);
}

Test(exec, gpt_recompute_selective)
{
  g_autoptr(SimGraph) g = gpt();
  g_autoptr(SimMachine) m = machine();
  g_autoptr(SimStrategy) s = sim_strategy_new(g, m);
  pipeline(s, g, 2, 2, 2, SIM_SCHEDULE_1F1B);
  set_recompute(s, SIM_RECOMPUTE_SELECTIVE);
  check(g, m, s, SIM_OPTIMIZER_ADAM);
}

Test(exec, gpt_zero1)
{
  g_autoptr(SimGraph) g = gpt();
  g_autoptr(SimMachine) m = machine();
  g_autoptr(SimStrategy) s = sim_strategy_data_parallel(g, m, 4, NULL);
  SimMemoryOptions mo = sim_strategy_get_memory(s);
  mo.zero1 = TRUE;
  sim_strategy_set_memory(s, &mo);
  check(g, m, s, SIM_OPTIMIZER_ADAM);
}

/* The optimizer offloaded to the host changes where the update runs, not what it
 * computes: the recorded plan is the one without it, and the values equal one device's. */
Test(exec, gpt_zero1_offloaded_optimizer)
{
  g_autoptr(SimGraph) g = gpt();
  g_autoptr(SimMachine) m = machine();
  g_autoptr(SimStrategy) s = sim_strategy_data_parallel(g, m, 4, NULL);
  SimMemoryOptions mo = sim_strategy_get_memory(s);
  mo.zero1 = TRUE;
  mo.offload = 1;
  sim_strategy_set_memory(s, &mo);
  cr_assert_eq(sim_strategy_get_memory(s).offload, 1);
  check(g, m, s, SIM_OPTIMIZER_ADAM);
}

/* Megatron with sharded optimizer states and full recomputation. */
Test(exec, gpt_megatron_zero1_recompute)
{
  g_autoptr(SimGraph) g = gpt();
  g_autoptr(SimMachine) m = machine();
  SimMegatronOptions o = sim_megatron_options_default();
  o.tp = 2;
  o.dp = 2;
  o.memory.zero1 = TRUE;
  o.memory.recompute = SIM_RECOMPUTE_FULL;
  GError *error = NULL;
  g_autoptr(SimStrategy) s = sim_strategy_megatron(g, m, &o, &error);
  cr_assert_not_null(s, "%s", error ? error->message : "");
  check(g, m, s, SIM_OPTIMIZER_ADAM);
}

/* ---------------------------------------------------------------------------------- */
/* Context parallelism and ZeRO-3                                                       */

static SimStrategy *megatron(const SimGraph *g, SimMachine *m, const SimMegatronOptions *o)
{
  GError *error = NULL;
  SimStrategy *s = sim_strategy_megatron(g, m, o, &error);
  cr_assert_not_null(s, "%s", error ? error->message : "");
  return s;
}

/* Every attention shard of @s's plan reads the keys and values of its own 1 / @n of the
 * positions only: the rest reaches it through the executor's ring (exec/compile-ring.c),
 * and since activations are poisoned, a shard that read more would compute NaN. */
static void expect_ring(const SimGraph *g, SimMachine *m, const SimStrategy *s, int n)
{
  GError *error = NULL;
  g_autoptr(SimPlan) plan = sim_plan_new(g, m, s, NULL, &error);
  cr_assert_not_null(plan, "%s", error ? error->message : "");
  int rings = 0;
  for (int op = 0; op < sim_graph_n_ops(g); op++) {
    if (sim_graph_op_type(g, op) != SIM_OP_ATTENTION)
      continue;
    int64_t S = sim_graph_tensor_shape(g, sim_graph_op_input(g, op, 1)).dims[1];
    int ns;
    sim_strategy_op_devices(s, op, &ns);
    for (int sh = 0; sh < ns; sh++) {
      SimRegion q, k;
      sim_plan_shard_region(plan, op, sh, SIM_TENSOR_INPUT, 0, &q);
      sim_plan_shard_region(plan, op, sh, SIM_TENSOR_INPUT, 1, &k);
      cr_assert_eq(k.hi[1] - k.lo[1], S / n, "%s shard %d reads %" G_GINT64_FORMAT " of %"
                   G_GINT64_FORMAT " keys", sim_graph_op_name(g, op), sh, k.hi[1] - k.lo[1], S);
      cr_assert(k.lo[1] == q.lo[1] && k.hi[1] == q.hi[1]);
      rings++;
    }
  }
  cr_assert_gt(rings, 0);
}

/* check() of a context-parallel plan of the small LLaMA (causal attention over its 8
 * positions, 2 layers, 4 samples, 2 key-value heads) on @n devices that also counts each
 * device's causal work in the ring: Megatron's two-chunk layout gives every device the
 * same share, 1 / n of the one-device total, 2 layers x 4 samples x 2 heads x 8 x 9 / 2
 * pairs a step.  (The plan's contiguous positions would give a ring of two 10 and 26 pairs
 * a sample and head.) */
static void check_balanced(const SimGraph *g, SimMachine *m, SimStrategy *s, int n)
{
  count_ring_pairs = TRUE;
  check(g, m, s, SIM_OPTIMIZER_ADAM);
  count_ring_pairs = FALSE;
  gint64 total = (gint64)STEPS * 2 * 4 * 2 * (8 * 9 / 2);
  for (int d = 0; d < n; d++)
    cr_expect_eq(ring_pairs[d], total / n, "device %d: %" G_GINT64_FORMAT " causal pairs in "
                 "its ring steps, %" G_GINT64_FORMAT " expected", d, ring_pairs[d], total / n);
  for (int d = n; d < MAX_COUNTED; d++)
    cr_expect_eq(ring_pairs[d], 0);
}

/* Context parallelism: every op's positions over two context ranks, two data-parallel
 * replicas of them; attention runs as a ring of the two context ranks' shards, each
 * holding its own keys and values (grouped-query, rotary, causal). */
Test(exec, llama_context_parallel)
{
  g_autoptr(SimGraph) g = llama();
  g_autoptr(SimMachine) m = machine();
  SimMegatronOptions o = sim_megatron_options_default();
  o.cp = 2;
  o.dp = 2;
  g_autoptr(SimStrategy) s = megatron(g, m, &o);
  cr_assert_eq(sim_strategy_get_context_parallel(s), 2);
  expect_ring(g, m, s, 2);
  check_balanced(g, m, s, 4);
}

/* A ring of four (two positions a rank, one in each of its chunks): every query block
 * meets blocks that the causal mask hides whole, partly and not at all; the causal work
 * is the same on the four devices; then the same in two micro-batches with full
 * recomputation, the ring run again before each backward. */
Test(exec, llama_context_parallel_ring_of_four)
{
  g_autoptr(SimGraph) g = llama();
  g_autoptr(SimMachine) m = machine();
  for (int rc = 0; rc <= 1; rc++) {
    SimMegatronOptions o = sim_megatron_options_default();
    o.cp = 4;
    if (rc) {
      o.microbatches = 2;
      o.memory.recompute = SIM_RECOMPUTE_FULL;
    }
    g_autoptr(SimStrategy) s = megatron(g, m, &o);
    expect_ring(g, m, s, 4);
    if (rc)
      check(g, m, s, SIM_OPTIMIZER_ADAM);
    else
      check_balanced(g, m, s, 4);
  }
}

/* GPT's attention (biases, dropout on the probabilities, causal) as a ring of four; then
 * a ring of two under selective recomputation in two micro-batches (the attention core,
 * so the ring, run again before each backward). */
Test(exec, gpt_context_parallel_ring_of_four)
{
  g_autoptr(SimGraph) g = gpt();
  g_autoptr(SimMachine) m = machine();
  for (int cp = 4; cp >= 2; cp -= 2) {
    SimMegatronOptions o = sim_megatron_options_default();
    o.cp = cp;
    if (cp == 2) {
      o.microbatches = 2;
      o.memory.recompute = SIM_RECOMPUTE_SELECTIVE;
    }
    g_autoptr(SimStrategy) s = megatron(g, m, &o);
    expect_ring(g, m, s, cp);
    check(g, m, s, SIM_OPTIMIZER_SGD);
  }
}

/* Context parallelism inside tensor parallelism (tp 2, cp 2, sequence parallelism), and
 * with a pipeline of two stages (tp 2, cp 2, pp 2). */
Test(exec, gpt_context_and_tensor_parallel)
{
  g_autoptr(SimGraph) g = gpt();
  g_autoptr(SimMachine) m = machine();
  for (int pp = 1; pp <= 2; pp++) {
    SimMegatronOptions o = sim_megatron_options_default();
    o.cp = 2;
    o.tp = 2;
    o.pp = pp;
    o.sequence_parallel = TRUE;
    g_autoptr(SimStrategy) s = megatron(g, m, &o);
    check(g, m, s, SIM_OPTIMIZER_SGD);
  }
}

/* Context and expert parallelism together on the mixture: cp 2, dp 2 with the experts
 * over both replicas (ep 2), each expert group exchanging the tokens of one context
 * rank; then with tp 2 splitting every expert's width as well. */
Test(exec, moe_context_and_expert_parallel)
{
  g_autoptr(SimGraph) g = moe();
  g_autoptr(SimMachine) m = machine();
  for (int tp = 1; tp <= 2; tp++) {
    SimMegatronOptions o = sim_megatron_options_default();
    o.cp = 2;
    o.dp = 2;
    o.ep = 2;
    o.tp = tp;
    o.sequence_parallel = tp > 1;
    g_autoptr(SimStrategy) s = megatron(g, m, &o);
    check(g, m, s, SIM_OPTIMIZER_ADAM);
  }
}

/* A ZeRO-3 plan gathers weights before every micro-batch's forward and backward and
 * reduce-scatters after every backward: at least 2 M gathers and M reduce-scatters. */
static void expect_zero3_plan(const SimGraph *g, SimMachine *m, const SimStrategy *s)
{
  GError *error = NULL;
  g_autoptr(SimPlan) plan = sim_plan_new(g, m, s, NULL, &error);
  cr_assert_not_null(plan, "%s", error ? error->message : "");
  int gathers = 0, scatters = 0, M = sim_plan_microbatches(plan);
  for (int i = 0; i < sim_plan_n_tasks(plan); i++) {
    SimPlanTask t;
    sim_plan_task(plan, i, &t);
    gathers += t.kind == SIM_PLAN_GATHER_PARAMS;
    scatters += t.kind == SIM_PLAN_SYNC && t.sharded;
  }
  cr_assert_geq(gathers, 2 * M, "%d gathers, %d micro-batches", gathers, M);
  cr_assert_geq(scatters, M, "%d reduce-scatters, %d micro-batches", scatters, M);
}

static void set_zero3(SimStrategy *s)
{
  SimMemoryOptions mo = sim_strategy_get_memory(s);
  mo.zero1 = mo.zero2 = mo.zero3 = TRUE;
  sim_strategy_set_memory(s, &mo);
}

/* ZeRO-3 over four replicas, two micro-batches: each keeps its quarter of the weights. */
Test(exec, gpt_zero3)
{
  g_autoptr(SimGraph) g = gpt();
  g_autoptr(SimMachine) m = machine();
  g_autoptr(SimStrategy) s = sim_strategy_data_parallel(g, m, 4, NULL);
  sim_strategy_set_microbatches(s, 2);
  set_zero3(s);
  cover_devices(s, g);
  expect_zero3_plan(g, m, s);
  check(g, m, s, SIM_OPTIMIZER_ADAM);
}

/* ZeRO-3 under Megatron's tensor and pipeline parallelism (tp 2, pp 2, dp 2), with full
 * recomputation (the recomputed forward needs the weights gathered again). */
Test(exec, llama_megatron_zero3_recompute)
{
  g_autoptr(SimGraph) g = llama();
  g_autoptr(SimMachine) m = machine();
  SimMegatronOptions o = sim_megatron_options_default();
  o.tp = 2;
  o.pp = 2;
  o.dp = 2;
  o.microbatches = 2;
  o.memory.zero1 = o.memory.zero2 = o.memory.zero3 = TRUE;
  o.memory.recompute = SIM_RECOMPUTE_FULL;
  g_autoptr(SimStrategy) s = megatron(g, m, &o);
  expect_zero3_plan(g, m, s);
  check(g, m, s, SIM_OPTIMIZER_ADAM);
}

/* Context parallelism with ZeRO-3: the weights sharded over all dp x cp ranks. */
Test(exec, llama_context_parallel_zero3)
{
  g_autoptr(SimGraph) g = llama();
  g_autoptr(SimMachine) m = machine();
  SimMegatronOptions o = sim_megatron_options_default();
  o.cp = 2;
  o.dp = 2;
  o.memory.zero1 = o.memory.zero2 = o.memory.zero3 = TRUE;
  g_autoptr(SimStrategy) s = megatron(g, m, &o);
  expect_zero3_plan(g, m, s);
  check(g, m, s, SIM_OPTIMIZER_ADAM);
}

/* ---------------------------------------------------------------------------------- */
/* The interface around the numbers                                                     */

Test(exec, registry)
{
  g_auto(GStrv) names = exec_backend_names();
  cr_assert(g_strv_contains((const char *const *)names, "cpu"));
  cr_assert_not_null(exec_backend_description("cpu"));
  GError *error = NULL;
  ExecBackend *b = exec_backend_new("no-such-back-end", &error);
  cr_assert_null(b);
  cr_assert(g_error_matches(error, EXEC_ERROR, EXEC_ERROR_UNKNOWN));
  cr_assert(strstr(error->message, "cpu") != NULL, "the message lists the back ends: %s",
            error->message);
  g_error_free(error);
}

/* Every simulated device of the cpu back end lives in the host's memory: buffers that
 * would add up to more than the host has are refused (the system would grant the pages
 * and end the program when they are written). */
Test(exec, the_cpu_back_end_refuses_more_memory_than_the_host_has)
{
  GError *error = NULL;
  g_autoptr(ExecBackend) b = exec_backend_new("cpu", &error);
  cr_assert(exec_backend_open(b, 2, &error));
  size_t host = (size_t)sysconf(_SC_PHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE);
  ExecBuffer *small = exec_backend_buffer_alloc(b, 0, 1 << 20, &error);
  cr_assert_not_null(small);
  ExecBuffer *big = exec_backend_buffer_alloc(b, 1, host, &error);
  cr_assert_null(big);
  cr_assert(g_error_matches(error, EXEC_ERROR, EXEC_ERROR_BACKEND));
  cr_assert(strstr(error->message, "device 1: the cpu back end would need more than the host's"),
            "%s", error->message);
  g_clear_error(&error);
  exec_backend_buffer_free(b, 0, small);
  g_clear_error(&error);
}

/* A fused activation cannot apply to partial sums: a split reduction under it is refused
 * when the plan is made, with a message that names the op. */
Test(exec, unsupported_plan)
{
  g_autoptr(SimGraph) g = mlp();
  g_autoptr(SimMachine) m = machine();
  g_autoptr(SimStrategy) s = sim_strategy_new(g, m);
  split(s, g, sim_graph_op_by_name(g, "tower0.fc0"), "k", 2, 0);
  cover_devices(s, g);
  GError *error = NULL;
  g_autoptr(SimPlan) plan = sim_plan_new(g, m, s, NULL, &error);
  cr_assert_null(plan);
  cr_assert(g_error_matches(error, SIM_ERROR, SIM_ERROR_INVALID));
  cr_assert(strstr(error->message, "tower0.fc0") != NULL, "%s", error->message);
  cr_assert(strstr(error->message, "partial sums") != NULL, "%s", error->message);
  g_error_free(error);
}

/* Copies of tied weights (the output layer's copy of the embedding) exchange gradients
 * with the owner's shards, each copy with one; where the copies paired with an owner
 * shard do not make up its part in disjoint pieces, the run is refused with a message
 * instead of summing wrong (six whole copies and two owner shards) or writing past a
 * buffer (one whole copy and a vocabulary split in two). */
Test(exec, tied_weight_copies_that_do_not_pair_with_the_owner_are_refused)
{
  g_autoptr(SimGraph) g = gpt();
  g_autoptr(SimMachine) m = machine();
  int embed = sim_graph_op_by_name(g, "embed"), head = sim_graph_op_by_name(g, "lm_head");
  struct {
    const char *edim;
    int en, efirst, hn, hfirst;
    const char *want;
  } cases[] = {
    { "b", 2, 0, 8, 0, "keeps 6 copies" },  /* owner on 0-1, copies on 2-7          */
    { "v", 2, 0, 1, 4, "keeps 1 copy" },    /* owner split over the vocabulary on 0-1 */
  };
  for (size_t k = 0; k < G_N_ELEMENTS(cases); k++) {
    g_autoptr(SimStrategy) s = sim_strategy_data_parallel(g, m, 8, NULL);
    cr_assert_not_null(s);
    split(s, g, embed, cases[k].edim, cases[k].en, cases[k].efirst);
    split(s, g, head, "b", cases[k].hn, cases[k].hfirst);
    GError *error = NULL;
    cr_assert(sim_strategy_validate(s, g, m, &error), "%s", error ? error->message : "");
    g_autoptr(SimPlan) plan = sim_plan_new(g, m, s, NULL, &error);
    cr_assert_not_null(plan, "%s", error ? error->message : "");
    g_autoptr(ExecBackend) b = exec_backend_new("cpu", &error);
    ExecOptions o = exec_options_default();
    g_autoptr(ExecRun) run = exec_run_new(b, plan, &o, &error);
    cr_assert_null(run);
    cr_assert(g_error_matches(error, EXEC_ERROR, EXEC_ERROR_UNSUPPORTED));
    cr_assert(strstr(error->message, cases[k].want) != NULL, "%s", error->message);
    g_error_free(error);
  }
  /* One copy for each owner shard, holding the same part; and two copies holding the
   * halves of one owner shard's part: both run, and match one device. */
  g_autoptr(SimStrategy) ok = sim_strategy_new(g, m);
  split(ok, g, embed, "v", 2, 0);
  split(ok, g, head, "n", 2, 2);
  check(g, m, ok, SIM_OPTIMIZER_SGD);
  g_autoptr(SimStrategy) halves = sim_strategy_new(g, m);
  split(halves, g, head, "k", 2, 2);
  check(g, m, halves, SIM_OPTIMIZER_SGD);
}

/* What the executor reads from a plan: every reduction names the op and micro-batch whose
 * partial results it sums, every copy the ops whose results it carries, and replicated
 * shards their copy. */
Test(exec, plan_semantics)
{
  g_autoptr(SimGraph) g = gpt();
  g_autoptr(SimMachine) m = machine();
  SimMegatronOptions mo = sim_megatron_options_default();
  mo.tp = 2;
  mo.pp = 2;
  GError *error = NULL;
  g_autoptr(SimStrategy) s = sim_strategy_megatron(g, m, &mo, &error);
  cr_assert_not_null(s, "%s", error ? error->message : "");
  g_autoptr(SimPlan) p = sim_plan_new(g, m, s, NULL, &error);
  cr_assert_not_null(p, "%s", error ? error->message : "");
  int reduces = 0, copies = 0;
  for (int i = 0; i < sim_plan_n_tasks(p); i++) {
    SimPlanTask t;
    sim_plan_task(p, i, &t);
    if (t.kind == SIM_PLAN_REDUCE) {
      reduces++;
      cr_assert_geq(t.op, 0, "reduction %d names no op", i);
      cr_assert(t.mb >= 0 && t.mb < sim_plan_microbatches(p));
    } else if (t.kind == SIM_PLAN_COPY) {
      copies++;
      cr_assert_geq(t.n_ops, 1, "copy %d carries no op's results", i);
      if (!t.grad)
        cr_assert_eq(t.n_ops, 1);
    }
  }
  cr_assert_gt(reduces, 0);
  cr_assert_gt(copies, 0);
  int ln = sim_graph_op_by_name(g, "layer0.ln1");
  int n;
  sim_strategy_op_devices(s, ln, &n);
  cr_assert_eq(n, 2, "the layer norm runs on both tensor-parallel ranks");
  cr_assert_eq(sim_plan_shard_copy(p, ln, 0), 0);
  cr_assert_eq(sim_plan_shard_copy(p, ln, 1), 1);
}

/* The measured timeline: every task that does something here has a start and an end in
 * order, the others -1, and it is written in the simulator's trace format. */
Test(exec, timeline)
{
  g_autoptr(SimGraph) g = mlp();
  g_autoptr(SimMachine) m = machine();
  g_autoptr(SimStrategy) s = sim_strategy_data_parallel(g, m, 2, NULL);
  GError *error = NULL;
  g_autoptr(SimPlan) p = sim_plan_new(g, m, s, NULL, &error);
  g_autoptr(ExecBackend) b = exec_backend_new("cpu", NULL);
  ExecOptions o = exec_options_default();
  g_autoptr(ExecRun) run = exec_run_new(b, p, &o, &error);
  cr_assert_not_null(run, "%s", error ? error->message : "");
  cr_assert(exec_run_step(run, &error), "%s", error ? error->message : "");
  cr_assert_eq(exec_run_steps_done(run), 1);
  const double *start = exec_run_task_start(run), *end = exec_run_task_end(run);
  int timed = 0;
  for (int i = 0; i < sim_plan_n_tasks(p); i++) {
    SimPlanTask t;
    sim_plan_task(p, i, &t);
    if (t.kind == SIM_PLAN_TIMING || t.kind == SIM_PLAN_JOIN) {
      cr_assert_eq(start[i], -1);
      continue;
    }
    cr_assert_geq(start[i], 0, "task %d did not run", i);
    cr_assert_geq(end[i], start[i]);
    cr_assert_leq(end[i], exec_run_step_time(run) + 1e-9);
    timed++;
  }
  cr_assert_gt(timed, 0);
  g_autofree char *dir = g_dir_make_tmp("parasol-exec-XXXXXX", NULL);
  g_autofree char *path = g_build_filename(dir, "trace.json", NULL);
  cr_assert(sim_plan_write_trace(p, start, end, path, &error), "%s",
            error ? error->message : "");
  g_autofree char *text = NULL;
  cr_assert(g_file_get_contents(path, &text, NULL, NULL));
  cr_assert(strstr(text, "traceEvents") != NULL);
  g_unlink(path);
  g_rmdir(dir);
}

/* ---------------------------------------------------------------------------------- */
/* The public input generator (exec_input_values, docs/exec-dump.md).                   */

Test(inputs, positions_are_0_to_seq_minus_1_and_the_rest_follows_the_documented_formula)
{
  g_autoptr(SimGraph) g = zoo("gpt", "layers=1,hidden=32,heads=2,seq=8,vocab=64,batch=4");
  int pos = -1, tok = -1;
  for (int t = 0; t < sim_graph_n_tensors(g); t++) {
    if (!strcmp(sim_graph_tensor_name(g, t), "positions"))
      pos = t;
    if (!strcmp(sim_graph_tensor_name(g, t), "tokens"))
      tok = t;
  }
  cr_assert(pos >= 0 && tok >= 0);
  int64_t v[4 * 8];
  exec_input_values(g, pos, 2, 5, v);
  for (int k = 0; k < 4 * 8; k++)
    cr_expect_eq(v[k], k % 8, "positions[%d][%d] = %ld", k / 8, k % 8, (long)v[k]);
  /* Tokens: floor(u * 64), u = exec_hash_uniform("tokens", k, seed * 1000003 + step). */
  exec_input_values(g, tok, 2, 5, v);
  for (int k = 0; k < 4 * 8; k++)
    cr_expect_eq(v[k], (int64_t)(exec_hash_uniform("tokens", (uint64_t)k, 5 * 1000003 + 2) * 64));
  /* Floating-point inputs: 2u - 1. */
  g_autoptr(SimGraph) m = mlp();
  int x = sim_graph_op_output(m, 0, 0);
  SimShape s = sim_graph_tensor_shape(m, x);
  g_autofree float *f = g_new(float, sim_shape_numel(&s));
  exec_input_values(m, x, 1, 1, f);
  const char *name = sim_graph_tensor_name(m, x);
  for (int64_t k = 0; k < sim_shape_numel(&s); k++)
    cr_expect_eq(f[k], (float)(2 * exec_hash_uniform(name, (uint64_t)k, 1000003 + 1) - 1));
}

/* Cross entropy over classes split four ways, two shards a device: each device merges
 * its two shards' statistics (the online softmax's rescaling) before the devices
 * combine theirs. */
Test(exec, loss_classes_split_twice_on_each_device)
{
  g_autoptr(SimGraph) g = mlp();
  g_autoptr(SimMachine) m = machine();
  g_autoptr(SimStrategy) s = sim_strategy_new(g, m);
  int op = sim_graph_op_by_name(g, "loss");
  int d = dim_named(g, op, "c");
  cr_assert_geq(d, 0);
  int degrees[8] = { 1, 1, 1, 1, 1, 1, 1, 1 };
  degrees[d] = 4;
  static const int devices[4] = { 0, 0, 1, 1 };
  GError *error = NULL;
  cr_assert(sim_strategy_set_op(s, op, degrees, devices, &error), "%s",
            error ? error->message : "");
  check(g, m, s, SIM_OPTIMIZER_SGD);
}
