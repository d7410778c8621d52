/* dp.c — dynamic programming over the graph: OptCNN's node and edge eliminations (Jia et
 * al. ICML'18) and Unity's series-parallel decomposition with machine views and resource
 * splits (Unger et al. OSDI'22).  Both minimize the analytic estimate (estimate.c); the
 * algorithms then simulate what they find and refine it by local search with the
 * simulator.
 *
 * Unity's program works on two-terminal segments of the graph between a source s and a
 * sink t (a virtual source before the inputs and a virtual sink after the outputs at the
 * top).  For every pair of configurations of s and t it computes the cheapest
 * configurations of the operators inside:
 *   - series: operators that every path from s to t passes cut the segment into parts
 *     solved on their own and joined by a min-plus product over the cut's configurations;
 *   - parallel: without a cut, the operators inside fall into branches that only meet at
 *     s and t; the branches either share the segment's devices (their costs add) or split
 *     them in two halves, a group of branches on each (the slower half counts), and so on
 *     recursively (resource splits);
 *   - otherwise the segment is not series-parallel, and variable elimination (ve.c) solves
 *     it, approximately where it must.
 * Operators inside a segment use the segment's device view: configurations at its first
 * device on all or part of it (machine views). */
#include "distributed.h"

#include <string.h>

typedef struct {
  int start, size;
} View;

/* ---------------------------------------------------------------------------------- */
/* OptCNN                                                                             */

double search_dp_optcnn(const SearchProblem *p, SearchEstimate *e, int max_cands, int *cfg)
{
  int n = sim_graph_n_ops(p->g);
  g_autoptr(GPtrArray) cands = g_ptr_array_new_with_free_func((GDestroyNotify)g_array_unref);
  g_autofree int *k = g_new(int, MAX(n, 1));
  for (int op = 0; op < n; op++) {
    GArray *c = search_shortlist(p, e, op, max_cands);
    g_ptr_array_add(cands, c);
    k[op] = (int)c->len;
  }
  SearchVE *ve = search_ve_new(n, k);
  for (int op = 0; op < n; op++) {
    GArray *c = g_ptr_array_index(cands, op);
    g_autofree double *u = g_new(double, c->len);
    for (guint i = 0; i < c->len; i++)
      u[i] = search_estimate_node(e, op, g_array_index(c, int, i));
    search_ve_add_unary(ve, op, u);
  }
  for (int ed = 0; ed < search_estimate_n_edges(e); ed++) {
    int a, b;
    search_estimate_edge_ends(e, ed, &a, &b);
    GArray *ca = g_ptr_array_index(cands, a), *cb = g_ptr_array_index(cands, b);
    g_autofree double *m = g_new(double, (gsize)ca->len * cb->len);
    for (guint i = 0; i < ca->len; i++)
      for (guint j = 0; j < cb->len; j++)
        m[i * cb->len + j] =
          search_estimate_edge(e, ed, g_array_index(ca, int, i), g_array_index(cb, int, j));
    search_ve_add_pair(ve, a, b, m);
  }
  search_ve_solve(ve, NULL);
  g_autofree int *values = g_new0(int, MAX(n, 1));
  search_ve_assign(ve, NULL, values);
  for (int op = 0; op < n; op++)
    cfg[op] = g_array_index((GArray *)g_ptr_array_index(cands, op), int, values[op]);
  search_ve_free(ve);
  return search_estimate_total(e, cfg);
}

/* ---------------------------------------------------------------------------------- */
/* Unity: tables                                                                      */

typedef enum { TAB_ZERO, TAB_SERIES, TAB_SUM, TAB_MAX, TAB_MIN, TAB_VE } TabKind;

typedef struct Tab Tab;
struct Tab {
  int refs;
  TabKind kind;
  int ns, nt;
  double *cost;               /* ns x nt                                             */
  /* SERIES: boundaries b[0] = s .. b[m+1] = t, their candidates, the parts between them
   * (with the direct edges between consecutive boundaries added) and the cuts' costs. */
  int m;
  int *bnd;
  GArray **bcand;
  Tab **part;
  double **joint;             /* m + 1 matrices |C(b_k)| x |C(b_k+1)|                */
  double **unary;             /* m + 2 vectors (ends unused)                         */
  /* SUM, MAX, MIN: children; MIN: the child each entry takes. */
  int n_child;
  Tab **child;
  int *arg;
  /* VE: variables 0 (s), 1 (t) and the operators inside. */
  SearchVE *ve;
  int n_vars;
  int *vars;
  GArray **vcand;
};

static Tab *tab_new(TabKind kind, int ns, int nt)
{
  Tab *t = g_new0(Tab, 1);
  t->refs = 1;
  t->kind = kind;
  t->ns = ns;
  t->nt = nt;
  t->cost = g_new0(double, (gsize)ns * nt);
  return t;
}

static Tab *tab_ref(Tab *t)
{
  t->refs++;
  return t;
}

static void tab_unref(Tab *t)
{
  if (!t || --t->refs > 0)
    return;
  g_free(t->cost);
  for (int k = 0; k <= t->m && t->part; k++)
    tab_unref(t->part[k]);
  for (int k = 0; k <= t->m && t->joint; k++)
    g_free(t->joint[k]);
  for (int k = 0; k < t->m + 2 && t->unary; k++)
    g_free(t->unary[k]);
  g_free(t->part);
  g_free(t->joint);
  g_free(t->unary);
  g_free(t->bnd);
  g_free(t->bcand);
  for (int i = 0; i < t->n_child; i++)
    tab_unref(t->child[i]);
  g_free(t->child);
  g_free(t->arg);
  search_ve_free(t->ve);
  g_free(t->vars);
  g_free(t->vcand);
  g_free(t);
}

/* ---------------------------------------------------------------------------------- */
/* Unity: the graph with a virtual source and sink                                    */

typedef struct {
  const SearchProblem *p;
  SearchEstimate *e;
  int n;                      /* ops; S = n, T = n + 1                               */
  int max_cands;
  gboolean splits;
  GArray **succ, **pred;      /* n + 2 lists of node ids                             */
  GHashTable *edge_of;        /* src * (n + 2) + dst -> edge id + 1                  */
  GHashTable *cands;          /* (node, view) -> GArray of config indices            */
  GArray *virtual_cand;       /* { -1 }                                              */
  int *mark;
  int gen;
  int *pos;
  int depth;
} Unity;

static gboolean is_virtual(const Unity *u, int node)
{
  return node >= u->n;
}

static gint64 cand_key(const Unity *u, int node, View v)
{
  return ((gint64)node * 4096 + v.start) * 4096 + v.size;
}

/* The candidates of @node on view @v: configurations at the view's first device on all or
 * a divisor of its devices, the best by the estimate, always with data parallelism over
 * the whole view. */
static GArray *cands(Unity *u, int node, View v)
{
  if (is_virtual(u, node))
    return u->virtual_cand;
  gint64 key = cand_key(u, node, v);
  GArray *c = g_hash_table_lookup(u->cands, &key);
  if (c)
    return c;
  const SearchProblem *p = u->p;
  int n = search_problem_n_configs(p, node);
  c = g_array_new(FALSE, FALSE, sizeof(int));
  int dp = search_problem_dp_config(p, node, v.start, v.size);
  g_array_append_val(c, dp);
  g_autofree int *idx = g_new(int, MAX(n, 1));
  g_autofree double *cost = g_new(double, MAX(n, 1));
  int m = 0;
  for (int i = 0; i < n; i++) {
    const SearchConfig *cf = search_problem_config(p, node, i);
    if (cf->start != v.start || v.size % cf->n != 0 || i == dp)
      continue;
    idx[m] = i;
    cost[m] = search_estimate_node(u->e, node, i);
    m++;
  }
  while ((int)c->len < u->max_cands) {
    int best = -1;
    for (int j = 0; j < m; j++)
      if (idx[j] >= 0 && (best < 0 || cost[j] < cost[best]))
        best = j;
    if (best < 0)
      break;
    g_array_append_val(c, idx[best]);
    idx[best] = -1;
  }
  gint64 *kp = g_new(gint64, 1);
  *kp = key;
  g_hash_table_insert(u->cands, kp, c);
  return c;
}

static double node_cost(Unity *u, int node, int cfg)
{
  return is_virtual(u, node) ? 0 : search_estimate_node(u->e, node, cfg);
}

/* The cost of the edges between @a and @b (either direction) under configurations. */
static double pair_cost(Unity *u, int a, int ca, int b, int cb)
{
  if (is_virtual(u, a) || is_virtual(u, b))
    return 0;
  double c = 0;
  gint64 k1 = (gint64)a * (u->n + 2) + b, k2 = (gint64)b * (u->n + 2) + a;
  int id = GPOINTER_TO_INT(g_hash_table_lookup(u->edge_of, &k1));
  if (id)
    c += search_estimate_edge(u->e, id - 1, ca, cb);
  id = GPOINTER_TO_INT(g_hash_table_lookup(u->edge_of, &k2));
  if (id)
    c += search_estimate_edge(u->e, id - 1, cb, ca);
  return c;
}

static gboolean has_edge(Unity *u, int a, int b)
{
  if (is_virtual(u, a) || is_virtual(u, b))
    return FALSE;
  gint64 k1 = (gint64)a * (u->n + 2) + b, k2 = (gint64)b * (u->n + 2) + a;
  return g_hash_table_contains(u->edge_of, &k1) || g_hash_table_contains(u->edge_of, &k2);
}

static double *pair_matrix(Unity *u, int a, GArray *ca, int b, GArray *cb)
{
  double *m = g_new0(double, (gsize)ca->len * cb->len);
  if (!has_edge(u, a, b))
    return m;
  for (guint i = 0; i < ca->len; i++)
    for (guint j = 0; j < cb->len; j++)
      m[i * cb->len + j] = pair_cost(u, a, g_array_index(ca, int, i), b, g_array_index(cb, int, j));
  return m;
}

/* ---------------------------------------------------------------------------------- */
/* Unity: solving a segment                                                           */

static Tab *solve(Unity *u, const int *nodes, int n_nodes, int s, int t, View vin, View vs,
                  View vt);

static Tab *solve_series(Unity *u, const int *nodes, int n_nodes, const int *cuts, int m, int s,
                         int t, View vin, View vs, View vt)
{
  GArray *cs = cands(u, s, vs), *ct = cands(u, t, vt);
  Tab *tab = tab_new(TAB_SERIES, (int)cs->len, (int)ct->len);
  tab->m = m;
  tab->bnd = g_new(int, m + 2);
  tab->bcand = g_new(GArray *, m + 2);
  tab->part = g_new0(Tab *, m + 1);
  tab->joint = g_new0(double *, m + 1);
  tab->unary = g_new0(double *, m + 2);
  View *views = g_new(View, m + 2);
  tab->bnd[0] = s;
  views[0] = vs;
  for (int k = 0; k < m; k++) {
    tab->bnd[k + 1] = cuts[k];
    views[k + 1] = vin;
  }
  tab->bnd[m + 1] = t;
  views[m + 1] = vt;
  for (int k = 0; k < m + 2; k++)
    tab->bcand[k] = cands(u, tab->bnd[k], views[k]);
  for (int k = 1; k <= m; k++) {
    GArray *c = tab->bcand[k];
    tab->unary[k] = g_new(double, c->len);
    for (guint i = 0; i < c->len; i++)
      tab->unary[k][i] = node_cost(u, tab->bnd[k], g_array_index(c, int, i));
  }
  /* The operators between consecutive boundaries: nodes are in topological order, and so
   * are the cuts among them. */
  g_autofree int *sub = g_new(int, MAX(n_nodes, 1));
  int at = 0;
  for (int k = 0; k <= m; k++) {
    int ns = 0;
    while (at < n_nodes && (k == m || nodes[at] != cuts[k]))
      sub[ns++] = nodes[at++];
    if (k < m)
      at++;  /* the cut itself */
    tab->part[k] = solve(u, sub, ns, tab->bnd[k], tab->bnd[k + 1], vin, views[k], views[k + 1]);
    GArray *ca = tab->bcand[k], *cb = tab->bcand[k + 1];
    double *jm = pair_matrix(u, tab->bnd[k], ca, tab->bnd[k + 1], cb);
    for (gsize i = 0; i < ca->len * cb->len; i++)
      jm[i] += tab->part[k]->cost[i];
    tab->joint[k] = jm;
  }
  g_free(views);
  /* A min-plus product along the chain for every configuration of s. */
  int kmax = 1;
  for (int k = 0; k < m + 2; k++)
    kmax = MAX(kmax, (int)tab->bcand[k]->len);
  g_autofree double *cur = g_new(double, kmax), *next = g_new(double, kmax);
  for (int i = 0; i < tab->ns; i++) {
    int len = (int)tab->bcand[0]->len;
    for (int x = 0; x < len; x++)
      cur[x] = x == i ? 0 : INFINITY;
    for (int k = 0; k <= m; k++) {
      int nb = (int)tab->bcand[k + 1]->len;
      for (int y = 0; y < nb; y++) {
        double best = INFINITY;
        for (int x = 0; x < len; x++)
          if (isfinite(cur[x]))
            best = MIN(best, cur[x] + tab->joint[k][(gsize)x * nb + y]);
        next[y] = best + (k < m ? tab->unary[k + 1][y] : 0);
      }
      memcpy(cur, next, sizeof(double) * nb);
      len = nb;
    }
    for (int j = 0; j < tab->nt; j++)
      tab->cost[(gsize)i * tab->nt + j] = cur[j];
  }
  return tab;
}

static Tab *solve_ve(Unity *u, const int *nodes, int n_nodes, int s, int t, View vin, View vs,
                     View vt)
{
  int nv = n_nodes + 2;
  Tab *tab;
  GArray *cs = cands(u, s, vs), *ct = cands(u, t, vt);
  tab = tab_new(TAB_VE, (int)cs->len, (int)ct->len);
  tab->n_vars = nv;
  tab->vars = g_new(int, nv);
  tab->vcand = g_new(GArray *, nv);
  tab->vars[0] = s;
  tab->vcand[0] = cs;
  tab->vars[1] = t;
  tab->vcand[1] = ct;
  for (int i = 0; i < n_nodes; i++) {
    tab->vars[i + 2] = nodes[i];
    tab->vcand[i + 2] = cands(u, nodes[i], vin);
  }
  g_autofree int *k = g_new(int, nv);
  for (int i = 0; i < nv; i++)
    k[i] = (int)tab->vcand[i]->len;
  tab->ve = search_ve_new(nv, k);
  for (int i = 2; i < nv; i++) {
    g_autofree double *un = g_new(double, k[i]);
    for (int x = 0; x < k[i]; x++)
      un[x] = node_cost(u, tab->vars[i], g_array_index(tab->vcand[i], int, x));
    search_ve_add_unary(tab->ve, i, un);
  }
  /* Every edge with an operator inside; s-t edges belong to whoever made the segment. */
  for (int i = 2; i < nv; i++)
    for (int j = 0; j < nv; j++) {
      if (j == i || (j >= 2 && j < i))
        continue;
      if (!has_edge(u, tab->vars[i], tab->vars[j]))
        continue;
      g_autofree double *pm =
        pair_matrix(u, tab->vars[i], tab->vcand[i], tab->vars[j], tab->vcand[j]);
      search_ve_add_pair(tab->ve, i, j, pm);
    }
  search_ve_keep(tab->ve, 0);
  search_ve_keep(tab->ve, 1);
  search_ve_solve(tab->ve, tab->cost);
  return tab;
}

typedef struct {
  Unity *u;
  int s, t;
  View vs, vt;
  int n_branches;
  GArray **branch;            /* node ids                                            */
  GHashTable **memo;          /* per branch: view key -> Tab*                        */
  GHashTable *combos;         /* (mask, view) -> Tab*, for few branches              */
} Parallel;

static gint64 view_key(View v)
{
  return (gint64)v.start * 65536 + v.size;
}

static Tab *branch_tab(Parallel *par, int b, View v)
{
  gint64 key = view_key(v);
  Tab *t = g_hash_table_lookup(par->memo[b], &key);
  if (t)
    return t;
  GArray *nodes = par->branch[b];
  t = solve(par->u, (const int *)nodes->data, (int)nodes->len, par->s, par->t, v, par->vs, par->vt);
  gint64 *kp = g_new(gint64, 1);
  *kp = key;
  g_hash_table_insert(par->memo[b], kp, t);
  return t;
}

static double tab_min(const Tab *t)
{
  double m = INFINITY;
  for (gsize i = 0; i < (gsize)t->ns * t->nt; i++)
    m = MIN(m, t->cost[i]);
  return m;
}

static Tab *combine(Parallel *par, const int *bs, int nb, View v);

static Tab *combine_cached(Parallel *par, const int *bs, int nb, View v)
{
  if (par->n_branches > 8)
    return combine(par, bs, nb, v);
  gint64 mask = 0;
  for (int i = 0; i < nb; i++)
    mask |= (gint64)1 << bs[i];
  gint64 key = (mask << 32) | view_key(v);
  Tab *t = g_hash_table_lookup(par->combos, &key);
  if (t)
    return tab_ref(t);
  t = combine(par, bs, nb, v);
  gint64 *kp = g_new(gint64, 1);
  *kp = key;
  g_hash_table_insert(par->combos, kp, tab_ref(t));
  return t;
}

/* The cheapest way to run branches @bs on view @v: sharing it, or split in two halves. */
static Tab *combine(Parallel *par, const int *bs, int nb, View v)
{
  if (nb == 1)
    return tab_ref(branch_tab(par, bs[0], v));
  Tab *first = branch_tab(par, bs[0], v);
  int ns = first->ns, nt = first->nt;
  GPtrArray *options = g_ptr_array_new();
  Tab *shared = tab_new(TAB_SUM, ns, nt);
  shared->n_child = nb;
  shared->child = g_new(Tab *, nb);
  for (int i = 0; i < nb; i++) {
    Tab *b = branch_tab(par, bs[i], v);
    shared->child[i] = tab_ref(b);
    for (gsize x = 0; x < (gsize)ns * nt; x++)
      shared->cost[x] += b->cost[x];
  }
  g_ptr_array_add(options, shared);

  if (par->u->splits && v.size >= 2 && v.size % 2 == 0) {
    View v1 = { v.start, v.size / 2 }, v2 = { v.start + v.size / 2, v.size / 2 };
    g_autofree int *g1 = g_new(int, nb), *g2 = g_new(int, nb);
    /* Few branches: every split with the first branch on the first half.  Many: one
     * split balanced by the branches' costs (longest first onto the lighter half). */
    GArray *splits = g_array_new(FALSE, FALSE, sizeof(gint64));
    if (nb <= 4) {
      for (gint64 mask = 1; mask < ((gint64)1 << nb) - 1; mask++)
        if (mask & 1)
          g_array_append_val(splits, mask);
    } else {
      g_autofree int *order = g_new(int, nb);
      g_autofree double *w = g_new(double, nb);
      for (int i = 0; i < nb; i++) {
        order[i] = i;
        w[i] = tab_min(branch_tab(par, bs[i], v));
      }
      for (int i = 1; i < nb; i++)
        for (int j = i; j > 0 && w[order[j - 1]] < w[order[j]]; j--) {
          int tmp = order[j];
          order[j] = order[j - 1];
          order[j - 1] = tmp;
        }
      double l1 = 0, l2 = 0;
      gint64 mask = 0;
      for (int i = 0; i < nb; i++) {
        if (l1 <= l2) {
          mask |= (gint64)1 << order[i];
          l1 += w[order[i]];
        } else {
          l2 += w[order[i]];
        }
      }
      if (mask != 0 && mask != ((gint64)1 << nb) - 1)
        g_array_append_val(splits, mask);
    }
    for (guint si = 0; si < splits->len; si++) {
      gint64 mask = g_array_index(splits, gint64, si);
      int n1 = 0, n2 = 0;
      for (int i = 0; i < nb; i++) {
        if (mask & ((gint64)1 << i))
          g1[n1++] = bs[i];
        else
          g2[n2++] = bs[i];
      }
      Tab *a = combine_cached(par, g1, n1, v1), *b = combine_cached(par, g2, n2, v2);
      Tab *mx = tab_new(TAB_MAX, ns, nt);
      mx->n_child = 2;
      mx->child = g_new(Tab *, 2);
      mx->child[0] = a;
      mx->child[1] = b;
      for (gsize x = 0; x < (gsize)ns * nt; x++)
        mx->cost[x] = MAX(a->cost[x], b->cost[x]);
      g_ptr_array_add(options, mx);
    }
    g_array_unref(splits);
  }
  if (options->len == 1) {
    Tab *only = g_ptr_array_index(options, 0);
    g_ptr_array_unref(options);
    return only;
  }
  Tab *mn = tab_new(TAB_MIN, ns, nt);
  mn->n_child = (int)options->len;
  mn->child = (Tab **)g_ptr_array_free(options, FALSE);
  mn->arg = g_new0(int, (gsize)ns * nt);
  for (gsize x = 0; x < (gsize)ns * nt; x++) {
    mn->cost[x] = INFINITY;
    for (int o = 0; o < mn->n_child; o++)
      if (mn->child[o]->cost[x] < mn->cost[x]) {
        mn->cost[x] = mn->child[o]->cost[x];
        mn->arg[x] = o;
      }
  }
  return mn;
}

static Tab *solve_parallel(Unity *u, GPtrArray *branches, int s, int t, View vin, View vs,
                           View vt)
{
  Parallel par = { .u = u, .s = s, .t = t, .vs = vs, .vt = vt };
  par.n_branches = (int)branches->len;
  par.branch = (GArray **)branches->pdata;
  par.memo = g_new(GHashTable *, par.n_branches);
  for (int b = 0; b < par.n_branches; b++)
    par.memo[b] = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free,
                                        (GDestroyNotify)tab_unref);
  par.combos = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free,
                                     (GDestroyNotify)tab_unref);
  g_autofree int *all = g_new(int, par.n_branches);
  for (int b = 0; b < par.n_branches; b++)
    all[b] = b;
  Tab *tab = combine(&par, all, par.n_branches, vin);
  for (int b = 0; b < par.n_branches; b++)
    g_hash_table_unref(par.memo[b]);
  g_free(par.memo);
  g_hash_table_unref(par.combos);
  return tab;
}

static int uf_find(int *parent, int x)
{
  while (parent[x] != x) {
    parent[x] = parent[parent[x]];
    x = parent[x];
  }
  return x;
}

static Tab *solve(Unity *u, const int *nodes, int n_nodes, int s, int t, View vin, View vs,
                  View vt)
{
  if (n_nodes == 0)
    return tab_new(TAB_ZERO, (int)cands(u, s, vs)->len, (int)cands(u, t, vt)->len);

  /* Positions in topological order: s, the nodes (op ids ascend topologically), t. */
  int gen = ++u->gen;
  for (int i = 0; i < n_nodes; i++) {
    u->mark[nodes[i]] = gen;
    u->pos[nodes[i]] = i + 1;
  }
  /* reach[i]: the furthest position an edge from a position before i lands on. */
  g_autofree int *far = g_new0(int, n_nodes + 2);
  for (int i = 0; i < n_nodes; i++) {
    int x = nodes[i];
    for (guint k = 0; k < u->succ[x]->len; k++) {
      int y = g_array_index(u->succ[x], int, k);
      int py = y == t ? n_nodes + 1 : u->mark[y] == gen ? u->pos[y] : -1;
      if (py > 0)
        far[i + 1] = MAX(far[i + 1], py);
    }
    for (guint k = 0; k < u->pred[x]->len; k++)
      if (g_array_index(u->pred[x], int, k) == s)
        far[0] = MAX(far[0], i + 1);
  }
  g_autofree int *cuts = g_new(int, n_nodes);
  int m = 0, reach = 0;
  for (int i = 1; i <= n_nodes; i++) {
    reach = MAX(reach, far[i - 1]);
    if (reach <= i)
      cuts[m++] = nodes[i - 1];
  }
  if (m > 0)
    return solve_series(u, nodes, n_nodes, cuts, m, s, t, vin, vs, vt);

  /* No cut: branches are the connected components inside. */
  g_autofree int *parent = g_new(int, n_nodes);
  for (int i = 0; i < n_nodes; i++)
    parent[i] = i;
  for (int i = 0; i < n_nodes; i++) {
    int x = nodes[i];
    for (guint k = 0; k < u->succ[x]->len; k++) {
      int y = g_array_index(u->succ[x], int, k);
      if (y != t && u->mark[y] == gen) {
        int a = uf_find(parent, i), b = uf_find(parent, u->pos[y] - 1);
        if (a != b)
          parent[MAX(a, b)] = MIN(a, b);
      }
    }
  }
  GPtrArray *branches = g_ptr_array_new_with_free_func((GDestroyNotify)g_array_unref);
  g_autofree int *comp_of = g_new(int, n_nodes);
  for (int i = 0; i < n_nodes; i++) {
    int r = uf_find(parent, i);
    if (r == i) {
      comp_of[i] = (int)branches->len;
      g_ptr_array_add(branches, g_array_new(FALSE, FALSE, sizeof(int)));
    }
    g_array_append_val((GArray *)g_ptr_array_index(branches, comp_of[r]), nodes[i]);
  }
  Tab *tab;
  if (branches->len == 1)
    tab = solve_ve(u, nodes, n_nodes, s, t, vin, vs, vt);
  else
    tab = solve_parallel(u, branches, s, t, vin, vs, vt);
  g_ptr_array_unref(branches);
  return tab;
}

/* ---------------------------------------------------------------------------------- */
/* Unity: reading the choices back                                                    */

static void reconstruct(Unity *u, const Tab *tab, int is, int it, int *assign)
{
  switch (tab->kind) {
  case TAB_ZERO:
    return;
  case TAB_SUM:
  case TAB_MAX:
    for (int i = 0; i < tab->n_child; i++)
      reconstruct(u, tab->child[i], is, it, assign);
    return;
  case TAB_MIN:
    reconstruct(u, tab->child[tab->arg[(gsize)is * tab->nt + it]], is, it, assign);
    return;
  case TAB_VE: {
    g_autofree int *values = g_new0(int, tab->n_vars);
    int kept[2] = { is, it };
    search_ve_assign(tab->ve, kept, values);
    for (int i = 2; i < tab->n_vars; i++)
      assign[tab->vars[i]] = g_array_index(tab->vcand[i], int, values[i]);
    return;
  }
  case TAB_SERIES: {
    /* The chain again for this (s, t), with back pointers. */
    int m = tab->m;
    g_autofree int *choice = g_new(int, m + 2);
    choice[0] = is;
    choice[m + 1] = it;
    if (m > 0) {
      int kmax = 1;
      for (int k = 0; k < m + 2; k++)
        kmax = MAX(kmax, (int)tab->bcand[k]->len);
      g_autofree double *cur = g_new(double, kmax), *next = g_new(double, kmax);
      g_autofree int *back = g_new(int, (gsize)(m + 1) * kmax);
      int len = (int)tab->bcand[0]->len;
      for (int x = 0; x < len; x++)
        cur[x] = x == is ? 0 : INFINITY;
      for (int k = 0; k < m; k++) {
        int nb = (int)tab->bcand[k + 1]->len;
        for (int y = 0; y < nb; y++) {
          double best = INFINITY;
          int arg = 0;
          for (int x = 0; x < len; x++) {
            double c = cur[x] + tab->joint[k][(gsize)x * nb + y];
            if (c < best) {
              best = c;
              arg = x;
            }
          }
          next[y] = best + tab->unary[k + 1][y];
          back[(gsize)(k + 1) * kmax + y] = arg;
        }
        memcpy(cur, next, sizeof(double) * nb);
        len = nb;
      }
      int nt = (int)tab->bcand[m + 1]->len;
      double best = INFINITY;
      int arg = 0;
      for (int x = 0; x < len; x++) {
        double c = cur[x] + tab->joint[m][(gsize)x * nt + it];
        if (c < best) {
          best = c;
          arg = x;
        }
      }
      choice[m] = arg;
      for (int k = m; k > 1; k--)
        choice[k - 1] = back[(gsize)k * kmax + choice[k]];
      for (int k = 1; k <= m; k++)
        assign[tab->bnd[k]] = g_array_index(tab->bcand[k], int, choice[k]);
    }
    for (int k = 0; k <= m; k++)
      reconstruct(u, tab->part[k], choice[k], choice[k + 1], assign);
    return;
  }
  }
}

double search_dp_unity(const SearchProblem *p, SearchEstimate *e, int max_cands,
                       gboolean splits, int *cfg)
{
  Unity u = { .p = p, .e = e, .max_cands = MAX(max_cands, 1), .splits = splits };
  int n = u.n = sim_graph_n_ops(p->g);
  int S = n, T = n + 1;
  u.succ = g_new(GArray *, n + 2);
  u.pred = g_new(GArray *, n + 2);
  for (int i = 0; i < n + 2; i++) {
    u.succ[i] = g_array_new(FALSE, FALSE, sizeof(int));
    u.pred[i] = g_array_new(FALSE, FALSE, sizeof(int));
  }
  u.edge_of = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, NULL);
  for (int ed = 0; ed < search_estimate_n_edges(e); ed++) {
    int a, b;
    search_estimate_edge_ends(e, ed, &a, &b);
    g_array_append_val(u.succ[a], b);
    g_array_append_val(u.pred[b], a);
    gint64 *kp = g_new(gint64, 1);
    *kp = (gint64)a * (n + 2) + b;
    g_hash_table_insert(u.edge_of, kp, GINT_TO_POINTER(ed + 1));
  }
  for (int op = 0; op < n; op++) {
    if (u.pred[op]->len == 0) {
      g_array_append_val(u.succ[S], op);
      g_array_append_val(u.pred[op], S);
    }
    if (u.succ[op]->len == 0) {
      g_array_append_val(u.succ[op], T);
      g_array_append_val(u.pred[T], op);
    }
  }
  u.cands = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free,
                                  (GDestroyNotify)g_array_unref);
  u.virtual_cand = g_array_new(FALSE, FALSE, sizeof(int));
  int none = -1;
  g_array_append_val(u.virtual_cand, none);
  u.mark = g_new0(int, n + 2);
  u.pos = g_new0(int, n + 2);

  g_autofree int *nodes = g_new(int, MAX(n, 1));
  for (int i = 0; i < n; i++)
    nodes[i] = i;
  View all = { 0, p->n_devices };
  Tab *top = solve(&u, nodes, n, S, T, all, all, all);
  for (int op = 0; op < n; op++)
    cfg[op] = -1;
  reconstruct(&u, top, 0, 0, cfg);
  double objective = top->cost[0];
  tab_unref(top);
  for (int op = 0; op < n; op++)
    if (cfg[op] < 0)
      cfg[op] = search_problem_dp_config(p, op, 0, p->n_devices);

  for (int i = 0; i < n + 2; i++) {
    g_array_unref(u.succ[i]);
    g_array_unref(u.pred[i]);
  }
  g_free(u.succ);
  g_free(u.pred);
  g_hash_table_unref(u.edge_of);
  g_hash_table_unref(u.cands);
  g_array_unref(u.virtual_cand);
  g_free(u.mark);
  g_free(u.pos);
  return objective;
}

/* ---------------------------------------------------------------------------------- */
/* The algorithms                                                                     */

typedef double (*DpFunc)(const SearchProblem *p, SearchEstimate *e, int max_cands, int *cfg);

/* Solves with a growing number of candidates per operator while the budget lasts and the
 * answer changes, simulates each answer, then refines the best by local search. */
static gboolean run_dp(SearchContext *ctx, DpFunc dp, GError **error)
{
  const SearchProblem *p = search_context_get_problem(ctx);
  int n = sim_graph_n_ops(p->g);
  int cands = search_context_get_option_int_in(ctx, "cands", 8, 1, G_MAXINT);
  int max_cands = MAX(cands, search_context_get_option_int_in(ctx, "max-cands", 32, 1, G_MAXINT));
  int polish = search_context_get_option_int_in(ctx, "polish", 1, 0, 1);
  SearchEstimate *e = search_estimate_new(p);
  g_autofree int *cfg = g_new(int, MAX(n, 1));
  g_autofree int *prev = g_new0(int, MAX(n, 1));
  /* Data parallelism and the expert's plan are candidates too: the estimate cannot see
   * everything. */
  double best_cost = INFINITY;
  g_autoptr(SimStrategy) best = search_start_data_parallel(ctx, &best_cost, error);
  if (!best) {
    search_estimate_free(e);
    return FALSE;
  }
  search_prefer_expert(ctx, FALSE, &best, &best_cost);
  gboolean first = TRUE;
  double solve_time = 0;
  /* Under MPI every rank solves and simulates the same (a solve takes a small part of the
   * search; the polish's trials are divided), and agrees where to stop. */
  for (int k = cands; k <= max_cands && !search_dist_should_stop(ctx); k *= 2) {
    /* Twice the candidates cost about four times the time (pairs of them on every edge):
     * a solve that would not end before the deadline is not started. */
    double now = search_context_elapsed(ctx);
    if (search_dist_any(ctx, !first && ctx->deadline < G_MAXDOUBLE &&
                               now + 4 * solve_time > ctx->deadline))
      break;
    dp(p, e, k, cfg);
    solve_time = search_context_elapsed(ctx) - now;
    if (!first && memcmp(cfg, prev, sizeof(int) * (gsize)n) == 0)
      break;
    first = FALSE;
    memcpy(prev, cfg, sizeof(int) * (gsize)n);
    g_autoptr(SimStrategy) s = search_problem_strategy_from_configs(p, cfg, error);
    if (!s) {
      search_estimate_free(e);
      return FALSE;
    }
    double c = search_fit(ctx, &s);
    if (c < best_cost) {
      best_cost = c;
      g_clear_pointer(&best, sim_strategy_free);
      best = g_steal_pointer(&s);
    }
  }
  if (best && polish && !search_dist_should_stop(ctx)) {
    GArray **lists = g_new(GArray *, MAX(n, 1));
    for (int op = 0; op < n; op++)
      lists[op] = search_polish_candidates(p, e, op, MAX(cands, 16));
    search_polish(ctx, &best, lists, 0, 0);
    for (int op = 0; op < n; op++)
      g_array_unref(lists[op]);
    g_free(lists);
  }
  search_estimate_free(e);
  return TRUE;
}

static gboolean optcnn_run(const SearchAlgorithm *self, SearchContext *ctx, GError **error)
{
  return run_dp(ctx, search_dp_optcnn, error);
}

static double unity_splits(const SearchProblem *p, SearchEstimate *e, int max_cands, int *cfg)
{
  return search_dp_unity(p, e, max_cands, TRUE, cfg);
}

static gboolean unity_run(const SearchAlgorithm *self, SearchContext *ctx, GError **error)
{
  return run_dp(ctx, unity_splits, error);
}

static const SearchOptionSpec dp_options[] = {
  { "cands", "candidate configurations per operator in the first solve (default 8)" },
  { "max-cands", "the most candidates per operator as solves widen (default 32)" },
  { "polish", "1: refine the result by local search with the simulator (default), 0: not" },
  { NULL, NULL },
};

const SearchAlgorithm search_algo_optcnn = {
  .api_version = SEARCH_ALGORITHM_API_VERSION,
  .name = "optcnn",
  .description = "OptCNN's dynamic program: node and edge eliminations over layer-wise "
                 "configurations, refined with the simulator",
  .run = optcnn_run,
  .options = dp_options,
};

const SearchAlgorithm search_algo_dp = {
  .api_version = SEARCH_ALGORITHM_API_VERSION,
  .name = "dp",
  .description = "Unity's dynamic program: series-parallel decomposition with machine views "
                 "and resource splits, refined with the simulator",
  .run = unity_run,
  .options = dp_options,
};
