/* cmd-compare.c — parasol compare: runs several search algorithms with several seeds on the
 * same problem and budget, writes every improvement as CSV and draws the best predicted
 * iteration time against search time with gnuplot. */
#include "cli.h"
#include "search-options.h"

#include <json-glib/json-glib.h>

#include <errno.h>
#include <glib/gstdio.h>
#include <sys/stat.h>
#include <unistd.h>
#include <math.h>
#include <signal.h>
#include <string.h>

/* The share of each run's budget (in seconds) its search takes; the rest is left for
 * the data-parallel yardstick and the figure. */
#define COMPARE_SHARE 0.95
/* Each run's budget without --budget: three algorithms with three seeds take 45 s. */
#define COMPARE_DEFAULT_BUDGET "5s"

typedef struct {
  const SearchAlgorithm *algo;
  guint64 seed;
  double final;
  double elapsed;
  gint64 evals;
  double t95;
  GArray *points;   /* double pairs: wall, best */
  int index;        /* in the order of the runs: algorithm, then seed */
  GString *rows;    /* its lines of the CSV */
} Run;

static int compare_doubles(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n)
{
  if (n == 0)
    return NAN;
  qsort(v, (size_t)n, sizeof(double), compare_doubles);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Under mpirun the runs are divided among the ranks by index (docs/distributed.md): rank 0
 * gets the others' (their figures, improvements and CSV lines as text, doubles in hex)
 * and puts every run in its place, in the order one process makes them. */
static void gather_runs(GPtrArray *algos, int seeds, Run *runs, int *n_runs)
{
  g_autoptr(GString) t = g_string_new(NULL);
  for (int i = 0; i < *n_runs; i++) {
    Run *r = &runs[i];
    g_string_append_printf(t, "%d %a %a %" G_GINT64_FORMAT " %a %u %" G_GSIZE_FORMAT "\n",
                           r->index, r->final, r->elapsed, r->evals, r->t95, r->points->len,
                           r->rows->len);
    for (guint k = 0; k < r->points->len; k++)
      g_string_append_printf(t, "%a ", g_array_index(r->points, double, k));
    g_string_append_c(t, '\n');
    g_string_append_len(t, r->rows->str, (gssize)r->rows->len);
  }
  g_auto(GStrv) all = search_mpi_gather_text(t->str);
  if (search_mpi_rank() > 0)
    return;
  if (!all) {
    /* A rank lost, or a signal while waiting for the others: rank 0's runs are kept. */
    g_printerr("parasol compare: %s; the results are rank 0's runs only\n",
               search_mpi_note() ? search_mpi_note() : "the other ranks' runs did not come");
    return;
  }
  int total = (int)algos->len * seeds;
  g_autofree Run *placed = g_new0(Run, total);
  for (int rank = 1; all[rank]; rank++) {
    char *at = all[rank];
    while (*at) {
      Run r = { 0 };
      guint np;
      gsize rows;
      char *end;
      r.index = (int)strtol(at, &end, 10);
      r.final = g_ascii_strtod(end, &end);
      r.elapsed = g_ascii_strtod(end, &end);
      r.evals = g_ascii_strtoll(end, &end, 10);
      r.t95 = g_ascii_strtod(end, &end);
      np = (guint)g_ascii_strtoull(end, &end, 10);
      rows = (gsize)g_ascii_strtoull(end, &end, 10);
      if (r.index < 0 || r.index >= total || *end != '\n')
        break;
      r.algo = g_ptr_array_index(algos, r.index / seeds);
      r.seed = (guint64)(r.index % seeds + 1);
      r.points = g_array_new(FALSE, FALSE, sizeof(double));
      for (guint k = 0; k < np; k++) {
        double v = g_ascii_strtod(end, &end);
        g_array_append_val(r.points, v);
      }
      end = strchr(end, '\n');
      if (!end || strlen(end + 1) < rows) {
        g_array_unref(r.points);
        break;
      }
      r.rows = g_string_new_len(end + 1, (gssize)rows);
      at = end + 1 + rows;
      placed[r.index] = r;
    }
  }
  for (int i = 0; i < *n_runs; i++)
    placed[runs[i].index] = runs[i];
  int n = 0;
  for (int i = 0; i < total; i++)
    if (placed[i].points)
      runs[n++] = placed[i];
  *n_runs = n;
}

/* Whether @a reads option @key ("key=value"), or the algorithm its "inner" option names
 * does (default dp, as subst's). */
static gboolean algo_knows(const SearchAlgorithm *a, const char *opt, char **opts)
{
  g_autofree char *key = g_strndup(opt, strcspn(opt, "="));
  for (const SearchOptionSpec *s = a->options; s && s->name; s++) {
    if (!strcmp(s->name, key))
      return TRUE;
    if (!strcmp(s->name, "inner")) {
      const char *inner = "dp";
      for (char **it = opts; it && *it; it++)
        if (g_str_has_prefix(*it, "inner="))
          inner = *it + strlen("inner=");
      const SearchAlgorithm *in = search_lookup(inner);
      if (in && in != a && algo_knows(in, opt, opts))
        return TRUE;
    }
  }
  return FALSE;
}

/* A gnuplot script with the data inline (datablocks), so the figure can be redrawn from
 * the script alone. */
static gboolean write_plot(const char *gp, const char *png, const char *title, Run *runs,
                           int n_runs, GPtrArray *algos, double dp_time, GError **error)
{
  FILE *f = fopen(gp, "w");
  if (!f) {
    int e = errno;
    g_set_error(error, SIM_ERROR, SIM_ERROR_IO, "cannot write %s: %s", gp, g_strerror(e));
    return FALSE;
  }
  fprintf(f, "# parasol compare: best predicted iteration time against search time.\n");
  for (guint a = 0; a < algos->len; a++) {
    const SearchAlgorithm *algo = g_ptr_array_index(algos, a);
    fprintf(f, "$a%u << EOD\n", a);
    for (int i = 0; i < n_runs; i++) {
      if (runs[i].algo != algo)
        continue;
      for (guint k = 0; k < runs[i].points->len / 2; k++)
        fprintf(f, "%.6f %.9g\n", g_array_index(runs[i].points, double, 2 * k),
                1e3 * g_array_index(runs[i].points, double, 2 * k + 1));
      fprintf(f, "\n");
    }
    fprintf(f, "EOD\n");
  }
  g_autofree char *preamble = cli_gnuplot_preamble(png, title);
  fputs(preamble, f);
  fprintf(f,
          "set xlabel 'search time (s)'\n"
          "set ylabel 'best predicted iteration time (ms)'\n"
          "set key outside right top noenhanced\n"
          "set grid\n");
  GString *plot = g_string_new("plot ");
  for (guint a = 0; a < algos->len; a++) {
    const SearchAlgorithm *algo = g_ptr_array_index(algos, a);
    g_string_append_printf(plot, "%s$a%u using 1:2 with steps linewidth 2 linecolor %u title '%s'",
                           a ? ", \\\n     " : "", a, a + 1, algo->name);
  }
  if (isfinite(dp_time))
    g_string_append_printf(plot, ", \\\n     %.9g with lines dashtype 2 linecolor 'gray' "
                                 "title 'data parallel'", 1e3 * dp_time);
  fprintf(f, "%s\n", plot->str);
  g_string_free(plot, TRUE);
  gboolean bad = ferror(f) != 0;
  if (fclose(f) != 0 || bad) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_IO, "cannot write %s", gp);
    return FALSE;
  }
  return TRUE;
}

static void add_time(JsonBuilder *b, const char *name, double t)
{
  json_builder_set_member_name(b, name);
  if (isfinite(t))
    json_builder_add_double_value(b, t);
  else
    json_builder_add_null_value(b);
}

/* One algorithm's runs summed up, as the table and --json give them. */
typedef struct {
  double best;       /* the best final time of its runs; +inf when none is feasible */
  double median;     /* the median of the feasible final times; NAN when none        */
  double median_95;  /* the median time to 95% of the runs that reached it; NAN: none */
  double evals_per_s;
} AlgoSummary;

static void summarize(const SearchAlgorithm *algo, const Run *runs, int n_runs, AlgoSummary *out)
{
  double finals[1000], t95[1000];
  int nf = 0, nt = 0;
  double best = INFINITY, evals = 0, wall = 0;
  for (int i = 0; i < n_runs; i++) {
    if (runs[i].algo != algo)
      continue;
    if (isfinite(runs[i].final))
      finals[nf++] = runs[i].final;
    if (!isnan(runs[i].t95))
      t95[nt++] = runs[i].t95;
    best = MIN(best, runs[i].final);
    evals += (double)runs[i].evals;
    wall += runs[i].elapsed;
  }
  out->best = best;
  out->median = median(finals, nf);
  out->median_95 = median(t95, nt);
  out->evals_per_s = wall > 0 ? evals / wall : 0.0;
}

/* What the command was asked and what it holds: the options, the problem, the runs and
 * the files it writes. */
typedef struct {
  char *model, *machine, *algos_text, *prefix;
  char **params;
  int seeds;
  gboolean quiet, json;
  CliPlanOptions plan;
  CliSearchOptions so;

  CliProblem pb;
  SearchProblem *problem;
  GPtrArray *algos;            /* the SearchAlgorithm of each --algos name, in order       */
  SearchRunOptions ro;
  gint64 t_start, cmd_deadline;
  Run *runs;                   /* the runs made, in the order of their index               */
  int n_runs, total_runs;
  char *csv_path, *gp_path, *png_path;
  char *csv_tmp;               /* the CSV being written, renamed to csv_path when complete */
  FILE *csv;
  double dp_time;              /* the data-parallel yardstick; +inf when not simulated     */
} Compare;

/* What the functions below return to go on (any other value is the exit status, with the
 * error already printed). */
#define GO_ON (-1)

/* The summary as --json prints it: the problem, the data-parallel yardstick and, per
 * algorithm, the text's columns and every run (times in seconds, null for none). */
static void print_json(const Compare *c)
{
  g_autoptr(JsonBuilder) b = json_builder_new();
  json_builder_begin_object(b);
  json_builder_set_member_name(b, "model");
  json_builder_add_string_value(b, sim_graph_get_name(c->pb.graph));
  json_builder_set_member_name(b, "machine");
  json_builder_add_string_value(b, sim_machine_get_name(c->pb.machine));
  json_builder_set_member_name(b, "gpus");
  json_builder_add_int_value(b, sim_machine_n_devices(c->pb.machine));
  json_builder_set_member_name(b, "budget");
  json_builder_add_string_value(b, c->so.budget);
  json_builder_set_member_name(b, "seeds");
  json_builder_add_int_value(b, c->seeds);
  add_time(b, "data_parallel_s", c->dp_time);
  json_builder_set_member_name(b, "algorithms");
  json_builder_begin_array(b);
  for (guint a = 0; a < c->algos->len; a++) {
    const SearchAlgorithm *algo = g_ptr_array_index(c->algos, a);
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "algorithm");
    json_builder_add_string_value(b, algo->name);
    json_builder_set_member_name(b, "runs");
    json_builder_begin_array(b);
    for (int i = 0; i < c->n_runs; i++) {
      const Run *r = &c->runs[i];
      if (r->algo != algo)
        continue;
      json_builder_begin_object(b);
      json_builder_set_member_name(b, "seed");
      json_builder_add_int_value(b, (gint64)r->seed);
      add_time(b, "best_s", r->final);
      json_builder_set_member_name(b, "evals");
      json_builder_add_int_value(b, r->evals);
      json_builder_set_member_name(b, "elapsed_s");
      json_builder_add_double_value(b, r->elapsed);
      add_time(b, "to_95_s", isnan(r->t95) ? INFINITY : r->t95);
      json_builder_end_object(b);
    }
    json_builder_end_array(b);
    AlgoSummary sum;
    summarize(algo, c->runs, c->n_runs, &sum);
    add_time(b, "best_s", sum.best);
    add_time(b, "median_s", sum.median);
    add_time(b, "speedup_over_data_parallel",
             isfinite(sum.best) && isfinite(c->dp_time) ? c->dp_time / sum.best : INFINITY);
    add_time(b, "median_to_95_s", isnan(sum.median_95) ? INFINITY : sum.median_95);
    json_builder_set_member_name(b, "evals_per_s");
    json_builder_add_double_value(b, sum.evals_per_s);
    json_builder_end_object(b);
  }
  json_builder_end_array(b);
  json_builder_end_object(b);
  g_autoptr(JsonGenerator) gen = json_generator_new();
  g_autoptr(JsonNode) root = json_builder_get_root(b);
  json_generator_set_root(gen, root);
  json_generator_set_pretty(gen, TRUE);
  g_autofree char *text = json_generator_to_data(gen, NULL);
  printf("%s\n", text);
}

/* The summary as a table: per algorithm over its seeds. */
static void print_table(const Compare *c)
{
  printf("model %s on %s (%d GPUs), budget %s, %d seed%s\n", sim_graph_get_name(c->pb.graph),
         sim_machine_get_name(c->pb.machine), sim_machine_n_devices(c->pb.machine),
         c->so.budget, c->seeds, c->seeds == 1 ? "" : "s");
  printf("%-14s %12s %12s %10s %12s %10s\n", "algorithm", "best", "median", "vs dp", "to 95% (s)",
         "evals/s");
  for (guint a = 0; a < c->algos->len; a++) {
    const SearchAlgorithm *algo = g_ptr_array_index(c->algos, a);
    AlgoSummary sum;
    summarize(algo, c->runs, c->n_runs, &sum);
    g_autofree char *tb = isfinite(sum.best) ? cli_format_time(sum.best) : g_strdup("none");
    g_autofree char *tm = isfinite(sum.median) ? cli_format_time(sum.median) : g_strdup("none");
    g_autofree char *sp = isfinite(sum.best) && isfinite(c->dp_time)
                            ? g_strdup_printf("%.2fx", c->dp_time / sum.best) : g_strdup("n/a");
    printf("%-14s %12s %12s %10s %12.2f %10.0f\n", algo->name, tb, tm, sp,
           isnan(sum.median_95) ? 0.0 : sum.median_95, sum.evals_per_s);
  }
}

/* Parses the command line into @c. */
static int parse_options(Compare *c, int argc, char **argv)
{
  GOptionEntry entries[] = {
    { "model", 'm', 0, G_OPTION_ARG_STRING, &c->model, "Zoo model or graph file (default " CLI_DEFAULT_MODEL ")", "M" },
    { "param", 'p', 0, G_OPTION_ARG_STRING_ARRAY, &c->params, "Model parameter k=v (repeatable)", "K=V" },
    { "machine", 'x', 0, G_OPTION_ARG_STRING, &c->machine, "Library machine (dgx-a100:4) or file (default " CLI_DEFAULT_MACHINE ")", "X" },
    { "algos", 'A', 0, G_OPTION_ARG_STRING, &c->algos_text, "Algorithms, comma-separated (default mcmc,dp,beam)", "LIST" },
    { "seeds", 'k', 0, G_OPTION_ARG_INT, &c->seeds, "Seeds per algorithm: 1..K (default 3)", "K" },
    { "out", 0, 0, G_OPTION_ARG_FILENAME, &c->prefix, "Write PREFIX.csv, PREFIX.gp and PREFIX.png (default compare)", "PREFIX" },
    { "quiet", 'q', 0, G_OPTION_ARG_NONE, &c->quiet, "No progress lines", NULL },
    { "json", 0, 0, G_OPTION_ARG_NONE, &c->json, "Print the summary and every run as JSON", NULL },
    { NULL },
  };
  g_autoptr(GOptionContext) ctx = g_option_context_new("- compare search algorithms");
  g_option_context_set_summary(ctx,
    "Runs each algorithm with seeds 1..K on MODEL and MACHINE with the same budget, writes\n"
    "every improvement to PREFIX.csv (algo, seed, wall_s, evals, best_s) and a gnuplot\n"
    "figure of the best predicted iteration time against search time (PREFIX.gp, .png).\n"
    "Each --opt goes to the algorithms that read it.  A budget in seconds\n"
    "is each run's (default " COMPARE_DEFAULT_BUDGET "): the command ends within that times the\n"
    "number of runs.  Ctrl-C or\n"
    "SIGTERM ends the run under way, skips the others and writes what was done.");
  /* The search options (--budget, --seed, ...) in the main group: plain --help shows them. */
  g_option_context_set_main_group(ctx, cli_search_option_group(&c->so));
  g_option_context_add_main_entries(ctx, entries, NULL);
  g_option_context_add_group(ctx, cli_plan_option_group(&c->plan));
  if (!cli_parse_options(ctx, &argc, &argv))
    return CLI_EXIT_USAGE;
  if (argc > 1)
    return cli_usage_error("compare", "unexpected argument '%s'", argv[1]);
  if (c->seeds < 1 || c->seeds > 1000)
    return cli_usage_error("compare", "--seeds %d: expected 1 to 1000", c->seeds);
  if (!c->so.budget)
    c->so.budget = g_strdup(COMPARE_DEFAULT_BUDGET);
  return GO_ON;
}

/* The algorithms, the run options and the problem. */
static int load(Compare *c)
{
  GError *error = NULL;
  if (!cli_search_setup(&c->so, &error) || !search_mpi_start(&error))
    return cli_report_error(error);
  /* Under mpirun each run is one rank's alone. */
  search_mpi_set_shared(FALSE);
  g_auto(GStrv) names = g_strsplit(c->algos_text ? c->algos_text : "mcmc,dp,beam", ",", -1);
  for (char **it = names; *it; it++) {
    char *name = g_strstrip(*it);
    if (!*name)
      continue;
    const SearchAlgorithm *a = cli_search_lookup(name, &error);
    if (!a)
      return cli_report_error(error);
    g_ptr_array_add(c->algos, (gpointer)a);
  }
  if (c->algos->len == 0)
    return cli_usage_error("compare", "--algos names no algorithm");
  if (!cli_search_check_plan(&c->plan, &error) ||
      !cli_search_run_options(&c->so, &c->ro, &error) ||
      !cli_problem_load(&c->pb, c->model ? c->model : CLI_DEFAULT_MODEL, c->params,
                        c->machine ? c->machine : CLI_DEFAULT_MACHINE, &c->plan, &error) ||
      !(c->problem = cli_search_problem(&c->pb, &c->plan, &c->so, &error)))
    return cli_report_error(error);
  return GO_ON;
}

/* The output files' names, checked, and the CSV opened beside its name with its header:
 * it is renamed at the end, so that an earlier run's file stays whole until this one is
 * complete. */
static int open_outputs(Compare *c)
{
  GError *error = NULL;
  const char *base = c->prefix ? c->prefix : "compare";
  c->csv_path = g_strconcat(base, ".csv", NULL);
  c->gp_path = g_strconcat(base, ".gp", NULL);
  c->png_path = g_strconcat(base, ".png", NULL);
  if (!cli_make_parent(c->csv_path, &error) || !cli_check_output(c->csv_path, &error) ||
      !cli_check_output(c->gp_path, &error) || !cli_check_output(c->png_path, &error))
    return cli_report_error(error);
  c->csv_tmp = g_strconcat(c->csv_path, ".XXXXXX", NULL);
  int csv_fd = g_mkstemp(c->csv_tmp);
  if (csv_fd >= 0)
    fchmod(csv_fd, 0644);
  if (csv_fd < 0 || !(c->csv = fdopen(csv_fd, "w"))) {
    int e = errno;
    if (csv_fd >= 0)
      close(csv_fd);
    g_set_error(&error, SIM_ERROR, SIM_ERROR_IO, "cannot write %s: %s", c->csv_path,
                g_strerror(e));
    g_clear_pointer(&c->csv_tmp, g_free);
    return cli_report_error(error);
  }
  fprintf(c->csv, "algo,seed,wall_s,evals,best_s\n");
  return GO_ON;
}

/* Options go to the algorithms that read them; one that none reads is a mistake. */
static int check_algorithm_options(const Compare *c)
{
  char **opts = c->so.opts;
  for (char **it = opts; it && *it; it++) {
    gboolean known = FALSE;
    for (guint a = 0; a < c->algos->len && !known; a++)
      known = algo_knows(g_ptr_array_index(c->algos, a), *it, opts);
    if (!known)
      return cli_usage_error("compare", "--opt %s: none of the algorithms has that option; "
                             "'parasol search --list' shows their options", *it);
  }
  return GO_ON;
}

/* Run @index: @algo with seed @k and the options it reads.  FALSE with @error when the
 * search could not start. */
static gboolean run_one(Compare *c, const SearchAlgorithm *algo, int k, int index,
                        GError **error)
{
  c->ro.seed = (guint64)k;
  g_autoptr(GPtrArray) mine = g_ptr_array_new();
  for (char **it = c->so.opts; it && *it; it++)
    if (algo_knows(algo, *it, c->so.opts))
      g_ptr_array_add(mine, *it);
  g_ptr_array_add(mine, NULL);
  c->ro.options = (const char *const *)mine->pdata;
  g_autoptr(SearchResult) r = search_run(algo, c->problem, &c->ro, error);
  c->ro.options = NULL;
  if (!r)
    return FALSE;
  Run *run = &c->runs[c->n_runs++];
  run->algo = algo;
  run->seed = (guint64)k;
  run->final = search_result_get_time(r);
  run->elapsed = search_result_get_elapsed(r);
  run->evals = search_result_get_evals(r);
  run->t95 = search_result_time_to(r, 0.95, NULL);
  run->points = g_array_new(FALSE, FALSE, sizeof(double));
  run->index = index;
  run->rows = g_string_new(NULL);
  char b[G_ASCII_DTOSTR_BUF_SIZE];
  for (int i = 0; i < search_result_n_improvements(r); i++) {
    double wall, best;
    gint64 evals;
    search_result_get_improvement(r, i, &wall, &evals, &best);
    g_string_append_printf(run->rows, "%s,%d,%.3f,%" G_GINT64_FORMAT ",%s\n", algo->name, k,
                           wall, evals, g_ascii_formatd(b, sizeof b, "%.9g", best));
    g_array_append_val(run->points, wall);
    g_array_append_val(run->points, best);
  }
  /* The final row carries the line to the end of the search. */
  g_string_append_printf(run->rows, "%s,%d,%.3f,%" G_GINT64_FORMAT ",%s\n", algo->name, k,
                         run->elapsed, run->evals,
                         isfinite(run->final) ? g_ascii_formatd(b, sizeof b, "%.9g", run->final)
                                              : "");
  if (isfinite(run->final)) {
    g_array_append_val(run->points, run->elapsed);
    g_array_append_val(run->points, run->final);
  }
  return TRUE;
}

/* Every algorithm with every seed (under mpirun, this rank's share, then rank 0 gathers
 * the others').  A budget in seconds is each run's: the command ends within as many
 * budgets as it has runs, each search taking COMPARE_SHARE of its budget and leaving the
 * rest to the data-parallel yardstick and the figure.  Ctrl-C or SIGTERM ends the run
 * under way (its best so far is kept) and skips the others; the table and figure are of
 * the runs made. */
static int run_all(Compare *c)
{
  search_signals_catch();
  c->ro.handle_sigint = TRUE;
  c->ro.progress = !c->quiet;
  c->total_runs = (int)c->algos->len * c->seeds;
  if (c->ro.time_budget > 0 || c->ro.eval_budget == 0) {
    double per_run = c->ro.time_budget > 0 ? c->ro.time_budget : 60.0;
    c->cmd_deadline = c->t_start + (gint64)(per_run * c->total_runs * 1e6);
    c->ro.time_budget = per_run * COMPARE_SHARE;
    c->ro.deadline_us = c->cmd_deadline;
  }
  c->runs = g_new0(Run, c->algos->len * (gsize)c->seeds);
  for (guint a = 0; a < c->algos->len && !search_signals_seen(); a++) {
    for (int k = 1; k <= c->seeds && !search_signals_seen(); k++) {
      int index = (int)a * c->seeds + k - 1;
      if (index % search_mpi_size() != search_mpi_rank())
        continue;
      GError *error = NULL;
      if (!run_one(c, g_ptr_array_index(c->algos, a), k, index, &error))
        return cli_report_error(error);
    }
  }
  if (search_mpi_size() > 1)
    gather_runs(c->algos, c->seeds, c->runs, &c->n_runs);
  return GO_ON;
}

/* The runs' lines into the CSV, which then takes its name. */
static int finish_csv(Compare *c)
{
  for (int i = 0; i < c->n_runs; i++)
    fputs(c->runs[i].rows->str, c->csv);
  gboolean bad = ferror(c->csv) != 0;
  int e = bad ? EIO : 0;
  if (fclose(c->csv) != 0 && !bad) {
    bad = TRUE;
    e = errno;
  }
  c->csv = NULL;
  if (bad || g_rename(c->csv_tmp, c->csv_path) != 0) {
    if (!bad)
      e = errno;
    GError *error = NULL;
    g_set_error(&error, SIM_ERROR, SIM_ERROR_IO, "cannot write %s: %s", c->csv_path,
                g_strerror(e));
    return cli_report_error(error);
  }
  g_clear_pointer(&c->csv_tmp, g_free);
  return GO_ON;
}

/* The data-parallel yardstick, the summary and the figure. */
static int report(Compare *c)
{
  c->dp_time = INFINITY;
  gboolean dp_done = search_problem_measure_data_parallel(c->problem, c->cmd_deadline,
                                                          &c->dp_time, NULL);
  if (search_signals_seen())
    g_printerr("parasol compare: %s; %d of %d runs made (the last one stopped early)\n",
               cli_signal_text(search_signals_first()), c->n_runs, c->total_runs);
  else if (!dp_done)
    g_printerr("parasol compare: data parallelism not simulated within the budget\n");
  if (c->json)
    print_json(c);
  else
    print_table(c);
  g_autofree char *title = g_strdup_printf("%s on %s", sim_graph_get_name(c->pb.graph),
                                           sim_machine_get_name(c->pb.machine));
  GError *error = NULL;
  if (!write_plot(c->gp_path, c->png_path, title, c->runs, c->n_runs, c->algos, c->dp_time,
                  &error))
    return cli_report_error(error);
  cli_run_gnuplot("compare", c->csv_path, c->gp_path, c->png_path);
  return GO_ON;
}

static void compare_clear(Compare *c)
{
  /* The signals stay caught until the process ends: a second one while it exits would
   * otherwise kill it after the files were written, with the signal's status. */
  if (c->csv)
    fclose(c->csv);
  if (c->csv_tmp)
    g_unlink(c->csv_tmp);
  for (int i = 0; i < c->n_runs; i++) {
    g_array_unref(c->runs[i].points);
    g_string_free(c->runs[i].rows, TRUE);
  }
  g_free(c->runs);
  /* The problem borrows the graph and machine: it goes first, unless an algorithm left
   * running at its deadline still reads them (they stay until the process ends). */
  if (search_algorithms_left_running() == 0) {
    g_clear_pointer(&c->problem, search_problem_unref);
    cli_problem_clear(&c->pb);
  }
  g_ptr_array_unref(c->algos);
  g_free(c->csv_path);
  g_free(c->gp_path);
  g_free(c->png_path);
  g_free(c->csv_tmp);
  g_free(c->model);
  g_free(c->machine);
  g_free(c->algos_text);
  g_free(c->prefix);
  g_strfreev(c->params);
  cli_plan_options_clear(&c->plan);
  cli_search_options_clear(&c->so);
}

int cmd_compare(int argc, char **argv)
{
  Compare c = { .seeds = 3, .algos = g_ptr_array_new(), .t_start = g_get_monotonic_time() };
  cli_plan_options_init(&c.plan);
  cli_search_options_init(&c.so);
  int status = parse_options(&c, argc, argv);
  if (status == GO_ON)
    status = load(&c);
  if (status == GO_ON)
    status = open_outputs(&c);
  if (status == GO_ON)
    status = check_algorithm_options(&c);
  if (status == GO_ON)
    status = run_all(&c);
  /* Under mpirun rank 0 writes. */
  if (status == GO_ON && search_mpi_rank() == 0)
    status = finish_csv(&c);
  if (status == GO_ON && search_mpi_rank() == 0)
    status = report(&c);
  compare_clear(&c);
  return status == GO_ON ? CLI_EXIT_OK : status;
}
