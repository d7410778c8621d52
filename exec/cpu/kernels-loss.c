/* kernels-loss.c — the CPU kernels of the losses: softmax cross entropy against integer
 * labels, and mean squared error, per sample (or token).
 *
 * Cross entropy over split classes keeps per-row statistics instead of a loss
 * (parasol-exec.h): each shard merges the maximum of its logits, the sum of their
 * exponentials relative to it and the logit of the label, when it holds the label's
 * class; the driver then all-reduces the maxima, rescales, all-reduces the sums and
 * finishes, which gives the loss one device computes, to rounding. */
#include "cpu-private.h"

/* Cross entropy's rows: every dimension but the classes. */
static gboolean rows_first(const ExecKernelArgs *a, int r, SimRegion *rows, int64_t *idx)
{
  rows->ndim = r - 1;
  for (int d = 0; d < r - 1; d++) {
    rows->lo[d] = a->lo[d];
    rows->hi[d] = a->hi[d];
    idx[d] = a->lo[d];
  }
  return !exec_region_is_empty(rows);
}

static float *stat(const ExecKernelArgs *a, int plane, const int64_t *row, int nrow)
{
  int64_t idx[SIM_MAX_DIMS + 1];
  idx[0] = plane;
  for (int d = 0; d < nrow; d++)
    idx[d + 1] = row[d];
  return cpu_f32(a->stats) + cpu_off(a->stats, idx);
}

gboolean cpu_kernel_cross_entropy(const ExecKernelArgs *a, GError **error)
{
  const ExecView *L = &a->in[0], *T = &a->in[1], *Y = &a->out[0];
  int r = L->box.ndim;
  int64_t c0 = a->lo[r - 1], c1 = a->hi[r - 1];
  SimShape ls = sim_graph_tensor_shape(a->graph, sim_graph_op_input(a->graph, a->op, 0));
  int64_t C = ls.dims[r - 1];
  SimRegion rows;
  int64_t idx[SIM_MAX_DIMS];
  if (!rows_first(a, r, &rows, idx))
    return TRUE;
  const float *x = cpu_f32(L);
  const int64_t *lab = cpu_i64(T);
  do {
    if (a->phase == EXEC_KERNEL_STATS_RESCALE) {
      *stat(a, EXEC_STATS_SUM, idx, r - 1) *=
        expf(*stat(a, EXEC_STATS_LOCAL_MAX, idx, r - 1) - *stat(a, EXEC_STATS_MAX, idx, r - 1));
      continue;
    }
    if (a->phase == EXEC_KERNEL_STATS_FINISH) {
      cpu_f32(Y)[cpu_off(Y, idx)] = *stat(a, EXEC_STATS_MAX, idx, r - 1) +
                                    logf(*stat(a, EXEC_STATS_SUM, idx, r - 1)) -
                                    *stat(a, EXEC_STATS_LABEL, idx, r - 1);
      continue;
    }
    int64_t label = lab[cpu_off(T, idx)];
    if (label < 0 || label >= C) {
      g_set_error(error, EXEC_ERROR, EXEC_ERROR_UNSUPPORTED,
                  "op '%s': label %" G_GINT64_FORMAT " is outside the %" G_GINT64_FORMAT
                  " classes", sim_graph_op_name(a->graph, a->op), label, C);
      return FALSE;
    }
    idx[r - 1] = c0;
    const float *xr = x + cpu_off(L, idx);
    int64_t xs = L->stride[r - 1];
    float m, s;
    if (a->split_stats) {
      m = *stat(a, EXEC_STATS_MAX, idx, r - 1);
      s = *stat(a, EXEC_STATS_SUM, idx, r - 1);
    } else {
      m = -INFINITY;
      for (int64_t c = c0; c < c1; c++)
        m = MAX(m, xr[(c - c0) * xs]);
      double sum = 0;
      for (int64_t c = c0; c < c1; c++)
        sum += expf(xr[(c - c0) * xs] - m);
      s = (float)sum;
    }
    if (a->phase == EXEC_KERNEL_FORWARD) {
      float z = label >= c0 && label < c1 ? xr[(label - c0) * xs] : 0.0f;
      if (!a->accumulate) {
        cpu_f32(Y)[cpu_off(Y, idx)] = m + logf(s) - z;
        continue;
      }
      /* Merge this shard's statistics into the device's (online softmax). */
      float *pm = stat(a, EXEC_STATS_LOCAL_MAX, idx, r - 1);
      float *ps = stat(a, EXEC_STATS_SUM, idx, r - 1);
      float nm = MAX(*pm, m);
      *ps = (*pm == -INFINITY ? 0.0f : *ps * expf(*pm - nm)) + s * expf(m - nm);
      *pm = nm;
      *stat(a, EXEC_STATS_LABEL, idx, r - 1) += z;
      continue;
    }
    const ExecView *DX = &a->in_grad[0];
    if (!cpu_has(DX))
      continue;
    float g = cpu_f32(&a->out_grad[0])[cpu_off(&a->out_grad[0], idx)];
    float *dxr = cpu_f32(DX) + cpu_off(DX, idx);
    int64_t ds = DX->stride[r - 1];
    for (int64_t c = c0; c < c1; c++) {
      float p = expf(xr[(c - c0) * xs] - m) / s;
      dxr[(c - c0) * ds] += g * (p - (c == label ? 1.0f : 0.0f));
    }
  } while (exec_region_next(&rows, idx));
  return TRUE;
}

gboolean cpu_kernel_mse_loss(const ExecKernelArgs *a, GError **error)
{
  const ExecView *P = &a->in[0], *T = &a->in[1], *Y = &a->out[0];
  int r = P->box.ndim;
  SimShape full = sim_graph_tensor_shape(a->graph, sim_graph_op_input(a->graph, a->op, 0));
  double per = (double)sim_shape_numel(&full) / (double)full.dims[0];
  SimRegion reg = { .ndim = r };
  int64_t idx[SIM_MAX_DIMS];
  for (int d = 0; d < r; d++) {
    reg.lo[d] = a->lo[d];
    reg.hi[d] = a->hi[d];
    idx[d] = a->lo[d];
  }
  if (exec_region_is_empty(&reg))
    return TRUE;
  const float *p = cpu_f32(P), *t = cpu_f32(T);
  gboolean fwd = a->phase == EXEC_KERNEL_FORWARD;
  if (fwd && !a->accumulate)
    for (int64_t b = reg.lo[0]; b < reg.hi[0]; b++)
      cpu_f32(Y)[(b - Y->box.lo[0]) * Y->stride[0]] = 0;
  const ExecView *DP = &a->in_grad[0], *DT = &a->in_grad[1];
  do {
    float diff = p[cpu_off(P, idx)] - t[cpu_off(T, idx)];
    if (fwd) {
      cpu_f32(Y)[(idx[0] - Y->box.lo[0]) * Y->stride[0]] += (float)(diff * diff / per);
      continue;
    }
    const ExecView *DY = &a->out_grad[0];
    float g = cpu_f32(DY)[(idx[0] - DY->box.lo[0]) * DY->stride[0]] * (float)(2.0 * diff / per);
    if (cpu_has(DP))
      cpu_f32(DP)[cpu_off(DP, idx)] += g;
    if (cpu_has(DT))
      cpu_f32(DT)[cpu_off(DT, idx)] -= g;
  } while (exec_region_next(&reg, idx));
  return TRUE;
}
