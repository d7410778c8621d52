/* search-options.c — parsing the options shared by the commands that search. */
#include "search-options.h"

#include <string.h>

void cli_search_options_init(CliSearchOptions *o)
{
  memset(o, 0, sizeof *o);
  o->seed = 1;
  /* Two worker threads: the budget the benchmarks aim at, and the same default on every
   * machine, since the threads decide how the search splits its work. */
  o->threads = 2;
}

void cli_search_options_clear(CliSearchOptions *o)
{
  g_clear_pointer(&o->plugins, g_strfreev);
  g_clear_pointer(&o->opts, g_strfreev);
  g_clear_pointer(&o->allow, g_free);
  g_clear_pointer(&o->devices, g_free);
  g_clear_pointer(&o->budget, g_free);
  g_clear_pointer(&o->rank_timeout, g_free);
}

GOptionGroup *cli_search_option_group(CliSearchOptions *o)
{
  GOptionEntry entries[] = {
    { "budget", 'b', 0, G_OPTION_ARG_STRING, &o->budget, "Seconds (60s, 2m) or evaluations (5000evals) (default: search 60s, compare 5s a run)", "B" },
    { "seed", 0, 0, G_OPTION_ARG_INT64, &o->seed, "Random seed (default 1)", "N" },
    { "threads", 'j', 0, G_OPTION_ARG_INT, &o->threads, "Worker threads (default 2)", "N" },
    { "opt", 'o', 0, G_OPTION_ARG_STRING_ARRAY, &o->opts, "Algorithm option KEY=VALUE (repeatable; --list shows them)", "K=V" },
    { "plugin", 0, 0, G_OPTION_ARG_FILENAME_ARRAY, &o->plugins, "Load a search algorithm from a shared object (repeatable)", "FILE.so" },
    { "allow", 0, 0, G_OPTION_ARG_STRING, &o->allow, "Kinds of parallelism: data,attribute,parameter,reduction,pipeline (or model, all; default all)", "KINDS" },
    { "devices", 0, 0, G_OPTION_ARG_STRING, &o->devices, "Devices to use: 0-7, 0,2,4,6 or 0-31:8 (default all)", "LIST" },
    { "memory-limit", 0, 0, G_OPTION_ARG_NONE, &o->memory_limit, "Strategies that do not fit in device memory are infeasible (default)", NULL },
    { "no-memory-limit", 0, 0, G_OPTION_ARG_NONE, &o->no_memory_limit, "Ignore device memory capacity", NULL },
    { "rank-timeout", 0, 0, G_OPTION_ARG_STRING, &o->rank_timeout, "Under mpirun: give the sharing up after S seconds without a word from a rank (default 30; 0: never)", "S" },
    { NULL },
  };
  GOptionGroup *g = g_option_group_new("search", "Search options:", "Show the search options", o,
                                       NULL);
  g_option_group_add_entries(g, entries);
  return g;
}

gboolean cli_search_setup(const CliSearchOptions *o, GError **error)
{
  if (o->rank_timeout) {
    char *end = NULL;
    double t = g_ascii_strtod(o->rank_timeout, &end);
    if (end == o->rank_timeout || *end || !(t >= 0 && t <= 1e6)) {
      g_set_error(error, SEARCH_ERROR, SEARCH_ERROR_INVALID,
                  "--rank-timeout '%s': expected seconds from 0 (wait for ever) to 1000000",
                  o->rank_timeout);
      return FALSE;
    }
    search_mpi_set_rank_timeout(t);
  }
  search_register_builtins();
  for (char **it = o->plugins; it && *it; it++)
    if (!search_load_plugin(*it, error))
      return FALSE;
  return TRUE;
}

void cli_search_print_algorithms(FILE *out)
{
  for (int i = 0; i < search_n_algorithms(); i++) {
    const SearchAlgorithm *a = search_algorithm_get(i);
    fprintf(out, "%-14s %s\n", a->name, a->description);
    for (const SearchOptionSpec *s = a->options; s && s->name; s++)
      fprintf(out, "%-14s   --opt %s=...  %s\n", "", s->name, s->help);
  }
}

const SearchAlgorithm *cli_search_lookup(const char *name, GError **error)
{
  const SearchAlgorithm *a = search_lookup(name);
  if (!a)
    g_set_error(error, SEARCH_ERROR, SEARCH_ERROR_UNKNOWN,
                "unknown search algorithm '%s'; 'parasol search --list' lists them", name);
  return a;
}

gboolean cli_search_check_plan(const CliPlanOptions *plan, GError **error)
{
  if (plan->dp || plan->tp || plan->pp || plan->microbatches || plan->microbatch_size ||
      plan->schedule || plan->sequence_parallel || plan->scatter_gather || plan->cp ||
      plan->tp_comm_overlap) {
    g_set_error(error, SEARCH_ERROR, SEARCH_ERROR_INVALID,
                "--dp, --tp, --pp, --microbatches, --microbatch-size, --schedule, "
                "--sequence-parallel, --tp-comm-overlap, --scatter-gather and --cp describe a plan; the search chooses the plan (use "
                "'parasol simulate' to predict a given one)");
    return FALSE;
  }
  return TRUE;
}

SearchProblem *cli_search_problem(const CliProblem *pb, const CliPlanOptions *plan,
                                  const CliSearchOptions *o, GError **error)
{
  if (o->memory_limit && o->no_memory_limit) {
    g_set_error(error, SEARCH_ERROR, SEARCH_ERROR_INVALID,
                "--memory-limit and --no-memory-limit contradict each other");
    return NULL;
  }
  SimMegatronOptions mo;
  if (!cli_plan_megatron_options(plan, &mo, error))
    return NULL;
  g_autoptr(SearchProblem) p = search_problem_new(pb->graph, pb->machine, pb->cost);
  SimOptions so = cli_plan_sim_options(plan, pb);
  search_problem_set_sim_options(p, &so);
  search_problem_set_sync(p, &mo.sync);
  search_problem_set_memory(p, &mo.memory);
  search_problem_set_memory_limit(p, !o->no_memory_limit);
  if (o->allow) {
    SearchKinds k;
    if (!search_kinds_parse(o->allow, &k, error)) {
      g_prefix_error(error, "--allow: ");
      return NULL;
    }
    search_problem_set_kinds(p, k);
  }
  if (o->devices) {
    g_autoptr(GArray) devs = g_array_new(FALSE, FALSE, sizeof(int));
    if (!cli_parse_devices("--devices", o->devices, sim_machine_n_devices(pb->machine), devs,
                           error))
      return NULL;
    if (!search_problem_set_devices(p, (const int *)devs->data, (int)devs->len, error)) {
      g_prefix_error(error, "--devices: ");
      return NULL;
    }
  }
  return g_steal_pointer(&p);
}

gboolean cli_search_run_options(const CliSearchOptions *o, SearchRunOptions *out,
                                GError **error)
{
  *out = search_run_options_default();
  if (!search_parse_budget(o->budget ? o->budget : "60s", out, error))
    return FALSE;
  if (o->seed < 0) {
    g_set_error(error, SEARCH_ERROR, SEARCH_ERROR_INVALID, "--seed: expected 0 or more");
    return FALSE;
  }
  if (o->threads < 1 || o->threads > 1024) {
    g_set_error(error, SEARCH_ERROR, SEARCH_ERROR_INVALID,
                "--threads %d: expected 1 to 1024", o->threads);
    return FALSE;
  }
  out->seed = (guint64)o->seed;
  out->threads = o->threads;
  out->options = (const char *const *)o->opts;
  return TRUE;
}
