/* colltable.c — measured all-reduce times inside one node, by group size and message size.
 *
 * The analytic ring model (a fixed cost, then 2(n-1)/n * S at a fraction of the link
 * bandwidth) misses how NCCL behaves at a few MiB: below about 8 MiB its time hardly grows
 * with the size (a latency floor that rises with the group), and its achieved bandwidth
 * differs between 2 and 8 ranks.  A table measured with nccl-tests' all_reduce_perf on the
 * machine itself carries all of that.  The collective lowering takes from it only the
 * fixed part, the measured time less what the ring's flows take on an idle network, so
 * that the bytes still share links with other traffic as before.
 *
 * File format: CSV with the header "gpus,bytes,seconds" and one row per measurement;
 * several rows of one size are averaged.  Sizes between two measured ones interpolate
 * linearly; outside the measured range the nearest size's fixed part holds. */
#include "sim-private.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  double bytes;
  double seconds;
} Point;

struct _SimCollTable {
  char *path;
  GArray *by_n[SIM_COLL_TABLE_MAX_GPUS + 1]; /* Point, sorted by bytes; NULL when unmeasured */
};

static int point_cmp(const void *a, const void *b)
{
  const Point *x = a, *y = b;
  return (x->bytes > y->bytes) - (x->bytes < y->bytes);
}

SimCollTable *sim_coll_table_load(const char *path, GError **error)
{
  g_autofree char *text = NULL;
  gsize len = 0;
  GError *io = NULL;
  if (!sim_read_file(path, &text, &len, &io)) {
    sim_set_error_at(error, SIM_ERROR_IO, path, NULL, "cannot read: %s", io->message);
    g_error_free(io);
    return NULL;
  }
  SimCollTable *t = g_new0(SimCollTable, 1);
  t->path = g_strdup(path);
  g_auto(GStrv) lines = g_strsplit(text, "\n", -1);
  gboolean header = FALSE;
  int rows = 0;
  for (int i = 0; lines[i]; i++) {
    char *line = g_strstrip(lines[i]);
    if (!*line || line[0] == '#')
      continue;
    g_autofree char *place = g_strdup_printf("line %d", i + 1);
    if (!header) {
      if (strcmp(line, "gpus,bytes,seconds")) {
        sim_set_error_at(error, SIM_ERROR_PARSE, path, place,
                         "expected the header 'gpus,bytes,seconds'");
        sim_coll_table_free(t);
        return NULL;
      }
      header = TRUE;
      continue;
    }
    g_auto(GStrv) f = g_strsplit(line, ",", -1);
    char *end0 = NULL, *end1 = NULL, *end2 = NULL;
    long n = 0;
    double bytes = 0, seconds = 0;
    gboolean ok = g_strv_length(f) == 3;
    if (ok) {
      errno = 0;
      n = strtol(f[0], &end0, 10);
      bytes = g_ascii_strtod(f[1], &end1);
      seconds = g_ascii_strtod(f[2], &end2);
      ok = errno == 0 && *end0 == 0 && *end1 == 0 && *end2 == 0 && end0 != f[0] &&
           end1 != f[1] && end2 != f[2];
    }
    if (!ok) {
      sim_set_error_at(error, SIM_ERROR_PARSE, path, place,
                       "expected three numbers: gpus,bytes,seconds");
      sim_coll_table_free(t);
      return NULL;
    }
    if (n < 2 || n > SIM_COLL_TABLE_MAX_GPUS || !(bytes > 0) || !(seconds > 0) ||
        seconds > 1e3) {
      sim_set_error_at(error, SIM_ERROR_INVALID, path, place,
                       "expected 2 to %d GPUs, a positive size and a time in (0, 1000] s",
                       SIM_COLL_TABLE_MAX_GPUS);
      sim_coll_table_free(t);
      return NULL;
    }
    if (!t->by_n[n])
      t->by_n[n] = g_array_new(FALSE, FALSE, sizeof(Point));
    Point p = { bytes, seconds };
    g_array_append_val(t->by_n[n], p);
    rows++;
  }
  if (!rows) {
    sim_set_error_at(error, SIM_ERROR_PARSE, path, NULL,
                     header ? "no measurements after the header" : "empty file");
    sim_coll_table_free(t);
    return NULL;
  }
  /* Sort, then average the repetitions of one size. */
  for (int n = 0; n <= SIM_COLL_TABLE_MAX_GPUS; n++) {
    GArray *a = t->by_n[n];
    if (!a)
      continue;
    qsort(a->data, a->len, sizeof(Point), point_cmp);
    guint k = 0;
    for (guint i = 0; i < a->len;) {
      guint j = i;
      double sum = 0;
      while (j < a->len && g_array_index(a, Point, j).bytes == g_array_index(a, Point, i).bytes)
        sum += g_array_index(a, Point, j++).seconds;
      Point p = { g_array_index(a, Point, i).bytes, sum / (j - i) };
      g_array_index(a, Point, k++) = p;
      i = j;
    }
    g_array_set_size(a, k);
  }
  return t;
}

void sim_coll_table_free(SimCollTable *t)
{
  if (!t)
    return;
  for (int n = 0; n <= SIM_COLL_TABLE_MAX_GPUS; n++)
    if (t->by_n[n])
      g_array_free(t->by_n[n], TRUE);
  g_free(t->path);
  g_free(t);
}

const char *sim_coll_table_path(const SimCollTable *t)
{
  return t->path;
}

double sim_coll_table_lookup(const SimCollTable *t, int n, double bytes, double *at_bytes)
{
  if (!t || n < 2 || n > SIM_COLL_TABLE_MAX_GPUS || !t->by_n[n] || !t->by_n[n]->len)
    return -1;
  const GArray *a = t->by_n[n];
  const Point *p = (const Point *)a->data;
  guint last = a->len - 1;
  if (bytes <= p[0].bytes) {
    *at_bytes = p[0].bytes;
    return p[0].seconds;
  }
  if (bytes >= p[last].bytes) {
    *at_bytes = p[last].bytes;
    return p[last].seconds;
  }
  guint lo = 0, hi = last; /* p[lo].bytes < bytes < p[hi].bytes */
  while (hi - lo > 1) {
    guint mid = (lo + hi) / 2;
    if (p[mid].bytes <= bytes)
      lo = mid;
    else
      hi = mid;
  }
  double f = (bytes - p[lo].bytes) / (p[hi].bytes - p[lo].bytes);
  *at_bytes = bytes;
  return p[lo].seconds + f * (p[hi].seconds - p[lo].seconds);
}
