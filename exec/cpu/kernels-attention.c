/* kernels-attention.c — the CPU kernel of multi-head attention with its four projections
 * (sim/ops/attention.c gives the formula).
 *
 * A shard covers samples, query positions and heads.  It projects its queries and the
 * whole key and value sequences for its heads, and adds its heads' share of the output
 * projection to its rows of the output: with the heads split, shards hold partial outputs
 * and only the shard of head 0 adds the output bias.  Causal masks compare global
 * positions, so a shard of query positions masks what one device would.  The backward
 * pass recomputes the forward quantities of each (sample, head) rather than keeping them.
 * With grouped-query attention the shard's heads are key-value heads, each serving its
 * group of query heads; rotary embeddings rotate Q and K by global position. */
#include "cpu-private.h"

#include <string.h>

typedef struct {
  int64_t heads, hd, dm, sq, skv, s0, ns;
  int64_t group;      /* query heads per key-value head */
  gboolean rotary;
  double base;
  gboolean causal, bias;
  double p;
  float scale;
  const ExecKernelArgs *a;
} Att;

/* The sequence position of a ring member's row @i (its queries, and its own keys): the
 * shard's contiguous positions, or two chunks under the two-chunk layout. */
static int64_t ring_qpos(const Att *t, int64_t i)
{
  const ExecKernelArgs *a = t->a;
  if (a->ring_half <= 0)
    return t->s0 + i;
  return i < a->ring_half ? a->ring_q_lo + i : a->ring_q_lo2 + i - a->ring_half;
}

/* The position of key @j of the block a ring member holds. */
static int64_t ring_kpos(const ExecKernelArgs *a, int64_t j)
{
  if (a->ring_half <= 0)
    return a->ring_lo + j;
  return j < a->ring_half ? a->ring_lo + j : a->ring_lo2 + j - a->ring_half;
}

/* out[r][e] = sum over c of in[row r, c] W[c, col0 + e] (+ bias), rows of a 3-D view. */
static void project(const ExecView *in, int64_t b, int64_t r0, int64_t nr, const ExecView *W,
                    const ExecView *bias, int64_t col0, int64_t hd, int64_t dm, float *out)
{
  const float *x = cpu_f32(in), *w = cpu_f32(W);
  for (int64_t r = 0; r < nr; r++) {
    float *o = out + r * hd;
    for (int64_t e = 0; e < hd; e++)
      o[e] = bias ? cpu_f32(bias)[(col0 + e - bias->box.lo[0]) * bias->stride[0]] : 0.0f;
    int64_t idx[3] = { b, r0 + r, 0 };
    const float *xr = x + cpu_off(in, idx);
    for (int64_t c = 0; c < dm; c++) {
      float xv = xr[c * in->stride[2]];
      const float *wr = w + cpu_off2(W, c, col0);
      for (int64_t e = 0; e < hd; e++)
        o[e] += xv * wr[e * W->stride[1]];
    }
  }
}

/* The backward of project: d(in) += dout W^T, dW += in^T dout, dbias += sum of dout. */
static void project_back(const ExecView *in, const ExecView *din, int64_t b, int64_t r0,
                         int64_t nr, const ExecView *W, const ExecView *dW, const ExecView *dbias,
                         int64_t col0, int64_t hd, int64_t dm, const float *dout)
{
  const float *x = cpu_f32(in), *w = cpu_f32(W);
  float *dw = cpu_f32(dW);
  for (int64_t r = 0; r < nr; r++) {
    const float *g = dout + r * hd;
    int64_t idx[3] = { b, r0 + r, 0 };
    const float *xr = x + cpu_off(in, idx);
    float *dxr = cpu_has(din) ? cpu_f32(din) + cpu_off(din, idx) : NULL;
    for (int64_t c = 0; c < dm; c++) {
      float xv = xr[c * in->stride[2]];
      const float *wr = w + cpu_off2(W, c, col0);
      float *dwr = dw + cpu_off2(dW, c, col0);
      float acc = 0;
      for (int64_t e = 0; e < hd; e++) {
        acc += g[e] * wr[e * W->stride[1]];
        dwr[e * dW->stride[1]] += xv * g[e];
      }
      if (dxr)
        dxr[c * din->stride[2]] += acc;
    }
    if (dbias)
      for (int64_t e = 0; e < hd; e++)
        cpu_f32(dbias)[(col0 + e - dbias->box.lo[0]) * dbias->stride[0]] += g[e];
  }
}

/* Rotates the @n rows of @M (hd each, at positions pos0, pos0 + 1, ...) by the rotary
 * angles, element i with i + hd/2; @sign -1 applies the inverse (the transpose). */
static void rope(const Att *t, float *M, int64_t n, int64_t pos0, double sign)
{
  int64_t half = t->hd / 2;
  for (int64_t r = 0; r < n; r++)
    for (int64_t i = 0; i < half; i++) {
      double th = (double)(pos0 + r) * pow(t->base, -2.0 * (double)i / (double)t->hd);
      double c = cos(th), sn = sign * sin(th);
      float *x = M + r * t->hd;
      double a = x[i], b = x[i + half];
      x[i] = (float)(a * c - b * sn);
      x[i + half] = (float)(b * c + a * sn);
    }
}

/* rope() of a ring member's @n own rows of @M, at their positions (ring_qpos()). */
static void ring_rope(const Att *t, float *M, int64_t n, double sign)
{
  int64_t h = t->a->ring_half;
  if (h <= 0) {
    rope(t, M, n, t->s0, sign);
    return;
  }
  rope(t, M, MIN(h, n), ring_qpos(t, 0), sign);
  if (n > h)
    rope(t, M + h * t->hd, n - h, ring_qpos(t, h), sign);
}

/* Scores, masked and normalized: P (before dropout) and the kept-and-scaled mask. */
static void probabilities(const Att *t, int64_t b, int64_t h, const float *Q, const float *K,
                          float *P, float *mask)
{
  const char *name = sim_graph_op_name(t->a->graph, t->a->op);
  float keep = (float)(1.0 / (1.0 - t->p));
  for (int64_t i = 0; i < t->ns; i++) {
    int64_t qi = t->s0 + i;
    float *pr = P + i * t->skv;
    float m = -INFINITY;
    for (int64_t j = 0; j < t->skv; j++) {
      if (t->causal && j > qi) {
        pr[j] = -INFINITY;
        continue;
      }
      float s = 0;
      for (int64_t e = 0; e < t->hd; e++)
        s += Q[i * t->hd + e] * K[j * t->hd + e];
      pr[j] = s * t->scale;
      m = MAX(m, pr[j]);
    }
    double sum = 0;
    for (int64_t j = 0; j < t->skv; j++) {
      pr[j] = pr[j] == -INFINITY ? 0.0f : expf(pr[j] - m);
      sum += pr[j];
    }
    for (int64_t j = 0; j < t->skv; j++) {
      pr[j] = (float)(pr[j] / sum);
      uint64_t flat = (uint64_t)((((b + t->a->sample_offset) * t->heads + h) * t->sq + qi) *
                                 t->skv + j);
      mask[i * t->skv + j] =
        t->p > 0 ? (exec_dropout_keep(name, flat, t->a->step, t->p) ? keep : 0.0f) : 1.0f;
    }
  }
}

/* ---- ring attention (include/parasol-exec.h, "Ring attention") ------------------------ */

/* What a ring member keeps between its calls: its queries (rotated), per query row the
 * running maximum and sum of exponentials (after RING_END the log-sum-exp), the partial
 * then normalized outputs, and backward the output gradients, their dot products with the
 * outputs and the queries' gradients.  Rows are (sample, query head, position). */
typedef struct {
  CpuSaved base;
  int64_t nb, nh, ns, hd;
  float *Q, *m, *l, *O, *dO, *D, *dQ;
} RingState;

static void ring_state_free(gpointer p)
{
  RingState *r = p;
  g_free(r->Q);
  g_free(r->m);
  g_free(r->l);
  g_free(r->O);
  g_free(r->dO);
  g_free(r->D);
  g_free(r->dQ);
  g_free(r);
}

/* Element (plane p, sample bi, position i, key-value head gi, 0) of a block. */
static float *block_at(const ExecView *v, int64_t p, int64_t bi, int64_t i, int64_t gi)
{
  int64_t idx[5] = { p, bi, i, gi, 0 };
  return cpu_f32(v) + cpu_off(v, idx);
}

/* The shard's own keys and values (its positions, its key-value heads) into the block. */
static void ring_own_block(const Att *t, const ExecKernelArgs *a, int64_t h0, int64_t h1)
{
  const ExecView *B = a->ring;
  const ExecView *bk = t->bias ? &a->w[5] : NULL, *bv = t->bias ? &a->w[6] : NULL;
  float *tmp = g_new(float, MAX(t->ns * t->hd, 1));
  for (int64_t b = a->lo[0]; b < a->hi[0]; b++)
    for (int64_t g = h0; g < h1; g++)
      for (int pl = EXEC_RING_K; pl <= EXEC_RING_V; pl++) {
        project(&a->in[1 + pl], b, t->s0, t->ns, &a->w[1 + pl], pl == EXEC_RING_K ? bk : bv,
                g * t->hd, t->hd, t->dm, tmp);
        if (t->rotary && pl == EXEC_RING_K)
          ring_rope(t, tmp, t->ns, 1.0);
        for (int64_t i = 0; i < t->ns; i++) {
          float *dst = block_at(B, pl, b - a->lo[0], i, g - h0);
          for (int64_t e = 0; e < t->hd; e++)
            dst[e * B->stride[4]] = tmp[i * t->hd + e];
        }
      }
  g_free(tmp);
}

static gboolean ring_kernel(const Att *t, const ExecKernelArgs *a, GError **error)
{
  const char *name = sim_graph_op_name(a->graph, a->op);
  int64_t h0 = a->lo[2], h1 = a->hi[2], hd = t->hd, ns = t->ns, dm = t->dm;
  int64_t nb = a->hi[0] - a->lo[0], nh = (h1 - h0) * t->group;
  const ExecView *B = a->ring;
  RingState *R = a->saved ? *a->saved : NULL;
  if (!B || !B->buffer || !a->saved)
    return g_set_error(error, EXEC_ERROR, EXEC_ERROR_UNSUPPORTED, "attention '%s': a ring "
                       "phase without its block or saved state", name), FALSE;
  if (a->phase == EXEC_KERNEL_RING_BEGIN) {
    if (R)
      ring_state_free(R);
    R = g_new0(RingState, 1);
    R->base.free = ring_state_free;
    R->nb = nb;
    R->nh = nh;
    R->ns = ns;
    R->hd = hd;
    size_t rows = (size_t)MAX(nb * nh * ns, 1);
    R->Q = g_new(float, rows * (size_t)hd);
    R->O = g_new0(float, rows * (size_t)hd);
    R->m = g_new(float, rows);
    R->l = g_new0(float, rows);
    for (size_t r = 0; r < rows; r++)
      R->m[r] = -INFINITY;
    *a->saved = R;
    const ExecView *bq = t->bias ? &a->w[4] : NULL;
    for (int64_t b = a->lo[0]; b < a->hi[0]; b++)
      for (int64_t h = 0; h < nh; h++) {
        float *Q = R->Q + ((b - a->lo[0]) * nh + h) * ns * hd;
        project(&a->in[0], b, t->s0, ns, &a->w[0], bq, (h0 * t->group + h) * hd, hd, dm, Q);
        if (t->rotary)
          ring_rope(t, Q, ns, 1.0);
      }
    ring_own_block(t, a, h0, h1);
    return TRUE;
  }
  if (!R || R->nb != nb || R->nh != nh || R->ns != ns)
    return g_set_error(error, EXEC_ERROR, EXEC_ERROR_UNSUPPORTED, "attention '%s': a ring "
                       "phase before the ring's forward pass", name), FALSE;
  float keep = (float)(1.0 / (1.0 - t->p));
  int64_t nk = B->box.hi[2] - B->box.lo[2];
  gboolean step = a->phase == EXEC_KERNEL_RING_STEP;
  gboolean bstep = a->phase == EXEC_KERNEL_RING_BACKWARD_STEP;
  if (step || bstep) {
    float *s = g_new(float, MAX(nk, 1));
    for (int64_t b = a->lo[0]; b < a->hi[0]; b++)
      for (int64_t h = 0; h < nh; h++) {
        int64_t hg = h0 * t->group + h, gi = h / t->group, bi = b - a->lo[0];
        for (int64_t i = 0; i < ns; i++) {
          int64_t qi = ring_qpos(t, i), row = (bi * nh + h) * ns + i;
          const float *q = R->Q + row * hd;
          float mx = -INFINITY;
          for (int64_t j = 0; j < nk; j++) {
            int64_t kj = ring_kpos(a, j);
            if (t->causal && kj > qi) {
              s[j] = -INFINITY;
              continue;
            }
            const float *k = block_at(B, EXEC_RING_K, bi, j, gi);
            float acc = 0;
            for (int64_t e = 0; e < hd; e++)
              acc += q[e] * k[e * B->stride[4]];
            s[j] = acc * t->scale;
            mx = MAX(mx, s[j]);
          }
          if (mx == -INFINITY)
            continue;
          /* Dropout's index of (qi, key j): the row's base plus the key's position. */
          uint64_t flat0 = (uint64_t)((((b + a->sample_offset) * t->heads + hg) * t->sq + qi) *
                                      t->skv);
          if (step) {
            /* Online softmax: rescale what the earlier blocks summed to the new maximum. */
            float mnew = MAX(R->m[row], mx);
            float alpha = R->m[row] == -INFINITY ? 0.0f : expf(R->m[row] - mnew);
            float *o = R->O + row * hd;
            double sum = 0;
            for (int64_t e = 0; e < hd; e++)
              o[e] *= alpha;
            for (int64_t j = 0; j < nk; j++) {
              if (s[j] == -INFINITY)
                continue;
              float pj = expf(s[j] - mnew);
              sum += pj;
              if (t->p > 0 && !exec_dropout_keep(name, flat0 + (uint64_t)ring_kpos(a, j), a->step, t->p))
                continue;
              float w = t->p > 0 ? pj * keep : pj;
              const float *v = block_at(B, EXEC_RING_V, bi, j, gi);
              for (int64_t e = 0; e < hd; e++)
                o[e] += w * v[e * B->stride[4]];
            }
            R->l[row] = (float)(R->l[row] * alpha + sum);
            R->m[row] = mnew;
            continue;
          }
          /* Backward: P from the log-sum-exp; dV, dS, dQ and the block's dK. */
          const float *dO = R->dO + row * hd;
          float *dQ = R->dQ + row * hd;
          for (int64_t j = 0; j < nk; j++) {
            if (s[j] == -INFINITY)
              continue;
            float p = expf(s[j] - R->m[row]);
            float mk = t->p > 0 ? (exec_dropout_keep(name, flat0 + (uint64_t)ring_kpos(a, j), a->step, t->p)
                                   ? keep : 0.0f) : 1.0f;
            const float *k = block_at(B, EXEC_RING_K, bi, j, gi);
            const float *v = block_at(B, EXEC_RING_V, bi, j, gi);
            float *dk = block_at(B, EXEC_RING_DK, bi, j, gi);
            float *dv = block_at(B, EXEC_RING_DV, bi, j, gi);
            int64_t st = B->stride[4];
            float dp = 0;
            for (int64_t e = 0; e < hd; e++) {
              dp += dO[e] * v[e * st];
              dv[e * st] += p * mk * dO[e];
            }
            float ds = p * (dp * mk - R->D[row]) * t->scale;
            for (int64_t e = 0; e < hd; e++) {
              dQ[e] += ds * k[e * st];
              dk[e * st] += ds * q[e];
            }
          }
        }
      }
    g_free(s);
    return TRUE;
  }
  gboolean out_bias = t->bias && h0 == 0;
  const ExecView *Wo = &a->w[3];
  if (a->phase == EXEC_KERNEL_RING_END) {
    const ExecView *Y = &a->out[0];
    for (int64_t b = a->lo[0]; b < a->hi[0]; b++) {
      int64_t bi = b - a->lo[0];
      for (int64_t i = 0; i < ns; i++) {
        int64_t idx[3] = { b, t->s0 + i, 0 };
        float *yr = cpu_f32(Y) + cpu_off(Y, idx);
        if (!a->accumulate)
          for (int64_t c = 0; c < dm; c++)
            yr[c * Y->stride[2]] = 0;
        for (int64_t h = 0; h < nh; h++) {
          int64_t row = (bi * nh + h) * ns + i, col = (h0 * t->group + h) * hd;
          float *o = R->O + row * hd;
          for (int64_t e = 0; e < hd; e++)
            o[e] /= R->l[row];
          R->m[row] += logf(R->l[row]);
          for (int64_t e = 0; e < hd; e++) {
            const float *wr = cpu_f32(Wo) + cpu_off2(Wo, col + e, 0);
            for (int64_t c = 0; c < dm; c++)
              yr[c * Y->stride[2]] += o[e] * wr[c * Wo->stride[1]];
          }
        }
        if (out_bias)
          for (int64_t c = 0; c < dm; c++)
            yr[c * Y->stride[2]] += cpu_f32(&a->w[7])[(c - a->w[7].box.lo[0]) * a->w[7].stride[0]];
      }
    }
    return TRUE;
  }
  const ExecView *dY = &a->out_grad[0];
  size_t rows = (size_t)MAX(nb * nh * ns, 1);
  if (a->phase == EXEC_KERNEL_RING_BACKWARD_BEGIN) {
    g_free(R->dO);
    g_free(R->D);
    g_free(R->dQ);
    R->dO = g_new(float, rows * (size_t)hd);
    R->D = g_new(float, rows);
    R->dQ = g_new0(float, rows * (size_t)hd);
    ring_own_block(t, a, h0, h1);
    SimRegion grads = B->box;
    grads.lo[0] = EXEC_RING_DK;
    int64_t idx5[5];
    for (int k = 0; k < 5; k++)
      idx5[k] = grads.lo[k];
    do
      cpu_f32(B)[cpu_off(B, idx5)] = 0;
    while (exec_region_next(&grads, idx5));
    const ExecView *dWo = &a->w_grad[3];
    for (int64_t b = a->lo[0]; b < a->hi[0]; b++) {
      int64_t bi = b - a->lo[0];
      for (int64_t i = 0; i < ns; i++) {
        int64_t idx[3] = { b, t->s0 + i, 0 };
        const float *gr = cpu_f32(dY) + cpu_off(dY, idx);
        for (int64_t h = 0; h < nh; h++) {
          int64_t row = (bi * nh + h) * ns + i, col = (h0 * t->group + h) * hd;
          const float *o = R->O + row * hd;
          float *dO = R->dO + row * hd;
          double dot = 0;
          for (int64_t e = 0; e < hd; e++) {
            const float *wr = cpu_f32(Wo) + cpu_off2(Wo, col + e, 0);
            float *dwr = cpu_f32(dWo) + cpu_off2(dWo, col + e, 0);
            float acc = 0;
            for (int64_t c = 0; c < dm; c++) {
              float gv = gr[c * dY->stride[2]];
              acc += gv * wr[c * Wo->stride[1]];
              dwr[c * dWo->stride[1]] += o[e] * gv;
            }
            dO[e] = acc;
            dot += acc * o[e];
          }
          R->D[row] = (float)dot;
        }
        if (out_bias)
          for (int64_t c = 0; c < dm; c++)
            cpu_f32(&a->w_grad[7])[(c - a->w_grad[7].box.lo[0]) * a->w_grad[7].stride[0]] +=
              gr[c * dY->stride[2]];
      }
    }
    return TRUE;
  }
  /* RING_BACKWARD_END: the block is back with its dK and dV summed over the ring. */
  if (!R->dQ)
    return g_set_error(error, EXEC_ERROR, EXEC_ERROR_UNSUPPORTED, "attention '%s': the end of "
                       "a ring's backward pass before its beginning", name), FALSE;
  const ExecView *bgq = t->bias ? &a->w_grad[4] : NULL, *bgk = t->bias ? &a->w_grad[5] : NULL;
  const ExecView *bgv = t->bias ? &a->w_grad[6] : NULL;
  float *tmp = g_new(float, MAX(ns * hd, 1));
  for (int64_t b = a->lo[0]; b < a->hi[0]; b++) {
    int64_t bi = b - a->lo[0];
    for (int64_t h = 0; h < nh; h++) {
      float *dQ = R->dQ + (bi * nh + h) * ns * hd;
      if (t->rotary)
        ring_rope(t, dQ, ns, -1.0);
      project_back(&a->in[0], &a->in_grad[0], b, t->s0, ns, &a->w[0], &a->w_grad[0], bgq,
                   (h0 * t->group + h) * hd, hd, dm, dQ);
    }
    for (int64_t g = h0; g < h1; g++)
      for (int pl = EXEC_RING_DK; pl <= EXEC_RING_DV; pl++) {
        for (int64_t i = 0; i < ns; i++) {
          const float *src = block_at(B, pl, bi, i, g - h0);
          for (int64_t e = 0; e < hd; e++)
            tmp[i * hd + e] = src[e * B->stride[4]];
        }
        int in = pl == EXEC_RING_DK ? 1 : 2;
        if (t->rotary && pl == EXEC_RING_DK)
          ring_rope(t, tmp, ns, -1.0);
        project_back(&a->in[in], &a->in_grad[in], b, t->s0, ns, &a->w[in], &a->w_grad[in],
                     pl == EXEC_RING_DK ? bgk : bgv, g * hd, hd, dm, tmp);
      }
  }
  g_free(tmp);
  return TRUE;
}

gboolean cpu_kernel_attention(const ExecKernelArgs *a, GError **error)
{
  Att t = { .a = a };
  t.heads = cpu_attr_int(a, "heads", 1);
  t.hd = cpu_attr_int(a, "head_dim", 1);
  t.causal = cpu_attr_int(a, "causal", 0) != 0;
  t.bias = a->n_weights == 8;
  t.p = cpu_attr_float(a, "dropout", 0.0);
  t.scale = (float)(1.0 / sqrt((double)t.hd));
  int64_t kvh = cpu_attr_int(a, "kv_heads", 0);
  t.group = kvh > 0 ? t.heads / kvh : 1;
  t.rotary = cpu_attr_int(a, "rotary", 0) != 0;
  t.base = cpu_attr_float(a, "rotary_base", 10000.0);
  SimShape qs = sim_graph_tensor_shape(a->graph, sim_graph_op_input(a->graph, a->op, 0));
  SimShape ks = sim_graph_tensor_shape(a->graph, sim_graph_op_input(a->graph, a->op, 1));
  t.dm = qs.dims[2];
  t.sq = qs.dims[1];
  t.skv = ks.dims[1];
  t.s0 = a->lo[1];
  t.ns = a->hi[1] - a->lo[1];
  if (a->phase >= EXEC_KERNEL_RING_BEGIN)
    return ring_kernel(&t, a, error);
  int64_t h0 = a->lo[2], h1 = a->hi[2];
  gboolean fwd = a->phase == EXEC_KERNEL_FORWARD;
  gboolean out_bias = t.bias && h0 == 0;
  const ExecView *q = &a->in[0], *k = &a->in[1], *v = &a->in[2];
  const ExecView *bq = t.bias ? &a->w[4] : NULL, *bk = t.bias ? &a->w[5] : NULL;
  const ExecView *bv = t.bias ? &a->w[6] : NULL;
  const ExecView *Wo = &a->w[3];
  int64_t hd = t.hd, ns = t.ns, skv = t.skv, dm = t.dm;
  float *Q = g_new(float, MAX(ns * hd, 1)), *K = g_new(float, MAX(skv * hd, 1));
  float *V = g_new(float, MAX(skv * hd, 1)), *P = g_new(float, MAX(ns * skv, 1));
  float *mask = g_new(float, MAX(ns * skv, 1)), *O = g_new(float, MAX(ns * hd, 1));
  float *dO = fwd ? NULL : g_new(float, MAX(ns * hd, 1));
  float *dQ = fwd ? NULL : g_new(float, MAX(ns * hd, 1));
  float *dK = fwd ? NULL : g_new(float, MAX(skv * hd, 1));
  float *dV = fwd ? NULL : g_new(float, MAX(skv * hd, 1));
  float *dS = fwd ? NULL : g_new(float, MAX(ns * skv, 1));
  const ExecView *Y = fwd ? &a->out[0] : &a->out_grad[0];
  for (int64_t b = a->lo[0]; b < a->hi[0]; b++) {
    if (fwd && !a->accumulate)
      for (int64_t i = 0; i < ns; i++)
        for (int64_t c = 0; c < dm; c++) {
          int64_t idx[3] = { b, t.s0 + i, c };
          cpu_f32(Y)[cpu_off(Y, idx)] = 0;
        }
    for (int64_t h = h0 * t.group; h < h1 * t.group; h++) {
      int64_t col = h * hd, kvcol = (h / t.group) * hd;
      project(q, b, t.s0, ns, &a->w[0], bq, col, hd, dm, Q);
      project(k, b, 0, skv, &a->w[1], bk, kvcol, hd, dm, K);
      project(v, b, 0, skv, &a->w[2], bv, kvcol, hd, dm, V);
      if (t.rotary) {
        rope(&t, Q, ns, t.s0, 1.0);
        rope(&t, K, skv, 0, 1.0);
      }
      probabilities(&t, b, h, Q, K, P, mask);
      for (int64_t i = 0; i < ns; i++)
        for (int64_t e = 0; e < hd; e++) {
          float acc = 0;
          for (int64_t j = 0; j < skv; j++)
            acc += P[i * skv + j] * mask[i * skv + j] * V[j * hd + e];
          O[i * hd + e] = acc;
        }
      if (fwd) {
        /* out rows += O Wo[head rows] */
        for (int64_t i = 0; i < ns; i++) {
          int64_t idx[3] = { b, t.s0 + i, 0 };
          float *yr = cpu_f32(Y) + cpu_off(Y, idx);
          for (int64_t e = 0; e < hd; e++) {
            float ov = O[i * hd + e];
            const float *wr = cpu_f32(Wo) + cpu_off2(Wo, col + e, 0);
            for (int64_t c = 0; c < dm; c++)
              yr[c * Y->stride[2]] += ov * wr[c * Wo->stride[1]];
          }
        }
        continue;
      }
      /* dO = dY Wo[head rows]^T, dWo[head rows] += O^T dY. */
      const ExecView *dWo = &a->w_grad[3];
      for (int64_t i = 0; i < ns; i++) {
        int64_t idx[3] = { b, t.s0 + i, 0 };
        const float *gr = cpu_f32(Y) + cpu_off(Y, idx);
        for (int64_t e = 0; e < hd; e++) {
          const float *wr = cpu_f32(Wo) + cpu_off2(Wo, col + e, 0);
          float *dwr = cpu_f32(dWo) + cpu_off2(dWo, col + e, 0);
          float acc = 0, ov = O[i * hd + e];
          for (int64_t c = 0; c < dm; c++) {
            float gv = gr[c * Y->stride[2]];
            acc += gv * wr[c * Wo->stride[1]];
            dwr[c * dWo->stride[1]] += ov * gv;
          }
          dO[i * hd + e] = acc;
        }
      }
      /* Through the probabilities: dV, then dS = P (dP - rowsum(dP P)). */
      memset(dV, 0, sizeof(float) * (size_t)(skv * hd));
      for (int64_t i = 0; i < ns; i++) {
        double dot = 0;
        for (int64_t j = 0; j < skv; j++) {
          float pm = P[i * skv + j] * mask[i * skv + j];
          float dpd = 0;
          for (int64_t e = 0; e < hd; e++) {
            dpd += dO[i * hd + e] * V[j * hd + e];
            dV[j * hd + e] += pm * dO[i * hd + e];
          }
          dS[i * skv + j] = dpd * mask[i * skv + j];
          dot += dS[i * skv + j] * P[i * skv + j];
        }
        for (int64_t j = 0; j < skv; j++)
          dS[i * skv + j] = P[i * skv + j] * (float)(dS[i * skv + j] - dot) * t.scale;
      }
      memset(dK, 0, sizeof(float) * (size_t)(skv * hd));
      for (int64_t i = 0; i < ns; i++)
        for (int64_t e = 0; e < hd; e++) {
          float acc = 0;
          for (int64_t j = 0; j < skv; j++) {
            float s = dS[i * skv + j];
            acc += s * K[j * hd + e];
            dK[j * hd + e] += s * Q[i * hd + e];
          }
          dQ[i * hd + e] = acc;
        }
      if (t.rotary) {
        rope(&t, dQ, ns, t.s0, -1.0);
        rope(&t, dK, skv, 0, -1.0);
      }
      project_back(q, &a->in_grad[0], b, t.s0, ns, &a->w[0], &a->w_grad[0],
                   t.bias ? &a->w_grad[4] : NULL, col, hd, dm, dQ);
      project_back(k, &a->in_grad[1], b, 0, skv, &a->w[1], &a->w_grad[1],
                   t.bias ? &a->w_grad[5] : NULL, kvcol, hd, dm, dK);
      project_back(v, &a->in_grad[2], b, 0, skv, &a->w[2], &a->w_grad[2],
                   t.bias ? &a->w_grad[6] : NULL, kvcol, hd, dm, dV);
    }
    if (!out_bias)
      continue;
    const ExecView *bo = fwd ? &a->w[7] : &a->w_grad[7];
    for (int64_t i = 0; i < ns; i++) {
      int64_t idx[3] = { b, t.s0 + i, 0 };
      float *yr = cpu_f32(Y) + cpu_off(Y, idx);
      for (int64_t c = 0; c < dm; c++) {
        float *bp = cpu_f32(bo) + (c - bo->box.lo[0]) * bo->stride[0];
        if (fwd)
          yr[c * Y->stride[2]] += *bp;
        else
          *bp += yr[c * Y->stride[2]];
      }
    }
  }
  g_free(Q);
  g_free(K);
  g_free(V);
  g_free(P);
  g_free(mask);
  g_free(O);
  g_free(dO);
  g_free(dQ);
  g_free(dK);
  g_free(dV);
  g_free(dS);
  return TRUE;
}
