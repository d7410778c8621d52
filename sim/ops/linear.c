/* linear.c — the fully connected layer Y = act(X W + b) and the batched product of two
 * activations.
 *
 * Linear: X [b, (s...), k] . W [k, n] -> Y [b, (s...), n].  Its iteration dimensions are
 * b (sample), the middle dimensions s (attribute: sequence positions), n (parameter: the
 * output features) and k (reduction: the input features).  X is indexed by (b, s, k), W by
 * (k, n), the bias by (n) and Y by (b, s, n), so n-degrees are Megatron's column-parallel
 * linear and k-degrees its row-parallel linear, whose partial Y the lowering sums.
 *
 * Matmul: A [b, (h...), m, k] . B [b, (h...), k, n] (or B [.., n, k] with trans_b) ->
 * C [b, (h...), m, n].  The leading dimensions after the batch (attention heads, say) are
 * attributes: both operands and the result are indexed by them, like a batch, and
 * splitting them moves no weights because there are none. */
#include "../sim-private.h"

/* ---------------------------------------------------------------------------------- */
/* Linear                                                                              */

enum { L_OUT, L_BIAS, L_ACT };

static const SimAttrSpec linear_attrs[] = {
  [L_OUT] = { "out_features", SIM_ATTR_INT, 0, NULL, TRUE },
  [L_BIAS] = { "bias", SIM_ATTR_BOOL, 0, NULL, FALSE },
  [L_ACT] = { "activation", SIM_ATTR_ENUM, SIM_UNARY_IDENTITY, sim_unary_kind_names, FALSE },
};

static gboolean linear_infer(SimOp *op, GError **error)
{
  if (!sim_op_check_rank(op, 0, 2, 4, error) || !sim_op_check_float(op, 0, error))
    return FALSE;
  int64_t out = op->attrs[L_OUT].i[0];
  if (out < 1) {
    sim_op_set_error(op, error, SIM_ERROR_INVALID,
                     "out_features is %" G_GINT64_FORMAT ", not positive", out);
    return FALSE;
  }
  const SimShape *x = &op->in_shape[0];
  int64_t in = x->dims[x->ndim - 1];
  sim_op_set_n_outputs(op, 1);
  op->out_shape[0] = *x;
  op->out_shape[0].dims[x->ndim - 1] = out;
  op->out_dtype[0] = op->in_dtype[0];
  op->n_weights = op->attrs[L_BIAS].i[0] ? 2 : 1;
  op->w_shape[0] = sim_shape_make(2, (int64_t[]){ in, out });
  op->w_shape[1] = sim_shape_make(1, (int64_t[]){ out });
  op->w_dtype = op->in_dtype[0];
  return TRUE;
}

static void linear_space(SimOp *op)
{
  const SimShape *x = &op->in_shape[0];
  int r = x->ndim, n = r - 1, k = r;
  sim_space_init(op, r + 1);
  sim_space_dim(op, 0, "b", SIM_ROLE_SAMPLE, x->dims[0], TRUE);
  for (int d = 1; d < r - 1; d++)
    sim_space_dim(op, d, sim_dim_seq_name(d - 1, r - 2), SIM_ROLE_ATTRIBUTE, x->dims[d], TRUE);
  sim_space_dim(op, n, "n", SIM_ROLE_PARAMETER, op->out_shape[0].dims[r - 1], TRUE);
  sim_space_dim(op, k, "k", SIM_ROLE_REDUCTION, x->dims[r - 1], TRUE);
  SimTensorMap *mx = &op->space.maps[0], *mw = &op->space.maps[1];
  SimTensorMap *my = &op->space.maps[op->n_inputs + op->n_weights];
  for (int d = 0; d < r - 1; d++) {
    sim_map_identity(mx, d, d);
    sim_map_identity(my, d, d);
  }
  sim_map_identity(mx, r - 1, k);
  sim_map_identity(my, r - 1, n);
  sim_map_identity(mw, 0, k);
  sim_map_identity(mw, 1, n);
  if (op->n_weights > 1)
    sim_map_identity(&op->space.maps[2], 0, n);
}

static void linear_work(const SimOp *op, const int64_t *e, SimPass pass, SimWork *w)
{
  int r = op->in_shape[0].ndim;
  int64_t M = 1;
  for (int d = 0; d < r - 1; d++)
    M *= e[d];
  int64_t N = e[r - 1], K = e[r];
  SimDType dt = op->w_dtype;
  double es = sim_dtype_size(dt);
  double mn = (double)M * (double)N;
  SimUnaryKind act = (SimUnaryKind)op->attrs[L_ACT].i[0];
  gboolean bias = op->attrs[L_BIAS].i[0] != 0;
  if (pass == SIM_PASS_FORWARD) {
    sim_work_add(w, sim_kernel_gemm(dt, 1, M, N, K));
    /* Alone, the bias is added in the GEMM's epilogue (cuBLASLt); with an activation,
     * one element-wise kernel adds the bias and applies the function. */
    if (act != SIM_UNARY_IDENTITY)
      sim_work_add(w, sim_kernel_memory(dt, (sim_unary_flops(act, FALSE) + bias) * mn,
                                        2 * mn * es + (bias ? N * es : 0)));
    return;
  }
  /* dZ = dY * act'(Z), reading dY and the saved activation; then dX = dZ W^T (M x K,
   * contracting N) and dW = X^T dZ (K x N, contracting M), the two GEMMs that make
   * backward twice the forward FLOPs; the bias gradient sums dZ over M. */
  if (act != SIM_UNARY_IDENTITY)
    sim_work_add(w, sim_kernel_memory(dt, sim_unary_flops(act, TRUE) * mn, 3 * mn * es));
  sim_work_add(w, sim_kernel_gemm(dt, 1, M, K, N));
  sim_work_add(w, sim_kernel_gemm(dt, 1, K, N, M));
  if (bias)
    sim_work_add(w, sim_kernel_memory(dt, mn, mn * es + N * es));
}

static int64_t linear_saved(const SimOp *op, const int64_t *extent)
{
  int64_t full[SIM_MAX_ITER];
  const int64_t *e = sim_op_extent(op, extent, full);
  int64_t es = sim_dtype_size(op->w_dtype);
  /* X for dW; with an activation, also its input or output for its derivative. */
  int64_t bytes = sim_map_numel(sim_space_input_map(op, 0), &op->in_shape[0], e) * es;
  if (op->attrs[L_ACT].i[0] != SIM_UNARY_IDENTITY)
    bytes += sim_map_numel(sim_space_output_map(op, 0), &op->out_shape[0], e) * es;
  return bytes;
}

const SimOpClass sim_op_linear_class = {
  .type = SIM_OP_LINEAR,
  .name = "linear",
  .description = "fully connected layer Y = X W (+ b), with an optional fused activation",
  .attrs = linear_attrs,
  .n_attrs = G_N_ELEMENTS(linear_attrs),
  .min_inputs = 1,
  .max_inputs = 1,
  .infer = linear_infer,
  .space = linear_space,
  .work = linear_work,
  .saved_bytes = linear_saved,
};

/* ---------------------------------------------------------------------------------- */
/* Matmul                                                                              */

enum { M_TRANS_B };

static const SimAttrSpec matmul_attrs[] = {
  [M_TRANS_B] = { "trans_b", SIM_ATTR_BOOL, 0, NULL, FALSE },
};

static gboolean matmul_infer(SimOp *op, GError **error)
{
  const SimShape *a = &op->in_shape[0], *b = &op->in_shape[1];
  if (!sim_op_check_rank(op, 0, 3, SIM_MAX_DIMS, error) ||
      !sim_op_check_rank(op, 1, 3, SIM_MAX_DIMS, error) || !sim_op_check_float(op, 0, error) ||
      !sim_op_check_float(op, 1, error))
    return FALSE;
  gboolean tb = op->attrs[M_TRANS_B].i[0] != 0;
  int r = a->ndim;
  gboolean ok = b->ndim == r;
  for (int d = 0; ok && d < r - 2; d++)
    ok = a->dims[d] == b->dims[d];
  int64_t kb = ok ? b->dims[tb ? r - 1 : r - 2] : 0;
  g_autofree char *sa = sim_shape_to_string(a);
  g_autofree char *sb = sim_shape_to_string(b);
  if (!ok) {
    sim_op_set_error(op, error, SIM_ERROR_INVALID,
                     "a is %s and b is %s: the ranks and the leading dimensions must be equal",
                     sa, sb);
    return FALSE;
  }
  if (kb != a->dims[r - 1]) {
    sim_op_set_error(op, error, SIM_ERROR_INVALID,
                     "a is %s and b is %s%s: a's last dimension %" G_GINT64_FORMAT
                     " must equal b's %s dimension %" G_GINT64_FORMAT,
                     sa, sb, tb ? " (transposed)" : "", a->dims[r - 1],
                     tb ? "last" : "second to last", kb);
    return FALSE;
  }
  SimShape out = *a;
  out.dims[r - 1] = b->dims[tb ? r - 2 : r - 1];
  sim_op_set_n_outputs(op, 1);
  op->out_shape[0] = out;
  op->out_dtype[0] = op->in_dtype[0];
  op->n_weights = 0;
  op->w_dtype = op->in_dtype[0];
  return TRUE;
}

static void matmul_space(SimOp *op)
{
  static const char *const lead[] = { "h1", "h2", "h3" };
  const SimShape *a = &op->in_shape[0], *out = &op->out_shape[0];
  gboolean tb = op->attrs[M_TRANS_B].i[0] != 0;
  int r = a->ndim, L = r - 2;
  int m = L, n = L + 1, k = L + 2;
  sim_space_init(op, L + 3);
  sim_space_dim(op, 0, "b", SIM_ROLE_SAMPLE, a->dims[0], TRUE);
  for (int d = 1; d < L; d++)
    sim_space_dim(op, d, L == 2 ? "h" : lead[d - 1], SIM_ROLE_ATTRIBUTE, a->dims[d], TRUE);
  sim_space_dim(op, m, "m", SIM_ROLE_ATTRIBUTE, a->dims[r - 2], TRUE);
  sim_space_dim(op, n, "n", SIM_ROLE_PARAMETER, out->dims[r - 1], TRUE);
  sim_space_dim(op, k, "k", SIM_ROLE_REDUCTION, a->dims[r - 1], TRUE);
  SimTensorMap *ma = &op->space.maps[0], *mb = &op->space.maps[1], *mc = &op->space.maps[2];
  for (int d = 0; d < L; d++) {
    sim_map_identity(ma, d, d);
    sim_map_identity(mb, d, d);
    sim_map_identity(mc, d, d);
  }
  sim_map_identity(ma, r - 2, m);
  sim_map_identity(ma, r - 1, k);
  sim_map_identity(mb, r - 2, tb ? n : k);
  sim_map_identity(mb, r - 1, tb ? k : n);
  sim_map_identity(mc, r - 2, m);
  sim_map_identity(mc, r - 1, n);
}

static void matmul_work(const SimOp *op, const int64_t *e, SimPass pass, SimWork *w)
{
  int L = op->in_shape[0].ndim - 2;
  int64_t batch = 1;
  for (int d = 0; d < L; d++)
    batch *= e[d];
  int64_t M = e[L], N = e[L + 1], K = e[L + 2];
  SimDType dt = op->out_dtype[0];
  if (pass == SIM_PASS_FORWARD) {
    sim_work_add(w, sim_kernel_gemm(dt, batch, M, N, K));
    return;
  }
  /* dA = dC B^T (M x K, contracting N) and dB = A^T dC (K x N, contracting M). */
  sim_work_add(w, sim_kernel_gemm(dt, batch, M, K, N));
  sim_work_add(w, sim_kernel_gemm(dt, batch, K, N, M));
}

static int64_t matmul_saved(const SimOp *op, const int64_t *extent)
{
  int64_t full[SIM_MAX_ITER];
  const int64_t *e = sim_op_extent(op, extent, full);
  int64_t es = sim_dtype_size(op->out_dtype[0]);
  /* Each operand's gradient needs the other operand. */
  int64_t bytes = sim_map_numel(sim_space_input_map(op, 0), &op->in_shape[0], e) * es;
  if (op->inputs[1] != op->inputs[0])
    bytes += sim_map_numel(sim_space_input_map(op, 1), &op->in_shape[1], e) * es;
  return bytes;
}

const SimOpClass sim_op_matmul_class = {
  .type = SIM_OP_MATMUL,
  .name = "matmul",
  .description = "batched matrix product of two activations",
  .attrs = matmul_attrs,
  .n_attrs = G_N_ELEMENTS(matmul_attrs),
  .min_inputs = 2,
  .max_inputs = 2,
  .infer = matmul_infer,
  .space = matmul_space,
  .work = matmul_work,
  .saved_bytes = matmul_saved,
};
