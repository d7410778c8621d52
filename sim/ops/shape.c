/* shape.c — operators that move data without computing on it: concat, split, reshape
 * and transpose.
 *
 * Their iteration spaces are chosen so that shards line up with their neighbours': concat
 * and reshape and transpose iterate over their output, split over its input, and the
 * other side is reached through the maps (a concat input is the output shifted by the
 * input's offset along the axis, clipped to the input's extent).  Dimension 0 stays the
 * batch: concat and split along it are refused, and a reshape or transpose that moves it
 * keeps a sample dimension that cannot be split. */
#include "../sim-private.h"

static void space_over(SimOp *op, const SimShape *s)
{
  sim_space_init(op, s->ndim);
  for (int d = 0; d < s->ndim; d++)
    sim_space_dim(op, d, sim_dim_generic_name(d), d == 0 ? SIM_ROLE_SAMPLE : SIM_ROLE_ATTRIBUTE,
                  s->dims[d], TRUE);
}

/* Resolves a possibly negative @axis of a rank-@ndim tensor into attribute slot @slot;
 * axis 0, the batch, is refused. */
static gboolean resolve_axis(SimOp *op, int slot, int ndim, GError **error)
{
  int64_t axis = op->attrs[slot].i[0];
  if (axis < 0)
    axis += ndim;
  if (axis < 0 || axis >= ndim) {
    sim_op_set_error(op, error, SIM_ERROR_INVALID, "axis %" G_GINT64_FORMAT
                     " is outside a tensor of %d dimensions", op->attrs[slot].i[0], ndim);
    return FALSE;
  }
  if (axis == 0) {
    sim_op_set_error(op, error, SIM_ERROR_INVALID,
                     "axis 0 is the batch; joining or splitting samples is not supported");
    return FALSE;
  }
  op->attrs[slot].i[0] = axis;
  return TRUE;
}

/* ---------------------------------------------------------------------------------- */
/* Concat                                                                              */

enum { C_AXIS };

static const SimAttrSpec concat_attrs[] = {
  [C_AXIS] = { "axis", SIM_ATTR_INT, 0, NULL, TRUE },
};

static gboolean concat_infer(SimOp *op, GError **error)
{
  if (!sim_op_check_rank(op, 0, 1, SIM_MAX_DIMS, error))
    return FALSE;
  const SimShape *first = &op->in_shape[0];
  if (!resolve_axis(op, C_AXIS, first->ndim, error))
    return FALSE;
  int axis = (int)op->attrs[C_AXIS].i[0];
  SimShape out = *first;
  for (int i = 1; i < op->n_inputs; i++) {
    const SimShape *s = &op->in_shape[i];
    gboolean ok = s->ndim == first->ndim && op->in_dtype[i] == op->in_dtype[0];
    for (int d = 0; ok && d < s->ndim; d++)
      ok = d == axis || s->dims[d] == first->dims[d];
    if (!ok) {
      g_autofree char *a = sim_shape_to_string(first);
      g_autofree char *b = sim_shape_to_string(s);
      sim_op_set_error(op, error, SIM_ERROR_INVALID,
                       "input %d is %s %s but input 0 is %s %s: they must agree except "
                       "along axis %d",
                       i, b, sim_dtype_name(op->in_dtype[i]), a,
                       sim_dtype_name(op->in_dtype[0]), axis);
      return FALSE;
    }
    out.dims[axis] += s->dims[axis];
  }
  sim_op_set_n_outputs(op, 1);
  op->out_shape[0] = out;
  op->out_dtype[0] = op->in_dtype[0];
  op->n_weights = 0;
  op->w_dtype = op->in_dtype[0];
  return TRUE;
}

static void concat_space(SimOp *op)
{
  const SimShape *out = &op->out_shape[0];
  int axis = (int)op->attrs[C_AXIS].i[0];
  space_over(op, out);
  int64_t offset = 0;
  for (int i = 0; i < op->n_inputs; i++) {
    SimTensorMap *m = &op->space.maps[i];
    for (int d = 0; d < out->ndim; d++)
      sim_map_affine(m, d, d, 1, -1, 1, d == axis ? offset : 0);
    offset += op->in_shape[i].dims[axis];
  }
  for (int d = 0; d < out->ndim; d++)
    sim_map_identity(&op->space.maps[op->n_inputs], d, d);
}

/* Concat copies every element once; its backward slices the gradient, which copies it
 * again. */
static void copy_work(const SimOp *op, const int64_t *extent, SimPass pass, SimWork *w)
{
  SimDType dt = op->out_dtype[0];
  double n = (double)sim_extent_volume(op, extent);
  sim_work_add(w, sim_kernel_memory(dt, 0, 2 * n * sim_dtype_size(dt)));
}

static int64_t nothing_saved(const SimOp *op, const int64_t *extent)
{
  return 0;
}

const SimOpClass sim_op_concat_class = {
  .type = SIM_OP_CONCAT,
  .name = "concat",
  .description = "concatenation of tensors along an axis",
  .attrs = concat_attrs,
  .n_attrs = G_N_ELEMENTS(concat_attrs),
  .min_inputs = 1,
  .max_inputs = -1,
  .infer = concat_infer,
  .space = concat_space,
  .work = copy_work,
  .saved_bytes = nothing_saved,
};

/* ---------------------------------------------------------------------------------- */
/* Split                                                                               */

enum { S_AXIS, S_SIZES };

static const SimAttrSpec split_attrs[] = {
  [S_AXIS] = { "axis", SIM_ATTR_INT, 0, NULL, TRUE },
  [S_SIZES] = { "sizes", SIM_ATTR_INTS, 0, NULL, TRUE },
};

static gboolean split_infer(SimOp *op, GError **error)
{
  if (!sim_op_check_rank(op, 0, 1, SIM_MAX_DIMS, error))
    return FALSE;
  const SimShape *in = &op->in_shape[0];
  if (!resolve_axis(op, S_AXIS, in->ndim, error))
    return FALSE;
  int axis = (int)op->attrs[S_AXIS].i[0];
  const SimAttrValue *sizes = &op->attrs[S_SIZES];
  int64_t sum = 0;
  for (int j = 0; j < sizes->n; j++) {
    if (sizes->i[j] < 1) {
      sim_op_set_error(op, error, SIM_ERROR_INVALID, "part %d has size %" G_GINT64_FORMAT, j,
                       sizes->i[j]);
      return FALSE;
    }
    sum += sizes->i[j];
  }
  if (sizes->n < 1 || sum != in->dims[axis]) {
    g_autofree char *s = sim_shape_to_string(in);
    sim_op_set_error(op, error, SIM_ERROR_INVALID,
                     "the sizes of the %d parts add up to %" G_GINT64_FORMAT
                     ", but dimension %d of the input %s is %" G_GINT64_FORMAT,
                     sizes->n, sum, axis, s, in->dims[axis]);
    return FALSE;
  }
  sim_op_set_n_outputs(op, sizes->n);
  for (int j = 0; j < sizes->n; j++) {
    op->out_shape[j] = *in;
    op->out_shape[j].dims[axis] = sizes->i[j];
    op->out_dtype[j] = op->in_dtype[0];
  }
  op->n_weights = 0;
  op->w_dtype = op->in_dtype[0];
  return TRUE;
}

static void split_space(SimOp *op)
{
  const SimShape *in = &op->in_shape[0];
  int axis = (int)op->attrs[S_AXIS].i[0];
  space_over(op, in);
  for (int d = 0; d < in->ndim; d++)
    sim_map_identity(&op->space.maps[0], d, d);
  int64_t offset = 0;
  for (int j = 0; j < op->n_outputs; j++) {
    SimTensorMap *m = &op->space.maps[op->n_inputs + j];
    for (int d = 0; d < in->ndim; d++)
      sim_map_affine(m, d, d, 1, -1, 1, d == axis ? offset : 0);
    offset += op->out_shape[j].dims[axis];
  }
}

static void split_work(const SimOp *op, const int64_t *extent, SimPass pass, SimWork *w)
{
  /* torch.split returns views; the backward concatenates the parts' gradients. */
  if (pass == SIM_PASS_BACKWARD) {
    SimDType dt = op->in_dtype[0];
    double n = (double)sim_extent_volume(op, extent);
    sim_work_add(w, sim_kernel_memory(dt, 0, 2 * n * sim_dtype_size(dt)));
  }
}

const SimOpClass sim_op_split_class = {
  .type = SIM_OP_SPLIT,
  .name = "split",
  .description = "split of a tensor into parts along an axis",
  .attrs = split_attrs,
  .n_attrs = G_N_ELEMENTS(split_attrs),
  .min_inputs = 1,
  .max_inputs = 1,
  .infer = split_infer,
  .space = split_space,
  .work = split_work,
  .saved_bytes = nothing_saved,
};

/* ---------------------------------------------------------------------------------- */
/* Reshape                                                                             */

enum { R_SHAPE };

static const SimAttrSpec reshape_attrs[] = {
  [R_SHAPE] = { "shape", SIM_ATTR_INTS, 0, NULL, TRUE },
};

static gboolean reshape_infer(SimOp *op, GError **error)
{
  const SimShape *in = &op->in_shape[0];
  SimAttrValue *shape = &op->attrs[R_SHAPE];
  if (shape->n < 1) {
    sim_op_set_error(op, error, SIM_ERROR_INVALID, "the target shape has no dimensions");
    return FALSE;
  }
  int unknown = -1;
  int64_t known = 1;
  for (int i = 0; i < shape->n; i++) {
    if (shape->i[i] == -1 && unknown < 0) {
      unknown = i;
    } else if (shape->i[i] < 1) {
      sim_op_set_error(op, error, SIM_ERROR_INVALID,
                       "dimension %d of the target shape is %" G_GINT64_FORMAT
                       " (only one may be -1, the others positive)",
                       i, shape->i[i]);
      return FALSE;
    } else {
      known *= shape->i[i];
    }
  }
  int64_t numel = sim_shape_numel(in);
  SimShape out = sim_shape_make(shape->n, shape->i);
  if (unknown >= 0 && numel % known == 0)
    out.dims[unknown] = numel / known;
  if (sim_shape_numel(&out) != numel || (unknown >= 0 && out.dims[unknown] < 1)) {
    g_autofree char *a = sim_shape_to_string(in);
    GString *b = g_string_new("[");
    for (int i = 0; i < shape->n; i++)
      g_string_append_printf(b, "%s%" G_GINT64_FORMAT, i ? ", " : "", shape->i[i]);
    g_string_append_c(b, ']');
    sim_op_set_error(op, error, SIM_ERROR_INVALID,
                     "cannot reshape %s (%" G_GINT64_FORMAT " elements) into %s", a, numel,
                     b->str);
    g_string_free(b, TRUE);
    return FALSE;
  }
  /* The resolved shape is stored, so the op reads the same from a file however it was
   * first written. */
  for (int i = 0; i < shape->n; i++)
    shape->i[i] = out.dims[i];
  sim_op_set_n_outputs(op, 1);
  op->out_shape[0] = out;
  op->out_dtype[0] = op->in_dtype[0];
  op->n_weights = 0;
  op->w_dtype = op->in_dtype[0];
  return TRUE;
}

static void reshape_space(SimOp *op)
{
  /* Leading and trailing dimensions the reshape keeps are the same dimensions on both
   * sides and are indexed one to one.  The dimensions between them are merged or split;
   * a shard of a merged dimension is not a box of the input, so they are read whole and
   * not split.  A reshape that changes dimension 0 (folding samples into another
   * dimension) keeps a sample dimension that cannot be split. */
  const SimShape *in = &op->in_shape[0], *out = &op->out_shape[0];
  space_over(op, out);
  int lim = MIN(in->ndim, out->ndim);
  int p = 0;
  while (p < lim && in->dims[p] == out->dims[p])
    p++;
  int q = 0;
  while (q < lim - p && in->dims[in->ndim - 1 - q] == out->dims[out->ndim - 1 - q])
    q++;
  for (int d = 0; d < out->ndim; d++) {
    sim_map_identity(&op->space.maps[1], d, d);
    if (d >= p && d < out->ndim - q)
      op->space.dims[d].splittable = FALSE;
  }
  for (int t = 0; t < p; t++)
    sim_map_identity(&op->space.maps[0], t, t);
  for (int j = 0; j < q; j++)
    sim_map_identity(&op->space.maps[0], in->ndim - 1 - j, out->ndim - 1 - j);
}

static void reshape_work(const SimOp *op, const int64_t *extent, SimPass pass, SimWork *w)
{
  /* A view of a contiguous tensor in both passes: no kernel. */
}

const SimOpClass sim_op_reshape_class = {
  .type = SIM_OP_RESHAPE,
  .name = "reshape",
  .description = "a view of a tensor with another shape (flatten, split heads)",
  .attrs = reshape_attrs,
  .n_attrs = G_N_ELEMENTS(reshape_attrs),
  .min_inputs = 1,
  .max_inputs = 1,
  .infer = reshape_infer,
  .space = reshape_space,
  .work = reshape_work,
  .saved_bytes = nothing_saved,
};

/* ---------------------------------------------------------------------------------- */
/* Transpose                                                                           */

enum { T_PERM };

static const SimAttrSpec transpose_attrs[] = {
  [T_PERM] = { "perm", SIM_ATTR_INTS, 0, NULL, TRUE },
};

static gboolean transpose_infer(SimOp *op, GError **error)
{
  const SimShape *in = &op->in_shape[0];
  const SimAttrValue *perm = &op->attrs[T_PERM];
  gboolean seen[SIM_MAX_DIMS] = { FALSE };
  gboolean ok = perm->n == in->ndim;
  for (int i = 0; ok && i < perm->n; i++) {
    ok = perm->i[i] >= 0 && perm->i[i] < in->ndim && !seen[perm->i[i]];
    if (ok)
      seen[perm->i[i]] = TRUE;
  }
  if (!ok) {
    g_autofree char *s = sim_shape_to_string(in);
    sim_op_set_error(op, error, SIM_ERROR_INVALID,
                     "the permutation has %d entries; for the input %s it must order 0..%d",
                     perm->n, s, in->ndim - 1);
    return FALSE;
  }
  SimShape out = { .ndim = in->ndim };
  for (int i = 0; i < in->ndim; i++)
    out.dims[i] = in->dims[perm->i[i]];
  sim_op_set_n_outputs(op, 1);
  op->out_shape[0] = out;
  op->out_dtype[0] = op->in_dtype[0];
  op->n_weights = 0;
  op->w_dtype = op->in_dtype[0];
  return TRUE;
}

static void transpose_space(SimOp *op)
{
  const SimShape *out = &op->out_shape[0];
  const SimAttrValue *perm = &op->attrs[T_PERM];
  space_over(op, out);
  for (int d = 0; d < out->ndim; d++) {
    sim_map_identity(&op->space.maps[0], (int)perm->i[d], d);
    sim_map_identity(&op->space.maps[1], d, d);
  }
  /* Output dimension 0 is not the samples when the permutation moves them. */
  if (perm->i[0] != 0)
    op->space.dims[0].splittable = FALSE;
}

const SimOpClass sim_op_transpose_class = {
  .type = SIM_OP_TRANSPOSE,
  .name = "transpose",
  .description = "a permutation of the dimensions, materialized by a copy",
  .attrs = transpose_attrs,
  .n_attrs = G_N_ELEMENTS(transpose_attrs),
  .min_inputs = 1,
  .max_inputs = 1,
  .infer = transpose_infer,
  .space = transpose_space,
  .work = copy_work,
  .saved_bytes = nothing_saved,
};
