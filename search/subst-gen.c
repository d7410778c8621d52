/* subst-gen.c — a generated and verified set of graph substitutions (Unity, OSDI'22, after
 * TASO's generated rewrites), the rewrites the substitution search (substitutions.c) may
 * apply.
 *
 * Generation.  Candidate rules are enumerated over the operator catalogue's types and
 * attribute values, for source patterns of at most SUBST_MAX_OPS operators, in the
 * categories Unity's evaluation relies on:
 *   fusion           fuse-activation/T/K: T in {linear, conv2d} followed by an activation
 *                    of every unary kind K (batch norm: relu only, its one fused activation)
 *                    becomes T with the activation fused;
 *   parallel         merge/T/nN/biasB/K: N in 2..4 ops of type T reading one tensor become
 *   branches         one wider op and a split (weights concatenated);
 *                    merge-concat/T/nN/biasB: N in 2..3 such ops whose outputs one concat
 *                    joins along the feature axis become one wider op, no split;
 *   linear algebra   distribute/K/biasB: binary_K(linear_A(x), linear_B(y)) becomes
 *                    linear_[A;B](concat(x, y)) (a matrix product distributed over a sum,
 *                    read backwards), for every binary kind K;
 *                    collapse/biasB: linear_B(linear_A(x)) becomes one linear of weight
 *                    W_A W_B (re-association of a chain of matrix products);
 *                    transpose-pair/R/P/Q/C: transpose_Q(transpose_P(x)) becomes one
 *                    transpose C, or nothing where C is the identity, for every pair of
 *                    permutations of rank R in {3, 4}, with the two candidate compositions;
 *                    fold-transpose/R/tT/cC: matmul(a, transpose(b)) with the last two axes
 *                    swapped becomes matmul(a, b) with trans_b = C, both candidates;
 *   elementwise      unary-pair/K1/K2/C: unary_K2(unary_K1(x)) becomes unary_C(x), C in
 *   chains           {K1, K2} (relu after sigmoid is sigmoid, relu after relu is relu).
 * Partition, combine, replicate and reduce are not operators of parasol's graphs: an
 * operator's parallel configuration (its degrees and devices, chosen by the inner search)
 * stands for them, and the lowering inserts the data movements.
 *
 * Verification.  Each candidate's source pattern is built as a small graph, rewritten
 * by the very code that rewrites real graphs (substitutions.c and the families below),
 * and both graphs are executed forwards by the CPU reference executor (exec/) on random
 * inputs (uniform in [-1, 1), then in [-10, 10)) and weights (uniform in [-1, 1)); the
 * weights of a rewritten operator are mapped from the source ones (concatenated for
 * merged operators, split by rows for a split linear, stacked and summed for a
 * distributed product, multiplied for a collapsed chain).  The outputs must agree within
 * max |a - b| <= SUBST_TOLERANCE * max(1, max |b|); rules that fail, or whose rewritten
 * pattern cannot be built, are dropped and counted.  Only verified rules are applied. */
#include "subst-private.h"

#include "parasol-exec.h"

#include <string.h>

#define SUBST_MAX_OPS 4
#define SUBST_TOLERANCE 1e-4
/* Rules are checked twice, with floating-point inputs uniform in [-1, 1) and in
 * [-SUBST_INPUT_RANGE, SUBST_INPUT_RANGE): wide enough to tell relu6 from relu and to
 * take exp past 6, where the narrow range tells exp(relu(x)) from exp(x). */
#define SUBST_INPUT_RANGE 10.0f
/* The most inputs of a concatenation a split linear reads (CANDLE-Uno has 7). */
#define SPLIT_MAX 8

/* The rule being verified (per thread), which alone decides the rewrites meanwhile. */
static GPrivate forced_key;

/* ---------------------------------------------------------------------------------- */
/* Names                                                                              */

static const char *const family_names[SUBST_N_FAMILIES] = {
  [SUBST_FUSE_ACTIVATION] = "fuse-activation", [SUBST_MERGE] = "merge",
  [SUBST_MERGE_CONCAT] = "merge-concat",       [SUBST_DISTRIBUTE] = "distribute",
  [SUBST_SPLIT_LINEAR] = "split-linear",
  [SUBST_COLLAPSE] = "collapse",               [SUBST_TRANSPOSE_PAIR] = "transpose-pair",
  [SUBST_FOLD_TRANSPOSE] = "fold-transpose",   [SUBST_UNARY_PAIR] = "unary-pair",
};

static const char *const family_categories[SUBST_N_FAMILIES] = {
  [SUBST_FUSE_ACTIVATION] = "fusion",          [SUBST_MERGE] = "parallel branches",
  [SUBST_MERGE_CONCAT] = "parallel branches",  [SUBST_DISTRIBUTE] = "linear algebra",
  [SUBST_SPLIT_LINEAR] = "parallel branches",
  [SUBST_COLLAPSE] = "linear algebra",         [SUBST_TRANSPOSE_PAIR] = "linear algebra",
  [SUBST_FOLD_TRANSPOSE] = "linear algebra",   [SUBST_UNARY_PAIR] = "elementwise chains",
};

const char *subst_family_name(SubstFamily f) { return family_names[f]; }
const char *subst_family_category(SubstFamily f) { return family_categories[f]; }

const char *subst_verdict_name(SubstVerdict v)
{
  static const char *const names[] = { "untested", "verified", "mismatch", "inexpressible" };
  return names[v];
}

static char *perm_string(const int *p, int n)
{
  char buf[8] = { 0 };
  for (int i = 0; i < n && i < 4; i++)
    buf[i] = (char)('0' + p[i]);
  return g_strdup(buf);
}

static char *rule_id(const SubstRule *r)
{
  const char *f = family_names[r->family];
  const char *t = r->type >= 0 ? sim_op_type_name((SimOpType)r->type) : "";
  switch (r->family) {
  case SUBST_FUSE_ACTIVATION:
    return g_strdup_printf("%s/%s/%s", f, t, sim_unary_kind_name((SimUnaryKind)r->kind));
  case SUBST_MERGE:
    return g_strdup_printf("%s/%s/n%d/bias%d/%s", f, t, r->n, r->bias,
                           sim_unary_kind_name((SimUnaryKind)r->kind));
  case SUBST_MERGE_CONCAT:
    return g_strdup_printf("%s/%s/n%d/bias%d", f, t, r->n, r->bias);
  case SUBST_DISTRIBUTE:
    return g_strdup_printf("%s/%s/bias%d", f, sim_binary_kind_name((SimBinaryKind)r->kind),
                           r->bias);
  case SUBST_SPLIT_LINEAR:
    return g_strdup_printf("%s/n%d/bias%d/%s", f, r->n, r->bias,
                           sim_unary_kind_name((SimUnaryKind)r->kind));
  case SUBST_COLLAPSE:
    return g_strdup_printf("%s/bias%d", f, r->bias);
  case SUBST_TRANSPOSE_PAIR: {
    g_autofree char *p = perm_string(r->p, r->n), *q = perm_string(r->q, r->n);
    g_autofree char *c = perm_string(r->r, r->n);
    return g_strdup_printf("%s/%d/%s/%s/%s", f, r->n, p, q, c);
  }
  case SUBST_FOLD_TRANSPOSE:
    return g_strdup_printf("%s/%d/t%d/c%d", f, r->n, r->kind, r->target);
  case SUBST_UNARY_PAIR:
    return g_strdup_printf("%s/%s/%s/%s", f, sim_unary_kind_name((SimUnaryKind)r->kind),
                           sim_unary_kind_name((SimUnaryKind)r->kind2),
                           sim_unary_kind_name((SimUnaryKind)r->target));
  default:
    return g_strdup(f);
  }
}

SubstRule *subst_rule_copy(const SubstRule *r)
{
  SubstRule *c = g_new(SubstRule, 1);
  *c = *r;
  c->id = g_strdup(r->id);
  c->why = g_strdup(r->why);
  return c;
}

void subst_rule_free(SubstRule *r)
{
  if (!r)
    return;
  g_free(r->id);
  g_free(r->why);
  g_free(r);
}

/* ---------------------------------------------------------------------------------- */
/* Generation                                                                         */

static SubstRule *rule_new(SubstFamily f, int type, int src_ops, int dst_ops)
{
  SubstRule *r = g_new0(SubstRule, 1);
  r->family = f;
  r->type = type;
  r->kind = r->kind2 = r->target = -1;
  r->src_ops = src_ops;
  r->dst_ops = dst_ops;
  return r;
}

static void add_rule(GPtrArray *rules, SubstRule *r)
{
  r->id = rule_id(r);
  g_ptr_array_add(rules, r);
}

static gboolean perm_is_identity(const int *p, int n)
{
  for (int i = 0; i < n; i++)
    if (p[i] != i)
      return FALSE;
  return TRUE;
}

/* Every permutation of 0..n-1, in lexicographic order; returns how many (n! <= 24). */
static int all_perms(int n, int perms[24][4])
{
  int count = 0;
  int a[4] = { 0, 1, 2, 3 };
  for (;;) {
    memcpy(perms[count++], a, sizeof a);
    int i = n - 2;
    while (i >= 0 && a[i] >= a[i + 1])
      i--;
    if (i < 0)
      return count;
    int j = n - 1;
    while (a[j] <= a[i])
      j--;
    int t = a[i];
    a[i] = a[j];
    a[j] = t;
    for (int l = i + 1, h = n - 1; l < h; l++, h--) {
      t = a[l];
      a[l] = a[h];
      a[h] = t;
    }
  }
}

static void generate(GPtrArray *rules)
{
  static const SimOpType dense[] = { SIM_OP_LINEAR, SIM_OP_CONV2D };
  /* Fusion. */
  for (gsize t = 0; t < G_N_ELEMENTS(dense); t++)
    for (int k = SIM_UNARY_IDENTITY + 1; k < SIM_UNARY_COUNT; k++) {
      SubstRule *r = rule_new(SUBST_FUSE_ACTIVATION, dense[t], 2, 1);
      r->kind = k;
      add_rule(rules, r);
    }
  SubstRule *bn = rule_new(SUBST_FUSE_ACTIVATION, SIM_OP_BATCHNORM, 2, 1);
  bn->kind = SIM_UNARY_RELU;
  add_rule(rules, bn);
  /* Parallel branches. */
  for (gsize t = 0; t < G_N_ELEMENTS(dense); t++)
    for (int n = 2; n <= SUBST_MAX_OPS; n++)
      for (int b = 0; b < 2; b++)
        for (int k = SIM_UNARY_IDENTITY; k < SIM_UNARY_COUNT; k++) {
          if (k == SIM_UNARY_SCALE)
            continue; /* not an activation a linear or convolution carries */
          SubstRule *r = rule_new(SUBST_MERGE, dense[t], n, 2);
          r->n = n;
          r->bias = b;
          r->kind = k;
          add_rule(rules, r);
        }
  for (gsize t = 0; t < G_N_ELEMENTS(dense); t++)
    for (int n = 2; n + 1 <= SUBST_MAX_OPS; n++)
      for (int b = 0; b < 2; b++) {
        SubstRule *r = rule_new(SUBST_MERGE_CONCAT, dense[t], n + 1, 1);
        r->n = n;
        r->bias = b;
        add_rule(rules, r);
      }
  /* Linear algebra. */
  for (int k = 0; k < SIM_BINARY_COUNT; k++)
    for (int b = 0; b < 2; b++) {
      SubstRule *r = rule_new(SUBST_DISTRIBUTE, SIM_OP_LINEAR, 3, 2);
      r->kind = k;
      r->bias = b;
      r->reparam = b; /* two biases become one */
      add_rule(rules, r);
    }
  for (int n = 2; n <= SPLIT_MAX; n++)
    for (int b = 0; b < 2; b++)
      for (int k = SIM_UNARY_IDENTITY; k < SIM_UNARY_COUNT; k++) {
        if (k == SIM_UNARY_SCALE)
          continue;
        SubstRule *r = rule_new(SUBST_SPLIT_LINEAR, SIM_OP_LINEAR, 2,
                                2 * n - 1 + (k != SIM_UNARY_IDENTITY));
        r->n = n;
        r->bias = b;
        r->kind = k;
        add_rule(rules, r);
      }
  for (int b = 0; b < 2; b++) {
    SubstRule *r = rule_new(SUBST_COLLAPSE, SIM_OP_LINEAR, 2, 1);
    r->bias = b;
    r->reparam = TRUE;
    add_rule(rules, r);
  }
  for (int rank = 3; rank <= 4; rank++) {
    int perms[24][4];
    int np = all_perms(rank, perms);
    for (int i = 0; i < np; i++)
      for (int j = 0; j < np; j++) {
        const int *p = perms[i], *q = perms[j];
        if (perm_is_identity(p, rank) || perm_is_identity(q, rank))
          continue;
        /* The two ways of composing them; the verifier keeps the right one. */
        int c[2][4];
        for (int d = 0; d < rank; d++) {
          c[0][d] = p[q[d]];
          c[1][d] = q[p[d]];
        }
        int n_cand = memcmp(c[0], c[1], sizeof(int) * (size_t)rank) ? 2 : 1;
        for (int k = 0; k < n_cand; k++) {
          gboolean none = perm_is_identity(c[k], rank);
          SubstRule *r = rule_new(SUBST_TRANSPOSE_PAIR, SIM_OP_TRANSPOSE, 2, none ? 0 : 1);
          r->n = rank;
          memcpy(r->p, p, sizeof r->p);
          memcpy(r->q, q, sizeof r->q);
          memcpy(r->r, c[k], sizeof r->r);
          add_rule(rules, r);
        }
      }
  }
  for (int rank = 3; rank <= 4; rank++)
    for (int t = 0; t < 2; t++)
      for (int c = 0; c < 2; c++) {
        SubstRule *r = rule_new(SUBST_FOLD_TRANSPOSE, SIM_OP_MATMUL, 2, 1);
        r->n = rank;
        r->kind = t;
        r->target = c;
        add_rule(rules, r);
      }
  /* Elementwise chains. */
  for (int k1 = SIM_UNARY_IDENTITY + 1; k1 < SIM_UNARY_COUNT; k1++)
    for (int k2 = SIM_UNARY_IDENTITY + 1; k2 < SIM_UNARY_COUNT; k2++)
      for (int c = 0; c < (k1 == k2 ? 1 : 2); c++) {
        SubstRule *r = rule_new(SUBST_UNARY_PAIR, SIM_OP_UNARY, 2, 1);
        r->kind = k1;
        r->kind2 = k2;
        r->target = c == 0 ? k1 : k2;
        add_rule(rules, r);
      }
}

/* ---------------------------------------------------------------------------------- */
/* Source patterns: small graphs the rules are checked on                              */

/* A unary op of @kind; scale by 0.5 (a scale that a fused activation cannot carry). */
static int add_unary(SimGraph *g, const char *name, int x, int kind)
{
  if (kind != SIM_UNARY_SCALE)
    return sim_graph_unary(g, name, x, (SimUnaryKind)kind);
  g_autoptr(SimAttrs) a = sim_attrs_new(SIM_OP_UNARY);
  sim_attrs_set_string(a, "kind", "scale", NULL);
  sim_attrs_set_float(a, "scale", 0.5, NULL);
  int id = sim_graph_add_op(g, SIM_OP_UNARY, name, 1, &x, a, NULL);
  return id >= 0 ? sim_graph_op_output(g, id, 0) : -1;
}

static int dense_op(SimGraph *g, const char *name, SimOpType type, int x, int64_t width,
                    int bias, int act)
{
  if (type == SIM_OP_LINEAR)
    return sim_graph_linear(g, name, x, width, bias, (SimUnaryKind)act);
  SimConvParams p = sim_conv_params(width, 3, 3);
  p.padding[0] = p.padding[1] = 1;
  p.bias = bias;
  p.activation = (SimUnaryKind)act;
  return sim_graph_conv2d(g, name, x, &p);
}

static int dense_input(SimGraph *g, const char *name, SimOpType type)
{
  static const int64_t lin[] = { 2, 3, 6 }, conv[] = { 2, 3, 5, 5 }, bn[] = { 2, 4, 3, 3 };
  if (type == SIM_OP_LINEAR)
    return sim_graph_input(g, name, SIM_DTYPE_FP32, 3, lin);
  if (type == SIM_OP_CONV2D)
    return sim_graph_input(g, name, SIM_DTYPE_FP32, 4, conv);
  return sim_graph_input(g, name, SIM_DTYPE_FP32, 4, bn);
}

/* Builds rule @r's source pattern and the name of the rewrite that applies the rule to it. */
static SimGraph *source_pattern(const SubstRule *r, char **rewrite)
{
  SimGraph *g = sim_graph_new("pattern");
  SimOpType type = (SimOpType)r->type;
  switch (r->family) {
  case SUBST_FUSE_ACTIVATION: {
    int x = dense_input(g, "x", type);
    int y = type == SIM_OP_BATCHNORM ? sim_graph_batchnorm(g, "op", x, FALSE)
                                     : dense_op(g, "op", type, x, 4, 1, SIM_UNARY_IDENTITY);
    add_unary(g, "act", y, r->kind);
    *rewrite = g_strdup("fuse-activation:op");
    break;
  }
  case SUBST_MERGE:
  case SUBST_MERGE_CONCAT: {
    int x = dense_input(g, "x", type);
    int outs[SUBST_MAX_OPS];
    GString *names = g_string_new(NULL);
    for (int i = 0; i < r->n; i++) {
      g_autofree char *name = g_strdup_printf("b%d", i);
      outs[i] = dense_op(g, name, type, x, 2 + i, r->bias,
                         r->family == SUBST_MERGE ? r->kind : SIM_UNARY_IDENTITY);
      g_string_append_printf(names, "%s%s", i ? "," : "", name);
    }
    if (r->family == SUBST_MERGE) {
      *rewrite = g_strdup_printf("%s:%s", type == SIM_OP_LINEAR ? "merge-linears" : "merge-convs",
                                 names->str);
    } else {
      sim_graph_concat(g, "cat", type == SIM_OP_LINEAR ? 2 : 1, r->n, outs);
      *rewrite = g_strdup("merge-concat:cat");
    }
    g_string_free(names, TRUE);
    break;
  }
  case SUBST_DISTRIBUTE: {
    static const int64_t dx[] = { 2, 3, 6 }, dy[] = { 2, 3, 4 };
    int x = sim_graph_input(g, "x", SIM_DTYPE_FP32, 3, dx);
    int y = sim_graph_input(g, "y", SIM_DTYPE_FP32, 3, dy);
    int a = sim_graph_linear(g, "la", x, 5, r->bias, SIM_UNARY_IDENTITY);
    int b = sim_graph_linear(g, "lb", y, 5, r->bias, SIM_UNARY_IDENTITY);
    sim_graph_binary(g, "sum", a, b, (SimBinaryKind)r->kind);
    *rewrite = g_strdup("distribute-linear:sum");
    break;
  }
  case SUBST_SPLIT_LINEAR: {
    int parts[SPLIT_MAX];
    for (int i = 0; i < r->n; i++) {
      int64_t dims[3] = { 2, 3, 2 + i % 3 };
      g_autofree char *name = g_strdup_printf("x%d", i);
      parts[i] = sim_graph_input(g, name, SIM_DTYPE_FP32, 3, dims);
    }
    int c = sim_graph_concat(g, "cat", 2, r->n, parts);
    sim_graph_linear(g, "fc", c, 5, r->bias, (SimUnaryKind)r->kind);
    *rewrite = g_strdup("split-linear:fc");
    break;
  }
  case SUBST_COLLAPSE: {
    int x = dense_input(g, "x", SIM_OP_LINEAR);
    int a = sim_graph_linear(g, "la", x, 4, r->bias, SIM_UNARY_IDENTITY);
    sim_graph_linear(g, "lb", a, 5, r->bias, SIM_UNARY_IDENTITY);
    *rewrite = g_strdup("collapse-linears:lb");
    break;
  }
  case SUBST_TRANSPOSE_PAIR: {
    static const int64_t dims[] = { 2, 3, 4, 5 };
    int x = sim_graph_input(g, "x", SIM_DTYPE_FP32, r->n, dims);
    int a = sim_graph_transpose(g, "t1", x, r->p);
    sim_graph_transpose(g, "t2", a, r->q);
    *rewrite = g_strdup("transpose-pair:t2");
    break;
  }
  case SUBST_FOLD_TRANSPOSE: {
    /* a [.., 3, 4]; b as matmul wants it is [.., 4, 5], or [.., 5, 4] with trans_b. */
    int64_t da[4] = { 2, 2, 3, 4 }, db[4] = { 2, 2, 4, 5 };
    if (r->kind)
      db[3] = 4, db[2] = 5;
    int off = 4 - r->n;
    int a = sim_graph_input(g, "a", SIM_DTYPE_FP32, r->n, da + off);
    /* The transpose's input has b's last two axes swapped. */
    int64_t dsrc[4];
    memcpy(dsrc, db, sizeof db);
    dsrc[2] = db[3];
    dsrc[3] = db[2];
    int b = sim_graph_input(g, "b", SIM_DTYPE_FP32, r->n, dsrc + off);
    int perm[4];
    for (int d = 0; d < r->n; d++)
      perm[d] = d;
    perm[r->n - 2] = r->n - 1;
    perm[r->n - 1] = r->n - 2;
    int t = sim_graph_transpose(g, "t", b, perm);
    sim_graph_matmul(g, "mm", a, t, r->kind);
    *rewrite = g_strdup("fold-transpose:mm");
    break;
  }
  case SUBST_UNARY_PAIR: {
    int x = dense_input(g, "x", SIM_OP_LINEAR);
    int a = add_unary(g, "u1", x, r->kind);
    add_unary(g, "u2", a, r->kind2);
    *rewrite = g_strdup("unary-pair:u2");
    break;
  }
  default:
    *rewrite = g_strdup("");
  }
  return g;
}

/* ---------------------------------------------------------------------------------- */
/* Running a graph forwards with the CPU executor                                      */

typedef struct {
  ExecBackend *b;
  GPtrArray *buffers;       /* ExecBuffer*, freed with the run                          */
} Fwd;

static gboolean view_new(Fwd *f, const SimShape *s, SimDType dt, ExecView *v, GError **error)
{
  SimRegion r = sim_region_full(s);
  size_t es = dt == SIM_DTYPE_INT64 ? 8 : 4;
  ExecBuffer *buf =
    exec_backend_buffer_alloc(f->b, 0, (size_t)MAX(sim_shape_numel(s), 1) * es, error);
  if (!buf)
    return FALSE;
  g_ptr_array_add(f->buffers, buf);
  *v = exec_view_dense(buf, dt, &r);
  return TRUE;
}

/* The source pattern's weight @i of the op named @name: uniform in [-1, 1). */
static void gen_weight(const char *name, int i, int64_t n, float *out)
{
  g_autofree char *key = g_strdup_printf("%s#%d", name, i);
  for (int64_t k = 0; k < n; k++)
    out[k] = (float)(2 * exec_hash_uniform(key, (uint64_t)k, 7) - 1);
}

typedef struct {
  const SubstRule *rule;
  const SimGraph *src;
} WeightMap;

/* Concatenates @n row-major tensors of shapes @shapes along @axis into @out. */
static void concat_along(int n, float **parts, const SimShape *shapes, int axis, float *out)
{
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; d++)
    outer *= shapes[0].dims[d];
  for (int d = axis + 1; d < shapes[0].ndim; d++)
    inner *= shapes[0].dims[d];
  int64_t pos = 0;
  for (int64_t o = 0; o < outer; o++)
    for (int i = 0; i < n; i++) {
      int64_t chunk = shapes[i].dims[axis] * inner;
      memcpy(out + pos, parts[i] + o * chunk, sizeof(float) * (size_t)chunk);
      pos += chunk;
    }
}

static gboolean no_mapping(const char *name, GError **error)
{
  g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
              "no weights of the source pattern map to operator '%s'", name);
  return FALSE;
}

/* The weight @i of op @op of the rewritten pattern @g, from the source pattern's. */
static gboolean map_weight(const WeightMap *wm, const SimGraph *g, int op, int i, float *out,
                           GError **error)
{
  const char *name = sim_graph_op_name(g, op);
  SimShape s = sim_graph_op_weight_shape(g, op, i);
  int64_t n = sim_shape_numel(&s);
  int same = sim_graph_op_by_name(wm->src, name);
  if (same >= 0 && sim_graph_op_type(wm->src, same) == sim_graph_op_type(g, op) &&
      i < sim_graph_op_n_weights(wm->src, same)) {
    SimShape t = sim_graph_op_weight_shape(wm->src, same, i);
    if (sim_shape_numel(&t) == n) {
      gen_weight(name, i, n, out);
      return TRUE;
    }
  }
  /* A fused attention "SM.attention": Wq, Wk, Wv, Wo, then their biases, from the four
   * linears around softmax SM. */
  if (sim_graph_op_type(g, op) == SIM_OP_ATTENTION && g_str_has_suffix(name, ".attention")) {
    g_autofree char *sm_name = g_strndup(name, strlen(name) - strlen(".attention"));
    int sm = sim_graph_op_by_name(wm->src, sm_name), lin[4];
    if (sm < 0 || !subst_attention_linears(wm->src, sm, lin))
      return no_mapping(name, error);
    gen_weight(sim_graph_op_name(wm->src, lin[i % 4]), i / 4, n, out);
    return TRUE;
  }
  /* Part k of a split linear "L.partK": rows of W_L, the bias with part 0. */
  const char *dot = strrchr(name, '.');
  if (dot && g_str_has_prefix(dot, ".part")) {
    g_autofree char *whole = g_strndup(name, (gsize)(dot - name));
    int src = sim_graph_op_by_name(wm->src, whole);
    int k = atoi(dot + 5);
    if (src < 0)
      return no_mapping(name, error);
    SimShape ws = sim_graph_op_weight_shape(wm->src, src, i);
    g_autofree float *full = g_new(float, MAX(sim_shape_numel(&ws), 1));
    gen_weight(whole, i, sim_shape_numel(&ws), full);
    if (i == 1) {
      memcpy(out, full, sizeof(float) * (size_t)n);
      return TRUE;
    }
    int64_t row = 0;
    for (int j = 0; j < k; j++) {
      g_autofree char *pn = g_strdup_printf("%s.part%d", whole, j);
      int pj = sim_graph_op_by_name(g, pn);
      if (pj < 0)
        return no_mapping(name, error);
      row += sim_graph_op_weight_shape(g, pj, 0).dims[0];
    }
    if (wm->rule && wm->rule->wrong_map)
      row = ws.dims[0] - row - s.dims[0];
    memcpy(out, full + row * ws.dims[1], sizeof(float) * (size_t)n);
    return TRUE;
  }
  /* A collapsed chain "A*B": W = W_A W_B, b = b_A W_B + b_B. */
  const char *star = strchr(name, '*');
  if (star) {
    g_autofree char *na = g_strndup(name, (gsize)(star - name));
    int a = sim_graph_op_by_name(wm->src, na), b = sim_graph_op_by_name(wm->src, star + 1);
    if (a < 0 || b < 0)
      return no_mapping(name, error);
    SimShape wa = sim_graph_op_weight_shape(wm->src, a, 0);
    SimShape wb = sim_graph_op_weight_shape(wm->src, b, 0);
    int64_t in = wa.dims[0], mid = wa.dims[1], o = wb.dims[1];
    g_autofree float *A = g_new(float, in * mid);
    g_autofree float *B = g_new(float, mid * o);
    gen_weight(na, 0, in * mid, A);
    gen_weight(star + 1, 0, mid * o, B);
    if (i == 0) {
      for (int64_t r = 0; r < in; r++)
        for (int64_t c = 0; c < o; c++) {
          double acc = 0;
          for (int64_t k = 0; k < mid; k++)
            acc += (double)A[r * mid + k] * B[k * o + c];
          out[r * o + c] = (float)acc;
        }
    } else {
      g_autofree float *ba = g_new(float, mid);
      g_autofree float *bb = g_new(float, o);
      gen_weight(na, 1, mid, ba);
      gen_weight(star + 1, 1, o, bb);
      for (int64_t c = 0; c < o; c++) {
        double acc = bb[c];
        for (int64_t k = 0; k < mid; k++)
          acc += (double)ba[k] * B[k * o + c];
        out[c] = (float)acc;
      }
    }
    return TRUE;
  }
  /* Merged or stacked "A+B+..": concatenated along the axis where the shapes differ, or
   * summed where they are all the rewritten op's (the biases of a distributed product). */
  g_auto(GStrv) parts = g_strsplit(name, "+", -1);
  int np = (int)g_strv_length(parts);
  if (np < 2 || np > SUBST_MAX_OPS)
    return no_mapping(name, error);
  float *vals[SUBST_MAX_OPS];
  SimShape shapes[SUBST_MAX_OPS];
  int axis = -1;
  for (int k = 0; k < np; k++) {
    int idx = wm->rule && wm->rule->wrong_map ? np - 1 - k : k;
    int src = sim_graph_op_by_name(wm->src, parts[idx]);
    if (src < 0 || i >= sim_graph_op_n_weights(wm->src, src)) {
      for (int j = 0; j < k; j++)
        g_free(vals[j]);
      return no_mapping(name, error);
    }
    shapes[k] = sim_graph_op_weight_shape(wm->src, src, i);
    vals[k] = g_new(float, MAX(sim_shape_numel(&shapes[k]), 1));
    gen_weight(parts[idx], i, sim_shape_numel(&shapes[k]), vals[k]);
    for (int d = 0; d < s.ndim && axis < 0; d++)
      if (shapes[k].dims[d] != s.dims[d])
        axis = d;
  }
  if (axis < 0) {
    for (int64_t e = 0; e < n; e++) {
      out[e] = 0;
      for (int k = 0; k < np; k++)
        out[e] += vals[k][e];
    }
  } else {
    concat_along(np, vals, shapes, axis, out);
  }
  for (int k = 0; k < np; k++)
    g_free(vals[k]);
  return TRUE;
}

/* Runs @g forwards once; returns each tensor's values (fp32; NULL for integer ones). */
static float **forward(const SimGraph *g, const WeightMap *wm, float range, GError **error)
{
  g_autoptr(ExecBackend) b = exec_backend_new("cpu", error);
  if (!b || !exec_backend_open(b, 1, error))
    return NULL;
  Fwd f = { b, g_ptr_array_new() };
  int nt = sim_graph_n_tensors(g), nops = sim_graph_n_ops(g);
  ExecView *views = g_new0(ExecView, MAX(nt, 1));
  float **vals = g_new0(float *, MAX(nt, 1));
  gboolean ok = TRUE;
  for (int op = 0; op < nops && ok; op++) {
    int n_in = sim_graph_op_n_inputs(g, op), n_out = sim_graph_op_n_outputs(g, op);
    int n_w = sim_graph_op_n_weights(g, op);
    if (sim_graph_op_type(g, op) == SIM_OP_INPUT) {
      for (int j = 0; j < n_out && ok; j++) {
        int t = sim_graph_op_output(g, op, j);
        SimShape s = sim_graph_tensor_shape(g, t);
        int64_t n = sim_shape_numel(&s);
        SimDType dt = sim_graph_tensor_dtype(g, t);
        gboolean is_int = dt == SIM_DTYPE_INT32 || dt == SIM_DTYPE_INT64;
        ok = view_new(&f, &s, is_int ? SIM_DTYPE_INT64 : SIM_DTYPE_FP32, &views[t], error);
        if (!ok)
          break;
        g_autofree void *data = g_malloc(8 * (size_t)MAX(n, 1));
        exec_input_values(g, t, 1, 11, data);
        if (!is_int) {
          float *f32 = data;
          for (int64_t k = 0; k < n; k++)
            f32[k] *= range;
          vals[t] = g_memdup2(data, 4 * (size_t)MAX(n, 1));
        }
        ok = exec_backend_buffer_write(b, 0, views[t].buffer, 0, data,
                                       (size_t)n * (is_int ? 8 : 4), error);
      }
      continue;
    }
    ExecView in[8] = { 0 }, in_grad[8] = { 0 }, w[8] = { 0 }, w_grad[8] = { 0 };
    ExecView out[8] = { 0 }, out_grad[8] = { 0 };
    if (n_in > 8 || n_w > 8 || n_out > 8) {
      g_set_error(error, EXEC_ERROR, EXEC_ERROR_UNSUPPORTED, "operator '%s' is too wide",
                  sim_graph_op_name(g, op));
      ok = FALSE;
      break;
    }
    for (int i = 0; i < n_in; i++)
      in[i] = views[sim_graph_op_input(g, op, i)];
    for (int i = 0; i < n_w && ok; i++) {
      SimShape s = sim_graph_op_weight_shape(g, op, i);
      int64_t n = sim_shape_numel(&s);
      ok = view_new(&f, &s, SIM_DTYPE_FP32, &w[i], error);
      if (!ok)
        break;
      g_autofree float *data = g_new(float, MAX(n, 1));
      ok = wm ? map_weight(wm, g, op, i, data, error)
              : (gen_weight(sim_graph_op_name(g, op), i, n, data), TRUE);
      ok = ok && exec_backend_buffer_write(b, 0, w[i].buffer, 0, data, (size_t)n * 4, error);
    }
    for (int j = 0; j < n_out && ok; j++) {
      int t = sim_graph_op_output(g, op, j);
      SimShape s = sim_graph_tensor_shape(g, t);
      ok = view_new(&f, &s, SIM_DTYPE_FP32, &views[t], error);
      out[j] = views[t];
    }
    if (!ok)
      break;
    ExecKernelArgs a = { .graph = g, .op = op, .phase = EXEC_KERNEL_FORWARD, .step = 1,
                         .batch = sim_graph_batch_size(g), .microbatches = 1,
                         .n_inputs = n_in, .in = in, .in_grad = in_grad,
                         .n_weights = n_w, .w = w, .w_grad = w_grad,
                         .n_outputs = n_out, .out = out, .out_grad = out_grad };
    gpointer saved = NULL;
    a.saved = &saved;
    for (int d = 0; d < sim_graph_op_n_dims(g, op); d++)
      a.hi[d] = sim_graph_op_dim_size(g, op, d);
    ok = exec_backend_kernel(b, 0, &a, error);
    exec_backend_saved_free(b, 0, saved);
    for (int j = 0; j < n_out && ok; j++) {
      int t = sim_graph_op_output(g, op, j);
      SimShape s = sim_graph_tensor_shape(g, t);
      int64_t n = sim_shape_numel(&s);
      vals[t] = g_new(float, MAX(n, 1));
      ok = exec_backend_buffer_read(b, 0, views[t].buffer, 0, vals[t], (size_t)n * 4, error);
    }
  }
  for (guint i = 0; i < f.buffers->len; i++)
    exec_backend_buffer_free(b, 0, g_ptr_array_index(f.buffers, i));
  g_ptr_array_unref(f.buffers);
  g_free(views);
  if (!ok) {
    for (int t = 0; t < nt; t++)
      g_free(vals[t]);
    g_free(vals);
    return NULL;
  }
  return vals;
}

static void free_values(float **vals, int n)
{
  if (!vals)
    return;
  for (int t = 0; t < n; t++)
    g_free(vals[t]);
  g_free(vals);
}

/* ---------------------------------------------------------------------------------- */
/* Verification                                                                       */

/* Applies @rewrite to @src (under @rule, if not NULL, the rule being verified), runs both
 * graphs forwards and compares every output of @src with its counterpart.  Returns the
 * verdict; @error gets the largest relative difference, @why the reason of a rejection. */
static SubstVerdict compare_rewrite(const SimGraph *src, const char *rewrite,
                                    const SubstRule *rule, double *error_out, char **why)
{
  GError *error = NULL;
  *error_out = 0;
  *why = NULL;
  g_autofree int *tmap = NULL;
  if (rule)
    g_private_set(&forced_key, (gpointer)rule);
  g_autoptr(SimGraph) dst = subst_apply(src, rewrite, &tmap, &error);
  if (rule)
    g_private_set(&forced_key, NULL);
  if (!dst) {
    *why = g_strdup(error ? error->message : "the rewrite does not apply");
    g_clear_error(&error);
    return SUBST_INEXPRESSIBLE;
  }
  int nts = sim_graph_n_tensors(src), ntd = sim_graph_n_tensors(dst);
  WeightMap wm = { rule, src };
  double worst = 0;
  int outputs = 0;
  static const float ranges[] = { 1.0f, SUBST_INPUT_RANGE };
  for (gsize ri = 0; ri < G_N_ELEMENTS(ranges) && !*why; ri++) {
    float **a = forward(src, NULL, ranges[ri], &error);
    float **b = a ? forward(dst, &wm, ranges[ri], &error) : NULL;
    if (!a || !b) {
      *why = g_strdup_printf("execution: %s", error ? error->message : "failed");
      g_clear_error(&error);
      free_values(a, nts);
      free_values(b, ntd);
      return SUBST_INEXPRESSIBLE;
    }
    for (int t = 0; t < nts && !*why; t++) {
      int p = sim_graph_tensor_producer(src, t);
      if (p < 0 || sim_graph_op_type(src, p) == SIM_OP_INPUT ||
          sim_graph_tensor_n_consumers(src, t) > 0 || !a[t])
        continue;
      int u = tmap[t];
      SimShape ss = sim_graph_tensor_shape(src, t);
      if (u < 0 || !b[u]) {
        *why = g_strdup_printf("output '%s' has no counterpart",
                               sim_graph_tensor_name(src, t));
        break;
      }
      SimShape sd = sim_graph_tensor_shape(dst, u);
      if (ss.ndim != sd.ndim || memcmp(ss.dims, sd.dims, sizeof(int64_t) * (size_t)ss.ndim)) {
        *why = g_strdup_printf("output '%s' changes shape", sim_graph_tensor_name(src, t));
        break;
      }
      int64_t n = sim_shape_numel(&ss);
      double scale = 1, diff = 0;
      for (int64_t k = 0; k < n; k++) {
        scale = MAX(scale, fabs(a[t][k]));
        double d = fabs((double)a[t][k] - b[u][k]);
        diff = isnan(d) ? INFINITY : MAX(diff, d);
      }
      worst = MAX(worst, diff / scale);
      outputs++;
    }
    free_values(a, nts);
    free_values(b, ntd);
  }
  *error_out = worst;
  if (*why)
    return SUBST_MISMATCH;
  if (outputs == 0) {
    *why = g_strdup("no output to compare");
    return SUBST_MISMATCH;
  }
  if (!(worst <= SUBST_TOLERANCE)) {
    *why = g_strdup_printf("outputs differ by %.3g (relative; tolerance %g)", worst,
                           SUBST_TOLERANCE);
    return SUBST_MISMATCH;
  }
  return SUBST_VERIFIED;
}

void subst_rule_verify(SubstRule *r)
{
  g_clear_pointer(&r->why, g_free);
  r->error = 0;
  g_autofree char *rewrite = NULL;
  g_autoptr(SimGraph) src = source_pattern(r, &rewrite);
  GError *error = NULL;
  if (!sim_graph_check(src, &error)) {
    r->verdict = SUBST_INEXPRESSIBLE;
    r->why = g_strdup_printf("source pattern: %s", error->message);
    g_error_free(error);
    return;
  }
  /* The rule itself decides the rewrite of its own pattern (the set is being built). */
  r->verdict = compare_rewrite(src, rewrite, r, &r->error, &r->why);
}

gboolean subst_check_rewrite(const SimGraph *g, const char *rewrite, double *diff,
                             GError **error)
{
  char *why = NULL;
  SubstVerdict v = compare_rewrite(g, rewrite, NULL, diff, &why);
  if (v != SUBST_VERIFIED)
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID, "rewrite '%s': %s", rewrite, why);
  g_free(why);
  return v == SUBST_VERIFIED;
}

/* ---------------------------------------------------------------------------------- */
/* The set                                                                            */

SubstSet *subst_set_build(void)
{
  gint64 t0 = g_get_monotonic_time();
  SubstSet *s = g_new0(SubstSet, 1);
  s->rules = g_ptr_array_new_with_free_func((GDestroyNotify)subst_rule_free);
  s->verified = g_hash_table_new(g_str_hash, g_str_equal);
  generate(s->rules);
  for (guint i = 0; i < s->rules->len; i++) {
    SubstRule *r = g_ptr_array_index(s->rules, i);
    s->max_ops = MAX(s->max_ops, r->src_ops);
    subst_rule_verify(r);
    switch (r->verdict) {
    case SUBST_VERIFIED:
      s->n_verified++;
      g_hash_table_insert(s->verified, r->id, r);
      break;
    case SUBST_MISMATCH:
      s->n_mismatch++;
      break;
    default:
      s->n_inexpressible++;
    }
  }
  s->seconds = (double)(g_get_monotonic_time() - t0) / 1e6;
  return s;
}

void subst_set_free(SubstSet *s)
{
  if (!s)
    return;
  g_hash_table_unref(s->verified);
  g_ptr_array_unref(s->rules);
  g_free(s);
}

static gpointer build_once(gpointer data)
{
  (void)data;
  return subst_set_build();
}

const SubstSet *subst_set_get(void)
{
  static GOnce once = G_ONCE_INIT;
  return g_once(&once, build_once, NULL);
}

/* The rule being verified, which decides the rewrite of its own pattern. */
static const SubstRule *forced_rule(void)
{
  return g_private_get(&forced_key);
}

static gboolean rule_matches(const SubstRule *r, SubstFamily family, int type, int kind,
                             int kind2, int n, int bias, const int *p, const int *q)
{
  if (r->family != family || (type >= 0 && r->type != type) || (kind >= 0 && r->kind != kind) ||
      (kind2 >= 0 && r->kind2 != kind2) || (n >= 0 && r->n != n) ||
      (bias >= 0 && r->bias != bias))
    return FALSE;
  if (p && memcmp(r->p, p, sizeof(int) * (size_t)r->n))
    return FALSE;
  if (q && memcmp(r->q, q, sizeof(int) * (size_t)r->n))
    return FALSE;
  return TRUE;
}

const SubstRule *subst_find_verified(SubstFamily family, int type, int kind, int kind2, int n,
                                     int bias, const int *p, const int *q)
{
  const SubstRule *forced = forced_rule();
  if (forced)
    return rule_matches(forced, family, type, kind, kind2, n, bias, p, q) ? forced : NULL;
  const SubstSet *s = subst_set_get();
  for (guint i = 0; i < s->rules->len; i++) {
    const SubstRule *r = g_ptr_array_index(s->rules, i);
    if (r->verdict == SUBST_VERIFIED && rule_matches(r, family, type, kind, kind2, n, bias, p, q))
      return r;
  }
  return NULL;
}

gboolean subst_rule_verified(const char *id)
{
  const SubstRule *forced = forced_rule();
  if (forced)
    return !strcmp(forced->id, id);
  return g_hash_table_contains(subst_set_get()->verified, id);
}

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
  subst_copy_flags(rb, a, id);
  subst_copy_flags(rb, b, id);
  rb->tmap[sim_graph_op_output(g, b, 0)] = sim_graph_op_output(rb->out, id, 0);
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
  subst_copy_flags(rb, a, id);
  subst_copy_flags(rb, b, id);
  rb->tmap[sim_graph_op_output(g, b, 0)] = sim_graph_op_output(rb->out, id, 0);
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
  subst_copy_flags(rb, t, id);
  subst_copy_flags(rb, mm, id);
  rb->tmap[sim_graph_op_output(g, mm, 0)] = sim_graph_op_output(rb->out, id, 0);
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

/* ---------------------------------------------------------------------------------- */
/* Describing the set                                                                  */

char *search_substitution_set_describe(gboolean rules)
{
  SubstSet *s = subst_set_build();
  GString *out = g_string_new(NULL);
  g_string_append_printf(out,
                         "substitution set: %u rules generated over patterns of up to %d "
                         "operators (concatenations of up to %d inputs), %d verified, %d "
                         "rejected (%d with different outputs, %d not expressible), in %.2f s\n",
                         s->rules->len, s->max_ops, SPLIT_MAX, s->n_verified,
                         s->n_mismatch + s->n_inexpressible, s->n_mismatch, s->n_inexpressible,
                         s->seconds);
  g_string_append_printf(out, "verification: the CPU executor on random inputs in [-1, 1) "
                              "and in [-%g, %g), weights in [-1, 1), max |a - b| <= %g max(1, "
                              "max |b|)\n\n",
                         SUBST_INPUT_RANGE, SUBST_INPUT_RANGE, SUBST_TOLERANCE);
  g_string_append_printf(out, "%-16s %-20s %9s %9s %9s %14s\n", "family", "category",
                         "generated", "verified", "mismatch", "inexpressible");
  for (int f = 0; f < SUBST_N_FAMILIES; f++) {
    int n = 0, v = 0, m = 0, x = 0;
    for (guint i = 0; i < s->rules->len; i++) {
      const SubstRule *r = g_ptr_array_index(s->rules, i);
      if ((int)r->family != f)
        continue;
      n++;
      v += r->verdict == SUBST_VERIFIED;
      m += r->verdict == SUBST_MISMATCH;
      x += r->verdict == SUBST_INEXPRESSIBLE;
    }
    g_string_append_printf(out, "%-16s %-20s %9d %9d %9d %14d%s\n", family_names[f],
                           family_categories[f], n, v, m, x,
                           f == SUBST_COLLAPSE    ? "  (changes the weights: not searched)"
                           : f == SUBST_DISTRIBUTE ? "  (with biases: not searched)"
                                                   : "");
  }
  if (rules) {
    g_string_append(out, "\n");
    for (guint i = 0; i < s->rules->len; i++) {
      const SubstRule *r = g_ptr_array_index(s->rules, i);
      g_string_append_printf(out, "%-40s %d -> %d ops  %-13s %.2g%s%s\n", r->id, r->src_ops,
                             r->dst_ops, subst_verdict_name(r->verdict), r->error,
                             r->why ? "  " : "", r->why ? r->why : "");
    }
  }
  subst_set_free(s);
  return g_string_free(out, FALSE);
}
