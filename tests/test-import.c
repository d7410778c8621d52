/* test-import.c — bringing models in and out of parasol, through the program
 * (PARASOL_BIN): the example files of examples/ load and take effect, `parasol model
 * export` writes graphs that read back, graph files take --param batch, and the graph
 * reader refuses what it does not know with exit status 2. */
#include <criterion/criterion.h>
#include <glib.h>
#include <glib/gstdio.h>
#include <math.h>
#include <string.h>
#include <sys/wait.h>

typedef struct {
  int status;
  char *out, *err;
} Run;

static Run run_argv(GPtrArray *args)
{
  const char *bin = g_getenv("PARASOL_BIN");
  cr_assert_not_null(bin, "PARASOL_BIN is not set");
  g_autoptr(GPtrArray) argv = g_ptr_array_new();
  g_ptr_array_add(argv, (char *)bin);
  for (guint i = 0; i < args->len; i++)
    g_ptr_array_add(argv, args->pdata[i]);
  g_ptr_array_add(argv, NULL);
  Run r = { 0 };
  int wait = 0;
  GError *error = NULL;
  cr_assert(g_spawn_sync(NULL, (char **)argv->pdata, NULL, G_SPAWN_DEFAULT, NULL, NULL, &r.out,
                         &r.err, &wait, &error),
            "%s", error ? error->message : "");
  r.status = WIFEXITED(wait) ? WEXITSTATUS(wait) : -1;
  return r;
}

/* Runs parasol with the NULL-terminated arguments after the program name. */
static Run run(const char *first, ...)
{
  g_autoptr(GPtrArray) args = g_ptr_array_new();
  va_list ap;
  va_start(ap, first);
  for (const char *a = first; a; a = va_arg(ap, const char *))
    g_ptr_array_add(args, (char *)a);
  va_end(ap);
  return run_argv(args);
}

static void run_clear(Run *r)
{
  g_free(r->out);
  g_free(r->err);
}

static void expect_ok(Run *r, const char *what)
{
  cr_assert_eq(r->status, 0, "%s: exit status %d, stderr: %s", what, r->status, r->err);
}

/* Exit status 2 and @expect in the message. */
static void expect_refused(Run r, const char *expect)
{
  cr_expect_eq(r.status, 2, "exit status %d, stderr: %s", r.status, r.err);
  cr_expect(strstr(r.err, expect) != NULL, "expected \"%s\" in: %s", expect, r.err);
  run_clear(&r);
}

static double json_number(const char *json, const char *name)
{
  g_autofree char *quoted = g_strdup_printf("\"%s\"", name);
  const char *key = strstr(json, quoted);
  cr_assert_not_null(key, "no %s in: %s", name, json);
  const char *colon = strchr(key, ':');
  cr_assert_not_null(colon);
  return g_ascii_strtod(colon + 1, NULL);
}

static char *source_path(const char *rel)
{
  const char *src = g_getenv("PARASOL_SOURCE");
  cr_assert_not_null(src, "PARASOL_SOURCE is not set");
  return g_build_filename(src, rel, NULL);
}

static char *write_temp(const char *dir, const char *name, const char *text)
{
  char *path = g_build_filename(dir, name, NULL);
  cr_assert(g_file_set_contents(path, text, -1, NULL));
  return path;
}

/* ---------------------------------------------------------------------------------- */
/* The example files (docs/formats.md)                                                 */

/* Each example loads, and each changes the prediction the way its format says: the
 * strategy file against plain data parallelism, the calibration's GEMM efficiency, the
 * profile's CPU timings (far slower than the roofline of an A100). */
Test(examples, every_example_file_loads_and_takes_effect)
{
  g_autofree char *graph = source_path("examples/mlp.graph.json");
  g_autofree char *machine = source_path("examples/two-servers.machine.json");
  g_autofree char *strategy = source_path("examples/mlp-hybrid.strategy.json");
  g_autofree char *profile = source_path("examples/mlp-cpu.profile.json");
  g_autofree char *calib = source_path("examples/pcie.calibration.json");

  Run show = run("model", "show", graph, "--json", NULL);
  expect_ok(&show, "model show");
  cr_expect_eq(json_number(show.out, "parameters"),
               1024.0 * 4096 + 4096 + 4096.0 * 4096 + 4096 + 4096.0 * 1000 + 1000);
  run_clear(&show);
  Run mach = run("machine", "show", machine, NULL);
  expect_ok(&mach, "machine show");
  cr_expect(strstr(mach.out, "2 x 4 GPUs = 8 devices"), "%s", mach.out);
  run_clear(&mach);

  Run dp = run("simulate", "-m", graph, "-x", machine, "--json", NULL);
  Run plan = run("simulate", "-m", graph, "-x", machine, "-s", strategy, "--json", NULL);
  Run cal = run("simulate", "-m", graph, "-x", machine, "-s", strategy, "--calibration", calib,
                "--json", NULL);
  Run prof = run("simulate", "-m", graph, "-x", machine, "-s", strategy, "--profile", profile,
                 "--profile-gpu", "cpu", "--json", NULL);
  expect_ok(&dp, "data parallel");
  expect_ok(&plan, "strategy");
  expect_ok(&cal, "calibration");
  expect_ok(&prof, "profile");
  double t_dp = json_number(dp.out, "iteration_time_s");
  double t_plan = json_number(plan.out, "iteration_time_s");
  double t_cal = json_number(cal.out, "iteration_time_s");
  double t_prof = json_number(prof.out, "iteration_time_s");
  cr_expect_neq(t_plan, t_dp);
  cr_expect_neq(t_cal, t_plan);
  /* Single-threaded CPU kernels take milliseconds where an A100 takes microseconds. */
  cr_expect_gt(t_prof, 10 * t_plan, "profile %g s against roofline %g s", t_prof, t_plan);
  run_clear(&dp);
  run_clear(&plan);
  run_clear(&cal);
  run_clear(&prof);
}

/* ---------------------------------------------------------------------------------- */
/* parasol model export and graph files                                                */

/* A zoo model exported and read back predicts the same iteration; with --param batch
 * the file gives what the zoo gives with that batch. */
Test(graph, export_reads_back_and_takes_the_batch)
{
  g_autofree char *dir = g_dir_make_tmp("parasol-import-XXXXXX", NULL);
  g_autofree char *path = g_build_filename(dir, "resnet-50.json", NULL);
  Run ex = run("model", "export", "resnet-50", "--param", "batch=32", "-o", path, NULL);
  expect_ok(&ex, "export");
  run_clear(&ex);
  Run zoo = run("simulate", "-m", "resnet-50", "-p", "batch=32", "-x", "dgx-a100", "--json",
                NULL);
  Run file = run("simulate", "-m", path, "-x", "dgx-a100", "--json", NULL);
  expect_ok(&zoo, "zoo");
  expect_ok(&file, "file");
  cr_expect_eq(json_number(file.out, "iteration_time_s"), json_number(zoo.out, "iteration_time_s"));
  run_clear(&zoo);
  run_clear(&file);

  Run zoo2 = run("simulate", "-m", "resnet-50", "-p", "batch=128", "-x", "dgx-a100", "--json",
                 NULL);
  Run file2 = run("simulate", "-m", path, "-p", "batch=128", "-x", "dgx-a100", "--json", NULL);
  Run file3 = run("simulate", "-m", path, "--global-batch", "128", "-x", "dgx-a100", "--json",
                  NULL);
  expect_ok(&zoo2, "zoo at 128");
  expect_ok(&file2, "file at 128");
  expect_ok(&file3, "file with --global-batch 128");
  double want = json_number(zoo2.out, "iteration_time_s");
  cr_expect_eq(json_number(file2.out, "iteration_time_s"), want);
  cr_expect_eq(json_number(file3.out, "iteration_time_s"), want);
  run_clear(&zoo2);
  run_clear(&file2);
  run_clear(&file3);

  /* Exported to standard output: the same text as the file. */
  Run out = run("model", "export", path, NULL);
  expect_ok(&out, "export to stdout");
  g_autofree char *text = NULL;
  cr_assert(g_file_get_contents(path, &text, NULL, NULL));
  cr_expect_str_eq(out.out, text);
  run_clear(&out);

  expect_refused(run("simulate", "-m", path, "-p", "layers=2", NULL),
                 "a graph file takes only --param batch=N");
  g_unlink(path);
  g_rmdir(dir);
}

Test(graph, the_reader_refuses_unknown_keys_naming_file_and_place)
{
  g_autofree char *dir = g_dir_make_tmp("parasol-import-XXXXXX", NULL);
  g_autofree char *top = write_temp(dir, "top.json",
    "{\"format\": \"parasol-graph\", \"version\": 1, \"opz\": []}");
  expect_refused(run("model", "show", top, NULL), "top.json: opz: unknown key");
  g_autofree char *op = write_temp(dir, "op.json",
    "{\"format\": \"parasol-graph\", \"version\": 1, \"ops\": [{\"name\": \"x\", "
    "\"type\": \"input\", \"attrs\": {\"shape\": [4, 8]}, \"chekpoint\": true}]}");
  expect_refused(run("model", "show", op, NULL), "op.json: ops[0] ('x').chekpoint: unknown key");
  g_autofree char *attr = write_temp(dir, "attr.json",
    "{\"format\": \"parasol-graph\", \"version\": 1, \"ops\": [{\"name\": \"x\", "
    "\"type\": \"input\", \"attrs\": {\"shape\": [4, 8], \"dtpye\": \"fp16\"}}]}");
  expect_refused(run("model", "show", attr, NULL), "dtpye");
  g_unlink(top);
  g_unlink(op);
  g_unlink(attr);
  g_rmdir(dir);
}

/* ---------------------------------------------------------------------------------- */
/* ONNX import (tests/data/onnx/README.md says how the files were made)                */

static void need_onnx(void)
{
  if (g_strcmp0(g_getenv("PARASOL_ONNX"), "1") != 0)
    cr_skip_test("built without ONNX support (protobuf-c, libonnx-dev)");
}

static char *onnx_file(const char *name)
{
  g_autofree char *rel = g_build_filename("tests", "data", "onnx", name, NULL);
  return source_path(rel);
}

static double model_parameters(const char *model, const char *params)
{
  Run r = run("model", "show", model, "--param", params, "--json", NULL);
  expect_ok(&r, model);
  double n = json_number(r.out, "parameters");
  run_clear(&r);
  return n;
}

static double predicted(const char *model, const char *params)
{
  Run r = run("simulate", "-m", model, "--param", params, "-x", "dgx-a100", "--json", NULL);
  expect_ok(&r, model);
  double t = json_number(r.out, "iteration_time_s");
  run_clear(&r);
  return t;
}

/* PyTorch's parameter counts, as tools/torch2parasol.py printed them when it made the
 * files (sum of numel() over module.parameters()); torchvision's model tables give the
 * same 25,557,032 for ResNet-50 and 27,161,264 - 3,326,696 (the auxiliary classifier)
 * for Inception-v3. */
Test(onnx, imports_pytorch_models_with_their_exact_parameter_counts)
{
  need_onnx();
  g_autofree char *r50 = onnx_file("resnet50.onnx");
  g_autofree char *inc = onnx_file("inception_v3.onnx");
  g_autofree char *enc = onnx_file("encoder.onnx");
  cr_expect_eq(model_parameters(r50, "batch=8"), 25557032);
  cr_expect_eq(model_parameters(inc, "batch=8"), 23834568);
  cr_expect_eq(model_parameters(enc, "batch=8,seq=128"), 1579520);
}

/* The symbolic batch takes any size: twice the batch is twice the forward FLOPs, and a
 * sequence dimension sets the tokens per sample. */
Test(onnx, symbolic_dimensions_are_parameters)
{
  need_onnx();
  g_autofree char *enc = onnx_file("encoder.onnx");
  Run a = run("model", "show", enc, "-p", "batch=4,seq=64", "--json", NULL);
  Run b = run("model", "show", enc, "-p", "batch=8,seq=64", "--json", NULL);
  expect_ok(&a, "batch 4");
  expect_ok(&b, "batch 8");
  cr_expect_eq(json_number(a.out, "batch"), 4);
  cr_expect_eq(json_number(b.out, "batch"), 8);
  cr_expect_eq(json_number(a.out, "tokens_per_sample"), 64);
  cr_expect_eq(json_number(b.out, "forward_flops"), 2 * json_number(a.out, "forward_flops"));
  run_clear(&a);
  run_clear(&b);
  expect_refused(run("model", "show", enc, "-p", "batch=4", NULL),
                 "input 'input': dimension 1 is the symbol 'seq'; give its size with "
                 "--param seq=N");
  expect_refused(run("model", "show", enc, "-p", "batch=4,seq=8,layers=2", NULL),
                 "--param layers: the model's inputs have no symbolic dimension of that name");
}

/* The imported torchvision models predict the zoo's iteration time under data
 * parallelism over a DGX A100 within 2%: the zoo builds the same layers (sim/models/cnn.c)
 * and adds the loss, which the exported module does not have. */
Test(onnx, imported_cnns_predict_what_the_zoo_predicts)
{
  need_onnx();
  static const struct { const char *file, *zoo; } pairs[] = {
    { "resnet50.onnx", "resnet-50" }, { "inception_v3.onnx", "inception-v3" },
  };
  for (size_t i = 0; i < G_N_ELEMENTS(pairs); i++) {
    g_autofree char *f = onnx_file(pairs[i].file);
    double got = predicted(f, "batch=256"), want = predicted(pairs[i].zoo, "batch=256");
    cr_expect(fabs(got / want - 1) < 0.02, "%s: %g s against the zoo's %g s", pairs[i].zoo,
              got, want);
  }
}

/* Under a two-stage pipeline too: the imported models' layer ends are the zoo's, so the
 * stages are cut at the same block (by forward FLOPs, sim/strategy-build.c) and the
 * predictions agree within 2%. */
Test(onnx, imported_cnns_pipeline_as_the_zoo_does)
{
  need_onnx();
  static const struct { const char *file, *zoo; } pairs[] = {
    { "resnet50.onnx", "resnet-50" }, { "inception_v3.onnx", "inception-v3" },
  };
  for (size_t i = 0; i < G_N_ELEMENTS(pairs); i++) {
    g_autofree char *f = onnx_file(pairs[i].file);
    Run a = run("simulate", "-m", f, "-p", "batch=256", "-x", "dgx-a100:2", "--pp", "2",
                "--json", NULL);
    Run b = run("simulate", "-m", pairs[i].zoo, "-p", "batch=256", "-x", "dgx-a100:2", "--pp",
                "2", "--json", NULL);
    expect_ok(&a, pairs[i].file);
    expect_ok(&b, pairs[i].zoo);
    double got = json_number(a.out, "iteration_time_s"), want = json_number(b.out,
                                                                            "iteration_time_s");
    cr_expect(fabs(got / want - 1) < 0.02, "%s: %g s against the zoo's %g s", pairs[i].zoo,
              got, want);
    run_clear(&a);
    run_clear(&b);
  }
}

/* parasol import writes a graph file that reads back to the same model and prediction. */
Test(onnx, import_writes_a_graph_file_that_reads_back)
{
  need_onnx();
  g_autofree char *inc = onnx_file("inception_v3.onnx");
  g_autofree char *dir = g_dir_make_tmp("parasol-import-XXXXXX", NULL);
  g_autofree char *path = g_build_filename(dir, "inception.json", NULL);
  Run r = run("import", inc, "-p", "batch=64", "-o", path, NULL);
  expect_ok(&r, "import");
  run_clear(&r);
  cr_expect_eq(model_parameters(path, "batch=64"), 23834568);
  cr_expect_eq(predicted(path, "batch=64"), predicted(inc, "batch=64"));
  /* The graph file's batch changes as the ONNX file's does. */
  cr_expect_eq(predicted(path, "batch=128"), predicted(inc, "batch=128"));
  g_unlink(path);
  g_rmdir(dir);
}

Test(onnx, unsupported_operators_are_named)
{
  need_onnx();
  g_autofree char *bad = onnx_file("unsupported.onnx");
  expect_refused(run("import", bad, "-p", "batch=2", NULL),
                 "unsupported.onnx: node 'mix' (Einsum): operator Einsum is not supported");
  expect_refused(run("simulate", "-m", bad, "-p", "batch=2", NULL), "node 'mix' (Einsum)");
  Run c = run("import", "--check", bad, NULL);
  cr_expect_eq(c.status, 2);
  cr_expect(strstr(c.out, "Einsum: 1 node, the first 'mix'"), "%s", c.out);
  run_clear(&c);
  g_autofree char *r50 = onnx_file("resnet50.onnx");
  Run ok = run("import", "--check", r50, "-p", "batch=2", NULL);
  expect_ok(&ok, "check");
  cr_expect(strstr(ok.out, "every operator is supported"), "%s", ok.out);
  run_clear(&ok);

  g_autofree char *dir = g_dir_make_tmp("parasol-import-XXXXXX", NULL);
  g_autofree char *text = write_temp(dir, "text.onnx", "not protocol buffers\n");
  expect_refused(run("import", text, NULL), "text.onnx: not an ONNX model");
  g_unlink(text);
  g_rmdir(dir);
}

/* ---------------------------------------------------------------------------------- */
/* Pipelines on models that mark no layers                                             */

/* The zoo's CNNs and imported models mark no checkpoints; --pp 2 cuts them where one
 * tensor crosses (sim/layers.c): the stage boundary of the saved strategy falls between
 * two ResNet blocks, and every op of a block shares its stage. */
Test(layers, pp2_cuts_cnns_between_blocks)
{
  g_autofree char *dir = g_dir_make_tmp("parasol-import-XXXXXX", NULL);
  g_autofree char *path = g_build_filename(dir, "pp.json", NULL);
  g_autofree char *r50 = onnx_file("resnet50.onnx");
  gboolean onnx = g_strcmp0(g_getenv("PARASOL_ONNX"), "1") == 0;
  const char *models[] = { "resnet-50", onnx ? r50 : NULL };
  for (size_t m = 0; m < G_N_ELEMENTS(models) && models[m]; m++) {
    Run r = run("simulate", "-m", models[m], "-p", "batch=256", "-x", "dgx-a100", "--pp", "2",
                "--save-strategy", path, "--json", NULL);
    expect_ok(&r, models[m]);
    cr_expect_gt(json_number(r.out, "iteration_time_s"), 0);
    run_clear(&r);
    g_autofree char *text = NULL;
    cr_assert(g_file_get_contents(path, &text, NULL, NULL));
    cr_expect(strstr(text, "\"stage\": 0") && strstr(text, "\"stage\": 1"), "%s", text);
    /* Each line of the ops holds one op; within a block ("layer3.1.conv1" in the zoo,
     * "layer3/layer3.1/conv1/Conv" imported) the stage does not change. */
    char sep = m == 0 ? '.' : '/';
    g_autoptr(GHashTable) stages = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    int seen = 0;
    g_auto(GStrv) lines = g_strsplit(text, "\n", -1);
    for (char **it = lines; *it; it++) {
      const char *name = strstr(*it, "\"layer");
      const char *first = name ? strchr(name + 1, sep) : NULL;
      const char *second = first ? strchr(first + 1, sep) : NULL;
      if (!second || !strstr(*it, "\"stage\""))
        continue;
      g_autofree char *block = g_strndup(name + 1, second - name - 1);
      int s = strstr(*it, "\"stage\": 1") ? 2 : 1;
      int before = GPOINTER_TO_INT(g_hash_table_lookup(stages, block));
      cr_expect(before == 0 || before == s, "%s: block %s is cut: %s", models[m], block, *it);
      g_hash_table_insert(stages, g_strdup(block), GINT_TO_POINTER(s));
      seen++;
    }
    cr_expect_eq(g_hash_table_size(stages), 16, "%s: %u blocks", models[m],
                 g_hash_table_size(stages));
    cr_expect_gt(seen, 16 * 7, "%s: %d ops in the blocks", models[m], seen);
  }
  g_unlink(path);
  g_rmdir(dir);
}

/* PyTorch's nn.MultiheadAttention, exported as some forty nodes that move the batch out of
 * dimension 0, is imported as one attention operator as the zoo builds it: 2 layers give
 * 2 attention ops of 4 x (256 x 256 + 256) weights, and data, tensor and pipeline
 * parallel plans run on the import. */
Test(onnx, attention_modules_become_attention_operators)
{
  need_onnx();
  g_autofree char *enc = onnx_file("encoder.onnx");
  Run r = run("model", "show", enc, "-p", "batch=8,seq=32", NULL);
  expect_ok(&r, "show");
  int n = 0;
  for (const char *p = r.out; (p = strstr(p, " attention ")); p++)
    n++;
  cr_expect_eq(n, 2, "%s", r.out);
  cr_expect(strstr(r.out, "layers.0/self_attn ") && strstr(r.out, "263168"), "%s", r.out);
  run_clear(&r);
  static const char *const plans[][2] = { { "--dp", "8" }, { "--tp", "2" }, { "--pp", "2" } };
  for (size_t i = 0; i < G_N_ELEMENTS(plans); i++) {
    Run s = run("simulate", "-m", enc, "-p", "batch=64,seq=128", "-x", "dgx-a100", plans[i][0],
                plans[i][1], "--json", NULL);
    expect_ok(&s, plans[i][0]);
    cr_expect_gt(json_number(s.out, "iteration_time_s"), 0);
    run_clear(&s);
  }
}

/* Counts the lines of `model show` whose type column is @type. */
static int ops_of_type(const char *out, const char *type)
{
  g_autofree char *needle = g_strdup_printf(" %s ", type);
  int n = 0;
  for (const char *p = out; (p = strstr(p, needle)); p++)
    n++;
  return n;
}

/* A LLaMA-style decoder written in PyTorch (tests/data/onnx/make-llama.py: 2 blocks of
 * width 128, RMSNorm written out with pow, mean and rsqrt, rotary attention, SwiGLU, then
 * a GPT-2 MLP with gelu_new written out) keeps PyTorch's 783,616 parameters: 5 RMSNorms
 * of 128 scales each are 5 rmsnorm operators, the tanh GELU is one unary, each SwiGLU MLP
 * one gated_mlp, and the rotary tables (buffers) are inputs, not weights. */
Test(onnx, llama_blocks_import_rmsnorm_gelu_tanh_and_swiglu_as_operators)
{
  need_onnx();
  g_autofree char *f = onnx_file("llama.onnx");
  cr_expect_eq(model_parameters(f, "batch=4,seq=64"), 783616);
  Run r = run("model", "show", f, "-p", "batch=4,seq=64", NULL);
  expect_ok(&r, "show");
  cr_expect_eq(ops_of_type(r.out, "rmsnorm"), 5, "%s", r.out);
  cr_expect(strstr(r.out, "blocks.1/mlp_norm/rmsnorm ") != NULL, "%s", r.out);
  cr_expect(strstr(r.out, "gpt2_mlp/gelu ") != NULL, "%s", r.out);
  /* Nothing of the patterns is left: no Pow, ReduceMean, Sqrt or Tanh became an op. */
  cr_expect(strstr(r.out, "Pow") == NULL && strstr(r.out, "Sqrt") == NULL &&
                strstr(r.out, "Tanh") == NULL && strstr(r.out, "ReduceMean") == NULL,
            "%s", r.out);
  /* Each SwiGLU MLP is the zoo's gated_mlp with its 3 x 128 x 344 weights. */
  cr_expect_eq(ops_of_type(r.out, "gated_mlp"), 2, "%s", r.out);
  cr_expect(strstr(r.out, "blocks.1/mlp/gated_mlp ") && strstr(r.out, "132096"), "%s", r.out);
  run_clear(&r);
  Run c = run("import", "--check", f, "-p", "batch=2,seq=8", NULL);
  cr_expect_eq(c.status, 0, "import --check: %s%s", c.out, c.err);
  run_clear(&c);
  Run s = run("simulate", "-m", f, "-p", "batch=16,seq=128", "-x", "dgx-a100", "--tp", "2",
              "--json", NULL);
  expect_ok(&s, "simulate --tp 2");
  cr_expect_gt(json_number(s.out, "iteration_time_s"), 0);
  run_clear(&s);
}

/* tests/data/onnx/make-patterns.py: PyTorch's gelu(approximate="tanh") (exported with
 * x * x * x) is one GELU and RMSNorm written as x / sqrt(...) one rmsnorm, so the
 * parameters are the two linears' and the norm's, (16 x 64 + 64) + (64 x 16 + 16) + 16 =
 * 2,144, in four operators after the input; a ReduceMean outside RMSNorm is refused naming its node. */
Test(onnx, written_out_patterns_become_one_operator_and_others_are_refused)
{
  need_onnx();
  g_autofree char *f = onnx_file("gelu-rmsnorm.onnx");
  cr_expect_eq(model_parameters(f, "batch=2"), 16 * 64 + 64 + 64 * 16 + 16 + 16);
  Run r = run("model", "show", f, "-p", "batch=2", "--json", NULL);
  expect_ok(&r, "show");
  cr_expect_eq(json_number(r.out, "ops"), 5, "%s", r.out);
  cr_expect(strstr(r.out, "\"type\" : \"rmsnorm\"") != NULL, "%s", r.out);
  run_clear(&r);
  g_autofree char *bad = onnx_file("reducemean.onnx");
  expect_refused(run("model", "show", bad, "-p", "batch=2", NULL),
                 "node '/ReduceMean' (ReduceMean): operator ReduceMean is not supported");
}

/* tests/data/onnx/make-vision.py: a 1-D CNN.  Conv1d is a 1 x k conv2d between reshapes
 * with the same weights: (16 x 5 x 32 + 32) + 2 x 32 (batch norm) + 64 x 16 x 3 (two groups,
 * no bias) + (64 x 10 + 10) = 6,378 parameters, and at batch 1 the multiply-adds of
 * 32 x 100 x 16 x 5 + 64 x 23 x 16 x 3 + 10 x 64 = 327,296: MaxPool1d(3, 2, ceil_mode)
 * takes 100 positions to 50 (49 without ceil mode), the strided, dilated convolution those
 * to (50 - 4 - 1) / 2 + 1 = 23.  ReLU6 (a Clip to [0, 6]) is a relu6 unary. */
Test(onnx, conv1d_ceil_mode_pooling_and_relu6)
{
  need_onnx();
  g_autofree char *f = onnx_file("conv1d.onnx");
  cr_expect_eq(model_parameters(f, "batch=1"), 6378);
  Run r = run("model", "export", f, "-p", "batch=1", NULL);
  expect_ok(&r, "export");
  cr_expect(strstr(r.out, "\"kind\": \"relu6\"") != NULL, "%s", r.out);
  cr_expect(strstr(r.out, "\"ceil_mode\": true") != NULL, "%s", r.out);
  run_clear(&r);
  Run s = run("model", "show", f, "-p", "batch=1", NULL);
  expect_ok(&s, "show");
  cr_expect(strstr(s.out, "[1, 32, 1, 50]") != NULL, "%s", s.out);
  cr_expect(strstr(s.out, "[1, 64, 23]") != NULL, "%s", s.out);
  /* The multiply-adds: conv2d and linear FLOPs are 2 per multiply-add. */
  cr_expect(strstr(s.out, "c1/Conv                  conv2d     [1, 32, 1, 100]          2592"
                          "        512.00 k") != NULL, "%s", s.out);
  cr_expect(strstr(s.out, "c2/Conv                  conv2d     [1, 64, 1, 23]           3072"
                          "        141.31 k") != NULL, "%s", s.out);
  run_clear(&s);
  cr_expect_gt(predicted(f, "batch=64"), 0);
}

/* tests/data/onnx/make-vision.py: torchvision's VisionTransformer at 32 x 32, patches of 8,
 * one layer of width 32.  Its class token (1 x 1 x 32, expanded over the batch) and
 * position embedding (1 x 17 x 32, added to the patches) are learned tensors used as
 * data: embeddings of their rows, so the parameters are PyTorch's 15,690 = 6,176 (patch
 * convolution) + 32 + 544 + 3 x 64 (layer norms) + 4,224 (attention) + 2,112 + 2,080
 * (MLP) + 330 (head); they split over the samples, so data and pipeline parallel plans
 * run. */
Test(onnx, vit_class_token_and_position_embedding_are_parameters)
{
  need_onnx();
  g_autofree char *f = onnx_file("vit-tiny.onnx");
  cr_expect_eq(model_parameters(f, "batch=2"), 15690);
  Run r = run("model", "show", f, "-p", "batch=16", NULL);
  expect_ok(&r, "show");
  cr_expect_eq(ops_of_type(r.out, "embedding"), 2, "%s", r.out);
  cr_expect(strstr(r.out, "[16, 1, 32]") && strstr(r.out, "[16, 17, 32]"), "%s", r.out);
  cr_expect_eq(ops_of_type(r.out, "attention"), 1, "%s", r.out);
  run_clear(&r);
  cr_expect_gt(predicted(f, "batch=16"), 0);
  Run p = run("simulate", "-m", f, "-p", "batch=16", "-x", "dgx-a100", "--pp", "2", "--json",
              NULL);
  expect_ok(&p, "simulate --pp 2");
  cr_expect_gt(json_number(p.out, "iteration_time_s"), 0);
  run_clear(&p);
}

/* tests/data/onnx/make-attention.py: grouped-query attention written out (4 query heads of
 * 16 over 2 key and value heads, repeated by expand and reshape) keeps its projections'
 * 64 x 64 + 2 x (64 x 32) + 64 x 64 = 12,288 parameters; each expand is a concat of 2
 * copies, the copy PyTorch's reshape makes, and the score products run over the 4 heads:
 * 2 x 4 x 8 x 8 x 16 = 8,192 FLOPs each at batch 1 and sequence 8.  A
 * MultiheadAttention under a key padding mask [batch, seq] is one attention operator with
 * its 3 x 64 x 64 + 3 x 64 + 64 x 64 + 64 = 16,640 parameters. */
Test(onnx, grouped_query_attention_and_key_padding_mask)
{
  need_onnx();
  g_autofree char *g = onnx_file("gqa.onnx");
  cr_expect_eq(model_parameters(g, "batch=1,seq=8"), 12288);
  Run r = run("model", "show", g, "-p", "batch=1,seq=8", NULL);
  expect_ok(&r, "show");
  cr_expect_eq(ops_of_type(r.out, "concat"), 2, "%s", r.out);
  cr_expect(strstr(r.out, "[1, 2, 2, 8, 16]") != NULL, "%s", r.out);
  cr_expect(strstr(r.out, "matmul     [1, 4, 8, 8]                 0          8.19 k") != NULL,
            "%s", r.out);
  run_clear(&r);
  cr_expect_gt(predicted(g, "batch=16,seq=128"), 0);
  g_autofree char *m = onnx_file("padding-mask.onnx");
  cr_expect_eq(model_parameters(m, "batch=4,seq=16"), 16640);
  Run s = run("model", "show", m, "-p", "batch=4,seq=16", NULL);
  expect_ok(&s, "show");
  cr_expect_eq(ops_of_type(s.out, "attention"), 1, "%s", s.out);
  cr_expect_eq(ops_of_type(s.out, "input"), 2, "%s", s.out);
  run_clear(&s);
  cr_expect_gt(predicted(m, "batch=16,seq=128"), 0);
}
