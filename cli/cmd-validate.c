/* cmd-validate.c — parasol validate: simulates a plan and executes the same plan, then
 * prints predicted against measured time per class of task and in total, and writes them
 * as CSV (per class and per task) and as a gnuplot figure.
 *
 * The two timelines share task ids (one plan, two back ends).  Per class, both sides sum
 * device time: the simulator's compute tasks and flows (a collective's flows, one per
 * member), the executor's time each device spent in its part of a task (a copy's sender
 * and receiver, a collective's members); the totals are the predicted iteration time and
 * the measured step time. */
#include "cli.h"
#include "exec-options.h"

#include <json-glib/json-glib.h>

#include <errno.h>
#include <string.h>

static const char *const classes[] = { "forward", "backward", "recompute", "update", "transfer",
                                       "reduction", "grad-sync", "param-sync" };
#define N_CLASSES G_N_ELEMENTS(classes)

static int class_index(const char *name)
{
  for (guint k = 0; k < N_CLASSES; k++)
    if (!strcmp(classes[k], name))
      return (int)k;
  return -1;
}

/* The class of a plan task as the executor carries it out. */
static const char *task_class(const SimPlanTask *t)
{
  switch (t->kind) {
  case SIM_PLAN_COMPUTE:
    return t->pass == SIM_PASS_BACKWARD ? "backward"
           : t->pass == SIM_PASS_UPDATE ? "update"
           : t->recompute               ? "recompute"
                                        : "forward";
  case SIM_PLAN_COPY:
    return "transfer";
  case SIM_PLAN_REDUCE:
    return "reduction";
  case SIM_PLAN_SYNC:
    return "grad-sync";
  case SIM_PLAN_GATHER_PARAMS:
    return "param-sync";
  default:
    return NULL;
  }
}

static const char *kind_name(SimPlanKind k)
{
  static const char *const names[] = { "compute", "copy", "reduce", "sync", "gather-params",
                                       "timing", "join" };
  return names[k];
}

static FILE *open_out(const char *path, GError **error)
{
  if (!cli_make_parent(path, error))
    return NULL;
  FILE *f = fopen(path, "w");
  if (!f) {
    int e = errno;
    g_set_error(error, SIM_ERROR, SIM_ERROR_IO, "cannot write %s: %s", path, g_strerror(e));
  }
  return f;
}

/* A clustered bar chart, the data inline so that the script redraws it alone. */
static gboolean write_plot(const char *gp, const char *png, const char *title,
                           const double *pred, const double *meas, double pred_total,
                           double meas_total, GError **error)
{
  FILE *f = open_out(gp, error);
  if (!f)
    return FALSE;
  fprintf(f, "# parasol validate: predicted and measured time per class of task (ms).\n");
  fprintf(f, "$data << EOD\n");
  for (guint k = 0; k < N_CLASSES; k++)
    if (pred[k] > 0 || meas[k] > 0)
      fprintf(f, "%s %.9g %.9g\n", classes[k], 1e3 * pred[k], 1e3 * meas[k]);
  fprintf(f, "iteration %.9g %.9g\nEOD\n", 1e3 * pred_total, 1e3 * meas_total);
  g_autofree char *preamble = cli_gnuplot_preamble(png, title);
  fputs(preamble, f);
  fprintf(f,
          "set ylabel 'time (ms, device time summed per class)'\n"
          "set logscale y\n"
          "set style data histograms\n"
          "set style histogram clustered gap 1\n"
          "set style fill solid 0.8 border -1\n"
          "set xtics rotate by -30 noenhanced\n"
          "set key top left\n"
          "set grid ytics\n"
          "plot $data using 2:xtic(1) title 'predicted', '' using 3 title 'measured'\n");
  return cli_close_output(f, gp, error);
}

/* Every task of the plan, predicted against measured, into @path (PREFIX-tasks.csv); the
 * predicted and measured time of each class is summed into @pred and @meas. */
static gboolean compare_tasks(const CliExec *e, const SimReport *rep, const char *path,
                              double *pred, double *meas, GError **error)
{
  int n = sim_plan_n_tasks(e->plan);
  const double *ms = exec_run_task_start(e->run), *me = exec_run_task_end(e->run);
  const double *busy = exec_run_task_busy(e->run);
  FILE *tcsv = open_out(path, error);
  if (!tcsv)
    return FALSE;
  fprintf(tcsv, "task,kind,class,device,peer,op,mb,predicted_start_s,predicted_end_s,"
                "measured_start_s,measured_end_s,measured_busy_s\n");
  for (int i = 0; i < n; i++) {
    SimPlanTask t;
    sim_plan_task(e->plan, i, &t);
    SimTaskRecord rec;
    gboolean have = sim_report_record(rep, i, &rec) && rec.start >= 0;
    if (have && (!strcmp(rec.kind, "compute") || !strcmp(rec.kind, "flow"))) {
      int c = class_index(rec.cls);
      if (c >= 0)
        pred[c] += rec.end - rec.start;
    }
    const char *cls = task_class(&t);
    if (cls && ms[i] >= 0)
      meas[class_index(cls)] += busy[i];
    if (!cls && !(have && !strcmp(rec.kind, "flow")))
      continue;
    fprintf(tcsv, "%d,%s,%s,%d,%d,%s,%d,%.9g,%.9g,%.9g,%.9g,%.9g\n", i, kind_name(t.kind),
            cls ? cls : rec.cls, t.device, t.peer,
            t.op >= 0 ? sim_graph_op_name(e->pb.graph, t.op) : "", t.mb, have ? rec.start : -1,
            have ? rec.end : -1, ms[i], me[i], busy[i]);
  }
  return cli_close_output(tcsv, path, error);
}

/* The comparison per class and in total: printed as a table (or as JSON with @json) and
 * written to @path (PREFIX.csv). */
static gboolean print_classes(const CliExec *e, int steps, gboolean json, const char *path,
                              const double *pred, const double *meas, double pred_total,
                              double meas_total, GError **error)
{
  g_autoptr(JsonBuilder) jb = json ? json_builder_new() : NULL;
  if (jb) {
    json_builder_begin_object(jb);
    json_builder_set_member_name(jb, "model");
    json_builder_add_string_value(jb, sim_graph_get_name(e->pb.graph));
    json_builder_set_member_name(jb, "machine");
    json_builder_add_string_value(jb, sim_machine_get_name(e->pb.machine));
    json_builder_set_member_name(jb, "devices");
    json_builder_add_int_value(jb, cli_exec_devices_used(e->plan));
    json_builder_set_member_name(jb, "gpu");
    json_builder_add_string_value(jb, sim_machine_device_spec(e->pb.machine, 0)->name);
    json_builder_set_member_name(jb, "backend");
    json_builder_add_string_value(jb, exec_backend_get_name(e->backend));
    json_builder_set_member_name(jb, "step");
    json_builder_add_int_value(jb, steps);
    json_builder_set_member_name(jb, "classes");
    json_builder_begin_array(jb);
  } else {
    printf("%s on %s, %d devices: simulated (%s) against executed (back end %s, step %d)\n",
           sim_graph_get_name(e->pb.graph), sim_machine_get_name(e->pb.machine),
           cli_exec_devices_used(e->plan), sim_machine_device_spec(e->pb.machine, 0)->name,
           exec_backend_get_name(e->backend), steps);
    printf("%-12s %14s %14s %10s\n", "class", "predicted", "measured", "ratio");
  }
  FILE *csv = open_out(path, error);
  if (!csv)
    return FALSE;
  fprintf(csv, "class,predicted_s,measured_s\n");
  for (guint k = 0; k < N_CLASSES; k++) {
    if (pred[k] == 0 && meas[k] == 0)
      continue;
    if (jb) {
      json_builder_begin_object(jb);
      json_builder_set_member_name(jb, "class");
      json_builder_add_string_value(jb, classes[k]);
      json_builder_set_member_name(jb, "predicted_s");
      json_builder_add_double_value(jb, pred[k]);
      json_builder_set_member_name(jb, "measured_s");
      json_builder_add_double_value(jb, meas[k]);
      json_builder_end_object(jb);
    } else {
      g_autofree char *tp = cli_format_time(pred[k]);
      g_autofree char *tm = cli_format_time(meas[k]);
      g_autofree char *r = pred[k] > 0 ? g_strdup_printf("%.3g", meas[k] / pred[k])
                                       : g_strdup("-");
      printf("%-12s %14s %14s %10s\n", classes[k], tp, tm, r);
    }
    fprintf(csv, "%s,%.9g,%.9g\n", classes[k], pred[k], meas[k]);
  }
  if (jb) {
    json_builder_end_array(jb);
    json_builder_set_member_name(jb, "iteration_predicted_s");
    json_builder_add_double_value(jb, pred_total);
    json_builder_set_member_name(jb, "iteration_measured_s");
    json_builder_add_double_value(jb, meas_total);
    json_builder_end_object(jb);
    cli_print_json(jb);
  } else {
    g_autofree char *tp = cli_format_time(pred_total);
    g_autofree char *tm = cli_format_time(meas_total);
    printf("%-12s %14s %14s %10.3g\n", "iteration", tp, tm, meas_total / pred_total);
  }
  fprintf(csv, "iteration,%.9g,%.9g\n", pred_total, meas_total);
  return cli_close_output(csv, path, error);
}

int cmd_validate(int argc, char **argv)
{
  g_autofree char *model = NULL, *machine = NULL, *strategy_file = NULL, *prefix = NULL;
  g_auto(GStrv) params = NULL;
  gboolean json = FALSE;
  g_auto(CliPlanOptions) plan;
  cli_plan_options_init(&plan);
  CliExecOptions eo;
  cli_exec_options_init(&eo, 3);
  GOptionEntry entries[] = {
    { "model", 'm', 0, G_OPTION_ARG_STRING, &model, "Zoo model or graph file (default " CLI_DEFAULT_MODEL " with a tiny size: " CLI_DEFAULT_EXEC_PARAMS ")", "M" },
    { "param", 'p', 0, G_OPTION_ARG_STRING_ARRAY, &params, "Model parameter k=v (repeatable)", "K=V" },
    { "machine", 'x', 0, G_OPTION_ARG_STRING, &machine, "Library machine or file (default " CLI_DEFAULT_MACHINE ")", "X" },
    { "strategy", 's', 0, G_OPTION_ARG_FILENAME, &strategy_file, "Strategy file", "FILE" },
    { "json", 0, 0, G_OPTION_ARG_NONE, &json, "Print the comparison as JSON", NULL },
    { "out", 'o', 0, G_OPTION_ARG_FILENAME, &prefix, "Write PREFIX.csv, PREFIX-tasks.csv, PREFIX.gp and PREFIX.png (default validate)", "PREFIX" },
    { NULL },
  };
  g_autoptr(GOptionContext) ctx = g_option_context_new("- predicted against measured time of a plan");
  g_option_context_set_summary(ctx,
    "Simulates the plan of MODEL on MACHINE under a strategy and executes the same plan\n"
    "for --steps training steps; compares the simulator's timeline with the last step's\n"
    "measured one per class of task (forward, backward, recompute, update, transfer,\n"
    "reduction, grad-sync, param-sync) and in total.  The predictions are for MACHINE's\n"
    "GPUs: with the cpu back end the measured times are the host's and differ by orders\n"
    "of magnitude, which exercises the mechanism only; --backend cuda on the machine the\n"
    "plan describes makes the comparison meaningful.");
  g_option_context_add_main_entries(ctx, entries, NULL);
  g_option_context_add_group(ctx, cli_exec_option_group(&eo));
  g_option_context_add_group(ctx, cli_plan_option_group(&plan));
  if (!cli_parse_options(ctx, &argc, &argv)) {
    cli_exec_options_clear(&eo);
    return CLI_EXIT_USAGE;
  }
  if (argc > 1) {
    cli_exec_options_clear(&eo);
    return cli_usage_error("validate", "unexpected argument '%s'", argv[1]);
  }
  static const char *const tiny[] = { CLI_DEFAULT_EXEC_PARAMS, NULL };
  GError *error = NULL;
  CliExec e;
  SimReport *rep = NULL;
  int status = CLI_EXIT_OK;
  const char *base = prefix ? prefix : "validate";
  g_autofree char *csv_path = g_strconcat(base, ".csv", NULL);
  g_autofree char *tasks_path = g_strconcat(base, "-tasks.csv", NULL);
  g_autofree char *gp_path = g_strconcat(base, ".gp", NULL);
  g_autofree char *png_path = g_strconcat(base, ".png", NULL);
  g_autofree char *title = NULL;
  if (!cli_exec_setup(&e, model ? model : CLI_DEFAULT_MODEL, model ? params : (char **)tiny,
                      machine ? machine : CLI_DEFAULT_MACHINE, strategy_file, &plan, &eo, &error))
    goto fail;
  rep = sim_plan_simulate(e.plan, &error);
  if (!rep)
    goto fail;
  for (int k = 0; k < eo.steps; k++)
    if (!exec_run_step(e.run, &error))
      goto fail;

  double pred[N_CLASSES] = { 0 }, meas[N_CLASSES] = { 0 };
  if (!compare_tasks(&e, rep, tasks_path, pred, meas, &error))
    goto fail;

  double pred_total = sim_report_iteration_time(rep), meas_total = exec_run_step_time(e.run);
  if (!print_classes(&e, eo.steps, json, csv_path, pred, meas, pred_total, meas_total, &error))
    goto fail;
  if (!json && !strcmp(exec_backend_get_name(e.backend), "cpu"))
    printf("(predictions are for the machine's GPUs; the cpu back end measures this host's "
           "CPU, so only the mechanism is compared)\n");
  title = g_strdup_printf("%s on %s: predicted vs measured (%s back end)",
                          sim_graph_get_name(e.pb.graph), sim_machine_get_name(e.pb.machine),
                          exec_backend_get_name(e.backend));
  if (!write_plot(gp_path, png_path, title, pred, meas, pred_total, meas_total, &error))
    goto fail;
  cli_run_gnuplot("validate", csv_path, gp_path, png_path);
  goto done;

fail:
  status = cli_exec_report_error(error);
done:
  if (rep)
    sim_report_free(rep);
  cli_exec_clear(&e);
  cli_exec_options_clear(&eo);
  return status;
}
