/* test-subst.c — the generated substitution set (search/subst-gen.c): its verifier accepts
 * rewrites that are right and rejects ones that are wrong, the set holds what algebra says
 * it must, and a verified rewrite applied to a zoo model keeps its parameters, its output
 * shapes and, run by the CPU executor, its outputs. */
#include "subst-private.h"

#include <criterion/criterion.h>
#include <string.h>

static SubstRule *find_rule(const SubstSet *s, const char *id)
{
  for (guint i = 0; i < s->rules->len; i++) {
    SubstRule *r = g_ptr_array_index(s->rules, i);
    if (!strcmp(r->id, id))
      return r;
  }
  cr_assert_fail("no rule '%s' in the set", id);
  return NULL;
}

static void expect_verdict(const SubstSet *s, const char *id, SubstVerdict v)
{
  const SubstRule *r = find_rule(s, id);
  cr_assert_eq(r->verdict, v, "%s: %s, expected %s (%s)", id, subst_verdict_name(r->verdict),
               subst_verdict_name(v), r->why ? r->why : "");
}

Test(subst, known_rewrites_pass_and_wrong_weight_mappings_fail)
{
  const SubstSet *s = subst_set_get();
  /* Q, K and V as one linear: right with weights concatenated in order. */
  SubstRule *merge = subst_rule_copy(find_rule(s, "merge/linear/n3/bias1/identity"));
  subst_rule_verify(merge);
  cr_assert_eq(merge->verdict, SUBST_VERIFIED, "%s", merge->why ? merge->why : "");
  cr_assert_lt(merge->error, 1e-5);
  /* The same rewrite with the weights concatenated in the wrong order. */
  merge->wrong_map = TRUE;
  subst_rule_verify(merge);
  cr_assert_eq(merge->verdict, SUBST_MISMATCH);
  cr_assert_gt(merge->error, 1e-2);
  subst_rule_free(merge);
  /* Convolutions too. */
  SubstRule *conv = subst_rule_copy(find_rule(s, "merge-concat/conv2d/n2/bias0"));
  subst_rule_verify(conv);
  cr_assert_eq(conv->verdict, SUBST_VERIFIED, "%s", conv->why ? conv->why : "");
  conv->wrong_map = TRUE;
  subst_rule_verify(conv);
  cr_assert_eq(conv->verdict, SUBST_MISMATCH);
  subst_rule_free(conv);
}

Test(subst, the_set_holds_what_algebra_says)
{
  const SubstSet *s = subst_set_get();
  cr_assert_eq(s->n_verified + s->n_mismatch + s->n_inexpressible, (int)s->rules->len);
  /* Fusing an activation is exact, fusing a scale by 0.5 is not (the fused op has no
   * factor). */
  expect_verdict(s, "fuse-activation/linear/relu", SUBST_VERIFIED);
  expect_verdict(s, "fuse-activation/conv2d/gelu", SUBST_VERIFIED);
  expect_verdict(s, "fuse-activation/batchnorm/relu", SUBST_VERIFIED);
  expect_verdict(s, "fuse-activation/linear/scale", SUBST_MISMATCH);
  /* x A + y B = [x y] [A; B]; x A - y B is not (the mapping does not negate B). */
  expect_verdict(s, "distribute/add/bias1", SUBST_VERIFIED);
  expect_verdict(s, "distribute/sub/bias0", SUBST_MISMATCH);
  expect_verdict(s, "distribute/mul/bias0", SUBST_MISMATCH);
  /* (x A + a) B + b = x (A B) + (a B + b). */
  expect_verdict(s, "collapse/bias1", SUBST_VERIFIED);
  /* Transposes by p then q are one by r[i] = p[q[i]], not q[p[i]]: with p = 102 and
   * q = 021, r = 120. */
  expect_verdict(s, "transpose-pair/3/102/021/120", SUBST_VERIFIED);
  expect_verdict(s, "transpose-pair/3/102/021/201", SUBST_MISMATCH);
  /* A transpose undone vanishes. */
  expect_verdict(s, "transpose-pair/4/1032/1032/0123", SUBST_VERIFIED);
  /* matmul(a, b^T) is matmul(a, b) with trans_b; without, the shapes do not fit. */
  expect_verdict(s, "fold-transpose/3/t0/c1", SUBST_VERIFIED);
  expect_verdict(s, "fold-transpose/3/t0/c0", SUBST_INEXPRESSIBLE);
  expect_verdict(s, "fold-transpose/4/t1/c0", SUBST_VERIFIED);
  /* relu(sigmoid(x)) = sigmoid(x); relu(relu(x)) = relu(x); sigmoid(relu(x)) is neither. */
  expect_verdict(s, "unary-pair/sigmoid/relu/sigmoid", SUBST_VERIFIED);
  expect_verdict(s, "unary-pair/sigmoid/relu/relu", SUBST_MISMATCH);
  expect_verdict(s, "unary-pair/relu/relu/relu", SUBST_VERIFIED);
  expect_verdict(s, "unary-pair/relu/sigmoid/relu", SUBST_MISMATCH);
  expect_verdict(s, "unary-pair/relu/sigmoid/sigmoid", SUBST_MISMATCH);
  /* Told apart only by inputs beyond 6 (relu6 after relu is not relu), and only by small
   * ones where large outputs dwarf the difference (exp after relu is not exp). */
  expect_verdict(s, "unary-pair/relu/relu6/relu6", SUBST_VERIFIED);
  expect_verdict(s, "unary-pair/relu/relu6/relu", SUBST_MISMATCH);
  expect_verdict(s, "unary-pair/relu/exp/exp", SUBST_MISMATCH);
}

/* Output shapes of every tensor nothing reads. */
static int output_shapes(const SimGraph *g, SimShape *out, int max)
{
  int n = 0;
  for (int t = 0; t < sim_graph_n_tensors(g); t++)
    if (sim_graph_tensor_n_consumers(g, t) == 0 && n < max &&
        sim_graph_op_type(g, sim_graph_tensor_producer(g, t)) != SIM_OP_INPUT)
      out[n++] = sim_graph_tensor_shape(g, t);
  return n;
}

static SimGraph *zoo(const char *model, const char *params)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(SimModelParams) mp = sim_model_params_new();
  cr_assert(sim_model_params_parse(mp, params, &error), "%s", error ? error->message : "");
  SimGraph *g = sim_zoo_build(model, mp, &error);
  cr_assert_not_null(g, "%s", error ? error->message : "");
  return g;
}

/* Applies every rewrite the search would propose on @g, one at a time. */
static int check_all_rewrites(SimGraph *g)
{
  g_autoptr(GPtrArray) names = search_rewrites_find(g);
  for (guint i = 0; i < names->len; i++) {
    const char *name = g_ptr_array_index(names, i);
    GError *error = NULL;
    g_autoptr(SimGraph) r = search_rewrite_apply(g, name, &error);
    cr_assert_not_null(r, "%s: %s", name, error ? error->message : "");
    cr_assert_eq(sim_graph_n_params(r), sim_graph_n_params(g), "%s changes the parameters",
                 name);
    SimShape a[8], b[8];
    int na = output_shapes(g, a, 8), nb = output_shapes(r, b, 8);
    cr_assert_eq(na, nb, "%s", name);
    for (int k = 0; k < na; k++)
      cr_assert(a[k].ndim == b[k].ndim &&
                  !memcmp(a[k].dims, b[k].dims, sizeof(int64_t) * (size_t)a[k].ndim),
                "%s changes output %d's shape", name, k);
    double diff = 0;
    cr_assert(subst_check_rewrite(g, name, &diff, &error), "%s", error ? error->message : "");
    cr_assert_leq(diff, 1e-4, "%s: %g", name, diff);
  }
  return (int)names->len;
}

/* Every rewrite the search finds on the model, and at least one of @kind. */
static void check_model(const char *model, const char *params, const char *kind)
{
  g_autoptr(SimGraph) g = zoo(model, params);
  g_auto(GStrv) names = search_rewrites_list(g);
  gboolean found = FALSE;
  for (char **it = names; *it; it++)
    found = found || g_str_has_prefix(*it, kind);
  cr_assert(found, "no %s rewrite on %s (%u others)", kind, model, g_strv_length(names));
  cr_assert_eq(check_all_rewrites(g), (int)g_strv_length(names));
}

/* Unity's MLP: the towers' last layers, added, become one linear over their inputs. */
Test(subst, mlp_towers_distribute, .timeout = 120)
{
  check_model("mlp", "batch=4,layers=2,hidden=16,input=8,classes=8", "distribute-linear:");
}

/* CANDLE-Uno: the first dense layer after the concatenation splits over the towers. */
Test(subst, candle_uno_linear_splits_over_towers, .timeout = 120)
{
  check_model("candle-uno", "batch=2,hidden=8,feature_layers=1,layers=2", "split-linear:");
}

/* ResNeXt-50: a block's first convolution and its shortcut read one tensor. */
Test(subst, resnext_convolutions_merge, .timeout = 300)
{
  check_model("resnext-50", "batch=2,image=32,classes=10", "merge-convs:");
}

/* An attention written out op by op, its scores scaled by @factor. */
static SimGraph *attention_graph(double factor)
{
  SimGraph *g = sim_graph_new("unfused-attention");
  const int64_t b = 2, s = 4, h = 2, hd = 3, d = 5;
  int64_t xs[3] = { b, s, d };
  int x = sim_graph_input(g, "x", SIM_DTYPE_FP32, 3, xs);
  int heads[3];
  const char *names[3] = { "q", "k", "v" };
  for (int i = 0; i < 3; i++) {
    int p = sim_graph_linear(g, names[i], x, h * hd, TRUE, SIM_UNARY_IDENTITY);
    int64_t shape[4] = { b, s, h, hd };
    g_autofree char *rn = g_strconcat(names[i], ".heads", NULL);
    g_autofree char *tn = g_strconcat(names[i], ".t", NULL);
    p = sim_graph_reshape(g, rn, p, 4, shape);
    int perm[4] = { 0, 2, 1, 3 };
    heads[i] = sim_graph_transpose(g, tn, p, perm);
  }
  int sc = sim_graph_matmul(g, "scores", heads[0], heads[1], TRUE);
  g_autoptr(SimAttrs) a = sim_attrs_new(SIM_OP_UNARY);
  cr_assert(sim_attrs_set_string(a, "kind", "scale", NULL));
  cr_assert(sim_attrs_set_float(a, "scale", factor, NULL));
  int scale = sim_graph_add_op(g, SIM_OP_UNARY, "scale", 1, &sc, a, NULL);
  cr_assert_geq(scale, 0);
  sc = sim_graph_softmax(g, "probs", sim_graph_op_output(g, scale, 0));
  int o = sim_graph_matmul(g, "context", sc, heads[2], FALSE);
  int perm[4] = { 0, 2, 1, 3 };
  o = sim_graph_transpose(g, "context.t", o, perm);
  int64_t back[3] = { b, s, h * hd };
  o = sim_graph_reshape(g, "context.merge", o, 3, back);
  sim_graph_linear(g, "out", o, d, TRUE, SIM_UNARY_IDENTITY);
  cr_assert(sim_graph_check(g, NULL));
  return g;
}

/* The hand-written attention fusion, checked the same way: scaled by 1/sqrt(head_dim), as
 * the attention operator scales, the op-by-op attention computes what the fused operator
 * computes; scaled otherwise, the fusion is not offered. */
Test(subst, attention_fusion_computes_the_same)
{
  g_autoptr(SimGraph) g = attention_graph(1 / sqrt(3.0));
  GError *error = NULL;
  double diff = 0;
  cr_assert(subst_check_rewrite(g, "fuse-attention:probs", &diff, &error), "%s",
            error ? error->message : "");
  cr_assert_leq(diff, 1e-4);
  g_autoptr(SimGraph) other = attention_graph(1.0);
  g_auto(GStrv) names = search_rewrites_list(other);
  for (char **it = names; *it; it++)
    cr_assert(!g_str_has_prefix(*it, "fuse-attention:"), "%s", *it);
  cr_assert_null(search_rewrite_apply(other, "fuse-attention:probs", &error));
  g_clear_error(&error);
}
