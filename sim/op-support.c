/* op-support.c — what the operator classes (sim/ops/) use to describe themselves: their
 * iteration space and the maps from it to their tensors, extents of shards, the kernels
 * of one shard's work, and an op's output slots.  It calls nothing of the catalogue, so the classes depend
 * on it and not back on the graph.  sim_map_project() sits on the hot path of the
 * simulator and the search and does not allocate. */
#include "sim-private.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>

void sim_space_init(SimOp *op, int ndims)
{
  g_assert(ndims >= 1 && ndims <= SIM_MAX_ITER);
  g_free(op->space.maps);
  memset(op->space.dims, 0, sizeof op->space.dims);
  op->space.ndims = ndims;
  int n = op->n_inputs + op->n_weights + op->n_outputs;
  op->space.maps = g_new0(SimTensorMap, MAX(n, 1));
  for (int i = 0; i < n; i++) {
    const SimShape *s = i < op->n_inputs ? &op->in_shape[i]
                        : i < op->n_inputs + op->n_weights
                          ? &op->w_shape[i - op->n_inputs]
                          : &op->out_shape[i - op->n_inputs - op->n_weights];
    SimTensorMap *m = &op->space.maps[i];
    m->ndim = s->ndim;
    for (int t = 0; t < SIM_MAX_DIMS; t++)
      m->map[t] = (SimDimMap){ .dim = -1, .kdim = -1, .stride = 1, .dilation = 1, .shift = 0 };
  }
}

void sim_space_dim(SimOp *op, int d, const char *name, SimDimRole role, int64_t size,
                   gboolean splittable)
{
  g_assert(d >= 0 && d < op->space.ndims);
  SimIterDim *it = &op->space.dims[d];
  g_strlcpy(it->name, name, sizeof it->name);
  it->role = role;
  it->size = size;
  /* A dimension of size 1 cannot be split, whatever its kind. */
  it->splittable = splittable && size > 1;
}

void sim_map_identity(SimTensorMap *map, int tdim, int d)
{
  sim_map_affine(map, tdim, d, 1, -1, 1, 0);
}

void sim_map_affine(SimTensorMap *map, int tdim, int d, int stride, int kdim, int dilation,
                    int64_t shift)
{
  g_assert(tdim >= 0 && tdim < map->ndim && d < SIM_MAX_ITER && kdim < SIM_MAX_ITER);
  map->map[tdim] = (SimDimMap){
    .dim = (int8_t)d,
    .kdim = (int8_t)kdim,
    .stride = stride,
    .dilation = dilation,
    .shift = shift,
  };
}

void sim_map_project(const SimTensorMap *map, const SimShape *shape, const int64_t *lo,
                     const int64_t *hi, SimRegion *out)
{
  out->ndim = map->ndim;
  for (int t = 0; t < map->ndim; t++) {
    const SimDimMap *m = &map->map[t];
    int64_t size = shape->dims[t];
    if (m->dim < 0) {
      out->lo[t] = 0;
      out->hi[t] = size;
      continue;
    }
    int64_t a, b;
    if (hi[m->dim] <= lo[m->dim] || (m->kdim >= 0 && hi[m->kdim] <= lo[m->kdim])) {
      a = b = 0;
    } else {
      /* The image of [lo, hi) under i * stride + j * dilation - shift is spanned by its
       * two corners, since both coefficients are positive. */
      a = lo[m->dim] * m->stride - m->shift;
      b = (hi[m->dim] - 1) * m->stride - m->shift + 1;
      if (m->kdim >= 0) {
        a += lo[m->kdim] * m->dilation;
        b += (hi[m->kdim] - 1) * m->dilation;
      }
    }
    a = CLAMP(a, 0, size);
    b = CLAMP(b, 0, size);
    out->lo[t] = a;
    out->hi[t] = MAX(a, b);
  }
}

int64_t sim_map_numel(const SimTensorMap *map, const SimShape *shape, const int64_t *extent)
{
  int64_t n = 1;
  for (int t = 0; t < map->ndim; t++)
    n *= sim_map_dim_len(&map->map[t], shape->dims[t], extent);
  return n;
}

int64_t sim_extent_volume(const SimOp *op, const int64_t *extent)
{
  int64_t v = 1;
  for (int d = 0; d < op->space.ndims; d++)
    v *= extent[d];
  return v;
}

const int64_t *sim_op_extent(const SimOp *op, const int64_t *extent, int64_t *full)
{
  if (extent)
    return extent;
  for (int d = 0; d < op->space.ndims; d++)
    full[d] = op->space.dims[d].size;
  return full;
}

/* ---------------------------------------------------------------------------------- */
/* Work                                                                                */

void sim_work_add(SimWork *w, SimKernel k)
{
  /* The catalogue's classes emit at most SIM_MAX_KERNELS kernels per pass. */
  g_assert(w->n < SIM_MAX_KERNELS);
  w->k[w->n++] = k;
}

SimKernel sim_kernel_gemm(SimDType dt, int64_t batch, int64_t m, int64_t n, int64_t k)
{
  double es = sim_dtype_size(dt);
  return (SimKernel){
    .kind = SIM_KERNEL_GEMM,
    .dtype = dt,
    .m = m,
    .n = n,
    .k = k,
    .batch = batch,
    .steps = 1,
    .flops = 2.0 * (double)batch * (double)m * (double)n * (double)k,
    .bytes = es * (double)batch * ((double)m * k + (double)k * n + (double)m * n),
  };
}

SimKernel sim_kernel_memory(SimDType dt, double flops, double bytes)
{
  return (SimKernel){
    .kind = SIM_KERNEL_MEMORY,
    .dtype = dt,
    .batch = 1,
    .steps = 1,
    .flops = flops,
    .bytes = bytes,
  };
}

double sim_work_flops(const SimWork *w)
{
  g_return_val_if_fail(w != NULL, 0.0);
  double f = 0.0;
  for (int i = 0; i < w->n; i++)
    f += w->k[i].flops;
  return f;
}

double sim_work_bytes(const SimWork *w)
{
  g_return_val_if_fail(w != NULL, 0.0);
  double b = 0.0;
  for (int i = 0; i < w->n; i++)
    b += w->k[i].bytes;
  return b;
}

void sim_op_set_n_outputs(SimOp *op, int n)
{
  g_free(op->outputs);
  g_free(op->out_shape);
  g_free(op->out_dtype);
  op->n_outputs = n;
  op->outputs = g_new(int, MAX(n, 1));
  for (int i = 0; i < n; i++)
    op->outputs[i] = -1;
  op->out_shape = g_new0(SimShape, MAX(n, 1));
  op->out_dtype = g_new0(SimDType, MAX(n, 1));
}
