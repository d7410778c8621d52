/* roofline.c — the analytic cost model: a kernel takes as long as the slower of its
 * arithmetic at an achievable fraction of the device's peak and its memory traffic at an
 * achievable fraction of the memory bandwidth, plus one kernel launch:
 *
 *   time = max(flops / (peak[dtype] * efficiency), bytes / (bandwidth * memory_efficiency))
 *          + launch_overhead
 *
 * GEMMs and convolutions (implicit GEMMs) are priced as the libraries run them.  The
 * output is cut into tiles, one per thread block, and the blocks run in waves of one per
 * SM, so a GEMM costs as many tiles as its waves could hold (NVIDIA, "Matrix
 * Multiplication Background User's Guide", 2023, "Dimension Quantization Effects").
 * cuBLAS and cuDNN pick, per shape, among tile shapes and may split the reduction
 * dimension K over several blocks (split-K) whose partial sums a second pass adds up;
 * with tile_m = tile_n = 0 each GEMM here takes the tile shape and split that make it
 * fastest (gemm_plan below), which is what their heuristics aim at.  A weight gradient
 * of a convolution (64 x 147 outputs for ResNet-50's first layer, reduced over 3.2 M
 * positions at 256 images) fills one or two tiles: unsplit, one SM would do all of it.
 *
 * Fused attention (flash attention) is tiled the same way: one block per 128 queries of
 * one head, streaming the keys and values in blocks (attention_seconds).
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
 *   separately by the tiles.
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
 * - unaligned 0.25: cuBLAS runs an fp16 GEMM with a dimension that is not a multiple of
 *   8 (GPT-2's vocabulary of 50,257, BERT's 30,522) at about a quarter of an aligned one's
 *   rate: on the H200 of data/profiles/h200/ops.json, 12.6% of peak for 8192 x 50257 x 768
 *   and 15.5% for 131072 x 30522 x 768 against 50-56% for aligned GEMMs of that size.
 * - attention 0.70 forward, 0.55 backward: FlashAttention-2 on an A100 (Dao, 2023: 50-73%
 *   of peak forward, the backward pass lower); frameworks set their own (sim/framework.c).
 * - tiles chosen per GEMM with split-K (tile_m = tile_n = 0).
 * - CUDA cores 0.8: fp32 GEMMs and convolutions without TF32 keep the fused multiply-add
 *   units busier than tensor-core kernels keep theirs: on the H200 of
 *   data/profiles/h200/ops.json cuBLAS ran 8192 x 50257 x 768 at 73-75% of the fp32 peak
 *   and cuDNN a 3x3 convolution of 128 channels at 86%, launches included. */
SimRooflineParams sim_roofline_params_default(void)
{
  return (SimRooflineParams){
    .gemm_efficiency = 0.75,
    .conv_efficiency = 0.6,
    .memory_efficiency = 0.8,
    .gather_efficiency = 0.5,
    .recurrent_efficiency = 0.3,
    .tile_quantization = TRUE,
    .tile_m = 0,
    .tile_n = 0,
    .gemm_unaligned_efficiency = 0.25,
    .tf32 = FALSE,
    .attention_efficiency = 0.70,
    .attention_bwd_efficiency = 0.55,
    .cuda_core_efficiency = 0.8,
  };
}

/* What a persistent recurrent kernel can keep of its weights per SM: half of the 256 KB
 * register file that V100, A100 and H100 SMs have (the rest holds the step's operands). */
#define PERSISTENT_BYTES_PER_SM (128.0 * 1024.0)

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

/* Whether a GEMM-like kernel of @dt runs on the tensor cores, and at what peak. */
static gboolean on_tensor_cores(const SimRooflineParams *p, const SimDeviceSpec *dev,
                                SimDType dt, double *peak)
{
  if (dt == SIM_DTYPE_FP32 && p->tf32 && dev->tf32_flops > 0) {
    *peak = dev->tf32_flops;
    return TRUE;
  }
  *peak = peak_of(dev, dt);
  return (dt == SIM_DTYPE_FP16 || dt == SIM_DTYPE_BF16 || dt == SIM_DTYPE_FP8) &&
         dev->peak_flops[dt] > 0 && dev->peak_flops[dt] > dev->peak_flops[SIM_DTYPE_FP32];
}

static double bound(double amount, double rate)
{
  return amount > 0.0 && rate > 0.0 ? amount / rate : 0.0;
}

/* The factor by which one tile shape's quantization inflates the work of a (batch x m x
 * n) output: the tiles the waves could hold over the elements actually computed. */
static double quantization_factor(const SimRooflineParams *p, const SimDeviceSpec *dev,
                                  int64_t batch, int64_t m, int64_t n)
{
  if (!p->tile_quantization || m <= 0 || n <= 0)
    return 1.0;
  double tm = p->tile_m, tn = p->tile_n;
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

/* The output tiles the libraries choose among (CUTLASS's and cuBLAS's threadblock
 * shapes, 256 x 128 down to 64 x 64, and the 32-wide ones of their kernels for batches of
 * small matrices). */
static const int tile_menu[][2] = {
  { 256, 128 }, { 128, 256 }, { 128, 128 }, { 128, 64 }, { 64, 128 }, { 64, 64 },
  { 64, 32 }, { 32, 64 }, { 32, 32 },
};

/* The rate of a tile's main loop, relative to the large tiles', on the tensor cores.
 * Each step along K loads tm + tn elements into shared memory and does tm x tn
 * multiply-adds: tm tn / (tm + tn) operations per element loaded, 64 for 128 x 128.  The
 * tensor cores of V100, A100 and H100 run at about that much reuse and no less (the
 * shared-memory and L2 bandwidth behind them bound the rest), so smaller tiles slow down
 * in proportion: 128 x 64 at 2/3, 64 x 64 at 1/2.  CUDA-core kernels (fp32 without TF32)
 * need far less reuse and run every tile at full rate. */
static double tile_rate(int tm, int tn, gboolean tensor)
{
  if (!tensor)
    return 1.0;
  double reuse = (double)tm * tn / (double)(tm + tn);
  return MIN(1.0, reuse / 64.0);
}

/* One way to run a GEMM: its arithmetic time (tiles, waves, pipeline) and the time of
 * the extra pass that adds split-K's partial sums. */
typedef struct {
  double compute, reduce;
} GemmPlan;

/* The arithmetic of @batch x (@m x @n) outputs reduced over @kdim, as tiles of tm x tn
 * split @split ways along K, on @sms SMs at @rate FLOP/s in all. */
static GemmPlan gemm_plan(const SimRooflineParams *p, const SimDeviceSpec *dev, int64_t batch,
                          int64_t m, int64_t n, int64_t kdim, int tm, int tn, int split,
                          double rate, double es)
{
  double b = batch > 0 ? (double)batch : 1.0;
  double tiles = ceil((double)m / tm) * ceil((double)n / tn) * b;
  double units = tiles * split;
  double kslice = ceil((double)kdim / split);
  double sms = dev->sm_count > 0 ? dev->sm_count : units;
  double waves = ceil(units / sms);
  /* A unit's work: its tile over its slice of K, plus the pipeline's start and the
   * epilogue (gemm_k_overhead elements of K). */
  double unit_flops = 2.0 * tm * tn * (kslice + MAX(p->gemm_k_overhead, 0.0));
  GemmPlan plan = { waves * sms * unit_flops / rate, 0.0 };
  if (split > 1) {
    /* Each slice writes its partial tile in fp32; a second pass reads them all and writes
     * the result. */
    double partials = b * (double)m * (double)n * split * 4.0;
    plan.reduce = bound(2.0 * partials + b * (double)m * (double)n * es,
                        dev->mem_bandwidth * p->memory_efficiency);
  }
  return plan;
}

/* Whether a kernel is one of the linear layers' GEMMs that Transformer Engine runs in FP8
 * under --precision fp8: unbatched 16-bit GEMMs and a mixture's grouped GEMMs (its
 * GroupedLinear) on a device with an FP8 peak (attention's batched products stay in 16
 * bits). */
static gboolean fp8_gemm(const SimRooflineParams *p, const SimDeviceSpec *dev, const SimKernel *k)
{
  return p->fp8 && k->kind == SIM_KERNEL_GEMM &&
         (k->batch <= 1 || (k->flags & SIM_KERNEL_GROUPED)) &&
         sim_dtype_size(k->dtype) == 2 && dev->peak_flops[SIM_DTYPE_FP8] > 0;
}

/* The scaling and casting that an FP8 GEMM needs first: each operand (m x k and k x n, of
 * every product of a grouped one) is
 * read in 16 bits, its absolute maximum taken for the next scale (delayed scaling) and
 * written in 8 bits, a stream of 3 bytes an element at the streaming kernels' bandwidth.
 * Transformer Engine fuses some of these casts into the kernel before (a norm's output);
 * counting every one is the upper end. */
double sim_roofline_fp8_cast_seconds(const SimRooflineParams *p, const SimDeviceSpec *dev,
                                     const SimKernel *k)
{
  if (!fp8_gemm(p, dev, k))
    return 0.0;
  double elems = (double)MAX(k->batch, 1) * ((double)MAX(k->m, 0) * (double)MAX(k->k, 0) +
                                              (double)MAX(k->k, 0) * (double)MAX(k->n, 0));
  return bound(3.0 * elems, dev->mem_bandwidth * p->memory_efficiency);
}

/* A GEMM-like kernel without its launch: the slower of arithmetic and memory traffic. */
static double gemm_seconds(const SimRooflineParams *p, const SimDeviceSpec *dev,
                           const SimKernel *k, double flops, double bytes, double efficiency)
{
  if (flops <= 0.0 && k->m > 0 && k->n > 0 && k->k > 0)
    flops = 2.0 * (double)MAX(k->batch, 1) * (double)k->m * (double)k->n * (double)k->k;
  double peak;
  gboolean tensor = on_tensor_cores(p, dev, k->dtype, &peak);
  if (!tensor && p->cuda_core_efficiency > 0 &&
      (k->kind == SIM_KERNEL_GEMM || k->kind == SIM_KERNEL_CONV))
    efficiency = p->cuda_core_efficiency;
  /* No shape beats the best one the device was measured to run: its own figure for 16-bit
   * and fp8 tensor-core products where known, else the parameter's. */
  double cap = p->gemm_ceiling;
  if (tensor && sim_dtype_size(k->dtype) == 2 && dev->matmul_fraction > 0)
    cap = dev->matmul_fraction;
  if (fp8_gemm(p, dev, k)) {
    peak = dev->peak_flops[SIM_DTYPE_FP8];
    if (dev->matmul_fraction_fp8 > 0)
      cap = dev->matmul_fraction_fp8;
  }
  /* cuDNN pads a convolution's channels itself (sim/ops/conv.c): only GEMMs pay, and only
   * on the tensor cores, whose kernels load 16-byte vectors. */
  if (k->kind != SIM_KERNEL_CONV && tensor && p->gemm_unaligned_efficiency > 0 &&
      p->gemm_unaligned_efficiency < 1 && gemm_unaligned(k))
    efficiency *= p->gemm_unaligned_efficiency;
  double useful = flops;
  double memory = bound(bytes, dev->mem_bandwidth * p->memory_efficiency);
  double ceiling = cap > 0.0 ? bound(useful, peak * cap) : 0.0;
  gboolean shaped = k->m > 0 && k->n > 0 && k->k > 0;

  if (!p->tile_quantization || !shaped || (p->tile_m > 0 && p->tile_n > 0)) {
    /* One tile shape, never split (or no tiles at all). */
    if (p->tile_m > 0 && p->tile_n > 0)
      flops *= quantization_factor(p, dev, k->batch, k->m, k->n);
    if (p->gemm_k_overhead > 0 && k->k > 0)
      flops *= ((double)k->k + p->gemm_k_overhead) / (double)k->k;
    double compute = MAX(bound(flops, peak * efficiency), ceiling);
    return MAX(compute, memory);
  }

  /* The libraries' choice: the tile shape and split of K that finish first.  K is split
   * only to fill SMs that the tiles leave idle, and no slice is shorter than 64. */
  double es = sim_dtype_size(k->dtype);
  double best = INFINITY;
  for (size_t t = 0; t < G_N_ELEMENTS(tile_menu); t++) {
    int tm = tile_menu[t][0], tn = tile_menu[t][1];
    double rate = peak * efficiency * tile_rate(tm, tn, tensor);
    double tiles = ceil((double)k->m / tm) * ceil((double)k->n / tn) * MAX(k->batch, 1);
    int fill = dev->sm_count > 0 ? (int)MIN((double)dev->sm_count / tiles, 64.0) : 1;
    int longest = (int)MIN((double)k->k / 64.0, 64.0);
    int max_split = MAX(1, MIN(fill, longest));
    /* Splits 1, 2, 4, ... and the largest that fits. */
    for (int split = 1;; split = MIN(2 * split, max_split)) {
      GemmPlan plan = gemm_plan(p, dev, k->batch, k->m, k->n, k->k, tm, tn, split, rate, es);
      best = MIN(best, MAX(MAX(plan.compute, ceiling), memory) + plan.reduce);
      if (split >= max_split)
        break;
    }
  }
  return best;
}

/* A bandwidth-bound kernel: its arithmetic runs on the CUDA cores, bounded here by the
 * fp32 rate, and its traffic at @efficiency of the bandwidth. */
static double stream_seconds(const SimDeviceSpec *dev, const SimKernel *k, double efficiency)
{
  double compute = bound(k->flops, dev->peak_flops[SIM_DTYPE_FP32] * efficiency);
  double memory = bound(k->bytes, dev->mem_bandwidth * efficiency);
  return MAX(compute, memory);
}

/* Fused attention as FlashAttention runs it (Dao, 2023): one thread block per 128 queries
 * of one (sample, head), streaming the keys and values in blocks of 128 through shared
 * memory; the scores never reach device memory.  A block pair costs 4 x 128 x 128 x hd
 * FLOPs forward (Q K^T and P V) and 2.5 times that backward (the scores recomputed, then
 * dV, dP, dQ and dK).  A causal mask skips the pairs above the diagonal, so the query
 * blocks near the end do most of the work.  The blocks run in waves over the SMs; a
 * wave lasts as long as its longest block. */
static double attention_seconds(const SimRooflineParams *p, const SimDeviceSpec *dev,
                                const SimKernel *k)
{
  gboolean backward = (k->flags & SIM_KERNEL_BACKWARD) != 0;
  gboolean causal = (k->flags & SIM_KERNEL_CAUSAL) != 0;
  double peak;
  on_tensor_cores(p, dev, k->dtype, &peak);
  double eff = backward ? p->attention_bwd_efficiency : p->attention_efficiency;
  /* No attention beats what the device's own kernels were measured to run. */
  double cap = backward ? dev->attention_bwd_fraction : dev->attention_fraction;
  if (cap > 0 && sim_dtype_size(k->dtype) == 2)
    eff = MIN(eff, cap);
  double bh = (double)MAX(k->batch, 1);
  double qb = ceil((double)MAX(k->m, 1) / 128.0), kb = ceil((double)MAX(k->n, 1) / 128.0);
  /* Key blocks each query block visits: all of them, or (causal, queries aligned to the
   * end of the keys) those up to its diagonal. */
  double longest = kb, mean = kb;
  if (causal) {
    double offset = kb - qb; /* key blocks before the first query block's diagonal */
    longest = MIN(kb, offset + qb);
    mean = MIN(kb, offset + (qb + 1.0) / 2.0);
  }
  double pair = 4.0 * 128.0 * 128.0 * (double)MAX(k->k, 1) * (backward ? 2.5 : 1.0);
  double blocks = bh * qb;
  double sms = dev->sm_count > 0 ? dev->sm_count : blocks;
  double per_sm = peak * eff / sms;
  double waves = ceil(blocks / sms);
  double compute = MAX(waves * mean, longest) * pair / per_sm;
  double memory = bound(k->bytes, dev->mem_bandwidth * p->memory_efficiency);
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
           launch + sim_roofline_fp8_cast_seconds(p, dev, k);
  case SIM_KERNEL_CONV: {
    double t = gemm_seconds(p, dev, k, k->flops, k->bytes, p->conv_efficiency) +
               p->gemm_latency + launch;
    double peak;
    if (p->conv_nchw && on_tensor_cores(p, dev, k->dtype, &peak))
      /* The layout transposes: the operands read and written once more, two kernels. */
      t += bound(2.0 * k->bytes, dev->mem_bandwidth * p->memory_efficiency) + 2 * launch;
    return t;
  }
  case SIM_KERNEL_MEMORY:
  case SIM_KERNEL_OPTIMIZER: {
    double eff = p->memory_efficiency;
    if (k->op_type > 0 && k->op_type <= SIM_OP_COUNT && k->pass >= 0 && k->pass < SIM_PASS_COUNT &&
        p->memory_efficiency_by_op[k->op_type - 1][k->pass] > 0)
      eff = p->memory_efficiency_by_op[k->op_type - 1][k->pass];
    return stream_seconds(dev, k, eff) + launch;
  }
  case SIM_KERNEL_GATHER:
    return stream_seconds(dev, k, p->gather_efficiency) + launch;
  case SIM_KERNEL_RECURRENT: {
    /* The steps depend on each other, so each is its own GEMM launch of one step's share
     * of the work; none can overlap another.  Each step reads the recurrent weights
     * (k x n) again, unless they fit in the SMs' register files: cuDNN's persistent
     * kernels then keep them there for the whole sequence and stream only each step's
     * inputs and outputs (Diamos et al., "Persistent RNNs", ICML 2016; cuDNN's
     * CUDNN_RNN_ALGO_PERSIST_STATIC), which small hidden sizes allow. */
    double steps = k->steps > 0 ? (double)k->steps : 1.0;
    double bytes = k->bytes / steps;
    double es = sim_dtype_size(k->dtype);
    double weights = (double)MAX(k->k, 0) * (double)MAX(k->n, 0) * es;
    if (dev->sm_count > 0 && weights <= dev->sm_count * PERSISTENT_BYTES_PER_SM)
      bytes = MAX(0.0, bytes - weights);
    double step = gemm_seconds(p, dev, k, k->flops / steps, bytes, p->recurrent_efficiency);
    return steps * (step + launch);
  }
  case SIM_KERNEL_ATTENTION:
    return attention_seconds(p, dev, k) + launch;
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
  g_return_val_if_fail(p.tile_m >= 0 && p.tile_n >= 0, NULL);
  if (p.attention_efficiency <= 0.0)
    p.attention_efficiency = sim_roofline_params_default().attention_efficiency;
  if (p.attention_bwd_efficiency <= 0.0)
    p.attention_bwd_efficiency = sim_roofline_params_default().attention_bwd_efficiency;
  SimCostModel *m = g_new0(SimCostModel, 1);
  m->klass = &roofline_class;
  m->priv = g_memdup2(&p, sizeof p);
  return m;
}
