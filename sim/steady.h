/* steady.h — the steady state of pipeline schedules (steady.c): a few micro-batches
 * simulated, checked to repeat each other exactly, the rest added as whole periods.
 * Internal to libsim. */
#pragma once

#include "report.h"

G_BEGIN_DECLS

typedef struct {
  int count;      /* micro-batches simulated                                           */
  int period_mbs; /* micro-batches in one period of the schedule                       */
  int first;      /* the first micro-batch of the periods compared                     */
  int total;      /* the strategy's micro-batches                                      */
} SimSteady;

/* Whether @s's schedule may be simulated over fewer micro-batches and extrapolated, and
 * how: FALSE where it may not (switched off, a kept timeline, GPipe, too few
 * micro-batches to gain). */
gboolean sim_steady_plan(const SimStrategy *s, const SimOptions *o, SimSteady *out);
/* The plan to try after @st's run did not repeat itself: the periods compared start later
 * (see steady.c).  FALSE where none is left. */
gboolean sim_steady_plan_later(const SimStrategy *s, const SimOptions *o, SimSteady *st);
/* TRUE, with the time one period takes, where the run of st->count micro-batches repeats
 * itself exactly from one period to the next in its middle. */
gboolean sim_steady_period(const SimTaskGraph *tg, const SimTimeline *tl, const SimSteady *st,
                           double *period);
/* The iteration time of all st->total micro-batches from a run of st->count. */
double sim_steady_time(const SimSteady *st, double makespan, double period);

/* Turns @r, the report of a run of st->count micro-batches, into the report of all of
 * them, given @r2, the report of a run of st->count + st->period_mbs, and both runs' link
 * bytes: the iteration time is @time, and every time and byte count that adds up over the
 * run grows by what one period added. */
void sim_report_extrapolate(SimReport *r, const SimReport *r2, const double *link_bytes,
                            const double *link_bytes2, const SimSteady *st, double time,
                            double period);

G_END_DECLS
