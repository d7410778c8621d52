/* fold.c — symmetry folding for the driver in simulate.c (docs/scale.md): which devices'
 * timelines are copies of others' (data-parallel replicas, the tensor-parallel ranks of
 * one pipeline stage), and the shadow tasks that stand for the folded devices' share of
 * the links their collectives use. */
#include "fold.h"
#include "base.h"

#include <math.h>
#include <string.h>

/* ---- folding analysis ---------------------------------------------------------------- */

void fold_clear(Fold *f)
{
  g_free(f->phi);
  g_free(f->repl);
  g_free(f->base);
  g_free(f->cls);
  g_free(f->pos);
  if (f->members)
    g_ptr_array_free(f->members, TRUE);
  if (f->sizes)
    g_array_free(f->sizes, TRUE);
  if (f->watch)
    g_array_free(f->watch, TRUE);
  memset(f, 0, sizeof *f);
}

static int first_compute_op(const SimGraph *g)
{
  for (int x = 0; x < sim_graph_n_ops(g); x++)
    if (sim_graph_op_type(g, x) != SIM_OP_INPUT)
      return x;
  return -1;
}

/* Data-parallel replicas: every operator splits its sample dimension D ways, and the
 * shards of replica r sit on devices that one one-to-one map (of the same device kind)
 * carries from replica 0's. */
gboolean fold_replicas(const SimGraph *g, const SimMachine *m, const SimStrategy *s, Fold *f)
{
  int nd = f->nd, x0 = first_compute_op(g);
  if (x0 < 0 || s->ops[x0].degree[0] <= 1)
    return FALSE;
  int D = s->ops[x0].degree[0];
  int *phi = g_new(int, (size_t)D * nd);
  int *owner = g_new(int, nd);
  for (int i = 0; i < D * nd; i++)
    phi[i] = -1;
  for (int d = 0; d < nd; d++)
    owner[d] = -1;
  gboolean ok = TRUE;
  for (int x = 0; ok && x < s->n_ops; x++) {
    if (sim_graph_op_type(g, x) == SIM_OP_INPUT)
      continue;
    const SimOpConfig *c = &s->ops[x];
    if (c->degree[0] != D) {
      ok = FALSE;
      break;
    }
    int per = c->n_shards / D;
    for (int r = 0; ok && r < D; r++)
      for (int k = 0; ok && k < per; k++) {
        int d0 = c->devices[k], dr = c->devices[r * per + k];
        int *slot = &phi[(size_t)r * nd + d0];
        if (*slot < 0)
          *slot = dr;
        ok = *slot == dr && (owner[dr] < 0 || owner[dr] == r) &&
             sim_machine_device_spec(m, d0) == sim_machine_device_spec(m, dr);
        owner[dr] = r;
      }
  }
  if (ok) {
    f->D = D;
    f->phi = phi;
    f->repl = g_new(int, nd);
    f->base = g_new(int, nd);
    for (int d = 0; d < nd; d++) {
      f->repl[d] = owner[d];
      f->base[d] = d;
    }
    for (int r = 0; r < D; r++)
      for (int d0 = 0; d0 < nd; d0++)
        if (phi[(size_t)r * nd + d0] >= 0)
          f->base[phi[(size_t)r * nd + d0]] = d0;
  } else {
    g_free(phi);
  }
  g_free(owner);
  return ok;
}

/* Tensor-parallel ranks: inside replica 0, every operator of a stage spreads its shards
 * over the same set of devices of one kind, one shard per device, the first shard of each
 * on the same device, which stands for the others.  Not where a mixture of experts splits
 * its experts over groups wider than a replica (its sample groups fewer than the
 * replicas): its all-to-all pairs ranks of several replicas, which the rotation of the
 * ranks does not carry onto each other. */
gboolean fold_ranks(const SimGraph *g, const SimMachine *m, const SimStrategy *s, Fold *f)
{
  int nd = f->nd, S = s->n_stages, D = f->D > 1 ? f->D : 1;
  int *rep = g_new(int, S);
  for (int st = 0; st < S; st++)
    rep[st] = -1;
  GHashTable **sets = g_new0(GHashTable *, S);
  gboolean ok = TRUE;
  for (int x = 0; ok && x < s->n_ops; x++) {
    if (sim_graph_op_type(g, x) == SIM_OP_INPUT)
      continue;
    const SimOpConfig *c = &s->ops[x];
    if (sim_graph_op_type(g, x) == SIM_OP_MOE && c->degree[2] > 1 && c->degree[0] != D) {
      ok = FALSE;
      break;
    }
    int st = s->op_stage[x];
    int per = c->n_shards / D;
    GHashTable *mine = g_hash_table_new(g_direct_hash, g_direct_equal);
    for (int k = 0; k < per; k++)
      g_hash_table_add(mine, GINT_TO_POINTER(c->devices[k] + 1));
    ok = (int)g_hash_table_size(mine) == per; /* no two shards on one device */
    if (ok && rep[st] < 0) {
      rep[st] = c->devices[0];
      sets[st] = mine;
      mine = NULL;
    } else if (ok) {
      ok = rep[st] == c->devices[0] && g_hash_table_size(mine) == g_hash_table_size(sets[st]);
      GHashTableIter it;
      gpointer key;
      g_hash_table_iter_init(&it, mine);
      while (ok && g_hash_table_iter_next(&it, &key, NULL))
        ok = g_hash_table_contains(sets[st], key);
    }
    if (mine)
      g_hash_table_destroy(mine);
  }
  gboolean any = FALSE;
  if (ok) {
    f->cls = g_new(int, nd);
    f->pos = g_new0(int, nd);
    for (int d = 0; d < nd; d++)
      f->cls[d] = -1;
    f->members = g_ptr_array_new_with_free_func(g_free);
    f->sizes = g_array_new(FALSE, FALSE, sizeof(int));
    for (int st = 0; st < S && ok; st++) {
      if (!sets[st] || g_hash_table_size(sets[st]) < 2)
        continue;
      int n = (int)g_hash_table_size(sets[st]);
      int *devs = g_new(int, n);
      int k = 0;
      GHashTableIter it;
      gpointer key;
      g_hash_table_iter_init(&it, sets[st]);
      while (g_hash_table_iter_next(&it, &key, NULL))
        devs[k++] = GPOINTER_TO_INT(key) - 1;
      /* Device order, rotated so that the representative comes first. */
      for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && devs[j - 1] > devs[j]; j--) {
          int t = devs[j];
          devs[j] = devs[j - 1];
          devs[j - 1] = t;
        }
      int ri = 0;
      while (devs[ri] != rep[st])
        ri++;
      int *rot = g_new(int, n);
      for (int i = 0; i < n; i++)
        rot[i] = devs[(ri + i) % n];
      g_free(devs);
      int known = f->cls[rot[0]];
      if (known >= 0) {
        /* Stages that share a device group (interleaved chunks) share its ranks. */
        const int *mem = f->members->pdata[known];
        ok = g_array_index(f->sizes, int, known) == n &&
             memcmp(mem, rot, sizeof(int) * (size_t)n) == 0;
        g_free(rot);
        continue;
      }
      for (int i = 0; i < n; i++) {
        ok = ok && f->cls[rot[i]] < 0 &&
             sim_machine_device_spec(m, rot[i]) == sim_machine_device_spec(m, rot[0]);
        f->cls[rot[i]] = (int)f->members->len;
        f->pos[rot[i]] = i;
      }
      g_ptr_array_add(f->members, rot);
      g_array_append_val(f->sizes, n);
      any = TRUE;
    }
  }
  for (int st = 0; st < S; st++)
    if (sets[st])
      g_hash_table_destroy(sets[st]);
  g_free(sets);
  g_free(rep);
  f->n_classes = ok && any ? (int)f->members->len : 0;
  return ok && any;
}

/* The image of device @d under the fold's map (replica shift @r, rank shift @k). */
static int fold_map(const Fold *f, int d, int r, int k, gboolean ranks)
{
  if (!f->repl || f->repl[d] < 0) {
    if (!ranks || !f->cls || f->cls[d] < 0)
      return d;
    const int *mem = f->members->pdata[f->cls[d]];
    int n = g_array_index(f->sizes, int, f->cls[d]);
    return mem[(f->pos[d] + k) % n];
  }
  int d0 = f->base[d];
  if (ranks && f->cls && f->cls[d0] >= 0) {
    const int *mem = f->members->pdata[f->cls[d0]];
    int n = g_array_index(f->sizes, int, f->cls[d0]);
    d0 = mem[(f->pos[d0] + k) % n];
  }
  return f->phi[(size_t)((f->repl[d] + r) % f->D) * f->nd + d0];
}

/* The device whose timeline stands for @d's when replicas (@use_r) and ranks (@use_k)
 * are folded. */
int fold_rep(const Fold *f, int d, gboolean use_r, gboolean use_k)
{
  int q = f->repl ? f->repl[d] : -1;
  int d0 = q >= 0 ? f->base[d] : d;
  if (use_k && f->cls && f->cls[d0] >= 0)
    d0 = ((const int *)f->members->pdata[f->cls[d0]])[0];
  if (q >= 0 && !use_r)
    return f->phi[(size_t)q * f->nd + d0]; /* a replica keeps its own representatives */
  return d0;
}

/* Folded devices compute nothing in the simulation, but they still communicate, and
 * their traffic shares links with what is simulated.  A collective whose devices every
 * symmetry maps onto themselves is built whole and loses nothing.  Every other flow of a
 * simulated device (a transfer, a collective among representatives) gets its images
 * under the symmetries as shadow flows: the same bytes, started by the same predecessors
 * (symmetric devices reach them at the same time), waited for by nothing.
 *
 * The result is exact when the symmetries map the routes of those flows onto their
 * images link by link (equal lengths, capacities and latencies, one consistent one-to-one
 * map of links), so that the traffic of every folded device is a copy of its
 * representative's; flows of whole collectives must map the same way or keep to links no
 * other flow uses.  Returns FALSE, adding nothing, when that does not hold. */
typedef struct {
  int32_t block, index, a, b;
  /* Which of its collective's flows with the same ends (or, for a whole ring's flow, which
   * of its collective's rings) it is: the channels of a ring are distinct flows. */
  int32_t occ;
  /* A flow between device a and its host over the PCIe links (an offloaded update's,
   * sim/lower-sync.c): 1 to the host, 2 back; 0 for flows between devices. */
  int32_t host;
} FlowAt;

/* The links between device @d and its host, to it (@host 1) or back (2), into @out
 * (sim_machine_host_links()). */
static void host_links_into(const SimMachine *m, int d, int host, GArray *out)
{
  int links[64];
  int n = MIN(sim_machine_host_links(m, d, host == 1, links, 64), 64);
  g_array_set_size(out, 0);
  g_array_append_vals(out, links, (guint)n);
}

/* Whether flow @t of block @blk runs between a device and its host: one member, its
 * links those of the device's PCIe path one way; which way (1 to the host, 2 back), or 0. */
static int host_flow_way(const SimMachine *m, const SimTaskBlock *blk, const SimTask *t,
                         GArray *tmp)
{
  if (t->device != t->peer || t->n_members != 1 || !t->n_links)
    return 0;
  const int32_t *links = &g_array_index(blk->extra, int32_t, t->links_off);
  for (int way = 1; way <= 2; way++) {
    host_links_into(m, t->device, way, tmp);
    if (tmp->len == t->n_links &&
        !memcmp(tmp->data, links, sizeof(int32_t) * (size_t)t->n_links))
      return way;
  }
  return 0;
}

/* Whether every symmetry maps the devices of @set, whose membership table over the
 * devices is @in, into the set. */
static gboolean coll_invariant(const GArray *set, const uint8_t *in, const Fold *f, int R, int K,
                               gboolean ranks)
{
  for (int r = 0; r < R; r++)
    for (int k = 0; k < K; k++) {
      if (r == 0 && k == 0)
        continue;
      for (guint i = 0; i < set->len; i++) {
        int img = fold_map(f, g_array_index(set, int, i), r, k, ranks);
        if (img < 0 || img >= f->nd || !in[img])
          return FALSE;
      }
    }
  return TRUE;
}

/* Collectives repeat over a few device sets (each replica's tensor-parallel group,
 * micro-batch after micro-batch): numbers the distinct sets, per collective, and gives
 * each a membership table over the @nd devices in @member.  A set is first compared with
 * the last one that began with the same device, and hashed only when it differs. */
static int *distinct_sets(const SimTaskGraph *tg, int n_coll, int nd, GPtrArray *member)
{
  int *set_of = g_new(int, MAX(n_coll, 1));
  GHashTable *ids = g_hash_table_new_full(sim_bytes_hash, g_bytes_equal,
                                          (GDestroyNotify)g_bytes_unref, NULL);
  const GArray **last = g_new0(const GArray *, MAX(nd, 1));
  int *last_id = g_new(int, MAX(nd, 1));
  for (int c = 0; c < n_coll; c++) {
    const GArray *set = tg->coll_devs->pdata[c];
    int d0 = set->len ? g_array_index(set, int, 0) : 0;
    if (last[d0] && last[d0]->len == set->len &&
        memcmp(last[d0]->data, set->data, set->len * sizeof(int)) == 0) {
      set_of[c] = last_id[d0];
      continue;
    }
    last[d0] = set;
    GBytes *kb = g_bytes_new(set->data, set->len * sizeof(int));
    gpointer id;
    if (g_hash_table_lookup_extended(ids, kb, NULL, &id)) {
      set_of[c] = last_id[d0] = GPOINTER_TO_INT(id);
      g_bytes_unref(kb);
      continue;
    }
    set_of[c] = last_id[d0] = (int)member->len;
    g_hash_table_insert(ids, kb, GINT_TO_POINTER(set_of[c]));
    uint8_t *in = g_new0(uint8_t, MAX(nd, 1));
    for (guint i = 0; i < set->len; i++)
      in[g_array_index(set, int, i)] = 1;
    g_ptr_array_add(member, in);
  }
  g_hash_table_destroy(ids);
  g_free(last);
  g_free(last_id);
  return set_of;
}

/* A partial bijection of links, built route by route for one symmetry: lam[x] (and its
 * inverse inv) hold only where lam_at (inv_at) equals stamp, so that each symmetry starts
 * empty by taking a new stamp instead of clearing every link. */
typedef struct {
  int *lam, *inv;
  int32_t *lam_at, *inv_at;
  int32_t stamp;
  double *bw, *lat;   /* every link's bandwidth and latency */
} LinkMap;

/* Extends the link map of one symmetry with a pair's route @r1 of @n1 links (marked in
 * @mark by the caller) against its image's, from @pa to @pb, which it marks; FALSE if they
 * do not fit. */
static gboolean map_links(const int *r1, int n1, const int *r2, int n2, gboolean fits,
                          LinkMap *map, uint8_t *mark);

static gboolean map_route(const SimMachine *m, const int *r1, int n1, int pa, int pb, LinkMap *map,
                          uint8_t *mark)
{
  int n2;
  const int *r2 = sim_machine_route(m, pa, pb, &n2);
  return map_links(r1, n1, r2, n2, pa != pb, map, mark);
}

/* map_route() for a route @r1 and its image @r2 given as links. */
static gboolean map_links(const int *r1, int n1, const int *r2, int n2, gboolean fits,
                          LinkMap *map, uint8_t *mark)
{
  fits = fits && n1 == n2;
  int32_t now = map->stamp;
  for (int h = 0; fits && h < n1; h++) {
    int x = r1[h], y = r2[h];
    fits = map->bw[x] == map->bw[y] && map->lat[x] == map->lat[y] &&
           (map->lam_at[x] != now || map->lam[x] == y) &&
           (map->inv_at[y] != now || map->inv[y] == x);
    map->lam[x] = y;
    map->lam_at[x] = now;
    map->inv[y] = x;
    map->inv_at[y] = now;
  }
  for (int h = 0; h < n2; h++)
    mark[r2[h]] = 1;
  return fits;
}

/* Whether a whole collective's flow is a ring: its links are its members' routes in
 * ring order. */
static gboolean ring_links_match(const SimMachine *m, const SimTaskBlock *blk, const SimTask *t)
{
  const int32_t *links = &g_array_index(blk->extra, int32_t, t->links_off);
  const int32_t *mem = links + t->n_links;
  int pos = 0;
  for (int i = 0; i < t->n_members; i++) {
    int hops;
    const int *r = sim_machine_route(m, mem[i], mem[(i + 1) % t->n_members], &hops);
    for (int h = 0; h < hops; h++, pos++)
      if (pos >= t->n_links || links[pos] != r[h])
        return FALSE;
  }
  return pos == t->n_links;
}

/* What add_shadows() works out and its steps share: the symmetries (R replicas by K
 * ranks), the distinct device sets of the collectives, and the flows between devices that
 * a symmetry does not map onto flows of their own collective ("part" flows, which get
 * shadows), with the distinct device pairs of both kinds. */
typedef struct {
  int nd, R, K;
  gboolean ranks;
  GPtrArray *member;     /* per distinct set: a device-by-device membership array       */
  int *set_of;           /* per collective: its distinct set                             */
  int8_t *set_whole;     /* per set: whether every symmetry maps it onto itself (-1: not asked) */
  GArray *part;          /* FlowAt: the flows that need shadows                          */
  GArray *part_keys;     /* gint64 src * nd + dst: the pairs of the part flows           */
  GArray *whole_keys;    /*   and of the flows of collectives the symmetries keep whole   */
  GArray *host_keys;     /* gint64 2 device + way - 1: the host flows' devices and ways    */
} Shadows;

/* The flows of @tg between devices, sorted into those that need shadows (sh->part) and
 * those of whole collectives, with their distinct pairs (a pair per ring edge of a whole
 * collective's one flow).  FALSE when a collective's one flow is not a ring (a tree's),
 * whose images would not be rings. */
static gboolean collect_flows(const SimTaskGraph *tg, const SimMachine *m, const Fold *f,
                              Shadows *sh)
{
  int nd = sh->nd;
  int n_coll = tg->coll_devs ? (int)tg->coll_devs->len : 0;
  gboolean ring_ok = TRUE;
  /* The pairs seen, each with a bit for each kind: 1 whole, 2 with shadows (a table of
   * the pairs met, not of every pair: 16,384 GPUs have 268 M pairs). */
  SimKeyIndex occ_seen; /* per (collective, pair): the occurrences so far */
  sim_key_index_init(&occ_seen, 3 * sizeof(int32_t));
  SimKeyIndex kind;
  sim_key_index_init(&kind, sizeof(gint64));
  SimKeyIndex host_seen;
  sim_key_index_init(&host_seen, sizeof(gint64));
  GArray *tmp = g_array_new(FALSE, FALSE, sizeof(int32_t));
  GPtrArray *blocks = tg->blocks;
  for (guint b = 0; b < blocks->len; b++) {
    SimTaskBlock *blk = blocks->pdata[b];
    if (!blk->live)
      continue;
    const SimTask *bt = sim_block_tasks(tg, blk);
    for (guint i = 0; i < sim_block_n_tasks(blk); i++) {
      const SimTask *t = &bt[i];
      if (t->kind != SIM_TASK_FLOW)
        continue;
      int way = host_flow_way(m, blk, t, tmp);
      if (way) {
        /* A device's traffic with its host: its images are the image devices' own. */
        FlowAt at = { (int32_t)b, (int32_t)i, t->device, t->device, 0, way };
        g_array_append_val(sh->part, at);
        gint64 key = 2 * (gint64)t->device + way - 1;
        gboolean added;
        sim_key_index_get(&host_seen, &key, &added);
        if (added)
          g_array_append_val(sh->host_keys, key);
        continue;
      }
      if (t->device == t->peer)
        continue;
      gboolean whole = FALSE;
      if (t->coll >= 0 && t->coll < n_coll) {
        int sid = sh->set_of[t->coll];
        if (sh->set_whole[sid] < 0)
          sh->set_whole[sid] = (int8_t)coll_invariant(tg->coll_devs->pdata[t->coll],
                                                      sh->member->pdata[sid], f, sh->R, sh->K,
                                                      sh->ranks);
        whole = sh->set_whole[sid];
      }
      /* A pair, or the ring edges of a whole collective's one flow. */
      const int32_t *mem = t->n_links ? &g_array_index(blk->extra, int32_t, t->links_off + t->n_links)
                                      : NULL;
      int n_edges = t->n_links ? t->n_members : 1;
      if (t->n_links && !whole && !ring_links_match(m, blk, t))
        ring_ok = FALSE; /* a tree's flow: its images are not rings */
      for (int e = 0; e < n_edges; e++) {
        int src = mem ? mem[e] : t->device, dst = mem ? mem[(e + 1) % n_edges] : t->peer;
        gint64 key = (gint64)src * nd + dst;
        int32_t bit = whole ? 1 : 2;
        gboolean added;
        guint ki = sim_key_index_get(&kind, &key, &added);
        int32_t *kk = &kind.value[ki];
        if (!(*kk & bit)) {
          *kk |= bit;
          g_array_append_val(whole ? sh->whole_keys : sh->part_keys, key);
        }
      }
      if (!whole) {
        FlowAt at = { (int32_t)b, (int32_t)i, t->device, t->peer, 0 };
        if (t->coll >= 0) {
          int32_t okey[3] = { t->coll, t->n_links ? -1 : t->device, t->n_links ? -1 : t->peer };
          gboolean added;
          guint oi = sim_key_index_get(&occ_seen, okey, &added);
          at.occ = occ_seen.value[oi]++;
        }
        g_array_append_val(sh->part, at);
      }
    }
  }
  sim_key_index_free(&kind);
  sim_key_index_free(&occ_seen);
  sim_key_index_free(&host_seen);
  g_array_free(tmp, TRUE);
  return ring_ok;
}

/* Whether the simulation was cancelled (Fold.cancel). */
static gboolean fold_cancelled(const Fold *f)
{
  return f->cancel && atomic_load(f->cancel);
}

/* Whether every symmetry maps the routes of the part pairs onto routes with the same
 * links' bandwidth and latency, one to one (map_route()), and those of the whole pairs
 * too, or else onto links no part flow uses. */
static gboolean symmetries_keep_routes(const SimMachine *m, const Fold *f, const Shadows *sh)
{
  int nl = sim_machine_n_links(m), nd = sh->nd;
  gboolean ok = TRUE;
  LinkMap map = { g_new(int, MAX(nl, 1)), g_new(int, MAX(nl, 1)),
                  g_new0(int32_t, MAX(nl, 1)), g_new0(int32_t, MAX(nl, 1)), 0,
                  g_new(double, MAX(nl, 1)), g_new(double, MAX(nl, 1)) };
  for (int l = 0; l < nl; l++) {
    map.bw[l] = sim_machine_link_bandwidth(m, l);
    map.lat[l] = sim_machine_link_latency(m, l);
  }
  uint8_t *part_links = g_new0(uint8_t, MAX(nl, 1)), *whole_links = g_new0(uint8_t, MAX(nl, 1));
  /* The routes of the pairs, found once (each symmetry maps them anew), their links marked. */
  GArray *keys[2] = { sh->part_keys, sh->whole_keys };
  GArray *key_route[2], *key_off[2];
  for (int phase = 0; phase < 2; phase++) {
    key_route[phase] = g_array_new(FALSE, FALSE, sizeof(int));
    key_off[phase] = g_array_sized_new(FALSE, FALSE, sizeof(int), keys[phase]->len + 1);
    uint8_t *mark = phase ? whole_links : part_links;
    for (guint i = 0; i < keys[phase]->len; i++) {
      gint64 key = g_array_index(keys[phase], gint64, i);
      int n1, off = (int)key_route[phase]->len;
      const int *r1 = sim_machine_route(m, (int)(key / nd), (int)(key % nd), &n1);
      g_array_append_val(key_off[phase], off);
      g_array_append_vals(key_route[phase], r1, (guint)n1);
      for (int h = 0; h < n1; h++)
        mark[r1[h]] = 1;
    }
    int end = (int)key_route[phase]->len;
    g_array_append_val(key_off[phase], end);
  }
  /* The host flows' PCIe links are part links too. */
  GArray *h1 = g_array_new(FALSE, FALSE, sizeof(int32_t)), *h2 = g_array_new(FALSE, FALSE, sizeof(int32_t));
  for (guint i = 0; i < sh->host_keys->len; i++) {
    gint64 key = g_array_index(sh->host_keys, gint64, i);
    host_links_into(m, (int)(key / 2), (int)(key % 2) + 1, h1);
    for (guint h = 0; h < h1->len; h++)
      part_links[g_array_index(h1, int32_t, h)] = 1;
  }
  gboolean whole_symmetric = TRUE;
  for (int r = 0; ok && r < sh->R; r++)
    for (int k = 0; ok && k < sh->K; k++) {
      if (r == 0 && k == 0)
        continue;
      if (fold_cancelled(f)) {
        ok = FALSE;
        break;
      }
      map.stamp++; /* an empty map for this symmetry */
      for (int phase = 0; phase < 2 && ok; phase++) {
        GArray *set = keys[phase];
        const int *off = (const int *)(const void *)key_off[phase]->data;
        const int *routes = (const int *)(const void *)key_route[phase]->data;
        for (guint i = 0; ok && i < set->len; i++) {
          gint64 key = g_array_index(set, gint64, i);
          int a = (int)(key / nd), b = (int)(key % nd);
          int pa = fold_map(f, a, r, k, sh->ranks), pb = fold_map(f, b, r, k, sh->ranks);
          if (!map_route(m, routes + off[i], off[i + 1] - off[i], pa, pb, &map,
                         phase ? whole_links : part_links)) {
            if (phase)
              whole_symmetric = FALSE;
            else
              ok = FALSE;
          }
        }
        /* Each device's host links onto its image's, in the same map. */
        for (guint i = 0; ok && phase == 0 && i < sh->host_keys->len; i++) {
          gint64 key = g_array_index(sh->host_keys, gint64, i);
          int d = (int)(key / 2), way = (int)(key % 2) + 1;
          host_links_into(m, d, way, h1);
          host_links_into(m, fold_map(f, d, r, k, sh->ranks), way, h2);
          ok = map_links((const int *)(const void *)h1->data, (int)h1->len,
                         (const int *)(const void *)h2->data, (int)h2->len, TRUE, &map,
                         part_links);
        }
      }
    }
  g_array_free(h1, TRUE);
  g_array_free(h2, TRUE);
  for (int phase = 0; phase < 2; phase++) {
    g_array_free(key_route[phase], TRUE);
    g_array_free(key_off[phase], TRUE);
  }
  if (ok && !whole_symmetric)
    for (int l = 0; l < nl && ok; l++)
      ok = !(whole_links[l] && part_links[l]);
  g_free(map.lam);
  g_free(map.inv);
  g_free(map.lam_at);
  g_free(map.inv_at);
  g_free(map.bw);
  g_free(map.lat);
  g_free(part_links);
  g_free(whole_links);
  return ok;
}

/* The predecessors of each part flow (an array of SimTaskRef, or NULL), by its index in
 * sh->part; freed by free_preds(). */
static GArray **part_preds(SimTaskGraph *tg, const Shadows *sh)
{
  GPtrArray *blocks = tg->blocks;
  /* Each block's part flows by index. */
  GPtrArray *slot = g_ptr_array_new_with_free_func(g_free);
  g_ptr_array_set_size(slot, blocks->len);
  for (guint q = 0; q < sh->part->len; q++) {
    FlowAt at = g_array_index(sh->part, FlowAt, q);
    int32_t **sl = (int32_t **)&slot->pdata[at.block];
    if (!*sl) {
      guint n = sim_block_n_tasks(sim_taskgraph_block(tg, at.block));
      *sl = g_new(int32_t, n);
      for (guint i = 0; i < n; i++)
        (*sl)[i] = -1;
    }
    (*sl)[at.index] = (int32_t)q;
  }
  GArray **preds = g_new0(GArray *, sh->part->len);
  for (guint b = 0; b < blocks->len; b++) {
    SimTaskBlock *blk = blocks->pdata[b];
    if (!blk->live)
      continue;
    for (guint e = 0; e < blk->edges->len; e++) {
      const SimTaskEdge *ed = &g_array_index(blk->edges, SimTaskEdge, e);
      const int32_t *sl = ed->to.block < (int)slot->len ? slot->pdata[ed->to.block] : NULL;
      if (!sl || sl[ed->to.index] < 0)
        continue;
      GArray **pa = &preds[sl[ed->to.index]];
      if (!*pa)
        *pa = g_array_new(FALSE, FALSE, sizeof(SimTaskRef));
      g_array_append_val(*pa, ed->from);
    }
  }
  g_ptr_array_free(slot, TRUE);
  return preds;
}

static void free_preds(GArray **preds, guint n)
{
  for (guint q = 0; q < n; q++)
    if (preds[q])
      g_array_free(preds[q], TRUE);
  g_free(preds);
}

/* The image of a whole collective's flow @t (of block @ob) under symmetry (@r, @k): the
 * ring of the images, added to block @shadow_block. */
static SimTaskRef add_ring_image(SimTaskGraph *tg, const SimMachine *m, const Fold *f,
                                 const Shadows *sh, int shadow_block, const SimTaskBlock *ob,
                                 const SimTask *t, int r, int k)
{
  int n = t->n_members;
  int *mem = g_new(int, n);
  for (int i = 0; i < n; i++)
    mem[i] = fold_map(f, g_array_index(ob->extra, int32_t, t->links_off + t->n_links + i),
                      r, k, sh->ranks);
  GArray *links = g_array_new(FALSE, FALSE, sizeof(int));
  for (int i = 0; i < n; i++) {
    int hops;
    const int *rt = sim_machine_route(m, mem[i], mem[(i + 1) % n], &hops);
    g_array_append_vals(links, rt, (guint)hops);
  }
  SimTaskRef sr = sim_taskgraph_add_collective_flow(tg, shadow_block, t->cls, (int *)links->data,
                                                    (int)links->len, mem, n, t->bytes,
                                                    t->duration, t->op, t->mb, t->coll);
  g_array_free(links, TRUE);
  g_free(mem);
  return sr;
}

/* The links of @t, a flow of @tg's block @b (a whole ring's, or its route's), appended to
 * @out. */
static void flow_links_into(const SimTaskGraph *tg, const SimMachine *m, const SimTaskBlock *b,
                            const SimTask *t, GArray *out)
{
  if (t->n_links) {
    g_array_append_vals(out, &g_array_index(b->extra, int32_t, t->links_off), t->n_links);
  } else if (t->device != t->peer) {
    int n;
    const int *r = sim_machine_route(m, t->device, t->peer, &n);
    g_array_append_vals(out, r, (guint)n);
  }
  (void)tg;
}

/* The links of the image of part flow @t (of block @ob, its ends mapped to @dev and
 * @peer) under symmetry (@r, @k): its route, or for a whole ring's flow the routes of its
 * members' images in ring order (as add_ring_image() makes them), into @out. */
static void image_links(const SimMachine *m, const SimTaskBlock *ob, const SimTask *t, int dev,
                        int peer, const int *map, GArray *out)
{
  g_array_set_size(out, 0);
  if (!t->n_links) {
    if (dev != peer) {
      int n;
      const int *rt = sim_machine_route(m, dev, peer, &n);
      g_array_append_vals(out, rt, (guint)n);
    }
    return;
  }
  int n = t->n_members, first = -1, prev = -1;
  for (int i = 0; i <= n; i++) {
    int d = i < n ? map[g_array_index(ob->extra, int32_t, t->links_off + t->n_links + i)] : first;
    if (i == 0)
      first = d;
    else {
      int hops;
      const int *rt = sim_machine_route(m, prev, d, &hops);
      g_array_append_vals(out, rt, (guint)hops);
    }
    prev = d;
  }
}

/* Sequences of ints numbered in the order first added (0, 1, ...), found again by their
 * contents: @ints[off[i], off[i + 1]) is sequence i; open addressing over numbers plus
 * one, @mask + 1 slots, a power of two, kept at most half full. */
typedef struct {
  GArray *ints, *off, *hash;
  guint32 mask, *table;
} SeqTable;

static void seq_table_init(SeqTable *t)
{
  t->ints = g_array_new(FALSE, FALSE, sizeof(int));
  t->off = g_array_new(FALSE, FALSE, sizeof(guint64));
  t->hash = g_array_new(FALSE, FALSE, sizeof(guint64));
  guint64 zero = 0;
  g_array_append_val(t->off, zero);
  t->mask = 1023;
  t->table = g_new0(guint32, (size_t)t->mask + 1);
}

static void seq_table_clear(SeqTable *t)
{
  g_array_free(t->ints, TRUE);
  g_array_free(t->off, TRUE);
  g_array_free(t->hash, TRUE);
  g_free(t->table);
}

/* The number of @seq (@n ints), added where it is new (@added). */
static guint32 seq_table_get(SeqTable *t, const int *seq, guint n, gboolean *added)
{
  size_t bytes = n * sizeof(int);
  guint64 h = sim_hash_bytes(seq, bytes);
  guint32 slot = (guint32)h & t->mask;
  for (; t->table[slot]; slot = (slot + 1) & t->mask) {
    guint32 e = t->table[slot] - 1;
    guint64 o = g_array_index(t->off, guint64, e);
    if (g_array_index(t->hash, guint64, e) == h &&
        g_array_index(t->off, guint64, e + 1) - o == n &&
        !memcmp(&g_array_index(t->ints, int, o), seq, bytes)) {
      *added = FALSE;
      return e;
    }
  }
  guint32 id = t->hash->len;
  g_array_append_val(t->hash, h);
  g_array_append_vals(t->ints, seq, n);
  guint64 end = t->ints->len;
  g_array_append_val(t->off, end);
  t->table[slot] = id + 1;
  if (2 * (guint64)t->hash->len > t->mask) {
    guint32 nmask = 2 * t->mask + 1, *nt = g_new0(guint32, (size_t)nmask + 1);
    for (guint32 i = 0; i < t->hash->len; i++) {
      guint32 sl = (guint32)g_array_index(t->hash, guint64, i) & nmask;
      while (nt[sl])
        sl = (sl + 1) & nmask;
      nt[sl] = i + 1;
    }
    g_free(t->table);
    t->table = nt;
    t->mask = nmask;
  }
  *added = TRUE;
  return id;
}

/* What decides an image's links, in a form equal images share: a pair's two devices, or
 * a ring's members from the smallest on (a ring's links are the routes between its
 * members in their order round the ring, whichever member it starts from). */
static void image_key(const SimTaskBlock *ob, const SimTask *t, int dev, int peer,
                      const int *map, GArray *key)
{
  g_array_set_size(key, 0);
  if (!t->n_links) {
    int pair[3] = { -1, dev, peer };
    g_array_append_vals(key, pair, 3);
    return;
  }
  int n = t->n_members, low = 0;
  g_array_set_size(key, (guint)n + 1);
  int *kk = (int *)(void *)key->data;
  kk[0] = n;
  const int32_t *mem = &g_array_index(ob->extra, int32_t, t->links_off + t->n_links);
  for (int i = 0; i < n; i++) {
    kk[1 + i] = map[mem[i]];
    if (kk[1 + i] < kk[1 + low])
      low = i;
  }
  int *tmp = g_newa(int, n);
  for (int i = 0; i < n; i++)
    tmp[i] = kk[1 + (low + i) % n];
  memcpy(kk + 1, tmp, sizeof(int) * (size_t)n);
}

/* Which shadows to make where the caller leaves out those apart (Fold.prune): per
 * symmetry (r * K + k) and part flow, 1 where the image's links meet a link that a flow
 * of @tg (before the shadows) crosses, or that a shadow so kept crosses, found by passes
 * until none is added.  A shadow left out has no successor and no link in common with
 * any task that runs: every simulated task runs as with it, and it would have ended when
 * its original does (the folding is exact), so the run ends at the same time. */
static uint8_t *shadows_to_keep(SimTaskGraph *tg, const SimMachine *m, const Fold *f,
                                const Shadows *sh)
{
  int nl = sim_machine_n_links(m);
  uint8_t *live = g_new0(uint8_t, MAX(nl, 1));
  GArray *links = g_array_new(FALSE, FALSE, sizeof(int));
  for (guint b = 0; b < tg->blocks->len; b++) {
    const SimTaskBlock *blk = tg->blocks->pdata[b];
    if (!blk->live)
      continue;
    const SimTask *bt = sim_block_tasks(tg, blk);
    for (guint i = 0; i < sim_block_n_tasks(blk); i++) {
      if (bt[i].kind != SIM_TASK_FLOW)
        continue;
      g_array_set_size(links, 0);
      flow_links_into(tg, m, blk, &bt[i], links);
      for (guint j = 0; j < links->len; j++)
        live[g_array_index(links, int, j)] = 1;
    }
  }
  if (tg->step_links)
    for (guint j = 0; j < tg->step_links->len; j++)
      live[g_array_index(tg->step_links, int, j)] = 1;
  guint np = sh->part->len;
  size_t n_cand = (size_t)sh->R * sh->K * np;
  uint8_t *keep = g_new0(uint8_t, MAX(n_cand, 1));
  /* Each image's links are worked out once.  An image that meets a live link is kept at
   * once and makes its links live (those it makes live are stacked); the others wait
   * until a link of theirs is made live.  Images of equal links wait as one set, and an
   * image met before (a ring's under another rotation of its ranks, most of them) takes
   * the verdict of the first.  The kept images are the least set closed under "meets a
   * live link", whatever the order: the set that passes over every image until none is
   * added would find, without working out the images of those left again on each pass
   * (a plan whose 8 replicas and 8 ranks fold has 63 images of every part flow, which
   * passes went over again and again). */
  GArray *stack = g_array_new(FALSE, FALSE, sizeof(int));      /* links made live        */
  GArray *pend_c = g_array_new(FALSE, FALSE, sizeof(guint64)); /* waiting images         */
  GArray *pend_set = g_array_new(FALSE, FALSE, sizeof(guint32));
  SeqTable sets, keys; /* the waiting sets' links; the images' keys (image_key()) */
  seq_table_init(&sets);
  seq_table_init(&keys);
  GArray *verdict = g_array_new(FALSE, FALSE, sizeof(gint32)); /* per key: -1 kept, a
                                                               * waiting set, -2 no links */
  GArray *key = g_array_new(FALSE, FALSE, sizeof(int));
  /* Every device's image under the symmetry at hand. */
  int *map = g_new(int, MAX(sh->nd, 1));
  for (int r = 0; r < sh->R; r++)
    for (int k = 0; k < sh->K; k++) {
      if (r == 0 && k == 0)
        continue;
      if (fold_cancelled(f))
        break; /* what was kept is dropped with the lowering */
      for (int d = 0; d < sh->nd; d++)
        map[d] = fold_map(f, d, r, k, sh->ranks);
      for (guint q = 0; q < np; q++) {
        guint64 c = ((guint64)r * sh->K + k) * np + q;
        FlowAt at = g_array_index(sh->part, FlowAt, q);
        const SimTaskBlock *ob = sim_taskgraph_block(tg, at.block);
        const SimTask *t = &sim_block_tasks(tg, ob)[at.index];
        int ma = at.a >= 0 ? map[at.a] : at.a, mb = at.b >= 0 ? map[at.b] : at.b;
        /* (A copy between a device and its host: the device and the way.) */
        if (at.host) {
          int hk[3] = { -2, ma, at.host };
          g_array_set_size(key, 0);
          g_array_append_vals(key, hk, 3);
        } else {
          image_key(ob, t, ma, mb, map, key);
        }
        gboolean added;
        guint32 kid = seq_table_get(&keys, (const int *)(void *)key->data, key->len, &added);
        if (!added) {
          gint32 v = g_array_index(verdict, gint32, kid);
          if (v == -1) {
            keep[c] = 1;
          } else if (v >= 0) {
            guint32 set = (guint32)v;
            g_array_append_val(pend_c, c);
            g_array_append_val(pend_set, set);
          }
          continue;
        }
        gint32 none = -2;
        g_array_append_val(verdict, none);
        if (at.host)
          host_links_into(m, ma, at.host, links);
        else
          image_links(m, ob, t, ma, mb, map, links);
        gboolean meets = FALSE;
        for (guint j = 0; j < links->len && !meets; j++)
          meets = live[g_array_index(links, int, j)];
        if (meets) {
          g_array_index(verdict, gint32, kid) = -1;
          keep[c] = 1;
          for (guint j = 0; j < links->len; j++) {
            int l = g_array_index(links, int, j);
            if (!live[l]) {
              live[l] = 1;
              g_array_append_val(stack, l);
            }
          }
          continue;
        }
        if (!links->len)
          continue;
        guint32 set = seq_table_get(&sets, (const int *)(void *)links->data, links->len, &added);
        g_array_index(verdict, gint32, kid) = (gint32)set;
        g_array_append_val(pend_c, c);
        g_array_append_val(pend_set, set);
      }
    }
  guint n_sets = sets.hash->len;
  uint8_t *set_kept = g_new0(uint8_t, MAX(n_sets, 1));
  if (stack->len && n_sets) {
    /* The waiting sets by link: by_link[first[l], first[l + 1]). */
    const int *sl = (const int *)(void *)sets.ints->data;
    const guint64 *so = (const guint64 *)(void *)sets.off->data;
    guint64 n_links = so[n_sets];
    guint64 *first = g_new0(guint64, (size_t)nl + 1);
    for (guint64 i = 0; i < n_links; i++)
      first[sl[i] + 1]++;
    for (int l = 0; l < nl; l++)
      first[l + 1] += first[l];
    guint64 *fill = g_memdup2(first, sizeof(guint64) * (size_t)nl);
    guint32 *by_link = g_new(guint32, MAX(n_links, 1));
    for (guint32 p = 0; p < n_sets; p++)
      for (guint64 i = so[p]; i < so[p + 1]; i++)
        by_link[fill[sl[i]]++] = p;
    g_free(fill);
    while (stack->len) {
      int l = g_array_index(stack, int, stack->len - 1);
      g_array_set_size(stack, stack->len - 1);
      for (guint64 i = first[l]; i < first[l + 1]; i++) {
        guint32 p = by_link[i];
        if (set_kept[p])
          continue;
        set_kept[p] = 1;
        for (guint64 j = so[p]; j < so[p + 1]; j++)
          if (!live[sl[j]]) {
            live[sl[j]] = 1;
            g_array_append_val(stack, sl[j]);
          }
      }
    }
    g_free(by_link);
    g_free(first);
  }
  for (guint i = 0; i < pend_c->len; i++)
    if (set_kept[g_array_index(pend_set, guint32, i)])
      keep[g_array_index(pend_c, guint64, i)] = 1;
  g_free(set_kept);
  g_free(map);
  seq_table_clear(&sets);
  seq_table_clear(&keys);
  g_array_free(verdict, TRUE);
  g_array_free(key, TRUE);
  g_array_free(stack, TRUE);
  g_array_free(pend_c, TRUE);
  g_array_free(pend_set, TRUE);
  g_array_free(links, TRUE);
  g_free(live);
  return keep;
}

/* The shadows: under each symmetry but the identity, the image of every part flow, in a
 * block of their own, after the image's predecessors' originals. */
static void add_shadow_tasks(SimTaskGraph *tg, const SimMachine *m, Fold *f,
                             const Shadows *sh)
{
  GArray **preds = part_preds(tg, sh);
  uint8_t *keep = f->prune && !f->checked && !f->watch ? shadows_to_keep(tg, m, f, sh) : NULL;
  int shadow_block = sim_taskgraph_block_new(tg);
  /* A collective's flows map onto each other under its own symmetries, so different
   * symmetries can give one flow the same image: one shadow per image and collective. */
  SimKeyIndex made;
  sim_key_index_init(&made, 4 * sizeof(int32_t));
  /* The shadow made for each key (SimTaskRef), where the run is checked. */
  GArray *made_ref = g_array_new(FALSE, TRUE, sizeof(SimTaskRef));
  /* The smallest image of each distinct set, worked out once per symmetry. */
  int *set_low = g_new(int, MAX(sh->member->len, 1));
  int *set_low_at = g_new(int, MAX(sh->member->len, 1));
  GArray *host_links = g_array_new(FALSE, FALSE, sizeof(int32_t));
  for (guint i = 0; i < sh->member->len; i++)
    set_low_at[i] = -1;
  for (int r = 0; r < sh->R; r++)
    for (int k = 0; k < sh->K; k++) {
      if (r == 0 && k == 0)
        continue;
      if (fold_cancelled(f))
        break; /* dropped with the lowering */
      int rk = r * sh->K + k;
      for (guint q = 0; q < sh->part->len; q++) {
        if (keep && !keep[(size_t)rk * sh->part->len + q])
          continue; /* apart: left out (the same images of one collective alike) */
        FlowAt at = g_array_index(sh->part, FlowAt, q);
        SimTaskBlock *ob = sim_taskgraph_block(tg, at.block);
        SimTask t = sim_block_tasks(tg, ob)[at.index];
        int made_at = -1;
        t.device = fold_map(f, at.a, r, k, sh->ranks);
        t.peer = fold_map(f, at.b, r, k, sh->ranks);
        if (!at.host && t.coll >= 0) {
          /* An image inside the collective's own devices is one of its own flows. */
          int sid = sh->set_of[t.coll];
          const uint8_t *in = sh->member->pdata[sid];
          if (in[t.device] && in[t.peer])
            continue;
          /* Rotations of one image set give the same collective: key it by its set (its
           * smallest device) and, for a flow per rank, by the pair. */
          int low = -1;
          if (t.n_links) {
            if (set_low_at[sid] != rk) {
              const GArray *set = tg->coll_devs->pdata[t.coll];
              int m0 = G_MAXINT;
              for (guint i = 0; i < set->len; i++)
                m0 = MIN(m0, fold_map(f, g_array_index(set, int, i), r, k, sh->ranks));
              set_low[sid] = m0;
              set_low_at[sid] = rk;
            }
            low = set_low[sid];
          }
          int32_t key[4] = { t.n_links ? low : t.device, t.n_links ? -1 : t.peer, t.coll,
                             at.occ };
          gboolean added;
          made_at = sim_key_index_get(&made, key, &added);
          if (!added) {
            /* A checked run compares the image with this original too. */
            if (f->watch) {
              SimTaskRef orig = { at.block, at.index };
              g_array_append_val(f->watch, orig);
              g_array_append_val(f->watch, g_array_index(made_ref, SimTaskRef, made_at));
            }
            continue;
          }
        }
        SimTaskRef sr;
        if (at.host) {
          /* The image device's flow with its host, over its own PCIe links (the same
           * latency: the route check mapped them link by link). */
          host_links_into(m, t.device, at.host, host_links);
          sr = sim_taskgraph_add_collective_flow(
            tg, shadow_block, t.cls, (const int *)(const void *)host_links->data,
            (int)host_links->len, &t.device, 1, t.bytes, t.duration, t.op, t.mb, -1);
        } else {
          sr = t.n_links ? add_ring_image(tg, m, f, sh, shadow_block, ob, &t, r, k)
                         : sim_taskgraph_add(tg, shadow_block, &t);
        }
        if (made_at >= 0) {
          if (made_ref->len <= (guint)made_at)
            g_array_set_size(made_ref, (guint)made_at + 1);
          g_array_index(made_ref, SimTaskRef, made_at) = sr;
        }
        for (guint j = 0; preds[q] && j < preds[q]->len; j++)
          sim_taskgraph_depend(tg, shadow_block, g_array_index(preds[q], SimTaskRef, j), sr);
        if (f->watch) {
          SimTaskRef orig = { at.block, at.index };
          g_array_append_val(f->watch, orig);
          g_array_append_val(f->watch, sr);
        }
      }
    }
  g_free(keep);
  sim_key_index_free(&made);
  g_array_free(made_ref, TRUE);
  g_free(set_low);
  g_free(set_low_at);
  g_array_free(host_links, TRUE);
  free_preds(preds, sh->part->len);
}

/* The route, shifted to replica @q under rank shift @k, of replica 0's flow @i to be
 * shadowed (Shadows.part_keys), where it stays inside replica 0; NULL otherwise. */
static const int *shifted_route(const SimMachine *m, const Fold *f, const Shadows *sh, int q,
                                int k, guint i, int *n)
{
  int nd = sh->nd;
  gint64 key = g_array_index(sh->part_keys, gint64, i);
  int a = (int)(key / nd), b = (int)(key % nd);
  if (f->repl[a] != 0 || f->repl[b] != 0)
    return NULL;
  return sim_machine_route(m, fold_map(f, a, q, k, sh->ranks), fold_map(f, b, q, k, sh->ranks),
                           n);
}

/* One replica's signature: its flows (those of replica 0's flows to be shadowed that stay
 * inside replica 0, shifted to replica @q, under every rank shift) hop by hop, each link's
 * bandwidth, latency and the number of replicas (@crossing) whose flows cross it. */
static void replica_signature(const SimMachine *m, const Fold *f, const Shadows *sh,
                              const int32_t *crossing, int q, GArray *sig)
{
  g_array_set_size(sig, 0);
  for (int k = 0; k < sh->K; k++)
    for (guint i = 0; i < sh->part_keys->len; i++) {
      int n;
      const int *r = shifted_route(m, f, sh, q, k, i, &n);
      if (!r)
        continue;
      double len = n;
      g_array_append_val(sig, len);
      for (int h = 0; h < n; h++) {
        double x[3] = { sim_machine_link_bandwidth(m, r[h]), sim_machine_link_latency(m, r[h]),
                        crossing ? crossing[r[h]] : 0 };
        g_array_append_vals(sig, x, 3);
      }
    }
}

/* Where the route check refused to fold the replicas (the network does not map one
 * replica's traffic onto another's link by link, as when a gradient ring's edge inside a
 * leaf becomes an edge across leaves): whether every replica's flows still meet, hop by
 * hop, links of the same bandwidth and latency crossed by as many replicas' flows as
 * replica 0's do.  Then the replicas are likely to run alike, and folding them with the
 * run checked (simulate.c) is worth a try; where they are not (replicas whose pipeline
 * sends share a spine link with other replicas', others alone), they would not. */
static gboolean replicas_meet_same_traffic(const SimMachine *m, const Fold *f, const Shadows *sh)
{
  int D = f->D, nl = sim_machine_n_links(m);
  int32_t *crossing = g_new0(int32_t, MAX(nl, 1)), *last = g_new(int32_t, MAX(nl, 1));
  for (int l = 0; l < nl; l++)
    last[l] = -1;
  for (int q = 0; q < D; q++)
    for (int k = 0; k < sh->K; k++)
      for (guint i = 0; i < sh->part_keys->len; i++) {
        int n;
        const int *r = shifted_route(m, f, sh, q, k, i, &n);
        if (!r)
          continue;
        for (int h = 0; h < n; h++)
          if (last[r[h]] != q) {
            last[r[h]] = q;
            crossing[r[h]]++;
          }
      }
  GArray *sig0 = g_array_new(FALSE, FALSE, sizeof(double));
  GArray *sig = g_array_new(FALSE, FALSE, sizeof(double));
  replica_signature(m, f, sh, crossing, 0, sig0);
  gboolean same = TRUE;
  for (int q = 1; q < D && same; q++) {
    replica_signature(m, f, sh, crossing, q, sig);
    same = sig->len == sig0->len && !memcmp(sig->data, sig0->data, sig->len * sizeof(double));
  }
  g_debug("folding: the replicas' flows %s", same ? "meet the same traffic"
                                                  : "do not all meet the same traffic");
  g_array_free(sig0, TRUE);
  g_array_free(sig, TRUE);
  g_free(crossing);
  g_free(last);
  return same;
}

gboolean add_shadows(SimTaskGraph *tg, const SimMachine *m, Fold *f, gboolean replicas,
                     gboolean ranks)
{
  Shadows sh = { .nd = f->nd, .R = replicas ? MAX(f->D, 1) : 1, .K = 1, .ranks = ranks };
  if (ranks)
    for (int c = 0; c < f->n_classes; c++)
      sh.K = MAX(sh.K, g_array_index(f->sizes, int, c));
  int n_coll = tg->coll_devs ? (int)tg->coll_devs->len : 0;
  sh.member = g_ptr_array_new_with_free_func(g_free);
  sh.set_of = distinct_sets(tg, n_coll, sh.nd, sh.member);
  sh.set_whole = g_new(int8_t, MAX(sh.member->len, 1));
  for (guint i = 0; i < sh.member->len; i++)
    sh.set_whole[i] = -1;
  sh.part = g_array_new(FALSE, FALSE, sizeof(FlowAt));
  sh.part_keys = g_array_new(FALSE, FALSE, sizeof(gint64));
  sh.whole_keys = g_array_new(FALSE, FALSE, sizeof(gint64));
  sh.host_keys = g_array_new(FALSE, FALSE, sizeof(gint64));

  gboolean ok = collect_flows(tg, m, f, &sh);
  if (ok && !f->checked && !symmetries_keep_routes(m, f, &sh)) {
    ok = FALSE;
    f->may_check = f->ask_check && replicas && sh.R > 1 && replicas_meet_same_traffic(m, f, &sh);
  }
  if (ok && f->checked && !f->watch)
    f->watch = g_array_new(FALSE, FALSE, sizeof(SimTaskRef));
  if (ok && sh.part->len)
    add_shadow_tasks(tg, m, f, &sh);

  g_free(sh.set_whole);
  g_free(sh.set_of);
  g_ptr_array_free(sh.member, TRUE);
  g_array_free(sh.part_keys, TRUE);
  g_array_free(sh.whole_keys, TRUE);
  g_array_free(sh.host_keys, TRUE);
  g_array_free(sh.part, TRUE);
  return ok;
}
