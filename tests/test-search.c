/* test-search.c — the search library: the registry and plugins, the driver (budgets,
 * determinism, the log, Ctrl-C, bad arguments), constraints, the dynamic programs against
 * brute force, every algorithm against exhaustive enumeration on a small problem, and
 * substitutions with the strategy files that record them.
 *
 * The small problem is Unity's MLP cut down to one dense layer per tower, 256 units and 32
 * samples, on two GPUs of a DGX A100: nine operators with 3 to 5 candidate configurations
 * each, 19,200 strategies in all, which exhaustive search simulates in about a second.
 *
 * About 1,300 lines: one program per module (tests/meson.build); every algorithm is
 * checked on the small problem above. */
#include "parasol-search.h"
#include "search-private.h"

#include <criterion/criterion.h>
#include <math.h>
#include <glib/gstdio.h>
#include <signal.h>
#include <string.h>

typedef struct {
  SimGraph *g;
  SimMachine *m;
  SimCostModel *cost;
  SearchProblem *p;
} Fixture;

static void fixture_load(Fixture *f, const char *model, const char *params, const char *machine,
                         int n_devices)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(SimModelParams) mp = sim_model_params_new();
  if (params)
    cr_assert(sim_model_params_parse(mp, params, &error));
  f->g = sim_zoo_build(model, mp, &error);
  cr_assert_not_null(f->g, "%s", error ? error->message : "");
  sim_graph_set_float_dtype(f->g, SIM_DTYPE_FP16);
  f->m = sim_machine_load(machine, &error);
  cr_assert_not_null(f->m, "%s", error ? error->message : "");
  SimRooflineParams rp = sim_roofline_params_default();
  f->cost = sim_cost_model_new_roofline(&rp);
  f->p = search_problem_new(f->g, f->m, f->cost);
  if (n_devices > 0) {
    int devs[64];
    for (int i = 0; i < n_devices; i++)
      devs[i] = i;
    cr_assert(search_problem_set_devices(f->p, devs, n_devices, NULL));
  }
}

static void fixture_small(Fixture *f)
{
  fixture_load(f, "mlp", "layers=1,hidden=256,batch=32", "dgx-a100", 2);
}

static void fixture_free(Fixture *f)
{
  search_problem_unref(f->p);
  sim_cost_model_free(f->cost);
  sim_machine_free(f->m);
  sim_graph_free(f->g);
}

static SearchResult *run(const char *algo, SearchProblem *p, gint64 evals, guint64 seed,
                         int threads, const char *const *options)
{
  search_register_builtins();
  const SearchAlgorithm *a = search_lookup(algo);
  cr_assert_not_null(a, "algorithm %s", algo);
  SearchRunOptions o = search_run_options_default();
  o.eval_budget = evals;
  o.seed = seed;
  o.threads = threads;
  o.options = options;
  g_autoptr(GError) error = NULL;
  SearchResult *r = search_run(a, p, &o, &error);
  cr_assert_not_null(r, "%s: %s", algo, error ? error->message : "");
  return r;
}

/* ---------------------------------------------------------------------------------- */
/* Registry and plugins                                                               */

Test(search, registry_lists_every_builtin)
{
  search_register_builtins();
  search_register_builtins();
  static const char *const names[] = { "data-parallel", "expert", "owt", "exhaustive", "mcmc",
                                       "optcnn", "dp", "pipeline", "megatron", "beam",
                                       "subst" };
  for (gsize i = 0; i < G_N_ELEMENTS(names); i++) {
    const SearchAlgorithm *a = search_lookup(names[i]);
    cr_assert_not_null(a, "%s is registered", names[i]);
    cr_assert_str_eq(a->name, names[i]);
    cr_assert(a->description && *a->description && !strchr(a->description, '\n'));
  }
  cr_assert_geq(search_n_algorithms(), (int)G_N_ELEMENTS(names));
  cr_assert_null(search_lookup("no-such-search"));
}

static gboolean nothing_run(const SearchAlgorithm *self, SearchContext *ctx, GError **error)
{
  return TRUE;
}

Test(search, registry_rejects_bad_algorithms)
{
  search_register_builtins();
  static const SearchAlgorithm old = { .api_version = SEARCH_ALGORITHM_API_VERSION + 1,
                                       .name = "from-the-future", .description = "d",
                                       .run = nothing_run };
  static const SearchAlgorithm dup = { .api_version = SEARCH_ALGORITHM_API_VERSION,
                                       .name = "mcmc", .description = "d", .run = nothing_run };
  static const SearchAlgorithm norun = { .api_version = SEARCH_ALGORITHM_API_VERSION,
                                         .name = "norun", .description = "d" };
  GError *error = NULL;
  cr_assert_not(search_register(&old, &error));
  cr_assert(g_error_matches(error, SEARCH_ERROR, SEARCH_ERROR_PLUGIN));
  cr_assert(strstr(error->message, "version"), "%s", error->message);
  g_clear_error(&error);
  cr_assert_not(search_register(&dup, &error));
  cr_assert(strstr(error->message, "already registered"), "%s", error->message);
  g_clear_error(&error);
  cr_assert_not(search_register(&norun, &error));
  g_clear_error(&error);
}

Test(search, plugin_loads_and_runs)
{
  const char *path = g_getenv("PARASOL_SEARCH_PLUGIN");
  cr_assert_not_null(path, "the test runs with PARASOL_SEARCH_PLUGIN set by meson");
  GError *error = NULL;
  search_register_builtins();
  const SearchAlgorithm *a = search_load_plugin(path, &error);
  cr_assert_not_null(a, "%s", error ? error->message : "");
  cr_assert_str_eq(a->name, "random");
  cr_assert_eq(search_lookup("random"), a);

  Fixture f;
  fixture_small(&f);
  SearchResult *r = run("random", f.p, 200, 3, 1, NULL);
  cr_assert_not_null(search_result_get_strategy(r));
  cr_assert_eq(search_result_get_evals(r), 200);
  cr_assert(isfinite(search_result_get_time(r)));
  search_result_free(r);
  fixture_free(&f);

  /* Loading it again registers nothing new: the same algorithm is already there. */
  cr_assert_not_null(search_load_plugin(path, &error));
}

Test(search, plugin_errors_name_the_file)
{
  GError *error = NULL;
  cr_assert_null(search_load_plugin("/nonexistent/plugin.so", &error));
  cr_assert(g_error_matches(error, SEARCH_ERROR, SEARCH_ERROR_PLUGIN));
  cr_assert(strstr(error->message, "/nonexistent/plugin.so"), "%s", error->message);
  g_clear_error(&error);
  /* A shared object without the entry point: the C library itself. */
  cr_assert_null(search_load_plugin("libc.so.6", &error));
  cr_assert(g_error_matches(error, SEARCH_ERROR, SEARCH_ERROR_PLUGIN));
  g_clear_error(&error);
}

/* A plugin of another interface version is refused on its version alone, naming the file:
 * the rest of its struct (here no name where this version keeps it) is never read. */
Test(search, plugin_of_another_version_is_refused_by_its_version)
{
  const char *path = g_getenv("PARASOL_FUTURE_PLUGIN");
  cr_assert_not_null(path, "the test runs with PARASOL_FUTURE_PLUGIN set by meson");
  GError *error = NULL;
  cr_assert_null(search_load_plugin(path, &error));
  cr_assert(g_error_matches(error, SEARCH_ERROR, SEARCH_ERROR_PLUGIN));
  cr_assert(strstr(error->message, path), "%s", error->message);
  cr_assert(strstr(error->message, "interface version 99; this parasol has version 1"), "%s",
            error->message);
  g_clear_error(&error);
}

/* A run that returns FALSE without an error gives one that names the algorithm. */
Test(search, plugin_failing_silently_gets_an_error)
{
  const char *path = g_getenv("PARASOL_SILENT_PLUGIN");
  cr_assert_not_null(path, "the test runs with PARASOL_SILENT_PLUGIN set by meson");
  GError *error = NULL;
  const SearchAlgorithm *a = search_load_plugin(path, &error);
  cr_assert_not_null(a, "%s", error ? error->message : "");
  Fixture f;
  fixture_small(&f);
  SearchRunOptions o = search_run_options_default();
  o.eval_budget = 10;
  cr_assert_null(search_run(a, f.p, &o, &error));
  cr_assert(g_error_matches(error, SEARCH_ERROR, SEARCH_ERROR_PLUGIN));
  cr_assert(strstr(error->message, "algorithm 'silent-failure' failed without saying why"), "%s",
            error->message);
  g_clear_error(&error);
  fixture_free(&f);
}

/* ---------------------------------------------------------------------------------- */
/* Configurations and constraints                                                     */

Test(search, configs_respect_kinds_and_devices)
{
  Fixture f;
  fixture_load(&f, "mlp", "layers=1,hidden=256,batch=32", "dgx-a100", 0);
  int devs[4] = { 4, 5, 6, 7 };
  cr_assert(search_problem_set_devices(f.p, devs, 4, NULL));
  search_problem_set_kinds(f.p, SEARCH_KIND_DATA | SEARCH_KIND_PIPELINE);
  const SimGraph *g = f.g;
  for (int op = 0; op < sim_graph_n_ops(g); op++) {
    int n = search_problem_n_configs(f.p, op);
    cr_assert_geq(n, 1);
    const SearchConfig *c0 = search_problem_config(f.p, op, 0);
    cr_assert_eq(c0->n, 1, "index 0 is the op whole on one device");
    for (int i = 0; i < n; i++) {
      const SearchConfig *c = search_problem_config(f.p, op, i);
      int dev[64];
      search_problem_config_devices(f.p, c, dev);
      for (int k = 0; k < c->n; k++)
        cr_assert(dev[k] >= 4 && dev[k] <= 7, "device %d outside the subset", dev[k]);
      for (int d = 1; d < sim_graph_op_n_dims(g, op); d++)
        cr_assert_eq(c->degree[d], 1, "op %s splits dimension %d with only data allowed",
                     sim_graph_op_name(g, op), d);
      cr_assert_eq(search_problem_find_config(f.p, op, c), i);
    }
  }
  /* A strategy from configurations gives each op back its configuration. */
  int n_ops = sim_graph_n_ops(g);
  g_autofree int *cfg = g_new(int, n_ops);
  for (int op = 0; op < n_ops; op++)
    cfg[op] = search_problem_n_configs(f.p, op) - 1;
  g_autoptr(SimStrategy) s = search_problem_strategy_from_configs(f.p, cfg, NULL);
  cr_assert_not_null(s);
  for (int op = 0; op < n_ops; op++)
    cr_assert_eq(search_problem_config_of(f.p, s, op), cfg[op]);
  fixture_free(&f);
}

Test(search, infeasible_strategies_are_never_returned)
{
  /* A four-GPU machine whose GPUs hold 24 MiB: the MLP's 33.6 M fp16 parameters with
   * Adam's states (16 bytes each, 537 MB) need the weights split 32 ways at least when
   * data parallel, so replicating them does not fit; splitting them across the GPUs
   * lowers the need, though only so far. */
  static const char machine[] =
    "{\"format\": \"parasol-machine\", \"version\": 1, \"name\": \"small-gpus\","
    " \"node\": {\"gpu\": {\"name\": \"a100-small\", \"base\": \"a100-80gb\", \"memory_GiB\": 0.2},"
    " \"gpus\": 4, \"fabric\": {\"type\": \"nvswitch\", \"bandwidth_GBps\": 300},"
    " \"pcie\": {\"bandwidth_GBps\": 31.5}}}";
  GError *error = NULL;
  SimMachine *m = sim_machine_from_json(machine, "small-gpus.json", 0, &error);
  cr_assert_not_null(m, "%s", error ? error->message : "");
  g_autoptr(SimModelParams) mp = sim_model_params_new();
  cr_assert(sim_model_params_parse(mp, "layers=2,hidden=1024,batch=32", NULL));
  SimGraph *g = sim_zoo_build("mlp", mp, NULL);
  sim_graph_set_float_dtype(g, SIM_DTYPE_FP16);
  SimRooflineParams rp = sim_roofline_params_default();
  SimCostModel *cost = sim_cost_model_new_roofline(&rp);
  SearchProblem *p = search_problem_new(g, m, cost);

  g_autoptr(SimStrategy) dp = search_problem_data_parallel(p, NULL);
  cr_assert(isinf(search_problem_simulate(p, dp, NULL, NULL)), "data parallelism must not fit");

  static const char *const algos[] = { "mcmc", "dp", "beam", "optcnn" };
  gboolean found = FALSE;
  for (gsize i = 0; i < G_N_ELEMENTS(algos); i++) {
    SearchResult *r = run(algos[i], p, 600, 1, 2, NULL);
    const SimStrategy *s = search_result_get_strategy(r);
    if (s) {
      g_autoptr(SimReport) rep = NULL;
      double t = search_problem_simulate(p, s, &rep, NULL);
      cr_assert(isfinite(t) && sim_report_fits(rep), "%s returned a strategy that does not fit",
                algos[i]);
      cr_assert_float_eq(t, search_result_get_time(r), 1e-15);
      found = TRUE;
    } else {
      cr_assert(isinf(search_result_get_time(r)));
    }
    search_result_free(r);
  }
  cr_assert(found, "some algorithm finds a strategy that fits");

  /* Without the limit the same problem has a "best" that needs more memory than there is. */
  search_problem_set_memory_limit(p, FALSE);
  cr_assert(isfinite(search_problem_simulate(p, dp, NULL, NULL)));

  search_problem_unref(p);
  sim_cost_model_free(cost);
  sim_graph_free(g);
  sim_machine_free(m);
}

/* ---------------------------------------------------------------------------------- */
/* Dynamic programs against brute force on the estimate                               */

/* The minimum of the estimate over every combination of each op's start-0 candidates:
 * the space OptCNN's program covers when it may keep them all. */
static double brute_force_estimate(const SearchProblem *p, SearchEstimate *e)
{
  int n = sim_graph_n_ops(search_problem_get_graph(p));
  GArray **c = g_new(GArray *, n);
  for (int op = 0; op < n; op++) {
    c[op] = g_array_new(FALSE, FALSE, sizeof(int));
    for (int i = 0; i < search_problem_n_configs(p, op); i++)
      if (search_problem_config(p, op, i)->start == 0)
        g_array_append_val(c[op], i);
  }
  int *digit = g_new0(int, n), *cfg = g_new(int, n);
  double best = INFINITY;
  for (;;) {
    for (int op = 0; op < n; op++)
      cfg[op] = g_array_index(c[op], int, digit[op]);
    best = MIN(best, search_estimate_total(e, cfg));
    int op = n - 1;
    while (op >= 0 && digit[op] + 1 >= (int)c[op]->len)
      digit[op--] = 0;
    if (op < 0)
      break;
    digit[op]++;
  }
  for (int op = 0; op < n; op++)
    g_array_unref(c[op]);
  g_free(c);
  g_free(digit);
  g_free(cfg);
  return best;
}

Test(search, dynamic_programs_are_exact_on_series_parallel_graphs)
{
  Fixture f;
  fixture_load(&f, "mlp", "layers=2,hidden=256,batch=32", "dgx-a100", 4);
  SearchEstimate *e = search_estimate_new(f.p);
  double brute = brute_force_estimate(f.p, e);
  int n = sim_graph_n_ops(f.g);
  g_autofree int *cfg = g_new(int, n);
  /* With every candidate kept, node and edge eliminations find the exact minimum, and so
   * does Unity's decomposition when branches share the devices. */
  double optcnn = search_dp_optcnn(f.p, e, 1000, cfg);
  cr_assert_float_eq(optcnn, brute, 1e-12 * brute, "optcnn %.9g, brute force %.9g", optcnn, brute);
  double unity = search_dp_unity(f.p, e, 1000, FALSE, cfg);
  cr_assert_float_eq(unity, brute, 1e-12 * brute, "unity %.9g, brute force %.9g", unity, brute);
  cr_assert_float_eq(search_estimate_total(e, cfg), unity, 1e-12 * brute);
  /* Resource splits only add choices: the two towers on two GPUs each cost the slower. */
  double split = search_dp_unity(f.p, e, 1000, TRUE, cfg);
  cr_assert_leq(split, unity * (1 + 1e-12), "with splits %.9g > without %.9g", split, unity);
  search_estimate_free(e);
  fixture_free(&f);
}

/* Variable elimination on random costs: exact on a series-parallel cost graph, and on a
 * complete graph of four (not series-parallel) a valid assignment whose cost it reports. */
static double ve_cost(int n, const int *k, double **u, double *pair[8][8], const int *v)
{
  double c = 0;
  for (int i = 0; i < n; i++) {
    c += u[i][v[i]];
    for (int j = i + 1; j < n; j++)
      if (pair[i][j])
        c += pair[i][j][v[i] * k[j] + v[j]];
  }
  return c;
}

static void ve_check(int n, const int (*edges)[2], int n_edges, gboolean exact)
{
  GRand *r = g_rand_new_with_seed(42);
  int k[8];
  double *u[8], *pair[8][8] = { { NULL } };
  for (int i = 0; i < n; i++) {
    k[i] = 2 + g_rand_int_range(r, 0, 3);
    u[i] = g_new(double, k[i]);
    for (int x = 0; x < k[i]; x++)
      u[i][x] = g_rand_double(r);
  }
  SearchVE *ve = search_ve_new(n, k);
  for (int i = 0; i < n; i++)
    search_ve_add_unary(ve, i, u[i]);
  for (int e = 0; e < n_edges; e++) {
    int a = edges[e][0], b = edges[e][1];
    pair[a][b] = g_new(double, k[a] * k[b]);
    for (int x = 0; x < k[a] * k[b]; x++)
      pair[a][b][x] = g_rand_double(r);
    search_ve_add_pair(ve, a, b, pair[a][b]);
  }
  double table;
  int fixes = search_ve_solve(ve, &table);
  int v[8];
  search_ve_assign(ve, NULL, v);
  double got = ve_cost(n, k, u, pair, v);
  cr_assert_float_eq(got, table, 1e-9, "the reported cost is the assignment's");
  int d[8] = { 0 };
  double best = INFINITY;
  for (;;) {
    best = MIN(best, ve_cost(n, k, u, pair, d));
    int i = n - 1;
    while (i >= 0 && d[i] + 1 >= k[i])
      d[i--] = 0;
    if (i < 0)
      break;
    d[i]++;
  }
  if (exact) {
    cr_assert_eq(fixes, 0);
    cr_assert_float_eq(got, best, 1e-9);
  } else {
    cr_assert_gt(fixes, 0);
    cr_assert_geq(got, best - 1e-9);
  }
  search_ve_free(ve);
  for (int i = 0; i < n; i++) {
    g_free(u[i]);
    for (int j = 0; j < n; j++)
      g_free(pair[i][j]);
  }
  g_rand_free(r);
}

Test(search, variable_elimination)
{
  /* A diamond with a tail and a parallel edge: series-parallel. */
  static const int sp[][2] = { { 0, 1 }, { 0, 2 }, { 1, 3 }, { 2, 3 }, { 3, 4 }, { 0, 3 } };
  ve_check(5, sp, G_N_ELEMENTS(sp), TRUE);
  static const int k4[][2] = { { 0, 1 }, { 0, 2 }, { 0, 3 }, { 1, 2 }, { 1, 3 }, { 2, 3 } };
  ve_check(4, k4, G_N_ELEMENTS(k4), FALSE);
}

/* ---------------------------------------------------------------------------------- */
/* Every algorithm against exhaustive enumeration                                     */

Test(search, every_algorithm_reaches_the_exhaustive_optimum, .timeout = 120)
{
  Fixture f;
  fixture_small(&f);
  SearchResult *ex = run("exhaustive", f.p, 0, 1, 1, NULL);
  double best = search_result_get_time(ex);
  cr_assert(isfinite(best));
  cr_assert_eq(search_result_get_evals(ex), 19200, "every strategy once: %" G_GINT64_FORMAT,
               search_result_get_evals(ex));
  search_result_free(ex);

  /* MCMC's chains meet at a local optimum here (the towers split in half on both GPUs,
   * 7% slower than one tower on each) that a single move cannot leave; six chains from
   * different starts (data parallel, the expert plan, random plans) find the optimum. */
  static const char *const six_chains[] = { "chains=6", NULL };
  static const struct {
    const char *algo;
    gint64 evals;
    const char *const *options;
  } cases[] = {
    { "mcmc", 4000, six_chains }, { "dp", 2000, NULL }, { "optcnn", 2000, NULL },
    { "beam", 2000, NULL }, { "pipeline", 2000, NULL }, { "subst", 4000, NULL },
  };
  for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
    SearchResult *r = run(cases[i].algo, f.p, cases[i].evals, 1, 2, cases[i].options);
    double t = search_result_get_time(r);
    /* Equal up to strategies whose times differ in the last digits (a label's shard
     * placed elsewhere): a millionth. */
    cr_assert_float_eq(t, best, 1e-6 * best, "%s: %.9g, exhaustive %.9g", cases[i].algo, t, best);
    cr_assert_leq(search_result_get_evals(r), cases[i].evals);
    search_result_free(r);
  }
  /* The baselines are strategies too: never better than the optimum. */
  static const char *const baselines[] = { "data-parallel", "expert", "owt" };
  for (gsize i = 0; i < G_N_ELEMENTS(baselines); i++) {
    SearchResult *r = run(baselines[i], f.p, 1000, 1, 1, NULL);
    cr_assert_geq(search_result_get_time(r), best * (1 - 1e-12), "%s", baselines[i]);
    search_result_free(r);
  }
  fixture_free(&f);
}

Test(search, exhaustive_refuses_large_problems)
{
  Fixture f;
  fixture_load(&f, "mlp", "layers=2,hidden=256,batch=32", "dgx-a100", 8);
  search_register_builtins();
  GError *error = NULL;
  SearchRunOptions o = search_run_options_default();
  o.eval_budget = 10;
  cr_assert_null(search_run(search_lookup("exhaustive"), f.p, &o, &error));
  cr_assert(g_error_matches(error, SEARCH_ERROR, SEARCH_ERROR_TOO_LARGE));
  cr_assert(strstr(error->message, "max="), "%s", error->message);
  g_clear_error(&error);
  fixture_free(&f);
}

/* ---------------------------------------------------------------------------------- */
/* The driver                                                                         */

Test(search, same_seed_and_budget_give_the_same_strategy)
{
  Fixture f;
  fixture_load(&f, "mlp", "layers=2,hidden=256,batch=32", "dgx-a100", 4);
  static const char *const algos[] = { "mcmc", "beam", "subst" };
  for (gsize i = 0; i < G_N_ELEMENTS(algos); i++) {
    SearchResult *a = run(algos[i], f.p, 1500, 7, 2, NULL);
    SearchResult *b = run(algos[i], f.p, 1500, 7, 2, NULL);
    cr_assert_eq(search_result_get_time(a), search_result_get_time(b), "%s", algos[i]);
    cr_assert(sim_strategy_equal(search_result_get_strategy(a), search_result_get_strategy(b)),
              "%s: the same seed and budget give the same strategy", algos[i]);
    cr_assert_eq(search_result_get_evals(a), search_result_get_evals(b));
    search_result_free(a);
    search_result_free(b);
  }
  fixture_free(&f);
}

Test(search, mcmc_decides_the_same_whether_its_simulations_stop_early)
{
  /* The acceptance draw comes before each simulation, which may then stop past the
   * acceptance bound: every decision, and so the chain and its result, is the one full
   * simulations give.  Some simulations did stop early. */
  Fixture f;
  fixture_load(&f, "mlp", "layers=2,hidden=256,batch=32", "dgx-a100", 4);
  static const char *const early[] = { "stop-early=1", NULL };
  static const char *const full[] = { "stop-early=0", NULL };
  for (guint64 seed = 1; seed <= 3; seed++) {
    SearchResult *a = run("mcmc", f.p, 1500, seed, 1, early);
    SearchResult *b = run("mcmc", f.p, 1500, seed, 1, full);
    cr_assert_eq(search_result_get_time(a), search_result_get_time(b));
    cr_assert(sim_strategy_equal(search_result_get_strategy(a), search_result_get_strategy(b)));
    cr_assert_eq(search_result_get_evals(a), search_result_get_evals(b));
    cr_assert_gt(search_result_get_cut_evals(a), 0);
    cr_assert_eq(search_result_get_cut_evals(b), 0);
    search_result_free(a);
    search_result_free(b);
  }
  fixture_free(&f);
}

Test(search, mcmc_trades_recomputation_for_micro_batches, .timeout = 120)
{
  /* A GPT whose 128 sequences of 2,048 tokens a GPU need about 100 GiB of activations in one
   * micro-batch: data parallelism fits only with recomputation (a third more compute) or
   * with the batch split into micro-batches.  Per-operator moves cannot leave the
   * recomputation the first plan needed; plan moves can, and do. */
  Fixture f;
  fixture_load(&f, "gpt", "layers=2,hidden=1024,heads=16,seq=2048,vocab=1024,batch=1024",
               "dgx-a100", 0);
  static const char *const none[] = { "plan-moves=0", NULL };
  SearchResult *a = run("mcmc", f.p, 3000, 1, 1, none);
  SearchResult *b = run("mcmc", f.p, 3000, 1, 1, NULL);
  const SimStrategy *sa = search_result_get_strategy(a), *sb = search_result_get_strategy(b);
  cr_assert_eq(sim_strategy_get_memory(sa).recompute, SIM_RECOMPUTE_FULL);
  cr_assert_eq(sim_strategy_get_microbatches(sa), 1);
  cr_expect_eq(sim_strategy_get_memory(sb).recompute, SIM_RECOMPUTE_NONE);
  cr_expect_gt(sim_strategy_get_microbatches(sb), 1);
  cr_expect_lt(search_result_get_time(b), 0.9 * search_result_get_time(a), "%g against %g",
               search_result_get_time(b), search_result_get_time(a));
  search_result_free(a);
  search_result_free(b);
  fixture_free(&f);
}

Test(search, the_expert_yardstick_comes_from_the_search_when_it_has_it)
{
  /* Unity's dynamic program starts from the fastest expert plan, simulating every
   * candidate: the result keeps it, and it is the plan search_problem_expert() finds
   * (which also counts data parallelism, slower here). */
  Fixture f;
  fixture_load(&f, "mlp", "layers=2,hidden=256,batch=32", "dgx-a100", 4);
  SearchResult *r = run("dp", f.p, 500, 1, 1, NULL);
  double known = INFINITY;
  const SimStrategy *k = search_result_get_expert(r, &known);
  cr_assert_not_null(k);
  double direct = INFINITY;
  g_autoptr(SimStrategy) e = search_problem_expert(f.p, &direct, NULL);
  cr_assert_not_null(e);
  cr_expect_eq(known, direct);
  cr_expect(sim_strategy_equal(k, e));
  search_result_free(r);
  /* MCMC starts a chain from the best expert plan, the single-stage ones and then those
   * with a pipeline within a share of the budget: here it simulates them all, and keeps
   * the same yardstick; with no share for pipelines it has not seen them all. */
  r = run("mcmc", f.p, 500, 1, 2, NULL);
  known = INFINITY;
  k = search_result_get_expert(r, &known);
  cr_assert_not_null(k);
  cr_expect_eq(known, direct);
  cr_expect(sim_strategy_equal(k, e));
  search_result_free(r);
  static const char *const flat[] = { "pipelines=0", NULL };
  r = run("mcmc", f.p, 500, 1, 2, flat);
  cr_expect_null(search_result_get_expert(r, NULL));
  search_result_free(r);
  fixture_free(&f);
}

/* Runs @algo on one thread without the environment variable @var, then with it set, into
 * *@without and *@with, which must end with the same time, strategy and number of
 * evaluations. */
static void run_both_ways(const char *algo, SearchProblem *p, gint64 evals, guint64 seed,
                          const char *var, const char *value, SearchResult **without,
                          SearchResult **with)
{
  g_unsetenv(var);
  SearchResult *a = run(algo, p, evals, seed, 1, NULL);
  g_setenv(var, value, TRUE);
  SearchResult *b = run(algo, p, evals, seed, 1, NULL);
  g_unsetenv(var);
  cr_assert_eq(search_result_get_time(a), search_result_get_time(b), "%s, %s: %.17g against %.17g",
               algo, var, search_result_get_time(a), search_result_get_time(b));
  cr_assert(sim_strategy_equal(search_result_get_strategy(a), search_result_get_strategy(b)),
            "%s, %s", algo, var);
  cr_assert_eq(search_result_get_evals(a), search_result_get_evals(b), "%s, %s", algo, var);
  *without = a;
  *with = b;
}

Test(search, bounded_simulations_change_no_result)
{
  /* Local search keeps a trial only below the best so far, MCMC accepts below a bound it
   * reads ahead: simulations stop past those bounds, and every algorithm that uses them
   * ends where it ends when every simulation runs to its end (PARASOL_NO_BOUNDS). */
  Fixture f;
  fixture_load(&f, "mlp", "layers=2,hidden=256,batch=32", "dgx-a100", 4);
  static const char *const algos[] = { "mcmc", "dp", "beam", "pipeline", "subst" };
  for (gsize i = 0; i < G_N_ELEMENTS(algos); i++) {
    SearchResult *a, *b;
    run_both_ways(algos[i], f.p, 1500, 3, "PARASOL_NO_BOUNDS", "1", &a, &b);
    cr_assert_eq(search_result_get_cut_evals(b), 0);
    search_result_free(a);
    search_result_free(b);
  }
  fixture_free(&f);
}

/* Runs the searches that move one operator at a time (each move evaluated in a delta
 * session) on a GPT over two nodes, so that moves touch tied weights, pipelines'
 * neighbours and links across nodes, without and with @var set to @value, and requires
 * the same time, strategy, number of evaluations and of evaluations cut at a bound. */
static void moves_end_the_same(const char *var, const char *value, gint64 evals, guint64 seed)
{
  Fixture f;
  fixture_load(&f, "gpt", "layers=2,hidden=128,heads=4,seq=32,vocab=256,batch=16", "dgx-a100:2",
               0);
  static const char *const algos[] = { "mcmc", "dp", "beam", "subst" };
  for (gsize i = 0; i < G_N_ELEMENTS(algos); i++) {
    SearchResult *a, *b;
    run_both_ways(algos[i], f.p, evals, seed, var, value, &a, &b);
    cr_assert_eq(search_result_get_cut_evals(a), search_result_get_cut_evals(b), "%s, %s=%s",
                 algos[i], var, value);
    search_result_free(a);
    search_result_free(b);
  }
  fixture_free(&f);
}

Test(search, delta_simulation_changes_no_result)
{
  /* With PARASOL_NO_DELTA every evaluation after a move lowers, assembles and runs the
   * strategy from nothing instead: each search ends where it ends with full simulations. */
  moves_end_the_same("PARASOL_NO_DELTA", "1", 400, 5);
}

Test(search, network_memory_changes_no_result)
{
  /* A delta session's network remembers the rates it worked out (sim/network.c); with
   * PARASOL_NET_MEMORY_MB=0 it solves every time.  Each search ends the same either way,
   * as it does with a memory so small that its halves keep taking turns (1 MiB). */
  moves_end_the_same("PARASOL_NET_MEMORY_MB", "0", 300, 7);
  moves_end_the_same("PARASOL_NET_MEMORY_MB", "1", 300, 7);
}

Test(search, log_has_a_row_per_improvement)
{
  Fixture f;
  fixture_small(&f);
  g_autofree char *dir = g_dir_make_tmp("parasol-search-XXXXXX", NULL);
  g_autofree char *path = g_build_filename(dir, "log.csv", NULL);
  search_register_builtins();
  SearchRunOptions o = search_run_options_default();
  o.eval_budget = 500;
  o.log_path = path;
  SearchResult *r = search_run(search_lookup("mcmc"), f.p, &o, NULL);
  cr_assert_not_null(r);
  g_autofree char *text = NULL;
  cr_assert(g_file_get_contents(path, &text, NULL, NULL));
  g_auto(GStrv) lines = g_strsplit(text, "\n", -1);
  cr_assert_str_eq(lines[0], "wall_s,evals,best_s,current_s");
  int rows = 0;
  for (char **l = lines + 1; *l && **l; l++)
    rows++;
  /* One row per improvement and a last one when the search ends. */
  cr_assert_eq(rows, search_result_n_improvements(r) + 1);
  double last_best = INFINITY;
  for (int i = 0; i < search_result_n_improvements(r); i++) {
    double best;
    search_result_get_improvement(r, i, NULL, NULL, &best);
    cr_assert_lt(best, last_best);
    last_best = best;
  }
  cr_assert_eq(last_best, search_result_get_time(r));
  search_result_free(r);
  g_unlink(path);
  g_rmdir(dir);
  fixture_free(&f);
}

/* An algorithm that is interrupted like a user's Ctrl-C after its first evaluation. */
static gboolean interrupted_run(const SearchAlgorithm *self, SearchContext *ctx, GError **error)
{
  g_autoptr(SimStrategy) s = search_problem_data_parallel(search_context_get_problem(ctx), error);
  search_context_evaluate(ctx, s);
  raise(SIGINT);
  while (!search_context_should_stop(ctx))
    search_context_evaluate(ctx, s);
  return TRUE;
}

Test(search, ctrl_c_keeps_the_best)
{
  static const SearchAlgorithm a = { .api_version = SEARCH_ALGORITHM_API_VERSION,
                                     .name = "interrupted", .description = "test",
                                     .run = interrupted_run };
  Fixture f;
  fixture_small(&f);
  SearchRunOptions o = search_run_options_default();
  o.time_budget = 30;
  o.handle_sigint = TRUE;
  SearchResult *r = search_run(&a, f.p, &o, NULL);
  cr_assert_not_null(r);
  cr_assert(search_result_get_interrupted(r));
  cr_assert_not_null(search_result_get_strategy(r));
  cr_assert_lt(search_result_get_elapsed(r), 30);
  search_result_free(r);
  fixture_free(&f);
}

Test(search, bad_arguments_give_clear_errors)
{
  SearchRunOptions o = search_run_options_default();
  GError *error = NULL;
  cr_assert(search_parse_budget("60s", &o, NULL) && o.time_budget == 60 && o.eval_budget == 0);
  cr_assert(search_parse_budget("5000evals", &o, NULL) && o.eval_budget == 5000);
  cr_assert(search_parse_budget("2m,5k", &o, NULL) && o.time_budget == 120 &&
            o.eval_budget == 5000);
  cr_assert_not(search_parse_budget("soon", &o, &error));
  cr_assert(strstr(error->message, "soon") && strstr(error->message, "60s"), "%s",
            error->message);
  g_clear_error(&error);
  cr_assert_not(search_parse_budget("-3s", &o, &error));
  g_clear_error(&error);

  SearchKinds k;
  cr_assert(search_kinds_parse("data,model", &k, NULL));
  cr_assert_eq(k, SEARCH_KIND_DATA | SEARCH_KIND_PARAMETER | SEARCH_KIND_REDUCTION);
  cr_assert_not(search_kinds_parse("data,magic", &k, &error));
  cr_assert(strstr(error->message, "magic"), "%s", error->message);
  g_clear_error(&error);

  Fixture f;
  fixture_small(&f);
  int devs[2] = { 0, 99 };
  cr_assert_not(search_problem_set_devices(f.p, devs, 2, &error));
  cr_assert(strstr(error->message, "99"), "%s", error->message);
  g_clear_error(&error);

  search_register_builtins();
  o = search_run_options_default();
  o.eval_budget = 10;
  const char *unknown[] = { "temperature=3", NULL };
  o.options = unknown;
  cr_assert_null(search_run(search_lookup("mcmc"), f.p, &o, &error));
  cr_assert(g_error_matches(error, SEARCH_ERROR, SEARCH_ERROR_UNKNOWN));
  cr_assert(strstr(error->message, "temperature") && strstr(error->message, "beta"), "%s",
            error->message);
  g_clear_error(&error);
  const char *malformed[] = { "beta=hot", NULL };
  o.options = malformed;
  cr_assert_null(search_run(search_lookup("mcmc"), f.p, &o, &error));
  cr_assert(strstr(error->message, "beta=hot") && strstr(error->message, "number"), "%s",
            error->message);
  g_clear_error(&error);
  /* Values out of their range (taken before, or clamped without a word). */
  const struct {
    const char *algo, *opt, *want;
  } ranges[] = {
    { "mcmc", "beta=-1", "option beta=-1: expected a number of at least 0.001" },
    { "mcmc", "chains=0", "option chains=0: expected an integer from 1 to 1024" },
    { "mcmc", "propagate=2", "option propagate=2: expected a number from 0 to 1" },
    { "beam", "width=0", "option width=0: expected an integer of at least 1" },
    { "subst", "alpha=0.5", "option alpha=0.5: expected a number of at least 1" },
    { "dp", "polish=2", "option polish=2: expected an integer from 0 to 1" },
  };
  for (size_t i = 0; i < G_N_ELEMENTS(ranges); i++) {
    const char *one[] = { ranges[i].opt, NULL };
    o.options = one;
    cr_assert_null(search_run(search_lookup(ranges[i].algo), f.p, &o, &error), "%s",
                   ranges[i].opt);
    cr_assert(g_error_matches(error, SEARCH_ERROR, SEARCH_ERROR_INVALID));
    cr_assert(strstr(error->message, ranges[i].want), "%s", error->message);
    g_clear_error(&error);
  }
  const char *inner[] = { "inner=nothing", NULL };
  o.options = inner;
  cr_assert_null(search_run(search_lookup("subst"), f.p, &o, &error));
  cr_assert(strstr(error->message, "nothing"), "%s", error->message);
  g_clear_error(&error);
  o.options = NULL;
  o.threads = -1;
  cr_assert_null(search_run(search_lookup("mcmc"), f.p, &o, &error));
  g_clear_error(&error);
  fixture_free(&f);
}

/* ---------------------------------------------------------------------------------- */
/* Substitutions                                                                      */

/* x -> fc1 -> relu -> {q, k, v} (three linears reading one tensor) -> q * k + v -> loss
 * (a product, so that no distribute-linear rewrite competes with merging q, k and v). */
static SimGraph *rewritable_graph(void)
{
  SimGraph *g = sim_graph_new("rewritable");
  int64_t xs[2] = { 64, 512 };
  int x = sim_graph_input(g, "x", SIM_DTYPE_FP16, 2, xs);
  int h = sim_graph_linear(g, "fc1", x, 1024, TRUE, SIM_UNARY_IDENTITY);
  h = sim_graph_unary(g, "relu1", h, SIM_UNARY_RELU);
  int q = sim_graph_linear(g, "q", h, 512, FALSE, SIM_UNARY_IDENTITY);
  int k = sim_graph_linear(g, "k", h, 512, FALSE, SIM_UNARY_IDENTITY);
  int v = sim_graph_linear(g, "v", h, 512, FALSE, SIM_UNARY_IDENTITY);
  int s = sim_graph_binary(g, "qk", q, k, SIM_BINARY_MUL);
  s = sim_graph_binary(g, "qkv", s, v, SIM_BINARY_ADD);
  int64_t ls[1] = { 64 };
  int labels = sim_graph_input(g, "labels", SIM_DTYPE_INT32, 1, ls);
  sim_graph_cross_entropy(g, "loss", s, labels);
  cr_assert(sim_graph_check(g, NULL));
  return g;
}

Test(search, rewrites_apply_and_name_their_operators)
{
  SimGraph *g = rewritable_graph();
  GPtrArray *names = search_rewrites_find(g);
  gboolean fuse = FALSE, merge = FALSE;
  for (guint i = 0; i < names->len; i++) {
    const char *n = g_ptr_array_index(names, i);
    fuse = fuse || !strcmp(n, "fuse-activation:fc1");
    merge = merge || !strcmp(n, "merge-linears:q,k,v");
  }
  cr_assert(fuse && merge, "found %u rewrites", names->len);
  g_ptr_array_unref(names);

  const char *both[] = { "fuse-activation:fc1", "merge-linears:q,k,v", NULL };
  GError *error = NULL;
  SimGraph *r = search_rewrite_graph(g, both, &error);
  cr_assert_not_null(r, "%s", error ? error->message : "");
  /* relu1 folded into fc1; q, k, v became one linear and a split. */
  cr_assert_eq(sim_graph_n_ops(r), sim_graph_n_ops(g) - 1 - 3 + 2);
  cr_assert_lt(sim_graph_op_by_name(r, "relu1"), 0);
  int merged = sim_graph_op_by_name(r, "q+k+v");
  cr_assert_geq(merged, 0);
  SimShape w = sim_graph_op_weight_shape(r, merged, 0);
  cr_assert_eq(sim_shape_numel(&w), 1024 * 1536);
  cr_assert_eq(sim_graph_n_params(r), sim_graph_n_params(g));

  const char *bad[] = { "fuse-activation:q", NULL };
  cr_assert_null(search_rewrite_graph(g, bad, &error));
  cr_assert(strstr(error->message, "'q'"), "%s", error->message);
  g_clear_error(&error);
  sim_graph_free(r);
  sim_graph_free(g);
}

/* Multi-head attention written out op by op, as an exported graph has it. */
static SimGraph *unfused_attention_graph(void)
{
  SimGraph *g = sim_graph_new("unfused-attention");
  const int64_t b = 4, s = 128, d = 256, h = 4, hd = 64;
  int64_t xs[3] = { b, s, d };
  int x = sim_graph_input(g, "x", SIM_DTYPE_FP16, 3, xs);
  int heads[3];
  const char *names[3] = { "q", "k", "v" };
  for (int i = 0; i < 3; i++) {
    int p = sim_graph_linear(g, names[i], x, h * hd, TRUE, SIM_UNARY_IDENTITY);
    int64_t shape[4] = { b, s, h, hd };
    g_autofree char *rn = g_strconcat(names[i], ".heads", NULL);
    g_autofree char *tn = g_strconcat(names[i], ".t", NULL);
    p = sim_graph_reshape(g, rn, p, 4, shape);
    int perm[4] = { 0, 2, 1, 3 };
    heads[i] = sim_graph_transpose(g, tn, p, perm);
  }
  int sc = sim_graph_matmul(g, "scores", heads[0], heads[1], TRUE);
  /* By 1 / sqrt(hd), as the attention operator scales its scores. */
  g_autoptr(SimAttrs) sa = sim_attrs_new(SIM_OP_UNARY);
  cr_assert(sim_attrs_set_string(sa, "kind", "scale", NULL));
  cr_assert(sim_attrs_set_float(sa, "scale", 1.0 / 8, NULL));
  int scale = sim_graph_add_op(g, SIM_OP_UNARY, "scale", 1, &sc, sa, NULL);
  cr_assert_geq(scale, 0);
  sc = sim_graph_softmax(g, "probs", sim_graph_op_output(g, scale, 0));
  int o = sim_graph_matmul(g, "context", sc, heads[2], FALSE);
  int perm[4] = { 0, 2, 1, 3 };
  o = sim_graph_transpose(g, "context.t", o, perm);
  int64_t back[3] = { b, s, h * hd };
  o = sim_graph_reshape(g, "context.merge", o, 3, back);
  o = sim_graph_linear(g, "out", o, d, TRUE, SIM_UNARY_IDENTITY);
  sim_graph_mse_loss(g, "loss", o, x);
  cr_assert(sim_graph_check(g, NULL));
  return g;
}

Test(search, attention_is_fused)
{
  SimGraph *g = unfused_attention_graph();
  GPtrArray *names = search_rewrites_find(g);
  gboolean found = FALSE;
  for (guint i = 0; i < names->len; i++)
    found = found || !strcmp(g_ptr_array_index(names, i), "fuse-attention:probs");
  cr_assert(found);
  g_ptr_array_unref(names);
  GError *error = NULL;
  SimGraph *r = search_rewrite_apply(g, "fuse-attention:probs", &error);
  cr_assert_not_null(r, "%s", error ? error->message : "");
  int att = sim_graph_op_by_name(r, "probs.attention");
  cr_assert_geq(att, 0);
  cr_assert_eq(sim_graph_op_type(r, att), SIM_OP_ATTENTION);
  /* x, attention, loss */
  cr_assert_eq(sim_graph_n_ops(r), 3);
  cr_assert_eq(sim_graph_n_params(r), sim_graph_n_params(g));
  sim_graph_free(r);
  sim_graph_free(g);
}

Test(search, substitutions_are_recorded_and_reproduced, .timeout = 60)
{
  SimGraph *g = rewritable_graph();
  SimMachine *m = sim_machine_load("dgx-a100", NULL);
  SimRooflineParams rp = sim_roofline_params_default();
  SimCostModel *cost = sim_cost_model_new_roofline(&rp);
  SearchProblem *p = search_problem_new(g, m, cost);
  int devs[4] = { 0, 1, 2, 3 };
  cr_assert(search_problem_set_devices(p, devs, 4, NULL));
  /* Under data parallelism one wide linear for q, k and v (200 us) beats three (259 us),
   * so the best strategy carries the merge. */
  const char *opts[] = { "inner=data-parallel", "graphs=6", "alpha=1.5", NULL };
  SearchResult *r = run("subst", p, 3000, 1, 1, opts);
  const SimStrategy *s = search_result_get_strategy(r);
  cr_assert_not_null(s);
  gboolean merged = FALSE;
  for (int i = 0; i < sim_strategy_n_rewrites(s); i++)
    merged = merged || !strcmp(sim_strategy_rewrite(s, i), "merge-linears:q,k,v");
  cr_assert(merged, "%d rewrites", sim_strategy_n_rewrites(s));

  g_autofree char *dir = g_dir_make_tmp("parasol-search-XXXXXX", NULL);
  g_autofree char *path = g_build_filename(dir, "plan.json", NULL);
  GError *error = NULL;
  cr_assert(sim_strategy_save(s, search_result_get_graph(r), path, &error));
  /* What `parasol simulate --strategy` does: rewrite the model as the file says, read
   * the strategy, simulate (search_strategy_load()).  The time is the search's. */
  SimGraph *g2 = NULL;
  g_autoptr(SimStrategy) loaded = search_strategy_load(path, g, m, &g2, &error);
  cr_assert_not_null(loaded, "%s", error ? error->message : "");
  cr_assert_not_null(g2);
  cr_assert_eq(sim_strategy_n_rewrites(loaded), sim_strategy_n_rewrites(s));
  cr_assert_eq(sim_graph_n_ops(g2), sim_graph_n_ops(search_result_get_graph(r)));
  /* Read against the model as given, the file names operators it does not have. */
  cr_assert_null(sim_strategy_load(path, g, m, &error));
  g_clear_error(&error);
  SimOptions so = sim_options_default();
  g_autoptr(SimReport) rep = sim_simulate(g2, m, loaded, cost, &so, &error);
  cr_assert_not_null(rep);
  cr_assert_eq(sim_report_iteration_time(rep), search_result_get_time(r));

  g_unlink(path);
  g_rmdir(dir);
  sim_graph_free(g2);
  search_result_free(r);
  search_problem_unref(p);
  sim_cost_model_free(cost);
  sim_machine_free(m);
  sim_graph_free(g);
}

Test(search, the_expert_yardstick_is_the_same_on_any_number_of_threads)
{
  /* The expert plans are simulated a round at a time, each run stopping once past the best
   * time of the rounds before: the yardstick does not depend on the threads, and it is
   * the one that runs to their ends give (PARASOL_NO_BOUNDS).  Memory is short here (a
   * GPT of 2,048-token sequences, 1,024 a batch, on 8 GPUs): plans get memory savings and
   * micro-batches. */
  Fixture f;
  fixture_load(&f, "gpt", "layers=2,hidden=1024,heads=16,seq=2048,vocab=1024,batch=1024",
               "dgx-a100", 0);
  SearchResult *one = run("expert", f.p, 100000, 1, 1, NULL);
  SearchResult *two = run("expert", f.p, 100000, 1, 2, NULL);
  g_setenv("PARASOL_NO_BOUNDS", "1", TRUE);
  SearchResult *full = run("expert", f.p, 100000, 1, 2, NULL);
  g_unsetenv("PARASOL_NO_BOUNDS");
  double t1 = INFINITY, t2 = INFINITY, tf = INFINITY;
  const SimStrategy *s1 = search_result_get_expert(one, &t1);
  const SimStrategy *s2 = search_result_get_expert(two, &t2);
  const SimStrategy *sf = search_result_get_expert(full, &tf);
  cr_assert(s1 && s2 && sf);
  cr_expect_eq(t1, t2);
  cr_expect_eq(t1, tf);
  cr_expect(sim_strategy_equal(s1, s2));
  cr_expect(sim_strategy_equal(s1, sf));
  /* Some runs stopped early, and the result is the search's best. */
  cr_expect_gt(search_result_get_cut_evals(one), 0);
  cr_expect_eq(search_result_get_time(one), t1);
  search_result_free(one);
  search_result_free(two);
  search_result_free(full);
  fixture_free(&f);
}

Test(search, the_local_search_keeps_what_runs_to_their_ends_keep)
{
  /* dp ends with the local search, whose trials of an operator run as a round on the
   * threads, each stopping once past the plan and the trials before it that are done.
   * The round keeps the first of the fastest, as trying them in turn does, whatever the
   * threads' timing: twice on four threads, the plan is the one that runs to their ends
   * give (PARASOL_NO_BOUNDS).  The GPT's data sources give ties (replicated on 4 or 8
   * devices, the same time), where a trial stopped at a later one's time would lose the
   * first place, and replicated shards, which every trial's evaluator must hold as the
   * plan does. */
  Fixture f;
  fixture_load(&f, "gpt", "layers=2,hidden=256,heads=8,seq=64,vocab=512,batch=32", "dgx-a100",
               0);
  SearchResult *a = run("dp", f.p, 100000, 1, 4, NULL);
  SearchResult *b = run("dp", f.p, 100000, 1, 4, NULL);
  g_setenv("PARASOL_NO_BOUNDS", "1", TRUE);
  SearchResult *full = run("dp", f.p, 100000, 1, 4, NULL);
  g_unsetenv("PARASOL_NO_BOUNDS");
  cr_expect_eq(search_result_get_time(a), search_result_get_time(full));
  cr_expect_eq(search_result_get_time(b), search_result_get_time(full));
  cr_expect(sim_strategy_equal(search_result_get_strategy(a), search_result_get_strategy(full)));
  cr_expect(sim_strategy_equal(search_result_get_strategy(b), search_result_get_strategy(full)));
  cr_expect_eq(search_result_get_evals(a), search_result_get_evals(b));
  cr_expect_gt(search_result_get_cut_evals(a), 0);
  search_result_free(a);
  search_result_free(b);
  search_result_free(full);
  fixture_free(&f);
}

Test(search, megatron_refinement_interleaves_the_expert_pipeline)
{
  /* Megatron 18.4B on 16 A100s of 40 GB with a batch of 64, where its weights, gradients
   * and optimizer states need pipelines: the fastest expert plan is a 1F1B pipeline whose
   * bubble ((stages - 1) / micro-batches of the work) costs more than the extra transfers
   * of interleaving model chunks; the refinement finds an interleaved plan, the same on
   * one thread and two (each round's neighbours are simulated against the same bound),
   * and its time is the report's. */
  Fixture f;
  fixture_load(&f, "megatron-18.4b", "batch=64", "dgx-a100-40gb:2", 0);
  SearchResult *one = run("megatron", f.p, 100000, 1, 1, NULL);
  SearchResult *two = run("megatron", f.p, 100000, 1, 2, NULL);
  double te = INFINITY;
  const SimStrategy *expert = search_result_get_expert(one, &te);
  cr_assert_not_null(expert, "every expert plan was simulated");
  cr_assert_eq(sim_strategy_get_schedule(expert, NULL), SIM_SCHEDULE_1F1B);
  cr_assert_gt(sim_strategy_n_stages(expert), 1);
  const SimStrategy *best = search_result_get_strategy(one);
  double t = search_result_get_time(one);
  int chunks = 0;
  cr_expect_eq(sim_strategy_get_schedule(best, &chunks), SIM_SCHEDULE_INTERLEAVED);
  cr_expect_geq(chunks, 2);
  cr_expect_lt(t, 0.99 * te, "refined %g s, expert %g s", t, te);
  cr_expect_eq(search_result_get_time(two), t);
  cr_expect(sim_strategy_equal(search_result_get_strategy(two), best));
  double ts = search_problem_simulate(f.p, best, NULL, NULL);
  cr_expect_eq(ts, t);
  /* MCMC refines its pipelined expert start the same way, within its budget's share: 300
   * evaluations reach the refined plan. */
  SearchResult *mc = run("mcmc", f.p, 300, 1, 2, NULL);
  cr_expect_leq(search_result_get_time(mc), t, "mcmc %g s, refined %g s",
                search_result_get_time(mc), t);
  search_result_free(mc);
  /* The expert plans are baselines and do not heed the kinds of parallelism allowed;
   * MCMC's start takes a pipelined one (and refines it) only where pipelines are.  With
   * only attribute splits allowed nothing may grow, so a pipelined start would stay. */
  search_problem_set_kinds(f.p, SEARCH_KIND_ATTRIBUTE);
  mc = run("mcmc", f.p, 300, 1, 2, NULL);
  cr_expect_eq(sim_strategy_n_stages(search_result_get_strategy(mc)), 1);
  search_result_free(mc);
  search_result_free(one);
  search_result_free(two);
  fixture_free(&f);
}

Test(search, dp_and_pipeline_start_from_the_refined_expert_pipeline)
{
  /* Unity's dynamic program starts from the better of data parallelism and the expert
   * plan, the pipeline search from the best pipelined expert plan; a pipelined expert plan
   * is refined first, within a quarter of the budget left (a build without that ended
   * these 250-evaluation searches at 1F1B plans at most 0.3% faster than the expert's).
   * On 40 GB A100s the expert plan of Megatron 18.4B is a pipeline (see above). */
  Fixture f;
  fixture_load(&f, "megatron-18.4b", "batch=64", "dgx-a100-40gb:2", 0);
  const char *const algos[] = { "dp", "pipeline" };
  double te = INFINITY;
  for (gsize i = 0; i < G_N_ELEMENTS(algos); i++) {
    SearchResult *r = run(algos[i], f.p, 250, 1, 2, NULL);
    /* The yardstick: the dynamic program simulates every expert plan. */
    if (i == 0) {
      const SimStrategy *expert = search_result_get_expert(r, &te);
      cr_assert_not_null(expert);
      cr_assert_gt(sim_strategy_n_stages(expert), 1);
    }
    cr_expect_gt(sim_strategy_n_stages(search_result_get_strategy(r)), 1, "%s", algos[i]);
    cr_expect_lt(search_result_get_time(r), 0.99 * te, "%s %g s, expert %g s", algos[i],
                 search_result_get_time(r), te);
    search_result_free(r);
  }
  fixture_free(&f);
}

/* An algorithm that never asks whether to stop (as a plugin might) does not hold the
 * search past its budget: past the deadline and a grace period it is left running, and
 * the result is the best plan it had reported. */
static atomic_int stubborn_release;
static atomic_int stubborn_running;

static gboolean stubborn_run(const SearchAlgorithm *self, SearchContext *ctx, GError **error)
{
  atomic_store(&stubborn_running, 1);
  g_autoptr(SimStrategy) s = search_problem_data_parallel(search_context_get_problem(ctx), NULL);
  search_context_evaluate(ctx, s);
  while (!atomic_load(&stubborn_release))
    g_usleep(1000);
  atomic_store(&stubborn_running, 0);
  return TRUE;
}

/* Lets the stubborn algorithm end while this frame's array covers the stack where
 * search_run()'s frame was, and says whether the array came through untouched: an
 * algorithm left running must not write into the frame of a call that has returned. */
static __attribute__((noinline)) gboolean release_over_a_stack_pattern(void)
{
  volatile unsigned char pattern[32768];
  for (size_t i = 0; i < sizeof pattern; i++)
    pattern[i] = (unsigned char)(i * 131 + 7);
  atomic_store(&stubborn_release, 1);
  while (atomic_load(&stubborn_running))
    g_usleep(1000);
  g_usleep(50000);
  for (size_t i = 0; i < sizeof pattern; i++)
    if (pattern[i] != (unsigned char)(i * 131 + 7))
      return FALSE;
  return TRUE;
}

Test(search, an_algorithm_that_never_stops_is_left_at_the_deadline, .timeout = 60)
{
  Fixture f;
  fixture_small(&f);
  static const SearchAlgorithm stubborn = { .api_version = SEARCH_ALGORITHM_API_VERSION,
                                            .name = "stubborn", .description = "d",
                                            .run = stubborn_run };
  SearchRunOptions o = search_run_options_default();
  o.time_budget = 0.2;
  GError *error = NULL;
  SearchResult *r = search_run(&stubborn, f.p, &o, &error);
  cr_assert_not_null(r, "%s", error ? error->message : "");
  cr_assert(search_result_get_abandoned(r));
  cr_assert(atomic_load(&stubborn_running));
  /* Counted as left running (so a caller keeps its problem) until it returns. */
  cr_expect_eq(search_algorithms_left_running(), 1);
  g_autoptr(SimStrategy) dp = search_problem_data_parallel(f.p, NULL);
  cr_assert_not_null(search_result_get_strategy(r));
  cr_assert(sim_strategy_equal(search_result_get_strategy(r), dp));
  cr_assert_eq(search_result_get_time(r), search_problem_simulate(f.p, dp, NULL, NULL));
  search_result_free(r);
  /* Let it end before its problem goes, without touching the stack it was started from. */
  cr_expect(release_over_a_stack_pattern(),
            "the algorithm left running wrote into search_run()'s returned frame");
  cr_expect_eq(search_algorithms_left_running(), 0);
  fixture_free(&f);
}

/* A budget in seconds stops the simulation under way at the deadline: on GPT-3 175B over
 * 1,024 A100 a single simulation takes seconds, and a search of 0.3 s returns with what it
 * had, cancelled (or left behind), not after the simulation; it says how many of the
 * expert plans it simulated. */
Test(search, a_simulation_under_way_at_the_deadline_is_cancelled, .timeout = 120)
{
  Fixture f;
  search_register_builtins();
  fixture_load(&f, "gpt3-175b", "vocab=51200", "dgx-a100:128", 0);
  SearchRunOptions o = search_run_options_default();
  o.time_budget = 0.3;
  GError *error = NULL;
  gint64 t0 = g_get_monotonic_time();
  SearchResult *r = search_run(search_lookup("expert"), f.p, &o, &error);
  double wall = (double)(g_get_monotonic_time() - t0) / 1e6;
  cr_assert_not_null(r, "%s", error ? error->message : "");
  /* Not a timing assertion: a single simulation of this problem takes 5 to 15 s. */
  cr_assert_lt(wall, 5.0, "%.2f s", wall);
  int plans = 0;
  int simulated = search_result_get_expert_progress(r, &plans);
  cr_assert_gt(plans, 10, "%d plans, %d simulated, abandoned %d, %g s", plans, simulated,
               search_result_get_abandoned(r), wall);
  cr_assert_lt(simulated, plans);
  search_result_free(r);
  fixture_free(&f);
}

/* The library keeps a time budget by itself (no deadline from a caller, as a script that
 * links it gives none): every built-in algorithm on GPT with 1.7 B parameters over 32
 * A100, whose searches run far past one second, returns from search_run() within the
 * second plus 5% and a generous allowance for the grace an algorithm gets to return. */
Test(search, the_library_keeps_a_time_budget_for_every_algorithm, .timeout = 240)
{
  Fixture f;
  search_register_builtins();
  fixture_load(&f, "megatron-1.7b", "", "dgx-a100:4", 0);
  const double budget = 1.0, slack = 1.5;
  int checked = 0;
  for (int i = 0; i < search_n_algorithms(); i++) {
    const SearchAlgorithm *a = search_algorithm_get(i);
    if (!strcmp(a->name, "exhaustive") || !strcmp(a->name, "ve"))
      continue; /* they refuse problems this large at once */
    SearchRunOptions o = search_run_options_default();
    o.time_budget = budget;
    GError *error = NULL;
    gint64 t0 = g_get_monotonic_time();
    SearchResult *r = search_run(a, f.p, &o, &error);
    double wall = (double)(g_get_monotonic_time() - t0) / 1e6;
    cr_expect_lt(wall, budget * 1.05 + slack, "%s: %.2f s for a budget of %.0f s", a->name,
                 wall, budget);
    if (r)
      search_result_free(r);
    g_clear_error(&error);
    checked++;
  }
  cr_expect_geq(checked, 8, "%d algorithms", checked);
  fixture_free(&f);
}

/* The tensor-parallel overlap of sequence parallelism as a knob: a plan with sequence
 * parallelism has among its knob neighbours (what MCMC's knob moves and the refinement
 * try) exactly one that changes only the overlap; a plan without sequence parallelism
 * none that turns it on; and the options read back from a plan built with it have it. */
Test(search, knob_neighbours_toggle_the_tensor_parallel_overlap)
{
  Fixture f;
  fixture_load(&f, "llama", "layers=4,hidden=256,heads=4,kv_heads=2,ffn=512,seq=64,vocab=512,"
                            "batch=16", "dgx-a100", 8);
  SimMegatronOptions o = sim_megatron_options_default();
  o.tp = 2;
  o.pp = 2;
  o.dp = 2;
  o.microbatch_size = 1;
  o.microbatches = 8;
  for (int sp = 0; sp < 2; sp++) {
    o.sequence_parallel = sp;
    SimMegatronOptions cand[SEARCH_KNOB_MAX];
    int n = search_megatron_knob_neighbours(f.p, &o, cand), toggles = 0;
    for (int i = 0; i < n; i++) {
      SimMegatronOptions v = cand[i];
      if (!v.tp_comm_overlap)
        continue;
      cr_expect(v.sequence_parallel, "overlap without sequence parallelism");
      toggles += v.tp == o.tp && v.pp == o.pp && v.dp == o.dp && v.cp == o.cp &&
                 v.ep == o.ep && v.microbatches == o.microbatches &&
                 v.microbatch_size == o.microbatch_size && v.schedule == o.schedule &&
                 v.chunks == o.chunks && v.sequence_parallel == o.sequence_parallel &&
                 v.memory.recompute == o.memory.recompute && v.memory.zero1 == o.memory.zero1 &&
                 v.memory.zero2 == o.memory.zero2 && v.memory.zero3 == o.memory.zero3;
    }
    cr_expect_eq(toggles, sp, "sequence parallel %d: %d neighbours that only overlap", sp,
                 toggles);
  }
  o.tp_comm_overlap = TRUE;
  g_autoptr(SimStrategy) s = search_megatron_plan(f.p, &o);
  cr_assert_not_null(s);
  SimMegatronOptions back;
  cr_assert(search_megatron_options_of(f.p, s, &back));
  cr_expect(back.sequence_parallel && back.tp_comm_overlap);
  fixture_free(&f);
}

/* The experts' own tensor-parallel degree is a knob: a mixture of 4 experts under tp 2,
 * dp 4, ep 2 has exactly one neighbour that only holds each expert whole on a GPU (etp 1:
 * expert groups of 2 x 1 GPUs, the two ranks of a replica), and that plan exactly one that
 * splits them like the rest again; its summary says "EP 2, ETP 1" and its options are read
 * back from the plan built. */
Test(search, knob_neighbours_toggle_the_experts_tensor_parallelism)
{
  Fixture f;
  fixture_load(&f, "moe", "layers=2,hidden=64,heads=4,kv_heads=2,experts=4,top_k=2,"
                          "expert_ffn=32,seq=16,vocab=128,batch=8", "dgx-a100", 8);
  SimMegatronOptions o = sim_megatron_options_default();
  o.tp = 2;
  o.dp = 4;
  o.ep = 2;
  o.sequence_parallel = TRUE;
  o.microbatch_size = 1;
  o.microbatches = 2;
  for (int own = 0; own < 2; own++) {
    o.etp = own ? 1 : 0;
    SimMegatronOptions cand[SEARCH_KNOB_MAX];
    int n = search_megatron_knob_neighbours(f.p, &o, cand), toggles = 0;
    for (int i = 0; i < n; i++) {
      const SimMegatronOptions *v = &cand[i];
      toggles += v->etp == (own ? 0 : 1) && v->tp == o.tp && v->pp == o.pp && v->dp == o.dp &&
                 v->ep == o.ep && v->cp == o.cp && v->microbatches == o.microbatches &&
                 v->sequence_parallel == o.sequence_parallel &&
                 v->memory.recompute == o.memory.recompute && v->memory.zero1 == o.memory.zero1;
    }
    cr_expect_eq(toggles, 1, "etp %d: %d neighbours that only change it", o.etp, toggles);
  }
  g_autoptr(SimStrategy) s = search_megatron_plan(f.p, &o);
  cr_assert_not_null(s);
  SearchPlanSummary sum;
  search_plan_summarize(f.g, s, &sum);
  g_autofree char *text = search_plan_summary_text(&sum);
  cr_expect(strstr(text, "TP 2, PP 1, DP 4, EP 2, ETP 1, ") != NULL, "%s", text);
  SimMegatronOptions back;
  cr_assert(search_megatron_options_of(f.p, s, &back));
  cr_expect_eq(back.ep, 2);
  cr_expect_eq(back.etp, 1);
  fixture_free(&f);
}

/* The optimizer offloaded to the host is a knob where it matters: LLaMA-2 7B in 8
 * data-parallel replicas without ZeRO holds 16 bytes a parameter (108 GB a GPU), which an
 * 80 GB A100 cannot hold, so its knob neighbours (MCMC's knob moves, the refinement)
 * include exactly one that only offloads the optimizer; with ZeRO-1 the same plan fits
 * and has none; and a plan with the optimizer offloaded has exactly one that only brings
 * it back. */
Test(search, knob_neighbours_offload_the_optimizer_where_it_does_not_fit)
{
  Fixture f;
  fixture_load(&f, "llama2-7b", "batch=16", "dgx-a100", 8);
  SimMegatronOptions o = sim_megatron_options_default();
  o.dp = 8;
  o.microbatch_size = 1;
  o.microbatches = 2;
  o.memory.recompute = SIM_RECOMPUTE_FULL;
  const struct {
    gboolean zero1;
    double offload;
    int toggles;
  } cases[] = { { FALSE, 0, 1 }, { TRUE, 0, 0 }, { TRUE, 1, 1 } };
  for (size_t k = 0; k < G_N_ELEMENTS(cases); k++) {
    o.memory.zero1 = cases[k].zero1;
    o.memory.offload = cases[k].offload;
    SimMegatronOptions cand[SEARCH_KNOB_MAX];
    int n = search_megatron_knob_neighbours(f.p, &o, cand), toggles = 0;
    for (int i = 0; i < n; i++) {
      SimMegatronOptions v = cand[i];
      if (v.memory.offload == o.memory.offload)
        continue;
      cr_expect_eq(v.memory.offload, o.memory.offload > 0 ? 0 : 1);
      toggles += v.tp == o.tp && v.pp == o.pp && v.dp == o.dp && v.cp == o.cp &&
                 v.ep == o.ep && v.microbatches == o.microbatches &&
                 v.microbatch_size == o.microbatch_size &&
                 v.memory.recompute == o.memory.recompute && v.memory.zero1 == o.memory.zero1 &&
                 v.memory.zero3 == o.memory.zero3;
    }
    cr_expect_eq(toggles, cases[k].toggles, "ZeRO-1 %d, offload %g: %d neighbours that only "
                 "move the optimizer", cases[k].zero1, cases[k].offload, toggles);
  }
  /* Read back from the plan built with it. */
  g_autoptr(SimStrategy) s = search_megatron_plan(f.p, &o);
  cr_assert_not_null(s);
  SimMegatronOptions back;
  cr_assert(search_megatron_options_of(f.p, s, &back));
  cr_expect_eq(back.memory.offload, 1);
  fixture_free(&f);
}

Test(search, megatron_estimate_ranks_by_its_closed_form)
{
  /* GPT-3 175B's shape is not needed for the estimate's terms: Megatron 18.4B on 16 A100s
   * with a batch of 64.  More model chunks per stage shrink the pipeline bubble,
   * compute (p - 1) / (v m), by a closed-form amount; the interleaved schedule's warm-up
   * holds more activations; sequence parallelism divides activations and element-wise
   * work by the tensor-parallel degree; the plans search_estimated_plans() ranks first
   * come in the estimate's order, those expected to fit first. */
  Fixture f;
  fixture_load(&f, "megatron-18.4b", "batch=64", "dgx-a100:2", 0);
  SimMegatronOptions o = sim_megatron_options_default();
  o.tp = 2;
  o.pp = 4;
  o.dp = 2;
  o.microbatch_size = 1;
  o.microbatches = 32;
  gboolean fit1, fit2, fit4;
  double t1 = search_megatron_estimate(f.p, &o, &fit1);
  SimMegatronOptions v2 = o, v4 = o;
  v2.schedule = v4.schedule = SIM_SCHEDULE_INTERLEAVED;
  v2.chunks = 2;
  v4.chunks = 4;
  double t2 = search_megatron_estimate(f.p, &v2, &fit2);
  double t4 = search_megatron_estimate(f.p, &v4, &fit4);
  cr_assert(isfinite(t1) && t1 > 0);
  /* t(v) = A + C (p - 1) / (v m) + 2 (v p - 1) X: the bubble of the compute C and the
   * transfers X on the fill and drain path, nothing else depending on v.  Two
   * differences give C and X; the third (v 8) must follow. */
  double a = 3.0 / 64, b = 3.0 / 128;
  double C = (2 * (t1 - t2) - (t2 - t4)) / (2 * a - b);
  double X = (C * a - (t1 - t2)) / 8;
  cr_expect_gt(C, 0, "v 1: %g s, v 2: %g s, v 4: %g s", t1, t2, t4);
  cr_expect_gt(X, 0);
  SimMegatronOptions v8 = v4;
  v8.chunks = 8;
  double t8 = search_megatron_estimate(f.p, &v8, NULL);
  double want = t1 - C * (3.0 / 32 - 3.0 / 256) + 56 * X;
  cr_expect(fabs(t8 - want) <= 1e-9 * t1, "v 8: %.12g s, closed form %.12g s", t8, want);
  /* Sequence parallelism: faster (element-wise work split) and never more memory. */
  SimMegatronOptions sp = v4;
  sp.sequence_parallel = TRUE;
  gboolean fit_sp;
  cr_expect_lt(search_megatron_estimate(f.p, &sp, &fit_sp), t4);
  cr_expect(fit_sp || !fit4);
  /* ZeRO-1 divides the optimizer step among the replicas. */
  SimMegatronOptions z = sp;
  z.memory.zero1 = TRUE;
  gboolean fit_z;
  cr_expect_lt(search_megatron_estimate(f.p, &z, &fit_z), search_megatron_estimate(f.p, &sp, NULL));
  cr_expect(fit_z || !fit_sp);
  /* The ranked plans: those expected to fit first, each group by its time. */
  SimMegatronOptions best[16];
  int n = search_estimated_plans(f.p, 16, best);
  cr_assert_gt(n, 1);
  double prev = 0;
  gboolean prev_fit = TRUE;
  for (int k = 0; k < n; k++) {
    gboolean fk;
    double tk = search_megatron_estimate(f.p, &best[k], &fk);
    cr_expect(prev_fit || !fk, "plan %d expected to fit after one that is not", k);
    if (fk == prev_fit)
      cr_expect_geq(tk, prev, "plan %d: %g s after %g s", k, tk, prev);
    prev = tk;
    prev_fit = fk;
    cr_expect_eq(best[k].tp * best[k].pp * best[k].dp, 16);
    cr_expect_eq((int64_t)best[k].microbatches * best[k].microbatch_size * best[k].dp, 64);
  }
  fixture_free(&f);
}

/* The tensor-parallel overlap in the estimate (search/plan-estimate.c): with sequence
 * parallelism, turning tp_comm_overlap on saves, per layer and micro-batch of a stage, in
 * each pass (forward, backward, and the recomputation's forward under full
 * recomputation) the sum over its four half all-reduces (q = (t - 1) / t b s h 2 / NVLink
 * each) of min(q, k g), k 1, 3, 4 and 4 GEMMs of h^2 parameters of g = 2 b s h^2 / (t
 * peak e) each, e = 0.6 rows / (rows + 500,000), rows b s h / t; h = sqrt(P / (12 L)).
 * Megatron 18.4B on 16 A100s at TP 4 and TP 8, without and with full recomputation;
 * nothing else in the estimate changes. */
Test(search, megatron_estimate_saves_what_the_tensor_parallel_overlap_hides)
{
  Fixture f;
  fixture_load(&f, "megatron-18.4b", "batch=64", "dgx-a100:2", 0);
  double P = (double)sim_graph_n_params(f.g), L = 0;
  for (int op = 0; op < sim_graph_n_ops(f.g); op++)
    L += sim_graph_op_is_checkpoint(f.g, op);
  double s = (double)sim_graph_tokens_per_sample(f.g), h = sqrt(P / (12 * L));
  const SimDeviceSpec *dev = sim_machine_device_spec(f.m, f.p->devices[0]);
  double peak = dev->peak_flops[SIM_DTYPE_FP16];
  int nl = 0;
  const int *links = sim_machine_route(f.m, f.p->devices[0], f.p->devices[1], &nl);
  double nvlink = INFINITY;
  for (int i = 0; i < nl; i++)
    nvlink = fmin(nvlink, sim_machine_link_bandwidth(f.m, links[i]));
  for (int k = 0; k < 4; k++) {
    SimMegatronOptions o = sim_megatron_options_default();
    o.tp = k % 2 ? 8 : 4;
    o.pp = 2;
    o.dp = 16 / (o.tp * o.pp);
    o.microbatch_size = 1;
    o.microbatches = 64 / o.dp;
    o.sequence_parallel = TRUE;
    o.memory.recompute = k < 2 ? SIM_RECOMPUTE_NONE : SIM_RECOMPUTE_FULL;
    SimMegatronOptions ov = o;
    ov.tp_comm_overlap = TRUE;
    gboolean fit_o, fit_ov;
    double without = search_megatron_estimate(f.p, &o, &fit_o);
    double with = search_megatron_estimate(f.p, &ov, &fit_ov);
    double t = o.tp, b = 1, rows = b * s * h / t;
    double eff = 0.6 * rows / (rows + 0.5e6);
    double q = (t - 1) / t * b * s * h * 2 / nvlink;
    double g = 2 * b * s * h * h / t / (peak * eff);
    double hidden = fmin(q, g) + fmin(q, 3 * g) + 2 * fmin(q, 4 * g);
    double want = o.microbatches * (L / o.pp) * (k < 2 ? 2 : 3) * hidden;
    cr_assert_gt(want, 0);
    cr_expect(fabs((without - with) - want) <= 1e-9 * without,
              "TP %d, recompute %d: %.12g s without, %.12g s with the overlap; saved %.12g s, "
              "closed form %.12g s", o.tp, (int)o.memory.recompute, without, with,
              without - with, want);
    cr_expect_eq(fit_o, fit_ov, "the overlap changes no memory");
  }
  fixture_free(&f);
}

/* ---------------------------------------------------------------------------------- */
/* Yardsticks and the plan kept                                                       */

Test(search, a_result_keeps_the_faster_yardstick_when_it_gives_way, .timeout = 300)
{
  /* Three evaluations leave beam far from the expert plan on GPT-3 1.3B over two DGX
   * A100s, where data parallelism does not fit in memory. */
  Fixture f;
  fixture_load(&f, "gpt3-1.3b", NULL, "dgx-a100:2", 0);
  SearchResult *r = run("beam", f.p, 3, 1, 1, NULL);
  cr_assert_null(search_result_get_yardsticks(r));
  const SearchProblem *bp = NULL;
  double t = 0;
  cr_assert_eq(search_result_get_kept(r, &bp, &t), search_result_get_strategy(r));
  cr_assert_eq(t, search_result_get_time(r));
  cr_assert(search_algorithm_gives_way(search_lookup("beam"), f.p));
  cr_assert_not(search_algorithm_gives_way(search_lookup("expert"), f.p));
  cr_assert_not(search_algorithm_gives_way(search_lookup("data-parallel"), f.p));

  SearchRunOptions o = search_run_options_default();
  o.threads = 1;
  const SearchYardsticks *y = search_result_measure(r, f.p, &o, 0, TRUE);
  cr_assert_eq(y, search_result_get_yardsticks(r));
  cr_assert(y->data_parallel_done && !y->data_parallel_fits);
  /* Its weights and gradients fit (2.6 GB of 80): its activations do not. */
  cr_assert_not(y->data_parallel_bound);
  cr_assert(y->expert_complete && y->expert_plans > 0);
  cr_assert_eq(y->expert_simulated, y->expert_plans);
  cr_assert_not(y->expert_is_dp);
  cr_assert_eq(y->search_time, search_result_get_time(r));
  cr_assert_lt(y->expert, y->search_time);
  cr_assert_str_eq(y->kept, "expert");
  const SimStrategy *kept = search_result_get_kept(r, &bp, &t);
  cr_assert_neq(kept, search_result_get_strategy(r));
  cr_assert_eq(bp, f.p);
  cr_assert_eq(t, y->expert);
  /* The plan kept is the one timed. */
  cr_assert_eq(search_problem_simulate(f.p, kept, NULL, NULL), y->expert);

  /* Without giving way, the search's own plan is kept, with the same yardsticks. */
  double expert = y->expert;
  y = search_result_measure(r, f.p, &o, 0, FALSE);
  cr_assert_str_eq(y->kept, "search");
  cr_assert_eq(y->expert, expert);
  cr_assert_eq(search_result_get_kept(r, NULL, NULL), search_result_get_strategy(r));
  search_result_free(r);
  fixture_free(&f);
}

/* A model whose 16-bit weights and gradients alone exceed a GPU's memory (eight layers of
 * h 16,384: 25.8 B parameters, 103 GB against 80) cannot fit data-parallel: the yardsticks
 * say so (the expert plans are simulated before it) and, with no deadline, still simulate
 * it, to the time a search of its own predicts. */
Test(search, data_parallelism_that_cannot_fit_is_measured_after_the_expert_plans,
     .timeout = 300)
{
  Fixture f;
  fixture_load(&f, "gpt", "layers=8,hidden=16384,heads=128,seq=256,vocab=1024,batch=64",
               "dgx-a100", 0);
  SearchResult *r = run("beam", f.p, 2, 1, 1, NULL);
  SearchRunOptions o = search_run_options_default();
  o.threads = 1;
  const SearchYardsticks *y = search_result_measure(r, f.p, &o, 0, FALSE);
  cr_assert(y->data_parallel_bound);
  cr_assert(y->data_parallel_done && !y->data_parallel_fits);
  cr_assert(y->expert_complete && y->expert_plans > 0);
  cr_assert_not(y->expert_is_dp);
  double t = 0;
  gboolean fits = TRUE;
  cr_assert(search_problem_measure_data_parallel(f.p, 0, &t, &fits));
  cr_assert_eq(t, y->data_parallel);
  cr_assert_not(fits);
  search_result_free(r);
  fixture_free(&f);
}

Test(search, the_largest_micro_batch_that_fits_is_found, .timeout = 300)
{
  /* 128 sequences of 2,048 tokens a GPU in one micro-batch need about 100 GiB of the 80;
   * in two of 64 they need about 50 (tests/test-cli.c says the same of the command). */
  Fixture f;
  fixture_load(&f, "gpt", "layers=2,hidden=1024,heads=16,seq=2048,vocab=1024,batch=1024",
               "dgx-a100:1", 0);
  SimMegatronOptions mo = sim_megatron_options_default();
  mo.dp = sim_machine_n_devices(f.m);
  mo.microbatches = 1;
  SimOptions so = sim_options_default();
  g_autoptr(SimStrategy) whole = sim_strategy_megatron(f.g, f.m, &mo, NULL);
  cr_assert_not_null(whole);
  g_autoptr(SimReport) rw = sim_simulate(f.g, f.m, whole, f.cost, &so, NULL);
  cr_assert_not_null(rw);
  cr_assert_not(sim_report_fits(rw));
  g_autoptr(SimReport) rk = NULL;
  int64_t k = 0;
  g_autoptr(SimStrategy) s = sim_strategy_megatron_fit(f.g, f.m, &mo, f.cost, &so, &rk, &k);
  cr_assert_not_null(s);
  cr_assert_eq(k, 64);
  cr_assert(sim_report_fits(rk));
  cr_assert_eq(sim_strategy_get_microbatches(s), 2);
  /* The same as the plan with that size given. */
  mo.microbatches = 0;
  mo.microbatch_size = 64;
  g_autoptr(SimStrategy) by_hand = sim_strategy_megatron(f.g, f.m, &mo, NULL);
  g_autoptr(SimReport) rh = sim_simulate(f.g, f.m, by_hand, f.cost, &so, NULL);
  cr_assert_eq(sim_report_iteration_time(rh), sim_report_iteration_time(rk));
  fixture_free(&f);
}

/* ---------------------------------------------------------------------------------- */
/* Context and expert parallelism against Megatron's knob space enumerated              */

typedef struct {
  double best;              /* the fastest plan that fits                                */
  double with, without;     /* the fastest with the knob above 1, and with it at 1       */
  SimMegatronOptions at;    /* the fastest plan's options                                 */
  int plans;                /* plans simulated                                           */
} Space;

/* Simulates every plan of Megatron's knob space on @f's devices: tensor-, context-,
 * pipeline-, data- and expert-parallel degrees (powers of two whose product is the device
 * count; context parallelism with @cp, expert parallelism with @ep), sequence
 * parallelism, recomputation (none or full), ZeRO (none, 1 or 3), and one micro-batch of
 * the replica's batch or micro-batches of one sample.  The knob is cp with @cp, else ep. */
static Space enumerate_megatron(Fixture *f, gboolean cp, gboolean ep)
{
  int n = sim_machine_n_devices(f->m);
  int64_t batch = sim_graph_batch_size(f->g);
  Space sp = { INFINITY, INFINITY, INFINITY, { 0 }, 0 };
  SimOptions so = sim_options_default();
  for (int tp = 1; tp <= n; tp *= 2)
    for (int c = 1; c <= (cp ? n / tp : 1); c *= 2)
      for (int pp = 1; pp <= n / (tp * c); pp *= 2)
        for (int e = 1; e <= (ep ? n : 1); e *= 2) {
          int dp = n / (tp * c * pp);
          if (dp * tp * c * pp != n || dp % e != 0 || batch % dp != 0)
            continue;
          int64_t sizes[2] = { batch / dp, 1 };
          for (int k = 0; k < (sizes[0] == 1 ? 1 : 2); k++)
            for (int seq = 0; seq < (tp > 1 ? 2 : 1); seq++)
              for (int rc = 0; rc < 2; rc++)
                for (int z = 0; z < 3; z++) {
                  SimMegatronOptions o = sim_megatron_options_default();
                  o.tp = tp;
                  o.cp = c;
                  o.pp = pp;
                  o.dp = dp;
                  o.ep = e;
                  o.microbatch_size = sizes[k];
                  o.sequence_parallel = seq;
                  o.memory.recompute = rc ? SIM_RECOMPUTE_FULL : SIM_RECOMPUTE_NONE;
                  o.memory.zero1 = z > 0;
                  o.memory.zero2 = o.memory.zero3 = z > 1;
                  g_autoptr(SimStrategy) s = sim_strategy_megatron(f->g, f->m, &o, NULL);
                  if (!s)
                    continue;
                  g_autoptr(SimReport) r = sim_simulate(f->g, f->m, s, f->cost, &so, NULL);
                  sp.plans++;
                  if (!r || !sim_report_fits(r))
                    continue;
                  double t = sim_report_iteration_time(r);
                  int knob = cp ? c : e;
                  if (t < sp.best) {
                    sp.best = t;
                    sp.at = o;
                  }
                  if (knob > 1)
                    sp.with = MIN(sp.with, t);
                  else
                    sp.without = MIN(sp.without, t);
                }
        }
  return sp;
}

/* LLaMA blocks over sequences of 32,768 tokens, 2 of them, on 8 H100: the batch gives at
 * most 2 data-parallel replicas and the 2 key-value heads at most 2 tensor-parallel
 * ranks, so every other plan leaves GPUs idle or pipelines 2 micro-batches over stages.
 * Context parallelism wins there (the enumeration says so); the expert plans take it
 * (search_long_context() in search/expert.c), the Megatron refinement and MCMC's knob
 * moves trade its degree against the others, and the plans they return use it and beat
 * every plan without it; the refinement's is the enumeration's best. */
Test(search, searches_take_context_parallelism_on_a_long_sequence, .timeout = 300)
{
  Fixture f;
  fixture_load(&f, "llama", "layers=4,hidden=1024,heads=8,kv_heads=2,ffn=2816,seq=32768,"
                            "vocab=32000,batch=2", "dgx-h100", 0);
  Space sp = enumerate_megatron(&f, TRUE, FALSE);
  cr_assert(isfinite(sp.with) && isfinite(sp.without), "%d plans", sp.plans);
  cr_assert_lt(sp.with, sp.without, "with cp %g s, without %g s", sp.with, sp.without);
  cr_assert_gt(sp.at.cp, 1);
  static const char *const algos[] = { "expert", "megatron", "mcmc" };
  for (size_t i = 0; i < G_N_ELEMENTS(algos); i++) {
    SearchResult *r = run(algos[i], f.p, 300, 1, 2, NULL);
    SearchPlanSummary sum;
    search_plan_summarize(search_result_get_graph(r), search_result_get_strategy(r), &sum);
    double t = search_result_get_time(r);
    if (g_getenv("SEARCH_TEST_VERBOSE"))
      g_printerr("%s: %.6g s (cp %d, tp %d, dp %d); enumerated best %.6g s (tp %d cp %d pp "
                 "%d dp %d), without cp %.6g s, %d plans\n", algos[i], t, sum.cp, sum.tp,
                 sum.dp, sp.best, sp.at.tp, sp.at.cp, sp.at.pp, sp.at.dp, sp.without,
                 sp.plans);
    cr_expect_gt(sum.cp, 1, "%s returns context parallelism", algos[i]);
    /* The expert plans are Megatron's rules (no ZeRO, no sequence parallelism): they only
     * take the knob.  The searches past them beat every plan without it, and the
     * refinement reaches the enumeration's best (or passes it: it also moves the
     * gradient buckets). */
    if (i > 0)
      cr_expect_lt(t, sp.without, "%s: %g s, the best plan without cp %g s", algos[i], t,
                   sp.without);
    if (i == 1)
      cr_expect_leq(t, sp.best * (1 + 1e-9), "%s: %g s, enumerated %g s", algos[i], t,
                    sp.best);
    search_result_free(r);
  }
  fixture_free(&f);
}

/* A mixture of 8 large experts (2 layers, hidden 4,096, expert width 14,336) over 8 H100
 * with a batch of 8 sequences: each replica holding every expert spends its time
 * synchronizing their gradients, which expert parallelism keeps to the replicas holding
 * each expert.  The enumeration says expert parallelism wins (with ZeRO-1); the expert
 * plans include it (widest_ep() in search/expert.c), the refinement and MCMC step the ZeRO
 * stage and the expert-parallel degree (and trade tensor for expert and data parallelism),
 * and the plans they return use it and beat every plan without it; the refinement's is
 * the enumeration's best. */
Test(search, searches_take_expert_parallelism_on_a_mixture_of_experts, .timeout = 300)
{
  Fixture f;
  fixture_load(&f, "moe", "layers=2,hidden=4096,heads=32,kv_heads=8,experts=8,top_k=2,"
                          "expert_ffn=14336,seq=2048,vocab=32000,batch=8", "dgx-h100", 0);
  Space sp = enumerate_megatron(&f, FALSE, TRUE);
  cr_assert(isfinite(sp.with) && isfinite(sp.without), "%d plans", sp.plans);
  cr_assert_lt(sp.with, sp.without, "with ep %g s, without %g s", sp.with, sp.without);
  cr_assert_gt(sp.at.ep, 1);
  static const char *const algos[] = { "expert", "megatron", "mcmc" };
  for (size_t i = 0; i < G_N_ELEMENTS(algos); i++) {
    /* MCMC's knob moves are a twentieth of its proposals, and from the expert plans'
     * start (TP 2, EP 4 without ZeRO) it takes the ZeRO stage's step and the trade of
     * tensor for expert and data parallelism: twice the others' evaluations. */
    SearchResult *r = run(algos[i], f.p, i == 2 ? 600 : 300, 1, 2, NULL);
    SearchPlanSummary sum;
    search_plan_summarize(search_result_get_graph(r), search_result_get_strategy(r), &sum);
    double t = search_result_get_time(r);
    if (g_getenv("SEARCH_TEST_VERBOSE"))
      g_printerr("%s: %.6g s (ep %d, tp %d, dp %d, zero %d); enumerated best %.6g s (tp %d "
                 "pp %d dp %d ep %d zero %d), without ep %.6g s, %d plans\n", algos[i], t,
                 sum.ep, sum.tp, sum.dp, sum.zero, sp.best, sp.at.tp, sp.at.pp, sp.at.dp,
                 sp.at.ep, sp.at.memory.zero3 ? 3 : sp.at.memory.zero1, sp.without, sp.plans);
    cr_expect_gt(sum.ep, 1, "%s returns expert parallelism", algos[i]);
    /* The expert plans are Megatron's rules (no ZeRO, no sequence parallelism): they only
     * take the knob.  The searches past them beat every plan without it, and the
     * refinement reaches the enumeration's best (or passes it: it also moves the
     * gradient buckets). */
    if (i > 0)
      cr_expect_lt(t, sp.without, "%s: %g s, the best plan without ep %g s", algos[i], t,
                   sp.without);
    if (i == 1)
      cr_expect_leq(t, sp.best * (1 + 1e-9), "%s: %g s, enumerated %g s", algos[i], t,
                    sp.best);
    search_result_free(r);
  }
  fixture_free(&f);
}

/* ---------------------------------------------------------------------------------- */
/* Mixtures of experts in the estimate and the expert rules                             */

/* The estimate's expert terms (search/plan-estimate.c) in closed form for a small mixture
 * (2 layers of 8 experts of width f 2,048 over h 1,024, top 2, 1,024 tokens a sample) on
 * the 8 GPUs of a DGX H100 at tp 2, dp 4, 4 micro-batches of 1: the rows of an expert's
 * GEMM on a GPU x = ep e b s k / (t E), the bytes a GPU sends in an all-to-all b s k h 2
 * (ep - 1) / (ep t) (4 a layer and micro-batch over NVLink: the groups stay in the node),
 * the experts' GEMM work F_e / (N peak e(x f / (4 e))), and their weights, gradients and
 * states 16 P_e / (ep e) bytes a GPU, ZeRO-1 dividing the 12 of states by the d t / (ep e)
 * expert-data-parallel ranks; with e = etp, tp without it. */
Test(search, the_estimate_prices_expert_and_expert_tensor_parallelism)
{
  Fixture f;
  fixture_load(&f, "moe", "layers=2,hidden=1024,heads=8,kv_heads=8,experts=8,top_k=2,"
                          "expert_ffn=2048,seq=1024,vocab=1024,batch=16", "dgx-h100", 0);
  const SimGraph *g = f.g;
  double Pe = 0, Fe = 0;
  int moe_layers = 0;
  for (int op = 0; op < sim_graph_n_ops(g); op++)
    if (sim_graph_op_type(g, op) == SIM_OP_MOE) {
      Pe += (double)sim_graph_op_n_params(g, op);
      Fe += sim_graph_op_forward_flops(g, op) + sim_graph_op_backward_flops(g, op);
      moe_layers++;
    }
  cr_assert_eq(moe_layers, 2);
  cr_assert_float_eq(Pe, 2.0 * 8 * 3 * 1024 * 2048, 0.5, "the experts' parameters");
  const SimDeviceSpec *dev = sim_machine_device_spec(f.m, 0);
  double peak = dev->peak_flops[SIM_DTYPE_FP16];
  int nl = 0;
  const int *links = sim_machine_route(f.m, 0, 1, &nl);
  double nvlink = INFINITY;
  for (int i = 0; i < nl; i++)
    nvlink = fmin(nvlink, sim_machine_link_bandwidth(f.m, links[i]));
  static const struct {
    int ep, etp, zero1;
  } cases[] = { { 1, 0, 0 }, { 4, 0, 0 }, { 8, 1, 0 }, { 2, 1, 1 }, { 4, 2, 1 } };
  for (size_t k = 0; k < G_N_ELEMENTS(cases); k++) {
    SimMegatronOptions o = sim_megatron_options_default();
    o.tp = 2;
    o.dp = 4;
    o.microbatch_size = 1;
    o.microbatches = 4;
    o.ep = cases[k].ep;
    o.etp = cases[k].etp;
    o.memory.zero1 = cases[k].zero1;
    SearchPlanTerms x;
    double time = search_megatron_estimate_terms(f.p, &o, &x);
    cr_assert(isfinite(time) && time > 0);
    double ep = o.ep, e = o.etp > 0 ? o.etp : o.tp, t = o.tp;
    double rows = ep * e * 1 * 1024 * 2 / (t * 8);
    cr_expect_float_eq(x.expert_rows, rows, 1e-12 * rows, "case %zu: %g rows, %g expected", k,
                       x.expert_rows, rows);
    double q = rows * 2048 / (4 * e), eff = fmax(0.6 * q / (q + 0.5e6), 0.05);
    double work = Fe / (8 * peak * eff);
    cr_expect_float_eq(x.experts, work, 1e-12 * work, "case %zu: %g s, %g expected", k,
                       x.experts, work);
    double bytes = 1024.0 * 2 * 1024 * 2 * (ep - 1) / (ep * t);
    cr_expect_float_eq(x.alltoall_bytes, bytes, 1e-9 * bytes + 1e-9);
    double a2a = 4 * 2 * 4 * bytes / nvlink;
    cr_expect_float_eq(x.alltoall, a2a, 1e-12 * a2a + 1e-15, "case %zu: %g s, %g expected", k,
                       x.alltoall, a2a);
    double edp = 4 * t / (ep * e);
    double states = Pe / (ep * e) * (4 + 12 / (o.memory.zero1 ? edp : 1));
    cr_expect_float_eq(x.expert_states, states, 1e-12 * states, "case %zu: %g bytes, %g "
                       "expected", k, x.expert_states, states);
    cr_expect_leq(x.expert_states, x.states);
    cr_expect(x.fits == (x.memory <= 0.95 * (double)dev->mem_capacity));
  }
  fixture_free(&f);
}

/* Over two DGX H100 nodes (tp 2, dp 8) an expert group of ep 8 and etp 2 spans both
 * nodes: the estimate's all-to-all then moves etp times the bytes of one inside a node,
 * each of an expert's two GPUs receiving its own copy over the network, at the network's
 * rate (the route between the nodes' first GPUs); at etp 1 the group of 8 fits a node
 * and keeps the bytes and NVLink's rate. */
Test(search, the_estimate_prices_expert_groups_over_nodes_as_the_simulator_lays_them_out)
{
  Fixture f;
  fixture_load(&f, "moe", "layers=2,hidden=1024,heads=8,kv_heads=8,experts=8,top_k=2,"
                          "expert_ffn=2048,seq=1024,vocab=1024,batch=16", "dgx-h100:2", 0);
  double rate[2];
  for (int far = 0; far < 2; far++) {
    int nl = 0;
    const int *links = sim_machine_route(f.m, 0, far ? 8 : 1, &nl);
    rate[far] = INFINITY;
    for (int i = 0; i < nl; i++)
      rate[far] = fmin(rate[far], sim_machine_link_bandwidth(f.m, links[i]));
  }
  SearchPlanTerms x[2];
  for (int etp = 1; etp <= 2; etp++) {
    SimMegatronOptions o = sim_megatron_options_default();
    o.tp = 2;
    o.dp = 8;
    o.microbatch_size = 1;
    o.microbatches = 2;
    o.ep = 8;
    o.etp = etp;
    search_megatron_estimate_terms(f.p, &o, &x[etp - 1]);
    double bytes = 1024.0 * 2 * 1024 * 2 * 7 / (8 * 2) * etp;
    cr_expect_float_eq(x[etp - 1].alltoall_bytes, bytes, 1e-9 * bytes, "etp %d: %g bytes, %g "
                       "expected", etp, x[etp - 1].alltoall_bytes, bytes);
    double a2a = 2 * 2 * 4 * bytes / rate[etp - 1];
    cr_expect_float_eq(x[etp - 1].alltoall, a2a, 1e-12 * a2a, "etp %d: %g s, %g expected", etp,
                       x[etp - 1].alltoall, a2a);
  }
  fixture_free(&f);
}

/* The expert rules propose Mixtral 8x7B on a DGX H100 with each expert whole on a GPU
 * (etp 1) beside tensor parallelism 2, 4 and 8, the 8 experts over the 8 GPUs of the
 * stage (ep 8: groups of whole replicas), as Megatron-Core's MoE guide recommends; every
 * such plan builds, and none splits experts over groups that do not cover a replica. */
Test(search, expert_rules_propose_whole_experts_for_mixtral)
{
  Fixture f;
  fixture_load(&f, "mixtral-8x7b", NULL, "dgx-h100", 0);
  g_autoptr(GPtrArray) out = g_ptr_array_new();
  g_autoptr(GArray) opts = g_array_new(FALSE, FALSE, sizeof(SimMegatronOptions));
  search_expert_candidates_lazy(f.p, out, NULL, opts);
  cr_assert_eq(out->len, opts->len);
  gboolean tp_seen[9] = { FALSE };
  int whole = 0;
  for (guint i = 0; i < opts->len; i++) {
    const SimMegatronOptions *o = &g_array_index(opts, SimMegatronOptions, i);
    if (o->etp != 1)
      continue;
    whole++;
    cr_expect_gt(o->tp, 1);
    cr_expect(o->ep >= o->tp && o->ep % o->tp == 0 && (o->dp * o->tp) % o->ep == 0,
              "tp %d, dp %d, ep %d", o->tp, o->dp, o->ep);
    if (o->pp == 1 && o->tp <= 8) {
      cr_expect_eq(o->ep, 8);
      tp_seen[o->tp] = TRUE;
    }
    if (whole <= 3) {
      g_autoptr(SimStrategy) s = search_megatron_plan(f.p, o);
      cr_expect_not_null(s, "tp %d, pp %d, dp %d, ep %d, etp 1 does not build", o->tp, o->pp,
                         o->dp, o->ep);
    }
  }
  cr_expect(tp_seen[2] && tp_seen[4] && tp_seen[8], "etp 1 at tp 2 %d, 4 %d, 8 %d",
            tp_seen[2], tp_seen[4], tp_seen[8]);
  fixture_free(&f);
}
