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
 * pattern cannot be built, are dropped and counted.  Only verified rules are applied.
 *
 * Files: this one (the rules, their source patterns, the set and its description),
 * subst-verify.c (running patterns with the CPU executor, verification) and subst-apply.c
 * (the generated families found and applied on real graphs), sharing subst-private.h. */
#include "subst-private.h"

#include "parasol-exec.h"

#include <string.h>

/* The rule being verified (per thread), which alone decides the rewrites meanwhile. */
GPrivate subst_forced_key;

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
SimGraph *subst_source_pattern(const SubstRule *r, char **rewrite)
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
  return g_private_get(&subst_forced_key);
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
