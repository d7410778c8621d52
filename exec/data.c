/* data.c — the initial weights and the input data of a run, as functions of names and
 * global element indices (exec_hash_uniform), so that a parallel strategy and one device
 * start from the same numbers and see the same batches. */
#include "exec-private.h"

#include <math.h>
#include <string.h>

/* The spread of the initial values of weight @i of @op: uniform in [-a, a] around a
 * center, scaled by fan-in as the frameworks' default initializers are, so that a few
 * layers neither explode nor vanish. */
static void init_spread(const SimGraph *g, int op, int i, double *center, double *a)
{
  SimShape w = sim_graph_op_weight_shape(g, op, i);
  *center = 0;
  *a = 0.1;
  switch (sim_graph_op_type(g, op)) {
  case SIM_OP_LINEAR:
  case SIM_OP_LSTM:
    if (i == 0)
      *a = sqrt(1.0 / (double)w.dims[0]);
    return;
  case SIM_OP_CONV2D:
    if (i == 0)
      *a = sqrt(1.0 / (double)(sim_shape_numel(&w) / w.dims[0]));
    return;
  case SIM_OP_ATTENTION:
    if (i < 4)
      *a = sqrt(1.0 / (double)w.dims[0]);
    return;
  case SIM_OP_EMBEDDING:
    *a = sqrt(3.0 / (double)w.dims[1]);
    return;
  case SIM_OP_GATED_MLP:
    *a = sqrt(1.0 / (double)w.dims[0]);
    return;
  case SIM_OP_MOE:
    /* The experts' weights [E, fan-in, fan-out]. */
    *a = sqrt(1.0 / (double)w.dims[1]);
    return;
  case SIM_OP_BATCHNORM:
  case SIM_OP_LAYERNORM:
  case SIM_OP_RMSNORM:
    /* gamma near 1, beta near 0: not exactly, so that their gradients matter. */
    if (i == 0)
      *center = 1.0;
    return;
  default:
    return;
  }
}

void exec_weight_init(const SimGraph *g, int owner, int i, const SimRegion *box, uint64_t seed,
                      float *out)
{
  SimShape shape = sim_graph_op_weight_shape(g, owner, i);
  const char *name = sim_graph_op_name(g, owner);
  double center, a;
  init_spread(g, owner, i, &center, &a);
  int64_t idx[SIM_MAX_DIMS];
  for (int d = 0; d < box->ndim; d++)
    idx[d] = box->lo[d];
  int64_t k = 0;
  if (exec_region_is_empty(box))
    return;
  do {
    int64_t flat = 0;
    for (int d = 0; d < shape.ndim; d++)
      flat = flat * shape.dims[d] + idx[d];
    double u = exec_hash_uniform(name, (uint64_t)flat, seed * 64 + (uint64_t)i);
    out[k++] = (float)(center + a * (2 * u - 1));
  } while (exec_region_next(box, idx));
}

int64_t exec_input_int_range(const SimGraph *g, int t)
{
  int64_t range = 0;
  int n = sim_graph_tensor_n_consumers(g, t);
  for (int c = 0; c < n; c++) {
    int op = sim_graph_tensor_consumer(g, t, c);
    int64_t r = 0;
    g_autoptr(SimAttrs) attrs = sim_graph_op_attrs(g, op);
    if (sim_graph_op_type(g, op) == SIM_OP_EMBEDDING) {
      sim_attrs_get_int(attrs, "vocab", &r);
    } else if (sim_graph_op_type(g, op) == SIM_OP_CROSS_ENTROPY) {
      SimShape logits = sim_graph_tensor_shape(g, sim_graph_op_input(g, op, 0));
      r = logits.dims[logits.ndim - 1];
    }
    if (r > 0 && (range == 0 || r < range))
      range = r;
  }
  return range;
}

void exec_input_fill(const SimGraph *g, int t, const SimShape *full, const SimRegion *box,
                     const int *sample_dims, int64_t sample_offset, int step, uint64_t seed,
                     SimDType dtype, void *out)
{
  const char *name = sim_graph_tensor_name(g, t);
  int64_t range = dtype == SIM_DTYPE_INT64 ? exec_input_int_range(g, t) : 0;
  if (dtype == SIM_DTYPE_INT64 && range < 1)
    range = 2;
  int64_t idx[SIM_MAX_DIMS];
  for (int d = 0; d < box->ndim; d++)
    idx[d] = box->lo[d];
  if (exec_region_is_empty(box))
    return;
  int64_t k = 0;
  uint64_t salt = seed * 1000003 + (uint64_t)step;
  /* Position embeddings read the positions 0 .. seq - 1 of the last dimension. */
  gboolean positions = dtype == SIM_DTYPE_INT64 && strcmp(name, "positions") == 0;
  do {
    if (positions) {
      ((int64_t *)out)[k++] = MIN(idx[full->ndim - 1], range - 1);
      continue;
    }
    int64_t flat = 0;
    for (int d = 0; d < full->ndim; d++)
      flat = flat * full->dims[d] + idx[d] + (sample_dims[d] ? sample_offset : 0);
    double u = exec_hash_uniform(name, (uint64_t)flat, salt);
    if (dtype == SIM_DTYPE_INT64)
      ((int64_t *)out)[k++] = MIN((int64_t)(u * (double)range), range - 1);
    else
      ((float *)out)[k++] = (float)(2 * u - 1);
  } while (exec_region_next(box, idx));
}
