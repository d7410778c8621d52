/* engine.h — the engine (engine.c), which times an assembled task graph, and the task
 * graph and timeline a delta session keeps (delta.c).  Internal to libsim. */
#pragma once

#include "collective.h"
#include "base.h"

G_BEGIN_DECLS

typedef struct {
  double *start;       /* per task, seconds; -1 if it never ran                       */
  double *end;
  int32_t *crit;       /* the task whose end let this one start, or -1                 */
  double makespan;
  int64_t *peak_mem;   /* per device                                                  */
  double *link_bytes;  /* per link                                                    */
  int n_tasks_run;
  gboolean deadlock;   /* some tasks never became ready (a cycle or a bad stream order) */
  gboolean cut;        /* stopped at the bound (sim_engine_set_bound()): the iteration
                        * takes longer than makespan, which is a lower bound        */
  size_t cap;          /* the tasks start, end and crit have room for (engine-owned)   */
} SimTimeline;

typedef struct _SimEngine SimEngine;

/* Transfers run at the links' capacity under @cp (NULL: their full bandwidth). */
SimEngine *sim_engine_new(const SimMachine *m, const SimCollParams *cp);
/* The host's time to issue one kernel (SimOptions.host_kernel_time); 0 by default. */
void sim_engine_set_host_kernel_time(SimEngine *e, double seconds);
/* The host's time between two steps of a device's schedule (SimOptions.host_step_time):
 * a step is one micro-batch's forward, or its backward with the recomputation it needs,
 * or the optimizer update. */
void sim_engine_set_host_step_time(SimEngine *e, double seconds);
/* SimOptions.blocking_sends. */
void sim_engine_set_blocking_sends(SimEngine *e, gboolean on);
/* The engine's network remembers the rates it works out across runs, in at most @bytes
 * (sim_net_set_memory): what a delta session's engine does. */
void sim_engine_remember_rates(SimEngine *e, size_t bytes);
/* Both host times from @o (the simulations' way to set them). */
void sim_engine_set_host_times(SimEngine *e, const SimOptions *o);
void sim_engine_free(SimEngine *e);
/* Runs the assembled task graph from time 0 and fills @tl (whose arrays it allocates,
 * sized for the graph, or reuses from the timeline's last run when they are large
 * enough).  Deterministic: equal-time events run in the order they were
 * scheduled. */
void sim_engine_run(SimEngine *e, const SimTaskGraph *tg, SimTimeline *tl);
/* Runs stop once the iteration is known to end past @seconds (INFINITY, the default:
 * never): the next event lies beyond it, or a device's stream still has more compute to
 * run than time is left.  The timeline is then cut, its makespan a lower bound of the
 * iteration's, above @seconds.
 * A search that only needs to know whether a candidate beats a threshold saves the rest
 * of the run; up to the bound, the run is the unbounded one. */
void sim_engine_set_bound(SimEngine *e, double seconds);
/* Whether a run stops, cut, at the first task that takes a device past its memory
 * capacity (or at the start, when its static memory already does). */
void sim_engine_set_stop_at_overflow(SimEngine *e, gboolean on);
void sim_timeline_clear(SimTimeline *tl);

/* The task graph and timeline of a session's last run (delta.c), for tests. */
const SimTaskGraph *sim_session_taskgraph(SimSession *ss);
const SimTimeline *sim_session_timeline(SimSession *ss);

G_END_DECLS
