/* substitutions.c — Unity's algebraic graph rewrites, searched jointly with the
 * parallelization (Unger et al. OSDI'22, after TASO's substitutions).
 *
 * Rewrites, each named with the operators it applies to, so a strategy file can record
 * them and `parasol simulate` can apply them again to the model it loads:
 *   fuse-activation:X        a linear, convolution or batch norm X followed by its only
 *                            consumer, an activation, becomes one operator (the kernel's
 *                            epilogue applies it: one pass over memory less);
 *   merge-linears:A,B,..     linears reading the same tensor become one wider linear and a
 *                            split (Q, K and V projections: one GEMM, one input gradient);
 *   merge-convs:A,B,..       the same for convolutions (Inception's 1x1 branches);
 *   fuse-attention:SM        Q/K/V projections, scores, softmax SM, weighted sum and output
 *                            projection written out op by op become one attention operator;
 * and the families of subst-gen.c (merge-concat, distribute-linear, transpose-pair,
 * fold-transpose, unary-pair, collapse-linears).  Every rewrite but fuse-attention applies
 * only where a rule of the generated set, verified with the CPU executor, covers it
 * (subst-gen.c); fuse-attention is checked the same way by the tests.
 * A rewrite rebuilds the graph through the public builder, so every shape is checked again.
 *
 * The search ("subst") is best-first over rewritten graphs: it runs an inner algorithm on
 * a graph with a share of the budget, then looks at each rewrite of that graph; carrying the
 * graph's best strategy over to the rewrite gives a first time for it, and rewrites slower
 * than alpha times the best so far are pruned (TASO's and Unity's relaxation, alpha > 1,
 * lets a search pass through a slightly worse graph to a better one).  Under MPI every rank
 * holds the same queue of graphs: each graph's inner search is shared as that algorithm
 * shares its own, and the rewrites' first times are divided among the ranks (distributed.h,
 * docs/distributed.md). */
#include "subst-private.h"
#include "distributed.h"

#include <json-glib/json-glib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------- */
/* Rebuilding a graph                                                                 */

int *subst_mapped_inputs(SubstRebuild *rb, int op)
{
  int n = sim_graph_op_n_inputs(rb->g, op);
  int *in = g_new(int, MAX(n, 1));
  for (int i = 0; i < n; i++)
    in[i] = rb->tmap[sim_graph_op_input(rb->g, op, i)];
  return in;
}

void subst_copy_flags(SubstRebuild *rb, int from, int to)
{
  if (sim_graph_op_is_checkpoint(rb->g, from))
    sim_graph_set_checkpoint(rb->out, to, TRUE);
  if (sim_graph_op_is_selective_recompute(rb->g, from))
    sim_graph_set_selective_recompute(rb->out, to, TRUE);
}

void subst_map_outputs(SubstRebuild *rb, int old_op, int new_op)
{
  for (int o = 0; o < sim_graph_op_n_outputs(rb->g, old_op); o++)
    rb->tmap[sim_graph_op_output(rb->g, old_op, o)] = sim_graph_op_output(rb->out, new_op, o);
  rb->omap[old_op] = new_op;
}

static gboolean copy_op(SubstRebuild *rb, int op, GError **error)
{
  g_autoptr(SimAttrs) a = sim_graph_op_attrs(rb->g, op);
  g_autofree int *in = subst_mapped_inputs(rb, op);
  int id = sim_graph_add_op(rb->out, sim_graph_op_type(rb->g, op), sim_graph_op_name(rb->g, op),
                            sim_graph_op_n_inputs(rb->g, op), in, a, error);
  if (id < 0)
    return FALSE;
  subst_map_outputs(rb, op, id);
  subst_copy_flags(rb, op, id);
  return TRUE;
}

/* Runs the rebuild: every op copied but the skipped ones, the replacement at the anchor. */
static SimGraph *rebuild(SubstRebuild *rb, GError **error)
{
  const SimGraph *g = rb->g;
  int n = sim_graph_n_ops(g);
  rb->out = sim_graph_new(sim_graph_get_name(g));
  gboolean ok = TRUE;
  for (int op = 0; op < n && ok; op++) {
    if (op == rb->anchor && rb->emit)
      ok = rb->emit(rb, error);
    if (ok && !rb->skip[op])
      ok = copy_op(rb, op, error);
  }
  /* Shared weights stay shared where both ops survive unchanged. */
  for (int op = 0; op < n && ok; op++) {
    int owner = sim_graph_op_weight_owner(g, op);
    if (owner >= 0 && owner != op && !rb->skip[op] && !rb->skip[owner] && rb->omap[op] >= 0 &&
        rb->omap[owner] >= 0)
      ok = sim_graph_share_weights(rb->out, rb->omap[op], rb->omap[owner], error);
  }
  if (ok) {
    sim_graph_set_tokens_per_sample(rb->out, sim_graph_tokens_per_sample(g));
    ok = sim_graph_check(rb->out, error);
  }
  if (!ok)
    g_clear_pointer(&rb->out, sim_graph_free);
  return rb->out;
}

static void rebuild_init(SubstRebuild *rb, const SimGraph *g)
{
  memset(rb, 0, sizeof *rb);
  rb->g = g;
  int nt = sim_graph_n_tensors(g), n = sim_graph_n_ops(g);
  rb->tmap = g_new(int, MAX(nt, 1));
  for (int t = 0; t < nt; t++)
    rb->tmap[t] = -1;
  rb->omap = g_new(int, MAX(n, 1));
  for (int i = 0; i < n; i++)
    rb->omap[i] = -1;
  rb->skip = g_new0(gboolean, MAX(n, 1));
  rb->anchor = -1;
}

static void rebuild_clear(SubstRebuild *rb)
{
  g_free(rb->tmap);
  g_free(rb->omap);
  g_free(rb->skip);
}

/* ---------------------------------------------------------------------------------- */
/* Pattern helpers                                                                    */

/* The only consumer of @op's only output, or -1. */
int subst_sole_consumer(const SimGraph *g, int op)
{
  if (sim_graph_op_n_outputs(g, op) != 1)
    return -1;
  int t = sim_graph_op_output(g, op, 0);
  if (sim_graph_tensor_n_consumers(g, t) != 1)
    return -1;
  int c = sim_graph_tensor_consumer(g, t, 0);
  /* Reading the tensor twice (x * x) is not a single use. */
  int uses = 0;
  for (int i = 0; i < sim_graph_op_n_inputs(g, c); i++)
    uses += sim_graph_op_input(g, c, i) == t;
  return uses == 1 ? c : -1;
}

int64_t subst_attr_int(const SimGraph *g, int op, const char *name)
{
  g_autoptr(SimAttrs) a = sim_graph_op_attrs(g, op);
  int64_t v = 0;
  sim_attrs_get_int(a, name, &v);
  return v;
}

/* Whether @op neither uses another's weights nor lends its own. */
gboolean subst_owns_weights_alone(const SimGraph *g, int op)
{
  if (sim_graph_op_weight_owner(g, op) != op)
    return FALSE;
  for (int x = 0; x < sim_graph_n_ops(g); x++)
    if (x != op && sim_graph_op_weight_owner(g, x) == op)
      return FALSE;
  return TRUE;
}

/* Every activation but the identity; the generated set decides which of them the
 * kernels fuse exactly (not a scale, whose factor the fused op cannot carry). */
static gboolean fusable_activation(int kind)
{
  return kind != SIM_UNARY_IDENTITY;
}

/* ---------------------------------------------------------------------------------- */
/* fuse-activation                                                                    */

static int fuse_activation_match(const SimGraph *g, int x)
{
  SimOpType t = sim_graph_op_type(g, x);
  if (t != SIM_OP_LINEAR && t != SIM_OP_CONV2D && t != SIM_OP_BATCHNORM)
    return -1;
  int u = subst_sole_consumer(g, x);
  if (u < 0 || sim_graph_op_type(g, u) != SIM_OP_UNARY)
    return -1;
  int kind = (int)subst_attr_int(g, u, "kind");
  gboolean free_slot = t == SIM_OP_BATCHNORM
                         ? subst_attr_int(g, x, "relu") == 0
                         : subst_attr_int(g, x, "activation") == SIM_UNARY_IDENTITY;
  if (!free_slot || !fusable_activation(kind))
    return -1;
  /* The generated set must have verified the fusion (subst-gen.c). */
  g_autofree char *id = g_strdup_printf("fuse-activation/%s/%s", sim_op_type_name(t),
                                        sim_unary_kind_name((SimUnaryKind)kind));
  return subst_rule_verified(id) ? u : -1;
}

static gboolean fuse_activation_emit(SubstRebuild *rb, GError **error)
{
  int x = rb->ops[0], u = rb->ops[1];
  g_autoptr(SimAttrs) a = sim_graph_op_attrs(rb->g, x);
  gboolean ok = sim_graph_op_type(rb->g, x) == SIM_OP_BATCHNORM
                  ? sim_attrs_set_string(a, "relu", "true", error)
                  : sim_attrs_set_string(a, "activation", sim_unary_kind_name(rb->unary), error);
  if (!ok)
    return FALSE;
  g_autofree int *in = subst_mapped_inputs(rb, x);
  int id = sim_graph_add_op(rb->out, sim_graph_op_type(rb->g, x), sim_graph_op_name(rb->g, x),
                            sim_graph_op_n_inputs(rb->g, x), in, a, error);
  if (id < 0)
    return FALSE;
  subst_map_outputs(rb, x, id);
  rb->tmap[sim_graph_op_output(rb->g, u, 0)] = sim_graph_op_output(rb->out, id, 0);
  subst_copy_flags(rb, x, id);
  subst_copy_flags(rb, u, id);
  return TRUE;
}

/* ---------------------------------------------------------------------------------- */
/* merge-linears, merge-convs                                                         */

static gboolean same_conv_shape(const SimGraph *g, int a, int b)
{
  g_autoptr(SimAttrs) x = sim_graph_op_attrs(g, a);
  g_autoptr(SimAttrs) y = sim_graph_op_attrs(g, b);
  static const char *const lists[] = { "kernel", "stride", "padding", "dilation" };
  for (gsize i = 0; i < G_N_ELEMENTS(lists); i++) {
    int64_t va[SIM_MAX_DIMS], vb[SIM_MAX_DIMS];
    int na = sim_attrs_get_ints(x, lists[i], va, SIM_MAX_DIMS);
    int nb = sim_attrs_get_ints(y, lists[i], vb, SIM_MAX_DIMS);
    if (na != nb)
      return FALSE;
    for (int k = 0; k < na && k < SIM_MAX_DIMS; k++)
      if (va[k] != vb[k])
        return FALSE;
  }
  return subst_attr_int(g, a, "groups") == 1 && subst_attr_int(g, b, "groups") == 1;
}

/* Whether linears (or convolutions) @a and @b can be one operator. */
static gboolean mergeable(const SimGraph *g, SimOpType type, int a, int b)
{
  if (sim_graph_op_type(g, a) != type || sim_graph_op_type(g, b) != type)
    return FALSE;
  if (sim_graph_op_n_inputs(g, a) != 1 || sim_graph_op_n_inputs(g, b) != 1 ||
      sim_graph_op_input(g, a, 0) != sim_graph_op_input(g, b, 0))
    return FALSE;
  if (subst_attr_int(g, a, "bias") != subst_attr_int(g, b, "bias") ||
      subst_attr_int(g, a, "activation") != subst_attr_int(g, b, "activation"))
    return FALSE;
  if (!subst_owns_weights_alone(g, a) || !subst_owns_weights_alone(g, b))
    return FALSE;
  return type == SIM_OP_LINEAR || same_conv_shape(g, a, b);
}

/* The largest group of branches one rewrite merges (the generated rules' limit). */
#define MERGE_MAX 4

/* Whether the generated set verified merging @members ops like @a. */
static gboolean merge_verified(const SimGraph *g, int a, int members)
{
  g_autofree char *id = g_strdup_printf(
    "merge/%s/n%d/bias%d/%s", sim_op_type_name(sim_graph_op_type(g, a)), members,
    (int)subst_attr_int(g, a, "bias"),
    sim_unary_kind_name((SimUnaryKind)subst_attr_int(g, a, "activation")));
  return subst_rule_verified(id);
}

static gboolean merge_emit(SubstRebuild *rb, GError **error)
{
  const SimGraph *g = rb->g;
  int first = rb->ops[0];
  SimOpType type = sim_graph_op_type(g, first);
  const char *width = type == SIM_OP_LINEAR ? "out_features" : "out_channels";
  int64_t sizes[SIM_MAX_DIMS], total = 0;
  GString *name = g_string_new(NULL);
  for (int i = 0; i < rb->n_ops; i++) {
    sizes[i] = subst_attr_int(g, rb->ops[i], width);
    total += sizes[i];
    g_string_append_printf(name, "%s%s", i ? "+" : "", sim_graph_op_name(g, rb->ops[i]));
  }
  g_autofree char *merged_name = g_string_free(name, FALSE);
  g_autofree char *split_name = g_strconcat(merged_name, ".split", NULL);
  g_autoptr(SimAttrs) a = sim_graph_op_attrs(g, first);
  if (!sim_attrs_set_int(a, width, total, error))
    return FALSE;
  g_autofree int *in = subst_mapped_inputs(rb, first);
  int id = sim_graph_add_op(rb->out, type, merged_name, 1, in, a, error);
  if (id < 0)
    return FALSE;
  for (int i = 0; i < rb->n_ops; i++)
    subst_copy_flags(rb, rb->ops[i], id);
  int out = sim_graph_op_output(rb->out, id, 0);
  SimShape sh = sim_graph_tensor_shape(rb->out, out);
  int axis = type == SIM_OP_LINEAR ? sh.ndim - 1 : 1;
  g_autoptr(SimAttrs) sa = sim_attrs_new(SIM_OP_SPLIT);
  if (!sim_attrs_set_int(sa, "axis", axis, error) ||
      !sim_attrs_set_ints(sa, "sizes", rb->n_ops, sizes, error))
    return FALSE;
  int split = sim_graph_add_op(rb->out, SIM_OP_SPLIT, split_name, 1, &out, sa, error);
  if (split < 0)
    return FALSE;
  for (int i = 0; i < rb->n_ops; i++)
    rb->tmap[sim_graph_op_output(g, rb->ops[i], 0)] = sim_graph_op_output(rb->out, split, i);
  return TRUE;
}

/* ---------------------------------------------------------------------------------- */
/* fuse-attention                                                                     */

typedef struct {
  int q, k, v, o;             /* the four linears                                    */
  int heads;
  int64_t head_dim;
  double dropout;
  int ops[24];                /* every op the attention operator replaces            */
  int n_ops;
} Attention;

static void att_add(Attention *at, int op)
{
  if (at->n_ops < (int)G_N_ELEMENTS(at->ops))
    at->ops[at->n_ops++] = op;
}

/* Follows tensor @t back through a head split (reshape to [b, s, h, d], transpose to
 * [b, h, s, d]) to the linear that made it; returns the linear or -1. */
static int head_source(const SimGraph *g, int t, Attention *at, int *heads)
{
  int op = sim_graph_tensor_producer(g, t);
  *heads = 1;
  if (op >= 0 && sim_graph_op_type(g, op) == SIM_OP_TRANSPOSE) {
    int r = sim_graph_tensor_producer(g, sim_graph_op_input(g, op, 0));
    if (r < 0 || sim_graph_op_type(g, r) != SIM_OP_RESHAPE || subst_sole_consumer(g, r) != op)
      return -1;
    SimShape sh = sim_graph_tensor_shape(g, sim_graph_op_output(g, r, 0));
    if (sh.ndim != 4)
      return -1;
    *heads = (int)sh.dims[2];
    att_add(at, op);
    att_add(at, r);
    op = sim_graph_tensor_producer(g, sim_graph_op_input(g, r, 0));
    if (op >= 0 && subst_sole_consumer(g, op) != r)
      return -1;
  }
  if (op < 0 || sim_graph_op_type(g, op) != SIM_OP_LINEAR ||
      subst_attr_int(g, op, "activation") != SIM_UNARY_IDENTITY || !subst_owns_weights_alone(g, op))
    return -1;
  return op;
}

static gboolean attention_match(const SimGraph *g, int sm, Attention *at)
{
  memset(at, 0, sizeof *at);
  if (sim_graph_op_type(g, sm) != SIM_OP_SOFTMAX)
    return FALSE;
  att_add(at, sm);
  /* Backwards: the scale by 1 / sqrt(head_dim) the attention operator applies (checked
   * below), then the scores Q K^T. */
  int prev = sim_graph_tensor_producer(g, sim_graph_op_input(g, sm, 0));
  double factor = 0;
  if (prev >= 0 && sim_graph_op_type(g, prev) == SIM_OP_UNARY &&
      subst_sole_consumer(g, prev) == sm) {
    if (subst_attr_int(g, prev, "kind") != SIM_UNARY_SCALE)
      return FALSE;
    g_autoptr(SimAttrs) sa = sim_graph_op_attrs(g, prev);
    sim_attrs_get_float(sa, "scale", &factor);
    att_add(at, prev);
    int before = sim_graph_tensor_producer(g, sim_graph_op_input(g, prev, 0));
    if (before < 0 || subst_sole_consumer(g, before) != prev)
      return FALSE;
    prev = before;
  }
  if (prev < 0 || sim_graph_op_type(g, prev) != SIM_OP_MATMUL ||
      !subst_attr_int(g, prev, "trans_b"))
    return FALSE;
  int scores = prev;
  att_add(at, scores);
  /* Forwards: optional dropout, then P V. */
  int probs = sm;
  int next = subst_sole_consumer(g, sm);
  if (next >= 0 && sim_graph_op_type(g, next) == SIM_OP_DROPOUT) {
    g_autoptr(SimAttrs) a = sim_graph_op_attrs(g, next);
    sim_attrs_get_float(a, "p", &at->dropout);
    att_add(at, next);
    probs = next;
    next = subst_sole_consumer(g, next);
  }
  if (next < 0 || sim_graph_op_type(g, next) != SIM_OP_MATMUL ||
      subst_attr_int(g, next, "trans_b") ||
      sim_graph_tensor_producer(g, sim_graph_op_input(g, next, 0)) != probs)
    return FALSE;
  int weighted = next;
  att_add(at, weighted);
  int hq, hk, hv;
  at->q = head_source(g, sim_graph_op_input(g, scores, 0), at, &hq);
  at->k = head_source(g, sim_graph_op_input(g, scores, 1), at, &hk);
  at->v = head_source(g, sim_graph_op_input(g, weighted, 1), at, &hv);
  if (at->q < 0 || at->k < 0 || at->v < 0 || hq != hk || hq != hv)
    return FALSE;
  at->heads = hq;
  /* Each projection feeds only its path into the attention. */
  for (int i = 0; i < 3; i++) {
    int lin = i == 0 ? at->q : i == 1 ? at->k : at->v;
    if (subst_sole_consumer(g, lin) < 0)
      return FALSE;
    att_add(at, lin);
  }
  if (sim_graph_op_input(g, at->k, 0) != sim_graph_op_input(g, at->v, 0))
    return FALSE;
  /* The heads merged back and the output projection. */
  int cur = subst_sole_consumer(g, weighted);
  if (at->heads > 1) {
    if (cur < 0 || sim_graph_op_type(g, cur) != SIM_OP_TRANSPOSE)
      return FALSE;
    att_add(at, cur);
    cur = subst_sole_consumer(g, cur);
    if (cur < 0 || sim_graph_op_type(g, cur) != SIM_OP_RESHAPE)
      return FALSE;
    att_add(at, cur);
    cur = subst_sole_consumer(g, cur);
  }
  if (cur < 0 || sim_graph_op_type(g, cur) != SIM_OP_LINEAR ||
      subst_attr_int(g, cur, "activation") != SIM_UNARY_IDENTITY ||
      !subst_owns_weights_alone(g, cur))
    return FALSE;
  at->o = cur;
  att_add(at, cur);
  /* Shapes: x_q [b, sq, d], x_kv [b, skv, d], projections d -> h * hd, output hd * h -> d. */
  SimShape xq = sim_graph_tensor_shape(g, sim_graph_op_input(g, at->q, 0));
  SimShape xkv = sim_graph_tensor_shape(g, sim_graph_op_input(g, at->k, 0));
  if (xq.ndim != 3 || xkv.ndim != 3 || xq.dims[2] != xkv.dims[2] || xq.dims[0] != xkv.dims[0])
    return FALSE;
  int64_t width = subst_attr_int(g, at->q, "out_features");
  if (width != subst_attr_int(g, at->k, "out_features") ||
      width != subst_attr_int(g, at->v, "out_features") ||
      width % at->heads != 0 || subst_attr_int(g, at->o, "out_features") != xq.dims[2])
    return FALSE;
  int64_t bias = subst_attr_int(g, at->q, "bias");
  if (bias != subst_attr_int(g, at->k, "bias") || bias != subst_attr_int(g, at->v, "bias") ||
      bias != subst_attr_int(g, at->o, "bias"))
    return FALSE;
  at->head_dim = width / at->heads;
  if (fabs(factor * sqrt((double)at->head_dim) - 1) > 1e-3)
    return FALSE;
  return TRUE;
}

gboolean subst_attention_linears(const SimGraph *g, int sm, int *linears)
{
  Attention at;
  if (!attention_match(g, sm, &at))
    return FALSE;
  linears[0] = at.q;
  linears[1] = at.k;
  linears[2] = at.v;
  linears[3] = at.o;
  return TRUE;
}

static gboolean attention_emit(SubstRebuild *rb, GError **error)
{
  const SimGraph *g = rb->g;
  int q = rb->ops[0], k = rb->ops[1], o = rb->ops[3], sm = rb->ops[4];
  g_autoptr(SimAttrs) a = sim_attrs_new(SIM_OP_ATTENTION);
  if (!sim_attrs_set_int(a, "heads", rb->ival[0], error) ||
      !sim_attrs_set_int(a, "head_dim", rb->ival[1], error) ||
      !sim_attrs_set_float(a, "dropout", rb->fval, error) ||
      !sim_attrs_set_string(a, "bias", rb->ival[2] ? "true" : "false", error))
    return FALSE;
  int kv = rb->tmap[sim_graph_op_input(g, k, 0)];
  int in[3] = { rb->tmap[sim_graph_op_input(g, q, 0)], kv, kv };
  g_autofree char *name = g_strconcat(sim_graph_op_name(g, sm), ".attention", NULL);
  int id = sim_graph_add_op(rb->out, SIM_OP_ATTENTION, name, 3, in, a, error);
  if (id < 0)
    return FALSE;
  rb->tmap[sim_graph_op_output(g, o, 0)] = sim_graph_op_output(rb->out, id, 0);
  subst_copy_flags(rb, o, id);
  return TRUE;
}

/* ---------------------------------------------------------------------------------- */
/* Finding and applying rewrites                                                      */

GPtrArray *search_rewrites_find(const SimGraph *g)
{
  GPtrArray *out = g_ptr_array_new_with_free_func(g_free);
  int n = sim_graph_n_ops(g);
  for (int x = 0; x < n; x++)
    if (fuse_activation_match(g, x) >= 0)
      g_ptr_array_add(out, g_strconcat("fuse-activation:", sim_graph_op_name(g, x), NULL));
  /* Merges: every maximal group (up to the set's largest verified size) of mergeable ops
   * reading one tensor. */
  for (int pass = 0; pass < 2; pass++) {
    SimOpType type = pass == 0 ? SIM_OP_LINEAR : SIM_OP_CONV2D;
    const char *kind = pass == 0 ? "merge-linears:" : "merge-convs:";
    g_autofree gboolean *used = g_new0(gboolean, MAX(n, 1));
    for (int a = 0; a < n; a++) {
      if (used[a] || sim_graph_op_type(g, a) != type)
        continue;
      GString *name = g_string_new(kind);
      g_string_append(name, sim_graph_op_name(g, a));
      int members = 1;
      for (int b = a + 1; b < n && members < MERGE_MAX; b++) {
        if (!used[b] && mergeable(g, type, a, b)) {
          used[b] = TRUE;
          g_string_append_printf(name, ",%s", sim_graph_op_name(g, b));
          members++;
        }
      }
      if (members > 1 && merge_verified(g, a, members))
        g_ptr_array_add(out, g_string_free(name, FALSE));
      else
        g_string_free(name, TRUE);
    }
  }
  for (int x = 0; x < n; x++) {
    Attention at;
    if (attention_match(g, x, &at))
      g_ptr_array_add(out, g_strconcat("fuse-attention:", sim_graph_op_name(g, x), NULL));
  }
  subst_gen_find(g, out);
  return out;
}

char **search_rewrites_list(const SimGraph *g)
{
  g_return_val_if_fail(g != NULL, NULL);
  GPtrArray *names = search_rewrites_find(g);
  g_ptr_array_set_free_func(names, NULL);
  g_ptr_array_add(names, NULL);
  return (char **)g_ptr_array_free(names, FALSE);
}

#define KINDS                                                                           \
  "fuse-activation, merge-linears, merge-convs, fuse-attention, merge-concat, "         \
  "distribute-linear, collapse-linears, transpose-pair, fold-transpose, unary-pair"

static gboolean unknown_op(const SimGraph *g, const char *rewrite, const char *name,
                           GError **error)
{
  g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
              "rewrite '%s': model '%s' has no operator '%s' to which it applies", rewrite,
              sim_graph_get_name(g), name);
  return FALSE;
}

SimGraph *search_rewrite_apply(const SimGraph *g, const char *rewrite, GError **error)
{
  return subst_apply(g, rewrite, NULL, error);
}

SimGraph *subst_apply(const SimGraph *g, const char *rewrite, int **tmap, GError **error)
{
  g_return_val_if_fail(g != NULL && rewrite != NULL, NULL);
  const char *colon = strchr(rewrite, ':');
  if (!colon) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_UNKNOWN,
                "rewrite '%s': expected KIND:OPERATORS with KIND one of %s", rewrite, KINDS);
    return NULL;
  }
  g_autofree char *kind = g_strndup(rewrite, (gsize)(colon - rewrite));
  const char *args = colon + 1;
  SubstRebuild rb;
  rebuild_init(&rb, g);
  SimGraph *out = NULL;
  if (!strcmp(kind, "fuse-activation")) {
    int x = sim_graph_op_by_name(g, args);
    int u = x >= 0 ? fuse_activation_match(g, x) : -1;
    if (u < 0) {
      unknown_op(g, rewrite, args, error);
      goto done;
    }
    rb.ops[0] = x;
    rb.ops[1] = u;
    rb.unary = (int)subst_attr_int(g, u, "kind");
    rb.anchor = x;
    rb.skip[x] = rb.skip[u] = TRUE;
    rb.emit = fuse_activation_emit;
  } else if (!strcmp(kind, "merge-linears") || !strcmp(kind, "merge-convs")) {
    SimOpType type = !strcmp(kind, "merge-linears") ? SIM_OP_LINEAR : SIM_OP_CONV2D;
    g_auto(GStrv) names = g_strsplit(args, ",", -1);
    for (char **it = names; *it; it++) {
      int x = sim_graph_op_by_name(g, *it);
      if (x < 0 || rb.n_ops >= MERGE_MAX || (rb.n_ops > 0 && !mergeable(g, type, rb.ops[0], x))) {
        unknown_op(g, rewrite, *it, error);
        goto done;
      }
      rb.ops[rb.n_ops++] = x;
    }
    if (rb.n_ops < 2 || sim_graph_op_type(g, rb.ops[0]) != type ||
        !merge_verified(g, rb.ops[0], rb.n_ops)) {
      unknown_op(g, rewrite, args, error);
      goto done;
    }
    /* In graph order, so the merged op comes where the first of them was. */
    for (int i = 1; i < rb.n_ops; i++)
      for (int j = i; j > 0 && rb.ops[j - 1] > rb.ops[j]; j--) {
        int t = rb.ops[j];
        rb.ops[j] = rb.ops[j - 1];
        rb.ops[j - 1] = t;
      }
    rb.anchor = rb.ops[0];
    for (int i = 0; i < rb.n_ops; i++)
      rb.skip[rb.ops[i]] = TRUE;
    rb.emit = merge_emit;
  } else if (!strcmp(kind, "fuse-attention")) {
    int sm = sim_graph_op_by_name(g, args);
    Attention at;
    if (sm < 0 || !attention_match(g, sm, &at)) {
      unknown_op(g, rewrite, args, error);
      goto done;
    }
    rb.ops[0] = at.q;
    rb.ops[1] = at.k;
    rb.ops[2] = at.v;
    rb.ops[3] = at.o;
    rb.ops[4] = sm;
    rb.ival[0] = at.heads;
    rb.ival[1] = at.head_dim;
    rb.ival[2] = subst_attr_int(g, at.q, "bias");
    rb.fval = at.dropout;
    /* At the output projection's place: every input of the attention is made before it,
     * and every reader of its output comes after it. */
    rb.anchor = at.o;
    for (int i = 0; i < at.n_ops; i++)
      rb.skip[at.ops[i]] = TRUE;
    rb.emit = attention_emit;
  } else {
    int r = subst_gen_prepare(&rb, kind, args, error);
    if (r == 0)
      goto done;
    if (r < 0) {
      g_set_error(error, SIM_ERROR, SIM_ERROR_UNKNOWN,
                  "unknown rewrite '%s'; expected %s", kind, KINDS);
      goto done;
    }
  }
  out = rebuild(&rb, error);
  if (out && tmap) {
    *tmap = rb.tmap;
    rb.tmap = NULL;
  }
done:
  rebuild_clear(&rb);
  return out;
}

SimGraph *search_rewrite_graph(const SimGraph *g, const char *const *names, GError **error)
{
  g_return_val_if_fail(g != NULL, NULL);
  SimGraph *cur = sim_graph_copy(g);
  for (const char *const *it = names; it && *it; it++) {
    SimGraph *next = search_rewrite_apply(cur, *it, error);
    sim_graph_free(cur);
    if (!next)
      return NULL;
    cur = next;
  }
  return cur;
}

static SimGraph *rewrite_graph(const SimGraph *g, const char *const *names, gpointer data,
                               GError **error)
{
  (void)data;
  return search_rewrite_graph(g, names, error);
}

SimStrategy *search_strategy_load(const char *path, const SimGraph *g, const SimMachine *m,
                                  SimGraph **graph, GError **error)
{
  g_return_val_if_fail(path != NULL && g != NULL && m != NULL && graph != NULL, NULL);
  return sim_strategy_load_rewritten(path, g, m, rewrite_graph, NULL, graph, error);
}

/* ---------------------------------------------------------------------------------- */
/* Carrying a strategy over to a rewritten graph                                      */

SimStrategy *search_strategy_transfer(const SearchProblem *from, const SimStrategy *s,
                                      const SearchProblem *to)
{
  SimStrategy *t = search_problem_data_parallel(to, NULL);
  if (!t || sim_strategy_n_stages(s) != 1)
    return t;
  const SimGraph *gf = from->g, *gt = to->g;
  for (int op = 0; op < sim_graph_n_ops(gt); op++) {
    int x = sim_graph_op_by_name(gf, sim_graph_op_name(gt, op));
    if (x < 0 || sim_graph_op_type(gf, x) != sim_graph_op_type(gt, op) ||
        sim_graph_op_n_dims(gf, x) != sim_graph_op_n_dims(gt, op))
      continue;
    int n = 0;
    const int *dev = sim_strategy_op_devices(s, x, &n);
    sim_strategy_set_op(t, op, sim_strategy_op_degrees(s, x), dev, NULL);
  }
  if (!sim_strategy_validate(t, gt, to->m, NULL)) {
    sim_strategy_free(t);
    return search_problem_data_parallel(to, NULL);
  }
  return t;
}

/* ---------------------------------------------------------------------------------- */
/* The search                                                                         */

typedef struct {
  SearchProblem *p;
  double prio;
  int order;
} Node;

/* The rewrites of a graph, each carried over from its best strategy and simulated once:
 * a round of tasks divided among the ranks where the search is shared (distributed.h).
 * Child i's tie key is the full evaluation base + at[i], its place among those simulated,
 * as simulating them in turn gives. */
typedef struct {
  SearchContext *ctx;
  GPtrArray *child;           /* SearchProblem*                                         */
  GPtrArray *plan;            /* SimStrategy* (NULL: none carried over)                 */
  gint64 *at;                 /* -1: not simulated (no plan, or past the budget)        */
  gint64 base;
  double *est;
} Children;

static void child_task(int i, gpointer data)
{
  Children *c = data;
  if (c->at[i] < 0 || search_context_should_stop(c->ctx))
    return;
  SearchContext *in = search_context_new_inner(c->ctx, c->ctx->algo,
                                               g_ptr_array_index(c->child, i), 0, 0);
  c->est[i] = search_context_evaluate_at(in, g_ptr_array_index(c->plan, i), c->base + c->at[i]);
  search_context_free_inner(in);
}

/* Simulates the rewrites @c->child (their plans set) within what is left of the budget;
 * their times go to @c->est, on every rank. */
static void estimate_children(Children *c)
{
  SearchContext *ctx = c->ctx;
  guint n = c->child->len;
  c->at = g_new(gint64, MAX(n, 1));
  c->est = g_new(double, MAX(n, 1));
  gint64 left = search_context_evals_left(ctx), k = 0;
  for (guint i = 0; i < n; i++) {
    c->est[i] = INFINITY;
    c->at[i] = g_ptr_array_index(c->plan, i) && k < left ? k++ : -1;
  }
  c->base = search_context_reserve_full(ctx, k);
  search_dist_parallel(ctx, (int)n, child_task, c);
  search_dist_share(ctx, (int)n, c->est, sizeof(double), sizeof(double));
  /* The times of the others' rewrites, recorded here as where they were simulated. */
  for (guint i = 0; i < n; i++)
    if (!search_dist_mine(ctx, (int)i) && isfinite(c->est[i])) {
      SearchProblem *p = g_ptr_array_index(c->child, i);
      SearchContext *in = search_context_new_inner(ctx, ctx->algo, p, 0, 0);
      search_context_record(in, p, g_ptr_array_index(c->plan, i), c->est[i],
                            search_context_full_key(c->base + c->at[i]));
      search_context_free_inner(in);
    }
  search_dist_sync(ctx);
}

static gboolean subst_run(const SearchAlgorithm *self, SearchContext *ctx, GError **error)
{
  const char *inner_name = search_context_get_option(ctx, "inner");
  if (!inner_name)
    inner_name = "dp";
  const SearchAlgorithm *inner = search_lookup(inner_name);
  if (!inner || inner == self) {
    g_set_error(error, SEARCH_ERROR, SEARCH_ERROR_UNKNOWN,
                "subst: inner=%s is not an algorithm it can run; 'parasol search --list' "
                "lists them", inner_name);
    return FALSE;
  }
  double alpha = search_context_get_option_double_in(ctx, "alpha", 1.05, 1, INFINITY);
  int max_graphs = search_context_get_option_int_in(ctx, "graphs", 8, 1, G_MAXINT);

  GArray *queue = g_array_new(FALSE, FALSE, sizeof(Node));
  GHashTable *seen = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
  Node root = { search_problem_ref(ctx->problem), 0, 0 };
  g_array_append_val(queue, root);
  g_hash_table_add(seen, sim_graph_to_json(ctx->problem->g));
  double best = INFINITY;
  int order = 1;
  gboolean ok = TRUE;
  /* Every decision below is the same on every rank: the evaluations left are summed at
   * each exchange, and the stops agreed. */
  for (int explored = 0; explored < max_graphs && queue->len && !search_dist_should_stop(ctx);
       explored++) {
    guint pick = 0;
    for (guint i = 1; i < queue->len; i++) {
      const Node *a = &g_array_index(queue, Node, i), *b = &g_array_index(queue, Node, pick);
      if (a->prio < b->prio || (a->prio == b->prio && a->order < b->order))
        pick = i;
    }
    Node node = g_array_index(queue, Node, pick);
    g_array_remove_index(queue, pick);
    /* This graph's share of what is left: the graphs that may still follow are those
     * queued and this one's rewrites, up to the limit; the first graph counts twice. */
    g_autoptr(GPtrArray) names = search_rewrites_find(node.p->g);
    int later = MIN(max_graphs - explored - 1, (int)(queue->len + names->len));
    int parts = explored == 0 ? 2 : 1;
    gint64 evals_now = search_context_evals_left(ctx);
    double time_now = ctx->deadline < G_MAXDOUBLE ? ctx->deadline - search_context_elapsed(ctx) : 0;
    gint64 ev = evals_now != G_MAXINT64 ? MAX(1, evals_now * parts / (parts + later)) : 0;
    double sec = time_now > 0 ? time_now * parts / (parts + later) : 0;
    g_autoptr(SimStrategy) s = NULL;
    /* Every rank searches this graph together, as the search's own. */
    search_dist_also(ctx, node.p);
    double cost = search_context_run_inner(ctx, inner, node.p, ev, sec, &s, error);
    search_dist_also(ctx, NULL);
    if (isnan(cost)) {
      search_problem_unref(node.p);
      ok = FALSE;
      break;
    }
    best = MIN(best, cost);
    if (s) {
      Children c = { .ctx = ctx };
      c.child = g_ptr_array_new_with_free_func((GDestroyNotify)search_problem_unref);
      c.plan = g_ptr_array_new_with_free_func((GDestroyNotify)sim_strategy_free);
      for (guint i = 0; i < names->len; i++) {
        const char *name = g_ptr_array_index(names, i);
        SimGraph *g = search_rewrite_apply(node.p->g, name, NULL);
        if (!g)
          continue;
        char *key = sim_graph_to_json(g);
        if (g_hash_table_contains(seen, key)) {
          g_free(key);
          sim_graph_free(g);
          continue;
        }
        g_hash_table_add(seen, key);
        SearchProblem *child = search_problem_derive(node.p, g, name);
        search_problem_prepare(child);
        g_ptr_array_add(c.child, child);
        g_ptr_array_add(c.plan, search_strategy_transfer(node.p, s, child));
      }
      estimate_children(&c);
      for (guint i = 0; i < c.child->len; i++) {
        /* Alpha pruning: a rewrite far slower than the best is not worth a search. */
        if (!(c.est[i] <= alpha * best))
          continue;
        Node nn = { search_problem_ref(g_ptr_array_index(c.child, i)), c.est[i], order++ };
        g_array_append_val(queue, nn);
      }
      g_ptr_array_unref(c.child);
      g_ptr_array_unref(c.plan);
      g_free(c.at);
      g_free(c.est);
    }
    search_problem_unref(node.p);
  }
  for (guint i = 0; i < queue->len; i++)
    search_problem_unref(g_array_index(queue, Node, i).p);
  g_array_unref(queue);
  g_hash_table_unref(seen);
  return ok;
}

static const SearchOptionSpec subst_options[] = {
  { "inner", "the algorithm run on each graph (default dp)" },
  { "alpha", "prune rewrites slower than alpha x the best (default 1.05)" },
  { "graphs", "the most graphs searched (default 8)" },
  { NULL, NULL },
};

const SearchAlgorithm search_algo_subst = {
  .api_version = SEARCH_ALGORITHM_API_VERSION,
  .name = "subst",
  .description = "Unity's graph substitutions searched best-first with pruning, jointly "
                 "with an inner algorithm (inner=dp)",
  .run = subst_run,
  .options = subst_options,
};
