/* kernels.cu — the operators that are this library's own kernels: layer norm, embedding,
 * element-wise unary and binary functions, dropout and the shape operators; softmax
 * through cuDNN; and the row-wise softmax that attention uses (the losses and the
 * optimizer are kernels-loss.cu).
 *
 * Element-wise kernels walk regions of views with their strides, or linearly when every
 * operand is dense (the common case, which then reads and writes nothing but the
 * elements).  Row-wise kernels (softmax, layer norm, losses) give one block to a row and
 * reduce across its threads; column sums of many rows (the gradients of gamma and beta)
 * reduce a chunk of rows per block and add the chunks atomically in fp32. */
#include "rows.cuh"

#include <math.h>
#include <string.h>

/* ---------------------------------------------------------------------------------- */
/* Row softmax with scale and causal mask (attention)                                  */

template <typename T>
__global__ void masked_softmax_kernel(void *xv, int64_t rows, int64_t cols, float scale,
                                      int causal, int64_t q_rows, int64_t q_offset)
{
  __shared__ float buf[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    T *x = (T *)xv + r * cols;
    int64_t limit = cols;
    if (causal) {
      int64_t q = q_offset + r % q_rows + 1;
      limit = q < cols ? q : cols;
    }
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < limit; j += blockDim.x)
      m = fmaxf(m, scale * to_f<T>(x[j]));
    m = block_max(m, buf);
    float sum = 0.f;
    for (int64_t j = threadIdx.x; j < limit; j += blockDim.x)
      sum += expf(scale * to_f<T>(x[j]) - m);
    sum = block_sum(sum, buf);
    float inv = sum > 0.f ? 1.f / sum : 0.f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
      x[j] = from_f<T>(j < limit ? expf(scale * to_f<T>(x[j]) - m) * inv : 0.f);
  }
}

PcuStatus pcu_masked_softmax(PcuContext *ctx, int dtype, void *scores, int64_t rows,
                             int64_t cols, float scale, int causal, int64_t q_rows,
                             int64_t q_offset)
{
  if (rows == 0 || cols == 0)
    return PCU_OK;
  LAUNCH_FLOAT(ctx, dtype, masked_softmax_kernel, row_blocks(rows), ROW_THREADS, scores, rows,
               cols, scale, causal, q_rows > 0 ? q_rows : 1, q_offset);
  return PCU_OK;
}

template <typename T>
__global__ void softmax_backward_rows_kernel(const void *Pv, const void *dPv, void *dSv,
                                             int64_t rows, int64_t cols, float scale, bool add)
{
  __shared__ float buf[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T *P = (const T *)Pv + r * cols, *dP = (const T *)dPv + r * cols;
    T *dS = (T *)dSv + r * cols;
    float dot = 0.f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
      dot += to_f<T>(P[j]) * to_f<T>(dP[j]);
    dot = block_sum(dot, buf);
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      float g = scale * to_f<T>(P[j]) * (to_f<T>(dP[j]) - dot);
      dS[j] = from_f<T>(add ? to_f<T>(dS[j]) + g : g);
    }
  }
}

PcuStatus pcu_softmax_backward_rows(PcuContext *ctx, int dtype, const void *P, const void *dP,
                                    void *dS, int64_t rows, int64_t cols, float scale, bool add)
{
  if (rows == 0 || cols == 0)
    return PCU_OK;
  LAUNCH_FLOAT(ctx, dtype, softmax_backward_rows_kernel, row_blocks(rows), ROW_THREADS, P, dP,
               dS, rows, cols, scale, add);
  return PCU_OK;
}

/* ---------------------------------------------------------------------------------- */
/* Softmax over the last dimension (cuDNN)                                             */

/* A cuDNN descriptor of rows x cols as N x C x 1 x 1, released with the object. */
class SoftmaxDesc {
public:
  SoftmaxDesc() : d_(NULL) {}
  ~SoftmaxDesc()
  {
    if (d_)
      cudnnDestroyTensorDescriptor(d_);
  }
  SoftmaxDesc(const SoftmaxDesc &) = delete;
  SoftmaxDesc &operator=(const SoftmaxDesc &) = delete;
  PcuStatus init(PcuContext *ctx, int dtype, int64_t rows, int64_t cols)
  {
    if (rows > 0x7fffffff || cols > 0x7fffffff)
      return FAIL(ctx, PCU_ERR_UNSUPPORTED, "a softmax larger than cuDNN's 32-bit sizes");
    DNN_CHECK(ctx, cudnnCreateTensorDescriptor(&d_));
    DNN_CHECK(ctx, cudnnSetTensor4dDescriptor(d_, CUDNN_TENSOR_NCHW, pcu_cudnn_type(dtype),
                                              (int)rows, (int)cols, 1, 1));
    return PCU_OK;
  }
  cudnnTensorDescriptor_t get() const { return d_; }

private:
  cudnnTensorDescriptor_t d_;
};

PcuStatus pcu_op_softmax(PcuContext *ctx, const PcuOpArgs *a)
{
  int dt = a->dtype;
  int64_t C = rlast(a->in[0].region), R = C ? pcu_region_numel(&a->in[0].region) / C : 0;
  if (R == 0 || C == 0)
    return PCU_OK;
  Scratch s(ctx);
  SoftmaxDesc desc;
  TRY(desc.init(ctx, dt, R, C));
  float one = 1.f, zero = 0.f;
  void *y = NULL;
  if (a->phase == PCU_FORWARD) {
    Dense x, out;
    TRY(dense_in(ctx, s, a->in[0], dt, &x));
    TRY(dense_out(ctx, s, a->out[0], dt, &out));
    DNN_CHECK(ctx, cudnnSoftmaxForward(ctx->dnn, CUDNN_SOFTMAX_ACCURATE,
                                       CUDNN_SOFTMAX_MODE_CHANNEL, &one, desc.get(), x.p, &zero,
                                       desc.get(), out.p));
    /* The output is what the backward pass differentiates through. */
    TRY(saved_buffer(ctx, a->saved, 0, (size_t)(R * C) * pcu_dtype_size(dt), &y));
    CUDA_CHECK(ctx, cudaMemcpyAsync(y, out.p, (size_t)(R * C) * pcu_dtype_size(dt),
                                    cudaMemcpyDeviceToDevice, ctx->stream));
    return dense_commit(ctx, a->out[0], out, false);
  }
  y = saved_get(a->saved, 0, (size_t)(R * C) * pcu_dtype_size(dt));
  if (!y)
    return FAIL(ctx, PCU_ERR_INVALID, "a backward pass of softmax without its forward pass");
  if (!present(a->in_grad[0]))
    return PCU_OK;
  Dense dy, dx;
  TRY(dense_in(ctx, s, a->out_grad[0], dt, &dy));
  TRY(dense_out(ctx, s, a->in_grad[0], dt, &dx));
  float beta = dense_adds(dx, true) ? 1.f : 0.f;
  DNN_CHECK(ctx, cudnnSoftmaxBackward(ctx->dnn, CUDNN_SOFTMAX_ACCURATE,
                                      CUDNN_SOFTMAX_MODE_CHANNEL, &one, desc.get(), y,
                                      desc.get(), dy.p, &beta, desc.get(), dx.p));
  return dense_commit(ctx, a->in_grad[0], dx, true);
}

/* ---------------------------------------------------------------------------------- */
/* Layer norm over the last dimension                                                  */

template <typename T>
__global__ void layernorm_kernel(const void *xv, const void *gv, const void *bv, void *yv,
                                 float *stats, int64_t rows, int64_t D, float eps)
{
  __shared__ float buf[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T *x = (const T *)xv + r * D;
    T *y = (T *)yv + r * D;
    float sum = 0.f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x)
      sum += to_f<T>(x[j]);
    float mean = block_sum(sum, buf) / (float)D;
    float var = 0.f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      float d = to_f<T>(x[j]) - mean;
      var += d * d;
    }
    float rstd = rsqrtf(block_sum(var, buf) / (float)D + eps);
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x)
      y[j] = from_f<T>((to_f<T>(x[j]) - mean) * rstd * to_f<T>(((const T *)gv)[j]) +
                       to_f<T>(((const T *)bv)[j]));
    if (threadIdx.x == 0) {
      stats[2 * r] = mean;
      stats[2 * r + 1] = rstd;
    }
  }
}

template <typename T>
__global__ void layernorm_backward_kernel(const void *xv, const void *gv, const void *dyv,
                                          const float *stats, void *dxv, int64_t rows, int64_t D,
                                          bool add)
{
  __shared__ float buf[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T *x = (const T *)xv + r * D, *dy = (const T *)dyv + r * D;
    const T *g = (const T *)gv;
    T *dx = (T *)dxv + r * D;
    float mean = stats[2 * r], rstd = stats[2 * r + 1];
    float s1 = 0.f, s2 = 0.f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      float xh = (to_f<T>(x[j]) - mean) * rstd;
      float dxh = to_f<T>(dy[j]) * to_f<T>(g[j]);
      s1 += dxh;
      s2 += dxh * xh;
    }
    s1 = block_sum(s1, buf) / (float)D;
    s2 = block_sum(s2, buf) / (float)D;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      float xh = (to_f<T>(x[j]) - mean) * rstd;
      float v = rstd * (to_f<T>(dy[j]) * to_f<T>(g[j]) - s1 - xh * s2);
      dx[j] = from_f<T>(add ? to_f<T>(dx[j]) + v : v);
    }
  }
}

/* dgamma and dbeta: each block sums a chunk of rows for 256 columns, then adds. */
#define COLUMN_CHUNK 256

template <typename T>
__global__ void layernorm_params_kernel(const void *xv, const void *dyv, const float *stats,
                                        float *dg, float *db, int64_t rows, int64_t D)
{
  int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (j >= D)
    return;
  int64_t r0 = (int64_t)blockIdx.y * COLUMN_CHUNK;
  int64_t r1 = r0 + COLUMN_CHUNK < rows ? r0 + COLUMN_CHUNK : rows;
  float sg = 0.f, sb = 0.f;
  for (int64_t r = r0; r < r1; r++) {
    float dy = to_f<T>(((const T *)dyv)[r * D + j]);
    float xh = (to_f<T>(((const T *)xv)[r * D + j]) - stats[2 * r]) * stats[2 * r + 1];
    sg += dy * xh;
    sb += dy;
  }
  atomicAdd(dg + j, sg);
  atomicAdd(db + j, sb);
}

PcuStatus pcu_op_layernorm(PcuContext *ctx, const PcuOpArgs *a)
{
  int dt = a->dtype;
  int64_t D = rlast(a->in[0].region), R = D ? pcu_region_numel(&a->in[0].region) / D : 0;
  if (R == 0)
    return PCU_OK;
  float eps = a->eps > 0 ? (float)a->eps : 1e-5f;
  Scratch s(ctx);
  Dense x, g;
  TRY(dense_in(ctx, s, a->in[0], dt, &x));
  TRY(dense_in(ctx, s, a->w[0], dt, &g));
  if (a->phase == PCU_FORWARD) {
    Dense b, y;
    float *stats = NULL;
    TRY(dense_in(ctx, s, a->w[1], dt, &b));
    TRY(dense_out(ctx, s, a->out[0], dt, &y));
    TRY(saved_buffer(ctx, a->saved, 0, (size_t)(2 * R) * sizeof(float), (void **)&stats));
    LAUNCH_FLOAT(ctx, dt, layernorm_kernel, row_blocks(R), ROW_THREADS, x.p, g.p, b.p, y.p,
                 stats, R, D, eps);
    return dense_commit(ctx, a->out[0], y, false);
  }
  const float *stats = (const float *)saved_get(a->saved, 0, (size_t)(2 * R) * sizeof(float));
  if (!stats)
    return FAIL(ctx, PCU_ERR_INVALID, "a backward pass of layer norm without its forward pass");
  Dense dy;
  TRY(dense_in(ctx, s, a->out_grad[0], dt, &dy));
  if (present(a->in_grad[0])) {
    Dense dx;
    TRY(dense_out(ctx, s, a->in_grad[0], dt, &dx));
    LAUNCH_FLOAT(ctx, dt, layernorm_backward_kernel, row_blocks(R), ROW_THREADS, x.p, g.p, dy.p,
                 stats, dx.p, R, D, dense_adds(dx, true));
    TRY(dense_commit(ctx, a->in_grad[0], dx, true));
  }
  if (present(a->w_grad[0]) || present(a->w_grad[1])) {
    float *acc = NULL;
    TRY(scratch_tensor(s, PCU_F32, 2 * D, (void **)&acc));
    dim3 grid((unsigned)((D + 255) / 256), (unsigned)((R + COLUMN_CHUNK - 1) / COLUMN_CHUNK));
    if (grid.y > 65535)
      return FAIL(ctx, PCU_ERR_UNSUPPORTED, "a layer norm of more rows than one launch covers");
    LAUNCH_FLOAT(ctx, dt, layernorm_params_kernel, grid, 256, x.p, dy.p, stats, acc, acc + D, R,
                 D);
    for (int i = 0; i < 2; i++)
      if (present(a->w_grad[i])) {
        PcuView v = pcu_view_dense(acc + i * D, PCU_F32, &a->w_grad[i].region);
        TRY(pcu_copy(ctx, &a->w_grad[i].v, &v, &a->w_grad[i].region, 1));
      }
  }
  return PCU_OK;
}

/* ---------------------------------------------------------------------------------- */
/* Embedding                                                                           */

/* out[r, j] (+)= table[id - v0, j] for the ids of row r that fall in [v0, v0 + V): one
 * id per row, or @per_row ids summed (bags). */
template <typename T>
__global__ void embedding_kernel(const int64_t *ids, const void *tv, void *outv, int64_t rows,
                                 int64_t per_row, int64_t Dr, int64_t v0, int64_t V, bool add)
{
  const T *table = (const T *)tv;
  T *out = (T *)outv;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < rows * Dr;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = i / Dr, j = i % Dr;
    float v = 0.f;
    for (int64_t k = 0; k < per_row; k++) {
      int64_t id = ids[r * per_row + k] - v0;
      if (id >= 0 && id < V)
        v += to_f<T>(table[id * Dr + j]);
    }
    out[i] = from_f<T>(add ? to_f<T>(out[i]) + v : v);
  }
}

template <typename T>
__global__ void embedding_backward_kernel(const int64_t *ids, const void *dov, float *dt,
                                          int64_t rows, int64_t per_row, int64_t Dr, int64_t v0,
                                          int64_t V)
{
  const T *dout = (const T *)dov;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < rows * per_row * Dr;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t j = i % Dr, rk = i / Dr, r = rk / per_row;
    int64_t id = ids[rk] - v0;
    if (id >= 0 && id < V)
      atomicAdd(dt + id * Dr + j, to_f<T>(dout[r * Dr + j]));
  }
}

PcuStatus pcu_op_embedding(PcuContext *ctx, const PcuOpArgs *a)
{
  int dt = a->dtype;
  const PcuArg &IDS = a->in[0], &TAB = a->w[0];
  int64_t n_ids = pcu_region_numel(&IDS.region);
  int64_t Dr = rsize(TAB.region, 1), V = rsize(TAB.region, 0), v0 = TAB.region.lo[0];
  int64_t per_row = a->bags ? rlast(IDS.region) : 1;
  int64_t rows = per_row ? n_ids / per_row : 0;
  if (rows == 0 || Dr == 0)
    return PCU_OK;
  Scratch s(ctx);
  Dense ids;
  TRY(dense_in(ctx, s, IDS, PCU_I64, &ids));
  if (a->phase == PCU_FORWARD) {
    Dense tab, y;
    TRY(dense_in(ctx, s, TAB, dt, &tab));
    TRY(dense_out(ctx, s, a->out[0], dt, &y));
    LAUNCH_FLOAT(ctx, dt, embedding_kernel, pcu_blocks(rows * Dr), 256, (const int64_t *)ids.p,
                 tab.p, y.p, rows, per_row, Dr, v0, V, dense_adds(y, a->accumulate));
    return dense_commit(ctx, a->out[0], y, a->accumulate);
  }
  if (!present(a->w_grad[0]))
    return PCU_OK;
  Dense dy;
  TRY(dense_in(ctx, s, a->out_grad[0], dt, &dy));
  /* Rows hit by many ids are summed with fp32 atomics, in place when the gradient is a
   * dense fp32 region. */
  Dense dtab;
  TRY(dense_out(ctx, s, a->w_grad[0], PCU_F32, &dtab));
  LAUNCH_FLOAT(ctx, dt, embedding_backward_kernel, pcu_blocks(rows * per_row * Dr), 256,
               (const int64_t *)ids.p, dy.p, (float *)dtab.p, rows, per_row, Dr, v0, V);
  return dense_commit(ctx, a->w_grad[0], dtab, true);
}

/* ---------------------------------------------------------------------------------- */
/* Element-wise operators                                                              */

/* A strided operand that may also be walked linearly. */
struct Walk {
  Strided s;
  bool linear;
};

__device__ __forceinline__ int64_t walk_offset(const Walk &w, int64_t i)
{
  return w.linear ? i : strided_offset(w.s, i);
}

static Walk walk_of(const PcuArg &a)
{
  Walk w;
  w.s = pcu_flatten(pcu_strided(&a.v, &a.region));
  w.linear = pcu_view_is_dense_region(&a.v, &a.region);
  return w;
}

/* Walks the dtype of the operator; other element types are converted first. */
static PcuStatus walk_typed(PcuContext *ctx, Scratch &s, const PcuArg &a, int dtype, bool out,
                            Walk *w, Dense *d)
{
  if (a.v.dtype == dtype) {
    *w = walk_of(a);
    d->owned = false;
    return PCU_OK;
  }
  TRY(out ? dense_out(ctx, s, a, dtype, d) : dense_in(ctx, s, a, dtype, d));
  PcuView v = pcu_view_dense(d->p, dtype, &a.region);
  w->s = pcu_strided(&v, &a.region);
  w->linear = true;
  return PCU_OK;
}

template <typename T>
__global__ void unary_kernel(Walk x, Walk y, int64_t n, int kind, float scale)
{
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    ((T *)y.s.base)[walk_offset(y, i)] =
      from_f<T>(unary_f(kind, to_f<T>(((const T *)x.s.base)[walk_offset(x, i)]), scale));
}

template <typename T>
__global__ void unary_backward_kernel(Walk x, Walk dy, Walk dx, int64_t n, int kind, float scale)
{
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    float xv = to_f<T>(((const T *)x.s.base)[walk_offset(x, i)]);
    float g = to_f<T>(((const T *)dy.s.base)[walk_offset(dy, i)]) *
              unary_df(kind, xv, unary_f(kind, xv, scale), scale);
    T *d = (T *)dx.s.base + walk_offset(dx, i);
    *d = from_f<T>(to_f<T>(*d) + g);
  }
}

PcuStatus pcu_op_unary(PcuContext *ctx, const PcuOpArgs *a)
{
  int dt = a->dtype;
  int64_t n = pcu_region_numel(&a->out[0].region);
  if (n == 0)
    return PCU_OK;
  Scratch s(ctx);
  Walk x, y;
  Dense dx_, dy_;
  TRY(walk_typed(ctx, s, a->in[0], dt, false, &x, &dx_));
  if (a->phase == PCU_FORWARD) {
    TRY(walk_typed(ctx, s, a->out[0], dt, true, &y, &dy_));
    LAUNCH_FLOAT(ctx, dt, unary_kernel, pcu_blocks(n), 256, x, y, n, a->act, (float)a->scale);
    return dense_commit(ctx, a->out[0], dy_, false);
  }
  if (!present(a->in_grad[0]))
    return PCU_OK;
  Walk g, gx;
  Dense dg, dgx;
  TRY(walk_typed(ctx, s, a->out_grad[0], dt, false, &g, &dg));
  TRY(walk_typed(ctx, s, a->in_grad[0], dt, true, &gx, &dgx));
  LAUNCH_FLOAT(ctx, dt, unary_backward_kernel, pcu_blocks(n), 256, x, g, gx, n, a->act,
               (float)a->scale);
  return dense_commit(ctx, a->in_grad[0], dgx, true);
}

/* An input of a broadcasting operator walked in the output's order: dimensions it lacks or
 * stretches from 1 have stride 0. */
static Strided broadcast_walk(const PcuArg &in, const PcuRegion &out, bool *broadcast)
{
  Strided s = pcu_strided(&in.v, &in.region);
  Strided b = s;
  b.ndim = out.ndim;
  *broadcast = false;
  int shift = out.ndim - in.region.ndim;
  for (int d = 0; d < out.ndim; d++) {
    int t = d - shift;
    b.size[d] = out.hi[d] - out.lo[d];
    if (t < 0 || (rsize(in.region, t) == 1 && b.size[d] > 1)) {
      b.stride[d] = 0;
      *broadcast = *broadcast || b.size[d] > 1;
    } else {
      b.stride[d] = s.stride[t];
    }
  }
  return b;
}

/* The kinds of SimBinaryKind. */
enum { B_ADD, B_SUB, B_MUL, B_DIV };

__device__ __forceinline__ float binary_f(int kind, float x, float y)
{
  switch (kind) {
  case B_SUB: return x - y;
  case B_MUL: return x * y;
  case B_DIV: return x / y;
  default: return x + y;
  }
}

template <typename T>
__global__ void binary_kernel(Strided A, Strided B, Strided Y, int64_t n, int kind)
{
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    float x = to_f<T>(((const T *)A.base)[strided_offset(A, i)]);
    float y = to_f<T>(((const T *)B.base)[strided_offset(B, i)]);
    ((T *)Y.base)[strided_offset(Y, i)] = from_f<T>(binary_f(kind, x, y));
  }
}

/* Adds the gradient of input @which (0: a, 1: b) of every output element; into fp32
 * accumulators with atomics (where the input was broadcast, elements collide), or into the
 * gradient's own elements. */
template <typename T>
__global__ void binary_backward_kernel(Strided A, Strided B, Strided DY, Strided G, int64_t n,
                                       int kind, int which, bool atomic)
{
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    float dy = to_f<T>(((const T *)DY.base)[strided_offset(DY, i)]);
    /* Sums and differences pass the gradient on without reading their operands. */
    bool reads = kind == B_MUL || kind == B_DIV;
    float x = reads ? to_f<T>(((const T *)A.base)[strided_offset(A, i)]) : 0.f;
    float y = reads ? to_f<T>(((const T *)B.base)[strided_offset(B, i)]) : 0.f;
    float g;
    if (which == 0)
      g = kind == B_MUL ? dy * y : kind == B_DIV ? dy / y : dy;
    else
      g = kind == B_ADD ? dy : kind == B_SUB ? -dy : kind == B_MUL ? dy * x : -dy * x / (y * y);
    int64_t off = strided_offset(G, i);
    if (atomic) {
      atomicAdd((float *)G.base + off, g);
    } else {
      T *d = (T *)G.base + off;
      *d = from_f<T>(to_f<T>(*d) + g);
    }
  }
}

PcuStatus pcu_op_binary(PcuContext *ctx, const PcuOpArgs *a)
{
  int dt = a->dtype;
  const PcuRegion &O = a->out[0].region;
  int64_t n = pcu_region_numel(&O);
  if (n == 0)
    return PCU_OK;
  Scratch s(ctx);
  /* Operands of another element type are converted into dense scratch first. */
  PcuArg in[2] = { a->in[0], a->in[1] };
  for (int j = 0; j < 2; j++)
    if (in[j].v.dtype != dt) {
      Dense d;
      TRY(dense_in(ctx, s, a->in[j], dt, &d));
      in[j].v = pcu_view_dense(d.p, dt, &a->in[j].region);
    }
  bool ba, bb;
  Strided A = pcu_flatten(broadcast_walk(in[0], O, &ba));
  Strided B = pcu_flatten(broadcast_walk(in[1], O, &bb));
  if (a->phase == PCU_FORWARD) {
    Dense y;
    TRY(dense_out(ctx, s, a->out[0], dt, &y));
    PcuView yv = y.owned ? pcu_view_dense(y.p, dt, &O) : a->out[0].v;
    LAUNCH_FLOAT(ctx, dt, binary_kernel, pcu_blocks(n), 256, A, B,
                 pcu_flatten(pcu_strided(&yv, &O)), n,
                 a->kind);
    return dense_commit(ctx, a->out[0], y, false);
  }
  Dense dy;
  TRY(dense_in(ctx, s, a->out_grad[0], dt, &dy));
  PcuView dyv = pcu_view_dense(dy.p, dt, &O);
  Strided DY = pcu_flatten(pcu_strided(&dyv, &O));
  for (int j = 0; j < 2; j++) {
    const PcuArg &G = a->in_grad[j];
    if (!present(G))
      continue;
    bool broadcast = j == 0 ? ba : bb;
    if (!broadcast && G.v.dtype == dt) {
      /* Every output element has its own gradient element: add in place. */
      bool dummy;
      Strided g = pcu_flatten(broadcast_walk(G, O, &dummy));
      LAUNCH_FLOAT(ctx, dt, binary_backward_kernel, pcu_blocks(n), 256, A, B, DY, g, n, a->kind,
                   j, false);
      continue;
    }
    float *acc = NULL;
    int64_t m = pcu_region_numel(&G.region);
    TRY(scratch_tensor(s, PCU_F32, m, (void **)&acc));
    PcuView av = pcu_view_dense(acc, PCU_F32, &G.region);
    PcuArg ga = G;
    ga.v = av;
    bool dummy;
    Strided g = pcu_flatten(broadcast_walk(ga, O, &dummy));
    LAUNCH_FLOAT(ctx, dt, binary_backward_kernel, pcu_blocks(n), 256, A, B, DY, g, n, a->kind, j,
                 true);
    TRY(pcu_copy(ctx, &G.v, &av, &G.region, 1));
  }
  return PCU_OK;
}

/* ---------------------------------------------------------------------------------- */
/* Dropout                                                                             */

/* Element i of the region is element ((lo + c) with the sample offset on dimension 0) of
 * the whole batch's tensor of shape @full, whose row-major index keys the hash. */
struct GlobalIndex {
  int ndim;
  int64_t size[PCU_MAX_DIMS];
  int64_t lo[PCU_MAX_DIMS];
  int64_t full[PCU_MAX_DIMS];
};

__device__ __forceinline__ uint64_t global_index(const GlobalIndex &g, int64_t i)
{
  /* The sum of each coordinate times the whole tensor's stride, innermost first; unrolled
   * for constant indices (see strided_offset). */
  uint64_t flat = 0, scale = 1;
#pragma unroll
  for (int d = PCU_MAX_DIMS - 1; d >= 0; d--)
    if (d < g.ndim) {
      int64_t c = d > 0 ? i % g.size[d] : i;
      if (d > 0)
        i /= g.size[d];
      flat += (uint64_t)(c + g.lo[d]) * scale;
      scale *= (uint64_t)g.full[d];
    }
  return flat;
}

template <typename T>
__global__ void dropout_kernel(Walk x, Walk y, GlobalIndex gi, int64_t n, uint64_t name_hash,
                               int step, double p, bool add)
{
  float scale = 1.f / (1.f - (float)p);
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    float v = dropout_keep(name_hash, global_index(gi, i), step, p)
                ? to_f<T>(((const T *)x.s.base)[walk_offset(x, i)]) * scale
                : 0.f;
    T *d = (T *)y.s.base + walk_offset(y, i);
    *d = from_f<T>(add ? to_f<T>(*d) + v : v);
  }
}

PcuStatus pcu_op_dropout(PcuContext *ctx, const PcuOpArgs *a)
{
  int dt = a->dtype;
  const PcuRegion &R = a->out[0].region;
  int64_t n = pcu_region_numel(&R);
  if (n == 0)
    return PCU_OK;
  GlobalIndex gi;
  gi.ndim = R.ndim;
  for (int d = 0; d < R.ndim; d++) {
    gi.size[d] = rsize(R, d);
    gi.lo[d] = R.lo[d] + (d == 0 ? a->sample_offset : 0);
    gi.full[d] = d < a->full_ndim ? a->full[d] : R.hi[d];
  }
  Scratch s(ctx);
  bool fwd = a->phase == PCU_FORWARD;
  const PcuArg &src = fwd ? a->in[0] : a->out_grad[0];
  const PcuArg &dst = fwd ? a->out[0] : a->in_grad[0];
  if (!present(dst))
    return PCU_OK;
  Walk x, y;
  Dense dx_, dy_;
  TRY(walk_typed(ctx, s, src, dt, false, &x, &dx_));
  TRY(walk_typed(ctx, s, dst, dt, true, &y, &dy_));
  LAUNCH_FLOAT(ctx, dt, dropout_kernel, pcu_blocks(n), 256, x, y, gi, n, a->name_hash, a->step,
               a->p, !fwd && !dy_.owned);
  return dense_commit(ctx, dst, dy_, !fwd);
}

/* ---------------------------------------------------------------------------------- */
/* Concat, split, reshape, transpose                                                   */

/* @dst's region @rd (+)= @src's region @rs, equal in elements, matched in row-major order. */
static PcuStatus copy_between(PcuContext *ctx, const PcuView &dst, const PcuRegion &rd,
                              const PcuView &src, const PcuRegion &rs, bool accumulate)
{
  if (pcu_region_numel(&rd) != pcu_region_numel(&rs))
    return FAIL(ctx, PCU_ERR_INVALID, "regions of different sizes to copy");
  if (pcu_region_numel(&rd) == 0)
    return PCU_OK;
  /* Copy through a dense staging buffer when the two orders differ in shape. */
  Scratch s(ctx);
  PcuArg from;
  from.v = src;
  from.region = rs;
  Dense d;
  TRY(dense_in(ctx, s, from, dst.dtype, &d));
  PcuView dv = pcu_view_dense(d.p, dst.dtype, &rd);
  return pcu_copy(ctx, &dst, &dv, &rd, accumulate);
}

/* The region @r moved by @shift along @axis. */
static PcuRegion shifted(const PcuRegion &r, int axis, int64_t shift)
{
  PcuRegion o = r;
  o.lo[axis] += shift;
  o.hi[axis] += shift;
  return o;
}

PcuStatus pcu_op_shape(PcuContext *ctx, const PcuOpArgs *a)
{
  bool fwd = a->phase == PCU_FORWARD;
  switch (a->type) {
  case OP_CONCAT:
  case OP_SPLIT: {
    /* Part i (concat's input, split's output) sits at part_offset[i] along the axis of
     * the whole tensor (concat's output, split's input). */
    bool concat = a->type == OP_CONCAT;
    int parts = concat ? a->n_inputs : a->n_outputs;
    const PcuArg &whole = concat ? a->out[0] : a->in[0];
    const PcuArg &whole_grad = concat ? a->out_grad[0] : a->in_grad[0];
    for (int i = 0; i < parts; i++) {
      const PcuArg &part = concat ? a->in[i] : a->out[i];
      const PcuArg &part_grad = concat ? a->in_grad[i] : a->out_grad[i];
      const PcuRegion &pr = part.region;
      if (pcu_region_numel(&pr) == 0)
        continue;
      PcuRegion wr = shifted(pr, a->axis, a->part_offset[i]);
      if (fwd) {
        if (concat)
          TRY(copy_between(ctx, whole.v, wr, part.v, pr, a->accumulate != 0));
        else
          TRY(copy_between(ctx, part.v, pr, whole.v, wr, false));
      } else if (concat && present(part_grad)) {
        TRY(copy_between(ctx, part_grad.v, pr, whole_grad.v, wr, true));
      } else if (!concat && present(whole_grad) && present(part_grad)) {
        TRY(copy_between(ctx, whole_grad.v, wr, part_grad.v, pr, true));
      }
    }
    return PCU_OK;
  }
  case OP_RESHAPE:
    if (fwd)
      return copy_between(ctx, a->out[0].v, a->out[0].region, a->in[0].v, a->in[0].region,
                          false);
    if (!present(a->in_grad[0]))
      return PCU_OK;
    return copy_between(ctx, a->in_grad[0].v, a->in[0].region, a->out_grad[0].v,
                        a->out[0].region, true);
  case OP_TRANSPOSE: {
    if (fwd)
      return pcu_copy_permuted(ctx, &a->out[0].v, &a->in[0].v, &a->out[0].region, a->perm,
                               a->accumulate);
    if (!present(a->in_grad[0]))
      return PCU_OK;
    int inv[PCU_MAX_DIMS];
    for (int d = 0; d < a->out[0].region.ndim; d++)
      inv[a->perm[d]] = d;
    return pcu_copy_permuted(ctx, &a->in_grad[0].v, &a->out_grad[0].v, &a->in[0].region, inv,
                             1);
  }
  default:
    return FAIL(ctx, PCU_ERR_INVALID, "not a shape operator");
  }
}
