/* exhaustive.c — every combination of candidate configurations, simulated: the ground
 * truth the tests hold the other algorithms to.  Combinations are visited like the digits
 * of an odometer with the last operator fastest, so most steps change one operator and the
 * delta simulation re-simulates little. */
#include "search-private.h"

static gboolean exhaustive_run(const SearchAlgorithm *self, SearchContext *ctx, GError **error)
{
  const SearchProblem *p = search_context_get_problem(ctx);
  int n = sim_graph_n_ops(p->g);
  double max = search_context_get_option_double_in(ctx, "max", 1e7, 1, INFINITY);
  double total = 1;
  for (int op = 0; op < n; op++)
    total *= search_problem_n_configs(p, op);
  if (total > max) {
    g_set_error(error, SEARCH_ERROR, SEARCH_ERROR_TOO_LARGE,
                "exhaustive search: %.3g strategies for model '%s' on %d devices, more than "
                "max=%.3g; choose a smaller problem, restrict it (--allow, --devices) or raise "
                "the limit with --opt max=N",
                total, sim_graph_get_name(p->g), p->n_devices, max);
    return FALSE;
  }
  g_autofree int *digit = g_new0(int, MAX(n, 1));
  g_autoptr(SimStrategy) start = search_problem_strategy_from_configs(p, digit, error);
  if (!start)
    return FALSE;
  g_autoptr(SearchEvaluator) ev = search_evaluator_new(ctx, start, 0, error);
  if (!ev)
    return FALSE;
  for (;;) {
    search_evaluator_run(ev);
    if (search_evaluator_should_stop(ev))
      break;
    /* The next combination: bump the last digit, carrying leftwards. */
    int op = n - 1;
    while (op >= 0 && digit[op] + 1 >= search_problem_n_configs(p, op)) {
      digit[op] = 0;
      search_evaluator_set_config(ev, op, search_problem_config(p, op, 0));
      op--;
    }
    if (op < 0)
      break;
    digit[op]++;
    search_evaluator_set_config(ev, op, search_problem_config(p, op, digit[op]));
  }
  return TRUE;
}

static const SearchOptionSpec exhaustive_options[] = {
  { "max", "refuse problems with more strategies than this (default 1e7)" },
  { NULL, NULL },
};

const SearchAlgorithm search_algo_exhaustive = {
  .api_version = SEARCH_ALGORITHM_API_VERSION,
  .name = "exhaustive",
  .description = "every combination of candidate configurations, simulated (small problems)",
  .run = exhaustive_run,
  .options = exhaustive_options,
};
