/* taskgraph.c — blocks of tasks and their assembly into the flat arrays the engine reads. */
#include "taskgraph.h"
#include "collective.h"
#include "network.h"
#include "report.h"
#include "base.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* ---- Shared tasks (sim_taskgraph_share_tasks()) ----------------------------------- */

/* Room in the mapping for @more tasks after those it holds.  The mapping grows by
 * remapping its pages, not by copying them. */
static void shared_reserve(SimTaskGraph *tg, size_t more)
{
  size_t need = (tg->n_shared + more) * sizeof(SimTask);
  if (need <= tg->shared_bytes)
    return;
  size_t want = MAX(MAX(need, tg->shared_bytes * 2), (size_t)256 << 10);
  size_t unit = want < 4 * SIM_HUGE_PAGE ? (size_t)64 << 10 : SIM_HUGE_PAGE;
  want = (want + unit - 1) & ~(unit - 1);
  void *p = tg->shared ? mremap(tg->shared, tg->shared_bytes, want, MREMAP_MAYMOVE)
                       : mmap(NULL, want, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                              -1, 0);
  if (p == MAP_FAILED)
    g_error("out of memory: %zu bytes of tasks", want);
#ifdef MADV_HUGEPAGE
  /* Huge pages from 8 MiB up, as sim_large_alloc() gives them: a small graph would pay
   * for clearing 2 MiB to hold a few tasks. */
  if (want >= 4 * SIM_HUGE_PAGE)
    (void)madvise(p, want, MADV_HUGEPAGE);
#endif
  tg->shared = p;
  tg->shared_bytes = want;
}

void sim_taskgraph_share_tasks(SimTaskGraph *tg)
{
  for (guint i = 0; i < tg->blocks->len; i++)
    g_return_if_fail(sim_block_n_tasks(tg->blocks->pdata[i]) == 0);
  if (tg->sharing || tg->task)
    return;
  tg->sharing = TRUE;
  for (guint i = 0; i < tg->blocks->len; i++) {
    SimTaskBlock *b = tg->blocks->pdata[i];
    b->shared = TRUE;
    b->sh_start = -1;
    b->sh_len = 0;
  }
}

/* Ends the sharing: every block takes its tasks into its own array. */
static void tasks_unshare(SimTaskGraph *tg)
{
  for (guint i = 0; i < tg->blocks->len; i++) {
    SimTaskBlock *b = tg->blocks->pdata[i];
    if (!b->shared)
      continue;
    if (b->sh_len)
      g_array_append_vals(b->tasks, tg->shared + b->sh_start, (guint)b->sh_len);
    b->shared = FALSE;
    b->sh_start = -1;
    b->sh_len = 0;
  }
  if (tg->shared)
    munmap(tg->shared, tg->shared_bytes);
  tg->shared = NULL;
  tg->n_shared = tg->shared_bytes = 0;
  tg->sharing = FALSE;
}

static const char *const class_names[SIM_CLASS_COUNT] = {
  [SIM_CLASS_FORWARD] = "forward",
  [SIM_CLASS_BACKWARD] = "backward",
  [SIM_CLASS_RECOMPUTE] = "recompute",
  [SIM_CLASS_UPDATE] = "update",
  [SIM_CLASS_TRANSFER] = "transfer",
  [SIM_CLASS_REDUCTION] = "reduction",
  [SIM_CLASS_GRAD_SYNC] = "grad-sync",
  [SIM_CLASS_PARAM_SYNC] = "param-sync",
};

const char *sim_task_class_name(SimTaskClass c)
{
  return c < SIM_CLASS_COUNT ? class_names[c] : "?";
}

SimTaskGraph *sim_taskgraph_new(int n_devices)
{
  SimTaskGraph *tg = g_new0(SimTaskGraph, 1);
  tg->n_devices = n_devices;
  tg->blocks = g_ptr_array_new();
  tg->static_mem = g_new0(int64_t, n_devices);
  tg->stream_off = g_new0(int32_t, n_devices + 1);
  tg->dirty = TRUE;
  return tg;
}

static void sem_clear(SimTaskBlock *b)
{
  for (guint i = 0; i < b->sem->len; i++) {
    SimTaskSem *m = &g_array_index(b->sem, SimTaskSem, i);
    g_free(m->devs);
    g_free(m->ops);
  }
  g_array_set_size(b->sem, 0);
}

static void block_destroy(SimTaskBlock *b)
{
  sem_clear(b);
  g_array_free(b->sem, TRUE);
  g_array_free(b->extra, TRUE);
  g_array_free(b->tasks, TRUE);
  g_array_free(b->edges, TRUE);
  g_array_free(b->stream, TRUE);
  g_free(b);
}

/* The sorted streams of the last assembly, if any. */
static void free_sorted(SimTaskGraph *tg)
{
  if (!tg->sorted)
    return;
  for (int d = 0; d < tg->n_devices; d++)
    g_array_free(tg->sorted[d], TRUE);
  g_clear_pointer(&tg->sorted, g_free);
}

/* A block's empty task, edge, stream and extra arrays. */
static void block_arrays_new(SimTaskBlock *b)
{
  b->tasks = g_array_new(FALSE, FALSE, sizeof(SimTask));
  b->edges = g_array_new(FALSE, FALSE, sizeof(SimTaskEdge));
  b->stream = g_array_new(FALSE, FALSE, sizeof(SimStreamEntry));
  b->extra = g_array_new(FALSE, FALSE, sizeof(int32_t));
  memset(b->ring, 0, sizeof b->ring);
}

void sim_taskgraph_free(SimTaskGraph *tg)
{
  if (!tg)
    return;
  for (guint i = 0; i < tg->blocks->len; i++)
    block_destroy(tg->blocks->pdata[i]);
  g_ptr_array_free(tg->blocks, TRUE);
  if (tg->order)
    g_array_free(tg->order, TRUE);
  g_free(tg->static_mem);
  if (tg->task_mapped)
    munmap(tg->task, tg->task_mapped);
  else
    g_free(tg->task);
  if (tg->shared)
    munmap(tg->shared, tg->shared_bytes);
  g_free(tg->succ);
  g_free(tg->stream);
  g_free(tg->extra);
  g_free(tg->n_pred);
  g_free(tg->group_head);
  g_free(tg->roots);
  g_free(tg->chain);
  g_free(tg->chain_dur);
  g_free(tg->stream_off);
  free_sorted(tg);
  if (tg->coll_devs)
    g_ptr_array_free(tg->coll_devs, TRUE);
  g_free(tg);
}

int sim_taskgraph_block_new(SimTaskGraph *tg)
{
  tg->dirty = TRUE;
  /* Where blocks are laid out in an order of their own (a lowering that reuses blocks sets
   * it, and sets it again after each build), a block made later joins it, last: a block
   * left out of the order would never be assembled.  Freed slots are looked for only
   * where some are (a lowering makes tens of thousands of blocks and frees none). */
  for (guint i = 0; tg->n_dead > 0 && i < tg->blocks->len; i++) {
    SimTaskBlock *b = tg->blocks->pdata[i];
    if (!b->live) {
      tg->n_dead--;
      b->live = TRUE;
      b->changed = TRUE;
      gboolean listed = FALSE;
      for (guint o = 0; tg->order && o < tg->order->len && !listed; o++)
        listed = g_array_index(tg->order, int, o) == (int)i;
      if (tg->order && !listed)
        g_array_append_val(tg->order, i);
      return (int)i;
    }
  }
  SimTaskBlock *b = g_new0(SimTaskBlock, 1);
  block_arrays_new(b);
  b->sem = g_array_new(FALSE, FALSE, sizeof(SimTaskSem));
  b->live = TRUE;
  b->changed = TRUE;
  b->shared = tg->sharing;
  b->sh_start = -1;
  g_ptr_array_add(tg->blocks, b);
  int id = (int)tg->blocks->len - 1;
  if (tg->order)
    g_array_append_val(tg->order, id);
  return id;
}

void sim_taskgraph_release_blocks(SimTaskGraph *tg)
{
  for (guint i = 0; i < tg->blocks->len; i++) {
    SimTaskBlock *b = tg->blocks->pdata[i];
    b->shared = FALSE;
    b->sh_start = -1;
    b->sh_len = 0;
    sem_clear(b);
    g_array_free(b->tasks, TRUE);
    g_array_free(b->edges, TRUE);
    g_array_free(b->stream, TRUE);
    g_array_free(b->extra, TRUE);
    block_arrays_new(b);
  }
  free_sorted(tg);
}

void sim_taskgraph_block_clear(SimTaskGraph *tg, int block)
{
  SimTaskBlock *b = sim_taskgraph_block(tg, block);
  if (b->shared && b->sh_len)
    tasks_unshare(tg);
  g_array_set_size(b->tasks, 0);
  g_array_set_size(b->edges, 0);
  g_array_set_size(b->stream, 0);
  g_array_set_size(b->extra, 0);
  memset(b->ring, 0, sizeof b->ring);
  sem_clear(b);
  b->changed = TRUE;
  tg->dirty = TRUE;
}

void sim_taskgraph_block_free(SimTaskGraph *tg, int block)
{
  sim_taskgraph_block_clear(tg, block);
  SimTaskBlock *b = sim_taskgraph_block(tg, block);
  tg->n_dead += b->live;
  b->live = FALSE;
}

/* Room for @n more elements in @a, without changing its length. */
static void array_reserve(GArray *a, guint n)
{
  guint len = a->len;
  g_array_set_size(a, len + n);
  g_array_set_size(a, len);
}

void sim_taskgraph_block_reserve(SimTaskGraph *tg, int block, int n_tasks, int n_edges,
                                 int n_stream)
{
  SimTaskBlock *b = sim_taskgraph_block(tg, block);
  if (b->shared)
    shared_reserve(tg, (size_t)n_tasks);
  else
    array_reserve(b->tasks, (guint)n_tasks);
  array_reserve(b->edges, (guint)n_edges);
  array_reserve(b->stream, (guint)n_stream);
}

SimTaskRef sim_taskgraph_add(SimTaskGraph *tg, int block, const SimTask *t)
{
  SimTaskBlock *b = sim_taskgraph_block(tg, block);
  /* Shared tasks handed over to the flat array have left their blocks. */
  g_assert(!tg->task_mapped);
  b->changed = TRUE;
  tg->dirty = TRUE;
  if (b->shared) {
    /* A block's tasks stay together: a block starts at the end of the mapping, and only
     * the one whose tasks end it grows. */
    if (b->sh_start < 0)
      b->sh_start = (int64_t)tg->n_shared;
    if ((size_t)(b->sh_start + b->sh_len) == tg->n_shared) {
      shared_reserve(tg, 1);
      tg->shared[tg->n_shared++] = *t;
      return (SimTaskRef){ block, b->sh_len++ };
    }
    tasks_unshare(tg);
  }
  g_array_append_val(b->tasks, *t);
  return (SimTaskRef){ block, (int32_t)b->tasks->len - 1 };
}

void sim_taskgraph_depend(SimTaskGraph *tg, int block, SimTaskRef from, SimTaskRef to)
{
  SimTaskBlock *b = sim_taskgraph_block(tg, block);
  SimTaskEdge e = { from, to };
  g_array_append_val(b->edges, e);
  tg->dirty = TRUE;
}

void sim_taskgraph_stream_add(SimTaskGraph *tg, int block, int device, uint64_t key, int index)
{
  SimTaskBlock *b = sim_taskgraph_block(tg, block);
  SimStreamEntry e = { key, device, index };
  g_array_append_val(b->stream, e);
  tg->dirty = TRUE;
}

/* A collective's flow over @n_links links, whose links and then members are appended to
 * @b's extra array next. */
static SimTask collective_flow(const SimTaskBlock *b, SimTaskClass cls, const int *members,
                               int n, int n_links, double bytes, double latency, int op, int mb,
                               int coll)
{
  SimTask t = sim_task_flow(cls, members[0], members[n > 1 ? 1 : 0], bytes, op, mb);
  t.duration = latency;
  t.coll = coll;
  t.links_off = (int32_t)b->extra->len;
  t.n_links = (uint16_t)n_links;
  t.n_members = (uint16_t)n;
  return t;
}

SimTaskRef sim_taskgraph_add_collective_flow(SimTaskGraph *tg, int block, SimTaskClass cls,
                                             const int *links, int n_links, const int *members,
                                             int n, double bytes, double latency, int op, int mb,
                                             int coll)
{
  SimTaskBlock *b = sim_taskgraph_block(tg, block);
  SimTask t = collective_flow(b, cls, members, n, n_links, bytes, latency, op, mb, coll);
  g_array_append_vals(b->extra, links, (guint)n_links);
  g_array_append_vals(b->extra, members, (guint)n);
  return sim_taskgraph_add(tg, block, &t);
}

SimTaskRef sim_taskgraph_add_ring_flow(SimTaskGraph *tg, int block, SimTaskClass cls,
                                       SimMachine *m, const int *members, int n, double bytes,
                                       double latency, int op, int mb, int coll)
{
  SimTaskBlock *b = sim_taskgraph_block(tg, block);
  /* A group's collectives repeat (a tensor-parallel reduction in every micro-batch, over
   * a few channels whose rings are rotations of each other): a ring over the members of
   * one of the block's last distinct rings shares its links and members. */
  for (int k = 0; k < SIM_BLOCK_RINGS; k++) {
    int32_t off = b->ring[k].off, nl = b->ring[k].links;
    if (b->ring[k].n != n || n <= 0 ||
        memcmp(&g_array_index(b->extra, int32_t, off + nl), members, sizeof(int32_t) * (size_t)n))
      continue;
    SimTask t = collective_flow(b, cls, members, n, nl, bytes, latency, op, mb, coll);
    t.links_off = off;
    return sim_taskgraph_add(tg, block, &t);
  }
  int total = 0;
  for (int i = 0; i < n; i++) {
    int hops;
    sim_machine_route(m, members[i], members[(i + 1) % n], &hops);
    total += hops;
  }
  SimTask t = collective_flow(b, cls, members, n, total, bytes, latency, op, mb, coll);
  b->ring[b->ring_next].off = t.links_off;
  b->ring[b->ring_next].links = total;
  b->ring[b->ring_next].n = n;
  b->ring_next = (b->ring_next + 1) % SIM_BLOCK_RINGS;
  /* The routes, one after the other, then the members, written in place. */
  g_array_set_size(b->extra, b->extra->len + (guint)total + (guint)n);
  int32_t *out = &g_array_index(b->extra, int32_t, t.links_off);
  for (int i = 0; i < n; i++) {
    int hops;
    const int *r = sim_machine_route(m, members[i], members[(i + 1) % n], &hops);
    memcpy(out, r, sizeof(int32_t) * (size_t)hops);
    out += hops;
  }
  memcpy(out, members, sizeof(int32_t) * (size_t)n);
  return sim_taskgraph_add(tg, block, &t);
}

void sim_taskgraph_sem_add(SimTaskGraph *tg, int block, const SimTaskSem *sem)
{
  g_array_append_val(sim_taskgraph_block(tg, block)->sem, *sem);
}

SimTask sim_task_compute(SimTaskClass cls, int device, int op, int shard, int mb,
                         double duration)
{
  return (SimTask){ .kind = SIM_TASK_COMPUTE, .cls = cls, .device = device, .peer = -1,
                    .op = op, .shard = shard, .mb = mb, .duration = duration };
}

SimTask sim_task_flow(SimTaskClass cls, int src, int dst, double bytes, int op, int mb)
{
  return (SimTask){ .kind = SIM_TASK_FLOW, .cls = cls, .device = src, .peer = dst, .op = op,
                    .shard = -1, .mb = mb, .bytes = bytes, .coll = -1 };
}

SimTask sim_task_delay(SimTaskClass cls, int device, double duration)
{
  return (SimTask){ .kind = SIM_TASK_DELAY, .cls = cls, .device = device, .peer = -1,
                    .op = -1, .shard = -1, .mb = -1, .duration = duration };
}

SimTask sim_task_nop(void)
{
  return (SimTask){ .kind = SIM_TASK_NOP, .cls = SIM_CLASS_TRANSFER, .device = -1, .peer = -1,
                    .op = -1, .shard = -1, .mb = -1 };
}

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

void sim_taskgraph_assemble(SimTaskGraph *tg)
{
  /* Shared tasks handed over to the flat array have left their blocks. */
  g_return_if_fail(!tg->task_mapped);
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
    tasks_unshare(tg);
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
  /* Successor lists in CSR form: count, prefix-sum, fill, in dense arrays.  Edges are
   * filled in block order, so the successor order is deterministic. */
  tg->succ = grow(tg->succ, &tg->cap_succ, (size_t)n_edges, sizeof(int32_t));
  int32_t *boff = g_new(int32_t, MAX(tg->blocks->len, 1));
  for (guint i = 0; i < tg->blocks->len; i++)
    boff[i] = ((SimTaskBlock *)tg->blocks->pdata[i])->offset;
  /* Dense passes first (counts, offsets, roots, the fill); then one pass over the tasks
   * writes what they keep and finds the heads of groups: the task array, 80 bytes a
   * task, is the costly thing to walk. */
  int32_t *count = g_new0(int32_t, MAX(n, 1));
  int32_t *soff = g_new(int32_t, (size_t)n + 1);
  memset(tg->n_pred, 0, (size_t)n * sizeof(int32_t));
  edges_pass(tg, n_blocks, boff, count, FALSE);
  int n_roots = 0;
  int32_t off = 0;
  for (int t = 0; t < n; t++) {
    n_roots += tg->n_pred[t] == 0;
    soff[t] = off;
    off += count[t];
    count[t] = soff[t];
  }
  soff[n] = off;
  tg->roots = grow(tg->roots, &tg->cap_roots, (size_t)n_roots, sizeof(int32_t));
  tg->n_roots = 0;
  for (int t = 0; t < n; t++)
    if (tg->n_pred[t] == 0)
      tg->roots[tg->n_roots++] = t;
  tg->n_succ_total = n_edges;
  edges_pass(tg, n_blocks, boff, count, TRUE);
  g_free(count);
  g_free(boff);

  /* Groups of flows: every successor of a join point or delay is a flow that waits for it
   * alone and releases one task, the same for all. */
  const int32_t *np = tg->n_pred, *succ = tg->succ;
  for (int t = 0; t < n; t++) {
    SimTask *j = &tg->task[t];
    int32_t ns = soff[t + 1] - soff[t];
    j->n_succ = ns;
    j->succ_off = soff[t];
    gboolean head = (j->kind == SIM_TASK_NOP || j->kind == SIM_TASK_DELAY) && ns > 0;
    int32_t sink = -1;
    for (int k = 0; head && k < ns; k++) {
      int32_t s = succ[soff[t] + k];
      const SimTask *f = &tg->task[s];
      head = f->kind == SIM_TASK_FLOW && np[s] == 1 && soff[s + 1] - soff[s] == 1 &&
             (f->n_links > 0 || (f->device != f->peer && f->bytes > 0)) &&
             (sink < 0 || succ[soff[s]] == sink);
      if (head)
        sink = succ[soff[s]];
    }
    tg->group_head[t] = head;
  }
  g_free(soff);

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
}

/* ---- rings as one flow ------------------------------------------------------------- */

#define RING_MAX 64

typedef struct {
  int32_t head, key; /* read as an array of two */
} RingCand;

/* A collective's ring phase lowered as one flow per rank (SIM_DETAIL_FLOWS) runs as the
 * whole ring's one flow (what SIM_DETAIL_COLLECTIVE lowers) when that is exact: the ranks'
 * flows start together (one join point releases them, and they release one task), carry
 * the same bytes after the same latency, over routes whose links are all distinct, of one
 * capacity, and no other flow of the graph crosses those links but the flows of rings over
 * the same ranks in the same order, which are all merged too.  Each link then carries one
 * flow of every ring under way, so every rank's flow moves at the rate the whole ring's
 * flow does, and ends when it ends.  Marks the flows that go in @gone (the first of each
 * ring becomes the whole flow, the task its flows released waits for it alone); returns
 * how many went. */
static int merge_rings(SimTaskGraph *tg, SimMachine *m, const SimCollParams *cp, uint8_t *gone)
{
  int n = tg->n_tasks, nl = sim_machine_n_links(m);
  SimTask *task = tg->task;
  const int32_t *succ = tg->succ;
  SimKeyIndex sigs;
  sim_key_index_init(&sigs, RING_MAX * sizeof(int32_t));
  int32_t *owner = g_new(int32_t, MAX(nl, 1)); /* -1 free, >= 0 a ring's key, -2 shared */
  int32_t *stamp = g_new0(int32_t, MAX(nl, 1));
  for (int l = 0; l < nl; l++)
    owner[l] = -1;
  GArray *cand = g_array_new(FALSE, FALSE, sizeof(RingCand));
  uint8_t *member = sim_large_alloc((size_t)n);
  memset(member, 0, (size_t)n);
  int32_t key[RING_MAX], next[RING_MAX];
  int32_t st = 0;
  for (int h = 0; h < n; h++) {
    if (!tg->group_head[h])
      continue;
    const SimTask *ht = &task[h];
    int k = ht->n_succ;
    const int32_t *mem = succ + ht->succ_off;
    if (k < 2 || k > RING_MAX)
      continue;
    const SimTask *f0 = &task[mem[0]];
    const SimRoute *r0 = f0->n_links ? NULL : sim_machine_route_info(m, f0->device, f0->peer);
    gboolean ok = r0 != NULL && r0->n_links > 0;
    double cap = ok ? sim_coll_link_capacity(m, cp, r0->links[0]) : 0;
    st++;
    for (int i = 0; ok && i < k; i++) {
      const SimTask *f = &task[mem[i]];
      const SimRoute *r = f->n_links ? NULL : sim_machine_route_info(m, f->device, f->peer);
      ok = r && f->cls != SIM_CLASS_TRANSFER && f->bytes == f0->bytes &&
           f->duration == f0->duration && f->cls == f0->cls &&
           f->coll == f0->coll && r->latency == r0->latency && r->n_links > 0;
      for (int j = 0; ok && j < r->n_links; j++) {
        int l = r->links[j];
        ok = stamp[l] != st && sim_coll_link_capacity(m, cp, l) == cap;
        stamp[l] = st;
      }
      /* The ring: each rank sends to the next, every rank once. */
      for (int j = 0; ok && j < i; j++)
        ok = task[mem[j]].device != f->device && task[mem[j]].peer != f->peer;
    }
    if (!ok)
      continue;
    /* Follow the ring from its smallest device: its key, the devices in ring order. */
    int lo = 0;
    for (int i = 0; i < k; i++) {
      if (task[mem[i]].device < task[mem[lo]].device)
        lo = i;
      next[i] = -1;
      for (int j = 0; j < k; j++)
        if (task[mem[j]].device == task[mem[i]].peer)
          next[i] = j;
      ok = ok && next[i] >= 0;
    }
    int at = lo, len = 0;
    while (ok && len < k) {
      key[len++] = task[mem[at]].device;
      at = next[at];
      ok = at != lo || len == k;
    }
    if (!ok || at != lo)
      continue;
    for (int i = k; i < RING_MAX; i++)
      key[i] = -1;
    gboolean added;
    int32_t id = (int32_t)sim_key_index_get(&sigs, key, &added);
    RingCand c = { h, id };
    g_array_append_val(cand, c);
    for (int i = 0; i < k; i++) {
      member[mem[i]] = 1;
      const SimRoute *r = sim_machine_route_info(m, task[mem[i]].device, task[mem[i]].peer);
      for (int j = 0; j < r->n_links; j++) {
        int l = r->links[j];
        owner[l] = owner[l] == -1 || owner[l] == id ? id : -2;
      }
    }
  }
  g_free(stamp);
  int gone_n = 0;
  if (cand->len) {
    /* Every other flow's links are shared. */
    for (int t = 0; t < n; t++) {
      const SimTask *f = &task[t];
      if (f->kind != SIM_TASK_FLOW || member[t])
        continue;
      if (f->n_links) {
        const int32_t *links = tg->extra + f->links_off;
        for (int j = 0; j < f->n_links; j++)
          owner[links[j]] = -2;
      } else if (f->device != f->peer) {
        const SimRoute *r = sim_machine_route_info(m, f->device, f->peer);
        for (int j = 0; j < r->n_links; j++)
          owner[r->links[j]] = -2;
      }
    }
    /* The rings whose links are all their own, and room in extra for each key's links
     * and members once. */
    int n_keys = (int)sigs.n;
    int32_t *seg = g_new(int32_t, MAX(n_keys, 1));
    for (int i = 0; i < n_keys; i++)
      seg[i] = -1;
    size_t base = tg->cap_extra, add = 0;
    GArray *keep = g_array_new(FALSE, FALSE, sizeof(RingCand));
    for (guint c = 0; c < cand->len; c++) {
      const int32_t *cd = &g_array_index(cand, RingCand, c).head;
      const SimTask *ht = &task[cd[0]];
      const int32_t *mem = succ + ht->succ_off;
      gboolean ok = TRUE;
      for (int i = 0; ok && i < ht->n_succ; i++) {
        const SimRoute *r = sim_machine_route_info(m, task[mem[i]].device, task[mem[i]].peer);
        for (int j = 0; ok && j < r->n_links; j++)
          ok = owner[r->links[j]] == cd[1];
      }
      if (!ok)
        continue;
      g_array_append_vals(keep, cd, 1);
      if (seg[cd[1]] < 0) {
        seg[cd[1]] = (int32_t)(base + add);
        for (int i = 0; i < ht->n_succ; i++)
          add += (size_t)sim_machine_route_info(m, task[mem[i]].device, task[mem[i]].peer)->n_links;
        add += (size_t)ht->n_succ;
      }
    }
    if (keep->len) {
      int32_t *extra = sim_large_alloc((base + add) * sizeof(int32_t));
      if (base)
        memcpy(extra, tg->extra, base * sizeof(int32_t));
      for (int i = 0; i < n_keys; i++)
        seg[i] = -1 - seg[i]; /* not written yet */
      for (guint c = 0; c < keep->len; c++) {
        const int32_t *cd = &g_array_index(keep, RingCand, c).head;
        SimTask *ht = &task[cd[0]];
        const int32_t *mem = succ + ht->succ_off;
        int k = ht->n_succ;
        int32_t off = seg[cd[1]] < 0 ? -1 - seg[cd[1]] : seg[cd[1]];
        int32_t n_links = 0;
        /* The links in ring order, from the key's first device. */
        const int32_t *kd = (const int32_t *)(void *)(sigs.keys + (size_t)cd[1] * sigs.key_size);
        for (int i = 0; i < k; i++) {
          const SimRoute *r = sim_machine_route_info(m, kd[i], kd[(i + 1) % k]);
          if (seg[cd[1]] < 0)
            memcpy(extra + off + n_links, r->links, (size_t)r->n_links * sizeof(int32_t));
          n_links += r->n_links;
        }
        if (seg[cd[1]] < 0) {
          memcpy(extra + off + n_links, kd, (size_t)k * sizeof(int32_t));
          seg[cd[1]] = off;
        }
        /* The first flow becomes the ring's; the others go, and the task they released
         * waits for it alone. */
        SimTask *f = &task[mem[0]];
        double lat = sim_machine_route_info(m, f->device, f->peer)->latency;
        f->n_links = (uint16_t)n_links;
        f->n_members = (uint16_t)k;
        f->links_off = off;
        f->duration += lat;
        f->device = kd[0];
        f->peer = kd[1 % k];
        int32_t sink = task[mem[0]].n_succ ? succ[task[mem[0]].succ_off] : -1;
        for (int i = 1; i < k; i++) {
          gone[mem[i]] = 1;
          gone_n++;
        }
        if (sink >= 0)
          tg->n_pred[sink] -= k - 1;
        tg->group_head[cd[0]] = 0;
      }
      g_free(tg->extra);
      tg->extra = extra;
      tg->cap_extra = base + add;
    }
    g_array_free(keep, TRUE);
    g_free(seg);
  }
  g_free(member);
  g_free(owner);
  g_array_free(cand, TRUE);
  sim_key_index_free(&sigs);
  return gone_n;
}

gboolean sim_taskgraph_rings_private(const SimTaskGraph *tg, SimMachine *m)
{
  int n = tg->n_tasks, nl = sim_machine_n_links(m);
  const SimTask *task = tg->task;
  int32_t *owner = g_new(int32_t, MAX(nl, 1)); /* -1 free, >= 0 a ring's key, -2 shared */
  for (int l = 0; l < nl; l++)
    owner[l] = -1;
  SimKeyIndex sigs;
  sim_key_index_init(&sigs, RING_MAX * sizeof(int32_t));
  int32_t key[RING_MAX];
  gboolean any = FALSE;
  /* Each whole flow's key: its members in ring order from the smallest. */
  for (int t = 0; t < n; t++) {
    const SimTask *f = &task[t];
    if (f->kind != SIM_TASK_FLOW)
      continue;
    int32_t id = -2;
    const int32_t *links = NULL;
    int n_links = 0;
    if (f->n_links) {
      any = TRUE;
      links = tg->extra + f->links_off;
      n_links = f->n_links;
      int k = f->n_members;
      if (k <= RING_MAX) {
        const int32_t *mem = links + n_links;
        int lo = 0;
        for (int i = 1; i < k; i++)
          if (mem[i] < mem[lo])
            lo = i;
        for (int i = 0; i < RING_MAX; i++)
          key[i] = i < k ? mem[(lo + i) % k] : -1;
        gboolean added;
        id = (int32_t)sim_key_index_get(&sigs, key, &added);
      }
    } else if (f->device != f->peer) {
      const SimRoute *r = sim_machine_route_info(m, f->device, f->peer);
      links = r->links;
      n_links = r->n_links;
    }
    for (int j = 0; j < n_links; j++) {
      int l = links[j];
      owner[l] = id >= 0 && (owner[l] == -1 || owner[l] == id) ? id : -2;
    }
  }
  gboolean ok = TRUE;
  for (int t = 0; any && ok && t < n; t++) {
    const SimTask *f = &task[t];
    if (f->kind != SIM_TASK_FLOW || !f->n_links)
      continue;
    const int32_t *links = tg->extra + f->links_off;
    for (int j = 0; ok && j < f->n_links; j++)
      ok = owner[links[j]] >= 0;
  }
  sim_key_index_free(&sigs);
  g_free(owner);
  return ok;
}

/* ---- chains of compute tasks -------------------------------------------------------- */

/* Two steps, both exact for the engine's timeline while the host never holds a kernel
 * back (no host times, no blocking sends: see simulate.c).
 *
 * Implied edges go: a compute task's dependency on an earlier task of its own stream
 * (a backward on its forward, a residual's add on the layer's input) is already kept by
 * the stream, which starts a task only after the one before it has ended; without the
 * edge the task may be ready sooner, but it starts when the stream reaches it, as before.
 *
 * Then a run of compute tasks that follow each other on a stream, where every task but
 * the last has no successor left and every task but the first waits for nothing, runs as
 * one task of their summed duration: the engine starts each at the instant the one
 * before ends.  The memory the run takes is charged at its start with the most it needs
 * at any of its tasks' starts (a device's memory changes only as its own stream's tasks
 * start and end), and what it keeps, at its end.  Runs keep to one class and one
 * micro-batch, so that reports (time by class on the critical path, compute per device)
 * stay what they were. */
int sim_taskgraph_merge_chains(SimTaskGraph *tg, gboolean chains, gboolean keep_steps,
                               SimMachine *m, const SimCollParams *cp)
{
  int n = tg->n_tasks, nd = tg->n_devices;
  if (n == 0)
    return 0;
  SimTask *task = tg->task;
  int32_t *succ = tg->succ;
  uint8_t *gone = sim_large_alloc((size_t)n);
  memset(gone, 0, (size_t)n);
  int n_rings = m ? merge_rings(tg, m, cp, gone) : 0;
  succ = tg->succ;
  /* Stream positions; the edges that go are marked -1, those that stay counted per task. */
  int32_t *pos = sim_large_alloc((size_t)n * sizeof(int32_t));
  memset(pos, 0xff, (size_t)n * sizeof(int32_t));
  for (int32_t k = 0; k < tg->stream_off[nd]; k++)
    pos[tg->stream[k]] = k;
#define IMPLIED(u, v) (pos[u] >= 0 && pos[v] > pos[u] && task[u].device == task[v].device)
  int32_t *n_out = sim_large_alloc((size_t)n * sizeof(int32_t));
  size_t n_dropped = 0;
  for (int u = 0; u < n; u++) {
    int32_t *su = succ + task[u].succ_off;
    int32_t kept = 0;
    for (int k = 0; k < task[u].n_succ; k++) {
      if (IMPLIED(u, su[k])) {
        tg->n_pred[su[k]]--;
        su[k] = -1;
        n_dropped++;
      } else {
        kept++;
      }
    }
    n_out[u] = kept;
  }
#undef IMPLIED
  int merged = 0;
  GArray *steps = keep_steps ? g_array_new(FALSE, FALSE, sizeof(SimChainStep)) : NULL;
  GArray *durs = g_array_new(FALSE, FALSE, sizeof(double));
  for (int d = 0; d < nd; d++) {
    int32_t lo = tg->stream_off[d], hi = tg->stream_off[d + 1];
    int32_t head = -1, tail = -1;
    double dur = 0;
    int64_t peak = 0, net = 0; /* bytes above the run's start: the most, and at its end */
    uint32_t kernels = 0;
    int32_t first_step = -1;
    for (int32_t k = lo; k <= hi; k++) {
      int32_t t = k < hi ? tg->stream[k] : -1;
      const SimTask *c = t >= 0 ? &task[t] : NULL;
      gboolean joins = chains && c && tail >= 0 && n_out[tail] == 0 && tg->n_pred[t] == 0 &&
                       c->cls == task[head].cls && c->mb == task[head].mb;
      if (joins) {
        if (tail == head) {
          first_step = (int32_t)durs->len;
          g_array_append_val(durs, task[head].duration);
        }
        g_array_append_val(durs, c->duration);
        if (steps) {
          if (tail == head) {
            g_assert(steps->len == durs->len - 2);
            SimChainStep first = { 0, task[head].mem_alloc, task[head].mem_free, 0 };
            g_array_append_val(steps, first);
          }
          SimChainStep st = { dur, c->mem_alloc, c->mem_free, 0 };
          g_array_append_val(steps, st);
        }
        peak = MAX(peak, net + c->mem_alloc);
        net += c->mem_alloc - c->mem_free;
        dur += c->duration;
        kernels += c->n_kernels;
        gone[t] = 1;
        merged++;
        tail = t;
        continue;
      }
      if (head >= 0 && tail != head) {
        /* The run's successors are its last task's: the head takes them over below. */
        SimTask *h = &task[head];
        h->duration = dur;
        h->mem_alloc = peak;
        h->mem_free = peak - net;
        h->n_kernels = (uint16_t)MIN(kernels, G_MAXUINT16);
        h->succ_off = task[tail].succ_off;
        h->n_succ = task[tail].n_succ;
        n_out[head] = n_out[tail];
        h->peer = first_step;
        double *lastd = &g_array_index(durs, double, durs->len - 1);
        *lastd = -*lastd;
        if (*lastd == 0)
          *lastd = -0.0;
        if (steps)
          g_array_index(steps, SimChainStep, steps->len - 1).last = 1;
      }
      head = tail = c ? t : -1;
      if (c) {
        dur = c->duration;
        peak = c->mem_alloc;
        net = c->mem_alloc - c->mem_free;
        kernels = c->n_kernels;
      }
    }
  }
  if (!merged && !n_dropped && !n_rings) {
    if (steps)
      g_array_free(steps, TRUE);
    g_array_free(durs, TRUE);
    g_free(pos);
    g_free(n_out);
    g_free(gone);
    return 0;
  }
  /* New ids in the old order; the successor lists rebuilt with them and without the
   * implied edges.  A merged task's only predecessor was the one before it, which is
   * merged too or the head, so no list that stays names a merged task. */
  int32_t *map = sim_large_alloc((size_t)n * sizeof(int32_t));
  int m_ = 0;
  size_t n_succ = 0;
  for (int t = 0; t < n; t++) {
    map[t] = gone[t] ? -1 : m_++;
    if (!gone[t])
      n_succ += (size_t)n_out[t];
  }
  int32_t *nsucc = sim_large_alloc(MAX(n_succ, 1) * sizeof(int32_t));
  int32_t off = 0;
  for (int t = 0; t < n; t++) {
    if (gone[t])
      continue;
    SimTask x = task[t];
    /* A run's list is its last task's. */
    const int32_t *su = succ + x.succ_off;
    int32_t kept = 0;
    for (int k = 0; k < x.n_succ; k++) {
      int32_t v = su[k];
      if (v < 0 || gone[v])
        continue; /* an implied edge, or a ring's flow that its whole flow replaces */
      nsucc[off + kept++] = map[v];
    }
    x.succ_off = off;
    x.n_succ = kept;
    off += kept;
    int32_t i = map[t];
    task[i] = x;
    tg->n_pred[i] = tg->n_pred[t];
    tg->group_head[i] = tg->group_head[t];
  }
  g_free(tg->succ);
  tg->succ = nsucc;
  tg->cap_succ = MAX(n_succ, 1);
  tg->n_succ_total = (int)n_succ;
  int32_t w = 0;
  for (int d = 0; d < nd; d++) {
    int32_t lo = tg->stream_off[d], hi = tg->stream_off[d + 1];
    tg->stream_off[d] = w;
    for (int32_t k = lo; k < hi; k++)
      if (!gone[tg->stream[k]])
        tg->stream[w++] = map[tg->stream[k]];
  }
  tg->stream_off[nd] = w;
  tg->n_tasks = m_;
  tg->n_succ_total = (int)off;
  /* Tasks whose only predecessors were earlier on their stream now wait for nothing. */
  int n_roots = 0;
  for (int t = 0; t < m_; t++)
    n_roots += tg->n_pred[t] == 0;
  if ((size_t)n_roots > tg->cap_roots) {
    g_free(tg->roots);
    tg->roots = g_new(int32_t, n_roots);
    tg->cap_roots = (size_t)n_roots;
  }
  tg->n_roots = 0;
  for (int t = 0; t < m_; t++)
    if (tg->n_pred[t] == 0)
      tg->roots[tg->n_roots++] = t;
  g_free(map);
  g_free(pos);
  g_free(n_out);
  g_free(gone);
  g_free(tg->chain_dur);
  tg->n_chain_dur = durs->len;
  tg->chain_dur = (double *)(void *)g_array_free(durs, FALSE);
  if (steps) {
    g_free(tg->chain);
    tg->n_chain = steps->len;
    tg->chain = (SimChainStep *)(void *)g_array_free(steps, FALSE);
  }
  return merged + n_rings;
}
