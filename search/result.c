/* result.c — what a search leaves: its best strategy and time, the expert yardstick, the
 * evaluations, the log of improvements and the prediction of its own cost model
 * (parasol-search.h).  driver.c fills a result when a search ends. */
#include "search-private.h"

int search_result_get_expert_progress(const SearchResult *r, int *plans)
{
  g_return_val_if_fail(r != NULL, 0);
  if (plans)
    *plans = r->expert_plans;
  return r->expert_simulated;
}

const SimStrategy *search_result_get_expert(const SearchResult *r, double *time)
{
  g_return_val_if_fail(r != NULL, NULL);
  if (time)
    *time = r->expert ? r->expert_time : INFINITY;
  return r->expert;
}

const SimStrategy *search_result_get_expert_best(const SearchResult *r, double *time)
{
  g_return_val_if_fail(r != NULL, NULL);
  if (r->expert)
    return search_result_get_expert(r, time);
  if (time)
    *time = r->partial_expert ? r->partial_time : INFINITY;
  return r->partial_expert;
}

void search_result_free(SearchResult *r)
{
  if (!r)
    return;
  search_problem_unref(r->problem);
  sim_strategy_free(r->best);
  sim_strategy_free(r->expert);
  sim_strategy_free(r->partial_expert);
  g_array_unref(r->improvements);
  g_free(r->log_error);
  search_measure_free(r->measure);
  g_free(r);
}

SearchMeasure **search_result_measure_slot(SearchResult *r)
{
  return &r->measure;
}

const char *search_result_get_log_error(const SearchResult *r)
{
  g_return_val_if_fail(r != NULL, NULL);
  return r->log_error;
}

const SimStrategy *search_result_get_strategy(const SearchResult *r)
{
  g_return_val_if_fail(r != NULL, NULL);
  return r->best;
}

double search_result_get_time(const SearchResult *r)
{
  g_return_val_if_fail(r != NULL, INFINITY);
  return r->time;
}

const SimGraph *search_result_get_graph(const SearchResult *r)
{
  g_return_val_if_fail(r != NULL, NULL);
  return r->problem->g;
}

const SearchProblem *search_result_get_problem(const SearchResult *r)
{
  g_return_val_if_fail(r != NULL, NULL);
  return r->problem;
}

gint64 search_result_get_evals(const SearchResult *r)
{
  g_return_val_if_fail(r != NULL, 0);
  return r->evals;
}

gint64 search_result_get_cut_evals(const SearchResult *r)
{
  g_return_val_if_fail(r != NULL, 0);
  return r->cut_evals;
}

double search_result_get_elapsed(const SearchResult *r)
{
  g_return_val_if_fail(r != NULL, 0);
  return r->elapsed;
}

gboolean search_result_get_interrupted(const SearchResult *r)
{
  g_return_val_if_fail(r != NULL, FALSE);
  return r->interrupted;
}

gboolean search_result_get_abandoned(const SearchResult *r)
{
  g_return_val_if_fail(r != NULL, FALSE);
  return r->abandoned;
}

int search_result_n_improvements(const SearchResult *r)
{
  g_return_val_if_fail(r != NULL, 0);
  return (int)r->improvements->len;
}

void search_result_get_improvement(const SearchResult *r, int i, double *wall, gint64 *evals,
                                   double *best)
{
  g_return_if_fail(r != NULL && i >= 0 && i < (int)r->improvements->len);
  const SearchImprovement *imp = &g_array_index(r->improvements, SearchImprovement, i);
  if (wall)
    *wall = imp->wall;
  if (evals)
    *evals = imp->evals;
  if (best)
    *best = imp->best;
}

double search_result_time_to(const SearchResult *r, double fraction, gint64 *evals)
{
  g_return_val_if_fail(r != NULL && fraction > 0 && fraction <= 1, NAN);
  if (evals)
    *evals = 0;
  if (!isfinite(r->time))
    return NAN;
  for (guint i = 0; i < r->improvements->len; i++) {
    const SearchImprovement *imp = &g_array_index(r->improvements, SearchImprovement, i);
    if (imp->best * fraction <= r->time) {
      if (evals)
        *evals = imp->evals;
      return imp->wall;
    }
  }
  return NAN;
}

gboolean search_result_get_prediction(const SearchResult *r, double *predicted,
                                      double *simulated)
{
  if (predicted)
    *predicted = r->predicted;
  if (simulated)
    *simulated = r->predicted_simulated;
  return !isnan(r->predicted);
}
