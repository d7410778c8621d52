/* cuda-comm.c — communication of the CUDA back end.
 *
 * With a GPU per logical device (threads and mpi modes) every transfer is NCCL's: the
 * region is packed into a contiguous buffer on the device's communication stream, which
 * first waits for everything the compute stream queued before the call, NCCL moves or
 * reduces it, and the result is unpacked into the view; the buffer then remembers an
 * event that compute waits for before it touches the buffer again.  Point-to-point
 * transfers use the communicator of all devices; collectives over a subset of the
 * devices get a communicator of their own, made the first time the subset meets.
 *
 * In emulation several logical devices share a GPU, and a transfer is a copy: a send
 * leaves its packed region in device memory under its tag for the receiver; a collective
 * meets under its tag, the last member to arrive reduces every member's packed region
 * and the members unpack the result, as the CPU back end does with host memory. */
#include "cuda-private.h"

#include <string.h>

#if PARASOL_HAVE_MPI
#include <mpi.h>
#endif

/* ---------------------------------------------------------------------------------- */
/* Errors                                                                              */

static gboolean runtime_fail(GError **error, int dev, cudaError_t e, const char *call)
{
  g_set_error(error, EXEC_ERROR, EXEC_ERROR_BACKEND, "device %d: %s: %s (%s)", dev, call,
              cudaGetErrorName(e), cudaGetErrorString(e));
  return FALSE;
}

static gboolean nccl_fail(GError **error, int dev, ncclResult_t r, ncclComm_t comm,
                          const char *call)
{
  const char *last = ncclGetLastError(comm);
  g_set_error(error, EXEC_ERROR, EXEC_ERROR_BACKEND, "device %d: %s: NCCL error: %s%s%s", dev,
              call, ncclGetErrorString(r), last && *last ? ": " : "", last ? last : "");
  return FALSE;
}

#define RT(dev, call)                                                                      \
  do {                                                                                     \
    cudaError_t e__ = (call);                                                              \
    if (e__ != cudaSuccess)                                                                \
      return runtime_fail(error, (dev), e__, #call);                                       \
  } while (0)

#define NC(dev, comm, call)                                                                \
  do {                                                                                     \
    ncclResult_t r__ = (call);                                                             \
    if (r__ != ncclSuccess)                                                                \
      return nccl_fail(error, (dev), r__, (comm), #call);                                  \
  } while (0)

#define PC(c, dev, call, what)                                                             \
  do {                                                                                     \
    PcuStatus s__ = (call);                                                                \
    if (s__ != PCU_OK)                                                                     \
      return cuda_fail(error, (c), (dev), s__, (what));                                    \
  } while (0)

static gboolean aborted_error(GError **error)
{
  g_set_error_literal(error, EXEC_ERROR, EXEC_ERROR_BACKEND,
                      "communication cancelled: another device failed");
  return FALSE;
}

/* ---------------------------------------------------------------------------------- */
/* MPI                                                                                 */

gboolean cuda_mpi_start(Cuda *c, GError **error)
{
#if PARASOL_HAVE_MPI
  /* Started by mpirun (Open MPI, MPICH, Slurm's PMI) with more than one process. */
  const char *size = g_getenv("OMPI_COMM_WORLD_SIZE");
  if (!size)
    size = g_getenv("PMI_SIZE");
  if (!size)
    size = g_getenv("PMIX_SIZE");
  if (!size || atoi(size) <= 1)
    return FALSE;
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    /* The driver runs the device in a thread of its own, besides the main thread. */
    int provided = 0;
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
      g_set_error(error, EXEC_ERROR, EXEC_ERROR_BACKEND, "MPI_Init_thread failed");
      return FALSE;
    }
    c->mpi_started = TRUE;
    if (provided < MPI_THREAD_SERIALIZED) {
      g_set_error(error, EXEC_ERROR, EXEC_ERROR_BACKEND,
                  "this MPI supports only single-threaded programs; the executor calls MPI "
                  "from a device thread (MPI_THREAD_SERIALIZED or better is needed)");
      return FALSE;
    }
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
  MPI_Comm_size(MPI_COMM_WORLD, &c->world_size);
  /* Rank r takes GPU (its rank among the ranks of its node) modulo the node's GPUs. */
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &node);
  int local = 0;
  MPI_Comm_rank(node, &local);
  MPI_Comm_free(&node);
  c->rank_gpu = local % MAX(c->n_gpus, 1);
  return TRUE;
#else
  return FALSE;
#endif
}

void cuda_mpi_stop(Cuda *c)
{
#if PARASOL_HAVE_MPI
  if (c->mpi_started) {
    int done = 0;
    MPI_Finalized(&done);
    if (!done)
      MPI_Finalize();
    c->mpi_started = FALSE;
  }
#endif
}

void cuda_barrier(ExecBackend *self, int dev)
{
#if PARASOL_HAVE_MPI
  Cuda *c = cuda_of(self);
  if (c->mode == CUDA_MODE_MPI)
    MPI_Barrier(MPI_COMM_WORLD);
#endif
}

/* ---------------------------------------------------------------------------------- */
/* Communicators                                                                       */

typedef struct {
  ncclUniqueId id;
  gboolean have_id;
  int n_devices;
  ncclComm_t *comms;          /* per logical device                                      */
} GroupComm;

void cuda_comm_free_group(gpointer p)
{
  GroupComm *g = p;
  for (int i = 0; i < g->n_devices; i++)
    if (g->comms[i])
      ncclCommDestroy(g->comms[i]);
  g_free(g->comms);
  g_free(g);
}

gboolean cuda_comm_open(Cuda *c, GError **error)
{
  if (c->mode == CUDA_MODE_EMULATE)
    return TRUE;
  if (c->mode == CUDA_MODE_THREADS) {
    int n = c->n_devices;
    g_autofree ncclComm_t *comms = g_new0(ncclComm_t, n);
    g_autofree int *gpus = g_new(int, n);
    for (int i = 0; i < n; i++)
      gpus[i] = c->dev[i].gpu;
    NC(-1, NULL, ncclCommInitAll(comms, n, gpus));
    for (int i = 0; i < n; i++)
      c->dev[i].world = comms[i];
    return TRUE;
  }
#if PARASOL_HAVE_MPI
  ncclUniqueId id;
  if (c->rank == 0)
    NC(c->rank, NULL, ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  CudaDev *d = &c->dev[c->rank];
  RT(c->rank, cudaSetDevice(d->gpu));
  NC(c->rank, NULL, ncclCommInitRank(&d->world, c->world_size, id, c->rank));
  return TRUE;
#else
  return TRUE;
#endif
}

void cuda_comm_close(Cuda *c)
{
  g_hash_table_remove_all(c->groups);
  g_hash_table_remove_all(c->mail);
  g_hash_table_remove_all(c->meetings);
  for (int i = 0; c->dev && i < c->n_devices; i++)
    if (c->dev[i].world) {
      ncclCommDestroy(c->dev[i].world);
      c->dev[i].world = NULL;
    }
}

void cuda_comm_abort(Cuda *c)
{
  /* Aborting a communicator unblocks the GPU work waiting in it; the run is over. */
  g_mutex_lock(&c->lock);
  GHashTableIter it;
  gpointer value;
  g_hash_table_iter_init(&it, c->groups);
  while (g_hash_table_iter_next(&it, NULL, &value)) {
    GroupComm *g = value;
    for (int i = 0; i < g->n_devices; i++)
      if (g->comms[i]) {
        ncclCommAbort(g->comms[i]);
        g->comms[i] = NULL;
      }
  }
  for (int i = 0; c->dev && i < c->n_devices; i++)
    if (c->dev[i].world) {
      ncclCommAbort(c->dev[i].world);
      c->dev[i].world = NULL;
    }
  g_mutex_unlock(&c->lock);
}

static gboolean is_world(Cuda *c, const ExecGroup *g)
{
  if (g->n != c->n_devices)
    return FALSE;
  for (int k = 0; k < g->n; k++)
    if (g->devices[k] != k)
      return FALSE;
  return TRUE;
}

/* The communicator of @g for @dev, made the first time: its members' ranks are their
 * places in @g, so NCCL's parts are the group's parts. */
static gboolean group_comm(Cuda *c, int dev, const ExecGroup *g, ncclComm_t *out,
                           GError **error)
{
  if (is_world(c, g)) {
    *out = c->dev[dev].world;
    if (!*out)
      return aborted_error(error);
    return TRUE;
  }
  GString *key = g_string_new(NULL);
  for (int k = 0; k < g->n; k++)
    g_string_append_printf(key, "%s%d", k ? "," : "", g->devices[k]);
  g_mutex_lock(&c->lock);
  GroupComm *gc = g_hash_table_lookup(c->groups, key->str);
  if (!gc) {
    gc = g_new0(GroupComm, 1);
    gc->n_devices = c->n_devices;
    gc->comms = g_new0(ncclComm_t, c->n_devices);
    g_hash_table_insert(c->groups, g_strdup(key->str), gc);
  }
  g_string_free(key, TRUE);
  if (gc->comms[dev]) {
    *out = gc->comms[dev];
    g_mutex_unlock(&c->lock);
    return TRUE;
  }
  ncclUniqueId id;
  if (c->mode == CUDA_MODE_THREADS) {
    if (!gc->have_id) {
      ncclResult_t r = ncclGetUniqueId(&gc->id);
      if (r != ncclSuccess) {
        g_mutex_unlock(&c->lock);
        return nccl_fail(error, dev, r, NULL, "ncclGetUniqueId");
      }
      gc->have_id = TRUE;
    }
    id = gc->id;
    g_mutex_unlock(&c->lock);
  } else {
    g_mutex_unlock(&c->lock);
#if PARASOL_HAVE_MPI
    /* The group's first member makes the id and hands it to the others; every pair
     * exchanges ids in the order its groups first meet, the same on both sides. */
    if (g->rank == 0) {
      NC(dev, NULL, ncclGetUniqueId(&id));
      for (int k = 1; k < g->n; k++)
        MPI_Send(&id, sizeof id, MPI_BYTE, g->devices[k], 7, MPI_COMM_WORLD);
    } else {
      MPI_Recv(&id, sizeof id, MPI_BYTE, g->devices[0], 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
#else
    memset(&id, 0, sizeof id);
#endif
  }
  ncclComm_t comm = NULL;
  RT(dev, cudaSetDevice(c->dev[dev].gpu));
  NC(dev, NULL, ncclCommInitRank(&comm, g->n, id, g->rank));
  g_mutex_lock(&c->lock);
  gc->comms[dev] = comm;
  g_mutex_unlock(&c->lock);
  *out = comm;
  return TRUE;
}

/* ---------------------------------------------------------------------------------- */
/* NCCL transfers                                                                      */

static cudaStream_t stream_of(PcuContext *ctx)
{
  return (cudaStream_t)pcu_context_stream(ctx);
}

/* Starts a communication on @dev: the communication stream waits for what compute has
 * queued, and pending timestamps mark its start. */
static gboolean comm_begin(Cuda *c, int dev, GError **error)
{
  CudaDev *d = &c->dev[dev];
  PC(c, dev, pcu_context_activate(d->ctx), "selecting the GPU");
  cudaEvent_t e;
  RT(dev, cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  cudaError_t r = cudaEventRecord(e, stream_of(d->ctx));
  if (r == cudaSuccess)
    r = cudaStreamWaitEvent(stream_of(d->comm), e, 0);
  cudaEventDestroy(e);
  if (r != cudaSuccess)
    return runtime_fail(error, dev, r, "ordering communication after compute");
  cuda_bind_marks(d, stream_of(d->comm));
  return TRUE;
}

/* Ends it: compute waits for it before touching @v's buffer again. */
static gboolean comm_end(Cuda *c, int dev, const ExecView *v, GError **error)
{
  CudaDev *d = &c->dev[dev];
  RT(dev, cudaEventRecord(v->buffer->comm_done, stream_of(d->comm)));
  v->buffer->comm_pending = TRUE;
  return TRUE;
}

/* @region of @v packed into a new contiguous fp32 buffer on @ctx's stream. */
static gboolean pack(Cuda *c, int dev, PcuContext *ctx, const ExecView *v, const SimRegion *r,
                     float **out, GError **error)
{
  PcuRegion pr = cuda_region(r);
  int64_t n = sim_region_volume(r);
  void *p = NULL;
  PC(c, dev, pcu_malloc(ctx, (size_t)MAX(n, 1) * sizeof(float), &p), "staging a transfer");
  *out = p;
  PcuView dv = pcu_view_dense(p, PCU_F32, &pr), sv = cuda_view(v);
  PC(c, dev, pcu_copy(ctx, &dv, &sv, &pr, 0), "packing a region");
  return TRUE;
}

static gboolean unpack(Cuda *c, int dev, PcuContext *ctx, const ExecView *v, const SimRegion *r,
                       float *p, gboolean accumulate, GError **error)
{
  PcuRegion pr = cuda_region(r);
  PcuView sv = pcu_view_dense(p, PCU_F32, &pr), dv = cuda_view(v);
  PC(c, dev, pcu_copy(ctx, &dv, &sv, &pr, accumulate), "unpacking a region");
  return TRUE;
}

typedef enum { COLL_ALL_REDUCE, COLL_REDUCE_SCATTER, COLL_ALL_GATHER } CollKind;

static gboolean nccl_collective(Cuda *c, int dev, const ExecGroup *g, const ExecView *v,
                                const SimRegion *r, CollKind kind, ExecReduceOp op,
                                GError **error)
{
  CudaDev *d = &c->dev[dev];
  ncclComm_t comm = NULL;
  if (!group_comm(c, dev, g, &comm, error) || !comm_begin(c, dev, error))
    return FALSE;
  int64_t n = sim_region_volume(r);
  float *buf = NULL;
  if (!pack(c, dev, d->comm, v, r, &buf, error))
    return FALSE;
  cudaStream_t s = stream_of(d->comm);
  int64_t lo, hi;
  exec_part_range(n, g->n, g->rank, &lo, &hi);
  gboolean equal = n % g->n == 0;
  ncclRedOp_t rop = op == EXEC_REDUCE_MAX ? ncclMax : ncclSum;
  ncclResult_t res;
  if (kind == COLL_REDUCE_SCATTER && equal) {
    /* In place: rank k's part is where NCCL leaves its share. */
    res = ncclReduceScatter(buf, buf + lo, (size_t)(n / g->n), ncclFloat, ncclSum, comm, s);
  } else if (kind == COLL_ALL_GATHER && equal) {
    res = ncclAllGather(buf + lo, buf, (size_t)(n / g->n), ncclFloat, comm, s);
  } else {
    /* Unequal parts: an all-reduce gives every part everywhere; for a gather, of a
     * buffer that holds only the member's own part. */
    cudaError_t e = cudaSuccess;
    if (kind == COLL_ALL_GATHER) {
      e = cudaMemsetAsync(buf, 0, (size_t)lo * sizeof(float), s);
      if (e == cudaSuccess)
        e = cudaMemsetAsync(buf + hi, 0, (size_t)(n - hi) * sizeof(float), s);
    }
    if (e != cudaSuccess) {
      pcu_free(d->comm, buf);
      return runtime_fail(error, dev, e, "cudaMemsetAsync");
    }
    res = ncclAllReduce(buf, buf, (size_t)n, ncclFloat, kind == COLL_ALL_REDUCE ? rop : ncclSum,
                        comm, s);
  }
  if (res != ncclSuccess) {
    pcu_free(d->comm, buf);
    return nccl_fail(error, dev, res, comm, "collective");
  }
  gboolean ok = unpack(c, dev, d->comm, v, r, buf, FALSE, error);
  pcu_free(d->comm, buf);
  return ok && comm_end(c, dev, v, error);
}

/* ---------------------------------------------------------------------------------- */
/* Emulation                                                                           */

typedef struct {
  float *ptr;
  int gpu;
} Message;

void cuda_comm_free_message(gpointer p)
{
  Message *m = p;
  if (m->ptr) {
    cudaSetDevice(m->gpu);
    cudaFree(m->ptr);
  }
  g_free(m);
}

typedef struct {
  int n, arrived, left;
  float **ptr;
  int *gpu;
  float *result;
  int result_gpu;
  gboolean done, failed;
} Meeting;

void cuda_comm_free_meeting(gpointer p)
{
  Meeting *m = p;
  if (m->result) {
    cudaSetDevice(m->result_gpu);
    cudaFree(m->result);
  }
  g_free(m->ptr);
  g_free(m->gpu);
  g_free(m);
}

static int64_t *tag_key(int64_t tag)
{
  int64_t *k = g_new(int64_t, 1);
  *k = tag;
  return k;
}

/* @region of @v copied into new device memory of its GPU (not stream-ordered, since
 * another thread reads and frees it), complete when this returns. */
static gboolean stage(Cuda *c, int dev, const ExecView *v, const SimRegion *r, float **out,
                      GError **error)
{
  CudaDev *d = &c->dev[dev];
  int64_t n = sim_region_volume(r);
  RT(dev, cudaMalloc((void **)out, (size_t)MAX(n, 1) * sizeof(float)));
  PcuRegion pr = cuda_region(r);
  PcuView dv = pcu_view_dense(*out, PCU_F32, &pr), sv = cuda_view(v);
  PcuStatus s = pcu_copy(d->ctx, &dv, &sv, &pr, 0);
  if (s == PCU_OK)
    s = pcu_synchronize(d->ctx);
  if (s != PCU_OK) {
    cudaFree(*out);
    *out = NULL;
    return cuda_fail(error, c, dev, s, "staging a transfer");
  }
  return TRUE;
}

/* Copies @n floats from @src on GPU @src_gpu into a new buffer on @dev's GPU and unpacks
 * them into @region of @v. */
static gboolean land(Cuda *c, int dev, const ExecView *v, const SimRegion *r, const float *src,
                     int src_gpu, gboolean accumulate, GError **error)
{
  CudaDev *d = &c->dev[dev];
  int64_t n = sim_region_volume(r);
  float *mine = NULL;
  RT(dev, cudaMalloc((void **)&mine, (size_t)MAX(n, 1) * sizeof(float)));
  cudaError_t e = cudaMemcpyPeerAsync(mine, d->gpu, src, src_gpu, (size_t)n * sizeof(float),
                                      stream_of(d->ctx));
  gboolean ok = e == cudaSuccess || runtime_fail(error, dev, e, "cudaMemcpyPeerAsync");
  if (ok)
    ok = unpack(c, dev, d->ctx, v, r, mine, accumulate, error);
  PcuStatus s = pcu_synchronize(d->ctx);
  if (ok && s != PCU_OK)
    ok = cuda_fail(error, c, dev, s, "receiving a transfer");
  cudaFree(mine);
  return ok;
}

static gboolean emulated_send(Cuda *c, int dev, int64_t tag, const ExecView *v,
                              const SimRegion *r, GError **error)
{
  Message *m = g_new0(Message, 1);
  m->gpu = c->dev[dev].gpu;
  if (!stage(c, dev, v, r, &m->ptr, error)) {
    g_free(m);
    return FALSE;
  }
  g_mutex_lock(&c->lock);
  g_hash_table_insert(c->mail, tag_key(tag), m);
  g_cond_broadcast(&c->cond);
  g_mutex_unlock(&c->lock);
  return TRUE;
}

static gboolean emulated_recv(Cuda *c, int dev, int64_t tag, const ExecView *v,
                              const SimRegion *r, gboolean accumulate, GError **error)
{
  g_mutex_lock(&c->lock);
  Message *m;
  while (!(m = g_hash_table_lookup(c->mail, &tag)) && !c->aborted)
    g_cond_wait(&c->cond, &c->lock);
  if (!m) {
    g_mutex_unlock(&c->lock);
    return aborted_error(error);
  }
  gpointer key;
  g_hash_table_steal_extended(c->mail, &tag, &key, NULL);
  g_mutex_unlock(&c->lock);
  g_free(key);
  gboolean ok = land(c, dev, v, r, m->ptr, m->gpu, accumulate, error);
  cuda_comm_free_message(m);
  cudaSetDevice(c->dev[dev].gpu);
  return ok;
}

/* The last member to arrive combines every member's staged region on its GPU. */
static gboolean meeting_work(Cuda *c, int dev, Meeting *m, int64_t n, CollKind kind,
                             ExecReduceOp op, GError **error)
{
  CudaDev *d = &c->dev[dev];
  size_t bytes = (size_t)MAX(n, 1) * sizeof(float);
  m->result_gpu = d->gpu;
  RT(dev, cudaMalloc((void **)&m->result, bytes));
  if (kind == COLL_ALL_GATHER) {
    for (int k = 0; k < m->n; k++) {
      int64_t lo, hi;
      exec_part_range(n, m->n, k, &lo, &hi);
      RT(dev, cudaMemcpyPeer(m->result + lo, d->gpu, m->ptr[k] + lo, m->gpu[k],
                             (size_t)(hi - lo) * sizeof(float)));
    }
    return TRUE;
  }
  RT(dev, cudaMemcpyPeer(m->result, d->gpu, m->ptr[0], m->gpu[0], (size_t)n * sizeof(float)));
  float *tmp = NULL;
  RT(dev, cudaMalloc((void **)&tmp, bytes));
  gboolean ok = TRUE;
  for (int k = 1; ok && k < m->n; k++) {
    cudaError_t e = cudaMemcpyPeer(tmp, d->gpu, m->ptr[k], m->gpu[k], (size_t)n * sizeof(float));
    if (e != cudaSuccess) {
      ok = runtime_fail(error, dev, e, "cudaMemcpyPeer");
      break;
    }
    PcuStatus s = pcu_combine(d->ctx, m->result, tmp, n, op == EXEC_REDUCE_MAX);
    if (s == PCU_OK)
      s = pcu_synchronize(d->ctx);
    if (s != PCU_OK)
      ok = cuda_fail(error, c, dev, s, "reducing a collective");
  }
  cudaFree(tmp);
  return ok;
}

static gboolean emulated_collective(Cuda *c, int dev, const ExecGroup *g, const ExecView *v,
                                    const SimRegion *r, CollKind kind, ExecReduceOp op,
                                    GError **error)
{
  CudaDev *d = &c->dev[dev];
  float *mine = NULL;
  if (!stage(c, dev, v, r, &mine, error))
    return FALSE;
  int64_t n = sim_region_volume(r);
  g_mutex_lock(&c->lock);
  Meeting *m = g_hash_table_lookup(c->meetings, &g->tag);
  if (!m) {
    m = g_new0(Meeting, 1);
    m->n = m->left = g->n;
    m->ptr = g_new0(float *, g->n);
    m->gpu = g_new0(int, g->n);
    g_hash_table_insert(c->meetings, tag_key(g->tag), m);
  }
  m->ptr[g->rank] = mine;
  m->gpu[g->rank] = d->gpu;
  GError *werr = NULL;
  if (++m->arrived == m->n) {
    /* The members wait under the lock; their staged regions stay until they leave. */
    m->failed = !meeting_work(c, dev, m, n, kind, op, &werr);
    m->done = TRUE;
    g_cond_broadcast(&c->cond);
  } else {
    while (!m->done && !c->aborted)
      g_cond_wait(&c->cond, &c->lock);
  }
  gboolean ok = m->done && !m->failed;
  float *result = m->result;
  int result_gpu = m->result_gpu;
  g_mutex_unlock(&c->lock);
  if (ok)
    ok = land(c, dev, v, r, result, result_gpu, FALSE, error);
  else if (werr)
    g_propagate_error(error, g_steal_pointer(&werr));
  else
    aborted_error(error);
  g_clear_error(&werr);
  g_mutex_lock(&c->lock);
  if (--m->left == 0)
    g_hash_table_remove(c->meetings, &g->tag);
  g_mutex_unlock(&c->lock);
  cudaSetDevice(d->gpu);
  cudaFree(mine);
  return ok;
}

/* ---------------------------------------------------------------------------------- */
/* The slots                                                                           */

gboolean cuda_send(ExecBackend *self, int dev, int peer, int64_t tag, const ExecView *v,
                   const SimRegion *region, GError **error)
{
  Cuda *c = cuda_of(self);
  if (sim_region_volume(region) == 0)
    return TRUE;
  if (c->mode == CUDA_MODE_EMULATE)
    return cuda_enter(c, dev, v, 1, error) && emulated_send(c, dev, tag, v, region, error);
  CudaDev *d = &c->dev[dev];
  if (!comm_begin(c, dev, error))
    return FALSE;
  float *buf = NULL;
  if (!pack(c, dev, d->comm, v, region, &buf, error))
    return FALSE;
  ncclResult_t r = ncclSend(buf, (size_t)sim_region_volume(region), ncclFloat, peer, d->world,
                            stream_of(d->comm));
  pcu_free(d->comm, buf);
  if (r != ncclSuccess)
    return nccl_fail(error, dev, r, d->world, "ncclSend");
  return comm_end(c, dev, v, error);
}

gboolean cuda_recv(ExecBackend *self, int dev, int peer, int64_t tag, const ExecView *v,
                   const SimRegion *region, gboolean accumulate, GError **error)
{
  Cuda *c = cuda_of(self);
  if (sim_region_volume(region) == 0)
    return TRUE;
  if (c->mode == CUDA_MODE_EMULATE)
    return cuda_enter(c, dev, v, 1, error) &&
           emulated_recv(c, dev, tag, v, region, accumulate, error);
  CudaDev *d = &c->dev[dev];
  if (!comm_begin(c, dev, error))
    return FALSE;
  int64_t n = sim_region_volume(region);
  void *buf = NULL;
  PC(c, dev, pcu_malloc(d->comm, (size_t)n * sizeof(float), &buf), "staging a transfer");
  ncclResult_t r = ncclRecv(buf, (size_t)n, ncclFloat, peer, d->world, stream_of(d->comm));
  if (r != ncclSuccess) {
    pcu_free(d->comm, buf);
    return nccl_fail(error, dev, r, d->world, "ncclRecv");
  }
  gboolean ok = unpack(c, dev, d->comm, v, region, buf, accumulate, error);
  pcu_free(d->comm, buf);
  return ok && comm_end(c, dev, v, error);
}

static gboolean collective(ExecBackend *self, int dev, const ExecGroup *g, const ExecView *v,
                           const SimRegion *r, CollKind kind, ExecReduceOp op, GError **error)
{
  Cuda *c = cuda_of(self);
  if (g->n <= 1 || sim_region_volume(r) == 0)
    return TRUE;
  if (c->mode == CUDA_MODE_EMULATE)
    return cuda_enter(c, dev, v, 1, error) &&
           emulated_collective(c, dev, g, v, r, kind, op, error);
  return nccl_collective(c, dev, g, v, r, kind, op, error);
}

gboolean cuda_all_reduce(ExecBackend *self, int dev, const ExecGroup *group, const ExecView *v,
                         const SimRegion *region, ExecReduceOp op, GError **error)
{
  return collective(self, dev, group, v, region, COLL_ALL_REDUCE, op, error);
}

gboolean cuda_reduce_scatter(ExecBackend *self, int dev, const ExecGroup *group,
                             const ExecView *v, const SimRegion *region, GError **error)
{
  return collective(self, dev, group, v, region, COLL_REDUCE_SCATTER, EXEC_REDUCE_SUM, error);
}

gboolean cuda_all_gather(ExecBackend *self, int dev, const ExecGroup *group, const ExecView *v,
                         const SimRegion *region, GError **error)
{
  return collective(self, dev, group, v, region, COLL_ALL_GATHER, EXEC_REDUCE_SUM, error);
}
