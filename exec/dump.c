/* dump.c — a run's numbers written out for an independent implementation to check
 * (docs/exec-dump.md gives the format), and initial weights read back from such a dump.
 *
 * A dump directory holds graph.json (the graph, sim_graph_to_json), manifest.json (what
 * the run did: optimizer and its hyper-parameters, the weights, inputs and dropout masks
 * with their shapes and files, and each step's loss as a double) and NumPy .npy arrays
 * (format 1.0, little-endian, C order): the initial weights, and per step the whole
 * batch's inputs, the dropout masks, the weights' gradients and the updated weights. */
#include "exec-private.h"

#include <errno.h>
#include <glib/gstdio.h>
#include <math.h>
#include <string.h>

/* ---- .npy files ------------------------------------------------------------------------- */

static gboolean npy_write(const char *path, const char *descr, const SimShape *shape,
                          const void *data, size_t elem_size, GError **error)
{
  GString *h = g_string_new(NULL);
  g_string_append_printf(h, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
  for (int d = 0; d < shape->ndim; d++)
    g_string_append_printf(h, "%" G_GINT64_FORMAT "%s", shape->dims[d],
                           shape->ndim == 1 || d + 1 < shape->ndim ? ", " : "");
  g_string_append(h, "), }");
  /* Magic (6), version (2), header length (2), header ending in '\n', all a multiple of 64. */
  while ((10 + h->len + 1) % 64)
    g_string_append_c(h, ' ');
  g_string_append_c(h, '\n');
  int64_t n = sim_shape_numel(shape);
  size_t bytes = (size_t)n * elem_size;
  GString *f = g_string_sized_new(10 + h->len + bytes);
  g_string_append_len(f, "\x93NUMPY\x01\x00", 8);
  g_string_append_c(f, (char)(h->len & 0xff));
  g_string_append_c(f, (char)(h->len >> 8));
  g_string_append_len(f, h->str, (gssize)h->len);
  g_string_append_len(f, data, (gssize)bytes);
  gboolean ok = g_file_set_contents(path, f->str, (gssize)f->len, error);
  g_string_free(h, TRUE);
  g_string_free(f, TRUE);
  return ok;
}

/* Reads a little-endian fp32 .npy array of exactly @shape into @out. */
static gboolean npy_read_f32(const char *path, const SimShape *shape, float *out, GError **error)
{
  g_autofree char *text = NULL;
  gsize len = 0;
  if (!g_file_get_contents(path, &text, &len, error))
    return FALSE;
  if (len < 10 || memcmp(text, "\x93NUMPY", 6) != 0 || text[6] != 1) {
    g_set_error(error, EXEC_ERROR, EXEC_ERROR_UNSUPPORTED,
                "%s: not a NumPy .npy file of format version 1", path);
    return FALSE;
  }
  size_t hl = (size_t)(unsigned char)text[8] | (size_t)(unsigned char)text[9] << 8;
  if (10 + hl > len) {
    g_set_error(error, EXEC_ERROR, EXEC_ERROR_UNSUPPORTED, "%s: header runs past the file's end",
                path);
    return FALSE;
  }
  g_autofree char *header = g_strndup(text + 10, hl);
  if (!strstr(header, "'descr': '<f4'") || !strstr(header, "'fortran_order': False")) {
    g_set_error(error, EXEC_ERROR, EXEC_ERROR_UNSUPPORTED,
                "%s: expected little-endian fp32 ('<f4') in C order, header is %s", path,
                g_strstrip(header));
    return FALSE;
  }
  GString *want = g_string_new("(");
  for (int d = 0; d < shape->ndim; d++)
    g_string_append_printf(want, "%" G_GINT64_FORMAT "%s", shape->dims[d],
                           shape->ndim == 1 || d + 1 < shape->ndim ? ", " : "");
  g_string_append_c(want, ')');
  const char *s = strstr(header, "'shape': ");
  gboolean same = s && strncmp(s + 9, want->str, want->len) == 0;
  if (!same) {
    g_set_error(error, EXEC_ERROR, EXEC_ERROR_UNSUPPORTED, "%s: expected shape %s, header is %s",
                path, want->str, g_strstrip(header));
    g_string_free(want, TRUE);
    return FALSE;
  }
  g_string_free(want, TRUE);
  size_t bytes = (size_t)sim_shape_numel(shape) * sizeof(float);
  if (len - 10 - hl != bytes) {
    g_set_error(error, EXEC_ERROR, EXEC_ERROR_UNSUPPORTED,
                "%s: expected %zu bytes of data, the file holds %zu", path, bytes,
                (size_t)(len - 10 - hl));
    return FALSE;
  }
  memcpy(out, text + 10 + hl, bytes);
  return TRUE;
}

/* ---- what a graph holds ---------------------------------------------------------------- */

/* The first weight @op owns (the ones before belong to the op it shares them with). */
static int first_owned(const SimGraph *g, int op)
{
  int owner = sim_graph_op_weight_owner(g, op);
  return owner == op ? 0 : sim_graph_op_n_weights(g, owner);
}

static gboolean is_integer(SimDType t)
{
  return t == SIM_DTYPE_INT32 || t == SIM_DTYPE_INT64;
}

/* Graph input tensors: the outputs of input ops that something consumes. */
static GArray *graph_inputs(const SimGraph *g)
{
  GArray *a = g_array_new(FALSE, FALSE, sizeof(int));
  for (int op = 0; op < sim_graph_n_ops(g); op++) {
    if (sim_graph_op_type(g, op) != SIM_OP_INPUT)
      continue;
    int t = sim_graph_op_output(g, op, 0);
    if (sim_graph_tensor_n_consumers(g, t) > 0)
      g_array_append_val(a, t);
  }
  return a;
}

/* The dropout probability of @op's random mask, or 0: dropout ops, and attention with
 * dropout on its probabilities. */
static double dropout_p(const SimGraph *g, int op, SimShape *mask)
{
  g_autoptr(SimAttrs) attrs = sim_graph_op_attrs(g, op);
  double p = 0;
  if (sim_graph_op_type(g, op) == SIM_OP_DROPOUT) {
    p = 0.5;
    sim_attrs_get_float(attrs, "p", &p);
    *mask = sim_graph_tensor_shape(g, sim_graph_op_output(g, op, 0));
  } else if (sim_graph_op_type(g, op) == SIM_OP_ATTENTION) {
    sim_attrs_get_float(attrs, "dropout", &p);
    int64_t heads = 1;
    sim_attrs_get_int(attrs, "heads", &heads);
    SimShape q = sim_graph_tensor_shape(g, sim_graph_op_input(g, op, 0));
    SimShape k = sim_graph_tensor_shape(g, sim_graph_op_input(g, op, 1));
    *mask = (SimShape){ .ndim = 4, .dims = { q.dims[0], heads, q.dims[1], k.dims[1] } };
  }
  return p;
}

void exec_input_values(const SimGraph *g, int t, int step, uint64_t seed, void *out)
{
  SimShape full = sim_graph_tensor_shape(g, t);
  SimRegion box = sim_region_full(&full);
  int sample[SIM_MAX_DIMS] = { 0 };
  SimDType dt = is_integer(sim_graph_tensor_dtype(g, t)) ? SIM_DTYPE_INT64 : SIM_DTYPE_FP32;
  exec_input_fill(g, t, &full, &box, sample, 0, step, seed, dt, out);
}

/* ---- writing ---------------------------------------------------------------------------- */

static char *safe_name(const char *name)
{
  char *s = g_strdup(name);
  for (char *p = s; *p; p++)
    if (!g_ascii_isalnum(*p) && *p != '.' && *p != '_' && *p != '-')
      *p = '_';
  return s;
}

/* JSON text: the dump's manifest is small and flat, written by hand so that every
 * double reads back exactly (%.17g). */
static void add_str(GString *j, const char *s)
{
  g_string_append_c(j, '"');
  for (const char *p = s; *p; p++) {
    if (*p == '"' || *p == '\\')
      g_string_append_c(j, '\\');
    g_string_append_c(j, *p);
  }
  g_string_append_c(j, '"');
}

static void add_double(GString *j, double v)
{
  char buf[G_ASCII_DTOSTR_BUF_SIZE];
  g_string_append(j, g_ascii_formatd(buf, sizeof buf, "%.17g", v));
}

static void add_shape(GString *j, const SimShape *s)
{
  g_string_append(j, "\"shape\": [");
  for (int d = 0; d < s->ndim; d++)
    g_string_append_printf(j, "%s%" G_GINT64_FORMAT, d ? ", " : "", s->dims[d]);
  g_string_append(j, "]");
}

static gboolean write_weights(ExecRun *r, const char *dir, const char *sub, gboolean grads,
                              GError **error)
{
  const SimGraph *g = sim_plan_get_graph(exec_run_get_plan(r));
  for (int op = 0; op < sim_graph_n_ops(g); op++)
    for (int i = first_owned(g, op); i < sim_graph_op_n_weights(g, op); i++) {
      SimShape s = sim_graph_op_weight_shape(g, op, i);
      g_autofree float *v = g_new(float, MAX(sim_shape_numel(&s), 1));
      if (!(grads ? exec_run_read_grad : exec_run_read_weight)(r, op, i, v, error))
        return FALSE;
      g_autofree char *name = safe_name(sim_graph_op_name(g, op));
      g_autofree char *file = g_strdup_printf("%s/%s/%s%s.%d.npy", dir, sub,
                                              grads ? "grad." : "", name, i);
      if (!npy_write(file, "<f4", &s, v, sizeof(float), error))
        return FALSE;
    }
  return TRUE;
}

static gboolean make_dir(const char *path, GError **error)
{
  if (g_mkdir_with_parents(path, 0755) != 0) {
    int e = errno;
    g_set_error(error, G_FILE_ERROR, g_file_error_from_errno(e), "cannot create %s: %s", path,
                g_strerror(e));
    return FALSE;
  }
  return TRUE;
}

static const char *optimizer_name(SimOptimizer o)
{
  return o == SIM_OPTIMIZER_ADAM ? "adam" : "sgd";
}

/* manifest.json, rewritten after every step with the losses so far. */
static gboolean write_manifest(ExecRun *r, const char *dir, const double *losses, int steps,
                               GError **error)
{
  const ExecCompiled *c = exec_run_compiled(r);
  const SimGraph *g = c->g;
  GString *j = g_string_new("{\n  \"format\": \"parasol-exec-dump\",\n  \"version\": 1,\n");
  g_string_append_printf(j, "  \"graph\": \"graph.json\",\n  \"seed\": %" G_GUINT64_FORMAT
                         ",\n  \"devices\": %d,\n  \"microbatches\": %d,\n", c->o.seed,
                         c->n_devices, c->M);
  g_string_append_printf(j, "  \"optimizer\": {\"name\": \"%s\"", optimizer_name(c->optimizer));
  const struct { const char *k; double v; } hp[] = {
    { "lr", c->o.lr }, { "momentum", c->o.momentum }, { "beta1", c->o.beta1 },
    { "beta2", c->o.beta2 }, { "eps", c->o.eps }, { "weight_decay", 0.0 },
  };
  for (size_t k = 0; k < G_N_ELEMENTS(hp); k++) {
    g_string_append_printf(j, ", \"%s\": ", hp[k].k);
    add_double(j, hp[k].v);
  }
  g_string_append(j, "},\n  \"weights\": [");
  const char *sep = "\n";
  for (int op = 0; op < sim_graph_n_ops(g); op++)
    for (int i = first_owned(g, op); i < sim_graph_op_n_weights(g, op); i++) {
      SimShape s = sim_graph_op_weight_shape(g, op, i);
      g_autofree char *name = safe_name(sim_graph_op_name(g, op));
      g_autofree char *file = g_strdup_printf("%s.%d.npy", name, i);
      g_string_append_printf(j, "%s    {\"op\": ", sep);
      add_str(j, sim_graph_op_name(g, op));
      g_string_append_printf(j, ", \"index\": %d, ", i);
      add_shape(j, &s);
      g_string_append(j, ", \"file\": ");
      add_str(j, file);
      g_string_append(j, "}");
      sep = ",\n";
    }
  g_string_append(j, "\n  ],\n  \"inputs\": [");
  sep = "\n";
  g_autoptr(GArray) ins = graph_inputs(g);
  for (guint k = 0; k < ins->len; k++) {
    int t = g_array_index(ins, int, k);
    SimShape s = sim_graph_tensor_shape(g, t);
    g_autofree char *name = safe_name(sim_graph_tensor_name(g, t));
    g_autofree char *file = g_strdup_printf("input.%s.npy", name);
    g_string_append_printf(j, "%s    {\"tensor\": ", sep);
    add_str(j, sim_graph_tensor_name(g, t));
    g_string_append_printf(j, ", \"dtype\": \"%s\", ",
                           is_integer(sim_graph_tensor_dtype(g, t)) ? "int64" : "float32");
    add_shape(j, &s);
    g_string_append(j, ", \"file\": ");
    add_str(j, file);
    g_string_append(j, "}");
    sep = ",\n";
  }
  g_string_append(j, "\n  ],\n  \"dropout\": [");
  sep = "\n";
  for (int op = 0; op < sim_graph_n_ops(g); op++) {
    SimShape s;
    double p = dropout_p(g, op, &s);
    if (!(p > 0))
      continue;
    g_autofree char *name = safe_name(sim_graph_op_name(g, op));
    g_autofree char *file = g_strdup_printf("mask.%s.npy", name);
    g_string_append_printf(j, "%s    {\"op\": ", sep);
    add_str(j, sim_graph_op_name(g, op));
    g_string_append(j, ", \"p\": ");
    add_double(j, p);
    g_string_append(j, ", ");
    add_shape(j, &s);
    g_string_append(j, ", \"file\": ");
    add_str(j, file);
    g_string_append(j, "}");
    sep = ",\n";
  }
  g_string_append(j, "\n  ],\n  \"steps\": [");
  sep = "\n";
  for (int k = 0; k < steps; k++) {
    g_string_append_printf(j, "%s    {\"step\": %d, \"dir\": \"step%d\", \"loss\": ", sep, k + 1,
                           k + 1);
    add_double(j, losses[k]);
    g_string_append(j, "}");
    sep = ",\n";
  }
  g_string_append(j, "\n  ]\n}\n");
  g_autofree char *path = g_build_filename(dir, "manifest.json", NULL);
  gboolean ok = g_file_set_contents(path, j->str, (gssize)j->len, error);
  g_string_free(j, TRUE);
  return ok;
}

struct _ExecDump {
  char *dir;
  GArray *losses;   /* double */
};

ExecDump *exec_dump_new(ExecRun *r, const char *dir, GError **error)
{
  g_autofree char *init = g_build_filename(dir, "init", NULL);
  if (!make_dir(init, error))
    return NULL;
  const SimGraph *g = sim_plan_get_graph(exec_run_get_plan(r));
  g_autofree char *json = sim_graph_to_json(g);
  g_autofree char *gpath = g_build_filename(dir, "graph.json", NULL);
  if (!g_file_set_contents(gpath, json, -1, error) || !write_weights(r, dir, "init", FALSE, error))
    return NULL;
  ExecDump *d = g_new0(ExecDump, 1);
  d->dir = g_strdup(dir);
  d->losses = g_array_new(FALSE, FALSE, sizeof(double));
  if (!write_manifest(r, dir, NULL, 0, error)) {
    exec_dump_free(d);
    return NULL;
  }
  return d;
}

void exec_dump_free(ExecDump *d)
{
  if (!d)
    return;
  g_free(d->dir);
  g_array_free(d->losses, TRUE);
  g_free(d);
}

gboolean exec_dump_step(ExecDump *d, ExecRun *r, GError **error)
{
  const ExecCompiled *c = exec_run_compiled(r);
  const SimGraph *g = c->g;
  int step = exec_run_steps_done(r);
  g_autofree char *sub = g_strdup_printf("step%d", step);
  g_autofree char *sdir = g_build_filename(d->dir, sub, NULL);
  if (!make_dir(sdir, error))
    return FALSE;
  g_autoptr(GArray) ins = graph_inputs(g);
  for (guint k = 0; k < ins->len; k++) {
    int t = g_array_index(ins, int, k);
    SimShape s = sim_graph_tensor_shape(g, t);
    gboolean integer = is_integer(sim_graph_tensor_dtype(g, t));
    size_t es = integer ? 8 : 4;
    g_autofree void *v = g_malloc(MAX((size_t)sim_shape_numel(&s) * es, 8));
    exec_input_values(g, t, step, c->o.seed, v);
    g_autofree char *name = safe_name(sim_graph_tensor_name(g, t));
    g_autofree char *file = g_strdup_printf("%s/input.%s.npy", sdir, name);
    if (!npy_write(file, integer ? "<i8" : "<f4", &s, v, es, error))
      return FALSE;
  }
  for (int op = 0; op < sim_graph_n_ops(g); op++) {
    SimShape s;
    double p = dropout_p(g, op, &s);
    if (!(p > 0))
      continue;
    int64_t n = sim_shape_numel(&s);
    g_autofree guint8 *m = g_new(guint8, MAX(n, 1));
    const char *opname = sim_graph_op_name(g, op);
    for (int64_t k = 0; k < n; k++)
      m[k] = exec_dropout_keep(opname, (uint64_t)k, step, p) ? 1 : 0;
    g_autofree char *name = safe_name(opname);
    g_autofree char *file = g_strdup_printf("%s/mask.%s.npy", sdir, name);
    if (!npy_write(file, "|u1", &s, m, 1, error))
      return FALSE;
  }
  if (!write_weights(r, d->dir, sub, TRUE, error) || !write_weights(r, d->dir, sub, FALSE, error))
    return FALSE;
  double loss = exec_run_loss(r);
  g_array_append_val(d->losses, loss);
  return write_manifest(r, d->dir, (double *)(void *)d->losses->data, (int)d->losses->len, error);
}

/* ---- reading initial weights ----------------------------------------------------------- */

gboolean exec_load_weight(gpointer data, const SimGraph *g, int op, int i, float *out,
                          GError **error)
{
  const char *dir = data;
  SimShape s = sim_graph_op_weight_shape(g, op, i);
  g_autofree char *name = safe_name(sim_graph_op_name(g, op));
  g_autofree char *file = g_strdup_printf("%s/init/%s.%d.npy", dir, name, i);
  if (!g_file_test(file, G_FILE_TEST_EXISTS)) {
    g_set_error(error, EXEC_ERROR, EXEC_ERROR_UNSUPPORTED,
                "%s: no such file (weight %d of op '%s'); expected a directory written by "
                "exec --dump", file, i, sim_graph_op_name(g, op));
    return FALSE;
  }
  return npy_read_f32(file, &s, out, error);
}
