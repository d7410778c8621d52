/* exhaustive.c — every combination of candidate configurations, simulated: the ground
 * truth the tests hold the other algorithms to.  Combinations are numbered like the
 * readings of an odometer with the last operator fastest, so most steps change one
 * operator and the delta simulation re-simulates little.
 *
 * The numbers to visit (all of them, or as many as the evaluation budget allows) are cut
 * into rounds of --threads blocks; block i of a round runs on its own evaluator (slot i,
 * kept from round to round), on rank i mod ranks where the search is shared
 * (distributed.h), and after every round the ranks exchange the evaluations and the best.
 * A combination's tie key is its number, as one evaluator walking them all would give
 * it, so the best does not depend on the threads or the ranks. */
#include "search-private.h"
#include "distributed.h"

/* The combinations a block holds: enough to pay for positioning its evaluator, few
 * enough that the ranks meet often. */
#define BLOCK_MIN 64
#define BLOCK_MAX 4096

typedef struct {
  SearchContext *ctx;
  const SearchProblem *p;
  int n;                      /* operators                                              */
  SearchEvaluator **ev;       /* per slot, made by its first block                      */
  int **digit;                /* per slot: the combination its evaluator holds          */
  gint64 round_start, block, end;
  GMutex lock;
  GError *error;
} Odometer;

/* The digits of combination @index, the last operator fastest. */
static void digits_of(const Odometer *o, guint64 index, int *digit)
{
  for (int op = o->n - 1; op >= 0; op--) {
    guint64 k = (guint64)search_problem_n_configs(o->p, op);
    digit[op] = (int)(index % k);
    index /= k;
  }
}

/* Moves slot @i's evaluator to the combination @index (making it on first use). */
static gboolean position(Odometer *o, int i, gint64 index)
{
  g_autofree int *want = g_new0(int, MAX(o->n, 1));
  digits_of(o, (guint64)index, want);
  if (!o->ev[i]) {
    GError *error = NULL;
    g_autoptr(SimStrategy) s = search_problem_strategy_from_configs(o->p, want, &error);
    if (s)
      o->ev[i] = search_evaluator_new(o->ctx, s, 0, &error);
    if (!o->ev[i]) {
      g_mutex_lock(&o->lock);
      if (!o->error)
        o->error = error;
      else
        g_clear_error(&error);
      g_mutex_unlock(&o->lock);
      return FALSE;
    }
    o->digit[i] = g_steal_pointer(&want);
    return TRUE;
  }
  for (int op = 0; op < o->n; op++)
    if (o->digit[i][op] != want[op]) {
      o->digit[i][op] = want[op];
      search_evaluator_set_config(o->ev[i], op, search_problem_config(o->p, op, want[op]));
    }
  return TRUE;
}

static void block_task(int i, gpointer data)
{
  Odometer *o = data;
  gint64 start = o->round_start + (gint64)i * o->block;
  gint64 end = MIN(start + o->block, o->end);
  if (start >= end || search_context_should_stop(o->ctx) || !position(o, i, start))
    return;
  SearchEvaluator *ev = o->ev[i];
  int *digit = o->digit[i];
  /* Combination c is the evaluator's run c + 1, its tie key. */
  search_evaluator_set_runs(ev, start);
  for (gint64 c = start;;) {
    search_evaluator_run(ev);
    if (++c >= end || search_context_should_stop(o->ctx))
      break;
    /* The next combination: bump the last digit, carrying leftwards. */
    int op = o->n - 1;
    while (op >= 0 && digit[op] + 1 >= search_problem_n_configs(o->p, op)) {
      digit[op] = 0;
      search_evaluator_set_config(ev, op, search_problem_config(o->p, op, 0));
      op--;
    }
    if (op < 0)
      break;
    digit[op]++;
    search_evaluator_set_config(ev, op, search_problem_config(o->p, op, digit[op]));
  }
}

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
  /* The first combination is built here first, so that a problem whose strategies cannot
   * be built fails before any block starts. */
  g_autofree int *zero = g_new0(int, MAX(n, 1));
  g_autoptr(SimStrategy) start = search_problem_strategy_from_configs(p, zero, error);
  if (!start)
    return FALSE;
  /* The numbers visited: all, or the budget's first; far past what any search reaches
   * where there are more than a gint64 holds. */
  gint64 left = search_context_evals_left(ctx);
  gint64 count = total < 4e18 ? (gint64)total : G_GINT64_CONSTANT(4000000000000000000);
  int slots = MAX(1, ctx->threads);
  Odometer o = { .ctx = ctx, .p = p, .n = n, .end = MIN(count, left) };
  o.block = CLAMP(o.end / ((gint64)slots * 8), BLOCK_MIN, BLOCK_MAX);
  o.ev = g_new0(SearchEvaluator *, slots);
  o.digit = g_new0(int *, slots);
  g_mutex_init(&o.lock);
  gboolean failed = FALSE;
  for (o.round_start = 0; o.round_start < o.end && !search_dist_should_stop(ctx);
       o.round_start += o.block * slots) {
    search_dist_parallel(ctx, slots, block_task, &o);
    search_dist_sync(ctx);
    if ((failed = search_dist_any(ctx, o.error != NULL)))
      break;
  }
  for (int i = 0; i < slots; i++) {
    search_evaluator_free(o.ev[i]);
    g_free(o.digit[i]);
  }
  g_free(o.ev);
  g_free(o.digit);
  g_mutex_clear(&o.lock);
  if (o.error)
    g_propagate_error(error, o.error);
  else if (failed)
    g_set_error(error, SEARCH_ERROR, SEARCH_ERROR_FAILED,
                "exhaustive search: another rank could not build a strategy");
  return !failed;
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
