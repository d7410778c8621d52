/* bench-sim.c — the simulator's speed and memory, as a table.
 *
 * Not a test: it asserts nothing about time.  Each large case runs in a child process so
 * that its peak resident memory is its own (getrusage of the child).  Run it with
 *   meson test -C build --benchmark --suite bench --verbose
 * or directly: build/tests/bench-sim [--quick | --scale [--quick | --16k] | --engine |
 * --delta [--quick] | --scale-one ROW MODE]; --scale --16k runs only the 16,384-GPU case;
 * --scale-one runs one row of the --scale table in this process (for perf).
 * --scale prints only the table of large runs: Megatron-LM's weak-scaling configurations
 * (Narayanan et al., SC'21, table 1), GPT-3 175B on 1,024 A100 and a 405B-class model on
 * 16,384 GPUs, each with the exact accelerations of docs/scale.md and without them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "taskgraph.h"
#include "collective.h"
#include "lower.h"
#include "engine.h"

static gboolean quick;
static gboolean with_16k; /* --scale --16k: the 16,384-GPU run alone */

static double now(void)
{
  return (double)g_get_monotonic_time() / 1e6;
}

static int dbl_cmp(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n)
{
  qsort(v, (size_t)n, sizeof(double), dbl_cmp);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static SimGraph *model(const char *name, const char *params, SimDType dt)
{
  g_autoptr(SimModelParams) p = sim_model_params_new();
  GError *error = NULL;
  if (params && !sim_model_params_parse(p, params, &error))
    g_error("%s", error->message);
  SimGraph *g = sim_zoo_build(name, p, &error);
  if (!g)
    g_error("%s", error->message);
  sim_graph_set_float_dtype(g, dt);
  return g;
}

static SimMachine *machine(const char *name)
{
  GError *error = NULL;
  SimMachine *m = sim_machine_load(name, &error);
  if (!m)
    g_error("%s", error->message);
  return m;
}

/* ---- one full simulation in a child process: time, tasks and peak memory ---- */

typedef struct {
  double seconds;
  double iteration;
  int64_t tasks;
  char folding[64];
} ChildResult;

static void run_child(const char *label, const char *mname, const char *gname,
                      const char *params, int dp, int tp, int pp, int64_t mbs, SimDetail detail,
                      SimRecompute rc)
{
  int fds[2];
  if (pipe(fds) != 0)
    g_error("pipe failed");
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    g_autoptr(SimGraph) g = model(gname, params, SIM_DTYPE_FP16);
    g_autoptr(SimMachine) m = machine(mname);
    SimMegatronOptions mo = sim_megatron_options_default();
    mo.dp = dp;
    mo.tp = tp;
    mo.pp = pp;
    mo.microbatch_size = mbs;
    mo.memory.recompute = rc;
    GError *error = NULL;
    g_autoptr(SimStrategy) s = sim_strategy_megatron(g, m, &mo, &error);
    if (!s)
      g_error("%s", error->message);
    SimOptions o = sim_options_default();
    o.detail = detail;
    double t0 = now();
    g_autoptr(SimReport) r = sim_simulate(g, m, s, NULL, &o, &error);
    double t1 = now();
    if (!r)
      g_error("%s", error->message);
    ChildResult res = { t1 - t0, sim_report_iteration_time(r), sim_report_n_tasks(r), "" };
    g_strlcpy(res.folding, sim_report_folding(r), sizeof res.folding);
    if (write(fds[1], &res, sizeof res) != (ssize_t)sizeof res)
      _exit(1);
    _exit(0);
  }
  close(fds[1]);
  ChildResult res;
  memset(&res, 0, sizeof res);
  ssize_t got = read(fds[0], &res, sizeof res);
  close(fds[0]);
  int status;
  struct rusage ru;
  wait4(pid, &status, 0, &ru);
  if (got != (ssize_t)sizeof res || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    printf("| %-44s | failed |\n", label);
    return;
  }
  double cpu = (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
               ru.ru_stime.tv_usec / 1e6;
  printf("| %-44s | %10" G_GINT64_FORMAT " | %8.2f s | %8.2f s | %8.2f GiB | %9.3f s | %s |\n",
         label, res.tasks, res.seconds, cpu, ru.ru_maxrss / 1048576.0, res.iteration, res.folding);
  fflush(stdout);
}

/* ---- large runs with and without the exact accelerations ---- */

typedef struct {
  const char *label, *model, *params;
  int nodes, tp, pp;
  int64_t batch;
  SimSchedule sched;
  int chunks;
  SimRecompute rc;
} ScaleCase;

typedef struct {
  double seconds, iteration;
  int64_t tasks;
  gboolean ok;
  double rss_gib;
  char folding[64];
  gboolean steady;
  double cpu; /* the child's user and system time, seconds */
} ScaleResult;

enum { SCALE_PLAIN, SCALE_REPORT, SCALE_BRIEF };

/* Megatron-LM's weak-scaling table (SC'21, table 1): model, GPUs (DGX A100 nodes of 8),
 * TP, PP, global batch; micro-batches of one sample, 1F1B, full recomputation as
 * Megatron ran it.  Then GPT-3 175B on 1,024 A100 and a 405B-class run (126 layers, h
 * 16,384, 128 heads) on 16,384 GPUs, TP 8, PP 16, DP 128, 2,048 sequences. */
static const ScaleCase cases[] = {
  { "megatron-1.7b, 32 GPUs, TP1 PP1", "megatron-1.7b", "", 4, 1, 1, 512, SIM_SCHEDULE_1F1B, 1, SIM_RECOMPUTE_FULL },
  { "megatron-3.6b, 64 GPUs, TP2 PP1", "megatron-3.6b", "", 8, 2, 1, 512, SIM_SCHEDULE_1F1B, 1, SIM_RECOMPUTE_FULL },
  { "megatron-7.5b, 128 GPUs, TP4 PP1", "megatron-7.5b", "", 16, 4, 1, 512, SIM_SCHEDULE_1F1B, 1, SIM_RECOMPUTE_FULL },
  { "megatron-18.4b, 256 GPUs, TP8 PP1", "megatron-18.4b", "", 32, 8, 1, 1024, SIM_SCHEDULE_1F1B, 1, SIM_RECOMPUTE_FULL },
  { "megatron-39.1b, 512 GPUs, TP8 PP2", "megatron-39.1b", "", 64, 8, 2, 1536, SIM_SCHEDULE_1F1B, 1, SIM_RECOMPUTE_FULL },
  { "megatron-76.1b, 1,024 GPUs, TP8 PP4", "megatron-76.1b", "", 128, 8, 4, 1792, SIM_SCHEDULE_1F1B, 1, SIM_RECOMPUTE_FULL },
  { "megatron-145.6b, 1,536 GPUs, TP8 PP8", "megatron-145.6b", "", 192, 8, 8, 2304, SIM_SCHEDULE_1F1B, 1, SIM_RECOMPUTE_FULL },
  { "megatron-310.1b, 1,920 GPUs, TP8 PP16", "megatron-310.1b", "", 240, 8, 16, 2160, SIM_SCHEDULE_1F1B, 1, SIM_RECOMPUTE_FULL },
  { "megatron-529.6b, 2,520 GPUs, TP8 PP35", "megatron-529.6b", "", 315, 8, 35, 2520, SIM_SCHEDULE_1F1B, 1, SIM_RECOMPUTE_FULL },
  { "megatron-1t, 3,072 GPUs, TP8 PP64", "megatron-1t", "", 384, 8, 64, 3072, SIM_SCHEDULE_1F1B, 1, SIM_RECOMPUTE_FULL },
  { "gpt3-175b, 1,024 GPUs, TP8 PP16 DP8", "gpt3-175b", "vocab=51200", 128, 8, 16, 1536, SIM_SCHEDULE_1F1B, 1, SIM_RECOMPUTE_FULL },
  { "405B-class, 16,384 GPUs, TP8 PP16 DP128", "gpt", "layers=126,hidden=16384,heads=128,seq=2048,vocab=128256", 2048, 8, 16, 2048, SIM_SCHEDULE_1F1B, 1, SIM_RECOMPUTE_FULL },
};
/* The simulation of @c in @mode, in this process: its wall time, prediction, task count,
 * steady state and folding. */
static ScaleResult scale_body(const ScaleCase *c, int mode)
{
  g_autofree char *params = g_strdup_printf("%s%sbatch=%" G_GINT64_FORMAT, c->params,
                                            *c->params ? "," : "", c->batch);
  double t0 = now();
  g_autoptr(SimGraph) g = model(c->model, params, SIM_DTYPE_FP16);
  g_autofree char *mname = g_strdup_printf("dgx-a100:%d", c->nodes);
  g_autoptr(SimMachine) m = machine(mname);
  SimMegatronOptions mo = sim_megatron_options_default();
  mo.tp = c->tp;
  mo.pp = c->pp;
  mo.dp = c->nodes * 8 / (c->tp * c->pp);
  mo.microbatch_size = 1;
  mo.schedule = c->sched;
  mo.chunks = c->chunks;
  mo.memory.recompute = c->rc;
  GError *error = NULL;
  g_autoptr(SimStrategy) s = sim_strategy_megatron(g, m, &mo, &error);
  if (!s)
    g_error("%s", error->message);
  SimOptions o = sim_options_default();
  o.merge_chains = o.merge_rings = o.steady_state = mode != SCALE_PLAIN;
  ScaleResult out = { 0 };
  out.ok = TRUE;
  if (mode == SCALE_BRIEF) {
    SimBrief b;
    if (!sim_simulate_brief(g, m, s, NULL, &o, INFINITY, &b, &error))
      g_error("%s", error->message);
    out.seconds = now() - t0;
    out.iteration = b.time;
  } else {
    g_autoptr(SimReport) r = sim_simulate(g, m, s, NULL, &o, &error);
    if (!r)
      g_error("%s", error->message);
    out.seconds = now() - t0;
    out.iteration = sim_report_iteration_time(r);
    out.tasks = sim_report_n_tasks(r);
    out.steady = sim_report_steady(r) != NULL;
    g_strlcpy(out.folding, sim_report_folding(r), sizeof out.folding);
  }
  return out;
}

/* One simulation of @c in a child process (SCALE_PLAIN: a report without the
 * accelerations; SCALE_REPORT: with them; SCALE_BRIEF: with them, the brief simulation a
 * search runs): its wall time, the child's peak resident memory, its prediction. */
static ScaleResult scale_child(const ScaleCase *c, int mode)
{
  ScaleResult res;
  memset(&res, 0, sizeof res);
  int fds[2];
  if (pipe(fds) != 0)
    g_error("pipe failed");
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    /* A run that needs more memory than this machine should spare fails alone. */
    struct rlimit lim = { (rlim_t)16 << 30, (rlim_t)16 << 30 };
    setrlimit(RLIMIT_AS, &lim);
    ScaleResult out = scale_body(c, mode);
    if (write(fds[1], &out, sizeof out) != (ssize_t)sizeof out)
      _exit(1);
    _exit(0);
  }
  close(fds[1]);
  ssize_t got = read(fds[0], &res, sizeof res);
  close(fds[0]);
  int status;
  struct rusage ru;
  wait4(pid, &status, 0, &ru);
  res.ok = got == (ssize_t)sizeof res && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  res.rss_gib = ru.ru_maxrss / 1048576.0;
  /* The child's processor time, which a busy machine inflates far less than wall time
   * (the model and machine are built inside the timed part in both). */
  res.cpu = (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 +
            (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
  return res;
}

static void scale_table(void)
{

  printf("| configuration | tasks | report: wall (CPU) time | report: peak memory | brief: wall "
         "(CPU) time | brief: peak memory | plain: tasks | plain: wall (CPU) time | plain: peak "
         "memory | speed-up in CPU time (report, brief) | prediction | rel. diff (report, brief) "
         "| folding | steady state |\n"
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  /* The 16,384-GPU run alone on request (--16k), the others by default. */
  int n = quick ? 6 : (int)G_N_ELEMENTS(cases) - 1;
  for (int i = with_16k ? n : 0; i < (with_16k ? n + 1 : n); i++) {
    ScaleResult a = scale_child(&cases[i], SCALE_REPORT);
    ScaleResult br = scale_child(&cases[i], SCALE_BRIEF);
    ScaleResult b = scale_child(&cases[i], SCALE_PLAIN);
    if (!a.ok || !b.ok || !br.ok) {
      printf("| %s | %s (peak memory %.2f GiB, limit 16 GiB) |\n", cases[i].label,
             !a.ok ? "failed" : !br.ok ? "brief run failed" : "plain run failed",
             !a.ok ? a.rss_gib : !br.ok ? br.rss_gib : b.rss_gib);
      continue;
    }
    double diff = fabs(a.iteration - b.iteration) / b.iteration;
    double diff_b = fabs(br.iteration - b.iteration) / b.iteration;
    printf("| %s | %" G_GINT64_FORMAT " | %.2f s (%.2f s) | %.2f GiB | %.2f s (%.2f s) | %.2f GiB | "
           "%" G_GINT64_FORMAT " | %.2f s (%.2f s) | %.2f GiB | %.2fx, %.2fx | %.3f s | "
           "%.1e, %.1e%s | %s | %s |\n",
           cases[i].label, a.tasks, a.seconds, a.cpu, a.rss_gib, br.seconds, br.cpu, br.rss_gib,
           b.tasks, b.seconds, b.cpu, b.rss_gib, b.cpu / a.cpu, b.cpu / br.cpu, a.iteration,
           diff, diff_b, diff <= 1e-9 && diff_b <= 1e-9 ? " (same)" : " (DIFFERS)", a.folding,
           a.steady ? "yes" : "no");
    fflush(stdout);
  }
}

/* ---- the engine's speed in tasks per second ---- */

static void engine_rate(void)
{
  g_autoptr(SimGraph) g = model("inception-v3", "batch=512", SIM_DTYPE_FP16);
  g_autoptr(SimMachine) m = machine("dgx-a100:8");
  GError *error = NULL;
  g_autoptr(SimStrategy) s = sim_strategy_data_parallel(g, m, 64, &error);
  SimOptions o = sim_options_default();
  o.fold = FALSE;
  SimCollParams cp = sim_coll_params_default();
  g_autoptr(SimCostModel) c = sim_cost_model_new_roofline(NULL);
  SimLowering *lw = sim_lowering_new(g, m, s, c, &o, &cp, NULL);
  double t0 = now();
  sim_lowering_build(lw);
  SimTaskGraph *tg = sim_lowering_taskgraph(lw);
  sim_taskgraph_assemble(tg);
  double t1 = now();
  SimEngine *e = sim_engine_new(m, &cp);
  SimTimeline tl = { 0 };
  int reps = quick ? 5 : 21;
  double *v = g_new(double, reps);
  for (int i = 0; i < reps; i++) {
    double a = now();
    sim_engine_run(e, tg, &tl);
    v[i] = now() - a;
  }
  double med = median(v, reps);
  printf("| engine: inception-v3, data parallel, 64 GPUs   | %10d tasks | lowering %.3f s | "
         "engine %.4f s (median of %d) | %.2f M tasks/s |\n",
         tg->n_tasks, t1 - t0, med, reps, tg->n_tasks / med / 1e6);
  g_free(v);
  sim_timeline_clear(&tl);
  sim_engine_free(e);
  sim_lowering_free(lw);
}

/* ---- delta against full simulation after single-operator changes ---- */

#define SCALE_MAX_GPUS 256

/* How the measured changes follow each other: every change stays (a random walk, as if
 * every MCMC proposal were accepted); every change is undone after it is measured, so
 * that each starts from data parallelism (as if every proposal were rejected); or a
 * change stays by the rule of parasol's MCMC search (always if the iteration is not
 * slower, else with probability exp(-20 * (new - cur) / cur)). */
typedef enum { WALK, UNDONE, MCMC } Moves;

static void delta_vs_full(const char *gname, const char *params, Moves moves, int gpus)
{
  gboolean walk = moves == WALK;
  g_autoptr(SimGraph) g = model(gname, params, SIM_DTYPE_FP16);
  g_autofree char *mname = g_strdup_printf("dgx-a100:%d", gpus / 8);
  g_autoptr(SimMachine) m = machine(mname);
  GError *error = NULL;
  g_autoptr(SimStrategy) s0 = sim_strategy_data_parallel(g, m, gpus, &error);
  int log_gpus = 0;
  while ((1 << (log_gpus + 1)) <= gpus)
    log_gpus++;
  SimOptions o = sim_options_default();
  g_autoptr(SimCostModel) c = sim_cost_model_new_roofline(NULL);
  SimSession *ss = sim_session_new(g, m, s0, c, &o, &error);
  double now_t = sim_session_run(ss);
  int accepted = 0;
  GRand *rng = g_rand_new_with_seed(1);
  int want = quick ? 7 : 25, got = 0;
  double *td = g_new(double, want), *tf = g_new(double, want), *ratio = g_new(double, want);
  /* Where the time goes: delta (re-lowering, assembly, engine) and full (lowering,
   * assembly, engine), each a column of medians. */
  double *ph[6];
  for (int i = 0; i < 6; i++)
    ph[i] = g_new(double, want);
  int n = sim_graph_n_ops(g), mismatches = 0;
  while (got < want) {
    /* A single operator gets a random data-parallel degree over the first devices, as an
     * MCMC proposal does. */
    int x = g_rand_int_range(rng, 0, n);
    if (sim_graph_op_type(g, x) == SIM_OP_INPUT)
      continue;
    int deg[8] = { 1, 1, 1, 1, 1, 1, 1, 1 }, devs[SCALE_MAX_GPUS];
    int k = 1 << g_rand_int_range(rng, 0, log_gpus + 1);
    if (sim_graph_op_dim_size(g, x, 0) % k)
      continue;
    deg[0] = k;
    for (int i = 0; i < k; i++)
      devs[i] = i;
    const SimStrategy *cur = sim_session_get_strategy(ss);
    int old_deg[8], old_devs[SCALE_MAX_GPUS], n_old = 0;
    memcpy(old_deg, sim_strategy_op_degrees(cur, x), sizeof old_deg);
    const int *cur_devs = sim_strategy_op_devices(cur, x, &n_old);
    memcpy(old_devs, cur_devs, sizeof(int) * (size_t)n_old);
    if (!sim_session_set_op(ss, x, deg, devs, NULL))
      continue;
    double a = now();
    double t_delta = sim_session_run(ss);
    double b = now();
    sim_session_last_phases(ss, &ph[0][got], &ph[1][got], &ph[2][got]);
    /* Full: the same strategy lowered, assembled and run from nothing, as a simulator
     * without delta simulation evaluates a candidate (no report: the search reads none). */
    SimSession *fresh = sim_session_new(g, m, sim_session_get_strategy(ss), c, &o, &error);
    double lowered = now();
    double t_full = fresh ? sim_session_run(fresh) : -1;
    double d = now();
    ph[3][got] = lowered - b;
    if (fresh)
      sim_session_last_phases(fresh, NULL, &ph[4][got], &ph[5][got]);
    sim_session_free(fresh);
    /* And the figure must be the report's, folded as sim_simulate folds. */
    g_autoptr(SimReport) r = sim_simulate(g, m, sim_session_get_strategy(ss), c, &o, &error);
    if (!r || sim_report_iteration_time(r) != t_delta || t_full != t_delta)
      mismatches++;
    td[got] = b - a;
    tf[got] = d - b;
    ratio[got] = tf[got] / td[got];
    got++;
    gboolean keep = walk;
    if (moves == MCMC)
      keep = t_delta >= 0 && (t_delta <= now_t || g_rand_double(rng) < exp(-20 * (t_delta - now_t) / now_t));
    if (keep) {
      now_t = t_delta;
      accepted++;
    } else {
      g_assert(sim_session_set_op(ss, x, old_deg, old_devs, NULL));
      sim_session_run(ss);
    }
  }
  double mf = median(tf, want), md = median(td, want), mr = median(ratio, want);
  double lo = ratio[0]; /* sorted by median() */
  const char *how = moves == WALK ? "random walk     " : moves == UNDONE ? "from DP, undone " : "MCMC, ";
  g_autofree char *how_mcmc = g_strdup_printf("MCMC, %2d kept   ", accepted);
  printf("| delta vs full: %-12s on %3d GPUs, %s | %d changes | full %.4f s | delta %.4f s | "
         "ratio %.1fx (median; min %.1fx) | %d mismatches |\n",
         gname, gpus, moves == MCMC ? how_mcmc : how, want, mf, md, mr, lo, mismatches);
  double m_ph[6];
  for (int i = 0; i < 6; i++)
    m_ph[i] = median(ph[i], want);
  printf("|   where the time goes (medians, ms) | delta: re-lowering %.1f, assembly %.1f, engine "
         "%.1f | full: lowering %.1f, assembly %.1f, engine %.1f |\n",
         1e3 * m_ph[0], 1e3 * m_ph[1], 1e3 * m_ph[2], 1e3 * m_ph[3], 1e3 * m_ph[4], 1e3 * m_ph[5]);
  for (int i = 0; i < 6; i++)
    g_free(ph[i]);
  g_free(td);
  g_free(tf);
  g_free(ratio);
  g_rand_free(rng);
  sim_session_free(ss);
}

/* Delta against full on both models, each way. */
static void all_deltas(void)
{
  const Moves moves[] = { WALK, UNDONE, MCMC };
  for (size_t i = 0; i < G_N_ELEMENTS(moves); i++) {
    delta_vs_full("inception-v3", "batch=512", moves[i], 64);
    delta_vs_full("bert-large", "batch=256,seq=128", moves[i], 64);
  }
}

/* How the ratio follows the size of the graph: inception-v3 from data parallelism over 16
 * to 256 GPUs (the task graph grows with the devices), each change undone and along the
 * walk. */
static void delta_scaling(void)
{
  const int sizes[] = { 16, 64, 256 };
  for (size_t i = 0; i < G_N_ELEMENTS(sizes); i++) {
    delta_vs_full("inception-v3", "batch=512", UNDONE, sizes[i]);
    delta_vs_full("inception-v3", "batch=512", WALK, sizes[i]);
  }
}

/* One row of the table (--scale-one ROW MODE, MODE brief, report or plain) in this
 * process, for profiling it: perf record build/tests/bench-sim --scale-one 10 brief. */
static int scale_one(const char *row, const char *mode)
{
  char *end;
  long i = strtol(row, &end, 10);
  int md = !strcmp(mode, "brief") ? SCALE_BRIEF : !strcmp(mode, "report") ? SCALE_REPORT
         : !strcmp(mode, "plain") ? SCALE_PLAIN : -1;
  if (*end || i < 0 || i >= (long)G_N_ELEMENTS(cases) || md < 0) {
    fprintf(stderr, "bench-sim: --scale-one expects a row 0-%d and brief, report or plain\n",
            (int)G_N_ELEMENTS(cases) - 1);
    return 2;
  }
  ScaleResult r = scale_body(&cases[i], md);
  printf("%s (%s): %.3f s, prediction %.17g s, %" G_GINT64_FORMAT " tasks\n", cases[i].label,
         mode, r.seconds, r.iteration, r.tasks);
  return 0;
}

int main(int argc, char **argv)
{
  if (argc == 4 && !strcmp(argv[1], "--scale-one"))
    return scale_one(argv[2], argv[3]);
  static const char *const known[] = { "--quick", "--engine", "--16k", "--scale",
                                       "--delta-scaling", "--delta" };
  for (int i = 1; i < argc; i++) {
    gboolean ok = FALSE;
    for (size_t k = 0; k < G_N_ELEMENTS(known); k++)
      ok = ok || !strcmp(argv[i], known[k]);
    if (!ok) {
      gboolean help = !strcmp(argv[i], "--help") || !strcmp(argv[i], "-h");
      if (!help)
        fprintf(stderr, "bench-sim: unknown option %s\n", argv[i]);
      fprintf(help ? stdout : stderr,
              "usage: bench-sim [--quick] | --scale [--16k] | --engine | --delta | "
              "--delta-scaling | --scale-one ROW brief|report|plain\n");
      return help ? 0 : 2;
    }
  }
  quick = argc > 1 && (!strcmp(argv[1], "--quick") || (argc > 2 && !strcmp(argv[2], "--quick")));
  if (argc > 1 && !strcmp(argv[1], "--engine")) {
    /* Only the engine's rate, for profiling it. */
    engine_rate();
    return 0;
  }
  with_16k = argc > 2 && !strcmp(argv[2], "--16k");
  if (argc > 1 && !strcmp(argv[1], "--scale")) {
    scale_table();
    return 0;
  }
  if (argc > 1 && !strcmp(argv[1], "--delta-scaling")) {
    delta_scaling();
    return 0;
  }
  if (argc > 1 && !strcmp(argv[1], "--delta")) {
    /* Only the delta comparison, for profiling it. */
    all_deltas();
    return 0;
  }
  printf("parasol simulator benchmark (%s)\n\n", quick ? "quick" : "full");
  printf("| case | tasks | simulation wall time | process CPU time | peak RSS | predicted iteration "
         "| folding |\n|---|---|---|---|---|---|---|\n");
  run_child("gpt3-175b, 1,024 A100, TP8 PP16 DP8, 1F1B (collective)", "dgx-a100:128",
            "gpt3-175b", "vocab=51200,batch=1536", 8, 8, 16, 1, SIM_DETAIL_COLLECTIVE,
            SIM_RECOMPUTE_FULL);
  if (!quick)
    run_child("gpt3-175b, 1,024 A100, TP8 PP16 DP8, 1F1B (flows)", "dgx-a100:128", "gpt3-175b",
              "vocab=51200,batch=1536", 8, 8, 16, 1, SIM_DETAIL_FLOWS, SIM_RECOMPUTE_FULL);
  run_child("resnet-50, data parallel, 64 A100", "dgx-a100:8", "resnet-50", "batch=2048", 64, 1,
            1, 32, SIM_DETAIL_FLOWS, SIM_RECOMPUTE_NONE);
  printf("\nlarge runs with the exact accelerations and without (plain), one process each%s\n\n",
         quick ? " (the first six)" : "");
  scale_table();
  printf("\n");
  engine_rate();
  printf("\n");
  all_deltas();
  return 0;
}
