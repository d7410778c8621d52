/* cmd-simulate.c — parasol simulate: predicts one training iteration of a model on a
 * machine under a strategy given as a file or built from Megatron-style flags. */
#include "cli.h"
#include "parasol-search.h"
#include "sim-options.h"

#include <errno.h>
#include <json-glib/json-glib.h>
#include <string.h>

/* The report as JSON (sim_report_to_json()), with "vocab_padding" {"model_vocab",
 * "padded_vocab", "tp"} when the model's vocabulary was padded (cli_problem_load()). */
static char *report_json(const SimReport *r, const CliProblem *pb)
{
  char *text = sim_report_to_json(r);
  if (!pb->vocab_padded)
    return text;
  g_autoptr(JsonParser) parser = json_parser_new();
  if (!json_parser_load_from_data(parser, text, -1, NULL) ||
      !JSON_NODE_HOLDS_OBJECT(json_parser_get_root(parser)))
    return text;
  JsonObject *o = json_node_get_object(json_parser_get_root(parser));
  JsonObject *pad = json_object_new();
  json_object_set_int_member(pad, "model_vocab", pb->vocab_default);
  json_object_set_int_member(pad, "padded_vocab", pb->vocab_padded);
  json_object_set_int_member(pad, "tp", pb->vocab_tp);
  json_object_set_object_member(o, "vocab_padding", pad);
  g_autoptr(JsonGenerator) gen = json_generator_new();
  json_generator_set_pretty(gen, TRUE);
  json_generator_set_root(gen, json_parser_get_root(parser));
  g_free(text);
  return json_generator_to_data(gen, NULL);
}

/* Beyond this many events a trace gets a word on its size. */
#define TRACE_EVENTS_WARN 5000000

static int batch_error(int line, const char *message, int status)
{
  g_autoptr(JsonBuilder) jb = json_builder_new();
  json_builder_begin_object(jb);
  json_builder_set_member_name(jb, "line");
  json_builder_add_int_value(jb, line);
  json_builder_set_member_name(jb, "error");
  json_builder_add_string_value(jb, message);
  json_builder_end_object(jb);
  g_autoptr(JsonGenerator) gen = json_generator_new();
  g_autoptr(JsonNode) root = json_builder_get_root(jb);
  json_generator_set_root(gen, root);
  g_autofree char *text = json_generator_to_data(gen, NULL);
  printf("%s\n", text);
  fflush(stdout);
  return status;
}

static int fail(int line, GError *error)
{
  if (line < 0)
    return cli_report_error(error);
  int status = error->domain == SIM_ERROR && error->code == SIM_ERROR_OOM ? CLI_EXIT_FAILURE
                                                                         : CLI_EXIT_USAGE;
  batch_error(line, error->message, status);
  g_error_free(error);
  return status;
}

static int simulate_one(int argc, char **argv, int line);

/* Simulates every line of @path: the lines of a sweep (the vTrain validation, a search
 * script) without a process and a model build per configuration.  Blank lines and lines
 * starting with # are skipped.  Returns the worst status of the lines. */
static int simulate_batch(const char *path)
{
  g_autofree char *text = NULL;
  g_autoptr(GError) error = NULL;
  if (!strcmp(path, "-")) {
    /* Standard input within the limit on input files, as text. */
    GString *all = g_string_new(NULL);
    char buf[4096];
    size_t n;
    while (all->len <= SIM_INPUT_MAX_BYTES && (n = fread(buf, 1, sizeof buf, stdin)) > 0)
      g_string_append_len(all, buf, (gssize)n);
    if (all->len > SIM_INPUT_MAX_BYTES) {
      g_string_free(all, TRUE);
      return cli_usage_error("simulate", "--batch -: more than the %d MiB that parasol reads "
                             "from one file", SIM_INPUT_MAX_BYTES >> 20);
    }
    gsize len = all->len;
    text = g_string_free(all, FALSE);
    if (!sim_check_text(text, len, "<stdin>", &error))
      return cli_usage_error("simulate", "%s", error->message);
  } else if (!sim_read_file(path, &text, NULL, &error)) {
    return cli_usage_error("simulate", "%s", error->message);
  }
  g_auto(GStrv) lines = g_strsplit(text, "\n", -1);
  int worst = CLI_EXIT_OK;
  for (int i = 0; lines[i]; i++) {
    char *l = g_strstrip(lines[i]);
    if (!*l || *l == '#')
      continue;
    int ac = 0;
    g_auto(GStrv) av = NULL;
    g_autoptr(GError) perr = NULL;
    g_autofree char *cmd = g_strconcat("simulate ", l, NULL);
    int status;
    if (g_shell_parse_argv(cmd, &ac, &av, &perr)) {
      /* Option parsing takes the options it reads out of the array it is given: it gets a
       * copy, so that av still holds every string to free. */
      g_autofree char **args = g_memdup2(av, sizeof(char *) * ((size_t)ac + 1));
      status = simulate_one(ac, args, i + 1);
    } else {
      status = batch_error(i + 1, perr->message, CLI_EXIT_USAGE);
    }
    worst = MAX(worst, status);
    /* A full disk or a closed pipe ends the batch: its results would be lost. */
    if (fflush(stdout) != 0 || ferror(stdout))
      return cli_usage_error("simulate", "cannot write the results of line %d: %s", i + 1,
                             g_strerror(errno));
  }
  return worst;
}

/* The default plan does not fit: the largest micro-batch that does, simulated, replaces
 * *@s and *@r where there is one (said on stderr with @say). */
static void fit_microbatches(const CliPlanOptions *plan, const CliProblem *pb,
                             const SimOptions *o, SimStrategy **s, SimReport **r, gboolean say)
{
  SimMegatronOptions mo;
  if (!cli_plan_resolve(plan, pb->graph, pb->machine, &mo, NULL))
    return;
  g_autoptr(SimReport) rk = NULL;
  int64_t k = 0;
  g_autoptr(SimStrategy) sk =
    sim_strategy_megatron_fit(pb->graph, pb->machine, &mo, pb->cost, o, &rk, &k);
  if (!sk)
    return;
  int64_t per = sim_graph_batch_size(pb->graph) / MAX(sim_machine_n_devices(pb->machine), 1);
  g_autofree char *was = cli_format_bytes((double)sim_report_max_peak_memory(*r));
  g_autofree char *now = cli_format_bytes((double)sim_report_max_peak_memory(rk));
  if (say)
    g_printerr("parasol: %" G_GINT64_FORMAT " samples a GPU in one micro-batch need %s; "
               "micro-batches of %" G_GINT64_FORMAT " (%" G_GINT64_FORMAT " a step) fit "
               "in %s: simulated with those (--microbatch-size %" G_GINT64_FORMAT ")\n",
               per, was, k, per / k, now, k);
  g_clear_pointer(s, sim_strategy_free);
  g_clear_pointer(r, sim_report_free);
  *s = g_steal_pointer(&sk);
  *r = g_steal_pointer(&rk);
}

/* The result: a line of JSON for batch line @line (>= 0), the report as JSON with @json,
 * or as text. */
static void print_report(const SimReport *r, const CliProblem *pb, int line, gboolean json)
{
  if (line >= 0) {
    printf("{\"line\": %d, \"iteration_time_s\": %.9g, \"throughput_samples_per_s\": %.9g, "
           "\"mfu\": %.6f, \"fits\": %s, \"peak_memory_max_bytes\": %" G_GINT64_FORMAT
           ", \"tasks\": %" G_GINT64_FORMAT ", \"folding\": \"%s\"}\n",
           line, sim_report_iteration_time(r), sim_report_throughput(r), sim_report_mfu(r),
           sim_report_fits(r) ? "true" : "false", sim_report_max_peak_memory(r),
           sim_report_n_tasks(r), sim_report_folding(r));
    fflush(stdout);
  } else if (json) {
    g_autofree char *text = report_json(r, pb);
    printf("%s\n", text);
  } else {
    sim_report_print(r, stdout);
    if (!sim_report_fits(r))
      g_printerr("parasol: the plan does not fit in GPU memory; smaller micro-batches "
                 "(--microbatch-size), recomputed activations (--recompute full), sharded "
                 "optimizer states (--zero1), the optimizer on the host (--offload-optimizer "
                 "1) or more model parallelism (--tp, --pp) lower the "
                 "peak, and `parasol search` looks only among plans that fit\n");
  }
}

/* The timeline to @path (only the devices in @keep where not NULL). */
static gboolean write_trace(const SimReport *r, const char *path, const GArray *keep,
                            GError **error)
{
  int64_t events = 0;
  if (!cli_make_parent(path, error) ||
      !sim_report_write_trace_devices(r, path, keep ? (const int *)keep->data : NULL,
                                      keep ? (int)keep->len : 0, &events, error))
    return FALSE;
  g_printerr("parasol: timeline written to %s (%" G_GINT64_FORMAT " events)\n", path, events);
  /* Perfetto's UI holds a JSON trace in the browser's memory: some tens of millions of
   * events are more than it loads. */
  if (events > TRACE_EVENTS_WARN && !keep)
    g_printerr("parasol: a trace this large may not open in ui.perfetto.dev; "
               "--trace-devices keeps fewer GPUs (e.g. one of each pipeline stage)\n");
  return TRUE;
}

/* One simulation.  With @line >= 0 (a line of a batch) the result, or the error, is one
 * line of JSON on stdout and errors go nowhere else. */
static int simulate_one(int argc, char **argv, int line)
{
  g_autofree char *model = NULL, *machine = NULL, *strategy_file = NULL, *trace = NULL;
  g_autofree char *trace_devices = NULL;
  g_autofree char *save = NULL, *batch = NULL;
  g_auto(GStrv) params = NULL;
  gboolean json = FALSE;
  g_auto(CliPlanOptions) plan;
  cli_plan_options_init(&plan);
  GOptionEntry entries[] = {
    { "model", 'm', 0, G_OPTION_ARG_STRING, &model, "Zoo model or graph file (default " CLI_DEFAULT_MODEL ")", "M" },
    { "param", 'p', 0, G_OPTION_ARG_STRING_ARRAY, &params, "Model parameter k=v (repeatable)", "K=V" },
    { "machine", 'x', 0, G_OPTION_ARG_STRING, &machine, "Library machine (dgx-a100:4) or file (default " CLI_DEFAULT_MACHINE ")", "X" },
    { "strategy", 's', 0, G_OPTION_ARG_FILENAME, &strategy_file, "Strategy file", "FILE" },
    { "trace", 0, 0, G_OPTION_ARG_FILENAME, &trace, "Write the timeline (Chrome trace format)", "FILE" },
    { "trace-devices", 0, 0, G_OPTION_ARG_STRING, &trace_devices, "Keep only these GPUs' tracks in the trace, e.g. 0-7 or 0-1023:64 (devices that folding leaves to a symmetric one have none; --no-fold simulates all)", "LIST" },
    { "save-strategy", 0, 0, G_OPTION_ARG_FILENAME, &save, "Write the strategy used", "FILE" },
    { "json", 0, 0, G_OPTION_ARG_NONE, &json, "Print the report as JSON", NULL },
    { "batch", 0, 0, G_OPTION_ARG_FILENAME, &batch, "Simulate every line of FILE (- for stdin): each line holds these options; one line of JSON comes out per line", "FILE" },
    { NULL },
  };
  g_autoptr(GOptionContext) ctx = g_option_context_new("- predict one training iteration");
  g_option_context_set_summary(ctx,
    "Simulates one iteration of training MODEL on MACHINE under a strategy: a file\n"
    "(--strategy), Megatron-style degrees (--tp/--pp, and --dp, which defaults to the GPUs\n"
    "they leave), or data parallelism over every GPU when neither is given, then with the\n"
    "largest micro-batch that fits in memory.");
  g_option_context_add_main_entries(ctx, entries, NULL);
  g_option_context_add_group(ctx, cli_plan_option_group(&plan));
  if (line >= 0) {
    /* Help in a batch line would land among the results and end the batch. */
    g_option_context_set_help_enabled(ctx, FALSE);
    for (int i = 1; i < argc; i++)
      if (!strcmp(argv[i], "--help") || g_str_has_prefix(argv[i], "--help-") ||
          !strcmp(argv[i], "-h") || !strcmp(argv[i], "-?"))
        return batch_error(line, "help options (--help, -h, --help-all, --help-plan) do not "
                           "belong in a batch line", CLI_EXIT_USAGE);
    g_autoptr(GError) perr = NULL;
    if (!g_option_context_parse(ctx, &argc, &argv, &perr))
      return batch_error(line, perr->message, CLI_EXIT_USAGE);
    if (batch || trace || trace_devices || save)
      return batch_error(line, "--batch, --trace, --trace-devices and --save-strategy do not belong in a batch line",
                         CLI_EXIT_USAGE);
  } else if (!cli_parse_options(ctx, &argc, &argv)) {
    return CLI_EXIT_USAGE;
  }
  if (argc > 1)
    return line >= 0 ? batch_error(line, "unexpected argument", CLI_EXIT_USAGE)
                     : cli_usage_error("simulate", "unexpected argument '%s'", argv[1]);
  if (batch)
    return simulate_batch(batch);
  if (trace_devices && !trace)
    return cli_usage_error("simulate", "--trace-devices needs --trace FILE");

  GError *error = NULL;
  CliProblem pb = { 0 };
  if (!cli_problem_load(&pb, model ? model : CLI_DEFAULT_MODEL, params, machine ? machine : CLI_DEFAULT_MACHINE,
                        &plan, &error))
    return fail(line, error);
  g_autoptr(SimStrategy) s = NULL;
  if (strategy_file) {
    /* A strategy found with graph rewrites names the rewritten graph's operators. */
    SimGraph *g = NULL;
    s = search_strategy_load(strategy_file, pb.graph, pb.machine, &g, &error);
    if (g) {
      sim_graph_free(pb.graph);
      pb.graph = g;
    }
  }
  else
    s = cli_plan_build(&plan, pb.graph, pb.machine, &error);
  if (!s) {
    cli_problem_clear(&pb);
    return fail(line, error);
  }
  g_autoptr(GArray) keep = NULL;
  if (trace_devices) {
    keep = g_array_new(FALSE, FALSE, sizeof(int));
    if (!cli_parse_devices("--trace-devices", trace_devices, sim_machine_n_devices(pb.machine),
                           keep, &error)) {
      cli_problem_clear(&pb);
      return fail(line, error);
    }
  }
  SimOptions o = cli_plan_sim_options(&plan, &pb);
  o.keep_timeline = trace != NULL;
  g_autoptr(SimReport) r = sim_simulate(pb.graph, pb.machine, s, pb.cost, &o, &error);
  if (!r) {
    cli_problem_clear(&pb);
    return fail(line, error);
  }
  /* The default plan (data parallel over every GPU, no word on micro-batches) takes the
   * largest micro-batch that fits, as one would set it by hand; a plan given in flags or a
   * file is simulated as given. */
  if (!strategy_file && !cli_plan_has_degrees(&plan) && !sim_report_fits(r))
    fit_microbatches(&plan, &pb, &o, &s, &r, line < 0);
  if (save && (!cli_make_parent(save, &error) || !sim_strategy_save(s, pb.graph, save, &error))) {
    cli_problem_clear(&pb);
    return fail(line, error);
  }
  print_report(r, &pb, line, json);
  if (trace && !write_trace(r, trace, keep, &error)) {
    cli_problem_clear(&pb);
    return fail(line, error);
  }
  cli_problem_clear(&pb);
  /* A plan that does not fit is a result, not an error, but scripts must not take it
   * for one that runs (a batch line says so in its "fits"). */
  return line < 0 && !sim_report_fits(r) ? CLI_EXIT_NO_FIT : CLI_EXIT_OK;
}

int cmd_simulate(int argc, char **argv)
{
  return simulate_one(argc, argv, -1);
}
