/* rnn.c — the recurrent networks of FlexFlow (MLSys'19, table 3): RNNTC (text
 * classification), RNNLM (language model) and NMT (sequence-to-sequence translation).
 *
 * FlexFlow unrolls every LSTM layer into operators over chunks of the sequence (its
 * nmt/rnn.h: LSTM_PER_NODE_LENGTH = 10 steps per operator), so that its search can put
 * different chunks of one layer on different devices and pipeline the layers: chunk j
 * of layer l waits for chunk j of layer l-1 (its input) and for chunk j-1 of layer l
 * (its recurrent state).  These graphs do the same; parameter "chunk" sets the steps
 * per operator.  The embeddings and the output layers run over the whole sequence, as
 * one operator each, and the sequence is split into chunks after the embedding and
 * concatenated again before the output layer.
 *
 * One thing FlexFlow's chunks have that the catalogue's LSTM operator does not:
 * - An initial state.  The operator reads only its input sequence, so the recurrent
 *   state (h, c) cannot enter it.  The hand-over is modelled by adding the previous
 *   chunk's last hidden state [b, 1, hidden] to the chunk's input (a broadcast add): the
 *   same dependency as FlexFlow's, and half its bytes (h without c), for an element-wise
 *   add's work.  This needs the input as wide as the LSTM, which every model here has.
 * - Nothing else: the chunks of one layer share the first chunk's weights
 *   (sim_graph_share_weights), as FlexFlow's share one parameter region. */
#include "zoo.h"

/* One LSTM operator over a chunk of @x, continuing the recurrence of @state (the
 * previous chunk's output of the same layer, or -1 for the first chunk). */
static int lstm_chunk(SimGraph *g, const char *name, int x, int state, int64_t hidden)
{
  if (state >= 0) {
    SimZooName n;
    SimShape s = sim_zoo_shape(g, state);
    int64_t steps = s.ndim == 3 ? s.dims[1] : 1;
    int last = state;
    if (steps > 1) {
      int64_t sizes[] = { steps - 1, 1 };
      int parts[2] = { -1, -1 };
      sim_graph_split(g, sim_zoo_name(&n, "%s.state", name), state, 1, 2, sizes, parts);
      last = parts[1];
    }
    x = sim_graph_binary(g, sim_zoo_name(&n, "%s.recurrence", name), x, last, SIM_BINARY_ADD);
  }
  return sim_graph_lstm(g, name, x, hidden);
}

/* Splits [b, s, d] along the sequence into @n chunks of @chunk steps. */
static void split_chunks(SimGraph *g, const char *name, int x, int n, int64_t chunk, int *out)
{
  if (n == 1) {
    out[0] = x;
    return;
  }
  g_autofree int64_t *sizes = g_new(int64_t, n);
  for (int j = 0; j < n; j++)
    sizes[j] = chunk;
  sim_zoo_split(g, name, x, 1, n, sizes, out);
}

static int concat_chunks(SimGraph *g, const char *name, int n, const int *xs)
{
  return n == 1 ? xs[0] : sim_graph_concat(g, name, 1, n, xs);
}

/* A stack of @layers LSTM layers over the @n chunks in @x (replaced by the top layer's
 * outputs).  @init_state[l], when not NULL, is the state layer l starts from (the
 * encoder's last chunk of the same layer, for a decoder). */
static void lstm_stack(SimGraph *g, const char *prefix, int layers, int n, int *x,
                       int64_t hidden, const int *init_state, int *last_state)
{
  SimZooName name;
  for (int l = 0; l < layers && sim_zoo_going(g); l++) {
    int state = init_state ? init_state[l] : -1;
    int first = -1;
    for (int j = 0; j < n; j++) {
      x[j] = lstm_chunk(g, sim_zoo_name(&name, "%s.lstm%d.chunk%d", prefix, l, j), x[j], state,
                        hidden);
      /* The chunks of a layer are one LSTM: they share its weights. */
      if (j == 0)
        first = x[0];
      else
        sim_zoo_share(g, x[j], first);
      state = x[j];
    }
    if (last_state)
      last_state[l] = state;
  }
}

static int chunk_count(const SimZooArgs *a, GError **error)
{
  if (!sim_zoo_check_divisible(a, "seq", "chunk", error))
    return -1;
  return (int)(sim_zoo_arg(a, "seq") / sim_zoo_arg(a, "chunk"));
}

static int int_input(SimGraph *g, const char *name, int64_t batch, int64_t seq)
{
  int64_t dims[] = { batch, seq };
  return sim_graph_input(g, name, SIM_DTYPE_INT32, 2, dims);
}

/* ---------------------------------------------------------------------------------- */
/* RNNTC: embedding, 4 LSTM layers, a dense softmax layer on the last step's state      */

static SimGraph *build_rnntc(const SimZooModel *model, const SimZooArgs *a, GError **error)
{
  int n = chunk_count(a, error);
  if (n < 0)
    return NULL;
  int64_t batch = sim_zoo_arg(a, "batch");
  int64_t seq = sim_zoo_arg(a, "seq");
  int64_t chunk = sim_zoo_arg(a, "chunk");
  int64_t hidden = sim_zoo_arg(a, "hidden");

  g_autoptr(SimGraph) g = sim_graph_new(model->name);
  sim_graph_set_tokens_per_sample(g, seq);
  int tokens = int_input(g, "tokens", batch, seq);
  int x = sim_graph_embedding(g, "embed", tokens, sim_zoo_arg(a, "vocab"), hidden);
  g_autofree int *chunks = g_new(int, n);
  split_chunks(g, "embed.chunks", x, n, chunk, chunks);
  lstm_stack(g, "encoder", sim_zoo_arg_int(a, "layers"), n, chunks, hidden, NULL, NULL);

  /* The classifier reads the state after the last step. */
  int last = chunks[n - 1];
  if (chunk > 1) {
    int64_t sizes[] = { chunk - 1, 1 };
    int parts[2] = { -1, -1 };
    sim_graph_split(g, "last_step", last, 1, 2, sizes, parts);
    last = parts[1];
  }
  int64_t flat[] = { batch, hidden };
  last = sim_graph_reshape(g, "last_step.flatten", last, 2, flat);
  x = sim_graph_linear(g, "classifier", last, sim_zoo_arg(a, "classes"), TRUE,
                       SIM_UNARY_IDENTITY);
  int64_t ldims[] = { batch };
  int labels = sim_graph_input(g, "labels", SIM_DTYPE_INT32, 1, ldims);
  sim_graph_cross_entropy(g, "loss", x, labels);
  return g_steal_pointer(&g);
}

/* ---------------------------------------------------------------------------------- */
/* RNNLM: embedding, 2 LSTM layers, a softmax over the vocabulary at every step         */

static SimGraph *build_rnnlm(const SimZooModel *model, const SimZooArgs *a, GError **error)
{
  int n = chunk_count(a, error);
  if (n < 0)
    return NULL;
  int64_t batch = sim_zoo_arg(a, "batch");
  int64_t seq = sim_zoo_arg(a, "seq");
  int64_t hidden = sim_zoo_arg(a, "hidden");
  int64_t vocab = sim_zoo_arg(a, "vocab");

  g_autoptr(SimGraph) g = sim_graph_new(model->name);
  sim_graph_set_tokens_per_sample(g, seq);
  int tokens = int_input(g, "tokens", batch, seq);
  int labels = int_input(g, "labels", batch, seq);
  int x = sim_graph_embedding(g, "embed", tokens, vocab, hidden);
  g_autofree int *chunks = g_new(int, n);
  split_chunks(g, "embed.chunks", x, n, sim_zoo_arg(a, "chunk"), chunks);
  lstm_stack(g, "decoder", sim_zoo_arg_int(a, "layers"), n, chunks, hidden, NULL, NULL);
  x = concat_chunks(g, "decoder.concat", n, chunks);
  x = sim_graph_linear(g, "lm_head", x, vocab, TRUE, SIM_UNARY_IDENTITY);
  sim_graph_cross_entropy(g, "loss", x, labels);
  return g_steal_pointer(&g);
}

/* ---------------------------------------------------------------------------------- */
/* NMT: LSTM encoder and decoder, attention of the decoder over the encoder, softmax     */

static SimGraph *build_nmt(const SimZooModel *model, const SimZooArgs *a, GError **error)
{
  int n = chunk_count(a, error);
  if (n < 0)
    return NULL;
  int64_t batch = sim_zoo_arg(a, "batch");
  int64_t seq = sim_zoo_arg(a, "seq");
  int64_t chunk = sim_zoo_arg(a, "chunk");
  int64_t hidden = sim_zoo_arg(a, "hidden");
  int64_t vocab = sim_zoo_arg(a, "vocab");
  int layers = sim_zoo_arg_int(a, "layers");

  g_autoptr(SimGraph) g = sim_graph_new(model->name);
  sim_graph_set_tokens_per_sample(g, seq);
  int src = int_input(g, "source", batch, seq);
  int tgt = int_input(g, "target", batch, seq);
  int labels = int_input(g, "labels", batch, seq);

  g_autofree int *enc = g_new(int, n);
  g_autofree int *dec = g_new(int, n);
  g_autofree int *enc_state = g_new(int, layers);
  int x = sim_graph_embedding(g, "encoder.embed", src, vocab, hidden);
  split_chunks(g, "encoder.chunks", x, n, chunk, enc);
  lstm_stack(g, "encoder", layers, n, enc, hidden, NULL, enc_state);
  int memory = concat_chunks(g, "encoder.concat", n, enc);

  /* The decoder's layers start from the encoder's final states (FlexFlow's nmt/rnn.cu
   * chains decoder chunk 0 of layer l to encoder chunk n-1 of layer l). */
  x = sim_graph_embedding(g, "decoder.embed", tgt, vocab, hidden);
  split_chunks(g, "decoder.chunks", x, n, chunk, dec);
  lstm_stack(g, "decoder", layers, n, dec, hidden, enc_state, NULL);
  x = concat_chunks(g, "decoder.concat", n, dec);

  /* Global attention (Luong et al. 2015) of every decoder state over the encoder's
   * states: one head as wide as the LSTM. */
  x = sim_graph_attention(g, "attention", x, memory, memory, 1, hidden, FALSE);
  x = sim_graph_linear(g, "lm_head", x, vocab, TRUE, SIM_UNARY_IDENTITY);
  sim_graph_cross_entropy(g, "loss", x, labels);
  return g_steal_pointer(&g);
}

/* ---------------------------------------------------------------------------------- */
/* GNMT v2 (Wu et al. 2016, as NVIDIA's DeepLearningExamples PyTorch/Translation/GNMT     */
/* trains it): 4 + 4 LSTM layers of 1024, the first encoder layer bidirectional, residual */
/* connections from the third layer on, attention after the first decoder layer         */

/* A layer of the stack over the whole sequence (cuDNN runs a layer's steps in one call),
 * with a residual connection from its input when @residual. */
static int gnmt_lstm(SimGraph *g, const char *name, int x, int64_t hidden, gboolean residual)
{
  SimZooName n;
  int y = sim_graph_dropout(g, sim_zoo_name(&n, "%s.dropout", name), x, 0.2);
  y = sim_graph_lstm(g, name, y, hidden);
  if (residual)
    y = sim_graph_binary(g, sim_zoo_name(&n, "%s.residual", name), x, y, SIM_BINARY_ADD);
  return y;
}

static SimGraph *build_gnmt(const SimZooModel *model, const SimZooArgs *a, GError **error)
{
  int64_t batch = sim_zoo_arg(a, "batch");
  int64_t seq = sim_zoo_arg(a, "seq");
  int64_t hidden = sim_zoo_arg(a, "hidden");
  int64_t vocab = sim_zoo_arg(a, "vocab");

  g_autoptr(SimGraph) g = sim_graph_new(model->name);
  /* Source and target tokens: the throughput DeepLearningExamples reports counts both. */
  sim_graph_set_tokens_per_sample(g, 2 * seq);
  int src = int_input(g, "source", batch, seq);
  int tgt = int_input(g, "target", batch, seq);
  int labels = int_input(g, "labels", batch, seq);

  /* Encoder: a bidirectional first layer (two LSTMs, one per direction, whose outputs
   * are concatenated), then three unidirectional ones. */
  int x = sim_graph_embedding(g, "encoder.embed", src, vocab, hidden);
  int table = x;
  int dirs[2];
  dirs[0] = gnmt_lstm(g, "encoder.lstm0.forward", x, hidden, FALSE);
  dirs[1] = gnmt_lstm(g, "encoder.lstm0.backward", x, hidden, FALSE);
  x = sim_graph_concat(g, "encoder.lstm0.concat", 2, 2, dirs);
  x = gnmt_lstm(g, "encoder.lstm1", x, hidden, FALSE);
  x = gnmt_lstm(g, "encoder.lstm2", x, hidden, TRUE);
  int memory = gnmt_lstm(g, "encoder.lstm3", x, hidden, TRUE);

  /* Decoder: the first layer, then attention of its outputs over the encoder's (the
   * normalized Bahdanau attention, here a one-head attention as wide as the LSTM: the
   * same projections and products over the same positions), whose context joins the
   * input of every further layer. */
  int y = sim_graph_embedding(g, "decoder.embed", tgt, vocab, hidden);
  sim_zoo_share(g, y, table);
  y = gnmt_lstm(g, "decoder.lstm0", y, hidden, FALSE);
  int context = sim_graph_attention(g, "decoder.attention", y, memory, memory, 1, hidden,
                                    FALSE);
  SimZooName n;
  for (int l = 1; l < 4 && sim_zoo_going(g); l++) {
    int parts[2] = { y, context };
    int in = sim_graph_concat(g, sim_zoo_name(&n, "decoder.lstm%d.input", l), 2, 2, parts);
    int out = gnmt_lstm(g, sim_zoo_name(&n, "decoder.lstm%d", l), in, hidden, FALSE);
    y = l >= 2 ? sim_graph_binary(g, sim_zoo_name(&n, "decoder.lstm%d.residual", l), y, out,
                                  SIM_BINARY_ADD)
               : out;
  }
  y = sim_graph_dropout(g, "classifier.dropout", y, 0.2);
  y = sim_graph_linear(g, "classifier", y, vocab, TRUE, SIM_UNARY_IDENTITY);
  sim_graph_cross_entropy(g, "loss", y, labels);
  return g_steal_pointer(&g);
}

/* ---------------------------------------------------------------------------------- */

/* The paper gives the layer counts; the widths, lengths and batch follow FlexFlow's NMT
 * code (nmt/nmt.cc: 64 sequences per worker, 2048-wide LSTMs and embeddings, a 20 k
 * vocabulary, chunks of 10 steps). */
static const SimModelParam rnntc_params[] = {
  { "batch", 64, "global batch size of one iteration (sequences)" },
  { "seq", 40, "sequence length (steps)" },
  { "chunk", 10, "steps per LSTM operator (must divide seq)" },
  { "layers", 4, "LSTM layers" },
  { "hidden", 1024, "LSTM and embedding width" },
  { "vocab", 20480, "vocabulary size" },
  { "classes", 2, "classes (Movie Reviews: positive, negative)" },
  { NULL, 0, NULL },
};

static const SimModelParam rnnlm_params[] = {
  { "batch", 64, "global batch size of one iteration (sequences)" },
  { "seq", 20, "sequence length (steps)" },
  { "chunk", 10, "steps per LSTM operator (must divide seq)" },
  { "layers", 2, "LSTM layers" },
  { "hidden", 2048, "LSTM and embedding width" },
  { "vocab", 10000, "vocabulary size (Penn Treebank: 10 k)" },
  { NULL, 0, NULL },
};

static const SimModelParam nmt_params[] = {
  { "batch", 64, "global batch size of one iteration (sentence pairs)" },
  { "seq", 40, "source and target length (steps)" },
  { "chunk", 10, "steps per LSTM operator (must divide seq)" },
  { "layers", 2, "LSTM layers of the encoder and of the decoder" },
  { "hidden", 2048, "LSTM and embedding width" },
  { "vocab", 20480, "source and target vocabulary size" },
  { NULL, 0, NULL },
};

/* DeepLearningExamples' GNMT: 128 sentence pairs per GPU, sentences of up to 50 tokens
 * (bucketed), a shared BPE vocabulary of 32,000 merges (32,320 entries, padded to a
 * multiple of 8 as its fp16 training pads it). */
static const SimModelParam gnmt_params[] = {
  { "batch", 128, "global batch size of one iteration (sentence pairs)" },
  { "seq", 50, "source and target length (steps)" },
  { "hidden", 1024, "LSTM and embedding width" },
  { "vocab", 32320, "shared source-target vocabulary" },
  { NULL, 0, NULL },
};

const SimZooModel sim_zoo_rnn_models[] = {
  { "rnntc", "FlexFlow's RNN text classifier: 4 LSTM layers of 1024, chunks of 10 steps",
    rnntc_params, build_rnntc },
  { "rnnlm", "FlexFlow's RNN language model: 2 LSTM layers of 2048, 10 k vocabulary",
    rnnlm_params, build_rnnlm },
  { "nmt", "FlexFlow's seq2seq NMT: 2+2 LSTM layers of 2048, attention, 20 k vocabulary",
    nmt_params, build_nmt },
  { "gnmt", "GNMT v2 as NVIDIA trains it: 4+4 LSTM layers of 1024, attention, 32 k vocabulary",
    gnmt_params, build_gnmt },
  { NULL, NULL, NULL, NULL },
};
