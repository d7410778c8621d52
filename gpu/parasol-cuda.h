/* parasol-cuda.h — the GPU operator library (gpu/): the CUDA implementation of the
 * operator catalogue, shared by the profiler (profile/cuda/runner.c) and the CUDA back
 * end of the executor (exec/cuda), so that what `parasol profile ops` measures is what
 * `parasol exec` runs.
 *
 * It is plain C over plain structs, with no GLib and no libsim types, because its body is
 * CUDA C++ compiled by nvcc (ops.cu, conv.cu, kernels.cu, kernels-loss.cu, context.cu).
 * The C side that knows the graph (desc.c) fills the structs from a SimGraph.
 *
 * Semantics are those of ExecKernelArgs (include/parasol-exec.h): a kernel call runs one
 * operator on one shard, whose iteration range is [lo, hi); every tensor is a view of a
 * device buffer (a box of the tensor and strides), and the region of each tensor the
 * shard reads or writes is given.  Forward writes the output region, or adds into it when
 * a split reduction leaves partial sums; backward adds its contributions into the input
 * and weight gradients.  Matrix products go to cuBLAS, convolution, pooling, batch
 * normalization and softmax to cuDNN, everything else to this library's own kernels.
 * When a view is dense and its box is the shard's region, kernels work on it in place;
 * otherwise the region is packed into scratch memory first and unpacked after.
 *
 * Every CUDA, cuBLAS and cuDNN call is checked; a failing call makes the function return
 * a PcuStatus other than PCU_OK and leaves "file:line: call: error" in the context
 * (pcu_context_error). */
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PCU_MAX_DIMS 6          /* SIM_MAX_DIMS                                          */
#define PCU_MAX_ITER 8          /* SIM_MAX_ITER                                          */
#define PCU_MAX_INPUTS 16
#define PCU_MAX_WEIGHTS 8
#define PCU_MAX_OUTPUTS 16

typedef enum {
  PCU_OK = 0,
  PCU_ERR_CUDA,           /* a CUDA, cuBLAS or cuDNN call failed                          */
  PCU_ERR_NO_MEMORY,      /* device memory ran out                                        */
  PCU_ERR_NO_DEVICE,      /* no usable GPU                                                */
  PCU_ERR_UNSUPPORTED,    /* an operator or configuration this library does not run       */
  PCU_ERR_INVALID,        /* arguments that contradict each other                         */
  PCU_ERR_NCCL,           /* an NCCL call failed                                          */
} PcuStatus;

/* Element types, numbered as SimDType. */
typedef enum {
  PCU_F32 = 0,
  PCU_F16 = 1,
  PCU_BF16 = 2,
  PCU_I32 = 4,
  PCU_I64 = 5,
} PcuDType;

int pcu_dtype_size(int dtype);

/* One device's handles: a stream, cuBLAS and cuDNN handles on it, a workspace. */
typedef struct PcuContext PcuContext;

/* Creates a context on GPU @device (made current for the calling thread), with cuBLAS
 * and cuDNN handles when @libraries is non-zero (a context that only copies, for a
 * communication stream, needs none).  On failure returns NULL and, if @error is given,
 * writes a message of at most @error_size bytes. */
PcuContext *pcu_context_new(int device, int libraries, char *error, size_t error_size);
void pcu_context_free(PcuContext *ctx);
/* The last error's message, "" when none (owned by the context). */
const char *pcu_context_error(const PcuContext *ctx);
int pcu_context_device(const PcuContext *ctx);
/* The context's stream, as a cudaStream_t. */
void *pcu_context_stream(PcuContext *ctx);
/* Makes the context's device current for the calling thread. */
PcuStatus pcu_context_activate(PcuContext *ctx);

/* The number of usable GPUs, or -1 with a message when the driver or runtime fails. */
int pcu_device_count(char *error, size_t error_size);
/* The GPU's name, memory and versions of the driver and libraries, as one line each of
 * "name=value" into @out. */
PcuStatus pcu_device_describe(int device, char *out, size_t out_size);
/* Opens cuBLAS, which parasol does not link (cublas-load.c): NULL when it is ready, or why
 * it could not be opened.  Contexts with libraries open it themselves; this is for a
 * caller that wants to know first. */
const char *pcu_cublas_load(void);

/* Device memory.  Allocations are stream-ordered on the context's stream. */
PcuStatus pcu_malloc(PcuContext *ctx, size_t bytes, void **out);
PcuStatus pcu_free(PcuContext *ctx, void *p);
PcuStatus pcu_memset_zero(PcuContext *ctx, void *p, size_t bytes);
PcuStatus pcu_upload(PcuContext *ctx, void *dst, const void *src, size_t bytes);
PcuStatus pcu_download(PcuContext *ctx, void *dst, const void *src, size_t bytes);
PcuStatus pcu_synchronize(PcuContext *ctx);
/* Fills @n elements of @dtype at @p with deterministic values in [-1, 1) (integers in
 * [0, @int_range)), a function of @seed and the index: inputs for measurements. */
PcuStatus pcu_fill_random(PcuContext *ctx, void *p, int dtype, int64_t n, uint64_t seed,
                          int64_t int_range);

/* Events for timing: @n events, recorded on the stream. */
PcuStatus pcu_events_new(PcuContext *ctx, int n, void **events);
void pcu_events_free(PcuContext *ctx, int n, void **events);
PcuStatus pcu_event_record(PcuContext *ctx, void *event);
/* Seconds between two recorded events (waits for the second). */
PcuStatus pcu_event_elapsed(PcuContext *ctx, void *start, void *end, double *seconds);

/* ---------------------------------------------------------------------------------- */
/* Views and regions                                                                    */

/* A box of a tensor in device memory: element idx (lo <= idx < hi) is at
 * data + sum over d of (idx[d] - lo[d]) * stride[d] elements. */
typedef struct {
  void *data;                 /* NULL: absent (no gradient wanted)                        */
  int dtype;
  int ndim;
  int64_t lo[PCU_MAX_DIMS], hi[PCU_MAX_DIMS];
  int64_t stride[PCU_MAX_DIMS];
} PcuView;

typedef struct {
  int ndim;
  int64_t lo[PCU_MAX_DIMS], hi[PCU_MAX_DIMS];
} PcuRegion;

/* A dense row-major view of @region over @data. */
PcuView pcu_view_dense(void *data, int dtype, const PcuRegion *region);

/* @region of @v set to @value. */
PcuStatus pcu_fill(PcuContext *ctx, const PcuView *v, const PcuRegion *region, float value);
/* @dst[region] = @src[region] (+= with @accumulate); the dtypes may differ (converted). */
PcuStatus pcu_copy(PcuContext *ctx, const PcuView *dst, const PcuView *src,
                   const PcuRegion *region, int accumulate);
/* dst[i] = dst[i] + src[i] (@max zero) or max(dst[i], src[i]) over @n fp32 elements. */
PcuStatus pcu_combine(PcuContext *ctx, float *dst, const float *src, int64_t n, int max);
/* @dst[region] = @src[perm(region)]: element i of dst's region takes the element of src
 * whose coordinate along src dimension perm[d] is i[d] (a transpose). */
PcuStatus pcu_copy_permuted(PcuContext *ctx, const PcuView *dst, const PcuView *src,
                            const PcuRegion *dst_region, const int *perm, int accumulate);

/* ---------------------------------------------------------------------------------- */
/* Operators                                                                            */

typedef enum {
  PCU_FORWARD,
  PCU_BACKWARD,
  PCU_STATS_RESCALE,          /* EXEC_KERNEL_STATS_RESCALE                                  */
  PCU_STATS_FINISH,           /* EXEC_KERNEL_STATS_FINISH                                   */
  /* Ring attention (EXEC_KERNEL_RING_*, include/parasol-exec.h): fp32 only. */
  PCU_RING_BEGIN,
  PCU_RING_STEP,
  PCU_RING_END,
  PCU_RING_BACKWARD_BEGIN,
  PCU_RING_BACKWARD_STEP,
  PCU_RING_BACKWARD_END,
} PcuPhase;

/* Planes of the cross-entropy statistics (EXEC_STATS_*). */
enum { PCU_STATS_LOCAL_MAX, PCU_STATS_MAX, PCU_STATS_SUM, PCU_STATS_LABEL, PCU_STATS_PLANES };

/* A tensor of an operator call: its view and the region the shard touches. */
typedef struct {
  PcuView v;
  PcuRegion region;
} PcuArg;

/* One operator call.  The attributes are the operator's (the catalogue's names); the
 * op type is SimOpType's number. */
typedef struct {
  int type;
  PcuPhase phase;
  int dtype;                  /* the floating-point type it computes in (fp32 accumulation) */
  int n_dims;
  int64_t lo[PCU_MAX_ITER], hi[PCU_MAX_ITER];   /* the shard's iteration range          */
  int64_t size[PCU_MAX_ITER];                   /* the iteration space's extents         */
  int accumulate;             /* FORWARD: add into the outputs (partial sums)              */
  int split_stats;            /* cross entropy over split classes                          */
  int bias_here;              /* this shard adds the bias and takes its gradient            */
  /* Attributes. */
  int act;                    /* SimUnaryKind: linear, conv2d fused activation; unary kind */
  int kind;                   /* SimBinaryKind, SimPoolKind                                */
  int has_bias;               /* linear, conv2d, attention: the op has bias weights         */
  int trans_b;                /* matmul                                                   */
  int causal;                 /* attention                                                */
  int relu;                   /* batch norm                                               */
  int bags;                   /* embedding                                                */
  int groups;                 /* conv2d                                                   */
  int64_t heads, head_dim;    /* attention: the whole op's                                 */
  int64_t kv_heads;           /* attention: key-value heads (grouped-query), = heads if none */
  int64_t experts, top_k;     /* mixture of experts                                        */
  int normalize_top_k;        /* mixture of experts: the top k's weights sum to one         */
  int rotary;                 /* attention: rotary embeddings on Q and K                   */
  double rotary_base;
  int64_t kernel[2], stride[2], padding[2], dilation[2];
  int axis;                   /* concat, split                                            */
  /* Concat and split: where part i (an input of concat, an output of split) starts along
   * the axis of the whole tensor. */
  int64_t part_offset[PCU_MAX_INPUTS];
  int perm[PCU_MAX_DIMS];     /* transpose                                                */
  double p;                   /* dropout probability (dropout, attention)                  */
  double scale;               /* unary scale                                              */
  double eps;                 /* batch, layer and RMS norm                                 */
  /* Random numbers (dropout): exec_hash_uniform(name, index, salt) with name's hash. */
  uint64_t name_hash;
  int step;
  int64_t batch, sample_offset;
  /* The full (whole-batch) shape of the tensor dropout indexes: the op's output, or the
   * attention scores [batch, heads, sq, skv]. */
  int64_t full[PCU_MAX_DIMS];
  int full_ndim;
  int n_inputs, n_weights, n_outputs;
  PcuArg in[PCU_MAX_INPUTS], in_grad[PCU_MAX_INPUTS];
  PcuArg w[PCU_MAX_WEIGHTS], w_grad[PCU_MAX_WEIGHTS];
  PcuArg out[PCU_MAX_OUTPUTS], out_grad[PCU_MAX_OUTPUTS];
  PcuArg stats;
  /* Ring attention phases: the block held ([4 planes, samples, positions, key-value heads,
   * head_dim], dense) and the sequence position of its first key. */
  PcuArg ring;
  int64_t ring_lo;
  /* Megatron's two-chunk layout (ring_half > 0): the shard's rows and the block's are two
   * chunks of ring_half positions, the shard's at ring_q_lo and ring_q_lo2, the block's at
   * ring_lo and ring_lo2 (include/parasol-exec.h, ExecKernelArgs). */
  int64_t ring_half, ring_lo2, ring_q_lo, ring_q_lo2;
  /* State kept from forward for backward of the same shard and micro-batch (NULL at
   * first); released with pcu_saved_free(). */
  void **saved;
} PcuOpArgs;

/* Runs one operator call on the context's stream. */
PcuStatus pcu_op_run(PcuContext *ctx, const PcuOpArgs *args);
void pcu_saved_free(PcuContext *ctx, void *saved);

/* One optimizer step over elements [part_lo, part_hi) of @region (row-major order) of
 * the weight, its gradient and its states (fp32 states; SGD uses @state1 as momentum). */
typedef struct {
  int adam;
  double lr, momentum, beta1, beta2, eps, weight_decay;
  int step;
  PcuView weight, grad, state1, state2;
  PcuRegion region;
  int64_t part_lo, part_hi;
} PcuUpdateArgs;

PcuStatus pcu_update(PcuContext *ctx, const PcuUpdateArgs *args);

/* ---------------------------------------------------------------------------------- */
/* Collectives (NCCL)                                                                   */

/* Measures @kind (ProfileCollKind's number: all-reduce, all-gather, reduce-scatter,
 * send-recv) of @bytes over GPUs 0..@n_gpus-1 of this process, one communicator each,
 * driven from this thread in group calls: @warmup untimed runs, then @reps timed ones
 * whose seconds go to @seconds.  For send-recv every GPU sends @bytes to the next one
 * and receives as much from the previous one. */
PcuStatus pcu_nccl_measure(int kind, int n_gpus, size_t bytes, int warmup, int reps,
                           double *seconds, char *error, size_t error_size);

#ifdef __cplusplus
}
#endif
