/* llm.c — today's large language models: LLaMA-2 and LLaMA-3 (dense), Mixtral and a
 * DeepSeekMoE-style fine-grained mixture of experts.
 *
 * Every one is a pre-norm decoder as Meta's and Mistral's reference code builds it
 * (llama/model.py, mistral-src): token embeddings (no position embeddings, no dropout),
 * then per layer RMS norm, grouped-query causal self-attention with rotary embeddings and
 * no biases (FlashAttention's kernels), a residual, RMS norm, the feed-forward block and a
 * residual; a final RMS norm and an output layer of its own (untied from the embedding)
 * into the loss.  The feed-forward block is a SwiGLU gated MLP (sim/ops/moe.c) in the dense
 * models, a mixture of SwiGLU experts in Mixtral, and in DeepSeekMoE (Dai et al. 2024) a
 * mixture of many narrow routed experts plus always-active shared experts (one gated MLP
 * of their summed width, added to the routed output), with the first layers dense.
 *
 * Parameter counts against the published ones: tests/test-zoo.c; the blocks and their
 * costs: docs/llm.md. */
#include "zoo.h"

#include <string.h>

/* Whether @model's parameter table declares @name. */
static gboolean has_param(const SimZooModel *model, const char *name)
{
  for (const SimModelParam *p = model->params; p->name; p++)
    if (!strcmp(p->name, name))
      return TRUE;
  return FALSE;
}

static void mark(SimGraph *g, int t, gboolean checkpoint)
{
  if (t < 0)
    return;
  int op = sim_graph_tensor_producer(g, t);
  if (checkpoint)
    sim_graph_set_checkpoint(g, op, TRUE);
  else
    sim_graph_set_selective_recompute(g, op, TRUE);
}

typedef struct {
  int64_t hidden, ffn, vocab;
  int heads, kv_heads, layers;
  double rope_theta;
  int experts, top_k;            /* 0 experts: dense                                    */
  int64_t expert_ffn;
  int shared_experts, dense_layers;
  gboolean normalize_top_k;
} LlmConfig;

static int attention(SimGraph *g, const char *name, int x, const LlmConfig *c)
{
  g_autoptr(SimAttrs) attrs = sim_attrs_new(SIM_OP_ATTENTION);
  sim_zoo_attr_int(g, attrs, "heads", c->heads);
  sim_zoo_attr_int(g, attrs, "head_dim", c->hidden / c->heads);
  sim_zoo_attr_int(g, attrs, "kv_heads", c->kv_heads);
  sim_zoo_attr_int(g, attrs, "causal", TRUE);
  sim_zoo_attr_int(g, attrs, "bias", FALSE);
  sim_zoo_attr_int(g, attrs, "rotary", TRUE);
  sim_zoo_attr_float(g, attrs, "rotary_base", c->rope_theta);
  if (sim_zoo_going(g))
    sim_attrs_set_string(attrs, "kernel", sim_attention_kernel_name(SIM_ATTENTION_FLASH),
                         &g->sticky_error);
  int in[3] = { x, x, x };
  return sim_zoo_add_op(g, SIM_OP_ATTENTION, name, 3, in, attrs);
}

static int feed_forward(SimGraph *g, int l, int x, const LlmConfig *c)
{
  SimZooName n;
  if (c->experts == 0 || l < c->dense_layers)
    return sim_graph_gated_mlp(g, sim_zoo_name(&n, "layer%d.mlp", l), x, c->ffn,
                               SIM_UNARY_SILU);
  g_autoptr(SimAttrs) attrs = sim_attrs_new(SIM_OP_MOE);
  sim_zoo_attr_int(g, attrs, "experts", c->experts);
  sim_zoo_attr_int(g, attrs, "top_k", c->top_k);
  sim_zoo_attr_int(g, attrs, "ffn", c->expert_ffn);
  sim_zoo_attr_int(g, attrs, "normalize_top_k", c->normalize_top_k);
  int in[2] = { x, sim_graph_linear(g, sim_zoo_name(&n, "layer%d.router", l), x, c->experts,
                                    FALSE, SIM_UNARY_IDENTITY) };
  int y = sim_zoo_add_op(g, SIM_OP_MOE, sim_zoo_name(&n, "layer%d.moe", l), 2, in, attrs);
  if (c->shared_experts > 0) {
    int s = sim_graph_gated_mlp(g, sim_zoo_name(&n, "layer%d.shared", l), x,
                                c->shared_experts * c->expert_ffn, SIM_UNARY_SILU);
    y = sim_graph_binary(g, sim_zoo_name(&n, "layer%d.moe.add", l), y, s, SIM_BINARY_ADD);
  }
  return y;
}

static SimGraph *build_llm(const SimZooModel *model, const SimZooArgs *a, GError **error)
{
  if (!sim_zoo_check_divisible(a, "hidden", "heads", error) ||
      !sim_zoo_check_divisible(a, "heads", "kv_heads", error))
    return NULL;
  gboolean moe = has_param(model, "experts");
  LlmConfig c = {
    .hidden = sim_zoo_arg(a, "hidden"),
    .ffn = has_param(model, "ffn") ? sim_zoo_arg(a, "ffn") : 0,
    .vocab = sim_zoo_arg(a, "vocab"),
    .heads = sim_zoo_arg_int(a, "heads"),
    .kv_heads = sim_zoo_arg_int(a, "kv_heads"),
    .layers = sim_zoo_arg_int(a, "layers"),
    .rope_theta = (double)sim_zoo_arg(a, "rope_theta"),
    .experts = moe ? sim_zoo_arg_int(a, "experts") : 0,
    .top_k = moe ? sim_zoo_arg_int(a, "top_k") : 0,
    .expert_ffn = moe ? sim_zoo_arg(a, "expert_ffn") : 0,
    .shared_experts = has_param(model, "shared_experts") ? sim_zoo_arg_int(a, "shared_experts")
                                                         : 0,
    .dense_layers = has_param(model, "dense_layers") ? sim_zoo_arg_int(a, "dense_layers") : 0,
  };
  /* Mixtral renormalizes its top-k weights; DeepSeekMoE (with shared experts) does not. */
  c.normalize_top_k = c.shared_experts == 0;
  if (moe && c.top_k > c.experts) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                "model '%s': top_k (%d) exceeds the %d experts", model->name, c.top_k,
                c.experts);
    return NULL;
  }
  if ((c.hidden / c.heads) % 2 != 0) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                "model '%s': the head dimension hidden / heads = %" G_GINT64_FORMAT
                " must be even for rotary embeddings", model->name, c.hidden / c.heads);
    return NULL;
  }
  int64_t batch = sim_zoo_arg(a, "batch"), seq = sim_zoo_arg(a, "seq");

  g_autoptr(SimGraph) g = sim_graph_new(model->name);
  sim_graph_set_tokens_per_sample(g, seq);
  int64_t dims[] = { batch, seq };
  int tokens = sim_graph_input(g, "tokens", SIM_DTYPE_INT32, 2, dims);
  int labels = sim_graph_input(g, "labels", SIM_DTYPE_INT32, 2, dims);
  int x = sim_graph_embedding(g, "embed", tokens, c.vocab, c.hidden);
  SimZooName n;
  for (int l = 0; l < c.layers && sim_zoo_going(g); l++) {
    int y = sim_graph_rmsnorm(g, sim_zoo_name(&n, "layer%d.norm1", l), x);
    y = attention(g, sim_zoo_name(&n, "layer%d.attn", l), y, &c);
    mark(g, y, FALSE);
    x = sim_graph_binary(g, sim_zoo_name(&n, "layer%d.attn.residual", l), x, y, SIM_BINARY_ADD);
    y = sim_graph_rmsnorm(g, sim_zoo_name(&n, "layer%d.norm2", l), x);
    y = feed_forward(g, l, y, &c);
    x = sim_graph_binary(g, sim_zoo_name(&n, "layer%d.mlp.residual", l), x, y, SIM_BINARY_ADD);
    mark(g, x, TRUE);
  }
  x = sim_graph_rmsnorm(g, "final_norm", x);
  x = sim_graph_linear(g, "lm_head", x, c.vocab, FALSE, SIM_UNARY_IDENTITY);
  sim_graph_cross_entropy_fp32(g, "loss", x, labels);
  return g_steal_pointer(&g);
}

/* ---------------------------------------------------------------------------------- */
/* The registry's entries.  Dimensions from the models' released configurations
 * (config.json of each Hugging Face repository: hidden_size, intermediate_size,
 * num_attention_heads, num_key_value_heads, num_hidden_layers, vocab_size, rope_theta). */

#define LLM_COMMON(batch, seq, layers, hidden, heads, kv, vocab, theta)                   \
  { "batch", batch, "global batch size of one iteration (sequences)" },                 \
  { "seq", seq, "sequence length" },                                                   \
  { "layers", layers, "decoder layers" },                                              \
  { "hidden", hidden, "hidden size" },                                                 \
  { "heads", heads, "query heads (must divide hidden)" },                              \
  { "kv_heads", kv, "key-value heads of grouped-query attention (must divide heads)" }, \
  { "vocab", vocab, "vocabulary size" },                                               \
  { "rope_theta", theta, "base of the rotary embeddings' angles" }

#define LLAMA(batch, seq, layers, hidden, heads, kv, ffn, vocab, theta)                  \
  LLM_COMMON(batch, seq, layers, hidden, heads, kv, vocab, theta),                     \
  { "ffn", ffn, "width of the SwiGLU MLP" },                                           \
  { NULL, 0, NULL }

#define MIXTRAL(batch, seq, layers, hidden, heads, kv, experts, top_k, effn, vocab, theta) \
  LLM_COMMON(batch, seq, layers, hidden, heads, kv, vocab, theta),                     \
  { "experts", experts, "experts per layer" },                                         \
  { "top_k", top_k, "experts per token" },                                             \
  { "expert_ffn", effn, "width of one expert's SwiGLU MLP" },                          \
  { NULL, 0, NULL }

/* LLaMA-2 (Touvron et al. 2023, section 2.2): 4k context, batches of 4M tokens. */
static const SimModelParam llama2_7b[] = { LLAMA(1024, 4096, 32, 4096, 32, 32, 11008, 32000, 10000) };
static const SimModelParam llama2_13b[] = { LLAMA(1024, 4096, 40, 5120, 40, 40, 13824, 32000, 10000) };
static const SimModelParam llama2_70b[] = { LLAMA(1024, 4096, 80, 8192, 64, 8, 28672, 32000, 10000) };
/* LLaMA-3 (Dubey et al. 2024, table 3: 8k context; 405B trained at last on batches of 16M
 * tokens, section 3.4.1); 8B and 70B publish no batch: 4M tokens here. */
static const SimModelParam llama3_8b[] = { LLAMA(512, 8192, 32, 4096, 32, 8, 14336, 128256, 500000) };
static const SimModelParam llama3_70b[] = { LLAMA(512, 8192, 80, 8192, 64, 8, 28672, 128256, 500000) };
static const SimModelParam llama3_405b[] = { LLAMA(2048, 8192, 126, 16384, 128, 8, 53248, 128256, 500000) };
/* Mixtral (Jiang et al. 2024, table 1) publishes no batch: 4M tokens of 4k here. */
static const SimModelParam mixtral_8x7b[] = {
  MIXTRAL(1024, 4096, 32, 4096, 32, 8, 8, 2, 14336, 32000, 1000000)
};
static const SimModelParam mixtral_8x22b[] = {
  MIXTRAL(1024, 4096, 56, 6144, 48, 8, 8, 2, 16384, 32768, 1000000)
};
/* DeepSeekMoE 16B (Dai et al. 2024, section 5.1 and the released config): 28 layers, the
 * first dense (ffn 10944), then 64 routed experts of width 1408, top 6, and 2 shared;
 * batches of 4.5k sequences of 4k tokens. */
static const SimModelParam deepseek_moe_16b[] = {
  LLM_COMMON(4608, 4096, 28, 2048, 16, 16, 102400, 10000),
  { "ffn", 10944, "width of the dense layers' SwiGLU MLP" },
  { "experts", 64, "routed experts per layer" },
  { "top_k", 6, "routed experts per token" },
  { "expert_ffn", 1408, "width of one expert's SwiGLU MLP" },
  { "shared_experts", 2, "shared experts per layer (always active)" },
  { "dense_layers", 1, "leading layers with a dense MLP instead of experts" },
  { NULL, 0, NULL },
};
/* The generic entries default to small sizes for trying plans. */
static const SimModelParam llama_small[] = { LLAMA(64, 2048, 16, 2048, 16, 4, 5632, 32000, 10000) };
static const SimModelParam moe_small[] = {
  MIXTRAL(64, 2048, 16, 2048, 16, 4, 8, 2, 5632, 32000, 10000)
};

const SimZooModel sim_zoo_llm_models[] = {
  { "llama", "LLaMA-style decoder of any size (RMS norm, GQA, rotary, SwiGLU); defaults "
             "to 0.85 B params", llama_small, build_llm },
  { "llama2-7b", "LLaMA-2 7B: 32 layers, h 4096, 32 heads, ffn 11008, seq 4096 (6.74 B params)",
    llama2_7b, build_llm },
  { "llama2-13b", "LLaMA-2 13B: 40 layers, h 5120, 40 heads, ffn 13824, seq 4096 (13.0 B params)",
    llama2_13b, build_llm },
  { "llama2-70b", "LLaMA-2 70B: 80 layers, h 8192, 64 heads, 8 kv heads, ffn 28672 (69.0 B params)",
    llama2_70b, build_llm },
  { "llama3-8b", "LLaMA-3 8B: 32 layers, h 4096, 8 kv heads, vocab 128256, seq 8192 (8.03 B params)",
    llama3_8b, build_llm },
  { "llama3-70b", "LLaMA-3 70B: 80 layers, h 8192, 8 kv heads, vocab 128256, seq 8192 (70.6 B params)",
    llama3_70b, build_llm },
  { "llama3-405b", "LLaMA-3.1 405B: 126 layers, h 16384, 128 heads, 8 kv heads (405.9 B params)",
    llama3_405b, build_llm },
  { "moe", "Mixtral-style mixture of experts of any size; defaults to 8 experts, top 2 "
           "(4.7 B params)", moe_small, build_llm },
  { "mixtral-8x7b", "Mixtral 8x7B: 32 layers, h 4096, 8 experts, top 2 (46.7 B params, 12.9 B "
                    "active)", mixtral_8x7b, build_llm },
  { "mixtral-8x22b", "Mixtral 8x22B: 56 layers, h 6144, 8 experts, top 2 (140.6 B params, 39.2 B "
                     "active)", mixtral_8x22b, build_llm },
  { "deepseek-moe-16b", "DeepSeekMoE 16B: 28 layers, h 2048, 64 routed experts (top 6) + 2 shared "
                        "(16.4 B params, 2.8 B active)", deepseek_moe_16b, build_llm },
  { NULL, NULL, NULL, NULL },
};
