/* plan-estimate.c — a closed-form estimate of a Megatron-style plan's iteration time and
 * memory, computed from the graph's totals and the machine's figures without building or
 * simulating the plan.  It only ranks plans, so that a search with little time simulates
 * the most promising ones first; the simulator decides which is faster.
 *
 * For a plan of TP t, PP p, DP d, m micro-batches of b samples, v model chunks per stage,
 * on N devices (model FLOPs F per iteration, P parameters, L layers):
 *   compute   F (1 + r) / (N peak e): r the recomputation's extra forward (full: the
 *             forward again, F_fwd / F; selective: 3% of it), e a GEMM efficiency of 0.6
 *             that falls for small products (b s h / t against 500,000);
 *   bubble    compute (p - 1) / (v m), the 1F1B pipeline's fill and drain;
 *   tensor    4 all-reduces (6 with full recomputation) of b s h 2 bytes per layer and
 *             micro-batch over the t ranks' NVLink, 2 (t - 1) / t of them on the wire;
 *             with the tensor-parallel overlap (and sequence parallelism) each half of an
 *             all-reduce (q) waits only what its GEMM (k h^2 parameters, g each) leaves
 *             uncovered, max(0, q - k g), k 1, 3, 4 and 4 a pass;
 *   ring      context parallelism over c ranks: (c - 1) steps a pass and micro-batch of
 *             each layer wait what a block's keys and values take beyond the attention of
 *             one block, three times (forward, and backward's twice the bytes and work);
 *   pipeline  2 (v p - 1) transfers of b s h 2 bytes over the network: those on the fill
 *             and drain path (the others overlap the other micro-batches' work);
 *   elements  40 bytes of device memory per token and hidden unit of each layer and
 *             micro-batch (layer norms, dropout, residuals), divided by t only with
 *             sequence parallelism;
 *   update    Adam's 28 bytes of device memory per parameter (divided by d with ZeRO-1);
 *   data      the ring all-reduce of the 2 P / (t p) bytes of gradients over the network,
 *             2 (d - 1) / d of them on the wire, not hidden;
 *   memory    the weights, gradients and Adam states, 16 P / (t p) bytes (ZeRO-1: the 12
 *             bytes of fp32 states divided by d), plus the activations of the forwards the
 *             first stage holds (1F1B: p micro-batches of L / p layers; interleaved:
 *             Megatron-LM's warm-up, 2 (p - 1) + (v - 1) p + 1 chunks of L / (v p) layers):
 *             34 b s h bytes per layer divided by t with sequence parallelism (plus 3 b s h
 *             the simulator keeps whole), 10 b s h + 24 b s h / t without (Korthikanti et
 *             al. 2022), 5 a s^2 b / t more for the attention scores unless recomputed,
 *             2 b s h with full recomputation; a plan fits below 95% of a device.
 * h follows from P ~ 12 L h^2, s is the tokens per sample, a the heads (h / 128).
 *
 * A mixture of experts (E experts of width f, top k, in L_e layers of P_e parameters and
 * F_e FLOPs) under expert parallelism ep and expert tensor parallelism e (etp; tp
 * without it) is estimated apart from the dense rest (P - P_e, F - F_e, h the experts'
 * model dimension):
 *   experts   F_e (1 + r) / (N peak e_x): balanced routing gives each GPU 1 / N of the
 *             experts' work whatever the layout; e_x as e with the rows of an expert's
 *             GEMM on a GPU, its tokens x f / (4 e) (the dense b s h / t being b s times
 *             a quarter of an MLP's width 4 h / t): an expert group (ep e GPUs, ep e / t
 *             replicas) routes ep e b s / t tokens, E of them k times, each expert of a
 *             GPU taking x = ep e b s k / (t E) rows;
 *   all-to-all  4 a layer and micro-batch (6 with full recomputation: the dispatch and
 *             combine of each forward and their backward), each GPU sending the k copies
 *             of its b s / t tokens' share, (ep - 1) / ep of them to another expert shard:
 *             b s k h 2 (ep - 1) / (ep t) bytes, over NVLink while the group fits a node
 *             (ep e consecutive GPUs with etp other than tp; ep replicas t c apart
 *             otherwise), e times as many over the network where it does not (each
 *             of an expert's e GPUs receives its own copy there), not hidden;
 *   memory    the experts' weights, gradients and states over ep e tensor ranks and the
 *             d c t / (ep e) expert-data-parallel ones (ZeRO-1 and the gradients'
 *             all-reduce): 16 P_e / (ep e p) bytes, the 12 of states divided by
 *             d c t / (ep e) with ZeRO-1. */
#include "search-private.h"

#include <math.h>
#include <string.h>

static int n_layers(const SimGraph *g)
{
  int n = 0;
  for (int op = 0; op < sim_graph_n_ops(g); op++)
    n += sim_graph_op_is_checkpoint(g, op);
  return MAX(n, 1);
}

/* The slowest link on the route from device @a to @b (bytes/s); @def without one. */
static double route_bandwidth(const SimMachine *m, int a, int b, double def)
{
  int n = 0;
  const int *links = sim_machine_route(m, a, b, &n);
  double bw = INFINITY;
  for (int i = 0; links && i < n; i++)
    bw = MIN(bw, sim_machine_link_bandwidth(m, links[i]));
  return isfinite(bw) && bw > 0 ? bw : def;
}

/* The mixture-of-experts operators of @g: their parameters, FLOPs (forward and
 * backward), number, and the experts, width, top k and model dimension of the first. */
typedef struct {
  double params, flops;
  int layers;
  double experts, width, top_k, model;
} MoeTotals;

static MoeTotals moe_totals(const SimGraph *g)
{
  MoeTotals x = { 0 };
  for (int op = 0; op < sim_graph_n_ops(g); op++) {
    if (sim_graph_op_type(g, op) != SIM_OP_MOE)
      continue;
    x.params += (double)sim_graph_op_n_params(g, op);
    x.flops += sim_graph_op_forward_flops(g, op) + sim_graph_op_backward_flops(g, op);
    if (x.layers++ > 0)
      continue;
    for (int d = 0; d < sim_graph_op_n_dims(g, op); d++) {
      const char *name = sim_graph_op_dim_name(g, op, d);
      double size = (double)sim_graph_op_dim_size(g, op, d);
      if (!strcmp(name, "x"))
        x.experts = size;
      else if (!strcmp(name, "f"))
        x.width = size;
      else if (!strcmp(name, "d"))
        x.model = size;
    }
    g_autoptr(SimAttrs) at = sim_graph_op_attrs(g, op);
    int64_t k = 1;
    sim_attrs_get_int(at, "top_k", &k);
    x.top_k = (double)k;
  }
  return x;
}

/* The efficiency of GEMMs of @rows (a micro-batch's rows times a quarter of the output
 * width a GPU computes): small products run below the large ones' 0.6. */
static double gemm_efficiency(double rows)
{
  return MAX(0.6 * rows / (rows + 0.5e6), 0.05);
}

double search_megatron_estimate(const SearchProblem *p, const SimMegatronOptions *o,
                                gboolean *fits)
{
  SearchPlanTerms terms;
  double time = search_megatron_estimate_terms(p, o, &terms);
  if (fits)
    *fits = terms.fits;
  return time;
}

double search_megatron_estimate_terms(const SearchProblem *p, const SimMegatronOptions *o,
                                      SearchPlanTerms *out)
{
  const SimGraph *g = p->g;
  const SimMachine *m = p->m;
  SearchPlanTerms z = { .fits = TRUE };
  *out = z;
  int t = MAX(o->tp, 1), pp = MAX(o->pp, 1), d = MAX(o->dp, 1), c = MAX(o->cp, 1);
  int n = t * pp * d * c;
  int mb = MAX(o->microbatches, 1);
  double b = (double)MAX(o->microbatch_size, 1);
  int v = o->schedule == SIM_SCHEDULE_INTERLEAVED ? MAX(o->chunks, 1) : 1;
  const SimDeviceSpec *dev = sim_machine_device_spec(m, p->devices[0]);
  double peak = dev->peak_flops[SIM_DTYPE_FP16];
  if (!(peak > 0))
    peak = 100e12;
  double P = (double)sim_graph_n_params(g);
  double L = n_layers(g);
  double s = (double)MAX(sim_graph_tokens_per_sample(g), 1);
  MoeTotals moe = moe_totals(g);
  int ep = MAX(o->ep, 1), et = o->etp > 0 ? o->etp : t;
  /* The experts' parameters apart from the dense rest's (Pd), whose shape gives h. */
  double Pe = moe.params, Pd = MAX(P - Pe, 0.0);
  double h = moe.layers > 0 && moe.model > 0 ? moe.model : sqrt(MAX(P, 1.0) / (12.0 * L));
  double heads = MAX(1.0, h / 128.0);
  double fwd = sim_graph_forward_flops(g), bwd = sim_graph_backward_flops(g);
  double F = fwd + bwd;
  double Fe = MIN(moe.flops, F);
  double r = o->memory.recompute == SIM_RECOMPUTE_FULL        ? fwd / MAX(F, 1.0)
             : o->memory.recompute == SIM_RECOMPUTE_SELECTIVE ? 0.03 * fwd / MAX(F, 1.0)
                                                               : 0.0;
  /* Context parallelism: each rank holds s / cp positions of every sample (its ring's
   * transfers: below). */
  double sc = s / c;
  /* Small products run below the large ones' efficiency. */
  double rows = b * sc * h / t;
  double eff = gemm_efficiency(rows);
  double compute = (F - Fe) * (1 + r) / ((double)n * peak * eff);
  /* The experts: each GPU 1 / n of their work, in GEMMs of the rows one of its experts
   * gets from its group's tokens. */
  double experts = 0, a2a = 0, a2a_bytes = 0;
  if (moe.layers > 0) {
    out->expert_rows = ep * et * b * sc * moe.top_k / (t * MAX(moe.experts, 1.0));
    double eff_x = gemm_efficiency(out->expert_rows * moe.width / (4.0 * et));
    experts = Fe * (1 + r) / ((double)n * peak * eff_x);
    compute += experts;
  }
  double bubble = compute * (pp - 1) / ((double)v * mb);
  int node = sim_machine_node_n_devices(m, sim_machine_device_node(m, p->devices[0]));
  double nvlink = route_bandwidth(m, p->devices[0], p->devices[MIN(1, p->n_devices - 1)], 200e9);
  int far = MIN(node, p->n_devices - 1);
  double net = route_bandwidth(m, p->devices[0], p->devices[far], 25e9);
  double act = b * sc * h * 2;
  double tensor = 0;
  /* The time of a GEMM of h^2 parameters on a micro-batch's rows (b s h / t of them). */
  double gemm = 2.0 * b * sc * h * h / t / (peak * MAX(eff, 0.05));
  if (t > 1) {
    double ar = 2.0 * (t - 1) / t * act / nvlink;
    int sets = o->memory.recompute == SIM_RECOMPUTE_FULL ? 3 : 2;
    tensor = mb * (L / pp) * 2 * sets * ar;
    if (o->tp_comm_overlap && o->sequence_parallel) {
      /* Each all-reduce is a reduce-scatter and an all-gather of half its time q, each
       * overlapped with a GEMM of k h^2 parameters (lower-tensors.c, TpOverlap): forward
       * (and recomputing) the gathers into the QKV (k 3) and first MLP (4) products and
       * the reduce-scatters after the output projection (1) and the second MLP product
       * (4); backward the gathers into the output projection's (1) and the second MLP
       * product's (4) and the reduce-scatters beside the QKV (3) and first MLP (4) weight
       * gradients.  Each waits max(0, q - k g) instead of q. */
      static const double k[4] = { 1, 3, 4, 4 };
      double q = ar / 2, hidden = 0;
      for (int i = 0; i < 4; i++)
        hidden += MIN(q, k[i] * gemm);
      tensor -= mb * (L / pp) * sets * hidden;
    }
  }
  /* Context parallelism's ring (lower.c, build_ring()): in each of c - 1 steps a rank
   * sends its neighbour a block of keys and values (2 b (s / c) h 2 / t bytes; GQA's
   * fewer key-value heads are not known here) while it computes the attention of its
   * queries against one block, 2 b (s / c)^2 h / t FLOPs forward and twice that
   * backward (the causal mask halving a dense attention's 4 b s^2 h); it waits for what
   * the block's flow takes beyond that, twice the bytes backward.  The neighbours are t
   * devices apart: NVLink while t c devices fit a node. */
  double ring = 0;
  if (c > 1) {
    double block = 2.0 * b * sc * h * 2 / t;
    double f = block / (t * c <= node ? nvlink : net);
    double a = 2.0 * b * sc * sc * h / t / (peak * MAX(eff, 0.05));
    ring = mb * (L / pp) * (c - 1) * 3 * MAX(0.0, f - a);
  }
  /* The experts' all-to-alls: the k copies of a GPU's share of its replica's tokens,
   * (ep - 1) / ep of them to another expert shard, on NVLink while the expert group (ep
   * etp consecutive GPUs with an expert layout of its own, ep replicas t c apart
   * otherwise) fits a node.  Over several nodes each of the etp GPUs of an expert shard
   * receives its tokens over the network itself, as the simulator lays them out
   * (docs/llm.md, "Not modelled yet"): etp times the bytes. */
  if (moe.layers > 0 && ep > 1) {
    a2a_bytes = b * sc * moe.top_k * h * 2.0 * (ep - 1) / ((double)ep * t);
    int span = et != t ? ep * et : ep * t * c;
    if (span > node)
      a2a_bytes *= et;
    int sets = o->memory.recompute == SIM_RECOMPUTE_FULL ? 6 : 4;
    a2a = mb * ((double)moe.layers / pp) * sets * a2a_bytes / (span <= node ? nvlink : net);
  }
  /* Transfers between stages overlap the other micro-batches' work: what the iteration
   * waits for are those on the fill and drain path, once through every chunk boundary
   * each way. */
  double pipe = pp > 1 ? 2.0 * (v * pp - 1) * act / (o->scatter_gather ? t : 1) / net : 0;
  /* Element-wise work (layer norms, dropout, residuals, bias and activation functions):
   * about 40 bytes of device memory per token and hidden unit of a layer, forward and
   * backward, split over the tensor-parallel ranks only with sequence parallelism. */
  double hbm = dev->mem_bandwidth > 0 ? dev->mem_bandwidth : 1.5e12;
  double elementwise = mb * (L / pp) * 40.0 * b * sc * h / (o->sequence_parallel ? t : 1) / hbm;
  /* The optimizer step: Adam reads and writes about 28 bytes per parameter (fp32 master
   * weights and moments, 16-bit weights and gradients), each replica's share with ZeRO-1. */
  /* The context ranks synchronize gradients and shard ZeRO's states with the replicas;
   * the experts' over their expert-data-parallel ranks, each GPU holding 1 / (ep etp) of
   * them. */
  int dc = d * c;
  double edc = MAX((double)dc * t / ((double)ep * et), 1.0);
  double Wd = Pd / (t * pp), We = Pe / ((double)ep * et * pp);
  double share = Wd / (o->memory.zero1 ? dc : 1) + We / (o->memory.zero1 ? edc : 1);
  double update = share * 28.0 / hbm;
  if (o->memory.offload > 0) {
    /* The offloaded share steps on the host, each GPU on its share of the node's cores at
     * CPU-Adam's rate (10^10 parameters in 2.57 s a node, sim/lower-sync.c); the PCIe
     * transfers are left out. */
    update = update * (1 - o->memory.offload) + share * o->memory.offload * node / (10e9 / 2.57);
  }
  double data = (dc > 1 ? 2.0 * (dc - 1) / dc * 2.0 * Wd / net : 0) +
                (edc > 1 ? 2.0 * (edc - 1) / edc * 2.0 * We / net : 0);
  /* Memory of the first stage. */
  double off = o->memory.offload;
  double states = Wd * (4.0 + 12.0 * (1 - off) / (o->memory.zero1 ? dc : 1)) +
                  We * (4.0 + 12.0 * (1 - off) / (o->memory.zero1 ? edc : 1));
  double per_layer = o->memory.recompute == SIM_RECOMPUTE_FULL
                       ? act
                       : b * sc * h * (o->sequence_parallel ? 34.0 / t + 3.0 : 10.0 + 24.0 / t) +
                           (o->memory.recompute == SIM_RECOMPUTE_SELECTIVE
                              ? 0
                              : 5.0 * heads * sc * s * b / t);
  /* The first stage holds the forwards of its warm-up and the one under way: pp - 1 of
   * them in 1F1B; 2 (pp - 1) + (v - 1) pp chunks of L / (v pp) layers in the interleaved
   * schedule (Megatron-LM's warm-up), never more than the micro-batches it runs. */
  double chunk_runs = v > 1 ? 2.0 * (pp - 1) + (double)(v - 1) * pp + 1 : (double)pp;
  double held = MIN(chunk_runs, (double)mb * v) * (L / ((double)pp * v)) * per_layer;
  out->compute = compute;
  out->experts = experts;
  out->alltoall = a2a;
  out->alltoall_bytes = a2a_bytes;
  out->states = states;
  out->expert_states = We * (4.0 + 12.0 * (1 - off) / (o->memory.zero1 ? edc : 1));
  out->memory = states + held;
  if (dev->mem_capacity > 0)
    out->fits = states + held <= 0.95 * (double)dev->mem_capacity;
  out->time = compute + bubble + tensor + ring + a2a + pipe + elementwise + update + data;
  return out->time;
}

gboolean search_megatron_cannot_fit(const SearchProblem *p, const SimMegatronOptions *o)
{
  if (!p->memory_limit || o->dp < 1)
    return FALSE;
  const SimDeviceSpec *dev = sim_machine_device_spec(p->m, p->devices[0]);
  if (dev->mem_capacity <= 0)
    return FALSE;
  /* The 16-bit weights and their gradients alone, spread as evenly as the tensor- and
   * pipeline-parallel ranks could spread them (and, under ZeRO-3, the data- and context-
   * parallel ones): a lower bound on what the fullest device holds from the start,
   * whatever the optimizer, ZeRO-1 or recomputation. */
  int t = MAX(o->tp, 1), ep = MAX(o->ep, 1), et = o->etp > 0 ? o->etp : t;
  double ranks = (double)t * MAX(o->pp, 1);
  /* The experts spread over ep x etp tensor ranks instead (and, under ZeRO-3, the
   * expert-data-parallel ones: as many GPUs in all). */
  double eranks = (double)ep * et * MAX(o->pp, 1);
  if (o->memory.zero1 && o->memory.zero3) {
    ranks *= (double)MAX(o->dp, 1) * MAX(o->cp, 1);
    eranks = ranks;
  }
  double Pe = moe_totals(p->g).params;
  double Pd = MAX((double)sim_graph_n_params(p->g) - Pe, 0.0);
  double bytes = 4.0 * (Pd / ranks + Pe / eranks);
  return bytes > (double)dev->mem_capacity;
}
