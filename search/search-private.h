/* search-private.h — struct bodies and helpers shared by the files of libsearch.  Nothing
 * outside search/ (and its tests) includes this header. */
#pragma once

#include "parasol-search.h"

#include <math.h>
#include <stdatomic.h>

G_BEGIN_DECLS

/* ---------------------------------------------------------------------------------- */
/* Problems                                                                            */

/* The flag that cancels a problem's simulations (SimOptions.cancel), shared by the
 * problems derived from it: the number of watches that have fired on them. */
typedef struct {
  gint refcount;
  atomic_int flag;
} SearchCancelCell;

struct _SearchProblem {
  gint refcount;
  SearchCancelCell *cancel;
  const SimGraph *g;
  SimGraph *own_graph;        /* set when the problem owns its graph (a rewrite)        */
  int n_ops;
  const SimMachine *m;
  SimCostModel *cost;
  SimOptions sim;
  SimSyncOptions sync;
  SimMemoryOptions memory;
  gboolean memory_limit;
  SearchKinds kinds;
  int n_devices;
  int *devices;               /* problem device index -> machine device                 */
  GPtrArray *rewrites;        /* char*, NULL-terminated                                  */
  /* The candidate configurations of every op, built on first use.  The driver builds
   * them before any worker thread starts, so readers need no lock afterwards. */
  GMutex lock;
  GArray **configs;           /* n_ops arrays of SearchConfig, or NULL                   */
};

/* Builds the candidate lists if they are not built yet. */
void search_problem_prepare(const SearchProblem *p);
/* The index of @op's data-parallel configuration over the view (@start, @n): the sample
 * dimension split as far as it divides, within the view.  Always exists. */
int search_problem_dp_config(const SearchProblem *p, int op, int start, int n);
/* The strategy that gives every op the configuration @cfg[op] (indices into the lists),
 * with the problem's options and one stage (transfer full). */
SimStrategy *search_problem_strategy_from_configs(const SearchProblem *p, const int *cfg,
                                                  GError **error);
/* Copies @s with its devices mapped from problem indices to machine devices: builders that
 * number devices 0..n-1 then run on the problem's subset (transfer full). */
SimStrategy *search_problem_map_devices(const SearchProblem *p, const SimStrategy *s,
                                        GError **error);
/* sim_simulate_brief() of @s as the problem simulates it, bounded at @bound; with a
 * memory limit the run also stops where a device first overflows (a plan that does not
 * fit costs INFINITY).  PARASOL_NO_BOUNDS: no bound, no stop. */
gboolean search_problem_brief(const SearchProblem *p, const SimStrategy *s, double bound,
                              SimBrief *b, GError **error);
/* The cost of an iteration of @t seconds whose fullest device uses @ratio of its memory
 * (@fits: every device fits): @t, or infinity when it did not run or, with a memory
 * limit, does not fit.  @time and @memory (may be NULL) receive @t and @ratio. */
double search_problem_cost(const SearchProblem *p, double t, double ratio, gboolean fits,
                           double *time, double *memory);
/* Iteration time, memory ratio and feasibility of a report under the problem's rules. */
double search_problem_report_cost(const SearchProblem *p, const SimReport *r, double *time,
                                  double *memory);

/* ---------------------------------------------------------------------------------- */
/* The context                                                                         */

typedef struct {
  double wall;
  gint64 evals;
  double best;
} SearchImprovement;

struct _SearchContext {
  SearchContext *root;        /* itself, or the context of the outermost search         */
  SearchProblem *problem;
  const SearchAlgorithm *algo;
  GHashTable *options;        /* key -> value (shared with inner contexts)              */
  guint64 seed;
  int threads;
  double time_budget;
  gint64 eval_budget;
  double deadline;            /* seconds since the root's start; G_MAXDOUBLE: none      */
  gint64 eval_base;           /* root evaluations when this context started             */
  gint64 eval_limit;          /* root evaluations at which it stops; G_MAXINT64: none   */

  /* Root only: the clock, the counters, the log, the progress line. */
  gint64 t0;                  /* monotonic microseconds                                 */
  _Atomic gint64 evals;
  _Atomic gint64 cut_evals;   /* evaluations stopped at a bound (search_evaluator_run_bounded) */
  atomic_int interrupted;     /* Ctrl-C, or a malformed option value                    */
  gboolean handle_sigint;
  SearchWatch *watch;         /* cancels the simulations at the deadline or a signal      */
  GError *option_error;       /* the first malformed option value                       */
  GMutex lock;                /* best, log, progress, option_error                      */
  FILE *log;
  GArray *improvements;       /* SearchImprovement                                      */
  gboolean progress;
  gint64 last_progress;
  gboolean progress_tty;   /* stderr a terminal: one line redrawn; else a line a while  */
  gboolean progress_shown;
  double current;
  gint64 full_evals;          /* search_context_evaluate() calls, for tie keys          */
  SimStrategy *expert;        /* the fastest expert plan, when an algorithm went through  */
  double expert_cost;         /* them all (search_start_expert), for the yardstick        */
  SimStrategy *partial_expert; /* the best of a sweep cut short, and its cost            */
  double partial_cost;
  int expert_plans;           /* the expert plans of the last sweep over them all, and    */
  int expert_simulated;       /* how many of them it simulated before it had to stop      */

  /* Every context: its best (the root's is the search's result). */
  double best_cost;
  guint64 best_key;
  SimStrategy *best;
  SearchProblem *best_problem;

  /* Root only: search_context_set_prediction()'s figures (NAN: none). */
  double predicted, predicted_simulated;
};

/* Records one evaluation of @s (on @p) with cost @cost; @key orders equal costs.  NAN: an
 * evaluation stopped at a bound, which changes neither the best nor the current cost. */
void search_context_record(SearchContext *ctx, const SearchProblem *p, const SimStrategy *s,
                           double cost, guint64 key);
/* A context for an inner search of @inner on @p that shares @ctx's clock, counters and
 * best, with a budget of @evals evaluations (0: what is left) and @seconds (0: what is
 * left).  Free with search_context_free_inner(). */
SearchContext *search_context_new_inner(SearchContext *ctx, const SearchAlgorithm *inner,
                                        SearchProblem *p, gint64 evals, double seconds);
void search_context_free_inner(SearchContext *inner);
/* An inner context on the same problem and algorithm with a share @share of what is left
 * of the budget (evaluations, or else seconds), or NULL when the budget is spent. */
SearchContext *search_context_new_share(SearchContext *ctx, double share);
/* Runs @inner in a new inner context and returns its best time (+inf); its best strategy
 * goes to @best when not NULL. */
double search_context_run_inner(SearchContext *ctx, const SearchAlgorithm *inner,
                                 SearchProblem *p, gint64 evals, double seconds,
                                 SimStrategy **best, GError **error);
/* search_context_evaluate() takes the next index among the full evaluations for its tie
 * key.  Work divided among threads or ranks reserves @n of them at once (the first is
 * returned) and evaluates each with its own, as evaluating them in turn would. */
gint64 search_context_reserve_full(SearchContext *ctx, gint64 n);
double search_context_evaluate_at(SearchContext *ctx, const SimStrategy *s, gint64 index);
/* The tie key of full evaluation @index. */
guint64 search_context_full_key(gint64 index);
/* Tie key for an evaluation: stream first, then the stream's own count. */
static inline guint64 search_key(guint32 stream, gint64 index)
{
  return ((guint64)stream << 40) | ((guint64)index & ((G_GUINT64_CONSTANT(1) << 40) - 1));
}

/* ---------------------------------------------------------------------------------- */
/* The analytic estimate (estimate.c)                                                  */

/* OptCNN's cost model: the time of an operator under a configuration (its shard's compute,
 * its weight-gradient all-reduce, the reduction of its partial sums) plus, for every edge
 * between two operators, the time to move the data the consumer's shards read from the
 * producer's, both passes.  The dynamic programs minimize its sum; the simulator then
 * judges what they find.  Not thread-safe: one per thread. */
typedef struct _SearchEstimate SearchEstimate;

SearchEstimate *search_estimate_new(const SearchProblem *p);
void search_estimate_free(SearchEstimate *e);
double search_estimate_node(SearchEstimate *e, int op, int cfg);
/* Edges join distinct ops (producer, consumer), one per pair whatever the tensors. */
int search_estimate_n_edges(const SearchEstimate *e);
void search_estimate_edge_ends(const SearchEstimate *e, int edge, int *src, int *dst);
double search_estimate_edge(SearchEstimate *e, int edge, int cfg_src, int cfg_dst);
/* The edges of @op (as src or dst), transfer none. */
const int *search_estimate_op_edges(const SearchEstimate *e, int op, int *n);
/* The sum of node and edge estimates of the configurations @cfg (per op). */
double search_estimate_total(SearchEstimate *e, const int *cfg);
/* Compute time of @op on @n devices, data parallel: what a pipeline stage costs. */
double search_estimate_dp_compute(SearchEstimate *e, int op, int n);

/* ---------------------------------------------------------------------------------- */
/* Variable elimination over pairwise costs (ve.c), shared by the dynamic programs     */

typedef struct _SearchVE SearchVE;

/* A problem over @n variables, variable v taking one of @k[v] values. */
SearchVE *search_ve_new(int n, const int *k);
void search_ve_free(SearchVE *ve);
/* Adds @cost (k[v] entries) to v's unary cost. */
void search_ve_add_unary(SearchVE *ve, int v, const double *cost);
/* Adds @cost (k[u] x k[v], row-major) to the pairwise cost of u and v (u != v). */
void search_ve_add_pair(SearchVE *ve, int u, int v, const double *cost);
/* Marks @v as kept: it is not eliminated, and solve() returns costs as a function of the
 * kept variables (at most two). */
void search_ve_keep(SearchVE *ve, int v);
/* Eliminates every variable that is not kept: exactly while some has at most two
 * neighbours (OptCNN's node and edge eliminations), else by fixing the one with fewest
 * neighbours to its best value given the rest's minima.  Returns the number of such
 * fixes (0: the result is exact).  With kept variables a, b (in the order kept) the
 * minimum over the others for each (va, vb) goes to @table (k[a] x k[b]; k[a] with one
 * kept, a single number with none). */
int search_ve_solve(SearchVE *ve, double *table);
/* After solve(): the values of all variables given the kept ones' @kept_values (in the
 * order kept), written to @values. */
void search_ve_assign(SearchVE *ve, const int *kept_values, int *values);

/* ---------------------------------------------------------------------------------- */
/* Shared pieces of the algorithms                                                     */

/* Sets @op's degrees and devices (as sim_strategy_set_op takes them), whether or not they
 * form a candidate configuration: how trials are undone. */
gboolean search_evaluator_set_op(SearchEvaluator *ev, int op, const int *degrees,
                                 const int *devices);
/* Sets @op as @from has it (its replicated shards too, which set_op cannot give). */
gboolean search_evaluator_copy_op(SearchEvaluator *ev, int op, const SimStrategy *from);
/* Sets the count of @ev's runs (search_evaluator_get_evals()) to @runs: its next run's
 * tie key is then search_key(its stream, @runs + 1), whichever evaluator ran before.  How
 * work divided among threads or ranks keys every trial as one evaluator would. */
void search_evaluator_set_runs(SearchEvaluator *ev, gint64 runs);

/* One simulation of @s from scratch (folded, as search_context_evaluate()'s), stopping
 * once past @bound seconds: its cost, or +inf with *@cut set when it stopped there (and
 * *@overflowed when some device's memory had overflowed by then).  @key orders equal
 * costs for the best. */
double search_context_evaluate_bounded(SearchContext *ctx, const SimStrategy *s, double bound,
                                       guint64 key, gboolean *cut, gboolean *overflowed);
/* The cost an algorithm compares strategies by: the time of a feasible one; for one that
 * does not fit, its time scaled up by a thousand and by how far it overflows, so that
 * every feasible strategy ranks first and the less infeasible ones next. */
double search_penalized(const SearchEvaluator *ev, double cost);

/* Evaluates @s and, when it does not fit in memory, the same strategy saving more memory:
 * optimizer states sharded over data-parallel replicas (ZeRO-1), then activations
 * recomputed, then both, then both with the optimizer offloaded to the host.  Replaces *s by the first variant that fits and returns its time
 * (+inf, *s unchanged, when none does).  The data-parallel baseline, which the algorithms
 * also start from, is made to fit this way. */
double search_fit(SearchContext *ctx, SimStrategy **s);
/* Whether @s trades time for memory: recomputation, ZeRO-1 or several micro-batches in
 * one stage (the plans whose whole-plan changes can pay, local.c and mcmc.c). */
gboolean search_plan_saves_memory(const SimStrategy *s);
/* Step 0, 1 or 2 of that ladder from the options @base; step 3, past it, adds the
 * optimizer offloaded to the host (SimMemoryOptions.offload) to both. */
SimMemoryOptions search_memory_step(SimMemoryOptions base, int step);
#define SEARCH_MEMORY_STEPS 4
/* The data-parallel strategy made to fit (transfer full) and its time. */
SimStrategy *search_start_data_parallel(SearchContext *ctx, double *cost, GError **error);
/* The fastest expert plan made to fit (transfer full; NULL if none fits) and its time:
 * constructive algorithms start from the better of it and data parallelism.  With
 * @single_stage, only plans without a pipeline (for algorithms that build single-stage
 * plans operator by operator); else pipelined ones too, where an algorithm only needs a
 * plan to start from and to beat. */
SimStrategy *search_start_expert(SearchContext *ctx, gboolean single_stage, double *cost);
/* The same over the plans of @stages: 0 all, 1 single-stage, 2 pipelined; *@complete
 * (if given) tells whether every one of them was simulated within the budget. */
SimStrategy *search_start_expert_stages(SearchContext *ctx, int stages, double *cost,
                                        gboolean *complete, SimMegatronOptions *opts);
/* Megatron's plan space past its rules, from the plan of @o (the expert's winner, of cost
 * *@cost, held in *@s): a local search over the interleaved schedule's model chunks,
 * sequence parallelism and its overlap of tensor-parallel communication with GEMMs, the
 * micro-batch size, recomputation, ZeRO-1, the gradient
 * buckets and trades of devices between tensor and pipeline or pipeline and data
 * parallelism, one change at a time, each simulated and kept when faster, until no change
 * helps or the budget ends.  Replaces *@s and *@cost with the fastest plan found and
 * returns the number of changes kept. */
int search_refine_megatron(SearchContext *ctx, SimStrategy **s, double *cost,
                           const SimMegatronOptions *o);
/* The changes of @o's context-parallel degree (devices traded with tensor, pipeline or
 * data parallelism), of its expert-parallel degree (twice or half, mixtures of experts),
 * of its ZeRO stage (one up or down) and of the overlap of its sequence parallelism's
 * collectives with their GEMMs (on or off) that the refinement tries, into @out (room for
 * SEARCH_KNOB_MAX); returns how many. */
#define SEARCH_KNOB_MAX 32
int search_megatron_knob_neighbours(const SearchProblem *p, const SimMegatronOptions *o,
                                    SimMegatronOptions *out);
/* The options that search_megatron_plan() builds @s from, when it is such a plan exactly;
 * FALSE otherwise (a per-operator plan, or one the summary cannot name). */
gboolean search_megatron_options_of(const SearchProblem *p, const SimStrategy *s,
                                    SimMegatronOptions *out);
/* Whether @g has self-attention over sequences of 8,192 tokens or more (the expert plans
 * then use context parallelism for the devices the batch leaves), and whether it has a
 * mixture-of-experts operator. */
gboolean search_long_context(const SimGraph *g);
gboolean search_has_experts(const SimGraph *g);
/* The same for a plan with a pipeline (@o's pp > 1; others are left as they are), within a
 * share @share of what is left of the budget. */
void search_refine_pipeline(SearchContext *ctx, double share, SimStrategy **s, double *cost,
                            const SimMegatronOptions *o);
/* Keeps @s, the fastest of all expert plans (of time @cost), for the search's result:
 * `parasol search` reports it as its yardstick instead of simulating them all again.
 * Only for the search's own problem, and only the first time. */
void search_context_keep_expert(SearchContext *ctx, const SimStrategy *s, double cost);
/* The best of the expert plans a sweep cut short by the deadline or a signal had
 * simulated (search_result_get_expert_best()). */
void search_context_keep_partial_expert(SearchContext *ctx, const SimStrategy *s, double cost);
/* Replaces *@best (of time *@cost) by that expert plan where the plan is faster; a
 * pipelined winner first refined by search_refine_megatron() within a quarter of what is
 * left of the budget. */
void search_prefer_expert(SearchContext *ctx, gboolean single_stage, SimStrategy **best,
                          double *cost);

/* The candidate of @op on the same devices with the same split of the batch as @c (an
 * operator of another shape following @c), or -1. */
int search_matching_config(const SearchProblem *p, int op, const SearchConfig *c);

/* Greedy local search with the simulator: sweeps over the ops in order, trying each of
 * the candidate configurations @cands[op] (NULL: all), alone and together with the
 * producers only the op reads, and keeping the best that lowers the time, until a sweep
 * changes nothing, @max_sweeps passes (0: no limit) or the budget ends.  Starts from and
 * updates @s; returns its time. */
double search_polish(SearchContext *ctx, SimStrategy **s, GArray *const *cands, int max_sweeps,
                     guint32 stream);
/* Up to @max candidate configurations of @op for constructive algorithms: the best by the
 * estimate, per number of devices, always with the data-parallel one over all devices
 * (config indices; transfer full). */
GArray *search_shortlist(const SearchProblem *p, SearchEstimate *e, int op, int max);

/* The dynamic programs, for the pipeline search and the tests: the configurations they
 * choose (per op) for the problem, by the estimate, with at most @max_cands candidates per
 * operator (and view).  OptCNN's returns the estimate's sum for its choice.  Unity's returns
 * its own objective, in which branches on disjoint halves of a view cost the slower of
 * them; without @splits every branch shares the devices, and the objective is the sum. */
double search_dp_optcnn(const SearchProblem *p, SearchEstimate *e, int max_cands, int *cfg);
double search_dp_unity(const SearchProblem *p, SearchEstimate *e, int max_cands,
                       gboolean splits, int *cfg);
/* Candidates for local search: every configuration of an op that has few, else the
 * shortlist and every placement of its best few degree vectors (transfer full). */
GArray *search_polish_candidates(const SearchProblem *p, SearchEstimate *e, int op, int max);

/* Expert plans (baselines.c): candidate strategies of the Megatron rules and "one weird
 * trick", appended to @out (SimStrategy*, transfer full).  With @parents (int per
 * candidate), also the whole-batch plans' variants with gradient accumulation, each with
 * the index of its whole-batch plan (-1 for the others). */
void search_expert_candidates(const SearchProblem *p, GPtrArray *out, GArray *parents,
                              GArray *opts);
/* The same with only the options (required) of the Megatron-style plans: their entries
 * of @out are NULL, to build with search_megatron_plan() when they are simulated. */
/* A closed-form estimate of the iteration time of the Megatron plan @o (seconds) and
 * whether it fits in memory (plan-estimate.c), for ranking plans before simulating
 * them; no simulation. */
double search_megatron_estimate(const SearchProblem *p, const SimMegatronOptions *o,
                                gboolean *fits);
/* Some of the terms search_megatron_estimate() adds up (plan-estimate.c). */
typedef struct {
  double time;             /* the estimate, seconds                                     */
  double compute;          /* the GEMM work, with the recomputation's                   */
  double experts;          /* of which the experts'                                     */
  double expert_rows;      /* tokens one expert of a GPU takes a micro-batch            */
  double alltoall;         /* the experts' all-to-alls, seconds                         */
  double alltoall_bytes;   /* what a GPU sends in one of them                           */
  double states;           /* bytes a GPU of the first stage keeps: weights, gradients  */
                           /* and optimizer states                                      */
  double expert_states;    /* of which the experts'                                     */
  double memory;           /* states and the activations held                           */
  gboolean fits;           /* memory below 95% of a device                              */
} SearchPlanTerms;
double search_megatron_estimate_terms(const SearchProblem *p, const SimMegatronOptions *o,
                                      SearchPlanTerms *out);
/* Whether plan @o cannot fit in the problem's device memory, by a lower bound on the
 * bytes its weights and gradients take (no simulation): such plans are not simulated. */
gboolean search_megatron_cannot_fit(const SearchProblem *p, const SimMegatronOptions *o);
/* The expert plan ranked @rank (0: first; past the last, the last) by
 * search_megatron_estimate() among those that can fit, built and not simulated; NULL if
 * none can fit. */
SimStrategy *search_ranked_expert_plan(const SearchProblem *p, int rank);
/* The @max plans of Megatron's plan space around the expert plans (each with 1 to 8
 * interleaved model chunks, sequence parallelism or not, each recomputation, ZeRO-1 or
 * not) that search_megatron_estimate() ranks first, those it expects to fit first, into
 * @out; returns how many. */
int search_estimated_plans(const SearchProblem *p, int max, SimMegatronOptions *out);
/* The first of the @tries plans search_estimated_plans() ranks first that the simulator
 * finds to fit, simulated in that order (transfer full; NULL if none within the budget),
 * its time in *@cost and its options in *@opts. */
SimStrategy *search_start_estimated(SearchContext *ctx, int tries, double *cost,
                                    SimMegatronOptions *opts);
void search_expert_candidates_lazy(const SearchProblem *p, GPtrArray *out, GArray *parents,
                                   GArray *opts);
/* With @opts (SimMegatronOptions per candidate), each candidate's options for
 * sim_strategy_megatron(), dp 0 for one weird trick.  The plan of @o on the problem's
 * devices, or NULL where the builder refuses it: */
SimStrategy *search_megatron_plan(const SearchProblem *p, const SimMegatronOptions *o);
SimStrategy *search_owt_strategy(const SearchProblem *p, GError **error);

/* Substitutions (substitutions.c): the rewrites applicable to @g, by name (transfer
 * full), and one rewrite applied. */
GPtrArray *search_rewrites_find(const SimGraph *g);
SimGraph *search_rewrite_apply(const SimGraph *g, const char *name, GError **error);
/* Carries @s (on @from) over to @to by operator names; ops without a counterpart get the
 * configuration of their first producer when it is valid, else data parallelism. */
SimStrategy *search_strategy_transfer(const SearchProblem *from, const SimStrategy *s,
                                      const SearchProblem *to);

/* Alpa's intra-stage integer linear program (alpa.c; built with GLPK only).  Variable v
 * chooses one of k[v] candidates at a cost unary[v][i]; a pair (u, v) adds pair[p][i x
 * k[v] + j] when u takes i and v takes j; with memory rows, the bytes mem[v][i x
 * n_devices + d] of every choice on device d sum to at most @capacity. */
typedef struct {
  int n;
  int *k;
  double **unary;
  GArray *pu, *pv;            /* int: the ends of each pair                             */
  GPtrArray *pair;            /* double[k[u] x k[v]] per pair                           */
  int n_devices;
  double capacity;
  double **mem;               /* NULL without memory rows                               */
} SearchIlp;

typedef enum {
  SEARCH_ILP_OPTIMAL,         /* proven optimal                                         */
  SEARCH_ILP_FEASIBLE,        /* the best integer solution found by the time limit      */
  SEARCH_ILP_INFEASIBLE,      /* no choice fits in memory                               */
  SEARCH_ILP_UNKNOWN,         /* none found by the time limit                           */
} SearchIlpStatus;

/* A program over @n variables with @k candidates each, costs zero; memory rows for
 * @n_devices devices of @capacity bytes when both are positive. */
SearchIlp *search_ilp_new(int n, const int *k, int n_devices, double capacity);
void search_ilp_free(SearchIlp *ilp);
void search_ilp_add_pair(SearchIlp *ilp, int u, int v, const double *cost);
/* The objective of @choice, and whether it fits in memory. */
double search_ilp_cost(const SearchIlp *ilp, const int *choice, gboolean *fits);
/* Solves with GLPK (Alpa's linearization: edge variables tied to both ends' choices by
 * equalities) within @seconds; the choice goes to @choice and its objective to @objective
 * when a solution was found (+inf otherwise). */
SearchIlpStatus search_ilp_solve(const SearchIlp *ilp, double seconds, int *choice,
                                 double *objective);
/* The program of one pipeline stage: the ops @ops on a submesh of @mesh devices (the
 * problem's first), @mb micro-batches, at most @max_cands candidates each (their
 * configuration indices go to @cands[v], transfer full).  NULL when @stop (may be NULL)
 * returned TRUE while it was being built. */
SearchIlp *search_alpa_stage_ilp(const SearchProblem *p, SearchEstimate *e, const int *ops,
                                 int n_ops, int mesh, int mb, int max_cands, GArray **cands,
                                 gboolean (*stop)(gpointer data), gpointer data);

/* Alpa's inter-stage dynamic program: layers 0..@L-1 cut into consecutive stages, stage
 * s on a submesh of mesh[plan->mesh[s]] devices, the submeshes covering @N devices
 * exactly, minimizing sum_s t_s + (@mb - 1) max_s t_s where t_s = @lat[(first x L + last)
 * x n_meshes + mesh index] (+inf: no such stage).  FALSE when no slicing is feasible. */
#define SEARCH_ALPA_MAX_STAGES 64
typedef struct {
  int S;
  int first[SEARCH_ALPA_MAX_STAGES], last[SEARCH_ALPA_MAX_STAGES], mesh[SEARCH_ALPA_MAX_STAGES];
  double predicted;           /* the objective                                         */
} SearchAlpaPlan;
gboolean search_alpa_dp(const double *lat, int L, const int *mesh, int n_meshes, int N, int mb,
                        SearchAlpaPlan *plan);

/* The built-in algorithms. */
extern const SearchAlgorithm search_algo_data_parallel;
extern const SearchAlgorithm search_algo_expert;
extern const SearchAlgorithm search_algo_megatron;
extern const SearchAlgorithm search_algo_owt;
extern const SearchAlgorithm search_algo_exhaustive;
extern const SearchAlgorithm search_algo_mcmc;
extern const SearchAlgorithm search_algo_optcnn;
extern const SearchAlgorithm search_algo_dp;
extern const SearchAlgorithm search_algo_pipeline;
extern const SearchAlgorithm search_algo_beam;
extern const SearchAlgorithm search_algo_subst;
extern const SearchAlgorithm search_algo_alpa;   /* with GLPK only */

/* What search_result_measure() keeps in a result (yardsticks.c). */
typedef struct _SearchMeasure SearchMeasure;
void search_measure_free(SearchMeasure *m);
/* The result's slot for it (driver.c). */
SearchMeasure **search_result_measure_slot(SearchResult *r);

/* A search's result (result.c), filled by search_run() (driver.c). */
struct _SearchResult {
  SearchProblem *problem;
  SimStrategy *best;
  double time;
  SimStrategy *expert;
  double expert_time;
  gint64 evals;
  gint64 cut_evals;
  double elapsed;
  gboolean interrupted;
  gboolean abandoned;
  int expert_plans, expert_simulated;
  SimStrategy *partial_expert;
  double partial_time;
  GArray *improvements;
  char *log_error;   /* why the log could not be written to its end, or NULL */
  SearchMeasure *measure;   /* the yardsticks and the plan kept (yardsticks.c), or NULL */
  double predicted, predicted_simulated;   /* search_context_set_prediction()        */
};

/* Signals and watches (signals.c): whether search_signals_catch() holds the signals now;
 * a watch's thread stopped and its cancellation taken back. */
gboolean search_signals_caught(void);
void search_watch_stop(SearchWatch *w);

G_END_DECLS
