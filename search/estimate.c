/* estimate.c — an analytic estimate of a strategy's cost, as OptCNN defines it: a sum
 * of node costs (what an operator costs under its configuration) and edge costs (what
 * moving data between two operators' configurations costs).
 *
 * Node: one shard's forward, backward and update time from the cost model, the ring
 * all-reduce of the weight gradients among the shards that hold the same weights, and the
 * all-reduce of partial sums when a contracted dimension is split.  Edge: for each shard
 * of the consumer, the bytes of its input region that no producer shard on its own device
 * holds, fetched from the best-connected holder; the slowest consumer shard sets the
 * time, paid once forward (activations) and once backward (gradients).  Overlap and
 * contention are ignored: that is what the simulator is for.  The dynamic programs
 * minimize this sum because it decomposes over the graph; the simulator judges the result.
 *
 * Regions come from sim_graph_op_shard_region(), so every operator the catalogue has is
 * priced the way the lowering moves its data. */
#include "search-private.h"

#include <string.h>

#define MAX_SHARDS 256
#define MAX_PAIRS 4

typedef struct {
  int src, dst;
  int n_pairs;
  int out_slot[MAX_PAIRS];
  int in_slot[MAX_PAIRS];
} Edge;

/* An open-addressing map from 64-bit keys to doubles: the edge cache sees millions of
 * lookups in a dynamic program, and a GHashTable would allocate per entry. */
typedef struct {
  guint64 *keys;   /* 0 marks an empty slot; keys are stored plus one */
  double *vals;
  gsize cap, len;
} Cache;

static void cache_init(Cache *c)
{
  c->cap = 1024;
  c->len = 0;
  c->keys = g_new0(guint64, c->cap);
  c->vals = g_new(double, c->cap);
}

static void cache_clear(Cache *c)
{
  g_free(c->keys);
  g_free(c->vals);
}

static inline gsize cache_hash(guint64 k)
{
  k ^= k >> 33;
  k *= G_GUINT64_CONSTANT(0xff51afd7ed558ccd);
  k ^= k >> 33;
  return (gsize)k;
}

static gboolean cache_get(const Cache *c, guint64 key, double *v)
{
  guint64 k = key + 1;
  for (gsize i = cache_hash(k) & (c->cap - 1);; i = (i + 1) & (c->cap - 1)) {
    if (c->keys[i] == 0)
      return FALSE;
    if (c->keys[i] == k) {
      *v = c->vals[i];
      return TRUE;
    }
  }
}

static void cache_put(Cache *c, guint64 key, double v)
{
  if (2 * (c->len + 1) > c->cap) {
    Cache bigger = { .cap = c->cap * 2 };
    bigger.keys = g_new0(guint64, bigger.cap);
    bigger.vals = g_new(double, bigger.cap);
    for (gsize i = 0; i < c->cap; i++)
      if (c->keys[i])
        cache_put(&bigger, c->keys[i] - 1, c->vals[i]);
    cache_clear(c);
    *c = bigger;
  }
  guint64 k = key + 1;
  gsize i = cache_hash(k) & (c->cap - 1);
  while (c->keys[i] != 0 && c->keys[i] != k)
    i = (i + 1) & (c->cap - 1);
  if (c->keys[i] == 0)
    c->len++;
  c->keys[i] = k;
  c->vals[i] = v;
}

/* The regions one tensor of an op takes in each shard under a configuration, and which
 * shards hold the same region (group_of[s]: the first shard of s's group). */
typedef struct {
  int n;
  int *group_of;
  SimRegion *r;
} Regions;

static void regions_free(gpointer data)
{
  Regions *x = data;
  g_free(x->group_of);
  g_free(x->r);
  g_free(x);
}

struct _SearchEstimate {
  const SearchProblem *p;
  int n_ops;
  int nd;                 /* problem devices                                        */
  double *bw;             /* nd x nd, bytes/s between problem devices               */
  double *lat;
  GArray *edges;          /* Edge                                                   */
  GArray **op_edges;      /* per op: edge ids                                       */
  double **node;          /* per op and config: NAN until computed                  */
  Cache edge_cache;
  GHashTable *regions;    /* (op, role, slot, cfg) -> Regions                        */
  /* Scratch regions. */
  SimRegion ra[MAX_SHARDS];
  int group_of[MAX_SHARDS];
};

SearchEstimate *search_estimate_new(const SearchProblem *p)
{
  g_return_val_if_fail(p != NULL, NULL);
  search_problem_prepare(p);
  SearchEstimate *e = g_new0(SearchEstimate, 1);
  e->p = p;
  e->n_ops = sim_graph_n_ops(p->g);
  e->nd = p->n_devices;
  e->bw = g_new(double, (gsize)e->nd * e->nd);
  e->lat = g_new(double, (gsize)e->nd * e->nd);
  for (int i = 0; i < e->nd; i++)
    for (int j = 0; j < e->nd; j++) {
      gsize k = (gsize)i * e->nd + j;
      if (i == j) {
        e->bw[k] = INFINITY;
        e->lat[k] = 0;
      } else {
        e->bw[k] = sim_machine_bandwidth(p->m, p->devices[i], p->devices[j]);
        e->lat[k] = sim_machine_latency(p->m, p->devices[i], p->devices[j]);
        if (!(e->bw[k] > 0))
          e->bw[k] = 1e9;
      }
    }

  /* One edge per (producer, consumer) pair, whatever the number of tensors between them. */
  e->edges = g_array_new(FALSE, FALSE, sizeof(Edge));
  e->op_edges = g_new0(GArray *, MAX(e->n_ops, 1));
  for (int op = 0; op < e->n_ops; op++)
    e->op_edges[op] = g_array_new(FALSE, FALSE, sizeof(int));
  for (int c = 0; c < e->n_ops; c++) {
    for (int i = 0; i < sim_graph_op_n_inputs(p->g, c); i++) {
      int t = sim_graph_op_input(p->g, c, i);
      int src = sim_graph_tensor_producer(p->g, t);
      if (src < 0 || src == c)
        continue;
      int slot = 0;
      for (int o = 0; o < sim_graph_op_n_outputs(p->g, src); o++)
        if (sim_graph_op_output(p->g, src, o) == t)
          slot = o;
      Edge *found = NULL;
      GArray *mine = e->op_edges[c];
      for (guint k = 0; k < mine->len && !found; k++) {
        Edge *x = &g_array_index(e->edges, Edge, g_array_index(mine, int, k));
        if (x->src == src && x->dst == c)
          found = x;
      }
      if (found) {
        if (found->n_pairs < MAX_PAIRS) {
          found->out_slot[found->n_pairs] = slot;
          found->in_slot[found->n_pairs] = i;
          found->n_pairs++;
        }
        continue;
      }
      Edge ed = { .src = src, .dst = c, .n_pairs = 1 };
      ed.out_slot[0] = slot;
      ed.in_slot[0] = i;
      int id = (int)e->edges->len;
      g_array_append_val(e->edges, ed);
      g_array_append_val(e->op_edges[src], id);
      g_array_append_val(e->op_edges[c], id);
    }
  }
  e->node = g_new0(double *, MAX(e->n_ops, 1));
  for (int op = 0; op < e->n_ops; op++) {
    int n = search_problem_n_configs(p, op);
    e->node[op] = g_new(double, MAX(n, 1));
    for (int i = 0; i < n; i++)
      e->node[op][i] = NAN;
  }
  cache_init(&e->edge_cache);
  e->regions = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, regions_free);
  return e;
}

void search_estimate_free(SearchEstimate *e)
{
  if (!e)
    return;
  g_free(e->bw);
  g_free(e->lat);
  g_array_unref(e->edges);
  for (int op = 0; op < e->n_ops; op++) {
    g_array_unref(e->op_edges[op]);
    g_free(e->node[op]);
  }
  g_free(e->op_edges);
  g_free(e->node);
  cache_clear(&e->edge_cache);
  g_hash_table_unref(e->regions);
  g_free(e);
}

int search_estimate_n_edges(const SearchEstimate *e)
{
  return (int)e->edges->len;
}

void search_estimate_edge_ends(const SearchEstimate *e, int edge, int *src, int *dst)
{
  const Edge *x = &g_array_index(e->edges, Edge, edge);
  if (src)
    *src = x->src;
  if (dst)
    *dst = x->dst;
}

const int *search_estimate_op_edges(const SearchEstimate *e, int op, int *n)
{
  *n = (int)e->op_edges[op]->len;
  return (const int *)e->op_edges[op]->data;
}

/* The iteration box of shard @s of @c (row-major shard order, the last dimension fastest). */
static void shard_box(const SearchEstimate *e, int op, const SearchConfig *c, int s, int64_t *lo,
                      int64_t *hi)
{
  int nd = sim_graph_op_n_dims(e->p->g, op);
  for (int d = nd - 1; d >= 0; d--) {
    int k = c->degree[d];
    int coord = s % k;
    s /= k;
    int64_t size = sim_graph_op_dim_size(e->p->g, op, d);
    lo[d] = coord * size / k;
    hi[d] = (coord + 1) * size / k;
  }
}

static gboolean region_equal(const SimRegion *a, const SimRegion *b)
{
  if (a->ndim != b->ndim)
    return FALSE;
  for (int i = 0; i < a->ndim; i++)
    if (a->lo[i] != b->lo[i] || a->hi[i] != b->hi[i])
      return FALSE;
  return TRUE;
}

static int64_t overlap(const SimRegion *a, const SimRegion *b)
{
  int64_t v = 1;
  for (int i = 0; i < a->ndim && i < b->ndim; i++) {
    int64_t lo = MAX(a->lo[i], b->lo[i]), hi = MIN(a->hi[i], b->hi[i]);
    if (hi <= lo)
      return 0;
    v *= hi - lo;
  }
  return v;
}

static int elem_size(SimDType t)
{
  int s = sim_dtype_size(t);
  return s > 0 ? s : 4;
}

/* Groups the shards whose regions @r are equal: group_of[s] is the first shard of s's
 * group.  Returns the number of groups. */
static int group_regions(SearchEstimate *e, const SimRegion *r, int n)
{
  int groups = 0;
  for (int s = 0; s < n; s++) {
    e->group_of[s] = s;
    for (int t = 0; t < s; t++) {
      if (e->group_of[t] == t && region_equal(&r[t], &r[s])) {
        e->group_of[s] = t;
        break;
      }
    }
    if (e->group_of[s] == s)
      groups++;
  }
  return groups;
}

/* A ring all-reduce of @bytes among the shards of @c in shard 0's group. */
static double allreduce_time(SearchEstimate *e, const SearchConfig *c, int n, double bytes)
{
  int members[MAX_SHARDS], r = 0;
  for (int s = 0; s < n; s++)
    if (e->group_of[s] == e->group_of[0])
      members[r++] = c->start + s;
  if (r <= 1 || bytes <= 0)
    return 0;
  double bw = INFINITY, lat = 0;
  for (int i = 0; i < r; i++) {
    int a = members[i], b = members[(i + 1) % r];
    gsize k = (gsize)a * e->nd + b;
    if (a != b) {
      bw = MIN(bw, e->bw[k]);
      lat = MAX(lat, e->lat[k]);
    }
  }
  if (!isfinite(bw))
    return 0;
  return 2.0 * (r - 1) / r * bytes / bw + 2.0 * (r - 1) * lat;
}

double search_estimate_node(SearchEstimate *e, int op, int cfg)
{
  double *slot = &e->node[op][cfg];
  if (!isnan(*slot))
    return *slot;
  const SearchProblem *p = e->p;
  const SimGraph *g = p->g;
  const SearchConfig *c = search_problem_config(p, op, cfg);
  int nd = sim_graph_op_n_dims(g, op);
  int64_t extent[SEARCH_MAX_DIMS];
  for (int d = 0; d < nd; d++)
    extent[d] = sim_graph_op_dim_size(g, op, d) / c->degree[d];
  const SimDeviceSpec *spec = sim_machine_device_spec(p->m, p->devices[c->start]);
  double t = 0;
  for (SimPass pass = SIM_PASS_FORWARD; pass < SIM_PASS_COUNT; pass++)
    t += sim_cost_model_op_time(p->cost, spec, g, op, extent, pass);

  int n = MIN(c->n, MAX_SHARDS);
  int64_t lo[SEARCH_MAX_DIMS], hi[SEARCH_MAX_DIMS];
  int out0 = sim_graph_op_output(g, op, 0);
  SimDType dt = sim_graph_tensor_dtype(g, out0);
  /* Weights shared with another op are synchronized at their owner. */
  int owner = sim_graph_op_weight_owner(g, op);
  int first_w = owner >= 0 && owner != op ? sim_graph_op_n_weights(g, owner) : 0;
  for (int w = first_w; w < sim_graph_op_n_weights(g, op); w++) {
    for (int s = 0; s < n; s++) {
      shard_box(e, op, c, s, lo, hi);
      sim_graph_op_shard_region(g, op, SIM_TENSOR_WEIGHT, w, lo, hi, &e->ra[s]);
    }
    int groups = group_regions(e, e->ra, n);
    if (groups < n)
      t += allreduce_time(e, c, n, (double)sim_region_volume(&e->ra[0]) * elem_size(dt));
  }
  /* Partial sums: shards that write the same output region each hold a part of it. */
  for (int s = 0; s < n; s++) {
    shard_box(e, op, c, s, lo, hi);
    sim_graph_op_shard_region(g, op, SIM_TENSOR_OUTPUT, 0, lo, hi, &e->ra[s]);
  }
  gboolean reduction_split = FALSE;
  for (int d = 0; d < nd; d++)
    if (c->degree[d] > 1 && sim_graph_op_dim_role(g, op, d) == SIM_ROLE_REDUCTION)
      reduction_split = TRUE;
  if (reduction_split && group_regions(e, e->ra, n) < n)
    t += allreduce_time(e, c, n, (double)sim_region_volume(&e->ra[0]) * elem_size(dt));
  *slot = t;
  return t;
}

/* The regions of tensor @slot of @role of @op in each shard of configuration @cfg,
 * computed once: the dynamic programs price every pair of candidates of every edge. */
static const Regions *shard_regions(SearchEstimate *e, int op, int cfg, SimTensorRole role,
                                    int slot)
{
  gint64 key = ((((gint64)op << 2 | role) << 3 | slot) << 24) | cfg;
  Regions *x = g_hash_table_lookup(e->regions, &key);
  if (x)
    return x;
  const SearchConfig *c = search_problem_config(e->p, op, cfg);
  x = g_new0(Regions, 1);
  x->n = MIN(c->n, MAX_SHARDS);
  x->r = g_new(SimRegion, x->n);
  x->group_of = g_new(int, x->n);
  int64_t lo[SEARCH_MAX_DIMS], hi[SEARCH_MAX_DIMS];
  for (int sh = 0; sh < x->n; sh++) {
    shard_box(e, op, c, sh, lo, hi);
    sim_graph_op_shard_region(e->p->g, op, role, slot, lo, hi, &x->r[sh]);
  }
  group_regions(e, x->r, x->n);
  memcpy(x->group_of, e->group_of, sizeof(int) * (gsize)x->n);
  gint64 *kp = g_new(gint64, 1);
  *kp = key;
  g_hash_table_insert(e->regions, kp, x);
  return x;
}

static double pair_cost(SearchEstimate *e, const Edge *ed, int k, int cfg_a, int cfg_b)
{
  const SimGraph *g = e->p->g;
  const SearchConfig *ca = search_problem_config(e->p, ed->src, cfg_a);
  const SearchConfig *cb = search_problem_config(e->p, ed->dst, cfg_b);
  const Regions *ra = shard_regions(e, ed->src, cfg_a, SIM_TENSOR_OUTPUT, ed->out_slot[k]);
  const Regions *rb = shard_regions(e, ed->dst, cfg_b, SIM_TENSOR_INPUT, ed->in_slot[k]);
  int na = ra->n, nb = rb->n;
  int t = sim_graph_op_output(g, ed->src, ed->out_slot[k]);
  double esize = elem_size(sim_graph_tensor_dtype(g, t));
  double worst = 0;
  for (int j = 0; j < nb; j++) {
    int dj = cb->start + j;
    double cost = 0;
    for (int gi = 0; gi < na; gi++) {
      if (ra->group_of[gi] != gi)
        continue;
      int64_t v = overlap(&rb->r[j], &ra->r[gi]);
      if (v == 0)
        continue;
      /* The best-connected holder of this region serves it; none is needed when the
       * consumer's own device holds it. */
      double bw = 0, lat = 0;
      gboolean local = FALSE;
      for (int sh = gi; sh < na && !local; sh++) {
        if (ra->group_of[sh] != gi)
          continue;
        int ds = ca->start + sh;
        if (ds == dj)
          local = TRUE;
        else if (e->bw[(gsize)ds * e->nd + dj] > bw) {
          bw = e->bw[(gsize)ds * e->nd + dj];
          lat = e->lat[(gsize)ds * e->nd + dj];
        }
      }
      if (!local && bw > 0)
        cost += (double)v * esize / bw + lat;
    }
    worst = MAX(worst, cost);
  }
  return 2 * worst;
}

double search_estimate_edge(SearchEstimate *e, int edge, int cfg_src, int cfg_dst)
{
  guint64 key = ((guint64)edge << 40) | ((guint64)cfg_src << 20) | (guint64)cfg_dst;
  double v;
  if (cache_get(&e->edge_cache, key, &v))
    return v;
  const Edge *ed = &g_array_index(e->edges, Edge, edge);
  v = 0;
  for (int k = 0; k < ed->n_pairs; k++)
    v += pair_cost(e, ed, k, cfg_src, cfg_dst);
  cache_put(&e->edge_cache, key, v);
  return v;
}

double search_estimate_total(SearchEstimate *e, const int *cfg)
{
  double t = 0;
  for (int op = 0; op < e->n_ops; op++)
    t += search_estimate_node(e, op, cfg[op]);
  for (guint k = 0; k < e->edges->len; k++) {
    const Edge *ed = &g_array_index(e->edges, Edge, k);
    t += search_estimate_edge(e, (int)k, cfg[ed->src], cfg[ed->dst]);
  }
  return t;
}

double search_estimate_dp_compute(SearchEstimate *e, int op, int n)
{
  return search_estimate_node(e, op, search_problem_dp_config(e->p, op, 0, n));
}

GArray *search_shortlist(const SearchProblem *p, SearchEstimate *e, int op, int max)
{
  int n = search_problem_n_configs(p, op);
  GArray *out = g_array_new(FALSE, FALSE, sizeof(int));
  int dp = search_problem_dp_config(p, op, 0, p->n_devices);
  g_array_append_val(out, dp);
  /* Configurations at the first view only: the others differ by placement, which the
   * estimate prices alike on a uniform machine. */
  g_autofree int *idx = g_new(int, MAX(n, 1));
  g_autofree double *cost = g_new(double, MAX(n, 1));
  int m = 0;
  for (int i = 0; i < n; i++) {
    const SearchConfig *c = search_problem_config(p, op, i);
    if (c->start != 0)
      continue;
    idx[m] = i;
    cost[m] = search_estimate_node(e, op, i);
    m++;
  }
  /* Selection by cost, ties to the lower index; m is at most a few hundred. */
  for (int picked = 0; picked < max - 1 && picked < m; picked++) {
    int best = -1;
    for (int j = 0; j < m; j++)
      if (idx[j] >= 0 && (best < 0 || cost[j] < cost[best]))
        best = j;
    if (best < 0)
      break;
    if (idx[best] != dp)
      g_array_append_val(out, idx[best]);
    idx[best] = -1;
  }
  return out;
}

GArray *search_polish_candidates(const SearchProblem *p, SearchEstimate *e, int op, int max)
{
  int n = search_problem_n_configs(p, op);
  if (n <= 4 * max) {
    GArray *all = g_array_new(FALSE, FALSE, sizeof(int));
    for (int i = 0; i < n; i++)
      g_array_append_val(all, i);
    return all;
  }
  /* The shortlist's first few degree vectors on every view, the rest on the first. */
  GArray *short_ = search_shortlist(p, e, op, max);
  GArray *out = g_array_new(FALSE, FALSE, sizeof(int));
  for (guint k = 0; k < short_->len; k++) {
    const SearchConfig *c = search_problem_config(p, op, g_array_index(short_, int, k));
    if (k >= 4) {
      g_array_append_val(out, g_array_index(short_, int, k));
      continue;
    }
    SearchConfig v = *c;
    for (v.start = 0; v.start + v.n <= p->n_devices; v.start += v.n) {
      int i = search_problem_find_config(p, op, &v);
      if (i >= 0)
        g_array_append_val(out, i);
    }
  }
  g_array_unref(short_);
  return out;
}
