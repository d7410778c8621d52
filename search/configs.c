/* configs.c — the candidate configurations of each operator, shared by every algorithm.
 *
 * A configuration splits some iteration dimensions (the SOAP space, docs/architecture.md)
 * and places the shards on a device view.  The candidates are the degrees over
 * splittable dimensions of allowed kinds that divide their dimensions (never a reduction
 * under a fused activation), whose product divides the number of devices, on every view
 * of that many consecutive devices aligned to its size: FlexFlow's machine views, which
 * tile the devices, keep a tensor-parallel group inside a node when
 * it fits, and let small operators run on few devices or side by side. */
#include "search-private.h"

#include <string.h>

static SearchKinds role_kind(SimDimRole r)
{
  switch (r) {
  case SIM_ROLE_SAMPLE: return SEARCH_KIND_DATA;
  case SIM_ROLE_ATTRIBUTE: return SEARCH_KIND_ATTRIBUTE;
  case SIM_ROLE_PARAMETER: return SEARCH_KIND_PARAMETER;
  case SIM_ROLE_REDUCTION: return SEARCH_KIND_REDUCTION;
  default: return 0;
  }
}

typedef struct {
  int nd;
  int64_t size[SEARCH_MAX_DIMS];
  gboolean allowed[SEARCH_MAX_DIMS];
  int n;                       /* devices                                               */
  GArray *vectors;             /* SearchConfig with start 0, n = product                */
} Enum;

static void enumerate(Enum *en, int d, int product, SearchConfig *cur)
{
  if (d == en->nd) {
    cur->n = product;
    g_array_append_val(en->vectors, *cur);
    return;
  }
  for (int k = 1; k <= en->n / product; k++) {
    if ((en->n / product) % k != 0)
      continue;
    if (k > 1 && (!en->allowed[d] || en->size[d] % k != 0))
      continue;
    cur->degree[d] = k;
    enumerate(en, d + 1, product * k, cur);
  }
  cur->degree[d] = 1;
}

static int compare_vectors(gconstpointer a, gconstpointer b)
{
  const SearchConfig *x = a, *y = b;
  if (x->n != y->n)
    return x->n < y->n ? -1 : 1;
  for (int d = 0; d < SEARCH_MAX_DIMS; d++)
    if (x->degree[d] != y->degree[d])
      return x->degree[d] > y->degree[d] ? -1 : 1;
  return 0;
}

static GArray *op_configs(const SearchProblem *p, int op)
{
  Enum en = { .n = p->n_devices };
  en.nd = sim_graph_op_n_dims(p->g, op);
  g_assert(en.nd >= 1 && en.nd <= SEARCH_MAX_DIMS);
  /* Partial sums from a split reduction cannot go through a fused nonlinear function,
   * so the simulator refuses such configurations. */
  gboolean fused = sim_graph_op_fused_nonlinear(p->g, op);
  for (int d = 0; d < en.nd; d++) {
    SimDimRole role = sim_graph_op_dim_role(p->g, op, d);
    en.size[d] = sim_graph_op_dim_size(p->g, op, d);
    en.allowed[d] = sim_graph_op_dim_splittable(p->g, op, d) && en.size[d] > 1 &&
                    (p->kinds & role_kind(role)) && !(fused && role == SIM_ROLE_REDUCTION);
  }
  en.vectors = g_array_new(FALSE, FALSE, sizeof(SearchConfig));
  SearchConfig cur;
  memset(&cur, 0, sizeof cur);
  for (int d = 0; d < SEARCH_MAX_DIMS; d++)
    cur.degree[d] = 1;
  enumerate(&en, 0, 1, &cur);
  /* Fewer devices first, then the earlier dimensions split more (data parallelism before
   * model parallelism), so index 0 is the operator whole on one device. */
  g_array_sort(en.vectors, compare_vectors);
  GArray *out = g_array_new(FALSE, FALSE, sizeof(SearchConfig));
  for (guint i = 0; i < en.vectors->len; i++) {
    SearchConfig c = g_array_index(en.vectors, SearchConfig, i);
    for (int start = 0; start + c.n <= p->n_devices; start += c.n) {
      c.start = start;
      g_array_append_val(out, c);
    }
  }
  g_array_unref(en.vectors);
  return out;
}

void search_problem_prepare(const SearchProblem *cp)
{
  SearchProblem *p = (SearchProblem *)cp;
  g_mutex_lock(&p->lock);
  if (!p->configs) {
    int n = sim_graph_n_ops(p->g);
    GArray **configs = g_new0(GArray *, MAX(n, 1));
    for (int op = 0; op < n; op++)
      configs[op] = op_configs(p, op);
    p->configs = configs;
  }
  g_mutex_unlock(&p->lock);
}

int search_problem_n_configs(const SearchProblem *p, int op)
{
  g_return_val_if_fail(p != NULL && op >= 0 && op < sim_graph_n_ops(p->g), 0);
  search_problem_prepare(p);
  return (int)p->configs[op]->len;
}

const SearchConfig *search_problem_config(const SearchProblem *p, int op, int i)
{
  g_return_val_if_fail(p != NULL && op >= 0 && op < sim_graph_n_ops(p->g), NULL);
  search_problem_prepare(p);
  g_return_val_if_fail(i >= 0 && i < (int)p->configs[op]->len, NULL);
  return &g_array_index(p->configs[op], SearchConfig, i);
}

static gboolean same_config(const SearchConfig *a, const SearchConfig *b, int nd)
{
  if (a->start != b->start)
    return FALSE;
  for (int d = 0; d < SEARCH_MAX_DIMS; d++)
    if ((d < nd ? a->degree[d] : 1) != (d < nd ? b->degree[d] : 1))
      return FALSE;
  return TRUE;
}

int search_problem_find_config(const SearchProblem *p, int op, const SearchConfig *c)
{
  g_return_val_if_fail(p != NULL && c != NULL, -1);
  search_problem_prepare(p);
  int nd = sim_graph_op_n_dims(p->g, op);
  GArray *a = p->configs[op];
  for (guint i = 0; i < a->len; i++)
    if (same_config(&g_array_index(a, SearchConfig, i), c, nd))
      return (int)i;
  return -1;
}

int search_problem_config_of(const SearchProblem *p, const SimStrategy *s, int op)
{
  g_return_val_if_fail(p != NULL && s != NULL, -1);
  int n = 0;
  const int *dev = sim_strategy_op_devices(s, op, &n);
  const int *deg = sim_strategy_op_degrees(s, op);
  SearchConfig c = { .n = n, .start = -1 };
  for (int d = 0; d < SEARCH_MAX_DIMS; d++)
    c.degree[d] = deg[d];
  for (int i = 0; i < p->n_devices; i++)
    if (p->devices[i] == dev[0])
      c.start = i;
  if (c.start < 0 || c.start + n > p->n_devices)
    return -1;
  for (int i = 0; i < n; i++)
    if (p->devices[c.start + i] != dev[i])
      return -1;
  return search_problem_find_config(p, op, &c);
}

void search_problem_config_devices(const SearchProblem *p, const SearchConfig *c, int *devices)
{
  g_return_if_fail(p != NULL && c != NULL && devices != NULL);
  g_return_if_fail(c->start >= 0 && c->start + c->n <= p->n_devices);
  for (int i = 0; i < c->n; i++)
    devices[i] = p->devices[c->start + i];
}

gboolean search_problem_apply_config(const SearchProblem *p, SimStrategy *s, int op,
                                     const SearchConfig *c, GError **error)
{
  g_return_val_if_fail(p != NULL && s != NULL && c != NULL, FALSE);
  g_return_val_if_fail(c->n >= 1 && c->start >= 0 && c->start + c->n <= p->n_devices, FALSE);
  return sim_strategy_set_op(s, op, c->degree, p->devices + c->start, error);
}

char *search_problem_config_to_string(const SearchProblem *p, int op, const SearchConfig *c)
{
  g_return_val_if_fail(p != NULL && c != NULL, NULL);
  GString *out = g_string_new(NULL);
  int nd = sim_graph_op_n_dims(p->g, op);
  for (int d = 0; d < nd; d++)
    if (c->degree[d] > 1)
      g_string_append_printf(out, "%s%s=%d", out->len ? " " : "",
                             sim_graph_op_dim_name(p->g, op, d), c->degree[d]);
  if (!out->len)
    g_string_append(out, "whole");
  int first = p->devices[c->start], last = p->devices[c->start + c->n - 1];
  if (c->n == 1)
    g_string_append_printf(out, " @%d", first);
  else if (last - first == c->n - 1)
    g_string_append_printf(out, " @%d-%d", first, last);
  else
    g_string_append_printf(out, " @%d..(%d devices)", first, c->n);
  return g_string_free(out, FALSE);
}

int search_problem_dp_config(const SearchProblem *p, int op, int start, int n)
{
  search_problem_prepare(p);
  int64_t size = sim_graph_op_dim_size(p->g, op, 0);
  SearchConfig c = { .start = start };
  for (int d = 0; d < SEARCH_MAX_DIMS; d++)
    c.degree[d] = 1;
  /* The sample dimension split as far as it divides, on the first devices of the view. */
  for (int k = n; k >= 1; k--) {
    if (n % k != 0 || size % k != 0)
      continue;
    c.degree[0] = k;
    c.n = k;
    int i = search_problem_find_config(p, op, &c);
    if (i >= 0)
      return i;
  }
  c.degree[0] = 1;
  c.n = 1;
  int i = search_problem_find_config(p, op, &c);
  g_assert(i >= 0);
  return i;
}
