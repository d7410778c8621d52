/* exec-private.h — the executor's internals shared by the files of libexec: the compiled
 * form of a plan (one program of micro-operations per device, the buffers they use) and
 * the entry points of the built-in back ends.  Nothing outside exec/ includes it. */
#pragma once

#include "parasol-exec.h"

G_BEGIN_DECLS

/* The built-in back ends. */
ExecBackend *exec_cpu_backend_new(GError **error);
#ifdef EXEC_HAVE_CUDA
ExecBackend *exec_cuda_backend_new(GError **error);
#endif

/* ---------------------------------------------------------------------------------- */
/* Buffers of a compiled plan                                                           */

/* What a buffer holds on its device. */
typedef enum {
  EXEC_BUF_VALUE,    /* a tensor's values in one micro-batch                          */
  EXEC_BUF_GRAD,     /* the gradient its producer's shards read (summed contributions)  */
  EXEC_BUF_CONTRIB,  /* one consumer op's contributions to a tensor's gradient          */
  EXEC_BUF_STATS,    /* cross entropy statistics (EXEC_STATS_PLANES planes)             */
  EXEC_BUF_STAGE,    /* the sum of several consumers' contributions that one copy sends */
  EXEC_BUF_WEIGHT,
  EXEC_BUF_WGRAD,
  EXEC_BUF_STATE1,   /* optimizer states                                             */
  EXEC_BUF_STATE2,
  EXEC_BUF_RING,     /* ring attention's blocks and rows (exec/compile-ring.c)            */
} ExecBufKind;

typedef struct {
  ExecBufKind kind;
  int device;
  int tensor;        /* activations: the tensor; weights: -1                           */
  int op;            /* contributions: the consumer; stats: the op; weights: the holder */
  int index;         /* weights: the weight's index                                    */
  int mb;            /* activations: the micro-batch; weights: -1                       */
  SimDType dtype;
  SimRegion box;
  ExecBuffer *buffer;
} ExecBuf;

/* ---------------------------------------------------------------------------------- */
/* Programs                                                                            */

typedef enum {
  EXEC_MOP_BEGIN,          /* timestamp: a task starts on this device                  */
  EXEC_MOP_END,            /* timestamp: it ends                                       */
  EXEC_MOP_FILL,
  EXEC_MOP_COPY,
  EXEC_MOP_KERNEL,
  EXEC_MOP_UPDATE,
  EXEC_MOP_SEND,
  EXEC_MOP_RECV,
  EXEC_MOP_ALL_REDUCE,
  EXEC_MOP_REDUCE_SCATTER,
  EXEC_MOP_ALL_GATHER,
} ExecMopKind;

/* One micro-operation of a device's program: a call of one back-end slot. */
typedef struct {
  ExecMopKind kind;
  int timing;              /* BEGIN, END: the slot in ExecProgram.times                 */
  gboolean accumulate;     /* COPY, RECV                                               */
  ExecReduceOp reduce;     /* ALL_REDUCE                                               */
  float value;             /* FILL                                                     */
  int peer;                /* SEND, RECV                                               */
  ExecView a, b;           /* FILL, SEND, RECV, collectives: a; COPY: a = dst, b = src  */
  SimRegion region;
  ExecGroup group;         /* collectives (devices point into the compiled plan)         */
  ExecKernelArgs *kernel;  /* KERNEL: arrays owned by the compiled plan                  */
  ExecUpdateArgs *update;  /* UPDATE                                                   */
} ExecMop;

typedef struct {
  int device;
  GArray *mops;            /* ExecMop                                                  */
  /* Timestamps of the tasks this device takes part in: slot k of times is
   * (task_of[k], begin or end). */
  int n_times;
  GArray *time_task;       /* int: the task of each BEGIN/END pair                      */
  double *times;           /* 2 * n_times: begin, end                                   */
  double t0;               /* the device's clock at the step's start                    */
  GPtrArray *saved;        /* gpointer*: kernel saved-state slots, freed after a step    */
} ExecProgram;

/* Per (owner or copy-holding op, weight) and device: what the update covers. */
typedef struct {
  int holder;              /* the op whose buffers these are                            */
  int weight;
  int device;
  ExecBuf *w, *g, *s1, *s2;
} ExecWeightSlot;

/* A group of shards of an op that hold the same weight region (and are the same copy):
 * their gradients are summed over the group's devices. */
typedef struct {
  int op;
  int *members;            /* shards                                                   */
  int n;
  int *devices;            /* distinct, in shard order                                 */
  int n_devices;
  gboolean sharded;        /* synchronized by reduce-scatter (ZeRO-1)                  */
  gboolean synced;         /* a synchronization of the plan covers it                   */
  gboolean gathered;       /* ... and, when sharded, a gathering of the weights           */
  /* ZeRO-3: each device keeps only its part of the weights between steps and of the
   * gradients after each reduce-scatter; the plan gathers the weights before every
   * micro-batch's forward and backward and reduce-scatters after every backward. */
  gboolean zero3;
  int n_syncs, n_gathers;  /* ZeRO-3: the plan's synchronizations and gathers so far      */
} ExecWeightGroup;

/* A loss tensor: consumed by nothing, produced by cross entropy or MSE. */
typedef struct {
  int tensor;
  int op;
  double scale;            /* 1 / elements of the whole tensor                          */
} ExecLoss;

typedef struct _ExecCompiled ExecCompiled;

struct _ExecCompiled {
  SimPlan *plan;
  const SimGraph *g;
  const SimStrategy *s;
  ExecBackend *backend;
  int n_devices, M, n_ops, n_tensors;
  int64_t batch;
  ExecOptions o;
  SimOptimizer optimizer;
  int n_tasks;
  ExecProgram *programs;   /* n_devices (only local devices get mops)                    */
  gboolean *local;         /* n_devices                                                */
  GPtrArray *bufs;         /* ExecBuf*, every buffer of every device                     */
  GHashTable *buf_index;   /* key -> ExecBuf*                                           */
  GArray *slots;           /* ExecWeightSlot                                           */
  GArray *groups;          /* ExecWeightGroup                                          */
  GArray *losses;          /* ExecLoss                                                 */
  GPtrArray *owned;        /* memory of kernel and update arguments, group device lists  */
  /* Input data: per local device, the value buffers of graph inputs to fill each step. */
  GPtrArray *inputs;       /* ExecBuf*                                                  */
};

/* compile.c */
ExecCompiled *exec_compile(ExecBackend *b, SimPlan *plan, const ExecOptions *o,
                           GError **error);
void exec_compiled_free(ExecCompiled *c);
/* The buffer of @kind for (@tensor or @op, @index, @mb) on @device, or NULL. */
ExecBuf *exec_compiled_buf(const ExecCompiled *c, ExecBufKind kind, int device, int tensor,
                           int op, int index, int mb);

/* run.c: the compiled plan of a run. */
const ExecCompiled *exec_run_compiled(const ExecRun *r);

/* data.c: deterministic initial values. */
/* Fills @n elements of @out for the box @box of weight @i of op @owner (in the owner's
 * coordinates). */
void exec_weight_init(const SimGraph *g, int owner, int i, const SimRegion *box, uint64_t seed,
                      float *out);
/* The value of element @flat (row-major in the whole tensor) of graph input tensor @t. */
void exec_input_fill(const SimGraph *g, int t, const SimShape *full, const SimRegion *box,
                     const int *sample_dims, int64_t sample_offset, int step, uint64_t seed,
                     SimDType dtype, void *out);
/* The largest valid integer + 1 for integer input @t (vocabularies, classes), or 0. */
int64_t exec_input_int_range(const SimGraph *g, int t);

/* Region helpers. */
gboolean exec_region_is_empty(const SimRegion *r);
void exec_region_hull(SimRegion *acc, const SimRegion *r);
/* Iterates the points of @r in row-major order: starts at lo; returns FALSE past the end. */
gboolean exec_region_next(const SimRegion *r, int64_t *idx);

G_END_DECLS
