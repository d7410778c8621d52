/* norm.c — batch normalization (per channel, over the batch and positions) and layer
 * normalization (per position, over the last dimension).
 *
 * Batch norm's iteration dimensions are b (sample), c (parameter: gamma and beta are
 * indexed by it) and the positions (attribute).  Splitting b or the positions makes each
 * shard normalize with the statistics of its own part of the batch, as frameworks do
 * without synchronized batch norm; the simulator prices that plan, it does not insert the
 * all-reduce of the statistics that SyncBatchNorm would add.
 *
 * Layer norm's dimensions are b, the middle dimensions s (attribute) and d, the
 * normalized dimension, which indexes gamma and beta and cannot be split: each shard
 * needs whole rows for their mean and variance.
 *
 * RMS norm (Zhang and Sennrich 2019, as LLaMA uses it) is layer norm without the mean and
 * the shift: y = x / sqrt(mean(x^2) + eps) * gamma, with the same dimensions and one
 * weight. */
#include "../sim-private.h"

/* ---------------------------------------------------------------------------------- */
/* Batch norm                                                                          */

enum { BN_RELU };

static const SimAttrSpec bn_attrs[] = {
  [BN_RELU] = { "relu", SIM_ATTR_BOOL, 0, NULL, FALSE },
};

static gboolean bn_infer(SimOp *op, GError **error)
{
  /* [N, C] (BatchNorm1d), [N, C, L] or [N, C, H, W]. */
  if (!sim_op_check_rank(op, 0, 2, 4, error) || !sim_op_check_float(op, 0, error))
    return FALSE;
  int64_t c = op->in_shape[0].dims[1];
  sim_op_set_n_outputs(op, 1);
  op->out_shape[0] = op->in_shape[0];
  op->out_dtype[0] = op->in_dtype[0];
  op->n_weights = 2;
  op->w_shape[0] = sim_shape_make(1, &c);
  op->w_shape[1] = sim_shape_make(1, &c);
  op->w_dtype = op->in_dtype[0];
  return TRUE;
}

static void bn_space(SimOp *op)
{
  static const char *const pos3[] = { "l" }, *const pos4[] = { "h", "w" };
  const SimShape *x = &op->in_shape[0];
  sim_space_init(op, x->ndim);
  sim_space_dim(op, 0, "b", SIM_ROLE_SAMPLE, x->dims[0], TRUE);
  sim_space_dim(op, 1, "c", SIM_ROLE_PARAMETER, x->dims[1], TRUE);
  for (int d = 2; d < x->ndim; d++)
    sim_space_dim(op, d, x->ndim == 3 ? pos3[d - 2] : pos4[d - 2], SIM_ROLE_ATTRIBUTE,
                  x->dims[d], TRUE);
  for (int d = 0; d < x->ndim; d++) {
    sim_map_identity(&op->space.maps[0], d, d);
    sim_map_identity(&op->space.maps[3], d, d);
  }
  sim_map_identity(&op->space.maps[1], 0, 1);
  sim_map_identity(&op->space.maps[2], 0, 1);
}

static void bn_work(const SimOp *op, const int64_t *e, SimPass pass, SimWork *w)
{
  SimDType dt = op->out_dtype[0];
  double es = sim_dtype_size(dt);
  double n = (double)sim_extent_volume(op, e);
  double c = (double)e[1];
  double relu = op->attrs[BN_RELU].i[0] ? 1 : 0;
  if (pass == SIM_PASS_FORWARD) {
    /* Training batch norm reads x twice: once for the per-channel sum and sum of squares
     * (kept in fp32), once to normalize y = x * scale + shift (and clamp with relu). */
    sim_work_add(w, sim_kernel_memory(dt, 3 * n, n * es + 2 * c * 4));
    sim_work_add(w, sim_kernel_memory(dt, (4 + relu) * n, 2 * n * es + 4 * c * es));
    return;
  }
  /* First the reductions sum(dy) and sum(dy * xhat) for dbeta and dgamma, then dx from
   * dy, x and those sums; with relu both also read y for its mask. */
  sim_work_add(w, sim_kernel_memory(dt, 4 * n, (2 + relu) * n * es + 2 * c * 4));
  sim_work_add(w, sim_kernel_memory(dt, 5 * n, (3 + relu) * n * es + 4 * c * es));
}

static int64_t bn_saved(const SimOp *op, const int64_t *extent)
{
  int64_t full[SIM_MAX_ITER];
  const int64_t *e = sim_op_extent(op, extent, full);
  int64_t n = sim_extent_volume(op, e), es = sim_dtype_size(op->out_dtype[0]);
  /* x, the fp32 mean and inverse deviation per channel, and y for relu's mask. */
  return n * es + 2 * e[1] * 4 + (op->attrs[BN_RELU].i[0] ? n * es : 0);
}

const SimOpClass sim_op_batchnorm_class = {
  .type = SIM_OP_BATCHNORM,
  .name = "batchnorm",
  .description = "batch normalization per channel over N, H, W, with an optional relu",
  .attrs = bn_attrs,
  .n_attrs = G_N_ELEMENTS(bn_attrs),
  .min_inputs = 1,
  .max_inputs = 1,
  .infer = bn_infer,
  .space = bn_space,
  .work = bn_work,
  .saved_bytes = bn_saved,
};

/* ---------------------------------------------------------------------------------- */
/* Layer norm                                                                          */

static gboolean ln_infer(SimOp *op, GError **error)
{
  if (!sim_op_check_rank(op, 0, 2, 4, error) || !sim_op_check_float(op, 0, error))
    return FALSE;
  const SimShape *x = &op->in_shape[0];
  int64_t d = x->dims[x->ndim - 1];
  sim_op_set_n_outputs(op, 1);
  op->out_shape[0] = *x;
  op->out_dtype[0] = op->in_dtype[0];
  op->n_weights = 2;
  op->w_shape[0] = sim_shape_make(1, &d);
  op->w_shape[1] = sim_shape_make(1, &d);
  op->w_dtype = op->in_dtype[0];
  return TRUE;
}

static void ln_space(SimOp *op)
{
  const SimShape *x = &op->in_shape[0];
  int r = x->ndim;
  sim_space_init(op, r);
  sim_space_dim(op, 0, "b", SIM_ROLE_SAMPLE, x->dims[0], TRUE);
  for (int d = 1; d < r - 1; d++)
    sim_space_dim(op, d, sim_dim_seq_name(d - 1, r - 2), SIM_ROLE_ATTRIBUTE, x->dims[d], TRUE);
  sim_space_dim(op, r - 1, "d", SIM_ROLE_PARAMETER, x->dims[r - 1], FALSE);
  for (int d = 0; d < r; d++) {
    sim_map_identity(&op->space.maps[0], d, d);
    sim_map_identity(&op->space.maps[3], d, d);
  }
  sim_map_identity(&op->space.maps[1], 0, r - 1);
  sim_map_identity(&op->space.maps[2], 0, r - 1);
}

static void ln_work(const SimOp *op, const int64_t *e, SimPass pass, SimWork *w)
{
  int r = op->in_shape[0].ndim;
  SimDType dt = op->out_dtype[0];
  double es = sim_dtype_size(dt);
  double D = (double)e[r - 1];
  double n = (double)sim_extent_volume(op, e);
  double rows = n / D;
  if (pass == SIM_PASS_FORWARD) {
    /* One fused kernel (Apex/PyTorch): mean and variance (4 per element), normalize and
     * scale and shift (4); reads x, gamma, beta, writes y and the fp32 mean and rstd of
     * each row. */
    sim_work_add(w, sim_kernel_memory(dt, 8 * n, 2 * n * es + 2 * D * es + 8 * rows));
    return;
  }
  /* dx from dy, x, gamma and the row statistics (two row reductions, 9 per element), and
   * dgamma, dbeta reduced over the rows (4 per element). */
  sim_work_add(w, sim_kernel_memory(dt, 9 * n, 3 * n * es + D * es + 8 * rows));
  sim_work_add(w, sim_kernel_memory(dt, 4 * n, 2 * n * es + 8 * rows + 2 * D * es));
}

static int64_t ln_saved(const SimOp *op, const int64_t *extent)
{
  int64_t full[SIM_MAX_ITER];
  const int64_t *e = sim_op_extent(op, extent, full);
  int r = op->in_shape[0].ndim;
  int64_t n = sim_extent_volume(op, e);
  /* x and the fp32 mean and rstd of each row. */
  return n * sim_dtype_size(op->out_dtype[0]) + 8 * (n / e[r - 1]);
}

const SimOpClass sim_op_layernorm_class = {
  .type = SIM_OP_LAYERNORM,
  .name = "layernorm",
  .description = "layer normalization over the last dimension",
  .attrs = NULL,
  .n_attrs = 0,
  .min_inputs = 1,
  .max_inputs = 1,
  .infer = ln_infer,
  .space = ln_space,
  .work = ln_work,
  .saved_bytes = ln_saved,
};

/* ---------------------------------------------------------------------------------- */
/* RMS norm                                                                            */

static gboolean rms_infer(SimOp *op, GError **error)
{
  if (!sim_op_check_rank(op, 0, 2, 4, error) || !sim_op_check_float(op, 0, error))
    return FALSE;
  const SimShape *x = &op->in_shape[0];
  int64_t d = x->dims[x->ndim - 1];
  sim_op_set_n_outputs(op, 1);
  op->out_shape[0] = *x;
  op->out_dtype[0] = op->in_dtype[0];
  op->n_weights = 1;
  op->w_shape[0] = sim_shape_make(1, &d);
  op->w_dtype = op->in_dtype[0];
  return TRUE;
}

static void rms_space(SimOp *op)
{
  const SimShape *x = &op->in_shape[0];
  int r = x->ndim;
  sim_space_init(op, r);
  sim_space_dim(op, 0, "b", SIM_ROLE_SAMPLE, x->dims[0], TRUE);
  for (int d = 1; d < r - 1; d++)
    sim_space_dim(op, d, sim_dim_seq_name(d - 1, r - 2), SIM_ROLE_ATTRIBUTE, x->dims[d], TRUE);
  sim_space_dim(op, r - 1, "d", SIM_ROLE_PARAMETER, x->dims[r - 1], FALSE);
  for (int d = 0; d < r; d++) {
    sim_map_identity(&op->space.maps[0], d, d);
    sim_map_identity(&op->space.maps[2], d, d);
  }
  sim_map_identity(&op->space.maps[1], 0, r - 1);
}

static void rms_work(const SimOp *op, const int64_t *e, SimPass pass, SimWork *w)
{
  int r = op->in_shape[0].ndim;
  SimDType dt = op->out_dtype[0];
  double es = sim_dtype_size(dt);
  double D = (double)e[r - 1];
  double n = (double)sim_extent_volume(op, e);
  double rows = n / D;
  if (pass == SIM_PASS_FORWARD) {
    /* One fused kernel (Apex's FusedRMSNorm, Transformer Engine): the sum of squares (2
     * per element), then x * rstd * gamma (2); reads x and gamma, writes y and the fp32
     * rstd of each row. */
    sim_work_add(w, sim_kernel_memory(dt, 4 * n, 2 * n * es + D * es + 4 * rows));
    return;
  }
  /* dx = rstd * (g - xhat * mean(g * xhat)) with g = dy * gamma: one row reduction (6 per
   * element); dgamma = sum over rows of dy * xhat (2 per element). */
  sim_work_add(w, sim_kernel_memory(dt, 6 * n, 3 * n * es + D * es + 4 * rows));
  sim_work_add(w, sim_kernel_memory(dt, 2 * n, 2 * n * es + 4 * rows + D * es));
}

static int64_t rms_saved(const SimOp *op, const int64_t *extent)
{
  int64_t full[SIM_MAX_ITER];
  const int64_t *e = sim_op_extent(op, extent, full);
  int r = op->in_shape[0].ndim;
  int64_t n = sim_extent_volume(op, e);
  /* x and the fp32 rstd of each row. */
  return n * sim_dtype_size(op->out_dtype[0]) + 4 * (n / e[r - 1]);
}

const SimOpClass sim_op_rmsnorm_class = {
  .type = SIM_OP_RMSNORM,
  .name = "rmsnorm",
  .description = "root-mean-square normalization over the last dimension (scale, no shift)",
  .attrs = NULL,
  .n_attrs = 0,
  .min_inputs = 1,
  .max_inputs = 1,
  .infer = rms_infer,
  .space = rms_space,
  .work = rms_work,
  .saved_bytes = rms_saved,
};
