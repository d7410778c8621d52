/* parasol-search.h — the public interface of libsearch.
 *
 * libsearch finds fast parallelization strategies by asking the simulator
 * (docs/architecture.md, "How a search asks the simulator").  A problem is a graph on a
 * machine with a cost model and constraints (memory capacity, the kinds of parallelism
 * allowed, the devices to use).  An algorithm is a
 * struct of function pointers registered by name; the driver runs it with a context that
 * owns the budget (seconds or evaluations), the seed, the worker threads, the log of
 * improvements, the progress line and interruption, and that keeps the best strategy any
 * evaluation found.  Algorithms talk to the simulator only through this context and the
 * public API of libsim.
 *
 * Built in: data-parallel, expert (Megatron-style plans), owt ("one weird trick"),
 * exhaustive, mcmc (FlexFlow), optcnn and dp (dynamic programming after OptCNN and
 * Unity), pipeline (stage partitioning), beam and subst (Unity's substitutions searched
 * jointly with an inner algorithm).  External algorithms load from shared objects. */
#pragma once

#include "parasol-sim.h"

G_BEGIN_DECLS

#define SEARCH_PUBLIC __attribute__((visibility("default")))

/* ---------------------------------------------------------------------------------- */
/* Errors                                                                              */

#define SEARCH_ERROR (search_error_quark())
typedef enum {
  SEARCH_ERROR_UNKNOWN,      /* an unknown algorithm or option                           */
  SEARCH_ERROR_INVALID,      /* an impossible budget, constraint or option value          */
  SEARCH_ERROR_PLUGIN,       /* a plugin that cannot be loaded or has the wrong version   */
  SEARCH_ERROR_TOO_LARGE,    /* a problem too large for the algorithm (exhaustive)        */
  SEARCH_ERROR_FAILED,       /* the algorithm failed                                     */
} SearchErrorCode;
SEARCH_PUBLIC GQuark search_error_quark(void);

/* ---------------------------------------------------------------------------------- */
/* Problems                                                                            */

/* Kinds of parallelism a problem allows: the roles of the operators' iteration dimensions
 * (SimDimRole) a strategy may split, and pipeline stages (docs/architecture.md). */
typedef enum {
  SEARCH_KIND_DATA = 1 << 0,       /* split sample dimensions                          */
  SEARCH_KIND_ATTRIBUTE = 1 << 1,  /* split spatial and sequence dimensions            */
  SEARCH_KIND_PARAMETER = 1 << 2,  /* split output channels, features, heads           */
  SEARCH_KIND_REDUCTION = 1 << 3,  /* split contracted dimensions (partial sums)       */
  SEARCH_KIND_PIPELINE = 1 << 4,   /* pipeline stages over device groups               */
  SEARCH_KIND_ALL = 0x1f,
} SearchKinds;

/* Parses "data,parameter,pipeline" (also "model" for parameter and reduction, "spatial"
 * and "sequence" for attribute, "all"); SEARCH_ERROR_UNKNOWN names a bad word. */
SEARCH_PUBLIC gboolean search_kinds_parse(const char *text, SearchKinds *out, GError **error);

typedef struct _SearchProblem SearchProblem;

/* A problem on @g, @m and @cost, which it borrows: they must outlive it.  By default it
 * uses every device, allows every kind of parallelism, counts a strategy that does not
 * fit in device memory as infeasible, and gives its strategies the default options of
 * sim_megatron_options_default() (mixed precision, Adam, overlapped ring all-reduce). */
SEARCH_PUBLIC SearchProblem *search_problem_new(const SimGraph *g, const SimMachine *m,
                                                SimCostModel *cost);
SEARCH_PUBLIC SearchProblem *search_problem_ref(SearchProblem *p);
SEARCH_PUBLIC void search_problem_unref(SearchProblem *p);

/* Settings; change them before a search starts. */
SEARCH_PUBLIC void search_problem_set_sim_options(SearchProblem *p, const SimOptions *o);
SEARCH_PUBLIC void search_problem_set_sync(SearchProblem *p, const SimSyncOptions *o);
SEARCH_PUBLIC void search_problem_set_memory(SearchProblem *p, const SimMemoryOptions *o);
/* Whether strategies that do not fit in device memory are infeasible (default TRUE). */
SEARCH_PUBLIC void search_problem_set_memory_limit(SearchProblem *p, gboolean on);
SEARCH_PUBLIC void search_problem_set_kinds(SearchProblem *p, SearchKinds kinds);
/* Restricts the search to @n devices of the machine (distinct, in the order given). */
SEARCH_PUBLIC gboolean search_problem_set_devices(SearchProblem *p, const int *devices, int n,
                                                  GError **error);

SEARCH_PUBLIC const SimGraph *search_problem_get_graph(const SearchProblem *p);
SEARCH_PUBLIC const SimMachine *search_problem_get_machine(const SearchProblem *p);
SEARCH_PUBLIC SimCostModel *search_problem_get_cost(const SearchProblem *p);
SEARCH_PUBLIC SimOptions search_problem_get_sim_options(const SearchProblem *p);
SEARCH_PUBLIC gboolean search_problem_get_memory_limit(const SearchProblem *p);
SEARCH_PUBLIC SearchKinds search_problem_get_kinds(const SearchProblem *p);
/* The devices the search may use (transfer none). */
SEARCH_PUBLIC const int *search_problem_get_devices(const SearchProblem *p, int *n);
/* Graph rewrites the problem's graph carries (substitutions); NULL-terminated. */
SEARCH_PUBLIC const char *const *search_problem_get_rewrites(const SearchProblem *p);

/* The same problem on @g (taken), a rewrite of the problem's graph by @rewrite (a name
 * recorded in every strategy of the new problem, after the rewrites it already has). */
SEARCH_PUBLIC SearchProblem *search_problem_derive(const SearchProblem *p, SimGraph *g,
                                                   const char *rewrite);

/* A strategy with the problem's options, one stage over the problem's devices, and every
 * operator on the first of them (transfer full). */
SEARCH_PUBLIC SimStrategy *search_problem_new_strategy(const SearchProblem *p);

/* Simulates @s outside any budget.  Returns its iteration time, or +inf when it is
 * infeasible (invalid, deadlocked, or out of memory under the memory limit); stores the
 * report in @report when not NULL. */
SEARCH_PUBLIC double search_problem_simulate(const SearchProblem *p, const SimStrategy *s,
                                             SimReport **report, GError **error);

/* ---------------------------------------------------------------------------------- */
/* Per-operator configurations                                                         */

#define SEARCH_MAX_DIMS 8

/* One parallel configuration of an operator: a degree per iteration dimension and a
 * device view, the @n consecutive problem devices from index @start (FlexFlow's machine
 * views: blocks aligned to their size).  @n is the product of the degrees. */
typedef struct {
  int degree[SEARCH_MAX_DIMS];
  int start;
  int n;
} SearchConfig;

/* The candidate configurations of @op under the problem's constraints: degrees over
 * splittable dimensions of allowed kinds that divide their dimensions (a reduction never
 * under a fused activation, whose partial sums it could not take), with a product that
 * divides the number of devices, on every aligned view.  The list is fixed for the
 * problem's life; index 0 is the operator on the first device alone. */
SEARCH_PUBLIC int search_problem_n_configs(const SearchProblem *p, int op);
SEARCH_PUBLIC const SearchConfig *search_problem_config(const SearchProblem *p, int op, int i);
/* The index of @c in @op's list, or -1. */
SEARCH_PUBLIC int search_problem_find_config(const SearchProblem *p, int op,
                                             const SearchConfig *c);
/* The index of the configuration @s gives @op, or -1 if it is not a candidate. */
SEARCH_PUBLIC int search_problem_config_of(const SearchProblem *p, const SimStrategy *s, int op);
/* Writes the machine devices of @c's shards, in the strategy's shard order, to @devices
 * (c->n entries). */
SEARCH_PUBLIC void search_problem_config_devices(const SearchProblem *p, const SearchConfig *c,
                                                 int *devices);
SEARCH_PUBLIC gboolean search_problem_apply_config(const SearchProblem *p, SimStrategy *s,
                                                   int op, const SearchConfig *c,
                                                   GError **error);
/* "b=4 n=2 @0-7" */
SEARCH_PUBLIC char *search_problem_config_to_string(const SearchProblem *p, int op,
                                                    const SearchConfig *c);

/* ---------------------------------------------------------------------------------- */
/* Baselines the commands compare against                                              */

/* Every operator data parallel over the problem's devices (transfer full). */
SEARCH_PUBLIC SimStrategy *search_problem_data_parallel(const SearchProblem *p, GError **error);
/* The best of the expert plans (Megatron-style tensor, pipeline and data parallelism
 * after Narayanan et al. SC'21, with the distributed optimizer and full recomputation for
 * plans that would not fit otherwise, "one weird trick" for networks with convolutions,
 * and data parallelism), simulated outside any budget.  Its time goes to @time; when none
 * is feasible, returns NULL with @time +inf and no error. */
SEARCH_PUBLIC SimStrategy *search_problem_expert(const SearchProblem *p, double *time,
                                                 GError **error);

/* ---------------------------------------------------------------------------------- */
/* The context an algorithm runs in                                                    */

typedef struct _SearchContext SearchContext;

SEARCH_PUBLIC const SearchProblem *search_context_get_problem(const SearchContext *ctx);
SEARCH_PUBLIC guint64 search_context_get_seed(const SearchContext *ctx);
SEARCH_PUBLIC int search_context_get_threads(const SearchContext *ctx);
/* The budget: evaluations (0: none) and seconds (0: none). */
SEARCH_PUBLIC gint64 search_context_get_eval_budget(const SearchContext *ctx);
SEARCH_PUBLIC double search_context_get_time_budget(const SearchContext *ctx);
SEARCH_PUBLIC gint64 search_context_get_evals(const SearchContext *ctx);
/* Evaluations left in the budget (G_MAXINT64 without an evaluation budget). */
SEARCH_PUBLIC gint64 search_context_evals_left(const SearchContext *ctx);
SEARCH_PUBLIC double search_context_elapsed(const SearchContext *ctx);
/* TRUE once the budget is spent or the user interrupted: algorithms poll it and return. */
SEARCH_PUBLIC gboolean search_context_should_stop(const SearchContext *ctx);

/* Algorithm options ("key=value" from the command line).  The getters return @def when
 * the key is absent; a malformed value, or one outside [@lo, @hi] for the _in getters,
 * stops the search, which then fails with a message naming the algorithm, the option and
 * what it expects. */
SEARCH_PUBLIC const char *search_context_get_option(const SearchContext *ctx, const char *key);
SEARCH_PUBLIC double search_context_get_option_double(const SearchContext *ctx, const char *key,
                                                      double def);
SEARCH_PUBLIC int search_context_get_option_int(const SearchContext *ctx, const char *key,
                                                int def);
SEARCH_PUBLIC double search_context_get_option_double_in(const SearchContext *ctx,
                                                         const char *key, double def, double lo,
                                                         double hi);
SEARCH_PUBLIC int search_context_get_option_int_in(const SearchContext *ctx, const char *key,
                                                   int def, int lo, int hi);

/* A random generator for stream @stream of the context's seed: the same seed and stream
 * give the same numbers, whatever the threads do (transfer full; g_rand_free). */
SEARCH_PUBLIC GRand *search_context_rand_new(const SearchContext *ctx, guint32 stream);

/* The best feasible strategy any evaluation found so far, and its time (+inf, NULL when
 * none).  The strategy is a copy (transfer full) on the problem's graph or, under
 * substitutions, on a rewritten graph. */
SEARCH_PUBLIC double search_context_get_best(SearchContext *ctx, SimStrategy **best);

/* Evaluates @s with a full simulation: counts one evaluation and returns its time, or +inf
 * if it is infeasible.  Safe from worker threads. */
SEARCH_PUBLIC double search_context_evaluate(SearchContext *ctx, const SimStrategy *s);
/* Reports the cost of the algorithm's current state (for the log and progress line). */
SEARCH_PUBLIC void search_context_set_current(SearchContext *ctx, double cost);

/* Records what the algorithm's own cost model predicted for the plan it proposes
 * (seconds per iteration) and what the simulator found for that plan (+inf: it does not
 * fit), for the report: the gap between an analytic model and the simulator.  The last
 * call counts. */
SEARCH_PUBLIC void search_context_set_prediction(SearchContext *ctx, double predicted,
                                                 double simulated);

/* Runs @fn(@i, @data) for i in [0, @n) on the context's worker threads and waits for
 * all.  Each task must use its own evaluators and random streams; what it computes must
 * not depend on the order tasks run in. */
SEARCH_PUBLIC void search_context_parallel(SearchContext *ctx, int n,
                                           void (*fn)(int i, gpointer data), gpointer data);

/* ---------------------------------------------------------------------------------- */
/* Delta evaluation                                                                    */

/* An evaluator keeps a strategy and its simulation (a SimSession): changing a few
 * operators and running again re-simulates only what they touch.  One evaluator belongs
 * to one thread at a time. */
typedef struct _SearchEvaluator SearchEvaluator;

/* A new evaluator at @start (copied).  @stream orders equal-cost discoveries between
 * evaluators deterministically (use the task index). */
SEARCH_PUBLIC SearchEvaluator *search_evaluator_new(SearchContext *ctx, const SimStrategy *start,
                                                    guint32 stream, GError **error);
SEARCH_PUBLIC void search_evaluator_free(SearchEvaluator *ev);
/* Sets @op's configuration; FALSE (and nothing changed) if it is not valid. */
SEARCH_PUBLIC gboolean search_evaluator_set_config(SearchEvaluator *ev, int op,
                                                   const SearchConfig *c);
/* Simulates the current strategy: counts one evaluation, records it with the driver and
 * returns its time, or +inf if it is infeasible. */
SEARCH_PUBLIC double search_evaluator_run(SearchEvaluator *ev);
/* The same for a search that only needs to know whether the candidate costs at most
 * @bound: past it the simulation stops, and the result is a lower bound of the cost,
 * above @bound (such evaluations count, are not offered as the best, and are reported by
 * search_result_get_cut_evals()). */
SEARCH_PUBLIC double search_evaluator_run_bounded(SearchEvaluator *ev, double bound);
/* The last run's time whether or not it fits, and its peak memory over capacity on the
 * fullest device (1.0 means full): algorithms that walk through infeasible strategies
 * use them to measure how far from feasible they are. */
SEARCH_PUBLIC double search_evaluator_last_time(const SearchEvaluator *ev);
SEARCH_PUBLIC double search_evaluator_last_memory(const SearchEvaluator *ev);
SEARCH_PUBLIC const SimStrategy *search_evaluator_get_strategy(const SearchEvaluator *ev);
/* Caps this evaluator's runs at @max_evals (0: no cap beyond the budget).  Algorithms that
 * run several evaluators in parallel give each a share of the evaluation budget, so the
 * result does not depend on which thread runs faster. */
SEARCH_PUBLIC void search_evaluator_set_limit(SearchEvaluator *ev, gint64 max_evals);
/* TRUE when this evaluator's cap is reached or the context should stop. */
SEARCH_PUBLIC gboolean search_evaluator_should_stop(const SearchEvaluator *ev);
SEARCH_PUBLIC gint64 search_evaluator_get_evals(const SearchEvaluator *ev);

/* ---------------------------------------------------------------------------------- */
/* Algorithms                                                                          */

/* An option an algorithm reads with search_context_get_option*(). */
typedef struct {
  const char *name;
  const char *help;   /* one line, with the default */
} SearchOptionSpec;

/* The interface of a search algorithm (docs/extending.md).  New slots go at the end. */
#define SEARCH_ALGORITHM_API_VERSION 1
typedef struct _SearchAlgorithm SearchAlgorithm;
struct _SearchAlgorithm {
  int api_version;                   /* SEARCH_ALGORITHM_API_VERSION                    */
  const char *name;                  /* required: unique, lower case, no spaces          */
  const char *description;           /* required: one line for `parasol search --list`   */
  /* Required.  Searches until it is done or search_context_should_stop(); every strategy
   * it evaluates through the context is a candidate, and the driver returns the best.
   * Returns FALSE with @error set only on a failure, never for running out of budget. */
  gboolean (*run)(const SearchAlgorithm *self, SearchContext *ctx, GError **error);
  /* Optional (NULL: none): the options it reads, ended by an entry with a NULL name. */
  const SearchOptionSpec *options;
  /* Optional: data of the implementation, untouched by the driver. */
  gpointer user_data;
};

/* Registers the built-in algorithms (once; later calls do nothing). */
SEARCH_PUBLIC void search_register_builtins(void);
/* Registers @a (not copied: it must live as long as the process).  Errors: a wrong
 * api_version, a missing name, description or run, a name already taken. */
SEARCH_PUBLIC gboolean search_register(const SearchAlgorithm *a, GError **error);
SEARCH_PUBLIC const SearchAlgorithm *search_lookup(const char *name);
/* The registered algorithms in registration order. */
SEARCH_PUBLIC int search_n_algorithms(void);
SEARCH_PUBLIC const SearchAlgorithm *search_algorithm_get(int i);

/* A plugin is a shared object that exports this function; it returns its algorithm. */
#define SEARCH_PLUGIN_INIT_SYMBOL "parasol_search_plugin_init"
typedef const SearchAlgorithm *(*SearchPluginInitFunc)(void);
/* Loads the plugin at @path through GModule, checks its api_version and registers its
 * algorithm, which it returns (transfer none).  The module stays loaded. */
SEARCH_PUBLIC const SearchAlgorithm *search_load_plugin(const char *path, GError **error);

/* ---------------------------------------------------------------------------------- */
/* The driver                                                                          */

typedef struct {
  double time_budget;            /* seconds; 0: none                                   */
  gint64 eval_budget;            /* evaluations; 0: none                               */
  guint64 seed;
  int threads;                   /* worker threads; 0: one                             */
  const char *log_path;          /* CSV of improvements; NULL: none                    */
  gboolean progress;             /* progress on stderr: a line redrawn on a terminal,
                                  * else a line every 5 s                              */
  gboolean handle_sigint;        /* Ctrl-C and SIGTERM stop the search, keep the best  */
  const char *const *options;    /* "key=value" algorithm options, NULL-terminated     */
  /* A deadline past the budget's (g_get_monotonic_time() microseconds; 0: none), such as
   * the end of a command's whole budget: the search stops there too. */
  gint64 deadline_us;
} SearchRunOptions;

/* What a plan is in Megatron's terms.  TP and DP are the largest degrees any operator
 * has over its tensor dimensions (parameters, reductions, sequence) and over its samples;
 * PP the stages per model chunk; uniform, whether every operator is split over DP
 * replicas and over TP ranks or not at all (a Megatron-style plan); the op counts say
 * how a per-operator plan splits its operators (an operator may count in several). */
typedef struct {
  int tp, pp, dp;
  int microbatches;
  int64_t microbatch_size;       /* samples per micro-batch and replica; 0: uneven      */
  SimSchedule schedule;
  int chunks;                    /* model chunks per stage (1 but interleaved)          */
  gboolean sequence_parallel;
  SimRecompute recompute;
  gboolean zero1;
  int64_t bucket_bytes;          /* gradient buckets; 0: one collective per weight      */
  gboolean uniform;
  int n_ops, ops_data, ops_parameter, ops_reduction, ops_attribute, ops_unsplit;
  int zero;                      /* the ZeRO stage: 0 (none) to 3 (weights sharded)     */
  /* Context parallelism (the strategy's ring degree; its position splits are not counted
   * in TP) and expert parallelism (how many of the DP replicas split the experts of
   * every mixture-of-experts operator; its expert splits are not counted in TP). */
  int cp, ep;
  gboolean tp_comm_overlap;      /* sim_strategy_get_tp_comm_overlap()                   */
  double offload;                /* the optimizer's share on the host (SimMemoryOptions)  */
  /* The experts' own tensor-parallel degree (each expert's width split that many ways,
   * Megatron-Core's expert groups of ep x etp ranks); tp where they split like the rest. */
  int etp;
} SearchPlanSummary;

SEARCH_PUBLIC void search_plan_summarize(const SimGraph *g, const SimStrategy *s,
                                         SearchPlanSummary *out);
/* One line: "TP 8, PP 16, DP 8, 192 micro-batches of 1, 1f1b, ZeRO-1, buckets 24 MiB"
 * ("TP 2, CP 4, PP 1, DP 2, EP 2, ..." with context or expert parallelism, "EP 8, ETP 1"
 * where the experts' tensor-parallel degree is not TP's). */
SEARCH_PUBLIC char *search_plan_summary_text(const SearchPlanSummary *p);

/* Signals.  search_signals_catch() makes SIGINT (Ctrl-C) and SIGTERM ask the searches to
 * stop, keeping their best, and the command to wrap up (search_signals_seen() counts
 * them); a third signal kills the process as the signal would have.  search_run() with
 * handle_sigint catches them for its own run when the caller has not. */
SEARCH_PUBLIC void search_signals_catch(void);
SEARCH_PUBLIC void search_signals_release(void);
SEARCH_PUBLIC int search_signals_seen(void);
/* The signal that stopped the command (SIGINT or SIGTERM), 0 if none. */
SEARCH_PUBLIC int search_signals_first(void);

/* A watch cancels the simulations of @p and of the problems derived from it
 * (SimOptions.cancel) at @deadline_us (g_get_monotonic_time() microseconds; 0: never)
 * or, with @signals, once a caught signal arrives: a simulation under way then fails with
 * SIM_ERROR_CANCELLED, and so does every one started until search_watch_free(). */
typedef struct _SearchWatch SearchWatch;
SEARCH_PUBLIC SearchWatch *search_watch_new(SearchProblem *p, gint64 deadline_us,
                                            gboolean signals);
SEARCH_PUBLIC gboolean search_watch_fired(const SearchWatch *w);
SEARCH_PUBLIC void search_watch_free(SearchWatch *w);

SEARCH_PUBLIC SearchRunOptions search_run_options_default(void);
/* Parses "60s", "2m", "1h", "5000evals", "5000" (evaluations) into @o's budget. */
SEARCH_PUBLIC gboolean search_parse_budget(const char *text, SearchRunOptions *o,
                                           GError **error);

typedef struct _SearchResult SearchResult;

/* Runs @algo on @p.  Without any budget the search stops after 60 s.  Returns NULL with
 * @error set on bad options or a failure of the algorithm; a search that found nothing
 * feasible still returns a result, without a strategy.  With an evaluation budget the
 * same seed and number of threads give the same strategy, however the threads are
 * scheduled; a budget in seconds depends on how fast the machine simulates. */
SEARCH_PUBLIC SearchResult *search_run(const SearchAlgorithm *algo, SearchProblem *p,
                                       const SearchRunOptions *o, GError **error);
SEARCH_PUBLIC void search_result_free(SearchResult *r);
/* The best strategy (NULL if none was feasible), its time (+inf) and its graph: the
 * problem's, or a rewrite of it whose rewrites the strategy records (transfer none). */
SEARCH_PUBLIC const SimStrategy *search_result_get_strategy(const SearchResult *r);
SEARCH_PUBLIC double search_result_get_time(const SearchResult *r);
SEARCH_PUBLIC const SimGraph *search_result_get_graph(const SearchResult *r);
SEARCH_PUBLIC const SearchProblem *search_result_get_problem(const SearchResult *r);
SEARCH_PUBLIC gint64 search_result_get_evals(const SearchResult *r);
/* Of those, the evaluations stopped at a bound (search_evaluator_run_bounded()). */
SEARCH_PUBLIC gint64 search_result_get_cut_evals(const SearchResult *r);
/* The fastest expert plan (search_problem_expert()'s candidates, without data parallelism
 * itself) and its time, when the algorithm simulated them all on its way; else NULL. */
SEARCH_PUBLIC const SimStrategy *search_result_get_expert(const SearchResult *r, double *time);
/* How many of the expert plans (*@plans of them; 0: the algorithm did not go through
 * them) the search simulated before its deadline or a signal stopped it. */
SEARCH_PUBLIC int search_result_get_expert_progress(const SearchResult *r, int *plans);
/* The expert plan of search_result_get_expert(), or, where the sweep over them was cut
 * short, the best of those it simulated; NULL if none. */
SEARCH_PUBLIC const SimStrategy *search_result_get_expert_best(const SearchResult *r,
                                                               double *time);
SEARCH_PUBLIC double search_result_get_elapsed(const SearchResult *r);
/* The figures of search_context_set_prediction(); FALSE (NAN) when the algorithm set none. */
SEARCH_PUBLIC gboolean search_result_get_prediction(const SearchResult *r, double *predicted,
                                                    double *simulated);
/* Whether the search stopped on Ctrl-C or SIGTERM. */
SEARCH_PUBLIC gboolean search_result_get_interrupted(const SearchResult *r);
/* Why the log (SearchRunOptions.log_path) could not be written to its end, or NULL. */
SEARCH_PUBLIC const char *search_result_get_log_error(const SearchResult *r);
/* Whether the algorithm had not returned by its deadline (plus a grace of 2% of the
 * budget, at least 0.5 s) and was left running: the result is the best it had
 * reported by then. */
SEARCH_PUBLIC gboolean search_result_get_abandoned(const SearchResult *r);
/* How many algorithms the process's searches left running (search_result_get_abandoned(),
 * the yardsticks' expert runs included) have not returned yet: while any has not, the
 * problems, graphs and machines they were given must stay. */
SEARCH_PUBLIC gint search_algorithms_left_running(void);
/* The improvements in order: wall time (s), evaluations so far and the new best time. */
SEARCH_PUBLIC int search_result_n_improvements(const SearchResult *r);
SEARCH_PUBLIC void search_result_get_improvement(const SearchResult *r, int i, double *wall,
                                                 gint64 *evals, double *best);
/* Wall time and evaluations when the best time first came within @fraction of the final
 * best (0.95: "time to 95%" means best <= final / 0.95). */
SEARCH_PUBLIC double search_result_time_to(const SearchResult *r, double fraction,
                                           gint64 *evals);

/* Yardsticks (yardsticks.c): what a search's plan is measured against, and the plan kept.
 * Data parallelism over every device and the fastest expert plan are simulated after the
 * search (the expert plans are taken from the search where its algorithm went through
 * them; data parallelism after them where it cannot fit); the expert yardstick is the faster of that plan and data parallelism where the
 * latter fits.  A search that gives way keeps the yardstick's plan where it is faster
 * than its own best: a budget too short for the search to reach it would otherwise leave
 * a plan slower than one simulated here. */
typedef struct {
  double data_parallel;          /* iteration time; +inf when not simulated             */
  gboolean data_parallel_fits;
  gboolean data_parallel_done;   /* simulated (not stopped by the deadline or a signal) */
  gboolean data_parallel_bound;  /* its weights and gradients alone exceed a device's
                                  * memory (a closed-form bound): simulated after the
                                  * expert plans, as time allows                        */
  double expert;                 /* the expert yardstick's time; +inf when none         */
  gboolean expert_is_dp;         /* the expert yardstick is data parallelism            */
  gboolean expert_complete;      /* every expert plan was simulated                     */
  int expert_plans;              /* how many there are (0: not gone through)            */
  int expert_simulated;          /* how many were simulated                             */
  double search_time;            /* the search's own best; +inf when none is feasible   */
  const char *kept;              /* "search", "data-parallel", "expert"; NULL: none     */
} SearchYardsticks;

/* The data-parallel yardstick alone: data parallelism over every device, simulated until
 * @deadline_us (as below) unless a signal was caught.  TRUE with its iteration time and
 * whether it fits in device memory (either may be NULL); FALSE, @time +inf, when it was
 * not simulated. */
SEARCH_PUBLIC gboolean search_problem_measure_data_parallel(SearchProblem *p,
                                                            gint64 deadline_us, double *time,
                                                            gboolean *fits);
/* Whether a search by @algo on @p gives way to a faster yardstick: a search does, the
 * fixed plans (data-parallel, expert, owt) do not, nor does a search from which some
 * kinds of parallelism were kept (SearchKinds), which the yardsticks do not heed. */
SEARCH_PUBLIC gboolean search_algorithm_gives_way(const SearchAlgorithm *algo,
                                                  const SearchProblem *p);
/* Simulates the yardsticks of @r, the result of a search on @p with the options @o, until
 * @deadline_us (g_get_monotonic_time() microseconds; 0: none) or a caught signal, and
 * decides the plan kept (with @give_way, the faster of the search's and the expert
 * yardstick's).  Returns the figures, which @r keeps (search_result_get_yardsticks()). */
SEARCH_PUBLIC const SearchYardsticks *search_result_measure(SearchResult *r, SearchProblem *p,
                                                            const SearchRunOptions *o,
                                                            gint64 deadline_us,
                                                            gboolean give_way);
/* The figures of search_result_measure(), or NULL before it. */
SEARCH_PUBLIC const SearchYardsticks *search_result_get_yardsticks(const SearchResult *r);
/* The plan kept (the search's own before search_result_measure()), the problem it is a
 * plan for and its time (transfer none). */
SEARCH_PUBLIC const SimStrategy *search_result_get_kept(const SearchResult *r,
                                                        const SearchProblem **problem,
                                                        double *time);

/* ---------------------------------------------------------------------------------- */
/* Substitutions                                                                       */

/* The graph @g rewritten by the rewrites named in @names, in order (transfer full). */
SEARCH_PUBLIC SimGraph *search_rewrite_graph(const SimGraph *g, const char *const *names,
                                             GError **error);
/* Loads strategy file @path for @g on @m, replaying first the graph rewrites it records
 * ("rewrites": [...]) so that its operators name those of the rewritten graph: the one
 * way simulate, exec and validate read a strategy file.  @graph receives the graph the
 * strategy is for (transfer full; a copy of @g when the file records no rewrite). */
SEARCH_PUBLIC SimStrategy *search_strategy_load(const char *path, const SimGraph *g,
                                                const SimMachine *m, SimGraph **graph,
                                                GError **error);

/* The rewrites the substitution search may apply to @g, by name ("merge-linears:q,k,v"),
 * each covered by a verified rule (transfer full; NULL-terminated). */
SEARCH_PUBLIC char **search_rewrites_list(const SimGraph *g);
/* Generates and verifies the set of substitution rules afresh (search/subst-gen.c) and
 * describes it: its size, how many rules were verified and rejected, per family, and the
 * time taken; with @rules, one line per rule too (transfer full). */
SEARCH_PUBLIC char *search_substitution_set_describe(gboolean rules);

/* ---------------------------------------------------------------------------------- */
/* Searches shared among MPI ranks (docs/distributed.md)                               */

/* Starts MPI where mpirun started this process among others (nothing otherwise, or when
 * it is already started); an error where this build has no MPI.  After it, search_run()
 * shares the searches of the algorithms that divide their work (mcmc, dp, subst and the
 * others of docs/distributed.md) among the ranks, every rank calling it alike: the same
 * seed, --threads and evaluation budget give the same plan on any number of ranks, and
 * every rank returns it. */
SEARCH_PUBLIC gboolean search_mpi_start(GError **error);
SEARCH_PUBLIC int search_mpi_rank(void);   /* 0 without MPI */
SEARCH_PUBLIC int search_mpi_size(void);   /* 1 without MPI */
/* Whether search_run() shares its search (default TRUE); FALSE: each rank searches alone,
 * as `parasol compare` runs its runs, one per rank. */
SEARCH_PUBLIC void search_mpi_set_shared(gboolean shared);
/* Collective: on rank 0, the @text of every rank in rank order (NULL-terminated, transfer
 * full); NULL on the others, or where a rank was lost.  Without MPI, { @text }. */
SEARCH_PUBLIC char **search_mpi_gather_text(const char *text);
/* The exchanges of this process's shared searches so far, the seconds spent in them
 * (waiting for the other ranks included) and the CPU seconds that took (may be NULL). */
SEARCH_PUBLIC void search_mpi_stats(gint64 *exchanges, double *seconds, double *cpu_seconds);
/* A rank waiting at an exchange gives the sharing up when it has heard nothing from another
 * rank for @seconds (default 30; 0: it waits for ever): every rank sends the others a word
 * twice a second from a thread of its own, wherever it runs.  Set it before
 * search_mpi_start(). */
SEARCH_PUBLIC void search_mpi_set_rank_timeout(double seconds);
/* What went wrong across ranks (a signal on another rank, a rank lost), or NULL. */
SEARCH_PUBLIC const char *search_mpi_note(void);

G_DEFINE_AUTOPTR_CLEANUP_FUNC(SearchProblem, search_problem_unref)
G_DEFINE_AUTOPTR_CLEANUP_FUNC(SearchEvaluator, search_evaluator_free)
G_DEFINE_AUTOPTR_CLEANUP_FUNC(SearchResult, search_result_free)
G_DEFINE_AUTOPTR_CLEANUP_FUNC(SearchWatch, search_watch_free)

G_END_DECLS
