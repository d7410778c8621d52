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
 * that moment the run is the unbounded one.
 *
 * The groups of flows are in engine-groups.c; the state both files share is in
 * engine-internal.h. */
#include "engine-internal.h"

static Event heap_pop(SimEngine *e)
{
  return event_heap_pop(e->heap, &e->n_heap);
}

/* ---- tasks ---- */

void sim_engine_group_sched_free(gpointer p)
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

SimEngine *sim_engine_new(const SimMachine *m, const SimCollParams *cp)
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
                                    sim_engine_group_sched_free);
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


void sim_engine_release_successors(SimEngine *e, int32_t t)
{
  if (e->groups && e->tg->group_head[t] && sim_engine_start_group(e, t))
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

void sim_engine_drain_work(SimEngine *e)
{
  /* Join points and empty flows finish at once; their successors may do the same. */
  for (int i = 0; i < e->work.n; i++)
    sim_engine_release_successors(e, e->work.v[i]);
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
  sim_engine_release_successors(e, t);
  sim_engine_drain_work(e);
  if (task->kind == SIM_TASK_COMPUTE)
    try_stream(e, task->device);
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
  sim_engine_drain_work(e);

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
        sim_engine_expand_holders(e, (const int *)sim_task_links(tg, task), task->n_links);
        e->flow_slot[ev.task] = sim_net_add(e->net, ev.task, sim_task_links(tg, task),
                                            task->n_links, task->bytes, e->now);
      } else {
        const SimRoute *r = e->flow_route[ev.task];
        sim_engine_expand_holders(e, r->links, r->n_links);
        e->flow_slot[ev.task] =
          sim_net_add(e->net, ev.task, r->links, r->n_links, task->bytes, e->now);
      }
      break;
    }
    case EV_GROUP_END:
      sim_engine_end_group(e, ev.task);
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
