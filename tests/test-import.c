/* test-import.c — bringing models in and out of parasol, through the program
 * (PARASOL_BIN): the example files of examples/ load and take effect, `parasol model
 * export` writes graphs that read back, graph files take --param batch, and the graph
 * reader refuses what it does not know with exit status 2. */
#include <criterion/criterion.h>
#include <glib.h>
#include <glib/gstdio.h>
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
  expect_refused(run("model", "show", op, NULL), "unknown key \"chekpoint\"");
  g_autofree char *attr = write_temp(dir, "attr.json",
    "{\"format\": \"parasol-graph\", \"version\": 1, \"ops\": [{\"name\": \"x\", "
    "\"type\": \"input\", \"attrs\": {\"shape\": [4, 8], \"dtpye\": \"fp16\"}}]}");
  expect_refused(run("model", "show", attr, NULL), "dtpye");
  g_unlink(top);
  g_unlink(op);
  g_unlink(attr);
  g_rmdir(dir);
}
