/* yardsticks.c — what a search's plan is measured against, and which plan is kept: data
 * parallelism over every device and the fastest expert plan, simulated after the search
 * (or taken from it where the algorithm went through them), and the fastest of those and
 * the search's own best where the search gives way to a faster yardstick. */
#include "search-private.h"

#include <math.h>
#include <string.h>

struct _SearchMeasure {
  SearchYardsticks y;
  SimStrategy *kept;           /* a yardstick's plan, where one was kept; else NULL        */
  SearchResult *expert_run;    /* the expert plans simulated for the yardstick, or NULL    */
  SearchProblem *problem;      /* the problem as posed, which the yardsticks are plans for */
};

void search_measure_free(SearchMeasure *m)
{
  if (!m)
    return;
  sim_strategy_free(m->kept);
  search_result_free(m->expert_run);
  if (m->problem)
    search_problem_unref(m->problem);
  g_free(m);
}

gboolean search_algorithm_gives_way(const SearchAlgorithm *algo, const SearchProblem *p)
{
  g_return_val_if_fail(algo != NULL && p != NULL, FALSE);
  return strcmp(algo->name, "data-parallel") && strcmp(algo->name, "expert") &&
         strcmp(algo->name, "owt") && search_problem_get_kinds(p) == SEARCH_KIND_ALL;
}

/* Data parallelism on @p simulated until @deadline_us, unless a signal was caught: its
 * time, whether it fits and whether it was simulated go to @y; returns the plan (NULL
 * after a signal or where there is none). */
static SimStrategy *measure_data_parallel(SearchProblem *p, gint64 deadline_us,
                                          SearchYardsticks *y)
{
  y->data_parallel = INFINITY;
  y->data_parallel_fits = y->data_parallel_done = FALSE;
  if (search_signals_seen() != 0)
    return NULL;
  g_autoptr(SearchWatch) watch = search_watch_new(p, deadline_us, TRUE);
  SimStrategy *dp = search_problem_data_parallel(p, NULL);
  if (!dp)
    return NULL;
  g_autoptr(SimReport) rep = NULL;
  search_problem_simulate(p, dp, &rep, NULL);
  if (rep) {
    y->data_parallel = sim_report_iteration_time(rep);
    y->data_parallel_fits = sim_report_fits(rep);
    y->data_parallel_done = TRUE;
  }
  return dp;
}

gboolean search_problem_measure_data_parallel(SearchProblem *p, gint64 deadline_us,
                                              double *time, gboolean *fits)
{
  g_return_val_if_fail(p != NULL, FALSE);
  SearchYardsticks y = { 0 };
  sim_strategy_free(measure_data_parallel(p, deadline_us, &y));
  if (time)
    *time = y.data_parallel;
  if (fits)
    *fits = y.data_parallel_fits;
  return y.data_parallel_done;
}

const SearchYardsticks *search_result_measure(SearchResult *r, SearchProblem *p,
                                              const SearchRunOptions *o, gint64 deadline_us,
                                              gboolean give_way)
{
  g_return_val_if_fail(r != NULL && p != NULL && o != NULL, NULL);
  SearchMeasure **slot = search_result_measure_slot(r);
  search_measure_free(*slot);
  SearchMeasure *m = *slot = g_new0(SearchMeasure, 1);
  m->problem = search_problem_ref(p);
  SearchYardsticks *y = &m->y;
  y->data_parallel = y->expert = INFINITY;
  y->search_time = search_result_get_time(r);
  y->kept = search_result_get_strategy(r) ? "search" : NULL;

  gboolean cut = FALSE;
  double known_time = INFINITY;
  const SimStrategy *known = search_result_get_expert(r, &known_time);
  y->expert_simulated = search_result_get_expert_progress(r, &y->expert_plans);
  if (!known && y->expert_plans > 0) {
    /* The search went through the expert plans but not to the end: the yardstick is the
     * best of those it simulated (simulating them again from the first would only repeat
     * them). */
    known = search_result_get_expert_best(r, &known_time);
    cut = TRUE;
  }
  /* Data parallelism first, unless its weights and gradients alone cannot fit (the
   * closed-form bound): its simulation, of every device's whole model, would then take
   * the time of the expert plans, which come first. */
  SimMegatronOptions whole = { .tp = 1, .pp = 1, .dp = p->n_devices };
  gboolean dp_last = search_megatron_cannot_fit(p, &whole);
  g_autoptr(SimStrategy) dp = dp_last ? NULL : measure_data_parallel(p, deadline_us, y);
  /* The expert plans, unless the algorithm simulated them all already; else as the
   * expert algorithm simulates them, on the search's threads, until the deadline or a
   * signal: the yardstick is then the best plan simulated so far, and says so. */
  if (!known && y->expert_plans == 0 && search_signals_seen() == 0) {
    SearchRunOptions yo = *o;
    yo.time_budget = 0;
    yo.eval_budget = G_MAXINT64 / 2;
    yo.log_path = NULL;
    yo.options = NULL;
    yo.deadline_us = deadline_us;
    if (o->progress)
      g_printerr("parasol search: simulating the expert plans for the yardstick\n");
    m->expert_run = search_run(search_lookup("expert"), p, &yo, NULL);
    if (m->expert_run) {
      known = search_result_get_expert(m->expert_run, &known_time);
      y->expert_simulated = search_result_get_expert_progress(m->expert_run, &y->expert_plans);
      if (!known) {
        known = search_result_get_expert_best(m->expert_run, &known_time);
        cut = TRUE;
      }
    }
  }
  if (dp_last)
    dp = measure_data_parallel(p, deadline_us, y);
  y->data_parallel_bound = dp_last;
  if (!known && y->expert_plans == 0)
    cut = TRUE;
  y->expert_complete = !cut;
  const SimStrategy *expert = known;
  if (known)
    y->expert = known_time;
  if (y->data_parallel_fits && y->data_parallel < y->expert) {
    expert = dp;
    y->expert = y->data_parallel;
    y->expert_is_dp = TRUE;
  }
  /* The plan kept is the fastest one known: a budget too short for the search to reach
   * the yardstick would otherwise leave a plan slower than one simulated here. */
  if (give_way && expert && y->expert < y->search_time) {
    m->kept = sim_strategy_copy(expert);
    y->kept = y->expert_is_dp ? "data-parallel" : "expert";
  }
  return y;
}

const SearchYardsticks *search_result_get_yardsticks(const SearchResult *r)
{
  g_return_val_if_fail(r != NULL, NULL);
  SearchMeasure *m = *search_result_measure_slot((SearchResult *)r);
  return m ? &m->y : NULL;
}

const SimStrategy *search_result_get_kept(const SearchResult *r, const SearchProblem **problem,
                                          double *time)
{
  g_return_val_if_fail(r != NULL, NULL);
  SearchMeasure *m = *search_result_measure_slot((SearchResult *)r);
  if (m && m->kept) {
    /* A yardstick is a plan for the problem as posed, without the search's rewrites. */
    if (problem)
      *problem = m->problem;
    if (time)
      *time = m->y.expert;
    return m->kept;
  }
  if (problem)
    *problem = search_result_get_problem(r);
  if (time)
    *time = search_result_get_time(r);
  return search_result_get_strategy(r);
}
