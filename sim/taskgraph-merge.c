/* taskgraph-merge.c — the exact accelerations of an assembled task graph: a collective's
 * ring phase lowered as one flow per rank run as the ring's one flow where that is exact
 * (SimOptions.merge_rings), and chains of compute tasks merged into one task
 * (SimOptions.merge_chains). */
#include "taskgraph.h"
#include "collective.h"
#include "network.h"
#include "base.h"

#include <math.h>
#include <string.h>

#define RING_MAX 64

/* Whether the merging is to stop (SimTaskGraph.cancel), asked at every 65,536th @i of a
 * pass: an atomic load each time, where 65,536 tasks are a millisecond's work or less. */
static inline gboolean cancelled(const SimTaskGraph *tg, int64_t i)
{
  return (i & 0xffff) == 0 && sim_taskgraph_cancelled(tg);
}

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
 * how many went, or -1 where SimTaskGraph.cancel stopped it (the graph is then only to be
 * freed). */
static int merge_rings(SimTaskGraph *tg, const SimMachine *m, const SimCollParams *cp,
                       uint8_t *gone)
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
  gboolean stop = FALSE;
  for (int h = 0; h < n && !stop; h++) {
    if ((stop = cancelled(tg, h)))
      break;
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
  if (cand->len && !stop) {
    /* Every other flow's links are shared. */
    for (int t = 0; t < n && !stop; t++) {
      if ((stop = cancelled(tg, t)))
        break;
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
    if (keep->len && !stop) {
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
  return stop ? -1 : gone_n;
}

gboolean sim_taskgraph_rings_private(const SimTaskGraph *tg, const SimMachine *m)
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
  /* Whole flows share their links and members with the block's earlier flows of the same
   * ring (sim_taskgraph_add_ring_flow()): one whose list was seen lately changes nothing
   * below.  Entries by list offset; -1: none. */
  enum { SEEN = 256 };
  int32_t seen[SEEN];
  memset(seen, 0xff, sizeof seen);
  /* Each whole flow's key: its members in ring order from the smallest. */
  for (int t = 0; t < n; t++) {
    const SimTask *f = &task[t];
    if (f->kind != SIM_TASK_FLOW)
      continue;
    int32_t id = -2;
    const int32_t *links = NULL;
    int n_links = 0;
    if (f->n_links && f->n_members <= 1) {
      /* A flow between a device and its host (an offloaded update's, sim/lower-sync.c):
       * no ring, one more flow on its links. */
      links = tg->extra + f->links_off;
      n_links = f->n_links;
    } else if (f->n_links) {
      any = TRUE;
      int32_t *s = &seen[(uint32_t)f->links_off % SEEN];
      if (*s == f->links_off)
        continue;
      *s = f->links_off;
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
  memset(seen, 0xff, sizeof seen);
  for (int t = 0; any && ok && t < n; t++) {
    const SimTask *f = &task[t];
    if (f->kind != SIM_TASK_FLOW || !f->n_links || f->n_members <= 1)
      continue;
    int32_t *s = &seen[(uint32_t)f->links_off % SEEN];
    if (*s == f->links_off)
      continue;
    *s = f->links_off;
    const int32_t *links = tg->extra + f->links_off;
    for (int j = 0; ok && j < f->n_links; j++)
      ok = owner[links[j]] >= 0;
  }
  sim_key_index_free(&sigs);
  g_free(owner);
  return ok;
}

/* Where the network says a ring alone ends. */
static void ring_end(void *user, int flow_task, double end)
{
  *(double *)user = end;
}

/* ---- rings the stream waits for (brief runs) ---------------------------------------- */

/* The one successor @t has left (its implied edges are marked -1). */
static int32_t only_succ(const SimTaskGraph *tg, int32_t t)
{
  const int32_t *su = tg->succ + tg->task[t].succ_off;
  for (int k = 0; k < tg->task[t].n_succ; k++)
    if (su[k] >= 0)
      return su[k];
  return -1;
}

/* The ring that join point @j1 releases alone as a group, when the ring releases (through
 * a join point) only @b, which waits for nothing else: its id, else -1. */
static int32_t ring_before(const SimTaskGraph *tg, int32_t j1, int32_t b, const uint8_t *gone)
{
  const SimTask *task = tg->task;
  if (j1 < 0 || task[j1].kind != SIM_TASK_NOP || tg->n_pred[j1] != 1 ||
      task[j1].n_succ != 1 || !tg->group_head[j1])
    return -1;
  int32_t r = tg->succ[task[j1].succ_off];
  const SimTask *f = &task[r];
  if (gone[r] || f->kind != SIM_TASK_FLOW || !f->n_links || tg->n_pred[r] != 1 ||
      f->n_succ != 1)
    return -1;
  int32_t j2 = tg->succ[f->succ_off];
  if (task[j2].kind != SIM_TASK_NOP || tg->n_pred[j2] != 1 || task[j2].n_succ != 1 ||
      tg->succ[task[j2].succ_off] != b)
    return -1;
  return r;
}

/* A walk along the streams (stream position @k of @ns) meets tasks far apart in the task
 * array, each a cache miss: the task PF_FAR places ahead is fetched, then the successor
 * list of the one PF_NEAR ahead, and the records of its first successors and the next
 * task's predecessor count, so that they are in the cache when the walk gets there
 * (three times as far ahead as 16, 8 and 4: the merging pass of Megatron 1T's brief run
 * took 0.487 s instead of 0.536, 310.1B's 0.289 instead of 0.335, medians of 7 runs
 * alternating).  Fetching changes nothing the walk reads. */
enum { PF_FAR = 48, PF_NEAR = 24, PF_SUCC = 12 };

static inline void stream_prefetch(const SimTaskGraph *tg, const int32_t *n_out, int32_t k,
                                   int32_t ns)
{
  const SimTask *task = tg->task;
  if (k + PF_FAR < ns)
    __builtin_prefetch(&task[tg->stream[k + PF_FAR]]);
  if (k + PF_NEAR < ns) {
    int32_t t = tg->stream[k + PF_NEAR];
    __builtin_prefetch(&tg->succ[task[t].succ_off]);
    __builtin_prefetch(&tg->n_pred[t]);
    __builtin_prefetch(&n_out[t]);
  }
  if (k + PF_SUCC < ns) {
    const SimTask *t = &task[tg->stream[k + PF_SUCC]];
    const int32_t *su = tg->succ + t->succ_off;
    for (int i = 0; i < t->n_succ && i < 2; i++)
      if (su[i] >= 0)
        __builtin_prefetch(&task[su[i]]);
  }
}

/* Takes from its owner (sets to -2) each link of @owner that a flow of @others crosses,
 * unless that flow waits, through any path of successors, for a task of the owner's
 * stream from the one after its last candidate ring on (@at, of @ns stream positions):
 * such a flow starts after every ring of that stream has ended.  Gradient
 * synchronization that waits for the backward pass (sequence parallelism's layer norms)
 * shares the tensor-parallel rings' links so. */
static void settle_others(const SimTaskGraph *tg, const SimMachine *m, const int32_t *at,
                          int32_t ns, const uint8_t *gone, const GArray *others, int32_t *owner)
{
  int n = tg->n_tasks, nd = tg->n_devices;
  const SimTask *task = tg->task;
  /* The devices that own a link some other flow crosses. */
  uint8_t *asked = g_new0(uint8_t, MAX(nd, 1));
  for (guint i = 0; i < others->len; i++) {
    int k;
    const int32_t *links = sim_taskgraph_flow_links(tg, m, &task[g_array_index(others, int32_t, i)], &k);
    for (int j = 0; j < k; j++)
      if (owner[links[j]] >= 0)
        asked[owner[links[j]]] = 1;
  }
  int32_t *stamp = sim_large_alloc(MAX((size_t)n, 1) * sizeof(int32_t));
  memset(stamp, 0xff, (size_t)n * sizeof(int32_t));
  GArray *stack = g_array_new(FALSE, FALSE, sizeof(int32_t));
  for (int d = 0; d < nd; d++) {
    if (!asked[d])
      continue;
    int32_t lo = tg->stream_off[d], hi = tg->stream_off[d + 1], last = -1;
    for (int32_t k = lo; k < hi && k < ns; k++)
      if (at[k] >= 0)
        last = k;
    /* Everything that waits for the task after the last ring, marked d. */
    g_array_set_size(stack, 0);
    for (int32_t k = last < 0 ? lo : last + 1; k < hi; k++) {
      int32_t t = tg->stream[k];
      if (stamp[t] != d) {
        stamp[t] = d;
        g_array_append_val(stack, t);
      }
    }
    while (stack->len) {
      int32_t t = g_array_index(stack, int32_t, stack->len - 1);
      g_array_set_size(stack, stack->len - 1);
      const int32_t *su = tg->succ + task[t].succ_off;
      for (int i = 0; i < task[t].n_succ; i++) {
        int32_t v = su[i];
        if (v < 0 || gone[v] || stamp[v] == d)
          continue;
        stamp[v] = d;
        g_array_append_val(stack, v);
      }
    }
    /* The flows on d's links that were not reached take the links away. */
    for (guint i = 0; i < others->len; i++) {
      int32_t f = g_array_index(others, int32_t, i);
      if (stamp[f] == d)
        continue;
      int k;
      const int32_t *links = sim_taskgraph_flow_links(tg, m, &task[f], &k);
      for (int j = 0; j < k; j++)
        if (owner[links[j]] == d)
          owner[links[j]] = -2;
    }
  }
  g_array_free(stack, TRUE);
  g_free(stamp);
  g_free(asked);
}

/* The records absorbable_rings() meets after a stream's task A, each found through the one
 * before: A's first successor J1 (stream_prefetch() fetched it PF_SUCC places ahead), then
 * J1's successor list two places ahead, and the ring R it names one place ahead, so that
 * each is in the cache when the walk gets there.  Fetching changes nothing the walk reads. */
static inline void ring_prefetch(const SimTaskGraph *tg, int32_t k, int32_t ns)
{
  const SimTask *task = tg->task;
  const int32_t *succ = tg->succ;
  for (int ahead = 2; ahead >= 1; ahead--) {
    if (k + ahead >= ns)
      continue;
    const SimTask *a = &task[tg->stream[k + ahead]];
    if (a->n_succ < 1 || succ[a->succ_off] < 0)
      continue;
    const SimTask *j1 = &task[succ[a->succ_off]];
    if (j1->kind != SIM_TASK_NOP || j1->n_succ != 1)
      continue;
    if (ahead == 2)
      __builtin_prefetch(&succ[j1->succ_off]);
    else
      __builtin_prefetch(&task[succ[j1->succ_off]]);
  }
}

/* The ring R between two consecutive tasks A and B of a device's stream when the stream
 * waits for it alone: A's one successor is a join point that releases R alone, as a group
 * (SimTaskGraph.group_head), R (a whole ring's one flow) releases a join point whose one
 * successor is B, and B waits for nothing else.  The engine then starts R's group when A
 * ends and B when the group's schedule ends, and nothing else runs on the device meanwhile
 * (its next task is B); where no other flow ever crosses R's links but such rings of the
 * same stream, which the stream runs one at a time, R's group always runs undisturbed and
 * ends the time its schedule gives after A's end: a step of the stream of that duration,
 * to the bit (the engine adds it to A's end, as a merged run adds its steps).  Which
 * class the time is of is lost, so only brief runs, which report time and memory, take
 * it.  Sets @ring_at (per stream position: R between that task and the next, or -1) and
 * @ring_time (R's duration there); both NULL where no ring qualifies.  @scratch: room for a
 * value per task, overwritten.  FALSE where SimTaskGraph.cancel stopped it. */
static gboolean absorbable_rings(const SimTaskGraph *tg, const SimMachine *m,
                             const SimCollParams *cp, const int32_t *n_out, const uint8_t *gone,
                             int32_t *scratch, int32_t **ring_at, double **ring_time)
{
  *ring_at = NULL;
  *ring_time = NULL;
  int n = tg->n_tasks, nd = tg->n_devices, nl = sim_machine_n_links(m);
  const SimTask *task = tg->task;
  const int32_t *succ = tg->succ;
  int32_t ns = tg->stream_off[nd];
  int32_t *at = sim_large_alloc(MAX((size_t)ns, 1) * sizeof(int32_t));
  int32_t *dev = scratch; /* a candidate's stream */
  memset(dev, 0xff, (size_t)n * sizeof(int32_t));
  int n_cand = 0;
  gboolean stop = FALSE;
  for (int d = 0; d < nd && !stop; d++)
    for (int32_t k = tg->stream_off[d]; k < tg->stream_off[d + 1]; k++) {
      if ((stop = cancelled(tg, k)))
        break;
      stream_prefetch(tg, n_out, k, ns);
      ring_prefetch(tg, k, ns);
      at[k] = -1;
      if (k + 1 >= tg->stream_off[d + 1])
        continue;
      int32_t a = tg->stream[k], b = tg->stream[k + 1];
      if (tg->n_pred[b] != 1)
        continue;
      const int32_t *sa = succ + task[a].succ_off;
      for (int i = 0; i < task[a].n_succ; i++) {
        int32_t r = ring_before(tg, sa[i], b, gone);
        if (r < 0)
          continue;
        /* A ring the stream waits for alone; it joins the stream where @a waits for
         * nothing else. */
        at[k] = n_out[a] == 1 ? r : -1;
        dev[r] = d;
        n_cand++;
        break;
      }
    }
  if (n_cand == 0 || stop) {
    g_free(at);
    return !stop;
  }
  /* Links that only candidates of one stream cross: their owner, else -2.  Candidates
   * first; then every other flow on a candidate's link takes the link away from its owner
   * unless it can only start once the owner's stream is past its last candidate
   * (after_stream()): it then never meets one of those rings under way. */
  int32_t *owner = g_new(int32_t, MAX(nl, 1));
  for (int l = 0; l < nl; l++)
    owner[l] = -1;
  /* A whole flow whose links (shared with its block's flows of the same ring) were marked
   * lately for the same stream changes nothing (see sim_taskgraph_rings_private()). */
  enum { SEEN = 256 };
  struct {
    int32_t off, dev;
  } seen[SEEN];
  GArray *others = g_array_new(FALSE, FALSE, sizeof(int32_t)); /* flows on candidates' links */
  for (int pass = 0; pass < 2 && !stop; pass++) {
    memset(seen, 0xff, sizeof seen);
    for (int t = 0; t < n && !stop; t++) {
      if ((stop = cancelled(tg, t)))
        break;
      const SimTask *f = &task[t];
      if (gone[t] || f->kind != SIM_TASK_FLOW || (dev[t] >= 0) != (pass == 0))
        continue;
      if (f->n_links) {
        /* (Every other flow is asked on its own: each waits for its own tasks.) */
        int slot = (int)((uint32_t)f->links_off % SEEN);
        if (pass == 0 && seen[slot].off == f->links_off && seen[slot].dev == dev[t])
          continue;
        seen[slot].off = f->links_off;
        seen[slot].dev = dev[t];
      }
      int k;
      const int32_t *links = sim_taskgraph_flow_links(tg, m, f, &k);
      for (int j = 0; j < k; j++) {
        int l = links[j];
        if (pass == 0) {
          owner[l] = owner[l] == -1 || owner[l] == dev[t] ? dev[t] : -2;
        } else if (owner[l] >= 0) {
          g_array_append_val(others, t);
          break;
        }
      }
    }
  }
  if (stop) {
    g_array_free(others, TRUE);
    g_free(owner);
    g_free(at);
    return FALSE;
  }
  if (others->len)
    settle_others(tg, m, at, ns, gone, others, owner);
  g_array_free(others, TRUE);
  /* Each qualifying ring's schedule alone, as the engine's group schedule works it out
   * (engine-groups.c): it starts moving bytes its latency after its release and ends when
   * the network says; consecutive rings are mostly alike. */
  double *time = sim_large_alloc(MAX((size_t)ns, 1) * sizeof(double));
  SimNet *net = sim_net_new(m, cp);
  const SimTask *prev = NULL;
  double prev_time = 0;
  int kept = 0;
  for (int32_t k = 0; k < ns; k++) {
    if (k + PF_FAR < ns && at[k + PF_FAR] >= 0)
      __builtin_prefetch(&task[at[k + PF_FAR]]);
    int32_t r = at[k];
    if (r < 0)
      continue;
    const SimTask *f = &task[r];
    const int32_t *links = sim_task_links(tg, f);
    gboolean mine = TRUE;
    for (int j = 0; mine && j < f->n_links; j++)
      mine = owner[links[j]] == dev[r];
    if (!mine) {
      at[k] = -1;
      continue;
    }
    if (!(prev && prev->n_links == f->n_links && prev->bytes == f->bytes &&
          prev->duration == f->duration &&
          !memcmp(sim_task_links(tg, prev), links, (size_t)f->n_links * sizeof(int32_t)))) {
      /* The net is left empty after each ring (removing the flow and settling), as a
       * reset would leave it, without a reset's pass over every link. */
      double end = INFINITY, start = f->duration, ignored;
      int slot = sim_net_add(net, 0, (const int *)links, f->n_links, f->bytes, start);
      sim_net_update(net, start, ring_end, &end);
      sim_net_remove(net, slot, end);
      sim_net_update(net, end, ring_end, &ignored);
      prev = f;
      prev_time = end;
    }
    if (!isfinite(prev_time)) {
      at[k] = -1;
      continue;
    }
    time[k] = prev_time;
    kept++;
  }
  sim_net_free(net);
  g_free(owner);
  if (kept == 0) {
    g_free(at);
    g_free(time);
    return TRUE;
  }
  *ring_at = at;
  *ring_time = time;
  return TRUE;
}

/* ---- chains of compute tasks -------------------------------------------------------- */

/* The tasks of @tg without those @gone marks, under new ids in the old order: the
 * successor lists rebuilt with them and without the implied edges (marked -1; @n_out
 * counts the successors that stay), the streams and the roots.  A merged task's only
 * predecessor was the one before it, which is merged too or the head, so no list that
 * stays names a merged task.  @scratch: room for a value per task, overwritten. */
static void renumber(SimTaskGraph *tg, const uint8_t *gone, const int32_t *n_out,
                     int32_t *scratch)
{
  int n = tg->n_tasks, nd = tg->n_devices;
  SimTask *task = tg->task;
  const int32_t *succ = tg->succ;
  int32_t *map = scratch;
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
  for (size_t i = 0; i < tg->n_watch; i++)
    if (tg->watch[i] >= 0)
      tg->watch[i] = map[tg->watch[i]];
}

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
static int merge_chains(SimTaskGraph *tg, gboolean chains, gboolean keep_steps,
                        const SimMachine *m, const SimCollParams *cp, gboolean absorb,
                        gboolean brief)
{
  int n = tg->n_tasks, nd = tg->n_devices;
  if (n == 0)
    return 0;
  SimTask *task = tg->task;
  int32_t *succ = tg->succ;
  uint8_t *gone = sim_large_alloc((size_t)n);
  memset(gone, 0, (size_t)n);
  int n_rings = m ? merge_rings(tg, m, cp, gone) : 0;
  if (n_rings < 0) {
    g_free(gone);
    return -1;
  }
  succ = tg->succ;
  /* Stream positions; the edges that go are marked -1, those that stay counted per task. */
  int32_t *pos = sim_large_alloc((size_t)n * sizeof(int32_t));
  memset(pos, 0xff, (size_t)n * sizeof(int32_t));
  for (int32_t k = 0; k < tg->stream_off[nd]; k++)
    pos[tg->stream[k]] = k;
#define IMPLIED(u, v) (pos[u] >= 0 && pos[v] > pos[u] && task[u].device == task[v].device)
  int32_t *n_out = sim_large_alloc((size_t)n * sizeof(int32_t));
  size_t n_dropped = 0;
  gboolean stop = FALSE;
  for (int u = 0; u < n && !stop; u++) {
    if ((stop = cancelled(tg, u)))
      break;
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
  /* @pos is scratch from here on (n entries): absorbable_rings() and renumber() take it
   * instead of fresh pages. */
  /* For a brief run: at each stream position, the ring the stream waits for before its
   * next task, and how long it takes (see absorbable_rings()). */
  int32_t *ring_at = NULL;
  double *ring_time = NULL;
  if (!stop && absorb && chains && m)
    stop = !absorbable_rings(tg, m, cp, n_out, gone, pos, &ring_at, &ring_time);
  int merged = 0;
  GArray *steps = keep_steps ? g_array_new(FALSE, FALSE, sizeof(SimChainStep)) : NULL;
  GArray *durs = g_array_new(FALSE, FALSE, sizeof(double));
  /* The rings taken in, for reports (a brief run needs only their time). */
  GArray *step_ring = ring_at && !brief ? g_array_new(FALSE, FALSE, sizeof(int32_t)) : NULL;
  GArray *rings = step_ring ? g_array_new(FALSE, FALSE, sizeof(SimTask)) : NULL;
  const int32_t none = -1;
  for (int d = 0; d < nd && !stop; d++) {
    int32_t lo = tg->stream_off[d], hi = tg->stream_off[d + 1];
    int32_t head = -1, tail = -1;
    double dur = 0;
    int64_t peak = 0, net = 0; /* bytes above the run's start: the most, and at its end */
    uint32_t kernels = 0;
    int32_t first_step = -1;
    for (int32_t k = lo; k <= hi; k++) {
      if ((stop = cancelled(tg, k)))
        break;
      stream_prefetch(tg, n_out, k, tg->stream_off[nd]);
      int32_t t = k < hi ? tg->stream[k] : -1;
      const SimTask *c = t >= 0 ? &task[t] : NULL;
      gboolean same = c && tail >= 0 && c->mb == task[head].mb &&
                      (brief || c->cls == task[head].cls);
      gboolean joins = chains && same && n_out[tail] == 0 && tg->n_pred[t] == 0;
      /* A ring between the two, which the stream waits for alone: a step of its own. */
      int32_t ring = ring_at && same && k > lo ? ring_at[k - 1] : -1;
      if (joins || ring >= 0) {
        if (tail == head) {
          first_step = (int32_t)durs->len;
          g_array_append_val(durs, task[head].duration);
          if (step_ring)
            g_array_append_val(step_ring, none);
        }
        if (steps && tail == head) {
          g_assert(steps->len == durs->len - 1);
          SimChainStep first = { 0, task[head].mem_alloc, task[head].mem_free, 0 };
          g_array_append_val(steps, first);
        }
        if (ring >= 0) {
          double rt = ring_time[k - 1];
          g_array_append_val(durs, rt);
          if (step_ring) {
            int32_t idx = (int32_t)rings->len;
            g_array_append_val(step_ring, idx);
            g_array_append_val(rings, task[ring]);
          }
          if (steps) {
            SimChainStep st = { dur, 0, 0, 0 };
            g_array_append_val(steps, st);
          }
          dur += rt;
          /* The join points around the ring, and the ring, go with it. */
          gone[only_succ(tg, tail)] = 1;
          gone[ring] = 1;
          gone[succ[task[ring].succ_off]] = 1;
        }
        g_array_append_val(durs, c->duration);
        if (step_ring)
          g_array_append_val(step_ring, none);
        if (steps) {
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
  g_free(ring_at);
  g_free(ring_time);
  if (stop || (!merged && !n_dropped && !n_rings)) {
    if (step_ring) {
      g_array_free(step_ring, TRUE);
      g_array_free(rings, TRUE);
    }
    if (steps)
      g_array_free(steps, TRUE);
    g_array_free(durs, TRUE);
    g_free(pos);
    g_free(n_out);
    g_free(gone);
    return stop ? -1 : 0;
  }
  renumber(tg, gone, n_out, pos);
  g_free(pos);
  g_free(n_out);
  g_free(gone);
  g_free(tg->chain_dur);
  tg->n_chain_dur = durs->len;
  tg->chain_dur = (double *)(void *)g_array_free(durs, FALSE);
  g_clear_pointer(&tg->chain_ring, g_free);
  g_clear_pointer(&tg->rings, g_free);
  tg->n_rings = 0;
  if (step_ring && rings->len) {
    tg->n_rings = rings->len;
    tg->rings = (SimTask *)(void *)g_array_free(rings, FALSE);
    tg->chain_ring = (int32_t *)(void *)g_array_free(step_ring, FALSE);
  } else if (step_ring) {
    g_array_free(rings, TRUE);
    g_array_free(step_ring, TRUE);
  }
  if (steps) {
    g_free(tg->chain);
    tg->n_chain = steps->len;
    tg->chain = (SimChainStep *)(void *)g_array_free(steps, FALSE);
  }
  return merged + n_rings;
}

int sim_taskgraph_merge_chains(SimTaskGraph *tg, gboolean chains, gboolean keep_steps,
                               const SimMachine *m, const SimCollParams *cp, gboolean absorb)
{
  return merge_chains(tg, chains, keep_steps, m, cp, absorb, FALSE);
}

int sim_taskgraph_merge_chains_brief(SimTaskGraph *tg, gboolean chains, gboolean keep_steps,
                                     const SimMachine *m, const SimCollParams *cp)
{
  return merge_chains(tg, chains, keep_steps, m, cp, TRUE, TRUE);
}
