/* cuda-private.h — what the files of the CUDA back end share.
 *
 * Every logical device of a plan is a GPU context: its own compute stream with cuBLAS and
 * cuDNN handles on it (kernels, fills, copies, updates), and a communication stream on
 * which NCCL runs, so that gradient synchronization overlaps the backward pass where the
 * plan's order allows it.  Three modes place logical devices on GPUs:
 * - threads: this process runs every logical device, each on its own GPU, NCCL between
 *   them (one thread per device, as the driver runs them);
 * - mpi: one process per logical device (mpirun -np N), rank r on GPU r of its node,
 *   NCCL between them on one node or many;
 * - emulate: fewer GPUs than logical devices, so several share a GPU and communication is
 *   copies through device memory (correct results, meaningless times). */
#pragma once

#include "../exec-private.h"
#include "cuda-desc.h"
#include "parasol-config.h"

#include <cuda_runtime.h>
/* nccl.h declares a few functions without prototypes, (), which C17 warns about. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop

G_BEGIN_DECLS

typedef enum { CUDA_MODE_THREADS, CUDA_MODE_MPI, CUDA_MODE_EMULATE } CudaMode;

struct _ExecBuffer {
  void *ptr;
  size_t bytes;
  int dev;
  /* The last communication on this buffer, which compute must wait for. */
  cudaEvent_t comm_done;
  gboolean comm_pending;
};

/* A timestamp that waits for the operation it marks to know its stream. */
typedef struct {
  double *when;
  cudaEvent_t event;
} Mark;

typedef struct {
  int gpu;
  PcuContext *ctx;            /* compute stream, cuBLAS, cuDNN                            */
  PcuContext *comm;           /* communication stream (threads and mpi modes)             */
  cudaStream_t last_stream;   /* where the last operation went, for an END mark           */
  gboolean after_op;          /* nothing was timestamped since the last operation          */
  /* Timestamps of the current step: the base, recorded and waited for at the first
   * timestamp, and the marks since, resolved at synchronize. */
  gboolean based;
  cudaEvent_t base;
  double base_host;
  GArray *marks;              /* Mark, bound to a stream                                  */
  GPtrArray *unbound;         /* double*: marks waiting for the next operation             */
  GArray *spare;              /* cudaEvent_t to reuse                                     */
  ncclComm_t world;           /* the communicator of every logical device                */
} CudaDev;

typedef struct {
  CudaMode mode;
  int n_devices, n_gpus;
  int rank, world_size;       /* mpi mode                                                */
  int rank_gpu;               /* mpi mode: this process's GPU                            */
  gboolean mpi_started;       /* this back end called MPI_Init                            */
  CudaDev *dev;               /* n_devices entries; only local ones are set up             */
  GMutex lock;
  GCond cond;
  gboolean aborted;
  /* Communicators of device groups other than the whole: key -> CudaGroupComm. */
  GHashTable *groups;
  /* Emulation: messages by tag, meetings by tag. */
  GHashTable *mail;
  GHashTable *meetings;
} Cuda;

static inline Cuda *cuda_of(ExecBackend *b)
{
  return b->priv;
}

/* A view as the operator library takes it. */
PcuView cuda_view(const ExecView *v);
PcuRegion cuda_region(const SimRegion *r);

/* Sets a GError from a failed library call on device @dev. */
gboolean cuda_fail(GError **error, Cuda *c, int dev, PcuStatus s, const char *what);

/* Makes @dev's GPU current, orders its compute stream after communication on the
 * buffers of @views, and binds pending timestamps to the compute stream. */
gboolean cuda_enter(Cuda *c, int dev, const ExecView *views, int n, GError **error);

/* Orders: before compute on @dev touching @buffer, wait for communication on it. */
void cuda_wait_comm(CudaDev *d, ExecBuffer *buffer);
/* Binds pending timestamps to @stream, the stream of the operation about to run. */
void cuda_bind_marks(CudaDev *d, cudaStream_t stream);

/* cuda-comm.c: communication in the three modes. */
gboolean cuda_comm_open(Cuda *c, GError **error);
void cuda_comm_close(Cuda *c);
gboolean cuda_send(ExecBackend *self, int dev, int peer, int64_t tag, const ExecView *v,
                   const SimRegion *region, GError **error);
gboolean cuda_recv(ExecBackend *self, int dev, int peer, int64_t tag, const ExecView *v,
                   const SimRegion *region, gboolean accumulate, GError **error);
gboolean cuda_all_reduce(ExecBackend *self, int dev, const ExecGroup *group, const ExecView *v,
                         const SimRegion *region, ExecReduceOp op, GError **error);
gboolean cuda_reduce_scatter(ExecBackend *self, int dev, const ExecGroup *group,
                             const ExecView *v, const SimRegion *region, GError **error);
gboolean cuda_all_gather(ExecBackend *self, int dev, const ExecGroup *group, const ExecView *v,
                         const SimRegion *region, GError **error);
void cuda_barrier(ExecBackend *self, int dev);
void cuda_comm_abort(Cuda *c);
/* Destructors of the tables cuda-comm.c keeps in Cuda. */
void cuda_comm_free_group(gpointer p);
void cuda_comm_free_message(gpointer p);
void cuda_comm_free_meeting(gpointer p);

/* MPI (cuda-comm.c): whether this process was started by mpirun with several ranks, in
 * which case MPI is initialized and @rank and @size are set. */
gboolean cuda_mpi_start(Cuda *c, GError **error);
void cuda_mpi_stop(Cuda *c);

G_END_DECLS
