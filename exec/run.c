/* run.c — training steps with a compiled plan: one thread per local device runs its
 * program, the devices meet before each step, and afterwards the measured times of every
 * task are gathered and the loss, weights and gradients read back as whole tensors. */
#include "exec-private.h"

#include <math.h>
#include <string.h>

struct _ExecRun {
  ExecBackend *backend;
  SimPlan *plan;
  ExecCompiled *c;
  int steps;
  double loss;
  double step_time;
  double *start, *end, *busy;
  /* The threads of a step meet here before starting. */
  GMutex lock;
  GCond cond;
  int arrived, generation, n_local;
  gboolean failed;
  GError *error;
};

typedef struct {
  ExecRun *run;
  int device;
} Worker;

/* Devices this process runs that have work: a plan may leave some of a machine idle. */
static gboolean active(const ExecCompiled *c, int d)
{
  return c->local[d] && c->programs[d].mops->len > 0;
}

ExecOptions exec_options_default(void)
{
  return (ExecOptions){ .lr = 0, .momentum = 0, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
                        .poison = TRUE, .seed = 1 };
}

ExecRun *exec_run_new(ExecBackend *b, SimPlan *plan, const ExecOptions *o, GError **error)
{
  g_return_val_if_fail(b != NULL && plan != NULL, NULL);
  ExecOptions opts = o ? *o : exec_options_default();
  ExecCompiled *c = exec_compile(b, plan, &opts, error);
  if (!c)
    return NULL;
  ExecRun *r = g_new0(ExecRun, 1);
  r->backend = b;
  r->plan = plan;
  r->c = c;
  int n = sim_plan_n_tasks(plan);
  r->start = g_new(double, MAX(n, 1));
  r->end = g_new(double, MAX(n, 1));
  r->busy = g_new0(double, MAX(n, 1));
  for (int i = 0; i < n; i++)
    r->start[i] = r->end[i] = -1;
  g_mutex_init(&r->lock);
  g_cond_init(&r->cond);
  for (int d = 0; d < c->n_devices; d++)
    r->n_local += active(c, d);
  return r;
}

void exec_run_free(ExecRun *r)
{
  if (!r)
    return;
  exec_compiled_free(r->c);
  g_free(r->start);
  g_free(r->end);
  g_free(r->busy);
  g_mutex_clear(&r->lock);
  g_cond_clear(&r->cond);
  g_clear_error(&r->error);
  g_free(r);
}

static void set_failed(ExecRun *r, GError *error)
{
  g_mutex_lock(&r->lock);
  gboolean first = !r->failed;
  r->failed = TRUE;
  if (first)
    r->error = error;
  else
    g_clear_error(&error);
  g_cond_broadcast(&r->cond);
  g_mutex_unlock(&r->lock);
  if (first)
    exec_backend_abort(r->backend);
}

/* The threads of this process meet; FALSE if another failed meanwhile. */
static gboolean local_barrier(ExecRun *r)
{
  g_mutex_lock(&r->lock);
  int gen = r->generation;
  if (++r->arrived == r->n_local) {
    r->arrived = 0;
    r->generation++;
    g_cond_broadcast(&r->cond);
  } else {
    while (gen == r->generation && !r->failed)
      g_cond_wait(&r->cond, &r->lock);
  }
  gboolean ok = !r->failed;
  g_mutex_unlock(&r->lock);
  return ok;
}

static gboolean write_inputs(ExecRun *r, int dev, GError **error)
{
  ExecCompiled *c = r->c;
  const SimGraph *g = c->g;
  for (guint k = 0; k < c->inputs->len; k++) {
    ExecBuf *b = c->inputs->pdata[k];
    if (b->device != dev)
      continue;
    SimShape full = sim_graph_tensor_shape(g, b->tensor);
    /* The dimensions the micro-batches divide: those whose extent the box's tensor has
     * fewer of than the whole one. */
    int sample[SIM_MAX_DIMS] = { 0 };
    int cons = sim_graph_tensor_consumer(g, b->tensor, 0);
    for (int i = 0; i < sim_graph_op_n_inputs(g, cons); i++)
      if (sim_graph_op_input(g, cons, i) == b->tensor) {
        SimShape mb = sim_plan_tensor_shape(c->plan, cons, SIM_TENSOR_INPUT, i);
        for (int d = 0; d < full.ndim; d++)
          sample[d] = mb.dims[d] != full.dims[d];
      }
    int64_t n = sim_region_volume(&b->box);
    size_t es = b->dtype == SIM_DTYPE_INT64 ? 8 : 4;
    g_autofree void *data = g_malloc(MAX((size_t)n * es, 8));
    exec_input_fill(g, b->tensor, &full, &b->box, sample, (int64_t)b->mb * (c->batch / c->M),
                    r->steps + 1, c->o.seed, b->dtype, data);
    if (!exec_backend_buffer_write(r->backend, dev, b->buffer, 0, data, (size_t)n * es, error))
      return FALSE;
  }
  return TRUE;
}

static gboolean run_mop(ExecRun *r, ExecProgram *p, ExecMop *m, int step, GError **error)
{
  ExecBackend *b = r->backend;
  int dev = p->device;
  switch (m->kind) {
  case EXEC_MOP_BEGIN:
    exec_backend_timestamp(b, dev, &p->times[2 * m->timing]);
    return TRUE;
  case EXEC_MOP_END:
    exec_backend_timestamp(b, dev, &p->times[2 * m->timing + 1]);
    return TRUE;
  case EXEC_MOP_FILL:
    return exec_backend_fill(b, dev, &m->a, &m->region, m->value, error);
  case EXEC_MOP_COPY:
    return exec_backend_copy(b, dev, &m->a, &m->b, &m->region, m->accumulate, error);
  case EXEC_MOP_KERNEL:
    m->kernel->step = step;
    return exec_backend_kernel(b, dev, m->kernel, error);
  case EXEC_MOP_UPDATE:
    m->update->step = step;
    return exec_backend_update(b, dev, m->update, error);
  case EXEC_MOP_SEND:
    return exec_backend_send(b, dev, m->peer, m->group.tag, &m->a, &m->region, error);
  case EXEC_MOP_RECV:
    return exec_backend_recv(b, dev, m->peer, m->group.tag, &m->a, &m->region, m->accumulate,
                             error);
  case EXEC_MOP_ALL_REDUCE:
    return exec_backend_all_reduce(b, dev, &m->group, &m->a, &m->region, m->reduce, error);
  case EXEC_MOP_REDUCE_SCATTER:
    return exec_backend_reduce_scatter(b, dev, &m->group, &m->a, &m->region, error);
  case EXEC_MOP_ALL_GATHER:
    return exec_backend_all_gather(b, dev, &m->group, &m->a, &m->region, error);
  }
  return TRUE;
}

static gpointer device_thread(gpointer data)
{
  Worker *w = data;
  ExecRun *r = w->run;
  ExecProgram *p = &r->c->programs[w->device];
  GError *error = NULL;
  int step = r->steps + 1;
  if (!write_inputs(r, w->device, &error)) {
    set_failed(r, error);
    return NULL;
  }
  if (!local_barrier(r))
    return NULL;
  exec_backend_barrier(r->backend, w->device);
  exec_backend_timestamp(r->backend, w->device, &p->t0);
  for (guint k = 0; k < p->mops->len; k++) {
    if (!run_mop(r, p, &g_array_index(p->mops, ExecMop, k), step, &error)) {
      set_failed(r, error);
      return NULL;
    }
  }
  if (!exec_backend_synchronize(r->backend, w->device, &error))
    set_failed(r, error);
  return NULL;
}

static double read_loss(ExecRun *r, GError **error);

gboolean exec_run_step(ExecRun *r, GError **error)
{
  ExecCompiled *c = r->c;
  g_clear_error(&r->error);
  r->failed = FALSE;
  r->arrived = 0;
  GPtrArray *threads = g_ptr_array_new();
  Worker *workers = g_new(Worker, c->n_devices);
  for (int d = 0; d < c->n_devices; d++) {
    if (!active(c, d))
      continue;
    workers[d] = (Worker){ r, d };
    g_autofree char *name = g_strdup_printf("exec-dev%d", d);
    g_ptr_array_add(threads, g_thread_new(name, device_thread, &workers[d]));
  }
  for (guint k = 0; k < threads->len; k++)
    g_thread_join(threads->pdata[k]);
  g_ptr_array_free(threads, TRUE);
  g_free(workers);
  /* Kernels' saved state lives for one step. */
  for (int d = 0; d < c->n_devices; d++) {
    ExecProgram *p = &c->programs[d];
    for (guint k = 0; k < p->saved->len; k++) {
      gpointer *slot = p->saved->pdata[k];
      exec_backend_saved_free(r->backend, d, *slot);
      *slot = NULL;
    }
  }
  if (r->failed) {
    g_propagate_error(error, r->error);
    r->error = NULL;
    return FALSE;
  }
  r->steps++;

  int n = sim_plan_n_tasks(r->plan);
  for (int i = 0; i < n; i++) {
    r->start[i] = r->end[i] = -1;
    r->busy[i] = 0;
  }
  double t0 = G_MAXDOUBLE, tend = 0;
  for (int d = 0; d < c->n_devices; d++)
    if (active(c, d))
      t0 = MIN(t0, c->programs[d].t0);
  /* A task that several devices take part in (a copy, a collective) starts when the last
   * of them arrives: the time a device waits for its peers is not the transfer's. */
  for (int d = 0; d < c->n_devices; d++) {
    ExecProgram *p = &c->programs[d];
    if (!active(c, d))
      continue;
    for (int k = 0; k < p->n_times; k++) {
      int task = g_array_index(p->time_task, int, k);
      double s = p->times[2 * k] - t0, e = p->times[2 * k + 1] - t0;
      r->start[task] = MAX(r->start[task], s);
      r->end[task] = MAX(r->end[task], e);
      tend = MAX(tend, e);
    }
  }
  for (int d = 0; d < c->n_devices; d++) {
    ExecProgram *p = &c->programs[d];
    if (!active(c, d))
      continue;
    for (int k = 0; k < p->n_times; k++) {
      int task = g_array_index(p->time_task, int, k);
      r->busy[task] += MAX(0.0, p->times[2 * k + 1] - t0 - r->start[task]);
    }
  }
  r->step_time = tend;
  GError *lerr = NULL;
  r->loss = read_loss(r, &lerr);
  if (lerr) {
    g_propagate_error(error, lerr);
    return FALSE;
  }
  return TRUE;
}

int exec_run_steps_done(const ExecRun *r)
{
  return r->steps;
}

double exec_run_loss(const ExecRun *r)
{
  return r->loss;
}

double exec_run_step_time(const ExecRun *r)
{
  return r->step_time;
}

const double *exec_run_task_start(const ExecRun *r)
{
  return r->start;
}

const double *exec_run_task_end(const ExecRun *r)
{
  return r->end;
}

const double *exec_run_task_busy(const ExecRun *r)
{
  return r->busy;
}

const ExecCompiled *exec_run_compiled(const ExecRun *r)
{
  return r->c;
}

SimPlan *exec_run_get_plan(const ExecRun *r)
{
  return r->plan;
}

/* ---- reading back ------------------------------------------------------------------------- */

/* Copies @region of buffer @b (fp32) into @out, a dense array over @dst_box. */
static gboolean read_region(ExecRun *r, const ExecBuf *b, const SimRegion *region,
                            const SimRegion *dst_box, float *out, int64_t plo, int64_t phi,
                            GError **error)
{
  int64_t n = sim_region_volume(&b->box);
  g_autofree float *data = g_new(float, MAX(n, 1));
  if (!exec_backend_buffer_read(r->backend, b->device, b->buffer, 0, data,
                                sizeof(float) * (size_t)n, error))
    return FALSE;
  ExecView src = exec_view_dense(b->buffer, SIM_DTYPE_FP32, &b->box);
  ExecView dst = exec_view_dense(NULL, SIM_DTYPE_FP32, dst_box);
  int64_t idx[SIM_MAX_DIMS];
  for (int d = 0; d < region->ndim; d++)
    idx[d] = region->lo[d];
  if (exec_region_is_empty(region))
    return TRUE;
  int64_t k = 0;
  do {
    if (k >= plo && k < phi)
      out[exec_view_offset(&dst, idx)] = data[exec_view_offset(&src, idx)];
    k++;
  } while (exec_region_next(region, idx));
  return TRUE;
}

static double read_loss(ExecRun *r, GError **error)
{
  ExecCompiled *c = r->c;
  double total = 0;
  for (guint k = 0; k < c->losses->len; k++) {
    const ExecLoss *l = &g_array_index(c->losses, ExecLoss, k);
    int n;
    const int *dev = sim_strategy_op_devices(c->s, l->op, &n);
    for (int mb = 0; mb < c->M; mb++) {
      SimShape shape = sim_plan_tensor_shape(c->plan, l->op, SIM_TENSOR_OUTPUT, 0);
      SimRegion full = sim_region_full(&shape);
      int64_t numel = sim_region_volume(&full);
      g_autofree float *vals = g_new(float, MAX(numel, 1));
      for (int64_t i = 0; i < numel; i++)
        vals[i] = NAN;
      /* Each region from the first shard holding it, read from the shards in reverse. */
      for (int sh = n - 1; sh >= 0; sh--) {
        if (!c->local[dev[sh]])
          continue;
        SimRegion reg;
        sim_plan_shard_region(c->plan, l->op, sh, SIM_TENSOR_OUTPUT, 0, &reg);
        ExecBuf *b = exec_compiled_buf(c, EXEC_BUF_VALUE, dev[sh], l->tensor, -1, 0, mb);
        if (b && !read_region(r, b, &reg, &full, vals, 0, G_MAXINT64, error))
          return NAN;
      }
      for (int64_t i = 0; i < numel; i++)
        total += (double)vals[i] * l->scale;
    }
  }
  return total;
}

static ExecWeightGroup *group_of_shard(ExecCompiled *c, int op, int sh)
{
  for (guint k = 0; k < c->groups->len; k++) {
    ExecWeightGroup *gr = &g_array_index(c->groups, ExecWeightGroup, k);
    if (gr->op != op)
      continue;
    for (int m = 0; m < gr->n; m++)
      if (gr->members[m] == sh)
        return gr;
  }
  return NULL;
}

static gboolean read_weight(ExecRun *r, int op, int i, ExecBufKind kind, float *out,
                            GError **error)
{
  ExecCompiled *c = r->c;
  g_return_val_if_fail(op >= 0 && op < c->n_ops, FALSE);
  int owner = sim_graph_op_weight_owner(c->g, op);
  g_return_val_if_fail(i >= (owner == op ? 0 : sim_graph_op_n_weights(c->g, owner)), FALSE);
  g_return_val_if_fail(i < sim_graph_op_n_weights(c->g, op), FALSE);
  SimShape shape = sim_graph_op_weight_shape(c->g, op, i);
  SimRegion full = sim_region_full(&shape);
  int64_t numel = sim_region_volume(&full);
  for (int64_t k = 0; k < numel; k++)
    out[k] = NAN;
  int n;
  const int *dev = sim_strategy_op_devices(c->s, op, &n);
  /* Shards in reverse, so that each region comes from the first shard holding it: the one
   * that adds a bias once where a reduction is split (parasol-exec.h).  Under ZeRO-1 each
   * device's part of a gradient comes from that device. */
  for (int sh = n - 1; sh >= 0; sh--) {
    int d = dev[sh];
    if (!c->local[d])
      continue;
    SimRegion reg;
    sim_plan_shard_region(c->plan, op, sh, SIM_TENSOR_WEIGHT, i, &reg);
    ExecBuf *b = exec_compiled_buf(c, kind, d, -1, op, i, -1);
    if (!b)
      continue;
    int64_t plo = 0, phi = G_MAXINT64;
    ExecWeightGroup *gr = group_of_shard(c, op, sh);
    if (gr && (kind == EXEC_BUF_WGRAD ? gr->sharded : gr->zero3)) {
      int k = 0;
      while (gr->devices[k] != d)
        k++;
      exec_part_range(sim_region_volume(&reg), gr->n_devices, k, &plo, &phi);
    }
    if (!read_region(r, b, &reg, &full, out, plo, phi, error))
      return FALSE;
  }
  return TRUE;
}

gboolean exec_run_read_weight(ExecRun *r, int op, int i, float *out, GError **error)
{
  return read_weight(r, op, i, EXEC_BUF_WEIGHT, out, error);
}

gboolean exec_run_read_grad(ExecRun *r, int op, int i, float *out, GError **error)
{
  return read_weight(r, op, i, EXEC_BUF_WGRAD, out, error);
}
