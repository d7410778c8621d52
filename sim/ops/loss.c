/* loss.c — the losses that end a training graph, per sample (or per token): the reduction
 * to one number is a negligible sum the simulator does not price.
 *
 * Cross entropy: logits [b, (s...), C] and integer labels [b, (s...)] -> loss [b, (s...)].
 * Dimensions b (sample), s (attribute) and c (reduction over the classes).  The loss is
 * not indexed by c, so a c-split is the vocabulary-parallel cross entropy of Megatron:
 * each shard reduces its slice of the classes and the partial maxima and sums are
 * combined.
 *
 * With "fp32" set and 16-bit logits, the loss runs as Megatron runs it by default
 * (fp16_lm_cross_entropy off): the logits are cast to fp32 and the softmax is taken in
 * separate passes over them, each a kernel of its own that reads (and writes) the fp32
 * logits: forward cast, max, subtract, exp, sum, divide; backward scale by dloss and cast
 * back.  The fp32 softmax is what the backward pass keeps.
 *
 * MSE: pred and target of one shape -> loss [b], the mean over each sample's elements;
 * dimension 0 is the sample and the others are reductions. */
#include "../sim-private.h"

/* ---------------------------------------------------------------------------------- */
/* Cross entropy                                                                       */

enum { CE_FP32 };

static const SimAttrSpec ce_attrs[] = {
  [CE_FP32] = { "fp32", SIM_ATTR_BOOL, 0, NULL, FALSE },
};

/* TRUE if the loss upcasts 16-bit logits to fp32 (see the top). */
static gboolean ce_upcast(const SimOp *op)
{
  return op->attrs[CE_FP32].i[0] && sim_dtype_size(op->in_dtype[0]) < 4;
}

static gboolean ce_infer(SimOp *op, GError **error)
{
  if (!sim_op_check_rank(op, 0, 2, 4, error) || !sim_op_check_float(op, 0, error))
    return FALSE;
  const SimShape *logits = &op->in_shape[0], *labels = &op->in_shape[1];
  gboolean ok = labels->ndim == logits->ndim - 1;
  for (int d = 0; ok && d < labels->ndim; d++)
    ok = labels->dims[d] == logits->dims[d];
  if (!ok) {
    g_autofree char *a = sim_shape_to_string(logits);
    g_autofree char *b = sim_shape_to_string(labels);
    sim_op_set_error(op, error, SIM_ERROR_INVALID,
                     "logits %s and labels %s: the labels must have the logits' shape "
                     "without the last dimension",
                     a, b);
    return FALSE;
  }
  if (op->in_dtype[1] != SIM_DTYPE_INT32 && op->in_dtype[1] != SIM_DTYPE_INT64) {
    sim_op_set_error(op, error, SIM_ERROR_INVALID, "the labels are %s, not int32 or int64",
                     sim_dtype_name(op->in_dtype[1]));
    return FALSE;
  }
  sim_op_set_n_outputs(op, 1);
  op->out_shape[0] = *labels;
  op->out_dtype[0] = op->in_dtype[0];
  op->n_weights = 0;
  op->w_dtype = op->in_dtype[0];
  return TRUE;
}

static void ce_space(SimOp *op)
{
  const SimShape *logits = &op->in_shape[0];
  int r = logits->ndim, c = r - 1;
  sim_space_init(op, r);
  sim_space_dim(op, 0, "b", SIM_ROLE_SAMPLE, logits->dims[0], TRUE);
  for (int d = 1; d < c; d++)
    sim_space_dim(op, d, sim_dim_seq_name(d - 1, r - 2), SIM_ROLE_ATTRIBUTE, logits->dims[d],
                  TRUE);
  sim_space_dim(op, c, "c", SIM_ROLE_REDUCTION, logits->dims[c], TRUE);
  for (int d = 0; d < r; d++)
    sim_map_identity(&op->space.maps[0], d, d);
  for (int d = 0; d < c; d++) {
    sim_map_identity(&op->space.maps[1], d, d);
    sim_map_identity(&op->space.maps[2], d, d);
  }
}

static void ce_work(const SimOp *op, const int64_t *e, SimPass pass, SimWork *w)
{
  SimDType dt = op->out_dtype[0];
  double es = sim_dtype_size(dt), ls = sim_dtype_size(op->in_dtype[1]);
  double n = (double)sim_extent_volume(op, e);
  double rows = n / (double)e[op->space.ndims - 1];
  /* Forward: log-softmax (max, subtract, exp, sum, log: 8 per logit), kept for backward,
   * and the pick of each row's label.  Backward: dlogits = softmax - onehot(label),
   * scaled by dloss (3 per logit). */
  if (ce_upcast(op)) {
    /* Bytes per logit of each pass (fp32 is 4): */
    static const double fwd[] = { 2 + 4, 4, 4 + 4, 4 + 4, 4, 4 + 4 }; /* cast .. divide */
    static const double bwd[] = { 4 + 4, 4 + 2 };                      /* scale, cast  */
    const double *k = pass == SIM_PASS_FORWARD ? fwd : bwd;
    int nk = pass == SIM_PASS_FORWARD ? G_N_ELEMENTS(fwd) : G_N_ELEMENTS(bwd);
    for (int i = 0; i < nk; i++)
      sim_work_add(w, sim_kernel_memory(SIM_DTYPE_FP32, n, k[i] * n + (i == 0 ? rows * ls : 0)));
    return;
  }
  double flops = pass == SIM_PASS_FORWARD ? 8 * n : 3 * n;
  sim_work_add(w, sim_kernel_memory(dt, flops, 2 * n * es + rows * (ls + es)));
}

static int64_t ce_saved(const SimOp *op, const int64_t *extent)
{
  int64_t full[SIM_MAX_ITER];
  const int64_t *e = sim_op_extent(op, extent, full);
  int64_t n = sim_extent_volume(op, e);
  int64_t rows = n / e[op->space.ndims - 1];
  /* The log-probabilities (the logits' size, in fp32 when upcast) and the labels. */
  int64_t es = ce_upcast(op) ? 4 : sim_dtype_size(op->out_dtype[0]);
  return n * es + rows * sim_dtype_size(op->in_dtype[1]);
}

const SimOpClass sim_op_cross_entropy_class = {
  .type = SIM_OP_CROSS_ENTROPY,
  .name = "cross_entropy",
  .description = "softmax cross entropy of logits against integer labels, per sample",
  .attrs = ce_attrs,
  .n_attrs = G_N_ELEMENTS(ce_attrs),
  .min_inputs = 2,
  .max_inputs = 2,
  .infer = ce_infer,
  .space = ce_space,
  .work = ce_work,
  .saved_bytes = ce_saved,
};

/* ---------------------------------------------------------------------------------- */
/* Mean squared error                                                                  */

static gboolean mse_infer(SimOp *op, GError **error)
{
  if (!sim_op_check_rank(op, 0, 1, SIM_MAX_DIMS, error) || !sim_op_check_float(op, 0, error) ||
      !sim_op_check_float(op, 1, error))
    return FALSE;
  if (!sim_shape_equal(&op->in_shape[0], &op->in_shape[1])) {
    g_autofree char *a = sim_shape_to_string(&op->in_shape[0]);
    g_autofree char *b = sim_shape_to_string(&op->in_shape[1]);
    sim_op_set_error(op, error, SIM_ERROR_INVALID,
                     "the prediction %s and the target %s differ in shape", a, b);
    return FALSE;
  }
  sim_op_set_n_outputs(op, 1);
  op->out_shape[0] = sim_shape_make(1, &op->in_shape[0].dims[0]);
  op->out_dtype[0] = op->in_dtype[0];
  op->n_weights = 0;
  op->w_dtype = op->in_dtype[0];
  return TRUE;
}

static void mse_space(SimOp *op)
{
  const SimShape *x = &op->in_shape[0];
  sim_space_init(op, x->ndim);
  for (int d = 0; d < x->ndim; d++) {
    sim_space_dim(op, d, sim_dim_generic_name(d), d == 0 ? SIM_ROLE_SAMPLE : SIM_ROLE_REDUCTION,
                  x->dims[d], TRUE);
    sim_map_identity(&op->space.maps[0], d, d);
    sim_map_identity(&op->space.maps[1], d, d);
  }
  sim_map_identity(&op->space.maps[2], 0, 0);
}

static void mse_work(const SimOp *op, const int64_t *e, SimPass pass, SimWork *w)
{
  SimDType dt = op->out_dtype[0];
  double es = sim_dtype_size(dt);
  double n = (double)sim_extent_volume(op, e), b = (double)e[0];
  /* Forward: subtract, square, sum (3 per element) reading pred and target; backward:
   * dpred = 2 (pred - target) dloss / n, reading both again and writing dpred. */
  if (pass == SIM_PASS_FORWARD)
    sim_work_add(w, sim_kernel_memory(dt, 3 * n, (2 * n + b) * es));
  else
    sim_work_add(w, sim_kernel_memory(dt, 3 * n, (3 * n + b) * es));
}

static int64_t mse_saved(const SimOp *op, const int64_t *extent)
{
  int64_t full[SIM_MAX_ITER];
  const int64_t *e = sim_op_extent(op, extent, full);
  return 2 * sim_extent_volume(op, e) * sim_dtype_size(op->out_dtype[0]);
}

const SimOpClass sim_op_mse_loss_class = {
  .type = SIM_OP_MSE_LOSS,
  .name = "mse_loss",
  .description = "mean squared error of a prediction against a target, per sample",
  .attrs = NULL,
  .n_attrs = 0,
  .min_inputs = 2,
  .max_inputs = 2,
  .infer = mse_infer,
  .space = mse_space,
  .work = mse_work,
  .saved_bytes = mse_saved,
};
