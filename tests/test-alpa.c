/* test-alpa.c — Alpa's search (search/alpa.c, built with GLPK): the integer linear
 * program's optimum against exhaustive enumeration under the program's own costs, on
 * random programs and on stages of zoo models; the inter-stage dynamic program against
 * enumeration of every slicing; the search end to end. */
#include "parasol-search.h"
#include "search-private.h"

#include <criterion/criterion.h>
#include <string.h>

/* The cheapest choice that fits by enumeration (+inf when none fits). */
static double enumerate(const SearchIlp *ilp, int *best_choice)
{
  int n = ilp->n;
  g_autofree int *c = g_new0(int, MAX(n, 1));
  double best = INFINITY;
  for (;;) {
    gboolean fits;
    double cost = search_ilp_cost(ilp, c, &fits);
    if (fits && cost < best) {
      best = cost;
      if (best_choice)
        memcpy(best_choice, c, sizeof(int) * (gsize)n);
    }
    int v = 0;
    while (v < n && ++c[v] == ilp->k[v])
      c[v++] = 0;
    if (v == n)
      break;
  }
  return best;
}

/* Checks GLPK's answer against enumeration; returns whether the program was feasible. */
static gboolean check_against_enumeration(const SearchIlp *ilp, const char *what)
{
  g_autofree int *choice = g_new0(int, MAX(ilp->n, 1));
  double obj = NAN;
  SearchIlpStatus st = search_ilp_solve(ilp, 60, choice, &obj);
  double ref = enumerate(ilp, NULL);
  if (!isfinite(ref)) {
    cr_assert_eq(st, SEARCH_ILP_INFEASIBLE, "%s: nothing fits, GLPK says %d", what, st);
    return FALSE;
  }
  cr_assert_eq(st, SEARCH_ILP_OPTIMAL, "%s: status %d", what, st);
  gboolean fits;
  double cost = search_ilp_cost(ilp, choice, &fits);
  cr_assert(fits, "%s: GLPK's choice does not fit", what);
  cr_assert_float_eq(cost, obj, 1e-12 * MAX(1.0, fabs(obj)), "%s", what);
  cr_assert(fabs(obj - ref) <= 1e-9 * MAX(fabs(ref), 1e-9), "%s: ILP %.12g, enumeration %.12g",
            what, obj, ref);
  return TRUE;
}

Test(alpa, ilp_optimum_equals_enumeration_on_random_programs)
{
  GRand *r = g_rand_new_with_seed(40);
  int feasible = 0, infeasible = 0, memory_binds = 0;
  const int programs = 300;
  for (int t = 0; t < programs; t++) {
    int n = g_rand_int_range(r, 1, 7);
    int k[8];
    for (int v = 0; v < n; v++)
      k[v] = g_rand_int_range(r, 1, 5);
    int devices = g_rand_int_range(r, 0, 3);
    double capacity = devices ? g_rand_double_range(r, 0.5, 3.0) * n : 0;
    SearchIlp *ilp = search_ilp_new(n, k, devices, capacity);
    for (int v = 0; v < n; v++)
      for (int i = 0; i < k[v]; i++) {
        ilp->unary[v][i] = g_rand_double_range(r, 0, 1e-3);
        for (int d = 0; ilp->mem && d < devices; d++)
          ilp->mem[v][(gsize)i * devices + d] = g_rand_double_range(r, 0, 4);
      }
    for (int u = 0; u < n; u++)
      for (int v = u + 1; v < n; v++)
        if (g_rand_boolean(r)) {
          double m[16];
          for (int x = 0; x < k[u] * k[v]; x++)
            m[x] = g_rand_boolean(r) ? 0 : g_rand_double_range(r, 0, 1e-3);
          if (g_rand_boolean(r))
            search_ilp_add_pair(ilp, u, v, m);
          else {
            /* The same pair the other way round: the program is not oriented. */
            double mt[16];
            for (int i = 0; i < k[u]; i++)
              for (int j = 0; j < k[v]; j++)
                mt[j * k[u] + i] = m[i * k[v] + j];
            search_ilp_add_pair(ilp, v, u, mt);
          }
        }
    g_autofree char *what = g_strdup_printf("random program %d", t);
    if (check_against_enumeration(ilp, what)) {
      feasible++;
      /* Where memory binds, the program's optimum is not the unconstrained one. */
      if (ilp->mem) {
        double saved = ilp->capacity;
        ilp->capacity = INFINITY;
        double free_opt = enumerate(ilp, NULL);
        ilp->capacity = saved;
        if (free_opt < enumerate(ilp, NULL) - 1e-12)
          memory_binds++;
      }
    } else {
      infeasible++;
    }
    search_ilp_free(ilp);
  }
  g_rand_free(r);
  cr_assert_eq(feasible + infeasible, programs);
  /* The random programs cover the three cases. */
  cr_assert_gt(infeasible, 10, "only %d infeasible programs", infeasible);
  cr_assert_gt(memory_binds, 10, "memory binds in only %d programs", memory_binds);
  cr_assert_gt(feasible, 150);
  cr_log_info("%d random programs checked against enumeration: %d feasible (memory binding in "
              "%d), %d infeasible", programs, feasible, memory_binds, infeasible);
}

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

static void fixture_free(Fixture *f)
{
  search_problem_unref(f->p);
  sim_cost_model_free(f->cost);
  sim_machine_free(f->m);
  sim_graph_free(f->g);
}

/* Windows of @width consecutive operators (data sources left out) of a zoo model, each on
 * submeshes of 2 and 4 devices with 1 and 2 micro-batches and 3 candidates per operator:
 * the stage programs Alpa's search builds, small enough to enumerate. */
static int check_model_stages(const char *model, const char *params, int width)
{
  Fixture f;
  fixture_load(&f, model, params, "dgx-a100", 4);
  SearchEstimate *e = search_estimate_new(f.p);
  int n = sim_graph_n_ops(f.g);
  g_autofree int *ops = g_new(int, n);
  int n_ops = 0;
  for (int op = 0; op < n; op++)
    if (sim_graph_op_type(f.g, op) != SIM_OP_INPUT)
      ops[n_ops++] = op;
  int checked = 0, with_pairs = 0;
  for (int at = 0; at + width <= n_ops; at += width)
    for (int mesh = 2; mesh <= 4; mesh *= 2)
      for (int mb = 1; mb <= 2; mb++) {
        GArray *cands[16];
        SearchIlp *ilp = search_alpa_stage_ilp(f.p, e, ops + at, width, mesh, mb, 3, cands,
                                               NULL, NULL);
        g_autofree char *what = g_strdup_printf("%s ops %d.. on %d devices, %d micro-batches",
                                                model, ops[at], mesh, mb);
        check_against_enumeration(ilp, what);
        /* The candidates sit on the submesh and split a micro-batch evenly. */
        for (int v = 0; v < width; v++)
          for (guint i = 0; i < cands[v]->len; i++) {
            const SearchConfig *c = search_problem_config(f.p, ops[at + v],
                                                          g_array_index(cands[v], int, i));
            cr_assert(c->start == 0 && mesh % c->n == 0, "%s", what);
            cr_assert_eq(sim_graph_op_dim_size(f.g, ops[at + v], 0) / mb % c->degree[0], 0);
          }
        with_pairs += ilp->pu->len > 0;
        checked++;
        for (int v = 0; v < width; v++)
          g_array_unref(cands[v]);
        search_ilp_free(ilp);
      }
  cr_assert_gt(with_pairs, 0, "%s: no stage program has a resharding pair", model);
  search_estimate_free(e);
  fixture_free(&f);
  return checked;
}

Test(alpa, stage_ilp_optimum_equals_enumeration_on_model_stages)
{
  int checked = 0;
  checked += check_model_stages("mlp", "layers=8,hidden=256,batch=32", 4);
  checked += check_model_stages("gpt", "layers=1,hidden=128,heads=4,seq=64,vocab=512,batch=8", 4);
  checked += check_model_stages("alexnet", "batch=32", 4);
  /* 4 programs per window: two submeshes, two micro-batch counts. */
  cr_assert_geq(checked, 40, "only %d stage programs checked", checked);
  cr_log_info("%d stage programs checked against enumeration", checked);
}

/* Every slicing of @L layers into stages with submeshes covering @N devices. */
static void slicings(const double *lat, int L, const int *mesh, int n_meshes, int k, int d,
                     int mb, double sum, double mx, double *best)
{
  if (k == L) {
    if (d == 0)
      *best = MIN(*best, sum + (mb - 1) * mx);
    return;
  }
  for (int i = k; i < L; i++)
    for (int m = 0; m < n_meshes; m++) {
      double t = lat[((gsize)k * L + i) * n_meshes + m];
      if (mesh[m] <= d && isfinite(t))
        slicings(lat, L, mesh, n_meshes, i + 1, d - mesh[m], mb, sum + t, MAX(mx, t), best);
    }
}

Test(alpa, stage_dp_equals_enumeration_of_slicings)
{
  GRand *r = g_rand_new_with_seed(5);
  const int mesh[] = { 1, 2, 4, 8 };
  int feasible = 0;
  for (int t = 0; t < 200; t++) {
    int L = g_rand_int_range(r, 1, 6);
    int n_meshes = g_rand_int_range(r, 1, 5);
    int N = mesh[g_rand_int_range(r, 0, n_meshes)] * g_rand_int_range(r, 1, 3);
    int mb = g_rand_int_range(r, 1, 17);
    g_autofree double *lat = g_new(double, (gsize)L * L * n_meshes);
    for (int a = 0; a < L; a++)
      for (int b = 0; b < L; b++)
        for (int m = 0; m < n_meshes; m++) {
          /* Longer ranges cost more, larger meshes less, some stages infeasible. */
          double t0 = (b - a + 1) * g_rand_double_range(r, 0.5, 1.5) / mesh[m];
          lat[((gsize)a * L + b) * n_meshes + m] =
            b < a || g_rand_int_range(r, 0, 8) == 0 ? INFINITY : t0;
        }
    double ref = INFINITY;
    slicings(lat, L, mesh, n_meshes, 0, N, mb, 0, 0, &ref);
    SearchAlpaPlan plan;
    gboolean ok = search_alpa_dp(lat, L, mesh, n_meshes, N, mb, &plan);
    cr_assert_eq(ok, isfinite(ref), "case %d", t);
    if (!ok)
      continue;
    feasible++;
    cr_assert_float_eq(plan.predicted, ref, 1e-12, "case %d: dp %g, enumeration %g", t,
                       plan.predicted, ref);
    /* The plan is a slicing of that cost. */
    double sum = 0, mx = 0;
    int used = 0, next = 0;
    for (int s = 0; s < plan.S; s++) {
      cr_assert_eq(plan.first[s], next);
      next = plan.last[s] + 1;
      used += mesh[plan.mesh[s]];
      double x = lat[((gsize)plan.first[s] * L + plan.last[s]) * n_meshes + plan.mesh[s]];
      sum += x;
      mx = MAX(mx, x);
    }
    cr_assert_eq(next, L);
    cr_assert_eq(used, N);
    cr_assert_float_eq(sum + (mb - 1) * mx, plan.predicted, 1e-12);
  }
  g_rand_free(r);
  cr_assert_gt(feasible, 100);
  cr_log_info("200 latency tables checked against enumeration of slicings, %d feasible",
              feasible);
}

static SearchResult *run_alpa(SearchProblem *p, const char *const *options, GError **error)
{
  search_register_builtins();
  const SearchAlgorithm *a = search_lookup("alpa");
  cr_assert_not_null(a);
  SearchRunOptions o = search_run_options_default();
  o.eval_budget = 200;
  o.options = options;
  return search_run(a, p, &o, error);
}

Test(alpa, search_simulates_its_plan_and_reports_the_prediction)
{
  Fixture f;
  fixture_load(&f, "gpt", "layers=4,hidden=256,heads=4,seq=128,vocab=1024,batch=16",
               "dgx-a100", 8);
  g_autoptr(GError) error = NULL;
  SearchResult *r = run_alpa(f.p, NULL, &error);
  cr_assert_not_null(r, "%s", error ? error->message : "");
  const SimStrategy *s = search_result_get_strategy(r);
  cr_assert_not_null(s);
  double predicted, simulated;
  cr_assert(search_result_get_prediction(r, &predicted, &simulated));
  cr_assert(isfinite(predicted) && predicted > 0);
  /* The prediction is of the plan the search kept: simulated again, the same time. */
  cr_assert_float_eq(search_result_get_time(r), simulated, 1e-12);
  double again = search_problem_simulate(f.p, s, NULL, &error);
  cr_assert_float_eq(again, simulated, 1e-9 * simulated, "%g against %g", again, simulated);
  search_result_free(r);

  /* Every stage program solved by GLPK, none taken from variable elimination: the same
   * optima, so the same prediction. */
  const char *const glpk[] = { "glpk-always=1", NULL };
  r = run_alpa(f.p, glpk, &error);
  cr_assert_not_null(r, "%s", error ? error->message : "");
  double predicted_glpk;
  cr_assert(search_result_get_prediction(r, &predicted_glpk, NULL));
  cr_assert_float_eq(predicted_glpk, predicted, 1e-9 * predicted, "%g against %g",
                     predicted_glpk, predicted);
  search_result_free(r);

  /* One micro-batch count only, and a bad one. */
  const char *const one[] = { "microbatches=4", NULL };
  r = run_alpa(f.p, one, &error);
  cr_assert_not_null(r, "%s", error ? error->message : "");
  cr_assert_eq(sim_strategy_get_microbatches(search_result_get_strategy(r)), 4);
  search_result_free(r);
  const char *const bad[] = { "microbatches=3", NULL };
  r = run_alpa(f.p, bad, &error);
  cr_assert_null(r);
  cr_assert(strstr(error->message, "microbatches=3") && strstr(error->message, "power of two"),
            "%s", error->message);
  fixture_free(&f);
}

Test(alpa, single_stage_without_pipelines)
{
  Fixture f;
  fixture_load(&f, "gpt", "layers=4,hidden=256,heads=4,seq=128,vocab=1024,batch=16",
               "dgx-a100", 8);
  search_problem_set_kinds(f.p, SEARCH_KIND_ALL & ~SEARCH_KIND_PIPELINE);
  g_autoptr(GError) error = NULL;
  SearchResult *r = run_alpa(f.p, NULL, &error);
  cr_assert_not_null(r, "%s", error ? error->message : "");
  const SimStrategy *s = search_result_get_strategy(r);
  cr_assert_not_null(s);
  cr_assert_eq(sim_strategy_n_stages(s), 1);
  cr_assert_eq(sim_strategy_get_microbatches(s), 1);
  search_result_free(r);
  fixture_free(&f);
}
