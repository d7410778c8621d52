/* calibrate.c — fitting the simulator's analytical models to measurements.
 *
 * Operators: the roofline model (sim/roofline.c) has one achieved-efficiency parameter
 * per kernel kind.  Given measured shards with their kernels, the efficiencies that make
 * the model's times closest to the measured ones, in the least-squares sense on log
 * times (so that a 10 us kernel and a 10 ms kernel weigh the same, and a factor of two
 * too slow costs what a factor of two too fast costs), are found by Levenberg-Marquardt
 * on the logarithms of the efficiencies, which keeps them positive.  The model is
 * evaluated by the roofline cost model itself, so the fit and the simulator can never
 * disagree about what an efficiency means.
 *
 * Collectives: the simulator's ring model is linear in its two unknowns (the cost of one
 * step and the inverse of the bandwidth efficiency), so their fit is a weighted linear
 * least-squares problem with a closed form. */
#include "profile-private.h"

#include <math.h>
#include <string.h>

enum { P_GEMM, P_CONV, P_MEMORY, P_GATHER, P_RECURRENT, N_PARAMS };

/* The smallest and largest efficiency the fit may return: below 1e-4 a kernel would be
 * ten thousand times slower than its roofline, which no measurement explains; above 4
 * the device spec is wrong rather than the efficiency. */
#define EFF_MIN 1e-4
#define EFF_MAX 4.0

static double *param_slot(SimRooflineParams *p, int i)
{
  switch (i) {
  case P_GEMM: return &p->gemm_efficiency;
  case P_CONV: return &p->conv_efficiency;
  case P_MEMORY: return &p->memory_efficiency;
  case P_GATHER: return &p->gather_efficiency;
  default: return &p->recurrent_efficiency;
  }
}

static double predict(const ProfileOpEntry *e, const SimDeviceSpec *dev,
                      const SimRooflineParams *p)
{
  g_autoptr(SimCostModel) m = sim_cost_model_new_roofline(p);
  double t = 0.0;
  for (int i = 0; i < e->n_kernels; i++)
    t += sim_cost_model_kernel_time(m, dev, &e->kernels[i]);
  return t;
}

static gboolean usable(const ProfileOpEntry *e, const char *gpu)
{
  return e->n_kernels > 0 && e->median > 0.0 && (!gpu || !strcmp(e->gpu, gpu));
}

double profile_calibration_residual(const ProfileDb *db, int i, const SimDeviceSpec *dev,
                                    const SimRooflineParams *params)
{
  g_return_val_if_fail(db != NULL && dev != NULL, NAN);
  const ProfileOpEntry *e = profile_db_op(db, i);
  if (!e || !usable(e, NULL))
    return NAN;
  SimRooflineParams p = params ? *params : sim_roofline_params_default();
  double t = predict(e, dev, &p);
  return t > 0.0 ? log(t / e->median) : NAN;
}

typedef struct {
  const ProfileOpEntry **entries;
  int n;
  const SimDeviceSpec *dev;
  SimRooflineParams base;
  int free_idx[N_PARAMS];     /* the parameters being fitted                           */
  int n_free;
} Problem;

static SimRooflineParams params_at(const Problem *pb, const double *x)
{
  SimRooflineParams p = pb->base;
  for (int j = 0; j < pb->n_free; j++)
    *param_slot(&p, pb->free_idx[j]) = exp(x[j]);
  return p;
}

/* Residuals log(predicted / measured); returns their sum of squares. */
static double residuals(const Problem *pb, const double *x, double *r)
{
  SimRooflineParams p = params_at(pb, x);
  double ss = 0.0;
  for (int i = 0; i < pb->n; i++) {
    double t = predict(pb->entries[i], pb->dev, &p);
    r[i] = log(MAX(t, 1e-300) / pb->entries[i]->median);
    ss += r[i] * r[i];
  }
  return ss;
}

/* Solves the @n x @n system A x = b in place by Gaussian elimination with partial
 * pivoting; FALSE when A is singular. */
static gboolean solve(double *A, double *b, int n)
{
  for (int c = 0; c < n; c++) {
    int piv = c;
    for (int r = c + 1; r < n; r++)
      if (fabs(A[r * n + c]) > fabs(A[piv * n + c]))
        piv = r;
    if (fabs(A[piv * n + c]) < 1e-300)
      return FALSE;
    if (piv != c) {
      for (int k = 0; k < n; k++) {
        double t = A[c * n + k];
        A[c * n + k] = A[piv * n + k];
        A[piv * n + k] = t;
      }
      double t = b[c];
      b[c] = b[piv];
      b[piv] = t;
    }
    for (int r = c + 1; r < n; r++) {
      double f = A[r * n + c] / A[c * n + c];
      for (int k = c; k < n; k++)
        A[r * n + k] -= f * A[c * n + k];
      b[r] -= f * b[c];
    }
  }
  for (int c = n - 1; c >= 0; c--) {
    double s = b[c];
    for (int k = c + 1; k < n; k++)
      s -= A[c * n + k] * b[k];
    b[c] = s / A[c * n + c];
  }
  return TRUE;
}

static void clamp_params(double *x, int n)
{
  for (int j = 0; j < n; j++)
    x[j] = CLAMP(x[j], log(EFF_MIN), log(EFF_MAX));
}

static void levenberg_marquardt(const Problem *pb, double *x)
{
  int n = pb->n, p = pb->n_free;
  g_autofree double *r = g_new(double, n);
  g_autofree double *rt = g_new(double, n);
  g_autofree double *J = g_new(double, (gsize)n * (gsize)p);
  double cost = residuals(pb, x, r);
  double lambda = 1e-3;
  for (int iter = 0; iter < 300 && cost > 0.0; iter++) {
    /* Forward differences: the model has kinks (the max of compute and memory time),
     * where a one-sided slope is still a descent direction. */
    for (int j = 0; j < p; j++) {
      double xj = x[j], h = 1e-6 * MAX(1.0, fabs(xj));
      x[j] = xj + h;
      residuals(pb, x, rt);
      x[j] = xj;
      for (int i = 0; i < n; i++)
        J[(gsize)i * (gsize)p + (gsize)j] = (rt[i] - r[i]) / h;
    }
    double JtJ[N_PARAMS * N_PARAMS] = { 0 }, g[N_PARAMS] = { 0 };
    for (int i = 0; i < n; i++)
      for (int a = 0; a < p; a++) {
        double ja = J[(gsize)i * (gsize)p + (gsize)a];
        g[a] += ja * r[i];
        for (int b = 0; b < p; b++)
          JtJ[a * p + b] += ja * J[(gsize)i * (gsize)p + (gsize)b];
      }
    gboolean improved = FALSE;
    while (lambda < 1e12) {
      double A[N_PARAMS * N_PARAMS], dx[N_PARAMS], xn[N_PARAMS];
      for (int a = 0; a < p; a++) {
        for (int b = 0; b < p; b++)
          A[a * p + b] = JtJ[a * p + b];
        A[a * p + a] += lambda * MAX(JtJ[a * p + a], 1e-12);
        dx[a] = -g[a];
      }
      if (!solve(A, dx, p)) {
        lambda *= 10.0;
        continue;
      }
      for (int a = 0; a < p; a++)
        xn[a] = x[a] + dx[a];
      clamp_params(xn, p);
      double cn = residuals(pb, xn, rt);
      if (cn < cost) {
        double gain = cost - cn;
        for (int a = 0; a < p; a++)
          x[a] = xn[a];
        memcpy(r, rt, sizeof(double) * (size_t)n);
        cost = cn;
        lambda = MAX(lambda / 3.0, 1e-12);
        improved = gain > 1e-14 * MAX(cost, 1e-300);
        break;
      }
      lambda *= 4.0;
    }
    if (!improved)
      break;
  }
}

static void summarize(const Problem *pb, const SimRooflineParams *p, double *rms, double *mae,
                      double *worst)
{
  double ss = 0.0, sa = 0.0, w = 0.0;
  for (int i = 0; i < pb->n; i++) {
    const ProfileOpEntry *e = pb->entries[i];
    double t = predict(e, pb->dev, p);
    double lr = log(MAX(t, 1e-300) / e->median);
    double rel = fabs(t - e->median) / e->median;
    ss += lr * lr;
    sa += rel;
    w = MAX(w, rel);
  }
  *rms = pb->n ? sqrt(ss / pb->n) : 0.0;
  *mae = pb->n ? sa / pb->n : 0.0;
  if (worst)
    *worst = w;
}

gboolean profile_calibrate_roofline(const ProfileDb *db, const char *gpu,
                                    const SimDeviceSpec *dev, const SimRooflineParams *start,
                                    ProfileCalibration *out, GError **error)
{
  g_return_val_if_fail(db != NULL && gpu != NULL && dev != NULL && out != NULL, FALSE);
  memset(out, 0, sizeof *out);
  Problem pb = { .dev = dev, .base = start ? *start : sim_roofline_params_default() };
  /* One GEMM and one convolution efficiency, whatever units the profile's kernels ran on
   * (an fp32 profile's ran on the CUDA cores). */
  pb.base.cuda_core_efficiency = 0;
  int n = profile_db_n_ops(db);
  pb.entries = g_new(const ProfileOpEntry *, MAX(n, 1));
  gboolean present[N_PARAMS] = { FALSE };
  for (int i = 0; i < n; i++) {
    const ProfileOpEntry *e = profile_db_op(db, i);
    if (!usable(e, gpu))
      continue;
    pb.entries[pb.n++] = e;
    for (int k = 0; k < e->n_kernels; k++) {
      switch (e->kernels[k].kind) {
      case SIM_KERNEL_GEMM: present[P_GEMM] = TRUE; break;
      case SIM_KERNEL_CONV: present[P_CONV] = TRUE; break;
      case SIM_KERNEL_MEMORY:
      case SIM_KERNEL_OPTIMIZER: present[P_MEMORY] = TRUE; break;
      case SIM_KERNEL_GATHER: present[P_GATHER] = TRUE; break;
      case SIM_KERNEL_RECURRENT: present[P_RECURRENT] = TRUE; break;
      default: break;
      }
    }
  }
  if (pb.n == 0) {
    g_free(pb.entries);
    g_set_error(error, PROFILE_ERROR, PROFILE_ERROR_INVALID,
                "the profile has no operator entries with kernels for '%s'", gpu);
    return FALSE;
  }
  double x[N_PARAMS];
  for (int j = 0; j < N_PARAMS; j++)
    if (present[j]) {
      pb.free_idx[pb.n_free] = j;
      x[pb.n_free++] = log(CLAMP(*param_slot(&pb.base, j), EFF_MIN, EFF_MAX));
    }
  summarize(&pb, &pb.base, &out->rms_log_before, &out->mean_abs_error_before, NULL);
  levenberg_marquardt(&pb, x);
  out->params = params_at(&pb, x);
  for (int j = 0; j < N_PARAMS; j++)
    out->fitted[j] = present[j];
  out->n_entries = pb.n;
  summarize(&pb, &out->params, &out->rms_log_after, &out->mean_abs_error_after,
            &out->worst_error_after);
  g_free(pb.entries);
  return TRUE;
}

/* ---------------------------------------------------------------------------------- */
/* Collectives                                                                         */

/* The steps of the ring and the bytes each step moves per rank, for @bytes on @n. */
static void ring_shape(ProfileCollKind kind, int n, double bytes, double *steps, double *chunk)
{
  switch (kind) {
  case PROFILE_COLL_ALLREDUCE:
    *steps = 2.0 * (n - 1);
    *chunk = bytes / n;
    return;
  case PROFILE_COLL_ALLGATHER:
  case PROFILE_COLL_REDUCE_SCATTER:
    *steps = n - 1;
    *chunk = bytes / n;
    return;
  default:
    *steps = 1.0;
    *chunk = bytes;
    return;
  }
}

gboolean profile_db_fit_collective(const ProfileDb *db, const char *gpu, ProfileCollKind kind,
                                   double link_bandwidth, double link_latency,
                                   ProfileCollFit *out, GError **error)
{
  g_return_val_if_fail(db != NULL && gpu != NULL && out != NULL, FALSE);
  g_return_val_if_fail(kind >= 0 && kind < PROFILE_COLL_COUNT, FALSE);
  memset(out, 0, sizeof *out);
  if (!(link_bandwidth > 0.0) || link_latency < 0.0) {
    g_set_error(error, PROFILE_ERROR, PROFILE_ERROR_INVALID,
                "a link bandwidth of %g B/s and latency of %g s: the bandwidth must be "
                "positive and the latency not negative", link_bandwidth, link_latency);
    return FALSE;
  }
  /* t = c0 * steps + c1 * steps * chunk / B, with c0 = latency + a and c1 = 1 / efficiency,
   * weighted by 1 / t so that the relative errors are minimized. */
  double s00 = 0, s01 = 0, s11 = 0, b0 = 0, b1 = 0;
  int n_points = 0;
  for (int i = 0; i < profile_db_n_collectives(db); i++) {
    const ProfileCollEntry *e = profile_db_collective(db, i);
    if (e->kind != kind || strcmp(e->gpu, gpu) || e->n_gpus < 2 || !(e->median > 0.0))
      continue;
    double steps, chunk;
    ring_shape(kind, e->n_gpus, e->bytes, &steps, &chunk);
    double u = steps / e->median, v = steps * chunk / link_bandwidth / e->median;
    s00 += u * u;
    s01 += u * v;
    s11 += v * v;
    b0 += u;
    b1 += v;
    n_points++;
  }
  double det = s00 * s11 - s01 * s01;
  if (n_points < 2 || !(fabs(det) > 1e-300)) {
    g_set_error(error, PROFILE_ERROR, PROFILE_ERROR_INVALID,
                "the profile has %d usable %s entries of 2 or more GPUs for '%s'; the fit "
                "needs at least two of different sizes",
                n_points, profile_coll_kind_name(kind), gpu);
    return FALSE;
  }
  double c0 = (b0 * s11 - b1 * s01) / det;
  double c1 = (s00 * b1 - s01 * b0) / det;
  if (c0 < link_latency) {
    /* A step cheaper than the links' own latency is not physical: fix the step cost at
     * the link latency and fit the bandwidth alone. */
    c0 = link_latency;
    double num = 0, den = 0;
    for (int i = 0; i < profile_db_n_collectives(db); i++) {
      const ProfileCollEntry *e = profile_db_collective(db, i);
      if (e->kind != kind || strcmp(e->gpu, gpu) || e->n_gpus < 2 || !(e->median > 0.0))
        continue;
      double steps, chunk;
      ring_shape(kind, e->n_gpus, e->bytes, &steps, &chunk);
      double u = steps / e->median, v = steps * chunk / link_bandwidth / e->median;
      num += v * (1.0 - c0 * u);
      den += v * v;
    }
    c1 = num / den;
  }
  if (!(c1 > 0.0)) {
    g_set_error(error, PROFILE_ERROR, PROFILE_ERROR_INVALID,
                "the %s entries of '%s' do not grow with the message size; no bandwidth "
                "can be fitted", profile_coll_kind_name(kind), gpu);
    return FALSE;
  }
  out->bandwidth_efficiency = 1.0 / c1;
  /* The simulator reads a step latency of 0 as "use the default", so the smallest
   * answer is one nanosecond. */
  out->step_latency = MAX(c0 - link_latency, 1e-9);
  out->n_points = n_points;
  double sa = 0, worst = 0;
  for (int i = 0; i < profile_db_n_collectives(db); i++) {
    const ProfileCollEntry *e = profile_db_collective(db, i);
    if (e->kind != kind || strcmp(e->gpu, gpu) || e->n_gpus < 2 || !(e->median > 0.0))
      continue;
    double steps, chunk;
    ring_shape(kind, e->n_gpus, e->bytes, &steps, &chunk);
    double t = steps * (link_latency + out->step_latency) +
               steps * chunk / (link_bandwidth * out->bandwidth_efficiency);
    double rel = fabs(t - e->median) / e->median;
    sa += rel;
    worst = MAX(worst, rel);
  }
  out->mean_abs_error = sa / n_points;
  out->worst_error = worst;
  return TRUE;
}
