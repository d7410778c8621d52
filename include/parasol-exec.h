/* parasol-exec.h — the public interface of libexec: running a plan for real.
 *
 * The simulator predicts how long the task graph of a plan (sim_plan_new) takes; the
 * executor runs the same task graph with real data, so the two can be compared task by
 * task (docs/architecture.md, "The flow").  It has two parts:
 *
 * - A back-end interface, ExecBackend: a struct of function pointers (docs/extending.md) that
 *   allocates buffers on simulated devices, runs the kernel of any operator of the
 *   catalogue forwards and backwards on one shard, applies the optimizer, and moves data
 *   between devices (point-to-point, all-reduce, reduce-scatter, all-gather).  The CPU
 *   reference back end ("cpu") computes in fp32 with one thread per simulated device and
 *   moves data by copies; the CUDA back end ("cuda", when built) uses cuBLAS, cuDNN and
 *   NCCL.  Back ends register by name.
 *
 * - A driver, ExecRun: it compiles a plan into one program per device — the device's
 *   compute tasks in its stream order, interleaved with its part of every copy, reduction
 *   and synchronization, all taken from one order of the whole task graph so that no
 *   device can wait for another that waits for it — and runs training steps with it,
 *   recording when every task started and ended.  Afterwards it reads back the loss, the
 *   weights and their gradients as whole tensors, whatever the strategy split them into.
 *
 * Data model.  Every device holds, for each tensor it touches and each micro-batch, one
 * buffer of the tensor's values and buffers of its gradient; each buffer covers a box of
 * the tensor in micro-batch coordinates (sim_plan_shard_region) — the bounding box of what
 * the device's shards read or write — so kernels index tensors by their coordinates in
 * the micro-batch, never by a shard-local numbering.  Weights live once per device and
 * operator (the operator owning them, sim_graph_op_weight_owner) over the box of the
 * regions its shards on that device use, with gradient and optimizer-state buffers of the
 * same box.  Floating-point data are fp32 whatever the graph's dtype; integer tensors
 * (token ids, labels) are int64.
 *
 * Semantics a back end implements (the kernels of one operator, ExecKernelArgs):
 * - Forward writes the shard's output region.  Where the shard's iteration range splits a
 *   dimension that does not index an output (a split reduction), the output holds a
 *   partial sum: args->accumulate is TRUE and the kernel adds into the output, which the
 *   driver zeroed; the driver then sums the partial outputs over devices.
 * - Biases of such ops (linear over a split k, conv2d over a split cin, attention's output
 *   projection over split heads) are added, and their gradients taken, only by the shards
 *   whose range along those dimensions starts at 0, so that the sum counts them once.
 * - Backward ADDS the shard's gradient contributions into args->in_grad and args->w_grad
 *   (the driver zeroes them when it must); where an input is read by several shards (a
 *   convolution's halo rows, a replicated weight) the contributions are summed.  It takes
 *   what it needs from the inputs, the weights and its saved state (args->saved), not
 *   from the outputs: a recomputed partial output is not summed again.
 * - An op that shares another's weights (sim_graph_share_weights) sees them through a
 *   view in its own coordinates: as they are for equal shapes, with swapped strides for a
 *   transposed shape (a language model's output layer [hidden, vocab] reading the
 *   embedding table [vocab, hidden]), as a reshape of the whole tensor otherwise.
 * - The loss of a step is the mean over the elements of every loss tensor: the gradient
 *   flowing into a loss tensor is 1 / its number of elements (in the whole batch).
 * - Cross entropy over split classes cannot sum partial losses: its forward then merges
 *   the shard's per-row statistics (max logit, sum of exponentials relative to it, logit
 *   of the label) into args->stats, and the driver combines them over devices with
 *   EXEC_KERNEL_STATS_RESCALE and EXEC_KERNEL_STATS_FINISH between an all-reduce of the
 *   maxima and one of the sums (Megatron's vocabulary-parallel cross entropy).
 * - Batch normalization over a split batch or split positions normalizes with the
 *   statistics of the shard's own samples, as frameworks do without synchronized batch
 *   norm: such a plan computes something else than one device does.
 * - Ring attention (context parallelism): a self-attention shard whose keys and values
 *   are read at its own positions only runs as a ring of the shards that split the
 *   positions (the same samples and heads).  The driver calls RING_BEGIN, then for each
 *   of the n members' blocks RING_STEP (passing the block to the next member and
 *   receiving the previous member's between steps), then RING_END; the backward likewise,
 *   the blocks carrying their dK and dV along until they are back with the member that
 *   computed them (n passes).  Queries, softmax statistics and partial outputs stay in
 *   the shard's saved state between the calls.  Where each member's positions split in
 *   two equal chunks, the ring runs Megatron's load-balanced layout: the sequence cut
 *   into 2 n chunks, member r computes the queries, keys and values of chunks r and
 *   2 n - 1 - r, so that under a causal mask every member does the same work.  The plan
 *   gives member r the contiguous positions of chunks 2 r and 2 r + 1, so the driver
 *   moves the attention's input rows to the member that computes them before RING_BEGIN
 *   (and before RING_BACKWARD_BEGIN, with the output gradients), and the outputs (and
 *   the input gradients) back after RING_END (and RING_BACKWARD_END); the kernels read
 *   and write those rows in buffers of the driver's, in the layout's order (ring_half).
 * - Random numbers (dropout masks) are functions of the operator's name, the element's
 *   index in the whole batch and the step (exec_hash_uniform), so that every strategy
 *   drops the same elements.
 */
#pragma once

#include "parasol-sim.h"

G_BEGIN_DECLS

#define EXEC_PUBLIC __attribute__((visibility("default")))

/* ---------------------------------------------------------------------------------- */
/* Errors                                                                              */

#define EXEC_ERROR (exec_error_quark())
typedef enum {
  EXEC_ERROR_UNKNOWN,      /* no back end of that name                                 */
  EXEC_ERROR_UNSUPPORTED,  /* a plan or operator the back end cannot run exactly         */
  EXEC_ERROR_BACKEND,      /* a back end failed (allocation, a library call, a peer)     */
  EXEC_ERROR_MISMATCH,     /* a run differs from its reference beyond the tolerance      */
} ExecErrorCode;
EXEC_PUBLIC GQuark exec_error_quark(void);

/* ---------------------------------------------------------------------------------- */
/* Buffers and views                                                                   */

/* The most iteration dimensions an operator has (the catalogue's limit). */
#define EXEC_MAX_ITER 8

/* A back end's memory on one device; the back end defines the struct. */
typedef struct _ExecBuffer ExecBuffer;

/* A tensor, or part of one, in a buffer: element @idx (in the tensor's coordinates, inside
 * @box) is at element offset + sum over d of (idx[d] - box.lo[d]) * stride[d] of the
 * buffer.  Views made by the driver are dense and row-major, except the view of a weight
 * that an operator shares with another in transposed form (a language model's output
 * layer reading the embedding table), whose strides are swapped. */
typedef struct {
  ExecBuffer *buffer;      /* NULL: no such tensor (no gradient of integer inputs)      */
  SimDType dtype;          /* SIM_DTYPE_FP32 or SIM_DTYPE_INT64                         */
  SimRegion box;
  int64_t stride[SIM_MAX_DIMS];
  int64_t offset;
} ExecView;

/* A dense row-major view of @box in @buffer. */
EXEC_PUBLIC ExecView exec_view_dense(ExecBuffer *buffer, SimDType dtype, const SimRegion *box);
/* Elements the view's box covers. */
EXEC_PUBLIC int64_t exec_view_numel(const ExecView *v);
/* The element offset of @idx (a point inside the box) in the buffer. */
EXEC_PUBLIC int64_t exec_view_offset(const ExecView *v, const int64_t *idx);

/* ---------------------------------------------------------------------------------- */
/* Kernels                                                                             */

typedef enum {
  EXEC_KERNEL_FORWARD,        /* outputs from inputs and weights (also recomputation)     */
  EXEC_KERNEL_BACKWARD,       /* input and weight gradients from output gradients          */
  /* Cross entropy over split classes, after the maxima of args->stats were all-reduced:
   * rescale this device's sums of exponentials to the global maxima. */
  EXEC_KERNEL_STATS_RESCALE,
  /* ... and after the sums were all-reduced: write the loss from the statistics. */
  EXEC_KERNEL_STATS_FINISH,
  /* Ring attention (context parallelism: a self-attention shard that reads only its own
   * positions of the keys and values, see "Ring attention" below). */
  EXEC_KERNEL_RING_BEGIN,     /* own K and V into the block; queries, empty accumulators   */
  EXEC_KERNEL_RING_STEP,      /* the queries against the block held: online softmax       */
  EXEC_KERNEL_RING_END,       /* normalize, output projection                              */
  EXEC_KERNEL_RING_BACKWARD_BEGIN, /* own K and V again, dK = dV = 0; output projection's
                                    * backward                                           */
  EXEC_KERNEL_RING_BACKWARD_STEP,  /* dQ, and the block's dK and dV, from the block held  */
  EXEC_KERNEL_RING_BACKWARD_END,   /* the projections' backward from dQ and the returned
                                    * block's dK and dV                                   */
} ExecKernelPhase;

/* Planes of a ring attention block (ExecKernelArgs.ring): a view whose box is
 * [EXEC_RING_PLANES, samples, positions, key-value heads, head_dim] of the shard, every
 * dimension from 0 (the block's positions start at ring_lo in the sequence). */
enum {
  EXEC_RING_K,                /* keys, after the rotary embedding                          */
  EXEC_RING_V,
  EXEC_RING_DK,               /* backward: the block's gradients, summed along the ring    */
  EXEC_RING_DV,
  EXEC_RING_PLANES
};

/* Planes of the statistics of cross entropy over split classes: a view whose box is
 * [EXEC_STATS_PLANES] x (the loss tensor's box), each plane one number per row. */
enum {
  EXEC_STATS_LOCAL_MAX,       /* this device's maximum logit                               */
  EXEC_STATS_MAX,             /* the maximum over all devices (after the all-reduce)        */
  EXEC_STATS_SUM,             /* sum of exp(logit - max) (local max, then global)           */
  EXEC_STATS_LABEL,           /* the logit of the label where this device holds it, else 0  */
  EXEC_STATS_PLANES
};

/* One kernel call: operator @op of @graph on one shard and micro-batch.  Tensors are
 * given as views over the device's buffers, in micro-batch coordinates for activations
 * and in the operator's own weight coordinates for weights. */
typedef struct {
  const SimGraph *graph;
  int op;
  ExecKernelPhase phase;
  int shard, mb;
  int step;                   /* 1 for the first training step                            */
  /* The shard's iteration range, micro-batch coordinates (sim_plan_shard_range). */
  int64_t lo[EXEC_MAX_ITER], hi[EXEC_MAX_ITER];
  /* The whole batch, and the index in it of this micro-batch's first sample: sample s of
   * the micro-batch is sample sample_offset + s of the batch. */
  int64_t batch, sample_offset;
  int microbatches;           /* the micro-batches a step's batch is divided into           */
  /* FORWARD: add into the outputs (partial sums of a split reduction).  For cross
   * entropy: merge per-row statistics into @stats instead of writing the loss. */
  gboolean accumulate;
  /* BACKWARD of cross entropy over split classes: the probabilities come from @stats. */
  gboolean split_stats;
  int n_inputs;
  const ExecView *in;         /* values of the inputs                                      */
  const ExecView *in_grad;    /* BACKWARD: add input gradients here (buffer NULL: none)     */
  int n_weights;
  const ExecView *w;
  const ExecView *w_grad;     /* BACKWARD: add weight gradients here                        */
  int n_outputs;
  const ExecView *out;
  const ExecView *out_grad;   /* BACKWARD: the gradients of the outputs                     */
  const ExecView *stats;      /* cross entropy over split classes, else NULL                */
  /* State the back end may keep from a forward pass for the backward pass of the same
   * shard and micro-batch (masks, statistics, cuDNN reserve space): NULL at first; the
   * driver hands the same pointer to both and releases it with the saved_free slot. */
  gpointer *saved;
  /* Ring attention phases: the block this device holds now, and the sequence position of
   * its first key (the positions of the ring member that computed it). */
  const ExecView *ring;
  int64_t ring_lo;
  /* Megatron's two-chunk layout (ring_half > 0, see "Ring attention" above): the shard's
   * rows and the block's are two chunks of ring_half positions each, the shard's own at
   * positions ring_q_lo and ring_q_lo2, the block's at ring_lo and ring_lo2.  With
   * ring_half 0 both are contiguous, the shard's from lo[1]. */
  int64_t ring_half, ring_lo2, ring_q_lo, ring_q_lo2;
} ExecKernelArgs;

/* One optimizer step on a region of a weight. */
typedef struct {
  SimOptimizer optimizer;
  double lr;
  double momentum;            /* SGD                                                      */
  double beta1, beta2, eps;   /* Adam                                                      */
  double weight_decay;
  int step;                   /* 1 for the first step (Adam's bias correction)              */
  ExecView weight, grad;
  ExecView state1, state2;    /* momentum, or Adam's first and second moments; same layout  */
  SimRegion region;
  /* The elements of @region to update, as a range of its row-major element order: all of
   * it, or under sharded optimizer states (ZeRO-1) this device's part. */
  int64_t part_lo, part_hi;
} ExecUpdateArgs;

/* ---------------------------------------------------------------------------------- */
/* Communication                                                                       */

/* The devices of one collective, as every participant sees it. */
typedef struct {
  int n;
  const int *devices;         /* in ring order; the same array on every participant        */
  int rank;                   /* the caller's index in @devices                            */
  /* Identifies this collective among all others of the run; the same on every
   * participant and different for every collective (point-to-point tags likewise). */
  int64_t tag;
} ExecGroup;

typedef enum { EXEC_REDUCE_SUM, EXEC_REDUCE_MAX } ExecReduceOp;

/* The parts of a region under reduce-scatter and all-gather: rank k of n owns elements
 * [k * N / n, (k + 1) * N / n) of the region's N elements in row-major order. */
EXEC_PUBLIC void exec_part_range(int64_t n_elements, int n, int k, int64_t *lo, int64_t *hi);

/* ---------------------------------------------------------------------------------- */
/* The back-end interface                                                              */

typedef struct _ExecBackend ExecBackend;

#define EXEC_BACKEND_API_VERSION 1

/* Every slot that takes @dev is called from the thread the driver runs device @dev in
 * (one thread per device this process runs, see local_devices); slots for different
 * devices run concurrently.  On one device, slots are called in an order that respects
 * every data dependency; a back end that queues work asynchronously keeps that order
 * among operations on the same buffers (one stream per device does).  Communication
 * slots are called by every participant, in the same relative order on all of them.
 * Failing slots set @error and return FALSE; the driver then calls abort. */
typedef struct {
  int api_version;            /* EXEC_BACKEND_API_VERSION                                  */
  const char *name;           /* "cpu", "cuda"                                             */
  const char *description;

  /* Required.  Prepares @n_devices simulated devices. */
  gboolean (*open)(ExecBackend *self, int n_devices, GError **error);
  /* Optional (default: every device).  Writes the devices this process runs into
   * @devices and returns their number: one per process under MPI. */
  int (*local_devices)(ExecBackend *self, int *devices);

  /* Required.  Device memory of @bytes, zeroed. */
  ExecBuffer *(*buffer_alloc)(ExecBackend *self, int dev, size_t bytes, GError **error);
  /* Required. */
  void (*buffer_free)(ExecBackend *self, int dev, ExecBuffer *buffer);
  /* Required.  Copies between host memory and a buffer (byte offsets); may block until
   * the device's queued work is done. */
  gboolean (*buffer_write)(ExecBackend *self, int dev, ExecBuffer *buffer, size_t offset,
                           const void *data, size_t bytes, GError **error);
  gboolean (*buffer_read)(ExecBackend *self, int dev, ExecBuffer *buffer, size_t offset,
                          void *data, size_t bytes, GError **error);

  /* Required.  Sets @region of fp32 view @v to @value (zero, or NaN to poison). */
  gboolean (*fill)(ExecBackend *self, int dev, const ExecView *v, const SimRegion *region,
                   float value, GError **error);
  /* Required.  @dst[region] = @src[region], or += with @accumulate; fp32, one device. */
  gboolean (*copy)(ExecBackend *self, int dev, const ExecView *dst, const ExecView *src,
                   const SimRegion *region, gboolean accumulate, GError **error);

  /* Required.  Runs one kernel; FALSE with EXEC_ERROR_UNSUPPORTED for an operator or
   * configuration the back end lacks. */
  gboolean (*kernel)(ExecBackend *self, int dev, const ExecKernelArgs *args, GError **error);
  /* Required.  One optimizer step. */
  gboolean (*update)(ExecBackend *self, int dev, const ExecUpdateArgs *args, GError **error);

  /* Required.  Point-to-point: @dev sends @region of @v to @peer; @peer receives it into
   * its view (adding with @accumulate).  @tag pairs a send with its receive. */
  gboolean (*send)(ExecBackend *self, int dev, int peer, int64_t tag, const ExecView *v,
                   const SimRegion *region, GError **error);
  gboolean (*recv)(ExecBackend *self, int dev, int peer, int64_t tag, const ExecView *v,
                   const SimRegion *region, gboolean accumulate, GError **error);
  /* Required.  Every member ends with the reduction of @region over the group; views may
   * differ between members (boxes, strides), the region's elements are matched in
   * row-major order of the region. */
  gboolean (*all_reduce)(ExecBackend *self, int dev, const ExecGroup *group, const ExecView *v,
                         const SimRegion *region, ExecReduceOp op, GError **error);
  /* Required.  Sums @region over the group; member k ends with the sum in its part k
   * (exec_part_range) and the rest of the region unspecified. */
  gboolean (*reduce_scatter)(ExecBackend *self, int dev, const ExecGroup *group,
                             const ExecView *v, const SimRegion *region, GError **error);
  /* Required.  Member k contributes its part k of @region; every member ends with all. */
  gboolean (*all_gather)(ExecBackend *self, int dev, const ExecGroup *group, const ExecView *v,
                         const SimRegion *region, GError **error);

  /* Optional (default: the host's monotonic clock when called).  Arranges for *@when to
   * hold, once synchronize returns, the time in seconds at which the device reaches this
   * point of its work; asynchronous back ends record an event. */
  void (*timestamp)(ExecBackend *self, int dev, double *when);
  /* Optional (default: nothing).  Waits for the device's queued work and fills the
   * timestamps recorded since the last call. */
  gboolean (*synchronize)(ExecBackend *self, int dev, GError **error);
  /* Optional (default: nothing).  Called by every local device between steps, after the
   * driver made its own threads meet: makes the devices of other processes meet too. */
  void (*barrier)(ExecBackend *self, int dev);
  /* Optional (default: nothing).  Wakes every device waiting in a communication slot, which
   * then fails: another device failed and the run stops. */
  void (*abort)(ExecBackend *self);
  /* Optional.  Releases a kernel's saved state (ExecKernelArgs.saved). */
  void (*saved_free)(ExecBackend *self, int dev, gpointer saved);
  /* Optional.  Releases the back end's private data (after every buffer was freed). */
  void (*finalize)(ExecBackend *self);
} ExecBackendClass;

struct _ExecBackend {
  const ExecBackendClass *klass;
  void *priv;
};

/* Registration by name (docs/extending.md).  A constructor returns a back end not yet opened. */
typedef ExecBackend *(*ExecBackendNew)(GError **error);
/* Registers @name; a later registration of the same name replaces it. */
EXEC_PUBLIC void exec_register_backend(const char *name, const char *description,
                                       ExecBackendNew constructor);
/* Registers the built-in back ends: "cpu" and, when built, "cuda".  Idempotent. */
EXEC_PUBLIC void exec_register_builtins(void);
/* The registered names, in registration order (transfer full). */
EXEC_PUBLIC char **exec_backend_names(void);
EXEC_PUBLIC const char *exec_backend_description(const char *name);
/* A new back end of @name (the built-ins are registered first). */
EXEC_PUBLIC ExecBackend *exec_backend_new(const char *name, GError **error);
EXEC_PUBLIC void exec_backend_free(ExecBackend *b);
EXEC_PUBLIC const char *exec_backend_get_name(const ExecBackend *b);

/* Wrappers over the slots, with their defaults; the driver and tests call these. */
EXEC_PUBLIC gboolean exec_backend_open(ExecBackend *b, int n_devices, GError **error);
EXEC_PUBLIC int exec_backend_local_devices(ExecBackend *b, int n_devices, int *devices);
EXEC_PUBLIC ExecBuffer *exec_backend_buffer_alloc(ExecBackend *b, int dev, size_t bytes,
                                                  GError **error);
EXEC_PUBLIC void exec_backend_buffer_free(ExecBackend *b, int dev, ExecBuffer *buffer);
EXEC_PUBLIC gboolean exec_backend_buffer_write(ExecBackend *b, int dev, ExecBuffer *buffer,
                                               size_t offset, const void *data, size_t bytes,
                                               GError **error);
EXEC_PUBLIC gboolean exec_backend_buffer_read(ExecBackend *b, int dev, ExecBuffer *buffer,
                                              size_t offset, void *data, size_t bytes,
                                              GError **error);
EXEC_PUBLIC gboolean exec_backend_fill(ExecBackend *b, int dev, const ExecView *v,
                                       const SimRegion *region, float value, GError **error);
EXEC_PUBLIC gboolean exec_backend_copy(ExecBackend *b, int dev, const ExecView *dst,
                                       const ExecView *src, const SimRegion *region,
                                       gboolean accumulate, GError **error);
EXEC_PUBLIC gboolean exec_backend_kernel(ExecBackend *b, int dev, const ExecKernelArgs *args,
                                         GError **error);
EXEC_PUBLIC gboolean exec_backend_update(ExecBackend *b, int dev, const ExecUpdateArgs *args,
                                         GError **error);
EXEC_PUBLIC gboolean exec_backend_send(ExecBackend *b, int dev, int peer, int64_t tag,
                                       const ExecView *v, const SimRegion *region,
                                       GError **error);
EXEC_PUBLIC gboolean exec_backend_recv(ExecBackend *b, int dev, int peer, int64_t tag,
                                       const ExecView *v, const SimRegion *region,
                                       gboolean accumulate, GError **error);
EXEC_PUBLIC gboolean exec_backend_all_reduce(ExecBackend *b, int dev, const ExecGroup *group,
                                             const ExecView *v, const SimRegion *region,
                                             ExecReduceOp op, GError **error);
EXEC_PUBLIC gboolean exec_backend_reduce_scatter(ExecBackend *b, int dev, const ExecGroup *group,
                                                 const ExecView *v, const SimRegion *region,
                                                 GError **error);
EXEC_PUBLIC gboolean exec_backend_all_gather(ExecBackend *b, int dev, const ExecGroup *group,
                                             const ExecView *v, const SimRegion *region,
                                             GError **error);
EXEC_PUBLIC void exec_backend_timestamp(ExecBackend *b, int dev, double *when);
EXEC_PUBLIC gboolean exec_backend_synchronize(ExecBackend *b, int dev, GError **error);
EXEC_PUBLIC void exec_backend_barrier(ExecBackend *b, int dev);
EXEC_PUBLIC void exec_backend_abort(ExecBackend *b);
EXEC_PUBLIC void exec_backend_saved_free(ExecBackend *b, int dev, gpointer saved);

/* ---------------------------------------------------------------------------------- */
/* Deterministic data                                                                  */

/* A number uniform in [0, 1) that depends only on @name, @index and @salt: input data,
 * initial weights and dropout masks come from it, so that every device and every
 * strategy see the same values. */
EXEC_PUBLIC double exec_hash_uniform(const char *name, uint64_t index, uint64_t salt);
/* Whether dropout with probability @p keeps element @index (of the whole batch's tensor,
 * row-major) of operator @op_name's output in step @step. */
EXEC_PUBLIC gboolean exec_dropout_keep(const char *op_name, uint64_t index, int step, double p);

/* The public input generator: the whole batch's values of graph input tensor @t in
 * training step @step (1 for the first) under @seed, row-major, written to @out as fp32,
 * or int64 for an integer tensor (its dtype in the graph) — exactly what every device of
 * every strategy is given.  Floating-point inputs are 2u - 1 with u =
 * exec_hash_uniform(tensor name, flat index, seed * 1000003 + step); integer ones are
 * floor(u * range), range the smallest vocabulary of an embedding or class count of a
 * cross entropy reading the tensor (2 if none); a tensor named "positions" holds each
 * element's index along its last dimension (0 .. seq - 1), clamped to the range. */
EXEC_PUBLIC void exec_input_values(const SimGraph *g, int t, int step, uint64_t seed, void *out);

/* ---------------------------------------------------------------------------------- */
/* Runs: a plan executed for training steps                                             */

typedef struct {
  double lr;                  /* 0: 0.05 for SGD, 0.001 for Adam                            */
  double momentum;            /* SGD; 0 by default                                          */
  double beta1, beta2, eps;   /* Adam; 0.9, 0.999, 1e-8 by default                          */
  /* Fill activations with NaN before each step and before recomputation, so that a plan
   * that reads data nobody delivered or kept yields NaN instead of a stale value. */
  gboolean poison;
  uint64_t seed;              /* salts the input data and the initial weights               */
  /* Initial weights from elsewhere than exec_weight's generator (NULL: generated): fills
   * @out with the whole weight @i of @op (an op owning it), row-major; FALSE with @error
   * set on failure.  exec_load_weight reads them from a dump. */
  gboolean (*weights)(gpointer data, const SimGraph *g, int op, int i, float *out,
                      GError **error);
  gpointer weights_data;
} ExecOptions;

EXEC_PUBLIC ExecOptions exec_options_default(void);

typedef struct _ExecRun ExecRun;

/* Compiles @plan for back end @b (opened here for the plan's devices) and allocates and
 * initializes every buffer.  @plan and @b must outlive the run.  Fails with
 * EXEC_ERROR_UNSUPPORTED for plans the executor cannot run exactly (see the top). */
EXEC_PUBLIC ExecRun *exec_run_new(ExecBackend *b, SimPlan *plan, const ExecOptions *o,
                                  GError **error);
EXEC_PUBLIC void exec_run_free(ExecRun *r);
/* Runs one training step: every micro-batch's forward and backward passes, the gradient
 * synchronization and the update. */
EXEC_PUBLIC gboolean exec_run_step(ExecRun *r, GError **error);
EXEC_PUBLIC int exec_run_steps_done(const ExecRun *r);
/* The loss of the last step: the mean over the elements of every loss tensor (outputs of
 * cross entropy or MSE that nothing consumes), summed over loss tensors. */
EXEC_PUBLIC double exec_run_loss(const ExecRun *r);
/* Seconds the last step took on the host's clock, from the first device's start to the
 * last device's end. */
EXEC_PUBLIC double exec_run_step_time(const ExecRun *r);

/* The whole weight @i of @op as fp32, row-major, gathered from the devices holding its
 * parts: @out holds its number of elements.  @op owns the weight: an op sharing another's
 * weights owns only those beyond the shared ones (sim_graph_share_weights). */
EXEC_PUBLIC gboolean exec_run_read_weight(ExecRun *r, int op, int i, float *out, GError **error);
/* Its gradient in the last step, summed over micro-batches and devices (before the
 * update applied it). */
EXEC_PUBLIC gboolean exec_run_read_grad(ExecRun *r, int op, int i, float *out, GError **error);

/* The measured timeline of the last step: per plan task, seconds from the step's start
 * (-1 for tasks that do nothing here: timing flows and join points).  A task several
 * devices take part in (a copy's sender and receiver, a collective's members) starts when
 * the last of them arrives and ends when the last is done; @busy is the time from that
 * start to each device's end, summed over the devices.  Arrays of sim_plan_n_tasks()
 * entries, valid until the next step. */
EXEC_PUBLIC const double *exec_run_task_start(const ExecRun *r);
EXEC_PUBLIC const double *exec_run_task_end(const ExecRun *r);
EXEC_PUBLIC const double *exec_run_task_busy(const ExecRun *r);
EXEC_PUBLIC SimPlan *exec_run_get_plan(const ExecRun *r);

/* Maximum relative differences of a run from a reference run of the same graph: for the
 * loss, and over every weight tensor and every weight gradient, max |a - b| / max |b|.
 * A gradient that is zero in exact arithmetic (a bias followed by batch norm) holds only
 * rounding noise, so gradients are measured against at least a hundredth of the
 * largest gradient of the model. */
typedef struct {
  double loss;
  double weights;
  double grads;
  char worst[128];            /* "weight 'layer0.fc1' #0", the tensor of the largest error */
} ExecDiff;

EXEC_PUBLIC gboolean exec_run_compare(ExecRun *run, ExecRun *reference, ExecDiff *out,
                                      GError **error);
/* A one-device strategy for @plan's graph with the plan's micro-batches, optimizer and
 * precision: the reference a parallel strategy is checked against (transfer full). */
EXEC_PUBLIC SimStrategy *exec_reference_strategy(const SimPlan *plan, const SimMachine *m,
                                                 GError **error);

/* ---------------------------------------------------------------------------------- */
/* Dumps: a run's numbers for an independent implementation (docs/exec-dump.md)          */

typedef struct _ExecDump ExecDump;

/* Creates @dir (and parents) and writes the graph, the manifest and the initial weights of
 * @r, which has run no step yet. */
EXEC_PUBLIC ExecDump *exec_dump_new(ExecRun *r, const char *dir, GError **error);
/* After each exec_run_step: the step's inputs, dropout masks, gradients, updated weights
 * and loss. */
EXEC_PUBLIC gboolean exec_dump_step(ExecDump *d, ExecRun *r, GError **error);
EXEC_PUBLIC void exec_dump_free(ExecDump *d);
/* An ExecOptions.weights function: reads the initial weights of a dump, @data being its
 * directory (a const char *).  Clear errors name the file and what was expected. */
EXEC_PUBLIC gboolean exec_load_weight(gpointer data, const SimGraph *g, int op, int i,
                                      float *out, GError **error);

G_DEFINE_AUTOPTR_CLEANUP_FUNC(ExecBackend, exec_backend_free)
G_DEFINE_AUTOPTR_CLEANUP_FUNC(ExecDump, exec_dump_free)
G_DEFINE_AUTOPTR_CLEANUP_FUNC(ExecRun, exec_run_free)

G_END_DECLS
