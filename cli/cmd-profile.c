/* cmd-profile.c — `parasol profile`: measures operator shards and collectives into a
 * profile database, imports collective timings measured elsewhere, and shows a database;
 * the subcommands that fit and check the models against it (calibrate, compare, perf)
 * are in cmd-profile-fit.c, the options they share in profile-options.c. */
#include "profile-options.h"

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

/* ---------------------------------------------------------------------------------- */
/* parasol profile ops                                                                 */

static int ops_run(CliProfileOptions *mo, int argc, char **argv)
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
  g_option_context_add_group(ctx, cli_profile_option_group(mo));
  if (!cli_parse_options(ctx, &argc, &argv))
    return CLI_EXIT_USAGE;
  if (argc > 1)
    return cli_usage_error("profile ops", "unexpected argument '%s'", argv[1]);
  if (!list && !output)
    return cli_usage_error("profile ops", "--output FILE is required");
  GError *error = NULL;
  g_autoptr(SimGraph) g = cli_profile_load_model(mo, &error);
  if (!g)
    return cli_report_error(error);
  g_autoptr(ProfileShapes) shapes = cli_profile_enumerate(mo, g, &error);
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
  g_autoptr(ProfileRunner) r = cli_profile_make_runner(mo, &error);
  if (!r)
    return cli_profile_error(error);
  ProfileMeasureOptions meas = cli_profile_measure_options(mo);
  g_printerr("parasol: measuring %d distinct shapes of %s on %s (%s)\n", profile_shapes_n(shapes),
             sim_graph_get_name(g), profile_runner_device_name(r), r->klass->name);
  int skipped = 0, done = 0;
  /* Ctrl-C ends the measurement and keeps what was measured. */
  meas.stop = cli_interrupted();
  cli_interrupt_catch();
  int added = profile_measure_shapes(r, db, g, shapes, &meas, cli_profile_progress, &done,
                                     &skipped, &error);
  cli_interrupt_release();
  if (added < 0)
    return cli_profile_error(error);
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
    return cli_profile_error(error);
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
  CliProfileOptions mo;
  cli_profile_options_init(&mo);
  int status = ops_run(&mo, argc, argv);
  cli_profile_options_clear(&mo);
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
  if (!cli_profile_parse_int_list(gpus ? gpus : "2,4,8", "--gpus", counts, &error))
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
        return cli_profile_error(error);
      }
      measured++;
    }
  }
  profile_db_add_source(db, "parasol profile collectives (NCCL)");
  if (!cli_make_parent(output, &error) || !profile_db_save(db, output, &error))
    return cli_profile_error(error);
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
    return cli_profile_error(error);
  if (json)
    print_collectives_json(db, output);
  else
    printf("%d collective entries in %s\n", profile_db_n_collectives(db), output);
  return CLI_EXIT_OK;
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
    { "calibrate", cli_profile_calibrate },
    { "compare", cli_profile_compare },
    { "perf", cli_profile_perf },
    { "show", profile_show },
  };
  for (gsize i = 0; i < G_N_ELEMENTS(subs); i++)
    if (!strcmp(sub, subs[i].name))
      return subs[i].run(argc - 1, argv + 1);
  return cli_usage_error("profile", "unknown command '%s'; 'parasol profile --help' lists them",
                         sub);
}
