/* engine.c — the discrete-event engine that times an assembled task graph.
 *
 * Events sit in a min-heap ordered by (time, sequence number), so events due at the same
 * time run in the order they were scheduled and every run is reproducible (libuv's timer
 * heap); it has four children a node rather than two, which halves its depth.  A flow whose rate changes gets a new end event; the old one is
 * dropped when it surfaces.
 *
 * Resources: one compute stream per device runs its compute tasks one at a time, in the
 * stream order the lowering chose (a CUDA stream runs kernels in issue order); flows move
 * bytes over links shared by max-min fairness (network.c) and start after their route's
 * latency; delays wait without holding anything.  The host issues each device's kernels
 * in stream order (SimOptions.host_kernel_time a kernel, host_step_time between steps of
 * the schedule) and may bound when they start; with blocking sends, a device's host (and
 * so its stream) waits for the transfers it sends to other devices to end, as Megatron's
 * pipeline exchanges make it.  The network is re-solved only once all
 * events due at one instant have run, so flows that end together cost one solve.
 *
 * Groups: the flows a join point releases together towards one task (a phase of a
 * collective) run as a whole while no other flow uses their links: one end event instead
 * of two per flow, timed by a schedule worked out alone once and kept (GroupSched).  A
 * flow that needs a held link turns the group back into single flows at that instant, each
 * with the bytes it has left.  PARASOL_NO_FLOW_GROUPS set in the environment turns groups
 * off (the tests compare both ways).
 *
 * Bounds (sim_engine_set_bound()): a search that only asks whether a candidate beats a
 * cost stops the run once the iteration is known to end later: the next event lies past
 * the bound, or some stream still holds more compute than time is left before it.  Up to
 * that moment the run is the unbounded one. */
#include "engine.h"
#include "taskgraph.h"
#include "collective.h"
#include "network.h"
#include "base.h"
#include "heap.h"

#include <math.h>
#include <string.h>

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
  SimMachine *machine;
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

static void push_event(SimEngine *e, uint64_t tkey, uint64_t seq, int task, EventType type,
                       uint32_t version)
{
  Event ev = { tkey, seq, task, type, version, 0 };
  event_heap_push(&e->heap, &e->n_heap, &e->cap_heap, ev);
}

static void schedule_v(SimEngine *e, double time, int task, EventType type, uint32_t version)
{
  uint64_t seq = e->seq++;
  push_event(e, time_key(time), seq, task, type, version);
}

static inline void schedule(SimEngine *e, double time, int task, EventType type)
{
  schedule_v(e, time, task, type, 0);
}

static Event heap_pop(SimEngine *e)
{
  return event_heap_pop(e->heap, &e->n_heap);
}

/* ---- tasks ---- */

static void group_sched_free(gpointer p)
{
  GroupSched *gs = p;
  g_free(gs->s);
  g_free(gs->e);
  g_free(gs->h_off);
  g_free(gs->h);
  g_free(gs->ul);
  g_free(gs->ul_bytes);
  g_free(gs);
}

SimEngine *sim_engine_new(SimMachine *m, const SimCollParams *cp)
{
  SimEngine *e = g_new0(SimEngine, 1);
  e->machine = m;
  e->net = sim_net_new(m, cp);
  e->n_devices = sim_machine_n_devices(m);
  e->stream_pos = g_new0(int32_t, e->n_devices);
  e->stream_prev = g_new0(int32_t, e->n_devices);
  e->busy = g_new0(uint8_t, e->n_devices);
  e->mem = g_new0(int64_t, e->n_devices);
  e->host = g_new0(double, e->n_devices);
  e->host_unit = g_new0(int32_t, e->n_devices);
  e->sends = g_new0(int32_t, e->n_devices);
  e->bound = INFINITY;
  e->groups = g_getenv("PARASOL_NO_FLOW_GROUPS") == NULL;
  e->scheds = g_hash_table_new_full(sim_bytes_hash, g_bytes_equal, (GDestroyNotify)g_bytes_unref,
                                    group_sched_free);
  e->running = g_hash_table_new_full(g_direct_hash, g_direct_equal, NULL, g_free);
  e->n_links = sim_machine_n_links(m);
  e->held_by = g_new(int32_t, MAX(e->n_links, 1));
  e->link_mark = g_new(int32_t, MAX(e->n_links, 1));
  for (int l = 0; l < e->n_links; l++)
    e->link_mark[l] = -1;
  e->scratch = sim_net_new(m, cp);
  e->key = g_array_new(FALSE, FALSE, 1);
  return e;
}

void sim_engine_free(SimEngine *e)
{
  if (!e)
    return;
  sim_net_free(e->net);
  g_free(e->heap);
  g_free(e->preds_left);
  g_free(e->flow_slot);
  g_free(e->flow_ver);
  g_free(e->flow_end);
  g_free(e->flow_route);
  g_free(e->ready_time);
  g_free(e->sync_time);
  g_free(e->host);
  g_free(e->host_unit);
  g_free(e->sends);
  g_free(e->send_counted);
  g_free(e->left);
  g_free(e->ready);
  g_free(e->stream_pos);
  g_free(e->stream_prev);
  g_free(e->busy);
  g_free(e->mem);
  g_free(e->work.v);
  g_hash_table_destroy(e->scheds);
  g_hash_table_destroy(e->running);
  g_free(e->held_by);
  g_free(e->link_mark);
  sim_net_free(e->scratch);
  g_array_free(e->key, TRUE);
  g_free(e);
}

void sim_engine_set_host_kernel_time(SimEngine *e, double seconds)
{
  e->host_kernel = seconds > 0 ? seconds : 0;
}

void sim_engine_set_host_step_time(SimEngine *e, double seconds)
{
  e->host_step = seconds > 0 ? seconds : 0;
}

void sim_engine_set_bound(SimEngine *e, double seconds)
{
  e->bound = seconds;
}

void sim_engine_set_stop_at_overflow(SimEngine *e, gboolean on)
{
  e->stop_overflow = on;
}

/* Whether device @d holds more than its memory. */
static inline gboolean over_capacity(const SimEngine *e, int d)
{
  int64_t cap = sim_machine_device_spec(e->machine, d)->mem_capacity;
  return cap > 0 && e->mem[d] > cap;
}

void sim_engine_remember_rates(SimEngine *e, size_t bytes)
{
  sim_net_set_memory(e->net, bytes);
}

void sim_engine_set_blocking_sends(SimEngine *e, gboolean on)
{
  e->blocking_sends = on;
}

void sim_engine_set_host_times(SimEngine *e, const SimOptions *o)
{
  sim_engine_set_host_kernel_time(e, o->host_kernel_time);
  sim_engine_set_host_step_time(e, o->host_step_time);
  sim_engine_set_blocking_sends(e, o->blocking_sends);
  e->cancel = o->cancel;
}

/* The step of the schedule a compute task belongs to: its micro-batch's forward, its
 * micro-batch's backward (with the recomputation the backward needs), or the update. */
static inline int32_t step_of(const SimTask *t)
{
  if (t->cls == SIM_CLASS_FORWARD)
    return 2 * t->mb;
  if (t->cls == SIM_CLASS_BACKWARD || t->cls == SIM_CLASS_RECOMPUTE)
    return 2 * t->mb + 1;
  return -2; /* the update, and anything outside the micro-batches */
}

void sim_timeline_clear(SimTimeline *tl)
{
  g_clear_pointer(&tl->start, g_free);
  g_clear_pointer(&tl->end, g_free);
  g_clear_pointer(&tl->crit, g_free);
  g_clear_pointer(&tl->peak_mem, g_free);
  g_clear_pointer(&tl->link_bytes, g_free);
  tl->cap = 0;
  tl->makespan = 0;
  tl->n_tasks_run = 0;
  tl->deadlock = FALSE;
  tl->cut = FALSE;
}

static void try_stream(SimEngine *e, int d);

/* The machine reads routes it has worked out once without taking its lock. */
static inline const SimRoute *route_of(SimEngine *e, int src, int dst)
{
  return sim_machine_route_info(e->machine, src, dst);
}

static void start_compute(SimEngine *e, int32_t t)
{
  const SimTask *task = &e->tg->task[t];
  int d = task->device;
  SimTimeline *tl = e->tl;
  /* The host issues the device's kernels in stream order, running ahead of the device,
   * but it waits for the transfers from other pipeline stages (Megatron synchronizes
   * after its point-to-point exchanges); the task runs once issued. */
  double start = e->now;
  if (e->host_kernel > 0 || e->host_step > 0) {
    double issued = MAX(e->host[d], e->sync_time[t]) + task->n_kernels * e->host_kernel;
    int32_t step = step_of(task);
    if (step != e->host_unit[d]) {
      issued += e->host_step;
      e->host_unit[d] = step;
    }
    e->host[d] = issued;
    start = MAX(start, issued);
  }
  tl->start[t] = start;
  /* The stream was the last thing this task waited for when it became ready earlier. */
  if (e->ready_time[t] < e->now && e->stream_prev[d] >= 0)
    tl->crit[t] = e->stream_prev[d];
  e->busy[d] = 1;
  if (e->left) {
    /* The stream runs its tasks one after the other, each for its duration. */
    e->left[d] -= task->duration;
    e->floor = MAX(e->floor, start + task->duration + e->left[d]);
  }
  if (e->stop_overflow && task->peer >= 0 && e->tg->chain) {
    /* A merged run goes over memory where its unmerged task would start. */
    int64_t cap = sim_machine_device_spec(e->machine, d)->mem_capacity, m = e->mem[d];
    const double *dur = &e->tg->chain_dur[task->peer];
    double at = start;
    for (const SimChainStep *st = &e->tg->chain[task->peer]; cap > 0; st++, dur++) {
      m += st->mem_alloc;
      if (m > cap && m > tl->peak_mem[d]) {
        if (st->offset > 0)
          e->overflow_at = MIN(e->overflow_at, at);
        else
          e->overflow = TRUE;
        break;
      }
      m -= st->mem_free;
      at += fabs(*dur);
      if (st->last)
        break;
    }
  }
  e->mem[d] += task->mem_alloc;
  if (e->mem[d] > tl->peak_mem[d]) {
    tl->peak_mem[d] = e->mem[d];
    if (e->stop_overflow && over_capacity(e, d) && !(task->peer >= 0 && e->tg->chain))
      e->overflow = TRUE;
  }
  double end = start + task->duration;
  if (task->peer >= 0 && e->tg->chain_dur) {
    /* A merged run ends where its tasks would, each starting as the one before ends. */
    end = start;
    for (const double *p = &e->tg->chain_dur[task->peer];; p++) {
      end += fabs(*p);
      if (signbit(*p))
        break;
    }
  }
  schedule(e, end, t, EV_END);
}

static void try_stream(SimEngine *e, int d)
{
  if (e->busy[d] || e->sends[d] > 0)
    return;
  int32_t pos = e->stream_pos[d];
  if (pos >= e->tg->stream_off[d + 1])
    return;
  int32_t t = e->tg->stream[pos];
  if (e->ready[t])
    start_compute(e, t);
}

/* Task @t has all its inputs at `now`; @why is the predecessor that ended last. */
static void make_ready(SimEngine *e, int32_t t, int32_t why)
{
  const SimTask *task = &e->tg->task[t];
  SimTimeline *tl = e->tl;
  tl->crit[t] = why;
  e->ready_time[t] = e->now;
  switch (task->kind) {
  case SIM_TASK_COMPUTE:
    e->ready[t] = 1;
    try_stream(e, task->device);
    break;
  case SIM_TASK_DELAY:
    tl->start[t] = e->now;
    schedule(e, e->now + task->duration, t, EV_END);
    break;
  case SIM_TASK_NOP:
    tl->start[t] = e->now;
    tl->end[t] = e->now;
    e->n_done++;
    sim_int_stack_push(&e->work, t);
    break;
  case SIM_TASK_FLOW:
    tl->start[t] = e->now;
    if (task->n_links) {
      /* A whole collective: its latency is all in its duration. */
      schedule(e, e->now + task->duration, t, EV_FLOW_START);
    } else if (task->device == task->peer || task->bytes <= 0) {
      tl->end[t] = e->now;
      e->n_done++;
      sim_int_stack_push(&e->work, t);
    } else {
      /* A flow's duration is protocol latency paid on top of its route's. */
      const SimRoute *r = route_of(e, task->device, task->peer);
      e->flow_route[t] = r;
      schedule(e, e->now + r->latency + task->duration, t, EV_FLOW_START);
    }
    break;
  }
}

static gboolean start_group(SimEngine *e, int32_t head);

static void release_successors(SimEngine *e, int32_t t)
{
  if (e->groups && e->tg->group_head[t] && start_group(e, t))
    return;
  const SimTask *task = &e->tg->task[t];
  const int32_t *succ = e->tg->succ + task->succ_off;
  gboolean p2p = task->kind == SIM_TASK_FLOW && task->cls == SIM_CLASS_TRANSFER;
  for (int k = 0; k < task->n_succ; k++) {
    int32_t s = succ[k];
    if (p2p && e->now > e->sync_time[s])
      e->sync_time[s] = e->now;
    if (--e->preds_left[s] == 0)
      make_ready(e, s, t);
  }
}

static void drain_work(SimEngine *e)
{
  /* Join points and empty flows finish at once; their successors may do the same. */
  for (int i = 0; i < e->work.n; i++)
    release_successors(e, e->work.v[i]);
  e->work.n = 0;
}

/* With blocking sends (SimOptions.blocking_sends), the transfers to other devices that
 * compute task @t's end starts hold its device's host, and so its stream, until they end:
 * counted before @t's successors are released, so that no later kernel of the stream
 * starts first. */
static void count_sends(SimEngine *e, int32_t t)
{
  const SimTask *task = &e->tg->task[t];
  const int32_t *succ = e->tg->succ + task->succ_off;
  for (int k = 0; k < task->n_succ; k++) {
    int32_t s = succ[k];
    const SimTask *f = &e->tg->task[s];
    if (f->kind == SIM_TASK_FLOW && f->cls == SIM_CLASS_TRANSFER && !f->n_links &&
        f->device == task->device && f->peer != f->device && f->bytes > 0 &&
        e->preds_left[s] == 1 && !e->send_counted[s]) {
      e->send_counted[s] = 1;
      e->sends[task->device]++;
    }
  }
}

static void complete(SimEngine *e, int32_t t)
{
  const SimTask *task = &e->tg->task[t];
  e->tl->end[t] = e->now;
  e->n_done++;
  if (task->kind == SIM_TASK_COMPUTE) {
    int d = task->device;
    e->mem[d] -= task->mem_free;
    e->busy[d] = 0;
    e->stream_pos[d]++;
    e->stream_prev[d] = t;
    if (e->blocking_sends)
      count_sends(e, t);
  } else if (e->send_counted[t]) {
    /* A blocking send has ended: its host goes on from here. */
    int d = task->device;
    e->send_counted[t] = 0;
    if (--e->sends[d] == 0) {
      e->host[d] = MAX(e->host[d], e->now);
      try_stream(e, d);
    }
  }
  release_successors(e, t);
  drain_work(e);
  if (task->kind == SIM_TASK_COMPUTE)
    try_stream(e, task->device);
}

/* ---- groups of flows ---- */

/* The links of flow @t, and (@start, unless NULL) when it starts moving bytes after it is
 * ready. */
static const int *flow_links(SimEngine *e, int32_t t, int *n, double *start)
{
  const SimTask *task = &e->tg->task[t];
  if (task->n_links) {
    *n = task->n_links;
    if (start)
      *start = task->duration;
    return (const int *)sim_task_links(e->tg, task);
  }
  const SimRoute *r = route_of(e, task->device, task->peer);
  *n = r->n_links;
  if (start)
    *start = r->latency + task->duration;
  return r->links;
}

typedef struct {
  SimNet *net;
  int *slot;
  double *end;
  GArray *hist;  /* (member, time, remaining, rate) */
  double now;
} SchedCtx;

typedef struct {
  int member;
  double t, remaining, rate;
} RateChange;

static void sched_reschedule(void *user, int member, double end)
{
  SchedCtx *c = user;
  c->end[member] = end;
  RateChange rc = { member, c->now, 0, 0 };
  sim_net_flow_state(c->net, c->slot[member], &rc.remaining, &rc.rate);
  g_array_append_val(c->hist, rc);
}

static int by_start(const void *a, const void *b, void *user)
{
  const double *s = user;
  double x = s[*(const int *)a], y = s[*(const int *)b];
  if (x != y)
    return x < y ? -1 : 1;
  return *(const int *)a - *(const int *)b;
}

/* Runs the @n flows @mem alone on the links, from their release at time 0, with the
 * engine's rules (max-min sharing, the network settled once per instant).  NULL if some
 * flow would never end. */
static GroupSched *group_schedule(SimEngine *e, const int32_t *mem, int n)
{
  GroupSched *gs = g_new0(GroupSched, 1);
  gs->n = n;
  gs->s = g_new(double, n);
  gs->e = g_new(double, n);
  const int **links = g_new(const int *, n);
  int *nl = g_new(int, n), *order = g_new(int, n);
  SchedCtx c = { e->scratch, g_new(int, n), g_new(double, n),
                 g_array_new(FALSE, FALSE, sizeof(RateChange)), 0 };
  uint8_t *active = g_new0(uint8_t, n);
  for (int i = 0; i < n; i++) {
    links[i] = flow_links(e, mem[i], &nl[i], &gs->s[i]);
    gs->e[i] = -1;
    order[i] = i;
  }
  g_qsort_with_data(order, n, sizeof(int), by_start, gs->s);
  sim_net_reset(c.net);
  int next = 0, n_active = 0, ended = 0;
  while (ended < n) {
    double T = next < n ? gs->s[order[next]] : INFINITY;
    for (int i = 0; i < n; i++)
      if (active[i] && c.end[i] < T)
        T = c.end[i];
    if (!isfinite(T))
      break;
    double H = T + fabs(T) * 1e-12;
    c.now = T;
    for (int i = 0; i < n && n_active > 0; i++)
      if (active[i] && c.end[i] <= H) {
        gs->e[i] = T;
        sim_net_remove(c.net, c.slot[i], T);
        active[i] = 0;
        n_active--;
        ended++;
      }
    while (next < n && gs->s[order[next]] <= H) {
      int i = order[next++];
      c.slot[i] = sim_net_add(c.net, i, links[i], nl[i], e->tg->task[mem[i]].bytes, T);
      c.end[i] = INFINITY;
      active[i] = 1;
      n_active++;
    }
    sim_net_update(c.net, T, sched_reschedule, &c);
  }
  gboolean ok = ended == n;
  gs->last = 0;
  for (int i = 0; ok && i < n; i++)
    gs->last = MAX(gs->last, gs->e[i]);
  /* The rate changes, by member. */
  gs->h_off = g_new0(int, n + 1);
  for (guint k = 0; k < c.hist->len; k++)
    gs->h_off[g_array_index(c.hist, RateChange, k).member + 1]++;
  for (int i = 0; i < n; i++)
    gs->h_off[i + 1] += gs->h_off[i];
  gs->h = g_new(double, 3 * MAX(c.hist->len, 1));
  int *fill = g_new0(int, n);
  for (guint k = 0; k < c.hist->len; k++) {
    const RateChange *rc = &g_array_index(c.hist, RateChange, k);
    double *h = gs->h + 3 * (gs->h_off[rc->member] + fill[rc->member]++);
    h[0] = rc->t;
    h[1] = rc->remaining;
    h[2] = rc->rate;
  }
  g_free(fill);
  /* The links, each once, with the bytes all members carry over it. */
  GArray *ul = g_array_new(FALSE, FALSE, sizeof(int));
  GArray *ub = g_array_new(FALSE, FALSE, sizeof(double));
  for (int i = 0; i < n; i++)
    for (int h = 0; h < nl[i]; h++) {
      int l = links[i][h];
      double bytes = e->tg->task[mem[i]].bytes;
      if (e->link_mark[l] < 0) {
        e->link_mark[l] = (int32_t)ul->len;
        g_array_append_val(ul, l);
        g_array_append_val(ub, bytes);
      } else {
        g_array_index(ub, double, e->link_mark[l]) += bytes;
      }
    }
  for (guint k = 0; k < ul->len; k++)
    e->link_mark[g_array_index(ul, int, k)] = -1;
  gs->n_ul = (int)ul->len;
  gs->ul = (int *)(void *)g_array_free(ul, FALSE);
  gs->ul_bytes = (double *)(void *)g_array_free(ub, FALSE);
  g_free(links);
  g_free(nl);
  g_free(order);
  g_free(c.slot);
  g_free(c.end);
  g_array_free(c.hist, TRUE);
  g_free(active);
  if (!ok) {
    group_sched_free(gs);
    return NULL;
  }
  return gs;
}

/* The schedule of the group of flows @mem, from earlier runs or worked out now. */
static const GroupSched *group_lookup(SimEngine *e, const int32_t *mem, int n)
{
  /* The key: per member its links (or ends), bytes and latency, written straight into
   * a reused buffer and looked up without a copy. */
  size_t len = 0;
  for (int i = 0; i < n; i++)
    len += 3 * sizeof(int32_t) + 2 * sizeof(double) +
           (size_t)e->tg->task[mem[i]].n_links * sizeof(int32_t);
  GArray *k = e->key;
  g_array_set_size(k, (guint)len);
  uint8_t *w = (uint8_t *)k->data;
  for (int i = 0; i < n; i++) {
    const SimTask *t = &e->tg->task[mem[i]];
    int32_t head[3] = { t->n_links, t->device, t->peer };
    memcpy(w, head, sizeof head);
    w += sizeof head;
    if (t->n_links) {
      memcpy(w, sim_task_links(e->tg, t), (size_t)t->n_links * sizeof(int32_t));
      w += (size_t)t->n_links * sizeof(int32_t);
    }
    double v[2] = { t->bytes, t->duration };
    memcpy(w, v, sizeof v);
    w += sizeof v;
  }
  gpointer found;
  if (sim_bytes_lookup(e->scheds, k->data, len, &found))
    return found;
  GroupSched *gs = group_schedule(e, mem, n);
  if (!gs)
    return NULL;
  GBytes *key = g_bytes_new(k->data, len);
  g_hash_table_insert(e->scheds, key, gs);
  e->sched_bytes += len + (size_t)n * (2 * sizeof(double) + sizeof(int)) +
                    (size_t)gs->h_off[n] * 3 * sizeof(double);
  return gs;
}

/* Frees the links the group of @head (schedule @gs) still holds. */
static void group_release_links(SimEngine *e, int32_t head, const GroupSched *gs)
{
  for (int k = 0; k < gs->n_ul; k++)
    if (e->held_by[gs->ul[k]] == head)
      e->held_by[gs->ul[k]] = -1;
}

/* Turns the group of head @head, running as a whole, back into flows at `now`: members
 * that have ended release their successors, those under way join the network with the
 * bytes they have left, the others start when they would have. */
static void expand_group(SimEngine *e, int32_t head)
{
  GroupRun *gr = g_hash_table_lookup(e->running, GINT_TO_POINTER(head + 1));
  g_assert(gr);
  const SimTaskGraph *tg = e->tg;
  const SimTask *jt = &tg->task[head];
  const int32_t *mem = tg->succ + jt->succ_off;
  const GroupSched *gs = gr->sched;
  double r = e->now - gr->t0;
  e->flow_ver[head]++; /* its end event no longer counts */
  group_release_links(e, head, gs);
  GArray *ended = g_array_new(FALSE, FALSE, sizeof(int32_t));
  for (int i = 0; i < gs->n; i++) {
    int32_t m = mem[i];
    int nl;
    const int *links = flow_links(e, m, &nl, NULL);
    if (gs->e[i] <= r) {
      e->n_done++;
      g_array_append_val(ended, m);
    } else if (gs->s[i] <= r) {
      const double *h = NULL;
      for (int k = gs->h_off[i]; k < gs->h_off[i + 1]; k++)
        if (gs->h[3 * k] <= r)
          h = gs->h + 3 * k;
      double left = h ? h[1] - h[2] * (r - h[0]) : tg->task[m].bytes;
      e->tl->end[m] = -1;
      e->flow_slot[m] = sim_net_resume(e->net, m, links, nl, MAX(left, 0), e->now);
    } else {
      /* Not started: its bytes count when it starts, as any flow's. */
      sim_net_account(e->net, links, nl, -tg->task[m].bytes);
      e->tl->end[m] = -1;
      if (!tg->task[m].n_links)
        e->flow_route[m] = route_of(e, tg->task[m].device, tg->task[m].peer);
      schedule(e, gr->t0 + gs->s[i], m, EV_FLOW_START);
    }
  }
  g_hash_table_remove(e->running, GINT_TO_POINTER(head + 1));
  for (guint k = 0; k < ended->len; k++)
    release_successors(e, g_array_index(ended, int32_t, k));
  g_array_free(ended, TRUE);
}

/* Frees the links of @n_links flows' links from the groups holding them. */
static void expand_holders(SimEngine *e, const int *links, int n_links)
{
  for (int h = 0; h < n_links; h++)
    if (e->held_by[links[h]] >= 0)
      expand_group(e, e->held_by[links[h]]);
}

/* Starts the flows that @head releases as one group, if no other flow uses their links
 * now; FALSE leaves them to start one by one. */
static gboolean start_group(SimEngine *e, int32_t head)
{
  const SimTaskGraph *tg = e->tg;
  const SimTask *jt = &tg->task[head];
  const int32_t *mem = tg->succ + jt->succ_off;
  int n = jt->n_succ;
  const GroupSched *gs = group_lookup(e, mem, n);
  if (!gs)
    return FALSE;
  gboolean idle = TRUE;
  for (int k = 0; k < gs->n_ul; k++) {
    int l = gs->ul[k];
    if (e->held_by[l] >= 0) {
      expand_group(e, e->held_by[l]);
      idle = FALSE;
    }
    if (sim_net_link_busy(e->net, l))
      idle = FALSE;
  }
  if (!idle)
    return FALSE;
  SimTimeline *tl = e->tl;
  for (int i = 0; i < n; i++) {
    int32_t m = mem[i];
    e->preds_left[m] = 0;
    tl->crit[m] = head;
    e->ready_time[m] = e->now;
    tl->start[m] = e->now;
    tl->end[m] = e->now + gs->e[i];
  }
  for (int k = 0; k < gs->n_ul; k++) {
    sim_net_account(e->net, &gs->ul[k], 1, gs->ul_bytes[k]);
    e->held_by[gs->ul[k]] = head;
  }
  GroupRun *gr = g_new(GroupRun, 1);
  *gr = (GroupRun){ e->now, gs };
  g_hash_table_insert(e->running, GINT_TO_POINTER(head + 1), gr);
  schedule_v(e, e->now + gs->last, head, EV_GROUP_END, ++e->flow_ver[head]);
  return TRUE;
}

/* The group of @head ran to its end undisturbed: its flows end, as scheduled. */
static void end_group(SimEngine *e, int32_t head)
{
  const SimTask *jt = &e->tg->task[head];
  const int32_t *mem = e->tg->succ + jt->succ_off;
  int n = jt->n_succ;
  GroupRun *gr = g_hash_table_lookup(e->running, GINT_TO_POINTER(head + 1));
  group_release_links(e, head, gr->sched);
  g_hash_table_remove(e->running, GINT_TO_POINTER(head + 1));
  e->n_done += n;
  /* The end event may have run a hair early, with the events of the instant just before
   * it (see the horizon in sim_engine_run): no member ends after its successors start. */
  for (int i = 0; i < n; i++)
    if (e->tl->end[mem[i]] > e->now)
      e->tl->end[mem[i]] = e->now;
  for (int i = 0; i < n; i++)
    release_successors(e, mem[i]);
  drain_work(e);
}

static void on_reschedule(void *user, int task, double end)
{
  SimEngine *e = user;
  uint64_t key = time_key(end), seq = e->seq++;
  int slot = e->flow_slot[task];
  if (slot >= e->cap_flow_end) {
    int cap = MAX(2 * e->cap_flow_end, MAX(slot + 1, 64));
    e->flow_end = g_renew(FlowEnd, e->flow_end, cap);
    for (int i = e->cap_flow_end; i < cap; i++)
      e->flow_end[i].task = -1;
    e->cap_flow_end = cap;
  }
  FlowEnd *f = &e->flow_end[slot];
  if (f->task == task && f->version == e->flow_ver[task] && f->queued <= key) {
    f->tkey = key; /* the queued event comes first and carries the flow on */
    f->seq = seq;
    return;
  }
  uint32_t v = ++e->flow_ver[task];
  push_event(e, key, seq, task, EV_FLOW_END, v);
  *f = (FlowEnd){ task, v, key, key, seq };
}

/* Stops a bounded run: the iteration takes at least @floor, which is past the bound. */
static void cut_at(SimEngine *e, SimTimeline *tl, double floor)
{
  tl->cut = TRUE;
  tl->makespan = floor;
  tl->n_tasks_run = e->n_done;
  tl->deadlock = FALSE;
  tl->link_bytes = NULL;
}

void sim_engine_run(SimEngine *e, const SimTaskGraph *tg, SimTimeline *tl)
{
  int n = tg->n_tasks;
  if (n > e->cap_tasks) {
    /* Nothing in these outlives a run (each is set up below, or written before it is
     * read): nothing to keep. */
    e->cap_tasks = n;
    e->preds_left = sim_large_renew(e->preds_left, (size_t)n * sizeof(int32_t));
    e->flow_slot = sim_large_renew(e->flow_slot, (size_t)n * sizeof(int32_t));
    e->flow_ver = sim_large_renew(e->flow_ver, (size_t)n * sizeof(uint32_t));
    e->flow_route = sim_large_renew(e->flow_route, (size_t)n * sizeof(const SimRoute *));
    e->ready_time = sim_large_renew(e->ready_time, (size_t)n * sizeof(double));
    e->sync_time = sim_large_renew(e->sync_time, (size_t)n * sizeof(double));
    e->ready = sim_large_renew(e->ready, (size_t)n);
    e->send_counted = sim_large_renew(e->send_counted, (size_t)n);
  }
  /* A delta run fills the arrays of the last one (fresh pages cost more than the
   * writes). */
  if (tl->start && tl->cap >= (size_t)n) {
    g_clear_pointer(&tl->peak_mem, g_free);
    g_clear_pointer(&tl->link_bytes, g_free);
    tl->makespan = 0;
    tl->n_tasks_run = 0;
    tl->deadlock = FALSE;
    tl->cut = FALSE;
  } else {
    sim_timeline_clear(tl);
    tl->cap = (size_t)MAX(n, 1);
    tl->start = sim_large_alloc(tl->cap * sizeof(double));
    tl->end = sim_large_alloc(tl->cap * sizeof(double));
    tl->crit = sim_large_alloc(tl->cap * sizeof(int32_t));
  }
  tl->peak_mem = g_new0(int64_t, e->n_devices);
  e->tg = tg;
  e->tl = tl;
  e->now = 0;
  e->n_done = 0;
  e->seq = 0;
  e->n_heap = 0;
  e->work.n = 0;
  sim_net_reset(e->net);
  /* A slot's last flow of the run before may share a task number and a version with a
   * flow of this one. */
  for (int i = 0; i < e->cap_flow_end; i++)
    e->flow_end[i].task = -1;
  g_hash_table_remove_all(e->running);
  /* Schedules are only a cache: past 256 MiB they are dropped (between runs, when no
   * group refers to them) and worked out again as needed. */
  if (e->sched_bytes > ((size_t)256 << 20)) {
    g_hash_table_remove_all(e->scheds);
    e->sched_bytes = 0;
  }
  for (int l = 0; l < e->n_links; l++)
    e->held_by[l] = -1;
  memcpy(e->preds_left, tg->n_pred, (size_t)n * sizeof(int32_t));
  memset(e->flow_ver, 0, (size_t)n * sizeof(uint32_t));
  memset(e->sync_time, 0, (size_t)n * sizeof(double));
  memset(e->flow_slot, 0xff, (size_t)n * sizeof(int32_t)); /* -1 */
  memset(e->ready, 0, (size_t)n);
  memset(e->send_counted, 0, (size_t)n);
  memset(tl->crit, 0xff, (size_t)n * sizeof(int32_t));      /* -1 */
  for (int t = 0; t < n; t++) {
    tl->start[t] = -1;
    tl->end[t] = -1;
  }
  for (int d = 0; d < e->n_devices; d++) {
    e->stream_pos[d] = tg->stream_off[d];
    e->stream_prev[d] = -1;
    e->busy[d] = 0;
    e->mem[d] = tg->static_mem[d];
    e->host[d] = 0;
    e->host_unit[d] = INT32_MIN;
    e->sends[d] = 0;
    tl->peak_mem[d] = e->mem[d];
  }
  e->overflow = FALSE;
  e->overflow_at = INFINITY;
  for (int d = 0; e->stop_overflow && d < e->n_devices; d++)
    if (over_capacity(e, d))
      e->overflow = TRUE;
  /* With a bound, a floor under the iteration time: no stream ends before it has run the
   * tasks it has not started (start_compute() raises it as they start). */
  e->floor = 0;
  if (isfinite(e->bound)) {
    e->left = g_renew(double, e->left, MAX(e->n_devices, 1));
    for (int d = 0; d < e->n_devices; d++) {
      double w = 0;
      for (int32_t k = tg->stream_off[d]; k < tg->stream_off[d + 1]; k++)
        w += tg->task[tg->stream[k]].duration;
      e->left[d] = w;
      e->floor = MAX(e->floor, w);
    }
  } else {
    g_clear_pointer(&e->left, g_free);
  }
  for (int i = 0; i < tg->n_roots; i++)
    make_ready(e, tg->roots[i], -1);
  drain_work(e);

  for (uint32_t polls = 0;; polls++) {
    /* Cancelled (a search past its deadline, a signal): cut, with no bound on the time. */
    if (e->cancel && (polls & 4095) == 0 && atomic_load(e->cancel)) {
      cut_at(e, tl, INFINITY);
      return;
    }
    if (e->overflow) {
      /* A device holds more than its memory: all the caller wanted to know. */
      cut_at(e, tl, e->now);
      return;
    }
    if (e->overflow_at < INFINITY &&
        (e->n_heap == 0 || key_time(e->heap[0].tkey) > e->overflow_at)) {
      /* Where a merged run's task goes over memory, once all before it has run. */
      cut_at(e, tl, e->overflow_at);
      return;
    }
    /* A little below the floor: the run merges events within a relative 1e-12 of an
     * instant into it (below), so a stream may end that much sooner per task. */
    if (e->floor * (1 - 1e-6) > e->bound) {
      cut_at(e, tl, e->floor * (1 - 1e-6));
      return;
    }
    /* Events within a relative 1e-12 of the current instant belong to it: flows that end
     * together in exact arithmetic (the symmetric copies of one transfer) differ in their
     * last bits, and one network solve serves them all. */
    double horizon = e->now + fabs(e->now) * 1e-12;
    if (e->n_heap == 0 || key_time(e->heap[0].tkey) > horizon) {
      /* Every event due now has run: settle the network before time moves on. */
      sim_net_update(e->net, e->now, on_reschedule, e);
      horizon = e->now + fabs(e->now) * 1e-12;
    }
    if (e->n_heap == 0)
      break;
    Event ev = heap_pop(e);
    if ((ev.type == EV_FLOW_END || ev.type == EV_GROUP_END) &&
        ev.version != e->flow_ver[ev.task])
      continue; /* superseded by a later end of the same flow, or its group expanded */
    if (ev.type == EV_FLOW_END) {
      FlowEnd *f = &e->flow_end[e->flow_slot[ev.task]];
      if (ev.tkey != f->tkey || ev.seq != f->seq) {
        /* The flow ends later than it did when this event was queued. */
        f->queued = f->tkey;
        push_event(e, f->tkey, f->seq, ev.task, EV_FLOW_END, ev.version);
        continue;
      }
    }
    double time = key_time(ev.tkey);
    if (time * (1 - 1e-9) > e->bound) {
      /* Nothing happens before this event, which will happen (or, merged into the
       * instant before it, a hair sooner): the iteration ends no sooner. */
      cut_at(e, tl, time * (1 - 1e-9));
      return;
    }
    if (time > horizon)
      e->now = time;
    switch (ev.type) {
    case EV_END:
      complete(e, ev.task);
      break;
    case EV_FLOW_START: {
      const SimTask *task = &tg->task[ev.task];
      if (task->n_links) {
        expand_holders(e, (const int *)sim_task_links(tg, task), task->n_links);
        e->flow_slot[ev.task] = sim_net_add(e->net, ev.task, sim_task_links(tg, task),
                                            task->n_links, task->bytes, e->now);
      } else {
        const SimRoute *r = e->flow_route[ev.task];
        expand_holders(e, r->links, r->n_links);
        e->flow_slot[ev.task] =
          sim_net_add(e->net, ev.task, r->links, r->n_links, task->bytes, e->now);
      }
      break;
    }
    case EV_GROUP_END:
      end_group(e, ev.task);
      break;
    case EV_FLOW_END:
      e->flow_ver[ev.task]++;
      sim_net_remove(e->net, e->flow_slot[ev.task], e->now);
      complete(e, ev.task);
      break;
    }
  }
  tl->makespan = 0;
  for (int t = 0; t < n; t++)
    if (tl->end[t] > tl->makespan)
      tl->makespan = tl->end[t];
  tl->n_tasks_run = e->n_done;
  tl->deadlock = e->n_done < n;
  int nl = sim_machine_n_links(e->machine);
  tl->link_bytes = g_new(double, nl > 0 ? nl : 1);
  memcpy(tl->link_bytes, sim_net_link_bytes(e->net), (size_t)nl * sizeof(double));
}
