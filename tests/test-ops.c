/* test-ops.c — the operator catalogue (sim/ops/): shape inference of every operator and
 * its refusal of impossible shapes, iteration spaces and the regions their maps project,
 * FLOPs against closed forms, parameter counts and saved activations.  The tests reach
 * into sim-private.h for the maps, which only the lowering otherwise sees.
 *
 * About 1,700 lines: one program per module (tests/meson.build), and the catalogue's 23
 * operator types are each checked in the same ways. */
#include <criterion/criterion.h>
#include <string.h>

#include "sim-private.h"

#define N_ARGS(...) ((int)(sizeof((int64_t[]){ __VA_ARGS__ }) / sizeof(int64_t)))
#define INPUT(g, name, dt, ...)                                                           \
  sim_graph_input(g, name, dt, N_ARGS(__VA_ARGS__), (int64_t[]){ __VA_ARGS__ })
#define ASSERT_SHAPE(g, t, ...)                                                           \
  assert_shape(g, t, N_ARGS(__VA_ARGS__), (int64_t[]){ __VA_ARGS__ })

static void assert_built(const SimGraph *g, int t)
{
  g_autoptr(GError) error = NULL;
  gboolean ok = sim_graph_check(g, &error);
  cr_assert(ok && t >= 0, "build failed: %s", error ? error->message : "no error set");
}

static void assert_shape(const SimGraph *g, int t, int n, const int64_t *dims)
{
  assert_built(g, t);
  SimShape got = sim_graph_tensor_shape(g, t);
  SimShape want = sim_shape_make(n, dims);
  g_autofree char *a = sim_shape_to_string(&got);
  g_autofree char *b = sim_shape_to_string(&want);
  cr_assert(sim_shape_equal(&got, &want), "shape %s, expected %s", a, b);
}

/* The sticky error's message, which must exist and contain each of @... */
static void assert_error(const SimGraph *g, const char *want1, const char *want2)
{
  g_autoptr(GError) error = NULL;
  cr_assert_not(sim_graph_check(g, &error), "no error");
  cr_assert_eq(error->domain, SIM_ERROR);
  cr_assert(strstr(error->message, want1), "'%s' lacks '%s'", error->message, want1);
  if (want2)
    cr_assert(strstr(error->message, want2), "'%s' lacks '%s'", error->message, want2);
}

static int op_of(const SimGraph *g, int t)
{
  return sim_graph_tensor_producer(g, t);
}

/* FLOPs of one pass of the whole op, in GEMM-like kernels only or in all. */
static double pass_flops(const SimGraph *g, int t, SimPass pass, gboolean gemm_only)
{
  SimWork w;
  sim_graph_op_work(g, op_of(g, t), NULL, pass, &w);
  double f = 0;
  for (int i = 0; i < w.n; i++)
    if (!gemm_only || w.k[i].kind == SIM_KERNEL_GEMM || w.k[i].kind == SIM_KERNEL_CONV ||
        w.k[i].kind == SIM_KERNEL_RECURRENT)
      f += w.k[i].flops;
  return f;
}

static int dim_index(const SimGraph *g, int op, const char *name)
{
  for (int d = 0; d < sim_graph_op_n_dims(g, op); d++)
    if (strcmp(sim_graph_op_dim_name(g, op, d), name) == 0)
      return d;
  cr_assert_fail("op %s has no dimension %s", sim_graph_op_name(g, op), name);
  return -1;
}

/* Whole-op ranges: lo = 0, hi = size. */
static void full_range(const SimGraph *g, int op, int64_t *lo, int64_t *hi)
{
  for (int d = 0; d < sim_graph_op_n_dims(g, op); d++) {
    lo[d] = 0;
    hi[d] = sim_graph_op_dim_size(g, op, d);
  }
}

/* The region of tensor @i of kind 'x' (input), 'w' (weight) or 'y' (output) that the
 * shard [lo, hi) of @op touches. */
static SimRegion project(const SimGraph *g, int op, char kind, int i, const int64_t *lo,
                         const int64_t *hi)
{
  const SimOp *o = sim_graph_op_get(g, op);
  const SimTensorMap *m = kind == 'x' ? sim_space_input_map(o, i)
                          : kind == 'w' ? sim_space_weight_map(o, i)
                                        : sim_space_output_map(o, i);
  const SimShape *s = kind == 'x' ? &o->in_shape[i]
                      : kind == 'w' ? &o->w_shape[i]
                                    : &o->out_shape[i];
  SimRegion r;
  sim_map_project(m, s, lo, hi, &r);
  return r;
}

static void assert_range(const SimRegion *r, int t, int64_t lo, int64_t hi)
{
  cr_assert(r->lo[t] == lo && r->hi[t] == hi,
            "dim %d covers [%" G_GINT64_FORMAT ", %" G_GINT64_FORMAT "), expected [%"
            G_GINT64_FORMAT ", %" G_GINT64_FORMAT ")",
            t, r->lo[t], r->hi[t], lo, hi);
}

/* Whether tensor map @i of kind @kind indexes any of its dimensions by iteration
 * dimension @d (an output that does not is a partial sum when @d is split). */
static gboolean indexed_by(const SimGraph *g, int op, char kind, int i, int d)
{
  const SimOp *o = sim_graph_op_get(g, op);
  const SimTensorMap *m = kind == 'x' ? sim_space_input_map(o, i)
                          : kind == 'w' ? sim_space_weight_map(o, i)
                                        : sim_space_output_map(o, i);
  for (int t = 0; t < m->ndim; t++)
    if (m->map[t].dim == d || m->map[t].kdim == d)
      return TRUE;
  return FALSE;
}

/* Every op's identity-mapped tensors project to their whole shape for the whole op. */
static void assert_full_projections(const SimGraph *g)
{
  for (int op = 0; op < sim_graph_n_ops(g); op++) {
    const SimOp *o = sim_graph_op_get(g, op);
    int64_t lo[SIM_MAX_ITER], hi[SIM_MAX_ITER];
    full_range(g, op, lo, hi);
    cr_assert_eq(o->space.dims[0].role, SIM_ROLE_SAMPLE);
    cr_assert_str_eq(o->space.dims[0].name, "b");
    for (int j = 0; j < o->n_outputs; j++) {
      SimRegion r = project(g, op, 'y', j, lo, hi);
      SimRegion full = sim_region_full(&o->out_shape[j]);
      cr_assert(sim_region_equal(&r, &full), "op %s output %d", o->name, j);
    }
  }
}

/* ---------------------------------------------------------------------------------- */
/* Input                                                                               */

Test(input, shape_dtype_space)
{
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int x = INPUT(g, "x", SIM_DTYPE_FP16, 32, 128);
  ASSERT_SHAPE(g, x, 32, 128);
  cr_assert_eq(sim_graph_tensor_dtype(g, x), SIM_DTYPE_FP16);
  int op = op_of(g, x);
  cr_assert_eq(sim_graph_op_n_dims(g, op), 2);
  cr_assert_eq(sim_graph_op_dim_role(g, op, 0), SIM_ROLE_SAMPLE);
  cr_assert_eq(sim_graph_op_dim_role(g, op, 1), SIM_ROLE_ATTRIBUTE);
  /* A data source does no work and keeps nothing. */
  cr_assert_float_eq(sim_graph_op_forward_flops(g, op), 0.0, 1e-9);
  cr_assert_eq(sim_op_class(SIM_OP_INPUT)->saved_bytes(sim_graph_op_get(g, op), NULL), 0);
}

Test(input, rejects_bad_shape)
{
  g_autoptr(SimGraph) g = sim_graph_new("t");
  INPUT(g, "x", SIM_DTYPE_FP32, 32, 0);
  assert_error(g, "op 'x' (input)", "not positive");
}

/* ---------------------------------------------------------------------------------- */
/* Linear                                                                              */

Test(linear, shapes_params_flops)
{
  g_autoptr(SimGraph) g = sim_graph_new("t");
  /* X [8, 128, 512] . W [512, 1024]: Y [8, 128, 1024]. */
  int x = INPUT(g, "x", SIM_DTYPE_FP32, 8, 128, 512);
  int y = sim_graph_linear(g, "fc", x, 1024, FALSE, SIM_UNARY_IDENTITY);
  ASSERT_SHAPE(g, y, 8, 128, 1024);
  int op = op_of(g, y);
  cr_assert_eq(sim_graph_op_n_params(g, op), 512 * 1024);
  /* Forward 2 * b * s * in * out; backward twice that (dX and dW). */
  double f = 2.0 * 8 * 128 * 512 * 1024;
  cr_assert_float_eq(sim_graph_op_forward_flops(g, op), f, 1);
  cr_assert_float_eq(sim_graph_op_backward_flops(g, op), 2 * f, 1);

  /* With a bias there are out more parameters; rank 2 and 4 inputs work too. */
  int x2 = INPUT(g, "x2", SIM_DTYPE_FP32, 16, 300);
  int y2 = sim_graph_linear(g, "fc2", x2, 10, TRUE, SIM_UNARY_RELU);
  ASSERT_SHAPE(g, y2, 16, 10);
  cr_assert_eq(sim_graph_op_n_params(g, op_of(g, y2)), 300 * 10 + 10);
  /* GEMM 2*16*300*10 plus bias-and-relu, 2 operations on each of the 160 outputs. */
  cr_assert_float_eq(sim_graph_op_forward_flops(g, op_of(g, y2)), 2.0 * 16 * 300 * 10 + 320, 1e-6);
  int x4 = INPUT(g, "x4", SIM_DTYPE_FP32, 2, 3, 4, 5);
  ASSERT_SHAPE(g, sim_graph_linear(g, "fc4", x4, 7, FALSE, SIM_UNARY_GELU), 2, 3, 4, 7);
}

Test(linear, space_and_megatron_splits)
{
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int x = INPUT(g, "x", SIM_DTYPE_FP16, 8, 128, 512);
  int y = sim_graph_linear(g, "fc", x, 1024, TRUE, SIM_UNARY_IDENTITY);
  int op = op_of(g, y);
  /* Dimensions b (sample), s (attribute), n (parameter), k (reduction). */
  cr_assert_eq(sim_graph_op_n_dims(g, op), 4);
  const char *names[] = { "b", "s", "n", "k" };
  SimDimRole roles[] = { SIM_ROLE_SAMPLE, SIM_ROLE_ATTRIBUTE, SIM_ROLE_PARAMETER,
                         SIM_ROLE_REDUCTION };
  int64_t sizes[] = { 8, 128, 1024, 512 };
  for (int d = 0; d < 4; d++) {
    cr_assert_str_eq(sim_graph_op_dim_name(g, op, d), names[d]);
    cr_assert_eq(sim_graph_op_dim_role(g, op, d), roles[d]);
    cr_assert_eq(sim_graph_op_dim_size(g, op, d), sizes[d]);
    cr_assert(sim_graph_op_dim_splittable(g, op, d));
  }
  int64_t lo[4], hi[4];
  /* Column parallel, n in [512, 1024): W's columns and the bias halve, X is whole. */
  full_range(g, op, lo, hi);
  lo[2] = 512;
  SimRegion w = project(g, op, 'w', 0, lo, hi), b = project(g, op, 'w', 1, lo, hi);
  SimRegion xr = project(g, op, 'x', 0, lo, hi), yr = project(g, op, 'y', 0, lo, hi);
  assert_range(&w, 0, 0, 512);
  assert_range(&w, 1, 512, 1024);
  assert_range(&b, 0, 512, 1024);
  assert_range(&xr, 2, 0, 512);
  assert_range(&yr, 2, 512, 1024);
  /* Row parallel, k in [0, 256): X's last dimension and W's rows halve; Y is whole and,
   * not indexed by k, partial. */
  full_range(g, op, lo, hi);
  hi[3] = 256;
  w = project(g, op, 'w', 0, lo, hi);
  xr = project(g, op, 'x', 0, lo, hi);
  yr = project(g, op, 'y', 0, lo, hi);
  assert_range(&w, 0, 0, 256);
  assert_range(&xr, 2, 0, 256);
  assert_range(&yr, 2, 0, 1024);
  cr_assert_not(indexed_by(g, op, 'y', 0, 3));
  /* Data parallel, b in [0, 4): W whole, X and Y halve. */
  full_range(g, op, lo, hi);
  hi[0] = 4;
  w = project(g, op, 'w', 0, lo, hi);
  yr = project(g, op, 'y', 0, lo, hi);
  assert_range(&w, 0, 0, 512);
  assert_range(&yr, 0, 0, 4);
  /* A shard of extents (4, 128, 512, 512) does a quarter of the GEMM. */
  SimWork work;
  int64_t ext[] = { 4, 128, 512, 512 };
  sim_graph_op_work(g, op, ext, SIM_PASS_FORWARD, &work);
  cr_assert_eq(work.n, 1);
  cr_assert_eq(work.k[0].kind, SIM_KERNEL_GEMM);
  cr_assert_eq(work.k[0].m, 4 * 128);
  cr_assert_eq(work.k[0].n, 512);
  cr_assert_eq(work.k[0].k, 512);
  cr_assert_float_eq(sim_work_flops(&work), 2.0 * 4 * 128 * 512 * 512, 1);
  /* GEMM bytes: 2 bytes * (m*k + k*n + m*n). */
  cr_assert_float_eq(sim_work_bytes(&work), 2.0 * (512.0 * 512 * 3), 1);
  /* Saved for backward: the shard's X, 4 * 128 * 512 fp16 values. */
  cr_assert_eq(sim_op_class(SIM_OP_LINEAR)->saved_bytes(sim_graph_op_get(g, op), ext),
               4 * 128 * 512 * 2);
}

Test(linear, update_pass)
{
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int x = INPUT(g, "x", SIM_DTYPE_FP32, 8, 64);
  int op = op_of(g, sim_graph_linear(g, "fc", x, 32, TRUE, SIM_UNARY_IDENTITY));
  /* 64 * 32 + 32 = 2080 parameters: one optimizer kernel of 10 FLOPs and 8 fp32 accesses
   * per parameter. */
  SimWork w;
  sim_graph_op_work(g, op, NULL, SIM_PASS_UPDATE, &w);
  cr_assert_eq(w.n, 1);
  cr_assert_eq(w.k[0].kind, SIM_KERNEL_OPTIMIZER);
  cr_assert_float_eq(w.k[0].flops, 20800, 1e-9);
  cr_assert_float_eq(w.k[0].bytes, 2080.0 * 8 * 4, 1e-9);
  /* Column parallel in two: half the weights and half the bias. */
  int64_t ext[] = { 8, 16, 64 };
  sim_graph_op_work(g, op, ext, SIM_PASS_UPDATE, &w);
  cr_assert_float_eq(w.k[0].flops, 10400, 1e-9);
  /* Ops without weights have no update. */
  sim_graph_op_work(g, op_of(g, x), NULL, SIM_PASS_UPDATE, &w);
  cr_assert_eq(w.n, 0);
}

Test(linear, rejections)
{
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int ids = INPUT(g, "ids", SIM_DTYPE_INT32, 8, 16);
  sim_graph_linear(g, "fc1", ids, 10, FALSE, SIM_UNARY_IDENTITY);
  assert_error(g, "op 'fc1' (linear)", "int32, not floating point");

  g_autoptr(SimGraph) g2 = sim_graph_new("t");
  int v = INPUT(g2, "v", SIM_DTYPE_FP32, 8);
  sim_graph_linear(g2, "fc2", v, 10, FALSE, SIM_UNARY_IDENTITY);
  assert_error(g2, "op 'fc2' (linear)", "expected 2 to 4 dimensions");

  g_autoptr(SimGraph) g3 = sim_graph_new("t");
  int x = INPUT(g3, "x", SIM_DTYPE_FP32, 8, 4);
  sim_graph_linear(g3, "fc3", x, 0, FALSE, SIM_UNARY_IDENTITY);
  assert_error(g3, "op 'fc3' (linear)", "out_features is 0");

  /* A required attribute left out. */
  g_autoptr(GError) error = NULL;
  cr_assert_eq(sim_graph_add_op(g3, SIM_OP_LINEAR, "fc4", 1, &x, NULL, &error), -1);
  cr_assert(strstr(error->message, "op 'fc4' (linear): attribute 'out_features' is required"),
            "%s", error->message);
}

/* ---------------------------------------------------------------------------------- */
/* Matmul                                                                              */

Test(matmul, shapes_flops_space)
{
  g_autoptr(SimGraph) g = sim_graph_new("t");
  /* Attention scores as two matmuls: [b, h, s, e] x [b, h, s, e]^T -> [b, h, s, s]. */
  int q = INPUT(g, "q", SIM_DTYPE_FP16, 2, 8, 64, 32);
  int k = INPUT(g, "k", SIM_DTYPE_FP16, 2, 8, 64, 32);
  int s = sim_graph_matmul(g, "scores", q, k, TRUE);
  ASSERT_SHAPE(g, s, 2, 8, 64, 64);
  int op = op_of(g, s);
  /* 2 * batch(2*8) * m(64) * n(64) * k(32); backward twice. */
  double f = 2.0 * 16 * 64 * 64 * 32;
  cr_assert_float_eq(sim_graph_op_forward_flops(g, op), f, 1);
  cr_assert_float_eq(sim_graph_op_backward_flops(g, op), 2 * f, 1);
  cr_assert_eq(sim_graph_op_n_dims(g, op), 5);
  cr_assert_str_eq(sim_graph_op_dim_name(g, op, 1), "h");
  cr_assert_eq(sim_graph_op_dim_role(g, op, dim_index(g, op, "n")), SIM_ROLE_PARAMETER);
  cr_assert_eq(sim_graph_op_dim_role(g, op, dim_index(g, op, "k")), SIM_ROLE_REDUCTION);
  /* Splitting n in two halves b's rows (it is transposed: [.., n, k]). */
  int64_t lo[5], hi[5];
  full_range(g, op, lo, hi);
  hi[dim_index(g, op, "n")] = 32;
  SimRegion rb = project(g, op, 'x', 1, lo, hi);
  assert_range(&rb, 2, 0, 32);
  assert_range(&rb, 3, 0, 32);
  /* Untransposed, [2, 64, 32] x [2, 32, 16] -> [2, 64, 16]; saved: both inputs. */
  int a = INPUT(g, "a", SIM_DTYPE_FP32, 2, 64, 32);
  int b = INPUT(g, "b", SIM_DTYPE_FP32, 2, 32, 16);
  int c = sim_graph_matmul(g, "c", a, b, FALSE);
  ASSERT_SHAPE(g, c, 2, 64, 16);
  cr_assert_eq(sim_op_class(SIM_OP_MATMUL)->saved_bytes(sim_graph_op_get(g, op_of(g, c)), NULL),
               (2 * 64 * 32 + 2 * 32 * 16) * 4);
}

Test(matmul, rejections)
{
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int a = INPUT(g, "a", SIM_DTYPE_FP32, 2, 64, 32);
  int b = INPUT(g, "b", SIM_DTYPE_FP32, 2, 16, 8);
  sim_graph_matmul(g, "mm", a, b, FALSE);
  assert_error(g, "op 'mm' (matmul): a is [2, 64, 32] and b is [2, 16, 8]", "must equal");

  g_autoptr(SimGraph) g2 = sim_graph_new("t");
  a = INPUT(g2, "a", SIM_DTYPE_FP32, 2, 64, 32);
  b = INPUT(g2, "b", SIM_DTYPE_FP32, 3, 32, 8);
  sim_graph_matmul(g2, "mm", a, b, FALSE);
  assert_error(g2, "op 'mm' (matmul)", "leading dimensions");
}

Test(conv2d, grouped_and_depthwise_kernels)
{
  /* A ResNeXt 3x3 convolution of 128 channels in 32 groups of 4 over [8, 128, 28, 28], and
   * its depthwise counterpart (128 groups of 1), in fp16, after an image convolution so
   * that both compute their data gradients. */
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int img = INPUT(g, "img", SIM_DTYPE_FP16, 8, 3, 28, 28);
  SimConvParams stem = sim_conv_params(128, 1, 1);
  int x = sim_graph_conv2d(g, "stem", img, &stem);
  SimConvParams p = sim_conv_params(128, 3, 3);
  p.padding[0] = p.padding[1] = 1;
  p.groups = 32;
  int grouped = op_of(g, sim_graph_conv2d(g, "grouped", x, &p));
  p.groups = 128;
  int depthwise = op_of(g, sim_graph_conv2d(g, "depthwise", x, &p));
  SimWork w;
  /* Grouped: one implicit GEMM with the groups side by side in the output tiles: m = 8 x
   * 28 x 28 positions, n = all 128 output channels, k = a group's 4 channels (padded to
   * 8 fp16) x 9 taps; the FLOPs are the useful 2 m x 128 x 4 x 9. */
  sim_graph_op_work(g, grouped, NULL, SIM_PASS_FORWARD, &w);
  cr_assert_eq(w.n, 1);
  cr_assert_eq(w.k[0].kind, SIM_KERNEL_CONV);
  cr_assert_eq(w.k[0].m, 8 * 28 * 28);
  cr_assert_eq(w.k[0].n, 128);
  cr_assert_eq(w.k[0].k, 8 * 9);
  cr_assert_float_eq(w.k[0].flops, 2.0 * 8 * 28 * 28 * 128 * 4 * 9, 1);
  /* Depthwise: a bandwidth-bound pass forward (2 x 9 FLOPs an output) and two backward
   * (data and weight gradients), no tensor-core GEMM. */
  sim_graph_op_work(g, depthwise, NULL, SIM_PASS_FORWARD, &w);
  cr_assert_eq(w.n, 1);
  cr_assert_eq(w.k[0].kind, SIM_KERNEL_MEMORY);
  cr_assert_float_eq(w.k[0].flops, 2.0 * 8 * 28 * 28 * 128 * 9, 1);
  sim_graph_op_work(g, depthwise, NULL, SIM_PASS_BACKWARD, &w);
  cr_assert_eq(w.n, 2);
  cr_assert_eq(w.k[0].kind, SIM_KERNEL_MEMORY);
  cr_assert_eq(w.k[1].kind, SIM_KERNEL_MEMORY);
}

/* ---------------------------------------------------------------------------------- */
/* Conv2d                                                                              */

Test(conv2d, resnet_stem)
{
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int x = INPUT(g, "x", SIM_DTYPE_FP32, 32, 3, 224, 224);
  SimConvParams p = sim_conv_params(64, 7, 7);
  p.stride[0] = p.stride[1] = 2;
  p.padding[0] = p.padding[1] = 3;
  int y = sim_graph_conv2d(g, "conv1", x, &p);
  /* floor((224 + 6 - 6 - 1) / 2) + 1 = 112. */
  ASSERT_SHAPE(g, y, 32, 64, 112, 112);
  int op = op_of(g, y);
  cr_assert_eq(sim_graph_op_n_params(g, op), 64 * 3 * 7 * 7);
  /* 2 * N * Ho * Wo * Cout * Cin * kh * kw = 2 * 32 * 112^2 * 64 * 147; backward does
   * the weight gradient only, as much again: no gradient flows back to the images. */
  double f = 2.0 * 32 * 112 * 112 * 64 * 3 * 49;
  cr_assert_float_eq(sim_graph_op_forward_flops(g, op), f, 1);
  cr_assert_float_eq(sim_graph_op_backward_flops(g, op), f, 1);
  SimWork w;
  sim_graph_op_work(g, op, NULL, SIM_PASS_FORWARD, &w);
  cr_assert_eq(w.k[0].kind, SIM_KERNEL_CONV);
  cr_assert_eq(w.k[0].m, 32 * 112 * 112);
  cr_assert_eq(w.k[0].n, 64);
  /* The 3 channels padded to 4 fp32 (one 16-byte vector) as the GEMM runs them. */
  cr_assert_eq(w.k[0].k, 4 * 49);
  sim_graph_op_work(g, op, NULL, SIM_PASS_BACKWARD, &w);
  cr_assert_eq(w.n, 1, "the weight gradient alone");
  cr_assert_eq(w.k[0].m, 64);
  cr_assert_eq(w.k[0].n, 4 * 49);
  cr_assert_eq(w.k[0].k, 32 * 112 * 112);
  /* A second convolution gets its data gradient too: twice the forward's FLOPs. */
  int y2 = sim_graph_conv2d(g, "conv2", y, &p);
  int op2 = op_of(g, y2);
  cr_assert_float_eq(sim_graph_op_backward_flops(g, op2),
                     2 * sim_graph_op_forward_flops(g, op2), 1);
  /* b, cout, h, w, cin, kh, kw without groups; the kernel window is not split. */
  cr_assert_eq(sim_graph_op_n_dims(g, op), 7);
  cr_assert_not(sim_graph_op_dim_splittable(g, op, dim_index(g, op, "kh")));
  cr_assert_eq(sim_graph_op_dim_role(g, op, dim_index(g, op, "cin")), SIM_ROLE_REDUCTION);
  cr_assert_eq(sim_graph_op_dim_role(g, op, dim_index(g, op, "cout")), SIM_ROLE_PARAMETER);
  assert_full_projections(g);
}

Test(conv2d, halo_rows)
{
  g_autoptr(SimGraph) g = sim_graph_new("t");
  /* A 3x3 stride-1 pad-1 convolution over 56 rows, split in two along h: shard 0 makes
   * rows [0, 28) from input rows [0, 29), shard 1 rows [28, 56) from [27, 56): one halo
   * row each. */
  int x = INPUT(g, "x", SIM_DTYPE_FP32, 8, 64, 56, 56);
  SimConvParams p = sim_conv_params(64, 3, 3);
  p.padding[0] = p.padding[1] = 1;
  int y = sim_graph_conv2d(g, "c", x, &p);
  ASSERT_SHAPE(g, y, 8, 64, 56, 56);
  int op = op_of(g, y), h = dim_index(g, op, "h");
  int64_t lo[8], hi[8];
  full_range(g, op, lo, hi);
  hi[h] = 28;
  SimRegion r0 = project(g, op, 'x', 0, lo, hi);
  assert_range(&r0, 2, 0, 29);
  assert_range(&r0, 3, 0, 56);
  lo[h] = 28;
  hi[h] = 56;
  SimRegion r1 = project(g, op, 'x', 0, lo, hi);
  assert_range(&r1, 2, 27, 56);
  /* From extents alone, the element count is that of an interior shard, halo rows on
   * both sides: 28 + 2 rows, 8 * 64 * 30 * 56 elements. */
  int64_t ext[8];
  for (int d = 0; d < sim_graph_op_n_dims(g, op); d++)
    ext[d] = hi[d] - lo[d];
  const SimOp *o = sim_graph_op_get(g, op);
  cr_assert_eq(sim_map_numel(sim_space_input_map(o, 0), &o->in_shape[0], ext), 8 * 64 * 30 * 56);

  /* Stride 2, 3x3, pad 1 over 56 rows gives 28; output rows [14, 28) read input rows
   * 14*2 - 1 = 27 up to 27*2 + 2 - 1 = 55, i.e. [27, 56). */
  p.stride[0] = p.stride[1] = 2;
  int y2 = sim_graph_conv2d(g, "c2", x, &p);
  ASSERT_SHAPE(g, y2, 8, 64, 28, 28);
  op = op_of(g, y2);
  full_range(g, op, lo, hi);
  lo[h] = 14;
  SimRegion r2 = project(g, op, 'x', 0, lo, hi);
  assert_range(&r2, 2, 27, 56);
}

Test(conv2d, dilation_groups)
{
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int x = INPUT(g, "x", SIM_DTYPE_FP32, 4, 32, 32, 32);
  /* 3x3 with dilation 2 spans 5 rows; padding 2 keeps 32: (32 + 4 - 4 - 1) / 1 + 1. */
  SimConvParams p = sim_conv_params(16, 3, 3);
  p.dilation[0] = p.dilation[1] = 2;
  p.padding[0] = p.padding[1] = 2;
  ASSERT_SHAPE(g, sim_graph_conv2d(g, "dil", x, &p), 4, 16, 32, 32);

  /* 4 groups of 8 input and 16 output channels: weight [64, 8, 3, 3], FLOPs divided by
   * the groups: 2 * 4 * 32 * 32 * 64 * 8 * 9. */
  p = sim_conv_params(64, 3, 3);
  p.padding[0] = p.padding[1] = 1;
  p.groups = 4;
  p.bias = TRUE;
  int y = sim_graph_conv2d(g, "grp", x, &p);
  ASSERT_SHAPE(g, y, 4, 64, 32, 32);
  int op = op_of(g, y);
  SimShape ws = sim_graph_op_weight_shape(g, op, 0);
  cr_assert_eq(ws.dims[1], 8);
  cr_assert_eq(sim_graph_op_n_params(g, op), 64 * 8 * 9 + 64);
  cr_assert_float_eq(sim_graph_op_forward_flops(g, op), 2.0 * 4 * 32 * 32 * 64 * 8 * 9, 1);
  /* With groups there is a g dimension: 8 in all.  Group 1 of 4 reads input channels
   * [8, 16), writes output channels [16, 32) and owns weight rows [16, 32). */
  cr_assert_eq(sim_graph_op_n_dims(g, op), 8);
  int gd = dim_index(g, op, "g");
  cr_assert_eq(sim_graph_op_dim_size(g, op, gd), 4);
  cr_assert_eq(sim_graph_op_dim_size(g, op, dim_index(g, op, "cout")), 16);
  int64_t lo[8], hi[8];
  full_range(g, op, lo, hi);
  lo[gd] = 1;
  hi[gd] = 2;
  SimRegion rx = project(g, op, 'x', 0, lo, hi), rw = project(g, op, 'w', 0, lo, hi);
  SimRegion rb = project(g, op, 'w', 1, lo, hi), ry = project(g, op, 'y', 0, lo, hi);
  assert_range(&rx, 1, 8, 16);
  assert_range(&rw, 0, 16, 32);
  assert_range(&rw, 1, 0, 8);
  assert_range(&rb, 0, 16, 32);
  assert_range(&ry, 1, 16, 32);
  assert_full_projections(g);

  /* Depthwise: groups = channels, one filter per channel. */
  p = sim_conv_params(32, 3, 3);
  p.groups = 32;
  int dw = sim_graph_conv2d(g, "dw", x, &p);
  ASSERT_SHAPE(g, dw, 4, 32, 30, 30);
  cr_assert_eq(sim_graph_op_n_params(g, op_of(g, dw)), 32 * 9);
}

Test(conv2d, rejections)
{
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int x = INPUT(g, "x", SIM_DTYPE_FP32, 4, 30, 32, 32);
  SimConvParams p = sim_conv_params(64, 3, 3);
  p.groups = 4;
  sim_graph_conv2d(g, "g4", x, &p);
  assert_error(g, "op 'g4' (conv2d)", "multiples of the groups");

  g_autoptr(SimGraph) g2 = sim_graph_new("t");
  x = INPUT(g2, "x", SIM_DTYPE_FP32, 4, 3, 4, 4);
  p = sim_conv_params(8, 7, 7);
  sim_graph_conv2d(g2, "big", x, &p);
  assert_error(g2, "op 'big' (conv2d)", "does not fit");

  g_autoptr(SimGraph) g3 = sim_graph_new("t");
  x = INPUT(g3, "x", SIM_DTYPE_FP32, 4, 3, 32);
  p = sim_conv_params(8, 3, 3);
  sim_graph_conv2d(g3, "rank", x, &p);
  assert_error(g3, "op 'rank' (conv2d)", "expected 4 dimensions");
}

/* ---------------------------------------------------------------------------------- */
/* Pool2d                                                                              */

Test(pool2d, shapes_saved_halo)
{
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int x = INPUT(g, "x", SIM_DTYPE_FP32, 8, 64, 112, 112);
  /* ResNet's 3x3 stride-2 pad-1 max pool: floor((112 + 2 - 3) / 2) + 1 = 56. */
  int y = sim_graph_pool2d(g, "pool", x, SIM_POOL_MAX, 3, 3, 2, 2, 1, 1);
  ASSERT_SHAPE(g, y, 8, 64, 56, 56);
  int op = op_of(g, y);
  /* Max pooling keeps an int64 index per output. */
  cr_assert_eq(sim_op_class(SIM_OP_POOL2D)->saved_bytes(sim_graph_op_get(g, op), NULL),
               8 * 8 * 64 * 56 * 56);
  /* 9 comparisons per output. */
  cr_assert_float_eq(sim_graph_op_forward_flops(g, op), 9.0 * 8 * 64 * 56 * 56, 1);
  cr_assert_eq(sim_graph_op_dim_role(g, op, 1), SIM_ROLE_PARAMETER);
  int64_t lo[6], hi[6];
  full_range(g, op, lo, hi);
  lo[2] = 28;
  SimRegion r = project(g, op, 'x', 0, lo, hi);
  /* Rows 28*2 - 1 = 55 up to 55*2 + 2 - 1 = 111. */
  assert_range(&r, 2, 55, 112);

  /* Average pooling with the stride defaulting to the window: 112 / 2 = 56; it keeps
   * nothing for backward. */
  SimAttrs *a = sim_attrs_new(SIM_OP_POOL2D);
  cr_assert(sim_attrs_set_string(a, "kind", "avg", NULL));
  cr_assert(sim_attrs_set_int(a, "kernel", 2, NULL));
  g_autoptr(GError) error = NULL;
  int aop = sim_graph_add_op(g, SIM_OP_POOL2D, "avg", 1, &x, a, &error);
  sim_attrs_free(a);
  cr_assert(aop >= 0, "%s", error ? error->message : "");
  ASSERT_SHAPE(g, sim_graph_op_output(g, aop, 0), 8, 64, 56, 56);
  cr_assert_eq(sim_op_class(SIM_OP_POOL2D)->saved_bytes(sim_graph_op_get(g, aop), NULL), 0);
}

Test(pool2d, rejections)
{
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int x = INPUT(g, "x", SIM_DTYPE_FP32, 8, 64, 8, 8);
  sim_graph_pool2d(g, "p", x, SIM_POOL_MAX, 2, 2, 2, 2, 2, 2);
  assert_error(g, "op 'p' (pool2d)", "more than half");

  g_autoptr(SimGraph) g2 = sim_graph_new("t");
  x = INPUT(g2, "x", SIM_DTYPE_FP32, 8, 64, 2, 2);
  sim_graph_pool2d(g2, "p", x, SIM_POOL_AVG, 3, 3, 1, 1, 0, 0);
  assert_error(g2, "op 'p' (pool2d)", "does not fit");
}

/* ---------------------------------------------------------------------------------- */
/* Normalization                                                                       */

Test(batchnorm, shape_params_space)
{
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int x = INPUT(g, "x", SIM_DTYPE_FP32, 8, 64, 56, 56);
  int y = sim_graph_batchnorm(g, "bn", x, TRUE);
  ASSERT_SHAPE(g, y, 8, 64, 56, 56);
  int op = op_of(g, y);
  /* gamma and beta per channel. */
  cr_assert_eq(sim_graph_op_n_params(g, op), 128);
  cr_assert_eq(sim_graph_op_dim_role(g, op, 1), SIM_ROLE_PARAMETER);
  cr_assert_str_eq(sim_graph_op_dim_name(g, op, 2), "h");
  /* A channel split owns its gamma and beta. */
  int64_t lo[4], hi[4];
  full_range(g, op, lo, hi);
  lo[1] = 32;
  SimRegion r = project(g, op, 'w', 0, lo, hi);
  assert_range(&r, 0, 32, 64);
  /* Saved: x, y (for relu's mask) and two fp32 statistics per channel. */
  int64_t n = 8 * 64 * 56 * 56;
  cr_assert_eq(sim_op_class(SIM_OP_BATCHNORM)->saved_bytes(sim_graph_op_get(g, op), NULL),
               n * 4 * 2 + 64 * 8);
  cr_assert(sim_graph_op_forward_flops(g, op) > 0);
  /* Memory bound: no GEMM. */
  cr_assert_float_eq(pass_flops(g, y, SIM_PASS_FORWARD, TRUE), 0, 1e-9);

  g_autoptr(SimGraph) g2 = sim_graph_new("t");
  int ids = INPUT(g2, "ids", SIM_DTYPE_INT64, 8, 64, 4, 4);
  sim_graph_batchnorm(g2, "bn", ids, FALSE);
  assert_error(g2, "op 'bn' (batchnorm)", "not floating point");
}

Test(layernorm, shape_params_space)
{
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int x = INPUT(g, "x", SIM_DTYPE_FP16, 4, 512, 1024);
  int y = sim_graph_layernorm(g, "ln", x);
  ASSERT_SHAPE(g, y, 4, 512, 1024);
  int op = op_of(g, y);
  cr_assert_eq(sim_graph_op_n_params(g, op), 2048);
  /* b, s split freely; the normalized d does not. */
  cr_assert(sim_graph_op_dim_splittable(g, op, 1));
  cr_assert_not(sim_graph_op_dim_splittable(g, op, 2));
  /* Saved: x in fp16 and an fp32 mean and rstd per row. */
  cr_assert_eq(sim_op_class(SIM_OP_LAYERNORM)->saved_bytes(sim_graph_op_get(g, op), NULL),
               4 * 512 * 1024 * 2 + 4 * 512 * 8);

  g_autoptr(SimGraph) g2 = sim_graph_new("t");
  x = INPUT(g2, "x", SIM_DTYPE_FP16, 4);
  sim_graph_layernorm(g2, "ln", x);
  assert_error(g2, "op 'ln' (layernorm)", "expected 2 to 4 dimensions");
}

/* ---------------------------------------------------------------------------------- */
/* Embedding                                                                           */

Test(embedding, tokens_and_vocab_parallel)
{
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int ids = INPUT(g, "ids", SIM_DTYPE_INT32, 8, 128);
  int y = sim_graph_embedding(g, "emb", ids, 50000, 768);
  ASSERT_SHAPE(g, y, 8, 128, 768);
  cr_assert_eq(sim_graph_tensor_dtype(g, y), SIM_DTYPE_FP32);
  int op = op_of(g, y);
  cr_assert_eq(sim_graph_op_n_params(g, op), 50000 * 768);
  /* b, s, d, v; the output is not indexed by v: splitting the vocabulary sums partial
   * outputs. */
  int v = dim_index(g, op, "v");
  cr_assert_eq(sim_graph_op_dim_role(g, op, v), SIM_ROLE_REDUCTION);
  cr_assert_not(indexed_by(g, op, 'y', 0, v));
  int64_t lo[4], hi[4];
  full_range(g, op, lo, hi);
  hi[v] = 25000;
  SimRegion w = project(g, op, 'w', 0, lo, hi);
  assert_range(&w, 0, 0, 25000);
  assert_range(&w, 1, 0, 768);
  /* One gather kernel; it reads the rows and writes the output (fp32), and reads the
   * int32 ids: 2 * 8*128*768*4 + 8*128*4 bytes. */
  SimWork work;
  sim_graph_op_work(g, op, NULL, SIM_PASS_FORWARD, &work);
  cr_assert_eq(work.n, 1);
  cr_assert_eq(work.k[0].kind, SIM_KERNEL_GATHER);
  cr_assert_float_eq(work.k[0].bytes, 2.0 * 8 * 128 * 768 * 4 + 8 * 128 * 4, 1);
  /* Only the ids are kept. */
  cr_assert_eq(sim_op_class(SIM_OP_EMBEDDING)->saved_bytes(sim_graph_op_get(g, op), NULL),
               8 * 128 * 4);
}

Test(embedding, bags)
{
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int ids = INPUT(g, "ids", SIM_DTYPE_INT64, 64, 20);
  g_autoptr(SimAttrs) a = sim_attrs_new(SIM_OP_EMBEDDING);
  cr_assert(sim_attrs_set_int(a, "vocab", 1000, NULL));
  cr_assert(sim_attrs_set_int(a, "dim", 16, NULL));
  cr_assert(sim_attrs_set_string(a, "bags", "true", NULL));
  g_autoptr(GError) error = NULL;
  int op = sim_graph_add_op(g, SIM_OP_EMBEDDING, "bag", 1, &ids, a, &error);
  cr_assert(op >= 0, "%s", error ? error->message : "");
  /* 20 lookups per sample summed into one row: [64, 16]; the bag dimension n is a
   * reduction. */
  ASSERT_SHAPE(g, sim_graph_op_output(g, op, 0), 64, 16);
  int n = dim_index(g, op, "n");
  cr_assert_eq(sim_graph_op_dim_role(g, op, n), SIM_ROLE_REDUCTION);
  /* The sums: 64 * 20 * 16 additions. */
  cr_assert_float_eq(sim_graph_op_forward_flops(g, op), 64.0 * 20 * 16, 1e-9);
}

Test(embedding, sparse_gradients_touch_only_the_looked_up_rows)
{
  /* 4096 lookups of 128-wide rows in a table of 10 M rows, fp32. */
  int64_t V = 10000000, D = 128, B = 4096;
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int ids = INPUT(g, "ids", SIM_DTYPE_INT64, B, 1);
  g_autoptr(SimAttrs) at = sim_attrs_new(SIM_OP_EMBEDDING);
  cr_assert(sim_attrs_set_int(at, "vocab", V, NULL));
  cr_assert(sim_attrs_set_int(at, "dim", D, NULL));
  GError *err = NULL;
  int dense = sim_graph_add_op(g, SIM_OP_EMBEDDING, "dense", 1, &ids, at, &err);
  cr_assert(dense >= 0, "%s", err ? err->message : "");
  cr_assert(sim_attrs_set_int(at, "sparse", 1, NULL));
  int sparse = sim_graph_add_op(g, SIM_OP_EMBEDDING, "sparse", 1, &ids, at, NULL);
  cr_assert(dense >= 0 && sparse >= 0);
  SimWork w;
  /* Dense: the whole table's gradient zero-filled (10 M x 128 x 4 B), then the lookups
   * added in. */
  sim_graph_op_work(g, dense, NULL, SIM_PASS_BACKWARD, &w);
  cr_assert_eq(w.n, 2);
  cr_assert_float_eq(w.k[0].bytes, (double)V * D * 4, 1);
  /* Sparse: the ids (8 B), dy (4096 x 128 x 4 B) and the gradient rows with their ids. */
  sim_graph_op_work(g, sparse, NULL, SIM_PASS_BACKWARD, &w);
  cr_assert_eq(w.n, 1);
  cr_assert_float_eq(w.k[0].bytes, B * 8.0 + B * D * 4.0 + B * (D * 4.0 + 8), 1);
  /* The update: dense steps all 1.28 G parameters (Adam, 8 accesses of 4 B); sparse
   * coalesces the 4096 ids and steps their rows (SGD, 3 accesses of 4 B). */
  sim_graph_op_work(g, dense, NULL, SIM_PASS_UPDATE, &w);
  cr_assert_eq(w.n, 1);
  cr_assert_float_eq(w.k[0].bytes, (double)V * D * 32, 1);
  sim_graph_op_work(g, sparse, NULL, SIM_PASS_UPDATE, &w);
  cr_assert_eq(w.n, 2);
  cr_assert_float_eq(w.k[1].bytes, (double)B * D * 12, 1);
}

Test(embedding, rejections)
{
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int x = INPUT(g, "x", SIM_DTYPE_FP32, 8, 128);
  sim_graph_embedding(g, "emb", x, 100, 16);
  assert_error(g, "op 'emb' (embedding)", "not int32 or int64");

  g_autoptr(SimGraph) g2 = sim_graph_new("t");
  int ids = INPUT(g2, "ids", SIM_DTYPE_INT32, 8, 128);
  sim_graph_embedding(g2, "emb", ids, 0, 16);
  assert_error(g2, "op 'emb' (embedding)", "must be positive");
}

/* ---------------------------------------------------------------------------------- */
/* Element-wise                                                                        */

Test(unary, flops_and_saved)
{
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int x = INPUT(g, "x", SIM_DTYPE_FP16, 4, 256, 1024);
  int64_t n = 4 * 256 * 1024;
  int gl = sim_graph_unary(g, "gelu", x, SIM_UNARY_GELU);
  ASSERT_SHAPE(g, gl, 4, 256, 1024);
  /* GELU: 8 operations per element forward; reads and writes fp16. */
  int op = op_of(g, gl);
  cr_assert_float_eq(sim_graph_op_forward_flops(g, op), 8.0 * n, 1e-6);
  cr_assert_float_eq(sim_graph_op_bytes(g, op), 2.0 * n * 2, 1e-6);
  /* relu keeps its output; identity is free and keeps nothing. */
  int r = sim_graph_unary(g, "relu", x, SIM_UNARY_RELU);
  cr_assert_eq(sim_op_class(SIM_OP_UNARY)->saved_bytes(sim_graph_op_get(g, op_of(g, r)), NULL),
               n * 2);
  int id = sim_graph_unary(g, "id", x, SIM_UNARY_IDENTITY);
  cr_assert_float_eq(sim_graph_op_forward_flops(g, op_of(g, id)), 0, 1e-9);
  cr_assert_eq(sim_op_class(SIM_OP_UNARY)->saved_bytes(sim_graph_op_get(g, op_of(g, id)), NULL),
               0);
  /* Every dimension splits. */
  for (int d = 0; d < 3; d++)
    cr_assert(sim_graph_op_dim_splittable(g, op, d));
  assert_full_projections(g);
}

Test(binary, broadcasting)
{
  g_autoptr(SimGraph) g = sim_graph_new("t");
  /* [8, 1, 16] + [4, 16] -> [8, 4, 16]. */
  int a = INPUT(g, "a", SIM_DTYPE_FP32, 8, 1, 16);
  int b = INPUT(g, "b", SIM_DTYPE_FP32, 4, 16);
  int c = sim_graph_binary(g, "add", a, b, SIM_BINARY_ADD);
  ASSERT_SHAPE(g, c, 8, 4, 16);
  int op = op_of(g, c);
  const SimOp *o = sim_graph_op_get(g, op);
  /* a's middle dimension stretches from 1: read whole; b's dimensions are the output's
   * last two. */
  cr_assert_eq(sim_space_input_map(o, 0)->map[0].dim, 0);
  cr_assert_eq(sim_space_input_map(o, 0)->map[1].dim, -1);
  cr_assert_eq(sim_space_input_map(o, 0)->map[2].dim, 2);
  cr_assert_eq(sim_space_input_map(o, 1)->map[0].dim, 1);
  cr_assert_eq(sim_space_input_map(o, 1)->map[1].dim, 2);
  /* A shard of the batch reads all of b. */
  int64_t lo[3], hi[3];
  full_range(g, op, lo, hi);
  hi[0] = 4;
  SimRegion rb = project(g, op, 'x', 1, lo, hi);
  cr_assert_eq(sim_region_volume(&rb), 64);
  /* One operation per output; bytes: a (128) + b (64) + out (512) fp32 values. */
  cr_assert_float_eq(sim_graph_op_forward_flops(g, op), 512, 1e-9);
  cr_assert_float_eq(sim_graph_op_bytes(g, op), (128.0 + 64 + 512) * 4, 1e-9);
  /* A bias vector [d] against [b, s, d]. */
  int x = INPUT(g, "x", SIM_DTYPE_FP32, 2, 3, 5);
  int bias = INPUT(g, "bias", SIM_DTYPE_FP32, 5);
  ASSERT_SHAPE(g, sim_graph_binary(g, "mul", x, bias, SIM_BINARY_MUL), 2, 3, 5);
  /* mul keeps both inputs: 30 + 5 values. */
  int m = sim_graph_tensor_producer(g, sim_graph_n_tensors(g) - 1);
  cr_assert_eq(sim_op_class(SIM_OP_BINARY)->saved_bytes(sim_graph_op_get(g, m), NULL), 35 * 4);
}

Test(binary, rejects_mismatch)
{
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int a = INPUT(g, "a", SIM_DTYPE_FP32, 8, 3, 16);
  int b = INPUT(g, "b", SIM_DTYPE_FP32, 4, 16);
  sim_graph_binary(g, "add", a, b, SIM_BINARY_ADD);
  assert_error(g, "op 'add' (binary): shapes [8, 3, 16] and [4, 16] do not broadcast", "3 meets 4");
}

Test(softmax, last_dim_whole)
{
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int x = INPUT(g, "x", SIM_DTYPE_FP32, 4, 8, 64, 64);
  int y = sim_graph_softmax(g, "sm", x);
  ASSERT_SHAPE(g, y, 4, 8, 64, 64);
  int op = op_of(g, y);
  cr_assert(sim_graph_op_dim_splittable(g, op, 1));
  cr_assert_not(sim_graph_op_dim_splittable(g, op, 3));
  /* It keeps its output. */
  cr_assert_eq(sim_op_class(SIM_OP_SOFTMAX)->saved_bytes(sim_graph_op_get(g, op), NULL),
               4 * 8 * 64 * 64 * 4);

  g_autoptr(SimGraph) g2 = sim_graph_new("t");
  x = INPUT(g2, "x", SIM_DTYPE_FP32, 4);
  sim_graph_softmax(g2, "sm", x);
  assert_error(g2, "op 'sm' (softmax)", "expected 2 to 6 dimensions");
}

Test(dropout, mask_and_bounds)
{
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int x = INPUT(g, "x", SIM_DTYPE_FP16, 4, 100);
  int y = sim_graph_dropout(g, "drop", x, 0.1);
  ASSERT_SHAPE(g, y, 4, 100);
  /* A one-byte mask per element; forward reads x, writes y and the mask. */
  int op = op_of(g, y);
  cr_assert_eq(sim_op_class(SIM_OP_DROPOUT)->saved_bytes(sim_graph_op_get(g, op), NULL), 400);
  cr_assert_float_eq(sim_graph_op_bytes(g, op), 400.0 * 2 * 2 + 400, 1e-9);
  /* p = 0 passes through. */
  int z = sim_graph_dropout(g, "none", x, 0.0);
  cr_assert_float_eq(sim_graph_op_bytes(g, op_of(g, z)), 0, 1e-9);

  g_autoptr(SimGraph) g2 = sim_graph_new("t");
  x = INPUT(g2, "x", SIM_DTYPE_FP16, 4, 100);
  sim_graph_dropout(g2, "drop", x, 1.0);
  assert_error(g2, "op 'drop' (dropout)", "outside [0, 1)");
}

/* ---------------------------------------------------------------------------------- */
/* Shape operators                                                                     */

Test(concat, offsets)
{
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int a = INPUT(g, "a", SIM_DTYPE_FP32, 2, 4, 8);
  int b = INPUT(g, "b", SIM_DTYPE_FP32, 2, 6, 8);
  int c = sim_graph_concat(g, "cat", -2, 2, (int[]){ a, b });
  ASSERT_SHAPE(g, c, 2, 10, 8);
  int op = op_of(g, c);
  /* The negative axis is stored resolved. */
  cr_assert_eq(sim_op_attr_int(sim_graph_op_get(g, op), "axis"), 1);
  /* Output rows [2, 6) come from a's rows [2, 4) and b's rows [0, 2). */
  int64_t lo[3], hi[3];
  full_range(g, op, lo, hi);
  lo[1] = 2;
  hi[1] = 6;
  SimRegion ra = project(g, op, 'x', 0, lo, hi), rb = project(g, op, 'x', 1, lo, hi);
  assert_range(&ra, 1, 2, 4);
  assert_range(&rb, 1, 0, 2);
  /* Rows [6, 10) are all b's: a contributes nothing. */
  lo[1] = 6;
  hi[1] = 10;
  ra = project(g, op, 'x', 0, lo, hi);
  cr_assert_eq(sim_region_volume(&ra), 0);
  assert_full_projections(g);
}

Test(concat, rejections)
{
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int a = INPUT(g, "a", SIM_DTYPE_FP32, 2, 4, 8);
  int b = INPUT(g, "b", SIM_DTYPE_FP32, 2, 6, 9);
  sim_graph_concat(g, "cat", 1, 2, (int[]){ a, b });
  assert_error(g, "op 'cat' (concat): input 1 is [2, 6, 9]", "except along axis 1");

  g_autoptr(SimGraph) g2 = sim_graph_new("t");
  a = INPUT(g2, "a", SIM_DTYPE_FP32, 2, 4);
  sim_graph_concat(g2, "cat", 0, 2, (int[]){ a, a });
  assert_error(g2, "op 'cat' (concat)", "axis 0 is the batch");
}

Test(split, parts)
{
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int x = INPUT(g, "x", SIM_DTYPE_FP16, 4, 16, 3072);
  int outs[3];
  int first = sim_graph_split(g, "qkv", x, 2, 3, (int64_t[]){ 1024, 1024, 1024 }, outs);
  cr_assert_eq(first, outs[0]);
  for (int j = 0; j < 3; j++)
    ASSERT_SHAPE(g, outs[j], 4, 16, 1024);
  int op = op_of(g, first);
  cr_assert_eq(sim_graph_op_n_outputs(g, op), 3);
  cr_assert_str_eq(sim_graph_tensor_name(g, outs[2]), "qkv:2");
  /* The iteration space is the input's; input columns [1000, 2100) touch part 0 in
   * [1000, 1024), part 1 whole and part 2 in [0, 52). */
  int64_t lo[3], hi[3];
  full_range(g, op, lo, hi);
  lo[2] = 1000;
  hi[2] = 2100;
  SimRegion r0 = project(g, op, 'y', 0, lo, hi), r1 = project(g, op, 'y', 1, lo, hi);
  SimRegion r2 = project(g, op, 'y', 2, lo, hi);
  assert_range(&r0, 2, 1000, 1024);
  assert_range(&r1, 2, 0, 1024);
  assert_range(&r2, 2, 0, 52);
  /* A view forward, a concatenation of gradients backward. */
  cr_assert_float_eq(sim_graph_op_bytes(g, op), 0, 1e-9);

  g_autoptr(SimGraph) g2 = sim_graph_new("t");
  x = INPUT(g2, "x", SIM_DTYPE_FP16, 4, 16, 3072);
  sim_graph_split(g2, "bad", x, 2, 2, (int64_t[]){ 1024, 1024 }, NULL);
  assert_error(g2, "op 'bad' (split): the sizes of the 2 parts add up to 2048", "3072");
}

Test(reshape, maps_and_inference)
{
  g_autoptr(SimGraph) g = sim_graph_new("t");
  /* Split heads: [b, s, h*e] -> [b, s, h, e]; b and s map one to one, h and e are read
   * from the whole last input dimension and are not split. */
  int x = INPUT(g, "x", SIM_DTYPE_FP16, 4, 128, 768);
  int y = sim_graph_reshape(g, "heads", x, 4, (int64_t[]){ 4, 128, 12, -1 });
  ASSERT_SHAPE(g, y, 4, 128, 12, 64);
  int op = op_of(g, y);
  const SimOp *o = sim_graph_op_get(g, op);
  cr_assert_eq(o->attrs[0].i[3], 64);
  cr_assert(sim_graph_op_dim_splittable(g, op, 0));
  cr_assert(sim_graph_op_dim_splittable(g, op, 1));
  cr_assert_not(sim_graph_op_dim_splittable(g, op, 2));
  cr_assert_not(sim_graph_op_dim_splittable(g, op, 3));
  cr_assert_eq(sim_space_input_map(o, 0)->map[1].dim, 1);
  cr_assert_eq(sim_space_input_map(o, 0)->map[2].dim, -1);
  /* A view: no work. */
  cr_assert_float_eq(sim_graph_op_bytes(g, op), 0, 1e-9);

  /* Flatten [N, C, H, W] -> [N, C*H*W]. */
  int f = INPUT(g, "f", SIM_DTYPE_FP32, 8, 512, 7, 7);
  ASSERT_SHAPE(g, sim_graph_reshape(g, "flat", f, 2, (int64_t[]){ 8, -1 }), 8, 25088);
  /* Folding the batch into rows leaves a sample dimension that does not split. */
  int fold = sim_graph_reshape(g, "fold", x, 2, (int64_t[]){ -1, 768 });
  ASSERT_SHAPE(g, fold, 512, 768);
  cr_assert_not(sim_graph_op_dim_splittable(g, op_of(g, fold), 0));
  cr_assert(sim_graph_op_dim_splittable(g, op_of(g, fold), 1));

  g_autoptr(SimGraph) g2 = sim_graph_new("t");
  x = INPUT(g2, "x", SIM_DTYPE_FP16, 4, 10);
  sim_graph_reshape(g2, "bad", x, 2, (int64_t[]){ 3, -1 });
  assert_error(g2, "op 'bad' (reshape): cannot reshape [4, 10] (40 elements) into [3, -1]", NULL);
}

Test(transpose, permutation)
{
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int x = INPUT(g, "x", SIM_DTYPE_FP16, 4, 128, 12, 64);
  int y = sim_graph_transpose(g, "t", x, (int[]){ 0, 2, 1, 3 });
  ASSERT_SHAPE(g, y, 4, 12, 128, 64);
  int op = op_of(g, y);
  /* Output (iteration) dimension 1, the heads, indexes input dimension 2. */
  int64_t lo[4], hi[4];
  full_range(g, op, lo, hi);
  hi[1] = 6;
  SimRegion r = project(g, op, 'x', 0, lo, hi);
  assert_range(&r, 2, 0, 6);
  assert_range(&r, 1, 0, 128);
  /* A copy: reads and writes every fp16 element. */
  double n = 4.0 * 128 * 12 * 64;
  cr_assert_float_eq(sim_graph_op_bytes(g, op), 2 * n * 2, 1e-6);
  /* Moving the batch keeps dimension 0 from splitting. */
  int z = sim_graph_transpose(g, "t2", x, (int[]){ 1, 0, 2, 3 });
  cr_assert_not(sim_graph_op_dim_splittable(g, op_of(g, z), 0));

  g_autoptr(SimGraph) g2 = sim_graph_new("t");
  x = INPUT(g2, "x", SIM_DTYPE_FP16, 4, 8, 2);
  sim_graph_transpose(g2, "bad", x, (int[]){ 0, 1, 1 });
  assert_error(g2, "op 'bad' (transpose)", "must order 0..2");
}

/* ---------------------------------------------------------------------------------- */
/* Attention                                                                           */

Test(attention, gpt_layer)
{
  /* GPT-2 small: b 4, s 1024, d 768, 12 heads of 64, causal, biases, no dropout. */
  int64_t b = 4, s = 1024, d = 768, H = 12, e = 64;
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int x = INPUT(g, "x", SIM_DTYPE_FP16, b, s, d);
  int y = sim_graph_attention(g, "attn", x, x, x, (int)H, e, TRUE);
  ASSERT_SHAPE(g, y, 4, 1024, 768);
  int op = op_of(g, y);
  /* 4 d^2 weights and 4 d biases. */
  cr_assert_eq(sim_graph_op_n_params(g, op), 4 * d * d + 4 * d);
  cr_assert_eq(sim_graph_op_n_weights(g, op), 8);
  /* Forward GEMMs: QKV 2 b s d 3d, scores and context 2 * 2 b H s^2 e, output 2 b s d^2:
   * 8 b s d^2 + 4 b s^2 d (the attention part of Narayanan et al.'s 24 b s h^2 +
   * 4 b s^2 h per layer; the MLP makes the other 16 b s h^2). */
  double gemm = 8.0 * b * s * d * d + 4.0 * b * s * s * d;
  cr_assert_float_eq(pass_flops(g, y, SIM_PASS_FORWARD, TRUE), gemm, 1);
  cr_assert_float_eq(pass_flops(g, y, SIM_PASS_BACKWARD, TRUE), 2 * gemm, 1);
  /* Plus softmax: 10 operations per score (b H s^2), 5 in backward. */
  double scores = (double)b * H * s * s;
  cr_assert_float_eq(sim_graph_op_forward_flops(g, op), gemm + 10 * scores, 1);
  cr_assert_float_eq(sim_graph_op_backward_flops(g, op), 2 * gemm + 5 * scores, 1);
  /* Self-attention over the whole sequence projects with one fused GEMM. */
  SimWork w;
  sim_graph_op_work(g, op, NULL, SIM_PASS_FORWARD, &w);
  cr_assert_eq(w.k[0].n, 3 * d);
  cr_assert_leq(w.n, SIM_MAX_KERNELS);
}

Test(attention, head_and_sequence_splits)
{
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int q = INPUT(g, "q", SIM_DTYPE_FP16, 2, 64, 256);
  int kv = INPUT(g, "kv", SIM_DTYPE_FP16, 2, 32, 256);
  int y = sim_graph_attention(g, "cross", q, kv, kv, 8, 32, FALSE);
  ASSERT_SHAPE(g, y, 2, 64, 256);
  int op = op_of(g, y);
  int h = dim_index(g, op, "h"), s = dim_index(g, op, "s");
  cr_assert_eq(sim_graph_op_dim_role(g, op, h), SIM_ROLE_PARAMETER);
  cr_assert_not(sim_graph_op_dim_splittable(g, op, dim_index(g, op, "e")));
  cr_assert_not(sim_graph_op_dim_splittable(g, op, dim_index(g, op, "d")));
  /* Heads [4, 8): Wq's columns [128, 256), Wo's rows [128, 256), the Q bias [128, 256);
   * the output is not indexed by h (row-parallel output projection: partial sums). */
  int64_t lo[5], hi[5];
  full_range(g, op, lo, hi);
  lo[h] = 4;
  SimRegion wq = project(g, op, 'w', 0, lo, hi), wo = project(g, op, 'w', 3, lo, hi);
  SimRegion bq = project(g, op, 'w', 4, lo, hi);
  assert_range(&wq, 0, 0, 256);
  assert_range(&wq, 1, 128, 256);
  assert_range(&wo, 0, 128, 256);
  assert_range(&bq, 0, 128, 256);
  cr_assert_not(indexed_by(g, op, 'y', 0, h));
  /* Query rows [0, 32): q and the output halve, k and v are read whole. */
  full_range(g, op, lo, hi);
  hi[s] = 32;
  SimRegion rq = project(g, op, 'x', 0, lo, hi), rk = project(g, op, 'x', 1, lo, hi);
  assert_range(&rq, 1, 0, 32);
  assert_range(&rk, 1, 0, 32);
  cr_assert_eq(sim_region_volume(&rk), 2 * 32 * 256);
  /* Cross-attention, k = v: Q GEMM plus one KV GEMM of width 2 * 256. */
  SimWork w;
  sim_graph_op_work(g, op, NULL, SIM_PASS_FORWARD, &w);
  cr_assert_eq(w.k[1].n, 512);
  cr_assert_eq(w.k[1].m, 2 * 32);
  /* Backward stays within the kernel budget even with dropout and three distinct
   * inputs. */
  int v = INPUT(g, "v", SIM_DTYPE_FP16, 2, 32, 256);
  g_autoptr(SimAttrs) a = sim_attrs_new(SIM_OP_ATTENTION);
  cr_assert(sim_attrs_set_int(a, "heads", 8, NULL));
  cr_assert(sim_attrs_set_int(a, "head_dim", 32, NULL));
  cr_assert(sim_attrs_set_float(a, "dropout", 0.1, NULL));
  int op3 = sim_graph_add_op(g, SIM_OP_ATTENTION, "three", 3, (int[]){ q, kv, v }, a, NULL);
  cr_assert(op3 >= 0);
  sim_graph_op_work(g, op3, NULL, SIM_PASS_BACKWARD, &w);
  cr_assert_eq(w.n, 12);
}

Test(attention, selective_recomputation)
{
  /* Korthikanti et al. 2022: with dropout, attention keeps per layer (fp16) the input
   * 2sbh, Q, K, V 6sbh, the context 2sbh, and the score-sized softmax output 2as^2b,
   * dropout mask as^2b and dropout output 2as^2b.  Selective recomputation keeps the
   * sbh-sized ones only. */
  int64_t b = 2, s = 512, hdim = 1024, a = 16;
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int x = INPUT(g, "x", SIM_DTYPE_FP16, b, s, hdim);
  g_autoptr(SimAttrs) at = sim_attrs_new(SIM_OP_ATTENTION);
  cr_assert(sim_attrs_set_int(at, "heads", a, NULL));
  cr_assert(sim_attrs_set_int(at, "head_dim", hdim / a, NULL));
  cr_assert(sim_attrs_set_float(at, "dropout", 0.1, NULL));
  int op = sim_graph_add_op(g, SIM_OP_ATTENTION, "attn", 3, (int[]){ x, x, x }, at, NULL);
  cr_assert(op >= 0);
  const SimOp *o = sim_graph_op_get(g, op);
  const SimOpClass *c = sim_op_class(SIM_OP_ATTENTION);
  int64_t sbh = s * b * hdim, as2b = a * s * s * b;
  cr_assert_eq(c->saved_bytes(o, NULL), 10 * sbh + 5 * as2b);
  SimWork rw;
  int64_t kept = 0;
  c->selective(o, NULL, &rw, &kept);
  cr_assert_eq(kept, 10 * sbh);
  /* The recomputation: the two score GEMMs (4 b s^2 h), softmax and dropout. */
  double gemm = 0;
  for (int i = 0; i < rw.n; i++)
    if (rw.k[i].kind == SIM_KERNEL_GEMM)
      gemm += rw.k[i].flops;
  cr_assert_float_eq(gemm, 4.0 * b * s * s * hdim, 1);
  cr_assert_eq(rw.n, 4);
}

/* Bytes of the memory-bound kernels of one pass of attention's work. */
static double stream_bytes(const SimWork *w)
{
  double bytes = 0;
  for (int i = 0; i < w->n; i++)
    if (w->k[i].kind == SIM_KERNEL_MEMORY)
      bytes += w->k[i].bytes;
  return bytes;
}

Test(attention, megatron_fused_softmax_or_the_fp32_path)
{
  /* 16 heads of 64, sequence 1024, dropout 0.1: Megatron's fused softmax kernel needs the
   * shard's batch x heads to be a multiple of 4.  Tensor parallelism over 8 GPUs leaves 2
   * heads a shard: a micro-batch of 1 takes the unfused fp32 path, one of 2 the fused
   * kernel. */
  int64_t s = 1024, d = 1024, H = 16, e = 64;
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int x = INPUT(g, "x", SIM_DTYPE_FP16, 2, s, d);
  g_autoptr(SimAttrs) at = sim_attrs_new(SIM_OP_ATTENTION);
  cr_assert(sim_attrs_set_int(at, "heads", H, NULL));
  cr_assert(sim_attrs_set_int(at, "head_dim", e, NULL));
  cr_assert(sim_attrs_set_int(at, "causal", 1, NULL));
  cr_assert(sim_attrs_set_float(at, "dropout", 0.1, NULL));
  int plain = sim_graph_add_op(g, SIM_OP_ATTENTION, "plain", 3, (int[]){ x, x, x }, at, NULL);
  cr_assert(sim_attrs_set_int(at, "megatron_softmax", 1, NULL));
  int mega = sim_graph_add_op(g, SIM_OP_ATTENTION, "mega", 3, (int[]){ x, x, x }, at, NULL);
  cr_assert(plain >= 0 && mega >= 0);
  /* Extents b, s, h, e, d. */
  const int64_t mb1_tp8[5] = { 1, s, 2, e, d }, mb2_tp8[5] = { 2, s, 2, e, d };
  const int64_t mb1_tp4[5] = { 1, s, 4, e, d };
  double n = 1.0 * 2 * s * s; /* scores of a shard of 1 sample and 2 heads */
  SimWork w;
  /* Fused: QKV, scores, softmax, dropout, context, output projection. */
  sim_graph_op_work(g, plain, mb1_tp8, SIM_PASS_FORWARD, &w);
  cr_assert_eq(w.n, 6);
  /* Softmax 2 bytes in and out a score, dropout 2 + 2 and the 1-byte mask. */
  cr_assert_float_eq(stream_bytes(&w), 4 * n + 5 * n, 1);
  sim_graph_op_work(g, mega, mb2_tp8, SIM_PASS_FORWARD, &w);
  cr_assert_eq(w.n, 6);
  sim_graph_op_work(g, mega, mb1_tp4, SIM_PASS_FORWARD, &w);
  cr_assert_eq(w.n, 6);
  /* Unfused: cast (2 + 4), scale (4 + 4), masked_fill (4 + 4 and the [b, 1, s, s] mask,
   * half a byte a score with 2 heads), softmax (4 + 4), cast back (4 + 2). */
  sim_graph_op_work(g, mega, mb1_tp8, SIM_PASS_FORWARD, &w);
  cr_assert_eq(w.n, 10);
  cr_assert_float_eq(stream_bytes(&w), 36.5 * n + 5 * n, 1);
  /* Backward: 10 kernels fused (softmax backward 6 bytes a score), 14 unfused (6 + 12 +
   * 8.5 + 8 + 6); dropout's backward reads 2 + 1 and writes 2 either way. */
  sim_graph_op_work(g, plain, mb1_tp8, SIM_PASS_BACKWARD, &w);
  cr_assert_eq(w.n, 10);
  cr_assert_float_eq(stream_bytes(&w), 6 * n + 5 * n, 1);
  sim_graph_op_work(g, mega, mb1_tp8, SIM_PASS_BACKWARD, &w);
  cr_assert_eq(w.n, 14);
  cr_assert_leq(w.n, SIM_MAX_KERNELS);
  cr_assert_float_eq(stream_bytes(&w), 40.5 * n + 5 * n, 1);
  /* The fp32 path keeps P in fp32: 2 more bytes a score than the fused kernel. */
  const SimOpClass *c = sim_op_class(SIM_OP_ATTENTION);
  int64_t fused_saved = c->saved_bytes(sim_graph_op_get(g, plain), mb1_tp8);
  cr_assert_eq(c->saved_bytes(sim_graph_op_get(g, mega), mb1_tp8), fused_saved + 2 * (int64_t)n);
  /* Sequences past 2048 keys take the fp32 path whatever the batch. */
  int x4k = INPUT(g, "x4k", SIM_DTYPE_FP16, 4, 4096, d);
  int long_seq =
    sim_graph_add_op(g, SIM_OP_ATTENTION, "long", 3, (int[]){ x4k, x4k, x4k }, at, NULL);
  cr_assert(long_seq >= 0);
  sim_graph_op_work(g, long_seq, NULL, SIM_PASS_FORWARD, &w);
  cr_assert_eq(w.n, 10);
}

Test(attention, flash_keeps_no_scores_and_runs_one_kernel_each_way)
{
  /* Sequences of 4096, 16 heads of 64, causal, dropout 0.1, fp16; a shard of 1 sample. */
  int64_t s = 4096, d = 1024, H = 16, e = 64;
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int x = INPUT(g, "x", SIM_DTYPE_FP16, 1, s, d);
  g_autoptr(SimAttrs) at = sim_attrs_new(SIM_OP_ATTENTION);
  cr_assert(sim_attrs_set_int(at, "heads", H, NULL));
  cr_assert(sim_attrs_set_int(at, "head_dim", e, NULL));
  cr_assert(sim_attrs_set_int(at, "causal", 1, NULL));
  cr_assert(sim_attrs_set_float(at, "dropout", 0.1, NULL));
  cr_assert(sim_attrs_set_int(at, "megatron_softmax", 1, NULL));
  int op = sim_graph_add_op(g, SIM_OP_ATTENTION, "attn", 3, (int[]){ x, x, x }, at, NULL);
  cr_assert(op >= 0);
  const SimOpClass *c = sim_op_class(SIM_OP_ATTENTION);
  int64_t megatron_saved = c->saved_bytes(sim_graph_op_get(g, op), NULL);
  /* Megatron's path at 4,096 keys keeps fp32 P (4 B), the dropout mask (1 B) and its
   * output (2 B) for each of the 16 x 4096^2 scores. */
  double scores = (double)H * s * s;
  sim_graph_set_attention_kernel(g, SIM_ATTENTION_FLASH);
  int64_t flash_saved = c->saved_bytes(sim_graph_op_get(g, op), NULL);
  /* FlashAttention keeps the output (s x d, fp16) and the fp32 log-sum-exp of each row of
   * each head instead. */
  cr_assert_eq(megatron_saved - flash_saved, (int64_t)(7 * scores) - (2 * s * d + 4 * H * s));
  SimWork w;
  sim_graph_op_work(g, op, NULL, SIM_PASS_FORWARD, &w);
  /* The fused QKV projection, the flash kernel, the output projection. */
  cr_assert_eq(w.n, 3);
  cr_assert_eq(w.k[1].kind, SIM_KERNEL_ATTENTION);
  cr_assert_eq(w.k[1].batch, H);
  cr_assert_eq(w.k[1].m, s);
  cr_assert_eq(w.k[1].n, s);
  cr_assert_eq(w.k[1].k, e);
  cr_assert_eq(w.k[1].flags, SIM_KERNEL_CAUSAL);
  cr_assert_float_eq(w.k[1].flops, 4 * scores * e, 1);
  /* It reads Q, K and V and writes O (2 B each) and the row statistics: nothing of the
   * scores' size. */
  cr_assert_float_eq(w.k[1].bytes, 4.0 * s * d * 2 + 4.0 * H * s, 1);
  sim_graph_op_work(g, op, NULL, SIM_PASS_BACKWARD, &w);
  int flash = -1;
  for (int i = 0; i < w.n; i++)
    if (w.k[i].kind == SIM_KERNEL_ATTENTION)
      flash = i;
  cr_assert(flash >= 0);
  cr_assert_eq(w.k[flash].flags, SIM_KERNEL_CAUSAL | SIM_KERNEL_BACKWARD);
  cr_assert_float_eq(w.k[flash].flops, 2.5 * 4 * scores * e, 1);
  for (int i = 0; i < w.n; i++)
    cr_assert_lt(w.k[i].bytes, scores, "kernel %d moves score-sized data", i);
  /* The kernel names travel through the graph's attribute. */
  cr_assert_str_eq(sim_attention_kernel_name(SIM_ATTENTION_FLASH), "flash");
  cr_assert_eq(sim_attention_kernel_from_name("unfused"), SIM_ATTENTION_UNFUSED);
  cr_assert_eq(sim_attention_kernel_from_name("sdpa"), -1);
}

Test(attention, framework_kernels_order_their_traffic)
{
  /* The same attention run unfused, fused and Megatron's way at 1,024 keys (where
   * Megatron's kernel applies): the unfused path moves the most bytes over the scores,
   * Megatron's fused kernel as many as the fused one. */
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int x = INPUT(g, "x", SIM_DTYPE_FP16, 4, 1024, 1024);
  int op = sim_graph_attention(g, "attn", x, x, x, 16, 64, TRUE);
  cr_assert(op >= 0);
  op = op_of(g, op);
  double bytes[SIM_ATTENTION_COUNT];
  for (int k = 0; k < SIM_ATTENTION_COUNT; k++) {
    sim_graph_set_attention_kernel(g, (SimAttentionKernel)k);
    SimWork w;
    sim_graph_op_work(g, op, NULL, SIM_PASS_FORWARD, &w);
    bytes[k] = sim_work_bytes(&w);
  }
  cr_assert_gt(bytes[SIM_ATTENTION_UNFUSED], bytes[SIM_ATTENTION_FUSED]);
  cr_assert_float_eq(bytes[SIM_ATTENTION_MEGATRON], bytes[SIM_ATTENTION_FUSED], 1);
  cr_assert_lt(bytes[SIM_ATTENTION_FLASH], bytes[SIM_ATTENTION_FUSED] / 4);
}

Test(attention, rejections)
{
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int q = INPUT(g, "q", SIM_DTYPE_FP16, 2, 64, 256);
  int k = INPUT(g, "k", SIM_DTYPE_FP16, 2, 32, 128);
  sim_graph_attention(g, "attn", q, k, k, 8, 32, FALSE);
  assert_error(g, "op 'attn' (attention): q [2, 64, 256], k [2, 32, 128]", "expected q");

  g_autoptr(SimGraph) g2 = sim_graph_new("t");
  q = INPUT(g2, "q", SIM_DTYPE_FP16, 2, 64, 256);
  sim_graph_attention(g2, "attn", q, q, q, 0, 32, FALSE);
  assert_error(g2, "op 'attn' (attention)", "must be positive");
}

/* ---------------------------------------------------------------------------------- */
/* LSTM                                                                                */

Test(lstm, shapes_flops_space)
{
  /* GNMT-like: b 64, s 50, in 1024, hidden 1024. */
  int64_t b = 64, s = 50, in = 512, h = 1024;
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int x = INPUT(g, "x", SIM_DTYPE_FP32, b, s, in);
  int y = sim_graph_lstm(g, "lstm", x, h);
  ASSERT_SHAPE(g, y, 64, 50, 1024);
  int op = op_of(g, y);
  /* W [in + h, 4h] and a bias [4h]. */
  cr_assert_eq(sim_graph_op_n_params(g, op), (in + h) * 4 * h + 4 * h);
  /* Input GEMM 2 b s 4h in, recurrence 2 s b 4h h, gates 24 b s h. */
  double gemm = 2.0 * b * s * 4 * h * in + 2.0 * s * b * 4 * h * h;
  cr_assert_float_eq(pass_flops(g, y, SIM_PASS_FORWARD, TRUE), gemm, 1);
  cr_assert_float_eq(sim_graph_op_forward_flops(g, op), gemm + 24.0 * b * s * h, 1);
  /* Backward: twice the GEMMs. */
  cr_assert_float_eq(pass_flops(g, y, SIM_PASS_BACKWARD, TRUE), 2 * gemm, 1);
  SimWork w;
  sim_graph_op_work(g, op, NULL, SIM_PASS_FORWARD, &w);
  cr_assert_eq(w.k[1].kind, SIM_KERNEL_RECURRENT);
  cr_assert_eq(w.k[1].steps, s);
  /* Only the batch splits. */
  cr_assert(sim_graph_op_dim_splittable(g, op, 0));
  for (int d = 1; d < 4; d++)
    cr_assert_not(sim_graph_op_dim_splittable(g, op, d));

  g_autoptr(SimGraph) g2 = sim_graph_new("t");
  x = INPUT(g2, "x", SIM_DTYPE_FP32, 64, 512);
  sim_graph_lstm(g2, "lstm", x, 128);
  assert_error(g2, "op 'lstm' (lstm)", "expected 3 dimensions");
}

/* ---------------------------------------------------------------------------------- */
/* Losses                                                                              */

Test(cross_entropy, tokens_and_vocab_split)
{
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int logits = INPUT(g, "logits", SIM_DTYPE_FP16, 4, 128, 50000);
  int labels = INPUT(g, "labels", SIM_DTYPE_INT64, 4, 128);
  int loss = sim_graph_cross_entropy(g, "ce", logits, labels);
  ASSERT_SHAPE(g, loss, 4, 128);
  int op = op_of(g, loss);
  int c = dim_index(g, op, "c");
  cr_assert_eq(sim_graph_op_dim_role(g, op, c), SIM_ROLE_REDUCTION);
  cr_assert(sim_graph_op_dim_splittable(g, op, c));
  cr_assert_not(indexed_by(g, op, 'y', 0, c));
  /* Keeps the log-probabilities (fp16) and the int64 labels. */
  cr_assert_eq(sim_op_class(SIM_OP_CROSS_ENTROPY)->saved_bytes(sim_graph_op_get(g, op), NULL),
               4 * 128 * 50000 * 2 + 4 * 128 * 8);

  g_autoptr(SimGraph) g2 = sim_graph_new("t");
  logits = INPUT(g2, "logits", SIM_DTYPE_FP16, 4, 10);
  labels = INPUT(g2, "labels", SIM_DTYPE_FP16, 4);
  sim_graph_cross_entropy(g2, "ce", logits, labels);
  assert_error(g2, "op 'ce' (cross_entropy)", "not int32 or int64");

  g_autoptr(SimGraph) g3 = sim_graph_new("t");
  logits = INPUT(g3, "logits", SIM_DTYPE_FP16, 4, 10);
  labels = INPUT(g3, "labels", SIM_DTYPE_INT32, 5);
  sim_graph_cross_entropy(g3, "ce", logits, labels);
  assert_error(g3, "op 'ce' (cross_entropy): logits [4, 10] and labels [5]", NULL);
}

Test(cross_entropy, fp32_passes_as_megatron_runs_them)
{
  /* n = 4 * 128 * 50000 fp16 logits.  Fused (the default): one kernel reading and writing
   * n fp16 values (and the labels, and the per-row result) per pass. */
  double n = 4.0 * 128 * 50000, rows = 4.0 * 128;
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int logits = INPUT(g, "logits", SIM_DTYPE_FP16, 4, 128, 50000);
  int labels = INPUT(g, "labels", SIM_DTYPE_INT64, 4, 128);
  int fused = op_of(g, sim_graph_cross_entropy(g, "ce", logits, labels));
  int upcast = op_of(g, sim_graph_cross_entropy_fp32(g, "ce32", logits, labels));
  SimWork w;
  sim_graph_op_work(g, fused, NULL, SIM_PASS_FORWARD, &w);
  cr_assert_eq(w.n, 1);
  cr_assert_float_eq(w.k[0].bytes, 2 * n * 2 + rows * (8 + 2), 1);
  /* In fp32: forward cast (2 + 4 bytes per logit, and the labels), max (4), subtract
   * (8), exp (8), sum (4), divide (8): 38 bytes per logit in six kernels; backward scale
   * (8, and the labels to subtract the one-hot) and cast back (6) in two. */
  sim_graph_op_work(g, upcast, NULL, SIM_PASS_FORWARD, &w);
  cr_assert_eq(w.n, 6);
  double bytes = 0;
  for (int i = 0; i < w.n; i++)
    bytes += w.k[i].bytes;
  cr_assert_float_eq(bytes, 38 * n + rows * 8, 1);
  sim_graph_op_work(g, upcast, NULL, SIM_PASS_BACKWARD, &w);
  cr_assert_eq(w.n, 2);
  cr_assert_float_eq(w.k[0].bytes + w.k[1].bytes, 14 * n + rows * 8, 1);
  /* It keeps the fp32 softmax. */
  cr_assert_eq(sim_op_class(SIM_OP_CROSS_ENTROPY)->saved_bytes(sim_graph_op_get(g, upcast), NULL),
               4 * 128 * 50000 * 4 + 4 * 128 * 8);
  /* fp32 logits have nothing to cast: the fused kernel. */
  g_autoptr(SimGraph) g2 = sim_graph_new("t");
  logits = INPUT(g2, "logits", SIM_DTYPE_FP32, 4, 128, 50000);
  labels = INPUT(g2, "labels", SIM_DTYPE_INT64, 4, 128);
  upcast = op_of(g2, sim_graph_cross_entropy_fp32(g2, "ce32", logits, labels));
  sim_graph_op_work(g2, upcast, NULL, SIM_PASS_FORWARD, &w);
  cr_assert_eq(w.n, 1);
}

Test(mse_loss, per_sample)
{
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int p = INPUT(g, "p", SIM_DTYPE_FP32, 16, 10);
  int t = INPUT(g, "t", SIM_DTYPE_FP32, 16, 10);
  int loss = sim_graph_mse_loss(g, "mse", p, t);
  ASSERT_SHAPE(g, loss, 16);
  int op = op_of(g, loss);
  cr_assert_eq(sim_graph_op_dim_role(g, op, 1), SIM_ROLE_REDUCTION);
  /* 3 operations per element. */
  cr_assert_float_eq(sim_graph_op_forward_flops(g, op), 480, 1e-9);

  g_autoptr(SimGraph) g2 = sim_graph_new("t");
  p = INPUT(g2, "p", SIM_DTYPE_FP32, 16, 10);
  t = INPUT(g2, "t", SIM_DTYPE_FP32, 16, 11);
  sim_graph_mse_loss(g2, "mse", p, t);
  assert_error(g2, "op 'mse' (mse_loss)", "differ in shape");
}

/* ---------------------------------------------------------------------------------- */
/* The catalogue                                                                       */

Test(catalogue, every_type)
{
  for (int t = 0; t < SIM_OP_COUNT; t++) {
    const SimOpClass *c = sim_op_class(t);
    cr_assert_eq(c->type, t);
    cr_assert(c->infer && c->space && c->work && c->saved_bytes, "%s", c->name);
    cr_assert_eq(sim_op_type_from_name(sim_op_type_name(t)), t);
    cr_assert(strlen(sim_op_type_description(t)) > 10);
    for (int a = 0; a < c->n_attrs; a++)
      cr_assert(c->attrs[a].type != SIM_ATTR_ENUM || c->attrs[a].enum_names);
  }
  cr_assert_eq(sim_op_type_from_name("linaer"), -1);
  cr_assert_str_eq(sim_dim_role_name(SIM_ROLE_REDUCTION), "reduction");
  cr_assert_str_eq(sim_unary_kind_name(SIM_UNARY_GELU), "gelu");
  cr_assert_str_eq(sim_binary_kind_name(SIM_BINARY_DIV), "div");
  cr_assert_str_eq(sim_kernel_kind_name(SIM_KERNEL_RECURRENT), "recurrent");
  cr_assert_str_eq(sim_pass_name(SIM_PASS_UPDATE), "update");
}

Test(catalogue, kernels)
{
  /* GEMM: 2 * batch * m * n * k FLOPs, element size * batch * (mk + kn + mn) bytes. */
  SimKernel k = sim_kernel_gemm(SIM_DTYPE_FP16, 3, 4, 5, 6);
  cr_assert_float_eq(k.flops, 2.0 * 3 * 4 * 5 * 6, 1e-9);
  cr_assert_float_eq(k.bytes, 2.0 * 3 * (24 + 30 + 20), 1e-9);
  SimKernel m = sim_kernel_memory(SIM_DTYPE_FP32, 10, 20);
  cr_assert_eq(m.kind, SIM_KERNEL_MEMORY);
  cr_assert_float_eq(m.bytes, 20, 1e-9);
}

Test(catalogue, shard_key)
{
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int x = INPUT(g, "x", SIM_DTYPE_FP16, 8, 1024, 4096);
  int op = op_of(g, sim_graph_linear(g, "fc", x, 1024, FALSE, SIM_UNARY_IDENTITY));
  /* Column parallel in 4: the shard's X is whole, W is [4096, 256]. */
  int64_t ext[] = { 8, 1024, 256, 4096 };
  g_autofree char *key = sim_graph_op_shard_key(g, op, ext);
  cr_assert_str_eq(key, "linear|x=[8,1024,4096]|w=[4096,256]|y=[8,1024,256]|fp16|bias=false|"
                        "activation=identity");
  /* Another op with the same shard shapes shares the key. */
  int op2 = op_of(g, sim_graph_linear(g, "fc2", x, 256, FALSE, SIM_UNARY_IDENTITY));
  g_autofree char *key2 = sim_graph_op_shard_key(g, op2, NULL);
  cr_assert_str_eq(key, key2);
}

/* ---------------------------------------------------------------------------------- */
/* LLaMA-style blocks: RMS norm, gated MLP, grouped-query attention with rotary
 * embeddings, mixture of experts                                                       */

Test(rmsnorm, shape_params_flops_saved)
{
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int x = INPUT(g, "x", SIM_DTYPE_BF16, 4, 512, 1024);
  int y = sim_graph_rmsnorm(g, "norm", x);
  ASSERT_SHAPE(g, y, 4, 512, 1024);
  int op = op_of(g, y);
  /* gamma only. */
  cr_assert_eq(sim_graph_op_n_params(g, op), 1024);
  cr_assert(sim_graph_op_dim_splittable(g, op, 1));
  cr_assert_not(sim_graph_op_dim_splittable(g, op, 2));
  double n = 4.0 * 512 * 1024;
  /* 4 operations per element forward, 6 + 2 backward; no GEMM. */
  cr_assert_float_eq(pass_flops(g, y, SIM_PASS_FORWARD, FALSE), 4 * n, 1e-6);
  cr_assert_float_eq(pass_flops(g, y, SIM_PASS_BACKWARD, FALSE), 8 * n, 1e-6);
  cr_assert_float_eq(pass_flops(g, y, SIM_PASS_FORWARD, TRUE), 0, 1e-9);
  /* Saved: x in bf16 and an fp32 rstd per row (layer norm keeps a mean as well). */
  cr_assert_eq(sim_op_class(SIM_OP_RMSNORM)->saved_bytes(sim_graph_op_get(g, op), NULL),
               4 * 512 * 1024 * 2 + 4 * 512 * 4);

  g_autoptr(SimGraph) g2 = sim_graph_new("t");
  int ids = INPUT(g2, "ids", SIM_DTYPE_INT32, 4, 8);
  sim_graph_rmsnorm(g2, "norm", ids);
  assert_error(g2, "op 'norm' (rmsnorm)", "not floating point");
}

Test(gated_mlp, params_flops_and_column_row_split)
{
  int64_t b = 2, s = 128, d = 512, f = 1376;
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int x = INPUT(g, "x", SIM_DTYPE_BF16, b, s, d);
  int y = sim_graph_gated_mlp(g, "mlp", x, f, SIM_UNARY_SILU);
  ASSERT_SHAPE(g, y, 2, 128, 512);
  int op = op_of(g, y);
  /* Wg, Wu [d, f] and Wd [f, d], no biases. */
  cr_assert_eq(sim_graph_op_n_params(g, op), 3 * d * f);
  /* Three GEMMs of 2 M d f each forward, twice that backward. */
  double M = (double)b * s;
  cr_assert_float_eq(pass_flops(g, y, SIM_PASS_FORWARD, TRUE), 6 * M * d * f, 1);
  cr_assert_float_eq(pass_flops(g, y, SIM_PASS_BACKWARD, TRUE), 12 * M * d * f, 1);
  /* silu (5) times up (1) per element of M x f forward; silu' (8) and 3 more backward. */
  cr_assert_float_eq(pass_flops(g, y, SIM_PASS_FORWARD, FALSE) - 6 * M * d * f, 6 * M * f, 1);
  cr_assert_float_eq(pass_flops(g, y, SIM_PASS_BACKWARD, FALSE) - 12 * M * d * f, 11 * M * f,
                     1);
  /* An f-split is Megatron's column-parallel gate and up, row-parallel down: the shard of
   * columns [688, 1376) holds those columns of Wg and Wu and those rows of Wd, and its
   * output is a partial sum. */
  int fd = dim_index(g, op, "f");
  cr_assert(sim_graph_op_dim_splittable(g, op, fd));
  cr_assert_not(sim_graph_op_dim_splittable(g, op, dim_index(g, op, "d")));
  int64_t lo[4], hi[4];
  full_range(g, op, lo, hi);
  lo[fd] = 688;
  SimRegion wg = project(g, op, 'w', 0, lo, hi), wd = project(g, op, 'w', 2, lo, hi);
  assert_range(&wg, 0, 0, d);
  assert_range(&wg, 1, 688, f);
  assert_range(&wd, 0, 688, f);
  assert_range(&wd, 1, 0, d);
  cr_assert_not(indexed_by(g, op, 'y', 0, fd));
  /* Saved: x, the gate and up outputs and their product. */
  cr_assert_eq(sim_op_class(SIM_OP_GATED_MLP)->saved_bytes(sim_graph_op_get(g, op), NULL),
               (b * s * d + 3 * b * s * f) * 2);

  g_autoptr(SimGraph) g2 = sim_graph_new("t");
  x = INPUT(g2, "x", SIM_DTYPE_BF16, 2, 4, 8);
  sim_graph_gated_mlp(g2, "mlp", x, 0, SIM_UNARY_SILU);
  assert_error(g2, "op 'mlp' (gated_mlp)", "ffn is 0, not positive");
}

static int gqa_checked(SimGraph *g, int x, int heads, int kv_heads, int hd, gboolean rotary,
                       GError **error)
{
  g_autoptr(SimAttrs) a = sim_attrs_new(SIM_OP_ATTENTION);
  cr_assert(sim_attrs_set_int(a, "heads", heads, NULL));
  cr_assert(sim_attrs_set_int(a, "head_dim", hd, NULL));
  cr_assert(sim_attrs_set_int(a, "kv_heads", kv_heads, NULL));
  cr_assert(sim_attrs_set_int(a, "causal", 1, NULL));
  cr_assert(sim_attrs_set_int(a, "bias", 0, NULL));
  cr_assert(sim_attrs_set_int(a, "rotary", rotary, NULL));
  return sim_graph_add_op(g, SIM_OP_ATTENTION, "attn", 3, (int[]){ x, x, x }, a, error);
}

static int gqa(SimGraph *g, int x, int heads, int kv_heads, int hd, gboolean rotary)
{
  g_autoptr(GError) error = NULL;
  int op = gqa_checked(g, x, heads, kv_heads, hd, rotary, &error);
  cr_assert_geq(op, 0, "%s", error ? error->message : "");
  return op;
}

static void assert_add_error(int op, GError *error, const char *want)
{
  cr_assert_lt(op, 0);
  cr_assert_not_null(error);
  cr_assert(strstr(error->message, "op 'attn' (attention)") && strstr(error->message, want),
            "'%s' lacks '%s'", error->message, want);
  g_error_free(error);
}

Test(attention, grouped_query_weights_flops_and_head_split)
{
  /* 8 query heads in 2 groups of 4, head dimension 32, d 256. */
  int64_t b = 2, s = 64, d = 256, H = 8, KV = 2, hd = 32;
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int x = INPUT(g, "x", SIM_DTYPE_BF16, b, s, d);
  int op = gqa(g, x, (int)H, (int)KV, (int)hd, FALSE);
  cr_assert_geq(op, 0);
  int64_t inner = H * hd, kv = KV * hd;
  /* Wq [d, 256], Wk and Wv [d, 64], Wo [256, d]. */
  cr_assert_eq(sim_graph_op_n_params(g, op), 2 * d * inner + 2 * d * kv);
  /* Forward GEMMs: the fused QKV projection 2 b s d (inner + 2 kv), scores and context
   * 2 * 2 b H s^2 hd, the output projection 2 b s inner d. */
  double gemm = 2.0 * b * s * d * (inner + 2 * kv) + 4.0 * b * H * s * s * hd +
                2.0 * b * s * inner * d;
  SimWork w;
  sim_graph_op_work(g, op, NULL, SIM_PASS_FORWARD, &w);
  double fw = 0;
  for (int i = 0; i < w.n; i++)
    if (w.k[i].kind == SIM_KERNEL_GEMM)
      fw += w.k[i].flops;
  cr_assert_float_eq(fw, gemm, 1);
  cr_assert_eq(w.k[0].n, inner + 2 * kv);
  /* The split dimension counts key-value heads; the shard of kv head 1 holds query heads
   * 4 to 7: Wq's columns and Wo's rows [128, 256), Wk's and Wv's columns [32, 64). */
  int h = dim_index(g, op, "h");
  cr_assert_eq(sim_graph_op_dim_size(g, op, h), KV);
  cr_assert_not(sim_graph_op_dim_splittable(g, op, dim_index(g, op, "q")));
  int64_t lo[6], hi[6];
  full_range(g, op, lo, hi);
  lo[h] = 1;
  SimRegion wq = project(g, op, 'w', 0, lo, hi), wk = project(g, op, 'w', 1, lo, hi);
  SimRegion wv = project(g, op, 'w', 2, lo, hi), wo = project(g, op, 'w', 3, lo, hi);
  assert_range(&wq, 1, 128, 256);
  assert_range(&wk, 1, 32, 64);
  assert_range(&wv, 1, 32, 64);
  assert_range(&wo, 0, 128, 256);
  cr_assert_not(indexed_by(g, op, 'y', 0, h));
  /* The shard's scores are those of its 4 query heads. */
  int64_t ext[6];
  for (int i = 0; i < 6; i++)
    ext[i] = hi[i] - lo[i];
  sim_graph_op_work(g, op, ext, SIM_PASS_FORWARD, &w);
  cr_assert_float_eq(w.k[1].flops, 2.0 * b * 4 * s * s * hd, 1);

  /* Multi-query attention: one key-value head, which no split divides. */
  g_autoptr(SimGraph) g2 = sim_graph_new("t");
  x = INPUT(g2, "x", SIM_DTYPE_BF16, b, s, d);
  int mqa = gqa(g2, x, (int)H, 1, (int)hd, FALSE);
  cr_assert_eq(sim_graph_op_n_params(g2, mqa), 2 * d * inner + 2 * d * hd);
  cr_assert_eq(sim_graph_op_dim_size(g2, mqa, dim_index(g2, mqa, "h")), 1);

  g_autoptr(SimGraph) g3 = sim_graph_new("t");
  x = INPUT(g3, "x", SIM_DTYPE_BF16, b, s, d);
  GError *error = NULL;
  int bad = gqa_checked(g3, x, 8, 3, 32, FALSE, &error);
  assert_add_error(bad, error, "kv_heads must divide heads");
}

Test(attention, rotary_adds_one_rotation_each_way)
{
  int64_t b = 2, s = 64, d = 256, H = 8, KV = 2, hd = 32;
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int x = INPUT(g, "x", SIM_DTYPE_BF16, b, s, d);
  int plain = gqa(g, x, (int)H, (int)KV, (int)hd, FALSE);
  g_autoptr(SimGraph) g2 = sim_graph_new("t");
  x = INPUT(g2, "x", SIM_DTYPE_BF16, b, s, d);
  int rot = gqa(g2, x, (int)H, (int)KV, (int)hd, TRUE);
  /* Rotary has no weights; it rotates Q (b s H hd) and K (b s KV hd), 4 operations an
   * element, forward and backward. */
  cr_assert_eq(sim_graph_op_n_params(g, plain), sim_graph_op_n_params(g2, rot));
  double n = (double)b * s * (H + KV) * hd;
  cr_assert_float_eq(sim_graph_op_forward_flops(g2, rot) - sim_graph_op_forward_flops(g, plain),
                     4 * n, 1e-3);
  cr_assert_float_eq(sim_graph_op_backward_flops(g2, rot) -
                       sim_graph_op_backward_flops(g, plain), 4 * n, 1e-3);
  g_autoptr(SimGraph) g3 = sim_graph_new("t");
  x = INPUT(g3, "x", SIM_DTYPE_BF16, b, s, 30);
  GError *error = NULL;
  int bad = gqa_checked(g3, x, 2, 2, 15, TRUE, &error);
  assert_add_error(bad, error, "even head_dim");
}

/* The mixture's op for x and a router linear layer's logits. */
static int moe(SimGraph *g, int x, int E, int k, int64_t f, double capacity, double imbalance)
{
  int logits = sim_graph_linear(g, "router", x, E, FALSE, SIM_UNARY_IDENTITY);
  g_autoptr(SimAttrs) a = sim_attrs_new(SIM_OP_MOE);
  cr_assert(sim_attrs_set_int(a, "experts", E, NULL));
  cr_assert(sim_attrs_set_int(a, "top_k", k, NULL));
  cr_assert(sim_attrs_set_int(a, "ffn", f, NULL));
  cr_assert(sim_attrs_set_float(a, "capacity_factor", capacity, NULL));
  cr_assert(sim_attrs_set_float(a, "imbalance", imbalance, NULL));
  return sim_graph_add_op(g, SIM_OP_MOE, "moe", 2, (int[]){ x, logits }, a, NULL);
}

/* The memory-bound kernels of a shard of the mixture, forward, in closed form (bf16, 2
 * bytes; D = 128, E = 8, k = 2, T = 128 tokens, dropless and balanced): the router's
 * softmax and top-k over the shard's own tokens t (t E 2 + 8 t k bytes), the permutation
 * (t D 2 + t k D 2), the activation times up over the R rows of the shard's experts
 * (3 R f 2), the un-permutation (t k D 2 + t D 2 + 4 t k), and, for a shard holding
 * several experts of a split, the sort by expert and back (2 x 2 R D 2).  Own tokens are
 * the shard's share of its range: t = T (x / E) (f / F) (Megatron-Core's dispatcher routes
 * the tokens each GPU of an expert group holds).  The GEMMs are grouped, one product a
 * local expert. */
Test(moe, router_and_permutation_cost_the_shards_own_tokens)
{
  int64_t b = 2, s = 64, d = 128, f = 448, E = 8, k = 2;
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int x = INPUT(g, "x", SIM_DTYPE_BF16, b, s, d);
  int op = moe(g, x, (int)E, (int)k, f, 0.0, 1.0);
  cr_assert_geq(op, 0);
  int xd = dim_index(g, op, "x"), fd = dim_index(g, op, "f");
  /* Whole; experts [4, 8); expert 4, half its width. */
  const int64_t xs[3] = { 8, 4, 1 }, fs[3] = { 448, 448, 224 };
  for (int c = 0; c < 3; c++) {
    int64_t lo[5], hi[5], ext[5];
    full_range(g, op, lo, hi);
    for (int i = 0; i < 5; i++)
      ext[i] = hi[i] - lo[i];
    ext[xd] = xs[c];
    ext[fd] = fs[c];
    double T = (double)b * s, t = T * xs[c] / E * fs[c] / f;
    double R = T * k * xs[c] / E, F = (double)fs[c];
    double want = t * E * 2 + 8 * t * k + (t * d * 2 + t * k * d * 2) + 3 * R * F * 2 +
                  (t * k * d * 2 + t * d * 2 + 4 * t * k);
    if (xs[c] > 1 && xs[c] < E)
      want += 2 * (2 * R * d * 2);
    SimWork w;
    sim_graph_op_work(g, op, ext, SIM_PASS_FORWARD, &w);
    double bytes = 0;
    int gemms = 0;
    for (int i = 0; i < w.n; i++) {
      if (w.k[i].kind == SIM_KERNEL_MEMORY)
        bytes += w.k[i].bytes;
      if (w.k[i].kind == SIM_KERNEL_GEMM) {
        gemms++;
        cr_expect(w.k[i].flags & SIM_KERNEL_GROUPED, "case %d: GEMM %d not grouped", c, i);
        cr_expect_eq(w.k[i].batch, xs[c], "case %d: a product per local expert", c);
      }
    }
    cr_expect_eq(gemms, 2, "case %d", c);
    cr_expect_float_eq(bytes, want, 1e-6 * want, "case %d: %.0f bytes, want %.0f", c, bytes,
                       want);
  }
}

/* A shard's rows per expert that are no whole number of 16-byte vectors (4 of 8 experts,
 * T k x / E = 128 rows times the imbalance 1.03: 131.84, 33 an expert) run in the grouped
 * GEMMs as the next multiple of 8 rows (40): exactly the products of imbalance 1.25
 * (160 rows, 40 an expert), not an unaligned GEMM; forward and backward. */
/* The shard of moe operator @op over experts [4, 8) of 8, every other dimension whole: its
 * range in @lo and @hi, its extents in @ext; returns the experts' dimension. */
static int upper_experts(const SimGraph *g, int op, int64_t lo[5], int64_t hi[5], int64_t ext[5])
{
  int xd = dim_index(g, op, "x");
  full_range(g, op, lo, hi);
  lo[xd] = 4;
  for (int i = 0; i < 5; i++)
    ext[i] = hi[i] - lo[i];
  return xd;
}

Test(moe, expert_rows_round_up_to_a_vector)
{
  int64_t b = 2, s = 64, d = 128, f = 448, E = 8, k = 2;
  SimWork w[2][2];
  const double imbalance[2] = { 1.03, 1.25 };
  for (int c = 0; c < 2; c++) {
    g_autoptr(SimGraph) g = sim_graph_new("t");
    int x = INPUT(g, "x", SIM_DTYPE_BF16, b, s, d);
    int op = moe(g, x, (int)E, (int)k, f, 0.0, imbalance[c]);
    cr_assert_geq(op, 0);
    int64_t lo[5], hi[5], ext[5];
    upper_experts(g, op, lo, hi, ext);
    sim_graph_op_work(g, op, ext, SIM_PASS_FORWARD, &w[c][0]);
    sim_graph_op_work(g, op, ext, SIM_PASS_BACKWARD, &w[c][1]);
  }
  for (int p = 0; p < 2; p++) {
    int gemms = 0;
    cr_assert_eq(w[0][p].n, w[1][p].n);
    for (int i = 0; i < w[0][p].n; i++) {
      const SimKernel *a = &w[0][p].k[i], *z = &w[1][p].k[i];
      if (a->kind != SIM_KERNEL_GEMM)
        continue;
      gemms++;
      cr_expect(a->m == z->m && a->n == z->n && a->k == z->k && a->batch == z->batch,
                "pass %d, GEMM %d: %" G_GINT64_FORMAT " x %" G_GINT64_FORMAT " x %"
                G_GINT64_FORMAT ", expected %" G_GINT64_FORMAT " x %" G_GINT64_FORMAT " x %"
                G_GINT64_FORMAT, p, i, a->m, a->n, a->k, z->m, z->n, z->k);
      /* The rows (m, or k for the weights' gradients) are 40. */
      cr_expect(a->m == 40 || a->k == 40, "pass %d, GEMM %d", p, i);
    }
    cr_expect_eq(gemms, p ? 4 : 2);
  }
}

Test(moe, params_rows_flops_and_expert_split)
{
  /* Mixtral's shape at small scale: 8 experts, top 2. */
  int64_t b = 2, s = 64, d = 128, f = 448, E = 8, k = 2;
  g_autoptr(SimGraph) g = sim_graph_new("t");
  int x = INPUT(g, "x", SIM_DTYPE_BF16, b, s, d);
  int op = moe(g, x, (int)E, (int)k, f, 0.0, 1.5);
  cr_assert_geq(op, 0);
  /* E experts of three [d, f] matrices (the router [d, E] is its own linear op). */
  cr_assert_eq(sim_graph_op_n_params(g, op), 3 * E * d * f);
  const SimOp *o = sim_graph_op_get(g, op);
  double T = (double)b * s;
  /* Dropless on one device: every token's k rows, whatever the imbalance. */
  cr_assert_eq(sim_moe_shard_rows(o, NULL), (int64_t)(T * k));
  /* GEMM FLOPs: each routed row's expert 6 d f. */
  cr_assert_float_eq(pass_flops(g, sim_graph_op_output(g, op, 0), SIM_PASS_FORWARD, TRUE),
                     6 * T * k * d * f, 1);
  cr_assert_float_eq(pass_flops(g, sim_graph_op_output(g, op, 0), SIM_PASS_BACKWARD, TRUE),
                     12 * T * k * d * f, 1);
  /* Experts [4, 8) on one shard: the mean T k / 2 rows times the imbalance 1.5; every
   * logit, the experts' weights [4, 8), a partial output. */
  int64_t lo[5], hi[5], ext[5];
  int xd = upper_experts(g, op, lo, hi, ext);
  cr_assert_eq(sim_moe_shard_rows(o, ext), (int64_t)(T * k / 2 * 1.5));
  SimRegion r = project(g, op, 'x', 1, lo, hi), wg = project(g, op, 'w', 0, lo, hi);
  assert_range(&r, 2, 0, E);
  assert_range(&wg, 0, 4, 8);
  cr_assert_not(indexed_by(g, op, 'y', 0, xd));
  /* A capacity factor of 1.25 pads every expert to ceil(1.25 T k / E) = 40 rows. */
  g_autoptr(SimGraph) g2 = sim_graph_new("t");
  x = INPUT(g2, "x", SIM_DTYPE_BF16, b, s, d);
  int op2 = moe(g2, x, (int)E, (int)k, f, 1.25, 1.0);
  cr_assert_eq(sim_moe_shard_rows(sim_graph_op_get(g2, op2), ext), 4 * 40);
  cr_assert_eq(sim_moe_shard_rows(sim_graph_op_get(g2, op2), NULL), 8 * 40);

  g_autoptr(SimGraph) g3 = sim_graph_new("t");
  x = INPUT(g3, "x", SIM_DTYPE_BF16, b, s, d);
  int lg = sim_graph_linear(g3, "router", x, 4, FALSE, SIM_UNARY_IDENTITY);
  sim_graph_moe(g3, "moe", x, lg, 4, 5, 64);
  assert_error(g3, "op 'moe' (moe)", "1 <= top_k <= experts");
  g_autoptr(SimGraph) g5 = sim_graph_new("t");
  x = INPUT(g5, "x", SIM_DTYPE_BF16, b, s, d);
  lg = sim_graph_linear(g5, "router", x, 6, FALSE, SIM_UNARY_IDENTITY);
  sim_graph_moe(g5, "moe", x, lg, 4, 2, 64);
  assert_error(g5, "op 'moe' (moe)", "expected logits [b, s, experts] with 4 experts");
  g_autoptr(SimGraph) g4 = sim_graph_new("t");
  x = INPUT(g4, "x", SIM_DTYPE_BF16, b, s, d);
  g_autoptr(SimAttrs) a = sim_attrs_new(SIM_OP_MOE);
  sim_attrs_set_int(a, "experts", 4, NULL);
  sim_attrs_set_int(a, "top_k", 2, NULL);
  sim_attrs_set_int(a, "ffn", 64, NULL);
  sim_attrs_set_float(a, "imbalance", 0.5, NULL);
  g_autoptr(GError) error = NULL;
  lg = sim_graph_linear(g4, "router", x, 4, FALSE, SIM_UNARY_IDENTITY);
  cr_assert_lt(sim_graph_add_op(g4, SIM_OP_MOE, "moe", 2, (int[]){ x, lg }, a, &error), 0);
  cr_assert(strstr(error->message, "op 'moe' (moe)") && strstr(error->message, "imbalance >= 1"),
            "%s", error->message);
}
