/* cmd-search.c — parasol search: finds a fast strategy for a model on a machine with a
 * search algorithm, prints its report and its speedup over data parallelism and over the
 * best expert plan, and writes it as a strategy file that `parasol simulate --strategy`
 * reproduces. */
#include "cli.h"
#include "search-options.h"

#include <json-glib/json-glib.h>
#include <math.h>
#include <signal.h>
#include <string.h>

static void add_time(JsonBuilder *b, const char *name, double t)
{
  json_builder_set_member_name(b, name);
  if (isfinite(t))
    json_builder_add_double_value(b, t);
  else
    json_builder_add_null_value(b);
}

static void add_json_text(JsonBuilder *b, const char *name, const char *text)
{
  json_builder_set_member_name(b, name);
  JsonNode *node = text ? json_from_string(text, NULL) : NULL;
  if (node)
    json_builder_add_value(b, node);
  else
    json_builder_add_null_value(b);
}

/* The share of the budget (in seconds, what loading the problem left of it) the search
 * gets; the yardsticks and the report of the plan kept share the rest. */
#define SEARCH_SHARE 0.8

/* The plan in Megatron's terms (search_plan_summarize()), as a JSON object. */
static void add_plan(JsonBuilder *b, const SearchPlanSummary *p)
{
  json_builder_set_member_name(b, "plan");
  json_builder_begin_object(b);
  const struct { const char *name; gint64 v; } ints[] = {
    { "tp", p->tp }, { "cp", p->cp }, { "pp", p->pp }, { "dp", p->dp }, { "ep", p->ep },
    { "microbatches", p->microbatches },
    { "microbatch_size", p->microbatch_size }, { "chunks", p->chunks },
    { "bucket_bytes", p->bucket_bytes },
  };
  for (gsize i = 0; i < G_N_ELEMENTS(ints); i++) {
    json_builder_set_member_name(b, ints[i].name);
    json_builder_add_int_value(b, ints[i].v);
  }
  json_builder_set_member_name(b, "schedule");
  json_builder_add_string_value(b, sim_schedule_name(p->schedule));
  json_builder_set_member_name(b, "sequence_parallel");
  json_builder_add_boolean_value(b, p->sequence_parallel);
  if (p->etp > 0 && p->etp != p->tp) {
    /* The experts' own tensor-parallel degree (Megatron-Core's expert layout). */
    json_builder_set_member_name(b, "etp");
    json_builder_add_int_value(b, p->etp);
  }
  if (p->tp_comm_overlap) {
    json_builder_set_member_name(b, "tp_comm_overlap");
    json_builder_add_boolean_value(b, TRUE);
  }
  json_builder_set_member_name(b, "recompute");
  json_builder_add_string_value(b, sim_recompute_name(p->recompute));
  json_builder_set_member_name(b, "zero1");
  json_builder_add_boolean_value(b, p->zero1);
  json_builder_set_member_name(b, "zero");
  json_builder_add_int_value(b, p->zero);
  if (p->offload > 0) {
    json_builder_set_member_name(b, "offload_optimizer");
    json_builder_add_double_value(b, p->offload);
  }
  json_builder_set_member_name(b, "uniform");
  json_builder_add_boolean_value(b, p->uniform);
  json_builder_set_member_name(b, "ops");
  json_builder_begin_object(b);
  const struct { const char *name; int v; } ops[] = {
    { "total", p->n_ops }, { "split_samples", p->ops_data },
    { "split_parameters", p->ops_parameter }, { "split_reductions", p->ops_reduction },
    { "split_other", p->ops_attribute }, { "unsplit", p->ops_unsplit },
  };
  for (gsize i = 0; i < G_N_ELEMENTS(ops); i++) {
    json_builder_set_member_name(b, ops[i].name);
    json_builder_add_int_value(b, ops[i].v);
  }
  json_builder_end_object(b);
  g_autofree char *text = search_plan_summary_text(p);
  json_builder_set_member_name(b, "text");
  json_builder_add_string_value(b, text);
  json_builder_end_object(b);
}

static char *speedup_text(double base, double best)
{
  if (!isfinite(base) || !isfinite(best) || best <= 0)
    return g_strdup("n/a");
  return g_strdup_printf("%.2fx", base / best);
}

/* A gnuplot script that draws the improvement log @csv: the best and the current
 * predicted iteration time against search time, with the data-parallel and expert
 * plans' times as horizontal lines where they are known. */
static gboolean write_search_plot(const char *gp, const char *png, const char *csv,
                                  const char *title, double dp, double expert, GError **error)
{
  g_autofree char *preamble = cli_gnuplot_preamble(png, title);
  g_autofree char *qcsv = cli_gnuplot_quote(csv);
  GString *t = g_string_new(NULL);
  g_string_append_printf(t,
    "# Drawn by parasol search from its improvement log; gnuplot %s redraws it.\n%s"
    "set datafile separator ','\n"
    "set xlabel 'search time (s)'\n"
    "set ylabel 'predicted iteration time (ms)'\n"
    "set key top right box opaque\n"
    "set grid\n",
    gp, preamble);
  g_string_append_printf(t,
    "plot %s every ::1 using 1:($3*1e3) with steps lw 2 title 'best so far', \\\n"
    "     '' every ::1 using 1:($4*1e3) with points pt 7 ps 0.4 title 'current'", qcsv);
  char num[G_ASCII_DTOSTR_BUF_SIZE];
  if (isfinite(dp))
    g_string_append_printf(t, ", \\\n     %s with lines dt 2 lw 2 title 'data parallel'",
                           g_ascii_formatd(num, sizeof num, "%.9g", dp * 1e3));
  if (isfinite(expert))
    g_string_append_printf(t, ", \\\n     %s with lines dt 3 lw 2 title 'expert plan'",
                           g_ascii_formatd(num, sizeof num, "%.9g", expert * 1e3));
  g_string_append(t, "\n");
  gboolean ok = g_file_set_contents(gp, t->str, (gssize)t->len, error);
  g_string_free(t, TRUE);
  return ok;
}

/* What the command was asked and what it holds: the options, the problem, the search's
 * result, the plan kept and its report. */
typedef struct {
  char *model, *machine, *algo_name, *out, *log, *plot;
  char **params;
  gboolean json, list, quiet, own;
  CliPlanOptions plan;
  CliSearchOptions so;

  gint64 t_start;
  gint64 cmd_deadline;           /* the end of the command's budget (0: an evaluation budget) */
  char *plot_stem;               /* --plot without ".png"                                  */
  CliProblem pb;
  SearchProblem *problem;
  const SearchAlgorithm *algo;
  SearchRunOptions ro;
  SearchResult *result;
  gboolean fallback;             /* the search gives way to a faster yardstick             */
  const SearchYardsticks *y;     /* once measured                                          */
  const SimStrategy *best;       /* the plan kept, for the problem bp                      */
  const SearchProblem *bp;
  double best_time;
  SimReport *report;             /* of the plan kept, where it was simulated in time       */
} Search;

/* What the functions below return to go on (any other value is the exit status, with the
 * error already printed). */
#define GO_ON (-1)

static int parse_options(Search *s, int argc, char **argv)
{
  GOptionEntry entries[] = {
    { "model", 'm', 0, G_OPTION_ARG_STRING, &s->model, "Zoo model or graph file (default " CLI_DEFAULT_MODEL ")", "M" },
    { "param", 'p', 0, G_OPTION_ARG_STRING_ARRAY, &s->params, "Model parameter k=v (repeatable)", "K=V" },
    { "machine", 'x', 0, G_OPTION_ARG_STRING, &s->machine, "Library machine (dgx-a100:4) or file (default " CLI_DEFAULT_MACHINE ")", "X" },
    { "algo", 'a', 0, G_OPTION_ARG_STRING, &s->algo_name, "Search algorithm (default mcmc; --list shows them)", "NAME" },
    { "out", 0, 0, G_OPTION_ARG_FILENAME, &s->out, "Write the best strategy (for parasol simulate --strategy)", "FILE" },
    { "log", 0, 0, G_OPTION_ARG_FILENAME, &s->log, "Write every improvement as CSV (wall_s, evals, best_s, current_s)", "FILE" },
    { "plot", 0, 0, G_OPTION_ARG_FILENAME, &s->plot, "Draw the improvement log to this PNG with gnuplot (its script beside it, .gp; the log, .csv, unless --log names one)", "FILE" },
    { "json", 0, 0, G_OPTION_ARG_NONE, &s->json, "Print the result as JSON", NULL },
    { "list", 0, 0, G_OPTION_ARG_NONE, &s->list, "List the search algorithms and their options", NULL },
    { "quiet", 'q', 0, G_OPTION_ARG_NONE, &s->quiet, "No progress line", NULL },
    { "own", 0, 0, G_OPTION_ARG_NONE, &s->own, "Write and report the algorithm's own best even where the data-parallel or expert plan is faster (searches keep the faster plan by default; the fixed plans data-parallel, expert and owt always keep their own)", NULL },
    { NULL },
  };
  g_autoptr(GOptionContext) ctx = g_option_context_new("- find a fast parallelization strategy");
  g_option_context_set_summary(ctx,
    "Searches for a fast strategy to train MODEL on MACHINE within a budget, prints its\n"
    "predicted iteration and its speedup over data parallelism and over the best expert\n"
    "plan.  A budget in seconds bounds the whole command: the search gets 80% of it, the\n"
    "yardsticks (data parallelism, the expert plans) and the report the rest, and what did\n"
    "not fit is reported as not done.  Ctrl-C or SIGTERM stops the search and writes the\n"
    "best strategy found so far (a third signal kills).  Where the data-parallel or expert\n"
    "plan is faster than what the search found, that plan is written and reported instead,\n"
    "and the output says so (--own keeps the search's; so does --allow with fewer than all\n"
    "kinds of parallelism).");
  /* The search options (--budget, --seed, ...) in the main group: plain --help shows them. */
  g_option_context_set_main_group(ctx, cli_search_option_group(&s->so));
  g_option_context_add_main_entries(ctx, entries, NULL);
  g_option_context_add_group(ctx, cli_plan_option_group(&s->plan));
  if (!cli_parse_options(ctx, &argc, &argv))
    return CLI_EXIT_USAGE;
  if (argc > 1)
    return cli_usage_error("search", "unexpected argument '%s'", argv[1]);
  return GO_ON;
}

/* The algorithm, the run options and the problem, and the outputs checked; --list prints
 * the algorithms and stops. */
static int load(Search *s)
{
  GError *error = NULL;
  if (!cli_search_setup(&s->so, &error) || !search_mpi_start(&error))
    return cli_report_error(error);
  if (s->list) {
    cli_search_print_algorithms(stdout);
    return CLI_EXIT_OK;
  }
  if (!(s->algo = cli_search_lookup(s->algo_name ? s->algo_name : "mcmc", &error)) ||
      !cli_search_check_plan(&s->plan, &error) ||
      !cli_search_run_options(&s->so, &s->ro, &error))
    return cli_report_error(error);
  /* From here a signal stops the command, which still writes the best plan found. */
  search_signals_catch();
  if (s->ro.time_budget > 0 || s->ro.eval_budget == 0)
    s->cmd_deadline =
      s->t_start + (gint64)((s->ro.time_budget > 0 ? s->ro.time_budget : 60.0) * 1e6);
  if (!cli_problem_load(&s->pb, s->model ? s->model : CLI_DEFAULT_MODEL, s->params,
                        s->machine ? s->machine : CLI_DEFAULT_MACHINE, &s->plan, &error) ||
      !(s->problem = cli_search_problem(&s->pb, &s->plan, &s->so, &error)))
    return cli_report_error(error);
  if (s->plot) {
    s->plot_stem = g_str_has_suffix(s->plot, ".png") ? g_strndup(s->plot, strlen(s->plot) - 4)
                                                     : g_strdup(s->plot);
    if (!s->log)
      s->log = g_strconcat(s->plot_stem, ".csv", NULL);
  }
  /* The folders the outputs go to are made where missing. */
  if (!cli_make_parent(s->log, &error) || !cli_make_parent(s->plot, &error) ||
      !cli_make_parent(s->out, &error) || !cli_check_output(s->out, &error) ||
      !cli_check_output(s->plot, &error))
    return cli_report_error(error);
  return GO_ON;
}

/* The search.  Under mpirun the ranks share it (docs/distributed.md) and rank 0 alone goes
 * on: the others stop here. */
static int run(Search *s)
{
  gboolean writer = search_mpi_rank() == 0;
  s->ro.log_path = writer ? s->log : NULL;
  s->ro.progress = !s->quiet && !s->json && writer;
  s->ro.handle_sigint = TRUE;
  /* The budget in seconds bounds the whole command: the search gets SEARCH_SHARE of what
   * the loading left, the yardsticks and the report the rest, and whatever is running at
   * the end of it is cancelled. */
  if (s->cmd_deadline > 0) {
    double left = (double)(s->cmd_deadline - g_get_monotonic_time()) / 1e6;
    s->ro.time_budget = MAX(1e-3, left * SEARCH_SHARE);
    s->ro.deadline_us = s->cmd_deadline;
  }
  GError *error = NULL;
  if (!(s->result = search_run(s->algo, s->problem, &s->ro, &error)))
    return cli_report_error(error);
  if (!writer)
    return CLI_EXIT_OK;
  /* What rank 0 simulates from here (the yardsticks) it simulates alone. */
  search_mpi_set_shared(FALSE);
  if (search_mpi_note())
    g_printerr("parasol search: %s\n", search_mpi_note());
  if (search_result_get_interrupted(s->result))
    g_printerr("parasol search: %s; keeping the best strategy found so far\n",
               cli_signal_text(search_signals_first()));
  if (search_result_get_abandoned(s->result))
    g_printerr("parasol search: %s had not returned at the end of its budget; keeping the "
               "best strategy it reported\n", s->algo->name);
  s->best = search_result_get_strategy(s->result);
  s->bp = search_result_get_problem(s->result);
  s->best_time = search_result_get_time(s->result);
  /* A search, unlike the fixed plans (data-parallel, expert, owt), gives way to a faster
   * yardstick (below) unless --own, or unless --allow kept some kinds of parallelism
   * from it, which the yardsticks do not heed. */
  s->fallback = !s->own && search_algorithm_gives_way(s->algo, s->problem);
  return GO_ON;
}

/* "found no feasible strategy", exit status 1. */
static int infeasible(const Search *s)
{
  gboolean yardstick_cut = s->y && !s->y->expert_complete;
  g_printerr("parasol search: %s found no feasible strategy in %.1f s and %" G_GINT64_FORMAT
             " evaluations%s%s\n",
             s->algo->name, search_result_get_elapsed(s->result),
             search_result_get_evals(s->result),
             search_problem_get_memory_limit(s->problem)
               ? " (every strategy it tried runs out of device memory or failed)" : "",
             s->fallback && !yardstick_cut
               ? "; no data-parallel or expert plan is feasible either" : "");
  return CLI_EXIT_FAILURE;
}

/* Writes the plan kept to --out. */
static int write_strategy(const Search *s)
{
  GError *error = NULL;
  if (!sim_strategy_save(s->best, search_problem_get_graph(s->bp), s->out, &error))
    return cli_report_error(error);
  return GO_ON;
}

/* The search's strategy is written first: whatever comes next (yardsticks, report) may be
 * cut short by the budget or a signal.  Then the yardsticks, within half of what is left
 * of the budget (the report gets the rest; after a signal, none), and the plan kept: the
 * search's, or a faster yardstick (search_result_measure()), written in its place. */
static int keep_plan(Search *s)
{
  if (!s->best && !s->fallback)
    return infeasible(s);
  if (s->best && s->out) {
    int status = write_strategy(s);
    if (status != GO_ON)
      return status;
    g_printerr("parasol search: strategy written to %s\n", s->out);
  }
  gint64 yard_deadline = 0;
  if (s->cmd_deadline > 0)
    yard_deadline = g_get_monotonic_time() + (s->cmd_deadline - g_get_monotonic_time()) / 2;
  const SearchYardsticks *y = s->y =
    search_result_measure(s->result, s->problem, &s->ro, yard_deadline, s->fallback);
  if (!y->expert_complete && y->expert_plans > 0)
    g_printerr("parasol search: expert plans: %d of %d simulated %s; the yardstick is the "
               "best of them\n", y->expert_simulated, y->expert_plans,
               search_signals_seen() ? "before the signal" : "within the budget");
  else if (!y->expert_complete)
    g_printerr("parasol search: expert plans: none simulated %s\n",
               search_signals_seen() ? "after the signal" : "within the budget");
  s->best = search_result_get_kept(s->result, &s->bp, &s->best_time);
  if (y->kept && strcmp(y->kept, "search") && s->out) {
    int status = write_strategy(s);
    if (status != GO_ON)
      return status;
    g_printerr("parasol search: the %s plan is faster than the search's best; written to "
               "%s instead\n", y->kept, s->out);
  }
  return GO_ON;
}

/* The report of the plan kept, with what is left of the budget: a simulation of the whole
 * run, which on a large machine takes seconds. */
static int simulate_kept(Search *s)
{
  if (s->best && search_signals_seen() == 0) {
    g_autoptr(SearchWatch) watch =
      search_watch_new((SearchProblem *)s->bp, s->cmd_deadline, TRUE);
    search_problem_simulate(s->bp, s->best, &s->report, NULL);
  }
  if (s->best && !s->report)
    g_printerr("parasol search: the report of the plan was not simulated within the %s\n",
               search_signals_seen() ? "time left after the signal" : "budget");
  if (!s->best)
    return infeasible(s);
  return GO_ON;
}

/* The improvement log drawn with gnuplot (--plot). */
static int draw_plot(const Search *s)
{
  g_autofree char *gp = g_strconcat(s->plot_stem, ".gp", NULL);
  g_autofree char *title = g_strdup_printf("%s on %s, %s", sim_graph_get_name(s->pb.graph),
                                           sim_machine_get_name(s->pb.machine), s->algo->name);
  GError *error = NULL;
  const SearchYardsticks *y = s->y;
  if (!write_search_plot(gp, s->plot, s->log, title,
                         y->data_parallel_fits ? y->data_parallel : NAN, y->expert, &error))
    return cli_report_error(error);
  cli_run_gnuplot("search", s->log, gp, s->plot);
  return GO_ON;
}

/* --json: how the search ran (seed, threads, ranks, evaluations, signal). */
static void add_run_figures(JsonBuilder *b, const Search *s)
{
  const SearchResult *r = s->result;
  double elapsed = search_result_get_elapsed(r);
  gint64 evals = search_result_get_evals(r);
  json_builder_set_member_name(b, "seed");
  json_builder_add_int_value(b, (gint64)s->ro.seed);
  json_builder_set_member_name(b, "threads");
  json_builder_add_int_value(b, s->ro.threads);
  json_builder_set_member_name(b, "ranks");
  json_builder_add_int_value(b, search_mpi_size());
  gint64 exchanges;
  double in_exchanges, cpu;
  search_mpi_stats(&exchanges, &in_exchanges, &cpu);
  json_builder_set_member_name(b, "exchanges");
  json_builder_add_int_value(b, exchanges);
  json_builder_set_member_name(b, "exchange_s");
  json_builder_add_double_value(b, in_exchanges);
  json_builder_set_member_name(b, "exchange_cpu_s");
  json_builder_add_double_value(b, cpu);
  json_builder_set_member_name(b, "elapsed_s");
  json_builder_add_double_value(b, elapsed);
  json_builder_set_member_name(b, "evals");
  json_builder_add_int_value(b, evals);
  json_builder_set_member_name(b, "evals_stopped_at_bound");
  json_builder_add_int_value(b, search_result_get_cut_evals(r));
  json_builder_set_member_name(b, "evals_per_s");
  json_builder_add_double_value(b, elapsed > 0 ? (double)evals / elapsed : 0);
  json_builder_set_member_name(b, "interrupted");
  json_builder_add_boolean_value(b, search_result_get_interrupted(r));
}

/* --json: the plan kept against the yardsticks, and what was not done. */
static void add_yardsticks(JsonBuilder *b, const Search *s)
{
  const SearchYardsticks *y = s->y;
  add_time(b, "iteration_time_s", s->best_time);
  add_time(b, "data_parallel_s", y->data_parallel);
  json_builder_set_member_name(b, "data_parallel_fits");
  json_builder_add_boolean_value(b, y->data_parallel_fits);
  add_time(b, "expert_s", y->expert);
  json_builder_set_member_name(b, "expert_complete");
  json_builder_add_boolean_value(b, y->expert_complete);
  json_builder_set_member_name(b, "expert_plans");
  json_builder_add_int_value(b, y->expert_plans);
  json_builder_set_member_name(b, "expert_plans_simulated");
  json_builder_add_int_value(b, y->expert_simulated);
  json_builder_set_member_name(b, "data_parallel_simulated");
  json_builder_add_boolean_value(b, y->data_parallel_done);
  json_builder_set_member_name(b, "data_parallel_cannot_fit");
  json_builder_add_boolean_value(b, y->data_parallel_bound);
  json_builder_set_member_name(b, "report_complete");
  json_builder_add_boolean_value(b, s->report != NULL);
  json_builder_set_member_name(b, "abandoned");
  json_builder_add_boolean_value(b, search_result_get_abandoned(s->result));
  json_builder_set_member_name(b, "signal");
  if (search_signals_first())
    json_builder_add_string_value(b, search_signals_first() == SIGTERM ? "SIGTERM" : "SIGINT");
  else
    json_builder_add_null_value(b);
  json_builder_set_member_name(b, "wall_s");
  json_builder_add_double_value(b, (double)(g_get_monotonic_time() - s->t_start) / 1e6);
  double dp = y->data_parallel;
  add_time(b, "speedup_over_data_parallel", isfinite(dp) ? dp / s->best_time : NAN);
  add_time(b, "speedup_over_expert", y->expert / s->best_time);
  /* What the algorithm itself found, when a yardstick was kept instead. */
  json_builder_set_member_name(b, "kept");
  json_builder_add_string_value(b, y->kept);
  add_time(b, "search_iteration_time_s", y->search_time);
  add_time(b, "search_speedup_over_data_parallel",
           isfinite(dp) ? dp / y->search_time : NAN);
  add_time(b, "search_speedup_over_expert",
           isfinite(y->search_time) ? y->expert / y->search_time : NAN);
}

static void print_json(const Search *s, const SearchPlanSummary *summary)
{
  g_autoptr(JsonBuilder) b = json_builder_new();
  json_builder_begin_object(b);
  json_builder_set_member_name(b, "format");
  json_builder_add_string_value(b, "parasol-search-result");
  json_builder_set_member_name(b, "version");
  json_builder_add_int_value(b, 1);
  json_builder_set_member_name(b, "algorithm");
  json_builder_add_string_value(b, s->algo->name);
  json_builder_set_member_name(b, "model");
  json_builder_add_string_value(b, sim_graph_get_name(s->pb.graph));
  json_builder_set_member_name(b, "machine");
  json_builder_add_string_value(b, sim_machine_get_name(s->pb.machine));
  add_run_figures(b, s);
  add_yardsticks(b, s);
  add_plan(b, summary);
  /* The algorithm's own cost model against the simulator, where it has one to say. */
  double predicted = NAN, pred_sim = NAN;
  if (search_result_get_prediction(s->result, &predicted, &pred_sim)) {
    add_time(b, "model_predicted_s", predicted);
    add_time(b, "model_simulated_s", pred_sim);
  }
  if (s->pb.vocab_padded) {
    /* As simulate --json says it (cli_problem_load() padded the model's vocabulary). */
    json_builder_set_member_name(b, "vocab_padding");
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "model_vocab");
    json_builder_add_int_value(b, s->pb.vocab_default);
    json_builder_set_member_name(b, "padded_vocab");
    json_builder_add_int_value(b, s->pb.vocab_padded);
    json_builder_set_member_name(b, "tp");
    json_builder_add_int_value(b, s->pb.vocab_tp);
    json_builder_end_object(b);
  }
  json_builder_set_member_name(b, "rewrites");
  json_builder_begin_array(b);
  for (int i = 0; i < sim_strategy_n_rewrites(s->best); i++)
    json_builder_add_string_value(b, sim_strategy_rewrite(s->best, i));
  json_builder_end_array(b);
  g_autofree char *rj = s->report ? sim_report_to_json(s->report) : NULL;
  add_json_text(b, "report", rj);
  g_autofree char *sj = sim_strategy_to_json(s->best, search_problem_get_graph(s->bp));
  add_json_text(b, "strategy", sj);
  json_builder_end_object(b);
  g_autoptr(JsonNode) root = json_builder_get_root(b);
  g_autofree char *text = json_to_string(root, TRUE);
  printf("%s\n", text);
}

/* The text: how the search ran. */
static void print_run(const Search *s)
{
  const SearchResult *r = s->result;
  double elapsed = search_result_get_elapsed(r);
  gint64 evals = search_result_get_evals(r);
  gint64 cut = search_result_get_cut_evals(r);
  printf("search\n");
  printf("  algorithm           %s, seed %" G_GUINT64_FORMAT ", %d thread%s\n", s->algo->name,
         s->ro.seed, s->ro.threads, s->ro.threads == 1 ? "" : "s");
  printf("  searched            %.1f s, %" G_GINT64_FORMAT " evaluations (%.0f/s)%s%s\n",
         elapsed, evals, elapsed > 0 ? (double)evals / elapsed : 0,
         search_result_get_interrupted(r) ? ", " : "",
         search_result_get_interrupted(r) ? cli_signal_text(search_signals_first()) : "");
  if (search_mpi_size() > 1) {
    gint64 exchanges;
    double in_exchanges;
    search_mpi_stats(&exchanges, &in_exchanges, NULL);
    printf("  ranks               %d (MPI), %" G_GINT64_FORMAT " exchanges, %.2f s in them on "
           "rank 0\n", search_mpi_size(), exchanges, in_exchanges);
  }
  if (cut > 0)
    printf("                      %" G_GINT64_FORMAT " of them (%.0f%%) stopped early, once "
           "past the cost the search could keep\n", cut, 100.0 * cut / evals);
  if (!s->report) {
    g_autofree char *t = cli_format_time(s->best_time);
    printf("  predicted           %s per iteration (not done: the report, whose simulation "
           "did not fit in the %s)\n", t,
           search_signals_seen() ? "time after the signal" : "budget");
  }
}

/* The text: the plan kept, its rewrites, and the algorithm's cost model against the
 * simulator. */
static void print_plan(const Search *s, const SearchPlanSummary *summary)
{
  g_autofree char *plan_text = search_plan_summary_text(summary);
  printf("  plan                %s\n", plan_text);
  if (sim_strategy_n_rewrites(s->best) > 0) {
    printf("  rewrites           ");
    for (int i = 0; i < sim_strategy_n_rewrites(s->best); i++)
      printf(" %s", sim_strategy_rewrite(s->best, i));
    printf("\n");
  }
  double predicted = NAN, pred_sim = NAN;
  if (search_result_get_prediction(s->result, &predicted, &pred_sim)) {
    g_autofree char *t_p = cli_format_time(predicted);
    g_autofree char *t_s = cli_format_time(pred_sim);
    double gap = 100.0 * (predicted - pred_sim) / pred_sim;
    if (isfinite(pred_sim))
      printf("  cost model          %s predicted for its plan, %s simulated (%.0f%% %s)\n",
             t_p, t_s, fabs(gap), gap >= 0 ? "over" : "under");
    else
      printf("  cost model          %s predicted for its plan, which does not fit when "
             "simulated\n", t_p);
  }
}

/* The text: the speedups over the yardsticks, what was not done, and the plan kept where
 * it is not the search's. */
static void print_yardsticks(const Search *s)
{
  const SearchYardsticks *y = s->y;
  double dp = y->data_parallel, expert = y->expert;
  gboolean cut = !y->expert_complete;
  g_autofree char *s_dp = speedup_text(dp, s->best_time);
  g_autofree char *s_ex = speedup_text(expert, s->best_time);
  g_autofree char *t_dp = cli_format_time(dp);
  g_autofree char *t_ex = cli_format_time(expert);
  printf("  speedup             %s over data parallel (%s%s), %s over expert (%s%s)\n", s_dp,
         isfinite(dp) ? t_dp
         : y->data_parallel_bound ? "cannot fit: the weights and gradients exceed a GPU"
                                  : "n/a",
         isfinite(dp) && !y->data_parallel_fits ? ", does not fit" : "",
         s_ex, isfinite(expert) ? t_ex : cut ? "none simulated" : "none fits",
         cut && isfinite(expert) ? ", the best of those simulated" : "");
  const char *no_dp = y->data_parallel_done ? "" : "; data parallelism not simulated";
  if (cut && y->expert_plans > 0)
    printf("  not done            expert plans: %d of %d simulated%s\n", y->expert_simulated,
           y->expert_plans, no_dp);
  else if (cut)
    printf("  not done            expert plans not simulated%s\n", no_dp);
  else if (!y->data_parallel_done)
    printf("  not done            data parallelism not simulated\n");
  if (strcmp(y->kept, "search")) {
    g_autofree char *t_s = cli_format_time(y->search_time);
    g_autofree char *s_s = speedup_text(expert, y->search_time);
    if (isfinite(y->search_time))
      printf("  kept                the %s plan: the search's best, %s, is %s it\n", y->kept,
             t_s, s_s);
    else
      printf("  kept                the %s plan: the search found no feasible strategy\n",
             y->kept);
  }
}

/* The plot, the result (--json or text), and the log's error, if writing it failed. */
static int print_result(Search *s)
{
  if (s->plot) {
    int status = draw_plot(s);
    if (status != GO_ON)
      return status;
  }
  SearchPlanSummary summary;
  search_plan_summarize(search_problem_get_graph(s->bp), s->best, &summary);
  if (s->json) {
    print_json(s, &summary);
  } else {
    if (s->report) {
      sim_report_print(s->report, stdout);
      printf("\n");
    }
    print_run(s);
    print_plan(s, &summary);
    print_yardsticks(s);
  }
  if (search_result_get_log_error(s->result)) {
    g_printerr("parasol search: %s\n", search_result_get_log_error(s->result));
    return CLI_EXIT_USAGE;
  }
  return GO_ON;
}

static void search_clear(Search *s)
{
  /* The signals stay caught until the process ends: a second one while it exits would
   * otherwise kill it after the plan was written, with the signal's status. */
  g_clear_pointer(&s->report, sim_report_free);
  if (search_algorithms_left_running() > 0) {
    /* An algorithm left running (the search's, or the yardsticks' run of the expert
     * plans) still reads the problem, its graph and machine: they stay until the process
     * ends. */
    g_clear_pointer(&s->result, search_result_free);
  } else {
    /* The problem and results borrow the graph and machine: they go first. */
    g_clear_pointer(&s->result, search_result_free);
    g_clear_pointer(&s->problem, search_problem_unref);
    cli_problem_clear(&s->pb);
  }
  g_free(s->model);
  g_free(s->machine);
  g_free(s->algo_name);
  g_free(s->out);
  g_free(s->log);
  g_free(s->plot);
  g_free(s->plot_stem);
  g_strfreev(s->params);
  cli_plan_options_clear(&s->plan);
  cli_search_options_clear(&s->so);
}

int cmd_search(int argc, char **argv)
{
  Search s = { .t_start = g_get_monotonic_time() };
  cli_plan_options_init(&s.plan);
  cli_search_options_init(&s.so);
  int status = parse_options(&s, argc, argv);
  if (status == GO_ON) {
    /* The command's budget runs from here, as before the options were read. */
    s.t_start = g_get_monotonic_time();
    status = load(&s);
  }
  if (status == GO_ON)
    status = run(&s);
  if (status == GO_ON)
    status = keep_plan(&s);
  if (status == GO_ON)
    status = simulate_kept(&s);
  if (status == GO_ON)
    status = print_result(&s);
  search_clear(&s);
  return status == GO_ON ? CLI_EXIT_OK : status;
}
