/* subst-verify.c — verification of the generated substitutions (subst-gen.c): a rule's
 * source pattern and its rewrite run forwards by the CPU reference executor on random
 * inputs and weights, the rewritten operators' weights mapped from the source ones, and
 * their outputs compared. */
#include "subst-private.h"

#include "parasol-exec.h"

#include <string.h>

/* ---------------------------------------------------------------------------------- */
/* Running a graph forwards with the CPU executor                                      */

typedef struct {
  ExecBackend *b;
  GPtrArray *buffers;       /* ExecBuffer*, freed with the run                          */
} Fwd;

static gboolean view_new(Fwd *f, const SimShape *s, SimDType dt, ExecView *v, GError **error)
{
  SimRegion r = sim_region_full(s);
  size_t es = dt == SIM_DTYPE_INT64 ? 8 : 4;
  ExecBuffer *buf =
    exec_backend_buffer_alloc(f->b, 0, (size_t)MAX(sim_shape_numel(s), 1) * es, error);
  if (!buf)
    return FALSE;
  g_ptr_array_add(f->buffers, buf);
  *v = exec_view_dense(buf, dt, &r);
  return TRUE;
}

/* The source pattern's weight @i of the op named @name: uniform in [-1, 1). */
static void gen_weight(const char *name, int i, int64_t n, float *out)
{
  g_autofree char *key = g_strdup_printf("%s#%d", name, i);
  for (int64_t k = 0; k < n; k++)
    out[k] = (float)(2 * exec_hash_uniform(key, (uint64_t)k, 7) - 1);
}

typedef struct {
  const SubstRule *rule;
  const SimGraph *src;
} WeightMap;

/* Concatenates @n row-major tensors of shapes @shapes along @axis into @out. */
static void concat_along(int n, float **parts, const SimShape *shapes, int axis, float *out)
{
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; d++)
    outer *= shapes[0].dims[d];
  for (int d = axis + 1; d < shapes[0].ndim; d++)
    inner *= shapes[0].dims[d];
  int64_t pos = 0;
  for (int64_t o = 0; o < outer; o++)
    for (int i = 0; i < n; i++) {
      int64_t chunk = shapes[i].dims[axis] * inner;
      memcpy(out + pos, parts[i] + o * chunk, sizeof(float) * (size_t)chunk);
      pos += chunk;
    }
}

static gboolean no_mapping(const char *name, GError **error)
{
  g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
              "no weights of the source pattern map to operator '%s'", name);
  return FALSE;
}

/* The weight @i of op @op of the rewritten pattern @g, from the source pattern's. */
static gboolean map_weight(const WeightMap *wm, const SimGraph *g, int op, int i, float *out,
                           GError **error)
{
  const char *name = sim_graph_op_name(g, op);
  SimShape s = sim_graph_op_weight_shape(g, op, i);
  int64_t n = sim_shape_numel(&s);
  int same = sim_graph_op_by_name(wm->src, name);
  if (same >= 0 && sim_graph_op_type(wm->src, same) == sim_graph_op_type(g, op) &&
      i < sim_graph_op_n_weights(wm->src, same)) {
    SimShape t = sim_graph_op_weight_shape(wm->src, same, i);
    if (sim_shape_numel(&t) == n) {
      gen_weight(name, i, n, out);
      return TRUE;
    }
  }
  /* A fused attention "SM.attention": Wq, Wk, Wv, Wo, then their biases, from the four
   * linears around softmax SM. */
  if (sim_graph_op_type(g, op) == SIM_OP_ATTENTION && g_str_has_suffix(name, ".attention")) {
    g_autofree char *sm_name = g_strndup(name, strlen(name) - strlen(".attention"));
    int sm = sim_graph_op_by_name(wm->src, sm_name), lin[4];
    if (sm < 0 || !subst_attention_linears(wm->src, sm, lin))
      return no_mapping(name, error);
    gen_weight(sim_graph_op_name(wm->src, lin[i % 4]), i / 4, n, out);
    return TRUE;
  }
  /* Part k of a split linear "L.partK": rows of W_L, the bias with part 0. */
  const char *dot = strrchr(name, '.');
  if (dot && g_str_has_prefix(dot, ".part")) {
    g_autofree char *whole = g_strndup(name, (gsize)(dot - name));
    int src = sim_graph_op_by_name(wm->src, whole);
    int k = atoi(dot + 5);
    if (src < 0)
      return no_mapping(name, error);
    SimShape ws = sim_graph_op_weight_shape(wm->src, src, i);
    g_autofree float *full = g_new(float, MAX(sim_shape_numel(&ws), 1));
    gen_weight(whole, i, sim_shape_numel(&ws), full);
    if (i == 1) {
      memcpy(out, full, sizeof(float) * (size_t)n);
      return TRUE;
    }
    int64_t row = 0;
    for (int j = 0; j < k; j++) {
      g_autofree char *pn = g_strdup_printf("%s.part%d", whole, j);
      int pj = sim_graph_op_by_name(g, pn);
      if (pj < 0)
        return no_mapping(name, error);
      row += sim_graph_op_weight_shape(g, pj, 0).dims[0];
    }
    if (wm->rule && wm->rule->wrong_map)
      row = ws.dims[0] - row - s.dims[0];
    memcpy(out, full + row * ws.dims[1], sizeof(float) * (size_t)n);
    return TRUE;
  }
  /* A collapsed chain "A*B": W = W_A W_B, b = b_A W_B + b_B. */
  const char *star = strchr(name, '*');
  if (star) {
    g_autofree char *na = g_strndup(name, (gsize)(star - name));
    int a = sim_graph_op_by_name(wm->src, na), b = sim_graph_op_by_name(wm->src, star + 1);
    if (a < 0 || b < 0)
      return no_mapping(name, error);
    SimShape wa = sim_graph_op_weight_shape(wm->src, a, 0);
    SimShape wb = sim_graph_op_weight_shape(wm->src, b, 0);
    int64_t in = wa.dims[0], mid = wa.dims[1], o = wb.dims[1];
    g_autofree float *A = g_new(float, in * mid);
    g_autofree float *B = g_new(float, mid * o);
    gen_weight(na, 0, in * mid, A);
    gen_weight(star + 1, 0, mid * o, B);
    if (i == 0) {
      for (int64_t r = 0; r < in; r++)
        for (int64_t c = 0; c < o; c++) {
          double acc = 0;
          for (int64_t k = 0; k < mid; k++)
            acc += (double)A[r * mid + k] * B[k * o + c];
          out[r * o + c] = (float)acc;
        }
    } else {
      g_autofree float *ba = g_new(float, mid);
      g_autofree float *bb = g_new(float, o);
      gen_weight(na, 1, mid, ba);
      gen_weight(star + 1, 1, o, bb);
      for (int64_t c = 0; c < o; c++) {
        double acc = bb[c];
        for (int64_t k = 0; k < mid; k++)
          acc += (double)ba[k] * B[k * o + c];
        out[c] = (float)acc;
      }
    }
    return TRUE;
  }
  /* Merged or stacked "A+B+..": concatenated along the axis where the shapes differ, or
   * summed where they are all the rewritten op's (the biases of a distributed product). */
  g_auto(GStrv) parts = g_strsplit(name, "+", -1);
  int np = (int)g_strv_length(parts);
  if (np < 2 || np > SUBST_MAX_OPS)
    return no_mapping(name, error);
  float *vals[SUBST_MAX_OPS];
  SimShape shapes[SUBST_MAX_OPS];
  int axis = -1;
  for (int k = 0; k < np; k++) {
    int idx = wm->rule && wm->rule->wrong_map ? np - 1 - k : k;
    int src = sim_graph_op_by_name(wm->src, parts[idx]);
    if (src < 0 || i >= sim_graph_op_n_weights(wm->src, src)) {
      for (int j = 0; j < k; j++)
        g_free(vals[j]);
      return no_mapping(name, error);
    }
    shapes[k] = sim_graph_op_weight_shape(wm->src, src, i);
    vals[k] = g_new(float, MAX(sim_shape_numel(&shapes[k]), 1));
    gen_weight(parts[idx], i, sim_shape_numel(&shapes[k]), vals[k]);
    for (int d = 0; d < s.ndim && axis < 0; d++)
      if (shapes[k].dims[d] != s.dims[d])
        axis = d;
  }
  if (axis < 0) {
    for (int64_t e = 0; e < n; e++) {
      out[e] = 0;
      for (int k = 0; k < np; k++)
        out[e] += vals[k][e];
    }
  } else {
    concat_along(np, vals, shapes, axis, out);
  }
  for (int k = 0; k < np; k++)
    g_free(vals[k]);
  return TRUE;
}

/* Runs @g forwards once; returns each tensor's values (fp32; NULL for integer ones). */
static float **forward(const SimGraph *g, const WeightMap *wm, float range, GError **error)
{
  g_autoptr(ExecBackend) b = exec_backend_new("cpu", error);
  if (!b || !exec_backend_open(b, 1, error))
    return NULL;
  Fwd f = { b, g_ptr_array_new() };
  int nt = sim_graph_n_tensors(g), nops = sim_graph_n_ops(g);
  ExecView *views = g_new0(ExecView, MAX(nt, 1));
  float **vals = g_new0(float *, MAX(nt, 1));
  gboolean ok = TRUE;
  for (int op = 0; op < nops && ok; op++) {
    int n_in = sim_graph_op_n_inputs(g, op), n_out = sim_graph_op_n_outputs(g, op);
    int n_w = sim_graph_op_n_weights(g, op);
    if (sim_graph_op_type(g, op) == SIM_OP_INPUT) {
      for (int j = 0; j < n_out && ok; j++) {
        int t = sim_graph_op_output(g, op, j);
        SimShape s = sim_graph_tensor_shape(g, t);
        int64_t n = sim_shape_numel(&s);
        SimDType dt = sim_graph_tensor_dtype(g, t);
        gboolean is_int = dt == SIM_DTYPE_INT32 || dt == SIM_DTYPE_INT64;
        ok = view_new(&f, &s, is_int ? SIM_DTYPE_INT64 : SIM_DTYPE_FP32, &views[t], error);
        if (!ok)
          break;
        g_autofree void *data = g_malloc(8 * (size_t)MAX(n, 1));
        exec_input_values(g, t, 1, 11, data);
        if (!is_int) {
          float *f32 = data;
          for (int64_t k = 0; k < n; k++)
            f32[k] *= range;
          vals[t] = g_memdup2(data, 4 * (size_t)MAX(n, 1));
        }
        ok = exec_backend_buffer_write(b, 0, views[t].buffer, 0, data,
                                       (size_t)n * (is_int ? 8 : 4), error);
      }
      continue;
    }
    ExecView in[8] = { 0 }, in_grad[8] = { 0 }, w[8] = { 0 }, w_grad[8] = { 0 };
    ExecView out[8] = { 0 }, out_grad[8] = { 0 };
    if (n_in > 8 || n_w > 8 || n_out > 8) {
      g_set_error(error, EXEC_ERROR, EXEC_ERROR_UNSUPPORTED, "operator '%s' is too wide",
                  sim_graph_op_name(g, op));
      ok = FALSE;
      break;
    }
    for (int i = 0; i < n_in; i++)
      in[i] = views[sim_graph_op_input(g, op, i)];
    for (int i = 0; i < n_w && ok; i++) {
      SimShape s = sim_graph_op_weight_shape(g, op, i);
      int64_t n = sim_shape_numel(&s);
      ok = view_new(&f, &s, SIM_DTYPE_FP32, &w[i], error);
      if (!ok)
        break;
      g_autofree float *data = g_new(float, MAX(n, 1));
      ok = wm ? map_weight(wm, g, op, i, data, error)
              : (gen_weight(sim_graph_op_name(g, op), i, n, data), TRUE);
      ok = ok && exec_backend_buffer_write(b, 0, w[i].buffer, 0, data, (size_t)n * 4, error);
    }
    for (int j = 0; j < n_out && ok; j++) {
      int t = sim_graph_op_output(g, op, j);
      SimShape s = sim_graph_tensor_shape(g, t);
      ok = view_new(&f, &s, SIM_DTYPE_FP32, &views[t], error);
      out[j] = views[t];
    }
    if (!ok)
      break;
    ExecKernelArgs a = { .graph = g, .op = op, .phase = EXEC_KERNEL_FORWARD, .step = 1,
                         .batch = sim_graph_batch_size(g), .microbatches = 1,
                         .n_inputs = n_in, .in = in, .in_grad = in_grad,
                         .n_weights = n_w, .w = w, .w_grad = w_grad,
                         .n_outputs = n_out, .out = out, .out_grad = out_grad };
    gpointer saved = NULL;
    a.saved = &saved;
    for (int d = 0; d < sim_graph_op_n_dims(g, op); d++)
      a.hi[d] = sim_graph_op_dim_size(g, op, d);
    ok = exec_backend_kernel(b, 0, &a, error);
    exec_backend_saved_free(b, 0, saved);
    for (int j = 0; j < n_out && ok; j++) {
      int t = sim_graph_op_output(g, op, j);
      SimShape s = sim_graph_tensor_shape(g, t);
      int64_t n = sim_shape_numel(&s);
      vals[t] = g_new(float, MAX(n, 1));
      ok = exec_backend_buffer_read(b, 0, views[t].buffer, 0, vals[t], (size_t)n * 4, error);
    }
  }
  for (guint i = 0; i < f.buffers->len; i++)
    exec_backend_buffer_free(b, 0, g_ptr_array_index(f.buffers, i));
  g_ptr_array_unref(f.buffers);
  g_free(views);
  if (!ok) {
    for (int t = 0; t < nt; t++)
      g_free(vals[t]);
    g_free(vals);
    return NULL;
  }
  return vals;
}

static void free_values(float **vals, int n)
{
  if (!vals)
    return;
  for (int t = 0; t < n; t++)
    g_free(vals[t]);
  g_free(vals);
}

/* ---------------------------------------------------------------------------------- */
/* Verification                                                                       */

/* Applies @rewrite to @src (under @rule, if not NULL, the rule being verified), runs both
 * graphs forwards and compares every output of @src with its counterpart.  Returns the
 * verdict; @error gets the largest relative difference, @why the reason of a rejection. */
static SubstVerdict compare_rewrite(const SimGraph *src, const char *rewrite,
                                    const SubstRule *rule, double *error_out, char **why)
{
  GError *error = NULL;
  *error_out = 0;
  *why = NULL;
  g_autofree int *tmap = NULL;
  if (rule)
    g_private_set(&subst_forced_key, (gpointer)rule);
  g_autoptr(SimGraph) dst = subst_apply(src, rewrite, &tmap, &error);
  if (rule)
    g_private_set(&subst_forced_key, NULL);
  if (!dst) {
    *why = g_strdup(error ? error->message : "the rewrite does not apply");
    g_clear_error(&error);
    return SUBST_INEXPRESSIBLE;
  }
  int nts = sim_graph_n_tensors(src), ntd = sim_graph_n_tensors(dst);
  WeightMap wm = { rule, src };
  double worst = 0;
  int outputs = 0;
  static const float ranges[] = { 1.0f, SUBST_INPUT_RANGE };
  for (gsize ri = 0; ri < G_N_ELEMENTS(ranges) && !*why; ri++) {
    float **a = forward(src, NULL, ranges[ri], &error);
    float **b = a ? forward(dst, &wm, ranges[ri], &error) : NULL;
    if (!a || !b) {
      *why = g_strdup_printf("execution: %s", error ? error->message : "failed");
      g_clear_error(&error);
      free_values(a, nts);
      free_values(b, ntd);
      return SUBST_INEXPRESSIBLE;
    }
    for (int t = 0; t < nts && !*why; t++) {
      int p = sim_graph_tensor_producer(src, t);
      if (p < 0 || sim_graph_op_type(src, p) == SIM_OP_INPUT ||
          sim_graph_tensor_n_consumers(src, t) > 0 || !a[t])
        continue;
      int u = tmap[t];
      SimShape ss = sim_graph_tensor_shape(src, t);
      if (u < 0 || !b[u]) {
        *why = g_strdup_printf("output '%s' has no counterpart",
                               sim_graph_tensor_name(src, t));
        break;
      }
      SimShape sd = sim_graph_tensor_shape(dst, u);
      if (ss.ndim != sd.ndim || memcmp(ss.dims, sd.dims, sizeof(int64_t) * (size_t)ss.ndim)) {
        *why = g_strdup_printf("output '%s' changes shape", sim_graph_tensor_name(src, t));
        break;
      }
      int64_t n = sim_shape_numel(&ss);
      double scale = 1, diff = 0;
      for (int64_t k = 0; k < n; k++) {
        scale = MAX(scale, fabs(a[t][k]));
        double d = fabs((double)a[t][k] - b[u][k]);
        diff = isnan(d) ? INFINITY : MAX(diff, d);
      }
      worst = MAX(worst, diff / scale);
      outputs++;
    }
    free_values(a, nts);
    free_values(b, ntd);
  }
  *error_out = worst;
  if (*why)
    return SUBST_MISMATCH;
  if (outputs == 0) {
    *why = g_strdup("no output to compare");
    return SUBST_MISMATCH;
  }
  if (!(worst <= SUBST_TOLERANCE)) {
    *why = g_strdup_printf("outputs differ by %.3g (relative; tolerance %g)", worst,
                           SUBST_TOLERANCE);
    return SUBST_MISMATCH;
  }
  return SUBST_VERIFIED;
}

void subst_rule_verify(SubstRule *r)
{
  g_clear_pointer(&r->why, g_free);
  r->error = 0;
  g_autofree char *rewrite = NULL;
  g_autoptr(SimGraph) src = subst_source_pattern(r, &rewrite);
  GError *error = NULL;
  if (!sim_graph_check(src, &error)) {
    r->verdict = SUBST_INEXPRESSIBLE;
    r->why = g_strdup_printf("source pattern: %s", error->message);
    g_error_free(error);
    return;
  }
  /* The rule itself decides the rewrite of its own pattern (the set is being built). */
  r->verdict = compare_rewrite(src, rewrite, r, &r->error, &r->why);
}

gboolean subst_check_rewrite(const SimGraph *g, const char *rewrite, double *diff,
                             GError **error)
{
  char *why = NULL;
  SubstVerdict v = compare_rewrite(g, rewrite, NULL, diff, &why);
  if (v != SUBST_VERIFIED)
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID, "rewrite '%s': %s", rewrite, why);
  g_free(why);
  return v == SUBST_VERIFIED;
}
