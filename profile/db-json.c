/* db-json.c — profile databases as JSON files ("format": "parasol-profile"): writing them
 * (operator entries one a line, collectives as series of points per device, kind, GPU
 * count and source), reading them through the shared reader (base/json-read.h), and loading
 * a file or every *.json under a directory. */
#include "profile-private.h"

#include "json-read.h"

#include <json-glib/json-glib.h>
#include <math.h>
#include <string.h>

/* ---------------------------------------------------------------------------------- */
/* Writing                                                                             */

static void put_string(GString *s, const char *v)
{
  g_string_append_c(s, '"');
  for (const char *p = v; *p; p++) {
    unsigned char c = (unsigned char)*p;
    if (c == '"' || c == '\\')
      g_string_append_printf(s, "\\%c", c);
    else if (c < 0x20)
      g_string_append_printf(s, "\\u%04x", c);
    else
      g_string_append_c(s, (char)c);
  }
  g_string_append_c(s, '"');
}

/* Seconds keep six significant digits: far finer than the spread of repeated runs. */
static void put_seconds(GString *s, double v)
{
  char buf[G_ASCII_DTOSTR_BUF_SIZE];
  g_string_append(s, g_ascii_formatd(buf, sizeof buf, "%.6g", v));
}

/* Counts (FLOPs, bytes) are integers that doubles hold exactly up to 2^53. */
static void put_count(GString *s, double v)
{
  char buf[G_ASCII_DTOSTR_BUF_SIZE];
  g_string_append(s, g_ascii_formatd(buf, sizeof buf, "%.17g", v));
}

static void put_op(GString *s, const OpRecord *r)
{
  const ProfileOpEntry *e = &r->e;
  g_string_append(s, "    {\"gpu\": ");
  put_string(s, e->gpu);
  g_string_append(s, ", \"key\": ");
  put_string(s, e->key);
  g_string_append_printf(s, ", \"pass\": \"%s\", \"median\": ", sim_pass_name(e->pass));
  put_seconds(s, e->median);
  g_string_append(s, ", \"min\": ");
  put_seconds(s, e->min);
  g_string_append(s, ", \"max\": ");
  put_seconds(s, e->max);
  g_string_append_printf(s, ", \"repetitions\": %d", e->repetitions);
  if (e->flops > 0.0 || e->bytes > 0.0) {
    g_string_append(s, ", \"flops\": ");
    put_count(s, e->flops);
    g_string_append(s, ", \"bytes\": ");
    put_count(s, e->bytes);
  }
  if (e->n_kernels > 0) {
    g_string_append(s, ", \"kernels\": [");
    for (int i = 0; i < e->n_kernels; i++) {
      const SimKernel *k = &e->kernels[i];
      g_string_append_printf(s, "%s[\"%s\", \"%s\", %" G_GINT64_FORMAT ", %" G_GINT64_FORMAT
                             ", %" G_GINT64_FORMAT ", %" G_GINT64_FORMAT ", %" G_GINT64_FORMAT
                             ", ",
                             i ? ", " : "", sim_kernel_kind_name(k->kind),
                             sim_dtype_name(k->dtype), k->batch, k->m, k->n, k->k, k->steps);
      put_count(s, k->flops);
      g_string_append(s, ", ");
      put_count(s, k->bytes);
      g_string_append_c(s, ']');
    }
    g_string_append_c(s, ']');
  }
  g_string_append_c(s, '}');
}

static gboolean same_series(const CollRecord *a, const CollRecord *b)
{
  return !strcmp(a->gpu, b->gpu) && a->e.kind == b->e.kind && a->e.n_gpus == b->e.n_gpus &&
         !g_strcmp0(a->source, b->source);
}

char *profile_db_to_json(const ProfileDb *db)
{
  g_return_val_if_fail(db != NULL, NULL);
  profile_db_sort((ProfileDb *)db);
  GString *s = g_string_new("{\n  \"format\": \"parasol-profile\",\n  \"version\": 1,\n");
  if (db->description) {
    g_string_append(s, "  \"description\": ");
    put_string(s, db->description);
    g_string_append(s, ",\n");
  }
  g_string_append(s, "  \"sources\": [");
  for (guint i = 0; i < db->sources->len; i++) {
    g_string_append(s, i ? ",\n    " : "\n    ");
    put_string(s, db->sources->pdata[i]);
  }
  g_string_append(s, db->sources->len ? "\n  ],\n" : "],\n");

  g_string_append(s, "  \"devices\": {");
  g_autofree gpointer *gpus = NULL;
  guint n_gpus = 0;
  gpus = g_hash_table_get_keys_as_array(db->notes, &n_gpus);
  qsort(gpus, n_gpus, sizeof *gpus, profile_compare_strings);
  for (guint i = 0; i < n_gpus; i++) {
    GHashTable *t = g_hash_table_lookup(db->notes, gpus[i]);
    g_string_append(s, i ? ",\n    " : "\n    ");
    put_string(s, gpus[i]);
    g_string_append(s, ": {");
    guint n_names = 0;
    g_autofree gpointer *names = g_hash_table_get_keys_as_array(t, &n_names);
    qsort(names, n_names, sizeof *names, profile_compare_strings);
    for (guint j = 0; j < n_names; j++) {
      g_string_append(s, j ? ", " : "");
      put_string(s, names[j]);
      g_string_append(s, ": ");
      put_string(s, g_hash_table_lookup(t, names[j]));
    }
    g_string_append_c(s, '}');
  }
  g_string_append(s, n_gpus ? "\n  },\n" : "},\n");

  g_string_append(s, "  \"ops\": [");
  for (guint i = 0; i < db->ops->len; i++) {
    g_string_append(s, i ? ",\n" : "\n");
    put_op(s, db->ops->pdata[i]);
  }
  g_string_append(s, db->ops->len ? "\n  ],\n" : "],\n");

  g_string_append(s, "  \"collectives\": [");
  for (guint i = 0; i < db->colls->len;) {
    const CollRecord *first = db->colls->pdata[i];
    g_string_append(s, i ? ",\n    {\"gpu\": " : "\n    {\"gpu\": ");
    put_string(s, first->gpu);
    g_string_append_printf(s, ", \"kind\": \"%s\", \"gpus\": %d",
                           profile_coll_kind_name(first->e.kind), first->e.n_gpus);
    if (first->source) {
      g_string_append(s, ", \"source\": ");
      put_string(s, first->source);
    }
    g_string_append(s, ",\n     \"points\": [");
    guint j = i;
    for (; j < db->colls->len && same_series(first, db->colls->pdata[j]); j++) {
      const ProfileCollEntry *e = &((CollRecord *)db->colls->pdata[j])->e;
      g_string_append(s, j == i ? "\n       [" : ",\n       [");
      put_count(s, e->bytes);
      g_string_append(s, ", ");
      put_seconds(s, e->median);
      g_string_append(s, ", ");
      put_seconds(s, e->min);
      g_string_append(s, ", ");
      put_seconds(s, e->max);
      g_string_append_printf(s, ", %d]", e->repetitions);
    }
    g_string_append(s, "]}");
    i = j;
  }
  g_string_append(s, db->colls->len ? "\n  ]\n}\n" : "]\n}\n");
  return g_string_free(s, FALSE);
}

gboolean profile_db_save(const ProfileDb *db, const char *path, GError **error)
{
  g_return_val_if_fail(db != NULL && path != NULL, FALSE);
  g_autofree char *text = profile_db_to_json(db);
  g_autoptr(GError) e = NULL;
  if (!g_file_set_contents(path, text, -1, &e)) {
    g_set_error(error, PROFILE_ERROR, PROFILE_ERROR_IO, "%s", e->message);
    return FALSE;
  }
  return TRUE;
}

/* ---------------------------------------------------------------------------------- */
/* Reading                                                                             */

/* The shared reader (base/json-read.h), every error of which is PROFILE_ERROR_PARSE. */
typedef SimJsonReader Reader;

static gboolean read_kernel(Reader *rd, JsonNode *n, const char *path, SimKernel *k)
{
  if (!JSON_NODE_HOLDS_ARRAY(n) || json_array_get_length(json_node_get_array(n)) != 9)
    return sim_json_fail(rd, PROFILE_ERROR_PARSE, path,
                         "expected [kind, dtype, batch, m, n, k, steps, flops, bytes]");
  JsonArray *a = json_node_get_array(n);
  const char *kind = NULL, *dtype = NULL;
  g_autofree char *p0 = g_strdup_printf("%s[0]", path);
  g_autofree char *p1 = g_strdup_printf("%s[1]", path);
  if (!sim_json_string(rd, json_array_get_element(a, 0), p0, &kind) ||
      !sim_json_string(rd, json_array_get_element(a, 1), p1, &dtype))
    return FALSE;
  int kk = profile_kernel_kind_from_name(kind);
  if (kk < 0)
    return sim_json_fail(rd, PROFILE_ERROR_PARSE, p0, "unknown kernel kind '%s'", kind);
  int dt = sim_dtype_from_name(dtype);
  if (dt < 0)
    return sim_json_fail(rd, PROFILE_ERROR_PARSE, p1, "unknown dtype '%s'", dtype);
  int64_t v[5];
  for (int i = 0; i < 5; i++) {
    g_autofree char *pi = g_strdup_printf("%s[%d]", path, i + 2);
    if (!sim_json_int(rd, json_array_get_element(a, (guint)i + 2), pi, 0, G_MAXINT64, &v[i]))
      return FALSE;
  }
  double f[2];
  for (int i = 0; i < 2; i++) {
    g_autofree char *pi = g_strdup_printf("%s[%d]", path, i + 7);
    if (!sim_json_number(rd, json_array_get_element(a, (guint)i + 7), pi, 0.0, TRUE, &f[i]))
      return FALSE;
  }
  *k = (SimKernel){
    .kind = (SimKernelKind)kk,
    .dtype = (SimDType)dt,
    .batch = v[0],
    .m = v[1],
    .n = v[2],
    .k = v[3],
    .steps = v[4],
    .flops = f[0],
    .bytes = f[1],
  };
  return TRUE;
}

static gboolean read_times(Reader *rd, const char *path, double median, double mn, double mx)
{
  if (mn > median || median > mx)
    return sim_json_fail(rd, PROFILE_ERROR_PARSE, path, "expected min <= median <= max, got %g, %g, %g", mn, median,
                         mx);
  return TRUE;
}

static gboolean read_op(Reader *rd, ProfileDb *db, JsonNode *n, const char *path)
{
  static const char *const keys[] = { "gpu", "key", "pass", "median", "min", "max",
                                      "repetitions", "flops", "bytes", "kernels", NULL };
  JsonObject *o;
  if (!sim_json_object(rd, n, path, &o))
    return FALSE;
  if (!sim_json_check_keys(rd, o, path, keys))
    return FALSE;
  ProfileOpEntry e = { 0 };
  const char *pass = NULL;
  int64_t reps = 1;
  g_autofree char *pg = g_strdup_printf("%s.gpu", path);
  g_autofree char *pk = g_strdup_printf("%s.key", path);
  g_autofree char *pp = g_strdup_printf("%s.pass", path);
  g_autofree char *pm = g_strdup_printf("%s.median", path);
  g_autofree char *pmin = g_strdup_printf("%s.min", path);
  g_autofree char *pmax = g_strdup_printf("%s.max", path);
  g_autofree char *pr = g_strdup_printf("%s.repetitions", path);
  if (!sim_json_string(rd, json_object_get_member(o, "gpu"), pg, &e.gpu) ||
      !sim_json_string(rd, json_object_get_member(o, "key"), pk, &e.key) ||
      !sim_json_string(rd, json_object_get_member(o, "pass"), pp, &pass) ||
      !sim_json_number(rd, json_object_get_member(o, "median"), pm, 0.0, TRUE, &e.median))
    return FALSE;
  int p = profile_pass_from_name(pass);
  if (p < 0)
    return sim_json_fail(rd, PROFILE_ERROR_PARSE, pp, "unknown pass '%s'; expected forward, backward or update",
                         pass);
  e.pass = (SimPass)p;
  e.min = e.max = e.median;
  if (json_object_has_member(o, "min") &&
      !sim_json_number(rd, json_object_get_member(o, "min"), pmin, 0.0, TRUE, &e.min))
    return FALSE;
  if (json_object_has_member(o, "max") &&
      !sim_json_number(rd, json_object_get_member(o, "max"), pmax, 0.0, TRUE, &e.max))
    return FALSE;
  if (!read_times(rd, path, e.median, e.min, e.max))
    return FALSE;
  if (json_object_has_member(o, "repetitions") &&
      !sim_json_int(rd, json_object_get_member(o, "repetitions"), pr, 1, G_MAXINT64, &reps))
    return FALSE;
  e.repetitions = (int)MIN(reps, G_MAXINT);
  if (json_object_has_member(o, "flops")) {
    g_autofree char *pf = g_strdup_printf("%s.flops", path);
    if (!sim_json_number(rd, json_object_get_member(o, "flops"), pf, 0.0, TRUE, &e.flops))
      return FALSE;
  }
  if (json_object_has_member(o, "bytes")) {
    g_autofree char *pb = g_strdup_printf("%s.bytes", path);
    if (!sim_json_number(rd, json_object_get_member(o, "bytes"), pb, 0.0, TRUE, &e.bytes))
      return FALSE;
  }
  SimKernel kernels[SIM_MAX_KERNELS];
  if (json_object_has_member(o, "kernels")) {
    JsonNode *kn = json_object_get_member(o, "kernels");
    g_autofree char *pks = g_strdup_printf("%s.kernels", path);
    JsonArray *ka;
    if (!sim_json_array(rd, kn, pks, &ka))
      return FALSE;
    guint nk = json_array_get_length(ka);
    if (nk > SIM_MAX_KERNELS)
      return sim_json_fail(rd, PROFILE_ERROR_PARSE, pks, "%u kernels; at most %d", nk, SIM_MAX_KERNELS);
    for (guint i = 0; i < nk; i++) {
      g_autofree char *pi = g_strdup_printf("%s[%u]", pks, i);
      if (!read_kernel(rd, json_array_get_element(ka, i), pi, &kernels[i]))
        return FALSE;
    }
    e.n_kernels = (int)nk;
    e.kernels = kernels;
  }
  profile_db_add_op(db, &e);
  return TRUE;
}

static gboolean read_series(Reader *rd, ProfileDb *db, JsonNode *n, const char *path)
{
  static const char *const keys[] = { "gpu", "kind", "gpus", "source", "points", NULL };
  JsonObject *o;
  if (!sim_json_object(rd, n, path, &o))
    return FALSE;
  if (!sim_json_check_keys(rd, o, path, keys))
    return FALSE;
  ProfileCollEntry e = { 0 };
  const char *kind = NULL;
  int64_t gpus = 0;
  g_autofree char *pg = g_strdup_printf("%s.gpu", path);
  g_autofree char *pk = g_strdup_printf("%s.kind", path);
  g_autofree char *pn = g_strdup_printf("%s.gpus", path);
  g_autofree char *ps = g_strdup_printf("%s.source", path);
  g_autofree char *pp = g_strdup_printf("%s.points", path);
  if (!sim_json_string(rd, json_object_get_member(o, "gpu"), pg, &e.gpu) ||
      !sim_json_string(rd, json_object_get_member(o, "kind"), pk, &kind) ||
      !sim_json_int(rd, json_object_get_member(o, "gpus"), pn, 1, G_MAXINT64, &gpus))
    return FALSE;
  int k = profile_coll_kind_from_name(kind);
  if (k < 0)
    return sim_json_fail(rd, PROFILE_ERROR_PARSE, pk, "unknown collective '%s'; expected all-reduce, all-gather, "
                         "reduce-scatter or send-recv", kind);
  e.kind = (ProfileCollKind)k;
  e.n_gpus = (int)MIN(gpus, G_MAXINT);
  if (json_object_has_member(o, "source") &&
      !sim_json_string(rd, json_object_get_member(o, "source"), ps, &e.source))
    return FALSE;
  JsonNode *pts = json_object_get_member(o, "points");
  if (!pts || !JSON_NODE_HOLDS_ARRAY(pts))
    return sim_json_fail(rd, PROFILE_ERROR_PARSE, pp, "expected an array of [bytes, median, min, max, repetitions]");
  JsonArray *a = json_node_get_array(pts);
  for (guint i = 0; i < json_array_get_length(a); i++) {
    g_autofree char *pi = g_strdup_printf("%s[%u]", pp, i);
    JsonNode *pn2 = json_array_get_element(a, i);
    if (!JSON_NODE_HOLDS_ARRAY(pn2) || json_array_get_length(json_node_get_array(pn2)) != 5)
      return sim_json_fail(rd, PROFILE_ERROR_PARSE, pi, "expected [bytes, median, min, max, repetitions]");
    JsonArray *v = json_node_get_array(pn2);
    int64_t reps = 0;
    g_autofree char *p0 = g_strdup_printf("%s[0]", pi);
    g_autofree char *p1 = g_strdup_printf("%s[1]", pi);
    g_autofree char *p2 = g_strdup_printf("%s[2]", pi);
    g_autofree char *p3 = g_strdup_printf("%s[3]", pi);
    g_autofree char *p4 = g_strdup_printf("%s[4]", pi);
    if (!sim_json_number(rd, json_array_get_element(v, 0), p0, 1.0, TRUE, &e.bytes) ||
        !sim_json_number(rd, json_array_get_element(v, 1), p1, 0.0, TRUE, &e.median) ||
        !sim_json_number(rd, json_array_get_element(v, 2), p2, 0.0, TRUE, &e.min) ||
        !sim_json_number(rd, json_array_get_element(v, 3), p3, 0.0, TRUE, &e.max) ||
        !sim_json_int(rd, json_array_get_element(v, 4), p4, 1, G_MAXINT64, &reps) ||
        !read_times(rd, pi, e.median, e.min, e.max))
      return FALSE;
    e.repetitions = (int)MIN(reps, G_MAXINT);
    profile_db_add_collective(db, &e);
  }
  return TRUE;
}

ProfileDb *profile_db_from_json(const char *text, const char *filename, GError **error)
{
  g_return_val_if_fail(text != NULL, NULL);
  Reader rd = { .file = filename ? filename : "<profile>", .error = error,
                .domain = PROFILE_ERROR, .parse = PROFILE_ERROR_PARSE,
                .invalid = PROFILE_ERROR_PARSE, .unknown = PROFILE_ERROR_PARSE };
  g_autoptr(JsonParser) parser = json_parser_new();
  JsonObject *o = sim_json_read_root(&rd, parser, text, "parasol-profile");
  static const char *const keys[] = { "format", "version", "description", "sources", "devices",
                                      "ops", "collectives", NULL };
  if (!o || !sim_json_check_format(&rd, o, "parasol-profile", 1) ||
      !sim_json_check_keys(&rd, o, "", keys))
    return NULL;
  g_autoptr(ProfileDb) db = profile_db_new();
  if (json_object_has_member(o, "description")) {
    const char *d = NULL;
    if (!sim_json_string(&rd, json_object_get_member(o, "description"), "description", &d))
      return NULL;
    profile_db_set_description(db, d);
  }
  if (json_object_has_member(o, "sources")) {
    JsonNode *n = json_object_get_member(o, "sources");
    JsonArray *a;
    if (!sim_json_array(&rd, n, "sources", &a))
      return NULL;
    for (guint i = 0; i < json_array_get_length(a); i++) {
      g_autofree char *p = g_strdup_printf("sources[%u]", i);
      const char *s = NULL;
      if (!sim_json_string(&rd, json_array_get_element(a, i), p, &s))
        return NULL;
      profile_db_add_source(db, s);
    }
  }
  if (json_object_has_member(o, "devices")) {
    JsonNode *n = json_object_get_member(o, "devices");
    JsonObject *devs;
    if (!sim_json_object(&rd, n, "devices", &devs))
      return NULL;
    g_autoptr(GList) names = json_object_get_members(devs);
    for (GList *l = names; l; l = l->next) {
      g_autofree char *p = g_strdup_printf("devices.%s", (const char *)l->data);
      JsonNode *dn = json_object_get_member(devs, l->data);
      JsonObject *notes;
      if (!sim_json_object(&rd, dn, p, &notes))
        return NULL;
      g_autoptr(GList) nn = json_object_get_members(notes);
      for (GList *m = nn; m; m = m->next) {
        g_autofree char *pm = g_strdup_printf("%s.%s", p, (const char *)m->data);
        const char *v = NULL;
        if (!sim_json_string(&rd, json_object_get_member(notes, m->data), pm, &v))
          return NULL;
        profile_db_set_device_note(db, l->data, m->data, v);
      }
    }
  }
  if (json_object_has_member(o, "ops")) {
    JsonNode *n = json_object_get_member(o, "ops");
    JsonArray *a;
    if (!sim_json_array(&rd, n, "ops", &a))
      return NULL;
    for (guint i = 0; i < json_array_get_length(a); i++) {
      g_autofree char *p = g_strdup_printf("ops[%u]", i);
      if (!read_op(&rd, db, json_array_get_element(a, i), p))
        return NULL;
    }
  }
  if (json_object_has_member(o, "collectives")) {
    JsonNode *n = json_object_get_member(o, "collectives");
    JsonArray *a;
    if (!sim_json_array(&rd, n, "collectives", &a))
      return NULL;
    for (guint i = 0; i < json_array_get_length(a); i++) {
      g_autofree char *p = g_strdup_printf("collectives[%u]", i);
      if (!read_series(&rd, db, json_array_get_element(a, i), p))
        return NULL;
    }
  }
  return g_steal_pointer(&db);
}

static gboolean load_file(ProfileDb *into, const char *path, const char *shown, GError **error)
{
  g_autofree char *text = NULL;
  g_autoptr(GError) e = NULL;
  if (!sim_read_file(path, &text, NULL, &e)) {
    g_set_error(error, PROFILE_ERROR, PROFILE_ERROR_IO, "%s", e->message);
    return FALSE;
  }
  g_autoptr(ProfileDb) db = profile_db_from_json(text, shown, error);
  if (!db)
    return FALSE;
  profile_db_merge(into, db);
  return TRUE;
}

/* Every *.json under @dir, depth first, in name order; @prefix names them in errors. */
static gboolean load_dir(ProfileDb *into, const char *dir, const char *prefix, GError **error)
{
  g_autoptr(GError) e = NULL;
  g_autoptr(GDir) d = g_dir_open(dir, 0, &e);
  if (!d) {
    g_set_error(error, PROFILE_ERROR, PROFILE_ERROR_IO, "%s", e->message);
    return FALSE;
  }
  g_autoptr(GPtrArray) names = g_ptr_array_new_with_free_func(g_free);
  const char *name;
  while ((name = g_dir_read_name(d)))
    g_ptr_array_add(names, g_strdup(name));
  g_ptr_array_sort(names, profile_compare_strings);
  for (guint i = 0; i < names->len; i++) {
    const char *n = names->pdata[i];
    g_autofree char *path = g_build_filename(dir, n, NULL);
    g_autofree char *shown = prefix ? g_build_filename(prefix, n, NULL) : g_strdup(n);
    if (g_file_test(path, G_FILE_TEST_IS_DIR)) {
      if (!load_dir(into, path, shown, error))
        return FALSE;
    } else if (g_str_has_suffix(n, ".json")) {
      if (!load_file(into, path, shown, error))
        return FALSE;
    }
  }
  return TRUE;
}

ProfileDb *profile_db_load(const char *path, GError **error)
{
  g_return_val_if_fail(path != NULL, NULL);
  g_autoptr(ProfileDb) db = profile_db_new();
  if (g_file_test(path, G_FILE_TEST_IS_DIR)) {
    g_autofree char *base = g_path_get_basename(path);
    if (!load_dir(db, path, base, error))
      return NULL;
  } else if (!load_file(db, path, path, error)) {
    return NULL;
  }
  return g_steal_pointer(&db);
}
