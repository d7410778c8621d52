/* engine.c — the discrete-event engine that times an assembled task graph.
 *
 * Events sit in a binary min-heap ordered by (time, sequence number), so events due at
 * the same time run in the order they were scheduled and every run is reproducible
 * (libuv's timer heap).  Each event remembers its heap position, so a flow whose rate
 * changes moves its end event in O(log n).
 *
 * Resources: one compute stream per device runs its compute tasks one at a time, in the
 * stream order the lowering chose (a CUDA stream runs kernels in issue order); flows move
 * bytes over links shared by max-min fairness (network.c) and start after their route's
 * latency; delays wait without holding anything.  The network is re-solved only once all
 * events due at one instant have run, so flows that end together cost one solve. */
#include "taskgraph.h"

#include <math.h>
#include <string.h>

typedef enum { EV_END, EV_FLOW_START, EV_FLOW_END } EventType;

typedef struct {
  double time;
  uint64_t seq;
  int32_t task;
  int32_t type;
  int32_t heap_pos;   /* -1 when not in the heap */
} Event;

struct _SimEngine {
  SimMachine *machine;
  SimNet *net;
  /* event pool and heap */
  Event *ev;
  int n_ev, cap_ev;
  int32_t *free_ev;
  int n_free_ev, cap_free_ev;
  int32_t *heap;
  int n_heap, cap_heap;
  uint64_t seq;
  /* per-task state, sized for the last graph */
  int cap_tasks;
  int32_t *preds_left;
  int32_t *flow_slot;
  int32_t *flow_event;
  const SimRoute **flow_route;
  double *ready_time;
  uint8_t *ready;
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
  GArray *work;           /* tasks that completed at `now`, whose successors are pending */
};

/* ---- heap ---- */

static inline gboolean ev_less(const Event *a, const Event *b)
{
  if (a->time != b->time)
    return a->time < b->time;
  return a->seq < b->seq;
}

static void heap_swap(SimEngine *e, int i, int j)
{
  int32_t a = e->heap[i], b = e->heap[j];
  e->heap[i] = b;
  e->heap[j] = a;
  e->ev[b].heap_pos = i;
  e->ev[a].heap_pos = j;
}

static void sift_up(SimEngine *e, int i)
{
  while (i > 0) {
    int p = (i - 1) / 2;
    if (!ev_less(&e->ev[e->heap[i]], &e->ev[e->heap[p]]))
      break;
    heap_swap(e, i, p);
    i = p;
  }
}

static void sift_down(SimEngine *e, int i)
{
  for (;;) {
    int l = 2 * i + 1, r = l + 1, m = i;
    if (l < e->n_heap && ev_less(&e->ev[e->heap[l]], &e->ev[e->heap[m]]))
      m = l;
    if (r < e->n_heap && ev_less(&e->ev[e->heap[r]], &e->ev[e->heap[m]]))
      m = r;
    if (m == i)
      break;
    heap_swap(e, i, m);
    i = m;
  }
}

static int32_t event_alloc(SimEngine *e)
{
  if (e->n_free_ev)
    return e->free_ev[--e->n_free_ev];
  if (e->n_ev == e->cap_ev) {
    e->cap_ev = e->cap_ev ? e->cap_ev * 2 : 1024;
    e->ev = g_renew(Event, e->ev, e->cap_ev);
  }
  return e->n_ev++;
}

static void event_release(SimEngine *e, int32_t id)
{
  if (e->n_free_ev == e->cap_free_ev) {
    e->cap_free_ev = e->cap_free_ev ? e->cap_free_ev * 2 : 1024;
    e->free_ev = g_renew(int32_t, e->free_ev, e->cap_free_ev);
  }
  e->free_ev[e->n_free_ev++] = id;
}

static int32_t schedule(SimEngine *e, double time, int task, EventType type)
{
  int32_t id = event_alloc(e);
  Event *ev = &e->ev[id];
  ev->time = time;
  ev->seq = e->seq++;
  ev->task = task;
  ev->type = type;
  if (e->n_heap == e->cap_heap) {
    e->cap_heap = e->cap_heap ? e->cap_heap * 2 : 1024;
    e->heap = g_renew(int32_t, e->heap, e->cap_heap);
  }
  ev->heap_pos = e->n_heap;
  e->heap[e->n_heap++] = id;
  sift_up(e, ev->heap_pos);
  return id;
}

static void reschedule(SimEngine *e, int32_t id, double time)
{
  Event *ev = &e->ev[id];
  double old = ev->time;
  ev->time = time;
  ev->seq = e->seq++;
  if (time < old)
    sift_up(e, ev->heap_pos);
  else
    sift_down(e, ev->heap_pos);
}

static int32_t heap_pop(SimEngine *e)
{
  int32_t top = e->heap[0];
  heap_swap(e, 0, e->n_heap - 1);
  e->n_heap--;
  if (e->n_heap > 0)
    sift_down(e, 0);
  e->ev[top].heap_pos = -1;
  return top;
}

/* ---- tasks ---- */

SimEngine *sim_engine_new(SimMachine *m, double bandwidth_efficiency)
{
  SimEngine *e = g_new0(SimEngine, 1);
  e->machine = m;
  e->net = sim_net_new(m, bandwidth_efficiency);
  e->n_devices = sim_machine_n_devices(m);
  e->stream_pos = g_new0(int32_t, e->n_devices);
  e->stream_prev = g_new0(int32_t, e->n_devices);
  e->busy = g_new0(uint8_t, e->n_devices);
  e->mem = g_new0(int64_t, e->n_devices);
  e->work = g_array_new(FALSE, FALSE, sizeof(int32_t));
  return e;
}

void sim_engine_free(SimEngine *e)
{
  if (!e)
    return;
  sim_net_free(e->net);
  g_free(e->ev);
  g_free(e->free_ev);
  g_free(e->heap);
  g_free(e->preds_left);
  g_free(e->flow_slot);
  g_free(e->flow_event);
  g_free(e->flow_route);
  g_free(e->ready_time);
  g_free(e->ready);
  g_free(e->stream_pos);
  g_free(e->stream_prev);
  g_free(e->busy);
  g_free(e->mem);
  g_array_free(e->work, TRUE);
  g_free(e);
}

void sim_timeline_clear(SimTimeline *tl)
{
  g_clear_pointer(&tl->start, g_free);
  g_clear_pointer(&tl->end, g_free);
  g_clear_pointer(&tl->crit, g_free);
  g_clear_pointer(&tl->peak_mem, g_free);
  g_clear_pointer(&tl->link_bytes, g_free);
  tl->makespan = 0;
  tl->n_tasks_run = 0;
  tl->deadlock = FALSE;
}

static void try_stream(SimEngine *e, int d);

static void start_compute(SimEngine *e, int32_t t)
{
  const SimTask *task = &e->tg->task[t];
  int d = task->device;
  SimTimeline *tl = e->tl;
  tl->start[t] = e->now;
  /* The stream was the last thing this task waited for when it became ready earlier. */
  if (e->ready_time[t] < e->now && e->stream_prev[d] >= 0)
    tl->crit[t] = e->stream_prev[d];
  e->busy[d] = 1;
  e->mem[d] += task->mem_alloc;
  if (e->mem[d] > tl->peak_mem[d])
    tl->peak_mem[d] = e->mem[d];
  schedule(e, e->now + task->duration, t, EV_END);
}

static void try_stream(SimEngine *e, int d)
{
  if (e->busy[d])
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
    g_array_append_val(e->work, t);
    break;
  case SIM_TASK_FLOW:
    tl->start[t] = e->now;
    if (task->n_links) {
      /* A whole collective: its latency is all in its duration. */
      schedule(e, e->now + task->duration, t, EV_FLOW_START);
    } else if (task->device == task->peer || task->bytes <= 0) {
      tl->end[t] = e->now;
      e->n_done++;
      g_array_append_val(e->work, t);
    } else {
      /* A flow's duration is protocol latency paid on top of its route's. */
      const SimRoute *r = sim_machine_route_info(e->machine, task->device, task->peer);
      e->flow_route[t] = r;
      schedule(e, e->now + r->latency + task->duration, t, EV_FLOW_START);
    }
    break;
  }
}

static void release_successors(SimEngine *e, int32_t t)
{
  const SimTask *task = &e->tg->task[t];
  const int32_t *succ = e->tg->succ + task->succ_off;
  for (int k = 0; k < task->n_succ; k++) {
    int32_t s = succ[k];
    if (--e->preds_left[s] == 0)
      make_ready(e, s, t);
  }
}

static void drain_work(SimEngine *e)
{
  /* Join points and empty flows finish at once; their successors may do the same. */
  for (guint i = 0; i < e->work->len; i++)
    release_successors(e, g_array_index(e->work, int32_t, i));
  g_array_set_size(e->work, 0);
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
  }
  release_successors(e, t);
  drain_work(e);
  if (task->kind == SIM_TASK_COMPUTE)
    try_stream(e, task->device);
}

static void on_reschedule(void *user, int task, double end)
{
  SimEngine *e = user;
  int32_t id = e->flow_event[task];
  if (id < 0)
    e->flow_event[task] = schedule(e, end, task, EV_FLOW_END);
  else
    reschedule(e, id, end);
}

void sim_engine_run(SimEngine *e, const SimTaskGraph *tg, SimTimeline *tl)
{
  int n = tg->n_tasks;
  if (n > e->cap_tasks) {
    e->cap_tasks = n;
    e->preds_left = g_renew(int32_t, e->preds_left, n);
    e->flow_slot = g_renew(int32_t, e->flow_slot, n);
    e->flow_event = g_renew(int32_t, e->flow_event, n);
    e->flow_route = g_renew(const SimRoute *, e->flow_route, n);
    e->ready_time = g_renew(double, e->ready_time, n);
    e->ready = g_renew(uint8_t, e->ready, n);
  }
  sim_timeline_clear(tl);
  tl->start = g_new(double, n > 0 ? n : 1);
  tl->end = g_new(double, n > 0 ? n : 1);
  tl->crit = g_new(int32_t, n > 0 ? n : 1);
  tl->peak_mem = g_new0(int64_t, e->n_devices);
  e->tg = tg;
  e->tl = tl;
  e->now = 0;
  e->n_done = 0;
  e->seq = 0;
  e->n_heap = 0;
  e->n_ev = 0;
  e->n_free_ev = 0;
  sim_net_reset(e->net);
  for (int t = 0; t < n; t++) {
    e->preds_left[t] = tg->task[t].n_pred;
    e->flow_event[t] = -1;
    e->flow_slot[t] = -1;
    e->ready[t] = 0;
    tl->start[t] = -1;
    tl->end[t] = -1;
    tl->crit[t] = -1;
  }
  for (int d = 0; d < e->n_devices; d++) {
    e->stream_pos[d] = tg->stream_off[d];
    e->stream_prev[d] = -1;
    e->busy[d] = 0;
    e->mem[d] = tg->static_mem[d];
    tl->peak_mem[d] = e->mem[d];
  }
  for (int t = 0; t < n; t++)
    if (tg->task[t].n_pred == 0)
      make_ready(e, t, -1);
  drain_work(e);

  for (;;) {
    if (e->n_heap == 0 || e->ev[e->heap[0]].time > e->now) {
      /* Every event due now has run: settle the network before time moves on. */
      sim_net_update(e->net, e->now, on_reschedule, e);
    }
    if (e->n_heap == 0)
      break;
    int32_t id = heap_pop(e);
    Event ev = e->ev[id];
    event_release(e, id);
    e->now = ev.time;
    switch (ev.type) {
    case EV_END:
      complete(e, ev.task);
      break;
    case EV_FLOW_START: {
      const SimTask *task = &tg->task[ev.task];
      if (task->n_links) {
        e->flow_slot[ev.task] = sim_net_add(e->net, ev.task, sim_task_links(tg, task),
                                            task->n_links, task->bytes, e->now);
      } else {
        const SimRoute *r = e->flow_route[ev.task];
        e->flow_slot[ev.task] =
          sim_net_add(e->net, ev.task, r->links, r->n_links, task->bytes, e->now);
      }
      break;
    }
    case EV_FLOW_END:
      e->flow_event[ev.task] = -1;
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
