/* zoo.c — the model zoo's registry: model parameters ("k=v" text), the list of models,
 * building a model by name and loading a model by name or from a graph file.
 *
 * The families of models live beside this file (mlp.c, cnn.c, rnn.c, transformer.c,
 * llm.c, recsys.c, candle.c); each exports a table of SimZooModel entries and the list below
 * fixes the order in which `parasol models` shows them. */
#include "zoo.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>

/* ---------------------------------------------------------------------------------- */
/* Model parameters                                                                    */

typedef struct {
  char *name;
  int64_t value;
} ParamItem;

struct _SimModelParams {
  GArray *items;                     /* ParamItem, in the order they were first set       */
};

static void param_item_clear(gpointer p)
{
  g_free(((ParamItem *)p)->name);
}

SimModelParams *sim_model_params_new(void)
{
  SimModelParams *p = g_new0(SimModelParams, 1);
  p->items = g_array_new(FALSE, FALSE, sizeof(ParamItem));
  g_array_set_clear_func(p->items, param_item_clear);
  return p;
}

void sim_model_params_free(SimModelParams *p)
{
  if (!p)
    return;
  g_array_unref(p->items);
  g_free(p);
}

void sim_model_params_set(SimModelParams *p, const char *name, int64_t value)
{
  g_return_if_fail(p != NULL && name != NULL);
  for (guint i = 0; i < p->items->len; i++) {
    ParamItem *it = &g_array_index(p->items, ParamItem, i);
    if (!strcmp(it->name, name)) {
      it->value = value;
      return;
    }
  }
  ParamItem it = { g_strdup(name), value };
  g_array_append_val(p->items, it);
}

gboolean sim_model_params_lookup(const SimModelParams *p, const char *name, int64_t *value)
{
  g_return_val_if_fail(name != NULL, FALSE);
  if (!p)
    return FALSE;
  for (guint i = 0; i < p->items->len; i++) {
    const ParamItem *it = &g_array_index(p->items, ParamItem, i);
    if (!strcmp(it->name, name)) {
      if (value)
        *value = it->value;
      return TRUE;
    }
  }
  return FALSE;
}

static gboolean valid_param_name(const char *s)
{
  if (!*s)
    return FALSE;
  for (; *s; s++)
    if (!g_ascii_isalnum(*s) && *s != '_' && *s != '-')
      return FALSE;
  return TRUE;
}

/* Parses "64", "1k", "1.5M", "-3" into @out.  The suffixes are decimal (k = 1000), as
 * the sizes of papers are: "vocab=50k", "rows=40M".  *@too_large is set when @text is a
 * number beyond the 64-bit integers. */
static gboolean parse_value(const char *text, int64_t *out, gboolean *too_large)
{
  *too_large = FALSE;
  const char *end = text;
  while (*end && (g_ascii_isdigit(*end) || *end == '.' || *end == '-' || *end == '+'))
    end++;
  if (end == text)
    return FALSE;
  double scale = 1.0;
  if (*end) {
    switch (*end) {
    case 'k': case 'K': scale = 1e3; break;
    case 'M': scale = 1e6; break;
    case 'G': scale = 1e9; break;
    case 'T': scale = 1e12; break;
    default: return FALSE;
    }
    if (end[1])
      return FALSE;
  }
  g_autofree char *number = g_strndup(text, (gsize)(end - text));
  char *stop = NULL;
  errno = 0;
  if (!strchr(number, '.')) {
    /* Integers are read and scaled exactly, once a floating-point estimate of the
     * product shows that it fits. */
    gint64 v = g_ascii_strtoll(number, &stop, 10);
    if (*stop)
      return FALSE;
    double scaled = (double)v * scale;
    if (errno || (scale != 1.0 && (scaled > (double)INT64_MAX / 2 ||
                                   scaled < (double)INT64_MIN / 2))) {
      *too_large = TRUE;
      return FALSE;
    }
    *out = scale == 1.0 ? v : (int64_t)v * (int64_t)scale;
    return TRUE;
  }
  double v = g_ascii_strtod(number, &stop);
  if (errno || *stop)
    return FALSE;
  v *= scale;
  if (!isfinite(v) || fabs(v) > (double)INT64_MAX / 2) {
    *too_large = TRUE;
    return FALSE;
  }
  if (v != floor(v))
    return FALSE;
  *out = (int64_t)v;
  return TRUE;
}

gboolean sim_model_params_parse(SimModelParams *p, const char *text, GError **error)
{
  g_return_val_if_fail(p != NULL && text != NULL, FALSE);
  g_auto(GStrv) parts = g_strsplit(text, ",", -1);
  /* Parse everything first so that a bad item leaves @p unchanged. */
  guint n = g_strv_length(parts);
  g_autofree char **names = g_new0(char *, n + 1);
  g_autofree int64_t *values = g_new0(int64_t, n + 1);
  for (guint i = 0; i < n; i++) {
    char *item = g_strstrip(parts[i]);
    char *eq = strchr(item, '=');
    if (eq)
      *eq = '\0';
    char *key = eq ? g_strstrip(item) : item;
    char *val = eq ? g_strstrip(eq + 1) : NULL;
    if (!eq || !valid_param_name(key)) {
      g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                  "model parameter '%s': expected NAME=VALUE (\"batch=64\", "
                  "\"layers=24,hidden=2048\")", text);
      return FALSE;
    }
    gboolean too_large;
    if (!parse_value(val, &values[i], &too_large)) {
      if (too_large)
        g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                    "model parameter '%s': '%s' is too large (beyond the 64-bit integers)",
                    key, val);
      else
        g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                    "model parameter '%s': '%s' is not an integer (suffixes k, M, G, T "
                    "multiply by 1000, 10^6, 10^9, 10^12)", key, val);
      return FALSE;
    }
    names[i] = key;
  }
  for (guint i = 0; i < n; i++)
    sim_model_params_set(p, names[i], values[i]);
  return TRUE;
}

/* ---------------------------------------------------------------------------------- */
/* Helpers for the builders                                                            */

int64_t sim_zoo_arg(const SimZooArgs *args, const char *name)
{
  for (int i = 0; args->model->params[i].name; i++)
    if (!strcmp(args->model->params[i].name, name))
      return args->values[i];
  g_critical("zoo model '%s' reads parameter '%s', which its table does not declare",
             args->model->name, name);
  return 0;
}

int sim_zoo_arg_int(const SimZooArgs *args, const char *name)
{
  return (int)sim_zoo_arg(args, name);
}

gboolean sim_zoo_check_divisible(const SimZooArgs *args, const char *a, const char *b,
                                 GError **error)
{
  int64_t va = sim_zoo_arg(args, a), vb = sim_zoo_arg(args, b);
  if (vb > 0 && va % vb == 0)
    return TRUE;
  g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
              "model '%s': %s (%" G_GINT64_FORMAT ") must be a multiple of %s (%"
              G_GINT64_FORMAT ")", args->model->name, a, va, b, vb);
  return FALSE;
}

const char *sim_zoo_name(SimZooName *buf, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  g_vsnprintf(buf->s, sizeof buf->s, fmt, ap);
  va_end(ap);
  return buf->s;
}

int sim_zoo_split(SimGraph *g, const char *name, int x, int axis, int n, const int64_t *sizes,
                  int *outs)
{
  for (int i = 0; i < n; i++)
    outs[i] = -1;
  if (n <= SIM_MAX_DIMS)
    return sim_graph_split(g, name, x, axis, n, sizes, outs);

  /* Consecutive parts are grouped into at most SIM_MAX_DIMS groups; each group is split
   * again.  The depth grows with log(n), and so does the copying of the backward pass. */
  int per = (n + SIM_MAX_DIMS - 1) / SIM_MAX_DIMS;
  int groups = (n + per - 1) / per;
  int64_t group_sizes[SIM_MAX_DIMS] = { 0 };
  int group_outs[SIM_MAX_DIMS];
  for (int i = 0; i < n; i++)
    group_sizes[i / per] += sizes[i];
  if (sim_graph_split(g, name, x, axis, groups, group_sizes, group_outs) < 0)
    return -1;
  for (int k = 0; k < groups; k++) {
    int first = k * per, count = MIN(n, first + per) - first;
    if (count == 1) {
      outs[first] = group_outs[k];
      continue;
    }
    SimZooName sub;
    sim_zoo_split(g, sim_zoo_name(&sub, "%s.%d", name, k), group_outs[k], axis, count,
                  sizes + first, outs + first);
  }
  return outs[0];
}

void sim_zoo_attr_int(SimGraph *g, SimAttrs *attrs, const char *name, int64_t v)
{
  if (!g->sticky_error)
    sim_attrs_set_int(attrs, name, v, &g->sticky_error);
}

void sim_zoo_attr_float(SimGraph *g, SimAttrs *attrs, const char *name, double v)
{
  if (!g->sticky_error)
    sim_attrs_set_float(attrs, name, v, &g->sticky_error);
}

int sim_zoo_add_op(SimGraph *g, SimOpType type, const char *name, int n_inputs,
                   const int *inputs, const SimAttrs *attrs)
{
  if (g->sticky_error)
    return -1;
  int op = sim_graph_add_op(g, type, name, n_inputs, inputs, attrs, &g->sticky_error);
  return op < 0 ? -1 : sim_graph_op_output(g, op, 0);
}

void sim_zoo_share(SimGraph *g, int t, int owner)
{
  if (t < 0 || owner < 0 || g->sticky_error)
    return;
  sim_graph_share_weights(g, sim_graph_tensor_producer(g, t), sim_graph_tensor_producer(g, owner),
                          &g->sticky_error);
}

SimShape sim_zoo_shape(const SimGraph *g, int t)
{
  if (t < 0) {
    SimShape empty = { 0 };
    return empty;
  }
  return sim_graph_tensor_shape(g, t);
}

/* ---------------------------------------------------------------------------------- */
/* The registry                                                                        */

/* The order of `parasol models`: small to large within the kinds of network the papers
 * evaluate (FlexFlow MLSys'19 table 3, Unity OSDI'22 table 2, Megatron-LM SC'21). */
static const SimZooModel *const families[] = {
  sim_zoo_mlp_models,
  sim_zoo_cnn_models,
  sim_zoo_rnn_models,
  sim_zoo_transformer_models,
  sim_zoo_llm_models,
  sim_zoo_recsys_models,
  sim_zoo_candle_models,
};

static const SimZooModel *model_at(int i)
{
  for (size_t f = 0; f < G_N_ELEMENTS(families); f++)
    for (const SimZooModel *m = families[f]; m->name; m++)
      if (i-- == 0)
        return m;
  return NULL;
}

static const SimZooModel *model_lookup(const char *name)
{
  for (size_t f = 0; f < G_N_ELEMENTS(families); f++)
    for (const SimZooModel *m = families[f]; m->name; m++)
      if (!strcmp(m->name, name))
        return m;
  return NULL;
}

int sim_zoo_n_models(void)
{
  int n = 0;
  for (size_t f = 0; f < G_N_ELEMENTS(families); f++)
    for (const SimZooModel *m = families[f]; m->name; m++)
      n++;
  return n;
}

const char *sim_zoo_model_name(int i)
{
  const SimZooModel *m = model_at(i);
  g_return_val_if_fail(m != NULL, NULL);
  return m->name;
}

const char *sim_zoo_model_description(int i)
{
  const SimZooModel *m = model_at(i);
  g_return_val_if_fail(m != NULL, NULL);
  return m->description;
}

const SimModelParam *sim_zoo_model_params(const char *name)
{
  g_return_val_if_fail(name != NULL, NULL);
  const SimZooModel *m = model_lookup(name);
  return m ? m->params : NULL;
}

gboolean sim_model_params_pad_vocab(SimModelParams *params, const char *name, int tp,
                                    int64_t *vocab_default, int64_t *vocab_padded)
{
  g_return_val_if_fail(params != NULL && name != NULL, FALSE);
  const SimModelParam *zoo = sim_zoo_model_params(name);
  int64_t vocab = -1;
  gboolean heads = FALSE;
  for (const SimModelParam *q = zoo; q && q->name; q++) {
    if (!strcmp(q->name, "vocab"))
      vocab = q->value;
    heads |= !strcmp(q->name, "heads");
  }
  int64_t given;
  if (vocab <= 0 || !heads || sim_model_params_lookup(params, "vocab", &given))
    return FALSE;
  int64_t unit = 128 * (int64_t)MAX(tp, 1);
  int64_t padded = (vocab + unit - 1) / unit * unit;
  if (padded == vocab)
    return FALSE;
  sim_model_params_set(params, "vocab", padded);
  if (vocab_default)
    *vocab_default = vocab;
  if (vocab_padded)
    *vocab_padded = padded;
  return TRUE;
}

static char *param_names(const SimZooModel *m)
{
  GString *s = g_string_new(NULL);
  for (int i = 0; m->params[i].name; i++)
    g_string_append_printf(s, "%s%s", i ? ", " : "", m->params[i].name);
  return g_string_free(s, FALSE);
}

/* The model's defaults overridden by @params, each value checked. */
static gboolean resolve_args(const SimZooModel *m, const SimModelParams *params,
                             SimZooArgs *args, GError **error)
{
  args->model = m;
  int n = 0;
  for (; m->params[n].name; n++) {
    g_assert(n < SIM_ZOO_MAX_PARAMS);
    args->values[n] = m->params[n].value;
  }
  for (guint i = 0; params && i < params->items->len; i++) {
    const ParamItem *it = &g_array_index(params->items, ParamItem, i);
    int k = 0;
    while (k < n && strcmp(m->params[k].name, it->name))
      k++;
    if (k == n) {
      g_autofree char *valid = param_names(m);
      g_set_error(error, SIM_ERROR, SIM_ERROR_UNKNOWN,
                  "model '%s' has no parameter '%s'; its parameters are: %s", m->name,
                  it->name, valid);
      return FALSE;
    }
    /* Every parameter counts something (samples, layers, channels, rows), and the
     * graph builders take some of them as int. */
    if (it->value <= 0 || it->value > INT_MAX) {
      g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                  "model '%s': parameter '%s' must be between 1 and %d, not %" G_GINT64_FORMAT,
                  m->name, it->name, INT_MAX, it->value);
      return FALSE;
    }
    args->values[k] = it->value;
  }
  return TRUE;
}

SimGraph *sim_zoo_build(const char *name, const SimModelParams *params, GError **error)
{
  g_return_val_if_fail(name != NULL, NULL);
  const SimZooModel *m = model_lookup(name);
  if (!m) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_UNKNOWN,
                "unknown model '%s'; 'parasol models' lists them", name);
    return NULL;
  }
  SimZooArgs args;
  if (!resolve_args(m, params, &args, error))
    return NULL;
  g_autoptr(SimGraph) g = m->build(m, &args, error);
  if (!g)
    return NULL;
  if (!sim_graph_check(g, error)) {
    g_prefix_error(error, "model '%s': ", m->name);
    return NULL;
  }
  return g_steal_pointer(&g);
}

/* "ResNet_50" and "resnet50" find "resnet-50": names folded to lower-case alphanumerics. */
static char *fold_name(const char *s)
{
  GString *out = g_string_new(NULL);
  for (; *s; s++)
    if (g_ascii_isalnum(*s))
      g_string_append_c(out, g_ascii_tolower(*s));
  return g_string_free(out, FALSE);
}

static const SimZooModel *model_lookup_folded(const char *name)
{
  g_autofree char *want = fold_name(name);
  for (size_t f = 0; f < G_N_ELEMENTS(families); f++)
    for (const SimZooModel *m = families[f]; m->name; m++) {
      g_autofree char *have = fold_name(m->name);
      if (!strcmp(have, want))
        return m;
    }
  return NULL;
}

char **sim_model_params_names(const SimModelParams *p)
{
  GPtrArray *names = g_ptr_array_new();
  for (guint i = 0; p && i < p->items->len; i++)
    g_ptr_array_add(names, g_strdup(g_array_index(p->items, ParamItem, i).name));
  g_ptr_array_add(names, NULL);
  return (char **)g_ptr_array_free(names, FALSE);
}

SimGraph *sim_model_load(const char *name_or_file, const SimModelParams *params,
                         GError **error)
{
  g_return_val_if_fail(name_or_file != NULL, NULL);
  if (model_lookup(name_or_file)) {
    /* In the precision the program trains in by default (mixed fp16: cli/sim-options.c),
     * so that a caller of the library simulates what `parasol simulate` does. */
    SimGraph *g = sim_zoo_build(name_or_file, params, error);
    if (g)
      sim_graph_set_float_dtype(g, SIM_DTYPE_FP16);
    return g;
  }

  /* An ONNX model takes the parameters that name its symbolic dimensions. */
  if (g_str_has_suffix(name_or_file, ".onnx"))
    return sim_onnx_import(name_or_file, params, error);
  gboolean looks_like_path = strchr(name_or_file, G_DIR_SEPARATOR) != NULL ||
                             g_str_has_suffix(name_or_file, ".json");
  if (looks_like_path || g_file_test(name_or_file, G_FILE_TEST_EXISTS)) {
    /* A graph file fixes every shape but the batch: silently ignoring another --param
     * would let a user believe the model had changed. */
    int64_t batch = 0;
    for (guint i = 0; params && i < params->items->len; i++) {
      const ParamItem *it = &g_array_index(params->items, ParamItem, i);
      if (strcmp(it->name, "batch") != 0) {
        g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                    "%s: a graph file takes only --param batch=N; other model parameters "
                    "(%s=...) apply to zoo models", name_or_file, it->name);
        return NULL;
      }
      batch = it->value;
    }
    return sim_graph_load_with_batch(name_or_file, batch, error);
  }

  const SimZooModel *close = model_lookup_folded(name_or_file);
  if (close)
    g_set_error(error, SIM_ERROR, SIM_ERROR_UNKNOWN,
                "unknown model '%s' (did you mean '%s'?); 'parasol models' lists them",
                name_or_file, close->name);
  else
    g_set_error(error, SIM_ERROR, SIM_ERROR_UNKNOWN,
                "unknown model '%s'; 'parasol models' lists them", name_or_file);
  return NULL;
}
