/* shard.c — the regions of an operator's tensors that one shard touches, for callers
 * outside libsim (a search pricing the data that two configurations exchange).  The
 * lowering uses the same projection, sim_map_project(), on its own hot path. */
#include "sim-private.h"

gboolean sim_graph_op_shard_region(const SimGraph *g, int op, SimTensorRole role, int i,
                                   const int64_t *lo, const int64_t *hi, SimRegion *out)
{
  g_return_val_if_fail(g != NULL && op >= 0 && op < sim_graph_n_ops(g), FALSE);
  g_return_val_if_fail(lo != NULL && hi != NULL && out != NULL, FALSE);
  const SimOp *o = sim_graph_op_get(g, op);
  const SimTensorMap *map;
  const SimShape *shape;
  switch (role) {
  case SIM_TENSOR_INPUT:
    if (i < 0 || i >= o->n_inputs)
      return FALSE;
    map = sim_space_input_map(o, i);
    shape = &o->in_shape[i];
    break;
  case SIM_TENSOR_WEIGHT:
    if (i < 0 || i >= o->n_weights)
      return FALSE;
    map = sim_space_weight_map(o, i);
    shape = &o->w_shape[i];
    break;
  case SIM_TENSOR_OUTPUT:
    if (i < 0 || i >= o->n_outputs)
      return FALSE;
    map = sim_space_output_map(o, i);
    shape = &o->out_shape[i];
    break;
  default:
    return FALSE;
  }
  sim_map_project(map, shape, lo, hi, out);
  return TRUE;
}

/* The tensor map of input, weight or output @i of @o, or NULL for one it does not have. */
static const SimTensorMap *tensor_map(const SimOp *o, SimTensorRole role, int i)
{
  switch (role) {
  case SIM_TENSOR_INPUT:
    return i >= 0 && i < o->n_inputs ? sim_space_input_map(o, i) : NULL;
  case SIM_TENSOR_WEIGHT:
    return i >= 0 && i < o->n_weights ? sim_space_weight_map(o, i) : NULL;
  case SIM_TENSOR_OUTPUT:
    return i >= 0 && i < o->n_outputs ? sim_space_output_map(o, i) : NULL;
  default:
    return NULL;
  }
}

gboolean sim_map_indexed_by(const SimTensorMap *map, int d)
{
  for (int k = 0; k < map->ndim; k++)
    if (map->map[k].dim == d || map->map[k].kdim == d)
      return TRUE;
  return FALSE;
}

gboolean sim_map_partial(const SimOp *o, const int *degree, const SimTensorMap *map)
{
  for (int d = 0; d < o->space.ndims; d++)
    if (degree[d] > 1 && !sim_map_indexed_by(map, d))
      return TRUE;
  return FALSE;
}

gboolean sim_graph_op_dim_indexes(const SimGraph *g, int op, SimTensorRole role, int i, int d)
{
  g_return_val_if_fail(g != NULL && op >= 0 && op < sim_graph_n_ops(g), FALSE);
  const SimOp *o = sim_graph_op_get(g, op);
  const SimTensorMap *map = tensor_map(o, role, i);
  return map && d >= 0 && d < o->space.ndims && sim_map_indexed_by(map, d);
}

gboolean sim_graph_op_tensor_partial(const SimGraph *g, int op, SimTensorRole role, int i,
                                     const int *degree)
{
  g_return_val_if_fail(g != NULL && op >= 0 && op < sim_graph_n_ops(g), FALSE);
  g_return_val_if_fail(degree != NULL, FALSE);
  const SimOp *o = sim_graph_op_get(g, op);
  const SimTensorMap *map = tensor_map(o, role, i);
  return map && sim_map_partial(o, degree, map);
}

/* The integer value of attribute @name of @o, or @def when its type has none. */
static int64_t attr_or(const SimOp *o, const char *name, int64_t def)
{
  const SimOpClass *klass = sim_op_class(o->type);
  for (int k = 0; k < klass->n_attrs; k++)
    if (!strcmp(klass->attrs[k].name, name))
      return o->attrs[k].i[0];
  return def;
}

gboolean sim_op_fused_nonlinear(const SimOp *o)
{
  int64_t act = attr_or(o, "activation", SIM_UNARY_IDENTITY);
  return (act != SIM_UNARY_IDENTITY && act != SIM_UNARY_SCALE) || attr_or(o, "relu", 0);
}

gboolean sim_graph_op_fused_nonlinear(const SimGraph *g, int op)
{
  g_return_val_if_fail(g != NULL && op >= 0 && op < sim_graph_n_ops(g), FALSE);
  return sim_op_fused_nonlinear(sim_graph_op_get(g, op));
}
