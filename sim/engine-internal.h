/* engine-internal.h — the engine's state and events, shared by its two files: engine.c
 * (tasks, streams, the host, the event loop) and engine-groups.c (groups of flows run as a
 * whole).  Nothing else includes it. */
#pragma once

#include "engine.h"
#include "taskgraph.h"
#include "collective.h"
#include "network.h"
#include "base.h"
#include "heap.h"

#include <math.h>
#include <string.h>

G_BEGIN_DECLS

typedef enum { EV_END, EV_FLOW_START, EV_FLOW_END, EV_GROUP_END } EventType;

/* How a group of flows that starts together runs on links no other flow uses: per member,
 * its start and end after the group's release, and the rate changes in between (time,
 * bytes left, rate), all relative to the release.  It depends only on the flows, so one
 * schedule serves every run of an identical group (and every later run of the engine). */
typedef struct {
  int n;
  double *s, *e;        /* n */
  double last;          /* the latest end */
  int *h_off;           /* n + 1: each member's rate changes in h */
  double *h;            /* triples (time, remaining, rate) */
  int n_ul;             /* the links the members cross, each once, */
  int *ul;
  double *ul_bytes;     /* ... and the bytes they carry over each */
} GroupSched;

/* A group running as a whole (kept by its head's id): released at t0, it holds its links
 * until t0 + sched->last unless another flow needs one of them first. */
typedef struct {
  double t0;
  const GroupSched *sched;
} GroupRun;

/* Events live in the heap by value.  A flow whose rate changes gets a new end event and a
 * new version; the old event stays in the heap and is dropped when it comes out (lazy
 * deletion), which keeps the heap a plain array of values.  Times are never negative, so
 * their bit patterns order as the times do: the heap compares integers. */
typedef struct {
  uint64_t tkey;     /* the bits of the time */
  uint64_t seq;
  int32_t task;
  int32_t type;
  uint32_t version;
  uint32_t pad;
} Event;

/* A flow's end, kept by its slot in the network while it runs.  A rate change that moves
 * the end later pushes nothing: the event already queued, earlier, comes out first and
 * is put back at the end then in force, with the sequence number the change drew.  So
 * the heap holds one event per flow where it held one per rate change (a million in the
 * reduce-scatters and all-gathers of ZeRO-1 over 64 replicas), and the events that count
 * come out in the order they did. */
typedef struct {
  int32_t task;      /* the flow whose event is queued, */
  uint32_t version;  /* ... under this version (stale otherwise) */
  uint64_t queued;   /* the key of the queued event */
  uint64_t tkey;     /* the end in force and its sequence number */
  uint64_t seq;
} FlowEnd;

static inline uint64_t time_key(double t)
{
  uint64_t k;
  t += 0.0; /* -0 becomes +0 */
  memcpy(&k, &t, sizeof k);
  return k;
}

static inline double key_time(uint64_t k)
{
  double t;
  memcpy(&t, &k, sizeof t);
  return t;
}

struct _SimEngine {
  const SimMachine *machine;
  SimNet *net;
  Event *heap;
  int n_heap, cap_heap;
  uint64_t seq;
  /* per-task state, sized for the last graph */
  int cap_tasks;
  int32_t *preds_left;
  int32_t *flow_slot;
  uint32_t *flow_ver;     /* the version of a flow's live end event; 0: none */
  FlowEnd *flow_end;      /* per network slot (see FlowEnd) */
  int cap_flow_end;
  const SimRoute **flow_route;
  double *ready_time;
  uint8_t *ready;
  double *sync_time;      /* the latest end of a transfer the host waits for, per task */
  double host_kernel;     /* the host's time to issue one kernel                       */
  double host_step;       /* ... and to move on to the next step of the schedule        */
  double bound;           /* stop past this time (sim_engine_set_bound)                 */
  const atomic_int *cancel; /* stop, cut with an infinite makespan, once nonzero (SimOptions) */
  gboolean stop_overflow; /* stop once a device is over its memory (set_stop_at_overflow) */
  gboolean overflow;      /* ... and one is                                               */
  double overflow_at;     /* ... or will be then, inside a merged run of tasks            */
  double *left;           /* with a bound, per device: compute its stream has not started */
  double floor;           /* with a bound: the iteration ends no sooner (0: unknown)      */
  gboolean blocking_sends; /* the host waits for its sends to other stages (see below)  */
  int32_t *sends;         /* per device: blocking sends under way                       */
  uint8_t *send_counted;  /* per task: a send counted in `sends`                        */
  int32_t *host_unit;     /* per device: the step its host issued last (see step_of)    */
  double *host;           /* per device: when its host has issued the last task         */
  /* per-device state */
  int n_devices;
  int32_t *stream_pos;
  int32_t *stream_prev;   /* the last compute task the stream ran */
  uint8_t *busy;
  int64_t *mem;
  /* the graph being run and its output */
  const SimTaskGraph *tg;
  SimTimeline *tl;
  double now;
  int n_done;
  SimIntStack work;       /* tasks that completed at `now`, whose successors are pending */
  /* Groups of flows run as a whole (see GroupSched): */
  gboolean groups;        /* on unless PARASOL_NO_FLOW_GROUPS is set (for comparisons)  */
  GHashTable *scheds;     /* GBytes key -> GroupSched*, kept across runs                */
  size_t sched_bytes;     /* what they take, roughly: a long search sees many groups     */
  GHashTable *running;    /* head -> GroupRun*                                          */
  int32_t *held_by;       /* per link: the head of the group holding it, or -1          */
  int n_links;
  SimNet *scratch;        /* where a group's schedule is worked out alone               */
  int32_t *link_mark;     /* per link, scratch for group_schedule(); -1 between uses     */
  GArray *key;            /* uint8 scratch for keys                                     */
};

/* ---- heap ---- */

static inline gboolean ev_less(const Event *a, const Event *b)
{
  /* One comparison of 128 bits, (time, sequence number): no branch to mispredict in the
   * heap's choice among four children. */
  unsigned __int128 x = (unsigned __int128)a->tkey << 64 | a->seq;
  unsigned __int128 y = (unsigned __int128)b->tkey << 64 | b->seq;
  return x < y;
}

SIM_HEAP_DEFINE(event_heap, Event, ev_less)

static inline void push_event(SimEngine *e, uint64_t tkey, uint64_t seq, int task, EventType type,
                       uint32_t version)
{
  Event ev = { tkey, seq, task, type, version, 0 };
  event_heap_push(&e->heap, &e->n_heap, &e->cap_heap, ev);
}

static inline void schedule_v(SimEngine *e, double time, int task, EventType type, uint32_t version)
{
  uint64_t seq = e->seq++;
  push_event(e, time_key(time), seq, task, type, version);
}

static inline void schedule(SimEngine *e, double time, int task, EventType type)
{
  schedule_v(e, time, task, type, 0);
}

/* The machine reads routes it has worked out once without taking its lock. */
static inline const SimRoute *route_of(SimEngine *e, int src, int dst)
{
  return sim_machine_route_info(e->machine, src, dst);
}

/* engine.c: a task's successors become ready (or the group it heads starts); the tasks
 * that completed at `now` release theirs. */
void sim_engine_release_successors(SimEngine *e, int32_t t);
void sim_engine_drain_work(SimEngine *e);
void sim_engine_group_sched_free(gpointer p);

/* engine-groups.c: starts the flows @head releases as one group, if no other flow uses
 * their links (FALSE: they start one by one); frees held links by expanding the groups
 * holding them; ends a group that ran undisturbed. */
gboolean sim_engine_start_group(SimEngine *e, int32_t head);
void sim_engine_expand_holders(SimEngine *e, const int *links, int n_links);
void sim_engine_end_group(SimEngine *e, int32_t head);

G_END_DECLS
