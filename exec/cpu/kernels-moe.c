/* kernels-moe.c — the CPU kernels of the gated MLP and the mixture of experts
 * (sim/ops/moe.c gives the formulas).
 *
 * A gated-MLP shard covers rows and a range of the ffn columns f: it adds its columns'
 * share of the down projection to its output rows (partial sums when f is split).  A
 * mixture-of-experts shard covers tokens, a range of experts and a range of f: it routes
 * each of its tokens over all the experts (the logits are whole on every shard) and adds
 * the weighted outputs of the chosen experts that it holds.  Routing is dropless here:
 * the capacity factor and the imbalance are costs of the simulator, not semantics of the
 * reference.  Every gradient is linear in the shard's partial outputs, so the sum over
 * shards of the logits' gradient contributions is the one device's gradient. */
#include "cpu-private.h"

#include <string.h>

/* One gated MLP on one row: weights Wg, Wu [rows c, cols f] and Wd [f, c] reached
 * through @at (Wg, Wu at (c, f), Wd at (f, c)), columns [f0, f1). */
typedef struct {
  const ExecView *wg, *wu, *wd;       /* weights                                       */
  const ExecView *dwg, *dwu, *dwd;    /* their gradients (backward)                    */
  int64_t expert;                     /* -1: 2-D weights; else the expert's index      */
  int64_t f0, f1, dm;
  SimUnaryKind act;
} Glu;

static float *wat(const ExecView *v, int64_t expert, int64_t i, int64_t j)
{
  if (expert < 0)
    return cpu_f32(v) + cpu_off2(v, i, j);
  int64_t idx[3] = { expert, i, j };
  return cpu_f32(v) + cpu_off(v, idx);
}

/* out[c] += scale * sum over f of h[f] Wd[f, c]; keeps g, u (the pre-activations) and h
 * in @gu (3 * F floats). */
static void glu_forward(const Glu *m, const float *x, int64_t xs, float scale, float *out,
                        float *gu)
{
  int64_t F = m->f1 - m->f0;
  float *g = gu, *u = gu + F, *h = gu + 2 * F;
  memset(g, 0, sizeof(float) * (size_t)(2 * F));
  for (int64_t c = 0; c < m->dm; c++) {
    float xv = x[c * xs];
    for (int64_t f = 0; f < F; f++) {
      g[f] += xv * *wat(m->wg, m->expert, c, m->f0 + f);
      u[f] += xv * *wat(m->wu, m->expert, c, m->f0 + f);
    }
  }
  for (int64_t f = 0; f < F; f++)
    h[f] = cpu_act(m->act, g[f], 1.0f) * u[f];
  if (!out)
    return;
  for (int64_t f = 0; f < F; f++)
    for (int64_t c = 0; c < m->dm; c++)
      out[c] += scale * h[f] * *wat(m->wd, m->expert, m->f0 + f, c);
}

/* Backward of glu_forward for output gradient @dy (scaled by @scale): dx[c] += ...,
 * weight gradients added; @gu holds the forward's g, u, h. */
static void glu_backward(const Glu *m, const float *x, int64_t xs, const float *dy, float scale,
                         float *dx, const float *gu, float *tmp)
{
  int64_t F = m->f1 - m->f0;
  const float *g = gu, *u = gu + F, *h = gu + 2 * F;
  float *dg = tmp, *du = tmp + F;
  for (int64_t f = 0; f < F; f++) {
    float dh = 0;
    for (int64_t c = 0; c < m->dm; c++) {
      float d = scale * dy[c];
      dh += d * *wat(m->wd, m->expert, m->f0 + f, c);
      *wat(m->dwd, m->expert, m->f0 + f, c) += h[f] * d;
    }
    dg[f] = dh * u[f] * cpu_act_grad(m->act, g[f], 1.0f);
    du[f] = dh * cpu_act(m->act, g[f], 1.0f);
  }
  for (int64_t c = 0; c < m->dm; c++) {
    float xv = x[c * xs], acc = 0;
    for (int64_t f = 0; f < F; f++) {
      acc += dg[f] * *wat(m->wg, m->expert, c, m->f0 + f) +
             du[f] * *wat(m->wu, m->expert, c, m->f0 + f);
      *wat(m->dwg, m->expert, c, m->f0 + f) += xv * dg[f];
      *wat(m->dwu, m->expert, c, m->f0 + f) += xv * du[f];
    }
    if (dx)
      dx[c] += acc;
  }
}

/* Iterates the rows (all dimensions but the last) of the shard. */
static gboolean rows_first(const ExecKernelArgs *a, int r, SimRegion *rows, int64_t *idx)
{
  rows->ndim = r - 1;
  for (int d = 0; d < r - 1; d++) {
    rows->lo[d] = a->lo[d];
    rows->hi[d] = a->hi[d];
    idx[d] = a->lo[d];
  }
  idx[r - 1] = 0;
  return !exec_region_is_empty(rows);
}

/* Copies row @idx of @v (its last dimension, whole) into @buf, or zeroes @buf for NULL. */
static void row_get(const ExecView *v, const int64_t *idx, int64_t n, float *buf)
{
  int r = v->box.ndim;
  const float *p = cpu_f32(v) + cpu_off(v, idx);
  for (int64_t c = 0; c < n; c++)
    buf[c] = p[c * v->stride[r - 1]];
}

static void row_add(const ExecView *v, const int64_t *idx, int64_t n, const float *buf,
                    gboolean assign)
{
  int r = v->box.ndim;
  float *p = cpu_f32(v) + cpu_off(v, idx);
  for (int64_t c = 0; c < n; c++) {
    if (assign)
      p[c * v->stride[r - 1]] = buf[c];
    else
      p[c * v->stride[r - 1]] += buf[c];
  }
}

gboolean cpu_kernel_gated_mlp(const ExecKernelArgs *a, GError **error)
{
  const ExecView *X = &a->in[0];
  int r = X->box.ndim;
  gboolean fwd = a->phase == EXEC_KERNEL_FORWARD;
  Glu m = {
    .wg = &a->w[0], .wu = &a->w[1], .wd = &a->w[2],
    .dwg = fwd ? NULL : &a->w_grad[0], .dwu = fwd ? NULL : &a->w_grad[1],
    .dwd = fwd ? NULL : &a->w_grad[2],
    .expert = -1, .f0 = a->lo[r - 1], .f1 = a->hi[r - 1],
    .dm = sim_graph_tensor_shape(a->graph, sim_graph_op_input(a->graph, a->op, 0)).dims[r - 1],
    .act = (SimUnaryKind)cpu_attr_int(a, "gate_activation", SIM_UNARY_SILU),
  };
  int64_t F = m.f1 - m.f0, dm = m.dm;
  SimRegion rows;
  int64_t idx[SIM_MAX_DIMS];
  if (!rows_first(a, r, &rows, idx))
    return TRUE;
  float *gu = g_new(float, MAX(3 * F, 1)), *tmp = g_new(float, MAX(2 * F, 1));
  float *xb = g_new(float, MAX(dm, 1)), *yb = g_new(float, MAX(dm, 1));
  float *db = g_new(float, MAX(dm, 1));
  do {
    row_get(X, idx, dm, xb);
    memset(yb, 0, sizeof(float) * (size_t)dm);
    if (fwd) {
      glu_forward(&m, xb, 1, 1.0f, yb, gu);
      row_add(&a->out[0], idx, dm, yb, !a->accumulate);
      continue;
    }
    glu_forward(&m, xb, 1, 1.0f, NULL, gu);
    row_get(&a->out_grad[0], idx, dm, db);
    gboolean dx = cpu_has(&a->in_grad[0]);
    glu_backward(&m, xb, 1, db, 1.0f, dx ? yb : NULL, gu, tmp);
    if (dx)
      row_add(&a->in_grad[0], idx, dm, yb, FALSE);
  } while (exec_region_next(&rows, idx));
  g_free(gu);
  g_free(tmp);
  g_free(xb);
  g_free(yb);
  g_free(db);
  return TRUE;
}

/* The routing of one token: softmax over its E logits, its top k (ties to the lower
 * index) and their weights. */
typedef struct {
  int64_t E, k;
  gboolean normalize;
  double *p;        /* E probabilities           */
  int64_t *pick;    /* k expert indices          */
  double sum;       /* the picks' probability mass */
} Route;

static void route(const float *logits, Route *rt)
{
  double mx = -INFINITY;
  for (int64_t e = 0; e < rt->E; e++) {
    rt->p[e] = logits[e];
    mx = MAX(mx, rt->p[e]);
  }
  double s = 0;
  for (int64_t e = 0; e < rt->E; e++) {
    rt->p[e] = exp(rt->p[e] - mx);
    s += rt->p[e];
  }
  for (int64_t e = 0; e < rt->E; e++)
    rt->p[e] /= s;
  rt->sum = 0;
  for (int64_t j = 0; j < rt->k; j++) {
    int64_t best = -1;
    for (int64_t e = 0; e < rt->E; e++) {
      gboolean taken = FALSE;
      for (int64_t i = 0; i < j; i++)
        taken |= rt->pick[i] == e;
      if (!taken && (best < 0 || rt->p[e] > rt->p[best]))
        best = e;
    }
    rt->pick[j] = best;
    rt->sum += rt->p[best];
  }
}

static double route_weight(const Route *rt, int64_t j)
{
  return rt->normalize ? rt->p[rt->pick[j]] / rt->sum : rt->p[rt->pick[j]];
}

gboolean cpu_kernel_moe(const ExecKernelArgs *a, GError **error)
{
  const ExecView *X = &a->in[0], *L = &a->in[1];
  gboolean fwd = a->phase == EXEC_KERNEL_FORWARD;
  Glu m = {
    .wg = &a->w[0], .wu = &a->w[1], .wd = &a->w[2],
    .dwg = fwd ? NULL : &a->w_grad[0], .dwu = fwd ? NULL : &a->w_grad[1],
    .dwd = fwd ? NULL : &a->w_grad[2],
    .f0 = a->lo[3], .f1 = a->hi[3],
    .dm = sim_graph_tensor_shape(a->graph, sim_graph_op_input(a->graph, a->op, 0)).dims[2],
    .act = (SimUnaryKind)cpu_attr_int(a, "gate_activation", SIM_UNARY_SILU),
  };
  Route rt = {
    .E = cpu_attr_int(a, "experts", 1),
    .k = cpu_attr_int(a, "top_k", 1),
    .normalize = cpu_attr_int(a, "normalize_top_k", 1) != 0,
  };
  int64_t F = m.f1 - m.f0, dm = m.dm, x0 = a->lo[2], x1 = a->hi[2];
  SimRegion rows;
  int64_t idx[SIM_MAX_DIMS];
  if (!rows_first(a, 3, &rows, idx))
    return TRUE;
  rt.p = g_new(double, rt.E);
  rt.pick = g_new(int64_t, rt.k);
  double *dw = g_new(double, rt.k), *dp = g_new(double, rt.E);
  float *gu = g_new(float, MAX(3 * F, 1)), *tmp = g_new(float, MAX(2 * F, 1));
  float *xb = g_new(float, dm), *yb = g_new(float, dm), *db = g_new(float, dm);
  float *ob = g_new(float, dm), *lb = g_new(float, rt.E);
  do {
    row_get(X, idx, dm, xb);
    row_get(L, idx, rt.E, lb);
    route(lb, &rt);
    memset(yb, 0, sizeof(float) * (size_t)dm);
    if (fwd) {
      for (int64_t j = 0; j < rt.k; j++) {
        m.expert = rt.pick[j];
        if (m.expert >= x0 && m.expert < x1)
          glu_forward(&m, xb, 1, (float)route_weight(&rt, j), yb, gu);
      }
      row_add(&a->out[0], idx, dm, yb, !a->accumulate);
      continue;
    }
    row_get(&a->out_grad[0], idx, dm, db);
    gboolean has_dx = cpu_has(&a->in_grad[0]);
    for (int64_t j = 0; j < rt.k; j++) {
      dw[j] = 0;
      m.expert = rt.pick[j];
      if (m.expert < x0 || m.expert >= x1)
        continue;
      /* The expert's (partial) output for the weight's gradient, then its backward. */
      memset(ob, 0, sizeof(float) * (size_t)dm);
      glu_forward(&m, xb, 1, 1.0f, ob, gu);
      for (int64_t c = 0; c < dm; c++)
        dw[j] += (double)db[c] * ob[c];
      glu_backward(&m, xb, 1, db, (float)route_weight(&rt, j), has_dx ? yb : NULL, gu, tmp);
    }
    /* Through the renormalization and the softmax, to the router's logits. */
    memset(dp, 0, sizeof(double) * (size_t)rt.E);
    double mix = 0;
    for (int64_t j = 0; j < rt.k; j++)
      mix += dw[j] * rt.p[rt.pick[j]];
    for (int64_t j = 0; j < rt.k; j++)
      dp[rt.pick[j]] = rt.normalize ? dw[j] / rt.sum - mix / (rt.sum * rt.sum) : dw[j];
    double dot = 0;
    for (int64_t e = 0; e < rt.E; e++)
      dot += rt.p[e] * dp[e];
    for (int64_t e = 0; e < rt.E; e++)
      lb[e] = (float)(rt.p[e] * (dp[e] - dot));
    if (cpu_has(&a->in_grad[1]))
      row_add(&a->in_grad[1], idx, rt.E, lb, FALSE);
    if (has_dx)
      row_add(&a->in_grad[0], idx, dm, yb, FALSE);
  } while (exec_region_next(&rows, idx));
  g_free(rt.p);
  g_free(rt.pick);
  g_free(dw);
  g_free(dp);
  g_free(gu);
  g_free(tmp);
  g_free(xb);
  g_free(yb);
  g_free(db);
  g_free(ob);
  g_free(lb);
  return TRUE;
}
