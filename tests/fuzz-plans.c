/* fuzz-plans.c — random plans against the simulator's own invariants, and random plans for
 * the executor to check.
 *
 *   build/tests/fuzz-plans delta [SEEDS [FIRST]]   delta sessions after random changes (some
 *                                                  undone) against fresh sessions, bit for
 *                                                  bit, and the folded report
 *   build/tests/fuzz-plans fold [SEEDS [FIRST]]    folded against unfolded reports (time and
 *                                                  peak memory; every other seed with the
 *                                                  optimizer offloaded), strategy JSON
 *                                                  round trips
 *   build/tests/fuzz-plans groups [SEEDS [FIRST]]  the engine with collectives' flow groups
 *                                                  against without, to rounding
 *   build/tests/fuzz-plans bound [SEEDS [FIRST]]   runs bounded at a random time against
 *                                                  unbounded ones (what a search reads),
 *                                                  and brief runs that stop at the first
 *                                                  overflow on GPUs of 0.5-1.5x the
 *                                                  plan's peak memory against whole ones
 *   build/tests/fuzz-plans accel [SEEDS [FIRST]]   each exact acceleration of one simulation
 *                                                  (merged runs of compute tasks, rings as
 *                                                  one flow; every other seed with the
 *                                                  optimizer offloaded) switched
 *                                                  on against off: iteration time to a
 *                                                  relative 1e-9, peak memory and compute
 *                                                  per GPU, and brief runs bounded or
 *                                                  stopped at an overflow
 *   build/tests/fuzz-plans monotone [SEEDS [FIRST]] faster links, GPUs or host against the
 *                                                  same plan (time), memory savings
 *                                                  against none (peak memory), and every
 *                                                  report's own books
 *   build/tests/fuzz-plans gen MODEL PARAMS MACHINE SEED OUT.json
 *                                                  one random valid strategy, for
 *                                                  tests/fuzz-exec.sh
 *
 * Each seed draws a model, a machine, a plan (data parallel, or Megatron's for GPT, with
 * any schedule), memory and synchronization options (ZeRO-1, recomputation, buckets,
 * overlap, the three all-reduce algorithms) and simulation options (collective detail, the
 * host's issue time, blocking sends), then changes random operators' degrees and devices.
 * Prints every disagreement and ends with a count; exit status 1 if any. */
#include "parasol-sim.h"
#include "taskgraph.h"
#include "engine.h"
#include "machine-memory.h"

#include <json-glib/json-glib.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const models[][2] = {
  { "gpt", "layers=4,hidden=128,heads=4,seq=32,vocab=256,batch=96" },
  { "mlp", "layers=4,hidden=256,input=128,classes=64,batch=32,towers=2" },
  { "bert-large", "layers=2,batch=16,seq=32" },
  { "inception-v3", "batch=16" },
  { "rnnlm", "batch=16" },
};
static const char *const machines[] = { "dgx-a100",      "dgx-a100:2", "flexflow-p100",
                                        "vtrain-a100:2", "dgx1-v100",  "pcie-4gpu:2" };

static SimGraph *zoo(const char *name, const char *params)
{
  g_autoptr(SimModelParams) p = sim_model_params_new();
  GError *error = NULL;
  if (params && !sim_model_params_parse(p, params, &error))
    g_error("%s", error->message);
  SimGraph *g = sim_zoo_build(name, p, &error);
  if (!g)
    g_error("%s", error->message);
  return g;
}

/* A random plan for @g on @m: Megatron's for GPT half the time (when the builder takes
 * the draw), else data parallelism over every device; random memory and sync options. */
static SimStrategy *random_plan(const SimGraph *g, SimMachine *m, gboolean gpt, GRand *rng)
{
  int nd = sim_machine_n_devices(m);
  int64_t batch = sim_graph_batch_size(g);
  SimStrategy *s = NULL;
  if (gpt && g_rand_boolean(rng)) {
    SimMegatronOptions o = sim_megatron_options_default();
    o.tp = 1 << g_rand_int_range(rng, 0, 3);
    o.pp = 1 << g_rand_int_range(rng, 0, 3);
    if (nd % (o.tp * o.pp))
      o.tp = o.pp = 1;
    o.dp = batch % (nd / (o.tp * o.pp)) == 0 ? nd / (o.tp * o.pp) : 1;
    o.microbatches = o.pp > 1 ? 4 : 1 + g_rand_int_range(rng, 0, 2);
    /* Now and then enough micro-batches for the schedule's steady state (sim/steady.c). */
    if (g_rand_int_range(rng, 0, 3) == 0)
      o.microbatches = 12 * o.pp;
    if (batch % ((int64_t)o.dp * o.microbatches))
      o.microbatches = 1;
    o.schedule = o.pp == 1 ? SIM_SCHEDULE_1F1B : (SimSchedule)g_rand_int_range(rng, 0, 3);
    o.chunks = o.schedule == SIM_SCHEDULE_INTERLEAVED ? 2 : 1;
    o.sequence_parallel = o.tp > 1 && g_rand_boolean(rng);
    o.scatter_gather = o.tp > 1 && g_rand_boolean(rng);
    /* Tensor-parallel overlap on half the sequence-parallel plans (without a draw, so
     * that the plans drawn stay those of the seed). */
    o.tp_comm_overlap = o.sequence_parallel && !o.scatter_gather;
    s = sim_strategy_megatron(g, m, &o, NULL);
  }
  GError *error = NULL;
  if (!s && !(s = sim_strategy_data_parallel(g, m, nd, &error)))
    g_error("%s", error->message);
  SimSyncOptions sy = sim_strategy_get_sync(s);
  sy.algorithm = (SimAllreduceAlgo)g_rand_int_range(rng, 0, 3);
  sy.bucket_bytes = g_rand_boolean(rng) ? 0 : (int64_t)(1 << 20) * g_rand_int_range(rng, 1, 8);
  sy.overlap = g_rand_boolean(rng);
  sim_strategy_set_sync(s, &sy);
  SimMemoryOptions mo = sim_strategy_get_memory(s);
  mo.zero1 = g_rand_boolean(rng);
  mo.recompute = (SimRecompute)g_rand_int_range(rng, 0, 3);
  sim_strategy_set_memory(s, &mo);
  return s;
}

/* Draws a change of one operator (up to two split dimensions, devices from a random first
 * one, consecutive or every other) and gives it to @apply until it is taken. */
typedef gboolean (*ApplyFn)(gpointer data, int op, const int *degrees, const int *devices);

static void random_change(const SimGraph *g, int nd, GRand *rng, ApplyFn apply, gpointer data)
{
  int n = sim_graph_n_ops(g);
  for (int attempt = 0; attempt < 60; attempt++) {
    int x = g_rand_int_range(rng, 0, n), ndims = sim_graph_op_n_dims(g, x);
    if (ndims <= 0)
      continue;
    int deg[8] = { 1, 1, 1, 1, 1, 1, 1, 1 }, devs[64], total = 1;
    for (int r = 0; r < 2; r++) {
      int d = g_rand_int_range(rng, 0, ndims), k = 1 << g_rand_int_range(rng, 0, 3);
      if (sim_graph_op_dim_splittable(g, x, d) &&
          sim_graph_op_dim_size(g, x, d) % (deg[d] * k) == 0 && total * k <= MIN(nd, 64)) {
        deg[d] *= k;
        total *= k;
      }
    }
    int base = g_rand_int_range(rng, 0, nd), stride = 1 + g_rand_boolean(rng);
    gboolean distinct = TRUE;
    for (int i = 0; i < total; i++) {
      devs[i] = (base + i * stride) % nd;
      for (int j = 0; j < i; j++)
        distinct = distinct && devs[i] != devs[j];
    }
    if (distinct && apply(data, x, deg, devs))
      return;
  }
}

static gboolean apply_to_session(gpointer data, int op, const int *degrees, const int *devices)
{
  return sim_session_set_op(data, op, degrees, devices, NULL);
}

typedef struct {
  SimStrategy **s;
  const SimGraph *g;
  SimMachine *m;
} StrategyChange;

static gboolean apply_to_strategy(gpointer data, int op, const int *degrees, const int *devices)
{
  StrategyChange *c = data;
  g_autoptr(SimStrategy) t = sim_strategy_copy(*c->s);
  if (!sim_strategy_set_op(t, op, degrees, devices, NULL) ||
      !sim_strategy_validate(t, c->g, c->m, NULL))
    return FALSE;
  sim_strategy_free(*c->s);
  *c->s = g_steal_pointer(&t);
  return TRUE;
}

/* A random plan for @g on @m after up to @max_changes random changes (at least
 * @min_changes). */
static SimStrategy *changed_plan(const SimGraph *g, SimMachine *m, gboolean gpt, GRand *rng,
                                 int min_changes, int max_changes)
{
  SimStrategy *s = random_plan(g, m, gpt, rng);
  StrategyChange ch = { &s, g, m };
  int changes = g_rand_int_range(rng, min_changes, max_changes + 1);
  for (int k = 0; k < changes; k++)
    random_change(g, sim_machine_n_devices(m), rng, apply_to_strategy, &ch);
  return s;
}

static SimOptions random_options(GRand *rng)
{
  SimOptions o = sim_options_default();
  o.detail = (SimDetail)g_rand_int_range(rng, 0, 3);
  o.host_kernel_time = g_rand_boolean(rng) ? 0 : 5e-6;
  o.blocking_sends = g_rand_boolean(rng);
  return o;
}

/* A seed's problem: its random stream, then the model (fp16 half the time) and machine
 * drawn from it. */
typedef struct {
  GRand *rng;
  int model;
  const char *machine;
  SimGraph *g;
  SimMachine *m;
} Draw;

static void draw(Draw *d, guint32 seed)
{
  d->rng = g_rand_new_with_seed(seed);
  d->model = g_rand_int_range(d->rng, 0, G_N_ELEMENTS(models));
  d->machine = machines[g_rand_int_range(d->rng, 0, G_N_ELEMENTS(machines))];
  d->g = zoo(models[d->model][0], models[d->model][1]);
  if (g_rand_boolean(d->rng))
    sim_graph_set_float_dtype(d->g, SIM_DTYPE_FP16);
  GError *error = NULL;
  d->m = sim_machine_load(d->machine, &error);
  if (!d->m)
    g_error("%s", error->message);
}

static void draw_clear(Draw *d)
{
  g_rand_free(d->rng);
  sim_graph_free(d->g);
  sim_machine_free(d->m);
}

/* One seed of the delta check; returns the disagreements. */
static int delta_seed(guint32 seed, SimCostModel *c, int *runs)
{
  Draw dr;
  draw(&dr, seed);
  GRand *rng = dr.rng;
  int mi = dr.model;
  const char *machine = dr.machine;
  SimGraph *g = dr.g;
  SimMachine *m = dr.m;
  GError *error = NULL;
  g_autoptr(SimStrategy) s0 = random_plan(g, m, mi == 0, rng);
  SimOptions o = random_options(rng);
  SimSession *ss = sim_session_new(g, m, s0, c, &o, &error);
  if (!ss) {
    printf("seed %u: %s on %s: the session refused its plan: %s\n", seed, models[mi][0],
           machine, error->message);
    g_error_free(error);
    draw_clear(&dr);
    return 1;
  }
  int bad = 0, nd = sim_machine_n_devices(m), n = sim_graph_n_ops(g);
  for (int step = 0; step < 8; step++) {
    g_autoptr(SimStrategy) before = sim_strategy_copy(sim_session_get_strategy(ss));
    random_change(g, nd, rng, apply_to_session, ss);
    double t = sim_session_run(ss);
    const SimStrategy *cur = sim_session_get_strategy(ss);
    SimSession *fresh = sim_session_new(g, m, cur, c, &o, &error);
    g_assert(fresh != NULL);
    double tf = sim_session_run(fresh);
    g_autoptr(SimReport) r = sim_simulate(g, m, cur, c, &o, &error);
    g_assert(r != NULL);
    double tr = sim_report_iteration_time(r);
    gboolean same = t == tf;
    const SimTaskGraph *a = sim_session_taskgraph(ss), *b = sim_session_taskgraph(fresh);
    const SimTimeline *ta = sim_session_timeline(ss), *tb = sim_session_timeline(fresh);
    same = same && a->n_tasks == b->n_tasks;
    for (int i = 0; same && i < a->n_tasks; i++)
      same = ta->start[i] == tb->start[i] && ta->end[i] == tb->end[i];
    (*runs)++;
    if (!same || !(fabs(t - tr) <= 1e-9 * fabs(t))) {
      bad++;
      printf("seed %u step %d: %s on %s, detail %s: delta %.17g, fresh %.17g%s, report %.17g "
             "(folding: %s)\n",
             seed, step, models[mi][0], machine, sim_detail_name(o.detail), t, tf,
             same ? "" : " (timelines differ)", tr, sim_report_folding(r));
    }
    sim_session_free(fresh);
    if (g_rand_int_range(rng, 0, 3) == 0)
      for (int x = 0; x < n; x++) {
        int k = 0;
        const int *dv = sim_strategy_op_devices(before, x, &k);
        g_assert(sim_session_set_op(ss, x, sim_strategy_op_degrees(before, x), dv, NULL));
      }
  }
  sim_session_free(ss);
  draw_clear(&dr);
  return bad;
}

static int fold_checked_runs; /* runs whose replicas folded with the run checked */

/* A Megatron plan over every device of @m (NULL where the draw does not fit @g's batch):
 * random TP and PP, the rest data-parallel, random micro-batches, recomputation, ZeRO-1,
 * sequence parallelism. */
static SimStrategy *megatron_plan(const SimGraph *g, SimMachine *m, GRand *rng)
{
  int nd = sim_machine_n_devices(m);
  int64_t batch = sim_graph_batch_size(g);
  SimMegatronOptions o = sim_megatron_options_default();
  o.tp = 1 << g_rand_int_range(rng, 0, 4);
  o.pp = 1 << g_rand_int_range(rng, 0, 3);
  o.dp = nd / (o.tp * o.pp);
  if (batch % o.dp)
    return NULL;
  int per = (int)(batch / o.dp);
  o.microbatches = per % o.pp == 0 && g_rand_boolean(rng) ? o.pp : per;
  o.memory.recompute = (SimRecompute)g_rand_int_range(rng, 0, 3);
  o.memory.zero1 = g_rand_boolean(rng);
  o.sequence_parallel = o.tp > 1 && g_rand_boolean(rng);
  return sim_strategy_megatron(g, m, &o, NULL);
}

/* Every other seed offloads the optimizer to the host (the whole of it, or half with the
 * transfers overlapped), from the seed so that the random draws stay as they were. */
static void offload_by_seed(SimStrategy *s, guint32 seed)
{
  if (seed % 2 == 0)
    return;
  SimMemoryOptions mo = sim_strategy_get_memory(s);
  mo.offload = seed % 4 == 1 ? 1.0 : 0.5;
  mo.offload_overlap = seed % 4 == 3;
  sim_strategy_set_memory(s, &mo);
}

/* One seed of the folding check: the plan after a few random changes. */
static int fold_seed(guint32 seed, SimCostModel *c, int *runs)
{
  Draw dr;
  draw(&dr, seed);
  GRand *rng = dr.rng;
  int mi = dr.model;
  const char *machine = dr.machine;
  SimGraph *g = dr.g;
  SimMachine *m = dr.m;
  GError *error = NULL;
  /* A third of the GPT draws on several DGX A100 nodes of a rail-optimized network, whose
   * replicas the route check often refuses and the checked folding takes. */
  g_autoptr(SimMachine) rail = NULL;
  if (mi == 0 && g_rand_int_range(rng, 0, 3) == 0) {
    machine = g_rand_boolean(rng) ? "dgx-a100:4" : "dgx-a100:8";
    m = rail = sim_machine_load(machine, &error);
    g_assert(rail);
  }
  SimStrategy *s = rail ? megatron_plan(g, m, rng) : NULL;
  if (!s)
    s = changed_plan(g, m, mi == 0, rng, 0, 2);
  offload_by_seed(s, seed);
  SimOptions o = random_options(rng);
  o.fold = TRUE;
  o.fold_checked = TRUE;
  g_autoptr(SimReport) rf = sim_simulate(g, m, s, c, &o, &error);
  if (rf && strstr(sim_report_folding(rf), "checked"))
    fold_checked_runs++;
  o.fold = FALSE;
  g_autoptr(SimReport) ru = rf ? sim_simulate(g, m, s, c, &o, &error) : NULL;
  int bad = 0;
  (*runs)++;
  if (!rf || !ru) {
    printf("seed %u: %s on %s: %s\n", seed, models[mi][0], machine, error->message);
    g_error_free(error);
    bad++;
  } else {
    double a = sim_report_iteration_time(rf), b = sim_report_iteration_time(ru);
    if (!(fabs(a - b) <= 1e-9 * fabs(b)) ||
        sim_report_max_peak_memory(rf) != sim_report_max_peak_memory(ru)) {
      bad++;
      printf("seed %u: %s on %s, detail %s: folded %.17g (%s), unfolded %.17g; peak memory "
             "%" G_GINT64_FORMAT " against %" G_GINT64_FORMAT "\n",
             seed, models[mi][0], machine, sim_detail_name(o.detail), a, sim_report_folding(rf),
             b, sim_report_max_peak_memory(rf), sim_report_max_peak_memory(ru));
    }
  }
  g_autofree char *json = sim_strategy_to_json(s, g);
  g_autoptr(SimStrategy) back = sim_strategy_from_json(json, "round-trip.json", g, m, &error);
  if (!back || !sim_strategy_equal(back, s)) {
    bad++;
    printf("seed %u: the strategy's JSON reads back %s\n", seed,
           back ? "as another strategy" : error->message);
    g_clear_error(&error);
  }
  sim_strategy_free(s);
  draw_clear(&dr);
  return bad;
}

/* One seed of the acceleration check: a random plan and options (the host's time only half
 * as often as elsewhere, since it turns merging off), simulated with each acceleration on
 * and off. */
static int merging_runs; /* runs whose tasks merging made fewer */
static int steady_runs;  /* runs that extrapolated their schedule's steady state */

static int accel_seed(guint32 seed, SimCostModel *c, int *runs)
{
  Draw dr;
  draw(&dr, seed);
  SimStrategy *s = changed_plan(dr.g, dr.m, dr.model == 0, dr.rng, 0, 2);
  offload_by_seed(s, seed);
  SimOptions o = random_options(dr.rng);
  if (g_rand_boolean(dr.rng)) {
    o.host_kernel_time = 0;
    o.blocking_sends = FALSE;
  }
  o.fold = g_rand_boolean(dr.rng);
  GError *error = NULL;
  SimOptions off = o;
  off.merge_chains = FALSE;
  off.merge_rings = FALSE;
  off.steady_state = FALSE;
  off.prune_shadows = FALSE;
  off.ring_steps = FALSE;
  g_autoptr(SimReport) ra = sim_simulate(dr.g, dr.m, s, c, &o, &error);
  g_autoptr(SimReport) rb = ra ? sim_simulate(dr.g, dr.m, s, c, &off, &error) : NULL;
  int bad = 0;
  (*runs)++;
  if (!ra || !rb) {
    printf("seed %u: %s on %s: %s\n", seed, models[dr.model][0], dr.machine, error->message);
    g_error_free(error);
    sim_strategy_free(s);
    draw_clear(&dr);
    return 1;
  }
  double a = sim_report_iteration_time(ra), b = sim_report_iteration_time(rb);
  merging_runs += sim_report_n_tasks(ra) < sim_report_n_tasks(rb);
  steady_runs += sim_report_steady(ra) != NULL;
  gboolean same = fabs(a - b) <= 1e-9 * b;
  for (int d = 0; d < sim_report_n_devices(ra); d++) {
    double ca = sim_report_compute_time(ra, d), cb = sim_report_compute_time(rb, d);
    same = same && sim_report_peak_memory(ra, d) == sim_report_peak_memory(rb, d) &&
           fabs(ca - cb) <= 1e-9 * MAX(b, 1e-12);
  }
  if (!same) {
    bad++;
    printf("seed %u: %s on %s, detail %s: merged %.17g (%" G_GINT64_FORMAT " tasks), not "
           "merged %.17g (%" G_GINT64_FORMAT " tasks), or memory or compute per GPU differ\n",
           seed, models[dr.model][0], dr.machine, sim_detail_name(o.detail), a,
           sim_report_n_tasks(ra), b, sim_report_n_tasks(rb));
  }
  /* Brief runs: bounded below the iteration, and stopped at the first overflow on GPUs a
   * little smaller than the plan needs, say what the unmerged runs say. */
  double bound = b * g_rand_double_range(dr.rng, 0.3, 1.2);
  SimBrief ba, bb;
  gboolean ok = sim_simulate_brief(dr.g, dr.m, s, c, &o, bound, &ba, &error) &&
                sim_simulate_brief(dr.g, dr.m, s, c, &off, bound, &bb, &error);
  if (!ok || ba.cut != bb.cut || (ba.cut && !(ba.time > bound && ba.time <= b * (1 + 1e-9))) ||
      (!ba.cut && fabs(ba.time - bb.time) > 1e-9 * b)) {
    bad++;
    printf("seed %u: bounded at %.17g: merged %.17g (cut %d), not merged %.17g (cut %d)\n", seed,
           bound, ba.time, ba.cut, bb.time, bb.cut);
  }
  SimOptions so = o, soff = off;
  so.stop_at_overflow = soff.stop_at_overflow = TRUE;
  ok = sim_simulate_brief(dr.g, dr.m, s, c, &so, INFINITY, &ba, &error) &&
       sim_simulate_brief(dr.g, dr.m, s, c, &soff, INFINITY, &bb, &error);
  if (!ok || ba.overflowed != bb.overflowed || ba.cut != bb.cut ||
      (!ba.cut && fabs(ba.time - bb.time) > 1e-9 * b) ||
      (ba.cut && fabs(ba.time - bb.time) > 1e-9 * b && ba.time > bb.time)) {
    bad++;
    printf("seed %u: stopped at an overflow: merged %.17g (%d), not merged %.17g (%d)\n", seed,
           ba.time, ba.overflowed, bb.time, bb.overflowed);
  }
  g_clear_error(&error);
  sim_strategy_free(s);
  draw_clear(&dr);
  return bad;
}

/* One seed of the flow-group check: the engine runs a collective's flows as a group while
 * their links are otherwise idle; without groups (PARASOL_NO_FLOW_GROUPS) every task must
 * be timed the same, to rounding. */
static int groups_seed(guint32 seed, SimCostModel *c, int *runs)
{
  Draw dr;
  draw(&dr, seed);
  SimStrategy *s = changed_plan(dr.g, dr.m, dr.model == 0, dr.rng, 0, 2);
  SimOptions o = random_options(dr.rng);
  o.fold = FALSE;
  double t[2];
  for (int off = 0; off < 2; off++) {
    if (off)
      g_setenv("PARASOL_NO_FLOW_GROUPS", "1", TRUE);
    GError *error = NULL;
    SimReport *r = sim_simulate(dr.g, dr.m, s, c, &o, &error);
    g_unsetenv("PARASOL_NO_FLOW_GROUPS");
    if (!r)
      g_error("seed %u: %s", seed, error->message);
    t[off] = sim_report_iteration_time(r);
    sim_report_free(r);
  }
  (*runs)++;
  int bad = !(fabs(t[0] - t[1]) <= 1e-9 * fabs(t[1]));
  if (bad)
    printf("seed %u: %s on %s, detail %s: with flow groups %.17g, without %.17g\n", seed,
           models[dr.model][0], dr.machine, sim_detail_name(o.detail), t[0], t[1]);
  sim_strategy_free(s);
  draw_clear(&dr);
  return bad;
}

static int overflows; /* bound: brief runs that stopped at an overflow */

/* @m with GPUs of @bytes of memory each (machine-memory.h). */
static SimMachine *with_memory(const SimMachine *m, double bytes)
{
  GError *error = NULL;
  SimMachine *out = machine_with_memory(m, bytes, &error);
  if (!out)
    g_error("%s", error->message);
  return out;
}

/* One seed of the bound check: after each random change a run bounded at a random
 * fraction (0.5 to 1.5) of the iteration time gives that time exactly when it ends within
 * the bound, and otherwise is cut with a lower bound of it above the bound; an unbounded
 * run after a cut one gives the time again. */
static int bound_seed(guint32 seed, SimCostModel *c, int *runs)
{
  Draw dr;
  draw(&dr, seed);
  g_autoptr(SimStrategy) s0 = random_plan(dr.g, dr.m, dr.model == 0, dr.rng);
  SimOptions o = random_options(dr.rng);
  GError *error = NULL;
  SimSession *ss = sim_session_new(dr.g, dr.m, s0, c, &o, &error);
  g_assert(ss != NULL);
  int bad = 0;
  for (int step = 0; step < 6; step++) {
    random_change(dr.g, sim_machine_n_devices(dr.m), dr.rng, apply_to_session, ss);
    /* The time from a fresh session, then the bounded and unbounded runs of this one. */
    SimSession *fresh = sim_session_new(dr.g, dr.m, sim_session_get_strategy(ss), c, &o, &error);
    g_assert(fresh != NULL);
    double t = sim_session_run(fresh);
    sim_session_free(fresh);
    double b = t * g_rand_double_range(dr.rng, 0.5, 1.5);
    double tb = sim_session_run_bounded(ss, b);
    gboolean cut = sim_session_cut(ss);
    double again = sim_session_run(ss);
    (*runs)++;
    gboolean ok = t <= b ? !cut && tb == t : cut && tb > b && tb <= t;
    ok = ok && again == t;
    /* A brief run asked to stop at the first overflow gives the same verdict on memory,
     * and, where the plan fits, the same time and cut as one that is not; where it does
     * not, it stops no later than the bound would have. */
    SimOptions so = o;
    so.stop_at_overflow = TRUE;
    const SimStrategy *st = sim_session_get_strategy(ss);
    SimBrief ba, bb;
    g_assert(sim_simulate_brief(dr.g, dr.m, st, c, &o, INFINITY, &ba, NULL));
    /* The same GPUs with 0.5 to 1.5 times this plan's highest peak of memory. */
    double peak = ba.max_ratio * (double)sim_machine_device_spec(dr.m, 0)->mem_capacity;
    g_autoptr(SimMachine) small = with_memory(dr.m, peak * g_rand_double_range(dr.rng, 0.5, 1.5));
    g_assert(sim_simulate_brief(dr.g, small, st, c, &o, b, &ba, NULL));
    g_assert(sim_simulate_brief(dr.g, small, st, c, &so, b, &bb, NULL));
    if (bb.overflowed) {
      ok = ok && bb.cut && (ba.overflowed || ba.cut) && bb.time <= ba.time;
      overflows++;
    } else {
      ok = ok && bb.fits == ba.fits && bb.time == ba.time && bb.cut == ba.cut;
    }
    if (!ok) {
      bad++;
      printf("seed %u step %d: %s on %s, detail %s: time %.17g, bound %.17g, bounded run "
             "%.17g (%s), unbounded again %.17g\n",
             seed, step, models[dr.model][0], dr.machine, sim_detail_name(o.detail), t, b, tb,
             cut ? "cut" : "not cut", again);
    }
  }
  sim_session_free(ss);
  draw_clear(&dr);
  return bad;
}

/* One seed of the monotonicity check: the same plan on a faster machine (links at up to
 * four times the bandwidth, GPUs at up to twice the efficiency, no host issue time)
 * should not run an iteration slower, and sharded optimizer states or full recomputation
 * must never raise the highest peak of memory.  Every report must also keep its own
 * books: per GPU, compute within the iteration, overlap within compute and communication,
 * no negative idle time or memory.  Time is not monotone in general: links are shared
 * max-min fairly among the flows that use them, and a transfer that becomes ready sooner
 * can land on a collective it missed before and stretch it (seed 2042: without the host's
 * issue time a gradient's transfer between two GPUs starts 93 us sooner, inside a
 * gradient all-reduce that is on the critical path, which ends 4.6 us later; the
 * iteration takes 0.17% longer).  So a slower iteration on a faster machine is printed
 * and counted as an anomaly, to be read; broken books and memory are disagreements. */
static int anomalies;

static int books_bad(const SimReport *r)
{
  double T = sim_report_iteration_time(r), eps = 1e-9 * T;
  for (int d = 0; d < sim_report_n_devices(r); d++) {
    double cp = sim_report_compute_time(r, d), cm = sim_report_comm_time(r, d);
    double ov = sim_report_overlap_time(r, d), idle = sim_report_idle_time(r, d);
    if (cp < 0 || cp > T + eps || cm < 0 || ov < -eps || ov > MIN(cp, cm) + eps ||
        idle < -eps || sim_report_peak_memory(r, d) < 0)
      return d + 1;
  }
  return 0;
}

static int monotone_seed(guint32 seed, SimCostModel *c, int *runs)
{
  static const char *const what[] = { "links", "GPUs", "host", "ZeRO-1", "full recomputation" };
  Draw dr;
  draw(&dr, seed);
  SimStrategy *s = changed_plan(dr.g, dr.m, dr.model == 0, dr.rng, 0, 3);
  SimOptions o = random_options(dr.rng);
  o.fold = g_rand_boolean(dr.rng);
  o.coll_bandwidth_efficiency = o.net_bandwidth_efficiency = 0.78;
  GError *error = NULL;
  int bad = 0;
  for (int kind = 0; kind < 5; kind++) {
    SimOptions f = o;
    SimCostModel *fc = c, *own = NULL;
    g_autoptr(SimStrategy) base = sim_strategy_copy(s), better = sim_strategy_copy(s);
    double k = g_rand_double_range(dr.rng, 1.05, kind == 0 ? 4 : 2);
    SimMemoryOptions mo = sim_strategy_get_memory(s);
    if (kind == 0) {
      f.coll_bandwidth_efficiency = f.net_bandwidth_efficiency = 0.78 * k;
    } else if (kind == 1) {
      SimRooflineParams rp = sim_roofline_params_default();
      rp.gemm_efficiency *= k;
      rp.conv_efficiency *= k;
      rp.memory_efficiency *= k;
      rp.gather_efficiency *= k;
      rp.recurrent_efficiency *= k;
      fc = own = sim_cost_model_new_roofline(&rp);
    } else if (kind == 2) {
      f.host_kernel_time = 0;
    } else {
      SimMemoryOptions lo = mo, hi = mo;
      if (kind == 3)
        lo.zero1 = FALSE, hi.zero1 = TRUE;
      else
        lo.recompute = SIM_RECOMPUTE_NONE, hi.recompute = SIM_RECOMPUTE_FULL;
      sim_strategy_set_memory(base, &lo);
      sim_strategy_set_memory(better, &hi);
    }
    SimReport *a = sim_simulate(dr.g, dr.m, base, c, &o, &error);
    SimReport *b = a ? sim_simulate(dr.g, dr.m, better, fc, &f, &error) : NULL;
    if (!b)
      g_error("seed %u: %s", seed, error->message);
    (*runs)++;
    int books = books_bad(a) ? books_bad(a) : books_bad(b);
    if (books) {
      bad++;
      printf("seed %u: %s on %s, detail %s: the report's books of GPU %d do not add up\n", seed,
             models[dr.model][0], dr.machine, sim_detail_name(o.detail), books - 1);
    }
    if (kind < 3) {
      double slow = sim_report_iteration_time(a), fast = sim_report_iteration_time(b);
      if (!(fast <= slow * (1 + 1e-12))) {
        anomalies++;
        printf("seed %u: %s on %s, detail %s, %s %.2fx faster: %.17g s against %.17g s "
               "(%+.3g%%)\n",
               seed, models[dr.model][0], dr.machine, sim_detail_name(o.detail), what[kind],
               kind == 2 ? 1.0 : k, fast, slow, 100 * (fast / slow - 1));
      }
    } else {
      int64_t more = sim_report_max_peak_memory(a), less = sim_report_max_peak_memory(b);
      if (less > more) {
        bad++;
        printf("seed %u: %s on %s, detail %s: %s raises the peak memory from %" G_GINT64_FORMAT
               " to %" G_GINT64_FORMAT " bytes\n",
               seed, models[dr.model][0], dr.machine, sim_detail_name(o.detail), what[kind], more,
               less);
      }
    }
    sim_report_free(a);
    sim_report_free(b);
    if (own)
      sim_cost_model_free(own);
  }
  sim_strategy_free(s);
  draw_clear(&dr);
  return bad;
}

static int generate(int argc, char **argv)
{
  if (argc != 7) {
    fprintf(stderr, "usage: fuzz-plans gen MODEL PARAMS MACHINE SEED OUT.json\n");
    return 2;
  }
  g_autoptr(GRand) rng = g_rand_new_with_seed((guint32)strtoul(argv[5], NULL, 10));
  g_autoptr(SimGraph) g = zoo(argv[2], argv[3]);
  GError *error = NULL;
  g_autoptr(SimMachine) m = sim_machine_load(argv[4], &error);
  if (!m)
    g_error("%s", error->message);
  SimStrategy *s = changed_plan(g, m, !strcmp(argv[2], "gpt"), rng, 1, 5);
  gboolean ok = sim_strategy_save(s, g, argv[6], &error);
  sim_strategy_free(s);
  if (!ok) {
    fprintf(stderr, "fuzz-plans: %s\n", error->message);
    return 2;
  }
  return 0;
}

int main(int argc, char **argv)
{
  if (argc < 2 || (strcmp(argv[1], "delta") && strcmp(argv[1], "fold") &&
                    strcmp(argv[1], "groups") && strcmp(argv[1], "bound") &&
                    strcmp(argv[1], "monotone") && strcmp(argv[1], "accel") && strcmp(argv[1], "gen"))) {
    fprintf(stderr, "usage: fuzz-plans delta|fold|groups|bound|accel|monotone [SEEDS [FIRST]] | gen "
                    "MODEL PARAMS MACHINE SEED OUT.json\n");
    return 2;
  }
  if (!strcmp(argv[1], "gen"))
    return generate(argc, argv);
  int n = argc > 2 ? atoi(argv[2]) : 100, first = argc > 3 ? atoi(argv[3]) : 1;
  int (*check)(guint32, SimCostModel *, int *) = !strcmp(argv[1], "delta")  ? delta_seed
                                                 : !strcmp(argv[1], "fold") ? fold_seed
                                                 : !strcmp(argv[1], "bound") ? bound_seed
                                                 : !strcmp(argv[1], "monotone") ? monotone_seed
                                                 : !strcmp(argv[1], "accel") ? accel_seed
                                                                            : groups_seed;
  SimRooflineParams rp = sim_roofline_params_default();
  g_autoptr(SimCostModel) c = sim_cost_model_new_roofline(&rp);
  int bad = 0, runs = 0;
  for (int seed = first; seed < first + n; seed++)
    bad += check((guint32)seed, c, &runs);
  if (check == monotone_seed)
    printf("%s: %d seeds, %d runs, %d slower on a faster machine (anomalies of shared links), "
           "%d disagreements\n", argv[1], n, runs, anomalies, bad);
  else if (check == accel_seed)
    printf("%s: %d seeds, %d runs (%d with merged tasks, %d from the steady state), "
           "%d disagreements\n", argv[1], n, runs, merging_runs, steady_runs, bad);
  else if (check == bound_seed)
    printf("%s: %d seeds, %d runs (%d brief runs stopped at an overflow), %d disagreements\n",
           argv[1], n, runs, overflows, bad);
  else if (check == fold_seed)
    printf("%s: %d seeds, %d runs (%d with replicas folded and the run checked), "
           "%d disagreements\n", argv[1], n, runs, fold_checked_runs, bad);
  else
    printf("%s: %d seeds, %d runs, %d disagreements\n", argv[1], n, runs, bad);
  /* A run that checked nothing (every plan refused) proves nothing: it fails. */
  if (n > 0 && runs == 0) {
    printf("%s: no plan was run: every seed's plan was refused\n", argv[1]);
    return 1;
  }
  return bad ? 1 : 0;
}
