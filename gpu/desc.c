/* desc.c — the graph's side of a CUDA operator call: attributes, regions and the rules
 * of which shard adds a bias, from the public API of libsim; the library's errors
 * (PCU_ERROR). */
#include "cuda-desc.h"

#include <string.h>

G_DEFINE_QUARK(parasol-gpu-error-quark, pcu_error)

uint64_t pcu_name_hash(const char *name)
{
  uint64_t h = 0xcbf29ce484222325ULL;
  for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
    h ^= *p;
    h *= 0x100000001b3ULL;
  }
  return h;
}

int pcu_dtype_of(SimDType t)
{
  switch (t) {
  case SIM_DTYPE_FP16: return PCU_F16;
  case SIM_DTYPE_BF16: return PCU_BF16;
  case SIM_DTYPE_INT32:
  case SIM_DTYPE_INT64: return PCU_I64;
  default: return PCU_F32;
  }
}

void pcu_set_error(GError **error, PcuContext *ctx, PcuStatus s, const char *what)
{
  int code = s == PCU_ERR_NO_MEMORY     ? PCU_ERROR_NO_MEMORY
             : s == PCU_ERR_UNSUPPORTED ? PCU_ERROR_UNSUPPORTED
             : s == PCU_ERR_INVALID     ? PCU_ERROR_INVALID
                                        : PCU_ERROR_DEVICE;
  const char *msg = ctx ? pcu_context_error(ctx) : "";
  g_set_error(error, PCU_ERROR, code, "%s: %s", what,
              *msg ? msg : s == PCU_ERR_NO_MEMORY ? "out of device memory" : "CUDA failure");
}

static PcuRegion region_of(const SimRegion *r)
{
  PcuRegion p;
  memset(&p, 0, sizeof p);
  p.ndim = r->ndim;
  for (int d = 0; d < r->ndim; d++) {
    p.lo[d] = r->lo[d];
    p.hi[d] = r->hi[d];
  }
  return p;
}

static int64_t attr_int(const SimAttrs *at, const char *name, int64_t def)
{
  int64_t v = def;
  return sim_attrs_get_int(at, name, &v) ? v : def;
}

static void attr_pair(const SimAttrs *at, const char *name, int64_t def, int64_t *out)
{
  int64_t v[2] = { def, def };
  int n = sim_attrs_get_ints(at, name, v, 2);
  out[0] = v[0];
  out[1] = n >= 2 ? v[1] : v[0];
}

/* The iteration dimension named @name, or -1. */
static int dim_named(const SimGraph *g, int op, const char *name)
{
  for (int d = 0; d < sim_graph_op_n_dims(g, op); d++)
    if (!strcmp(sim_graph_op_dim_name(g, op, d), name))
      return d;
  return -1;
}

gboolean pcu_desc_splits_reduction(const SimGraph *g, int op, const int64_t *lo,
                                   const int64_t *hi)
{
  /* The shard's outputs hold partial sums when it covers part of a dimension that some
   * output does not depend on: the rule of sim_graph_op_tensor_partial(). */
  int n = sim_graph_op_n_dims(g, op);
  int split[PCU_MAX_ITER];
  for (int d = 0; d < n; d++)
    split[d] = lo[d] == 0 && hi[d] >= sim_graph_op_dim_size(g, op, d) ? 1 : 2;
  for (int j = 0; j < sim_graph_op_n_outputs(g, op); j++)
    if (sim_graph_op_tensor_partial(g, op, SIM_TENSOR_OUTPUT, j, split))
      return TRUE;
  return FALSE;
}

gboolean pcu_desc_init(PcuOpArgs *a, const SimGraph *g, int op, const int64_t *lo,
                       const int64_t *hi, int dtype, GError **error)
{
  memset(a, 0, sizeof *a);
  SimOpType type = sim_graph_op_type(g, op);
  a->type = (int)type;
  a->phase = PCU_FORWARD;
  a->dtype = dtype;
  a->n_dims = sim_graph_op_n_dims(g, op);
  for (int d = 0; d < a->n_dims && d < PCU_MAX_ITER; d++) {
    a->lo[d] = lo[d];
    a->hi[d] = hi[d];
    a->size[d] = sim_graph_op_dim_size(g, op, d);
  }
  a->n_inputs = sim_graph_op_n_inputs(g, op);
  a->n_weights = sim_graph_op_n_weights(g, op);
  a->n_outputs = sim_graph_op_n_outputs(g, op);
  if (a->n_inputs > PCU_MAX_INPUTS || a->n_weights > PCU_MAX_WEIGHTS ||
      a->n_outputs > PCU_MAX_OUTPUTS) {
    g_set_error(error, PCU_ERROR, PCU_ERROR_UNSUPPORTED,
                "%s: %d inputs, %d weights and %d outputs; the CUDA kernels take at most %d, "
                "%d and %d", sim_graph_op_name(g, op), a->n_inputs, a->n_weights, a->n_outputs,
                PCU_MAX_INPUTS, PCU_MAX_WEIGHTS, PCU_MAX_OUTPUTS);
    return FALSE;
  }
  SimRegion r;
  for (int i = 0; i < a->n_inputs; i++) {
    sim_graph_op_shard_region(g, op, SIM_TENSOR_INPUT, i, lo, hi, &r);
    a->in[i].region = region_of(&r);
    a->in_grad[i].region = a->in[i].region;
  }
  for (int i = 0; i < a->n_weights; i++) {
    sim_graph_op_shard_region(g, op, SIM_TENSOR_WEIGHT, i, lo, hi, &r);
    a->w[i].region = region_of(&r);
    a->w_grad[i].region = a->w[i].region;
  }
  for (int i = 0; i < a->n_outputs; i++) {
    sim_graph_op_shard_region(g, op, SIM_TENSOR_OUTPUT, i, lo, hi, &r);
    a->out[i].region = region_of(&r);
    a->out_grad[i].region = a->out[i].region;
  }

  g_autoptr(SimAttrs) at = sim_graph_op_attrs(g, op);
  a->act = (int)attr_int(at, "activation", SIM_UNARY_IDENTITY);
  a->has_bias = (int)attr_int(at, "bias", 0);
  a->trans_b = (int)attr_int(at, "trans_b", 0);
  a->causal = (int)attr_int(at, "causal", 0);
  a->relu = (int)attr_int(at, "relu", 0);
  a->bags = (int)attr_int(at, "bags", 0);
  a->groups = (int)attr_int(at, "groups", 1);
  a->heads = attr_int(at, "heads", 1);
  a->kv_heads = a->heads;
  a->head_dim = attr_int(at, "head_dim", 1);
  a->axis = (int)attr_int(at, "axis", 0);
  a->scale = 1.0;
  sim_attrs_get_float(at, "scale", &a->scale);
  /* The catalogue has no epsilon attribute; PyTorch's default is used. */
  a->eps = 1e-5;
  attr_pair(at, "kernel", 1, a->kernel);
  attr_pair(at, "stride", 1, a->stride);
  attr_pair(at, "padding", 0, a->padding);
  attr_pair(at, "dilation", 1, a->dilation);
  int64_t perm[SIM_MAX_DIMS] = { 0 };
  int np = sim_attrs_get_ints(at, "perm", perm, SIM_MAX_DIMS);
  for (int d = 0; d < np && d < PCU_MAX_DIMS; d++)
    a->perm[d] = (int)perm[d];
  switch (type) {
  case SIM_OP_UNARY:
    a->act = (int)attr_int(at, "kind", SIM_UNARY_IDENTITY);
    break;
  case SIM_OP_BINARY:
  case SIM_OP_POOL2D:
    a->kind = (int)attr_int(at, "kind", 0);
    break;
  case SIM_OP_DROPOUT:
    sim_attrs_get_float(at, "p", &a->p);
    break;
  case SIM_OP_ATTENTION:
    sim_attrs_get_float(at, "dropout", &a->p);
    a->kv_heads = attr_int(at, "kv_heads", a->heads);
    if (a->kv_heads <= 0)
      a->kv_heads = a->heads;
    a->rotary = (int)attr_int(at, "rotary", 0);
    a->rotary_base = 10000.0;
    sim_attrs_get_float(at, "rotary_base", &a->rotary_base);
    break;
  case SIM_OP_GATED_MLP:
    a->act = (int)attr_int(at, "gate_activation", SIM_UNARY_SILU);
    break;
  case SIM_OP_MOE:
    a->act = (int)attr_int(at, "gate_activation", SIM_UNARY_SILU);
    a->experts = attr_int(at, "experts", 1);
    a->top_k = attr_int(at, "top_k", 1);
    a->normalize_top_k = (int)attr_int(at, "normalize_top_k", 1);
    break;
  default:
    break;
  }

  /* Which shard adds a bias the partial sums would otherwise count more than once. */
  a->bias_here = 1;
  const char *first = type == SIM_OP_LINEAR ? "k" : type == SIM_OP_CONV2D ? "cin"
                      : type == SIM_OP_ATTENTION ? "h" : NULL;
  if (first) {
    int d = dim_named(g, op, first);
    a->bias_here = d < 0 || lo[d] == 0;
  }

  /* Dropout hashes the element's index in the whole batch's tensor. */
  a->name_hash = pcu_name_hash(sim_graph_op_name(g, op));
  a->step = 1;
  if (type == SIM_OP_DROPOUT) {
    SimShape s = sim_graph_tensor_shape(g, sim_graph_op_output(g, op, 0));
    a->full_ndim = s.ndim;
    for (int d = 0; d < s.ndim; d++)
      a->full[d] = s.dims[d];
  } else if (type == SIM_OP_ATTENTION) {
    SimShape q = sim_graph_tensor_shape(g, sim_graph_op_input(g, op, 0));
    SimShape k = sim_graph_tensor_shape(g, sim_graph_op_input(g, op, 1));
    a->full_ndim = 4;
    a->full[0] = q.dims[0];
    a->full[1] = a->heads;
    a->full[2] = q.dims[1];
    a->full[3] = k.dims[1];
  }
  a->batch = sim_graph_batch_size(g);

  /* Where each part of a concat or split starts along the axis. */
  if (type == SIM_OP_CONCAT || type == SIM_OP_SPLIT) {
    int parts = type == SIM_OP_CONCAT ? a->n_inputs : a->n_outputs;
    int64_t off = 0;
    for (int i = 0; i < parts; i++) {
      a->part_offset[i] = off;
      int t = type == SIM_OP_CONCAT ? sim_graph_op_input(g, op, i) : sim_graph_op_output(g, op, i);
      off += sim_graph_tensor_shape(g, t).dims[a->axis];
    }
  }
  return TRUE;
}
