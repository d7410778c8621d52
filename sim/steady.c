/* The steady state of a pipeline schedule (docs/scale.md).
 *
 * Once a 1F1B schedule (or its interleaved form) has filled its pipeline, every
 * micro-batch repeats what the one before did, a period later; only the warm-up at the
 * start and the cool-down at the end (with the gradient synchronization and the optimizer
 * step) differ.  The engine is deterministic, so when a run's state repeats from one
 * micro-batch to the next, a run with more micro-batches is that run with whole periods
 * inserted: its iteration ends the extra periods later and each extra period adds the
 * same compute, communication and link traffic.
 *
 * sim_steady_plan() decides how many micro-batches to simulate instead of all of them;
 * sim_steady_period() checks, on the finished run, that the micro-batches in the middle
 * of the schedule are exact copies of each other shifted in time (every task of the
 * second like its counterpart in the first: same kind, class, devices, operator, shard,
 * bytes and duration, starting and ending one period later) and measures the period.
 * Where the check fails, the caller simulates every micro-batch. */
#include "steady.h"

#include <limits.h>
#include <math.h>

/* The plan whose compared periods start at micro-batch @settle after the warm-up. */
static gboolean plan_at(const SimStrategy *s, const SimOptions *o, int settle, SimSteady *out)
{
  memset(out, 0, sizeof *out);
  int m = s->microbatches > 0 ? s->microbatches : 1;
  /* A kept timeline shows every task; GPipe holds every micro-batch's activations at
   * once, so its peak memory grows with their number. */
  if (!o->steady_state || o->keep_timeline || s->schedule == SIM_SCHEDULE_GPIPE)
    return FALSE;
  int S = s->n_stages > 0 ? s->n_stages : 1;
  int V = sim_strategy_chunks_per_group(s);
  if (V < 1)
    V = 1;
  int P = S / V > 0 ? S / V : 1;
  /* An interleaved schedule runs its micro-batches in groups of one per stage: its
   * period is a group. */
  int q = V > 1 ? P : 1;
  /* The warm-up fills the pipeline with P micro-batches (the first stage's forwards
   * before its first backward); the runs then settle over a few more. */
  int first = ((P * V + MIN(settle, P * V) + q - 1) / q) * q;
  /* Three periods are compared (the first two with the next two); after them the
   * cool-down drains the P micro-batches still in the pipeline. */
  int count = first + 3 * q + P * V;
  if (count % q)
    count += q - count % q;
  /* Only worth it where it leaves at least two periods out, and exact only where the
   * left-out periods are whole. */
  if (m < count + 2 * q || (m - count) % q != 0)
    return FALSE;
  out->count = count;
  out->period_mbs = q;
  out->first = first;
  out->total = m;
  return TRUE;
}

/* Every run of Megatron-LM's weak-scaling table that repeats itself does so within 8
 * micro-batches of its warm-up (GPT-3 175B on 1,024 A100 with 16 stages from the 22nd
 * micro-batch, P + 6; the others sooner): the periods compared start there first.  Where
 * that run does not repeat itself, they start after twice the warm-up (the whole warm-up
 * again to settle), and only then is every micro-batch simulated. */
#define SETTLE_FIRST 8

gboolean sim_steady_plan(const SimStrategy *s, const SimOptions *o, SimSteady *out)
{
  return plan_at(s, o, SETTLE_FIRST, out);
}

gboolean sim_steady_plan_later(const SimStrategy *s, const SimOptions *o, SimSteady *st)
{
  SimSteady later;
  if (!plan_at(s, o, INT_MAX / 4, &later) || later.first <= st->first)
    return FALSE;
  *st = later;
  return TRUE;
}

/* The tasks of micro-batches [first, first + n) that ran, in the task graph's order, as n
 * lists. */
static GArray **tasks_by_mb(const SimTaskGraph *tg, const SimTimeline *tl, int first, int n)
{
  GArray **by = g_new(GArray *, n);
  for (int i = 0; i < n; i++)
    by[i] = g_array_new(FALSE, FALSE, sizeof(int32_t));
  for (int32_t t = 0; t < tg->n_tasks; t++) {
    const SimTask *k = &tg->task[t];
    if (k->mb < first || k->mb >= first + n || tl->start[t] < 0)
      continue;
    if (k->kind == SIM_TASK_NOP)
      continue;
    g_array_append_val(by[k->mb - first], t);
  }
  return by;
}

static gboolean same_task(const SimTaskGraph *tg, int32_t a, int32_t b)
{
  const SimTask *x = &tg->task[a], *y = &tg->task[b];
  if (x->kind != y->kind || x->cls != y->cls || x->device != y->device || x->op != y->op ||
      x->shard != y->shard || x->duration != y->duration)
    return FALSE;
  if (x->kind == SIM_TASK_FLOW)
    return x->peer == y->peer && x->bytes == y->bytes && x->n_links == y->n_links &&
           x->n_members == y->n_members;
  if (x->kind == SIM_TASK_COMPUTE)
    return x->mem_alloc == y->mem_alloc && x->mem_free == y->mem_free &&
           (x->peer < 0) == (y->peer < 0);
  return TRUE;
}

gboolean sim_steady_period(const SimTaskGraph *tg, const SimTimeline *tl, const SimSteady *st,
                           double *period)
{
  int q = st->period_mbs, n = 3 * q;
  if (tl->cut || tl->deadlock || st->first + n > st->count)
    return FALSE;
  GArray **by = tasks_by_mb(tg, tl, st->first, n);
  gboolean ok = TRUE;
  double delta = NAN;
  /* Times within this much of each other are the same: sums of the same durations taken
   * from other starting points round differently, by a few units in the last place of
   * the iteration's time. */
  double tol = 1e-12 * tl->makespan;
  for (int i = 0; i < 2 * q && ok; i++) {
    const GArray *a = by[i], *b = by[i + q];
    if (a->len != b->len || a->len == 0) {
      g_debug("steady state: micro-batch %d has %u tasks, %d has %u", st->first + i, a->len,
              st->first + i + q, b->len);
      ok = FALSE;
      break;
    }
    for (guint k = 0; k < a->len && ok; k++) {
      int32_t x = g_array_index(a, int32_t, k), y = g_array_index(b, int32_t, k);
      if (!same_task(tg, x, y)) {
        g_debug("steady state: task %u of micro-batch %d differs from its counterpart", k,
                st->first + i);
        ok = FALSE;
        break;
      }
      double ds = tl->start[y] - tl->start[x], de = tl->end[y] - tl->end[x];
      if (isnan(delta))
        delta = ds;
      if (fabs(ds - delta) > tol || fabs(de - delta) > tol) {
        g_debug("steady state: task %u of micro-batch %d (device %d) shifts by %.17g, the "
                "period is %.17g", k, st->first + i, tg->task[x].device, ds, delta);
        ok = FALSE;
      }
    }
  }
  for (int i = 0; i < n; i++)
    g_array_free(by[i], TRUE);
  g_free(by);
  if (!ok || !(delta > 0))
    return FALSE;
  *period = delta;
  return TRUE;
}

double sim_steady_time(const SimSteady *st, double makespan, double period)
{
  double periods = (double)((st->total - st->count) / st->period_mbs);
  return makespan + periods * period;
}
