/* attention.c — multi-head attention with its four projections:
 *   Q = q Wq, K = k Wk, V = v Wv               (per head h: columns h*hd .. h*hd + hd)
 *   P = dropout(softmax(Q K^T / sqrt(hd) + mask))
 *   out = (P V) Wo
 * with q [b, sq, d], k and v [b, skv, d], Wq, Wk, Wv [d, heads*hd], Wo [heads*hd, d] and,
 * with "bias", their biases.
 *
 * Iteration dimensions: b (sample), s (attribute: query positions), h (parameter: heads),
 * e (the position inside a head, not split) and d (the model dimension, not split).  The
 * projection weights' head columns are h*hd + e.  The output is not indexed by h, so a
 * head-split leaves partial outputs that the lowering sums: Megatron's column-parallel
 * Q, K, V and row-parallel output projection.  k and v are indexed by b only: a shard of
 * query positions reads the whole key and value sequence (and recomputes their
 * projections), which is what splitting s costs.
 *
 * How the scores become the context depends on the framework (attribute "kernel"):
 * - "fused": one scale-mask-softmax kernel between two batched GEMMs; the scores and the
 *   probabilities are written to memory, and causal masks are priced as full score
 *   matrices, which is what such kernels compute.
 * - "unfused": PyTorch's eager path (scale, masked_fill, softmax in fp32 under autocast,
 *   dropout, casts), five kernels each way over the scores.
 * - "megatron": Megatron's choice, below.
 * - "flash": FlashAttention (Dao et al. 2022, Dao 2023): one kernel forward and one
 *   backward that stream blocks of keys and values through shared memory, never writing
 *   the scores; the backward recomputes them.  Memory holds only the output and the
 *   row statistics (log-sum-exp, fp32), so activation memory grows linearly with the
 *   sequence.  Its time comes from its tiles (sim/roofline.c); causal masks skip the
 *   blocks above the diagonal.
 *
 * With "megatron_softmax" set, the scale, mask and softmax run as Megatron's
 * FusedScaleMaskSoftmax runs them: one fused fp16 kernel each way where that kernel
 * applies (16 < skv <= 2048, query and key lengths multiples of 4, and the shard's batch
 * times heads a multiple of 4: is_kernel_available in megatron/model/fused_softmax.py),
 * and otherwise PyTorch's unfused path in fp32 (query-key layer scaling, on by default,
 * forces softmax_in_fp32): cast to fp32, scale, masked_fill, softmax, cast back, five
 * kernels forward and five backward.  Tensor parallelism over 8 GPUs with 16 heads and
 * micro-batches of 1 takes the unfused path.  Without the attribute the kernel is always
 * the fused one.  Biases are added in the GEMMs' epilogues and their gradients reduced there
 * (cuBLASLt), so they add no kernels.
 *
 * Grouped-query attention (Ainslie et al. 2023; LLaMA-2 70B, LLaMA-3, Mixtral): with
 * "kv_heads" below "heads", groups of G = heads / kv_heads query heads share one key and
 * value head, so Wk and Wv are [d, kv_heads*hd]; kv_heads 1 is multi-query attention
 * (Shazeer 2019).  The iteration dimension h then counts the key-value heads (a shard
 * holds whole groups, as Megatron-Core splits them), and a sixth dimension "q" (G*hd, not
 * split) indexes the query columns of a group: Wq's column is h*G*hd + q.
 *
 * "rotary" applies rotary position embeddings (Su et al. 2021) to Q and K after their
 * projections, pairing element i with i + hd/2 of each head (the rotate-half layout of
 * LLaMA's Hugging Face and Megatron code) at angle position * rotary_base^(-2i/hd): no
 * weights, one element-wise kernel each way. */
#include "../sim-private.h"

#include <string.h>

enum { A_HEADS, A_HEAD_DIM, A_CAUSAL, A_DROPOUT, A_BIAS, A_MEGATRON_SOFTMAX, A_KERNEL,
       A_KV_HEADS, A_ROTARY, A_ROTARY_BASE };

static const char *const kernel_names[] = { "fused", "unfused", "megatron", "flash", NULL };

const char *sim_attention_kernel_name(SimAttentionKernel k)
{
  g_return_val_if_fail(k >= 0 && k < SIM_ATTENTION_COUNT, "invalid");
  return kernel_names[k];
}

int sim_attention_kernel_from_name(const char *name)
{
  for (int k = 0; name && k < SIM_ATTENTION_COUNT; k++)
    if (!strcmp(name, kernel_names[k]))
      return k;
  return -1;
}

static const SimAttrSpec attrs[] = {
  [A_HEADS] = { "heads", SIM_ATTR_INT, 0, NULL, TRUE },
  [A_HEAD_DIM] = { "head_dim", SIM_ATTR_INT, 0, NULL, TRUE },
  [A_CAUSAL] = { "causal", SIM_ATTR_BOOL, 0, NULL, FALSE },
  /* Dropout of the attention probabilities. */
  [A_DROPOUT] = { "dropout", SIM_ATTR_FLOAT, 0.0, NULL, FALSE },
  /* GPT-2/3, BERT and Megatron have biases on all four projections. */
  [A_BIAS] = { "bias", SIM_ATTR_BOOL, 1, NULL, FALSE },
  /* Megatron's choice between its fused softmax kernel and the unfused fp32 path. */
  [A_MEGATRON_SOFTMAX] = { "megatron_softmax", SIM_ATTR_BOOL, 0, NULL, FALSE },
  /* The framework's attention kernels (see the top); megatron_softmax means "megatron". */
  [A_KERNEL] = { "kernel", SIM_ATTR_ENUM, SIM_ATTENTION_FUSED, kernel_names, FALSE },
  /* Key-value heads; 0: as many as query heads (see the top). */
  [A_KV_HEADS] = { "kv_heads", SIM_ATTR_INT, 0, NULL, FALSE },
  [A_ROTARY] = { "rotary", SIM_ATTR_BOOL, 0, NULL, FALSE },
  [A_ROTARY_BASE] = { "rotary_base", SIM_ATTR_FLOAT, 10000.0, NULL, FALSE },
};

/* Key-value heads of @op and query heads per key-value head. */
static int64_t kv_heads_of(const SimOp *op)
{
  int64_t kv = op->attrs[A_KV_HEADS].i[0];
  return kv > 0 ? kv : op->attrs[A_HEADS].i[0];
}

static int64_t group_of(const SimOp *op)
{
  return op->attrs[A_HEADS].i[0] / kv_heads_of(op);
}

enum { B, S, H, E, D, QG };

static gboolean infer(SimOp *op, GError **error)
{
  for (int i = 0; i < 3; i++)
    if (!sim_op_check_rank(op, i, 3, 3, error) || !sim_op_check_float(op, i, error))
      return FALSE;
  const SimShape *q = &op->in_shape[0], *k = &op->in_shape[1], *v = &op->in_shape[2];
  if (k->dims[0] != q->dims[0] || v->dims[0] != q->dims[0] || k->dims[1] != v->dims[1] ||
      k->dims[2] != q->dims[2] || v->dims[2] != q->dims[2]) {
    g_autofree char *sq = sim_shape_to_string(q);
    g_autofree char *sk = sim_shape_to_string(k);
    g_autofree char *sv = sim_shape_to_string(v);
    sim_op_set_error(op, error, SIM_ERROR_INVALID,
                     "q %s, k %s and v %s: expected q [b, sq, d] and k, v [b, skv, d]", sq, sk,
                     sv);
    return FALSE;
  }
  int64_t heads = op->attrs[A_HEADS].i[0], hd = op->attrs[A_HEAD_DIM].i[0];
  double p = op->attrs[A_DROPOUT].f;
  if (heads < 1 || hd < 1) {
    sim_op_set_error(op, error, SIM_ERROR_INVALID,
                     "%" G_GINT64_FORMAT " heads of dimension %" G_GINT64_FORMAT
                     ": both must be positive",
                     heads, hd);
    return FALSE;
  }
  int64_t kvh = op->attrs[A_KV_HEADS].i[0];
  if (kvh < 0 || (kvh > 0 && heads % kvh != 0)) {
    sim_op_set_error(op, error, SIM_ERROR_INVALID,
                     "%" G_GINT64_FORMAT " key-value heads for %" G_GINT64_FORMAT
                     " heads: kv_heads must divide heads (0: as many as heads)", kvh, heads);
    return FALSE;
  }
  if (op->attrs[A_ROTARY].i[0] && (hd % 2 != 0 || !(op->attrs[A_ROTARY_BASE].f > 1.0))) {
    sim_op_set_error(op, error, SIM_ERROR_INVALID,
                     "rotary embeddings need an even head_dim (%" G_GINT64_FORMAT
                     ") and a rotary_base above 1 (%g)", hd, op->attrs[A_ROTARY_BASE].f);
    return FALSE;
  }
  if (!(p >= 0.0 && p < 1.0)) {
    sim_op_set_error(op, error, SIM_ERROR_INVALID, "the dropout probability %g is outside "
                     "[0, 1)", p);
    return FALSE;
  }
  int64_t dm = q->dims[2], inner = heads * hd, kv_inner = kv_heads_of(op) * hd;
  sim_op_set_n_outputs(op, 1);
  op->out_shape[0] = *q;
  op->out_dtype[0] = op->in_dtype[0];
  gboolean bias = op->attrs[A_BIAS].i[0] != 0;
  op->n_weights = bias ? 8 : 4;
  for (int i = 0; i < 3; i++) {
    int64_t cols = i == 0 ? inner : kv_inner;
    op->w_shape[i] = sim_shape_make(2, (int64_t[]){ dm, cols });
    op->w_shape[4 + i] = sim_shape_make(1, &cols);
  }
  op->w_shape[3] = sim_shape_make(2, (int64_t[]){ inner, dm });
  op->w_shape[7] = sim_shape_make(1, &dm);
  op->w_dtype = op->in_dtype[0];
  return TRUE;
}

static void space(SimOp *op)
{
  const SimShape *q = &op->in_shape[0];
  int hd = (int)op->attrs[A_HEAD_DIM].i[0];
  int G = (int)group_of(op);
  sim_space_init(op, G > 1 ? 6 : 5);
  sim_space_dim(op, B, "b", SIM_ROLE_SAMPLE, q->dims[0], TRUE);
  sim_space_dim(op, S, "s", SIM_ROLE_ATTRIBUTE, q->dims[1], TRUE);
  sim_space_dim(op, H, "h", SIM_ROLE_PARAMETER, kv_heads_of(op), TRUE);
  sim_space_dim(op, E, "e", SIM_ROLE_PARAMETER, hd, FALSE);
  /* Contracted by the input projections, produced by the output projection; never split
   * (a d-split of the projections would be another operator). */
  sim_space_dim(op, D, "d", SIM_ROLE_REDUCTION, q->dims[2], FALSE);
  /* The query columns of one key-value group: Wq's, bq's and Wo's rows are h*G*hd + q. */
  int qd = G > 1 ? QG : E, qs = G * hd;
  if (G > 1)
    sim_space_dim(op, QG, "q", SIM_ROLE_PARAMETER, qs, FALSE);
  SimTensorMap *m = op->space.maps;
  sim_map_identity(&m[0], 0, B);
  sim_map_identity(&m[0], 1, S);
  sim_map_identity(&m[0], 2, D);
  for (int i = 1; i < 3; i++) {
    sim_map_identity(&m[i], 0, B);
    sim_map_identity(&m[i], 2, D);
  }
  SimTensorMap *w = &m[3];
  for (int i = 0; i < 3; i++) {
    sim_map_identity(&w[i], 0, D);
    if (i == 0)
      sim_map_affine(&w[i], 1, H, qs, qd, 1, 0);
    else
      sim_map_affine(&w[i], 1, H, hd, E, 1, 0);
  }
  sim_map_affine(&w[3], 0, H, qs, qd, 1, 0);
  sim_map_identity(&w[3], 1, D);
  if (op->n_weights == 8) {
    sim_map_affine(&w[4], 0, H, qs, qd, 1, 0);
    for (int i = 5; i < 7; i++)
      sim_map_affine(&w[i], 0, H, hd, E, 1, 0);
    sim_map_identity(&w[7], 0, D);
  }
  SimTensorMap *y = &m[3 + op->n_weights];
  sim_map_identity(y, 0, B);
  sim_map_identity(y, 1, S);
  sim_map_identity(y, 2, D);
}

/* The sizes one shard works with. */
typedef struct {
  int64_t b, s, skv, heads, hd, d, inner;
  int64_t kv_inner;   /* columns of K and V: key-value heads times hd */
  double scores;   /* elements of the score matrices: b * heads * s * skv */
  double p;        /* dropout probability */
  gboolean fused;  /* self-attention over the whole sequence: one QKV GEMM */
  gboolean kv_same;
  gboolean unfused_softmax; /* the five-kernel path over the scores (see the top) */
  gboolean flash;
  gboolean causal;
  gboolean rotary;
} Shard;

static SimAttentionKernel kernel_of(const SimOp *op)
{
  SimAttentionKernel k = (SimAttentionKernel)op->attrs[A_KERNEL].i[0];
  if (k == SIM_ATTENTION_FUSED && op->attrs[A_MEGATRON_SOFTMAX].i[0])
    k = SIM_ATTENTION_MEGATRON;
  return k;
}

static Shard shard(const SimOp *op, const int64_t *e)
{
  Shard x = {
    .b = e[B],
    .s = e[S],
    .skv = op->in_shape[1].dims[1],
    .heads = e[H] * group_of(op),
    .hd = e[E],
    .d = e[D],
    .p = op->attrs[A_DROPOUT].f,
  };
  x.inner = x.heads * x.hd;
  x.kv_inner = e[H] * x.hd;
  x.rotary = op->attrs[A_ROTARY].i[0] != 0;
  x.scores = (double)x.b * x.heads * x.s * x.skv;
  x.kv_same = op->inputs[1] == op->inputs[2];
  x.fused = x.kv_same && op->inputs[0] == op->inputs[1] && x.s == x.skv &&
            x.s == op->in_shape[0].dims[1];
  x.causal = op->attrs[A_CAUSAL].i[0] != 0;
  switch (kernel_of(op)) {
  case SIM_ATTENTION_MEGATRON:
    if (sim_dtype_size(op->w_dtype) == 2)
      x.unfused_softmax = !(x.skv > 16 && x.skv <= 2048 && x.s % 4 == 0 && x.skv % 4 == 0 &&
                            (x.b * x.heads) % 4 == 0);
    break;
  case SIM_ATTENTION_UNFUSED:
    x.unfused_softmax = TRUE;
    break;
  case SIM_ATTENTION_FLASH:
    x.flash = TRUE;
    break;
  case SIM_ATTENTION_FUSED:
  case SIM_ATTENTION_COUNT:
    break;
  }
  return x;
}

/* Scores Q K^T, softmax with scale and mask, dropout, context P V: the part that
 * selective recomputation recomputes. */
/* FlashAttention's kernel over the shard: 4 b h s skv hd FLOPs forward (Q K^T and P V,
 * counted whole as frameworks count them; the tiles skip what a causal mask hides), 2.5
 * times that backward; reads Q, K, V (and forward writes O and the fp32 row statistics;
 * backward reads O, dO and the statistics and writes dQ, dK, dV). */
static SimKernel flash_kernel(const SimOp *op, const Shard *x, gboolean backward)
{
  SimDType dt = op->w_dtype;
  double es = sim_dtype_size(dt);
  double q = (double)x->b * x->s * x->inner, kv = (double)x->b * x->skv * x->kv_inner;
  double stats = (double)x->b * x->heads * x->s * 4;
  SimKernel k = {
    .kind = SIM_KERNEL_ATTENTION,
    .dtype = dt,
    .m = x->s,
    .n = x->skv,
    .k = x->hd,
    .batch = x->b * x->heads,
    .steps = 1,
    .flops = 4.0 * x->scores * x->hd * (backward ? 2.5 : 1.0),
    .bytes = backward ? (3 * q + 2 * kv) * es + stats + (q + 2 * kv) * es
                      : (q + 2 * kv + q) * es + stats,
    .flags = (x->causal ? SIM_KERNEL_CAUSAL : 0) | (backward ? SIM_KERNEL_BACKWARD : 0),
  };
  return k;
}

static void core_forward(const SimOp *op, const Shard *x, SimWork *w)
{
  SimDType dt = op->w_dtype;
  double es = sim_dtype_size(dt);
  if (x->flash) {
    sim_work_add(w, flash_kernel(op, x, FALSE));
    return;
  }
  sim_work_add(w, sim_kernel_gemm(dt, x->b * x->heads, x->s, x->skv, x->hd));
  if (x->unfused_softmax) {
    /* fp16 to fp32, scale, masked_fill (reading the [b, 1, s, skv] mask), softmax
     * (row max, subtract, exp, sum, divide), fp32 to fp16. */
    double n = x->scores;
    sim_work_add(w, sim_kernel_memory(dt, n, n * (es + 4)));
    sim_work_add(w, sim_kernel_memory(SIM_DTYPE_FP32, n, 8 * n));
    sim_work_add(w, sim_kernel_memory(SIM_DTYPE_FP32, n, 8 * n + n / (double)x->heads));
    sim_work_add(w, sim_kernel_memory(SIM_DTYPE_FP32, 8 * n, 8 * n));
    sim_work_add(w, sim_kernel_memory(dt, n, n * (4 + es)));
  } else {
    /* Scale, mask, row max, subtract, exp (4), sum, divide: 10 per score. */
    sim_work_add(w, sim_kernel_memory(dt, 10 * x->scores, 2 * x->scores * es));
  }
  if (x->p > 0)
    sim_work_add(w, sim_kernel_memory(dt, 3 * x->scores, 2 * x->scores * es + x->scores));
  sim_work_add(w, sim_kernel_gemm(dt, x->b * x->heads, x->s, x->hd, x->skv));
}

/* The backward of the core: from d context to dQ, dK and dV. */
static void core_backward(const SimOp *op, const Shard *x, SimWork *w)
{
  SimDType dt = op->w_dtype;
  double es = sim_dtype_size(dt);
  int64_t bh = x->b * x->heads;
  if (x->flash) {
    /* FlashAttention-2's backward: the row sums of dO * O first, then the fused kernel,
     * whose dQ accumulates in fp32 and is converted after it. */
    double q = (double)x->b * x->s * x->inner;
    sim_work_add(w, sim_kernel_memory(dt, 2 * q, 2 * q * es + (double)bh * x->s * 4));
    sim_work_add(w, flash_kernel(op, x, TRUE));
    sim_work_add(w, sim_kernel_memory(dt, q, q * (4 + es)));
    return;
  }
  sim_work_add(w, sim_kernel_gemm(dt, bh, x->s, x->skv, x->hd));     /* d P */
  sim_work_add(w, sim_kernel_gemm(dt, bh, x->skv, x->hd, x->s));     /* d V */
  /* Dropout backward reads dP and the mask; softmax backward reads P and dP. */
  if (x->p > 0)
    sim_work_add(w, sim_kernel_memory(dt, x->scores, 2 * x->scores * es + x->scores));
  if (x->unfused_softmax) {
    /* Autograd through the five forward kernels: the cast's gradient to fp32, softmax
     * backward (reads P and dP, writes dS), masked_fill's (zeroes the masked scores),
     * the scale's, and the cast back to fp16. */
    double n = x->scores;
    sim_work_add(w, sim_kernel_memory(dt, n, n * (es + 4)));
    sim_work_add(w, sim_kernel_memory(SIM_DTYPE_FP32, 5 * n, 12 * n));
    sim_work_add(w, sim_kernel_memory(SIM_DTYPE_FP32, n, 8 * n + n / (double)x->heads));
    sim_work_add(w, sim_kernel_memory(SIM_DTYPE_FP32, n, 8 * n));
    sim_work_add(w, sim_kernel_memory(dt, n, n * (4 + es)));
  } else {
    sim_work_add(w, sim_kernel_memory(dt, 5 * x->scores, 3 * x->scores * es));
  }
  sim_work_add(w, sim_kernel_gemm(dt, bh, x->s, x->hd, x->skv));     /* d Q */
  sim_work_add(w, sim_kernel_gemm(dt, bh, x->skv, x->hd, x->s));     /* d K */
}

static void work(const SimOp *op, const int64_t *e, SimPass pass, SimWork *w)
{
  Shard x = shard(op, e);
  SimDType dt = op->w_dtype;
  int64_t bs = x.b * x.s, bkv = x.b * x.skv;
  int64_t kvi = x.kv_inner;
  /* Rotary embeddings: a rotation of every element of Q and K (4 operations with the
   * table's cosine and sine), reading and writing both; backward the inverse rotation. */
  double rot = (double)bs * x.inner + (double)bkv * kvi;
  SimKernel rope = sim_kernel_memory(dt, 4 * rot, 2 * rot * sim_dtype_size(dt) +
                                                    (double)x.skv * x.hd * 4);
  if (pass == SIM_PASS_FORWARD) {
    /* Self-attention projects q, k and v with one [d, inner + 2 kv_inner] GEMM;
     * otherwise q alone and k, v together (one GEMM when they are one tensor, else a batch
     * of two). */
    if (x.fused) {
      sim_work_add(w, sim_kernel_gemm(dt, 1, bs, x.inner + 2 * kvi, x.d));
    } else {
      sim_work_add(w, sim_kernel_gemm(dt, 1, bs, x.inner, x.d));
      if (x.kv_same)
        sim_work_add(w, sim_kernel_gemm(dt, 1, bkv, 2 * kvi, x.d));
      else
        sim_work_add(w, sim_kernel_gemm(dt, 2, bkv, kvi, x.d));
    }
    if (x.rotary)
      sim_work_add(w, rope);
    core_forward(op, &x, w);
    sim_work_add(w, sim_kernel_gemm(dt, 1, bs, x.d, x.inner));
    return;
  }
  /* Every GEMM C = A B of the forward becomes dA = dC B^T and dB = A^T dC. */
  sim_work_add(w, sim_kernel_gemm(dt, 1, bs, x.inner, x.d));        /* d context   */
  sim_work_add(w, sim_kernel_gemm(dt, 1, x.inner, x.d, bs));        /* d Wo        */
  core_backward(op, &x, w);
  if (x.rotary)
    sim_work_add(w, rope);
  if (x.fused) {
    sim_work_add(w, sim_kernel_gemm(dt, 1, bs, x.d, x.inner + 2 * kvi));  /* d x    */
    sim_work_add(w, sim_kernel_gemm(dt, 1, x.d, x.inner + 2 * kvi, bs));  /* d Wqkv */
    return;
  }
  sim_work_add(w, sim_kernel_gemm(dt, 1, bs, x.d, x.inner));        /* d q         */
  sim_work_add(w, sim_kernel_gemm(dt, 1, x.d, x.inner, bs));        /* d Wq        */
  if (x.kv_same) {
    sim_work_add(w, sim_kernel_gemm(dt, 1, bkv, x.d, 2 * kvi)); /* d kv        */
    sim_work_add(w, sim_kernel_gemm(dt, 1, x.d, 2 * kvi, bkv)); /* d Wk, d Wv  */
  } else {
    sim_work_add(w, sim_kernel_gemm(dt, 2, bkv, x.d, kvi));
    sim_work_add(w, sim_kernel_gemm(dt, 2, x.d, kvi, bkv));
  }
}

/* Bytes kept for backward besides the core's scores: the distinct inputs, Q, K, V and the
 * context (the input of the output projection). */
static int64_t kept_outside_core(const SimOp *op, const Shard *x)
{
  int64_t es = sim_dtype_size(op->w_dtype);
  int64_t inputs = x->b * x->s * x->d;
  if (op->inputs[1] != op->inputs[0])
    inputs += x->b * x->skv * x->d;
  if (op->inputs[2] != op->inputs[0] && op->inputs[2] != op->inputs[1])
    inputs += x->b * x->skv * x->d;
  int64_t qkv = x->b * x->s * x->inner + 2 * x->b * x->skv * x->kv_inner;
  int64_t context = x->b * x->s * x->inner;
  return (inputs + qkv + context) * es;
}

static int64_t saved_bytes(const SimOp *op, const int64_t *extent)
{
  int64_t full[SIM_MAX_ITER];
  Shard x = shard(op, sim_op_extent(op, extent, full));
  int64_t es = sim_dtype_size(op->w_dtype);
  int64_t scores = (int64_t)x.scores;
  /* Korthikanti et al. 2022, section 4.1: besides the inputs, Q, K, V and the context,
   * the softmax output (2as^2b in fp16), the dropout mask (as^2b) and the dropout output
   * the P V product reads (2as^2b). */
  if (x.flash) /* the output and its fp32 row statistics (log-sum-exp) */
    return kept_outside_core(op, &x) + x.b * x.s * x.inner * es + x.b * x.heads * x.s * 4;
  int64_t core = scores * (x.unfused_softmax ? 4 : es); /* the fp32 path keeps fp32 P */
  if (x.p > 0)
    core += scores + scores * es;
  return kept_outside_core(op, &x) + core;
}

static void selective(const SimOp *op, const int64_t *extent, SimWork *recompute,
                      int64_t *kept_bytes)
{
  int64_t full[SIM_MAX_ITER];
  Shard x = shard(op, sim_op_extent(op, extent, full));
  /* Selective recomputation (Korthikanti et al. 2022) drops the score-sized tensors and
   * recomputes Q K^T, softmax, dropout and P V from the kept Q, K, V before backward. */
  recompute->n = 0;
  core_forward(op, &x, recompute);
  *kept_bytes = kept_outside_core(op, &x);
}

const SimOpClass sim_op_attention_class = {
  .type = SIM_OP_ATTENTION,
  .name = "attention",
  .description = "multi-head attention with its Q, K, V and output projections",
  .attrs = attrs,
  .n_attrs = G_N_ELEMENTS(attrs),
  .min_inputs = 3,
  .max_inputs = 3,
  .infer = infer,
  .space = space,
  .work = work,
  .saved_bytes = saved_bytes,
  .selective = selective,
};
