/* kernels-elementwise.c — the CPU kernels of element-wise functions, broadcasting binary
 * operators, softmax over the last dimension and dropout.  Their iteration space is the
 * output's dimensions, so a shard's range is its output region. */
#include "cpu-private.h"

/* The shard's output region: iteration dimension d is tensor dimension d. */
static SimRegion out_region(const ExecKernelArgs *a, int r)
{
  SimRegion reg = { .ndim = r };
  for (int d = 0; d < r; d++) {
    reg.lo[d] = a->lo[d];
    reg.hi[d] = a->hi[d];
  }
  return reg;
}

static gboolean first_point(const SimRegion *r, int64_t *idx)
{
  for (int d = 0; d < r->ndim; d++)
    idx[d] = r->lo[d];
  return !exec_region_is_empty(r);
}

gboolean cpu_kernel_unary(const ExecKernelArgs *a, GError **error)
{
  SimUnaryKind kind = (SimUnaryKind)cpu_attr_int(a, "kind", SIM_UNARY_IDENTITY);
  float scale = (float)cpu_attr_float(a, "scale", 1.0);
  const ExecView *X = &a->in[0];
  SimRegion reg = out_region(a, X->box.ndim);
  int64_t idx[SIM_MAX_DIMS];
  if (!first_point(&reg, idx))
    return TRUE;
  const float *x = cpu_f32(X);
  if (a->phase == EXEC_KERNEL_FORWARD) {
    float *y = cpu_f32(&a->out[0]);
    do
      y[cpu_off(&a->out[0], idx)] = cpu_act(kind, x[cpu_off(X, idx)], scale);
    while (exec_region_next(&reg, idx));
    return TRUE;
  }
  if (!cpu_has(&a->in_grad[0]))
    return TRUE;
  const float *dy = cpu_f32(&a->out_grad[0]);
  float *dx = cpu_f32(&a->in_grad[0]);
  do
    dx[cpu_off(&a->in_grad[0], idx)] +=
      dy[cpu_off(&a->out_grad[0], idx)] * cpu_act_grad(kind, x[cpu_off(X, idx)], scale);
  while (exec_region_next(&reg, idx));
  return TRUE;
}

/* The index into input @i of an output point: aligned at the right, a dimension of size 1
 * where the output's is larger stays at 0. */
static void bcast_index(const SimShape *in, const SimShape *out, const int64_t *oidx,
                        int64_t *iidx)
{
  int off = out->ndim - in->ndim;
  for (int t = 0; t < in->ndim; t++)
    iidx[t] = in->dims[t] == out->dims[t + off] ? oidx[t + off] : 0;
}

gboolean cpu_kernel_binary(const ExecKernelArgs *a, GError **error)
{
  SimBinaryKind kind = (SimBinaryKind)cpu_attr_int(a, "kind", SIM_BINARY_ADD);
  const SimGraph *g = a->graph;
  SimShape sa = sim_graph_tensor_shape(g, sim_graph_op_input(g, a->op, 0));
  SimShape sb = sim_graph_tensor_shape(g, sim_graph_op_input(g, a->op, 1));
  SimShape so = sim_graph_tensor_shape(g, sim_graph_op_output(g, a->op, 0));
  const ExecView *A = &a->in[0], *B = &a->in[1];
  SimRegion reg = out_region(a, so.ndim);
  int64_t idx[SIM_MAX_DIMS], ia[SIM_MAX_DIMS], ib[SIM_MAX_DIMS];
  if (!first_point(&reg, idx))
    return TRUE;
  const float *pa = cpu_f32(A), *pb = cpu_f32(B);
  if (a->phase == EXEC_KERNEL_FORWARD) {
    float *y = cpu_f32(&a->out[0]);
    do {
      bcast_index(&sa, &so, idx, ia);
      bcast_index(&sb, &so, idx, ib);
      float u = pa[cpu_off(A, ia)], v = pb[cpu_off(B, ib)];
      float r = kind == SIM_BINARY_ADD   ? u + v
                : kind == SIM_BINARY_SUB ? u - v
                : kind == SIM_BINARY_MUL ? u * v
                                         : u / v;
      y[cpu_off(&a->out[0], idx)] = r;
    } while (exec_region_next(&reg, idx));
    return TRUE;
  }
  const ExecView *DA = &a->in_grad[0], *DB = &a->in_grad[1];
  float *da = cpu_has(DA) ? cpu_f32(DA) : NULL;
  float *db = cpu_has(DB) ? cpu_f32(DB) : NULL;
  const float *dy = cpu_f32(&a->out_grad[0]);
  do {
    bcast_index(&sa, &so, idx, ia);
    bcast_index(&sb, &so, idx, ib);
    float gy = dy[cpu_off(&a->out_grad[0], idx)];
    float u = pa[cpu_off(A, ia)], v = pb[cpu_off(B, ib)];
    float gu, gv;
    switch (kind) {
    case SIM_BINARY_ADD:
      gu = gy;
      gv = gy;
      break;
    case SIM_BINARY_SUB:
      gu = gy;
      gv = -gy;
      break;
    case SIM_BINARY_MUL:
      gu = gy * v;
      gv = gy * u;
      break;
    default:
      gu = gy / v;
      gv = -gy * u / (v * v);
      break;
    }
    if (da)
      da[cpu_off(DA, ia)] += gu;
    if (db)
      db[cpu_off(DB, ib)] += gv;
  } while (exec_region_next(&reg, idx));
  return TRUE;
}

gboolean cpu_kernel_softmax(const ExecKernelArgs *a, GError **error)
{
  const ExecView *X = &a->in[0], *Y = &a->out[0];
  int r = X->box.ndim;
  int64_t c0 = a->lo[r - 1], C = a->hi[r - 1] - c0;
  SimRegion rows = out_region(a, r - 1);
  int64_t idx[SIM_MAX_DIMS];
  if (!first_point(&rows, idx))
    return TRUE;
  float *p = g_new(float, MAX(C, 1));
  do {
    idx[r - 1] = c0;
    const float *xr = cpu_f32(X) + cpu_off(X, idx);
    int64_t xs = X->stride[r - 1];
    float m = -INFINITY;
    for (int64_t k = 0; k < C; k++)
      m = MAX(m, xr[k * xs]);
    double s = 0;
    for (int64_t k = 0; k < C; k++) {
      p[k] = expf(xr[k * xs] - m);
      s += p[k];
    }
    for (int64_t k = 0; k < C; k++)
      p[k] = (float)(p[k] / s);
    if (a->phase == EXEC_KERNEL_FORWARD) {
      float *yr = cpu_f32(Y) + cpu_off(Y, idx);
      for (int64_t k = 0; k < C; k++)
        yr[k * Y->stride[r - 1]] = p[k];
      continue;
    }
    if (!cpu_has(&a->in_grad[0]))
      continue;
    const ExecView *DY = &a->out_grad[0], *DX = &a->in_grad[0];
    const float *dyr = cpu_f32(DY) + cpu_off(DY, idx);
    float *dxr = cpu_f32(DX) + cpu_off(DX, idx);
    double dot = 0;
    for (int64_t k = 0; k < C; k++)
      dot += dyr[k * DY->stride[r - 1]] * p[k];
    for (int64_t k = 0; k < C; k++)
      dxr[k * DX->stride[r - 1]] += (float)(p[k] * (dyr[k * DY->stride[r - 1]] - dot));
  } while (exec_region_next(&rows, idx));
  g_free(p);
  return TRUE;
}

gboolean cpu_kernel_dropout(const ExecKernelArgs *a, GError **error)
{
  double p = cpu_attr_float(a, "p", 0.5);
  const char *name = sim_graph_op_name(a->graph, a->op);
  SimShape full = sim_graph_tensor_shape(a->graph, sim_graph_op_output(a->graph, a->op, 0));
  const ExecView *X = &a->in[0];
  SimRegion reg = out_region(a, full.ndim);
  int64_t idx[SIM_MAX_DIMS];
  if (!first_point(&reg, idx))
    return TRUE;
  float keep_scale = (float)(1.0 / (1.0 - p));
  gboolean fwd = a->phase == EXEC_KERNEL_FORWARD;
  if (!fwd && !cpu_has(&a->in_grad[0]))
    return TRUE;
  const float *src = fwd ? cpu_f32(X) : cpu_f32(&a->out_grad[0]);
  const ExecView *SV = fwd ? X : &a->out_grad[0];
  const ExecView *DV = fwd ? &a->out[0] : &a->in_grad[0];
  float *dst = cpu_f32(DV);
  do {
    /* The element's index in the whole batch's tensor. */
    int64_t flat = 0;
    for (int d = 0; d < full.ndim; d++)
      flat = flat * full.dims[d] + idx[d] + (d == 0 ? a->sample_offset : 0);
    float m = exec_dropout_keep(name, (uint64_t)flat, a->step, p) ? keep_scale : 0.0f;
    float v = src[cpu_off(SV, idx)] * m;
    if (fwd)
      dst[cpu_off(DV, idx)] = v;
    else
      dst[cpu_off(DV, idx)] += v;
  } while (exec_region_next(&reg, idx));
  return TRUE;
}
