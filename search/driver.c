/* driver.c — runs a search algorithm: the budget (seconds or evaluations), the seed and
 * its random streams, the worker threads, the evaluations (full simulations and delta
 * evaluators over SimSession), the best strategy, the log of improvements, the progress
 * line, and the result it fills (result.c); signals.c catches Ctrl-C and runs the watches.
 *
 * Determinism: an algorithm that gives each parallel task its own random stream
 * (search_context_rand_new) and its own share of the evaluations
 * (search_evaluator_set_limit) evaluates the same strategies whatever the threads' timing.
 * The best is then the same too, because strategies of equal time are ordered by a key
 * (stream, index in the stream) rather than by which thread reported first. */
#include "search-private.h"
#include "distributed.h"

#include <errno.h>
#include <stdarg.h>
#include <string.h>
#include <unistd.h>

/* The default budget when the caller gives none: a search always ends. */
#define DEFAULT_SECONDS 60.0
/* The stream of search_context_evaluate(): after every evaluator's. */
#define FULL_EVAL_STREAM 0xffffffu

/* ---------------------------------------------------------------------------------- */
/* Options and budgets                                                                */

SearchRunOptions search_run_options_default(void)
{
  return (SearchRunOptions){ .time_budget = 0, .eval_budget = 0, .seed = 1, .threads = 1 };
}

/* The largest budgets: a year and 10^12 evaluations (larger ones are typing errors, and
 * their microseconds or counts would overflow). */
#define BUDGET_MAX_SECONDS (365.0 * 24 * 3600)
#define BUDGET_MAX_EVALS 1e12

static gboolean budget_too_large(const char *term, GError **error)
{
  g_set_error(error, SEARCH_ERROR, SEARCH_ERROR_INVALID,
              "budget '%s': too large; at most 8760h (a year) or 1000000000000 evaluations "
              "(1e12)", term);
  return FALSE;
}

/* One term of a budget: "60s", "2m", "1h", "5000evals", "5k" (evaluations). */
static gboolean parse_budget_term(const char *term, SearchRunOptions *o, GError **error)
{
  char *end = NULL;
  double v = g_ascii_strtod(term, &end);
  if (end == term || isnan(v) || v <= 0)
    goto bad;
  if (!isfinite(v))
    return budget_too_large(term, error);
  while (*end == ' ')
    end++;
  double scale = 1;
  if (*end == 'k' || *end == 'M') {
    /* Multipliers only make sense for evaluations: "5k" or "5kevals". */
    scale = *end == 'k' ? 1e3 : 1e6;
    end++;
    if (*end && strcmp(end, "evals") && strcmp(end, "eval") && strcmp(end, "e"))
      goto bad;
    if (v * scale > BUDGET_MAX_EVALS)
      return budget_too_large(term, error);
    o->eval_budget = (gint64)(v * scale);
    return TRUE;
  }
  if (!*end || !strcmp(end, "evals") || !strcmp(end, "eval") || !strcmp(end, "e")) {
    if (v != floor(v))
      goto bad;
    if (v > BUDGET_MAX_EVALS)
      return budget_too_large(term, error);
    o->eval_budget = (gint64)v;
    return TRUE;
  }
  if (!strcmp(end, "s") || !strcmp(end, "sec"))
    scale = 1;
  else if (!strcmp(end, "m") || !strcmp(end, "min"))
    scale = 60;
  else if (!strcmp(end, "h"))
    scale = 3600;
  else
    goto bad;
  if (v * scale > BUDGET_MAX_SECONDS)
    return budget_too_large(term, error);
  o->time_budget = v * scale;
  return TRUE;
bad:
  g_set_error(error, SEARCH_ERROR, SEARCH_ERROR_INVALID,
              "budget '%s': expected seconds (60s, 2m, 1h) or evaluations (5000evals, 5k)",
              term);
  return FALSE;
}

gboolean search_parse_budget(const char *text, SearchRunOptions *o, GError **error)
{
  g_return_val_if_fail(text != NULL && o != NULL, FALSE);
  o->time_budget = 0;
  o->eval_budget = 0;
  g_auto(GStrv) terms = g_strsplit(text, ",", -1);
  gboolean any = FALSE;
  for (char **it = terms; *it; it++) {
    char *t = g_strstrip(*it);
    if (!*t)
      continue;
    if (!parse_budget_term(t, o, error))
      return FALSE;
    any = TRUE;
  }
  if (!any) {
    g_set_error(error, SEARCH_ERROR, SEARCH_ERROR_INVALID,
                "empty budget: expected seconds (60s) or evaluations (5000evals)");
    return FALSE;
  }
  return TRUE;
}

/* Whether @key is an option of @algo, or of the algorithm its "inner" option names. */
static gboolean option_known(const SearchAlgorithm *algo, GHashTable *options, const char *key)
{
  for (const SearchOptionSpec *s = algo->options; s && s->name; s++)
    if (!strcmp(s->name, key))
      return TRUE;
  const char *inner = g_hash_table_lookup(options, "inner");
  const SearchAlgorithm *in = inner ? search_lookup(inner) : NULL;
  return in && in != algo && option_known(in, options, key);
}

static GHashTable *parse_options(const SearchAlgorithm *algo, const char *const *opts,
                                 GError **error)
{
  g_autoptr(GHashTable) h = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
  for (const char *const *it = opts; it && *it; it++) {
    const char *eq = strchr(*it, '=');
    if (!eq || eq == *it) {
      g_set_error(error, SEARCH_ERROR, SEARCH_ERROR_INVALID,
                  "algorithm option '%s': expected KEY=VALUE", *it);
      return NULL;
    }
    g_hash_table_replace(h, g_strndup(*it, (gsize)(eq - *it)), g_strdup(eq + 1));
  }
  GHashTableIter iter;
  gpointer key;
  g_hash_table_iter_init(&iter, h);
  while (g_hash_table_iter_next(&iter, &key, NULL)) {
    if (option_known(algo, h, key))
      continue;
    GString *known = g_string_new(NULL);
    for (const SearchOptionSpec *s = algo->options; s && s->name; s++)
      g_string_append_printf(known, "%s%s", known->len ? ", " : "", s->name);
    g_set_error(error, SEARCH_ERROR, SEARCH_ERROR_UNKNOWN,
                "algorithm '%s' has no option '%s' (it has: %s)", algo->name,
                (const char *)key, known->len ? known->str : "none");
    g_string_free(known, TRUE);
    return NULL;
  }
  return g_steal_pointer(&h);
}

/* ---------------------------------------------------------------------------------- */
/* The context's queries                                                              */

const SearchProblem *search_context_get_problem(const SearchContext *ctx)
{
  g_return_val_if_fail(ctx != NULL, NULL);
  return ctx->problem;
}

guint64 search_context_get_seed(const SearchContext *ctx)
{
  g_return_val_if_fail(ctx != NULL, 0);
  return ctx->seed;
}

int search_context_get_threads(const SearchContext *ctx)
{
  g_return_val_if_fail(ctx != NULL, 1);
  return ctx->threads;
}

gint64 search_context_get_eval_budget(const SearchContext *ctx)
{
  g_return_val_if_fail(ctx != NULL, 0);
  return ctx->eval_budget;
}

double search_context_get_time_budget(const SearchContext *ctx)
{
  g_return_val_if_fail(ctx != NULL, 0);
  return ctx->time_budget;
}

gint64 search_context_get_evals(const SearchContext *ctx)
{
  g_return_val_if_fail(ctx != NULL, 0);
  return atomic_load(&ctx->root->evals) - ctx->eval_base;
}

gint64 search_context_evals_left(const SearchContext *ctx)
{
  g_return_val_if_fail(ctx != NULL, 0);
  if (ctx->eval_limit == G_MAXINT64)
    return G_MAXINT64;
  return MAX(0, ctx->eval_limit - atomic_load(&ctx->root->evals));
}

double search_context_elapsed(const SearchContext *ctx)
{
  g_return_val_if_fail(ctx != NULL, 0);
  return (double)(g_get_monotonic_time() - ctx->root->t0) / 1e6;
}

gboolean search_context_should_stop(const SearchContext *ctx)
{
  g_return_val_if_fail(ctx != NULL, TRUE);
  SearchContext *root = ctx->root;
  if (atomic_load(&root->interrupted))
    return TRUE;
  if (root->handle_sigint && search_signals_seen()) {
    atomic_store(&root->interrupted, 1);
    return TRUE;
  }
  if (ctx->eval_limit != G_MAXINT64 && atomic_load(&root->evals) >= ctx->eval_limit)
    return TRUE;
  /* The watch's flag: the search's or its caller's deadline has passed. */
  if (root->watch && search_watch_fired(root->watch))
    return TRUE;
  return ctx->deadline < G_MAXDOUBLE && search_context_elapsed(ctx) >= ctx->deadline;
}

const char *search_context_get_option(const SearchContext *ctx, const char *key)
{
  g_return_val_if_fail(ctx != NULL && key != NULL, NULL);
  return ctx->options ? g_hash_table_lookup(ctx->options, key) : NULL;
}

/* A malformed option value stops the search, which then fails with this message. */
static void option_error(const SearchContext *ctx, const char *key, const char *value,
                         const char *what)
{
  SearchContext *root = ctx->root;
  g_mutex_lock(&root->lock);
  if (!root->option_error)
    g_set_error(&root->option_error, SEARCH_ERROR, SEARCH_ERROR_INVALID,
                "algorithm '%s': option %s=%s: expected %s", ctx->algo->name, key, value, what);
  g_mutex_unlock(&root->lock);
  atomic_store(&root->interrupted, 1);
}

double search_context_get_option_double(const SearchContext *ctx, const char *key, double def)
{
  const char *v = search_context_get_option(ctx, key);
  if (!v)
    return def;
  char *end = NULL;
  double x = g_ascii_strtod(v, &end);
  if (end == v || *end || !isfinite(x)) {
    option_error(ctx, key, v, "a number");
    return def;
  }
  return x;
}

int search_context_get_option_int(const SearchContext *ctx, const char *key, int def)
{
  const char *v = search_context_get_option(ctx, key);
  if (!v)
    return def;
  char *end = NULL;
  gint64 x = g_ascii_strtoll(v, &end, 10);
  if (end == v || *end || x < G_MININT || x > G_MAXINT) {
    option_error(ctx, key, v, "an integer");
    return def;
  }
  return (int)x;
}

double search_context_get_option_double_in(const SearchContext *ctx, const char *key,
                                           double def, double lo, double hi)
{
  const char *v = search_context_get_option(ctx, key);
  double x = search_context_get_option_double(ctx, key, def);
  if (v && (x < lo || x > hi)) {
    g_autofree char *what = isinf(hi) ? g_strdup_printf("a number of at least %g", lo)
                                      : g_strdup_printf("a number from %g to %g", lo, hi);
    option_error(ctx, key, v, what);
    return def;
  }
  return x;
}

int search_context_get_option_int_in(const SearchContext *ctx, const char *key, int def, int lo,
                                     int hi)
{
  const char *v = search_context_get_option(ctx, key);
  int x = search_context_get_option_int(ctx, key, def);
  if (v && (x < lo || x > hi)) {
    g_autofree char *what = hi == G_MAXINT ? g_strdup_printf("an integer of at least %d", lo)
                                           : g_strdup_printf("an integer from %d to %d", lo, hi);
    option_error(ctx, key, v, what);
    return def;
  }
  return x;
}

GRand *search_context_rand_new(const SearchContext *ctx, guint32 stream)
{
  g_return_val_if_fail(ctx != NULL, NULL);
  guint32 seed[4] = { (guint32)ctx->seed, (guint32)(ctx->seed >> 32), stream, 0x9e3779b9u };
  return g_rand_new_with_seed_array(seed, 4);
}

/* ---------------------------------------------------------------------------------- */
/* The best strategy, the log and the progress line                                   */

static char *format_time(double s)
{
  if (!isfinite(s))
    return g_strdup("-");
  if (s >= 1.0)
    return g_strdup_printf("%.3f s", s);
  if (s >= 1e-3)
    return g_strdup_printf("%.3f ms", s * 1e3);
  return g_strdup_printf("%.2f us", s * 1e6);
}

/* How often the progress line is drawn: on a terminal, redrawn in place; elsewhere (a
 * log file, a pipe) a line of its own, seldom enough for a log. */
#define PROGRESS_TTY_US 250000
#define PROGRESS_PIPE_US 5000000

static void print_progress(SearchContext *root, double wall, gboolean final)
{
  /* Off a terminal, the closing line only ends a run that showed progress. */
  if (final && !root->progress_tty && !root->progress_shown)
    return;
  gint64 evals = atomic_load(&root->evals);
  g_autofree char *best = format_time(root->best_cost);
  g_autofree char *cur = format_time(root->current);
  fprintf(stderr, "%s%s %6.1f s  %" G_GINT64_FORMAT " evals  %.0f/s  best %s  current %s%s",
          root->progress_tty ? "\r\033[K" : "", root->algo->name, wall, evals,
          wall > 0 ? (double)evals / wall : 0.0, best, cur,
          final || !root->progress_tty ? "\n" : "");
  fflush(stderr);
  root->progress_shown = TRUE;
}

static void log_row(SearchContext *root, double wall, gint64 evals)
{
  if (!root->log)
    return;
  char b[G_ASCII_DTOSTR_BUF_SIZE], c[G_ASCII_DTOSTR_BUF_SIZE];
  fprintf(root->log, "%.3f,%" G_GINT64_FORMAT ",%s,%s\n", wall, evals,
          isfinite(root->best_cost) ? g_ascii_formatd(b, sizeof b, "%.9g", root->best_cost) : "",
          isfinite(root->current) ? g_ascii_formatd(c, sizeof c, "%.9g", root->current) : "");
  fflush(root->log);
}

/* Replaces @c's best with @s when @cost beats it, or equals it with a smaller key. */
static gboolean offer_best(SearchContext *c, const SearchProblem *p, const SimStrategy *s,
                           double cost, guint64 key)
{
  if (!(cost < c->best_cost || (cost == c->best_cost && key < c->best_key)))
    return FALSE;
  gboolean better = cost < c->best_cost;
  g_clear_pointer(&c->best, sim_strategy_free);
  g_clear_pointer(&c->best_problem, search_problem_unref);
  c->best = sim_strategy_copy(s);
  /* The strategy names the rewritten graph's operators, so it carries the rewrites that
   * lead there, whoever built it. */
  sim_strategy_clear_rewrites(c->best);
  for (const char *const *rw = search_problem_get_rewrites(p); *rw; rw++)
    sim_strategy_add_rewrite(c->best, *rw);
  c->best_problem = search_problem_ref((SearchProblem *)p);
  c->best_cost = cost;
  c->best_key = key;
  return better;
}

void search_context_record(SearchContext *ctx, const SearchProblem *p, const SimStrategy *s,
                           double cost, guint64 key)
{
  SearchContext *root = ctx->root;
  g_mutex_lock(&root->lock);
  if (isfinite(cost)) {
    if (ctx != root)
      offer_best(ctx, p, s, cost, key);
    if (offer_best(root, p, s, cost, key)) {
      double wall = search_context_elapsed(root);
      gint64 evals = atomic_load(&root->evals);
      root->current = cost;
      SearchImprovement imp = { wall, evals, cost };
      g_array_append_val(root->improvements, imp);
      log_row(root, wall, evals);
    }
  }
  if (!isnan(cost))
    root->current = cost;
  if (root->progress) {
    gint64 now = g_get_monotonic_time();
    gint64 every = root->progress_tty ? PROGRESS_TTY_US : PROGRESS_PIPE_US;
    if (now - root->last_progress > every) {
      root->last_progress = now;
      print_progress(root, (double)(now - root->t0) / 1e6, FALSE);
    }
  }
  g_mutex_unlock(&root->lock);
}

double search_context_get_best(SearchContext *ctx, SimStrategy **best)
{
  g_return_val_if_fail(ctx != NULL, INFINITY);
  g_mutex_lock(&ctx->root->lock);
  double cost = ctx->best_cost;
  if (best)
    *best = ctx->best ? sim_strategy_copy(ctx->best) : NULL;
  g_mutex_unlock(&ctx->root->lock);
  return cost;
}

void search_context_set_current(SearchContext *ctx, double cost)
{
  g_return_if_fail(ctx != NULL);
  g_mutex_lock(&ctx->root->lock);
  ctx->root->current = cost;
  g_mutex_unlock(&ctx->root->lock);
}

/* ---------------------------------------------------------------------------------- */
/* Evaluations                                                                        */

double search_context_evaluate(SearchContext *ctx, const SimStrategy *s)
{
  g_return_val_if_fail(ctx != NULL && s != NULL, INFINITY);
  return search_context_evaluate_at(ctx, s, search_context_reserve_full(ctx, 1));
}

gint64 search_context_reserve_full(SearchContext *ctx, gint64 n)
{
  SearchContext *root = ctx->root;
  g_mutex_lock(&root->lock);
  gint64 index = root->full_evals;
  root->full_evals += n;
  g_mutex_unlock(&root->lock);
  return index;
}

guint64 search_context_full_key(gint64 index)
{
  return search_key(FULL_EVAL_STREAM, index);
}

double search_context_evaluate_at(SearchContext *ctx, const SimStrategy *s, gint64 index)
{
  g_return_val_if_fail(ctx != NULL && s != NULL, INFINITY);
  atomic_fetch_add(&ctx->root->evals, 1);
  double cost = search_problem_simulate(ctx->problem, s, NULL, NULL);
  search_context_record(ctx, ctx->problem, s, cost, search_context_full_key(index));
  return cost;
}

double search_context_evaluate_bounded(SearchContext *ctx, const SimStrategy *s, double bound,
                                      guint64 key, gboolean *cut, gboolean *overflowed)
{
  g_return_val_if_fail(ctx != NULL && s != NULL, INFINITY);
  SearchContext *root = ctx->root;
  const SearchProblem *p = ctx->problem;
  atomic_fetch_add(&root->evals, 1);
  *cut = *overflowed = FALSE;
  SimBrief b;
  double cost = INFINITY;
  if (search_problem_brief(p, s, bound, &b, NULL)) {
    if (b.cut) {
      /* Slower than @bound, or over memory: counted, and not offered as the best. */
      atomic_fetch_add(&root->cut_evals, 1);
      *cut = TRUE;
      *overflowed = b.overflowed;
      search_context_record(ctx, p, s, NAN, key);
      return INFINITY;
    }
    cost = search_problem_cost(p, b.time, b.max_ratio, b.fits, NULL, NULL);
  }
  search_context_record(ctx, p, s, cost, key);
  return cost;
}

struct _SearchEvaluator {
  SearchContext *ctx;
  SimSession *ss;
  guint32 stream;
  gint64 n;
  gint64 limit;
  double last_time;
  double last_memory;
  gboolean unbounded;  /* PARASOL_NO_BOUNDS is set: every simulation runs to its end */
};

SearchEvaluator *search_evaluator_new(SearchContext *ctx, const SimStrategy *start,
                                      guint32 stream, GError **error)
{
  g_return_val_if_fail(ctx != NULL && start != NULL, NULL);
  const SearchProblem *p = ctx->problem;
  SimSession *ss = sim_session_new(p->g, p->m, start, p->cost, &p->sim, error);
  if (!ss)
    return NULL;
  SearchEvaluator *ev = g_new0(SearchEvaluator, 1);
  ev->ctx = ctx;
  ev->ss = ss;
  ev->stream = stream;
  ev->last_time = INFINITY;
  ev->unbounded = g_getenv("PARASOL_NO_BOUNDS") != NULL;
  return ev;
}

void search_evaluator_free(SearchEvaluator *ev)
{
  if (!ev)
    return;
  sim_session_free(ev->ss);
  g_free(ev);
}

gboolean search_evaluator_set_config(SearchEvaluator *ev, int op, const SearchConfig *c)
{
  g_return_val_if_fail(ev != NULL && c != NULL, FALSE);
  const SearchProblem *p = ev->ctx->problem;
  g_return_val_if_fail(c->n >= 1 && c->start >= 0 && c->start + c->n <= p->n_devices, FALSE);
  /* A view is a run of consecutive problem devices: its shards' devices in order. */
  return sim_session_set_op(ev->ss, op, c->degree, p->devices + c->start, NULL);
}

gboolean search_evaluator_set_op(SearchEvaluator *ev, int op, const int *degrees,
                                 const int *devices)
{
  return sim_session_set_op(ev->ss, op, degrees, devices, NULL);
}

gboolean search_evaluator_copy_op(SearchEvaluator *ev, int op, const SimStrategy *from)
{
  return sim_session_copy_op(ev->ss, op, from, NULL);
}

double search_evaluator_run(SearchEvaluator *ev)
{
  return search_evaluator_run_bounded(ev, INFINITY);
}

double search_evaluator_run_bounded(SearchEvaluator *ev, double bound)
{
  g_return_val_if_fail(ev != NULL, INFINITY);
  const SearchProblem *p = ev->ctx->problem;
  atomic_fetch_add(&ev->ctx->root->evals, 1);
  ev->n++;
  double t = sim_session_run_bounded(ev->ss, ev->unbounded ? INFINITY : bound);
  if (sim_session_cut(ev->ss)) {
    /* Slower than @bound, by at least t: its cost, at least t, is no candidate for the
     * best (which is below any bound a search sets), so it is counted and not offered. */
    atomic_fetch_add(&ev->ctx->root->cut_evals, 1);
    ev->last_time = t;
    ev->last_memory = 0;
    search_context_record(ev->ctx, p, sim_session_get_strategy(ev->ss), NAN,
                          search_key(ev->stream, ev->n));
    return t;
  }
  double cost = INFINITY;
  ev->last_time = INFINITY;
  ev->last_memory = 0;
  double ratio;
  gboolean fits;
  /* The report's figures, read from the session without building a report. */
  if (t > 0 && isfinite(t) && sim_session_memory(ev->ss, &ratio, &fits))
    cost = search_problem_cost(p, t, ratio, fits, &ev->last_time, &ev->last_memory);
  search_context_record(ev->ctx, p, sim_session_get_strategy(ev->ss), cost,
                        search_key(ev->stream, ev->n));
  return cost;
}

double search_evaluator_last_time(const SearchEvaluator *ev)
{
  g_return_val_if_fail(ev != NULL, INFINITY);
  return ev->last_time;
}

double search_evaluator_last_memory(const SearchEvaluator *ev)
{
  g_return_val_if_fail(ev != NULL, 0);
  return ev->last_memory;
}

const SimStrategy *search_evaluator_get_strategy(const SearchEvaluator *ev)
{
  g_return_val_if_fail(ev != NULL, NULL);
  return sim_session_get_strategy(ev->ss);
}

void search_evaluator_set_limit(SearchEvaluator *ev, gint64 max_evals)
{
  g_return_if_fail(ev != NULL && max_evals >= 0);
  ev->limit = max_evals;
}

gboolean search_evaluator_should_stop(const SearchEvaluator *ev)
{
  g_return_val_if_fail(ev != NULL, TRUE);
  if (ev->limit > 0 && ev->n >= ev->limit)
    return TRUE;
  return search_context_should_stop(ev->ctx);
}

gint64 search_evaluator_get_evals(const SearchEvaluator *ev)
{
  g_return_val_if_fail(ev != NULL, 0);
  return ev->n;
}

void search_evaluator_set_runs(SearchEvaluator *ev, gint64 runs)
{
  g_return_if_fail(ev != NULL && runs >= 0);
  ev->n = runs;
}

/* ---------------------------------------------------------------------------------- */
/* Worker threads                                                                     */

typedef struct {
  atomic_int next;
  int n;
  void (*fn)(int i, gpointer data);
  gpointer data;
} Parallel;

static gpointer parallel_worker(gpointer data)
{
  Parallel *par = data;
  for (;;) {
    int i = atomic_fetch_add(&par->next, 1);
    if (i >= par->n)
      break;
    par->fn(i, par->data);
  }
  return NULL;
}

void search_context_parallel(SearchContext *ctx, int n, void (*fn)(int i, gpointer data),
                             gpointer data)
{
  g_return_if_fail(ctx != NULL && fn != NULL);
  int workers = MIN(ctx->threads, n);
  if (workers <= 1) {
    for (int i = 0; i < n; i++)
      fn(i, data);
    return;
  }
  Parallel par = { .n = n, .fn = fn, .data = data };
  atomic_init(&par.next, 0);
  GThread **threads = g_new(GThread *, workers - 1);
  for (int w = 0; w < workers - 1; w++)
    threads[w] = g_thread_new("search-worker", parallel_worker, &par);
  parallel_worker(&par);
  for (int w = 0; w < workers - 1; w++)
    g_thread_join(threads[w]);
  g_free(threads);
}

/* ---------------------------------------------------------------------------------- */
/* Contexts                                                                           */

static SearchContext *context_new(const SearchAlgorithm *algo, SearchProblem *p)
{
  SearchContext *ctx = g_new0(SearchContext, 1);
  ctx->root = ctx;
  ctx->algo = algo;
  ctx->problem = search_problem_ref(p);
  ctx->best_cost = INFINITY;
  ctx->best_key = G_MAXUINT64;
  ctx->deadline = G_MAXDOUBLE;
  ctx->eval_limit = G_MAXINT64;
  ctx->current = INFINITY;
  ctx->predicted = ctx->predicted_simulated = NAN;
  atomic_init(&ctx->evals, 0);
  atomic_init(&ctx->cut_evals, 0);
  atomic_init(&ctx->interrupted, 0);
  g_mutex_init(&ctx->lock);
  return ctx;
}

static void context_free(SearchContext *ctx)
{
  g_clear_pointer(&ctx->best, sim_strategy_free);
  g_clear_pointer(&ctx->expert, sim_strategy_free);
  g_clear_pointer(&ctx->partial_expert, sim_strategy_free);
  g_clear_pointer(&ctx->best_problem, search_problem_unref);
  g_clear_pointer(&ctx->options, g_hash_table_unref);
  g_clear_pointer(&ctx->improvements, g_array_unref);
  g_clear_error(&ctx->option_error);
  search_problem_unref(ctx->problem);
  g_mutex_clear(&ctx->lock);
  g_free(ctx);
}

SearchContext *search_context_new_inner(SearchContext *ctx, const SearchAlgorithm *inner,
                                        SearchProblem *p, gint64 evals, double seconds)
{
  g_return_val_if_fail(ctx != NULL && inner != NULL && p != NULL, NULL);
  search_problem_prepare(p);
  SearchContext *c = context_new(inner, p);
  c->root = ctx->root;
  c->options = ctx->options ? g_hash_table_ref(ctx->options) : NULL;
  c->seed = ctx->seed;
  c->threads = ctx->threads;
  double now = search_context_elapsed(ctx);
  c->deadline = seconds > 0 ? MIN(now + seconds, ctx->deadline) : ctx->deadline;
  c->time_budget = c->deadline < G_MAXDOUBLE ? MAX(0, c->deadline - now) : 0;
  c->eval_base = atomic_load(&ctx->root->evals);
  c->eval_limit = evals > 0 ? MIN(c->eval_base + evals, ctx->eval_limit) : ctx->eval_limit;
  c->eval_budget = c->eval_limit < G_MAXINT64 ? MAX(0, c->eval_limit - c->eval_base) : 0;
  return c;
}

SearchContext *search_context_new_share(SearchContext *ctx, double share)
{
  gint64 left = search_context_evals_left(ctx);
  gint64 evals = 0;
  double seconds = 0;
  if (left != G_MAXINT64)
    evals = MAX(1, (gint64)((double)left * share));
  else if (ctx->deadline < G_MAXDOUBLE)
    seconds = MAX(1e-3, (ctx->deadline - search_context_elapsed(ctx)) * share);
  if (search_dist_should_stop(ctx))
    return NULL;
  return search_context_new_inner(ctx, ctx->algo, (SearchProblem *)ctx->problem, evals,
                                  seconds);
}

void search_context_free_inner(SearchContext *inner)
{
  if (inner)
    context_free(inner);
}

double search_context_run_inner(SearchContext *ctx, const SearchAlgorithm *inner,
                                SearchProblem *p, gint64 evals, double seconds,
                                SimStrategy **best, GError **error)
{
  SearchContext *c = search_context_new_inner(ctx, inner, p, evals, seconds);
  GError *run_error = NULL;
  gboolean ok = inner->run(inner, c, &run_error);
  /* Shared among ranks (subst's graphs, distributed.h): what its last tasks counted and
   * found, exchanged before its best is read. */
  search_dist_sync(c);
  if (!ok && !run_error)
    g_set_error(&run_error, SEARCH_ERROR, SEARCH_ERROR_PLUGIN,
                "algorithm '%s' failed without saying why (its run returned FALSE and set no "
                "error)", inner->name);
  if (run_error)
    g_propagate_error(error, run_error);
  double cost = INFINITY;
  if (ok)
    cost = search_context_get_best(c, best);
  else if (best)
    *best = NULL;
  search_context_free_inner(c);
  return ok ? cost : NAN;
}

/* ---------------------------------------------------------------------------------- */
/* Results                                                                            */

typedef struct {
  const SearchAlgorithm *algo;
  SearchContext *ctx;
  gboolean ok;
  GError *error;
  GMutex lock;
  GCond cond;
  gboolean done;
  gboolean left;        /* the caller stopped waiting for it (under lock)                */
  gatomicrefcount refs; /* the caller's and the thread's: an algorithm left running at the
                         * deadline outlives search_run()'s frame, so this is on the heap
                         * and the last of the two frees it */
} RunThread;

/* Algorithms left running at their deadline that have not returned yet, in the process:
 * their problems, graphs and machines must outlive them. */
static gint left_running;

gint search_algorithms_left_running(void)
{
  return g_atomic_int_get(&left_running);
}

static void run_thread_unref(RunThread *rt)
{
  if (!g_atomic_ref_count_dec(&rt->refs))
    return;
  g_mutex_clear(&rt->lock);
  g_cond_clear(&rt->cond);
  g_clear_error(&rt->error);
  g_free(rt);
}

static gpointer run_thread(gpointer data)
{
  RunThread *rt = data;
  GError *error = NULL;
  gboolean ok = rt->algo->run(rt->algo, rt->ctx, &error);
  g_mutex_lock(&rt->lock);
  rt->ok = ok;
  rt->error = error;
  rt->done = TRUE;
  gboolean left = rt->left;
  g_cond_signal(&rt->cond);
  g_mutex_unlock(&rt->lock);
  run_thread_unref(rt);
  if (left)
    g_atomic_int_dec_and_test(&left_running);
  return NULL;
}

/* A result holding copies of what @ctx's algorithm has reported (under its lock: an
 * algorithm left running at its deadline may still record). */
static SearchResult *result_from_context(SearchContext *ctx, SearchProblem *p, double elapsed)
{
  SearchResult *r = g_new0(SearchResult, 1);
  g_mutex_lock(&ctx->lock);
  r->problem = search_problem_ref(ctx->best_problem ? ctx->best_problem : p);
  r->best = ctx->best ? sim_strategy_copy(ctx->best) : NULL;
  r->time = ctx->best_cost;
  r->improvements = g_array_copy(ctx->improvements);
  r->expert = ctx->expert ? sim_strategy_copy(ctx->expert) : NULL;
  r->expert_time = ctx->expert_cost;
  r->expert_plans = ctx->expert_plans;
  r->expert_simulated = ctx->expert_simulated;
  r->partial_expert = ctx->partial_expert ? sim_strategy_copy(ctx->partial_expert) : NULL;
  r->partial_time = ctx->partial_cost;
  r->predicted = ctx->predicted;
  r->predicted_simulated = ctx->predicted_simulated;
  g_mutex_unlock(&ctx->lock);
  r->evals = atomic_load(&ctx->evals);
  r->cut_evals = atomic_load(&ctx->cut_evals);
  r->elapsed = elapsed;
  return r;
}

SearchResult *search_run(const SearchAlgorithm *algo, SearchProblem *p, const SearchRunOptions *o,
                         GError **error)
{
  g_return_val_if_fail(algo != NULL && p != NULL, NULL);
  SearchRunOptions def = search_run_options_default();
  if (!o)
    o = &def;
  if (o->time_budget < 0 || o->eval_budget < 0 || !isfinite(o->time_budget)) {
    g_set_error(error, SEARCH_ERROR, SEARCH_ERROR_INVALID,
                "the budget must be positive seconds or evaluations");
    return NULL;
  }
  if (o->threads < 0 || o->threads > 1024) {
    g_set_error(error, SEARCH_ERROR, SEARCH_ERROR_INVALID,
                "%d threads: expected 1 to 1024", o->threads);
    return NULL;
  }
  GHashTable *options = parse_options(algo, o->options, error);
  if (!options)
    return NULL;

  search_problem_prepare(p);
  SearchContext *ctx = context_new(algo, p);
  ctx->options = options;
  ctx->seed = o->seed;
  ctx->threads = MAX(o->threads, 1);
  ctx->time_budget = o->time_budget;
  ctx->eval_budget = o->eval_budget;
  if (o->time_budget > 0)
    ctx->deadline = o->time_budget;
  else if (o->eval_budget == 0)
    ctx->deadline = ctx->time_budget = DEFAULT_SECONDS;
  if (o->eval_budget > 0)
    ctx->eval_limit = o->eval_budget;
  ctx->improvements = g_array_new(FALSE, FALSE, sizeof(SearchImprovement));
  ctx->progress = o->progress;
  ctx->progress_tty = isatty(fileno(stderr));
  /* The first line off a terminal comes a whole interval in. */
  ctx->last_progress = g_get_monotonic_time();
  ctx->handle_sigint = o->handle_sigint;
  if (o->log_path) {
    ctx->log = fopen(o->log_path, "w");
    if (!ctx->log) {
      int e = errno;
      g_set_error(error, SEARCH_ERROR, SEARCH_ERROR_INVALID, "cannot write the log %s: %s",
                  o->log_path, g_strerror(e));
      context_free(ctx);
      return NULL;
    }
    fprintf(ctx->log, "wall_s,evals,best_s,current_s\n");
    /* A log that cannot be written (a full disk, /dev/full) fails before the search. */
    if (fflush(ctx->log) != 0 || ferror(ctx->log)) {
      int e = errno;
      g_set_error(error, SEARCH_ERROR, SEARCH_ERROR_INVALID, "cannot write the log %s: %s",
                  o->log_path, g_strerror(e));
      context_free(ctx);
      return NULL;
    }
  }

  /* Signals, where the caller has not caught them for the whole command. */
  gboolean own_signals = o->handle_sigint && !search_signals_caught();
  if (own_signals)
    search_signals_catch();

  ctx->t0 = g_get_monotonic_time();
  /* The watch cancels the simulations under way at the deadline (a budget in seconds, or
   * the caller's) or a signal. */
  gint64 deadline_us = 0;
  if (ctx->deadline < G_MAXDOUBLE)
    deadline_us = ctx->t0 + (gint64)(ctx->deadline * 1e6);
  if (o->deadline_us > 0 && (deadline_us == 0 || o->deadline_us < deadline_us))
    deadline_us = o->deadline_us;
  ctx->watch = search_watch_new(p, deadline_us, o->handle_sigint);

  /* The algorithm runs on a thread of its own; one that is still running a grace period
   * past the deadline (a plugin that never asks whether to stop) is left to itself, and
   * the result is the best it reported. */
  /* A search shared among MPI ranks (distributed.c) is never left behind: its exchanges
   * give up on their own past the deadline. */
  search_dist_begin(ctx);
  gboolean shared = search_dist_on(ctx);
  RunThread *rt = g_new0(RunThread, 1);
  rt->algo = algo;
  rt->ctx = ctx;
  g_mutex_init(&rt->lock);
  g_cond_init(&rt->cond);
  g_atomic_ref_count_init(&rt->refs);
  g_atomic_ref_count_inc(&rt->refs);
  GThread *thread = g_thread_new("search", run_thread, rt);
  gboolean abandoned = FALSE;
  double budget_s = deadline_us > 0 ? (double)(deadline_us - ctx->t0) / 1e6 : 0;
  gint64 grace_us = (gint64)(MAX(0.5, 0.02 * budget_s) * 1e6);
  g_mutex_lock(&rt->lock);
  while (!rt->done) {
    gint64 until = g_get_monotonic_time() + 50000;
    if (!shared && deadline_us > 0 && g_get_monotonic_time() >= deadline_us + grace_us) {
      abandoned = TRUE;
      break;
    }
    if (o->handle_sigint && search_signals_seen() > 0) {
      /* A signal: the algorithm gets the grace period from now. */
      gint64 cut = g_get_monotonic_time();
      if (deadline_us == 0 || cut < deadline_us)
        deadline_us = cut;
    }
    g_cond_wait_until(&rt->cond, &rt->lock, until);
  }
  /* Left running, the algorithm's outcome is not read: it may still come. */
  if (abandoned) {
    rt->left = TRUE;
    g_atomic_int_inc(&left_running);
  }
  gboolean ok = !abandoned && rt->ok;
  GError *run_error = abandoned ? NULL : g_steal_pointer(&rt->error);
  g_mutex_unlock(&rt->lock);
  run_thread_unref(rt);
  if (abandoned)
    g_thread_unref(thread);
  else
    g_thread_join(thread);
  if (!abandoned)
    search_dist_end(ctx);
  double elapsed = search_context_elapsed(ctx);

  if (own_signals)
    search_signals_release();
  /* Under the lock: an abandoned algorithm may still record. */
  g_mutex_lock(&ctx->lock);
  if (ctx->progress)
    print_progress(ctx, elapsed, TRUE);
  g_autofree char *log_error = NULL;
  ctx->progress = FALSE;
  if (ctx->log) {
    log_row(ctx, elapsed, atomic_load(&ctx->evals));
    gboolean bad = ferror(ctx->log) != 0;
    int e = bad ? EIO : 0;
    if (fclose(ctx->log) != 0 && !bad) {
      bad = TRUE;
      e = errno;
    }
    ctx->log = NULL;
    /* The search's result is kept; the caller says that the log is incomplete. */
    if (bad)
      log_error = g_strdup_printf("cannot write the log %s: %s", o->log_path, g_strerror(e));
  }
  g_mutex_unlock(&ctx->lock);
  if (abandoned) {
    /* The algorithm keeps its context (and its problem's flag stays set, so its
     * simulations stop at once): the result copies what it has reported. */
    search_watch_stop(ctx->watch);
    atomic_store(&ctx->interrupted, 1);
    SearchResult *r = result_from_context(ctx, p, elapsed);
    r->interrupted = o->handle_sigint && search_signals_seen() > 0;
    r->log_error = g_steal_pointer(&log_error);
    r->abandoned = TRUE;
    return r;
  }
  g_clear_pointer(&ctx->watch, search_watch_free);
  if (ctx->option_error) {
    g_clear_error(&run_error);
    g_propagate_error(error, g_steal_pointer(&ctx->option_error));
    context_free(ctx);
    return NULL;
  }
  if (!ok) {
    if (!run_error)
      g_set_error(&run_error, SEARCH_ERROR, SEARCH_ERROR_PLUGIN,
                  "algorithm '%s' failed without saying why (its run returned FALSE and set "
                  "no error)", algo->name);
    g_propagate_error(error, run_error);
    context_free(ctx);
    return NULL;
  }

  SearchResult *r = result_from_context(ctx, p, elapsed);
  r->interrupted = atomic_load(&ctx->interrupted) != 0 && o->handle_sigint &&
                   search_signals_seen() > 0;
  r->log_error = g_steal_pointer(&log_error);
  context_free(ctx);
  return r;
}

void search_context_keep_partial_expert(SearchContext *ctx, const SimStrategy *s, double cost)
{
  SearchContext *root = ctx->root;
  if (ctx->problem != root->problem)
    return;
  g_mutex_lock(&root->lock);
  if (!root->partial_expert || cost < root->partial_cost) {
    g_clear_pointer(&root->partial_expert, sim_strategy_free);
    root->partial_expert = sim_strategy_copy(s);
    root->partial_cost = cost;
  }
  g_mutex_unlock(&root->lock);
}

void search_context_keep_expert(SearchContext *ctx, const SimStrategy *s, double cost)
{
  SearchContext *root = ctx->root;
  if (ctx->problem != root->problem)
    return;
  g_mutex_lock(&root->lock);
  if (!root->expert) {
    root->expert = sim_strategy_copy(s);
    root->expert_cost = cost;
  }
  g_mutex_unlock(&root->lock);
}

void search_context_set_prediction(SearchContext *ctx, double predicted, double simulated)
{
  SearchContext *root = ctx->root;
  g_mutex_lock(&root->lock);
  root->predicted = predicted;
  root->predicted_simulated = simulated;
  g_mutex_unlock(&root->lock);
}

