/* network.c — flows on routes that share links by max-min fairness.
 *
 * A flow may cross one link several times (one flow standing for a whole collective
 * whose ring passes a bridge twice); it then counts that many times on the link, which
 * is weighted max-min fairness with integer weights.
 *
 * A flow holds its remaining bytes as of the last time its rate changed; between
 * changes it drains at a constant rate, so the engine needs to hear only about flows
 * whose rate changes.  When flows start or end, only the connected component of links
 * and flows around them is re-solved, by progressive filling (SimGrid's max-min model,
 * network_cm02): raise every flow's rate together until a link saturates, fix the flows
 * crossing it, and repeat with what capacity is left. */
#include "taskgraph.h"

#include <math.h>
#include <string.h>

typedef struct {
  int task;           /* -1 when the slot is free */
  const int *links;
  int n_links;
  int *pos;           /* the flow's index in each of its links' lists */
  double remaining;
  double rate;
  double last;
  gboolean fixed;
  gboolean in_comp;
} Flow;

typedef struct {
  int *flows;         /* slots of the active flows on this link */
  int *hop;           /* for each, the index of this link in the flow's route */
  int n, cap;
  double capacity;
  double rem;
  double share;       /* rem / cnt, in the current round of the filling */
  int cnt;
  gboolean dirty;
  gboolean in_comp;
} Link;

struct _SimNet {
  SimMachine *machine;
  int n_links;
  Link *link;
  Flow *flow;
  int n_flows, cap_flows;
  SimIntStack free_slots;
  SimIntStack dirty_links;
  SimIntStack comp_links;
  SimIntStack comp_flows;
  SimIntStack tied;        /* links at the smallest share in a round of the filling */
  double *link_bytes;
  int n_active;
};

SimNet *sim_net_new(SimMachine *m, const SimCollParams *cp)
{
  SimNet *net = g_new0(SimNet, 1);
  net->machine = m;
  net->n_links = sim_machine_n_links(m);
  net->link = g_new0(Link, net->n_links > 0 ? net->n_links : 1);
  for (int l = 0; l < net->n_links; l++)
    net->link[l].capacity = sim_coll_link_capacity(m, cp, l);
  net->link_bytes = g_new0(double, net->n_links > 0 ? net->n_links : 1);
  return net;
}

void sim_net_reset(SimNet *net)
{
  for (int i = 0; i < net->n_flows; i++)
    g_free(net->flow[i].pos);
  net->n_flows = 0;
  net->n_active = 0;
  net->free_slots.n = 0;
  net->dirty_links.n = 0;
  for (int l = 0; l < net->n_links; l++) {
    net->link[l].n = 0;
    net->link[l].dirty = FALSE;
    net->link[l].in_comp = FALSE;
  }
  memset(net->link_bytes, 0, (size_t)net->n_links * sizeof(double));
}

void sim_net_free(SimNet *net)
{
  if (!net)
    return;
  for (int i = 0; i < net->n_flows; i++)
    g_free(net->flow[i].pos);
  for (int l = 0; l < net->n_links; l++) {
    g_free(net->link[l].flows);
    g_free(net->link[l].hop);
  }
  g_free(net->link);
  g_free(net->flow);
  g_free(net->free_slots.v);
  g_free(net->dirty_links.v);
  g_free(net->comp_links.v);
  g_free(net->comp_flows.v);
  g_free(net->tied.v);
  g_free(net->link_bytes);
  g_free(net);
}

static void mark_dirty(SimNet *net, int l)
{
  if (!net->link[l].dirty) {
    net->link[l].dirty = TRUE;
    sim_int_stack_push(&net->dirty_links, l);
  }
}

int sim_net_add(SimNet *net, int task, const int *links, int n_links, double bytes, double now)
{
  sim_net_account(net, links, n_links, bytes);
  return sim_net_resume(net, task, links, n_links, bytes, now);
}

void sim_net_account(SimNet *net, const int *links, int n_links, double bytes)
{
  for (int h = 0; h < n_links; h++)
    net->link_bytes[links[h]] += bytes;
}

gboolean sim_net_link_busy(const SimNet *net, int link)
{
  return net->link[link].n > 0;
}

void sim_net_flow_state(const SimNet *net, int slot, double *remaining, double *rate)
{
  *remaining = net->flow[slot].remaining;
  *rate = net->flow[slot].rate;
}

int sim_net_resume(SimNet *net, int task, const int *links, int n_links, double bytes,
                   double now)
{
  int slot;
  if (net->free_slots.n) {
    slot = net->free_slots.v[--net->free_slots.n];
  } else {
    if (net->n_flows == net->cap_flows) {
      net->cap_flows = net->cap_flows ? net->cap_flows * 2 : 64;
      net->flow = g_renew(Flow, net->flow, net->cap_flows);
    }
    slot = net->n_flows++;
    net->flow[slot].pos = NULL;
    net->flow[slot].n_links = 0;
  }
  Flow *f = &net->flow[slot];
  if (f->n_links < n_links || !f->pos) {
    g_free(f->pos);
    f->pos = g_new(int, n_links > 0 ? n_links : 1);
  }
  f->task = task;
  f->links = links;
  f->n_links = n_links;
  f->remaining = bytes;
  f->rate = 0.0;
  f->last = now;
  f->fixed = FALSE;
  f->in_comp = FALSE;
  for (int h = 0; h < n_links; h++) {
    Link *l = &net->link[links[h]];
    if (l->n == l->cap) {
      l->cap = l->cap ? l->cap * 2 : 8;
      l->flows = g_renew(int, l->flows, l->cap);
      l->hop = g_renew(int, l->hop, l->cap);
    }
    f->pos[h] = l->n;
    l->hop[l->n] = h;
    l->flows[l->n++] = slot;
    mark_dirty(net, links[h]);
  }
  net->n_active++;
  return slot;
}

void sim_net_remove(SimNet *net, int slot, double now)
{
  Flow *f = &net->flow[slot];
  for (int h = 0; h < f->n_links; h++) {
    Link *l = &net->link[f->links[h]];
    /* Swap-remove, and tell the moved entry its new position on this link (through
     * the hop it stands for: a flow may cross a link more than once, a collective's
     * ring through a shared bridge). */
    int p = f->pos[h];
    int last = --l->n;
    l->flows[p] = l->flows[last];
    l->hop[p] = l->hop[last];
    net->flow[l->flows[p]].pos[l->hop[p]] = p;
    mark_dirty(net, f->links[h]);
  }
  f->task = -1;
  net->n_active--;
  sim_int_stack_push(&net->free_slots, slot);
}

/* Gives flow @f the rate @r from @now on, settling the bytes it drained at its old rate,
 * and reports its new end if the rate changed. */
static inline void set_rate(Flow *f, double r, double now, SimNetRescheduleFunc fn, void *user)
{
  if (r == f->rate)
    return;
  f->remaining -= f->rate * (now - f->last);
  if (f->remaining < 0)
    f->remaining = 0;
  f->last = now;
  f->rate = r;
  fn(user, f->task, f->rate > 0 ? now + f->remaining / f->rate : INFINITY);
}

void sim_net_update(SimNet *net, double now, SimNetRescheduleFunc fn, void *user)
{
  if (!net->dirty_links.n)
    return;
  /* The component: every link reachable from a dirty link through shared flows. */
  SimIntStack *cl = &net->comp_links, *cf = &net->comp_flows;
  cl->n = 0;
  cf->n = 0;
  for (int i = 0; i < net->dirty_links.n; i++) {
    int l = net->dirty_links.v[i];
    net->link[l].dirty = FALSE;
    /* A link that a flow left empty has nothing to share. */
    if (net->link[l].n > 0 && !net->link[l].in_comp) {
      net->link[l].in_comp = TRUE;
      sim_int_stack_push(cl, l);
    }
  }
  net->dirty_links.n = 0;
  for (int i = 0; i < cl->n; i++) {
    Link *l = &net->link[cl->v[i]];
    for (int k = 0; k < l->n; k++) {
      int s = l->flows[k];
      Flow *f = &net->flow[s];
      if (f->in_comp)
        continue;
      f->in_comp = TRUE;
      sim_int_stack_push(cf, s);
      for (int h = 0; h < f->n_links; h++) {
        Link *l2 = &net->link[f->links[h]];
        if (!l2->in_comp) {
          l2->in_comp = TRUE;
          sim_int_stack_push(cl, f->links[h]);
        }
      }
    }
  }
  /* The component is found in the order the links became dirty and their flows were
   * added, which the event order fixes: the filling, and its rounding, are deterministic
   * without sorting. */

  int *links = cl->v;
  int nl = cl->n;
  for (int i = 0; i < nl; i++)
    net->link[links[i]].in_comp = FALSE;
  if (cf->n == 1) {
    /* A flow alone on its links (the common case: a collective inside a node, a transfer
     * on an idle route) gets what the filling's one round would give it: the smallest of
     * its links' capacities over the times it crosses each. */
    Flow *f = &net->flow[cf->v[0]];
    f->in_comp = FALSE;
    double share = INFINITY;
    for (int h = 0; h < f->n_links; h++) {
      const Link *l = &net->link[f->links[h]];
      double s = l->capacity / l->n;
      if (s < share)
        share = s;
    }
    set_rate(f, MAX(share, 0), now, fn, user);
    return;
  }
  for (int i = 0; i < nl; i++) {
    Link *l = &net->link[links[i]];
    l->rem = l->capacity;
    l->cnt = l->n;
  }
  int unfixed = cf->n;
  for (int i = 0; i < cf->n; i++) {
    net->flow[cf->v[i]].fixed = FALSE;
    net->flow[cf->v[i]].in_comp = FALSE;
  }
  /* Each round fixes the flows of every link whose fair share is the smallest: in exact
   * arithmetic fixing one of them leaves the others' shares where they were, and symmetric
   * collectives have many such links.  Links left without unfixed flows drop out of the
   * scan, which keeps its order. */
  SimIntStack *tied = &net->tied;
  int n_live = nl;
  while (unfixed > 0 && n_live > 0) {
    double share = INFINITY;
    int k = 0;
    for (int i = 0; i < n_live; i++) {
      Link *l = &net->link[links[i]];
      if (l->cnt <= 0)
        continue;
      links[k++] = links[i];
      l->share = l->rem / l->cnt;
      if (l->share < share)
        share = l->share;
    }
    n_live = k;
    if (n_live == 0)
      break;
    tied->n = 0;
    for (int i = 0; i < n_live; i++)
      if (net->link[links[i]].share == share)
        sim_int_stack_push(tied, links[i]);
    if (share < 0)
      share = 0;
    for (int t = 0; t < tied->n; t++) {
      Link *bl = &net->link[tied->v[t]];
      for (int q = 0; q < bl->n; q++) {
        Flow *f = &net->flow[bl->flows[q]];
        if (f->fixed)
          continue;
        f->fixed = TRUE;
        unfixed--;
        set_rate(f, share, now, fn, user);
        for (int h = 0; h < f->n_links; h++) {
          Link *l2 = &net->link[f->links[h]];
          l2->rem -= share;
          l2->cnt--;
        }
      }
    }
  }
}

const double *sim_net_link_bytes(const SimNet *net)
{
  return net->link_bytes;
}

int sim_net_n_active(const SimNet *net)
{
  return net->n_active;
}
