/* beam.c — beam search over the operators in topological order.  A partial strategy has
 * chosen configurations for the operators so far and leaves the rest as its start had
 * them (data parallel, or the expert's plan for a second start); each
 * step tries every candidate configuration of the next operator in each of the k best
 * partial strategies, simulates the results (delta simulation) and keeps the k best.  The
 * partial strategies of a step are simulated on the worker threads, each with its share of
 * the evaluations (and divided among MPI ranks, distributed.h).  The best strategy is then
 * refined by local search. */
#include "distributed.h"
#include "search-private.h"

#include <string.h>

typedef struct {
  SimStrategy *s;
  double cost;
} Entry;

typedef struct {
  SearchContext *ctx;
  const SearchProblem *p;
  int op;
  GArray *cands;
  Entry *entries;
  int n_entries;
  double *costs;      /* n_entries x cands->len, +inf where not simulated */
  gint64 *shares;
} Step;

static void step_task(int i, gpointer data)
{
  Step *st = data;
  int nc = (int)st->cands->len;
  double *row = st->costs + (gsize)i * nc;
  for (int k = 0; k < nc; k++)
    row[k] = INFINITY;
  const Entry *e = &st->entries[i];
  g_autoptr(SearchEvaluator) ev = search_evaluator_new(st->ctx, e->s, (guint32)i, NULL);
  if (!ev)
    return;
  search_evaluator_set_limit(ev, st->shares[i]);
  int orig = search_problem_config_of(st->p, e->s, st->op);
  int n = 0;
  int degrees[SEARCH_MAX_DIMS];
  memcpy(degrees, sim_strategy_op_degrees(e->s, st->op), sizeof degrees);
  const int *devices = sim_strategy_op_devices(e->s, st->op, &n);
  for (int k = 0; k < nc; k++) {
    int c = g_array_index(st->cands, int, k);
    if (c == orig) {
      row[k] = e->cost;
      continue;
    }
    if (search_evaluator_should_stop(ev))
      break;
    if (!search_evaluator_set_config(ev, st->op, search_problem_config(st->p, st->op, c)))
      continue;
    row[k] = search_penalized(ev, search_evaluator_run(ev));
    search_evaluator_set_op(ev, st->op, degrees, devices);
  }
}

typedef struct {
  double cost;
  int entry, cand;
} Trial;

static int trial_compare(gconstpointer a, gconstpointer b)
{
  const Trial *x = a, *y = b;
  if (x->cost != y->cost)
    return x->cost < y->cost ? -1 : 1;
  if (x->entry != y->entry)
    return x->entry - y->entry;
  return x->cand - y->cand;
}

static gboolean beam_run(const SearchAlgorithm *self, SearchContext *ctx, GError **error)
{
  const SearchProblem *p = search_context_get_problem(ctx);
  int n = sim_graph_n_ops(p->g);
  int width = search_context_get_option_int_in(ctx, "width", 3, 1, G_MAXINT);
  int max_cands = search_context_get_option_int_in(ctx, "cands", 8, 1, G_MAXINT);
  int polish = search_context_get_option_int_in(ctx, "polish", 1, 0, 1);
  SearchEstimate *e = search_estimate_new(p);

  Entry *beam = g_new0(Entry, width);
  int n_beam = 1;
  beam[0].s = search_start_data_parallel(ctx, NULL, error);
  if (!beam[0].s) {
    g_free(beam);
    search_estimate_free(e);
    return FALSE;
  }
  {
    g_autoptr(SearchEvaluator) ev = search_evaluator_new(ctx, beam[0].s, 0, error);
    if (!ev) {
      sim_strategy_free(beam[0].s);
      g_free(beam);
      search_estimate_free(e);
      return FALSE;
    }
    beam[0].cost = search_penalized(ev, search_evaluator_run(ev));
  }
  /* The expert's plan starts a second partial strategy: its undecided operators keep the
   * expert's configurations. */
  if (width > 1) {
    double ec = INFINITY;
    SimStrategy *expert = search_start_expert(ctx, TRUE, &ec);
    if (expert && isfinite(ec) && !sim_strategy_equal(expert, beam[0].s)) {
      beam[1].s = expert;
      beam[1].cost = ec;
      n_beam = 2;
    } else if (expert) {
      sim_strategy_free(expert);
    }
  }

  for (int op = 0; op < n && !search_dist_should_stop(ctx); op++) {
    int total = search_problem_n_configs(p, op);
    if (total <= 1)
      continue;
    GArray *cands = search_polish_candidates(p, e, op, max_cands);
    if ((int)cands->len < total) {
      /* Each partial strategy's own configuration stays a choice. */
      for (int b = 0; b < n_beam; b++) {
        int c = search_problem_config_of(p, beam[b].s, op);
        gboolean have = c < 0;
        for (guint k = 0; k < cands->len && !have; k++)
          have = g_array_index(cands, int, k) == c;
        if (!have)
          g_array_append_val(cands, c);
      }
    }
    int nc = (int)cands->len;
    Step st = { .ctx = ctx, .p = p, .op = op, .cands = cands, .entries = beam,
                .n_entries = n_beam };
    st.costs = g_new(double, (gsize)n_beam * nc);
    st.shares = g_new0(gint64, n_beam);
    gint64 left = search_context_evals_left(ctx);
    for (int b = 0; b < n_beam; b++)
      if (left != G_MAXINT64)
        st.shares[b] = MAX(1, left / n_beam + (b < left % n_beam ? 1 : 0));
    /* Under MPI the partial strategies are divided among the ranks, which then hold every
     * row of costs and the evaluations of all (distributed.h). */
    search_dist_parallel(ctx, n_beam, step_task, &st);
    search_dist_share(ctx, n_beam, st.costs, (size_t)nc * sizeof(double),
                      (size_t)nc * sizeof(double));
    search_dist_sync(ctx);

    GArray *trials = g_array_new(FALSE, FALSE, sizeof(Trial));
    for (int b = 0; b < n_beam; b++)
      for (int k = 0; k < nc; k++)
        if (isfinite(st.costs[(gsize)b * nc + k])) {
          Trial t = { st.costs[(gsize)b * nc + k], b, k };
          g_array_append_val(trials, t);
        }
    g_array_sort(trials, trial_compare);
    Entry *next = g_new0(Entry, width);
    int n_next = 0;
    for (guint i = 0; i < trials->len && n_next < width; i++) {
      const Trial *t = &g_array_index(trials, Trial, i);
      SimStrategy *s = sim_strategy_copy(beam[t->entry].s);
      int c = g_array_index(cands, int, t->cand);
      if (!search_problem_apply_config(p, s, op, search_problem_config(p, op, c), NULL)) {
        sim_strategy_free(s);
        continue;
      }
      gboolean dup = FALSE;
      for (int j = 0; j < n_next && !dup; j++)
        dup = sim_strategy_equal(next[j].s, s);
      if (dup) {
        sim_strategy_free(s);
        continue;
      }
      next[n_next].s = s;
      next[n_next].cost = t->cost;
      n_next++;
    }
    g_array_unref(trials);
    g_free(st.costs);
    g_free(st.shares);
    g_array_unref(cands);
    if (n_next > 0) {
      for (int b = 0; b < n_beam; b++)
        sim_strategy_free(beam[b].s);
      g_free(beam);
      beam = next;
      n_beam = n_next;
    } else {
      g_free(next);
    }
  }

  if (polish && !search_dist_should_stop(ctx)) {
    GArray **lists = g_new(GArray *, MAX(n, 1));
    for (int op = 0; op < n; op++)
      lists[op] = search_polish_candidates(p, e, op, max_cands);
    search_polish(ctx, &beam[0].s, lists, 0, 0);
    for (int op = 0; op < n; op++)
      g_array_unref(lists[op]);
    g_free(lists);
  }
  for (int b = 0; b < n_beam; b++)
    sim_strategy_free(beam[b].s);
  g_free(beam);
  search_estimate_free(e);
  return TRUE;
}

static const SearchOptionSpec beam_options[] = {
  { "width", "partial strategies kept after each operator (default 3)" },
  { "cands", "candidate configurations tried per operator (default 8; all if at most 4x)" },
  { "polish", "1: refine the best by local search with the simulator (default), 0: not" },
  { NULL, NULL },
};

const SearchAlgorithm search_algo_beam = {
  .api_version = SEARCH_ALGORITHM_API_VERSION,
  .name = "beam",
  .description = "beam search over the operators in topological order, keeping the k best "
                 "partial strategies",
  .run = beam_run,
  .options = beam_options,
};
