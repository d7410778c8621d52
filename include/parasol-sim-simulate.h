/* parasol-sim-simulate.h — part of libsim's public interface (parasol-sim.h, which includes
 * every part): simulation: options, reports, delta sessions, bounded runs. */
#pragma once

#include "parasol-sim-strategy.h"

G_BEGIN_DECLS

/* Simulation                                                                          */

typedef enum {
  SIM_DETAIL_STEPS,       /* collectives expanded into per-step transfers on real links  */
  SIM_DETAIL_FLOWS,       /* one flow per peer and collective, analytic step latencies   */
  SIM_DETAIL_COLLECTIVE,  /* one flow per collective over all the links it crosses, with
                           * its algorithm's analytic latency                         */
} SimDetail;

SIM_PUBLIC const char *sim_detail_name(SimDetail d);

/* Measured all-reduce times inside one node, by group size and message size
 * (colltable.c): CSV "gpus,bytes,seconds", as nccl-tests' all_reduce_perf measures them. */
#define SIM_COLL_TABLE_MAX_GPUS 64
typedef struct _SimCollTable SimCollTable;
SIM_PUBLIC SimCollTable *sim_coll_table_load(const char *path, GError **error);
SIM_PUBLIC void sim_coll_table_free(SimCollTable *t);
SIM_PUBLIC const char *sim_coll_table_path(const SimCollTable *t);
/* The measured time of an all-reduce of @bytes over @n GPUs, interpolated between the
 * measured sizes; outside their range, the time of the nearest measured size, whose size
 * goes to *at_bytes (else @bytes does).  -1 when no group of @n GPUs was measured. */
SIM_PUBLIC double sim_coll_table_lookup(const SimCollTable *t, int n, double bytes,
                                        double *at_bytes);

typedef struct {
  SimDetail detail;
  gboolean fold;           /* simulate one of each set of symmetric devices            */
  gboolean keep_timeline;  /* record every task's start and end (traces, tests)        */
  /* Collectives: achieved fraction of link bandwidth (0 takes the default) and the fixed
   * cost of one algorithm step (negative takes the default). */
  double coll_bandwidth_efficiency;
  /* The same on NIC and network links (InfiniBand, Ethernet), whose achieved fraction of
   * line rate differs from NVLink's; 0: coll_bandwidth_efficiency. */
  double net_bandwidth_efficiency;
  double coll_step_latency;
  /* The fixed cost of one collective (its kernel's launch and the ranks' handshake);
   * negative takes the default, 0 none. */
  double coll_base_latency;
  /* The host's time to issue one kernel (a framework's dispatch and the launch call).
   * The host issues a device's kernels in stream order and waits for the transfers a
   * task receives from other pipeline stages; a task starts only once issued.  The
   * optimizer step counts no kernel of its own (fused optimizers update many tensors per
   * launch).  0: the host is never the bottleneck. */
  double host_kernel_time;
  /* The host's time between two steps of a device's schedule (a micro-batch's forward
   * or backward, the optimizer step): the training loop's own work before it issues the
   * step's first kernel (fetching the batch, setting up transfers, bookkeeping the loss).
   * 0: none. */
  double host_step_time;
  /* The host blocks after it sends to another device until the transfer has ended, so the
   * device's next kernels are issued only then (Megatron's point-to-point exchange between
   * pipeline stages waits on its requests and then calls torch.cuda.synchronize()).
   * FALSE: sends are asynchronous and the host runs on. */
  gboolean blocking_sends;
  /* Measured all-reduce times (NULL: none).  An all-reduce whose ranks share one node
   * and whose group size the table holds costs the measured time on an idle network:
   * the table sets its fixed cost, the ring's flows still share the links.  Borrowed:
   * it must outlive the simulations that use it. */
  const SimCollTable *allreduce_table;
  /* sim_simulate_brief() only: stop the run, cut, as soon as some device holds more than
   * its memory, which a search that rejects every plan that does not fit needs to know
   * and no more (SimBrief.overflowed then says so).  Reports always run to the end. */
  gboolean stop_at_overflow;
  /* Cancellation (NULL: none): a simulation polls this flag (between the lowering and the
   * run, and every few thousand events of the run) and, once it is nonzero, stops and
   * fails with SIM_ERROR_CANCELLED; a delta session's run ends cut, its time +inf.  A
   * search sets it at its deadline and on a signal, so a long simulation does not outlive
   * the budget.  Borrowed: it must outlive the simulations that use it. */
  const atomic_int *cancel;
  /* Exact accelerations of one simulation (docs/scale.md), on by default; each changes
   * how long a simulation takes, never (beyond a relative 1e-9) what it predicts.
   * merge_chains: a run of compute tasks that follow each other on a device, each
   * waiting only for the one before, runs as one task (not with host times, blocking
   * sends or keep_timeline, which need each task).  merge_rings: a collective's ring
   * lowered as a flow per rank runs as one flow where no other traffic crosses its links
   * (not with keep_timeline). */
  gboolean merge_chains;
  gboolean merge_rings;
  /* steady_state: a 1F1B or interleaved schedule with many micro-batches is simulated over
   * a few of them, and where the middle ones repeat each other exactly, the others are
   * added as whole periods (not with keep_timeline or GPipe; sim_simulate() runs two such
   * runs to measure what a period adds to every figure of the report). */
  gboolean steady_state;
  /* fold_checked: where the network does not map the data-parallel replicas' traffic onto
   * each other link by link (so that fold alone would not fold them) but every replica's
   * flows cross links like replica 0's, the replicas are folded all the same and the run
   * is checked: every folded replica's flow must have run when its representative's did,
   * or the run is made again without folding the replicas (only with fold).  Off by
   * default (sim_options_default()): a run that fails the check is made twice, and one
   * that passes keeps every replica's shadows, which stop rings from merging, so that it
   * is often slower than the run that folds less (docs/scale.md). */
  gboolean fold_checked;
  /* prune_shadows: a brief run (sim_simulate_brief()) of a folded plan leaves out the
   * shadows of folded devices whose links no simulated flow crosses, directly or through
   * other shadows: they change no simulated task's times, and each ends when its original
   * does (on a rail-optimized network, every shadow of a folded tensor-parallel rank).
   * Reports keep them (their links' bytes are reported). */
  gboolean prune_shadows;
  /* ring_steps: in a brief run whose chains merge, a tensor-parallel ring over a whole
   * node that one simulated device alone waits for is lowered as a step of that
   * device's stream, for the time the ring takes alone (not where data-parallel
   * replicas fold, nor under sequence parallelism).  Checked once the graph is whole:
   * a device whose stream runs something beside one of its rings, or whose rings' links
   * some other flow crosses, runs its rings as flows.  Tensor-parallel overlap's waits
   * (delays) become steps likewise, and delays again where the stream runs them beside
   * something. */
  gboolean ring_steps;
} SimOptions;

SIM_PUBLIC SimOptions sim_options_default(void);

typedef struct _SimReport SimReport;

/* Simulates one training iteration.  Returns NULL with @error set on invalid input; an
 * out-of-memory strategy still yields a report, whose sim_report_fits() is FALSE. */
SIM_PUBLIC SimReport *sim_simulate(const SimGraph *g, const SimMachine *m, const SimStrategy *s,
                                   SimCostModel *cost, const SimOptions *o, GError **error);
/* The plan of @o with the largest micro-batch that fits in device memory, for a plan
 * whose one micro-batch per replica does not: micro-batches of half, a quarter, ... of
 * the samples a device holds (those sizes that divide it), each built with
 * sim_strategy_megatron() and simulated with @so, until one fits (strategy-build.c).
 * Returns NULL when none fits; else the strategy, its report in @report and its
 * micro-batch size in @microbatch_size. */
SIM_PUBLIC SimStrategy *sim_strategy_megatron_fit(const SimGraph *g, const SimMachine *m,
                                                  const SimMegatronOptions *o,
                                                  SimCostModel *cost, const SimOptions *so,
                                                  SimReport **report, int64_t *microbatch_size);
SIM_PUBLIC void sim_report_free(SimReport *r);
SIM_PUBLIC double sim_report_iteration_time(const SimReport *r);
SIM_PUBLIC double sim_report_throughput(const SimReport *r);      /* samples/s */
SIM_PUBLIC double sim_report_token_throughput(const SimReport *r);
SIM_PUBLIC double sim_report_mfu(const SimReport *r);
SIM_PUBLIC gboolean sim_report_fits(const SimReport *r);
SIM_PUBLIC int64_t sim_report_peak_memory(const SimReport *r, int dev);
SIM_PUBLIC int64_t sim_report_max_peak_memory(const SimReport *r);
/* Bytes of @dev's optimizer states in host memory (SimMemoryOptions.offload; 0 without). */
SIM_PUBLIC int64_t sim_report_host_memory(const SimReport *r, int dev);
SIM_PUBLIC double sim_report_compute_time(const SimReport *r, int dev);
SIM_PUBLIC double sim_report_comm_time(const SimReport *r, int dev);
SIM_PUBLIC int64_t sim_report_n_tasks(const SimReport *r);
SIM_PUBLIC double sim_report_overlap_time(const SimReport *r, int dev);
SIM_PUBLIC double sim_report_idle_time(const SimReport *r, int dev);
SIM_PUBLIC int sim_report_n_devices(const SimReport *r);
/* Whether symmetric devices were folded, in words ("data-parallel replicas and
 * tensor-parallel ranks", "none"). */
SIM_PUBLIC const char *sim_report_folding(const SimReport *r);
/* How the steady state of the schedule was extrapolated, in words ("35 and 36 of 192
 * micro-batches, then 0.0712 s per micro-batch"), or NULL where every micro-batch was
 * simulated (SimOptions.steady_state). */
SIM_PUBLIC const char *sim_report_steady(const SimReport *r);
/* Time of the critical path spent in tasks of @cls ("forward", "backward", "recompute",
 * "update", "transfer", "reduction", "grad-sync", "param-sync") or waiting ("idle"). */
SIM_PUBLIC double sim_report_critical_time(const SimReport *r, const char *cls);
/* The recorded timeline (with keep_timeline): task @i's kind ("compute", "flow", "delay",
 * "nop"), class, device, peer, operator, micro-batch, start and end. */
typedef struct {
  const char *kind;
  const char *cls;
  int device, peer, op, mb, shard;
  double bytes;
  double start, end;
} SimTaskRecord;
SIM_PUBLIC int64_t sim_report_n_records(const SimReport *r);
SIM_PUBLIC gboolean sim_report_record(const SimReport *r, int64_t i, SimTaskRecord *out);
SIM_PUBLIC void sim_report_print(const SimReport *r, FILE *out);
SIM_PUBLIC char *sim_report_to_json(const SimReport *r);
SIM_PUBLIC gboolean sim_report_write_trace(const SimReport *r, const char *path, GError **error);
/* The same, keeping only the tracks of @devices (NULL: all): their compute and
 * communication, and the links of the transfers and collectives they take part in.
 * @n_events, if given, receives the number of timed events written. */
SIM_PUBLIC gboolean sim_report_write_trace_devices(const SimReport *r, const char *path,
                                                   const int *devices, int n_devices,
                                                   int64_t *n_events, GError **error);

/* What a search needs of one simulation, without a report. */
typedef struct {
  double time;        /* the iteration time; after a cut, a lower bound past the bound
                       * (past an overflow, the time the run had reached)                */
  gboolean cut;       /* the run stopped at its bound (or, asked to, at an overflow)     */
  gboolean fits;      /* every device within its memory (as far as the run went)         */
  gboolean overflowed;/* some device over its memory by the end of the run, cut or not   */
  double max_ratio;   /* the largest ratio of peak memory to capacity                    */
  int64_t n_tasks;    /* the tasks the engine ran, after the exact accelerations
                       * (docs/scale.md): the short run's where the steady state served */
} SimBrief;

/* sim_simulate() without the report, folding as it does, with the engine stopping at the
 * first event past @bound seconds (INFINITY: none): a run past the bound ends cut, its
 * time then a lower bound of the iteration time.  With SimOptions.stop_at_overflow it also
 * ends cut, overflowed, when a device first holds more than its memory.  Up to the bound
 * the run is sim_simulate()'s, so a run that is not cut has its time and memory.  FALSE with @error
 * for a strategy that is not valid or whose schedule cannot run. */
SIM_PUBLIC gboolean sim_simulate_brief(const SimGraph *g, const SimMachine *m, const SimStrategy *s,
                                       SimCostModel *cost, const SimOptions *o, double bound,
                                       SimBrief *out, GError **error);

/* Delta simulation: a simulator that keeps its task graph and timeline between calls.
 * After sim_session_set_op() changes some operators, sim_session_run() re-lowers and
 * re-simulates only what the changes touch.  Results equal those of sim_simulate(). */
typedef struct _SimSession SimSession;
SIM_PUBLIC SimSession *sim_session_new(const SimGraph *g, const SimMachine *m, const SimStrategy *s,
                                       SimCostModel *cost, const SimOptions *o, GError **error);
SIM_PUBLIC void sim_session_free(SimSession *ss);
SIM_PUBLIC gboolean sim_session_set_op(SimSession *ss, int op, const int *degrees,
                                       const int *devices, GError **error);
/* Sets @op as @from (a strategy of the same graph) has it, its copies of redundant shards
 * included, which sim_session_set_op() cannot give. */
SIM_PUBLIC gboolean sim_session_copy_op(SimSession *ss, int op, const SimStrategy *from,
                                        GError **error);
SIM_PUBLIC double sim_session_run(SimSession *ss);
/* The same, but the engine stops at the first event past @bound seconds: the result is
 * then a lower bound of the iteration time, above @bound, and sim_session_cut() is TRUE
 * (a search that only asks whether a candidate beats a threshold needs no more).  Up to
 * the bound the run is the unbounded one; a later call with a larger bound, or
 * sim_session_run(), sim_session_report() and sim_session_memory(), run it again. */
SIM_PUBLIC double sim_session_run_bounded(SimSession *ss, double bound);
SIM_PUBLIC gboolean sim_session_cut(const SimSession *ss);
SIM_PUBLIC const SimStrategy *sim_session_get_strategy(const SimSession *ss);
SIM_PUBLIC SimReport *sim_session_report(SimSession *ss);
/* What a search needs of the last run without building a report: the largest ratio of a
 * device's peak memory to its capacity, and whether every device fits (as the report's
 * peak_memory_bytes and fits say).  FALSE if the last run deadlocked. */
SIM_PUBLIC gboolean sim_session_memory(SimSession *ss, double *max_ratio, gboolean *fits);
/* Where the last sim_session_run*() spent its wall time, in seconds: re-lowering the
 * changed operators, assembling the flat task graph, running the engine (0 for a phase
 * it did not need).  For benchmarks; the clock costs three reads a run. */
SIM_PUBLIC void sim_session_last_phases(const SimSession *ss, double *relower, double *assemble,
                                        double *engine);

G_DEFINE_AUTOPTR_CLEANUP_FUNC(SimReport, sim_report_free)
G_DEFINE_AUTOPTR_CLEANUP_FUNC(SimSession, sim_session_free)

G_END_DECLS
