/* lower.c — turns (graph, strategy, machine) into a task graph.
 *
 * Every operator shard becomes compute tasks: forward, backward and, where activations
 * are recomputed, recompute, for each micro-batch, plus one weight update.  Data between
 * operators moves by region: a consumer shard reads the region of its input that its
 * iteration range projects to, a producer shard writes the region of its output, and
 * what a consumer needs from a producer on another device is the intersection of the
 * two, sent as a flow.  Where a producer's iteration dimensions include some that do not
 * index its output (a split reduction, Megatron's row-parallel linear), the shards hold
 * partial sums, which are all-reduced before use; the same rule, read backwards, makes
 * the gradients of an input partial when the consumer splits dimensions that do not
 * index that input (the column-parallel linear's input), and makes weight gradients
 * partial across the shards that share a weight region (data parallelism), which are
 * all-reduced in buckets once the last micro-batch's backward has produced them.
 *
 * The pipeline schedule only orders the compute streams: each device runs its units
 * (stage, micro-batch, forward or backward) in the order GPipe, 1F1B or interleaved 1F1B
 * gives, and the data dependencies between stages do the rest.
 *
 * The task graph is built in blocks — one per operator, one per produced tensor (its
 * reductions and every transfer to and from its consumers), one for gradient
 * synchronization — so that a change to one operator rebuilds only its block, the
 * blocks of the tensors it reads and writes, and the synchronization (delta simulation).
 *
 * This file lays out the operators, makes their compute blocks, orders them by the
 * pipeline schedule and drives the whole; lower-tensors.c makes the tensors' blocks and
 * lower-sync.c the synchronization, sharing lower-private.h.
 */
#include "lower-private.h"
#include "network.h"

#include <math.h>
#include <string.h>

/* ---- operator layouts ---------------------------------------------------------------- */

static void lay_free(OpLay *l)
{
  g_free(l->cidx);
  g_free(l->in_reg);
  g_free(l->out_reg);
  g_free(l->out_partial);
  g_free(l->in_partial);
  g_free(l->t_f);
  g_free(l->t_b);
  g_free(l->t_r);
  g_free(l->t_u);
  g_free(l->a_f);
  g_free(l->a_r);
  g_free(l->w_elems);
  g_free(l->t_gemm);
  g_free(l->ring_prev);
  g_free(l->core_f);
  g_free(l->core_b);
  int block = l->block;
  memset(l, 0, sizeof *l);
  l->block = block;
}

/* The tensor's shape inside one micro-batch: the dimensions that iteration dimension 0
 * (the sample dimension) indexes are divided by the number of micro-batches. */
static SimShape mb_shape(const SimTensorMap *map, const SimShape *shape, int M)
{
  SimShape s = *shape;
  for (int d = 0; d < s.ndim && d < map->ndim; d++)
    if (map->map[d].dim == 0)
      s.dims[d] = s.dims[d] / M;
  return s;
}

int64_t lower_region_bytes(const SimRegion *r, SimDType dt)
{
  return sim_region_volume(r) * sim_dtype_size(dt);
}

static double work_time(SimLowering *lw, const SimDeviceSpec *spec, const SimWork *w)
{
  double t = 0;
  for (int k = 0; k < w->n; k++)
    t += sim_cost_model_kernel_time(lw->cost, spec, &w->k[k]);
  return t;
}

void lower_zero1_update_share(SimLowering *lw, OpLay *l, const SimRegion *wr, int reps);

/* The iteration dimension of @op named @name, or -1. */
static int dim_named(const SimOp *op, const char *name)
{
  for (int d = 0; d < op->space.ndims; d++)
    if (!strcmp(op->space.dims[d].name, name))
      return d;
  return -1;
}

/* The time of @pass's attention kernels (FlashAttention's) in @l's op on @spec with
 * extents @ext, as a share of @t, the op's time: the part that ring attention overlaps
 * with passing keys and values.  A shard of the query positions (dimension @sd) of @S is
 * priced by the cost model as the last of the sequence's shards, the one a causal mask
 * hides the least of; in @balanced, the share of a ring member under Megatron's
 * two-chunk layout (exec/compile-ring.c), where every member meets the same number of
 * (query, key) pairs: the attention kernels over all @S queries divided by the S / ext
 * members (the shard's own where no kernel is causal). */
static double attention_core_time(SimLowering *lw, int x, const SimDeviceSpec *spec,
                                  const int64_t *ext, SimPass pass, double t, int sd, int64_t S,
                                  double *balanced)
{
  SimWork wk = { 0 };
  sim_graph_op_work(lw->g, x, ext, pass, &wk);
  double all = 0, core = 0;
  gboolean causal = FALSE;
  for (int k = 0; k < wk.n; k++) {
    double tk = sim_cost_model_kernel_time(lw->cost, spec, &wk.k[k]);
    all += tk;
    if (wk.k[k].kind == SIM_KERNEL_ATTENTION) {
      core += tk;
      causal = causal || (wk.k[k].flags & SIM_KERNEL_CAUSAL);
    }
  }
  double own = all > 0 ? t * core / all : 0;
  *balanced = own;
  if (causal && ext[sd] < S && all > 0) {
    int64_t e[SIM_MAX_ITER];
    memcpy(e, ext, sizeof e);
    e[sd] = S;
    SimWork ww = { 0 };
    sim_graph_op_work(lw->g, x, e, pass, &ww);
    double whole = 0;
    for (int k = 0; k < ww.n; k++)
      if (ww.k[k].kind == SIM_KERNEL_ATTENTION)
        whole += sim_cost_model_kernel_time(lw->cost, spec, &ww.k[k]);
    *balanced = t * whole * (double)ext[sd] / (double)S / all;
  }
  return own;
}

/* The times of the first and the last GEMM of @pass's kernels in @x's op on @spec with
 * extents @ext, as shares of @t, the pass's time (TP_GEMM_*; 0 where it runs none). */
static void gemm_times(SimLowering *lw, int x, const SimDeviceSpec *spec, const int64_t *ext,
                       SimPass pass, double t, double *first, double *last)
{
  SimWork wk = { 0 };
  sim_graph_op_work(lw->g, x, ext, pass, &wk);
  double all = 0, f = 0, l = 0;
  gboolean seen = FALSE;
  for (int k = 0; k < wk.n; k++) {
    double tk = sim_cost_model_kernel_time(lw->cost, spec, &wk.k[k]);
    all += tk;
    if (wk.k[k].kind == SIM_KERNEL_GEMM) {
      if (!seen)
        f = tk;
      seen = TRUE;
      l = tk;
    }
  }
  *first = all > 0 ? t * f / all : 0;
  *last = all > 0 ? t * l / all : 0;
}

/* Context parallelism (sim_strategy_set_context_parallel()): a self-attention op whose
 * query positions are split n ways reads only its own positions of the keys and values,
 * and runs as a ring (Liu et al. 2023, Ring Attention; Megatron-Core's context
 * parallelism): in n steps each shard computes its queries against one block of keys and
 * values while the next block is in flight from the previous shard of the ring.  This
 * notes the ring's steps, each shard's sender, the attention kernels' time forward and
 * backward and the block's bytes (the shard's keys and values, b s 2 kv_heads hd
 * elements); build_ring() makes the steps and their flows.  The projections of K and V
 * are priced for the whole sequence (the cost model's shard of query positions computes
 * them all), which overstates them by (n - 1) / n of their FLOPs.  Recorded plans read
 * the same regions but get no steps: executors run the ring themselves
 * (exec/compile-ring.c), passing the blocks between the shards of the ring. */
static void ring_attention(SimLowering *lw, OpLay *l, int x, const SimOp *op,
                           const SimOpConfig *c, int reps)
{
  int sd = dim_named(op, "s"), hd = dim_named(op, "h"), ed = dim_named(op, "e");
  if (sd < 0 || hd < 0 || ed < 0 || c->degree[sd] <= 1 || op->n_inputs != 3 ||
      op->inputs[0] != op->inputs[1] || op->inputs[1] != op->inputs[2])
    return;
  int n = c->degree[sd], nd = op->space.ndims;
  int stride = 1;
  for (int d = sd + 1; d < nd; d++)
    stride *= MAX(c->degree[d], 1);
  int coords[SIM_MAX_ITER];
  int64_t lo[SIM_MAX_ITER], hi[SIM_MAX_ITER], ext[SIM_MAX_ITER];
  l->ring = n;
  l->ring_r = l->recompute;
  l->ring_prev = g_new(int, l->n_shards);
  l->core_f = g_new(double, l->n_shards);
  l->core_b = g_new(double, l->n_shards);
  for (int sh = 0; sh < l->n_shards; sh++) {
    /* Keys and values at the shard's own positions: the region of its queries. */
    for (int i = 1; i < 3; i++)
      l->in_reg[sh * op->n_inputs + i] = l->in_reg[sh * op->n_inputs];
    int idx = sh / reps;
    sim_config_shard_coords(c, nd, idx, coords);
    sim_config_shard_range(op, c, coords, lw->M_size, lo, hi);
    for (int d = 0; d < nd; d++)
      ext[d] = hi[d] - lo[d];
    l->ring_prev[sh] =
      (idx + ((coords[sd] + n - 1) % n - coords[sd]) * stride) * reps + sh % reps;
    l->ring_bytes = (double)ext[0] * ext[sd] * 2.0 * ext[hd] * ext[ed] *
                    sim_dtype_size(op->in_dtype[0]);
    const SimDeviceSpec *spec = sim_machine_device_spec(lw->m, l->dev[sh]);
    int64_t S = op->space.dims[sd].size;
    double bal_f, bal_b;
    double core_f = attention_core_time(lw, x, spec, ext, SIM_PASS_FORWARD, l->t_f[sh], sd, S,
                                        &bal_f);
    double core_b = attention_core_time(lw, x, spec, ext, SIM_PASS_BACKWARD, l->t_b[sh], sd, S,
                                        &bal_b);
    /* The recomputation is a ring where it runs the whole forward. */
    gboolean whole_r = l->t_r[sh] == l->t_f[sh];
    l->ring_r = l->ring_r && whole_r;
    /* Megatron's two-chunk layout: each member's attention is its share of the causal
     * work, not the last shard's. */
    l->t_f[sh] += bal_f - core_f;
    l->t_b[sh] += bal_b - core_b;
    if (whole_r)
      l->t_r[sh] = l->t_f[sh];
    l->core_f[sh] = bal_f;
    l->core_b[sh] = bal_b;
  }
  /* Recorded plans keep one compute task a pass (the executor runs the ring). */
  if (lw->record)
    l->ring = 1;
}

/* The ring of a context-parallel attention op (ring_attention()) for one pass and
 * micro-batch, as Megatron-Core's ring attention runs it (the loop of
 * AttnFuncWithCPAndKVP2P): at step i (0 <= i < n) a shard waits for the block step i - 1
 * received and for its own step i - 1, then sends that block on to the next shard while
 * it receives the next one, and computes its queries against it.  The op's compute task
 * runs the op's other kernels (forward; none backward), then the ring's n steps run on
 * the same stream, each core / n (Megatron's two-chunk layout gives every step of every
 * member the same causal work: ring_attention() prices core as the member's share of the
 * whole sequence's); the backward's other kernels follow its last
 * step.  Join point i of a shard ends when its step i - 1 and the flow that brings block
 * i have ended (join 0: when the compute task has); step i and the flow that passes
 * block i on start from it.  Flows carry the block forward and recomputing, the block
 * and its gradients backward (twice the bytes), on the machine's links like any flow.
 * On an idle machine with c = core / n and f a flow's latency plus its bytes over the
 * route's bandwidth the steps end (n - 1) max(c, f) + c after the compute task. */
static void build_ring(SimLowering *lw, int b, int x, int pass, int mb)
{
  OpLay *l = &lw->ops[x];
  SimTaskGraph *tg = lw->tg;
  int n = l->ring;
  SimTaskClass cls = pass == P_F ? SIM_CLASS_FORWARD
                     : pass == P_B ? SIM_CLASS_BACKWARD : SIM_CLASS_RECOMPUTE;
  double bytes = pass == P_B ? 2 * l->ring_bytes : l->ring_bytes;
  /* Steps, then joins, then flows, in the order of ring_index(). */
  for (int i = 0; i < n; i++)
    for (int sh = 0; sh < l->n_shards; sh++) {
      if (l->cidx[sh] < 0)
        continue;
      double core = pass == P_B ? l->core_b[sh] : l->core_f[sh];
      double t = core / n;
      if (pass == P_B && i == n - 1)
        t += l->t_b[sh] - core;
      SimTask task = sim_task_compute(cls, l->dev[sh], x, sh, mb, t);
      task.n_kernels = 0;
      if (pass == P_B && i == n - 1)
        task.mem_free = l->a_f[sh] + l->a_r[sh];
      SimTaskRef r = sim_taskgraph_add(tg, b, &task);
      g_assert(r.index == ring_index(lw, l, pass, mb, i, sh));
      sim_taskgraph_stream_add(tg, b, l->dev[sh], stream_key(lw, l, pass, mb), r.index);
    }
  for (int i = 0; i < n; i++)
    for (int sh = 0; sh < l->n_shards; sh++) {
      if (l->cidx[sh] < 0)
        continue;
      SimTask nop = sim_task_nop();
      nop.op = x;
      nop.mb = mb;
      nop.shard = sh;
      SimTaskRef j = sim_taskgraph_add(tg, b, &nop);
      SimTaskRef before = i == 0 ? ref_compute(lw, l, pass, mb, sh)
                                 : (SimTaskRef){ b, ring_index(lw, l, pass, mb, i - 1, sh) };
      sim_taskgraph_depend(tg, b, before, j);
      sim_taskgraph_depend(tg, b, j, (SimTaskRef){ b, ring_index(lw, l, pass, mb, i, sh) });
    }
  for (int i = 1; i < n; i++)
    for (int sh = 0; sh < l->n_shards; sh++) {
      if (l->cidx[sh] < 0)
        continue;
      /* A ring whose sender is folded away (its tensor-parallel ranks folded, sim/fold.c)
       * does not fold: the ranks' shadows do not stand for its flows. */
      int from = l->ring_prev[sh];
      int waits = from;
      if (l->cidx[from] < 0) {
        lw->fold_violated = TRUE;
        waits = sh;
      }
      SimTask f = l->dev[from] == l->dev[sh]
                    ? sim_task_nop()
                    : sim_task_flow(SIM_CLASS_TRANSFER, l->dev[from], l->dev[sh], bytes, x, mb);
      f.shard = sh;
      f.mb = mb;
      f.op = x;
      SimTaskRef fr = sim_taskgraph_add(tg, b, &f);
      g_assert(fr.index == ring_index(lw, l, pass, mb, 2 * n - 1 + i, sh));
      sim_taskgraph_depend(tg, b, (SimTaskRef){ b, ring_index(lw, l, pass, mb, n + i - 1, waits) },
                           fr);
      sim_taskgraph_depend(tg, b, fr, (SimTaskRef){ b, ring_index(lw, l, pass, mb, n + i, sh) });
    }
}

/* Sequence parallelism (SimStrategy.sequence_parallel): Megatron's column-parallel layers
 * (the attention's QKV projection, the first GEMM of an MLP, the output layer) all-gather
 * their input from the ranks' sequence shards, but save for the backward pass only the
 * shard their own rank held, and gather the rest again when the backward pass needs it
 * (Korthikanti et al. 2022, section 4.2.2: every activation of a layer is then divided by
 * the tensor-parallel degree).  The second gather's time is not priced: Megatron issues it
 * asynchronously beside the GEMM of the input's gradient, which on t ranks with a 3h-wide
 * QKV projection hides it where 7 F / (3 h B) < 1 at t = 8 (F the GEMMs' FLOP/s, B the
 * gather's bytes/s: h >= 4,414 on DGX H100 at 700 TFLOP/s and 370 GB/s), and its bytes are
 * not on the links.  The bytes of @x's shard 0 inputs that its device did not
 * hold before the forward pass (the parts gathered from other ranks' shards), counted
 * only for the ops whose saved activations hold their input (SimOpClass.saved_bytes of
 * linear layers, attention and gated MLPs); shards have equal extents, so it holds for
 * every shard. */
static int64_t gathered_input_bytes(const SimLowering *lw, int x)
{
  const SimOp *op = sim_graph_op_get(lw->g, x);
  const OpLay *l = &lw->ops[x];
  if (!lw->s->sequence_parallel || l->n_shards < 1)
    return 0;
  int slots;
  if (op->type == SIM_OP_ATTENTION)
    slots = op->n_inputs; /* kept_outside_core(): every distinct input */
  else if (op->type == SIM_OP_LINEAR || op->type == SIM_OP_GATED_MLP)
    slots = 1;
  else
    return 0;
  int dev = l->dev[0];
  int64_t bytes = 0;
  for (int i = 0; i < slots; i++) {
    gboolean repeat = FALSE;
    for (int k = 0; k < i; k++)
      repeat |= op->inputs[k] == op->inputs[i];
    if (repeat)
      continue;
    const SimTensor *ten = sim_graph_tensor_get(lw->g, op->inputs[i]);
    const OpLay *pl = &lw->ops[ten->producer];
    if (pl->is_input || ten->producer >= x)
      continue;
    const SimRegion *need = &l->in_reg[i];
    int64_t vol = sim_region_volume(need), held = 0;
    for (int p = 0; p < pl->n_shards; p++) {
      SimRegion part;
      if (pl->dev[p] == dev &&
          sim_region_intersect(need, &pl->out_reg[p * pl->n_out + ten->producer_slot], &part))
        held = MAX(held, sim_region_volume(&part));
    }
    if (held > 0 && held < vol)
      bytes += (vol - held) * sim_dtype_size(op->in_dtype[i]);
  }
  return bytes;
}

static void lay_op(SimLowering *lw, int x)
{
  OpLay *l = &lw->ops[x];
  lay_free(l);
  l->op = x;
  const SimOp *op = sim_graph_op_get(lw->g, x);
  if (op->type == SIM_OP_INPUT) {
    l->is_input = TRUE;
    return;
  }
  const SimOpConfig *c = &lw->s->ops[x];
  const SimOpClass *klass = sim_op_class(op->type);
  int ns = c->n_shards, nd = op->space.ndims, M = lw->M_size;
  int reps = c->replicas > 1 ? c->replicas : 1;
  l->n_shards = ns;
  l->n_in = op->n_inputs;
  l->n_out = op->n_outputs;
  l->dev = c->devices;
  l->stage = lw->s->op_stage[x];
  l->has_weights = op->n_weights > 0;
  l->cidx = g_new(int, ns);
  l->n_sim = 0;
  for (int sh = 0; sh < ns; sh++)
    l->cidx[sh] = (!lw->simulated || lw->simulated[c->devices[sh]]) ? l->n_sim++ : -1;
  l->in_reg = g_new(SimRegion, (size_t)ns * (op->n_inputs ? op->n_inputs : 1));
  l->out_reg = g_new(SimRegion, (size_t)ns * (op->n_outputs ? op->n_outputs : 1));
  l->out_partial = g_new0(gboolean, op->n_outputs ? op->n_outputs : 1);
  l->in_partial = g_new0(gboolean, op->n_inputs ? op->n_inputs : 1);
  for (int j = 0; j < op->n_outputs; j++)
    l->out_partial[j] = sim_map_partial(op, c->degree, sim_space_output_map(op, j));
  for (int i = 0; i < op->n_inputs; i++)
    l->in_partial[i] = sim_map_partial(op, c->degree, sim_space_input_map(op, i));
  l->t_f = g_new(double, ns);
  l->t_b = g_new(double, ns);
  l->t_r = g_new(double, ns);
  l->t_u = g_new(double, ns);
  l->a_f = g_new(int64_t, ns);
  l->a_r = g_new(int64_t, ns);
  l->w_elems = g_new(int64_t, ns);

  SimRecompute rc = lw->s->memory.recompute;
  if (rc == SIM_RECOMPUTE_FULL)
    l->recompute = !op->checkpoint && x < lw->last_checkpoint;
  else if (rc == SIM_RECOMPUTE_SELECTIVE)
    l->recompute = op->selective_recompute;

  int coords[SIM_MAX_ITER];
  int64_t lo[SIM_MAX_ITER], hi[SIM_MAX_ITER], ext[SIM_MAX_ITER];
  const SimDeviceSpec *prev_spec = NULL;
  double tf = 0, tb = 0, tr = 0, tu = 0;
  int64_t af = 0, ar = 0;
  double gt[4] = { 0 };
  if (lower_tp_overlap(lw))
    l->t_gemm = g_new0(double, 4 * (size_t)ns);
  gboolean zero1 = lw->s->memory.zero1 && l->has_weights && ns > 1;
  SimRegion *wr = zero1 ? g_new(SimRegion, ns) : NULL;
  for (int sh = 0; sh < ns; sh++) {
    sim_config_shard_coords(c, nd, sh / reps, coords);
    sim_config_shard_range(op, c, coords, M, lo, hi);
    for (int d = 0; d < nd; d++)
      ext[d] = hi[d] - lo[d];
    int64_t in_bytes = 0, out_bytes = 0;
    for (int i = 0; i < op->n_inputs; i++) {
      const SimTensorMap *map = sim_space_input_map(op, i);
      SimShape shp = mb_shape(map, &op->in_shape[i], M);
      SimRegion *r = &l->in_reg[sh * op->n_inputs + i];
      sim_map_project(map, &shp, lo, hi, r);
      in_bytes += lower_region_bytes(r, op->in_dtype[i]);
    }
    for (int j = 0; j < op->n_outputs; j++) {
      const SimTensorMap *map = sim_space_output_map(op, j);
      SimShape shp = mb_shape(map, &op->out_shape[j], M);
      SimRegion *r = &l->out_reg[sh * op->n_outputs + j];
      sim_map_project(map, &shp, lo, hi, r);
      out_bytes += lower_region_bytes(r, op->out_dtype[j]);
    }
    int64_t we = 0;
    for (int w = 0; w < op->n_weights; w++) {
      SimRegion r;
      sim_map_project(sim_space_weight_map(op, w), &op->w_shape[w], lo, hi, &r);
      we += sim_region_volume(&r);
      if (wr && w == 0)
        wr[sh] = r;
    }
    l->w_elems[sh] = we;

    /* Shards have equal extents (degrees divide their dimensions), so the times and
     * memory of one shard hold for every shard on the same kind of device. */
    const SimDeviceSpec *spec = sim_machine_device_spec(lw->m, c->devices[sh]);
    if (spec != prev_spec) {
      prev_spec = spec;
      tf = sim_cost_model_op_time(lw->cost, spec, lw->g, x, ext, SIM_PASS_FORWARD);
      tb = sim_cost_model_op_time(lw->cost, spec, lw->g, x, ext, SIM_PASS_BACKWARD);
      SimWork wk = { 0 };
      sim_graph_op_work(lw->g, x, ext, SIM_PASS_FORWARD, &wk);
      l->k_f = l->k_r = (uint16_t)wk.n;
      wk.n = 0;
      sim_graph_op_work(lw->g, x, ext, SIM_PASS_BACKWARD, &wk);
      l->k_b = (uint16_t)wk.n;
      tu = l->has_weights ? sim_cost_model_op_time(lw->cost, spec, lw->g, x, ext, SIM_PASS_UPDATE)
                          : 0;
      if (l->t_gemm) {
        gemm_times(lw, x, spec, ext, SIM_PASS_FORWARD, tf, &gt[TP_GEMM_FIRST_F],
                   &gt[TP_GEMM_LAST_F]);
        gemm_times(lw, x, spec, ext, SIM_PASS_BACKWARD, tb, &gt[TP_GEMM_FIRST_B],
                   &gt[TP_GEMM_LAST_B]);
      }
      int64_t saved = klass->saved_bytes(op, ext);
      af = saved;
      ar = 0;
      tr = 0;
      if (l->recompute && rc == SIM_RECOMPUTE_FULL) {
        af = 0;
        ar = saved;
        tr = tf;
      } else if (l->recompute) {
        if (klass->selective) {
          SimWork rw = { 0 };
          int64_t kept = 0;
          klass->selective(op, ext, &rw, &kept);
          af = kept;
          tr = work_time(lw, spec, &rw);
          l->k_r = (uint16_t)rw.n;
        } else {
          af = in_bytes;
          tr = tf;
        }
        ar = saved > af ? saved - af : 0;
      } else if (rc == SIM_RECOMPUTE_FULL && op->checkpoint) {
        /* A layer boundary keeps its output for the next layer's recomputation. */
        af = saved + out_bytes;
      }
    }
    l->t_f[sh] = tf;
    l->t_b[sh] = tb;
    if (l->t_gemm) {
      memcpy(l->t_gemm + 4 * (size_t)sh, gt, sizeof gt);
      l->sms = spec->sm_count;
    }
    l->t_r[sh] = tr;
    /* The device steps the share of the states it keeps (the host the rest). */
    l->t_u[sh] = lw->s->memory.offload > 0 ? tu * (1.0 - lw->s->memory.offload) : tu;
    if (op->weight_owner != x) {
      /* The owner's shard on this device updates the shared weights. */
      const SimOpConfig *oc = &lw->s->ops[op->weight_owner];
      for (int k = 0; k < oc->n_shards; k++)
        if (oc->devices[k] == c->devices[sh])
          l->t_u[sh] = 0;
    }
    l->a_f[sh] = af;
    l->a_r[sh] = ar;
  }
  /* What sequence parallelism's column-parallel layers do not save (above): taken off
   * what the forward pass keeps, or under full recomputation what the recomputation
   * keeps, never below nothing. */
  int64_t gathered = gathered_input_bytes(lw, x);
  for (int sh = 0; gathered > 0 && sh < ns; sh++) {
    if (l->recompute && rc == SIM_RECOMPUTE_FULL)
      l->a_r[sh] = MAX(l->a_r[sh] - gathered, 0);
    else
      l->a_f[sh] = MAX(l->a_f[sh] - gathered, 0);
  }
  if (wr) {
    lower_zero1_update_share(lw, l, wr, reps);
    g_free(wr);
  }
  if (lw->s->cp > 1 && op->type == SIM_OP_ATTENTION)
    ring_attention(lw, l, x, op, c, reps);
}

/* ---- task references ---------------------------------------------------------------- */

static void build_op_block(SimLowering *lw, int x)
{
  OpLay *l = &lw->ops[x];
  if (l->block < 0)
    l->block = sim_taskgraph_block_new(lw->tg);
  else
    sim_taskgraph_block_clear(lw->tg, l->block);
  if (l->is_input)
    return;
  SimTaskGraph *tg = lw->tg;
  int b = l->block, M = lw->M;
  int passes = l->recompute ? 3 : 2;
  int n_sim = 0;
  for (int sh = 0; sh < l->n_shards; sh++)
    n_sim += l->cidx[sh] >= 0;
  int n_tasks = (passes * M + (l->has_weights ? 1 : 0)) * n_sim;
  sim_taskgraph_block_reserve(tg, b, n_tasks, (passes - 1) * M * n_sim, n_tasks);
  for (int p = 0; p < passes; p++)
    for (int mb = 0; mb < M; mb++)
      for (int sh = 0; sh < l->n_shards; sh++) {
        if (l->cidx[sh] < 0)
          continue;
        int dev = l->dev[sh];
        SimTask t;
        uint64_t key = stream_key(lw, l, p, mb);
        /* Under a ring (build_ring()) the task runs the op's other kernels only. */
        double ring_f = ring_pass(l, P_F) ? l->core_f[sh] : 0;
        if (p == P_F) {
          t = sim_task_compute(SIM_CLASS_FORWARD, dev, x, sh, mb, l->t_f[sh] - ring_f);
          t.mem_alloc = l->a_f[sh];
          t.n_kernels = l->k_f;
        } else if (p == P_B) {
          gboolean ring_b = ring_pass(l, P_B);
          t = sim_task_compute(SIM_CLASS_BACKWARD, dev, x, sh, mb, ring_b ? 0 : l->t_b[sh]);
          t.mem_free = ring_b ? 0 : l->a_f[sh] + l->a_r[sh];
          t.n_kernels = l->k_b;
        } else {
          t = sim_task_compute(SIM_CLASS_RECOMPUTE, dev, x, sh, mb,
                               l->t_r[sh] - (ring_pass(l, P_R) ? l->core_f[sh] : 0));
          t.mem_alloc = l->a_r[sh];
          t.n_kernels = l->k_r;
        }
        SimTaskRef r = sim_taskgraph_add(tg, b, &t);
        sim_taskgraph_stream_add(tg, b, dev, key, r.index);
      }
  if (l->has_weights)
    for (int sh = 0; sh < l->n_shards; sh++) {
      if (l->cidx[sh] < 0)
        continue;
      SimTask t = sim_task_compute(SIM_CLASS_UPDATE, l->dev[sh], x, sh, -1, l->t_u[sh]);
      /* The optimizer step is issued as multi-tensor launches (apex's and PyTorch's
       * fused Adam, multi_tensor_apply): one launch updates dozens of tensors and
       * millions of elements, so a whole model's update costs the host a few kernels,
       * none of them an operator's own. */
      t.n_kernels = 0;
      SimTaskRef r = sim_taskgraph_add(tg, b, &t);
      sim_taskgraph_stream_add(tg, b, l->dev[sh], lw->rank_update << 32 | 2 * (uint32_t)x,
                               r.index);
    }
  if (l->ring > 1)
    for (int p = 0; p < passes; p++)
      for (int mb = 0; mb < M && ring_pass(l, p); mb++)
        build_ring(lw, b, x, p, mb);
  /* A backward pass needs its own forward pass's (or recomputation's) activations even
   * where no gradient flows into it (the loss). */
  for (int mb = 0; mb < M; mb++)
    for (int sh = 0; sh < l->n_shards; sh++) {
      if (l->cidx[sh] < 0)
        continue;
      depend_compute(lw, b, l, P_F, mb, sh, l, P_B, mb, sh);
      if (l->recompute)
        depend_compute(lw, b, l, P_R, mb, sh, l, P_B, mb, sh);
    }
}

/* ---- the pipeline schedule -------------------------------------------------------------- */

static void build_schedule(SimLowering *lw)
{
  const SimStrategy *s = lw->s;
  int S = s->n_stages, M = lw->M;
  int V = sim_strategy_chunks_per_group(s);
  int P = S / V;
  lw->rank_f = g_new0(uint64_t, (size_t)S * M);
  lw->rank_b = g_new0(uint64_t, (size_t)S * M);
  for (int k = 0; k < P; k++) {
    uint64_t r = 0;
    int units = M * V;
    if (s->schedule == SIM_SCHEDULE_GPIPE) {
      for (int mb = 0; mb < M; mb++)
        lw->rank_f[(size_t)k * M + mb] = r++;
      for (int mb = 0; mb < M; mb++)
        lw->rank_b[(size_t)k * M + mb] = r++;
      continue;
    }
    /* 1F1B (Narayanan et al. 2021) and its interleaved form (Megatron-LM's
     * forward_backward_pipelining_with_interleaving): a warm-up of forwards, then one
     * forward and one backward in turn, then the remaining backwards. */
    int warm = V > 1 ? (P - k - 1) * 2 + (V - 1) * P : P - k - 1;
    if (warm > units)
      warm = units;
    int fu = 0, bu = 0;
#define UNIT_STAGE(u, fwd)                                                                   \
  ((V > 1 ? ((fwd) ? ((u) / P) % V : V - 1 - ((u) / P) % V) : 0) * P + k)
#define UNIT_MB(u) (V > 1 ? ((u) / (P * V)) * P + (u) % P : (u))
    for (; fu < warm; fu++)
      lw->rank_f[(size_t)UNIT_STAGE(fu, 1) * M + UNIT_MB(fu)] = r++;
    while (fu < units) {
      lw->rank_f[(size_t)UNIT_STAGE(fu, 1) * M + UNIT_MB(fu)] = r++;
      fu++;
      lw->rank_b[(size_t)UNIT_STAGE(bu, 0) * M + UNIT_MB(bu)] = r++;
      bu++;
    }
    for (; bu < units; bu++)
      lw->rank_b[(size_t)UNIT_STAGE(bu, 0) * M + UNIT_MB(bu)] = r++;
#undef UNIT_STAGE
#undef UNIT_MB
  }
  lw->rank_update = (uint64_t)2 * M * V + 1;

  /* The backward order: segments between layer boundaries from last to first; under full
   * recomputation a segment is recomputed forwards before its backward runs. */
  int n = lw->n_ops;
  lw->seg = g_new(int, n);
  int nck = 0;
  lw->last_checkpoint = -1;
  for (int x = 0; x < n; x++) {
    lw->seg[x] = nck;
    if (sim_graph_op_is_checkpoint(lw->g, x)) {
      nck++;
      lw->last_checkpoint = x;
    }
  }
}

static void order_backward(SimLowering *lw)
{
  int n = lw->n_ops;
  gboolean full = lw->s->memory.recompute == SIM_RECOMPUTE_FULL;
  uint32_t pos = 0;
  int hi = n - 1;
  while (hi >= 0) {
    int lo = hi;
    while (lo > 0 && lw->seg[lo - 1] == lw->seg[hi])
      lo--;
    if (full)
      for (int x = lo; x <= hi; x++)
        if (lw->ops[x].recompute)
          lw->ops[x].pos_r = pos++;
    for (int x = hi; x >= lo; x--) {
      if (!full && lw->ops[x].recompute)
        lw->ops[x].pos_r = pos++;
      lw->ops[x].pos_b = pos++;
    }
    hi = lo - 1;
  }
}

/* ---- the lowering ------------------------------------------------------------------------ */

SimLowering *sim_lowering_new(const SimGraph *g, const SimMachine *m, const SimStrategy *s,
                              SimCostModel *cost, const SimOptions *o, const SimCollParams *cp,
                              const uint8_t *simulated)
{
  SimLowering *lw = g_new0(SimLowering, 1);
  lw->g = g;
  lw->m = m;
  lw->s = s;
  lw->byte_scale = 1.0;
  lw->expert_a2a = 0;
  lw->cost = cost;
  lw->o = *o;
  lw->cp = *cp;
  lw->n_ops = sim_graph_n_ops(g);
  lw->n_dev = sim_machine_n_devices(m);
  lw->M = lw->M_size = s->microbatches > 0 ? s->microbatches : 1;
  if (simulated)
    lw->simulated = g_memdup2(simulated, (size_t)lw->n_dev);
  lw->ops = g_new0(OpLay, lw->n_ops);
  for (int x = 0; x < lw->n_ops; x++)
    lw->ops[x].block = -1;
  int nt = sim_graph_n_tensors(g);
  lw->tensor_block = g_new(int, nt);
  for (int t = 0; t < nt; t++)
    lw->tensor_block[t] = -1;
  lw->sync_block = -1;
  lw->coll_blocks = g_array_new(FALSE, FALSE, sizeof(int));
  sim_key_index_init(&lw->regions, sizeof(RegionKey));
  sim_key_index_init(&lw->transfers, sizeof(SentKey));
  sim_key_index_init(&lw->step_rings, (STEP_RING_MAX + 2) * sizeof(int32_t));
  lw->steps = g_array_new(FALSE, FALSE, sizeof(RingStep));
  lw->step_ring = g_array_new(FALSE, FALSE, sizeof(StepRing));
  lw->coll_keys = g_hash_table_new_full(sim_bytes_hash, g_bytes_equal,
                                        (GDestroyNotify)g_bytes_unref, NULL);
  lw->op_sync = g_new0(struct OpSync, MAX(lw->n_ops, 1));
  lw->sharers = g_new0(GArray *, lw->n_ops);
  for (int x = 0; x < lw->n_ops; x++) {
    int owner = sim_graph_op_weight_owner(g, x);
    if (owner == x)
      continue;
    if (!lw->sharers[owner])
      lw->sharers[owner] = g_array_new(FALSE, FALSE, sizeof(int));
    g_array_append_val(lw->sharers[owner], x);
  }
  lw->tg = sim_taskgraph_new(lw->n_dev);
  build_schedule(lw);
  lw->model_flops = sim_graph_forward_flops(g) + sim_graph_backward_flops(g);
  return lw;
}

void sim_lowering_set_microbatch_count(SimLowering *lw, int n)
{
  g_return_if_fail(n > 0);
  /* build_schedule() makes the ranks and the segments again. */
  g_free(lw->rank_f);
  g_free(lw->rank_b);
  g_free(lw->seg);
  lw->M = n;
  build_schedule(lw);
}

void sim_lowering_shard_range(const SimLowering *lw, int x, int shard, int64_t *lo, int64_t *hi)
{
  const SimOp *op = sim_graph_op_get(lw->g, x);
  const SimOpConfig *c = &lw->s->ops[x];
  int reps = c->replicas > 1 ? c->replicas : 1;
  int coords[SIM_MAX_ITER];
  sim_config_shard_coords(c, op->space.ndims, shard / reps, coords);
  sim_config_shard_range(op, c, coords, lw->M_size, lo, hi);
}

SimShape sim_lowering_tensor_shape(const SimLowering *lw, int x, SimTensorRole role, int i)
{
  const SimOp *op = sim_graph_op_get(lw->g, x);
  if (role == SIM_TENSOR_WEIGHT)
    return op->w_shape[i];
  const SimTensorMap *map =
    role == SIM_TENSOR_INPUT ? sim_space_input_map(op, i) : sim_space_output_map(op, i);
  return mb_shape(map, role == SIM_TENSOR_INPUT ? &op->in_shape[i] : &op->out_shape[i], lw->M_size);
}

void sim_lowering_shard_region(const SimLowering *lw, int x, int shard, SimTensorRole role,
                               int i, SimRegion *out)
{
  const SimOp *op = sim_graph_op_get(lw->g, x);
  const OpLay *l = &lw->ops[x];
  /* What the layout reads (ring attention reads fewer keys and values than the map says). */
  if (role == SIM_TENSOR_INPUT && l->in_reg && shard < l->n_shards) {
    *out = l->in_reg[shard * op->n_inputs + i];
    return;
  }
  int64_t lo[SIM_MAX_ITER], hi[SIM_MAX_ITER];
  sim_lowering_shard_range(lw, x, shard, lo, hi);
  const SimTensorMap *map = role == SIM_TENSOR_INPUT    ? sim_space_input_map(op, i)
                            : role == SIM_TENSOR_WEIGHT ? sim_space_weight_map(op, i)
                                                        : sim_space_output_map(op, i);
  SimShape shp = sim_lowering_tensor_shape(lw, x, role, i);
  sim_map_project(map, &shp, lo, hi, out);
}

void sim_lowering_ring_steps(SimLowering *lw, gboolean rings, gboolean waits)
{
  lw->ring_steps = rings;
  lw->wait_steps = waits;
}

/* Whether the step at stream position @k of device @d sits between a task it waits for and
 * the next task, which waits for it: then nothing else runs on the device from the one's
 * end to the other's start, the step's time or its ring's alike. */
static gboolean between_neighbours(const SimTaskGraph *tg, int32_t k, int32_t d)
{
  if (k <= tg->stream_off[d] || k + 1 >= tg->stream_off[d + 1])
    return FALSE;
  int32_t prev = tg->stream[k - 1], id = tg->stream[k], next = tg->stream[k + 1];
  gboolean after = FALSE, before = FALSE;
  const int32_t *su = tg->succ + tg->task[prev].succ_off;
  for (int j = 0; j < tg->task[prev].n_succ && !after; j++)
    after = su[j] == id;
  su = tg->succ + tg->task[id].succ_off;
  for (int j = 0; j < tg->task[id].n_succ && !before; j++)
    before = su[j] == next;
  return after && before;
}

void sim_lowering_settle_ring_steps(SimLowering *lw)
{
  SimTaskGraph *tg = lw->tg;
  guint ns = lw->steps->len;
  if (ns == 0)
    return;
  int n = tg->n_tasks, nd = tg->n_devices, nl = sim_machine_n_links(lw->m);
  SimTask *task = tg->task;
  int32_t *pos = sim_large_alloc(MAX((size_t)n, 1) * sizeof(int32_t));
  memset(pos, 0xff, (size_t)n * sizeof(int32_t));
  for (int32_t k = 0; k < tg->stream_off[nd]; k++)
    pos[tg->stream[k]] = k;
  /* Per device: whether its steps stand for their rings (1), or run as their flows (0). */
  uint8_t *clean = g_new(uint8_t, MAX(nd, 1));
  memset(clean, 1, (size_t)nd);
  gboolean moved = FALSE;
  for (guint i = 0; i < ns; i++) {
    const RingStep *st = &g_array_index(lw->steps, RingStep, i);
    int32_t id = sim_taskgraph_id(tg, st->task);
    gboolean ok = between_neighbours(tg, pos[id], st->device);
    if (st->ring < 0 && !ok) {
      /* A wait (add_wait()) the stream runs beside something: a delay again. */
      task[id].kind = SIM_TASK_DELAY;
      moved = TRUE;
    } else if (!ok) {
      /* Where the stream runs something else before it waits for a ring, the ring runs
       * beside that; where no later task of the stream waits for it, beside any of them. */
      clean[st->device] = 0;
    }
  }
  /* The rings' links their own: no other device's ring and no flow crosses them. */
  int32_t *owner = g_new(int32_t, MAX(nl, 1));
  for (int l = 0; l < nl; l++)
    owner[l] = -1;
  for (guint i = 0; i < ns; i++) {
    const RingStep *st = &g_array_index(lw->steps, RingStep, i);
    if (st->ring < 0)
      continue;
    const StepRing *r = &g_array_index(lw->step_ring, StepRing, st->ring);
    const int *links = &g_array_index(tg->step_links, int, r->links_off);
    int32_t d = st->device;
    if (i > 0 && st->ring == st[-1].ring && d == st[-1].device)
      continue; /* the same links as the step before */
    for (int j = 0; j < r->n_links; j++) {
      int32_t *o = &owner[links[j]];
      if (*o >= 0 && *o != d)
        clean[*o] = clean[d] = 0;
      *o = d;
    }
  }
  for (int t = 0; t < n; t++) {
    const SimTask *f = &task[t];
    if (f->kind != SIM_TASK_FLOW)
      continue;
    int k;
    const int32_t *links = sim_taskgraph_flow_links(tg, lw->m, f, &k);
    for (int j = 0; j < k; j++)
      if (owner[links[j]] >= 0)
        clean[owner[links[j]]] = 0;
  }
  g_free(owner);
  /* The steps of a device that is not clean run as their rings' flows (the flow
   * sim_collective_lower_bare() makes, without its join points, which change no time),
   * off the stream, each ring's links and members added to the graph's once. */
  guint n_ring = lw->step_ring->len;
  int32_t *ring_off = g_new(int32_t, MAX(n_ring, 1));
  for (guint r = 0; r < n_ring; r++)
    ring_off[r] = -1;
  size_t add = 0;
  for (guint i = 0; i < ns; i++) {
    const RingStep *st = &g_array_index(lw->steps, RingStep, i);
    if (st->ring >= 0 && !clean[st->device] && ring_off[st->ring] < 0) {
      const StepRing *r = &g_array_index(lw->step_ring, StepRing, st->ring);
      ring_off[st->ring] = 0;
      add += (size_t)r->n_links + (size_t)r->n_devs;
    }
  }
  if (add) {
    /* After the assembly's extra array, as the merging's rings are (taskgraph-merge.c). */
    size_t base = tg->cap_extra;
    int32_t *extra = sim_large_alloc((base + add) * sizeof(int32_t));
    if (base)
      memcpy(extra, tg->extra, base * sizeof(int32_t));
    g_free(tg->extra);
    tg->extra = extra;
    tg->cap_extra = base + add;
    for (guint q = 0; q < n_ring; q++) {
      if (ring_off[q] < 0)
        continue;
      const StepRing *r = &g_array_index(lw->step_ring, StepRing, q);
      ring_off[q] = (int32_t)base;
      memcpy(tg->extra + base, &g_array_index(tg->step_links, int, r->links_off),
             (size_t)r->n_links * sizeof(int32_t));
      memcpy(tg->extra + base + r->n_links, r->devs, (size_t)r->n_devs * sizeof(int32_t));
      base += (size_t)r->n_links + (size_t)r->n_devs;
    }
  }
  for (guint i = 0; i < ns; i++) {
    const RingStep *st = &g_array_index(lw->steps, RingStep, i);
    if (st->ring < 0 || clean[st->device])
      continue;
    SimTask *t = &task[sim_taskgraph_id(tg, st->task)];
    const StepRing *r = &g_array_index(lw->step_ring, StepRing, st->ring);
    SimTask f = sim_task_flow(SIM_CLASS_REDUCTION, r->devs[0], r->devs[1], st->bytes, -1, t->mb);
    f.duration = st->latency;
    f.links_off = ring_off[st->ring];
    f.n_links = (uint16_t)r->n_links;
    f.n_members = (uint16_t)r->n_devs;
    f.succ_off = t->succ_off;
    f.n_succ = t->n_succ;
    *t = f;
    moved = TRUE;
  }
  if (moved) {
    int32_t out = 0;
    for (int d = 0; d < nd; d++) {
      int32_t lo = tg->stream_off[d], hi = tg->stream_off[d + 1];
      tg->stream_off[d] = out;
      for (int32_t k = lo; k < hi; k++)
        if (task[tg->stream[k]].kind == SIM_TASK_COMPUTE)
          tg->stream[out++] = tg->stream[k];
    }
    tg->stream_off[nd] = out;
  }
  if (moved)
    g_debug("ring steps: %u, some of whose devices run their rings as flows", ns);
  g_free(ring_off);
  g_free(clean);
  g_free(pos);
}

void sim_lowering_drop_implied_edges(SimLowering *lw, gboolean on)
{
  lw->drop_implied = on;
}

void sim_lowering_record_semantics(SimLowering *lw, gboolean on)
{
  lw->record = on;
}

void sim_lowering_free(SimLowering *lw)
{
  if (!lw)
    return;
  for (int x = 0; x < lw->n_ops; x++)
    lay_free(&lw->ops[x]);
  g_free(lw->ops);
  for (int x = 0; x < lw->n_ops; x++)
    if (lw->sharers[x])
      g_array_free(lw->sharers[x], TRUE);
  g_free(lw->sharers);
  g_free(lw->tensor_block);
  g_array_free(lw->coll_blocks, TRUE);
  g_hash_table_destroy(lw->coll_keys);
  for (int x = 0; x < lw->n_ops; x++) {
    struct OpSync *os = &lw->op_sync[x];
    if (!os->items)
      continue;
    lower_op_sync_invalidate(lw, x);
    g_array_free(os->items, TRUE);
    g_array_free(os->ties, TRUE);
    g_array_free(os->mem, TRUE);
    g_array_free(os->offload, TRUE);
  }
  g_free(lw->op_sync);
  g_free(lw->rank_f);
  g_free(lw->rank_b);
  g_free(lw->seg);
  g_free(lw->simulated);
  sim_taskgraph_free(lw->tg);
  sim_key_index_free(&lw->regions);
  sim_key_index_free(&lw->step_rings);
  g_array_free(lw->steps, TRUE);
  g_array_free(lw->step_ring, TRUE);
  g_clear_pointer(&lw->step_net, sim_net_free);
  sim_key_index_free(&lw->transfers);
  g_free(lw);
}

void sim_lowering_build(SimLowering *lw)
{
  for (int x = 0; x < lw->n_ops; x++) {
    if (lower_lowering_cancelled(lw, x))
      return;
    lay_op(lw, x);
  }
  order_backward(lw);
  for (int x = 0; x < lw->n_ops; x++) {
    if (lower_lowering_cancelled(lw, x))
      return;
    build_op_block(lw, x);
  }
  int nt = sim_graph_n_tensors(lw->g);
  for (int t = 0; t < nt; t++) {
    if (lower_lowering_cancelled(lw, t))
      return;
    lower_build_tensor_block(lw, t);
  }
  if (lower_lowering_cancelled(lw, 0))
    return;
  lower_build_sync_block(lw);
}

void sim_lowering_update_ops(SimLowering *lw, const int *changed, int n_changed)
{
  /* The users of a changed op's weights are laid out again too: a user's shard skips the
   * update of the shared weights where the owner has a shard on its device, so its
   * update's time follows the owner's devices (a tied embedding's output layer). */
  int n_ops = sim_graph_n_ops(lw->g);
  uint8_t *in = g_new0(uint8_t, MAX(n_ops, 1));
  GArray *list = g_array_new(FALSE, FALSE, sizeof(int));
  for (int i = 0; i < n_changed; i++)
    if (!in[changed[i]]) {
      in[changed[i]] = 1;
      g_array_append_val(list, changed[i]);
    }
  for (int i = 0; i < n_changed; i++) {
    GArray *users = lw->sharers[changed[i]];
    for (guint u = 0; users && u < users->len; u++) {
      int y = g_array_index(users, int, u);
      if (!in[y]) {
        in[y] = 1;
        g_array_append_val(list, y);
      }
    }
  }
  /* Under sequence parallelism a consumer's saved input follows its producer's layout
   * (gathered_input_bytes()): the consumers of a changed op are laid out again too. */
  for (int i = 0; lw->s->sequence_parallel && i < n_changed; i++) {
    const SimOp *op = sim_graph_op_get(lw->g, changed[i]);
    for (int k = 0; k < op->n_outputs; k++) {
      const SimTensor *ten = sim_graph_tensor_get(lw->g, op->outputs[k]);
      for (guint c = 0; c < ten->consumers->len; c++) {
        int y = g_array_index(ten->consumers, int, c);
        if (!in[y]) {
          in[y] = 1;
          g_array_append_val(list, y);
        }
      }
    }
  }
  g_free(in);
  const int *ops = (const int *)list->data;
  int n = (int)list->len;
  /* Every changed op gets its new layout before any block is rebuilt: blocks read the
   * layouts of their neighbours. */
  for (int i = 0; i < n; i++) {
    lay_op(lw, ops[i]);
    /* The op's share of the synchronization, and those that read its layout: the owner
     * of weights it uses and the users of its own. */
    int x = ops[i];
    lower_op_sync_invalidate(lw, x);
    int owner = sim_graph_op_weight_owner(lw->g, x);
    if (owner != x)
      lower_op_sync_invalidate(lw, owner);
    for (guint u = 0; lw->sharers[x] && u < lw->sharers[x]->len; u++)
      lower_op_sync_invalidate(lw, g_array_index(lw->sharers[x], int, u));
  }
  order_backward(lw);
  int nt = sim_graph_n_tensors(lw->g);
  uint8_t *touched = g_new0(uint8_t, MAX(nt, 1));
  for (int i = 0; i < n; i++) {
    build_op_block(lw, ops[i]);
    const SimOp *op = sim_graph_op_get(lw->g, ops[i]);
    for (int k = 0; k < op->n_inputs; k++)
      touched[op->inputs[k]] = 1;
    for (int k = 0; k < op->n_outputs; k++)
      touched[op->outputs[k]] = 1;
  }
  for (int t = 0; t < nt; t++)
    if (touched[t])
      lower_build_tensor_block(lw, t);
  g_free(touched);
  g_array_free(list, TRUE);
  lower_build_sync_block(lw);
}

SimTaskGraph *sim_lowering_taskgraph(SimLowering *lw)
{
  return lw->tg;
}

gboolean sim_lowering_fold_violated(const SimLowering *lw)
{
  return lw->fold_violated;
}

double sim_lowering_model_flops(const SimLowering *lw)
{
  return lw->model_flops;
}
