/* test-graph.c — the graph IR (sim/graph.c) and its JSON files (sim/graph-json.c):
 * builders and their sticky errors, names, queries, totals, copies and dtype rewrites,
 * attribute setting by name, the JSON round trip and every error path of the reader. */
#include <criterion/criterion.h>
#include <glib/gstdio.h>
#include <string.h>

#include "parasol-sim.h"

#define N_ARGS(...) ((int)(sizeof((int64_t[]){ __VA_ARGS__ }) / sizeof(int64_t)))
#define INPUT(g, name, dt, ...)                                                           \
  sim_graph_input(g, name, dt, N_ARGS(__VA_ARGS__), (int64_t[]){ __VA_ARGS__ })

static void assert_ok(const SimGraph *g)
{
  g_autoptr(GError) error = NULL;
  cr_assert(sim_graph_check(g, &error), "%s", error ? error->message : "");
}

/* ---------------------------------------------------------------------------------- */
/* Graphs used by several tests                                                        */

/* A 3-layer perceptron on MNIST with a softmax cross entropy. */
static SimGraph *mlp(void)
{
  SimGraph *g = sim_graph_new("mlp");
  int x = INPUT(g, "x", SIM_DTYPE_FP32, 64, 784);
  int labels = INPUT(g, "labels", SIM_DTYPE_INT64, 64);
  int h = sim_graph_linear(g, "fc1", x, 512, TRUE, SIM_UNARY_RELU);
  h = sim_graph_linear(g, "fc2", h, 512, TRUE, SIM_UNARY_RELU);
  h = sim_graph_linear(g, "fc3", h, 10, TRUE, SIM_UNARY_IDENTITY);
  sim_graph_cross_entropy(g, "loss", h, labels);
  assert_ok(g);
  return g;
}

/* A small CNN with every vision operator. */
static SimGraph *cnn(void)
{
  SimGraph *g = sim_graph_new("cnn");
  int x = INPUT(g, "images", SIM_DTYPE_FP32, 16, 3, 32, 32);
  int labels = INPUT(g, "labels", SIM_DTYPE_INT32, 16);
  SimConvParams p = sim_conv_params(32, 3, 3);
  p.padding[0] = p.padding[1] = 1;
  int h = sim_graph_conv2d(g, "conv1", x, &p);
  h = sim_graph_batchnorm(g, "bn1", h, TRUE);
  p = sim_conv_params(32, 3, 3);
  p.padding[0] = p.padding[1] = 2;
  p.dilation[0] = p.dilation[1] = 2;
  p.groups = 4;
  p.bias = TRUE;
  p.activation = SIM_UNARY_SILU;
  int d = sim_graph_conv2d(g, NULL, h, &p);
  h = sim_graph_binary(g, "res", h, d, SIM_BINARY_ADD);
  h = sim_graph_pool2d(g, "pool", h, SIM_POOL_MAX, 2, 2, 2, 2, 0, 0);
  h = sim_graph_pool2d(g, "avg", h, SIM_POOL_AVG, 3, 3, 1, 1, 1, 1);
  h = sim_graph_reshape(g, "flat", h, 2, (int64_t[]){ 16, -1 });
  h = sim_graph_dropout(g, "drop", h, 0.25);
  h = sim_graph_linear(g, "fc", h, 10, TRUE, SIM_UNARY_IDENTITY);
  sim_graph_cross_entropy(g, "loss", h, labels);
  assert_ok(g);
  return g;
}

/* A transformer block with every sequence operator, in fp16. */
static SimGraph *transformer(void)
{
  SimGraph *g = sim_graph_new("block \"with\" quotes");
  int ids = INPUT(g, "ids", SIM_DTYPE_INT32, 4, 64);
  int labels = INPUT(g, "labels", SIM_DTYPE_INT32, 4, 64);
  int x = sim_graph_embedding(g, "wte", ids, 1000, 128);
  int a = sim_graph_layernorm(g, "ln1", x);
  a = sim_graph_attention(g, "attn", a, a, a, 4, 32, TRUE);
  x = sim_graph_binary(g, "res1", x, a, SIM_BINARY_ADD);
  int m = sim_graph_layernorm(g, "ln2", x);
  m = sim_graph_linear(g, "fc1", m, 512, TRUE, SIM_UNARY_GELU);
  m = sim_graph_linear(g, "fc2", m, 128, TRUE, SIM_UNARY_IDENTITY);
  m = sim_graph_dropout(g, "drop", m, 0.1);
  x = sim_graph_binary(g, "res2", x, m, SIM_BINARY_ADD);
  /* A hand-made head split and score product, to exercise the shape operators. */
  int parts[2];
  sim_graph_split(g, "halves", x, 2, 2, (int64_t[]){ 64, 64 }, parts);
  int q = sim_graph_reshape(g, "q4", parts[0], 4, (int64_t[]){ 4, 64, 2, 32 });
  q = sim_graph_transpose(g, "qt", q, (int[]){ 0, 2, 1, 3 });
  int s = sim_graph_matmul(g, "scores", q, q, TRUE);
  s = sim_graph_softmax(g, "probs", s);
  s = sim_graph_unary(g, "scaled", s, SIM_UNARY_SCALE);
  int joined = sim_graph_concat(g, "join", 2, 2, (int[]){ parts[1], parts[0] });
  int logits = sim_graph_linear(g, "head", joined, 1000, FALSE, SIM_UNARY_IDENTITY);
  sim_graph_cross_entropy(g, "loss", logits, labels);
  sim_graph_set_checkpoint(g, sim_graph_op_by_name(g, "res2"), TRUE);
  sim_graph_set_selective_recompute(g, sim_graph_op_by_name(g, "attn"), TRUE);
  sim_graph_set_tokens_per_sample(g, 64);
  sim_graph_set_float_dtype(g, SIM_DTYPE_FP16);
  assert_ok(g);
  return g;
}

/* An LSTM regressor and a recommender's bag of lookups, built by name and attributes. */
static SimGraph *misc(void)
{
  SimGraph *g = sim_graph_new("misc");
  int x = INPUT(g, "x", SIM_DTYPE_BF16, 8, 20, 16);
  int y = INPUT(g, "y", SIM_DTYPE_BF16, 8, 20, 32);
  int h = sim_graph_lstm(g, "lstm", x, 32);
  sim_graph_mse_loss(g, "mse", h, y);
  int ids = INPUT(g, "sparse", SIM_DTYPE_INT64, 8, 5);
  g_autoptr(SimAttrs) a = sim_attrs_new(SIM_OP_EMBEDDING);
  cr_assert(sim_attrs_set_int(a, "vocab", 100, NULL));
  cr_assert(sim_attrs_set_int(a, "dim", 8, NULL));
  cr_assert(sim_attrs_set_int(a, "bags", 1, NULL));
  cr_assert(sim_attrs_set_string(a, "dtype", "bfloat16", NULL));
  cr_assert(sim_graph_add_op(g, SIM_OP_EMBEDDING, "bag", 1, &ids, a, NULL) >= 0);
  g_autoptr(SimAttrs) u = sim_attrs_new(SIM_OP_UNARY);
  cr_assert(sim_attrs_set_string(u, "kind", "scale", NULL));
  cr_assert(sim_attrs_set_float(u, "scale", 0.125, NULL));
  int bag = sim_graph_n_tensors(g) - 1;
  cr_assert(sim_graph_add_op(g, SIM_OP_UNARY, NULL, 1, &bag, u, NULL) >= 0);
  assert_ok(g);
  return g;
}

typedef SimGraph *(*Builder)(void);
static const Builder builders[] = { mlp, cnn, transformer, misc };

/* ---------------------------------------------------------------------------------- */
/* Structure and queries                                                               */

Test(graph, queries)
{
  g_autoptr(SimGraph) g = mlp();
  cr_assert_str_eq(sim_graph_get_name(g), "mlp");
  /* x, labels, fc1, fc2, fc3, loss: 6 ops, one tensor each. */
  cr_assert_eq(sim_graph_n_ops(g), 6);
  cr_assert_eq(sim_graph_n_tensors(g), 6);
  int fc2 = sim_graph_op_by_name(g, "fc2");
  cr_assert_eq(fc2, 3);
  cr_assert_eq(sim_graph_op_type(g, fc2), SIM_OP_LINEAR);
  cr_assert_str_eq(sim_graph_op_name(g, fc2), "fc2");
  cr_assert_eq(sim_graph_op_n_inputs(g, fc2), 1);
  int in = sim_graph_op_input(g, fc2, 0);
  cr_assert_str_eq(sim_graph_tensor_name(g, in), "fc1");
  cr_assert_eq(sim_graph_tensor_producer(g, in), sim_graph_op_by_name(g, "fc1"));
  cr_assert_eq(sim_graph_tensor_n_consumers(g, in), 1);
  cr_assert_eq(sim_graph_tensor_consumer(g, in, 0), fc2);
  cr_assert_eq(sim_graph_op_n_outputs(g, fc2), 1);
  cr_assert_eq(sim_graph_op_n_weights(g, fc2), 2);
  SimShape w = sim_graph_op_weight_shape(g, fc2, 0);
  cr_assert(w.ndim == 2 && w.dims[0] == 512 && w.dims[1] == 512);
  cr_assert_eq(sim_graph_op_by_name(g, "nope"), -1);
  /* Every op's input exists before it: ids are a topological order. */
  for (int op = 0; op < sim_graph_n_ops(g); op++)
    for (int i = 0; i < sim_graph_op_n_inputs(g, op); i++)
      cr_assert_lt(sim_graph_tensor_producer(g, sim_graph_op_input(g, op, i)), op);
}

Test(graph, totals)
{
  g_autoptr(SimGraph) g = mlp();
  /* Parameters: 784*512 + 512 + 512*512 + 512 + 512*10 + 10 = 669,706. */
  cr_assert_eq(sim_graph_n_params(g), 669706);
  /* GEMM FLOPs forward: 2 * 64 * (784*512 + 512*512 + 512*10) = 85,590,016, plus the
   * bias-and-relu kernels (2 * 64 * 512 twice) and the loss (8 * 64 * 10). */
  double fwd = 2.0 * 64 * (784 * 512 + 512 * 512 + 512 * 10) + 2 * 2.0 * 64 * 512 + 8 * 640;
  cr_assert_float_eq(sim_graph_forward_flops(g), fwd, 1);
  double sum = 0;
  for (int op = 0; op < sim_graph_n_ops(g); op++)
    sum += sim_graph_op_backward_flops(g, op);
  cr_assert_float_eq(sim_graph_backward_flops(g), sum, 1);
  cr_assert_gt(sim_graph_backward_flops(g), 2 * 2.0 * 64 * (784 * 512 + 512 * 512 + 512 * 10));
  cr_assert_eq(sim_graph_batch_size(g), 64);
  cr_assert_eq(sim_graph_tokens_per_sample(g), 1);
  sim_graph_set_tokens_per_sample(g, 128);
  cr_assert_eq(sim_graph_tokens_per_sample(g), 128);
}

Test(graph, names)
{
  g_autoptr(SimGraph) g = sim_graph_new(NULL);
  int x = INPUT(g, NULL, SIM_DTYPE_FP32, 4, 8);
  int a = sim_graph_linear(g, NULL, x, 8, FALSE, SIM_UNARY_IDENTITY);
  int b = sim_graph_linear(g, NULL, a, 8, FALSE, SIM_UNARY_IDENTITY);
  assert_ok(g);
  /* Generated names count per op type. */
  cr_assert_str_eq(sim_graph_tensor_name(g, x), "input_1");
  cr_assert_str_eq(sim_graph_tensor_name(g, a), "linear_1");
  cr_assert_str_eq(sim_graph_tensor_name(g, b), "linear_2");
  /* A user name that a generated one would take is skipped over. */
  sim_graph_linear(g, "linear_3", b, 8, FALSE, SIM_UNARY_IDENTITY);
  int c = sim_graph_linear(g, NULL, b, 8, FALSE, SIM_UNARY_IDENTITY);
  assert_ok(g);
  cr_assert_str_eq(sim_graph_tensor_name(g, c), "linear_4");
  /* Duplicate names are refused. */
  sim_graph_linear(g, "linear_1", b, 8, FALSE, SIM_UNARY_IDENTITY);
  g_autoptr(GError) error = NULL;
  cr_assert_not(sim_graph_check(g, &error));
  cr_assert(strstr(error->message, "op 'linear_1' (linear): the graph already has an op of that name"),
            "%s", error->message);
}

Test(graph, sticky_errors)
{
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int x = INPUT(g, "x", SIM_DTYPE_FP32, 4, 8);
  /* The first error sticks; later builders do nothing and return -1. */
  int bad = sim_graph_conv2d(g, "conv", x, &(SimConvParams){ .out_channels = 4 });
  cr_assert_eq(bad, -1);
  int n_ops = sim_graph_n_ops(g);
  cr_assert_eq(sim_graph_linear(g, "fc", x, 8, FALSE, SIM_UNARY_IDENTITY), -1);
  cr_assert_eq(sim_graph_n_ops(g), n_ops);
  g_autoptr(GError) error = NULL;
  cr_assert_not(sim_graph_check(g, &error));
  cr_assert_eq(error->domain, SIM_ERROR);
  cr_assert_eq(error->code, SIM_ERROR_INVALID);
  cr_assert(strstr(error->message, "op 'conv' (conv2d)"), "%s", error->message);
  /* sim_graph_add_op reports through its own error and leaves the sticky one alone. */
  g_autoptr(GError) e2 = NULL;
  g_autoptr(SimAttrs) a = sim_attrs_new(SIM_OP_LINEAR);
  cr_assert(sim_attrs_set_int(a, "out_features", 3, NULL));
  cr_assert(sim_graph_add_op(g, SIM_OP_LINEAR, "fine", 1, &x, a, &e2) >= 0);
  cr_assert_eq(sim_graph_add_op(g, SIM_OP_LINEAR, "nowhere", 1, (int[]){ 99 }, a, &e2), -1);
  cr_assert(strstr(e2->message, "tensor 99, which does not exist"), "%s", e2->message);
}

Test(graph, input_counts)
{
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int x = INPUT(g, "x", SIM_DTYPE_FP32, 4, 8);
  g_autoptr(GError) error = NULL;
  cr_assert_eq(sim_graph_add_op(g, SIM_OP_BINARY, "b", 1, &x, NULL, &error), -1);
  cr_assert(strstr(error->message, "op 'b' (binary): takes 2 inputs, got 1"), "%s",
            error->message);
}

Test(graph, consumers_once_per_op)
{
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int x = INPUT(g, "x", SIM_DTYPE_FP16, 2, 16, 64);
  int y = sim_graph_attention(g, "attn", x, x, x, 4, 16, FALSE);
  sim_graph_binary(g, "res", x, y, SIM_BINARY_ADD);
  assert_ok(g);
  /* Self-attention reads x three times but counts as one consumer. */
  cr_assert_eq(sim_graph_op_n_inputs(g, sim_graph_op_by_name(g, "attn")), 3);
  cr_assert_eq(sim_graph_tensor_n_consumers(g, x), 2);
  cr_assert_eq(sim_graph_tensor_consumer(g, x, 0), sim_graph_op_by_name(g, "attn"));
  cr_assert_eq(sim_graph_tensor_consumer(g, x, 1), sim_graph_op_by_name(g, "res"));
}

Test(graph, flags_copy_dtype)
{
  g_autoptr(SimGraph) g = transformer();
  int attn = sim_graph_op_by_name(g, "attn");
  cr_assert(sim_graph_op_is_selective_recompute(g, attn));
  cr_assert_not(sim_graph_op_is_checkpoint(g, attn));
  cr_assert(sim_graph_op_is_checkpoint(g, sim_graph_op_by_name(g, "res2")));
  /* fp16 everywhere floating point; ids and labels stay integers. */
  for (int t = 0; t < sim_graph_n_tensors(g); t++) {
    SimDType dt = sim_graph_tensor_dtype(g, t);
    cr_assert(dt == SIM_DTYPE_FP16 || dt == SIM_DTYPE_INT32, "%s", sim_graph_tensor_name(g, t));
  }
  cr_assert_eq(sim_graph_tensor_dtype(g, sim_graph_op_output(g, sim_graph_op_by_name(g, "wte"), 0)),
               SIM_DTYPE_FP16);
  /* fp16 weights train in mixed precision: Adam's 8 accesses of 4 bytes to the fp32
   * master weight, gradient and moments, plus reading the fp16 gradient and writing the
   * fp16 weight, 36 bytes per parameter. */
  SimWork w;
  sim_graph_op_work(g, sim_graph_op_by_name(g, "fc1"), NULL, SIM_PASS_UPDATE, &w);
  cr_assert_float_eq(w.k[0].bytes, (128.0 * 512 + 512) * (8 * 4 + 2 + 2), 1e-6);
  /* fp32 weights: the same 8 accesses of 4 bytes and nothing else. */
  sim_graph_set_float_dtype(g, SIM_DTYPE_FP32);
  sim_graph_op_work(g, sim_graph_op_by_name(g, "fc1"), NULL, SIM_PASS_UPDATE, &w);
  cr_assert_float_eq(w.k[0].bytes, (128.0 * 512 + 512) * 8 * 4, 1e-6);
  sim_graph_set_float_dtype(g, SIM_DTYPE_FP16);

  /* A copy is deep and equal. */
  g_autoptr(SimGraph) c = sim_graph_copy(g);
  cr_assert_eq(sim_graph_n_ops(c), sim_graph_n_ops(g));
  cr_assert_eq(sim_graph_n_params(c), sim_graph_n_params(g));
  cr_assert_float_eq(sim_graph_forward_flops(c), sim_graph_forward_flops(g), 1);
  g_autofree char *a = sim_graph_to_json(g);
  g_autofree char *b = sim_graph_to_json(c);
  cr_assert_str_eq(a, b);
  sim_graph_set_checkpoint(c, attn, TRUE);
  cr_assert_not(sim_graph_op_is_checkpoint(g, attn));
  sim_graph_set_float_dtype(c, SIM_DTYPE_FP32);
  cr_assert_eq(sim_graph_tensor_dtype(g, sim_graph_op_output(g, attn, 0)), SIM_DTYPE_FP16);
  cr_assert_eq(sim_graph_tensor_dtype(c, sim_graph_op_output(c, attn, 0)), SIM_DTYPE_FP32);
}

/* ---------------------------------------------------------------------------------- */
/* Attributes by name                                                                  */

Test(attrs, errors_name_type_and_attribute)
{
  g_autoptr(SimAttrs) a = sim_attrs_new(SIM_OP_CONV2D);
  GError *error = NULL;
  cr_assert_not(sim_attrs_set_int(a, "channels", 3, &error));
  cr_assert_eq(error->code, SIM_ERROR_UNKNOWN);
  cr_assert(strstr(error->message, "op type 'conv2d' has no attribute 'channels'"), "%s",
            error->message);
  cr_assert(strstr(error->message, "out_channels"), "%s", error->message);
  g_clear_error(&error);
  cr_assert_not(sim_attrs_set_string(a, "bias", "maybe", &error));
  cr_assert_eq(error->code, SIM_ERROR_INVALID);
  cr_assert(strstr(error->message, "attribute 'bias' takes a boolean"), "%s", error->message);
  g_clear_error(&error);
  cr_assert_not(sim_attrs_set_string(a, "activation", "swish", &error));
  cr_assert(strstr(error->message, "one of identity, relu"), "%s", error->message);
  g_clear_error(&error);
  cr_assert_not(sim_attrs_set_float(a, "groups", 1.5, &error));
  cr_assert(strstr(error->message, "'groups' takes an integer"), "%s", error->message);
  g_clear_error(&error);
  cr_assert_not(sim_attrs_set_ints(a, "out_channels", 2, (int64_t[]){ 1, 2 }, &error));
  g_clear_error(&error);
  cr_assert_not(sim_attrs_set_ints(a, "kernel", 7, (int64_t[]){ 1, 2, 3, 4, 5, 6, 7 }, &error));
  cr_assert(strstr(error->message, "at most 6 values"), "%s", error->message);
  g_clear_error(&error);
  /* Accepted conversions: integral floats for integers, 0/1 and "true" for booleans, one
   * integer for a pair. */
  cr_assert(sim_attrs_set_float(a, "out_channels", 64.0, NULL));
  cr_assert(sim_attrs_set_int(a, "bias", 1, NULL));
  cr_assert(sim_attrs_set_string(a, "bias", "true", NULL));
  cr_assert(sim_attrs_set_int(a, "kernel", 3, NULL));
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int x = INPUT(g, "x", SIM_DTYPE_FP32, 2, 3, 8, 8);
  int op = sim_graph_add_op(g, SIM_OP_CONV2D, "c", 1, &x, a, &error);
  cr_assert(op >= 0, "%s", error ? error->message : "");
  /* 3 means 3x3. */
  SimShape w = sim_graph_op_weight_shape(g, op, 0);
  cr_assert(w.dims[2] == 3 && w.dims[3] == 3);
}

/* ---------------------------------------------------------------------------------- */
/* JSON                                                                                */

static SimGraph *read_back(const char *text)
{
  g_autoptr(GError) error = NULL;
  SimGraph *g = sim_graph_from_json(text, "model.json", &error);
  cr_assert_not_null(g, "%s", error ? error->message : "");
  return g;
}

Test(json, round_trip_is_byte_identical)
{
  for (gsize i = 0; i < G_N_ELEMENTS(builders); i++) {
    g_autoptr(SimGraph) g = builders[i]();
    g_autofree char *first = sim_graph_to_json(g);
    g_autoptr(SimGraph) r = read_back(first);
    g_autofree char *second = sim_graph_to_json(r);
    cr_assert_str_eq(first, second, "graph %s", sim_graph_get_name(g));
    /* The graph read back is the same graph. */
    cr_assert_str_eq(sim_graph_get_name(r), sim_graph_get_name(g));
    cr_assert_eq(sim_graph_n_ops(r), sim_graph_n_ops(g));
    cr_assert_eq(sim_graph_n_tensors(r), sim_graph_n_tensors(g));
    cr_assert_eq(sim_graph_n_params(r), sim_graph_n_params(g));
    cr_assert_float_eq(sim_graph_forward_flops(r), sim_graph_forward_flops(g), 1);
    cr_assert_eq(sim_graph_tokens_per_sample(r), sim_graph_tokens_per_sample(g));
    for (int t = 0; t < sim_graph_n_tensors(g); t++) {
      SimShape a = sim_graph_tensor_shape(g, t), b = sim_graph_tensor_shape(r, t);
      cr_assert(sim_shape_equal(&a, &b));
      cr_assert_eq(sim_graph_tensor_dtype(g, t), sim_graph_tensor_dtype(r, t));
    }
    for (int op = 0; op < sim_graph_n_ops(g); op++) {
      cr_assert_eq(sim_graph_op_is_checkpoint(r, op), sim_graph_op_is_checkpoint(g, op));
      cr_assert_eq(sim_graph_op_is_selective_recompute(r, op),
                   sim_graph_op_is_selective_recompute(g, op));
    }
  }
}

Test(json, save_and_load)
{
  g_autoptr(SimGraph) g = cnn();
  g_autofree char *dir = g_dir_make_tmp("parasol-graph-XXXXXX", NULL);
  g_autofree char *path = g_build_filename(dir, "cnn.json", NULL);
  g_autoptr(GError) error = NULL;
  cr_assert(sim_graph_save(g, path, &error), "%s", error ? error->message : "");
  g_autoptr(SimGraph) r = sim_graph_load(path, &error);
  cr_assert_not_null(r, "%s", error ? error->message : "");
  cr_assert_eq(sim_graph_n_params(r), sim_graph_n_params(g));
  g_unlink(path);
  g_rmdir(dir);
  /* A file that is not there is an I/O error. */
  g_autoptr(SimGraph) none = sim_graph_load("/nonexistent/graph.json", &error);
  cr_assert_null(none);
  cr_assert_eq(error->code, SIM_ERROR_IO);
  g_clear_error(&error);
  cr_assert_not(sim_graph_save(g, "/nonexistent/dir/graph.json", &error));
  cr_assert_eq(error->code, SIM_ERROR_IO);
}

Test(json, hand_written)
{
  /* Defaults fill in, inputs may carry shape and dtype beside attrs, outputs may be
   * renamed, "op:i" reaches a split's parts, and the written form is the full one. */
  const char *text =
    "{\"format\": \"parasol-graph\", \"version\": 1, \"name\": \"hand\", \"ops\": [\n"
    "  {\"name\": \"x\", \"type\": \"input\", \"shape\": [8, 32], \"dtype\": \"float16\"},\n"
    "  {\"name\": \"fc\", \"type\": \"linear\", \"inputs\": [\"x\"],\n"
    "   \"attrs\": {\"out_features\": 64.0}, \"outputs\": [\"h\"]},\n"
    "  {\"name\": \"sp\", \"type\": \"split\", \"inputs\": [\"h\"],\n"
    "   \"attrs\": {\"axis\": -1, \"sizes\": [16, 48]}},\n"
    "  {\"name\": \"act\", \"type\": \"unary\", \"inputs\": [\"sp:1\"],\n"
    "   \"attrs\": {\"kind\": \"tanh\"}, \"checkpoint\": true}\n"
    "]}";
  g_autoptr(SimGraph) g = read_back(text);
  cr_assert_eq(sim_graph_n_ops(g), 4);
  int act = sim_graph_op_by_name(g, "act");
  SimShape s = sim_graph_tensor_shape(g, sim_graph_op_output(g, act, 0));
  cr_assert(s.ndim == 2 && s.dims[1] == 48);
  cr_assert(sim_graph_op_is_checkpoint(g, act));
  cr_assert_eq(sim_graph_tensor_dtype(g, 0), SIM_DTYPE_FP16);
  g_autofree char *out = sim_graph_to_json(g);
  cr_assert(strstr(out, "{\"name\": \"fc\", \"type\": \"linear\", \"inputs\": [\"x\"], \"attrs\": "
                        "{\"out_features\": 64, \"bias\": false, \"activation\": \"identity\"}, "
                        "\"outputs\": [\"h\"]}"),
            "%s", out);
  cr_assert(strstr(out, "\"attrs\": {\"axis\": 1, \"sizes\": [16, 48]}, \"outputs\": "
                        "[\"sp:0\", \"sp:1\"]"),
            "%s", out);
  cr_assert(strstr(out, "\"inputs\": [\"sp:1\"]"), "%s", out);
  cr_assert(strstr(out, "\"shape\": [8, 32], \"dtype\": \"fp16\""), "%s", out);
  cr_assert(strstr(out, "\"checkpoint\": true"), "%s", out);
}

/* The reader's error for @text, which must fail with @code and contain @want. */
static void assert_json_error(const char *text, int code, const char *want)
{
  GError *error = NULL;
  SimGraph *g = sim_graph_from_json(text, "model.json", &error);
  cr_assert_null(g, "read: %s", text);
  cr_assert_not_null(error);
  cr_assert_eq(error->domain, SIM_ERROR);
  cr_assert_eq(error->code, code, "code %d for '%s'", error->code, error->message);
  cr_assert(strstr(error->message, want), "'%s' lacks '%s'", error->message, want);
  g_error_free(error);
}

#define HEAD "{\"format\": \"parasol-graph\", \"version\": 1, \"ops\": [" \
             "{\"name\": \"x\", \"type\": \"input\", \"attrs\": {\"shape\": [4, 8]}}, "

Test(json, errors)
{
  /* Malformed JSON: json-glib's line and column, behind the file name. */
  assert_json_error("{\n  \"format\": \"parasol-graph\",\n  \"version\": 1,,\n}", SIM_ERROR_PARSE,
                    "model.json:3:");
  assert_json_error("[1, 2]", SIM_ERROR_PARSE, "model.json: expected a JSON object");
  assert_json_error("{\"format\": \"parasol-strategy\", \"version\": 1, \"ops\": []}",
                    SIM_ERROR_PARSE, "model.json: format: expected \"parasol-graph\", got "
                                     "\"parasol-strategy\"");
  assert_json_error("{\"format\": \"parasol-graph\", \"version\": 2, \"ops\": []}",
                    SIM_ERROR_PARSE, "model.json: version: expected 1, got 2");
  assert_json_error("{\"format\": \"parasol-graph\", \"version\": 1}", SIM_ERROR_PARSE,
                    "model.json: ops: missing; expected an array of ops");
  assert_json_error(HEAD "{\"name\": \"fc\", \"type\": \"linaer\", \"inputs\": [\"x\"]}]}",
                    SIM_ERROR_UNKNOWN, "model.json: ops[1] ('fc'): unknown op type 'linaer'");
  assert_json_error(HEAD "{\"name\": \"fc\", \"type\": \"linear\", \"inputs\": [\"y\"], "
                         "\"attrs\": {\"out_features\": 4}}]}",
                    SIM_ERROR_UNKNOWN,
                    "model.json: ops[1] ('fc'): inputs[0] names tensor 'y', which no earlier op "
                    "makes");
  assert_json_error(HEAD "{\"name\": \"fc\", \"type\": \"linear\", \"inputs\": [\"x\"], "
                         "\"attrs\": {\"out_feature\": 4}}]}",
                    SIM_ERROR_UNKNOWN,
                    "model.json: ops[1] ('fc'): op type 'linear' has no attribute 'out_feature'");
  assert_json_error(HEAD "{\"name\": \"fc\", \"type\": \"linear\", \"inputs\": [\"x\"], "
                         "\"attrs\": {\"out_features\": 4, \"bias\": \"yes\"}}]}",
                    SIM_ERROR_INVALID, "model.json: ops[1] ('fc'): op type 'linear': attribute "
                                       "'bias' takes a boolean");
  /* Impossible shapes: the op's own message behind the place. */
  assert_json_error(HEAD "{\"name\": \"c\", \"type\": \"conv2d\", \"inputs\": [\"x\"], "
                         "\"attrs\": {\"out_channels\": 4, \"kernel\": [3, 3]}}]}",
                    SIM_ERROR_INVALID,
                    "model.json: ops[1]: op 'c' (conv2d): input 0 is [4, 8]: expected 4 "
                    "dimensions");
  assert_json_error(HEAD "{\"name\": \"fc\", \"type\": \"linear\", \"inputs\": [\"x\"]}]}",
                    SIM_ERROR_INVALID,
                    "model.json: ops[1]: op 'fc' (linear): attribute 'out_features' is required");
  assert_json_error(HEAD "{\"name\": \"x\", \"type\": \"unary\", \"inputs\": [\"x\"], "
                         "\"attrs\": {\"kind\": \"relu\"}}]}",
                    SIM_ERROR_INVALID, "already has an op of that name");
  assert_json_error(HEAD "{\"name\": \"u\", \"type\": \"unary\", \"inputs\": [\"x\"], "
                         "\"attrs\": {\"kind\": \"relu\"}, \"outputs\": [\"x\"]}]}",
                    SIM_ERROR_INVALID, "ops[1] ('u'): tensor name 'x' is already taken");
  assert_json_error(HEAD "{\"name\": \"u\", \"type\": \"unary\", \"inptus\": [\"x\"]}]}",
                    SIM_ERROR_PARSE, "ops[1] ('u').inptus: unknown key");
  assert_json_error(HEAD "{\"name\": \"u\", \"type\": \"unary\", \"inputs\": [\"x\"], "
                         "\"attrs\": {\"kind\": \"relu\"}, \"checkpoint\": 1}]}",
                    SIM_ERROR_PARSE, "ops[1] ('u').checkpoint: expected true or false, got 1");
  assert_json_error(HEAD "{\"name\": \"u\", \"type\": \"unary\", \"inputs\": [\"x\"], "
                         "\"attrs\": {\"kind\": \"relu\"}, \"outputs\": [\"a\", \"b\"]}]}",
                    SIM_ERROR_INVALID, "ops[1] ('u'): \"outputs\" names 2 tensors but the op makes 1");
  assert_json_error(HEAD "42]}", SIM_ERROR_PARSE, "ops[1]: expected an object, got 42");
  assert_json_error("{\"format\": \"parasol-graph\", \"version\": 1, \"ops\": []}",
                    SIM_ERROR_INVALID, "model.json: ops: the graph has no ops");
  /* A tensor too large to count its bytes in 64 bits with its gradients and optimizer
   * states (it was taken, and memory came out as 0 bytes). */
  assert_json_error(HEAD "{\"name\": \"fc\", \"type\": \"linear\", \"inputs\": [\"x\"], "
                         "\"attrs\": {\"out_features\": 1000000000000000}}]}",
                    SIM_ERROR_INVALID, "model.json: ops[1]: op 'fc' (linear): its output 0 would be "
                                       "[4, 1000000000000000], more than 2^48 elements");
  assert_json_error(HEAD "{\"name\": \"r\", \"type\": \"reshape\", \"inputs\": [\"x\"], "
                         "\"attrs\": {\"shape\": [4, 8.5]}}]}",
                    SIM_ERROR_INVALID, "ops[1] ('r'): attribute 'shape': element 1 is 8.5, "
                                       "not an integer");
}
