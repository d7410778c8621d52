/* elementwise.c — element-wise unary and binary operators, softmax and dropout.
 *
 * All of them are bound by memory bandwidth: their kernels read and write every element
 * once and do a handful of operations on it.  Their iteration space is the output's
 * dimensions (the batch first, then attributes), every tensor is indexed by it directly,
 * and any dimension may be split, except the one softmax normalizes over. */
#include "../sim-private.h"

/* Iteration dimensions b, d1, d2, ... over @s with identity maps for every tensor of the
 * op whose shape equals @s; other maps are left to the caller. */
static void space_elementwise(SimOp *op, const SimShape *s)
{
  sim_space_init(op, s->ndim);
  for (int d = 0; d < s->ndim; d++)
    sim_space_dim(op, d, sim_dim_generic_name(d), d == 0 ? SIM_ROLE_SAMPLE : SIM_ROLE_ATTRIBUTE,
                  s->dims[d], TRUE);
  int n = op->n_inputs + op->n_weights + op->n_outputs;
  for (int i = 0; i < n; i++) {
    if (i >= op->n_inputs && i < op->n_inputs + op->n_weights)
      continue;
    const SimShape *t = i < op->n_inputs ? &op->in_shape[i]
                        : &op->out_shape[i - op->n_inputs - op->n_weights];
    if (!sim_shape_equal(t, s))
      continue;
    for (int d = 0; d < s->ndim; d++)
      sim_map_identity(&op->space.maps[i], d, d);
  }
}

/* Shared by the ops whose output is their input's shape and dtype. */
static gboolean infer_same(SimOp *op, GError **error)
{
  if (!sim_op_check_float(op, 0, error) || !sim_op_check_rank(op, 0, 1, SIM_MAX_DIMS, error))
    return FALSE;
  sim_op_set_n_outputs(op, 1);
  op->out_shape[0] = op->in_shape[0];
  op->out_dtype[0] = op->in_dtype[0];
  op->n_weights = 0;
  op->w_dtype = op->in_dtype[0];
  return TRUE;
}

static void space_same(SimOp *op)
{
  space_elementwise(op, &op->out_shape[0]);
}

/* ---------------------------------------------------------------------------------- */
/* Unary                                                                               */

enum { U_KIND, U_SCALE };

static const SimAttrSpec unary_attrs[] = {
  [U_KIND] = { "kind", SIM_ATTR_ENUM, SIM_UNARY_IDENTITY, sim_unary_kind_names, TRUE },
  [U_SCALE] = { "scale", SIM_ATTR_FLOAT, 1.0, NULL, FALSE },
};

/* Which tensor the backward pass of each function reads besides the incoming gradient:
 * PyTorch keeps the output of relu, sigmoid, tanh and exp (their derivatives are
 * functions of it), the input of gelu, silu and relu6 (hardtanh's backward), and nothing
 * for a scale. */
static gboolean unary_saves(SimUnaryKind k)
{
  return k != SIM_UNARY_IDENTITY && k != SIM_UNARY_SCALE;
}

static void unary_work(const SimOp *op, const int64_t *extent, SimPass pass, SimWork *w)
{
  SimUnaryKind kind = (SimUnaryKind)op->attrs[U_KIND].i[0];
  /* nn.Identity returns its input: no kernel in either pass. */
  if (kind == SIM_UNARY_IDENTITY)
    return;
  double n = (double)sim_extent_volume(op, extent);
  double es = sim_dtype_size(op->out_dtype[0]);
  gboolean bwd = pass == SIM_PASS_BACKWARD;
  /* Forward reads x and writes y; backward reads dy (and the saved tensor) and writes
   * dx. */
  double tensors = bwd ? (unary_saves(kind) ? 3 : 2) : 2;
  sim_work_add(w, sim_kernel_memory(op->out_dtype[0], sim_unary_flops(kind, bwd) * n,
                                    tensors * n * es));
}

static int64_t unary_saved(const SimOp *op, const int64_t *extent)
{
  int64_t full[SIM_MAX_ITER];
  const int64_t *e = sim_op_extent(op, extent, full);
  if (!unary_saves((SimUnaryKind)op->attrs[U_KIND].i[0]))
    return 0;
  return sim_extent_volume(op, e) * sim_dtype_size(op->out_dtype[0]);
}

const SimOpClass sim_op_unary_class = {
  .type = SIM_OP_UNARY,
  .name = "unary",
  .description = "element-wise function: relu, gelu, sigmoid, tanh, exp, silu, scale, relu6",
  .attrs = unary_attrs,
  .n_attrs = G_N_ELEMENTS(unary_attrs),
  .min_inputs = 1,
  .max_inputs = 1,
  .infer = infer_same,
  .space = space_same,
  .work = unary_work,
  .saved_bytes = unary_saved,
};

/* ---------------------------------------------------------------------------------- */
/* Binary, with NumPy broadcasting                                                    */

enum { B_KIND };

static const char *const binary_kind_names[] = { "add", "sub", "mul", "div", NULL };

static const SimAttrSpec binary_attrs[] = {
  [B_KIND] = { "kind", SIM_ATTR_ENUM, SIM_BINARY_ADD, binary_kind_names, TRUE },
};

/* The result type of mixing two dtypes: floating point wins over integers, the wider
 * type over the narrower, and fp16 with bf16 meet in fp32 (PyTorch's promotion). */
static SimDType promote(SimDType a, SimDType b)
{
  if (a == b)
    return a;
  gboolean fa = sim_dtype_is_float(a), fb = sim_dtype_is_float(b);
  if (fa != fb)
    return fa ? a : b;
  int sa = sim_dtype_size(a), sb = sim_dtype_size(b);
  if (sa != sb)
    return sa > sb ? a : b;
  return fa ? SIM_DTYPE_FP32 : SIM_DTYPE_INT64;
}

static gboolean binary_infer(SimOp *op, GError **error)
{
  const SimShape *a = &op->in_shape[0], *b = &op->in_shape[1];
  if (!sim_op_check_rank(op, 0, 1, SIM_MAX_DIMS, error) ||
      !sim_op_check_rank(op, 1, 1, SIM_MAX_DIMS, error))
    return FALSE;
  /* Shapes align at their last dimensions; a missing or size-1 dimension stretches. */
  int r = MAX(a->ndim, b->ndim);
  SimShape out = { .ndim = r };
  for (int i = 0; i < r; i++) {
    int ia = i - (r - a->ndim), ib = i - (r - b->ndim);
    int64_t da = ia >= 0 ? a->dims[ia] : 1, db = ib >= 0 ? b->dims[ib] : 1;
    if (da != db && da != 1 && db != 1) {
      g_autofree char *sa = sim_shape_to_string(a);
      g_autofree char *sb = sim_shape_to_string(b);
      sim_op_set_error(op, error, SIM_ERROR_INVALID,
                       "shapes %s and %s do not broadcast: aligned at the right, "
                       "%" G_GINT64_FORMAT " meets %" G_GINT64_FORMAT,
                       sa, sb, da, db);
      return FALSE;
    }
    out.dims[i] = da == 1 ? db : da;
  }
  sim_op_set_n_outputs(op, 1);
  op->out_shape[0] = out;
  op->out_dtype[0] = promote(op->in_dtype[0], op->in_dtype[1]);
  op->n_weights = 0;
  op->w_dtype = op->out_dtype[0];
  return TRUE;
}

static void binary_space(SimOp *op)
{
  const SimShape *out = &op->out_shape[0];
  space_elementwise(op, out);
  /* A broadcast input's dimension follows the output's where the sizes agree and is read
   * whole where it stretches from 1. */
  for (int i = 0; i < 2; i++) {
    const SimShape *in = &op->in_shape[i];
    SimTensorMap *m = &op->space.maps[i];
    for (int t = 0; t < in->ndim; t++) {
      int d = t + (out->ndim - in->ndim);
      if (in->dims[t] == out->dims[d])
        sim_map_identity(m, t, d);
    }
  }
}

static void binary_work(const SimOp *op, const int64_t *extent, SimPass pass, SimWork *w)
{
  SimBinaryKind kind = (SimBinaryKind)op->attrs[B_KIND].i[0];
  SimDType dt = op->out_dtype[0];
  double es = sim_dtype_size(dt);
  double n = (double)sim_extent_volume(op, extent);
  double na = (double)sim_map_numel(sim_space_input_map(op, 0), &op->in_shape[0], extent);
  double nb = (double)sim_map_numel(sim_space_input_map(op, 1), &op->in_shape[1], extent);
  if (pass == SIM_PASS_FORWARD) {
    sim_work_add(w, sim_kernel_memory(dt, n, (na + nb + n) * es));
    return;
  }
  /* The gradient of each input reads dy and writes the input's gradient, summing over
   * the dimensions it was broadcast along; mul and div also read both saved inputs
   * (d(a*b)/da = b, d(a/b)/db = -a/b^2). */
  if (kind == SIM_BINARY_ADD || kind == SIM_BINARY_SUB)
    sim_work_add(w, sim_kernel_memory(dt, n, (2 * n + na + nb) * es));
  else
    sim_work_add(w, sim_kernel_memory(dt, (kind == SIM_BINARY_DIV ? 4 : 2) * n,
                                      (2 * n + 2 * na + 2 * nb) * es));
}

static int64_t binary_saved(const SimOp *op, const int64_t *extent)
{
  SimBinaryKind kind = (SimBinaryKind)op->attrs[B_KIND].i[0];
  if (kind == SIM_BINARY_ADD || kind == SIM_BINARY_SUB)
    return 0;
  int64_t full[SIM_MAX_ITER];
  const int64_t *e = sim_op_extent(op, extent, full);
  int64_t na = sim_map_numel(sim_space_input_map(op, 0), &op->in_shape[0], e);
  int64_t nb = sim_map_numel(sim_space_input_map(op, 1), &op->in_shape[1], e);
  if (op->inputs[0] == op->inputs[1])
    nb = 0;
  return na * sim_dtype_size(op->in_dtype[0]) + nb * sim_dtype_size(op->in_dtype[1]);
}

const SimOpClass sim_op_binary_class = {
  .type = SIM_OP_BINARY,
  .name = "binary",
  .description = "element-wise add, sub, mul or div of two tensors, with broadcasting",
  .attrs = binary_attrs,
  .n_attrs = G_N_ELEMENTS(binary_attrs),
  .min_inputs = 2,
  .max_inputs = 2,
  .infer = binary_infer,
  .space = binary_space,
  .work = binary_work,
  .saved_bytes = binary_saved,
};

/* ---------------------------------------------------------------------------------- */
/* Softmax over the last dimension                                                     */

static gboolean softmax_infer(SimOp *op, GError **error)
{
  /* The last dimension is normalized; a rank-1 tensor would normalize over the batch. */
  if (!sim_op_check_rank(op, 0, 2, SIM_MAX_DIMS, error))
    return FALSE;
  return infer_same(op, error);
}

static void softmax_space(SimOp *op)
{
  space_elementwise(op, &op->out_shape[0]);
  /* Every shard needs whole rows to find their maximum and sum. */
  int last = op->space.ndims - 1;
  g_strlcpy(op->space.dims[last].name, "c", sizeof op->space.dims[last].name);
  op->space.dims[last].splittable = FALSE;
}

static void softmax_work(const SimOp *op, const int64_t *extent, SimPass pass, SimWork *w)
{
  SimDType dt = op->out_dtype[0];
  double es = sim_dtype_size(dt);
  double n = (double)sim_extent_volume(op, extent);
  if (pass == SIM_PASS_FORWARD)
    /* Row maximum, subtract, exp (4), sum, divide: 8 operations per element; one fused
     * kernel reads x and writes y. */
    sim_work_add(w, sim_kernel_memory(dt, 8 * n, 2 * n * es));
  else
    /* dx = y * (dy - sum(dy * y)): reads y and dy, writes dx. */
    sim_work_add(w, sim_kernel_memory(dt, 4 * n, 3 * n * es));
}

static int64_t softmax_saved(const SimOp *op, const int64_t *extent)
{
  int64_t full[SIM_MAX_ITER];
  const int64_t *e = sim_op_extent(op, extent, full);
  return sim_extent_volume(op, e) * sim_dtype_size(op->out_dtype[0]);
}

const SimOpClass sim_op_softmax_class = {
  .type = SIM_OP_SOFTMAX,
  .name = "softmax",
  .description = "softmax over the last dimension",
  .attrs = NULL,
  .n_attrs = 0,
  .min_inputs = 1,
  .max_inputs = 1,
  .infer = softmax_infer,
  .space = softmax_space,
  .work = softmax_work,
  .saved_bytes = softmax_saved,
};

/* ---------------------------------------------------------------------------------- */
/* Dropout                                                                             */

enum { D_P };

static const SimAttrSpec dropout_attrs[] = {
  [D_P] = { "p", SIM_ATTR_FLOAT, 0.5, NULL, FALSE },
};

static gboolean dropout_infer(SimOp *op, GError **error)
{
  double p = op->attrs[D_P].f;
  if (!(p >= 0.0 && p < 1.0)) {
    sim_op_set_error(op, error, SIM_ERROR_INVALID, "the drop probability %g is outside [0, 1)",
                     p);
    return FALSE;
  }
  return infer_same(op, error);
}

static void dropout_work(const SimOp *op, const int64_t *extent, SimPass pass, SimWork *w)
{
  /* With p = 0 the op passes its input through. */
  if (op->attrs[D_P].f == 0.0)
    return;
  SimDType dt = op->out_dtype[0];
  double es = sim_dtype_size(dt);
  double n = (double)sim_extent_volume(op, extent);
  /* Forward draws a random number, compares and scales (3 operations), reads x, writes y
   * and a one-byte mask; backward reads dy and the mask and writes dx. */
  if (pass == SIM_PASS_FORWARD)
    sim_work_add(w, sim_kernel_memory(dt, 3 * n, 2 * n * es + n));
  else
    sim_work_add(w, sim_kernel_memory(dt, n, 2 * n * es + n));
}

static int64_t dropout_saved(const SimOp *op, const int64_t *extent)
{
  if (op->attrs[D_P].f == 0.0)
    return 0;
  int64_t full[SIM_MAX_ITER];
  const int64_t *e = sim_op_extent(op, extent, full);
  /* The mask, one byte per element. */
  return sim_extent_volume(op, e);
}

const SimOpClass sim_op_dropout_class = {
  .type = SIM_OP_DROPOUT,
  .name = "dropout",
  .description = "dropout with probability p (keeps a one-byte mask for backward)",
  .attrs = dropout_attrs,
  .n_attrs = G_N_ELEMENTS(dropout_attrs),
  .min_inputs = 1,
  .max_inputs = 1,
  .infer = dropout_infer,
  .space = space_same,
  .work = dropout_work,
  .saved_bytes = dropout_saved,
};
