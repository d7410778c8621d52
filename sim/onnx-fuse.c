/* onnx-fuse.c — the ONNX importer's patterns (onnx.c says which): a Relu or GELU folded
 * into the operator before it, RMSNorm and GELU's tanh form written out, a SwiGLU MLP,
 * PyTorch's multi-head attention, each become one parasol operator; and the helpers that
 * emit operators for onnx-node.c (a linear, the spatial attributes of convolutions and
 * poolings, 1-D windows as 2-D, padding carried to the next operator). */
#include "parasol-config.h"

#if PARASOL_HAVE_ONNX

#include "onnx-private.h"

#include <math.h>
#include <string.h>

/* If @out feeds exactly a Relu, folds it: returns the name of the Relu's output. */
const char *onnx_fold_relu(Importer *im, const char *out, SimUnaryKind *act)
{
  int c = onnx_sole_consumer(im, out);
  const Onnx__NodeProto *r = onnx_node(im, c);
  if (!r || strcmp(r->op_type, "Relu") != 0 || r->n_output < 1)
    return out;
  im->skip[c] = TRUE;
  *act = SIM_UNARY_RELU;
  return r->output[0];
}

/* GELU as PyTorch exports it without a Gelu operator: y = (x * (1 + erf(x / sqrt 2))) * 0.5
 * (or with the 0.5 first).  If @x feeds exactly that, marks its nodes folded and returns
 * the name of y. */
const char *onnx_fold_gelu(Importer *im, const char *x)
{
  GArray *c = g_hash_table_lookup(im->consumers, x);
  if (!c || c->len != 2)
    return NULL;
  int div = -1, mul = -1;
  for (guint i = 0; i < 2; i++) {
    const Onnx__NodeProto *k = onnx_node(im, g_array_index(c, int, i));
    if (!strcmp(k->op_type, "Div") && k->n_input == 2 && !strcmp(k->input[0], x))
      div = g_array_index(c, int, i);
    else if (!strcmp(k->op_type, "Mul"))
      mul = g_array_index(c, int, i);
  }
  double s = 0;
  if (div < 0 || mul < 0 || !onnx_is_scalar_const(im, onnx_node(im, div)->input[1], &s) ||
      fabs(s - G_SQRT2) > 1e-4)
    return NULL;
  int erf = onnx_sole_consumer(im, onnx_node(im, div)->output[0]);
  if (!onnx_node(im, erf) || strcmp(onnx_node(im, erf)->op_type, "Erf") != 0)
    return NULL;
  int add = onnx_sole_consumer(im, onnx_node(im, erf)->output[0]);
  const Onnx__NodeProto *a = onnx_node(im, add);
  double one = 0;
  if (!a || strcmp(a->op_type, "Add") != 0 || a->n_input != 2 ||
      !(onnx_is_scalar_const(im, a->input[0], &one) || onnx_is_scalar_const(im, a->input[1], &one)) ||
      one != 1.0)
    return NULL;
  const Onnx__NodeProto *m = onnx_node(im, mul);
  gboolean takes_add = FALSE;
  for (size_t i = 0; i < m->n_input; i++)
    takes_add = takes_add || !strcmp(m->input[i], a->output[0]);
  int last = -1;
  if (takes_add) {
    /* (x * (1 + erf)) * 0.5 */
    int half = onnx_sole_consumer(im, m->output[0]);
    const Onnx__NodeProto *h = onnx_node(im, half);
    double v = 0;
    if (!h || strcmp(h->op_type, "Mul") != 0 ||
        !(onnx_is_scalar_const(im, h->input[0], &v) || onnx_is_scalar_const(im, h->input[1], &v)) ||
        v != 0.5)
      return NULL;
    last = half;
  } else {
    /* (x * 0.5) * (1 + erf) */
    double v = 0;
    if (!(onnx_is_scalar_const(im, m->input[0], &v) || onnx_is_scalar_const(im, m->input[1], &v)) ||
        v != 0.5)
      return NULL;
    int prod = onnx_sole_consumer(im, m->output[0]);
    const Onnx__NodeProto *p = onnx_node(im, prod);
    if (!p || strcmp(p->op_type, "Mul") != 0 || onnx_sole_consumer(im, a->output[0]) != prod)
      return NULL;
    last = prod;
  }
  im->skip[div] = im->skip[erf] = im->skip[add] = im->skip[mul] = im->skip[last] = TRUE;
  return onnx_node(im, last)->output[0];
}

/* A scalar that is known, or that a Constant node later in the file will make: patterns
 * are matched at their first node, before the constants they use are imported. */
static gboolean scalar_ahead(Importer *im, const char *name, double *value)
{
  if (onnx_is_scalar_const(im, name, value))
    return TRUE;
  if (!name || !*name || onnx_value_get(im, name))
    return FALSE;
  for (size_t i = 0; i < im->graph->n_node; i++) {
    const Onnx__NodeProto *k = im->graph->node[i];
    if (k->n_output < 1 || strcmp(k->output[0], name) != 0)
      continue;
    const Onnx__AttributeProto *a = strcmp(k->op_type, "Constant") ? NULL : onnx_attr(k, "value");
    if (a && a->t && a->t->data_type == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT) {
      int64_t numel = 1;
      for (size_t d = 0; d < a->t->n_dims; d++)
        numel *= a->t->dims[d];
      if (numel != 1)
        return FALSE;
      if (a->t->n_float_data == 1)
        *value = a->t->float_data[0];
      else if (a->t->has_raw_data && a->t->raw_data.len == sizeof(float)) {
        float f;
        memcpy(&f, a->t->raw_data.data, sizeof f);
        *value = f;
      } else
        return FALSE;
      return TRUE;
    }
    if (a && a->t && a->t->data_type == ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE &&
        a->t->has_raw_data && a->t->raw_data.len == sizeof(double)) {
      memcpy(value, a->t->raw_data.data, sizeof *value);
      return TRUE;
    }
    if ((a = onnx_attr(k, "value_float")) && a->has_f) {
      *value = a->f;
      return TRUE;
    }
    return FALSE;
  }
  return FALSE;
}

/* For a node of two inputs one of which is @name: the other one, else NULL. */
static const char *other_input(const Onnx__NodeProto *n, const char *name)
{
  if (!n || n->n_input != 2)
    return NULL;
  return !strcmp(n->input[0], name) ? n->input[1] : !strcmp(n->input[1], name) ? n->input[0]
                                                                               : NULL;
}

/* The node that alone consumes @name if it is an @op, or -1; Cast and Identity nodes on
 * the way are stepped over and added to @set. */
static int next_op(Importer *im, const char *name, const char *op, int *set, int *ns)
{
  int c = onnx_sole_consumer(im, name);
  while (onnx_node(im, c) && onnx_node(im, c)->n_output == 1 && *ns < 16 &&
         (!strcmp(onnx_node(im, c)->op_type, "Cast") || !strcmp(onnx_node(im, c)->op_type, "Identity"))) {
    set[(*ns)++] = c;
    c = onnx_sole_consumer(im, onnx_node(im, c)->output[0]);
  }
  return onnx_node(im, c) && !strcmp(onnx_node(im, c)->op_type, op) && onnx_node(im, c)->n_output >= 1 ? c
                                                                                        : -1;
}

/* A node of @op that alone consumes @name and takes a scalar near @want with it. */
static int next_scaled(Importer *im, const char *name, const char *op, double want, int *set,
                       int *ns)
{
  int c = next_op(im, name, op, set, ns);
  double v = 0;
  const char *o = c >= 0 ? other_input(onnx_node(im, c), name) : NULL;
  if (!o || !scalar_ahead(im, o, &v) || fabs(v - want) > 1e-3 * fabs(want))
    return -1;
  set[(*ns)++] = c;
  return c;
}

/* Among the consumers of @x, the node x ** @power: Pow(x, power), or for 2 and 3 the
 * products Mul(x, x) and Mul(x, Mul(x, x)).  Adds its nodes to @set. */
static int power_of(Importer *im, const char *x, double power, int *set, int *ns)
{
  GArray *c = g_hash_table_lookup(im->consumers, x);
  for (guint i = 0; c && i < c->len; i++) {
    int k = g_array_index(c, int, i);
    const Onnx__NodeProto *p = onnx_node(im, k);
    double e = 0;
    if (!strcmp(p->op_type, "Pow") && p->n_input == 2 && !strcmp(p->input[0], x) &&
        scalar_ahead(im, p->input[1], &e) && e == power) {
      set[(*ns)++] = k;
      return k;
    }
    if (!strcmp(p->op_type, "Mul") && p->n_input == 2 && !strcmp(p->input[0], x) &&
        !strcmp(p->input[1], x)) {
      if (power == 2) {
        set[(*ns)++] = k;
        return k;
      }
      int m = next_op(im, p->output[0], "Mul", set, ns);
      const char *o = m >= 0 ? other_input(onnx_node(im, m), p->output[0]) : NULL;
      if (power == 3 && o && !strcmp(o, x)) {
        set[(*ns)++] = k;
        set[(*ns)++] = m;
        return m;
      }
    }
  }
  return -1;
}

/* GELU's tanh approximation as written out (GPT-2's gelu_new, and torch's
 * gelu(approximate="tanh") as exported):
 * 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).  Returns the node whose output is the
 * result, with every node of the pattern in @set, or -1. */
static int match_gelu_tanh(Importer *im, const char *x, int *set, int *ns)
{
  int cube = power_of(im, x, 3, set, ns);
  if (cube < 0)
    return -1;
  int k = next_scaled(im, onnx_node(im, cube)->output[0], "Mul", 0.044715, set, ns);
  int add = k >= 0 ? next_op(im, onnx_node(im, k)->output[0], "Add", set, ns) : -1;
  const char *o = add >= 0 ? other_input(onnx_node(im, add), onnx_node(im, k)->output[0]) : NULL;
  if (!o || strcmp(o, x) != 0)
    return -1;
  set[(*ns)++] = add;
  k = next_scaled(im, onnx_node(im, add)->output[0], "Mul", sqrt(2 / G_PI), set, ns);
  int th = k >= 0 ? next_op(im, onnx_node(im, k)->output[0], "Tanh", set, ns) : -1;
  if (th < 0)
    return -1;
  set[(*ns)++] = th;
  int one = next_scaled(im, onnx_node(im, th)->output[0], "Add", 1, set, ns);
  int fin = one >= 0 ? next_op(im, onnx_node(im, one)->output[0], "Mul", set, ns) : -1;
  o = fin >= 0 ? other_input(onnx_node(im, fin), onnx_node(im, one)->output[0]) : NULL;
  if (!o)
    return -1;
  set[(*ns)++] = fin;
  if (!strcmp(o, x)) /* (x (1 + tanh)) 0.5 */
    return next_scaled(im, onnx_node(im, fin)->output[0], "Mul", 0.5, set, ns);
  /* (0.5 x) (1 + tanh) */
  GArray *c = g_hash_table_lookup(im->consumers, x);
  for (guint i = 0; c && i < c->len; i++) {
    int h = g_array_index(c, int, i);
    double v = 0;
    const char *s = other_input(onnx_node(im, h), x);
    if (!strcmp(onnx_node(im, h)->op_type, "Mul") && !strcmp(onnx_node(im, h)->output[0], o) && s &&
        scalar_ahead(im, s, &v) && v == 0.5 && onnx_sole_consumer(im, o) == fin) {
      set[(*ns)++] = h;
      return fin;
    }
  }
  return -1;
}

/* RMSNorm as PyTorch implementations write it (LLaMA's):
 * weight * (x * rsqrt(mean(x^2, -1, keepdim) + eps)), the rsqrt exported as 1 / Sqrt or
 * Reciprocal(Sqrt), or x / sqrt(...).  Returns the node whose output is the result, with
 * every node in @set, or -1. */
static int match_rmsnorm(Importer *im, const char *x, SimShape xs, int *set, int *ns)
{
  int sq = power_of(im, x, 2, set, ns);
  int mean = sq >= 0 ? next_op(im, onnx_node(im, sq)->output[0], "ReduceMean", set, ns) : -1;
  if (mean < 0)
    return -1;
  const Onnx__NodeProto *m = onnx_node(im, mean);
  int64_t axes[2];
  int na = onnx_attr_ints(m, "axes", axes, 2);
  double a1 = 0;
  if (m->n_input > 1 && scalar_ahead(im, m->input[1], &a1)) {
    axes[0] = (int64_t)a1;
    na = 1;
  }
  if (na != 1 || onnx_attr_int(m, "keepdims", 1) != 1)
    return -1;
  set[(*ns)++] = mean;
  int add = next_op(im, m->output[0], "Add", set, ns);
  double eps = 0;
  const char *o = add >= 0 ? other_input(onnx_node(im, add), m->output[0]) : NULL;
  if (!o || !scalar_ahead(im, o, &eps))
    return -1;
  set[(*ns)++] = add;
  int root = next_op(im, onnx_node(im, add)->output[0], "Sqrt", set, ns);
  if (root < 0)
    return -1;
  set[(*ns)++] = root;
  const char *r = onnx_node(im, root)->output[0];
  int normed = -1;
  int d = next_op(im, r, "Div", set, ns);
  double v = 0;
  if (d >= 0 && !strcmp(onnx_node(im, d)->input[1], r) && !strcmp(onnx_node(im, d)->input[0], x)) {
    normed = d; /* x / sqrt */
  } else {
    int inv = d >= 0 && !strcmp(onnx_node(im, d)->input[1], r) &&
                  scalar_ahead(im, onnx_node(im, d)->input[0], &v) && v == 1
                ? d
                : next_op(im, r, "Reciprocal", set, ns);
    int mul = inv >= 0 ? next_op(im, onnx_node(im, inv)->output[0], "Mul", set, ns) : -1;
    o = mul >= 0 ? other_input(onnx_node(im, mul), onnx_node(im, inv)->output[0]) : NULL;
    if (!o || strcmp(o, x) != 0)
      return -1;
    set[(*ns)++] = inv;
    normed = mul;
  }
  set[(*ns)++] = normed;
  int w = next_op(im, onnx_node(im, normed)->output[0], "Mul", set, ns);
  o = w >= 0 ? other_input(onnx_node(im, w), onnx_node(im, normed)->output[0]) : NULL;
  Value *wv = o ? onnx_value_get(im, o) : NULL;
  if (!wv || wv->kind != V_LEAF || wv->data_only || wv->shape.ndim != 1 ||
      wv->shape.dims[0] != xs.dims[xs.ndim - 1] || (axes[0] != -1 && axes[0] != xs.ndim - 1))
    return -1;
  set[(*ns)++] = w;
  return w;
}

/* At a node that reads a tensor x: GELU's tanh approximation or RMSNorm written out
 * element by element from x become one operator (the nodes of the pattern are then
 * skipped).  *fused tells whether they did. */
gboolean onnx_fuse_pointwise(Importer *im, int index, gboolean *fused)
{
  const Onnx__NodeProto *n = onnx_node(im, index);
  *fused = FALSE;
  for (size_t i = 0; i < n->n_input && i < 2; i++) {
    Value *xv = onnx_value_get(im, n->input[i]);
    if (!xv || xv->kind != V_TENSOR || xv->pad[0] || xv->pad[1])
      continue;
    const char *x = n->input[i];
    SimShape s = sim_graph_tensor_shape(im->g, xv->tensor);
    int set[32], ns = 0;
    int last = match_gelu_tanh(im, x, set, &ns);
    gboolean rms = FALSE;
    if (last < 0) {
      ns = 0;
      last = match_rmsnorm(im, x, s, set, &ns);
      rms = last >= 0;
    }
    if (last < 0)
      continue;
    gboolean mine = FALSE;
    for (int k = 0; k < ns; k++)
      mine = mine || set[k] == index;
    if (!mine)
      continue;
    g_autofree char *scope = onnx_scope_of(n);
    g_autofree char *base = g_strdup_printf("%s%s%s", scope ? scope + (scope[0] == '/') : "",
                                            scope ? "/" : "", rms ? "rmsnorm" : "gelu");
    g_autofree char *name = g_strdup(base);
    for (int k = 2; sim_graph_op_by_name(im->g, name) >= 0; k++) {
      g_free(name);
      name = g_strdup_printf("%s#%d", base, k);
    }
    int t = rms ? sim_graph_rmsnorm(im->g, name, xv->tensor)
                : sim_graph_unary(im->g, name, xv->tensor, SIM_UNARY_GELU);
    if (!onnx_built(im, n, t))
      return FALSE;
    for (int k = 0; k < ns; k++)
      im->skip[set[k]] = TRUE;
    onnx_set_tensor(im, onnx_node(im, last)->output[0], t);
    *fused = TRUE;
    return TRUE;
  }
  return TRUE;
}

/* The shape of the 2-D weight @name, also where a Transpose later in the file makes it from
 * a graph input or initializer (PyTorch transposes a Linear's weight next to its MatMul). */
static gboolean weight_ahead(Importer *im, const char *name, SimShape *shape)
{
  Value *v = onnx_value_get(im, name);
  if (v)
    return v->kind == V_LEAF && !v->data_only && v->shape.ndim == 2 && (*shape = v->shape, TRUE);
  for (size_t i = 0; name && i < im->graph->n_node; i++) {
    const Onnx__NodeProto *k = im->graph->node[i];
    if (k->n_output < 1 || strcmp(k->output[0], name) != 0)
      continue;
    Value *w = k->n_input == 1 && !strcmp(k->op_type, "Transpose") ? onnx_value_get(im, k->input[0])
                                                                    : NULL;
    if (!w || w->kind != V_LEAF || w->data_only || w->shape.ndim != 2)
      return FALSE;
    shape->ndim = 2;
    shape->dims[0] = w->shape.dims[1];
    shape->dims[1] = w->shape.dims[0];
    return TRUE;
  }
  return FALSE;
}

/* A SwiGLU MLP as PyTorch implementations write it, w2(silu(w1(x)) * w3(x)) with linears
 * without bias (exported as MatMul, Sigmoid, Mul, MatMul, Mul, MatMul), at its first
 * MatMul @index: one gated_mlp operator as the zoo's LLaMA has it (sim/ops/), with the
 * same three weights.  *fused tells whether the nodes formed it. */
gboolean onnx_fuse_swiglu(Importer *im, int index, int x, gboolean *fused)
{
  const Onnx__NodeProto *n = onnx_node(im, index);
  *fused = FALSE;
  Value *w1 = onnx_value_get(im, n->input[1]);
  const char *h = n->output[0];
  GArray *c = g_hash_table_lookup(im->consumers, h);
  if (!w1 || w1->kind != V_LEAF || w1->data_only || w1->shape.ndim != 2 || !c || c->len != 2)
    return TRUE;
  int sig = -1, m1 = -1;
  for (guint i = 0; i < 2; i++) {
    int k = g_array_index(c, int, i);
    if (!strcmp(onnx_node(im, k)->op_type, "Sigmoid"))
      sig = k;
    else if (!strcmp(onnx_node(im, k)->op_type, "Mul"))
      m1 = k;
  }
  const char *o = m1 >= 0 ? other_input(onnx_node(im, m1), h) : NULL;
  if (sig < 0 || !o || strcmp(o, onnx_node(im, sig)->output[0]) != 0 ||
      onnx_sole_consumer(im, o) != m1)
    return TRUE;
  int m2 = onnx_sole_consumer(im, onnx_node(im, m1)->output[0]);
  o = m2 >= 0 && !strcmp(onnx_node(im, m2)->op_type, "Mul")
        ? other_input(onnx_node(im, m2), onnx_node(im, m1)->output[0])
        : NULL;
  if (!o || onnx_sole_consumer(im, o) != m2)
    return TRUE;
  int up = -1;
  GArray *xc = g_hash_table_lookup(im->consumers, n->input[0]);
  for (guint i = 0; xc && i < xc->len; i++) {
    int k = g_array_index(xc, int, i);
    const Onnx__NodeProto *u = onnx_node(im, k);
    SimShape w3;
    if (!strcmp(u->op_type, "MatMul") && u->n_output == 1 && !strcmp(u->output[0], o) &&
        u->n_input == 2 && !strcmp(u->input[0], n->input[0]) &&
        weight_ahead(im, u->input[1], &w3) && sim_shape_equal(&w3, &w1->shape))
      up = k;
  }
  int down = onnx_sole_consumer(im, onnx_node(im, m2)->output[0]);
  const Onnx__NodeProto *d = onnx_node(im, down);
  SimShape w2;
  gboolean has_w2 = d && !strcmp(d->op_type, "MatMul") && d->n_input == 2 &&
                    d->n_output == 1 && !strcmp(d->input[0], onnx_node(im, m2)->output[0]) &&
                    weight_ahead(im, d->input[1], &w2);
  SimShape xs = sim_graph_tensor_shape(im->g, x);
  if (up < 0 || !has_w2 || w2.dims[0] != w1->shape.dims[1] ||
      w2.dims[1] != xs.dims[xs.ndim - 1] || w1->shape.dims[0] != xs.dims[xs.ndim - 1])
    return TRUE;
  g_autofree char *scope = onnx_scope_of(onnx_node(im, m2));
  g_autofree char *base = g_strdup_printf("%s%s%s", scope ? scope + (scope[0] == '/') : "",
                                          scope ? "/" : "", "gated_mlp");
  g_autofree char *name = g_strdup(base);
  for (int k = 2; sim_graph_op_by_name(im->g, name) >= 0; k++) {
    g_free(name);
    name = g_strdup_printf("%s#%d", base, k);
  }
  int t = sim_graph_gated_mlp(im->g, name, x, w1->shape.dims[1], SIM_UNARY_SILU);
  if (!onnx_built(im, n, t))
    return FALSE;
  im->skip[index] = im->skip[sig] = im->skip[m1] = im->skip[m2] = im->skip[up] = TRUE;
  im->skip[down] = TRUE;
  onnx_set_tensor(im, d->output[0], t);
  *fused = TRUE;
  return TRUE;
}

/* A linear over the last dimension of input 0 with weight [k, n] (MatMul) or from Gemm;
 * a following Add of a one-dimensional weight of n values is its bias, a following Relu
 * or GELU its activation. */
gboolean onnx_emit_linear(Importer *im, const Onnx__NodeProto *n, int index, int x,
                            int64_t out_features, gboolean bias)
{
  const char *out = n->output[0];
  if (!bias) {
    int c = onnx_sole_consumer(im, out);
    const Onnx__NodeProto *a = onnx_node(im, c);
    if (a && !strcmp(a->op_type, "Add") && a->n_input == 2) {
      const char *other = !strcmp(a->input[0], out) ? a->input[1] : a->input[0];
      Value *b = onnx_value_get(im, other);
      if (b && b->kind == V_LEAF && b->shape.ndim == 1 && b->shape.dims[0] == out_features) {
        bias = TRUE;
        im->skip[c] = TRUE;
        out = a->output[0];
      }
    }
  }
  SimUnaryKind act = SIM_UNARY_IDENTITY;
  const char *after = onnx_fold_relu(im, out, &act);
  if (act == SIM_UNARY_IDENTITY) {
    const char *g = onnx_fold_gelu(im, out);
    if (g) {
      act = SIM_UNARY_GELU;
      after = g;
    }
  }
  g_autofree char *name = onnx_op_name(im, n, index, NULL);
  int t = sim_graph_linear(im->g, name, x, out_features, bias, act);
  if (!onnx_built(im, n, t))
    return FALSE;
  onnx_set_tensor(im, after, t);
  return TRUE;
}

/* Padding of a Conv or pooling: "pads" [top, left, bottom, right] must be symmetric, plus
 * what a Pad before it left on the input. */
gboolean onnx_spatial_attrs(Importer *im, const Onnx__NodeProto *n, Value *in, int kernel[2],
                              int stride[2], int pad[2], int dilation[2])
{
  int64_t k[4] = { 0 }, s[4] = { 1, 1 }, p[8] = { 0 }, d[4] = { 1, 1 };
  char buf[32];
  const char *auto_pad = onnx_attr_string(n, "auto_pad", buf, sizeof buf);
  if (auto_pad && strcmp(auto_pad, "NOTSET") != 0)
    return onnx_fail(im, n, SIM_ERROR_INVALID, "auto_pad %s is not supported; export with explicit "
                "pads", auto_pad);
  int nk = onnx_attr_ints(n, "kernel_shape", k, 4);
  gboolean one = in->kind == V_TENSOR && sim_graph_tensor_shape(im->g, in->tensor).ndim == 3;
  if (kernel && nk != (one ? 1 : 2) && nk != 0)
    return onnx_fail(im, n, SIM_ERROR_INVALID, "a %d-dimensional kernel over a tensor of rank %d; "
                "only 1-D and 2-D are supported", nk, one ? 3 : 4);
  onnx_attr_ints(n, "strides", s, 4);
  int np = onnx_attr_ints(n, "pads", p, 8);
  onnx_attr_ints(n, "dilations", d, 4);
  if (one) {
    /* A 1-D window over [n, c, length] is a 1 x k window over [n, c, 1, length]. */
    if (np == 2 && p[0] != p[1])
      return onnx_fail(im, n, SIM_ERROR_INVALID, "asymmetric pads [%" G_GINT64_FORMAT ", %"
                  G_GINT64_FORMAT "] are not supported", p[0], p[1]);
    k[1] = k[0], k[0] = 1;
    s[1] = s[0], s[0] = 1;
    p[1] = p[3] = p[0], p[0] = p[2] = 0;
    d[1] = d[0], d[0] = 1;
    np = 4;
  }
  if (np == 4 && (p[0] != p[2] || p[1] != p[3]))
    return onnx_fail(im, n, SIM_ERROR_INVALID, "asymmetric pads [%" G_GINT64_FORMAT ", %"
                G_GINT64_FORMAT ", %" G_GINT64_FORMAT ", %" G_GINT64_FORMAT "] are not "
                "supported", p[0], p[1], p[2], p[3]);
  for (int i = 0; i < 2; i++) {
    if (kernel)
      kernel[i] = (int)k[i];
    stride[i] = (int)s[i];
    pad[i] = (int)p[i] + in->pad[i];
    if (dilation)
      dilation[i] = (int)d[i];
  }
  return TRUE;
}

/* A tensor [n, c, length] as [n, c, 1, length] for the 2-D operators (Conv1d,
 * MaxPool1d); 4-D tensors pass unchanged.  -1 on error. */
int onnx_as_2d(Importer *im, const Onnx__NodeProto *n, int index, int x)
{
  SimShape s = sim_graph_tensor_shape(im->g, x);
  if (s.ndim == 4)
    return x;
  if (s.ndim != 3) {
    onnx_fail(im, n, SIM_ERROR_INVALID, "the input has rank %d; 1-D and 2-D windows take [n, c, "
         "length] or [n, c, h, w]", s.ndim);
    return -1;
  }
  g_autofree char *name = onnx_op_name(im, n, index, "/2d");
  int t = sim_graph_reshape(im->g, name, x, 4,
                            (int64_t[]){ s.dims[0], s.dims[1], 1, s.dims[2] });
  return onnx_built(im, n, t) ? t : -1;
}

/* The output @y of a 2-D operator back to [n, c, length] where its input @x had rank 3. */
int onnx_from_2d(Importer *im, const Onnx__NodeProto *n, int index, int x, int y)
{
  if (y < 0 || sim_graph_tensor_shape(im->g, x).ndim == 4)
    return y;
  SimShape s = sim_graph_tensor_shape(im->g, y);
  g_autofree char *name = onnx_op_name(im, n, index, "/1d");
  int t = sim_graph_reshape(im->g, name, y, 3, (int64_t[]){ s.dims[0], s.dims[1], s.dims[3] });
  return onnx_built(im, n, t) ? t : -1;
}

gboolean onnx_padded_tensor(Importer *im, const Onnx__NodeProto *n, Value **v)
{
  *v = onnx_value_get(im, n->n_input ? n->input[0] : NULL);
  if (*v && (*v)->kind == V_TENSOR)
    return TRUE;
  int t;
  if (!onnx_tensor_of(im, n, 0, &t))
    return FALSE;
  *v = onnx_value_get(im, n->input[0]);
  return TRUE;
}

/* ---------------------------------------------------------------------------------- */
/* PyTorch's multi-head attention                                                      */

/* The scope of a node's name: "/layers.0/self_attn/MatMul" is in "/layers.0/self_attn". */
char *onnx_scope_of(const Onnx__NodeProto *n)
{
  const char *slash = n->name ? strrchr(n->name, '/') : NULL;
  return slash && slash != n->name ? g_strndup(n->name, slash - n->name) : NULL;
}

static gboolean in_scope(const Onnx__NodeProto *n, const char *scope)
{
  gsize k = strlen(scope);
  return n->name && !strncmp(n->name, scope, k) && n->name[k] == '/';
}

/* torch.nn.MultiheadAttention as torch.onnx.export writes it (its nodes named under the
 * module's scope, its weights in_proj_weight [3E, E], in_proj_bias, out_proj.weight and
 * out_proj.bias) becomes one attention operator, as the zoo's transformers have it
 * (sim/ops/attention.c): the same weights, and the batch stays dimension 0 where the
 * export transposes it away inside the module.  A square mask [S, S] is taken as causal.
 * Returns FALSE with no error when the nodes at @index do not form that module (they are
 * then imported one by one), FALSE with an error when building fails. */
gboolean onnx_fuse_attention(Importer *im, int index, gboolean *fused)
{
  *fused = FALSE;
  const Onnx__GraphProto *gr = im->graph;
  g_autofree char *scope = onnx_scope_of(gr->node[index]);
  if (!scope)
    return TRUE;
  int64_t E = 0, heads = 0;
  gboolean bias = FALSE, out_w = FALSE;
  double dropout = 0;
  GHashTable *made = g_hash_table_new(g_str_hash, g_str_equal);
  GPtrArray *data = g_ptr_array_new();
  for (size_t i = index; i < gr->n_node; i++) {
    const Onnx__NodeProto *n = gr->node[i];
    if (!in_scope(n, scope))
      continue;
    for (size_t o = 0; o < n->n_output; o++)
      g_hash_table_add(made, n->output[o]);
  }
  for (size_t i = index; i < gr->n_node; i++) {
    const Onnx__NodeProto *n = gr->node[i];
    if (!in_scope(n, scope))
      continue;
    for (size_t j = 0; j < n->n_input; j++) {
      const char *in = n->input[j];
      if (!*in || g_hash_table_contains(made, in))
        continue;
      Value *v = onnx_value_get(im, in);
      if (!v) {
        /* Made inside an attention module fused before this one, which PyTorch's export
         * shares: the keys transposed to [s, b, E] (here the batch-first tensor they came
         * from), or shape arithmetic (not needed). */
        const Onnx__NodeProto *p = NULL;
        for (size_t k = 0; k < (size_t)index && !p; k++)
          for (size_t o = 0; o < gr->node[k]->n_output; o++)
            if (!strcmp(gr->node[k]->output[o], in))
              p = gr->node[k];
        int64_t perm[4];
        if (!p || strcmp(p->op_type, "Transpose") != 0 || onnx_attr_ints(p, "perm", perm, 4) != 3 ||
            perm[0] != 1 || perm[1] != 0 || perm[2] != 2)
          continue;
        in = p->input[0];
        v = onnx_value_get(im, in);
        if (!v || v->kind != V_TENSOR)
          goto out;
      }
      if (v->kind == V_LEAF && !v->data_only) {
        if (g_str_has_suffix(in, "in_proj_weight") && v->shape.ndim == 2 &&
            v->shape.dims[0] == 3 * v->shape.dims[1])
          E = v->shape.dims[1];
        else if (g_str_has_suffix(in, "in_proj_bias"))
          bias = TRUE;
        else if (g_str_has_suffix(in, "out_proj.weight"))
          out_w = TRUE;
        else if (!g_str_has_suffix(in, "out_proj.bias"))
          goto out;  /* separate q, k, v weights, or something else */
      } else if (v->kind == V_TENSOR || v->kind == V_LEAF) {
        gboolean seen = FALSE;
        for (guint k = 0; k < data->len; k++)
          seen = seen || !strcmp(data->pdata[k], in);
        if (!seen)
          g_ptr_array_add(data, (gpointer)in);
      } else if (v->kind == V_CONST && onnx_const_numel(v) > 1 && v->shape.ndim == 2) {
        g_ptr_array_add(data, (gpointer)in);
      }
    }
    double c = 0;
    if (!strcmp(n->op_type, "Div") && n->n_input == 2 && onnx_is_scalar_const(im, n->input[1], &c) &&
        onnx_value_get(im, n->input[1])->is_int && heads == 0)
      heads = (int64_t)c;
    if (!strcmp(n->op_type, "Dropout") && n->n_input > 1 && *n->input[1])
      onnx_is_scalar_const(im, n->input[1], &dropout);
  }
  if (E <= 0 || !out_w || heads <= 0 || E % heads != 0)
    goto out;
  /* The module's output: of what its nodes make and later nodes read, what its last node
   * makes (the others are shape arithmetic PyTorch shares between modules). */
  const char *result = NULL;
  int result_node = -1;
  for (size_t i = index; i < gr->n_node; i++) {
    const Onnx__NodeProto *n = gr->node[i];
    if (!in_scope(n, scope))
      continue;
    for (size_t o = 0; o < n->n_output; o++) {
      gboolean read = FALSE;
      for (size_t k = 0; k < gr->n_output && !read; k++)
        read = !g_strcmp0(gr->output[k]->name, n->output[o]);
      GArray *c = g_hash_table_lookup(im->consumers, n->output[o]);
      for (guint k = 0; c && k < c->len && !read; k++)
        read = !in_scope(gr->node[g_array_index(c, int, k)], scope);
      if (read && (int)i > result_node) {
        result = n->output[o];
        result_node = (int)i;
      }
    }
  }
  if (!result || strcmp(gr->node[result_node]->op_type, "Constant") == 0)
    goto out;
  /* Queries, keys and values [b, s, E] in the order the module reads them; a square
   * [s, s] mask; a key padding mask [b, s_kv]. */
  int qkv[3], nq = 0;
  gboolean causal = FALSE;
  SimShape padding = { .ndim = 0 };
  for (guint k = 0; k < data->len; k++) {
    Value *v = onnx_value_get(im, data->pdata[k]);
    SimShape sh = onnx_shape_of(im, v);
    if (sh.ndim == 3 && sh.dims[2] == E && v->kind == V_TENSOR && nq < 3) {
      qkv[nq++] = v->tensor;
    } else if (sh.ndim == 2 && sh.dims[0] == sh.dims[1]) {
      causal = TRUE;
    } else if (sh.ndim == 2 && padding.ndim == 0) {
      padding = sh;
    } else {
      goto out;
    }
  }
  if (nq == 0)
    goto out;
  if (nq == 1)
    qkv[1] = qkv[2] = qkv[0];
  else if (nq == 2)
    qkv[2] = qkv[1];
  SimShape q = sim_graph_tensor_shape(im->g, qkv[0]), kv = sim_graph_tensor_shape(im->g, qkv[1]);
  if (q.dims[0] != kv.dims[0])
    goto out;
  /* A key padding mask hides keys of each sample; the kernels compute the scores of all
   * of them all the same, so the work is the unmasked attention's. */
  if (padding.ndim && (padding.dims[0] != q.dims[0] || padding.dims[1] != kv.dims[1]))
    goto out;
  if (causal && q.dims[1] != kv.dims[1])
    causal = FALSE;
  {
    g_autoptr(SimAttrs) a = sim_attrs_new(SIM_OP_ATTENTION);
    sim_attrs_set_int(a, "heads", heads, NULL);
    sim_attrs_set_int(a, "head_dim", E / heads, NULL);
    sim_attrs_set_int(a, "causal", causal, NULL);
    sim_attrs_set_float(a, "dropout", dropout, NULL);
    sim_attrs_set_int(a, "bias", bias, NULL);
    g_autoptr(GError) err = NULL;
    g_autofree char *name = g_strdup(scope[0] == '/' && scope[1] ? scope + 1 : scope);
    for (int k = 2; sim_graph_op_by_name(im->g, name) >= 0; k++) {
      g_free(name);
      name = g_strdup_printf("%s#%d", scope[0] == '/' && scope[1] ? scope + 1 : scope, k);
    }
    int op = sim_graph_add_op(im->g, SIM_OP_ATTENTION, name, 3, qkv, a, &err);
    if (op < 0) {
      g_hash_table_unref(made);
      g_ptr_array_unref(data);
      return onnx_fail(im, gr->node[index], SIM_ERROR_INVALID, "%s", err->message);
    }
    onnx_set_tensor(im, result, sim_graph_op_output(im->g, op, 0));
  }
  for (size_t i = index; i < gr->n_node; i++)
    if (in_scope(gr->node[i], scope))
      im->skip[i] = TRUE;
  *fused = TRUE;
out:
  g_hash_table_unref(made);
  g_ptr_array_unref(data);
  return TRUE;
}

#endif /* PARASOL_HAVE_ONNX */
