/* cpu-bench.c — the CPU runner: times the kernels of an operator shard's work with
 * plain reference code, one thread, in fp32.
 *
 * It runs what the cost model prices rather than the operator's own arithmetic: each
 * GEMM or convolution of the work as a blocked matrix product of its m x n x k, each
 * recurrent kernel as its steps of products, each bandwidth-bound kernel as a pass that
 * reads and writes its bytes and does its FLOPs.  That makes a "cpu" database comparable
 * kernel for kernel with the roofline model of a CPU spec, which is how the test suite
 * checks the path from measurement to database to cost model to simulation on machines
 * without a GPU.  The GPU runner (profile/cuda) runs the operators themselves. */
#include "profile-private.h"

#include <string.h>
#include <time.h>

typedef struct {
  char *device;
  SimWork work[SIM_PASS_COUNT];
  float *a, *b, *c;           /* GEMM operands, sized for the largest kernel            */
  gsize n_a, n_b, n_c;
  float *src, *dst;           /* streaming buffers                                     */
  gsize n_stream;
} Cpu;

static double now(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const char *cpu_device_name(ProfileRunner *self)
{
  return ((Cpu *)self->priv)->device;
}

static void cpu_release(ProfileRunner *self)
{
  Cpu *c = self->priv;
  g_clear_pointer(&c->a, g_free);
  g_clear_pointer(&c->b, g_free);
  g_clear_pointer(&c->c, g_free);
  g_clear_pointer(&c->src, g_free);
  g_clear_pointer(&c->dst, g_free);
  c->n_a = c->n_b = c->n_c = c->n_stream = 0;
}

/* Elements a streaming kernel touches: its bytes as fp32 values read once and written
 * once. */
static gsize stream_elements(const SimKernel *k)
{
  return (gsize)MAX(k->bytes / 8.0, 1.0);
}

/* Non-zero, varied, bounded values: zeros would hide wrong indexing and can run faster
 * than real data. */
static float *filled(gsize n)
{
  float *v = g_try_new(float, n);
  if (!v)
    return NULL;
  for (gsize i = 0; i < n; i++)
    v[i] = 1e-3f * (float)((int)(i * 7 % 13) - 6);
  return v;
}

static gboolean no_memory(GError **error, const char *what, gsize n)
{
  g_set_error(error, PROFILE_ERROR, PROFILE_ERROR_NO_MEMORY,
              "no memory for %s of %" G_GSIZE_FORMAT " floats", what, n);
  return FALSE;
}

static gboolean cpu_prepare(ProfileRunner *self, const SimGraph *g, int op,
                            const int64_t *extent, GError **error)
{
  Cpu *c = self->priv;
  cpu_release(self);
  gsize na = 1, nb = 1, nc = 1, ns = 1;
  for (int p = 0; p < SIM_PASS_COUNT; p++) {
    sim_graph_op_work(g, op, extent, (SimPass)p, &c->work[p]);
    for (int i = 0; i < c->work[p].n; i++) {
      const SimKernel *k = &c->work[p].k[i];
      switch (k->kind) {
      case SIM_KERNEL_GEMM:
      case SIM_KERNEL_CONV:
      case SIM_KERNEL_RECURRENT:
        na = MAX(na, (gsize)(k->m * k->k));
        nb = MAX(nb, (gsize)(k->k * k->n));
        nc = MAX(nc, (gsize)(k->m * k->n));
        break;
      default:
        ns = MAX(ns, stream_elements(k));
        break;
      }
    }
  }
  if (!(c->a = filled(na)))
    return no_memory(error, "a GEMM operand", na);
  if (!(c->b = filled(nb)))
    return no_memory(error, "a GEMM operand", nb);
  if (!(c->c = filled(nc)))
    return no_memory(error, "a GEMM result", nc);
  if (!(c->src = filled(ns)) || !(c->dst = filled(ns)))
    return no_memory(error, "a streaming buffer", ns);
  c->n_a = na;
  c->n_b = nb;
  c->n_c = nc;
  c->n_stream = ns;
  return TRUE;
}

/* C = A B for row-major A (m x k), B (k x n), C (m x n), in blocks that stay in cache. */
static void gemm(const float *A, const float *B, float *C, int64_t m, int64_t n, int64_t k)
{
  enum { BM = 64, BN = 256, BK = 128 };
  memset(C, 0, sizeof(float) * (size_t)(m * n));
  for (int64_t i0 = 0; i0 < m; i0 += BM)
    for (int64_t p0 = 0; p0 < k; p0 += BK)
      for (int64_t j0 = 0; j0 < n; j0 += BN) {
        int64_t i1 = MIN(i0 + BM, m), p1 = MIN(p0 + BK, k), j1 = MIN(j0 + BN, n);
        for (int64_t i = i0; i < i1; i++)
          for (int64_t p = p0; p < p1; p++) {
            float a = A[i * k + p];
            const float *b = B + p * n;
            float *cr = C + i * n;
            for (int64_t j = j0; j < j1; j++)
              cr[j] += a * b[j];
          }
      }
}

/* Reads @n values, does about @ops operations on each, writes them. */
static void stream(const float *src, float *dst, gsize n, int ops)
{
  for (gsize i = 0; i < n; i++) {
    float v = src[i];
    for (int r = 0; r < ops; r++)
      v = v * 0.999f + 1e-3f;
    dst[i] = v;
  }
}

/* Copies @rows rows of @width values from pseudo-random rows of a table in @src (as many
 * rows as fit in @n values) to consecutive rows of @dst. */
static void gather(const float *src, float *dst, gsize n, int64_t rows, int64_t width)
{
  gsize w = MIN((gsize)MAX(width, 1), n);
  gsize table_rows = n / w;
  for (int64_t r = 0; r < rows; r++) {
    gsize from = ((gsize)r * 2654435761u) % table_rows;
    gsize to = (gsize)r % table_rows;
    memcpy(dst + to * w, src + from * w, w * sizeof(float));
  }
}

static void run_kernel(Cpu *c, const SimKernel *k)
{
  switch (k->kind) {
  case SIM_KERNEL_GEMM:
  case SIM_KERNEL_CONV:
    for (int64_t b = 0; b < MAX(k->batch, 1); b++)
      gemm(c->a, c->b, c->c, k->m, k->n, k->k);
    return;
  case SIM_KERNEL_RECURRENT: {
    /* The steps of one recurrent kernel are sequential GEMMs of one step's share. */
    int64_t steps = MAX(k->steps, 1);
    for (int64_t s = 0; s < steps; s++)
      gemm(c->a, c->b, c->c, k->m, k->n, k->k);
    return;
  }
  case SIM_KERNEL_GATHER: {
    gsize n = MIN(stream_elements(k), c->n_stream);
    gather(c->src, c->dst, n, MAX(k->m, 1), MAX(k->n, 1));
    return;
  }
  case SIM_KERNEL_MEMORY:
  case SIM_KERNEL_OPTIMIZER:
  case SIM_KERNEL_KIND_COUNT:
  default: {
    gsize n = MIN(stream_elements(k), c->n_stream);
    int ops = (int)MIN(k->flops / (double)n + 0.5, 1000.0);
    stream(c->src, c->dst, n, ops);
    return;
  }
  }
}

static gboolean cpu_run(ProfileRunner *self, SimPass pass, int n, double *seconds,
                        GError **error)
{
  Cpu *c = self->priv;
  g_return_val_if_fail(pass >= 0 && pass < SIM_PASS_COUNT, FALSE);
  if (!c->a) {
    g_set_error(error, PROFILE_ERROR, PROFILE_ERROR_INVALID, "no shard prepared");
    return FALSE;
  }
  const SimWork *w = &c->work[pass];
  for (int r = 0; r < n; r++) {
    double t0 = now();
    for (int i = 0; i < w->n; i++)
      run_kernel(c, &w->k[i]);
    seconds[r] = now() - t0;
  }
  return TRUE;
}

static void cpu_finalize(ProfileRunner *self)
{
  Cpu *c = self->priv;
  cpu_release(self);
  g_free(c->device);
  g_free(c);
  self->priv = NULL;
}

static const char *const *cpu_notes(ProfileRunner *self)
{
  static const char *const notes[] = {
    "runner", "cpu: the kernels of the shard's work in fp32 reference code, one thread", NULL,
  };
  return notes;
}

static const ProfileRunnerClass cpu_class = {
  .api_version = PROFILE_RUNNER_API_VERSION,
  .name = "cpu",
  .device_name = cpu_device_name,
  .prepare = cpu_prepare,
  .run = cpu_run,
  .release = cpu_release,
  .finalize = cpu_finalize,
  .device_notes = cpu_notes,
};

ProfileRunner *profile_runner_cpu_new(const char *device_name)
{
  Cpu *c = g_new0(Cpu, 1);
  c->device = g_strdup(device_name ? device_name : "cpu");
  ProfileRunner *r = g_new0(ProfileRunner, 1);
  r->klass = &cpu_class;
  r->priv = c;
  return r;
}
