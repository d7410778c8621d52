/* backend.c — the registry of back ends, the wrappers over their slots with the defaults
 * of the optional ones, and the small value types of the interface (views, parts). */
#include "exec-private.h"

#include <string.h>

G_DEFINE_QUARK(exec-error-quark, exec_error)

/* ---- registry --------------------------------------------------------------------------- */

typedef struct {
  char *name;
  char *description;
  ExecBackendNew constructor;
} Entry;

static GMutex registry_lock;
static GArray *registry; /* Entry */
static gboolean builtins_done;

static Entry *lookup(const char *name)
{
  for (guint i = 0; registry && i < registry->len; i++) {
    Entry *e = &g_array_index(registry, Entry, i);
    if (!strcmp(e->name, name))
      return e;
  }
  return NULL;
}

static void register_locked(const char *name, const char *description, ExecBackendNew fn)
{
  if (!registry)
    registry = g_array_new(FALSE, TRUE, sizeof(Entry));
  Entry *e = lookup(name);
  if (e) {
    g_free(e->description);
    e->description = g_strdup(description);
    e->constructor = fn;
    return;
  }
  Entry n = { g_strdup(name), g_strdup(description), fn };
  g_array_append_val(registry, n);
}

void exec_register_backend(const char *name, const char *description, ExecBackendNew constructor)
{
  g_return_if_fail(name != NULL && constructor != NULL);
  g_mutex_lock(&registry_lock);
  register_locked(name, description ? description : "", constructor);
  g_mutex_unlock(&registry_lock);
}

void exec_register_builtins(void)
{
  g_mutex_lock(&registry_lock);
  if (!builtins_done) {
    builtins_done = TRUE;
    register_locked("cpu", "reference: fp32 on the host, one thread per simulated device",
                    exec_cpu_backend_new);
#ifdef EXEC_HAVE_CUDA
    register_locked("cuda", "CUDA GPUs: cuBLAS, cuDNN and NCCL", exec_cuda_backend_new);
#endif
  }
  g_mutex_unlock(&registry_lock);
}

char **exec_backend_names(void)
{
  exec_register_builtins();
  g_mutex_lock(&registry_lock);
  GStrvBuilder *b = g_strv_builder_new();
  for (guint i = 0; i < registry->len; i++)
    g_strv_builder_add(b, g_array_index(registry, Entry, i).name);
  g_mutex_unlock(&registry_lock);
  char **names = g_strv_builder_end(b);
  g_strv_builder_unref(b);
  return names;
}

const char *exec_backend_description(const char *name)
{
  exec_register_builtins();
  g_mutex_lock(&registry_lock);
  Entry *e = lookup(name);
  const char *d = e ? e->description : NULL;
  g_mutex_unlock(&registry_lock);
  return d;
}

ExecBackend *exec_backend_new(const char *name, GError **error)
{
  g_return_val_if_fail(name != NULL, NULL);
  exec_register_builtins();
  g_mutex_lock(&registry_lock);
  Entry *e = lookup(name);
  ExecBackendNew fn = e ? e->constructor : NULL;
  g_mutex_unlock(&registry_lock);
  if (!fn) {
    g_auto(GStrv) names = exec_backend_names();
    g_autofree char *list = g_strjoinv(", ", names);
    g_set_error(error, EXEC_ERROR, EXEC_ERROR_UNKNOWN,
                "no back end '%s' in this build (available: %s)", name, list);
    return NULL;
  }
  ExecBackend *b = fn(error);
  if (b && b->klass->api_version != EXEC_BACKEND_API_VERSION) {
    g_set_error(error, EXEC_ERROR, EXEC_ERROR_BACKEND,
                "back end '%s' implements interface version %d, not %d", name,
                b->klass->api_version, EXEC_BACKEND_API_VERSION);
    exec_backend_free(b);
    return NULL;
  }
  return b;
}

void exec_backend_free(ExecBackend *b)
{
  if (!b)
    return;
  if (b->klass->finalize)
    b->klass->finalize(b);
  g_free(b);
}

const char *exec_backend_get_name(const ExecBackend *b)
{
  return b->klass->name;
}

/* ---- wrappers ------------------------------------------------------------------------------ */

gboolean exec_backend_open(ExecBackend *b, int n_devices, GError **error)
{
  return b->klass->open(b, n_devices, error);
}

int exec_backend_local_devices(ExecBackend *b, int n_devices, int *devices)
{
  if (b->klass->local_devices)
    return b->klass->local_devices(b, devices);
  for (int d = 0; d < n_devices; d++)
    devices[d] = d;
  return n_devices;
}

ExecBuffer *exec_backend_buffer_alloc(ExecBackend *b, int dev, size_t bytes, GError **error)
{
  return b->klass->buffer_alloc(b, dev, bytes, error);
}

void exec_backend_buffer_free(ExecBackend *b, int dev, ExecBuffer *buffer)
{
  if (buffer)
    b->klass->buffer_free(b, dev, buffer);
}

gboolean exec_backend_buffer_write(ExecBackend *b, int dev, ExecBuffer *buffer, size_t offset,
                                   const void *data, size_t bytes, GError **error)
{
  return b->klass->buffer_write(b, dev, buffer, offset, data, bytes, error);
}

gboolean exec_backend_buffer_read(ExecBackend *b, int dev, ExecBuffer *buffer, size_t offset,
                                  void *data, size_t bytes, GError **error)
{
  return b->klass->buffer_read(b, dev, buffer, offset, data, bytes, error);
}

gboolean exec_backend_fill(ExecBackend *b, int dev, const ExecView *v, const SimRegion *region,
                           float value, GError **error)
{
  return b->klass->fill(b, dev, v, region, value, error);
}

gboolean exec_backend_copy(ExecBackend *b, int dev, const ExecView *dst, const ExecView *src,
                           const SimRegion *region, gboolean accumulate, GError **error)
{
  return b->klass->copy(b, dev, dst, src, region, accumulate, error);
}

gboolean exec_backend_kernel(ExecBackend *b, int dev, const ExecKernelArgs *args, GError **error)
{
  return b->klass->kernel(b, dev, args, error);
}

gboolean exec_backend_update(ExecBackend *b, int dev, const ExecUpdateArgs *args, GError **error)
{
  return b->klass->update(b, dev, args, error);
}

gboolean exec_backend_send(ExecBackend *b, int dev, int peer, int64_t tag, const ExecView *v,
                           const SimRegion *region, GError **error)
{
  return b->klass->send(b, dev, peer, tag, v, region, error);
}

gboolean exec_backend_recv(ExecBackend *b, int dev, int peer, int64_t tag, const ExecView *v,
                           const SimRegion *region, gboolean accumulate, GError **error)
{
  return b->klass->recv(b, dev, peer, tag, v, region, accumulate, error);
}

gboolean exec_backend_all_reduce(ExecBackend *b, int dev, const ExecGroup *group,
                                 const ExecView *v, const SimRegion *region, ExecReduceOp op,
                                 GError **error)
{
  return b->klass->all_reduce(b, dev, group, v, region, op, error);
}

gboolean exec_backend_reduce_scatter(ExecBackend *b, int dev, const ExecGroup *group,
                                     const ExecView *v, const SimRegion *region, GError **error)
{
  return b->klass->reduce_scatter(b, dev, group, v, region, error);
}

gboolean exec_backend_all_gather(ExecBackend *b, int dev, const ExecGroup *group,
                                 const ExecView *v, const SimRegion *region, GError **error)
{
  return b->klass->all_gather(b, dev, group, v, region, error);
}

void exec_backend_timestamp(ExecBackend *b, int dev, double *when)
{
  if (b->klass->timestamp)
    b->klass->timestamp(b, dev, when);
  else
    *when = (double)g_get_monotonic_time() * 1e-6;
}

gboolean exec_backend_synchronize(ExecBackend *b, int dev, GError **error)
{
  return b->klass->synchronize ? b->klass->synchronize(b, dev, error) : TRUE;
}

void exec_backend_barrier(ExecBackend *b, int dev)
{
  if (b->klass->barrier)
    b->klass->barrier(b, dev);
}

void exec_backend_abort(ExecBackend *b)
{
  if (b->klass->abort)
    b->klass->abort(b);
}

void exec_backend_saved_free(ExecBackend *b, int dev, gpointer saved)
{
  if (saved && b->klass->saved_free)
    b->klass->saved_free(b, dev, saved);
}

/* ---- views, regions and parts ----------------------------------------------------------------- */

ExecView exec_view_dense(ExecBuffer *buffer, SimDType dtype, const SimRegion *box)
{
  ExecView v = { .buffer = buffer, .dtype = dtype, .box = *box };
  int64_t s = 1;
  for (int d = box->ndim - 1; d >= 0; d--) {
    v.stride[d] = s;
    s *= box->hi[d] - box->lo[d];
  }
  return v;
}

int64_t exec_view_numel(const ExecView *v)
{
  return sim_region_volume(&v->box);
}

int64_t exec_view_offset(const ExecView *v, const int64_t *idx)
{
  int64_t o = v->offset;
  for (int d = 0; d < v->box.ndim; d++)
    o += (idx[d] - v->box.lo[d]) * v->stride[d];
  return o;
}

void exec_part_range(int64_t n_elements, int n, int k, int64_t *lo, int64_t *hi)
{
  *lo = n_elements * k / n;
  *hi = n_elements * (k + 1) / n;
}

gboolean exec_region_is_empty(const SimRegion *r)
{
  for (int d = 0; d < r->ndim; d++)
    if (r->hi[d] <= r->lo[d])
      return TRUE;
  return FALSE;
}

void exec_region_hull(SimRegion *acc, const SimRegion *r)
{
  if (acc->ndim == 0 && r->ndim > 0) {
    *acc = *r;
    return;
  }
  for (int d = 0; d < r->ndim; d++) {
    acc->lo[d] = MIN(acc->lo[d], r->lo[d]);
    acc->hi[d] = MAX(acc->hi[d], r->hi[d]);
  }
}

gboolean exec_region_next(const SimRegion *r, int64_t *idx)
{
  for (int d = r->ndim - 1; d >= 0; d--) {
    if (++idx[d] < r->hi[d])
      return TRUE;
    idx[d] = r->lo[d];
  }
  return FALSE;
}

/* ---- deterministic numbers ------------------------------------------------------------------- */

/* SplitMix64's finalizer: every input bit affects every output bit. */
static inline uint64_t mix64(uint64_t z)
{
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static uint64_t name_hash(const char *name)
{
  uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a */
  for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
    h ^= *p;
    h *= 0x100000001b3ULL;
  }
  return h;
}

double exec_hash_uniform(const char *name, uint64_t index, uint64_t salt)
{
  uint64_t h = mix64(name_hash(name) ^ mix64(index + 0x9e3779b97f4a7c15ULL * (salt + 1)));
  return (double)(h >> 11) * (1.0 / 9007199254740992.0);
}

gboolean exec_dropout_keep(const char *op_name, uint64_t index, int step, double p)
{
  if (p <= 0)
    return TRUE;
  return exec_hash_uniform(op_name, index, 0x5eed0000ULL + (uint64_t)step) >= p;
}
