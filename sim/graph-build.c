/* graph-build.c — the builders the model zoo uses: one function per operator type that
 * adds it with its attributes.  Errors are sticky: the first failure is kept in the graph
 * (sim_graph_check()) and later builders do nothing, so a zoo model is written without an
 * error check per line. */
#include "sim-private.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>

/* Adds the op unless the graph already failed; returns its first output tensor. */
static int build(SimGraph *g, SimOpType type, const char *name, int n, const int *inputs,
                 const SimAttrs *a)
{
  if (g->sticky_error)
    return -1;
  int op = sim_graph_add_op(g, type, name, n, inputs, a, &g->sticky_error);
  return op < 0 ? -1 : sim_graph_op_get(g, op)->outputs[0];
}

/* The builders set attributes they know exist, so only the values can be wrong; those
 * errors become the sticky error too. */
static void set_int(SimGraph *g, SimAttrs *a, const char *name, int64_t v)
{
  if (!g->sticky_error)
    sim_attrs_set_int(a, name, v, &g->sticky_error);
}

static void set_ints(SimGraph *g, SimAttrs *a, const char *name, int n, const int64_t *v)
{
  if (!g->sticky_error)
    sim_attrs_set_ints(a, name, n, v, &g->sticky_error);
}

static void set_float(SimGraph *g, SimAttrs *a, const char *name, double v)
{
  if (!g->sticky_error)
    sim_attrs_set_float(a, name, v, &g->sticky_error);
}

static gboolean builder_ok(SimGraph *g)
{
  g_return_val_if_fail(g != NULL, FALSE);
  return g->sticky_error == NULL;
}

static void sticky_invalid(SimGraph *g, const char *name, const char *what, const char *fmt, ...)
  G_GNUC_PRINTF(4, 5);

static void sticky_invalid(SimGraph *g, const char *name, const char *what, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  g_autofree char *msg = g_strdup_vprintf(fmt, ap);
  va_end(ap);
  g_set_error(&g->sticky_error, SIM_ERROR, SIM_ERROR_INVALID, "op '%s' (%s): %s",
              name ? name : "(unnamed)", what, msg);
}

int sim_graph_input(SimGraph *g, const char *name, SimDType dtype, int ndim, const int64_t *dims)
{
  if (!builder_ok(g))
    return -1;
  if (ndim < 1 || ndim > SIM_MAX_DIMS || !dims) {
    sticky_invalid(g, name, "input", "rank %d is outside 1..%d", ndim, SIM_MAX_DIMS);
    return -1;
  }
  if (dtype < 0 || dtype >= SIM_DTYPE_COUNT) {
    sticky_invalid(g, name, "input", "invalid dtype %d", (int)dtype);
    return -1;
  }
  SimAttrs a = { .type = SIM_OP_INPUT };
  set_ints(g, &a, "shape", ndim, dims);
  if (!g->sticky_error)
    sim_attrs_set_string(&a, "dtype", sim_dtype_names[dtype], &g->sticky_error);
  return build(g, SIM_OP_INPUT, name, 0, NULL, &a);
}

int sim_graph_linear(SimGraph *g, const char *name, int x, int64_t out_features, gboolean bias,
                     SimUnaryKind activation)
{
  if (!builder_ok(g))
    return -1;
  if (activation < 0 || activation >= SIM_UNARY_COUNT) {
    sticky_invalid(g, name, "linear", "invalid activation %d", (int)activation);
    return -1;
  }
  SimAttrs a = { .type = SIM_OP_LINEAR };
  set_int(g, &a, "out_features", out_features);
  set_int(g, &a, "bias", bias ? 1 : 0);
  if (!g->sticky_error)
    sim_attrs_set_string(&a, "activation", sim_unary_kind_names[activation], &g->sticky_error);
  return build(g, SIM_OP_LINEAR, name, 1, &x, &a);
}

int sim_graph_matmul(SimGraph *g, const char *name, int a, int b, gboolean trans_b)
{
  if (!builder_ok(g))
    return -1;
  SimAttrs at = { .type = SIM_OP_MATMUL };
  set_int(g, &at, "trans_b", trans_b ? 1 : 0);
  int in[2] = { a, b };
  return build(g, SIM_OP_MATMUL, name, 2, in, &at);
}

SimConvParams sim_conv_params(int64_t out_channels, int kh, int kw)
{
  SimConvParams p = {
    .out_channels = out_channels,
    .kernel = { kh, kw },
    .stride = { 1, 1 },
    .padding = { 0, 0 },
    .dilation = { 1, 1 },
    .groups = 1,
    .bias = FALSE,
    .activation = SIM_UNARY_IDENTITY,
  };
  return p;
}

int sim_graph_conv2d(SimGraph *g, const char *name, int x, const SimConvParams *p)
{
  if (!builder_ok(g))
    return -1;
  g_return_val_if_fail(p != NULL, -1);
  if (p->activation < 0 || p->activation >= SIM_UNARY_COUNT) {
    sticky_invalid(g, name, "conv2d", "invalid activation %d", (int)p->activation);
    return -1;
  }
  SimAttrs a = { .type = SIM_OP_CONV2D };
  int64_t kernel[2] = { p->kernel[0], p->kernel[1] };
  int64_t stride[2] = { p->stride[0], p->stride[1] };
  int64_t padding[2] = { p->padding[0], p->padding[1] };
  int64_t dilation[2] = { p->dilation[0], p->dilation[1] };
  set_int(g, &a, "out_channels", p->out_channels);
  set_ints(g, &a, "kernel", 2, kernel);
  set_ints(g, &a, "stride", 2, stride);
  set_ints(g, &a, "padding", 2, padding);
  set_ints(g, &a, "dilation", 2, dilation);
  set_int(g, &a, "groups", p->groups);
  set_int(g, &a, "bias", p->bias ? 1 : 0);
  if (!g->sticky_error)
    sim_attrs_set_string(&a, "activation", sim_unary_kind_names[p->activation],
                         &g->sticky_error);
  return build(g, SIM_OP_CONV2D, name, 1, &x, &a);
}

int sim_graph_pool2d(SimGraph *g, const char *name, int x, SimPoolKind kind, int kh, int kw,
                     int sh, int sw, int ph, int pw)
{
  if (!builder_ok(g))
    return -1;
  SimAttrs a = { .type = SIM_OP_POOL2D };
  int64_t kernel[2] = { kh, kw }, stride[2] = { sh, sw }, padding[2] = { ph, pw };
  if (!g->sticky_error)
    sim_attrs_set_string(&a, "kind", kind == SIM_POOL_AVG ? "avg" : "max", &g->sticky_error);
  set_ints(g, &a, "kernel", 2, kernel);
  set_ints(g, &a, "stride", 2, stride);
  set_ints(g, &a, "padding", 2, padding);
  return build(g, SIM_OP_POOL2D, name, 1, &x, &a);
}

int sim_graph_batchnorm(SimGraph *g, const char *name, int x, gboolean relu)
{
  if (!builder_ok(g))
    return -1;
  SimAttrs a = { .type = SIM_OP_BATCHNORM };
  set_int(g, &a, "relu", relu ? 1 : 0);
  return build(g, SIM_OP_BATCHNORM, name, 1, &x, &a);
}

int sim_graph_layernorm(SimGraph *g, const char *name, int x)
{
  if (!builder_ok(g))
    return -1;
  return build(g, SIM_OP_LAYERNORM, name, 1, &x, NULL);
}

int sim_graph_rmsnorm(SimGraph *g, const char *name, int x)
{
  if (!builder_ok(g))
    return -1;
  return build(g, SIM_OP_RMSNORM, name, 1, &x, NULL);
}

int sim_graph_gated_mlp(SimGraph *g, const char *name, int x, int64_t ffn,
                        SimUnaryKind activation)
{
  if (!builder_ok(g))
    return -1;
  if (activation < 0 || activation >= SIM_UNARY_COUNT) {
    sticky_invalid(g, name, "gated_mlp", "invalid activation %d", (int)activation);
    return -1;
  }
  SimAttrs a = { .type = SIM_OP_GATED_MLP };
  set_int(g, &a, "ffn", ffn);
  if (!g->sticky_error)
    sim_attrs_set_string(&a, "gate_activation", sim_unary_kind_name(activation),
                         &g->sticky_error);
  return build(g, SIM_OP_GATED_MLP, name, 1, &x, &a);
}

int sim_graph_moe(SimGraph *g, const char *name, int x, int logits, int experts, int top_k,
                  int64_t ffn)
{
  if (!builder_ok(g))
    return -1;
  SimAttrs a = { .type = SIM_OP_MOE };
  set_int(g, &a, "experts", experts);
  set_int(g, &a, "top_k", top_k);
  set_int(g, &a, "ffn", ffn);
  int in[2] = { x, logits };
  return build(g, SIM_OP_MOE, name, 2, in, &a);
}

int sim_graph_embedding(SimGraph *g, const char *name, int ids, int64_t vocab, int64_t dim)
{
  if (!builder_ok(g))
    return -1;
  SimAttrs a = { .type = SIM_OP_EMBEDDING };
  set_int(g, &a, "vocab", vocab);
  set_int(g, &a, "dim", dim);
  return build(g, SIM_OP_EMBEDDING, name, 1, &ids, &a);
}

int sim_graph_unary(SimGraph *g, const char *name, int x, SimUnaryKind kind)
{
  if (!builder_ok(g))
    return -1;
  if (kind < 0 || kind >= SIM_UNARY_COUNT) {
    sticky_invalid(g, name, "unary", "invalid kind %d", (int)kind);
    return -1;
  }
  SimAttrs a = { .type = SIM_OP_UNARY };
  sim_attrs_set_string(&a, "kind", sim_unary_kind_names[kind], &g->sticky_error);
  return build(g, SIM_OP_UNARY, name, 1, &x, &a);
}

int sim_graph_binary(SimGraph *g, const char *name, int a, int b, SimBinaryKind kind)
{
  if (!builder_ok(g))
    return -1;
  if (kind < 0 || kind >= SIM_BINARY_COUNT) {
    sticky_invalid(g, name, "binary", "invalid kind %d", (int)kind);
    return -1;
  }
  SimAttrs at = { .type = SIM_OP_BINARY };
  sim_attrs_set_string(&at, "kind", sim_binary_kind_name(kind), &g->sticky_error);
  int in[2] = { a, b };
  return build(g, SIM_OP_BINARY, name, 2, in, &at);
}

int sim_graph_softmax(SimGraph *g, const char *name, int x)
{
  if (!builder_ok(g))
    return -1;
  return build(g, SIM_OP_SOFTMAX, name, 1, &x, NULL);
}

int sim_graph_dropout(SimGraph *g, const char *name, int x, double p)
{
  if (!builder_ok(g))
    return -1;
  SimAttrs a = { .type = SIM_OP_DROPOUT };
  set_float(g, &a, "p", p);
  return build(g, SIM_OP_DROPOUT, name, 1, &x, &a);
}

int sim_graph_concat(SimGraph *g, const char *name, int axis, int n, const int *xs)
{
  if (!builder_ok(g))
    return -1;
  if (n < 1 || !xs) {
    sticky_invalid(g, name, "concat", "needs at least one input");
    return -1;
  }
  SimAttrs a = { .type = SIM_OP_CONCAT };
  set_int(g, &a, "axis", axis);
  return build(g, SIM_OP_CONCAT, name, n, xs, &a);
}

int sim_graph_split(SimGraph *g, const char *name, int x, int axis, int n, const int64_t *sizes,
                    int *outs)
{
  if (!builder_ok(g))
    return -1;
  if (n < 1 || n > SIM_MAX_DIMS || !sizes) {
    sticky_invalid(g, name, "split", "splits into 1 to %d parts, not %d", SIM_MAX_DIMS, n);
    return -1;
  }
  SimAttrs a = { .type = SIM_OP_SPLIT };
  set_int(g, &a, "axis", axis);
  set_ints(g, &a, "sizes", n, sizes);
  int first = build(g, SIM_OP_SPLIT, name, 1, &x, &a);
  if (first < 0)
    return -1;
  const SimOp *op = sim_graph_op_get(g, sim_graph_tensor_get(g, first)->producer);
  for (int i = 0; outs && i < op->n_outputs; i++)
    outs[i] = op->outputs[i];
  return first;
}

int sim_graph_reshape(SimGraph *g, const char *name, int x, int ndim, const int64_t *dims)
{
  if (!builder_ok(g))
    return -1;
  if (ndim < 1 || ndim > SIM_MAX_DIMS || !dims) {
    sticky_invalid(g, name, "reshape", "rank %d is outside 1..%d", ndim, SIM_MAX_DIMS);
    return -1;
  }
  SimAttrs a = { .type = SIM_OP_RESHAPE };
  set_ints(g, &a, "shape", ndim, dims);
  return build(g, SIM_OP_RESHAPE, name, 1, &x, &a);
}

int sim_graph_transpose(SimGraph *g, const char *name, int x, const int *perm)
{
  if (!builder_ok(g))
    return -1;
  if (x < 0 || x >= (int)g->tensors->len || !perm) {
    sticky_invalid(g, name, "transpose", "input tensor %d does not exist", x);
    return -1;
  }
  /* The permutation has one entry per dimension of the input. */
  int ndim = sim_graph_tensor_get(g, x)->shape.ndim;
  int64_t p[SIM_MAX_DIMS];
  for (int i = 0; i < ndim; i++)
    p[i] = perm[i];
  SimAttrs a = { .type = SIM_OP_TRANSPOSE };
  set_ints(g, &a, "perm", ndim, p);
  return build(g, SIM_OP_TRANSPOSE, name, 1, &x, &a);
}

int sim_graph_attention(SimGraph *g, const char *name, int q, int k, int v, int heads,
                        int64_t head_dim, gboolean causal)
{
  if (!builder_ok(g))
    return -1;
  SimAttrs a = { .type = SIM_OP_ATTENTION };
  set_int(g, &a, "heads", heads);
  set_int(g, &a, "head_dim", head_dim);
  set_int(g, &a, "causal", causal ? 1 : 0);
  int in[3] = { q, k, v };
  return build(g, SIM_OP_ATTENTION, name, 3, in, &a);
}

int sim_graph_lstm(SimGraph *g, const char *name, int x, int64_t hidden)
{
  if (!builder_ok(g))
    return -1;
  SimAttrs a = { .type = SIM_OP_LSTM };
  set_int(g, &a, "hidden", hidden);
  return build(g, SIM_OP_LSTM, name, 1, &x, &a);
}

int sim_graph_cross_entropy(SimGraph *g, const char *name, int logits, int labels)
{
  if (!builder_ok(g))
    return -1;
  int in[2] = { logits, labels };
  return build(g, SIM_OP_CROSS_ENTROPY, name, 2, in, NULL);
}

int sim_graph_cross_entropy_fp32(SimGraph *g, const char *name, int logits, int labels)
{
  if (!builder_ok(g))
    return -1;
  int in[2] = { logits, labels };
  SimAttrs a = { .type = SIM_OP_CROSS_ENTROPY };
  set_int(g, &a, "fp32", 1);
  return build(g, SIM_OP_CROSS_ENTROPY, name, 2, in, &a);
}

int sim_graph_mse_loss(SimGraph *g, const char *name, int pred, int target)
{
  if (!builder_ok(g))
    return -1;
  int in[2] = { pred, target };
  return build(g, SIM_OP_MSE_LOSS, name, 2, in, NULL);
}
