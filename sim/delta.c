/* delta.c — delta simulation: a session keeps the lowered task graph between runs, so a
 * change to a few operators rebuilds only the blocks it touches (the operators' tasks,
 * the transfers and reductions of their tensors, the gradient synchronization) before the
 * engine runs again.  The blocks keep their slots, so the assembled task graph is the one
 * a full lowering of the changed strategy yields, task for task, and the run gives the
 * same timeline as sim_simulate() without folding (tests check this after random moves). */
#include "taskgraph.h"
#include "collective.h"
#include "network.h"
#include "lower.h"
#include "engine.h"
#include "report.h"

#include <math.h>
#include <string.h>

struct _SimSession {
  const SimGraph *g;
  const SimMachine *m;
  SimStrategy *s;
  SimCostModel *cost;
  SimCostModel *own_cost;
  SimOptions o;
  SimCollParams cp;
  SimLowering *lw;
  SimEngine *e;
  SimTimeline tl;
  GArray *changed;   /* op ids waiting to be re-lowered */
  uint8_t *is_changed;
  gboolean assembled;  /* the task graph is laid out for the blocks as they are        */
  gboolean ran;        /* the timeline is the assembled graph's                        */
  double bound;        /* the bound of the last run (INFINITY: none)                   */
  double phase[3];     /* the last run's wall time re-lowering, assembling, running     */
  /* PARASOL_NO_DELTA was set when the session began: every run after a change lowers,
   * assembles and runs the strategy from nothing, as a fresh session would (the
   * yardstick for what delta simulation saves a whole search). */
  gboolean full;
};

/* What a session's network may keep of the rates it works out: SIM_NET_MEMORY, or
 * PARASOL_NET_MEMORY_MB MiB (0: nothing; the results are the same either way). */
static size_t net_memory(void)
{
  const char *v = g_getenv("PARASOL_NET_MEMORY_MB");
  if (!v)
    return SIM_NET_MEMORY;
  char *end;
  guint64 mb = g_ascii_strtoull(v, &end, 10);
  if (end == v || *end || mb > 1 << 20) {
    static gsize warned;
    if (g_once_init_enter(&warned)) {
      g_printerr("PARASOL_NET_MEMORY_MB=%s: expected a whole number of MiB from 0 to "
                 "1048576; using %d\n", v, (int)(SIM_NET_MEMORY >> 20));
      g_once_init_leave(&warned, 1);
    }
    return SIM_NET_MEMORY;
  }
  return (size_t)mb << 20;
}

/* Lowers the session's strategy from nothing and gives it a fresh engine. */
static void build_from_scratch(SimSession *ss)
{
  ss->lw = sim_lowering_new(ss->g, ss->m, ss->s, ss->cost, &ss->o, &ss->cp, NULL);
  sim_lowering_build(ss->lw);
  ss->e = sim_engine_new(ss->m, &ss->cp);
  sim_engine_set_host_times(ss->e, &ss->o);
}

SimSession *sim_session_new(const SimGraph *g, const SimMachine *m, const SimStrategy *s,
                            SimCostModel *cost, const SimOptions *o, GError **error)
{
  if (!sim_strategy_validate(s, g, m, error))
    return NULL;
  SimSession *ss = g_new0(SimSession, 1);
  ss->g = g;
  ss->m = m;
  ss->s = sim_strategy_copy(s);
  ss->o = o ? *o : sim_options_default();
  ss->o.fold = FALSE;
  ss->cp = sim_coll_params_from_options(&ss->o);
  if (!cost) {
    SimRooflineParams rp = sim_roofline_params_default();
    cost = ss->own_cost = sim_cost_model_new_roofline(&rp);
  }
  ss->cost = cost;
  build_from_scratch(ss);
  ss->changed = g_array_new(FALSE, FALSE, sizeof(int));
  ss->is_changed = g_new0(uint8_t, sim_graph_n_ops(g));
  ss->full = g_getenv("PARASOL_NO_DELTA") != NULL;
  /* The engine stays for the session's life, and its network's solves come back run
   * after run: it keeps them.  (Full simulations start from nothing.) */
  if (!ss->full)
    sim_engine_remember_rates(ss->e, net_memory());
  return ss;
}

void sim_session_free(SimSession *ss)
{
  if (!ss)
    return;
  sim_lowering_free(ss->lw);
  sim_engine_free(ss->e);
  sim_timeline_clear(&ss->tl);
  sim_strategy_free(ss->s);
  sim_cost_model_free(ss->own_cost);
  g_array_free(ss->changed, TRUE);
  g_free(ss->is_changed);
  g_free(ss);
}

static gboolean set_op(SimSession *ss, int op, const int *degrees, int replicas,
                       const int *devices, GError **error)
{
  g_return_val_if_fail(op >= 0 && op < ss->s->n_ops, FALSE);
  /* Keep the old configuration, to put it back if the new one is not valid. */
  SimOpConfig old = ss->s->ops[op];
  old.devices = g_memdup2(old.devices, sizeof(int) * (size_t)MAX(old.n_shards, 1));
  /* The session's strategy was valid before: the changed operator is all there is to
   * check. */
  gboolean ok = sim_strategy_set_op_replicated(ss->s, op, degrees, replicas, devices, error) &&
                sim_strategy_validate_op(ss->s, ss->g, ss->m, op, error);
  if (!ok) {
    g_free(ss->s->ops[op].devices);
    ss->s->ops[op] = old;
  } else {
    g_free(old.devices);
  }
  /* Even a refused change replaced the op's device array: the lowering must read the
   * configuration again either way. */
  if (!ss->is_changed[op]) {
    ss->is_changed[op] = 1;
    g_array_append_val(ss->changed, op);
  }
  return ok;
}

gboolean sim_session_set_op(SimSession *ss, int op, const int *degrees, const int *devices,
                            GError **error)
{
  return set_op(ss, op, degrees, 1, devices, error);
}

gboolean sim_session_copy_op(SimSession *ss, int op, const SimStrategy *from, GError **error)
{
  g_return_val_if_fail(from != NULL && op >= 0 && op < from->n_ops, FALSE);
  int n = 0;
  const int *devices = sim_strategy_op_devices(from, op, &n);
  return set_op(ss, op, sim_strategy_op_degrees(from, op), sim_strategy_op_replicas(from, op),
                devices, error);
}

double sim_session_run_bounded(SimSession *ss, double bound)
{
  gint64 t0 = g_get_monotonic_time();
  if (ss->changed->len) {
    if (ss->full) {
      /* What sim_session_new() does, with the changed strategy. */
      sim_lowering_free(ss->lw);
      sim_engine_free(ss->e);
      sim_timeline_clear(&ss->tl);
      build_from_scratch(ss);
    } else {
      sim_lowering_update_ops(ss->lw, (const int *)ss->changed->data, (int)ss->changed->len);
    }
    for (guint i = 0; i < ss->changed->len; i++)
      ss->is_changed[g_array_index(ss->changed, int, i)] = 0;
    g_array_set_size(ss->changed, 0);
    ss->assembled = FALSE;
  }
  gint64 t1 = g_get_monotonic_time();
  if (!ss->assembled) {
    sim_taskgraph_assemble(sim_lowering_taskgraph(ss->lw));
    ss->assembled = TRUE;
    ss->ran = FALSE;
  }
  gint64 t2 = g_get_monotonic_time();
  /* A run cut at a bound answers for any bound up to it; a larger one runs again. */
  if (!ss->ran || (ss->tl.cut && bound > ss->bound)) {
    sim_engine_set_bound(ss->e, bound);
    sim_engine_run(ss->e, sim_lowering_taskgraph(ss->lw), &ss->tl);
    sim_engine_set_bound(ss->e, INFINITY);
    ss->ran = TRUE;
    ss->bound = bound;
  }
  gint64 t3 = g_get_monotonic_time();
  ss->phase[0] = (double)(t1 - t0) * 1e-6;
  ss->phase[1] = (double)(t2 - t1) * 1e-6;
  ss->phase[2] = (double)(t3 - t2) * 1e-6;
  return ss->tl.deadlock ? -1 : ss->tl.makespan;
}

double sim_session_run(SimSession *ss)
{
  return sim_session_run_bounded(ss, INFINITY);
}

gboolean sim_session_cut(const SimSession *ss)
{
  return ss->ran && ss->tl.cut;
}

const SimStrategy *sim_session_get_strategy(const SimSession *ss)
{
  return ss->s;
}

SimReport *sim_session_report(SimSession *ss)
{
  sim_session_run(ss);
  if (ss->tl.deadlock)
    return NULL;
  return sim_report_build(ss->g, ss->m, ss->s, sim_lowering_taskgraph(ss->lw), &ss->tl, NULL,
                          "none", &ss->o, sim_lowering_model_flops(ss->lw));
}

gboolean sim_session_memory(SimSession *ss, double *max_ratio, gboolean *fits)
{
  sim_session_run(ss);
  if (ss->tl.deadlock)
    return FALSE;
  double ratio = 0;
  gboolean ok = TRUE;
  int nd = sim_machine_n_devices(ss->m);
  for (int d = 0; d < nd; d++) {
    const SimDeviceSpec *spec = sim_machine_device_spec(ss->m, d);
    int64_t peak = ss->tl.peak_mem[d];
    if (spec->mem_capacity > 0)
      ratio = MAX(ratio, (double)peak / (double)spec->mem_capacity);
    if (peak > spec->mem_capacity)
      ok = FALSE;
  }
  if (max_ratio)
    *max_ratio = ratio;
  if (fits)
    *fits = ok;
  return TRUE;
}

void sim_session_last_phases(const SimSession *ss, double *relower, double *assemble,
                             double *engine)
{
  g_return_if_fail(ss != NULL);
  if (relower)
    *relower = ss->phase[0];
  if (assemble)
    *assemble = ss->phase[1];
  if (engine)
    *engine = ss->phase[2];
}

const SimTaskGraph *sim_session_taskgraph(SimSession *ss)
{
  return sim_lowering_taskgraph(ss->lw);
}

const SimTimeline *sim_session_timeline(SimSession *ss)
{
  return &ss->tl;
}
