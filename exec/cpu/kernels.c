/* kernels.c — the CPU back end's kernel table, the element-wise functions shared by
 * several kernels, and the optimizers. */
#include "cpu-private.h"

#include <string.h>

typedef gboolean (*CpuKernelFunc)(const ExecKernelArgs *a, GError **error);

static const CpuKernelFunc kernels[SIM_OP_COUNT] = {
  [SIM_OP_LINEAR] = cpu_kernel_linear,
  [SIM_OP_MATMUL] = cpu_kernel_matmul,
  [SIM_OP_CONV2D] = cpu_kernel_conv2d,
  [SIM_OP_POOL2D] = cpu_kernel_pool2d,
  [SIM_OP_BATCHNORM] = cpu_kernel_batchnorm,
  [SIM_OP_LAYERNORM] = cpu_kernel_layernorm,
  [SIM_OP_EMBEDDING] = cpu_kernel_embedding,
  [SIM_OP_UNARY] = cpu_kernel_unary,
  [SIM_OP_BINARY] = cpu_kernel_binary,
  [SIM_OP_SOFTMAX] = cpu_kernel_softmax,
  [SIM_OP_DROPOUT] = cpu_kernel_dropout,
  [SIM_OP_CONCAT] = cpu_kernel_concat,
  [SIM_OP_SPLIT] = cpu_kernel_split,
  [SIM_OP_RESHAPE] = cpu_kernel_reshape,
  [SIM_OP_TRANSPOSE] = cpu_kernel_transpose,
  [SIM_OP_ATTENTION] = cpu_kernel_attention,
  [SIM_OP_LSTM] = cpu_kernel_lstm,
  [SIM_OP_CROSS_ENTROPY] = cpu_kernel_cross_entropy,
  [SIM_OP_MSE_LOSS] = cpu_kernel_mse_loss,
  [SIM_OP_RMSNORM] = cpu_kernel_rmsnorm,
  [SIM_OP_GATED_MLP] = cpu_kernel_gated_mlp,
  [SIM_OP_MOE] = cpu_kernel_moe,
};

gboolean cpu_kernel(const ExecKernelArgs *a, GError **error)
{
  SimOpType t = sim_graph_op_type(a->graph, a->op);
  if (t < 0 || t >= SIM_OP_COUNT || !kernels[t]) {
    g_set_error(error, EXEC_ERROR, EXEC_ERROR_UNSUPPORTED,
                "the cpu back end has no kernel for op '%s' (%s)",
                sim_graph_op_name(a->graph, a->op), sim_op_type_name(t));
    return FALSE;
  }
  return kernels[t](a, error);
}

int64_t cpu_attr_int(const ExecKernelArgs *a, const char *name, int64_t def)
{
  g_autoptr(SimAttrs) attrs = sim_graph_op_attrs(a->graph, a->op);
  int64_t v = def;
  if (!sim_attrs_get_int(attrs, name, &v))
    return def;
  return v;
}

double cpu_attr_float(const ExecKernelArgs *a, const char *name, double def)
{
  g_autoptr(SimAttrs) attrs = sim_graph_op_attrs(a->graph, a->op);
  double v = def;
  if (!sim_attrs_get_float(attrs, name, &v))
    return def;
  return v;
}

void cpu_range_region(const ExecKernelArgs *a, const int *dims, int ndim, SimRegion *out)
{
  out->ndim = ndim;
  for (int d = 0; d < ndim; d++) {
    out->lo[d] = a->lo[dims[d]];
    out->hi[d] = a->hi[dims[d]];
  }
}

/* ---- element-wise functions ------------------------------------------------------------ */

static float sigmoid(float x)
{
  return 1.0f / (1.0f + expf(-x));
}

float cpu_act(SimUnaryKind k, float x, float scale)
{
  switch (k) {
  case SIM_UNARY_RELU:
    return x > 0 ? x : 0;
  case SIM_UNARY_GELU:
    return 0.5f * x * (1.0f + erff(x * (float)M_SQRT1_2));
  case SIM_UNARY_SIGMOID:
    return sigmoid(x);
  case SIM_UNARY_TANH:
    return tanhf(x);
  case SIM_UNARY_EXP:
    return expf(x);
  case SIM_UNARY_SILU:
    return x * sigmoid(x);
  case SIM_UNARY_SCALE:
    return x * scale;
  case SIM_UNARY_RELU6:
    return x > 0 ? (x < 6 ? x : 6) : 0;
  default:
    return x;
  }
}

float cpu_act_grad(SimUnaryKind k, float x, float scale)
{
  switch (k) {
  case SIM_UNARY_RELU:
    return x > 0 ? 1.0f : 0.0f;
  case SIM_UNARY_GELU:
    return 0.5f * (1.0f + erff(x * (float)M_SQRT1_2)) +
           x * expf(-0.5f * x * x) * (float)(0.5 * M_2_SQRTPI * M_SQRT1_2);
  case SIM_UNARY_SIGMOID: {
    float s = sigmoid(x);
    return s * (1 - s);
  }
  case SIM_UNARY_TANH: {
    float t = tanhf(x);
    return 1 - t * t;
  }
  case SIM_UNARY_EXP:
    return expf(x);
  case SIM_UNARY_SILU: {
    float s = sigmoid(x);
    return s + x * s * (1 - s);
  }
  case SIM_UNARY_SCALE:
    return scale;
  case SIM_UNARY_RELU6:
    return x > 0 && x < 6 ? 1.0f : 0.0f;
  default:
    return 1.0f;
  }
}

/* ---- optimizers ---------------------------------------------------------------------------- */

typedef struct {
  const ExecUpdateArgs *a;
  float *w, *g, *s1, *s2;
  int64_t k;
  double c1, c2;
} UpdateCtx;

static void update_element(UpdateCtx *u, int64_t ow, int64_t og, int64_t o1, int64_t o2)
{
  const ExecUpdateArgs *a = u->a;
  double g = u->g[og] + a->weight_decay * u->w[ow];
  if (a->optimizer == SIM_OPTIMIZER_ADAM) {
    double m = a->beta1 * u->s1[o1] + (1 - a->beta1) * g;
    double v = a->beta2 * u->s2[o2] + (1 - a->beta2) * g * g;
    u->s1[o1] = (float)m;
    u->s2[o2] = (float)v;
    u->w[ow] = (float)(u->w[ow] - a->lr * (m / u->c1) / (sqrt(v / u->c2) + a->eps));
  } else if (a->momentum > 0) {
    double m = a->momentum * u->s1[o1] + g;
    u->s1[o1] = (float)m;
    u->w[ow] = (float)(u->w[ow] - a->lr * m);
  } else {
    u->w[ow] = (float)(u->w[ow] - a->lr * g);
  }
}

gboolean cpu_update(const ExecUpdateArgs *a, GError **error)
{
  UpdateCtx u = { a, cpu_f32(&a->weight), cpu_f32(&a->grad), cpu_f32(&a->state1),
                  cpu_f32(&a->state2), 0, 1, 1 };
  if (a->optimizer == SIM_OPTIMIZER_ADAM) {
    u.c1 = 1 - pow(a->beta1, a->step);
    u.c2 = 1 - pow(a->beta2, a->step);
  }
  const SimRegion *r = &a->region;
  if (exec_region_is_empty(r))
    return TRUE;
  int64_t idx[SIM_MAX_DIMS];
  for (int d = 0; d < r->ndim; d++)
    idx[d] = r->lo[d];
  int64_t k = 0;
  do {
    if (k >= a->part_lo && k < a->part_hi)
      update_element(&u, cpu_off(&a->weight, idx), cpu_off(&a->grad, idx),
                     cpu_off(&a->state1, idx), cpu_off(&a->state2, idx));
    k++;
  } while (k < a->part_hi && exec_region_next(r, idx));
  return TRUE;
}
