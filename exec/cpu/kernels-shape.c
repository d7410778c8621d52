/* kernels-shape.c — the CPU kernels of the operators that only move data: concat, split,
 * reshape and transpose.  Forward copies, backward adds the gradients back where they
 * came from. */
#include "cpu-private.h"

#include <string.h>

static SimRegion range_region(const ExecKernelArgs *a, int r)
{
  SimRegion reg = { .ndim = r };
  for (int d = 0; d < r; d++) {
    reg.lo[d] = a->lo[d];
    reg.hi[d] = a->hi[d];
  }
  return reg;
}

/* Moves @reg between @big (at the point) and @part (at the point shifted by -@shift
 * along @axis): forward big <- part (concat) or part <- big (split), or the gradients
 * added the other way. */
static void move(const ExecView *dst, const ExecView *src, const SimRegion *reg, int axis,
                 int64_t dst_shift, int64_t src_shift, gboolean accumulate)
{
  if (exec_region_is_empty(reg) || !cpu_has(dst) || !cpu_has(src))
    return;
  int64_t idx[SIM_MAX_DIMS], di[SIM_MAX_DIMS], si[SIM_MAX_DIMS];
  for (int d = 0; d < reg->ndim; d++)
    idx[d] = reg->lo[d];
  float *pd = cpu_f32(dst);
  const float *ps = cpu_f32(src);
  do {
    memcpy(di, idx, sizeof(int64_t) * (size_t)reg->ndim);
    memcpy(si, idx, sizeof(int64_t) * (size_t)reg->ndim);
    di[axis] -= dst_shift;
    si[axis] -= src_shift;
    float v = ps[cpu_off(src, si)];
    if (accumulate)
      pd[cpu_off(dst, di)] += v;
    else
      pd[cpu_off(dst, di)] = v;
  } while (exec_region_next(reg, idx));
}

gboolean cpu_kernel_concat(const ExecKernelArgs *a, GError **error)
{
  int axis = (int)cpu_attr_int(a, "axis", 1);
  int r = a->out[0].box.ndim;
  SimRegion reg = range_region(a, r);
  int64_t off = 0;
  for (int i = 0; i < a->n_inputs; i++) {
    SimShape s = sim_graph_tensor_shape(a->graph, sim_graph_op_input(a->graph, a->op, i));
    SimRegion part = reg;
    part.lo[axis] = MAX(reg.lo[axis], off);
    part.hi[axis] = MIN(reg.hi[axis], off + s.dims[axis]);
    if (part.hi[axis] > part.lo[axis]) {
      if (a->phase == EXEC_KERNEL_FORWARD)
        move(&a->out[0], &a->in[i], &part, axis, 0, off, FALSE);
      else
        move(&a->in_grad[i], &a->out_grad[0], &part, axis, off, 0, TRUE);
    }
    off += s.dims[axis];
  }
  return TRUE;
}

gboolean cpu_kernel_split(const ExecKernelArgs *a, GError **error)
{
  int axis = (int)cpu_attr_int(a, "axis", 1);
  int r = a->in[0].box.ndim;
  SimRegion reg = range_region(a, r);
  int64_t off = 0;
  for (int j = 0; j < a->n_outputs; j++) {
    SimShape s = sim_graph_tensor_shape(a->graph, sim_graph_op_output(a->graph, a->op, j));
    SimRegion part = reg;
    part.lo[axis] = MAX(reg.lo[axis], off);
    part.hi[axis] = MIN(reg.hi[axis], off + s.dims[axis]);
    if (part.hi[axis] > part.lo[axis]) {
      if (a->phase == EXEC_KERNEL_FORWARD)
        move(&a->out[j], &a->in[0], &part, axis, off, 0, FALSE);
      else
        move(&a->in_grad[0], &a->out_grad[j], &part, axis, 0, off, TRUE);
    }
    off += s.dims[axis];
  }
  return TRUE;
}

/* The micro-batch shape of a tensor whose dimension 0 holds the samples. */
static SimShape mb_shape(const ExecKernelArgs *a, int t, gboolean samples_first)
{
  SimShape s = sim_graph_tensor_shape(a->graph, t);
  if (samples_first && a->microbatches > 1)
    s.dims[0] /= a->microbatches;
  return s;
}

gboolean cpu_kernel_reshape(const ExecKernelArgs *a, GError **error)
{
  int tin = sim_graph_op_input(a->graph, a->op, 0);
  int tout = sim_graph_op_output(a->graph, a->op, 0);
  SimShape fin = sim_graph_tensor_shape(a->graph, tin);
  SimShape fout = sim_graph_tensor_shape(a->graph, tout);
  /* Both sides hold micro-batches along dimension 0 when the reshape keeps it (the plan
   * compiler refuses the others when there are several micro-batches). */
  gboolean keeps = fin.dims[0] == fout.dims[0];
  SimShape sin = mb_shape(a, tin, keeps), sout = mb_shape(a, tout, TRUE);
  SimRegion reg = range_region(a, sout.ndim);
  if (exec_region_is_empty(&reg))
    return TRUE;
  int64_t idx[SIM_MAX_DIMS], ii[SIM_MAX_DIMS];
  for (int d = 0; d < reg.ndim; d++)
    idx[d] = reg.lo[d];
  gboolean fwd = a->phase == EXEC_KERNEL_FORWARD;
  const ExecView *X = fwd ? &a->in[0] : &a->in_grad[0];
  const ExecView *Y = fwd ? &a->out[0] : &a->out_grad[0];
  if (!cpu_has(X))
    return TRUE;
  float *px = cpu_f32(X), *py = cpu_f32(Y);
  do {
    int64_t flat = 0;
    for (int d = 0; d < sout.ndim; d++)
      flat = flat * sout.dims[d] + idx[d];
    for (int d = sin.ndim - 1; d >= 0; d--) {
      ii[d] = flat % sin.dims[d];
      flat /= sin.dims[d];
    }
    if (fwd)
      py[cpu_off(Y, idx)] = px[cpu_off(X, ii)];
    else
      px[cpu_off(X, ii)] += py[cpu_off(Y, idx)];
  } while (exec_region_next(&reg, idx));
  return TRUE;
}

gboolean cpu_kernel_transpose(const ExecKernelArgs *a, GError **error)
{
  g_autoptr(SimAttrs) attrs = sim_graph_op_attrs(a->graph, a->op);
  int64_t perm[SIM_MAX_DIMS];
  int r = sim_attrs_get_ints(attrs, "perm", perm, SIM_MAX_DIMS);
  SimRegion reg = range_region(a, r);
  if (exec_region_is_empty(&reg))
    return TRUE;
  gboolean fwd = a->phase == EXEC_KERNEL_FORWARD;
  const ExecView *X = fwd ? &a->in[0] : &a->in_grad[0];
  const ExecView *Y = fwd ? &a->out[0] : &a->out_grad[0];
  if (!cpu_has(X))
    return TRUE;
  float *px = cpu_f32(X), *py = cpu_f32(Y);
  int64_t idx[SIM_MAX_DIMS], ii[SIM_MAX_DIMS];
  for (int d = 0; d < r; d++)
    idx[d] = reg.lo[d];
  do {
    for (int d = 0; d < r; d++)
      ii[perm[d]] = idx[d];
    if (fwd)
      py[cpu_off(Y, idx)] = px[cpu_off(X, ii)];
    else
      px[cpu_off(X, ii)] += py[cpu_off(Y, idx)];
  } while (exec_region_next(&reg, idx));
  return TRUE;
}
