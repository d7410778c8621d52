/* profile-options.c — the options and helpers the `parasol profile` subcommands share
 * (profile-options.h). */
#include "profile-options.h"

#include <string.h>

int cli_profile_error(GError *error)
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

void cli_profile_options_init(CliProfileOptions *o)
{
  memset(o, 0, sizeof *o);
  o->warmup = -1;
  o->repetitions = -1;
}

void cli_profile_options_clear(CliProfileOptions *o)
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
  CliProfileOptions *o = data;
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

GOptionGroup *cli_profile_option_group(CliProfileOptions *o)
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

gboolean cli_profile_parse_int_list(const char *text, const char *what, GArray *out,
                                    GError **error)
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
SimGraph *cli_profile_load_model(const CliProfileOptions *o, GError **error)
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

ProfileShapes *cli_profile_enumerate(const CliProfileOptions *o, const SimGraph *g,
                                     GError **error)
{
  SimMachine *m = sim_machine_load(o->machine ? o->machine : "h200-1", error);
  if (!m)
    return NULL;
  g_autoptr(GArray) mbs = g_array_new(FALSE, FALSE, sizeof(int));
  if (o->microbatches &&
      !cli_profile_parse_int_list(o->microbatches, "--microbatches", mbs, error)) {
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

ProfileRunner *cli_profile_make_runner(const CliProfileOptions *o, GError **error)
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

ProfileMeasureOptions cli_profile_measure_options(const CliProfileOptions *o)
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
void cli_profile_progress(int done, int total, const char *key, gpointer user_data)
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
const SimDeviceSpec *cli_profile_spec_for(const char *machine, const char *gpu,
                                          SimMachine **keep, GError **error)
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
