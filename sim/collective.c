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
 * half in both directions at once after 2 * depth step latencies.
 *
 * The hierarchical all-reduce reduce-scatters inside each node, all-reduces the shards
 * across nodes (one ring per local rank, in parallel) and all-gathers inside each node. */
#include "taskgraph.h"

#include <math.h>

SimCollParams sim_coll_params_default(void)
{
  /* NCCL's ring all-reduce on 8 A100s over NVSwitch reaches a bus bandwidth of about
   * 230 GB/s of the 300 GB/s per direction (NCCL tests; shared/data/vtrain allreduce
   * files), and pays some microseconds per step; experiments/validate-vtrain calibrates
   * both on those files and the simulate command can override them. */
  return (SimCollParams){ .bandwidth_efficiency = 0.78, .step_latency = 2e-6,
                          .base_latency = 0 };
}

typedef struct {
  SimTaskGraph *tg;
  int block;
  SimMachine *m;
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

static void dep(Ctx *c, SimTaskRef a, SimTaskRef b)
{
  sim_taskgraph_depend(c->tg, c->block, a, b);
}

static void ring_channel(Ctx *c, const int *dev, int n, int steps, double chunk,
                         SimTaskRef start, SimTaskRef end);

/* A ring of @steps steps over @dev, each moving @chunk bytes per rank, between the join
 * points @start and @end.  A ring over several nodes, each holding g > 1 of its ranks in a
 * row, runs as g channels (NCCL's rings), each with the ranks of every node rotated by one
 * more place, so that each channel leaves every node from a different GPU, and so through
 * a different NIC: the nodes' NICs all carry a share of the traffic. */
static void ring(Ctx *c, const int *dev, int n, int steps, double chunk, SimTaskRef start,
                 SimTaskRef end)
{
  int g = 1;
  while (g < n && sim_machine_device_node(c->m, dev[g]) == sim_machine_device_node(c->m, dev[0]))
    g++;
  gboolean channels = g > 1 && g < n && n % g == 0;
  for (int k = 0; channels && k < n; k++)
    channels = sim_machine_device_node(c->m, dev[k]) ==
               sim_machine_device_node(c->m, dev[(k / g) * g]) &&
               (k % g != 0 || k == 0 ||
                sim_machine_device_node(c->m, dev[k]) != sim_machine_device_node(c->m, dev[k - 1]));
  if (!channels) {
    ring_channel(c, dev, n, steps, chunk, start, end);
    return;
  }
  int *order = g_new(int, n);
  for (int ch = 0; ch < g; ch++) {
    for (int node = 0; node < n / g; node++)
      for (int i = 0; i < g; i++)
        order[node * g + i] = dev[node * g + (i + ch) % g];
    ring_channel(c, order, n, steps, chunk / g, start, end);
  }
  g_free(order);
}

static void ring_channel(Ctx *c, const int *dev, int n, int steps, double chunk,
                         SimTaskRef start, SimTaskRef end)
{
  if (c->detail == SIM_DETAIL_COLLECTIVE) {
    /* One flow over every link of the ring, as often as the ring crosses it. */
    GArray *links = g_array_new(FALSE, FALSE, sizeof(int));
    double lat = 0;
    for (int i = 0; i < n; i++) {
      int hops;
      const int *r = sim_machine_route(c->m, dev[i], dev[(i + 1) % n], &hops);
      g_array_append_vals(links, r, (guint)hops);
      lat = MAX(lat, sim_machine_latency(c->m, dev[i], dev[(i + 1) % n]));
    }
    SimTaskRef f = sim_taskgraph_add_collective_flow(
      c->tg, c->block, c->cls, (const int *)links->data, (int)links->len, dev, n, chunk * steps,
      steps * (lat + c->cp->step_latency), c->op, c->mb, c->coll);
    g_array_free(links, TRUE);
    dep(c, start, f);
    dep(c, f, end);
    return;
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

static int tree_depth(int n)
{
  int d = 0;
  while ((1 << d) < n)
    d++;
  return d;
}

static void tree_allreduce(Ctx *c, const int *dev, int n, double bytes, SimTaskRef start,
                           SimTaskRef end)
{
  int depth = tree_depth(n);
  double half = bytes / 2;
  if (c->detail == SIM_DETAIL_COLLECTIVE) {
    /* One flow over both trees' edges, both ways: each carries half of the buffer. */
    GArray *links = g_array_new(FALSE, FALSE, sizeof(int));
    double lat = 0;
    for (int tree = 0; tree < 2; tree++)
      for (int i = 1; i < n; i++) {
        int a = tree ? dev[n - 1 - i] : dev[i];
        int b = tree ? dev[n - 1 - (i - 1) / 2] : dev[(i - 1) / 2];
        for (int dir = 0; dir < 2; dir++) {
          int hops;
          const int *r = sim_machine_route(c->m, dir ? b : a, dir ? a : b, &hops);
          g_array_append_vals(links, r, (guint)hops);
        }
        lat = MAX(lat, sim_machine_latency(c->m, a, b));
      }
    SimTaskRef f = sim_taskgraph_add_collective_flow(
      c->tg, c->block, c->cls, (const int *)links->data, (int)links->len, dev, n, half,
      2 * depth * (lat + c->cp->step_latency), c->op, c->mb, c->coll);
    g_array_free(links, TRUE);
    dep(c, start, f);
    dep(c, f, end);
    return;
  }
  for (int tree = 0; tree < 2; tree++) {
    for (int i = 1; i < n; i++) {
      int parent = (i - 1) / 2;
      /* The second tree mirrors the first, so that leaves of one are inner nodes of the
       * other. */
      int a = tree ? dev[n - 1 - i] : dev[i];
      int b = tree ? dev[n - 1 - parent] : dev[parent];
      double lat = sim_machine_latency(c->m, a, b);
      double extra = 2 * depth * c->cp->step_latency + (2 * depth - 1) * lat;
      SimTaskRef up = add_flow(c, a, b, half, extra);
      SimTaskRef down = add_flow(c, b, a, half, extra);
      dep(c, start, up);
      dep(c, start, down);
      dep(c, up, end);
      dep(c, down, end);
    }
  }
}

/* Groups @dev by node; returns FALSE unless every node holds the same number of them. */
static gboolean by_node(SimMachine *m, const int *dev, int n, int **groups, int *n_nodes,
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
static gboolean table_fixed_cost(SimMachine *m, const SimCollParams *cp, const int *devices,
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

void sim_collective_lower(SimTaskGraph *tg, int block, SimMachine *m, SimCollKind kind,
                          SimAllreduceAlgo algo, SimDetail detail, const SimCollParams *cp,
                          SimTaskClass cls, const int *devices, int n, double bytes, int op,
                          int mb, SimTaskRef *start, SimTaskRef *end)
{
  Ctx c = { tg, block, m, detail, cp, cls, op, mb, -1 };
  if (tg->track_collectives) {
    if (!tg->coll_devs)
      tg->coll_devs = g_ptr_array_new_with_free_func((GDestroyNotify)g_array_unref);
    GArray *set = g_array_sized_new(FALSE, FALSE, sizeof(int), (guint)n);
    g_array_append_vals(set, devices, (guint)n);
    c.coll = (int)tg->coll_devs->len;
    g_ptr_array_add(tg->coll_devs, set);
  }
  *start = add_nop(&c);
  *end = add_nop(&c);
  if (n <= 1 || bytes <= 0) {
    dep(&c, *start, *end);
    return;
  }
  /* The collective's fixed cost comes first: its kernel's launch and the handshake of its
   * ranks, before any byte moves. */
  double base = cp->base_latency;
  SimCollParams measured;
  if (kind == SIM_COLL_ALLREDUCE && table_fixed_cost(m, cp, devices, n, bytes, &base)) {
    measured = *cp;
    measured.step_latency = 0;
    c.cp = &measured;
    algo = SIM_ALLREDUCE_RING;
  }
  SimTaskRef first = *start;
  if (base > 0) {
    SimTask d = sim_task_delay(cls, devices[0], base);
    d.op = op;
    d.mb = mb;
    first = sim_taskgraph_add(tg, block, &d);
    dep(&c, *start, first);
  }
  if (kind == SIM_COLL_REDUCE_SCATTER || kind == SIM_COLL_ALLGATHER) {
    ring(&c, devices, n, n - 1, bytes / n, first, *end);
    return;
  }
  int *groups = NULL, n_nodes = 0, g = 0;
  if (algo == SIM_ALLREDUCE_HIERARCHICAL && by_node(m, devices, n, &groups, &n_nodes, &g)) {
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
    return;
  }
  if (algo == SIM_ALLREDUCE_TREE && n > 2) {
    tree_allreduce(&c, devices, n, bytes, first, *end);
    return;
  }
  ring(&c, devices, n, 2 * (n - 1), bytes / n, first, *end);
}

static void ring_bottleneck(SimMachine *m, const int *dev, int n, double *bw, double *lat)
{
  *bw = INFINITY;
  *lat = 0;
  for (int i = 0; i < n; i++) {
    int a = dev[i], b = dev[(i + 1) % n];
    double w = sim_machine_bandwidth(m, a, b);
    double l = sim_machine_latency(m, a, b);
    if (w < *bw)
      *bw = w;
    if (l > *lat)
      *lat = l;
  }
}

double sim_collective_time(SimMachine *m, SimCollKind kind, SimAllreduceAlgo algo,
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
  double bw, lat;
  ring_bottleneck(m, devices, n, &bw, &lat);
  bw *= cp->bandwidth_efficiency;
  int steps = kind == SIM_COLL_ALLREDUCE ? 2 * (n - 1) : n - 1;
  if (kind == SIM_COLL_ALLREDUCE && algo == SIM_ALLREDUCE_TREE && n > 2) {
    int depth = tree_depth(n);
    /* Each rank sends and receives the whole buffer once each way over both trees. */
    return cp->base_latency + 2 * depth * (lat + cp->step_latency) + bytes / bw;
  }
  return cp->base_latency + steps * (lat + cp->step_latency) + steps * (bytes / n) / bw;
}
