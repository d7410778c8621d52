/* taskgraph-assemble.c — the assembly of a task graph's blocks into the flat arrays the
 * engine reads: global task ids, successor lists in assembly order, and every device's
 * stream sorted by key (blocks that did not change keep their sorted entries). */
#include "taskgraph.h"
#include "base.h"

#include <stdlib.h>
#include <string.h>

/* A stream entry by block and index: that order is the order of global ids, so the
 * streams come out the same whether sorted whole or merged. */
typedef struct {
  uint64_t key;
  int32_t block;
  int32_t index;
} SortedEntry;

static int entry_cmp(const void *a, const void *b)
{
  const SortedEntry *x = a, *y = b;
  if (x->key != y->key)
    return x->key < y->key ? -1 : 1;
  if (x->block != y->block)
    return x->block < y->block ? -1 : 1;
  return (x->index > y->index) - (x->index < y->index);
}

/* Sorts @n entries by key, and entries of equal keys by (block, index), which is the
 * order @v holds them in when @in_order: a stable radix sort over the bits by which the
 * keys differ (a stream's keys are a schedule step above an operator's position, a few
 * thousand values each), two or three passes of 11 bits where qsort compared each entry
 * some 15 times through a function pointer.  Short or unordered arrays go to qsort. */
static void sort_entries(SortedEntry *v, guint n, gboolean in_order)
{
  if (n < 256 || !in_order) {
    qsort(v, n, sizeof(SortedEntry), entry_cmp);
    return;
  }
  /* Keys are monotone in (high - hmin) << lo_bits | low, which takes few bits. */
  uint32_t hmin = UINT32_MAX, hmax = 0, lmax = 0;
  for (guint i = 0; i < n; i++) {
    uint32_t h = (uint32_t)(v[i].key >> 32), l = (uint32_t)v[i].key;
    hmin = MIN(hmin, h);
    hmax = MAX(hmax, h);
    lmax = MAX(lmax, l);
  }
  int lo_bits = lmax ? 64 - __builtin_clzll(lmax) : 0;
  uint64_t span = hmax - hmin;
  int hi_bits = span ? 64 - __builtin_clzll(span) : 0;
  int bits = lo_bits + hi_bits;
  if (bits > 44) {
    qsort(v, n, sizeof(SortedEntry), entry_cmp);
    return;
  }
  enum { DIGIT = 11, BUCKETS = 1 << DIGIT };
  uint64_t *packed = g_new(uint64_t, n), *packed_tmp = g_new(uint64_t, n);
  SortedEntry *tmp = g_new(SortedEntry, n);
  for (guint i = 0; i < n; i++)
    packed[i] = ((uint64_t)((uint32_t)(v[i].key >> 32) - hmin) << lo_bits) |
                (uint32_t)v[i].key;
  guint *count = g_new(guint, BUCKETS);
  SortedEntry *src = v, *dst = tmp;
  uint64_t *psrc = packed, *pdst = packed_tmp;
  for (int shift = 0; shift < bits; shift += DIGIT) {
    memset(count, 0, sizeof(guint) * BUCKETS);
    for (guint i = 0; i < n; i++)
      count[(psrc[i] >> shift) & (BUCKETS - 1)]++;
    guint sum = 0;
    for (int b = 0; b < BUCKETS; b++) {
      guint c = count[b];
      count[b] = sum;
      sum += c;
    }
    for (guint i = 0; i < n; i++) {
      guint at = count[(psrc[i] >> shift) & (BUCKETS - 1)]++;
      dst[at] = src[i];
      pdst[at] = psrc[i];
    }
    SortedEntry *t = src;
    src = dst;
    dst = t;
    uint64_t *pt = psrc;
    psrc = pdst;
    pdst = pt;
  }
  if (src != v)
    memcpy(v, src, sizeof(SortedEntry) * n);
  g_free(count);
  g_free(tmp);
  g_free(packed);
  g_free(packed_tmp);
}

/* Brings tg->sorted up to date: the entries of unchanged blocks stay where they are, those
 * of changed blocks are sorted and merged in. */
static void update_streams(SimTaskGraph *tg)
{
  int nd = tg->n_devices;
  gboolean fresh = tg->sorted == NULL;
  if (fresh) {
    tg->sorted = g_new(GArray *, MAX(nd, 1));
    for (int d = 0; d < nd; d++)
      tg->sorted[d] = g_array_new(FALSE, FALSE, sizeof(SortedEntry));
  }
  GArray **add = g_new0(GArray *, MAX(nd, 1));
  /* Whether each device's entries come in (block, index) order, as the lowering adds
   * them (a block's entries by rising index): a stable sort by key then gives the order
   * entry_cmp() defines. */
  uint8_t *unordered = g_new0(uint8_t, MAX(nd, 1));
  for (guint i = 0; i < tg->blocks->len; i++) {
    SimTaskBlock *b = tg->blocks->pdata[i];
    if (!b->live || (!fresh && !b->changed))
      continue;
    for (guint j = 0; j < b->stream->len; j++) {
      const SimStreamEntry *se = &g_array_index(b->stream, SimStreamEntry, j);
      GArray *a = add[se->device];
      if (!a)
        a = add[se->device] = g_array_new(FALSE, FALSE, sizeof(SortedEntry));
      else {
        const SortedEntry *last = &g_array_index(a, SortedEntry, a->len - 1);
        if (last->block == (int32_t)i && last->index >= se->index)
          unordered[se->device] = 1;
      }
      SortedEntry e = { se->key, (int32_t)i, se->index };
      g_array_append_val(a, e);
    }
  }
  for (int d = 0; d < nd; d++) {
    GArray *old = tg->sorted[d];
    /* Drop the entries of changed blocks. */
    guint k = 0;
    if (!fresh)
      for (guint j = 0; j < old->len; j++) {
        SortedEntry e = g_array_index(old, SortedEntry, j);
        SimTaskBlock *b = tg->blocks->pdata[e.block];
        if (!b->changed)
          g_array_index(old, SortedEntry, k++) = e;
      }
    g_array_set_size(old, k);
    if (!add[d])
      continue;
    sort_entries((SortedEntry *)add[d]->data, add[d]->len, !unordered[d]);
    if (old->len == 0) {
      /* Nothing to merge with (a first assembly): the sorted entries are the stream. */
      g_array_free(old, TRUE);
      tg->sorted[d] = add[d];
      continue;
    }
    GArray *merged = g_array_sized_new(FALSE, FALSE, sizeof(SortedEntry), old->len + add[d]->len);
    guint a = 0, c = 0;
    while (a < old->len || c < add[d]->len) {
      const SortedEntry *x = a < old->len ? &g_array_index(old, SortedEntry, a) : NULL;
      const SortedEntry *y = c < add[d]->len ? &g_array_index(add[d], SortedEntry, c) : NULL;
      if (x && (!y || entry_cmp(x, y) <= 0)) {
        g_array_append_vals(merged, x, 1);
        a++;
      } else {
        g_array_append_vals(merged, y, 1);
        c++;
      }
    }
    g_array_free(old, TRUE);
    g_array_free(add[d], TRUE);
    tg->sorted[d] = merged;
  }
  g_free(add);
  g_free(unordered);
}

/* @p with room for @n elements of @size bytes: reallocated only to grow, and then by half
 * again, so that a graph that grows a little at a time is not reallocated at every
 * assembly (the first allocation is exact). */
static gpointer grow(gpointer p, size_t *cap, size_t n, size_t size)
{
  if (n <= *cap && p)
    return p;
  size_t want = MAX(p ? n + n / 2 : n, (size_t)1);
  *cap = want;
  return sim_large_renew(p, want * size);
}

#define ORDER(o) (tg->order ? g_array_index(tg->order, int, (o)) : (o))

/* Assembly with every task in the mapping, each of a live block: moves each block's tasks
 * to its place there (its offset, in assembly order), so that the mapping becomes the
 * flat task array.  Blocks that move towards the end are set aside first; the others move towards
 * the start, or stay, in the order of their places, and a block's place never covers the
 * tasks of a block that has yet to move (those lie at or after their own places, which
 * follow).  Then the blocks set aside are written to theirs. */
static void shared_place(SimTaskGraph *tg, int n_blocks)
{
  GArray *aside = g_array_new(FALSE, FALSE, sizeof(SimTask));
  for (int o = 0; o < n_blocks; o++) {
    SimTaskBlock *b = tg->blocks->pdata[ORDER(o)];
    if (b->live && b->sh_len && b->offset > b->sh_start)
      g_array_append_vals(aside, tg->shared + b->sh_start, (guint)b->sh_len);
  }
  for (int o = 0; o < n_blocks; o++) {
    SimTaskBlock *b = tg->blocks->pdata[ORDER(o)];
    if (b->live && b->sh_len && b->offset < b->sh_start)
      memmove(tg->shared + b->offset, tg->shared + b->sh_start,
              sizeof(SimTask) * (size_t)b->sh_len);
  }
  size_t at = 0;
  for (int o = 0; o < n_blocks; o++) {
    SimTaskBlock *b = tg->blocks->pdata[ORDER(o)];
    if (b->live && b->sh_len && b->offset > b->sh_start) {
      memcpy(tg->shared + b->offset, &g_array_index(aside, SimTask, at),
             sizeof(SimTask) * (size_t)b->sh_len);
      at += (size_t)b->sh_len;
    }
  }
  g_array_free(aside, TRUE);
  for (int o = 0; o < n_blocks; o++) {
    SimTaskBlock *b = tg->blocks->pdata[ORDER(o)];
    b->sh_start = b->offset;
  }
}

/* One pass over every edge in assembly order: counts successors (into @count) and
 * predecessors (tg->n_pred), or (@fill) writes the successor lists, @count holding where
 * each task's next successor goes.  @boff: each block's offset. */
static void edges_pass(SimTaskGraph *tg, int n_blocks, const int32_t *boff, int32_t *count,
                       gboolean fill)
{
  for (int o = 0; o < n_blocks; o++) {
    SimTaskBlock *b = tg->blocks->pdata[ORDER(o)];
    if (!b->live)
      continue;
    const SimTaskEdge *ed = (const SimTaskEdge *)b->edges->data;
    for (guint j = 0; j < b->edges->len; j++) {
      int32_t from = boff[ed[j].from.block] + ed[j].from.index;
      int32_t to = boff[ed[j].to.block] + ed[j].to.index;
      if (fill) {
        tg->succ[count[from]++] = to;
      } else {
        count[from]++;
        tg->n_pred[to]++;
      }
    }
  }
}

gboolean sim_taskgraph_assemble(SimTaskGraph *tg)
{
  /* Shared tasks handed over to the flat array have left their blocks. */
  g_return_val_if_fail(!tg->task_mapped, FALSE);
  /* Global ids: blocks in assembly order, tasks in block order. */
  int n_blocks = tg->order ? (int)tg->order->len : (int)tg->blocks->len;
  int n = 0, n_edges = 0;
  if (tg->order) {
    /* Every live block must be in the order, or its tasks would silently go missing. */
    int listed = 0, live = 0;
    for (int o = 0; o < n_blocks; o++)
      listed += ((SimTaskBlock *)tg->blocks->pdata[ORDER(o)])->live;
    for (guint i = 0; i < tg->blocks->len; i++)
      live += ((SimTaskBlock *)tg->blocks->pdata[i])->live;
    g_assert(listed == live);
  }
  for (int o = 0; o < n_blocks; o++) {
    SimTaskBlock *b = tg->blocks->pdata[ORDER(o)];
    b->offset = n;
    if (!b->live)
      continue;
    n += (int)sim_block_n_tasks(b);
    n_edges += (int)b->edges->len;
  }
  /* Shared tasks that are all live become the flat task array where they are. */
  gboolean handover = tg->sharing && !tg->task && (size_t)n == tg->n_shared;
  for (guint i = 0; handover && i < tg->blocks->len; i++) {
    const SimTaskBlock *b = tg->blocks->pdata[i];
    handover = b->live ? b->shared : !b->shared || b->sh_len == 0;
  }
  if (handover) {
    shared_place(tg, n_blocks);
    tg->task = tg->shared;
    tg->cap_task = tg->shared_bytes / sizeof(SimTask);
    tg->task_mapped = tg->shared_bytes;
    tg->shared = NULL;
    tg->n_shared = tg->shared_bytes = 0;
    tg->sharing = FALSE;
    /* The blocks keep their lengths (sh_len) until their extras are in place, below. */
  } else if (tg->sharing) {
    sim_taskgraph_unshare_tasks(tg);
  }
  gboolean tasks_kept = tg->task && (size_t)n <= tg->cap_task;
  tg->task = grow(tg->task, &tg->cap_task, (size_t)n, sizeof(SimTask));
  if (!tasks_kept || handover) {
    /* Per-task arrays sized as the task array, filled below. */
    tg->n_pred = sim_large_renew(tg->n_pred, tg->cap_task * sizeof(int32_t));
    tg->group_head = sim_large_renew(tg->group_head, tg->cap_task);
  }
  tg->n_tasks = n;
  size_t n_extra = 0;
  for (int o = 0; o < n_blocks; o++) {
    SimTaskBlock *b = tg->blocks->pdata[ORDER(o)];
    if (b->live)
      n_extra += b->extra->len;
  }
  gboolean extra_kept = tg->extra && n_extra <= tg->cap_extra;
  tg->extra = grow(tg->extra, &tg->cap_extra, n_extra, sizeof(int32_t));
  n_extra = 0;
  for (int o = 0; o < n_blocks; o++) {
    SimTaskBlock *b = tg->blocks->pdata[ORDER(o)];
    if (!b->live)
      continue;
    /* A block that has not changed and lands where it was is in place already (the
     * fields assembly writes, below, are written for every task). */
    gboolean in_place = tasks_kept && extra_kept && b->placed && !b->changed &&
                        b->last_offset == b->offset && b->last_extra == (int32_t)n_extra;
    b->placed = TRUE;
    b->last_offset = b->offset;
    b->last_extra = (int32_t)n_extra;
    if (in_place) {
      n_extra += b->extra->len;
      continue;
    }
    guint nt = sim_block_n_tasks(b);
    if (nt && !handover)
      memcpy(tg->task + b->offset, b->tasks->data, nt * sizeof(SimTask));
    if (b->extra->len) {
      memcpy(tg->extra + n_extra, b->extra->data, b->extra->len * sizeof(int32_t));
      /* Collective flows point into their block's extra array: rebase them. */
      for (guint k = 0; k < nt; k++) {
        SimTask *t = &tg->task[b->offset + k];
        if (t->kind == SIM_TASK_FLOW && t->n_links)
          t->links_off += (int32_t)n_extra;
      }
      n_extra += b->extra->len;
    }
  }
  if (handover)
    for (guint i = 0; i < tg->blocks->len; i++) {
      SimTaskBlock *b = tg->blocks->pdata[i];
      b->shared = FALSE;
      b->sh_start = -1;
      b->sh_len = 0;
    }
  /* A search past its deadline does not wait for the passes below (each a walk over every
   * task or edge: a second or more for tens of millions of tasks). */
  if (sim_taskgraph_cancelled(tg))
    return FALSE;
  /* Successor lists in CSR form: count, prefix-sum, fill, in dense arrays.  Edges are
   * filled in block order, so the successor order is deterministic. */
  tg->succ = grow(tg->succ, &tg->cap_succ, (size_t)n_edges, sizeof(int32_t));
  int32_t *boff = g_new(int32_t, MAX(tg->blocks->len, 1));
  for (guint i = 0; i < tg->blocks->len; i++)
    boff[i] = ((SimTaskBlock *)tg->blocks->pdata[i])->offset;
  /* Dense passes first (counts, offsets, roots, the fill); then one pass over the tasks
   * writes what they keep and finds the heads of groups: the task array, 80 bytes a
   * task, is the costly thing to walk. */
  /* @count: each task's successors, then where its list starts, then (after the fill)
   * where it ends, which is where the next one's starts. */
  int32_t *count = g_new0(int32_t, MAX(n, 1));
  memset(tg->n_pred, 0, (size_t)n * sizeof(int32_t));
  edges_pass(tg, n_blocks, boff, count, FALSE);
  if (sim_taskgraph_cancelled(tg)) {
    g_free(boff);
    g_free(count);
    return FALSE;
  }
  int n_roots = 0;
  int32_t off = 0;
  for (int t = 0; t < n; t++) {
    n_roots += tg->n_pred[t] == 0;
    int32_t c = count[t];
    count[t] = off;
    off += c;
  }
  tg->roots = grow(tg->roots, &tg->cap_roots, (size_t)n_roots, sizeof(int32_t));
  tg->n_roots = 0;
  for (int t = 0; t < n; t++)
    if (tg->n_pred[t] == 0)
      tg->roots[tg->n_roots++] = t;
  tg->n_succ_total = n_edges;
  edges_pass(tg, n_blocks, boff, count, TRUE);
  g_free(boff);
  if (sim_taskgraph_cancelled(tg)) {
    g_free(count);
    return FALSE;
  }

  /* Groups of flows: every successor of a join point or delay is a flow that waits for it
   * alone and releases one task, the same for all. */
  const int32_t *np = tg->n_pred, *succ = tg->succ, *end = count;
#define SOFF(t) ((t) > 0 ? end[(t) - 1] : 0)
  for (int t = 0; t < n; t++) {
    SimTask *j = &tg->task[t];
    int32_t ns = end[t] - SOFF(t);
    j->n_succ = ns;
    j->succ_off = SOFF(t);
    gboolean head = (j->kind == SIM_TASK_NOP || j->kind == SIM_TASK_DELAY) && ns > 0;
    int32_t sink = -1;
    for (int k = 0; head && k < ns; k++) {
      int32_t s = succ[SOFF(t) + k];
      const SimTask *f = &tg->task[s];
      head = f->kind == SIM_TASK_FLOW && np[s] == 1 && end[s] - SOFF(s) == 1 &&
             (f->n_links > 0 || (f->device != f->peer && f->bytes > 0)) &&
             (sink < 0 || succ[SOFF(s)] == sink);
      if (head)
        sink = succ[SOFF(s)];
    }
    tg->group_head[t] = head;
  }
#undef SOFF
  g_free(count);
  if (sim_taskgraph_cancelled(tg))
    return FALSE;

  /* Streams: sorted entries per device, turned into global ids. */
  update_streams(tg);
  int nd = tg->n_devices;
  tg->stream_off[0] = 0;
  for (int d = 0; d < nd; d++)
    tg->stream_off[d + 1] = tg->stream_off[d] + (int32_t)tg->sorted[d]->len;
  tg->stream = grow(tg->stream, &tg->cap_stream, (size_t)tg->stream_off[nd], sizeof(int32_t));
  for (int d = 0; d < nd; d++) {
    const GArray *arr = tg->sorted[d];
    for (guint j = 0; j < arr->len; j++) {
      const SortedEntry *se = &g_array_index(arr, SortedEntry, j);
      tg->stream[tg->stream_off[d] + (int)j] =
        ((SimTaskBlock *)tg->blocks->pdata[se->block])->offset + se->index;
    }
  }
  for (guint i = 0; i < tg->blocks->len; i++)
    ((SimTaskBlock *)tg->blocks->pdata[i])->changed = FALSE;
  tg->dirty = FALSE;
  return TRUE;
}
