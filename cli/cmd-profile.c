/* cmd-profile.c — `parasol profile`: measures operator shards and collectives into a
 * profile database, imports collective timings measured elsewhere, fits the roofline
 * and collective models to a database, compares predictions with measurements, and
 * reports achieved GFLOP/s and GB/s per kernel (perf). */
#include "cli.h"
#include "sim-options.h"
#include "parasol-profile.h"

#include <json-glib/json-glib.h>
#include <math.h>
#include <string.h>

static void profile_usage(FILE *out)
{
  fprintf(out,
          "Usage: parasol profile COMMAND [OPTIONS]\n\n"
          "Commands:\n"
          "  ops           measure every distinct operator shard of a model on a machine\n"
          "  collectives   measure NCCL collectives over the GPUs of this host\n"
          "  import-nccl   read NCCL tests' CSV files into collective entries\n"
          "  calibrate     fit the roofline efficiencies and the ring collective model\n"
          "  compare       predicted against measured time of every operator shard\n"
          "  perf          GFLOP/s and GB/s of every operator shard, as CSV\n"
          "  show          summarize a profile database\n\n"
          "Run 'parasol profile COMMAND --help' for the options of a command.\n");
}

static int profile_error(GError *error)
{
  /* A device that fails is a failure of the work; everything else is bad input. */
  if (error && error->domain == PROFILE_ERROR &&
      (error->code == PROFILE_ERROR_DEVICE || error->code == PROFILE_ERROR_NO_MEMORY)) {
    g_printerr("parasol: %s\n", error->message);
    g_error_free(error);
    return CLI_EXIT_FAILURE;
  }
  return cli_report_error(error);
}

/* ---------------------------------------------------------------------------------- */
/* Options shared by the commands that measure a model                                */

typedef struct {
  char *model, *machine, *precision, *microbatches, *backend, *gpu, *attention;
  char **params;
  int device, warmup, repetitions, max_shapes;
  double min_ms;
  gboolean no_backward, update;
} ModelOptions;

static void model_options_init(ModelOptions *o)
{
  memset(o, 0, sizeof *o);
  o->warmup = -1;
  o->repetitions = -1;
}

static void model_options_clear(ModelOptions *o)
{
  g_free(o->model);
  g_free(o->machine);
  g_free(o->precision);
  g_free(o->microbatches);
  g_free(o->backend);
  g_free(o->gpu);
  g_free(o->attention);
  g_strfreev(o->params);
}

static gboolean non_negative(double v)
{
  return v >= 0;
}

/* --max-shapes and --repetitions (1 or more), --device and --warmup (0 or more), --min-ms
 * (0 or more, a real number). */
static gboolean parse_measure_number(const char *name, const char *value, gpointer data,
                                     GError **error)
{
  ModelOptions *o = data;
  if (g_str_equal(name, "--min-ms"))
    return cli_option_real(name, value, non_negative, "milliseconds, 0 or more", &o->min_ms,
                           error);
  int lo = g_str_equal(name, "--max-shapes") || g_str_equal(name, "--repetitions") ? 1 : 0;
  gint64 v;
  if (!cli_option_int(name, value, lo, G_MAXINT, &v, error))
    return FALSE;
  if (g_str_equal(name, "--max-shapes"))
    o->max_shapes = (int)v;
  else if (g_str_equal(name, "--device"))
    o->device = (int)v;
  else if (g_str_equal(name, "--warmup"))
    o->warmup = (int)v;
  else
    o->repetitions = (int)v;
  return TRUE;
}

static GOptionGroup *model_option_group(ModelOptions *o)
{
  GOptionEntry entries[] = {
    { "model", 'm', 0, G_OPTION_ARG_STRING, &o->model, "Zoo model or graph file (default " CLI_DEFAULT_MODEL ")", "M" },
    { "param", 'p', 0, G_OPTION_ARG_STRING_ARRAY, &o->params, "Model parameter k=v (repeatable)", "K=V" },
    { "precision", 0, 0, G_OPTION_ARG_STRING, &o->precision, "fp16 (default), bf16 or fp32: the dtype the model computes in", "P" },
    { "attention", 0, 0, G_OPTION_ARG_STRING, &o->attention, "The attention kernels: fused, unfused, megatron or flash (default: the model's)", "K" },
    { "machine", 'x', 0, G_OPTION_ARG_STRING, &o->machine, "Machine whose device count bounds the degrees (default h200-1)", "X" },
    { "microbatches", 0, 0, G_OPTION_ARG_STRING, &o->microbatches, "Micro-batch counts to cover, e.g. 1,2,4 (default 1)", "LIST" },
    { "max-shapes", 0, 0, G_OPTION_ARG_CALLBACK, parse_measure_number, "Stop after this many distinct shapes", "N" },
    { "backend", 'b', 0, G_OPTION_ARG_STRING, &o->backend, "cuda (default when built with it) or cpu", "B" },
    { "device", 0, 0, G_OPTION_ARG_CALLBACK, parse_measure_number, "GPU to measure on (default 0)", "N" },
    { "gpu", 0, 0, G_OPTION_ARG_STRING, &o->gpu, "Device name to file entries under (default: from the GPU's name, or cpu)", "NAME" },
    { "warmup", 0, 0, G_OPTION_ARG_CALLBACK, parse_measure_number, "Untimed runs first (default 3)", "N" },
    { "repetitions", 'r', 0, G_OPTION_ARG_CALLBACK, parse_measure_number, "Timed runs (default 10)", "N" },
    { "min-ms", 0, 0, G_OPTION_ARG_CALLBACK, parse_measure_number, "Repeat until this many milliseconds are timed", "MS" },
    { "no-backward", 0, 0, G_OPTION_ARG_NONE, &o->no_backward, "Measure the forward pass only", NULL },
    { "update", 0, 0, G_OPTION_ARG_NONE, &o->update, "Also measure the weight update", NULL },
    { NULL },
  };
  GOptionGroup *g = g_option_group_new("model", "Model, machine and measurement options:",
                                       "Show the model and measurement options", o, NULL);
  g_option_group_add_entries(g, entries);
  return g;
}

static gboolean parse_int_list(const char *text, const char *what, GArray *out, GError **error)
{
  g_auto(GStrv) parts = g_strsplit(text, ",", -1);
  for (int i = 0; parts[i]; i++) {
    char *end = NULL;
    gint64 v = g_ascii_strtoll(g_strstrip(parts[i]), &end, 10);
    if (end == parts[i] || *end || v < 1 || v > G_MAXINT) {
      g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                  "%s: '%s' is not a positive integer", what, parts[i]);
      return FALSE;
    }
    int iv = (int)v;
    g_array_append_val(out, iv);
  }
  return TRUE;
}

/* The model in the precision the options ask for. */
static SimGraph *load_model(const ModelOptions *o, GError **error)
{
  SimDType dt = SIM_DTYPE_FP16;
  if (o->precision) {
    if (!strcmp(o->precision, "fp16") || !strcmp(o->precision, "mixed-fp16"))
      dt = SIM_DTYPE_FP16;
    else if (!strcmp(o->precision, "bf16") || !strcmp(o->precision, "mixed-bf16"))
      dt = SIM_DTYPE_BF16;
    else if (!strcmp(o->precision, "fp32"))
      dt = SIM_DTYPE_FP32;
    else {
      g_set_error(error, SIM_ERROR, SIM_ERROR_UNKNOWN,
                  "--precision: unknown '%s'; expected fp16, bf16 or fp32", o->precision);
      return NULL;
    }
  }
  int kernel = -1;
  if (o->attention && (kernel = sim_attention_kernel_from_name(o->attention)) < 0) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_UNKNOWN,
                "--attention: unknown '%s'; expected flash, fused, unfused or megatron",
                o->attention);
    return NULL;
  }
  SimGraph *g = cli_load_model(o->model ? o->model : CLI_DEFAULT_MODEL, o->params, error);
  if (g)
    sim_graph_set_float_dtype(g, dt);
  if (g && kernel >= 0)
    sim_graph_set_attention_kernel(g, (SimAttentionKernel)kernel);
  return g;
}

static ProfileShapes *enumerate(const ModelOptions *o, const SimGraph *g, GError **error)
{
  SimMachine *m = sim_machine_load(o->machine ? o->machine : "h200-1", error);
  if (!m)
    return NULL;
  g_autoptr(GArray) mbs = g_array_new(FALSE, FALSE, sizeof(int));
  if (o->microbatches && !parse_int_list(o->microbatches, "--microbatches", mbs, error)) {
    sim_machine_free(m);
    return NULL;
  }
  ProfileEnumerateOptions eo = {
    .n_devices = sim_machine_n_devices(m),
    .microbatches = (const int *)mbs->data,
    .n_microbatches = (int)mbs->len,
    .max_shapes = MAX(o->max_shapes, 0),
  };
  ProfileShapes *s = profile_enumerate_shapes(g, &eo);
  sim_machine_free(m);
  return s;
}

static ProfileRunner *make_runner(const ModelOptions *o, GError **error)
{
  const char *b = o->backend ? o->backend : (profile_have_cuda() ? "cuda" : "cpu");
  if (!strcmp(b, "cpu"))
    return profile_runner_cpu_new(o->gpu);
  if (!strcmp(b, "cuda"))
    return profile_runner_cuda_new(o->device, o->gpu, error);
  g_set_error(error, SIM_ERROR, SIM_ERROR_UNKNOWN, "--backend: unknown '%s'; expected cuda or cpu",
              b);
  return NULL;
}

static ProfileMeasureOptions measure_options(const ModelOptions *o)
{
  ProfileMeasureOptions mo = profile_measure_options_default();
  if (o->warmup >= 0)
    mo.warmup = o->warmup;
  if (o->repetitions > 0)
    mo.repetitions = o->repetitions;
  mo.min_seconds = MAX(o->min_ms, 0.0) * 1e-3;
  mo.backward = !o->no_backward;
  mo.update = o->update;
  return mo;
}

/* @user_data, if given, is an int that keeps the number of shapes done. */
static void progress(int done, int total, const char *key, gpointer user_data)
{
  if (user_data)
    *(int *)user_data = done;
  if (cli_stderr_is_tty())
    g_printerr("\r%d/%d shapes measured", done, total);
  if (done == total && cli_stderr_is_tty())
    g_printerr("\n");
}

/* The device spec the roofline predicts with: device 0 of --machine when given, else the
 * device library's entry for @gpu. */
static const SimDeviceSpec *spec_for(const char *machine, const char *gpu, SimMachine **keep,
                                     GError **error)
{
  if (machine) {
    SimMachine *m = sim_machine_load(machine, error);
    if (!m)
      return NULL;
    *keep = m;
    return sim_machine_device_spec(m, 0);
  }
  const SimDeviceSpec *s = gpu ? sim_device_library_lookup(gpu) : NULL;
  if (!s)
    g_set_error(error, SIM_ERROR, SIM_ERROR_UNKNOWN,
                "no device spec for '%s'; give --machine with a device of its figures",
                gpu ? gpu : "(none)");
  return s;
}

/* ---------------------------------------------------------------------------------- */
/* parasol profile ops                                                                 */

static int ops_run(ModelOptions *mo, int argc, char **argv)
{
  g_autofree char *output = NULL;
  gboolean list = FALSE, merge = FALSE, json = FALSE;
  GOptionEntry entries[] = {
    { "output", 'o', 0, G_OPTION_ARG_FILENAME, &output, "Write the database here (required unless --list)", "FILE" },
    { "json", 0, 0, G_OPTION_ARG_NONE, &json, "Print the shapes (--list) or what was measured as JSON", NULL },
    { "merge", 0, 0, G_OPTION_ARG_NONE, &merge, "Keep the entries already in --output", NULL },
    { "list", 0, 0, G_OPTION_ARG_NONE, &list, "Only list the distinct shapes", NULL },
    { NULL },
  };
  g_set_prgname("parasol profile ops");
  g_autoptr(GOptionContext) ctx = g_option_context_new("- measure the operator shards of a model");
  g_option_context_set_summary(ctx,
    "Measures the forward and backward time of every distinct operator shard a model can\n"
    "take on a machine (every degree over its splittable dimensions whose product divides\n"
    "the device count), with warm-up and repetitions, and writes their medians to a\n"
    "profile database (data/profiles/README.md).");
  g_option_context_add_main_entries(ctx, entries, NULL);
  g_option_context_add_group(ctx, model_option_group(mo));
  if (!cli_parse_options(ctx, &argc, &argv))
    return CLI_EXIT_USAGE;
  if (argc > 1)
    return cli_usage_error("profile ops", "unexpected argument '%s'", argv[1]);
  if (!list && !output)
    return cli_usage_error("profile ops", "--output FILE is required");
  GError *error = NULL;
  g_autoptr(SimGraph) g = load_model(mo, &error);
  if (!g)
    return cli_report_error(error);
  g_autoptr(ProfileShapes) shapes = enumerate(mo, g, &error);
  if (!shapes)
    return cli_report_error(error);
  if (list && json) {
    g_autoptr(JsonBuilder) b = json_builder_new();
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "configurations");
    json_builder_add_int_value(b, profile_shapes_n_configs(shapes));
    json_builder_set_member_name(b, "shapes");
    json_builder_begin_array(b);
    for (int i = 0; i < profile_shapes_n(shapes); i++) {
      json_builder_begin_object(b);
      json_builder_set_member_name(b, "op");
      json_builder_add_string_value(b, sim_graph_op_name(g, profile_shapes_op(shapes, i)));
      json_builder_set_member_name(b, "key");
      json_builder_add_string_value(b, profile_shapes_key(shapes, i));
      json_builder_end_object(b);
    }
    json_builder_end_array(b);
    json_builder_end_object(b);
    cli_print_json(b);
    return CLI_EXIT_OK;
  }
  if (list) {
    for (int i = 0; i < profile_shapes_n(shapes); i++)
      printf("%-24s %s\n", sim_graph_op_name(g, profile_shapes_op(shapes, i)),
             profile_shapes_key(shapes, i));
    g_printerr("parasol: %d distinct shapes for %d operator configurations\n",
               profile_shapes_n(shapes), profile_shapes_n_configs(shapes));
    return CLI_EXIT_OK;
  }
  g_autoptr(ProfileDb) db = NULL;
  if (merge && g_file_test(output, G_FILE_TEST_EXISTS)) {
    if (!(db = profile_db_load(output, &error)))
      return cli_report_error(error);
  } else {
    db = profile_db_new();
  }
  g_autoptr(ProfileRunner) r = make_runner(mo, &error);
  if (!r)
    return profile_error(error);
  ProfileMeasureOptions meas = measure_options(mo);
  g_printerr("parasol: measuring %d distinct shapes of %s on %s (%s)\n", profile_shapes_n(shapes),
             sim_graph_get_name(g), profile_runner_device_name(r), r->klass->name);
  int skipped = 0, done = 0;
  /* Ctrl-C ends the measurement and keeps what was measured. */
  meas.stop = cli_interrupted();
  cli_interrupt_catch();
  int added = profile_measure_shapes(r, db, g, shapes, &meas, progress, &done, &skipped, &error);
  cli_interrupt_release();
  if (added < 0)
    return profile_error(error);
  if (*meas.stop) {
    if (cli_stderr_is_tty())
      g_printerr("\n");
    g_printerr("parasol profile ops: interrupted after %d of %d shapes; keeping what was "
               "measured\n", done, profile_shapes_n(shapes));
  }
  g_autofree char *src = g_strdup_printf("parasol profile ops --model %s on %s (%s backend)",
                                         sim_graph_get_name(g), profile_runner_device_name(r),
                                         r->klass->name);
  profile_db_add_source(db, src);
  if (!cli_make_parent(output, &error) || !profile_db_save(db, output, &error))
    return profile_error(error);
  if (json) {
    g_autoptr(JsonBuilder) b = json_builder_new();
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "measured");
    json_builder_add_int_value(b, added);
    json_builder_set_member_name(b, "skipped");
    json_builder_add_int_value(b, skipped);
    json_builder_set_member_name(b, "interrupted");
    json_builder_add_boolean_value(b, *meas.stop != 0);
    json_builder_set_member_name(b, "entries");
    json_builder_add_int_value(b, profile_db_n_ops(db));
    json_builder_set_member_name(b, "output");
    json_builder_add_string_value(b, output);
    json_builder_end_object(b);
    cli_print_json(b);
  } else {
    printf("%d entries measured, %d shapes skipped; %d entries in %s\n", added, skipped,
           profile_db_n_ops(db), output);
  }
  return CLI_EXIT_OK;
}

static int profile_ops(int argc, char **argv)
{
  ModelOptions mo;
  model_options_init(&mo);
  int status = ops_run(&mo, argc, argv);
  model_options_clear(&mo);
  return status;
}

/* ---------------------------------------------------------------------------------- */
/* parasol profile collectives                                                         */

static gboolean parse_bytes(const char *text, double *out, GError **error)
{
  char *end = NULL;
  double v = g_ascii_strtod(text, &end);
  double unit = 1.0;
  if (end && *end) {
    if (!g_ascii_strcasecmp(end, "k") || !g_ascii_strcasecmp(end, "kib"))
      unit = 1024.0;
    else if (!g_ascii_strcasecmp(end, "m") || !g_ascii_strcasecmp(end, "mib"))
      unit = 1024.0 * 1024.0;
    else if (!g_ascii_strcasecmp(end, "g") || !g_ascii_strcasecmp(end, "gib"))
      unit = 1024.0 * 1024.0 * 1024.0;
    else
      v = -1.0;
  }
  if (end == text || !(v >= 1.0)) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                "'%s' is not a size in bytes (1, 64k, 16M, 1G)", text);
    return FALSE;
  }
  *out = v * unit;
  return TRUE;
}

/* --json of the commands that write collective entries: how many the database holds and
 * where it is. */
static void print_collectives_json(ProfileDb *db, const char *output)
{
  g_autoptr(JsonBuilder) b = json_builder_new();
  json_builder_begin_object(b);
  json_builder_set_member_name(b, "collective_entries");
  json_builder_add_int_value(b, profile_db_n_collectives(db));
  json_builder_set_member_name(b, "output");
  json_builder_add_string_value(b, output);
  json_builder_end_object(b);
  cli_print_json(b);
}

static int profile_collectives(int argc, char **argv)
{
  g_autofree char *output = NULL, *kinds = NULL, *gpus = NULL, *gpu = NULL;
  g_autofree char *min_s = NULL, *max_s = NULL;
  int warmup = 5, reps = 20;
  gboolean merge = FALSE, json = FALSE;
  GOptionEntry entries[] = {
    { "json", 0, 0, G_OPTION_ARG_NONE, &json, "Print what the database holds as JSON", NULL },
    { "output", 'o', 0, G_OPTION_ARG_FILENAME, &output, "Write the database here (required)", "FILE" },
    { "merge", 0, 0, G_OPTION_ARG_NONE, &merge, "Keep the entries already in --output", NULL },
    { "kinds", 'k', 0, G_OPTION_ARG_STRING, &kinds, "Collectives (default all-reduce,all-gather,reduce-scatter,send-recv)", "LIST" },
    { "gpus", 'n', 0, G_OPTION_ARG_STRING, &gpus, "GPU counts (default 2,4,8 up to those present)", "LIST" },
    { "min-bytes", 0, 0, G_OPTION_ARG_STRING, &min_s, "Smallest message (default 1M)", "SIZE" },
    { "max-bytes", 0, 0, G_OPTION_ARG_STRING, &max_s, "Largest message (default 1G)", "SIZE" },
    { "gpu", 0, 0, G_OPTION_ARG_STRING, &gpu, "Device name to file entries under", "NAME" },
    { "warmup", 0, 0, G_OPTION_ARG_INT, &warmup, "Untimed runs per size (default 5)", "N" },
    { "repetitions", 'r', 0, G_OPTION_ARG_INT, &reps, "Timed runs per size (default 20)", "N" },
    { NULL },
  };
  g_set_prgname("parasol profile collectives");
  g_autoptr(GOptionContext) ctx = g_option_context_new("- measure NCCL collectives");
  g_option_context_set_summary(ctx,
    "Measures all-reduce, all-gather, reduce-scatter and send-recv with NCCL over the\n"
    "GPUs of this host, at sizes that double from --min-bytes to --max-bytes, and writes\n"
    "their medians to a profile database.");
  g_option_context_add_main_entries(ctx, entries, NULL);
  if (!cli_parse_options(ctx, &argc, &argv))
    return CLI_EXIT_USAGE;
  if (argc > 1 || !output)
    return cli_usage_error("profile collectives", argc > 1 ? "unexpected argument" :
                           "--output FILE is required");
  if (warmup < 0 || reps < 1)
    return cli_usage_error("profile collectives", warmup < 0 ? "--warmup: expected 0 or more"
                                                             : "--repetitions: expected 1 or more");
  GError *error = NULL;
  ProfileCollOptions co = { .min_bytes = 1 << 20, .max_bytes = 1 << 30, .warmup = warmup,
                            .repetitions = reps };
  if ((min_s && !parse_bytes(min_s, &co.min_bytes, &error)) ||
      (max_s && !parse_bytes(max_s, &co.max_bytes, &error)))
    return cli_report_error(error);
  g_autoptr(GArray) counts = g_array_new(FALSE, FALSE, sizeof(int));
  if (!parse_int_list(gpus ? gpus : "2,4,8", "--gpus", counts, &error))
    return cli_report_error(error);
  g_auto(GStrv) kind_names = g_strsplit(kinds ? kinds : "all-reduce,all-gather,reduce-scatter,"
                                        "send-recv", ",", -1);
  g_autoptr(ProfileDb) db = NULL;
  if (merge && g_file_test(output, G_FILE_TEST_EXISTS)) {
    if (!(db = profile_db_load(output, &error)))
      return cli_report_error(error);
  } else {
    db = profile_db_new();
  }
  int measured = 0;
  for (int i = 0; kind_names[i]; i++) {
    int k = profile_coll_kind_from_name(g_strstrip(kind_names[i]));
    if (k < 0)
      return cli_usage_error("profile collectives", "unknown collective '%s'", kind_names[i]);
    for (guint j = 0; j < counts->len; j++) {
      co.kind = (ProfileCollKind)k;
      co.n_gpus = g_array_index(counts, int, j);
      if (!profile_measure_collectives(db, gpu, &co, &error)) {
        /* Fewer GPUs than asked for ends the larger counts, not the run. */
        if (error->code == PROFILE_ERROR_INVALID && measured > 0) {
          g_printerr("parasol: %s\n", error->message);
          g_clear_error(&error);
          break;
        }
        return profile_error(error);
      }
      measured++;
    }
  }
  profile_db_add_source(db, "parasol profile collectives (NCCL)");
  if (!cli_make_parent(output, &error) || !profile_db_save(db, output, &error))
    return profile_error(error);
  if (json)
    print_collectives_json(db, output);
  else
    printf("%d collective entries in %s\n", profile_db_n_collectives(db), output);
  return CLI_EXIT_OK;
}

/* ---------------------------------------------------------------------------------- */
/* parasol profile import-nccl                                                         */

static int profile_import_nccl(int argc, char **argv)
{
  g_autofree char *output = NULL, *gpu = NULL, *source = NULL, *description = NULL;
  g_auto(GStrv) notes = NULL;
  gboolean merge = FALSE, json = FALSE;
  GOptionEntry entries[] = {
    { "json", 0, 0, G_OPTION_ARG_NONE, &json, "Print what the database holds as JSON", NULL },
    { "gpu", 0, 0, G_OPTION_ARG_STRING, &gpu, "Device name of the measurements (required), e.g. a100-80gb", "NAME" },
    { "output", 'o', 0, G_OPTION_ARG_FILENAME, &output, "Write the database here (required)", "FILE" },
    { "source", 0, 0, G_OPTION_ARG_STRING, &source, "Where the measurements come from, for the database", "TEXT" },
    { "description", 0, 0, G_OPTION_ARG_STRING, &description, "One line on what the database holds", "TEXT" },
    { "note", 0, 0, G_OPTION_ARG_STRING_ARRAY, &notes, "A note on the device, name=value (repeatable)", "K=V" },
    { "merge", 0, 0, G_OPTION_ARG_NONE, &merge, "Keep the entries already in --output", NULL },
    { NULL },
  };
  g_set_prgname("parasol profile import-nccl");
  g_autoptr(GOptionContext) ctx = g_option_context_new("DIR - import NCCL tests' CSV files");
  g_option_context_set_summary(ctx,
    "Reads the CSV files of NCCL's tests in DIR, one per collective and GPU count, named\n"
    "like allreduce_8gpu.csv (columns size(B), count, type, then time(ns) and busbw(GB/s)\n"
    "per repetition), into collective entries of a profile database.");
  g_option_context_add_main_entries(ctx, entries, NULL);
  if (!cli_parse_options(ctx, &argc, &argv))
    return CLI_EXIT_USAGE;
  if (argc != 2 || !gpu || !output)
    return cli_usage_error("profile import-nccl", "expected DIR, --gpu NAME and --output FILE");
  GError *error = NULL;
  g_autoptr(ProfileDb) db = NULL;
  if (merge && g_file_test(output, G_FILE_TEST_EXISTS)) {
    if (!(db = profile_db_load(output, &error)))
      return cli_report_error(error);
  } else {
    db = profile_db_new();
  }
  g_autofree char *src = source ? g_strdup(source)
                                : g_strdup_printf("NCCL tests, imported from %s", argv[1]);
  for (char **n = notes; n && *n; n++) {
    const char *eq = strchr(*n, '=');
    if (!eq || eq == *n)
      return cli_usage_error("profile import-nccl", "--note '%s': expected name=value", *n);
    g_autofree char *name = g_strndup(*n, (gsize)(eq - *n));
    profile_db_set_device_note(db, gpu, name, eq + 1);
  }
  if (!profile_db_import_nccl_tests(db, argv[1], gpu, src, &error))
    return cli_report_error(error);
  if (description)
    profile_db_set_description(db, description);
  else if (!profile_db_get_description(db))
    profile_db_set_description(db, "Collective timings measured with NCCL's tests.");
  if (!cli_make_parent(output, &error) || !profile_db_save(db, output, &error))
    return profile_error(error);
  if (json)
    print_collectives_json(db, output);
  else
    printf("%d collective entries in %s\n", profile_db_n_collectives(db), output);
  return CLI_EXIT_OK;
}

/* ---------------------------------------------------------------------------------- */
/* parasol profile calibrate                                                           */

static void print_params(const char *title, const SimRooflineParams *p, const gboolean *fitted)
{
  printf("%s\n", title);
  const char *names[] = { "gemm", "conv", "memory", "gather", "recurrent" };
  double v[] = { p->gemm_efficiency, p->conv_efficiency, p->memory_efficiency,
                 p->gather_efficiency, p->recurrent_efficiency };
  for (int i = 0; i < 5; i++)
    printf("  %-10s %.4f%s\n", names[i], v[i], fitted && !fitted[i] ? "  (no entries: kept)" : "");
}

static int profile_calibrate(int argc, char **argv)
{
  g_autofree char *db_path = NULL, *gpu = NULL, *machine = NULL;
  int worst = 10;
  gboolean json = FALSE;
  GOptionEntry entries[] = {
    { "db", 'd', 0, G_OPTION_ARG_FILENAME, &db_path, "Profile database file or directory (required)", "PATH" },
    { "gpu", 0, 0, G_OPTION_ARG_STRING, &gpu, "Device whose entries to fit (default: the only one)", "NAME" },
    { "machine", 'x', 0, G_OPTION_ARG_STRING, &machine, "Machine of the measurements: device 0's spec for the roofline, devices 0 and 1 for the collectives' links (default: the device library's spec)", "X" },
    { "worst", 0, 0, G_OPTION_ARG_INT, &worst, "List this many worst-fitting entries (default 10)", "N" },
    { "json", 0, 0, G_OPTION_ARG_NONE, &json, "Print the fit as JSON", NULL },
    { NULL },
  };
  g_set_prgname("parasol profile calibrate");
  g_autoptr(GOptionContext) ctx = g_option_context_new("- fit the models to a profile");
  g_option_context_set_summary(ctx,
    "Fits the roofline model's efficiencies to the operator entries of one device (least\n"
    "squares on log time) and the ring collectives' bandwidth efficiency and step latency\n"
    "to its collective entries, and reports the fitted values and the residuals.");
  g_option_context_add_main_entries(ctx, entries, NULL);
  if (!cli_parse_options(ctx, &argc, &argv))
    return CLI_EXIT_USAGE;
  if (argc > 1 || !db_path)
    return cli_usage_error("profile calibrate", "--db PATH is required");
  if (worst < 0)
    return cli_usage_error("profile calibrate", "--worst %d: expected 0 or more", worst);
  GError *error = NULL;
  g_autoptr(ProfileDb) db = profile_db_load(db_path, &error);
  if (!db)
    return cli_report_error(error);
  g_auto(GStrv) devices = profile_db_devices(db);
  if (!gpu) {
    if (g_strv_length(devices) != 1)
      return cli_usage_error("profile calibrate", "the database holds %u devices; name one "
                             "with --gpu", g_strv_length(devices));
    gpu = g_strdup(devices[0]);
  }
  g_autoptr(SimMachine) m = NULL;
  const SimDeviceSpec *dev = spec_for(machine, gpu, &m, &error);
  if (!dev)
    return cli_report_error(error);

  g_autoptr(JsonBuilder) jb = json_builder_new();
  json_builder_begin_object(jb);
  json_builder_set_member_name(jb, "gpu");
  json_builder_add_string_value(jb, gpu);
  gboolean any = FALSE;
  ProfileCalibration cal;
  g_autoptr(GError) cerr = NULL;
  if (profile_calibrate_roofline(db, gpu, dev, NULL, &cal, &cerr)) {
    any = TRUE;
    if (json) {
      json_builder_set_member_name(jb, "roofline");
      json_builder_begin_object(jb);
      const char *names[] = { "gemm_efficiency", "conv_efficiency", "memory_efficiency",
                              "gather_efficiency", "recurrent_efficiency" };
      double v[] = { cal.params.gemm_efficiency, cal.params.conv_efficiency,
                     cal.params.memory_efficiency, cal.params.gather_efficiency,
                     cal.params.recurrent_efficiency };
      for (int i = 0; i < 5; i++) {
        json_builder_set_member_name(jb, names[i]);
        json_builder_add_double_value(jb, v[i]);
      }
      json_builder_set_member_name(jb, "entries");
      json_builder_add_int_value(jb, cal.n_entries);
      json_builder_set_member_name(jb, "mean_abs_error_before");
      json_builder_add_double_value(jb, cal.mean_abs_error_before);
      json_builder_set_member_name(jb, "mean_abs_error_after");
      json_builder_add_double_value(jb, cal.mean_abs_error_after);
      json_builder_set_member_name(jb, "worst_error_after");
      json_builder_add_double_value(jb, cal.worst_error_after);
      json_builder_end_object(jb);
    } else {
      SimRooflineParams def = sim_roofline_params_default();
      printf("roofline fit for %s on %s (%d entries)\n", gpu, dev->vendor_name, cal.n_entries);
      print_params("default efficiencies:", &def, NULL);
      print_params("fitted efficiencies:", &cal.params, cal.fitted);
      printf("mean |error|  %.1f%% before, %.1f%% after (worst %.1f%%)\n",
             100 * cal.mean_abs_error_before, 100 * cal.mean_abs_error_after,
             100 * cal.worst_error_after);
      printf("rms log error %.3f before, %.3f after\n", cal.rms_log_before, cal.rms_log_after);
      /* The worst-fitting entries show which kernels the model misjudges. */
      int n = profile_db_n_ops(db);
      g_autofree double *res = g_new(double, MAX(n, 1));
      g_autofree int *idx = g_new(int, MAX(n, 1));
      int k = 0;
      for (int i = 0; i < n; i++) {
        if (strcmp(profile_db_op(db, i)->gpu, gpu))
          continue;
        double r = profile_calibration_residual(db, i, dev, &cal.params);
        if (isnan(r))
          continue;
        res[k] = r;
        idx[k++] = i;
      }
      for (int a = 0; a < MIN(worst, k); a++) {
        int best = a;
        for (int b = a + 1; b < k; b++)
          if (fabs(res[b]) > fabs(res[best]))
            best = b;
        double tr = res[a];
        res[a] = res[best];
        res[best] = tr;
        int ti = idx[a];
        idx[a] = idx[best];
        idx[best] = ti;
        const ProfileOpEntry *e = profile_db_op(db, idx[a]);
        g_autofree char *ts = cli_format_time(e->median);
        printf("  %+6.1f%%  %-8s %10s  %s\n", 100 * (exp(res[a]) - 1), sim_pass_name(e->pass),
               ts, e->key);
      }
    }
  }
  for (int k = 0; k < PROFILE_COLL_COUNT; k++) {
    ProfileCollFit fit;
    g_autoptr(GError) ferr = NULL;
    double bw = m && sim_machine_n_devices(m) > 1 ? sim_machine_bandwidth(m, 0, 1) : 0;
    double lat = m && sim_machine_n_devices(m) > 1 ? sim_machine_latency(m, 0, 1) : 0;
    gboolean have = FALSE;
    for (int i = 0; i < profile_db_n_collectives(db) && !have; i++) {
      const ProfileCollEntry *e = profile_db_collective(db, i);
      have = e->kind == (ProfileCollKind)k && !strcmp(e->gpu, gpu);
    }
    if (!have)
      continue;
    if (!(bw > 0)) {
      g_printerr("parasol: collective entries need --machine with 2 or more devices for "
                 "their link bandwidth\n");
      break;
    }
    if (!profile_db_fit_collective(db, gpu, (ProfileCollKind)k, bw, lat, &fit, &ferr)) {
      g_printerr("parasol: %s\n", ferr->message);
      continue;
    }
    any = TRUE;
    if (json) {
      json_builder_set_member_name(jb, profile_coll_kind_name((ProfileCollKind)k));
      json_builder_begin_object(jb);
      json_builder_set_member_name(jb, "bandwidth_efficiency");
      json_builder_add_double_value(jb, fit.bandwidth_efficiency);
      json_builder_set_member_name(jb, "step_latency_us");
      json_builder_add_double_value(jb, fit.step_latency * 1e6);
      json_builder_set_member_name(jb, "points");
      json_builder_add_int_value(jb, fit.n_points);
      json_builder_set_member_name(jb, "mean_abs_error");
      json_builder_add_double_value(jb, fit.mean_abs_error);
      json_builder_set_member_name(jb, "worst_error");
      json_builder_add_double_value(jb, fit.worst_error);
      json_builder_end_object(jb);
    } else {
      printf("%s ring fit for %s (%d points, links of %.0f GB/s and %.2f us): bandwidth "
             "efficiency %.3f, step latency %.2f us; mean |error| %.1f%%, worst %.1f%%\n",
             profile_coll_kind_name((ProfileCollKind)k), gpu, fit.n_points, bw / 1e9, lat * 1e6,
             fit.bandwidth_efficiency, fit.step_latency * 1e6, 100 * fit.mean_abs_error,
             100 * fit.worst_error);
      printf("  simulate with --coll-efficiency %.3f --coll-latency-us %.2f\n",
             fit.bandwidth_efficiency, fit.step_latency * 1e6);
    }
  }
  json_builder_end_object(jb);
  if (!any) {
    g_printerr("parasol: %s\n", cerr ? cerr->message : "nothing to fit");
    return CLI_EXIT_FAILURE;
  }
  if (json) {
    g_autoptr(JsonNode) root = json_builder_get_root(jb);
    g_autofree char *text = json_to_string(root, TRUE);
    printf("%s\n", text);
  }
  return CLI_EXIT_OK;
}

/* ---------------------------------------------------------------------------------- */
/* parasol profile compare and perf                                                    */

/* One row per (shape, pass): what the measurement gave and what each model predicts. */
static void compare_row(FILE *out, const SimGraph *g, int op, const int64_t *extent,
                        SimPass pass, double measured, const ProfileDb *db, const char *gpu,
                        const SimDeviceSpec *dev, SimCostModel *roof, SimCostModel *cal,
                        GArray *errs)
{
  g_autofree char *key = sim_graph_op_shard_key(g, op, extent);
  ProfileLookup how = PROFILE_LOOKUP_NONE;
  double from_db = db ? profile_db_lookup_op(db, gpu, g, op, extent, pass, &how) : -1.0;
  /* Leave-one-out: what interpolation alone would predict without this shard's entry. */
  double loo = -1.0;
  if (db && how == PROFILE_LOOKUP_EXACT) {
    g_autoptr(ProfileDb) rest = profile_db_new();
    for (int i = 0; i < profile_db_n_ops(db); i++) {
      const ProfileOpEntry *e = profile_db_op(db, i);
      if (!(e->pass == pass && !strcmp(e->key, key) && !strcmp(e->gpu, gpu)))
        profile_db_add_op(rest, e);
    }
    loo = profile_db_lookup_op(rest, gpu, g, op, extent, pass, NULL);
  }
  double r = dev ? sim_cost_model_op_time(roof, dev, g, op, extent, pass) : -1.0;
  double c = dev && cal ? sim_cost_model_op_time(cal, dev, g, op, extent, pass) : -1.0;
  fprintf(out, "%s,%s,\"%s\",%.6g,%.6g,%s,%.6g,%.6g,%.6g\n", sim_graph_op_name(g, op),
          sim_pass_name(pass), key, measured, from_db,
          how == PROFILE_LOOKUP_EXACT ? "exact" : how == PROFILE_LOOKUP_INTERPOLATED ? "interpolated" : "none",
          loo, r, c);
  if (errs) {
    double e[4] = { from_db > 0 ? from_db / measured - 1 : NAN, loo > 0 ? loo / measured - 1 : NAN,
                    r > 0 ? r / measured - 1 : NAN, c > 0 ? c / measured - 1 : NAN };
    g_array_append_vals(errs, e, 4);
  }
}

static int compare_doubles(const void *x, const void *y)
{
  double a = *(const double *)x, b = *(const double *)y;
  return a < b ? -1 : a > b;
}

static void summarize_errors(const GArray *errs)
{
  const char *names[] = { "profile database", "interpolation (leave one out)",
                          "roofline (default)", "roofline (calibrated)" };
  int rows = (int)errs->len / 4;
  for (int j = 0; j < 4; j++) {
    g_autofree double *a = g_new(double, MAX(rows, 1));
    int n = 0, within = 0;
    double worst = 0;
    for (int i = 0; i < rows; i++) {
      double e = g_array_index(errs, double, i * 4 + j);
      if (isnan(e))
        continue;
      a[n++] = fabs(e);
      within += fabs(e) <= 0.10;
      worst = MAX(worst, fabs(e));
    }
    if (!n)
      continue;
    qsort(a, (size_t)n, sizeof *a, compare_doubles);
    double median = n % 2 ? a[n / 2] : 0.5 * (a[n / 2 - 1] + a[n / 2]);
    g_printerr("%-32s %4d shards: median |error| %5.1f%%, within 10%%: %5.1f%%, worst %6.1f%%\n",
               names[j], n, 100 * median, 100.0 * within / n, 100 * worst);
  }
}

/* Opens @csv for writing, or gives stdout. */
/* --json on the commands that print a table: the table is written to memory and printed
 * at the end as a JSON array of objects, one per row, keyed by the header's columns
 * (numbers as numbers, the rest as strings). */
static char *table_buf;
static size_t table_len;
static gboolean table_json; /* --json of the command that prints a table */

static void add_csv_value(JsonBuilder *b, const char *v)
{
  char *end = NULL;
  double x = *v ? g_ascii_strtod(v, &end) : 0;
  if (*v && end && !*end && !isfinite(x))
    json_builder_add_null_value(b); /* JSON has no NaN: a value not computed */
  else if (*v && end && !*end)
    json_builder_add_double_value(b, x);
  else
    json_builder_add_string_value(b, v);
}

/* The fields of one CSV line (double quotes around a field that holds commas). */
static GPtrArray *csv_fields(const char *line)
{
  GPtrArray *f = g_ptr_array_new_with_free_func(g_free);
  GString *cur = g_string_new(NULL);
  gboolean quoted = FALSE;
  for (const char *c = line;; c++) {
    if (*c == '"') {
      quoted = !quoted;
    } else if ((*c == ',' && !quoted) || !*c) {
      g_ptr_array_add(f, g_string_free(cur, FALSE));
      if (!*c)
        break;
      cur = g_string_new(NULL);
    } else {
      g_string_append_c(cur, *c);
    }
  }
  return f;
}

static void print_table_json(FILE *out)
{
  fclose(out);
  g_auto(GStrv) lines = g_strsplit(table_buf ? table_buf : "", "\n", -1);
  g_autoptr(JsonBuilder) b = json_builder_new();
  json_builder_begin_array(b);
  g_autoptr(GPtrArray) head = lines[0] ? csv_fields(lines[0]) : g_ptr_array_new();
  for (int i = 1; lines[0] && lines[i]; i++) {
    if (!*lines[i])
      continue;
    g_autoptr(GPtrArray) f = csv_fields(lines[i]);
    json_builder_begin_object(b);
    for (guint k = 0; k < f->len && k < head->len; k++) {
      json_builder_set_member_name(b, g_ptr_array_index(head, k));
      add_csv_value(b, g_ptr_array_index(f, k));
    }
    json_builder_end_object(b);
  }
  json_builder_end_array(b);
  cli_print_json(b);
  g_clear_pointer(&table_buf, free);
}

static FILE *open_table(const char *csv, gboolean json, GError **error)
{
  if (json) {
    if (csv) {
      g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID, "--json and --csv: give one of them");
      return NULL;
    }
    return open_memstream(&table_buf, &table_len);
  }
  if (!csv)
    return stdout;
  if (!cli_make_parent(csv, error))
    return NULL;
  FILE *f = fopen(csv, "w");
  if (!f)
    g_set_error(error, SIM_ERROR, SIM_ERROR_IO, "cannot write %s", csv);
  return f;
}

static int compare_run(ModelOptions *mo, int argc, char **argv, FILE **out)
{
  g_autofree char *db_path = NULL, *csv = NULL, *spec_machine = NULL, *calibration = NULL;
  gboolean no_measure = FALSE;
  GOptionEntry entries[] = {
    { "db", 'd', 0, G_OPTION_ARG_FILENAME, &db_path, "Profile database file or directory", "PATH" },
    { "calibration", 0, 0, G_OPTION_ARG_FILENAME, &calibration, "Price the roofline column with this calibration file's parameters (data/calibration/), in the model's precision", "FILE" },
    { "csv", 0, 0, G_OPTION_ARG_FILENAME, &csv, "Write the table here (default: stdout)", "FILE" },
    { "spec", 0, 0, G_OPTION_ARG_STRING, &spec_machine, "Machine whose device 0 spec the roofline uses (default: the device library's)", "X" },
    { "no-measure", 0, 0, G_OPTION_ARG_NONE, &no_measure, "Take the database's medians as the measurements", NULL },
    { "json", 0, 0, G_OPTION_ARG_NONE, &table_json, "Print the table as JSON (an object per row)", NULL },
    { NULL },
  };
  g_set_prgname("parasol profile compare");
  g_autoptr(GOptionContext) ctx = g_option_context_new("- predicted against measured times");
  g_option_context_set_summary(ctx,
    "Measures every distinct shard of a model again (or, with --no-measure, takes the\n"
    "database's medians) and writes a CSV of the measured time against the predictions:\n"
    "the database (exact or interpolated), interpolation with the shard's own entry left\n"
    "out, the default roofline and the roofline calibrated to the database.  A summary\n"
    "of the errors goes to stderr.");
  g_option_context_add_main_entries(ctx, entries, NULL);
  g_option_context_add_group(ctx, model_option_group(mo));
  if (!cli_parse_options(ctx, &argc, &argv))
    return CLI_EXIT_USAGE;
  if (argc > 1)
    return cli_usage_error("profile compare", "unexpected argument '%s'", argv[1]);
  if (no_measure && !db_path)
    return cli_usage_error("profile compare", "--no-measure needs --db");
  GError *error = NULL;
  g_autoptr(SimGraph) g = load_model(mo, &error);
  if (!g)
    return cli_report_error(error);
  g_autoptr(ProfileShapes) shapes = enumerate(mo, g, &error);
  if (!shapes)
    return cli_report_error(error);
  g_autoptr(ProfileDb) db = NULL;
  if (db_path && !(db = profile_db_load(db_path, &error)))
    return cli_report_error(error);
  g_autoptr(ProfileRunner) r = NULL;
  if (!no_measure && !(r = make_runner(mo, &error)))
    return profile_error(error);
  g_autofree char *gpu = g_strdup(r ? profile_runner_device_name(r) : mo->gpu);
  if (!gpu) {
    g_auto(GStrv) devs = profile_db_devices(db);
    if (g_strv_length(devs) != 1)
      return cli_usage_error("profile compare", "name the device with --gpu");
    gpu = g_strdup(devs[0]);
  }
  g_autoptr(SimMachine) sm = NULL;
  g_autoptr(GError) serr = NULL;
  const SimDeviceSpec *dev = spec_for(spec_machine, gpu, &sm, &serr);
  if (!dev)
    g_printerr("parasol: %s; the roofline columns stay empty\n", serr->message);
  SimRooflineParams rp = sim_roofline_params_default();
  if (calibration) {
    g_auto(CliPlanOptions) po;
    cli_plan_options_init(&po);
    SimPrecision prec = mo->precision && !strcmp(mo->precision, "fp32")
                          ? SIM_PRECISION_FP32 : SIM_PRECISION_MIXED_FP16;
    if (!cli_plan_apply_calibration(&po, calibration, &error) ||
        !cli_plan_roofline_params(&po, prec, &rp, &error))
      return cli_report_error(error);
  }
  g_autoptr(SimCostModel) roof = sim_cost_model_new_roofline(&rp);
  g_autoptr(SimCostModel) cal = NULL;
  ProfileCalibration fit;
  if (dev && db && profile_calibrate_roofline(db, gpu, dev, NULL, &fit, NULL))
    cal = sim_cost_model_new_roofline(&fit.params);
  if (!(*out = open_table(csv, table_json, &error)))
    return cli_report_error(error);
  fprintf(*out, "op,pass,key,measured_s,profile_s,profile_lookup,interpolated_loo_s,"
                "roofline_s,roofline_calibrated_s\n");
  ProfileMeasureOptions meas = measure_options(mo);
  g_autoptr(ProfileDb) fresh = profile_db_new();
  g_autoptr(GArray) errs = g_array_new(FALSE, FALSE, sizeof(double));
  /* Ctrl-C ends the comparison with the rows written so far and their summary. */
  meas.stop = cli_interrupted();
  cli_interrupt_catch();
  for (int i = 0; i < profile_shapes_n(shapes) && !*meas.stop; i++) {
    int op = profile_shapes_op(shapes, i);
    const int64_t *extent = profile_shapes_extent(shapes, i);
    for (int p = 0; p < (meas.backward ? 2 : 1); p++) {
      SimWork w = { 0 };
      sim_graph_op_work(g, op, extent, (SimPass)p, &w);
      if (w.n == 0)
        continue;
      double measured;
      if (r) {
        g_autoptr(GError) merr = NULL;
        const ProfileOpEntry *e = profile_measure_op(r, fresh, g, op, extent, (SimPass)p, &meas,
                                                     &merr);
        if (!e && merr->code == PROFILE_ERROR_INTERRUPTED)
          break;
        if (!e) {
          if (merr->code == PROFILE_ERROR_DEVICE) {
            cli_interrupt_release();
            return profile_error(g_steal_pointer(&merr));
          }
          g_printerr("parasol: skipping %s: %s\n", profile_shapes_key(shapes, i), merr->message);
          continue;
        }
        measured = e->median;
      } else {
        g_autofree char *key = sim_graph_op_shard_key(g, op, extent);
        const ProfileOpEntry *e = profile_db_find_op(db, gpu, key, (SimPass)p);
        if (!e)
          continue;
        measured = e->median;
      }
      compare_row(*out, g, op, extent, (SimPass)p, measured, db, gpu, dev, roof, cal, errs);
    }
  }
  cli_interrupt_release();
  if (*meas.stop)
    g_printerr("parasol profile compare: interrupted; the rows so far are written\n");
  summarize_errors(errs);
  return CLI_EXIT_OK;
}

static int profile_compare(int argc, char **argv)
{
  ModelOptions mo;
  model_options_init(&mo);
  FILE *out = NULL;
  int status = compare_run(&mo, argc, argv, &out);
  GError *error = NULL;
  if (out && table_json) {
    if (status == CLI_EXIT_OK) {
      print_table_json(out);
    } else {
      fclose(out);
      g_clear_pointer(&table_buf, free);
    }
  } else if (out && out != stdout && !cli_close_output(out, "the --csv file", &error)) {
    status = MAX(status, cli_report_error(error));
  }
  model_options_clear(&mo);
  return status;
}

static int perf_run(ModelOptions *mo, int argc, char **argv, FILE **out)
{
  g_autofree char *csv = NULL, *spec_machine = NULL;
  double budget_ms = 100;
  GOptionEntry entries[] = {
    { "csv", 0, 0, G_OPTION_ARG_FILENAME, &csv, "Write the table here (default: stdout)", "FILE" },
    { "budget-ms", 0, 0, G_OPTION_ARG_DOUBLE, &budget_ms, "Time each case for this long (default 100)", "MS" },
    { "spec", 0, 0, G_OPTION_ARG_STRING, &spec_machine, "Machine whose device 0 spec the roofline uses", "X" },
    { "json", 0, 0, G_OPTION_ARG_NONE, &table_json, "Print the table as JSON (an object per row)", NULL },
    { NULL },
  };
  g_set_prgname("parasol profile perf");
  g_autoptr(GOptionContext) ctx = g_option_context_new("- achieved GFLOP/s and GB/s");
  g_option_context_set_summary(ctx,
    "Runs every distinct shard of a model until a time budget is spent and writes, per\n"
    "shard and pass, the median time, the achieved GFLOP/s and GB/s of its work, and the\n"
    "roofline model's time, as CSV.");
  g_option_context_add_main_entries(ctx, entries, NULL);
  g_option_context_add_group(ctx, model_option_group(mo));
  if (!cli_parse_options(ctx, &argc, &argv))
    return CLI_EXIT_USAGE;
  if (argc > 1 || !(budget_ms > 0))
    return cli_usage_error("profile perf", "expected a positive --budget-ms and no arguments");
  GError *error = NULL;
  g_autoptr(SimGraph) g = load_model(mo, &error);
  if (!g)
    return cli_report_error(error);
  g_autoptr(ProfileShapes) shapes = enumerate(mo, g, &error);
  if (!shapes)
    return cli_report_error(error);
  g_autoptr(ProfileRunner) r = make_runner(mo, &error);
  if (!r)
    return profile_error(error);
  g_autoptr(SimMachine) sm = NULL;
  const SimDeviceSpec *dev = spec_for(spec_machine, profile_runner_device_name(r), &sm, NULL);
  g_autoptr(SimCostModel) roof = sim_cost_model_new_roofline(NULL);
  if (!(*out = open_table(csv, table_json, &error)))
    return cli_report_error(error);
  fprintf(*out, "backend,device,op,pass,key,runs,median_us,gflop,mbytes,gflops,gbps,roofline_us\n");
  ProfileMeasureOptions meas = measure_options(mo);
  meas.min_seconds = budget_ms * 1e-3;
  meas.max_repetitions = 100000;
  g_autoptr(ProfileDb) db = profile_db_new();
  /* Ctrl-C ends the table with the rows written so far. */
  meas.stop = cli_interrupted();
  cli_interrupt_catch();
  for (int i = 0; i < profile_shapes_n(shapes) && !*meas.stop; i++) {
    int op = profile_shapes_op(shapes, i);
    const int64_t *extent = profile_shapes_extent(shapes, i);
    for (int p = 0; p < (meas.backward ? 2 : 1); p++) {
      SimWork w = { 0 };
      sim_graph_op_work(g, op, extent, (SimPass)p, &w);
      if (w.n == 0)
        continue;
      g_autoptr(GError) merr = NULL;
      const ProfileOpEntry *e = profile_measure_op(r, db, g, op, extent, (SimPass)p, &meas, &merr);
      if (!e && merr->code == PROFILE_ERROR_INTERRUPTED)
        break;
      if (!e) {
        if (merr->code == PROFILE_ERROR_DEVICE) {
          cli_interrupt_release();
          return profile_error(g_steal_pointer(&merr));
        }
        g_printerr("parasol: skipping %s: %s\n", profile_shapes_key(shapes, i), merr->message);
        continue;
      }
      double rt = dev ? sim_cost_model_op_time(roof, dev, g, op, extent, (SimPass)p) : NAN;
      fprintf(*out, "%s,%s,%s,%s,\"%s\",%d,%.3f,%.6g,%.6g,%.2f,%.2f,%.3f\n", r->klass->name,
              e->gpu, sim_graph_op_name(g, op), sim_pass_name(e->pass), e->key, e->repetitions,
              e->median * 1e6, e->flops * 1e-9, e->bytes * 1e-6, e->flops / e->median * 1e-9,
              e->bytes / e->median * 1e-9, rt * 1e6);
      fflush(*out);
    }
  }
  cli_interrupt_release();
  if (*meas.stop)
    g_printerr("parasol profile perf: interrupted; the rows so far are written\n");
  return CLI_EXIT_OK;
}

static int profile_perf(int argc, char **argv)
{
  ModelOptions mo;
  model_options_init(&mo);
  FILE *out = NULL;
  int status = perf_run(&mo, argc, argv, &out);
  GError *error = NULL;
  if (out && table_json) {
    if (status == CLI_EXIT_OK) {
      print_table_json(out);
    } else {
      fclose(out);
      g_clear_pointer(&table_buf, free);
    }
  } else if (out && out != stdout && !cli_close_output(out, "the --csv file", &error)) {
    status = MAX(status, cli_report_error(error));
  }
  model_options_clear(&mo);
  return status;
}

/* ---------------------------------------------------------------------------------- */
/* parasol profile show                                                                */

static int profile_show(int argc, char **argv)
{
  g_set_prgname("parasol profile show");
  gboolean json = FALSE;
  GOptionEntry entries[] = {
    { "json", 0, 0, G_OPTION_ARG_NONE, &json, "Print the summary as JSON", NULL },
    { NULL },
  };
  g_autoptr(GOptionContext) ctx = g_option_context_new("PATH - summarize a profile database");
  g_option_context_add_main_entries(ctx, entries, NULL);
  if (!cli_parse_options(ctx, &argc, &argv))
    return CLI_EXIT_USAGE;
  if (argc != 2)
    return cli_usage_error("profile show", "expected one database file or directory");
  GError *error = NULL;
  g_autoptr(ProfileDb) db = profile_db_load(argv[1], &error);
  if (!db)
    return cli_report_error(error);
  g_autoptr(JsonBuilder) jb = json ? json_builder_new() : NULL;
  if (jb) {
    json_builder_begin_object(jb);
    json_builder_set_member_name(jb, "description");
    if (profile_db_get_description(db))
      json_builder_add_string_value(jb, profile_db_get_description(db));
    else
      json_builder_add_null_value(jb);
    json_builder_set_member_name(jb, "sources");
    json_builder_begin_array(jb);
    for (int i = 0; i < profile_db_n_sources(db); i++)
      json_builder_add_string_value(jb, profile_db_source(db, i));
    json_builder_end_array(jb);
    json_builder_set_member_name(jb, "devices");
    json_builder_begin_array(jb);
  } else {
    if (profile_db_get_description(db))
      printf("%s\n", profile_db_get_description(db));
    for (int i = 0; i < profile_db_n_sources(db); i++)
      printf("source   %s\n", profile_db_source(db, i));
  }
  g_auto(GStrv) devices = profile_db_devices(db);
  for (int d = 0; devices[d]; d++) {
    int ops[SIM_PASS_COUNT] = { 0 }, colls[PROFILE_COLL_COUNT] = { 0 };
    for (int i = 0; i < profile_db_n_ops(db); i++) {
      const ProfileOpEntry *e = profile_db_op(db, i);
      if (!strcmp(e->gpu, devices[d]))
        ops[e->pass]++;
    }
    for (int i = 0; i < profile_db_n_collectives(db); i++) {
      const ProfileCollEntry *e = profile_db_collective(db, i);
      if (!strcmp(e->gpu, devices[d]))
        colls[e->kind]++;
    }
    const char *name = profile_db_get_device_note(db, devices[d], "name");
    if (jb) {
      json_builder_begin_object(jb);
      json_builder_set_member_name(jb, "device");
      json_builder_add_string_value(jb, devices[d]);
      json_builder_set_member_name(jb, "name");
      if (name)
        json_builder_add_string_value(jb, name);
      else
        json_builder_add_null_value(jb);
      static const char *const passes[] = { "forward", "backward", "update" };
      for (int p = 0; p < 3; p++) {
        g_autofree char *key = g_strdup_printf("ops_%s", passes[p]);
        json_builder_set_member_name(jb, key);
        json_builder_add_int_value(jb, ops[p == 0 ? SIM_PASS_FORWARD
                                              : p == 1 ? SIM_PASS_BACKWARD : SIM_PASS_UPDATE]);
      }
      json_builder_set_member_name(jb, "collective_sizes");
      json_builder_begin_object(jb);
      for (int k = 0; k < PROFILE_COLL_COUNT; k++)
        if (colls[k]) {
          json_builder_set_member_name(jb, profile_coll_kind_name((ProfileCollKind)k));
          json_builder_add_int_value(jb, colls[k]);
        }
      json_builder_end_object(jb);
      json_builder_end_object(jb);
      continue;
    }
    printf("device   %s%s%s%s\n", devices[d], name ? " (" : "", name ? name : "", name ? ")" : "");
    printf("  ops          %d forward, %d backward, %d update\n", ops[SIM_PASS_FORWARD],
           ops[SIM_PASS_BACKWARD], ops[SIM_PASS_UPDATE]);
    for (int k = 0; k < PROFILE_COLL_COUNT; k++)
      if (colls[k])
        printf("  %-12s %d sizes\n", profile_coll_kind_name((ProfileCollKind)k), colls[k]);
  }
  if (jb) {
    json_builder_end_array(jb);
    json_builder_end_object(jb);
    cli_print_json(jb);
  }
  return CLI_EXIT_OK;
}

int cmd_profile(int argc, char **argv)
{
  if (argc < 2) {
    profile_usage(stderr);
    return CLI_EXIT_USAGE;
  }
  const char *sub = argv[1];
  if (!strcmp(sub, "--help") || !strcmp(sub, "-h") || !strcmp(sub, "help")) {
    profile_usage(stdout);
    return CLI_EXIT_OK;
  }
  static const struct {
    const char *name;
    int (*run)(int, char **);
  } subs[] = {
    { "ops", profile_ops },
    { "collectives", profile_collectives },
    { "import-nccl", profile_import_nccl },
    { "calibrate", profile_calibrate },
    { "compare", profile_compare },
    { "perf", profile_perf },
    { "show", profile_show },
  };
  for (gsize i = 0; i < G_N_ELEMENTS(subs); i++)
    if (!strcmp(sub, subs[i].name))
      return subs[i].run(argc - 1, argv + 1);
  return cli_usage_error("profile", "unknown command '%s'; 'parasol profile --help' lists them",
                         sub);
}
