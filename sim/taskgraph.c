/* taskgraph.c — blocks of tasks: their lifetime, the tasks, edges, streams and semaphores
 * added to them, and the tasks shared through one mapping.  Their assembly is in
 * taskgraph-assemble.c, the exact accelerations of an assembled graph in
 * taskgraph-merge.c. */
#include "taskgraph.h"
#include "base.h"

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
void sim_taskgraph_unshare_tasks(SimTaskGraph *tg)
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
  tg->host_mem = g_new0(int64_t, n_devices);
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
  g_free(b->ring);
  g_free(b->ring_table);
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
  g_clear_pointer(&b->ring, g_free);
  g_clear_pointer(&b->ring_table, g_free);
  b->n_ring = b->cap_ring = 0;
  b->ring_mask = 0;
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
  g_free(tg->host_mem);
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
  g_free(tg->chain_ring);
  g_free(tg->rings);
  g_free(tg->stream_off);
  free_sorted(tg);
  if (tg->coll_devs)
    g_ptr_array_free(tg->coll_devs, TRUE);
  g_free(tg->coll_last);
  g_free(tg->watch);
  if (tg->step_links)
    g_array_free(tg->step_links, TRUE);
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
    sim_taskgraph_unshare_tasks(tg);
  g_array_set_size(b->tasks, 0);
  g_array_set_size(b->edges, 0);
  g_array_set_size(b->stream, 0);
  g_array_set_size(b->extra, 0);
  if (b->ring_table)
    memset(b->ring_table, 0, sizeof(int32_t) * ((size_t)b->ring_mask + 1));
  b->n_ring = 0;
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
    sim_taskgraph_unshare_tasks(tg);
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

/* The slot of @b's ring table where the ring over @members is, or the empty slot where it
 * would go. */
static guint ring_slot(const SimTaskBlock *b, const int *members, int n)
{
  uint64_t h = sim_hash_bytes(members, sizeof(int32_t) * (size_t)n);
  guint s = (guint)(h ^ (h >> 29)) & b->ring_mask;
  const int32_t *extra = (const int32_t *)(const void *)b->extra->data;
  for (;;) {
    int32_t e = b->ring_table[s];
    if (e == 0)
      return s;
    const SimBlockRing *r = &b->ring[e - 1];
    if (r->n == n && r->first == members[0] &&
        !memcmp(extra + r->off + r->links, members, sizeof(int32_t) * (size_t)n))
      return s;
    s = (s + 1) & b->ring_mask;
  }
}

int sim_taskgraph_ring_find(SimTaskGraph *tg, int block, const int *members, int n)
{
  const SimTaskBlock *b = sim_taskgraph_block(tg, block);
  if (n <= 0 || !b->ring_table)
    return -1;
  return b->ring_table[ring_slot(b, members, n)] - 1;
}

/* Notes @b's ring @k, over @members, in its table (which grows to stay at most half
 * full). */
static void ring_insert(SimTaskBlock *b, int k, const int *members, int n)
{
  if (!b->ring_table || 2 * (guint)(b->n_ring + 1) > b->ring_mask + 1) {
    guint size = b->ring_table ? 2 * (b->ring_mask + 1) : 64;
    g_free(b->ring_table);
    b->ring_table = g_new0(int32_t, size);
    b->ring_mask = size - 1;
    const int32_t *extra = (const int32_t *)(const void *)b->extra->data;
    for (int j = 0; j < k; j++) {
      const SimBlockRing *r = &b->ring[j];
      b->ring_table[ring_slot(b, extra + r->off + r->links, r->n)] = j + 1;
    }
  }
  b->ring_table[ring_slot(b, members, n)] = k + 1;
}

SimTaskRef sim_taskgraph_add_ring_flow(SimTaskGraph *tg, int block, SimTaskClass cls,
                                       const SimMachine *m, const int *members, int n, double bytes,
                                       double latency, int op, int mb, int coll)
{
  SimTaskBlock *b = sim_taskgraph_block(tg, block);
  /* A group's collectives repeat (a tensor-parallel reduction in every micro-batch, over
   * a few channels whose rings are rotations of each other): a ring over the members of
   * one of the block's distinct rings shares its links and members. */
  int k = sim_taskgraph_ring_find(tg, block, members, n);
  if (k >= 0) {
    SimTask t = collective_flow(b, cls, members, n, b->ring[k].links, bytes, latency, op, mb,
                                coll);
    t.links_off = b->ring[k].off;
    return sim_taskgraph_add(tg, block, &t);
  }
  int total = 0;
  for (int i = 0; i < n; i++) {
    int hops;
    sim_machine_route(m, members[i], members[(i + 1) % n], &hops);
    total += hops;
  }
  SimTask t = collective_flow(b, cls, members, n, total, bytes, latency, op, mb, coll);
  if (b->n_ring == b->cap_ring) {
    b->cap_ring = MAX(2 * b->cap_ring, 16);
    b->ring = g_renew(SimBlockRing, b->ring, b->cap_ring);
  }
  k = b->n_ring++;
  b->ring[k] = (SimBlockRing){ t.links_off, total, n, n > 0 ? members[0] : -1, FALSE, 0 };
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
  if (n > 0)
    ring_insert(b, k, members, n);
  return sim_taskgraph_add(tg, block, &t);
}

const int32_t *sim_taskgraph_flow_links(const SimTaskGraph *tg, const SimMachine *m,
                                        const SimTask *f, int *k)
{
  if (f->n_links) {
    *k = f->n_links;
    return sim_task_links(tg, f);
  }
  if (f->device == f->peer) {
    *k = 0;
    return NULL;
  }
  const SimRoute *r = sim_machine_route_info(m, f->device, f->peer);
  *k = r->n_links;
  return r->links;
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
