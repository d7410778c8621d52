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
