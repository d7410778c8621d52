/* transformer.c — attention models: GPT (Megatron-LM's), its published sizes, BERT and
 * the original encoder-decoder Transformer.
 *
 * GPT follows Megatron-LM's GPTModel (megatron/model/gpt_model.py, language_model.py,
 * transformer.py), because the Megatron strategy builder (sim_strategy_megatron) and the
 * validation against published Megatron and vTrain measurements lean on its structure:
 * pre-LN layers whose attention is one operator with its four projections, an MLP of
 * two linear layers 4h wide with a fused GeLU, and learned position embeddings.
 *
 * Tied weights.  Megatron, GPT-2 and BERT share the token embedding with the output
 * layer, and the Transformer shares it between encoder, decoder and output: the output
 * layer ("lm_head") uses the embedding's table (sim_graph_share_weights), so the
 * parameter count holds it once.  Where pipeline parallelism puts the two on different
 * stages, each keeps a copy and their gradients are all-reduced, as in Megatron. */
#include "zoo.h"

#include <string.h>

#define DROPOUT 0.1

/* Marks the op that produced @t, ignoring the -1 of a sticky builder error. */
static void mark_checkpoint(SimGraph *g, int t)
{
  if (t >= 0)
    sim_graph_set_checkpoint(g, sim_graph_tensor_producer(g, t), TRUE);
}

static void mark_selective(SimGraph *g, int t)
{
  if (t >= 0)
    sim_graph_set_selective_recompute(g, sim_graph_tensor_producer(g, t), TRUE);
}

static int int_input(SimGraph *g, const char *name, int64_t batch, int64_t seq)
{
  int64_t dims[] = { batch, seq };
  return sim_graph_input(g, name, SIM_DTYPE_INT32, 2, dims);
}

/* Multi-head attention with biased projections and dropout on the attention
 * probabilities, as Megatron's ParallelAttention, BERT and the Transformer have;
 * sim_graph_attention() takes neither, so the attributes are set here. */
static int attention(SimGraph *g, const char *name, int q, int kv, int heads, int64_t hidden,
                     gboolean causal, gboolean megatron)
{
  g_autoptr(SimAttrs) attrs = sim_attrs_new(SIM_OP_ATTENTION);
  sim_zoo_attr_int(g, attrs, "heads", heads);
  sim_zoo_attr_int(g, attrs, "head_dim", hidden / heads);
  sim_zoo_attr_int(g, attrs, "causal", causal);
  sim_zoo_attr_int(g, attrs, "bias", TRUE);
  sim_zoo_attr_float(g, attrs, "dropout", DROPOUT);
  if (megatron)
    sim_zoo_attr_int(g, attrs, "megatron_softmax", TRUE);
  int in[3] = { q, kv, kv };
  return sim_zoo_add_op(g, SIM_OP_ATTENTION, name, 3, in, attrs);
}

/* ---------------------------------------------------------------------------------- */
/* GPT                                                                                 */

/* One Megatron ParallelTransformerLayer (pre-LN). */
static int gpt_layer(SimGraph *g, int l, int x, int heads, int64_t hidden)
{
  SimZooName n;
  int y = sim_graph_layernorm(g, sim_zoo_name(&n, "layer%d.ln1", l), x);
  y = attention(g, sim_zoo_name(&n, "layer%d.attn", l), y, y, heads, hidden, TRUE, TRUE);
  /* Korthikanti et al. 2022 recompute the attention core (scores, softmax, dropout)
   * under selective recomputation: large activations, few FLOPs. */
  mark_selective(g, y);
  y = sim_graph_dropout(g, sim_zoo_name(&n, "layer%d.attn.dropout", l), y, DROPOUT);
  x = sim_graph_binary(g, sim_zoo_name(&n, "layer%d.attn.residual", l), x, y, SIM_BINARY_ADD);
  y = sim_graph_layernorm(g, sim_zoo_name(&n, "layer%d.ln2", l), x);
  y = sim_graph_linear(g, sim_zoo_name(&n, "layer%d.mlp.fc1", l), y, 4 * hidden, TRUE,
                       SIM_UNARY_GELU);
  y = sim_graph_linear(g, sim_zoo_name(&n, "layer%d.mlp.fc2", l), y, hidden, TRUE,
                       SIM_UNARY_IDENTITY);
  y = sim_graph_dropout(g, sim_zoo_name(&n, "layer%d.mlp.dropout", l), y, DROPOUT);
  x = sim_graph_binary(g, sim_zoo_name(&n, "layer%d.mlp.residual", l), x, y, SIM_BINARY_ADD);
  /* The layer boundary: Megatron's full recomputation keeps only each layer's input. */
  mark_checkpoint(g, x);
  return x;
}

static SimGraph *build_gpt(const SimZooModel *model, const SimZooArgs *a, GError **error)
{
  if (!sim_zoo_check_divisible(a, "hidden", "heads", error))
    return NULL;
  int64_t batch = sim_zoo_arg(a, "batch");
  int64_t seq = sim_zoo_arg(a, "seq");
  int64_t hidden = sim_zoo_arg(a, "hidden");
  int64_t vocab = sim_zoo_arg(a, "vocab");
  int layers = sim_zoo_arg_int(a, "layers");
  int heads = sim_zoo_arg_int(a, "heads");

  g_autoptr(SimGraph) g = sim_graph_new(model->name);
  sim_graph_set_tokens_per_sample(g, seq);
  int tokens = int_input(g, "tokens", batch, seq);
  int positions = int_input(g, "positions", batch, seq);
  int labels = int_input(g, "labels", batch, seq);

  /* Megatron's Embedding: word embeddings plus learned absolute position embeddings
   * (one row per position of the sequence), then embedding dropout. */
  int x = sim_graph_embedding(g, "embed", tokens, vocab, hidden);
  int word_table = x;
  int p = sim_graph_embedding(g, "embed.pos", positions, seq, hidden);
  x = sim_graph_binary(g, "embed.add", x, p, SIM_BINARY_ADD);
  x = sim_graph_dropout(g, "embed.dropout", x, DROPOUT);

  for (int l = 0; l < layers && sim_zoo_going(g); l++)
    x = gpt_layer(g, l, x, heads, hidden);

  x = sim_graph_layernorm(g, "final_ln", x);
  /* The output layer multiplies by the word embedding table (tied; see the top). */
  x = sim_graph_linear(g, "lm_head", x, vocab, FALSE, SIM_UNARY_IDENTITY);
  sim_zoo_share(g, x, word_table);
  /* Megatron computes the loss in fp32 unless --fp16-lm-cross-entropy is given. */
  sim_graph_cross_entropy_fp32(g, "loss", x, labels);
  return g_steal_pointer(&g);
}

/* ---------------------------------------------------------------------------------- */
/* BERT (Devlin et al. 2019): post-LN encoder, masked-language-model head               */

static SimGraph *build_bert(const SimZooModel *model, const SimZooArgs *a, GError **error)
{
  if (!sim_zoo_check_divisible(a, "hidden", "heads", error))
    return NULL;
  int64_t batch = sim_zoo_arg(a, "batch");
  int64_t seq = sim_zoo_arg(a, "seq");
  int64_t hidden = sim_zoo_arg(a, "hidden");
  int64_t vocab = sim_zoo_arg(a, "vocab");
  int64_t max_positions = sim_zoo_arg(a, "positions");
  int layers = sim_zoo_arg_int(a, "layers");
  int heads = sim_zoo_arg_int(a, "heads");
  if (sim_zoo_arg(a, "head") > 2) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                "model '%s': head is %" G_GINT64_FORMAT "; expected 1 (masked-LM) or 2 "
                "(question answering)", model->name, sim_zoo_arg(a, "head"));
    return NULL;
  }
  if (seq > max_positions) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                "model '%s': seq (%" G_GINT64_FORMAT ") exceeds the %" G_GINT64_FORMAT
                " positions of the position embedding (parameter positions)", model->name,
                seq, max_positions);
    return NULL;
  }

  g_autoptr(SimGraph) g = sim_graph_new(model->name);
  sim_graph_set_tokens_per_sample(g, seq);
  int tokens = int_input(g, "tokens", batch, seq);
  int segments = int_input(g, "segments", batch, seq);
  int positions = int_input(g, "positions", batch, seq);
  int labels = -1;

  /* Word, position (a table of max_position_embeddings = 512 rows whatever the sequence
   * length) and token-type (two segments) embeddings, summed and normalized. */
  int x = sim_graph_embedding(g, "embed", tokens, vocab, hidden);
  int word_table = x;
  int p = sim_graph_embedding(g, "embed.pos", positions, max_positions, hidden);
  int t = sim_graph_embedding(g, "embed.type", segments, 2, hidden);
  x = sim_graph_binary(g, "embed.add", x, p, SIM_BINARY_ADD);
  x = sim_graph_binary(g, "embed.add_type", x, t, SIM_BINARY_ADD);
  x = sim_graph_layernorm(g, "embed.ln", x);
  x = sim_graph_dropout(g, "embed.dropout", x, DROPOUT);

  SimZooName n;
  for (int l = 0; l < layers && sim_zoo_going(g); l++) {
    int y = attention(g, sim_zoo_name(&n, "layer%d.attn", l), x, x, heads, hidden, FALSE, FALSE);
    mark_selective(g, y);
    y = sim_graph_dropout(g, sim_zoo_name(&n, "layer%d.attn.dropout", l), y, DROPOUT);
    x = sim_graph_binary(g, sim_zoo_name(&n, "layer%d.attn.residual", l), x, y,
                         SIM_BINARY_ADD);
    x = sim_graph_layernorm(g, sim_zoo_name(&n, "layer%d.ln1", l), x);
    y = sim_graph_linear(g, sim_zoo_name(&n, "layer%d.mlp.fc1", l), x, 4 * hidden, TRUE,
                         SIM_UNARY_GELU);
    y = sim_graph_linear(g, sim_zoo_name(&n, "layer%d.mlp.fc2", l), y, hidden, TRUE,
                         SIM_UNARY_IDENTITY);
    y = sim_graph_dropout(g, sim_zoo_name(&n, "layer%d.mlp.dropout", l), y, DROPOUT);
    x = sim_graph_binary(g, sim_zoo_name(&n, "layer%d.mlp.residual", l), x, y,
                         SIM_BINARY_ADD);
    /* Post-LN: the layer ends with its second layer normalization. */
    x = sim_graph_layernorm(g, sim_zoo_name(&n, "layer%d.ln2", l), x);
    mark_checkpoint(g, x);
  }

  if (sim_zoo_arg(a, "head") == 2) {
    /* Fine-tuning for question answering (SQuAD): a span head of two logits per token,
     * the start and the end of the answer, each a softmax over the positions. */
    x = sim_graph_linear(g, "qa_outputs", x, 2, TRUE, SIM_UNARY_IDENTITY);
    labels = int_input(g, "labels", batch, seq);
    sim_graph_cross_entropy(g, "loss", x, labels);
    return g_steal_pointer(&g);
  }
  /* The head may see only the masked positions (NVIDIA's BERT gathers them first, its
   * "dense sequence output"): a slice of that many positions stands for the gather. */
  int64_t predictions = sim_zoo_arg(a, "predictions");
  if (predictions < seq) {
    int64_t sizes[] = { predictions, seq - predictions };
    int parts[2] = { -1, -1 };
    sim_zoo_split(g, "mlm.masked", x, 1, 2, sizes, parts);
    x = parts[0];
  }
  labels = int_input(g, "labels", batch, MIN(predictions, seq));
  /* BertLMPredictionHead: a dense transform with GeLU and layer normalization, then the
   * decoder, tied to the word embeddings, with its own bias.  The pooler and the
   * next-sentence head (0.6 M and 1.5 k parameters at base size) are left out. */
  x = sim_graph_linear(g, "mlm.transform", x, hidden, TRUE, SIM_UNARY_GELU);
  x = sim_graph_layernorm(g, "mlm.ln", x);
  x = sim_graph_linear(g, "lm_head", x, vocab, TRUE, SIM_UNARY_IDENTITY);
  sim_zoo_share(g, x, word_table);
  sim_graph_cross_entropy(g, "loss", x, labels);
  return g_steal_pointer(&g);
}

/* ---------------------------------------------------------------------------------- */
/* Transformer (Vaswani et al. 2017), base model: 6 + 6 layers, d 512, 8 heads, ff 2048 */

/* Post-LN residual: dropout on the sublayer's output, add, normalize. */
static int residual_ln(SimGraph *g, const char *prefix, int x, int y)
{
  SimZooName n;
  y = sim_graph_dropout(g, sim_zoo_name(&n, "%s.dropout", prefix), y, DROPOUT);
  x = sim_graph_binary(g, sim_zoo_name(&n, "%s.residual", prefix), x, y, SIM_BINARY_ADD);
  return sim_graph_layernorm(g, sim_zoo_name(&n, "%s.ln", prefix), x);
}

static int feed_forward(SimGraph *g, const char *prefix, int x, int64_t ff, int64_t d)
{
  SimZooName n;
  int y = sim_graph_linear(g, sim_zoo_name(&n, "%s.ffn.fc1", prefix), x, ff, TRUE,
                           SIM_UNARY_RELU);
  y = sim_graph_linear(g, sim_zoo_name(&n, "%s.ffn.fc2", prefix), y, d, TRUE,
                       SIM_UNARY_IDENTITY);
  return residual_ln(g, sim_zoo_name(&n, "%s.ffn", prefix), x, y);
}

static SimGraph *build_transformer(const SimZooModel *model, const SimZooArgs *a,
                                   GError **error)
{
  if (!sim_zoo_check_divisible(a, "hidden", "heads", error))
    return NULL;
  int64_t batch = sim_zoo_arg(a, "batch");
  int64_t seq = sim_zoo_arg(a, "seq");
  int64_t d = sim_zoo_arg(a, "hidden");
  int64_t ff = sim_zoo_arg(a, "ffn");
  int64_t vocab = sim_zoo_arg(a, "vocab");
  int enc_layers = sim_zoo_arg_int(a, "encoder_layers");
  int dec_layers = sim_zoo_arg_int(a, "decoder_layers");
  int heads = sim_zoo_arg_int(a, "heads");

  g_autoptr(SimGraph) g = sim_graph_new(model->name);
  sim_graph_set_tokens_per_sample(g, seq);
  int src = int_input(g, "source", batch, seq);
  int tgt = int_input(g, "target", batch, seq);
  int labels = int_input(g, "labels", batch, seq);
  SimZooName n, p;

  /* Sinusoidal position encodings have no weights and an element-wise cost that the
   * embedding dropout stands for; the sqrt(d) scaling of the embeddings likewise. */
  int x = sim_graph_embedding(g, "encoder.embed", src, vocab, d);
  int word_table = x;
  x = sim_graph_dropout(g, "encoder.embed.dropout", x, DROPOUT);
  for (int l = 0; l < enc_layers && sim_zoo_going(g); l++) {
    sim_zoo_name(&p, "encoder.layer%d", l);
    int y = attention(g, sim_zoo_name(&n, "%s.attn", p.s), x, x, heads, d, FALSE, FALSE);
    mark_selective(g, y);
    x = residual_ln(g, sim_zoo_name(&n, "%s.attn", p.s), x, y);
    x = feed_forward(g, p.s, x, ff, d);
    mark_checkpoint(g, x);
  }
  int memory = x;

  x = sim_graph_embedding(g, "decoder.embed", tgt, vocab, d);
  sim_zoo_share(g, x, word_table);
  x = sim_graph_dropout(g, "decoder.embed.dropout", x, DROPOUT);
  for (int l = 0; l < dec_layers && sim_zoo_going(g); l++) {
    sim_zoo_name(&p, "decoder.layer%d", l);
    int y = attention(g, sim_zoo_name(&n, "%s.self_attn", p.s), x, x, heads, d, TRUE, FALSE);
    mark_selective(g, y);
    x = residual_ln(g, sim_zoo_name(&n, "%s.self_attn", p.s), x, y);
    y = attention(g, sim_zoo_name(&n, "%s.cross_attn", p.s), x, memory, heads, d, FALSE, FALSE);
    mark_selective(g, y);
    x = residual_ln(g, sim_zoo_name(&n, "%s.cross_attn", p.s), x, y);
    x = feed_forward(g, p.s, x, ff, d);
    mark_checkpoint(g, x);
  }
  /* The pre-softmax projection shares the embedding matrix (paper section 3.4). */
  x = sim_graph_linear(g, "lm_head", x, vocab, FALSE, SIM_UNARY_IDENTITY);
  sim_zoo_share(g, x, word_table);
  sim_graph_cross_entropy(g, "loss", x, labels);
  return g_steal_pointer(&g);
}

/* ---------------------------------------------------------------------------------- */
/* The registry's entries                                                              */

#define GPT_PARAMS(batch, layers, hidden, heads, seq, vocab)                             \
  { "batch", batch, "global batch size of one iteration (sequences)" },                 \
  { "layers", layers, "transformer layers" },                                          \
  { "hidden", hidden, "hidden size h" },                                               \
  { "heads", heads, "attention heads (must divide hidden)" },                          \
  { "seq", seq, "sequence length" },                                                   \
  { "vocab", vocab, "vocabulary size" },                                               \
  { NULL, 0, NULL }

/* The generic model defaults to GPT-2 small (124 M). */
static const SimModelParam gpt_params[] = { GPT_PARAMS(8, 12, 768, 12, 1024, 50257) };
/* GPT-2 XL (Radford et al. 2019), batch 512 as trained. */
static const SimModelParam gpt2_1_5b_params[] = { GPT_PARAMS(512, 48, 1600, 25, 1024, 50257) };
/* GPT-3 XL and GPT-3 (Brown et al. 2020, table 2.1): batch 1M and 3.2M tokens. */
static const SimModelParam gpt3_1_3b_params[] = { GPT_PARAMS(512, 24, 2048, 16, 2048, 50257) };
static const SimModelParam gpt3_175b_params[] = {
  GPT_PARAMS(1536, 96, 12288, 96, 2048, 50257)
};
/* Narayanan et al. SC'21 table 1: sequence 2048, vocabulary 51,200, and the table's
 * batch sizes. */
static const SimModelParam megatron_1_7b_params[] = { GPT_PARAMS(512, 24, 2304, 24, 2048, 51200) };
static const SimModelParam megatron_3_6b_params[] = { GPT_PARAMS(512, 30, 3072, 32, 2048, 51200) };
static const SimModelParam megatron_7_5b_params[] = { GPT_PARAMS(512, 36, 4096, 32, 2048, 51200) };
static const SimModelParam megatron_18_4b_params[] = {
  GPT_PARAMS(1024, 40, 6144, 48, 2048, 51200)
};
static const SimModelParam megatron_39_1b_params[] = {
  GPT_PARAMS(1536, 48, 8192, 64, 2048, 51200)
};
static const SimModelParam megatron_76_1b_params[] = {
  GPT_PARAMS(1792, 60, 10240, 80, 2048, 51200)
};
static const SimModelParam megatron_145_6b_params[] = {
  GPT_PARAMS(2304, 80, 12288, 96, 2048, 51200)
};
static const SimModelParam megatron_310_1b_params[] = {
  GPT_PARAMS(2160, 96, 16384, 128, 2048, 51200)
};
static const SimModelParam megatron_529_6b_params[] = {
  GPT_PARAMS(2520, 105, 20480, 128, 2048, 51200)
};
static const SimModelParam megatron_1t_params[] = {
  GPT_PARAMS(3072, 128, 25600, 160, 2048, 51200)
};

#define BERT_PARAMS(layers, hidden, heads)                                               \
  { "batch", 256, "global batch size of one iteration (sequences)" },                   \
  { "layers", layers, "transformer layers" },                                          \
  { "hidden", hidden, "hidden size h" },                                               \
  { "heads", heads, "attention heads (must divide hidden)" },                          \
  { "seq", 512, "sequence length" },                                                   \
  { "positions", 512, "rows of the position embedding (max_position_embeddings)" },     \
  { "vocab", 30522, "vocabulary size (uncased WordPiece)" },                           \
  { "head", 1, "1: the masked-LM head (pre-training); 2: a span head (SQuAD fine-tuning)" }, \
  { "predictions", 4096, "positions per sequence the masked-LM head predicts (at most seq: " \
                         "all of them)" },                                                   \
  { NULL, 0, NULL }

/* Devlin et al. 2019: batch 256 sequences. */
static const SimModelParam bert_base_params[] = { BERT_PARAMS(12, 768, 12) };
static const SimModelParam bert_large_params[] = { BERT_PARAMS(24, 1024, 16) };

/* Vaswani et al. 2017 train on batches of about 25,000 source and 25,000 target tokens:
 * 192 sentences padded to 128 tokens are 24,576.  WMT'14 English-German uses a shared
 * byte-pair vocabulary of about 37,000 tokens. */
static const SimModelParam transformer_params[] = {
  { "batch", 192, "global batch size of one iteration (sentence pairs)" },
  { "seq", 128, "source and target sequence length" },
  { "encoder_layers", 6, "encoder layers" },
  { "decoder_layers", 6, "decoder layers" },
  { "hidden", 512, "model width d_model" },
  { "ffn", 2048, "inner width of the feed-forward layers d_ff" },
  { "heads", 8, "attention heads (must divide hidden)" },
  { "vocab", 37000, "shared source-target vocabulary" },
  { NULL, 0, NULL },
};

const SimZooModel sim_zoo_transformer_models[] = {
  { "transformer", "Transformer base (Vaswani et al.): 6+6 layers, d 512, 8 heads (63 M params)",
    transformer_params, build_transformer },
  { "bert-base", "BERT-base with MLM head: 12 layers, h 768, seq 512 (110 M params)",
    bert_base_params, build_bert },
  { "bert-large", "BERT-large with MLM head: 24 layers, h 1024, seq 512 (335 M params)",
    bert_large_params, build_bert },
  { "gpt", "Megatron-LM GPT of any size; defaults to GPT-2 small (124 M params, tied)",
    gpt_params, build_gpt },
  { "gpt2-1.5b", "GPT-2 XL: 48 layers, h 1600, 25 heads, seq 1024 (1.56 B params)",
    gpt2_1_5b_params, build_gpt },
  { "gpt3-1.3b", "GPT-3 XL: 24 layers, h 2048, 16 heads, seq 2048 (1.3 B params)",
    gpt3_1_3b_params, build_gpt },
  { "gpt3-175b", "GPT-3: 96 layers, h 12288, 96 heads, seq 2048 (174.6 B params)",
    gpt3_175b_params, build_gpt },
  { "megatron-1.7b", "Megatron-LM SC'21 table 1: 24 layers, h 2304, 24 heads (1.7 B)",
    megatron_1_7b_params, build_gpt },
  { "megatron-3.6b", "Megatron-LM SC'21 table 1: 30 layers, h 3072, 32 heads (3.6 B)",
    megatron_3_6b_params, build_gpt },
  { "megatron-7.5b", "Megatron-LM SC'21 table 1: 36 layers, h 4096, 32 heads (7.5 B)",
    megatron_7_5b_params, build_gpt },
  { "megatron-18.4b", "Megatron-LM SC'21 table 1: 40 layers, h 6144, 48 heads (18.4 B)",
    megatron_18_4b_params, build_gpt },
  { "megatron-39.1b", "Megatron-LM SC'21 table 1: 48 layers, h 8192, 64 heads (39.1 B)",
    megatron_39_1b_params, build_gpt },
  { "megatron-76.1b", "Megatron-LM SC'21 table 1: 60 layers, h 10240, 80 heads (76.1 B)",
    megatron_76_1b_params, build_gpt },
  { "megatron-145.6b", "Megatron-LM SC'21 table 1: 80 layers, h 12288, 96 heads (145.6 B)",
    megatron_145_6b_params, build_gpt },
  { "megatron-310.1b", "Megatron-LM SC'21 table 1: 96 layers, h 16384, 128 heads (310.1 B)",
    megatron_310_1b_params, build_gpt },
  { "megatron-529.6b", "Megatron-LM SC'21 table 1: 105 layers, h 20480, 128 heads (529.6 B)",
    megatron_529_6b_params, build_gpt },
  { "megatron-1t", "Megatron-LM SC'21 table 1: 128 layers, h 25600, 160 heads (1.0 T)",
    megatron_1t_params, build_gpt },
  { NULL, NULL, NULL, NULL },
};
