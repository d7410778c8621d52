/* kernels-lstm.c — the CPU kernel of an LSTM layer over a chunk of a sequence, from a
 * zero state (sim/ops/lstm.c): gates [i f g o] = x_t W_ih + h_{t-1} W_hh + bias with
 * W = [W_ih; W_hh].  Only the samples split, so a shard runs whole sequences; the
 * backward pass recomputes the forward states and propagates through time. */
#include "cpu-private.h"

#include <string.h>

static float sigm(float x)
{
  return 1.0f / (1.0f + expf(-x));
}

gboolean cpu_kernel_lstm(const ExecKernelArgs *a, GError **error)
{
  const ExecView *X = &a->in[0], *W = &a->w[0], *Bv = &a->w[1];
  int64_t H = cpu_attr_int(a, "hidden", 1);
  SimShape xs = sim_graph_tensor_shape(a->graph, sim_graph_op_input(a->graph, a->op, 0));
  int64_t S = xs.dims[1], IN = xs.dims[2], G4 = 4 * H;
  gboolean fwd = a->phase == EXEC_KERNEL_FORWARD;
  const float *x = cpu_f32(X), *w = cpu_f32(W), *bias = cpu_f32(Bv);
  /* Per step: the activated gates, the cell and hidden states. */
  float *gates = g_new(float, (size_t)(S * G4));
  float *c = g_new(float, (size_t)((S + 1) * H));
  float *h = g_new(float, (size_t)((S + 1) * H));
  float *dg = fwd ? NULL : g_new(float, (size_t)G4);
  float *dh = fwd ? NULL : g_new(float, (size_t)H);
  float *dc = fwd ? NULL : g_new(float, (size_t)H);
  for (int64_t b = a->lo[0]; b < a->hi[0]; b++) {
    memset(c, 0, sizeof(float) * (size_t)H);
    memset(h, 0, sizeof(float) * (size_t)H);
    for (int64_t t = 0; t < S; t++) {
      float *gt = gates + t * G4;
      for (int64_t k = 0; k < G4; k++)
        gt[k] = bias[(k - Bv->box.lo[0]) * Bv->stride[0]];
      int64_t idx[3] = { b, t, 0 };
      const float *xr = x + cpu_off(X, idx);
      for (int64_t r = 0; r < IN + H; r++) {
        float v = r < IN ? xr[r * X->stride[2]] : h[t * H + (r - IN)];
        if (v == 0)
          continue;
        const float *wr = w + cpu_off2(W, r, 0);
        for (int64_t k = 0; k < G4; k++)
          gt[k] += v * wr[k * W->stride[1]];
      }
      for (int64_t j = 0; j < H; j++) {
        float ig = sigm(gt[j]), fg = sigm(gt[H + j]), gg = tanhf(gt[2 * H + j]);
        float og = sigm(gt[3 * H + j]);
        gt[j] = ig;
        gt[H + j] = fg;
        gt[2 * H + j] = gg;
        gt[3 * H + j] = og;
        float cv = fg * c[t * H + j] + ig * gg;
        c[(t + 1) * H + j] = cv;
        h[(t + 1) * H + j] = og * tanhf(cv);
      }
      if (fwd) {
        float *yr = cpu_f32(&a->out[0]) + cpu_off(&a->out[0], idx);
        for (int64_t j = 0; j < H; j++)
          yr[j * a->out[0].stride[2]] = h[(t + 1) * H + j];
      }
    }
    if (fwd)
      continue;
    const ExecView *DY = &a->out_grad[0], *DX = &a->in_grad[0], *DW = &a->w_grad[0];
    const ExecView *DB = &a->w_grad[1];
    memset(dh, 0, sizeof(float) * (size_t)H);
    memset(dc, 0, sizeof(float) * (size_t)H);
    for (int64_t t = S - 1; t >= 0; t--) {
      int64_t idx[3] = { b, t, 0 };
      const float *dyr = cpu_f32(DY) + cpu_off(DY, idx);
      const float *gt = gates + t * G4;
      for (int64_t j = 0; j < H; j++) {
        float dhj = dh[j] + dyr[j * DY->stride[2]];
        float cv = c[(t + 1) * H + j], tc = tanhf(cv);
        float ig = gt[j], fg = gt[H + j], gg = gt[2 * H + j], og = gt[3 * H + j];
        float dcj = dc[j] + dhj * og * (1 - tc * tc);
        dg[j] = dcj * gg * ig * (1 - ig);
        dg[H + j] = dcj * c[t * H + j] * fg * (1 - fg);
        dg[2 * H + j] = dcj * ig * (1 - gg * gg);
        dg[3 * H + j] = dhj * tc * og * (1 - og);
        dc[j] = dcj * fg;
      }
      for (int64_t k = 0; k < G4; k++)
        cpu_f32(DB)[(k - DB->box.lo[0]) * DB->stride[0]] += dg[k];
      const float *xr = x + cpu_off(X, idx);
      float *dxr = cpu_has(DX) ? cpu_f32(DX) + cpu_off(DX, idx) : NULL;
      memset(dh, 0, sizeof(float) * (size_t)H);
      for (int64_t r = 0; r < IN + H; r++) {
        float v = r < IN ? xr[r * X->stride[2]] : h[t * H + (r - IN)];
        const float *wr = w + cpu_off2(W, r, 0);
        float *dwr = cpu_f32(DW) + cpu_off2(DW, r, 0);
        float acc = 0;
        for (int64_t k = 0; k < G4; k++) {
          acc += dg[k] * wr[k * W->stride[1]];
          dwr[k * DW->stride[1]] += v * dg[k];
        }
        if (r < IN) {
          if (dxr)
            dxr[r * DX->stride[2]] += acc;
        } else {
          dh[r - IN] = acc;
        }
      }
    }
  }
  g_free(gates);
  g_free(c);
  g_free(h);
  g_free(dg);
  g_free(dh);
  g_free(dc);
  return TRUE;
}
