/* lower-tensors.c — the blocks of the tensors that the lowering (lower.c) makes: partial
 * sums reduced among their holders, the pieces each consumer shard needs sent as flows
 * (or scattered and gathered across pipeline stages), expert parallelism as an all-to-all.
 */
#include "lower-private.h"
#include "network.h"

#include <math.h>
#include <string.h>

/* ---- tensors: reductions and transfers ------------------------------------------------ */

/* Groups the shards of @l by their region (@regs[sh * stride + offset]) and, where @tags
 * is not NULL, by their tag as well. */
GArray *lower_group_holders(SimKeyIndex *seen, const OpLay *l, const SimRegion *regs,
                             int stride, int offset, const int *tags)
{
  int ns = l->n_shards;
  GArray *groups = g_array_sized_new(FALSE, TRUE, sizeof(Holders), (guint)MAX(ns, 1));
  /* Shards with equal regions are usually few and far apart; a hash on the region keeps
   * this linear. */
  sim_key_index_clear(seen);
  int *count = g_new0(int, 2 * (size_t)MAX(ns, 1));
  int *gid = count + ns;
  for (int sh = 0; sh < ns; sh++) {
    RegionKey key;
    /* Only the region's own dimensions count: the rest of the struct is not defined. */
    memset(&key, 0, sizeof key);
    const SimRegion *src = &regs[sh * stride + offset];
    key.r.ndim = src->ndim;
    for (int d = 0; d < src->ndim; d++) {
      key.r.lo[d] = src->lo[d];
      key.r.hi[d] = src->hi[d];
    }
    key.tag = tags ? tags[sh] : 0;
    /* The hash of what the key holds: its bounds and tag (the rest is zero). */
    uint64_t hk = 0x9e3779b97f4a7c15u ^ (uint64_t)(uint32_t)key.tag ^ ((uint64_t)src->ndim << 32);
    for (int d = 0; d < src->ndim; d++) {
      hk = (hk ^ (uint64_t)src->lo[d]) * 0xff51afd7ed558ccdu;
      hk ^= hk >> 32;
      hk = (hk ^ (uint64_t)src->hi[d]) * 0xff51afd7ed558ccdu;
      hk ^= hk >> 32;
    }
    gboolean added;
    gid[sh] = (int)sim_key_index_get_hashed(seen, &key, hk, &added);
    if (added) {
      Holders h = { .region = key.r };
      g_array_append_val(groups, h);
    }
    count[gid[sh]]++;
  }
  /* Every group's members, then every group's devices, in one allocation that the first
   * group's members start (lower_holders_free()). */
  int *pool = g_new(int, 2 * (size_t)MAX(ns, 1));
  for (guint k = 0, off = 0; k < groups->len; k++) {
    Holders *h = &g_array_index(groups, Holders, k);
    h->members = pool + off;
    h->devs = pool + ns + off;
    off += (guint)count[k];
  }
  /* A large group (a weight every shard holds whole: 1,024 shards over 16,384 GPUs) finds
   * whether it has a device already in a bit set of the devices, not by a look at each
   * device it has. */
  enum { LARGE_GROUP = 32 };
  int max_dev = -1;
  for (guint k = 0; k < groups->len && max_dev < 0; k++)
    if (count[k] > LARGE_GROUP)
      for (int sh = 0; sh < ns; sh++)
        max_dev = MAX(max_dev, l->dev[sh]);
  size_t words = max_dev >= 0 ? (size_t)max_dev / 64 + 1 : 0;
  uint64_t **has = words ? g_new0(uint64_t *, groups->len) : NULL;
  for (int sh = 0; sh < ns; sh++) {
    Holders *h = &g_array_index(groups, Holders, gid[sh]);
    h->members[h->n++] = sh;
    int dev = l->dev[sh];
    gboolean dup = FALSE;
    if (has && count[gid[sh]] > LARGE_GROUP) {
      uint64_t **bits = &has[gid[sh]];
      if (!*bits)
        *bits = g_new0(uint64_t, words);
      dup = ((*bits)[dev / 64] >> (dev % 64)) & 1;
      (*bits)[dev / 64] |= UINT64_C(1) << (dev % 64);
    } else {
      for (int k = 0; k < h->n_devs; k++)
        dup |= h->devs[k] == dev;
    }
    if (!dup)
      h->devs[h->n_devs++] = dev;
    if (l->cidx[sh] >= 0)
      h->any_sim = TRUE;
  }
  for (guint k = 0; has && k < groups->len; k++)
    g_free(has[k]);
  g_free(has);
  g_free(count);
  if (!groups->len)
    g_free(pool);
  return groups;
}

void lower_holders_free(GArray *groups)
{
  if (groups->len)
    g_free(g_array_index(groups, Holders, 0).members);
  g_array_free(groups, TRUE);
}

/* With sharded optimizer states (ZeRO-1) the devices that hold the same region of the
 * weights divide its update: each of n steps 1/n of the states, in 1/n of the time (the
 * smaller step's launch included: microseconds against the milliseconds of a large
 * step).  The groups are those of the gradient synchronization (op_sync_build): shards
 * with equal regions of the first weight, each copy of a replicated shard on its own. */
void lower_zero1_update_share(SimLowering *lw, OpLay *l, const SimRegion *wr, int reps)
{
  int *tag = g_new(int, l->n_shards);
  for (int sh = 0; sh < l->n_shards; sh++)
    tag[sh] = sh % reps;
  GArray *groups = lower_group_holders(&lw->regions, l, wr, 1, 0, tag);
  for (guint k = 0; k < groups->len; k++) {
    const Holders *h = &g_array_index(groups, Holders, k);
    if (h->n_devs > 1)
      for (int i = 0; i < h->n; i++)
        l->t_u[h->members[i]] /= h->n_devs;
  }
  lower_holders_free(groups);
  g_free(tag);
}

/* Where one group's data is ready in one micro-batch and pass: either each member's own
 * compute task, or the end of the reduction over the group. */
typedef struct {
  gboolean reduced;
  SimTaskRef end;
} Ready;

/* Makes the reductions of @groups (partial sums over the shards of op @l) for micro-batch
 * @mb of pass @pass (a compute pass of @l) and returns where each group is ready. */
static void record_group(SimLowering *lw, int block, SimSemKind kind, SimTaskRef at, int tensor,
                         gboolean grad, const SimRegion *region, const int *devs, int n_devs)
{
  if (!lw->record)
    return;
  SimTaskSem m = { .index = at.index, .kind = kind, .grad = grad, .tensor = tensor,
                   .n_devs = n_devs };
  if (region)
    m.region = *region;
  m.devs = g_memdup2(devs, sizeof(int) * (size_t)MAX(n_devs, 1));
  sim_taskgraph_sem_add(lw->tg, block, &m);
}

/* Tensor-parallel communication overlap (SimStrategy.tp_comm_overlap), as Transformer
 * Engine's userbuffers run it under sequence parallelism (NeMo's tp_comm_overlap, with
 * the configuration NeMo ships for LLaMA-class models of hidden size 8192 on H100 at TP 4;
 * docs/llm.md names it).  Over a group of n
 * tensor-parallel ranks, with g the time of the GEMM involved and S the bytes of the
 * whole tensor, T_AG and T_RS the ring all-gather and reduce-scatter times of the
 * collective model on an idle machine (sim_collective_time()):
 *  - the all-gather into an op (forward: its input, into its first GEMM; backward: its
 *    output's gradient, into its backward's first GEMM) is a ring exchange on the copy
 *    engines: the GEMM runs in n chunks, chunk k on the piece that step k brought, so
 *    that the GEMM ends (n - 1) max(0, T_AG / (n - 1) - g / n) later than alone;
 *  - the reduce-scatter of an op's partial output (forward) is pipelined: the op's last
 *    GEMM runs in k chunks (SimTpOverlap.chunks; by default n) on the SMs that the
 *    communication leaves it (by default 24 of them taken for attention's output
 *    projection, 16 for the others: the configuration's proj_fprop and fc2_fprop;
 *    SimTpOverlap.sms_attention and sms_other), each chunk's reduce-scatter (T_RS of
 *    S / k) after it, so that with c = g SMs / (SMs - taken) / k and a that time, the
 *    result is ready c + a + (k - 1) max(c, a) - g after the op's end;
 *  - the reduce-scatter of an op's partial input gradient (backward) overlaps the
 *    backward's last GEMM (the weight gradient) whole (the configuration's bulk overlap,
 *    on SMs the GEMM keeps): ready max(0, T_RS - g) after the op's end.
 * Each wait is a delay (no resource held) between the tasks it separates.  The bytes go
 * on the links all the same, as the plain plan's: each gather its ring all-gather (a
 * piece that forms none, a flow from its holder), each reduce-scatter its ring, started
 * when the data is ready; they share the links with all other traffic (an expert
 * all-to-all on the same NVSwitch ports slows by them), but no compute task waits for
 * them: the op's own timing is the closed form above, which takes the collective at its
 * idle-machine speed (a ring slowed by other traffic does not delay the GEMM; splitting
 * the GEMM into the chunks that would wait for each step is not modelled).  A collective is
 * overlapped only inside one stage where the consumers of a reduction each take a part of
 * it on a device of its group, or the consumer of a gather takes it from its own group. */
typedef struct {
  gboolean on;
  gboolean bulk;       /* the backward reduce-scatter                                  */
  int taken;           /* SMs the pipelined reduce-scatter takes from the GEMM           */
} TpOverlap;

static double overlap_rs_delay(SimLowering *lw, const OpLay *l, int sh, const Holders *h,
                               double bytes, const TpOverlap *ov)
{
  int n = h->n_devs;
  if (ov->bulk) {
    double g = l->t_gemm[4 * (size_t)sh + TP_GEMM_LAST_B];
    double rs = sim_collective_time(lw->m, SIM_COLL_REDUCE_SCATTER, SIM_ALLREDUCE_RING, &lw->cp,
                                    h->devs, n, bytes);
    return MAX(0.0, rs - g);
  }
  double g = l->t_gemm[4 * (size_t)sh + TP_GEMM_LAST_F];
  double slow = l->sms > ov->taken ? (double)l->sms / (l->sms - ov->taken) : 1.0;
  int k = lw->s->tp_overlap.chunks > 0 ? lw->s->tp_overlap.chunks : n;
  double c = g * slow / k;
  double a = sim_collective_time(lw->m, SIM_COLL_REDUCE_SCATTER, SIM_ALLREDUCE_RING, &lw->cp,
                                 h->devs, n, bytes / k);
  return MAX(0.0, c + a + (k - 1) * MAX(c, a) - g);
}

/* Where the network says a ring alone ends. */
static void step_end(void *user, int flow_task, double end)
{
  *(double *)user = end;
}

/* A ring step (sim_lowering_ring_steps()): the reduction @coll of group @h, which one
 * simulated shard alone waits for, as a compute task of that shard's device that runs
 * right after the shard's task (@pass, @mb) on its stream, for as long as the ring's
 * flow takes alone on its links (the time the engine's group schedule gives it,
 * engine-groups.c: its latency, then its bytes at the network's rate).  Only a ring
 * that sim_collective_lower_bare() lowers as a whole node's one flow qualifies.  Where
 * the stream does nothing but wait for the ring, and nothing else crosses its links,
 * the ring ends when the step does; sim_lowering_settle_ring_steps() checks that once the
 * graph is whole.  TRUE with the step in @out. */
static gboolean ring_step(SimLowering *lw, int block, const OpLay *l, const Holders *h,
                          const SimCollective *coll, int pass, int mb, SimTaskRef *out)
{
  if (!lw->ring_steps || h->n_devs > STEP_RING_MAX)
    return FALSE;
  int sh = -1;
  for (int i = 0; i < h->n; i++)
    if (l->cidx[h->members[i]] >= 0) {
      if (sh >= 0)
        return FALSE;
      sh = h->members[i];
    }
  if (sh < 0)
    return FALSE;
  int32_t key[STEP_RING_MAX + 2] = { 0 };
  key[0] = coll->kind;
  key[1] = h->n_devs;
  memcpy(key + 2, h->devs, sizeof(int32_t) * (size_t)h->n_devs);
  gboolean added;
  guint id = sim_key_index_get(&lw->step_rings, key, &added);
  if (added) {
    StepRing r = { 0 };
    int32_t links[STEP_RING_MAX * 8];
    int n_links = 0;
    r.ok = sim_collective_node_ring(lw->m, coll, links, (int)G_N_ELEMENTS(links), &n_links,
                                    &r.ring_latency);
    if (r.ok) {
      if (!lw->tg->step_links)
        lw->tg->step_links = g_array_new(FALSE, FALSE, sizeof(int));
      r.links_off = (int32_t)lw->tg->step_links->len;
      r.n_links = n_links;
      r.n_devs = h->n_devs;
      memcpy(r.devs, h->devs, sizeof(int32_t) * (size_t)h->n_devs);
      g_array_append_vals(lw->tg->step_links, links, (guint)n_links);
    }
    r.bytes = -1;
    g_array_append_val(lw->step_ring, r);
  }
  StepRing *r = &g_array_index(lw->step_ring, StepRing, id);
  if (!r->ok || coll->bytes <= 0)
    return FALSE;
  double bytes, latency;
  sim_collective_node_ring_flow(coll, r->ring_latency, &bytes, &latency);
  if (bytes != r->bytes || latency != r->latency) {
    /* As the merging's absorbable_rings() times a ring: the net left empty after it. */
    if (!lw->step_net)
      lw->step_net = sim_net_new(lw->m, &lw->cp);
    const int *links = &g_array_index(lw->tg->step_links, int, r->links_off);
    double end = INFINITY, ignored;
    int slot = sim_net_add(lw->step_net, 0, links, r->n_links, bytes, latency);
    sim_net_update(lw->step_net, latency, step_end, &end);
    sim_net_remove(lw->step_net, slot, end);
    sim_net_update(lw->step_net, end, step_end, &ignored);
    r->bytes = bytes;
    r->latency = latency;
    r->time = end;
  }
  if (!isfinite(r->time))
    return FALSE;
  SimTask t = sim_task_compute(SIM_CLASS_REDUCTION, l->dev[sh], l->op, sh, mb, r->time);
  t.n_kernels = 0;
  *out = sim_taskgraph_add(lw->tg, block, &t);
  sim_taskgraph_stream_add(lw->tg, block, l->dev[sh], stream_key(lw, l, pass, mb) + 1,
                           out->index);
  RingStep st = { *out, (int32_t)id, l->dev[sh], bytes, latency };
  g_array_append_val(lw->steps, st);
  return TRUE;
}

/* A wait of tensor-parallel overlap @d (a delay of its device: the part of a collective
 * its GEMM does not hide), which the consumer it releases waits for right after the task
 * before it on the stream: with wait steps on, a compute task at @key on that stream,
 * which sim_lowering_settle_ring_steps() keeps where the stream runs it between a task
 * that it waits for and the next, which waits for it (nothing else runs on the device
 * meanwhile, with the delay or without), and turns back into the delay elsewhere. */
static SimTaskRef add_wait(SimLowering *lw, int block, SimTask d, uint64_t key)
{
  if (!lw->wait_steps)
    return sim_taskgraph_add(lw->tg, block, &d);
  d.kind = SIM_TASK_COMPUTE;
  d.n_kernels = 0;
  SimTaskRef r = sim_taskgraph_add(lw->tg, block, &d);
  sim_taskgraph_stream_add(lw->tg, block, d.device, key, r.index);
  RingStep st = { r, -1, d.device, 0, 0 };
  g_array_append_val(lw->steps, st);
  return r;
}

/* Whether @devs (n of them) sit on more than one node. */
static gboolean spans_nodes(const SimMachine *m, const int *devs, int n)
{
  for (int i = 1; i < n; i++)
    if (sim_machine_device_node(m, devs[i]) != sim_machine_device_node(m, devs[0]))
      return TRUE;
  return FALSE;
}

/* The combine of an expert group over several nodes (and the reduction of its input's
 * gradients), as Megatron-Core's all-to-all moves it: every device sends each other one
 * its share, 1 / n of @bytes (the region's bytes times the routed fraction), so that a
 * device sends (n - 1) / n of them in all, what the ring all-reduce that stands for it
 * inside a node carries (routed_fraction()); over several nodes a ring would cross the
 * network on its few hops between nodes only.  A share for another node leaves through
 * the NIC its route takes: its sender's own, or under PXN the NIC of the sending node's
 * GPU of the destination's rail (sim/machine.c, build_pxn()).  The shares are laid on the
 * links as the routes lay them, in fewer flows: one from each device to each GPU of its
 * node that it sends to or through, and one from each relaying GPU to each destination,
 * carrying the shares of every sender that relays through it (with PXN, 896 flows instead
 * of 4,032 for 64 GPUs on 8 nodes).  Flows of class reduction between two join points,
 * each after one step's fixed cost and the collective's; the first join point is
 * returned, the second goes to @end. */
typedef struct {
  int src, dst;
  double bytes;
} A2aFlow;

static void a2a_add(GArray *flows, GHashTable *at, int src, int dst, double bytes)
{
  gpointer key = GSIZE_TO_POINTER(((gsize)(guint32)src << 32) | (guint32)dst);
  gpointer v;
  if (g_hash_table_lookup_extended(at, key, NULL, &v)) {
    g_array_index(flows, A2aFlow, GPOINTER_TO_UINT(v)).bytes += bytes;
    return;
  }
  g_hash_table_insert(at, key, GUINT_TO_POINTER(flows->len));
  A2aFlow f = { src, dst, bytes };
  g_array_append_val(flows, f);
}

static SimTaskRef expert_all_to_all(SimLowering *lw, int block, const int *devs, int n,
                                    double bytes, int mb, SimTaskRef *end)
{
  G_STATIC_ASSERT(sizeof(gsize) >= 8);
  double share = bytes / n;
  GArray *flows = g_array_new(FALSE, FALSE, sizeof(A2aFlow));
  GHashTable *at = g_hash_table_new(g_direct_hash, g_direct_equal);
  for (int i = 0; i < n; i++)
    for (int j = 0; j < n; j++) {
      if (i == j)
        continue;
      int relay = sim_machine_pxn_relay(lw->m, devs[i], devs[j]);
      if (relay >= 0)
        a2a_add(flows, at, devs[i], relay, share);
      a2a_add(flows, at, relay >= 0 ? relay : devs[i], devs[j], share);
    }
  SimTask nop = sim_task_nop();
  nop.mb = mb;
  SimTaskRef start = sim_taskgraph_add(lw->tg, block, &nop);
  *end = sim_taskgraph_add(lw->tg, block, &nop);
  for (guint k = 0; k < flows->len; k++) {
    const A2aFlow *a = &g_array_index(flows, A2aFlow, k);
    SimTask f = sim_task_flow(SIM_CLASS_REDUCTION, a->src, a->dst, a->bytes, -1, mb);
    f.duration = lw->cp.step_latency + lw->cp.base_latency;
    SimTaskRef fr = sim_taskgraph_add(lw->tg, block, &f);
    sim_taskgraph_depend(lw->tg, block, start, fr);
    sim_taskgraph_depend(lw->tg, block, fr, *end);
  }
  g_hash_table_destroy(at);
  g_array_free(flows, TRUE);
  return start;
}

static void reduce_groups(SimLowering *lw, int block, const OpLay *l, GArray *groups,
                          const gboolean *scatter, gboolean partial, int pass, int mb,
                          SimDType dt, int tensor, Ready *ready, const TpOverlap *ov)
{
  for (guint k = 0; k < groups->len; k++) {
    Holders *h = &g_array_index(groups, Holders, k);
    ready[k].reduced = FALSE;
    if (!partial || h->n <= 1 || !h->any_sim)
      continue;
    ready[k].reduced = TRUE;
    if (block < 0)
      continue; /* only asked which groups reduce */
    SimTaskRef start, coll_start = { -1, 0 };
    if (h->n_devs > 1 && ov && ov->on) {
      double bytes = (double)lower_region_bytes(&h->region, dt) * lw->byte_scale;
      /* The bytes on the links: the ring reduce-scatter as a collective of its own that
       * nothing waits for (TpOverlap). */
      SimCollective coll = { .kind = SIM_COLL_REDUCE_SCATTER, .algo = SIM_ALLREDUCE_RING,
                             .detail = SIM_DETAIL_COLLECTIVE, .params = &lw->cp,
                             .cls = SIM_CLASS_REDUCTION, .devices = h->devs, .n = h->n_devs,
                             .bytes = bytes, .op = -1, .mb = mb };
      SimTaskRef coll_end;
      sim_collective_lower_bare(lw->tg, block, lw->m, &coll, &coll_start, &coll_end);
      int sh = h->members[0];
      for (int i = 0; i < h->n; i++)
        if (l->cidx[h->members[i]] >= 0) {
          sh = h->members[i];
          break;
        }
      SimTask d = sim_task_delay(SIM_CLASS_REDUCTION, l->dev[sh],
                                 overlap_rs_delay(lw, l, sh, h, bytes, ov));
      /* The op whose GEMM it overlaps, for traces and tests. */
      d.op = l->op;
      d.mb = mb;
      d.shard = sh;
      start = ready[k].end = add_wait(lw, block, d, stream_key(lw, l, pass, mb) + 1);
    } else if (h->n_devs > 1 && lw->expert_a2a > 0 && spans_nodes(lw->m, h->devs, h->n_devs)) {
      start = expert_all_to_all(lw, block, h->devs, h->n_devs,
                                (double)lower_region_bytes(&h->region, dt) * lw->expert_a2a, mb,
                                &ready[k].end);
    } else if (h->n_devs > 1) {
      SimCollective coll = { .kind = scatter && scatter[k] ? SIM_COLL_REDUCE_SCATTER
                                                           : SIM_COLL_ALLREDUCE,
                             .algo = SIM_ALLREDUCE_RING,
                             .detail = lw->o.detail, .params = &lw->cp, .cls = SIM_CLASS_REDUCTION,
                             .devices = h->devs, .n = h->n_devs,
                             .bytes = (double)lower_region_bytes(&h->region, dt) * lw->byte_scale,
                             .op = -1, .mb = mb };
      if (ring_step(lw, block, l, h, &coll, pass, mb, &start))
        ready[k].end = start;
      else
        sim_collective_lower_bare(lw->tg, block, lw->m, &coll, &start, &ready[k].end);
    } else {
      /* Partial sums on one device add up where they are. */
      SimTask nop = sim_task_nop();
      start = ready[k].end = sim_taskgraph_add(lw->tg, block, &nop);
    }
    record_group(lw, block, SIM_SEM_REDUCE, ready[k].end, tensor, pass == P_B, &h->region,
                 h->devs, h->n_devs);
    for (int i = 0; i < h->n; i++)
      if (l->cidx[h->members[i]] >= 0) {
        sim_taskgraph_depend(lw->tg, block, ref_done(lw, l, pass, mb, h->members[i]), start);
        if (coll_start.block >= 0)
          sim_taskgraph_depend(lw->tg, block, ref_done(lw, l, pass, mb, h->members[i]),
                               coll_start);
      }
  }
}

static SimTaskRef ready_ref(SimLowering *lw, const OpLay *l, const Ready *r, int pass, int mb,
                            int sh)
{
  return r->reduced ? r->end : ref_done(lw, l, pass, mb, sh);
}

/* Sends what the shards of @dst_op need (@need[sh]) from @groups of @src_op, for one
 * micro-batch: a dependency where a holder is on the same device, a flow otherwise.
 * @src_pass produced the data, @dst_pass consumes it. */
static void transfer_key(TransferKey *k, int src, int dst, const SimRegion *r)
{
  memset(k, 0, sizeof *k);
  k->src = src;
  k->dst = dst;
  k->ndim = r->ndim;
  for (int d = 0; d < r->ndim; d++) {
    k->lo[d] = r->lo[d];
    k->hi[d] = r->hi[d];
  }
}

/* One piece of data a consumer shard needs from a group of holders: which holder sends
 * it (or holds it on the consumer's own device) and the region.  The pieces are the same
 * in every micro-batch, so they are worked out once. */
typedef struct {
  int c, k, holder;
  gboolean local;
  SimRegion inter;
  /* Scatter-gather (SimStrategy.scatter_gather): the piece is one of the sg_n parts that
   * the consumers of pieces [sg_base, sg_base + sg_n) each receive from a holder and pass
   * on to the others; sg_n == 0 for a piece sent whole.  A piece of a consumer shard that
   * is folded away (sim FALSE) sends nothing and stands for its part. */
  int sg_n, sg_base;
  gboolean sim;
  SimRegion part;
  /* A holder folded away (not simulated): the shard of the producer on the consumer's own
   * device, whose timeline is the holder's (the ranks are symmetric), stands for it as
   * the piece's predecessor; -1: the holder itself. */
  int stand_in;
} Piece;

/* TRUE if the boxes @a and @b (of one rank) overlap: the quick test that spares most
 * pairs of plan_pieces' all-pairs scan the full intersection. */
static inline gboolean boxes_overlap(const SimRegion *a, const SimRegion *b)
{
  for (int d = 0; d < a->ndim; d++)
    if (MIN(a->hi[d], b->hi[d]) <= MAX(a->lo[d], b->lo[d]))
      return FALSE;
  return a->ndim == b->ndim;
}

/* Megatron's scatter-gather across pipeline stages: the consumer shards of another stage
 * that need the same region from one group of several holders (tensor-parallel ranks that
 * all hold the activation) each receive one part of it, cut along its longest dimension,
 * from one holder, and take the other parts from each other.  Returns the pieces with
 * every such group laid out consecutively, its parts in order; the others first, as
 * plan_pieces() made them. */
static GArray *scatter_gather(GArray *groups, GArray *in)
{
  guint n = in->len;
  GArray *out = g_array_sized_new(FALSE, FALSE, sizeof(Piece), n);
  uint8_t *taken = g_new0(uint8_t, MAX(n, 1));
  int *members = g_new(int, MAX(n, 1));
  for (guint a = 0; a < n; a++) {
    const Piece *p = &g_array_index(in, Piece, a);
    const Holders *h = &g_array_index(groups, Holders, p->k);
    if (taken[a] || p->local || h->n < 2)
      continue;
    int m = 0;
    for (guint b = a; b < n; b++) {
      const Piece *q = &g_array_index(in, Piece, b);
      if (!taken[b] && !q->local && q->k == p->k && sim_region_equal(&q->inter, &p->inter))
        members[m++] = (int)b;
    }
    int dim = 0;
    for (int d = 1; d < p->inter.ndim; d++)
      if (p->inter.hi[d] - p->inter.lo[d] > p->inter.hi[dim] - p->inter.lo[dim])
        dim = d;
    int64_t ext = p->inter.hi[dim] - p->inter.lo[dim];
    if (m < 2 || ext < m)
      continue;
    guint base = out->len;
    for (int i = 0; i < m; i++) {
      taken[members[i]] = 1;
      Piece q = g_array_index(in, Piece, members[i]);
      q.sg_n = m;
      q.sg_base = (int)base;
      q.holder = h->members[i % h->n];
      q.part = q.inter;
      q.part.lo[dim] = q.inter.lo[dim] + ext * i / m;
      q.part.hi[dim] = q.inter.lo[dim] + ext * (i + 1) / m;
      g_array_append_val(out, q);
    }
  }
  /* The pieces sent whole go first, in their order; the groups' places move by as many. */
  GArray *res = g_array_sized_new(FALSE, FALSE, sizeof(Piece), n);
  for (guint a = 0; a < n; a++)
    if (!taken[a] && g_array_index(in, Piece, a).sim)
      g_array_append_val(res, g_array_index(in, Piece, a));
  guint shift = res->len;
  for (guint i = 0; i < out->len; i++) {
    Piece q = g_array_index(out, Piece, i);
    q.sg_base += (int)shift;
    g_array_append_val(res, q);
  }
  g_free(taken);
  g_free(members);
  g_array_free(out, TRUE);
  g_array_free(in, TRUE);
  return res;
}

/* Which groups of holders a box can overlap, without testing every group: the groups
 * sorted by where their regions start along one dimension (the one where most of them
 * start at different places), and the longest extent along it.  A group that overlaps a
 * box starts before the box ends and after the box's start less that extent, so its
 * candidates are one run of the sorted groups. */
typedef struct {
  int dim;           /* -1: no index (few groups, or regions of different ranks) */
  int ndim;
  int64_t longest;
  int *by_lo;        /* group ids, by region.lo[dim] */
  int64_t *lo;       /* region.lo[dim] in that order */
} GroupIndex;

/* Below this many groups every group is tested (the index costs more than it saves). */
#define GROUP_INDEX_MIN 16

typedef struct {
  int64_t lo;
  int id;
} GroupStart;

static int group_start_cmp(const void *a, const void *b)
{
  const GroupStart *x = a, *y = b;
  return x->lo < y->lo ? -1 : x->lo > y->lo ? 1 : x->id - y->id;
}

static void group_index_init(GroupIndex *ix, const GArray *groups)
{
  memset(ix, 0, sizeof *ix);
  ix->dim = -1;
  guint n = groups->len;
  if (n < GROUP_INDEX_MIN)
    return;
  ix->ndim = g_array_index(groups, Holders, 0).region.ndim;
  for (guint k = 1; k < n; k++)
    if (g_array_index(groups, Holders, k).region.ndim != ix->ndim)
      return;
  if (ix->ndim <= 0)
    return;
  /* The dimension with the most distinct starts, counted in an open-addressed set. */
  guint cap = 1;
  while (cap < 2 * n)
    cap <<= 1;
  int64_t *set = g_new(int64_t, cap);
  uint8_t *used = g_new(uint8_t, cap);
  guint best = 0;
  for (int d = 0; d < ix->ndim; d++) {
    memset(used, 0, cap);
    guint distinct = 0;
    for (guint k = 0; k < n; k++) {
      int64_t x = g_array_index(groups, Holders, k).region.lo[d];
      guint h = (guint)(((uint64_t)x * G_GUINT64_CONSTANT(0x9e3779b97f4a7c15)) >> 32) & (cap - 1);
      while (used[h] && set[h] != x)
        h = (h + 1) & (cap - 1);
      if (!used[h]) {
        used[h] = 1;
        set[h] = x;
        distinct++;
      }
    }
    if (distinct > best) {
      best = distinct;
      ix->dim = d;
    }
  }
  g_free(set);
  g_free(used);
  GroupStart *gs = g_new(GroupStart, n);
  for (guint k = 0; k < n; k++) {
    const SimRegion *r = &g_array_index(groups, Holders, k).region;
    gs[k] = (GroupStart){ r->lo[ix->dim], (int)k };
    ix->longest = MAX(ix->longest, r->hi[ix->dim] - r->lo[ix->dim]);
  }
  qsort(gs, n, sizeof *gs, group_start_cmp);
  ix->by_lo = g_new(int, n);
  ix->lo = g_new(int64_t, n);
  for (guint k = 0; k < n; k++) {
    ix->by_lo[k] = gs[k].id;
    ix->lo[k] = gs[k].lo;
  }
  g_free(gs);
}

static void group_index_clear(GroupIndex *ix)
{
  g_free(ix->by_lo);
  g_free(ix->lo);
}

/* The first position in @ix whose start is at least @x. */
static guint group_index_lower(const GroupIndex *ix, guint n, int64_t x)
{
  guint a = 0, b = n;
  while (a < b) {
    guint m = a + (b - a) / 2;
    if (ix->lo[m] < x)
      a = m + 1;
    else
      b = m;
  }
  return a;
}

/* The groups of holders that @box may overlap, in rising order, into @cand; returns how
 * many.  Every group whose region overlaps the box is among them (the caller tests each). */
static guint group_candidates(const GroupIndex *ix, const GArray *groups, const SimRegion *box,
                              GArray *cand)
{
  g_array_set_size(cand, 0);
  guint n = groups->len;
  if (ix->dim < 0 || box->ndim != ix->ndim) {
    for (guint k = 0; k < n; k++)
      g_array_append_val(cand, k);
    return n;
  }
  int64_t lo = box->lo[ix->dim], hi = box->hi[ix->dim];
  /* Overlap along the dimension: start < hi and start + extent > lo, so start > lo - longest. */
  guint a = group_index_lower(ix, n, lo - ix->longest + 1);
  guint b = group_index_lower(ix, n, hi);
  for (guint p = a; p < b; p++)
    g_array_append_val(cand, ix->by_lo[p]);
  qsort(cand->data, cand->len, sizeof(int), sim_int_cmp);
  return cand->len;
}

/* The simulated shard of @src on device @dev, or -1. */
static int stand_in(const OpLay *src, int dev)
{
  for (int i = 0; i < src->n_shards; i++)
    if (src->dev[i] == dev && src->cidx[i] >= 0)
      return i;
  return -1;
}

/* An all-gather: the consumer shards that need the same region, one on each of n
 * devices, where each device holds one of n equal parts of it (sequence parallelism's
 * gathers before the column-parallel products, and of the gradients before the
 * row-parallel ones).  NCCL runs it as a ring; sent as pieces it would be n (n - 1) flows
 * moving the same bytes. */
typedef struct {
  SimRegion need;
  int n;
  int *devs;        /* ring order: the consumer shards' order                 */
  int *shards;      /* the consumer shard on devs[i]                          */
  int *owner;       /* the holder of part i, on devs[i]                       */
  int *group;       /* its group of holders                                   */
  SimRegion *part;
} Gather;

static void gathers_free(GArray *gathers)
{
  for (guint i = 0; gathers && i < gathers->len; i++) {
    Gather *g = &g_array_index(gathers, Gather, i);
    g_free(g->devs);
    g_free(g->part);
  }
  if (gathers)
    g_array_free(gathers, TRUE);
}

/* The all-gathers among the shards of @dst (which need @need of @src's @groups): sets
 * in_gather[c] for each consumer shard that takes its data from one. */
static GArray *find_gathers(SimLowering *lw, const OpLay *src, const GArray *groups,
                            const OpLay *dst, const SimRegion *need, const GroupIndex *ix,
                            uint8_t *in_gather)
{
  GArray *out = g_array_new(FALSE, TRUE, sizeof(Gather));
  GArray *cons = lower_group_holders(&lw->regions, dst, need, 1, 0, NULL);
  GArray *cand = g_array_new(FALSE, FALSE, sizeof(int));
  for (guint a = 0; a < cons->len; a++) {
    const Holders *c = &g_array_index(cons, Holders, a);
    int n = c->n;
    if (n < 2 || c->n_devs != n || !c->any_sim)
      continue;
    Gather g = { .need = c->region, .n = n };
    g.devs = g_new(int, 4 * (size_t)n);
    g.shards = g.devs + n;
    g.owner = g.shards + n;
    g.group = g.owner + n;
    g.part = g_new(SimRegion, n);
    for (int i = 0; i < n; i++) {
      g.shards[i] = c->members[i];
      g.devs[i] = dst->dev[c->members[i]];
      g.owner[i] = -1;
    }
    gboolean ok = TRUE, any_owner_sim = FALSE;
    int found = 0;
    int64_t covered = 0;
    guint n_cand = group_candidates(ix, groups, &g.need, cand);
    for (guint j = 0; j < n_cand && ok; j++) {
      int k = g_array_index(cand, int, j);
      const Holders *h = &g_array_index(groups, Holders, k);
      SimRegion part;
      if (!boxes_overlap(&g.need, &h->region) || !sim_region_intersect(&g.need, &h->region, &part))
        continue;
      /* The part's one holder among the gather's devices. */
      int at = -1, holder = -1;
      for (int m = 0; m < h->n && ok; m++)
        for (int i = 0; i < n; i++)
          if (src->dev[h->members[m]] == g.devs[i]) {
            ok = at < 0;
            at = i;
            holder = h->members[m];
          }
      if (!ok || at < 0 || g.owner[at] >= 0) {
        ok = FALSE;
        break;
      }
      g.owner[at] = holder;
      g.group[at] = k;
      g.part[at] = part;
      any_owner_sim |= src->cidx[holder] >= 0;
      covered += sim_region_volume(&part);
      found++;
    }
    /* n equal parts, one on each device, that cover the region without overlapping. */
    ok = ok && found == n && any_owner_sim && covered == sim_region_volume(&g.need);
    for (int i = 0; i < n && ok; i++) {
      ok = sim_region_volume(&g.part[i]) == sim_region_volume(&g.part[0]);
      for (int j = 0; j < i && ok; j++)
        ok = !boxes_overlap(&g.part[i], &g.part[j]);
    }
    if (!ok) {
      g_free(g.devs);
      g_free(g.part);
      continue;
    }
    for (int i = 0; i < n; i++)
      in_gather[g.shards[i]] = 1;
    g_array_append_val(out, g);
  }
  g_array_free(cand, TRUE);
  lower_holders_free(cons);
  return out;
}

/* @may_sg: scatter-gather is allowed for this direction (see lower_build_tensor_block()). */
/* @gathers (NULL: none): receives the all-gathers that serve some consumer shards
 * instead of pieces (find_gathers()). */
static GArray *plan_pieces(SimLowering *lw, const OpLay *src, GArray *groups, const Ready *ready,
                           const OpLay *dst, const SimRegion *need, gboolean may_sg,
                           GArray **gathers)
{
  /* Scatter-gather needs every consumer shard of a group, folded away or not. */
  gboolean sg = may_sg && lw->s->scatter_gather && src->stage != dst->stage;
  /* Most consumer shards take one piece. */
  GArray *out = g_array_sized_new(FALSE, FALSE, sizeof(Piece), (guint)MAX(dst->n_shards, 1));
  GroupIndex ix;
  group_index_init(&ix, groups);
  uint8_t *in_gather = g_new0(uint8_t, MAX(dst->n_shards, 1));
  if (gathers)
    *gathers = sg ? NULL : find_gathers(lw, src, groups, dst, need, &ix, in_gather);
  GArray *cand = g_array_new(FALSE, FALSE, sizeof(int));
  for (int c = 0; c < dst->n_shards; c++) {
    if ((dst->cidx[c] < 0 && !sg) || in_gather[c])
      continue;
    int dev = dst->dev[c];
    guint n_cand = group_candidates(&ix, groups, &need[c], cand);
    for (guint j = 0; j < n_cand; j++) {
      guint k = (guint)g_array_index(cand, int, j);
      Holders *h = &g_array_index(groups, Holders, k);
      if (!boxes_overlap(&need[c], &h->region))
        continue;
      Piece p = { .c = c, .k = (int)k, .holder = -1, .sim = dst->cidx[c] >= 0,
                  .stand_in = -1 };
      if (!sim_region_intersect(&need[c], &h->region, &p.inter))
        continue;
      for (int i = 0; i < h->n && p.holder < 0; i++)
        if (src->dev[h->members[i]] == dev)
          p.holder = h->members[i];
      p.local = p.holder >= 0;
      if (!p.local)
        p.holder = h->members[c % h->n];
      g_array_append_val(out, p);
    }
  }
  group_index_clear(&ix);
  g_array_free(cand, TRUE);
  g_free(in_gather);
  if (sg)
    out = scatter_gather(groups, out);
  /* Data from a device that is folded away breaks the folding.  (The pieces of groups come
   * after all others, so dropping others moves each group by the number dropped.) */
  guint kept = 0;
  for (guint i = 0; i < out->len; i++) {
    Piece p = g_array_index(out, Piece, i);
    if (p.sim && !ready[p.k].reduced && src->cidx[p.holder] < 0) {
      p.stand_in = stand_in(src, dst->dev[p.c]);
      if (p.stand_in < 0) {
        lw->fold_violated = TRUE;
        if (!p.sg_n)
          continue;
      }
    }
    if (p.sg_n)
      p.sg_base -= (int)(i - kept);
    g_array_index(out, Piece, kept++) = p;
  }
  g_array_set_size(out, kept);
  return out;
}

/* A flow of @region from device @sdev to @dev after @from, before @to (none where
 * @to.block < 0): made once per
 * transfer key (micro-batch, pass, devices, region), later users only wait for it.
 * @relay: the region is passed on from a device that received it (scatter-gather).
 * Returns the flow. */
static SimTaskRef send(SimLowering *lw, int block, int which, int sdev, int dev,
                       const SimRegion *region, SimTaskRef from, SimTaskRef to, SimDType dt,
                       int tensor_op, int tensor, gboolean grad, gboolean relay, int mb)
{
  SentKey key;
  memset(&key, 0, sizeof key);
  key.which = which;
  key.scaled = lw->byte_scale != 1.0;
  transfer_key(&key.tk, sdev, dev, region);
  gboolean added;
  guint k = sim_key_index_get(&lw->transfers, &key, &added);
  if (!added) {
    SimTaskRef fr = { block, lw->transfers.value[k] };
    sim_taskgraph_depend(lw->tg, block, from, fr);
    if (to.block >= 0)
      sim_taskgraph_depend(lw->tg, block, fr, to);
    return fr;
  }
  SimTask f = sim_task_flow(SIM_CLASS_TRANSFER, sdev, dev,
                            (double)lower_region_bytes(region, dt) * lw->byte_scale, tensor_op, mb);
  SimTaskRef fr = sim_taskgraph_add(lw->tg, block, &f);
  lw->transfers.value[k] = fr.index;
  if (lw->record) {
    SimTaskSem m = { .index = fr.index, .kind = SIM_SEM_COPY, .grad = grad, .relay = relay,
                     .tensor = tensor, .region = *region };
    sim_taskgraph_sem_add(lw->tg, block, &m);
  }
  sim_taskgraph_depend(lw->tg, block, from, fr);
  if (to.block >= 0)
    sim_taskgraph_depend(lw->tg, block, fr, to);
  return fr;
}

/* Runs the all-gathers @gathers for one micro-batch (see deliver()): each starts when
 * every part is ready on its simulated holders (a folded-away holder's timeline is its
 * representative's) and, where @wait, its consumers wait for its end.  Consumers on the same devices
 * that need the same region share one.  Where the lowering records meanings, each part's
 * copy to each other device is a join point of its own between the part and the
 * consumer, which the executor runs as a copy (and the gather's end waits for them all). */
static void deliver_gathers(SimLowering *lw, int block, const OpLay *src, const Ready *ready,
                            int src_pass, const OpLay *dst, const GArray *gathers, int dst_pass,
                            int mb, SimDType dt, int tensor_op, int tensor, int which,
                            gboolean wait)
{
  for (guint a = 0; gathers && a < gathers->len; a++) {
    const Gather *g = &g_array_index(gathers, Gather, a);
    SentKey key;
    memset(&key, 0, sizeof key);
    key.which = which;
    key.scaled = lw->byte_scale != 1.0;
    transfer_key(&key.tk, -2, g->devs[0], &g->need);
    gboolean added;
    guint kk = sim_key_index_get(&lw->transfers, &key, &added);
    SimTaskRef start, end;
    if (added) {
      SimCollective coll = { .kind = SIM_COLL_ALLGATHER, .algo = SIM_ALLREDUCE_RING,
                             .detail = wait ? lw->o.detail : SIM_DETAIL_COLLECTIVE,
                             .params = &lw->cp,
                             .cls = SIM_CLASS_TRANSFER, .devices = g->devs, .n = g->n,
                             .bytes = (double)lower_region_bytes(&g->need, dt) * lw->byte_scale,
                             .op = tensor_op, .mb = mb };
      sim_collective_lower_bare(lw->tg, block, lw->m, &coll, &start, &end);
      lw->transfers.value[kk] = end.index;
      for (int i = 0; i < g->n; i++)
        if (src->cidx[g->owner[i]] >= 0)
          sim_taskgraph_depend(lw->tg, block,
                               ready_ref(lw, src, &ready[g->group[i]], src_pass, mb, g->owner[i]),
                               start);
    } else {
      end = (SimTaskRef){ block, lw->transfers.value[kk] };
    }
    /* An overlapped gather's ring only carries its bytes (TpOverlap): nothing waits. */
    if (!wait)
      continue;
    /* A backward gather into a consumer whose recomputation its device's stream runs
     * between the producer's backward and the consumer's (selective recomputation) is
     * waited for by the recomputation: Megatron recomputes the core attention only once
     * the backward of the projection, which takes the gathered gradient, is done. */
    gboolean before_r = dst_pass == P_B && dst->recompute && src->stage == dst->stage &&
                        dst->pos_r > src->pos_b;
    for (int i = 0; i < g->n; i++) {
      int c = g->shards[i];
      if (dst->cidx[c] < 0)
        continue;
      SimTaskRef to = ref_compute(lw, dst, dst_pass, mb, c);
      if (before_r)
        sim_taskgraph_depend(lw->tg, block, end, ref_compute(lw, dst, P_R, mb, c));
      if (!before_r || lw->record)
        sim_taskgraph_depend(lw->tg, block, end, to);
      if (!lw->record)
        continue;
      for (int j = 0; j < g->n; j++) {
        if (j == i)
          continue;
        int holder = g->owner[j];
        if (src->cidx[holder] < 0)
          holder = stand_in(src, g->devs[i]);
        if (holder < 0)
          continue;
        SimTask nop = sim_task_nop();
        nop.op = tensor_op;
        nop.mb = mb;
        SimTaskRef copy = sim_taskgraph_add(lw->tg, block, &nop);
        int pair[2] = { g->devs[j], g->devs[i] };
        SimTaskSem m = { .index = copy.index, .kind = SIM_SEM_COPY, .grad = dst_pass == P_B,
                         .tensor = tensor, .region = g->part[j], .n_devs = 2,
                         .devs = g_memdup2(pair, sizeof pair) };
        sim_taskgraph_sem_add(lw->tg, block, &m);
        sim_taskgraph_depend(lw->tg, block,
                             ready_ref(lw, src, &ready[g->group[j]], src_pass, mb, holder), copy);
        sim_taskgraph_depend(lw->tg, block, copy, to);
        sim_taskgraph_depend(lw->tg, block, copy, end);
      }
    }
  }
}

/* The all-gather into consumer shard @c of @pieces overlapped with its GEMM
 * (TpOverlap): a delay on its device of what the ring exchange adds to the GEMM. */
static SimTaskRef overlap_ag_delay(SimLowering *lw, int block, const OpLay *src,
                                   const OpLay *dst, const GArray *pieces, int c, int dst_pass,
                                   int mb, SimDType dt)
{
  int *devs = g_new(int, pieces->len + 1);
  int n = 0;
  double bytes = 0;
  devs[n++] = dst->dev[c];
  for (guint i = 0; i < pieces->len; i++) {
    const Piece *p = &g_array_index(pieces, Piece, i);
    if (p->c != c)
      continue;
    bytes += (double)lower_region_bytes(&p->inter, dt);
    if (!p->local)
      devs[n++] = src->dev[p->holder];
  }
  double g = dst->t_gemm[4 * (size_t)c + (dst_pass == P_B ? TP_GEMM_FIRST_B : TP_GEMM_FIRST_F)];
  double extra = 0;
  if (n > 1) {
    double step = sim_collective_time(lw->m, SIM_COLL_ALLGATHER, SIM_ALLREDUCE_RING, &lw->cp,
                                      devs, n, bytes) / (n - 1);
    extra = (n - 1) * MAX(0.0, step - g / n);
  }
  g_free(devs);
  SimTask d = sim_task_delay(SIM_CLASS_TRANSFER, dst->dev[c], extra);
  d.op = dst->op;
  d.mb = mb;
  d.shard = c;
  /* Right before the consumer's task (stream keys are even). */
  return add_wait(lw, block, d, stream_key(lw, dst, dst_pass, mb) - 1);
}

/* How deliver() treats the pieces from other devices: flows their consumers wait for;
 * under tensor-parallel overlap (TpOverlap), the waits alone, or flows that nothing
 * waits for (the overlapped gathers' bytes, where they do not run as all-gathers). */
typedef enum { DELIVER_FLOWS, DELIVER_WAITS, DELIVER_FREE } DeliverMode;

/* Sends the pieces for one micro-batch: a dependency where the holder is on the consumer's
 * device, a flow otherwise.  @src_pass produced the data, @dst_pass consumes it.  A
 * scatter-gathered piece sends its part from its holder, then every consumer of the group
 * passes its part on to the others (a consumer folded away passes its part on when the
 * representative has its own: their timelines are the same). */
static void deliver(SimLowering *lw, int block, const OpLay *src, const Ready *ready, int src_pass,
                    const OpLay *dst, const GArray *pieces, int dst_pass, int mb, SimDType dt,
                    int tensor_op, int tensor, int which, DeliverMode mode)
{
  gboolean overlap = mode == DELIVER_WAITS;
  gboolean grad = dst_pass == P_B;
  SimTaskRef *got = NULL;
  /* Under overlap, each consumer shard's delay (made when its first piece from another
   * device comes), by shard. */
  SimTaskRef *delay = NULL;
  for (guint i = 0; i < pieces->len; i++) {
    const Piece *p = &g_array_index(pieces, Piece, i);
    if (!p->sim)
      continue;
    SimTaskRef to = ref_compute(lw, dst, dst_pass, mb, p->c);
    SimTaskRef from = ready_ref(lw, src, &ready[p->k], src_pass, mb,
                                p->stand_in >= 0 ? p->stand_in : p->holder);
    if (p->local) {
      if (ready[p->k].reduced)
        sim_taskgraph_depend(lw->tg, block, from, to);
      else
        depend_compute(lw, block, src, src_pass, mb,
                       p->stand_in >= 0 ? p->stand_in : p->holder, dst, dst_pass, mb, p->c);
      continue;
    }
    if (overlap) {
      if (!delay) {
        delay = g_new(SimTaskRef, dst->n_shards);
        for (int c = 0; c < dst->n_shards; c++)
          delay[c].block = -1;
      }
      if (delay[p->c].block < 0) {
        delay[p->c] = overlap_ag_delay(lw, block, src, dst, pieces, p->c, dst_pass, mb, dt);
        sim_taskgraph_depend(lw->tg, block, delay[p->c], to);
      }
      sim_taskgraph_depend(lw->tg, block, from, delay[p->c]);
      continue;
    }
    if (mode == DELIVER_FREE) {
      /* The piece's bytes on the links: a flow from its holder that nothing waits for,
       * started through a join point so that it is no send that a blocking host waits
       * for (SimOptions.blocking_sends: the pipeline's exchanges, not the gather's
       * copy-engine ring). */
      SimTask nop = sim_task_nop();
      nop.op = tensor_op;
      nop.mb = mb;
      SimTaskRef via = sim_taskgraph_add(lw->tg, block, &nop);
      sim_taskgraph_depend(lw->tg, block, from, via);
      send(lw, block, which, src->dev[p->holder], dst->dev[p->c], &p->inter, via,
           (SimTaskRef){ -1, 0 }, dt, tensor_op, tensor, grad, FALSE, mb);
      continue;
    }
    SimTaskRef fr = send(lw, block, which, src->dev[p->holder], dst->dev[p->c],
                         p->sg_n ? &p->part : &p->inter, from, to, dt, tensor_op, tensor, grad,
                         FALSE, mb);
    if (p->sg_n) {
      if (!got)
        got = g_new(SimTaskRef, pieces->len);
      got[i] = fr;
    }
  }
  for (guint i = 0; got && i < pieces->len; i++) {
    const Piece *p = &g_array_index(pieces, Piece, i);
    if (!p->sg_n || !p->sim)
      continue;
    SimTaskRef to = ref_compute(lw, dst, dst_pass, mb, p->c);
    int dev = dst->dev[p->c];
    for (int j = 0; j < p->sg_n; j++) {
      const Piece *q = &g_array_index(pieces, Piece, p->sg_base + j);
      if (q == p)
        continue;
      SimTaskRef arrived = q->sim ? got[p->sg_base + j] : got[i];
      int qdev = dst->dev[q->c];
      if (qdev == dev)
        sim_taskgraph_depend(lw->tg, block, arrived, to);
      else
        send(lw, block, which, qdev, dev, &q->part, arrived, to, dt, tensor_op, tensor, grad,
             TRUE, mb);
    }
  }
  g_free(got);
  g_free(delay);
}

/* Expert parallelism as an all-to-all.  A mixture-of-experts op whose experts are split
 * ep ways reads, in the plan's regions, every token of its sample range on each of the ep
 * shards and sums their partial outputs; what Megatron-Core and
 * DeepSpeed move is only each token's rows for its k experts (dispatch) and their
 * results (combine), an all-to-all.  Of the tokens a device sends to another, only those
 * routed there travel: k of the E experts, E / ep of them on that device, so the fraction
 * k / ep of them (capped at 1), times the load of the busiest shard (the imbalance, or
 * the capacity factor when there is one).  The transfers into the op (the tokens forward,
 * the output's gradient backward) carry that fraction of their bytes; the reductions of
 * its partial outputs (forward) and of its input's partial gradients (backward), ring
 * all-reduces of 2 (ep - 1) / ep of the region each, carry half of it, which makes
 * (ep - 1) / ep of the region times the fraction: the all-to-all's bytes (with every
 * token on every device, a reduce-scatter's).  Where each expert's width is split etp ways
 * too, the n = ep etp shards of an expert group do the same, n for ep: a shard receives
 * the routed fraction of every other device's tokens, k Z (n - 1) / (n ep) bytes a device
 * for Z those of the group, which is what Megatron-Core's all-to-all over the ep ranks
 * (k Z (ep - 1) / (n ep)) and all-gather over the etp ranks (k Z (etp - 1) / n) move
 * together; combine (reduce-scatter over the etp ranks, all-to-all back) is its mirror,
 * and the ring all-reduce of 2 (n - 1) / n of the region at half the fraction carries
 * the same.  FALSE for any other op or layout. */
static gboolean routed_fraction(const SimLowering *lw, int op, double *fraction)
{
  const SimOp *o = sim_graph_op_get(lw->g, op);
  if (o->type != SIM_OP_MOE)
    return FALSE;
  const int *deg = sim_strategy_op_degrees(lw->s, op);
  int ep = deg[2];
  if (ep <= 1)
    return FALSE;
  double k = (double)sim_op_attr_int(o, "top_k");
  double c = sim_op_attr_float(o, "capacity_factor");
  double load = c > 0 ? c : sim_op_attr_float(o, "imbalance");
  *fraction = MIN(1.0, k * load / ep);
  return TRUE;
}

/* Which partial sums of @groups (over the shards of @src) need only a reduce-scatter:
 * those whose readers, the shards of @dst (@n_dst ops, @needs[i][c] what shard c of op i
 * reads), take disjoint parts of the group's region that cover it, each part on one of
 * the group's devices.  Sequence parallelism's row-parallel products are such sums: each
 * tensor-parallel rank reads its own part of the sequence, so Megatron reduce-scatters
 * them instead of all-reducing them (half the bytes).  Every device then holds the sum
 * of its own part, which is all its readers take.  Sets @scatter[k]; FALSE where any
 * reader sits on another device, parts overlap or leave some of the region out. */
static void scatter_groups(const GArray *groups, const OpLay *const *dst,
                           const SimRegion *const *needs, int n_dst, gboolean *scatter)
{
  /* Each reader's part of each group it overlaps (found through the groups' index, not by
   * testing every reader against every group: 128 replicas' groups, 1,024 readers), into
   * a box per group and device; a group with a reader on another device is refused. */
  guint ng = groups->len;
  int *box_off = g_new(int, (size_t)ng + 1);
  box_off[0] = 0;
  for (guint k = 0; k < ng; k++) {
    const Holders *h = &g_array_index(groups, Holders, k);
    box_off[k + 1] = box_off[k] + (h->n_devs < 2 ? 0 : h->n_devs);
  }
  SimRegion *boxes = g_new0(SimRegion, MAX(box_off[ng], 1));
  gboolean *refused = g_new0(gboolean, MAX(ng, 1));
  GroupIndex ix;
  group_index_init(&ix, groups);
  GArray *cand = g_array_new(FALSE, FALSE, sizeof(int));
  for (int i = 0; i < n_dst; i++)
    for (int c = 0; c < dst[i]->n_shards; c++) {
      guint n_cand = group_candidates(&ix, groups, &needs[i][c], cand);
      for (guint j = 0; j < n_cand; j++) {
        int k = g_array_index(cand, int, j);
        const Holders *h = &g_array_index(groups, Holders, k);
        if (h->n_devs < 2 || refused[k])
          continue;
        SimRegion part;
        if (!boxes_overlap(&needs[i][c], &h->region) ||
            !sim_region_intersect(&needs[i][c], &h->region, &part))
          continue;
        int at = -1;
        for (int a = 0; a < h->n_devs && at < 0; a++)
          if (h->devs[a] == dst[i]->dev[c])
            at = a;
        if (at < 0) {
          refused[k] = TRUE;
          continue;
        }
        SimRegion *box = &boxes[box_off[k] + at];
        if (box->ndim == 0) {
          *box = part;
          continue;
        }
        for (int d = 0; d < part.ndim; d++) {
          box->lo[d] = MIN(box->lo[d], part.lo[d]);
          box->hi[d] = MAX(box->hi[d], part.hi[d]);
        }
      }
    }
  group_index_clear(&ix);
  g_array_free(cand, TRUE);
  for (guint k = 0; k < ng; k++) {
    const Holders *h = &g_array_index(groups, Holders, k);
    scatter[k] = FALSE;
    if (h->n_devs < 2)
      continue;
    const SimRegion *box = &boxes[box_off[k]];
    gboolean ok = !refused[k];
    int64_t covered = 0;
    for (int a = 0; a < h->n_devs && ok; a++) {
      ok = box[a].ndim > 0;
      for (int b = 0; b < a && ok; b++)
        ok = !boxes_overlap(&box[a], &box[b]);
      if (ok)
        covered += sim_region_volume(&box[a]);
    }
    scatter[k] = ok && covered == sim_region_volume(&h->region);
  }
  g_free(refused);
  g_free(boxes);
  g_free(box_off);
}

/* What each shard of consumer @cx needs of tensor @t (the box around every input slot
 * reading it) into @need; *@partial: whether it reads partial sums. */
static void consumer_need(const SimLowering *lw, int cx, int t, SimRegion *need,
                          gboolean *partial)
{
  const OpLay *cl = &lw->ops[cx];
  const SimOp *cop = sim_graph_op_get(lw->g, cx);
  *partial = FALSE;
  for (int c = 0; c < cl->n_shards; c++) {
    gboolean first = TRUE;
    for (int i = 0; i < cop->n_inputs; i++) {
      if (cop->inputs[i] != t)
        continue;
      const SimRegion *r = &cl->in_reg[c * cl->n_in + i];
      if (first) {
        need[c] = *r;
        first = FALSE;
      } else {
        for (int d = 0; d < r->ndim; d++) {
          need[c].lo[d] = MIN(need[c].lo[d], r->lo[d]);
          need[c].hi[d] = MAX(need[c].hi[d], r->hi[d]);
        }
      }
      *partial |= cl->in_partial[i];
    }
  }
}

/* Whether the partial sums of @groups end as reduce-scatters (@scatter, from
 * scatter_groups()): some group spans several devices, and every such group is one. */
static gboolean all_scatter(const GArray *groups, const gboolean *scatter)
{
  gboolean any = FALSE;
  for (guint k = 0; k < groups->len; k++) {
    if (g_array_index(groups, Holders, k).n_devs < 2)
      continue;
    if (!scatter[k])
      return FALSE;
    any = TRUE;
  }
  return any;
}

void lower_build_tensor_block(SimLowering *lw, int t)
{
  const SimTensor *ten = sim_graph_tensor_get(lw->g, t);
  int px = ten->producer;
  const OpLay *pl = &lw->ops[px];
  if (lw->tensor_block[t] < 0)
    lw->tensor_block[t] = sim_taskgraph_block_new(lw->tg);
  else
    sim_taskgraph_block_clear(lw->tg, lw->tensor_block[t]);
  int block = lw->tensor_block[t];
  if (pl->is_input)
    return;
  int M = lw->M, j = ten->producer_slot;
  SimDType dt = ten->dtype;
  GArray *pgroups = lower_group_holders(&lw->regions, pl, pl->out_reg, pl->n_out, j, NULL);
  int ng = (int)pgroups->len;
  gboolean ppartial = pl->out_partial[j];
  if (ten->consumers->len == 0) {
    /* An output nothing reads (the loss) still combines its partial values (a loss over
     * split classes needs the global maximum and sum), and the backward pass starts from
     * the combined result. */
    if (ppartial) {
      Ready *r = g_new(Ready, ng);
      for (int mb = 0; mb < M; mb++) {
        reduce_groups(lw, block, pl, pgroups, NULL, TRUE, P_F, mb, dt, t, r, NULL);
        for (int k = 0; k < ng; k++) {
          Holders *h = &g_array_index(pgroups, Holders, k);
          if (!r[k].reduced)
            continue;
          for (int i = 0; i < h->n; i++)
            if (pl->cidx[h->members[i]] >= 0)
              sim_taskgraph_depend(lw->tg, block, r[k].end,
                                   ref_compute(lw, pl, P_B, mb, h->members[i]));
        }
      }
      g_free(r);
    }
    lower_holders_free(pgroups);
    return;
  }

  /* The producer's partial sums are reduced once per micro-batch, for all consumers;
   * where consumers in the same stage recompute, the recomputation reduces again. */
  gboolean any_recomputed = FALSE;
  for (guint ci = 0; ci < ten->consumers->len; ci++) {
    const OpLay *cl = &lw->ops[g_array_index(ten->consumers, int, ci)];
    any_recomputed |= pl->recompute && cl->recompute && pl->stage == cl->stage;
  }
  Ready *pready_f = g_new(Ready, (size_t)M * ng);
  Ready *pready_r = any_recomputed ? g_new(Ready, (size_t)M * ng) : NULL;
  double p_routed = 1.0;
  gboolean p_experts = routed_fraction(lw, px, &p_routed);
  /* What every consumer reads, and whether the partial sums need only a reduce-scatter
   * (not with experts: their all-to-all is priced from all-reduces, routed_fraction()). */
  guint nc = ten->consumers->len;
  SimRegion **needs = g_new(SimRegion *, nc);
  const OpLay **cls = g_new(const OpLay *, nc);
  gboolean *cpartials = g_new(gboolean, nc);
  for (guint ci = 0; ci < nc; ci++) {
    int cx = g_array_index(ten->consumers, int, ci);
    cls[ci] = &lw->ops[cx];
    needs[ci] = g_new(SimRegion, cls[ci]->n_shards);
    consumer_need(lw, cx, t, needs[ci], &cpartials[ci]);
  }
  gboolean *pscatter = g_new0(gboolean, MAX(ng, 1));
  if (ppartial && !p_experts)
    scatter_groups(pgroups, cls, (const SimRegion *const *)needs, (int)nc, pscatter);
  /* The producer's partial sums end as a reduce-scatter overlapped with its last GEMM
   * (TpOverlap) where every consumer, in its stage, takes a part of them (not a mixture
   * of experts' outputs, whatever their split: Transformer Engine overlaps the dense
   * layers' GEMMs). */
  TpOverlap ov_f = { .on = lower_tp_overlap(lw) && ppartial && !p_experts && pl->t_gemm &&
                           sim_graph_op_type(lw->g, px) != SIM_OP_MOE,
                     .taken = sim_graph_op_type(lw->g, px) == SIM_OP_ATTENTION
                                ? lw->s->tp_overlap.sms_attention
                                : lw->s->tp_overlap.sms_other };
  for (guint ci = 0; ov_f.on && ci < nc; ci++)
    ov_f.on = cls[ci]->stage == pl->stage && !cpartials[ci];
  ov_f.on = ov_f.on && all_scatter(pgroups, pscatter);
  lw->byte_scale = p_experts ? p_routed / 2 : 1.0;
  lw->expert_a2a = p_experts ? p_routed : 0;
  for (int mb = 0; mb < M; mb++) {
    reduce_groups(lw, block, pl, pgroups, pscatter, ppartial, P_F, mb, dt, t,
                  pready_f + (size_t)mb * ng, &ov_f);
    if (pready_r)
      reduce_groups(lw, block, pl, pgroups, pscatter, ppartial, P_R, mb, dt, t,
                    pready_r + (size_t)mb * ng, &ov_f);
  }
  lw->byte_scale = 1.0;
  lw->expert_a2a = 0;
  SimRegion *pneed = g_new(SimRegion, pl->n_shards);
  for (int p = 0; p < pl->n_shards; p++)
    pneed[p] = pl->out_reg[p * pl->n_out + j];
  const SimRegion *pneeds[1] = { pneed };
  /* Transfers already made, per micro-batch and pass (forward, recompute, backward:
   * which = 3 mb + pass), made when first needed. */
  sim_key_index_clear(&lw->transfers);
  /* Gradients are scatter-gathered only where every consumer sits in one other stage: the
   * producer's ranks then hold nothing of the gradient but what they receive, so a part
   * passed on from one to another is exactly the part received (Megatron's stage
   * boundaries). */
  int cstage = lw->ops[g_array_index(ten->consumers, int, 0)].stage;
  gboolean bwd_sg = cstage != pl->stage;
  for (guint ci = 1; ci < ten->consumers->len; ci++)
    bwd_sg &= lw->ops[g_array_index(ten->consumers, int, ci)].stage == cstage;

  for (guint ci = 0; ci < ten->consumers->len; ci++) {
    int cx = g_array_index(ten->consumers, int, ci);
    if (ci > 0 && cx == g_array_index(ten->consumers, int, ci - 1))
      continue; /* a consumer reading the tensor twice is served once */
    const OpLay *cl = &lw->ops[cx];
    const SimOp *cop = sim_graph_op_get(lw->g, cx);
    /* What each consumer shard needs: the box around every input slot reading t. */
    SimRegion *need = needs[ci];
    gboolean cpartial = cpartials[ci];
    gboolean recomputed = pl->recompute && cl->recompute && pl->stage == cl->stage;
    GArray *cgroups = lower_group_holders(&lw->regions, cl, need, 1, 0, NULL);
    int ncg = (int)cgroups->len;
    Ready *cready = g_new(Ready, ncg);
    /* Whether a group is reduced is the same in every micro-batch: the first one's
     * readiness tells the pieces where the data comes from. */
    reduce_groups(lw, -1, cl, cgroups, NULL, cpartial, P_B, -1, dt, t, cready, NULL);
    /* An expert-parallel consumer receives only its routed tokens and sends back their
     * gradients (the tokens, input 0; not the router's logits); an expert-parallel
     * producer receives only its tokens' output gradients (routed_fraction()). */
    double c_routed = 1.0;
    gboolean c_experts = cop->inputs[0] == t && routed_fraction(lw, cx, &c_routed);
    /* Under tensor-parallel overlap (TpOverlap), inside one stage: the gather of a
     * consumer's input (forward) and of the producer's output gradient (backward), and the
     * reduce-scatter of the consumer's partial input gradient. */
    /* (Not into or out of a mixture of experts, whatever its split: Transformer Engine
     * overlaps the dense layers' GEMMs, not the experts' token exchanges.) */
    gboolean same = lower_tp_overlap(lw) && cl->stage == pl->stage && !p_experts && !c_experts &&
                    sim_graph_op_type(lw->g, px) != SIM_OP_MOE &&
                    sim_graph_op_type(lw->g, cx) != SIM_OP_MOE;
    gboolean ag_f = same && cl->t_gemm;
    gboolean ag_b = same && pl->t_gemm;
    /* The consumer's partial gradients, where each producer shard on their devices takes
     * its own part (sequence parallelism's column-parallel products), are
     * reduce-scattered, overlapped or not. */
    gboolean *cscatter = g_new0(gboolean, MAX(ncg, 1));
    if (cpartial && !c_experts)
      scatter_groups(cgroups, &pl, pneeds, 1, cscatter);
    TpOverlap ov_b = { .on = same && cpartial && cl->t_gemm && all_scatter(cgroups, cscatter),
                       .bulk = TRUE };
    /* Sequence parallelism's gathers run as all-gathers; an overlapped one's wait
     * deliver() makes from its pieces, and its bytes travel as the all-gather would (or
     * as the pieces that form none), which nothing waits for.  An expert-parallel
     * all-to-all stays pieces between every pair of devices. */
    GArray *fwd_ag = NULL, *bwd_ag = NULL, *fwd_free = NULL, *bwd_free = NULL;
    GArray *fwd = plan_pieces(lw, pl, pgroups, pready_f, cl, need, TRUE,
                              c_experts || ag_f ? NULL : &fwd_ag);
    GArray *bwd = plan_pieces(lw, cl, cgroups, cready, pl, pneed, bwd_sg,
                              c_experts || p_experts || ag_b ? NULL : &bwd_ag);
    if (ag_f)
      fwd_free = plan_pieces(lw, pl, pgroups, pready_f, cl, need, TRUE, &fwd_ag);
    if (ag_b)
      bwd_free = plan_pieces(lw, cl, cgroups, cready, pl, pneed, bwd_sg, &bwd_ag);
    DeliverMode fmode = ag_f ? DELIVER_WAITS : DELIVER_FLOWS;
    DeliverMode bmode = ag_b ? DELIVER_WAITS : DELIVER_FLOWS;
    for (int mb = 0; mb < M; mb++) {
      lw->byte_scale = c_routed;
      deliver(lw, block, pl, pready_f + (size_t)mb * ng, P_F, cl, fwd, P_F, mb, dt, px, t,
              mb * 3, fmode);
      if (fwd_free)
        deliver(lw, block, pl, pready_f + (size_t)mb * ng, P_F, cl, fwd_free, P_F, mb, dt, px,
                t, mb * 3, DELIVER_FREE);
      deliver_gathers(lw, block, pl, pready_f + (size_t)mb * ng, P_F, cl, fwd_ag, P_F, mb, dt,
                      px, t, mb * 3, !ag_f);
      if (recomputed) {
        deliver(lw, block, pl, pready_r + (size_t)mb * ng, P_R, cl, fwd, P_R, mb, dt, px, t,
                mb * 3 + 1, fmode);
        if (fwd_free)
          deliver(lw, block, pl, pready_r + (size_t)mb * ng, P_R, cl, fwd_free, P_R, mb, dt,
                  px, t, mb * 3 + 1, DELIVER_FREE);
        deliver_gathers(lw, block, pl, pready_r + (size_t)mb * ng, P_R, cl, fwd_ag, P_R, mb,
                        dt, px, t, mb * 3 + 1, !ag_f);
      }
      /* Backward: the consumer's gradient of its input, reduced where partial, goes to
       * the producer shards whose output region it overlaps. */
      lw->byte_scale = c_experts ? c_routed / 2 : 1.0;
      lw->expert_a2a = c_experts ? c_routed : 0;
      reduce_groups(lw, block, cl, cgroups, cscatter, cpartial, P_B, mb, dt, t, cready, &ov_b);
      lw->expert_a2a = 0;
      lw->byte_scale = p_routed;
      deliver(lw, block, cl, cready, P_B, pl, bwd, P_B, mb, dt, cx, t, mb * 3 + 2, bmode);
      if (bwd_free)
        deliver(lw, block, cl, cready, P_B, pl, bwd_free, P_B, mb, dt, cx, t, mb * 3 + 2,
                DELIVER_FREE);
      deliver_gathers(lw, block, cl, cready, P_B, pl, bwd_ag, P_B, mb, dt, cx, t, mb * 3 + 2,
                      !ag_b);
      lw->byte_scale = 1.0;
    }
    if (fwd_free)
      g_array_free(fwd_free, TRUE);
    if (bwd_free)
      g_array_free(bwd_free, TRUE);
    g_array_free(fwd, TRUE);
    g_array_free(bwd, TRUE);
    gathers_free(fwd_ag);
    gathers_free(bwd_ag);
    lower_holders_free(cgroups);
    g_free(cready);
    g_free(cscatter);
  }
  for (guint ci = 0; ci < nc; ci++)
    g_free(needs[ci]);
  g_free(needs);
  g_free(cls);
  g_free(cpartials);
  g_free(pscatter);
  g_free(pneed);
  lower_holders_free(pgroups);
  g_free(pready_f);
  g_free(pready_r);
}
