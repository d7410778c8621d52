/* collective.c — collectives expanded into flows, by algorithm and level of detail.
 *
 * Ring algorithms (NCCL's default for large messages): a reduce-scatter takes n-1 steps
 * in which every rank sends one n-th of the buffer to its successor, an all-gather the
 * same, an all-reduce both: 2(n-1) steps, so on a ring of bandwidth B and per-step
 * latency a it takes 2(n-1)/n * S/B + 2(n-1) a.
 *
 * At SIM_DETAIL_STEPS every step of every rank is its own flow, which waits for the chunk
 * it forwards (the previous rank's previous step) and for its own previous send.  At
 * SIM_DETAIL_FLOWS each rank sends one flow carrying all its steps' bytes, after the
 * latency of all its steps: n flows instead of 2n(n-1), the same time on an idle
 * network, and the same bandwidth share where links are contended.  At
 * SIM_DETAIL_COLLECTIVE the whole collective is one flow over the links of every rank's
 * route, each as often as the ring crosses it: one flow instead of n, again the same
 * time on an idle network; under contention it moves at its slowest link's share, which
 * is when the ring would end.
 *
 * Trees follow NCCL's double binary tree: two trees, each carrying half of the buffer,
 * whose reduction up and broadcast down are pipelined, so every tree edge carries its
 * half in both directions at once, after the latencies of the longest path to the root,
 * up and down.  Over several nodes the ranks of a node form a chain and the nodes' heads
 * the binary trees, in one channel per rank a node holds (trees_build()).
 *
 * The hierarchical all-reduce reduce-scatters inside each node, all-reduces the shards
 * across nodes (one ring per local rank, in parallel) and all-gathers inside each node. */
#include "collective.h"
#include "taskgraph.h"
#include "network.h"

#include <math.h>

SimCollParams sim_coll_params_default(void)
{
  /* NCCL's ring all-reduce on 8 A100s over NVSwitch reaches a bus bandwidth of about
   * 230 GB/s of the 300 GB/s per direction (NCCL tests; data/reference/vtrain allreduce
   * files), and pays some microseconds per step; experiments/validate-vtrain calibrates
   * both on those files and the simulate command can override them. */
  return (SimCollParams){ .bandwidth_efficiency = 0.78, .step_latency = 2e-6,
                          .base_latency = 0 };
}

double sim_coll_link_capacity(const SimMachine *m, const SimCollParams *cp, int link)
{
  double bw = sim_machine_link_bandwidth(m, link);
  if (!cp)
    return bw;
  SimLinkKind k = sim_machine_link_kind(m, link);
  if ((k == SIM_LINK_NIC || k == SIM_LINK_NETWORK) && cp->net_efficiency > 0)
    return bw * cp->net_efficiency;
  return bw * cp->bandwidth_efficiency;
}

typedef struct {
  SimTaskGraph *tg;
  int block;
  const SimMachine *m;
  SimDetail detail;
  const SimCollParams *cp;
  SimTaskClass cls;
  int op, mb;
  int coll;
} Ctx;

static SimTaskRef add_flow(Ctx *c, int src, int dst, double bytes, double extra_latency)
{
  SimTask t = sim_task_flow(c->cls, src, dst, bytes, c->op, c->mb);
  t.duration = extra_latency;
  t.coll = c->coll;
  return sim_taskgraph_add(c->tg, c->block, &t);
}

static SimTaskRef add_nop(Ctx *c)
{
  SimTask t = sim_task_nop();
  t.cls = c->cls;
  t.op = c->op;
  t.mb = c->mb;
  return sim_taskgraph_add(c->tg, c->block, &t);
}

/* A delay of @seconds on @device: a collective's fixed cost. */
static SimTaskRef add_delay(Ctx *c, int device, double seconds)
{
  SimTask t = sim_task_delay(c->cls, device, seconds);
  t.op = c->op;
  t.mb = c->mb;
  return sim_taskgraph_add(c->tg, c->block, &t);
}

static void dep(Ctx *c, SimTaskRef a, SimTaskRef b)
{
  sim_taskgraph_depend(c->tg, c->block, a, b);
}

static void ring_channel(Ctx *c, const int *dev, int n, int steps, double chunk,
                         SimTaskRef start, SimTaskRef end);

/* One flow over every link of a ring over @dev, as often as the ring crosses it, carrying
 * @steps chunks of @chunk bytes per rank (SIM_DETAIL_COLLECTIVE). */
static double ring_latency(Ctx *c, const int *dev, int n)
{
  double lat = 0;
  for (int i = 0; i < n; i++)
    lat = MAX(lat, sim_machine_latency(c->m, dev[i], dev[(i + 1) % n]));
  return lat;
}

/* A ring's one flow: its bytes and latency, for @steps chunks of @chunk bytes per rank and
 * its longest hop's latency @lat (ring_flow_lat(), sim_collective_node_ring_flow()). */
static void ring_flow_size(const SimCollParams *cp, int steps, double chunk, double lat,
                           double *bytes, double *latency)
{
  *bytes = chunk * steps;
  *latency = steps * (lat + cp->step_latency);
}

/* The same, its ring's latency given (ring_latency()). */
static SimTaskRef ring_flow_lat(Ctx *c, const int *dev, int n, int steps, double chunk,
                                double lat)
{
  double bytes, latency;
  ring_flow_size(c->cp, steps, chunk, lat, &bytes, &latency);
  return sim_taskgraph_add_ring_flow(c->tg, c->block, c->cls, c->m, dev, n, bytes, latency,
                                     c->op, c->mb, c->coll);
}

static SimTaskRef ring_flow(Ctx *c, const int *dev, int n, int steps, double chunk)
{
  return ring_flow_lat(c, dev, n, steps, chunk, ring_latency(c, dev, n));
}

/* A ring of @steps steps over @dev, each moving @chunk bytes per rank, between the join
 * points @start and @end.  A ring over several nodes, each holding g > 1 of its ranks in a
 * row, runs as g channels (NCCL's rings), each with the ranks of every node rotated by one
 * more place, so that each channel leaves every node from a different GPU, and so through
 * a different NIC: the nodes' NICs all carry a share of the traffic. */
/* How many channels a ring over @dev runs as (see ring()): the ranks a node holds in a
 * row, when every node holds as many, or 1. */
static int channel_count(const SimMachine *m, const int *dev, int n)
{
  int g = 1;
  while (g < n && sim_machine_device_node(m, dev[g]) == sim_machine_device_node(m, dev[0]))
    g++;
  gboolean channels = g > 1 && g < n && n % g == 0;
  for (int k = 0; channels && k < n; k++)
    channels = sim_machine_device_node(m, dev[k]) == sim_machine_device_node(m, dev[(k / g) * g]) &&
               (k % g != 0 || k == 0 ||
                sim_machine_device_node(m, dev[k]) != sim_machine_device_node(m, dev[k - 1]));
  return channels ? g : 1;
}

/* The channels of a ring over @dev (see ring()): their number, and in @order (n per
 * channel, freed by the caller) each channel's ranks in ring order. */
static int ring_channels(const SimMachine *m, const int *dev, int n, int **order)
{
  int g = channel_count(m, dev, n);
  int *o = *order = g_new(int, (size_t)g * n);
  for (int ch = 0; ch < g; ch++)
    for (int node = 0; node < n / g; node++)
      for (int i = 0; i < g; i++)
        o[(size_t)ch * n + node * g + i] = dev[node * g + (i + ch) % g];
  return g;
}

static void ring(Ctx *c, const int *dev, int n, int steps, double chunk, SimTaskRef start,
                 SimTaskRef end)
{
  if (channel_count(c->m, dev, n) == 1) {
    /* One channel: the ranks in their order (what ring_channels() gives). */
    ring_channel(c, dev, n, steps, chunk, start, end);
    return;
  }
  int *order;
  int g = ring_channels(c->m, dev, n, &order);
  for (int ch = 0; ch < g; ch++)
    ring_channel(c, order + (size_t)ch * n, n, steps, chunk / g, start, end);
  g_free(order);
}

/* Whether a ring over @dev is every GPU of one node, its ranks' routes of one latency
 * over distinct links of one capacity (SimCollParams.whole_node_rings). */
static gboolean node_ring(Ctx *c, const int *dev, int n)
{
  int nodes = sim_machine_n_nodes(c->m), nd = sim_machine_n_devices(c->m);
  if (n < 2 || n > 64 || nodes <= 0 || nd % nodes || n != nd / nodes)
    return FALSE;
  int node = sim_machine_device_node(c->m, dev[0]);
  const SimRoute *r0 = sim_machine_route_info(c->m, dev[0], dev[1]);
  if (!r0 || r0->n_links <= 0)
    return FALSE;
  double cap = sim_coll_link_capacity(c->m, c->cp, r0->links[0]);
  int seen[256], n_seen = 0;
  for (int i = 0; i < n; i++) {
    if (sim_machine_device_node(c->m, dev[i]) != node)
      return FALSE;
    const SimRoute *r = sim_machine_route_info(c->m, dev[i], dev[(i + 1) % n]);
    if (!r || r->latency != r0->latency || r->n_links <= 0)
      return FALSE;
    for (int h = 0; h < r->n_links; h++) {
      if (n_seen == (int)G_N_ELEMENTS(seen) ||
          sim_coll_link_capacity(c->m, c->cp, r->links[h]) != cap)
        return FALSE;
      for (int j = 0; j < n_seen; j++)
        if (seen[j] == r->links[h])
          return FALSE;
      seen[n_seen++] = r->links[h];
    }
  }
  return TRUE;
}

static void ring_channel(Ctx *c, const int *dev, int n, int steps, double chunk,
                         SimTaskRef start, SimTaskRef end)
{
  if (c->detail == SIM_DETAIL_COLLECTIVE) {
    SimTaskRef f = ring_flow(c, dev, n, steps, chunk);
    dep(c, start, f);
    dep(c, f, end);
    return;
  }
  if (c->detail == SIM_DETAIL_FLOWS && c->cp->whole_node_rings) {
    /* The block's rings remember which were checked: a tensor's reductions repeat over a
     * few groups in every micro-batch. */
    int k = sim_taskgraph_ring_find(c->tg, c->block, dev, n);
    SimTaskBlock *b = sim_taskgraph_block(c->tg, c->block);
    gboolean checked = k >= 0 && b->ring[k].checked;
    if (checked || node_ring(c, dev, n)) {
      double lat = checked ? b->ring[k].latency : ring_latency(c, dev, n);
      SimTaskRef f = ring_flow_lat(c, dev, n, steps, chunk, lat);
      if (k < 0)
        k = sim_taskgraph_ring_find(c->tg, c->block, dev, n);
      if (k >= 0) {
        b->ring[k].checked = TRUE;
        b->ring[k].latency = lat;
      }
      dep(c, start, f);
      dep(c, f, end);
      return;
    }
  }
  if (c->detail == SIM_DETAIL_FLOWS) {
    for (int i = 0; i < n; i++) {
      int src = dev[i], dst = dev[(i + 1) % n];
      double lat = sim_machine_latency(c->m, src, dst);
      /* The engine adds the route latency once; the other steps' latencies come here. */
      double extra = steps * c->cp->step_latency + (steps - 1) * lat;
      SimTaskRef f = add_flow(c, src, dst, chunk * steps, extra);
      dep(c, start, f);
      dep(c, f, end);
    }
    return;
  }
  if (steps <= 0) {
    /* A ring of one rank (a node's part of a hierarchical all-reduce over one rank per
     * node) has no step: nothing between its ends but the order. */
    dep(c, start, end);
    return;
  }
  SimTaskRef *prev = g_new(SimTaskRef, n);
  SimTaskRef *cur = g_new(SimTaskRef, n);
  for (int s = 0; s < steps; s++) {
    for (int i = 0; i < n; i++) {
      cur[i] = add_flow(c, dev[i], dev[(i + 1) % n], chunk, c->cp->step_latency);
      if (s == 0) {
        dep(c, start, cur[i]);
      } else {
        dep(c, prev[(i + n - 1) % n], cur[i]); /* the chunk it forwards */
        dep(c, prev[i], cur[i]);               /* its own previous send  */
      }
    }
    SimTaskRef *t = prev;
    prev = cur;
    cur = t;
  }
  for (int i = 0; i < n; i++)
    dep(c, prev[i], end);
  g_free(prev);
  g_free(cur);
}

/* NCCL's double binary trees over @dev, channel by channel.  Inside a node the ranks form
 * a chain whose first rank (its head) joins the tree over nodes; the second tree over
 * nodes mirrors the first, so that a node's head that is an inner vertex of one tree is a
 * leaf of the other.  Ranks spread evenly over several nodes run one channel per rank a
 * node holds, each with the node's ranks rotated by one more place (as ring() does), so
 * that each channel leaves every node from a different GPU and NIC; other sets of ranks
 * (one node, uneven nodes) form one channel of two binary trees over the ranks in order.
 * Each channel carries 1 / n_channels of the buffer, half of it on each tree. */
typedef struct {
  int n, n_channels;
  int *order;    /* per channel, n devices: the ranks in the channel's order            */
  int *parent;   /* per channel and tree, n positions into order; -1 at the root        */
  double *path;  /* per channel: the longest route from a rank to its tree's root, in
                  * link latency plus one step latency per edge, over both trees        */
} Trees;

static gboolean by_node(const SimMachine *m, const int *dev, int n, int **groups, int *n_nodes,
                        int *per_node);

static void trees_build(Trees *t, const SimMachine *m, const SimCollParams *cp, const int *dev,
                        int n)
{
  int *groups = NULL, nn = 0, g = 0;
  gboolean nodes = by_node(m, dev, n, &groups, &nn, &g);
  t->n = n;
  t->n_channels = nodes ? g : 1;
  int C = t->n_channels;
  t->order = g_new(int, (size_t)C * n);
  t->parent = g_new(int, (size_t)C * 2 * n);
  t->path = g_new0(double, C);
  for (int c = 0; c < C; c++) {
    int *ord = t->order + (size_t)c * n;
    for (int tree = 0; tree < 2; tree++) {
      int *par = t->parent + ((size_t)c * 2 + tree) * n;
      if (nodes) {
        for (int k = 0; k < nn; k++)
          for (int i = 0; i < g; i++) {
            ord[k * g + i] = groups[k * g + (i + c) % g];
            par[k * g + i] = k * g + i - 1; /* up the chain to the head */
          }
        for (int k = 0; k < nn; k++) {
          /* Tree 0 numbers the nodes 0..N-1 as a binary heap; tree 1 numbers them from
           * the other end. */
          int j = tree ? nn - 1 - k : k;
          int pj = j > 0 ? (j - 1) / 2 : -1;
          int pk = pj < 0 ? -1 : tree ? nn - 1 - pj : pj;
          par[k * g] = pk < 0 ? -1 : pk * g;
        }
      } else {
        for (int p = 0; p < n; p++) {
          ord[p] = dev[p];
          int i = tree ? n - 1 - p : p;
          int pi = i > 0 ? (i - 1) / 2 : -1;
          par[p] = pi < 0 ? -1 : tree ? n - 1 - pi : pi;
        }
      }
      /* The longest route to the root: walk each rank up to it (a chain inside a node,
       * then logarithmically many nodes). */
      for (int p = 0; p < n; p++) {
        double d = 0;
        for (int q = p; par[q] >= 0; q = par[q])
          d += sim_machine_latency(m, ord[q], ord[par[q]]) + cp->step_latency;
        t->path[c] = MAX(t->path[c], d);
      }
    }
  }
  g_free(groups);
}

static void trees_clear(Trees *t)
{
  g_free(t->order);
  g_free(t->parent);
  g_free(t->path);
}

static void tree_allreduce(Ctx *c, const int *dev, int n, double bytes, SimTaskRef start,
                           SimTaskRef end)
{
  Trees t;
  trees_build(&t, c->m, c->cp, dev, n);
  /* Every tree edge carries its tree's share both ways at once: the reduction up and the
   * broadcast down are pipelined, after the longest path's latencies each way. */
  double share = bytes / (2.0 * t.n_channels);
  for (int ch = 0; ch < t.n_channels; ch++) {
    const int *ord = t.order + (size_t)ch * n;
    double lat = 2 * t.path[ch];
    if (c->detail == SIM_DETAIL_COLLECTIVE) {
      /* One flow over both trees' edges, both ways, each as often as the trees use it. */
      GArray *links = g_array_new(FALSE, FALSE, sizeof(int));
      for (int tree = 0; tree < 2; tree++) {
        const int *par = t.parent + ((size_t)ch * 2 + tree) * n;
        for (int p = 0; p < n; p++) {
          if (par[p] < 0)
            continue;
          for (int dir = 0; dir < 2; dir++) {
            int hops;
            const int *r = sim_machine_route(c->m, dir ? ord[par[p]] : ord[p],
                                             dir ? ord[p] : ord[par[p]], &hops);
            g_array_append_vals(links, r, (guint)hops);
          }
        }
      }
      SimTaskRef f = sim_taskgraph_add_collective_flow(
        c->tg, c->block, c->cls, (const int *)links->data, (int)links->len, ord, n, share, lat,
        c->op, c->mb, c->coll);
      g_array_free(links, TRUE);
      dep(c, start, f);
      dep(c, f, end);
      continue;
    }
    for (int tree = 0; tree < 2; tree++) {
      const int *par = t.parent + ((size_t)ch * 2 + tree) * n;
      for (int p = 0; p < n; p++) {
        if (par[p] < 0)
          continue;
        int a = ord[p], b = ord[par[p]];
        /* The engine adds the route's latency once. */
        double extra = lat - sim_machine_latency(c->m, a, b);
        SimTaskRef up = add_flow(c, a, b, share, extra);
        SimTaskRef down = add_flow(c, b, a, share, extra);
        dep(c, start, up);
        dep(c, start, down);
        dep(c, up, end);
        dep(c, down, end);
      }
    }
  }
  trees_clear(&t);
}

/* Groups @dev by node; returns FALSE unless every node holds the same number of them. */
static gboolean by_node(const SimMachine *m, const int *dev, int n, int **groups, int *n_nodes,
                        int *per_node)
{
  GHashTable *idx = g_hash_table_new(g_direct_hash, g_direct_equal);
  GArray *nodes = g_array_new(FALSE, FALSE, sizeof(int));
  for (int i = 0; i < n; i++) {
    int node = sim_machine_device_node(m, dev[i]);
    if (!g_hash_table_contains(idx, GINT_TO_POINTER(node + 1))) {
      g_hash_table_insert(idx, GINT_TO_POINTER(node + 1), GINT_TO_POINTER(nodes->len));
      g_array_append_val(nodes, node);
    }
  }
  int nn = (int)nodes->len;
  int *count = g_new0(int, nn);
  for (int i = 0; i < n; i++)
    count[GPOINTER_TO_INT(g_hash_table_lookup(
      idx, GINT_TO_POINTER(sim_machine_device_node(m, dev[i]) + 1)))]++;
  gboolean ok = nn > 1 && n % nn == 0;
  for (int k = 0; ok && k < nn; k++)
    ok = count[k] == n / nn;
  if (ok) {
    int g = n / nn;
    int *out = g_new(int, n);
    int *fill = g_new0(int, nn);
    for (int i = 0; i < n; i++) {
      int k = GPOINTER_TO_INT(g_hash_table_lookup(
        idx, GINT_TO_POINTER(sim_machine_device_node(m, dev[i]) + 1)));
      out[k * g + fill[k]++] = dev[i];
    }
    g_free(fill);
    *groups = out;
    *n_nodes = nn;
    *per_node = g;
  }
  g_free(count);
  g_array_free(nodes, TRUE);
  g_hash_table_destroy(idx);
  return ok;
}

/* With a table of measured all-reduces (colltable.c), an all-reduce over ranks of one node,
 * of a group size the table holds: the fixed cost that makes the ring's time on an idle
 * network the measured one.  The measurement includes the per-step costs, so the ring then
 * runs without them.  FALSE when the table does not apply. */
static gboolean table_fixed_cost(const SimMachine *m, const SimCollParams *cp, const int *devices,
                                 int n, double bytes, double *fixed)
{
  if (!cp->allreduce_table || n < 2 || bytes <= 0)
    return FALSE;
  int node = sim_machine_device_node(m, devices[0]);
  for (int i = 1; i < n; i++)
    if (sim_machine_device_node(m, devices[i]) != node)
      return FALSE;
  double at = bytes;
  double measured = sim_coll_table_lookup(cp->allreduce_table, n, bytes, &at);
  if (measured < 0)
    return FALSE;
  /* What the ring's flows take on their own: the ring model without fixed costs. */
  SimCollParams bare = *cp;
  bare.step_latency = 0;
  bare.base_latency = 0;
  bare.allreduce_table = NULL;
  double flows = sim_collective_time(m, SIM_COLL_ALLREDUCE, SIM_ALLREDUCE_RING, &bare, devices,
                                     n, at);
  *fixed = MAX(0, measured - flows);
  return TRUE;
}

static void lower(SimTaskGraph *tg, int block, const SimMachine *m, SimCollKind kind,
                  SimAllreduceAlgo algo, SimDetail detail, const SimCollParams *cp,
                  SimTaskClass cls, const int *devices, int n, double bytes, int op, int mb,
                  gboolean bare, SimTaskRef *start, SimTaskRef *end)
{
  Ctx c = { tg, block, m, detail, cp, cls, op, mb, -1 };
  if (tg->track_collectives) {
    if (!tg->coll_devs)
      tg->coll_devs = g_ptr_array_new_with_free_func((GDestroyNotify)g_array_unref);
    if (!tg->coll_last)
      tg->coll_last = g_new0(GArray *, MAX(tg->n_devices, 1));
    GArray **last = n > 0 && devices[0] >= 0 && devices[0] < tg->n_devices
                      ? &tg->coll_last[devices[0]] : NULL;
    GArray *set;
    if (last && *last && (*last)->len == (guint)n &&
        !memcmp((*last)->data, devices, sizeof(int) * (size_t)n)) {
      set = g_array_ref(*last);
    } else {
      set = g_array_sized_new(FALSE, FALSE, sizeof(int), (guint)n);
      g_array_append_vals(set, devices, (guint)n);
      if (last)
        *last = set;
    }
    c.coll = (int)tg->coll_devs->len;
    g_ptr_array_add(tg->coll_devs, set);
  }
  gboolean empty = n <= 1 || bytes <= 0;
  /* The collective's fixed cost comes first: its kernel's launch and the handshake of its
   * ranks, before any byte moves. */
  double base = cp->base_latency;
  SimCollParams measured;
  if (!empty && kind == SIM_COLL_ALLREDUCE && table_fixed_cost(m, cp, devices, n, bytes, &base)) {
    measured = *cp;
    measured.step_latency = 0;
    c.cp = &measured;
    algo = SIM_ALLREDUCE_RING;
  }
  /* The algorithm's shape: an all-reduce over nodes in groups (hierarchical), NCCL's trees,
   * or rings (the rest). */
  int *groups = NULL, n_nodes = 0, g = 0;
  gboolean hier = !empty && kind == SIM_COLL_ALLREDUCE && algo == SIM_ALLREDUCE_HIERARCHICAL &&
                  by_node(m, devices, n, &groups, &n_nodes, &g);
  gboolean tree = !empty && kind == SIM_COLL_ALLREDUCE && algo == SIM_ALLREDUCE_TREE && n > 2;
  int steps = kind == SIM_COLL_ALLREDUCE ? 2 * (n - 1) : n - 1;
  if (bare && !empty && !hier && !tree && detail == SIM_DETAIL_COLLECTIVE &&
      channel_count(m, devices, n) == 1) {
    /* One ring of one channel is one flow: the fixed cost's delay, if any, and the flow are
     * the collective's first and last tasks, with no join points around them. */
    *start = base > 0 ? add_delay(&c, devices[0], base) : (SimTaskRef){ -1, -1 };
    *end = ring_flow(&c, devices, n, steps, bytes / n);
    if (base > 0)
      dep(&c, *start, *end);
    else
      *start = *end;
    return;
  }
  *start = add_nop(&c);
  *end = add_nop(&c);
  if (empty) {
    dep(&c, *start, *end);
    return;
  }
  SimTaskRef first = *start;
  if (base > 0) {
    first = add_delay(&c, devices[0], base);
    dep(&c, *start, first);
  }
  if (hier) {
    SimTaskRef mid1 = add_nop(&c), mid2 = add_nop(&c);
    for (int k = 0; k < n_nodes; k++)
      ring(&c, groups + k * g, g, g - 1, bytes / g, first, mid1);
    if (g == 1)
      dep(&c, first, mid1);
    int *across = g_new(int, n_nodes);
    for (int r = 0; r < g; r++) {
      for (int k = 0; k < n_nodes; k++)
        across[k] = groups[k * g + r];
      ring(&c, across, n_nodes, 2 * (n_nodes - 1), bytes / g / n_nodes, mid1, mid2);
    }
    g_free(across);
    for (int k = 0; k < n_nodes; k++)
      ring(&c, groups + k * g, g, g - 1, bytes / g, mid2, *end);
    if (g == 1)
      dep(&c, mid2, *end);
    g_free(groups);
  } else if (tree) {
    tree_allreduce(&c, devices, n, bytes, first, *end);
  } else {
    ring(&c, devices, n, steps, bytes / n, first, *end);
  }
}

void sim_collective_lower(SimTaskGraph *tg, int block, const SimMachine *m, const SimCollective *c,
                          SimTaskRef *start, SimTaskRef *end)
{
  lower(tg, block, m, c->kind, c->algo, c->detail, c->params, c->cls, c->devices, c->n,
        c->bytes, c->op, c->mb, FALSE, start, end);
}

void sim_collective_lower_bare(SimTaskGraph *tg, int block, const SimMachine *m,
                               const SimCollective *c, SimTaskRef *start, SimTaskRef *end)
{
  lower(tg, block, m, c->kind, c->algo, c->detail, c->params, c->cls, c->devices, c->n,
        c->bytes, c->op, c->mb, TRUE, start, end);
}

gboolean sim_collective_node_ring(const SimMachine *m, const SimCollective *c, int32_t *links,
                                  int cap, int *n_links, double *hop_latency)
{
  /* lower()'s choices: no fixed cost (a base latency, a measured table's), no trees or
   * hierarchy, one channel, and ring_channel()'s whole ring of a node. */
  const SimCollParams *cp = c->params;
  int n = c->n;
  if (c->detail != SIM_DETAIL_FLOWS || !cp->whole_node_rings || n <= 1 ||
      cp->base_latency > 0 || (c->kind == SIM_COLL_ALLREDUCE && cp->allreduce_table) ||
      (c->kind == SIM_COLL_ALLREDUCE && c->algo != SIM_ALLREDUCE_RING) ||
      channel_count(m, c->devices, n) != 1)
    return FALSE;
  Ctx x = { NULL, -1, m, c->detail, cp, c->cls, c->op, c->mb, -1 };
  if (!node_ring(&x, c->devices, n))
    return FALSE;
  int total = 0;
  for (int i = 0; i < n; i++) {
    int hops;
    const int *r = sim_machine_route(m, c->devices[i], c->devices[(i + 1) % n], &hops);
    if (total + hops > cap)
      return FALSE;
    memcpy(links + total, r, sizeof(int32_t) * (size_t)hops);
    total += hops;
  }
  *n_links = total;
  *hop_latency = ring_latency(&x, c->devices, n);
  return TRUE;
}

void sim_collective_node_ring_flow(const SimCollective *c, double hop_latency, double *bytes,
                                   double *latency)
{
  int n = c->n;
  int steps = c->kind == SIM_COLL_ALLREDUCE ? 2 * (n - 1) : n - 1;
  /* lower()'s steps, ring()'s chunk and ring_flow_lat()'s flow. */
  ring_flow_size(c->params, steps, c->bytes / n, hop_latency, bytes, latency);
}

/* What the busiest link takes to carry the transfers @edges (a source, a destination and
 * bytes each) at once, at the collectives' share of its bandwidth. */
typedef struct {
  int a, b;
  double bytes;
} Edge;

/* A thread's bytes per link for load_time(), every entry 0 between calls: the calls come
 * by the hundred thousand (tensor-parallel overlap prices a collective per GEMM and
 * micro-batch), and zeroing a fresh array of every link of a large machine each time took
 * a sixth of a brief run. */
typedef struct {
  int n;
  double v[];
} LinkLoad;

static GPrivate link_load = G_PRIVATE_INIT(g_free);

static double load_time(const SimMachine *m, const SimCollParams *cp, const GArray *edges)
{
  int nl = MAX(sim_machine_n_links(m), 1);
  LinkLoad *ll = g_private_get(&link_load);
  if (!ll || ll->n < nl) {
    ll = g_malloc0(sizeof(LinkLoad) + sizeof(double) * (size_t)nl);
    ll->n = nl;
    g_private_replace(&link_load, ll);
  }
  double *load = ll->v;
  double worst = 0;
  for (guint i = 0; i < edges->len; i++) {
    const Edge *e = &g_array_index(edges, Edge, i);
    int hops;
    const int *r = sim_machine_route(m, e->a, e->b, &hops);
    for (int h = 0; h < hops; h++) {
      load[r[h]] += e->bytes;
      worst = MAX(worst, load[r[h]] / sim_coll_link_capacity(m, cp, r[h]));
    }
  }
  /* Back to 0, link by link. */
  for (guint i = 0; i < edges->len; i++) {
    const Edge *e = &g_array_index(edges, Edge, i);
    int hops;
    const int *r = sim_machine_route(m, e->a, e->b, &hops);
    for (int h = 0; h < hops; h++)
      load[r[h]] = 0;
  }
  return worst;
}

/* A ring's steps over @dev (@n ranks, @per_hop bytes on every hop) added to @edges; returns
 * the largest hop latency. */
static double ring_edges(const SimMachine *m, const int *dev, int n, double per_hop, GArray *edges)
{
  double lat = 0;
  for (int i = 0; i < n; i++) {
    Edge e = { dev[i], dev[(i + 1) % n], per_hop };
    g_array_append_val(edges, e);
    lat = MAX(lat, sim_machine_latency(m, e.a, e.b));
  }
  return lat;
}

double sim_collective_time(const SimMachine *m, SimCollKind kind, SimAllreduceAlgo algo,
                           const SimCollParams *cp, const int *devices, int n, double bytes)
{
  if (n <= 1 || bytes <= 0)
    return 0;
  double fixed;
  if (kind == SIM_COLL_ALLREDUCE && table_fixed_cost(m, cp, devices, n, bytes, &fixed)) {
    SimCollParams bare = *cp;
    bare.step_latency = 0;
    bare.base_latency = fixed;
    bare.allreduce_table = NULL;
    return sim_collective_time(m, kind, SIM_ALLREDUCE_RING, &bare, devices, n, bytes);
  }
  if (kind == SIM_COLL_ALLREDUCE && algo == SIM_ALLREDUCE_TREE && n > 2) {
    /* Every tree edge carries its channel's half both ways; the longest path's latencies
     * are paid going up and coming down. */
    Trees t;
    trees_build(&t, m, cp, devices, n);
    GArray *edges = g_array_new(FALSE, FALSE, sizeof(Edge));
    double share = bytes / (2.0 * t.n_channels), path = 0;
    for (int ch = 0; ch < t.n_channels; ch++) {
      const int *ord = t.order + (size_t)ch * n;
      path = MAX(path, t.path[ch]);
      for (int k = 0; k < 2 * n; k++) {
        int p = k % n, q = t.parent[(size_t)ch * 2 * n + k];
        if (q < 0)
          continue;
        Edge up = { ord[p], ord[q], share }, down = { ord[q], ord[p], share };
        g_array_append_val(edges, up);
        g_array_append_val(edges, down);
      }
    }
    double time = cp->base_latency + 2 * path + load_time(m, cp, edges);
    g_array_free(edges, TRUE);
    trees_clear(&t);
    return time;
  }
  int *groups = NULL, nn = 0, g = 0;
  if (kind == SIM_COLL_ALLREDUCE && algo == SIM_ALLREDUCE_HIERARCHICAL &&
      by_node(m, devices, n, &groups, &nn, &g)) {
    /* Three phases, one after the other: a reduce-scatter inside every node (g - 1 steps of
     * S / g), an all-reduce of each shard across the nodes (one ring per local rank,
     * 2(N - 1) steps of S / (g N)), an all-gather inside every node like the first. */
    double inside = 0, across;
    GArray *edges = g_array_new(FALSE, FALSE, sizeof(Edge));
    if (g > 1) {
      double lat = 0;
      for (int k = 0; k < nn; k++) {
        double l = ring_edges(m, groups + k * g, g, (g - 1) * (bytes / g), edges);
        lat = MAX(lat, l);
      }
      inside = (g - 1) * (lat + cp->step_latency) + load_time(m, cp, edges);
      g_array_set_size(edges, 0);
    }
    int *ring = g_new(int, nn);
    double lat = 0;
    for (int r = 0; r < g; r++) {
      for (int k = 0; k < nn; k++)
        ring[k] = groups[k * g + r];
      double l = ring_edges(m, ring, nn, 2 * (nn - 1) * (bytes / g / nn), edges);
      lat = MAX(lat, l);
    }
    across = 2 * (nn - 1) * (lat + cp->step_latency) + load_time(m, cp, edges);
    g_free(ring);
    g_array_free(edges, TRUE);
    g_free(groups);
    return cp->base_latency + 2 * inside + across;
  }
  /* A ring: each channel's hops carry its steps' share of the buffer. */
  int steps = kind == SIM_COLL_ALLREDUCE ? 2 * (n - 1) : n - 1;
  int *order;
  int ch = ring_channels(m, devices, n, &order);
  GArray *edges = g_array_new(FALSE, FALSE, sizeof(Edge));
  double lat = 0;
  for (int k = 0; k < ch; k++) {
    double l = ring_edges(m, order + (size_t)k * n, n, steps * (bytes / n / ch), edges);
    lat = MAX(lat, l);
  }
  double time = cp->base_latency + steps * (lat + cp->step_latency) + load_time(m, cp, edges);
  g_array_free(edges, TRUE);
  g_free(order);
  return time;
}
