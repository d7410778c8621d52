/* cmd-exec.c — parasol exec: runs training steps of a model under a strategy with a back
 * end, prints the loss and time of each step, and with --check compares the loss, the
 * gradients and the updated weights with one device running the same steps. */
#include "cli.h"
#include "exec-options.h"

#include <json-glib/json-glib.h>
#include <math.h>

/* The run's header: the model, machine, devices and back end (and Adam's epsilon of a
 * checked run), as text or as the start of the --json object @jb. */
static void print_header(const CliExec *e, JsonBuilder *jb)
{
  if (jb) {
    json_builder_begin_object(jb);
    json_builder_set_member_name(jb, "model");
    json_builder_add_string_value(jb, sim_graph_get_name(e->pb.graph));
    json_builder_set_member_name(jb, "machine");
    json_builder_add_string_value(jb, sim_machine_get_name(e->pb.machine));
    json_builder_set_member_name(jb, "devices");
    json_builder_add_int_value(jb, cli_exec_devices_used(e->plan));
    json_builder_set_member_name(jb, "backend");
    json_builder_add_string_value(jb, exec_backend_get_name(e->backend));
    if (e->check_eps > 0) {
      json_builder_set_member_name(jb, "adam_eps");
      json_builder_add_double_value(jb, e->check_eps);
    }
    json_builder_set_member_name(jb, "steps");
    json_builder_begin_array(jb);
    return;
  }
  printf("%s on %s, %d devices, back end %s\n", sim_graph_get_name(e->pb.graph),
         sim_machine_get_name(e->pb.machine), cli_exec_devices_used(e->plan),
         exec_backend_get_name(e->backend));
  if (e->check_eps > 0)
    printf("Adam's epsilon %g for the check (--adam-eps to choose): with 1e-8, weights whose "
           "gradient is rounding noise move by the learning rate in that noise's direction\n",
           e->check_eps);
}

/* Step @step's loss and time, a line of text or an element of @jb's "steps". */
static void print_step(const CliExec *e, JsonBuilder *jb, int step)
{
  if (jb) {
    json_builder_begin_object(jb);
    json_builder_set_member_name(jb, "step");
    json_builder_add_int_value(jb, step);
    json_builder_set_member_name(jb, "loss");
    json_builder_add_double_value(jb, exec_run_loss(e->run));
    json_builder_set_member_name(jb, "time_s");
    json_builder_add_double_value(jb, exec_run_step_time(e->run));
    json_builder_end_object(jb);
    return;
  }
  g_autofree char *t = cli_format_time(exec_run_step_time(e->run));
  printf("%-6d %14.8f %12s\n", step, exec_run_loss(e->run), t);
}

/* --check: the largest relative errors against one device after @steps steps; whether
 * they are all within @tolerance. */
static gboolean print_check(const ExecDiff *d, JsonBuilder *jb, int steps, double tolerance)
{
  gboolean ok = d->loss <= tolerance && d->grads <= tolerance && d->weights <= tolerance;
  if (jb) {
    json_builder_set_member_name(jb, "check");
    json_builder_begin_object(jb);
    json_builder_set_member_name(jb, "loss");
    json_builder_add_double_value(jb, d->loss);
    json_builder_set_member_name(jb, "gradients");
    json_builder_add_double_value(jb, d->grads);
    json_builder_set_member_name(jb, "weights");
    json_builder_add_double_value(jb, d->weights);
    json_builder_set_member_name(jb, "worst");
    json_builder_add_string_value(jb, d->worst);
    json_builder_set_member_name(jb, "tolerance");
    json_builder_add_double_value(jb, tolerance);
    json_builder_set_member_name(jb, "match");
    json_builder_add_boolean_value(jb, ok);
    json_builder_end_object(jb);
  } else {
    printf("\nagainst one device after %d steps (max relative error):\n", steps);
    printf("  loss      %.3g\n  gradients %.3g\n  weights   %.3g\n  worst     %s\n", d->loss,
           d->grads, d->weights, d->worst);
    printf("%s (tolerance %g)\n", ok ? "match" : "MISMATCH", tolerance);
  }
  return ok;
}

int cmd_exec(int argc, char **argv)
{
  g_autofree char *model = NULL, *machine = NULL, *strategy_file = NULL, *trace = NULL;
  g_autofree char *dump_dir = NULL, *load_dir = NULL;
  g_auto(GStrv) params = NULL;
  gboolean check = FALSE, list = FALSE, json = FALSE;
  double tolerance = 1e-5;
  g_auto(CliPlanOptions) plan;
  cli_plan_options_init(&plan);
  CliExecOptions eo;
  cli_exec_options_init(&eo, 3);
  GOptionEntry entries[] = {
    { "model", 'm', 0, G_OPTION_ARG_STRING, &model, "Zoo model or graph file (default " CLI_DEFAULT_MODEL " with a tiny size: " CLI_DEFAULT_EXEC_PARAMS ")", "M" },
    { "param", 'p', 0, G_OPTION_ARG_STRING_ARRAY, &params, "Model parameter k=v (repeatable)", "K=V" },
    { "machine", 'x', 0, G_OPTION_ARG_STRING, &machine, "Library machine or file (default " CLI_DEFAULT_MACHINE ")", "X" },
    { "strategy", 's', 0, G_OPTION_ARG_FILENAME, &strategy_file, "Strategy file", "FILE" },
    { "check", 0, 0, G_OPTION_ARG_NONE, &check, "Compare with one device running the same steps", NULL },
    { "tolerance", 0, 0, G_OPTION_ARG_DOUBLE, &tolerance, "Largest relative error --check accepts (default 1e-5)", "T" },
    { "trace", 0, 0, G_OPTION_ARG_FILENAME, &trace, "Write the last step's measured timeline (Chrome trace format)", "FILE" },
    { "dump", 0, 0, G_OPTION_ARG_FILENAME, &dump_dir, "Write the initial weights and each step's inputs, dropout masks, loss, gradients and weights to DIR (docs/exec-dump.md)", "DIR" },
    { "load-weights", 0, 0, G_OPTION_ARG_FILENAME, &load_dir, "Start from the initial weights of a dump in DIR", "DIR" },
    { "list-backends", 0, 0, G_OPTION_ARG_NONE, &list, "List the back ends of this build", NULL },
    { "json", 0, 0, G_OPTION_ARG_NONE, &json, "Print the run (each step's loss and time, the check) as JSON", NULL },
    { NULL },
  };
  g_autoptr(GOptionContext) ctx = g_option_context_new("- run training steps of a plan");
  g_option_context_set_summary(ctx,
    "Executes the plan of MODEL on MACHINE under a strategy (a file, Megatron-style\n"
    "degrees, or data parallelism over every GPU) for --steps training steps, and prints\n"
    "each step's loss and time.  The cpu back end computes in fp32 with one thread per\n"
    "simulated device; it is slow and meant for small models and for checking that a\n"
    "strategy computes what one device does (--check).  A checked run with Adam takes an\n"
    "epsilon of 1e-3 unless --adam-eps gives one: with 1e-8, parameters whose exact gradient\n"
    "is zero move by the learning rate in the direction of rounding noise, which differs\n"
    "between strategies.");
  g_option_context_add_main_entries(ctx, entries, NULL);
  g_option_context_add_group(ctx, cli_exec_option_group(&eo));
  g_option_context_add_group(ctx, cli_plan_option_group(&plan));
  if (!cli_parse_options(ctx, &argc, &argv)) {
    cli_exec_options_clear(&eo);
    return CLI_EXIT_USAGE;
  }
  if (!(tolerance >= 0) || isinf(tolerance)) {
    cli_exec_options_clear(&eo);
    return cli_usage_error("exec", "--tolerance %g: expected a relative error, 0 or more",
                           tolerance);
  }
  if (argc > 1) {
    cli_exec_options_clear(&eo);
    return cli_usage_error("exec", "unexpected argument '%s'", argv[1]);
  }
  if (list) {
    g_auto(GStrv) names = exec_backend_names();
    for (char **n = names; *n; n++)
      printf("%-8s %s\n", *n, exec_backend_description(*n));
    cli_exec_options_clear(&eo);
    return CLI_EXIT_OK;
  }
  static const char *const tiny[] = { CLI_DEFAULT_EXEC_PARAMS, NULL };
  GError *error = NULL;
  CliExec e, ref = { 0 };
  /* With --check, activations start each step as NaN, so that a value read before it is
   * written shows in the comparison. */
  eo.poison = check;
  eo.checking = check;
  eo.load_weights = load_dir;
  g_autoptr(ExecDump) dump = NULL;
  JsonBuilder *jb = NULL;
  int status = CLI_EXIT_OK;
  if (!cli_exec_setup(&e, model ? model : CLI_DEFAULT_MODEL, model ? params : (char **)tiny,
                      machine ? machine : CLI_DEFAULT_MACHINE, strategy_file, &plan, &eo, &error))
    goto fail;
  if (check && !cli_exec_setup_reference(&ref, &e, &eo, &error))
    goto fail;
  jb = json ? json_builder_new() : NULL;
  print_header(&e, jb);
  if (dump_dir && !(dump = exec_dump_new(e.run, dump_dir, &error)))
    goto fail;
  if (!jb)
    printf("%-6s %14s %12s\n", "step", "loss", "time");
  for (int k = 0; k < eo.steps; k++) {
    if (!exec_run_step(e.run, &error))
      goto fail;
    if (check && !exec_run_step(ref.run, &error))
      goto fail;
    if (dump && !exec_dump_step(dump, e.run, &error))
      goto fail;
    print_step(&e, jb, k + 1);
  }
  if (jb)
    json_builder_end_array(jb);
  if (trace) {
    if (!cli_make_parent(trace, &error) || !sim_plan_write_trace(e.plan, exec_run_task_start(e.run), exec_run_task_end(e.run), trace,
                              &error))
      goto fail;
    g_printerr("parasol exec: timeline written to %s\n", trace);
  }
  if (check) {
    ExecDiff d;
    if (!exec_run_compare(e.run, ref.run, &d, &error))
      goto fail;
    if (!print_check(&d, jb, eo.steps, tolerance))
      status = CLI_EXIT_FAILURE;
  }
  if (jb) {
    json_builder_end_object(jb);
    cli_print_json(jb);
  }
  goto done;

fail:
  status = cli_exec_report_error(error);
done:
  if (jb)
    g_object_unref(jb);
  cli_exec_clear(&ref);
  cli_exec_clear(&e);
  cli_exec_options_clear(&eo);
  return status;
}
