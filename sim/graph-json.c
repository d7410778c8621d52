/* graph-json.c — graphs as JSON files ("format": "parasol-graph", "version": 1).
 *
 *   {
 *     "format": "parasol-graph", "version": 1, "name": "mlp", "tokens_per_sample": 1,
 *     "ops": [
 *       {"name": "x", "type": "input", "inputs": [], "attrs": {"shape": [64, 784],
 *        "dtype": "fp32"}, "outputs": ["x"]},
 *       {"name": "fc1", "type": "linear", "inputs": ["x"], "attrs": {"out_features": 512,
 *        "bias": true, "activation": "relu"}, "outputs": ["fc1"], "checkpoint": true},
 *       ...
 *     ]
 *   }
 *
 * Ops come in topological order.  An op's "inputs" name tensors made by earlier ops.
 * Tensors are named by their op's "outputs"; without that key an op's single output is
 * named like the op and the outputs of a multi-output op (split) are "NAME:0", "NAME:1",
 * and so on; "NAME:i" also reaches output i of op NAME whatever the outputs are called.
 * Attributes are written in full (defaults included) as JSON numbers, booleans, strings
 * for enumerated values and arrays of integers.  Input ops may also carry "shape" and
 * "dtype" next to "attrs".  "checkpoint" and "selective_recompute" are written only when
 * true.  The writer prints one op per line, and writing what was read gives the same
 * text back. */
#include "sim-private.h"
#include "json-read.h"

#include <json-glib/json-glib.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define GRAPH_FORMAT "parasol-graph"
#define GRAPH_VERSION 1

/* ---------------------------------------------------------------------------------- */
/* Writing                                                                             */


/* The shortest of %.15g and %.17g that reads back as the same double, with a decimal
 * point so that it reads back as a number with a fraction. */
static void append_double(GString *s, double v)
{
  char buf[G_ASCII_DTOSTR_BUF_SIZE];
  g_ascii_formatd(buf, sizeof buf, "%.15g", v);
  if (g_ascii_strtod(buf, NULL) != v)
    g_ascii_formatd(buf, sizeof buf, "%.17g", v);
  g_string_append(s, buf);
  if (!strpbrk(buf, ".eEn"))
    g_string_append(s, ".0");
}

static void append_attr(GString *s, const SimAttrSpec *spec, const SimAttrValue *v)
{
  switch (spec->type) {
  case SIM_ATTR_INT:
    g_string_append_printf(s, "%" G_GINT64_FORMAT, v->i[0]);
    break;
  case SIM_ATTR_BOOL:
    g_string_append(s, v->i[0] ? "true" : "false");
    break;
  case SIM_ATTR_FLOAT:
    append_double(s, v->f);
    break;
  case SIM_ATTR_INTS:
    g_string_append_c(s, '[');
    for (int j = 0; j < v->n; j++)
      g_string_append_printf(s, "%s%" G_GINT64_FORMAT, j ? ", " : "", v->i[j]);
    g_string_append_c(s, ']');
    break;
  case SIM_ATTR_ENUM:
    sim_json_append_string(s, spec->enum_names[v->i[0]]);
    break;
  }
}

char *sim_graph_to_json(const SimGraph *g)
{
  g_return_val_if_fail(g != NULL, NULL);
  GString *s = g_string_new("{\n");
  g_string_append_printf(s, "  \"format\": \"%s\",\n  \"version\": %d,\n  \"name\": ",
                         GRAPH_FORMAT, GRAPH_VERSION);
  sim_json_append_string(s, g->name);
  g_string_append_printf(s, ",\n  \"tokens_per_sample\": %" G_GINT64_FORMAT ",\n",
                         g->tokens_per_sample);
  g_string_append(s, "  \"ops\": [");
  for (guint i = 0; i < g->ops->len; i++) {
    const SimOp *op = sim_graph_op_get(g, (int)i);
    const SimOpClass *c = sim_op_class(op->type);
    g_string_append(s, i ? ",\n    {\"name\": " : "\n    {\"name\": ");
    sim_json_append_string(s, op->name);
    g_string_append(s, ", \"type\": ");
    sim_json_append_string(s, c->name);
    g_string_append(s, ", \"inputs\": [");
    for (int j = 0; j < op->n_inputs; j++) {
      if (j)
        g_string_append(s, ", ");
      sim_json_append_string(s, sim_graph_tensor_get(g, op->inputs[j])->name);
    }
    g_string_append(s, "], \"attrs\": {");
    for (int j = 0; j < c->n_attrs; j++) {
      if (j)
        g_string_append(s, ", ");
      sim_json_append_string(s, c->attrs[j].name);
      g_string_append(s, ": ");
      append_attr(s, &c->attrs[j], &op->attrs[j]);
    }
    g_string_append(s, "}, \"outputs\": [");
    for (int j = 0; j < op->n_outputs; j++) {
      if (j)
        g_string_append(s, ", ");
      sim_json_append_string(s, sim_graph_tensor_get(g, op->outputs[j])->name);
    }
    g_string_append_c(s, ']');
    if (op->checkpoint)
      g_string_append(s, ", \"checkpoint\": true");
    if (op->selective_recompute)
      g_string_append(s, ", \"selective_recompute\": true");
    if (op->weight_owner != op->id) {
      g_string_append(s, ", \"shares_weights_of\": ");
      sim_json_append_string(s, sim_graph_op_get(g, op->weight_owner)->name);
    }
    g_string_append_c(s, '}');
  }
  g_string_append(s, g->ops->len ? "\n  ]\n}\n" : "]\n}\n");
  return g_string_free(s, FALSE);
}

gboolean sim_graph_save(const SimGraph *g, const char *path, GError **error)
{
  g_return_val_if_fail(g != NULL && path != NULL, FALSE);
  g_autofree char *text = sim_graph_to_json(g);
  g_autoptr(GError) err = NULL;
  if (!g_file_set_contents(path, text, -1, &err)) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_IO, "cannot write the graph: %s", err->message);
    return FALSE;
  }
  return TRUE;
}

/* ---------------------------------------------------------------------------------- */
/* Reading                                                                             */

typedef struct {
  SimJsonReader j;      /* the shared reader (base/json-read.h) */
  SimGraph *g;
  GHashTable *tensors;  /* tensor name -> tensor id + 1 */
  /* With --param batch=N: dimension 0 of every input and reshape, a multiple of the
   * file's batch @batch_from, is scaled to @batch_to (0: as written). */
  int64_t batch_from, batch_to;
} Reader;

static gboolean holds(JsonNode *n, GType t)
{
  return n && JSON_NODE_HOLDS_VALUE(n) && json_node_get_value_type(n) == t;
}

/* Sets one attribute from a JSON value, dispatching on the JSON type; the attribute's own
 * type is checked by the setters, whose messages name the op type and the attribute. */
static gboolean read_attr(SimAttrs *a, const char *name, JsonNode *v, GError **error)
{
  if (holds(v, G_TYPE_INT64))
    return sim_attrs_set_int(a, name, json_node_get_int(v), error);
  if (holds(v, G_TYPE_DOUBLE))
    return sim_attrs_set_float(a, name, json_node_get_double(v), error);
  if (holds(v, G_TYPE_BOOLEAN))
    return sim_attrs_set_int(a, name, json_node_get_boolean(v) ? 1 : 0, error);
  if (holds(v, G_TYPE_STRING))
    return sim_attrs_set_string(a, name, json_node_get_string(v), error);
  if (v && JSON_NODE_HOLDS_ARRAY(v)) {
    JsonArray *arr = json_node_get_array(v);
    guint n = json_array_get_length(arr);
    int64_t vals[SIM_MAX_DIMS];
    for (guint j = 0; j < n; j++) {
      JsonNode *e = json_array_get_element(arr, j);
      if (!holds(e, G_TYPE_INT64)) {
        g_autofree char *got = sim_json_describe(e);
        g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                    "attribute '%s': element %u is %s, not an integer", name, j, got);
        return FALSE;
      }
      if (j < SIM_MAX_DIMS)
        vals[j] = json_node_get_int(e);
    }
    return sim_attrs_set_ints(a, name, (int)n, vals, error);
  }
  g_autofree char *got = sim_json_describe(v);
  g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID, "attribute '%s' is %s", name, got);
  return FALSE;
}

/* The tensor @ref names: an output name, or "OP:i" for output i of op OP. */
static int resolve_tensor(Reader *r, const char *ref)
{
  int t = GPOINTER_TO_INT(g_hash_table_lookup(r->tensors, ref)) - 1;
  if (t >= 0)
    return t;
  const char *colon = strrchr(ref, ':');
  if (!colon || !colon[1])
    return -1;
  g_autofree char *opname = g_strndup(ref, colon - ref);
  char *end = NULL;
  long i = strtol(colon + 1, &end, 10);
  int op = sim_graph_op_by_name(r->g, opname);
  if (op < 0 || *end || i < 0 || i >= sim_graph_op_n_outputs(r->g, op))
    return -1;
  return sim_graph_op_output(r->g, op, (int)i);
}

/* Scales dimension 0 of an input's or a reshape's "shape" from the file's batch to the
 * one asked for: the graph's convention is that dimension 0 of every tensor holds the
 * samples (sim_graph_batch_size() in sim/graph.c), or samples times tokens where a
 * reshape folds them together. */
static gboolean rebatch(Reader *r, SimAttrs *attrs, const char *place)
{
  const SimOpClass *c = sim_op_class(attrs->type);
  SimAttrValue *v = NULL;
  for (int k = 0; k < c->n_attrs; k++)
    if (!strcmp(c->attrs[k].name, "shape"))
      v = &attrs->v[k];
  if (!v || v->n < 1 || v->i[0] == -1)
    return TRUE;
  if (v->i[0] % r->batch_from != 0)
    return sim_json_fail(&r->j, SIM_ERROR_INVALID, place,
                       "dimension 0 of \"shape\" is %" G_GINT64_FORMAT ", not a multiple of "
                       "the batch %" G_GINT64_FORMAT ", so --param batch cannot scale it",
                       v->i[0], r->batch_from);
  v->i[0] = v->i[0] / r->batch_from * r->batch_to;
  return TRUE;
}

static gboolean read_op(Reader *r, guint index, JsonNode *node)
{
  g_autofree char *place = g_strdup_printf("ops[%u]", index);
  JsonObject *o;
  if (!sim_json_object(&r->j, node, place, &o))
    return FALSE;

  const char *name = NULL;
  if (json_object_has_member(o, "name")) {
    g_autofree char *pn = sim_json_place_key(place, "name");
    if (!sim_json_string(&r->j, json_object_get_member(o, "name"), pn, &name))
      return FALSE;
    g_free(place);
    place = g_strdup_printf("ops[%u] ('%s')", index, name);
  }

  /* "shape" and "dtype" may stand beside "attrs" in an input op. */
  static const char *const known[] = {
    "name", "type", "inputs", "attrs", "outputs", "checkpoint", "selective_recompute",
    "shares_weights_of", "shape", "dtype", NULL,
  };
  if (!sim_json_check_keys(&r->j, o, place, known))
    return FALSE;

  JsonNode *tn = json_object_get_member(o, "type");
  g_autofree char *ptype = sim_json_place_key(place, "type");
  if (!tn)
    return sim_json_missing(&r->j, place, "type", "an op type name");
  const char *tname;
  if (!sim_json_string(&r->j, tn, ptype, &tname))
    return FALSE;
  int type = sim_op_type_from_name(tname);
  if (type < 0) {
    GString *all = g_string_new(NULL);
    for (int t = 0; t < SIM_OP_COUNT; t++)
      g_string_append_printf(all, "%s%s", t ? ", " : "", sim_op_type_name(t));
    sim_json_fail(&r->j, SIM_ERROR_UNKNOWN, place, "unknown op type '%s' (known: %s)", tname,
                  all->str);
    g_string_free(all, TRUE);
    return FALSE;
  }

  /* Inputs. */
  int n_inputs = 0;
  g_autofree int *inputs = NULL;
  if (json_object_has_member(o, "inputs")) {
    g_autofree char *pin = sim_json_place_key(place, "inputs");
    JsonArray *arr;
    if (!sim_json_array(&r->j, json_object_get_member(o, "inputs"), pin, &arr))
      return FALSE;
    n_inputs = (int)json_array_get_length(arr);
    inputs = g_new(int, MAX(n_inputs, 1));
    for (int j = 0; j < n_inputs; j++) {
      g_autofree char *pj = sim_json_place_index(pin, (guint)j);
      const char *ref;
      if (!sim_json_string(&r->j, json_array_get_element(arr, (guint)j), pj, &ref))
        return FALSE;
      inputs[j] = resolve_tensor(r, ref);
      if (inputs[j] < 0)
        return sim_json_fail(&r->j, SIM_ERROR_UNKNOWN, place,
                             "inputs[%d] names tensor '%s', which no earlier op makes", j, ref);
    }
  }

  /* Attributes, with an input's "shape" and "dtype" allowed beside them. */
  g_autoptr(SimAttrs) attrs = sim_attrs_new(type);
  g_autoptr(GError) err = NULL;
  if (json_object_has_member(o, "attrs")) {
    g_autofree char *pa = sim_json_place_key(place, "attrs");
    JsonObject *ao;
    if (!sim_json_object(&r->j, json_object_get_member(o, "attrs"), pa, &ao))
      return FALSE;
    g_autoptr(GList) names = json_object_get_members(ao);
    for (GList *it = names; it; it = it->next)
      if (!read_attr(attrs, it->data, json_object_get_member(ao, it->data), &err))
        return sim_json_fail(&r->j, err->code, place, "%s", err->message);
  }
  static const char *const beside[] = { "shape", "dtype" };
  for (gsize k = 0; k < G_N_ELEMENTS(beside); k++) {
    if (!json_object_has_member(o, beside[k]))
      continue;
    if (type != SIM_OP_INPUT)
      return sim_json_fail(&r->j, SIM_ERROR_PARSE, place,
                           "\"%s\" beside \"attrs\" is for input ops only", beside[k]);
    if (!read_attr(attrs, beside[k], json_object_get_member(o, beside[k]), &err))
      return sim_json_fail(&r->j, err->code, place, "%s", err->message);
  }

  /* Flags. */
  gboolean flags[2] = { FALSE, FALSE };
  static const char *const flag_names[2] = { "checkpoint", "selective_recompute" };
  for (int k = 0; k < 2; k++) {
    if (!json_object_has_member(o, flag_names[k]))
      continue;
    g_autofree char *pf = sim_json_place_key(place, flag_names[k]);
    if (!sim_json_bool(&r->j, json_object_get_member(o, flag_names[k]), pf, &flags[k]))
      return FALSE;
  }

  JsonArray *outputs = NULL;
  if (json_object_has_member(o, "outputs")) {
    g_autofree char *pout = sim_json_place_key(place, "outputs");
    if (!sim_json_array(&r->j, json_object_get_member(o, "outputs"), pout, &outputs))
      return FALSE;
    for (guint j = 0; j < json_array_get_length(outputs); j++) {
      g_autofree char *pj = sim_json_place_index(pout, j);
      const char *out_name;
      if (!sim_json_string(&r->j, json_array_get_element(outputs, j), pj, &out_name))
        return FALSE;
    }
  }

  if (r->batch_to > 0 && (type == SIM_OP_INPUT || type == SIM_OP_RESHAPE) &&
      !rebatch(r, attrs, place))
    return FALSE;

  /* Shape inference runs again here; its messages name the op. */
  int op = sim_graph_add_op(r->g, type, name, n_inputs, inputs, attrs, &err);
  if (op < 0) {
    g_autofree char *short_place = g_strdup_printf("ops[%u]", index);
    return sim_json_fail(&r->j, err->code, short_place, "%s", err->message);
  }
  SimOp *o_op = sim_graph_op_get(r->g, op);
  o_op->checkpoint = flags[0];
  o_op->selective_recompute = flags[1];
  if (json_object_has_member(o, "shares_weights_of")) {
    g_autofree char *pw = sim_json_place_key(place, "shares_weights_of");
    const char *owner_name;
    if (!sim_json_string(&r->j, json_object_get_member(o, "shares_weights_of"), pw,
                         &owner_name))
      return FALSE;
    int owner = sim_graph_op_by_name(r->g, owner_name);
    if (owner < 0)
      return sim_json_fail(&r->j, SIM_ERROR_UNKNOWN, place,
                           "\"shares_weights_of\": no earlier op is named '%s'", owner_name);
    if (!sim_graph_share_weights(r->g, op, owner, &err))
      return sim_json_fail(&r->j, err->code, place, "%s", err->message);
  }

  if (outputs && (int)json_array_get_length(outputs) != o_op->n_outputs)
    return sim_json_fail(&r->j, SIM_ERROR_INVALID, place, "\"outputs\" names %u tensors but the "
                         "op makes %d", json_array_get_length(outputs), o_op->n_outputs);
  for (int j = 0; j < o_op->n_outputs; j++) {
    SimTensor *t = sim_graph_tensor_get(r->g, o_op->outputs[j]);
    if (outputs) {
      const char *tname2 = json_array_get_string_element(outputs, j);
      if (!*tname2)
        return sim_json_fail(&r->j, SIM_ERROR_INVALID, place, "outputs[%d] is an empty name", j);
      g_free(t->name);
      t->name = g_strdup(tname2);
    }
    if (g_hash_table_contains(r->tensors, t->name))
      return sim_json_fail(&r->j, SIM_ERROR_INVALID, place,
                           "tensor name '%s' is already taken by an earlier op", t->name);
    g_hash_table_insert(r->tensors, g_strdup(t->name), GINT_TO_POINTER(t->id + 1));
  }
  return TRUE;
}

static SimGraph *graph_from_json(const char *text, const char *filename, int64_t batch_from,
                                 int64_t batch_to, GError **error);

SimGraph *sim_graph_from_json(const char *text, const char *filename, GError **error)
{
  return graph_from_json(text, filename, 0, 0, error);
}

SimGraph *sim_graph_from_json_with_batch(const char *text, const char *filename,
                                         int64_t batch, GError **error)
{
  g_return_val_if_fail(text != NULL && batch >= 0, NULL);
  SimGraph *g = graph_from_json(text, filename, 0, 0, error);
  if (!g || batch == 0 || sim_graph_batch_size(g) == batch)
    return g;
  int64_t from = sim_graph_batch_size(g);
  sim_graph_free(g);
  if (from < 1) {
    sim_set_error_at(error, SIM_ERROR_INVALID, filename ? filename : "<graph>", "ops",
                     "the graph has no input whose dimension 0 is a batch to set");
    return NULL;
  }
  /* Read again with the inputs and reshapes scaled; shape inference carries the new
   * batch through the other ops. */
  return graph_from_json(text, filename, from, batch, error);
}

static SimGraph *graph_from_json(const char *text, const char *filename, int64_t batch_from,
                                 int64_t batch_to, GError **error)
{
  g_return_val_if_fail(text != NULL, NULL);
  const char *fname = filename ? filename : "<graph>";
  SimJsonReader jr = SIM_JSON_READER(fname, error);
  g_autoptr(JsonParser) parser = json_parser_new();
  JsonObject *o = sim_json_read_root(&jr, parser, text, GRAPH_FORMAT);
  if (!o || !sim_json_check_format(&jr, o, GRAPH_FORMAT, GRAPH_VERSION))
    return NULL;
  /* A misspelt key would otherwise leave its value at the default without a word. */
  static const char *const top_keys[] = { "format", "version", "name", "tokens_per_sample",
                                          "ops", NULL };
  if (!sim_json_check_keys(&jr, o, "", top_keys))
    return NULL;
  const char *name = "graph";
  JsonNode *nn = json_object_get_member(o, "name");
  if (nn && !sim_json_string(&jr, nn, "name", &name))
    return NULL;
  int64_t tokens = 1;
  JsonNode *tk = json_object_get_member(o, "tokens_per_sample");
  if (tk && !sim_json_int(&jr, tk, "tokens_per_sample", 1, G_MAXINT64, &tokens))
    return NULL;
  JsonNode *ops = json_object_get_member(o, "ops");
  JsonArray *arr;
  if (!ops) {
    sim_json_missing(&jr, "", "ops", "an array of ops");
    return NULL;
  }
  if (!sim_json_array(&jr, ops, "ops", &arr))
    return NULL;

  if (json_array_get_length(arr) == 0) {
    sim_set_error_at(error, SIM_ERROR_INVALID, fname, "ops",
                     "the graph has no ops; expected at least an input");
    return NULL;
  }
  g_autoptr(SimGraph) g = sim_graph_new(name);
  g->tokens_per_sample = tokens;
  Reader r = {
    .j = jr,
    .g = g,
    .tensors = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL),
    .batch_from = batch_from,
    .batch_to = batch_to,
  };
  gboolean ok = TRUE;
  for (guint i = 0; ok && i < json_array_get_length(arr); i++)
    ok = read_op(&r, i, json_array_get_element(arr, i));
  g_hash_table_unref(r.tensors);
  return ok ? g_steal_pointer(&g) : NULL;
}

SimGraph *sim_graph_load(const char *path, GError **error)
{
  return sim_graph_load_with_batch(path, 0, error);
}

SimGraph *sim_graph_load_with_batch(const char *path, int64_t batch, GError **error)
{
  g_return_val_if_fail(path != NULL, NULL);
  g_autofree char *text = NULL;
  g_autoptr(GError) err = NULL;
  if (!sim_read_file(path, &text, NULL, &err)) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_IO, "cannot read the graph: %s", err->message);
    return NULL;
  }
  return sim_graph_from_json_with_batch(text, path, batch, error);
}
