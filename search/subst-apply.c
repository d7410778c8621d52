/* subst-apply.c — the generated families of substitutions (subst-gen.c) on real graphs:
 * where each applies, the rewrites named for the strategy file, and the operators each
 * rewrite emits. */
#include "subst-private.h"

#include <string.h>

/* ---------------------------------------------------------------------------------- */
/* The generated families on real graphs                                               */

static SimShape out_shape(const SimGraph *g, int op)
{
  return sim_graph_tensor_shape(g, sim_graph_op_output(g, op, 0));
}

static gboolean same_ints(const SimGraph *g, int a, int b, const char *name)
{
  g_autoptr(SimAttrs) x = sim_graph_op_attrs(g, a);
  g_autoptr(SimAttrs) y = sim_graph_op_attrs(g, b);
  int64_t va[SIM_MAX_DIMS], vb[SIM_MAX_DIMS];
  int na = sim_attrs_get_ints(x, name, va, SIM_MAX_DIMS);
  int nb = sim_attrs_get_ints(y, name, vb, SIM_MAX_DIMS);
  return na == nb && !memcmp(va, vb, sizeof(int64_t) * (size_t)MIN(MAX(na, 0), SIM_MAX_DIMS));
}

/* Whether linears or convolutions @a and @b read the same tensor with the same shape of
 * kernel, bias and activation, each owning its weights: one wider op can stand for both. */
static gboolean branch_twins(const SimGraph *g, int a, int b)
{
  SimOpType t = sim_graph_op_type(g, a);
  if ((t != SIM_OP_LINEAR && t != SIM_OP_CONV2D) || sim_graph_op_type(g, b) != t ||
      sim_graph_op_n_inputs(g, a) != 1 || sim_graph_op_n_inputs(g, b) != 1 ||
      sim_graph_op_input(g, a, 0) != sim_graph_op_input(g, b, 0) ||
      subst_attr_int(g, a, "bias") != subst_attr_int(g, b, "bias") ||
      subst_attr_int(g, a, "activation") != subst_attr_int(g, b, "activation") ||
      !subst_owns_weights_alone(g, a) || !subst_owns_weights_alone(g, b))
    return FALSE;
  if (t == SIM_OP_LINEAR)
    return TRUE;
  return same_ints(g, a, b, "kernel") && same_ints(g, a, b, "stride") &&
         same_ints(g, a, b, "padding") && same_ints(g, a, b, "dilation") &&
         subst_attr_int(g, a, "groups") == 1 && subst_attr_int(g, b, "groups") == 1;
}

static int producer_of_input(const SimGraph *g, int op, int i)
{
  return sim_graph_tensor_producer(g, sim_graph_op_input(g, op, i));
}

static void read_perm(const SimGraph *g, int op, int *perm, int *n)
{
  g_autoptr(SimAttrs) a = sim_graph_op_attrs(g, op);
  int64_t v[SIM_MAX_DIMS];
  int k = sim_attrs_get_ints(a, "perm", v, SIM_MAX_DIMS);
  *n = k;
  for (int i = 0; i < k && i < 4; i++)
    perm[i] = (int)v[i];
}

static gboolean unary_pair_kinds(const SimGraph *g, int u2, int *u1, int *k1, int *k2)
{
  if (sim_graph_op_type(g, u2) != SIM_OP_UNARY)
    return FALSE;
  *u1 = producer_of_input(g, u2, 0);
  if (*u1 < 0 || sim_graph_op_type(g, *u1) != SIM_OP_UNARY || subst_sole_consumer(g, *u1) != u2)
    return FALSE;
  *k1 = (int)subst_attr_int(g, *u1, "kind");
  *k2 = (int)subst_attr_int(g, u2, "kind");
  return *k1 != SIM_UNARY_IDENTITY && *k2 != SIM_UNARY_IDENTITY;
}

/* Matchers: each fills @rb's ops (and values) for the instance at @op and returns the
 * verified rule it uses, or NULL. */

static const SubstRule *match_merge_concat(const SimGraph *g, int cat, SubstRebuild *rb)
{
  if (sim_graph_op_type(g, cat) != SIM_OP_CONCAT)
    return NULL;
  int n = sim_graph_op_n_inputs(g, cat);
  if (n < 2 || n + 1 > SUBST_MAX_OPS)
    return NULL;
  int first = producer_of_input(g, cat, 0);
  if (first < 0)
    return NULL;
  SimOpType type = sim_graph_op_type(g, first);
  SimShape s = out_shape(g, first);
  int axis = (int)subst_attr_int(g, cat, "axis");
  if (axis < 0)
    axis += s.ndim;
  if (axis != (type == SIM_OP_LINEAR ? s.ndim - 1 : 1))
    return NULL;
  rb->n_ops = 0;
  for (int i = 0; i < n; i++) {
    int x = producer_of_input(g, cat, i);
    if (x < 0 || subst_sole_consumer(g, x) != cat || !branch_twins(g, first, x) ||
        (i > 0 && x == first))
      return NULL;
    for (int j = 0; j < i; j++)
      if (rb->ops[j] == x)
        return NULL;
    rb->ops[rb->n_ops++] = x;
  }
  if (subst_attr_int(g, first, "activation") != SIM_UNARY_IDENTITY)
    return NULL;
  rb->ops[rb->n_ops] = cat;
  return subst_find_verified(SUBST_MERGE_CONCAT, type, -1, -1, n,
                             (int)subst_attr_int(g, first, "bias"), NULL, NULL);
}

static const SubstRule *match_distribute(const SimGraph *g, int op, SubstRebuild *rb)
{
  if (sim_graph_op_type(g, op) != SIM_OP_BINARY || sim_graph_op_n_inputs(g, op) != 2)
    return NULL;
  int a = producer_of_input(g, op, 0), b = producer_of_input(g, op, 1);
  if (a < 0 || b < 0 || a == b || sim_graph_op_type(g, a) != SIM_OP_LINEAR ||
      sim_graph_op_type(g, b) != SIM_OP_LINEAR || subst_sole_consumer(g, a) != op ||
      subst_sole_consumer(g, b) != op || !subst_owns_weights_alone(g, a) ||
      !subst_owns_weights_alone(g, b) ||
      subst_attr_int(g, a, "activation") != SIM_UNARY_IDENTITY ||
      subst_attr_int(g, b, "activation") != SIM_UNARY_IDENTITY ||
      subst_attr_int(g, a, "bias") != subst_attr_int(g, b, "bias"))
    return NULL;
  SimShape sa = out_shape(g, a), sb = out_shape(g, b);
  SimShape xa = sim_graph_tensor_shape(g, sim_graph_op_input(g, a, 0));
  SimShape xb = sim_graph_tensor_shape(g, sim_graph_op_input(g, b, 0));
  if (sa.ndim != sb.ndim || memcmp(sa.dims, sb.dims, sizeof(int64_t) * (size_t)sa.ndim) ||
      xa.ndim != xb.ndim || memcmp(xa.dims, xb.dims, sizeof(int64_t) * (size_t)(xa.ndim - 1)))
    return NULL;
  rb->ops[0] = a;
  rb->ops[1] = b;
  rb->ops[2] = op;
  rb->n_ops = 3;
  return subst_find_verified(SUBST_DISTRIBUTE, -1, (int)subst_attr_int(g, op, "kind"), -1, -1,
                             (int)subst_attr_int(g, a, "bias"), NULL, NULL);
}

static const SubstRule *match_split_linear(const SimGraph *g, int op, SubstRebuild *rb)
{
  if (sim_graph_op_type(g, op) != SIM_OP_LINEAR || sim_graph_op_n_inputs(g, op) != 1 ||
      !subst_owns_weights_alone(g, op))
    return NULL;
  int c = producer_of_input(g, op, 0);
  if (c < 0 || sim_graph_op_type(g, c) != SIM_OP_CONCAT || subst_sole_consumer(g, c) != op)
    return NULL;
  int n = sim_graph_op_n_inputs(g, c);
  SimShape s = out_shape(g, c);
  int axis = (int)subst_attr_int(g, c, "axis");
  if (axis < 0)
    axis += s.ndim;
  if (n < 2 || n > SPLIT_MAX || axis != s.ndim - 1)
    return NULL;
  /* Each input read once (a repeated input would need its rows summed). */
  for (int i = 0; i < n; i++)
    for (int j = 0; j < i; j++)
      if (sim_graph_op_input(g, c, i) == sim_graph_op_input(g, c, j))
        return NULL;
  rb->ops[0] = c;
  rb->ops[1] = op;
  rb->n_ops = 2;
  return subst_find_verified(SUBST_SPLIT_LINEAR, -1, (int)subst_attr_int(g, op, "activation"),
                             -1, n, (int)subst_attr_int(g, op, "bias"), NULL, NULL);
}

static gboolean emit_split_linear(SubstRebuild *rb, GError **error)
{
  const SimGraph *g = rb->g;
  int c = rb->ops[0], op = rb->ops[1];
  const char *name = sim_graph_op_name(g, op);
  int n = sim_graph_op_n_inputs(g, c);
  int64_t act = subst_attr_int(g, op, "activation");
  int sum = -1;
  for (int i = 0; i < n; i++) {
    g_autoptr(SimAttrs) a = sim_graph_op_attrs(g, op);
    if (!sim_attrs_set_string(a, "activation", "identity", error) ||
        (i > 0 && !sim_attrs_set_string(a, "bias", "false", error)))
      return FALSE;
    int x = rb->tmap[sim_graph_op_input(g, c, i)];
    g_autofree char *pn = g_strdup_printf("%s.part%d", name, i);
    int id = sim_graph_add_op(rb->out, SIM_OP_LINEAR, pn, 1, &x, a, error);
    if (id < 0)
      return FALSE;
    subst_copy_flags(rb, op, id);
    int y = sim_graph_op_output(rb->out, id, 0);
    if (i == 0) {
      sum = y;
      continue;
    }
    g_autofree char *sn = g_strdup_printf("%s.sum%d", name, i);
    g_autoptr(SimAttrs) ba = sim_attrs_new(SIM_OP_BINARY);
    if (!sim_attrs_set_string(ba, "kind", "add", error))
      return FALSE;
    int in[2] = { sum, y };
    int b = sim_graph_add_op(rb->out, SIM_OP_BINARY, sn, 2, in, ba, error);
    if (b < 0)
      return FALSE;
    sum = sim_graph_op_output(rb->out, b, 0);
  }
  if (act != SIM_UNARY_IDENTITY) {
    g_autofree char *an = g_strconcat(name, ".act", NULL);
    g_autoptr(SimAttrs) ua = sim_attrs_new(SIM_OP_UNARY);
    if (!sim_attrs_set_string(ua, "kind", sim_unary_kind_name((SimUnaryKind)act), error))
      return FALSE;
    int u = sim_graph_add_op(rb->out, SIM_OP_UNARY, an, 1, &sum, ua, error);
    if (u < 0)
      return FALSE;
    sum = sim_graph_op_output(rb->out, u, 0);
  }
  rb->tmap[sim_graph_op_output(g, op, 0)] = sum;
  return TRUE;
}

static const SubstRule *match_collapse(const SimGraph *g, int op, SubstRebuild *rb)
{
  if (sim_graph_op_type(g, op) != SIM_OP_LINEAR)
    return NULL;
  int a = producer_of_input(g, op, 0);
  if (a < 0 || sim_graph_op_type(g, a) != SIM_OP_LINEAR || subst_sole_consumer(g, a) != op ||
      !subst_owns_weights_alone(g, a) || !subst_owns_weights_alone(g, op) ||
      subst_attr_int(g, a, "activation") != SIM_UNARY_IDENTITY ||
      subst_attr_int(g, op, "activation") != SIM_UNARY_IDENTITY ||
      subst_attr_int(g, a, "bias") != subst_attr_int(g, op, "bias"))
    return NULL;
  rb->ops[0] = a;
  rb->ops[1] = op;
  rb->n_ops = 2;
  return subst_find_verified(SUBST_COLLAPSE, -1, -1, -1, -1, (int)subst_attr_int(g, a, "bias"),
                             NULL, NULL);
}

static const SubstRule *match_transpose_pair(const SimGraph *g, int op, SubstRebuild *rb)
{
  if (sim_graph_op_type(g, op) != SIM_OP_TRANSPOSE)
    return NULL;
  int a = producer_of_input(g, op, 0);
  if (a < 0 || sim_graph_op_type(g, a) != SIM_OP_TRANSPOSE || subst_sole_consumer(g, a) != op)
    return NULL;
  int p[4], q[4], np = 0, nq = 0;
  read_perm(g, a, p, &np);
  read_perm(g, op, q, &nq);
  if (np != nq || np < 3 || np > 4)
    return NULL;
  rb->ops[0] = a;
  rb->ops[1] = op;
  rb->n_ops = 2;
  return subst_find_verified(SUBST_TRANSPOSE_PAIR, -1, -1, -1, np, -1, p, q);
}

static const SubstRule *match_fold_transpose(const SimGraph *g, int op, SubstRebuild *rb)
{
  if (sim_graph_op_type(g, op) != SIM_OP_MATMUL)
    return NULL;
  int t = producer_of_input(g, op, 1);
  if (t < 0 || sim_graph_op_type(g, t) != SIM_OP_TRANSPOSE || subst_sole_consumer(g, t) != op)
    return NULL;
  int p[4], n = 0;
  read_perm(g, t, p, &n);
  if (n < 3 || n > 4)
    return NULL;
  for (int d = 0; d < n - 2; d++)
    if (p[d] != d)
      return NULL;
  if (p[n - 2] != n - 1 || p[n - 1] != n - 2)
    return NULL;
  rb->ops[0] = t;
  rb->ops[1] = op;
  rb->n_ops = 2;
  return subst_find_verified(SUBST_FOLD_TRANSPOSE, -1, (int)subst_attr_int(g, op, "trans_b"),
                             -1, n, -1, NULL, NULL);
}

static const SubstRule *match_unary_pair(const SimGraph *g, int op, SubstRebuild *rb)
{
  int u1, k1, k2;
  if (!unary_pair_kinds(g, op, &u1, &k1, &k2))
    return NULL;
  rb->ops[0] = u1;
  rb->ops[1] = op;
  rb->n_ops = 2;
  return subst_find_verified(SUBST_UNARY_PAIR, -1, k1, k2, -1, -1, NULL, NULL);
}

/* Emitters. */

static char *joined_names(const SimGraph *g, const int *ops, int n, const char *sep)
{
  GString *s = g_string_new(NULL);
  for (int i = 0; i < n; i++)
    g_string_append_printf(s, "%s%s", i ? sep : "", sim_graph_op_name(g, ops[i]));
  return g_string_free(s, FALSE);
}

static gboolean emit_merge_concat(SubstRebuild *rb, GError **error)
{
  const SimGraph *g = rb->g;
  int first = rb->ops[0], cat = rb->ops[rb->n_ops];
  SimOpType type = sim_graph_op_type(g, first);
  const char *width = type == SIM_OP_LINEAR ? "out_features" : "out_channels";
  int64_t total = 0;
  for (int i = 0; i < rb->n_ops; i++)
    total += subst_attr_int(g, rb->ops[i], width);
  g_autofree char *name = joined_names(g, rb->ops, rb->n_ops, "+");
  g_autoptr(SimAttrs) a = sim_graph_op_attrs(g, first);
  if (!sim_attrs_set_int(a, width, total, error))
    return FALSE;
  g_autofree int *in = subst_mapped_inputs(rb, first);
  int id = sim_graph_add_op(rb->out, type, name, 1, in, a, error);
  if (id < 0)
    return FALSE;
  for (int i = 0; i < rb->n_ops; i++)
    subst_copy_flags(rb, rb->ops[i], id);
  subst_copy_flags(rb, cat, id);
  rb->tmap[sim_graph_op_output(g, cat, 0)] = sim_graph_op_output(rb->out, id, 0);
  return TRUE;
}

static gboolean emit_distribute(SubstRebuild *rb, GError **error)
{
  const SimGraph *g = rb->g;
  int a = rb->ops[0], b = rb->ops[1], op = rb->ops[2];
  int xs[2] = { rb->tmap[sim_graph_op_input(g, a, 0)], rb->tmap[sim_graph_op_input(g, b, 0)] };
  SimShape sx = sim_graph_tensor_shape(g, sim_graph_op_input(g, a, 0));
  g_autofree char *cname = g_strconcat(sim_graph_op_name(g, op), ".concat", NULL);
  g_autoptr(SimAttrs) ca = sim_attrs_new(SIM_OP_CONCAT);
  if (!sim_attrs_set_int(ca, "axis", sx.ndim - 1, error))
    return FALSE;
  int c = sim_graph_add_op(rb->out, SIM_OP_CONCAT, cname, 2, xs, ca, error);
  if (c < 0)
    return FALSE;
  int cx = sim_graph_op_output(rb->out, c, 0);
  g_autofree char *name = joined_names(g, rb->ops, 2, "+");
  g_autoptr(SimAttrs) la = sim_graph_op_attrs(g, a);
  int id = sim_graph_add_op(rb->out, SIM_OP_LINEAR, name, 1, &cx, la, error);
  if (id < 0)
    return FALSE;
  for (int i = 0; i < 3; i++)
    subst_copy_flags(rb, rb->ops[i], id);
  rb->tmap[sim_graph_op_output(g, op, 0)] = sim_graph_op_output(rb->out, id, 0);
  return TRUE;
}

/* Ops @first and @last of the pattern became op @id of the rewritten graph: it keeps both
 * ops' flags and stands for @last's output. */
static void pair_becomes(SubstRebuild *rb, int first, int last, int id)
{
  subst_copy_flags(rb, first, id);
  subst_copy_flags(rb, last, id);
  rb->tmap[sim_graph_op_output(rb->g, last, 0)] = sim_graph_op_output(rb->out, id, 0);
}

static gboolean emit_collapse(SubstRebuild *rb, GError **error)
{
  const SimGraph *g = rb->g;
  int a = rb->ops[0], b = rb->ops[1];
  g_autofree char *name = joined_names(g, rb->ops, 2, "*");
  g_autoptr(SimAttrs) la = sim_graph_op_attrs(g, b);
  g_autofree int *in = subst_mapped_inputs(rb, a);
  int id = sim_graph_add_op(rb->out, SIM_OP_LINEAR, name, 1, in, la, error);
  if (id < 0)
    return FALSE;
  pair_becomes(rb, a, b, id);
  return TRUE;
}

static gboolean emit_transpose_pair(SubstRebuild *rb, GError **error)
{
  const SimGraph *g = rb->g;
  int a = rb->ops[0], b = rb->ops[1];
  int x = rb->tmap[sim_graph_op_input(g, a, 0)];
  int n = (int)rb->ival[0];
  int perm[4];
  gboolean identity = TRUE;
  for (int d = 0; d < n; d++) {
    perm[d] = (int)rb->ival[1 + d];
    identity = identity && perm[d] == d;
  }
  if (identity) {
    rb->tmap[sim_graph_op_output(g, b, 0)] = x;
    return TRUE;
  }
  int64_t p64[4];
  for (int d = 0; d < n; d++)
    p64[d] = perm[d];
  g_autoptr(SimAttrs) ta = sim_attrs_new(SIM_OP_TRANSPOSE);
  if (!sim_attrs_set_ints(ta, "perm", n, p64, error))
    return FALSE;
  int id = sim_graph_add_op(rb->out, SIM_OP_TRANSPOSE, sim_graph_op_name(g, b), 1, &x, ta, error);
  if (id < 0)
    return FALSE;
  pair_becomes(rb, a, b, id);
  return TRUE;
}

static gboolean emit_fold_transpose(SubstRebuild *rb, GError **error)
{
  const SimGraph *g = rb->g;
  int t = rb->ops[0], mm = rb->ops[1];
  g_autoptr(SimAttrs) a = sim_graph_op_attrs(g, mm);
  if (!sim_attrs_set_string(a, "trans_b", rb->ival[0] ? "true" : "false", error))
    return FALSE;
  int in[2] = { rb->tmap[sim_graph_op_input(g, mm, 0)], rb->tmap[sim_graph_op_input(g, t, 0)] };
  int id = sim_graph_add_op(rb->out, SIM_OP_MATMUL, sim_graph_op_name(g, mm), 2, in, a, error);
  if (id < 0)
    return FALSE;
  pair_becomes(rb, t, mm, id);
  return TRUE;
}

static gboolean emit_unary_pair(SubstRebuild *rb, GError **error)
{
  const SimGraph *g = rb->g;
  int u1 = rb->ops[0], u2 = rb->ops[1];
  g_autoptr(SimAttrs) a = sim_attrs_new(SIM_OP_UNARY);
  if (!sim_attrs_set_string(a, "kind", sim_unary_kind_name((SimUnaryKind)rb->unary), error))
    return FALSE;
  int x = rb->tmap[sim_graph_op_input(g, u1, 0)];
  int id = sim_graph_add_op(rb->out, SIM_OP_UNARY, sim_graph_op_name(g, u2), 1, &x, a, error);
  if (id < 0)
    return FALSE;
  subst_copy_flags(rb, u1, id);
  subst_copy_flags(rb, u2, id);
  rb->tmap[sim_graph_op_output(g, u2, 0)] = sim_graph_op_output(rb->out, id, 0);
  return TRUE;
}

typedef const SubstRule *(*MatchFunc)(const SimGraph *g, int op, SubstRebuild *rb);

typedef struct {
  const char *kind;        /* the rewrite's name before the colon                     */
  MatchFunc match;
  SubstEmitFunc emit;
  gboolean proposed;       /* offered to the search (not the reparameterizing ones)    */
} GenKind;

static const GenKind gen_kinds[] = {
  { "merge-concat", match_merge_concat, emit_merge_concat, TRUE },
  { "distribute-linear", match_distribute, emit_distribute, TRUE },
  { "split-linear", match_split_linear, emit_split_linear, TRUE },
  { "collapse-linears", match_collapse, emit_collapse, FALSE },
  { "transpose-pair", match_transpose_pair, emit_transpose_pair, TRUE },
  { "fold-transpose", match_fold_transpose, emit_fold_transpose, TRUE },
  { "unary-pair", match_unary_pair, emit_unary_pair, TRUE },
};

void subst_gen_find(const SimGraph *g, GPtrArray *out)
{
  for (gsize k = 0; k < G_N_ELEMENTS(gen_kinds); k++) {
    if (!gen_kinds[k].proposed)
      continue;
    for (int op = 0; op < sim_graph_n_ops(g); op++) {
      SubstRebuild rb = { 0 };
      const SubstRule *r = gen_kinds[k].match(g, op, &rb);
      if (r && !r->reparam)
        g_ptr_array_add(out, g_strdup_printf("%s:%s", gen_kinds[k].kind, sim_graph_op_name(g, op)));
    }
  }
}

int subst_gen_prepare(SubstRebuild *rb, const char *kind, const char *args, GError **error)
{
  const GenKind *gk = NULL;
  for (gsize k = 0; k < G_N_ELEMENTS(gen_kinds) && !gk; k++)
    if (!strcmp(gen_kinds[k].kind, kind))
      gk = &gen_kinds[k];
  if (!gk)
    return -1;
  const SimGraph *g = rb->g;
  int op = sim_graph_op_by_name(g, args);
  const SubstRule *r = op >= 0 ? gk->match(g, op, rb) : NULL;
  if (!r) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                "rewrite '%s:%s': model '%s' has no operator '%s' to which a verified rule "
                "of the substitution set applies", kind, args, sim_graph_get_name(g), args);
    return 0;
  }
  int members = rb->n_ops;
  if (gk->match == match_merge_concat)
    members++; /* the concat after the branches */
  int lowest = G_MAXINT;
  for (int i = 0; i < members; i++) {
    rb->skip[rb->ops[i]] = TRUE;
    lowest = MIN(lowest, rb->ops[i]);
  }
  /* At the last op it replaces, where every input exists; merged branches at the first
   * branch (their consumers come after it). */
  rb->anchor = gk->match == match_merge_concat ? lowest : op;
  if (gk->match == match_transpose_pair) {
    rb->ival[0] = r->n;
    for (int d = 0; d < r->n; d++)
      rb->ival[1 + d] = r->r[d];
  } else if (gk->match == match_fold_transpose) {
    rb->ival[0] = r->target;
  } else if (gk->match == match_unary_pair) {
    rb->unary = r->target;
  }
  rb->emit = gk->emit;
  return 1;
}
