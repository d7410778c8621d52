/* devices.c — the library of accelerator specifications, with the sources of their figures.
 *
 * Conventions for every entry:
 * - peak_flops are dense (no structured sparsity) at the boost clock: fp32 on the CUDA
 *   cores (no TF32), fp16 and bf16 on the tensor cores where the device has them, fp8 only
 *   on Hopper.  tf32_flops is the tensor cores' TF32 rate (Ampere and Hopper), which fp32
 *   GEMMs and convolutions use when the framework allows it.
 * - matmul_fraction and matmul_fraction_fp8: the best fraction of the peak any matrix
 *   product shape reached in S. Bekman's "Maximum Achievable Matmul FLOPS" tables
 *   (github.com/stas00/ml-engineering, compute/accelerator: a search over shapes with
 *   PyTorch's matmul, bf16 and fp8; the H200 figure is the GH200's, the same die).  0 means the device cannot compute in that type; a cost model must not
 *   price such a kernel on it.
 * - int32 and int64 carry the integer ALU rate of the CUDA cores (the whitepapers' "INT32
 *   TOPS", or the fp32 rate where a whitepaper gives none because integer and float
 *   share the cores).  Integer tensors of a training graph are indices and labels:
 *   kernels on them move data rather than compute, so a plausible nonzero rate is all a
 *   cost model needs from these two entries.
 * - mem_capacity is the datasheet capacity read as GiB (2^30 bytes); what one process can
 *   allocate is a few percent less (ECC, the CUDA context), which memory checks leave to
 *   their margin.
 * - launch_overhead is the host-side cost of one kernel launch: an empty kernel launched
 *   back to back costs 3 to 7 us (M. Boyer, "CUDA Kernel Overhead", University of
 *   Virginia), about 5 us on Kepler and Pascal systems and 4 us on later ones.  A profile
 *   database measures it per machine and overrides it.
 */
#include "sim-private.h"

#include <string.h>

#define TERA 1e12

/* Fused attention on Hopper (attention_fraction, attention_bwd_fraction).  Transformer
 * Engine runs 16-bit attention on Hopper with cuDNN's fused kernel rather than
 * FlashAttention-2, for speed (its backend selection; docs/llm.md gives the source).
 * Shah et al., "FlashAttention-3" (2024), figures 5 and 6, measured cuDNN's kernel on an
 * H100 SXM5 at head dimension 128, 16,384 tokens a batch and 16 heads: 529
 * TFLOP/s forward with a causal mask and 518 backward without one, at 8,192 positions
 * (FLOPs of the unmasked pairs).  At that shape, 2 x 16 heads x 64 query blocks on 132
 * SMs, the roofline's attention (sim/roofline.c, attention_seconds()) runs 16 waves; the
 * causal forward's 2048 x 32 useful pairs fill 2048 x 32 / (16 x 32.5 x 132) = 0.9548 of
 * them and the unmasked backward's 2048 x 64 pairs 2048 / (16 x 132) = 0.9697, so the
 * fractions that reproduce the measurements are 529 / (989.4 x 0.9548) = 0.560 forward
 * and 518 / (989.4 x 0.9697) = 0.540 backward: below the 0.70 and 0.55 that
 * FlashAttention-2 reaches on an A100 (the roofline's defaults).  Hopper doubles the
 * tensor cores' rate an SM over Ampere but not the rate of the exponentials a softmax
 * needs (the same paper, section 3), so attention keeps a smaller share of the peak. */
#define H100_ATTENTION_FWD 0.560
#define H100_ATTENTION_BWD 0.540
#define GIGA 1e9
#define GIB ((int64_t)1 << 30)

/* fp32, fp16, bf16, fp8, int32, int64, in the order of SimDType. */
#define PEAKS(fp32, fp16, bf16, fp8, int32) { (fp32), (fp16), (bf16), (fp8), (int32), (int32) }

static const SimDeviceSpec library[] = {
  {
    /* One GK210 die: a K80 board carries two, and each appears as its own CUDA device.
     * 2496 cores x 2 FLOP x 875 MHz boost = 4.37 TFLOP/s; half of the board's 480 GB/s
     * and 24 GB.  GK210 has no half-precision arithmetic. */
    .name = "k80",
    .vendor_name = "NVIDIA Tesla K80 (one GK210 die)",
    .peak_flops = PEAKS(4.37 * TERA, 0, 0, 0, 4.37 * TERA),
    .mem_bandwidth = 240 * GIGA,
    .mem_capacity = 12 * GIB,
    .sm_count = 13,
    .launch_overhead = 5e-6,
    .source = "NVIDIA Tesla K80 datasheet 2015 (board figures halved per GK210 die); "
              "Kepler GK110/GK210 whitepaper",
  },
  {
    /* Pascal computes fp16 as half2 on the CUDA cores at twice the fp32 rate; no bf16. */
    .name = "p100",
    .vendor_name = "NVIDIA Tesla P100 SXM2 16GB",
    .peak_flops = PEAKS(10.6 * TERA, 21.2 * TERA, 0, 0, 10.6 * TERA),
    .mem_bandwidth = 732 * GIGA,
    .mem_capacity = 16 * GIB,
    .sm_count = 56,
    .launch_overhead = 5e-6,
    .source = "NVIDIA Tesla P100 datasheet 2016 (SXM2: 10.6 TFLOPS fp32, 21.2 fp16, 732 GB/s); "
              "Pascal GP100 whitepaper",
  },
  {
    /* Volta's tensor cores run fp16 with fp32 accumulation at 125 TFLOP/s; no bf16. */
    .name = "v100-16gb",
    .vendor_name = "NVIDIA Tesla V100 SXM2 16GB",
    .peak_flops = PEAKS(15.7 * TERA, 125 * TERA, 0, 0, 15.7 * TERA),
    .mem_bandwidth = 900 * GIGA,
    .mem_capacity = 16 * GIB,
    .sm_count = 80,
    .launch_overhead = 4e-6,
    .source = "NVIDIA Tesla V100 datasheet 2018 (SXM2: 15.7 TFLOPS fp32, 125 tensor, 900 GB/s); "
              "Volta GV100 whitepaper (15.7 TOPS int32)",
  },
  {
    .name = "v100-32gb",
    .vendor_name = "NVIDIA Tesla V100 SXM2 32GB",
    .peak_flops = PEAKS(15.7 * TERA, 125 * TERA, 0, 0, 15.7 * TERA),
    .mem_bandwidth = 900 * GIGA,
    .mem_capacity = 32 * GIB,
    .sm_count = 80,
    .launch_overhead = 4e-6,
    .source = "NVIDIA Tesla V100 datasheet 2018 (SXM2 32GB: 15.7 TFLOPS fp32, 125 tensor, "
              "900 GB/s); Volta GV100 whitepaper",
  },
  {
    .name = "a100-40gb",
    .vendor_name = "NVIDIA A100 SXM4 40GB",
    .peak_flops = PEAKS(19.5 * TERA, 312 * TERA, 312 * TERA, 0, 19.5 * TERA),
    .mem_bandwidth = 1555 * GIGA,
    .mem_capacity = 40 * GIB,
    .sm_count = 108,
    .launch_overhead = 4e-6,
    .tf32_flops = 156 * TERA, /* TF32 tensor dense: A100 datasheet 2021 */
    .matmul_fraction = 0.869, /* 271.2 of 312 TFLOP/s, bf16 (MAMF table) */
    .source = "NVIDIA A100 datasheet 2021 (40GB SXM: 19.5 TFLOPS fp32, 312 fp16/bf16 tensor "
              "dense, 1555 GB/s); A100 whitepaper (19.5 TOPS int32, 108 SMs)",
  },
  {
    .name = "a100-80gb",
    .vendor_name = "NVIDIA A100 SXM4 80GB",
    .peak_flops = PEAKS(19.5 * TERA, 312 * TERA, 312 * TERA, 0, 19.5 * TERA),
    .mem_bandwidth = 2039 * GIGA,
    .mem_capacity = 80 * GIB,
    .sm_count = 108,
    .launch_overhead = 4e-6,
    .tf32_flops = 156 * TERA, /* TF32 tensor dense: A100 datasheet 2021 */
    .matmul_fraction = 0.869, /* 271.2 of 312 TFLOP/s, bf16 (MAMF table) */
    .source = "NVIDIA A100 datasheet 2021 (80GB SXM: 19.5 TFLOPS fp32, 312 fp16/bf16 tensor "
              "dense, 2039 GB/s); A100 whitepaper (19.5 TOPS int32, 108 SMs)",
  },
  {
    /* The PCIe card has the SXM4 part's peak rates at a lower power limit; sustained
     * clocks under load are lower, which efficiency calibration absorbs. */
    .name = "a100-pcie-40gb",
    .vendor_name = "NVIDIA A100 PCIe 40GB",
    .peak_flops = PEAKS(19.5 * TERA, 312 * TERA, 312 * TERA, 0, 19.5 * TERA),
    .mem_bandwidth = 1555 * GIGA,
    .mem_capacity = 40 * GIB,
    .sm_count = 108,
    .launch_overhead = 4e-6,
    .tf32_flops = 156 * TERA, /* TF32 tensor dense: A100 datasheet 2021 */
    .matmul_fraction = 0.822, /* 256.4 of 312 TFLOP/s, A100 PCIe (MAMF table) */
    .source = "NVIDIA A100 datasheet 2021 (40GB PCIe: 19.5 TFLOPS fp32, 312 fp16/bf16 tensor "
              "dense, 1555 GB/s); A100 whitepaper",
  },
  {
    .name = "h100-sxm",
    .vendor_name = "NVIDIA H100 SXM5 80GB",
    .peak_flops = PEAKS(66.9 * TERA, 989.4 * TERA, 989.4 * TERA, 1978.9 * TERA, 33.5 * TERA),
    .mem_bandwidth = 3350 * GIGA,
    .mem_capacity = 80 * GIB,
    .sm_count = 132,
    .launch_overhead = 4e-6,
    .tf32_flops = 494.7 * TERA, /* TF32 tensor dense: H100 whitepaper (989.4 with sparsity) */
    .matmul_fraction = 0.801, /* 792.1 of 989 TFLOP/s bf16 (MAMF table) */
    .matmul_fraction_fp8 = 0.709, /* 1402.6 of 1979 TFLOP/s fp8 (MAMF table) */
    .attention_fraction = H100_ATTENTION_FWD,
    .attention_bwd_fraction = H100_ATTENTION_BWD,
    .source = "NVIDIA H100 datasheet 2023 (SXM: 67 TFLOPS fp32, 1979 fp16/bf16 and 3958 fp8 "
              "with sparsity, halved for dense; 3.35 TB/s); H100 whitepaper (66.9 fp32, "
              "989.4 fp16/bf16, 1978.9 fp8 dense, 33.5 TOPS int32, 132 SMs)",
  },
  {
    /* The same GH100 die and clocks as the H100 SXM5, with 141 GB of HBM3e. */
    .name = "h200",
    .vendor_name = "NVIDIA H200 SXM 141GB",
    .peak_flops = PEAKS(66.9 * TERA, 989.4 * TERA, 989.4 * TERA, 1978.9 * TERA, 33.5 * TERA),
    .mem_bandwidth = 4800 * GIGA,
    .mem_capacity = 141 * GIB,
    .sm_count = 132,
    .launch_overhead = 4e-6,
    .tf32_flops = 494.7 * TERA, /* TF32 tensor dense: H100 whitepaper (989.4 with sparsity) */
    .matmul_fraction = 0.830, /* 821.0 of 989 TFLOP/s bf16 on GH200 (MAMF table) */
    .matmul_fraction_fp8 = 0.734, /* 1453.4 of 1979 TFLOP/s fp8 (MAMF table) */
    /* Attention is bound by the SMs' tensor cores and exponentials, the same as the H100's. */
    .attention_fraction = H100_ATTENTION_FWD,
    .attention_bwd_fraction = H100_ATTENTION_BWD,
    .source = "NVIDIA H200 datasheet 2024 (SXM: 67 TFLOPS fp32, 1979 fp16/bf16 and 3958 fp8 "
              "with sparsity, halved for dense; 141 GB, 4.8 TB/s); H100 whitepaper for the "
              "GH100 die (132 SMs, 33.5 TOPS int32)",
  },
};

/* Other names users write for the same devices. */
static const struct {
  const char *alias;
  const char *name;
} aliases[] = {
  { "tesla-k80", "k80" },
  { "gk210", "k80" },
  { "p100-sxm2", "p100" },
  { "p100-16gb", "p100" },
  { "tesla-p100", "p100" },
  { "v100", "v100-16gb" },
  { "v100-sxm2", "v100-16gb" },
  { "v100-sxm2-16gb", "v100-16gb" },
  { "v100-sxm2-32gb", "v100-32gb" },
  { "a100", "a100-40gb" },
  { "a100-sxm4-40gb", "a100-40gb" },
  { "a100-sxm4-80gb", "a100-80gb" },
  { "a100-pcie", "a100-pcie-40gb" },
  { "h100", "h100-sxm" },
  { "h100-sxm5", "h100-sxm" },
  { "h100-sxm5-80gb", "h100-sxm" },
  { "h100-80gb", "h100-sxm" },
  { "h200-sxm", "h200" },
  { "h200-141gb", "h200" },
};

int sim_device_library_n(void)
{
  return (int)G_N_ELEMENTS(library);
}

const SimDeviceSpec *sim_device_library_get(int i)
{
  g_return_val_if_fail(i >= 0 && i < (int)G_N_ELEMENTS(library), NULL);
  return &library[i];
}

/* Lookups ignore case and treat '_' and ' ' like '-', so "A100_80GB" finds a100-80gb. */
static char *normalize_name(const char *name)
{
  char *s = g_ascii_strdown(name, -1);
  for (char *p = s; *p; p++)
    if (*p == '_' || *p == ' ')
      *p = '-';
  return s;
}

const SimDeviceSpec *sim_device_library_lookup(const char *name)
{
  g_return_val_if_fail(name != NULL, NULL);
  g_autofree char *key = normalize_name(name);
  for (size_t i = 0; i < G_N_ELEMENTS(aliases); i++)
    if (!strcmp(key, aliases[i].alias)) {
      g_free(key);
      key = g_strdup(aliases[i].name);
      break;
    }
  for (size_t i = 0; i < G_N_ELEMENTS(library); i++)
    if (!strcmp(key, library[i].name))
      return &library[i];
  return NULL;
}

/* Interned specs are never freed: strategies, reports and cost models keep pointers to
 * them past the machine that introduced them.  Equal specs share one copy, so loading the
 * same machine file again does not grow the table. */
static GMutex intern_lock;
static GPtrArray *interned;

static gboolean same_string(const char *a, const char *b)
{
  return g_strcmp0(a, b) == 0;
}

static gboolean spec_equal(const SimDeviceSpec *a, const SimDeviceSpec *b)
{
  if (!same_string(a->name, b->name) || !same_string(a->vendor_name, b->vendor_name) ||
      !same_string(a->source, b->source))
    return FALSE;
  for (int t = 0; t < SIM_DTYPE_COUNT; t++)
    if (a->peak_flops[t] != b->peak_flops[t])
      return FALSE;
  return a->mem_bandwidth == b->mem_bandwidth && a->mem_capacity == b->mem_capacity &&
         a->sm_count == b->sm_count && a->launch_overhead == b->launch_overhead &&
         a->tf32_flops == b->tf32_flops && a->matmul_fraction == b->matmul_fraction &&
         a->matmul_fraction_fp8 == b->matmul_fraction_fp8 &&
         a->attention_fraction == b->attention_fraction &&
         a->attention_bwd_fraction == b->attention_bwd_fraction;
}

const SimDeviceSpec *sim_device_spec_intern(const SimDeviceSpec *spec)
{
  g_return_val_if_fail(spec != NULL, NULL);
  for (size_t i = 0; i < G_N_ELEMENTS(library); i++)
    if (spec == &library[i] || spec_equal(spec, &library[i]))
      return &library[i];

  /* Fill the optional strings first, so that equal inputs compare equal to the copy. */
  SimDeviceSpec norm = *spec;
  if (!norm.name)
    norm.name = "custom";
  if (!norm.vendor_name)
    norm.vendor_name = norm.name;
  if (!norm.source)
    norm.source = "";

  g_mutex_lock(&intern_lock);
  if (!interned)
    interned = g_ptr_array_new();
  const SimDeviceSpec *found = NULL;
  for (guint i = 0; i < interned->len && !found; i++) {
    const SimDeviceSpec *s = interned->pdata[i];
    if (spec_equal(s, &norm))
      found = s;
  }
  if (!found) {
    SimDeviceSpec *copy = g_new(SimDeviceSpec, 1);
    *copy = norm;
    copy->name = g_intern_string(norm.name);
    copy->vendor_name = g_intern_string(norm.vendor_name);
    copy->source = g_intern_string(norm.source);
    g_ptr_array_add(interned, copy);
    found = copy;
  }
  g_mutex_unlock(&intern_lock);
  return found;
}
