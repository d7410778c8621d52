/* lstm.c — one LSTM layer over a sequence: x [b, s, in] -> h [b, s, hidden], with gates
 *   [i f g o] = x_t W_ih + h_{t-1} W_hh + bias,  c_t = f c_{t-1} + i g,  h_t = o tanh(c_t)
 * and the weights stored as one matrix W [in + hidden, 4 * hidden] (W_ih above W_hh).
 *
 * Iteration dimensions: b (sample), s (attribute), n (parameter: hidden units) and k
 * (reduction: input features).  Only b can be split: the time steps run one after the
 * other, every step needs all of h_{t-1}, and the input GEMM is fused with the gates.
 * Sequences split in time are separate LSTM ops, each a chunk of the sequence. */
#include "../sim-private.h"

enum { L_HIDDEN };

static const SimAttrSpec attrs[] = {
  [L_HIDDEN] = { "hidden", SIM_ATTR_INT, 0, NULL, TRUE },
};

enum { B, S, N, K };

static gboolean infer(SimOp *op, GError **error)
{
  if (!sim_op_check_rank(op, 0, 3, 3, error) || !sim_op_check_float(op, 0, error))
    return FALSE;
  int64_t hidden = op->attrs[L_HIDDEN].i[0];
  if (hidden < 1) {
    sim_op_set_error(op, error, SIM_ERROR_INVALID, "hidden is %" G_GINT64_FORMAT
                     ", not positive", hidden);
    return FALSE;
  }
  const SimShape *x = &op->in_shape[0];
  sim_op_set_n_outputs(op, 1);
  op->out_shape[0] = sim_shape_make(3, (int64_t[]){ x->dims[0], x->dims[1], hidden });
  op->out_dtype[0] = op->in_dtype[0];
  op->n_weights = 2;
  op->w_shape[0] = sim_shape_make(2, (int64_t[]){ x->dims[2] + hidden, 4 * hidden });
  op->w_shape[1] = sim_shape_make(1, (int64_t[]){ 4 * hidden });
  op->w_dtype = op->in_dtype[0];
  return TRUE;
}

static void space(SimOp *op)
{
  const SimShape *x = &op->in_shape[0];
  sim_space_init(op, 4);
  sim_space_dim(op, B, "b", SIM_ROLE_SAMPLE, x->dims[0], TRUE);
  sim_space_dim(op, S, "s", SIM_ROLE_ATTRIBUTE, x->dims[1], FALSE);
  sim_space_dim(op, N, "n", SIM_ROLE_PARAMETER, op->attrs[L_HIDDEN].i[0], FALSE);
  sim_space_dim(op, K, "k", SIM_ROLE_REDUCTION, x->dims[2], FALSE);
  SimTensorMap *mx = &op->space.maps[0], *my = &op->space.maps[3];
  sim_map_identity(mx, 0, B);
  sim_map_identity(mx, 1, S);
  sim_map_identity(mx, 2, K);
  sim_map_identity(my, 0, B);
  sim_map_identity(my, 1, S);
  sim_map_identity(my, 2, N);
  /* The weights and the bias are read whole by every shard (maps left at "whole"). */
}

static SimKernel recurrent(SimDType dt, int64_t steps, int64_t m, int64_t n, int64_t k)
{
  /* One small GEMM per step, each waiting for the previous one; the weights are read
   * again every step (cuDNN's standard, non-persistent algorithm). */
  SimKernel r = sim_kernel_gemm(dt, 1, m, n, k);
  r.kind = SIM_KERNEL_RECURRENT;
  r.steps = steps;
  r.flops *= (double)steps;
  r.bytes *= (double)steps;
  return r;
}

static void work(const SimOp *op, const int64_t *e, SimPass pass, SimWork *w)
{
  SimDType dt = op->w_dtype;
  double es = sim_dtype_size(dt);
  int64_t b = e[B], s = e[S], h = e[N], in = e[K];
  double cells = (double)b * s * h;
  if (pass == SIM_PASS_FORWARD) {
    /* x W_ih for all steps at once, then the recurrence h_{t-1} W_hh step by step, then
     * the gates: three sigmoids and two tanh (4 each) and 4 multiply-adds per cell;
     * reads the 4 gate pre-activations and c_{t-1}, writes c_t and h_t. */
    sim_work_add(w, sim_kernel_gemm(dt, 1, b * s, 4 * h, in));
    sim_work_add(w, recurrent(dt, s, b, 4 * h, h));
    sim_work_add(w, sim_kernel_memory(dt, 24 * cells, 7 * cells * es + 4 * h * es));
    return;
  }
  /* Gate gradients (reading the saved gates, c, dh and dc, writing 4 gate gradients),
   * the recurrence dh_{t-1} = dgates W_hh^T step by step, and after the loop the weight
   * gradients and the input gradient as whole-sequence GEMMs. */
  sim_work_add(w, sim_kernel_memory(dt, 30 * cells, 11 * cells * es));
  sim_work_add(w, recurrent(dt, s, b, h, 4 * h));
  sim_work_add(w, sim_kernel_gemm(dt, 1, h, 4 * h, b * s));
  sim_work_add(w, sim_kernel_gemm(dt, 1, b * s, in, 4 * h));
  sim_work_add(w, sim_kernel_gemm(dt, 1, in, 4 * h, b * s));
}

static int64_t saved_bytes(const SimOp *op, const int64_t *extent)
{
  int64_t full[SIM_MAX_ITER];
  const int64_t *e = sim_op_extent(op, extent, full);
  int64_t bs = e[B] * e[S];
  /* x, the four gates, the cell states and the hidden states of every step. */
  return bs * (e[K] + 4 * e[N] + e[N] + e[N]) * sim_dtype_size(op->w_dtype);
}

const SimOpClass sim_op_lstm_class = {
  .type = SIM_OP_LSTM,
  .name = "lstm",
  .description = "an LSTM layer over a chunk of the sequence",
  .attrs = attrs,
  .n_attrs = G_N_ELEMENTS(attrs),
  .min_inputs = 1,
  .max_inputs = 1,
  .infer = infer,
  .space = space,
  .work = work,
  .saved_bytes = saved_bytes,
};
