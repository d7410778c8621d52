/* moe.c — the gated MLP of LLaMA-style blocks and a mixture of such MLPs.
 *
 * Gated MLP (Shazeer 2020, "GLU variants improve Transformer"): for x [b, (s...), d],
 *   y = (act(x Wg) * (x Wu)) Wd,   Wg, Wu [d, ffn], Wd [ffn, d], no biases,
 * SwiGLU with act = silu (LLaMA, Mixtral's experts), GeGLU with gelu.  Iteration
 * dimensions: b (sample), the middle s (attribute), f (parameter: the ffn columns of Wg
 * and Wu and the rows of Wd) and d (reduction, produced again by Wd; not split).  The
 * output is not indexed by f, so an f-split leaves partial outputs that the lowering sums:
 * Megatron's column-parallel gate and up projections and row-parallel down projection.
 *
 * Mixture of experts (Shazeer et al. 2017; Fedus et al. 2021; Mixtral, Jiang et al. 2024):
 * for x [b, s, d] and the router's logits [b, s, E] (a linear layer W_r [d, E] without bias,
 * an operator of its own) each token gets a softmax over the E experts; the token goes to
 * its top_k experts and its output is the sum of their outputs, weighted by
 * the probabilities of those k (renormalized to sum to one with "normalize_top_k", as
 * Mixtral does; left as they are without it, as DeepSeekMoE does).  Each expert is a gated
 * MLP: Wg, Wu [E, d, ffn], Wd [E, ffn, d].  Iteration dimensions: b, s, x (parameter: the
 * experts), f (parameter: the width of an expert) and d (reduction, not split).  The
 * logits are read whole along E by every shard, which routes all its tokens; the output
 * is indexed by neither x nor f, so a split of the experts leaves partial outputs (each
 * token's share from the shard's experts) that the lowering sums, and the logits'
 * gradient likewise.
 *
 * What a shard computes: its tokens T = b s route T k slots, of which the shard's x of E
 * experts receive T k x / E on average.  "capacity_factor" c > 0 gives every expert room
 * for c T k / E tokens (GShard, Switch): the expert GEMMs run over that many rows, padded,
 * and tokens beyond it are dropped.  With c = 0 (dropless, as Megablocks and Megatron-Core
 * run Mixtral) the experts take every token; "imbalance" (>= 1) is then the load of the
 * busiest shard of experts over the mean, which every shard of an expert split waits for.
 * Dispatch (gather the routed tokens in expert order) and combine (weight and scatter
 * back) are memory-bound kernels around one grouped GEMM per projection. */
#include "../sim-private.h"

#include <math.h>

/* ---------------------------------------------------------------------------------- */
/* Gated MLP                                                                           */

enum { G_FFN, G_ACT };

static const SimAttrSpec gated_attrs[] = {
  [G_FFN] = { "ffn", SIM_ATTR_INT, 0, NULL, TRUE },
  [G_ACT] = { "gate_activation", SIM_ATTR_ENUM, SIM_UNARY_SILU, sim_unary_kind_names, FALSE },
};

static gboolean gated_infer(SimOp *op, GError **error)
{
  if (!sim_op_check_rank(op, 0, 2, 4, error) || !sim_op_check_float(op, 0, error))
    return FALSE;
  int64_t f = op->attrs[G_FFN].i[0];
  if (f < 1) {
    sim_op_set_error(op, error, SIM_ERROR_INVALID, "ffn is %" G_GINT64_FORMAT ", not positive",
                     f);
    return FALSE;
  }
  const SimShape *x = &op->in_shape[0];
  int64_t d = x->dims[x->ndim - 1];
  sim_op_set_n_outputs(op, 1);
  op->out_shape[0] = *x;
  op->out_dtype[0] = op->in_dtype[0];
  op->n_weights = 3;
  op->w_shape[0] = sim_shape_make(2, (int64_t[]){ d, f });
  op->w_shape[1] = sim_shape_make(2, (int64_t[]){ d, f });
  op->w_shape[2] = sim_shape_make(2, (int64_t[]){ f, d });
  op->w_dtype = op->in_dtype[0];
  return TRUE;
}

static void gated_space(SimOp *op)
{
  const SimShape *x = &op->in_shape[0];
  int r = x->ndim, F = r - 1, D = r;
  sim_space_init(op, r + 1);
  sim_space_dim(op, 0, "b", SIM_ROLE_SAMPLE, x->dims[0], TRUE);
  for (int d = 1; d < r - 1; d++)
    sim_space_dim(op, d, sim_dim_seq_name(d - 1, r - 2), SIM_ROLE_ATTRIBUTE, x->dims[d], TRUE);
  sim_space_dim(op, F, "f", SIM_ROLE_PARAMETER, op->attrs[G_FFN].i[0], TRUE);
  sim_space_dim(op, D, "d", SIM_ROLE_REDUCTION, x->dims[r - 1], FALSE);
  SimTensorMap *m = op->space.maps;
  for (int d = 0; d < r - 1; d++) {
    sim_map_identity(&m[0], d, d);
    sim_map_identity(&m[4], d, d);
  }
  sim_map_identity(&m[0], r - 1, D);
  sim_map_identity(&m[4], r - 1, D);
  for (int i = 1; i <= 2; i++) {
    sim_map_identity(&m[i], 0, D);
    sim_map_identity(&m[i], 1, F);
  }
  sim_map_identity(&m[3], 0, F);
  sim_map_identity(&m[3], 1, D);
}

/* The kernels of @batch gated MLPs of @rows tokens each, width @f, model dimension @d:
 * one GEMM for the gate and up projections together, the activation times the up
 * projection, the down projection; backward the transposed products and the activation's
 * derivative. */
static void glu_work(SimDType dt, SimUnaryKind act, int64_t batch, int64_t rows, int64_t f,
                     int64_t d, SimPass pass, SimWork *w)
{
  double es = sim_dtype_size(dt);
  double mf = (double)batch * (double)rows * (double)f;
  if (pass == SIM_PASS_FORWARD) {
    sim_work_add(w, sim_kernel_gemm(dt, batch, rows, 2 * f, d));
    sim_work_add(w, sim_kernel_memory(dt, (sim_unary_flops(act, FALSE) + 1) * mf, 3 * mf * es));
    sim_work_add(w, sim_kernel_gemm(dt, batch, rows, d, f));
    return;
  }
  sim_work_add(w, sim_kernel_gemm(dt, batch, rows, f, d));     /* dH = dY Wd^T          */
  sim_work_add(w, sim_kernel_gemm(dt, batch, f, d, rows));     /* dWd = H^T dY          */
  /* dG = dH * U * act'(G), dU = dH * act(G): reads dH, G, U, writes dG, dU. */
  sim_work_add(w, sim_kernel_memory(dt, (sim_unary_flops(act, TRUE) + 3) * mf, 5 * mf * es));
  sim_work_add(w, sim_kernel_gemm(dt, batch, rows, d, 2 * f)); /* dX = [dG dU] [Wg Wu]^T */
  sim_work_add(w, sim_kernel_gemm(dt, batch, d, 2 * f, rows)); /* d[Wg Wu] = X^T [dG dU] */
}

static void gated_work(const SimOp *op, const int64_t *e, SimPass pass, SimWork *w)
{
  int r = op->in_shape[0].ndim;
  int64_t M = 1;
  for (int d = 0; d < r - 1; d++)
    M *= e[d];
  glu_work(op->w_dtype, (SimUnaryKind)op->attrs[G_ACT].i[0], 1, M, e[r - 1], e[r], pass, w);
}

static int64_t gated_saved(const SimOp *op, const int64_t *extent)
{
  int64_t full[SIM_MAX_ITER];
  const int64_t *e = sim_op_extent(op, extent, full);
  int r = op->in_shape[0].ndim;
  int64_t M = 1;
  for (int d = 0; d < r - 1; d++)
    M *= e[d];
  /* X for the weight gradients, G and U for the activation's, H for Wd's. */
  return (M * e[r] + 3 * M * e[r - 1]) * sim_dtype_size(op->w_dtype);
}

const SimOpClass sim_op_gated_mlp_class = {
  .type = SIM_OP_GATED_MLP,
  .name = "gated_mlp",
  .description = "gated MLP (act(x Wg) * (x Wu)) Wd: SwiGLU with silu, GeGLU with gelu",
  .attrs = gated_attrs,
  .n_attrs = G_N_ELEMENTS(gated_attrs),
  .min_inputs = 1,
  .max_inputs = 1,
  .infer = gated_infer,
  .space = gated_space,
  .work = gated_work,
  .saved_bytes = gated_saved,
};

/* ---------------------------------------------------------------------------------- */
/* Mixture of experts                                                                  */

enum { M_EXPERTS, M_TOP_K, M_FFN, M_ACT, M_CAPACITY, M_IMBALANCE, M_NORMALIZE };

static const SimAttrSpec moe_attrs[] = {
  [M_EXPERTS] = { "experts", SIM_ATTR_INT, 0, NULL, TRUE },
  [M_TOP_K] = { "top_k", SIM_ATTR_INT, 0, NULL, TRUE },
  [M_FFN] = { "ffn", SIM_ATTR_INT, 0, NULL, TRUE },
  [M_ACT] = { "gate_activation", SIM_ATTR_ENUM, SIM_UNARY_SILU, sim_unary_kind_names, FALSE },
  /* Rows per expert as a multiple of the mean T k / E; 0: dropless. */
  [M_CAPACITY] = { "capacity_factor", SIM_ATTR_FLOAT, 0.0, NULL, FALSE },
  /* Dropless: the busiest expert shard's tokens over the mean. */
  [M_IMBALANCE] = { "imbalance", SIM_ATTR_FLOAT, 1.0, NULL, FALSE },
  [M_NORMALIZE] = { "normalize_top_k", SIM_ATTR_BOOL, 1, NULL, FALSE },
};

enum { MB, MS, MX, MF, MD };

static gboolean moe_infer(SimOp *op, GError **error)
{
  if (!sim_op_check_rank(op, 0, 3, 3, error) || !sim_op_check_float(op, 0, error) ||
      !sim_op_check_rank(op, 1, 3, 3, error) || !sim_op_check_float(op, 1, error))
    return FALSE;
  int64_t E = op->attrs[M_EXPERTS].i[0], k = op->attrs[M_TOP_K].i[0];
  int64_t f = op->attrs[M_FFN].i[0];
  double c = op->attrs[M_CAPACITY].f, imb = op->attrs[M_IMBALANCE].f;
  if (E < 1 || f < 1 || k < 1 || k > E) {
    sim_op_set_error(op, error, SIM_ERROR_INVALID,
                     "%" G_GINT64_FORMAT " experts of width %" G_GINT64_FORMAT ", top %"
                     G_GINT64_FORMAT ": expected positive sizes and 1 <= top_k <= experts",
                     E, f, k);
    return FALSE;
  }
  if (!(c >= 0 && isfinite(c)) || !(imb >= 1 && isfinite(imb))) {
    sim_op_set_error(op, error, SIM_ERROR_INVALID,
                     "capacity_factor %g and imbalance %g: expected capacity_factor >= 0 (0: "
                     "dropless) and imbalance >= 1", c, imb);
    return FALSE;
  }
  const SimShape *x = &op->in_shape[0], *lg = &op->in_shape[1];
  if (lg->dims[0] != x->dims[0] || lg->dims[1] != x->dims[1] || lg->dims[2] != E) {
    g_autofree char *sx = sim_shape_to_string(x);
    g_autofree char *sl = sim_shape_to_string(lg);
    sim_op_set_error(op, error, SIM_ERROR_INVALID,
                     "x %s and logits %s: expected logits [b, s, experts] with %" G_GINT64_FORMAT
                     " experts", sx, sl, E);
    return FALSE;
  }
  int64_t d = x->dims[2];
  sim_op_set_n_outputs(op, 1);
  op->out_shape[0] = op->in_shape[0];
  op->out_dtype[0] = op->in_dtype[0];
  op->n_weights = 3;
  op->w_shape[0] = sim_shape_make(3, (int64_t[]){ E, d, f });
  op->w_shape[1] = sim_shape_make(3, (int64_t[]){ E, d, f });
  op->w_shape[2] = sim_shape_make(3, (int64_t[]){ E, f, d });
  op->w_dtype = op->in_dtype[0];
  return TRUE;
}

static void moe_space(SimOp *op)
{
  const SimShape *x = &op->in_shape[0];
  sim_space_init(op, 5);
  sim_space_dim(op, MB, "b", SIM_ROLE_SAMPLE, x->dims[0], TRUE);
  sim_space_dim(op, MS, "s", SIM_ROLE_ATTRIBUTE, x->dims[1], TRUE);
  sim_space_dim(op, MX, "x", SIM_ROLE_PARAMETER, op->attrs[M_EXPERTS].i[0], TRUE);
  sim_space_dim(op, MF, "f", SIM_ROLE_PARAMETER, op->attrs[M_FFN].i[0], TRUE);
  sim_space_dim(op, MD, "d", SIM_ROLE_REDUCTION, x->dims[2], FALSE);
  SimTensorMap *m = op->space.maps;
  sim_map_identity(&m[0], 0, MB);
  sim_map_identity(&m[0], 1, MS);
  sim_map_identity(&m[0], 2, MD);
  /* The logits: every expert's column on every shard. */
  sim_map_identity(&m[1], 0, MB);
  sim_map_identity(&m[1], 1, MS);
  for (int i = 2; i <= 3; i++) {
    sim_map_identity(&m[i], 0, MX);
    sim_map_identity(&m[i], 1, MD);
    sim_map_identity(&m[i], 2, MF);
  }
  sim_map_identity(&m[4], 0, MX);
  sim_map_identity(&m[4], 1, MF);
  sim_map_identity(&m[4], 2, MD);
  sim_map_identity(&m[5], 0, MB);
  sim_map_identity(&m[5], 1, MS);
  sim_map_identity(&m[5], 2, MD);
}

/* The token rows one shard's experts process (see the top). */
static double moe_rows(const SimOp *op, const int64_t *e)
{
  double T = (double)e[MB] * (double)e[MS];
  double E = (double)op->attrs[M_EXPERTS].i[0], k = (double)op->attrs[M_TOP_K].i[0];
  double x = (double)e[MX], c = op->attrs[M_CAPACITY].f;
  if (c > 0)
    return x * ceil(c * T * k / E);
  if (x >= E)
    return T * k;
  return MIN(T * k * x / E * op->attrs[M_IMBALANCE].f, T * k);
}

int64_t sim_moe_shard_rows(const SimOp *op, const int64_t *extent)
{
  int64_t full[SIM_MAX_ITER];
  return (int64_t)moe_rows(op, sim_op_extent(op, extent, full));
}

/* The experts' gated MLPs as grouped GEMMs (Transformer Engine's GroupedLinear, which runs
 * in FP8 under --precision fp8 like any linear layer). */
static void grouped_glu(SimDType dt, SimUnaryKind act, int64_t experts, int64_t rows, int64_t f,
                        int64_t d, SimPass pass, SimWork *w)
{
  int first = w->n;
  glu_work(dt, act, experts, rows, f, d, pass, w);
  for (int i = first; i < w->n; i++)
    if (w->k[i].kind == SIM_KERNEL_GEMM)
      w->k[i].flags |= SIM_KERNEL_GROUPED;
}

/* The tokens a shard routes, permutes and un-permutes itself: its share of the tokens of
 * its sample range.  Megatron-Core's dispatcher runs the router, the permutation and the
 * un-permutation on the tokens each GPU of an expert group holds (under sequence
 * parallelism, or without tensor parallelism, which Megatron-Core requires beside
 * experts), and the group's n = (E / x) (F / f) GPUs hold equal shares; the tokens move
 * between them in the all-to-all (sim/lower-tensors.c, routed_fraction()). */
static double moe_own_tokens(const SimOp *op, const int64_t *e)
{
  double E = (double)op->attrs[M_EXPERTS].i[0], F = (double)op->attrs[M_FFN].i[0];
  return (double)e[MB] * (double)e[MS] * ((double)e[MX] / E) * ((double)e[MF] / F);
}

/* Work of a shard (see the top).  Its own tokens t: the router's softmax and top-k over
 * their logits, the permutation of their k rows each into expert order (one fused gather,
 * as Megatron-Core's --moe-permute-fusion: t D read, t k D written) and at the end the
 * un-permutation (each row weighted and the k of a token summed: t k D read, t D
 * written); with a capacity factor c, the padded t k c rows instead of t k.  A shard that
 * holds several of the experts but not all receives its rows from the all-to-all in order
 * of their source and sorts them by expert before its grouped GEMMs and back after
 * (Megatron-Core's sort_chunks_by_idxs: R D read and written each way, R the rows its
 * experts compute).  Backward mirrors each kernel. */
static void moe_work(const SimOp *op, const int64_t *e, SimPass pass, SimWork *w)
{
  SimDType dt = op->w_dtype;
  double es = sim_dtype_size(dt);
  int64_t E = op->attrs[M_EXPERTS].i[0], k = op->attrs[M_TOP_K].i[0];
  int64_t D = e[MD], F = e[MF], X = e[MX];
  double R = moe_rows(op, e), c = op->attrs[M_CAPACITY].f;
  double t = moe_own_tokens(op, e);
  double tE = t * (double)E, tD = t * (double)D, RD = R * (double)D;
  double out = t * (double)k * (c > 0 ? c : 1.0), oD = out * (double)D;
  gboolean sort = X > 1 && X < E;
  /* One expert's rows in the grouped GEMMs: the shard's rows spread over its experts,
   * rounded up to a whole 16-byte vector of rows.  The row count is no leading dimension
   * of any operand (each expert's rows start at a multiple of the aligned width D, and
   * its products read and write rows of D or F elements), so a count that is not a
   * multiple of 8 does not misalign the GEMM as an odd vocabulary does (the roofline's
   * unaligned rate, sim/roofline.c): its last tile is partly empty, as for the rounded
   * count; Megatron-Core pads each expert's rows to 16 for FP8 itself. */
  int64_t vec = MAX((int64_t)(16 / es), 1);
  int64_t per = ((int64_t)ceil(R / (double)X) + vec - 1) / vec * vec;
  SimUnaryKind act = (SimUnaryKind)op->attrs[M_ACT].i[0];
  if (pass == SIM_PASS_FORWARD) {
    /* Softmax and top-k of the logits in fp32 (softmax 10 per logit, a comparison per
     * logit for each of the k picks), writing the k indices and weights per token. */
    sim_work_add(w, sim_kernel_memory(SIM_DTYPE_FP32, (10.0 + (double)k) * tE,
                                      tE * es + t * (double)k * 8));
    /* Permutation: gather each routed token's row in expert order. */
    sim_work_add(w, sim_kernel_memory(dt, 0, tD * es + oD * es));
    if (sort)
      sim_work_add(w, sim_kernel_memory(dt, 0, 2 * RD * es));
    grouped_glu(dt, act, X, per, F, D, pass, w);
    if (sort)
      sim_work_add(w, sim_kernel_memory(dt, 0, 2 * RD * es));
    /* Un-permutation: weight each row and sum the k rows of every token. */
    sim_work_add(w, sim_kernel_memory(dt, 2 * oD, oD * es + tD * es + out * 4));
    return;
  }
  /* Un-permutation's backward: the rows' gradients (the token's gradient times its
   * weight) and the weights' gradients (a dot product per row). */
  sim_work_add(w, sim_kernel_memory(dt, 3 * oD, tD * es + 2 * oD * es + out * 4));
  if (sort)
    sim_work_add(w, sim_kernel_memory(dt, 0, 2 * RD * es));
  grouped_glu(dt, act, X, per, F, D, pass, w);
  if (sort)
    sim_work_add(w, sim_kernel_memory(dt, 0, 2 * RD * es));
  /* Permutation's backward: scatter-add the rows' gradients to their tokens. */
  sim_work_add(w, sim_kernel_memory(dt, oD, oD * es + 2 * tD * es));
  /* Top-k softmax's backward to the logits. */
  sim_work_add(w, sim_kernel_memory(SIM_DTYPE_FP32, 5 * tE, 2 * tE * 4 + tE * es));
}

static int64_t moe_saved(const SimOp *op, const int64_t *extent)
{
  int64_t full[SIM_MAX_ITER];
  const int64_t *e = sim_op_extent(op, extent, full);
  int64_t es = sim_dtype_size(op->w_dtype);
  int64_t T = e[MB] * e[MS], E = op->attrs[M_EXPERTS].i[0], k = op->attrs[M_TOP_K].i[0];
  int64_t R = (int64_t)moe_rows(op, e);
  /* x, the fp32 routing probabilities and the k picks of each token, the dispatched rows,
   * each expert's G, U and H, and its output rows for the weights' gradients. */
  return T * e[MD] * es + T * E * 4 + T * k * 8 + R * e[MD] * es + 3 * R * e[MF] * es +
         R * e[MD] * es;
}

const SimOpClass sim_op_moe_class = {
  .type = SIM_OP_MOE,
  .name = "moe",
  .description = "mixture of gated-MLP experts with a top-k softmax router (Mixtral, "
                 "DeepSeekMoE)",
  .attrs = moe_attrs,
  .n_attrs = G_N_ELEMENTS(moe_attrs),
  .min_inputs = 2,
  .max_inputs = 2,
  .infer = moe_infer,
  .space = moe_space,
  .work = moe_work,
  .saved_bytes = moe_saved,
};
