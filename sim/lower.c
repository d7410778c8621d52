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
 */
#include "lower.h"
#include "taskgraph.h"
#include "collective.h"
#include "base.h"

#include <math.h>
#include <string.h>

typedef struct {
  gboolean is_input;       /* data sources have no tasks                             */
  int n_shards, n_in, n_out;
  const int *dev;          /* the strategy's device of every shard                   */
  int *cidx;               /* index among the simulated shards, or -1                 */
  int n_sim;
  SimRegion *in_reg;       /* [shard * n_in + i], in micro-batch coordinates           */
  SimRegion *out_reg;      /* [shard * n_out + j]                                     */
  gboolean *out_partial;   /* per output: shards hold partial sums                     */
  gboolean *in_partial;    /* per input: gradients computed by shards are partial      */
  double *t_f, *t_b, *t_r, *t_u;
  int64_t *a_f, *a_r;      /* bytes kept by forward, by recompute, per shard            */
  int64_t *w_elems;        /* weight elements per shard                                */
  gboolean recompute;
  gboolean has_weights;
  uint16_t k_f, k_b, k_r;      /* kernels per pass, for the host's issue time         */
  int stage;
  int block;
  uint32_t pos_b, pos_r;   /* places in the backward order                             */
} OpLay;

struct _SimLowering {
  const SimGraph *g;
  SimMachine *m;
  const SimStrategy *s;
  SimCostModel *cost;
  SimOptions o;
  SimCollParams cp;
  uint8_t *simulated;
  int n_ops, n_dev;
  /* M: the micro-batches lowered; M_size: the strategy's, which set each one's size.  They
   * differ only where the steady state of a schedule is extrapolated (sim/steady.c). */
  int M, M_size;
  OpLay *ops;
  int *tensor_block;
  int sync_block;
  /* The collectives of the gradient synchronization, a block each, in the order of the
   * last build, and a key describing each (a rebuild reuses the blocks of collectives it
   * finds unchanged). */
  GArray *coll_blocks;        /* int                                                    */
  struct OpSync *op_sync;     /* per op: its synchronization items, kept between builds */
  GHashTable *coll_keys;      /* GBytes key -> block + 1                                */
  GArray **sharers;           /* per op: the ops that use its weights, or NULL          */
  uint64_t *rank_f, *rank_b;  /* [stage * M + mb]: place of the unit on its device      */
  uint64_t rank_update;
  int *seg;
  int last_checkpoint;
  SimTaskGraph *tg;
  gboolean record;            /* record what tasks mean, for executors                  */
  gboolean fold_violated;
  double model_flops;
  SimKeyIndex regions;        /* scratch: group_holders() numbers distinct regions       */
  SimKeyIndex transfers;      /* scratch: a tensor's transfers already made (deliver())  */
  /* Scratch: the factor on the bytes of the flows and reductions being built, below 1
   * where expert parallelism moves only the routed tokens (routed_fraction()). */
  double byte_scale;
};

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

static int64_t region_bytes(const SimRegion *r, SimDType dt)
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

static void zero1_update_share(SimLowering *lw, OpLay *l, const SimRegion *wr, int reps);

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
 * with passing keys and values. */
static double attention_core_time(SimLowering *lw, int x, const SimDeviceSpec *spec,
                                  const int64_t *ext, SimPass pass, double t)
{
  SimWork wk = { 0 };
  sim_graph_op_work(lw->g, x, ext, pass, &wk);
  double all = 0, core = 0;
  for (int k = 0; k < wk.n; k++) {
    double tk = sim_cost_model_kernel_time(lw->cost, spec, &wk.k[k]);
    all += tk;
    if (wk.k[k].kind == SIM_KERNEL_ATTENTION)
      core += tk;
  }
  return all > 0 ? t * core / all : 0;
}

/* Context parallelism (sim_strategy_set_context_parallel()): a self-attention op whose
 * query positions are split n ways reads only its own positions of the keys and values,
 * and runs as a ring (Liu et al. 2023, Ring Attention; Megatron-Core's context
 * parallelism): in n steps each shard computes its queries against one block of keys and
 * values while it passes that block on to the next shard of the ring, so that the
 * attention kernels of a pass take (n - 1) max(core / n, block / bandwidth) + core / n
 * instead of core.  The block is the shard's keys and values (b s 2 kv_heads hd
 * elements); the backward passes the keys and values and their gradients, twice the
 * bytes.  The ring's bytes are priced on the bandwidth between neighbours, not put on the
 * links (no contention with other traffic); the projections of K and V are priced for
 * the whole sequence (the cost model's shard of query positions computes them all),
 * which overstates them by (n - 1) / n of their FLOPs.  Executors (recorded plans) keep
 * the whole-sequence reads, which compute the same values. */
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
  for (int sh = 0; sh < l->n_shards; sh++) {
    /* Keys and values at the shard's own positions: the region of its queries. */
    for (int i = 1; i < 3; i++)
      l->in_reg[sh * op->n_inputs + i] = l->in_reg[sh * op->n_inputs];
    int idx = sh / reps;
    sim_config_shard_coords(c, nd, idx, coords);
    sim_config_shard_range(op, c, coords, lw->M_size, lo, hi);
    for (int d = 0; d < nd; d++)
      ext[d] = hi[d] - lo[d];
    int next = (idx + ((coords[sd] + 1) % n - coords[sd]) * stride) * reps + sh % reps;
    double bw = sim_machine_bandwidth(lw->m, l->dev[sh], l->dev[next]);
    double block = (double)ext[0] * ext[sd] * 2.0 * ext[hd] * ext[ed] *
                   sim_dtype_size(op->in_dtype[0]);
    double step = isfinite(bw) && bw > 0 ? block / bw : 0;
    const SimDeviceSpec *spec = sim_machine_device_spec(lw->m, l->dev[sh]);
    double old_f = l->t_f[sh];
    double core = attention_core_time(lw, x, spec, ext, SIM_PASS_FORWARD, l->t_f[sh]);
    l->t_f[sh] += (n - 1) * MAX(core / n, step) + core / n - core;
    core = attention_core_time(lw, x, spec, ext, SIM_PASS_BACKWARD, l->t_b[sh]);
    l->t_b[sh] += (n - 1) * MAX(core / n, 2 * step) + core / n - core;
    if (l->t_r[sh] == old_f)
      l->t_r[sh] = l->t_f[sh];
  }
}

static void lay_op(SimLowering *lw, int x)
{
  OpLay *l = &lw->ops[x];
  lay_free(l);
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
      in_bytes += region_bytes(r, op->in_dtype[i]);
    }
    for (int j = 0; j < op->n_outputs; j++) {
      const SimTensorMap *map = sim_space_output_map(op, j);
      SimShape shp = mb_shape(map, &op->out_shape[j], M);
      SimRegion *r = &l->out_reg[sh * op->n_outputs + j];
      sim_map_project(map, &shp, lo, hi, r);
      out_bytes += region_bytes(r, op->out_dtype[j]);
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
    l->t_r[sh] = tr;
    l->t_u[sh] = tu;
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
  if (wr) {
    zero1_update_share(lw, l, wr, reps);
    g_free(wr);
  }
  if (lw->s->cp > 1 && !lw->record && op->type == SIM_OP_ATTENTION)
    ring_attention(lw, l, x, op, c, reps);
}

/* ---- task references ---------------------------------------------------------------- */

enum { P_F, P_B, P_R };

static inline SimTaskRef ref_compute(const SimLowering *lw, const OpLay *l, int pass, int mb,
                                     int sh)
{
  int base = pass == P_F ? 0 : pass == P_B ? 1 : 2;
  return (SimTaskRef){ l->block, (base * lw->M + mb) * l->n_sim + l->cidx[sh] };
}

static inline SimTaskRef ref_update(const SimLowering *lw, const OpLay *l, int sh)
{
  int base = l->recompute ? 3 : 2;
  return (SimTaskRef){ l->block, base * lw->M * l->n_sim + l->cidx[sh] };
}

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
  const uint64_t *rf = lw->rank_f + (size_t)l->stage * M;
  const uint64_t *rb = lw->rank_b + (size_t)l->stage * M;
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
        uint64_t key;
        if (p == P_F) {
          t = sim_task_compute(SIM_CLASS_FORWARD, dev, x, sh, mb, l->t_f[sh]);
          t.mem_alloc = l->a_f[sh];
          t.n_kernels = l->k_f;
          key = rf[mb] << 32 | (uint32_t)x;
        } else if (p == P_B) {
          t = sim_task_compute(SIM_CLASS_BACKWARD, dev, x, sh, mb, l->t_b[sh]);
          t.mem_free = l->a_f[sh] + l->a_r[sh];
          t.n_kernels = l->k_b;
          key = rb[mb] << 32 | l->pos_b;
        } else {
          t = sim_task_compute(SIM_CLASS_RECOMPUTE, dev, x, sh, mb, l->t_r[sh]);
          t.mem_alloc = l->a_r[sh];
          t.n_kernels = l->k_r;
          key = rb[mb] << 32 | l->pos_r;
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
      sim_taskgraph_stream_add(tg, b, l->dev[sh], lw->rank_update << 32 | (uint32_t)x,
                               r.index);
    }
  /* A backward pass needs its own forward pass's (or recomputation's) activations even
   * where no gradient flows into it (the loss). */
  for (int mb = 0; mb < M; mb++)
    for (int sh = 0; sh < l->n_shards; sh++) {
      if (l->cidx[sh] < 0)
        continue;
      sim_taskgraph_depend(tg, b, ref_compute(lw, l, P_F, mb, sh), ref_compute(lw, l, P_B, mb, sh));
      if (l->recompute)
        sim_taskgraph_depend(tg, b, ref_compute(lw, l, P_R, mb, sh),
                             ref_compute(lw, l, P_B, mb, sh));
    }
}

/* ---- tensors: reductions and transfers ------------------------------------------------ */

/* A set of shards that hold the same region of a tensor. */
typedef struct {
  SimRegion region;
  int *members;    /* shard indices */
  int n;
  int *devs;       /* their distinct devices, in shard order */
  int n_devs;
  gboolean any_sim;
} Holders;

/* What group_holders() compares: a region and a tag. */
typedef struct {
  SimRegion r;
  int tag;
} RegionKey;

/* Groups the shards of @l by their region (@regs[sh * stride + offset]) and, where @tags
 * is not NULL, by their tag as well. */
static GArray *group_holders(SimKeyIndex *seen, const OpLay *l, const SimRegion *regs,
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
    gboolean added;
    gid[sh] = (int)sim_key_index_get(seen, &key, &added);
    if (added) {
      Holders h = { .region = key.r };
      g_array_append_val(groups, h);
    }
    count[gid[sh]]++;
  }
  /* Every group's members, then every group's devices, in one allocation that the first
   * group's members start (holders_free()). */
  int *pool = g_new(int, 2 * (size_t)MAX(ns, 1));
  for (guint k = 0, off = 0; k < groups->len; k++) {
    Holders *h = &g_array_index(groups, Holders, k);
    h->members = pool + off;
    h->devs = pool + ns + off;
    off += (guint)count[k];
  }
  for (int sh = 0; sh < ns; sh++) {
    Holders *h = &g_array_index(groups, Holders, gid[sh]);
    h->members[h->n++] = sh;
    gboolean dup = FALSE;
    for (int k = 0; k < h->n_devs; k++)
      dup |= h->devs[k] == l->dev[sh];
    if (!dup)
      h->devs[h->n_devs++] = l->dev[sh];
    if (l->cidx[sh] >= 0)
      h->any_sim = TRUE;
  }
  g_free(count);
  if (!groups->len)
    g_free(pool);
  return groups;
}

static void holders_free(GArray *groups)
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
static void zero1_update_share(SimLowering *lw, OpLay *l, const SimRegion *wr, int reps)
{
  int *tag = g_new(int, l->n_shards);
  for (int sh = 0; sh < l->n_shards; sh++)
    tag[sh] = sh % reps;
  GArray *groups = group_holders(&lw->regions, l, wr, 1, 0, tag);
  for (guint k = 0; k < groups->len; k++) {
    const Holders *h = &g_array_index(groups, Holders, k);
    if (h->n_devs > 1)
      for (int i = 0; i < h->n; i++)
        l->t_u[h->members[i]] /= h->n_devs;
  }
  holders_free(groups);
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

static void reduce_groups(SimLowering *lw, int block, const OpLay *l, GArray *groups,
                          gboolean partial, int pass, int mb, SimDType dt, int tensor,
                          Ready *ready)
{
  for (guint k = 0; k < groups->len; k++) {
    Holders *h = &g_array_index(groups, Holders, k);
    ready[k].reduced = FALSE;
    if (!partial || h->n <= 1 || !h->any_sim)
      continue;
    ready[k].reduced = TRUE;
    if (block < 0)
      continue; /* only asked which groups reduce */
    SimTaskRef start;
    if (h->n_devs > 1) {
      SimCollective coll = { .kind = SIM_COLL_ALLREDUCE, .algo = SIM_ALLREDUCE_RING,
                             .detail = lw->o.detail, .params = &lw->cp, .cls = SIM_CLASS_REDUCTION,
                             .devices = h->devs, .n = h->n_devs,
                             .bytes = (double)region_bytes(&h->region, dt) * lw->byte_scale,
                             .op = -1, .mb = mb };
      sim_collective_lower_bare(lw->tg, block, lw->m, &coll, &start, &ready[k].end);
    } else {
      /* Partial sums on one device add up where they are. */
      SimTask nop = sim_task_nop();
      start = ready[k].end = sim_taskgraph_add(lw->tg, block, &nop);
    }
    record_group(lw, block, SIM_SEM_REDUCE, ready[k].end, tensor, pass == P_B, &h->region,
                 h->devs, h->n_devs);
    for (int i = 0; i < h->n; i++)
      if (l->cidx[h->members[i]] >= 0)
        sim_taskgraph_depend(lw->tg, block, ref_compute(lw, l, pass, mb, h->members[i]), start);
  }
}

static SimTaskRef ready_ref(SimLowering *lw, const OpLay *l, const Ready *r, int pass, int mb,
                            int sh)
{
  return r->reduced ? r->end : ref_compute(lw, l, pass, mb, sh);
}

/* Sends what the shards of @dst_op need (@need[sh]) from @groups of @src_op, for one
 * micro-batch: a dependency where a holder is on the same device, a flow otherwise.
 * @src_pass produced the data, @dst_pass consumes it. */
/* The key of a transfer: source, destination and region.  Consumers on one device that
 * need the same data from another share one transfer (the activation crosses a stage
 * boundary once); in the backward pass the gradients they produce on one device add up
 * there and cross once. */
typedef struct {
  int src, dst, ndim;
  int64_t lo[SIM_MAX_DIMS], hi[SIM_MAX_DIMS];
} TransferKey;

/* A transfer made for one micro-batch and pass of a tensor: which of them (see
 * build_tensor_block()) and the transfer. */
typedef struct {
  int which;
  int scaled;      /* built under a byte scale: not shared with unscaled transfers */
  TransferKey tk;
} SentKey;

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

/* @may_sg: scatter-gather is allowed for this direction (see build_tensor_block()). */
static GArray *plan_pieces(SimLowering *lw, const OpLay *src, GArray *groups, const Ready *ready,
                           const OpLay *dst, const SimRegion *need, gboolean may_sg)
{
  /* Scatter-gather needs every consumer shard of a group, folded away or not. */
  gboolean sg = may_sg && lw->s->scatter_gather && src->stage != dst->stage;
  /* Most consumer shards take one piece. */
  GArray *out = g_array_sized_new(FALSE, FALSE, sizeof(Piece), (guint)MAX(dst->n_shards, 1));
  GroupIndex ix;
  group_index_init(&ix, groups);
  GArray *cand = g_array_new(FALSE, FALSE, sizeof(int));
  for (int c = 0; c < dst->n_shards; c++) {
    if (dst->cidx[c] < 0 && !sg)
      continue;
    int dev = dst->dev[c];
    guint n_cand = group_candidates(&ix, groups, &need[c], cand);
    for (guint j = 0; j < n_cand; j++) {
      guint k = (guint)g_array_index(cand, int, j);
      Holders *h = &g_array_index(groups, Holders, k);
      if (!boxes_overlap(&need[c], &h->region))
        continue;
      Piece p = { .c = c, .k = (int)k, .holder = -1, .sim = dst->cidx[c] >= 0 };
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
  if (sg)
    out = scatter_gather(groups, out);
  /* Data from a device that is folded away breaks the folding.  (The pieces of groups come
   * after all others, so dropping others moves each group by the number dropped.) */
  guint kept = 0;
  for (guint i = 0; i < out->len; i++) {
    Piece p = g_array_index(out, Piece, i);
    if (p.sim && !ready[p.k].reduced && src->cidx[p.holder] < 0) {
      lw->fold_violated = TRUE;
      if (!p.sg_n)
        continue;
    }
    if (p.sg_n)
      p.sg_base -= (int)(i - kept);
    g_array_index(out, Piece, kept++) = p;
  }
  g_array_set_size(out, kept);
  return out;
}

/* A flow of @region from device @sdev to @dev after @from, before @to: made once per
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
    sim_taskgraph_depend(lw->tg, block, fr, to);
    return fr;
  }
  SimTask f = sim_task_flow(SIM_CLASS_TRANSFER, sdev, dev,
                            (double)region_bytes(region, dt) * lw->byte_scale, tensor_op, mb);
  SimTaskRef fr = sim_taskgraph_add(lw->tg, block, &f);
  lw->transfers.value[k] = fr.index;
  if (lw->record) {
    SimTaskSem m = { .index = fr.index, .kind = SIM_SEM_COPY, .grad = grad, .relay = relay,
                     .tensor = tensor, .region = *region };
    sim_taskgraph_sem_add(lw->tg, block, &m);
  }
  sim_taskgraph_depend(lw->tg, block, from, fr);
  sim_taskgraph_depend(lw->tg, block, fr, to);
  return fr;
}

/* Sends the pieces for one micro-batch: a dependency where the holder is on the consumer's
 * device, a flow otherwise.  @src_pass produced the data, @dst_pass consumes it.  A
 * scatter-gathered piece sends its part from its holder, then every consumer of the group
 * passes its part on to the others (a consumer folded away passes its part on when the
 * representative has its own: their timelines are the same). */
static void deliver(SimLowering *lw, int block, const OpLay *src, const Ready *ready, int src_pass,
                    const OpLay *dst, const GArray *pieces, int dst_pass, int mb, SimDType dt,
                    int tensor_op, int tensor, int which)
{
  gboolean grad = dst_pass == P_B;
  SimTaskRef *got = NULL;
  for (guint i = 0; i < pieces->len; i++) {
    const Piece *p = &g_array_index(pieces, Piece, i);
    if (!p->sim)
      continue;
    SimTaskRef to = ref_compute(lw, dst, dst_pass, mb, p->c);
    SimTaskRef from = ready_ref(lw, src, &ready[p->k], src_pass, mb, p->holder);
    if (p->local) {
      sim_taskgraph_depend(lw->tg, block, from, to);
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
}

/* Expert parallelism as an all-to-all.  A mixture-of-experts op whose experts are split
 * ep ways (and not their width) reads, in the plan's regions, every token of its sample
 * range on each of the ep shards and sums their partial outputs; what Megatron-Core and
 * DeepSpeed move is only each token's rows for its k experts (dispatch) and their
 * results (combine), an all-to-all.  Of the tokens a device sends to another, only those
 * routed there travel: k of the E experts, E / ep of them on that device, so the fraction
 * k / ep of them (capped at 1), times the load of the busiest shard (the imbalance, or
 * the capacity factor when there is one).  The transfers into the op (the tokens forward,
 * the output's gradient backward) carry that fraction of their bytes; the reductions of
 * its partial outputs (forward) and of its input's partial gradients (backward), ring
 * all-reduces of 2 (ep - 1) / ep of the region each, carry half of it, which makes
 * (ep - 1) / ep of the region times the fraction: the all-to-all's bytes (with every
 * token on every device, a reduce-scatter's).  FALSE for any other op or layout. */
static gboolean routed_fraction(const SimLowering *lw, int op, double *fraction)
{
  const SimOp *o = sim_graph_op_get(lw->g, op);
  if (o->type != SIM_OP_MOE)
    return FALSE;
  const int *deg = sim_strategy_op_degrees(lw->s, op);
  int ep = deg[2];
  if (ep <= 1 || deg[3] > 1)
    return FALSE;
  double k = (double)sim_op_attr_int(o, "top_k");
  double c = sim_op_attr_float(o, "capacity_factor");
  double load = c > 0 ? c : sim_op_attr_float(o, "imbalance");
  *fraction = MIN(1.0, k * load / ep);
  return TRUE;
}

static void build_tensor_block(SimLowering *lw, int t)
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
  GArray *pgroups = group_holders(&lw->regions, pl, pl->out_reg, pl->n_out, j, NULL);
  int ng = (int)pgroups->len;
  gboolean ppartial = pl->out_partial[j];
  if (ten->consumers->len == 0) {
    /* An output nothing reads (the loss) still combines its partial values (a loss over
     * split classes needs the global maximum and sum), and the backward pass starts from
     * the combined result. */
    if (ppartial) {
      Ready *r = g_new(Ready, ng);
      for (int mb = 0; mb < M; mb++) {
        reduce_groups(lw, block, pl, pgroups, TRUE, P_F, mb, dt, t, r);
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
    holders_free(pgroups);
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
  lw->byte_scale = p_experts ? p_routed / 2 : 1.0;
  for (int mb = 0; mb < M; mb++) {
    reduce_groups(lw, block, pl, pgroups, ppartial, P_F, mb, dt, t, pready_f + (size_t)mb * ng);
    if (pready_r)
      reduce_groups(lw, block, pl, pgroups, ppartial, P_R, mb, dt, t,
                    pready_r + (size_t)mb * ng);
  }
  lw->byte_scale = 1.0;
  SimRegion *pneed = g_new(SimRegion, pl->n_shards);
  for (int p = 0; p < pl->n_shards; p++)
    pneed[p] = pl->out_reg[p * pl->n_out + j];
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
    SimRegion *need = g_new(SimRegion, cl->n_shards);
    gboolean cpartial = FALSE;
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
        cpartial |= cl->in_partial[i];
      }
    }
    gboolean recomputed = pl->recompute && cl->recompute && pl->stage == cl->stage;
    GArray *cgroups = group_holders(&lw->regions, cl, need, 1, 0, NULL);
    int ncg = (int)cgroups->len;
    Ready *cready = g_new(Ready, ncg);
    /* Whether a group is reduced is the same in every micro-batch: the first one's
     * readiness tells the pieces where the data comes from. */
    reduce_groups(lw, -1, cl, cgroups, cpartial, P_B, -1, dt, t, cready);
    GArray *fwd = plan_pieces(lw, pl, pgroups, pready_f, cl, need, TRUE);
    GArray *bwd = plan_pieces(lw, cl, cgroups, cready, pl, pneed, bwd_sg);
    /* An expert-parallel consumer receives only its routed tokens and sends back their
     * gradients (the tokens, input 0; not the router's logits); an expert-parallel
     * producer receives only its tokens' output gradients (routed_fraction()). */
    double c_routed = 1.0;
    gboolean c_experts = cop->inputs[0] == t && routed_fraction(lw, cx, &c_routed);
    for (int mb = 0; mb < M; mb++) {
      lw->byte_scale = c_routed;
      deliver(lw, block, pl, pready_f + (size_t)mb * ng, P_F, cl, fwd, P_F, mb, dt, px, t,
              mb * 3);
      if (recomputed)
        deliver(lw, block, pl, pready_r + (size_t)mb * ng, P_R, cl, fwd, P_R, mb, dt, px, t,
                mb * 3 + 1);
      /* Backward: the consumer's gradient of its input, reduced where partial, goes to
       * the producer shards whose output region it overlaps. */
      lw->byte_scale = c_experts ? c_routed / 2 : 1.0;
      reduce_groups(lw, block, cl, cgroups, cpartial, P_B, mb, dt, t, cready);
      lw->byte_scale = p_routed;
      deliver(lw, block, cl, cready, P_B, pl, bwd, P_B, mb, dt, cx, t, mb * 3 + 2);
      lw->byte_scale = 1.0;
    }
    g_array_free(fwd, TRUE);
    g_array_free(bwd, TRUE);
    holders_free(cgroups);
    g_free(cready);
    g_free(need);
  }
  g_free(pneed);
  holders_free(pgroups);
  g_free(pready_f);
  g_free(pready_r);
}

/* ---- gradient synchronization ---------------------------------------------------------- */

typedef struct {
  int op;
  int *shards;
  int n;
  int *devs;
  int n_devs;
  int64_t bytes;     /* gradient bytes per device */
} SyncItem;

/* What one op adds to the synchronization (its items, its exchanges with the owner of
 * weights it shares, its weights' memory per device); it depends on the op's layout, its
 * owner's and its users', so a delta rebuild recomputes it for those only. */
struct OpSync {
  gboolean valid;
  GArray *items;       /* SyncItem */
  GArray *ties;        /* SyncItem */
  GArray *mem;         /* MemAdd   */
};

typedef struct {
  int32_t dev;
  int64_t bytes;
} MemAdd;

static void sync_items_clear(GArray *a)
{
  for (guint k = 0; k < a->len; k++) {
    SyncItem *it = &g_array_index(a, SyncItem, k);
    g_free(it->shards);
    g_free(it->devs);
  }
  g_array_set_size(a, 0);
}

static void op_sync_invalidate(SimLowering *lw, int x)
{
  struct OpSync *os = &lw->op_sync[x];
  os->valid = FALSE;
  if (os->items) {
    sync_items_clear(os->items);
    sync_items_clear(os->ties);
    g_array_set_size(os->mem, 0);
  }
}

static gboolean same_devs(const SyncItem *a, const SyncItem *b)
{
  if (a->n_devs != b->n_devs)
    return FALSE;
  return memcmp(a->devs, b->devs, (size_t)a->n_devs * sizeof(int)) == 0;
}

typedef struct {
  int group;   /* the rank of the item's device set, by first appearance */
  int index;
} ItemOrder;

static int item_order_cmp(const void *a, const void *b)
{
  const ItemOrder *x = a, *y = b;
  if (x->group != y->group)
    return x->group < y->group ? -1 : 1;
  return x->index - y->index;
}

/* Orders @items by device set, each set's items in their own order: every process
 * buckets its own gradients (PyTorch DDP, Megatron), so a bucket is a run of one device
 * set's items, whatever the items of other device sets between them. */
static void group_items_by_devices(GArray *items)
{
  guint n = items->len;
  if (n < 2)
    return;
  GHashTable *rank = g_hash_table_new_full(sim_bytes_hash, g_bytes_equal,
                                           (GDestroyNotify)g_bytes_unref, NULL);
  ItemOrder *ord = g_new(ItemOrder, n);
  gboolean sorted = TRUE;
  for (guint i = 0; i < n; i++) {
    const SyncItem *it = &g_array_index(items, SyncItem, i);
    size_t len = sizeof(int) * (size_t)it->n_devs;
    gpointer v;
    if (!sim_bytes_lookup(rank, it->devs, len, &v)) {
      v = GINT_TO_POINTER(g_hash_table_size(rank));
      g_hash_table_insert(rank, g_bytes_new(it->devs, len), v);
    }
    ord[i] = (ItemOrder){ GPOINTER_TO_INT(v), (int)i };
    sorted = sorted && (i == 0 || ord[i].group >= ord[i - 1].group);
  }
  if (!sorted) {
    qsort(ord, n, sizeof *ord, item_order_cmp);
    SyncItem *copy = g_memdup2(items->data, sizeof(SyncItem) * n);
    for (guint i = 0; i < n; i++)
      g_array_index(items, SyncItem, i) = copy[ord[i].index];
    g_free(copy);
  }
  g_free(ord);
  g_hash_table_destroy(rank);
}

/* Bytes of weights, gradients and optimizer states per parameter (Rajbhandari et al.,
 * ZeRO, 2020: 2 + 2 + 12 for mixed-precision Adam), and how much of it shards. */
static void param_bytes(const SimMemoryOptions *mo, SimDType wdt, double *fixed,
                        double *shardable)
{
  int w = sim_dtype_size(wdt);
  gboolean mixed = SIM_PRECISION_IS_MIXED(mo->precision);
  double states = mo->optimizer == SIM_OPTIMIZER_ADAM ? 8 : 4; /* moments or momentum */
  if (mixed)
    states += 4; /* fp32 master weights */
  *fixed = 2.0 * w;   /* weights and their gradients */
  *shardable = states;
  if (mo->zero1 && mo->zero2) {
    /* ZeRO-2: each replica keeps the gradients of the part it updates. */
    *fixed = w;
    *shardable = states + w;
  }
  if (mo->zero1 && mo->zero3) {
    /* ZeRO-3: and only its part of the weights (the gathered buckets are counted in
     * build_sync_block()). */
    *fixed = 0;
    *shardable = states + 2.0 * w;
  }
}

/* One collective of the gradient synchronization, in a block of its own.  Its tasks
 * depend on nothing but the key (what, over which devices, how many bytes, for which
 * op), so when the synchronization is rebuilt for a delta simulation, a collective whose
 * key the previous build had keeps that build's block untouched.  @prev holds the
 * previous build's keys; the reused ones are taken out of it. */
static void sync_collective(SimLowering *lw, GHashTable *prev, GHashTable *keys, SimCollKind kind,
                            SimTaskClass cls, const int *devs, int n, double bytes, int op,
                            SimTaskRef *start, SimTaskRef *end)
{
  SimTaskGraph *tg = lw->tg;
  size_t len = 4 * sizeof(int32_t) + sizeof(double) + (size_t)n * sizeof(int32_t);
  uint8_t *k = g_malloc(len);
  int32_t head[4] = { kind, cls, op, n };
  memcpy(k, head, sizeof head);
  memcpy(k + sizeof head, &bytes, sizeof bytes);
  for (int i = 0; i < n; i++) {
    int32_t d = devs[i];
    memcpy(k + sizeof head + sizeof bytes + (size_t)i * sizeof d, &d, sizeof d);
  }
  GBytes *key = g_bytes_new_take(k, len);
  int block = -1;
  gpointer old_key, val;
  if (prev && g_hash_table_steal_extended(prev, key, &old_key, &val)) {
    block = GPOINTER_TO_INT(val) - 1;
    g_bytes_unref(old_key);
    *start = (SimTaskRef){ block, 0 };
    *end = (SimTaskRef){ block, 1 };
  } else {
    block = sim_taskgraph_block_new(tg);
    SimCollective coll = { .kind = kind, .algo = lw->s->sync.algorithm, .detail = lw->o.detail,
                           .params = &lw->cp, .cls = cls, .devices = devs, .n = n, .bytes = bytes,
                           .op = op, .mb = -1 };
    sim_collective_lower(tg, block, lw->m, &coll, start, end);
    g_assert(start->index == 0 && end->index == 1);
  }
  g_array_append_val(lw->coll_blocks, block);
  if (!g_hash_table_contains(keys, key))
    g_hash_table_insert(keys, key, GINT_TO_POINTER(block + 1));
  else
    g_bytes_unref(key); /* a twin in this build: its block is not offered for reuse */
}

/* Frees the previous build's collective blocks that were not reused and lays the blocks
 * out for assembly: every other block in slot order, then the collectives in the order
 * this build made them, which a fresh lowering would give too. */
static void sync_collectives_done(SimLowering *lw, GArray *old_blocks)
{
  SimTaskGraph *tg = lw->tg;
  guint nb = tg->blocks->len;
  uint8_t *mark = g_new0(uint8_t, MAX(nb, 1));
  for (guint i = 0; i < lw->coll_blocks->len; i++)
    mark[g_array_index(lw->coll_blocks, int, i)] = 1;
  for (guint i = 0; i < old_blocks->len; i++) {
    int b = g_array_index(old_blocks, int, i);
    if (!mark[b])
      sim_taskgraph_block_free(tg, b);
  }
  if (!tg->order)
    tg->order = g_array_new(FALSE, FALSE, sizeof(int));
  g_array_set_size(tg->order, 0);
  for (guint i = 0; i < nb; i++)
    if (!mark[i] && sim_taskgraph_block(tg, (int)i)->live)
      g_array_append_val(tg->order, i);
  g_array_append_vals(tg->order, lw->coll_blocks->data, lw->coll_blocks->len);
  g_free(mark);
}

/* Computes op @x's share of the synchronization into @os (see struct OpSync). */
static void op_sync_build(SimLowering *lw, int x, uint8_t *owner_dev, struct OpSync *os)
{
  const SimStrategy *s = lw->s;
  const OpLay *l = &lw->ops[x];
  if (l->is_input || !l->has_weights)
    return;
  const SimOp *op = sim_graph_op_get(lw->g, x);
  double fixed, shardable;
  param_bytes(&s->memory, op->w_dtype, &fixed, &shardable);
  int64_t wbytes = (int64_t)sim_dtype_size(op->w_dtype);
  /* A table with sparse gradients keeps its weights alone: its gradient holds the looked
   * up rows only, and recommenders step such tables with plain SGD in the table's own
   * precision (no master copy, no moments).  Replicas exchange those rows, not the
   * table (the gradient's rows, as dense as the lookups make them). */
  int64_t full[SIM_MAX_ITER], sparse_width = 0;
  int64_t sparse_rows = sim_embedding_sparse_rows(op, sim_op_extent(op, NULL, full),
                                                  &sparse_width);
  if (sparse_rows >= 0) {
    fixed = (double)wbytes;
    shardable = 0;
  }
  gboolean sharer = op->weight_owner != x;
  const OpLay *ol = sharer ? &lw->ops[op->weight_owner] : NULL;
  /* Which shards hold weights of their own: all of an owner's; of a user of another
   * op's weights, those on devices where the owner has no shard (the gradients of the
   * others add up in the owner's buffer).  Those copies keep their weights, synchronize
   * among their data-parallel peers, and then exchange gradients with the owner's copy,
   * as Megatron's first and last pipeline stages do for the tied embedding. */
  uint8_t *own = g_new(uint8_t, l->n_shards);
  if (sharer) {
    memset(owner_dev, 0, (size_t)lw->n_dev);
    for (int sh = 0; sh < ol->n_shards; sh++)
      owner_dev[ol->dev[sh]] = 1;
  }
  int n_own = 0;
  for (int sh = 0; sh < l->n_shards; sh++)
    n_own += own[sh] = !sharer || !owner_dev[l->dev[sh]];
  if (n_own == 0) {
    g_free(own);
    return;
  }
  /* Shards that hold the same region of the first weight share its gradient. */
  SimRegion *wr = g_new(SimRegion, l->n_shards);
  const SimOpConfig *c = &s->ops[x];
  int reps = c->replicas > 1 ? c->replicas : 1;
  int coords[SIM_MAX_ITER];
  int64_t lo[SIM_MAX_ITER], hi[SIM_MAX_ITER];
  /* Copies of a replicated shard compute the same gradient: each copy synchronizes
   * with its own data-parallel peers only, as every tensor-parallel rank of Megatron
   * all-reduces its own layer-norm gradients.  Shards without weights of their own get
   * a tag of their own and stay out of every group. */
  int *tag = g_new(int, l->n_shards);
  for (int sh = 0; sh < l->n_shards; sh++) {
    sim_config_shard_coords(c, op->space.ndims, sh / reps, coords);
    sim_config_shard_range(op, c, coords, lw->M_size, lo, hi);
    sim_map_project(sim_space_weight_map(op, 0), &op->w_shape[0], lo, hi, &wr[sh]);
    tag[sh] = own[sh] ? sh % reps : reps + sh;
  }
  GArray *groups = group_holders(&lw->regions, l, wr, 1, 0, tag);
  g_free(tag);
  /* The weights of users on the owner's devices beyond the shared ones (a tied
   * decoder's own bias) travel with the owner's gradients. */
  int64_t extra = 0;
  GArray *users = lw->sharers[x];
  for (guint u = 0; !sharer && users && u < users->len; u++) {
    const OpLay *ul = &lw->ops[g_array_index(users, int, u)];
    if (ul->n_shards && l->n_shards)
      extra += MAX(0, ul->w_elems[0] - l->w_elems[0]);
  }
  for (guint k = 0; k < groups->len; k++) {
    Holders *h = &g_array_index(groups, Holders, k);
    if (!own[h->members[0]])
      continue;
    int nrep = h->n_devs;
    for (int i = 0; i < h->n; i++) {
      int sh = h->members[i];
      double per = fixed + (s->memory.zero1 && nrep > 1 ? shardable / nrep : shardable);
      MemAdd ma = { l->dev[sh], (int64_t)(per * (double)l->w_elems[sh]) };
      g_array_append_val(os->mem, ma);
    }
    if (nrep <= 1 || !h->any_sim)
      continue;
    SyncItem it = { .op = x, .n = h->n, .n_devs = h->n_devs };
    it.shards = g_memdup2(h->members, sizeof(int) * (size_t)h->n);
    it.devs = g_memdup2(h->devs, sizeof(int) * (size_t)h->n_devs);
    it.bytes = (l->w_elems[h->members[0]] + extra) * wbytes;
    if (sparse_rows >= 0)
      it.bytes = MIN(it.bytes, sparse_rows * sparse_width * wbytes);
    g_array_append_val(os->items, it);
  }
  if (sharer)
    for (int sh = 0; sh < l->n_shards; sh++) {
      int osh = sh % ol->n_shards;
      if (!own[sh] || (l->cidx[sh] < 0 && ol->cidx[osh] < 0))
        continue;
      SyncItem it = { .op = x, .n = 1, .n_devs = 2 };
      it.shards = g_memdup2(&sh, sizeof(int));
      int devs[2] = { ol->dev[osh], l->dev[sh] };
      it.devs = g_memdup2(devs, sizeof devs);
      it.bytes = ol->w_elems[osh] * wbytes;
      g_array_append_val(os->ties, it);
    }
  holders_free(groups);
  g_free(wr);
  g_free(own);
}

/* Whether the simulation was cancelled (SimOptions.cancel): the lowering then stops where
 * it is, and its caller fails with SIM_ERROR_CANCELLED without running it. */
static gboolean lowering_cancelled(const SimLowering *lw, int i)
{
  return (i & 15) == 0 && lw->o.cancel && atomic_load(lw->o.cancel);
}

/* A bucket of the gradient synchronization: items [i, j) of the list, their bytes per
 * device, their pipeline stage (the first item's). */
typedef struct {
  guint i, j;
  int64_t bytes;
  int stage;
} Bucket;

/* Makes @start wait for the end of the last collective on @it's devices and records
 * @end as the last one (appended to @ends; @last maps the device list to its index). */
static void chain_append(SimTaskGraph *tg, int block, GHashTable *last, GArray *ends,
                         const SyncItem *it, SimTaskRef start, SimTaskRef end)
{
  gpointer v;
  if (sim_bytes_lookup(last, it->devs, sizeof(int) * (size_t)it->n_devs, &v))
    sim_taskgraph_depend(tg, block, g_array_index(ends, SimTaskRef, GPOINTER_TO_INT(v) - 1),
                         start);
  g_array_append_val(ends, end);
  g_hash_table_replace(last, g_bytes_new(it->devs, sizeof(int) * (size_t)it->n_devs),
                       GINT_TO_POINTER((int)ends->len));
}

/* ZeRO-3's working memory on every device: the weights of its largest bucket three times
 * over, gathered for the compute that uses them, gathered ahead for the next bucket,
 * and as the whole gradient before its reduce-scatter. */
static void zero3_gathered_memory(SimLowering *lw, GArray *items, GArray *buckets)
{
  int64_t *most = g_new0(int64_t, MAX(lw->n_dev, 1));
  for (guint b = 0; b < buckets->len; b++) {
    const Bucket *bk = &g_array_index(buckets, Bucket, b);
    const SyncItem *it = &g_array_index(items, SyncItem, bk->i);
    for (int d = 0; d < it->n_devs; d++)
      most[it->devs[d]] = MAX(most[it->devs[d]], bk->bytes);
  }
  for (int d = 0; d < lw->n_dev; d++)
    lw->tg->static_mem[d] += 3 * most[d];
  g_free(most);
}

/* Makes the compute of @pass (forward; backward and its recomputation) of micro-batch
 * @mb of bucket @bk's ops, and of the ops that use their weights on the same devices,
 * wait for @end; with @before, makes @before's start wait for that compute instead. */
static void bucket_compute_deps(SimLowering *lw, int block, GArray *items, const Bucket *bk,
                                int pass, int mb, SimTaskRef end, const SimTaskRef *before)
{
  SimTaskGraph *tg = lw->tg;
  for (guint k = bk->i; k < bk->j; k++) {
    const SyncItem *it = &g_array_index(items, SyncItem, k);
    GArray *users = lw->sharers[it->op];
    for (guint u = 0; u <= (users ? users->len : 0); u++) {
      int x = u == 0 ? it->op : g_array_index(users, int, u - 1);
      const OpLay *l = &lw->ops[x];
      for (int sh = 0; sh < l->n_shards; sh++) {
        if (l->cidx[sh] < 0)
          continue;
        gboolean here = FALSE;
        for (int d = 0; d < it->n_devs && !here; d++)
          here = it->devs[d] == l->dev[sh];
        if (!here)
          continue;
        if (pass == P_F) {
          if (before)
            sim_taskgraph_depend(tg, block, ref_compute(lw, l, P_F, mb, sh), *before);
          else
            sim_taskgraph_depend(tg, block, end, ref_compute(lw, l, P_F, mb, sh));
          continue;
        }
        int first = l->recompute ? P_R : P_B;
        if (before)
          sim_taskgraph_depend(tg, block, ref_compute(lw, l, P_B, mb, sh), *before);
        else
          sim_taskgraph_depend(tg, block, end, ref_compute(lw, l, first, mb, sh));
        if (!before && first != P_B)
          sim_taskgraph_depend(tg, block, end, ref_compute(lw, l, P_B, mb, sh));
      }
    }
  }
}

/* Whether an op of @bk recomputes: its recomputation runs ahead of the backward of the
 * buckets before it, so its gather cannot wait for that backward. */
static gboolean bucket_recomputes(const SimLowering *lw, GArray *items, const Bucket *bk)
{
  for (guint k = bk->i; k < bk->j; k++) {
    int op = g_array_index(items, SyncItem, k).op;
    if (lw->ops[op].recompute)
      return TRUE;
    GArray *users = lw->sharers[op];
    for (guint u = 0; users && u < users->len; u++)
      if (lw->ops[g_array_index(users, int, u)].recompute)
        return TRUE;
  }
  return FALSE;
}

typedef struct {
  uint64_t rank;   /* the unit's place on its devices (rank_f, rank_b)               */
  int pos;         /* the bucket's place in the unit: the order of the compute        */
  int bucket, prev2, pass, mb;
} Gather;

static int gather_cmp(const void *a, const void *b)
{
  const Gather *x = a, *y = b;
  if (x->rank != y->rank)
    return x->rank < y->rank ? -1 : 1;
  return x->pos - y->pos;
}

/* ZeRO-3's parameter all-gathers: every bucket before every micro-batch's forward and
 * again before its backward.  A device set's gathers run one after the other in the order
 * of the compute that needs them (its units in schedule order, each unit's buckets in
 * the order of its pass), and each starts once the compute two buckets before it in its
 * unit is done: the compute of the bucket before it runs while it gathers, as FSDP
 * prefetches one bucket ahead. */
static void zero3_gathers(SimLowering *lw, GArray *items, GArray *buckets, GHashTable *prev)
{
  SimTaskGraph *tg = lw->tg;
  int block = lw->sync_block, M = lw->M;
  guint nb = buckets->len;
  /* Runs of buckets on one device set and stage: the buckets of one unit. */
  GArray *gathers = g_array_new(FALSE, FALSE, sizeof(Gather));
  for (guint r0 = 0; r0 < nb;) {
    const Bucket *b0 = &g_array_index(buckets, Bucket, r0);
    const SyncItem *f0 = &g_array_index(items, SyncItem, b0->i);
    guint r1 = r0 + 1;
    while (r1 < nb && g_array_index(buckets, Bucket, r1).stage == b0->stage &&
           same_devs(f0, &g_array_index(items, SyncItem, g_array_index(buckets, Bucket, r1).i)))
      r1++;
    int len = (int)(r1 - r0);
    for (int mb = 0; mb < M; mb++)
      for (int pass = P_F; pass <= P_B; pass++)
        for (int pos = 0; pos < len; pos++) {
          /* The list is in backward order. */
          int at = pass == P_B ? pos : len - 1 - pos;
          int at2 = pass == P_B ? pos - 2 : len + 1 - pos;
          Gather ga = { .pos = pos, .bucket = (int)r0 + at,
                        .prev2 = pos >= 2 ? (int)r0 + at2 : -1, .pass = pass, .mb = mb };
          ga.rank = (pass == P_F ? lw->rank_f : lw->rank_b)[(size_t)b0->stage * M + mb];
          g_array_append_val(gathers, ga);
        }
    r0 = r1;
  }
  qsort(gathers->data, gathers->len, sizeof(Gather), gather_cmp);
  GHashTable *last = g_hash_table_new_full(sim_bytes_hash, g_bytes_equal,
                                           (GDestroyNotify)g_bytes_unref, NULL);
  GArray *ends = g_array_new(FALSE, FALSE, sizeof(SimTaskRef));
  for (guint k = 0; k < gathers->len; k++) {
    if (lowering_cancelled(lw, (int)k))
      break;
    const Gather *ga = &g_array_index(gathers, Gather, k);
    const Bucket *bk = &g_array_index(buckets, Bucket, ga->bucket);
    const SyncItem *first = &g_array_index(items, SyncItem, bk->i);
    SimTaskRef start, end;
    sync_collective(lw, prev, lw->coll_keys, SIM_COLL_ALLGATHER, SIM_CLASS_PARAM_SYNC,
                    first->devs, first->n_devs, (double)bk->bytes, first->op, &start, &end);
    chain_append(tg, block, last, ends, first, start, end);
    bucket_compute_deps(lw, block, items, bk, ga->pass, ga->mb, end, NULL);
    if (ga->prev2 >= 0 && !(ga->pass == P_B && bucket_recomputes(lw, items, bk)))
      bucket_compute_deps(lw, block, items, &g_array_index(buckets, Bucket, ga->prev2),
                          ga->pass, ga->mb, end, &start);
  }
  g_array_free(ends, TRUE);
  g_hash_table_destroy(last);
  g_array_free(gathers, TRUE);
}

static void build_sync_block(SimLowering *lw)
{
  SimTaskGraph *tg = lw->tg;
  if (lw->sync_block < 0)
    lw->sync_block = sim_taskgraph_block_new(tg);
  else
    sim_taskgraph_block_clear(tg, lw->sync_block);
  int block = lw->sync_block;
  memset(tg->static_mem, 0, (size_t)lw->n_dev * sizeof(int64_t));
  /* The previous build's collectives, offered for reuse unless meanings are recorded
   * (executors build once) or collectives are numbered for folding. */
  GArray *old_blocks = lw->coll_blocks;
  GHashTable *prev_keys = lw->coll_keys;
  gboolean reuse = !lw->record && !tg->track_collectives;
  lw->coll_blocks = g_array_new(FALSE, FALSE, sizeof(int));
  lw->coll_keys = g_hash_table_new_full(sim_bytes_hash, g_bytes_equal,
                                        (GDestroyNotify)g_bytes_unref, NULL);
  const SimStrategy *s = lw->s;
  int M = lw->M;

  /* Items in backward order: later operators' gradients are ready first.  Each op's
   * share comes from its cache, recomputed where the op or its weight partners changed. */
  GArray *items = g_array_new(FALSE, TRUE, sizeof(SyncItem));
  GArray *ties = g_array_new(FALSE, TRUE, sizeof(SyncItem));
  uint8_t *owner_dev = g_new0(uint8_t, lw->n_dev);
  for (int x = lw->n_ops - 1; x >= 0; x--) {
    if (lowering_cancelled(lw, x))
      break;
    struct OpSync *os = &lw->op_sync[x];
    if (!os->valid) {
      if (!os->items) {
        os->items = g_array_new(FALSE, TRUE, sizeof(SyncItem));
        os->ties = g_array_new(FALSE, TRUE, sizeof(SyncItem));
        os->mem = g_array_new(FALSE, FALSE, sizeof(MemAdd));
      }
      op_sync_build(lw, x, owner_dev, os);
      os->valid = TRUE;
    }
    for (guint k = 0; k < os->mem->len; k++) {
      const MemAdd *ma = &g_array_index(os->mem, MemAdd, k);
      tg->static_mem[ma->dev] += ma->bytes;
    }
    /* Shallow copies: the cache keeps owning the shard and device lists. */
    g_array_append_vals(items, os->items->data, os->items->len);
    g_array_append_vals(ties, os->ties->data, os->ties->len);
  }
  g_free(owner_dev);
  group_items_by_devices(items);

  /* Without overlap, a device's synchronization waits for its whole backward pass. */
  SimTaskRef *done = NULL;
  if (!s->sync.overlap && items->len) {
    done = g_new(SimTaskRef, lw->n_dev);
    for (int d = 0; d < lw->n_dev; d++) {
      SimTask nop = sim_task_nop();
      done[d] = sim_taskgraph_add(tg, block, &nop);
    }
    for (int x = 0; x < lw->n_ops; x++) {
      const OpLay *l = &lw->ops[x];
      if (l->is_input)
        continue;
      for (int sh = 0; sh < l->n_shards; sh++)
        if (l->cidx[sh] >= 0)
          sim_taskgraph_depend(tg, block, ref_compute(lw, l, P_B, M - 1, sh), done[l->dev[sh]]);
    }
  }

  SimCollKind kind = s->memory.zero1 ? SIM_COLL_REDUCE_SCATTER : SIM_COLL_ALLREDUCE;
  /* Where each shard's synchronization ends, for the exchanges between weight copies
   * (recorded for the ops those exchanges involve). */
  GHashTable *sync_end = g_hash_table_new(g_direct_hash, g_direct_equal);
  uint8_t *in_tie = g_new0(uint8_t, MAX(lw->n_ops, 1));
  for (guint k = 0; k < ties->len; k++) {
    int x = g_array_index(ties, SyncItem, k).op;
    in_tie[x] = in_tie[sim_graph_op_weight_owner(lw->g, x)] = 1;
  }
  GArray *chain_end = g_array_new(FALSE, FALSE, sizeof(SimTaskRef));
  /* The buckets: consecutive items on the same devices, up to the bucket size (under
   * ZeRO-3 also of one pipeline stage, since its buckets are gathered stage by stage). */
  gboolean zero3 = s->memory.zero1 && s->memory.zero3;
  GArray *buckets = g_array_new(FALSE, FALSE, sizeof(Bucket));
  for (guint i = 0; i < items->len;) {
    SyncItem *first = &g_array_index(items, SyncItem, i);
    Bucket bk = { .i = i, .j = i + 1, .bytes = first->bytes, .stage = lw->ops[first->op].stage };
    while (bk.j < items->len && s->sync.bucket_bytes > 0 && bk.bytes < s->sync.bucket_bytes &&
           same_devs(first, &g_array_index(items, SyncItem, bk.j)) &&
           (!zero3 || lw->ops[g_array_index(items, SyncItem, bk.j).op].stage == bk.stage)) {
      bk.bytes += g_array_index(items, SyncItem, bk.j).bytes;
      bk.j++;
    }
    g_array_append_val(buckets, bk);
    i = bk.j;
  }
  if (zero3)
    zero3_gathered_memory(lw, items, buckets);
  /* The last collective on each device set, for the chain (a GBytes of the device list ->
   * its index in chain_end + 1). */
  GHashTable *chain_last = g_hash_table_new_full(sim_bytes_hash, g_bytes_equal,
                                                 (GDestroyNotify)g_bytes_unref, NULL);
  /* Without ZeRO-3, one reduction of every bucket after the last micro-batch's backward;
   * with it, one after every micro-batch's backward (micro-batch by micro-batch, the order
   * in which the backward passes produce them). */
  int polls = 0;
  gboolean cancelled = FALSE;
  for (int rmb = zero3 ? 0 : M - 1; rmb < M && !cancelled; rmb++)
  for (guint bi = 0; bi < buckets->len; bi++, polls++) {
    /* Cancelled: the rest is not lowered (the caller fails without running it). */
    if ((cancelled = lowering_cancelled(lw, polls)))
      break;
    const Bucket *bk = &g_array_index(buckets, Bucket, bi);
    guint i = bk->i, j = bk->j;
    int64_t bytes = bk->bytes;
    gboolean last = rmb == M - 1;
    SyncItem *first = &g_array_index(items, SyncItem, i);
    SimTaskRef start, end;
    sync_collective(lw, reuse ? prev_keys : NULL, lw->coll_keys, kind, SIM_CLASS_GRAD_SYNC,
                    first->devs, first->n_devs, (double)bytes, first->op, &start, &end);
    /* Collectives on the same devices run one after the other, as on one NCCL stream. */
    chain_append(tg, block, chain_last, chain_end, first, start, end);
    if (lw->record && last) {
      SimTaskSem m = { .index = end.index, .kind = SIM_SEM_SYNC, .coll = kind, .tensor = -1,
                       .n_devs = first->n_devs, .n_ops = (int)(j - i) };
      m.devs = g_memdup2(first->devs, sizeof(int) * (size_t)first->n_devs);
      m.ops = g_new(int32_t, j - i);
      for (guint k = i; k < j; k++)
        m.ops[k - i] = g_array_index(items, SyncItem, k).op;
      sim_taskgraph_sem_add(tg, end.block, &m);
    }
    for (guint k = i; k < j; k++) {
      SyncItem *it = &g_array_index(items, SyncItem, k);
      const OpLay *l = &lw->ops[it->op];
      for (int m = 0; m < it->n; m++) {
        int sh = it->shards[m];
        if (in_tie[it->op] && last)
          g_hash_table_insert(sync_end, GINT_TO_POINTER(((it->op << 16) | sh) + 1),
                              GINT_TO_POINTER(chain_end->len));
        if (l->cidx[sh] < 0)
          continue;
        if (done)
          sim_taskgraph_depend(tg, block, done[l->dev[sh]], start);
        else
          sim_taskgraph_depend(tg, block, ref_compute(lw, l, P_B, rmb, sh), start);
        if (last)
          sim_taskgraph_depend(tg, block, end, ref_update(lw, l, sh));
      }
      /* Users of these weights on the same devices add their gradients first. */
      GArray *users = lw->sharers[it->op];
      for (guint u = 0; users && u < users->len; u++) {
        const OpLay *ul = &lw->ops[g_array_index(users, int, u)];
        for (int sh = 0; sh < ul->n_shards; sh++) {
          if (ul->cidx[sh] < 0)
            continue;
          gboolean here = FALSE;
          for (int dd = 0; dd < it->n_devs && !here; dd++)
            here = it->devs[dd] == ul->dev[sh];
          if (!here)
            continue;
          if (!done)
            sim_taskgraph_depend(tg, block, ref_compute(lw, ul, P_B, rmb, sh), start);
          if (last)
            sim_taskgraph_depend(tg, block, end, ref_update(lw, ul, sh));
        }
      }
    }
    /* Each replica updated its shard of the states; gather the new weights (under ZeRO-3
     * the next forward gathers them, but an executor keeps every replica's weights
     * whole, so a recorded plan gathers them here too). */
    if (s->memory.zero1 && last && (!zero3 || lw->record)) {
      SimTaskRef gs, ge;
      sync_collective(lw, reuse ? prev_keys : NULL, lw->coll_keys, SIM_COLL_ALLGATHER,
                      SIM_CLASS_PARAM_SYNC, first->devs, first->n_devs, (double)bytes,
                      first->op, &gs, &ge);
      if (lw->record) {
        SimTaskSem m = { .index = ge.index, .kind = SIM_SEM_GATHER_PARAMS, .tensor = -1,
                         .n_devs = first->n_devs, .n_ops = (int)(j - i) };
        m.devs = g_memdup2(first->devs, sizeof(int) * (size_t)first->n_devs);
        m.ops = g_new(int32_t, j - i);
        for (guint k = i; k < j; k++)
          m.ops[k - i] = g_array_index(items, SyncItem, k).op;
        sim_taskgraph_sem_add(tg, ge.block, &m);
      }
      for (guint k = i; k < j; k++) {
        SyncItem *it = &g_array_index(items, SyncItem, k);
        const OpLay *l = &lw->ops[it->op];
        for (int m = 0; m < it->n; m++)
          if (l->cidx[it->shards[m]] >= 0)
            sim_taskgraph_depend(tg, block, ref_update(lw, l, it->shards[m]), gs);
      }
    }
  }
  if (zero3)
    zero3_gathers(lw, items, buckets, reuse ? prev_keys : NULL);
  g_array_free(buckets, TRUE);
  g_hash_table_destroy(chain_last);
  /* The exchanges between copies of shared weights and their owner: after both sides
   * have their gradients (synchronized among their replicas where they have replicas),
   * before either side updates. */
  for (guint k = 0; k < ties->len; k++) {
    SyncItem *it = &g_array_index(ties, SyncItem, k);
    const OpLay *l = &lw->ops[it->op];
    int owner = sim_graph_op_weight_owner(lw->g, it->op);
    const OpLay *ol = &lw->ops[owner];
    int sh = it->shards[0], osh = sh % ol->n_shards;
    SimTaskRef start, end;
    sync_collective(lw, reuse ? prev_keys : NULL, lw->coll_keys, SIM_COLL_ALLREDUCE,
                    SIM_CLASS_GRAD_SYNC, it->devs, 2, (double)it->bytes, it->op, &start, &end);
    if (lw->record) {
      SimTaskSem m = { .index = end.index, .kind = SIM_SEM_SYNC, .coll = SIM_COLL_ALLREDUCE,
                       .tensor = -1, .n_devs = 2, .n_ops = 1 };
      m.devs = g_memdup2(it->devs, sizeof(int) * 2);
      m.ops = g_memdup2(&it->op, sizeof(int32_t));
      sim_taskgraph_sem_add(tg, end.block, &m);
    }
    const OpLay *side[2] = { ol, l };
    int side_op[2] = { owner, it->op }, side_sh[2] = { osh, sh };
    for (int q = 0; q < 2; q++) {
      const OpLay *sl = side[q];
      if (sl->cidx[side_sh[q]] < 0)
        continue;
      gpointer e = g_hash_table_lookup(sync_end, GINT_TO_POINTER(((side_op[q] << 16) | side_sh[q]) + 1));
      SimTaskRef before = e ? g_array_index(chain_end, SimTaskRef, GPOINTER_TO_INT(e) - 1)
                            : ref_compute(lw, sl, P_B, M - 1, side_sh[q]);
      sim_taskgraph_depend(tg, block, before, start);
      sim_taskgraph_depend(tg, block, end, ref_update(lw, sl, side_sh[q]));
    }
  }
  g_hash_table_destroy(sync_end);
  g_free(in_tie);
  sync_collectives_done(lw, old_blocks);
  g_array_free(old_blocks, TRUE);
  g_hash_table_destroy(prev_keys);
  g_array_free(ties, TRUE);
  g_array_free(chain_end, TRUE);
  g_free(done);
  g_array_free(items, TRUE);
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

SimLowering *sim_lowering_new(const SimGraph *g, SimMachine *m, const SimStrategy *s,
                              SimCostModel *cost, const SimOptions *o, const SimCollParams *cp,
                              const uint8_t *simulated)
{
  SimLowering *lw = g_new0(SimLowering, 1);
  lw->g = g;
  lw->m = m;
  lw->s = s;
  lw->byte_scale = 1.0;
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
  int64_t lo[SIM_MAX_ITER], hi[SIM_MAX_ITER];
  sim_lowering_shard_range(lw, x, shard, lo, hi);
  const SimTensorMap *map = role == SIM_TENSOR_INPUT    ? sim_space_input_map(op, i)
                            : role == SIM_TENSOR_WEIGHT ? sim_space_weight_map(op, i)
                                                        : sim_space_output_map(op, i);
  SimShape shp = sim_lowering_tensor_shape(lw, x, role, i);
  sim_map_project(map, &shp, lo, hi, out);
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
    op_sync_invalidate(lw, x);
    g_array_free(os->items, TRUE);
    g_array_free(os->ties, TRUE);
    g_array_free(os->mem, TRUE);
  }
  g_free(lw->op_sync);
  g_free(lw->rank_f);
  g_free(lw->rank_b);
  g_free(lw->seg);
  g_free(lw->simulated);
  sim_taskgraph_free(lw->tg);
  sim_key_index_free(&lw->regions);
  sim_key_index_free(&lw->transfers);
  g_free(lw);
}

void sim_lowering_build(SimLowering *lw)
{
  for (int x = 0; x < lw->n_ops; x++) {
    if (lowering_cancelled(lw, x))
      return;
    lay_op(lw, x);
  }
  order_backward(lw);
  for (int x = 0; x < lw->n_ops; x++) {
    if (lowering_cancelled(lw, x))
      return;
    build_op_block(lw, x);
  }
  int nt = sim_graph_n_tensors(lw->g);
  for (int t = 0; t < nt; t++) {
    if (lowering_cancelled(lw, t))
      return;
    build_tensor_block(lw, t);
  }
  if (lowering_cancelled(lw, 0))
    return;
  build_sync_block(lw);
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
    op_sync_invalidate(lw, x);
    int owner = sim_graph_op_weight_owner(lw->g, x);
    if (owner != x)
      op_sync_invalidate(lw, owner);
    for (guint u = 0; lw->sharers[x] && u < lw->sharers[x]->len; u++)
      op_sync_invalidate(lw, g_array_index(lw->sharers[x], int, u));
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
      build_tensor_block(lw, t);
  g_free(touched);
  g_array_free(list, TRUE);
  build_sync_block(lw);
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
