/* conv.c — 2-D convolution and pooling over NCHW tensors.
 *
 * Convolution: Y[n, g*Cg' + co, ho, wo] = sum over ci, kh, kw of
 *   X[n, g*Cg + ci, ho*sh + kh*dh - ph, wo*sw + kw*dw - pw] * W[g*Cg' + co, ci, kh, kw]
 * with Cg = C_in / groups and Cg' = C_out / groups.  The iteration dimensions are b
 * (sample), g (parameter; only when groups > 1), cout (parameter, within a group), h and
 * w (attribute: output rows and columns), cin (reduction, within a group), kh and kw
 * (reduction, not split).  The maps above are affine, so splitting h gives each shard the
 * input rows it needs, halo included, and splitting cin gives partial sums.
 *
 * Pooling has b, c (parameter: it lines up with the producing convolution's output
 * channels), h, w (attribute) and the window kh, kw (reduction, not split). */
#include "../sim-private.h"

/* Expands attribute @slot to two values (height, width): none gives @def twice, one
 * value is used for both.  Values below @min are refused. */
static gboolean pair(SimOp *op, int slot, int64_t def, int64_t min, GError **error)
{
  SimAttrValue *v = &op->attrs[slot];
  const char *name = sim_op_class(op->type)->attrs[slot].name;
  if (v->n == 0) {
    v->i[0] = v->i[1] = def;
  } else if (v->n == 1) {
    v->i[1] = v->i[0];
  } else if (v->n != 2) {
    sim_op_set_error(op, error, SIM_ERROR_INVALID,
                     "%s has %d values; it takes 1 or 2 (height, width)", name, v->n);
    return FALSE;
  }
  v->n = 2;
  for (int j = 0; j < 2; j++)
    if (v->i[j] < min) {
      sim_op_set_error(op, error, SIM_ERROR_INVALID,
                       "%s is [%" G_GINT64_FORMAT ", %" G_GINT64_FORMAT
                       "]; each must be at least %" G_GINT64_FORMAT,
                       name, v->i[0], v->i[1], min);
      return FALSE;
    }
  return TRUE;
}

/* The output size of a window sweep, or 0 when the window does not fit (PyTorch's
 * floor((in + 2p - d(k-1) - 1) / s) + 1). */
static int64_t out_size(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d)
{
  int64_t span = in + 2 * p - d * (k - 1) - 1;
  return span < 0 ? 0 : span / s + 1;
}

/* ---------------------------------------------------------------------------------- */
/* Conv2d                                                                              */

enum { C_OUT, C_KERNEL, C_STRIDE, C_PADDING, C_DILATION, C_GROUPS, C_BIAS, C_ACT };

static const SimAttrSpec conv_attrs[] = {
  [C_OUT] = { "out_channels", SIM_ATTR_INT, 0, NULL, TRUE },
  [C_KERNEL] = { "kernel", SIM_ATTR_INTS, 0, NULL, TRUE },
  [C_STRIDE] = { "stride", SIM_ATTR_INTS, 1, NULL, FALSE },
  [C_PADDING] = { "padding", SIM_ATTR_INTS, 0, NULL, FALSE },
  [C_DILATION] = { "dilation", SIM_ATTR_INTS, 1, NULL, FALSE },
  [C_GROUPS] = { "groups", SIM_ATTR_INT, 1, NULL, FALSE },
  [C_BIAS] = { "bias", SIM_ATTR_BOOL, 0, NULL, FALSE },
  [C_ACT] = { "activation", SIM_ATTR_ENUM, SIM_UNARY_IDENTITY, sim_unary_kind_names, FALSE },
};

/* Indices of the iteration dimensions; g exists only with groups. */
typedef struct {
  int b, g, co, h, w, ci, kh, kw;
} ConvDims;

static inline ConvDims conv_dims(const SimOp *op)
{
  int o = op->attrs[C_GROUPS].i[0] > 1;
  return (ConvDims){ 0, o ? 1 : -1, 1 + o, 2 + o, 3 + o, 4 + o, 5 + o, 6 + o };
}

static gboolean conv_infer(SimOp *op, GError **error)
{
  if (!sim_op_check_rank(op, 0, 4, 4, error) || !sim_op_check_float(op, 0, error))
    return FALSE;
  if (!pair(op, C_KERNEL, 1, 1, error) || !pair(op, C_STRIDE, 1, 1, error) ||
      !pair(op, C_PADDING, 0, 0, error) || !pair(op, C_DILATION, 1, 1, error))
    return FALSE;
  const SimShape *x = &op->in_shape[0];
  int64_t cout = op->attrs[C_OUT].i[0], groups = op->attrs[C_GROUPS].i[0];
  const int64_t *k = op->attrs[C_KERNEL].i, *s = op->attrs[C_STRIDE].i;
  const int64_t *p = op->attrs[C_PADDING].i, *d = op->attrs[C_DILATION].i;
  if (cout < 1 || groups < 1 || x->dims[1] % groups || cout % groups) {
    sim_op_set_error(op, error, SIM_ERROR_INVALID,
                     "%" G_GINT64_FORMAT " input and %" G_GINT64_FORMAT
                     " output channels in %" G_GINT64_FORMAT
                     " groups: both must be positive multiples of the groups",
                     x->dims[1], cout, groups);
    return FALSE;
  }
  int64_t ho = out_size(x->dims[2], k[0], s[0], p[0], d[0]);
  int64_t wo = out_size(x->dims[3], k[1], s[1], p[1], d[1]);
  if (ho < 1 || wo < 1) {
    g_autofree char *xs = sim_shape_to_string(x);
    sim_op_set_error(op, error, SIM_ERROR_INVALID,
                     "the %" G_GINT64_FORMAT "x%" G_GINT64_FORMAT " kernel (dilation %"
                     G_GINT64_FORMAT "x%" G_GINT64_FORMAT ") does not fit the input %s "
                     "padded by %" G_GINT64_FORMAT "x%" G_GINT64_FORMAT,
                     k[0], k[1], d[0], d[1], xs, p[0], p[1]);
    return FALSE;
  }
  sim_op_set_n_outputs(op, 1);
  op->out_shape[0] = sim_shape_make(4, (int64_t[]){ x->dims[0], cout, ho, wo });
  op->out_dtype[0] = op->in_dtype[0];
  op->n_weights = op->attrs[C_BIAS].i[0] ? 2 : 1;
  op->w_shape[0] = sim_shape_make(4, (int64_t[]){ cout, x->dims[1] / groups, k[0], k[1] });
  op->w_shape[1] = sim_shape_make(1, (int64_t[]){ cout });
  op->w_dtype = op->in_dtype[0];
  return TRUE;
}

static void conv_space(SimOp *op)
{
  const SimShape *x = &op->in_shape[0], *y = &op->out_shape[0];
  int64_t groups = op->attrs[C_GROUPS].i[0];
  const int64_t *s = op->attrs[C_STRIDE].i, *p = op->attrs[C_PADDING].i;
  const int64_t *dl = op->attrs[C_DILATION].i, *k = op->attrs[C_KERNEL].i;
  int64_t cin_g = x->dims[1] / groups, cout_g = y->dims[1] / groups;
  ConvDims D = conv_dims(op);
  sim_space_init(op, groups > 1 ? 8 : 7);
  sim_space_dim(op, D.b, "b", SIM_ROLE_SAMPLE, x->dims[0], TRUE);
  if (D.g >= 0)
    sim_space_dim(op, D.g, "g", SIM_ROLE_PARAMETER, groups, TRUE);
  sim_space_dim(op, D.co, "cout", SIM_ROLE_PARAMETER, cout_g, TRUE);
  sim_space_dim(op, D.h, "h", SIM_ROLE_ATTRIBUTE, y->dims[2], TRUE);
  sim_space_dim(op, D.w, "w", SIM_ROLE_ATTRIBUTE, y->dims[3], TRUE);
  sim_space_dim(op, D.ci, "cin", SIM_ROLE_REDUCTION, cin_g, TRUE);
  sim_space_dim(op, D.kh, "kh", SIM_ROLE_REDUCTION, k[0], FALSE);
  sim_space_dim(op, D.kw, "kw", SIM_ROLE_REDUCTION, k[1], FALSE);

  SimTensorMap *mx = &op->space.maps[0], *mw = &op->space.maps[1];
  SimTensorMap *my = &op->space.maps[op->n_inputs + op->n_weights];
  /* Channel c of group g is g * (channels per group) + c. */
  if (D.g >= 0) {
    sim_map_affine(mx, 1, D.g, (int)cin_g, D.ci, 1, 0);
    sim_map_affine(mw, 0, D.g, (int)cout_g, D.co, 1, 0);
    sim_map_affine(my, 1, D.g, (int)cout_g, D.co, 1, 0);
  } else {
    sim_map_identity(mx, 1, D.ci);
    sim_map_identity(mw, 0, D.co);
    sim_map_identity(my, 1, D.co);
  }
  sim_map_identity(mx, 0, D.b);
  sim_map_affine(mx, 2, D.h, (int)s[0], D.kh, (int)dl[0], p[0]);
  sim_map_affine(mx, 3, D.w, (int)s[1], D.kw, (int)dl[1], p[1]);
  sim_map_identity(mw, 1, D.ci);
  sim_map_identity(mw, 2, D.kh);
  sim_map_identity(mw, 3, D.kw);
  sim_map_identity(my, 0, D.b);
  sim_map_identity(my, 2, D.h);
  sim_map_identity(my, 3, D.w);
  if (op->n_weights > 1)
    op->space.maps[2].map[0] = mw->map[0];
}

/* Channels padded to the tensor cores' 16-byte vectors: cuDNN's NHWC kernels pad a
 * 3-channel image to 8 fp16 channels (4 in fp32) and do the padded work. */
static int64_t pad_channels(int64_t c, SimDType dt)
{
  int64_t v = 16 / MAX((int64_t)sim_dtype_size(dt), 1);
  return (c + v - 1) / v * v;
}

static void conv_work(const SimOp *op, const int64_t *e, SimPass pass, SimWork *w)
{
  ConvDims D = conv_dims(op);
  SimDType dt = op->w_dtype;
  double es = sim_dtype_size(dt);
  int64_t groups = D.g >= 0 ? e[D.g] : 1;
  int64_t taps = e[D.kh] * e[D.kw];
  /* Implicit GEMM: m = n*ho*wo output positions, n = output channels, k = cin*kh*kw taps
   * of a group; 2*m*n*k FLOPs per group. */
  int64_t M = e[D.b] * e[D.h] * e[D.w], N = e[D.co], K = e[D.ci] * taps;
  double nx = (double)sim_map_numel(sim_space_input_map(op, 0), &op->in_shape[0], e);
  double nw = (double)sim_map_numel(sim_space_weight_map(op, 0), &op->w_shape[0], e);
  double ny = (double)groups * (double)M * (double)N;
  SimUnaryKind act = (SimUnaryKind)op->attrs[C_ACT].i[0];
  gboolean bias = op->attrs[C_BIAS].i[0] != 0;
  /* A depthwise convolution (one input and one output channel per group) has no
   * reduction to feed the tensor cores: each output reads its kh x kw window, and cuDNN
   * runs it as a bandwidth-bound kernel; its weight gradient reduces dy * x over the
   * positions, its data gradient spreads dy back over the windows. */
  gboolean depthwise = groups > 1 && N == 1 && e[D.ci] == 1;
  double conv_flops = 2.0 * ny * (double)K;
  if (pass == SIM_PASS_FORWARD) {
    if (depthwise) {
      sim_work_add(w, sim_kernel_memory(dt, conv_flops, (nx + nw + ny) * es));
    } else {
      /* Grouped convolutions run the groups side by side in the output tiles (cuDNN's
       * grouped kernels): one GEMM of all output channels over a group's reduction. */
      SimKernel k = sim_kernel_gemm(dt, 1, M, groups * N, pad_channels(e[D.ci], dt) * taps);
      k.kind = SIM_KERNEL_CONV;
      k.flops = conv_flops;
      k.bytes = (nx + nw + ny) * es;
      sim_work_add(w, k);
    }
    /* As for linear: the bias alone is fused into the convolution, an activation takes
     * an element-wise kernel that adds the bias too. */
    if (act != SIM_UNARY_IDENTITY)
      sim_work_add(w, sim_kernel_memory(dt, (sim_unary_flops(act, FALSE) + bias) * ny,
                                        2 * ny * es));
    return;
  }
  if (act != SIM_UNARY_IDENTITY)
    sim_work_add(w, sim_kernel_memory(dt, sim_unary_flops(act, TRUE) * ny, 3 * ny * es));
  if (depthwise) {
    if (!op->data_input)
      sim_work_add(w, sim_kernel_memory(dt, conv_flops, (ny + nw + nx) * es));
    sim_work_add(w, sim_kernel_memory(dt, conv_flops, (ny + nx + nw) * es));
  } else {
    /* The data gradient (cuDNN's dgrad) and the weight gradient (wgrad) do the forward's
     * multiply-adds each: dgrad as m = positions, n = cin, k = cout*kh*kw, wgrad as m =
     * cout, n = cin*kh*kw, k = positions, a long reduction over few outputs that the
     * libraries split (split-K, roofline.c).  No data gradient reaches the model's input
     * (the images). */
    if (!op->data_input) {
      SimKernel d = sim_kernel_gemm(dt, 1, M, groups * pad_channels(e[D.ci], dt), N * taps);
      d.kind = SIM_KERNEL_CONV;
      d.flops = conv_flops;
      d.bytes = (ny + nw + nx) * es;
      sim_work_add(w, d);
    }
    SimKernel g = sim_kernel_gemm(dt, groups, N, pad_channels(e[D.ci], dt) * taps, M);
    g.kind = SIM_KERNEL_CONV;
    g.flops = conv_flops;
    g.bytes = (ny + nx + nw) * es;
    sim_work_add(w, g);
  }
  if (bias)
    sim_work_add(w, sim_kernel_memory(dt, ny, ny * es + (double)groups * N * es));
}

static int64_t conv_saved(const SimOp *op, const int64_t *extent)
{
  int64_t full[SIM_MAX_ITER];
  const int64_t *e = sim_op_extent(op, extent, full);
  int64_t es = sim_dtype_size(op->w_dtype);
  /* X for the weight gradient; with an activation, its output for the derivative. */
  int64_t bytes = sim_map_numel(sim_space_input_map(op, 0), &op->in_shape[0], e) * es;
  if (op->attrs[C_ACT].i[0] != SIM_UNARY_IDENTITY)
    bytes += sim_map_numel(sim_space_output_map(op, 0), &op->out_shape[0], e) * es;
  return bytes;
}

const SimOpClass sim_op_conv2d_class = {
  .type = SIM_OP_CONV2D,
  .name = "conv2d",
  .description = "2-D convolution over NCHW with stride, padding, dilation and groups",
  .attrs = conv_attrs,
  .n_attrs = G_N_ELEMENTS(conv_attrs),
  .min_inputs = 1,
  .max_inputs = 1,
  .infer = conv_infer,
  .space = conv_space,
  .work = conv_work,
  .saved_bytes = conv_saved,
};

/* ---------------------------------------------------------------------------------- */
/* Pool2d                                                                              */

enum { P_KIND, P_KERNEL, P_STRIDE, P_PADDING, P_CEIL };

static const char *const pool_kind_names[] = { "max", "avg", NULL };

static const SimAttrSpec pool_attrs[] = {
  [P_KIND] = { "kind", SIM_ATTR_ENUM, SIM_POOL_MAX, pool_kind_names, FALSE },
  [P_KERNEL] = { "kernel", SIM_ATTR_INTS, 0, NULL, TRUE },
  [P_STRIDE] = { "stride", SIM_ATTR_INTS, 0, NULL, FALSE },
  [P_PADDING] = { "padding", SIM_ATTR_INTS, 0, NULL, FALSE },
  [P_CEIL] = { "ceil_mode", SIM_ATTR_BOOL, 0, NULL, FALSE },
};

/* The output size of pooling: with @ceil (PyTorch's ceil_mode) a last window that starts
 * inside the input or its left padding counts even where it runs past the right end. */
static int64_t pool_out_size(int64_t in, int64_t k, int64_t s, int64_t p, gboolean ceil)
{
  int64_t span = in + 2 * p - k;
  if (span < 0)
    return 0;
  if (!ceil)
    return span / s + 1;
  int64_t n = (span + s - 1) / s + 1;
  return (n - 1) * s >= in + p ? n - 1 : n;
}

enum { PB, PC, PH, PW, PKH, PKW };

static gboolean pool_infer(SimOp *op, GError **error)
{
  if (!sim_op_check_rank(op, 0, 4, 4, error) || !sim_op_check_float(op, 0, error))
    return FALSE;
  if (!pair(op, P_KERNEL, 1, 1, error))
    return FALSE;
  const int64_t *k = op->attrs[P_KERNEL].i;
  /* The stride defaults to the window, as in PyTorch. */
  if (op->attrs[P_STRIDE].n == 0) {
    op->attrs[P_STRIDE].n = 2;
    op->attrs[P_STRIDE].i[0] = k[0];
    op->attrs[P_STRIDE].i[1] = k[1];
  }
  if (!pair(op, P_STRIDE, 1, 1, error) || !pair(op, P_PADDING, 0, 0, error))
    return FALSE;
  const int64_t *s = op->attrs[P_STRIDE].i, *p = op->attrs[P_PADDING].i;
  if (2 * p[0] > k[0] || 2 * p[1] > k[1]) {
    sim_op_set_error(op, error, SIM_ERROR_INVALID,
                     "padding %" G_GINT64_FORMAT "x%" G_GINT64_FORMAT
                     " is more than half the %" G_GINT64_FORMAT "x%" G_GINT64_FORMAT " window",
                     p[0], p[1], k[0], k[1]);
    return FALSE;
  }
  const SimShape *x = &op->in_shape[0];
  gboolean ceil = op->attrs[P_CEIL].i[0] != 0;
  int64_t ho = pool_out_size(x->dims[2], k[0], s[0], p[0], ceil);
  int64_t wo = pool_out_size(x->dims[3], k[1], s[1], p[1], ceil);
  if (ho < 1 || wo < 1) {
    g_autofree char *xs = sim_shape_to_string(x);
    sim_op_set_error(op, error, SIM_ERROR_INVALID,
                     "the %" G_GINT64_FORMAT "x%" G_GINT64_FORMAT " window does not fit the "
                     "input %s",
                     k[0], k[1], xs);
    return FALSE;
  }
  sim_op_set_n_outputs(op, 1);
  op->out_shape[0] = sim_shape_make(4, (int64_t[]){ x->dims[0], x->dims[1], ho, wo });
  op->out_dtype[0] = op->in_dtype[0];
  op->n_weights = 0;
  op->w_dtype = op->in_dtype[0];
  return TRUE;
}

static void pool_space(SimOp *op)
{
  const SimShape *y = &op->out_shape[0];
  const int64_t *k = op->attrs[P_KERNEL].i, *s = op->attrs[P_STRIDE].i;
  const int64_t *p = op->attrs[P_PADDING].i;
  sim_space_init(op, 6);
  sim_space_dim(op, PB, "b", SIM_ROLE_SAMPLE, y->dims[0], TRUE);
  sim_space_dim(op, PC, "c", SIM_ROLE_PARAMETER, y->dims[1], TRUE);
  sim_space_dim(op, PH, "h", SIM_ROLE_ATTRIBUTE, y->dims[2], TRUE);
  sim_space_dim(op, PW, "w", SIM_ROLE_ATTRIBUTE, y->dims[3], TRUE);
  sim_space_dim(op, PKH, "kh", SIM_ROLE_REDUCTION, k[0], FALSE);
  sim_space_dim(op, PKW, "kw", SIM_ROLE_REDUCTION, k[1], FALSE);
  SimTensorMap *mx = &op->space.maps[0], *my = &op->space.maps[1];
  sim_map_identity(mx, 0, PB);
  sim_map_identity(mx, 1, PC);
  sim_map_affine(mx, 2, PH, (int)s[0], PKH, 1, p[0]);
  sim_map_affine(mx, 3, PW, (int)s[1], PKW, 1, p[1]);
  for (int d = 0; d < 4; d++)
    sim_map_identity(my, d, d);
}

static void pool_work(const SimOp *op, const int64_t *e, SimPass pass, SimWork *w)
{
  SimDType dt = op->out_dtype[0];
  double es = sim_dtype_size(dt);
  double ny = (double)e[PB] * e[PC] * e[PH] * e[PW];
  double nx = (double)sim_map_numel(sim_space_input_map(op, 0), &op->in_shape[0], e);
  double window = (double)e[PKH] * e[PKW];
  gboolean max = op->attrs[P_KIND].i[0] == SIM_POOL_MAX;
  /* Max pooling writes the int64 index of each maximum in training (PyTorch's
   * max_pool2d_with_indices) and its backward scatters dy through them; average pooling
   * spreads dy evenly over each window. */
  double idx = max ? 8 * ny : 0;
  if (pass == SIM_PASS_FORWARD)
    sim_work_add(w, sim_kernel_memory(dt, window * ny, (nx + ny) * es + idx));
  else
    sim_work_add(w, sim_kernel_memory(dt, max ? ny : window * ny, (nx + ny) * es + idx));
}

static int64_t pool_saved(const SimOp *op, const int64_t *extent)
{
  int64_t full[SIM_MAX_ITER];
  const int64_t *e = sim_op_extent(op, extent, full);
  if (op->attrs[P_KIND].i[0] != SIM_POOL_MAX)
    return 0;
  return 8 * e[PB] * e[PC] * e[PH] * e[PW];
}

const SimOpClass sim_op_pool2d_class = {
  .type = SIM_OP_POOL2D,
  .name = "pool2d",
  .description = "2-D max or average pooling over NCHW",
  .attrs = pool_attrs,
  .n_attrs = G_N_ELEMENTS(pool_attrs),
  .min_inputs = 1,
  .max_inputs = 1,
  .infer = pool_infer,
  .space = pool_space,
  .work = pool_work,
  .saved_bytes = pool_saved,
};
