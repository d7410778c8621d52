/* test-cost.c — the cost-model stack and the roofline model, against closed forms. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "sim-private.h"

/* An A100 SXM4 as the roofline sees it, written out so the expectations below do not
 * depend on the device library: 312 TFLOP/s fp16 and bf16 on tensor cores, 19.5 TFLOP/s
 * fp32, 2039 GB/s of HBM2e, 108 SMs, 5 us per kernel launch. */
static SimDeviceSpec a100(void)
{
  SimDeviceSpec d = {
    .name = "test-a100",
    .vendor_name = "NVIDIA A100 SXM4 80GB (test copy)",
    .mem_bandwidth = 2039e9,
    .mem_capacity = 80LL << 30,
    .sm_count = 108,
    .launch_overhead = 5e-6,
    .source = "tests",
  };
  d.peak_flops[SIM_DTYPE_FP16] = 312e12;
  d.peak_flops[SIM_DTYPE_BF16] = 312e12;
  d.peak_flops[SIM_DTYPE_FP32] = 19.5e12;
  return d;
}

static SimRooflineParams no_quantization(void)
{
  SimRooflineParams p = sim_roofline_params_default();
  p.tile_quantization = FALSE;
  return p;
}

static SimKernel gemm(SimDType dt, int64_t batch, int64_t m, int64_t n, int64_t k)
{
  int64_t size = sim_dtype_size(dt);
  return (SimKernel){
    .kind = SIM_KERNEL_GEMM, .dtype = dt, .m = m, .n = n, .k = k, .batch = batch,
    .flops = 2.0 * batch * m * n * k,
    .bytes = (double)batch * (m * k + k * n + m * n) * size,
  };
}

#define assert_close(got, want)                                                          \
  cr_assert(fabs((got) - (want)) <= 1e-9 * fabs(want) + 1e-15, "%.12g != %.12g", (got),  \
            (want))

Test(roofline, default_parameters)
{
  SimRooflineParams p = sim_roofline_params_default();
  cr_assert_float_eq(p.gemm_efficiency, 0.75, 1e-12);
  cr_assert_float_eq(p.conv_efficiency, 0.6, 1e-12);
  cr_assert_float_eq(p.memory_efficiency, 0.8, 1e-12);
  cr_assert_float_eq(p.gather_efficiency, 0.5, 1e-12);
  cr_assert_float_eq(p.recurrent_efficiency, 0.3, 1e-12);
  cr_assert(p.tile_quantization);
  /* Tiles and split-K chosen per GEMM; unaligned fp16 GEMMs at a quarter of the rate. */
  cr_assert_eq(p.tile_m, 0);
  cr_assert_eq(p.tile_n, 0);
  cr_assert_float_eq(p.gemm_unaligned_efficiency, 0.25, 1e-12);
  cr_assert_not(p.tf32);
}

/* The roofline with one 128 x 128 tile for every GEMM, never split. */
static SimRooflineParams fixed_tiles(void)
{
  SimRooflineParams p = sim_roofline_params_default();
  p.tile_m = p.tile_n = 128;
  p.gemm_unaligned_efficiency = 1;
  return p;
}

Test(roofline, chosen_tiles_price_a_large_gemm_as_its_best_shape)
{
  SimDeviceSpec dev = a100();
  g_autoptr(SimCostModel) m = sim_cost_model_new_roofline(NULL);
  /* 4096^3: 256 x 128 tiles make 512 in 5 waves of 108, 128 x 128 ones 1024 in 10; both
   * hold 1080 / 1024 of the work at the full rate, and no SM is idle, so K is not split:
   * the fixed 128 x 128 price. */
  SimKernel k = gemm(SIM_DTYPE_FP16, 1, 4096, 4096, 4096);
  double want = 2.0 * 4096.0 * 4096.0 * 4096.0 * 1080.0 / 1024.0 / (312e12 * 0.75) + 5e-6;
  assert_close(sim_cost_model_kernel_time(m, &dev, &k), want);
}

Test(roofline, long_reductions_over_few_outputs_are_split)
{
  SimDeviceSpec dev = a100();
  SimRooflineParams fixed = fixed_tiles();
  g_autoptr(SimCostModel) one = sim_cost_model_new_roofline(&fixed);
  g_autoptr(SimCostModel) m = sim_cost_model_new_roofline(NULL);
  /* A weight gradient of 128 x 128 outputs reduced over 2^20 positions (a convolution's
   * wgrad).  One 128 x 128 tile would leave 107 of 108 SMs idle: one wave of 108 tiles'
   * time, 2 * 108 * 128^2 * 2^20 FLOPs at 0.75 * 312 TFLOP/s = 15.9 ms.  The best split:
   * four 64 x 64 tiles (at half the rate) each split 27 ways fill the 108 SMs once, slices
   * of ceil(2^20 / 27) = 38,837: 108 * 2 * 64^2 * 38,837 FLOPs at 0.5 * 0.75 * 312 TFLOP/s
   * = 293.7 us, below the traffic, (2 * 128 * 2^20 + 128^2) * 2 B at 0.8 * 2039 GB/s =
   * 329.1 us; plus the pass adding the 27 fp32 partial tiles (2 * 27 * 128^2 * 4 B +
   * 128^2 * 2 B: 2.2 us).  Fewer splits take longer than the traffic, more (no more
   * units fit in a wave) only add partials. */
  double K = 1 << 20;
  SimKernel k = gemm(SIM_DTYPE_FP16, 1, 128, 128, (int64_t)K);
  double unsplit = 108.0 * 2.0 * 128 * 128 * K / (312e12 * 0.75);
  assert_close(sim_cost_model_kernel_time(one, &dev, &k), unsplit + 5e-6);
  double compute = 108.0 * 2 * 64 * 64 * 38837 / (0.5 * 0.75 * 312e12);
  double memory = (2.0 * 128 * K + 128.0 * 128) * 2 / (2039e9 * 0.8);
  double reduce = (2.0 * 27 * 128 * 128 * 4 + 128.0 * 128 * 2) / (2039e9 * 0.8);
  cr_assert_lt(compute, memory);
  assert_close(sim_cost_model_kernel_time(m, &dev, &k), memory + reduce + 5e-6);
  cr_assert_lt(memory + reduce, unsplit / 40);
}

Test(roofline, small_tiles_run_slower_on_tensor_cores_only)
{
  SimDeviceSpec dev = a100();
  g_autoptr(SimCostModel) m = sim_cost_model_new_roofline(NULL);
  /* 64 x 64 outputs over K = 256 in fp16.  Smaller tiles run slower (a 64 x 64 tile reuses
   * 32 elements per load against 64 for 128 x 128, half the rate; 32 x 32 a quarter) but
   * spread the work: four 32 x 32 tiles with K split 4 ways (slices of 64) are 16 units in
   * one wave, 108 * 2 * 32^2 * 64 FLOPs at 0.25 * 0.75 * 312 TFLOP/s = 0.242 us, which
   * beats one 64 x 64 tile split 4 ways (0.484 us); the traffic, (64 * 256 * 2 + 64^2) *
   * 2 B = 73.7 kB, takes 0.045 us; the partials' pass, (2 * 4 * 64^2 * 4 + 64^2 * 2) B =
   * 139.3 kB, 0.085 us. */
  SimKernel k = gemm(SIM_DTYPE_FP16, 1, 64, 64, 256);
  double compute = 108.0 * 2 * 32 * 32 * 64 / (0.25 * 0.75 * 312e12);
  double reduce = (2.0 * 4 * 64 * 64 * 4 + 64.0 * 64 * 2) / (2039e9 * 0.8);
  assert_close(sim_cost_model_kernel_time(m, &dev, &k), compute + reduce + 5e-6);
  /* In fp32 on the CUDA cores every tile runs at the full rate (at the CUDA cores'
   * efficiency), so the four 32 x 32 tiles split 4 ways take a quarter of what one 64 x 64
   * tile would: 108 * 2 * 32^2 * 64 FLOPs at 0.8 * 19.5 TFLOP/s = 0.907 us. */
  SimKernel f = gemm(SIM_DTYPE_FP32, 1, 64, 64, 256);
  double reduce32 = (2.0 * 4 * 64 * 64 * 4 + 64.0 * 64 * 4) / (2039e9 * 0.8);
  assert_close(sim_cost_model_kernel_time(m, &dev, &f),
               108.0 * 2 * 32 * 32 * 64 / (0.8 * 19.5e12) + reduce32 + 5e-6);
}

Test(roofline, tf32_runs_fp32_gemms_on_the_tensor_cores)
{
  SimDeviceSpec dev = a100();
  dev.tf32_flops = 156e12;
  SimRooflineParams p = sim_roofline_params_default();
  g_autoptr(SimCostModel) fp32 = sim_cost_model_new_roofline(&p);
  p.tf32 = TRUE;
  g_autoptr(SimCostModel) tf32 = sim_cost_model_new_roofline(&p);
  /* 4096^3 in TF32: 1080 / 1024 of 2 * 4096^3 FLOPs (128 x 128 tiles or larger) at 0.75
   * of 156 TFLOP/s.  On the CUDA cores, where every tile runs at full rate, 128 x 64
   * tiles waste least (2048 tiles in 19 waves of 108: 2052 / 2048), at the CUDA cores'
   * 0.8 of 19.5. */
  SimKernel k = gemm(SIM_DTYPE_FP32, 1, 4096, 4096, 4096);
  double work = 2.0 * 4096.0 * 4096.0 * 4096.0;
  double cuda_cores = work * 2052.0 / 2048.0 / (19.5e12 * 0.8) + 5e-6;
  assert_close(sim_cost_model_kernel_time(fp32, &dev, &k), cuda_cores);
  assert_close(sim_cost_model_kernel_time(tf32, &dev, &k),
               work * 1080.0 / 1024.0 / (156e12 * 0.75) + 5e-6);
  /* A device without TF32 (V100) keeps its CUDA cores. */
  dev.tf32_flops = 0;
  assert_close(sim_cost_model_kernel_time(tf32, &dev, &k), cuda_cores);
  /* Memory-bound kernels keep their fp32 traffic either way. */
  SimKernel s = { .kind = SIM_KERNEL_MEMORY, .dtype = SIM_DTYPE_FP32, .flops = 1e6,
                  .bytes = 1e9 };
  assert_close(sim_cost_model_kernel_time(tf32, &dev, &s),
               sim_cost_model_kernel_time(fp32, &dev, &s));
}

Test(roofline, large_gemm_is_compute_bound)
{
  SimDeviceSpec dev = a100();
  SimRooflineParams p = no_quantization();
  g_autoptr(SimCostModel) m = sim_cost_model_new_roofline(&p);
  /* 4096^3 in fp16: 2 * 4096^3 = 1.374e11 FLOPs at 0.75 * 312 TFLOP/s = 587.3 us, against
   * 3 * 4096^2 * 2 B = 100.7 MB at 0.8 * 2039 GB/s = 61.7 us: compute bound, plus 5 us. */
  SimKernel k = gemm(SIM_DTYPE_FP16, 1, 4096, 4096, 4096);
  double want = 2.0 * 4096.0 * 4096.0 * 4096.0 / (312e12 * 0.75) + 5e-6;
  assert_close(sim_cost_model_kernel_time(m, &dev, &k), want);
  cr_assert(want > 592e-6 && want < 593e-6);
}

Test(roofline, large_gemm_with_wave_quantization)
{
  SimDeviceSpec dev = a100();
  SimRooflineParams p = fixed_tiles();
  g_autoptr(SimCostModel) m = sim_cost_model_new_roofline(&p);
  /* 4096 / 128 = 32 tiles a side, 1024 tiles; 108 SMs run them in ceil(1024 / 108) = 10
   * waves, as long as 1080 tiles: the work is 1080 / 1024 of the plain count. */
  SimKernel k = gemm(SIM_DTYPE_FP16, 1, 4096, 4096, 4096);
  double want = 2.0 * 4096.0 * 4096.0 * 4096.0 * 1080.0 / 1024.0 / (312e12 * 0.75) + 5e-6;
  assert_close(sim_cost_model_kernel_time(m, &dev, &k), want);
}

Test(roofline, tile_quantization_rounds_up_to_whole_tiles_and_waves)
{
  SimDeviceSpec dev = a100();
  SimRooflineParams p = fixed_tiles();
  g_autoptr(SimCostModel) m = sim_cost_model_new_roofline(&p);
  /* m = n = 129 needs 2 x 2 tiles of 128 x 128, as m = n = 256 does; both fit in one wave
   * of 108 SMs, which takes as long as 108 tiles: 108 * 128 * 128 * 4096 * 2 FLOPs =
   * 14.5 GFLOP at 0.75 * 312 TFLOP/s = 61.9 us, plus 5 us. */
  SimKernel small = gemm(SIM_DTYPE_FP16, 1, 129, 129, 4096);
  SimKernel big = gemm(SIM_DTYPE_FP16, 1, 256, 256, 4096);
  double t_small = sim_cost_model_kernel_time(m, &dev, &small);
  double t_big = sim_cost_model_kernel_time(m, &dev, &big);
  assert_close(t_small, t_big);
  double want = 108.0 * 128.0 * 128.0 * 4096.0 * 2.0 / (312e12 * 0.75) + 5e-6;
  assert_close(t_small, want);
  /* One more tile row (m = 257: 3 x 2 = 6 tiles) still fits the same wave. */
  SimKernel taller = gemm(SIM_DTYPE_FP16, 1, 257, 256, 4096);
  assert_close(sim_cost_model_kernel_time(m, &dev, &taller), want);
  /* A batch of 28 such GEMMs is 112 tiles: two waves. */
  SimKernel batched = gemm(SIM_DTYPE_FP16, 28, 256, 256, 4096);
  assert_close(sim_cost_model_kernel_time(m, &dev, &batched),
               2.0 * 108.0 * 128.0 * 128.0 * 4096.0 * 2.0 / (312e12 * 0.75) + 5e-6);
}

Test(roofline, tile_sizes_are_parameters)
{
  SimDeviceSpec dev = a100();
  SimRooflineParams p = sim_roofline_params_default();
  p.tile_m = 256;
  p.tile_n = 128;
  g_autoptr(SimCostModel) m = sim_cost_model_new_roofline(&p);
  /* 256 x 128 tiles: m = n = 256 is 1 x 2 tiles, one wave of 108 * 256 * 128 elements. */
  SimKernel k = gemm(SIM_DTYPE_FP16, 1, 256, 256, 4096);
  assert_close(sim_cost_model_kernel_time(m, &dev, &k),
               108.0 * 256.0 * 128.0 * 4096.0 * 2.0 / (312e12 * 0.75) + 5e-6);
}

Test(roofline, short_reductions_pay_the_tile_pipeline)
{
  SimDeviceSpec dev = a100();
  SimRooflineParams p = no_quantization();
  p.gemm_k_overhead = 256;
  g_autoptr(SimCostModel) m = sim_cost_model_new_roofline(&p);
  /* K = 1024 with 256 elements of overhead: 1.25 times the arithmetic of 4096 x 4096 x
   * 1024 (34.4 GFLOP, 146.8 us at 0.75 * 312 TFLOP/s, against 50 MB of traffic in 31 us),
   * plus 5 us.  K = 12288 pays 1 + 256 / 12288: large reductions hardly notice. */
  SimKernel k = gemm(SIM_DTYPE_FP16, 1, 4096, 4096, 1024);
  assert_close(sim_cost_model_kernel_time(m, &dev, &k),
               1.25 * 2.0 * 4096.0 * 4096.0 * 1024.0 / (312e12 * 0.75) + 5e-6);
  SimKernel wide = gemm(SIM_DTYPE_FP16, 1, 4096, 4096, 12288);
  assert_close(sim_cost_model_kernel_time(m, &dev, &wide),
               (12288.0 + 256.0) / 12288.0 * 2.0 * 4096.0 * 4096.0 * 12288.0 / (312e12 * 0.75) +
                 5e-6);
  /* Without it, the plain count. */
  SimRooflineParams q = no_quantization();
  g_autoptr(SimCostModel) plain = sim_cost_model_new_roofline(&q);
  assert_close(sim_cost_model_kernel_time(plain, &dev, &k),
               2.0 * 4096.0 * 4096.0 * 1024.0 / (312e12 * 0.75) + 5e-6);
}

Test(roofline, no_gemm_beats_the_measured_ceiling)
{
  SimDeviceSpec dev = a100();
  SimRooflineParams p = no_quantization();
  p.gemm_efficiency = 0.93;
  p.gemm_k_overhead = 480;
  p.gemm_ceiling = 0.869;
  g_autoptr(SimCostModel) m = sim_cost_model_new_roofline(&p);
  /* K = 1024: 0.93 * 1024 / 1504 = 0.633 of peak, under the ceiling: the K model alone. */
  SimKernel k = gemm(SIM_DTYPE_FP16, 1, 4096, 4096, 1024);
  assert_close(sim_cost_model_kernel_time(m, &dev, &k),
               (1024.0 + 480.0) / 1024.0 * 2.0 * 4096.0 * 4096.0 * 1024.0 / (312e12 * 0.93) +
                 5e-6);
  /* K = 32768: the K model would give 0.93 * 32768 / 33248 = 0.917 of peak (286 TFLOP/s,
   * more than any shape measures on an A100); the ceiling holds it at 0.869 (271 TFLOP/s)
   * of its useful 2 M N K. */
  SimKernel wide = gemm(SIM_DTYPE_FP16, 1, 4096, 4096, 32768);
  assert_close(sim_cost_model_kernel_time(m, &dev, &wide),
               2.0 * 4096.0 * 4096.0 * 32768.0 / (312e12 * 0.869) + 5e-6);
  /* Without a ceiling, the K model's rate. */
  p.gemm_ceiling = 0;
  g_autoptr(SimCostModel) open = sim_cost_model_new_roofline(&p);
  assert_close(sim_cost_model_kernel_time(open, &dev, &wide),
               (32768.0 + 480.0) / 32768.0 * 2.0 * 4096.0 * 4096.0 * 32768.0 / (312e12 * 0.93) +
                 5e-6);
}

Test(roofline, unaligned_gemms_run_at_their_own_efficiency)
{
  SimDeviceSpec dev = a100();
  SimRooflineParams p = no_quantization();
  p.gemm_unaligned_efficiency = 0.4;
  g_autoptr(SimCostModel) m = sim_cost_model_new_roofline(&p);
  /* 4096 x 50304 x 1024 in fp16 (every dimension a multiple of 8): 422 GFLOP at
   * 0.75 * 312 TFLOP/s, plus 5 us. */
  double aligned = 2.0 * 4096.0 * 50304.0 * 1024.0 / (312e12 * 0.75) + 5e-6;
  SimKernel k = gemm(SIM_DTYPE_FP16, 1, 4096, 50304, 1024);
  assert_close(sim_cost_model_kernel_time(m, &dev, &k), aligned);
  /* An odd vocabulary of 50,257 as n, as k (the input gradient) or as m (the weight
   * gradient): 0.4 of the rate. */
  double odd = 2.0 * 4096.0 * 50257.0 * 1024.0 / (312e12 * 0.75 * 0.4) + 5e-6;
  SimKernel n = gemm(SIM_DTYPE_FP16, 1, 4096, 50257, 1024);
  assert_close(sim_cost_model_kernel_time(m, &dev, &n), odd);
  SimKernel kk = gemm(SIM_DTYPE_FP16, 1, 4096, 1024, 50257);
  assert_close(sim_cost_model_kernel_time(m, &dev, &kk), odd);
  SimKernel mm = gemm(SIM_DTYPE_FP16, 1, 50257, 1024, 4096);
  assert_close(sim_cost_model_kernel_time(m, &dev, &mm), odd);
  /* fp32 needs multiples of 4 only: 4100 is aligned there, not in fp16. */
  SimKernel f32 = gemm(SIM_DTYPE_FP32, 1, 4096, 4100, 1024);
  SimRooflineParams q = no_quantization();
  q.gemm_unaligned_efficiency = 1;
  g_autoptr(SimCostModel) plain = sim_cost_model_new_roofline(&q);
  assert_close(sim_cost_model_kernel_time(m, &dev, &f32),
               sim_cost_model_kernel_time(plain, &dev, &f32));
  SimKernel h = gemm(SIM_DTYPE_FP16, 1, 4096, 4100, 1024);
  assert_close(sim_cost_model_kernel_time(m, &dev, &h) - 5e-6,
               (sim_cost_model_kernel_time(plain, &dev, &h) - 5e-6) / 0.4);
  /* Without the parameter, no penalty. */
  assert_close(sim_cost_model_kernel_time(plain, &dev, &n),
               2.0 * 4096.0 * 50257.0 * 1024.0 / (312e12 * 0.75) + 5e-6);
}

Test(roofline, memory_kernel_is_bandwidth_bound)
{
  SimDeviceSpec dev = a100();
  g_autoptr(SimCostModel) m = sim_cost_model_new_roofline(NULL);
  /* 1 GB at 0.8 * 2039 GB/s = 613.0 us; its 0.25 GFLOP at 0.8 * 19.5 TFLOP/s take 16 us. */
  SimKernel k = { .kind = SIM_KERNEL_MEMORY, .dtype = SIM_DTYPE_FP16, .flops = 0.25e9,
                  .bytes = 1e9 };
  double want = 1e9 / (2039e9 * 0.8) + 5e-6;
  assert_close(sim_cost_model_kernel_time(m, &dev, &k), want);
  /* The optimizer's update is memory bound in the same way. */
  k.kind = SIM_KERNEL_OPTIMIZER;
  assert_close(sim_cost_model_kernel_time(m, &dev, &k), want);
  /* Gathers reach half the bandwidth: 1 GB / (0.5 * 2039 GB/s) = 980.9 us. */
  k.kind = SIM_KERNEL_GATHER;
  assert_close(sim_cost_model_kernel_time(m, &dev, &k), 1e9 / (2039e9 * 0.5) + 5e-6);
}

Test(roofline, small_gemm_is_memory_bound)
{
  SimDeviceSpec dev = a100();
  SimRooflineParams p = no_quantization();
  g_autoptr(SimCostModel) m = sim_cost_model_new_roofline(&p);
  /* A matrix-vector product 8192 x 8192 x 1 in fp16: 134 MFLOP (0.57 us at 234 TFLOP/s)
   * but 134 MB of weights to read (82.3 us at 1631 GB/s). */
  SimKernel k = gemm(SIM_DTYPE_FP16, 1, 8192, 1, 8192);
  double bytes = (8192.0 * 8192 + 8192 + 8192) * 2;
  assert_close(sim_cost_model_kernel_time(m, &dev, &k), bytes / (2039e9 * 0.8) + 5e-6);
}

Test(roofline, recurrent_steps_run_one_after_the_other)
{
  SimDeviceSpec dev = a100();
  SimRooflineParams p = no_quantization();
  g_autoptr(SimCostModel) m = sim_cost_model_new_roofline(&p);
  /* 100 steps of a [64 x 4096] x [4096 x 1024] fp32 GEMM: each 2 * 64 * 1024 * 4096 =
   * 537 MFLOP at 0.3 * 19.5 TFLOP/s = 91.8 us (its 17.8 MB take 10.9 us), plus a launch
   * each: 100 * (91.8 + 5) us. */
  SimKernel k = { .kind = SIM_KERNEL_RECURRENT, .dtype = SIM_DTYPE_FP32, .m = 64, .n = 1024,
                  .k = 4096, .batch = 1, .steps = 100 };
  double step_flops = 2.0 * 64 * 1024 * 4096;
  k.flops = 100 * step_flops;
  k.bytes = 100 * (64.0 * 4096 + 4096.0 * 1024 + 64.0 * 1024) * 4;
  double want = 100 * (step_flops / (19.5e12 * 0.3) + 5e-6);
  assert_close(sim_cost_model_kernel_time(m, &dev, &k), want);
}

Test(roofline, small_recurrent_weights_stay_on_chip)
{
  SimDeviceSpec dev = a100();
  SimRooflineParams p = no_quantization();
  g_autoptr(SimCostModel) m = sim_cost_model_new_roofline(&p);
  /* 1000 steps of [8 x 512] x [512 x 2048] in fp16 (an LSTM of 512): 2 MB of recurrent
   * weights fit in 108 SMs' 128 KB each, so a step moves only its 8 x (512 + 2048) fp16
   * values, and its 16.8 MFLOP at 0.3 * 312 TFLOP/s take 0.18 us; at hidden 4096 the 128 MB
   * of weights do not fit and each step reads them again, 78.5 us at 0.8 * 2039 GB/s. */
  SimKernel k = { .kind = SIM_KERNEL_RECURRENT, .dtype = SIM_DTYPE_FP16, .m = 8, .n = 2048,
                  .k = 512, .batch = 1, .steps = 1000 };
  double step_flops = 2.0 * 8 * 2048 * 512;
  k.flops = 1000 * step_flops;
  k.bytes = 1000 * (8.0 * 512 + 512.0 * 2048 + 8.0 * 2048) * 2;
  double on_chip = (8.0 * 512 + 8.0 * 2048) * 2 / (2039e9 * 0.8);
  assert_close(sim_cost_model_kernel_time(m, &dev, &k),
               1000 * (MAX(step_flops / (312e12 * 0.3), on_chip) + 5e-6));
  SimKernel big = { .kind = SIM_KERNEL_RECURRENT, .dtype = SIM_DTYPE_FP16, .m = 8,
                    .n = 16384, .k = 4096, .batch = 1, .steps = 10 };
  double big_flops = 2.0 * 8 * 16384 * 4096;
  big.flops = 10 * big_flops;
  big.bytes = 10 * (8.0 * 4096 + 4096.0 * 16384 + 8.0 * 16384) * 2;
  double read = (8.0 * 4096 + 4096.0 * 16384 + 8.0 * 16384) * 2 / (2039e9 * 0.8);
  assert_close(sim_cost_model_kernel_time(m, &dev, &big),
               10 * (MAX(big_flops / (312e12 * 0.3), read) + 5e-6));
}

Test(roofline, conv_uses_its_efficiency)
{
  SimDeviceSpec dev = a100();
  SimRooflineParams p = no_quantization();
  g_autoptr(SimCostModel) m = sim_cost_model_new_roofline(&p);
  /* A 3x3 conv as an implicit GEMM m = 32*56*56, n = 256, k = 256*9 in fp16:
   * 2 * 100352 * 256 * 2304 = 118.4 GFLOP at 0.6 * 312 TFLOP/s = 632.4 us. */
  SimKernel k = gemm(SIM_DTYPE_FP16, 1, 100352, 256, 2304);
  k.kind = SIM_KERNEL_CONV;
  assert_close(sim_cost_model_kernel_time(m, &dev, &k),
               2.0 * 100352 * 256 * 2304 / (312e12 * 0.6) + 5e-6);
}

Test(roofline, dtypes_without_a_peak_use_fp32)
{
  SimDeviceSpec dev = a100();
  SimRooflineParams p = no_quantization();
  g_autoptr(SimCostModel) m = sim_cost_model_new_roofline(&p);
  /* No fp8 peak on this device: fp8 GEMMs run at the fp32 rate, on the CUDA cores. */
  SimKernel k = gemm(SIM_DTYPE_FP8, 1, 4096, 4096, 4096);
  k.bytes = 0;
  assert_close(sim_cost_model_kernel_time(m, &dev, &k),
               2.0 * 4096.0 * 4096.0 * 4096.0 / (19.5e12 * 0.8) + 5e-6);
}

/* --precision fp8 on an H100 SXM (NVIDIA H100 datasheet: 989.4 TFLOP/s dense bf16, 1978.9
 * fp8, 3.35 TB/s): a linear layer's 8192 x 8192 x 8192 GEMM runs at the fp8 peak and first
 * casts both operands, 3 bytes an element at the streaming bandwidth, and so do a
 * mixture's grouped GEMMs; attention's batched products stay in bf16 and cast nothing. */
Test(roofline, fp8_gemms_pay_their_casts)
{
  SimDeviceSpec dev = a100();
  dev.peak_flops[SIM_DTYPE_BF16] = 989.4e12;
  dev.peak_flops[SIM_DTYPE_FP8] = 1978.9e12;
  dev.peak_flops[SIM_DTYPE_FP32] = 66.9e12;
  dev.mem_bandwidth = 3.35e12;
  dev.sm_count = 132;
  SimRooflineParams p = no_quantization();
  p.fp8 = TRUE;
  g_autoptr(SimCostModel) m = sim_cost_model_new_roofline(&p);
  int64_t n = 8192;
  SimKernel k = gemm(SIM_DTYPE_BF16, 1, n, n, n);
  double cast = 3.0 * 2 * n * n / (3.35e12 * p.memory_efficiency);
  assert_close(sim_roofline_fp8_cast_seconds(&p, &dev, &k), cast);
  double flops = 2.0 * n * n * n;
  assert_close(sim_cost_model_kernel_time(m, &dev, &k),
               flops / (1978.9e12 * p.gemm_efficiency) + cast + 5e-6);
  SimKernel batched = gemm(SIM_DTYPE_BF16, 4, n, n, 128);
  cr_assert_eq(sim_roofline_fp8_cast_seconds(&p, &dev, &batched), 0.0);
  /* A mixture's grouped GEMM of 4 experts is a linear layer's: at the fp8 peak, each
   * product's operands cast. */
  SimKernel grouped = gemm(SIM_DTYPE_BF16, 4, n, n, n);
  grouped.flags = SIM_KERNEL_GROUPED;
  assert_close(sim_roofline_fp8_cast_seconds(&p, &dev, &grouped), 4 * cast);
  assert_close(sim_cost_model_kernel_time(m, &dev, &grouped),
               4 * flops / (1978.9e12 * p.gemm_efficiency) + 4 * cast + 5e-6);
  p.fp8 = FALSE;
  cr_assert_eq(sim_roofline_fp8_cast_seconds(&p, &dev, &k), 0.0);
}

Test(roofline, flash_attention_runs_its_tiles_in_waves)
{
  SimDeviceSpec dev = a100();
  g_autoptr(SimCostModel) m = sim_cost_model_new_roofline(NULL);
  /* 16 heads of 64 over 4096 queries and keys: 32 blocks of 128 queries a head, 512 in
   * all, in ceil(512 / 108) = 5 waves; each block visits the 32 key blocks, a pair costing
   * 4 * 128^2 * 64 FLOPs at 0.7 * 312 TFLOP/s / 108 an SM: 160 pairs' time, 331.9 us. */
  SimKernel k = { .kind = SIM_KERNEL_ATTENTION, .dtype = SIM_DTYPE_FP16, .batch = 16,
                  .m = 4096, .n = 4096, .k = 64, .steps = 1, .bytes = 1e6 };
  double pair = 4.0 * 128 * 128 * 64, per_sm = 0.7 * 312e12 / 108;
  assert_close(sim_cost_model_kernel_time(m, &dev, &k), 5 * 32 * pair / per_sm + 5e-6);
  /* Causal: block i visits i + 1 key blocks, 16.5 on average: the waves hold 5 x 16.5
   * pairs' time, more than the longest block's 32. */
  k.flags = SIM_KERNEL_CAUSAL;
  assert_close(sim_cost_model_kernel_time(m, &dev, &k), 5 * 16.5 * pair / per_sm + 5e-6);
  /* Backward: 2.5 times the FLOPs a pair, at 0.55 of the peak. */
  k.flags = SIM_KERNEL_CAUSAL | SIM_KERNEL_BACKWARD;
  assert_close(sim_cost_model_kernel_time(m, &dev, &k),
               5 * 16.5 * 2.5 * pair / (0.55 * 312e12 / 108) + 5e-6);
  /* One head of 1024 queries: 8 blocks on 108 SMs, one wave as long as a block's 8 pairs
   * (causal: the last block's 8, not the mean 4.5). */
  SimKernel one = { .kind = SIM_KERNEL_ATTENTION, .dtype = SIM_DTYPE_FP16, .batch = 1,
                    .m = 1024, .n = 1024, .k = 64, .steps = 1, .flags = SIM_KERNEL_CAUSAL };
  assert_close(sim_cost_model_kernel_time(m, &dev, &one), 8 * pair / per_sm + 5e-6);
}

Test(roofline, hopper_attention_runs_at_its_measured_fraction)
{
  const SimDeviceSpec *h100 = sim_device_library_lookup("h100-sxm");
  cr_assert_not_null(h100);
  cr_assert_float_eq(h100->attention_fraction, 0.560, 1e-12);
  cr_assert_float_eq(h100->attention_bwd_fraction, 0.540, 1e-12);
  g_autoptr(SimCostModel) m = sim_cost_model_new_roofline(NULL);
  /* 132 heads of 128 over 128 queries and keys: one block a head, one wave on the 132
   * SMs, one pair each: 4 * 128^3 FLOPs at 0.560 (not the default 0.70) of 989.4 TFLOP/s
   * over 132 SMs, plus the 4 us launch. */
  SimKernel k = { .kind = SIM_KERNEL_ATTENTION, .dtype = SIM_DTYPE_BF16, .batch = 132,
                  .m = 128, .n = 128, .k = 128, .steps = 1, .bytes = 1e3 };
  double pair = 4.0 * 128 * 128 * 128;
  assert_close(sim_cost_model_kernel_time(m, h100, &k), pair / (0.560 * 989.4e12 / 132) + 4e-6);
  /* Backward: 2.5 pairs' FLOPs at 0.540. */
  k.flags = SIM_KERNEL_BACKWARD;
  assert_close(sim_cost_model_kernel_time(m, h100, &k),
               2.5 * pair / (0.540 * 989.4e12 / 132) + 4e-6);
  /* The H200 has the same die and fractions, and the same time. */
  const SimDeviceSpec *h200 = sim_device_library_lookup("h200");
  assert_close(sim_cost_model_kernel_time(m, h200, &k),
               2.5 * pair / (0.540 * 989.4e12 / 132) + 4e-6);
  /* The fraction caps the efficiency: a lower one set by the user still applies. */
  SimRooflineParams p = sim_roofline_params_default();
  p.attention_bwd_efficiency = 0.4;
  g_autoptr(SimCostModel) low = sim_cost_model_new_roofline(&p);
  assert_close(sim_cost_model_kernel_time(low, h100, &k),
               2.5 * pair / (0.4 * 989.4e12 / 132) + 4e-6);
  /* A device without a measured fraction keeps the default: the same kernel on an
   * H100 whose fractions are cleared runs at 0.55 backward. */
  SimDeviceSpec bare = *h100;
  bare.attention_fraction = bare.attention_bwd_fraction = 0;
  assert_close(sim_cost_model_kernel_time(m, &bare, &k),
               2.5 * pair / (0.55 * 989.4e12 / 132) + 4e-6);
}

Test(roofline, nchw_convolutions_transpose_around_tensor_core_kernels)
{
  SimDeviceSpec dev = a100();
  SimRooflineParams p = sim_roofline_params_default();
  g_autoptr(SimCostModel) nhwc = sim_cost_model_new_roofline(&p);
  p.conv_nchw = TRUE;
  g_autoptr(SimCostModel) nchw = sim_cost_model_new_roofline(&p);
  /* A 3x3 convolution as m = 32*56*56, n = 256, k = 256*9 in fp16 that moves 100 MB: in
   * NCHW its operands are read and written once more (200 MB at 0.8 * 2039 GB/s) by two
   * more kernels. */
  SimKernel k = gemm(SIM_DTYPE_FP16, 1, 100352, 256, 2304);
  k.kind = SIM_KERNEL_CONV;
  k.bytes = 100e6;
  assert_close(sim_cost_model_kernel_time(nchw, &dev, &k),
               sim_cost_model_kernel_time(nhwc, &dev, &k) + 200e6 / (2039e9 * 0.8) + 10e-6);
  /* fp32 on the CUDA cores runs NCHW natively. */
  k.dtype = SIM_DTYPE_FP32;
  assert_close(sim_cost_model_kernel_time(nchw, &dev, &k),
               sim_cost_model_kernel_time(nhwc, &dev, &k));
}

Test(roofline, the_devices_best_matmul_caps_every_shape)
{
  SimDeviceSpec dev = a100();
  SimRooflineParams p = sim_roofline_params_default();
  p.gemm_efficiency = 1.0;
  g_autoptr(SimCostModel) m = sim_cost_model_new_roofline(&p);
  /* At full efficiency a 4096^3 fp16 GEMM takes 1080 / 1024 of its FLOPs at the peak;
   * a device measured never to pass 0.8 of the peak caps it at that rate. */
  SimKernel k = gemm(SIM_DTYPE_FP16, 1, 4096, 4096, 4096);
  double work = 2.0 * 4096.0 * 4096.0 * 4096.0;
  assert_close(sim_cost_model_kernel_time(m, &dev, &k), work * 1080 / 1024 / 312e12 + 5e-6);
  dev.matmul_fraction = 0.8;
  assert_close(sim_cost_model_kernel_time(m, &dev, &k), work / (0.8 * 312e12) + 5e-6);
  /* The cap is for 16-bit products: fp32 on the CUDA cores keeps its own rate. */
  SimKernel f = gemm(SIM_DTYPE_FP32, 1, 4096, 4096, 4096);
  dev.matmul_fraction = 0;
  double before = sim_cost_model_kernel_time(m, &dev, &f);
  dev.matmul_fraction = 0.1;
  assert_close(sim_cost_model_kernel_time(m, &dev, &f), before);
}

/* The roofline is pure: concurrent callers get what one caller gets. */
typedef struct {
  SimCostModel *m;
  const SimDeviceSpec *dev;
  double result;
} ThreadArgs;

static gpointer price_many(gpointer data)
{
  ThreadArgs *a = data;
  double sum = 0;
  for (int i = 1; i <= 2000; i++) {
    SimKernel k = gemm(SIM_DTYPE_FP16, 1, 64 * i, 512, 1024);
    sum += sim_cost_model_kernel_time(a->m, a->dev, &k);
  }
  a->result = sum;
  return NULL;
}

Test(roofline, is_thread_safe)
{
  SimDeviceSpec dev = a100();
  g_autoptr(SimCostModel) m = sim_cost_model_new_roofline(NULL);
  ThreadArgs serial = { m, &dev, 0 };
  price_many(&serial);
  ThreadArgs args[4];
  GThread *threads[4];
  for (int i = 0; i < 4; i++) {
    args[i] = (ThreadArgs){ m, &dev, 0 };
    threads[i] = g_thread_new("price", price_many, &args[i]);
  }
  for (int i = 0; i < 4; i++) {
    g_thread_join(threads[i]);
    cr_assert_eq(args[i].result, serial.result);
  }
}

/* ---------------------------------------------------------------------------------- */
/* The stack                                                                          */

static int finalized;

/* A "profile" that knows the forward pass of op 1 only: 1 ms. */
static double known_op_time(SimCostModel *self, const SimDeviceSpec *dev, const SimGraph *g,
                            int op, const int64_t *extent, SimPass pass)
{
  return op == 1 && pass == SIM_PASS_FORWARD ? 1e-3 : -1.0;
}

/* Every kernel takes 1 s: makes "priced by this model" visible. */
static double one_second(SimCostModel *self, const SimDeviceSpec *dev, const SimKernel *k)
{
  return 1.0;
}

static void count_finalize(SimCostModel *self)
{
  finalized++;
}

static const SimCostModelClass profile_class = {
  .api_version = SIM_COST_MODEL_API_VERSION,
  .name = "test-profile",
  .kernel_time = one_second,
  .op_time = known_op_time,
  .finalize = count_finalize,
};

static const SimCostModelClass seconds_class = {
  .api_version = SIM_COST_MODEL_API_VERSION,
  .name = "test-seconds",
  .kernel_time = one_second,
  .op_time = NULL,
  .finalize = count_finalize,
};

static SimGraph *two_linears(void)
{
  SimGraph *g = sim_graph_new("two");
  int64_t xd[] = { 32, 1024 };
  int x = sim_graph_input(g, "x", SIM_DTYPE_FP16, 2, xd);
  int h = sim_graph_linear(g, "fc1", x, 4096, FALSE, SIM_UNARY_RELU);
  sim_graph_linear(g, "fc2", h, 1024, FALSE, SIM_UNARY_IDENTITY);
  cr_assert(sim_graph_check(g, NULL));
  return g;
}

Test(cost, stack_asks_the_fallback_for_what_it_does_not_know)
{
  SimDeviceSpec dev = a100();
  g_autoptr(SimGraph) g = two_linears();
  int fc1 = sim_graph_op_by_name(g, "fc1"), fc2 = sim_graph_op_by_name(g, "fc2");
  cr_assert_eq(fc1, 1, "the profile knows op 1");

  SimCostModel *roof = sim_cost_model_new_roofline(NULL);
  SimCostModel *top = g_new0(SimCostModel, 1);
  top->klass = &profile_class;
  top->fallback = roof;

  /* Known: the profile's answer. */
  assert_close(sim_cost_model_op_time(top, &dev, g, fc1, NULL, SIM_PASS_FORWARD), 1e-3);
  /* Unknown: the roofline's kernels, not the profile's 1 s per kernel. */
  SimWork w = { 0 };
  sim_graph_op_work(g, fc2, NULL, SIM_PASS_BACKWARD, &w);
  cr_assert_gt(w.n, 0);
  double want = 0;
  for (int i = 0; i < w.n; i++)
    want += sim_cost_model_kernel_time(roof, &dev, &w.k[i]);
  assert_close(sim_cost_model_op_time(top, &dev, g, fc2, NULL, SIM_PASS_BACKWARD), want);
  cr_assert_lt(want, 1.0);

  /* The stack owns its fallback: freeing the top frees both. */
  finalized = 0;
  sim_cost_model_free(top);
  cr_assert_eq(finalized, 1, "the profile's finalize ran; the roofline's frees its own");
}

Test(cost, model_without_op_time_prices_its_own_kernels)
{
  SimDeviceSpec dev = a100();
  g_autoptr(SimGraph) g = two_linears();
  int fc1 = sim_graph_op_by_name(g, "fc1");
  SimCostModel *m = g_new0(SimCostModel, 1);
  m->klass = &seconds_class;
  m->fallback = g_new0(SimCostModel, 1);
  m->fallback->klass = &seconds_class;
  /* One second per kernel of the work, whatever the fallback would say. */
  SimWork w = { 0 };
  sim_graph_op_work(g, fc1, NULL, SIM_PASS_FORWARD, &w);
  assert_close(sim_cost_model_op_time(m, &dev, g, fc1, NULL, SIM_PASS_FORWARD), (double)w.n);
  finalized = 0;
  sim_cost_model_free(m);
  cr_assert_eq(finalized, 2, "both models of the stack were finalized");
}

Test(cost, op_time_of_a_shard_sums_its_kernels)
{
  SimDeviceSpec dev = a100();
  g_autoptr(SimGraph) g = two_linears();
  int fc1 = sim_graph_op_by_name(g, "fc1");
  g_autoptr(SimCostModel) m = sim_cost_model_new_roofline(NULL);
  /* A shard of half the outputs does half the arithmetic: cheaper than the whole op. */
  int64_t extent[SIM_MAX_ITER];
  for (int d = 0; d < sim_graph_op_n_dims(g, fc1); d++)
    extent[d] = sim_graph_op_dim_size(g, fc1, d);
  for (int d = 0; d < sim_graph_op_n_dims(g, fc1); d++)
    if (sim_graph_op_dim_role(g, fc1, d) == SIM_ROLE_PARAMETER)
      extent[d] /= 2;
  double whole = sim_cost_model_op_time(m, &dev, g, fc1, NULL, SIM_PASS_FORWARD);
  double half = sim_cost_model_op_time(m, &dev, g, fc1, extent, SIM_PASS_FORWARD);
  cr_assert_gt(whole, 0);
  cr_assert_lt(half, whole);
  SimWork w = { 0 };
  sim_graph_op_work(g, fc1, extent, SIM_PASS_FORWARD, &w);
  double want = 0;
  for (int i = 0; i < w.n; i++)
    want += sim_cost_model_kernel_time(m, &dev, &w.k[i]);
  assert_close(half, want);
}
