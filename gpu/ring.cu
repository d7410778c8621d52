/* ring.cu — attention's ring phases under context parallelism (include/parasol-exec.h,
 * "Ring attention"; exec/compile-ring.c drives them and passes the blocks;
 * exec/cpu/kernels-attention.c is the reference).
 *
 * A ring member reads its own positions of x: contiguous ones, or under Megatron's
 * two-chunk layout (PcuOpArgs.ring_half) two chunks, which the driver gathers into the
 * rows it passes (exec/compile-ring.c).  Its saved state keeps its rotated queries
 * and, per query row, the running maximum and sum of exponentials (the log-sum-exp after
 * RING_END) and the partial, then normalized, outputs; backward the output gradients,
 * their dot products with the outputs and the queries' gradients.  The block it holds is
 * [4, samples, positions, key-value heads, head_dim], planes K, V, dK, dV, each plane laid
 * out as the rows [samples x positions, key-value heads x head_dim] that the projections
 * write.  The steps run one thread per query row; the block's gradients are added with
 * atomics (rows of several queries meet on one key).  fp32 only, as the executor runs. */
#include "rows.cuh"

#include <math.h>

enum { RING_Q, RING_M, RING_L, RING_O, RING_DO, RING_D, RING_DQ };

/* y[r, c] += bias[c]. */
__global__ void ring_bias_kernel(float *y, const float *bias, int64_t rows, int64_t cols)
{
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < rows * cols;
       i += (int64_t)gridDim.x * blockDim.x)
    y[i] += bias[i % cols];
}

__global__ void ring_init_kernel(float *m, float *l, float *O, int64_t rows, int64_t E)
{
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < rows * E;
       i += (int64_t)gridDim.x * blockDim.x) {
    O[i] = 0.f;
    if (i < rows) {
      m[i] = -INFINITY;
      l[i] = 0.f;
    }
  }
}

/* What a step's kernel needs to know of the shard and the block. */
struct RingDims {
  int64_t nb, ns, nk;         /* samples, own positions, the block's positions              */
  int64_t Hh, Hk, group, E;   /* query heads, key-value heads of the shard, head_dim        */
  int64_t s0, ring_lo;        /* the first query's and the block's first key's positions    */
  /* The two-chunk layout (half > 0): rows [0, half) at positions q_lo (queries) and ring_lo
   * (keys), the rest at q_lo2 and ring_lo2. */
  int64_t half, q_lo, q_lo2, ring_lo2;
  int causal;
  float scale;
  /* Dropout: element ((b0 + b) heads + h0 + h) sq + ring_qpos(i)) skv + ring_kpos(j). */
  double p;
  uint64_t name_hash;
  int step;
  int64_t b0, h0, heads, sq, skv;
};

/* The positions of the shard's row @i and of the block's key @j. */
__device__ __forceinline__ int64_t ring_qpos(const RingDims &d, int64_t i)
{
  if (d.half <= 0)
    return d.s0 + i;
  return i < d.half ? d.q_lo + i : d.q_lo2 + i - d.half;
}

__device__ __forceinline__ int64_t ring_kpos(const RingDims &d, int64_t j)
{
  if (d.half <= 0)
    return d.ring_lo + j;
  return j < d.half ? d.ring_lo + j : d.ring_lo2 + j - d.half;
}

/* Query row r = (b, h, i) of Q [nb, ns, Hh, E] (rows of the projection), its block rows
 * (b, j, h / group) of [nb, nk, Hk, E]. */
__device__ __forceinline__ void ring_row(const RingDims &d, int64_t r, int64_t *b, int64_t *h,
                                         int64_t *i)
{
  *i = r % d.ns;
  int64_t t = r / d.ns;
  *h = t % d.Hh;
  *b = t / d.Hh;
}

__device__ __forceinline__ float ring_score(const RingDims &d, const float *q, const float *K,
                                            int64_t b, int64_t g, int64_t j)
{
  const float *k = K + ((b * d.nk + j) * d.Hk + g) * d.E;
  float acc = 0.f;
  for (int64_t e = 0; e < d.E; e++)
    acc += q[e] * k[e];
  return acc * d.scale;
}

__device__ __forceinline__ float ring_keep(const RingDims &d, int64_t b, int64_t h, int64_t i,
                                           int64_t j)
{
  if (d.p <= 0.0)
    return 1.f;
  uint64_t idx = (uint64_t)((((d.b0 + b) * d.heads + d.h0 + h) * d.sq + ring_qpos(d, i)) *
                            d.skv + ring_kpos(d, j));
  return dropout_keep(d.name_hash, idx, d.step, d.p) ? (float)(1.0 / (1.0 - d.p)) : 0.f;
}

/* Online softmax: the block's scores rescale what the earlier blocks summed. */
__global__ void ring_step_kernel(RingDims d, const float *Q, const float *K, const float *V,
                                 float *m, float *l, float *O)
{
  int64_t rows = d.nb * d.Hh * d.ns;
  for (int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r < rows;
       r += (int64_t)gridDim.x * blockDim.x) {
    int64_t b, h, i;
    ring_row(d, r, &b, &h, &i);
    int64_t g = h / d.group, qi = ring_qpos(d, i), row = (b * d.ns + i) * d.Hh + h;
    const float *q = Q + row * d.E;
    float mx = -INFINITY;
    for (int64_t j = 0; j < d.nk; j++)
      if (!(d.causal && ring_kpos(d, j) > qi))
        mx = fmaxf(mx, ring_score(d, q, K, b, g, j));
    if (mx == -INFINITY)
      continue;
    float mnew = fmaxf(m[row], mx);
    float alpha = m[row] == -INFINITY ? 0.f : expf(m[row] - mnew);
    float *o = O + row * d.E;
    for (int64_t e = 0; e < d.E; e++)
      o[e] *= alpha;
    double sum = 0;
    for (int64_t j = 0; j < d.nk; j++) {
      if (d.causal && ring_kpos(d, j) > qi)
        continue;
      float pj = expf(ring_score(d, q, K, b, g, j) - mnew);
      sum += pj;
      float w = pj * ring_keep(d, b, h, i, j);
      if (w == 0.f)
        continue;
      const float *v = V + ((b * d.nk + j) * d.Hk + g) * d.E;
      for (int64_t e = 0; e < d.E; e++)
        o[e] += w * v[e];
    }
    l[row] = (float)(l[row] * alpha + sum);
    m[row] = mnew;
  }
}

/* O /= l; m becomes the log-sum-exp. */
__global__ void ring_finish_kernel(float *m, const float *l, float *O, int64_t rows, int64_t E)
{
  for (int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r < rows;
       r += (int64_t)gridDim.x * blockDim.x) {
    for (int64_t e = 0; e < E; e++)
      O[r * E + e] /= l[r];
    m[r] += logf(l[r]);
  }
}

/* D[r] = dO[r] . O[r]. */
__global__ void ring_dot_kernel(const float *dO, const float *O, float *D, int64_t rows,
                                int64_t E)
{
  for (int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r < rows;
       r += (int64_t)gridDim.x * blockDim.x) {
    double acc = 0;
    for (int64_t e = 0; e < E; e++)
      acc += (double)dO[r * E + e] * O[r * E + e];
    D[r] = (float)acc;
  }
}

/* dQ of the row, and the block's dK and dV (atomics), from P = exp(s - lse). */
__global__ void ring_backward_step_kernel(RingDims d, const float *Q, const float *K,
                                          const float *V, float *dK, float *dV,
                                          const float *lse, const float *dO, const float *D,
                                          float *dQ)
{
  int64_t rows = d.nb * d.Hh * d.ns;
  for (int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r < rows;
       r += (int64_t)gridDim.x * blockDim.x) {
    int64_t b, h, i;
    ring_row(d, r, &b, &h, &i);
    int64_t g = h / d.group, qi = ring_qpos(d, i), row = (b * d.ns + i) * d.Hh + h;
    const float *q = Q + row * d.E, *go = dO + row * d.E;
    float *dq = dQ + row * d.E;
    for (int64_t j = 0; j < d.nk; j++) {
      if (d.causal && ring_kpos(d, j) > qi)
        continue;
      float p = expf(ring_score(d, q, K, b, g, j) - lse[row]);
      float mk = ring_keep(d, b, h, i, j);
      int64_t kv = ((b * d.nk + j) * d.Hk + g) * d.E;
      float dp = 0.f;
      for (int64_t e = 0; e < d.E; e++) {
        dp += go[e] * V[kv + e];
        atomicAdd(dV + kv + e, p * mk * go[e]);
      }
      float ds = p * (dp * mk - D[row]) * d.scale;
      for (int64_t e = 0; e < d.E; e++) {
        dq[e] += ds * K[kv + e];
        atomicAdd(dK + kv + e, ds * q[e]);
      }
    }
  }
}

/* pcu_rope() of a member's rows X [samples x ns, nh heads x E] at their positions: the
 * shard's contiguous ones, or each sample's two chunks under the two-chunk layout. */
static PcuStatus ring_rope(PcuContext *ctx, const RingDims &d, float *X, int64_t nh, double base,
                           double sign)
{
  if (d.half <= 0)
    return pcu_rope(ctx, PCU_F32, X, d.nb * d.ns, d.ns, d.s0, nh, d.E, base, sign);
  for (int64_t b = 0; b < d.nb; b++)
    for (int c = 0; c < 2; c++) {
      int64_t r0 = b * d.ns + c * d.half, n = c ? d.ns - d.half : d.half;
      TRY(pcu_rope(ctx, PCU_F32, X + r0 * nh * d.E, n, n, c ? d.q_lo2 : d.q_lo, nh, d.E, base,
                   sign));
    }
  return PCU_OK;
}

/* x's own rows times the projection @j's weights (+ bias) into @out [rows, cols]. */
static PcuStatus ring_project(PcuContext *ctx, Scratch &s, const PcuOpArgs *a, const Dense &x,
                              int j, int64_t rows, int64_t D, int64_t cols, bool bias,
                              float *out)
{
  Dense w;
  TRY(dense_in(ctx, s, a->w[j], PCU_F32, &w));
  TRY(pcu_gemm(ctx, PCU_F32, false, false, rows, cols, D, 1.f, x.p, D, 0, w.p, cols, 0, 0.f,
               out, cols, 0, 1));
  if (bias) {
    Dense b;
    TRY(dense_in(ctx, s, a->w[4 + j], PCU_F32, &b));
    ring_bias_kernel<<<pcu_blocks(rows * cols), 256, 0, ctx->stream>>>(out, (const float *)b.p,
                                                                        rows, cols);
    LAUNCH_CHECK(ctx);
  }
  return PCU_OK;
}

PcuStatus pcu_op_ring_attention(PcuContext *ctx, const PcuOpArgs *a)
{
  enum { DB, DS, DH };
  if (a->dtype != PCU_F32)
    return FAIL(ctx, PCU_ERR_UNSUPPORTED, "ring attention computes in fp32 only");
  const PcuArg &X = a->in[0];
  int64_t nb = X.region.hi[0] - X.region.lo[0], ns = X.region.hi[1] - X.region.lo[1];
  int64_t Dm = X.region.hi[2] - X.region.lo[2];
  int64_t group = a->kv_heads > 0 && a->heads % a->kv_heads == 0 ? a->heads / a->kv_heads : 1;
  int64_t E = a->head_dim, Hk = a->hi[DH] - a->lo[DH], Hh = Hk * group;
  int64_t Iq = Hh * E, Ik = Hk * E, rows = nb * Hh * ns, R = nb * ns;
  bool bias = a->has_bias && a->n_weights == 8;
  const PcuArg &B = a->ring;
  int64_t nk = B.region.ndim == 5 ? B.region.hi[2] - B.region.lo[2] : 0;
  if (!B.v.data || B.region.ndim != 5 || nk != ns || B.region.hi[1] - B.region.lo[1] != nb ||
      B.region.hi[3] - B.region.lo[3] != Hk || B.region.hi[4] - B.region.lo[4] != E ||
      !pcu_view_is_dense_region(&B.v, &B.region))
    return FAIL(ctx, PCU_ERR_INVALID, "a ring phase without a dense block of the shard's size");
  float *plane[4];
  for (int k = 0; k < 4; k++)
    plane[k] = (float *)B.v.data + (size_t)k * (size_t)(R * Ik);
  RingDims d = { nb, ns, nk, Hh, Hk, group, E, a->lo[DS], a->ring_lo, a->ring_half,
                 a->ring_q_lo, a->ring_q_lo2, a->ring_lo2, a->causal,
                 1.f / sqrtf((float)E), a->p, a->name_hash, a->step,
                 a->lo[DB] + a->sample_offset, a->lo[DH] * group,
                 a->full_ndim == 4 ? a->full[1] : a->heads,
                 a->full_ndim == 4 ? a->full[2] : ns, a->full_ndim == 4 ? a->full[3] : ns };
  size_t fb = sizeof(float);
  Scratch s(ctx);
  float *Q, *m, *l, *O;
  if (a->phase == PCU_RING_BEGIN) {
    TRY(saved_buffer(ctx, a->saved, RING_Q, (size_t)(R * Iq) * fb, (void **)&Q));
    TRY(saved_buffer(ctx, a->saved, RING_M, (size_t)rows * fb, (void **)&m));
    TRY(saved_buffer(ctx, a->saved, RING_L, (size_t)rows * fb, (void **)&l));
    TRY(saved_buffer(ctx, a->saved, RING_O, (size_t)(R * Iq) * fb, (void **)&O));
  } else {
    Q = (float *)saved_get(a->saved, RING_Q, (size_t)(R * Iq) * fb);
    m = (float *)saved_get(a->saved, RING_M, (size_t)rows * fb);
    l = (float *)saved_get(a->saved, RING_L, (size_t)rows * fb);
    O = (float *)saved_get(a->saved, RING_O, (size_t)(R * Iq) * fb);
    if (!Q || !m || !l || !O)
      return FAIL(ctx, PCU_ERR_INVALID, "a ring phase before the ring's forward pass");
  }
  if (a->phase == PCU_RING_STEP) {
    ring_step_kernel<<<pcu_blocks(rows), 256, 0, ctx->stream>>>(d, Q, plane[0], plane[1], m, l,
                                                                  O);
    LAUNCH_CHECK(ctx);
    return PCU_OK;
  }
  Dense x;
  TRY(dense_in(ctx, s, X, PCU_F32, &x));
  if (a->phase == PCU_RING_BEGIN || a->phase == PCU_RING_BACKWARD_BEGIN) {
    /* The own block: keys rotated by their positions, and values. */
    TRY(ring_project(ctx, s, a, x, 1, R, Dm, Ik, bias, plane[0]));
    TRY(ring_project(ctx, s, a, x, 2, R, Dm, Ik, bias, plane[1]));
    if (a->rotary)
      TRY(ring_rope(ctx, d, plane[0], Hk, a->rotary_base, 1.0));
  }
  if (a->phase == PCU_RING_BEGIN) {
    TRY(ring_project(ctx, s, a, x, 0, R, Dm, Iq, bias, Q));
    if (a->rotary)
      TRY(ring_rope(ctx, d, Q, Hh, a->rotary_base, 1.0));
    ring_init_kernel<<<pcu_blocks(R * Iq), 256, 0, ctx->stream>>>(m, l, O, rows, E);
    LAUNCH_CHECK(ctx);
    return PCU_OK;
  }
  Dense wo;
  TRY(dense_in(ctx, s, a->w[3], PCU_F32, &wo));
  if (a->phase == PCU_RING_END) {
    ring_finish_kernel<<<pcu_blocks(rows), 256, 0, ctx->stream>>>(m, l, O, rows, E);
    LAUNCH_CHECK(ctx);
    Dense y;
    TRY(dense_out(ctx, s, a->out[0], PCU_F32, &y));
    TRY(pcu_gemm(ctx, PCU_F32, false, false, R, Dm, Iq, 1.f, O, Iq, 0, wo.p, Dm, 0,
                 dense_adds(y, a->accumulate) ? 1.f : 0.f, y.p, Dm, 0, 1));
    if (bias && a->bias_here) {
      Dense bo;
      TRY(dense_in(ctx, s, a->w[7], PCU_F32, &bo));
      ring_bias_kernel<<<pcu_blocks(R * Dm), 256, 0, ctx->stream>>>(
        (float *)y.p, (const float *)bo.p, R, Dm);
      LAUNCH_CHECK(ctx);
    }
    return dense_commit(ctx, a->out[0], y, a->accumulate);
  }
  float *dO, *Dv, *dQ;
  if (a->phase == PCU_RING_BACKWARD_BEGIN) {
    TRY(saved_buffer(ctx, a->saved, RING_DO, (size_t)(R * Iq) * fb, (void **)&dO));
    TRY(saved_buffer(ctx, a->saved, RING_D, (size_t)rows * fb, (void **)&Dv));
    TRY(saved_buffer(ctx, a->saved, RING_DQ, (size_t)(R * Iq) * fb, (void **)&dQ));
    CUDA_CHECK(ctx, cudaMemsetAsync(plane[2], 0, (size_t)(2 * R * Ik) * fb, ctx->stream));
    CUDA_CHECK(ctx, cudaMemsetAsync(dQ, 0, (size_t)(R * Iq) * fb, ctx->stream));
    /* The output projection: dO = dY Wo^T, dWo += O^T dY, dbo += sum dY. */
    Dense dy;
    TRY(dense_in(ctx, s, a->out_grad[0], PCU_F32, &dy));
    TRY(pcu_gemm(ctx, PCU_F32, false, true, R, Iq, Dm, 1.f, dy.p, Dm, 0, wo.p, Dm, 0, 0.f, dO,
                 Iq, 0, 1));
    if (present(a->w_grad[3])) {
      Dense dwo;
      TRY(dense_out(ctx, s, a->w_grad[3], PCU_F32, &dwo));
      TRY(pcu_gemm(ctx, PCU_F32, true, false, Iq, Dm, R, 1.f, O, Iq, 0, dy.p, Dm, 0,
                   dense_adds(dwo, true) ? 1.f : 0.f, dwo.p, Dm, 0, 1));
      TRY(dense_commit(ctx, a->w_grad[3], dwo, true));
    }
    if (bias && a->bias_here && present(a->w_grad[7])) {
      Dense dbo;
      TRY(dense_out(ctx, s, a->w_grad[7], PCU_F32, &dbo));
      TRY(pcu_colsum(ctx, s, PCU_F32, dy.p, R, Dm, dbo.p, dense_adds(dbo, true)));
      TRY(dense_commit(ctx, a->w_grad[7], dbo, true));
    }
    ring_dot_kernel<<<pcu_blocks(rows), 256, 0, ctx->stream>>>(dO, O, Dv, rows, E);
    LAUNCH_CHECK(ctx);
    return PCU_OK;
  }
  dO = (float *)saved_get(a->saved, RING_DO, (size_t)(R * Iq) * fb);
  Dv = (float *)saved_get(a->saved, RING_D, (size_t)rows * fb);
  dQ = (float *)saved_get(a->saved, RING_DQ, (size_t)(R * Iq) * fb);
  if (!dO || !Dv || !dQ)
    return FAIL(ctx, PCU_ERR_INVALID, "a ring's backward step before its beginning");
  if (a->phase == PCU_RING_BACKWARD_STEP) {
    ring_backward_step_kernel<<<pcu_blocks(rows), 256, 0, ctx->stream>>>(
      d, Q, plane[0], plane[1], plane[2], plane[3], m, dO, Dv, dQ);
    LAUNCH_CHECK(ctx);
    return PCU_OK;
  }
  /* RING_BACKWARD_END: the block is back with its dK and dV summed over the ring. */
  float *dK = NULL;
  TRY(scratch_tensor(s, PCU_F32, R * Ik, (void **)&dK));
  CUDA_CHECK(ctx, cudaMemcpyAsync(dK, plane[2], (size_t)(R * Ik) * fb, cudaMemcpyDeviceToDevice,
                                  ctx->stream));
  if (a->rotary) {
    TRY(ring_rope(ctx, d, dQ, Hh, a->rotary_base, -1.0));
    TRY(ring_rope(ctx, d, dK, Hk, a->rotary_base, -1.0));
  }
  const float *dproj[3] = { dQ, dK, plane[3] };
  int64_t cols[3] = { Iq, Ik, Ik };
  for (int j = 0; j < 3; j++) {
    int64_t n = cols[j];
    /* The shard's own rows: the keys' and values' gradients too (the ring brought the
     * rest of the sequence's queries' share). */
    PcuArg xg = a->in_grad[j];
    xg.region = X.region;
    if (present(a->w_grad[j])) {
      Dense dw;
      TRY(dense_out(ctx, s, a->w_grad[j], PCU_F32, &dw));
      TRY(pcu_gemm(ctx, PCU_F32, true, false, Dm, n, R, 1.f, x.p, Dm, 0, dproj[j], n, 0,
                   dense_adds(dw, true) ? 1.f : 0.f, dw.p, n, 0, 1));
      TRY(dense_commit(ctx, a->w_grad[j], dw, true));
    }
    if (bias && present(a->w_grad[4 + j])) {
      Dense db;
      TRY(dense_out(ctx, s, a->w_grad[4 + j], PCU_F32, &db));
      TRY(pcu_colsum(ctx, s, PCU_F32, dproj[j], R, n, db.p, dense_adds(db, true)));
      TRY(dense_commit(ctx, a->w_grad[4 + j], db, true));
    }
    if (present(xg)) {
      Dense w, dx;
      TRY(dense_in(ctx, s, a->w[j], PCU_F32, &w));
      TRY(dense_out(ctx, s, xg, PCU_F32, &dx));
      TRY(pcu_gemm(ctx, PCU_F32, false, true, R, Dm, n, 1.f, dproj[j], n, 0, w.p, n, 0,
                   dense_adds(dx, true) ? 1.f : 0.f, dx.p, Dm, 0, 1));
      TRY(dense_commit(ctx, xg, dx, true));
    }
  }
  return PCU_OK;
}
