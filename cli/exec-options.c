/* exec-options.c — the execution options and run setup shared by exec and validate. */
#include "exec-options.h"
#include "parasol-search.h"

#include <string.h>

void cli_exec_options_init(CliExecOptions *o, int default_steps)
{
  memset(o, 0, sizeof *o);
  o->steps = default_steps;
  o->seed = 1;
}

void cli_exec_options_clear(CliExecOptions *o)
{
  g_clear_pointer(&o->backend, g_free);
  g_clear_pointer(&o->optimizer, g_free);
}

static gboolean positive(double v)
{
  return v > 0;
}

/* --lr and --adam-eps: a positive number (0 stands for "the default" inside). */
static gboolean parse_positive(const char *name, const char *value, gpointer data,
                               GError **error)
{
  CliExecOptions *o = data;
  return cli_option_real(name, value, positive, "a positive number",
                         g_str_equal(name, "--lr") ? &o->lr : &o->adam_eps, error);
}

GOptionGroup *cli_exec_option_group(CliExecOptions *o)
{
  GOptionEntry entries[] = {
    { "backend", 'b', 0, G_OPTION_ARG_STRING, &o->backend, "Back end: cpu (default) or cuda", "B" },
    { "steps", 'n', 0, G_OPTION_ARG_INT, &o->steps, "Training steps to run", "N" },
    { "optimizer", 0, 0, G_OPTION_ARG_STRING, &o->optimizer, "sgd or adam (default: the strategy's)", "O" },
    { "lr", 0, 0, G_OPTION_ARG_CALLBACK, parse_positive, "Learning rate (default 0.05 for SGD, 0.001 for Adam)", "LR" },
    { "adam-eps", 0, 0, G_OPTION_ARG_CALLBACK, parse_positive, "Adam's epsilon (default 1e-8; 1e-3 for a run exec --check compares)", "E" },
    { "seed", 0, 0, G_OPTION_ARG_INT64, &o->seed, "Seed of the data and initial weights (default 1)", "S" },
    { NULL },
  };
  GOptionGroup *g = g_option_group_new("exec", "Execution options:",
                                       "Show the execution options", o, NULL);
  g_option_group_add_entries(g, entries);
  return g;
}

ExecOptions cli_exec_run_options(const CliExecOptions *o)
{
  ExecOptions r = exec_options_default();
  r.lr = o->lr;
  if (o->adam_eps > 0)
    r.eps = o->adam_eps;
  r.seed = (uint64_t)o->seed;
  r.poison = o->poison;
  if (o->load_weights) {
    r.weights = exec_load_weight;
    r.weights_data = (gpointer)o->load_weights;
  }
  return r;
}

static gboolean apply_optimizer(SimStrategy *s, const CliExecOptions *o, GError **error)
{
  if (!o->optimizer)
    return TRUE;
  SimMemoryOptions mo = sim_strategy_get_memory(s);
  if (!strcmp(o->optimizer, "sgd")) {
    mo.optimizer = SIM_OPTIMIZER_SGD;
  } else if (!strcmp(o->optimizer, "adam")) {
    mo.optimizer = SIM_OPTIMIZER_ADAM;
  } else {
    g_set_error(error, SIM_ERROR, SIM_ERROR_UNKNOWN,
                "--optimizer: unknown '%s'; expected sgd or adam", o->optimizer);
    return FALSE;
  }
  sim_strategy_set_memory(s, &mo);
  return TRUE;
}

static gboolean start_run(CliExec *e, const CliExecOptions *o, GError **error)
{
  CliExecOptions co = *o;
  if (e->check_eps > 0)
    co.adam_eps = e->check_eps;
  o = &co;
  e->backend = exec_backend_new(o->backend ? o->backend : "cpu", error);
  if (!e->backend)
    return FALSE;
  ExecOptions ro = cli_exec_run_options(o);
  e->run = exec_run_new(e->backend, e->plan, &ro, error);
  return e->run != NULL;
}

gboolean cli_exec_setup(CliExec *e, const char *model, char **params, const char *machine,
                        const char *strategy_file, const CliPlanOptions *plan,
                        const CliExecOptions *o, GError **error)
{
  memset(e, 0, sizeof *e);
  if (o->steps < 1) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID, "--steps: expected a positive number");
    return FALSE;
  }
  if (!cli_problem_load(&e->pb, model, params, machine, plan, error))
    return FALSE;
  if (strategy_file) {
    /* A strategy found with graph rewrites names the rewritten graph's operators. */
    SimGraph *g = NULL;
    e->strategy = search_strategy_load(strategy_file, e->pb.graph, e->pb.machine, &g, error);
    if (g) {
      sim_graph_free(e->pb.graph);
      e->pb.graph = g;
    }
  } else {
    e->strategy = cli_plan_build(plan, e->pb.graph, e->pb.machine, error);
  }
  if (!e->strategy || !apply_optimizer(e->strategy, o, error))
    return FALSE;
  e->plan = sim_plan_new(e->pb.graph, e->pb.machine, e->strategy, e->pb.cost, error);
  if (!e->plan)
    return FALSE;
  if (o->checking && o->adam_eps == 0 &&
      sim_strategy_get_memory(e->strategy).optimizer == SIM_OPTIMIZER_ADAM)
    e->check_eps = CLI_CHECK_ADAM_EPS;
  return start_run(e, o, error);
}

gboolean cli_exec_setup_reference(CliExec *ref, const CliExec *e, const CliExecOptions *o,
                                  GError **error)
{
  memset(ref, 0, sizeof *ref);
  ref->check_eps = e->check_eps;
  ref->strategy = exec_reference_strategy(e->plan, e->pb.machine, error);
  if (!ref->strategy)
    return FALSE;
  ref->plan = sim_plan_new(e->pb.graph, e->pb.machine, ref->strategy, e->pb.cost, error);
  if (!ref->plan)
    return FALSE;
  /* The reference checks semantics: it runs on the CPU whatever the run under test uses. */
  CliExecOptions ro = *o;
  ro.backend = (char *)"cpu";
  return start_run(ref, &ro, error);
}

void cli_exec_clear(CliExec *e)
{
  /* The run borrows the plan and back end, the plan the graph, machine and strategy. */
  g_clear_pointer(&e->run, exec_run_free);
  g_clear_pointer(&e->backend, exec_backend_free);
  g_clear_pointer(&e->plan, sim_plan_free);
  g_clear_pointer(&e->strategy, sim_strategy_free);
  if (e->pb.graph)
    cli_problem_clear(&e->pb);
}

int cli_exec_report_error(GError *error)
{
  if (error && error->domain == EXEC_ERROR &&
      (error->code == EXEC_ERROR_BACKEND || error->code == EXEC_ERROR_MISMATCH)) {
    g_printerr("parasol: %s\n", error->message);
    g_error_free(error);
    return CLI_EXIT_FAILURE;
  }
  return cli_report_error(error);
}

int cli_exec_devices_used(const SimPlan *p)
{
  int n = 0;
  for (int d = 0; d < sim_plan_n_devices(p); d++)
    n += sim_plan_stream_length(p, d) > 0;
  return n;
}
