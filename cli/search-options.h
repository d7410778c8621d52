/* search-options.h — the options `parasol search` and `parasol compare` share: plugins,
 * algorithm options, constraints (memory, kinds of parallelism, devices) and the problem
 * they describe together with the plan options of sim-options.h. */
#pragma once

#include "parasol-search.h"
#include "sim-options.h"

typedef struct {
  char **plugins;
  char **opts;
  char *allow;
  char *devices;
  gboolean memory_limit, no_memory_limit;
  gint64 seed;
  int threads;
  char *budget;
  char *rank_timeout;         /* seconds, as given; NULL: the default                   */
} CliSearchOptions;

void cli_search_options_init(CliSearchOptions *o);
void cli_search_options_clear(CliSearchOptions *o);
/* The option group (--plugin, --opt, --allow, --devices, --memory-limit,
 * --no-memory-limit, --seed, --threads, --budget, --rank-timeout). */
GOptionGroup *cli_search_option_group(CliSearchOptions *o);

/* Registers the built-in algorithms, loads the plugins and sets the rank timeout. */
gboolean cli_search_setup(const CliSearchOptions *o, GError **error);
/* Prints every registered algorithm with its description and options. */
void cli_search_print_algorithms(FILE *out);
/* The algorithm named @name, or NULL with an error that points to --list. */
const SearchAlgorithm *cli_search_lookup(const char *name, GError **error);

/* The problem on @pb with the plan's options and the constraints (transfer full). */
SearchProblem *cli_search_problem(const CliProblem *pb, const CliPlanOptions *plan,
                                  const CliSearchOptions *o, GError **error);
/* The budget, seed, threads and algorithm options as the driver takes them; @o must
 * outlive the result. */
gboolean cli_search_run_options(const CliSearchOptions *o, SearchRunOptions *out,
                                GError **error);
/* Rejects the plan flags that describe a fixed plan (--dp, --tp, --pp, micro-batches):
 * the search chooses those. */
gboolean cli_search_check_plan(const CliPlanOptions *plan, GError **error);
