/* ve.c — minimizing a sum of unary and pairwise costs by eliminating variables, the
 * engine of OptCNN's dynamic program (Jia et al. ICML'18).
 *
 * OptCNN's node elimination removes an operator with one input edge and one output edge
 * and replaces the two edges by one whose cost is minimized over the operator's
 * configurations; its edge elimination merges parallel edges by adding their costs.  In
 * terms of a cost graph both are the elimination of a variable with at most two
 * neighbours: its unary cost and its two pairwise costs become one pairwise cost between
 * the neighbours (which adds into any cost they already share).  Graphs that reduce this
 * way (series-parallel ones, of treewidth two) are solved exactly.  When every remaining
 * variable has three neighbours or more, the one with fewest is fixed to the value that is
 * best against the others' minima, which turns its pairwise costs into unary ones, and the
 * elimination goes on: an approximation, counted and reported, instead of a failure. */
#include "search-private.h"

#include <string.h>

typedef enum { REC_ZERO, REC_ONE, REC_TWO, REC_FIXED } RecKind;

typedef struct {
  RecKind kind;
  int v, w1, w2;
  int *arg;       /* REC_ONE: k[w1]; REC_TWO: k[w1] x k[w2]                    */
  int value;      /* REC_ZERO, REC_FIXED                                       */
} Record;

struct _SearchVE {
  int n;
  int *k;
  double **unary;
  GHashTable *pairs;    /* (u * n + v), u < v -> double[k[u] * k[v]]           */
  GHashTable **adj;     /* per variable: the set of neighbours                  */
  gboolean *kept;
  gboolean *gone;
  int kept_list[2];
  int n_kept;
  double constant;
  GArray *records;      /* Record                                             */
};

SearchVE *search_ve_new(int n, const int *k)
{
  SearchVE *ve = g_new0(SearchVE, 1);
  ve->n = n;
  ve->k = g_memdup2(k, sizeof(int) * (gsize)MAX(n, 1));
  ve->unary = g_new0(double *, MAX(n, 1));
  ve->adj = g_new0(GHashTable *, MAX(n, 1));
  for (int v = 0; v < n; v++) {
    g_assert(k[v] >= 1);
    ve->unary[v] = g_new0(double, k[v]);
    ve->adj[v] = g_hash_table_new(g_direct_hash, g_direct_equal);
  }
  ve->pairs = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, g_free);
  ve->kept = g_new0(gboolean, MAX(n, 1));
  ve->gone = g_new0(gboolean, MAX(n, 1));
  ve->records = g_array_new(FALSE, FALSE, sizeof(Record));
  return ve;
}

void search_ve_free(SearchVE *ve)
{
  if (!ve)
    return;
  for (int v = 0; v < ve->n; v++) {
    g_free(ve->unary[v]);
    g_hash_table_unref(ve->adj[v]);
  }
  g_free(ve->unary);
  g_free(ve->adj);
  g_free(ve->k);
  g_hash_table_unref(ve->pairs);
  g_free(ve->kept);
  g_free(ve->gone);
  for (guint i = 0; i < ve->records->len; i++)
    g_free(g_array_index(ve->records, Record, i).arg);
  g_array_unref(ve->records);
  g_free(ve);
}

void search_ve_add_unary(SearchVE *ve, int v, const double *cost)
{
  for (int i = 0; i < ve->k[v]; i++)
    ve->unary[v][i] += cost[i];
}

/* The pairwise cost of (u, v) with u < v, created empty when @create. */
static double *pair_get(SearchVE *ve, int u, int v, gboolean create)
{
  gint64 key = (gint64)u * ve->n + v;
  double *m = g_hash_table_lookup(ve->pairs, &key);
  if (!m && create) {
    m = g_new0(double, (gsize)ve->k[u] * ve->k[v]);
    gint64 *kp = g_new(gint64, 1);
    *kp = key;
    g_hash_table_insert(ve->pairs, kp, m);
    g_hash_table_add(ve->adj[u], GINT_TO_POINTER(v));
    g_hash_table_add(ve->adj[v], GINT_TO_POINTER(u));
  }
  return m;
}

static void pair_remove(SearchVE *ve, int u, int v)
{
  int a = MIN(u, v), b = MAX(u, v);
  gint64 key = (gint64)a * ve->n + b;
  g_hash_table_remove(ve->pairs, &key);
  g_hash_table_remove(ve->adj[a], GINT_TO_POINTER(b));
  g_hash_table_remove(ve->adj[b], GINT_TO_POINTER(a));
}

/* The cost of (u = i, v = j) from the stored orientation. */
static inline double pair_at(SearchVE *ve, const double *m, int u, int v, int i, int j)
{
  return u < v ? m[(gsize)i * ve->k[v] + j] : m[(gsize)j * ve->k[u] + i];
}

void search_ve_add_pair(SearchVE *ve, int u, int v, const double *cost)
{
  g_return_if_fail(u != v);
  int a = MIN(u, v), b = MAX(u, v);
  double *m = pair_get(ve, a, b, TRUE);
  for (int i = 0; i < ve->k[u]; i++)
    for (int j = 0; j < ve->k[v]; j++) {
      double c = cost[(gsize)i * ve->k[v] + j];
      if (u < v)
        m[(gsize)i * ve->k[v] + j] += c;
      else
        m[(gsize)j * ve->k[u] + i] += c;
    }
}

void search_ve_keep(SearchVE *ve, int v)
{
  g_return_if_fail(ve->n_kept < 2 && !ve->kept[v]);
  ve->kept[v] = TRUE;
  ve->kept_list[ve->n_kept++] = v;
}

static int neighbours(SearchVE *ve, int v, int *out, int max)
{
  GHashTableIter it;
  gpointer key;
  int n = 0;
  g_hash_table_iter_init(&it, ve->adj[v]);
  while (g_hash_table_iter_next(&it, &key, NULL)) {
    if (n < max)
      out[n] = GPOINTER_TO_INT(key);
    n++;
  }
  /* Hash order is not an order: sort, so that results do not depend on it. */
  for (int i = 1; i < MIN(n, max); i++)
    for (int j = i; j > 0 && out[j - 1] > out[j]; j--) {
      int t = out[j];
      out[j] = out[j - 1];
      out[j - 1] = t;
    }
  return n;
}

static void eliminate(SearchVE *ve, int v, int deg, const int *nb)
{
  Record rec = { .v = v, .w1 = -1, .w2 = -1 };
  int kv = ve->k[v];
  if (deg == 0) {
    int best = 0;
    for (int i = 1; i < kv; i++)
      if (ve->unary[v][i] < ve->unary[v][best])
        best = i;
    ve->constant += ve->unary[v][best];
    rec.kind = REC_ZERO;
    rec.value = best;
  } else if (deg == 1) {
    int w = nb[0];
    double *m = pair_get(ve, MIN(v, w), MAX(v, w), FALSE);
    rec.kind = REC_ONE;
    rec.w1 = w;
    rec.arg = g_new(int, ve->k[w]);
    for (int j = 0; j < ve->k[w]; j++) {
      double best = INFINITY;
      int arg = 0;
      for (int i = 0; i < kv; i++) {
        double c = ve->unary[v][i] + pair_at(ve, m, v, w, i, j);
        if (c < best) {
          best = c;
          arg = i;
        }
      }
      ve->unary[w][j] += best;
      rec.arg[j] = arg;
    }
    pair_remove(ve, v, w);
  } else {
    int w1 = nb[0], w2 = nb[1];
    double *m1 = pair_get(ve, MIN(v, w1), MAX(v, w1), FALSE);
    double *m2 = pair_get(ve, MIN(v, w2), MAX(v, w2), FALSE);
    int k1 = ve->k[w1], k2 = ve->k[w2];
    double *f = g_new(double, (gsize)k1 * k2);
    rec.kind = REC_TWO;
    rec.w1 = w1;
    rec.w2 = w2;
    rec.arg = g_new(int, (gsize)k1 * k2);
    for (int a = 0; a < k1; a++)
      for (int b = 0; b < k2; b++) {
        double best = INFINITY;
        int arg = 0;
        for (int i = 0; i < kv; i++) {
          double c = ve->unary[v][i] + pair_at(ve, m1, v, w1, i, a) + pair_at(ve, m2, v, w2, i, b);
          if (c < best) {
            best = c;
            arg = i;
          }
        }
        f[(gsize)a * k2 + b] = best;
        rec.arg[(gsize)a * k2 + b] = arg;
      }
    pair_remove(ve, v, w1);
    pair_remove(ve, v, w2);
    search_ve_add_pair(ve, w1, w2, f);
    g_free(f);
  }
  ve->gone[v] = TRUE;
  g_array_append_val(ve->records, rec);
}

/* Fixes @v to its best value against its neighbours' minima. */
static void fix(SearchVE *ve, int v, int deg, const int *nb)
{
  int kv = ve->k[v];
  int best = 0;
  double best_cost = INFINITY;
  for (int i = 0; i < kv; i++) {
    double c = ve->unary[v][i];
    for (int x = 0; x < deg; x++) {
      int w = nb[x];
      double *m = pair_get(ve, MIN(v, w), MAX(v, w), FALSE);
      double mn = INFINITY;
      for (int j = 0; j < ve->k[w]; j++)
        mn = MIN(mn, pair_at(ve, m, v, w, i, j));
      c += mn;
    }
    if (c < best_cost) {
      best_cost = c;
      best = i;
    }
  }
  ve->constant += ve->unary[v][best];
  for (int x = 0; x < deg; x++) {
    int w = nb[x];
    double *m = pair_get(ve, MIN(v, w), MAX(v, w), FALSE);
    for (int j = 0; j < ve->k[w]; j++)
      ve->unary[w][j] += pair_at(ve, m, v, w, best, j);
    pair_remove(ve, v, w);
  }
  Record rec = { .kind = REC_FIXED, .v = v, .w1 = -1, .w2 = -1, .value = best };
  ve->gone[v] = TRUE;
  g_array_append_val(ve->records, rec);
}

int search_ve_solve(SearchVE *ve, double *table)
{
  int fixes = 0;
  int nb_cap = MAX(ve->n, 4);
  g_autofree int *nb = g_new(int, nb_cap);
  for (;;) {
    /* The variable with fewest neighbours, then the cheapest to eliminate. */
    int best = -1, best_deg = G_MAXINT;
    double best_work = INFINITY;
    for (int v = 0; v < ve->n; v++) {
      if (ve->gone[v] || ve->kept[v])
        continue;
      int deg = (int)g_hash_table_size(ve->adj[v]);
      double work = ve->k[v];
      if (deg <= 2) {
        int tmp[2];
        int d = neighbours(ve, v, tmp, 2);
        for (int x = 0; x < d && x < 2; x++)
          work *= ve->k[tmp[x]];
      }
      if (deg < best_deg || (deg == best_deg && work < best_work)) {
        best = v;
        best_deg = deg;
        best_work = work;
      }
    }
    if (best < 0)
      break;
    int deg = neighbours(ve, best, nb, nb_cap);
    if (deg <= 2) {
      eliminate(ve, best, deg, nb);
    } else {
      fix(ve, best, deg, nb);
      fixes++;
    }
  }
  if (table) {
    if (ve->n_kept == 0) {
      table[0] = ve->constant;
    } else if (ve->n_kept == 1) {
      int a = ve->kept_list[0];
      for (int i = 0; i < ve->k[a]; i++)
        table[i] = ve->constant + ve->unary[a][i];
    } else {
      int a = ve->kept_list[0], b = ve->kept_list[1];
      double *m = pair_get(ve, MIN(a, b), MAX(a, b), FALSE);
      for (int i = 0; i < ve->k[a]; i++)
        for (int j = 0; j < ve->k[b]; j++)
          table[(gsize)i * ve->k[b] + j] = ve->constant + ve->unary[a][i] + ve->unary[b][j] +
                                           (m ? pair_at(ve, m, a, b, i, j) : 0);
    }
  }
  return fixes;
}

void search_ve_assign(SearchVE *ve, const int *kept_values, int *values)
{
  for (int i = 0; i < ve->n_kept; i++)
    values[ve->kept_list[i]] = kept_values[i];
  for (int r = (int)ve->records->len - 1; r >= 0; r--) {
    const Record *rec = &g_array_index(ve->records, Record, r);
    switch (rec->kind) {
    case REC_ZERO:
    case REC_FIXED:
      values[rec->v] = rec->value;
      break;
    case REC_ONE:
      values[rec->v] = rec->arg[values[rec->w1]];
      break;
    case REC_TWO:
      values[rec->v] = rec->arg[(gsize)values[rec->w1] * ve->k[rec->w2] + values[rec->w2]];
      break;
    }
  }
}
