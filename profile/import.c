/* import.c — collective timings measured by others: the CSV form of NCCL's tests
 * (github.com/NVIDIA/nccl-tests), as the vTrain project publishes them for A100 and V100
 * nodes (data/reference/vtrain).
 *
 * One file per collective and GPU count, named like "allreduce_8gpu.csv"; a header row
 * names the columns, of which "size(B)" is the message size and every "time(ns)" column
 * one repetition (NCCL's tests report an out-of-place and an in-place run).  The median
 * of the repetitions becomes the entry's time. */
#include "profile-private.h"

#include <stdlib.h>
#include <string.h>

static gboolean parse_name(const char *name, ProfileCollKind *kind, int *n_gpus)
{
  if (!g_str_has_suffix(name, "gpu.csv"))
    return FALSE;
  const char *us = strrchr(name, '_');
  if (!us)
    return FALSE;
  g_autofree char *k = g_strndup(name, (gsize)(us - name));
  int kk = profile_coll_kind_from_name(k);
  char *end = NULL;
  long n = strtol(us + 1, &end, 10);
  if (kk < 0 || end == us + 1 || strcmp(end, "gpu.csv") || n < 1 || n > 1 << 20)
    return FALSE;
  *kind = (ProfileCollKind)kk;
  *n_gpus = (int)n;
  return TRUE;
}

static gboolean import_file(ProfileDb *db, const char *path, const char *name,
                            ProfileCollKind kind, int n_gpus, const char *gpu,
                            const char *source, GError **error)
{
  g_autofree char *text = NULL;
  g_autoptr(GError) e = NULL;
  if (!sim_read_file(path, &text, NULL, &e)) {
    g_set_error(error, PROFILE_ERROR, PROFILE_ERROR_IO, "%s", e->message);
    return FALSE;
  }
  g_auto(GStrv) lines = g_strsplit(text, "\n", -1);
  if (!lines[0] || !*g_strstrip(lines[0])) {
    g_set_error(error, PROFILE_ERROR, PROFILE_ERROR_PARSE, "%s: empty file", name);
    return FALSE;
  }
  g_auto(GStrv) header = g_strsplit(lines[0], ",", -1);
  int size_col = -1, n_cols = (int)g_strv_length(header);
  int time_cols[16], n_times = 0;
  for (int c = 0; c < n_cols; c++) {
    const char *h = g_strstrip(header[c]);
    if (!strcmp(h, "size(B)"))
      size_col = c;
    else if (!strcmp(h, "time(ns)") && n_times < (int)G_N_ELEMENTS(time_cols))
      time_cols[n_times++] = c;
  }
  if (size_col < 0 || n_times == 0) {
    g_set_error(error, PROFILE_ERROR, PROFILE_ERROR_PARSE,
                "%s:1: expected a header with the columns size(B) and time(ns)", name);
    return FALSE;
  }
  for (int l = 1; lines[l]; l++) {
    char *line = g_strstrip(lines[l]);
    if (!*line)
      continue;
    g_auto(GStrv) f = g_strsplit(line, ",", -1);
    if ((int)g_strv_length(f) != n_cols) {
      g_set_error(error, PROFILE_ERROR, PROFILE_ERROR_PARSE,
                  "%s:%d: %u columns where the header has %d", name, l + 1, g_strv_length(f),
                  n_cols);
      return FALSE;
    }
    double t[16];
    char *end = NULL;
    double bytes = g_ascii_strtod(f[size_col], &end);
    gboolean ok = end != f[size_col] && *end == '\0' && bytes >= 1.0;
    for (int i = 0; ok && i < n_times; i++) {
      t[i] = g_ascii_strtod(f[time_cols[i]], &end) * 1e-9;
      ok = end != f[time_cols[i]] && *end == '\0' && t[i] > 0.0;
    }
    if (!ok) {
      g_set_error(error, PROFILE_ERROR, PROFILE_ERROR_PARSE,
                  "%s:%d: expected a positive size and positive times", name, l + 1);
      return FALSE;
    }
    double median = profile_median(t, n_times);
    ProfileCollEntry ce = {
      .gpu = gpu,
      .kind = kind,
      .n_gpus = n_gpus,
      .bytes = bytes,
      .median = median,
      .min = t[0],
      .max = t[n_times - 1],
      .repetitions = n_times,
      .source = source,
    };
    profile_db_add_collective(db, &ce);
  }
  return TRUE;
}

static int compare_names(const void *a, const void *b)
{
  return strcmp(*(char *const *)a, *(char *const *)b);
}

gboolean profile_db_import_nccl_tests(ProfileDb *db, const char *dir, const char *gpu,
                                      const char *source, GError **error)
{
  g_return_val_if_fail(db != NULL && dir != NULL && gpu != NULL, FALSE);
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
  g_ptr_array_sort(names, compare_names);
  int imported = 0;
  for (guint i = 0; i < names->len; i++) {
    ProfileCollKind kind;
    int n_gpus;
    if (!parse_name(names->pdata[i], &kind, &n_gpus))
      continue;
    g_autofree char *path = g_build_filename(dir, names->pdata[i], NULL);
    if (!import_file(db, path, names->pdata[i], kind, n_gpus, gpu, source, error))
      return FALSE;
    imported++;
  }
  if (!imported) {
    g_set_error(error, PROFILE_ERROR, PROFILE_ERROR_IO,
                "%s: no files named like allreduce_8gpu.csv", dir);
    return FALSE;
  }
  if (source)
    profile_db_add_source(db, source);
  return TRUE;
}
