/* cmd-simulate.c — parasol simulate: predicts one training iteration of a model on a
 * machine under a strategy given as a file or built from Megatron-style flags. */
#include "cli.h"
#include "parasol-search.h"
#include "sim-options.h"

#include <string.h>

int cmd_simulate(int argc, char **argv)
{
  g_autofree char *model = NULL, *machine = NULL, *strategy_file = NULL, *trace = NULL;
  g_autofree char *save = NULL;
  g_auto(GStrv) params = NULL;
  gboolean json = FALSE;
  CliPlanOptions plan;
  cli_plan_options_init(&plan);
  GOptionEntry entries[] = {
    { "model", 'm', 0, G_OPTION_ARG_STRING, &model, "Zoo model or graph file (default gpt3-1.3b)", "M" },
    { "param", 'p', 0, G_OPTION_ARG_STRING_ARRAY, &params, "Model parameter k=v (repeatable)", "K=V" },
    { "machine", 'x', 0, G_OPTION_ARG_STRING, &machine, "Library machine (dgx-a100:4) or file (default dgx-a100)", "X" },
    { "strategy", 's', 0, G_OPTION_ARG_FILENAME, &strategy_file, "Strategy file", "FILE" },
    { "trace", 0, 0, G_OPTION_ARG_FILENAME, &trace, "Write the timeline (Chrome trace format)", "FILE" },
    { "save-strategy", 0, 0, G_OPTION_ARG_FILENAME, &save, "Write the strategy used", "FILE" },
    { "json", 0, 0, G_OPTION_ARG_NONE, &json, "Print the report as JSON", NULL },
    { NULL },
  };
  g_autoptr(GOptionContext) ctx = g_option_context_new("- predict one training iteration");
  g_option_context_set_summary(ctx,
    "Simulates one iteration of training MODEL on MACHINE under a strategy: a file\n"
    "(--strategy), Megatron-style degrees (--dp/--tp/--pp), or data parallelism over\n"
    "every GPU when neither is given.");
  g_option_context_add_main_entries(ctx, entries, NULL);
  g_option_context_add_group(ctx, cli_plan_option_group(&plan));
  if (!cli_parse_options(ctx, &argc, &argv))
    return CLI_EXIT_USAGE;
  if (argc > 1)
    return cli_usage_error("simulate", "unexpected argument '%s'", argv[1]);

  GError *error = NULL;
  CliProblem pb = { 0 };
  if (!cli_problem_load(&pb, model ? model : "gpt3-1.3b", params, machine ? machine : "dgx-a100",
                        &plan, &error))
    return cli_report_error(error);
  g_autoptr(SimStrategy) s = NULL;
  if (strategy_file) {
    /* A strategy found with graph rewrites names the rewritten graph's operators: the
     * model is rewritten the same way before the strategy is read. */
    g_auto(GStrv) rewrites = search_strategy_file_rewrites(strategy_file, &error);
    if (!rewrites) {
      cli_problem_clear(&pb);
      return cli_report_error(error);
    }
    if (rewrites[0]) {
      SimGraph *g = search_rewrite_graph(pb.graph, (const char *const *)rewrites, &error);
      if (!g) {
        cli_problem_clear(&pb);
        return cli_report_error(error);
      }
      sim_graph_free(pb.graph);
      pb.graph = g;
    }
    s = sim_strategy_load(strategy_file, pb.graph, pb.machine, &error);
  }
  else
    s = cli_plan_build(&plan, pb.graph, pb.machine, &error);
  if (!s) {
    cli_problem_clear(&pb);
    return cli_report_error(error);
  }
  if (save && !sim_strategy_save(s, pb.graph, save, &error)) {
    cli_problem_clear(&pb);
    return cli_report_error(error);
  }
  SimOptions o = cli_plan_sim_options(&plan);
  o.keep_timeline = trace != NULL;
  g_autoptr(SimReport) r = sim_simulate(pb.graph, pb.machine, s, pb.cost, &o, &error);
  if (!r) {
    cli_problem_clear(&pb);
    return cli_report_error(error);
  }
  if (json) {
    g_autofree char *text = sim_report_to_json(r);
    printf("%s\n", text);
  } else {
    sim_report_print(r, stdout);
  }
  if (trace) {
    if (!sim_report_write_trace(r, trace, &error)) {
      cli_problem_clear(&pb);
      return cli_report_error(error);
    }
    g_printerr("parasol: timeline written to %s\n", trace);
  }
  cli_problem_clear(&pb);
  return CLI_EXIT_OK;
}
