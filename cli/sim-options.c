/* sim-options.c — parsing the plan and simulation options shared by several commands. */
#include "sim-options.h"
#include "parasol-profile.h"

#include <json-glib/json-glib.h>
#include <errno.h>
#include <math.h>
#include <string.h>

void cli_plan_options_init(CliPlanOptions *p)
{
  memset(p, 0, sizeof *p);
  p->bucket_mb = -1; /* unset: 25 MB, PyTorch DDP's default bucket */
  /* The model's parameters: NaN until given (0 is a value some of them may take). */
  p->coll_efficiency = p->net_efficiency = p->coll_latency_us = p->coll_base_us = NAN;
  p->gemm_efficiency = p->memory_efficiency = p->host_overhead_us = p->gemm_latency_us = NAN;
  p->host_step_us = p->gemm_k_overhead = p->gemm_unaligned_efficiency = p->gemm_ceiling = NAN;
  p->conv_efficiency = p->gather_efficiency = p->recurrent_efficiency = NAN;
  p->attention_efficiency = p->attention_bwd_efficiency = p->cuda_core_efficiency = NAN;
  p->moe_capacity_factor = p->moe_imbalance = NAN;
}

void cli_plan_options_clear(CliPlanOptions *p)
{
  g_free(p->schedule);
  g_free(p->tp_overlap_sms);
  g_free(p->recompute);
  g_free(p->precision);
  g_free(p->allreduce);
  g_free(p->detail);
  g_free(p->profile);
  g_free(p->profile_gpu);
  g_free(p->allreduce_table);
  g_free(p->attention);
  g_free(p->conv_layout);
  g_free(p->gemm_tile);
  g_free(p->calibration);
  cli_plan_options_init(p);
}

/* --dp, --tp, --pp, --microbatches, --microbatch-size and --global-batch: a whole number
 * of at least 1 (0 stands for "not given" inside, so it cannot be taken from the user). */
static gboolean parse_count(const char *name, const char *value, gpointer data, GError **error)
{
  CliPlanOptions *p = data;
  /* The global batch is checked against the model's range, with the model's words. */
  gboolean wide = g_str_equal(name, "--global-batch");
  gint64 v;
  if (!cli_option_int(name, value, 1, wide ? G_MAXINT64 : G_MAXINT, &v, error))
    return FALSE;
  if (g_str_equal(name, "--dp"))
    p->dp = (int)v;
  else if (g_str_equal(name, "--tp"))
    p->tp = (int)v;
  else if (g_str_equal(name, "--pp"))
    p->pp = (int)v;
  else if (g_str_equal(name, "--ep"))
    p->ep = (int)v;
  else if (g_str_equal(name, "--cp"))
    p->cp = (int)v;
  else if (g_str_equal(name, "--etp"))
    p->etp = (int)v;
  else if (g_str_equal(name, "--microbatches"))
    p->microbatches = (int)v;
  else if (g_str_equal(name, "--microbatch-size"))
    p->microbatch_size = v;
  else
    p->global_batch = v;
  return TRUE;
}

static gboolean non_negative(double v)
{
  return v >= 0;
}

/* A gradient bucket of at most a terabyte (10^6 MB): its bytes stay an int64. */
static gboolean bucket_size(double v)
{
  return v >= 0 && v <= 1e6;
}

static gboolean fraction(double v)
{
  return v > 0 && v <= 1;
}

static gboolean unit_interval(double v)
{
  return v >= 0 && v <= 1;
}

static gboolean parse_offload(const char *name, const char *value, gpointer data,
                              GError **error)
{
  CliPlanOptions *p = data;
  return cli_option_real(name, value, unit_interval, "a fraction from 0 to 1",
                         &p->offload_optimizer, error);
}

static gboolean parse_bucket_mb(const char *name, const char *value, gpointer data,
                                GError **error)
{
  CliPlanOptions *p = data;
  return cli_option_real(name, value, bucket_size,
                         "a size in MB from 0 to 1000000 (0: a bucket per weight)", &p->bucket_mb,
                         error);
}

static gboolean at_least_one(double v)
{
  return v >= 1;
}

/* --moe-capacity-factor (0 or more) and --moe-imbalance (1 or more). */
static gboolean parse_routing(const char *name, const char *value, gpointer data,
                              GError **error)
{
  CliPlanOptions *p = data;
  if (g_str_equal(name, "--moe-imbalance"))
    return cli_option_real(name, value, at_least_one, "a number of at least 1 (1: balanced)",
                           &p->moe_imbalance, error);
  return cli_option_real(name, value, non_negative, "a number of at least 0 (0: dropless)",
                         &p->moe_capacity_factor, error);
}

/* The model's real-valued parameters: where each goes and what it may be. */
static const struct {
  const char *name;
  size_t offset;
  gboolean fraction;   /* in (0, 1]; otherwise 0 or more */
} real_options[] = {
  { "--coll-efficiency", G_STRUCT_OFFSET(CliPlanOptions, coll_efficiency), TRUE },
  { "--net-efficiency", G_STRUCT_OFFSET(CliPlanOptions, net_efficiency), TRUE },
  { "--coll-latency-us", G_STRUCT_OFFSET(CliPlanOptions, coll_latency_us), FALSE },
  { "--coll-base-us", G_STRUCT_OFFSET(CliPlanOptions, coll_base_us), FALSE },
  { "--gemm-efficiency", G_STRUCT_OFFSET(CliPlanOptions, gemm_efficiency), TRUE },
  { "--memory-efficiency", G_STRUCT_OFFSET(CliPlanOptions, memory_efficiency), TRUE },
  { "--gemm-latency-us", G_STRUCT_OFFSET(CliPlanOptions, gemm_latency_us), FALSE },
  { "--gemm-k-overhead", G_STRUCT_OFFSET(CliPlanOptions, gemm_k_overhead), FALSE },
  { "--gemm-unaligned-efficiency", G_STRUCT_OFFSET(CliPlanOptions, gemm_unaligned_efficiency),
    TRUE },
  { "--gemm-ceiling", G_STRUCT_OFFSET(CliPlanOptions, gemm_ceiling), TRUE },
  { "--conv-efficiency", G_STRUCT_OFFSET(CliPlanOptions, conv_efficiency), TRUE },
  { "--gather-efficiency", G_STRUCT_OFFSET(CliPlanOptions, gather_efficiency), TRUE },
  { "--recurrent-efficiency", G_STRUCT_OFFSET(CliPlanOptions, recurrent_efficiency), TRUE },
  { "--attention-efficiency", G_STRUCT_OFFSET(CliPlanOptions, attention_efficiency), TRUE },
  { "--attention-bwd-efficiency", G_STRUCT_OFFSET(CliPlanOptions, attention_bwd_efficiency),
    TRUE },
  { "--cuda-core-efficiency", G_STRUCT_OFFSET(CliPlanOptions, cuda_core_efficiency), TRUE },
  { "--host-overhead-us", G_STRUCT_OFFSET(CliPlanOptions, host_overhead_us), FALSE },
  { "--host-step-us", G_STRUCT_OFFSET(CliPlanOptions, host_step_us), FALSE },
};

static gboolean parse_real(const char *name, const char *value, gpointer data, GError **error)
{
  for (size_t i = 0; i < G_N_ELEMENTS(real_options); i++) {
    if (!g_str_equal(name, real_options[i].name))
      continue;
    gboolean frac = real_options[i].fraction;
    return cli_option_real(name, value, frac ? fraction : non_negative,
                           frac ? "a fraction in (0, 1]" : "a number, 0 or more",
                           (double *)G_STRUCT_MEMBER_P(data, real_options[i].offset), error);
  }
  g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_FAILED, "%s: not a parameter", name);
  return FALSE;
}

/* A calibration file's parameters fill the options the command line left unset
 * (experiments/calibrate-vtrain and validate-published write such files):
 *   {"format": "parasol-calibration", "version": 1,
 *    "parameters": {"gemm-efficiency": {"value": 0.93, ...}, "attention": {"value": "flash"}},
 *    "tables": {"allreduce-table": {"file": "nccl-allreduce-a100.csv"}}}
 * Files of tables are found beside the calibration file. */
static gboolean calibration_fail(GError **error, const char *file, const char *place,
                                 const char *what)
{
  if (place)
    g_set_error(error, SIM_ERROR, SIM_ERROR_PARSE, "%s: %s: %s", file, place, what);
  else
    g_set_error(error, SIM_ERROR, SIM_ERROR_PARSE, "%s: %s", file, what);
  return FALSE;
}

/* "auto" (0 x 0: each GEMM takes its best tile and split) or "MxN" with M, N in 1..1024. */
static gboolean parse_tile(const char *s, int *tm, int *tn)
{
  if (!strcmp(s, "auto")) {
    *tm = *tn = 0;
    return TRUE;
  }
  char *end = NULL;
  gint64 m = g_ascii_strtoll(s, &end, 10);
  if (!end || *end != 'x' || m < 1 || m > 1024)
    return FALSE;
  const char *rest = end + 1;
  gint64 n = g_ascii_strtoll(rest, &end, 10);
  if (!end || *end || end == rest || n < 1 || n > 1024)
    return FALSE;
  *tm = (int)m;
  *tn = (int)n;
  return TRUE;
}

static gboolean apply_parameter(CliPlanOptions *p, const char *file, const char *name,
                                JsonNode *value, GError **error)
{
  g_autofree char *place = g_strdup_printf("parameters.%s.value", name);
  if (!strcmp(name, "attention")) {
    if (!JSON_NODE_HOLDS_VALUE(value) || json_node_get_value_type(value) != G_TYPE_STRING ||
        sim_attention_kernel_from_name(json_node_get_string(value)) < 0)
      return calibration_fail(error, file, place,
                              "expected flash, fused, unfused or megatron");
    if (!p->attention)
      p->attention = g_strdup(json_node_get_string(value));
    return TRUE;
  }
  if (g_str_has_prefix(name, "memory-efficiency.")) {
    /* memory-efficiency.OP.PASS: one framework kernel's fraction of the bandwidth. */
    g_auto(GStrv) parts = g_strsplit(name + strlen("memory-efficiency."), ".", -1);
    int type = -1, pass = -1;
    if (g_strv_length(parts) == 2) {
      for (int t = 0; t < SIM_OP_COUNT; t++)
        if (!strcmp(parts[0], sim_op_type_name((SimOpType)t)))
          type = t;
      for (int q = 0; q < SIM_PASS_COUNT; q++)
        if (!strcmp(parts[1], sim_pass_name((SimPass)q)))
          pass = q;
    }
    g_autofree char *at = g_strdup_printf("parameters.%s", name);
    if (type < 0 || pass < 0)
      return calibration_fail(error, file, at,
                              "expected memory-efficiency.OP.PASS with an operator type "
                              "(parasol model show lists them) and forward, backward or update");
    if (!JSON_NODE_HOLDS_VALUE(value) ||
        (json_node_get_value_type(value) != G_TYPE_DOUBLE &&
         json_node_get_value_type(value) != G_TYPE_INT64) ||
        !fraction(json_node_get_double(value)))
      return calibration_fail(error, file, place, "expected a fraction in (0, 1]");
    if (p->memory_efficiency_by_op[type][pass] == 0)
      p->memory_efficiency_by_op[type][pass] = json_node_get_double(value);
    return TRUE;
  }
  if (!strcmp(name, "gemm-tile")) {
    const char *v = JSON_NODE_HOLDS_VALUE(value) &&
                        json_node_get_value_type(value) == G_TYPE_STRING
                      ? json_node_get_string(value) : NULL;
    int tm, tn;
    if (!v || !parse_tile(v, &tm, &tn))
      return calibration_fail(error, file, place, "expected auto or MxN, as 128x128");
    if (!p->gemm_tile)
      p->gemm_tile = g_strdup(v);
    return TRUE;
  }
  if (!strcmp(name, "conv-layout")) {
    const char *v = JSON_NODE_HOLDS_VALUE(value) &&
                        json_node_get_value_type(value) == G_TYPE_STRING
                      ? json_node_get_string(value) : NULL;
    if (!v || (strcmp(v, "nchw") && strcmp(v, "nhwc")))
      return calibration_fail(error, file, place, "expected nchw or nhwc");
    if (!p->conv_layout)
      p->conv_layout = g_strdup(v);
    return TRUE;
  }
  g_autofree char *flag = g_strdup_printf("--%s", name);
  for (size_t i = 0; i < G_N_ELEMENTS(real_options); i++) {
    if (strcmp(flag, real_options[i].name))
      continue;
    if (!JSON_NODE_HOLDS_VALUE(value) ||
        (json_node_get_value_type(value) != G_TYPE_DOUBLE &&
         json_node_get_value_type(value) != G_TYPE_INT64))
      return calibration_fail(error, file, place, "expected a number");
    double v = json_node_get_double(value);
    gboolean frac = real_options[i].fraction;
    if (!isfinite(v) || (frac ? !fraction(v) : !non_negative(v)))
      return calibration_fail(error, file, place,
                              frac ? "expected a fraction in (0, 1]" : "expected a number, 0 or more");
    double *slot = (double *)G_STRUCT_MEMBER_P(p, real_options[i].offset);
    if (isnan(*slot))
      *slot = v;
    return TRUE;
  }
  g_autofree char *what = g_strdup_printf("'%s' is not a parameter of the simulation "
                                          "(see parasol simulate --help-plan)", name);
  g_autofree char *at = g_strdup_printf("parameters.%s", name);
  return calibration_fail(error, file, at, what);
}

gboolean cli_plan_apply_calibration(CliPlanOptions *p, const char *file, GError **error)
{
  g_autoptr(JsonParser) parser = json_parser_new();
  g_autoptr(GError) local = NULL;
  g_autofree char *text = NULL;
  if (!sim_read_file(file, &text, NULL, &local)) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_IO, "%s", local->message);
    return FALSE;
  }
  if (!sim_json_load(parser, text, -1, &local)) {
    const char *msg = local->message;
    if (g_str_has_prefix(msg, "<data>:"))
      msg += strlen("<data>:");
    g_set_error(error, SIM_ERROR, SIM_ERROR_PARSE, "%s:%s", file, msg);
    return FALSE;
  }
  JsonNode *root = json_parser_get_root(parser);
  JsonObject *o = root && JSON_NODE_HOLDS_OBJECT(root) ? json_node_get_object(root) : NULL;
  JsonNode *fn = o ? json_object_get_member(o, "format") : NULL;
  const char *format = fn && JSON_NODE_HOLDS_VALUE(fn) &&
                       json_node_get_value_type(fn) == G_TYPE_STRING
                         ? json_node_get_string(fn) : "";
  if (!o || strcmp(format, "parasol-calibration"))
    return calibration_fail(error, file, NULL,
                            "expected a JSON object with \"format\": \"parasol-calibration\"");
  JsonNode *pn = json_object_get_member(o, "parameters");
  if (!pn || !JSON_NODE_HOLDS_OBJECT(pn))
    return calibration_fail(error, file, "parameters",
                            "expected an object of {\"value\": ...} by parameter name");
  JsonObject *params = json_node_get_object(pn);
  g_autoptr(GList) names = json_object_get_members(params);
  for (GList *it = names; it; it = it->next) {
    const char *name = it->data;
    JsonNode *entry = json_object_get_member(params, name);
    JsonNode *value = entry && JSON_NODE_HOLDS_OBJECT(entry)
                        ? json_object_get_member(json_node_get_object(entry), "value")
                        : NULL;
    if (!value) {
      g_autofree char *place = g_strdup_printf("parameters.%s", name);
      return calibration_fail(error, file, place, "expected an object with a \"value\"");
    }
    if (!apply_parameter(p, file, name, value, error))
      return FALSE;
  }
  JsonNode *tn = json_object_get_member(o, "tables");
  if (tn) {
    JsonObject *tables = JSON_NODE_HOLDS_OBJECT(tn) ? json_node_get_object(tn) : NULL;
    JsonNode *ar = tables ? json_object_get_member(tables, "allreduce-table") : NULL;
    JsonNode *fn2 = ar && JSON_NODE_HOLDS_OBJECT(ar)
                      ? json_object_get_member(json_node_get_object(ar), "file") : NULL;
    const char *f = fn2 && JSON_NODE_HOLDS_VALUE(fn2) &&
                    json_node_get_value_type(fn2) == G_TYPE_STRING
                      ? json_node_get_string(fn2) : NULL;
    if (!tables || (json_object_get_size(tables) > 0 && !f))
      return calibration_fail(error, file, "tables",
                              "expected {\"allreduce-table\": {\"file\": NAME}}");
    if (f && !p->allreduce_table) {
      g_autofree char *dir = g_path_get_dirname(file);
      p->allreduce_table = g_path_is_absolute(f) ? g_strdup(f) : g_build_filename(dir, f, NULL);
    }
  }
  return TRUE;
}

static gboolean apply_calibration(GOptionContext *ctx, GOptionGroup *group, gpointer data,
                                  GError **error)
{
  CliPlanOptions *p = data;
  if (!p->calibration)
    return TRUE;
  return cli_plan_apply_calibration(p, p->calibration, error);
}

GOptionGroup *cli_plan_option_group(CliPlanOptions *p)
{
  GOptionEntry entries[] = {
    { "dp", 0, 0, G_OPTION_ARG_CALLBACK, parse_count, "Data-parallel degree (default: the GPUs --tp and --pp leave, as Megatron derives it)", "N" },
    { "tp", 0, 0, G_OPTION_ARG_CALLBACK, parse_count, "Tensor-parallel degree (inside a node)", "N" },
    { "pp", 0, 0, G_OPTION_ARG_CALLBACK, parse_count, "Pipeline stages", "N" },
    { "cp", 0, 0, G_OPTION_ARG_CALLBACK, parse_count, "Context-parallel degree: every layer's sequence split over this many ranks, attention as a ring passing keys and values (docs/llm.md)", "N" },
    { "ep", 0, 0, G_OPTION_ARG_CALLBACK, parse_count, "Expert-parallel degree: mixture-of-experts layers split their experts over this many data-parallel replicas (must divide --dp)", "N" },
    { "etp", 0, 0, G_OPTION_ARG_CALLBACK, parse_count, "Expert tensor-parallel degree (Megatron-Core's --expert-tensor-parallel-size; default --tp): each expert's width splits this many ways, expert groups being --ep x --etp consecutive GPUs of a stage (docs/llm.md)", "N" },
    { "moe-capacity-factor", 0, 0, G_OPTION_ARG_CALLBACK, parse_routing, "Every mixture-of-experts layer's capacity factor: each expert computes C x its mean share of the tokens, padded, the rest dropped (0: dropless; default: the model's)", "C" },
    { "moe-imbalance", 0, 0, G_OPTION_ARG_CALLBACK, parse_routing, "Dropless mixture-of-experts layers: the busiest expert shard's tokens over the mean, which the others wait for (at least 1; 1: balanced, as forced balancing routes; default: the model's)", "F" },
    { "microbatches", 0, 0, G_OPTION_ARG_CALLBACK, parse_count, "Micro-batches per iteration", "N" },
    { "microbatch-size", 0, 0, G_OPTION_ARG_CALLBACK, parse_count, "Samples per micro-batch per replica", "N" },
    { "global-batch", 0, 0, G_OPTION_ARG_CALLBACK, parse_count, "Samples per iteration (sets the model's batch)", "N" },
    { "schedule", 0, 0, G_OPTION_ARG_STRING, &p->schedule, "1f1b (default), gpipe or interleaved:V", "S" },
    { "recompute", 0, 0, G_OPTION_ARG_STRING, &p->recompute, "none (default), selective or full", "R" },
    { "precision", 0, 0, G_OPTION_ARG_STRING, &p->precision, "mixed-fp16 (default; PyTorch's AMP), mixed-bf16, fp32 (PyTorch's default for matrix products), tf32 (fp32 with GEMMs and convolutions on TF32 tensor cores: PyTorch's default for convolutions on A100 and H100, and for both in NVIDIA's containers) or fp8 (mixed bf16 with the linear layers in FP8, as Transformer Engine runs them; H100 and H200)", "P" },
    { "gemm-tile", 0, 0, G_OPTION_ARG_STRING, &p->gemm_tile, "GEMM output tiles: auto (default: each GEMM takes the tile shape and split of its reduction that finish first, as cuBLAS's heuristics choose) or MxN, one tile for all, never split", "T" },
    { "conv-layout", 0, 0, G_OPTION_ARG_STRING, &p->conv_layout, "Layout of convolutional networks' tensors: nhwc (default; PyTorch's channels_last, as NVIDIA's mixed-precision examples train) or nchw (PyTorch's default, whose tensor-core convolutions transpose around each kernel)", "L" },
    { "attention", 0, 0, G_OPTION_ARG_STRING, &p->attention, "How attention runs: flash (FlashAttention: PyTorch's scaled_dot_product_attention on A100 and H100, Megatron-Core, NeMo), fused (one softmax kernel, scores in memory), unfused (PyTorch's eager path) or megatron (Megatron-LM's fused softmax up to 2,048 keys, else unfused fp32); default: the model's (GPT: megatron, the others: fused)", "K" },
    { "zero1", 0, 0, G_OPTION_ARG_NONE, &p->zero1, "Shard optimizer states over data-parallel replicas", NULL },
    { "zero2", 0, 0, G_OPTION_ARG_NONE, &p->zero2, "Shard optimizer states and gradients over data-parallel replicas (ZeRO-2; the communication is --zero1's)", NULL },
    { "zero3", 0, 0, G_OPTION_ARG_NONE, &p->zero3, "Shard weights too (ZeRO-3, FSDP's full sharding): all-gathered before every micro-batch's forward and backward, gradients reduce-scattered after each backward", NULL },
    { "offload-optimizer", 0, 0, G_OPTION_ARG_CALLBACK, parse_offload, "Keep this fraction (0 to 1) of the optimizer's states in host memory and update it on the host's CPU (ZeRO-Offload; docs/llm.md)", "F" },
    { "offload-overlap", 0, 0, G_OPTION_ARG_NONE, &p->offload_overlap, "With --offload-optimizer: copy each shard's gradients to the host as soon as they are reduced, overlapping the backward pass (DeepSpeed's ZeRO-Offload); default: after the device's update (Megatron-LM's --optimizer-cpu-offload)", NULL },
    { "allreduce", 0, 0, G_OPTION_ARG_STRING, &p->allreduce, "Gradient all-reduce: ring (default), tree, hierarchical", "A" },
    { "bucket-mb", 0, 0, G_OPTION_ARG_CALLBACK, parse_bucket_mb, "Gradient bucket size in MB (default 25; 0 per weight)", "MB" },
    { "no-overlap", 0, 0, G_OPTION_ARG_NONE, &p->no_overlap, "Synchronize gradients after the backward pass", NULL },
    { "sequence-parallel", 0, 0, G_OPTION_ARG_NONE, &p->sequence_parallel, "Megatron sequence parallelism", NULL },
    { "tp-comm-overlap", 0, 0, G_OPTION_ARG_NONE, &p->tp_comm_overlap, "With --sequence-parallel: each tensor-parallel all-gather and reduce-scatter runs in chunks pipelined with the GEMM that consumes or produces it (Transformer Engine's userbuffers, NeMo's tp_comm_overlap; docs/formats.md)", NULL },
    { "tp-overlap-chunks", 0, 0, G_OPTION_ARG_INT, &p->tp_overlap_chunks, "With --tp-comm-overlap: the chunks each pipelined reduce-scatter and its GEMM are split into (default: the tensor-parallel degree; NeMo's H100 configuration splits in 4)", "K" },
    { "tp-overlap-sms", 0, 0, G_OPTION_ARG_STRING, &p->tp_overlap_sms, "With --tp-comm-overlap: the SMs a pipelined reduce-scatter takes from the GEMM before it, after attention and after other ops (default 24,16: NeMo's H100 configuration for hidden size 8192 at TP 4)", "A,O" },
    { "scatter-gather", 0, 0, G_OPTION_ARG_NONE, &p->scatter_gather, "Megatron's scatter-gather of pipeline messages: each tensor-parallel rank sends 1/TP of an activation or gradient to the next stage, whose ranks all-gather it", NULL },
    { "detail", 0, 0, G_OPTION_ARG_STRING, &p->detail, "Collectives as one flow per rank (flows, default), one flow each (collective) or per-step transfers (steps)", "D" },
    { "no-fold", 0, 0, G_OPTION_ARG_NONE, &p->no_fold, "Simulate every device, even symmetric ones", NULL },
    { "no-rings", 0, 0, G_OPTION_ARG_NONE, &p->no_rings, "Run a collective's ring as a flow per rank even where no other traffic crosses its links (same prediction, slower)", NULL },
    { "no-steady", 0, 0, G_OPTION_ARG_NONE, &p->no_steady, "Simulate every micro-batch of a pipeline schedule, not a few and the repeated periods of its steady state added (same prediction, slower)", NULL },
    { "fold-check", 0, 0, G_OPTION_ARG_NONE, &p->fold_check, "Fold data-parallel replicas also where the network does not map their traffic onto each other link by link, checking that they ran alike (same prediction; faster for some plans, slower for others)", NULL },
    { "no-prune-shadows", 0, 0, G_OPTION_ARG_NONE, &p->no_prune, "In brief runs (searches), keep the shadows of folded devices whose links no simulated flow crosses (same prediction, slower)", NULL },
    { "no-ring-steps", 0, 0, G_OPTION_ARG_NONE, &p->no_ring_steps, "In brief runs (searches), run every tensor-parallel ring as a flow and every overlap wait as a delay, not as steps of the stream that waits for them (same prediction, slower)", NULL },
    { "no-chains", 0, 0, G_OPTION_ARG_NONE, &p->no_chains, "Run every compute task on its own, not runs of them that nothing else waits on as one task (same prediction, slower)", NULL },
    { "coll-efficiency", 0, 0, G_OPTION_ARG_CALLBACK, parse_real, "Achieved fraction of link bandwidth", "F" },
    { "net-efficiency", 0, 0, G_OPTION_ARG_CALLBACK, parse_real, "Achieved fraction of NIC and network (InfiniBand, Ethernet) bandwidth (default: --coll-efficiency)", "F" },
    { "coll-latency-us", 0, 0, G_OPTION_ARG_CALLBACK, parse_real, "Fixed cost of a collective step (us)", "US" },
    { "coll-base-us", 0, 0, G_OPTION_ARG_CALLBACK, parse_real, "Fixed cost of a whole collective: launch and handshake (us)", "US" },
    { "gemm-efficiency", 0, 0, G_OPTION_ARG_CALLBACK, parse_real, "Achieved fraction of tensor-core peak in large GEMMs", "F" },
    { "memory-efficiency", 0, 0, G_OPTION_ARG_CALLBACK, parse_real, "Achieved fraction of memory bandwidth in streaming kernels", "F" },
    { "gemm-latency-us", 0, 0, G_OPTION_ARG_CALLBACK, parse_real, "Fixed cost of one GEMM beyond its launch (us)", "US" },
    { "gemm-k-overhead", 0, 0, G_OPTION_ARG_CALLBACK, parse_real, "A GEMM tile's pipeline start and epilogue, in elements of the reduction dimension K: its work counts (K + this) / K times", "K" },
    { "gemm-unaligned-efficiency", 0, 0, G_OPTION_ARG_CALLBACK, parse_real, "Fraction of its aligned rate a GEMM reaches when a dimension is not a multiple of 16 bytes (default 1: no penalty)", "F" },
    { "gemm-ceiling", 0, 0, G_OPTION_ARG_CALLBACK, parse_real, "The most any GEMM reaches, as a fraction of tensor-core peak in useful FLOPs: the device's best measured shape (A100 SXM: 0.869; default: no cap)", "F" },
    { "host-overhead-us", 0, 0, G_OPTION_ARG_CALLBACK, parse_real, "Host time to issue one kernel (us); the host runs ahead of the GPU but waits for pipeline transfers", "US" },
    { "host-step-us", 0, 0, G_OPTION_ARG_CALLBACK, parse_real, "Host time between two steps of a device's schedule (a micro-batch's forward or backward, the update): the training loop's own work (us)", "US" },
    { "conv-efficiency", 0, 0, G_OPTION_ARG_CALLBACK, parse_real, "Achieved fraction of tensor-core peak in large convolutions (implicit GEMMs; default 0.6)", "F" },
    { "gather-efficiency", 0, 0, G_OPTION_ARG_CALLBACK, parse_real, "Achieved fraction of memory bandwidth in embedding gathers and scatter-adds (default 0.5)", "F" },
    { "recurrent-efficiency", 0, 0, G_OPTION_ARG_CALLBACK, parse_real, "Achieved fraction of peak in a recurrent layer's step GEMMs (default 0.3)", "F" },
    { "attention-efficiency", 0, 0, G_OPTION_ARG_CALLBACK, parse_real, "Achieved fraction of tensor-core peak in flash attention's forward kernel (default 0.7, FlashAttention-2 on A100; at most 0.56 on H100 and H200, cuDNN's measured rate)", "F" },
    { "attention-bwd-efficiency", 0, 0, G_OPTION_ARG_CALLBACK, parse_real, "The same for its backward kernel (default 0.55; at most 0.54 on H100 and H200)", "F" },
    { "cuda-core-efficiency", 0, 0, G_OPTION_ARG_CALLBACK, parse_real, "Achieved fraction of the fp32 peak in GEMMs and convolutions on the CUDA cores (fp32 without TF32; default 0.8)", "F" },
    { "calibration", 0, 0, G_OPTION_ARG_FILENAME, &p->calibration, "A file of fitted parameters (\"format\": \"parasol-calibration\", as data/calibration/ holds): its values stand for the options not given here", "FILE" },
    { "blocking-sends", 0, 0, G_OPTION_ARG_NONE, &p->blocking_sends, "The host waits for each transfer it sends to another device before it issues more kernels (Megatron's pipeline exchanges end with torch.cuda.synchronize())", NULL },
    { "allreduce-table", 0, 0, G_OPTION_ARG_FILENAME, &p->allreduce_table, "Measured all-reduce times inside a node (CSV gpus,bytes,seconds): they set the fixed cost of such all-reduces", "FILE" },
    { "profile", 0, 0, G_OPTION_ARG_FILENAME, &p->profile, "Price operators from this profile database (file or directory), the roofline for the rest", "PATH" },
    { "profile-gpu", 0, 0, G_OPTION_ARG_STRING, &p->profile_gpu, "Use the profile's entries of this device (default: each device's own name)", "NAME" },
    { NULL },
  };
  GOptionGroup *g = g_option_group_new("plan", "Plan and simulation options:",
                                       "Show the plan and simulation options", p, NULL);
  g_option_group_add_entries(g, entries);
  g_option_group_set_parse_hooks(g, NULL, apply_calibration);
  return g;
}

static gboolean parse_precision(const char *s, SimPrecision *out, GError **error)
{
  /* fp16 and bf16 are short for the mixed precisions. */
  int v = !s ? SIM_PRECISION_MIXED_FP16
             : sim_precision_from_name(!strcmp(s, "fp16")   ? "mixed-fp16"
                                       : !strcmp(s, "bf16") ? "mixed-bf16"
                                                            : s);
  if (v < 0) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_UNKNOWN,
                "--precision: unknown '%s'; expected mixed-fp16, mixed-bf16, fp32, tf32 or fp8",
                s);
    return FALSE;
  }
  *out = (SimPrecision)v;
  return TRUE;
}

static SimDType precision_dtype(SimPrecision p)
{
  switch (p) {
  case SIM_PRECISION_FP32:
  case SIM_PRECISION_TF32:
    return SIM_DTYPE_FP32;
  case SIM_PRECISION_MIXED_BF16:
  case SIM_PRECISION_FP8:
    return SIM_DTYPE_BF16;
  case SIM_PRECISION_MIXED_FP16:
    break;
  }
  return SIM_DTYPE_FP16;
}

gboolean cli_plan_roofline_params(const CliPlanOptions *p, SimPrecision prec,
                                  SimRooflineParams *rp, GError **error)
{
  *rp = sim_roofline_params_default();
  if (!isnan(p->gemm_efficiency))
    rp->gemm_efficiency = p->gemm_efficiency;
  if (!isnan(p->memory_efficiency))
    rp->memory_efficiency = p->memory_efficiency;
  if (!isnan(p->gemm_latency_us))
    rp->gemm_latency = p->gemm_latency_us * 1e-6;
  if (!isnan(p->gemm_k_overhead))
    rp->gemm_k_overhead = p->gemm_k_overhead;
  if (!isnan(p->gemm_unaligned_efficiency))
    rp->gemm_unaligned_efficiency = p->gemm_unaligned_efficiency;
  if (!isnan(p->gemm_ceiling))
    rp->gemm_ceiling = p->gemm_ceiling;
  if (!isnan(p->conv_efficiency))
    rp->conv_efficiency = p->conv_efficiency;
  if (!isnan(p->gather_efficiency))
    rp->gather_efficiency = p->gather_efficiency;
  if (!isnan(p->recurrent_efficiency))
    rp->recurrent_efficiency = p->recurrent_efficiency;
  if (!isnan(p->attention_efficiency))
    rp->attention_efficiency = p->attention_efficiency;
  if (!isnan(p->attention_bwd_efficiency))
    rp->attention_bwd_efficiency = p->attention_bwd_efficiency;
  if (!isnan(p->cuda_core_efficiency))
    rp->cuda_core_efficiency = p->cuda_core_efficiency;
  if (p->conv_layout && strcmp(p->conv_layout, "nchw") && strcmp(p->conv_layout, "nhwc")) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_UNKNOWN,
                "--conv-layout: unknown '%s'; expected nhwc or nchw", p->conv_layout);
    return FALSE;
  }
  rp->conv_nchw = p->conv_layout && !strcmp(p->conv_layout, "nchw");
  memcpy(rp->memory_efficiency_by_op, p->memory_efficiency_by_op,
         sizeof rp->memory_efficiency_by_op);
  if (p->gemm_tile && !parse_tile(p->gemm_tile, &rp->tile_m, &rp->tile_n)) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                "--gemm-tile %s: expected auto or MxN with M and N from 1 to 1024, as 128x128",
                p->gemm_tile);
    return FALSE;
  }
  rp->tf32 = prec == SIM_PRECISION_TF32;
  rp->fp8 = prec == SIM_PRECISION_FP8;
  return TRUE;
}

/* A zoo transformer whose vocabulary the command line leaves at its default is padded
 * as Megatron pads it (sim_model_params_pad_vocab()), said on stderr and kept in @pb for
 * the JSON report; one given with --param vocab=N is simulated as given.  Returns the
 * "vocab=N" to append, or NULL. */
static char *megatron_vocab_padding(CliProblem *pb, const char *model, char **params, int tp,
                                    GError **error)
{
  g_autoptr(SimModelParams) given = sim_model_params_new();
  for (char **it = params; it && *it; it++)
    if (!sim_model_params_parse(given, *it, error))
      return NULL;
  int64_t vocab, padded;
  if (!sim_model_params_pad_vocab(given, model, tp, &vocab, &padded))
    return NULL;
  g_printerr("parasol: %s's vocabulary of %" G_GINT64_FORMAT " padded to %" G_GINT64_FORMAT
             " (a multiple of 128 x tp %d), as Megatron pads it; --param vocab=%" G_GINT64_FORMAT
             " keeps it\n", model, vocab, padded, MAX(tp, 1), vocab);
  pb->vocab_default = vocab;
  pb->vocab_padded = padded;
  pb->vocab_tp = MAX(tp, 1);
  return g_strdup_printf("vocab=%" G_GINT64_FORMAT, padded);
}

gboolean cli_problem_load(CliProblem *pb, const char *model, char **params, const char *machine,
                          const CliPlanOptions *p, GError **error)
{
  memset(pb, 0, sizeof *pb);
  SimMegatronOptions check;
  if (!cli_plan_megatron_options(p, &check, error))
    return FALSE;
  SimPrecision prec = check.memory.precision;
  g_autoptr(GPtrArray) all = g_ptr_array_new_with_free_func(g_free);
  for (char **it = params; it && *it; it++)
    g_ptr_array_add(all, g_strdup(*it));
  if (p->global_batch < 0) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID, "--global-batch: expected a positive number");
    return FALSE;
  }
  if (p->global_batch > 0)
    g_ptr_array_add(all, g_strdup_printf("batch=%" G_GINT64_FORMAT, p->global_batch));
  GError *perr = NULL;
  char *pad = megatron_vocab_padding(pb, model, params, p->tp, &perr);
  if (perr) {
    g_propagate_error(error, perr);
    return FALSE;
  }
  if (pad)
    g_ptr_array_add(all, pad);
  g_ptr_array_add(all, NULL);
  pb->graph = cli_load_model(model, (char **)all->pdata, error);
  if (!pb->graph)
    return FALSE;
  if (p->global_batch > 0 && sim_graph_batch_size(pb->graph) != p->global_batch) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                "--global-batch %" G_GINT64_FORMAT " disagrees with the model's batch %" G_GINT64_FORMAT,
                p->global_batch, sim_graph_batch_size(pb->graph));
    cli_problem_clear(pb);
    return FALSE;
  }
  sim_graph_set_float_dtype(pb->graph, precision_dtype(prec));
  if (p->attention) {
    int k = sim_attention_kernel_from_name(p->attention);
    if (k < 0) {
      g_set_error(error, SIM_ERROR, SIM_ERROR_UNKNOWN,
                  "--attention: unknown '%s'; expected flash, fused, unfused or megatron",
                  p->attention);
      cli_problem_clear(pb);
      return FALSE;
    }
    sim_graph_set_attention_kernel(pb->graph, (SimAttentionKernel)k);
  }
  if ((!isnan(p->moe_capacity_factor) || !isnan(p->moe_imbalance)) &&
      !sim_graph_set_moe_routing(pb->graph, p->moe_capacity_factor, p->moe_imbalance, error)) {
    cli_problem_clear(pb);
    return FALSE;
  }
  pb->machine = sim_machine_load(machine, error);
  if (!pb->machine) {
    cli_problem_clear(pb);
    return FALSE;
  }
  if (prec == SIM_PRECISION_FP8) {
    for (int d = 0; d < sim_machine_n_devices(pb->machine); d++) {
      const SimDeviceSpec *spec = sim_machine_device_spec(pb->machine, d);
      if (spec->peak_flops[SIM_DTYPE_FP8] <= 0) {
        g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                    "--precision fp8: the %s GPUs of machine %s have no FP8 arithmetic "
                    "(H100 and H200 have)", spec->name, machine);
        cli_problem_clear(pb);
        return FALSE;
      }
    }
  }
  SimRooflineParams rp;
  if (!cli_plan_roofline_params(p, prec, &rp, error)) {
    cli_problem_clear(pb);
    return FALSE;
  }
  pb->cost = sim_cost_model_new_roofline(&rp);
  if (p->profile) {
    ProfileDb *db = profile_db_load(p->profile, error);
    if (!db) {
      cli_problem_clear(pb);
      return FALSE;
    }
    pb->cost = profile_cost_model_new(db, p->profile_gpu, pb->cost);
    profile_db_free(db);
  }
  if (p->allreduce_table) {
    /* Kept for the life of the process: a batch of simulations reads the file once. */
    static GHashTable *tables;
    if (!tables)
      tables = g_hash_table_new(g_str_hash, g_str_equal);
    SimCollTable *t = g_hash_table_lookup(tables, p->allreduce_table);
    if (!t) {
      t = sim_coll_table_load(p->allreduce_table, error);
      if (!t) {
        cli_problem_clear(pb);
        return FALSE;
      }
      g_hash_table_insert(tables, g_strdup(p->allreduce_table), t);
    }
    pb->allreduce_table = t;
  }
  return TRUE;
}

void cli_problem_clear(CliProblem *pb)
{
  g_clear_pointer(&pb->graph, sim_graph_free);
  g_clear_pointer(&pb->machine, sim_machine_free);
  g_clear_pointer(&pb->cost, sim_cost_model_free);
  pb->allreduce_table = NULL;
}

gboolean cli_plan_megatron_options(const CliPlanOptions *p, SimMegatronOptions *o, GError **error)
{
  *o = sim_megatron_options_default();
  if (p->dp < 0 || p->tp < 0 || p->pp < 0 || p->microbatches < 0 || p->microbatch_size < 0) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                "--dp, --tp, --pp, --microbatches and --microbatch-size must be positive");
    return FALSE;
  }
  o->dp = p->dp > 0 ? p->dp : 1;
  o->tp = p->tp > 0 ? p->tp : 1;
  o->pp = p->pp > 0 ? p->pp : 1;
  o->ep = p->ep > 0 ? p->ep : 1;
  o->cp = p->cp > 0 ? p->cp : 1;
  o->etp = p->etp;
  o->microbatches = p->microbatches;
  if (p->microbatch_size > 0)
    o->microbatch_size = p->microbatch_size;
  o->sequence_parallel = p->sequence_parallel;
  o->scatter_gather = p->scatter_gather;
  o->tp_comm_overlap = p->tp_comm_overlap;
  if (p->tp_comm_overlap && !p->sequence_parallel) {
    /* Megatron-LM and NeMo allow it only with sequence parallelism, whose collectives it
     * overlaps. */
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                "--tp-comm-overlap overlaps sequence parallelism's collectives: it needs "
                "--sequence-parallel");
    return FALSE;
  }
  if (p->tp_overlap_chunks < 0) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                "--tp-overlap-chunks %d: expected 0 (the tensor-parallel degree) or more",
                p->tp_overlap_chunks);
    return FALSE;
  }
  o->tp_overlap.chunks = p->tp_overlap_chunks;
  if (p->tp_overlap_sms) {
    char *end = NULL;
    errno = 0;
    long a = strtol(p->tp_overlap_sms, &end, 10), b = -1;
    if (end != p->tp_overlap_sms && *end == ',') {
      const char *rest = end + 1;
      b = strtol(rest, &end, 10);
      if (end == rest)
        b = -1;
    }
    if (errno || *end || a < 0 || b < 0 || a > G_MAXINT || b > G_MAXINT) {
      g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                  "--tp-overlap-sms '%s': expected two counts of SMs, A,O (after attention, "
                  "after other ops), such as 24,16", p->tp_overlap_sms);
      return FALSE;
    }
    o->tp_overlap.sms_attention = (int)a;
    o->tp_overlap.sms_other = (int)b;
  }
  if (p->schedule) {
    /* NAME or interleaved:V, V model chunks per stage. */
    g_autofree char *name = g_strdup(p->schedule);
    char *colon = strchr(name, ':');
    if (colon)
      *colon = '\0';
    int v = sim_schedule_from_name(name);
    if (v < 0 || (colon && v != SIM_SCHEDULE_INTERLEAVED)) {
      g_set_error(error, SIM_ERROR, SIM_ERROR_UNKNOWN,
                  "--schedule: unknown '%s'; expected 1f1b, gpipe or interleaved:V", p->schedule);
      return FALSE;
    }
    o->schedule = (SimSchedule)v;
    if (v == SIM_SCHEDULE_INTERLEAVED) {
      o->chunks = 2;
      if (colon) {
        char *end = NULL;
        gint64 c = g_ascii_strtoll(colon + 1, &end, 10);
        if (!end || *end || c < 1 || c > 64) {
          g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                      "--schedule %s: expected interleaved:V with V model chunks per stage (1 to 64)",
                      p->schedule);
          return FALSE;
        }
        o->chunks = (int)c;
      }
    }
  }
  if (p->recompute) {
    int v = sim_recompute_from_name(p->recompute);
    if (v < 0) {
      g_set_error(error, SIM_ERROR, SIM_ERROR_UNKNOWN,
                  "--recompute: unknown '%s'; expected none, selective or full", p->recompute);
      return FALSE;
    }
    o->memory.recompute = (SimRecompute)v;
  }
  if (!parse_precision(p->precision, &o->memory.precision, error))
    return FALSE;
  o->memory.zero1 = p->zero1 || p->zero2 || p->zero3;
  o->memory.zero2 = p->zero2 || p->zero3;
  o->memory.zero3 = p->zero3;
  o->memory.offload = p->offload_optimizer;
  if (p->offload_overlap && !(p->offload_optimizer > 0)) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                "--offload-overlap: needs --offload-optimizer with a fraction above 0");
    return FALSE;
  }
  o->memory.offload_overlap = p->offload_overlap;
  if (p->allreduce) {
    int v = sim_allreduce_algo_from_name(p->allreduce);
    if (v < 0) {
      g_set_error(error, SIM_ERROR, SIM_ERROR_UNKNOWN,
                  "--allreduce: unknown '%s'; expected ring, tree or hierarchical", p->allreduce);
      return FALSE;
    }
    o->sync.algorithm = (SimAllreduceAlgo)v;
  }
  if (p->bucket_mb < 0 && p->bucket_mb != -1) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID, "--bucket-mb: expected 0 or more");
    return FALSE;
  }
  o->sync.bucket_bytes = p->bucket_mb >= 0 ? (int64_t)(p->bucket_mb * 1e6) : 25000000;
  o->sync.overlap = !p->no_overlap;
  if (p->detail && strcmp(p->detail, "steps") && strcmp(p->detail, "flows") &&
      strcmp(p->detail, "collective")) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_UNKNOWN,
                "--detail: unknown '%s'; expected flows, collective or steps", p->detail);
    return FALSE;
  }
  /* The real-valued parameters were checked as they were parsed (parse_real). */
  return TRUE;
}

gboolean cli_plan_has_degrees(const CliPlanOptions *p)
{
  return p->dp || p->tp || p->pp || p->ep || p->cp || p->etp || p->microbatches ||
         p->microbatch_size;
}

gboolean cli_plan_resolve(const CliPlanOptions *p, const SimGraph *g, const SimMachine *m,
                          SimMegatronOptions *out, GError **error)
{
  SimMegatronOptions o;
  if (!cli_plan_megatron_options(p, &o, error))
    return FALSE;
  gboolean megatron = cli_plan_has_degrees(p);
  int n_dev = sim_machine_n_devices(m);
  if (!megatron) {
    /* Data parallel over every GPU, with the plan's memory and sync options. */
    o.dp = n_dev;
  } else if (!p->dp) {
    /* As Megatron derives it: the GPUs that tensor and pipeline parallelism leave. */
    int mp = o.tp * o.pp * o.cp;
    if ((mp > n_dev || n_dev % mp) && o.cp > 1) {
      g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                  "tp %d x pp %d x cp %d = %d GPUs do not divide the machine's %d; give --dp "
                  "to use fewer", o.tp, o.pp, o.cp, mp, n_dev);
      return FALSE;
    }
    if (mp > n_dev || n_dev % mp) {
      g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                  "tp %d x pp %d = %d GPUs do not divide the machine's %d; give --dp to use "
                  "fewer", o.tp, o.pp, mp, n_dev);
      return FALSE;
    }
    o.dp = n_dev / mp;
  }
  if (!p->microbatches && !p->microbatch_size) {
    /* Without a word on micro-batches: one, or four per stage for a pipeline, as far as
     * the batch divides. */
    int64_t per_replica = sim_graph_batch_size(g) / MAX(o.dp, 1);
    int mbs = o.pp > 1 ? 4 * o.pp : 1;
    while (mbs > 1 && per_replica % mbs)
      mbs--;
    o.microbatches = mbs;
  }
  *out = o;
  return TRUE;
}

SimStrategy *cli_plan_build(const CliPlanOptions *p, SimGraph *g, const SimMachine *m,
                            GError **error)
{
  SimMegatronOptions o;
  return cli_plan_resolve(p, g, m, &o, error) ? sim_strategy_megatron(g, m, &o, error) : NULL;
}

SimOptions cli_plan_sim_options(const CliPlanOptions *p, const CliProblem *pb)
{
  SimOptions o = sim_options_default();
  o.allreduce_table = pb->allreduce_table;
  if (p->detail && !strcmp(p->detail, "steps"))
    o.detail = SIM_DETAIL_STEPS;
  else if (p->detail && !strcmp(p->detail, "collective"))
    o.detail = SIM_DETAIL_COLLECTIVE;
  o.fold = !p->no_fold;
  o.merge_chains = !p->no_chains;
  o.merge_rings = !p->no_rings;
  o.steady_state = !p->no_steady;
  o.fold_checked = p->fold_check;
  o.prune_shadows = !p->no_prune;
  o.ring_steps = !p->no_ring_steps;
  /* SimOptions' own "not given": 0 for the efficiencies, -1 for the step cost. */
  if (!isnan(p->coll_efficiency))
    o.coll_bandwidth_efficiency = p->coll_efficiency;
  if (!isnan(p->net_efficiency))
    o.net_bandwidth_efficiency = p->net_efficiency;
  o.coll_step_latency = !isnan(p->coll_latency_us) ? p->coll_latency_us * 1e-6 : -1;
  if (!isnan(p->coll_base_us))
    o.coll_base_latency = p->coll_base_us * 1e-6;
  if (!isnan(p->host_overhead_us))
    o.host_kernel_time = p->host_overhead_us * 1e-6;
  if (!isnan(p->host_step_us))
    o.host_step_time = p->host_step_us * 1e-6;
  o.blocking_sends = p->blocking_sends;
  return o;
}
