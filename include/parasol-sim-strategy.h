/* parasol-sim-strategy.h — part of libsim's public interface (parasol-sim.h, which includes
 * every part): strategies: per-operator configurations, stages, schedules, memory options,
 * JSON. */
#pragma once

#include "parasol-sim-cost.h"

G_BEGIN_DECLS

/* Strategies                                                                          */

typedef enum {
  SIM_SCHEDULE_GPIPE,
  SIM_SCHEDULE_1F1B,
  SIM_SCHEDULE_INTERLEAVED,   /* interleaved 1F1B with several model chunks per stage */
} SimSchedule;

typedef enum {
  SIM_ALLREDUCE_RING,
  SIM_ALLREDUCE_TREE,
  SIM_ALLREDUCE_HIERARCHICAL,
} SimAllreduceAlgo;

typedef enum {
  SIM_RECOMPUTE_NONE,
  SIM_RECOMPUTE_SELECTIVE,
  SIM_RECOMPUTE_FULL,
} SimRecompute;

typedef enum {
  SIM_PRECISION_FP32,
  SIM_PRECISION_MIXED_FP16,  /* fp16 compute, fp32 master weights */
  SIM_PRECISION_MIXED_BF16,
  SIM_PRECISION_TF32,        /* fp32 tensors, GEMMs and convolutions on TF32 tensor cores */
  SIM_PRECISION_FP8,         /* mixed bf16 with the linear layers' GEMMs in FP8
                              * (Transformer Engine), on GPUs that have FP8 */
} SimPrecision;

/* Whether @p trains with 16-bit weights and fp32 master weights. */
#define SIM_PRECISION_IS_MIXED(p) \
  ((p) == SIM_PRECISION_MIXED_FP16 || (p) == SIM_PRECISION_MIXED_BF16 || (p) == SIM_PRECISION_FP8)

typedef enum { SIM_OPTIMIZER_SGD, SIM_OPTIMIZER_ADAM } SimOptimizer;

SIM_PUBLIC const char *sim_schedule_name(SimSchedule s);
SIM_PUBLIC const char *sim_allreduce_algo_name(SimAllreduceAlgo a);
SIM_PUBLIC const char *sim_recompute_name(SimRecompute r);
SIM_PUBLIC const char *sim_precision_name(SimPrecision p);
/* The same enumerations by name, as strategy files and the command line spell them (any
 * case); -1 for an unknown name. */
SIM_PUBLIC int sim_schedule_from_name(const char *name);
SIM_PUBLIC int sim_allreduce_algo_from_name(const char *name);
SIM_PUBLIC int sim_recompute_from_name(const char *name);
SIM_PUBLIC int sim_precision_from_name(const char *name);

typedef struct _SimStrategy SimStrategy;

/* A strategy for @g on @m with every operator on device 0, one stage, one micro-batch. */
SIM_PUBLIC SimStrategy *sim_strategy_new(const SimGraph *g, const SimMachine *m);
SIM_PUBLIC SimStrategy *sim_strategy_copy(const SimStrategy *s);
SIM_PUBLIC void sim_strategy_free(SimStrategy *s);
SIM_PUBLIC gboolean sim_strategy_equal(const SimStrategy *a, const SimStrategy *b);

/* Per-operator configuration: a degree for each iteration dimension and the devices of
 * the shards, in row-major order of the shard coordinates (the last dimension fastest).
 * @devices holds the product of the degrees entries. */
SIM_PUBLIC gboolean sim_strategy_set_op(SimStrategy *s, int op, const int *degrees,
                                        const int *devices, GError **error);
SIM_PUBLIC const int *sim_strategy_op_degrees(const SimStrategy *s, int op);
SIM_PUBLIC const int *sim_strategy_op_devices(const SimStrategy *s, int op, int *n);
SIM_PUBLIC int sim_strategy_op_n_shards(const SimStrategy *s, int op);

/* Pipeline: stage @i owns ops and a device group; sim_strategy_set_stages() replaces all
 * stages.  @op_stage gives the stage of every op; stage i runs on @stage_devices[i]
 * (@stage_n_devices[i] entries).  With the interleaved schedule, stage i runs on device
 * group i % (n_stages / chunks). */
SIM_PUBLIC gboolean sim_strategy_set_stages(SimStrategy *s, int n_stages, const int *op_stage,
                                            const int *const *stage_devices,
                                            const int *stage_n_devices, GError **error);
SIM_PUBLIC int sim_strategy_n_stages(const SimStrategy *s);
SIM_PUBLIC int sim_strategy_op_stage(const SimStrategy *s, int op);
SIM_PUBLIC void sim_strategy_set_microbatches(SimStrategy *s, int n);
SIM_PUBLIC int sim_strategy_get_microbatches(const SimStrategy *s);
SIM_PUBLIC void sim_strategy_set_schedule(SimStrategy *s, SimSchedule sched, int chunks);
SIM_PUBLIC SimSchedule sim_strategy_get_schedule(const SimStrategy *s, int *chunks);
/* Whether the tensor-parallel ranks split the sequence outside their GEMMs (Megatron's
 * sequence parallelism). */
SIM_PUBLIC gboolean sim_strategy_get_sequence_parallel(const SimStrategy *s);
/* Whether sequence parallelism's all-gathers and reduce-scatters overlap the GEMMs that
 * consume and produce them (Transformer Engine's userbuffers; docs/formats.md). */
/* The parameters of the tensor-parallel overlap's pipelined reduce-scatters (Transformer
 * Engine's userbuffers, sim/lower-tensors.c): @chunks the GEMM and its reduce-scatter are
 * split into (0: the tensor-parallel degree; NeMo's configuration splits in 4), the SMs
 * the communication takes from the GEMM after attention (@sms_attention) and after any
 * other op (@sms_other). */
typedef struct {
  int chunks;
  int sms_attention;
  int sms_other;
} SimTpOverlap;

SIM_PUBLIC SimTpOverlap sim_tp_overlap_default(void);
SIM_PUBLIC void sim_strategy_set_tp_overlap(SimStrategy *s, const SimTpOverlap *p);
SIM_PUBLIC SimTpOverlap sim_strategy_get_tp_overlap(const SimStrategy *s);
SIM_PUBLIC gboolean sim_strategy_get_tp_comm_overlap(const SimStrategy *s);
/* Context parallelism (ring attention) over @cp ranks: every self-attention operator whose
 * query positions are split reads only its own positions of the keys and values and
 * receives the others' keys and values around the ring of the shards that split its
 * positions (sim/lower.c); 0 or 1: none (a shard of query positions then reads the whole
 * key and value input, the way an operator split by position reads its inputs).  The
 * Megatron builder sets it with SimMegatronOptions.cp. */
SIM_PUBLIC void sim_strategy_set_context_parallel(SimStrategy *s, int cp);
SIM_PUBLIC int sim_strategy_get_context_parallel(const SimStrategy *s);

typedef struct {
  SimAllreduceAlgo algorithm;
  int64_t bucket_bytes;       /* 0: one collective per weight                        */
  gboolean overlap;           /* start gradient sync during the backward pass        */
} SimSyncOptions;

typedef struct {
  SimRecompute recompute;
  gboolean zero1;             /* shard optimizer states over data-parallel replicas   */
  SimPrecision precision;
  SimOptimizer optimizer;
  /* ZeRO-2: with zero1, the gradients sharded too (each replica keeps the part of the
   * reduce-scattered gradients it updates); the communication is zero1's. */
  gboolean zero2;
  /* ZeRO-3 (FSDP's full sharding): with zero1 and zero2, the weights sharded too.  Each
   * bucket of weights is all-gathered before every micro-batch's forward and again before
   * its backward (one bucket ahead of the compute that needs it, as FSDP prefetches), and
   * its gradients are reduce-scattered after every micro-batch's backward; no all-gather
   * follows the update. */
  gboolean zero3;
  /* The fraction (0 to 1) of the optimizer's states that live in host memory and are
   * updated by the host's CPU (ZeRO-Offload, DeepSpeed's offload_optimizer, Megatron-LM's
   * --optimizer-cpu-offload with --optimizer-offload-fraction): that share of the fp32
   * master weights and moments leaves the device; after the device's update its gradients
   * go to the host over PCIe, the host updates them, and the new weights come back
   * (sim/lower-sync.c).  0: none. */
  double offload;
  /* With offload: each shard's gradients go to the host as soon as they are reduced
   * (summed over the replicas, or produced where there are none), overlapping the rest
   * of the backward pass, as ZeRO-Offload copies each bucket (DeepSpeed's
   * overlap_comm); the host still steps after the backward.  FALSE: after the device's
   * own update, as Megatron-LM's --optimizer-cpu-offload does by default. */
  gboolean offload_overlap;
} SimMemoryOptions;

SIM_PUBLIC void sim_strategy_set_sync(SimStrategy *s, const SimSyncOptions *o);
SIM_PUBLIC SimSyncOptions sim_strategy_get_sync(const SimStrategy *s);
SIM_PUBLIC void sim_strategy_set_memory(SimStrategy *s, const SimMemoryOptions *o);
SIM_PUBLIC SimMemoryOptions sim_strategy_get_memory(const SimStrategy *s);

/* Graph rewrites (substitutions) the strategy was found with, by name and in the order
 * they were applied; the search records them and applies them to the model before the
 * configurations, which name the rewritten graph's operators, refer to it. */
SIM_PUBLIC void sim_strategy_add_rewrite(SimStrategy *s, const char *name);
SIM_PUBLIC int sim_strategy_n_rewrites(const SimStrategy *s);
SIM_PUBLIC const char *sim_strategy_rewrite(const SimStrategy *s, int i);
SIM_PUBLIC void sim_strategy_clear_rewrites(SimStrategy *s);

/* Validates against the graph and machine: degrees that divide their dimensions (the
 * sample dimension per micro-batch), existing devices, stages that cover every op,
 * consistent device groups.  Messages name the operator and the dimension. */
SIM_PUBLIC gboolean sim_strategy_validate(const SimStrategy *s, const SimGraph *g,
                                          const SimMachine *m, GError **error);
/* The same checks for operator @op alone, and that its shards run on its stage's devices:
 * enough after a change to one operator's configuration (degrees, devices) of a valid
 * strategy. */
SIM_PUBLIC gboolean sim_strategy_validate_op(const SimStrategy *s, const SimGraph *g,
                                             const SimMachine *m, int op, GError **error);

/* JSON ("format": "parasol-strategy", "version": 1).  Operators are named. */
SIM_PUBLIC char *sim_strategy_to_json(const SimStrategy *s, const SimGraph *g);
SIM_PUBLIC SimStrategy *sim_strategy_from_json(const char *text, const char *filename,
                                               const SimGraph *g, const SimMachine *m,
                                               GError **error);
SIM_PUBLIC SimStrategy *sim_strategy_load(const char *path, const SimGraph *g,
                                          const SimMachine *m, GError **error);
SIM_PUBLIC gboolean sim_strategy_save(const SimStrategy *s, const SimGraph *g, const char *path,
                                      GError **error);
/* A strategy file found with graph rewrites ("rewrites") names the rewritten graph's
 * operators.  This reads it in one parse: @rewrite turns @g into the graph the file names
 * (the rewrites it records, in order; libsearch's search_strategy_load() passes its
 * rewriter), and @graph receives that graph (transfer full; a copy of @g when the file
 * records none), against which the strategy is read and validated. */
typedef SimGraph *(*SimGraphRewriteFunc)(const SimGraph *g, const char *const *names,
                                         gpointer data, GError **error);
SIM_PUBLIC SimStrategy *sim_strategy_load_rewritten(const char *path, const SimGraph *g,
                                                    const SimMachine *m,
                                                    SimGraphRewriteFunc rewrite, gpointer data,
                                                    SimGraph **graph, GError **error);

/* The names of the rewrites a strategy file records, in order (an empty list when it
 * records none), without reading the rest of it against a graph: for tools that show the
 * rewritten graph.  NULL with @error naming the file and place when it cannot be read. */
SIM_PUBLIC char **sim_strategy_file_rewrites(const char *path, GError **error);

/* Builders. */
/* Every op data parallel over @n_devices devices starting at device 0 (sample dims split
 * as far as they divide), weights replicated. */
SIM_PUBLIC SimStrategy *sim_strategy_data_parallel(const SimGraph *g, const SimMachine *m,
                                                   int n_devices, GError **error);

typedef struct {
  int dp, tp, pp;
  int microbatches;           /* 0: derived from global batch and micro-batch size    */
  int64_t microbatch_size;    /* samples per micro-batch per data-parallel replica    */
  SimSchedule schedule;
  int chunks;                 /* model chunks per stage (interleaved)                 */
  gboolean sequence_parallel;
  gboolean scatter_gather;    /* pipeline messages split over the tensor-parallel ranks */
  SimSyncOptions sync;
  SimMemoryOptions memory;
  /* Expert parallelism: every mixture-of-experts op splits its experts over @ep of the
   * @dp data-parallel replicas (consecutive ones) and its samples over dp / ep; 0 or 1:
   * none.  Must divide dp and every such op's experts.  With etp (below) other than tp,
   * the groups are ep x etp ranks of a stage instead. */
  int ep;
  /* Context parallelism: every op's positions (its first attribute dimension) split over
   * cp ranks between the tensor- and the data-parallel ones (Megatron's order: tp, cp,
   * dp, pp), ops without positions that divide repeated on each; attention as a ring
   * (sim_strategy_set_context_parallel()).  0 or 1: none.  With ep, a mixture-of-experts
   * op's shards of one context rank exchange tokens among the ep replicas of that rank. */
  int cp;
  /* With sequence_parallel: its all-gathers and reduce-scatters overlap the GEMMs that
   * consume and produce them (SimStrategy's tp_comm_overlap, sim/lower-tensors.c).  Last,
   * so that bindings that mirror this struct keep their layout. */
  gboolean tp_comm_overlap;
  /* The overlap's parameters (SimTpOverlap): the chunks of the pipelined reduce-scatter
   * (0: the tensor-parallel degree) and the SMs it takes from attention's output
   * projection and from the other GEMMs (sim_megatron_options_default(): 24 and 16,
   * NeMo's H100 configuration for hidden size 8192 at TP 4; docs/llm.md). */
  SimTpOverlap tp_overlap;
  /* Expert tensor parallelism (Megatron-Core's --expert-tensor-parallel-size): each
   * expert's width splits over @etp ranks instead of tp.  The expert layout carves
   * expert groups of ep x etp consecutive ranks from the dp x tp ranks of a stage (etp
   * fastest, then ep, then the expert-data-parallel groups), each group routing the
   * tokens its ranks hold.  0: tp (the default).  With etp != tp, ep x etp must be a
   * multiple of tp that divides dp x tp, and cp must be 1.  Last, for the bindings. */
  int etp;
} SimMegatronOptions;

SIM_PUBLIC SimMegatronOptions sim_megatron_options_default(void);
/* Megatron-style plan: tensor parallelism inside the group of @tp consecutive devices
 * (column-parallel, then row-parallel linear layers; attention heads split; vocabulary-
 * parallel embedding and loss), @pp pipeline stages of consecutive layers, @dp replicas.
 * Rank order: tensor fastest, then data, then pipeline (Megatron's initialize_model_parallel
 * and DeepSpeed's pipe-data-model topology): a stage's devices are consecutive. */
SIM_PUBLIC SimStrategy *sim_strategy_megatron(const SimGraph *g, const SimMachine *m,
                                              const SimMegatronOptions *o, GError **error);

/* ---------------------------------------------------------------------------------- */

G_DEFINE_AUTOPTR_CLEANUP_FUNC(SimStrategy, sim_strategy_free)

G_END_DECLS
