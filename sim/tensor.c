/* tensor.c — data types, shapes and the n-dimensional boxes (regions) that shards of
 * operators read and write.  The lowering intersects regions millions of times, so the
 * region functions work on values and never allocate. */
#include "sim-private.h"

#include <string.h>

/* Canonical names, in SimDType order; the graph files write these. */
const char *const sim_dtype_names[] = {
  "fp32", "fp16", "bf16", "fp8", "int32", "int64", NULL,
};

static const int dtype_sizes[SIM_DTYPE_COUNT] = { 4, 2, 2, 1, 4, 8 };

/* Other spellings users write (PyTorch's and NumPy's). */
static const struct {
  const char *alias;
  SimDType dtype;
} dtype_aliases[] = {
  { "float32", SIM_DTYPE_FP32 },  { "float", SIM_DTYPE_FP32 },
  { "float16", SIM_DTYPE_FP16 },  { "half", SIM_DTYPE_FP16 },
  { "bfloat16", SIM_DTYPE_BF16 }, { "fp8_e4m3", SIM_DTYPE_FP8 },
  { "int", SIM_DTYPE_INT32 },     { "long", SIM_DTYPE_INT64 },
};

const char *sim_dtype_name(SimDType t)
{
  g_return_val_if_fail(t >= 0 && t < SIM_DTYPE_COUNT, "invalid");
  return sim_dtype_names[t];
}

int sim_dtype_from_name(const char *name)
{
  g_return_val_if_fail(name != NULL, -1);
  for (int i = 0; i < SIM_DTYPE_COUNT; i++)
    if (g_ascii_strcasecmp(name, sim_dtype_names[i]) == 0)
      return i;
  for (gsize i = 0; i < G_N_ELEMENTS(dtype_aliases); i++)
    if (g_ascii_strcasecmp(name, dtype_aliases[i].alias) == 0)
      return dtype_aliases[i].dtype;
  return -1;
}

int sim_dtype_size(SimDType t)
{
  g_return_val_if_fail(t >= 0 && t < SIM_DTYPE_COUNT, 0);
  return dtype_sizes[t];
}

gboolean sim_dtype_is_float(SimDType t)
{
  return t == SIM_DTYPE_FP32 || t == SIM_DTYPE_FP16 || t == SIM_DTYPE_BF16 ||
         t == SIM_DTYPE_FP8;
}

SimShape sim_shape_make(int ndim, const int64_t *dims)
{
  SimShape s = { 0 };
  g_return_val_if_fail(ndim >= 0 && ndim <= SIM_MAX_DIMS, s);
  g_return_val_if_fail(ndim == 0 || dims != NULL, s);
  s.ndim = ndim;
  for (int i = 0; i < ndim; i++)
    s.dims[i] = dims[i];
  return s;
}

int64_t sim_shape_numel(const SimShape *s)
{
  g_return_val_if_fail(s != NULL, 0);
  int64_t n = 1;
  for (int i = 0; i < s->ndim; i++)
    n *= s->dims[i];
  return n;
}

gboolean sim_shape_equal(const SimShape *a, const SimShape *b)
{
  g_return_val_if_fail(a != NULL && b != NULL, FALSE);
  if (a->ndim != b->ndim)
    return FALSE;
  for (int i = 0; i < a->ndim; i++)
    if (a->dims[i] != b->dims[i])
      return FALSE;
  return TRUE;
}

char *sim_shape_to_string(const SimShape *s)
{
  g_return_val_if_fail(s != NULL, NULL);
  GString *str = g_string_new("[");
  for (int i = 0; i < s->ndim; i++)
    g_string_append_printf(str, "%s%" G_GINT64_FORMAT, i ? ", " : "", s->dims[i]);
  g_string_append_c(str, ']');
  return g_string_free(str, FALSE);
}

SimRegion sim_region_full(const SimShape *s)
{
  SimRegion r = { 0 };
  g_return_val_if_fail(s != NULL, r);
  r.ndim = s->ndim;
  for (int i = 0; i < s->ndim; i++) {
    r.lo[i] = 0;
    r.hi[i] = s->dims[i];
  }
  return r;
}

int64_t sim_region_volume(const SimRegion *r)
{
  g_return_val_if_fail(r != NULL, 0);
  int64_t v = 1;
  for (int i = 0; i < r->ndim; i++) {
    if (r->hi[i] <= r->lo[i])
      return 0;
    v *= r->hi[i] - r->lo[i];
  }
  return v;
}

gboolean sim_region_intersect(const SimRegion *a, const SimRegion *b, SimRegion *out)
{
  g_return_val_if_fail(a != NULL && b != NULL && out != NULL, FALSE);
  SimRegion r = { .ndim = a->ndim };
  gboolean nonempty = a->ndim == b->ndim;
  for (int i = 0; nonempty && i < a->ndim; i++) {
    r.lo[i] = MAX(a->lo[i], b->lo[i]);
    r.hi[i] = MIN(a->hi[i], b->hi[i]);
    if (r.hi[i] <= r.lo[i])
      nonempty = FALSE;
  }
  if (!nonempty) {
    /* An empty result is all-zero ranges, so callers that ignore the return value still
     * see a zero volume. */
    memset(&r, 0, sizeof r);
    r.ndim = a->ndim;
  }
  *out = r;
  return nonempty;
}

gboolean sim_region_equal(const SimRegion *a, const SimRegion *b)
{
  g_return_val_if_fail(a != NULL && b != NULL, FALSE);
  if (a->ndim != b->ndim)
    return FALSE;
  for (int i = 0; i < a->ndim; i++)
    if (a->lo[i] != b->lo[i] || a->hi[i] != b->hi[i])
      return FALSE;
  return TRUE;
}

gboolean sim_region_contains(const SimRegion *outer, const SimRegion *inner)
{
  g_return_val_if_fail(outer != NULL && inner != NULL, FALSE);
  if (outer->ndim != inner->ndim)
    return FALSE;
  /* The empty set is inside every box. */
  if (sim_region_volume(inner) == 0)
    return TRUE;
  for (int i = 0; i < outer->ndim; i++)
    if (inner->lo[i] < outer->lo[i] || inner->hi[i] > outer->hi[i])
      return FALSE;
  return TRUE;
}
