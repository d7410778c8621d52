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
  json_builder_set_member_name(b, "recompute");
  json_builder_add_string_value(b, sim_recompute_name(p->recompute));
  json_builder_set_member_name(b, "zero1");
  json_builder_add_boolean_value(b, p->zero1);
  json_builder_set_member_name(b, "zero");
  json_builder_add_int_value(b, p->zero);
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

int cmd_search(int argc, char **argv)
{
  g_autofree char *model = NULL, *machine = NULL, *algo_name = NULL, *out = NULL, *log = NULL;
  g_autofree char *plot = NULL, *plot_stem = NULL;
  g_auto(GStrv) params = NULL;
  gboolean json = FALSE, list = FALSE, quiet = FALSE, own = FALSE;
  g_auto(CliPlanOptions) plan;
  cli_plan_options_init(&plan);
  CliSearchOptions so;
  cli_search_options_init(&so);
  GOptionEntry entries[] = {
    { "model", 'm', 0, G_OPTION_ARG_STRING, &model, "Zoo model or graph file (default " CLI_DEFAULT_MODEL ")", "M" },
    { "param", 'p', 0, G_OPTION_ARG_STRING_ARRAY, &params, "Model parameter k=v (repeatable)", "K=V" },
    { "machine", 'x', 0, G_OPTION_ARG_STRING, &machine, "Library machine (dgx-a100:4) or file (default " CLI_DEFAULT_MACHINE ")", "X" },
    { "algo", 'a', 0, G_OPTION_ARG_STRING, &algo_name, "Search algorithm (default mcmc; --list shows them)", "NAME" },
    { "out", 0, 0, G_OPTION_ARG_FILENAME, &out, "Write the best strategy (for parasol simulate --strategy)", "FILE" },
    { "log", 0, 0, G_OPTION_ARG_FILENAME, &log, "Write every improvement as CSV (wall_s, evals, best_s, current_s)", "FILE" },
    { "plot", 0, 0, G_OPTION_ARG_FILENAME, &plot, "Draw the improvement log to this PNG with gnuplot (its script beside it, .gp; the log, .csv, unless --log names one)", "FILE" },
    { "json", 0, 0, G_OPTION_ARG_NONE, &json, "Print the result as JSON", NULL },
    { "list", 0, 0, G_OPTION_ARG_NONE, &list, "List the search algorithms and their options", NULL },
    { "quiet", 'q', 0, G_OPTION_ARG_NONE, &quiet, "No progress line", NULL },
    { "own", 0, 0, G_OPTION_ARG_NONE, &own, "Write and report the algorithm's own best even where the data-parallel or expert plan is faster (searches keep the faster plan by default; the fixed plans data-parallel, expert and owt always keep their own)", NULL },
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
  g_option_context_set_main_group(ctx, cli_search_option_group(&so));
  g_option_context_add_main_entries(ctx, entries, NULL);
  g_option_context_add_group(ctx, cli_plan_option_group(&plan));
  if (!cli_parse_options(ctx, &argc, &argv)) {
    cli_search_options_clear(&so);
    return CLI_EXIT_USAGE;
  }
  gint64 t_start = g_get_monotonic_time();
  int status = CLI_EXIT_OK;
  GError *error = NULL;
  CliProblem pb = { 0 };
  g_autoptr(SearchProblem) problem = NULL;
  g_autoptr(SearchResult) result = NULL;
  g_autoptr(SimReport) report = NULL;
  const SearchAlgorithm *algo = NULL;
  gboolean fallback = FALSE, yardstick_cut = FALSE, dp_done = FALSE;
  const SimStrategy *best = NULL;
  const SearchProblem *bp = NULL;
  double search_time = INFINITY;
  const char *kept = NULL;
  int expert_plans = 0, expert_simulated = 0;
  /* The end of the command's budget in seconds (0: an evaluation budget, no end). */
  gint64 cmd_deadline = 0;

  if (argc > 1) {
    status = cli_usage_error("search", "unexpected argument '%s'", argv[1]);
    goto done;
  }
  if (!cli_search_setup(&so, &error) || !search_mpi_start(&error))
    goto fail;
  if (list) {
    cli_search_print_algorithms(stdout);
    goto done;
  }
  if (!(algo = cli_search_lookup(algo_name ? algo_name : "mcmc", &error)))
    goto fail;
  SearchRunOptions ro;
  if (!cli_search_check_plan(&plan, &error) || !cli_search_run_options(&so, &ro, &error))
    goto fail;
  /* From here a signal stops the command, which still writes the best plan found. */
  search_signals_catch();
  if (ro.time_budget > 0 || ro.eval_budget == 0)
    cmd_deadline = t_start + (gint64)((ro.time_budget > 0 ? ro.time_budget : 60.0) * 1e6);
  if (!cli_problem_load(&pb, model ? model : CLI_DEFAULT_MODEL, params, machine ? machine : CLI_DEFAULT_MACHINE, &plan,
                        &error))
    goto fail;
  if (!(problem = cli_search_problem(&pb, &plan, &so, &error)))
    goto fail;
  if (plot) {
    plot_stem = g_str_has_suffix(plot, ".png") ? g_strndup(plot, strlen(plot) - 4)
                                               : g_strdup(plot);
    if (!log)
      log = g_strconcat(plot_stem, ".csv", NULL);
  }
  /* The folders the outputs go to are made where missing. */
  if (!cli_make_parent(log, &error) || !cli_make_parent(plot, &error) ||
      !cli_make_parent(out, &error) || !cli_check_output(out, &error) ||
      !cli_check_output(plot, &error))
    goto fail;
  /* Under mpirun the ranks share the search (docs/distributed.md); rank 0 writes. */
  gboolean writer = search_mpi_rank() == 0;
  ro.log_path = writer ? log : NULL;
  ro.progress = !quiet && !json && writer;
  ro.handle_sigint = TRUE;
  /* The budget in seconds bounds the whole command: the search gets SEARCH_SHARE of what
   * the loading left, the yardsticks and the report the rest, and whatever is running at
   * the end of it is cancelled. */
  if (cmd_deadline > 0) {
    double left = (double)(cmd_deadline - g_get_monotonic_time()) / 1e6;
    ro.time_budget = MAX(1e-3, left * SEARCH_SHARE);
    ro.deadline_us = cmd_deadline;
  }
  if (!(result = search_run(algo, problem, &ro, &error)))
    goto fail;
  if (!writer)
    goto done;
  /* What rank 0 simulates from here (the yardsticks) it simulates alone. */
  search_mpi_set_shared(FALSE);
  if (search_mpi_note())
    g_printerr("parasol search: %s\n", search_mpi_note());

  best = search_result_get_strategy(result);
  bp = search_result_get_problem(result);
  double elapsed = search_result_get_elapsed(result);
  gint64 evals = search_result_get_evals(result);
  gint64 cut = search_result_get_cut_evals(result);
  double rate = elapsed > 0 ? (double)evals / elapsed : 0;
  if (search_result_get_interrupted(result))
    g_printerr("parasol search: %s; keeping the best strategy found so far\n",
               cli_signal_text(search_signals_first()));
  if (search_result_get_abandoned(result))
    g_printerr("parasol search: %s had not returned at the end of its budget; keeping the "
               "best strategy it reported\n", algo->name);
  /* A search, unlike the fixed plans (data-parallel, expert, owt), gives way to a faster
   * yardstick (below) unless --own, or unless --allow kept some kinds of parallelism
   * from it, which the yardsticks do not heed. */
  fallback = !own && search_algorithm_gives_way(algo, problem);
  if (!best && !fallback)
    goto infeasible;
  /* The strategy is written first: whatever comes next (yardsticks, report) may be cut
   * short by the budget or a signal. */
  double best_time = search_result_get_time(result);
  if (best && out) {
    if (!sim_strategy_save(best, search_problem_get_graph(bp), out, &error))
      goto fail;
    g_printerr("parasol search: strategy written to %s\n", out);
  }

  /* The yardsticks, within half of what is left of the budget (the report gets the rest);
   * after a signal, none.  Then the plan kept: the search's, or a faster yardstick. */
  gint64 yard_deadline = 0;
  if (cmd_deadline > 0)
    yard_deadline = g_get_monotonic_time() + (cmd_deadline - g_get_monotonic_time()) / 2;
  const SearchYardsticks *y = search_result_measure(result, problem, &ro, yard_deadline, fallback);
  double dp_raw = y->data_parallel, expert_time = y->expert;
  gboolean dp_fits = y->data_parallel_fits;
  dp_done = y->data_parallel_done;
  yardstick_cut = !y->expert_complete;
  expert_plans = y->expert_plans;
  expert_simulated = y->expert_simulated;
  if (yardstick_cut && expert_plans > 0)
    g_printerr("parasol search: expert plans: %d of %d simulated %s; the yardstick is the "
               "best of them\n", expert_simulated, expert_plans,
               search_signals_seen() ? "before the signal" : "within the budget");
  else if (yardstick_cut)
    g_printerr("parasol search: expert plans: none simulated %s\n",
               search_signals_seen() ? "after the signal" : "within the budget");

  search_time = y->search_time;
  kept = y->kept;
  best = search_result_get_kept(result, &bp, &best_time);
  if (kept && strcmp(kept, "search") && out) {
    if (!sim_strategy_save(best, search_problem_get_graph(bp), out, &error))
      goto fail;
    g_printerr("parasol search: the %s plan is faster than the search's best; written to "
               "%s instead\n", kept, out);
  }
  /* The report of the plan kept, with what is left of the budget: a simulation of the
   * whole run, which on a large machine takes seconds. */
  if (best && search_signals_seen() == 0) {
    g_autoptr(SearchWatch) watch = search_watch_new((SearchProblem *)bp, cmd_deadline, TRUE);
    search_problem_simulate(bp, best, &report, NULL);
  }
  if (best && !report)
    g_printerr("parasol search: the report of the plan was not simulated within the %s\n",
               search_signals_seen() ? "time left after the signal" : "budget");
  if (!best)
    goto infeasible;

  if (plot) {
    g_autofree char *gp = g_strconcat(plot_stem, ".gp", NULL);
    g_autofree char *title = g_strdup_printf("%s on %s, %s", sim_graph_get_name(pb.graph),
                                             sim_machine_get_name(pb.machine), algo->name);
    if (!write_search_plot(gp, plot, log, title, dp_fits ? dp_raw : NAN, expert_time, &error))
      goto fail;
    cli_run_gnuplot("search", log, gp, plot);
  }

  SearchPlanSummary summary;
  search_plan_summarize(search_problem_get_graph(bp), best, &summary);
  if (json) {
    g_autoptr(JsonBuilder) b = json_builder_new();
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "format");
    json_builder_add_string_value(b, "parasol-search-result");
    json_builder_set_member_name(b, "version");
    json_builder_add_int_value(b, 1);
    json_builder_set_member_name(b, "algorithm");
    json_builder_add_string_value(b, algo->name);
    json_builder_set_member_name(b, "model");
    json_builder_add_string_value(b, sim_graph_get_name(pb.graph));
    json_builder_set_member_name(b, "machine");
    json_builder_add_string_value(b, sim_machine_get_name(pb.machine));
    json_builder_set_member_name(b, "seed");
    json_builder_add_int_value(b, (gint64)ro.seed);
    json_builder_set_member_name(b, "threads");
    json_builder_add_int_value(b, ro.threads);
    json_builder_set_member_name(b, "ranks");
    json_builder_add_int_value(b, search_mpi_size());
    {
      gint64 exchanges;
      double in_exchanges, cpu;
      search_mpi_stats(&exchanges, &in_exchanges, &cpu);
      json_builder_set_member_name(b, "exchanges");
      json_builder_add_int_value(b, exchanges);
      json_builder_set_member_name(b, "exchange_s");
      json_builder_add_double_value(b, in_exchanges);
      json_builder_set_member_name(b, "exchange_cpu_s");
      json_builder_add_double_value(b, cpu);
    }
    json_builder_set_member_name(b, "elapsed_s");
    json_builder_add_double_value(b, elapsed);
    json_builder_set_member_name(b, "evals");
    json_builder_add_int_value(b, evals);
    json_builder_set_member_name(b, "evals_stopped_at_bound");
    json_builder_add_int_value(b, cut);
    json_builder_set_member_name(b, "evals_per_s");
    json_builder_add_double_value(b, rate);
    json_builder_set_member_name(b, "interrupted");
    json_builder_add_boolean_value(b, search_result_get_interrupted(result));
    add_time(b, "iteration_time_s", best_time);
    add_time(b, "data_parallel_s", dp_raw);
    json_builder_set_member_name(b, "data_parallel_fits");
    json_builder_add_boolean_value(b, dp_fits);
    add_time(b, "expert_s", expert_time);
    json_builder_set_member_name(b, "expert_complete");
    json_builder_add_boolean_value(b, !yardstick_cut);
    json_builder_set_member_name(b, "expert_plans");
    json_builder_add_int_value(b, expert_plans);
    json_builder_set_member_name(b, "expert_plans_simulated");
    json_builder_add_int_value(b, expert_simulated);
    json_builder_set_member_name(b, "data_parallel_simulated");
    json_builder_add_boolean_value(b, dp_done);
    json_builder_set_member_name(b, "report_complete");
    json_builder_add_boolean_value(b, report != NULL);
    json_builder_set_member_name(b, "abandoned");
    json_builder_add_boolean_value(b, search_result_get_abandoned(result));
    json_builder_set_member_name(b, "signal");
    if (search_signals_first())
      json_builder_add_string_value(b, search_signals_first() == SIGTERM ? "SIGTERM" : "SIGINT");
    else
      json_builder_add_null_value(b);
    json_builder_set_member_name(b, "wall_s");
    json_builder_add_double_value(b, (double)(g_get_monotonic_time() - t_start) / 1e6);
    add_time(b, "speedup_over_data_parallel", isfinite(dp_raw) ? dp_raw / best_time : NAN);
    add_time(b, "speedup_over_expert", expert_time / best_time);
    /* What the algorithm itself found, when a yardstick was kept instead. */
    json_builder_set_member_name(b, "kept");
    json_builder_add_string_value(b, kept);
    add_time(b, "search_iteration_time_s", search_time);
    add_time(b, "search_speedup_over_data_parallel",
             isfinite(dp_raw) ? dp_raw / search_time : NAN);
    add_time(b, "search_speedup_over_expert",
             isfinite(search_time) ? expert_time / search_time : NAN);
    add_plan(b, &summary);
    /* The algorithm's own cost model against the simulator, where it has one to say. */
    double predicted = NAN, pred_sim = NAN;
    if (search_result_get_prediction(result, &predicted, &pred_sim)) {
      add_time(b, "model_predicted_s", predicted);
      add_time(b, "model_simulated_s", pred_sim);
    }
    if (pb.vocab_padded) {
      /* As simulate --json says it (cli_problem_load() padded the model's vocabulary). */
      json_builder_set_member_name(b, "vocab_padding");
      json_builder_begin_object(b);
      json_builder_set_member_name(b, "model_vocab");
      json_builder_add_int_value(b, pb.vocab_default);
      json_builder_set_member_name(b, "padded_vocab");
      json_builder_add_int_value(b, pb.vocab_padded);
      json_builder_set_member_name(b, "tp");
      json_builder_add_int_value(b, pb.vocab_tp);
      json_builder_end_object(b);
    }
    json_builder_set_member_name(b, "rewrites");
    json_builder_begin_array(b);
    for (int i = 0; i < sim_strategy_n_rewrites(best); i++)
      json_builder_add_string_value(b, sim_strategy_rewrite(best, i));
    json_builder_end_array(b);
    g_autofree char *rj = report ? sim_report_to_json(report) : NULL;
    add_json_text(b, "report", rj);
    g_autofree char *sj = sim_strategy_to_json(best, search_problem_get_graph(bp));
    add_json_text(b, "strategy", sj);
    json_builder_end_object(b);
    g_autoptr(JsonNode) root = json_builder_get_root(b);
    g_autofree char *text = json_to_string(root, TRUE);
    printf("%s\n", text);
  } else {
    if (report) {
      sim_report_print(report, stdout);
      printf("\n");
    }
    printf("search\n");
    printf("  algorithm           %s, seed %" G_GUINT64_FORMAT ", %d thread%s\n", algo->name,
           ro.seed, ro.threads, ro.threads == 1 ? "" : "s");
    printf("  searched            %.1f s, %" G_GINT64_FORMAT " evaluations (%.0f/s)%s%s\n",
           elapsed, evals, rate,
           search_result_get_interrupted(result) ? ", " : "",
           search_result_get_interrupted(result) ? cli_signal_text(search_signals_first())
                                                 : "");
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
    if (!report) {
      g_autofree char *t = cli_format_time(best_time);
      printf("  predicted           %s per iteration (not done: the report, whose simulation "
             "did not fit in the %s)\n", t,
             search_signals_seen() ? "time after the signal" : "budget");
    }
    g_autofree char *plan_text = search_plan_summary_text(&summary);
    printf("  plan                %s\n", plan_text);
    if (sim_strategy_n_rewrites(best) > 0) {
      printf("  rewrites           ");
      for (int i = 0; i < sim_strategy_n_rewrites(best); i++)
        printf(" %s", sim_strategy_rewrite(best, i));
      printf("\n");
    }
    double predicted = NAN, pred_sim = NAN;
    if (search_result_get_prediction(result, &predicted, &pred_sim)) {
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
    g_autofree char *s_dp = speedup_text(dp_raw, best_time);
    g_autofree char *s_ex = speedup_text(expert_time, best_time);
    g_autofree char *t_dp = cli_format_time(dp_raw);
    g_autofree char *t_ex = cli_format_time(expert_time);
    printf("  speedup             %s over data parallel (%s%s), %s over expert (%s%s)\n", s_dp,
           isfinite(dp_raw) ? t_dp : "n/a", isfinite(dp_raw) && !dp_fits ? ", does not fit" : "",
           s_ex, isfinite(expert_time) ? t_ex : yardstick_cut ? "none simulated" : "none fits",
           yardstick_cut && isfinite(expert_time) ? ", the best of those simulated" : "");
    if (yardstick_cut && expert_plans > 0)
      printf("  not done            expert plans: %d of %d simulated%s\n", expert_simulated,
             expert_plans, dp_done ? "" : "; data parallelism not simulated");
    else if (yardstick_cut)
      printf("  not done            expert plans not simulated%s\n",
             dp_done ? "" : "; data parallelism not simulated");
    else if (!dp_done)
      printf("  not done            data parallelism not simulated\n");
    if (strcmp(kept, "search")) {
      g_autofree char *t_s = cli_format_time(search_time);
      g_autofree char *s_s = speedup_text(expert_time, search_time);
      if (isfinite(search_time))
        printf("  kept                the %s plan: the search's best, %s, is %s it\n", kept, t_s,
               s_s);
      else
        printf("  kept                the %s plan: the search found no feasible strategy\n",
               kept);
    }
  }
  if (search_result_get_log_error(result)) {
    g_printerr("parasol search: %s\n", search_result_get_log_error(result));
    status = CLI_EXIT_USAGE;
  }
  goto done;

infeasible:
  g_printerr("parasol search: %s found no feasible strategy in %.1f s and %" G_GINT64_FORMAT
             " evaluations%s%s\n",
             algo->name, search_result_get_elapsed(result), search_result_get_evals(result),
             search_problem_get_memory_limit(problem)
               ? " (every strategy it tried runs out of device memory or failed)" : "",
             fallback && !yardstick_cut ? "; no data-parallel or expert plan is feasible either"
                                        : "");
  status = CLI_EXIT_FAILURE;
  goto done;

fail:
  status = cli_report_error(error);
done:
  /* The signals stay caught until the process ends: a second one while it exits would
   * otherwise kill it after the plan was written, with the signal's status. */
  if (result && search_result_get_abandoned(result)) {
    /* The algorithm left running still reads the problem, its graph and machine: they
     * stay until the process ends. */
    g_clear_pointer(&report, sim_report_free);
    g_clear_pointer(&result, search_result_free);
    problem = NULL;
    cli_search_options_clear(&so);
    return status;
  }
  /* The problem and results borrow the graph and machine: they go first. */
  g_clear_pointer(&report, sim_report_free);
  g_clear_pointer(&result, search_result_free);
  g_clear_pointer(&problem, search_problem_unref);
  cli_problem_clear(&pb);
  cli_search_options_clear(&so);
  return status;
}
