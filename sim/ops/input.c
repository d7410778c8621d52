/* input.c — a data source: the samples, labels or token ids a training step reads.  It
 * computes nothing and has no weights; its iteration space is its tensor's dimensions so
 * that a strategy can place the shards of the data where their consumers need them. */
#include "../sim-private.h"

enum { A_SHAPE, A_DTYPE };

static const SimAttrSpec attrs[] = {
  [A_SHAPE] = { "shape", SIM_ATTR_INTS, 0, NULL, TRUE },
  [A_DTYPE] = { "dtype", SIM_ATTR_ENUM, SIM_DTYPE_FP32, sim_dtype_names, FALSE },
};

static gboolean infer(SimOp *op, GError **error)
{
  const SimAttrValue *shape = &op->attrs[A_SHAPE];
  if (shape->n < 1) {
    sim_op_set_error(op, error, SIM_ERROR_INVALID, "the shape has no dimensions");
    return FALSE;
  }
  for (int i = 0; i < shape->n; i++)
    if (shape->i[i] < 1) {
      sim_op_set_error(op, error, SIM_ERROR_INVALID,
                       "dimension %d of the shape is %" G_GINT64_FORMAT ", not positive", i,
                       shape->i[i]);
      return FALSE;
    }
  SimDType dt = (SimDType)op->attrs[A_DTYPE].i[0];
  sim_op_set_n_outputs(op, 1);
  op->out_shape[0] = sim_shape_make(shape->n, shape->i);
  op->out_dtype[0] = dt;
  op->n_weights = 0;
  op->w_dtype = dt;
  return TRUE;
}

static void space(SimOp *op)
{
  const SimShape *s = &op->out_shape[0];
  sim_space_init(op, s->ndim);
  for (int d = 0; d < s->ndim; d++) {
    sim_space_dim(op, d, sim_dim_generic_name(d), d == 0 ? SIM_ROLE_SAMPLE : SIM_ROLE_ATTRIBUTE,
                  s->dims[d], TRUE);
    sim_map_identity(&op->space.maps[0], d, d);
  }
}

static void work(const SimOp *op, const int64_t *extent, SimPass pass, SimWork *w)
{
  /* Reading the data is the data loader's business, overlapped with training. */
}

static int64_t saved_bytes(const SimOp *op, const int64_t *extent)
{
  return 0;
}

const SimOpClass sim_op_input_class = {
  .type = SIM_OP_INPUT,
  .name = "input",
  .description = "a data source (samples, labels, token ids): no compute, no weights",
  .attrs = attrs,
  .n_attrs = G_N_ELEMENTS(attrs),
  .min_inputs = 0,
  .max_inputs = 0,
  .infer = infer,
  .space = space,
  .work = work,
  .saved_bytes = saved_bytes,
};
