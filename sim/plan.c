/* plan.c — the lowered task graph with the meaning of each task, for executors.
 *
 * A plan is the lowering sim_simulate() runs, unfolded and with collectives as flows,
 * recorded with what every copy, reduction and synchronization moves.  The task ids are
 * those of the task graph, so an executor's measured times line up with the simulator's
 * timeline task by task (sim_plan_simulate) and can be written in the same trace format. */
#include "taskgraph.h"
#include "collective.h"
#include "lower.h"
#include "engine.h"
#include "report.h"

#include <math.h>

struct _SimPlan {
  const SimGraph *g;
  const SimMachine *m;
  SimStrategy *s;
  SimCostModel *cost;
  SimCostModel *own_cost;
  SimOptions o;
  SimCollParams cp;
  SimLowering *lw;
  SimTaskGraph *tg;
  const SimTaskSem **sem;   /* per task, or NULL */
  int32_t *reduce_src;      /* per task: for reductions, a compute task whose partial
                             * results it sums, else -1 */
  int32_t *copy_ops_off;    /* per task + 1: the ops a copy carries results of, in */
  int32_t *copy_ops;
};

/* A reduction's task is a join point (after the flows of its collective, if any), which
 * names neither the operator nor the micro-batch; both are those of the compute tasks
 * that precede it, found by walking back over the flows and join points in between.
 * A copy of gradients may carry the contributions of several consumers on its source
 * device (the lowering sends them once, summed), so it records every op among the
 * compute tasks it waits for, the same way. */
static void find_sources(SimPlan *p)
{
  const SimTaskGraph *tg = p->tg;
  int n = tg->n_tasks;
  p->reduce_src = g_new(int32_t, MAX(n, 1));
  p->copy_ops_off = g_new0(int32_t, (size_t)n + 1);
  GArray *copy_ops = g_array_new(FALSE, FALSE, sizeof(int32_t));
  int32_t *pred_off = g_new0(int32_t, (size_t)n + 1);
  for (int i = 0; i < n; i++)
    for (int k = 0; k < tg->task[i].n_succ; k++)
      pred_off[tg->succ[tg->task[i].succ_off + k] + 1]++;
  for (int i = 0; i < n; i++)
    pred_off[i + 1] += pred_off[i];
  int32_t *pred = g_new(int32_t, MAX(pred_off[n], 1));
  int32_t *fill = g_memdup2(pred_off, sizeof(int32_t) * (size_t)(n + 1));
  for (int i = 0; i < n; i++)
    for (int k = 0; k < tg->task[i].n_succ; k++)
      pred[fill[tg->succ[tg->task[i].succ_off + k]]++] = i;
  int32_t *seen = g_new0(int32_t, MAX(n, 1));
  GArray *queue = g_array_new(FALSE, FALSE, sizeof(int32_t));
  for (int i = 0; i < n; i++) {
    p->reduce_src[i] = -1;
    p->copy_ops_off[i + 1] = (int32_t)copy_ops->len;
    const SimTaskSem *m = p->sem[i];
    gboolean reduce = m && m->kind == SIM_SEM_REDUCE;
    gboolean copy = m && m->kind == SIM_SEM_COPY &&
                    (tg->task[i].kind == SIM_TASK_FLOW || tg->task[i].kind == SIM_TASK_NOP);
    if (!reduce && !copy)
      continue;
    guint first = copy_ops->len;
    g_array_set_size(queue, 0);
    g_array_append_val(queue, i);
    seen[i] = i + 1;
    for (guint q = 0; q < queue->len; q++) {
      int32_t t = g_array_index(queue, int32_t, q);
      for (int k = pred_off[t]; k < pred_off[t + 1]; k++) {
        int32_t u = pred[k];
        if (seen[u] == i + 1)
          continue;
        seen[u] = i + 1;
        if (tg->task[u].kind != SIM_TASK_COMPUTE) {
          g_array_append_val(queue, u);
          continue;
        }
        if (p->reduce_src[i] < 0)
          p->reduce_src[i] = u;
        gboolean dup = FALSE;
        for (guint j = first; j < copy_ops->len && !dup; j++)
          dup = g_array_index(copy_ops, int32_t, j) == tg->task[u].op;
        if (copy && !dup)
          g_array_append_val(copy_ops, tg->task[u].op);
      }
    }
    p->copy_ops_off[i + 1] = (int32_t)copy_ops->len;
  }
  p->copy_ops = (int32_t *)g_array_free(copy_ops, FALSE);
  g_array_free(queue, TRUE);
  g_free(seen);
  g_free(fill);
  g_free(pred);
  g_free(pred_off);
}

SimPlan *sim_plan_new(const SimGraph *g, const SimMachine *m, const SimStrategy *s,
                      SimCostModel *cost,
                      GError **error)
{
  if (!sim_strategy_validate(s, g, m, error))
    return NULL;
  SimPlan *p = g_new0(SimPlan, 1);
  p->g = g;
  p->m = m;
  p->s = sim_strategy_copy(s);
  if (!cost) {
    SimRooflineParams rp = sim_roofline_params_default();
    cost = p->own_cost = sim_cost_model_new_roofline(&rp);
  }
  p->cost = cost;
  p->o = sim_options_default();
  p->o.fold = FALSE;
  p->o.detail = SIM_DETAIL_FLOWS;
  p->cp = sim_coll_params_from_options(&p->o);
  p->lw = sim_lowering_new(g, m, p->s, cost, &p->o, &p->cp, NULL);
  sim_lowering_record_semantics(p->lw, TRUE);
  sim_lowering_build(p->lw);
  p->tg = sim_lowering_taskgraph(p->lw);
  sim_taskgraph_assemble(p->tg);
  p->sem = g_new0(const SimTaskSem *, MAX(p->tg->n_tasks, 1));
  for (guint b = 0; b < p->tg->blocks->len; b++) {
    SimTaskBlock *blk = p->tg->blocks->pdata[b];
    if (!blk->live)
      continue;
    for (guint k = 0; k < blk->sem->len; k++) {
      const SimTaskSem *m2 = &g_array_index(blk->sem, SimTaskSem, k);
      p->sem[blk->offset + m2->index] = m2;
    }
  }
  find_sources(p);
  return p;
}

void sim_plan_free(SimPlan *p)
{
  if (!p)
    return;
  sim_lowering_free(p->lw);
  sim_strategy_free(p->s);
  sim_cost_model_free(p->own_cost);
  g_free(p->sem);
  g_free(p->reduce_src);
  g_free(p->copy_ops_off);
  g_free(p->copy_ops);
  g_free(p);
}

int sim_plan_n_tasks(const SimPlan *p)
{
  return p->tg->n_tasks;
}

int sim_plan_n_devices(const SimPlan *p)
{
  return p->tg->n_devices;
}

int sim_plan_microbatches(const SimPlan *p)
{
  return p->s->microbatches > 0 ? p->s->microbatches : 1;
}

const SimStrategy *sim_plan_get_strategy(const SimPlan *p)
{
  return p->s;
}

const SimGraph *sim_plan_get_graph(const SimPlan *p)
{
  return p->g;
}

/* A copy of @m's region from out->device to out->peer, of out->bytes. */
static void copy_task(const SimPlan *p, int i, const SimTaskSem *m, SimPlanTask *out)
{
  out->kind = SIM_PLAN_COPY;
  out->n_ops = p->copy_ops_off[i + 1] - p->copy_ops_off[i];
  out->ops = p->copy_ops + p->copy_ops_off[i];
  out->tensor = m->tensor;
  out->grad = m->grad;
  out->relay = m->relay;
  out->region = m->region;
  double bw = sim_machine_bandwidth(p->m, out->device, out->peer);
  out->predicted = isfinite(bw) && bw > 0 ? out->bytes / bw : 0;
}

void sim_plan_task(const SimPlan *p, int i, SimPlanTask *out)
{
  g_return_if_fail(i >= 0 && i < p->tg->n_tasks);
  const SimTask *t = &p->tg->task[i];
  const SimTaskSem *m = p->sem[i];
  *out = (SimPlanTask){ .device = t->device, .peer = t->peer, .op = t->op, .shard = t->shard,
                        .mb = t->mb, .tensor = -1, .bytes = sim_task_bytes(t) };
  switch (t->kind) {
  case SIM_TASK_COMPUTE:
    out->kind = SIM_PLAN_COMPUTE;
    out->pass = t->cls == SIM_CLASS_BACKWARD ? SIM_PASS_BACKWARD
                : t->cls == SIM_CLASS_UPDATE ? SIM_PASS_UPDATE
                                             : SIM_PASS_FORWARD;
    out->recompute = t->cls == SIM_CLASS_RECOMPUTE;
    out->predicted = t->duration;
    return;
  case SIM_TASK_FLOW:
    if (m && m->kind == SIM_SEM_COPY)
      copy_task(p, i, m, out);
    else
      out->kind = SIM_PLAN_TIMING;
    return;
  case SIM_TASK_DELAY:
    out->kind = SIM_PLAN_TIMING;
    return;
  case SIM_TASK_NOP:
    out->kind = SIM_PLAN_JOIN;
    if (!m)
      return;
    if (m->kind == SIM_SEM_COPY) {
      /* A part of an all-gather (lower-tensors.c, deliver_gathers()): the collective's
       * flows time it, this join point says what moves from devs[0] to devs[1]. */
      out->device = m->devs[0];
      out->peer = m->devs[1];
      out->bytes = (double)sim_region_volume(&m->region) *
                   sim_dtype_size(sim_graph_tensor_get(p->g, m->tensor)->dtype);
      copy_task(p, i, m, out);
      return;
    }
    out->tensor = m->tensor;
    out->grad = m->grad;
    out->region = m->region;
    out->n_devices = m->n_devs;
    out->devices = m->devs;
    out->n_ops = m->n_ops;
    out->ops = m->ops;
    if (m->kind == SIM_SEM_REDUCE) {
      out->kind = SIM_PLAN_REDUCE;
      int src = p->reduce_src[i];
      if (src >= 0) {
        const SimTask *c = &p->tg->task[src];
        out->op = c->op;
        out->mb = c->mb;
        out->pass = c->cls == SIM_CLASS_BACKWARD ? SIM_PASS_BACKWARD : SIM_PASS_FORWARD;
        out->recompute = c->cls == SIM_CLASS_RECOMPUTE;
      }
    } else if (m->kind == SIM_SEM_SYNC) {
      out->kind = SIM_PLAN_SYNC;
      out->sharded = m->coll == SIM_COLL_REDUCE_SCATTER;
    } else if (m->kind == SIM_SEM_GATHER_PARAMS) {
      out->kind = SIM_PLAN_GATHER_PARAMS;
    }
    return;
  }
}

int sim_plan_n_predecessors(const SimPlan *p, int i)
{
  g_return_val_if_fail(i >= 0 && i < p->tg->n_tasks, 0);
  return p->tg->n_pred[i];
}

int sim_plan_n_successors(const SimPlan *p, int i)
{
  g_return_val_if_fail(i >= 0 && i < p->tg->n_tasks, 0);
  return p->tg->task[i].n_succ;
}

int sim_plan_successor(const SimPlan *p, int i, int k)
{
  g_return_val_if_fail(i >= 0 && i < p->tg->n_tasks, -1);
  g_return_val_if_fail(k >= 0 && k < p->tg->task[i].n_succ, -1);
  return p->tg->succ[p->tg->task[i].succ_off + k];
}

int sim_plan_stream_length(const SimPlan *p, int d)
{
  g_return_val_if_fail(d >= 0 && d < p->tg->n_devices, 0);
  return p->tg->stream_off[d + 1] - p->tg->stream_off[d];
}

int sim_plan_stream_task(const SimPlan *p, int d, int k)
{
  g_return_val_if_fail(d >= 0 && d < p->tg->n_devices, -1);
  g_return_val_if_fail(k >= 0 && k < sim_plan_stream_length(p, d), -1);
  return p->tg->stream[p->tg->stream_off[d] + k];
}

void sim_plan_shard_range(const SimPlan *p, int op, int shard, int64_t *lo, int64_t *hi)
{
  sim_lowering_shard_range(p->lw, op, shard, lo, hi);
}

void sim_plan_shard_region(const SimPlan *p, int op, int shard, SimTensorRole role, int i,
                           SimRegion *out)
{
  sim_lowering_shard_region(p->lw, op, shard, role, i, out);
}

int sim_plan_shard_copy(const SimPlan *p, int op, int shard)
{
  g_return_val_if_fail(op >= 0 && op < p->s->n_ops, 0);
  int reps = p->s->ops[op].replicas;
  return reps > 1 ? shard % reps : 0;
}

SimShape sim_plan_tensor_shape(const SimPlan *p, int op, SimTensorRole role, int i)
{
  return sim_lowering_tensor_shape(p->lw, op, role, i);
}

SimReport *sim_plan_simulate(SimPlan *p, GError **error)
{
  SimEngine *e = sim_engine_new(p->m, &p->cp);
  sim_engine_set_host_times(e, &p->o);
  SimTimeline tl = { 0 };
  sim_engine_run(e, p->tg, &tl);
  SimReport *r = NULL;
  if (tl.deadlock) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID, "the plan's schedule cannot run");
  } else {
    SimOptions o = p->o;
    o.keep_timeline = TRUE;
    r = sim_report_build(p->g, p->m, p->s, p->tg, &tl, NULL, "none", &o,
                         sim_lowering_model_flops(p->lw));
  }
  sim_timeline_clear(&tl);
  sim_engine_free(e);
  return r;
}

gboolean sim_plan_write_trace(const SimPlan *p, const double *start, const double *end,
                              const char *path, GError **error)
{
  /* A report holding the measured times in place of the simulated ones. */
  SimTimeline tl = { 0 };
  int n = p->tg->n_tasks;
  tl.start = g_memdup2(start, sizeof(double) * (size_t)MAX(n, 1));
  tl.end = g_memdup2(end, sizeof(double) * (size_t)MAX(n, 1));
  tl.crit = g_new(int32_t, MAX(n, 1));
  for (int i = 0; i < n; i++) {
    tl.crit[i] = -1;
    if (end[i] > tl.makespan)
      tl.makespan = end[i];
  }
  tl.peak_mem = g_new0(int64_t, p->tg->n_devices);
  int nl = sim_machine_n_links(p->m);
  tl.link_bytes = g_new0(double, MAX(nl, 1));
  SimOptions o = p->o;
  o.keep_timeline = TRUE;
  SimReport *r = sim_report_build(p->g, p->m, p->s, p->tg, &tl, NULL, "none", &o,
                                  sim_lowering_model_flops(p->lw));
  gboolean ok = sim_report_write_trace(r, path, error);
  sim_report_free(r);
  sim_timeline_clear(&tl);
  return ok;
}
