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
