/* kernels-conv.c — the CPU kernels of 2-D convolution and pooling over NCHW tensors.
 *
 * A shard covers output rows and columns [h0, h1) x [w0, w1); it reads input rows
 * ho * stride + kh * dilation - padding, which the input view holds (the plan delivered
 * the halo rows); rows outside the tensor are the zero padding.  Input gradients of the
 * halo rows are contributions that the producer sums with its neighbours'. */
#include "cpu-private.h"

#include <string.h>

typedef struct {
  int b, g, co, h, w, ci;
} ConvDims;

static void pair_attr(const ExecKernelArgs *a, const char *name, int64_t def, int64_t *out)
{
  g_autoptr(SimAttrs) attrs = sim_graph_op_attrs(a->graph, a->op);
  int64_t v[SIM_MAX_DIMS];
  int n = sim_attrs_get_ints(attrs, name, v, SIM_MAX_DIMS);
  out[0] = n >= 1 ? v[0] : def;
  out[1] = n >= 2 ? v[1] : out[0];
}

static inline int64_t off4(const ExecView *v, int64_t i0, int64_t i1, int64_t i2, int64_t i3)
{
  return (i0 - v->box.lo[0]) * v->stride[0] + (i1 - v->box.lo[1]) * v->stride[1] +
         (i2 - v->box.lo[2]) * v->stride[2] + (i3 - v->box.lo[3]) * v->stride[3];
}

gboolean cpu_kernel_conv2d(const ExecKernelArgs *a, GError **error)
{
  int64_t groups = cpu_attr_int(a, "groups", 1);
  int o = groups > 1;
  ConvDims D = { 0, o ? 1 : -1, 1 + o, 2 + o, 3 + o, 4 + o };
  int64_t ks[2], st[2], pd[2], dl[2];
  pair_attr(a, "kernel", 1, ks);
  pair_attr(a, "stride", 1, st);
  pair_attr(a, "padding", 0, pd);
  pair_attr(a, "dilation", 1, dl);
  SimUnaryKind act = (SimUnaryKind)cpu_attr_int(a, "activation", SIM_UNARY_IDENTITY);
  const ExecView *X = &a->in[0], *W = &a->w[0], *Y = &a->out[0];
  SimShape xs = sim_graph_tensor_shape(a->graph, sim_graph_op_input(a->graph, a->op, 0));
  SimShape ws = sim_graph_op_weight_shape(a->graph, a->op, 0);
  int64_t H = xs.dims[2], Wd = xs.dims[3];
  int64_t cin_g = ws.dims[1], cout_g = ws.dims[0] / groups;
  int64_t g0 = o ? a->lo[D.g] : 0, g1 = o ? a->hi[D.g] : 1;
  int64_t h0 = a->lo[D.h], h1 = a->hi[D.h], w0 = a->lo[D.w], w1 = a->hi[D.w];
  int64_t ci0 = a->lo[D.ci], ci1 = a->hi[D.ci];
  int64_t nh = h1 - h0, nw = w1 - w0;
  gboolean bias = a->n_weights > 1 && ci0 == 0;
  gboolean fwd = a->phase == EXEC_KERNEL_FORWARD;
  const float *x = cpu_f32(X), *w = cpu_f32(W);
  const float *bv = bias ? cpu_f32(&a->w[1]) : NULL;
  float *z = g_new(float, MAX(nh * nw, 1));
  float *dz = fwd ? NULL : g_new(float, MAX(nh * nw, 1));
  float *dx = !fwd && cpu_has(&a->in_grad[0]) ? cpu_f32(&a->in_grad[0]) : NULL;
  float *dw = fwd ? NULL : cpu_f32(&a->w_grad[0]);
  float *db = !fwd && bias ? cpu_f32(&a->w_grad[1]) : NULL;
  for (int64_t b = a->lo[D.b]; b < a->hi[D.b]; b++)
    for (int64_t g = g0; g < g1; g++)
      for (int64_t co = a->lo[D.co]; co < a->hi[D.co]; co++) {
        int64_t oc = g * cout_g + co;
        float bias_v = bias ? bv[(oc - a->w[1].box.lo[0]) * a->w[1].stride[0]] : 0.0f;
        /* The pre-activation z over the shard's output plane (needed in backward only for
         * the activation's derivative). */
        gboolean need_z = fwd || act != SIM_UNARY_IDENTITY;
        if (need_z) {
          for (int64_t k = 0; k < nh * nw; k++)
            z[k] = bias_v;
          for (int64_t ci = ci0; ci < ci1; ci++) {
            int64_t ic = g * cin_g + ci;
            for (int64_t i = 0; i < ks[0]; i++)
              for (int64_t j = 0; j < ks[1]; j++) {
                float wv = w[off4(W, oc, ci, i, j)];
                for (int64_t ho = h0; ho < h1; ho++) {
                  int64_t hi = ho * st[0] + i * dl[0] - pd[0];
                  if (hi < 0 || hi >= H)
                    continue;
                  float *zr = z + (ho - h0) * nw;
                  for (int64_t wo = w0; wo < w1; wo++) {
                    int64_t wi = wo * st[1] + j * dl[1] - pd[1];
                    if (wi >= 0 && wi < Wd)
                      zr[wo - w0] += wv * x[off4(X, b, ic, hi, wi)];
                  }
                }
              }
          }
        }
        if (fwd) {
          float *y = cpu_f32(Y);
          for (int64_t ho = h0; ho < h1; ho++)
            for (int64_t wo = w0; wo < w1; wo++) {
              float v = z[(ho - h0) * nw + wo - w0];
              float *dst = &y[off4(Y, b, oc, ho, wo)];
              if (a->accumulate)
                *dst += v;
              else
                *dst = cpu_act(act, v, 1.0f);
            }
          continue;
        }
        const ExecView *DY = &a->out_grad[0];
        const float *dy = cpu_f32(DY);
        float dsum = 0;
        for (int64_t ho = h0; ho < h1; ho++)
          for (int64_t wo = w0; wo < w1; wo++) {
            int64_t k = (ho - h0) * nw + wo - w0;
            float g2 = dy[off4(DY, b, oc, ho, wo)];
            dz[k] = act != SIM_UNARY_IDENTITY ? g2 * cpu_act_grad(act, z[k], 1.0f) : g2;
            dsum += dz[k];
          }
        if (db)
          db[(oc - a->w_grad[1].box.lo[0]) * a->w_grad[1].stride[0]] += dsum;
        const ExecView *DX = &a->in_grad[0], *DW = &a->w_grad[0];
        for (int64_t ci = ci0; ci < ci1; ci++) {
          int64_t ic = g * cin_g + ci;
          for (int64_t i = 0; i < ks[0]; i++)
            for (int64_t j = 0; j < ks[1]; j++) {
              float wv = w[off4(W, oc, ci, i, j)];
              float acc = 0;
              for (int64_t ho = h0; ho < h1; ho++) {
                int64_t hi = ho * st[0] + i * dl[0] - pd[0];
                if (hi < 0 || hi >= H)
                  continue;
                const float *dzr = dz + (ho - h0) * nw;
                for (int64_t wo = w0; wo < w1; wo++) {
                  int64_t wi = wo * st[1] + j * dl[1] - pd[1];
                  if (wi < 0 || wi >= Wd)
                    continue;
                  acc += dzr[wo - w0] * x[off4(X, b, ic, hi, wi)];
                  if (dx)
                    dx[off4(DX, b, ic, hi, wi)] += dzr[wo - w0] * wv;
                }
              }
              dw[off4(DW, oc, ci, i, j)] += acc;
            }
        }
      }
  g_free(z);
  g_free(dz);
  return TRUE;
}

gboolean cpu_kernel_pool2d(const ExecKernelArgs *a, GError **error)
{
  gboolean max = cpu_attr_int(a, "kind", SIM_POOL_MAX) == SIM_POOL_MAX;
  int64_t ks[2], st[2], pd[2];
  pair_attr(a, "kernel", 1, ks);
  pair_attr(a, "stride", ks[0], st);
  pair_attr(a, "padding", 0, pd);
  const ExecView *X = &a->in[0], *Y = &a->out[0];
  SimShape xs = sim_graph_tensor_shape(a->graph, sim_graph_op_input(a->graph, a->op, 0));
  int64_t H = xs.dims[2], Wd = xs.dims[3];
  const float *x = cpu_f32(X);
  gboolean fwd = a->phase == EXEC_KERNEL_FORWARD;
  float *y = fwd ? cpu_f32(Y) : NULL;
  const float *dy = fwd ? NULL : cpu_f32(&a->out_grad[0]);
  float *dx = !fwd && cpu_has(&a->in_grad[0]) ? cpu_f32(&a->in_grad[0]) : NULL;
  if (!fwd && !dx)
    return TRUE;
  for (int64_t b = a->lo[0]; b < a->hi[0]; b++)
    for (int64_t c = a->lo[1]; c < a->hi[1]; c++)
      for (int64_t ho = a->lo[2]; ho < a->hi[2]; ho++)
        for (int64_t wo = a->lo[3]; wo < a->hi[3]; wo++) {
          float best = -INFINITY, sum = 0;
          int64_t bh = -1, bw = -1;
          /* Averages divide by the window's positions inside the input and its padding,
           * as PyTorch's do: all of them but where ceil_mode runs a window past the end. */
          int64_t h0 = ho * st[0] - pd[0], w0 = wo * st[1] - pd[1];
          float inv = 1.0f / (float)((MIN(h0 + ks[0], H + pd[0]) - h0) *
                                     (MIN(w0 + ks[1], Wd + pd[1]) - w0));
          for (int64_t i = 0; i < ks[0]; i++) {
            int64_t hi = ho * st[0] + i - pd[0];
            if (hi < 0 || hi >= H)
              continue;
            for (int64_t j = 0; j < ks[1]; j++) {
              int64_t wi = wo * st[1] + j - pd[1];
              if (wi < 0 || wi >= Wd)
                continue;
              float v = x[off4(X, b, c, hi, wi)];
              sum += v;
              if (v > best || bh < 0) {
                best = v;
                bh = hi;
                bw = wi;
              }
            }
          }
          if (fwd) {
            y[off4(Y, b, c, ho, wo)] = max ? best : sum * inv;
            continue;
          }
          float g = dy[off4(&a->out_grad[0], b, c, ho, wo)];
          const ExecView *DX = &a->in_grad[0];
          if (max) {
            if (bh >= 0)
              dx[off4(DX, b, c, bh, bw)] += g;
            continue;
          }
          for (int64_t i = 0; i < ks[0]; i++) {
            int64_t hi = ho * st[0] + i - pd[0];
            if (hi < 0 || hi >= H)
              continue;
            for (int64_t j = 0; j < ks[1]; j++) {
              int64_t wi = wo * st[1] + j - pd[1];
              if (wi >= 0 && wi < Wd)
                dx[off4(DX, b, c, hi, wi)] += g * inv;
            }
          }
        }
  return TRUE;
}
