/* alpa.c — Alpa's search (Zheng et al., OSDI'22): an integer linear program chooses every
 * operator's sharding inside a pipeline stage, and a dynamic program over layer ranges
 * and submeshes chooses the stages.
 *
 * Intra-stage (Alpa §4): one binary variable s[v][i] per operator v and candidate
 * configuration i (configs.c's candidates on the stage's submesh, the best few by the
 * estimate), one of them chosen (sum_i s[v][i] = 1).  The cost of a choice is the
 * estimate's node cost (estimate.c: compute, weight-gradient all-reduce, partial sums);
 * resharding between a producer u and a consumer v is the estimate's edge cost R[i][j],
 * linearized as Alpa does with edge variables e[uv][i][j] in [0, 1] and the equalities
 * sum_j e[uv][i][j] = s[u][i], sum_i e[uv][i][j] = s[v][j], so that e is the product of
 * the two choices once they are binary.  Memory is a row per device of the submesh: the
 * weights with their gradients and Adam states (16 bytes per parameter, as
 * plan-estimate.c counts them) and the activations each operator keeps of one
 * micro-batch, within the device's capacity.  GLPK solves it within a time limit
 * (glp_iocp's tm_lim) taken from the search's budget, from variable elimination's choice
 * (ve.c, which ignores memory) offered as a first solution where it fits; a solve that
 * ends at its limit keeps the best integer solution found.  Where the elimination is
 * exact (the graph reduces without approximation) and its choice fits, that choice is
 * the program's optimum and the search takes it without GLPK (option glpk-always=1
 * solves every program with GLPK).
 *
 * Inter-stage (Alpa §5): the operators, in topological order, form L layers (cuts after
 * layer ends, balanced by data-parallel compute); submeshes are the power-of-two blocks
 * of devices.  For every range of layers and submesh the ILP gives the stage's latency
 * for one of B micro-batches (its optimum over B: the estimate counts the whole batch).
 * The dynamic program F(k, d) = min over the first stage's last layer i and submesh n of
 * t(k..i, n) + F(i + 1, d - n), with every stage at most t_max, covers all devices
 * exactly; the pipeline's latency sum_s t_s + (B - 1) max_s t_s is minimized by
 * enumerating t_max over the stage latencies in increasing order (stopping once
 * (B - 1) t_max alone exceeds the best).  B is taken from the powers of two that divide
 * the batch, up to the option max-microbatches; stages get their devices in decreasing
 * submesh size, so every block is aligned.  The programs run longest ranges and largest
 * submeshes first and stop at 85% of a budget in seconds, so that a pass cut short still
 * yields plans and the rest of the budget simulates them.
 *
 * Each plan is then simulated (made to fit by search_fit() where it does not), and the
 * fastest is the search's result.  The DP's predicted time of that plan and its simulated
 * time go to the report (search_context_set_prediction()): the ILP's costs add up where
 * the simulator overlaps computation with communication and sees links contended.
 *
 * Departures from the paper: layers are clustered by compute alone (Alpa's clustering also
 * minimizes the bytes between layers); submeshes are one-dimensional blocks; the stage
 * latency is the full-batch ILP optimum divided by B rather than a profile of one
 * micro-batch; activations crossing stages are left to the simulator.
 *
 * One file of about a thousand lines: the stage programs, the stage dynamic program and the
 * search that runs them share the stage cache and the budget's split, and are read together
 * against the paper. */
#include "distributed.h"

#include <glpk.h>
#include <string.h>

/* ---------------------------------------------------------------------------------- */
/* The integer linear program                                                          */

SearchIlp *search_ilp_new(int n, const int *k, int n_devices, double capacity)
{
  SearchIlp *ilp = g_new0(SearchIlp, 1);
  ilp->n = n;
  ilp->k = g_memdup2(k, sizeof(int) * (gsize)MAX(n, 1));
  ilp->unary = g_new0(double *, MAX(n, 1));
  for (int v = 0; v < n; v++)
    ilp->unary[v] = g_new0(double, MAX(k[v], 1));
  ilp->pu = g_array_new(FALSE, FALSE, sizeof(int));
  ilp->pv = g_array_new(FALSE, FALSE, sizeof(int));
  ilp->pair = g_ptr_array_new_with_free_func(g_free);
  ilp->n_devices = n_devices;
  ilp->capacity = capacity;
  if (n_devices > 0 && capacity > 0) {
    ilp->mem = g_new0(double *, MAX(n, 1));
    for (int v = 0; v < n; v++)
      ilp->mem[v] = g_new0(double, (gsize)MAX(k[v], 1) * n_devices);
  }
  return ilp;
}

void search_ilp_free(SearchIlp *ilp)
{
  if (!ilp)
    return;
  for (int v = 0; v < ilp->n; v++) {
    g_free(ilp->unary[v]);
    if (ilp->mem)
      g_free(ilp->mem[v]);
  }
  g_free(ilp->unary);
  g_free(ilp->mem);
  g_free(ilp->k);
  g_array_unref(ilp->pu);
  g_array_unref(ilp->pv);
  g_ptr_array_unref(ilp->pair);
  g_free(ilp);
}

void search_ilp_add_pair(SearchIlp *ilp, int u, int v, const double *cost)
{
  g_return_if_fail(u != v && u >= 0 && v >= 0 && u < ilp->n && v < ilp->n);
  g_array_append_val(ilp->pu, u);
  g_array_append_val(ilp->pv, v);
  g_ptr_array_add(ilp->pair, g_memdup2(cost, sizeof(double) * (gsize)ilp->k[u] * ilp->k[v]));
}

double search_ilp_cost(const SearchIlp *ilp, const int *choice, gboolean *fits)
{
  double c = 0;
  for (int v = 0; v < ilp->n; v++)
    c += ilp->unary[v][choice[v]];
  for (guint p = 0; p < ilp->pu->len; p++) {
    int u = g_array_index(ilp->pu, int, p), v = g_array_index(ilp->pv, int, p);
    const double *m = g_ptr_array_index(ilp->pair, p);
    c += m[(gsize)choice[u] * ilp->k[v] + choice[v]];
  }
  if (fits) {
    *fits = TRUE;
    for (int d = 0; ilp->mem && d < ilp->n_devices; d++) {
      double used = 0;
      for (int v = 0; v < ilp->n; v++)
        used += ilp->mem[v][(gsize)choice[v] * ilp->n_devices + d];
      if (used > ilp->capacity)
        *fits = FALSE;
    }
  }
  return c;
}

typedef struct {
  gboolean (*stop)(gpointer data);
  gpointer data;
  const double *start;       /* a solution to offer GLPK (1-based columns), or NULL   */
  gboolean offered;
  gboolean shortcut;
} StopHook;

static void ilp_callback(glp_tree *tree, void *info)
{
  StopHook *h = info;
  int reason = glp_ios_reason(tree);
  if (reason == GLP_IHEUR && h->start && !h->offered) {
    h->offered = TRUE;
    glp_ios_heur_sol(tree, h->start);
  }
  if (h->stop && reason == GLP_ISELECT && h->stop(h->data))
    glp_ios_terminate(tree);
}

/* The optimum without memory rows by variable elimination (ve.c): exact on the graphs it
 * can eliminate, approximate elsewhere.  GLPK starts from it where it fits. */
static gboolean ve_choice(const SearchIlp *ilp, int *choice)
{
  SearchVE *ve = search_ve_new(ilp->n, ilp->k);
  for (int v = 0; v < ilp->n; v++)
    search_ve_add_unary(ve, v, ilp->unary[v]);
  for (guint p = 0; p < ilp->pu->len; p++)
    search_ve_add_pair(ve, g_array_index(ilp->pu, int, p), g_array_index(ilp->pv, int, p),
                       g_ptr_array_index(ilp->pair, p));
  gboolean exact = search_ve_solve(ve, NULL) == 0;
  search_ve_assign(ve, NULL, choice);
  search_ve_free(ve);
  return exact;
}

/* Costs go to GLPK in microseconds and memory in fractions of the capacity, so that its
 * absolute tolerances stay far below the differences that matter. */
#define COST_SCALE 1e6

/* The program of @ilp for GLPK: binary choice columns (from @col0[v] for operator v) and
 * edge columns (from @pcol0[p] for pair p), 1-based, *@n_cols in all; the rows: one
 * choice per operator, the edge equalities, memory per device. */
static glp_prob *build_program(const SearchIlp *ilp, int *col0, int *pcol0, int *n_cols)
{
  int n = ilp->n;
  glp_prob *lp = glp_create_prob();
  glp_set_obj_dir(lp, GLP_MIN);
  /* Columns: the choices, then the edge variables of each pair. */
  int cols = 0;
  for (int v = 0; v < n; v++) {
    col0[v] = cols + 1;
    cols += ilp->k[v];
  }
  int n_pairs = (int)ilp->pu->len;
  for (int p = 0; p < n_pairs; p++) {
    int u = g_array_index(ilp->pu, int, p), v = g_array_index(ilp->pv, int, p);
    pcol0[p] = cols + 1;
    cols += ilp->k[u] * ilp->k[v];
  }
  glp_add_cols(lp, cols);
  for (int v = 0; v < n; v++)
    for (int i = 0; i < ilp->k[v]; i++) {
      glp_set_col_kind(lp, col0[v] + i, GLP_BV);
      glp_set_obj_coef(lp, col0[v] + i, ilp->unary[v][i] * COST_SCALE);
    }
  for (int p = 0; p < n_pairs; p++) {
    int u = g_array_index(ilp->pu, int, p), v = g_array_index(ilp->pv, int, p);
    const double *m = g_ptr_array_index(ilp->pair, p);
    for (int x = 0; x < ilp->k[u] * ilp->k[v]; x++) {
      glp_set_col_bnds(lp, pcol0[p] + x, GLP_DB, 0.0, 1.0);
      glp_set_obj_coef(lp, pcol0[p] + x, m[x] * COST_SCALE);
    }
  }
  /* Rows: one choice per operator, the edge equalities, memory per device. */
  GArray *ia = g_array_new(FALSE, FALSE, sizeof(int));
  GArray *ja = g_array_new(FALSE, FALSE, sizeof(int));
  GArray *ar = g_array_new(FALSE, FALSE, sizeof(double));
  int zero = 0;
  double dzero = 0;
  g_array_append_val(ia, zero);  /* GLPK's arrays start at 1 */
  g_array_append_val(ja, zero);
  g_array_append_val(ar, dzero);
  int rows = 0;
#define ENTRY(r, c, x)                                                                       \
  do {                                                                                       \
    int r_ = (r), c_ = (c);                                                                  \
    double x_ = (x);                                                                         \
    g_array_append_val(ia, r_);                                                              \
    g_array_append_val(ja, c_);                                                              \
    g_array_append_val(ar, x_);                                                              \
  } while (0)
  for (int v = 0; v < n; v++) {
    rows++;
    for (int i = 0; i < ilp->k[v]; i++)
      ENTRY(rows, col0[v] + i, 1.0);
  }
  int choice_rows = rows;
  for (int p = 0; p < n_pairs; p++) {
    int u = g_array_index(ilp->pu, int, p), v = g_array_index(ilp->pv, int, p);
    int ku = ilp->k[u], kv = ilp->k[v];
    for (int i = 0; i < ku; i++) {
      rows++;
      for (int j = 0; j < kv; j++)
        ENTRY(rows, pcol0[p] + i * kv + j, 1.0);
      ENTRY(rows, col0[u] + i, -1.0);
    }
    for (int j = 0; j < kv; j++) {
      rows++;
      for (int i = 0; i < ku; i++)
        ENTRY(rows, pcol0[p] + i * kv + j, 1.0);
      ENTRY(rows, col0[v] + j, -1.0);
    }
  }
  int eq_rows = rows;
  for (int d = 0; ilp->mem && d < ilp->n_devices; d++) {
    int row = rows + 1;
    gboolean any = FALSE;
    for (int v = 0; v < n; v++)
      for (int i = 0; i < ilp->k[v]; i++) {
        double b = ilp->mem[v][(gsize)i * ilp->n_devices + d];
        if (b != 0) {
          ENTRY(row, col0[v] + i, b / ilp->capacity);
          any = TRUE;
        }
      }
    if (any)
      rows++;
  }
#undef ENTRY
  glp_add_rows(lp, rows);
  for (int r = 1; r <= choice_rows; r++)
    glp_set_row_bnds(lp, r, GLP_FX, 1.0, 1.0);
  for (int r = choice_rows + 1; r <= eq_rows; r++)
    glp_set_row_bnds(lp, r, GLP_FX, 0.0, 0.0);
  for (int r = eq_rows + 1; r <= rows; r++)
    glp_set_row_bnds(lp, r, GLP_UP, 0.0, 1.0);
  glp_load_matrix(lp, (int)ia->len - 1, (int *)ia->data, (int *)ja->data, (double *)ar->data);
  g_array_unref(ia);
  g_array_unref(ja);
  g_array_unref(ar);
  *n_cols = cols;
  return lp;
}

/* GLPK on @lp within @seconds: the relaxation, then branch and bound from the start
 * that @hook offers.  What it found. */
static SearchIlpStatus run_glpk(glp_prob *lp, double seconds, StopHook *hook)
{
  glp_iocp parm;
  glp_init_iocp(&parm);
  parm.presolve = GLP_OFF;
  parm.msg_lev = GLP_MSG_OFF;
  parm.tm_lim = (int)CLAMP(seconds * 1000.0, 1.0, (double)G_MAXINT);
  parm.cb_func = ilp_callback;
  parm.cb_info = hook;
  /* The relaxation first, so that the branch and bound runs on the program as built (the
   * MIP presolver would renumber the columns the start refers to). */
  glp_smcp sp;
  glp_init_smcp(&sp);
  sp.msg_lev = GLP_MSG_OFF;
  sp.presolve = GLP_ON;
  sp.tm_lim = parm.tm_lim;
  gint64 t0 = g_get_monotonic_time();
  int ret = glp_simplex(lp, &sp);
  if (ret == 0 && glp_get_status(lp) == GLP_OPT) {
    parm.tm_lim = MAX(1, parm.tm_lim - (int)((g_get_monotonic_time() - t0) / 1000));
    ret = glp_intopt(lp, &parm);
  } else if (ret == GLP_ENOPFS || (ret == 0 && glp_get_status(lp) == GLP_NOFEAS)) {
    ret = GLP_ENOPFS;
  } else {
    ret = GLP_ETMLIM;
  }
  int status = glp_mip_status(lp);
  SearchIlpStatus result;
  if (status == GLP_OPT && ret == 0)
    result = SEARCH_ILP_OPTIMAL;
  else if (status == GLP_OPT || status == GLP_FEAS)
    result = SEARCH_ILP_FEASIBLE;
  else if (status == GLP_NOFEAS || ret == GLP_ENOPFS)
    result = SEARCH_ILP_INFEASIBLE;
  else
    result = SEARCH_ILP_UNKNOWN;
  return result;
}

/* *@unbound (may be NULL) tells whether the memory rows did not bind: the choice is the
 * optimum without them, which stays optimal wherever they are looser. */
static SearchIlpStatus ilp_solve(const SearchIlp *ilp, double seconds, StopHook *hook,
                                 int *choice, double *objective, gboolean *unbound)
{
  if (unbound)
    *unbound = FALSE;
  int n = ilp->n;
  if (objective)
    *objective = INFINITY;
  for (int v = 0; v < n; v++)
    if (ilp->k[v] < 1)
      return SEARCH_ILP_INFEASIBLE;
  if (n == 0) {
    if (objective)
      *objective = 0;
    return SEARCH_ILP_OPTIMAL;
  }
  /* A start: variable elimination's choice when it fits (a heuristic solution).  Where
   * the elimination was exact and its choice fits, it is the program's optimum, which
   * the search takes without GLPK (the shortcut). */
  g_autofree int *start = g_new0(int, n);
  gboolean exact = ve_choice(ilp, start);
  gboolean start_fits = FALSE;
  double start_cost = search_ilp_cost(ilp, start, &start_fits);
  if (hook && hook->shortcut && exact && start_fits) {
    memcpy(choice, start, sizeof(int) * (gsize)n);
    if (objective)
      *objective = start_cost;
    if (unbound)
      *unbound = TRUE;
    return SEARCH_ILP_OPTIMAL;
  }
  glp_term_out(GLP_OFF);
  g_autofree int *col0 = g_new(int, n);
  int n_pairs = (int)ilp->pu->len;
  g_autofree int *pcol0 = g_new(int, MAX(n_pairs, 1));
  int cols = 0;
  glp_prob *lp = build_program(ilp, col0, pcol0, &cols);

  g_autofree double *x0 = NULL;
  StopHook none = { 0 };
  if (!hook)
    hook = &none;
  if (start_fits) {
    x0 = g_new0(double, cols + 1);
    for (int v = 0; v < n; v++)
      x0[col0[v] + start[v]] = 1;
    for (int p = 0; p < n_pairs; p++) {
      int u = g_array_index(ilp->pu, int, p), v = g_array_index(ilp->pv, int, p);
      x0[pcol0[p] + start[u] * ilp->k[v] + start[v]] = 1;
    }
    hook->start = x0;
    hook->offered = FALSE;
  }

  SearchIlpStatus result = run_glpk(lp, seconds, hook);
  if (result == SEARCH_ILP_OPTIMAL || result == SEARCH_ILP_FEASIBLE) {
    for (int v = 0; v < n; v++) {
      int best = 0;
      double bv = -1;
      for (int i = 0; i < ilp->k[v]; i++) {
        double x = glp_mip_col_val(lp, col0[v] + i);
        if (x > bv) {
          bv = x;
          best = i;
        }
      }
      choice[v] = best;
    }
  }
  /* The objective of the choice itself, in seconds, free of GLPK's rounding. */
  double got = result == SEARCH_ILP_OPTIMAL || result == SEARCH_ILP_FEASIBLE
                 ? search_ilp_cost(ilp, choice, NULL) : INFINITY;
  /* Out of time without a better solution: the start, which fits. */
  if (start_fits && (result == SEARCH_ILP_UNKNOWN ||
                     (result == SEARCH_ILP_FEASIBLE && start_cost < got))) {
    memcpy(choice, start, sizeof(int) * (gsize)n);
    result = SEARCH_ILP_FEASIBLE;
    got = start_cost;
  }
  if (objective)
    *objective = got;
  if (unbound)
    *unbound = result == SEARCH_ILP_OPTIMAL &&
               (!ilp->mem || (exact && start_fits && got >= start_cost - 1e-12 * fabs(start_cost)));
  hook->start = NULL;
  glp_delete_prob(lp);
  return result;
}

SearchIlpStatus search_ilp_solve(const SearchIlp *ilp, double seconds, int *choice,
                                 double *objective)
{
  return ilp_solve(ilp, seconds, NULL, choice, objective, NULL);
}

/* ---------------------------------------------------------------------------------- */
/* A stage's program                                                                   */

/* Bytes one device keeps for @op under configuration @c: the shard's weights with their
 * gradients and Adam states, and its outputs of one of @mb micro-batches for the backward
 * pass (a lower bound: a pipeline holds several; the simulator counts them all). */
static double config_bytes(const SearchProblem *p, int op, const SearchConfig *c, int mb)
{
  const SimGraph *g = p->g;
  int nd = sim_graph_op_n_dims(g, op);
  int64_t lo[SEARCH_MAX_DIMS], hi[SEARCH_MAX_DIMS];
  for (int d = 0; d < nd; d++) {
    lo[d] = 0;
    hi[d] = sim_graph_op_dim_size(g, op, d) / MAX(c->degree[d], 1);
  }
  double bytes = 0;
  SimRegion r;
  int owner = sim_graph_op_weight_owner(g, op);
  int first_w = owner >= 0 && owner != op ? sim_graph_op_n_weights(g, owner) : 0;
  for (int w = first_w; w < sim_graph_op_n_weights(g, op); w++)
    if (sim_graph_op_shard_region(g, op, SIM_TENSOR_WEIGHT, w, lo, hi, &r))
      bytes += 16.0 * (double)sim_region_volume(&r);
  for (int o = 0; o < sim_graph_op_n_outputs(g, op); o++)
    if (sim_graph_op_shard_region(g, op, SIM_TENSOR_OUTPUT, o, lo, hi, &r)) {
      int es = sim_dtype_size(sim_graph_tensor_dtype(g, sim_graph_op_output(g, op, o)));
      bytes += (double)sim_region_volume(&r) * (es > 0 ? es : 4) / mb;
    }
  return bytes;
}

/* Whether every op's sample dimension divides into @mb micro-batches. */
static gboolean microbatches_divide(const SearchProblem *p, int mb)
{
  for (int op = 0; op < p->n_ops; op++)
    if (sim_graph_op_dim_size(p->g, op, 0) % mb != 0)
      return FALSE;
  return TRUE;
}

/* The candidates of @op on a submesh of @mesh devices (configurations at device 0 on a
 * divisor of it whose sample split divides a micro-batch of @mb): data parallelism over
 * the submesh first, then the best by the estimate, @max in all. */
static GArray *stage_cands(const SearchProblem *p, SearchEstimate *e, int op, int mesh, int mb,
                           int max)
{
  int n = search_problem_n_configs(p, op);
  int64_t per = sim_graph_op_dim_size(p->g, op, 0) / mb;
  GArray *c = g_array_new(FALSE, FALSE, sizeof(int));
  int dp = search_problem_dp_config(p, op, 0, mesh);
  if (per % search_problem_config(p, op, dp)->degree[0] == 0)
    g_array_append_val(c, dp);
  g_autofree int *idx = g_new(int, MAX(n, 1));
  g_autofree double *cost = g_new(double, MAX(n, 1));
  int m = 0;
  for (int i = 0; i < n; i++) {
    const SearchConfig *cf = search_problem_config(p, op, i);
    if (cf->start != 0 || mesh % cf->n != 0 || per % cf->degree[0] != 0 || i == dp)
      continue;
    idx[m] = i;
    cost[m] = search_estimate_node(e, op, i);
    m++;
  }
  while ((int)c->len < max) {
    int best = -1;
    for (int j = 0; j < m; j++)
      if (idx[j] >= 0 && (best < 0 || cost[j] < cost[best]))
        best = j;
    if (best < 0)
      break;
    g_array_append_val(c, idx[best]);
    idx[best] = -1;
  }
  return c;
}

SearchIlp *search_alpa_stage_ilp(const SearchProblem *p, SearchEstimate *e, const int *ops,
                                 int n_ops, int mesh, int mb, int max_cands, GArray **cands,
                                 gboolean (*stop)(gpointer data), gpointer data)
{
  g_autofree int *k = g_new(int, MAX(n_ops, 1));
  g_autofree int *var_of = g_new(int, MAX(p->n_ops, 1));
  for (int op = 0; op < p->n_ops; op++)
    var_of[op] = -1;
  for (int v = 0; v < n_ops; v++) {
    cands[v] = stage_cands(p, e, ops[v], mesh, mb, max_cands);
    k[v] = (int)cands[v]->len;
    var_of[ops[v]] = v;
  }
  const SimDeviceSpec *spec = sim_machine_device_spec(p->m, p->devices[0]);
  double capacity = p->memory_limit && spec && spec->mem_capacity > 0
                      ? (double)spec->mem_capacity : 0;
  SearchIlp *ilp = search_ilp_new(n_ops, k, capacity > 0 ? mesh : 0, capacity);
  for (int v = 0; v < n_ops; v++)
    for (int i = 0; i < k[v]; i++) {
      int cfg = g_array_index(cands[v], int, i);
      ilp->unary[v][i] = search_estimate_node(e, ops[v], cfg);
      if (ilp->mem) {
        const SearchConfig *c = search_problem_config(p, ops[v], cfg);
        double b = config_bytes(p, ops[v], c, mb);
        for (int d = c->start; d < c->start + c->n && d < mesh; d++)
          ilp->mem[v][(gsize)i * mesh + d] = b;
      }
    }
  for (int ed = 0; ed < search_estimate_n_edges(e); ed++) {
    /* Pricing the edges of a large submesh takes a while: the search may stop meanwhile. */
    if (stop && stop(data)) {
      search_ilp_free(ilp);
      return NULL;
    }
    int a, b;
    search_estimate_edge_ends(e, ed, &a, &b);
    int u = var_of[a], v = var_of[b];
    if (u < 0 || v < 0 || u == v)
      continue;
    g_autofree double *m = g_new(double, (gsize)k[u] * k[v]);
    double lo = INFINITY, hi = -INFINITY;
    for (int i = 0; i < k[u]; i++)
      for (int j = 0; j < k[v]; j++) {
        double x = search_estimate_edge(e, ed, g_array_index(cands[u], int, i),
                                        g_array_index(cands[v], int, j));
        m[(gsize)i * k[v] + j] = x;
        lo = MIN(lo, x);
        hi = MAX(hi, x);
      }
    if (hi <= 0)
      continue;
    if (k[u] == 1 || k[v] == 1 || hi == lo) {
      /* One side fixed: the edge is a cost of the other's choice alone. */
      for (int i = 0; i < k[u]; i++)
        for (int j = 0; j < k[v]; j++) {
          double x = m[(gsize)i * k[v] + j];
          if (k[v] == 1)
            ilp->unary[u][i] += x;
          else if (k[u] == 1)
            ilp->unary[v][j] += x;
          else if (i == 0)
            ilp->unary[v][j] += x;
        }
      continue;
    }
    search_ilp_add_pair(ilp, u, v, m);
  }
  return ilp;
}

/* ---------------------------------------------------------------------------------- */
/* The search                                                                          */

/* The layers: @n_layers runs of ops in topological order, cut after layer ends (any op
 * when the model marks none), balanced by data-parallel compute.  Writes each op's layer
 * to @layer_of and returns the number of layers. */
static int cluster_layers(const SearchProblem *p, SearchEstimate *e, int n_layers,
                          int *layer_of)
{
  const SimGraph *g = p->g;
  int n = p->n_ops;
  g_autofree int *ends = g_new(int, MAX(n, 1));
  int marks = sim_graph_layer_ends(g, ends);
  g_autofree gboolean *cut_ok = g_new0(gboolean, MAX(n, 1));
  for (int i = 0; i < marks; i++)
    if (ends[i] >= 0 && ends[i] < n - 1)
      cut_ok[ends[i]] = TRUE;
  if (marks == 0)
    for (int op = 0; op < n - 1; op++)
      cut_ok[op] = TRUE;
  g_autofree double *w = g_new0(double, n + 1);
  for (int op = 0; op < n; op++)
    w[op + 1] = w[op] + search_estimate_dp_compute(e, op, p->n_devices);
  int layer = 0;
  for (int op = 0; op < n; op++) {
    layer_of[op] = layer;
    /* Cut once this layer holds its share of what is left. */
    if (cut_ok[op] && layer < n_layers - 1 && op < n - 1) {
      double target = w[n] * (layer + 1) / n_layers;
      if (w[op + 1] >= target)
        layer++;
    }
  }
  return layer + 1;
}

typedef struct _Alpa Alpa;
typedef struct {
  Alpa *al;
} AlpaStop;

static gboolean ilps_should_stop(Alpa *al);

static gboolean alpa_should_stop(gpointer data)
{
  return ilps_should_stop(((AlpaStop *)data)->al);
}

/* The ILP of one stage: layers [a, b] on a submesh. */
typedef struct {
  gboolean done;
  double latency;            /* per micro-batch; +inf when infeasible or unsolved     */
  SearchIlpStatus status;
  int n_ops;
  int *ops;
  int *cfg;                  /* the configuration (index) of each op                   */
  int *cfg_index;            /* and its position among the op's candidates             */
  gboolean unbound;          /* optimal, and memory did not bind                      */
  int mb;                    /* the micro-batch count the latency is for              */
  GArray **cands;            /* the candidates the program had, to reuse it            */
} StageSolve;

static void stage_clear(StageSolve *s)
{
  for (int v = 0; s->cands && v < s->n_ops; v++)
    g_array_unref(s->cands[v]);
  g_free(s->cands);
  g_free(s->ops);
  g_free(s->cfg);
  g_free(s->cfg_index);
  memset(s, 0, sizeof(*s));
}

static gboolean same_cands(GArray **a, GArray **b, int n)
{
  for (int v = 0; v < n; v++)
    if (a[v]->len != b[v]->len || memcmp(a[v]->data, b[v]->data, sizeof(int) * a[v]->len))
      return FALSE;
  return TRUE;
}

struct _Alpa {
  const SearchProblem *p;
  SearchContext *ctx;
  SearchEstimate *e;
  int L;
  int *layer_of;
  int n_meshes;
  int mesh[16];
  int max_cands;
  double ilp_seconds;
  StageSolve *stage;         /* L x L x n_meshes, index (a * L + b) * n_meshes + m      */
  int ilps, ilps_optimal, ilps_limited, ilps_infeasible;
  double ilp_deadline;       /* seconds since the start: the programs stop here, leaving
                              * the rest of the budget to simulate their plans        */
  gboolean shortcut;         /* skip GLPK where variable elimination is provably optimal */
};

static gboolean ilps_should_stop(Alpa *al)
{
  return search_context_should_stop(al->ctx) ||
         search_context_elapsed(al->ctx) > al->ilp_deadline;
}

static StageSolve *stage_at(Alpa *al, int a, int b, int m)
{
  return &al->stage[((gsize)a * al->L + b) * al->n_meshes + m];
}

/* The ops of layers [a, b] (data sources left out). */
static GArray *stage_ops(Alpa *al, int a, int b)
{
  const SearchProblem *p = al->p;
  GArray *ops = g_array_new(FALSE, FALSE, sizeof(int));
  for (int op = 0; op < p->n_ops; op++)
    if (al->layer_of[op] >= a && al->layer_of[op] <= b &&
        sim_graph_op_type(p->g, op) != SIM_OP_INPUT)
      g_array_append_val(ops, op);
  return ops;
}

/* Counts a solve of status @status. */
static void count_solve(Alpa *al, SearchIlpStatus status)
{
  al->ilps++;
  if (status == SEARCH_ILP_OPTIMAL)
    al->ilps_optimal++;
  else if (status == SEARCH_ILP_FEASIBLE)
    al->ilps_limited++;
  else if (status == SEARCH_ILP_INFEASIBLE)
    al->ilps_infeasible++;
}

/* Solves the stage of layers [a, b] on submesh @m for @mb micro-batches, reusing the last
 * solve when the candidates are the same (the choice does not depend on mb then).  Returns
 * 0 where the search stopped first (the stage unchanged), 1 after a reuse, 2 after a
 * solve. */
static int solve_stage(Alpa *al, int a, int b, int m, int mb, int remaining, double share)
{
  const SearchProblem *p = al->p;
  StageSolve *st = stage_at(al, a, b, m);
  GArray *opsa = stage_ops(al, a, b);
  int n = (int)opsa->len;
  gint64 t0 = g_get_monotonic_time();
  GArray **cands = g_new0(GArray *, MAX(n, 1));
  AlpaStop stop = { al };
  SearchIlp *ilp = search_alpa_stage_ilp(p, al->e, (const int *)opsa->data, n, al->mesh[m], mb,
                                         al->max_cands, cands, alpa_should_stop, &stop);
  if (!ilp) {
    /* Stopped while it was being built: the stage stays unsolved. */
    for (int v = 0; v < n; v++)
      g_array_unref(cands[v]);
    g_free(cands);
    g_array_unref(opsa);
    return 0;
  }
  if (st->done && st->unbound && st->n_ops == n && same_cands(st->cands, cands, n)) {
    /* The same program with more room for activations (more micro-batches): the optimum
     * that memory did not bind stands, its latency per micro-batch scales. */
    st->latency = search_ilp_cost(ilp, st->cfg_index, NULL) / mb;
    st->mb = mb;
    for (int v = 0; v < n; v++)
      g_array_unref(cands[v]);
    g_free(cands);
    g_array_unref(opsa);
    search_ilp_free(ilp);
    return 1;
  }
  stage_clear(st);
  st->done = TRUE;
  st->mb = mb;
  st->n_ops = n;
  st->ops = (int *)g_array_free(opsa, FALSE);
  st->cands = cands;
  st->cfg = g_new0(int, MAX(n, 1));
  st->cfg_index = g_new0(int, MAX(n, 1));
  double seconds = al->ilp_seconds;
  if (al->ilp_deadline < G_MAXDOUBLE) {
    double left = al->ilp_deadline - search_context_elapsed(al->ctx);
    seconds = MIN(seconds, MAX(0.2, share * left / MAX(remaining, 1)));
  }
  StopHook hook = { alpa_should_stop, &stop, .shortcut = al->shortcut };
  double obj = INFINITY;
  gint64 t1 = g_get_monotonic_time();
  st->status = ilp_solve(ilp, seconds, &hook, st->cfg_index, &obj, &st->unbound);
  if (g_getenv("PARASOL_ALPA_TRACE"))
    g_printerr("alpa: layers %d-%d on %d devices, %d micro-batches: %d ops, %u pairs; built "
               "in %.3f s, solved in %.3f s (limit %.3f s): status %d, %g s\n", a, b,
               al->mesh[m], mb, n, ilp->pu->len, (t1 - t0) / 1e6,
               (g_get_monotonic_time() - t1) / 1e6, seconds, st->status, obj);
  count_solve(al, st->status);
  if (st->status == SEARCH_ILP_OPTIMAL || st->status == SEARCH_ILP_FEASIBLE) {
    st->latency = obj / mb;
    for (int v = 0; v < n; v++)
      st->cfg[v] = g_array_index(cands[v], int, st->cfg_index[v]);
  } else {
    st->latency = INFINITY;
  }
  search_ilp_free(ilp);
  return 2;
}

/* What a rank sends of a stage it solved in a pass: this, then the op's positions among
 * their candidates (cfg_index), as many ints as the problem has ops. */
typedef struct {
  gint32 how;                /* solve_stage()'s return                                 */
  gint32 status;
  gint32 unbound;
  gint32 mb;
  double latency;
} StageHead;

/* After a pass over the stages for @mb micro-batches divided among the ranks (task @t of
 * @tasks on rank t mod ranks, @how[t] what solve_stage() returned there): every rank holds
 * every stage as the rank that solved it does.  The others rebuild the candidates (the
 * estimate's, the same on every rank) rather than receive them. */
static void share_stages(Alpa *al, int mb, const int *tasks, int n_tasks, const int *how)
{
  SearchContext *ctx = al->ctx;
  if (!search_dist_on(ctx) || n_tasks == 0)
    return;
  const SearchProblem *p = al->p;
  gsize stride = sizeof(StageHead) + sizeof(int) * (gsize)MAX(p->n_ops, 1);
  g_autofree guint8 *buf = g_malloc0(stride * (gsize)n_tasks);
  for (int t = 0; t < n_tasks; t++) {
    if (!search_dist_mine(ctx, t) || how[t] == 0)
      continue;
    const StageSolve *st = stage_at(al, tasks[3 * t], tasks[3 * t + 1], tasks[3 * t + 2]);
    StageHead h = { how[t], st->status, st->unbound, st->mb, st->latency };
    memcpy(buf + stride * (gsize)t, &h, sizeof h);
    memcpy(buf + stride * (gsize)t + sizeof h, st->cfg_index, sizeof(int) * (gsize)st->n_ops);
  }
  search_dist_share(ctx, n_tasks, buf, stride, stride);
  for (int t = 0; t < n_tasks; t++) {
    StageHead h;
    memcpy(&h, buf + stride * (gsize)t, sizeof h);
    if (search_dist_mine(ctx, t) || h.how == 0)
      continue;
    int m = tasks[3 * t + 2];
    StageSolve *st = stage_at(al, tasks[3 * t], tasks[3 * t + 1], m);
    stage_clear(st);
    GArray *ops = stage_ops(al, tasks[3 * t], tasks[3 * t + 1]);
    st->n_ops = (int)ops->len;
    st->ops = (int *)g_array_free(ops, FALSE);
    st->cands = g_new0(GArray *, MAX(st->n_ops, 1));
    st->cfg = g_new0(int, MAX(st->n_ops, 1));
    st->cfg_index = g_new0(int, MAX(st->n_ops, 1));
    memcpy(st->cfg_index, buf + stride * (gsize)t + sizeof h, sizeof(int) * (gsize)st->n_ops);
    for (int v = 0; v < st->n_ops; v++)
      st->cands[v] = stage_cands(p, al->e, st->ops[v], al->mesh[m], mb, al->max_cands);
    st->done = TRUE;
    st->status = (SearchIlpStatus)h.status;
    st->unbound = h.unbound;
    st->mb = h.mb;
    st->latency = h.latency;
    if (h.how == 2)
      count_solve(al, st->status);
    if (st->status == SEARCH_ILP_OPTIMAL || st->status == SEARCH_ILP_FEASIBLE)
      for (int v = 0; v < st->n_ops; v++)
        st->cfg[v] = g_array_index(st->cands[v], int, st->cfg_index[v]);
  }
}

/* The dynamic program over layer ranges and submeshes (Alpa §5.2), on the latencies
 * @lat of search-private.h's SearchAlpaPlan. */
gboolean search_alpa_dp(const double *lat, int L, const int *mesh, int n_meshes, int N, int mb,
                        SearchAlpaPlan *plan)
{
#define LAT(a, b, m) lat[((gsize)(a) * L + (b)) * n_meshes + (m)]
  /* The distinct finite stage latencies, the candidates for t_max, in increasing order. */
  GArray *ta = g_array_new(FALSE, FALSE, sizeof(double));
  for (int a = 0; a < L; a++)
    for (int b = a; b < L; b++)
      for (int m = 0; m < n_meshes; m++)
        if (isfinite(LAT(a, b, m)))
          g_array_append_val(ta, LAT(a, b, m));
  double *ts = (double *)ta->data;
  int nt = (int)ta->len;
  for (int i = 1; i < nt; i++)
    for (int j = i; j > 0 && ts[j - 1] > ts[j]; j--) {
      double x = ts[j];
      ts[j] = ts[j - 1];
      ts[j - 1] = x;
    }
  gsize stride = (gsize)N + 1;
  g_autofree double *F = g_new(double, (gsize)(L + 1) * stride);
  g_autofree int *arg_i = g_new0(int, (gsize)(L + 1) * stride);
  g_autofree int *arg_m = g_new0(int, (gsize)(L + 1) * stride);
  double best = INFINITY, best_tmax = INFINITY;
  /* Pass 0 finds the best t_max; pass 1 solves at it again, keeping the choices. */
  for (int pass = 0; pass < 2; pass++) {
    if (pass == 1 && !isfinite(best))
      break;
    for (int ti = 0; ti < (pass == 0 ? nt : 1); ti++) {
      double tmax = pass == 1 ? best_tmax : ts[ti];
      if (pass == 0 && ti > 0 && ts[ti] == ts[ti - 1])
        continue;
      if (pass == 0 && (mb - 1) * tmax >= best)
        break;
      for (int k = L; k >= 0; k--)
        for (int d = 0; d <= N; d++) {
          gsize at = (gsize)k * stride + d;
          F[at] = k == L && d == 0 ? 0 : INFINITY;
          if (k == L || d == 0)
            continue;
          for (int i = k; i < L; i++)
            for (int m = 0; m < n_meshes; m++) {
              if (mesh[m] > d || !(LAT(k, i, m) <= tmax))
                continue;
              double v = LAT(k, i, m) + F[(gsize)(i + 1) * stride + d - mesh[m]];
              if (v < F[at]) {
                F[at] = v;
                arg_i[at] = i;
                arg_m[at] = m;
              }
            }
        }
      double total = F[N] + (mb - 1) * tmax;
      if (pass == 0 && total < best) {
        best = total;
        best_tmax = tmax;
      }
    }
  }
  g_array_unref(ta);
  if (!isfinite(best))
    return FALSE;
  plan->S = 0;
  double sum = 0, mx = 0;
  for (int k = 0, d = N; k < L;) {
    gsize at = (gsize)k * stride + d;
    if (!isfinite(F[at]) || plan->S >= SEARCH_ALPA_MAX_STAGES)
      return FALSE;
    int i = arg_i[at], m = arg_m[at];
    plan->first[plan->S] = k;
    plan->last[plan->S] = i;
    plan->mesh[plan->S] = m;
    plan->S++;
    sum += LAT(k, i, m);
    mx = MAX(mx, LAT(k, i, m));
    k = i + 1;
    d -= mesh[m];
  }
  plan->predicted = sum + (mb - 1) * mx;
  return TRUE;
#undef LAT
}

static gboolean alpa_dp(Alpa *al, int mb, SearchAlpaPlan *plan)
{
  gsize n = (gsize)al->L * al->L * al->n_meshes;
  g_autofree double *lat = g_new(double, n);
  for (gsize i = 0; i < n; i++)
    lat[i] = al->stage[i].done && al->stage[i].mb == mb ? al->stage[i].latency : INFINITY;
  return search_alpa_dp(lat, al->L, al->mesh, al->n_meshes, al->p->n_devices, mb, plan);
}

/* The strategy of @plan with @mb micro-batches (transfer full; NULL if invalid). */
static SimStrategy *alpa_strategy(Alpa *al, const SearchAlpaPlan *plan, int mb)
{
  const SearchProblem *p = al->p;
  const SimGraph *g = p->g;
  int n = p->n_ops;
  g_autoptr(SimStrategy) s = search_problem_new_strategy(p);
  sim_strategy_set_microbatches(s, mb);
  /* Devices by decreasing submesh size: every block starts at a multiple of its size. */
  int order[SEARCH_ALPA_MAX_STAGES], offset[SEARCH_ALPA_MAX_STAGES];
  for (int i = 0; i < plan->S; i++)
    order[i] = i;
  for (int i = 1; i < plan->S; i++)
    for (int j = i; j > 0 && al->mesh[plan->mesh[order[j - 1]]] < al->mesh[plan->mesh[order[j]]];
         j--) {
      int x = order[j];
      order[j] = order[j - 1];
      order[j - 1] = x;
    }
  for (int i = 0, at = 0; i < plan->S; i++) {
    offset[order[i]] = at;
    at += al->mesh[plan->mesh[order[i]]];
  }
  g_autofree int *op_stage = g_new0(int, MAX(n, 1));
  g_autofree int *stage_of_layer = g_new0(int, al->L);
  for (int st = 0; st < plan->S; st++)
    for (int l = plan->first[st]; l <= plan->last[st]; l++)
      stage_of_layer[l] = st;
  SearchConfig *chosen = g_new0(SearchConfig, MAX(n, 1));
  g_autofree gboolean *set = g_new0(gboolean, MAX(n, 1));
  for (int st = 0; st < plan->S; st++) {
    const StageSolve *ss = stage_at(al, plan->first[st], plan->last[st], plan->mesh[st]);
    for (int v = 0; v < ss->n_ops; v++) {
      int op = ss->ops[v];
      chosen[op] = *search_problem_config(p, op, ss->cfg[v]);
      chosen[op].start += offset[st];
      op_stage[op] = st;
      set[op] = TRUE;
    }
  }
  /* Data sources enter at the stage of their first reader, split as it splits the batch. */
  for (int op = 0; op < n; op++) {
    if (set[op])
      continue;
    int reader = -1;
    for (int o = 0; o < sim_graph_op_n_outputs(g, op); o++) {
      int t = sim_graph_op_output(g, op, o);
      for (int c = 0; c < sim_graph_tensor_n_consumers(g, t); c++) {
        int r = sim_graph_tensor_consumer(g, t, c);
        if (set[r] && (reader < 0 || op_stage[r] < op_stage[reader]))
          reader = r;
      }
    }
    int st = reader >= 0 ? op_stage[reader] : stage_of_layer[al->layer_of[op]];
    op_stage[op] = st;
    int i = reader >= 0 ? search_matching_config(p, op, &chosen[reader]) : -1;
    if (i >= 0 && (sim_graph_op_dim_size(g, op, 0) / mb) %
                    search_problem_config(p, op, i)->degree[0] == 0) {
      chosen[op] = *search_problem_config(p, op, i);
    } else {
      SearchConfig c = { .start = offset[st], .n = 1 };
      for (int d = 0; d < SEARCH_MAX_DIMS; d++)
        c.degree[d] = 1;
      chosen[op] = c;
    }
  }
  gboolean ok = TRUE;
  for (int op = 0; op < n && ok; op++)
    ok = search_problem_apply_config(p, s, op, &chosen[op], NULL);
  g_free(chosen);
  if (!ok)
    return NULL;
  g_autofree const int **groups = g_new(const int *, plan->S);
  g_autofree int *sizes = g_new(int, plan->S);
  for (int st = 0; st < plan->S; st++) {
    groups[st] = p->devices + offset[st];
    sizes[st] = al->mesh[plan->mesh[st]];
  }
  if (!sim_strategy_set_stages(s, plan->S, op_stage, groups, sizes, NULL))
    return NULL;
  if (!sim_strategy_validate(s, g, p->m, NULL))
    return NULL;
  return g_steal_pointer(&s);
}

static gboolean alpa_run(const SearchAlgorithm *self, SearchContext *ctx, GError **error)
{
  const SearchProblem *p = search_context_get_problem(ctx);
  int n = p->n_ops;
  int n_layers = search_context_get_option_int_in(ctx, "layers", 8, 1, 64);
  int max_mb = search_context_get_option_int_in(ctx, "max-microbatches", 16, 1, G_MAXINT);
  int only_mb = search_context_get_option_int_in(ctx, "microbatches", 0, 0, G_MAXINT);
  Alpa al = { .p = p, .ctx = ctx };
  al.max_cands = search_context_get_option_int_in(ctx, "cands", 8, 1, 1024);
  al.ilp_seconds = search_context_get_option_double_in(ctx, "ilp-seconds", 10, 0.001, 3600);
  al.shortcut = !search_context_get_option_int_in(ctx, "glpk-always", 0, 0, 1);
  if (search_dist_should_stop(ctx))
    return TRUE;
  al.e = search_estimate_new(p);
  al.layer_of = g_new0(int, MAX(n, 1));
  al.L = cluster_layers(p, al.e, (p->kinds & SEARCH_KIND_PIPELINE) ? n_layers : 1, al.layer_of);
  for (int m = 1; m <= p->n_devices && al.n_meshes < 16; m *= 2)
    if (p->n_devices % m == 0 && ((p->kinds & SEARCH_KIND_PIPELINE) || m == p->n_devices))
      al.mesh[al.n_meshes++] = m;
  al.stage = g_new0(StageSolve, (gsize)al.L * al.L * al.n_meshes);

  /* The numbers of micro-batches: powers of two that divide every op's batch. */
  int mbs[32], n_mb = 0;
  int64_t batch = sim_graph_batch_size(p->g);
  for (int mb = 1; mb <= max_mb && n_mb < 32; mb *= 2) {
    if (only_mb && mb != only_mb)
      continue;
    if ((p->kinds & SEARCH_KIND_PIPELINE) || mb == 1)
      if (batch % mb == 0 && microbatches_divide(p, mb))
        mbs[n_mb++] = mb;
  }
  if (only_mb && n_mb == 0) {
    g_set_error(error, SEARCH_ERROR, SEARCH_ERROR_INVALID,
                "alpa: microbatches=%d: expected a power of two that divides the batch (%"
                G_GINT64_FORMAT ")%s", only_mb, batch,
                (p->kinds & SEARCH_KIND_PIPELINE) ? "" : " (1 without pipelines)");
    search_estimate_free(al.e);
    g_free(al.layer_of);
    g_free(al.stage);
    return FALSE;
  }

  double best_cost = INFINITY, best_pred = NAN;
  int per_mb = al.L * (al.L + 1) / 2 * al.n_meshes;
  /* The programs stop at 85% of a budget in seconds: the rest simulates their plans. */
  al.ilp_deadline = G_MAXDOUBLE;
  if (ctx->deadline < G_MAXDOUBLE) {
    double now = search_context_elapsed(ctx);
    al.ilp_deadline = now + 0.85 * MAX(0.0, ctx->deadline - now);
  }
  /* The stages of a pass: longest ranges and largest submeshes first, so that a pass cut
   * short by the budget still has the single-stage plans and the few-stage ones.  Under
   * MPI task t of a pass runs on rank t mod ranks, and the ranks then share the stages
   * (share_stages()). */
  g_autofree int *tasks = g_new(int, 3 * (gsize)MAX(per_mb, 1));  /* a, b, m each */
  int n_tasks = 0;
  for (int len = al.L; len >= 1; len--)
    for (int a = 0; a + len <= al.L; a++)
      for (int m = al.n_meshes - 1; m >= 0; m--) {
        tasks[3 * n_tasks] = a;
        tasks[3 * n_tasks + 1] = a + len - 1;
        tasks[3 * n_tasks + 2] = m;
        n_tasks++;
      }
  g_autofree int *how = g_new0(int, MAX(n_tasks, 1));
  for (int bi = 0; bi < n_mb && !search_dist_any(ctx, ilps_should_stop(&al)); bi++) {
    int mb = mbs[bi];
    for (int t = 0; t < n_tasks; t++) {
      how[t] = 0;
      if (!search_dist_mine(ctx, t) || ilps_should_stop(&al))
        continue;
      /* The ILPs left for this micro-batch count share half of what is left of the
       * budget, all of it for the last count (the later counts reuse the programs whose
       * candidates do not change). */
      how[t] = solve_stage(&al, tasks[3 * t], tasks[3 * t + 1], tasks[3 * t + 2], mb,
                           per_mb - t, bi + 1 < n_mb ? 0.5 : 1.0);
    }
    share_stages(&al, mb, tasks, n_tasks, how);
    search_dist_sync(ctx);
    if (search_dist_should_stop(ctx))
      break;
    SearchAlpaPlan plan;
    if (!alpa_dp(&al, mb, &plan))
      continue;
    g_autoptr(SimStrategy) s = alpa_strategy(&al, &plan, mb);
    if (!s)
      continue;
    double c = search_fit(ctx, &s);
    if (c < best_cost || isnan(best_pred)) {
      if (c < best_cost || !isfinite(best_cost)) {
        best_cost = c;
        best_pred = plan.predicted;
        search_context_set_prediction(ctx, plan.predicted, c);
      }
    }
    search_context_set_current(ctx, c);
  }
  for (gsize i = 0; i < (gsize)al.L * al.L * al.n_meshes; i++)
    stage_clear(&al.stage[i]);
  g_free(al.stage);
  g_free(al.layer_of);
  search_estimate_free(al.e);
  /* GLPK's environment of this thread (the driver runs each search on its own). */
  glp_free_env();
  return TRUE;
}

static const SearchOptionSpec alpa_options[] = {
  { "layers", "layers the operators are clustered into for the stage program (default 8)" },
  { "cands", "candidate shardings per operator in each stage's ILP (default 8)" },
  { "max-microbatches", "the most micro-batches tried, powers of two (default 16)" },
  { "microbatches", "only this number of micro-batches (default 0: each power of two)" },
  { "ilp-seconds", "GLPK's time limit per stage ILP, within the budget (default 10)" },
  { "glpk-always", "1: solve every stage ILP with GLPK, 0: not where variable elimination is "
                   "exact and fits in memory, which is then the optimum (default)" },
  { NULL, NULL },
};

const SearchAlgorithm search_algo_alpa = {
  .api_version = SEARCH_ALGORITHM_API_VERSION,
  .name = "alpa",
  .description = "Alpa's search: an integer linear program (GLPK) over operator shardings "
                 "inside stages, a dynamic program over layer ranges and submeshes",
  .run = alpa_run,
  .options = alpa_options,
};
