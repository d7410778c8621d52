/* test-zoo.c — the model zoo: parameters, the registry, loading, and every model's size
 * against the figure its paper or reference implementation publishes.  Each test names
 * its source.  Tied weights (the output layer of language models, the chunks of an
 * unrolled LSTM layer) are shared in the graph and count once, as they do there. */
#include <criterion/criterion.h>
#include <glib/gstdio.h>
#include <math.h>
#include <string.h>

#include "parasol-sim.h"

static SimGraph *build(const char *name, const char *params)
{
  g_autoptr(SimModelParams) p = sim_model_params_new();
  g_autoptr(GError) error = NULL;
  if (params)
    cr_assert(sim_model_params_parse(p, params, &error), "%s", error ? error->message : "");
  SimGraph *g = sim_zoo_build(name, p, &error);
  cr_assert_not_null(g, "%s: %s", name, error ? error->message : "no error");
  return g;
}

/* The error building @name with @params gives, which must exist. */
static GError *build_error(const char *name, const char *params)
{
  g_autoptr(SimModelParams) p = sim_model_params_new();
  GError *error = NULL;
  cr_assert(sim_model_params_parse(p, params, &error));
  SimGraph *g = sim_zoo_build(name, p, &error);
  cr_assert_null(g, "%s with %s built", name, params);
  cr_assert_not_null(error);
  return error;
}

static void assert_close(double got, double want, double rel, const char *what)
{
  cr_assert(fabs(got - want) <= rel * fabs(want), "%s: %.6g, expected %.6g within %.2g%%",
            what, got, want, rel * 100);
}

static int64_t op_params(const SimGraph *g, const char *op)
{
  int id = sim_graph_op_by_name(g, op);
  cr_assert(id >= 0, "no op '%s'", op);
  return sim_graph_op_n_params(g, id);
}

static int count_ops(const SimGraph *g, SimOpType type)
{
  int n = 0;
  for (int op = 0; op < sim_graph_n_ops(g); op++)
    n += sim_graph_op_type(g, op) == type;
  return n;
}

/* ---------------------------------------------------------------------------------- */
/* Parameters                                                                          */

Test(params, parse_suffixes_and_lists)
{
  g_autoptr(SimModelParams) p = sim_model_params_new();
  g_autoptr(GError) error = NULL;
  cr_assert(sim_model_params_parse(p, "batch=64", &error));
  cr_assert(sim_model_params_parse(p, "a=1k, b=2M,c=3G", &error));
  cr_assert(sim_model_params_parse(p, "d=1.5k,batch=128", &error));
  int64_t v;
  cr_assert(sim_model_params_lookup(p, "batch", &v) && v == 128, "later values win");
  cr_assert(sim_model_params_lookup(p, "a", &v) && v == 1000);
  cr_assert(sim_model_params_lookup(p, "b", &v) && v == 2000000);
  cr_assert(sim_model_params_lookup(p, "c", &v) && v == 3000000000LL);
  cr_assert(sim_model_params_lookup(p, "d", &v) && v == 1500);
  cr_assert_not(sim_model_params_lookup(p, "e", &v));
  sim_model_params_set(p, "e", 7);
  cr_assert(sim_model_params_lookup(p, "e", &v) && v == 7);
}

Test(params, malformed_text_is_invalid_and_changes_nothing)
{
  static const char *const bad[] = { "batch", "=3", "batch=abc", "batch=5x", "batch=1.2345k",
                                     "batch=64,", "a b=1", "batch=" };
  for (size_t i = 0; i < G_N_ELEMENTS(bad); i++) {
    g_autoptr(SimModelParams) p = sim_model_params_new();
    g_autoptr(GError) error = NULL;
    cr_assert_not(sim_model_params_parse(p, bad[i], &error), "'%s' parsed", bad[i]);
    cr_assert(g_error_matches(error, SIM_ERROR, SIM_ERROR_INVALID), "'%s'", bad[i]);
    cr_assert_not(sim_model_params_lookup(p, "batch", NULL), "'%s' left a value", bad[i]);
  }
}

Test(params, unknown_name_lists_the_valid_ones)
{
  g_autoptr(GError) error = build_error("resnet-50", "hidden=1024");
  cr_assert(g_error_matches(error, SIM_ERROR, SIM_ERROR_UNKNOWN));
  cr_assert(strstr(error->message, "hidden") && strstr(error->message, "batch") &&
            strstr(error->message, "image") && strstr(error->message, "classes"),
            "%s", error->message);
}

Test(params, non_positive_values_are_invalid)
{
  g_autoptr(GError) e1 = build_error("resnet-50", "batch=0");
  cr_assert(g_error_matches(e1, SIM_ERROR, SIM_ERROR_INVALID), "%s", e1->message);
  g_autoptr(GError) e2 = build_error("gpt", "layers=-2");
  cr_assert(g_error_matches(e2, SIM_ERROR, SIM_ERROR_INVALID), "%s", e2->message);
  g_autoptr(GError) e3 = build_error("gpt", "hidden=5G");
  cr_assert(g_error_matches(e3, SIM_ERROR, SIM_ERROR_INVALID), "%s", e3->message);
}

Test(params, sizes_beyond_any_model_are_refused)
{
  /* 100 M layers: the graph stops at its bound of ops (and the builder's loop with it). */
  g_autoptr(GError) e1 = build_error("gpt", "layers=100M");
  cr_assert(g_error_matches(e1, SIM_ERROR, SIM_ERROR_INVALID), "%s", e1->message);
  cr_assert(strstr(e1->message, "more than 200000 ops"), "%s", e1->message);
  /* A batch whose input tensor has more elements than bytes can be counted for. */
  g_autoptr(GError) e2 = build_error("resnet-50", "batch=2G");
  cr_assert(strstr(e2->message, "[2000000000, 3, 224, 224], more than 2^48 elements"), "%s",
            e2->message);
}

Test(params, heads_must_divide_hidden)
{
  g_autoptr(GError) error = build_error("gpt", "hidden=1000,heads=16");
  cr_assert(g_error_matches(error, SIM_ERROR, SIM_ERROR_INVALID));
  cr_assert(strstr(error->message, "hidden") && strstr(error->message, "heads"), "%s",
            error->message);
  g_autoptr(GError) e2 = build_error("bert-base", "heads=5");
  cr_assert(g_error_matches(e2, SIM_ERROR, SIM_ERROR_INVALID));
  g_autoptr(GError) e3 = build_error("rnnlm", "seq=25,chunk=10");
  cr_assert(g_error_matches(e3, SIM_ERROR, SIM_ERROR_INVALID));
}

/* ---------------------------------------------------------------------------------- */
/* The registry and loading                                                            */

Test(registry, names_descriptions_and_batch)
{
  cr_assert_geq(sim_zoo_n_models(), 28);
  g_autoptr(GHashTable) seen = g_hash_table_new(g_str_hash, g_str_equal);
  for (int i = 0; i < sim_zoo_n_models(); i++) {
    const char *name = sim_zoo_model_name(i);
    cr_assert_not_null(name);
    cr_assert(g_hash_table_add(seen, (gpointer)name), "'%s' twice", name);
    cr_assert(sim_zoo_model_description(i) && *sim_zoo_model_description(i));
    const SimModelParam *p = sim_zoo_model_params(name);
    cr_assert_not_null(p, "%s", name);
    gboolean has_batch = FALSE;
    for (; p->name; p++) {
      cr_assert_gt(p->value, 0, "%s.%s", name, p->name);
      cr_assert(p->help && *p->help);
      has_batch = has_batch || !strcmp(p->name, "batch");
    }
    cr_assert(has_batch, "%s takes no batch", name);
  }
  static const char *const required[] = {
    "mlp", "alexnet", "vgg-16", "resnet-50", "resnet-101", "resnet-152", "resnext-50",
    "resnext-101", "inception-v3", "rnntc", "rnnlm", "nmt", "gnmt", "bert-base", "bert-large", "gpt", "gpt2-1.5b",
    "gpt3-1.3b", "gpt3-175b", "megatron-1.7b", "megatron-1t", "dlrm", "xdl", "candle-uno",
    "transformer",
  };
  for (size_t i = 0; i < G_N_ELEMENTS(required); i++)
    cr_assert(g_hash_table_contains(seen, required[i]), "no %s", required[i]);
  cr_assert_null(sim_zoo_model_params("no-such-model"));
}

/* Every model builds with its defaults, has the default batch, weights and work; a
 * different batch changes the batch and the FLOPs in proportion, not the weights. */
Test(registry, every_model_builds_and_scales_with_batch)
{
  for (int i = 0; i < sim_zoo_n_models(); i++) {
    const char *name = sim_zoo_model_name(i);
    int64_t batch = 0;
    for (const SimModelParam *p = sim_zoo_model_params(name); p->name; p++)
      if (!strcmp(p->name, "batch"))
        batch = p->value;
    g_autoptr(SimGraph) g = build(name, NULL);
    cr_assert_str_eq(sim_graph_get_name(g), name);
    cr_assert_eq(sim_graph_batch_size(g), batch, "%s", name);
    cr_assert_gt(sim_graph_n_params(g), 0, "%s", name);
    cr_assert_gt(sim_graph_forward_flops(g), 0, "%s", name);
    cr_assert_gt(sim_graph_backward_flops(g), sim_graph_forward_flops(g), "%s", name);

    g_autofree char *twice = g_strdup_printf("batch=%" G_GINT64_FORMAT, 2 * batch);
    g_autoptr(SimGraph) g2 = build(name, twice);
    cr_assert_eq(sim_graph_batch_size(g2), 2 * batch, "%s", name);
    cr_assert_eq(sim_graph_n_params(g2), sim_graph_n_params(g), "%s", name);
    assert_close(sim_graph_forward_flops(g2), 2 * sim_graph_forward_flops(g), 1e-9, name);
  }
}

Test(registry, unknown_model)
{
  g_autoptr(GError) error = NULL;
  cr_assert_null(sim_model_load("no-such-model", NULL, &error));
  cr_assert(g_error_matches(error, SIM_ERROR, SIM_ERROR_UNKNOWN));
  cr_assert_str_eq(error->message, "unknown model 'no-such-model'; 'parasol models' lists them");

  g_autoptr(GError) e2 = NULL;
  cr_assert_null(sim_zoo_build("no-such-model", NULL, &e2));
  cr_assert(g_error_matches(e2, SIM_ERROR, SIM_ERROR_UNKNOWN));

  g_autoptr(GError) e3 = NULL;
  cr_assert_null(sim_model_load("ResNet50", NULL, &e3));
  cr_assert(g_error_matches(e3, SIM_ERROR, SIM_ERROR_UNKNOWN));
  cr_assert(strstr(e3->message, "did you mean 'resnet-50'"), "%s", e3->message);
}

Test(registry, load_by_name_and_from_a_graph_file)
{
  g_autoptr(SimModelParams) p = sim_model_params_new();
  cr_assert(sim_model_params_parse(p, "layers=2,batch=4", NULL));
  g_autoptr(GError) error = NULL;
  g_autoptr(SimGraph) g = sim_model_load("gpt", p, &error);
  cr_assert_not_null(g, "%s", error ? error->message : "");
  cr_assert_eq(sim_graph_batch_size(g), 4);
  /* In the program's default precision (fp16), where the builder gives fp32. */
  g_autoptr(SimGraph) raw = sim_zoo_build("gpt", p, &error);
  cr_assert_not_null(raw);
  int w = sim_graph_op_output(g, sim_graph_op_by_name(g, "layer0.ln1"), 0);
  cr_expect_eq(sim_graph_tensor_dtype(g, w), SIM_DTYPE_FP16);
  cr_expect_eq(sim_graph_tensor_dtype(raw, w), SIM_DTYPE_FP32);

  g_autofree char *dir = g_dir_make_tmp("parasol-zoo-XXXXXX", NULL);
  g_autofree char *path = g_build_filename(dir, "gpt.json", NULL);
  cr_assert(sim_graph_save(g, path, &error), "%s", error ? error->message : "");
  g_autoptr(SimGraph) back = sim_model_load(path, NULL, &error);
  cr_assert_not_null(back, "%s", error ? error->message : "");
  cr_assert_eq(sim_graph_n_ops(back), sim_graph_n_ops(g));
  cr_assert_eq(sim_graph_n_params(back), sim_graph_n_params(g));

  /* A graph file takes the batch, not the zoo's other parameters. */
  cr_assert_null(sim_model_load(path, p, &error));
  cr_assert(g_error_matches(error, SIM_ERROR, SIM_ERROR_INVALID));
  cr_assert(strstr(error->message, "takes only --param batch=N"), "%s", error->message);
  g_clear_error(&error);
  g_autoptr(SimModelParams) b = sim_model_params_new();
  cr_assert(sim_model_params_parse(b, "batch=12", NULL));
  g_autoptr(SimGraph) twelve = sim_model_load(path, b, &error);
  cr_assert_not_null(twelve, "%s", error ? error->message : "");
  cr_assert_eq(sim_graph_batch_size(twelve), 12);

  /* A path that does not exist is reported as a file, not as an unknown model. */
  g_autofree char *missing = g_build_filename(dir, "missing.json", NULL);
  cr_assert_null(sim_model_load(missing, NULL, &error));
  cr_assert(error && !g_error_matches(error, SIM_ERROR, SIM_ERROR_UNKNOWN));
  g_unlink(path);
  g_rmdir(dir);
}

/* Every zoo model written as a graph file reads back to the same model: the same text
 * when written again (every op, attribute, tensor name and flag), the same shapes,
 * parameters and FLOPs, and the same simulated iteration under data parallelism over
 * one DGX A100.  Read with --param batch=2B it is the zoo's model built with batch 2B. */
Test(registry, every_model_round_trips_through_a_graph_file)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(SimMachine) m = sim_machine_load("dgx-a100", &error);
  cr_assert_not_null(m, "%s", error ? error->message : "");
  SimRooflineParams rp = sim_roofline_params_default();
  g_autoptr(SimCostModel) cost = sim_cost_model_new_roofline(&rp);
  SimOptions o = sim_options_default();
  int checked = 0;
  for (int i = 0; i < sim_zoo_n_models(); i++) {
    const char *name = sim_zoo_model_name(i);
    g_autoptr(SimGraph) g = build(name, NULL);
    g_autofree char *text = sim_graph_to_json(g);
    g_autoptr(SimGraph) back = sim_graph_from_json(text, name, &error);
    cr_assert_not_null(back, "%s: %s", name, error ? error->message : "");
    g_autofree char *again = sim_graph_to_json(back);
    cr_assert_str_eq(again, text, "%s", name);
    cr_assert_eq(sim_graph_n_ops(back), sim_graph_n_ops(g), "%s", name);
    cr_assert_eq(sim_graph_n_tensors(back), sim_graph_n_tensors(g), "%s", name);
    for (int t = 0; t < sim_graph_n_tensors(g); t++) {
      SimShape a = sim_graph_tensor_shape(g, t), c = sim_graph_tensor_shape(back, t);
      cr_assert(a.ndim == c.ndim && !memcmp(a.dims, c.dims, sizeof a.dims[0] * a.ndim),
                "%s: tensor %d", name, t);
    }
    cr_assert_eq(sim_graph_n_params(back), sim_graph_n_params(g), "%s", name);
    cr_assert_eq(sim_graph_forward_flops(back), sim_graph_forward_flops(g), "%s", name);
    cr_assert_eq(sim_graph_tokens_per_sample(back), sim_graph_tokens_per_sample(g), "%s", name);

    int64_t batch = sim_graph_batch_size(g);
    g_autoptr(SimStrategy) s1 = sim_strategy_data_parallel(g, m, 8, &error);
    cr_assert_not_null(s1, "%s: %s", name, error ? error->message : "");
    g_autoptr(SimStrategy) s2 = sim_strategy_data_parallel(back, m, 8, &error);
    cr_assert_not_null(s2, "%s: %s", name, error ? error->message : "");
    g_autoptr(SimReport) r1 = sim_simulate(g, m, s1, cost, &o, &error);
    cr_assert_not_null(r1, "%s: %s", name, error ? error->message : "");
    g_autoptr(SimReport) r2 = sim_simulate(back, m, s2, cost, &o, &error);
    cr_assert_not_null(r2, "%s: %s", name, error ? error->message : "");
    cr_assert_gt(sim_report_iteration_time(r1), 0, "%s", name);
    cr_assert_eq(sim_report_iteration_time(r2), sim_report_iteration_time(r1), "%s", name);

    g_autofree char *twice = g_strdup_printf("batch=%" G_GINT64_FORMAT, 2 * batch);
    g_autoptr(SimGraph) zoo2 = build(name, twice);
    g_autoptr(SimGraph) file2 = sim_graph_from_json_with_batch(text, name, 2 * batch, &error);
    cr_assert_not_null(file2, "%s: %s", name, error ? error->message : "");
    g_autofree char *want2 = sim_graph_to_json(zoo2);
    g_autofree char *got2 = sim_graph_to_json(file2);
    cr_assert_str_eq(got2, want2, "%s at batch %" G_GINT64_FORMAT, name, 2 * batch);
    checked++;
  }
  cr_assert_eq(checked, sim_zoo_n_models());
  cr_log_info("%d zoo models round-trip", checked);
}

/* Layer ends where the graph marks none: the cuts one tensor crosses.  In ResNet-50 the
 * shortcut crosses every cut inside a bottleneck, so the blocks stay whole; the ReLU
 * after each residual add ends a block, except the last block's, which the weightless
 * pooling and flatten after it join to the head (sim/layers.c). */
Test(layers, resnet50_is_cut_between_its_blocks)
{
  g_autoptr(SimGraph) g = build("resnet-50", "batch=8");
  int ends[512];
  cr_assert_lt(sim_graph_n_ops(g), 512);
  int n = sim_graph_layer_ends(g, ends);
  g_autoptr(GPtrArray) want = g_ptr_array_new_with_free_func(g_free);
  g_ptr_array_add(want, g_strdup("conv1"));
  g_ptr_array_add(want, g_strdup("maxpool"));
  static const int blocks[] = { 3, 4, 6, 3 };
  for (int s = 0; s < 4; s++)
    for (int b = 0; b < blocks[s]; b++)
      if (!(s == 3 && b == blocks[s] - 1))
        g_ptr_array_add(want, g_strdup_printf("layer%d.%d.relu", s + 1, b));
  g_ptr_array_add(want, g_strdup("flatten"));
  g_ptr_array_add(want, g_strdup("fc"));
  cr_assert_eq(n, (int)want->len, "%d layer ends", n);
  for (int i = 0; i < n; i++)
    cr_expect_str_eq(sim_graph_op_name(g, ends[i]), want->pdata[i], "layer end %d", i);
}

/* A chain with a residual: x -> l1 -> l2, add = l1 + l2, relu, l3.  After l1 only l1 is
 * live (a cut); after l2 both l1 and l2 (none); after the add one tensor, but the
 * weightless ReLU joins the layer before it; after the ReLU one (a cut); l3 is last.
 * Checkpoint marks, where there are any, are the layer ends as they stand. */
Test(layers, single_tensor_cuts_and_marks)
{
  g_autoptr(SimGraph) g = sim_graph_new("residual");
  int64_t dims[] = { 8, 16 };
  int x = sim_graph_input(g, "x", SIM_DTYPE_FP32, 2, dims);
  int l1 = sim_graph_linear(g, "l1", x, 16, TRUE, SIM_UNARY_IDENTITY);
  int l2 = sim_graph_linear(g, "l2", l1, 16, TRUE, SIM_UNARY_IDENTITY);
  int add = sim_graph_binary(g, "add", l1, l2, SIM_BINARY_ADD);
  int relu = sim_graph_unary(g, "relu", add, SIM_UNARY_RELU);
  sim_graph_linear(g, "l3", relu, 4, TRUE, SIM_UNARY_IDENTITY);
  g_autoptr(GError) error = NULL;
  cr_assert(sim_graph_check(g, &error), "%s", error ? error->message : "");
  int ends[8];
  int n = sim_graph_layer_ends(g, ends);
  cr_assert_eq(n, 2);
  cr_expect_str_eq(sim_graph_op_name(g, ends[0]), "l1");
  cr_expect_str_eq(sim_graph_op_name(g, ends[1]), "relu");
  cr_expect_eq(sim_graph_layer_ends(g, NULL), 2);

  sim_graph_set_checkpoint(g, sim_graph_op_by_name(g, "l2"), TRUE);
  n = sim_graph_layer_ends(g, ends);
  cr_assert_eq(n, 1);
  cr_expect_str_eq(sim_graph_op_name(g, ends[0]), "l2");
}

/* ---------------------------------------------------------------------------------- */
/* CNNs: torchvision's parameter counts (torchvision.models weights tables, "num_params")
 * and GMACs per 224x224 image ("GFLOPS" there counts multiply-accumulates of the
 * convolutions and linear layers).  Forward FLOPs are 2 per MAC plus the element-wise
 * work of normalization, activations and pooling, which adds about 1%. */

static void check_cnn(const char *name, int64_t params, double gmacs, double rel)
{
  g_autoptr(SimGraph) g = build(name, "batch=8");
  cr_assert_eq(sim_graph_n_params(g), params, "%s: %" G_GINT64_FORMAT " params", name,
               sim_graph_n_params(g));
  assert_close(sim_graph_forward_flops(g), 2 * gmacs * 1e9 * 8, rel, name);
}

Test(cnn, alexnet) { check_cnn("alexnet", 61100840, 0.714, 0.03); }
Test(cnn, vgg16) { check_cnn("vgg-16", 138357544, 15.47, 0.03); }
Test(cnn, resnet50) { check_cnn("resnet-50", 25557032, 4.09, 0.03); }
Test(cnn, resnet101) { check_cnn("resnet-101", 44549160, 7.80, 0.03); }
Test(cnn, resnet152) { check_cnn("resnet-152", 60192808, 11.51, 0.03); }
/* Xie et al. 2017 table 1 gives 25.0 M and 4.2 GFLOPs (MACs); torchvision 4.23. */
Test(cnn, resnext50) { check_cnn("resnext-50", 25028904, 4.23, 0.03); }
/* NVIDIA's ResNeXt101-32x4d (DeepLearningExamples) and torchvision's: 44.18 M parameters,
 * 8.0 GMACs per 224x224 image (Xie et al. 2017 table 5 give 7.8 G for the 32x4d ResNeXt-101
 * without counting the classifier). */
Test(cnn, resnext101) { check_cnn("resnext-101", 44177704, 8.0, 0.03); }
/* torchvision's inception_v3 has 27,161,264 parameters with the auxiliary classifier,
 * whose 3,326,696 (conv 768->128 1x1 + BN, conv 128->768 5x5 + BN, fc 768->1000) this
 * graph leaves out; 5.71 GMACs at 299x299, measured without it. */
Test(cnn, inception_v3) { check_cnn("inception-v3", 27161264 - 3326696, 5.71, 0.03); }

Test(cnn, structure)
{
  g_autoptr(SimGraph) g = build("resnet-50", NULL);
  /* 1 stem + 16 bottlenecks x 3 + 4 downsampling shortcuts. */
  cr_assert_eq(count_ops(g, SIM_OP_CONV2D), 53);
  cr_assert_eq(count_ops(g, SIM_OP_BATCHNORM), 53);
  cr_assert_geq(sim_graph_op_by_name(g, "layer4.2.conv3"), 0);
  SimShape s = sim_graph_tensor_shape(g, sim_graph_op_output(g, sim_graph_op_by_name(g, "fc"), 0));
  cr_assert(s.ndim == 2 && s.dims[0] == 64 && s.dims[1] == 1000);

  g_autoptr(SimGraph) small = build("resnet-50", "image=112,classes=10");
  /* fc: 2048 x 10 + 10 instead of 2048 x 1000 + 1000. */
  cr_assert_eq(sim_graph_n_params(small), 25557032 - 2049000 + 20490);
}

/* ---------------------------------------------------------------------------------- */
/* GPT: Narayanan et al. SC'21 eq. 2 counts the parameters of a GPT with l layers,
 * hidden size h, vocabulary V and sequence length s as
 *   P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)) = 12 l h^2 + 13 l h + (V + s) h,
 * the word embedding counted once (tied with the output layer) and the final layer
 * norm (2h) left out.  The graph ties lm_head to the embedding and has the final layer
 * norm, so: graph = P + 2h, exactly. */

/* The formula expanded, in integers so that the graph's count can be compared exactly;
 * the factored form as printed agrees to rounding. */
static int64_t narayanan_params(int64_t l, int64_t h, int64_t V, int64_t s)
{
  int64_t p = 12 * l * h * h + 13 * l * h + (V + s) * h;
  double printed = 12.0 * l * h * h * (1 + 13.0 / (12 * h) + (double)(V + s) / (12.0 * l * h));
  cr_assert(fabs(printed - (double)p) <= 1e-12 * (double)p);
  return p;
}

static int64_t gpt_unique_params(const SimGraph *g)
{
  return sim_graph_n_params(g);
}

static void check_gpt(const char *name, int l, int h, int V, int s, double published,
                      double rel)
{
  g_autoptr(SimGraph) g = build(name, "batch=1");
  int head = sim_graph_op_by_name(g, "lm_head"), embed = sim_graph_op_by_name(g, "embed");
  cr_assert_eq(sim_graph_op_weight_owner(g, head), embed, "%s: lm_head is tied", name);
  cr_assert_eq(op_params(g, "lm_head"), 0, "%s: the tied table counts at the embedding", name);
  cr_assert_eq(op_params(g, "embed"), (int64_t)V * h, "%s: the table is [V, h]", name);
  int64_t expect = narayanan_params(l, h, V, s) + 2 * h;
  cr_assert_eq(gpt_unique_params(g), expect, "%s: %" G_GINT64_FORMAT ", expected %"
               G_GINT64_FORMAT, name, gpt_unique_params(g), expect);
  assert_close((double)gpt_unique_params(g), published, rel, name);
}

/* GPT-2 XL: 1,557,611,200 parameters (Hugging Face gpt2-xl), "1.5B" in Radford et al. */
Test(gpt, gpt2_1_5b) { check_gpt("gpt2-1.5b", 48, 1600, 50257, 1024, 1557611200.0, 1e-9); }
/* GPT-3 XL: "1.3B" in Brown et al. 2020 table 2.1. */
Test(gpt, gpt3_1_3b) { check_gpt("gpt3-1.3b", 24, 2048, 50257, 2048, 1.3e9, 0.02); }
/* GPT-3: 174.6 B by Narayanan's formula with V = 50257, s = 2048 ("175B" in Brown). */
Test(gpt, gpt3_175b) { check_gpt("gpt3-175b", 96, 12288, 50257, 2048, 174.6e9, 0.001); }

/* Narayanan et al. SC'21 table 1 prints the sizes to one decimal, in billions; the
 * formula with V = 51200 and s = 2048 must round to them. */
Test(gpt, megatron_table1)
{
  static const struct { const char *name; int l, h, heads; double billions; } rows[] = {
    { "megatron-1.7b", 24, 2304, 24, 1.7 },      { "megatron-3.6b", 30, 3072, 32, 3.6 },
    { "megatron-7.5b", 36, 4096, 32, 7.5 },      { "megatron-18.4b", 40, 6144, 48, 18.4 },
    { "megatron-39.1b", 48, 8192, 64, 39.1 },    { "megatron-76.1b", 60, 10240, 80, 76.1 },
    { "megatron-145.6b", 80, 12288, 96, 145.6 }, { "megatron-310.1b", 96, 16384, 128, 310.1 },
    { "megatron-529.6b", 105, 20480, 128, 529.6 }, { "megatron-1t", 128, 25600, 160, 1008.0 },
  };
  for (size_t i = 0; i < G_N_ELEMENTS(rows); i++) {
    g_autoptr(SimGraph) g = build(rows[i].name, "batch=1");
    int64_t p = gpt_unique_params(g) - 2 * rows[i].h;
    cr_assert_eq(p, narayanan_params(rows[i].l, rows[i].h, 51200, 2048), "%s", rows[i].name);
    cr_assert(fabs((double)p / 1e9 - rows[i].billions) <= 0.05, "%s: %.3f B", rows[i].name,
              (double)p / 1e9);
    int attn = sim_graph_op_by_name(g, "layer0.attn");
    cr_assert_eq(op_params(g, "layer0.attn"), 4LL * rows[i].h * rows[i].h + 4LL * rows[i].h,
                 "%s: QKV and output projections with bias", rows[i].name);
    cr_assert(attn >= 0);
  }
}

/* Forward FLOPs of one iteration (B sequences of s tokens): per layer the GEMMs do
 * 24 B s h^2 (QKV 6, output projection 2, MLP 16) and the attention scores and their
 * product with the values 4 B s^2 h; the logits 2 B s h V.  Narayanan et al. eq. 3
 * counts 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) for forward, backward and recomputation
 * (four forward passes of the layers, three of the logits), which is this forward
 * count times 4 but for the logits.  Element-wise work adds well under 1% at h = 12288;
 * a causal mask may save up to half of the s^2 term (1.4% here). */
Test(gpt, forward_flops_gpt3_175b)
{
  g_autoptr(SimGraph) g = build("gpt3-175b", "batch=2");
  double B = 2, s = 2048, l = 96, h = 12288, V = 50257;
  double expect = 24 * B * s * l * h * h * (1 + s / (6 * h)) + 2 * B * s * h * V;
  assert_close(sim_graph_forward_flops(g), expect, 0.02, "gpt3-175b forward FLOPs");
  /* Backward does the two GEMMs per forward GEMM: about twice the forward. */
  assert_close(sim_graph_backward_flops(g), 2 * expect, 0.05, "gpt3-175b backward FLOPs");
}

/* The same for Narayanan et al. table 1, and against eq. 3 itself divided by four, which
 * undercounts the logits by a quarter: within 3% down to the 1.7 B model, whose
 * vocabulary term is the largest. */
Test(gpt, forward_flops_megatron_table1)
{
  static const char *const names[] = { "megatron-1.7b", "megatron-18.4b", "megatron-1t" };
  for (size_t i = 0; i < G_N_ELEMENTS(names); i++) {
    g_autoptr(SimGraph) g = build(names[i], "batch=1");
    double B = 1, s = 2048, V = 51200, l = 0, h = 0;
    for (const SimModelParam *p = sim_zoo_model_params(names[i]); p->name; p++) {
      if (!strcmp(p->name, "layers"))
        l = (double)p->value;
      if (!strcmp(p->name, "hidden"))
        h = (double)p->value;
    }
    double layers = 24 * B * s * l * h * h * (1 + s / (6 * h));
    assert_close(sim_graph_forward_flops(g), layers + 2 * B * s * h * V, 0.01, names[i]);
    double eq3 = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
    assert_close(sim_graph_forward_flops(g), eq3 / 4, 0.03, names[i]);
  }
}

Test(gpt, structure)
{
  g_autoptr(SimGraph) g = build("gpt3-175b", NULL);
  cr_assert_eq(sim_graph_tokens_per_sample(g), 2048);
  cr_assert_eq(sim_graph_batch_size(g), 1536);
  int checkpoints = 0, selective = 0;
  for (int op = 0; op < sim_graph_n_ops(g); op++) {
    checkpoints += sim_graph_op_is_checkpoint(g, op);
    selective += sim_graph_op_is_selective_recompute(g, op);
  }
  cr_assert_eq(checkpoints, 96, "one checkpoint per layer");
  cr_assert_eq(selective, 96, "one selective-recompute attention per layer");
  int attn = sim_graph_op_by_name(g, "layer95.attn");
  cr_assert(attn >= 0 && sim_graph_op_type(g, attn) == SIM_OP_ATTENTION);
  cr_assert(sim_graph_op_is_selective_recompute(g, attn));
  int last = sim_graph_op_by_name(g, "layer95.mlp.residual");
  cr_assert(last >= 0 && sim_graph_op_is_checkpoint(g, last));
  cr_assert_eq(sim_graph_op_type(g, sim_graph_op_by_name(g, "layer7.mlp.fc1")), SIM_OP_LINEAR);
  cr_assert_eq(sim_graph_op_type(g, sim_graph_op_by_name(g, "embed")), SIM_OP_EMBEDDING);
  cr_assert_eq(sim_graph_op_type(g, sim_graph_op_by_name(g, "loss")), SIM_OP_CROSS_ENTROPY);
  /* 3 inputs, 4 embedding ops, 9 per layer, final norm, lm_head, loss. */
  cr_assert_eq(sim_graph_n_ops(g), 3 + 4 + 96 * 9 + 3);
  SimShape w = sim_graph_op_weight_shape(g, sim_graph_op_by_name(g, "layer0.mlp.fc1"), 0);
  cr_assert_eq(w.dims[0] * w.dims[1], 12288LL * 4 * 12288);
}

/* ---------------------------------------------------------------------------------- */
/* BERT and the Transformer                                                            */

/* Hugging Face BertForMaskedLM: 109,514,298 (base) and 335,174,458 (large) parameters:
 * embeddings (word, 512 positions, 2 token types, layer norm), 12h^2 + 13h per layer and
 * the MLM head (h^2 + h transform, 2h norm, V decoder bias; its weight is tied to the
 * word embeddings, so lm_head's weight is counted once).  Devlin et al. quote 110 M and
 * 340 M, counting the pooler. */
Test(bert, parameters)
{
  g_autoptr(SimGraph) base = build("bert-base", "batch=1");
  cr_assert_eq(sim_graph_n_params(base), 109514298);
  assert_close((double)sim_graph_n_params(base), 110e6, 0.01, "bert-base");
  g_autoptr(SimGraph) large = build("bert-large", "batch=1");
  cr_assert_eq(sim_graph_n_params(large), 335174458);
  assert_close((double)sim_graph_n_params(large), 340e6, 0.02, "bert-large");
  cr_assert_eq(sim_graph_tokens_per_sample(large), 512);

  g_autoptr(GError) error = build_error("bert-base", "seq=1024");
  cr_assert(g_error_matches(error, SIM_ERROR, SIM_ERROR_INVALID));
}

/* BERT's variants: the SQuAD span head (2 logits a token, 2050 parameters) in place of the
 * MLM head (h^2 + h transform, 2h norm, V bias), and the head seeing only the masked
 * positions, which leaves the parameters alone and the head's FLOPs in proportion. */
Test(bert, heads)
{
  g_autoptr(SimGraph) mlm = build("bert-large", "batch=8,seq=128");
  g_autoptr(SimGraph) qa = build("bert-large", "batch=8,seq=128,head=2");
  int64_t h = 1024, V = 30522;
  cr_assert_eq(sim_graph_n_params(mlm) - sim_graph_n_params(qa),
               (h * h + h) + 2 * h + V - (2 * h + 2));
  g_autoptr(SimGraph) masked = build("bert-large", "batch=8,seq=128,predictions=20");
  cr_assert_eq(sim_graph_n_params(masked), sim_graph_n_params(mlm));
  /* The decoder's FLOPs (2 h V a position, forward) fall from 128 positions to 20. */
  double dec = 2.0 * h * V * 8;
  assert_close(sim_graph_forward_flops(mlm) - sim_graph_forward_flops(masked),
               dec * (128 - 20) + 2.0 * h * h * 8 * (128 - 20), 0.01, "masked head");
}

/* GNMT v2 as NVIDIA trains it: a shared embedding of 32,320 x 1024, the encoder's
 * bidirectional first layer (two LSTMs of (1024 + 1024) x 4096 + 4096), a layer over
 * their 2048-wide output ((2048 + 1024) x 4096 + 4096) and two more of 1024, the
 * attention's four 1024 x 1024 projections with biases, the decoder's first layer and
 * three over the output and the context ((2048 + 1024) x 4096 + 4096), and the
 * classifier (1024 x 32,320 + 32,320): 162,733,632 (NVIDIA quotes about 160 M). */
Test(rnn, gnmt)
{
  g_autoptr(SimGraph) g = build("gnmt", "batch=8");
  int64_t h = 1024, V = 32320;
  int64_t lstm1 = (h + h) * 4 * h + 4 * h, lstm2 = (2 * h + h) * 4 * h + 4 * h;
  int64_t want = V * h + 2 * lstm1 + lstm2 + 2 * lstm1 + 4 * h * h + 4 * h + lstm1 +
                 3 * lstm2 + h * V + V;
  cr_assert_eq(sim_graph_n_params(g), want);
  cr_assert_eq(want, 162733632);
  cr_assert_eq(count_ops(g, SIM_OP_LSTM), 9);
  cr_assert_eq(sim_graph_tokens_per_sample(g), 100, "source and target tokens");
}

/* Transformer base, d = 512, d_ff = 2048, V = 37000 shared by both embeddings and the
 * output layer: encoder layers 6 x (4(d^2 + d) + 2 d d_ff + d_ff + d + 2 x 2d)
 * = 18,914,304, decoder layers 6 x (8(d^2 + d) + 2 d d_ff + d_ff + d + 3 x 2d)
 * = 25,224,192 and one embedding 18,944,000: 63,082,496; Vaswani et al. table 3 says
 * 65 M. */
Test(transformer, parameters)
{
  g_autoptr(SimGraph) g = build("transformer", "batch=1");
  int64_t shared = sim_graph_n_params(g);
  cr_assert_eq(shared, 63082496);
  assert_close((double)shared, 65e6, 0.04, "transformer base");
}

/* ---------------------------------------------------------------------------------- */
/* Recommendation models and the MLPs                                                   */

/* MLPerf DLRM (facebookresearch/dlrm, Criteo Terabyte, --max-ind-range=40000000): the 26
 * tables hold 187,767,399 rows of 128 (24,034,227,072), the bottom MLP 13-512-256-128
 * 171,392 and the top MLP 479-1024-1024-512-256-1 2,197,505 parameters. */
Test(recsys, dlrm)
{
  g_autoptr(SimGraph) g = build("dlrm", "batch=16,align=1");
  cr_assert_eq(sim_graph_n_params(g), 24034227072LL + 171392 + 2197505);
  /* NVIDIA's implementation pads the top MLP's 479 inputs to 480: one more weight row. */
  g_autoptr(SimGraph) padded = build("dlrm", "batch=16");
  cr_assert_eq(sim_graph_n_params(padded), 24034227072LL + 171392 + 2197505 + 1024);
  cr_assert_eq(count_ops(g, SIM_OP_EMBEDDING), 26);
  /* 27 feature vectors interact pairwise: 351 dot products plus the 128 dense ones. */
  int top = sim_graph_op_by_name(g, "top.fc0");
  SimShape in = sim_graph_tensor_shape(g, sim_graph_op_input(g, top, 0));
  cr_assert(in.ndim == 2 && in.dims[1] == 479, "top MLP input %" G_GINT64_FORMAT, in.dims[1]);

  /* rows=1M caps every table at one million rows. */
  g_autoptr(SimGraph) small = build("dlrm", "rows=1M,align=1");
  int64_t rows = 0;
  static const int64_t tb[] = { 39884406, 39043, 17289, 7420, 20263, 3, 7120, 1543, 63,
                                38532951, 2953546, 403346, 10, 2208, 11938, 155, 4, 976, 14,
                                39979771, 25641295, 39664984, 585935, 12972, 108, 36 };
  for (size_t i = 0; i < G_N_ELEMENTS(tb); i++)
    rows += MIN(tb[i], 1000000);
  cr_assert_eq(sim_graph_n_params(small), rows * 128 + 171392 + 2197505);
}

/* FlexFlow examples/cpp/XDL/xdl.cc: 4 tables of 1,000,000 x 64 and dense 256-256-2
 * without bias: 256,000,000 + 2 x 65,536 + 512. */
Test(recsys, xdl)
{
  g_autoptr(SimGraph) g = build("xdl", NULL);
  cr_assert_eq(sim_graph_n_params(g), 256000000LL + 2 * 65536 + 512);
}

/* FlexFlow examples/cpp/candle_uno: towers of 8 dense layers of 4192 without bias on
 * cell.rnaseq (942), two drug descriptors (5270) and two fingerprints (2048); two doses
 * join unencoded; then 4 dense layers and one output: 820,948,704 parameters. */
Test(candle, uno)
{
  g_autoptr(SimGraph) g = build("candle-uno", NULL);
  int64_t h = 4192, tower = 7 * h * h;
  int64_t expect = (942 * h + tower) + 2 * (5270 * h + tower) + 2 * (2048 * h + tower) +
                   (2 + 5 * h) * h + 3 * h * h + h;
  cr_assert_eq(expect, 820948704);
  cr_assert_eq(sim_graph_n_params(g), expect);
}

/* Unity's MLP (FlexFlow examples/cpp/MLP_Unify): two towers of 1024 -> 8 x 8192 dense
 * layers without bias: 2 x (1024 x 8192 + 7 x 8192^2) = 956,301,312. */
Test(mlp, unity)
{
  g_autoptr(SimGraph) g = build("mlp", NULL);
  cr_assert_eq(sim_graph_n_params(g), 956301312);
  cr_assert_eq(count_ops(g, SIM_OP_LINEAR), 16);
  g_autoptr(SimGraph) small = build("mlp", "layers=2,hidden=16,input=8,classes=4,towers=1");
  cr_assert_eq(sim_graph_n_params(small), 8 * 16 + 16 * 4);
}

/* ---------------------------------------------------------------------------------- */
/* FlexFlow's recurrent networks.  Each chunk of a layer is its own LSTM operator; the
 * chunks of a layer share its weights [in + hidden, 4 hidden] + [4 hidden], so a layer
 * counts once however many chunks it has. */

static int64_t lstm_weights(int64_t in, int64_t hidden)
{
  return (in + hidden) * 4 * hidden + 4 * hidden;
}

/* RNNLM, 2 layers of 2048, vocabulary 10,000, 20 steps in chunks of 10: the embedding
 * 20,480,000, two LSTM layers 2 x 33,562,624 and the softmax layer 20,490,000. */
Test(rnn, rnnlm_parameters_and_flops)
{
  g_autoptr(SimGraph) g = build("rnnlm", "batch=4");
  int64_t layer = lstm_weights(2048, 2048), chunks = 2;
  int64_t model = 10000LL * 2048 + 2 * layer + (2048LL * 10000 + 10000);
  cr_assert_eq(count_ops(g, SIM_OP_LSTM), 2 * chunks);
  cr_assert_eq(sim_graph_n_params(g), model);
  /* One operator per layer when a chunk is the whole sequence. */
  g_autoptr(SimGraph) whole = build("rnnlm", "batch=4,chunk=20");
  cr_assert_eq(count_ops(whole, SIM_OP_LSTM), 2);
  cr_assert_eq(sim_graph_n_params(whole), model);
  /* Every token goes through both layers' weights and the softmax layer once: about
   * 2 FLOPs per weight and token (the embedding is a lookup; gates add 1%). */
  double tokens = 4 * 20;
  assert_close(sim_graph_forward_flops(g), 2 * tokens * (2.0 * layer + 2048.0 * 10000), 0.01,
               "rnnlm forward FLOPs");
  cr_assert_eq(sim_graph_tokens_per_sample(g), 20);
}

/* Chunk j of a layer follows chunk j-1 (the recurrent state) and chunk j of the layer
 * below (its input); the decoder's first chunks follow the encoder's last. */
Test(rnn, chunks_keep_the_recurrence)
{
  g_autoptr(SimGraph) g = build("nmt", NULL);
  cr_assert_eq(count_ops(g, SIM_OP_LSTM), 2 * 2 * 4, "2 + 2 layers of 40 / 10 chunks");
  int chunk = sim_graph_op_by_name(g, "encoder.lstm1.chunk2");
  cr_assert_geq(chunk, 0);
  int add = sim_graph_tensor_producer(g, sim_graph_op_input(g, chunk, 0));
  cr_assert_eq(sim_graph_op_type(g, add), SIM_OP_BINARY);
  gboolean from_below = FALSE, from_before = FALSE;
  for (int i = 0; i < 2; i++) {
    int src = sim_graph_tensor_producer(g, sim_graph_op_input(g, add, i));
    if (sim_graph_op_type(g, src) == SIM_OP_SPLIT)
      src = sim_graph_tensor_producer(g, sim_graph_op_input(g, src, 0));
    from_below = from_below || !strcmp(sim_graph_op_name(g, src), "encoder.lstm0.chunk2");
    from_before = from_before || !strcmp(sim_graph_op_name(g, src), "encoder.lstm1.chunk1");
  }
  cr_assert(from_below && from_before);

  int dec = sim_graph_op_by_name(g, "decoder.lstm1.chunk0");
  int dadd = sim_graph_tensor_producer(g, sim_graph_op_input(g, dec, 0));
  int state = sim_graph_tensor_producer(g, sim_graph_op_input(g, dadd, 1));
  int enc_last = sim_graph_tensor_producer(g, sim_graph_op_input(g, state, 0));
  cr_assert_str_eq(sim_graph_op_name(g, enc_last), "encoder.lstm1.chunk3");

  /* NMT: embeddings and softmax over 20,480 words, 2 + 2 layers of 2048 and a one-head
   * attention (4 projections with bias). */
  int64_t layer = lstm_weights(2048, 2048);
  int64_t model = 2 * 20480LL * 2048 + 4 * layer + 4 * (2048LL * 2048 + 2048) +
                  (2048LL * 20480 + 20480);
  cr_assert_eq(sim_graph_n_params(g), model);
}

/* RNNTC: 4 layers of 1024 over 40 steps in chunks of 10, then a 2-class softmax on the
 * last step's state. */
Test(rnn, rnntc)
{
  g_autoptr(SimGraph) g = build("rnntc", NULL);
  cr_assert_eq(count_ops(g, SIM_OP_LSTM), 16);
  int64_t layer = lstm_weights(1024, 1024);
  cr_assert_eq(sim_graph_n_params(g),
               20480LL * 1024 + 4 * layer + (1024 * 2 + 2));
  int cls = sim_graph_op_by_name(g, "classifier");
  SimShape in = sim_graph_tensor_shape(g, sim_graph_op_input(g, cls, 0));
  cr_assert(in.ndim == 2 && in.dims[0] == 64 && in.dims[1] == 1024);
}

/* ---------------------------------------------------------------------------------- */
/* Today's language models (sim/models/llm.c)                                          */

typedef struct {
  int64_t L, h, heads, kv, f, V;        /* dense width f; 0 for an all-MoE model      */
  int64_t E, k, fe, shared, dense;      /* experts, top k, expert width, shared, dense */
} LlmDims;

/* The parameters in closed form: untied embedding and output layer (2 V h), the final
 * norm (h); per layer two norms (2h), Wq and Wo (2 h^2), Wk and Wv (2 h kv hd); a dense
 * SwiGLU (3 h f) or a router (h E), E experts (3 h fe each) and the shared experts
 * (3 h fe each).  With @active, each MoE layer counts k of its E routed experts. */
static int64_t llm_params(const LlmDims *d, gboolean active)
{
  int64_t hd = d->h / d->heads;
  int64_t p = 2 * d->V * d->h + d->h;
  for (int64_t l = 0; l < d->L; l++) {
    p += 2 * d->h + 2 * d->h * d->h + 2 * d->h * d->kv * hd;
    if (d->E == 0 || l < d->dense)
      p += 3 * d->h * d->f;
    else
      p += d->h * d->E + 3 * d->h * d->fe * ((active ? d->k : d->E) + d->shared);
  }
  return p;
}

/* The graph's parameters counting k of E experts in every MoE op (its router is a linear
 * op of its own, always active). */
static double graph_active_params(const SimGraph *g)
{
  double p = 0;
  for (int op = 0; op < sim_graph_n_ops(g); op++) {
    double n = (double)sim_graph_op_n_params(g, op);
    if (sim_graph_op_type(g, op) == SIM_OP_MOE) {
      g_autoptr(SimAttrs) a = sim_graph_op_attrs(g, op);
      int64_t E = 0, k = 0;
      cr_assert(sim_attrs_get_int(a, "experts", &E) && sim_attrs_get_int(a, "top_k", &k));
      n = n * (double)k / (double)E;
    }
    p += n;
  }
  return p;
}

/* @published agrees with the graph's count within @unit, the last digit it prints. */
static void check_llm(const char *name, const LlmDims *d, double published, double unit,
                      double published_active, double unit_active)
{
  g_autoptr(SimGraph) g = build(name, "batch=1");
  int64_t want = llm_params(d, FALSE);
  cr_assert_eq(sim_graph_n_params(g), want, "%s: %" G_GINT64_FORMAT ", closed form %"
               G_GINT64_FORMAT, name, sim_graph_n_params(g), want);
  cr_assert(fabs((double)want - published) <= unit, "%s: %.4g, published %.4g", name,
            (double)want, published);
  /* Untied: the output layer has its own [h, V] weight. */
  cr_assert_eq(op_params(g, "lm_head"), d->V * d->h, "%s", name);
  cr_assert_eq(op_params(g, "embed"), d->V * d->h, "%s", name);
  if (published_active > 0) {
    double active = graph_active_params(g);
    cr_assert_eq((int64_t)llround(active), llm_params(d, TRUE), "%s active", name);
    cr_assert(fabs(active - published_active) <= unit_active, "%s: %.4g active, published "
              "%.4g", name, active, published_active);
  }
}

/* LLaMA-2 (Hugging Face meta-llama/Llama-2-{7b,13b,70b}-hf, their safetensors'
 * parameter counts: 6.74 B, 13.02 B, 68.98 B). */
Test(llm, llama2)
{
  check_llm("llama2-7b", &(LlmDims){ 32, 4096, 32, 32, 11008, 32000 }, 6.74e9, 0.01e9, 0, 0);
  check_llm("llama2-13b", &(LlmDims){ 40, 5120, 40, 40, 13824, 32000 }, 13.02e9, 0.01e9, 0, 0);
  check_llm("llama2-70b", &(LlmDims){ 80, 8192, 64, 8, 28672, 32000 }, 68.98e9, 0.01e9, 0, 0);
}

/* LLaMA-3 (Hugging Face meta-llama/Meta-Llama-3-8B and -70B: 8.03 B, 70.55 B; Llama 3.1
 * 405B: 405.8 B). */
Test(llm, llama3)
{
  check_llm("llama3-8b", &(LlmDims){ 32, 4096, 32, 8, 14336, 128256 }, 8.03e9, 0.01e9, 0, 0);
  check_llm("llama3-70b", &(LlmDims){ 80, 8192, 64, 8, 28672, 128256 }, 70.55e9, 0.01e9, 0, 0);
  check_llm("llama3-405b", &(LlmDims){ 126, 16384, 128, 8, 53248, 128256 }, 405.8e9, 0.1e9, 0,
            0);
}

/* Mixtral 8x7B: "46.7B total parameters but only uses 12.9B parameters per token" (Mistral
 * AI, "Mixtral of experts", December 2023; Jiang et al. 2024).  Mixtral 8x22B: "39B active
 * parameters out of 141B" (Mistral AI, "Cheaper, Better, Faster, Stronger", April 2024). */
Test(llm, mixtral)
{
  check_llm("mixtral-8x7b", &(LlmDims){ 32, 4096, 32, 8, 0, 32000, 8, 2, 14336, 0, 0 }, 46.7e9,
            0.1e9, 12.9e9, 0.1e9);
  check_llm("mixtral-8x22b", &(LlmDims){ 56, 6144, 48, 8, 0, 32768, 8, 2, 16384, 0, 0 }, 141e9,
            1e9, 39e9, 1e9);
}

/* DeepSeekMoE 16B: 16.4 B total, 2.8 B activated (Dai et al. 2024, table 3). */
Test(llm, deepseek_moe)
{
  check_llm("deepseek-moe-16b",
            &(LlmDims){ 28, 2048, 16, 16, 10944, 102400, 64, 6, 1408, 2, 1 }, 16.4e9, 0.1e9,
            2.8e9, 0.1e9);
}

/* The blocks as built: every layer's attention groups its queries and rotates them, the
 * norms are RMS norms, no dropout; a MoE layer renormalizes its top k (Mixtral) or, with
 * shared experts, does not (DeepSeekMoE). */
Test(llm, structure)
{
  g_autoptr(SimGraph) g = build("llama3-8b", "batch=1,layers=2");
  cr_assert_eq(count_ops(g, SIM_OP_RMSNORM), 5);
  cr_assert_eq(count_ops(g, SIM_OP_LAYERNORM), 0);
  cr_assert_eq(count_ops(g, SIM_OP_GATED_MLP), 2);
  cr_assert_eq(count_ops(g, SIM_OP_DROPOUT), 0);
  g_autoptr(SimAttrs) a = sim_graph_op_attrs(g, sim_graph_op_by_name(g, "layer1.attn"));
  int64_t v;
  cr_assert(sim_attrs_get_int(a, "kv_heads", &v) && v == 8);
  cr_assert(sim_attrs_get_int(a, "rotary", &v) && v == 1);
  double theta;
  cr_assert(sim_attrs_get_float(a, "rotary_base", &theta) && theta == 500000);

  g_autoptr(SimGraph) m = build("mixtral-8x7b", "batch=1,layers=1");
  g_autoptr(SimAttrs) ma = sim_graph_op_attrs(m, sim_graph_op_by_name(m, "layer0.moe"));
  cr_assert(sim_attrs_get_int(ma, "normalize_top_k", &v) && v == 1);
  g_autoptr(SimGraph) d = build("deepseek-moe-16b", "batch=1,layers=3");
  cr_assert_eq(count_ops(d, SIM_OP_MOE), 2);
  cr_assert_eq(count_ops(d, SIM_OP_GATED_MLP), 3); /* the dense layer and 2 shared blocks */
  g_autoptr(SimAttrs) da = sim_graph_op_attrs(d, sim_graph_op_by_name(d, "layer1.moe"));
  cr_assert(sim_attrs_get_int(da, "normalize_top_k", &v) && v == 0);

  GError *e = build_error("llama", "heads=16,kv_heads=3");
  cr_assert(strstr(e->message, "kv_heads"), "%s", e->message);
  g_error_free(e);
  e = build_error("moe", "top_k=9");
  cr_assert(strstr(e->message, "top_k (9) exceeds the 8 experts"), "%s", e->message);
  g_error_free(e);
}
