/* cuda-backend.c — the CUDA back end of the executor: device memory, the operator
 * kernels of the GPU operator library in gpu/ (cuBLAS, cuDNN and own kernels, the same
 * the profiler measures), the optimizer, and timestamps from CUDA events.
 * Communication is in cuda-comm.c.
 *
 * A timestamp marks the point the device reaches when the next operation starts (or,
 * right after an operation, when that operation ends) on the stream that operation runs
 * on: a task's BEGIN and END thus bracket its work whether it runs on the compute stream
 * or the communication stream.  The first timestamp of a step records a base event and
 * waits for it, pairing it with the host's clock; the others are resolved against it at
 * synchronize, so every device's times share the host's time axis to within the wait. */
#include "cuda-private.h"

#include <string.h>

/* ---------------------------------------------------------------------------------- */
/* Helpers                                                                             */

PcuView cuda_view(const ExecView *v)
{
  PcuView p;
  memset(&p, 0, sizeof p);
  if (!v || !v->buffer)
    return p;
  p.dtype = v->dtype == SIM_DTYPE_INT64 ? PCU_I64 : PCU_F32;
  p.data = (char *)v->buffer->ptr + (size_t)v->offset * (size_t)pcu_dtype_size(p.dtype);
  p.ndim = v->box.ndim;
  for (int d = 0; d < v->box.ndim; d++) {
    p.lo[d] = v->box.lo[d];
    p.hi[d] = v->box.hi[d];
    p.stride[d] = v->stride[d];
  }
  return p;
}

PcuRegion cuda_region(const SimRegion *r)
{
  PcuRegion p;
  memset(&p, 0, sizeof p);
  p.ndim = r->ndim;
  for (int d = 0; d < r->ndim; d++) {
    p.lo[d] = r->lo[d];
    p.hi[d] = r->hi[d];
  }
  return p;
}

gboolean cuda_fail(GError **error, Cuda *c, int dev, PcuStatus s, const char *what)
{
  const char *msg = dev >= 0 && c->dev[dev].ctx ? pcu_context_error(c->dev[dev].ctx) : "";
  const char *kind = s == PCU_ERR_NO_MEMORY ? "out of device memory"
                     : s == PCU_ERR_UNSUPPORTED ? "not supported"
                     : s == PCU_ERR_NO_DEVICE ? "no usable GPU"
                     : s == PCU_ERR_NCCL ? "NCCL error"
                                              : "CUDA error";
  g_set_error(error, EXEC_ERROR, s == PCU_ERR_UNSUPPORTED ? EXEC_ERROR_UNSUPPORTED
                                                          : EXEC_ERROR_BACKEND,
              "device %d (GPU %d): %s: %s%s%s", dev, dev >= 0 ? c->dev[dev].gpu : -1, what,
              kind, *msg ? ": " : "", msg);
  return FALSE;
}

/* A failing CUDA runtime call in this file. */
static gboolean runtime_fail(GError **error, int dev, cudaError_t e, const char *call)
{
  g_set_error(error, EXEC_ERROR, EXEC_ERROR_BACKEND, "device %d: %s: %s (%s)", dev, call,
              cudaGetErrorName(e), cudaGetErrorString(e));
  return FALSE;
}

#define RT(dev, call)                                                                      \
  do {                                                                                     \
    cudaError_t e__ = (call);                                                              \
    if (e__ != cudaSuccess)                                                                \
      return runtime_fail(error, (dev), e__, #call);                                       \
  } while (0)

static cudaStream_t compute_stream(CudaDev *d)
{
  return (cudaStream_t)pcu_context_stream(d->ctx);
}

void cuda_wait_comm(CudaDev *d, ExecBuffer *buffer)
{
  if (buffer && buffer->comm_pending) {
    cudaStreamWaitEvent(compute_stream(d), buffer->comm_done, 0);
    buffer->comm_pending = FALSE;
  }
}

static cudaEvent_t take_event(CudaDev *d)
{
  cudaEvent_t e = NULL;
  if (d->spare->len) {
    e = g_array_index(d->spare, cudaEvent_t, d->spare->len - 1);
    g_array_set_size(d->spare, d->spare->len - 1);
    return e;
  }
  if (cudaEventCreate(&e) != cudaSuccess)
    return NULL;
  return e;
}

void cuda_bind_marks(CudaDev *d, cudaStream_t stream)
{
  for (guint i = 0; i < d->unbound->len; i++) {
    Mark m = { d->unbound->pdata[i], take_event(d) };
    if (m.event)
      cudaEventRecord(m.event, stream);
    g_array_append_val(d->marks, m);
  }
  g_ptr_array_set_size(d->unbound, 0);
  d->last_stream = stream;
  /* The operation about to run is the one a timestamp right after it ends. */
  d->after_op = TRUE;
}

gboolean cuda_enter(Cuda *c, int dev, const ExecView *views, int n, GError **error)
{
  CudaDev *d = &c->dev[dev];
  PcuStatus s = pcu_context_activate(d->ctx);
  if (s != PCU_OK)
    return cuda_fail(error, c, dev, s, "selecting the GPU");
  for (int i = 0; views && i < n; i++)
    cuda_wait_comm(d, views[i].buffer);
  cuda_bind_marks(d, compute_stream(d));
  return TRUE;
}

/* ---------------------------------------------------------------------------------- */
/* Opening                                                                             */

static void close_devices(Cuda *c)
{
  if (!c->dev)
    return;
  cuda_comm_close(c);
  for (int i = 0; i < c->n_devices; i++) {
    CudaDev *d = &c->dev[i];
    if (d->ctx)
      pcu_context_activate(d->ctx);
    if (d->base)
      cudaEventDestroy(d->base);
    for (guint k = 0; d->marks && k < d->marks->len; k++)
      cudaEventDestroy(g_array_index(d->marks, Mark, k).event);
    for (guint k = 0; d->spare && k < d->spare->len; k++)
      cudaEventDestroy(g_array_index(d->spare, cudaEvent_t, k));
    if (d->marks)
      g_array_unref(d->marks);
    if (d->spare)
      g_array_unref(d->spare);
    if (d->unbound)
      g_ptr_array_unref(d->unbound);
    pcu_context_free(d->comm);
    pcu_context_free(d->ctx);
  }
  g_clear_pointer(&c->dev, g_free);
}

static gboolean is_local(Cuda *c, int dev)
{
  return c->mode != CUDA_MODE_MPI || dev == c->rank;
}

static gboolean cuda_open(ExecBackend *self, int n_devices, GError **error)
{
  Cuda *c = cuda_of(self);
  close_devices(c);
  c->aborted = FALSE;
  c->n_devices = n_devices;
  if (c->world_size > 1) {
    c->mode = CUDA_MODE_MPI;
    if (n_devices != c->world_size) {
      g_set_error(error, EXEC_ERROR, EXEC_ERROR_UNSUPPORTED,
                  "the plan has %d devices but mpirun started %d processes; run one process "
                  "per device (mpirun -np %d)", n_devices, c->world_size, n_devices);
      return FALSE;
    }
  } else if (c->n_gpus >= n_devices && !g_getenv("PARASOL_CUDA_EMULATE")) {
    c->mode = CUDA_MODE_THREADS;
  } else {
    c->mode = CUDA_MODE_EMULATE;
    g_printerr("parasol: emulating %d devices on %d GPU%s: results are exact, times are not "
               "those of the plan\n", n_devices, c->n_gpus, c->n_gpus == 1 ? "" : "s");
  }
  c->dev = g_new0(CudaDev, n_devices);
  for (int i = 0; i < n_devices; i++) {
    CudaDev *d = &c->dev[i];
    d->gpu = c->mode == CUDA_MODE_MPI ? c->rank_gpu : i % c->n_gpus;
    if (!is_local(c, i))
      continue;
    char msg[1024] = "";
    d->ctx = pcu_context_new(d->gpu, 1, msg, sizeof msg);
    if (d->ctx && c->mode != CUDA_MODE_EMULATE && n_devices > 1)
      d->comm = pcu_context_new(d->gpu, 0, msg, sizeof msg);
    if (!d->ctx || (c->mode != CUDA_MODE_EMULATE && n_devices > 1 && !d->comm)) {
      g_set_error(error, EXEC_ERROR, EXEC_ERROR_BACKEND, "device %d (GPU %d): %s", i, d->gpu,
                  msg);
      close_devices(c);
      return FALSE;
    }
    d->marks = g_array_new(FALSE, FALSE, sizeof(Mark));
    d->spare = g_array_new(FALSE, FALSE, sizeof(cudaEvent_t));
    d->unbound = g_ptr_array_new();
    d->last_stream = compute_stream(d);
  }
  if (n_devices > 1 && !cuda_comm_open(c, error)) {
    close_devices(c);
    return FALSE;
  }
  return TRUE;
}

static int cuda_local_devices(ExecBackend *self, int *devices)
{
  Cuda *c = cuda_of(self);
  if (c->mode == CUDA_MODE_MPI) {
    devices[0] = c->rank;
    return 1;
  }
  for (int i = 0; i < c->n_devices; i++)
    devices[i] = i;
  return c->n_devices;
}

/* ---------------------------------------------------------------------------------- */
/* Memory                                                                              */

static ExecBuffer *cuda_buffer_alloc(ExecBackend *self, int dev, size_t bytes, GError **error)
{
  Cuda *c = cuda_of(self);
  if (!cuda_enter(c, dev, NULL, 0, error))
    return NULL;
  ExecBuffer *b = g_new0(ExecBuffer, 1);
  b->bytes = bytes;
  b->dev = dev;
  PcuStatus s = pcu_malloc(c->dev[dev].ctx, bytes, &b->ptr);
  if (s != PCU_OK) {
    g_free(b);
    g_autofree char *what = g_strdup_printf("allocating %zu bytes", bytes);
    cuda_fail(error, c, dev, s, what);
    return NULL;
  }
  cudaError_t e = cudaEventCreateWithFlags(&b->comm_done, cudaEventDisableTiming);
  if (e != cudaSuccess) {
    pcu_free(c->dev[dev].ctx, b->ptr);
    g_free(b);
    runtime_fail(error, dev, e, "cudaEventCreateWithFlags");
    return NULL;
  }
  return b;
}

static void cuda_buffer_free(ExecBackend *self, int dev, ExecBuffer *b)
{
  Cuda *c = cuda_of(self);
  CudaDev *d = &c->dev[dev];
  if (d->ctx && pcu_context_activate(d->ctx) == PCU_OK) {
    cuda_wait_comm(d, b);
    pcu_free(d->ctx, b->ptr);
  }
  cudaEventDestroy(b->comm_done);
  g_free(b);
}

static gboolean cuda_buffer_write(ExecBackend *self, int dev, ExecBuffer *b, size_t offset,
                                  const void *data, size_t bytes, GError **error)
{
  Cuda *c = cuda_of(self);
  g_return_val_if_fail(offset + bytes <= b->bytes, FALSE);
  ExecView v = { .buffer = b };
  if (!cuda_enter(c, dev, &v, 1, error))
    return FALSE;
  PcuStatus s = pcu_upload(c->dev[dev].ctx, (char *)b->ptr + offset, data, bytes);
  return s == PCU_OK || cuda_fail(error, c, dev, s, "writing a buffer");
}

static gboolean cuda_buffer_read(ExecBackend *self, int dev, ExecBuffer *b, size_t offset,
                                 void *data, size_t bytes, GError **error)
{
  Cuda *c = cuda_of(self);
  g_return_val_if_fail(offset + bytes <= b->bytes, FALSE);
  ExecView v = { .buffer = b };
  if (!cuda_enter(c, dev, &v, 1, error))
    return FALSE;
  PcuStatus s = pcu_download(c->dev[dev].ctx, data, (char *)b->ptr + offset, bytes);
  return s == PCU_OK || cuda_fail(error, c, dev, s, "reading a buffer");
}

static gboolean cuda_fill(ExecBackend *self, int dev, const ExecView *v, const SimRegion *r,
                          float value, GError **error)
{
  Cuda *c = cuda_of(self);
  if (!cuda_enter(c, dev, v, 1, error))
    return FALSE;
  PcuView pv = cuda_view(v);
  PcuRegion pr = cuda_region(r);
  PcuStatus s = pcu_fill(c->dev[dev].ctx, &pv, &pr, value);
  return s == PCU_OK || cuda_fail(error, c, dev, s, "filling a region");
}

static gboolean cuda_copy(ExecBackend *self, int dev, const ExecView *dst, const ExecView *src,
                          const SimRegion *r, gboolean accumulate, GError **error)
{
  Cuda *c = cuda_of(self);
  ExecView both[2] = { *dst, *src };
  if (!cuda_enter(c, dev, both, 2, error))
    return FALSE;
  PcuView d = cuda_view(dst), s = cuda_view(src);
  PcuRegion pr = cuda_region(r);
  PcuStatus st = pcu_copy(c->dev[dev].ctx, &d, &s, &pr, accumulate);
  return st == PCU_OK || cuda_fail(error, c, dev, st, "copying a region");
}

/* ---------------------------------------------------------------------------------- */
/* Kernels                                                                             */

static void wait_views(CudaDev *d, const ExecView *v, int n)
{
  for (int i = 0; v && i < n; i++)
    cuda_wait_comm(d, v[i].buffer);
}

static gboolean cuda_kernel(ExecBackend *self, int dev, const ExecKernelArgs *a, GError **error)
{
  Cuda *c = cuda_of(self);
  CudaDev *d = &c->dev[dev];
  if (!cuda_enter(c, dev, NULL, 0, error))
    return FALSE;
  wait_views(d, a->in, a->n_inputs);
  wait_views(d, a->in_grad, a->n_inputs);
  wait_views(d, a->w, a->n_weights);
  wait_views(d, a->w_grad, a->n_weights);
  wait_views(d, a->out, a->n_outputs);
  wait_views(d, a->out_grad, a->n_outputs);
  wait_views(d, a->stats, 1);
  wait_views(d, a->ring, 1);
  PcuOpArgs p;
  g_autoptr(GError) derr = NULL;
  if (!pcu_desc_init(&p, a->graph, a->op, a->lo, a->hi, PCU_F32, &derr)) {
    g_set_error(error, EXEC_ERROR, EXEC_ERROR_UNSUPPORTED, "device %d: %s", dev, derr->message);
    return FALSE;
  }
  switch (a->phase) {
  case EXEC_KERNEL_FORWARD: p.phase = PCU_FORWARD; break;
  case EXEC_KERNEL_BACKWARD: p.phase = PCU_BACKWARD; break;
  case EXEC_KERNEL_STATS_RESCALE: p.phase = PCU_STATS_RESCALE; break;
  case EXEC_KERNEL_STATS_FINISH: p.phase = PCU_STATS_FINISH; break;
  case EXEC_KERNEL_RING_BEGIN: p.phase = PCU_RING_BEGIN; break;
  case EXEC_KERNEL_RING_STEP: p.phase = PCU_RING_STEP; break;
  case EXEC_KERNEL_RING_END: p.phase = PCU_RING_END; break;
  case EXEC_KERNEL_RING_BACKWARD_BEGIN: p.phase = PCU_RING_BACKWARD_BEGIN; break;
  case EXEC_KERNEL_RING_BACKWARD_STEP: p.phase = PCU_RING_BACKWARD_STEP; break;
  case EXEC_KERNEL_RING_BACKWARD_END: p.phase = PCU_RING_BACKWARD_END; break;
  }
  if (a->ring && a->ring->buffer) {
    p.ring.v = cuda_view(a->ring);
    p.ring.region = cuda_region(&a->ring->box);
    p.ring_lo = a->ring_lo;
    p.ring_half = a->ring_half;
    p.ring_lo2 = a->ring_lo2;
    p.ring_q_lo = a->ring_q_lo;
    p.ring_q_lo2 = a->ring_q_lo2;
  }
  p.accumulate = a->accumulate;
  p.split_stats = a->split_stats;
  p.step = a->step;
  p.sample_offset = a->sample_offset;
  p.batch = a->batch;
  for (int i = 0; i < a->n_inputs; i++) {
    p.in[i].v = cuda_view(&a->in[i]);
    if (a->in_grad)
      p.in_grad[i].v = cuda_view(&a->in_grad[i]);
  }
  for (int i = 0; i < a->n_weights; i++) {
    p.w[i].v = cuda_view(&a->w[i]);
    if (a->w_grad)
      p.w_grad[i].v = cuda_view(&a->w_grad[i]);
  }
  for (int i = 0; i < a->n_outputs; i++) {
    if (a->out)
      p.out[i].v = cuda_view(&a->out[i]);
    if (a->out_grad)
      p.out_grad[i].v = cuda_view(&a->out_grad[i]);
  }
  if (a->stats && a->stats->buffer) {
    /* [planes] x the loss's rows of this shard. */
    p.stats.v = cuda_view(a->stats);
    PcuRegion rows = p.out[0].region;
    p.stats.region.ndim = rows.ndim + 1;
    p.stats.region.lo[0] = 0;
    p.stats.region.hi[0] = PCU_STATS_PLANES;
    for (int k = 0; k < rows.ndim; k++) {
      p.stats.region.lo[k + 1] = rows.lo[k];
      p.stats.region.hi[k + 1] = rows.hi[k];
    }
  }
  p.saved = (void **)a->saved;
  PcuStatus s = pcu_op_run(d->ctx, &p);
  if (s == PCU_OK)
    return TRUE;
  g_autofree char *what = g_strdup_printf("op '%s' (%s, %s)", sim_graph_op_name(a->graph, a->op),
                                          sim_op_type_name(sim_graph_op_type(a->graph, a->op)),
                                          a->phase == EXEC_KERNEL_BACKWARD ? "backward"
                                          : a->phase >= EXEC_KERNEL_RING_BEGIN ? "ring"
                                                                           : "forward");
  return cuda_fail(error, c, dev, s, what);
}

static gboolean cuda_update(ExecBackend *self, int dev, const ExecUpdateArgs *a, GError **error)
{
  Cuda *c = cuda_of(self);
  ExecView v[4] = { a->weight, a->grad, a->state1, a->state2 };
  if (!cuda_enter(c, dev, v, 4, error))
    return FALSE;
  PcuUpdateArgs u = {
    .adam = a->optimizer == SIM_OPTIMIZER_ADAM,
    .lr = a->lr,
    .momentum = a->momentum,
    .beta1 = a->beta1,
    .beta2 = a->beta2,
    .eps = a->eps,
    .weight_decay = a->weight_decay,
    .step = a->step,
    .weight = cuda_view(&a->weight),
    .grad = cuda_view(&a->grad),
    .state1 = cuda_view(&a->state1),
    .state2 = cuda_view(&a->state2),
    .region = cuda_region(&a->region),
    .part_lo = a->part_lo,
    .part_hi = a->part_hi,
  };
  PcuStatus s = pcu_update(c->dev[dev].ctx, &u);
  return s == PCU_OK || cuda_fail(error, c, dev, s, "the optimizer step");
}

static void cuda_saved_free(ExecBackend *self, int dev, gpointer saved)
{
  Cuda *c = cuda_of(self);
  CudaDev *d = &c->dev[dev];
  if (d->ctx && pcu_context_activate(d->ctx) == PCU_OK)
    pcu_saved_free(d->ctx, saved);
}

/* ---------------------------------------------------------------------------------- */
/* Time                                                                                */

static double host_now(void)
{
  return (double)g_get_monotonic_time() * 1e-6;
}

static void cuda_timestamp(ExecBackend *self, int dev, double *when)
{
  Cuda *c = cuda_of(self);
  CudaDev *d = &c->dev[dev];
  *when = -1;
  if (!d->ctx || pcu_context_activate(d->ctx) != PCU_OK)
    return;
  if (!d->based) {
    if (!d->base && cudaEventCreate(&d->base) != cudaSuccess)
      return;
    cudaEventRecord(d->base, compute_stream(d));
    cudaEventSynchronize(d->base);
    d->base_host = host_now();
    d->based = TRUE;
    d->after_op = FALSE;
    *when = d->base_host;
    return;
  }
  /* Right after an operation this ends it, on that operation's stream; otherwise it
   * waits to begin the next one. */
  if (d->after_op) {
    Mark m = { when, take_event(d) };
    if (m.event)
      cudaEventRecord(m.event, d->last_stream);
    g_array_append_val(d->marks, m);
    d->after_op = FALSE;
    return;
  }
  g_ptr_array_add(d->unbound, when);
}

static gboolean cuda_synchronize(ExecBackend *self, int dev, GError **error)
{
  Cuda *c = cuda_of(self);
  CudaDev *d = &c->dev[dev];
  if (!cuda_enter(c, dev, NULL, 0, error))
    return FALSE;
  cuda_bind_marks(d, d->last_stream ? d->last_stream : compute_stream(d));
  RT(dev, cudaStreamSynchronize(compute_stream(d)));
  if (d->comm)
    RT(dev, cudaStreamSynchronize((cudaStream_t)pcu_context_stream(d->comm)));
  for (guint i = 0; i < d->marks->len; i++) {
    Mark *m = &g_array_index(d->marks, Mark, i);
    float ms = 0;
    if (m->event && d->based && cudaEventElapsedTime(&ms, d->base, m->event) == cudaSuccess)
      *m->when = d->base_host + 1e-3 * (double)ms;
    if (m->event)
      g_array_append_val(d->spare, m->event);
  }
  g_array_set_size(d->marks, 0);
  d->based = FALSE;
  d->after_op = FALSE;
  return TRUE;
}

/* ---------------------------------------------------------------------------------- */
/* The class                                                                           */

static void cuda_abort(ExecBackend *self)
{
  Cuda *c = cuda_of(self);
  g_mutex_lock(&c->lock);
  c->aborted = TRUE;
  g_cond_broadcast(&c->cond);
  g_mutex_unlock(&c->lock);
  cuda_comm_abort(c);
}

static void cuda_finalize(ExecBackend *self)
{
  Cuda *c = cuda_of(self);
  close_devices(c);
  cuda_mpi_stop(c);
  g_hash_table_unref(c->groups);
  g_hash_table_unref(c->mail);
  g_hash_table_unref(c->meetings);
  g_mutex_clear(&c->lock);
  g_cond_clear(&c->cond);
  g_free(c);
}

static const ExecBackendClass cuda_class = {
  .api_version = EXEC_BACKEND_API_VERSION,
  .name = "cuda",
  .description = "CUDA GPUs: cuBLAS, cuDNN and own kernels, NCCL, one process per GPU under MPI",
  .open = cuda_open,
  .local_devices = cuda_local_devices,
  .buffer_alloc = cuda_buffer_alloc,
  .buffer_free = cuda_buffer_free,
  .buffer_write = cuda_buffer_write,
  .buffer_read = cuda_buffer_read,
  .fill = cuda_fill,
  .copy = cuda_copy,
  .kernel = cuda_kernel,
  .update = cuda_update,
  .send = cuda_send,
  .recv = cuda_recv,
  .all_reduce = cuda_all_reduce,
  .reduce_scatter = cuda_reduce_scatter,
  .all_gather = cuda_all_gather,
  .timestamp = cuda_timestamp,
  .synchronize = cuda_synchronize,
  .barrier = cuda_barrier,
  .abort = cuda_abort,
  .saved_free = cuda_saved_free,
  .finalize = cuda_finalize,
};

ExecBackend *exec_cuda_backend_new(GError **error)
{
  char msg[1024] = "";
  int n = pcu_device_count(msg, sizeof msg);
  if (n < 1) {
    g_set_error(error, EXEC_ERROR, EXEC_ERROR_BACKEND, "no usable GPU: %s",
                n < 0 ? msg : "cudaGetDeviceCount found none");
    return NULL;
  }
  Cuda *c = g_new0(Cuda, 1);
  c->n_gpus = n;
  g_mutex_init(&c->lock);
  g_cond_init(&c->cond);
  c->groups = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, cuda_comm_free_group);
  c->mail = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, cuda_comm_free_message);
  c->meetings = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free,
                                      cuda_comm_free_meeting);
  c->world_size = 1;
  GError *merr = NULL;
  if (!cuda_mpi_start(c, &merr) && merr) {
    g_propagate_error(error, merr);
    g_hash_table_unref(c->groups);
    g_hash_table_unref(c->mail);
    g_hash_table_unref(c->meetings);
    g_mutex_clear(&c->lock);
    g_cond_clear(&c->cond);
    g_free(c);
    return NULL;
  }
  ExecBackend *b = g_new0(ExecBackend, 1);
  b->klass = &cuda_class;
  b->priv = c;
  return b;
}
