/* test-machine.c — the device library, machine files, their expansion and routes.
 *
 * Expected values are worked out in comments from the machine files in data/machines and
 * their README: bandwidths per direction, 1 GB = 1e9 bytes. */
#include "parasol-config.h"
#include "sim-private.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define GBPS 1e9
#define GBITPS 1.25e8

static SimMachine *load(const char *name)
{
  g_autoptr(GError) error = NULL;
  SimMachine *m = sim_machine_load(name, &error);
  cr_assert_not_null(m, "loading %s: %s", name, error ? error->message : "?");
  return m;
}

static SimMachine *parse(const char *text, GError **error)
{
  return sim_machine_from_json(text, "test.json", 0, error);
}

static gboolean near(double a, double b)
{
  return fabs(a - b) <= 1e-9 * fmax(fabs(a), fabs(b));
}

/* Every route starts at src's GPU vertex, ends at dst's, each link starts where the
 * previous one ended, and no GPU is crossed on the way but a PXN relay: a GPU of the
 * source's node, reached over NVLink on the way to another node. */
static void check_route(SimMachine *m, int src, int dst)
{
  int n = -1;
  const int *links = sim_machine_route(m, src, dst, &n);
  cr_assert_not_null(links);
  if (src == dst) {
    cr_assert_eq(n, 0);
    return;
  }
  cr_assert_gt(n, 0, "route %d -> %d is empty", src, dst);
  int at = m->devices[src].vertex, relays = 0;
  double bw = INFINITY, lat = 0;
  for (int i = 0; i < n; i++) {
    const SimLink *l = &g_array_index(m->links, SimLink, links[i]);
    cr_assert_eq(l->src, at, "route %d -> %d: link %d (%s) does not start at vertex %d", src,
                 dst, i, l->name, at);
    if (i > 0) {
      const SimVertex *v = &g_array_index(m->vertices, SimVertex, at);
      const SimLink *in = &g_array_index(m->links, SimLink, links[i - 1]);
      gboolean relay = relays == 0 && m->devices[src].node != m->devices[dst].node &&
                       (in->kind == SIM_LINK_NVLINK || in->kind == SIM_LINK_NVSWITCH);
      cr_assert(v->kind != SIM_VERTEX_GPU || relay, "route %d -> %d crosses GPU %s", src, dst,
                v->name);
      relays += v->kind == SIM_VERTEX_GPU;
    }
    at = l->dst;
    bw = MIN(bw, l->bandwidth);
    lat += l->latency;
  }
  cr_assert_eq(at, m->devices[dst].vertex, "route %d -> %d ends at vertex %d", src, dst, at);
  cr_assert(near(sim_machine_bandwidth(m, src, dst), bw));
  cr_assert(near(sim_machine_latency(m, src, dst), lat));
}

static void check_all_routes(SimMachine *m)
{
  int n = sim_machine_n_devices(m);
  for (int a = 0; a < n; a++)
    for (int b = 0; b < n; b++)
      check_route(m, a, b);
}

static int count_kind(SimMachine *m, int src, int dst, SimLinkKind kind)
{
  int n = 0, c = 0;
  const int *links = sim_machine_route(m, src, dst, &n);
  for (int i = 0; i < n; i++)
    c += sim_machine_link_kind(m, links[i]) == kind;
  return c;
}

/* ---------------------------------------------------------------------------------- */

Test(devices, library)
{
  cr_assert_geq(sim_device_library_n(), 8);
  for (int i = 0; i < sim_device_library_n(); i++) {
    const SimDeviceSpec *s = sim_device_library_get(i);
    cr_assert_gt(s->peak_flops[SIM_DTYPE_FP32], 0, "%s", s->name);
    cr_assert_gt(s->mem_bandwidth, 0, "%s", s->name);
    cr_assert_gt(s->mem_capacity, 0, "%s", s->name);
    cr_assert_gt(s->sm_count, 0, "%s", s->name);
    cr_assert(s->launch_overhead > 1e-6 && s->launch_overhead < 1e-5, "%s", s->name);
    cr_assert(s->source && strlen(s->source) > 10, "%s", s->name);
    cr_assert_eq(sim_device_library_lookup(s->name), s);
  }
  /* A100 80GB: 312 TFLOP/s dense bf16, 2039 GB/s, 80 GiB, 108 SMs. */
  const SimDeviceSpec *a = sim_device_library_lookup("a100-80gb");
  cr_assert_not_null(a);
  cr_assert(near(a->peak_flops[SIM_DTYPE_BF16], 312e12));
  cr_assert(near(a->mem_bandwidth, 2039e9));
  cr_assert_eq(a->mem_capacity, (int64_t)80 << 30);
  cr_assert_eq(a->sm_count, 108);
  /* H100 SXM: fp8 twice fp16; V100 has no bf16; K80 is one GK210 die of 4.37 TFLOP/s. */
  const SimDeviceSpec *h = sim_device_library_lookup("h100-sxm");
  cr_assert(fabs(h->peak_flops[SIM_DTYPE_FP8] / h->peak_flops[SIM_DTYPE_FP16] - 2) < 1e-3);
  cr_assert_eq(sim_device_library_lookup("v100-32gb")->peak_flops[SIM_DTYPE_BF16], 0);
  cr_assert(near(sim_device_library_lookup("k80")->peak_flops[SIM_DTYPE_FP32], 4.37e12));
  cr_assert(near(sim_device_library_lookup("h200")->mem_bandwidth, 4.8e12));
}

Test(devices, aliases)
{
  cr_assert_eq(sim_device_library_lookup("A100_80GB"), sim_device_library_lookup("a100-80gb"));
  cr_assert_eq(sim_device_library_lookup("h100"), sim_device_library_lookup("h100-sxm"));
  cr_assert_eq(sim_device_library_lookup("tesla-k80"), sim_device_library_lookup("k80"));
  cr_assert_eq(sim_device_library_lookup("v100"), sim_device_library_lookup("v100-16gb"));
  cr_assert_null(sim_device_library_lookup("rtx-9090"));
}

Test(devices, intern)
{
  SimDeviceSpec s = *sim_device_library_lookup("a100-40gb");
  cr_assert_eq(sim_device_spec_intern(&s), sim_device_library_lookup("a100-40gb"));
  s.name = "custom-a100";
  s.mem_capacity = (int64_t)24 << 30;
  const SimDeviceSpec *c1 = sim_device_spec_intern(&s);
  const SimDeviceSpec *c2 = sim_device_spec_intern(&s);
  cr_assert_eq(c1, c2, "equal specs share one copy");
  cr_assert_str_eq(c1->name, "custom-a100");
  cr_assert_neq((void *)c1->name, (void *)s.name);
}

/* ---------------------------------------------------------------------------------- */

Test(machine, library)
{
  g_auto(GStrv) names = sim_machine_library_names();
  const char *expected[] = { "dgx-a100", "dgx-h100", "dgx1-p100", "dgx1-v100", "flexflow-k80",
                             "flexflow-p100", "h200", "h200-1", "pcie-4gpu", "summit" };
  for (size_t i = 0; i < G_N_ELEMENTS(expected); i++)
    cr_assert(g_strv_contains((const char *const *)names, expected[i]), "%s", expected[i]);
  for (char **n = names; *n; n++) {
    g_autofree char *desc = sim_machine_library_description(*n);
    cr_assert(desc && strlen(desc) > 20, "%s has a description", *n);
    SimMachine *m = load(*n);
    cr_assert_str_eq(sim_machine_get_name(m), *n);
    check_all_routes(m);
    sim_machine_free(m);
  }
  cr_assert_null(sim_machine_library_description("no-such-machine"));
}

Test(machine, counts)
{
  /* dgx-a100:64 = 64 nodes x 8 GPUs = 512 devices, node-major. */
  SimMachine *m = load("dgx-a100:64");
  cr_assert_eq(sim_machine_n_devices(m), 512);
  cr_assert_eq(sim_machine_n_nodes(m), 64);
  cr_assert_str_eq(sim_machine_get_name(m), "dgx-a100:64");
  cr_assert_eq(sim_machine_device_node(m, 8 * 5 + 3), 5);
  cr_assert_eq(sim_machine_device_local_rank(m, 8 * 5 + 3), 3);
  cr_assert_eq(sim_machine_node_n_devices(m, 63), 8);
  cr_assert_eq(sim_machine_device_spec(m, 511), sim_device_library_lookup("a100-80gb"));
  sim_machine_free(m);

  m = load("flexflow-k80");
  cr_assert_eq(sim_machine_n_devices(m), 64, "16 nodes x 4 GK210 dies");
  sim_machine_free(m);
  m = load("dgx-a100");
  cr_assert_eq(sim_machine_n_devices(m), 8, "the default count is one node");
  sim_machine_free(m);
}

Test(machine, dgx_a100_intra_node)
{
  /* GPU 0 -> NVSwitch -> GPU 5: 2 links, 300 GB/s each way, 0.3 + 0.3 us. */
  SimMachine *m = load("dgx-a100");
  int n = 0;
  const int *r = sim_machine_route(m, 0, 5, &n);
  cr_assert_eq(n, 2);
  cr_assert_eq(sim_machine_link_kind(m, r[0]), SIM_LINK_NVSWITCH);
  cr_assert_eq(sim_machine_link_kind(m, r[1]), SIM_LINK_NVSWITCH);
  cr_assert_str_eq(sim_machine_link_name(m, r[0]), "node0/gpu0->nvswitch");
  cr_assert_str_eq(sim_machine_link_name(m, r[1]), "node0/nvswitch->gpu5");
  cr_assert(near(sim_machine_bandwidth(m, 0, 5), 300 * GBPS));
  cr_assert(near(sim_machine_latency(m, 0, 5), 0.6e-6));
  /* A device to itself: no links, unlimited bandwidth, no latency. */
  sim_machine_route(m, 3, 3, &n);
  cr_assert_eq(n, 0);
  cr_assert(isinf(sim_machine_bandwidth(m, 3, 3)));
  cr_assert_eq(sim_machine_latency(m, 3, 3), 0);
  sim_machine_free(m);
}

/* The machines of today's LLM training: DGX H100 (NVLink 4 through NVSwitch, 900 GB/s per
 * GPU both ways; 8 x 400 Gb/s NDR per node: NVIDIA DGX H100 datasheet) and a GB200 NVL72
 * rack (72 GPUs in one NVLink domain, NVLink 5 at 1.8 TB/s per GPU both ways: NVIDIA GB200
 * NVL72 datasheet). */
Test(machine, h100_and_nvl72_bandwidths)
{
  SimMachine *m = load("dgx-h100:2");
  cr_assert(near(sim_machine_bandwidth(m, 0, 5), 450 * GBPS));
  cr_assert(near(sim_machine_bandwidth(m, 3, 11), 400.0 / 8 * GBPS));
  const SimDeviceSpec *h = sim_machine_device_spec(m, 0);
  cr_assert(near(h->peak_flops[SIM_DTYPE_BF16], 989.4e12));
  cr_assert(near(h->peak_flops[SIM_DTYPE_FP8], 1978.9e12));
  sim_machine_free(m);

  m = load("gb200-nvl72:2");
  cr_assert_eq(sim_machine_n_devices(m), 144);
  cr_assert_eq(sim_machine_node_n_devices(m, 0), 72);
  /* Any two GPUs of a rack: GPU -> NVLink switch -> GPU, 900 GB/s each way. */
  int n = 0;
  const int *r = sim_machine_route(m, 0, 71, &n);
  cr_assert_eq(n, 2);
  cr_assert_eq(sim_machine_link_kind(m, r[0]), SIM_LINK_NVSWITCH);
  cr_assert(near(sim_machine_bandwidth(m, 0, 71), 900 * GBPS));
  cr_assert(near(sim_machine_bandwidth(m, 40, 17), 900 * GBPS));
  /* Between racks: each GPU's own 400 Gb/s NIC. */
  cr_assert(near(sim_machine_bandwidth(m, 5, 72 + 5), 400.0 / 8 * GBPS));
  const SimDeviceSpec *b = sim_machine_device_spec(m, 100);
  cr_assert(near(b->peak_flops[SIM_DTYPE_BF16], 2500e12));
  cr_assert(near(b->peak_flops[SIM_DTYPE_FP8], 5000e12));
  cr_assert(near(b->mem_bandwidth, 8000e9));
  sim_machine_free(m);
}

Test(machine, dgx_a100_inter_node)
{
  /* Node 0 GPU 2 -> node 1 GPU 2: GPU -> PCIe switch -> NIC 2 -> rail 2 leaf -> NIC 2 ->
   * PCIe switch -> GPU: 6 links; the 200 Gb/s NIC (25 GB/s) is the bottleneck under
   * PCIe Gen4's 31.5 GB/s.  Latency 0.5 + 0.5 + 0.6 + 0.6 + 0.5 + 0.5 = 3.2 us. */
  SimMachine *m = load("dgx-a100:2");
  check_route(m, 2, 10);
  int n = 0;
  const int *r = sim_machine_route(m, 2, 10, &n);
  cr_assert_eq(n, 6);
  cr_assert_eq(sim_machine_link_kind(m, r[0]), SIM_LINK_PCIE);
  cr_assert_eq(sim_machine_link_kind(m, r[1]), SIM_LINK_NIC);
  cr_assert_eq(sim_machine_link_kind(m, r[2]), SIM_LINK_NETWORK);
  cr_assert_eq(sim_machine_link_kind(m, r[3]), SIM_LINK_NETWORK);
  cr_assert_str_eq(sim_machine_link_name(m, r[1]), "node0/pcie1->nic2");
  cr_assert_str_eq(sim_machine_link_name(m, r[2]), "node0/nic2->rail2.leaf0");
  cr_assert_str_eq(sim_machine_link_name(m, r[4]), "node1/nic2->pcie1");
  cr_assert(near(sim_machine_bandwidth(m, 2, 10), 25 * GBPS));
  cr_assert(near(sim_machine_bandwidth(m, 2, 10), 200 * GBITPS));
  cr_assert(near(sim_machine_latency(m, 2, 10), 3.2e-6));

  /* Each GPU has its own rail: GPU i of node 0 leaves through NIC i. */
  for (int i = 0; i < 8; i++) {
    r = sim_machine_route(m, i, 8 + i, &n);
    g_autofree char *want = g_strdup_printf("node0/nic%d->rail%d.leaf0", i, i);
    cr_assert_str_eq(sim_machine_link_name(m, r[2]), want);
  }
  /* Across rails (GPU 0 to GPU 1 of the next node) the message goes as NCCL's PXN sends
   * it: over NVSwitch to GPU 1 of its own node, out through NIC 1 and along rail 1, no
   * spine: gpu0 -> nvswitch -> gpu1 -> pcie0 -> nic1 -> rail1 leaf -> nic1 -> pcie0 ->
   * gpu1, 8 links, the same 25 GB/s bottleneck; latency 2 x 0.3 (NVSwitch, DGX A100's
   * file) + 3.2 us. */
  r = sim_machine_route(m, 0, 9, &n);
  cr_assert_eq(n, 8);
  cr_assert_eq(count_kind(m, 0, 9, SIM_LINK_NVSWITCH), 2);
  cr_assert_str_eq(sim_machine_link_name(m, r[1]), "node0/nvswitch->gpu1");
  cr_assert_str_eq(sim_machine_link_name(m, r[4]), "node0/nic1->rail1.leaf0");
  cr_assert_str_eq(sim_machine_link_name(m, r[5]), "rail1.leaf0->node1/nic1");
  for (int i = 0; i < n; i++)
    cr_assert_null(strstr(sim_machine_link_name(m, r[i]), "spine"));
  cr_assert(near(sim_machine_bandwidth(m, 0, 9), 25 * GBPS));
  cr_assert(near(sim_machine_latency(m, 0, 9), sim_machine_latency(m, 1, 9) +
                                                  sim_machine_latency(m, 0, 1)));
  check_all_routes(m);
  sim_machine_free(m);
}

/* The same machine with PXN off ("pxn": false) sends across rails through its own NIC and a
 * spine: 8 links, none of them NVSwitch; the canonical JSON writes the key back. */
Test(machine, rail_optimized_without_pxn_climbs_to_a_spine)
{
  SimMachine *m = load("dgx-a100:2");
  g_autofree char *json = sim_machine_to_json(m);
  sim_machine_free(m);
  cr_assert_not_null(strstr(json, "\"pxn\": true"), "%s", json);
  g_autofree char *off = g_strdup(json);
  char *at = strstr(off, "\"pxn\": true");
  memcpy(at, "\"pxn\":false", strlen("\"pxn\":false"));
  g_autoptr(GError) error = NULL;
  m = parse(off, &error);
  cr_assert_not_null(m, "%s", error ? error->message : "?");
  int n = 0;
  const int *r = sim_machine_route(m, 0, 9, &n);
  cr_assert_eq(n, 8);
  cr_assert_eq(count_kind(m, 0, 9, SIM_LINK_NVSWITCH), 0);
  cr_assert_str_eq(sim_machine_link_name(m, r[2]), "node0/nic0->rail0.leaf0");
  cr_assert_not_null(strstr(sim_machine_link_name(m, r[3]), "spine"));
  check_all_routes(m);
  g_autofree char *back = sim_machine_to_json(m);
  cr_assert_not_null(strstr(back, "\"pxn\": false"), "%s", back);
  sim_machine_free(m);
}

Test(machine, dgx1_v100_cube_mesh)
{
  /* nvidia-smi topo -m of a DGX-1V: NV2 pairs at 2 x 25 GB/s, NV1 pairs at 25 GB/s, and
   * SYS pairs over PCIe Gen3 (15.75 GB/s) and QPI: GPU -> switch -> socket -> socket ->
   * switch -> GPU, 5 links. */
  static const int nv[8][8] = {
    { 0, 1, 1, 2, 2, 0, 0, 0 }, { 1, 0, 2, 1, 0, 2, 0, 0 }, { 1, 2, 0, 2, 0, 0, 1, 0 },
    { 2, 1, 2, 0, 0, 0, 0, 1 }, { 2, 0, 0, 0, 0, 1, 1, 2 }, { 0, 2, 0, 0, 1, 0, 2, 1 },
    { 0, 0, 1, 0, 1, 2, 0, 2 }, { 0, 0, 0, 1, 2, 1, 2, 0 },
  };
  SimMachine *m = load("dgx1-v100");
  for (int a = 0; a < 8; a++)
    for (int b = 0; b < 8; b++) {
      if (a == b)
        continue;
      int n = 0;
      sim_machine_route(m, a, b, &n);
      if (nv[a][b]) {
        cr_assert_eq(n, 1, "%d -> %d is one NVLink hop", a, b);
        cr_assert(near(sim_machine_bandwidth(m, a, b), nv[a][b] * 25 * GBPS), "%d -> %d", a, b);
        cr_assert_eq(count_kind(m, a, b, SIM_LINK_NVLINK), 1);
      } else {
        cr_assert_eq(n, 5, "%d -> %d goes over PCIe and QPI", a, b);
        cr_assert(near(sim_machine_bandwidth(m, a, b), 15.75 * GBPS), "%d -> %d", a, b);
        cr_assert_eq(count_kind(m, a, b, SIM_LINK_INTERSOCKET), 1);
        cr_assert_eq(count_kind(m, a, b, SIM_LINK_NVLINK), 0);
      }
    }
  sim_machine_free(m);
}

Test(machine, nvlink_before_pcie)
{
  /* Even with PCIe made faster than NVSwitch, GPUs of one node talk over NVSwitch. */
  const char *text =
    "{\"format\":\"parasol-machine\",\"version\":1,\"name\":\"x\",\"node\":{\"gpu\":\"h100\","
    "\"gpus\":4,\"fabric\":{\"type\":\"nvswitch\",\"bandwidth_GBps\":450,\"latency_us\":5},"
    "\"pcie\":{\"bandwidth_GBps\":63,\"latency_us\":0.1}}}";
  g_autoptr(GError) error = NULL;
  g_autoptr(SimMachine) m = parse(text, &error);
  cr_assert_not_null(m, "%s", error ? error->message : "");
  cr_assert_eq(count_kind(m, 0, 3, SIM_LINK_NVSWITCH), 2);
  cr_assert_eq(count_kind(m, 0, 3, SIM_LINK_PCIE), 0);
}

Test(machine, k80_cluster)
{
  /* Inside a node: GPU 0 -> board switch -> GPU 1 (2 PCIe links), GPU 0 -> board switch ->
   * shared switch -> board switch -> GPU 2 (4 links); 15.75 GB/s either way.  Between nodes
   * the 56 Gb/s FDR NIC (7 GB/s) on the shared switch is the bottleneck. */
  SimMachine *m = load("flexflow-k80");
  int n = 0;
  sim_machine_route(m, 0, 1, &n);
  cr_assert_eq(n, 2);
  sim_machine_route(m, 0, 2, &n);
  cr_assert_eq(n, 4);
  cr_assert_eq(count_kind(m, 0, 2, SIM_LINK_PCIE), 4);
  cr_assert(near(sim_machine_bandwidth(m, 0, 2), 15.75 * GBPS));
  cr_assert(near(sim_machine_bandwidth(m, 0, 63), 56 * GBITPS));
  /* GPU -> board switch -> shared switch -> NIC -> switch -> NIC -> shared -> board -> GPU. */
  sim_machine_route(m, 0, 63, &n);
  cr_assert_eq(n, 8);
  for (int a = 0; a < 64; a += 7)
    for (int b = 0; b < 64; b++)
      check_route(m, a, b);
  sim_machine_free(m);
}

Test(machine, summit_triads)
{
  /* Unity's cluster: 32 nodes of 6 V100.  Inside a triad one NVLink hop of 2 bricks
   * (50 GB/s); across triads GPU -> socket -> X-Bus -> socket -> GPU, whose 32 GB/s
   * X-Bus is the bottleneck; between nodes a 100 Gb/s EDR port (12.5 GB/s). */
  SimMachine *m = load("summit");
  cr_assert_eq(sim_machine_n_devices(m), 192);
  cr_assert_eq(sim_machine_device_spec(m, 0), sim_device_library_lookup("v100-16gb"));
  for (int a = 0; a < 6; a++)
    for (int b = 0; b < 6; b++) {
      if (a == b)
        continue;
      int n = 0;
      sim_machine_route(m, a, b, &n);
      if (a / 3 == b / 3) {
        cr_assert_eq(n, 1, "%d -> %d: one NVLink hop", a, b);
        cr_assert(near(sim_machine_bandwidth(m, a, b), 50 * GBPS), "%d -> %d", a, b);
      } else {
        cr_assert_eq(count_kind(m, a, b, SIM_LINK_INTERSOCKET), 1, "%d -> %d", a, b);
        cr_assert_eq(count_kind(m, a, b, SIM_LINK_NVLINK), 0, "%d -> %d", a, b);
        cr_assert(near(sim_machine_bandwidth(m, a, b), 32 * GBPS), "%d -> %d", a, b);
      }
    }
  cr_assert(near(sim_machine_bandwidth(m, 0, 6), 100 * GBITPS));
  cr_assert(near(sim_machine_bandwidth(m, 4, 191), 100 * GBITPS));
  /* GPUs 0-2 leave through socket 0's NIC, 3-5 through socket 1's: no X-Bus crossing. */
  cr_assert_eq(count_kind(m, 0, 6, SIM_LINK_INTERSOCKET), 0);
  cr_assert_eq(count_kind(m, 4, 10, SIM_LINK_INTERSOCKET), 0);
  sim_machine_free(m);
}

Test(machine, fat_tree_ecmp)
{
  /* 16 DGX-1 nodes, 4 per leaf: 4 leaves, 16 spines (one per port down).  Pairs of
   * different leaves spread over the spines; the same pair always takes the same one. */
  SimMachine *m = load("dgx1-v100:16");
  check_route(m, 0, 127);
  int spine_used[16] = { 0 };
  int n_pairs = 0;
  for (int a = 0; a < 32; a++)
    for (int b = 96; b < 128; b++) {
      int n = 0;
      const int *r = sim_machine_route(m, a, b, &n);
      int found = -1;
      for (int i = 0; i < n; i++) {
        const char *name = sim_machine_link_name(m, r[i]);
        if (g_str_has_prefix(name, "spine"))
          found = atoi(name + strlen("spine"));
      }
      cr_assert_geq(found, 0, "%d -> %d crosses a spine", a, b);
      spine_used[found]++;
      n_pairs++;
      int n2 = 0;
      const int *r2 = sim_machine_route(m, a, b, &n2);
      cr_assert_eq(r, r2, "routes are cached");
    }
  for (int s = 0; s < 16; s++)
    cr_assert_gt(spine_used[s], n_pairs / 16 / 3, "spine %d carries %d of %d pairs", s,
                 spine_used[s], n_pairs);
  /* Same leaf (nodes 0 and 3): no spine. */
  int n = 0;
  sim_machine_route(m, 0, 3 * 8, &n);
  cr_assert_eq(n, 6);
  sim_machine_free(m);
}

Test(machine, big_machine)
{
  /* dgx-a100:384: 3,072 GPUs, 20 nodes per rail leaf: 20 groups x 8 rails = 160 leaves,
   * 20 spines.  Loading lays out links only; routes come on demand. */
  gint64 t0 = g_get_monotonic_time();
  SimMachine *m = load("dgx-a100:384");
  gint64 t1 = g_get_monotonic_time();
  cr_log_info("dgx-a100:384 loaded in %.1f ms", (t1 - t0) / 1e3);
  cr_assert_eq(sim_machine_n_devices(m), 3072);
  cr_assert_eq(g_hash_table_size(m->routes), 0, "no route is computed up front");
  for (int a = 0; a < 3072; a += 97)
    for (int b = 0; b < 3072; b += 89)
      check_route(m, a, b);
  cr_assert(near(sim_machine_bandwidth(m, 0, 3071 - 7), 25 * GBPS));
  sim_machine_free(m);
}

/* Search workers query routes of one machine from several threads: every thread must see
 * the same cached route for a pair. */
typedef struct {
  SimMachine *m;
  int seed;
  const int *seen[64][64];
} RouteWorker;

static gpointer route_worker(gpointer data)
{
  RouteWorker *w = data;
  for (int i = 0; i < 64 * 64; i++) {
    int k = (i * 37 + w->seed * 11) % (64 * 64);
    int a = k / 64, b = k % 64, n = 0;
    w->seen[a][b] = sim_machine_route(w->m, a, b, &n);
  }
  return NULL;
}

Test(machine, concurrent_routes)
{
  SimMachine *m = load("dgx-a100:8");
  static RouteWorker workers[8];
  GThread *threads[8];
  for (int t = 0; t < 8; t++) {
    workers[t].m = m;
    workers[t].seed = t;
    threads[t] = g_thread_new("routes", route_worker, &workers[t]);
  }
  for (int t = 0; t < 8; t++)
    g_thread_join(threads[t]);
  for (int a = 0; a < 64; a++)
    for (int b = 0; b < 64; b++)
      for (int t = 1; t < 8; t++)
        cr_assert_eq(workers[t].seen[a][b], workers[0].seen[a][b], "route %d -> %d", a, b);
  check_all_routes(m);
  sim_machine_free(m);
}

Test(machine, round_trip)
{
  g_auto(GStrv) names = sim_machine_library_names();
  for (char **n = names; *n; n++) {
    SimMachine *m = load(*n);
    g_autofree char *json = sim_machine_to_json(m);
    g_autoptr(GError) error = NULL;
    SimMachine *m2 = sim_machine_from_json(json, "round-trip.json", 0, &error);
    cr_assert_not_null(m2, "%s: %s", *n, error ? error->message : "");
    g_autofree char *json2 = sim_machine_to_json(m2);
    cr_assert_str_eq(json, json2, "%s reads back to the same machine", *n);
    cr_assert_eq(sim_machine_n_links(m), sim_machine_n_links(m2));
    for (int l = 0; l < sim_machine_n_links(m); l++) {
      cr_assert_eq(sim_machine_link_bandwidth(m, l), sim_machine_link_bandwidth(m2, l));
      cr_assert_eq(sim_machine_link_latency(m, l), sim_machine_link_latency(m2, l));
      cr_assert_str_eq(sim_machine_link_name(m, l), sim_machine_link_name(m2, l));
    }
    sim_machine_free(m);
    sim_machine_free(m2);
  }
}

Test(machine, inline_spec_round_trip)
{
  /* A custom GPU from a library base with more memory: 96 GiB, the rest of an H100. */
  const char *text =
    "{\"format\":\"parasol-machine\",\"version\":1,\"name\":\"custom\",\"node\":{\"gpu\":"
    "{\"name\":\"h100-96\",\"base\":\"h100-sxm\",\"memory_GiB\":96,\"memory_bandwidth_GBps\":"
    "3900},\"gpus\":2,\"fabric\":{\"type\":\"nvswitch\",\"bandwidth_GBps\":450},"
    "\"pcie\":{\"bandwidth_GBps\":63}}}";
  g_autoptr(GError) error = NULL;
  g_autoptr(SimMachine) m = parse(text, &error);
  cr_assert_not_null(m, "%s", error ? error->message : "");
  const SimDeviceSpec *s = sim_machine_device_spec(m, 1);
  cr_assert_str_eq(s->name, "h100-96");
  cr_assert_eq(s->mem_capacity, (int64_t)96 << 30);
  cr_assert(near(s->mem_bandwidth, 3900 * GBPS));
  cr_assert(near(s->peak_flops[SIM_DTYPE_BF16], 989.4e12));
  /* The base's measured attention fractions carry over (sim/devices.c). */
  cr_assert(near(s->attention_fraction, 0.560) && near(s->attention_bwd_fraction, 0.540));
  g_autofree char *json = sim_machine_to_json(m);
  g_autoptr(SimMachine) m2 = parse(json, &error);
  cr_assert_not_null(m2, "%s", error ? error->message : "");
  cr_assert_eq(sim_machine_device_spec(m2, 0), s, "the same spec is interned once");
}

Test(machine, inline_spec_sets_the_attention_fractions)
{
  const char *text =
    "{\"format\":\"parasol-machine\",\"version\":1,\"name\":\"custom\",\"node\":{\"gpu\":"
    "{\"name\":\"h100-att\",\"base\":\"h100-sxm\",\"attention_fraction\":0.5,"
    "\"attention_bwd_fraction\":0.45},\"gpus\":2,\"fabric\":{\"type\":\"nvswitch\","
    "\"bandwidth_GBps\":450},\"pcie\":{\"bandwidth_GBps\":63}}}";
  g_autoptr(GError) error = NULL;
  g_autoptr(SimMachine) m = parse(text, &error);
  cr_assert_not_null(m, "%s", error ? error->message : "");
  const SimDeviceSpec *s = sim_machine_device_spec(m, 0);
  cr_assert(near(s->attention_fraction, 0.5) && near(s->attention_bwd_fraction, 0.45));
  g_autofree char *json = sim_machine_to_json(m);
  g_autoptr(SimMachine) m2 = parse(json, &error);
  cr_assert_not_null(m2, "%s", error ? error->message : "");
  cr_assert_eq(sim_machine_device_spec(m2, 0), s, "the fractions survive the round trip");
}

Test(machine, count_override_of_file)
{
  g_autofree char *path = g_build_filename(PARASOL_SOURCE_DIR, "data", "machines",
                                           "dgx-h100.json", NULL);
  g_autofree char *spec = g_strdup_printf("%s:4", path);
  SimMachine *m = load(spec);
  cr_assert_eq(sim_machine_n_devices(m), 32);
  sim_machine_free(m);
}

/* ---------------------------------------------------------------------------------- */
/* Errors: each names the file, the JSON path and what was expected.                   */

static void expect_error(const char *text, int code, const char *fragment)
{
  g_autoptr(GError) error = NULL;
  SimMachine *m = parse(text, &error);
  cr_assert_null(m, "expected an error containing '%s'", fragment);
  sim_machine_free(m);
  cr_assert_not_null(error);
  cr_assert_eq(error->domain, SIM_ERROR);
  cr_assert_eq(error->code, code, "code %d, expected %d: %s", error->code, code, error->message);
  cr_assert(g_str_has_prefix(error->message, "test.json:"), "names the file: %s",
            error->message);
  cr_assert(strstr(error->message, fragment), "'%s' does not contain '%s'", error->message,
            fragment);
}

#define HEAD "{\"format\":\"parasol-machine\",\"version\":1,\"name\":\"t\","
#define PCIE "\"pcie\":{\"bandwidth_GBps\":16}"

Test(machine_errors, malformed_json)
{
  /* json-glib reports line and column. */
  expect_error("{\n  \"format\": \"parasol-machine\",\n  \"version\": ]\n}", SIM_ERROR_PARSE,
               "test.json:3:");
  expect_error("", SIM_ERROR_PARSE, "expected a JSON object");
  expect_error("[1, 2]", SIM_ERROR_PARSE, "expected a JSON object");
}

Test(machine_errors, format_and_version)
{
  expect_error("{\"format\":\"parasol-graph\",\"version\":1}", SIM_ERROR_PARSE,
               "format: expected \"parasol-machine\", got \"parasol-graph\"");
  expect_error("{\"format\":\"parasol-machine\",\"version\":2}", SIM_ERROR_PARSE,
               "version: expected 1, got 2");
  expect_error("{\"version\":1}", SIM_ERROR_PARSE, "format: missing");
}

Test(machine_errors, missing_fields)
{
  expect_error("{\"format\":\"parasol-machine\",\"version\":1,\"node\":{}}", SIM_ERROR_PARSE,
               "name: missing");
  expect_error(HEAD "\"count\":1}", SIM_ERROR_PARSE, "node: missing");
  expect_error(HEAD "\"node\":{\"gpus\":8," PCIE "}}", SIM_ERROR_PARSE, "node.gpu: missing");
  expect_error(HEAD "\"node\":{\"gpu\":\"a100\"," PCIE "}}", SIM_ERROR_PARSE,
               "node.gpus: missing");
  expect_error(HEAD "\"node\":{\"gpu\":\"a100\",\"gpus\":8}}", SIM_ERROR_PARSE,
               "node.pcie: missing");
  expect_error(HEAD "\"node\":{\"gpu\":\"a100\",\"gpus\":8,\"fabric\":{\"type\":\"nvswitch\"},"
               PCIE "}}", SIM_ERROR_PARSE, "node.fabric.bandwidth_GBps: missing");
  /* Several nodes need a network, and the network needs NICs. */
  expect_error(HEAD "\"node\":{\"gpu\":\"a100\",\"gpus\":8," PCIE "},\"count\":2}",
               SIM_ERROR_PARSE, "network: missing");
  expect_error(HEAD "\"node\":{\"gpu\":\"a100\",\"gpus\":8," PCIE "},\"count\":2,"
               "\"network\":{\"type\":\"single-switch\"}}", SIM_ERROR_PARSE,
               "node.nics: missing");
}

Test(machine_errors, unknown_gpu)
{
  expect_error(HEAD "\"node\":{\"gpu\":\"rtx-9090\",\"gpus\":8," PCIE "}}", SIM_ERROR_UNKNOWN,
               "node.gpu: unknown GPU type 'rtx-9090'; known types: k80, p100");
  expect_error(HEAD "\"node\":{\"gpu\":{\"name\":\"x\",\"base\":\"nope\"},\"gpus\":8," PCIE "}}",
               SIM_ERROR_UNKNOWN, "node.gpu.base: unknown GPU type 'nope'");
  expect_error(HEAD "\"node\":{\"gpu\":{\"name\":\"x\",\"base\":\"h100-sxm\","
               "\"attention_bwd_fraction\":1.5},\"gpus\":8," PCIE "}}",
               SIM_ERROR_INVALID,
               "node.gpu.attention_bwd_fraction: expected a fraction of the peak, at most 1");
}

Test(machine_errors, bad_bandwidth)
{
  expect_error(HEAD "\"node\":{\"gpu\":\"a100\",\"gpus\":8,\"fabric\":{\"type\":\"nvswitch\","
               "\"bandwidth_GBps\":-5}," PCIE "}}", SIM_ERROR_INVALID,
               "test.json: node.fabric.bandwidth_GBps: expected a positive number, got -5");
  expect_error(HEAD "\"node\":{\"gpu\":\"a100\",\"gpus\":8,\"pcie\":{\"bandwidth_GBps\":0}}}",
               SIM_ERROR_INVALID, "node.pcie.bandwidth_GBps: expected a positive number, got 0");
  expect_error(HEAD "\"node\":{\"gpu\":\"a100\",\"gpus\":8,\"pcie\":{\"bandwidth_GBps\":\"fast\"}}}",
               SIM_ERROR_PARSE, "expected a positive number, got \"fast\"");
  expect_error(HEAD "\"node\":{\"gpu\":\"a100\",\"gpus\":8," PCIE ",\"nics\":{\"count\":1,"
               "\"bandwidth_Gbps\":100,\"bandwidth_GBps\":12.5}}}", SIM_ERROR_PARSE,
               "not both");
  expect_error(HEAD "\"node\":{\"gpu\":\"a100\",\"gpus\":8,\"pcie\":{\"bandwidth_GBps\":16,"
               "\"latency_us\":-1}}}", SIM_ERROR_INVALID,
               "node.pcie.latency_us: expected a number >= 0, got -1");
}

Test(machine_errors, bad_counts)
{
  expect_error(HEAD "\"node\":{\"gpu\":\"a100\",\"gpus\":8," PCIE "},\"count\":0}",
               SIM_ERROR_INVALID, "count: expected an integer >= 1, got 0");
  expect_error(HEAD "\"node\":{\"gpu\":\"a100\",\"gpus\":-2," PCIE "}}", SIM_ERROR_INVALID,
               "node.gpus: expected an integer from 1 to 1024, got -2");
  expect_error(HEAD "\"node\":{\"gpu\":\"a100\",\"gpus\":2.5," PCIE "}}", SIM_ERROR_PARSE,
               "node.gpus: expected an integer");
  expect_error(HEAD "\"node\":{\"gpu\":\"a100\",\"gpus\":8," PCIE ",\"nics\":{\"count\":0,"
               "\"bandwidth_Gbps\":100}}}", SIM_ERROR_INVALID, "node.nics.count");
}

Test(machine_errors, topology)
{
  /* A pair out of range, a GPU paired with itself, a pair given twice. */
  expect_error(HEAD "\"node\":{\"gpu\":\"v100\",\"gpus\":4,\"fabric\":{\"type\":\"nvlink-mesh\","
               "\"link_bandwidth_GBps\":25,\"pairs\":[[0,1,2],[1,4]]}," PCIE "}}",
               SIM_ERROR_INVALID, "node.fabric.pairs[1][1]: expected an integer from 0 to 3, "
               "got 4");
  expect_error(HEAD "\"node\":{\"gpu\":\"v100\",\"gpus\":4,\"fabric\":{\"type\":\"nvlink-mesh\","
               "\"link_bandwidth_GBps\":25,\"pairs\":[[2,2]]}," PCIE "}}", SIM_ERROR_INVALID,
               "node.fabric.pairs[0]: expected two different GPUs");
  expect_error(HEAD "\"node\":{\"gpu\":\"v100\",\"gpus\":4,\"fabric\":{\"type\":\"nvlink-mesh\","
               "\"link_bandwidth_GBps\":25,\"pairs\":[[0,1],[1,0]]}," PCIE "}}", SIM_ERROR_INVALID,
               "already paired at node.fabric.pairs[0]");
  /* PCIe switches: a GPU on two switches, a GPU on none, a parent that comes later. */
  expect_error(HEAD "\"node\":{\"gpu\":\"v100\",\"gpus\":2,\"pcie\":{\"bandwidth_GBps\":16,"
               "\"switches\":[{\"gpus\":[0,1]},{\"gpus\":[1]}]}}}", SIM_ERROR_INVALID,
               "node.pcie.switches[1].gpus[0]: GPU 1 is already on switch 0");
  expect_error(HEAD "\"node\":{\"gpu\":\"v100\",\"gpus\":2,\"pcie\":{\"bandwidth_GBps\":16,"
               "\"switches\":[{\"gpus\":[0]}]}}}", SIM_ERROR_INVALID,
               "node.pcie.switches: GPU 1 is on no switch");
  expect_error(HEAD "\"node\":{\"gpu\":\"v100\",\"gpus\":2,\"pcie\":{\"bandwidth_GBps\":16,"
               "\"switches\":[{\"gpus\":[0],\"parent\":1},{\"gpus\":[1]}]}}}", SIM_ERROR_INVALID,
               "node.pcie.switches[0].parent");
  expect_error(HEAD "\"node\":{\"gpu\":\"v100\",\"gpus\":2,\"pcie\":{\"bandwidth_GBps\":16,"
               "\"sockets\":2}}}", SIM_ERROR_PARSE,
               "node.pcie.intersocket_bandwidth_GBps: missing");
}

Test(machine_errors, unknown_names_and_keys)
{
  expect_error(HEAD "\"node\":{\"gpu\":\"a100\",\"gpus\":8,\"fabric\":{\"type\":\"infinity\"},"
               PCIE "}}", SIM_ERROR_UNKNOWN,
               "node.fabric.type: unknown fabric 'infinity'; known fabrics: pcie, nvswitch, "
               "nvlink-mesh");
  expect_error(HEAD "\"node\":{\"gpu\":\"a100\",\"gpus\":8,\"fabric\":{\"type\":\"nvswitch\","
               "\"bandwith_GBps\":300}," PCIE "}}", SIM_ERROR_PARSE,
               "node.fabric.bandwith_GBps: unknown key");
  expect_error(HEAD "\"node\":{\"gpu\":\"a100\",\"gpus\":8," PCIE ",\"nics\":{\"count\":1,"
               "\"bandwidth_Gbps\":100}},\"count\":2,\"network\":{\"type\":\"torus\"}}",
               SIM_ERROR_UNKNOWN, "network.type: unknown network 'torus'");
  expect_error(HEAD "\"node\":{\"gpu\":\"a100\",\"gpus\":8," PCIE ",\"nics\":{\"count\":1,"
               "\"bandwidth_Gbps\":100}},\"count\":2,\"network\":{\"type\":\"fat-tree\"}}",
               SIM_ERROR_PARSE, "network.nodes_per_leaf: missing");
  expect_error(HEAD "\"node\":{\"gpu\":\"a100\",\"gpus\":8," PCIE ",\"nics\":{\"count\":1,"
               "\"bandwidth_Gbps\":100}},\"count\":2,\"network\":{\"type\":\"fat-tree\","
               "\"nodes_per_leaf\":1,\"oversubscription\":0.5}}", SIM_ERROR_INVALID,
               "network.oversubscription: expected a factor >= 1");
  expect_error(HEAD "\"node\":{\"gpu\":\"a100\",\"gpus\":8," PCIE ",\"nics\":{\"count\":1,"
               "\"bandwidth_Gbps\":100}},\"count\":2,\"network\":{\"type\":\"fat-tree\","
               "\"nodes_per_leaf\":1,\"pxn\":true}}", SIM_ERROR_INVALID,
               "network.pxn: only a rail-optimized network has rails to relay to");
  expect_error(HEAD "\"node\":{\"gpu\":\"a100\",\"gpus\":8," PCIE ",\"nics\":{\"count\":1,"
               "\"bandwidth_Gbps\":100}},\"count\":2,\"network\":{\"type\":\"rail-optimized\","
               "\"pxn\":\"yes\"}}", SIM_ERROR_INVALID, "network.pxn: expected true or false");
}

Test(machine_errors, load)
{
  g_autoptr(GError) error = NULL;
  cr_assert_null(sim_machine_load("no-such-machine", &error));
  cr_assert_eq(error->code, SIM_ERROR_UNKNOWN);
  cr_assert(strstr(error->message, "dgx-a100"), "lists the library: %s", error->message);
  g_clear_error(&error);
  cr_assert_null(sim_machine_load("dgx-a100:0", &error));
  cr_assert_eq(error->code, SIM_ERROR_INVALID);
  cr_assert(strstr(error->message, "node count"), "%s", error->message);
  g_clear_error(&error);
  cr_assert_null(sim_machine_load("dgx-a100:many", &error));
  cr_assert_eq(error->code, SIM_ERROR_INVALID);
  g_clear_error(&error);
  cr_assert_null(sim_machine_load("/nonexistent/dir/m.json", &error));
  cr_assert_eq(error->code, SIM_ERROR_IO);
}
