/* catalogue.c — the operator catalogue: one class per operator type, indexed by
 * SimOpType, and the names of the enumerations the catalogue uses.  Adding an operator is
 * one new file in this directory plus one row in the table below. */
#include "../sim-private.h"

#include <stdarg.h>

/* Indexed by SimOpType; the order is checked once, on first use. */
static const SimOpClass *const classes[SIM_OP_COUNT] = {
  [SIM_OP_INPUT] = &sim_op_input_class,
  [SIM_OP_LINEAR] = &sim_op_linear_class,
  [SIM_OP_MATMUL] = &sim_op_matmul_class,
  [SIM_OP_CONV2D] = &sim_op_conv2d_class,
  [SIM_OP_POOL2D] = &sim_op_pool2d_class,
  [SIM_OP_BATCHNORM] = &sim_op_batchnorm_class,
  [SIM_OP_LAYERNORM] = &sim_op_layernorm_class,
  [SIM_OP_EMBEDDING] = &sim_op_embedding_class,
  [SIM_OP_UNARY] = &sim_op_unary_class,
  [SIM_OP_BINARY] = &sim_op_binary_class,
  [SIM_OP_SOFTMAX] = &sim_op_softmax_class,
  [SIM_OP_DROPOUT] = &sim_op_dropout_class,
  [SIM_OP_CONCAT] = &sim_op_concat_class,
  [SIM_OP_SPLIT] = &sim_op_split_class,
  [SIM_OP_RESHAPE] = &sim_op_reshape_class,
  [SIM_OP_TRANSPOSE] = &sim_op_transpose_class,
  [SIM_OP_ATTENTION] = &sim_op_attention_class,
  [SIM_OP_LSTM] = &sim_op_lstm_class,
  [SIM_OP_CROSS_ENTROPY] = &sim_op_cross_entropy_class,
  [SIM_OP_MSE_LOSS] = &sim_op_mse_loss_class,
  [SIM_OP_RMSNORM] = &sim_op_rmsnorm_class,
  [SIM_OP_GATED_MLP] = &sim_op_gated_mlp_class,
  [SIM_OP_MOE] = &sim_op_moe_class,
};

const SimOpClass *sim_op_class(SimOpType type)
{
  g_return_val_if_fail(type >= 0 && type < SIM_OP_COUNT, NULL);
  const SimOpClass *c = classes[type];
  g_assert(c != NULL && c->type == type);
  return c;
}

const char *sim_op_type_name(SimOpType t)
{
  g_return_val_if_fail(t >= 0 && t < SIM_OP_COUNT, "invalid");
  return sim_op_class(t)->name;
}

void sim_op_set_error(const SimOp *op, GError **error, int code, const char *fmt, ...)
{
  if (!error)
    return;
  va_list ap;
  va_start(ap, fmt);
  g_autofree char *msg = g_strdup_vprintf(fmt, ap);
  va_end(ap);
  g_set_error(error, SIM_ERROR, code, "op '%s' (%s): %s", op->name,
              sim_op_type_name(op->type), msg);
}

int sim_op_type_from_name(const char *name)
{
  g_return_val_if_fail(name != NULL, -1);
  for (int t = 0; t < SIM_OP_COUNT; t++)
    if (g_strcmp0(name, classes[t]->name) == 0)
      return t;
  return -1;
}

const char *sim_op_type_description(SimOpType t)
{
  g_return_val_if_fail(t >= 0 && t < SIM_OP_COUNT, "invalid");
  return sim_op_class(t)->description;
}

const char *sim_dim_role_name(SimDimRole r)
{
  static const char *const names[SIM_ROLE_COUNT] = {
    "sample", "attribute", "parameter", "reduction",
  };
  g_return_val_if_fail(r >= 0 && r < SIM_ROLE_COUNT, "invalid");
  return names[r];
}

const char *const sim_unary_kind_names[] = {
  "identity", "relu", "gelu", "sigmoid", "tanh", "exp", "silu", "scale", "relu6", NULL,
};

const char *sim_unary_kind_name(SimUnaryKind k)
{
  g_return_val_if_fail(k >= 0 && k < SIM_UNARY_COUNT, "invalid");
  return sim_unary_kind_names[k];
}

const char *sim_binary_kind_name(SimBinaryKind k)
{
  static const char *const names[SIM_BINARY_COUNT] = { "add", "sub", "mul", "div" };
  g_return_val_if_fail(k >= 0 && k < SIM_BINARY_COUNT, "invalid");
  return names[k];
}

const char *sim_kernel_kind_name(SimKernelKind k)
{
  static const char *const names[SIM_KERNEL_KIND_COUNT] = {
    "gemm", "conv", "memory", "gather", "recurrent", "optimizer", "attention",
  };
  g_return_val_if_fail(k >= 0 && k < SIM_KERNEL_KIND_COUNT, "invalid");
  return names[k];
}

const char *sim_pass_name(SimPass p)
{
  static const char *const names[SIM_PASS_COUNT] = { "forward", "backward", "update" };
  g_return_val_if_fail(p >= 0 && p < SIM_PASS_COUNT, "invalid");
  return names[p];
}

double sim_unary_flops(SimUnaryKind k, gboolean backward)
{
  /* Arithmetic per element, counting a transcendental (exp, tanh) as 4 operations as the
   * GPU's special-function units deliver them at about a quarter of the FMA rate.
   * GELU is PyTorch's tanh approximation 0.5x(1 + tanh(0.798(x + 0.0447x^3))); its
   * derivative re-evaluates the tanh.  SiLU is x * sigmoid(x).  ReLU6 is two comparisons
   * forward (a max and a min) and two backward (the gradient passes inside (0, 6)). */
  static const double fwd[SIM_UNARY_COUNT] = {
    [SIM_UNARY_IDENTITY] = 0, [SIM_UNARY_RELU] = 1, [SIM_UNARY_GELU] = 8,
    [SIM_UNARY_SIGMOID] = 4,  [SIM_UNARY_TANH] = 4, [SIM_UNARY_EXP] = 4,
    [SIM_UNARY_SILU] = 5,     [SIM_UNARY_SCALE] = 1, [SIM_UNARY_RELU6] = 2,
  };
  static const double bwd[SIM_UNARY_COUNT] = {
    [SIM_UNARY_IDENTITY] = 0, [SIM_UNARY_RELU] = 1, [SIM_UNARY_GELU] = 12,
    [SIM_UNARY_SIGMOID] = 3,  [SIM_UNARY_TANH] = 3, [SIM_UNARY_EXP] = 1,
    [SIM_UNARY_SILU] = 8,     [SIM_UNARY_SCALE] = 1, [SIM_UNARY_RELU6] = 2,
  };
  g_return_val_if_fail(k >= 0 && k < SIM_UNARY_COUNT, 0.0);
  return backward ? bwd[k] : fwd[k];
}

const char *sim_dim_generic_name(int d)
{
  static const char *const names[SIM_MAX_ITER] = { "b", "d1", "d2", "d3", "d4", "d5", "d6", "d7" };
  g_return_val_if_fail(d >= 0 && d < SIM_MAX_ITER, "?");
  return names[d];
}

const char *sim_dim_seq_name(int i, int n)
{
  static const char *const names[] = { "s1", "s2", "s3", "s4", "s5", "s6" };
  g_return_val_if_fail(i >= 0 && i < (int)G_N_ELEMENTS(names), "?");
  return n == 1 ? "s" : names[i];
}

gboolean sim_op_check_float(const SimOp *op, int i, GError **error)
{
  if (sim_dtype_is_float(op->in_dtype[i]))
    return TRUE;
  sim_op_set_error(op, error, SIM_ERROR_INVALID, "input %d is %s, not floating point", i,
                   sim_dtype_name(op->in_dtype[i]));
  return FALSE;
}

gboolean sim_op_check_rank(const SimOp *op, int i, int min, int max, GError **error)
{
  int r = op->in_shape[i].ndim;
  if (r >= min && r <= max)
    return TRUE;
  g_autofree char *shape = sim_shape_to_string(&op->in_shape[i]);
  if (min == max)
    sim_op_set_error(op, error, SIM_ERROR_INVALID, "input %d is %s: expected %d dimensions",
                     i, shape, min);
  else
    sim_op_set_error(op, error, SIM_ERROR_INVALID,
                     "input %d is %s: expected %d to %d dimensions", i, shape, min, max);
  return FALSE;
}
