/* test-simulate.c — whole iterations against closed forms, properties on random
 * strategies, folding against the unfolded simulation, and delta against full
 * simulation.
 *
 * The closed-form tests use a machine of 4 GPUs on one NVSwitch with 100 GB/s per
 * direction and 1 us per link (2 us per GPU-to-GPU route), so that transfers are plain
 * arithmetic: bytes / (100 GB/s x e) + 2 us, where e is the achieved fraction of link
 * bandwidth (sim_coll_params_default); compute times come from the cost model itself,
 * which these tests take as given.
 *
 * About 2,500 lines: tests/meson.build builds one program per module, and this is the
 * simulator's whole iteration; its suites (closed forms, memory, lowering, folding, delta,
 * brief runs) share the machines and models defined here. */
#include <criterion/criterion.h>
#include <glib/gstdio.h>
#include <json-glib/json-glib.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "taskgraph.h"
#include "collective.h"
#include "lower.h"
#include "engine.h"
#include "machine-memory.h"

static const char *switch4_json =
  "{ \"format\": \"parasol-machine\", \"version\": 1, \"name\": \"switch4\","
  "  \"node\": { \"gpu\": \"a100-80gb\", \"gpus\": 4,"
  "    \"fabric\": { \"type\": \"nvswitch\", \"bandwidth_GBps\": %g, \"latency_us\": %g },"
  "    \"pcie\": { \"bandwidth_GBps\": 16, \"latency_us\": 1, \"sockets\": 1, \"switches\": 1 } },"
  "  \"count\": 1 }";

static SimMachine *switch4_latency(double gbps, double latency_us)
{
  g_autofree char *text = g_strdup_printf(switch4_json, gbps, latency_us);
  GError *error = NULL;
  SimMachine *m = sim_machine_from_json(text, "switch4.json", 0, &error);
  cr_assert_not_null(m, "%s", error ? error->message : "");
  return m;
}

static SimMachine *switch4(double gbps)
{
  return switch4_latency(gbps, 1);
}

static SimCostModel *roofline(void)
{
  SimRooflineParams p = sim_roofline_params_default();
  return sim_cost_model_new_roofline(&p);
}

static SimGraph *zoo(const char *name, const char *params)
{
  g_autoptr(SimModelParams) p = sim_model_params_new();
  GError *error = NULL;
  if (params)
    cr_assert(sim_model_params_parse(p, params, &error));
  SimGraph *g = sim_zoo_build(name, p, &error);
  cr_assert_not_null(g, "%s", error ? error->message : "");
  return g;
}

/* The merging tests' GPT: 8 layers, h 256, 32 sequences of 128 tokens, in fp16. */
static SimGraph *accel_gpt(void)
{
  SimGraph *g = zoo("gpt", "layers=8,hidden=256,heads=8,seq=128,vocab=1024,batch=32");
  sim_graph_set_float_dtype(g, SIM_DTYPE_FP16);
  return g;
}

static double simulate(const SimGraph *g, SimMachine *m, const SimStrategy *s, SimCostModel *c,
                       const SimOptions *o)
{
  GError *error = NULL;
  g_autoptr(SimReport) r = sim_simulate(g, m, s, c, o, &error);
  cr_assert_not_null(r, "%s", error ? error->message : "");
  return sim_report_iteration_time(r);
}

/* A plan that leaves GPUs idle is measured against the GPUs it uses: the same one-GPU run
 * on a 4-GPU switch and on a 1-GPU machine reports the same model FLOP utilization. */
Test(report, utilization_counts_the_gpus_the_plan_uses)
{
  g_autoptr(SimGraph) g = zoo("mlp", "layers=2,hidden=1024,batch=64");
  sim_graph_set_float_dtype(g, SIM_DTYPE_FP16);
  g_autoptr(SimMachine) four = switch4(100);
  g_autoptr(SimCostModel) c = roofline();
  SimMegatronOptions mo = sim_megatron_options_default();
  GError *error = NULL;
  g_autoptr(SimStrategy) one = sim_strategy_megatron(g, four, &mo, &error);
  cr_assert_not_null(one, "%s", error ? error->message : "");
  SimOptions o = sim_options_default();
  g_autoptr(SimReport) r1 = sim_simulate(g, four, one, c, &o, &error);
  cr_assert_not_null(r1, "%s", error ? error->message : "");
  mo.dp = 4;
  g_autoptr(SimStrategy) all = sim_strategy_megatron(g, four, &mo, &error);
  cr_assert_not_null(all, "%s", error ? error->message : "");
  g_autoptr(SimReport) r4 = sim_simulate(g, four, all, c, &o, &error);
  cr_assert_not_null(r4, "%s", error ? error->message : "");
  /* One GPU does all the work in t1: its utilization is F / (t1 P); four GPUs share it
   * in t4: F / (t4 4P). */
  double F = sim_graph_forward_flops(g) + sim_graph_backward_flops(g);
  double P = sim_machine_device_spec(four, 0)->peak_flops[SIM_DTYPE_FP16];
  cr_assert_float_eq(sim_report_mfu(r1), F / (sim_report_iteration_time(r1) * P),
                     1e-9 * sim_report_mfu(r1));
  cr_assert_float_eq(sim_report_mfu(r4), F / (sim_report_iteration_time(r4) * 4 * P),
                     1e-9 * sim_report_mfu(r4));
}

/* ---------------------------------------------------------------------------------- */
/* Closed forms                                                                         */

Test(closed_form, one_gpu_is_the_sum_of_operator_times)
{
  /* Everything on GPU 0, one micro-batch: nothing overlaps and nothing moves, so the
   * iteration is the sum over operators of forward + backward + update. */
  g_autoptr(SimGraph) g = zoo("mlp", "layers=3,hidden=512,input=256,classes=64,batch=32");
  g_autoptr(SimMachine) m = switch4(100);
  g_autoptr(SimCostModel) c = roofline();
  g_autoptr(SimStrategy) s = sim_strategy_new(g, m);
  const SimDeviceSpec *spec = sim_machine_device_spec(m, 0);
  double expect = 0;
  for (int x = 0; x < sim_graph_n_ops(g); x++) {
    if (sim_graph_op_type(g, x) == SIM_OP_INPUT)
      continue;
    expect += sim_cost_model_op_time(c, spec, g, x, NULL, SIM_PASS_FORWARD);
    expect += sim_cost_model_op_time(c, spec, g, x, NULL, SIM_PASS_BACKWARD);
    if (sim_graph_op_n_weights(g, x) > 0)
      expect += sim_cost_model_op_time(c, spec, g, x, NULL, SIM_PASS_UPDATE);
  }
  SimOptions o = sim_options_default();
  double t = simulate(g, m, s, c, &o);
  cr_assert_float_eq(t, expect, expect * 1e-12, "%g vs %g", t, expect);
}

Test(closed_form, a_host_bound_gpu_issues_the_optimizer_step_in_few_launches)
{
  /* Everything on GPU 0 with the host taking 1 s to issue a kernel: the host bounds the
   * iteration.  It issues every forward and backward kernel (K of them) before the last
   * backward task, the first layer's, starts at K s; the updates follow that task on the
   * device without a kernel of their own to issue (multi-tensor launches), so the
   * iteration is K s + that task + every update. */
  g_autoptr(SimGraph) g = zoo("mlp", "layers=3,hidden=512,input=256,classes=64,batch=32");
  g_autoptr(SimMachine) m = switch4(100);
  g_autoptr(SimCostModel) c = roofline();
  g_autoptr(SimStrategy) s = sim_strategy_new(g, m);
  const SimDeviceSpec *spec = sim_machine_device_spec(m, 0);
  double kernels = 0, updates = 0, last = -1;
  for (int x = 0; x < sim_graph_n_ops(g); x++) {
    if (sim_graph_op_type(g, x) == SIM_OP_INPUT)
      continue;
    for (int pass = SIM_PASS_FORWARD; pass <= SIM_PASS_BACKWARD; pass++) {
      SimWork w = { 0 };
      sim_graph_op_work(g, x, NULL, (SimPass)pass, &w);
      kernels += w.n;
    }
    if (last < 0)
      last = sim_cost_model_op_time(c, spec, g, x, NULL, SIM_PASS_BACKWARD);
    if (sim_graph_op_n_weights(g, x) > 0)
      updates += sim_cost_model_op_time(c, spec, g, x, NULL, SIM_PASS_UPDATE);
  }
  cr_assert_gt(kernels, 0);
  cr_assert_gt(updates, 0);
  SimOptions o = sim_options_default();
  o.host_kernel_time = 1.0;
  double t = simulate(g, m, s, c, &o);
  double expect = kernels + last + updates;
  cr_assert_float_eq(t, expect, expect * 1e-12, "%.9g vs %.9g", t, expect);
}

/* A chain of @p equal linear layers [b, h] -> [b, h], without a loss, one per stage. */
static SimGraph *chain(int p, int64_t batch, int64_t h)
{
  SimGraph *g = sim_graph_new("chain");
  int64_t dims[2] = { batch, h };
  int x = sim_graph_input(g, "x", SIM_DTYPE_FP16, 2, dims);
  for (int i = 0; i < p; i++) {
    char name[16];
    g_snprintf(name, sizeof name, "fc%d", i);
    x = sim_graph_linear(g, name, x, h, FALSE, SIM_UNARY_IDENTITY);
  }
  GError *error = NULL;
  cr_assert(sim_graph_check(g, &error));
  return g;
}

static SimStrategy *pipeline(const SimGraph *g, SimMachine *m, int p, int mbs,
                             SimSchedule sched)
{
  SimStrategy *s = sim_strategy_new(g, m);
  int n = sim_graph_n_ops(g);
  int *stage = g_new(int, n);
  int **devs = g_new(int *, p);
  int *ndev = g_new(int, p);
  for (int i = 0; i < p; i++) {
    devs[i] = g_new(int, 1);
    devs[i][0] = i;
    ndev[i] = 1;
  }
  GError *error = NULL;
  for (int x = 0; x < n; x++) {
    stage[x] = x == 0 ? 0 : x - 1; /* the input goes with the first layer */
    int deg[8] = { 1, 1, 1, 1, 1, 1, 1, 1 };
    int dev = stage[x];
    cr_assert(sim_strategy_set_op(s, x, deg, &dev, &error), "%s", error ? error->message : "");
  }
  cr_assert(sim_strategy_set_stages(s, p, stage, (const int *const *)devs, ndev, &error), "%s",
            error ? error->message : "");
  sim_strategy_set_microbatches(s, mbs);
  sim_strategy_set_schedule(s, sched, 1);
  for (int i = 0; i < p; i++)
    g_free(devs[i]);
  g_free(devs);
  g_free(ndev);
  g_free(stage);
  return s;
}

Test(closed_form, gpipe_takes_m_plus_p_minus_one_stage_times)
{
  /* p equal stages and m micro-batches under GPipe: the last stage ends its forwards at
   * (p-1)(F + c) + m F, the first stage ends its backwards (m + p - 1) B + (p - 1) c
   * later, and its update follows: T = (m + p - 1)(F + B) + 2 (p - 1) c + U, where c is
   * one activation (or gradient) transfer: 2 us + b h 2 bytes / 100 GB/s. */
  const int p = 4, m = 8;
  const int64_t b = 256, h = 2048;
  g_autoptr(SimGraph) g = chain(p, b, h);
  g_autoptr(SimMachine) mach = switch4(100);
  g_autoptr(SimCostModel) c = roofline();
  g_autoptr(SimStrategy) s = pipeline(g, mach, p, m, SIM_SCHEDULE_GPIPE);
  const SimDeviceSpec *spec = sim_machine_device_spec(mach, 0);
  int64_t ext[3] = { b / m, h, h };
  double F = sim_cost_model_op_time(c, spec, g, 1, ext, SIM_PASS_FORWARD);
  double B = sim_cost_model_op_time(c, spec, g, 1, ext, SIM_PASS_BACKWARD);
  double U = sim_cost_model_op_time(c, spec, g, 1, ext, SIM_PASS_UPDATE);
  double eff = sim_coll_params_default().bandwidth_efficiency;
  double comm = 2e-6 + (double)(b / m) * h * 2 / (100e9 * eff);
  cr_assert_lt(comm, F, "transfers hide behind a stage's compute");
  double expect = (m + p - 1) * (F + B) + 2 * (p - 1) * comm + U;
  SimOptions o = sim_options_default();
  double t = simulate(g, mach, s, c, &o);
  cr_assert_float_eq(t, expect, expect * 1e-9, "%g vs %g", t, expect);
}

Test(closed_form, one_f_one_b_matches_gpipe_time_and_interleaving_helps)
{
  /* 1F1B reorders the same work: with transfers that take no time it ends when GPipe
   * does, (m + p - 1)(F + B) + U.  Two chunks per device halve the bubble (below). */
  const int p = 4, m = 8;
  g_autoptr(SimGraph) g = chain(2 * p, 256, 2048);
  g_autoptr(SimMachine) mach = switch4_latency(1e7, 1e-6);
  /* One tile shape for every GEMM: micro-batches of 32 and 16 rows then fill the same
   * tiles and take the same time, which the stage time S below assumes. */
  SimRooflineParams rp = sim_roofline_params_default();
  rp.tile_m = rp.tile_n = 128;
  g_autoptr(SimCostModel) c = sim_cost_model_new_roofline(&rp);
  SimOptions o = sim_options_default();
  g_autoptr(SimGraph) g4 = chain(p, 256, 2048);
  g_autoptr(SimStrategy) gp = pipeline(g4, mach, p, m, SIM_SCHEDULE_GPIPE);
  g_autoptr(SimStrategy) fb = pipeline(g4, mach, p, m, SIM_SCHEDULE_1F1B);
  double tg = simulate(g4, mach, gp, c, &o), tf = simulate(g4, mach, fb, c, &o);
  cr_assert_float_eq(tg, tf, tg * 1e-5, "GPipe %g vs 1F1B %g", tg, tf);

  /* The 8-layer chain on 4 devices: 8 stages, stage i on device i % 4. */
  g_autoptr(SimStrategy) il = sim_strategy_new(g, mach);
  g_autoptr(SimStrategy) flat = sim_strategy_new(g, mach);
  int n = sim_graph_n_ops(g);
  int stage[16], stage4[16], d8[8], d4[4], n8[8], n4[4];
  const int *dv8[8], *dv4[4];
  GError *error = NULL;
  for (int i = 0; i < 8; i++) {
    d8[i] = i % 4;
    dv8[i] = &d8[i];
    n8[i] = 1;
  }
  for (int i = 0; i < 4; i++) {
    d4[i] = i;
    dv4[i] = &d4[i];
    n4[i] = 1;
  }
  for (int x = 0; x < n; x++) {
    stage[x] = x == 0 ? 0 : x - 1;
    stage4[x] = stage[x] / 2;
    int deg[8] = { 1, 1, 1, 1, 1, 1, 1, 1 };
    cr_assert(sim_strategy_set_op(il, x, deg, &d8[stage[x]], &error));
    cr_assert(sim_strategy_set_op(flat, x, deg, &d4[stage4[x]], &error));
  }
  cr_assert(sim_strategy_set_stages(il, 8, stage, dv8, n8, &error), "%s",
            error ? error->message : "");
  cr_assert(sim_strategy_set_stages(flat, 4, stage4, dv4, n4, &error));
  sim_strategy_set_microbatches(il, m);
  sim_strategy_set_microbatches(flat, m);
  sim_strategy_set_schedule(il, SIM_SCHEDULE_INTERLEAVED, 2);
  sim_strategy_set_schedule(flat, SIM_SCHEDULE_1F1B, 1);
  double ti = simulate(g, mach, il, c, &o), t1 = simulate(g, mach, flat, c, &o);
  cr_assert_lt(ti, t1, "interleaved %g should beat 1F1B %g", ti, t1);
  /* In closed form (Narayanan et al., SC'21): with v chunks a device, the bubble shrinks
   * from (p - 1) to (p - 1) / v stage times, T = (m + (p - 1) / v) S + U.  S (a stage's
   * forward and backward) and U (the update) come from 1F1B at m = 8 and 16; the input
   * op, which only the first chunk has, makes chunks a little unequal (0.04%). */
  sim_strategy_set_microbatches(il, 2 * m);
  sim_strategy_set_microbatches(flat, 2 * m);
  double ti2 = simulate(g, mach, il, c, &o), t12 = simulate(g, mach, flat, c, &o);
  double S = (t12 - t1) / m, U = t1 - (m + p - 1) * S;
  cr_assert_float_eq(ti, (m + (p - 1) / 2.0) * S + U, 1e-3 * ti, "m = %d: %g", m, ti);
  cr_assert_float_eq(ti2, (2 * m + (p - 1) / 2.0) * S + U, 1e-3 * ti2, "m = %d: %g", 2 * m, ti2);
}

Test(closed_form, overlap_hides_communication_shorter_than_the_remaining_backward)
{
  /* Two layers, data parallel on 2 GPUs, one bucket per layer.  The second layer's
   * gradients (s2) are all-reduced while the first layer's backward runs; the first
   * layer's (s1) are exposed.  With overlap: T = compute + s1; without: compute + s1 + s2,
   * where s = 2 (latency + step) + S / (B e) for a ring of two. */
  g_autoptr(SimGraph) g = chain(2, 8192, 4096);
  g_autoptr(SimMachine) mach = switch4(100);
  g_autoptr(SimCostModel) c = roofline();
  g_autoptr(SimStrategy) s = sim_strategy_new(g, mach);
  GError *error = NULL;
  int deg[8] = { 2, 1, 1, 1, 1, 1, 1, 1 }, devs[2] = { 0, 1 };
  for (int x = 0; x < 3; x++)
    cr_assert(sim_strategy_set_op(s, x, deg, devs, &error));
  const int *sd[1] = { devs };
  int nd = 2, st[3] = { 0, 0, 0 };
  cr_assert(sim_strategy_set_stages(s, 1, st, sd, &nd, &error));
  SimSyncOptions so = sim_strategy_get_sync(s);
  so.bucket_bytes = 0;
  so.overlap = TRUE;
  sim_strategy_set_sync(s, &so);

  const SimDeviceSpec *spec = sim_machine_device_spec(mach, 0);
  int64_t ext[3] = { 4096, 4096, 4096 };
  double F = sim_cost_model_op_time(c, spec, g, 1, ext, SIM_PASS_FORWARD);
  double B = sim_cost_model_op_time(c, spec, g, 1, ext, SIM_PASS_BACKWARD);
  double U = sim_cost_model_op_time(c, spec, g, 1, ext, SIM_PASS_UPDATE);
  SimCollParams cp = sim_coll_params_default();
  double S = 4096.0 * 4096 * 2;
  double sync = sim_collective_time(mach, SIM_COLL_ALLREDUCE, SIM_ALLREDUCE_RING, &cp, devs, 2, S);
  cr_assert_lt(sync, B, "the second layer's sync fits in the first layer's backward");
  SimOptions o = sim_options_default();
  double on = simulate(g, mach, s, c, &o);
  double expect_on = 2 * F + 2 * B + sync + 2 * U;
  cr_assert_float_eq(on, expect_on, expect_on * 1e-9, "overlap: %g vs %g", on, expect_on);
  so.overlap = FALSE;
  sim_strategy_set_sync(s, &so);
  double off = simulate(g, mach, s, c, &o);
  double expect_off = 2 * F + 2 * B + 2 * sync + 2 * U;
  cr_assert_float_eq(off, expect_off, expect_off * 1e-9, "no overlap: %g vs %g", off, expect_off);
}

Test(closed_form, memory_per_parameter_follows_precision_optimizer_and_zero)
{
  /* Two 4096 x 4096 linears (33,554,432 parameters, fp16 weights in mixed precision, fp32
   * otherwise), data parallel over 4 GPUs, a batch of 8: every GPU holds every weight,
   * and the activations (8 x 4096 values a tensor) are under 1 MB.  Bytes per parameter:
   *   mixed precision, Adam:   2 (weight) + 2 (gradient) + 4 (fp32 master) + 8 (moments) = 16
   *   the same with ZeRO-1:    2 + 2 + 12 / 4 (the fp32 states split over the replicas) = 7
   *   with ZeRO-2:             2 + (2 + 12) / 4 (the gradients split too) = 5.5
   *   fp32, Adam:              4 + 4 + 8 = 16
   *   fp32, SGD with momentum: 4 + 4 + 4 = 12
   * With the optimizer offloaded to the host (a fraction f of the master weights and
   * moments in host memory):
   *   mixed, Adam, f = 1:            2 + 2 = 4
   *   the same with ZeRO-1, f = 0.5: 2 + 2 + 12 (1 - 0.5) / 4 = 5.5
   *   with ZeRO-2, f = 1:            2 + 2 / 4 = 2.5
   * and the host holds 12 f of them (12 f / 4 under ZeRO): 12, 1.5 and 3. */
  const double params = 2.0 * 4096 * 4096;
  const struct {
    SimPrecision precision;
    SimOptimizer optimizer;
    gboolean zero1, zero2;
    double bytes;
    double offload;
  } cases[] = {
    { SIM_PRECISION_MIXED_FP16, SIM_OPTIMIZER_ADAM, FALSE, FALSE, 16 },
    { SIM_PRECISION_MIXED_FP16, SIM_OPTIMIZER_ADAM, TRUE, FALSE, 7 },
    { SIM_PRECISION_MIXED_FP16, SIM_OPTIMIZER_ADAM, FALSE, TRUE, 5.5 },
    { SIM_PRECISION_FP32, SIM_OPTIMIZER_ADAM, FALSE, FALSE, 16 },
    { SIM_PRECISION_FP32, SIM_OPTIMIZER_SGD, FALSE, FALSE, 12 },
    { SIM_PRECISION_MIXED_FP16, SIM_OPTIMIZER_ADAM, FALSE, FALSE, 4, 1 },
    { SIM_PRECISION_MIXED_FP16, SIM_OPTIMIZER_ADAM, TRUE, FALSE, 5.5, 0.5 },
    { SIM_PRECISION_MIXED_FP16, SIM_OPTIMIZER_ADAM, FALSE, TRUE, 2.5, 1 },
  };
  g_autoptr(SimMachine) mach = switch4(100);
  g_autoptr(SimCostModel) c = roofline();
  for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
    g_autoptr(SimGraph) g = chain(2, 8, 4096);
    sim_graph_set_float_dtype(g, cases[i].precision == SIM_PRECISION_FP32 ? SIM_DTYPE_FP32
                                                                          : SIM_DTYPE_FP16);
    GError *error = NULL;
    g_autoptr(SimStrategy) s = sim_strategy_data_parallel(g, mach, 4, &error);
    cr_assert_not_null(s, "%s", error ? error->message : "");
    SimMemoryOptions mo = sim_strategy_get_memory(s);
    mo.precision = cases[i].precision;
    mo.optimizer = cases[i].optimizer;
    mo.zero1 = cases[i].zero1;
    mo.zero2 = cases[i].zero2;
    mo.offload = cases[i].offload;
    mo.recompute = SIM_RECOMPUTE_NONE;
    sim_strategy_set_memory(s, &mo);
    SimOptions o = sim_options_default();
    g_autoptr(SimReport) r = sim_simulate(g, mach, s, c, &o, &error);
    cr_assert_not_null(r, "%s", error ? error->message : "");
    double want = cases[i].bytes * params;
    double host = 12 * cases[i].offload / (cases[i].zero1 || cases[i].zero2 ? 4 : 1) * params;
    for (int d = 0; d < 4; d++) {
      double got = (double)sim_report_peak_memory(r, d);
      cr_expect(got >= want && got <= want + (1 << 20),
                "case %zu, GPU %d: %.0f bytes, expected %.0f plus under 1 MB of activations", i,
                d, got, want);
      cr_expect_eq((double)sim_report_host_memory(r, d), host,
                   "case %zu, GPU %d: %" G_GINT64_FORMAT " bytes on the host, expected %.0f", i,
                   d, sim_report_host_memory(r, d), host);
    }
  }
}

/* The parameters of @g's mixture-of-experts operators. */
static int64_t moe_params(const SimGraph *g)
{
  int64_t n = 0;
  for (int op = 0; op < sim_graph_n_ops(g); op++)
    if (sim_graph_op_type(g, op) == SIM_OP_MOE)
      n += sim_graph_op_n_params(g, op);
  return n;
}

/* Expert parallelism divides the experts' weights, gradients and Adam states among the
 * ep replicas of a group: with 4 replicas, ep 4 leaves each GPU 16 bytes (mixed bf16:
 * weights and gradients 2 + 2, fp32 master and moments 12) for every other parameter and
 * for a quarter of the experts' (tiny batch: activations under 1 MB). */
Test(closed_form, expert_parallelism_divides_the_experts_weights)
{
  g_autoptr(SimMachine) mach = switch4(100);
  g_autoptr(SimCostModel) c = roofline();
  for (int ep = 1; ep <= 4; ep *= 4) {
    g_autoptr(SimGraph) g = zoo("moe", "layers=2,hidden=256,heads=4,kv_heads=2,experts=4,"
                                       "top_k=2,expert_ffn=512,seq=8,vocab=512,batch=4");
    sim_graph_set_float_dtype(g, SIM_DTYPE_BF16);
    int64_t experts = moe_params(g);
    cr_assert_eq(experts, 2 * 4 * 3 * 256 * 512);
    SimMegatronOptions mo = sim_megatron_options_default();
    mo.dp = 4;
    mo.ep = ep;
    mo.memory.precision = SIM_PRECISION_MIXED_BF16;
    GError *error = NULL;
    g_autoptr(SimStrategy) s = sim_strategy_megatron(g, mach, &mo, &error);
    cr_assert_not_null(s, "%s", error ? error->message : "");
    SimOptions o = sim_options_default();
    g_autoptr(SimReport) r = sim_simulate(g, mach, s, c, &o, &error);
    cr_assert_not_null(r, "%s", error ? error->message : "");
    double want = 16.0 * ((double)(sim_graph_n_params(g) - experts) + (double)experts / ep);
    for (int d = 0; d < 4; d++) {
      double got = (double)sim_report_peak_memory(r, d);
      cr_expect(got >= want && got <= want + (1 << 20),
                "ep %d, GPU %d: %.0f bytes, expected %.0f plus under 1 MB of activations", ep,
                d, got, want);
    }
  }
}

/* Expert tensor parallelism 1 beside tp 2 (Megatron-Core's --expert-tensor-parallel-size
 * 1): on 8 GPUs (dp 4, tp 2) with ep 4, etp 2 = tp puts an eighth of the experts' E
 * parameters on each GPU, every GPU holding a different part (expert groups of all 8: no
 * expert-data-parallel replica to shard over), etp 1 a quarter, whole experts, each held
 * by the 2 GPUs of its expert-data-parallel group.  The rest of the model is laid out the
 * same, so in mixed bf16 with Adam the peaks differ by the experts' share alone (tiny
 * batch: activations under 256 KB): without ZeRO 16 (E / 4 - E / 8) = 2 E bytes; with
 * ZeRO-1, whose fp32 states divide over the holders, (4 + 12 / 2) E / 4 - 16 E / 8 = E / 2. */
Test(closed_form, expert_tensor_parallelism_one_holds_whole_experts)
{
  GError *merr = NULL;
  g_autoptr(SimMachine) mach = sim_machine_load("dgx-a100", &merr);
  cr_assert_not_null(mach, "%s", merr ? merr->message : "");
  g_autoptr(SimCostModel) c = roofline();
  for (int zero = 0; zero <= 1; zero++) {
    double peak[2] = { 0 }, E = 0;
    for (int etp = 1; etp <= 2; etp++) {
      g_autoptr(SimGraph) g = zoo("moe", "layers=2,hidden=256,heads=4,kv_heads=2,experts=4,"
                                         "top_k=2,expert_ffn=2048,seq=8,vocab=512,batch=4");
      sim_graph_set_float_dtype(g, SIM_DTYPE_BF16);
      int64_t experts = moe_params(g);
      cr_assert_eq(experts, 2 * 4 * 3 * 256 * 2048);
      E = (double)experts;
      SimMegatronOptions mo = sim_megatron_options_default();
      mo.dp = 4;
      mo.tp = 2;
      mo.ep = 4;
      mo.etp = etp;
      mo.sequence_parallel = TRUE;
      mo.memory.zero1 = zero;
      mo.memory.precision = SIM_PRECISION_MIXED_BF16;
      GError *error = NULL;
      g_autoptr(SimStrategy) s = sim_strategy_megatron(g, mach, &mo, &error);
      cr_assert_not_null(s, "%s", error ? error->message : "");
      SimOptions o = sim_options_default();
      g_autoptr(SimReport) r = sim_simulate(g, mach, s, c, &o, &error);
      cr_assert_not_null(r, "%s", error ? error->message : "");
      peak[etp - 1] = (double)sim_report_peak_memory(r, 0);
      for (int d = 1; d < 8; d++)
        cr_expect_eq(sim_report_peak_memory(r, d), sim_report_peak_memory(r, 0),
                     "etp %d zero %d: GPU %d", etp, zero, d);
    }
    double want = zero ? E / 2 : 2 * E, got = peak[0] - peak[1];
    cr_expect(fabs(got - want) < 256 * 1024,
              "zero %d: etp 1 holds %.0f bytes more than etp 2, expected %.0f", zero, got,
              want);
  }
}

/* ZeRO-3 shards the weights too: two 4096 x 4096 linears (fp16 weights, mixed precision,
 * Adam), data parallel over 4 GPUs, keep (2 + 2 + 12) / 4 = 4 bytes a parameter on every
 * GPU, plus three copies of the largest bucket of whole weights (gathered for the compute,
 * gathered ahead for the next bucket, the whole gradient before its reduce-scatter): one
 * linear's 2 x 4096^2 bytes with a bucket per weight, both linears' with a bucket of
 * 100 MB. */
Test(closed_form, zero3_shards_the_weights_and_gathers_a_bucket_at_a_time)
{
  const double P = 4096.0 * 4096;
  g_autoptr(SimMachine) mach = switch4(100);
  g_autoptr(SimCostModel) c = roofline();
  for (int big = 0; big < 2; big++) {
    g_autoptr(SimGraph) g = chain(2, 8, 4096);
    GError *error = NULL;
    g_autoptr(SimStrategy) s = sim_strategy_data_parallel(g, mach, 4, &error);
    cr_assert_not_null(s, "%s", error ? error->message : "");
    SimMemoryOptions mo = sim_strategy_get_memory(s);
    mo.precision = SIM_PRECISION_MIXED_FP16;
    mo.optimizer = SIM_OPTIMIZER_ADAM;
    mo.zero3 = TRUE;
    mo.recompute = SIM_RECOMPUTE_NONE;
    sim_strategy_set_memory(s, &mo);
    cr_assert(sim_strategy_get_memory(s).zero1 && sim_strategy_get_memory(s).zero2);
    SimSyncOptions so = sim_strategy_get_sync(s);
    so.bucket_bytes = big ? 100 << 20 : 0;
    sim_strategy_set_sync(s, &so);
    SimOptions o = sim_options_default();
    g_autoptr(SimReport) r = sim_simulate(g, mach, s, c, &o, &error);
    cr_assert_not_null(r, "%s", error ? error->message : "");
    double want = 4 * 2 * P + 3 * (big ? 2 : 1) * 2 * P;
    for (int d = 0; d < 4; d++) {
      double got = (double)sim_report_peak_memory(r, d);
      cr_expect(got >= want && got <= want + (1 << 20),
                "bucket %s, GPU %d: %.0f bytes, expected %.0f plus under 1 MB of activations",
                big ? "100 MB" : "per weight", d, got, want);
    }
  }
}

Test(closed_form, zero1_divides_the_update_among_the_replicas)
{
  /* Two 4096 x 4096 linears, data parallel over 4 GPUs.  Each GPU computes F + B per
   * linear and updates it in U; with the fp32 states sharded (ZeRO-1) each GPU steps a
   * quarter of them, in U / 4.  So every GPU's compute time falls by 2 (U - U / 4). */
  g_autoptr(SimGraph) g = chain(2, 64, 4096);
  g_autoptr(SimMachine) mach = switch4(100);
  g_autoptr(SimCostModel) c = roofline();
  const SimDeviceSpec *spec = sim_machine_device_spec(mach, 0);
  int64_t ext[3] = { 16, 4096, 4096 };
  double U = sim_cost_model_op_time(c, spec, g, 1, ext, SIM_PASS_UPDATE);
  double compute[2][4];
  for (int z = 0; z < 2; z++) {
    GError *error = NULL;
    g_autoptr(SimStrategy) s = sim_strategy_data_parallel(g, mach, 4, &error);
    cr_assert_not_null(s, "%s", error ? error->message : "");
    SimMemoryOptions mo = sim_strategy_get_memory(s);
    mo.zero1 = z;
    mo.recompute = SIM_RECOMPUTE_NONE;
    sim_strategy_set_memory(s, &mo);
    SimOptions o = sim_options_default();
    g_autoptr(SimReport) r = sim_simulate(g, mach, s, c, &o, &error);
    cr_assert_not_null(r, "%s", error ? error->message : "");
    for (int d = 0; d < 4; d++)
      compute[z][d] = sim_report_compute_time(r, d);
  }
  for (int d = 0; d < 4; d++) {
    double saved = compute[0][d] - compute[1][d], want = 2 * (U - U / 4);
    cr_expect_float_eq(saved, want, want * 1e-9, "GPU %d: %g s saved, expected %g", d, saved,
                       want);
  }
}

/* The offloaded update on an otherwise idle machine.  switch4's GPUs hang under one PCIe
 * switch (16 GB/s, 1 us a link) below one socket: a shard's gradients cross two links to
 * the host in 2 us + bytes / (16 GB/s e), e the links' achieved share (the collectives'
 * bandwidth efficiency), the host steps the offloaded parameters at its
 * share of CPU-Adam's rate (10^10 parameters in 2.57 s a node, a quarter of it a GPU),
 * and the weights come back as the gradients went.  One 4096 x 4096 linear (fp16): on one
 * GPU the device's update U gives way to the offloaded one; over 4 GPUs with ZeRO-1 each
 * GPU offloads a quarter of the parameters, the four transfers share the switch's link to
 * the socket (a quarter of its bandwidth each, so the same time as one whole), and the
 * all-gather waits for the weights' return, in place of U / 4.  With offload_overlap the
 * gradients leave as soon as they are reduced, during the device's update of its share
 * (1 - f) U / dp, and the host steps once both are done: min(cross, (1 - f) U / dp)
 * sooner. */
Test(closed_form, offloaded_update_crosses_pcie_and_steps_on_the_host)
{
  const double P = 4096.0 * 4096, bytes = 2 * P, rate = 10e9 / 2.57;
  g_autoptr(SimMachine) mach = switch4(100);
  g_autoptr(SimCostModel) c = roofline();
  const SimDeviceSpec *spec = sim_machine_device_spec(mach, 0);
  for (int dp = 1; dp <= 4; dp *= 4) {
    g_autoptr(SimGraph) g = chain(1, 64, 4096);
    int64_t ext[3] = { 64 / dp, 4096, 4096 };
    double U = sim_cost_model_op_time(c, spec, g, 1, ext, SIM_PASS_UPDATE);
    double t[3], tov[3];
    const double fractions[3] = { 0, 1, 0.5 };
    for (int k = 0; k < 3; k++) {
      GError *error = NULL;
      g_autoptr(SimStrategy) s = sim_strategy_data_parallel(g, mach, dp, &error);
      cr_assert_not_null(s, "%s", error ? error->message : "");
      SimMemoryOptions mo = sim_strategy_get_memory(s);
      mo.zero1 = dp > 1;
      mo.offload = fractions[k];
      mo.recompute = SIM_RECOMPUTE_NONE;
      sim_strategy_set_memory(s, &mo);
      SimOptions o = sim_options_default();
      t[k] = simulate(g, mach, s, c, &o);
      mo.offload_overlap = TRUE;
      sim_strategy_set_memory(s, &mo);
      tov[k] = simulate(g, mach, s, c, &o);
    }
    for (int k = 1; k < 3; k++) {
      double f = fractions[k], elems = f * P / dp;
      double cross = 2e-6 + f * bytes / (16e9 * sim_coll_params_default().bandwidth_efficiency);
      double host = elems / (rate / 4);
      double want = t[0] - f * U / dp + 2 * cross + host;
      cr_expect_float_eq(t[k], want, want * 1e-9, "dp %d, offload %g: %.9g s, expected %.9g", dp,
                         f, t[k], want);
      double wov = want - MIN(cross, (1 - f) * U / dp);
      cr_expect_float_eq(tov[k], wov, wov * 1e-9,
                         "dp %d, offload %g, overlapped: %.9g s, expected %.9g", dp, f, tov[k], wov);
    }
    cr_expect_eq(tov[0], t[0], "no offload: the overlap changes nothing");
  }
}

Test(closed_form, out_of_memory_is_reported)
{
  /* gpt3-175b's weights and Adam states (16 bytes per parameter, 2.8 TB) on 4 GPUs of 80 GB. */
  g_autoptr(SimGraph) g = zoo("gpt3-175b", "batch=4");
  g_autoptr(SimMachine) m = switch4(100);
  g_autoptr(SimStrategy) s = NULL;
  SimMegatronOptions mo = sim_megatron_options_default();
  mo.dp = 4;
  GError *error = NULL;
  s = sim_strategy_megatron(g, m, &mo, &error);
  cr_assert_not_null(s, "%s", error ? error->message : "");
  SimOptions o = sim_options_default();
  g_autoptr(SimReport) r = sim_simulate(g, m, s, NULL, &o, &error);
  cr_assert_not_null(r);
  cr_assert_not(sim_report_fits(r));
  cr_assert_gt(sim_report_peak_memory(r, 0), (int64_t)2e12);
}

/* ---------------------------------------------------------------------------------- */
/* Properties on random strategies                                                      */

/* A random valid configuration for every op of @g over the 4 GPUs: sample splits of 1, 2
 * or 4 and, with some luck, a split of one other dimension, on random devices. */
static SimStrategy *random_strategy(const SimGraph *g, SimMachine *m, GRand *rng)
{
  SimStrategy *s = sim_strategy_new(g, m);
  int n = sim_graph_n_ops(g);
  GError *error = NULL;
  for (int x = 0; x < n; x++) {
    for (int attempt = 0; attempt < 20; attempt++) {
      int nd = sim_graph_op_n_dims(g, x);
      int deg[8] = { 1, 1, 1, 1, 1, 1, 1, 1 };
      int total = 1;
      int d0 = 1 << g_rand_int_range(rng, 0, 3);
      if (sim_graph_op_dim_size(g, x, 0) % d0 == 0 && sim_graph_op_dim_splittable(g, x, 0)) {
        deg[0] = d0;
        total = d0;
      }
      int d = g_rand_int_range(rng, 1, MAX(nd, 2));
      int k = 1 << g_rand_int_range(rng, 0, 2);
      /* Split reductions of layers with fused activations are not valid plans; leave
       * reductions to the ops that take partial sums. */
      SimOpType type = sim_graph_op_type(g, x);
      gboolean fused = type == SIM_OP_LINEAR || type == SIM_OP_CONV2D;
      if (d < nd && total * k <= 4 && sim_graph_op_dim_splittable(g, x, d) &&
          !(fused && sim_graph_op_dim_role(g, x, d) == SIM_ROLE_REDUCTION) &&
          sim_graph_op_dim_size(g, x, d) % k == 0) {
        deg[d] = k;
        total *= k;
      }
      int devs[8];
      int base = g_rand_int_range(rng, 0, 4);
      for (int i = 0; i < total; i++)
        devs[i] = (base + i) % 4;
      if (sim_strategy_set_op(s, x, deg, devs, NULL))
        break;
    }
  }
  int all[4] = { 0, 1, 2, 3 }, na = 4;
  const int *sd[1] = { all };
  int *stage = g_new0(int, n);
  cr_assert(sim_strategy_set_stages(s, 1, stage, sd, &na, &error));
  g_free(stage);
  return s;
}

static void check_timeline(const SimTaskGraph *tg, const SimTimeline *tl)
{
  cr_assert_not(tl->deadlock);
  int n = tg->n_tasks;
  int64_t *mem = g_new0(int64_t, tg->n_devices);
  for (int t = 0; t < n; t++) {
    /* Every task ran, no task starts before its inputs end, flows carry their bytes. */
    cr_assert_geq(tl->start[t], 0);
    cr_assert_geq(tl->end[t], tl->start[t]);
    const SimTask *k = &tg->task[t];
    for (int j = 0; j < k->n_succ; j++)
      cr_assert_geq(tl->start[tg->succ[k->succ_off + j]], tl->end[t]);
  }
  /* Memory replayed in time order never drops below the static part. */
  typedef struct {
    double t;
    int dev;
    int64_t delta;
  } Ev;
  GArray *ev = g_array_new(FALSE, FALSE, sizeof(Ev));
  for (int t = 0; t < n; t++) {
    const SimTask *k = &tg->task[t];
    if (k->kind != SIM_TASK_COMPUTE)
      continue;
    Ev a = { tl->start[t], k->device, k->mem_alloc }, f = { tl->end[t], k->device, -k->mem_free };
    g_array_append_val(ev, a);
    g_array_append_val(ev, f);
  }
  for (guint i = 0; i < ev->len; i++)
    for (guint j = i + 1; j < ev->len; j++) {
      Ev *x = &g_array_index(ev, Ev, i), *y = &g_array_index(ev, Ev, j);
      /* At equal times the engine frees before it allocates (an end precedes the next
       * start on a stream), so sort frees first. */
      if (y->t < x->t || (y->t == x->t && y->delta < x->delta)) {
        Ev tmp = *x;
        *x = *y;
        *y = tmp;
      }
    }
  for (guint i = 0; i < ev->len; i++) {
    Ev *e = &g_array_index(ev, Ev, i);
    mem[e->dev] += e->delta;
    cr_assert_geq(mem[e->dev], 0, "memory of device %d went negative", e->dev);
  }
  g_array_free(ev, TRUE);
  g_free(mem);
}

static void run_lowered(const SimGraph *g, SimMachine *m, const SimStrategy *s, SimCostModel *c,
                        SimTaskGraph **tg_out, SimTimeline *tl, SimLowering **lw_out)
{
  SimOptions o = sim_options_default();
  o.fold = FALSE;
  SimCollParams cp = sim_coll_params_default();
  SimLowering *lw = sim_lowering_new(g, m, s, c, &o, &cp, NULL);
  sim_lowering_build(lw);
  SimTaskGraph *tg = sim_lowering_taskgraph(lw);
  sim_taskgraph_assemble(tg);
  SimEngine *e = sim_engine_new(m, &cp);
  sim_engine_run(e, tg, tl);
  sim_engine_free(e);
  *tg_out = tg;
  *lw_out = lw;
}

/* Rows of [lo0, hi0) that [lo1, hi1) also covers. */
static int64_t rows_shared(int64_t lo0, int64_t hi0, int64_t lo1, int64_t hi1)
{
  return MAX(0, MIN(hi0, hi1) - MAX(lo0, lo1));
}

/* Tensors held by many shards (more groups of holders than the lowering tests one by one)
 * and needed by shards split another way on other devices: every consumer shard gets
 * exactly the rows it lacks.  MLP tower of batch 192 over 64 GPUs, data parallel (shard d
 * holds rows [3d, 3d + 3) on device d), but its first layer split 24 ways on devices 23,
 * 22, ..., 0 (shard c holds rows [8c, 8c + 8) on device 23 - c).  A consumer takes from its
 * own device what that device holds and receives the rest:
 *   the 24-way shards lack  A = sum over c of 8 - |[8c, 8c + 8) & [3(23 - c), 3(23 - c) + 3)|
 *   rows, the 64-way ones   B = sum over d of 3 - |[3d, 3d + 3) & [8(23 - d), 8(23 - d) + 8)|
 *   (no 24-way shard on devices 24 to 63: all 3 of theirs).  Forward, the first layer's
 *   output (64 wide, fp32) goes to the 64-way second layer (B rows); backward, its gradient
 *   comes back (A rows).  A transfer is tagged with the op that sends it: the first layer
 *   B x 64 x 4 bytes, the second A x 64 x 4.  (Every shard of a model input loads its own
 *   rows: the input sends nothing.)  The splits meet at one row in places (shard
 *   c = 1 needs row 8 of [6, 9) and row 15 of [15, 18); shard d = 5 row 15 of [8, 16), d = 2
 *   row 8), which an overlap search that stops short would drop. */
Test(lowering, many_holders_send_every_consumer_exactly_the_rows_it_lacks)
{
  g_autoptr(SimGraph) g = zoo("mlp", "layers=2,hidden=64,input=32,classes=16,batch=192");
  GError *error = NULL;
  g_autoptr(SimMachine) m = sim_machine_load("dgx-a100:8", &error);
  cr_assert_not_null(m, "%s", error ? error->message : "");
  g_autoptr(SimStrategy) s = sim_strategy_data_parallel(g, m, 64, &error);
  cr_assert_not_null(s, "%s", error ? error->message : "");
  int in = 0, fc0 = 1, fc1 = 2;
  cr_assert_str_eq(sim_graph_op_name(g, in), "input0");
  cr_assert_str_eq(sim_graph_op_name(g, fc0), "tower0.fc0");
  cr_assert_str_eq(sim_graph_op_name(g, fc1), "tower0.fc1");
  cr_assert_eq(sim_graph_tensor_dtype(g, sim_graph_op_output(g, fc0, 0)), SIM_DTYPE_FP32);
  int deg[8] = { 24, 1, 1, 1, 1, 1, 1, 1 }, devs[24];
  for (int c = 0; c < 24; c++)
    devs[c] = 23 - c;
  cr_assert(sim_strategy_set_op(s, fc0, deg, devs, &error), "%s", error ? error->message : "");
  int64_t A = 0, B = 0;
  for (int c = 0; c < 24; c++)
    A += 8 - rows_shared(8 * c, 8 * c + 8, 3 * (23 - c), 3 * (23 - c) + 3);
  for (int d = 0; d < 64; d++)
    B += 3 - (d < 24 ? rows_shared(3 * d, 3 * d + 3, 8 * (23 - d), 8 * (23 - d) + 8) : 0);
  g_autoptr(SimCostModel) cm = roofline();
  SimTaskGraph *tg;
  SimTimeline tl = { 0 };
  SimLowering *lw;
  run_lowered(g, m, s, cm, &tg, &tl, &lw);
  check_timeline(tg, &tl);
  double sent[3] = { 0, 0, 0 }; /* by the input, the first layer, the second */
  for (int t = 0; t < tg->n_tasks; t++) {
    const SimTask *k = &tg->task[t];
    if (k->kind != SIM_TASK_FLOW || k->cls != SIM_CLASS_TRANSFER)
      continue;
    cr_assert_neq(k->device, k->peer);
    cr_assert(k->op == in || k->op == fc0 || k->op == fc1, "a transfer tagged op %d", k->op);
    sent[k->op] += k->bytes;
  }
  /* Most rows move: the two splits rarely meet on a device. */
  cr_assert_gt(A, 150);
  cr_assert_gt(B, 150);
  cr_assert_eq(sent[in], 0);
  cr_assert_float_eq(sent[fc0], (double)B * 64 * 4, 0.5);
  cr_assert_float_eq(sent[fc1], (double)A * 64 * 4, 0.5);
  sim_timeline_clear(&tl);
  sim_lowering_free(lw);
}

/* Expert parallelism moves the all-to-all's bytes.  x [8, 4, 16] fp32 through a linear
 * layer "pre", a router to 4 experts and a MoE of top-k experts into an MSE loss, all data
 * parallel over 4 GPUs (8 tokens each) but the MoE, whose experts are split 4 ways (ep 4,
 * every token of the batch in each shard's region).  Of the R = 32 x 16 x 4 bytes of
 * tokens, each GPU holds a quarter; the fraction f = k / ep of them is routed to each other
 * GPU's expert.  So:
 *   forward, "pre" sends each MoE shard the 24 remote tokens' rows times f (dispatch), and
 *   the MoE's partial outputs are reduced with (ep - 1) R f bytes in all (combine);
 *   backward, the loss sends each MoE shard the 24 remote rows of the output's gradient
 *   times f, and the MoE input's partial gradients are reduced with (ep - 1) R f bytes;
 *   the router's logits (4 a token) move whole: 24 remote tokens to each shard forward;
 *   backward, each router shard takes only its own tokens' gradient of them, a ring
 *   reduce-scatter of (ep - 1) R_logits bytes.
 * With k = 4 = ep the fraction is capped at 1: every token goes to every GPU. */
/* The graph of the tests below: "pre", a router to 4 experts and a MoE of top @k of them
 * into an MSE loss, data parallel over switch4's 4 GPUs but the MoE, split by @deg. */
static SimGraph *small_moe(int k, const int deg[8], SimMachine *m, SimStrategy **plan)
{
  SimGraph *g = sim_graph_new("moe");
  int x = sim_graph_input(g, "x", SIM_DTYPE_FP32, 3, (int64_t[]){ 8, 4, 16 });
  int tgt = sim_graph_input(g, "target", SIM_DTYPE_FP32, 3, (int64_t[]){ 8, 4, 16 });
  int h = sim_graph_linear(g, "pre", x, 16, FALSE, SIM_UNARY_IDENTITY);
  int logits = sim_graph_linear(g, "router", h, 4, FALSE, SIM_UNARY_IDENTITY);
  int y = sim_graph_moe(g, "moe", h, logits, 4, k, 8);
  sim_graph_mse_loss(g, "loss", y, tgt);
  GError *error = NULL;
  cr_assert(sim_graph_check(g, &error), "%s", error ? error->message : "");
  *plan = sim_strategy_data_parallel(g, m, 4, &error);
  cr_assert_not_null(*plan, "%s", error ? error->message : "");
  cr_assert(sim_strategy_set_op(*plan, sim_graph_op_by_name(g, "moe"), deg,
                                (int[]){ 0, 1, 2, 3 }, &error),
            "%s", error ? error->message : "");
  return g;
}

/* Bytes of small_moe()'s flows in one run of plan @s: its transfers by the op that sends
 * them, and its reductions.  Every such flow stays inside aligned groups of @group GPUs;
 * @what names the case in failures. */
typedef struct {
  double pre, router, loss, reduced;
} MoeBytes;

static MoeBytes moe_flow_bytes(SimGraph *g, SimMachine *m, SimStrategy *s, int group,
                               const char *what)
{
  g_autoptr(SimCostModel) cm = roofline();
  SimTaskGraph *tg;
  SimTimeline tl = { 0 };
  SimLowering *lw;
  run_lowered(g, m, s, cm, &tg, &tl, &lw);
  cr_assert_not(tl.deadlock, "%s", what);
  int pre = sim_graph_op_by_name(g, "pre"), router = sim_graph_op_by_name(g, "router");
  int loss = sim_graph_op_by_name(g, "loss");
  MoeBytes b = { 0 };
  for (int t = 0; t < tg->n_tasks; t++) {
    const SimTask *task = &tg->task[t];
    if (task->kind != SIM_TASK_FLOW)
      continue;
    if (task->cls != SIM_CLASS_REDUCTION && task->cls != SIM_CLASS_TRANSFER)
      continue;
    cr_assert_eq(task->device / group, task->peer / group, "%s: a flow from GPU %d to %d", what,
                 task->device, task->peer);
    if (task->cls == SIM_CLASS_REDUCTION)
      b.reduced += task->bytes;
    else if (task->op == pre)
      b.pre += task->bytes;
    else if (task->op == router)
      b.router += task->bytes;
    else if (task->op == loss)
      b.loss += task->bytes;
    else
      cr_assert_fail("%s: a transfer tagged op %d", what, task->op);
  }
  sim_timeline_clear(&tl);
  sim_lowering_free(lw);
  return b;
}

Test(lowering, expert_parallelism_moves_the_all_to_alls_bytes)
{
  for (int k = 1; k <= 4; k *= 2) {
    g_autoptr(SimMachine) m = switch4(100);
    g_autoptr(SimStrategy) s = NULL;
    g_autoptr(SimGraph) g = small_moe(k, (int[8]){ 1, 1, 4, 1, 1, 1, 1, 1 }, m, &s);
    g_autofree char *what = g_strdup_printf("k %d", k);
    MoeBytes b = moe_flow_bytes(g, m, s, 4, what);
    double f = MIN(1.0, k / 4.0), R = 32.0 * 16 * 4, Rl = 32.0 * 4 * 4;
    cr_expect_float_eq(b.pre, 4 * 24 * 16 * 4 * f, 1e-6, "k %d: dispatch %g", k, b.pre);
    cr_expect_float_eq(b.loss, 4 * 24 * 16 * 4 * f, 1e-6, "k %d: gradients %g", k, b.loss);
    cr_expect_float_eq(b.router, 4 * 24 * 4 * 4, 1e-6, "k %d: logits %g", k, b.router);
    cr_expect_float_eq(b.reduced, 2 * 3 * R * f + 3 * Rl, 1e-6, "k %d: reductions %g", k,
                       b.reduced);
  }
}

/* The all-to-all inside expert groups, and with each expert's width split too.  The graph
 * of expert_parallelism_moves_the_all_to_alls_bytes (32 tokens of 64 bytes, R = 2,048
 * bytes of them, 8 a GPU; "pre" and the router data parallel over 4 GPUs) with its MoE of
 * 4 experts laid out as Megatron-Core lays out experts with an expert tensor-parallel
 * degree of their own (sim/strategy-build.c, place_experts()): shard (samples i, experts
 * j, width t) on device (i ep + j) etp + t, expert groups of n = ep x etp GPUs.
 *   ep 2, etp 1: two groups of two GPUs, each routing the 16 tokens its GPUs hold; a shard
 *     receives from the other GPU of its group the fraction f = min(1, k / ep) of its 8
 *     tokens, and nothing crosses groups;
 *   ep 2, etp 2: one group of 4 GPUs, each expert's width split in two; a shard receives
 *     the routed fraction f of each other GPU's 8 tokens, which is what Megatron's
 *     all-to-all over the ep ranks and all-gather over the etp ranks move together: per
 *     GPU k Z (n - 1) / (n ep) for Z the group's bytes.
 * Combine and the input gradient's reduction carry the dispatch's bytes, (n - 1) R f in
 * all, each: Megatron's reduce-scatter over the etp ranks and all-to-all back.  The router's logits (16 bytes a token) move whole to every shard of a group, and their
 * partial gradients are reduce-scattered inside it. */
Test(lowering, expert_groups_keep_the_all_to_all_inside_them)
{
  const int layouts[][2] = { { 2, 1 }, { 2, 2 } };
  for (size_t l = 0; l < G_N_ELEMENTS(layouts); l++)
    for (int k = 1; k <= 2; k++) {
      int ep = layouts[l][0], etp = layouts[l][1], n = ep * etp, groups = 4 / n;
      g_autoptr(SimMachine) m = switch4(100);
      g_autoptr(SimStrategy) s = NULL;
      g_autoptr(SimGraph) g = small_moe(k, (int[8]){ groups, 1, ep, etp, 1, 1, 1, 1 }, m, &s);
      g_autofree char *what = g_strdup_printf("ep %d etp %d k %d", ep, etp, k);
      MoeBytes b = moe_flow_bytes(g, m, s, n, what);
      double f = MIN(1.0, (double)k / ep), R = 32.0 * 16 * 4, Rl = 32.0 * 4 * 4;
      /* Each of the 4 shards: (n - 1) other GPUs' 8 tokens. */
      double dispatch = 4.0 * (n - 1) * 8 * 16 * 4 * f;
      cr_expect_float_eq(b.pre, dispatch, 1e-6, "ep %d etp %d k %d: dispatch %g, want %g", ep,
                         etp, k, b.pre, dispatch);
      cr_expect_float_eq(b.loss, dispatch, 1e-6, "ep %d etp %d k %d: gradients %g", ep, etp,
                         k, b.loss);
      cr_expect_float_eq(b.router, 4.0 * (n - 1) * 8 * 4 * 4, 1e-6,
                         "ep %d etp %d k %d: logits %g", ep, etp, k, b.router);
      /* Combine and the input's gradient: the dispatch's bytes each, (n - 1) R f; the
       * logits' gradient reduce-scattered inside each group of Rl / groups bytes: (n - 1)
       * Rl over the groups. */
      cr_assert_float_eq(dispatch, (n - 1) * R * f, 1e-9);
      double want = 2 * dispatch + (double)(n - 1) * Rl;
      cr_expect_float_eq(b.reduced, want, 1e-6, "ep %d etp %d k %d: reductions %g, want %g", ep,
                         etp, k, b.reduced, want);
    }
}

/* The experts' all-to-all over two DGX H100 nodes (16 experts over ep 16, one a GPU): a
 * token for a GPU of the other node goes as NCCL's PXN sends it (sim/machine.c,
 * build_pxn()), over NVSwitch to the GPU of the destination's rail and out through that
 * GPU's NIC, so no flow crosses a spine, and each rail carries the same bytes (every GPU
 * sends every other the same).  The combine (and its backward, the input's gradients) is
 * an all-to-all too over a group that spans nodes (expert_all_to_all() in
 * sim/lower-tensors.c), not a ring: every GPU's share for each GPU of the other node, a
 * dispatch flow's bytes, leaves along the destination's rail, in one flow per rail and
 * direction that carries the node's 8 shares.  With the network's "pxn" false the flows
 * between rails climb to the spines instead, and the combine sends each share in a flow
 * of its own; the bytes leaving the node are the same. */
Test(lowering, expert_all_to_all_across_nodes_stays_on_the_rails)
{
  double out_bytes[2] = { 0 };
  for (int pxn = 1; pxn >= 0; pxn--) {
    g_autoptr(SimMachine) m = NULL;
    if (pxn) {
      m = sim_machine_load("dgx-h100:2", NULL);
    } else {
      g_autoptr(SimMachine) on = sim_machine_load("dgx-h100:2", NULL);
      g_autofree char *json = sim_machine_to_json(on);
      char *at = strstr(json, "\"pxn\": true");
      cr_assert_not_null(at);
      memcpy(at, "\"pxn\":false", strlen("\"pxn\":false"));
      GError *error = NULL;
      m = sim_machine_from_json(json, "dgx-h100-no-pxn.json", 0, &error);
      cr_assert_not_null(m, "%s", error ? error->message : "");
    }
    cr_assert_not_null(m);
    g_autoptr(SimGraph) g = zoo("moe", "layers=2,hidden=256,heads=4,kv_heads=4,seq=64,vocab=512,"
                                       "batch=32,experts=16,top_k=2,expert_ffn=512");
    SimMegatronOptions mo = sim_megatron_options_default();
    mo.tp = 1;
    mo.pp = 1;
    mo.dp = 16;
    mo.ep = 16;
    mo.etp = 1;
    GError *error = NULL;
    g_autoptr(SimStrategy) s = sim_strategy_megatron(g, m, &mo, &error);
    cr_assert_not_null(s, "%s", error ? error->message : "");
    g_autoptr(SimCostModel) cm = roofline();
    SimTaskGraph *tg;
    SimTimeline tl = { 0 };
    SimLowering *lw;
    run_lowered(g, m, s, cm, &tg, &tl, &lw);
    cr_assert_not(tl.deadlock);
    double rail[8] = { 0 };
    int climbs = 0, across = 0;
    GArray *off_rail = g_array_new(FALSE, FALSE, sizeof(double)); /* reductions' bytes */
    /* Flows between the nodes by their bytes: the reductions' and the transfers'. */
    GHashTable *reduced = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, NULL);
    GHashTable *dispatch = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, NULL);
    for (int t = 0; t < tg->n_tasks; t++) {
      const SimTask *f = &tg->task[t];
      if (f->kind != SIM_TASK_FLOW || f->n_links || f->device == f->peer || f->bytes <= 0 ||
          m->devices[f->device].node == m->devices[f->peer].node)
        continue;
      across++;
      if (f->cls == SIM_CLASS_REDUCTION &&
          m->devices[f->device].local_rank != m->devices[f->peer].local_rank)
        g_array_append_val(off_rail, f->bytes);
      if (f->cls == SIM_CLASS_REDUCTION || f->cls == SIM_CLASS_TRANSFER) {
        GHashTable *h = f->cls == SIM_CLASS_REDUCTION ? reduced : dispatch;
        gint64 key = (gint64)llround(f->bytes);
        gpointer c = g_hash_table_lookup(h, &key);
        g_hash_table_insert(h, g_memdup2(&key, sizeof key), GINT_TO_POINTER(GPOINTER_TO_INT(c) + 1));
      }
      int n = 0;
      const int *r = sim_machine_route(m, f->device, f->peer, &n);
      gboolean spine = FALSE;
      for (int i = 0; i < n; i++)
        spine |= strstr(sim_machine_link_name(m, r[i]), "spine") != NULL;
      climbs += spine;
      if (m->devices[f->device].node == 0) {
        out_bytes[pxn] += f->bytes;
        for (int i = 0; i < n; i++) {
          const char *name = sim_machine_link_name(m, r[i]);
          int k;
          if (sscanf(name, "node0/nic%d->rail", &k) == 1)
            rail[k] += f->bytes;
        }
      }
    }
    cr_assert_gt(across, 0);
    /* The combine and the input's gradients: with PXN, one flow from each GPU to the GPU
     * of its rail on the other node (8 each way) carrying the 8 shares of its node's
     * GPUs, each share a dispatch flow's size; without, 8 x 8 flows each way, one a
     * share (the other reductions between the nodes, the router's, are rings). */
    int per = pxn ? 8 : 1, combine = 0;
    GHashTableIter it;
    gpointer key, count;
    g_hash_table_iter_init(&it, reduced);
    while (g_hash_table_iter_next(&it, &key, &count)) {
      gint64 share = *(gint64 *)key / per;
      if (*(gint64 *)key % per == 0 && g_hash_table_contains(dispatch, &share) &&
          GPOINTER_TO_INT(count) % (2 * 64 / per) == 0)
        combine = MAX(combine, GPOINTER_TO_INT(count));
    }
    cr_expect_gt(combine, 0, "pxn %d: no reductions between the nodes of %d dispatch flows' "
                             "size, %d each way", pxn, per, 64 / per);
    /* Under PXN none of the combine's flows between the nodes changes rails. */
    for (guint i = 0; pxn && i < off_rail->len; i++) {
      gint64 b = llround(g_array_index(off_rail, double, i));
      gint64 share = b / per;
      cr_expect(b % per != 0 || !g_hash_table_contains(dispatch, &share),
                "a combine's flow of %lld bytes changes rails", (long long)b);
    }
    g_array_free(off_rail, TRUE);
    g_hash_table_destroy(reduced);
    g_hash_table_destroy(dispatch);
    if (pxn) {
      cr_expect_eq(climbs, 0, "%d flows between the nodes climb to a spine", climbs);
      for (int k = 1; k < 8; k++)
        cr_expect_float_eq(rail[k], rail[0], 1e-9 * rail[0], "rail %d: %g bytes, rail 0 %g", k,
                           rail[k], rail[0]);
    } else {
      cr_expect_gt(climbs, 0);
    }
    sim_timeline_clear(&tl);
    sim_lowering_free(lw);
  }
  cr_expect_float_eq(out_bytes[0], out_bytes[1], 1e-9 * out_bytes[1]);
}

/* Sequence parallelism moves the bytes of the all-reduces it replaces (Korthikanti et al.,
 * "Reducing Activation Recomputation in Large Transformer Models", 2022): each
 * row-parallel product's all-reduce becomes a reduce-scatter into the ranks' parts of the
 * sequence and an all-gather before the next column-parallel product, and the same
 * backward, four a layer.  A ring all-reduce over t ranks moves 2 (t - 1) R bytes in all
 * (R the activation's bytes), a reduce-scatter and an all-gather (t - 1) R each.  So a GPT
 * with tensor parallelism over 4 GPUs moves as many bytes in its reductions and transfers
 * with sequence parallelism as without (whose only transfers are none), its transfers are
 * (t - 1) R per all-reduce replaced, sent around a ring (NCCL's all-gather), and a layer
 * more replaces four more.  (The weights
 * of the norms, replicated over ranks that see different parts of the sequence, add a
 * gradient synchronization of their own, not counted here.) */
Test(lowering, sequence_parallelism_moves_the_bytes_of_the_all_reduces_it_replaces)
{
  const int t = 4;
  const double R = 4.0 * 64 * 256 * 4; /* batch, positions, width, fp32 */
  double replaced[2] = { 0 };
  for (int layers = 2; layers <= 3; layers++) {
    double reduced[2] = { 0 }, sent[2] = { 0 };
    int off_ring = 0;
    for (int sp = 0; sp <= 1; sp++) {
      g_autofree char *params =
          g_strdup_printf("layers=%d,hidden=256,heads=4,seq=64,vocab=512,batch=4", layers);
      g_autoptr(SimGraph) g = zoo("gpt", params);
      GError *error = NULL;
      g_autoptr(SimMachine) m = switch4(100);
      SimMegatronOptions mo = sim_megatron_options_default();
      mo.tp = t;
      mo.sequence_parallel = sp;
      g_autoptr(SimStrategy) s = sim_strategy_megatron(g, m, &mo, &error);
      cr_assert_not_null(s, "%s", error ? error->message : "");
      g_autoptr(SimCostModel) cm = roofline();
      SimTaskGraph *tg;
      SimTimeline tl = { 0 };
      SimLowering *lw;
      run_lowered(g, m, s, cm, &tg, &tl, &lw);
      cr_assert_not(tl.deadlock);
      for (int k = 0; k < tg->n_tasks; k++) {
        const SimTask *task = &tg->task[k];
        if (task->kind != SIM_TASK_FLOW)
          continue;
        if (task->cls == SIM_CLASS_REDUCTION)
          reduced[sp] += task->bytes;
        else if (task->cls == SIM_CLASS_TRANSFER) {
          sent[sp] += task->bytes;
          off_ring += task->peer != (task->device + 1) % t;
        }
      }
      sim_timeline_clear(&tl);
      sim_lowering_free(lw);
    }
    cr_assert_gt(reduced[0], 0);
    cr_expect_eq(sent[0], 0, "%d layers: %g bytes sent without sequence parallelism", layers,
                 sent[0]);
    cr_expect_float_eq(reduced[1] + sent[1], reduced[0], reduced[0] * 1e-12,
                       "%d layers: %g + %g bytes with, %g without", layers, reduced[1], sent[1],
                       reduced[0]);
    replaced[layers - 2] = sent[1] / ((t - 1) * R);
    cr_expect_float_eq(replaced[layers - 2], round(replaced[layers - 2]), 1e-9,
                       "%d layers: %g all-reduces replaced", layers, replaced[layers - 2]);
    /* Each gather is a ring: every rank sends to the next one only, where pieces sent
     * between every pair of ranks would go to the other t - 1. */
    cr_expect_eq(off_ring, 0, "%d layers: %d flows off the ring", layers, off_ring);
  }
  cr_expect_float_eq(replaced[1] - replaced[0], 4, 1e-9, "%g, then %g all-reduces replaced",
                     replaced[0], replaced[1]);
}

/* ZeRO-3's communication: over d replicas, every micro-batch all-gathers the weights W
 * before its forward and again before its backward, and reduce-scatters their gradients
 * after its backward, (d - 1) W bytes on the links each on a ring: 3 M (d - 1) W in all
 * for M micro-batches, against ZeRO-1's 2 (d - 1) W (one reduce-scatter, one all-gather
 * after the update).  Two 256 x 256 linears (fp16) over 4 GPUs, 1, 2 and 4 micro-batches,
 * buckets of one weight and of both. */
Test(lowering, zero3_gathers_the_weights_twice_a_micro_batch)
{
  g_autoptr(SimMachine) m = switch4(100);
  g_autoptr(SimCostModel) cm = roofline();
  for (int zero3 = 0; zero3 < 2; zero3++)
    for (int M = 1; M <= 4; M *= 2)
      for (int big = 0; big < 2; big++) {
        g_autoptr(SimGraph) g = chain(2, 16, 256);
        GError *error = NULL;
        g_autoptr(SimStrategy) s = sim_strategy_data_parallel(g, m, 4, &error);
        cr_assert_not_null(s, "%s", error ? error->message : "");
        sim_strategy_set_microbatches(s, M);
        SimMemoryOptions mo = sim_strategy_get_memory(s);
        mo.zero1 = TRUE;
        mo.zero3 = zero3;
        sim_strategy_set_memory(s, &mo);
        SimSyncOptions so = sim_strategy_get_sync(s);
        so.bucket_bytes = big ? 1 << 20 : 0;
        sim_strategy_set_sync(s, &so);
        cr_assert(sim_strategy_validate(s, g, m, &error), "%s", error ? error->message : "");
        SimTaskGraph *tg;
        SimTimeline tl = { 0 };
        SimLowering *lw;
        run_lowered(g, m, s, cm, &tg, &tl, &lw);
        cr_assert_not(tl.deadlock, "zero3 %d, M %d, bucket %d", zero3, M, big);
        double gathered = 0, reduced = 0;
        for (int t = 0; t < tg->n_tasks; t++) {
          const SimTask *task = &tg->task[t];
          if (task->kind != SIM_TASK_FLOW)
            continue;
          if (task->cls == SIM_CLASS_PARAM_SYNC)
            gathered += task->bytes;
          else if (task->cls == SIM_CLASS_GRAD_SYNC)
            reduced += task->bytes;
        }
        double W = 2.0 * 256 * 256 * 2, d = 4;
        double want_g = zero3 ? 2 * M * (d - 1) * W : (d - 1) * W;
        double want_r = zero3 ? M * (d - 1) * W : (d - 1) * W;
        cr_expect_float_eq(gathered, want_g, 1e-6, "zero3 %d, M %d, bucket %d: gathered %g",
                           zero3, M, big, gathered);
        cr_expect_float_eq(reduced, want_r, 1e-6, "zero3 %d, M %d, bucket %d: reduced %g",
                           zero3, M, big, reduced);
        sim_timeline_clear(&tl);
        sim_lowering_free(lw);
      }
}

/* ZeRO-3 under Megatron's plans with pipelines (1F1B and interleaved), tensor
 * parallelism and recomputation, and with weights tied, lowers without a deadlock, and its extra communication
 * never makes an iteration faster than ZeRO-2's (the same compute and memory layout but
 * for the gathers). */
Test(lowering, zero3_under_megatron_plans_runs_and_costs_at_least_zero2)
{
  g_autoptr(SimMachine) m = switch4(25);
  g_autoptr(SimCostModel) cm = roofline();
  /* GPT's output layer shares the embedding's weights: on one stage its forward uses the
   * first bucket gathered, its backward comes before that bucket's backward gather. */
  const struct { int tp, pp, dp, chunks; SimRecompute rc; gboolean tied; } cases[] = {
    { 1, 1, 4, 1, SIM_RECOMPUTE_NONE, FALSE },
    { 2, 1, 2, 1, SIM_RECOMPUTE_FULL, FALSE },
    { 1, 2, 2, 1, SIM_RECOMPUTE_NONE, FALSE },
    { 1, 2, 2, 2, SIM_RECOMPUTE_SELECTIVE, FALSE },
    { 1, 1, 4, 1, SIM_RECOMPUTE_NONE, TRUE },
    { 2, 1, 2, 1, SIM_RECOMPUTE_FULL, TRUE },
  };
  for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
    double t[2];
    for (int z = 0; z < 2; z++) {
      g_autoptr(SimGraph) g =
        cases[i].tied ? zoo("gpt", "layers=4,hidden=256,heads=4,seq=64,vocab=512,batch=16")
                      : zoo("llama", "layers=4,hidden=256,heads=4,kv_heads=2,ffn=512,"
                                     "seq=64,vocab=512,batch=16");
      SimMegatronOptions mo = sim_megatron_options_default();
      mo.tp = cases[i].tp;
      mo.pp = cases[i].pp;
      mo.dp = cases[i].dp;
      mo.microbatch_size = 2;
      mo.memory.recompute = cases[i].rc;
      if (cases[i].chunks > 1) {
        mo.schedule = SIM_SCHEDULE_INTERLEAVED;
        mo.chunks = cases[i].chunks;
      }
      mo.memory.zero2 = !z;
      mo.memory.zero3 = z;
      mo.sync.bucket_bytes = 1 << 18;
      GError *error = NULL;
      g_autoptr(SimStrategy) s = sim_strategy_megatron(g, m, &mo, &error);
      cr_assert_not_null(s, "case %zu: %s", i, error ? error->message : "");
      SimTaskGraph *tg;
      SimTimeline tl = { 0 };
      SimLowering *lw;
      run_lowered(g, m, s, cm, &tg, &tl, &lw);
      cr_assert_not(tl.deadlock, "case %zu, zero%d", i, z ? 3 : 2);
      t[z] = tl.makespan;
      sim_timeline_clear(&tl);
      sim_lowering_free(lw);
    }
    cr_expect(t[1] >= t[0], "case %zu: ZeRO-3 %g s, ZeRO-2 %g s", i, t[1], t[0]);
  }
}

/* The share of the first (@first) or last GEMM in op @x's shard @sh time in @pass: the
 * kernel's time times the op's over the sum of its kernels'. */
static double gemm_share(const SimGraph *g, SimLowering *lw, SimCostModel *cm,
                         const SimDeviceSpec *spec, int x, int sh, SimPass pass, gboolean first)
{
  int64_t lo[SIM_MAX_ITER], hi[SIM_MAX_ITER], ext[SIM_MAX_ITER];
  sim_lowering_shard_range(lw, x, sh, lo, hi);
  for (int d = 0; d < SIM_MAX_ITER; d++)
    ext[d] = hi[d] - lo[d];
  SimWork wk = { 0 };
  sim_graph_op_work(g, x, ext, pass, &wk);
  double all = 0, k = 0;
  for (int i = 0; i < wk.n; i++) {
    double t = sim_cost_model_kernel_time(cm, spec, &wk.k[i]);
    all += t;
    if (wk.k[i].kind == SIM_KERNEL_GEMM && (!first || k == 0))
      k = t;
  }
  return sim_cost_model_op_time(cm, spec, g, x, ext, pass) * k / all;
}

/* The tensor-parallel overlap leaves a mixture of experts alone, whatever its split: with
 * tp 2 and no expert parallelism, each expert's width split over the two ranks (etp = tp),
 * the reduction of the experts' partial outputs stays a collective on the links: no wait
 * of the overlap model is tagged with the MoE, while the attention's collectives are
 * overlapped (waits tagged with the attention). */
Test(lowering, tensor_parallel_overlap_leaves_the_experts_alone)
{
  g_autoptr(SimMachine) m = switch4_latency(2, 0);
  g_autoptr(SimCostModel) cm = roofline();
  g_autoptr(SimGraph) g = zoo("moe", "layers=1,hidden=256,heads=4,kv_heads=2,experts=4,top_k=2,"
                                     "expert_ffn=512,seq=64,vocab=512,batch=2");
  int moe = sim_graph_op_by_name(g, "layer0.moe"), attn = sim_graph_op_by_name(g, "layer0.attn");
  cr_assert(moe >= 0 && attn >= 0);
  SimMegatronOptions mo = sim_megatron_options_default();
  mo.tp = 2;
  mo.microbatch_size = 1;
  mo.sequence_parallel = TRUE;
  mo.tp_comm_overlap = TRUE;
  GError *error = NULL;
  g_autoptr(SimStrategy) s = sim_strategy_megatron(g, m, &mo, &error);
  cr_assert_not_null(s, "%s", error ? error->message : "");
  cr_assert_eq(sim_strategy_op_degrees(s, moe)[3], 2, "each expert's width over tp");
  SimTaskGraph *tg;
  SimTimeline tl = { 0 };
  SimLowering *lw;
  run_lowered(g, m, s, cm, &tg, &tl, &lw);
  cr_assert_not(tl.deadlock);
  int waits_moe = 0, waits_attn = 0;
  for (int t = 0; t < tg->n_tasks; t++) {
    const SimTask *k = &tg->task[t];
    if (k->kind == SIM_TASK_DELAY && k->op == moe)
      waits_moe++;
    if (k->kind == SIM_TASK_DELAY && k->op == attn)
      waits_attn++;
  }
  cr_expect_eq(waits_moe, 0, "%d overlap waits tagged with the experts", waits_moe);
  cr_expect_gt(waits_attn, 0);
  sim_timeline_clear(&tl);
  sim_lowering_free(lw);
}

/* Tensor-parallel communication overlap on a 4-GPU switch without link latency, TP 2 and
 * 4 with sequence parallelism, one LLaMA layer of hidden size 256 in fp32 (S = 64 x 256 x
 * 4 bytes a micro-batch of one sequence): no activation moves as a flow, and around the
 * attention every wait is the closed form of SimStrategy.tp_comm_overlap (lower-tensors.c)
 * with ring times T(B) = (n - 1) (2 us + B / n / (0.78 bw)), the collective model's step
 * latency and efficiency: the gather of its input (n - 1) max(0, T(S) / (n - 1) - g / n)
 * before its forward, of its output's gradient the same with its backward's first GEMM;
 * the reduce-scatter of its output, its output projection on 84 of the A100's 108 SMs,
 * c + a + (n - 1) max(c, a) - g with c = g 108 / 84 / n and a = T(S / n); of its input's
 * gradient max(0, T(S) - g) with the weight gradient's GEMM.  The link is slow enough
 * (2 GB/s) for every wait to be positive.  At TP 4 again with the overlap's parameters
 * set (SimTpOverlap: 2 chunks, 54 SMs taken after attention), the reduce-scatter of the
 * output runs in k = 2 chunks on 54 SMs: c + a + (k - 1) max(c, a) - g with
 * c = g 108 / 54 / k and a = T(S / k). */
Test(lowering, tensor_parallel_overlap_waits_are_the_pipelined_closed_forms)
{
  const double bw = 2e9;
  g_autoptr(SimMachine) m = switch4_latency(bw / 1e9, 0);
  g_autoptr(SimCostModel) cm = roofline();
  const SimDeviceSpec *spec = sim_machine_device_spec(m, 0);
  cr_assert_eq(spec->sm_count, 108);
  for (int kcase = 0; kcase < 3; kcase++) {
    int n = kcase ? 4 : 2;
    gboolean custom = kcase == 2;
    g_autoptr(SimGraph) g = zoo("llama", "layers=1,hidden=256,heads=4,kv_heads=4,ffn=512,"
                                         "seq=64,vocab=512,batch=2");
    int attn = sim_graph_op_by_name(g, "layer0.attn");
    cr_assert_geq(attn, 0);
    SimMegatronOptions mo = sim_megatron_options_default();
    mo.tp = n;
    mo.microbatch_size = 1;
    mo.sequence_parallel = TRUE;
    mo.tp_comm_overlap = TRUE;
    if (custom)
      mo.tp_overlap = (SimTpOverlap){ .chunks = 2, .sms_attention = 54, .sms_other = 16 };
    int k_rs = custom ? 2 : n, taken = custom ? 54 : 24;
    GError *error = NULL;
    g_autoptr(SimStrategy) s = sim_strategy_megatron(g, m, &mo, &error);
    cr_assert_not_null(s, "%s", error ? error->message : "");
    cr_assert(sim_strategy_get_tp_comm_overlap(s));
    cr_assert_eq(sim_strategy_get_tp_overlap(s).chunks, custom ? 2 : 0);
    SimTaskGraph *tg;
    SimTimeline tl = { 0 };
    SimLowering *lw;
    run_lowered(g, m, s, cm, &tg, &tl, &lw);
    cr_assert_not(tl.deadlock);
    double S = 64.0 * 256 * 4;
#define RING(B) ((n - 1) * (2e-6 + (B) / n / (0.78 * bw)))
    int found[4] = { 0 }, ring_flows = 0, waits[2] = { 0 };
    for (int t = 0; t < tg->n_tasks; t++) {
      const SimTask *k = &tg->task[t];
      /* Every activation that moves is an overlapped gather's: a ring all-gather's flow
       * of (n - 1) S / n from each rank to the next, which no compute task waits for. */
      if (k->kind == SIM_TASK_FLOW && k->cls == SIM_CLASS_TRANSFER) {
        cr_expect_float_eq(k->bytes, S * (n - 1) / n, 1e-9 * S, "tp %d: a flow of %g bytes "
                           "between %d and %d", n, k->bytes, k->device, k->peer);
        ring_flows++;
      }
      /* The overlap's waits (the collectives' fixed costs are delays without a shard). */
      if (k->kind == SIM_TASK_DELAY && k->shard >= 0)
        waits[k->cls == SIM_CLASS_TRANSFER ? 0 : 1]++;
      if (k->kind != SIM_TASK_DELAY || k->op != attn)
        continue;
      /* Which wait: the gathers are transfers, the reduce-scatters reductions; forward
       * and backward tell apart by what the delay precedes or follows. */
      double gf0 = gemm_share(g, lw, cm, spec, attn, k->shard, SIM_PASS_FORWARD, TRUE);
      double gf1 = gemm_share(g, lw, cm, spec, attn, k->shard, SIM_PASS_FORWARD, FALSE);
      double gb0 = gemm_share(g, lw, cm, spec, attn, k->shard, SIM_PASS_BACKWARD, TRUE);
      double gb1 = gemm_share(g, lw, cm, spec, attn, k->shard, SIM_PASS_BACKWARD, FALSE);
      double ag_f = (n - 1) * MAX(0.0, RING(S) / (n - 1) - gf0 / n);
      double ag_b = (n - 1) * MAX(0.0, RING(S) / (n - 1) - gb0 / n);
      double c = gf1 * 108.0 / (108 - taken) / k_rs, a = RING(S / k_rs);
      double rs_f = c + a + (k_rs - 1) * MAX(c, a) - gf1;
      double rs_b = MAX(0.0, RING(S) - gb1);
      cr_assert_gt(MIN(MIN(ag_f, ag_b), MIN(rs_f, rs_b)), 0);
      double want[2];
      if (k->cls == SIM_CLASS_TRANSFER) {
        want[0] = ag_f;
        want[1] = ag_b;
      } else {
        want[0] = rs_f;
        want[1] = rs_b;
      }
      double d = k->duration;
      int which = fabs(d - want[0]) <= 1e-9 * want[0] ? 0
                  : fabs(d - want[1]) <= 1e-9 * want[1] ? 1 : -1;
      cr_expect_geq(which, 0, "tp %d, %s wait of %.9g s: expected %.9g (forward) or %.9g "
                    "(backward)", n, k->cls == SIM_CLASS_TRANSFER ? "gather" : "scatter", d,
                    want[0], want[1]);
      if (which >= 0)
        found[(k->cls == SIM_CLASS_TRANSFER ? 0 : 2) + which]++;
    }
#undef RING
    /* Every shard waits once for each in each of the 2 micro-batches; a reduce-scatter's
     * wait is one task for its group. */
    cr_expect_eq(found[0], 2 * n, "tp %d: %d forward gathers", n, found[0]);
    cr_expect_eq(found[1], 2 * n, "tp %d: %d backward gathers", n, found[1]);
    cr_expect_eq(found[2], 2, "tp %d: %d forward reduce-scatters", n, found[2]);
    cr_expect_eq(found[3], 2, "tp %d: %d backward reduce-scatters", n, found[3]);
    /* Each overlapped gather (a wait per consumer shard, around the attention, the MLP
     * and the output layer) is a ring of n flows, once for all consumers on the same
     * devices that need it in that micro-batch and pass. */
    cr_expect(ring_flows > 0 && ring_flows % n == 0 && ring_flows <= waits[0], "tp %d: %d ring flows, "
              "%d gather waits", n, ring_flows, waits[0]);
    /* The overlap changes times only: every GPU's peak memory is the plan's without it,
     * and every link carries the plain plan's bytes (a gather's ring_flows (n - 1) S / n into
     * and out of every GPU, as its ring; the reduce-scatters are the same rings). */
    mo.tp_comm_overlap = FALSE;
    g_autoptr(SimStrategy) plain = sim_strategy_megatron(g, m, &mo, &error);
    cr_assert_not_null(plain, "%s", error ? error->message : "");
    SimTaskGraph *tgp;
    SimTimeline tlp = { 0 };
    SimLowering *lwp;
    run_lowered(g, m, plain, cm, &tgp, &tlp, &lwp);
    cr_assert_not(tlp.deadlock);
    double total = 0;
    for (int i = 0; i < sim_machine_n_links(m); i++) {
      cr_expect_float_eq(tl.link_bytes[i], tlp.link_bytes[i], 1e-9 * S, "tp %d, link %d: %g "
                         "bytes, %g without the overlap", n, i, tl.link_bytes[i],
                         tlp.link_bytes[i]);
      total += tl.link_bytes[i];
    }
    /* The overlapped collectives' share, on the links to and from the switch: each ring,
     * gather or reduce-scatter, (n - 1) S / n out of each of its n GPUs. */
    cr_expect_geq(total, 2.0 * (n - 1) * S * (ring_flows / (double)n + waits[1]) * (1 - 1e-9),
                  "tp %d: %g bytes on the links", n, total);
    sim_timeline_clear(&tlp);
    sim_lowering_free(lwp);
    SimOptions o = sim_options_default();
    g_autoptr(SimReport) ro = sim_simulate(g, m, s, cm, &o, &error);
    g_autoptr(SimReport) rp = sim_simulate(g, m, plain, cm, &o, &error);
    cr_assert(ro && rp);
    for (int d = 0; d < 4; d++)
      cr_expect_eq(sim_report_peak_memory(ro, d), sim_report_peak_memory(rp, d), "tp %d, GPU %d",
                   n, d);
    /* (Whether it is faster depends on the GEMMs: chunking a reduce-scatter adds its
     * steps' latencies, which these GEMMs of microseconds hide at TP 2 and not at 4.) */
    sim_timeline_clear(&tl);
    sim_lowering_free(lw);
  }
}

/* Context parallelism over 2 GPUs: every op holds its own positions, so with the ring
 * no activation moves between the GPUs but the keys and values in the ring (flows of the
 * attention op, lower.c, build_ring()), while without it (the same splits,
 * context_parallel 1) each attention shard gathers the half of its key and value input
 * it lacks; the gradients are all-reduced over the context ranks exactly as a
 * data-parallel pair's are. */
Test(lowering, context_parallelism_keeps_activations_local_and_reduces_over_its_ranks)
{
  g_autoptr(SimMachine) m = switch4(100);
  g_autoptr(SimCostModel) cm = roofline();
  double moved[2], synced[2];
  for (int k = 0; k < 3; k++) {
    g_autoptr(SimGraph) g = zoo("llama", "layers=2,hidden=256,heads=4,kv_heads=2,ffn=512,"
                                         "seq=64,vocab=512,batch=4");
    SimMegatronOptions mo = sim_megatron_options_default();
    mo.dp = k < 2 ? 1 : 2;
    mo.cp = k < 2 ? 2 : 1;
    mo.microbatch_size = 2;
    GError *error = NULL;
    g_autoptr(SimStrategy) s = sim_strategy_megatron(g, m, &mo, &error);
    cr_assert_not_null(s, "%s", error ? error->message : "");
    if (k == 1)
      sim_strategy_set_context_parallel(s, 1);
    SimTaskGraph *tg;
    SimTimeline tl = { 0 };
    SimLowering *lw;
    run_lowered(g, m, s, cm, &tg, &tl, &lw);
    cr_assert_not(tl.deadlock);
    double transfer = 0, sync = 0, ring = 0;
    for (int t = 0; t < tg->n_tasks; t++) {
      const SimTask *task = &tg->task[t];
      if (task->kind != SIM_TASK_FLOW)
        continue;
      if (task->cls == SIM_CLASS_TRANSFER && task->shard >= 0)
        ring += task->bytes;
      else if (task->cls == SIM_CLASS_TRANSFER)
        transfer += task->bytes;
      else if (task->cls == SIM_CLASS_GRAD_SYNC)
        sync += task->bytes;
    }
    /* The ring's one step: each of the 2 shards receives the other's keys and values
     * forward (2 samples x 32 positions x 2 (K, V) x 2 kv_heads x 64 x 4 bytes) and
     * them with their gradients backward (twice that), in 2 layers and 2 micro-batches. */
    double block = 2.0 * 32 * 2 * 2 * 64 * 4;
    cr_expect_float_eq(ring, k == 0 ? 2 * 2 * 2 * (block + 2 * block) : 0, 1e-9,
                       "k %d: %g bytes in rings", k, ring);
    if (k < 2) {
      moved[k] = transfer;
      synced[k] = sync;
    } else {
      cr_expect_float_eq(synced[0], sync, 1e-6, "cp 2: %g gradient bytes, dp 2: %g",
                         synced[0], sync);
    }
    sim_timeline_clear(&tl);
    sim_lowering_free(lw);
  }
  cr_expect_eq(moved[0], 0, "ring: %g bytes of activations moved", moved[0]);
  /* Forward, each of the two attention layers' two shards receives the other's 2 x 32
   * positions of the 256-wide fp32 input. */
  double half = 2.0 * 32 * 256 * 4;
  cr_expect(moved[1] >= 2 * 2 * half, "whole reads: %g bytes moved, expected at least %g",
            moved[1], 2 * 2 * half);
}

/* The rate a flow from @a to @b reaches alone: its route's slowest link's bandwidth
 * times the efficiency of its kind (sim_coll_link_capacity()). */
static double route_capacity(const SimMachine *m, int a, int b)
{
  SimCollParams cp = sim_coll_params_default();
  int n = 0;
  const int *links = sim_machine_route(m, a, b, &n);
  double bw = INFINITY;
  for (int i = 0; i < n; i++)
    bw = fmin(bw, sim_coll_link_capacity(m, &cp, links[i]));
  return bw;
}

/* The tasks of context-parallel attention op @x's ring for (@cls, @mb, @sh) in task order:
 * the op's compute task, then the ring's n steps (lower.c, build_ring()); returns how
 * many, and in @flow the first flow into the shard of that pass, or -1. */
static int ring_tasks(const SimTaskGraph *tg, int x, SimTaskClass cls, int mb, int sh,
                      int *ids, int cap, int *flow)
{
  int n = 0, first = -1;
  *flow = -1;
  for (int t = 0; t < tg->n_tasks; t++) {
    const SimTask *task = &tg->task[t];
    if (task->op != x || task->mb != mb || task->shard != sh)
      continue;
    if (task->kind == SIM_TASK_COMPUTE && task->cls == cls && n < cap) {
      if (first < 0)
        first = t;
      ids[n++] = t;
    } else if (task->kind == SIM_TASK_FLOW && first >= 0 && *flow < 0 && n > 1) {
      *flow = t;
    }
  }
  return n;
}

/* A LLaMA layer over 2,048 positions split n ways, on 4 GPUs of a switch of @gbps GB/s a
 * GPU with 1 us of latency; @extra bytes (0: none) sent from GPU 0 to GPU 1 from the
 * start.  Returns the lowering (for its task graph) and its timeline. */
static SimLowering *run_ring(SimGraph *g, SimMachine *m, SimCostModel *cm, int n, double extra,
                             SimTimeline *tl, int *extra_id)
{
  SimMegatronOptions mo = sim_megatron_options_default();
  mo.cp = n;
  mo.microbatch_size = 2;
  GError *error = NULL;
  g_autoptr(SimStrategy) s = sim_strategy_megatron(g, m, &mo, &error);
  cr_assert_not_null(s, "%s", error ? error->message : "");
  SimOptions o = sim_options_default();
  o.fold = FALSE;
  SimCollParams cp = sim_coll_params_default();
  SimLowering *lw = sim_lowering_new(g, m, s, cm, &o, &cp, NULL);
  sim_lowering_build(lw);
  SimTaskGraph *tg = sim_lowering_taskgraph(lw);
  if (extra > 0) {
    SimTask f = sim_task_flow(SIM_CLASS_TRANSFER, 0, 1, extra, -1, -1);
    sim_taskgraph_add(tg, sim_taskgraph_block_new(tg), &f);
  }
  sim_taskgraph_assemble(tg);
  *extra_id = -1;
  if (extra > 0)
    for (int t = 0; t < tg->n_tasks; t++)
      if (tg->task[t].kind == SIM_TASK_FLOW && tg->task[t].op == -1 && tg->task[t].bytes == extra)
        *extra_id = t;
  SimEngine *e = sim_engine_new(m, &cp);
  sim_engine_run(e, tg, tl);
  sim_engine_free(e);
  cr_assert_not(tl->deadlock);
  return lw;
}

/* One LLaMA layer over 2,048 positions (4 samples), and its attention op in @x. */
static SimGraph *ring_llama(int *x)
{
  SimGraph *g = zoo("llama", "layers=1,hidden=256,heads=4,kv_heads=2,ffn=512,seq=2048,"
                             "vocab=512,batch=4");
  *x = -1;
  for (int k = 0; k < sim_graph_n_ops(g); k++)
    if (sim_graph_op_type(g, k) == SIM_OP_ATTENTION)
      *x = k;
  cr_assert_geq(*x, 0);
  return g;
}

/* Context parallelism's ring on the links (lower.c, build_ring()): on a machine where
 * nothing else moves, the steps of a shard's ring end (n - 1) max(c, f) + c after the
 * op's compute task (forward; backward plus the op's other kernels, which follow the last
 * step), c being a step's attention (core / n) and f a flow's latency plus its bytes over
 * the bandwidth between neighbours (the route's, times the collective parameters' link
 * efficiency): the block's keys and values (2 samples x 2048 / n
 * positions x 2 x 2 kv_heads x 64 x 4 bytes) forward, twice that backward.  Every
 * forward is checked, and the first micro-batch's backward (the gradients of the second
 * synchronize while its backward runs); with n 2 and 4, on links slower (f > c) and
 * faster (f < c) than the attention. */
Test(lowering, context_parallel_ring_waits_are_the_closed_form_on_an_idle_machine)
{
  g_autoptr(SimCostModel) cm = roofline();
  int x;
  g_autoptr(SimGraph) g = ring_llama(&x);
  for (int k = 0; k < 4; k++) {
    int n = k % 2 ? 4 : 2;
    double gbps = k < 2 ? 2 : 1000;
    g_autoptr(SimMachine) m = switch4_latency(gbps, 1);
    SimTimeline tl = { 0 };
    int none;
    SimLowering *lw = run_ring(g, m, cm, n, 0, &tl, &none);
    const SimTaskGraph *tg = sim_lowering_taskgraph(lw);
    double lat = sim_machine_latency(m, 0, 1), bw = route_capacity(m, 0, 1);
    double block = 2.0 * (2048 / n) * 2 * 2 * 64 * 4;
    int checked = 0;
    for (int pass = 0; pass < 2; pass++)
      for (int mb = 0; mb < 2; mb++)
        for (int sh = 0; sh < n; sh++) {
          if (pass == 1 && mb == 1)
            continue;
          int ids[16], flow;
          int got = ring_tasks(tg, x, pass ? SIM_CLASS_BACKWARD : SIM_CLASS_FORWARD, mb, sh,
                               ids, 16, &flow);
          cr_assert_eq(got, n + 1, "n %d: %d tasks", n, got);
          double c = tg->task[ids[1]].duration;
          double rest = tg->task[ids[n]].duration - c;
          double f = lat + (pass ? 2 : 1) * block / bw;
          cr_assert(k < 2 ? f > c : f < c, "k %d: f %g, c %g", k, f, c);
          double want = (n - 1) * fmax(c, f) + c + rest;
          double span = tl.end[ids[n]] - tl.end[ids[0]];
          cr_expect_float_eq(span, want, 1e-9 * want, "n %d, %g GB/s, pass %d, mb %d, shard %d: "
                             "%.12g s, closed form %.12g s", n, gbps, pass, mb, sh, span, want);
          checked++;
        }
    cr_assert_eq(checked, 3 * n);
    sim_timeline_clear(&tl);
    sim_lowering_free(lw);
  }
}

/* The time of op @x's attention kernels in @pass over extents @ext on @spec, scaled as
 * the op's time of shard @sh is scaled over the sum of its kernels (@scale). */
static double attention_kernels(const SimGraph *g, SimCostModel *cm, const SimDeviceSpec *spec,
                                int x, const int64_t *ext, SimPass pass, double *all)
{
  SimWork wk = { 0 };
  sim_graph_op_work(g, x, ext, pass, &wk);
  double a = 0;
  *all = 0;
  for (int i = 0; i < wk.n; i++) {
    double t = sim_cost_model_kernel_time(cm, spec, &wk.k[i]);
    *all += t;
    if (wk.k[i].kind == SIM_KERNEL_ATTENTION)
      a += t;
  }
  return a;
}

/* Megatron's two-chunk layout balances the causal attention over the ring (lower.c,
 * ring_attention()): every rank's n steps together take 1 / n of FlashAttention's kernel
 * over the whole sequence A(S) (2,048 causal queries against as many keys, the cost
 * model's), forward and backward, each step A(S) / n^2 (times the op's time over its
 * kernels' sum, 1 under the roofline) on every rank alike: less than the kernel of the
 * last rank's contiguous positions A_last (2,048 / n queries against all the keys before
 * and at them), which the cost model prices for a shard of the positions. */
Test(lowering, context_parallel_ring_balances_the_causal_attention)
{
  g_autoptr(SimCostModel) cm = roofline();
  int x;
  g_autoptr(SimGraph) g = ring_llama(&x);
  g_autoptr(SimMachine) m = switch4_latency(1000, 1);
  const SimDeviceSpec *spec = sim_machine_device_spec(m, 0);
  for (int n = 2; n <= 4; n += 2) {
    SimTimeline tl = { 0 };
    int none;
    SimLowering *lw = run_ring(g, m, cm, n, 0, &tl, &none);
    const SimTaskGraph *tg = sim_lowering_taskgraph(lw);
    for (int pass = 0; pass < 2; pass++)
      for (int sh = 0; sh < n; sh++) {
        SimPass sp = pass ? SIM_PASS_BACKWARD : SIM_PASS_FORWARD;
        /* The shard: a micro-batch of 2 samples, 2,048 / n positions, every head. */
        int64_t ext[SIM_MAX_ITER] = { 0 }, whole[SIM_MAX_ITER] = { 0 };
        for (int d = 0; d < sim_graph_op_n_dims(g, x); d++) {
          const char *name = sim_graph_op_dim_name(g, x, d);
          whole[d] = ext[d] = !strcmp(name, "b") ? 2 : sim_graph_op_dim_size(g, x, d);
          if (!strcmp(name, "s"))
            ext[d] = 2048 / n;
        }
        cr_assert_eq(whole[1], 2048);
        double all, all_whole;
        double last = attention_kernels(g, cm, spec, x, ext, sp, &all);
        double A = attention_kernels(g, cm, spec, x, whole, sp, &all_whole);
        double scale = sim_cost_model_op_time(cm, spec, g, x, ext, sp) / all;
        cr_assert_float_eq(scale, 1.0, 1e-12, "the roofline's op time is its kernels' sum");
        int ids[16], flow;
        int got = ring_tasks(tg, x, pass ? SIM_CLASS_BACKWARD : SIM_CLASS_FORWARD, 0, sh, ids,
                             16, &flow);
        cr_assert_eq(got, n + 1);
        double want = A / (n * n);
        for (int i = 1; i < n; i++)
          cr_expect_float_eq(tg->task[ids[i]].duration, want, 1e-12 * want, "n %d, pass %d, "
                             "shard %d, step %d: %.12g s, A(S) / n^2 %.12g s", n, pass, sh, i,
                             tg->task[ids[i]].duration, want);
        cr_expect_lt(n * want, last, "n %d: a rank's share %g s, the last rank's positions %g s",
                     n, n * want, last);
      }
    sim_timeline_clear(&tl);
    sim_lowering_free(lw);
  }
}

/* The same ring shares its links: with a long flow from GPU 0 to GPU 1 under way, the
 * ring's flow from GPU 0 to GPU 1 gets half of the link (max-min fairness), so the shard
 * on GPU 1 waits max(c, latency + 2 block / bandwidth) + c at n 2 where the shard on GPU 0,
 * whose flow comes the other way, still waits max(c, latency + block / bandwidth) + c. */
Test(lowering, context_parallel_ring_contends_with_other_flows)
{
  g_autoptr(SimCostModel) cm = roofline();
  g_autoptr(SimGraph) g = zoo("llama", "layers=1,hidden=256,heads=4,kv_heads=2,ffn=512,"
                                       "seq=2048,vocab=512,batch=4");
  int x = -1;
  for (int k = 0; k < sim_graph_n_ops(g); k++)
    if (sim_graph_op_type(g, k) == SIM_OP_ATTENTION)
      x = k;
  g_autoptr(SimMachine) m = switch4_latency(10, 1);
  double lat = sim_machine_latency(m, 0, 1), bw = route_capacity(m, 0, 1);
  double block = 2.0 * 1024 * 2 * 2 * 64 * 4;
  double spans[2][2];
  for (int with = 0; with < 2; with++) {
    SimTimeline tl = { 0 };
    int extra;
    SimLowering *lw = run_ring(g, m, cm, 2, with ? 1e9 : 0, &tl, &extra);
    const SimTaskGraph *tg = sim_lowering_taskgraph(lw);
    cr_assert(with ? extra >= 0 : extra < 0);
    for (int sh = 0; sh < 2; sh++) {
      int ids[4], flow;
      cr_assert_eq(ring_tasks(tg, x, SIM_CLASS_FORWARD, 0, sh, ids, 4, &flow), 3);
      cr_assert_geq(flow, 0);
      const SimTask *ft = &tg->task[flow];
      double c = tg->task[ids[1]].duration;
      gboolean shared = with && ft->device == 0 && ft->peer == 1;
      if (shared)
        cr_assert(tl.start[extra] + lat <= tl.start[flow] && tl.end[extra] >= tl.end[flow],
                  "the other flow runs all along the ring's");
      double want = fmax(c, lat + (shared ? 2 : 1) * block / bw) + c;
      spans[with][sh] = tl.end[ids[2]] - tl.end[ids[0]];
      cr_expect_float_eq(spans[with][sh], want, 1e-9 * want,
                         "%s, shard %d (flow %d -> %d): %.12g s, closed form %.12g s",
                         with ? "shared" : "alone", sh, ft->device, ft->peer, spans[with][sh],
                         want);
    }
    sim_timeline_clear(&tl);
    sim_lowering_free(lw);
  }
  cr_expect(spans[1][0] > spans[0][0] || spans[1][1] > spans[0][1],
            "contention slows the ring");
}

/* The same with random splits and devices: the MLP tower's first layer split p ways on
 * random distinct devices, everything else q ways on devices 0 .. q - 1 (p, q among 16,
 * 24, 32, 48 and 64, so that either side has many groups of holders).  Forward, the first
 * layer's output goes to the second layer's q shards; backward, its gradient comes back
 * to the p shards; each shard receives the rows of its own that no shard of the other
 * layer on its device holds, 64 x 4 bytes each (counted row by row here). */
Test(lowering, random_splits_send_every_consumer_exactly_the_rows_it_lacks)
{
  g_autoptr(SimGraph) g = zoo("mlp", "layers=2,hidden=64,input=32,classes=16,batch=192");
  GError *error = NULL;
  g_autoptr(SimMachine) m = sim_machine_load("dgx-a100:8", &error);
  cr_assert_not_null(m, "%s", error ? error->message : "");
  g_autoptr(SimCostModel) cm = roofline();
  int fc0 = 1, fc1 = 2;
  const int ways[] = { 16, 24, 32, 48, 64 };
  GRand *rng = g_rand_new_with_seed(11);
  for (int trial = 0; trial < 24; trial++) {
    int p = ways[g_rand_int_range(rng, 0, 5)], q = ways[g_rand_int_range(rng, 0, 5)];
    int perm[64];
    for (int i = 0; i < 64; i++)
      perm[i] = i;
    for (int i = 63; i > 0; i--) {
      int j = g_rand_int_range(rng, 0, i + 1), t = perm[i];
      perm[i] = perm[j];
      perm[j] = t;
    }
    SimStrategy *s = sim_strategy_data_parallel(g, m, q, &error);
    cr_assert_not_null(s, "%s", error ? error->message : "");
    int deg[8] = { p, 1, 1, 1, 1, 1, 1, 1 };
    cr_assert(sim_strategy_set_op(s, fc0, deg, perm, &error), "%s", error ? error->message : "");
    /* Row r: on which device the first layer holds it, and the second. */
    int p_dev[192], q_dev[192];
    for (int r = 0; r < 192; r++) {
      p_dev[r] = perm[r / (192 / p)];
      q_dev[r] = r / (192 / q);
    }
    int64_t fwd = 0, bwd = 0;
    for (int r = 0; r < 192; r++) {
      fwd += p_dev[r] != q_dev[r]; /* the second layer's shard lacks it */
      bwd += q_dev[r] != p_dev[r]; /* and the first layer's shard its gradient */
    }
    SimTaskGraph *tg;
    SimTimeline tl = { 0 };
    SimLowering *lw;
    run_lowered(g, m, s, cm, &tg, &tl, &lw);
    cr_assert_not(tl.deadlock);
    double sent[2] = { 0, 0 };
    for (int t = 0; t < tg->n_tasks; t++) {
      const SimTask *k = &tg->task[t];
      if (k->kind != SIM_TASK_FLOW || k->cls != SIM_CLASS_TRANSFER)
        continue;
      cr_assert(k->op == fc0 || k->op == fc1, "trial %d: a transfer tagged op %d", trial, k->op);
      sent[k->op == fc1] += k->bytes;
    }
    cr_assert_float_eq(sent[0], (double)fwd * 64 * 4, 0.5, "trial %d (p %d, q %d): forward %g "
                       "bytes, expected %g", trial, p, q, sent[0], (double)fwd * 64 * 4);
    cr_assert_float_eq(sent[1], (double)bwd * 64 * 4, 0.5, "trial %d (p %d, q %d): backward %g "
                       "bytes, expected %g", trial, p, q, sent[1], (double)bwd * 64 * 4);
    sim_timeline_clear(&tl);
    sim_lowering_free(lw);
    sim_strategy_free(s);
  }
  g_rand_free(rng);
}

Test(properties, random_strategies_keep_the_invariants)
{
  const char *models[][2] = {
    { "mlp", "layers=3,hidden=256,input=128,classes=64,batch=16,towers=2" },
    { "gpt", "layers=2,hidden=128,heads=4,seq=32,vocab=256,batch=8" },
    { "resnet-50", "batch=8" },
  };
  g_autoptr(SimCostModel) c = roofline();
  GRand *rng = g_rand_new_with_seed(42);
  for (size_t k = 0; k < G_N_ELEMENTS(models); k++) {
    g_autoptr(SimGraph) g = zoo(models[k][0], models[k][1]);
    for (int trial = 0; trial < 6; trial++) {
      g_autoptr(SimMachine) slow = switch4(25), fast = switch4(100);
      g_autoptr(SimStrategy) s = random_strategy(g, slow, rng);
      GError *error = NULL;
      cr_assert(sim_strategy_validate(s, g, slow, &error), "%s", error ? error->message : "");
      SimTaskGraph *tg;
      SimTimeline tl = { 0 };
      SimLowering *lw;
      run_lowered(g, slow, s, c, &tg, &tl, &lw);
      check_timeline(tg, &tl);
      double t_slow = tl.makespan;
      sim_timeline_clear(&tl);
      sim_lowering_free(lw);
      /* Four times the bandwidth on every link never makes an iteration slower. */
      SimOptions o = sim_options_default();
      o.fold = FALSE;
      double t_fast = simulate(g, fast, s, c, &o);
      cr_assert_leq(t_fast, t_slow * (1 + 1e-12), "%s trial %d: %g > %g", models[k][0], trial,
                    t_fast, t_slow);
    }
  }
  g_rand_free(rng);
}

Test(properties, flow_groups_change_no_timing)
{
  /* The engine runs a collective's flows as a group while their links are otherwise idle
   * (engine.c); random strategies, whose transfers interrupt groups at every point, time
   * every task as the flow-by-flow engine does, to rounding. */
  const char *models[][2] = {
    { "mlp", "layers=3,hidden=256,input=128,classes=64,batch=16,towers=2" },
    { "gpt", "layers=2,hidden=128,heads=4,seq=32,vocab=256,batch=8" },
    { "inception-v3", "batch=8" },
  };
  g_autoptr(SimCostModel) c = roofline();
  GRand *rng = g_rand_new_with_seed(11);
  SimDetail levels[3] = { SIM_DETAIL_FLOWS, SIM_DETAIL_COLLECTIVE, SIM_DETAIL_STEPS };
  for (size_t k = 0; k < G_N_ELEMENTS(models); k++) {
    g_autoptr(SimGraph) g = zoo(models[k][0], models[k][1]);
    for (int trial = 0; trial < 4; trial++) {
      g_autoptr(SimMachine) m = switch4(50);
      g_autoptr(SimStrategy) s = random_strategy(g, m, rng);
      SimOptions o = sim_options_default();
      o.fold = FALSE;
      o.detail = levels[trial % 3];
      SimCollParams cp = sim_coll_params_from_options(&o);
      SimLowering *lw = sim_lowering_new(g, m, s, c, &o, &cp, NULL);
      sim_lowering_build(lw);
      SimTaskGraph *tg = sim_lowering_taskgraph(lw);
      sim_taskgraph_assemble(tg);
      SimTimeline tl[2] = { { 0 }, { 0 } };
      for (int off = 0; off < 2; off++) {
        if (off)
          g_setenv("PARASOL_NO_FLOW_GROUPS", "1", TRUE);
        SimEngine *e = sim_engine_new(m, &cp);
        g_unsetenv("PARASOL_NO_FLOW_GROUPS");
        sim_engine_run(e, tg, &tl[off]);
        sim_engine_free(e);
        check_timeline(tg, &tl[off]);
      }
      double tol = tl[1].makespan * 1e-9;
      cr_assert_float_eq(tl[0].makespan, tl[1].makespan, tol, "%s trial %d: %.12g vs %.12g",
                         models[k][0], trial, tl[0].makespan, tl[1].makespan);
      for (int t = 0; t < tg->n_tasks; t++) {
        cr_assert_float_eq(tl[0].start[t], tl[1].start[t], tol, "%s task %d", models[k][0], t);
        cr_assert_float_eq(tl[0].end[t], tl[1].end[t], tol, "%s task %d", models[k][0], t);
      }
      sim_timeline_clear(&tl[0]);
      sim_timeline_clear(&tl[1]);
      sim_lowering_free(lw);
    }
  }
  g_rand_free(rng);
}

/* ---------------------------------------------------------------------------------- */
/* Folding                                                                              */

/* Gradient bucket size of the plans check_fold() builds (0: none, the library's default). */
static int64_t fold_bucket_bytes;
/* ... and whether they scatter-gather their pipeline messages. */
static gboolean fold_scatter_gather;
/* ... sequence parallelism (with tensor-parallel overlap) and ZeRO-1. */
static gboolean fold_sequence_parallel, fold_tp_overlap, fold_zero1, fold_check;
static int fold_cp = 1;
/* ... and the share of the optimizer offloaded to the host, overlapped or not. */
static double fold_offload;
static gboolean fold_offload_overlap;

/* Simulates a Megatron plan folded and not, checks that both agree, and returns the
 * folding picked (interned) and, in @time if given, the iteration time. */
static const char *check_fold_at(SimDetail detail, const char *machine, const char *model,
                                 const char *params, int dp, int tp, int pp, int mbs,
                                 SimSchedule sched, int chunks, SimRecompute rc,
                                 const char *expect_fold, double *time)
{
  g_autoptr(SimGraph) g = zoo(model, params);
  sim_graph_set_float_dtype(g, SIM_DTYPE_FP16);
  GError *error = NULL;
  g_autoptr(SimMachine) m = sim_machine_load(machine, &error);
  cr_assert_not_null(m);
  SimMegatronOptions mo = sim_megatron_options_default();
  mo.dp = dp;
  mo.tp = tp;
  mo.pp = pp;
  mo.microbatches = mbs;
  mo.schedule = sched;
  mo.chunks = chunks;
  mo.memory.recompute = rc;
  mo.sync.bucket_bytes = fold_bucket_bytes;
  mo.scatter_gather = fold_scatter_gather;
  mo.sequence_parallel = fold_sequence_parallel;
  mo.tp_comm_overlap = fold_tp_overlap;
  mo.memory.zero1 = fold_zero1;
  mo.memory.offload = fold_offload;
  mo.memory.offload_overlap = fold_offload_overlap;
  mo.cp = fold_cp;
  g_autoptr(SimStrategy) s = sim_strategy_megatron(g, m, &mo, &error);
  cr_assert_not_null(s, "%s", error ? error->message : "");
  SimOptions o = sim_options_default();
  o.detail = detail;
  o.fold_checked = fold_check;
  g_autoptr(SimReport) folded = sim_simulate(g, m, s, NULL, &o, &error);
  cr_assert_not_null(folded, "%s", error ? error->message : "");
  o.fold = FALSE;
  g_autoptr(SimReport) full = sim_simulate(g, m, s, NULL, &o, &error);
  cr_assert_not_null(full);
  if (expect_fold)
    cr_assert_str_eq(sim_report_folding(folded), expect_fold, "dp%d tp%d pp%d on %s", dp, tp, pp,
                     machine);
  double a = sim_report_iteration_time(folded), b = sim_report_iteration_time(full);
  cr_assert_float_eq(a, b, b * 1e-9, "dp%d tp%d pp%d on %s: folded %.9g vs %.9g", dp, tp, pp,
                     machine, a, b);
  if (strcmp(sim_report_folding(folded), "none"))
    cr_assert_lt(sim_report_n_tasks(folded), sim_report_n_tasks(full),
                 "dp%d tp%d pp%d on %s: %ld tasks folded, %ld not", dp, tp, pp, machine,
                 (long)sim_report_n_tasks(folded), (long)sim_report_n_tasks(full));
  for (int d = 0; d < sim_report_n_devices(full); d++) {
    cr_assert_eq(sim_report_peak_memory(folded, d), sim_report_peak_memory(full, d));
    cr_assert_float_eq(sim_report_compute_time(folded, d), sim_report_compute_time(full, d),
                       1e-9 * b);
  }
  if (time)
    *time = a;
  return g_intern_string(sim_report_folding(folded));
}

static void check_fold(const char *machine, const char *model, const char *params, int dp,
                       int tp, int pp, int mbs, SimSchedule sched, int chunks,
                       SimRecompute rc, const char *expect_fold)
{
  check_fold_at(SIM_DETAIL_FLOWS, machine, model, params, dp, tp, pp, mbs, sched, chunks, rc,
                expect_fold, NULL);
  check_fold_at(SIM_DETAIL_COLLECTIVE, machine, model, params, dp, tp, pp, mbs, sched, chunks, rc,
                expect_fold, NULL);
}

/* Plans with the optimizer offloaded to the host fold (simulate.c, fold.c): each folded
 * device's PCIe transfers to and from the host are shadows on its own links, which the
 * route check maps link by link with the rest, symmetry by symmetry (a DGX's GPUs share a
 * PCIe switch two by two, and the switches a socket's link two by two; on pcie-4gpu the
 * GPUs' own transfers cross the same PCIe links).  Folded equals unfolded (iteration time
 * to 1e-9, every GPU's peak memory and compute time, check_fold_at()) with the whole
 * optimizer and half of it offloaded, overlapped or not, with ZeRO-1, on one and two nodes,
 * the replicas and the tensor-parallel ranks folded on the DGXs. */
Test(folding, offloaded_optimizer_plans_fold_where_exact)
{
  const char *gpt = "layers=4,hidden=256,heads=8,seq=128,vocab=1024,batch=32";
  const char *both = "data-parallel replicas and tensor-parallel ranks";
  fold_zero1 = TRUE;
  for (int k = 0; k < 4; k++) {
    fold_offload = k % 2 ? 0.5 : 1.0;
    fold_offload_overlap = k >= 2;
    check_fold("dgx-a100", "gpt", gpt, 4, 2, 1, 2, SIM_SCHEDULE_1F1B, 1, SIM_RECOMPUTE_NONE,
               both);
    check_fold("dgx-a100", "gpt", gpt, 2, 4, 1, 2, SIM_SCHEDULE_1F1B, 1, SIM_RECOMPUTE_FULL,
               both);
    check_fold("dgx-a100:2", "gpt", gpt, 2, 8, 1, 2, SIM_SCHEDULE_1F1B, 1, SIM_RECOMPUTE_NONE,
               both);
    check_fold("dgx-a100:2", "gpt", gpt, 4, 2, 2, 4, SIM_SCHEDULE_1F1B, 1, SIM_RECOMPUTE_NONE,
               both);
    check_fold("pcie-4gpu:2", "gpt", gpt, 4, 2, 1, 2, SIM_SCHEDULE_1F1B, 1, SIM_RECOMPUTE_FULL,
               NULL);
    /* The host's copies are no rings: a node's rings stay one flow each beside them
     * (sim_taskgraph_rings_private()), which changes no time. */
    g_autoptr(SimGraph) g = zoo("gpt", gpt);
    sim_graph_set_float_dtype(g, SIM_DTYPE_FP16);
    g_autoptr(SimMachine) m = sim_machine_load("dgx-a100:2", NULL);
    SimMegatronOptions mo = sim_megatron_options_default();
    mo.dp = 2;
    mo.tp = 8;
    mo.microbatches = 2;
    mo.memory.zero1 = TRUE;
    mo.memory.offload = fold_offload;
    mo.memory.offload_overlap = fold_offload_overlap;
    g_autoptr(SimStrategy) s = sim_strategy_megatron(g, m, &mo, NULL);
    cr_assert_not_null(s);
    double t[2];
    for (int merge = 0; merge < 2; merge++) {
      SimOptions o = sim_options_default();
      o.fold = FALSE;
      o.merge_rings = merge;
      GError *error = NULL;
      g_autoptr(SimReport) r = sim_simulate(g, m, s, NULL, &o, &error);
      cr_assert_not_null(r, "%s", error ? error->message : "");
      t[merge] = sim_report_iteration_time(r);
    }
    cr_expect_float_eq(t[1], t[0], 1e-9 * t[0], "rings merged %.12g s, not %.12g s", t[1], t[0]);
  }
  fold_zero1 = FALSE;
  fold_offload = 0;
  fold_offload_overlap = FALSE;
}

Test(folding, equals_the_unfolded_simulation)
{
  const char *gpt = "layers=4,hidden=256,heads=8,seq=128,vocab=1024,batch=32";
  const char *both = "data-parallel replicas and tensor-parallel ranks";
  check_fold("dgx-a100", "gpt", gpt, 2, 2, 2, 4, SIM_SCHEDULE_1F1B, 1, SIM_RECOMPUTE_NONE, both);
  check_fold("dgx-a100", "gpt", gpt, 2, 4, 1, 2, SIM_SCHEDULE_1F1B, 1, SIM_RECOMPUTE_FULL, both);
  check_fold("dgx-a100", "gpt", gpt, 1, 2, 4, 8, SIM_SCHEDULE_1F1B, 1, SIM_RECOMPUTE_SELECTIVE,
             "tensor-parallel ranks");
  check_fold("dgx-a100", "gpt", gpt, 2, 2, 2, 4, SIM_SCHEDULE_INTERLEAVED, 2, SIM_RECOMPUTE_NONE,
             both);
  check_fold("dgx-a100:4", "gpt", gpt, 4, 8, 1, 2, SIM_SCHEDULE_1F1B, 1, SIM_RECOMPUTE_FULL, both);
  check_fold("dgx-a100:4", "gpt", gpt, 2, 8, 2, 8, SIM_SCHEDULE_1F1B, 1, SIM_RECOMPUTE_NONE, both);
  /* Stages that end in the middle of a node send across rails, through spines that
   * flows pick by hashing, so ranks see different contention: whatever folding the
   * simulator keeps must still be exact. */
  check_fold("dgx-a100:4", "gpt", gpt, 2, 4, 4, 8, SIM_SCHEDULE_1F1B, 1, SIM_RECOMPUTE_NONE, NULL);
  check_fold("dgx-a100:2", "resnet-50", "batch=64", 16, 1, 1, 1, SIM_SCHEDULE_1F1B, 1,
             SIM_RECOMPUTE_NONE, "data-parallel replicas");
  /* Two GPUs a NIC: the folded ranks' data-parallel rings (TP 8) and pipeline sends (TP 4,
   * PP 2) cross the same NICs as their representatives', as shadows. */
  check_fold("vtrain-a100:2", "gpt", gpt, 2, 8, 1, 2, SIM_SCHEDULE_1F1B, 1, SIM_RECOMPUTE_FULL,
             both);
  check_fold("vtrain-a100:2", "gpt", gpt, 2, 4, 2, 4, SIM_SCHEDULE_1F1B, 1, SIM_RECOMPUTE_FULL,
             both);
  /* Data-parallel rings over several GPUs of each node run as several channels (rotations
   * inside the nodes), some of whose flows join the same two GPUs: each channel's flow has
   * its own shadow. */
  check_fold("dgx1-v100:2", "gpt", gpt, 8, 2, 1, 2, SIM_SCHEDULE_1F1B, 1, SIM_RECOMPUTE_FULL,
             NULL);
  check_fold("flexflow-p100", "gpt", gpt, 4, 2, 2, 4, SIM_SCHEDULE_1F1B, 1, SIM_RECOMPUTE_FULL,
             NULL);
  check_fold("pcie-4gpu:2", "gpt", gpt, 4, 2, 1, 2, SIM_SCHEDULE_1F1B, 1, SIM_RECOMPUTE_FULL,
             NULL);
  /* Gradients in several 25 MB buckets per tensor-parallel rank: each rank's data-parallel
   * group buckets its own gradients, folded or not. */
  const char *wide = "layers=2,hidden=2048,heads=16,seq=128,vocab=4096,batch=16";
  fold_bucket_bytes = 25000000;
  check_fold("dgx-a100", "gpt", wide, 2, 4, 1, 2, SIM_SCHEDULE_1F1B, 1, SIM_RECOMPUTE_FULL, both);
  check_fold("dgx-a100:4", "gpt", wide, 2, 8, 2, 4, SIM_SCHEDULE_1F1B, 1, SIM_RECOMPUTE_NONE,
             both);
  fold_bucket_bytes = 0;
  /* Pipeline messages scatter-gathered: the representative takes the parts of the ranks
   * folded away as they reach it, and their relays run as shadows. */
  fold_scatter_gather = TRUE;
  check_fold("vtrain-a100:2", "gpt", gpt, 2, 4, 2, 4, SIM_SCHEDULE_1F1B, 1, SIM_RECOMPUTE_FULL,
             both);
  check_fold("dgx-a100:4", "gpt", gpt, 2, 8, 2, 4, SIM_SCHEDULE_1F1B, 1, SIM_RECOMPUTE_NONE,
             both);
  check_fold("dgx-a100:2", "gpt", gpt, 2, 4, 2, 4, SIM_SCHEDULE_INTERLEAVED, 2,
             SIM_RECOMPUTE_SELECTIVE, NULL);
  fold_scatter_gather = FALSE;
}

/* On dgx-a100:N (a rail-optimized network) the replica shift of a plan whose replicas span
 * several nodes is not a link-by-link map of the traffic (a gradient ring's edge inside
 * a leaf becomes one across leaves), so the route check refuses to fold the replicas.
 * Where every replica's flows still cross links like replica 0's, the replicas are folded
 * all the same and the run checked where SimOptions.fold_checked asks: these plans' folded
 * runs pass the check and predict what the unfolded ones do (check_fold_at()), without
 * fold_checked (the default) they fold less (what the route check allows), and a brief
 * run gives the report's time, or past a bound a lower bound above it.
 * Where the check refutes a folded run, the run made again folds the ranks alone and is
 * exact too. */
Test(folding, replicas_the_routes_refuse_fold_with_the_run_checked)
{
  const char *gpt = "layers=8,hidden=1024,heads=16,seq=512,vocab=1024,batch=192";
  const char *checked = "data-parallel replicas (run checked)";
  struct {
    const char *machine;
    int dp, tp, pp;
    const char *fold;
  } plans[] = {
    { "dgx-a100:4", 16, 1, 2, checked },
    { "dgx-a100:8", 16, 1, 4, checked },
    { "dgx-a100:8", 32, 1, 2, checked },
    /* The check refutes these: the tensor-parallel ranks' gradient rings cross nodes
     * differently from one replica to the next. */
    { "dgx-a100:4", 4, 4, 2, "tensor-parallel ranks" },
    { "dgx-a100:8", 8, 4, 2, "tensor-parallel ranks" },
  };
  for (guint i = 0; i < G_N_ELEMENTS(plans); i++) {
    fold_check = TRUE;
    check_fold_at(SIM_DETAIL_FLOWS, plans[i].machine, "gpt", gpt, plans[i].dp, plans[i].tp,
                  plans[i].pp, 96 / plans[i].dp, SIM_SCHEDULE_1F1B, 1, SIM_RECOMPUTE_NONE,
                  plans[i].fold, NULL);
    fold_check = FALSE;
    g_autoptr(SimGraph) g = zoo("gpt", gpt);
    sim_graph_set_float_dtype(g, SIM_DTYPE_FP16);
    g_autoptr(SimMachine) m = sim_machine_load(plans[i].machine, NULL);
    SimMegatronOptions mo = sim_megatron_options_default();
    mo.dp = plans[i].dp;
    mo.tp = plans[i].tp;
    mo.pp = plans[i].pp;
    mo.microbatches = 96 / plans[i].dp;
    g_autoptr(SimStrategy) s = sim_strategy_megatron(g, m, &mo, NULL);
    cr_assert_not_null(s);
    SimOptions o = sim_options_default();
    o.fold_checked = TRUE;
    g_autoptr(SimReport) r = sim_simulate(g, m, s, NULL, &o, NULL);
    cr_assert_not_null(r);
    SimBrief b;
    cr_assert(sim_simulate_brief(g, m, s, NULL, &o, INFINITY, &b, NULL));
    double t = sim_report_iteration_time(r);
    cr_assert_float_eq(b.time, t, 1e-12 * t, "%s: brief %.17g, report %.17g", plans[i].machine,
                       b.time, t);
    /* Cut past a bound: a lower bound of the time, above the bound. */
    SimBrief c;
    cr_assert(sim_simulate_brief(g, m, s, NULL, &o, 0.6 * t, &c, NULL));
    cr_assert(c.cut && c.time > 0.6 * t && c.time <= t * (1 + 1e-12), "%s: cut %d at %.17g of %.17g",
              plans[i].machine, c.cut, c.time, t);
    o.fold_checked = FALSE;
    g_autoptr(SimReport) off = sim_simulate(g, m, s, NULL, &o, NULL);
    cr_assert_not_null(off);
    cr_assert_null(strstr(sim_report_folding(off), "checked"), "%s: %s", plans[i].machine,
                   sim_report_folding(off));
    cr_assert_float_eq(sim_report_iteration_time(off), t, 1e-9 * t);
  }
}

/* Folding tries both symmetries, then replicas alone, then ranks alone.  When the first
 * is refused and two remain, a plan of many micro-batches asks the second of a copy with
 * the fewest micro-batches its schedule allows before lowering it in full; a plan of 2
 * lowers it at once.  Both must pick the same folding, whichever it is: refused ranks on
 * GPUs wired unevenly (replicas alone), refused replicas over hashed spines or shared
 * NICs (ranks alone), interleaved chunks, scatter-gathered messages. */
static const char *folding_of(const char *machine, int dp, int tp, int pp, int mbs,
                              SimSchedule sched, int chunks, gboolean sg, double *time)
{
  fold_scatter_gather = sg;
  const char *f = check_fold_at(SIM_DETAIL_FLOWS, machine, "gpt",
                                "layers=4,hidden=256,heads=8,seq=128,vocab=1024,batch=64", dp, tp,
                                pp, mbs, sched, chunks, SIM_RECOMPUTE_NONE, NULL, time);
  fold_scatter_gather = FALSE;
  return f;
}

Test(folding, does_not_depend_on_the_number_of_micro_batches)
{
  struct {
    const char *machine;
    int dp, tp, pp, chunks;
    gboolean sg;
  } plans[] = {
    { "dgx-a100:4", 2, 4, 4, 1, FALSE }, { "dgx-a100:4", 2, 8, 2, 1, FALSE },
    { "vtrain-a100:2", 2, 4, 2, 1, FALSE }, { "vtrain-a100:2", 2, 4, 2, 1, TRUE },
    { "dgx-a100:2", 2, 4, 2, 2, FALSE }, { "dgx1-v100:2", 4, 2, 2, 1, FALSE },
    { "pcie-4gpu:2", 2, 2, 2, 1, FALSE }, { "dgx1-v100:2", 2, 4, 2, 1, FALSE },
    { "flexflow-p100", 4, 2, 1, 1, FALSE }, { "dgx1-p100:2", 4, 2, 1, 1, FALSE },
  };
  int replicas_alone = 0, ranks_alone = 0;
  for (guint i = 0; i < G_N_ELEMENTS(plans); i++) {
    SimSchedule sched = plans[i].chunks > 1 ? SIM_SCHEDULE_INTERLEAVED : SIM_SCHEDULE_1F1B;
    int fewest = plans[i].chunks > 1 ? plans[i].pp / plans[i].chunks : 1;
    double t_few, t_many;
    const char *few = folding_of(plans[i].machine, plans[i].dp, plans[i].tp, plans[i].pp,
                                 2 * fewest, sched, plans[i].chunks, plans[i].sg, &t_few);
    const char *many = folding_of(plans[i].machine, plans[i].dp, plans[i].tp, plans[i].pp,
                                  16 * fewest, sched, plans[i].chunks, plans[i].sg, &t_many);
    cr_assert_str_eq(many, few, "%s dp%d tp%d pp%d", plans[i].machine, plans[i].dp,
                     plans[i].tp, plans[i].pp);
    /* More micro-batches of the same batch: a different run, not the same one. */
    cr_assert_neq(t_few, t_many);
    replicas_alone += !strcmp(few, "data-parallel replicas");
    ranks_alone += !strcmp(few, "tensor-parallel ranks");
  }
  /* Plans that end on the second try and on the third, or the check above says little. */
  cr_assert_gt(replicas_alone, 0);
  cr_assert_gt(ranks_alone, 0);
}

/* Random Megatron plans on machines whose GPUs share links in different ways (a NIC per
 * GPU pair, the DGX-1's cube mesh, one NIC per node, PCIe switches, a rail per GPU):
 * whatever folding the simulator picks, its run equals the unfolded one. */
Test(folding, random_megatron_plans_equal_the_unfolded_simulation)
{
  const char *machines[][2] = { { "vtrain-a100:2", "16" }, { "dgx1-v100:2", "16" },
                                { "flexflow-p100", "16" }, { "pcie-4gpu:2", "8" },
                                { "dgx-a100:2", "16" }, { "dgx1-p100:2", "16" } };
  const char *gpt = "layers=4,hidden=256,heads=8,seq=128,vocab=1024,batch=32";
  GRand *rng = g_rand_new_with_seed(11);
  int done = 0;
  while (done < 24) {
    int mi = g_rand_int_range(rng, 0, G_N_ELEMENTS(machines));
    int n = atoi(machines[mi][1]);
    int tp = 1 << g_rand_int_range(rng, 0, 3), pp = 1 << g_rand_int_range(rng, 0, 2);
    int dp = g_rand_int_range(rng, 0, 4) ? n / (tp * pp) : MAX(1, n / (2 * tp * pp));
    if (dp < 1 || 32 % dp || (32 / dp) % 2)
      continue;
    int mbs = 2;
    SimSchedule sched = SIM_SCHEDULE_1F1B;
    int chunks = 1;
    if (pp > 1 && g_rand_int_range(rng, 0, 3) == 0) {
      sched = SIM_SCHEDULE_INTERLEAVED;
      chunks = 2;
    }
    SimRecompute rc = (SimRecompute)g_rand_int_range(rng, 0, 3);
    fold_scatter_gather = pp > 1 && g_rand_boolean(rng);
    fold_sequence_parallel = tp > 1 && g_rand_boolean(rng);
    fold_tp_overlap = fold_sequence_parallel && done % 2;
    fold_zero1 = dp > 1 && g_rand_boolean(rng);
    fold_bucket_bytes = g_rand_boolean(rng) ? 0 : 1000000;
    SimDetail detail = g_rand_boolean(rng) ? SIM_DETAIL_FLOWS : SIM_DETAIL_COLLECTIVE;
    check_fold_at(detail, machines[mi][0], "gpt", gpt, dp, tp, pp, mbs, sched, chunks, rc, NULL,
                  NULL);
    done++;
  }
  fold_scatter_gather = fold_sequence_parallel = fold_tp_overlap = fold_zero1 = FALSE;
  fold_bucket_bytes = 0;
  g_rand_free(rng);
}

/* Sequence parallelism folds the tensor-parallel ranks: a rank that takes a piece of the
 * sequence from a rank folded away waits for its own shard of the producer, whose timeline
 * the other's is (lower-tensors.c, stand_in()), and the folded run predicts what the full
 * one does (check_fold_at()): GPT with TP 8 and TP 4 over two DGX A100 nodes, with and
 * without pipelines and recomputation, flows per rank and whole collectives. */
Test(folding, sequence_parallel_plans_fold_their_tensor_parallel_ranks)
{
  const char *gpt = "layers=4,hidden=256,heads=8,seq=128,vocab=1024,batch=32";
  fold_sequence_parallel = TRUE;
  check_fold_at(SIM_DETAIL_FLOWS, "dgx-a100:2", "gpt", gpt, 2, 8, 1, 2, SIM_SCHEDULE_1F1B, 1,
                SIM_RECOMPUTE_NONE, "data-parallel replicas and tensor-parallel ranks", NULL);
  check_fold_at(SIM_DETAIL_FLOWS, "dgx-a100:2", "gpt", gpt, 1, 8, 2, 4, SIM_SCHEDULE_1F1B, 1,
                SIM_RECOMPUTE_FULL, "tensor-parallel ranks", NULL);
  check_fold_at(SIM_DETAIL_COLLECTIVE, "dgx-a100:2", "gpt", gpt, 2, 4, 2, 4,
                SIM_SCHEDULE_INTERLEAVED, 2, SIM_RECOMPUTE_SELECTIVE,
                "data-parallel replicas and tensor-parallel ranks", NULL);
  /* With the gathers and reduce-scatters overlapped with their GEMMs (waits on each rank
   * instead of flows between ranks). */
  fold_tp_overlap = TRUE;
  check_fold_at(SIM_DETAIL_FLOWS, "dgx-a100:2", "gpt", gpt, 2, 8, 1, 2, SIM_SCHEDULE_1F1B, 1,
                SIM_RECOMPUTE_NONE, "data-parallel replicas and tensor-parallel ranks", NULL);
  check_fold_at(SIM_DETAIL_COLLECTIVE, "dgx-a100:2", "gpt", gpt, 2, 4, 2, 4,
                SIM_SCHEDULE_INTERLEAVED, 2, SIM_RECOMPUTE_SELECTIVE,
                "data-parallel replicas and tensor-parallel ranks", NULL);
  fold_tp_overlap = FALSE;
  fold_sequence_parallel = FALSE;
}

/* Context parallelism's rings (lower.c, build_ring()) fold with their replicas: each ring
 * lies inside a data-parallel replica, so a folded run simulates whole rings and predicts
 * what the full one does (check_fold_at()); the tensor-parallel ranks, among which the
 * context ranks sit, are not folded.  LLaMA with CP 2 under TP 2 and DP 2 over two DGX
 * A100 nodes, with a pipeline and full recomputation (whose recomputed attention is a
 * ring too), with sequence parallelism and its overlap, per flow and whole collectives. */
Test(folding, context_parallel_rings_fold_with_their_replicas)
{
  const char *llama = "layers=2,hidden=256,heads=8,kv_heads=2,ffn=512,seq=512,vocab=1024,"
                      "batch=32";
  fold_cp = 2;
  check_fold_at(SIM_DETAIL_FLOWS, "dgx-a100:2", "llama", llama, 2, 2, 1, 2, SIM_SCHEDULE_1F1B, 1,
                SIM_RECOMPUTE_NONE, "data-parallel replicas", NULL);
  check_fold_at(SIM_DETAIL_COLLECTIVE, "dgx-a100:2", "llama", llama, 2, 2, 2, 4,
                SIM_SCHEDULE_1F1B, 1, SIM_RECOMPUTE_FULL, "data-parallel replicas", NULL);
  fold_sequence_parallel = fold_tp_overlap = TRUE;
  check_fold_at(SIM_DETAIL_FLOWS, "dgx-a100:2", "llama", llama, 2, 2, 1, 4, SIM_SCHEDULE_1F1B, 1,
                SIM_RECOMPUTE_SELECTIVE, "data-parallel replicas", NULL);
  fold_sequence_parallel = fold_tp_overlap = FALSE;
  fold_cp = 1;
}

/* A Megatron plan of @tp x @pp x @dp GPUs and @mbs micro-batches, pipeline messages
 * scatter-gathered or not; fails the test if the builder refuses it. */
static SimStrategy *megatron_plan(SimGraph *g, SimMachine *m, int tp, int pp, int dp, int mbs,
                                  gboolean scatter_gather)
{
  SimMegatronOptions mo = sim_megatron_options_default();
  mo.tp = tp;
  mo.pp = pp;
  mo.dp = dp;
  mo.microbatches = mbs;
  mo.scatter_gather = scatter_gather;
  GError *error = NULL;
  SimStrategy *s = sim_strategy_megatron(g, m, &mo, &error);
  cr_assert_not_null(s, "%s", error ? error->message : "");
  return s;
}

/* Megatron's scatter-gather of pipeline messages, in bytes: with TP n, every activation
 * and gradient that crosses from one stage to the next crosses once in n parts of 1/n
 * (one from each rank) instead of n times whole, and each rank of the receiving stage
 * passes its part to the n - 1 others.  A 2-layer GPT, TP 4, DP 2, PP 2 over two nodes
 * (Megatron's rank order puts stage 0 on the first node, stage 1 on the second), 2
 * micro-batches of 2 samples a replica, 128 tokens, hidden 256, fp16: a message is 2 x
 * 128 x 256 x 2 = 131,072 bytes; per micro-batch and replica, one forward and one backward
 * message cross: 8 in all. */
Test(scatter_gather, splits_each_pipeline_message_over_the_tensor_parallel_ranks)
{
  g_autoptr(SimGraph) g = zoo("gpt", "layers=2,hidden=256,heads=8,seq=128,vocab=1024,batch=8");
  sim_graph_set_float_dtype(g, SIM_DTYPE_FP16);
  GError *error = NULL;
  g_autoptr(SimMachine) m = sim_machine_load("vtrain-a100:2", &error);
  cr_assert_not_null(m);
  double cross[2] = { 0, 0 }, relayed[2] = { 0, 0 };
  int n_cross[2] = { 0, 0 }, n_relay[2] = { 0, 0 };
  double t[2];
  for (int sg = 0; sg < 2; sg++) {
    g_autoptr(SimStrategy) s = megatron_plan(g, m, 4, 2, 2, 2, sg);
    SimPlan *p = sim_plan_new(g, m, s, NULL, &error);
    cr_assert_not_null(p, "%s", error ? error->message : "");
    for (int i = 0; i < sim_plan_n_tasks(p); i++) {
      SimPlanTask pt;
      sim_plan_task(p, i, &pt);
      if (pt.kind != SIM_PLAN_COPY)
        continue;
      gboolean across = sim_machine_device_node(m, pt.device) != sim_machine_device_node(m, pt.peer);
      cr_assert(!pt.relay || !across, "a relay stays inside its stage's node");
      cr_assert(!pt.relay || sg);
      if (across) {
        cross[sg] += pt.bytes;
        n_cross[sg]++;
      } else if (pt.relay) {
        relayed[sg] += pt.bytes;
        n_relay[sg]++;
      }
    }
    SimOptions o = sim_options_default();
    g_autoptr(SimReport) r = sim_simulate(g, m, s, NULL, &o, &error);
    cr_assert_not_null(r, "%s", error ? error->message : "");
    t[sg] = sim_report_iteration_time(r);
    sim_plan_free(p);
  }
  const double msg = 2.0 * 128 * 256 * 2;
  cr_assert_eq(n_cross[0], 8 * 4, "whole: each of the 4 ranks sends each message (%d)",
               n_cross[0]);
  cr_assert_float_eq(cross[0], 8 * 4 * msg, 1e-6, "%g", cross[0]);
  cr_assert_eq(n_cross[1], 8 * 4, "parts: each of the 4 ranks sends a quarter (%d)", n_cross[1]);
  cr_assert_float_eq(cross[1], 8 * msg, 1e-6, "%g", cross[1]);
  cr_assert_eq(n_relay[1], 8 * 4 * 3, "each rank passes its part to the 3 others (%d)",
               n_relay[1]);
  cr_assert_float_eq(relayed[1], 8 * 3 * msg, 1e-6, "%g", relayed[1]);
  /* Two GPUs a NIC: a quarter of the bytes across the NICs is faster. */
  cr_assert_lt(t[1], t[0]);
}

/* sim_simulate_brief() against sim_simulate(): a folded run without a bound has the
 * report's iteration time, to the bit, and its memory verdict; with a bound below it the
 * engine stops past the bound; a plan too large for memory says so, cut or not. */
static void check_brief(const char *params, int dp, int tp, int pp, int mbs, gboolean fits,
                        gboolean static_overflow)
{
  g_autoptr(SimGraph) g = zoo("gpt", params);
  sim_graph_set_float_dtype(g, SIM_DTYPE_FP16);
  GError *error = NULL;
  g_autoptr(SimMachine) m = sim_machine_load("dgx-a100", &error);
  g_autoptr(SimStrategy) s = megatron_plan(g, m, tp, pp, dp, mbs, FALSE);
  SimOptions o = sim_options_default();
  g_autoptr(SimReport) r = sim_simulate(g, m, s, NULL, &o, &error);
  cr_assert_not_null(r);
  cr_assert_str_neq(sim_report_folding(r), "none");
  cr_assert_eq(sim_report_fits(r), fits);
  double t = sim_report_iteration_time(r);
  double ratio = 0;
  for (int d = 0; d < sim_report_n_devices(r); d++)
    ratio = MAX(ratio, (double)sim_report_peak_memory(r, d) /
                         (double)sim_machine_device_spec(m, d)->mem_capacity);
  SimBrief b;
  cr_assert(sim_simulate_brief(g, m, s, NULL, &o, INFINITY, &b, &error));
  cr_assert_eq(b.time, t);
  cr_assert_not(b.cut);
  cr_assert_eq(b.fits, sim_report_fits(r));
  cr_assert_eq(b.overflowed, !sim_report_fits(r));
  cr_assert_eq(b.max_ratio, ratio);
  /* At the iteration time the bound stops nothing. */
  cr_assert(sim_simulate_brief(g, m, s, NULL, &o, t, &b, &error));
  cr_assert_eq(b.time, t);
  cr_assert_not(b.cut);
  cr_assert(sim_simulate_brief(g, m, s, NULL, &o, 0.9 * t, &b, &error));
  cr_assert(b.cut);
  cr_assert(b.time > 0.9 * t && b.time <= t, "%.17g not in (%.17g, %.17g]", b.time, 0.9 * t, t);
  /* Weights and optimizer states are there from the start: a plan whose static memory
   * overflows has overflowed before any bound. */
  if (static_overflow)
    cr_assert(b.overflowed);
  /* Asked to stop at the first overflow, a plan that fits runs as before; one that does
   * not stops there, cut and overflowed, sooner than its iteration would end.  A report
   * ignores the request. */
  SimOptions so = o;
  so.stop_at_overflow = TRUE;
  cr_assert(sim_simulate_brief(g, m, s, NULL, &so, INFINITY, &b, &error));
  cr_assert_eq(b.cut, !fits);
  cr_assert_eq(b.overflowed, !fits);
  cr_assert_eq(b.fits, fits);
  if (fits)
    cr_assert_eq(b.time, t);
  else if (static_overflow)
    cr_assert_eq(b.time, 0);
  else
    cr_assert(b.time > 0 && b.time < t, "stopped at %.17g of %.17g", b.time, t);
  g_autoptr(SimReport) whole = sim_simulate(g, m, s, NULL, &so, &error);
  cr_assert_not_null(whole);
  cr_assert_eq(sim_report_iteration_time(whole), t);
}

Test(folding, a_brief_simulation_is_the_reports_and_stops_past_its_bound)
{
  check_brief("layers=4,hidden=256,heads=8,seq=128,vocab=1024,batch=32", 2, 2, 2, 4, TRUE, FALSE);
  check_brief("layers=4,hidden=256,heads=8,seq=128,vocab=1024,batch=32", 4, 2, 1, 1, TRUE, FALSE);
  /* 12.9 G parameters over tensor-parallel pairs of 80 GB GPUs, 16 bytes each with mixed
   * precision and Adam: 103 GB a GPU, out of memory. */
  check_brief("layers=64,hidden=4096,heads=32,seq=128,vocab=1024,batch=32", 4, 2, 1, 1, FALSE,
              TRUE);
  /* Weights that fit, and 128 sequences of 2,048 tokens a GPU whose activations do not:
   * the overflow comes during the forward pass. */
  check_brief("layers=2,hidden=1024,heads=16,seq=2048,vocab=1024,batch=1024", 8, 1, 1, 1, FALSE,
              FALSE);
}

/* A random Megatron plan of @g over 2 to 8 nodes of one of the @n_machines @machines: TP
 * @tp (0: 2, 4 or 8 at random), PP 1, 2 or 4, DP the rest, 64 samples in micro-batches of
 * one per replica, 1F1B or interleaved, recomputation, ZeRO-1 and scatter-gather at
 * random, sequence parallelism one time in @sp_one_in (with tensor-parallel overlap where
 * @overlap); its machine in @m and a description in @what.  NULL where the draw makes no plan (the degrees do not divide the GPUs or the
 * samples). */
static SimStrategy *draw_megatron_plan(GRand *rng, const SimGraph *g, const char *const *machines,
                                       int n_machines, int tp, int sp_one_in, gboolean overlap,
                                       SimMachine **m, char **what)
{
  int mi = g_rand_int_range(rng, 0, n_machines);
  int nodes = 2 << g_rand_int_range(rng, 0, 3);
  g_autofree char *mname = g_strdup_printf("%s:%d", machines[mi], nodes);
  GError *error = NULL;
  *m = sim_machine_load(mname, &error);
  cr_assert_not_null(*m, "%s", error ? error->message : "");
  int n = sim_machine_n_devices(*m);
  SimMegatronOptions mo = sim_megatron_options_default();
  mo.tp = tp > 0 ? tp : 1 << g_rand_int_range(rng, 1, 4);
  mo.pp = 1 << g_rand_int_range(rng, 0, 3);
  mo.dp = n / (mo.tp * mo.pp);
  if (mo.dp < 1 || 64 % mo.dp || mo.tp * mo.pp * mo.dp != n)
    return NULL;
  mo.microbatches = 64 / mo.dp;
  if (mo.pp > 1 && g_rand_boolean(rng) && mo.microbatches % mo.pp == 0) {
    mo.schedule = SIM_SCHEDULE_INTERLEAVED;
    mo.chunks = 2;
  }
  mo.memory.recompute = (SimRecompute)g_rand_int_range(rng, 0, 3);
  mo.memory.zero1 = g_rand_boolean(rng);
  mo.sequence_parallel = g_rand_int_range(rng, 0, sp_one_in) == 0;
  mo.tp_comm_overlap = overlap && mo.sequence_parallel;
  mo.scatter_gather = mo.pp > 1 && g_rand_boolean(rng);
  SimStrategy *s = sim_strategy_megatron(g, *m, &mo, &error);
  g_clear_error(&error);
  *what = g_strdup_printf("%s, TP %d PP %d DP %d, chunks %d", mname, mo.tp, mo.pp, mo.dp,
                          mo.chunks);
  return s;
}

/* Brief runs of @s with every method on and with @off (which switches one off) agree: the
 * time to a relative 1e-12, the same memory verdict and ratio, never more tasks on, the
 * time within 1e-9 of the unfolded report's, and the same verdicts past a bound and at the
 * first overflow.  TRUE where the run with every method on ran fewer tasks. */
static gboolean brief_runs_agree(const SimGraph *g, const SimMachine *m, const SimStrategy *s,
                                 const SimOptions *off_, const char *what)
{
  GError *error = NULL;
  SimOptions on = sim_options_default(), off = *off_, whole = on;
  whole.fold = FALSE;
  SimBrief a, b;
  cr_assert(sim_simulate_brief(g, m, s, NULL, &on, INFINITY, &a, &error), "%s", what);
  cr_assert(sim_simulate_brief(g, m, s, NULL, &off, INFINITY, &b, &error), "%s", what);
  cr_assert_leq(fabs(a.time - b.time), 1e-12 * b.time, "%s: %.17g, switched off %.17g", what,
                a.time, b.time);
  cr_assert_eq(a.fits, b.fits, "%s", what);
  cr_assert_eq(a.max_ratio, b.max_ratio, "%s", what);
  cr_assert_leq(a.n_tasks, b.n_tasks, "%s", what);
  gboolean fewer = a.n_tasks < b.n_tasks;
  g_autoptr(SimReport) r = sim_simulate(g, m, s, NULL, &whole, &error);
  cr_assert_not_null(r, "%s", what);
  double t = sim_report_iteration_time(r);
  cr_assert_leq(fabs(a.time - t), 1e-9 * t, "%s: %.17g, unfolded %.17g", what, a.time, t);
  /* Past a bound, and stopped at the first overflow, alike. */
  cr_assert(sim_simulate_brief(g, m, s, NULL, &on, 0.9 * b.time, &a, &error), "%s", what);
  cr_assert(sim_simulate_brief(g, m, s, NULL, &off, 0.9 * b.time, &b, &error), "%s", what);
  cr_assert(a.cut && b.cut, "%s", what);
  on.stop_at_overflow = off.stop_at_overflow = TRUE;
  cr_assert(sim_simulate_brief(g, m, s, NULL, &on, INFINITY, &a, &error), "%s", what);
  cr_assert(sim_simulate_brief(g, m, s, NULL, &off, INFINITY, &b, &error), "%s", what);
  cr_assert_eq(a.cut, b.cut, "%s", what);
  cr_assert_eq(a.overflowed, b.overflowed, "%s", what);
  return fewer;
}

/* brief_runs_agree() over @n random Megatron plans (draw_megatron_plan(), seed @seed, TP
 * @tp, sequence parallelism one time in @sp_one_in, with overlap where @overlap) of a small
 * GPT on @machines, against @off; returns how many ran fewer tasks. */
static int brief_runs_agree_on_random_plans(const char *const *machines, int n_machines,
                                            guint32 seed, int n, int tp, int sp_one_in,
                                            gboolean overlap, const SimOptions *off)
{
  g_autoptr(SimGraph) g = zoo("gpt", "layers=8,hidden=256,heads=8,seq=128,vocab=1024,batch=64");
  sim_graph_set_float_dtype(g, SIM_DTYPE_FP16);
  GRand *rng = g_rand_new_with_seed(seed);
  int done = 0, fewer = 0;
  while (done < n) {
    g_autoptr(SimMachine) m = NULL;
    g_autofree char *what = NULL;
    g_autoptr(SimStrategy) s =
      draw_megatron_plan(rng, g, machines, n_machines, tp, sp_one_in, overlap, &m, &what);
    if (!s)
      continue;
    fewer += brief_runs_agree(g, m, s, off, what);
    done++;
  }
  g_rand_free(rng);
  cr_log_info("%d of %d plans ran fewer tasks", fewer, done);
  return fewer;
}

/* Brief runs leave out the shadows apart from every simulated flow (SimOptions.
 * prune_shadows, sim/fold.c): random Megatron plans of a GPT (TP, PP, DP, micro-batches,
 * schedule, recomputation, sequence parallelism, scatter-gather) over 2 to 8 nodes of
 * three machines, each brief run with the shadows left out against the same run keeping
 * them: the time to a relative 1e-12 (a shadow ends when its original does, within the
 * engine's instant), the same memory verdict and ratio, the same verdicts past a bound
 * and at the first overflow, never more tasks; and against the unfolded report to a
 * relative 1e-9.  The tensor-parallel ranks' shadows on DGX A100's separate rails are
 * left out. */
Test(folding, shadows_apart_left_out_of_brief_runs_change_no_prediction)
{
  const char *machines[] = { "dgx-a100", "dgx1-v100", "vtrain-a100" };
  SimOptions off = sim_options_default();
  off.prune_shadows = FALSE;
  cr_assert_gt(brief_runs_agree_on_random_plans(machines, G_N_ELEMENTS(machines), 5, 16, 0, 2,
                                                FALSE, &off),
               0);
}

/* Ring steps (SimOptions.ring_steps, sim_lowering_ring_steps()): random Megatron plans of
 * a GPT whose tensor-parallel groups are whole nodes of DGX A100 and DGX H100 machines (2
 * to 8 nodes; PP, DP, micro-batches, schedule, recomputation, ZeRO-1, sequence
 * parallelism, scatter-gather), each brief run with the steps against the same run
 * without: the time to a relative 1e-12 (a step ends where its ring's group schedule
 * does, to the engine's instant), the same memory verdict and ratio, the same verdicts
 * past a bound and at the first overflow, never more tasks; and against the unfolded
 * report to a relative 1e-9.  The first stage's two embeddings both reduce before their
 * sum, one ring beside the stream, so that stage's devices run their rings as flows
 * (sim_lowering_settle_ring_steps()). */
Test(accel, ring_steps_predict_what_rings_do)
{
  const char *machines[] = { "dgx-a100", "dgx-h100" };
  SimOptions off = sim_options_default();
  off.ring_steps = FALSE;
  cr_assert_gt(brief_runs_agree_on_random_plans(machines, G_N_ELEMENTS(machines), 3, 16, 8, 4,
                                                FALSE, &off),
               0);
}

/* Tensor-parallel overlap's waits as steps of their stream (SimOptions.ring_steps,
 * add_wait() in sim/lower-tensors.c): random Megatron plans of a GPT with sequence
 * parallelism and TP overlap (TP 2 to 8, PP, DP, schedule, recomputation, ZeRO-1,
 * scatter-gather) over 2 to 8 DGX A100 and DGX H100 nodes, brief runs with the steps
 * against the delays (brief_runs_agree()). */
Test(accel, overlap_waits_as_steps_predict_what_delays_do)
{
  const char *machines[] = { "dgx-a100", "dgx-h100" };
  SimOptions off = sim_options_default();
  off.ring_steps = FALSE;
  cr_assert_gt(brief_runs_agree_on_random_plans(machines, G_N_ELEMENTS(machines), 5, 12, 0, 1,
                                                TRUE, &off),
               6);
}

/* ---------------------------------------------------------------------------------- */
/* Delta simulation                                                                     */

static void random_op_change(SimSession *ss, const SimGraph *g, GRand *rng)
{
  int n = sim_graph_n_ops(g);
  for (int attempt = 0; attempt < 50; attempt++) {
    int x = g_rand_int_range(rng, 0, n);
    int nd = sim_graph_op_n_dims(g, x);
    int deg[8] = { 1, 1, 1, 1, 1, 1, 1, 1 };
    int total = 1;
    int d = g_rand_int_range(rng, 0, nd);
    int k = 1 << g_rand_int_range(rng, 0, 3);
    if (sim_graph_op_dim_splittable(g, x, d) && sim_graph_op_dim_size(g, x, d) % k == 0) {
      deg[d] = k;
      total = k;
    }
    int devs[8];
    int base = g_rand_int_range(rng, 0, 4);
    for (int i = 0; i < total; i++)
      devs[i] = (base + i) % 4;
    if (sim_session_set_op(ss, x, deg, devs, NULL))
      return;
  }
}

/* A delta session from data parallelism over the machine's 4 GPUs. */
static SimSession *data_parallel_session(const SimGraph *g, SimMachine *m, SimCostModel *c)
{
  GError *error = NULL;
  g_autoptr(SimStrategy) s0 = sim_strategy_data_parallel(g, m, 4, &error);
  cr_assert_not_null(s0, "%s", error ? error->message : "");
  SimOptions o = sim_options_default();
  SimSession *ss = sim_session_new(g, m, s0, c, &o, &error);
  cr_assert_not_null(ss, "%s", error ? error->message : "");
  return ss;
}

/* The session's last run against the same strategy lowered and simulated from scratch:
 * the same tasks and the same timeline, bit for bit. */
static void assert_same_as_fresh(SimSession *ss, const SimGraph *g, SimMachine *m,
                                 SimCostModel *c, double t, const char *what)
{
  SimTaskGraph *tg;
  SimTimeline tl = { 0 };
  SimLowering *lw;
  run_lowered(g, m, sim_session_get_strategy(ss), c, &tg, &tl, &lw);
  const SimTaskGraph *dtg = sim_session_taskgraph(ss);
  const SimTimeline *dtl = sim_session_timeline(ss);
  cr_assert_eq(t, tl.makespan, "%s: delta %.17g vs full %.17g", what, t, tl.makespan);
  cr_assert_eq(dtg->n_tasks, tg->n_tasks);
  for (int i = 0; i < tg->n_tasks; i++) {
    cr_assert_eq(dtl->start[i], tl.start[i]);
    cr_assert_eq(dtl->end[i], tl.end[i]);
  }
  sim_timeline_clear(&tl);
  sim_lowering_free(lw);
}

Test(delta, equals_full_simulation_after_random_changes)
{
  const char *models[][2] = {
    { "mlp", "layers=4,hidden=256,input=128,classes=64,batch=16,towers=2" },
    { "inception-v3", "batch=8" },
    { "gpt", "layers=2,hidden=128,heads=4,seq=32,vocab=256,batch=8" },
  };
  g_autoptr(SimCostModel) c = roofline();
  g_autoptr(SimMachine) m = switch4(50);
  GRand *rng = g_rand_new_with_seed(7);
  for (size_t k = 0; k < G_N_ELEMENTS(models); k++) {
    g_autoptr(SimGraph) g = zoo(models[k][0], models[k][1]);
    SimSession *ss = data_parallel_session(g, m, c);
    for (int seq = 0; seq < 4; seq++) {
      int changes = g_rand_int_range(rng, 1, 4);
      for (int i = 0; i < changes; i++)
        random_op_change(ss, g, rng);
      double t = sim_session_run(ss);
      assert_same_as_fresh(ss, g, m, c, t, models[k][0]);
      /* The memory figures a search reads without a report are the report's. */
      double ratio = -1;
      gboolean fits = FALSE;
      cr_assert(sim_session_memory(ss, &ratio, &fits));
      g_autoptr(SimReport) r = sim_session_report(ss);
      double want = 0;
      for (int d = 0; d < sim_report_n_devices(r); d++)
        want = MAX(want, (double)sim_report_peak_memory(r, d) /
                           (double)sim_machine_device_spec(m, d)->mem_capacity);
      cr_assert_eq(ratio, want);
      cr_assert_eq(fits, sim_report_fits(r));
    }
    sim_session_free(ss);
  }
  g_rand_free(rng);
}

/* The output layer shares the embedding's weights (tied, as GPT's are): a shard of it
 * updates the shared weights only where the embedding has no shard on its device.  A
 * change to the embedding alone must re-price the output layer's update. */
Test(delta, a_change_to_a_weight_owner_reprices_its_users_update)
{
  g_autoptr(SimGraph) g = zoo("gpt", "layers=2,hidden=128,heads=4,seq=32,vocab=256,batch=8");
  g_autoptr(SimCostModel) c = roofline();
  g_autoptr(SimMachine) m = switch4(50);
  int head = sim_graph_op_by_name(g, "lm_head"), embed = sim_graph_op_by_name(g, "embed");
  cr_assert(head >= 0 && embed >= 0);
  cr_assert_eq(sim_graph_op_weight_owner(g, head), embed);
  SimSession *ss = data_parallel_session(g, m, c);
  int one[8] = { 1, 1, 1, 1, 1, 1, 1, 1 };
  int dev1 = 1, dev0 = 0;
  /* The output layer on GPU 1, where the data-parallel embedding has a shard: the
   * embedding's shard updates the weights there. */
  cr_assert(sim_session_set_op(ss, head, one, &dev1, NULL));
  assert_same_as_fresh(ss, g, m, c, sim_session_run(ss), "output layer moved");
  /* The embedding on GPU 0 alone: now GPU 1's copy is updated by the output layer. */
  cr_assert(sim_session_set_op(ss, embed, one, &dev0, NULL));
  assert_same_as_fresh(ss, g, m, c, sim_session_run(ss), "embedding moved");
  /* And back over every GPU. */
  int all[4] = { 0, 1, 2, 3 }, dp[8] = { 4, 1, 1, 1, 1, 1, 1, 1 };
  cr_assert(sim_session_set_op(ss, embed, dp, all, NULL));
  assert_same_as_fresh(ss, g, m, c, sim_session_run(ss), "embedding spread again");
  sim_session_free(ss);
}

/* Delta sessions over a wider space than the tests above: random plans (data parallel, or
 * Megatron's with tensor, pipeline and data parallelism, GPipe, 1F1B or interleaved) with
 * random memory and synchronization options (ZeRO-1, recomputation, buckets, overlap, the
 * three all-reduce algorithms, half of the optimizer offloaded for every third seed), random simulation options (the three levels of collective
 * detail, a host that issues kernels, blocking sends) on machines with shared links, and
 * models with tied weights; each run after random changes (some undone) equals a fresh
 * session task for task, and the folded report.  (It found the change to a weight owner
 * that did not re-price its users' update.) */
Test(delta, equals_fresh_sessions_on_random_plans_options_and_machines, .timeout = 120)
{
  const char *models[][2] = {
    { "gpt", "layers=4,hidden=128,heads=4,seq=32,vocab=256,batch=16" },
    { "mlp", "layers=4,hidden=256,input=128,classes=64,batch=32,towers=2" },
    { "bert-large", "layers=2,batch=16,seq=32" },
  };
  const char *machines[] = { "dgx-a100", "flexflow-p100", "dgx1-v100", "vtrain-a100:2" };
  g_autoptr(SimCostModel) c = roofline();
  for (guint32 seed = 1; seed <= 12; seed++) {
    GRand *rng = g_rand_new_with_seed(seed);
    int mi = g_rand_int_range(rng, 0, G_N_ELEMENTS(models));
    g_autoptr(SimGraph) g = zoo(models[mi][0], models[mi][1]);
    if (g_rand_boolean(rng))
      sim_graph_set_float_dtype(g, SIM_DTYPE_FP16);
    GError *error = NULL;
    g_autoptr(SimMachine) m = sim_machine_load(machines[g_rand_int_range(rng, 0, 4)], &error);
    cr_assert_not_null(m);
    int nd = sim_machine_n_devices(m);
    g_autoptr(SimStrategy) s0 = NULL;
    if (mi == 0 && g_rand_boolean(rng)) {
      SimMegatronOptions o = sim_megatron_options_default();
      o.tp = 1 << g_rand_int_range(rng, 0, 3);
      o.pp = 1 << g_rand_int_range(rng, 0, 2);
      o.dp = 16 % (nd / (o.tp * o.pp)) == 0 ? nd / (o.tp * o.pp) : 1;
      o.microbatches = o.pp > 1 ? 4 : 1;
      o.schedule = o.pp == 1 ? SIM_SCHEDULE_1F1B : (SimSchedule)g_rand_int_range(rng, 0, 3);
      o.chunks = o.schedule == SIM_SCHEDULE_INTERLEAVED ? 2 : 1;
      o.sequence_parallel = o.tp > 1 && g_rand_boolean(rng);
      o.scatter_gather = o.tp > 1 && g_rand_boolean(rng);
      o.tp_comm_overlap = o.sequence_parallel && !o.scatter_gather;
      s0 = sim_strategy_megatron(g, m, &o, NULL);
    }
    if (!s0)
      s0 = sim_strategy_data_parallel(g, m, nd, &error);
    cr_assert_not_null(s0, "%s", error ? error->message : "");
    SimSyncOptions sy = sim_strategy_get_sync(s0);
    sy.algorithm = (SimAllreduceAlgo)g_rand_int_range(rng, 0, 3);
    sy.bucket_bytes = g_rand_boolean(rng) ? 0 : (1 << 20) * g_rand_int_range(rng, 1, 8);
    sy.overlap = g_rand_boolean(rng);
    sim_strategy_set_sync(s0, &sy);
    SimMemoryOptions mo = sim_strategy_get_memory(s0);
    mo.zero1 = g_rand_boolean(rng);
    mo.recompute = (SimRecompute)g_rand_int_range(rng, 0, 3);
    /* Every third seed offloads part of the optimizer to the host (outside the random
     * draws, which stay those of the other seeds). */
    mo.offload = seed % 3 == 0 ? 0.5 : 0;
    sim_strategy_set_memory(s0, &mo);
    SimOptions o = sim_options_default();
    o.detail = (SimDetail)g_rand_int_range(rng, 0, 3);
    o.host_kernel_time = g_rand_boolean(rng) ? 0 : 5e-6;
    o.blocking_sends = g_rand_boolean(rng);
    SimSession *ss = sim_session_new(g, m, s0, c, &o, &error);
    cr_assert_not_null(ss, "%s", error ? error->message : "");
    int n = sim_graph_n_ops(g);
    for (int step = 0; step < 6; step++) {
      g_autoptr(SimStrategy) before = sim_strategy_copy(sim_session_get_strategy(ss));
      gboolean changed = FALSE;
      for (int attempt = 0; attempt < 60 && !changed; attempt++) {
        int x = g_rand_int_range(rng, 0, n), ndims = sim_graph_op_n_dims(g, x);
        if (ndims <= 0)
          continue;
        int deg[8] = { 1, 1, 1, 1, 1, 1, 1, 1 }, devs[8], total = 1;
        int d = g_rand_int_range(rng, 0, ndims), k = 1 << g_rand_int_range(rng, 0, 3);
        if (sim_graph_op_dim_splittable(g, x, d) && sim_graph_op_dim_size(g, x, d) % k == 0) {
          deg[d] = k;
          total = k;
        }
        int base = g_rand_int_range(rng, 0, nd), stride = 1 + g_rand_boolean(rng);
        for (int i = 0; i < total; i++)
          devs[i] = (base + i * stride) % nd;
        changed = sim_session_set_op(ss, x, deg, devs, NULL);
      }
      double t = sim_session_run(ss);
      g_autofree char *what = g_strdup_printf("seed %u step %d", seed, step);
      /* A fresh session with the same options: the same tasks and times, bit for bit. */
      SimSession *fresh = sim_session_new(g, m, sim_session_get_strategy(ss), c, &o, &error);
      cr_assert_not_null(fresh, "%s", error ? error->message : "");
      double tf = sim_session_run(fresh);
      cr_assert_eq(t, tf, "%s: delta %.17g vs fresh %.17g", what, t, tf);
      const SimTaskGraph *a = sim_session_taskgraph(ss), *b = sim_session_taskgraph(fresh);
      const SimTimeline *ta = sim_session_timeline(ss), *tb = sim_session_timeline(fresh);
      cr_assert_eq(a->n_tasks, b->n_tasks, "%s", what);
      for (int i = 0; i < a->n_tasks; i++) {
        cr_assert_eq(ta->start[i], tb->start[i], "%s: task %d", what, i);
        cr_assert_eq(ta->end[i], tb->end[i], "%s: task %d", what, i);
      }
      sim_session_free(fresh);
      g_autoptr(SimReport) r = sim_simulate(g, m, sim_session_get_strategy(ss), c, &o, &error);
      cr_assert_not_null(r, "%s", error ? error->message : "");
      cr_assert_float_eq(t, sim_report_iteration_time(r), 1e-9 * t, "%s: delta %.17g vs report %.17g",
                         what, t, sim_report_iteration_time(r));
      if (g_rand_int_range(rng, 0, 3) == 0)
        for (int x = 0; x < n; x++) {
          int k = 0;
          const int *dv = sim_strategy_op_devices(before, x, &k);
          cr_assert(sim_session_set_op(ss, x, sim_strategy_op_degrees(before, x), dv, NULL));
        }
    }
    sim_session_free(ss);
    g_rand_free(rng);
  }
}

/* Delta simulation of pipelines: random single-operator changes to Megatron plans over
 * two stages (scatter-gathered messages or whole ones) give the timeline of the same plan
 * lowered from scratch, task for task. */
Test(delta, equals_full_simulation_on_pipelines)
{
  g_autoptr(SimGraph) g = zoo("gpt", "layers=2,hidden=128,heads=4,seq=32,vocab=256,batch=8");
  sim_graph_set_float_dtype(g, SIM_DTYPE_FP16);
  g_autoptr(SimCostModel) c = roofline();
  GError *error = NULL;
  g_autoptr(SimMachine) m = sim_machine_load("dgx-a100", &error);
  cr_assert_not_null(m);
  GRand *rng = g_rand_new_with_seed(5);
  for (int sg = 0; sg < 2; sg++) {
    g_autoptr(SimStrategy) s0 = megatron_plan(g, m, 2, 2, 1, 2, sg);
    SimOptions o = sim_options_default();
    SimSession *ss = sim_session_new(g, m, s0, c, &o, &error);
    cr_assert_not_null(ss, "%s", error ? error->message : "");
    for (int seq = 0; seq < 6; seq++) {
      random_op_change(ss, g, rng);
      assert_same_as_fresh(ss, g, m, c, sim_session_run(ss),
                           sg ? "scatter-gathered" : "whole messages");
    }
    sim_session_free(ss);
  }
  g_rand_free(rng);
}

/* Delta simulation of context-parallel plans: random single-operator changes to a LLaMA
 * plan with CP 2 (rings built in the attention ops' blocks, lower.c, build_ring()), under
 * TP 2 with a pipeline of 2 stages, give the timeline of the same plan lowered from
 * scratch, task for task. */
Test(delta, equals_full_simulation_on_context_parallel_plans)
{
  g_autoptr(SimGraph) g = zoo("llama", "layers=2,hidden=128,heads=4,kv_heads=2,ffn=256,seq=256,"
                                       "vocab=256,batch=8");
  g_autoptr(SimCostModel) c = roofline();
  GError *error = NULL;
  g_autoptr(SimMachine) m = sim_machine_load("dgx-a100", &error);
  cr_assert_not_null(m);
  GRand *rng = g_rand_new_with_seed(9);
  for (int pp = 1; pp <= 2; pp++) {
    SimMegatronOptions mo = sim_megatron_options_default();
    mo.cp = 2;
    mo.tp = 2;
    mo.pp = pp;
    mo.dp = 2 / pp;
    mo.microbatches = 2;
    mo.memory.recompute = pp == 2 ? SIM_RECOMPUTE_FULL : SIM_RECOMPUTE_NONE;
    g_autoptr(SimStrategy) s0 = sim_strategy_megatron(g, m, &mo, &error);
    cr_assert_not_null(s0, "%s", error ? error->message : "");
    SimOptions o = sim_options_default();
    SimSession *ss = sim_session_new(g, m, s0, c, &o, &error);
    cr_assert_not_null(ss, "%s", error ? error->message : "");
    assert_same_as_fresh(ss, g, m, c, sim_session_run(ss), "CP 2, unchanged");
    for (int seq = 0; seq < 6; seq++) {
      random_op_change(ss, g, rng);
      assert_same_as_fresh(ss, g, m, c, sim_session_run(ss), pp == 2 ? "CP 2, PP 2" : "CP 2");
    }
    sim_session_free(ss);
  }
  g_rand_free(rng);
}

/* Under sequence parallelism an op's saved activations follow its producer's layout (the
 * part of a gathered input its rank held, sim/lower.c): after random changes to single
 * ops of a Megatron plan with sequence parallelism, the session's time and timeline are
 * a fresh lowering's and its memory a fresh report's. */
Test(delta, equals_full_simulation_on_sequence_parallel_plans)
{
  g_autoptr(SimGraph) g = zoo("llama", "layers=2,hidden=128,heads=4,kv_heads=4,ffn=256,seq=64,"
                                       "vocab=256,batch=8");
  g_autoptr(SimCostModel) c = roofline();
  g_autoptr(SimMachine) m = switch4(50);
  GError *error = NULL;
  GRand *rng = g_rand_new_with_seed(11);
  for (int tp = 2; tp <= 4; tp *= 2) {
    SimMegatronOptions mo = sim_megatron_options_default();
    mo.tp = tp;
    mo.dp = 4 / tp;
    mo.sequence_parallel = TRUE;
    g_autoptr(SimStrategy) s0 = sim_strategy_megatron(g, m, &mo, &error);
    cr_assert_not_null(s0, "%s", error ? error->message : "");
    SimOptions o = sim_options_default();
    SimSession *ss = sim_session_new(g, m, s0, c, &o, &error);
    cr_assert_not_null(ss, "%s", error ? error->message : "");
    for (int seq = 0; seq < 8; seq++) {
      if (seq > 0)
        random_op_change(ss, g, rng);
      double t = sim_session_run(ss);
      assert_same_as_fresh(ss, g, m, c, t, tp == 2 ? "SP, TP 2" : "SP, TP 4");
      double ratio = -1;
      gboolean fits = FALSE;
      cr_assert(sim_session_memory(ss, &ratio, &fits));
      g_autoptr(SimReport) r = sim_simulate(g, m, sim_session_get_strategy(ss), c, &o, &error);
      cr_assert_not_null(r, "%s", error ? error->message : "");
      double want = 0;
      for (int d = 0; d < sim_report_n_devices(r); d++)
        want = MAX(want, (double)sim_report_peak_memory(r, d) /
                           (double)sim_machine_device_spec(m, d)->mem_capacity);
      cr_assert_eq(ratio, want, "TP %d, change %d: session %.17g, report %.17g", tp, seq, ratio,
                   want);
    }
    sim_session_free(ss);
  }
  g_rand_free(rng);
}

/* Delta sessions on machines whose GPUs share links: after random changes from data
 * parallelism (each kept or undone, so the plan is sometimes symmetric again), the
 * session's time is the report's, which folds where it can. */
Test(delta, equals_the_report_on_machines_with_shared_links)
{
  const char *machines[] = { "flexflow-p100", "dgx1-v100:2", "pcie-4gpu:2", "vtrain-a100:2" };
  g_autoptr(SimGraph) g = zoo("mlp", "layers=4,hidden=256,input=128,classes=64,batch=32,towers=2");
  g_autoptr(SimCostModel) c = roofline();
  GRand *rng = g_rand_new_with_seed(3);
  for (size_t k = 0; k < G_N_ELEMENTS(machines); k++) {
    GError *error = NULL;
    g_autoptr(SimMachine) m = sim_machine_load(machines[k], &error);
    cr_assert_not_null(m);
    int n = sim_machine_n_devices(m);
    g_autoptr(SimStrategy) s0 = sim_strategy_data_parallel(g, m, n, &error);
    cr_assert_not_null(s0, "%s", error ? error->message : "");
    SimOptions o = sim_options_default();
    SimSession *ss = sim_session_new(g, m, s0, c, &o, &error);
    cr_assert_not_null(ss, "%s", error ? error->message : "");
    for (int seq = 0; seq < 6; seq++) {
      g_autoptr(SimStrategy) before = sim_strategy_copy(sim_session_get_strategy(ss));
      random_op_change(ss, g, rng);
      double t = sim_session_run(ss);
      g_autoptr(SimReport) r = sim_simulate(g, m, sim_session_get_strategy(ss), c, &o, &error);
      cr_assert_not_null(r, "%s", error ? error->message : "");
      cr_assert_float_eq(t, sim_report_iteration_time(r), 1e-9 * t, "%s: delta %.17g vs report %.17g",
                         machines[k], t, sim_report_iteration_time(r));
      if (g_rand_boolean(rng)) {
        /* Undone: back to the plan before, symmetric again at first. */
        for (int x = 0; x < sim_graph_n_ops(g); x++) {
          int nd = 0;
          const int *devs = sim_strategy_op_devices(before, x, &nd);
          cr_assert(sim_session_set_op(ss, x, sim_strategy_op_degrees(before, x), devs, NULL));
        }
        double back = sim_session_run(ss);
        g_autoptr(SimReport) rb = sim_simulate(g, m, before, c, &o, &error);
        cr_assert_not_null(rb);
        cr_assert_float_eq(back, sim_report_iteration_time(rb), 1e-9 * back, "%s: undone %.17g vs %.17g (%s)",
                           machines[k], back, sim_report_iteration_time(rb),
                           sim_report_folding(rb));
      }
    }
    sim_session_free(ss);
  }
  g_rand_free(rng);
}

Test(delta, a_bounded_run_stops_past_its_bound)
{
  g_autoptr(SimCostModel) c = roofline();
  g_autoptr(SimMachine) m = switch4(50);
  g_autoptr(SimGraph) g = zoo("inception-v3", "batch=8");
  SimSession *ss = data_parallel_session(g, m, c);
  SimOptions o = sim_options_default();
  GError *error = NULL;
  GRand *rng = g_rand_new_with_seed(11);
  for (int seq = 0; seq < 6; seq++) {
    random_op_change(ss, g, rng);
    const SimStrategy *s = sim_session_get_strategy(ss);
    SimSession *a = sim_session_new(g, m, s, c, &o, &error);
    double t = sim_session_run(a);
    cr_assert_gt(t, 0);
    /* In the delta session, below the iteration time: stopped, at a lower bound between
     * the bound and the iteration time; asked again without a bound, the exact time. */
    double y = sim_session_run_bounded(ss, 0.9 * t);
    cr_assert(sim_session_cut(ss));
    cr_assert(y > 0.9 * t && y <= t, "%.17g not in (%.17g, %.17g]", y, 0.9 * t, t);
    cr_assert_eq(sim_session_run(ss), t);
    cr_assert_not(sim_session_cut(ss));
    /* A finished run answers any bound with its exact time. */
    cr_assert_eq(sim_session_run_bounded(ss, 0.5 * t), t);
    /* At the iteration time itself the bound stops nothing: the unbounded run, bit for
     * bit. */
    SimSession *b = sim_session_new(g, m, s, c, &o, &error);
    cr_assert_eq(sim_session_run_bounded(b, t), t);
    cr_assert_not(sim_session_cut(b));
    sim_session_free(b);
    /* After a cut, the memory figures are the full run's. */
    b = sim_session_new(g, m, s, c, &o, &error);
    sim_session_run_bounded(b, 0.5 * t);
    cr_assert(sim_session_cut(b));
    double ra = -1, rb = -2;
    gboolean fa = FALSE, fb = TRUE;
    cr_assert(sim_session_memory(a, &ra, &fa));
    cr_assert(sim_session_memory(b, &rb, &fb));
    cr_assert_eq(ra, rb);
    cr_assert_eq(fa, fb);
    cr_assert_eq(sim_session_run(b), t);
    sim_session_free(b);
    sim_session_free(a);
  }
  g_rand_free(rng);
  sim_session_free(ss);
}

/* ---------------------------------------------------------------------------------- */
/* Traces                                                                               */

/* The timed events ("ph": "X") of a trace file, read back. */
static JsonArray *trace_events(const char *path, JsonParser *parser)
{
  GError *error = NULL;
  cr_assert(json_parser_load_from_file(parser, path, &error), "%s",
            error ? error->message : "");
  JsonObject *root = json_node_get_object(json_parser_get_root(parser));
  return json_object_get_array_member(root, "traceEvents");
}

/* Events of @cat on (pid, tid), and the latest end among all timed events (us). */
static int count_track(JsonArray *ev, int pid, int tid, const char *cat, double *last_end)
{
  int n = 0;
  for (guint i = 0; i < json_array_get_length(ev); i++) {
    JsonObject *e = json_array_get_object_element(ev, i);
    if (strcmp(json_object_get_string_member(e, "ph"), "X"))
      continue;
    double ts = json_object_get_double_member(e, "ts"), dur = json_object_get_double_member(e, "dur");
    cr_assert(ts >= 0 && dur >= 0);
    if (last_end)
      *last_end = MAX(*last_end, ts + dur);
    n += json_object_get_int_member(e, "pid") == pid && json_object_get_int_member(e, "tid") == tid &&
         !strcmp(json_object_get_string_member(e, "cat"), cat);
  }
  return n;
}

/* The report of @s, unfolded and with every task's times, for a trace. */
static SimReport *traced_report(const SimGraph *g, SimMachine *m, const SimStrategy *s,
                                SimCostModel *c)
{
  SimOptions o = sim_options_default();
  o.fold = FALSE;
  o.keep_timeline = TRUE;
  GError *error = NULL;
  SimReport *r = sim_simulate(g, m, s, c, &o, &error);
  cr_assert_not_null(r, "%s", error ? error->message : "");
  return r;
}

Test(trace, every_gpu_or_the_ones_asked_for)
{
  /* Data parallel over GPUs 0 and 1 of one node, unfolded: each GPU runs the same
   * forward and backward tasks on its compute track (tid 2 x local rank) and takes part
   * in the gradient all-reduces on its communication track (tid 2 x local rank + 1). */
  g_autoptr(SimGraph) g = zoo("mlp", "layers=2,hidden=256,input=128,classes=16,batch=16");
  g_autoptr(SimMachine) m = switch4(100);
  g_autoptr(SimCostModel) c = roofline();
  GError *error = NULL;
  g_autoptr(SimStrategy) s = sim_strategy_data_parallel(g, m, 2, &error);
  cr_assert_not_null(s, "%s", error ? error->message : "");
  g_autoptr(SimReport) r = traced_report(g, m, s, c);
  g_autofree char *dir = g_dir_make_tmp("parasol-trace-XXXXXX", NULL);
  g_autofree char *all = g_build_filename(dir, "all.json", NULL);
  g_autofree char *one = g_build_filename(dir, "one.json", NULL);

  int64_t n_all = 0, n_one = 0;
  cr_assert(sim_report_write_trace_devices(r, all, NULL, 0, &n_all, &error), "%s",
            error ? error->message : "");
  g_autoptr(JsonParser) pa = json_parser_new();
  JsonArray *ea = trace_events(all, pa);
  double last = 0;
  int fwd0 = count_track(ea, 0, 0, "forward", &last);
  cr_expect_gt(fwd0, 0);
  cr_expect_eq(count_track(ea, 0, 2, "forward", NULL), fwd0);
  cr_expect_gt(count_track(ea, 0, 1, "grad-sync", NULL), 0);
  cr_expect_gt(count_track(ea, 0, 3, "grad-sync", NULL), 0);
  /* The last event ends with the iteration. */
  cr_expect(fabs(last - 1e6 * sim_report_iteration_time(r)) < 1e-3, "%g us against %g s", last,
            sim_report_iteration_time(r));

  /* GPU 0 alone: its tracks as they were, none of GPU 1's. */
  const int just0[] = { 0 };
  cr_assert(sim_report_write_trace_devices(r, one, just0, 1, &n_one, &error), "%s",
            error ? error->message : "");
  g_autoptr(JsonParser) po = json_parser_new();
  JsonArray *eo = trace_events(one, po);
  cr_expect_eq(count_track(eo, 0, 0, "forward", NULL), fwd0);
  cr_expect_eq(count_track(eo, 0, 1, "grad-sync", NULL), count_track(ea, 0, 1, "grad-sync", NULL));
  cr_expect_eq(count_track(eo, 0, 2, "forward", NULL), 0);
  cr_expect_eq(count_track(eo, 0, 3, "grad-sync", NULL), 0);
  cr_expect_lt(n_one, n_all);

  /* A device the machine lacks: refused, and the file already there left as it was. */
  const int bad[] = { 0, 9 };
  g_autofree char *before = NULL;
  cr_assert(g_file_get_contents(one, &before, NULL, NULL));
  cr_expect_not(sim_report_write_trace_devices(r, one, bad, 2, NULL, &error));
  cr_assert_not_null(error);
  cr_expect(strstr(error->message, "device 9 does not exist"), "%s", error->message);
  g_clear_error(&error);
  g_autofree char *after = NULL;
  cr_assert(g_file_get_contents(one, &after, NULL, NULL));
  cr_expect_str_eq(after, before);
  g_unlink(all);
  g_unlink(one);
  g_rmdir(dir);
}

static int span_cmp(gconstpointer a, gconstpointer b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

Test(trace, compute_tracks_keep_the_reports_books)
{
  /* A Megatron plan over two nodes (tensor, pipeline and data parallelism, 1F1B with four
   * micro-batches), unfolded: on every GPU's compute track (tid 2 x local rank of its
   * node's process) the kernels run one at a time, and their durations add up to the
   * report's compute time of that GPU.  Times in the trace are microseconds to 3 decimals. */
  g_autoptr(SimGraph) g = zoo("gpt", "layers=4,hidden=256,heads=8,seq=64,vocab=512,batch=16");
  GError *error = NULL;
  g_autoptr(SimMachine) m = sim_machine_load("dgx-a100:2", &error);
  cr_assert_not_null(m, "%s", error ? error->message : "");
  g_autoptr(SimCostModel) c = roofline();
  SimMegatronOptions mo = sim_megatron_options_default();
  mo.tp = 2;
  mo.pp = 2;
  mo.dp = 4;
  mo.microbatches = 4;
  g_autoptr(SimStrategy) s = sim_strategy_megatron(g, m, &mo, &error);
  cr_assert_not_null(s, "%s", error ? error->message : "");
  g_autoptr(SimReport) r = traced_report(g, m, s, c);
  g_autofree char *dir = g_dir_make_tmp("parasol-trace-XXXXXX", NULL);
  g_autofree char *path = g_build_filename(dir, "t.json", NULL);
  cr_assert(sim_report_write_trace_devices(r, path, NULL, 0, NULL, &error), "%s",
            error ? error->message : "");
  g_autoptr(JsonParser) parser = json_parser_new();
  JsonArray *ev = trace_events(path, parser);
  int nd = sim_machine_n_devices(m);
  GArray **track = g_new0(GArray *, nd);
  for (int d = 0; d < nd; d++)
    track[d] = g_array_new(FALSE, FALSE, sizeof(double) * 2);
  for (guint i = 0; i < json_array_get_length(ev); i++) {
    JsonObject *e = json_array_get_object_element(ev, i);
    if (strcmp(json_object_get_string_member(e, "ph"), "X"))
      continue;
    int pid = (int)json_object_get_int_member(e, "pid");
    int tid = (int)json_object_get_int_member(e, "tid");
    /* Nodes are processes 0 and 1 with eight GPUs each; the compute tracks are even. */
    if (pid > 1 || tid >= 16 || tid % 2)
      continue;
    double span[2] = { json_object_get_double_member(e, "ts"),
                       json_object_get_double_member(e, "dur") };
    g_array_append_val(track[pid * 8 + tid / 2], span);
  }
  for (int d = 0; d < nd; d++) {
    GArray *t = track[d];
    cr_assert_gt(t->len, 0, "GPU %d has no compute track", d);
    /* In time order, each starts once the one before it has ended. */
    g_array_sort(t, span_cmp);
    double busy = 0, end = 0;
    for (guint i = 0; i < t->len; i++) {
      const double *sp = &g_array_index(t, double, 2 * i);
      cr_assert_geq(sp[0], end - 2e-3, "GPU %d: kernel %u starts at %.3f us, before %.3f", d, i,
                    sp[0], end);
      end = sp[0] + sp[1];
      busy += sp[1];
    }
    double want = 1e6 * sim_report_compute_time(r, d);
    cr_expect(fabs(busy - want) <= 1e-3 * t->len, "GPU %d: %.3f us of kernels, report %.3f us", d,
              busy, want);
    g_array_free(t, TRUE);
  }
  g_free(track);
  g_unlink(path);
  g_rmdir(dir);
}

/* ---------------------------------------------------------------------------------- */
/* Activations in flight against Korthikanti et al. 2022 ("Reducing activation
 * recomputation in large transformer models", section 4).  Per transformer layer and
 * micro-batch of b sequences of s tokens, hidden size h and a heads, fp16 activations with
 * one-byte dropout masks take
 *   34 sbh + 5 a s^2 b   without recomputation,
 *   34 sbh               with selective recomputation (the attention core recomputed),
 *   2 sbh                with full recomputation (only the layer's input kept).
 * The simulator also keeps what the paper leaves out: each layer normalization's mean and
 * reciprocal standard deviation in fp32 per row, 2 x 2 x 4 = 16 sb bytes a layer, which
 * full recomputation recomputes too.  A pipeline stage holds the activations of p
 * micro-batches under 1F1B at its first stage and of all m under GPipe.
 *
 * Peak memory also holds weights, gradients and optimizer states, the embedding and the
 * loss, so the test takes differences that leave only the layers' activations: two
 * models that differ only in layers, each at two micro-batch counts. */

static int64_t stage0_peak_tp(int layers, int m, SimSchedule sched, SimRecompute rc, int tp,
                              gboolean sp)
{
  g_autofree char *params = g_strdup_printf(
    "layers=%d,hidden=1024,heads=16,seq=512,vocab=1024,batch=%d", layers, m);
  g_autoptr(SimGraph) g = zoo("gpt", params);
  sim_graph_set_float_dtype(g, SIM_DTYPE_FP16);
  GError *error = NULL;
  g_autoptr(SimMachine) mach = sim_machine_load("dgx-a100", &error);
  cr_assert_not_null(mach);
  SimMegatronOptions mo = sim_megatron_options_default();
  mo.dp = 1;
  mo.tp = tp;
  mo.pp = 2;
  mo.microbatches = m;
  mo.schedule = sched;
  mo.memory.recompute = rc;
  mo.sequence_parallel = sp;
  g_autoptr(SimStrategy) s = sim_strategy_megatron(g, mach, &mo, &error);
  cr_assert_not_null(s, "%s", error ? error->message : "");
  SimOptions o = sim_options_default();
  g_autoptr(SimReport) r = sim_simulate(g, mach, s, NULL, &o, &error);
  cr_assert_not_null(r, "%s", error ? error->message : "");
  return sim_report_peak_memory(r, 0);
}

static int64_t stage0_peak(int layers, int m, SimSchedule sched, SimRecompute rc)
{
  return stage0_peak_tp(layers, m, sched, rc, 1, FALSE);
}

/* Stage 0's activations of one layer and micro-batch (b = 1): 4 more micro-batches under
 * GPipe, 2 more layers on stage 0 (8 layers instead of 4 over 2 stages). */
static int64_t layer_activations(SimRecompute rc)
{
  int64_t d8 = stage0_peak(8, 8, SIM_SCHEDULE_GPIPE, rc) - stage0_peak(8, 4, SIM_SCHEDULE_GPIPE, rc);
  int64_t d4 = stage0_peak(4, 8, SIM_SCHEDULE_GPIPE, rc) - stage0_peak(4, 4, SIM_SCHEDULE_GPIPE, rc);
  cr_assert_eq((d8 - d4) % 8, 0);
  return (d8 - d4) / 8;
}

static const int64_t KS = 512, KB = 1, KH = 1024, KA = 16;

/* The same over t tensor-parallel ranks with sequence parallelism (Korthikanti et al.
 * 2022, section 4.2.2): every activation of a layer is divided by t, the inputs of the
 * column-parallel layers too (the QKV projection's and the first MLP layer's: each rank
 * saves its own part of the sequence and gathers the rest again for the backward pass),
 * and so are the layer normalizations' statistics, split on the sequence.  Without the
 * rule those two inputs, 2 sbh each, were kept whole on every rank. */
static int64_t layer_activations_sp(SimRecompute rc, int t)
{
  SimSchedule gp = SIM_SCHEDULE_GPIPE;
  int64_t d8 = stage0_peak_tp(8, 8, gp, rc, t, TRUE) - stage0_peak_tp(8, 4, gp, rc, t, TRUE);
  int64_t d4 = stage0_peak_tp(4, 8, gp, rc, t, TRUE) - stage0_peak_tp(4, 4, gp, rc, t, TRUE);
  cr_assert_eq((d8 - d4) % 8, 0);
  return (d8 - d4) / 8;
}

Test(memory, sequence_parallelism_divides_every_activation_by_the_ranks)
{
  for (int t = 2; t <= 4; t *= 2) {
    int64_t none = (34 * KS * KB * KH + 5 * KA * KS * KS * KB + 16 * KS * KB) / t;
    int64_t selective = (34 * KS * KB * KH + 16 * KS * KB) / t;
    int64_t full = 2 * KS * KB * KH / t;
    int64_t got[3] = { layer_activations_sp(SIM_RECOMPUTE_NONE, t),
                       layer_activations_sp(SIM_RECOMPUTE_SELECTIVE, t),
                       layer_activations_sp(SIM_RECOMPUTE_FULL, t) };
    cr_expect_eq(got[0], none, "t %d, no recomputation: %ld bytes, expected %ld", t,
                 (long)got[0], (long)none);
    cr_expect_eq(got[1], selective, "t %d, selective: %ld bytes, expected %ld", t, (long)got[1],
                 (long)selective);
    cr_expect_eq(got[2], full, "t %d, full: %ld bytes, expected %ld", t, (long)got[2],
                 (long)full);
  }
}

Test(memory, activations_without_recomputation)
{
  int64_t want = 34 * KS * KB * KH + 5 * KA * KS * KS * KB + 16 * KS * KB;
  cr_expect_eq(layer_activations(SIM_RECOMPUTE_NONE), want, "%ld bytes, expected %ld",
               (long)layer_activations(SIM_RECOMPUTE_NONE), (long)want);
}

Test(memory, activations_with_selective_recomputation)
{
  int64_t want = 34 * KS * KB * KH + 16 * KS * KB;
  cr_expect_eq(layer_activations(SIM_RECOMPUTE_SELECTIVE), want, "%ld bytes, expected %ld",
               (long)layer_activations(SIM_RECOMPUTE_SELECTIVE), (long)want);
}

Test(memory, activations_with_full_recomputation)
{
  int64_t want = 2 * KS * KB * KH;
  cr_expect_eq(layer_activations(SIM_RECOMPUTE_FULL), want, "%ld bytes, expected %ld",
               (long)layer_activations(SIM_RECOMPUTE_FULL), (long)want);
}

Test(memory, one_f_one_b_holds_p_microbatches_gpipe_m)
{
  int64_t A = 34 * KS * KB * KH + 5 * KA * KS * KS * KB + 16 * KS * KB;
  /* The layers' share of stage 0's peak: 2 layers more on stage 0 from 4 to 8 layers. */
  int64_t g8 = stage0_peak(8, 8, SIM_SCHEDULE_GPIPE, SIM_RECOMPUTE_NONE) -
               stage0_peak(4, 8, SIM_SCHEDULE_GPIPE, SIM_RECOMPUTE_NONE);
  int64_t f8 = stage0_peak(8, 8, SIM_SCHEDULE_1F1B, SIM_RECOMPUTE_NONE) -
               stage0_peak(4, 8, SIM_SCHEDULE_1F1B, SIM_RECOMPUTE_NONE);
  int64_t f4 = stage0_peak(8, 4, SIM_SCHEDULE_1F1B, SIM_RECOMPUTE_NONE) -
               stage0_peak(4, 4, SIM_SCHEDULE_1F1B, SIM_RECOMPUTE_NONE);
  /* GPipe keeps m = 8 micro-batches of the two extra layers, 1F1B p = 2 (weights and
   * their gradients and states are the same under both). */
  cr_expect_eq(g8 - f8, (8 - 2) * 2 * A, "GPipe - 1F1B: %ld bytes, expected %ld", (long)(g8 - f8),
               (long)((8 - 2) * 2 * A));
  /* Under 1F1B stage 0's activations do not grow with m. */
  cr_expect_eq(f8, f4, "1F1B, 8 micro-batches: %ld bytes, 4: %ld", (long)f8, (long)f4);
}

/* ---------------------------------------------------------------------------------- */
/* One GPU's iteration time against a sum written down here: with a cost model that
 * gives each op and pass a known time and no host overhead, one GPU runs every forward,
 * every backward and every weight update one after another, so the iteration takes
 * the sum of them.  For the MLP below that is: forward of the three linear layers and the
 * loss, their backward, and the update of the three linear layers' weights.  Any kernel
 * priced outside op_time costs 1000 s, which the sum would show. */

static double known_time(SimCostModel *self, const SimDeviceSpec *dev, const SimGraph *g, int op,
                         const int64_t *extent, SimPass pass)
{
  /* Op k: forward k ms, backward 2k ms, update k/4 ms (distinct for every op and pass). */
  double ms = 1e-3 * (op + 1) * (pass == SIM_PASS_FORWARD ? 1 : pass == SIM_PASS_BACKWARD ? 2 : 0.25);
  return sim_graph_op_type(g, op) == SIM_OP_INPUT ? 0 : ms;
}

static double thousand_seconds(SimCostModel *self, const SimDeviceSpec *dev, const SimKernel *k)
{
  return 1000.0;
}

static const SimCostModelClass known_class = {
  .api_version = SIM_COST_MODEL_API_VERSION,
  .name = "test-known",
  .kernel_time = thousand_seconds,
  .op_time = known_time,
};

Test(single_gpu, iteration_time_is_the_sum_of_its_ops)
{
  g_autoptr(SimGraph) g = zoo("mlp", "layers=3,hidden=256,input=128,classes=64,batch=32,towers=1");
  GError *error = NULL;
  g_autoptr(SimMachine) m = sim_machine_load("h200-1", &error);
  cr_assert_not_null(m, "%s", error ? error->message : "");
  g_autoptr(SimStrategy) s = sim_strategy_data_parallel(g, m, 1, &error);
  cr_assert_not_null(s, "%s", error ? error->message : "");
  SimCostModel *cost = g_new0(SimCostModel, 1);
  cost->klass = &known_class;
  SimOptions o = sim_options_default();
  o.host_kernel_time = 0;
  o.host_step_time = 0;
  g_autoptr(SimReport) r = sim_simulate(g, m, s, cost, &o, &error);
  cr_assert_not_null(r, "%s", error ? error->message : "");
  /* Ops: input0 (0), tower0.fc0 (1), tower0.fc1 (2), tower0.fc2 (3), labels (4), loss (5).
   * Forward 2 + 3 + 4 + 6 = 15 ms, backward 2 x 15 = 30 ms, update (2 + 3 + 4) / 4 =
   * 2.25 ms: 47.25 ms. */
  cr_assert_eq(sim_graph_op_type(g, 5), SIM_OP_CROSS_ENTROPY);
  double want = 47.25e-3;
  cr_expect_float_eq(sim_report_iteration_time(r), want, want * 1e-12, "%.9g s, expected %.9g",
                     sim_report_iteration_time(r), want);
  sim_cost_model_free(cost);
}

/* SimOptions.cancel: a flag at zero changes nothing, to the bit; a raised one stops the
 * simulation, which fails with SIM_ERROR_CANCELLED (the engine polls it between the
 * lowering and the run and every few thousand events; a search raises it at its
 * deadline). */
Test(simulate, a_raised_cancellation_flag_stops_the_simulation)
{
  g_autoptr(SimGraph) g = zoo("gpt", "layers=4,hidden=256,heads=4,seq=64,vocab=1000,batch=16");
  sim_graph_set_float_dtype(g, SIM_DTYPE_FP16);
  GError *error = NULL;
  g_autoptr(SimMachine) m = sim_machine_load("dgx-a100:2", &error);
  cr_assert_not_null(m);
  g_autoptr(SimStrategy) s = megatron_plan(g, m, 4, 2, 2, 2, FALSE);
  SimOptions o = sim_options_default();
  g_autoptr(SimReport) plain = sim_simulate(g, m, s, NULL, &o, &error);
  cr_assert_not_null(plain, "%s", error ? error->message : "");
  atomic_int flag;
  atomic_init(&flag, 0);
  o.cancel = &flag;
  g_autoptr(SimReport) same = sim_simulate(g, m, s, NULL, &o, &error);
  cr_assert_not_null(same);
  cr_assert_eq(sim_report_iteration_time(same), sim_report_iteration_time(plain));
  SimBrief b;
  cr_assert(sim_simulate_brief(g, m, s, NULL, &o, INFINITY, &b, &error));
  cr_assert_eq(b.time, sim_report_iteration_time(plain));
  atomic_store(&flag, 1);
  cr_assert_null(sim_simulate(g, m, s, NULL, &o, &error));
  cr_assert(g_error_matches(error, SIM_ERROR, SIM_ERROR_CANCELLED), "%s", error->message);
  g_clear_error(&error);
  cr_assert_not(sim_simulate_brief(g, m, s, NULL, &o, INFINITY, &b, &error));
  cr_assert(g_error_matches(error, SIM_ERROR, SIM_ERROR_CANCELLED));
  g_clear_error(&error);
}

/* Merged runs of compute tasks and rings run as one flow (SimOptions.merge_chains and
 * merge_rings) change how many tasks the engine
 * runs, never what it predicts: random plans of three models and Megatron plans with every
 * schedule and recomputation give the same iteration time (to a relative 1e-9), the same
 * peak memory and compute per GPU, and the same time by class on the critical path; the
 * pipelines do merge tasks. */
/* @a predicts what @b does: the iteration time to a relative 1e-9, peak memory per GPU to
 * the byte, compute time per GPU and the critical path by class to 1e-9 of the iteration. */
static void expect_same_report(const SimReport *a, const SimReport *b, const char *what)
{
  double t = sim_report_iteration_time(b);
  cr_assert_float_eq(sim_report_iteration_time(a), t, 1e-9 * t, "%s: %.17g vs %.17g", what,
                     sim_report_iteration_time(a), t);
  for (int d = 0; d < sim_report_n_devices(a); d++) {
    cr_assert_eq(sim_report_peak_memory(a, d), sim_report_peak_memory(b, d), "%s: GPU %d", what,
                 d);
    cr_assert_float_eq(sim_report_compute_time(a, d), sim_report_compute_time(b, d), 1e-9 * t,
                       "%s: GPU %d", what, d);
  }
  const char *classes[] = { "forward", "backward", "recompute", "update", "transfer",
                            "reduction", "grad-sync", "param-sync", "idle" };
  for (size_t k = 0; k < G_N_ELEMENTS(classes); k++)
    cr_assert_float_eq(sim_report_critical_time(a, classes[k]),
                       sim_report_critical_time(b, classes[k]), 1e-9 * t, "%s: %s", what,
                       classes[k]);
}

/* @a has @b's memory verdict, communication, overlap and idle time per GPU (to 1e-9 of
 * the iteration) and busiest links with their bytes (to a relative 1e-9). */
static void expect_same_traffic(const SimReport *a, const SimReport *b, const char *what)
{
  double t = sim_report_iteration_time(b);
  cr_assert_eq(sim_report_fits(a), sim_report_fits(b), "%s", what);
  for (int d = 0; d < sim_report_n_devices(a); d++) {
    cr_assert_float_eq(sim_report_comm_time(a, d), sim_report_comm_time(b, d), 1e-9 * t,
                       "%s: GPU %d communication", what, d);
    cr_assert_float_eq(sim_report_overlap_time(a, d), sim_report_overlap_time(b, d), 1e-9 * t,
                       "%s: GPU %d overlap", what, d);
    cr_assert_float_eq(sim_report_idle_time(a, d), sim_report_idle_time(b, d), 1e-9 * t,
                       "%s: GPU %d idle", what, d);
  }
  /* The busiest links, from the reports' JSON: the same links carrying the same bytes. */
  g_autofree char *ja = sim_report_to_json(a), *jb = sim_report_to_json(b);
  g_autoptr(JsonNode) na = json_from_string(ja, NULL), nb = json_from_string(jb, NULL);
  JsonArray *la = json_object_get_array_member(json_node_get_object(na), "busiest_links");
  JsonArray *lb = json_object_get_array_member(json_node_get_object(nb), "busiest_links");
  cr_assert_eq(json_array_get_length(la), json_array_get_length(lb), "%s", what);
  for (guint i = 0; i < json_array_get_length(la); i++) {
    JsonObject *x = json_array_get_object_element(la, i), *y = json_array_get_object_element(lb, i);
    double bx = json_object_get_double_member(x, "bytes"), by = json_object_get_double_member(y, "bytes");
    cr_assert_float_eq(bx, by, 1e-9 * by, "%s: link %u", what, i);
  }
}

static void check_merged_with(const SimGraph *g, SimMachine *m, const SimStrategy *s,
                              SimCostModel *c, const SimOptions *with, gboolean expect_fewer,
                              const char *what);

static void check_merged(const SimGraph *g, SimMachine *m, const SimStrategy *s,
                         SimCostModel *c, gboolean expect_fewer, const char *what)
{
  SimOptions on = sim_options_default();
  check_merged_with(g, m, s, c, &on, expect_fewer, what);
}

static void check_merged_with(const SimGraph *g, SimMachine *m, const SimStrategy *s,
                              SimCostModel *c, const SimOptions *with, gboolean expect_fewer,
                              const char *what)
{
  SimOptions on = *with, off = on;
  off.merge_chains = FALSE;
  off.merge_rings = FALSE;
  GError *error = NULL;
  g_autoptr(SimReport) a = sim_simulate(g, m, s, c, &on, &error);
  cr_assert_not_null(a, "%s: %s", what, error ? error->message : "");
  g_autoptr(SimReport) b = sim_simulate(g, m, s, c, &off, &error);
  cr_assert_not_null(b);
  expect_same_report(a, b, what);
  expect_same_traffic(a, b, what);
  if (expect_fewer)
    cr_assert_lt(sim_report_n_tasks(a), sim_report_n_tasks(b), "%s: nothing merged", what);
  else
    cr_assert_leq(sim_report_n_tasks(a), sim_report_n_tasks(b));
}

Test(accel, merged_runs_of_compute_tasks_predict_what_single_tasks_do)
{
  g_autoptr(SimCostModel) c0 = roofline();
  {
    /* Rings alone: GPT with TP 8 (a whole DGX A100 node, whose NVSwitch links carry only the
     * tensor-parallel rings) and PP 2 over two nodes. */
    g_autoptr(SimGraph) g = zoo("gpt", "layers=4,hidden=256,heads=8,seq=128,vocab=1024,batch=8");
    sim_graph_set_float_dtype(g, SIM_DTYPE_FP16);
    GError *error = NULL;
    g_autoptr(SimMachine) m = sim_machine_load("dgx-a100:2", &error);
    cr_assert_not_null(m);
    g_autoptr(SimStrategy) s = megatron_plan(g, m, 8, 2, 1, 4, FALSE);
    SimOptions rings = sim_options_default();
    rings.merge_chains = FALSE;
    check_merged_with(g, m, s, c0, &rings, TRUE, "gpt TP 8 PP 2, rings alone");
  }
  g_autoptr(SimCostModel) c = roofline();
  const char *models[][2] = {
    { "mlp", "layers=3,hidden=256,input=128,classes=64,batch=16,towers=2" },
    { "gpt", "layers=2,hidden=128,heads=4,seq=32,vocab=256,batch=8" },
    { "inception-v3", "batch=8" },
  };
  GRand *rng = g_rand_new_with_seed(7);
  for (size_t k = 0; k < G_N_ELEMENTS(models); k++) {
    g_autoptr(SimGraph) g = zoo(models[k][0], models[k][1]);
    for (int trial = 0; trial < 4; trial++) {
      g_autoptr(SimMachine) m = switch4(50);
      g_autoptr(SimStrategy) s = random_strategy(g, m, rng);
      g_autofree char *what = g_strdup_printf("%s trial %d", models[k][0], trial);
      check_merged(g, m, s, c, FALSE, what);
    }
  }
  g_rand_free(rng);
  /* GPT over two DGX A100 nodes: TP 2, PP 4, DP 2, each schedule, with and without full
   * recomputation. */
  g_autoptr(SimGraph) g = accel_gpt();
  GError *error = NULL;
  g_autoptr(SimMachine) m = sim_machine_load("dgx-a100:2", &error);
  cr_assert_not_null(m);
  const SimSchedule scheds[] = { SIM_SCHEDULE_1F1B, SIM_SCHEDULE_GPIPE, SIM_SCHEDULE_INTERLEAVED };
  for (int i = 0; i < 3; i++)
    for (int rc = 0; rc < 2; rc++) {
      SimMegatronOptions mo = sim_megatron_options_default();
      mo.tp = 2;
      mo.pp = 4;
      mo.dp = 2;
      mo.microbatches = 8;
      mo.schedule = scheds[i];
      mo.chunks = i == 2 ? 2 : 1;
      mo.memory.recompute = rc ? SIM_RECOMPUTE_FULL : SIM_RECOMPUTE_NONE;
      g_autoptr(SimStrategy) s = sim_strategy_megatron(g, m, &mo, &error);
      cr_assert_not_null(s, "%s", error ? error->message : "");
      g_autofree char *what = g_strdup_printf("gpt, schedule %d, chunks %d, recompute %d", i,
                                              mo.chunks, rc);
      check_merged(g, m, s, c, TRUE, what);
    }
}

/* A node's rings lowered as one flow each (SimCollParams.whole_node_rings) are kept only
 * where no other flow crosses their links: GPT with TP 8 filling each DGX A100 node and PP 2
 * across nodes (the pipeline's sends leave through the NICs, off the NVSwitch) keeps them;
 * data parallelism over the 8 GPUs of one node with one operator on GPU 0 alone sends its
 * input and output between GPU 0 and the others over the NVSwitch links that the gradient
 * ring crosses, and the check refuses the ring.
 * Either way the simulation predicts what flows per rank do (sim_simulate lowers again
 * without them when refused). */
static gboolean node_rings_private(const SimGraph *g, SimMachine *m, const SimStrategy *s,
                                   SimCostModel *c, int *n_whole)
{
  SimOptions o = sim_options_default();
  o.fold = FALSE;
  SimCollParams cp = sim_coll_params_default();
  cp.whole_node_rings = TRUE;
  SimLowering *lw = sim_lowering_new(g, m, s, c, &o, &cp, NULL);
  sim_lowering_build(lw);
  SimTaskGraph *tg = sim_lowering_taskgraph(lw);
  sim_taskgraph_assemble(tg);
  *n_whole = 0;
  for (int t = 0; t < tg->n_tasks; t++)
    *n_whole += tg->task[t].kind == SIM_TASK_FLOW && tg->task[t].n_links > 0;
  gboolean ok = sim_taskgraph_rings_private(tg, m);
  sim_lowering_free(lw);
  return ok;
}

Test(accel, a_nodes_rings_are_one_flow_only_where_their_links_are_their_own)
{
  g_autoptr(SimCostModel) c = roofline();
  g_autoptr(SimGraph) g = zoo("gpt", "layers=4,hidden=256,heads=8,seq=128,vocab=1024,batch=16");
  sim_graph_set_float_dtype(g, SIM_DTYPE_FP16);
  GError *error = NULL;
  g_autoptr(SimMachine) dgx = sim_machine_load("dgx-a100:2", &error);
  g_autoptr(SimMachine) one = sim_machine_load("dgx-a100", &error);
  cr_assert(dgx && one);
  g_autoptr(SimStrategy) a = megatron_plan(g, dgx, 8, 2, 1, 4, FALSE);
  g_autoptr(SimStrategy) b = sim_strategy_data_parallel(g, one, 8, &error);
  cr_assert_not_null(b);
  int x = sim_graph_n_ops(g) / 2, deg[8] = { 1, 1, 1, 1, 1, 1, 1, 1 }, dev0 = 0;
  cr_assert(sim_strategy_set_op(b, x, deg, &dev0, &error), "%s", error ? error->message : "");
  int whole_a, whole_b;
  cr_assert(node_rings_private(g, dgx, a, c, &whole_a));
  cr_assert_gt(whole_a, 0);
  cr_assert_not(node_rings_private(g, one, b, c, &whole_b));
  cr_assert_gt(whole_b, 0);
  check_merged(g, dgx, a, c, TRUE, "gpt TP 8 PP 2 on DGX A100");
  check_merged(g, one, b, c, FALSE, "gpt data parallel on 8 GPUs, one op on GPU 0");
}

/* The steady state of a schedule (SimOptions.steady_state, sim/steady.c): simulating a few
 * micro-batches and adding the repeated periods predicts what simulating every micro-batch
 * does, figure for figure: the iteration time, compute, communication, overlap and idle
 * time per GPU and the critical path by class to a relative 1e-9 of the iteration, peak
 * memory to the byte, the busiest links' bytes to a relative 1e-9; the brief simulation
 * that searches run gives the report's time to the bit with every shadow kept (a shadow
 * ends when its original does, within the engine's instant: to a relative 1e-12 with the
 * shadows apart left out, SimOptions.prune_shadows), and past a bound says it is cut.
 * Megatron plans of a GPT over two DGX A100 nodes, drawn at random (TP, PP, DP, schedule,
 * chunks, micro-batches, recomputation, ZeRO-1, sequence parallelism). */
static int check_steady(const SimGraph *g, SimMachine *m, const SimStrategy *s, SimCostModel *c,
                        const char *what)
{
  SimOptions on = sim_options_default(), off = on;
  off.steady_state = FALSE;
  GError *error = NULL;
  g_autoptr(SimReport) a = sim_simulate(g, m, s, c, &on, &error);
  cr_assert_not_null(a, "%s: %s", what, error ? error->message : "");
  g_autoptr(SimReport) b = sim_simulate(g, m, s, c, &off, &error);
  cr_assert_not_null(b, "%s: %s", what, error ? error->message : "");
  cr_assert_null(sim_report_steady(b));
  expect_same_report(a, b, what);
  expect_same_traffic(a, b, what);
  double t = sim_report_iteration_time(b);
  SimBrief br;
  SimOptions kept = on;
  kept.prune_shadows = FALSE;
  cr_assert(sim_simulate_brief(g, m, s, c, &kept, INFINITY, &br, &error), "%s", what);
  cr_assert_eq(br.time, sim_report_iteration_time(a), "%s: brief %.17g, report %.17g", what,
               br.time, sim_report_iteration_time(a));
  cr_assert_eq(br.fits, sim_report_fits(a));
  cr_assert_not(br.cut);
  cr_assert(sim_simulate_brief(g, m, s, c, &on, INFINITY, &br, &error), "%s", what);
  cr_assert_leq(fabs(br.time - sim_report_iteration_time(a)), 1e-12 * sim_report_iteration_time(a),
                "%s: brief %.17g, report %.17g", what, br.time, sim_report_iteration_time(a));
  cr_assert_eq(br.fits, sim_report_fits(a));
  cr_assert_not(br.cut);
  cr_assert(sim_simulate_brief(g, m, s, c, &on, 0.5 * t, &br, &error), "%s", what);
  cr_assert(br.cut, "%s: a run past its bound is cut", what);
  cr_assert_geq(br.time, 0.5 * t);
  return sim_report_steady(a) != NULL;
}

Test(accel, the_steady_state_of_a_schedule_predicts_what_every_micro_batch_does)
{
  g_autoptr(SimCostModel) c = roofline();
  g_autoptr(SimGraph) g = zoo("gpt", "layers=8,hidden=256,heads=8,seq=128,vocab=1024,batch=96");
  sim_graph_set_float_dtype(g, SIM_DTYPE_FP16);
  GError *error = NULL;
  g_autoptr(SimMachine) m = sim_machine_load("dgx-a100:2", &error);
  cr_assert_not_null(m);
  /* Fixed plans first: 1F1B over 4 stages with and without recomputation, interleaved
   * 1F1B with 2 chunks, and no pipeline at all (gradient accumulation over 24
   * micro-batches); each extrapolates its steady state. */
  struct {
    int tp, pp, dp, mbs, chunks;
    SimRecompute rc;
  } fixed[] = {
    { 2, 4, 2, 48, 1, SIM_RECOMPUTE_NONE },
    { 2, 4, 2, 48, 1, SIM_RECOMPUTE_FULL },
    { 2, 4, 2, 48, 2, SIM_RECOMPUTE_SELECTIVE },
    { 8, 1, 2, 48, 1, SIM_RECOMPUTE_NONE },
  };
  for (size_t i = 0; i < G_N_ELEMENTS(fixed); i++) {
    SimMegatronOptions mo = sim_megatron_options_default();
    mo.tp = fixed[i].tp;
    mo.pp = fixed[i].pp;
    mo.dp = fixed[i].dp;
    mo.microbatches = fixed[i].mbs;
    mo.chunks = fixed[i].chunks;
    mo.schedule = fixed[i].chunks > 1 ? SIM_SCHEDULE_INTERLEAVED : SIM_SCHEDULE_1F1B;
    mo.memory.recompute = fixed[i].rc;
    g_autoptr(SimStrategy) s = sim_strategy_megatron(g, m, &mo, &error);
    cr_assert_not_null(s, "%s", error ? error->message : "");
    g_autofree char *what = g_strdup_printf("fixed plan %zu", i);
    cr_assert(check_steady(g, m, s, c, what), "%s: the steady state was not used", what);
  }
  /* Random plans: every one predicts what the plain simulation does, whether or not its
   * steady state could be used. */
  GRand *rng = g_rand_new_with_seed(11);
  int used = 0, n = 12;
  for (int trial = 0; trial < n; trial++) {
    static const int tps[] = { 1, 2, 4 }, pps[] = { 1, 2, 4 }, mbss[] = { 12, 24, 48 };
    SimMegatronOptions mo = sim_megatron_options_default();
    mo.tp = tps[g_rand_int_range(rng, 0, 3)];
    mo.pp = pps[g_rand_int_range(rng, 0, 3)];
    mo.dp = 16 / (mo.tp * mo.pp);
    int mbs = mbss[g_rand_int_range(rng, 0, 3)];
    if (96 % (mo.dp * mbs) != 0)
      mbs = 96 / mo.dp;
    mo.microbatches = mbs;
    if (mo.pp > 1 && g_rand_boolean(rng) && mbs % mo.pp == 0) {
      mo.schedule = SIM_SCHEDULE_INTERLEAVED;
      mo.chunks = 2;
    }
    mo.memory.recompute = (SimRecompute)g_rand_int_range(rng, 0, 3);
    mo.memory.zero1 = g_rand_boolean(rng);
    mo.sequence_parallel = mo.tp > 1 && g_rand_boolean(rng);
    mo.tp_comm_overlap = mo.sequence_parallel && trial % 2;
    g_autoptr(SimStrategy) s = sim_strategy_megatron(g, m, &mo, &error);
    cr_assert_not_null(s, "trial %d: %s", trial, error ? error->message : "");
    g_autofree char *what =
      g_strdup_printf("trial %d: TP %d PP %d DP %d, %d micro-batches, chunks %d, recompute %d",
                      trial, mo.tp, mo.pp, mo.dp, mbs, mo.chunks, (int)mo.memory.recompute);
    used += check_steady(g, m, s, c, what);
  }
  g_rand_free(rng);
  cr_log_info("steady state used by %d of %d random plans", used, n);
}

/* The same with context parallelism's rings (lower.c, build_ring()): LLaMA with CP 2 and
 * CP 4 over 16 GPUs, with and without pipelines, recomputation and tensor parallelism. */
Test(accel, the_steady_state_predicts_context_parallel_plans)
{
  g_autoptr(SimCostModel) c = roofline();
  g_autoptr(SimGraph) g = zoo("llama", "layers=4,hidden=256,heads=8,kv_heads=2,ffn=512,"
                                       "seq=512,vocab=1024,batch=96");
  sim_graph_set_float_dtype(g, SIM_DTYPE_FP16);
  GError *error = NULL;
  g_autoptr(SimMachine) m = sim_machine_load("dgx-a100:2", &error);
  cr_assert_not_null(m);
  const struct {
    int cp, tp, pp, mbs;
    SimRecompute rc;
  } plans[] = {
    { 2, 2, 2, 24, SIM_RECOMPUTE_NONE },
    { 4, 1, 4, 12, SIM_RECOMPUTE_FULL },
    { 2, 1, 4, 48, SIM_RECOMPUTE_SELECTIVE },
    { 4, 2, 2, 24, SIM_RECOMPUTE_NONE },
  };
  int used = 0;
  for (size_t k = 0; k < G_N_ELEMENTS(plans); k++) {
    SimMegatronOptions mo = sim_megatron_options_default();
    mo.cp = plans[k].cp;
    mo.tp = plans[k].tp;
    mo.pp = plans[k].pp;
    mo.dp = 16 / (mo.cp * mo.tp * mo.pp);
    mo.microbatches = plans[k].mbs;
    mo.memory.recompute = plans[k].rc;
    g_autoptr(SimStrategy) s = sim_strategy_megatron(g, m, &mo, &error);
    cr_assert_not_null(s, "plan %zu: %s", k, error ? error->message : "");
    g_autofree char *what = g_strdup_printf("CP %d TP %d PP %d DP %d, %d micro-batches",
                                            mo.cp, mo.tp, mo.pp, mo.dp, mo.microbatches);
    used += check_steady(g, m, s, c, what);
  }
  cr_expect_gt(used, 0, "the steady state is used by some of the plans");
}

/* A ring that a stream waits for alone between two of its tasks becomes a step of their
 * merged run (sim/taskgraph-merge.c, absorbable_rings()): the report is the unmerged one's
 * figure for figure (check_merged_with()).  A brief run (what searches run) also lets
 * merged runs span classes: it runs fewer tasks than the report and predicts the report's
 * iteration time (to a relative 1e-12: the engine merges events within that of an instant,
 * so a task may start that much sooner than the sum of the durations before it), the same
 * largest ratio of memory to capacity and the same memory verdict; bounded below the
 * iteration it is cut past the bound, and asked to stop at the first overflow on GPUs too
 * small for the plan it stops, overflowed, where the run without merging does.  GPT over
 * two DGX A100 nodes under Megatron plans whose tensor-parallel rings keep to NVSwitch
 * links of their own, with every schedule and recomputation. */
Test(accel, a_brief_run_takes_in_the_rings_its_streams_wait_for)
{
  g_autoptr(SimCostModel) c = roofline();
  g_autoptr(SimGraph) g = accel_gpt();
  GError *error = NULL;
  g_autoptr(SimMachine) m = sim_machine_load("dgx-a100:2", &error);
  cr_assert_not_null(m);
  const struct {
    int tp, pp, dp, mbs, chunks;
    SimSchedule sched;
    SimRecompute rc;
    gboolean takes; /* rings taken in: not where folded replicas' or groups' rings (their
                     * shadows) ride the same join points */
  } plans[] = {
    { 8, 2, 1, 8, 1, SIM_SCHEDULE_1F1B, SIM_RECOMPUTE_NONE, TRUE },
    { 8, 2, 1, 8, 1, SIM_SCHEDULE_1F1B, SIM_RECOMPUTE_FULL, TRUE },
    { 8, 2, 1, 4, 1, SIM_SCHEDULE_GPIPE, SIM_RECOMPUTE_SELECTIVE, TRUE },
    { 4, 2, 2, 8, 2, SIM_SCHEDULE_INTERLEAVED, SIM_RECOMPUTE_NONE, FALSE },
    { 2, 4, 2, 8, 1, SIM_SCHEDULE_1F1B, SIM_RECOMPUTE_FULL, TRUE },
    { 8, 1, 2, 4, 1, SIM_SCHEDULE_1F1B, SIM_RECOMPUTE_NONE, FALSE },
  };
  for (size_t i = 0; i < G_N_ELEMENTS(plans); i++) {
    SimMegatronOptions mo = sim_megatron_options_default();
    mo.tp = plans[i].tp;
    mo.pp = plans[i].pp;
    mo.dp = plans[i].dp;
    mo.microbatches = plans[i].mbs;
    mo.schedule = plans[i].sched;
    mo.chunks = plans[i].chunks;
    mo.memory.recompute = plans[i].rc;
    g_autoptr(SimStrategy) s = sim_strategy_megatron(g, m, &mo, &error);
    cr_assert_not_null(s, "plan %zu: %s", i, error ? error->message : "");
    SimOptions o = sim_options_default();
    o.steady_state = FALSE; /* one run each, so that their tasks compare */
    /* The report, which takes the rings in too, against the one that merges nothing:
     * every figure, communication and links' bytes included. */
    g_autofree char *what = g_strdup_printf("plan %zu", i);
    check_merged_with(g, m, s, c, &o, TRUE, what);
    g_autoptr(SimReport) r = sim_simulate(g, m, s, c, &o, &error);
    cr_assert_not_null(r);
    double t = sim_report_iteration_time(r), ratio = 0;
    for (int d = 0; d < sim_report_n_devices(r); d++)
      ratio = MAX(ratio, (double)sim_report_peak_memory(r, d) /
                           (double)sim_machine_device_spec(m, d)->mem_capacity);
    SimBrief b;
    cr_assert(sim_simulate_brief(g, m, s, c, &o, INFINITY, &b, &error));
    cr_assert_float_eq(b.time, t, 1e-12 * t, "plan %zu: brief %.17g, report %.17g", i, b.time, t);
    cr_assert_not(b.cut);
    cr_assert_eq(b.fits, sim_report_fits(r));
    cr_assert_eq(b.max_ratio, ratio, "plan %zu", i);
    cr_assert_leq(b.n_tasks, sim_report_n_tasks(r));
    if (plans[i].takes)
      cr_assert_lt(b.n_tasks, sim_report_n_tasks(r), "plan %zu: no ring taken in", i);
    /* Bounded below the iteration: cut past the bound, at a lower bound of it. */
    cr_assert(sim_simulate_brief(g, m, s, c, &o, 0.7 * t, &b, &error));
    cr_assert(b.cut, "plan %zu", i);
    cr_assert(b.time > 0.7 * t && b.time <= t * (1 + 1e-12), "plan %zu: %.17g", i, b.time);
    /* On GPUs a little smaller than its peak, asked to stop at the first overflow: it
     * stops where the run without any merging does. */
    int64_t peak = 0;
    for (int d = 0; d < sim_report_n_devices(r); d++)
      peak = MAX(peak, sim_report_peak_memory(r, d));
    g_autoptr(SimMachine) small = machine_with_memory(m, (double)peak * 0.97, &error);
    cr_assert_not_null(small, "%s", error ? error->message : "");
    SimOptions so = o, plain = o;
    so.stop_at_overflow = plain.stop_at_overflow = TRUE;
    plain.merge_chains = plain.merge_rings = FALSE;
    SimBrief bp;
    cr_assert(sim_simulate_brief(g, small, s, c, &so, INFINITY, &b, &error));
    cr_assert(sim_simulate_brief(g, small, s, c, &plain, INFINITY, &bp, &error));
    cr_assert(b.overflowed && b.cut && !b.fits, "plan %zu", i);
    cr_assert(bp.overflowed && bp.cut, "plan %zu", i);
    cr_assert_float_eq(b.time, bp.time, 1e-12 * t, "plan %zu: stopped at %.17g, unmerged at %.17g",
                       i, b.time, bp.time);
  }
}

/* Sequence parallelism's rings are taken in as the tensor-parallel all-reduces they
 * replace are: its layer norms' gradients, summed over the tensor-parallel ranks too, are
 * reduced with each rank's data-parallel peers and then all-reduced over the
 * tensor-parallel ranks once the backward pass is over (lower-sync.c), so their rings
 * never meet those of the stream on the NVSwitch links (settle_others() in
 * taskgraph-merge.c), and
 * a gather into a selectively recomputed attention is waited for by the recomputation,
 * so that it sits between two tasks of the stream.  Each brief run predicts the run
 * that merges nothing, to a relative 1e-12, and runs at most 1.5 times the tasks of the
 * same plan without sequence parallelism (about 6 times before). */
Test(accel, sequence_parallel_rings_are_taken_in_as_the_all_reduces_they_replace)
{
  g_autoptr(SimCostModel) c = roofline();
  g_autoptr(SimGraph) g = accel_gpt();
  GError *error = NULL;
  g_autoptr(SimMachine) m = sim_machine_load("dgx-a100:2", &error);
  cr_assert_not_null(m);
  const struct {
    int chunks;
    SimRecompute rc;
    gboolean zero1;
  } plans[] = {
    { 1, SIM_RECOMPUTE_NONE, FALSE },
    { 1, SIM_RECOMPUTE_SELECTIVE, TRUE },
    { 2, SIM_RECOMPUTE_SELECTIVE, FALSE },
    { 1, SIM_RECOMPUTE_FULL, TRUE },
  };
  for (size_t i = 0; i < G_N_ELEMENTS(plans); i++) {
    int tasks[2] = { 0, 0 };
    for (int sp = 0; sp < 2; sp++) {
      SimMegatronOptions mo = sim_megatron_options_default();
      mo.tp = 8;
      mo.pp = 2;
      mo.dp = 1;
      mo.microbatches = 8;
      mo.schedule = plans[i].chunks > 1 ? SIM_SCHEDULE_INTERLEAVED : SIM_SCHEDULE_1F1B;
      mo.chunks = plans[i].chunks;
      mo.memory.recompute = plans[i].rc;
      mo.memory.zero1 = plans[i].zero1;
      mo.sequence_parallel = sp;
      g_autoptr(SimStrategy) s = sim_strategy_megatron(g, m, &mo, &error);
      cr_assert_not_null(s, "plan %zu: %s", i, error ? error->message : "");
      SimOptions o = sim_options_default(), plain = o;
      o.steady_state = plain.steady_state = FALSE;
      /* The merging's rings against each other (ring steps take the plain plan's
       * all-reduces before the merging does). */
      o.ring_steps = FALSE;
      plain.merge_chains = plain.merge_rings = FALSE;
      SimBrief b, bp;
      cr_assert(sim_simulate_brief(g, m, s, c, &o, INFINITY, &b, &error));
      cr_assert(sim_simulate_brief(g, m, s, c, &plain, INFINITY, &bp, &error));
      cr_assert_float_eq(b.time, bp.time, 1e-12 * bp.time,
                         "plan %zu, sp %d: merged %.17g, unmerged %.17g", i, sp, b.time, bp.time);
      cr_assert_eq(b.fits, bp.fits);
      tasks[sp] = b.n_tasks;
    }
    cr_log_info("plan %zu: %d tasks without sequence parallelism, %d with", i, tasks[0], tasks[1]);
    cr_assert_leq(5 * tasks[1], 11 * tasks[0], "plan %zu: %d tasks without sequence "
                  "parallelism, %d with", i, tasks[0], tasks[1]);
  }
}

/* With the tensor-parallel ranks' sums of sequence parallelism apart from the
 * data-parallel ones (no ring over every holder of a layer norm crosses the nodes),
 * the replicas of a sequence-parallel plan fold, and the folded run is the unfolded one. */
Test(folding, sequence_parallel_replicas_fold)
{
  g_autoptr(SimCostModel) c = roofline();
  g_autoptr(SimGraph) g = zoo("gpt", "layers=4,hidden=256,heads=8,seq=128,vocab=1024,batch=32");
  sim_graph_set_float_dtype(g, SIM_DTYPE_FP16);
  GError *error = NULL;
  g_autoptr(SimMachine) m = sim_machine_load("dgx-a100:8", &error);
  cr_assert_not_null(m);
  for (int zero = 0; zero < 2; zero++) {
    SimMegatronOptions mo = sim_megatron_options_default();
    mo.tp = 8;
    mo.pp = 4;
    mo.dp = 2;
    mo.microbatches = 4;
    mo.sequence_parallel = TRUE;
    mo.memory.recompute = SIM_RECOMPUTE_SELECTIVE;
    mo.memory.zero1 = zero;
    g_autoptr(SimStrategy) s = sim_strategy_megatron(g, m, &mo, &error);
    cr_assert_not_null(s, "%s", error ? error->message : "");
    SimOptions o = sim_options_default(), unfolded = o;
    unfolded.fold = FALSE;
    g_autoptr(SimReport) r = sim_simulate(g, m, s, c, &o, &error);
    g_autoptr(SimReport) u = sim_simulate(g, m, s, c, &unfolded, &error);
    cr_assert_not_null(r);
    cr_assert_not_null(u);
    cr_assert(strstr(sim_report_folding(r), "data-parallel replicas") != NULL,
              "zero %d: folding: %s", zero, sim_report_folding(r));
    double t = sim_report_iteration_time(r), tu = sim_report_iteration_time(u);
    cr_assert_float_eq(t, tu, 1e-12 * tu, "zero %d: folded %.17g, unfolded %.17g", zero, t, tu);
  }
}

/* Expert groups fold only with the replicas they sit in: a mixture whose experts split
 * over groups of several data-parallel replicas (or of GPUs of several replicas, etp 1)
 * exchanges tokens between ranks that the rotation of a stage's ranks does not carry
 * onto each other, so such plans are simulated with those ranks whole; a plan whose
 * expert groups are its replicas' own ranks folds them.  Every case equals the unfolded
 * run to 1e-12. */
Test(folding, expert_groups_fold_only_inside_replicas)
{
  g_autoptr(SimCostModel) c = roofline();
  GError *error = NULL;
  g_autoptr(SimMachine) m = sim_machine_load("dgx-h100:2", &error);
  cr_assert_not_null(m, "%s", error ? error->message : "");
  /* tp, ep, etp (0: tp) */
  const int cases[][3] = { { 1, 4, 0 }, { 2, 2, 0 }, { 2, 4, 1 }, { 2, 2, 1 } };
  for (size_t k = 0; k < G_N_ELEMENTS(cases); k++) {
    g_autoptr(SimGraph) g = zoo("moe", "layers=4,hidden=256,heads=8,kv_heads=2,experts=8,"
                                       "top_k=2,expert_ffn=512,seq=256,vocab=1024,batch=32");
    SimMegatronOptions mo = sim_megatron_options_default();
    mo.tp = cases[k][0];
    mo.ep = cases[k][1];
    mo.etp = cases[k][2];
    mo.pp = 2;
    mo.dp = 8 / mo.tp;
    mo.microbatch_size = 1;
    mo.schedule = SIM_SCHEDULE_INTERLEAVED;
    mo.chunks = 2;
    mo.sequence_parallel = mo.tp > 1;
    g_autoptr(SimStrategy) s = sim_strategy_megatron(g, m, &mo, &error);
    cr_assert_not_null(s, "%s", error ? error->message : "");
    SimOptions o = sim_options_default(), unfolded = o;
    unfolded.fold = FALSE;
    g_autoptr(SimReport) r = sim_simulate(g, m, s, c, &o, &error);
    g_autoptr(SimReport) u = sim_simulate(g, m, s, c, &unfolded, &error);
    cr_assert_not_null(r);
    cr_assert_not_null(u);
    double t = sim_report_iteration_time(r), tu = sim_report_iteration_time(u);
    cr_expect_float_eq(t, tu, 1e-12 * tu, "tp %d ep %d etp %d: folded (%s) %.17g, unfolded %.17g",
                       mo.tp, mo.ep, mo.etp, sim_report_folding(r), t, tu);
  }
}

/* @s lowered (unfolded, every micro-batch) with or without the dependencies its streams
 * imply, and assembled, a node's rings as one flow each where simulate.c would; @cp: the
 * parameters it was lowered with. */
static SimLowering *lower_assembled(const SimGraph *g, SimMachine *m, const SimStrategy *s,
                                    SimCostModel *c, gboolean drop, SimCollParams *cp_out)
{
  SimOptions o = sim_options_default();
  o.fold = FALSE;
  SimCollParams cp = sim_coll_params_default();
  SimLowering *lw = NULL;
  SimTaskGraph *tg = NULL;
  /* A node's rings as one flow each, lowered again without where they share links (as
   * simulate.c does). */
  for (int whole = 1; whole >= 0 && !lw; whole--) {
    cp.whole_node_rings = whole;
    lw = sim_lowering_new(g, m, s, c, &o, &cp, NULL);
    sim_lowering_drop_implied_edges(lw, drop);
    sim_lowering_build(lw);
    tg = sim_lowering_taskgraph(lw);
    sim_taskgraph_assemble(tg);
    if (whole && !sim_taskgraph_rings_private(tg, m))
      g_clear_pointer(&lw, sim_lowering_free);
  }
  *cp_out = cp;
  return lw;
}

/* The same, merged as a report (@brief FALSE) or a brief run merges it. */
static SimLowering *lower_merged(const SimGraph *g, SimMachine *m, const SimStrategy *s,
                                 SimCostModel *c, gboolean drop, gboolean brief)
{
  SimCollParams cp;
  SimLowering *lw = lower_assembled(g, m, s, c, drop, &cp);
  SimTaskGraph *tg = sim_lowering_taskgraph(lw);
  if (brief)
    sim_taskgraph_merge_chains_brief(tg, TRUE, FALSE, m, &cp);
  else
    sim_taskgraph_merge_chains(tg, TRUE, TRUE, m, &cp, TRUE);
  return lw;
}

/* The dependencies a device's stream implies (a backward on its forward, a consumer on its
 * producer on the same GPU) are left out by the lowering of a graph that will be merged
 * (sim_lowering_drop_implied_edges()), where the merge removed them before: the merged
 * graph is the same, task for task, successor for successor, stream for stream.  GPT over
 * two DGX A100 nodes under each schedule, with and without recomputation and sequence
 * parallelism, and random plans of three models on four GPUs; reports' merges and brief
 * runs'. */
static void expect_same_graph(const SimTaskGraph *a, const SimTaskGraph *b, const char *what,
                              int brief)
{
  {
    cr_assert_eq(a->n_tasks, b->n_tasks, "%s, brief %d", what, brief);
    cr_assert_eq(a->n_succ_total, b->n_succ_total, "%s, brief %d", what, brief);
    cr_assert_eq(a->n_roots, b->n_roots, "%s", what);
    for (int t = 0; t < a->n_tasks; t++) {
      const SimTask *x = &a->task[t], *y = &b->task[t];
      cr_assert(x->kind == y->kind && x->cls == y->cls && x->device == y->device &&
                  x->peer == y->peer && x->op == y->op && x->mb == y->mb &&
                  x->shard == y->shard && x->duration == y->duration &&
                  x->n_succ == y->n_succ && x->succ_off == y->succ_off &&
                  a->n_pred[t] == b->n_pred[t],
                "%s, brief %d: task %d differs", what, brief, t);
      if (x->kind == SIM_TASK_COMPUTE)
        cr_assert(x->mem_alloc == y->mem_alloc && x->mem_free == y->mem_free, "%s", what);
      else
        cr_assert(sim_task_bytes(x) == sim_task_bytes(y), "%s", what);
    }
    cr_assert_eq(memcmp(a->succ, b->succ, sizeof(int32_t) * (size_t)a->n_succ_total), 0, "%s",
                 what);
    cr_assert_eq(memcmp(a->roots, b->roots, sizeof(int32_t) * (size_t)a->n_roots), 0, "%s", what);
    cr_assert_eq(memcmp(a->stream_off, b->stream_off, sizeof(int32_t) * (size_t)(a->n_devices + 1)),
                 0, "%s", what);
    cr_assert_eq(memcmp(a->stream, b->stream, sizeof(int32_t) * (size_t)a->stream_off[a->n_devices]),
                 0, "%s", what);
    cr_assert_eq(a->n_chain_dur, b->n_chain_dur, "%s", what);
    for (size_t k = 0; k < a->n_chain_dur; k++)
      cr_assert(a->chain_dur[k] == b->chain_dur[k] &&
                  signbit(a->chain_dur[k]) == signbit(b->chain_dur[k]), "%s", what);
  }
}

static void expect_same_merged(const SimGraph *g, SimMachine *m, const SimStrategy *s,
                               SimCostModel *c, const char *what)
{
  for (int brief = 0; brief < 2; brief++) {
    SimLowering *la = lower_merged(g, m, s, c, TRUE, brief);
    SimLowering *lb = lower_merged(g, m, s, c, FALSE, brief);
    expect_same_graph(sim_lowering_taskgraph(la), sim_lowering_taskgraph(lb), what, brief);
    sim_lowering_free(la);
    sim_lowering_free(lb);
  }
}

Test(accel, implied_dependencies_left_out_by_the_lowering_give_the_merged_graph)
{
  g_autoptr(SimCostModel) c = roofline();
  g_autoptr(SimGraph) g = accel_gpt();
  GError *error = NULL;
  g_autoptr(SimMachine) m = sim_machine_load("dgx-a100:2", &error);
  cr_assert_not_null(m);
  const struct {
    int tp, pp, dp, chunks;
    SimSchedule sched;
    SimRecompute rc;
    gboolean sp;
  } plans[] = {
    { 8, 2, 1, 1, SIM_SCHEDULE_1F1B, SIM_RECOMPUTE_FULL, FALSE },
    { 2, 4, 2, 1, SIM_SCHEDULE_1F1B, SIM_RECOMPUTE_NONE, FALSE },
    { 4, 2, 2, 2, SIM_SCHEDULE_INTERLEAVED, SIM_RECOMPUTE_FULL, FALSE },
    { 4, 4, 1, 1, SIM_SCHEDULE_GPIPE, SIM_RECOMPUTE_SELECTIVE, TRUE },
  };
  for (size_t i = 0; i < G_N_ELEMENTS(plans); i++) {
    SimMegatronOptions mo = sim_megatron_options_default();
    mo.tp = plans[i].tp;
    mo.pp = plans[i].pp;
    mo.dp = plans[i].dp;
    mo.microbatches = 8;
    mo.schedule = plans[i].sched;
    mo.chunks = plans[i].chunks;
    mo.memory.recompute = plans[i].rc;
    mo.sequence_parallel = plans[i].sp;
    g_autoptr(SimStrategy) s = sim_strategy_megatron(g, m, &mo, &error);
    cr_assert_not_null(s, "plan %zu: %s", i, error ? error->message : "");
    g_autofree char *what = g_strdup_printf("gpt plan %zu", i);
    expect_same_merged(g, m, s, c, what);
  }
  const char *models[][2] = {
    { "mlp", "layers=3,hidden=256,input=128,classes=64,batch=16,towers=2" },
    { "gpt", "layers=2,hidden=128,heads=4,seq=32,vocab=256,batch=8" },
    { "inception-v3", "batch=8" },
  };
  GRand *rng = g_rand_new_with_seed(11);
  for (size_t k = 0; k < G_N_ELEMENTS(models); k++) {
    g_autoptr(SimGraph) gm = zoo(models[k][0], models[k][1]);
    for (int trial = 0; trial < 3; trial++) {
      g_autoptr(SimMachine) sw = switch4(50);
      g_autoptr(SimStrategy) s = random_strategy(gm, sw, rng);
      g_autofree char *what = g_strdup_printf("%s trial %d", models[k][0], trial);
      expect_same_merged(gm, sw, s, c, what);
    }
  }
  g_rand_free(rng);
}

/* The merging polls SimTaskGraph.cancel (simulate.c sets it to SimOptions.cancel): a flag at
 * zero gives the graph merged without one, task for task, and a raised one stops the pass,
 * which returns -1 (and simulate.c fails with SIM_ERROR_CANCELLED); so does the assembly.  GPT over two DGX A100
 * nodes (TP 8, PP 2, 8 micro-batches), a report's merging and a brief run's. */
Test(accel, the_assembly_and_the_merging_stop_at_a_raised_cancellation_flag)
{
  g_autoptr(SimCostModel) c = roofline();
  g_autoptr(SimGraph) g = accel_gpt();
  GError *error = NULL;
  g_autoptr(SimMachine) m = sim_machine_load("dgx-a100:2", &error);
  cr_assert_not_null(m);
  g_autoptr(SimStrategy) s = megatron_plan(g, m, 8, 2, 1, 8, TRUE);
  atomic_int zero, raised;
  atomic_init(&zero, 0);
  atomic_init(&raised, 1);
  for (int brief = 0; brief < 2; brief++) {
    SimCollParams cp;
    SimLowering *la = lower_merged(g, m, s, c, TRUE, brief);
    SimLowering *lb = lower_assembled(g, m, s, c, TRUE, &cp);
    SimTaskGraph *tb = sim_lowering_taskgraph(lb);
    tb->cancel = &zero;
    int n = brief ? sim_taskgraph_merge_chains_brief(tb, TRUE, FALSE, m, &cp)
                  : sim_taskgraph_merge_chains(tb, TRUE, TRUE, m, &cp, TRUE);
    cr_assert_gt(n, 0, "brief %d: nothing merged", brief);
    expect_same_graph(sim_lowering_taskgraph(la), tb, "a flag at zero", brief);
    SimLowering *lc = lower_assembled(g, m, s, c, TRUE, &cp);
    SimTaskGraph *tc = sim_lowering_taskgraph(lc);
    tc->cancel = &raised;
    n = brief ? sim_taskgraph_merge_chains_brief(tc, TRUE, FALSE, m, &cp)
              : sim_taskgraph_merge_chains(tc, TRUE, TRUE, m, &cp, TRUE);
    cr_assert_eq(n, -1, "brief %d: %d merged past a raised flag", brief, n);
    sim_lowering_free(la);
    sim_lowering_free(lb);
    sim_lowering_free(lc);
  }
  /* The assembly polls it between its passes: a flag at zero assembles what no flag does,
   * and a raised one stops it, the graph left to be freed (its tasks in one mapping, as
   * simulate.c lowers them). */
  SimOptions o = sim_options_default();
  o.fold = FALSE;
  SimCollParams cp = sim_coll_params_default();
  SimTaskGraph *t[3];
  SimLowering *l[3];
  const atomic_int *flags[3] = { NULL, &zero, &raised };
  for (int i = 0; i < 3; i++) {
    l[i] = sim_lowering_new(g, m, s, c, &o, &cp, NULL);
    t[i] = sim_lowering_taskgraph(l[i]);
    sim_taskgraph_share_tasks(t[i]);
    sim_lowering_build(l[i]);
    t[i]->cancel = flags[i];
    cr_assert_eq(sim_taskgraph_assemble(t[i]), i < 2, "flag %d", i);
  }
  cr_assert_eq(t[0]->n_tasks, t[1]->n_tasks);
  cr_assert_eq(t[0]->n_succ_total, t[1]->n_succ_total);
  cr_assert_eq(memcmp(t[0]->succ, t[1]->succ, sizeof(int32_t) * (size_t)t[0]->n_succ_total), 0);
  cr_assert_eq(memcmp(t[0]->n_pred, t[1]->n_pred, sizeof(int32_t) * (size_t)t[0]->n_tasks), 0);
  cr_assert_eq(memcmp(t[0]->stream_off, t[1]->stream_off,
                      sizeof(int32_t) * (size_t)(t[0]->n_devices + 1)), 0);
  cr_assert_eq(memcmp(t[0]->stream, t[1]->stream,
                      sizeof(int32_t) * (size_t)t[0]->stream_off[t[0]->n_devices]), 0);
  for (int i = 0; i < 3; i++)
    sim_lowering_free(l[i]);
}

/* A deep pipeline's compared periods start 8 micro-batches after its warm-up
 * (sim_steady_plan() in sim/steady.c): with 16 stages, 16 + 8 + 3 periods + 16 of the
 * cool-down = 43 micro-batches simulated (44 for the report's second run), and every figure
 * is what simulating all 96 gives (check_steady()).  GPT of 16 layers over two DGX A100
 * nodes, one layer a stage, 1F1B with and without full recomputation, and TP 2 with 8
 * stages interleaved over 2 chunks (a period of 8 micro-batches: 16 + 8 + 24 + 16 = 64 of
 * 96). */
Test(accel, a_deep_pipeline_repeats_itself_soon_after_its_warm_up)
{
  g_autoptr(SimCostModel) c = roofline();
  g_autoptr(SimGraph) g = zoo("gpt", "layers=16,hidden=256,heads=8,seq=128,vocab=1024,batch=96");
  sim_graph_set_float_dtype(g, SIM_DTYPE_FP16);
  GError *error = NULL;
  g_autoptr(SimMachine) m = sim_machine_load("dgx-a100:2", &error);
  cr_assert_not_null(m);
  const struct {
    int tp, pp, chunks;
    SimSchedule sched;
    SimRecompute rc;
    const char *steady;
  } plans[] = {
    { 1, 16, 1, SIM_SCHEDULE_1F1B, SIM_RECOMPUTE_NONE, "43 and 44 of 96" },
    { 1, 16, 1, SIM_SCHEDULE_1F1B, SIM_RECOMPUTE_FULL, "43 and 44 of 96" },
    { 2, 8, 2, SIM_SCHEDULE_INTERLEAVED, SIM_RECOMPUTE_NONE, "64 and 72 of 96" },
  };
  for (size_t i = 0; i < G_N_ELEMENTS(plans); i++) {
    SimMegatronOptions mo = sim_megatron_options_default();
    mo.tp = plans[i].tp;
    mo.pp = plans[i].pp;
    mo.dp = 1;
    mo.microbatches = 96;
    mo.schedule = plans[i].sched;
    mo.chunks = plans[i].chunks;
    mo.memory.recompute = plans[i].rc;
    g_autoptr(SimStrategy) s = sim_strategy_megatron(g, m, &mo, &error);
    cr_assert_not_null(s, "plan %zu: %s", i, error ? error->message : "");
    g_autofree char *what = g_strdup_printf("plan %zu", i);
    cr_assert(check_steady(g, m, s, c, what), "%s: the steady state was not used", what);
    SimOptions o = sim_options_default();
    g_autoptr(SimReport) r = sim_simulate(g, m, s, c, &o, &error);
    cr_assert_not_null(r);
    cr_assert(strstr(sim_report_steady(r), plans[i].steady), "%s: %s", what,
              sim_report_steady(r));
  }
}
