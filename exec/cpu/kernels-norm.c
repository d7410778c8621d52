/* kernels-norm.c — the CPU kernels of batch and layer normalization (epsilon 1e-5, biased
 * variance, as PyTorch trains).  Statistics are summed in double precision: they are
 * sums over many elements whose order differs between shards. */
#include "cpu-private.h"

#define NORM_EPS 1e-5

/* Batch norm: per channel over the shard's samples and positions (parasol-exec.h). */
gboolean cpu_kernel_batchnorm(const ExecKernelArgs *a, GError **error)
{
  const ExecView *X = &a->in[0], *Y = &a->out[0], *G = &a->w[0], *B = &a->w[1];
  int r = X->box.ndim;
  gboolean relu = cpu_attr_int(a, "relu", 0) != 0;
  gboolean fwd = a->phase == EXEC_KERNEL_FORWARD;
  const float *x = cpu_f32(X);
  for (int64_t c = a->lo[1]; c < a->hi[1]; c++) {
    SimRegion reg = { .ndim = r };
    for (int d = 0; d < r; d++) {
      reg.lo[d] = a->lo[d];
      reg.hi[d] = a->hi[d];
    }
    reg.lo[1] = c;
    reg.hi[1] = c + 1;
    if (exec_region_is_empty(&reg))
      continue;
    int64_t idx[SIM_MAX_DIMS];
    double sum = 0, sq = 0;
    int64_t n = sim_region_volume(&reg);
    for (int d = 0; d < r; d++)
      idx[d] = reg.lo[d];
    do {
      double v = x[cpu_off(X, idx)];
      sum += v;
      sq += v * v;
    } while (exec_region_next(&reg, idx));
    double mean = sum / (double)n;
    double var = MAX(sq / (double)n - mean * mean, 0.0);
    double rstd = 1.0 / sqrt(var + NORM_EPS);
    float gamma = cpu_f32(G)[(c - G->box.lo[0]) * G->stride[0]];
    float beta = cpu_f32(B)[(c - B->box.lo[0]) * B->stride[0]];
    for (int d = 0; d < r; d++)
      idx[d] = reg.lo[d];
    if (fwd) {
      float *y = cpu_f32(Y);
      do {
        float v = (float)(gamma * (x[cpu_off(X, idx)] - mean) * rstd + beta);
        y[cpu_off(Y, idx)] = relu && v < 0 ? 0.0f : v;
      } while (exec_region_next(&reg, idx));
      continue;
    }
    const ExecView *DY = &a->out_grad[0], *DX = &a->in_grad[0];
    const float *dy = cpu_f32(DY);
    double sdy = 0, sdyx = 0;
    do {
      double xh = (x[cpu_off(X, idx)] - mean) * rstd;
      double g = dy[cpu_off(DY, idx)];
      if (relu && gamma * xh + beta < 0)
        g = 0;
      sdy += g;
      sdyx += g * xh;
    } while (exec_region_next(&reg, idx));
    cpu_f32(&a->w_grad[0])[(c - a->w_grad[0].box.lo[0]) * a->w_grad[0].stride[0]] += (float)sdyx;
    cpu_f32(&a->w_grad[1])[(c - a->w_grad[1].box.lo[0]) * a->w_grad[1].stride[0]] += (float)sdy;
    if (!cpu_has(DX))
      continue;
    float *dx = cpu_f32(DX);
    for (int d = 0; d < r; d++)
      idx[d] = reg.lo[d];
    do {
      double xh = (x[cpu_off(X, idx)] - mean) * rstd;
      double g = dy[cpu_off(DY, idx)];
      if (relu && gamma * xh + beta < 0)
        g = 0;
      dx[cpu_off(DX, idx)] +=
        (float)(gamma * rstd * (g - sdy / (double)n - xh * sdyx / (double)n));
    } while (exec_region_next(&reg, idx));
  }
  return TRUE;
}

/* Layer norm: every row of the shard over the whole last dimension. */
gboolean cpu_kernel_layernorm(const ExecKernelArgs *a, GError **error)
{
  const ExecView *X = &a->in[0], *Y = &a->out[0], *G = &a->w[0], *B = &a->w[1];
  int r = X->box.ndim;
  int64_t D = a->hi[r - 1] - a->lo[r - 1];
  gboolean fwd = a->phase == EXEC_KERNEL_FORWARD;
  SimRegion rows = { .ndim = r - 1 };
  int64_t idx[SIM_MAX_DIMS];
  for (int d = 0; d < r - 1; d++) {
    rows.lo[d] = a->lo[d];
    rows.hi[d] = a->hi[d];
    idx[d] = a->lo[d];
  }
  if (exec_region_is_empty(&rows))
    return TRUE;
  const float *x = cpu_f32(X), *gm = cpu_f32(G), *bt = cpu_f32(B);
  int64_t gs = G->stride[0], bs = B->stride[0];
  const float *gp = gm + (a->lo[r - 1] - G->box.lo[0]) * gs;
  const float *bp = bt + (a->lo[r - 1] - B->box.lo[0]) * bs;
  double *xh = g_new(double, MAX(D, 1));
  do {
    idx[r - 1] = a->lo[r - 1];
    const float *xr = x + cpu_off(X, idx);
    int64_t xs = X->stride[r - 1];
    double sum = 0, sq = 0;
    for (int64_t k = 0; k < D; k++) {
      double v = xr[k * xs];
      sum += v;
      sq += v * v;
    }
    double mean = sum / (double)D;
    double rstd = 1.0 / sqrt(MAX(sq / (double)D - mean * mean, 0.0) + NORM_EPS);
    for (int64_t k = 0; k < D; k++)
      xh[k] = (xr[k * xs] - mean) * rstd;
    if (fwd) {
      float *yr = cpu_f32(Y) + cpu_off(Y, idx);
      int64_t ys = Y->stride[r - 1];
      for (int64_t k = 0; k < D; k++)
        yr[k * ys] = (float)(gp[k * gs] * xh[k] + bp[k * bs]);
      continue;
    }
    const ExecView *DY = &a->out_grad[0], *DX = &a->in_grad[0];
    const float *dyr = cpu_f32(DY) + cpu_off(DY, idx);
    int64_t dys = DY->stride[r - 1];
    float *dg = cpu_f32(&a->w_grad[0]) + (a->lo[r - 1] - a->w_grad[0].box.lo[0]) * a->w_grad[0].stride[0];
    float *db = cpu_f32(&a->w_grad[1]) + (a->lo[r - 1] - a->w_grad[1].box.lo[0]) * a->w_grad[1].stride[0];
    double mg = 0, mgx = 0;
    for (int64_t k = 0; k < D; k++) {
      double dy = dyr[k * dys];
      double g = dy * gp[k * gs];
      mg += g;
      mgx += g * xh[k];
      dg[k * a->w_grad[0].stride[0]] += (float)(dy * xh[k]);
      db[k * a->w_grad[1].stride[0]] += (float)dy;
    }
    mg /= (double)D;
    mgx /= (double)D;
    if (cpu_has(DX)) {
      float *dxr = cpu_f32(DX) + cpu_off(DX, idx);
      int64_t dxs = DX->stride[r - 1];
      for (int64_t k = 0; k < D; k++) {
        double g = dyr[k * dys] * gp[k * gs];
        dxr[k * dxs] += (float)(rstd * (g - mg - xh[k] * mgx));
      }
    }
  } while (exec_region_next(&rows, idx));
  g_free(xh);
  return TRUE;
}

/* RMS norm: every row of the shard over the whole last dimension, y = x rstd gamma with
 * rstd = 1 / sqrt(mean(x^2) + eps). */
gboolean cpu_kernel_rmsnorm(const ExecKernelArgs *a, GError **error)
{
  const ExecView *X = &a->in[0], *Y = &a->out[0], *G = &a->w[0];
  int r = X->box.ndim;
  int64_t D = a->hi[r - 1] - a->lo[r - 1];
  gboolean fwd = a->phase == EXEC_KERNEL_FORWARD;
  SimRegion rows = { .ndim = r - 1 };
  int64_t idx[SIM_MAX_DIMS];
  for (int d = 0; d < r - 1; d++) {
    rows.lo[d] = a->lo[d];
    rows.hi[d] = a->hi[d];
    idx[d] = a->lo[d];
  }
  if (exec_region_is_empty(&rows))
    return TRUE;
  const float *x = cpu_f32(X);
  int64_t gs = G->stride[0];
  const float *gp = cpu_f32(G) + (a->lo[r - 1] - G->box.lo[0]) * gs;
  do {
    idx[r - 1] = a->lo[r - 1];
    const float *xr = x + cpu_off(X, idx);
    int64_t xs = X->stride[r - 1];
    double sq = 0;
    for (int64_t k = 0; k < D; k++)
      sq += (double)xr[k * xs] * xr[k * xs];
    double rstd = 1.0 / sqrt(sq / (double)D + NORM_EPS);
    if (fwd) {
      float *yr = cpu_f32(Y) + cpu_off(Y, idx);
      int64_t ys = Y->stride[r - 1];
      for (int64_t k = 0; k < D; k++)
        yr[k * ys] = (float)(gp[k * gs] * xr[k * xs] * rstd);
      continue;
    }
    /* dx = rstd (g - xhat mean(g xhat)) with g = dy gamma, xhat = x rstd; dgamma = dy xhat. */
    const ExecView *DY = &a->out_grad[0], *DX = &a->in_grad[0], *DG = &a->w_grad[0];
    const float *dyr = cpu_f32(DY) + cpu_off(DY, idx);
    int64_t dys = DY->stride[r - 1], dgs = DG->stride[0];
    float *dg = cpu_f32(DG) + (a->lo[r - 1] - DG->box.lo[0]) * dgs;
    double mgx = 0;
    for (int64_t k = 0; k < D; k++) {
      double xh = xr[k * xs] * rstd, dy = dyr[k * dys];
      mgx += dy * gp[k * gs] * xh;
      dg[k * dgs] += (float)(dy * xh);
    }
    mgx /= (double)D;
    if (cpu_has(DX)) {
      float *dxr = cpu_f32(DX) + cpu_off(DX, idx);
      int64_t dxs = DX->stride[r - 1];
      for (int64_t k = 0; k < D; k++) {
        double xh = xr[k * xs] * rstd;
        dxr[k * dxs] += (float)(rstd * (dyr[k * dys] * gp[k * gs] - xh * mgx));
      }
    }
  } while (exec_region_next(&rows, idx));
  return TRUE;
}
