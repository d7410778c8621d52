/* graph.c — the graph IR: operators over tensors, adding them (with shape inference by
 * their class), flags and rewrites, queries, totals, iteration spaces and work of an op,
 * and the key of a shard.  Attributes are in attrs.c, the zoo's builders in
 * graph-build.c, and the helpers the operator classes use in op-support.c.
 *
 * Ops are appended in topological order (an op's inputs exist before it does), so op ids
 * are a topological order and no sort is ever needed.  Tensors are created by the op
 * that produces them.  sim_graph_op_work() sits on the hot path of the simulator and the
 * search and does not allocate. */
#include "sim-private.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>

/* ---------------------------------------------------------------------------------- */
/* Lifetime                                                                            */

static void *memdup(const void *p, gsize n)
{
  if (!p || n == 0)
    return NULL;
  void *q = g_malloc(n);
  memcpy(q, p, n);
  return q;
}

static void op_free(SimOp *op)
{
  if (!op)
    return;
  g_free(op->name);
  g_free(op->inputs);
  g_free(op->in_shape);
  g_free(op->in_dtype);
  g_free(op->outputs);
  g_free(op->out_shape);
  g_free(op->out_dtype);
  g_free(op->space.maps);
  g_free(op);
}

static void tensor_free(SimTensor *t)
{
  if (!t)
    return;
  g_free(t->name);
  if (t->consumers)
    g_array_unref(t->consumers);
  g_free(t);
}

SimGraph *sim_graph_new(const char *name)
{
  SimGraph *g = g_new0(SimGraph, 1);
  g->name = g_strdup(name ? name : "graph");
  g->ops = g_ptr_array_new_with_free_func((GDestroyNotify)op_free);
  g->tensors = g_ptr_array_new_with_free_func((GDestroyNotify)tensor_free);
  g->op_names = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
  g->tokens_per_sample = 1;
  return g;
}

void sim_graph_free(SimGraph *g)
{
  if (!g)
    return;
  g_free(g->name);
  g_ptr_array_unref(g->ops);
  g_ptr_array_unref(g->tensors);
  g_hash_table_unref(g->op_names);
  g_clear_error(&g->sticky_error);
  g_free(g);
}

static SimOp *op_copy(const SimOp *src)
{
  SimOp *op = g_new0(SimOp, 1);
  *op = *src;
  op->name = g_strdup(src->name);
  op->inputs = memdup(src->inputs, sizeof(int) * src->n_inputs);
  op->in_shape = memdup(src->in_shape, sizeof(SimShape) * src->n_inputs);
  op->in_dtype = memdup(src->in_dtype, sizeof(SimDType) * src->n_inputs);
  op->outputs = memdup(src->outputs, sizeof(int) * src->n_outputs);
  op->out_shape = memdup(src->out_shape, sizeof(SimShape) * src->n_outputs);
  op->out_dtype = memdup(src->out_dtype, sizeof(SimDType) * src->n_outputs);
  int n_maps = src->n_inputs + src->n_weights + src->n_outputs;
  op->space.maps = memdup(src->space.maps, sizeof(SimTensorMap) * n_maps);
  return op;
}

SimGraph *sim_graph_copy(const SimGraph *g)
{
  g_return_val_if_fail(g != NULL, NULL);
  SimGraph *c = sim_graph_new(g->name);
  for (guint i = 0; i < g->ops->len; i++) {
    SimOp *op = op_copy(sim_graph_op_get(g, (int)i));
    g_ptr_array_add(c->ops, op);
    g_hash_table_insert(c->op_names, g_strdup(op->name), GINT_TO_POINTER(op->id + 1));
  }
  for (guint i = 0; i < g->tensors->len; i++) {
    const SimTensor *src = sim_graph_tensor_get(g, (int)i);
    SimTensor *t = g_new0(SimTensor, 1);
    *t = *src;
    t->name = g_strdup(src->name);
    t->consumers = g_array_copy(src->consumers);
    g_ptr_array_add(c->tensors, t);
  }
  if (g->sticky_error)
    c->sticky_error = g_error_copy(g->sticky_error);
  c->tokens_per_sample = g->tokens_per_sample;
  memcpy(c->name_counter, g->name_counter, sizeof c->name_counter);
  return c;
}

const char *sim_graph_get_name(const SimGraph *g)
{
  g_return_val_if_fail(g != NULL, NULL);
  return g->name;
}

/* ---------------------------------------------------------------------------------- */
/* ---------------------------------------------------------------------------------- */
/* Adding operators                                                                    */

static char *generate_name(SimGraph *g, SimOpType type)
{
  for (;;) {
    char *name = g_strdup_printf("%s_%d", sim_op_type_name(type), ++g->name_counter[type]);
    if (!g_hash_table_contains(g->op_names, name))
      return name;
    g_free(name);
  }
}

/* Fills @op's attributes from @attrs and the class's defaults; a required attribute that
 * was not given is an error. */
static gboolean fill_attrs(SimOp *op, const SimOpClass *c, const SimAttrs *attrs,
                           GError **error)
{
  for (int i = 0; i < c->n_attrs; i++) {
    const SimAttrSpec *s = &c->attrs[i];
    SimAttrValue *v = &op->attrs[i];
    if (attrs && attrs->v[i].set) {
      *v = attrs->v[i];
      continue;
    }
    if (s->required) {
      sim_op_set_error(op, error, SIM_ERROR_INVALID, "attribute '%s' is required", s->name);
      return FALSE;
    }
    memset(v, 0, sizeof *v);
    switch (s->type) {
    case SIM_ATTR_FLOAT:
      v->f = s->default_value;
      break;
    case SIM_ATTR_INTS:
      /* An empty list: the class's infer() supplies the default it documents. */
      v->n = 0;
      break;
    default:
      v->i[0] = (int64_t)s->default_value;
      v->n = 1;
      break;
    }
    v->set = TRUE;
  }
  return TRUE;
}

/* The largest tensor an op may make or hold, in elements: 2^48 (half a petabyte in fp16),
 * far beyond any GPU's, and small enough that bytes, gradients and optimizer states summed
 * over a model stay inside 64-bit counts. */
#define MAX_TENSOR_ELEMENTS ((int64_t)1 << 48)

static gboolean shape_fits(const SimShape *sh)
{
  int64_t n = 1;
  for (int d = 0; d < sh->ndim; d++) {
    if (sh->dims[d] > MAX_TENSOR_ELEMENTS / MAX(n, 1))
      return FALSE;
    n *= MAX(sh->dims[d], 1);
  }
  return n <= MAX_TENSOR_ELEMENTS;
}

static char *shape_text(const SimShape *sh)
{
  GString *t = g_string_new("[");
  for (int d = 0; d < sh->ndim; d++)
    g_string_append_printf(t, "%s%" G_GINT64_FORMAT, d ? ", " : "", sh->dims[d]);
  g_string_append_c(t, ']');
  return g_string_free(t, FALSE);
}

/* Refuses an op whose outputs or weights are larger than MAX_TENSOR_ELEMENTS. */
static gboolean sizes_fit(SimOp *op, GError **error)
{
  for (int i = 0; i < op->n_outputs + op->n_weights; i++) {
    const SimShape *sh = i < op->n_outputs ? &op->out_shape[i] : &op->w_shape[i - op->n_outputs];
    if (!shape_fits(sh)) {
      g_autofree char *text = shape_text(sh);
      sim_op_set_error(op, error, SIM_ERROR_INVALID,
                       "its %s %d would be %s, more than 2^48 elements",
                       i < op->n_outputs ? "output" : "weight",
                       i < op->n_outputs ? i : i - op->n_outputs, text);
      return FALSE;
    }
  }
  return TRUE;
}

int sim_graph_add_op(SimGraph *g, SimOpType type, const char *name, int n_inputs,
                     const int *inputs, const SimAttrs *attrs, GError **error)
{
  g_return_val_if_fail(g != NULL, -1);
  g_return_val_if_fail(type >= 0 && type < SIM_OP_COUNT, -1);
  g_return_val_if_fail(n_inputs >= 0 && (n_inputs == 0 || inputs != NULL), -1);
  g_return_val_if_fail(attrs == NULL || attrs->type == type, -1);
  const SimOpClass *c = sim_op_class(type);

  if (name && !*name) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID, "%s op with an empty name", c->name);
    return -1;
  }
  if (g->ops->len >= SIM_GRAPH_MAX_OPS) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                "the graph would hold more than %d ops (GPT-3 175B holds about 2,000)",
                SIM_GRAPH_MAX_OPS);
    return -1;
  }
  if (name && g_hash_table_contains(g->op_names, name)) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                "op '%s' (%s): the graph already has an op of that name", name, c->name);
    return -1;
  }

  SimOp *op = g_new0(SimOp, 1);
  op->id = (int)g->ops->len;
  op->weight_owner = op->id;
  op->type = type;
  op->name = name ? g_strdup(name) : generate_name(g, type);

  if (n_inputs < c->min_inputs || (c->max_inputs >= 0 && n_inputs > c->max_inputs)) {
    if (c->max_inputs < 0)
      sim_op_set_error(op, error, SIM_ERROR_INVALID, "takes at least %d inputs, got %d",
                       c->min_inputs, n_inputs);
    else if (c->min_inputs == c->max_inputs)
      sim_op_set_error(op, error, SIM_ERROR_INVALID, "takes %d input%s, got %d",
                       c->min_inputs, c->min_inputs == 1 ? "" : "s", n_inputs);
    else
      sim_op_set_error(op, error, SIM_ERROR_INVALID, "takes %d to %d inputs, got %d",
                       c->min_inputs, c->max_inputs, n_inputs);
    op_free(op);
    return -1;
  }
  op->n_inputs = n_inputs;
  op->inputs = g_new(int, MAX(n_inputs, 1));
  op->in_shape = g_new0(SimShape, MAX(n_inputs, 1));
  op->in_dtype = g_new0(SimDType, MAX(n_inputs, 1));
  for (int i = 0; i < n_inputs; i++) {
    if (inputs[i] < 0 || inputs[i] >= (int)g->tensors->len) {
      sim_op_set_error(op, error, SIM_ERROR_INVALID, "input %d is tensor %d, which does not exist",
                       i, inputs[i]);
      op_free(op);
      return -1;
    }
    const SimTensor *t = sim_graph_tensor_get(g, inputs[i]);
    op->inputs[i] = inputs[i];
    op->in_shape[i] = t->shape;
    op->in_dtype[i] = t->dtype;
    if (i == 0)
      op->data_input = sim_graph_op_get(g, t->producer)->type == SIM_OP_INPUT;
  }

  if (!fill_attrs(op, c, attrs, error) || !c->infer(op, error) || !sizes_fit(op, error)) {
    op_free(op);
    return -1;
  }
  g_assert(op->n_outputs >= 1 && op->n_weights <= SIM_MAX_WEIGHTS);
  c->space(op);
  g_assert(op->space.ndims >= 1 && op->space.ndims <= SIM_MAX_ITER);
  g_assert(op->space.dims[0].role == SIM_ROLE_SAMPLE);

  /* The op is valid: from here on nothing fails. */
  for (int i = 0; i < op->n_outputs; i++) {
    SimTensor *t = g_new0(SimTensor, 1);
    t->id = (int)g->tensors->len;
    t->name = op->n_outputs == 1 ? g_strdup(op->name) : g_strdup_printf("%s:%d", op->name, i);
    t->shape = op->out_shape[i];
    t->dtype = op->out_dtype[i];
    t->producer = op->id;
    t->producer_slot = i;
    t->consumers = g_array_new(FALSE, FALSE, sizeof(int));
    g_ptr_array_add(g->tensors, t);
    op->outputs[i] = t->id;
  }
  /* A tensor lists each consuming op once, even when the op reads it several times
   * (self-attention reads one tensor as q, k and v). */
  for (int i = 0; i < n_inputs; i++) {
    gboolean seen = FALSE;
    for (int j = 0; j < i; j++)
      seen = seen || inputs[j] == inputs[i];
    if (!seen)
      g_array_append_val(sim_graph_tensor_get(g, inputs[i])->consumers, op->id);
  }
  g_ptr_array_add(g->ops, op);
  g_hash_table_insert(g->op_names, g_strdup(op->name), GINT_TO_POINTER(op->id + 1));
  return op->id;
}

gboolean sim_graph_check(const SimGraph *g, GError **error)
{
  g_return_val_if_fail(g != NULL, FALSE);
  if (g->sticky_error) {
    if (error)
      *error = g_error_copy(g->sticky_error);
    return FALSE;
  }
  return TRUE;
}

/* ---------------------------------------------------------------------------------- */
/* Flags and rewrites                                                                  */

#define CHECK_OP(g, op, val)                                                              \
  g_return_val_if_fail((g) != NULL && (op) >= 0 && (op) < (int)(g)->ops->len, val)
#define CHECK_OP_VOID(g, op)                                                              \
  g_return_if_fail((g) != NULL && (op) >= 0 && (op) < (int)(g)->ops->len)
#define CHECK_TENSOR(g, t, val)                                                           \
  g_return_val_if_fail((g) != NULL && (t) >= 0 && (t) < (int)(g)->tensors->len, val)

void sim_graph_set_selective_recompute(SimGraph *g, int op, gboolean on)
{
  CHECK_OP_VOID(g, op);
  sim_graph_op_get(g, op)->selective_recompute = on;
}

void sim_graph_set_checkpoint(SimGraph *g, int op, gboolean on)
{
  CHECK_OP_VOID(g, op);
  sim_graph_op_get(g, op)->checkpoint = on;
}

gboolean sim_graph_op_is_checkpoint(const SimGraph *g, int op)
{
  CHECK_OP(g, op, FALSE);
  return sim_graph_op_get(g, op)->checkpoint;
}

gboolean sim_graph_op_is_selective_recompute(const SimGraph *g, int op)
{
  CHECK_OP(g, op, FALSE);
  return sim_graph_op_get(g, op)->selective_recompute;
}

void sim_graph_set_float_dtype(SimGraph *g, SimDType dtype)
{
  g_return_if_fail(g != NULL && sim_dtype_is_float(dtype));
  for (guint i = 0; i < g->tensors->len; i++) {
    SimTensor *t = sim_graph_tensor_get(g, (int)i);
    if (sim_dtype_is_float(t->dtype))
      t->dtype = dtype;
  }
  for (guint i = 0; i < g->ops->len; i++) {
    SimOp *op = sim_graph_op_get(g, (int)i);
    for (int j = 0; j < op->n_inputs; j++)
      if (sim_dtype_is_float(op->in_dtype[j]))
        op->in_dtype[j] = dtype;
    for (int j = 0; j < op->n_outputs; j++)
      if (sim_dtype_is_float(op->out_dtype[j]))
        op->out_dtype[j] = dtype;
    if (sim_dtype_is_float(op->w_dtype))
      op->w_dtype = dtype;
    /* The ops that create floating-point tensors from nothing floating-point keep their
     * dtype in an attribute, so that a graph file written now reads back the same. */
    const SimOpClass *c = sim_op_class(op->type);
    int a = sim_op_class_attr_index(c, "dtype");
    if (a >= 0 && sim_dtype_is_float((SimDType)op->attrs[a].i[0]))
      op->attrs[a].i[0] = dtype;
  }
}

void sim_graph_set_attention_kernel(SimGraph *g, SimAttentionKernel k)
{
  g_return_if_fail(g != NULL && k >= 0 && k < SIM_ATTENTION_COUNT);
  const SimOpClass *c = sim_op_class(SIM_OP_ATTENTION);
  int kernel = sim_op_class_attr_index(c, "kernel"), megatron = sim_op_class_attr_index(c, "megatron_softmax");
  g_assert(kernel >= 0 && megatron >= 0);
  for (guint i = 0; i < g->ops->len; i++) {
    SimOp *op = sim_graph_op_get(g, (int)i);
    if (op->type != SIM_OP_ATTENTION)
      continue;
    op->attrs[kernel].i[0] = k;
    op->attrs[megatron].i[0] = FALSE;
  }
}

gboolean sim_graph_set_moe_routing(SimGraph *g, double capacity_factor, double imbalance,
                                   GError **error)
{
  g_return_val_if_fail(g != NULL, FALSE);
  if (!isnan(capacity_factor) && !(capacity_factor >= 0 && isfinite(capacity_factor))) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                "capacity factor %g: expected 0 (dropless) or more", capacity_factor);
    return FALSE;
  }
  if (!isnan(imbalance) && !(imbalance >= 1 && isfinite(imbalance))) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                "imbalance %g: expected 1 (balanced) or more", imbalance);
    return FALSE;
  }
  const SimOpClass *c = sim_op_class(SIM_OP_MOE);
  int cap = sim_op_class_attr_index(c, "capacity_factor");
  int imb = sim_op_class_attr_index(c, "imbalance");
  g_assert(cap >= 0 && imb >= 0);
  int n = 0;
  for (guint i = 0; i < g->ops->len; i++) {
    SimOp *op = sim_graph_op_get(g, (int)i);
    if (op->type != SIM_OP_MOE)
      continue;
    if (!isnan(capacity_factor))
      op->attrs[cap].f = capacity_factor;
    if (!isnan(imbalance))
      op->attrs[imb].f = imbalance;
    n++;
  }
  if (n == 0) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                "model '%s' has no mixture-of-experts layer to route", sim_graph_get_name(g));
    return FALSE;
  }
  return TRUE;
}

/* ---------------------------------------------------------------------------------- */
/* Queries                                                                             */

int sim_graph_n_ops(const SimGraph *g)
{
  g_return_val_if_fail(g != NULL, 0);
  return (int)g->ops->len;
}

int sim_graph_n_tensors(const SimGraph *g)
{
  g_return_val_if_fail(g != NULL, 0);
  return (int)g->tensors->len;
}

SimOpType sim_graph_op_type(const SimGraph *g, int op)
{
  CHECK_OP(g, op, SIM_OP_INPUT);
  return sim_graph_op_get(g, op)->type;
}

const char *sim_graph_op_name(const SimGraph *g, int op)
{
  CHECK_OP(g, op, NULL);
  return sim_graph_op_get(g, op)->name;
}

int sim_graph_op_by_name(const SimGraph *g, const char *name)
{
  g_return_val_if_fail(g != NULL && name != NULL, -1);
  return GPOINTER_TO_INT(g_hash_table_lookup(g->op_names, name)) - 1;
}

int sim_graph_op_n_inputs(const SimGraph *g, int op)
{
  CHECK_OP(g, op, 0);
  return sim_graph_op_get(g, op)->n_inputs;
}

int sim_graph_op_input(const SimGraph *g, int op, int i)
{
  CHECK_OP(g, op, -1);
  const SimOp *o = sim_graph_op_get(g, op);
  g_return_val_if_fail(i >= 0 && i < o->n_inputs, -1);
  return o->inputs[i];
}

int sim_graph_op_n_outputs(const SimGraph *g, int op)
{
  CHECK_OP(g, op, 0);
  return sim_graph_op_get(g, op)->n_outputs;
}

int sim_graph_op_output(const SimGraph *g, int op, int i)
{
  CHECK_OP(g, op, -1);
  const SimOp *o = sim_graph_op_get(g, op);
  g_return_val_if_fail(i >= 0 && i < o->n_outputs, -1);
  return o->outputs[i];
}

int sim_graph_op_n_weights(const SimGraph *g, int op)
{
  CHECK_OP(g, op, 0);
  return sim_graph_op_get(g, op)->n_weights;
}

SimShape sim_graph_op_weight_shape(const SimGraph *g, int op, int i)
{
  SimShape none = { 0 };
  CHECK_OP(g, op, none);
  const SimOp *o = sim_graph_op_get(g, op);
  g_return_val_if_fail(i >= 0 && i < o->n_weights, none);
  return o->w_shape[i];
}

int64_t sim_graph_op_n_params(const SimGraph *g, int op)
{
  CHECK_OP(g, op, 0);
  const SimOp *o = sim_graph_op_get(g, op);
  int64_t n = 0;
  /* Weights shared with another op count at their owner; a user's further weights (the
   * output bias of a tied decoder) are its own. */
  int first = o->weight_owner != o->id ? sim_graph_op_get(g, o->weight_owner)->n_weights : 0;
  for (int i = first; i < o->n_weights; i++)
    n += sim_shape_numel(&o->w_shape[i]);
  return n;
}

SimShape sim_graph_tensor_shape(const SimGraph *g, int t)
{
  SimShape none = { 0 };
  CHECK_TENSOR(g, t, none);
  return sim_graph_tensor_get(g, t)->shape;
}

SimDType sim_graph_tensor_dtype(const SimGraph *g, int t)
{
  CHECK_TENSOR(g, t, SIM_DTYPE_FP32);
  return sim_graph_tensor_get(g, t)->dtype;
}

const char *sim_graph_tensor_name(const SimGraph *g, int t)
{
  CHECK_TENSOR(g, t, NULL);
  return sim_graph_tensor_get(g, t)->name;
}

int sim_graph_tensor_producer(const SimGraph *g, int t)
{
  CHECK_TENSOR(g, t, -1);
  return sim_graph_tensor_get(g, t)->producer;
}

int sim_graph_tensor_n_consumers(const SimGraph *g, int t)
{
  CHECK_TENSOR(g, t, 0);
  return (int)sim_graph_tensor_get(g, t)->consumers->len;
}

int sim_graph_tensor_consumer(const SimGraph *g, int t, int i)
{
  CHECK_TENSOR(g, t, -1);
  const GArray *c = sim_graph_tensor_get(g, t)->consumers;
  g_return_val_if_fail(i >= 0 && i < (int)c->len, -1);
  return g_array_index(c, int, i);
}

gboolean sim_graph_share_weights(SimGraph *g, int op, int owner, GError **error)
{
  CHECK_OP(g, op, FALSE);
  CHECK_OP(g, owner, FALSE);
  SimOp *o = sim_graph_op_get(g, op);
  const SimOp *w = sim_graph_op_get(g, owner);
  /* Chains resolve to their root, so every user names the op that holds the weights. */
  while (w->weight_owner != w->id)
    w = sim_graph_op_get(g, w->weight_owner);
  if (w->id == o->id) {
    sim_op_set_error(o, error, SIM_ERROR_INVALID, "cannot share its own weights");
    return FALSE;
  }
  if (o->n_weights < w->n_weights || w->n_weights == 0) {
    sim_op_set_error(o, error, SIM_ERROR_INVALID,
                     "has %d weights and cannot share the %d of op '%s'", o->n_weights,
                     w->n_weights, w->name);
    return FALSE;
  }
  for (int i = 0; i < w->n_weights; i++)
    if (sim_shape_numel(&o->w_shape[i]) != sim_shape_numel(&w->w_shape[i])) {
      g_autofree char *a = sim_shape_to_string(&o->w_shape[i]);
      g_autofree char *b = sim_shape_to_string(&w->w_shape[i]);
      sim_op_set_error(o, error, SIM_ERROR_INVALID,
                       "weight %d %s cannot share weight %d %s of op '%s': sizes differ", i, a,
                       i, b, w->name);
      return FALSE;
    }
  o->weight_owner = w->id;
  return TRUE;
}

int sim_graph_op_weight_owner(const SimGraph *g, int op)
{
  CHECK_OP(g, op, -1);
  return sim_graph_op_get(g, op)->weight_owner;
}

/* ---------------------------------------------------------------------------------- */
/* Totals                                                                              */

int64_t sim_graph_n_params(const SimGraph *g)
{
  g_return_val_if_fail(g != NULL, 0);
  int64_t n = 0;
  for (int i = 0; i < (int)g->ops->len; i++)
    n += sim_graph_op_n_params(g, i);
  return n;
}

static double op_pass_total(const SimGraph *g, int op, SimPass pass, gboolean bytes)
{
  SimWork w;
  sim_graph_op_work(g, op, NULL, pass, &w);
  return bytes ? sim_work_bytes(&w) : sim_work_flops(&w);
}

double sim_graph_op_forward_flops(const SimGraph *g, int op)
{
  CHECK_OP(g, op, 0.0);
  return op_pass_total(g, op, SIM_PASS_FORWARD, FALSE);
}

double sim_graph_op_backward_flops(const SimGraph *g, int op)
{
  CHECK_OP(g, op, 0.0);
  return op_pass_total(g, op, SIM_PASS_BACKWARD, FALSE);
}

double sim_graph_op_bytes(const SimGraph *g, int op)
{
  CHECK_OP(g, op, 0.0);
  return op_pass_total(g, op, SIM_PASS_FORWARD, TRUE);
}

double sim_graph_forward_flops(const SimGraph *g)
{
  g_return_val_if_fail(g != NULL, 0.0);
  double f = 0.0;
  for (int i = 0; i < (int)g->ops->len; i++)
    f += op_pass_total(g, i, SIM_PASS_FORWARD, FALSE);
  return f;
}

double sim_graph_backward_flops(const SimGraph *g)
{
  g_return_val_if_fail(g != NULL, 0.0);
  double f = 0.0;
  for (int i = 0; i < (int)g->ops->len; i++)
    f += op_pass_total(g, i, SIM_PASS_BACKWARD, FALSE);
  return f;
}

int64_t sim_graph_batch_size(const SimGraph *g)
{
  g_return_val_if_fail(g != NULL, 0);
  /* Every op's iteration dimension 0 is the batch and the builders keep it the same
   * through the graph, so the first input's leading dimension is the batch. */
  for (guint i = 0; i < g->ops->len; i++) {
    const SimOp *op = sim_graph_op_get(g, (int)i);
    if (op->type == SIM_OP_INPUT)
      return op->out_shape[0].dims[0];
  }
  return 0;
}

int64_t sim_graph_tokens_per_sample(const SimGraph *g)
{
  g_return_val_if_fail(g != NULL, 1);
  return g->tokens_per_sample;
}

void sim_graph_set_tokens_per_sample(SimGraph *g, int64_t tokens)
{
  g_return_if_fail(g != NULL && tokens >= 1);
  g->tokens_per_sample = tokens;
}

/* ---------------------------------------------------------------------------------- */
/* Iteration spaces                                                                    */

int sim_graph_op_n_dims(const SimGraph *g, int op)
{
  CHECK_OP(g, op, 0);
  return sim_graph_op_get(g, op)->space.ndims;
}

#define CHECK_DIM(o, d, val) g_return_val_if_fail((d) >= 0 && (d) < (o)->space.ndims, val)

const char *sim_graph_op_dim_name(const SimGraph *g, int op, int d)
{
  CHECK_OP(g, op, NULL);
  const SimOp *o = sim_graph_op_get(g, op);
  CHECK_DIM(o, d, NULL);
  return o->space.dims[d].name;
}

SimDimRole sim_graph_op_dim_role(const SimGraph *g, int op, int d)
{
  CHECK_OP(g, op, SIM_ROLE_SAMPLE);
  const SimOp *o = sim_graph_op_get(g, op);
  CHECK_DIM(o, d, SIM_ROLE_SAMPLE);
  return o->space.dims[d].role;
}

int64_t sim_graph_op_dim_size(const SimGraph *g, int op, int d)
{
  CHECK_OP(g, op, 0);
  const SimOp *o = sim_graph_op_get(g, op);
  CHECK_DIM(o, d, 0);
  return o->space.dims[d].size;
}

gboolean sim_graph_op_dim_splittable(const SimGraph *g, int op, int d)
{
  CHECK_OP(g, op, FALSE);
  const SimOp *o = sim_graph_op_get(g, op);
  CHECK_DIM(o, d, FALSE);
  return o->space.dims[d].splittable;
}

void sim_graph_op_work(const SimGraph *g, int op, const int64_t *extent, SimPass pass,
                       SimWork *work)
{
  g_return_if_fail(work != NULL);
  work->n = 0;
  CHECK_OP_VOID(g, op);
  g_return_if_fail(pass >= 0 && pass < SIM_PASS_COUNT);
  const SimOp *o = sim_graph_op_get(g, op);
  int64_t full[SIM_MAX_ITER];
  const int64_t *e = sim_op_extent(o, extent, full);
  if (pass != SIM_PASS_UPDATE) {
    sim_op_class(o->type)->work(o, e, pass, work);
    for (int i = 0; i < work->n; i++) {
      work->k[i].op_type = (int)o->type + 1;
      work->k[i].pass = (int)pass;
    }
    return;
  }
  /* The update of the shard's weights: an Adam step reads and writes the parameter, its
   * gradient and the two moments (8 accesses per parameter) and spends about 10
   * operations per parameter (moments, bias correction, sqrt, divide).  Weights of 16
   * bits are trained in mixed precision: the step runs on fp32 master weights and
   * moments (8 accesses of 4 bytes), and reads the 16-bit gradient it converts and
   * writes the 16-bit weight it rounds (Micikevicius et al., "Mixed Precision Training",
   * ICLR 2018; Megatron's Float16OptimizerWithFloat16Params). */
  int64_t n = 0;
  for (int i = 0; i < o->n_weights; i++)
    n += sim_map_numel(sim_space_weight_map(o, i), &o->w_shape[i], e);
  if (n == 0)
    return;
  double w = (double)sim_dtype_size(o->w_dtype);
  double per_param = w < 4 ? 8.0 * 4 + 2.0 * w : 8.0 * w;
  int64_t width = 0, rows = sim_embedding_sparse_rows(o, e, &width);
  if (rows >= 0) {
    /* A sparse table's update: the gradient's ids sorted and coalesced (a few passes
     * over them), then each touched row read, stepped and written with its gradient
     * (SGD: 3 accesses a parameter, as recommenders train their tables). */
    n = rows * width;
    per_param = 3.0 * w;
    sim_work_add(work, sim_kernel_memory(SIM_DTYPE_INT64, 4.0 * rows, 6.0 * 8 * rows));
    if (n == 0)
      return;
  }
  SimKernel k = {
    .kind = SIM_KERNEL_OPTIMIZER,
    .dtype = o->w_dtype,
    .m = n,
    .n = 1,
    .k = 1,
    .batch = 1,
    .steps = 1,
    .flops = 10.0 * (double)n,
    .bytes = per_param * (double)n,
  };
  sim_work_add(work, k);
}

/* Attributes that give the size of the whole op: the shard's tensor shapes say the
 * shard's part of them, so a shard key leaves them out and equal shards of different
 * ops share profile entries. */
static gboolean attr_is_size(const char *name)
{
  static const char *const sizes[] = {
    "out_features", "out_channels", "vocab", "dim", "hidden", "heads", "shape", "sizes",
  };
  for (gsize i = 0; i < G_N_ELEMENTS(sizes); i++)
    if (strcmp(name, sizes[i]) == 0)
      return TRUE;
  return FALSE;
}

/* Attributes that came after profile databases were first written leave the key at
 * their defaults, so that a shard measured before them keeps its entry. */
static gboolean attr_left_out_at_default(const SimAttrSpec *spec, const SimAttrValue *v)
{
  static const char *const later[] = { "megatron_softmax", "kernel", "sparse" };
  for (gsize i = 0; i < G_N_ELEMENTS(later); i++)
    if (strcmp(spec->name, later[i]) == 0)
      return (spec->type == SIM_ATTR_BOOL || spec->type == SIM_ATTR_INT ||
              spec->type == SIM_ATTR_ENUM) && v->i[0] == (int64_t)spec->default_value;
  return FALSE;
}

static void append_shard_shape(GString *s, const char *prefix, int i, int n,
                               const SimTensorMap *map, const SimShape *shape,
                               const int64_t *extent)
{
  if (n == 1)
    g_string_append_printf(s, "|%s=[", prefix);
  else
    g_string_append_printf(s, "|%s%d=[", prefix, i);
  for (int t = 0; t < shape->ndim; t++)
    g_string_append_printf(s, "%s%" G_GINT64_FORMAT, t ? "," : "",
                           sim_map_dim_len(&map->map[t], shape->dims[t], extent));
  g_string_append_c(s, ']');
}

char *sim_graph_op_shard_key(const SimGraph *g, int op, const int64_t *extent)
{
  CHECK_OP(g, op, NULL);
  const SimOp *o = sim_graph_op_get(g, op);
  const SimOpClass *c = sim_op_class(o->type);
  int64_t full[SIM_MAX_ITER];
  const int64_t *e = sim_op_extent(o, extent, full);
  GString *s = g_string_new(c->name);
  for (int i = 0; i < o->n_inputs; i++)
    append_shard_shape(s, "x", i, o->n_inputs, sim_space_input_map(o, i), &o->in_shape[i], e);
  for (int i = 0; i < o->n_weights; i++)
    append_shard_shape(s, "w", i, o->n_weights, sim_space_weight_map(o, i), &o->w_shape[i], e);
  for (int i = 0; i < o->n_outputs; i++)
    append_shard_shape(s, "y", i, o->n_outputs, sim_space_output_map(o, i), &o->out_shape[i],
                       e);
  SimDType dt = o->n_weights ? o->w_dtype : o->out_dtype[0];
  g_string_append_printf(s, "|%s", sim_dtype_name(dt));
  for (int i = 0; i < c->n_attrs; i++) {
    const SimAttrSpec *spec = &c->attrs[i];
    const SimAttrValue *v = &o->attrs[i];
    if (attr_is_size(spec->name) || attr_left_out_at_default(spec, v))
      continue;
    g_string_append_printf(s, "|%s=", spec->name);
    switch (spec->type) {
    case SIM_ATTR_INT:
      g_string_append_printf(s, "%" G_GINT64_FORMAT, v->i[0]);
      break;
    case SIM_ATTR_BOOL:
      g_string_append(s, v->i[0] ? "true" : "false");
      break;
    case SIM_ATTR_FLOAT: {
      char buf[G_ASCII_DTOSTR_BUF_SIZE];
      g_string_append(s, g_ascii_formatd(buf, sizeof buf, "%g", v->f));
      break;
    }
    case SIM_ATTR_INTS:
      g_string_append_c(s, '[');
      for (int j = 0; j < v->n; j++)
        g_string_append_printf(s, "%s%" G_GINT64_FORMAT, j ? "," : "", v->i[j]);
      g_string_append_c(s, ']');
      break;
    case SIM_ATTR_ENUM:
      g_string_append(s, spec->enum_names[v->i[0]]);
      break;
    }
  }
  return g_string_free(s, FALSE);
}
