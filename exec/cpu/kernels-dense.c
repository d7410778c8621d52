/* kernels-dense.c — the CPU kernels of linear layers, batched matrix products and
 * embedding lookups, over any shard of their iteration spaces.
 *
 * The loops run over the shard's range in tensor coordinates and reach elements through
 * the views' strides; the innermost loop runs along the output features, which is the
 * contiguous dimension of the weights and outputs, so they stream through memory. */
#include "cpu-private.h"

#include <string.h>

/* Iterates the points of the leading @n dimensions [lo, hi) of @a's range. */
static gboolean lead_first(const ExecKernelArgs *a, int n, SimRegion *r, int64_t *idx)
{
  r->ndim = n;
  for (int d = 0; d < n; d++) {
    r->lo[d] = a->lo[d];
    r->hi[d] = a->hi[d];
    idx[d] = a->lo[d];
  }
  return n == 0 || !exec_region_is_empty(r);
}

/* ---- linear ------------------------------------------------------------------------------ */

gboolean cpu_kernel_linear(const ExecKernelArgs *a, GError **error)
{
  const ExecView *X = &a->in[0], *W = &a->w[0], *Y = &a->out[0];
  int r = X->box.ndim, nd = r - 1, kd = r;
  int64_t n0 = a->lo[nd], n1 = a->hi[nd], k0 = a->lo[kd], k1 = a->hi[kd];
  int64_t N = n1 - n0;
  gboolean bias = a->n_weights > 1 && k0 == 0;
  SimUnaryKind act = (SimUnaryKind)cpu_attr_int(a, "activation", SIM_UNARY_IDENTITY);
  const float *x = cpu_f32(X), *w = cpu_f32(W);
  const float *b = bias ? cpu_f32(&a->w[1]) : NULL;
  int64_t wns = W->stride[1];
  int64_t xks = X->stride[r - 1];
  float *z = g_new(float, MAX(N, 1));
  SimRegion rows;
  int64_t idx[SIM_MAX_DIMS];
  if (!lead_first(a, r - 1, &rows, idx)) {
    g_free(z);
    return TRUE;
  }
  if (a->phase == EXEC_KERNEL_FORWARD) {
    float *y = cpu_f32(Y);
    int64_t yns = Y->stride[r - 1];
    do {
      idx[r - 1] = k0;
      const float *xr = x + cpu_off(X, idx);
      idx[r - 1] = n0;
      float *yr = y + cpu_off(Y, idx);
      memset(z, 0, sizeof(float) * (size_t)N);
      for (int64_t k = k0; k < k1; k++) {
        float xv = xr[(k - k0) * xks];
        if (xv == 0)
          continue;
        const float *wr = w + cpu_off2(W, k, n0);
        for (int64_t n = 0; n < N; n++)
          z[n] += xv * wr[n * wns];
      }
      for (int64_t n = 0; n < N; n++) {
        float v = z[n] + (bias ? b[(n0 + n - a->w[1].box.lo[0]) * a->w[1].stride[0]] : 0.0f);
        if (a->accumulate)
          yr[n * yns] += v;
        else
          yr[n * yns] = cpu_act(act, v, 1.0f);
      }
    } while (exec_region_next(&rows, idx));
    g_free(z);
    return TRUE;
  }
  /* Backward: dZ = dY * act'(Z), with Z recomputed; dX += dZ W^T, dW += X^T dZ, db += dZ. */
  const ExecView *DY = &a->out_grad[0], *DX = &a->in_grad[0], *DW = &a->w_grad[0];
  const float *dy = cpu_f32(DY);
  float *dx = cpu_has(DX) ? cpu_f32(DX) : NULL;
  float *dw = cpu_f32(DW);
  float *db = bias ? cpu_f32(&a->w_grad[1]) : NULL;
  int64_t dwks = DW->stride[0], dwns = DW->stride[1];
  do {
    idx[r - 1] = k0;
    const float *xr = x + cpu_off(X, idx);
    float *dxr = dx ? dx + cpu_off(DX, idx) : NULL;
    int64_t dxks = dx ? DX->stride[r - 1] : 0;
    idx[r - 1] = n0;
    const float *dyr = dy + cpu_off(DY, idx);
    int64_t dyns = DY->stride[r - 1];
    if (act != SIM_UNARY_IDENTITY) {
      memset(z, 0, sizeof(float) * (size_t)N);
      for (int64_t k = k0; k < k1; k++) {
        float xv = xr[(k - k0) * xks];
        const float *wr = w + cpu_off2(W, k, n0);
        for (int64_t n = 0; n < N; n++)
          z[n] += xv * wr[n * wns];
      }
      for (int64_t n = 0; n < N; n++) {
        float v = z[n] + (bias ? b[(n0 + n - a->w[1].box.lo[0]) * a->w[1].stride[0]] : 0.0f);
        z[n] = dyr[n * dyns] * cpu_act_grad(act, v, 1.0f);
      }
    } else {
      for (int64_t n = 0; n < N; n++)
        z[n] = dyr[n * dyns];
    }
    for (int64_t k = k0; k < k1; k++) {
      const float *wr = w + cpu_off2(W, k, n0);
      float *dwr = dw + (k - DW->box.lo[0]) * dwks + (n0 - DW->box.lo[1]) * dwns;
      float xv = xr[(k - k0) * xks];
      float acc = 0;
      for (int64_t n = 0; n < N; n++) {
        acc += z[n] * wr[n * wns];
        dwr[n * dwns] += xv * z[n];
      }
      if (dxr)
        dxr[(k - k0) * dxks] += acc;
    }
    if (db)
      for (int64_t n = 0; n < N; n++)
        db[(n0 + n - a->w_grad[1].box.lo[0]) * a->w_grad[1].stride[0]] += z[n];
  } while (exec_region_next(&rows, idx));
  g_free(z);
  return TRUE;
}

/* ---- matmul ------------------------------------------------------------------------------- */

gboolean cpu_kernel_matmul(const ExecKernelArgs *a, GError **error)
{
  const ExecView *A = &a->in[0], *B = &a->in[1], *C = &a->out[0];
  int r = A->box.ndim, L = r - 2;
  gboolean tb = cpu_attr_int(a, "trans_b", 0) != 0;
  int64_t m0 = a->lo[L], m1 = a->hi[L], n0 = a->lo[L + 1], n1 = a->hi[L + 1];
  int64_t k0 = a->lo[L + 2], k1 = a->hi[L + 2];
  SimRegion lead;
  int64_t idx[SIM_MAX_DIMS];
  if (!lead_first(a, L, &lead, idx))
    return TRUE;
  /* B's (k, n) element sits at dims (r-2, r-1), or (r-1, r-2) when transposed. */
  int bk = tb ? r - 1 : r - 2, bn = tb ? r - 2 : r - 1;
  const float *pa = cpu_f32(A), *pb = cpu_f32(B);
  do {
    idx[r - 2] = m0;
    idx[r - 1] = k0;
    int64_t abase = cpu_off(A, idx);
    idx[bk] = k0;
    idx[bn] = n0;
    int64_t bbase = cpu_off(B, idx);
    idx[r - 2] = m0;
    idx[r - 1] = n0;
    int64_t as_m = A->stride[r - 2], as_k = A->stride[r - 1];
    int64_t bs_k = B->stride[bk], bs_n = B->stride[bn];
    if (a->phase == EXEC_KERNEL_FORWARD) {
      float *pc = cpu_f32(C) + cpu_off(C, idx);
      int64_t cs_m = C->stride[r - 2], cs_n = C->stride[r - 1];
      for (int64_t m = 0; m < m1 - m0; m++)
        for (int64_t n = 0; n < n1 - n0; n++) {
          float acc = 0;
          for (int64_t k = 0; k < k1 - k0; k++)
            acc += pa[abase + m * as_m + k * as_k] * pb[bbase + k * bs_k + n * bs_n];
          if (a->accumulate)
            pc[m * cs_m + n * cs_n] += acc;
          else
            pc[m * cs_m + n * cs_n] = acc;
        }
    } else {
      const ExecView *DC = &a->out_grad[0], *DA = &a->in_grad[0], *DB = &a->in_grad[1];
      const float *dc = cpu_f32(DC) + cpu_off(DC, idx);
      int64_t ds_m = DC->stride[r - 2], ds_n = DC->stride[r - 1];
      if (cpu_has(DA)) {
        idx[r - 2] = m0;
        idx[r - 1] = k0;
        float *da = cpu_f32(DA) + cpu_off(DA, idx);
        int64_t s_m = DA->stride[r - 2], s_k = DA->stride[r - 1];
        for (int64_t m = 0; m < m1 - m0; m++)
          for (int64_t k = 0; k < k1 - k0; k++) {
            float acc = 0;
            for (int64_t n = 0; n < n1 - n0; n++)
              acc += dc[m * ds_m + n * ds_n] * pb[bbase + k * bs_k + n * bs_n];
            da[m * s_m + k * s_k] += acc;
          }
      }
      if (cpu_has(DB)) {
        idx[bk] = k0;
        idx[bn] = n0;
        float *db = cpu_f32(DB) + cpu_off(DB, idx);
        int64_t s_k = DB->stride[bk], s_n = DB->stride[bn];
        for (int64_t k = 0; k < k1 - k0; k++)
          for (int64_t n = 0; n < n1 - n0; n++) {
            float acc = 0;
            for (int64_t m = 0; m < m1 - m0; m++)
              acc += pa[abase + m * as_m + k * as_k] * dc[m * ds_m + n * ds_n];
            db[k * s_k + n * s_n] += acc;
          }
      }
    }
    idx[r - 2] = m0;
    idx[r - 1] = n0;
  } while (L > 0 && exec_region_next(&lead, idx));
  return TRUE;
}

/* ---- embedding ---------------------------------------------------------------------------- */

gboolean cpu_kernel_embedding(const ExecKernelArgs *a, GError **error)
{
  const ExecView *I = &a->in[0], *W = &a->w[0], *Y = &a->out[0];
  gboolean bags = cpu_attr_int(a, "bags", 0) != 0;
  int ni = I->box.ndim, dd = ni, vd = ni + 1;
  int64_t d0 = a->lo[dd], d1 = a->hi[dd], v0 = a->lo[vd], v1 = a->hi[vd];
  int64_t vocab = cpu_attr_int(a, "vocab", 0);
  const int64_t *ids = cpu_i64(I);
  const ExecView *WT = a->phase == EXEC_KERNEL_FORWARD ? W : &a->w_grad[0];
  float *w = cpu_f32(WT);
  int64_t wds = WT->stride[1];
  /* Positions: (b) or (b, s); with bags (b) and the lookups n of each bag. */
  int np = bags ? 1 : ni;
  SimRegion pos;
  int64_t idx[SIM_MAX_DIMS];
  if (!lead_first(a, np, &pos, idx))
    return TRUE;
  int64_t n0 = bags ? a->lo[1] : 0, n1 = bags ? a->hi[1] : 1;
  const ExecView *T = a->phase == EXEC_KERNEL_FORWARD ? Y : &a->out_grad[0];
  float *y = cpu_f32(T);
  int64_t yds = T->stride[T->box.ndim - 1];
  do {
    int64_t yidx[SIM_MAX_DIMS];
    for (int k = 0; k < np; k++)
      yidx[k] = idx[k];
    yidx[T->box.ndim - 1] = d0;
    float *yr = y + cpu_off(T, yidx);
    if (a->phase == EXEC_KERNEL_FORWARD && !a->accumulate)
      for (int64_t d = 0; d < d1 - d0; d++)
        yr[d * yds] = 0;
    for (int64_t n = n0; n < n1; n++) {
      int64_t iidx[SIM_MAX_DIMS];
      for (int k = 0; k < np; k++)
        iidx[k] = idx[k];
      if (bags)
        iidx[1] = n;
      int64_t id = ids[cpu_off(I, iidx)];
      if (id < 0 || id >= vocab) {
        g_set_error(error, EXEC_ERROR, EXEC_ERROR_UNSUPPORTED,
                    "op '%s': token id %" G_GINT64_FORMAT " is outside the vocabulary of %"
                    G_GINT64_FORMAT, sim_graph_op_name(a->graph, a->op), id, vocab);
        return FALSE;
      }
      if (id < v0 || id >= v1)
        continue;
      float *wr = w + cpu_off2(WT, id, d0);
      if (a->phase == EXEC_KERNEL_FORWARD)
        for (int64_t d = 0; d < d1 - d0; d++)
          yr[d * yds] += wr[d * wds];
      else
        for (int64_t d = 0; d < d1 - d0; d++)
          wr[d * wds] += yr[d * yds];
    }
  } while (exec_region_next(&pos, idx));
  return TRUE;
}
