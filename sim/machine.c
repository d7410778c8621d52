/* machine.c — machines: the expansion of a description into vertices and directed links,
 * the routes between devices, queries, and the embedded library of machines.
 *
 * Layout.  Every node has the same vertices and links in the same order, so node n's
 * vertices are [n * vpn, (n + 1) * vpn) and its links [n * lpn, (n + 1) * lpn), with its
 * GPUs first: device d = n * gpus + i is vertex n * vpn + i.  The network's vertices and
 * links follow all nodes.  A full-duplex cable is two directed links, one per direction,
 * each with the full per-direction bandwidth, so traffic one way never slows the other.
 *
 * Routes.  A route inside a node is the best path in node 0, shifted to the node: best
 * means the smallest sum of link latencies, then the fewest hops, then the widest
 * bottleneck, then the first found (vertices and links in index order), and GPUs and NICs
 * are never crossed on the way.  NVLink comes first: when the NVLink or NVSwitch links
 * alone join two GPUs, the route uses only them, whatever the PCIe latencies say; a DGX-1
 * pair without a direct NVLink goes over PCIe and the inter-socket link (NCCL would relay
 * through a third GPU's NVLinks, which a route between two devices does not model).
 * Between nodes a route leaves through the source GPU's NIC and enters through the
 * destination GPU's NIC; a GPU's NIC is its nearest one over PCIe, GPUs that tie sharing
 * the tied NICs in turn (on a DGX A100, GPU i uses NIC i: one rail per GPU).  In the
 * network, a route climbs to a spine only when the two NICs hang under different leaves,
 * and it picks the spine by a hash of the (source, destination) pair, as ECMP does, so
 * the pairs of a collective spread over the spines deterministically; in a rail-
 * optimized network the pair hashed is the pair of nodes, the same on every rail.  There
 * a message to a GPU on another rail first crosses NVLink to the sending node's GPU of the
 * destination's rail and leaves through that GPU's NIC, as NCCL's PXN sends it
 * (build_pxn()), unless the network's "pxn" is false.
 *
 * Routes are computed on first use and cached, under route_lock since search workers
 * query the same machine from several threads.  Nothing is precomputed per pair of
 * devices: loading a 3,072-GPU machine (dgx-a100:384) only lays out its 34,816 links and
 * the paths inside one node.
 */
#include "sim-private.h"

#include "parasol-resources.h"

#include <json-glib/json-glib.h>
#include <math.h>
#include <string.h>

/* Entries of the route cache of machines too large for a route table (a power of 2). */
#define ROUTE_CACHE (1u << 16)

#define LIBRARY_DIR "/org/parasol/data/machines/"

typedef struct {
  int n;
  int *links;              /* link ids of node 0                                      */
} LocalPath;

/* The machine with what routing needs beyond the public struct; SimMachine pointers that
 * callers hold point at its first member. */
typedef struct {
  SimMachine pub;
  SimMachineDesc *desc;
  int vpn, lpn;            /* vertices and links per node                             */
  int v_nvswitch, v_socket, v_switch, v_nic;  /* local vertex offsets                  */
  LocalPath *gpu_gpu;      /* gpus x gpus                                              */
  LocalPath *to_nic;       /* per GPU: from it to its NIC                              */
  LocalPath *from_nic;     /* per GPU: from its NIC to it                              */
  int *gpu_nic;            /* per GPU: the local index of its NIC                      */
  int *pxn;                /* gpus x gpus: PXN's relaying GPU, or -1 (build_pxn())     */
  int n_leaves, n_spines;
  int *nic_leaf;           /* per NIC of the machine (node-major): its leaf            */
  int *nic_up, *nic_down;  /* per NIC: link to its leaf, link from its leaf            */
  int *leaf_up;            /* leaf j -> spine s at j * n_spines + s                    */
  int *spine_down;         /* spine s -> leaf j at s * n_leaves + j                    */
} Machine;

static inline Machine *machine_of(const SimMachine *m)
{
  return (Machine *)m;
}

static inline SimVertex *vertex_at(const SimMachine *m, int v)
{
  return &g_array_index(m->vertices, SimVertex, v);
}

static inline SimLink *link_at(const SimMachine *m, int l)
{
  return &g_array_index(m->links, SimLink, l);
}

const char *sim_link_kind_name(SimLinkKind k)
{
  static const char *const names[SIM_LINK_KIND_COUNT] = {
    "nvlink", "nvswitch", "pcie", "intersocket", "nic", "network",
  };
  g_return_val_if_fail(k >= 0 && k < SIM_LINK_KIND_COUNT, "?");
  return names[k];
}

/* ---------------------------------------------------------------------------------- */
/* Expansion                                                                           */

static int add_vertex(const SimMachine *m, SimVertexKind kind, int node, int device, char *name)
{
  SimVertex v = {
    .kind = kind,
    .node = node,
    .device = device,
    .name = name,
    .out_links = g_array_sized_new(FALSE, FALSE, sizeof(int), 4),
  };
  g_array_append_val(m->vertices, v);
  return (int)m->vertices->len - 1;
}

/* Link names read "node3/gpu2->nvswitch": the destination loses the node prefix when both
 * ends are in the same node. */
static int add_link(const SimMachine *m, SimLinkKind kind, int src, int dst, double bandwidth,
                    double latency)
{
  SimVertex *s = vertex_at(m, src);
  const SimVertex *t = vertex_at(m, dst);
  const char *dst_name = t->name;
  if (s->node >= 0 && s->node == t->node && strchr(t->name, '/'))
    dst_name = strchr(t->name, '/') + 1;
  SimLink l = {
    .kind = kind,
    .src = src,
    .dst = dst,
    .bandwidth = bandwidth,
    .latency = latency,
    .name = g_strdup_printf("%s->%s", s->name, dst_name),
  };
  int id = (int)m->links->len;
  g_array_append_val(m->links, l);
  g_array_append_val(s->out_links, id);
  return id;
}

static void add_duplex(const SimMachine *m, SimLinkKind kind, int a, int b, double bandwidth,
                       double latency, int *ab, int *ba)
{
  int x = add_link(m, kind, a, b, bandwidth, latency);
  int y = add_link(m, kind, b, a, bandwidth, latency);
  if (ab)
    *ab = x;
  if (ba)
    *ba = y;
}

static void build_node(Machine *mm, int n)
{
  SimMachine *m = &mm->pub;
  const SimMachineDesc *d = mm->desc;
  int v0 = (int)m->vertices->len;

  for (int g = 0; g < d->gpus; g++)
    add_vertex(m, SIM_VERTEX_GPU, n, n * d->gpus + g, g_strdup_printf("node%d/gpu%d", n, g));
  if (d->fabric == SIM_FABRIC_NVSWITCH)
    add_vertex(m, SIM_VERTEX_NVSWITCH, n, -1, g_strdup_printf("node%d/nvswitch", n));
  for (int s = 0; s < d->sockets; s++)
    add_vertex(m, SIM_VERTEX_HOST, n, -1, g_strdup_printf("node%d/cpu%d", n, s));
  for (int s = 0; s < d->n_switches; s++)
    add_vertex(m, SIM_VERTEX_PCIE_SWITCH, n, -1, g_strdup_printf("node%d/pcie%d", n, s));
  for (int k = 0; k < d->n_nics; k++)
    add_vertex(m, SIM_VERTEX_NIC, n, -1, g_strdup_printf("node%d/nic%d", n, k));

  int gpu = v0, nvswitch = v0 + mm->v_nvswitch, socket = v0 + mm->v_socket;
  int sw = v0 + mm->v_switch, nic = v0 + mm->v_nic;

  /* The NVSwitch chips of a node act as one non-blocking crossbar: each GPU's NVLinks,
   * spread over the chips, add up to one link of the GPU's total NVLink bandwidth. */
  if (d->fabric == SIM_FABRIC_NVSWITCH)
    for (int g = 0; g < d->gpus; g++)
      add_duplex(m, SIM_LINK_NVSWITCH, gpu + g, nvswitch, d->fabric_bandwidth, d->fabric_latency,
                 NULL, NULL);
  if (d->fabric == SIM_FABRIC_NVLINK_MESH)
    for (int i = 0; i < d->n_pairs; i++)
      add_duplex(m, SIM_LINK_NVLINK, gpu + d->pairs[i].a, gpu + d->pairs[i].b,
                 d->pairs[i].links * d->fabric_bandwidth, d->fabric_latency, NULL, NULL);

  for (int g = 0; g < d->gpus; g++)
    add_duplex(m, SIM_LINK_PCIE, gpu + g, sw + d->gpu_switch[g], d->pcie_bandwidth,
               d->pcie_latency, NULL, NULL);
  for (int s = 0; s < d->n_switches; s++) {
    const SimPcieSwitchDesc *sd = &d->switches[s];
    int up = sd->parent >= 0 ? sw + sd->parent : socket + sd->socket;
    add_duplex(m, SIM_LINK_PCIE, sw + s, up, d->pcie_bandwidth, d->pcie_latency, NULL, NULL);
  }
  for (int a = 0; a < d->sockets; a++)
    for (int b = a + 1; b < d->sockets; b++)
      add_duplex(m, SIM_LINK_INTERSOCKET, socket + a, socket + b, d->intersocket_bandwidth,
                 d->intersocket_latency, NULL, NULL);
  for (int k = 0; k < d->n_nics; k++)
    add_duplex(m, SIM_LINK_NIC, sw + d->nic_switch[k], nic + k, d->pcie_bandwidth,
               d->pcie_latency, NULL, NULL);
}

/* Leaves and spines.  A leaf has one aggregated link to every spine, each direction,
 * sharing the leaf's uplink capacity: (ports down x port bandwidth) / oversubscription
 * in all.  With the spines left to their default there is one per port down, so each
 * leaf-spine link has one port's bandwidth at full bisection. */
static void build_network(Machine *mm)
{
  SimMachine *m = &mm->pub;
  const SimMachineDesc *d = mm->desc;
  int n_nics = d->count * d->n_nics;
  if (d->network == SIM_NETWORK_NONE || n_nics == 0)
    return;

  int per_leaf = 0, ports = 0;
  switch (d->network) {
  case SIM_NETWORK_SINGLE_SWITCH:
    mm->n_leaves = 1;
    ports = n_nics;
    break;
  case SIM_NETWORK_FAT_TREE:
    per_leaf = MIN(d->nodes_per_leaf, d->count);
    mm->n_leaves = (d->count + per_leaf - 1) / per_leaf;
    ports = per_leaf * d->n_nics;
    break;
  case SIM_NETWORK_RAIL_OPTIMIZED:
    per_leaf = d->nodes_per_leaf > 0 ? MIN(d->nodes_per_leaf, d->count) : d->count;
    mm->n_leaves = (d->count + per_leaf - 1) / per_leaf * d->n_nics;
    ports = per_leaf;
    break;
  case SIM_NETWORK_NONE:
    g_assert_not_reached();
  }
  mm->n_spines = 0;
  if (mm->n_leaves > 1)
    mm->n_spines = d->spines > 0 ? d->spines
                                 : MAX(1, (int)ceil(ports / d->oversubscription - 1e-9));

  int first_leaf = (int)m->vertices->len;
  for (int j = 0; j < mm->n_leaves; j++) {
    char *name = d->network == SIM_NETWORK_SINGLE_SWITCH ? g_strdup("switch")
                 : d->network == SIM_NETWORK_RAIL_OPTIMIZED
                   ? g_strdup_printf("rail%d.leaf%d", j % d->n_nics, j / d->n_nics)
                   : g_strdup_printf("leaf%d", j);
    add_vertex(m, SIM_VERTEX_NET_SWITCH, -1, -1, name);
  }
  int first_spine = (int)m->vertices->len;
  for (int s = 0; s < mm->n_spines; s++)
    add_vertex(m, SIM_VERTEX_NET_SWITCH, -1, -1, g_strdup_printf("spine%d", s));

  mm->nic_leaf = g_new(int, n_nics);
  mm->nic_up = g_new(int, n_nics);
  mm->nic_down = g_new(int, n_nics);
  for (int n = 0; n < d->count; n++)
    for (int k = 0; k < d->n_nics; k++) {
      int q = n * d->n_nics + k;
      int leaf = d->network == SIM_NETWORK_SINGLE_SWITCH ? 0
                 : d->network == SIM_NETWORK_FAT_TREE  ? n / per_leaf
                                                       : (n / per_leaf) * d->n_nics + k;
      mm->nic_leaf[q] = leaf;
      add_duplex(m, SIM_LINK_NETWORK, n * mm->vpn + mm->v_nic + k, first_leaf + leaf,
                 d->nic_bandwidth, d->network_latency, &mm->nic_up[q], &mm->nic_down[q]);
    }

  if (mm->n_spines == 0)
    return;
  double uplink = ports * d->network_bandwidth / (mm->n_spines * d->oversubscription);
  mm->leaf_up = g_new(int, (size_t)mm->n_leaves * mm->n_spines);
  mm->spine_down = g_new(int, (size_t)mm->n_leaves * mm->n_spines);
  for (int j = 0; j < mm->n_leaves; j++)
    for (int s = 0; s < mm->n_spines; s++)
      add_duplex(m, SIM_LINK_NETWORK, first_leaf + j, first_spine + s, uplink,
                 d->network_latency, &mm->leaf_up[j * mm->n_spines + s],
                 &mm->spine_down[s * mm->n_leaves + j]);
}

/* ---------------------------------------------------------------------------------- */
/* Paths inside node 0                                                                 */

typedef struct {
  int64_t latency_ps;      /* integral, so that equal sums compare equal               */
  int hops;
  double bandwidth;
} Label;

#define KIND_BIT(k) (1u << (k))
#define FABRIC_KINDS (KIND_BIT(SIM_LINK_NVLINK) | KIND_BIT(SIM_LINK_NVSWITCH))
#define PCIE_KINDS (KIND_BIT(SIM_LINK_PCIE) | KIND_BIT(SIM_LINK_INTERSOCKET))
#define NIC_KINDS (PCIE_KINDS | KIND_BIT(SIM_LINK_NIC))

static gboolean label_better(const Label *a, const Label *b)
{
  if (a->latency_ps != b->latency_ps)
    return a->latency_ps < b->latency_ps;
  if (a->hops != b->hops)
    return a->hops < b->hops;
  return a->bandwidth > b->bandwidth;
}

static gboolean label_equal(const Label *a, const Label *b)
{
  return a->latency_ps == b->latency_ps && a->hops == b->hops && a->bandwidth == b->bandwidth;
}

/* Best paths from @src to every vertex of node 0 over links of the kinds in @mask.
 * Nodes are a few dozen vertices, so the quadratic form of Dijkstra is the simple one. */
static void node_paths(const Machine *mm, int src, unsigned mask, Label *label, int *pred)
{
  const SimMachine *m = &mm->pub;
  int nv = mm->vpn;
  g_autofree gboolean *done = g_new0(gboolean, nv);
  for (int v = 0; v < nv; v++) {
    label[v] = (Label){ INT64_MAX, G_MAXINT, 0 };
    pred[v] = -1;
  }
  label[src] = (Label){ 0, 0, INFINITY };
  for (;;) {
    int u = -1;
    for (int v = 0; v < nv; v++)
      if (!done[v] && label[v].latency_ps != INT64_MAX &&
          (u < 0 || label_better(&label[v], &label[u])))
        u = v;
    if (u < 0)
      break;
    done[u] = TRUE;
    const SimVertex *vu = vertex_at(m, u);
    if (u != src && (vu->kind == SIM_VERTEX_GPU || vu->kind == SIM_VERTEX_NIC))
      continue;
    for (guint i = 0; i < vu->out_links->len; i++) {
      int l = g_array_index(vu->out_links, int, i);
      const SimLink *link = link_at(m, l);
      if (!(mask & KIND_BIT(link->kind)) || link->dst >= nv || done[link->dst])
        continue;
      Label c = {
        label[u].latency_ps + llround(link->latency * 1e12),
        label[u].hops + 1,
        MIN(label[u].bandwidth, link->bandwidth),
      };
      if (label_better(&c, &label[link->dst])) {
        label[link->dst] = c;
        pred[link->dst] = l;
      }
    }
  }
}

static LocalPath path_to(const Machine *mm, const int *pred, int src, int dst)
{
  LocalPath p = { 0, NULL };
  for (int v = dst; v != src; v = link_at(&mm->pub, pred[v])->src)
    p.n++;
  p.links = g_new(int, MAX(p.n, 1));
  int i = p.n;
  for (int v = dst; v != src; v = link_at(&mm->pub, pred[v])->src)
    p.links[--i] = pred[v];
  return p;
}

static void build_local_paths(Machine *mm)
{
  const SimMachineDesc *d = mm->desc;
  int g = d->gpus, nv = mm->vpn;
  g_autofree Label *fab = g_new(Label, nv);
  g_autofree Label *pci = g_new(Label, nv);
  g_autofree int *fab_pred = g_new(int, nv);
  g_autofree int *pci_pred = g_new(int, nv);

  mm->gpu_gpu = g_new0(LocalPath, (size_t)g * g);
  for (int i = 0; i < g; i++) {
    gboolean has_fabric = d->fabric != SIM_FABRIC_PCIE;
    if (has_fabric)
      node_paths(mm, i, FABRIC_KINDS, fab, fab_pred);
    node_paths(mm, i, PCIE_KINDS, pci, pci_pred);
    for (int j = 0; j < g; j++) {
      if (i == j)
        continue;
      gboolean nvlink = has_fabric && fab_pred[j] >= 0;
      g_assert(nvlink || pci_pred[j] >= 0);
      mm->gpu_gpu[i * g + j] = path_to(mm, nvlink ? fab_pred : pci_pred, i, j);
    }
  }

  if (d->n_nics == 0)
    return;
  /* Each GPU's NIC: the nearest over PCIe; GPUs that tie over the same set of NICs take
   * them in turn, in the order of their local ranks. */
  mm->gpu_nic = g_new(int, g);
  mm->to_nic = g_new0(LocalPath, g);
  mm->from_nic = g_new0(LocalPath, g);
  g_autofree guint64 *tied = g_new0(guint64, g);
  for (int i = 0; i < g; i++) {
    node_paths(mm, i, NIC_KINDS, pci, pci_pred);
    int best = -1;
    for (int k = 0; k < d->n_nics; k++) {
      int v = mm->v_nic + k;
      if (pci_pred[v] < 0)
        continue;
      if (best < 0 || label_better(&pci[v], &pci[mm->v_nic + best])) {
        best = k;
        tied[i] = 0;
      }
      if (label_equal(&pci[v], &pci[mm->v_nic + best]))
        tied[i] |= G_GUINT64_CONSTANT(1) << k;
    }
    g_assert(best >= 0);
    int turn = 0, n_tied = 0;
    for (int j = 0; j < i; j++)
      turn += tied[j] == tied[i];
    for (int k = 0; k < d->n_nics; k++)
      n_tied += (tied[i] >> k) & 1;
    turn %= n_tied;
    int k = 0;
    for (;; k++)
      if (((tied[i] >> k) & 1) && turn-- == 0)
        break;
    mm->gpu_nic[i] = k;
    mm->to_nic[i] = path_to(mm, pci_pred, i, mm->v_nic + k);
  }
  for (int i = 0; i < g; i++) {
    int nic = mm->v_nic + mm->gpu_nic[i];
    node_paths(mm, nic, NIC_KINDS, pci, pci_pred);
    g_assert(pci_pred[i] >= 0);
    mm->from_nic[i] = path_to(mm, pci_pred, nic, i);
  }
}

/* ---------------------------------------------------------------------------------- */
/* Building and freeing                                                                */

static void route_free(gpointer p)
{
  SimRoute *r = p;
  g_free(r->links);
  g_free(r);
}

/* Whether the path inside a node is NVLink (or NVSwitch) alone. */
static gboolean nvlink_only(const SimMachine *m, const LocalPath *p)
{
  for (int i = 0; i < p->n; i++) {
    SimLinkKind k = link_at(m, p->links[i])->kind;
    if (k != SIM_LINK_NVLINK && k != SIM_LINK_NVSWITCH)
      return FALSE;
  }
  return p->n > 0;
}

/* PXN (NCCL's "PCI x NVLink"): NCCL sends a point-to-point message to a GPU of another node
 * through the NIC that GPU uses, reached over NVLink through the sending node's GPU of that
 * NIC, where the sender's own NIC sits on another rail: its P2P_PXN_LEVEL, 2 by default,
 * uses "PXN as much as possible" (ncclTopoGetNetDev() in NCCL's src/graph/search.cc), and
 * PXN_DISABLE is 0 by default (src/graph/paths.cc).  In a rail-optimized network the
 * message then stays on the destination's rail instead of crossing a spine.  Fills
 * Machine.pxn once: for a message from local GPU i to local GPU j of another node, the
 * local index of the relaying GPU, never i itself, or -1 where it goes out through i's own
 * NIC.  Left NULL where nothing relays. */
static void build_pxn(Machine *mm)
{
  const SimMachineDesc *d = mm->desc;
  int g = d->gpus;
  if (d->network != SIM_NETWORK_RAIL_OPTIMIZED || d->no_pxn || !mm->gpu_nic)
    return;
  mm->pxn = g_new(int, (size_t)g * g);
  for (int ga = 0; ga < g; ga++)
    for (int gb = 0; gb < g; gb++) {
      /* The GPU of gb's NIC: gb's own local index where it has it (one rail per GPU),
       * else the first. */
      int nic = mm->gpu_nic[gb], relay = -1;
      for (int k = 0; nic != mm->gpu_nic[ga] && k < g && relay != gb; k++)
        if (k != ga && mm->gpu_nic[k] == nic && nvlink_only(&mm->pub, &mm->gpu_gpu[ga * g + k]))
          relay = k;
      mm->pxn[ga * g + gb] = relay;
    }
}

/* The local index of the GPU through whose NIC a message from local GPU @ga leaves for
 * local GPU @gb of another node (build_pxn()), or -1: @ga's own. */
static inline int pxn_relay(const Machine *mm, int ga, int gb)
{
  return mm->pxn ? mm->pxn[ga * mm->desc->gpus + gb] : -1;
}

SimMachine *sim_machine_build(SimMachineDesc *d)
{
  g_return_val_if_fail(d != NULL, NULL);
  Machine *mm = g_new0(Machine, 1);
  SimMachine *m = &mm->pub;
  mm->desc = d;
  m->name = g_strdup(d->name);
  m->description = g_strdup(d->description);
  m->n_nodes = d->count;
  m->n_devices = d->count * d->gpus;

  mm->v_nvswitch = d->gpus;
  mm->v_socket = mm->v_nvswitch + (d->fabric == SIM_FABRIC_NVSWITCH);
  mm->v_switch = mm->v_socket + d->sockets;
  mm->v_nic = mm->v_switch + d->n_switches;
  mm->vpn = mm->v_nic + d->n_nics;

  m->vertices = g_array_sized_new(FALSE, FALSE, sizeof(SimVertex), (guint)mm->vpn * d->count);
  m->links = g_array_new(FALSE, FALSE, sizeof(SimLink));
  for (int n = 0; n < d->count; n++) {
    build_node(mm, n);
    if (n == 0)
      mm->lpn = (int)m->links->len;
    g_assert((int)m->links->len == (n + 1) * mm->lpn);
  }
  build_network(mm);

  m->devices = g_new(SimDevice, m->n_devices);
  for (int dev = 0; dev < m->n_devices; dev++) {
    int n = dev / d->gpus, i = dev % d->gpus;
    m->devices[dev] = (SimDevice){
      .vertex = n * mm->vpn + i,
      .node = n,
      .local_rank = i,
      .spec = d->spec,
    };
  }
  build_local_paths(mm);
  build_pxn(mm);

  m->routes = g_hash_table_new_full(g_direct_hash, g_direct_equal, NULL, route_free);
  g_mutex_init(&m->route_lock);
  if (m->n_devices <= 4096)
    m->route_table = g_new0(SimRoute *, (size_t)m->n_devices * (size_t)m->n_devices);
  else
    m->route_cache = g_new0(SimRoute *, ROUTE_CACHE);
  m->json = sim_machine_desc_to_json(d);
  return m;
}

static void local_paths_free(LocalPath *p, int n)
{
  if (!p)
    return;
  for (int i = 0; i < n; i++)
    g_free(p[i].links);
  g_free(p);
}

void sim_machine_free(SimMachine *m)
{
  if (!m)
    return;
  Machine *mm = machine_of(m);
  int g = mm->desc->gpus;
  for (guint v = 0; v < m->vertices->len; v++) {
    SimVertex *vx = vertex_at(m, (int)v);
    g_free(vx->name);
    g_array_unref(vx->out_links);
  }
  g_array_unref(m->vertices);
  for (guint l = 0; l < m->links->len; l++)
    g_free(link_at(m, (int)l)->name);
  g_array_unref(m->links);
  g_hash_table_destroy(m->routes);
  g_free(m->route_table);
  g_free(m->route_cache);
  g_mutex_clear(&m->route_lock);
  g_free(m->devices);
  g_free(m->name);
  g_free(m->description);
  g_free(m->json);
  local_paths_free(mm->gpu_gpu, g * g);
  local_paths_free(mm->to_nic, mm->gpu_nic ? g : 0);
  local_paths_free(mm->from_nic, mm->gpu_nic ? g : 0);
  g_free(mm->gpu_nic);
  g_free(mm->pxn);
  g_free(mm->nic_leaf);
  g_free(mm->nic_up);
  g_free(mm->nic_down);
  g_free(mm->leaf_up);
  g_free(mm->spine_down);
  sim_machine_desc_free(mm->desc);
  g_free(mm);
}

/* ---------------------------------------------------------------------------------- */
/* Routes                                                                              */

/* A mixing function (splitmix64's finalizer): consecutive pairs land on unrelated
 * spines, as flows hashed by a switch's ECMP do. */
static guint64 mix64(guint64 x)
{
  x ^= x >> 30;
  x *= G_GUINT64_CONSTANT(0xbf58476d1ce4e5b9);
  x ^= x >> 27;
  x *= G_GUINT64_CONSTANT(0x94d049bb133111eb);
  x ^= x >> 31;
  return x;
}

static void append_local(GArray *out, const LocalPath *p, int offset)
{
  for (int i = 0; i < p->n; i++) {
    int l = p->links[i] + offset;
    g_array_append_val(out, l);
  }
}

static SimRoute *compute_route(const Machine *mm, int src, int dst)
{
  const SimMachine *m = &mm->pub;
  const SimMachineDesc *d = mm->desc;
  const SimDevice *a = &m->devices[src], *b = &m->devices[dst];
  GArray *links = g_array_sized_new(FALSE, FALSE, sizeof(int), 12);
  if (a->node == b->node) {
    append_local(links, &mm->gpu_gpu[a->local_rank * d->gpus + b->local_rank],
                 a->node * mm->lpn);
  } else {
    int ga = a->local_rank, relay = pxn_relay(mm, ga, b->local_rank);
    if (relay >= 0) {
      append_local(links, &mm->gpu_gpu[ga * d->gpus + relay], a->node * mm->lpn);
      ga = relay;
    }
    int qa = a->node * d->n_nics + mm->gpu_nic[ga];
    int qb = b->node * d->n_nics + mm->gpu_nic[b->local_rank];
    append_local(links, &mm->to_nic[ga], a->node * mm->lpn);
    g_array_append_val(links, mm->nic_up[qa]);
    int la = mm->nic_leaf[qa], lb = mm->nic_leaf[qb];
    if (la != lb) {
      /* In a rail-optimized network the rails are separate planes, and every rail sends
       * the traffic of one pair of nodes through the same spine index: the rails stay
       * alike, which is what lets the simulator fold their symmetric ranks. */
      guint64 key = d->network == SIM_NETWORK_RAIL_OPTIMIZED
                      ? ((guint64)a->node << 32) | (guint64)b->node
                      : ((guint64)src << 32) | (guint64)dst;
      int s = (int)(mix64(key) % (guint64)mm->n_spines);
      g_array_append_val(links, mm->leaf_up[la * mm->n_spines + s]);
      g_array_append_val(links, mm->spine_down[s * mm->n_leaves + lb]);
    }
    g_array_append_val(links, mm->nic_down[qb]);
    append_local(links, &mm->from_nic[b->local_rank], b->node * mm->lpn);
  }

  SimRoute *r = g_new(SimRoute, 1);
  r->n_links = (int)links->len;
  r->bandwidth = INFINITY;
  r->latency = 0;
  for (int i = 0; i < r->n_links; i++) {
    const SimLink *l = link_at(m, g_array_index(links, int, i));
    r->bandwidth = MIN(r->bandwidth, l->bandwidth);
    r->latency += l->latency;
  }
  r->links = (int *)(void *)g_array_free(links, FALSE);
  return r;
}

static const int no_links[1] = { 0 };
static const SimRoute empty_route = { 0, (int *)no_links, INFINITY, 0.0 };

/* A device to itself has an empty route: no links, unlimited bandwidth, no latency.
 * The cache of routes is filled on first use under route_lock: a machine is constant to
 * every caller, and only this function writes the cache (hence the cast). */
static const SimRoute *get_route(const SimMachine *cm, int src, int dst)
{
  SimMachine *m = (SimMachine *)cm;
  if (src == dst)
    return &empty_route;
  gsize idx = (gsize)src * (gsize)m->n_devices + (gsize)dst;
  guint slot = 0;
  if (m->route_table) {
    SimRoute *r = g_atomic_pointer_get(&m->route_table[idx]);
    if (r)
      return r;
  } else if (m->route_cache) {
    slot = (guint)((idx * UINT64_C(0x9E3779B97F4A7C15)) >> 40) & (ROUTE_CACHE - 1);
    SimRoute *r = g_atomic_pointer_get(&m->route_cache[slot]);
    if (r && r->src == src && r->dst == dst)
      return r;
  }
  gpointer key = GSIZE_TO_POINTER(idx);
  g_mutex_lock(&m->route_lock);
  SimRoute *r = g_hash_table_lookup(m->routes, key);
  if (!r) {
    r = compute_route(machine_of(m), src, dst);
    r->src = src;
    r->dst = dst;
    g_hash_table_insert(m->routes, key, r);
  }
  if (m->route_table)
    g_atomic_pointer_set(&m->route_table[idx], r);
  else if (m->route_cache)
    g_atomic_pointer_set(&m->route_cache[slot], r);
  g_mutex_unlock(&m->route_lock);
  return r;
}

#define CHECK_DEVICE(m, d, val) \
  g_return_val_if_fail((m) != NULL && (d) >= 0 && (d) < (m)->n_devices, (val))

int sim_machine_pxn_relay(const SimMachine *m, int src, int dst)
{
  CHECK_DEVICE(m, src, -1);
  CHECK_DEVICE(m, dst, -1);
  const SimDevice *a = &m->devices[src], *b = &m->devices[dst];
  if (a->node == b->node)
    return -1;
  const Machine *mm = machine_of(m);
  int relay = pxn_relay(mm, a->local_rank, b->local_rank);
  return relay < 0 ? -1 : a->node * mm->desc->gpus + relay;
}

const SimRoute *sim_machine_route_info(const SimMachine *m, int src, int dst)
{
  return get_route(m, src, dst);
}

const int *sim_machine_route(const SimMachine *m, int src, int dst, int *n_links)
{
  CHECK_DEVICE(m, src, NULL);
  CHECK_DEVICE(m, dst, NULL);
  const SimRoute *r = get_route(m, src, dst);
  if (n_links)
    *n_links = r->n_links;
  return r->links;
}

/* The directed link from vertex @a to vertex @b, or -1. */
static int link_between(const SimMachine *m, int a, int b)
{
  const GArray *out = vertex_at(m, a)->out_links;
  for (guint k = 0; k < out->len; k++) {
    int l = g_array_index(out, int, k);
    if (link_at(m, l)->dst == b)
      return l;
  }
  return -1;
}

int sim_machine_host_links(const SimMachine *m, int dev, gboolean to_host, int *links, int max)
{
  const Machine *mm = machine_of(m);
  const SimMachineDesc *d = mm->desc;
  int node = dev / d->gpus, v0 = node * mm->vpn;
  /* The vertices from the GPU up its PCIe tree to the socket above it. */
  int path[64], n = 0;
  path[n++] = v0 + dev % d->gpus;
  int sw = d->gpu_switch[dev % d->gpus];
  while (sw >= 0 && n < 63) {
    path[n++] = v0 + mm->v_switch + sw;
    if (d->switches[sw].parent < 0) {
      path[n++] = v0 + mm->v_socket + d->switches[sw].socket;
      break;
    }
    sw = d->switches[sw].parent;
  }
  int hops = n - 1;
  for (int i = 0; i < hops && i < max; i++)
    links[i] = to_host ? link_between(m, path[i], path[i + 1])
                       : link_between(m, path[hops - i], path[hops - i - 1]);
  return hops;
}

int sim_machine_host_socket(const SimMachine *m, int dev)
{
  const SimMachineDesc *d = machine_of(m)->desc;
  int sw = d->gpu_switch[dev % d->gpus];
  while (d->switches[sw].parent >= 0)
    sw = d->switches[sw].parent;
  return d->switches[sw].socket;
}

double sim_machine_bandwidth(const SimMachine *m, int src, int dst)
{
  CHECK_DEVICE(m, src, 0);
  CHECK_DEVICE(m, dst, 0);
  return get_route(m, src, dst)->bandwidth;
}

double sim_machine_latency(const SimMachine *m, int src, int dst)
{
  CHECK_DEVICE(m, src, 0);
  CHECK_DEVICE(m, dst, 0);
  return get_route(m, src, dst)->latency;
}

/* ---------------------------------------------------------------------------------- */
/* Queries                                                                             */

const char *sim_machine_get_name(const SimMachine *m)
{
  g_return_val_if_fail(m != NULL, NULL);
  return m->name;
}

int sim_machine_n_devices(const SimMachine *m)
{
  g_return_val_if_fail(m != NULL, 0);
  return m->n_devices;
}

int sim_machine_n_nodes(const SimMachine *m)
{
  g_return_val_if_fail(m != NULL, 0);
  return m->n_nodes;
}

int sim_machine_device_node(const SimMachine *m, int dev)
{
  CHECK_DEVICE(m, dev, -1);
  return m->devices[dev].node;
}

int sim_machine_device_local_rank(const SimMachine *m, int dev)
{
  CHECK_DEVICE(m, dev, -1);
  return m->devices[dev].local_rank;
}

int sim_machine_node_n_devices(const SimMachine *m, int node)
{
  g_return_val_if_fail(m != NULL && node >= 0 && node < m->n_nodes, 0);
  return machine_of(m)->desc->gpus;
}

const SimDeviceSpec *sim_machine_device_spec(const SimMachine *m, int dev)
{
  CHECK_DEVICE(m, dev, NULL);
  return m->devices[dev].spec;
}

int sim_machine_n_links(const SimMachine *m)
{
  g_return_val_if_fail(m != NULL, 0);
  return (int)m->links->len;
}

#define CHECK_LINK(m, l, val) \
  g_return_val_if_fail((m) != NULL && (l) >= 0 && (l) < (int)(m)->links->len, (val))

SimLinkKind sim_machine_link_kind(const SimMachine *m, int link)
{
  CHECK_LINK(m, link, SIM_LINK_PCIE);
  return link_at(m, link)->kind;
}

double sim_machine_link_bandwidth(const SimMachine *m, int link)
{
  CHECK_LINK(m, link, 0);
  return link_at(m, link)->bandwidth;
}

double sim_machine_link_latency(const SimMachine *m, int link)
{
  CHECK_LINK(m, link, 0);
  return link_at(m, link)->latency;
}

const char *sim_machine_link_name(const SimMachine *m, int link)
{
  CHECK_LINK(m, link, NULL);
  return link_at(m, link)->name;
}

/* ---------------------------------------------------------------------------------- */
/* The embedded library and loading                                                    */

static GBytes *library_lookup(const char *name)
{
  if (!*name || strchr(name, '/'))
    return NULL;
  g_autofree char *path = g_strdup_printf(LIBRARY_DIR "%s.json", name);
  return g_resource_lookup_data(parasol_data_get_resource(), path,
                                G_RESOURCE_LOOKUP_FLAGS_NONE, NULL);
}

static int compare_names(gconstpointer a, gconstpointer b)
{
  return strcmp(*(char *const *)a, *(char *const *)b);
}

char **sim_machine_library_names(void)
{
  g_auto(GStrv) children = g_resource_enumerate_children(
    parasol_data_get_resource(), LIBRARY_DIR, G_RESOURCE_LOOKUP_FLAGS_NONE, NULL);
  GPtrArray *names = g_ptr_array_new();
  for (char **c = children; c && *c; c++)
    if (g_str_has_suffix(*c, ".json"))
      g_ptr_array_add(names, g_strndup(*c, strlen(*c) - strlen(".json")));
  g_ptr_array_sort(names, compare_names);
  g_ptr_array_add(names, NULL);
  return (char **)g_ptr_array_free(names, FALSE);
}

char *sim_machine_library_description(const char *name)
{
  g_return_val_if_fail(name != NULL, NULL);
  g_autoptr(GBytes) bytes = library_lookup(name);
  if (!bytes)
    return NULL;
  g_autoptr(JsonParser) parser = json_parser_new();
  gsize size = 0;
  const char *text = g_bytes_get_data(bytes, &size);
  if (!json_parser_load_from_data(parser, text, (gssize)size, NULL))
    return NULL;
  JsonNode *root = json_parser_get_root(parser);
  if (!root || !JSON_NODE_HOLDS_OBJECT(root))
    return NULL;
  const char *desc = json_object_get_string_member_with_default(json_node_get_object(root),
                                                                "description", "");
  return g_strdup(desc);
}

/* "NAME" or "NAME:COUNT" from the library, else a file ("FILE" or "FILE:COUNT"). */
SimMachine *sim_machine_load(const char *name_or_file, GError **error)
{
  g_return_val_if_fail(name_or_file != NULL, NULL);
  g_autofree char *base = g_strdup(name_or_file);
  int count = 0;
  char *colon = strrchr(base, ':');
  if (colon && !g_file_test(name_or_file, G_FILE_TEST_EXISTS)) {
    guint64 v = 0;
    if (!g_ascii_string_to_unsigned(colon + 1, 10, 1, G_MAXINT, &v, NULL)) {
      g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                  "%s: expected a node count from 1 to %d after ':', got '%s'", name_or_file,
                  G_MAXINT, colon + 1);
      return NULL;
    }
    count = (int)v;
    *colon = '\0';
  }

  g_autoptr(GBytes) bytes = library_lookup(base);
  if (bytes) {
    g_autofree char *filename = g_strdup_printf("%s.json", base);
    return sim_machine_from_json(g_bytes_get_data(bytes, NULL), filename, count, error);
  }

  g_autofree char *text = NULL;
  g_autoptr(GError) io = NULL;
  if (!sim_read_file(base, &text, NULL, &io)) {
    if (g_error_matches(io, G_FILE_ERROR, G_FILE_ERROR_NOENT) && !strchr(base, '/') &&
        !g_str_has_suffix(base, ".json")) {
      g_auto(GStrv) names = sim_machine_library_names();
      g_autofree char *list = g_strjoinv(", ", names);
      g_set_error(error, SIM_ERROR, SIM_ERROR_UNKNOWN,
                  "unknown machine '%s'; the library has %s (or give a .json file)", base, list);
    } else {
      g_set_error(error, SIM_ERROR, SIM_ERROR_IO, "%s: cannot read: %s", base, io->message);
    }
    return NULL;
  }
  return sim_machine_from_json(text, base, count, error);
}
