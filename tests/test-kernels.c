/* test-kernels.c — the CPU back end's kernels, one operator at a time.
 *
 * Two kinds of checks, in the spirit of ggml's test-backend-ops:
 * - Forward against the ONNX backend test data of Debian's libonnx-testdata, where an
 *   ONNX node computes what a catalogue operator does (inputs and expected outputs are
 *   TensorProto files, read by the small reader below).  Skipped when the package is not
 *   installed.
 * - Backward against finite differences: for a loss L = sum of c * y with fixed random
 *   weights c, the gradient the kernel adds into every input and weight equals
 *   (L(x + h) - L(x - h)) / 2h, element by element.
 * Each kernel runs on the whole operator (one shard), through the back-end interface.
 *
 * About 1,200 lines: one program per module (tests/meson.build); every kernel goes
 * through the same two checks and the ONNX reader below. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "parasol-exec.h"

#define ONNX_DIR "/usr/share/libonnx-testdata/data/node"

/* ---------------------------------------------------------------------------------- */
/* A minimal TensorProto reader: dims (field 1), data_type (2), float_data (4, packed),
 * int64_data (7, packed), raw_data (9).  Floats become float, integers int64.          */

typedef struct {
  int ndim;
  int64_t dims[SIM_MAX_DIMS];
  gboolean is_float;
  int64_t n;
  float *f;
  int64_t *i;
} Tensor;

static gboolean varint(const guint8 *b, gsize len, gsize *pos, guint64 *out)
{
  guint64 v = 0;
  for (int shift = 0; *pos < len && shift < 64; shift += 7) {
    guint8 c = b[(*pos)++];
    v |= (guint64)(c & 0x7f) << shift;
    if (!(c & 0x80)) {
      *out = v;
      return TRUE;
    }
  }
  return FALSE;
}

static void tensor_clear(Tensor *t)
{
  g_free(t->f);
  g_free(t->i);
  memset(t, 0, sizeof *t);
}

/* Reads @path; FALSE if it is missing or not a tensor this reader knows. */
static gboolean tensor_read(const char *path, Tensor *t)
{
  memset(t, 0, sizeof *t);
  g_autofree guint8 *b = NULL;
  gsize len = 0, pos = 0;
  if (!g_file_get_contents(path, (char **)&b, &len, NULL))
    return FALSE;
  guint64 dtype = 0;
  const guint8 *raw = NULL, *packed_f = NULL, *packed_i = NULL;
  gsize raw_len = 0, pf_len = 0, pi_len = 0;
  while (pos < len) {
    guint64 key, v;
    if (!varint(b, len, &pos, &key))
      return FALSE;
    int field = (int)(key >> 3), wire = (int)(key & 7);
    if (wire == 0) {
      if (!varint(b, len, &pos, &v))
        return FALSE;
      if (field == 1 && t->ndim < SIM_MAX_DIMS)
        t->dims[t->ndim++] = (int64_t)v;
      else if (field == 2)
        dtype = v;
    } else if (wire == 2) {
      if (!varint(b, len, &pos, &v) || pos + v > len)
        return FALSE;
      const guint8 *d = b + pos;
      if (field == 1) {
        gsize p2 = 0;
        guint64 dim;
        while (p2 < v && varint(d, v, &p2, &dim))
          if (t->ndim < SIM_MAX_DIMS)
            t->dims[t->ndim++] = (int64_t)dim;
      } else if (field == 9) {
        raw = d;
        raw_len = v;
      } else if (field == 4) {
        packed_f = d;
        pf_len = v;
      } else if (field == 7) {
        packed_i = d;
        pi_len = v;
      }
      pos += v;
    } else if (wire == 5) {
      pos += 4;
    } else if (wire == 1) {
      pos += 8;
    } else {
      return FALSE;
    }
  }
  t->n = 1;
  for (int d = 0; d < t->ndim; d++)
    t->n *= t->dims[d];
  t->is_float = dtype == 1;
  if (dtype == 1) {
    t->f = g_new(float, MAX(t->n, 1));
    if (raw && raw_len == (gsize)t->n * 4)
      memcpy(t->f, raw, raw_len);
    else if (packed_f && pf_len == (gsize)t->n * 4)
      memcpy(t->f, packed_f, pf_len);
    else
      return FALSE;
  } else if (dtype == 7) {
    t->i = g_new(int64_t, MAX(t->n, 1));
    if (raw && raw_len == (gsize)t->n * 8) {
      memcpy(t->i, raw, raw_len);
    } else if (packed_i) {
      gsize p2 = 0;
      for (int64_t k = 0; k < t->n; k++) {
        guint64 v;
        if (!varint(packed_i, pi_len, &p2, &v))
          return FALSE;
        t->i[k] = (int64_t)v;
      }
    } else {
      return FALSE;
    }
  } else {
    return FALSE;
  }
  return TRUE;
}

/* ---------------------------------------------------------------------------------- */
/* Running one operator's kernel on the whole operator                                 */

typedef struct {
  ExecBackend *b;
  SimGraph *g;
  int op;
  int n_in, n_w, n_out;
  ExecView in[4], in_grad[4], w[8], w_grad[8], out[4], out_grad[4];
  int step;
} Op;

static ExecView alloc_view(ExecBackend *b, const SimShape *s, SimDType dt)
{
  SimRegion r = sim_region_full(s);
  size_t es = dt == SIM_DTYPE_INT64 ? 8 : 4;
  ExecBuffer *buf = exec_backend_buffer_alloc(b, 0, (size_t)MAX(sim_shape_numel(s), 1) * es, NULL);
  cr_assert_not_null(buf);
  return exec_view_dense(buf, dt, &r);
}

static void op_free(Op *o)
{
  ExecView *all[] = { o->in, o->in_grad, o->w, o->w_grad, o->out, o->out_grad };
  int counts[] = { o->n_in, o->n_in, o->n_w, o->n_w, o->n_out, o->n_out };
  for (int k = 0; k < 6; k++)
    for (int i = 0; i < counts[k]; i++)
      exec_backend_buffer_free(o->b, 0, all[k][i].buffer);
  exec_backend_free(o->b);
  sim_graph_free(o->g);
}

/* Prepares op @op (the last one added) of @g, which it takes. */
static void op_init(Op *o, SimGraph *g)
{
  GError *error = NULL;
  cr_assert(sim_graph_check(g, &error), "%s", error ? error->message : "");
  memset(o, 0, sizeof *o);
  o->g = g;
  o->op = sim_graph_n_ops(g) - 1;
  o->b = exec_backend_new("cpu", &error);
  cr_assert_not_null(o->b);
  cr_assert(exec_backend_open(o->b, 1, &error));
  o->n_in = sim_graph_op_n_inputs(g, o->op);
  o->n_w = sim_graph_op_n_weights(g, o->op);
  o->n_out = sim_graph_op_n_outputs(g, o->op);
  o->step = 1;
  for (int i = 0; i < o->n_in; i++) {
    int t = sim_graph_op_input(g, o->op, i);
    SimShape s = sim_graph_tensor_shape(g, t);
    SimDType dt = sim_graph_tensor_dtype(g, t);
    gboolean is_int = dt == SIM_DTYPE_INT32 || dt == SIM_DTYPE_INT64;
    o->in[i] = alloc_view(o->b, &s, is_int ? SIM_DTYPE_INT64 : SIM_DTYPE_FP32);
    if (!is_int)
      o->in_grad[i] = alloc_view(o->b, &s, SIM_DTYPE_FP32);
  }
  for (int i = 0; i < o->n_w; i++) {
    SimShape s = sim_graph_op_weight_shape(g, o->op, i);
    o->w[i] = alloc_view(o->b, &s, SIM_DTYPE_FP32);
    o->w_grad[i] = alloc_view(o->b, &s, SIM_DTYPE_FP32);
  }
  for (int j = 0; j < o->n_out; j++) {
    SimShape s = sim_graph_tensor_shape(g, sim_graph_op_output(g, o->op, j));
    o->out[j] = alloc_view(o->b, &s, SIM_DTYPE_FP32);
    o->out_grad[j] = alloc_view(o->b, &s, SIM_DTYPE_FP32);
  }
}

static void op_run(Op *o, ExecKernelPhase phase)
{
  ExecKernelArgs a = { .graph = o->g, .op = o->op, .phase = phase, .step = o->step,
                       .batch = sim_graph_batch_size(o->g), .microbatches = 1,
                       .n_inputs = o->n_in, .in = o->in, .in_grad = o->in_grad,
                       .n_weights = o->n_w, .w = o->w, .w_grad = o->w_grad,
                       .n_outputs = o->n_out, .out = o->out, .out_grad = o->out_grad };
  gpointer saved = NULL;
  a.saved = &saved;
  for (int d = 0; d < sim_graph_op_n_dims(o->g, o->op); d++)
    a.hi[d] = sim_graph_op_dim_size(o->g, o->op, d);
  GError *error = NULL;
  cr_assert(exec_backend_kernel(o->b, 0, &a, &error), "%s", error ? error->message : "");
  exec_backend_saved_free(o->b, 0, saved);
}

static void put(Op *o, const ExecView *v, const void *src)
{
  size_t es = v->dtype == SIM_DTYPE_INT64 ? 8 : 4;
  cr_assert(exec_backend_buffer_write(o->b, 0, v->buffer, 0, src,
                                      (size_t)exec_view_numel(v) * es, NULL));
}

static void get(Op *o, const ExecView *v, float *dst)
{
  cr_assert(exec_backend_buffer_read(o->b, 0, v->buffer, 0, dst,
                                     (size_t)exec_view_numel(v) * 4, NULL));
}

static void fill(Op *o, const ExecView *v, float value)
{
  SimRegion r = v->box;
  cr_assert(exec_backend_fill(o->b, 0, v, &r, value, NULL));
}

/* ---------------------------------------------------------------------------------- */
/* Forward against ONNX                                                                */

/* Reads input or output @k of ONNX test @test; skips the test when the data is absent. */
static void onnx_tensor(const char *test, const char *kind, int k, Tensor *t)
{
  g_autofree char *path =
    g_strdup_printf("%s/%s/test_data_set_0/%s_%d.pb", ONNX_DIR, test, kind, k);
  if (!g_file_test(ONNX_DIR, G_FILE_TEST_IS_DIR))
    cr_skip_test("the ONNX backend test data (libonnx-testdata) is not installed");
  cr_assert(tensor_read(path, t), "cannot read %s", path);
}

static void put_tensor(Op *o, const ExecView *v, const Tensor *t)
{
  cr_assert_eq(exec_view_numel(v), t->n, "element counts differ");
  put(o, v, t->is_float ? (const void *)t->f : (const void *)t->i);
}

/* Compares output @j of the op with @expect: |a - b| <= 1e-4 (1 + |b|). */
static void expect_output(Op *o, int j, const Tensor *expect)
{
  int64_t n = exec_view_numel(&o->out[j]);
  cr_assert_eq(n, expect->n, "output has %ld elements, ONNX %ld", (long)n, (long)expect->n);
  g_autofree float *y = g_new(float, MAX(n, 1));
  get(o, &o->out[j], y);
  for (int64_t k = 0; k < n; k++)
    cr_assert(fabsf(y[k] - expect->f[k]) <= 1e-4f * (1 + fabsf(expect->f[k])),
              "element %ld: %g, ONNX %g", (long)k, y[k], expect->f[k]);
}

/* A graph whose inputs have the shapes of the ONNX test's inputs @first .. @first + n. */
static SimGraph *graph_from(const Tensor *ts, int n, int *ids)
{
  SimGraph *g = sim_graph_new("onnx");
  for (int k = 0; k < n; k++) {
    g_autofree char *name = g_strdup_printf("x%d", k);
    ids[k] = sim_graph_input(g, name, ts[k].is_float ? SIM_DTYPE_FP32 : SIM_DTYPE_INT64,
                             ts[k].ndim, ts[k].dims);
  }
  return g;
}

/* Element-wise and broadcasting operators: @n inputs, one output. */
static void onnx_simple(const char *test, int n, SimOpType type, int kind)
{
  Tensor in[2], out;
  for (int k = 0; k < n; k++)
    onnx_tensor(test, "input", k, &in[k]);
  onnx_tensor(test, "output", 0, &out);
  int ids[2];
  SimGraph *g = graph_from(in, n, ids);
  if (type == SIM_OP_UNARY)
    sim_graph_unary(g, "op", ids[0], (SimUnaryKind)kind);
  else if (type == SIM_OP_BINARY)
    sim_graph_binary(g, "op", ids[0], ids[1], (SimBinaryKind)kind);
  else if (type == SIM_OP_MATMUL)
    sim_graph_matmul(g, "op", ids[0], ids[1], FALSE);
  else if (type == SIM_OP_SOFTMAX)
    sim_graph_softmax(g, "op", ids[0]);
  else if (type == SIM_OP_CONCAT)
    sim_graph_concat(g, "op", kind, n, ids);
  Op o;
  op_init(&o, g);
  for (int k = 0; k < n; k++)
    put_tensor(&o, &o.in[k], &in[k]);
  op_run(&o, EXEC_KERNEL_FORWARD);
  expect_output(&o, 0, &out);
  op_free(&o);
  for (int k = 0; k < n; k++)
    tensor_clear(&in[k]);
  tensor_clear(&out);
}

Test(onnx, relu) { onnx_simple("test_relu", 1, SIM_OP_UNARY, SIM_UNARY_RELU); }
Test(onnx, sigmoid) { onnx_simple("test_sigmoid", 1, SIM_OP_UNARY, SIM_UNARY_SIGMOID); }
Test(onnx, tanh) { onnx_simple("test_tanh", 1, SIM_OP_UNARY, SIM_UNARY_TANH); }
Test(onnx, exp) { onnx_simple("test_exp", 1, SIM_OP_UNARY, SIM_UNARY_EXP); }
Test(onnx, add_bcast) { onnx_simple("test_add_bcast", 2, SIM_OP_BINARY, SIM_BINARY_ADD); }
Test(onnx, sub_bcast) { onnx_simple("test_sub_bcast", 2, SIM_OP_BINARY, SIM_BINARY_SUB); }
Test(onnx, mul_bcast) { onnx_simple("test_mul_bcast", 2, SIM_OP_BINARY, SIM_BINARY_MUL); }
Test(onnx, div_bcast) { onnx_simple("test_div_bcast", 2, SIM_OP_BINARY, SIM_BINARY_DIV); }
Test(onnx, matmul_3d) { onnx_simple("test_matmul_3d", 2, SIM_OP_MATMUL, 0); }
Test(onnx, matmul_4d) { onnx_simple("test_matmul_4d", 2, SIM_OP_MATMUL, 0); }
Test(onnx, softmax_last_axis) { onnx_simple("test_softmax_axis_2", 1, SIM_OP_SOFTMAX, 0); }
Test(onnx, concat_axis_1) { onnx_simple("test_concat_3d_axis_1", 2, SIM_OP_CONCAT, 1); }

/* Gemm without bias: Y = A B, a linear layer whose weight is B. */
Test(onnx, gemm)
{
  Tensor a, b, y;
  onnx_tensor("test_gemm_default_no_bias", "input", 0, &a);
  onnx_tensor("test_gemm_default_no_bias", "input", 1, &b);
  onnx_tensor("test_gemm_default_no_bias", "output", 0, &y);
  int id;
  SimGraph *g = graph_from(&a, 1, &id);
  sim_graph_linear(g, "op", id, b.dims[1], FALSE, SIM_UNARY_IDENTITY);
  Op o;
  op_init(&o, g);
  put_tensor(&o, &o.in[0], &a);
  put_tensor(&o, &o.w[0], &b);
  op_run(&o, EXEC_KERNEL_FORWARD);
  expect_output(&o, 0, &y);
  op_free(&o);
  tensor_clear(&a);
  tensor_clear(&b);
  tensor_clear(&y);
}

/* Conv: 3x3 kernel, strides 2, pads 1. */
Test(onnx, conv_strides_padding)
{
  Tensor x, w, y;
  onnx_tensor("test_conv_with_strides_padding", "input", 0, &x);
  onnx_tensor("test_conv_with_strides_padding", "input", 1, &w);
  onnx_tensor("test_conv_with_strides_padding", "output", 0, &y);
  int id;
  SimGraph *g = graph_from(&x, 1, &id);
  SimConvParams p = sim_conv_params(w.dims[0], 3, 3);
  p.stride[0] = p.stride[1] = 2;
  p.padding[0] = p.padding[1] = 1;
  sim_graph_conv2d(g, "op", id, &p);
  Op o;
  op_init(&o, g);
  put_tensor(&o, &o.in[0], &x);
  put_tensor(&o, &o.w[0], &w);
  op_run(&o, EXEC_KERNEL_FORWARD);
  expect_output(&o, 0, &y);
  op_free(&o);
  tensor_clear(&x);
  tensor_clear(&w);
  tensor_clear(&y);
}

/* Pooling: 5x5 windows, strides 3, no padding. */
static void onnx_pool(const char *test, SimPoolKind kind)
{
  Tensor x, y;
  onnx_tensor(test, "input", 0, &x);
  onnx_tensor(test, "output", 0, &y);
  int id;
  SimGraph *g = graph_from(&x, 1, &id);
  sim_graph_pool2d(g, "op", id, kind, 5, 5, 3, 3, 0, 0);
  Op o;
  op_init(&o, g);
  put_tensor(&o, &o.in[0], &x);
  op_run(&o, EXEC_KERNEL_FORWARD);
  expect_output(&o, 0, &y);
  op_free(&o);
  tensor_clear(&x);
  tensor_clear(&y);
}

Test(onnx, maxpool_strides) { onnx_pool("test_maxpool_2d_strides", SIM_POOL_MAX); }
Test(onnx, averagepool_strides) { onnx_pool("test_averagepool_2d_strides", SIM_POOL_AVG); }

/* ceil_mode: a 3 x 3 window with stride 2 over 4 x 4 gives 2 x 2, the last windows running
 * past the end; an average divides by the positions inside. */
static void onnx_pool_ceil(const char *test, const char *kind)
{
  Tensor x, y;
  onnx_tensor(test, "input", 0, &x);
  onnx_tensor(test, "output", 0, &y);
  int id;
  SimGraph *g = graph_from(&x, 1, &id);
  g_autoptr(SimAttrs) a = sim_attrs_new(SIM_OP_POOL2D);
  cr_assert(sim_attrs_set_string(a, "kind", kind, NULL) &&
            sim_attrs_set_ints(a, "kernel", 2, (int64_t[]){ 3, 3 }, NULL) &&
            sim_attrs_set_ints(a, "stride", 2, (int64_t[]){ 2, 2 }, NULL) &&
            sim_attrs_set_int(a, "ceil_mode", 1, NULL));
  GError *error = NULL;
  cr_assert_geq(sim_graph_add_op(g, SIM_OP_POOL2D, "op", 1, &id, a, &error), 0, "%s",
                error ? error->message : "");
  SimShape ys = sim_graph_tensor_shape(g, sim_graph_op_output(g, 1, 0));
  cr_assert_eq(ys.dims[2], 2);
  cr_assert_eq(ys.dims[3], 2);
  Op o;
  op_init(&o, g);
  put_tensor(&o, &o.in[0], &x);
  op_run(&o, EXEC_KERNEL_FORWARD);
  expect_output(&o, 0, &y);
  op_free(&o);
  tensor_clear(&x);
  tensor_clear(&y);
}

Test(onnx, maxpool_ceil) { onnx_pool_ceil("test_maxpool_2d_ceil", "max"); }
Test(onnx, averagepool_ceil) { onnx_pool_ceil("test_averagepool_2d_ceil", "avg"); }

/* ReLU6 (ONNX's Clip to [0, 6]) and its gradient, which passes only inside (0, 6). */
Test(kernels, relu6)
{
  SimGraph *g = sim_graph_new("t");
  int x = sim_graph_input(g, "x", SIM_DTYPE_FP32, 1, (int64_t[]){ 6 });
  sim_graph_unary(g, "op", x, SIM_UNARY_RELU6);
  Op o;
  op_init(&o, g);
  const float in[6] = { -2, 0.5f, 3, 5.75f, 6.5f, 10 };
  const float want[6] = { 0, 0.5f, 3, 5.75f, 6, 6 }, dwant[6] = { 0, 1, 1, 1, 0, 0 };
  put(&o, &o.in[0], in);
  op_run(&o, EXEC_KERNEL_FORWARD);
  float y[6], dx[6];
  get(&o, &o.out[0], y);
  fill(&o, &o.out_grad[0], 1);
  fill(&o, &o.in_grad[0], 0);
  op_run(&o, EXEC_KERNEL_BACKWARD);
  get(&o, &o.in_grad[0], dx);
  for (int k = 0; k < 6; k++) {
    cr_expect_eq(y[k], want[k], "relu6(%g) = %g", in[k], y[k]);
    cr_expect_eq(dx[k], dwant[k], "relu6'(%g) = %g", in[k], dx[k]);
  }
  op_free(&o);
}

/* Batch norm in training mode: the batch's own statistics (epsilon 1e-5). */
Test(onnx, batchnorm_training)
{
  Tensor x, s, b, y;
  onnx_tensor("test_batchnorm_example_training_mode", "input", 0, &x);
  onnx_tensor("test_batchnorm_example_training_mode", "input", 1, &s);
  onnx_tensor("test_batchnorm_example_training_mode", "input", 2, &b);
  onnx_tensor("test_batchnorm_example_training_mode", "output", 0, &y);
  int id;
  SimGraph *g = graph_from(&x, 1, &id);
  sim_graph_batchnorm(g, "op", id, FALSE);
  Op o;
  op_init(&o, g);
  put_tensor(&o, &o.in[0], &x);
  put_tensor(&o, &o.w[0], &s);
  put_tensor(&o, &o.w[1], &b);
  op_run(&o, EXEC_KERNEL_FORWARD);
  expect_output(&o, 0, &y);
  op_free(&o);
  tensor_clear(&x);
  tensor_clear(&s);
  tensor_clear(&b);
  tensor_clear(&y);
}

Test(onnx, layernorm)
{
  Tensor x, s, b, y;
  onnx_tensor("test_layer_normalization_2d_axis1", "input", 0, &x);
  onnx_tensor("test_layer_normalization_2d_axis1", "input", 1, &s);
  onnx_tensor("test_layer_normalization_2d_axis1", "input", 2, &b);
  onnx_tensor("test_layer_normalization_2d_axis1", "output", 0, &y);
  int id;
  SimGraph *g = graph_from(&x, 1, &id);
  sim_graph_layernorm(g, "op", id);
  Op o;
  op_init(&o, g);
  put_tensor(&o, &o.in[0], &x);
  put_tensor(&o, &o.w[0], &s);
  put_tensor(&o, &o.w[1], &b);
  op_run(&o, EXEC_KERNEL_FORWARD);
  expect_output(&o, 0, &y);
  op_free(&o);
  tensor_clear(&x);
  tensor_clear(&s);
  tensor_clear(&b);
  tensor_clear(&y);
}

/* Gather along axis 0 of data [5, 4, 3, 2]: an embedding lookup in a table of 5 rows of
 * 24 elements. */
Test(onnx, gather_as_embedding)
{
  Tensor data, idx, y;
  onnx_tensor("test_gather_0", "input", 0, &data);
  onnx_tensor("test_gather_0", "input", 1, &idx);
  onnx_tensor("test_gather_0", "output", 0, &y);
  int id;
  SimGraph *g = graph_from(&idx, 1, &id);
  sim_graph_embedding(g, "op", id, data.dims[0], data.n / data.dims[0]);
  Op o;
  op_init(&o, g);
  put_tensor(&o, &o.in[0], &idx);
  put(&o, &o.w[0], data.f);
  op_run(&o, EXEC_KERNEL_FORWARD);
  expect_output(&o, 0, &y);
  op_free(&o);
  tensor_clear(&data);
  tensor_clear(&idx);
  tensor_clear(&y);
}

/* SoftmaxCrossEntropyLoss without reduction: the per-sample loss. */
Test(onnx, softmax_cross_entropy)
{
  Tensor x[2], y;
  onnx_tensor("test_sce_none", "input", 0, &x[0]);
  onnx_tensor("test_sce_none", "input", 1, &x[1]);
  onnx_tensor("test_sce_none", "output", 0, &y);
  int ids[2];
  SimGraph *g = graph_from(x, 2, ids);
  sim_graph_cross_entropy(g, "op", ids[0], ids[1]);
  Op o;
  op_init(&o, g);
  put_tensor(&o, &o.in[0], &x[0]);
  put_tensor(&o, &o.in[1], &x[1]);
  op_run(&o, EXEC_KERNEL_FORWARD);
  expect_output(&o, 0, &y);
  op_free(&o);
  tensor_clear(&x[0]);
  tensor_clear(&x[1]);
  tensor_clear(&y);
}

Test(onnx, split_equal_parts)
{
  Tensor x, y0, y1;
  onnx_tensor("test_split_equal_parts_2d", "input", 0, &x);
  onnx_tensor("test_split_equal_parts_2d", "output", 0, &y0);
  onnx_tensor("test_split_equal_parts_2d", "output", 1, &y1);
  int id, outs[2];
  SimGraph *g = graph_from(&x, 1, &id);
  int64_t sizes[] = { x.dims[1] / 2, x.dims[1] / 2 };
  sim_graph_split(g, "op", id, 1, 2, sizes, outs);
  Op o;
  op_init(&o, g);
  put_tensor(&o, &o.in[0], &x);
  op_run(&o, EXEC_KERNEL_FORWARD);
  expect_output(&o, 0, &y0);
  expect_output(&o, 1, &y1);
  op_free(&o);
  tensor_clear(&x);
  tensor_clear(&y0);
  tensor_clear(&y1);
}

Test(onnx, reshape)
{
  Tensor x, y;
  onnx_tensor("test_reshape_reordered_all_dims", "input", 0, &x);
  onnx_tensor("test_reshape_reordered_all_dims", "output", 0, &y);
  int id;
  SimGraph *g = graph_from(&x, 1, &id);
  sim_graph_reshape(g, "op", id, y.ndim, y.dims);
  Op o;
  op_init(&o, g);
  put_tensor(&o, &o.in[0], &x);
  op_run(&o, EXEC_KERNEL_FORWARD);
  expect_output(&o, 0, &y);
  op_free(&o);
  tensor_clear(&x);
  tensor_clear(&y);
}

/* Permutation (0, 2, 1), the second of itertools' order. */
Test(onnx, transpose)
{
  Tensor x, y;
  onnx_tensor("test_transpose_all_permutations_1", "input", 0, &x);
  onnx_tensor("test_transpose_all_permutations_1", "output", 0, &y);
  int id;
  SimGraph *g = graph_from(&x, 1, &id);
  int perm[] = { 0, 2, 1 };
  sim_graph_transpose(g, "op", id, perm);
  Op o;
  op_init(&o, g);
  put_tensor(&o, &o.in[0], &x);
  op_run(&o, EXEC_KERNEL_FORWARD);
  expect_output(&o, 0, &y);
  op_free(&o);
  tensor_clear(&x);
  tensor_clear(&y);
}

/* LSTM with ONNX's defaults over one step: X [1, batch, in], W [1, 4h, in] and
 * R [1, 4h, h] with gates in ONNX's order i, o, f, c; the catalogue's weight is
 * [W_ih; W_hh] of [in + h, 4h] with gates i, f, g (= c), o. */
Test(onnx, lstm)
{
  Tensor x, w, r, y;
  onnx_tensor("test_lstm_defaults", "input", 0, &x);
  onnx_tensor("test_lstm_defaults", "input", 1, &w);
  onnx_tensor("test_lstm_defaults", "input", 2, &r);
  onnx_tensor("test_lstm_defaults", "output", 0, &y);
  int64_t batch = x.dims[1], in = x.dims[2], h = r.dims[2];
  cr_assert_eq(x.dims[0], 1, "one step");
  SimGraph *g = sim_graph_new("onnx");
  int64_t xd[] = { batch, 1, in };
  int id = sim_graph_input(g, "x", SIM_DTYPE_FP32, 3, xd);
  sim_graph_lstm(g, "op", id, h);
  Op o;
  op_init(&o, g);
  put(&o, &o.in[0], x.f);
  g_autofree float *wt = g_new0(float, (in + h) * 4 * h);
  static const int onnx_gate[4] = { 0, 2, 3, 1 }; /* i, f, g, o from i, o, f, c */
  for (int k = 0; k < 4; k++)
    for (int64_t j = 0; j < h; j++) {
      int64_t row = onnx_gate[k] * h + j;
      for (int64_t c = 0; c < in; c++)
        wt[c * 4 * h + k * h + j] = w.f[row * in + c];
      for (int64_t c = 0; c < h; c++)
        wt[(in + c) * 4 * h + k * h + j] = r.f[row * h + c];
    }
  put(&o, &o.w[0], wt);
  fill(&o, &o.w[1], 0.0f);
  op_run(&o, EXEC_KERNEL_FORWARD);
  expect_output(&o, 0, &y);
  op_free(&o);
  tensor_clear(&x);
  tensor_clear(&w);
  tensor_clear(&r);
  tensor_clear(&y);
}

/* ---------------------------------------------------------------------------------- */
/* Backward against finite differences                                                  */

/* Deterministic values in [lo, hi) for the elements of a view. */
static void fill_random(Op *o, const ExecView *v, const char *name, double lo, double hi)
{
  int64_t n = exec_view_numel(v);
  g_autofree float *d = g_new(float, MAX(n, 1));
  for (int64_t k = 0; k < n; k++)
    d[k] = (float)(lo + (hi - lo) * exec_hash_uniform(name, (uint64_t)k, 7));
  put(o, v, d);
}

/* L = sum over outputs of c * y, with the probe weights c in the output gradients. */
static double probe_loss(Op *o)
{
  op_run(o, EXEC_KERNEL_FORWARD);
  double l = 0;
  for (int j = 0; j < o->n_out; j++) {
    int64_t n = exec_view_numel(&o->out[j]);
    g_autofree float *y = g_new(float, MAX(n, 1));
    g_autofree float *c = g_new(float, MAX(n, 1));
    get(o, &o->out[j], y);
    get(o, &o->out_grad[j], c);
    for (int64_t k = 0; k < n; k++)
      l += (double)c[k] * y[k];
  }
  return l;
}

static double max_abs(Op *o, const ExecView *v)
{
  int64_t n = exec_view_numel(v);
  g_autofree float *d = g_new(float, MAX(n, 1));
  get(o, v, d);
  double m = 0;
  for (int64_t k = 0; k < n; k++)
    m = MAX(m, fabs((double)d[k]));
  return m;
}

/* Compares the gradient the kernel added into @grad with central differences of the
 * probe loss in the elements of @v.  @scale is the largest gradient of the op: a gradient
 * that is zero in exact arithmetic (attention's key bias) is compared in absolute terms,
 * as finite differences of fp32 sums are accurate to about 1e-5 of it. */
static void check_gradient(Op *o, const ExecView *v, const ExecView *grad, const char *what,
                           double scale)
{
  int64_t n = exec_view_numel(v);
  g_autofree float *x = g_new(float, MAX(n, 1));
  g_autofree float *ana = g_new(float, MAX(n, 1));
  get(o, v, x);
  get(o, grad, ana);
  const float h = 1e-2f;
  for (int64_t k = 0; k < n; k++) {
    float keep = x[k];
    x[k] = keep + h;
    put(o, v, x);
    double lp = probe_loss(o);
    x[k] = keep - h;
    put(o, v, x);
    double lm = probe_loss(o);
    x[k] = keep;
    put(o, v, x);
    double num = (lp - lm) / (2 * h);
    cr_assert(fabs(num - ana[k]) <= 2e-3 * scale + 1e-2 * fabs(num),
              "%s of op '%s', element %ld: kernel %g, finite differences %g",
              what, sim_op_type_name(sim_graph_op_type(o->g, o->op)), (long)k, ana[k], num);
  }
}

/* Runs the backward pass with random inputs and weights and checks every gradient.  With
 * @distinct, the first input's elements are at least 2/n apart, more than the finite
 * differences' step, so that a maximum does not change hands within it. */
static void gradcheck_with(SimGraph *g, int int_range, gboolean distinct)
{
  Op o;
  op_init(&o, g);
  for (int i = 0; i < o.n_in; i++) {
    if (o.in[i].dtype == SIM_DTYPE_INT64) {
      int64_t n = exec_view_numel(&o.in[i]);
      g_autofree int64_t *ids = g_new(int64_t, MAX(n, 1));
      for (int64_t k = 0; k < n; k++)
        ids[k] = (int64_t)(exec_hash_uniform("ids", (uint64_t)k, 3) * int_range);
      put(&o, &o.in[i], ids);
    } else {
      g_autofree char *name = g_strdup_printf("in%d", i);
      /* Divisors and normalized inputs stay away from zero. */
      fill_random(&o, &o.in[i], name, i == 1 ? 0.5 : -1.0, 1.5);
      if (distinct && i == 0) {
        int64_t n = exec_view_numel(&o.in[0]);
        g_autofree float *d = g_new(float, MAX(n, 1));
        for (int64_t k = 0; k < n; k++)
          d[k] = (float)(2.0 * (double)((k * 37) % n) / (double)n - 1.0);
        put(&o, &o.in[0], d);
      }
    }
  }
  for (int i = 0; i < o.n_w; i++) {
    g_autofree char *name = g_strdup_printf("w%d", i);
    fill_random(&o, &o.w[i], name, -0.8, 0.8);
  }
  for (int j = 0; j < o.n_out; j++) {
    g_autofree char *name = g_strdup_printf("probe%d", j);
    fill_random(&o, &o.out_grad[j], name, -1.0, 1.0);
  }
  op_run(&o, EXEC_KERNEL_FORWARD);
  for (int i = 0; i < o.n_in; i++)
    if (o.in_grad[i].buffer)
      fill(&o, &o.in_grad[i], 0.0f);
  for (int i = 0; i < o.n_w; i++)
    fill(&o, &o.w_grad[i], 0.0f);
  op_run(&o, EXEC_KERNEL_BACKWARD);
  double scale = 0;
  for (int i = 0; i < o.n_in; i++)
    if (o.in_grad[i].buffer)
      scale = MAX(scale, max_abs(&o, &o.in_grad[i]));
  for (int i = 0; i < o.n_w; i++)
    scale = MAX(scale, max_abs(&o, &o.w_grad[i]));
  for (int i = 0; i < o.n_in; i++)
    if (o.in_grad[i].buffer) {
      /* An op reading one tensor twice gets both contributions in each view. */
      gboolean shared = FALSE;
      for (int k = 0; k < i; k++)
        shared |= sim_graph_op_input(g, o.op, k) == sim_graph_op_input(g, o.op, i);
      if (!shared)
        check_gradient(&o, &o.in[i], &o.in_grad[i], "input gradient", scale);
    }
  for (int i = 0; i < o.n_w; i++)
    check_gradient(&o, &o.w[i], &o.w_grad[i], "weight gradient", scale);
  op_free(&o);
}

static void gradcheck(SimGraph *g, int int_range)
{
  gradcheck_with(g, int_range, FALSE);
}

static int input(SimGraph *g, const char *name, int ndim, const int64_t *dims)
{
  return sim_graph_input(g, name, SIM_DTYPE_FP32, ndim, dims);
}

Test(gradient, linear)
{
  SimGraph *g = sim_graph_new("t");
  int x = input(g, "x", 3, (int64_t[]){ 2, 3, 5 });
  sim_graph_linear(g, "op", x, 4, TRUE, SIM_UNARY_GELU);
  gradcheck(g, 0);
}

Test(gradient, matmul)
{
  SimGraph *g = sim_graph_new("t");
  int a = input(g, "a", 3, (int64_t[]){ 2, 3, 4 });
  int b = input(g, "b", 3, (int64_t[]){ 2, 5, 4 });
  sim_graph_matmul(g, "op", a, b, TRUE);
  gradcheck(g, 0);
}

Test(gradient, conv2d)
{
  SimGraph *g = sim_graph_new("t");
  int x = input(g, "x", 4, (int64_t[]){ 2, 4, 6, 6 });
  SimConvParams p = sim_conv_params(6, 3, 3);
  p.stride[0] = 2;
  p.padding[0] = p.padding[1] = 1;
  p.dilation[1] = 2;
  p.groups = 2;
  p.bias = TRUE;
  p.activation = SIM_UNARY_TANH;
  sim_graph_conv2d(g, "op", x, &p);
  gradcheck(g, 0);
}

Test(gradient, pool2d_max)
{
  SimGraph *g = sim_graph_new("t");
  int x = input(g, "x", 4, (int64_t[]){ 2, 2, 6, 6 });
  sim_graph_pool2d(g, "op", x, SIM_POOL_MAX, 2, 2, 2, 2, 0, 0);
  gradcheck_with(g, 0, TRUE);
}

Test(gradient, pool2d_avg)
{
  SimGraph *g = sim_graph_new("t");
  int x = input(g, "x", 4, (int64_t[]){ 2, 2, 5, 5 });
  sim_graph_pool2d(g, "op", x, SIM_POOL_AVG, 3, 3, 2, 2, 1, 1);
  gradcheck(g, 0);
}

Test(gradient, batchnorm)
{
  SimGraph *g = sim_graph_new("t");
  int x = input(g, "x", 3, (int64_t[]){ 4, 3, 5 });
  sim_graph_batchnorm(g, "op", x, FALSE);
  gradcheck(g, 0);
}

Test(gradient, layernorm)
{
  SimGraph *g = sim_graph_new("t");
  int x = input(g, "x", 3, (int64_t[]){ 3, 4, 6 });
  sim_graph_layernorm(g, "op", x);
  gradcheck(g, 0);
}

Test(gradient, embedding)
{
  SimGraph *g = sim_graph_new("t");
  int ids = sim_graph_input(g, "ids", SIM_DTYPE_INT32, 2, (int64_t[]){ 2, 3 });
  sim_graph_embedding(g, "op", ids, 7, 4);
  gradcheck(g, 7);
}

Test(gradient, unary)
{
  static const SimUnaryKind kinds[] = { SIM_UNARY_GELU, SIM_UNARY_SIGMOID, SIM_UNARY_TANH,
                                        SIM_UNARY_EXP, SIM_UNARY_SILU };
  for (size_t k = 0; k < G_N_ELEMENTS(kinds); k++) {
    SimGraph *g = sim_graph_new("t");
    int x = input(g, "x", 2, (int64_t[]){ 3, 5 });
    sim_graph_unary(g, "op", x, kinds[k]);
    gradcheck(g, 0);
  }
}

Test(gradient, binary_broadcast)
{
  for (int kind = 0; kind < SIM_BINARY_COUNT; kind++) {
    SimGraph *g = sim_graph_new("t");
    int a = input(g, "a", 3, (int64_t[]){ 3, 4, 5 });
    int b = input(g, "b", 2, (int64_t[]){ 4, 1 });
    sim_graph_binary(g, "op", a, b, (SimBinaryKind)kind);
    gradcheck(g, 0);
  }
}

Test(gradient, softmax)
{
  SimGraph *g = sim_graph_new("t");
  int x = input(g, "x", 2, (int64_t[]){ 3, 5 });
  sim_graph_softmax(g, "op", x);
  gradcheck(g, 0);
}

Test(gradient, dropout)
{
  SimGraph *g = sim_graph_new("t");
  int x = input(g, "x", 2, (int64_t[]){ 4, 5 });
  sim_graph_dropout(g, "op", x, 0.3);
  gradcheck(g, 0);
}

Test(gradient, concat_split)
{
  SimGraph *g = sim_graph_new("t");
  int a = input(g, "a", 3, (int64_t[]){ 2, 3, 4 });
  int b = input(g, "b", 3, (int64_t[]){ 2, 2, 4 });
  sim_graph_concat(g, "op", 1, 2, (int[]){ a, b });
  gradcheck(g, 0);
  g = sim_graph_new("t");
  int x = input(g, "x", 3, (int64_t[]){ 2, 5, 3 });
  int outs[2];
  sim_graph_split(g, "op", x, 1, 2, (int64_t[]){ 2, 3 }, outs);
  gradcheck(g, 0);
}

Test(gradient, reshape_transpose)
{
  SimGraph *g = sim_graph_new("t");
  int x = input(g, "x", 3, (int64_t[]){ 2, 3, 4 });
  sim_graph_reshape(g, "op", x, 2, (int64_t[]){ 2, 12 });
  gradcheck(g, 0);
  g = sim_graph_new("t");
  x = input(g, "x", 3, (int64_t[]){ 2, 3, 4 });
  sim_graph_transpose(g, "op", x, (int[]){ 0, 2, 1 });
  gradcheck(g, 0);
}

/* Causal self-attention with biases and dropout on the probabilities. */
Test(gradient, attention)
{
  SimGraph *g = sim_graph_new("t");
  int x = input(g, "x", 3, (int64_t[]){ 2, 5, 8 });
  g_autoptr(SimAttrs) a = sim_attrs_new(SIM_OP_ATTENTION);
  sim_attrs_set_int(a, "heads", 2, NULL);
  sim_attrs_set_int(a, "head_dim", 4, NULL);
  sim_attrs_set_string(a, "causal", "true", NULL);
  sim_attrs_set_float(a, "dropout", 0.2, NULL);
  GError *error = NULL;
  cr_assert_geq(sim_graph_add_op(g, SIM_OP_ATTENTION, "op", 3, (int[]){ x, x, x }, a, &error),
                0, "%s", error ? error->message : "");
  gradcheck(g, 0);
}

Test(gradient, rmsnorm)
{
  SimGraph *g = sim_graph_new("t");
  int x = input(g, "x", 3, (int64_t[]){ 3, 4, 6 });
  sim_graph_rmsnorm(g, "op", x);
  gradcheck(g, 0);
}

Test(gradient, gated_mlp)
{
  static const SimUnaryKind kinds[] = { SIM_UNARY_SILU, SIM_UNARY_GELU };
  for (size_t k = 0; k < G_N_ELEMENTS(kinds); k++) {
    SimGraph *g = sim_graph_new("t");
    int x = input(g, "x", 3, (int64_t[]){ 2, 3, 5 });
    sim_graph_gated_mlp(g, "op", x, 7, kinds[k]);
    gradcheck(g, 0);
  }
}

/* Top-2 of 4 experts, renormalized (Mixtral) and not (DeepSeekMoE), routed by logits
 * given as an input.  The finite differences' step does not change any token's choice of
 * experts. */
Test(gradient, moe)
{
  for (int normalize = 0; normalize < 2; normalize++) {
    SimGraph *g = sim_graph_new("t");
    int x = input(g, "x", 3, (int64_t[]){ 2, 3, 6 });
    int logits = input(g, "logits", 3, (int64_t[]){ 2, 3, 4 });
    g_autoptr(SimAttrs) a = sim_attrs_new(SIM_OP_MOE);
    sim_attrs_set_int(a, "experts", 4, NULL);
    sim_attrs_set_int(a, "top_k", 2, NULL);
    sim_attrs_set_int(a, "ffn", 5, NULL);
    sim_attrs_set_int(a, "normalize_top_k", normalize, NULL);
    GError *error = NULL;
    cr_assert_geq(sim_graph_add_op(g, SIM_OP_MOE, "op", 2, (int[]){ x, logits }, a, &error), 0, "%s",
                  error ? error->message : "");
    gradcheck(g, 0);
  }
}

/* Grouped-query self-attention with rotary embeddings: 4 query heads sharing 2 key-value
 * heads, and multi-query (1). */
Test(gradient, grouped_query_rotary_attention)
{
  for (int kv = 1; kv <= 2; kv++) {
    SimGraph *g = sim_graph_new("t");
    int x = input(g, "x", 3, (int64_t[]){ 2, 5, 8 });
    g_autoptr(SimAttrs) a = sim_attrs_new(SIM_OP_ATTENTION);
    sim_attrs_set_int(a, "heads", 4, NULL);
    sim_attrs_set_int(a, "head_dim", 4, NULL);
    sim_attrs_set_int(a, "kv_heads", kv, NULL);
    sim_attrs_set_int(a, "bias", 0, NULL);
    sim_attrs_set_string(a, "causal", "true", NULL);
    sim_attrs_set_string(a, "rotary", "true", NULL);
    GError *error = NULL;
    cr_assert_geq(sim_graph_add_op(g, SIM_OP_ATTENTION, "op", 3, (int[]){ x, x, x }, a, &error),
                  0, "%s", error ? error->message : "");
    gradcheck(g, 0);
  }
}

/* Cross attention: queries and keys/values of different lengths, different tensors. */
Test(gradient, cross_attention)
{
  SimGraph *g = sim_graph_new("t");
  int q = input(g, "q", 3, (int64_t[]){ 2, 3, 4 });
  int kv = input(g, "kv", 3, (int64_t[]){ 2, 5, 4 });
  sim_graph_attention(g, "op", q, kv, kv, 2, 3, FALSE);
  gradcheck(g, 0);
}

Test(gradient, lstm)
{
  SimGraph *g = sim_graph_new("t");
  int x = input(g, "x", 3, (int64_t[]){ 2, 4, 3 });
  sim_graph_lstm(g, "op", x, 5);
  gradcheck(g, 0);
}

Test(gradient, cross_entropy)
{
  SimGraph *g = sim_graph_new("t");
  int x = input(g, "x", 3, (int64_t[]){ 3, 4, 6 });
  int labels = sim_graph_input(g, "labels", SIM_DTYPE_INT32, 2, (int64_t[]){ 3, 4 });
  sim_graph_cross_entropy(g, "op", x, labels);
  gradcheck(g, 6);
}

Test(gradient, mse_loss)
{
  SimGraph *g = sim_graph_new("t");
  int p = input(g, "p", 2, (int64_t[]){ 3, 4 });
  int t = input(g, "t", 2, (int64_t[]){ 3, 4 });
  sim_graph_mse_loss(g, "op", p, t);
  gradcheck(g, 0);
}

/* ---------------------------------------------------------------------------------- */
/* The optimizers against hand-computed updates.  One weight element w = 0.5 with gradient
 * g = 0.2, weight decay 0.1 (so the effective gradient is g' = 0.2 + 0.1 * 0.5 = 0.25) and
 * learning rate 0.1, in a region of four elements of which @part_lo..@part_hi are this
 * device's (ZeRO-1): the others must not move.                                         */

typedef struct {
  float w[4], s1[4], s2[4];
} UpdateOut;

static UpdateOut run_update(SimOptimizer opt, double momentum, int step, float s1, float s2,
                            int64_t part_lo, int64_t part_hi)
{
  GError *error = NULL;
  g_autoptr(ExecBackend) b = exec_backend_new("cpu", &error);
  cr_assert_not_null(b, "%s", error ? error->message : "");
  cr_assert(exec_backend_open(b, 1, &error));
  SimRegion box = { .ndim = 1, .lo = { 0 }, .hi = { 4 } };
  float w[4] = { 0.5f, 0.5f, 0.5f, 0.5f }, g[4] = { 0.2f, 0.2f, 0.2f, 0.2f };
  float st1[4] = { s1, s1, s1, s1 }, st2[4] = { s2, s2, s2, s2 };
  ExecBuffer *bw = exec_backend_buffer_alloc(b, 0, sizeof w, &error);
  ExecBuffer *bg = exec_backend_buffer_alloc(b, 0, sizeof g, &error);
  ExecBuffer *b1 = exec_backend_buffer_alloc(b, 0, sizeof st1, &error);
  ExecBuffer *b2 = exec_backend_buffer_alloc(b, 0, sizeof st2, &error);
  cr_assert(bw && bg && b1 && b2);
  cr_assert(exec_backend_buffer_write(b, 0, bw, 0, w, sizeof w, &error));
  cr_assert(exec_backend_buffer_write(b, 0, bg, 0, g, sizeof g, &error));
  cr_assert(exec_backend_buffer_write(b, 0, b1, 0, st1, sizeof st1, &error));
  cr_assert(exec_backend_buffer_write(b, 0, b2, 0, st2, sizeof st2, &error));
  ExecUpdateArgs a = {
    .optimizer = opt, .lr = 0.1, .momentum = momentum, .beta1 = 0.9, .beta2 = 0.999,
    .eps = 1e-8, .weight_decay = 0.1, .step = step,
    .weight = exec_view_dense(bw, SIM_DTYPE_FP32, &box),
    .grad = exec_view_dense(bg, SIM_DTYPE_FP32, &box),
    .state1 = exec_view_dense(b1, SIM_DTYPE_FP32, &box),
    .state2 = exec_view_dense(b2, SIM_DTYPE_FP32, &box),
    .region = box, .part_lo = part_lo, .part_hi = part_hi,
  };
  cr_assert(exec_backend_update(b, 0, &a, &error), "%s", error ? error->message : "");
  UpdateOut o;
  cr_assert(exec_backend_buffer_read(b, 0, bw, 0, o.w, sizeof o.w, &error));
  cr_assert(exec_backend_buffer_read(b, 0, b1, 0, o.s1, sizeof o.s1, &error));
  cr_assert(exec_backend_buffer_read(b, 0, b2, 0, o.s2, sizeof o.s2, &error));
  exec_backend_buffer_free(b, 0, bw);
  exec_backend_buffer_free(b, 0, bg);
  exec_backend_buffer_free(b, 0, b1);
  exec_backend_buffer_free(b, 0, b2);
  return o;
}

#define NEAR(x, want) cr_expect(fabs((double)(x) - (want)) <= 1e-6 * fabs(want), \
                                "%s = %.9g, expected %.9g", #x, (double)(x), (double)(want))

Test(optimizer, sgd)
{
  /* w - lr g' = 0.5 - 0.1 * 0.25. */
  UpdateOut o = run_update(SIM_OPTIMIZER_SGD, 0, 1, 0, 0, 0, 4);
  for (int k = 0; k < 4; k++)
    NEAR(o.w[k], 0.475);
}

Test(optimizer, sgd_momentum)
{
  /* Buffer 0.3: m = 0.9 * 0.3 + 0.25 = 0.52, w = 0.5 - 0.1 * 0.52 = 0.448 (PyTorch's SGD
   * without dampening). */
  UpdateOut o = run_update(SIM_OPTIMIZER_SGD, 0.9, 1, 0.3f, 0, 0, 4);
  for (int k = 0; k < 4; k++) {
    NEAR(o.s1[k], 0.52);
    NEAR(o.w[k], 0.448);
  }
}

Test(optimizer, adam_first_step)
{
  /* m = 0.1 * 0.25 = 0.025, v = 0.001 * 0.0625 = 6.25e-5; bias corrections 1 - 0.9 = 0.1 and
   * 1 - 0.999 = 0.001 give m^ = 0.25, v^ = 0.0625, sqrt 0.25: the first step moves by the
   * learning rate, w = 0.5 - 0.1 * 0.25 / (0.25 + 1e-8) = 0.400000004. */
  UpdateOut o = run_update(SIM_OPTIMIZER_ADAM, 0, 1, 0, 0, 0, 4);
  for (int k = 0; k < 4; k++) {
    NEAR(o.s1[k], 0.025);
    NEAR(o.s2[k], 6.25e-5);
    NEAR(o.w[k], 0.400000004);
  }
}

Test(optimizer, adam_bias_correction_step3)
{
  /* States 0.1 and 0.01 at step 3: m = 0.09 + 0.025 = 0.115, v = 0.00999 + 0.0000625 =
   * 0.0100525; corrections 1 - 0.9^3 = 0.271 and 1 - 0.999^3 = 0.002997001, so m^ =
   * 0.424354244, v^ = 3.35418...; sqrt(v^) = 1.831443802 and w = 0.5 - 0.1 * 0.424354244
   * / 1.831443812 = 0.476829524.  (Corrections of step 4 would give 0.47892.) */
  UpdateOut o = run_update(SIM_OPTIMIZER_ADAM, 0, 3, 0.1f, 0.01f, 0, 4);
  for (int k = 0; k < 4; k++) {
    NEAR(o.s1[k], 0.115);
    NEAR(o.s2[k], 0.0100525);
    NEAR(o.w[k], 0.476829524);
  }
}

Test(optimizer, zero1_part_only)
{
  /* Elements 1 and 2 of the region are this device's part: 0 and 3 keep their values. */
  UpdateOut o = run_update(SIM_OPTIMIZER_SGD, 0, 1, 0, 0, 1, 3);
  NEAR(o.w[0], 0.5);
  NEAR(o.w[1], 0.475);
  NEAR(o.w[2], 0.475);
  NEAR(o.w[3], 0.5);
}

/* An embedding with bags (EmbeddingBag, DLRM's and XDL's tables): each sample's row is
 * the sum of the rows its ids name, and the backward pass adds the sample's gradient to
 * each of those rows (twice to a row named twice), against sums written out by hand. */
Test(embedding, bags_sum_their_rows_forward_and_backward)
{
  SimGraph *g = sim_graph_new("t");
  int ids = sim_graph_input(g, "ids", SIM_DTYPE_INT64, 2, (int64_t[]){ 2, 3 });
  SimAttrs *attrs = sim_attrs_new(SIM_OP_EMBEDDING);
  cr_assert(sim_attrs_set_int(attrs, "vocab", 5, NULL));
  cr_assert(sim_attrs_set_int(attrs, "dim", 2, NULL));
  cr_assert(sim_attrs_set_int(attrs, "bags", 1, NULL));
  GError *error = NULL;
  int op = sim_graph_add_op(g, SIM_OP_EMBEDDING, "op", 1, &ids, attrs, &error);
  sim_attrs_free(attrs);
  cr_assert_geq(op, 0, "%s", error ? error->message : "");
  Op o;
  op_init(&o, g);
  /* Table row r holds (r, 10 r); sample 0 looks up rows 1, 4, 1, sample 1 rows 0, 2, 3. */
  const int64_t id[6] = { 1, 4, 1, 0, 2, 3 };
  const float w[10] = { 0, 0, 1, 10, 2, 20, 3, 30, 4, 40 };
  put(&o, &o.in[0], id);
  put(&o, &o.w[0], w);
  op_run(&o, EXEC_KERNEL_FORWARD);
  float y[4];
  get(&o, &o.out[0], y);
  const float want[4] = { 1 + 4 + 1, 10 + 40 + 10, 0 + 2 + 3, 0 + 20 + 30 };
  for (int k = 0; k < 4; k++)
    cr_expect_eq(y[k], want[k], "output %d: %g, expected %g", k, y[k], want[k]);
  /* Gradients (0.5, 2) for sample 0 and (1, -1) for sample 1. */
  const float dy[4] = { 0.5f, 2, 1, -1 };
  put(&o, &o.out_grad[0], dy);
  fill(&o, &o.w_grad[0], 0);
  op_run(&o, EXEC_KERNEL_BACKWARD);
  float dw[10];
  get(&o, &o.w_grad[0], dw);
  const float want_dw[10] = { 1, -1, 1, 4, 1, -1, 1, -1, 0.5f, 2 };
  for (int k = 0; k < 10; k++)
    cr_expect_eq(dw[k], want_dw[k], "weight gradient %d: %g, expected %g", k, dw[k],
                 want_dw[k]);
  op_free(&o);
}
