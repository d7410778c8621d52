/* problem.c — search problems: a graph on a machine with a cost model, the options every
 * strategy of the search shares, and the constraints (memory, kinds of parallelism,
 * devices); building and simulating strategies under them. */
#include "search-private.h"

#include <string.h>

G_DEFINE_QUARK(search-error-quark, search_error)

/* ---------------------------------------------------------------------------------- */
/* Kinds of parallelism                                                               */

gboolean search_kinds_parse(const char *text, SearchKinds *out, GError **error)
{
  g_return_val_if_fail(text != NULL && out != NULL, FALSE);
  static const struct {
    const char *name;
    SearchKinds kinds;
  } words[] = {
    { "data", SEARCH_KIND_DATA },
    { "attribute", SEARCH_KIND_ATTRIBUTE },
    { "spatial", SEARCH_KIND_ATTRIBUTE },
    { "sequence", SEARCH_KIND_ATTRIBUTE },
    { "parameter", SEARCH_KIND_PARAMETER },
    { "reduction", SEARCH_KIND_REDUCTION },
    { "model", SEARCH_KIND_PARAMETER | SEARCH_KIND_REDUCTION },
    { "pipeline", SEARCH_KIND_PIPELINE },
    { "all", SEARCH_KIND_ALL },
  };
  SearchKinds k = 0;
  g_auto(GStrv) parts = g_strsplit(text, ",", -1);
  for (char **it = parts; *it; it++) {
    char *w = g_strstrip(*it);
    if (!*w)
      continue;
    gboolean found = FALSE;
    for (gsize i = 0; i < G_N_ELEMENTS(words); i++) {
      if (g_ascii_strcasecmp(w, words[i].name) == 0) {
        k |= words[i].kinds;
        found = TRUE;
      }
    }
    if (!found) {
      g_set_error(error, SEARCH_ERROR, SEARCH_ERROR_UNKNOWN,
                  "unknown kind of parallelism '%s'; expected data, attribute (spatial, "
                  "sequence), parameter, reduction, model, pipeline or all", w);
      return FALSE;
    }
  }
  if (!(k & (SEARCH_KIND_DATA | SEARCH_KIND_ATTRIBUTE | SEARCH_KIND_PARAMETER |
             SEARCH_KIND_REDUCTION | SEARCH_KIND_PIPELINE))) {
    g_set_error(error, SEARCH_ERROR, SEARCH_ERROR_INVALID,
                "'%s' allows no kind of parallelism", text);
    return FALSE;
  }
  *out = k;
  return TRUE;
}

/* ---------------------------------------------------------------------------------- */
/* Lifetime and settings                                                              */

static void configs_clear(SearchProblem *p)
{
  if (!p->configs)
    return;
  for (int i = 0; i < p->n_ops; i++)
    if (p->configs[i])
      g_array_unref(p->configs[i]);
  g_clear_pointer(&p->configs, g_free);
}

SearchProblem *search_problem_new(const SimGraph *g, const SimMachine *m, SimCostModel *cost)
{
  g_return_val_if_fail(g != NULL && m != NULL && cost != NULL, NULL);
  SearchProblem *p = g_new0(SearchProblem, 1);
  p->refcount = 1;
  p->g = g;
  p->n_ops = sim_graph_n_ops(g);
  p->m = m;
  p->cost = cost;
  p->cancel = g_new0(SearchCancelCell, 1);
  p->cancel->refcount = 1;
  atomic_init(&p->cancel->flag, 0);
  p->sim = sim_options_default();
  p->sim.cancel = &p->cancel->flag;
  SimMegatronOptions mo = sim_megatron_options_default();
  p->sync = mo.sync;
  p->memory = mo.memory;
  p->memory_limit = TRUE;
  p->kinds = SEARCH_KIND_ALL;
  p->n_devices = sim_machine_n_devices(m);
  p->devices = g_new(int, p->n_devices);
  for (int i = 0; i < p->n_devices; i++)
    p->devices[i] = i;
  p->rewrites = g_ptr_array_new_with_free_func(g_free);
  g_ptr_array_add(p->rewrites, NULL);
  g_mutex_init(&p->lock);
  return p;
}

SearchProblem *search_problem_ref(SearchProblem *p)
{
  g_return_val_if_fail(p != NULL, NULL);
  g_atomic_int_inc(&p->refcount);
  return p;
}

void search_problem_unref(SearchProblem *p)
{
  if (!p || !g_atomic_int_dec_and_test(&p->refcount))
    return;
  configs_clear(p);
  if (g_atomic_int_dec_and_test(&p->cancel->refcount))
    g_free(p->cancel);
  g_mutex_clear(&p->lock);
  g_free(p->devices);
  g_ptr_array_unref(p->rewrites);
  if (p->own_graph)
    sim_graph_free(p->own_graph);
  g_free(p);
}

void search_problem_set_sim_options(SearchProblem *p, const SimOptions *o)
{
  g_return_if_fail(p != NULL && o != NULL);
  p->sim = *o;
  /* The search compares iteration times; recording every task would only cost time. */
  p->sim.keep_timeline = FALSE;
  /* Its simulations stop when a watch on it fires (search_watch_new()). */
  p->sim.cancel = &p->cancel->flag;
}

void search_problem_set_sync(SearchProblem *p, const SimSyncOptions *o)
{
  g_return_if_fail(p != NULL && o != NULL);
  p->sync = *o;
}

void search_problem_set_memory(SearchProblem *p, const SimMemoryOptions *o)
{
  g_return_if_fail(p != NULL && o != NULL);
  p->memory = *o;
}

void search_problem_set_memory_limit(SearchProblem *p, gboolean on)
{
  g_return_if_fail(p != NULL);
  p->memory_limit = !!on;
}

void search_problem_set_kinds(SearchProblem *p, SearchKinds kinds)
{
  g_return_if_fail(p != NULL);
  p->kinds = kinds & SEARCH_KIND_ALL;
  configs_clear(p);
}

gboolean search_problem_set_devices(SearchProblem *p, const int *devices, int n, GError **error)
{
  g_return_val_if_fail(p != NULL && devices != NULL, FALSE);
  int have = sim_machine_n_devices(p->m);
  if (n < 1) {
    g_set_error(error, SEARCH_ERROR, SEARCH_ERROR_INVALID, "the device subset is empty");
    return FALSE;
  }
  for (int i = 0; i < n; i++) {
    if (devices[i] < 0 || devices[i] >= have) {
      g_set_error(error, SEARCH_ERROR, SEARCH_ERROR_INVALID,
                  "device %d, but machine '%s' has devices 0..%d", devices[i],
                  sim_machine_get_name(p->m), have - 1);
      return FALSE;
    }
    for (int j = 0; j < i; j++) {
      if (devices[j] == devices[i]) {
        g_set_error(error, SEARCH_ERROR, SEARCH_ERROR_INVALID, "device %d is listed twice",
                    devices[i]);
        return FALSE;
      }
    }
  }
  g_free(p->devices);
  p->devices = g_memdup2(devices, sizeof(int) * (gsize)n);
  p->n_devices = n;
  configs_clear(p);
  return TRUE;
}

const SimGraph *search_problem_get_graph(const SearchProblem *p)
{
  g_return_val_if_fail(p != NULL, NULL);
  return p->g;
}

const SimMachine *search_problem_get_machine(const SearchProblem *p)
{
  g_return_val_if_fail(p != NULL, NULL);
  return p->m;
}

SimCostModel *search_problem_get_cost(const SearchProblem *p)
{
  g_return_val_if_fail(p != NULL, NULL);
  return p->cost;
}

SimOptions search_problem_get_sim_options(const SearchProblem *p)
{
  g_return_val_if_fail(p != NULL, sim_options_default());
  return p->sim;
}

gboolean search_problem_get_memory_limit(const SearchProblem *p)
{
  g_return_val_if_fail(p != NULL, TRUE);
  return p->memory_limit;
}

SearchKinds search_problem_get_kinds(const SearchProblem *p)
{
  g_return_val_if_fail(p != NULL, 0);
  return p->kinds;
}

const int *search_problem_get_devices(const SearchProblem *p, int *n)
{
  g_return_val_if_fail(p != NULL, NULL);
  if (n)
    *n = p->n_devices;
  return p->devices;
}

const char *const *search_problem_get_rewrites(const SearchProblem *p)
{
  g_return_val_if_fail(p != NULL, NULL);
  return (const char *const *)p->rewrites->pdata;
}

SearchProblem *search_problem_derive(const SearchProblem *p, SimGraph *g, const char *rewrite)
{
  g_return_val_if_fail(p != NULL && g != NULL, NULL);
  SearchProblem *d = search_problem_new(g, p->m, p->cost);
  d->own_graph = g;
  /* A watch on @p stops the simulations of its rewrites too. */
  if (g_atomic_int_dec_and_test(&d->cancel->refcount))
    g_free(d->cancel);
  d->cancel = p->cancel;
  g_atomic_int_inc(&d->cancel->refcount);
  d->sim = p->sim;
  d->sync = p->sync;
  d->memory = p->memory;
  d->memory_limit = p->memory_limit;
  d->kinds = p->kinds;
  g_free(d->devices);
  d->devices = g_memdup2(p->devices, sizeof(int) * (gsize)p->n_devices);
  d->n_devices = p->n_devices;
  g_ptr_array_set_size(d->rewrites, 0);
  for (guint i = 0; i + 1 < p->rewrites->len; i++)
    g_ptr_array_add(d->rewrites, g_strdup(g_ptr_array_index(p->rewrites, i)));
  if (rewrite)
    g_ptr_array_add(d->rewrites, g_strdup(rewrite));
  g_ptr_array_add(d->rewrites, NULL);
  return d;
}

/* ---------------------------------------------------------------------------------- */
/* Strategies                                                                         */

/* Gives @s the problem's options, one stage over its devices and its rewrites. */
static gboolean finish_strategy(const SearchProblem *p, SimStrategy *s, GError **error)
{
  int n_ops = sim_graph_n_ops(p->g);
  g_autofree int *op_stage = g_new0(int, MAX(n_ops, 1));
  const int *groups[1] = { p->devices };
  if (!sim_strategy_set_stages(s, 1, op_stage, groups, &p->n_devices, error))
    return FALSE;
  sim_strategy_set_microbatches(s, 1);
  sim_strategy_set_schedule(s, SIM_SCHEDULE_1F1B, 1);
  sim_strategy_set_sync(s, &p->sync);
  sim_strategy_set_memory(s, &p->memory);
  sim_strategy_clear_rewrites(s);
  for (guint i = 0; i + 1 < p->rewrites->len; i++)
    sim_strategy_add_rewrite(s, g_ptr_array_index(p->rewrites, i));
  return TRUE;
}

SimStrategy *search_problem_new_strategy(const SearchProblem *p)
{
  g_return_val_if_fail(p != NULL, NULL);
  g_autoptr(SimStrategy) s = sim_strategy_new(p->g, p->m);
  int n_ops = sim_graph_n_ops(p->g);
  int degrees[SEARCH_MAX_DIMS];
  for (int d = 0; d < SEARCH_MAX_DIMS; d++)
    degrees[d] = 1;
  for (int op = 0; op < n_ops; op++)
    if (!sim_strategy_set_op(s, op, degrees, p->devices, NULL))
      g_return_val_if_reached(NULL);
  if (!finish_strategy(p, s, NULL))
    g_return_val_if_reached(NULL);
  return g_steal_pointer(&s);
}

SimStrategy *search_problem_strategy_from_configs(const SearchProblem *p, const int *cfg,
                                                  GError **error)
{
  g_return_val_if_fail(p != NULL && cfg != NULL, NULL);
  search_problem_prepare(p);
  g_autoptr(SimStrategy) s = sim_strategy_new(p->g, p->m);
  int n_ops = sim_graph_n_ops(p->g);
  for (int op = 0; op < n_ops; op++)
    if (!search_problem_apply_config(p, s, op, search_problem_config(p, op, cfg[op]), error))
      return NULL;
  if (!finish_strategy(p, s, error))
    return NULL;
  return g_steal_pointer(&s);
}

/* The baseline does not depend on the kinds of parallelism the search may use: it is
 * what the search is measured against. */
SimStrategy *search_problem_data_parallel(const SearchProblem *p, GError **error)
{
  g_return_val_if_fail(p != NULL, NULL);
  g_autoptr(SimStrategy) s = sim_strategy_new(p->g, p->m);
  int n_ops = sim_graph_n_ops(p->g);
  for (int op = 0; op < n_ops; op++) {
    int degrees[SEARCH_MAX_DIMS];
    for (int d = 0; d < SEARCH_MAX_DIMS; d++)
      degrees[d] = 1;
    /* As sim_strategy_data_parallel(): samples that do not split n ways run on as many
     * devices as divide them. */
    int64_t size = sim_graph_op_dim_size(p->g, op, 0);
    if (sim_graph_op_dim_splittable(p->g, op, 0))
      for (int k = p->n_devices; k > 1; k--)
        if (size % k == 0) {
          degrees[0] = k;
          break;
        }
    if (!sim_strategy_set_op(s, op, degrees, p->devices, error))
      return NULL;
  }
  if (!finish_strategy(p, s, error))
    return NULL;
  return g_steal_pointer(&s);
}

SimStrategy *search_problem_map_devices(const SearchProblem *p, const SimStrategy *s,
                                        GError **error)
{
  g_return_val_if_fail(p != NULL && s != NULL, NULL);
  g_autoptr(SimStrategy) c = sim_strategy_copy(s);
  gboolean identity = TRUE;
  for (int i = 0; i < p->n_devices; i++)
    identity = identity && p->devices[i] == i;
  if (!identity) {
    int n_ops = sim_graph_n_ops(p->g);
    g_autofree int *buf = g_new(int, p->n_devices);
    for (int op = 0; op < n_ops; op++) {
      int n = 0;
      const int *dev = sim_strategy_op_devices(s, op, &n);
      g_autofree int *mapped = g_new(int, MAX(n, 1));
      for (int i = 0; i < n; i++) {
        if (dev[i] >= p->n_devices) {
          g_set_error(error, SEARCH_ERROR, SEARCH_ERROR_INVALID,
                      "op '%s' uses device %d, but the search has %d devices",
                      sim_graph_op_name(p->g, op), dev[i], p->n_devices);
          return NULL;
        }
        mapped[i] = p->devices[dev[i]];
      }
      if (!sim_strategy_set_op(c, op, sim_strategy_op_degrees(s, op), mapped, error))
        return NULL;
    }
    /* Stage groups are the devices their ops use, mapped the same way. */
    int n_stages = sim_strategy_n_stages(s);
    g_autofree int *op_stage = g_new(int, MAX(n_ops, 1));
    for (int op = 0; op < n_ops; op++)
      op_stage[op] = sim_strategy_op_stage(s, op);
    g_autoptr(GPtrArray) groups = g_ptr_array_new_with_free_func(g_free);
    g_autofree int *sizes = g_new0(int, n_stages);
    g_autofree gboolean *used = g_new0(gboolean, (gsize)n_stages * p->n_devices);
    for (int op = 0; op < n_ops; op++) {
      int n = 0;
      const int *dev = sim_strategy_op_devices(s, op, &n);
      for (int i = 0; i < n; i++)
        used[(gsize)op_stage[op] * p->n_devices + dev[i]] = TRUE;
    }
    for (int st = 0; st < n_stages; st++) {
      int *grp = g_new(int, p->n_devices);
      for (int d = 0; d < p->n_devices; d++)
        if (used[(gsize)st * p->n_devices + d])
          grp[sizes[st]++] = p->devices[d];
      g_ptr_array_add(groups, grp);
    }
    if (!sim_strategy_set_stages(c, n_stages, op_stage, (const int *const *)groups->pdata, sizes,
                                 error))
      return NULL;
  }
  sim_strategy_clear_rewrites(c);
  for (guint i = 0; i + 1 < p->rewrites->len; i++)
    sim_strategy_add_rewrite(c, g_ptr_array_index(p->rewrites, i));
  return g_steal_pointer(&c);
}

/* ---------------------------------------------------------------------------------- */
/* Simulation                                                                         */

double search_problem_cost(const SearchProblem *p, double t, double ratio, gboolean fits,
                           double *time, double *memory)
{
  if (time)
    *time = t > 0 && isfinite(t) ? t : INFINITY;
  if (memory)
    *memory = ratio;
  if (!(t > 0) || !isfinite(t))
    return INFINITY;
  if (p->memory_limit && !fits)
    return INFINITY;
  return t;
}

double search_problem_report_cost(const SearchProblem *p, const SimReport *r, double *time,
                                  double *memory)
{
  double ratio = 0;
  int nd = sim_report_n_devices(r);
  for (int d = 0; d < nd; d++) {
    const SimDeviceSpec *spec = sim_machine_device_spec(p->m, d);
    if (spec && spec->mem_capacity > 0)
      ratio = MAX(ratio, (double)sim_report_peak_memory(r, d) / (double)spec->mem_capacity);
  }
  return search_problem_cost(p, sim_report_iteration_time(r), ratio, sim_report_fits(r), time,
                             memory);
}

gboolean search_problem_brief(const SearchProblem *p, const SimStrategy *s, double bound,
                              SimBrief *b, GError **error)
{
  /* A plan that does not fit costs INFINITY whatever its time, so with a memory limit the
   * run may stop where a device first overflows; PARASOL_NO_BOUNDS runs every one to its
   * end. */
  gboolean to_the_end = g_getenv("PARASOL_NO_BOUNDS") != NULL;
  SimOptions o = p->sim;
  o.stop_at_overflow = p->memory_limit && !to_the_end;
  return sim_simulate_brief(p->g, p->m, s, p->cost, &o, to_the_end ? INFINITY : bound, b,
                            error);
}

double search_problem_simulate(const SearchProblem *p, const SimStrategy *s, SimReport **report,
                               GError **error)
{
  g_return_val_if_fail(p != NULL && s != NULL, INFINITY);
  if (report)
    *report = NULL;
  if (!report) {
    /* Only the cost: a brief run gives the report's time and memory verdict. */
    SimBrief b;
    if (!search_problem_brief(p, s, INFINITY, &b, error))
      return INFINITY;
    if (b.cut)
      return INFINITY;
    return search_problem_cost(p, b.time, b.max_ratio, b.fits, NULL, NULL);
  }
  SimReport *r = sim_simulate(p->g, p->m, s, p->cost, &p->sim, error);
  if (!r)
    return INFINITY;
  double cost = search_problem_report_cost(p, r, NULL, NULL);
  if (report)
    *report = r;
  else
    sim_report_free(r);
  return cost;
}
