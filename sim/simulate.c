/* simulate.c — one training iteration, from (graph, machine, strategy) to a report.
 *
 * Folding (DESIGN.md, "Scale"): data-parallel replicas, and the tensor-parallel ranks of
 * one pipeline stage, run the same tasks on identical hardware, so their timelines are
 * identical.  When the strategy has that structure, only one device of each such set is
 * simulated: its compute tasks and transfers are built, while collectives that involve
 * folded devices are built whole (every flow of the ring), so the links they share are
 * shared as in the unfolded run.  The lowering tells when a simulated task would need data
 * from a folded device; folding is then given up, level by level.  Tests compare folded
 * and unfolded runs. */
#include "taskgraph.h"

#include <math.h>
#include <string.h>

SimOptions sim_options_default(void)
{
  return (SimOptions){ .detail = SIM_DETAIL_FLOWS, .fold = TRUE, .keep_timeline = FALSE };
}

SimCollParams sim_coll_params_from_options(const SimOptions *o)
{
  SimCollParams cp = sim_coll_params_default();
  if (o && o->coll_bandwidth_efficiency > 0)
    cp.bandwidth_efficiency = o->coll_bandwidth_efficiency;
  if (o && o->coll_step_latency > 0)
    cp.step_latency = o->coll_step_latency;
  return cp;
}

/* ---- folding analysis ---------------------------------------------------------------- */

static int first_compute_op(const SimGraph *g)
{
  for (int x = 0; x < sim_graph_n_ops(g); x++)
    if (sim_graph_op_type(g, x) != SIM_OP_INPUT)
      return x;
  return -1;
}

/* Whether @phi (device -> device, -1 where undefined) maps the machine onto itself on the
 * devices of @set: same device specs, same bandwidth and latency between every pair. */
static gboolean machine_symmetric(SimMachine *m, const int *set, int n, const int *phi)
{
  for (int i = 0; i < n; i++) {
    int a = set[i], pa = phi[a];
    if (sim_machine_device_spec(m, a) != sim_machine_device_spec(m, pa))
      return FALSE;
    for (int j = 0; j < n; j++) {
      int b = set[j], pb = phi[b];
      if (a == b)
        continue;
      if (sim_machine_bandwidth(m, a, b) != sim_machine_bandwidth(m, pa, pb) ||
          sim_machine_latency(m, a, b) != sim_machine_latency(m, pa, pb))
        return FALSE;
    }
  }
  return TRUE;
}

/* Data-parallel replicas: every operator splits its sample dimension D ways, the shards of
 * replica r sit on devices that a one-to-one map carries from replica 0's, and the map
 * keeps the machine's shape.  Fills @in_rep0 (devices of replica 0) and @rep_of. */
static gboolean fold_replicas(const SimGraph *g, SimMachine *m, const SimStrategy *s,
                              uint8_t *in_rep0, int *rep_of)
{
  int nd = sim_machine_n_devices(m), x0 = first_compute_op(g);
  if (x0 < 0)
    return FALSE;
  int D = s->ops[x0].degree[0];
  if (D <= 1)
    return FALSE;
  int *phi = g_new(int, (size_t)D * nd); /* phi[r * nd + d0]: replica r's image of d0 */
  int *owner = g_new(int, nd);           /* which replica a device belongs to          */
  for (int i = 0; i < D * nd; i++)
    phi[i] = -1;
  for (int d = 0; d < nd; d++)
    owner[d] = -1;
  gboolean ok = TRUE;
  for (int x = 0; ok && x < s->n_ops; x++) {
    if (sim_graph_op_type(g, x) == SIM_OP_INPUT)
      continue;
    const SimOpConfig *c = &s->ops[x];
    if (c->degree[0] != D) {
      ok = FALSE;
      break;
    }
    int per = c->n_shards / D;
    for (int r = 0; ok && r < D; r++)
      for (int k = 0; ok && k < per; k++) {
        int d0 = c->devices[k], dr = c->devices[r * per + k];
        int *slot = &phi[(size_t)r * nd + d0];
        if (*slot < 0)
          *slot = dr;
        ok = *slot == dr && (owner[dr] < 0 || owner[dr] == r);
        owner[dr] = r;
      }
  }
  if (ok) {
    memset(in_rep0, 0, (size_t)nd);
    GArray *set = g_array_new(FALSE, FALSE, sizeof(int));
    for (int d = 0; d < nd; d++)
      if (owner[d] == 0) {
        in_rep0[d] = 1;
        g_array_append_val(set, d);
      }
    for (int d = 0; d < nd; d++)
      rep_of[d] = d;
    int *map = g_new(int, nd);
    for (int r = 1; ok && r < D; r++) {
      for (int d = 0; d < nd; d++)
        map[d] = d;
      for (guint i = 0; i < set->len; i++) {
        int d0 = g_array_index(set, int, i);
        map[d0] = phi[(size_t)r * nd + d0];
        if (map[d0] < 0)
          ok = FALSE;
        else
          rep_of[map[d0]] = d0;
      }
      ok = ok && machine_symmetric(m, (int *)set->data, (int)set->len, map);
    }
    g_free(map);
    g_array_free(set, TRUE);
  }
  g_free(phi);
  g_free(owner);
  return ok;
}

/* Tensor-parallel ranks: inside replica 0, every operator of a stage spreads its shards
 * over the same set of devices, one shard per device, and the first shard of each is on
 * the same device, which stands for the others. */
static gboolean fold_ranks(const SimGraph *g, SimMachine *m, const SimStrategy *s,
                           const uint8_t *in_rep0, int D, uint8_t *simulated, int *rep_of)
{
  int nd = sim_machine_n_devices(m);
  int S = s->n_stages;
  int *rep = g_new(int, S);
  for (int st = 0; st < S; st++)
    rep[st] = -1;
  GHashTable **sets = g_new0(GHashTable *, S);
  gboolean any = FALSE, ok = TRUE;
  for (int x = 0; ok && x < s->n_ops; x++) {
    if (sim_graph_op_type(g, x) == SIM_OP_INPUT)
      continue;
    const SimOpConfig *c = &s->ops[x];
    int st = s->op_stage[x];
    int per = c->n_shards / (D > 1 ? D : 1);
    GHashTable *mine = g_hash_table_new(g_direct_hash, g_direct_equal);
    for (int k = 0; k < per; k++)
      g_hash_table_add(mine, GINT_TO_POINTER(c->devices[k] + 1));
    if ((int)g_hash_table_size(mine) != per)
      ok = FALSE; /* two shards on one device */
    if (rep[st] < 0) {
      rep[st] = c->devices[0];
      sets[st] = mine;
      mine = NULL;
    } else {
      ok = ok && rep[st] == c->devices[0] &&
           g_hash_table_size(mine) == g_hash_table_size(sets[st]);
      if (ok) {
        GHashTableIter it;
        gpointer key;
        g_hash_table_iter_init(&it, mine);
        while (ok && g_hash_table_iter_next(&it, &key, NULL))
          ok = g_hash_table_contains(sets[st], key);
      }
    }
    if (mine)
      g_hash_table_destroy(mine);
  }
  if (ok) {
    for (int st = 0; st < S; st++) {
      if (!sets[st])
        continue;
      int r = rep[st];
      GHashTableIter it;
      gpointer key;
      g_hash_table_iter_init(&it, sets[st]);
      while (g_hash_table_iter_next(&it, &key, NULL)) {
        int d = GPOINTER_TO_INT(key) - 1;
        if (d == r || !in_rep0[d])
          continue;
        if (sim_machine_device_spec(m, d) != sim_machine_device_spec(m, r)) {
          ok = FALSE;
          continue;
        }
        simulated[d] = 0;
        any = TRUE;
      }
    }
  }
  if (ok && any) {
    /* Folded ranks take their representative's timeline, and so do their images in the
     * other replicas. */
    int *rank_rep = g_new(int, nd);
    for (int d = 0; d < nd; d++)
      rank_rep[d] = d;
    for (int st = 0; st < S; st++) {
      if (!sets[st])
        continue;
      GHashTableIter it;
      gpointer key;
      g_hash_table_iter_init(&it, sets[st]);
      while (g_hash_table_iter_next(&it, &key, NULL))
        rank_rep[GPOINTER_TO_INT(key) - 1] = rep[st];
    }
    for (int d = 0; d < nd; d++)
      rep_of[d] = rank_rep[rep_of[d]];
    g_free(rank_rep);
  }
  for (int st = 0; st < S; st++)
    if (sets[st])
      g_hash_table_destroy(sets[st]);
  g_free(sets);
  g_free(rep);
  (void)nd;
  return ok && any;
}

/* ---- the driver ---------------------------------------------------------------------- */

static gboolean check_schedule(const SimStrategy *s, GError **error)
{
  if (s->schedule == SIM_SCHEDULE_INTERLEAVED && s->chunks > 1) {
    int P = s->n_stages / s->chunks;
    if (P > 0 && s->microbatches % P != 0) {
      g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                  "the interleaved schedule needs a number of micro-batches (%d) divisible "
                  "by the number of pipeline stages (%d)",
                  s->microbatches, P);
      return FALSE;
    }
  }
  return TRUE;
}

typedef struct {
  SimLowering *lw;
  int *rep_of;
  const char *folding;
} Lowered;

static Lowered lower_folded(const SimGraph *g, SimMachine *m, const SimStrategy *s,
                            SimCostModel *cost, const SimOptions *o, const SimCollParams *cp)
{
  int nd = sim_machine_n_devices(m);
  Lowered out = { 0 };
  out.rep_of = g_new(int, nd);
  uint8_t *in_rep0 = g_new(uint8_t, nd);
  uint8_t *mask = g_new(uint8_t, nd);
  int levels = 0;
  if (o->fold) {
    if (fold_replicas(g, m, s, in_rep0, out.rep_of)) {
      levels = 1;
      memcpy(mask, in_rep0, (size_t)nd);
      int D = s->ops[first_compute_op(g)].degree[0];
      if (fold_ranks(g, m, s, in_rep0, D, mask, out.rep_of))
        levels = 2;
    } else {
      for (int d = 0; d < nd; d++) {
        in_rep0[d] = 1;
        out.rep_of[d] = d;
      }
      memcpy(mask, in_rep0, (size_t)nd);
      if (fold_ranks(g, m, s, in_rep0, 1, mask, out.rep_of))
        levels = 3;
    }
  }
  while (levels > 0) {
    SimLowering *lw = sim_lowering_new(g, m, s, cost, o, cp, mask);
    sim_lowering_build(lw);
    if (!sim_lowering_fold_violated(lw)) {
      out.lw = lw;
      out.folding = levels == 1   ? "data-parallel replicas"
                    : levels == 2 ? "data-parallel replicas and tensor-parallel ranks"
                                  : "tensor-parallel ranks";
      break;
    }
    sim_lowering_free(lw);
    if (levels == 2) {
      /* Keep the replicas, give up the ranks. */
      memcpy(mask, in_rep0, (size_t)nd);
      fold_replicas(g, m, s, in_rep0, out.rep_of);
      levels = 1;
    } else {
      levels = 0;
    }
  }
  if (!out.lw) {
    for (int d = 0; d < nd; d++)
      out.rep_of[d] = d;
    out.lw = sim_lowering_new(g, m, s, cost, o, cp, NULL);
    sim_lowering_build(out.lw);
    out.folding = "none";
  }
  g_free(in_rep0);
  g_free(mask);
  return out;
}

SimReport *sim_simulate(const SimGraph *g, SimMachine *m, const SimStrategy *s,
                        SimCostModel *cost, const SimOptions *o, GError **error)
{
  g_return_val_if_fail(g && m && s, NULL);
  SimOptions opts = o ? *o : sim_options_default();
  if (!sim_strategy_validate(s, g, m, error))
    return NULL;
  if (!check_schedule(s, error))
    return NULL;
  g_autoptr(SimCostModel) own_cost = NULL;
  if (!cost) {
    SimRooflineParams rp = sim_roofline_params_default();
    cost = own_cost = sim_cost_model_new_roofline(&rp);
  }
  SimCollParams cp = sim_coll_params_from_options(&opts);
  Lowered lo = lower_folded(g, m, s, cost, &opts, &cp);
  SimTaskGraph *tg = sim_lowering_taskgraph(lo.lw);
  sim_taskgraph_assemble(tg);
  SimEngine *e = sim_engine_new(m, cp.bandwidth_efficiency);
  SimTimeline tl = { 0 };
  sim_engine_run(e, tg, &tl);
  SimReport *r = NULL;
  if (tl.deadlock) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                "the strategy's schedule cannot run: %d of %d tasks never became ready "
                "(a stage order that waits on itself)",
                tg->n_tasks - tl.n_tasks_run, tg->n_tasks);
  } else {
    r = sim_report_build(g, m, s, tg, &tl, lo.rep_of, lo.folding, &opts,
                         sim_lowering_model_flops(lo.lw));
  }
  sim_timeline_clear(&tl);
  sim_engine_free(e);
  sim_lowering_free(lo.lw);
  g_free(lo.rep_of);
  return r;
}
