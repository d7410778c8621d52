/* roofline.c — the roofline cost model: a kernel takes as long as the slower of its
 * arithmetic at an achievable fraction of the device's peak and its memory traffic at an
 * achievable fraction of the memory bandwidth, plus one kernel launch:
 *
 *   time = max(flops / (peak[dtype] * efficiency), bytes / (bandwidth * memory_efficiency))
 *          + launch_overhead
 *
 * GEMMs and convolutions (implicit GEMMs) optionally pay for tile and wave quantization
 * as cuBLAS executes them: the output is cut into tile_m x tile_n tiles, one per thread
 * block, and the blocks run in waves of one per SM, so a GEMM costs as many tiles as its
 * waves could hold (NVIDIA, "Matrix Multiplication Background User's Guide", 2023,
 * chapter 3, "Dimension Quantization Effects").
 *
 * The model has no mutable state: kernel_time reads only its parameters and its
 * arguments, so search threads may call it concurrently. */
#include "sim-private.h"

#include <math.h>

/* The default efficiencies are coarse, deliberately round figures; profile/calibrate.c
 * fits them per device from measured kernels where a profile exists.
 * - gemm 0.75: cuBLAS sustains roughly three quarters of the tensor-core peak on large,
 *   well-shaped fp16 GEMMs on V100 and A100; the shortfall comes from memory stalls and
 *   epilogues that no tile shape removes, while the shape-dependent losses are modelled
 *   separately by tile_quantization.
 * - conv 0.6: implicit-GEMM convolutions lose to their im2col indexing and to small
 *   channel counts; cuDNN's best algorithms sit clearly below cuBLAS on equal FLOPs.
 * - memory 0.8: streaming kernels reach about 80% of the HBM bandwidth (Jia et al.,
 *   "Dissecting the NVIDIA Volta GPU Architecture via Microbenchmarking", 2018: 750 of
 *   900 GB/s measured on V100).
 * - gather 0.5: embedding lookups read rows at random, and their backward scatter-adds
 *   contend on the rows they share; half the streaming bandwidth is an assumption.
 * - recurrent 0.3: an LSTM step is a small GEMM that cannot fill the GPU (Appleyard,
 *   Kocisky and Blunsom, "Optimizing Performance of Recurrent Neural Networks on GPUs",
 *   2016).
 * - tiles of 128 x 128: the middle of cuBLAS's tile sizes for tensor-core GEMMs (256x128
 *   down to 64x64 in the guide above); large GEMMs run with the large ones. */
SimRooflineParams sim_roofline_params_default(void)
{
  return (SimRooflineParams){
    .gemm_efficiency = 0.75,
    .conv_efficiency = 0.6,
    .memory_efficiency = 0.8,
    .gather_efficiency = 0.5,
    .recurrent_efficiency = 0.3,
    .tile_quantization = TRUE,
    .tile_m = 128,
    .tile_n = 128,
  };
}

static const SimRooflineParams *params_of(SimCostModel *self)
{
  return self->priv;
}

/* The tensor-core (or, for fp32, CUDA-core) peak of @dt; integer and unknown dtypes fall
 * back to the fp32 rate. */
static double peak_of(const SimDeviceSpec *dev, SimDType dt)
{
  double p = (dt >= 0 && dt < SIM_DTYPE_COUNT) ? dev->peak_flops[dt] : 0.0;
  return p > 0.0 ? p : dev->peak_flops[SIM_DTYPE_FP32];
}

static double bound(double amount, double rate)
{
  return amount > 0.0 && rate > 0.0 ? amount / rate : 0.0;
}

/* The factor by which tile and wave quantization inflate the work of a (batch x m x n)
 * output: the tiles the waves could hold over the elements actually computed. */
static double quantization_factor(const SimRooflineParams *p, const SimDeviceSpec *dev,
                                  int64_t batch, int64_t m, int64_t n)
{
  if (!p->tile_quantization || m <= 0 || n <= 0)
    return 1.0;
  double tm = p->tile_m > 0 ? p->tile_m : 128, tn = p->tile_n > 0 ? p->tile_n : 128;
  double b = batch > 0 ? (double)batch : 1.0;
  double tiles = ceil((double)m / tm) * ceil((double)n / tn) * b;
  double slots = tiles;
  if (dev->sm_count > 0)
    slots = ceil(tiles / dev->sm_count) * dev->sm_count;
  return slots * tm * tn / (b * (double)m * (double)n);
}

/* Whether a dimension of GEMM @k is not a whole number of 16-byte vectors of its type. */
static gboolean gemm_unaligned(const SimKernel *k)
{
  size_t es = sim_dtype_size(k->dtype);
  if (es == 0 || es >= 16)
    return FALSE;
  int64_t v = (int64_t)(16 / es);
  return (k->m > 0 && k->m % v) || (k->n > 0 && k->n % v) || (k->k > 0 && k->k % v);
}

/* A GEMM-like kernel without its launch: the slower of arithmetic and memory traffic. */
static double gemm_seconds(const SimRooflineParams *p, const SimDeviceSpec *dev,
                           const SimKernel *k, double flops, double bytes, double efficiency)
{
  if (flops <= 0.0 && k->m > 0 && k->n > 0 && k->k > 0)
    flops = 2.0 * (double)MAX(k->batch, 1) * (double)k->m * (double)k->n * (double)k->k;
  double useful = flops;
  flops *= quantization_factor(p, dev, k->batch, k->m, k->n);
  if (p->gemm_k_overhead > 0 && k->k > 0)
    flops *= ((double)k->k + p->gemm_k_overhead) / (double)k->k;
  if (p->gemm_unaligned_efficiency > 0 && p->gemm_unaligned_efficiency < 1 &&
      gemm_unaligned(k))
    efficiency *= p->gemm_unaligned_efficiency;
  double compute = bound(flops, peak_of(dev, k->dtype) * efficiency);
  /* No shape beats the best shape's measured rate. */
  if (p->gemm_ceiling > 0.0)
    compute = MAX(compute, bound(useful, peak_of(dev, k->dtype) * p->gemm_ceiling));
  double memory = bound(bytes, dev->mem_bandwidth * p->memory_efficiency);
  return MAX(compute, memory);
}

/* A bandwidth-bound kernel: its arithmetic runs on the CUDA cores, bounded here by the
 * fp32 rate, and its traffic at @efficiency of the bandwidth. */
static double stream_seconds(const SimDeviceSpec *dev, const SimKernel *k, double efficiency)
{
  double compute = bound(k->flops, dev->peak_flops[SIM_DTYPE_FP32] * efficiency);
  double memory = bound(k->bytes, dev->mem_bandwidth * efficiency);
  return MAX(compute, memory);
}

static double roofline_kernel_time(SimCostModel *self, const SimDeviceSpec *dev,
                                   const SimKernel *k)
{
  const SimRooflineParams *p = params_of(self);
  double launch = MAX(dev->launch_overhead, 0.0);
  switch (k->kind) {
  case SIM_KERNEL_GEMM:
    return gemm_seconds(p, dev, k, k->flops, k->bytes, p->gemm_efficiency) + p->gemm_latency +
           launch;
  case SIM_KERNEL_CONV:
    return gemm_seconds(p, dev, k, k->flops, k->bytes, p->conv_efficiency) + p->gemm_latency +
           launch;
  case SIM_KERNEL_MEMORY:
  case SIM_KERNEL_OPTIMIZER:
    return stream_seconds(dev, k, p->memory_efficiency) + launch;
  case SIM_KERNEL_GATHER:
    return stream_seconds(dev, k, p->gather_efficiency) + launch;
  case SIM_KERNEL_RECURRENT: {
    /* The steps depend on each other, so each is its own GEMM launch of one step's share
     * of the work; none can overlap another. */
    double steps = k->steps > 0 ? (double)k->steps : 1.0;
    double step = gemm_seconds(p, dev, k, k->flops / steps, k->bytes / steps,
                               p->recurrent_efficiency);
    return steps * (step + launch);
  }
  case SIM_KERNEL_KIND_COUNT:
    break;
  }
  return launch;
}

static void roofline_finalize(SimCostModel *self)
{
  g_free(self->priv);
  self->priv = NULL;
}

static const SimCostModelClass roofline_class = {
  .api_version = SIM_COST_MODEL_API_VERSION,
  .name = "roofline",
  .kernel_time = roofline_kernel_time,
  .op_time = NULL,
  .finalize = roofline_finalize,
};

/* NULL @params means sim_roofline_params_default().  The parameters are copied. */
SimCostModel *sim_cost_model_new_roofline(const SimRooflineParams *params)
{
  SimRooflineParams p = params ? *params : sim_roofline_params_default();
  g_return_val_if_fail(p.gemm_efficiency > 0.0 && p.conv_efficiency > 0.0, NULL);
  g_return_val_if_fail(p.memory_efficiency > 0.0 && p.gather_efficiency > 0.0, NULL);
  g_return_val_if_fail(p.recurrent_efficiency > 0.0, NULL);
  SimCostModel *m = g_new0(SimCostModel, 1);
  m->klass = &roofline_class;
  m->priv = g_memdup2(&p, sizeof p);
  return m;
}
