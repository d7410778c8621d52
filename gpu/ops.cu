/* ops.cu — the operators built on matrix products (linear, matmul, multi-head attention
 * with grouped-query heads and rotary embeddings, LSTM), and the entry point that
 * dispatches an operator call to its family.
 *
 * Matrices are row-major throughout; pcu_gemm() hands them to cuBLAS, which accumulates
 * in fp32 whatever the element type.  A backward pass adds into the gradients: in place
 * when the gradient's view is the dense region itself (beta = 1), else into zeroed
 * scratch that dense_commit() adds into the view. */
#include "common.cuh"

#include <math.h>

static inline int64_t rsize(const PcuRegion &r, int d)
{
  return r.hi[d] - r.lo[d];
}

static inline int64_t rlast(const PcuRegion &r)
{
  return r.ndim ? rsize(r, r.ndim - 1) : 1;
}

static inline bool present(const PcuArg &a)
{
  return a.v.data != NULL;
}

/* ---------------------------------------------------------------------------------- */
/* Element-wise helpers of the dense layers                                            */

/* y = act(y + bias[col]) over an m x n matrix, keeping the pre-activation in z. */
template <typename T>
__global__ void bias_act_kernel(void *yv, const void *biasv, void *zv, int64_t m, int64_t n,
                                int act)
{
  T *y = (T *)yv, *z = (T *)zv;
  const T *bias = (const T *)biasv;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < m * n;
       i += (int64_t)gridDim.x * blockDim.x) {
    float v = to_f<T>(y[i]) + (bias ? to_f<T>(bias[i % n]) : 0.f);
    if (z)
      z[i] = from_f<T>(v);
    y[i] = from_f<T>(unary_f(act, v, 1.f));
  }
}

/* dz = dy * act'(z). */
template <typename T>
__global__ void act_grad_kernel(const void *dyv, const void *zv, void *dzv, int64_t n, int act)
{
  const T *dy = (const T *)dyv, *z = (const T *)zv;
  T *dz = (T *)dzv;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    float x = to_f<T>(z[i]);
    dz[i] = from_f<T>(to_f<T>(dy[i]) * unary_df(act, x, unary_f(act, x, 1.f), 1.f));
  }
}

/* Adds a bias and applies an activation to the m x n output @y, keeping the
 * pre-activation in saved slot @slot when there is an activation. */
static PcuStatus bias_act(PcuContext *ctx, const PcuOpArgs *a, Scratch &s, void *y, int64_t m,
                          int64_t n, const PcuArg *bias, int act, int slot)
{
  Dense b = { NULL, 0, a->dtype, false };
  if (bias)
    TRY(dense_in(ctx, s, *bias, a->dtype, &b));
  void *z = NULL;
  if (act != U_IDENTITY)
    TRY(saved_buffer(ctx, a->saved, slot, (size_t)(m * n) * pcu_dtype_size(a->dtype), &z));
  if (!bias && act == U_IDENTITY)
    return PCU_OK;
  LAUNCH_FLOAT(ctx, a->dtype, bias_act_kernel, pcu_blocks(m * n), 256, y, b.p, z, m, n, act);
  return PCU_OK;
}

/* The gradient before an activation kept in saved slot @slot, or @dy itself without one. */
static PcuStatus act_grad(PcuContext *ctx, const PcuOpArgs *a, Scratch &s, const void *dy,
                          int64_t n, int act, int slot, const void **dz)
{
  *dz = dy;
  if (act == U_IDENTITY)
    return PCU_OK;
  const void *z = saved_get(a->saved, slot, (size_t)n * pcu_dtype_size(a->dtype));
  if (!z)
    return FAIL(ctx, PCU_ERR_INVALID, "a backward pass without its forward pass");
  void *out = NULL;
  TRY(scratch_tensor(s, a->dtype, n, &out));
  LAUNCH_FLOAT(ctx, a->dtype, act_grad_kernel, pcu_blocks(n), 256, dy, z, out, n, act);
  *dz = out;
  return PCU_OK;
}

/* ---------------------------------------------------------------------------------- */
/* Linear: Y[M x N] = act(X[M x K] W[K x N] + b)                                        */

PcuStatus pcu_op_linear(PcuContext *ctx, const PcuOpArgs *a)
{
  const PcuArg &X = a->in[0], &W = a->w[0], &Y = a->out[0];
  int dt = a->dtype;
  int64_t K = rlast(X.region), N = rlast(Y.region);
  int64_t M = N ? pcu_region_numel(&Y.region) / N : 0;
  bool bias = a->has_bias && a->bias_here && a->n_weights > 1;
  Scratch s(ctx);
  if (a->phase == PCU_FORWARD) {
    if (a->act != U_IDENTITY && a->accumulate)
      return FAIL(ctx, PCU_ERR_UNSUPPORTED,
                  "a fused activation over a split reduction (partial sums)");
    Dense x, w, y;
    TRY(dense_in(ctx, s, X, dt, &x));
    TRY(dense_in(ctx, s, W, dt, &w));
    TRY(dense_out(ctx, s, Y, dt, &y));
    TRY(pcu_gemm(ctx, dt, false, false, M, N, K, 1.f, x.p, K, 0, w.p, N, 0,
                 dense_adds(y, a->accumulate) ? 1.f : 0.f, y.p, N, 0, 1));
    TRY(bias_act(ctx, a, s, y.p, M, N, bias ? &a->w[1] : NULL, a->act, 0));
    return dense_commit(ctx, Y, y, a->accumulate);
  }
  Dense dy;
  TRY(dense_in(ctx, s, a->out_grad[0], dt, &dy));
  const void *dz = NULL;
  TRY(act_grad(ctx, a, s, dy.p, M * N, a->act, 0, &dz));
  if (present(a->in_grad[0])) {
    Dense w, dx;
    TRY(dense_in(ctx, s, W, dt, &w));
    TRY(dense_out(ctx, s, a->in_grad[0], dt, &dx));
    TRY(pcu_gemm(ctx, dt, false, true, M, K, N, 1.f, dz, N, 0, w.p, N, 0,
                 dense_adds(dx, true) ? 1.f : 0.f, dx.p, K, 0, 1));
    TRY(dense_commit(ctx, a->in_grad[0], dx, true));
  }
  if (present(a->w_grad[0])) {
    Dense x, dw;
    TRY(dense_in(ctx, s, X, dt, &x));
    TRY(dense_out(ctx, s, a->w_grad[0], dt, &dw));
    TRY(pcu_gemm(ctx, dt, true, false, K, N, M, 1.f, x.p, K, 0, dz, N, 0,
                 dense_adds(dw, true) ? 1.f : 0.f, dw.p, N, 0, 1));
    TRY(dense_commit(ctx, a->w_grad[0], dw, true));
  }
  if (bias && present(a->w_grad[1])) {
    Dense db;
    TRY(dense_out(ctx, s, a->w_grad[1], dt, &db));
    TRY(pcu_colsum(ctx, s, dt, dz, M, N, db.p, dense_adds(db, true)));
    TRY(dense_commit(ctx, a->w_grad[1], db, true));
  }
  return PCU_OK;
}

/* ---------------------------------------------------------------------------------- */
/* Matmul: C[.., M x N] = A[.., M x K] op(B)                                            */

PcuStatus pcu_op_matmul(PcuContext *ctx, const PcuOpArgs *a)
{
  const PcuArg &A = a->in[0], &B = a->in[1], &C = a->out[0];
  int dt = a->dtype, r = C.region.ndim;
  bool tb = a->trans_b != 0;
  int64_t M = rsize(C.region, r - 2), N = rsize(C.region, r - 1), K = rlast(A.region);
  int64_t batch = M > 0 && N > 0 ? pcu_region_numel(&C.region) / (M * N) : 0;
  int64_t ldb = tb ? K : N;
  Scratch s(ctx);
  if (a->phase == PCU_FORWARD) {
    Dense da, db, dc;
    TRY(dense_in(ctx, s, A, dt, &da));
    TRY(dense_in(ctx, s, B, dt, &db));
    TRY(dense_out(ctx, s, C, dt, &dc));
    TRY(pcu_gemm(ctx, dt, false, tb, M, N, K, 1.f, da.p, K, M * K, db.p, ldb, K * N,
                 dense_adds(dc, a->accumulate) ? 1.f : 0.f, dc.p, N, M * N, batch));
    return dense_commit(ctx, C, dc, a->accumulate);
  }
  Dense dc;
  TRY(dense_in(ctx, s, a->out_grad[0], dt, &dc));
  if (present(a->in_grad[0])) {
    Dense db, ga;
    TRY(dense_in(ctx, s, B, dt, &db));
    TRY(dense_out(ctx, s, a->in_grad[0], dt, &ga));
    /* dA = dC B^T, or dC Bs with B stored transposed as Bs [N x K]. */
    TRY(pcu_gemm(ctx, dt, false, !tb, M, K, N, 1.f, dc.p, N, M * N, db.p, ldb, K * N,
                 dense_adds(ga, true) ? 1.f : 0.f, ga.p, K, M * K, batch));
    TRY(dense_commit(ctx, a->in_grad[0], ga, true));
  }
  if (present(a->in_grad[1])) {
    Dense da, gb;
    TRY(dense_in(ctx, s, A, dt, &da));
    TRY(dense_out(ctx, s, a->in_grad[1], dt, &gb));
    float beta = dense_adds(gb, true) ? 1.f : 0.f;
    if (!tb)
      /* dB [K x N] = A^T dC. */
      TRY(pcu_gemm(ctx, dt, true, false, K, N, M, 1.f, da.p, K, M * K, dc.p, N, M * N, beta,
                   gb.p, N, K * N, batch));
    else
      /* dBs [N x K] = dC^T A. */
      TRY(pcu_gemm(ctx, dt, true, false, N, K, M, 1.f, dc.p, N, M * N, da.p, K, M * K, beta,
                   gb.p, K, N * K, batch));
    TRY(dense_commit(ctx, a->in_grad[1], gb, true));
  }
  return PCU_OK;
}

/* ---------------------------------------------------------------------------------- */
/* Products per (sample, head)                                                         */

__global__ void head_pointers_kernel(const char *A, const char *B, char *C, int64_t sa_b,
                                     int64_t sa_h, int64_t sb_b, int64_t sb_h, int64_t gb,
                                     int64_t sc_b, int64_t sc_h, int64_t n_b, int64_t n_h, int es,
                                     const void **pa, const void **pb, void **pc)
{
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n_b * n_h;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t b = i / n_h, h = i % n_h;
    pa[i] = A + (b * sa_b + h * sa_h) * es;
    pb[i] = B + (b * sb_b + (h / gb) * sb_h) * es;
    pc[i] = C + (b * sc_b + h * sc_h) * es;
  }
}

/* C_bh = op(A_bh) op(B_bh) (+ beta C_bh) for every sample b and head h, where matrix X_bh
 * starts at element b * sx_b + h * sx_h of X: heads interleaved in rows ([b, s, h * e])
 * and heads apart ([b, h, s, l]) are both such strides.  B's head is h / @gb: the key or
 * value head that @gb query heads share under grouped-query attention. */
static PcuStatus gemm_heads(PcuContext *ctx, Scratch &s, int dt, bool ta, bool tb, int64_t m,
                            int64_t n, int64_t k, const void *A, int64_t lda, int64_t sa_b,
                            int64_t sa_h, const void *B, int64_t ldb, int64_t sb_b, int64_t sb_h,
                            int64_t gb, float beta, void *C, int64_t ldc, int64_t sc_b,
                            int64_t sc_h, int64_t n_b, int64_t n_h)
{
  int64_t count = n_b * n_h;
  if (count == 0 || m == 0 || n == 0)
    return PCU_OK;
  const int64_t lim = 0x7fffffff;
  if (m > lim || n > lim || k > lim || count > lim)
    return FAIL(ctx, PCU_ERR_UNSUPPORTED, "attention larger than cuBLAS's 32-bit sizes");
  void *ptrs = NULL;
  TRY(s.alloc(3 * (size_t)count * sizeof(void *), &ptrs));
  const void **pa = (const void **)ptrs;
  const void **pb = pa + count;
  void **pc = (void **)(pb + count);
  head_pointers_kernel<<<pcu_blocks(count), 256, 0, ctx->stream>>>(
    (const char *)A, (const char *)B, (char *)C, sa_b, sa_h, sb_b, sb_h, gb, sc_b, sc_h, n_b,
    n_h, pcu_dtype_size(dt), pa, pb, pc);
  LAUNCH_CHECK(ctx);
  float alpha = 1.f;
  cudaDataType_t t = pcu_cuda_type(dt);
  /* Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T. */
  BLAS_CHECK(ctx, cublasGemmBatchedEx(ctx->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                      ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)n, (int)m, (int)k,
                                      &alpha, pb, t, (int)ldb, pa, t, (int)lda, &beta, pc, t,
                                      (int)ldc, (int)count, CUBLAS_COMPUTE_32F,
                                      CUBLAS_GEMM_DEFAULT));
  return PCU_OK;
}

/* Dropout of attention probabilities [n_b, n_h, S, L] of the shard whose first sample,
 * head and query are b0, h0 and s0: element (b, h, s, l) is element
 * ((b0 + b) heads + h0 + h) sq + s0 + s) skv + l of the whole batch's scores.  Backward
 * applies the same mask to the gradient. */
template <typename T>
__global__ void attn_dropout_kernel(const void *inv, void *outv, int64_t n_b, int64_t n_h,
                                    int64_t S, int64_t L, int64_t b0, int64_t h0, int64_t s0,
                                    int64_t heads, int64_t sq, int64_t skv, uint64_t name_hash,
                                    int step, double p)
{
  const T *in = (const T *)inv;
  T *out = (T *)outv;
  float scale = 1.f / (1.f - (float)p);
  int64_t n = n_b * n_h * S * L;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t l = i % L, r = i / L;
    int64_t si = r % S;
    r /= S;
    int64_t h = r % n_h, b = r / n_h;
    uint64_t idx = (uint64_t)((((b0 + b) * heads + h0 + h) * sq + s0 + si) * skv + l);
    out[i] = from_f<T>(dropout_keep(name_hash, idx, step, p) ? to_f<T>(in[i]) * scale : 0.f);
  }
}

enum { ATT_Q, ATT_K, ATT_V, ATT_P, ATT_CTX };

PcuStatus pcu_op_attention(PcuContext *ctx, const PcuOpArgs *a)
{
  enum { DB, DS, DH, DE, DD };
  int dt = a->dtype;
  size_t es = (size_t)pcu_dtype_size(dt);
  int64_t Bn = rsize(a->in[0].region, 0), S = rsize(a->in[0].region, 1);
  int64_t D = rsize(a->in[0].region, 2), L = rsize(a->in[1].region, 1);
  /* The shard's heads are key-value heads, each shared by @group query heads. */
  int64_t group = a->kv_heads > 0 && a->heads % a->kv_heads == 0 ? a->heads / a->kv_heads : 1;
  int64_t E = a->head_dim, Hk = a->hi[DH] - a->lo[DH], Hh = Hk * group;
  int64_t I = Hh * E, Ik = Hk * E;
  bool bias = a->has_bias && a->n_weights == 8;
  float scale = 1.f / sqrtf((float)E);
  int64_t n_scores = Bn * Hh * S * L;
  /* Dropout indexes the whole batch's scores, by query head. */
  int64_t b0 = a->lo[DB] + a->sample_offset, h0 = a->lo[DH] * group, s0 = a->lo[DS];
  int64_t l0 = a->in[1].region.lo[1];
  int64_t heads = a->full_ndim == 4 ? a->full[1] : a->heads;
  int64_t sq = a->full_ndim == 4 ? a->full[2] : S, skv = a->full_ndim == 4 ? a->full[3] : L;
  Scratch s(ctx);
  if (a->phase == PCU_FORWARD) {
    void *Q, *K, *V, *P, *C;
    TRY(saved_buffer(ctx, a->saved, ATT_Q, (size_t)(Bn * S * I) * es, &Q));
    TRY(saved_buffer(ctx, a->saved, ATT_K, (size_t)(Bn * L * Ik) * es, &K));
    TRY(saved_buffer(ctx, a->saved, ATT_V, (size_t)(Bn * L * Ik) * es, &V));
    TRY(saved_buffer(ctx, a->saved, ATT_P, (size_t)n_scores * es, &P));
    TRY(saved_buffer(ctx, a->saved, ATT_CTX, (size_t)(Bn * S * I) * es, &C));
    void *proj[3] = { Q, K, V };
    int64_t rows[3] = { Bn * S, Bn * L, Bn * L }, cols[3] = { I, Ik, Ik };
    for (int j = 0; j < 3; j++) {
      Dense x, w;
      TRY(dense_in(ctx, s, a->in[j], dt, &x));
      TRY(dense_in(ctx, s, a->w[j], dt, &w));
      TRY(pcu_gemm(ctx, dt, false, false, rows[j], cols[j], D, 1.f, x.p, D, 0, w.p, cols[j], 0,
                   0.f, proj[j], cols[j], 0, 1));
      TRY(bias_act(ctx, a, s, proj[j], rows[j], cols[j], bias ? &a->w[4 + j] : NULL, U_IDENTITY,
                   0));
    }
    if (a->rotary) {
      TRY(pcu_rope(ctx, dt, Q, Bn * S, S, s0, Hh, E, a->rotary_base, 1.0));
      TRY(pcu_rope(ctx, dt, K, Bn * L, L, l0, Hk, E, a->rotary_base, 1.0));
    }
    /* Scores [b, h, S, L] = Q_bh K_bh^T, heads interleaved in Q and K's rows. */
    TRY(gemm_heads(ctx, s, dt, false, true, S, L, E, Q, I, S * I, E, K, Ik, L * Ik, E, group,
                   0.f, P, L, Hh * S * L, S * L, Bn, Hh));
    TRY(pcu_masked_softmax(ctx, dt, P, Bn * Hh * S, L, scale, a->causal, S, s0));
    const void *Pd = P;
    if (a->p > 0.0) {
      void *t = NULL;
      TRY(scratch_tensor(s, dt, n_scores, &t));
      LAUNCH_FLOAT(ctx, dt, attn_dropout_kernel, pcu_blocks(n_scores), 256, P, t, Bn, Hh, S, L,
                   b0, h0, s0, heads, sq, skv, a->name_hash, a->step, a->p);
      Pd = t;
    }
    /* Context [b, S, h * E] = P_bh V_bh. */
    TRY(gemm_heads(ctx, s, dt, false, false, S, E, L, Pd, L, Hh * S * L, S * L, V, Ik, L * Ik, E,
                   group, 0.f, C, I, S * I, E, Bn, Hh));
    Dense y, wo;
    TRY(dense_in(ctx, s, a->w[3], dt, &wo));
    TRY(dense_out(ctx, s, a->out[0], dt, &y));
    TRY(pcu_gemm(ctx, dt, false, false, Bn * S, D, I, 1.f, C, I, 0, wo.p, D, 0,
                 dense_adds(y, a->accumulate) ? 1.f : 0.f, y.p, D, 0, 1));
    if (bias && a->bias_here)
      TRY(bias_act(ctx, a, s, y.p, Bn * S, D, &a->w[7], U_IDENTITY, 0));
    return dense_commit(ctx, a->out[0], y, a->accumulate);
  }

  const void *Q = saved_get(a->saved, ATT_Q, (size_t)(Bn * S * I) * es);
  const void *K = saved_get(a->saved, ATT_K, (size_t)(Bn * L * Ik) * es);
  const void *V = saved_get(a->saved, ATT_V, (size_t)(Bn * L * Ik) * es);
  const void *P = saved_get(a->saved, ATT_P, (size_t)n_scores * es);
  const void *C = saved_get(a->saved, ATT_CTX, (size_t)(Bn * S * I) * es);
  if (!Q || !K || !V || !P || !C)
    return FAIL(ctx, PCU_ERR_INVALID, "a backward pass of attention without its forward pass");
  Dense dy, wo;
  TRY(dense_in(ctx, s, a->out_grad[0], dt, &dy));
  TRY(dense_in(ctx, s, a->w[3], dt, &wo));
  /* The output projection: dC = dY Wo^T, dWo += C^T dY, dbo += sum dY. */
  void *dC = NULL;
  TRY(scratch_tensor(s, dt, Bn * S * I, &dC));
  TRY(pcu_gemm(ctx, dt, false, true, Bn * S, I, D, 1.f, dy.p, D, 0, wo.p, D, 0, 0.f, dC, I, 0,
               1));
  if (present(a->w_grad[3])) {
    Dense dwo;
    TRY(dense_out(ctx, s, a->w_grad[3], dt, &dwo));
    TRY(pcu_gemm(ctx, dt, true, false, I, D, Bn * S, 1.f, C, I, 0, dy.p, D, 0,
                 dense_adds(dwo, true) ? 1.f : 0.f, dwo.p, D, 0, 1));
    TRY(dense_commit(ctx, a->w_grad[3], dwo, true));
  }
  if (bias && a->bias_here && present(a->w_grad[7])) {
    Dense dbo;
    TRY(dense_out(ctx, s, a->w_grad[7], dt, &dbo));
    TRY(pcu_colsum(ctx, s, dt, dy.p, Bn * S, D, dbo.p, dense_adds(dbo, true)));
    TRY(dense_commit(ctx, a->w_grad[7], dbo, true));
  }
  /* The dropped-out probabilities again, from the same hash. */
  const void *Pd = P;
  if (a->p > 0.0) {
    void *t = NULL;
    TRY(scratch_tensor(s, dt, n_scores, &t));
    LAUNCH_FLOAT(ctx, dt, attn_dropout_kernel, pcu_blocks(n_scores), 256, P, t, Bn, Hh, S, L, b0,
                 h0, s0, heads, sq, skv, a->name_hash, a->step, a->p);
    Pd = t;
  }
  /* dPd = dC_bh V_bh^T; dV_bh = Pd_bh^T dC_bh (per query head, summed over each group). */
  void *dP = NULL, *dQ = NULL, *dK = NULL, *dV = NULL, *dKh = NULL, *dVh = NULL;
  TRY(scratch_tensor(s, dt, n_scores, &dP));
  TRY(scratch_tensor(s, dt, Bn * S * I, &dQ));
  TRY(scratch_tensor(s, dt, Bn * L * I, &dKh));
  TRY(scratch_tensor(s, dt, Bn * L * I, &dVh));
  TRY(gemm_heads(ctx, s, dt, false, true, S, L, E, dC, I, S * I, E, V, Ik, L * Ik, E, group, 0.f,
                 dP, L, Hh * S * L, S * L, Bn, Hh));
  TRY(gemm_heads(ctx, s, dt, true, false, L, E, S, Pd, L, Hh * S * L, S * L, dC, I, S * I, E, 1,
                 0.f, dVh, I, L * I, E, Bn, Hh));
  if (a->p > 0.0)
    LAUNCH_FLOAT(ctx, dt, attn_dropout_kernel, pcu_blocks(n_scores), 256, dP, dP, Bn, Hh, S, L,
                 b0, h0, s0, heads, sq, skv, a->name_hash, a->step, a->p);
  /* dScores = scale * P (dP - sum(dP P)), in place. */
  TRY(pcu_softmax_backward_rows(ctx, dt, P, dP, dP, Bn * Hh * S, L, scale, false));
  /* dQ_bh = dS_bh K_bh; dK_bh = dS_bh^T Q_bh. */
  TRY(gemm_heads(ctx, s, dt, false, false, S, E, L, dP, L, Hh * S * L, S * L, K, Ik, L * Ik, E,
                 group, 0.f, dQ, I, S * I, E, Bn, Hh));
  TRY(gemm_heads(ctx, s, dt, true, false, L, E, S, dP, L, Hh * S * L, S * L, Q, I, S * I, E, 1,
                 0.f, dKh, I, L * I, E, Bn, Hh));
  if (group > 1) {
    TRY(scratch_tensor(s, dt, Bn * L * Ik, &dK));
    TRY(scratch_tensor(s, dt, Bn * L * Ik, &dV));
    TRY(pcu_sum_head_groups(ctx, dt, dKh, dK, Bn * L, Hk, group, E));
    TRY(pcu_sum_head_groups(ctx, dt, dVh, dV, Bn * L, Hk, group, E));
  } else {
    dK = dKh;
    dV = dVh;
  }
  /* Through the rotations: the gradients of the unrotated projections. */
  if (a->rotary) {
    TRY(pcu_rope(ctx, dt, dQ, Bn * S, S, s0, Hh, E, a->rotary_base, -1.0));
    TRY(pcu_rope(ctx, dt, dK, Bn * L, L, l0, Hk, E, a->rotary_base, -1.0));
  }
  /* The input projections. */
  const void *dproj[3] = { dQ, dK, dV };
  int64_t rows[3] = { Bn * S, Bn * L, Bn * L }, cols[3] = { I, Ik, Ik };
  for (int j = 0; j < 3; j++) {
    int64_t n = cols[j];
    if (present(a->w_grad[j])) {
      Dense x, dw;
      TRY(dense_in(ctx, s, a->in[j], dt, &x));
      TRY(dense_out(ctx, s, a->w_grad[j], dt, &dw));
      TRY(pcu_gemm(ctx, dt, true, false, D, n, rows[j], 1.f, x.p, D, 0, dproj[j], n, 0,
                   dense_adds(dw, true) ? 1.f : 0.f, dw.p, n, 0, 1));
      TRY(dense_commit(ctx, a->w_grad[j], dw, true));
    }
    if (bias && present(a->w_grad[4 + j])) {
      Dense db;
      TRY(dense_out(ctx, s, a->w_grad[4 + j], dt, &db));
      TRY(pcu_colsum(ctx, s, dt, dproj[j], rows[j], n, db.p, dense_adds(db, true)));
      TRY(dense_commit(ctx, a->w_grad[4 + j], db, true));
    }
    if (present(a->in_grad[j])) {
      Dense w, dx;
      TRY(dense_in(ctx, s, a->w[j], dt, &w));
      TRY(dense_out(ctx, s, a->in_grad[j], dt, &dx));
      TRY(pcu_gemm(ctx, dt, false, true, rows[j], D, n, 1.f, dproj[j], n, 0, w.p, n, 0,
                   dense_adds(dx, true) ? 1.f : 0.f, dx.p, D, 0, 1));
      TRY(dense_commit(ctx, a->in_grad[j], dx, true));
    }
  }
  return PCU_OK;
}

/* ---------------------------------------------------------------------------------- */
/* LSTM: gates [i f g o] = x_t W_ih + h_{t-1} W_hh + b; c_t = f c_{t-1} + i g;          */
/* h_t = o tanh(c_t)                                                                    */

__device__ __forceinline__ float sigmoidf(float x)
{
  return 1.f / (1.f + expf(-x));
}

/* Step @t: turns the pre-activations in G [B, S, 4H] into activations, and writes c and h
 * [B, S, H]. */
template <typename T>
__global__ void lstm_cell_kernel(void *Gv, void *cv, void *hv, int64_t B, int64_t S, int64_t H,
                                 int64_t t)
{
  T *G = (T *)Gv, *c = (T *)cv, *h = (T *)hv;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < B * H;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t b = i / H, j = i % H;
    T *g = G + (b * S + t) * 4 * H;
    float ig = sigmoidf(to_f<T>(g[j])), fg = sigmoidf(to_f<T>(g[H + j]));
    float gg = tanhf(to_f<T>(g[2 * H + j])), og = sigmoidf(to_f<T>(g[3 * H + j]));
    float cp = t > 0 ? to_f<T>(c[(b * S + t - 1) * H + j]) : 0.f;
    float ct = fg * cp + ig * gg;
    g[j] = from_f<T>(ig);
    g[H + j] = from_f<T>(fg);
    g[2 * H + j] = from_f<T>(gg);
    g[3 * H + j] = from_f<T>(og);
    c[(b * S + t) * H + j] = from_f<T>(ct);
    h[(b * S + t) * H + j] = from_f<T>(og * tanhf(ct));
  }
}

/* Backward of step @t: from dy_t plus the recurrent gradient dh (B x H, NULL at the last
 * step) and the carried dc (fp32, B x H), writes the pre-activation gradients dG_t and
 * carries dc to step t - 1. */
template <typename T>
__global__ void lstm_cell_backward_kernel(const void *Gv, const void *cv, const void *dyv,
                                          const void *dhv, float *dc, void *dGv, int64_t B,
                                          int64_t S, int64_t H, int64_t t)
{
  const T *G = (const T *)Gv, *c = (const T *)cv, *dy = (const T *)dyv, *dh = (const T *)dhv;
  T *dG = (T *)dGv;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < B * H;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t b = i / H, j = i % H;
    const T *g = G + (b * S + t) * 4 * H;
    float ig = to_f<T>(g[j]), fg = to_f<T>(g[H + j]), gg = to_f<T>(g[2 * H + j]);
    float og = to_f<T>(g[3 * H + j]);
    float ct = to_f<T>(c[(b * S + t) * H + j]);
    float cp = t > 0 ? to_f<T>(c[(b * S + t - 1) * H + j]) : 0.f;
    float tc = tanhf(ct);
    float dht = to_f<T>(dy[(b * S + t) * H + j]) + (dh ? to_f<T>(dh[i]) : 0.f);
    float dct = dht * og * (1.f - tc * tc) + dc[i];
    T *d = dG + (b * S + t) * 4 * H;
    d[j] = from_f<T>(dct * gg * ig * (1.f - ig));
    d[H + j] = from_f<T>(dct * cp * fg * (1.f - fg));
    d[2 * H + j] = from_f<T>(dct * ig * (1.f - gg * gg));
    d[3 * H + j] = from_f<T>(dht * tc * og * (1.f - og));
    dc[i] = dct * fg;
  }
}

/* Hprev [B, S, H] = h shifted one step later in time, zero at t = 0. */
template <typename T>
__global__ void shift_kernel(const void *hv, void *outv, int64_t B, int64_t S, int64_t H)
{
  const T *h = (const T *)hv;
  T *out = (T *)outv;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < B * S * H;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t t = i / H % S;
    out[i] = t > 0 ? h[i - H] : from_f<T>(0.f);
  }
}

enum { LSTM_G, LSTM_C, LSTM_H };

PcuStatus pcu_op_lstm(PcuContext *ctx, const PcuOpArgs *a)
{
  int dt = a->dtype;
  size_t es = (size_t)pcu_dtype_size(dt);
  int64_t B = rsize(a->in[0].region, 0), S = rsize(a->in[0].region, 1);
  int64_t In = rsize(a->in[0].region, 2), H = rlast(a->out[0].region);
  if (rsize(a->w[0].region, 0) != In + H || rsize(a->w[0].region, 1) != 4 * H)
    return FAIL(ctx, PCU_ERR_UNSUPPORTED, "an LSTM shard that does not read its whole weights");
  Scratch s(ctx);
  Dense x, w;
  TRY(dense_in(ctx, s, a->in[0], dt, &x));
  TRY(dense_in(ctx, s, a->w[0], dt, &w));
  const char *Whh = (const char *)w.p + (size_t)(In * 4 * H) * es;
  if (a->phase == PCU_FORWARD) {
    void *G, *c, *h;
    TRY(saved_buffer(ctx, a->saved, LSTM_G, (size_t)(B * S * 4 * H) * es, &G));
    TRY(saved_buffer(ctx, a->saved, LSTM_C, (size_t)(B * S * H) * es, &c));
    TRY(saved_buffer(ctx, a->saved, LSTM_H, (size_t)(B * S * H) * es, &h));
    /* The input's share of every step at once, then the recurrence step by step. */
    TRY(pcu_gemm(ctx, dt, false, false, B * S, 4 * H, In, 1.f, x.p, In, 0, w.p, 4 * H, 0, 0.f, G,
                 4 * H, 0, 1));
    TRY(bias_act(ctx, a, s, G, B * S, 4 * H, a->n_weights > 1 ? &a->w[1] : NULL, U_IDENTITY, 0));
    for (int64_t t = 0; t < S; t++) {
      if (t > 0)
        TRY(pcu_gemm(ctx, dt, false, false, B, 4 * H, H, 1.f, (const char *)h + (size_t)((t - 1) * H) * es,
                     S * H, 0, Whh, 4 * H, 0, 1.f, (char *)G + (size_t)(t * 4 * H) * es, S * 4 * H,
                     0, 1));
      LAUNCH_FLOAT(ctx, dt, lstm_cell_kernel, pcu_blocks(B * H), 256, G, c, h, B, S, H, t);
    }
    PcuView hv = pcu_view_dense(h, dt, &a->out[0].region);
    return pcu_copy(ctx, &a->out[0].v, &hv, &a->out[0].region, 0);
  }
  const void *G = saved_get(a->saved, LSTM_G, (size_t)(B * S * 4 * H) * es);
  const void *c = saved_get(a->saved, LSTM_C, (size_t)(B * S * H) * es);
  const void *h = saved_get(a->saved, LSTM_H, (size_t)(B * S * H) * es);
  if (!G || !c || !h)
    return FAIL(ctx, PCU_ERR_INVALID, "a backward pass of an LSTM without its forward pass");
  Dense dy;
  TRY(dense_in(ctx, s, a->out_grad[0], dt, &dy));
  void *dG = NULL, *dh = NULL;
  float *dc = NULL;
  TRY(scratch_tensor(s, dt, B * S * 4 * H, &dG));
  TRY(scratch_tensor(s, dt, B * H, &dh));
  TRY(scratch_tensor(s, PCU_F32, B * H, (void **)&dc));
  for (int64_t t = S - 1; t >= 0; t--) {
    LAUNCH_FLOAT(ctx, dt, lstm_cell_backward_kernel, pcu_blocks(B * H), 256, G, c, dy.p,
                 t < S - 1 ? dh : NULL, dc, dG, B, S, H, t);
    /* dh_{t-1} = dG_t W_hh^T. */
    if (t > 0)
      TRY(pcu_gemm(ctx, dt, false, true, B, H, 4 * H, 1.f, (char *)dG + (size_t)(t * 4 * H) * es,
                   S * 4 * H, 0, Whh, 4 * H, 0, 0.f, dh, H, 0, 1));
  }
  if (present(a->w_grad[0])) {
    Dense dw;
    TRY(dense_out(ctx, s, a->w_grad[0], dt, &dw));
    float beta = dense_adds(dw, true) ? 1.f : 0.f;
    void *hp = NULL;
    TRY(scratch_tensor(s, dt, B * S * H, &hp));
    LAUNCH_FLOAT(ctx, dt, shift_kernel, pcu_blocks(B * S * H), 256, h, hp, B, S, H);
    TRY(pcu_gemm(ctx, dt, true, false, In, 4 * H, B * S, 1.f, x.p, In, 0, dG, 4 * H, 0, beta,
                 dw.p, 4 * H, 0, 1));
    TRY(pcu_gemm(ctx, dt, true, false, H, 4 * H, B * S, 1.f, hp, H, 0, dG, 4 * H, 0, beta,
                 (char *)dw.p + (size_t)(In * 4 * H) * es, 4 * H, 0, 1));
    TRY(dense_commit(ctx, a->w_grad[0], dw, true));
  }
  if (a->n_weights > 1 && present(a->w_grad[1])) {
    Dense db;
    TRY(dense_out(ctx, s, a->w_grad[1], dt, &db));
    TRY(pcu_colsum(ctx, s, dt, dG, B * S, 4 * H, db.p, dense_adds(db, true)));
    TRY(dense_commit(ctx, a->w_grad[1], db, true));
  }
  if (present(a->in_grad[0])) {
    Dense dx;
    TRY(dense_out(ctx, s, a->in_grad[0], dt, &dx));
    TRY(pcu_gemm(ctx, dt, false, true, B * S, In, 4 * H, 1.f, dG, 4 * H, 0, w.p, 4 * H, 0,
                 dense_adds(dx, true) ? 1.f : 0.f, dx.p, In, 0, 1));
    TRY(dense_commit(ctx, a->in_grad[0], dx, true));
  }
  return PCU_OK;
}

/* ---------------------------------------------------------------------------------- */
/* Dispatch                                                                            */

PcuStatus pcu_op_run(PcuContext *ctx, const PcuOpArgs *a)
{
  if (!ctx || !a)
    return PCU_ERR_INVALID;
  ctx->error[0] = '\0';
  if (a->phase >= PCU_RING_BEGIN) {
    if (a->type != OP_ATTENTION)
      return FAIL(ctx, PCU_ERR_INVALID, "ring phases belong to attention");
    return pcu_op_ring_attention(ctx, a);
  }
  if (a->phase == PCU_STATS_RESCALE || a->phase == PCU_STATS_FINISH) {
    if (a->type != OP_CROSS_ENTROPY)
      return FAIL(ctx, PCU_ERR_INVALID, "statistics phases belong to cross entropy");
    return pcu_op_cross_entropy(ctx, a);
  }
  switch (a->type) {
  case OP_INPUT: return PCU_OK;
  case OP_LINEAR: return pcu_op_linear(ctx, a);
  case OP_MATMUL: return pcu_op_matmul(ctx, a);
  case OP_CONV2D: return pcu_op_conv2d(ctx, a);
  case OP_POOL2D: return pcu_op_pool2d(ctx, a);
  case OP_BATCHNORM: return pcu_op_batchnorm(ctx, a);
  case OP_LAYERNORM: return pcu_op_layernorm(ctx, a);
  case OP_EMBEDDING: return pcu_op_embedding(ctx, a);
  case OP_UNARY: return pcu_op_unary(ctx, a);
  case OP_BINARY: return pcu_op_binary(ctx, a);
  case OP_SOFTMAX: return pcu_op_softmax(ctx, a);
  case OP_DROPOUT: return pcu_op_dropout(ctx, a);
  case OP_CONCAT:
  case OP_SPLIT:
  case OP_RESHAPE:
  case OP_TRANSPOSE: return pcu_op_shape(ctx, a);
  case OP_ATTENTION: return pcu_op_attention(ctx, a);
  case OP_LSTM: return pcu_op_lstm(ctx, a);
  case OP_CROSS_ENTROPY: return pcu_op_cross_entropy(ctx, a);
  case OP_MSE_LOSS: return pcu_op_mse(ctx, a);
  case OP_RMSNORM: return pcu_op_rmsnorm(ctx, a);
  case OP_GATED_MLP: return pcu_op_gated_mlp(ctx, a);
  case OP_MOE: return pcu_op_moe(ctx, a);
  default: return FAIL(ctx, PCU_ERR_UNSUPPORTED, "an operator type this library does not know");
  }
}
