/* cpu-backend.c — the CPU reference back end: device memory is host memory, every
 * simulated device is one thread of the driver, and communication is copying between
 * buffers.
 *
 * A send packs its region into a message that waits in a mailbox under its tag until the
 * receiver unpacks it; a collective is a meeting point under its tag where the last
 * member to arrive reduces every member's data, in the group's order so that every
 * member gets bit-identical results, and wakes the others.  One lock guards both; the
 * work done under it is small next to the kernels. */
#include "cpu-private.h"

#include <string.h>
#include <unistd.h>

typedef struct {
  int n, arrived, left;
  const ExecView **views;
  const SimRegion **regions;
  gboolean done;
} Meeting;

typedef struct {
  int n_devices;
  GMutex lock;
  GCond cond;
  GHashTable *mail;       /* tag -> float* message (packed region)                      */
  GHashTable *meetings;   /* tag -> Meeting*                                            */
  gboolean aborted;
  size_t allocated;       /* bytes of every device's buffers                            */
} Cpu;

/* The host's physical memory in bytes (0: unknown). */
static size_t host_memory(void)
{
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? (size_t)pages * (size_t)page : 0;
}

static Cpu *cpu(ExecBackend *b)
{
  return b->priv;
}

static int64_t *tag_key(int64_t tag)
{
  int64_t *k = g_new(int64_t, 1);
  *k = tag;
  return k;
}

/* ---- element access over regions -------------------------------------------------------- */

static size_t elem_size(const ExecView *v)
{
  return v->dtype == SIM_DTYPE_INT64 ? 8 : 4;
}

/* Calls @fn for each row of @r (all dimensions but the last fixed), with the offsets of
 * the row's first element in @a and @b (relative to their bases) and the row length. */
typedef void (*RowFunc)(int64_t oa, int64_t ob, int64_t len, int64_t sa, int64_t sb, void *user);

static void for_rows(const ExecView *a, const ExecView *b, const SimRegion *r, RowFunc fn,
                     void *user)
{
  if (exec_region_is_empty(r) || r->ndim == 0) {
    if (r->ndim == 0)
      fn(0, 0, 1, 1, 1, user);
    return;
  }
  int last = r->ndim - 1;
  SimRegion rows = *r;
  rows.hi[last] = rows.lo[last] + 1;
  int64_t idx[SIM_MAX_DIMS];
  for (int d = 0; d < r->ndim; d++)
    idx[d] = r->lo[d];
  int64_t len = r->hi[last] - r->lo[last];
  do {
    fn(cpu_off(a, idx), b ? cpu_off(b, idx) : 0, len, a->stride[last], b ? b->stride[last] : 0,
       user);
  } while (exec_region_next(&rows, idx));
}

typedef struct {
  float *a;
  const float *b;
  float value;
  gboolean accumulate;
} RowArgs;

static void row_fill(int64_t oa, int64_t ob, int64_t len, int64_t sa, int64_t sb, void *user)
{
  RowArgs *x = user;
  for (int64_t k = 0; k < len; k++)
    x->a[oa + k * sa] = x->value;
}

static void row_copy(int64_t oa, int64_t ob, int64_t len, int64_t sa, int64_t sb, void *user)
{
  RowArgs *x = user;
  if (x->accumulate)
    for (int64_t k = 0; k < len; k++)
      x->a[oa + k * sa] += x->b[ob + k * sb];
  else
    for (int64_t k = 0; k < len; k++)
      x->a[oa + k * sa] = x->b[ob + k * sb];
}

/* Packs @r of @v into @out (row-major), elements of @v's size. */
typedef struct {
  const char *base;
  char *out;
  size_t es;
  int64_t k;
} PackArgs;

static void row_pack(int64_t oa, int64_t ob, int64_t len, int64_t sa, int64_t sb, void *user)
{
  PackArgs *x = user;
  for (int64_t k = 0; k < len; k++)
    memcpy(x->out + (size_t)(x->k++) * x->es, x->base + (size_t)(oa + k * sa) * x->es, x->es);
}

static void *pack(const ExecView *v, const SimRegion *r)
{
  size_t es = elem_size(v);
  int64_t n = sim_region_volume(r);
  PackArgs x = { (const char *)v->buffer->data + (size_t)v->offset * es, g_malloc(MAX((size_t)n * es, 8)),
                 es, 0 };
  for_rows(v, NULL, r, row_pack, &x);
  return x.out;
}

typedef struct {
  char *base;
  const char *in;
  size_t es;
  int64_t k, lo, hi;
  gboolean accumulate;
} UnpackArgs;

static void row_unpack(int64_t oa, int64_t ob, int64_t len, int64_t sa, int64_t sb, void *user)
{
  UnpackArgs *x = user;
  for (int64_t k = 0; k < len; k++, x->k++) {
    if (x->k < x->lo || x->k >= x->hi)
      continue;
    char *dst = x->base + (size_t)(oa + k * sa) * x->es;
    const char *src = x->in + (size_t)x->k * x->es;
    if (x->accumulate)
      *(float *)dst += *(const float *)src;
    else
      memcpy(dst, src, x->es);
  }
}

/* Unpacks elements [lo, hi) of the packed @in into @r of @v. */
static void unpack(const ExecView *v, const SimRegion *r, const void *in, gboolean accumulate,
                   int64_t lo, int64_t hi)
{
  size_t es = elem_size(v);
  UnpackArgs x = { (char *)v->buffer->data + (size_t)v->offset * es, in, es, 0, lo, hi,
                   accumulate };
  for_rows(v, NULL, r, row_unpack, &x);
}

/* ---- slots ------------------------------------------------------------------------------------ */

/* Opening starts afresh: what a failed run left behind (messages nobody received,
 * meetings some member never reached) is dropped. */
static gboolean cpu_open(ExecBackend *self, int n_devices, GError **error)
{
  Cpu *c = cpu(self);
  g_mutex_lock(&c->lock);
  c->n_devices = n_devices;
  c->aborted = FALSE;
  g_hash_table_remove_all(c->mail);
  g_hash_table_remove_all(c->meetings);
  g_mutex_unlock(&c->lock);
  return TRUE;
}

static ExecBuffer *cpu_buffer_alloc(ExecBackend *self, int dev, size_t bytes, GError **error)
{
  /* Every simulated device lives in the host's memory: a plan that needs more than the
   * host has is refused here, before the system grants pages it cannot back and ends the
   * program when they are written. */
  Cpu *c = cpu(self);
  size_t host = host_memory();
  g_mutex_lock(&c->lock);
  gboolean room = host == 0 || (bytes <= host && c->allocated <= host - bytes);
  if (room)
    c->allocated += bytes;
  size_t had = c->allocated;
  g_mutex_unlock(&c->lock);
  if (!room) {
    g_set_error(error, EXEC_ERROR, EXEC_ERROR_BACKEND,
                "device %d: the cpu back end would need more than the host's %.1f GiB of "
                "memory (%.1f GiB held, %.1f GiB more asked); run a smaller model or fewer "
                "devices", dev, (double)host / (1 << 30), (double)had / (1 << 30),
                (double)bytes / (1 << 30));
    return NULL;
  }
  ExecBuffer *b = g_new(ExecBuffer, 1);
  b->bytes = bytes;
  b->data = g_try_malloc0(MAX(bytes, 8));
  if (!b->data) {
    g_free(b);
    g_mutex_lock(&c->lock);
    c->allocated -= bytes;
    g_mutex_unlock(&c->lock);
    g_set_error(error, EXEC_ERROR, EXEC_ERROR_BACKEND,
                "device %d: cannot allocate %zu bytes of host memory", dev, bytes);
    return NULL;
  }
  return b;
}

static void cpu_buffer_free(ExecBackend *self, int dev, ExecBuffer *b)
{
  Cpu *c = cpu(self);
  g_mutex_lock(&c->lock);
  c->allocated -= b->bytes;
  g_mutex_unlock(&c->lock);
  g_free(b->data);
  g_free(b);
}

static gboolean cpu_buffer_write(ExecBackend *self, int dev, ExecBuffer *b, size_t offset,
                                 const void *data, size_t bytes, GError **error)
{
  g_return_val_if_fail(offset + bytes <= b->bytes, FALSE);
  memcpy((char *)b->data + offset, data, bytes);
  return TRUE;
}

static gboolean cpu_buffer_read(ExecBackend *self, int dev, ExecBuffer *b, size_t offset,
                                void *data, size_t bytes, GError **error)
{
  g_return_val_if_fail(offset + bytes <= b->bytes, FALSE);
  memcpy(data, (char *)b->data + offset, bytes);
  return TRUE;
}

static gboolean cpu_fill(ExecBackend *self, int dev, const ExecView *v, const SimRegion *r,
                         float value, GError **error)
{
  RowArgs x = { .a = cpu_f32(v), .value = value };
  for_rows(v, NULL, r, row_fill, &x);
  return TRUE;
}

static gboolean cpu_copy(ExecBackend *self, int dev, const ExecView *dst, const ExecView *src,
                         const SimRegion *r, gboolean accumulate, GError **error)
{
  RowArgs x = { .a = cpu_f32(dst), .b = cpu_f32(src), .accumulate = accumulate };
  for_rows(dst, src, r, row_copy, &x);
  return TRUE;
}

static gboolean cpu_kernel_slot(ExecBackend *self, int dev, const ExecKernelArgs *a,
                                GError **error)
{
  return cpu_kernel(a, error);
}

static gboolean cpu_update_slot(ExecBackend *self, int dev, const ExecUpdateArgs *a,
                                GError **error)
{
  return cpu_update(a, error);
}

static gboolean aborted_error(GError **error)
{
  g_set_error_literal(error, EXEC_ERROR, EXEC_ERROR_BACKEND,
                      "communication cancelled: another device failed");
  return FALSE;
}

static gboolean cpu_send(ExecBackend *self, int dev, int peer, int64_t tag, const ExecView *v,
                         const SimRegion *r, GError **error)
{
  Cpu *c = cpu(self);
  void *msg = pack(v, r);
  g_mutex_lock(&c->lock);
  g_hash_table_insert(c->mail, tag_key(tag), msg);
  g_cond_broadcast(&c->cond);
  g_mutex_unlock(&c->lock);
  return TRUE;
}

static gboolean cpu_recv(ExecBackend *self, int dev, int peer, int64_t tag, const ExecView *v,
                         const SimRegion *r, gboolean accumulate, GError **error)
{
  Cpu *c = cpu(self);
  g_mutex_lock(&c->lock);
  void *msg;
  while (!(msg = g_hash_table_lookup(c->mail, &tag)) && !c->aborted)
    g_cond_wait(&c->cond, &c->lock);
  if (!msg) {
    g_mutex_unlock(&c->lock);
    return aborted_error(error);
  }
  gpointer key;
  g_hash_table_steal_extended(c->mail, &tag, &key, NULL);
  g_mutex_unlock(&c->lock);
  g_free(key);
  unpack(v, r, msg, accumulate, 0, G_MAXINT64);
  g_free(msg);
  return TRUE;
}

typedef enum { COLL_ALL_REDUCE, COLL_REDUCE_SCATTER, COLL_ALL_GATHER } CollKind;

/* The last member of a meeting does the work for all: packs every member's region,
 * combines them, and unpacks the result into each. */
static void collective_work(Meeting *m, CollKind kind, ExecReduceOp op)
{
  int64_t n = sim_region_volume(m->regions[0]);
  float **in = g_new(float *, m->n);
  for (int k = 0; k < m->n; k++)
    in[k] = pack(m->views[k], m->regions[k]);
  float *res = g_new(float, MAX(n, 1));
  if (kind == COLL_ALL_GATHER) {
    for (int k = 0; k < m->n; k++) {
      int64_t lo, hi;
      exec_part_range(n, m->n, k, &lo, &hi);
      memcpy(res + lo, in[k] + lo, sizeof(float) * (size_t)(hi - lo));
    }
  } else {
    memcpy(res, in[0], sizeof(float) * (size_t)n);
    for (int k = 1; k < m->n; k++)
      for (int64_t e = 0; e < n; e++)
        res[e] = op == EXEC_REDUCE_MAX ? MAX(res[e], in[k][e]) : res[e] + in[k][e];
  }
  for (int k = 0; k < m->n; k++) {
    int64_t lo = 0, hi = n;
    if (kind == COLL_REDUCE_SCATTER)
      exec_part_range(n, m->n, k, &lo, &hi);
    unpack(m->views[k], m->regions[k], res, FALSE, lo, hi);
    g_free(in[k]);
  }
  g_free(in);
  g_free(res);
}

static gboolean collective(ExecBackend *self, const ExecGroup *g, const ExecView *v,
                           const SimRegion *r, CollKind kind, ExecReduceOp op, GError **error)
{
  Cpu *c = cpu(self);
  if (g->n <= 1)
    return TRUE;
  g_mutex_lock(&c->lock);
  Meeting *m = g_hash_table_lookup(c->meetings, &g->tag);
  if (!m) {
    m = g_new0(Meeting, 1);
    m->n = m->left = g->n;
    m->views = g_new0(const ExecView *, g->n);
    m->regions = g_new0(const SimRegion *, g->n);
    g_hash_table_insert(c->meetings, tag_key(g->tag), m);
  }
  m->views[g->rank] = v;
  m->regions[g->rank] = r;
  if (++m->arrived == m->n) {
    /* The members wait under the lock; their views stay valid until they leave. */
    collective_work(m, kind, op);
    m->done = TRUE;
    g_cond_broadcast(&c->cond);
  } else {
    while (!m->done && !c->aborted)
      g_cond_wait(&c->cond, &c->lock);
  }
  gboolean ok = m->done;
  if (--m->left == 0)
    g_hash_table_remove(c->meetings, &g->tag);
  g_mutex_unlock(&c->lock);
  return ok ? TRUE : aborted_error(error);
}

static gboolean cpu_all_reduce(ExecBackend *self, int dev, const ExecGroup *g, const ExecView *v,
                               const SimRegion *r, ExecReduceOp op, GError **error)
{
  return collective(self, g, v, r, COLL_ALL_REDUCE, op, error);
}

static gboolean cpu_reduce_scatter(ExecBackend *self, int dev, const ExecGroup *g,
                                   const ExecView *v, const SimRegion *r, GError **error)
{
  return collective(self, g, v, r, COLL_REDUCE_SCATTER, EXEC_REDUCE_SUM, error);
}

static gboolean cpu_all_gather(ExecBackend *self, int dev, const ExecGroup *g, const ExecView *v,
                               const SimRegion *r, GError **error)
{
  return collective(self, g, v, r, COLL_ALL_GATHER, EXEC_REDUCE_SUM, error);
}

static void cpu_saved_free(ExecBackend *self, int dev, gpointer saved)
{
  (void)self;
  (void)dev;
  CpuSaved *s = saved;
  s->free(s);
}

static void cpu_abort(ExecBackend *self)
{
  Cpu *c = cpu(self);
  g_mutex_lock(&c->lock);
  c->aborted = TRUE;
  g_cond_broadcast(&c->cond);
  g_mutex_unlock(&c->lock);
}

static void meeting_free(gpointer p)
{
  Meeting *m = p;
  g_free(m->views);
  g_free(m->regions);
  g_free(m);
}

static void cpu_finalize(ExecBackend *self)
{
  Cpu *c = cpu(self);
  g_hash_table_destroy(c->mail);
  g_hash_table_destroy(c->meetings);
  g_mutex_clear(&c->lock);
  g_cond_clear(&c->cond);
  g_free(c);
}

static const ExecBackendClass cpu_class = {
  .api_version = EXEC_BACKEND_API_VERSION,
  .name = "cpu",
  .description = "reference: fp32 on the host, one thread per simulated device",
  .open = cpu_open,
  .buffer_alloc = cpu_buffer_alloc,
  .buffer_free = cpu_buffer_free,
  .buffer_write = cpu_buffer_write,
  .buffer_read = cpu_buffer_read,
  .fill = cpu_fill,
  .copy = cpu_copy,
  .kernel = cpu_kernel_slot,
  .update = cpu_update_slot,
  .send = cpu_send,
  .recv = cpu_recv,
  .all_reduce = cpu_all_reduce,
  .reduce_scatter = cpu_reduce_scatter,
  .all_gather = cpu_all_gather,
  .abort = cpu_abort,
  .saved_free = cpu_saved_free,
  .finalize = cpu_finalize,
};

ExecBackend *exec_cpu_backend_new(GError **error)
{
  ExecBackend *b = g_new0(ExecBackend, 1);
  Cpu *c = g_new0(Cpu, 1);
  g_mutex_init(&c->lock);
  g_cond_init(&c->cond);
  c->mail = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, g_free);
  c->meetings = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, meeting_free);
  b->klass = &cpu_class;
  b->priv = c;
  return b;
}
