/* cmd-profile-fit.c — the `parasol profile` subcommands that hold measurements against
 * the models: calibrate (fits the roofline and collective models to a database), compare
 * (predictions against measurements, shape by shape) and perf (achieved GFLOP/s and GB/s
 * per kernel). */
#include "profile-options.h"

#include <json-glib/json-glib.h>
#include <math.h>
#include <string.h>

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

/* The fitted roofline efficiencies and their errors, as members of @jb. */
static void add_roofline(JsonBuilder *jb, const ProfileCalibration *cal)
{
  json_builder_set_member_name(jb, "roofline");
  json_builder_begin_object(jb);
  const char *names[] = { "gemm_efficiency", "conv_efficiency", "memory_efficiency",
                          "gather_efficiency", "recurrent_efficiency" };
  double v[] = { cal->params.gemm_efficiency, cal->params.conv_efficiency,
                 cal->params.memory_efficiency, cal->params.gather_efficiency,
                 cal->params.recurrent_efficiency };
  for (int i = 0; i < 5; i++) {
    json_builder_set_member_name(jb, names[i]);
    json_builder_add_double_value(jb, v[i]);
  }
  json_builder_set_member_name(jb, "entries");
  json_builder_add_int_value(jb, cal->n_entries);
  json_builder_set_member_name(jb, "mean_abs_error_before");
  json_builder_add_double_value(jb, cal->mean_abs_error_before);
  json_builder_set_member_name(jb, "mean_abs_error_after");
  json_builder_add_double_value(jb, cal->mean_abs_error_after);
  json_builder_set_member_name(jb, "worst_error_after");
  json_builder_add_double_value(jb, cal->worst_error_after);
  json_builder_end_object(jb);
}

/* The @worst entries of @gpu that the fitted roofline model misjudges most: they show
 * which kernels it gets wrong. */
static void print_worst_entries(const ProfileDb *db, const char *gpu, const SimDeviceSpec *dev,
                                const SimRooflineParams *params, int worst)
{
  int n = profile_db_n_ops(db);
  g_autofree double *res = g_new(double, MAX(n, 1));
  g_autofree int *idx = g_new(int, MAX(n, 1));
  int k = 0;
  for (int i = 0; i < n; i++) {
    if (strcmp(profile_db_op(db, i)->gpu, gpu))
      continue;
    double r = profile_calibration_residual(db, i, dev, params);
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

/* The roofline fit as text: the default and fitted efficiencies, the errors before and
 * after, and the worst-fitting entries. */
static void print_roofline(const ProfileDb *db, const char *gpu, const SimDeviceSpec *dev,
                           const ProfileCalibration *cal, int worst)
{
  SimRooflineParams def = sim_roofline_params_default();
  printf("roofline fit for %s on %s (%d entries)\n", gpu, dev->vendor_name, cal->n_entries);
  print_params("default efficiencies:", &def, NULL);
  print_params("fitted efficiencies:", &cal->params, cal->fitted);
  printf("mean |error|  %.1f%% before, %.1f%% after (worst %.1f%%)\n",
         100 * cal->mean_abs_error_before, 100 * cal->mean_abs_error_after,
         100 * cal->worst_error_after);
  printf("rms log error %.3f before, %.3f after\n", cal->rms_log_before, cal->rms_log_after);
  print_worst_entries(db, gpu, dev, &cal->params, worst);
}

/* Fits the ring model of each collective that @gpu has entries of, on the link between
 * devices 0 and 1 of @m, and prints it (as members of @jb where not NULL); TRUE when any
 * was fitted. */
static gboolean fit_collectives(const ProfileDb *db, const char *gpu, const SimMachine *m,
                                JsonBuilder *jb)
{
  gboolean any = FALSE;
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
    if (jb) {
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
  return any;
}

int cli_profile_calibrate(int argc, char **argv)
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
  const SimDeviceSpec *dev = cli_profile_spec_for(machine, gpu, &m, &error);
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
    if (json)
      add_roofline(jb, &cal);
    else
      print_roofline(db, gpu, dev, &cal, worst);
  }
  if (fit_collectives(db, gpu, m, json ? jb : NULL))
    any = TRUE;
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

static int compare_run(CliProfileOptions *mo, int argc, char **argv, FILE **out)
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
  g_option_context_add_group(ctx, cli_profile_option_group(mo));
  if (!cli_parse_options(ctx, &argc, &argv))
    return CLI_EXIT_USAGE;
  if (argc > 1)
    return cli_usage_error("profile compare", "unexpected argument '%s'", argv[1]);
  if (no_measure && !db_path)
    return cli_usage_error("profile compare", "--no-measure needs --db");
  GError *error = NULL;
  g_autoptr(SimGraph) g = cli_profile_load_model(mo, &error);
  if (!g)
    return cli_report_error(error);
  g_autoptr(ProfileShapes) shapes = cli_profile_enumerate(mo, g, &error);
  if (!shapes)
    return cli_report_error(error);
  g_autoptr(ProfileDb) db = NULL;
  if (db_path && !(db = profile_db_load(db_path, &error)))
    return cli_report_error(error);
  g_autoptr(ProfileRunner) r = NULL;
  if (!no_measure && !(r = cli_profile_make_runner(mo, &error)))
    return cli_profile_error(error);
  g_autofree char *gpu = g_strdup(r ? profile_runner_device_name(r) : mo->gpu);
  if (!gpu) {
    g_auto(GStrv) devs = profile_db_devices(db);
    if (g_strv_length(devs) != 1)
      return cli_usage_error("profile compare", "name the device with --gpu");
    gpu = g_strdup(devs[0]);
  }
  g_autoptr(SimMachine) sm = NULL;
  g_autoptr(GError) serr = NULL;
  const SimDeviceSpec *dev = cli_profile_spec_for(spec_machine, gpu, &sm, &serr);
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
  ProfileMeasureOptions meas = cli_profile_measure_options(mo);
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
            return cli_profile_error(g_steal_pointer(&merr));
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

int cli_profile_compare(int argc, char **argv)
{
  CliProfileOptions mo;
  cli_profile_options_init(&mo);
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
  cli_profile_options_clear(&mo);
  return status;
}

static int perf_run(CliProfileOptions *mo, int argc, char **argv, FILE **out)
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
  g_option_context_add_group(ctx, cli_profile_option_group(mo));
  if (!cli_parse_options(ctx, &argc, &argv))
    return CLI_EXIT_USAGE;
  if (argc > 1 || !(budget_ms > 0))
    return cli_usage_error("profile perf", "expected a positive --budget-ms and no arguments");
  GError *error = NULL;
  g_autoptr(SimGraph) g = cli_profile_load_model(mo, &error);
  if (!g)
    return cli_report_error(error);
  g_autoptr(ProfileShapes) shapes = cli_profile_enumerate(mo, g, &error);
  if (!shapes)
    return cli_report_error(error);
  g_autoptr(ProfileRunner) r = cli_profile_make_runner(mo, &error);
  if (!r)
    return cli_profile_error(error);
  g_autoptr(SimMachine) sm = NULL;
  const SimDeviceSpec *dev =
    cli_profile_spec_for(spec_machine, profile_runner_device_name(r), &sm, NULL);
  g_autoptr(SimCostModel) roof = sim_cost_model_new_roofline(NULL);
  if (!(*out = open_table(csv, table_json, &error)))
    return cli_report_error(error);
  fprintf(*out, "backend,device,op,pass,key,runs,median_us,gflop,mbytes,gflops,gbps,roofline_us\n");
  ProfileMeasureOptions meas = cli_profile_measure_options(mo);
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
          return cli_profile_error(g_steal_pointer(&merr));
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

int cli_profile_perf(int argc, char **argv)
{
  CliProfileOptions mo;
  cli_profile_options_init(&mo);
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
  cli_profile_options_clear(&mo);
  return status;
}
