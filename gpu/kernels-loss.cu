/* kernels-loss.cu — the library's own kernels of the end of a step: the losses (cross
 * entropy over classes split across shards, mean squared error) and the optimizer's update
 * (SGD with momentum, Adam) of a weight's shard. */
#include "rows.cuh"

#include <math.h>
#include <string.h>

/* ---------------------------------------------------------------------------------- */
/* Cross entropy                                                                       */

/* One row's log-sum-exp over classes [0, C) of @x, and its maximum. */
template <typename T>
__device__ void row_lse(const T *x, int64_t C, float *buf, float *max_out, float *sum_out)
{
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x)
    m = fmaxf(m, to_f<T>(x[j]));
  m = block_max(m, buf);
  float s = 0.f;
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x)
    s += expf(to_f<T>(x[j]) - m);
  *sum_out = block_sum(s, buf);
  *max_out = m;
}

/* Where the statistic @plane of row @r is in the statistics view. */
__device__ __forceinline__ float *stat_at(const Strided &st, int64_t rows, int plane, int64_t r)
{
  return (float *)st.base + strided_offset(st, plane * rows + r);
}

template <typename T>
__global__ void ce_forward_kernel(const void *xv, const int64_t *labels, void *lossv,
                                  Strided stats, int64_t rows, int64_t C, int64_t c0,
                                  bool merge, bool add)
{
  __shared__ float buf[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T *x = (const T *)xv + r * C;
    float m, s;
    row_lse<T>(x, C, buf, &m, &s);
    int64_t lab = labels[r] - c0;
    bool hit = lab >= 0 && lab < C;
    float xl = hit ? to_f<T>(x[lab]) : 0.f;
    if (threadIdx.x != 0)
      continue;
    if (!merge) {
      float loss = logf(s) + m - xl;
      T *o = (T *)lossv + r;
      *o = from_f<T>(add ? to_f<T>(*o) + loss : loss);
      continue;
    }
    /* Merge with what this device's earlier class shards left (the driver starts the
     * local maximum at -inf and the sums at 0), bringing both sums to the larger
     * maximum. */
    float *lm = stat_at(stats, rows, PCU_STATS_LOCAL_MAX, r);
    float *ss = stat_at(stats, rows, PCU_STATS_SUM, r);
    float *sl = stat_at(stats, rows, PCU_STATS_LABEL, r);
    float old_max = *lm;
    float nm = fmaxf(old_max, m);
    *ss = (old_max == -INFINITY ? 0.f : *ss * expf(old_max - nm)) + s * expf(m - nm);
    *lm = nm;
    if (hit)
      *sl += xl;
  }
}

__global__ void ce_rescale_kernel(Strided stats, int64_t rows)
{
  for (int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r < rows;
       r += (int64_t)gridDim.x * blockDim.x) {
    float *ss = stat_at(stats, rows, PCU_STATS_SUM, r);
    *ss *= expf(*stat_at(stats, rows, PCU_STATS_LOCAL_MAX, r) -
                *stat_at(stats, rows, PCU_STATS_MAX, r));
  }
}

template <typename T>
__global__ void ce_finish_kernel(Strided stats, void *lossv, int64_t rows)
{
  for (int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r < rows;
       r += (int64_t)gridDim.x * blockDim.x)
    ((T *)lossv)[r] = from_f<T>(logf(*stat_at(stats, rows, PCU_STATS_SUM, r)) +
                                *stat_at(stats, rows, PCU_STATS_MAX, r) -
                                *stat_at(stats, rows, PCU_STATS_LABEL, r));
}

template <typename T>
__global__ void ce_backward_kernel(const void *xv, const int64_t *labels, const void *dlv,
                                   Strided stats, bool split, void *dxv, int64_t rows, int64_t C,
                                   int64_t c0, bool add)
{
  __shared__ float buf[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T *x = (const T *)xv + r * C;
    T *dx = (T *)dxv + r * C;
    float m, s;
    if (split) {
      m = *stat_at(stats, rows, PCU_STATS_MAX, r);
      s = *stat_at(stats, rows, PCU_STATS_SUM, r);
    } else {
      row_lse<T>(x, C, buf, &m, &s);
    }
    float dl = to_f<T>(((const T *)dlv)[r]);
    int64_t lab = labels[r] - c0;
    float inv = 1.f / s;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
      float g = (expf(to_f<T>(x[j]) - m) * inv - (j == lab ? 1.f : 0.f)) * dl;
      dx[j] = from_f<T>(add ? to_f<T>(dx[j]) + g : g);
    }
  }
}

PcuStatus pcu_op_cross_entropy(PcuContext *ctx, const PcuOpArgs *a)
{
  int dt = a->dtype;
  const PcuArg &X = a->in[0];
  int64_t C = rlast(X.region), rows = C ? pcu_region_numel(&X.region) / C : 0;
  int64_t c0 = X.region.lo[X.region.ndim - 1];
  bool split = a->split_stats || (a->phase == PCU_FORWARD && a->accumulate);
  Strided st;
  memset(&st, 0, sizeof st);
  if (split || a->phase == PCU_STATS_RESCALE || a->phase == PCU_STATS_FINISH) {
    if (!present(a->stats) || a->stats.v.dtype != PCU_F32)
      return FAIL(ctx, PCU_ERR_INVALID, "cross entropy over split classes needs fp32 statistics");
    st = pcu_strided(&a->stats.v, &a->stats.region);
    rows = pcu_region_numel(&a->stats.region) / PCU_STATS_PLANES;
  }
  if (rows == 0)
    return PCU_OK;
  Scratch s(ctx);
  if (a->phase == PCU_STATS_RESCALE) {
    ce_rescale_kernel<<<pcu_blocks(rows), 256, 0, ctx->stream>>>(st, rows);
    LAUNCH_CHECK(ctx);
    return PCU_OK;
  }
  if (a->phase == PCU_STATS_FINISH) {
    Dense loss;
    TRY(dense_out(ctx, s, a->out[0], dt, &loss));
    LAUNCH_FLOAT(ctx, dt, ce_finish_kernel, pcu_blocks(rows), 256, st, loss.p, rows);
    return dense_commit(ctx, a->out[0], loss, false);
  }
  Dense x, lab;
  TRY(dense_in(ctx, s, X, dt, &x));
  TRY(dense_in(ctx, s, a->in[1], PCU_I64, &lab));
  if (a->phase == PCU_FORWARD) {
    Dense loss = { NULL, 0, dt, false };
    if (!split)
      TRY(dense_out(ctx, s, a->out[0], dt, &loss));
    LAUNCH_FLOAT(ctx, dt, ce_forward_kernel, row_blocks(rows), ROW_THREADS, x.p,
                 (const int64_t *)lab.p, loss.p, st, rows, C, c0, split, false);
    return split ? PCU_OK : dense_commit(ctx, a->out[0], loss, false);
  }
  if (!present(a->in_grad[0]))
    return PCU_OK;
  Dense dl, dx;
  TRY(dense_in(ctx, s, a->out_grad[0], dt, &dl));
  TRY(dense_out(ctx, s, a->in_grad[0], dt, &dx));
  LAUNCH_FLOAT(ctx, dt, ce_backward_kernel, row_blocks(rows), ROW_THREADS, x.p,
               (const int64_t *)lab.p, dl.p, st, split, dx.p, rows, C, c0, dense_adds(dx, true));
  return dense_commit(ctx, a->in_grad[0], dx, true);
}

/* ---------------------------------------------------------------------------------- */
/* Mean squared error per sample                                                       */

template <typename T>
__global__ void mse_kernel(const void *pv, const void *tv, void *lv, int64_t rows, int64_t per,
                           float inv_n, bool add)
{
  __shared__ float buf[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T *p = (const T *)pv + r * per, *t = (const T *)tv + r * per;
    float sum = 0.f;
    for (int64_t j = threadIdx.x; j < per; j += blockDim.x) {
      float d = to_f<T>(p[j]) - to_f<T>(t[j]);
      sum += d * d;
    }
    sum = block_sum(sum, buf) * inv_n;
    if (threadIdx.x == 0) {
      T *l = (T *)lv + r;
      *l = from_f<T>(add ? to_f<T>(*l) + sum : sum);
    }
  }
}

template <typename T>
__global__ void mse_backward_kernel(const void *pv, const void *tv, const void *dlv, void *gpv,
                                    void *gtv, int64_t rows, int64_t per, float inv_n,
                                    bool add_p, bool add_t)
{
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < rows * per;
       i += (int64_t)gridDim.x * blockDim.x) {
    float g = 2.f * (to_f<T>(((const T *)pv)[i]) - to_f<T>(((const T *)tv)[i])) * inv_n *
              to_f<T>(((const T *)dlv)[i / per]);
    if (gpv) {
      T *d = (T *)gpv + i;
      *d = from_f<T>(add_p ? to_f<T>(*d) + g : g);
    }
    if (gtv) {
      T *d = (T *)gtv + i;
      *d = from_f<T>(add_t ? to_f<T>(*d) - g : -g);
    }
  }
}

PcuStatus pcu_op_mse(PcuContext *ctx, const PcuOpArgs *a)
{
  int dt = a->dtype;
  int64_t rows = rsize(a->in[0].region, 0);
  int64_t per = rows ? pcu_region_numel(&a->in[0].region) / rows : 0;
  /* The mean is over all of a sample's elements, of which a shard may hold part. */
  double n_full = 1;
  for (int d = 1; d < a->n_dims; d++)
    n_full *= (double)a->size[d];
  float inv_n = (float)(1.0 / n_full);
  if (rows == 0 || per == 0)
    return PCU_OK;
  Scratch s(ctx);
  Dense p, t;
  TRY(dense_in(ctx, s, a->in[0], dt, &p));
  TRY(dense_in(ctx, s, a->in[1], dt, &t));
  if (a->phase == PCU_FORWARD) {
    Dense l;
    TRY(dense_out(ctx, s, a->out[0], dt, &l));
    LAUNCH_FLOAT(ctx, dt, mse_kernel, row_blocks(rows), ROW_THREADS, p.p, t.p, l.p, rows, per,
                 inv_n, dense_adds(l, a->accumulate));
    return dense_commit(ctx, a->out[0], l, a->accumulate);
  }
  Dense dl, gp = { NULL, 0, dt, false }, gt = { NULL, 0, dt, false };
  TRY(dense_in(ctx, s, a->out_grad[0], dt, &dl));
  if (present(a->in_grad[0]))
    TRY(dense_out(ctx, s, a->in_grad[0], dt, &gp));
  if (present(a->in_grad[1]))
    TRY(dense_out(ctx, s, a->in_grad[1], dt, &gt));
  if (!gp.p && !gt.p)
    return PCU_OK;
  LAUNCH_FLOAT(ctx, dt, mse_backward_kernel, pcu_blocks(rows * per), 256, p.p, t.p, dl.p, gp.p,
               gt.p, rows, per, inv_n, dense_adds(gp, true), dense_adds(gt, true));
  if (gp.p)
    TRY(dense_commit(ctx, a->in_grad[0], gp, true));
  if (gt.p)
    TRY(dense_commit(ctx, a->in_grad[1], gt, true));
  return PCU_OK;
}

/* ---------------------------------------------------------------------------------- */
/* Optimizer                                                                           */

/* The weight's type; gradients, states of fp32. */
template <typename T>
__global__ void update_kernel(Strided W, Strided G, Strided S1, Strided S2, int64_t lo,
                              int64_t hi, int adam, float lr, float momentum, float b1, float b2,
                              float eps, float wd, float bc1, float bc2)
{
  for (int64_t i = lo + blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < hi;
       i += (int64_t)gridDim.x * blockDim.x) {
    T *w = (T *)W.base + strided_offset(W, i);
    float wv = to_f<T>(*w);
    float g = to_f<T>(((const T *)G.base)[strided_offset(G, i)]) + wd * wv;
    if (adam) {
      float *m = (float *)S1.base + strided_offset(S1, i);
      float *v = (float *)S2.base + strided_offset(S2, i);
      *m = b1 * *m + (1.f - b1) * g;
      *v = b2 * *v + (1.f - b2) * g * g;
      wv -= lr * (*m / bc1) / (sqrtf(*v / bc2) + eps);
    } else if (momentum > 0.f) {
      float *buf = (float *)S1.base + strided_offset(S1, i);
      *buf = momentum * *buf + g;
      wv -= lr * *buf;
    } else {
      wv -= lr * g;
    }
    *w = from_f<T>(wv);
  }
}

PcuStatus pcu_update(PcuContext *ctx, const PcuUpdateArgs *u)
{
  if (!ctx || !u)
    return PCU_ERR_INVALID;
  int64_t n = u->part_hi - u->part_lo;
  if (n <= 0)
    return PCU_OK;
  if (u->weight.dtype != u->grad.dtype)
    return FAIL(ctx, PCU_ERR_UNSUPPORTED, "a weight and its gradient of different types");
  bool states = u->adam || u->momentum > 0;
  if (states && (u->state1.dtype != PCU_F32 || (u->adam && u->state2.dtype != PCU_F32)))
    return FAIL(ctx, PCU_ERR_UNSUPPORTED, "optimizer states other than fp32");
  Strided W = pcu_flatten(pcu_strided(&u->weight, &u->region));
  Strided G = pcu_flatten(pcu_strided(&u->grad, &u->region));
  Strided S1 = W, S2 = W;
  if (states)
    S1 = pcu_flatten(pcu_strided(&u->state1, &u->region));
  if (u->adam)
    S2 = pcu_flatten(pcu_strided(&u->state2, &u->region));
  int step = u->step > 0 ? u->step : 1;
  float bc1 = (float)(1.0 - pow(u->beta1, step)), bc2 = (float)(1.0 - pow(u->beta2, step));
  LAUNCH_FLOAT(ctx, u->weight.dtype, update_kernel, pcu_blocks(n), 256, W, G, S1, S2,
               u->part_lo, u->part_hi, u->adam, (float)u->lr, (float)u->momentum,
               (float)u->beta1, (float)u->beta2, (float)u->eps, (float)u->weight_decay,
               u->adam ? bc1 : 1.f, u->adam ? bc2 : 1.f);
  return PCU_OK;
}
