/* example.c — a search algorithm as a plugin: random search.  It draws every operator's
 * configuration uniformly among its candidates and simulates the result, until the budget
 * ends.  Build it as a shared module against parasol-search.h and load it with
 *   parasol search --plugin ./parasol-search-example.so --algo random ...
 * The program calls parasol_search_plugin_init() and registers the algorithm it returns. */
#include "parasol-search.h"

static gboolean random_run(const SearchAlgorithm *self, SearchContext *ctx, GError **error)
{
  const SearchProblem *p = search_context_get_problem(ctx);
  const SimGraph *g = search_problem_get_graph(p);
  int n = sim_graph_n_ops(g);
  GRand *rng = search_context_rand_new(ctx, 0);
  SimStrategy *s = search_problem_data_parallel(p, error);
  gboolean ok = s != NULL;
  /* The baseline first, so a short budget still returns something feasible. */
  if (ok)
    search_context_evaluate(ctx, s);
  while (ok && !search_context_should_stop(ctx)) {
    for (int op = 0; op < n && ok; op++) {
      int k = g_rand_int_range(rng, 0, search_problem_n_configs(p, op));
      ok = search_problem_apply_config(p, s, op, search_problem_config(p, op, k), error);
    }
    if (ok)
      search_context_evaluate(ctx, s);
  }
  if (s)
    sim_strategy_free(s);
  g_rand_free(rng);
  return ok;
}

static const SearchAlgorithm random_search = {
  .api_version = SEARCH_ALGORITHM_API_VERSION,
  .name = "random",
  .description = "random search: every operator's configuration drawn uniformly (a plugin)",
  .run = random_run,
};

/* Exported from the module (the build hides other symbols). */
__attribute__((visibility("default"))) const SearchAlgorithm *parasol_search_plugin_init(void);

const SearchAlgorithm *parasol_search_plugin_init(void)
{
  return &random_search;
}
