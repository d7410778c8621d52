/* test-gpu.c — the CUDA parts against the CPU reference, on a GPU (suite "gpu").
 *
 * Every test skips when no GPU is usable, so the suite passes without one and checks
 * everything with one (exec/device-check.sh runs it on the lent machine):
 * - each operator of the catalogue, forward and backward, on the "cuda" back end against
 *   the "cpu" back end on the same inputs, whole and sharded (split reductions, halos,
 *   split heads, split classes with their statistics; RMS norm, gated MLPs,
 *   grouped-query attention with rotary embeddings, the mixture of experts over split
 *   experts and widths): relative error below 1e-4;
 * - training steps of small models on one device, and a data-parallel plan and
 *   context-parallel ones (ring attention) emulated on one GPU, against the CPU reference;
 * - the profiler's CUDA runner and, with two GPUs or more, NCCL collectives. */
#ifdef PARASOL_INPROC_TESTS
#include "inproc-tests.h"
#else
#include <criterion/criterion.h>
#endif
#include <math.h>
#include <string.h>

#include "cuda-desc.h"
#include "parasol-exec.h"
#include "parasol-profile.h"

#define TOL 1e-4

/* Skips the test when no GPU is usable; the reason is printed once. */
static void need_gpu(void)
{
  static int state = -1;
  static char why[1024];
  if (state < 0) {
    int n = pcu_device_count(why, sizeof why);
    state = n > 0;
    if (n == 0)
      g_strlcpy(why, "no GPU present", sizeof why);
  }
  if (!state)
    cr_skip_test("no usable GPU: %s", why);
}

static ExecBackend *backend(const char *name)
{
  GError *error = NULL;
  ExecBackend *b = exec_backend_new(name, &error);
  cr_assert_not_null(b, "%s", error ? error->message : "");
  cr_assert(exec_backend_open(b, 1, &error), "%s", error ? error->message : "");
  return b;
}

/* ---------------------------------------------------------------------------------- */
/* One operator call on both back ends                                                 */

/* Host data of one tensor of the call: its region and values (fp32 or int64). */
typedef struct {
  SimRegion r;
  SimDType dt;
  int64_t n;
  void *data;
} Host;

/* An operator call: the shard, and the host data of every tensor. */
typedef struct {
  const SimGraph *g;
  int op;
  int64_t lo[EXEC_MAX_ITER], hi[EXEC_MAX_ITER];
  gboolean accumulate;
  int n_in, n_w, n_out;
  Host in[8], w[8], out[4], dout[4];
} Call;

/* What a back end computed: outputs, and the gradients of inputs and weights. */
typedef struct {
  float *out[4];
  float *din[8];
  float *dw[8];
} Result;

static uint64_t mix(uint64_t z)
{
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/* Values in [-1, 1), or integers in [0, range). */
static void fill_host(Host *h, uint64_t seed, int64_t range)
{
  h->n = sim_region_volume(&h->r);
  if (h->dt == SIM_DTYPE_INT64) {
    int64_t *p = g_new(int64_t, MAX(h->n, 1));
    for (int64_t i = 0; i < h->n; i++)
      p[i] = (int64_t)(mix(seed * 1000003 + (uint64_t)i) % (uint64_t)MAX(range, 1));
    h->data = p;
  } else {
    float *p = g_new(float, MAX(h->n, 1));
    for (int64_t i = 0; i < h->n; i++)
      p[i] = (float)((double)(mix(seed * 1000003 + (uint64_t)i) >> 11) / 4503599627370496.0 - 1.0);
    h->data = p;
  }
}

static int64_t int_range(const SimGraph *g, int op, int i)
{
  g_autoptr(SimAttrs) at = sim_graph_op_attrs(g, op);
  int64_t v = 2;
  if (sim_graph_op_type(g, op) == SIM_OP_EMBEDDING)
    sim_attrs_get_int(at, "vocab", &v);
  if (sim_graph_op_type(g, op) == SIM_OP_CROSS_ENTROPY && i == 1) {
    SimShape s = sim_graph_tensor_shape(g, sim_graph_op_input(g, op, 0));
    v = s.dims[s.ndim - 1];
  }
  return v;
}

/* Prepares the call of @op on the shard [lo, hi) (NULL: whole), with fresh data. */
static void call_init(Call *c, const SimGraph *g, int op, const int64_t *lo, const int64_t *hi)
{
  memset(c, 0, sizeof *c);
  c->g = g;
  c->op = op;
  int nd = sim_graph_op_n_dims(g, op);
  for (int d = 0; d < nd; d++) {
    c->lo[d] = lo ? lo[d] : 0;
    c->hi[d] = hi ? hi[d] : sim_graph_op_dim_size(g, op, d);
  }
  c->accumulate = pcu_desc_splits_reduction(g, op, c->lo, c->hi);
  c->n_in = sim_graph_op_n_inputs(g, op);
  c->n_w = sim_graph_op_n_weights(g, op);
  c->n_out = sim_graph_op_n_outputs(g, op);
  uint64_t seed = pcu_name_hash(sim_graph_op_name(g, op));
  for (int i = 0; i < c->n_in; i++) {
    SimDType t = sim_graph_tensor_dtype(g, sim_graph_op_input(g, op, i));
    c->in[i].dt = t == SIM_DTYPE_INT32 || t == SIM_DTYPE_INT64 ? SIM_DTYPE_INT64 : SIM_DTYPE_FP32;
    sim_graph_op_shard_region(g, op, SIM_TENSOR_INPUT, i, c->lo, c->hi, &c->in[i].r);
    fill_host(&c->in[i], seed + (uint64_t)i, int_range(g, op, i));
  }
  for (int i = 0; i < c->n_w; i++) {
    c->w[i].dt = SIM_DTYPE_FP32;
    sim_graph_op_shard_region(g, op, SIM_TENSOR_WEIGHT, i, c->lo, c->hi, &c->w[i].r);
    fill_host(&c->w[i], seed + 100 + (uint64_t)i, 0);
  }
  for (int i = 0; i < c->n_out; i++) {
    c->out[i].dt = c->dout[i].dt = SIM_DTYPE_FP32;
    sim_graph_op_shard_region(g, op, SIM_TENSOR_OUTPUT, i, c->lo, c->hi, &c->out[i].r);
    c->dout[i].r = c->out[i].r;
    fill_host(&c->dout[i], seed + 200 + (uint64_t)i, 0);
    c->out[i].n = c->dout[i].n;
  }
}

static void call_clear(Call *c)
{
  for (int i = 0; i < 8; i++) {
    g_free(c->in[i].data);
    g_free(c->w[i].data);
  }
  for (int i = 0; i < 4; i++)
    g_free(c->dout[i].data);
}

static void result_clear(Result *r)
{
  for (int i = 0; i < 4; i++)
    g_free(r->out[i]);
  for (int i = 0; i < 8; i++) {
    g_free(r->din[i]);
    g_free(r->dw[i]);
  }
}

/* Buffers of one back end for one call. */
typedef struct {
  ExecBackend *b;
  GPtrArray *bufs;
} Side;

static ExecView side_view(Side *s, const Host *h, gboolean with_data)
{
  size_t es = h->dt == SIM_DTYPE_INT64 ? 8 : 4;
  GError *error = NULL;
  ExecBuffer *buf = exec_backend_buffer_alloc(s->b, 0, (size_t)MAX(h->n, 1) * es, &error);
  cr_assert_not_null(buf, "%s", error ? error->message : "");
  g_ptr_array_add(s->bufs, buf);
  if (with_data && h->data)
    cr_assert(exec_backend_buffer_write(s->b, 0, buf, 0, h->data, (size_t)h->n * es, &error),
              "%s", error ? error->message : "");
  return exec_view_dense(buf, h->dt, &h->r);
}

static float *read_view(Side *s, const ExecView *v, int64_t n)
{
  float *out = g_new0(float, MAX(n, 1));
  GError *error = NULL;
  cr_assert(exec_backend_buffer_read(s->b, 0, v->buffer, 0, out, (size_t)n * sizeof(float),
                                     &error), "%s", error ? error->message : "");
  return out;
}

/* Runs forward then backward of the call on @b and reads back what they wrote. */
static void run_call(ExecBackend *b, Call *c, Result *res)
{
  Side s = { b, g_ptr_array_new() };
  ExecView in[8], din[8], w[8], dw[8], out[4], dout[4];
  for (int i = 0; i < c->n_in; i++) {
    in[i] = side_view(&s, &c->in[i], TRUE);
    if (c->in[i].dt == SIM_DTYPE_FP32) {
      Host h = c->in[i];
      h.data = NULL;
      din[i] = side_view(&s, &h, FALSE);
    } else {
      din[i] = exec_view_dense(NULL, SIM_DTYPE_FP32, &c->in[i].r);
    }
  }
  for (int i = 0; i < c->n_w; i++) {
    w[i] = side_view(&s, &c->w[i], TRUE);
    Host h = c->w[i];
    h.data = NULL;
    dw[i] = side_view(&s, &h, FALSE);
  }
  for (int i = 0; i < c->n_out; i++) {
    out[i] = side_view(&s, &c->out[i], FALSE);
    dout[i] = side_view(&s, &c->dout[i], TRUE);
  }
  gpointer saved = NULL;
  ExecKernelArgs a = {
    .graph = c->g,
    .op = c->op,
    .phase = EXEC_KERNEL_FORWARD,
    .step = 1,
    .batch = sim_graph_batch_size(c->g),
    .microbatches = 1,
    .accumulate = c->accumulate,
    .n_inputs = c->n_in,
    .in = in,
    .in_grad = din,
    .n_weights = c->n_w,
    .w = w,
    .w_grad = dw,
    .n_outputs = c->n_out,
    .out = out,
    .out_grad = dout,
    .saved = &saved,
  };
  memcpy(a.lo, c->lo, sizeof a.lo);
  memcpy(a.hi, c->hi, sizeof a.hi);
  GError *error = NULL;
  cr_assert(exec_backend_kernel(b, 0, &a, &error), "%s forward on %s: %s",
            sim_graph_op_name(c->g, c->op), exec_backend_get_name(b),
            error ? error->message : "");
  for (int i = 0; i < c->n_out; i++)
    res->out[i] = read_view(&s, &out[i], c->out[i].n);
  a.phase = EXEC_KERNEL_BACKWARD;
  cr_assert(exec_backend_kernel(b, 0, &a, &error), "%s backward on %s: %s",
            sim_graph_op_name(c->g, c->op), exec_backend_get_name(b),
            error ? error->message : "");
  for (int i = 0; i < c->n_in; i++)
    if (din[i].buffer)
      res->din[i] = read_view(&s, &din[i], c->in[i].n);
  for (int i = 0; i < c->n_w; i++)
    res->dw[i] = read_view(&s, &dw[i], c->w[i].n);
  exec_backend_saved_free(b, 0, saved);
  for (guint i = 0; i < s.bufs->len; i++)
    exec_backend_buffer_free(b, 0, s.bufs->pdata[i]);
  g_ptr_array_unref(s.bufs);
}

/* max |a - b| / max |b|, with NaN as infinitely wrong. */
static double rel_error(const float *a, const float *b, int64_t n)
{
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    if (isnan(a[i]) != isnan(b[i]))
      return INFINITY;
    num = MAX(num, fabs((double)a[i] - (double)b[i]));
    den = MAX(den, fabs((double)b[i]));
  }
  return den > 0 ? num / den : num;
}

static void compare(const Call *c, const Result *gpu, const Result *cpu, const char *what)
{
  const char *name = sim_graph_op_name(c->g, c->op);
  for (int i = 0; i < c->n_out; i++) {
    double e = rel_error(gpu->out[i], cpu->out[i], c->out[i].n);
    cr_expect_leq(e, TOL, "%s %s: output %d differs by %g", name, what, i, e);
  }
  for (int i = 0; i < c->n_in; i++)
    if (cpu->din[i]) {
      double e = rel_error(gpu->din[i], cpu->din[i], c->in[i].n);
      cr_expect_leq(e, TOL, "%s %s: input gradient %d differs by %g", name, what, i, e);
    }
  /* Weight gradients relative to the largest of the op's: attention's key bias has an
   * exact gradient of zero, and its computed one is rounding noise on both back ends,
   * whose difference relative to itself means nothing. */
  double scale = 0;
  for (int i = 0; i < c->n_w; i++)
    for (int64_t k = 0; k < c->w[i].n; k++)
      scale = MAX(scale, fabs((double)cpu->dw[i][k]));
  for (int i = 0; i < c->n_w; i++) {
    double e = rel_error(gpu->dw[i], cpu->dw[i], c->w[i].n);
    double own = 0;
    for (int64_t k = 0; k < c->w[i].n; k++)
      own = MAX(own, fabs((double)cpu->dw[i][k]));
    if (own > 0 && scale > own)
      e *= own / scale;
    cr_expect_leq(e, TOL, "%s %s: weight gradient %d differs by %g of the op's largest", name,
                  what, i, e);
  }
}

/* Every op of @g (but inputs) whole, on both back ends. */
static void check_graph(SimGraph *g)
{
  g_autoptr(ExecBackend) cpu = backend("cpu");
  g_autoptr(ExecBackend) cuda = backend("cuda");
  for (int op = 0; op < sim_graph_n_ops(g); op++) {
    if (sim_graph_op_type(g, op) == SIM_OP_INPUT)
      continue;
    Call c;
    call_init(&c, g, op, NULL, NULL);
    Result rc = { 0 }, rg = { 0 };
    run_call(cpu, &c, &rc);
    run_call(cuda, &c, &rg);
    compare(&c, &rg, &rc, "(whole)");
    result_clear(&rc);
    result_clear(&rg);
    call_clear(&c);
  }
}

/* The shard of op @name with dimension @dim cut to [lo, hi). */
static void check_shard(SimGraph *g, const char *name, const char *dim, int64_t lo, int64_t hi)
{
  g_autoptr(ExecBackend) cpu = backend("cpu");
  g_autoptr(ExecBackend) cuda = backend("cuda");
  int op = sim_graph_op_by_name(g, name);
  cr_assert_geq(op, 0, "no op %s", name);
  int64_t l[EXEC_MAX_ITER] = { 0 }, h[EXEC_MAX_ITER] = { 0 };
  int found = -1;
  for (int d = 0; d < sim_graph_op_n_dims(g, op); d++) {
    h[d] = sim_graph_op_dim_size(g, op, d);
    if (!strcmp(sim_graph_op_dim_name(g, op, d), dim))
      found = d;
  }
  cr_assert_geq(found, 0, "%s has no dimension %s", name, dim);
  l[found] = lo;
  h[found] = hi;
  Call c;
  call_init(&c, g, op, l, h);
  Result rc = { 0 }, rg = { 0 };
  run_call(cpu, &c, &rc);
  run_call(cuda, &c, &rg);
  g_autofree char *what = g_strdup_printf("(%s in [%" G_GINT64_FORMAT ", %" G_GINT64_FORMAT "))",
                                          dim, lo, hi);
  compare(&c, &rg, &rc, what);
  result_clear(&rc);
  result_clear(&rg);
  call_clear(&c);
}

/* ---------------------------------------------------------------------------------- */
/* Graphs with every operator                                                          */

static SimGraph *dense_graph(void)
{
  SimGraph *g = sim_graph_new("dense");
  int x = sim_graph_input(g, "x", SIM_DTYPE_FP32, 3, (int64_t[]){ 4, 6, 24 });
  int h = sim_graph_linear(g, "fc_gelu", x, 32, TRUE, SIM_UNARY_GELU);
  int k = sim_graph_linear(g, "fc_plain", h, 24, TRUE, SIM_UNARY_IDENTITY);
  int r = sim_graph_binary(g, "residual", k, x, SIM_BINARY_ADD);
  int n = sim_graph_layernorm(g, "ln", r);
  int a = sim_graph_attention(g, "attn", n, n, n, 4, 6, TRUE);
  int q = sim_graph_reshape(g, "heads", a, 4, (int64_t[]){ 4, 6, 4, 6 });
  int t = sim_graph_transpose(g, "swap", q, (int[]){ 0, 2, 1, 3 });
  int m = sim_graph_matmul(g, "scores", t, t, TRUE);
  int s = sim_graph_softmax(g, "probs", m);
  int d = sim_graph_dropout(g, "drop", s, 0.25);
  int u = sim_graph_unary(g, "silu", d, SIM_UNARY_SILU);
  int v = sim_graph_unary(g, "tanh", u, SIM_UNARY_TANH);
  int64_t sizes[] = { 2, 2 };
  int parts[2];
  sim_graph_split(g, "halves", v, 1, 2, sizes, parts);
  int cat = sim_graph_concat(g, "join", 1, 2, (int[]){ parts[1], parts[0] });
  int w = sim_graph_input(g, "w", SIM_DTYPE_FP32, 1, (int64_t[]){ 6 });
  int b = sim_graph_binary(g, "scale_rows", cat, w, SIM_BINARY_MUL);
  /* Each op gets its own data in [-1, 1): the divisor of this one is positive. */
  int pos = sim_graph_unary(g, "positive", w, SIM_UNARY_EXP);
  int e = sim_graph_binary(g, "divide", b, pos, SIM_BINARY_DIV);
  int f = sim_graph_reshape(g, "flat", e, 2, (int64_t[]){ 4, 4 * 6 * 6 });
  int labels = sim_graph_input(g, "labels", SIM_DTYPE_INT64, 1, (int64_t[]){ 4 });
  sim_graph_cross_entropy(g, "loss", f, labels);
  sim_graph_mse_loss(g, "mse", f, f);
  cr_assert(sim_graph_check(g, NULL));
  return g;
}

static SimGraph *conv_graph(void)
{
  SimGraph *g = sim_graph_new("conv");
  int x = sim_graph_input(g, "img", SIM_DTYPE_FP32, 4, (int64_t[]){ 2, 4, 9, 9 });
  SimConvParams p = sim_conv_params(8, 3, 3);
  p.padding[0] = p.padding[1] = 1;
  p.bias = TRUE;
  p.activation = SIM_UNARY_RELU;
  int c = sim_graph_conv2d(g, "conv_relu", x, &p);
  SimConvParams q = sim_conv_params(8, 3, 3);
  q.stride[0] = q.stride[1] = 2;
  q.groups = 2;
  int d = sim_graph_conv2d(g, "conv_grouped", c, &q);
  int b = sim_graph_batchnorm(g, "bn", d, TRUE);
  int m = sim_graph_pool2d(g, "maxpool", b, SIM_POOL_MAX, 3, 3, 1, 1, 1, 1);
  sim_graph_pool2d(g, "avgpool", m, SIM_POOL_AVG, 2, 2, 2, 2, 0, 0);
  cr_assert(sim_graph_check(g, NULL));
  return g;
}

static SimGraph *seq_graph(void)
{
  SimGraph *g = sim_graph_new("seq");
  int ids = sim_graph_input(g, "ids", SIM_DTYPE_INT64, 2, (int64_t[]){ 3, 5 });
  int e = sim_graph_embedding(g, "embed", ids, 40, 8);
  int l = sim_graph_lstm(g, "lstm", e, 6);
  int bag_ids = sim_graph_input(g, "bag_ids", SIM_DTYPE_INT64, 2, (int64_t[]){ 3, 4 });
  SimAttrs *at = sim_attrs_new(SIM_OP_EMBEDDING);
  sim_attrs_set_int(at, "vocab", 50, NULL);
  sim_attrs_set_int(at, "dim", 6, NULL);
  sim_attrs_set_string(at, "bags", "true", NULL);
  sim_graph_add_op(g, SIM_OP_EMBEDDING, "bags", 1, &bag_ids, at, NULL);
  sim_attrs_free(at);
  sim_graph_unary(g, "exp", l, SIM_UNARY_EXP);
  cr_assert(sim_graph_check(g, NULL));
  return g;
}

/* LLaMA-style blocks: RMS norm, grouped-query attention (4 query heads sharing 2
 * key-value heads) with rotary embeddings, biases and dropout on the probabilities, gated
 * MLPs with SiLU (SwiGLU) and GELU (GeGLU), and a mixture of 4 experts, top 2. */
static SimGraph *llm_graph(void)
{
  SimGraph *g = sim_graph_new("llm");
  int x = sim_graph_input(g, "x", SIM_DTYPE_FP32, 3, (int64_t[]){ 2, 6, 16 });
  int n = sim_graph_rmsnorm(g, "rms", x);
  SimAttrs *at = sim_attrs_new(SIM_OP_ATTENTION);
  sim_attrs_set_int(at, "heads", 4, NULL);
  sim_attrs_set_int(at, "head_dim", 4, NULL);
  sim_attrs_set_int(at, "kv_heads", 2, NULL);
  sim_attrs_set_int(at, "causal", 1, NULL);
  sim_attrs_set_int(at, "bias", 1, NULL);
  sim_attrs_set_int(at, "rotary", 1, NULL);
  sim_attrs_set_float(at, "rotary_base", 500.0, NULL);
  sim_attrs_set_float(at, "dropout", 0.25, NULL);
  int in[3] = { n, n, n };
  int a = sim_graph_add_op(g, SIM_OP_ATTENTION, "gqa", 3, in, at, NULL);
  sim_attrs_free(at);
  int m = sim_graph_gated_mlp(g, "swiglu", a, 24, SIM_UNARY_SILU);
  int u = sim_graph_gated_mlp(g, "geglu", m, 8, SIM_UNARY_GELU);
  int r = sim_graph_linear(g, "router", u, 4, FALSE, SIM_UNARY_IDENTITY);
  sim_graph_moe(g, "moe", u, r, 4, 2, 8);
  cr_assert(sim_graph_check(g, NULL));
  return g;
}

/* ---------------------------------------------------------------------------------- */
/* Kernels against the reference                                                       */

Test(kernels, dense_and_attention_whole)
{
  need_gpu();
  g_autoptr(SimGraph) g = dense_graph();
  check_graph(g);
}

Test(kernels, convolution_pooling_batchnorm_whole)
{
  need_gpu();
  g_autoptr(SimGraph) g = conv_graph();
  check_graph(g);
}

Test(kernels, embedding_and_lstm_whole)
{
  need_gpu();
  g_autoptr(SimGraph) g = seq_graph();
  check_graph(g);
}

Test(kernels, sharded)
{
  need_gpu();
  g_autoptr(SimGraph) d = dense_graph();
  check_shard(d, "fc_plain", "k", 8, 24);     /* partial sums, no bias               */
  check_shard(d, "fc_plain", "k", 0, 16);     /* partial sums with the bias          */
  check_shard(d, "fc_gelu", "n", 16, 32);     /* column-parallel                     */
  check_shard(d, "attn", "h", 2, 4);          /* heads split: partial output         */
  check_shard(d, "attn", "s", 3, 6);          /* query positions, causal offset      */
  check_shard(d, "scores", "k", 2, 6);        /* batched product over part of k      */
  check_shard(d, "residual", "b", 1, 3);
  check_shard(d, "drop", "b", 2, 4);          /* dropout indexes the whole batch     */
  check_shard(d, "mse", "d1", 24, 100);       /* a sample's mean over part of it     */
  g_autoptr(SimGraph) c = conv_graph();
  check_shard(c, "conv_relu", "h", 3, 7);     /* halo rows, asymmetric padding       */
  check_shard(c, "conv_relu", "cout", 0, 4);
  check_shard(c, "conv_grouped", "g", 1, 2);
  check_shard(c, "maxpool", "w", 1, 3);       /* pooling halo                        */
  check_shard(c, "bn", "c", 2, 6);
  g_autoptr(SimGraph) s = seq_graph();
  check_shard(s, "embed", "v", 10, 30);       /* vocabulary-parallel lookup          */
  check_shard(s, "embed", "d", 2, 6);
  check_shard(s, "bags", "n", 1, 3);
  check_shard(s, "lstm", "b", 1, 3);
}

Test(kernels, llm_operators_whole)
{
  need_gpu();
  g_autoptr(SimGraph) g = llm_graph();
  check_graph(g);
}

Test(kernels, llm_operators_sharded)
{
  need_gpu();
  g_autoptr(SimGraph) g = llm_graph();
  check_shard(g, "rms", "b", 1, 2);
  check_shard(g, "rms", "s", 2, 5);
  check_shard(g, "gqa", "h", 1, 2);           /* one key-value group: partial output  */
  check_shard(g, "gqa", "s", 2, 6);           /* queries rotated and masked at 2..5   */
  check_shard(g, "gqa", "b", 1, 2);           /* dropout of the second sample         */
  check_shard(g, "swiglu", "f", 8, 24);       /* partial sums of the down projection  */
  check_shard(g, "geglu", "b", 0, 1);
  check_shard(g, "moe", "x", 1, 3);           /* two of the experts: partial output    */
  check_shard(g, "moe", "f", 0, 4);           /* half of every expert's width          */
  check_shard(g, "moe", "s", 3, 6);
}

/* Cross entropy over classes split in two shards on one device: the merged statistics,
 * rescaled and finished, give the loss of the whole rows. */
static float *split_loss(ExecBackend *b, Call *halves[2], const SimRegion *rows)
{
  Side s = { b, g_ptr_array_new() };
  Host st = { .dt = SIM_DTYPE_FP32 };
  st.r.ndim = rows->ndim + 1;
  st.r.lo[0] = 0;
  st.r.hi[0] = EXEC_STATS_PLANES;
  for (int d = 0; d < rows->ndim; d++) {
    st.r.lo[d + 1] = rows->lo[d];
    st.r.hi[d + 1] = rows->hi[d];
  }
  st.n = sim_region_volume(&st.r);
  ExecView stats = side_view(&s, &st, FALSE);
  GError *error = NULL;
  SimRegion p0 = st.r;
  p0.hi[0] = 2;
  cr_assert(exec_backend_fill(b, 0, &stats, &p0, -INFINITY, &error));
  Host lh = { .r = *rows, .dt = SIM_DTYPE_FP32, .n = sim_region_volume(rows) };
  ExecView loss = side_view(&s, &lh, FALSE);
  for (int k = 0; k < 2; k++) {
    Call *c = halves[k];
    ExecView in[2] = { side_view(&s, &c->in[0], TRUE), side_view(&s, &c->in[1], TRUE) };
    ExecView out[1] = { loss };
    ExecKernelArgs a = {
      .graph = c->g, .op = c->op, .phase = EXEC_KERNEL_FORWARD, .step = 1,
      .batch = sim_graph_batch_size(c->g), .microbatches = 1, .accumulate = TRUE,
      .n_inputs = 2, .in = in, .n_outputs = 1, .out = out, .stats = &stats,
    };
    memcpy(a.lo, c->lo, sizeof a.lo);
    memcpy(a.hi, c->hi, sizeof a.hi);
    cr_assert(exec_backend_kernel(b, 0, &a, &error), "%s", error ? error->message : "");
    if (k == 0)
      continue;
    /* One device holds every class: its local maxima are the global ones. */
    SimRegion pm = st.r;
    pm.lo[0] = EXEC_STATS_MAX;
    pm.hi[0] = EXEC_STATS_MAX + 1;
    ExecView lv = stats;
    lv.offset -= (EXEC_STATS_MAX - EXEC_STATS_LOCAL_MAX) * stats.stride[0];
    cr_assert(exec_backend_copy(b, 0, &stats, &lv, &pm, FALSE, &error));
    a.phase = EXEC_KERNEL_STATS_RESCALE;
    cr_assert(exec_backend_kernel(b, 0, &a, &error), "%s", error ? error->message : "");
    a.phase = EXEC_KERNEL_STATS_FINISH;
    cr_assert(exec_backend_kernel(b, 0, &a, &error), "%s", error ? error->message : "");
  }
  float *r = read_view(&s, &loss, lh.n);
  for (guint i = 0; i < s.bufs->len; i++)
    exec_backend_buffer_free(b, 0, s.bufs->pdata[i]);
  g_ptr_array_unref(s.bufs);
  return r;
}

Test(kernels, cross_entropy_over_split_classes)
{
  need_gpu();
  g_autoptr(SimGraph) g = sim_graph_new("ce");
  int x = sim_graph_input(g, "logits", SIM_DTYPE_FP32, 3, (int64_t[]){ 3, 4, 30 });
  int y = sim_graph_input(g, "labels", SIM_DTYPE_INT64, 2, (int64_t[]){ 3, 4 });
  int op_out = sim_graph_cross_entropy(g, "loss", x, y);
  cr_assert_geq(op_out, 0);
  int op = sim_graph_op_by_name(g, "loss");
  Call whole, a, b;
  call_init(&whole, g, op, NULL, NULL);
  int64_t lo0[3] = { 0, 0, 0 }, hi0[3] = { 3, 4, 13 }, lo1[3] = { 0, 0, 13 },
          hi1[3] = { 3, 4, 30 };
  call_init(&a, g, op, lo0, hi0);
  call_init(&b, g, op, lo1, hi1);
  /* The halves see the whole rows' data. */
  for (int k = 0; k < 2; k++) {
    Call *h = k ? &b : &a;
    float *dst = h->in[0].data;
    const float *src = whole.in[0].data;
    int64_t c0 = h->lo[2], cn = h->hi[2] - c0;
    for (int64_t r = 0; r < 12; r++)
      memcpy(dst + r * cn, src + r * 30 + c0, sizeof(float) * (size_t)cn);
    memcpy(h->in[1].data, whole.in[1].data, sizeof(int64_t) * 12);
  }
  g_autoptr(ExecBackend) cpu = backend("cpu");
  g_autoptr(ExecBackend) cuda = backend("cuda");
  Result ref = { 0 };
  run_call(cpu, &whole, &ref);
  Call *halves[2] = { &a, &b };
  SimRegion rows = whole.out[0].r;
  g_autofree float *lc = split_loss(cpu, halves, &rows);
  g_autofree float *lg = split_loss(cuda, halves, &rows);
  cr_expect_leq(rel_error(lc, ref.out[0], 12), TOL, "cpu: split loss differs from whole");
  cr_expect_leq(rel_error(lg, ref.out[0], 12), TOL, "cuda: split loss differs from whole");
  result_clear(&ref);
  call_clear(&whole);
  call_clear(&a);
  call_clear(&b);
}

Test(kernels, optimizer_steps)
{
  need_gpu();
  g_autoptr(ExecBackend) cpu = backend("cpu");
  g_autoptr(ExecBackend) cuda = backend("cuda");
  SimRegion r = { .ndim = 2, .lo = { 0, 0 }, .hi = { 7, 9 } };
  Host w = { .r = r, .dt = SIM_DTYPE_FP32 }, g = w;
  fill_host(&w, 1, 0);
  fill_host(&g, 2, 0);
  for (int adam = 0; adam < 2; adam++) {
    float *got[2];
    ExecBackend *bs[2] = { cpu, cuda };
    for (int k = 0; k < 2; k++) {
      Side s = { bs[k], g_ptr_array_new() };
      Host z = w;
      z.data = NULL;
      ExecUpdateArgs u = {
        .optimizer = adam ? SIM_OPTIMIZER_ADAM : SIM_OPTIMIZER_SGD, .lr = 0.01,
        .momentum = adam ? 0 : 0.9, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
        .weight_decay = 0.01, .step = 3,
        .weight = side_view(&s, &w, TRUE), .grad = side_view(&s, &g, TRUE),
        .state1 = side_view(&s, &z, FALSE), .state2 = side_view(&s, &z, FALSE),
        .region = r, .part_lo = 5, .part_hi = 50,
      };
      GError *error = NULL;
      for (int step = 0; step < 2; step++)
        cr_assert(exec_backend_update(bs[k], 0, &u, &error), "%s", error ? error->message : "");
      got[k] = read_view(&s, &u.weight, w.n);
      for (guint i = 0; i < s.bufs->len; i++)
        exec_backend_buffer_free(bs[k], 0, s.bufs->pdata[i]);
      g_ptr_array_unref(s.bufs);
    }
    cr_expect_leq(rel_error(got[1], got[0], w.n), 1e-5, "%s differs", adam ? "Adam" : "SGD");
    g_free(got[0]);
    g_free(got[1]);
  }
  g_free(w.data);
  g_free(g.data);
}

/* ---------------------------------------------------------------------------------- */
/* Training steps                                                                      */

static SimGraph *zoo(const char *name, const char *params)
{
  g_autoptr(SimModelParams) p = sim_model_params_new();
  GError *error = NULL;
  cr_assert(sim_model_params_parse(p, params, &error), "%s", error ? error->message : "");
  SimGraph *g = sim_zoo_build(name, p, &error);
  cr_assert_not_null(g, "%s", error ? error->message : "");
  return g;
}

/* Three steps of @s on the CUDA back end against the CPU back end's one-device run. */
static void check_training(SimGraph *g, SimMachine *m, SimStrategy *s)
{
  GError *error = NULL;
  g_autoptr(SimPlan) plan = sim_plan_new(g, m, s, NULL, &error);
  cr_assert_not_null(plan, "%s", error ? error->message : "");
  g_autoptr(SimStrategy) one = exec_reference_strategy(plan, m, &error);
  cr_assert_not_null(one, "%s", error ? error->message : "");
  g_autoptr(SimPlan) ref_plan = sim_plan_new(g, m, one, NULL, &error);
  cr_assert_not_null(ref_plan, "%s", error ? error->message : "");
  g_autoptr(ExecBackend) cpu = exec_backend_new("cpu", &error);
  g_autoptr(ExecBackend) cuda = exec_backend_new("cuda", &error);
  cr_assert_not_null(cuda, "%s", error ? error->message : "");
  /* Adam divides each gradient by its own magnitude: the rounding noise of a gradient
   * whose exact value is zero (attention's key bias: softmax ignores a constant added to
   * a row) would move its weight by the whole learning rate, differently on each back
   * end.  A larger epsilon and a smaller rate bound that, as in test-exec.c. */
  ExecOptions o = exec_options_default();
  if (sim_strategy_get_memory(s).optimizer == SIM_OPTIMIZER_ADAM) {
    o.eps = 1e-5;
    o.lr = 1e-4;
  }
  g_autoptr(ExecRun) ref = exec_run_new(cpu, ref_plan, &o, &error);
  cr_assert_not_null(ref, "%s", error ? error->message : "");
  g_autoptr(ExecRun) run = exec_run_new(cuda, plan, &o, &error);
  cr_assert_not_null(run, "%s", error ? error->message : "");
  for (int step = 0; step < 3; step++) {
    cr_assert(exec_run_step(ref, &error), "%s", error ? error->message : "");
    cr_assert(exec_run_step(run, &error), "%s", error ? error->message : "");
  }
  ExecDiff d;
  cr_assert(exec_run_compare(run, ref, &d, &error), "%s", error ? error->message : "");
  cr_expect_leq(d.loss, TOL, "loss differs by %g", d.loss);
  cr_expect_leq(d.grads, TOL, "gradients differ by %g (worst: %s)", d.grads, d.worst);
  cr_expect_leq(d.weights, TOL, "weights differ by %g (worst: %s)", d.weights, d.worst);
  /* Every compute task was timed. */
  const double *start = exec_run_task_start(run), *end = exec_run_task_end(run);
  for (int t = 0; t < sim_plan_n_tasks(plan); t++) {
    SimPlanTask task;
    sim_plan_task(plan, t, &task);
    if (task.kind == SIM_PLAN_COMPUTE)
      cr_expect(start[t] >= 0 && end[t] >= start[t], "task %d untimed", t);
  }
}

Test(training, one_device_mlp_and_gpt)
{
  need_gpu();
  GError *error = NULL;
  g_autoptr(SimMachine) m = sim_machine_load("h200-1", &error);
  cr_assert_not_null(m);
  const char *models[][2] = {
    { "mlp", "batch=16,layers=3,hidden=32,input=16,classes=12,towers=2" },
    { "gpt", "layers=2,hidden=64,heads=4,seq=16,vocab=128,batch=4" },
  };
  for (gsize i = 0; i < G_N_ELEMENTS(models); i++) {
    g_autoptr(SimGraph) g = zoo(models[i][0], models[i][1]);
    g_autoptr(SimStrategy) s = sim_strategy_new(g, m);
    check_training(g, m, s);
  }
}

/* A LLaMA-style model (RMS norm, grouped-query attention with rotary embeddings, SwiGLU)
 * and its mixture-of-experts variant trained on one GPU against the CPU reference. */
Test(training, one_device_llama_and_moe)
{
  need_gpu();
  GError *error = NULL;
  g_autoptr(SimMachine) m = sim_machine_load("h200-1", &error);
  cr_assert_not_null(m);
  const char *models[][2] = {
    { "llama", "layers=2,hidden=32,heads=4,kv_heads=2,ffn=48,seq=8,vocab=64,batch=4" },
    { "moe", "layers=2,hidden=32,heads=4,kv_heads=2,experts=4,top_k=2,expert_ffn=16,seq=8,"
             "vocab=64,batch=4" },
  };
  for (gsize i = 0; i < G_N_ELEMENTS(models); i++) {
    g_autoptr(SimGraph) g = zoo(models[i][0], models[i][1]);
    g_autoptr(SimStrategy) s = sim_strategy_new(g, m);
    check_training(g, m, s);
  }
}

/* Two H200s on NVSwitch: a plan of two devices, which the back end runs on two GPUs
 * with NCCL, or emulates on fewer. */
static SimMachine *two_gpus(void)
{
  const char *json = "{\"format\": \"parasol-machine\", \"version\": 1, \"name\": \"two\","
                     " \"node\": {\"gpu\": \"h200\", \"gpus\": 2,"
                     " \"fabric\": {\"type\": \"nvswitch\", \"bandwidth_GBps\": 450},"
                     " \"pcie\": {\"bandwidth_GBps\": 63}}}";
  GError *error = NULL;
  SimMachine *m = sim_machine_from_json(json, "two.json", 0, &error);
  cr_assert_not_null(m, "%s", error ? error->message : "");
  return m;
}

Test(training, data_parallel_emulated_on_one_gpu)
{
  need_gpu();
  GError *error = NULL;
  g_autoptr(SimMachine) m = two_gpus();
  g_autoptr(SimGraph) g = zoo("gpt", "layers=1,hidden=32,heads=2,seq=8,vocab=64,batch=4");
  g_autoptr(SimStrategy) s = sim_strategy_data_parallel(g, m, 2, &error);
  cr_assert_not_null(s, "%s", error ? error->message : "");
  /* With two GPUs or more the devices would get their own and talk NCCL; emulation is
   * what this test checks. */
  g_setenv("PARASOL_CUDA_EMULATE", "1", TRUE);
  check_training(g, m, s);
  g_unsetenv("PARASOL_CUDA_EMULATE");
}

/* Context parallelism: attention as a ring of key-value blocks (exec/compile-ring.c) on
 * the CUDA back end, the devices emulated on one GPU: LLaMA (grouped-query, rotary,
 * causal) over two context ranks, GPT (biases, dropout) over four. */
Test(training, ring_attention_emulated_on_one_gpu)
{
  need_gpu();
  GError *error = NULL;
  g_autoptr(SimMachine) m2 = two_gpus();
  g_autoptr(SimMachine) m8 = sim_machine_load("h200", &error);
  cr_assert_not_null(m8, "%s", error ? error->message : "");
  g_autoptr(SimGraph) llama =
    zoo("llama", "layers=2,hidden=32,heads=4,kv_heads=2,ffn=48,seq=8,vocab=64,batch=4");
  g_autoptr(SimGraph) gpt = zoo("gpt", "layers=1,hidden=32,heads=2,seq=8,vocab=64,batch=4");
  SimMegatronOptions o = sim_megatron_options_default();
  o.cp = 2;
  g_autoptr(SimStrategy) s2 = sim_strategy_megatron(llama, m2, &o, &error);
  cr_assert_not_null(s2, "%s", error ? error->message : "");
  o.cp = 4;
  g_autoptr(SimStrategy) s4 = sim_strategy_megatron(gpt, m8, &o, &error);
  cr_assert_not_null(s4, "%s", error ? error->message : "");
  g_setenv("PARASOL_CUDA_EMULATE", "1", TRUE);
  check_training(llama, m2, s2);
  check_training(gpt, m8, s4);
  g_unsetenv("PARASOL_CUDA_EMULATE");
}

Test(training, data_parallel_nccl)
{
  need_gpu();
  if (pcu_device_count(NULL, 0) < 2)
    cr_skip_test("NCCL between devices needs two GPUs");
  GError *error = NULL;
  g_autoptr(SimMachine) m = two_gpus();
  g_autoptr(SimGraph) g = zoo("gpt", "layers=1,hidden=32,heads=2,seq=8,vocab=64,batch=4");
  g_autoptr(SimStrategy) s = sim_strategy_data_parallel(g, m, 2, &error);
  cr_assert_not_null(s, "%s", error ? error->message : "");
  check_training(g, m, s);
}

/* ---------------------------------------------------------------------------------- */
/* The profiler                                                                        */

Test(profiler, cuda_runner_measures_and_names_the_gpu)
{
  need_gpu();
  GError *error = NULL;
  g_autoptr(ProfileRunner) r = profile_runner_cuda_new(0, NULL, &error);
  cr_assert_not_null(r, "%s", error ? error->message : "");
  g_autoptr(SimGraph) g = zoo("gpt", "layers=1,hidden=64,heads=4,seq=32,vocab=256,batch=4");
  sim_graph_set_float_dtype(g, SIM_DTYPE_FP16);
  ProfileEnumerateOptions eo = { .n_devices = 2 };
  g_autoptr(ProfileShapes) shapes = profile_enumerate_shapes(g, &eo);
  g_autoptr(ProfileDb) db = profile_db_new();
  ProfileMeasureOptions mo = profile_measure_options_default();
  mo.repetitions = 3;
  mo.update = TRUE;
  int skipped = 0;
  int added = profile_measure_shapes(r, db, g, shapes, &mo, NULL, NULL, &skipped, &error);
  cr_assert_gt(added, 0, "%s", error ? error->message : "");
  cr_expect_eq(skipped, 0);
  const char *gpu = profile_runner_device_name(r);
  cr_assert_not_null(profile_db_get_device_note(db, gpu, "name"));
  for (int i = 0; i < profile_db_n_ops(db); i++)
    cr_expect_gt(profile_db_op(db, i)->median, 0.0, "%s", profile_db_op(db, i)->key);
}

Test(profiler, nccl_all_reduce)
{
  need_gpu();
  if (pcu_device_count(NULL, 0) < 2)
    cr_skip_test("collectives need two GPUs");
  g_autoptr(ProfileDb) db = profile_db_new();
  ProfileCollOptions o = { .kind = PROFILE_COLL_ALLREDUCE, .n_gpus = 2, .min_bytes = 1 << 20,
                           .max_bytes = 1 << 22, .warmup = 2, .repetitions = 5 };
  GError *error = NULL;
  cr_assert(profile_measure_collectives(db, NULL, &o, &error), "%s",
            error ? error->message : "");
  cr_assert_eq(profile_db_n_collectives(db), 3);
}

/* Without a usable GPU the whole suite reports itself skipped (meson's exit status 77)
 * rather than passing with nothing run. */
int main(int argc, char *argv[])
{
  char why[1024] = "";
  int n = pcu_device_count(why, sizeof why);
  if (n < 1) {
    printf("no usable GPU (%s): the gpu suite is skipped\n", n < 0 ? why : "none present");
    return 77;
  }
#ifdef PARASOL_INPROC_TESTS
  return inproc_run_all(argc > 1 ? argv[1] : NULL);
#else
  struct criterion_test_set *tests = criterion_initialize();
  int result = 0;
  if (criterion_handle_args(argc, argv, true))
    result = !criterion_run_all_tests(tests);
  criterion_finalize(tests);
  return result;
#endif
}
