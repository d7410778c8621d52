/* lower-sync.c — the gradient synchronization that the lowering (lower.c) makes: every
 * op's weight gradients in buckets, all-reduced (or reduce-scattered and all-gathered under
 * ZeRO) over the shards that share them, ZeRO-3's parameter gathers, each collective in a
 * block of its own that a rebuild reuses when unchanged; and the optimizer's update on the
 * host where it is offloaded (offload_updates()).
 */
#include "lower-private.h"

#include <math.h>
#include <string.h>

/* ---- gradient synchronization ---------------------------------------------------------- */

typedef struct {
  int op;
  int *shards;
  int n;
  int *devs;
  int n_devs;
  int64_t bytes;     /* gradient bytes per device */
  /* Summed over shards of one replica too (sequence parallelism's layer norms): reduced
   * after the devices' whole backward pass, as Megatron's finalize_model_grads()
   * all-reduces them once the backward pass is over. */
  gboolean late;
} SyncItem;

typedef struct {
  int32_t dev;
  int64_t bytes;
} MemAdd;

/* A shard's part of the optimizer update that the host carries out (SimMemoryOptions'
 * offload): the parameters it updates there. */
typedef struct {
  int32_t sh;
  double elems;
  int64_t host;      /* bytes of the shard's states in host memory */
} OffloadItem;

static void sync_items_clear(GArray *a)
{
  for (guint k = 0; k < a->len; k++) {
    SyncItem *it = &g_array_index(a, SyncItem, k);
    g_free(it->shards);
    g_free(it->devs);
  }
  g_array_set_size(a, 0);
}

void lower_op_sync_invalidate(SimLowering *lw, int x)
{
  struct OpSync *os = &lw->op_sync[x];
  os->valid = FALSE;
  if (os->items) {
    sync_items_clear(os->items);
    sync_items_clear(os->ties);
    g_array_set_size(os->mem, 0);
    g_array_set_size(os->offload, 0);
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
                        double *shardable, double *host)
{
  int w = sim_dtype_size(wdt);
  gboolean mixed = SIM_PRECISION_IS_MIXED(mo->precision);
  double states = mo->optimizer == SIM_OPTIMIZER_ADAM ? 8 : 4; /* moments or momentum */
  if (mixed)
    states += 4; /* fp32 master weights */
  /* The offloaded share of the master weights and moments lives in host memory. */
  *host = states * mo->offload;
  states *= 1.0 - mo->offload;
  *fixed = 2.0 * w;   /* weights and their gradients */
  *shardable = states;
  if (mo->zero1 && mo->zero2) {
    /* ZeRO-2: each replica keeps the gradients of the part it updates. */
    *fixed = w;
    *shardable = states + w;
  }
  if (mo->zero1 && mo->zero3) {
    /* ZeRO-3: and only its part of the weights (the gathered buckets are counted in
     * lower_build_sync_block()). */
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

/* Whether shard coordinates @a and @b (@ndims each) are of one set: the same samples
 * (dimension 0; @by_sample TRUE), or the same other coordinates (FALSE). */
static gboolean same_set(const int *a, const int *b, int ndims, gboolean by_sample)
{
  return by_sample ? a[0] == b[0] : memcmp(a + 1, b + 1, sizeof(int) * (size_t)(ndims - 1)) == 0;
}

/* Appends to @items the members of @h whose coordinate of dimension 0 (the samples) is
 * @b0 (@by_sample TRUE) or whose other coordinates are those of member @ref (FALSE), on
 * their distinct devices; nothing where they sit on one device or none is simulated. */
static void sub_item(const SimLowering *lw, int x, const Holders *h, const int *coords,
                     int ndims, int ref, gboolean by_sample, int64_t bytes, GArray *items)
{
  const OpLay *l = &lw->ops[x];
  int *sh = g_new(int, h->n), *dv = g_new(int, h->n);
  int n = 0, nd = 0;
  gboolean any_sim = FALSE;
  for (int i = 0; i < h->n; i++) {
    if (!same_set(coords + (size_t)i * ndims, coords + (size_t)ref * ndims, ndims, by_sample))
      continue;
    int m = h->members[i];
    sh[n++] = m;
    any_sim |= l->cidx[m] >= 0;
    gboolean seen = FALSE;
    for (int k = 0; k < nd && !seen; k++)
      seen = dv[k] == l->dev[m];
    if (!seen)
      dv[nd++] = l->dev[m];
  }
  if (nd > 1 && any_sim) {
    SyncItem it = { .op = x, .n = n, .n_devs = nd, .bytes = bytes, .late = by_sample };
    it.shards = g_memdup2(sh, sizeof(int) * (size_t)n);
    it.devs = g_memdup2(dv, sizeof(int) * (size_t)nd);
    g_array_append_val(items, it);
  }
  g_free(sh);
  g_free(dv);
}

/* Gradients that sequence parallelism leaves partial over the tensor-parallel ranks too
 * (the layer norms' and the row-parallel biases', summed over the shards of every
 * position and sample): as Megatron does, each rank's gradient is reduced with its
 * data-parallel peers in the buckets of its other gradients, and the tensor-parallel
 * ranks of each replica all-reduce theirs once the backward pass is over
 * (finalize_model_grads()): items over the shards of one set of positions (one per
 * member that starts such a set) and, late, over those of one set of samples.  Recorded
 * plans keep one all-reduce over every holder, which sums the same values (executors
 * match a synchronization to the group of shards that shares the weights). */
static void split_sequence_parallel(const SimLowering *lw, int x, const Holders *h, int ndims,
                                    int reps, int64_t bytes, GArray *items)
{
  const SimOpConfig *c = &lw->s->ops[x];
  int *coords = g_new(int, (size_t)h->n * MAX(ndims, 1));
  for (int i = 0; i < h->n; i++)
    sim_config_shard_coords(c, ndims, h->members[i] / reps, coords + (size_t)i * ndims);
  for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < h->n; i++) {
      /* The first member of each set stands for it. */
      gboolean first = TRUE;
      for (int j = 0; j < i && first; j++)
        first = !same_set(coords + (size_t)i * ndims, coords + (size_t)j * ndims, ndims, pass);
      if (first)
        sub_item(lw, x, h, coords, ndims, i, pass == 1, bytes, items);
    }
  g_free(coords);
}

/* Computes op @x's share of the synchronization into @os (see struct OpSync). */
static void op_sync_build(SimLowering *lw, int x, uint8_t *owner_dev, struct OpSync *os)
{
  const SimStrategy *s = lw->s;
  const OpLay *l = &lw->ops[x];
  if (l->is_input || !l->has_weights)
    return;
  const SimOp *op = sim_graph_op_get(lw->g, x);
  double fixed, shardable, host;
  param_bytes(&s->memory, op->w_dtype, &fixed, &shardable, &host);
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
  GArray *groups = lower_group_holders(&lw->regions, l, wr, 1, 0, tag);
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
      /* The parameters this shard updates (its part under ZeRO), the offloaded share of
       * them on the host.  Tables with sparse gradients keep no states to offload. */
      if (s->memory.offload > 0 && sparse_rows < 0) {
        double upd = (double)l->w_elems[sh] / (s->memory.zero1 && nrep > 1 ? nrep : 1);
        OffloadItem oi = { sh, upd * s->memory.offload, (int64_t)(host * upd) };
        g_array_append_val(os->offload, oi);
      }
    }
    if (nrep <= 1 || !h->any_sim)
      continue;
    int64_t bytes = (l->w_elems[h->members[0]] + extra) * wbytes;
    if (sparse_rows >= 0)
      bytes = MIN(bytes, sparse_rows * sparse_width * wbytes);
    if (s->sequence_parallel && !(s->memory.zero1 && s->memory.zero3) && !lw->record &&
        h->n_devs > MAX(c->degree[0], 1)) {
      split_sequence_parallel(lw, x, h, op->space.ndims, reps, bytes, os->items);
      continue;
    }
    SyncItem it = { .op = x, .n = h->n, .n_devs = h->n_devs };
    it.shards = g_memdup2(h->members, sizeof(int) * (size_t)h->n);
    it.devs = g_memdup2(h->devs, sizeof(int) * (size_t)h->n_devs);
    it.bytes = bytes;
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
  lower_holders_free(groups);
  g_free(wr);
  g_free(own);
}

/* Whether the simulation was cancelled (SimOptions.cancel): the lowering then stops where
 * it is, and its caller fails with SIM_ERROR_CANCELLED without running it. */
gboolean lower_lowering_cancelled(const SimLowering *lw, int i)
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
 * @mb of bucket @bk's ops wait for @end, and in the forward pass that of the ops that
 * use their weights on the same devices (an output layer tied to the embedding: the
 * gather before the first layer's forward serves it, and its weights stay gathered until
 * its backward, which runs before the embedding's backward gather, as FSDP keeps weights
 * shared across its units gathered); with @before, makes @before's start wait for the
 * bucket's own compute instead (users elsewhere in the pass do not hold a prefetch back). */
static void bucket_compute_deps(SimLowering *lw, int block, GArray *items, const Bucket *bk,
                                int pass, int mb, SimTaskRef end, const SimTaskRef *before)
{
  SimTaskGraph *tg = lw->tg;
  for (guint k = bk->i; k < bk->j; k++) {
    const SyncItem *it = &g_array_index(items, SyncItem, k);
    GArray *users = pass == P_F && !before ? lw->sharers[it->op] : NULL;
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
            sim_taskgraph_depend(tg, block, ref_done(lw, l, P_F, mb, sh), *before);
          else
            sim_taskgraph_depend(tg, block, end, ref_compute(lw, l, P_F, mb, sh));
          continue;
        }
        int first = l->recompute ? P_R : P_B;
        if (before)
          sim_taskgraph_depend(tg, block, ref_done(lw, l, P_B, mb, sh), *before);
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
    if (lower_lowering_cancelled(lw, (int)k))
      break;
    const Gather *ga = &g_array_index(gathers, Gather, k);
    const Bucket *bk = &g_array_index(buckets, Bucket, ga->bucket);
    const SyncItem *first = &g_array_index(items, SyncItem, bk->i);
    SimTaskRef start, end;
    sync_collective(lw, prev, lw->coll_keys, SIM_COLL_ALLGATHER, SIM_CLASS_PARAM_SYNC,
                    first->devs, first->n_devs, (double)bk->bytes, first->op, &start, &end);
    chain_append(tg, block, last, ends, first, start, end);
    if (lw->record) {
      /* An executor shards the weights between steps too: every gather is carried out. */
      SimTaskSem m = { .index = end.index, .kind = SIM_SEM_GATHER_PARAMS, .tensor = -1,
                       .n_devs = first->n_devs, .n_ops = (int)(bk->j - bk->i) };
      m.devs = g_memdup2(first->devs, sizeof(int) * (size_t)first->n_devs);
      m.ops = g_new(int32_t, bk->j - bk->i);
      for (guint q = bk->i; q < bk->j; q++)
        m.ops[q - bk->i] = g_array_index(items, SyncItem, q).op;
      sim_taskgraph_sem_add(tg, end.block, &m);
    }
    bucket_compute_deps(lw, block, items, bk, ga->pass, ga->mb, end, NULL);
    if (ga->prev2 >= 0 && !(ga->pass == P_B && bucket_recomputes(lw, items, bk)))
      bucket_compute_deps(lw, block, items, &g_array_index(buckets, Bucket, ga->prev2),
                          ga->pass, ga->mb, end, &start);
  }
  g_array_free(ends, TRUE);
  g_hash_table_destroy(last);
  g_array_free(gathers, TRUE);
}

/* The synchronization items in backward order (later operators' gradients are ready
 * first) and the exchanges between copies of shared weights (@ties); each op's share
 * comes from its cache, recomputed where the op or its weight partners changed.  Adds
 * the ops' static memory to the task graph's. */
static void collect_items(SimLowering *lw, GArray *items, GArray *ties)
{
  SimTaskGraph *tg = lw->tg;
  uint8_t *owner_dev = g_new0(uint8_t, lw->n_dev);
  for (int x = lw->n_ops - 1; x >= 0; x--) {
    if (lower_lowering_cancelled(lw, x))
      break;
    struct OpSync *os = &lw->op_sync[x];
    if (!os->valid) {
      if (!os->items) {
        os->items = g_array_new(FALSE, TRUE, sizeof(SyncItem));
        os->ties = g_array_new(FALSE, TRUE, sizeof(SyncItem));
        os->mem = g_array_new(FALSE, FALSE, sizeof(MemAdd));
        os->offload = g_array_new(FALSE, FALSE, sizeof(OffloadItem));
      }
      op_sync_build(lw, x, owner_dev, os);
      os->valid = TRUE;
    }
    for (guint k = 0; k < os->mem->len; k++) {
      const MemAdd *ma = &g_array_index(os->mem, MemAdd, k);
      tg->static_mem[ma->dev] += ma->bytes;
    }
    for (guint k = 0; k < os->offload->len; k++) {
      const OffloadItem *oi = &g_array_index(os->offload, OffloadItem, k);
      tg->host_mem[lw->ops[x].dev[oi->sh]] += oi->host;
    }
    /* Shallow copies: the cache keeps owning the shard and device lists. */
    g_array_append_vals(items, os->items->data, os->items->len);
    g_array_append_vals(ties, os->ties->data, os->ties->len);
  }
  g_free(owner_dev);
  group_items_by_devices(items);
}

/* Without overlap, a device's synchronization waits for its whole backward pass: a task
 * per device after its last micro-batch's backward computations. */
static SimTaskRef *backward_done(SimLowering *lw, int block)
{
  SimTaskGraph *tg = lw->tg;
  SimTaskRef *done = g_new(SimTaskRef, lw->n_dev);
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
        sim_taskgraph_depend(tg, block, ref_done(lw, l, P_B, lw->M - 1, sh), done[l->dev[sh]]);
  }
  return done;
}

/* The buckets: consecutive items on the same devices, up to the bucket size (under ZeRO-3
 * also of one pipeline stage, since its buckets are gathered stage by stage). */
static GArray *make_buckets(const SimLowering *lw, GArray *items, gboolean zero3)
{
  const SimStrategy *s = lw->s;
  GArray *buckets = g_array_new(FALSE, FALSE, sizeof(Bucket));
  for (guint i = 0; i < items->len;) {
    SyncItem *first = &g_array_index(items, SyncItem, i);
    Bucket bk = { .i = i, .j = i + 1, .bytes = first->bytes, .stage = lw->ops[first->op].stage };
    while (bk.j < items->len && s->sync.bucket_bytes > 0 && bk.bytes < s->sync.bucket_bytes &&
           same_devs(first, &g_array_index(items, SyncItem, bk.j)) &&
           first->late == g_array_index(items, SyncItem, bk.j).late &&
           (!zero3 || lw->ops[g_array_index(items, SyncItem, bk.j).op].stage == bk.stage)) {
      bk.bytes += g_array_index(items, SyncItem, bk.j).bytes;
      bk.j++;
    }
    g_array_append_val(buckets, bk);
    i = bk.j;
  }
  return buckets;
}

/* The host's optimizer throughput: parameters stepped a second by one node's CPUs.  Ren et
 * al., "ZeRO-Offload: Democratizing Billion-Scale Model Training" (USENIX ATC 2021), Table
 * 3: DeepSpeed's vectorized CPU-Adam steps 10 billion parameters in 2.57 s on one node's
 * host (1 billion in 0.22 s).  The GPUs of a node split its cores evenly (one process a
 * GPU, each bound to its share of the cores). */
#define OFFLOAD_HOST_PARAMS_PER_S (10e9 / 2.57)

/* A flow over the PCIe links between device @dev and its host, one way; its latency is
 * the links'. */
static SimTaskRef host_flow(SimLowering *lw, int block, int dev, gboolean to_host,
                            SimTaskClass cls, double bytes, int op)
{
  int links[64];
  int n = MIN(sim_machine_host_links(lw->m, dev, to_host, links, 64), 64);
  double latency = 0;
  for (int i = 0; i < n; i++)
    latency += sim_machine_link_latency(lw->m, links[i]);
  return sim_taskgraph_add_collective_flow(lw->tg, block, cls, links, n, &dev, 1, bytes, latency,
                                           op, -1, -1);
}

/* The offloaded updates (SimMemoryOptions' offload): after a shard's update on its device
 * (which steps the share left there), the gradients of the offloaded share cross PCIe to
 * the host, the host steps them, and the new weights cross back, each shard in turn on its
 * device's share of the host's cores, the transfers of all shards sharing the links.
 * With offload_overlap the gradients leave once the last micro-batch's backward has
 * produced them (reduce_bucket() adds the wait for their reduction) and the host's step
 * waits for both them and the device's update, which follows the backward pass.
 * Returns ((op << 16 | shard) + 1) -> index + 1 in @ends of the weights' return, and in
 * @downs of the gradients' copy to the host. */
static GHashTable *offload_updates(SimLowering *lw, int block, GArray *ends, GArray *downs)
{
  gboolean overlap = lw->s->memory.offload_overlap;
  SimTaskGraph *tg = lw->tg;
  GHashTable *at = g_hash_table_new(g_direct_hash, g_direct_equal);
  SimTaskRef *host = g_new(SimTaskRef, MAX(lw->n_dev, 1));
  uint8_t *busy = g_new0(uint8_t, MAX(lw->n_dev, 1));
  for (int x = lw->n_ops - 1; x >= 0; x--) {
    const struct OpSync *os = &lw->op_sync[x];
    if (!os->offload)
      continue;
    const OpLay *l = &lw->ops[x];
    int64_t wbytes = sim_dtype_size(sim_graph_op_get(lw->g, x)->w_dtype);
    for (guint k = 0; k < os->offload->len; k++) {
      const OffloadItem *oi = &g_array_index(os->offload, OffloadItem, k);
      int sh = oi->sh, dev = l->dev[sh];
      if (l->cidx[sh] < 0)
        continue;
      double bytes = oi->elems * (double)wbytes;
      double share = OFFLOAD_HOST_PARAMS_PER_S /
                     sim_machine_node_n_devices(lw->m, sim_machine_device_node(lw->m, dev));
      SimTaskRef down = host_flow(lw, block, dev, TRUE, SIM_CLASS_GRAD_SYNC, bytes, x);
      SimTask st = sim_task_delay(SIM_CLASS_UPDATE, dev, oi->elems / share);
      st.op = x;
      st.shard = sh;
      SimTaskRef step = sim_taskgraph_add(tg, block, &st);
      SimTaskRef up = host_flow(lw, block, dev, FALSE, SIM_CLASS_PARAM_SYNC, bytes, x);
      if (overlap) {
        sim_taskgraph_depend(tg, block, ref_done(lw, l, P_B, lw->M - 1, sh), down);
        sim_taskgraph_depend(tg, block, ref_update(lw, l, sh), step);
      } else {
        sim_taskgraph_depend(tg, block, ref_update(lw, l, sh), down);
      }
      sim_taskgraph_depend(tg, block, down, step);
      if (busy[dev])
        sim_taskgraph_depend(tg, block, host[dev], step);
      host[dev] = step;
      busy[dev] = 1;
      sim_taskgraph_depend(tg, block, step, up);
      g_array_append_val(ends, up);
      g_array_append_val(downs, down);
      g_hash_table_insert(at, GINT_TO_POINTER(((x << 16) | sh) + 1),
                          GINT_TO_POINTER((int)ends->len));
    }
  }
  g_free(busy);
  g_free(host);
  return at;
}

/* What the reductions of the buckets share while lower_build_sync_block() adds them. */
typedef struct {
  SimLowering *lw;
  int block;
  GHashTable *prev;          /* the previous build's collectives to reuse, or NULL        */
  GArray *items;             /* SyncItem, in backward order                               */
  SimCollKind kind;          /* all-reduce, or reduce-scatter under ZeRO                  */
  const SimTaskRef *done;    /* per device, its backward pass's end; NULL where no
                              * bucket waits for it                                     */
  const uint8_t *in_tie;     /* per op: its weights are exchanged with copies of them     */
  const uint8_t *late_op;    /* per op: some of its gradients are summed late too         */
  GHashTable *sync_end;      /* (op << 16 | shard) + 1 -> index in chain_end + 1           */
  GHashTable *chain_last;    /* the last collective on each device set, for the chain     */
  GArray *chain_end;         /* SimTaskRef                                                */
  GHashTable *offload_at;    /* offloaded shards: offload_updates()' map into offload_end   */
  GArray *offload_end;       /* SimTaskRef                                                */
  GArray *offload_down;      /* SimTaskRef, the gradients' copies to the host, likewise   */
} SyncBuild;

/* Records what the collective ending at @end means (a recorded plan, for executors): the
 * kind and collective of @m, the devices of @first and the ops of items [@i, @j). */
static void record_bucket(const SyncBuild *sb, SimTaskRef end, SimTaskSem m,
                          const SyncItem *first, guint i, guint j)
{
  m.index = end.index;
  m.tensor = -1;
  m.n_devs = first->n_devs;
  m.n_ops = (int)(j - i);
  m.devs = g_memdup2(first->devs, sizeof(int) * (size_t)first->n_devs);
  m.ops = g_new(int32_t, j - i);
  for (guint k = i; k < j; k++)
    m.ops[k - i] = g_array_index(sb->items, SyncItem, k).op;
  sim_taskgraph_sem_add(sb->lw->tg, end.block, &m);
}

/* The reduction of bucket @bk after micro-batch @rmb's backward pass: after the
 * computations of its gradients (and of the other users of those weights on its devices),
 * before the updates where @rmb is the last; under ZeRO-1 then the gathering of the new
 * weights. */
static void reduce_bucket(SyncBuild *sb, const Bucket *bk, int rmb)
{
  SimLowering *lw = sb->lw;
  SimTaskGraph *tg = lw->tg;
  const SimStrategy *s = lw->s;
  int block = sb->block;
  guint i = bk->i, j = bk->j;
  int64_t bytes = bk->bytes;
  gboolean last = rmb == lw->M - 1, zero3 = s->memory.zero1 && s->memory.zero3;
  SyncItem *first = &g_array_index(sb->items, SyncItem, i);
  /* A late bucket (tensor-parallel ranks' sums under sequence parallelism) all-reduces,
   * ZeRO or not, after its gradients' data-parallel reduction. */
  SimCollKind kind = first->late ? SIM_COLL_ALLREDUCE : sb->kind;
  /* Whether the bucket waits for its devices' whole backward pass, not its gradients'. */
  gboolean wait_done = sb->done && (!s->sync.overlap || first->late);
  SimTaskRef start, end;
  sync_collective(lw, sb->prev, lw->coll_keys, kind, SIM_CLASS_GRAD_SYNC, first->devs,
                  first->n_devs, (double)bytes, first->op, &start, &end);
  /* Collectives on the same devices run one after the other, as on one NCCL stream. */
  chain_append(tg, block, sb->chain_last, sb->chain_end, first, start, end);
  if (lw->record && (last || zero3))
    record_bucket(sb, end, (SimTaskSem){ .kind = SIM_SEM_SYNC, .coll = kind }, first, i, j);
  for (guint k = i; k < j; k++) {
    SyncItem *it = &g_array_index(sb->items, SyncItem, k);
    const OpLay *l = &lw->ops[it->op];
    for (int m = 0; m < it->n; m++) {
      int sh = it->shards[m];
      gpointer key = GINT_TO_POINTER(((it->op << 16) | sh) + 1);
      gpointer before = first->late ? g_hash_table_lookup(sb->sync_end, key) : NULL;
      if ((sb->in_tie[it->op] || sb->late_op[it->op]) && last)
        g_hash_table_insert(sb->sync_end, key, GINT_TO_POINTER(sb->chain_end->len));
      if (l->cidx[sh] < 0)
        continue;
      if (before)
        sim_taskgraph_depend(tg, block,
                             g_array_index(sb->chain_end, SimTaskRef, GPOINTER_TO_INT(before) - 1),
                             start);
      if (wait_done)
        sim_taskgraph_depend(tg, block, sb->done[l->dev[sh]], start);
      else
        sim_taskgraph_depend(tg, block, ref_done(lw, l, P_B, rmb, sh), start);
      if (last)
        sim_taskgraph_depend(tg, block, end, ref_update(lw, l, sh));
      /* Overlapped offload: the reduced gradients go to the host from here. */
      gpointer off = last && s->memory.offload_overlap && sb->offload_at
                       ? g_hash_table_lookup(sb->offload_at, key)
                       : NULL;
      if (off)
        sim_taskgraph_depend(tg, block,
                             end, g_array_index(sb->offload_down, SimTaskRef,
                                                GPOINTER_TO_INT(off) - 1));
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
        if (!wait_done)
          sim_taskgraph_depend(tg, block, ref_done(lw, ul, P_B, rmb, sh), start);
        if (last)
          sim_taskgraph_depend(tg, block, end, ref_update(lw, ul, sh));
      }
    }
  }
  /* Each replica updated its shard of the states; gather the new weights (under ZeRO-3
   * the next step's forward gathers them, recorded plans included). */
  if (s->memory.zero1 && last && !zero3 && !first->late) {
    SimTaskRef gs, ge;
    sync_collective(lw, sb->prev, lw->coll_keys, SIM_COLL_ALLGATHER, SIM_CLASS_PARAM_SYNC,
                    first->devs, first->n_devs, (double)bytes, first->op, &gs, &ge);
    if (lw->record)
      record_bucket(sb, ge, (SimTaskSem){ .kind = SIM_SEM_GATHER_PARAMS }, first, i, j);
    for (guint k = i; k < j; k++) {
      SyncItem *it = &g_array_index(sb->items, SyncItem, k);
      const OpLay *l = &lw->ops[it->op];
      for (int m = 0; m < it->n; m++) {
        int sh = it->shards[m];
        if (l->cidx[sh] < 0)
          continue;
        sim_taskgraph_depend(tg, block, ref_update(lw, l, sh), gs);
        /* Weights updated on the host are gathered once they are back. */
        gpointer e = sb->offload_at ? g_hash_table_lookup(sb->offload_at,
                                                          GINT_TO_POINTER(((it->op << 16) | sh) + 1))
                                    : NULL;
        if (e)
          sim_taskgraph_depend(tg, block,
                               g_array_index(sb->offload_end, SimTaskRef, GPOINTER_TO_INT(e) - 1),
                               gs);
      }
    }
  }
}

/* The exchanges between copies of shared weights and their owner: after both sides have
 * their gradients (synchronized among their replicas where they have replicas), before
 * either side updates. */
static void exchange_ties(SyncBuild *sb, GArray *ties)
{
  SimLowering *lw = sb->lw;
  SimTaskGraph *tg = lw->tg;
  for (guint k = 0; k < ties->len; k++) {
    SyncItem *it = &g_array_index(ties, SyncItem, k);
    const OpLay *l = &lw->ops[it->op];
    int owner = sim_graph_op_weight_owner(lw->g, it->op);
    const OpLay *ol = &lw->ops[owner];
    int sh = it->shards[0], osh = sh % ol->n_shards;
    SimTaskRef start, end;
    sync_collective(lw, sb->prev, lw->coll_keys, SIM_COLL_ALLREDUCE, SIM_CLASS_GRAD_SYNC,
                    it->devs, 2, (double)it->bytes, it->op, &start, &end);
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
      gpointer e = g_hash_table_lookup(sb->sync_end,
                                       GINT_TO_POINTER(((side_op[q] << 16) | side_sh[q]) + 1));
      SimTaskRef before = e ? g_array_index(sb->chain_end, SimTaskRef, GPOINTER_TO_INT(e) - 1)
                            : ref_done(lw, sl, P_B, lw->M - 1, side_sh[q]);
      sim_taskgraph_depend(tg, sb->block, before, start);
      sim_taskgraph_depend(tg, sb->block, end, ref_update(lw, sl, side_sh[q]));
    }
  }
}

void lower_build_sync_block(SimLowering *lw)
{
  SimTaskGraph *tg = lw->tg;
  if (lw->sync_block < 0)
    lw->sync_block = sim_taskgraph_block_new(tg);
  else
    sim_taskgraph_block_clear(tg, lw->sync_block);
  int block = lw->sync_block;
  memset(tg->static_mem, 0, (size_t)lw->n_dev * sizeof(int64_t));
  memset(tg->host_mem, 0, (size_t)lw->n_dev * sizeof(int64_t));
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

  GArray *items = g_array_new(FALSE, TRUE, sizeof(SyncItem));
  GArray *ties = g_array_new(FALSE, TRUE, sizeof(SyncItem));
  collect_items(lw, items, ties);
  gboolean any_late = FALSE;
  uint8_t *late_op = g_new0(uint8_t, MAX(lw->n_ops, 1));
  for (guint k = 0; k < items->len; k++) {
    const SyncItem *it = &g_array_index(items, SyncItem, k);
    any_late |= it->late;
    late_op[it->op] |= it->late;
  }
  SimTaskRef *done =
    (!s->sync.overlap || any_late) && items->len ? backward_done(lw, block) : NULL;
  /* Where each shard's synchronization ends, for the exchanges between weight copies
   * (recorded for the ops those exchanges involve). */
  uint8_t *in_tie = g_new0(uint8_t, MAX(lw->n_ops, 1));
  for (guint k = 0; k < ties->len; k++) {
    int x = g_array_index(ties, SyncItem, k).op;
    in_tie[x] = in_tie[sim_graph_op_weight_owner(lw->g, x)] = 1;
  }
  SyncBuild sb = {
    .lw = lw, .block = block, .prev = reuse ? prev_keys : NULL, .items = items,
    .kind = s->memory.zero1 ? SIM_COLL_REDUCE_SCATTER : SIM_COLL_ALLREDUCE,
    .done = done, .in_tie = in_tie, .late_op = late_op,
    .sync_end = g_hash_table_new(g_direct_hash, g_direct_equal),
    .chain_last = g_hash_table_new_full(sim_bytes_hash, g_bytes_equal,
                                        (GDestroyNotify)g_bytes_unref, NULL),
    .chain_end = g_array_new(FALSE, FALSE, sizeof(SimTaskRef)),
    .offload_end = g_array_new(FALSE, FALSE, sizeof(SimTaskRef)),
    .offload_down = g_array_new(FALSE, FALSE, sizeof(SimTaskRef)),
  };
  /* An executor's plan has no host: the offloaded update computes the same values. */
  if (s->memory.offload > 0 && !lw->record)
    sb.offload_at = offload_updates(lw, block, sb.offload_end, sb.offload_down);
  gboolean zero3 = s->memory.zero1 && s->memory.zero3;
  GArray *buckets = make_buckets(lw, items, zero3);
  if (zero3)
    zero3_gathered_memory(lw, items, buckets);
  /* Without ZeRO-3, one reduction of every bucket after the last micro-batch's backward;
   * with it, one after every micro-batch's backward (micro-batch by micro-batch, the order
   * in which the backward passes produce them). */
  int polls = 0;
  gboolean cancelled = FALSE;
  /* The late buckets after the others, whose ends they wait for. */
  for (int rmb = zero3 ? 0 : M - 1; rmb < M && !cancelled; rmb++)
    for (int late = 0; late < 2 && !cancelled; late++)
      for (guint bi = 0; bi < buckets->len; bi++, polls++) {
        /* Cancelled: the rest is not lowered (the caller fails without running it). */
        if ((cancelled = lower_lowering_cancelled(lw, polls)))
          break;
        const Bucket *bk = &g_array_index(buckets, Bucket, bi);
        if (g_array_index(items, SyncItem, bk->i).late == late)
          reduce_bucket(&sb, bk, rmb);
      }
  if (zero3)
    zero3_gathers(lw, items, buckets, sb.prev);
  g_array_free(buckets, TRUE);
  g_hash_table_destroy(sb.chain_last);
  exchange_ties(&sb, ties);
  g_hash_table_destroy(sb.sync_end);
  g_free(in_tie);
  g_free(late_op);
  sync_collectives_done(lw, old_blocks);
  g_array_free(old_blocks, TRUE);
  g_hash_table_destroy(prev_keys);
  g_array_free(ties, TRUE);
  g_array_free(sb.chain_end, TRUE);
  g_array_free(sb.offload_end, TRUE);
  g_array_free(sb.offload_down, TRUE);
  if (sb.offload_at)
    g_hash_table_destroy(sb.offload_at);
  g_free(done);
  g_array_free(items, TRUE);
}
