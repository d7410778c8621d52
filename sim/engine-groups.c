/* engine-groups.c — groups of flows run as a whole (engine.c, "Groups"): the schedule a
 * group follows when it runs alone on its links, worked out once and kept, and the
 * group's start, end, and expansion back into single flows when another flow needs one
 * of its links. */
#include "engine-internal.h"

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
  /* The scratch net is as sim_net_reset() leaves it: fresh, or reset after the last
   * schedule (below). */
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
  /* Only this group's flows crossed the scratch net since its last reset. */
  sim_net_reset_links(c.net, links, nl, n);
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
    sim_engine_group_sched_free(gs);
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
    sim_engine_release_successors(e, g_array_index(ended, int32_t, k));
  g_array_free(ended, TRUE);
}

/* Frees the links of @n_links flows' links from the groups holding them. */
void sim_engine_expand_holders(SimEngine *e, const int *links, int n_links)
{
  for (int h = 0; h < n_links; h++)
    if (e->held_by[links[h]] >= 0)
      expand_group(e, e->held_by[links[h]]);
}

/* Starts the flows that @head releases as one group, if no other flow uses their links
 * now; FALSE leaves them to start one by one. */
gboolean sim_engine_start_group(SimEngine *e, int32_t head)
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
void sim_engine_end_group(SimEngine *e, int32_t head)
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
    sim_engine_release_successors(e, mem[i]);
  sim_engine_drain_work(e);
}