/* sim-options.h — the options that describe a training plan and a simulation, shared by
 * the commands that simulate (simulate, search, compare, validate, exec). */
#pragma once

#include "cli.h"

typedef struct {
  int dp, tp, pp, microbatches;
  int ep;                       /* expert-parallel degree (--ep); 0: none               */
  int cp;                       /* context-parallel degree (--cp); 0: none              */
  int etp;                      /* expert tensor-parallel degree (--etp); 0: tp          */
  double moe_capacity_factor;   /* --moe-capacity-factor; NaN: the model's              */
  double moe_imbalance;         /* --moe-imbalance; NaN: the model's                    */
  gint64 microbatch_size, global_batch;
  char *schedule, *recompute, *precision, *allreduce, *detail;
  double bucket_mb;
  gboolean no_overlap, zero1, sequence_parallel, scatter_gather, no_fold, blocking_sends;
  gboolean tp_comm_overlap;
  int tp_overlap_chunks;        /* --tp-overlap-chunks; 0: the tensor-parallel degree    */
  char *tp_overlap_sms;         /* --tp-overlap-sms A,O                                  */
  gboolean zero2, zero3;
  double offload_optimizer;     /* --offload-optimizer: the fraction of the states, 0..1 */
  gboolean offload_overlap;     /* --offload-overlap                                     */
  gboolean no_chains, no_rings, no_steady, fold_check, no_prune, no_ring_steps;
  double coll_efficiency, coll_latency_us, coll_base_us, net_efficiency;
  /* The collective and roofline parameters: NaN where not given (the defaults). */
  double gemm_efficiency, memory_efficiency, host_overhead_us, gemm_latency_us, host_step_us;
  double gemm_k_overhead, gemm_unaligned_efficiency, gemm_ceiling;
  double conv_efficiency, gather_efficiency, recurrent_efficiency;
  double attention_efficiency, attention_bwd_efficiency, cuda_core_efficiency;
  char *attention;              /* the attention kernels (--attention); NULL: the model's */
  char *conv_layout;            /* nchw or nhwc (--conv-layout); NULL: nhwc              */
  char *gemm_tile;              /* MxN or auto (--gemm-tile); NULL: auto                */
  /* memory-efficiency.OP.PASS of a calibration file (0: not given). */
  double memory_efficiency_by_op[SIM_OP_COUNT][SIM_PASS_COUNT];
  char *calibration;            /* a file of fitted parameters (--calibration)          */
  char *profile, *profile_gpu;  /* a profile database for the cost model              */
  char *allreduce_table;        /* measured all-reduce times inside a node            */
} CliPlanOptions;

void cli_plan_options_init(CliPlanOptions *p);
/* Frees the strings the options were given and sets them back to their defaults. */
void cli_plan_options_clear(CliPlanOptions *p);
G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC(CliPlanOptions, cli_plan_options_clear)
/* The option group (--dp, --tp, --pp, --microbatches, --microbatch-size, --global-batch,
 * --schedule, --recompute, --precision, --zero1, --allreduce, --bucket-mb, --no-overlap,
 * --sequence-parallel, --detail, --no-fold, --coll-efficiency, --net-efficiency,
 * --coll-latency-us, --coll-base-us, the roofline's parameters, --attention,
 * --allreduce-table, --calibration, --profile, --profile-gpu).  After parsing, the
 * parameters of a --calibration file fill those not given on the command line. */
GOptionGroup *cli_plan_option_group(CliPlanOptions *p);
/* Fills the options of @p that are not set from calibration file @file (the option
 * group does it for --calibration). */
gboolean cli_plan_apply_calibration(CliPlanOptions *p, const char *file, GError **error);

/* A model on a machine with a cost model, as the options describe them. */
typedef struct {
  SimGraph *graph;
  SimMachine *machine;
  SimCostModel *cost;
  const SimCollTable *allreduce_table; /* --allreduce-table, shared by the process      */
  /* The zoo transformer's default vocabulary and the size it was padded to for tp
   * (sim_model_params_pad_vocab()); 0 when not padded. */
  int64_t vocab_default, vocab_padded;
  int vocab_tp;
} CliProblem;

/* Loads the model (--global-batch sets its batch), the machine and the cost model (the
 * roofline, under the profile database of --profile when given), and gives the graph the
 * plan's compute precision. */
gboolean cli_problem_load(CliProblem *pb, const char *model, char **params, const char *machine,
                          const CliPlanOptions *p, GError **error);
void cli_problem_clear(CliProblem *pb);
/* The roofline's parameters the options give (the defaults where they give none) for a
 * plan in precision @prec. */
gboolean cli_plan_roofline_params(const CliPlanOptions *p, SimPrecision prec,
                                  SimRooflineParams *rp, GError **error);

/* Whether any of --dp/--tp/--pp/--microbatch-size/--microbatches was given: the plan is
 * then Megatron-style, as given. */
gboolean cli_plan_has_degrees(const CliPlanOptions *p);
/* The strategy the flags describe: Megatron-style when any of --dp/--tp/--pp/
 * --microbatch-size/--microbatches is given (without --dp, data parallel over the GPUs
 * that tp x pp leave, as Megatron derives it), else data parallel over every GPU. */
SimStrategy *cli_plan_build(const CliPlanOptions *p, SimGraph *g, const SimMachine *m,
                            GError **error);
/* The Megatron options of cli_plan_build()'s strategy. */
gboolean cli_plan_resolve(const CliPlanOptions *p, const SimGraph *g, const SimMachine *m,
                          SimMegatronOptions *out, GError **error);
/* The Megatron options the flags describe (degrees default to 1). */
gboolean cli_plan_megatron_options(const CliPlanOptions *p, SimMegatronOptions *o, GError **error);
/* The simulation options the flags describe, with the problem's measured tables. */
SimOptions cli_plan_sim_options(const CliPlanOptions *p, const CliProblem *pb);
