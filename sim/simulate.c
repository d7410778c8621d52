/* simulate.c — one training iteration, from (graph, machine, strategy) to a report.
 *
 * Folding (docs/scale.md): data-parallel replicas, and the tensor-parallel ranks of
 * one pipeline stage, run the same tasks on identical hardware, so their timelines are
 * identical.  When the strategy has that structure, only one device of each such set is
 * simulated: its compute tasks and transfers are built, while collectives that involve
 * folded devices are built whole (every flow of the ring), so the links they share are
 * shared as in the unfolded run.  The lowering tells when a simulated task would need data
 * from a folded device; folding is then given up, level by level.  Where the network
 * does not map the replicas' routes onto each other link by link but their flows meet the
 * same traffic, the replicas may be folded anyway (SimOptions.fold_checked) and the run is
 * checked afterwards (shadows_ran_as_originals()), or made again without.  Tests compare folded and unfolded
 * runs.  The analysis and the shadow tasks are in fold.c; this file is the
 * driver. */
#include "fold.h"
#include "collective.h"
#include "lower.h"
#include "engine.h"
#include "report.h"
#include "steady.h"

#include <math.h>
#include <string.h>

const char *sim_detail_name(SimDetail d)
{
  switch (d) {
  case SIM_DETAIL_STEPS:
    return "steps";
  case SIM_DETAIL_FLOWS:
    return "flows";
  case SIM_DETAIL_COLLECTIVE:
    return "collective";
  }
  return "?";
}

SimOptions sim_options_default(void)
{
  return (SimOptions){ .detail = SIM_DETAIL_FLOWS, .fold = TRUE, .keep_timeline = FALSE,
                       .coll_step_latency = -1, .coll_base_latency = -1,
                       .merge_chains = TRUE, .merge_rings = TRUE, .steady_state = TRUE,
                       .prune_shadows = TRUE, .ring_steps = TRUE };
}

SimCollParams sim_coll_params_from_options(const SimOptions *o)
{
  SimCollParams cp = sim_coll_params_default();
  if (o && o->coll_bandwidth_efficiency > 0)
    cp.bandwidth_efficiency = o->coll_bandwidth_efficiency;
  if (o && o->net_bandwidth_efficiency > 0)
    cp.net_efficiency = o->net_bandwidth_efficiency;
  if (o && o->coll_step_latency >= 0)
    cp.step_latency = o->coll_step_latency;
  if (o && o->coll_base_latency >= 0)
    cp.base_latency = o->coll_base_latency;
  if (o)
    cp.allreduce_table = o->allreduce_table;
  return cp;
}

/* ---- the driver ---------------------------------------------------------------------- */

static gboolean check_schedule(const SimStrategy *s, GError **error)
{
  if (sim_strategy_chunks_per_group(s) > 1) {
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

/* Whether one_shot_run() merges chains of compute tasks (see there). */
static gboolean merges_chains(const SimOptions *o)
{
  return o->merge_chains && o->host_kernel_time <= 0 && o->host_step_time <= 0 &&
         !o->blocking_sends;
}

/* Whether one_shot_run() merges the graph, which first removes the dependencies its
 * streams imply (sim_taskgraph_merge_chains()): the lowering leaves them out. */
static gboolean drops_implied_edges(const SimOptions *o)
{
  return !o->keep_timeline && (merges_chains(o) || o->merge_rings);
}

typedef struct {
  SimLowering *lw;
  int *rep_of;
  const char *folding;
  /* Replicas folded without the route check: each shadow after its original, which the
   * run must check (shadows_ran_as_originals()). */
  GArray *watch;
} Lowered;

/* Lowers @s with the folding of try @t (see lower_folded()); NULL when that folding is not
 * exact for it. */
static SimLowering *lower_try(const SimGraph *g, const SimMachine *m, const SimStrategy *s,
                              SimCostModel *cost, const SimOptions *o, const SimCollParams *cp,
                              Fold *f, gboolean use_r, gboolean use_k, int *rep_of,
                              uint8_t *mask, int count)
{
  int nd = f->nd;
  for (int d = 0; d < nd; d++) {
    rep_of[d] = fold_rep(f, d, use_r, use_k);
    mask[d] = rep_of[d] == d;
  }
  if (f->watch) /* a checked folding's pairs are this try's alone */
    g_array_free(f->watch, TRUE);
  f->watch = NULL;
  SimLowering *lw = sim_lowering_new(g, m, s, cost, o, cp, mask);
  if (count > 0)
    sim_lowering_set_microbatch_count(lw, count);
  sim_lowering_drop_implied_edges(lw, drops_implied_edges(o));
  /* Ring steps need the shadows a brief run keeps (their rings' links count as crossed,
   * fold.c) and no replica's image of a ring (which a step does not have).  Sequence
   * parallelism's gathers cross the rings' links, which the merging's rings allow where
   * the stream waits for them and its layer norms' sums come after the backward pass
   * (taskgraph-merge.c, absorbable_rings()), and steps do not.  Tensor-parallel overlap's
   * waits are steps too (in brief runs alone: a report counts them as communication). */
  gboolean steps = o->ring_steps && merges_chains(o) && f->prune &&
                   !g_getenv("PARASOL_NO_FLOW_GROUPS");
  sim_lowering_ring_steps(lw, steps && !use_r && o->merge_rings && cp->whole_node_rings &&
                                !s->sequence_parallel,
                          steps);
  sim_lowering_taskgraph(lw)->track_collectives = TRUE;
  sim_taskgraph_share_tasks(sim_lowering_taskgraph(lw));
  sim_lowering_build(lw);
  if (o->cancel && atomic_load(o->cancel)) {
    /* Cancelled: the lowering stopped where it was; its caller fails. */
    sim_lowering_free(lw);
    return NULL;
  }
  if (!sim_lowering_fold_violated(lw)) {
    if (add_shadows(sim_lowering_taskgraph(lw), m, f, use_r, use_k))
      return lw;
    /* The routes refused the replicas, but their flows meet the same traffic: the same
     * graph takes the shadows all the same (add_shadows() added nothing when it refused),
     * and the run will be checked (shadows_ran_as_originals()). */
    if (use_r && f->may_check && o->fold_checked) {
      f->checked = TRUE;
      gboolean ok = add_shadows(sim_lowering_taskgraph(lw), m, f, use_r, use_k);
      f->checked = f->may_check = FALSE;
      if (ok)
        return lw;
    }
  }
  f->may_check = FALSE;
  sim_lowering_free(lw);
  return NULL;
}

/* The fewest micro-batches a strategy's schedule runs with: one, or for an interleaved
 * schedule one per stage of a chunk. */
static int fewest_microbatches(const SimStrategy *s)
{
  if (sim_strategy_chunks_per_group(s) > 1)
    return MAX(s->n_stages / s->chunks, 1);
  return 1;
}

/* What the first lowering of a simulation found about its folding, for its later runs
 * (the steady state's second run, the run of every micro-batch after a short run that did
 * not repeat itself): the try of lower_folded() that folded (3: none), for lowerings of
 * the collectives' rings alike (SimCollParams.whole_node_rings).  Whether a folding is
 * exact does not depend on how many micro-batches are lowered (see lower_folded()), so a
 * later run asks neither the tries refused before nor a copy of the one kept. */
typedef struct {
  gboolean known;
  gboolean whole_node_rings;
  int kept;
} FoldVerdict;

/* Lowers @s folded where that is exact; @count: the micro-batches to lower (0: all); @fv:
 * what an earlier lowering of the same simulation found, updated (or NULL); @brief: for a
 * brief run, which leaves out the shadows apart from every simulated flow
 * (SimOptions.prune_shadows). */
static Lowered lower_folded(const SimGraph *g, const SimMachine *m, const SimStrategy *s,
                            SimCostModel *cost, const SimOptions *o, const SimCollParams *cp,
                            int count, FoldVerdict *fv, gboolean brief)
{
  int nd = sim_machine_n_devices(m);
  Lowered out = { 0 };
  out.rep_of = g_new(int, nd);
  Fold f = { .nd = nd, .D = 1, .prune = brief && o->prune_shadows && !o->keep_timeline,
             .ask_check = o->fold_checked, .cancel = o->cancel };
  gboolean replicas = FALSE, ranks = FALSE;
  /* The offloaded updates' PCIe transfers get shadows like any flow (fold.c): a folded
   * device's share of the host links it shares with others. */
  if (o->fold) {
    replicas = fold_replicas(g, m, s, &f);
    ranks = fold_ranks(g, m, s, &f);
  }
  uint8_t *mask = g_new(uint8_t, nd);
  /* Try both symmetries, then each alone; keep the first that is exact. */
  const gboolean tries[3][2] = { { TRUE, TRUE }, { TRUE, FALSE }, { FALSE, TRUE } };
  gboolean asks[3];
  for (int t = 0; t < 3; t++) {
    gboolean use_r = tries[t][0] && replicas, use_k = tries[t][1] && ranks;
    /* Skip a try that asks for nothing, or for what the first try already was. */
    asks[t] = (use_r || use_k) && !(t > 0 && use_r == (replicas && TRUE) && use_k == ranks);
  }
  /* Whether a folding is exact depends on which devices exchange data and over which
   * routes, not on how many micro-batches do it.  A try after which another remains is
   * first asked of a copy of the strategy with the fewest micro-batches its schedule
   * allows, and lowered in full only if that copy folds (a pipeline of 192 micro-batches
   * over 1,024 GPUs lowered a refused try for 1.15 s, and asks the copy in 0.1 s; the
   * brief run of Megatron 1T lowered its refused first try in 0.29 s, and asks the copy in
   * 0.07 s).  A plan whose first try folds pays for the copy's lowering, whose layout of
   * every operator's shards costs as much for one micro-batch as for all; the large runs
   * (docs/scale.md) fold only their tensor-parallel ranks, the last try. */
  int fewest = fewest_microbatches(s);
  int lowered_mbs = count > 0 ? count : s->microbatches;
  gboolean hint = fv && fv->known && fv->whole_node_rings == cp->whole_node_rings;
  int from = hint ? fv->kept : 0, kept = 3;
  for (int t = from; t < 3 && !out.lw; t++) {
    if (!asks[t] || (o->cancel && atomic_load(o->cancel)))
      continue;
    gboolean use_r = tries[t][0] && replicas, use_k = tries[t][1] && ranks;
    gboolean later = FALSE;
    for (int u = t + 1; u < 3; u++)
      later = later || asks[u];
    if (later && lowered_mbs >= 4 * fewest && !(hint && t == from)) {
      SimStrategy *probe = sim_strategy_copy(s);
      probe->microbatches = fewest;
      SimLowering *lw =
        lower_try(g, m, probe, cost, o, cp, &f, use_r, use_k, out.rep_of, mask, 0);
      sim_strategy_free(probe);
      if (!lw)
        continue;
      sim_lowering_free(lw);
    }
    out.lw = lower_try(g, m, s, cost, o, cp, &f, use_r, use_k, out.rep_of, mask, count);
    if (out.lw)
      kept = t;
    if (out.lw && f.watch) {
      out.folding = use_k ? "data-parallel replicas (run checked) and tensor-parallel ranks"
                          : "data-parallel replicas (run checked)";
      out.watch = g_steal_pointer(&f.watch);
    } else if (out.lw) {
      out.folding = use_r && use_k ? "data-parallel replicas and tensor-parallel ranks"
                    : use_r        ? "data-parallel replicas"
                                   : "tensor-parallel ranks";
    }
  }
  if (!out.lw) {
    for (int d = 0; d < nd; d++)
      out.rep_of[d] = d;
    out.lw = sim_lowering_new(g, m, s, cost, o, cp, NULL);
    if (count > 0)
      sim_lowering_set_microbatch_count(out.lw, count);
    sim_lowering_drop_implied_edges(out.lw, drops_implied_edges(o));
    sim_taskgraph_share_tasks(sim_lowering_taskgraph(out.lw));
    sim_lowering_build(out.lw);
    out.folding = "none";
  }
  if (fv && !(o->cancel && atomic_load(o->cancel)))
    *fv = (FoldVerdict){ TRUE, cp->whole_node_rings, kept };
  fold_clear(&f);
  g_free(mask);
  return out;
}

/* One simulation from scratch, folded: the lowering, the assembled task graph and the
 * engine's timeline, for sim_simulate() and sim_simulate_brief(). */
typedef struct {
  Lowered lo;
  SimEngine *e;
  SimTimeline tl;
  SimCostModel *own_cost;
} OneShot;

/* The bytes of the rings that merged runs took in (SimTaskGraph.rings), on their links,
 * as the engine counts a group's: each link of a ring carries its bytes once. */
static void add_ring_bytes(const SimTaskGraph *tg, SimTimeline *tl)
{
  if (!tg->n_rings || !tl->link_bytes)
    return;
  for (int t = 0; t < tg->n_tasks; t++) {
    const SimTask *k = &tg->task[t];
    if (k->kind != SIM_TASK_COMPUTE || k->peer < 0 || tl->end[t] < 0)
      continue;
    for (size_t i = (size_t)k->peer;; i++) {
      if (tg->chain_ring[i] >= 0) {
        const SimTask *r = &tg->rings[tg->chain_ring[i]];
        const int32_t *links = sim_task_links(tg, r);
        for (int j = 0; j < r->n_links; j++)
          tl->link_bytes[links[j]] += r->bytes;
      }
      if (signbit(tg->chain_dur[i]))
        break;
    }
  }
}

/* Whether the run @tl of @tg, its replicas folded without the route check, is the
 * unfolded run.  The unfolded run has every task of a folded device at its
 * representative's times (the same tasks on the same hardware after the same
 * predecessors) if every flow of the folded devices, a shadow here, ran as its original
 * did: then every link carried at every instant the same flows in both runs, which the
 * network shares alike, and every task waiting for a shadow's image was released when its
 * representative was.  A shadow that ran at other times (its route shared with other
 * traffic than the original's) refutes the folding.  Times within a relative 1e-12 of the
 * iteration are the same (sums taken in another order). */
static gboolean shadows_ran_as_originals(const SimTaskGraph *tg, const SimTimeline *tl)
{
  double tol = 1e-12 * (isfinite(tl->makespan) ? tl->makespan : 0);
  for (size_t i = 0; i + 1 < tg->n_watch; i += 2) {
    int32_t a = tg->watch[i], b = tg->watch[i + 1];
    if (a < 0 || b < 0)
      return FALSE; /* merged away: not followed */
    /* A run cut at its bound (or at a GPU's memory) compares what had ended by then, and
     * holds only where no shadow or original was under way at the cut: then every link
     * carried the same flows at the cut in both runs, which would go on alike, so that
     * the unfolded run would have been cut too. */
    double cut = tl->cut ? tl->makespan : INFINITY;
    gboolean ea = tl->end[a] >= 0 && tl->end[a] <= cut;
    gboolean eb = tl->end[b] >= 0 && tl->end[b] <= cut;
    gboolean sa = tl->start[a] >= 0 && tl->start[a] <= cut;
    gboolean sb = tl->start[b] >= 0 && tl->start[b] <= cut;
    if (ea != eb || sa != sb || sa != ea || (!tl->cut && !ea))
      return FALSE;
    if (ea && (fabs(tl->end[a] - tl->end[b]) > tol || fabs(tl->start[a] - tl->start[b]) > tol)) {
      g_debug("folding: a shadow ran from %.17g to %.17g, its original from %.17g to %.17g",
              tl->start[b], tl->end[b], tl->start[a], tl->end[a]);
      return FALSE;
    }
  }
  return TRUE;
}

static void lowered_clear(Lowered *lo)
{
  g_clear_pointer(&lo->lw, sim_lowering_free);
  g_clear_pointer(&lo->rep_of, g_free);
  if (lo->watch)
    g_array_free(lo->watch, TRUE);
  lo->watch = NULL;
}

static void one_shot_clear(OneShot *os)
{
  sim_timeline_clear(&os->tl);
  g_clear_pointer(&os->e, sim_engine_free);
  lowered_clear(&os->lo);
  g_clear_pointer(&os->own_cost, sim_cost_model_free);
}

/* @count: the micro-batches to simulate (0: all); @brief: a run that reports only its
 * time and memory (sim_simulate_brief()); @fv: the folding found by the simulation's
 * earlier runs (lower_folded()).  Where replicas folded with the run checked
 * fail the check, the run is made again and @opts->fold_checked turned off. */
static gboolean one_shot_run(OneShot *os, const SimGraph *g, const SimMachine *m,
                             const SimStrategy *s,
                             SimCostModel *cost, SimOptions *opts, double bound, int count,
                             gboolean brief, FoldVerdict *fv, GError **error)
{
  memset(os, 0, sizeof *os);
  SimCostModel *given_cost = cost;
  if (!sim_strategy_validate(s, g, m, error) || !check_schedule(s, error))
    return FALSE;
  if (!cost) {
    SimRooflineParams rp = sim_roofline_params_default();
    cost = os->own_cost = sim_cost_model_new_roofline(&rp);
  }
  SimCollParams cp = sim_coll_params_from_options(opts);
  /* A node's rings as one flow each from the start (a delta session, which keeps every
   * flow, never asks): exact when no other flow crosses their links, which is checked
   * once the graph is whole; the rare plan where some does is lowered again without. */
  cp.whole_node_rings = opts->merge_rings && opts->detail == SIM_DETAIL_FLOWS &&
                        !opts->keep_timeline;
  double t0 = (double)g_get_monotonic_time();
  os->lo = lower_folded(g, m, s, cost, opts, &cp, count, fv, brief);
  if (opts->cancel && atomic_load(opts->cancel))
    goto cancelled;
  SimTaskGraph *tg = sim_lowering_taskgraph(os->lo.lw);
  /* The assembly and the merging poll the flag too: a search past its deadline does not
   * wait for them (seconds for tens of millions of tasks). */
  tg->cancel = opts->cancel;
  if (!sim_taskgraph_assemble(tg))
    goto cancelled;
  if (cp.whole_node_rings && !sim_taskgraph_rings_private(tg, m)) {
    lowered_clear(&os->lo);
    cp.whole_node_rings = FALSE;
    os->lo = lower_folded(g, m, s, cost, opts, &cp, count, fv, brief);
    if (opts->cancel && atomic_load(opts->cancel))
      goto cancelled;
    tg = sim_lowering_taskgraph(os->lo.lw);
    tg->cancel = opts->cancel;
    if (!sim_taskgraph_assemble(tg))
      goto cancelled;
  }
  sim_lowering_settle_ring_steps(os->lo.lw);
  if (os->lo.watch) {
    /* The shadows to check, and their originals, by task id (the merging renumbers them). */
    g_free(tg->watch);
    tg->n_watch = os->lo.watch->len;
    tg->watch = g_new(int32_t, MAX(tg->n_watch, 1));
    for (guint i = 0; i < os->lo.watch->len; i++)
      tg->watch[i] = sim_taskgraph_id(tg, g_array_index(os->lo.watch, SimTaskRef, i));
  }
  sim_taskgraph_release_blocks(tg);
  double t1 = (double)g_get_monotonic_time();
  int lowered = tg->n_tasks;
  /* A merged run of compute tasks starts each where the one before ends only while the
   * host never holds a kernel back; a kept timeline shows every task.  A bounded run
   * merges as the unbounded one does, so that a run the bound does not cut is the
   * unbounded run; one that is cut (at an event past the bound, or at the first task
   * over memory) is cut by the same rule, at a lower bound of the same iteration. */
  gboolean chains = merges_chains(opts);
  /* Rings a stream waits for alone become steps of its runs where the engine runs groups
   * of flows (engine-groups.c), whose schedule gives their time; a brief run also lets
   * runs span classes. */
  gboolean absorb = chains && opts->merge_rings && !g_getenv("PARASOL_NO_FLOW_GROUPS");
  int merged = 0;
  if (!opts->keep_timeline && brief && absorb)
    merged = sim_taskgraph_merge_chains_brief(tg, chains, opts->stop_at_overflow, m, &cp);
  else if (drops_implied_edges(opts))
    merged = sim_taskgraph_merge_chains(tg, chains, opts->stop_at_overflow,
                                        opts->merge_rings ? m : NULL, &cp, absorb);
  if (merged < 0)
    goto cancelled;
  double t2 = (double)g_get_monotonic_time();
  os->e = sim_engine_new(m, &cp);
  sim_engine_set_host_times(os->e, opts);
  sim_engine_set_bound(os->e, bound);
  sim_engine_set_stop_at_overflow(os->e, opts->stop_at_overflow);
  if (opts->cancel && atomic_load(opts->cancel))
    goto cancelled;
  sim_engine_run(os->e, tg, &os->tl);
  add_ring_bytes(tg, &os->tl);
  g_debug("simulate: %d tasks lowered and assembled in %.3f s, %d after merging (%.3f s), "
          "run in %.3f s", lowered, (t1 - t0) / 1e6, tg->n_tasks, (t2 - t1) / 1e6,
          ((double)g_get_monotonic_time() - t2) / 1e6);
  if (os->tl.cut && isinf(os->tl.makespan))
    goto cancelled;
  if (os->lo.watch && !os->tl.deadlock && !shadows_ran_as_originals(tg, &os->tl)) {
    /* The replicas did not run alike: made again without folding them so, as is every
     * later run of the caller's (the steady state's). */
    g_debug("folding: the replicas did not run alike; simulated again without folding them");
    one_shot_clear(os);
    opts->fold_checked = FALSE;
    return one_shot_run(os, g, m, s, given_cost, opts, bound, count, brief, fv, error);
  }
  if (os->tl.deadlock) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                "the strategy's schedule cannot run: %d of %d tasks never became ready "
                "(a stage order that waits on itself)",
                tg->n_tasks - os->tl.n_tasks_run, tg->n_tasks);
    return FALSE;
  }
  return TRUE;
cancelled:
  g_set_error(error, SIM_ERROR, SIM_ERROR_CANCELLED, "the simulation was cancelled");
  return FALSE;
}

/* The steady state (sim/steady.c): a run of st->count micro-batches, checked.  Returns 1
 * with the run in @os and its period in @period, 0 where the run does not repeat itself
 * exactly (the caller simulates every micro-batch), -1 on an error. */
static int steady_run(OneShot *os, const SimGraph *g, const SimMachine *m, const SimStrategy *s,
                      SimCostModel *cost, SimOptions *opts, const SimSteady *st,
                      double *period, FoldVerdict *fv, GError **error)
{
  if (!one_shot_run(os, g, m, s, cost, opts, INFINITY, st->count, FALSE, fv, error)) {
    one_shot_clear(os);
    return -1;
  }
  if (!sim_steady_period(sim_lowering_taskgraph(os->lo.lw), &os->tl, st, period)) {
    one_shot_clear(os);
    return 0;
  }
  return 1;
}

/* The report of @s from its steady state: two runs, of st->count micro-batches and of one
 * period more, tell what a period adds to every figure.  1, 0 or -1 as steady_run(). */
static int steady_report(const SimGraph *g, const SimMachine *m, const SimStrategy *s,
                         SimCostModel *cost, SimOptions *opts, const SimSteady *st,
                         SimReport **out, FoldVerdict *fv, GError **error)
{
  OneShot os;
  double period, period2;
  int rc = steady_run(&os, g, m, s, cost, opts, st, &period, fv, error);
  if (rc <= 0)
    return rc;
  int nd = sim_machine_n_devices(m), nl = sim_machine_n_links(m);
  double time = sim_steady_time(st, os.tl.makespan, period), makespan = os.tl.makespan;
  SimReport *r = sim_report_build(g, m, s, sim_lowering_taskgraph(os.lo.lw), &os.tl,
                                  os.lo.rep_of, os.lo.folding, opts,
                                  sim_lowering_model_flops(os.lo.lw));
  double *bytes = g_memdup2(os.tl.link_bytes, sizeof(double) * (size_t)MAX(nl, 1));
  one_shot_clear(&os);

  SimSteady st2 = *st;
  st2.count += st->period_mbs;
  rc = steady_run(&os, g, m, s, cost, opts, &st2, &period2, fv, error);
  if (rc <= 0) {
    sim_report_free(r);
    g_free(bytes);
    return rc;
  }
  SimReport *r2 = sim_report_build(g, m, s, sim_lowering_taskgraph(os.lo.lw), &os.tl,
                                   os.lo.rep_of, os.lo.folding, opts,
                                   sim_lowering_model_flops(os.lo.lw));
  /* The second run must be the first with one period more: the same period, ending that
   * much later, the same peaks, folded alike. */
  double tol = 1e-12 * os.tl.makespan;
  gboolean same = fabs(period2 - period) <= tol &&
                  fabs(os.tl.makespan - makespan - period) <= tol &&
                  !strcmp(r->folding, r2->folding);
  for (int d = 0; d < nd && same; d++)
    same = r->peak_mem[d] == r2->peak_mem[d];
  if (same)
    sim_report_extrapolate(r, r2, bytes, os.tl.link_bytes, st, time, period);
  one_shot_clear(&os);
  sim_report_free(r2);
  g_free(bytes);
  if (!same) {
    sim_report_free(r);
    return 0;
  }
  *out = r;
  return 1;
}

SimReport *sim_simulate(const SimGraph *g, const SimMachine *m, const SimStrategy *s,
                        SimCostModel *cost, const SimOptions *o, GError **error)
{
  g_return_val_if_fail(g && m && s, NULL);
  SimOptions opts = o ? *o : sim_options_default();
  opts.stop_at_overflow = FALSE; /* a report is of the whole run */
  OneShot os;
  SimReport *r = NULL;
  SimSteady st;
  FoldVerdict fv = { 0 };
  for (gboolean plan = sim_steady_plan(s, &opts, &st); plan;
       plan = sim_steady_plan_later(s, &opts, &st)) {
    /* one_shot_run() validates the strategy: an invalid one fails here as below. */
    int rc = steady_report(g, m, s, cost, &opts, &st, &r, &fv, error);
    if (rc != 0)
      return r;
  }
  if (one_shot_run(&os, g, m, s, cost, &opts, INFINITY, 0, FALSE, &fv, error))
    r = sim_report_build(g, m, s, sim_lowering_taskgraph(os.lo.lw), &os.tl, os.lo.rep_of,
                         os.lo.folding, &opts, sim_lowering_model_flops(os.lo.lw));
  one_shot_clear(&os);
  return r;
}

/* Fills @out from the finished run @os of @s (its time: @time). */
static void brief_from_run(const OneShot *os, const SimMachine *m, double time, SimBrief *out)
{
  out->time = time;
  out->fits = TRUE;
  /* Folded devices have their representative's memory, as in the report. */
  for (int d = 0; d < sim_machine_n_devices(m); d++) {
    const SimDeviceSpec *spec = sim_machine_device_spec(m, d);
    int64_t peak = os->tl.peak_mem[os->lo.rep_of ? os->lo.rep_of[d] : d];
    if (spec->mem_capacity > 0)
      out->max_ratio = MAX(out->max_ratio, (double)peak / (double)spec->mem_capacity);
    if (peak > spec->mem_capacity)
      out->fits = FALSE;
  }
  out->overflowed = !out->fits;
  out->n_tasks = sim_lowering_taskgraph(os->lo.lw)->n_tasks;
}

gboolean sim_simulate_brief(const SimGraph *g, const SimMachine *m, const SimStrategy *s,
                            SimCostModel *cost, const SimOptions *o, double bound,
                            SimBrief *out, GError **error)
{
  g_return_val_if_fail(g && m && s && out, FALSE);
  memset(out, 0, sizeof *out);
  out->time = INFINITY;
  SimOptions opts = o ? *o : sim_options_default();
  opts.keep_timeline = FALSE;
  OneShot os;
  SimSteady st;
  FoldVerdict fv = { 0 };
  for (gboolean plan = sim_steady_plan(s, &opts, &st); plan;
       plan = sim_steady_plan_later(s, &opts, &st)) {
    /* The run of a few micro-batches is bounded as the whole run would be: it takes no
     * longer than the whole, so past the bound (or past a GPU's memory, where asked, in
     * its warm-up, which the whole run shares) the whole run would be cut too, later. */
    if (!one_shot_run(&os, g, m, s, cost, &opts, bound, st.count, TRUE, &fv, error)) {
      one_shot_clear(&os);
      return FALSE;
    }
    double period;
    if (os.tl.cut) {
      brief_from_run(&os, m, os.tl.makespan, out);
      out->cut = TRUE;
      one_shot_clear(&os);
      return TRUE;
    }
    if (sim_steady_period(sim_lowering_taskgraph(os.lo.lw), &os.tl, &st, &period)) {
      brief_from_run(&os, m, sim_steady_time(&st, os.tl.makespan, period), out);
      out->cut = out->time > bound;
      one_shot_clear(&os);
      return TRUE;
    }
    one_shot_clear(&os);
  }
  gboolean ok = one_shot_run(&os, g, m, s, cost, &opts, bound, 0, TRUE, &fv, error);
  if (ok) {
    brief_from_run(&os, m, os.tl.makespan, out);
    out->cut = os.tl.cut;
  }
  one_shot_clear(&os);
  return ok;
}
