/* strategy-json.c — strategies as JSON files ("format": "parasol-strategy", "version": 1).
 *
 * A strategy file is meant to be read and edited by hand, so the writer puts every
 * operator on one line and the reader is strict: unknown keys, unknown names and
 * impossible values are errors that name the file and the JSON place ("ops.fc1.degrees.n",
 * "stages[2].devices[0]", "sync.algorithm").
 *
 *   {
 *     "format": "parasol-strategy", "version": 1,
 *     "model": "gpt",                      (informative: the graph's name)
 *     "microbatches": 8,
 *     "schedule": "1f1b" | "gpipe" | "interleaved",  "chunks": 1,
 *     "sync": {"algorithm": "ring" | "tree" | "hierarchical", "bucket_MB": 25, "overlap": true},
 *     "memory": {"recompute": "none" | "selective" | "full", "zero": 0 | 1 | 2 | 3,
 *                "precision": "fp32" | "mixed-fp16" | "mixed-bf16" | "tf32" | "fp8", "optimizer": "adam" | "sgd"},
 *     "sequence_parallel": false,
 *     "pipeline_scatter_gather": false,   (optional; see SimStrategy.scatter_gather)
 *     "tp_comm_overlap": false,           (optional; see SimStrategy.tp_comm_overlap)
 *     "tp_overlap": {"chunks": 0, "sms_attention": 24, "sms_other": 16},
 *                                         (optional, each field too; written where not these
 *                                          defaults; sim_strategy_set_tp_overlap())
 *     "context_parallel": 1,              (optional; sim_strategy_set_context_parallel())
 *     "rewrites": ["fuse-qkv", ...],
 *     "stages": [{"devices": [0, 1]}, {"devices": {"start": 2, "count": 2, "stride": 1}}],
 *     "default": {"degrees": {"b": 4}, "devices": [0, 1, 2, 3], "stage": 0},
 *     "ops": {"fc1": {"degrees": {"b": 2, "n": 4}, "devices": [...], "stage": 0},
 *             "ln": {"degrees": {"b": 2}, "replicas": 4, "devices": [...]}, ...}
 *   }
 *
 * Every operator of the graph needs a configuration: either its own entry under "ops" or
 * the top-level "default", which then applies to every operator not listed.  A missing
 * operator without a default is an error, because silently running it on device 0 would
 * hide a strategy written for another model.  In "default", degrees name dimensions that
 * only some operators have; each operator takes the ones it has.
 *
 * "replicas" (default 1) computes every shard that many times, on distinct devices; the
 * device list then holds the copies of each shard next to each other, as SimOpConfig does.
 *
 * "bucket_MB" counts mebibytes (2^20 bytes), as PyTorch's bucket_cap_mb does.  Devices are
 * a list or, for arithmetic progressions, {"start", "count", "stride" (default 1)}.
 * Without "stages" all operators form one stage on the devices they use; with several
 * stages every operator names its "stage". */
#include "sim-private.h"
#include "json-read.h"

#include <json-glib/json-glib.h>
#include <math.h>
#include <string.h>

#define BYTES_PER_MB 1048576.0

/* ---------------------------------------------------------------------------------- */
/* Writing                                                                            */


/* Long runs of evenly spaced devices (the usual case) are written in the compact form. */
static void put_devices(GString *out, const int *dev, int n)
{
  gboolean progression = n >= 4;
  for (int i = 2; progression && i < n; i++)
    if (dev[i] - dev[i - 1] != dev[1] - dev[0])
      progression = FALSE;
  if (progression) {
    g_string_append_printf(out, "{\"start\": %d, \"count\": %d, \"stride\": %d}", dev[0], n,
                           dev[1] - dev[0]);
    return;
  }
  g_string_append_c(out, '[');
  for (int i = 0; i < n; i++)
    g_string_append_printf(out, i ? ", %d" : "%d", dev[i]);
  g_string_append_c(out, ']');
}

static void put_bucket(GString *out, int64_t bytes)
{
  if (bytes % (int64_t)BYTES_PER_MB == 0) {
    g_string_append_printf(out, "%" G_GINT64_FORMAT, bytes / (int64_t)BYTES_PER_MB);
  } else {
    /* Dividing by a power of two is exact, so 17 significant digits read back to the
     * same number of bytes. */
    char buf[G_ASCII_DTOSTR_BUF_SIZE];
    g_string_append(out, g_ascii_formatd(buf, sizeof buf, "%.17g", (double)bytes / BYTES_PER_MB));
  }
}

char *sim_strategy_to_json(const SimStrategy *s, const SimGraph *g)
{
  g_return_val_if_fail(s != NULL && g != NULL, NULL);
  g_return_val_if_fail(s->n_ops == sim_graph_n_ops(g), NULL);

  GString *out = g_string_new("{\n");
  g_string_append(out, "  \"format\": \"parasol-strategy\",\n  \"version\": 1,\n  \"model\": ");
  sim_json_append_string(out, sim_graph_get_name(g));
  g_string_append_printf(out, ",\n  \"microbatches\": %d,\n", s->microbatches);
  g_string_append_printf(out, "  \"schedule\": \"%s\",\n  \"chunks\": %d,\n",
                         sim_schedule_name(s->schedule), s->chunks);
  g_string_append_printf(out, "  \"sync\": {\"algorithm\": \"%s\", \"bucket_MB\": ",
                         sim_allreduce_algo_name(s->sync.algorithm));
  put_bucket(out, s->sync.bucket_bytes);
  g_string_append_printf(out, ", \"overlap\": %s},\n", s->sync.overlap ? "true" : "false");
  g_string_append_printf(out,
                         "  \"memory\": {\"recompute\": \"%s\", \"zero\": %d, \"precision\": "
                         "\"%s\", \"optimizer\": \"%s\"",
                         sim_recompute_name(s->memory.recompute),
                         s->memory.zero3 ? 3 : s->memory.zero2 ? 2 : s->memory.zero1 ? 1 : 0,
                         sim_precision_name(s->memory.precision),
                         sim_optimizer_name(s->memory.optimizer));
  if (s->memory.offload > 0) {
    char buf[G_ASCII_DTOSTR_BUF_SIZE];
    g_string_append_printf(out, ", \"offload_optimizer\": %s",
                           s->memory.offload >= 1
                             ? "true"
                             : g_ascii_formatd(buf, sizeof buf, "%.17g", s->memory.offload));
    if (s->memory.offload_overlap)
      g_string_append(out, ", \"offload_overlap\": true");
  }
  g_string_append(out, "},\n");
  g_string_append_printf(out, "  \"sequence_parallel\": %s,\n",
                         s->sequence_parallel ? "true" : "false");
  if (s->scatter_gather)
    g_string_append(out, "  \"pipeline_scatter_gather\": true,\n");
  if (s->tp_comm_overlap)
    g_string_append(out, "  \"tp_comm_overlap\": true,\n");
  SimTpOverlap tpo = sim_tp_overlap_default();
  if (memcmp(&s->tp_overlap, &tpo, sizeof tpo))
    g_string_append_printf(out, "  \"tp_overlap\": {\"chunks\": %d, \"sms_attention\": %d, "
                           "\"sms_other\": %d},\n", s->tp_overlap.chunks,
                           s->tp_overlap.sms_attention, s->tp_overlap.sms_other);
  if (s->cp > 1)
    g_string_append_printf(out, "  \"context_parallel\": %d,\n", s->cp);
  g_string_append(out, "  \"rewrites\": [");
  for (guint i = 0; i < s->rewrites->len; i++) {
    if (i)
      g_string_append(out, ", ");
    sim_json_append_string(out, g_ptr_array_index(s->rewrites, i));
  }
  g_string_append(out, "],\n  \"stages\": [\n");
  for (int st = 0; st < s->n_stages; st++) {
    g_string_append(out, "    {\"devices\": ");
    put_devices(out, s->stage_devices[st], s->stage_n_devices[st]);
    g_string_append(out, st + 1 < s->n_stages ? "},\n" : "}\n");
  }
  g_string_append(out, "  ],\n  \"ops\": {\n");
  for (int i = 0; i < s->n_ops; i++) {
    const SimOpConfig *c = &s->ops[i];
    g_string_append(out, "    ");
    sim_json_append_string(out, sim_graph_op_name(g, i));
    g_string_append(out, ": {\"degrees\": {");
    gboolean first = TRUE;
    int nd = MIN(sim_graph_op_n_dims(g, i), SIM_MAX_ITER);
    for (int d = 0; d < nd; d++) {
      if (c->degree[d] == 1)
        continue;
      if (!first)
        g_string_append(out, ", ");
      sim_json_append_string(out, sim_graph_op_dim_name(g, i, d));
      g_string_append_printf(out, ": %d", c->degree[d]);
      first = FALSE;
    }
    g_string_append(out, "}, ");
    if (c->replicas > 1)
      g_string_append_printf(out, "\"replicas\": %d, ", c->replicas);
    g_string_append(out, "\"devices\": ");
    put_devices(out, c->devices, c->n_shards);
    if (s->n_stages > 1)
      g_string_append_printf(out, ", \"stage\": %d", s->op_stage[i]);
    g_string_append(out, i + 1 < s->n_ops ? "},\n" : "}\n");
  }
  g_string_append(out, "  }\n}\n");
  return g_string_free(out, FALSE);
}

gboolean sim_strategy_save(const SimStrategy *s, const SimGraph *g, const char *path,
                           GError **error)
{
  g_return_val_if_fail(s != NULL && g != NULL && path != NULL, FALSE);
  g_autofree char *text = sim_strategy_to_json(s, g);
  g_autoptr(GError) local = NULL;
  if (!g_file_set_contents(path, text, -1, &local)) {
    sim_set_error_at(error, SIM_ERROR_IO, path, NULL, "cannot write the strategy: %s",
                     local->message);
    return FALSE;
  }
  return TRUE;
}

/* ---------------------------------------------------------------------------------- */
/* Reading                                                                            */

/* The shared reader (base/json-read.h), and what the checks need of the model and machine. */
typedef struct {
  SimJsonReader j;
  const SimGraph *g;
  int n_devices;
} Reader;

/* A device list: [d0, d1, ...] or {"start": s, "count": n, "stride": k}. */
static gboolean get_devices(Reader *r, JsonNode *n, const char *place, GArray *out)
{
  g_array_set_size(out, 0);
  if (JSON_NODE_HOLDS_ARRAY(n)) {
    JsonArray *a = json_node_get_array(n);
    guint len = json_array_get_length(a);
    if (len == 0)
      return sim_json_fail(&r->j, SIM_ERROR_INVALID, place, "the device list is empty");
    for (guint i = 0; i < len; i++) {
      g_autofree char *p = g_strdup_printf("%s[%u]", place, i);
      int64_t v;
      if (!sim_json_int(&r->j, json_array_get_element(a, i), p, G_MININT, G_MAXINT, &v))
        return FALSE;
      if (v < 0 || v >= r->n_devices)
        return sim_json_fail(&r->j, SIM_ERROR_INVALID, p,
                             "device %" G_GINT64_FORMAT " does not exist; the machine has "
                             "devices 0..%d",
                             v, r->n_devices - 1);
      int d = (int)v;
      g_array_append_val(out, d);
    }
    return TRUE;
  }
  if (JSON_NODE_HOLDS_OBJECT(n)) {
    JsonObject *o = json_node_get_object(n);
    static const char *const keys[] = { "start", "count", "stride", NULL };
    if (!sim_json_check_keys(&r->j, o, place, keys))
      return FALSE;
    int64_t start = 0, count = 0, stride = 1;
    JsonNode *m;
    g_autofree char *ps = sim_json_place_key(place, "start");
    g_autofree char *pc = sim_json_place_key(place, "count");
    g_autofree char *pk = sim_json_place_key(place, "stride");
    if (!(m = json_object_get_member(o, "start")))
      return sim_json_fail(&r->j, SIM_ERROR_PARSE, place, "missing \"start\"");
    if (!sim_json_int(&r->j, m, ps, G_MININT, G_MAXINT, &start))
      return FALSE;
    if (!(m = json_object_get_member(o, "count")))
      return sim_json_fail(&r->j, SIM_ERROR_PARSE, place, "missing \"count\"");
    /* No operator has a million shards; the bound keeps a typo from allocating gigabytes. */
    if (!sim_json_int(&r->j, m, pc, 1, 1 << 20, &count))
      return FALSE;
    if ((m = json_object_get_member(o, "stride")) &&
        !sim_json_int(&r->j, m, pk, G_MININT, G_MAXINT, &stride))
      return FALSE;
    for (int64_t i = 0; i < count; i++) {
      int64_t d = start + i * stride;
      if (d < 0 || d >= r->n_devices)
        return sim_json_fail(&r->j, SIM_ERROR_INVALID, place,
                             "device %" G_GINT64_FORMAT " (entry %" G_GINT64_FORMAT
                             ") does not exist; the machine has devices 0..%d",
                             d, i, r->n_devices - 1);
      int di = (int)d;
      g_array_append_val(out, di);
    }
    return TRUE;
  }
  g_autofree char *got = sim_json_describe(n);
  return sim_json_fail(&r->j, SIM_ERROR_PARSE, place, "expected a list of devices or {\"start\", "
                       "\"count\", \"stride\"}, got %s", got);
}

/* A parsed per-operator entry, before it is applied to an operator. */
typedef struct {
  JsonObject *degrees;     /* may be NULL: all 1                                      */
  int replicas;            /* copies of every shard; 1 when "replicas" is missing     */
  GArray *devices;         /* int; empty when "devices" is missing                    */
  int stage;               /* -1 when "stage" is missing                              */
} Entry;

static gboolean read_entry(Reader *r, JsonNode *n, const char *place, int n_stages, Entry *e)
{
  JsonObject *o = NULL;
  if (!sim_json_object(&r->j, n, place, &o))
    return FALSE;
  static const char *const keys[] = { "degrees", "replicas", "devices", "stage", NULL };
  if (!sim_json_check_keys(&r->j, o, place, keys))
    return FALSE;
  JsonNode *m;
  e->degrees = NULL;
  e->replicas = 1;
  e->stage = -1;
  g_array_set_size(e->devices, 0);
  if ((m = json_object_get_member(o, "degrees"))) {
    g_autofree char *p = sim_json_place_key(place, "degrees");
    if (!sim_json_object(&r->j, m, p, &e->degrees))
      return FALSE;
  }
  if ((m = json_object_get_member(o, "replicas"))) {
    g_autofree char *p = sim_json_place_key(place, "replicas");
    int64_t v;
    if (!sim_json_int(&r->j, m, p, 1, r->n_devices, &v))
      return FALSE;
    e->replicas = (int)v;
  }
  if (!(m = json_object_get_member(o, "devices")))
    return sim_json_fail(&r->j, SIM_ERROR_PARSE, place, "missing \"devices\"");
  g_autofree char *pd = sim_json_place_key(place, "devices");
  if (!get_devices(r, m, pd, e->devices))
    return FALSE;
  if ((m = json_object_get_member(o, "stage"))) {
    g_autofree char *p = sim_json_place_key(place, "stage");
    int64_t v;
    if (!sim_json_int(&r->j, m, p, 0, G_MAXINT, &v))
      return FALSE;
    if (v >= n_stages)
      return sim_json_fail(&r->j, SIM_ERROR_INVALID, p, "stage %" G_GINT64_FORMAT
                           " does not exist; the strategy has stages 0..%d", v, n_stages - 1);
    e->stage = (int)v;
  }
  return TRUE;
}

/* Applies entry @e to operator @op.  @strict: every degree must name a dimension of the
 * operator (an entry of its own) rather than of some operator (the default). */
static gboolean apply_entry(Reader *r, SimStrategy *s, int op, const Entry *e, const char *place,
                            gboolean strict, int n_stages)
{
  SimStrategyOpInfo info;
  sim_strategy_op_info_fill(r->g, op, &info);
  SimOpConfig c = { .n_shards = 1, .replicas = e->replicas };
  for (int d = 0; d < SIM_MAX_ITER; d++)
    c.degree[d] = 1;
  if (e->degrees) {
    g_autoptr(GList) members = json_object_get_members(e->degrees);
    for (GList *l = members; l; l = l->next) {
      const char *dim = l->data;
      g_autofree char *dplace = g_strdup_printf("%s.degrees.%s", place, dim);
      int d = -1;
      for (int k = 0; k < info.ndims; k++)
        if (strcmp(info.dims[k].name, dim) == 0)
          d = k;
      if (d < 0) {
        if (!strict)
          continue;
        GString *names = g_string_new(NULL);
        for (int k = 0; k < info.ndims; k++)
          g_string_append_printf(names, k ? ", %s" : "%s", info.dims[k].name);
        sim_json_fail(&r->j, SIM_ERROR_UNKNOWN, dplace,
                      "op '%s' (%s) has no dimension '%s'; its dimensions are: %s", info.name,
                      sim_op_type_name(info.type), dim, names->str);
        g_string_free(names, TRUE);
        return FALSE;
      }
      int64_t v;
      if (!sim_json_int(&r->j, json_object_get_member(e->degrees, dim), dplace, 1, G_MAXINT, &v))
        return FALSE;
      c.degree[d] = (int)v;
    }
  }
  for (int d = 0; d < SIM_MAX_ITER; d++)
    c.n_shards = (int)MIN((int64_t)c.n_shards * c.degree[d], (int64_t)G_MAXINT / 2);
  int coords = c.n_shards;
  c.n_shards = (int)MIN((int64_t)coords * c.replicas, (int64_t)G_MAXINT / 2);
  c.devices = (int *)(void *)e->devices->data;
  if ((int)e->devices->len != c.n_shards) {
    g_autofree char *p = g_strdup_printf("%s.devices", place);
    if (c.replicas > 1)
      return sim_json_fail(&r->j, SIM_ERROR_INVALID, p, "op '%s' (%s): %u devices for %d shards "
                           "(the product of the degrees) x %d replicas", info.name,
                           sim_op_type_name(info.type), e->devices->len, coords, c.replicas);
    return sim_json_fail(&r->j, SIM_ERROR_INVALID, p,
                         "op '%s' (%s): %u devices for %d shards (the product of the degrees)",
                         info.name, sim_op_type_name(info.type), e->devices->len, coords);
  }
  g_autofree char *where = NULL;
  g_autoptr(GError) local = NULL;
  if (!sim_strategy_check_config(&info, &c, s->microbatches, r->n_devices, &where, &local)) {
    g_autofree char *p = where ? g_strdup_printf("%s.%s", place, where) : g_strdup(place);
    return sim_json_fail(&r->j, local->code, p, "%s", local->message);
  }

  int stage = e->stage;
  if (stage < 0) {
    if (n_stages > 1) {
      return sim_json_fail(&r->j, SIM_ERROR_INVALID, place,
                           "op '%s' (%s) has no \"stage\", but the strategy has %d stages",
                           info.name, sim_op_type_name(info.type), n_stages);
    }
    stage = 0;
  }
  SimOpConfig *dst = &s->ops[op];
  g_free(dst->devices);
  *dst = c;
  dst->devices = g_memdup2(e->devices->data, sizeof(int) * e->devices->len);
  s->op_stage[op] = stage;
  return TRUE;
}

static gboolean read_sync(Reader *r, JsonNode *n, SimStrategy *s)
{
  JsonObject *o = NULL;
  if (!sim_json_object(&r->j, n, "sync", &o))
    return FALSE;
  static const char *const keys[] = { "algorithm", "bucket_MB", "overlap", NULL };
  if (!sim_json_check_keys(&r->j, o, "sync", keys))
    return FALSE;
  JsonNode *m;
  int v;
  if ((m = json_object_get_member(o, "algorithm"))) {
    if (!sim_json_enum(&r->j, m, "sync.algorithm", sim_allreduce_algo_from_name,
                       "ring, tree, hierarchical", &v))
      return FALSE;
    s->sync.algorithm = v;
  }
  if ((m = json_object_get_member(o, "bucket_MB"))) {
    double mb;
    if (!sim_json_number(&r->j, m, "sync.bucket_MB", 0.0, TRUE, &mb))
      return FALSE;
    if (mb > 1.0e9)
      return sim_json_fail(&r->j, SIM_ERROR_INVALID, "sync.bucket_MB",
                           "%g is not a bucket size; expected 0 (no buckets) or a positive number",
                           mb);
    s->sync.bucket_bytes = (int64_t)llround(mb * BYTES_PER_MB);
  }
  if ((m = json_object_get_member(o, "overlap")) &&
      !sim_json_bool(&r->j, m, "sync.overlap", &s->sync.overlap))
    return FALSE;
  return TRUE;
}

static gboolean read_memory(Reader *r, JsonNode *n, SimStrategy *s)
{
  JsonObject *o = NULL;
  if (!sim_json_object(&r->j, n, "memory", &o))
    return FALSE;
  static const char *const keys[] = { "recompute", "zero", "precision", "optimizer",
                                      "offload_optimizer", "offload_overlap", NULL };
  if (!sim_json_check_keys(&r->j, o, "memory", keys))
    return FALSE;
  JsonNode *m;
  int v;
  if ((m = json_object_get_member(o, "recompute"))) {
    if (!sim_json_enum(&r->j, m, "memory.recompute", sim_recompute_from_name,
                       "none, selective, full", &v))
      return FALSE;
    s->memory.recompute = v;
  }
  if ((m = json_object_get_member(o, "zero"))) {
    int64_t z;
    if (!sim_json_int(&r->j, m, "memory.zero", 0, 3, &z))
      return FALSE;
    s->memory.zero1 = z >= 1;
    s->memory.zero2 = z >= 2;
    s->memory.zero3 = z == 3;
  }
  if ((m = json_object_get_member(o, "precision"))) {
    if (!sim_json_enum(&r->j, m, "memory.precision", sim_precision_from_name,
                       "fp32, mixed-fp16, mixed-bf16", &v))
      return FALSE;
    s->memory.precision = v;
  }
  if ((m = json_object_get_member(o, "optimizer"))) {
    if (!sim_json_enum(&r->j, m, "memory.optimizer", sim_optimizer_from_name, "adam, sgd", &v))
      return FALSE;
    s->memory.optimizer = v;
  }
  if ((m = json_object_get_member(o, "offload_optimizer"))) {
    /* true: all of the states; a number: that fraction of them. */
    double f = 0;
    if (JSON_NODE_HOLDS_VALUE(m) && json_node_get_value_type(m) == G_TYPE_BOOLEAN) {
      f = json_node_get_boolean(m) ? 1 : 0;
    } else if (!sim_json_is_number(m) || !isfinite(f = json_node_get_double(m)) || f < 0 ||
               f > 1) {
      g_autofree char *got = sim_json_describe(m);
      return sim_json_fail(&r->j, sim_json_is_number(m) ? r->j.invalid : r->j.parse,
                           "memory.offload_optimizer",
                           "expected true, false or a number from 0 to 1, got %s", got);
    }
    s->memory.offload = f;
  }
  if ((m = json_object_get_member(o, "offload_overlap"))) {
    if (!JSON_NODE_HOLDS_VALUE(m) || json_node_get_value_type(m) != G_TYPE_BOOLEAN) {
      g_autofree char *got = sim_json_describe(m);
      return sim_json_fail(&r->j, r->j.parse, "memory.offload_overlap",
                           "expected true or false, got %s", got);
    }
    if (json_node_get_boolean(m) && !(s->memory.offload > 0))
      return sim_json_fail(&r->j, r->j.invalid, "memory.offload_overlap",
                           "true needs a share of the optimizer on the host "
                           "(memory.offload_optimizer)");
    s->memory.offload_overlap = json_node_get_boolean(m);
  }
  return TRUE;
}

/* "tp_overlap": {"chunks": 0, "sms_attention": 24, "sms_other": 16}, each optional. */
static gboolean read_tp_overlap(Reader *r, JsonNode *node, SimStrategy *s)
{
  static const char *const keys[] = { "chunks", "sms_attention", "sms_other", NULL };
  JsonObject *o;
  if (!sim_json_object(&r->j, node, "tp_overlap", &o) ||
      !sim_json_check_keys(&r->j, o, "tp_overlap", keys))
    return FALSE;
  int *fields[3] = { &s->tp_overlap.chunks, &s->tp_overlap.sms_attention,
                     &s->tp_overlap.sms_other };
  for (int i = 0; i < 3; i++) {
    JsonNode *m = json_object_get_member(o, keys[i]);
    if (!m)
      continue;
    g_autofree char *path = g_strdup_printf("tp_overlap.%s", keys[i]);
    int64_t v;
    if (!sim_json_int(&r->j, m, path, 0, G_MAXINT, &v))
      return FALSE;
    *fields[i] = (int)v;
  }
  return TRUE;
}

static gboolean read_document(Reader *r, JsonObject *root, SimStrategy *s)
{
  static const char *const keys[] = { "format", "version", "model", "microbatches", "schedule",
                                      "chunks", "sync", "memory", "sequence_parallel",
                                      "pipeline_scatter_gather", "tp_comm_overlap",
                                      "tp_overlap", "context_parallel", "rewrites", "stages", "default", "ops",
                                      NULL };
  if (!sim_json_check_format(&r->j, root, "parasol-strategy", 1) ||
      !sim_json_check_keys(&r->j, root, "", keys))
    return FALSE;

  JsonNode *m;
  const char *str;
  int64_t v;
  int e;
  if ((m = json_object_get_member(root, "model")) && !sim_json_string(&r->j, m, "model", &str))
    return FALSE;

  if ((m = json_object_get_member(root, "microbatches"))) {
    if (!sim_json_int(&r->j, m, "microbatches", 1, G_MAXINT, &v))
      return FALSE;
    int64_t batch = sim_graph_batch_size(r->g);
    if (batch > 0 && batch % v != 0)
      return sim_json_fail(&r->j, SIM_ERROR_INVALID, "microbatches",
                           "the batch of %" G_GINT64_FORMAT " samples does not split into %"
                           G_GINT64_FORMAT " micro-batches", batch, v);
    s->microbatches = (int)v;
  }
  SimSchedule sched = SIM_SCHEDULE_1F1B;
  int64_t chunks = 1;
  if ((m = json_object_get_member(root, "schedule"))) {
    if (!sim_json_enum(&r->j, m, "schedule", sim_schedule_from_name, "1f1b, gpipe, interleaved",
                       &e))
      return FALSE;
    sched = e;
  }
  if ((m = json_object_get_member(root, "chunks")) &&
      !sim_json_int(&r->j, m, "chunks", 1, G_MAXINT, &chunks))
    return FALSE;
  if (chunks > 1 && sched != SIM_SCHEDULE_INTERLEAVED)
    return sim_json_fail(&r->j, SIM_ERROR_INVALID, "chunks",
                         "%" G_GINT64_FORMAT " model chunks per device group need the "
                         "interleaved schedule, not %s", chunks, sim_schedule_name(sched));
  sim_strategy_set_schedule(s, sched, (int)chunks);

  if ((m = json_object_get_member(root, "sync")) && !read_sync(r, m, s))
    return FALSE;
  if ((m = json_object_get_member(root, "memory")) && !read_memory(r, m, s))
    return FALSE;
  if ((m = json_object_get_member(root, "sequence_parallel")) &&
      !sim_json_bool(&r->j, m, "sequence_parallel", &s->sequence_parallel))
    return FALSE;
  if ((m = json_object_get_member(root, "pipeline_scatter_gather")) &&
      !sim_json_bool(&r->j, m, "pipeline_scatter_gather", &s->scatter_gather))
    return FALSE;
  if ((m = json_object_get_member(root, "tp_comm_overlap")) &&
      !sim_json_bool(&r->j, m, "tp_comm_overlap", &s->tp_comm_overlap))
    return FALSE;
  if ((m = json_object_get_member(root, "tp_overlap")) && !read_tp_overlap(r, m, s))
    return FALSE;
  if ((m = json_object_get_member(root, "context_parallel"))) {
    int64_t cp;
    if (!sim_json_int(&r->j, m, "context_parallel", 1, G_MAXINT, &cp))
      return FALSE;
    s->cp = (int)cp;
  }
  if ((m = json_object_get_member(root, "rewrites"))) {
    JsonArray *a;
    if (!sim_json_array(&r->j, m, "rewrites", &a))
      return FALSE;
    for (guint i = 0; i < json_array_get_length(a); i++) {
      g_autofree char *p = g_strdup_printf("rewrites[%u]", i);
      if (!sim_json_string(&r->j, json_array_get_element(a, i), p, &str))
        return FALSE;
      sim_strategy_add_rewrite(s, str);
    }
  }

  /* Stages come before the operators, which refer to them. */
  g_autoptr(GPtrArray) stage_devs = g_ptr_array_new_with_free_func((GDestroyNotify)g_array_unref);
  if ((m = json_object_get_member(root, "stages"))) {
    JsonArray *a;
    if (!sim_json_array(&r->j, m, "stages", &a))
      return FALSE;
    if (json_array_get_length(a) == 0)
      return sim_json_fail(&r->j, SIM_ERROR_INVALID, "stages", "the list of stages is empty");
    for (guint i = 0; i < json_array_get_length(a); i++) {
      g_autofree char *p = g_strdup_printf("stages[%u]", i);
      JsonObject *o = NULL;
      if (!sim_json_object(&r->j, json_array_get_element(a, i), p, &o))
        return FALSE;
      static const char *const skeys[] = { "devices", NULL };
      if (!sim_json_check_keys(&r->j, o, p, skeys))
        return FALSE;
      JsonNode *dn = json_object_get_member(o, "devices");
      if (!dn)
        return sim_json_fail(&r->j, SIM_ERROR_PARSE, p, "missing \"devices\"");
      g_autofree char *pd = sim_json_place_key(p, "devices");
      GArray *devs = g_array_new(FALSE, FALSE, sizeof(int));
      g_ptr_array_add(stage_devs, devs);
      if (!get_devices(r, dn, pd, devs))
        return FALSE;
      for (guint j = 0; j < devs->len; j++)
        for (guint k = 0; k < j; k++)
          if (g_array_index(devs, int, j) == g_array_index(devs, int, k))
            return sim_json_fail(&r->j, SIM_ERROR_INVALID, pd, "device %d is listed twice",
                                 g_array_index(devs, int, j));
    }
  }
  int n_stages = stage_devs->len ? (int)stage_devs->len : 1;

  /* The operators: each its own entry, else the default. */
  int n_ops = sim_graph_n_ops(r->g);
  g_autofree gboolean *seen = g_new0(gboolean, MAX(n_ops, 1));
  g_autoptr(GArray) devbuf = g_array_new(FALSE, FALSE, sizeof(int));
  Entry entry = { .devices = devbuf };
  if ((m = json_object_get_member(root, "ops"))) {
    JsonObject *ops;
    if (!sim_json_object(&r->j, m, "ops", &ops))
      return FALSE;
    g_autoptr(GList) members = json_object_get_members(ops);
    for (GList *l = members; l; l = l->next) {
      const char *name = l->data;
      g_autofree char *p = sim_json_place_key("ops", name);
      int op = sim_graph_op_by_name(r->g, name);
      if (op < 0)
        return sim_json_fail(&r->j, SIM_ERROR_UNKNOWN, p, "no such operator in model '%s'",
                             sim_graph_get_name(r->g));
      if (!read_entry(r, json_object_get_member(ops, name), p, n_stages, &entry) ||
          !apply_entry(r, s, op, &entry, p, TRUE, n_stages))
        return FALSE;
      seen[op] = TRUE;
    }
  }
  Entry def = { .devices = g_array_new(FALSE, FALSE, sizeof(int)) };
  gboolean have_default = FALSE, ok = TRUE;
  if ((m = json_object_get_member(root, "default"))) {
    have_default = TRUE;
    ok = read_entry(r, m, "default", n_stages, &def);
    /* A default degree that names no dimension of any operator is a typo. */
    if (ok && def.degrees) {
      g_autoptr(GList) members = json_object_get_members(def.degrees);
      for (GList *l = members; ok && l; l = l->next) {
        gboolean found = FALSE;
        for (int i = 0; i < n_ops && !found; i++)
          for (int d = 0; d < sim_graph_op_n_dims(r->g, i) && !found; d++)
            found = strcmp(sim_graph_op_dim_name(r->g, i, d), l->data) == 0;
        if (!found) {
          g_autofree char *p = g_strdup_printf("default.degrees.%s", (const char *)l->data);
          ok = sim_json_fail(&r->j, SIM_ERROR_UNKNOWN, p,
                             "no operator of model '%s' has a dimension '%s'",
                             sim_graph_get_name(r->g), (const char *)l->data);
        }
      }
    }
  }
  for (int i = 0; ok && i < n_ops; i++) {
    if (seen[i])
      continue;
    if (!have_default) {
      ok = sim_json_fail(&r->j, SIM_ERROR_INVALID, "ops", "no configuration for op '%s' (%s), and "
                         "no \"default\" for the operators not listed", sim_graph_op_name(r->g, i),
                         sim_op_type_name(sim_graph_op_type(r->g, i)));
      break;
    }
    ok = apply_entry(r, s, i, &def, "default", FALSE, n_stages);
  }
  g_array_unref(def.devices);
  if (!ok)
    return FALSE;

  /* Without "stages", the one stage runs on every device the operators use. */
  if (stage_devs->len == 0) {
    g_autofree gboolean *used = g_new0(gboolean, MAX(r->n_devices, 1));
    for (int i = 0; i < n_ops; i++)
      for (int k = 0; k < s->ops[i].n_shards; k++)
        used[s->ops[i].devices[k]] = TRUE;
    GArray *devs = g_array_new(FALSE, FALSE, sizeof(int));
    for (int d = 0; d < r->n_devices; d++)
      if (used[d])
        g_array_append_val(devs, d);
    if (devs->len == 0) {
      int zero = 0;
      g_array_append_val(devs, zero);
    }
    g_ptr_array_add(stage_devs, devs);
  }
  g_autofree const int **sd = g_new0(const int *, n_stages);
  g_autofree int *sn = g_new0(int, n_stages);
  for (int st = 0; st < n_stages; st++) {
    GArray *devs = g_ptr_array_index(stage_devs, st);
    sd[st] = (const int *)(void *)devs->data;
    sn[st] = (int)devs->len;
  }
  g_autofree int *op_stage = g_memdup2(s->op_stage, sizeof(int) * (gsize)MAX(n_ops, 1));
  g_autoptr(GError) local = NULL;
  if (!sim_strategy_set_stages(s, n_stages, op_stage, sd, sn, &local))
    return sim_json_fail(&r->j, local->code, "stages", "%s", local->message);
  return TRUE;
}

/* The rewrites @root names, when it names them as a list of strings (the reader reports
 * anything else); NULL when it names none. */
static GPtrArray *document_rewrites(JsonObject *root)
{
  JsonNode *m = json_object_get_member(root, "rewrites");
  if (!m || !JSON_NODE_HOLDS_ARRAY(m))
    return NULL;
  JsonArray *a = json_node_get_array(m);
  GPtrArray *names = g_ptr_array_new();
  for (guint i = 0; i < json_array_get_length(a); i++) {
    JsonNode *el = json_array_get_element(a, i);
    if (!JSON_NODE_HOLDS_VALUE(el) || json_node_get_value_type(el) != G_TYPE_STRING) {
      g_ptr_array_unref(names);
      return NULL;
    }
    g_ptr_array_add(names, (gpointer)json_node_get_string(el));
  }
  if (names->len == 0) {
    g_ptr_array_unref(names);
    return NULL;
  }
  g_ptr_array_add(names, NULL);
  return names;
}

/* Reads the strategy in @text (one parse).  With @rewrite, the graph the strategy names is
 * @g rewritten by the rewrites it records, returned in @graph (a copy of @g when it records
 * none). */
static SimStrategy *from_text(const char *text, const char *filename, const SimGraph *g,
                              const SimMachine *m, SimGraphRewriteFunc rewrite, gpointer data,
                              SimGraph **graph, GError **error)
{
  Reader r = { .j = SIM_JSON_READER(filename ? filename : "<strategy>", error),
               .g = g, .n_devices = sim_machine_n_devices(m) };
  g_autoptr(JsonParser) parser = json_parser_new();
  g_autoptr(GError) local = NULL;
  JsonObject *root = sim_json_read_root(&r.j, parser, text, "parasol-strategy");
  if (!root)
    return NULL;
  g_autoptr(SimGraph) rewritten = NULL;
  if (rewrite) {
    g_autoptr(GPtrArray) names = document_rewrites(root);
    rewritten = names ? rewrite(g, (const char *const *)names->pdata, data, error)
                      : sim_graph_copy(g);
    if (!rewritten) {
      g_prefix_error(error, "%s:rewrites: ", filename ? filename : "<strategy>");
      return NULL;
    }
    r.g = g = rewritten;
  }
  g_autoptr(SimStrategy) s = sim_strategy_new(g, m);
  if (!read_document(&r, root, s))
    return NULL;
  if (!sim_strategy_validate(s, g, m, &local)) {
    sim_json_fail(&r.j, local->code, NULL, "%s", local->message);
    return NULL;
  }
  if (graph)
    *graph = g_steal_pointer(&rewritten);
  return g_steal_pointer(&s);
}

SimStrategy *sim_strategy_from_json(const char *text, const char *filename, const SimGraph *g,
                                    const SimMachine *m, GError **error)
{
  g_return_val_if_fail(text != NULL && g != NULL && m != NULL, NULL);
  return from_text(text, filename, g, m, NULL, NULL, NULL, error);
}

static char *read_strategy_file(const char *path, GError **error)
{
  char *text = NULL;
  g_autoptr(GError) local = NULL;
  if (!sim_read_file(path, &text, NULL, &local)) {
    sim_set_error_at(error, SIM_ERROR_IO, path, NULL, "cannot read the strategy: %s",
                     local->message);
    return NULL;
  }
  return text;
}

SimStrategy *sim_strategy_load_rewritten(const char *path, const SimGraph *g,
                                         const SimMachine *m, SimGraphRewriteFunc rewrite,
                                         gpointer data, SimGraph **graph, GError **error)
{
  g_return_val_if_fail(path != NULL && g != NULL && m != NULL, NULL);
  g_return_val_if_fail(rewrite != NULL && graph != NULL, NULL);
  *graph = NULL;
  g_autofree char *text = read_strategy_file(path, error);
  return text ? from_text(text, path, g, m, rewrite, data, graph, error) : NULL;
}

SimStrategy *sim_strategy_load(const char *path, const SimGraph *g, const SimMachine *m,
                               GError **error)
{
  g_return_val_if_fail(path != NULL && g != NULL && m != NULL, NULL);
  g_autofree char *text = read_strategy_file(path, error);
  return text ? from_text(text, path, g, m, NULL, NULL, NULL, error) : NULL;
}

char **sim_strategy_file_rewrites(const char *path, GError **error)
{
  g_return_val_if_fail(path != NULL, NULL);
  g_autofree char *text = read_strategy_file(path, error);
  if (!text)
    return NULL;
  SimJsonReader r = SIM_JSON_READER(path, error);
  g_autoptr(JsonParser) parser = json_parser_new();
  JsonObject *root = sim_json_read_root(&r, parser, text, "parasol-strategy");
  if (!root)
    return NULL;
  GPtrArray *names = g_ptr_array_new_with_free_func(g_free);
  JsonNode *m = json_object_get_member(root, "rewrites");
  JsonArray *a = NULL;
  if (m && !sim_json_array(&r, m, "rewrites", &a)) {
    g_ptr_array_unref(names);
    return NULL;
  }
  for (guint i = 0; a && i < json_array_get_length(a); i++) {
    g_autofree char *place = sim_json_place_index("rewrites", i);
    const char *name;
    if (!sim_json_string(&r, json_array_get_element(a, i), place, &name)) {
      g_ptr_array_unref(names);
      return NULL;
    }
    g_ptr_array_add(names, g_strdup(name));
  }
  g_ptr_array_set_free_func(names, NULL);
  g_ptr_array_add(names, NULL);
  return (char **)g_ptr_array_free(names, FALSE);
}
