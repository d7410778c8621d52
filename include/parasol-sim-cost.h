/* parasol-sim-cost.h — part of libsim's public interface (parasol-sim.h, which includes
 * every part): cost models: kernels, the roofline model, calibration. */
#pragma once

#include "parasol-sim-machine.h"

G_BEGIN_DECLS

/* ---------------------------------------------------------------------------------- */
/* Cost models                                                                         */

/* The kernels an operator shard runs in one pass; the cost model prices each. */
typedef enum {
  SIM_KERNEL_GEMM,        /* batch x (m x k) . (k x n)                                */
  SIM_KERNEL_CONV,        /* implicit GEMM: m = n*ho*wo, n = c_out, k = c_in*kh*kw/g    */
  SIM_KERNEL_MEMORY,      /* element-wise, normalization, softmax: bandwidth bound      */
  SIM_KERNEL_GATHER,      /* embedding lookups and their scatter-add backward           */
  SIM_KERNEL_RECURRENT,   /* an LSTM step loop: GEMMs that run one after the other      */
  SIM_KERNEL_OPTIMIZER,   /* the weight update                                         */
  SIM_KERNEL_ATTENTION,   /* fused (flash) attention: batch = b*heads, m = sq, n = skv,
                           * k = head dim; flags say causal and backward               */
  SIM_KERNEL_KIND_COUNT
} SimKernelKind;

typedef struct {
  SimKernelKind kind;
  SimDType dtype;
  int64_t m, n, k, batch;  /* GEMM-like kernels; batch >= 1                          */
  int64_t steps;           /* recurrent kernels: sequential steps                      */
  double flops;
  double bytes;            /* read + written                                         */
  int flags;               /* SIM_KERNEL_CAUSAL, SIM_KERNEL_BACKWARD (attention),
                              SIM_KERNEL_GROUPED (GEMMs)                               */
  int op_type;             /* the SimOpType whose work it is, + 1 (0: not known)      */
  int pass;                /* the SimPass it belongs to, when op_type is known        */
} SimKernel;

/* Flags of a fused attention kernel. */
#define SIM_KERNEL_CAUSAL 1   /* a causal mask: the blocks above the diagonal are skipped */
#define SIM_KERNEL_BACKWARD 2 /* the backward kernel (recomputes the scores)              */
#define SIM_KERNEL_GROUPED 4  /* a mixture's grouped GEMM, one product per expert (batch):
                                 a linear layer's, in FP8 under --precision fp8            */

SIM_PUBLIC const char *sim_kernel_kind_name(SimKernelKind k);

typedef enum { SIM_PASS_FORWARD, SIM_PASS_BACKWARD, SIM_PASS_UPDATE, SIM_PASS_COUNT } SimPass;
SIM_PUBLIC const char *sim_pass_name(SimPass p);

#define SIM_MAX_KERNELS 16
typedef struct {
  int n;
  SimKernel k[SIM_MAX_KERNELS];
} SimWork;

/* The work of op @op of @g in @pass when its iteration dimensions have the extents
 * @extent (one shard).  NULL @extent means the whole operator. */
SIM_PUBLIC void sim_graph_op_work(const SimGraph *g, int op, const int64_t *extent, SimPass pass,
                                  SimWork *work);
SIM_PUBLIC double sim_work_flops(const SimWork *w);
SIM_PUBLIC double sim_work_bytes(const SimWork *w);
/* A key that identifies the shard's shapes for profile databases, e.g.
 * "linear|x=[8,1024,4096]|w=[4096,1024]|fp16|act=none". */
SIM_PUBLIC char *sim_graph_op_shard_key(const SimGraph *g, int op, const int64_t *extent);

typedef struct _SimCostModel SimCostModel;

/* A cost model is a struct of function pointers (docs/extending.md).  New slots go at the end. */
#define SIM_COST_MODEL_API_VERSION 1
typedef struct {
  int api_version;           /* SIM_COST_MODEL_API_VERSION                          */
  const char *name;
  /* Required: the time of one kernel on @dev, in seconds, launch overhead included. */
  double (*kernel_time)(SimCostModel *self, const SimDeviceSpec *dev, const SimKernel *k);
  /* Optional (NULL: price each kernel of the work): the time of a whole operator shard
   * in @pass, or a negative number when this model does not know it, in which case the
   * kernels of the work are priced by the fallback model. */
  double (*op_time)(SimCostModel *self, const SimDeviceSpec *dev, const SimGraph *g, int op,
                    const int64_t *extent, SimPass pass);
  /* Optional: releases the model's private data. */
  void (*finalize)(SimCostModel *self);
} SimCostModelClass;

struct _SimCostModel {
  const SimCostModelClass *klass;
  SimCostModel *fallback;    /* consulted when op_time answers negative; may be NULL */
  void *priv;
};

/* Roofline efficiencies: achieved fractions of peak FLOP/s and memory bandwidth. */
typedef struct {
  double gemm_efficiency;      /* large, well-shaped GEMMs                              */
  double conv_efficiency;
  double memory_efficiency;    /* streaming kernels                                    */
  double gather_efficiency;
  double recurrent_efficiency;
  gboolean tile_quantization;  /* model tile and wave quantization of GEMMs            */
  /* The output tile of a GEMM thread block.  0 x 0: each GEMM takes the tile shape and the
   * split of its reduction (split-K) that make it fastest, as the libraries' heuristics
   * choose them (roofline.c); otherwise this one tile, never split. */
  int tile_m, tile_n;
  /* A GEMM's fixed cost beyond its launch: filling and draining the tensor-core pipeline,
   * prologue and epilogue.  It makes small GEMMs less efficient than large ones. */
  double gemm_latency;
  /* Each output tile of a GEMM streams its reduction dimension K through a pipeline whose
   * start (filling the shared-memory stages) and end (the epilogue that converts and
   * writes the tile) cost about as much as this many more elements of K: a GEMM's work
   * counts as (K + gemm_k_overhead) / K times its FLOPs.  Short reductions (small hidden
   * sizes, tensor-parallel shards of them, attention's head dimension) lose the most.
   * 0: none. */
  double gemm_k_overhead;
  /* The fraction of its aligned rate a GEMM reaches when one of its dimensions is not a
   * multiple of 16 bytes (8 fp16 or bf16 elements, 4 fp32): cuBLAS's fast tensor-core
   * kernels load 16 bytes at a time and need every leading dimension aligned to it, so an
   * odd vocabulary of 50,257 runs its projection on slower kernels (NVIDIA's Matrix
   * Multiplication Background guide, "Tensor Core Requirements"; nanoGPT pads GPT-2's
   * vocabulary to 50,304 for this).  0 or 1: no penalty. */
  double gemm_unaligned_efficiency;
  /* The most any GEMM reaches, as a fraction of the tensor-core peak, counted in its
   * useful FLOPs (2 M N K): the best shape a device's BLAS runs.  The efficiency above
   * and the tile pipeline's cost describe how the rate grows with K; this caps it where
   * measurement says no shape goes further (A100 SXM: 271.2 of 312 TFLOP/s in bf16,
   * the best of a sweep of shapes in S. Bekman's "Maximum Achievable Matmul FLOPS"
   * table, github.com/stas00/ml-engineering, compute/accelerator).  0: no cap. */
  double gemm_ceiling;
  /* fp32 GEMMs and convolutions run on the tensor cores in TF32 where the device has it
   * (tf32_flops): PyTorch's cudnn.allow_tf32 (on by default) and matmul.allow_tf32, both on
   * in NVIDIA's containers.  Storage and traffic stay fp32. */
  gboolean tf32;
  /* Fused (flash) attention: the achieved fraction of the tensor-core peak in the main
   * loops of the forward and the backward kernels, over the FLOPs they execute. */
  double attention_efficiency;
  double attention_bwd_efficiency;
  /* The linear layers' GEMMs (batch 1, 16-bit) run at the FP8 peak where the device has
   * one: Transformer Engine's FP8 training, whose casts hide in the kernels around them. */
  gboolean fp8;
  /* Tensors in NCHW (PyTorch's default layout), not NHWC (channels_last): cuDNN's
   * tensor-core convolutions (16-bit and TF32) work in NHWC, so each one transposes its
   * input and its output around the kernel, two more passes over both. */
  gboolean conv_nchw;
  /* A framework's own bandwidth-bound kernels per operator type and pass (its dropout,
   * its layer norm's backward...): the fraction of the bandwidth each reaches, 0 where
   * memory_efficiency applies.  Indexed [SimOpType][SimPass]. */
  double memory_efficiency_by_op[SIM_OP_COUNT][SIM_PASS_COUNT];
  /* GEMMs and convolutions on the CUDA cores (fp32 without TF32): the achieved fraction of
   * the fp32 peak, which fused multiply-adds reach more easily than tensor cores reach
   * theirs.  0: gemm_efficiency and conv_efficiency as for the tensor cores. */
  double cuda_core_efficiency;
} SimRooflineParams;

SIM_PUBLIC SimRooflineParams sim_roofline_params_default(void);
/* With @p->fp8, the time the roofline adds to a linear layer's GEMM @k for scaling and
 * casting its two operands to FP8 (sim/roofline.c); 0 for any other kernel. */
SIM_PUBLIC double sim_roofline_fp8_cast_seconds(const SimRooflineParams *p,
                                                const SimDeviceSpec *dev, const SimKernel *k);
SIM_PUBLIC SimCostModel *sim_cost_model_new_roofline(const SimRooflineParams *params);
SIM_PUBLIC void sim_cost_model_free(SimCostModel *m);
SIM_PUBLIC double sim_cost_model_kernel_time(SimCostModel *m, const SimDeviceSpec *dev,
                                             const SimKernel *k);
/* The time of an operator shard in @pass: op_time of the stack if one answers, else the
 * sum of its kernels' times. */
SIM_PUBLIC double sim_cost_model_op_time(SimCostModel *m, const SimDeviceSpec *dev,
                                         const SimGraph *g, int op, const int64_t *extent,
                                         SimPass pass);

/* ---------------------------------------------------------------------------------- */

G_DEFINE_AUTOPTR_CLEANUP_FUNC(SimCostModel, sim_cost_model_free)

G_END_DECLS
