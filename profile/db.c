/* db.c — the profile database: measured operator shards and collectives, their JSON
 * files, and lookups that answer exactly or by interpolation.
 *
 * Operator entries are keyed by (device, shard key, pass).  The shard key
 * (sim_graph_op_shard_key()) names the operator type, the shapes of the shard's tensors,
 * its dtype and the attributes that do not give sizes, so equal shards of different
 * operators, models and strategies share one entry.  Interpolation splits a key into
 * its family (type, dtype, attributes and the names and ranks of its tensors) and the
 * vector of its tensors' dimensions; parasol-profile.h says which pairs of entries of a
 * family may bracket a shard.
 *
 * Collective entries are keyed by (device, kind, GPU count, bytes) and written to files
 * as one series of points per (device, kind, GPU count, source), which keeps files of
 * thousands of measured sizes short.  The JSON files are written and read in db-json.c. */
#include "profile-private.h"
#include <math.h>
#include <string.h>

G_DEFINE_QUARK(profile-error-quark, profile_error)

static const char *const coll_names[PROFILE_COLL_COUNT] = {
  [PROFILE_COLL_ALLREDUCE] = "all-reduce",
  [PROFILE_COLL_ALLGATHER] = "all-gather",
  [PROFILE_COLL_REDUCE_SCATTER] = "reduce-scatter",
  [PROFILE_COLL_SENDRECV] = "send-recv",
};

const char *profile_coll_kind_name(ProfileCollKind k)
{
  g_return_val_if_fail(k >= 0 && k < PROFILE_COLL_COUNT, NULL);
  return coll_names[k];
}

int profile_coll_kind_from_name(const char *name)
{
  g_return_val_if_fail(name != NULL, -1);
  static const char *const plain[PROFILE_COLL_COUNT] = {
    "allreduce", "allgather", "reducescatter", "sendrecv",
  };
  for (int k = 0; k < PROFILE_COLL_COUNT; k++)
    if (!g_ascii_strcasecmp(name, coll_names[k]) || !g_ascii_strcasecmp(name, plain[k]))
      return k;
  return -1;
}

int profile_kernel_kind_from_name(const char *name)
{
  for (int k = 0; k < SIM_KERNEL_KIND_COUNT; k++)
    if (!strcmp(name, sim_kernel_kind_name((SimKernelKind)k)))
      return k;
  return -1;
}

int profile_pass_from_name(const char *name)
{
  for (int p = 0; p < SIM_PASS_COUNT; p++)
    if (!strcmp(name, sim_pass_name((SimPass)p)))
      return p;
  return -1;
}

gboolean profile_work_is_compute(const SimWork *w)
{
  for (int i = 0; i < w->n; i++)
    if (w->k[i].kind == SIM_KERNEL_GEMM || w->k[i].kind == SIM_KERNEL_CONV ||
        w->k[i].kind == SIM_KERNEL_RECURRENT)
      return TRUE;
  return FALSE;
}

static int compare_doubles(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

double profile_median(double *v, int n)
{
  g_return_val_if_fail(v != NULL && n > 0, 0.0);
  qsort(v, (size_t)n, sizeof *v, compare_doubles);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

char *profile_op_index_key(const char *gpu, SimPass pass, const char *key)
{
  return g_strdup_printf("%s\x1f%d\x1f%s", gpu, (int)pass, key);
}

static char *coll_index_key(const char *gpu, ProfileCollKind kind, int n, double bytes)
{
  return g_strdup_printf("%s\x1f%d\x1f%d\x1f%.0f", gpu, (int)kind, n, bytes);
}

/* ---------------------------------------------------------------------------------- */
/* Records                                                                             */

static void op_record_free(gpointer p)
{
  OpRecord *r = p;
  g_free(r->gpu);
  g_free(r->key);
  g_free(r->kernels);
  g_free(r);
}

static OpRecord *op_record_new(const ProfileOpEntry *e)
{
  OpRecord *r = g_new0(OpRecord, 1);
  r->e = *e;
  r->gpu = g_strdup(e->gpu);
  r->key = g_strdup(e->key);
  r->e.gpu = r->gpu;
  r->e.key = r->key;
  if (e->n_kernels > 0 && e->kernels) {
    r->kernels = g_memdup2(e->kernels, sizeof(SimKernel) * (gsize)e->n_kernels);
    r->e.kernels = r->kernels;
  } else {
    r->e.n_kernels = 0;
    r->e.kernels = NULL;
  }
  return r;
}

static void coll_record_free(gpointer p)
{
  CollRecord *r = p;
  g_free(r->gpu);
  g_free(r->source);
  g_free(r);
}

static CollRecord *coll_record_new(const ProfileCollEntry *e)
{
  CollRecord *r = g_new0(CollRecord, 1);
  r->e = *e;
  r->gpu = g_strdup(e->gpu);
  r->source = g_strdup(e->source);
  r->e.gpu = r->gpu;
  r->e.source = r->source;
  return r;
}

ProfileDb *profile_db_new(void)
{
  ProfileDb *db = g_new0(ProfileDb, 1);
  db->sources = g_ptr_array_new_with_free_func(g_free);
  db->notes = g_hash_table_new_full(g_str_hash, g_str_equal, g_free,
                                    (GDestroyNotify)g_hash_table_unref);
  db->ops = g_ptr_array_new_with_free_func(op_record_free);
  db->op_index = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
  db->colls = g_ptr_array_new_with_free_func(coll_record_free);
  db->coll_index = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
  db->sorted = TRUE;
  return db;
}

void profile_db_free(ProfileDb *db)
{
  if (!db)
    return;
  profile_db_invalidate(db);
  g_free(db->description);
  g_ptr_array_unref(db->sources);
  g_hash_table_unref(db->notes);
  g_hash_table_unref(db->op_index);
  g_ptr_array_unref(db->ops);
  g_hash_table_unref(db->coll_index);
  g_ptr_array_unref(db->colls);
  g_free(db);
}

void profile_db_set_description(ProfileDb *db, const char *text)
{
  g_return_if_fail(db != NULL);
  g_free(db->description);
  db->description = g_strdup(text);
}

const char *profile_db_get_description(const ProfileDb *db)
{
  g_return_val_if_fail(db != NULL, NULL);
  return db->description;
}

void profile_db_add_source(ProfileDb *db, const char *source)
{
  g_return_if_fail(db != NULL && source != NULL);
  for (guint i = 0; i < db->sources->len; i++)
    if (!strcmp(db->sources->pdata[i], source))
      return;
  g_ptr_array_add(db->sources, g_strdup(source));
}

int profile_db_n_sources(const ProfileDb *db)
{
  g_return_val_if_fail(db != NULL, 0);
  return (int)db->sources->len;
}

const char *profile_db_source(const ProfileDb *db, int i)
{
  g_return_val_if_fail(db != NULL && i >= 0 && i < (int)db->sources->len, NULL);
  return db->sources->pdata[i];
}

void profile_db_set_device_note(ProfileDb *db, const char *gpu, const char *name,
                                const char *value)
{
  g_return_if_fail(db != NULL && gpu != NULL && name != NULL && value != NULL);
  GHashTable *t = g_hash_table_lookup(db->notes, gpu);
  if (!t) {
    t = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
    g_hash_table_insert(db->notes, g_strdup(gpu), t);
  }
  g_hash_table_insert(t, g_strdup(name), g_strdup(value));
}

const char *profile_db_get_device_note(const ProfileDb *db, const char *gpu, const char *name)
{
  g_return_val_if_fail(db != NULL && gpu != NULL && name != NULL, NULL);
  GHashTable *t = g_hash_table_lookup(db->notes, gpu);
  return t ? g_hash_table_lookup(t, name) : NULL;
}

int profile_compare_strings(const void *a, const void *b)
{
  return strcmp(*(char *const *)a, *(char *const *)b);
}

char **profile_db_devices(const ProfileDb *db)
{
  g_return_val_if_fail(db != NULL, NULL);
  g_autoptr(GHashTable) seen = g_hash_table_new(g_str_hash, g_str_equal);
  GHashTableIter it;
  gpointer k;
  g_hash_table_iter_init(&it, db->notes);
  while (g_hash_table_iter_next(&it, &k, NULL))
    g_hash_table_add(seen, k);
  for (guint i = 0; i < db->ops->len; i++)
    g_hash_table_add(seen, ((OpRecord *)db->ops->pdata[i])->gpu);
  for (guint i = 0; i < db->colls->len; i++)
    g_hash_table_add(seen, ((CollRecord *)db->colls->pdata[i])->gpu);
  guint n = 0;
  gpointer *keys = g_hash_table_get_keys_as_array(seen, &n);
  char **out = g_new0(char *, n + 1);
  for (guint i = 0; i < n; i++)
    out[i] = g_strdup(keys[i]);
  g_free(keys);
  qsort(out, n, sizeof *out, profile_compare_strings);
  return out;
}

/* ---------------------------------------------------------------------------------- */
/* Operator entries                                                                    */

void profile_db_add_op(ProfileDb *db, const ProfileOpEntry *e)
{
  g_return_if_fail(db != NULL && e != NULL && e->gpu != NULL && e->key != NULL);
  g_return_if_fail(e->pass >= 0 && e->pass < SIM_PASS_COUNT);
  char *ik = profile_op_index_key(e->gpu, e->pass, e->key);
  OpRecord *old = g_hash_table_lookup(db->op_index, ik);
  OpRecord *r = op_record_new(e);
  if (old) {
    /* Replace in place: the order and the index stay valid. */
    for (guint i = 0; i < db->ops->len; i++)
      if (db->ops->pdata[i] == old) {
        db->ops->pdata[i] = r;
        break;
      }
    op_record_free(old);
  } else {
    g_ptr_array_add(db->ops, r);
    db->sorted = FALSE;
  }
  g_hash_table_replace(db->op_index, ik, r);
  profile_db_invalidate(db);
}

static int compare_ops(const void *a, const void *b)
{
  const OpRecord *x = *(OpRecord *const *)a, *y = *(OpRecord *const *)b;
  int c = strcmp(x->gpu, y->gpu);
  if (!c)
    c = strcmp(x->key, y->key);
  if (!c)
    c = (int)x->e.pass - (int)y->e.pass;
  return c;
}

static int compare_colls(const void *a, const void *b)
{
  const CollRecord *x = *(CollRecord *const *)a, *y = *(CollRecord *const *)b;
  int c = strcmp(x->gpu, y->gpu);
  if (!c)
    c = (int)x->e.kind - (int)y->e.kind;
  if (!c)
    c = x->e.n_gpus - y->e.n_gpus;
  if (!c)
    c = g_strcmp0(x->source, y->source);
  if (!c)
    c = (x->e.bytes > y->e.bytes) - (x->e.bytes < y->e.bytes);
  return c;
}

void profile_db_sort(ProfileDb *db)
{
  if (db->sorted)
    return;
  g_ptr_array_sort(db->ops, compare_ops);
  g_ptr_array_sort(db->colls, compare_colls);
  db->sorted = TRUE;
}

int profile_db_n_ops(const ProfileDb *db)
{
  g_return_val_if_fail(db != NULL, 0);
  return (int)db->ops->len;
}

const ProfileOpEntry *profile_db_op(const ProfileDb *db, int i)
{
  g_return_val_if_fail(db != NULL && i >= 0 && i < (int)db->ops->len, NULL);
  profile_db_sort((ProfileDb *)db);
  return &((OpRecord *)db->ops->pdata[i])->e;
}

const ProfileOpEntry *profile_db_find_op(const ProfileDb *db, const char *gpu, const char *key,
                                         SimPass pass)
{
  g_return_val_if_fail(db != NULL && gpu != NULL && key != NULL, NULL);
  g_autofree char *ik = profile_op_index_key(gpu, pass, key);
  OpRecord *r = g_hash_table_lookup(db->op_index, ik);
  return r ? &r->e : NULL;
}

/* ---------------------------------------------------------------------------------- */
/* Interpolation                                                                       */

/* Positions of a dimension vector that interpolation can compare: one bit each. */
#define MAX_KEY_DIMS 64

typedef struct {
  const OpRecord *r;
  int n;
  int64_t dims[MAX_KEY_DIMS];
} Member;

/* Whether field @f of a key is a tensor shape: "x=[..]", "x1=[..]", "w0=[..]", "y=[..]". */
static gboolean is_shape_field(const char *f)
{
  if (f[0] != 'x' && f[0] != 'w' && f[0] != 'y')
    return FALSE;
  const char *p = f + 1;
  while (g_ascii_isdigit(*p))
    p++;
  return p[0] == '=' && p[1] == '[';
}

/* Splits @key into its family (written to @family) and its dimensions.  FALSE when the
 * key has more dimensions than interpolation compares, or a malformed shape. */
static gboolean split_key(const char *key, GString *family, int *n, int64_t *dims)
{
  g_auto(GStrv) fields = g_strsplit(key, "|", -1);
  g_string_truncate(family, 0);
  *n = 0;
  for (int i = 0; fields[i]; i++) {
    const char *f = fields[i];
    if (i == 0 || !is_shape_field(f)) {
      g_string_append(family, f);
      g_string_append_c(family, '|');
      continue;
    }
    const char *open = strchr(f, '[');
    g_string_append_len(family, f, open - f);
    int rank = 0;
    const char *p = open + 1;
    while (*p && *p != ']') {
      char *end = NULL;
      gint64 v = g_ascii_strtoll(p, &end, 10);
      if (end == p || *n >= MAX_KEY_DIMS)
        return FALSE;
      dims[(*n)++] = v;
      rank++;
      p = *end == ',' ? end + 1 : end;
    }
    if (*p != ']')
      return FALSE;
    g_string_append_printf(family, ":%d|", rank);
  }
  return TRUE;
}

static char *family_index_key(const char *gpu, SimPass pass, const char *family)
{
  return g_strdup_printf("%s\x1f%d\x1f%s", gpu, (int)pass, family);
}

static void build_families(ProfileDb *db)
{
  db->families = g_hash_table_new_full(g_str_hash, g_str_equal, g_free,
                                       (GDestroyNotify)g_ptr_array_unref);
  g_autoptr(GString) family = g_string_new(NULL);
  for (guint i = 0; i < db->ops->len; i++) {
    const OpRecord *r = db->ops->pdata[i];
    if (r->e.flops <= 0.0 && r->e.bytes <= 0.0)
      continue;
    Member m = { .r = r };
    if (!split_key(r->key, family, &m.n, m.dims))
      continue;
    char *fk = family_index_key(r->gpu, r->e.pass, family->str);
    GPtrArray *list = g_hash_table_lookup(db->families, fk);
    if (!list) {
      list = g_ptr_array_new_with_free_func(g_free);
      g_hash_table_insert(db->families, fk, list);
    } else {
      g_free(fk);
    }
    g_ptr_array_add(list, g_memdup2(&m, sizeof m));
  }
}

void profile_db_invalidate(ProfileDb *db)
{
  g_clear_pointer(&db->families, g_hash_table_unref);
}

/* The nearest entries below and above the query along one set of differing dimensions. */
typedef struct {
  guint64 mask;
  const Member *below, *above;
  double m_below, m_above;
} Bracket;

static double measure_of(const OpRecord *r, gboolean compute)
{
  return compute ? r->e.flops : r->e.bytes;
}

static double interpolate(const ProfileDb *db, const char *gpu, const char *key, SimPass pass,
                          const SimWork *work)
{
  if (!db->families)
    build_families((ProfileDb *)db);
  g_autoptr(GString) family = g_string_new(NULL);
  Member q = { 0 };
  if (!split_key(key, family, &q.n, q.dims))
    return -1.0;
  g_autofree char *fk = family_index_key(gpu, pass, family->str);
  GPtrArray *list = g_hash_table_lookup(db->families, fk);
  if (!list)
    return -1.0;
  gboolean compute = profile_work_is_compute(work);
  double mq = compute ? sim_work_flops(work) : sim_work_bytes(work);
  if (!(mq > 0.0))
    return -1.0;

  g_autoptr(GArray) brackets = g_array_new(FALSE, TRUE, sizeof(Bracket));
  for (guint i = 0; i < list->len; i++) {
    const Member *m = list->pdata[i];
    if (m->n != q.n)
      continue;
    guint64 mask = 0;
    int below = 0, above = 0;
    for (int d = 0; d < q.n; d++) {
      if (m->dims[d] == q.dims[d])
        continue;
      mask |= G_GUINT64_CONSTANT(1) << d;
      if (m->dims[d] < q.dims[d])
        below++;
      else
        above++;
    }
    if (!mask || (below && above))
      continue;
    double mm = measure_of(m->r, compute);
    if (!(mm > 0.0))
      continue;
    Bracket *b = NULL;
    for (guint j = 0; j < brackets->len && !b; j++)
      if (g_array_index(brackets, Bracket, j).mask == mask)
        b = &g_array_index(brackets, Bracket, j);
    if (!b) {
      Bracket nb = { .mask = mask };
      g_array_append_val(brackets, nb);
      b = &g_array_index(brackets, Bracket, brackets->len - 1);
    }
    /* Keep the nearest on each side, by work. */
    if (below && mm <= mq && (!b->below || mm > b->m_below)) {
      b->below = m;
      b->m_below = mm;
    } else if (above && mm >= mq && (!b->above || mm < b->m_above)) {
      b->above = m;
      b->m_above = mm;
    }
  }

  const Bracket *best = NULL;
  for (guint j = 0; j < brackets->len; j++) {
    const Bracket *b = &g_array_index(brackets, Bracket, j);
    if (!b->below || !b->above || !(b->m_above > b->m_below))
      continue;
    if (!best || b->m_above / b->m_below < best->m_above / best->m_below)
      best = b;
  }
  if (!best)
    return -1.0;
  double t0 = best->below->r->e.median, t1 = best->above->r->e.median;
  double f = (mq - best->m_below) / (best->m_above - best->m_below);
  return t0 + (t1 - t0) * f;
}

double profile_db_lookup_op(const ProfileDb *db, const char *gpu, const SimGraph *g, int op,
                            const int64_t *extent, SimPass pass, ProfileLookup *how)
{
  if (how)
    *how = PROFILE_LOOKUP_NONE;
  g_return_val_if_fail(db != NULL && gpu != NULL && g != NULL, -1.0);
  g_return_val_if_fail(op >= 0 && op < sim_graph_n_ops(g), -1.0);
  g_return_val_if_fail(pass >= 0 && pass < SIM_PASS_COUNT, -1.0);
  g_autofree char *key = sim_graph_op_shard_key(g, op, extent);
  const ProfileOpEntry *e = profile_db_find_op(db, gpu, key, pass);
  if (e) {
    if (how)
      *how = PROFILE_LOOKUP_EXACT;
    return e->median;
  }
  SimWork work = { 0 };
  sim_graph_op_work(g, op, extent, pass, &work);
  double t = interpolate(db, gpu, key, pass, &work);
  if (t >= 0.0 && how)
    *how = PROFILE_LOOKUP_INTERPOLATED;
  return t >= 0.0 ? t : -1.0;
}

/* ---------------------------------------------------------------------------------- */
/* Collective entries                                                                  */

void profile_db_add_collective(ProfileDb *db, const ProfileCollEntry *e)
{
  g_return_if_fail(db != NULL && e != NULL && e->gpu != NULL);
  g_return_if_fail(e->kind >= 0 && e->kind < PROFILE_COLL_COUNT && e->n_gpus >= 1);
  char *ik = coll_index_key(e->gpu, e->kind, e->n_gpus, e->bytes);
  CollRecord *old = g_hash_table_lookup(db->coll_index, ik);
  CollRecord *r = coll_record_new(e);
  if (old) {
    for (guint i = 0; i < db->colls->len; i++)
      if (db->colls->pdata[i] == old) {
        db->colls->pdata[i] = r;
        break;
      }
    coll_record_free(old);
  } else {
    g_ptr_array_add(db->colls, r);
  }
  db->sorted = FALSE;
  g_hash_table_replace(db->coll_index, ik, r);
}

int profile_db_n_collectives(const ProfileDb *db)
{
  g_return_val_if_fail(db != NULL, 0);
  return (int)db->colls->len;
}

const ProfileCollEntry *profile_db_collective(const ProfileDb *db, int i)
{
  g_return_val_if_fail(db != NULL && i >= 0 && i < (int)db->colls->len, NULL);
  profile_db_sort((ProfileDb *)db);
  return &((CollRecord *)db->colls->pdata[i])->e;
}

double profile_db_lookup_collective(const ProfileDb *db, const char *gpu, ProfileCollKind kind,
                                    int n_gpus, double bytes, ProfileLookup *how)
{
  if (how)
    *how = PROFILE_LOOKUP_NONE;
  g_return_val_if_fail(db != NULL && gpu != NULL, -1.0);
  g_return_val_if_fail(kind >= 0 && kind < PROFILE_COLL_COUNT, -1.0);
  g_autofree char *ik = coll_index_key(gpu, kind, n_gpus, bytes);
  CollRecord *r = g_hash_table_lookup(db->coll_index, ik);
  if (r) {
    if (how)
      *how = PROFILE_LOOKUP_EXACT;
    return r->e.median;
  }
  const ProfileCollEntry *lo = NULL, *hi = NULL;
  for (guint i = 0; i < db->colls->len; i++) {
    const ProfileCollEntry *e = &((CollRecord *)db->colls->pdata[i])->e;
    if (e->kind != kind || e->n_gpus != n_gpus || strcmp(e->gpu, gpu))
      continue;
    if (e->bytes < bytes && (!lo || e->bytes > lo->bytes))
      lo = e;
    if (e->bytes > bytes && (!hi || e->bytes < hi->bytes))
      hi = e;
  }
  if (!lo || !hi)
    return -1.0;
  if (how)
    *how = PROFILE_LOOKUP_INTERPOLATED;
  double f = (bytes - lo->bytes) / (hi->bytes - lo->bytes);
  return lo->median + (hi->median - lo->median) * f;
}

/* ---------------------------------------------------------------------------------- */
/* Merging                                                                             */

void profile_db_merge(ProfileDb *dst, const ProfileDb *src)
{
  g_return_if_fail(dst != NULL && src != NULL);
  if (src->description && !dst->description)
    dst->description = g_strdup(src->description);
  for (guint i = 0; i < src->sources->len; i++)
    profile_db_add_source(dst, src->sources->pdata[i]);
  GHashTableIter it;
  gpointer gpu, table;
  g_hash_table_iter_init(&it, src->notes);
  while (g_hash_table_iter_next(&it, &gpu, &table)) {
    GHashTableIter jt;
    gpointer name, value;
    g_hash_table_iter_init(&jt, table);
    while (g_hash_table_iter_next(&jt, &name, &value))
      profile_db_set_device_note(dst, gpu, name, value);
  }
  for (guint i = 0; i < src->ops->len; i++)
    profile_db_add_op(dst, &((OpRecord *)src->ops->pdata[i])->e);
  for (guint i = 0; i < src->colls->len; i++)
    profile_db_add_collective(dst, &((CollRecord *)src->colls->pdata[i])->e);
}
