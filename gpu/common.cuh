/* common.cuh — what the CUDA files of the operator library share: the context, checked
 * calls, element types, strided regions, and dense shard-local buffers. */
#pragma once

#include "parasol-cuda.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <stdint.h>

struct PcuContext {
  int device;
  cudaStream_t stream;
  cublasHandle_t blas;
  cudnnHandle_t dnn;
  void *workspace;            /* cuDNN's, grown on demand                                 */
  size_t workspace_size;
  char error[1024];
};

/* Records a failure of @call at @file:@line and returns the status that describes it. */
PcuStatus pcu_fail(PcuContext *ctx, PcuStatus status, const char *file, int line,
                   const char *call, const char *what);
PcuStatus pcu_fail_cuda(PcuContext *ctx, cudaError_t e, const char *file, int line,
                        const char *call);

/* Every library call goes through one of these: a failure returns from the calling
 * function with the status, after recording where and why. */
#define CUDA_CHECK(ctx, call)                                                              \
  do {                                                                                     \
    cudaError_t e__ = (call);                                                              \
    if (e__ != cudaSuccess)                                                                \
      return pcu_fail_cuda((ctx), e__, __FILE__, __LINE__, #call);                         \
  } while (0)

#define BLAS_CHECK(ctx, call)                                                              \
  do {                                                                                     \
    cublasStatus_t s__ = (call);                                                           \
    if (s__ != CUBLAS_STATUS_SUCCESS)                                                      \
      return pcu_fail((ctx), s__ == CUBLAS_STATUS_ALLOC_FAILED ? PCU_ERR_NO_MEMORY         \
                                                              : PCU_ERR_CUDA,              \
                      __FILE__, __LINE__, #call, cublasGetStatusString(s__));              \
  } while (0)

#define DNN_CHECK(ctx, call)                                                               \
  do {                                                                                     \
    cudnnStatus_t s__ = (call);                                                            \
    if (s__ != CUDNN_STATUS_SUCCESS)                                                       \
      return pcu_fail((ctx), s__ == CUDNN_STATUS_ALLOC_FAILED ? PCU_ERR_NO_MEMORY          \
                                                             : PCU_ERR_CUDA,               \
                      __FILE__, __LINE__, #call, cudnnGetErrorString(s__));                \
  } while (0)

/* A kernel launch is checked for a bad configuration right after it. */
#define LAUNCH_CHECK(ctx) CUDA_CHECK(ctx, cudaGetLastError())

#define TRY(call)                                                                          \
  do {                                                                                     \
    PcuStatus t__ = (call);                                                                \
    if (t__ != PCU_OK)                                                                     \
      return t__;                                                                          \
  } while (0)

#define FAIL(ctx, status, what) pcu_fail((ctx), (status), __FILE__, __LINE__, "", (what))

/* ---------------------------------------------------------------------------------- */
/* Element types                                                                       */

template <typename T> __device__ __forceinline__ float to_f(T v);
template <> __device__ __forceinline__ float to_f<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 v)
{
  return __bfloat162float(v);
}

template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v)
{
  return __float2bfloat16_rn(v);
}

/* Calls F<T>(args...) for the floating-point element type @dtype. */
#define DISPATCH_FLOAT(ctx, dtype, F, ...)                                                 \
  do {                                                                                     \
    switch (dtype) {                                                                       \
    case PCU_F32: return F<float>(__VA_ARGS__);                                            \
    case PCU_F16: return F<__half>(__VA_ARGS__);                                           \
    case PCU_BF16: return F<__nv_bfloat16>(__VA_ARGS__);                                   \
    default: return FAIL(ctx, PCU_ERR_UNSUPPORTED, "not a floating-point element type");   \
    }                                                                                      \
  } while (0)

/* Launches kernel<T> for the floating-point element type @dtype and checks the launch. */
#define LAUNCH_FLOAT(ctx, dtype, kernel, grid, block, ...)                                 \
  do {                                                                                     \
    switch (dtype) {                                                                       \
    case PCU_F32: kernel<float><<<(grid), (block), 0, (ctx)->stream>>>(__VA_ARGS__); break; \
    case PCU_F16: kernel<__half><<<(grid), (block), 0, (ctx)->stream>>>(__VA_ARGS__); break; \
    case PCU_BF16:                                                                         \
      kernel<__nv_bfloat16><<<(grid), (block), 0, (ctx)->stream>>>(__VA_ARGS__);           \
      break;                                                                               \
    default: return FAIL(ctx, PCU_ERR_UNSUPPORTED, "not a floating-point element type");   \
    }                                                                                      \
    LAUNCH_CHECK(ctx);                                                                     \
  } while (0)

cudaDataType_t pcu_cuda_type(int dtype);
cudnnDataType_t pcu_cudnn_type(int dtype);

/* ---------------------------------------------------------------------------------- */
/* Strided regions                                                                     */

/* A region of a view, ready for a kernel: its base element, sizes and strides. */
struct Strided {
  void *base;
  int dtype;
  int ndim;
  int64_t size[PCU_MAX_DIMS];
  int64_t stride[PCU_MAX_DIMS];
};

/* The element offset of the @i-th element (row-major order of the sizes).  The outermost
 * dimension needs no remainder, and a region that pcu_flatten() made one-dimensional needs
 * no division at all: 64-bit divisions are slow on the GPU, and element-wise kernels over
 * dense tensors would spend most of their time in them. */
__device__ __forceinline__ int64_t strided_offset(const Strided &s, int64_t i)
{
  if (s.ndim == 1)
    return i * s.stride[0];
  /* Unrolled over the largest rank, so that every index into the sizes and strides is a
   * constant: a loop bound by s.ndim would copy the whole argument into local memory in
   * every thread, and a kernel over a few million elements would move gigabytes. */
  int64_t off = 0;
#pragma unroll
  for (int d = PCU_MAX_DIMS - 1; d >= 1; d--)
    if (d < s.ndim) {
      int64_t c = i % s.size[d];
      i /= s.size[d];
      off += c * s.stride[d];
    }
  return off + i * s.stride[0];
}

/* The same walk with as few dimensions as possible: dimensions of size 1 dropped, and each
 * dimension merged into the one outside it where the two are contiguous with each other.
 * The offset of every linear index stays what it was. */
static inline Strided pcu_flatten(Strided s)
{
  Strided f = s;
  int m = 0;
  for (int d = 0; d < s.ndim; d++) {
    if (s.size[d] == 1)
      continue;
    if (m > 0 && f.stride[m - 1] == s.stride[d] * s.size[d]) {
      f.size[m - 1] *= s.size[d];
      f.stride[m - 1] = s.stride[d];
      continue;
    }
    f.size[m] = s.size[d];
    f.stride[m] = s.stride[d];
    m++;
  }
  if (m == 0) {
    f.size[0] = 1;
    f.stride[0] = 1;
    m = 1;
  }
  f.ndim = m;
  return f;
}

Strided pcu_strided(const PcuView *v, const PcuRegion *r);
int64_t pcu_region_numel(const PcuRegion *r);
/* Whether @v holds @r densely in row-major order starting at its first element. */
bool pcu_view_is_dense_region(const PcuView *v, const PcuRegion *r);

/* Blocks for a grid-stride loop over @n elements: one element per thread up to 4096
 * blocks (about 32 per SM on an A100 or H100, several waves of full occupancy), then
 * more elements per thread, which spares the block scheduler millions of tiny blocks. */
static inline unsigned pcu_blocks(int64_t n, int threads = 256)
{
  int64_t b = (n + threads - 1) / threads;
  if (b < 1)
    b = 1;
  return (unsigned)(b > 4096 ? 4096 : b);
}

/* ---------------------------------------------------------------------------------- */
/* Scratch memory and dense shard-local operands                                       */

/* Scratch allocations of one call, freed when it returns (stream-ordered, so the frees
 * wait for the kernels that use them). */
class Scratch {
public:
  explicit Scratch(PcuContext *ctx) : ctx_(ctx), n_(0) {}
  ~Scratch()
  {
    for (int i = 0; i < n_; i++)
      cudaFreeAsync(p_[i], ctx_->stream);
  }
  Scratch(const Scratch &) = delete;
  Scratch &operator=(const Scratch &) = delete;
  /* Zeroed device memory of @bytes. */
  PcuStatus alloc(size_t bytes, void **out);

private:
  PcuContext *ctx_;
  int n_;
  void *p_[64];
};

/* An operand of a dense computation: the view itself when it is dense over the region,
 * else scratch memory of the region's elements in row-major order. */
struct Dense {
  void *p;
  int64_t n;
  int dtype;
  bool owned;
};

/* For reading: the region of @a as @dtype (packed and converted when needed). */
PcuStatus dense_in(PcuContext *ctx, Scratch &s, const PcuArg &a, int dtype, Dense *out);
/* For writing: in place when possible, else zeroed scratch (@dtype). */
PcuStatus dense_out(PcuContext *ctx, Scratch &s, const PcuArg &a, int dtype, Dense *out);
/* After writing through dense_out: unpacks scratch into the view, adding when
 * @accumulate.  In place, the computation itself must have added. */
PcuStatus dense_commit(PcuContext *ctx, const PcuArg &a, const Dense &d, bool accumulate);
/* Whether writes to @d must add (it is the view itself and the call accumulates). */
static inline bool dense_adds(const Dense &d, bool accumulate)
{
  return !d.owned && accumulate;
}

/* Scratch for a temporary of @n elements of @dtype (zeroed). */
PcuStatus scratch_tensor(Scratch &s, int dtype, int64_t n, void **out);

/* State kept between a forward call and the backward call of the same shard: numbered
 * device buffers, reused when large enough (a recomputed forward pass overwrites them). */
PcuStatus saved_buffer(PcuContext *ctx, void **saved, int slot, size_t bytes, void **out);
/* The buffer of @slot, or NULL when the forward call did not keep one of @bytes. */
void *saved_get(void *const *saved, int slot, size_t bytes);

/* A vector of @n ones of @dtype in scratch: column sums as products with it. */
PcuStatus scratch_ones(PcuContext *ctx, Scratch &s, int dtype, int64_t n, void **out);
/* colsum[j] (+)= sum over rows of X[rows x cols] (row-major), as ones^T X. */
PcuStatus pcu_colsum(PcuContext *ctx, Scratch &s, int dtype, const void *X, int64_t rows,
                     int64_t cols, void *colsum, bool add);

/* ---------------------------------------------------------------------------------- */
/* Shared kernels                                                                      */

/* y[i] = a * x[i] + (beta ? y[i] : 0), elementwise over @n, any float types. */
PcuStatus pcu_axpby(PcuContext *ctx, int dtype, const void *x, void *y, int64_t n, float a,
                    bool beta);
/* dst[i] (+)= src[i] converting element types. */
PcuStatus pcu_convert(PcuContext *ctx, void *dst, int dst_dtype, const void *src, int src_dtype,
                      int64_t n, bool accumulate);

/* The unary functions of the catalogue (SimUnaryKind numbers). */
enum { U_IDENTITY, U_RELU, U_GELU, U_SIGMOID, U_TANH, U_EXP, U_SILU, U_SCALE, U_RELU6 };

__device__ __forceinline__ float unary_f(int kind, float x, float scale)
{
  switch (kind) {
  case U_RELU: return x > 0.f ? x : 0.f;
  case U_GELU:
    /* The exact GELU, x Phi(x), as the CPU reference computes it. */
    return 0.5f * x * (1.f + erff(x * 0.7071067811865476f));
  case U_SIGMOID: return 1.f / (1.f + expf(-x));
  case U_TANH: return tanhf(x);
  case U_EXP: return expf(x);
  case U_SILU: return x / (1.f + expf(-x));
  case U_SCALE: return scale * x;
  case U_RELU6: return fminf(fmaxf(x, 0.f), 6.f);
  default: return x;
  }
}

/* The derivative of unary_f at input @x (whose value is @y). */
__device__ __forceinline__ float unary_df(int kind, float x, float y, float scale)
{
  switch (kind) {
  case U_RELU: return x > 0.f ? 1.f : 0.f;
  case U_GELU:
    /* Phi(x) + x phi(x). */
    return 0.5f * (1.f + erff(x * 0.7071067811865476f)) +
           x * expf(-0.5f * x * x) * 0.3989422804014327f;
  case U_SIGMOID: return y * (1.f - y);
  case U_TANH: return 1.f - y * y;
  case U_EXP: return y;
  case U_SILU: {
    float s = 1.f / (1.f + expf(-x));
    return s * (1.f + x * (1.f - s));
  }
  case U_SCALE: return scale;
  case U_RELU6: return x > 0.f && x < 6.f ? 1.f : 0.f;
  default: return 1.f;
  }
}

/* exec_hash_uniform() on the device: SplitMix64's finalizer over the name's FNV-1a hash,
 * the element's index and a salt. */
__device__ __forceinline__ uint64_t mix64(uint64_t z)
{
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

__device__ __forceinline__ double hash_uniform(uint64_t name_hash, uint64_t index, uint64_t salt)
{
  uint64_t h = mix64(name_hash ^ mix64(index + 0x9e3779b97f4a7c15ULL * (salt + 1)));
  return (double)(h >> 11) * (1.0 / 9007199254740992.0);
}

/* exec_dropout_keep() on the device. */
__device__ __forceinline__ bool dropout_keep(uint64_t name_hash, uint64_t index, int step,
                                             double p)
{
  if (p <= 0.0)
    return true;
  return hash_uniform(name_hash, index, 0x5eed0000ULL + (uint64_t)step) >= p;
}

/* The operators, by SimOpType number. */
enum {
  OP_INPUT, OP_LINEAR, OP_MATMUL, OP_CONV2D, OP_POOL2D, OP_BATCHNORM, OP_LAYERNORM,
  OP_EMBEDDING, OP_UNARY, OP_BINARY, OP_SOFTMAX, OP_DROPOUT, OP_CONCAT, OP_SPLIT, OP_RESHAPE,
  OP_TRANSPOSE, OP_ATTENTION, OP_LSTM, OP_CROSS_ENTROPY, OP_MSE_LOSS, OP_RMSNORM, OP_GATED_MLP,
  OP_MOE,
};

/* The families, each in its file. */
PcuStatus pcu_op_linear(PcuContext *ctx, const PcuOpArgs *a);
PcuStatus pcu_op_matmul(PcuContext *ctx, const PcuOpArgs *a);
PcuStatus pcu_op_attention(PcuContext *ctx, const PcuOpArgs *a);
PcuStatus pcu_op_lstm(PcuContext *ctx, const PcuOpArgs *a);
PcuStatus pcu_op_conv2d(PcuContext *ctx, const PcuOpArgs *a);
PcuStatus pcu_op_pool2d(PcuContext *ctx, const PcuOpArgs *a);
PcuStatus pcu_op_batchnorm(PcuContext *ctx, const PcuOpArgs *a);
PcuStatus pcu_op_softmax(PcuContext *ctx, const PcuOpArgs *a);
PcuStatus pcu_op_layernorm(PcuContext *ctx, const PcuOpArgs *a);
PcuStatus pcu_op_embedding(PcuContext *ctx, const PcuOpArgs *a);
PcuStatus pcu_op_unary(PcuContext *ctx, const PcuOpArgs *a);
PcuStatus pcu_op_binary(PcuContext *ctx, const PcuOpArgs *a);
PcuStatus pcu_op_dropout(PcuContext *ctx, const PcuOpArgs *a);
PcuStatus pcu_op_shape(PcuContext *ctx, const PcuOpArgs *a);
PcuStatus pcu_op_cross_entropy(PcuContext *ctx, const PcuOpArgs *a);
PcuStatus pcu_op_mse(PcuContext *ctx, const PcuOpArgs *a);
PcuStatus pcu_op_rmsnorm(PcuContext *ctx, const PcuOpArgs *a);
PcuStatus pcu_op_gated_mlp(PcuContext *ctx, const PcuOpArgs *a);
PcuStatus pcu_op_moe(PcuContext *ctx, const PcuOpArgs *a);
/* Attention's ring phases under context parallelism (ring.cu). */
PcuStatus pcu_op_ring_attention(PcuContext *ctx, const PcuOpArgs *a);

/* Attention's pieces for LLaMA-style blocks (kernels-llm.cu). */
/* Rotary embeddings on the rows of X [rows, nh * E], row r at position pos0 + r % S
 * (@sign -1: the inverse rotation, for gradients). */
PcuStatus pcu_rope(PcuContext *ctx, int dtype, void *X, int64_t rows, int64_t S, int64_t pos0,
                   int64_t nh, int64_t E, double base, double sign);
/* Grouped-query attention's gradients of shared keys or values: out [rows, n_kv * E] the
 * sums over each group of @group query heads of in [rows, n_kv * group * E]. */
PcuStatus pcu_sum_head_groups(PcuContext *ctx, int dtype, const void *in, void *out,
                              int64_t rows, int64_t n_kv, int64_t group, int64_t E);

/* Row-wise kernels the families share (kernels.cu). */
/* Softmax of @rows rows of @cols in place, after scaling by @scale and, with @causal,
 * masking the keys after each query: row r is query q_offset + r % q_rows, which sees
 * keys 0 .. q_offset + r % q_rows. */
PcuStatus pcu_masked_softmax(PcuContext *ctx, int dtype, void *scores, int64_t rows,
                             int64_t cols, float scale, int causal, int64_t q_rows,
                             int64_t q_offset);
/* Softmax backward for rows of probabilities P: dS (+)= scale * P * (dP - sum(dP * P)). */
PcuStatus pcu_softmax_backward_rows(PcuContext *ctx, int dtype, const void *P, const void *dP,
                                    void *dS, int64_t rows, int64_t cols, float scale,
                                    bool add);

/* The GEMM of row-major matrices: C[m x n] = alpha * op(A) op(B) + beta * C, where op(A)
 * is A [m x k] (or A^T with A [k x m] stored) and likewise B, in @dtype with fp32
 * accumulation; @batch products with element strides between them. */
PcuStatus pcu_gemm(PcuContext *ctx, int dtype, bool trans_a, bool trans_b, int64_t m, int64_t n,
                   int64_t k, float alpha, const void *A, int64_t lda, int64_t stride_a,
                   const void *B, int64_t ldb, int64_t stride_b, float beta, void *C, int64_t ldc,
                   int64_t stride_c, int64_t batch);
