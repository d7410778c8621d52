/* kernels-llm.cu — the operators of LLaMA-style blocks (sim/ops/norm.c, sim/ops/moe.c,
 * sim/ops/attention.c give the formulas; exec/cpu/kernels-norm.c, kernels-moe.c and
 * kernels-attention.c are the references): RMS norm, the gated MLP (SwiGLU, GeGLU), and
 * the pieces attention takes for rotary embeddings and grouped-query heads. */
#include "rows.cuh"

#include <math.h>

/* ---------------------------------------------------------------------------------- */
/* RMS norm over the last dimension: y = x rstd gamma, rstd = 1 / sqrt(mean(x^2) + eps)  */

template <typename T>
__global__ void rmsnorm_kernel(const void *xv, const void *gv, void *yv, float *rstd,
                               int64_t rows, int64_t D, float eps)
{
  __shared__ float buf[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T *x = (const T *)xv + r * D;
    T *y = (T *)yv + r * D;
    float sq = 0.f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      float v = to_f<T>(x[j]);
      sq += v * v;
    }
    float rs = rsqrtf(block_sum(sq, buf) / (float)D + eps);
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x)
      y[j] = from_f<T>(to_f<T>(x[j]) * rs * to_f<T>(((const T *)gv)[j]));
    if (threadIdx.x == 0)
      rstd[r] = rs;
  }
}

/* dx (+)= rstd (g - xhat mean(g xhat)), g = dy gamma, xhat = x rstd. */
template <typename T>
__global__ void rmsnorm_backward_kernel(const void *xv, const void *gv, const void *dyv,
                                        const float *rstd, void *dxv, int64_t rows, int64_t D,
                                        bool add)
{
  __shared__ float buf[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T *x = (const T *)xv + r * D, *dy = (const T *)dyv + r * D;
    const T *g = (const T *)gv;
    T *dx = (T *)dxv + r * D;
    float rs = rstd[r], s = 0.f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x)
      s += to_f<T>(dy[j]) * to_f<T>(g[j]) * to_f<T>(x[j]) * rs;
    s = block_sum(s, buf) / (float)D;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      float v = rs * (to_f<T>(dy[j]) * to_f<T>(g[j]) - to_f<T>(x[j]) * rs * s);
      dx[j] = from_f<T>(add ? to_f<T>(dx[j]) + v : v);
    }
  }
}

/* dgamma: each block sums a chunk of rows for 256 columns, then adds. */
#define RMS_CHUNK 256

template <typename T>
__global__ void rmsnorm_gamma_kernel(const void *xv, const void *dyv, const float *rstd,
                                     float *dg, int64_t rows, int64_t D)
{
  int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (j >= D)
    return;
  int64_t r0 = (int64_t)blockIdx.y * RMS_CHUNK;
  int64_t r1 = r0 + RMS_CHUNK < rows ? r0 + RMS_CHUNK : rows;
  float sg = 0.f;
  for (int64_t r = r0; r < r1; r++)
    sg += to_f<T>(((const T *)dyv)[r * D + j]) * to_f<T>(((const T *)xv)[r * D + j]) * rstd[r];
  atomicAdd(dg + j, sg);
}

PcuStatus pcu_op_rmsnorm(PcuContext *ctx, const PcuOpArgs *a)
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
    Dense y;
    float *rstd = NULL;
    TRY(dense_out(ctx, s, a->out[0], dt, &y));
    TRY(saved_buffer(ctx, a->saved, 0, (size_t)R * sizeof(float), (void **)&rstd));
    LAUNCH_FLOAT(ctx, dt, rmsnorm_kernel, row_blocks(R), ROW_THREADS, x.p, g.p, y.p, rstd, R, D,
                 eps);
    return dense_commit(ctx, a->out[0], y, false);
  }
  const float *rstd = (const float *)saved_get(a->saved, 0, (size_t)R * sizeof(float));
  if (!rstd)
    return FAIL(ctx, PCU_ERR_INVALID, "a backward pass of RMS norm without its forward pass");
  Dense dy;
  TRY(dense_in(ctx, s, a->out_grad[0], dt, &dy));
  if (present(a->in_grad[0])) {
    Dense dx;
    TRY(dense_out(ctx, s, a->in_grad[0], dt, &dx));
    LAUNCH_FLOAT(ctx, dt, rmsnorm_backward_kernel, row_blocks(R), ROW_THREADS, x.p, g.p, dy.p,
                 rstd, dx.p, R, D, dense_adds(dx, true));
    TRY(dense_commit(ctx, a->in_grad[0], dx, true));
  }
  if (present(a->w_grad[0])) {
    float *acc = NULL;
    TRY(scratch_tensor(s, PCU_F32, D, (void **)&acc));
    dim3 grid((unsigned)((D + 255) / 256), (unsigned)((R + RMS_CHUNK - 1) / RMS_CHUNK));
    if (grid.y > 65535)
      return FAIL(ctx, PCU_ERR_UNSUPPORTED, "an RMS norm of more rows than one launch covers");
    LAUNCH_FLOAT(ctx, dt, rmsnorm_gamma_kernel, grid, 256, x.p, dy.p, rstd, acc, R, D);
    PcuView v = pcu_view_dense(acc, PCU_F32, &a->w_grad[0].region);
    TRY(pcu_copy(ctx, &a->w_grad[0].v, &v, &a->w_grad[0].region, 1));
  }
  return PCU_OK;
}

/* ---------------------------------------------------------------------------------- */
/* Gated MLP: Y (+)= (act(X Wg) * (X Wu)) Wd over the shard's columns f                  */

/* h = act(g) * u. */
template <typename T>
__global__ void glu_kernel(const void *gv, const void *uv, void *hv, int64_t n, int act)
{
  const T *g = (const T *)gv, *u = (const T *)uv;
  T *h = (T *)hv;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    h[i] = from_f<T>(unary_f(act, to_f<T>(g[i]), 1.f) * to_f<T>(u[i]));
}

/* dg = dh u act'(g), du = dh act(g). */
template <typename T>
__global__ void glu_backward_kernel(const void *dhv, const void *gv, const void *uv, void *dgv,
                                    void *duv, int64_t n, int act)
{
  const T *dh = (const T *)dhv, *g = (const T *)gv, *u = (const T *)uv;
  T *dg = (T *)dgv, *du = (T *)duv;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    float x = to_f<T>(g[i]), y = unary_f(act, x, 1.f), d = to_f<T>(dh[i]);
    dg[i] = from_f<T>(d * to_f<T>(u[i]) * unary_df(act, x, y, 1.f));
    du[i] = from_f<T>(d * y);
  }
}

enum { GLU_G, GLU_U };

PcuStatus pcu_op_gated_mlp(PcuContext *ctx, const PcuOpArgs *a)
{
  const PcuArg &X = a->in[0], &Y = a->out[0];
  int dt = a->dtype;
  size_t es = (size_t)pcu_dtype_size(dt);
  int64_t D = rlast(X.region), F = rlast(a->w[0].region);
  int64_t M = D ? pcu_region_numel(&X.region) / D : 0;
  if (M == 0 || D == 0)
    return PCU_OK;
  Scratch s(ctx);
  Dense x, wg, wu, wd;
  TRY(dense_in(ctx, s, X, dt, &x));
  TRY(dense_in(ctx, s, a->w[0], dt, &wg));
  TRY(dense_in(ctx, s, a->w[1], dt, &wu));
  TRY(dense_in(ctx, s, a->w[2], dt, &wd));
  void *H = NULL;
  TRY(scratch_tensor(s, dt, M * F, &H));
  if (a->phase == PCU_FORWARD) {
    void *G, *U;
    TRY(saved_buffer(ctx, a->saved, GLU_G, (size_t)(M * F) * es, &G));
    TRY(saved_buffer(ctx, a->saved, GLU_U, (size_t)(M * F) * es, &U));
    TRY(pcu_gemm(ctx, dt, false, false, M, F, D, 1.f, x.p, D, 0, wg.p, F, 0, 0.f, G, F, 0, 1));
    TRY(pcu_gemm(ctx, dt, false, false, M, F, D, 1.f, x.p, D, 0, wu.p, F, 0, 0.f, U, F, 0, 1));
    LAUNCH_FLOAT(ctx, dt, glu_kernel, pcu_blocks(M * F), 256, G, U, H, M * F, a->act);
    Dense y;
    TRY(dense_out(ctx, s, Y, dt, &y));
    TRY(pcu_gemm(ctx, dt, false, false, M, D, F, 1.f, H, F, 0, wd.p, D, 0,
                 dense_adds(y, a->accumulate) ? 1.f : 0.f, y.p, D, 0, 1));
    return dense_commit(ctx, Y, y, a->accumulate);
  }
  const void *G = saved_get(a->saved, GLU_G, (size_t)(M * F) * es);
  const void *U = saved_get(a->saved, GLU_U, (size_t)(M * F) * es);
  if (!G || !U)
    return FAIL(ctx, PCU_ERR_INVALID, "a backward pass of the gated MLP without its forward pass");
  LAUNCH_FLOAT(ctx, dt, glu_kernel, pcu_blocks(M * F), 256, G, U, H, M * F, a->act);
  Dense dy;
  TRY(dense_in(ctx, s, a->out_grad[0], dt, &dy));
  void *dH = NULL, *dG = NULL, *dU = NULL;
  TRY(scratch_tensor(s, dt, M * F, &dH));
  TRY(scratch_tensor(s, dt, M * F, &dG));
  TRY(scratch_tensor(s, dt, M * F, &dU));
  /* dH = dY Wd^T; dWd += H^T dY. */
  TRY(pcu_gemm(ctx, dt, false, true, M, F, D, 1.f, dy.p, D, 0, wd.p, D, 0, 0.f, dH, F, 0, 1));
  if (present(a->w_grad[2])) {
    Dense dw;
    TRY(dense_out(ctx, s, a->w_grad[2], dt, &dw));
    TRY(pcu_gemm(ctx, dt, true, false, F, D, M, 1.f, H, F, 0, dy.p, D, 0,
                 dense_adds(dw, true) ? 1.f : 0.f, dw.p, D, 0, 1));
    TRY(dense_commit(ctx, a->w_grad[2], dw, true));
  }
  LAUNCH_FLOAT(ctx, dt, glu_backward_kernel, pcu_blocks(M * F), 256, dH, G, U, dG, dU, M * F,
               a->act);
  /* dWg += X^T dG, dWu += X^T dU. */
  const void *dgu[2] = { dG, dU };
  for (int i = 0; i < 2; i++)
    if (present(a->w_grad[i])) {
      Dense dw;
      TRY(dense_out(ctx, s, a->w_grad[i], dt, &dw));
      TRY(pcu_gemm(ctx, dt, true, false, D, F, M, 1.f, x.p, D, 0, dgu[i], F, 0,
                   dense_adds(dw, true) ? 1.f : 0.f, dw.p, F, 0, 1));
      TRY(dense_commit(ctx, a->w_grad[i], dw, true));
    }
  /* dX (+)= dG Wg^T + dU Wu^T. */
  if (present(a->in_grad[0])) {
    Dense dx;
    TRY(dense_out(ctx, s, a->in_grad[0], dt, &dx));
    TRY(pcu_gemm(ctx, dt, false, true, M, D, F, 1.f, dG, F, 0, wg.p, F, 0,
                 dense_adds(dx, true) ? 1.f : 0.f, dx.p, D, 0, 1));
    TRY(pcu_gemm(ctx, dt, false, true, M, D, F, 1.f, dU, F, 0, wu.p, F, 0, 1.f, dx.p, D, 0, 1));
    TRY(dense_commit(ctx, a->in_grad[0], dx, true));
  }
  return PCU_OK;
}

/* ---------------------------------------------------------------------------------- */
/* Rotary embeddings and grouped-query heads (ops.cu, attention)                        */

/* Rotates each head of the rows of X [rows, nh * E]: row r is position pos0 + r % S; element
 * i of a head turns with element i + E/2 by pos base^(-2 i / E), or back with sign -1.  The
 * angles are computed in double precision, as the reference does. */
template <typename T>
__global__ void rope_kernel(void *xv, int64_t rows, int64_t S, int64_t pos0, int64_t nh,
                            int64_t E, double base, double sign)
{
  T *X = (T *)xv;
  int64_t half = E / 2, n = rows * nh * half;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t k = i % half, t = i / half;
    int64_t h = t % nh, r = t / nh;
    double th = (double)(pos0 + r % S) * pow(base, -2.0 * (double)k / (double)E);
    double c = cos(th), sn = sign * sin(th);
    T *x = X + r * nh * E + h * E;
    double u = to_f<T>(x[k]), v = to_f<T>(x[k + half]);
    x[k] = from_f<T>((float)(u * c - v * sn));
    x[k + half] = from_f<T>((float)(v * c + u * sn));
  }
}

PcuStatus pcu_rope(PcuContext *ctx, int dtype, void *X, int64_t rows, int64_t S, int64_t pos0,
                   int64_t nh, int64_t E, double base, double sign)
{
  int64_t n = rows * nh * (E / 2);
  if (n == 0)
    return PCU_OK;
  LAUNCH_FLOAT(ctx, dtype, rope_kernel, pcu_blocks(n), 256, X, rows, S, pos0, nh, E, base, sign);
  return PCU_OK;
}

/* out[r, g E + e] = sum over j < group of in[r, (g group + j) E + e]. */
template <typename T>
__global__ void head_groups_kernel(const void *inv, void *outv, int64_t rows, int64_t n_kv,
                                   int64_t group, int64_t E)
{
  const T *in = (const T *)inv;
  T *out = (T *)outv;
  int64_t n = rows * n_kv * E;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t e = i % E, t = i / E;
    int64_t g = t % n_kv, r = t / n_kv;
    float acc = 0.f;
    for (int64_t j = 0; j < group; j++)
      acc += to_f<T>(in[(r * n_kv * group + g * group + j) * E + e]);
    out[i] = from_f<T>(acc);
  }
}

PcuStatus pcu_sum_head_groups(PcuContext *ctx, int dtype, const void *in, void *out,
                              int64_t rows, int64_t n_kv, int64_t group, int64_t E)
{
  int64_t n = rows * n_kv * E;
  if (n == 0)
    return PCU_OK;
  LAUNCH_FLOAT(ctx, dtype, head_groups_kernel, pcu_blocks(n), 256, in, out, rows, n_kv, group, E);
  return PCU_OK;
}

/* ---------------------------------------------------------------------------------- */
/* Mixture of experts: router softmax, top-k dispatch, experts, weighted combine        */

/* Per token: softmax of the logits (in double), the top k (ties to the lower index) and
 * their weights.  P [rows, E], pick and wgt [rows, k], psum [rows] (the picks' mass). */
__global__ void moe_route_kernel(const float *logits, int64_t rows, int64_t E, int64_t k,
                                 int normalize, float *P, int *pick, float *wgt, float *psum)
{
  for (int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r < rows;
       r += (int64_t)gridDim.x * blockDim.x) {
    const float *l = logits + r * E;
    float *p = P + r * E;
    double mx = -INFINITY, s = 0;
    for (int64_t e = 0; e < E; e++)
      mx = fmax(mx, (double)l[e]);
    for (int64_t e = 0; e < E; e++)
      s += exp((double)l[e] - mx);
    for (int64_t e = 0; e < E; e++)
      p[e] = (float)(exp((double)l[e] - mx) / s);
    double sum = 0;
    for (int64_t j = 0; j < k; j++) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; e++) {
        bool taken = false;
        for (int64_t i = 0; i < j; i++)
          taken |= pick[r * k + i] == e;
        if (!taken && (best < 0 || p[e] > p[best]))
          best = e;
      }
      pick[r * k + j] = (int)best;
      sum += p[best];
    }
    psum[r] = (float)sum;
    for (int64_t j = 0; j < k; j++)
      wgt[r * k + j] = normalize ? (float)(p[pick[r * k + j]] / sum) : p[pick[r * k + j]];
  }
}

/* dst[t] = src[idx[t]], rows of @D. */
__global__ void moe_gather_kernel(const float *src, const int64_t *idx, int64_t n, int64_t D,
                                  float *dst)
{
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n * D;
       i += (int64_t)gridDim.x * blockDim.x)
    dst[i] = src[idx[i / D] * D + i % D];
}

/* dst[idx[t]] += (wgt ? wgt[slot[t]] : 1) src[t]: each token once per expert, so one
 * expert's launch writes every row at most once. */
__global__ void moe_scatter_kernel(float *dst, const int64_t *idx, const int64_t *slot,
                                   const float *wgt, int64_t n, int64_t D, const float *src)
{
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n * D;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t t = i / D;
    dst[idx[t] * D + i % D] += (wgt ? wgt[slot[t]] : 1.f) * src[i];
  }
}

/* dw[slot[t]] = dy[t] . o[t]; dys[t] = wgt[slot[t]] dy[t]. */
__global__ void moe_weight_grad_kernel(const float *dy, const float *o, const int64_t *slot,
                                       const float *wgt, int64_t n, int64_t D, float *dw,
                                       float *dys)
{
  for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < n;
       t += (int64_t)gridDim.x * blockDim.x) {
    double acc = 0;
    float w = wgt[slot[t]];
    for (int64_t c = 0; c < D; c++) {
      acc += (double)dy[t * D + c] * o[t * D + c];
      dys[t * D + c] = w * dy[t * D + c];
    }
    dw[slot[t]] = (float)acc;
  }
}

/* The router's backward: through the renormalization and the softmax to the logits. */
__global__ void moe_router_backward_kernel(const float *P, const int *pick, const float *psum,
                                           const float *dw, int64_t rows, int64_t E, int64_t k,
                                           int normalize, float *dl, bool add)
{
  for (int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r < rows;
       r += (int64_t)gridDim.x * blockDim.x) {
    const float *p = P + r * E;
    double sum = psum[r], mix = 0, dot = 0;
    for (int64_t j = 0; j < k; j++)
      mix += (double)dw[r * k + j] * p[pick[r * k + j]];
    for (int64_t j = 0; j < k; j++) {
      int e = pick[r * k + j];
      double dp = normalize ? dw[r * k + j] / sum - mix / (sum * sum) : dw[r * k + j];
      dot += p[e] * dp;
    }
    for (int64_t e = 0; e < E; e++) {
      double dp = 0;
      for (int64_t j = 0; j < k; j++)
        if (pick[r * k + j] == e)
          dp = normalize ? dw[r * k + j] / sum - mix / (sum * sum) : dw[r * k + j];
      float v = (float)(p[e] * (dp - dot));
      dl[r * E + e] = add ? dl[r * E + e] + v : v;
    }
  }
}

enum { MOE_P, MOE_PICK, MOE_W, MOE_SUM };

/* The tokens each local expert takes: for expert x0 + e, entries off[e] .. off[e + 1] of
 * idx (the token) and slot (token * k + j, its place among the token's picks), uploaded
 * into scratch.  The picks come to the host: the dispatch is sized by them. */
static PcuStatus moe_dispatch(PcuContext *ctx, Scratch &s, const int *pick_d, int64_t rows,
                              int64_t k, int64_t x0, int64_t x1, int64_t *off, int64_t **idx_d,
                              int64_t **slot_d)
{
  int64_t nx = x1 - x0, n = rows * k;
  int *pick = (int *)malloc((size_t)(n > 0 ? n : 1) * sizeof(int));
  int64_t *idx = (int64_t *)malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
  int64_t *slot = (int64_t *)malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
  if (!pick || !idx || !slot) {
    free(pick);
    free(idx);
    free(slot);
    return FAIL(ctx, PCU_ERR_NO_MEMORY, "host memory for the dispatch of a mixture of experts");
  }
  PcuStatus st = PCU_OK;
  cudaError_t e1 = cudaMemcpyAsync(pick, pick_d, (size_t)n * sizeof(int), cudaMemcpyDeviceToHost,
                                   ctx->stream);
  cudaError_t e2 = e1 == cudaSuccess ? cudaStreamSynchronize(ctx->stream) : e1;
  if (e2 != cudaSuccess)
    st = pcu_fail_cuda(ctx, e2, __FILE__, __LINE__, "copying the router's picks");
  int64_t m = 0;
  for (int64_t e = 0; st == PCU_OK && e < nx; e++) {
    off[e] = m;
    for (int64_t t = 0; t < rows; t++)
      for (int64_t j = 0; j < k; j++)
        if (pick[t * k + j] == x0 + e) {
          idx[m] = t;
          slot[m] = t * k + j;
          m++;
        }
  }
  off[nx] = m;
  if (st == PCU_OK)
    st = s.alloc((size_t)(m > 0 ? m : 1) * sizeof(int64_t), (void **)idx_d);
  if (st == PCU_OK)
    st = s.alloc((size_t)(m > 0 ? m : 1) * sizeof(int64_t), (void **)slot_d);
  if (st == PCU_OK && m > 0) {
    cudaError_t e = cudaMemcpyAsync(*idx_d, idx, (size_t)m * sizeof(int64_t),
                                    cudaMemcpyHostToDevice, ctx->stream);
    if (e == cudaSuccess)
      e = cudaMemcpyAsync(*slot_d, slot, (size_t)m * sizeof(int64_t), cudaMemcpyHostToDevice,
                          ctx->stream);
    /* Pageable host memory: the copies have taken the data when they return, but wait
     * anyway before freeing it. */
    if (e == cudaSuccess)
      e = cudaStreamSynchronize(ctx->stream);
    if (e != cudaSuccess)
      st = pcu_fail_cuda(ctx, e, __FILE__, __LINE__, "uploading the dispatch");
  }
  free(pick);
  free(idx);
  free(slot);
  return st;
}

PcuStatus pcu_op_moe(PcuContext *ctx, const PcuOpArgs *a)
{
  enum { MB, MS, MX, MF, MD };
  if (a->dtype != PCU_F32)
    return FAIL(ctx, PCU_ERR_UNSUPPORTED, "the mixture of experts computes in fp32 only");
  const PcuArg &X = a->in[0], &Lg = a->in[1], &Y = a->out[0];
  int64_t D = rlast(X.region), R = D ? pcu_region_numel(&X.region) / D : 0;
  int64_t E = a->experts, K = a->top_k, x0 = a->lo[MX], x1 = a->hi[MX], nx = x1 - x0;
  int64_t F = a->hi[MF] - a->lo[MF];
  if (R == 0 || D == 0)
    return PCU_OK;
  if (K < 1 || K > E || rlast(Lg.region) != E)
    return FAIL(ctx, PCU_ERR_INVALID, "a mixture of experts whose logits or top k do not fit");
  size_t fb = sizeof(float);
  Scratch s(ctx);
  Dense x, lg, wg, wu, wd;
  TRY(dense_in(ctx, s, X, PCU_F32, &x));
  TRY(dense_in(ctx, s, Lg, PCU_F32, &lg));
  TRY(dense_in(ctx, s, a->w[0], PCU_F32, &wg));
  TRY(dense_in(ctx, s, a->w[1], PCU_F32, &wu));
  TRY(dense_in(ctx, s, a->w[2], PCU_F32, &wd));
  float *P, *wgt, *psum;
  int *pick;
  bool fwd = a->phase == PCU_FORWARD;
  if (fwd) {
    TRY(saved_buffer(ctx, a->saved, MOE_P, (size_t)(R * E) * fb, (void **)&P));
    TRY(saved_buffer(ctx, a->saved, MOE_PICK, (size_t)(R * K) * sizeof(int), (void **)&pick));
    TRY(saved_buffer(ctx, a->saved, MOE_W, (size_t)(R * K) * fb, (void **)&wgt));
    TRY(saved_buffer(ctx, a->saved, MOE_SUM, (size_t)R * fb, (void **)&psum));
    moe_route_kernel<<<pcu_blocks(R), 256, 0, ctx->stream>>>((const float *)lg.p, R, E, K,
                                                             a->normalize_top_k, P, pick, wgt,
                                                             psum);
    LAUNCH_CHECK(ctx);
  } else {
    P = (float *)saved_get(a->saved, MOE_P, (size_t)(R * E) * fb);
    pick = (int *)saved_get(a->saved, MOE_PICK, (size_t)(R * K) * sizeof(int));
    wgt = (float *)saved_get(a->saved, MOE_W, (size_t)(R * K) * fb);
    psum = (float *)saved_get(a->saved, MOE_SUM, (size_t)R * fb);
    if (!P || !pick || !wgt || !psum)
      return FAIL(ctx, PCU_ERR_INVALID, "a backward pass of the mixture without its forward pass");
  }
  int64_t *off = (int64_t *)calloc((size_t)nx + 1, sizeof(int64_t));
  if (!off)
    return FAIL(ctx, PCU_ERR_NO_MEMORY, "host memory for the dispatch of a mixture of experts");
  int64_t *idx = NULL, *slot = NULL;
  PcuStatus st = moe_dispatch(ctx, s, pick, R, K, x0, x1, off, &idx, &slot);
  int64_t most = 0;
  for (int64_t e = 0; e < nx; e++)
    most = off[e + 1] - off[e] > most ? off[e + 1] - off[e] : most;
  /* Per expert: its tokens' rows, G and U, H = act(G) U, the expert's output O. */
  float *Xe = NULL, *G = NULL, *U = NULL, *H = NULL, *O = NULL;
  int64_t cap = most > 0 ? most : 1;
  if (st == PCU_OK)
    st = scratch_tensor(s, PCU_F32, cap * D, (void **)&Xe);
  if (st == PCU_OK)
    st = scratch_tensor(s, PCU_F32, cap * F, (void **)&G);
  if (st == PCU_OK)
    st = scratch_tensor(s, PCU_F32, cap * F, (void **)&U);
  if (st == PCU_OK)
    st = scratch_tensor(s, PCU_F32, cap * F, (void **)&H);
  if (st == PCU_OK)
    st = scratch_tensor(s, PCU_F32, cap * D, (void **)&O);
  if (st != PCU_OK) {
    free(off);
    return st;
  }
#define MOE_TRY(call)                                                                      \
  do {                                                                                     \
    PcuStatus t__ = (call);                                                                \
    if (t__ != PCU_OK) {                                                                   \
      free(off);                                                                           \
      return t__;                                                                          \
    }                                                                                      \
  } while (0)
#define MOE_LAUNCH()                                                                       \
  do {                                                                                     \
    cudaError_t e__ = cudaGetLastError();                                                  \
    if (e__ != cudaSuccess) {                                                              \
      free(off);                                                                           \
      return pcu_fail_cuda(ctx, e__, __FILE__, __LINE__, "a kernel launch");               \
    }                                                                                      \
  } while (0)
  /* The expert's forward on its c tokens: Xe, G, U, H and O = H Wd_e. */
  auto expert_forward = [&](int64_t e, int64_t c) -> PcuStatus {
    const int64_t *ie = idx + off[e];
    moe_gather_kernel<<<pcu_blocks(c * D), 256, 0, ctx->stream>>>((const float *)x.p, ie, c, D,
                                                                  Xe);
    CUDA_CHECK(ctx, cudaGetLastError());
    const float *wge = (const float *)wg.p + e * D * F, *wue = (const float *)wu.p + e * D * F;
    const float *wde = (const float *)wd.p + e * F * D;
    TRY(pcu_gemm(ctx, PCU_F32, false, false, c, F, D, 1.f, Xe, D, 0, wge, F, 0, 0.f, G, F, 0, 1));
    TRY(pcu_gemm(ctx, PCU_F32, false, false, c, F, D, 1.f, Xe, D, 0, wue, F, 0, 0.f, U, F, 0, 1));
    glu_kernel<float><<<pcu_blocks(c * F), 256, 0, ctx->stream>>>(G, U, H, c * F, a->act);
    CUDA_CHECK(ctx, cudaGetLastError());
    return pcu_gemm(ctx, PCU_F32, false, false, c, D, F, 1.f, H, F, 0, wde, D, 0, 0.f, O, D, 0,
                    1);
  };
  if (fwd) {
    Dense y;
    MOE_TRY(dense_out(ctx, s, Y, PCU_F32, &y));
    if (!y.owned && !a->accumulate)
      MOE_TRY(pcu_memset_zero(ctx, y.p, (size_t)(R * D) * fb));
    for (int64_t e = 0; e < nx; e++) {
      int64_t c = off[e + 1] - off[e];
      if (c == 0)
        continue;
      MOE_TRY(expert_forward(e, c));
      moe_scatter_kernel<<<pcu_blocks(c * D), 256, 0, ctx->stream>>>(
        (float *)y.p, idx + off[e], slot + off[e], wgt, c, D, O);
      MOE_LAUNCH();
    }
    free(off);
    return dense_commit(ctx, Y, y, a->accumulate);
  }
  /* Backward, expert by expert: the routing weight's gradient dy . O, then the expert's
   * backward of the weighted output gradient. */
  Dense dy;
  MOE_TRY(dense_in(ctx, s, a->out_grad[0], PCU_F32, &dy));
  float *dw = NULL, *dYe = NULL, *dH = NULL, *dG = NULL, *dU = NULL, *dXe = NULL;
  MOE_TRY(scratch_tensor(s, PCU_F32, R * K, (void **)&dw));
  MOE_TRY(scratch_tensor(s, PCU_F32, cap * D, (void **)&dYe));
  MOE_TRY(scratch_tensor(s, PCU_F32, cap * F, (void **)&dH));
  MOE_TRY(scratch_tensor(s, PCU_F32, cap * F, (void **)&dG));
  MOE_TRY(scratch_tensor(s, PCU_F32, cap * F, (void **)&dU));
  MOE_TRY(scratch_tensor(s, PCU_F32, cap * D, (void **)&dXe));
  Dense dwg = { NULL, 0, PCU_F32, false }, dwu = dwg, dwd = dwg, dx = dwg;
  bool has_w = present(a->w_grad[0]) && present(a->w_grad[1]) && present(a->w_grad[2]);
  if (has_w) {
    MOE_TRY(dense_out(ctx, s, a->w_grad[0], PCU_F32, &dwg));
    MOE_TRY(dense_out(ctx, s, a->w_grad[1], PCU_F32, &dwu));
    MOE_TRY(dense_out(ctx, s, a->w_grad[2], PCU_F32, &dwd));
  }
  bool has_dx = present(a->in_grad[0]);
  if (has_dx)
    MOE_TRY(dense_out(ctx, s, a->in_grad[0], PCU_F32, &dx));
  for (int64_t e = 0; e < nx; e++) {
    int64_t c = off[e + 1] - off[e];
    if (c == 0)
      continue;
    MOE_TRY(expert_forward(e, c));
    moe_gather_kernel<<<pcu_blocks(c * D), 256, 0, ctx->stream>>>((const float *)dy.p,
                                                                  idx + off[e], c, D, dXe);
    MOE_LAUNCH();
    /* dXe holds the tokens' dy for now; dYe = wgt dy. */
    moe_weight_grad_kernel<<<pcu_blocks(c), 256, 0, ctx->stream>>>(dXe, O, slot + off[e], wgt,
                                                                   c, D, dw, dYe);
    MOE_LAUNCH();
    const float *wge = (const float *)wg.p + e * D * F, *wue = (const float *)wu.p + e * D * F;
    const float *wde = (const float *)wd.p + e * F * D;
    MOE_TRY(pcu_gemm(ctx, PCU_F32, false, true, c, F, D, 1.f, dYe, D, 0, wde, D, 0, 0.f, dH, F,
                     0, 1));
    glu_backward_kernel<float><<<pcu_blocks(c * F), 256, 0, ctx->stream>>>(dH, G, U, dG, dU,
                                                                          c * F, a->act);
    MOE_LAUNCH();
    if (has_w) {
      float beta = dense_adds(dwg, true) ? 1.f : 0.f;
      MOE_TRY(pcu_gemm(ctx, PCU_F32, true, false, F, D, c, 1.f, H, F, 0, dYe, D, 0,
                       dense_adds(dwd, true) ? 1.f : 0.f, (float *)dwd.p + e * F * D, D, 0, 1));
      MOE_TRY(pcu_gemm(ctx, PCU_F32, true, false, D, F, c, 1.f, Xe, D, 0, dG, F, 0, beta,
                       (float *)dwg.p + e * D * F, F, 0, 1));
      MOE_TRY(pcu_gemm(ctx, PCU_F32, true, false, D, F, c, 1.f, Xe, D, 0, dU, F, 0,
                       dense_adds(dwu, true) ? 1.f : 0.f, (float *)dwu.p + e * D * F, F, 0, 1));
    }
    if (has_dx) {
      MOE_TRY(pcu_gemm(ctx, PCU_F32, false, true, c, D, F, 1.f, dG, F, 0, wge, F, 0, 0.f, dXe, D,
                       0, 1));
      MOE_TRY(pcu_gemm(ctx, PCU_F32, false, true, c, D, F, 1.f, dU, F, 0, wue, F, 0, 1.f, dXe, D,
                       0, 1));
      moe_scatter_kernel<<<pcu_blocks(c * D), 256, 0, ctx->stream>>>(
        (float *)dx.p, idx + off[e], slot + off[e], NULL, c, D, dXe);
      MOE_LAUNCH();
    }
  }
  free(off);
  if (has_w) {
    TRY(dense_commit(ctx, a->w_grad[0], dwg, true));
    TRY(dense_commit(ctx, a->w_grad[1], dwu, true));
    TRY(dense_commit(ctx, a->w_grad[2], dwd, true));
  }
  if (has_dx)
    TRY(dense_commit(ctx, a->in_grad[0], dx, true));
  if (present(a->in_grad[1])) {
    Dense dl;
    TRY(dense_out(ctx, s, a->in_grad[1], PCU_F32, &dl));
    moe_router_backward_kernel<<<pcu_blocks(R), 256, 0, ctx->stream>>>(
      P, pick, psum, dw, R, E, K, a->normalize_top_k, (float *)dl.p, dense_adds(dl, true));
    LAUNCH_CHECK(ctx);
    TRY(dense_commit(ctx, a->in_grad[1], dl, true));
  }
  return PCU_OK;
#undef MOE_TRY
#undef MOE_LAUNCH
}
