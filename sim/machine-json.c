/* machine-json.c — reading machine files ("format": "parasol-machine"); machine-json-write.c
 * writes them.
 *
 * The file describes a machine compactly: one node type (its GPU, the fabric between its
 * GPUs, its PCIe tree and NICs), a count of nodes and the network between them;
 * data/machines/README.md documents every key.  The reader is strict: an unknown key, a
 * value of the wrong type or out of range is an error that names the file and the JSON
 * path of the value ("dgx.json: node.fabric.bandwidth_GBps: expected a positive number,
 * got -5"), because a typo that silently falls back to a default would make every
 * prediction on that machine quietly wrong.
 */
#include "machine-json.h"
#include "json-read.h"

#include <json-glib/json-glib.h>
#include <math.h>
#include <string.h>

/* Defaults of optional keys, per link (README.md, "Defaults and their sources"). */
#define DEFAULT_NVSWITCH_LATENCY 0.3e-6
#define DEFAULT_NVLINK_LATENCY 0.6e-6
#define DEFAULT_PCIE_LATENCY 0.5e-6
#define DEFAULT_INTERSOCKET_LATENCY 1.0e-6
#define DEFAULT_NETWORK_LATENCY 0.6e-6
#define DEFAULT_LAUNCH_OVERHEAD 4e-6

#define MAX_GPUS_PER_NODE 1024
#define MAX_DEVICES SIM_MACHINE_MAX_DEVICES
/* A GPU's memory, in GiB: a bound far above any GPU that keeps the bytes within int64. */
#define MAX_MEMORY_GIB (1 << 20)

/* ---------------------------------------------------------------------------------- */
/* Reading                                                                             */

/* The shared reader (base/json-read.h) with the machine file's adapters: integers that fit an
 * int, numbers scaled to the simulator's units, members looked up by key. */
typedef SimJsonReader Reader;


static JsonObject *get_object(Reader *r, JsonNode *n, const char *path)
{
  JsonObject *o = NULL;
  return sim_json_object(r, n, path, &o) ? o : NULL;
}

static JsonArray *get_array(Reader *r, JsonNode *n, const char *path)
{
  JsonArray *a = NULL;
  return sim_json_array(r, n, path, &a) ? a : NULL;
}

/* An integer in [min, max] at @where. */
static gboolean node_int(Reader *r, JsonNode *n, const char *where, int min, int max, int *out)
{
  int64_t v;
  if (!sim_json_int(r, n, where, min, max, &v))
    return FALSE;
  *out = (int)v;
  return TRUE;
}

/* An optional integer member; @out keeps its value when the key is absent. */
static gboolean member_int(Reader *r, JsonObject *o, const char *path, const char *key,
                           gboolean required, int min, int max, int *out)
{
  JsonNode *n = json_object_get_member(o, key);
  if (!n) {
    if (!required)
      return TRUE;
    g_autofree char *what = g_strdup_printf("an integer >= %d", min);
    return sim_json_missing(r, path, key, what);
  }
  g_autofree char *where = sim_json_place_key(path, key);
  return node_int(r, n, where, min, max, out);
}

/* A number, positive or (with @allow_zero) non-negative, scaled by @scale. */
static gboolean node_number(Reader *r, JsonNode *n, const char *where, gboolean allow_zero,
                            double scale, double *out)
{
  double v;
  if (!sim_json_number(r, n, where, 0.0, allow_zero, &v))
    return FALSE;
  *out = v * scale;
  return TRUE;
}

static gboolean member_number(Reader *r, JsonObject *o, const char *path, const char *key,
                              gboolean required, gboolean allow_zero, double scale,
                              double *out)
{
  JsonNode *n = json_object_get_member(o, key);
  if (!n)
    return required ? sim_json_missing(r, path, key,
                                       allow_zero ? "a number >= 0" : "a positive number")
                    : TRUE;
  g_autofree char *where = sim_json_place_key(path, key);
  return node_number(r, n, where, allow_zero, scale, out);
}

/* A bandwidth given as BASE_GBps (gigabytes per second) or BASE_Gbps (gigabits per
 * second, as NICs and switches are sold), per direction. */
static gboolean member_bandwidth(Reader *r, JsonObject *o, const char *path, const char *base,
                                 gboolean required, double *out)
{
  g_autofree char *k_bytes = g_strdup_printf("%s_GBps", base);
  g_autofree char *k_bits = g_strdup_printf("%s_Gbps", base);
  gboolean has_bytes = json_object_has_member(o, k_bytes);
  gboolean has_bits = json_object_has_member(o, k_bits);
  if (has_bytes && has_bits) {
    g_autofree char *where = sim_json_place_key(path, k_bits);
    return sim_json_fail(r, SIM_ERROR_PARSE, where, "give either %s or %s, not both", k_bytes,
                         k_bits);
  }
  if (!has_bytes && !has_bits) {
    if (!required)
      return TRUE;
    g_autofree char *what =
      g_strdup_printf("a positive number (or %s in gigabits per second)", k_bits);
    return sim_json_missing(r, path, k_bytes, what);
  }
  if (has_bits)
    return member_number(r, o, path, k_bits, TRUE, FALSE, GBITPS, out);
  return member_number(r, o, path, k_bytes, TRUE, FALSE, GBPS, out);
}

/* Latencies and overheads: at most a second (the routes sum them in picoseconds). */
static gboolean member_latency(Reader *r, JsonObject *o, const char *path, const char *key,
                               double *out)
{
  if (!member_number(r, o, path, key, FALSE, TRUE, USEC, out))
    return FALSE;
  if (*out > 1.0) {
    g_autofree char *where = sim_json_place_key(path, key);
    return sim_json_fail(r, SIM_ERROR_INVALID, where, "%g us is more than the 1000000 us (1 s) a "
                         "latency may be", *out / USEC);
  }
  return TRUE;
}

/* A string member; *out points into the JSON tree.  Names must not be empty. */
static gboolean member_text(Reader *r, JsonObject *o, const char *path, const char *key,
                            gboolean required, gboolean allow_empty, const char **out)
{
  JsonNode *n = json_object_get_member(o, key);
  if (!n)
    return required ? sim_json_missing(r, path, key, "a string") : TRUE;
  if (!JSON_NODE_HOLDS_VALUE(n) || json_node_get_value_type(n) != G_TYPE_STRING ||
      (!allow_empty && !*json_node_get_string(n))) {
    g_autofree char *where = sim_json_place_key(path, key);
    g_autofree char *got = sim_json_describe(n);
    return sim_json_fail(r, SIM_ERROR_PARSE, where, "expected a %sstring, got %s",
                         allow_empty ? "" : "non-empty ", got);
  }
  *out = json_node_get_string(n);
  return TRUE;
}

static gboolean member_string(Reader *r, JsonObject *o, const char *path, const char *key,
                              gboolean required, const char **out)
{
  return member_text(r, o, path, key, required, FALSE, out);
}

/* ---------------------------------------------------------------------------------- */
/* The GPU: a library name or an inline spec                                           */

const char *const sim_machine_dtype_keys[SIM_DTYPE_COUNT] = {
  "fp32", "fp16", "bf16", "fp8", "int32", "int64",
};

static char *library_device_names(void)
{
  GString *s = g_string_new(NULL);
  for (int i = 0; i < sim_device_library_n(); i++)
    g_string_append_printf(s, "%s%s", i ? ", " : "", sim_device_library_get(i)->name);
  return g_string_free(s, FALSE);
}

static const SimDeviceSpec *lookup_device(Reader *r, JsonNode *n, const char *where)
{
  const char *name = json_node_get_string(n);
  const SimDeviceSpec *spec = sim_device_library_lookup(name);
  if (!spec) {
    g_autofree char *known = library_device_names();
    sim_json_fail(r, SIM_ERROR_UNKNOWN, where, "unknown GPU type '%s'; known types: %s", name,
                  known);
  }
  return spec;
}

static const SimDeviceSpec *parse_inline_gpu(Reader *r, JsonObject *o, const char *path)
{
  static const char *const keys[] = {
    "name", "vendor_name", "base", "peak_TFLOPS", "memory_bandwidth_GBps",
    "memory_bandwidth_Gbps", "memory_GiB", "sm_count", "launch_overhead_us", "source",
    "matmul_fraction", "matmul_fraction_fp8", "attention_fraction", "attention_bwd_fraction",
    NULL,
  };
  if (!sim_json_check_keys(r, o, path, keys))
    return NULL;

  SimDeviceSpec spec = { .launch_overhead = DEFAULT_LAUNCH_OVERHEAD };
  gboolean has_base = json_object_has_member(o, "base");
  if (has_base) {
    JsonNode *b = json_object_get_member(o, "base");
    g_autofree char *where = sim_json_place_key(path, "base");
    if (!JSON_NODE_HOLDS_VALUE(b) || json_node_get_value_type(b) != G_TYPE_STRING) {
      g_autofree char *got = sim_json_describe(b);
      sim_json_fail(r, SIM_ERROR_PARSE, where, "expected the name of a library GPU, got %s", got);
      return NULL;
    }
    const SimDeviceSpec *base = lookup_device(r, b, where);
    if (!base)
      return NULL;
    spec = *base;
  }

  const char *name = NULL, *vendor = NULL, *source = NULL;
  if (!member_string(r, o, path, "name", TRUE, &name) ||
      !member_string(r, o, path, "vendor_name", FALSE, &vendor) ||
      !member_string(r, o, path, "source", FALSE, &source))
    return NULL;
  /* A derived GPU is not the base's product: its vendor name says what it was made from. */
  g_autofree char *derived = has_base ? g_strdup_printf("%s, modified as %s", spec.vendor_name,
                                                        name)
                                      : NULL;
  spec.name = name;
  spec.vendor_name = vendor ? vendor : has_base ? derived : name;
  g_autofree char *default_source =
    has_base ? g_strdup_printf("%s, as modified by %s", spec.source, r->file)
             : g_strdup_printf("machine file %s", r->file);
  spec.source = source ? source : default_source;

  /* Without a base every figure must be given; int32 and int64 follow fp32 as in the
   * library (devices.c). */
  JsonNode *pn = json_object_get_member(o, "peak_TFLOPS");
  g_autofree char *ppath = sim_json_place_key(path, "peak_TFLOPS");
  if (!pn && !has_base) {
    sim_json_missing(r, path, "peak_TFLOPS", "an object of peak dense TFLOP/s per dtype");
    return NULL;
  }
  if (pn) {
    JsonObject *po = get_object(r, pn, ppath);
    if (!po)
      return NULL;
    static const char *const pkeys[] = { "fp32", "fp16", "bf16", "fp8", "int32", "int64",
                                         "tf32", NULL };
    if (!sim_json_check_keys(r, po, ppath, pkeys))
      return NULL;
    if (!member_number(r, po, ppath, "fp32", !has_base, FALSE, TFLOPS, &spec.peak_flops[0]))
      return NULL;
    if (!has_base) {
      spec.peak_flops[SIM_DTYPE_INT32] = spec.peak_flops[SIM_DTYPE_FP32];
      spec.peak_flops[SIM_DTYPE_INT64] = spec.peak_flops[SIM_DTYPE_FP32];
    }
    for (int t = 1; t < SIM_DTYPE_COUNT; t++)
      if (!member_number(r, po, ppath, sim_machine_dtype_keys[t], FALSE, TRUE, TFLOPS, &spec.peak_flops[t]))
        return NULL;
    /* TF32 on the tensor cores, where the device has it (0: fp32 on the CUDA cores). */
    if (!member_number(r, po, ppath, "tf32", FALSE, TRUE, TFLOPS, &spec.tf32_flops))
      return NULL;
  }
  double gib = (double)spec.mem_capacity / GIB;
  if (!member_bandwidth(r, o, path, "memory_bandwidth", !has_base, &spec.mem_bandwidth) ||
      !member_number(r, o, path, "memory_GiB", !has_base, FALSE, 1.0, &gib) ||
      !member_int(r, o, path, "sm_count", !has_base, 1, G_MAXINT, &spec.sm_count) ||
      !member_latency(r, o, path, "launch_overhead_us", &spec.launch_overhead) ||
      !member_number(r, o, path, "matmul_fraction", FALSE, TRUE, 1.0, &spec.matmul_fraction) ||
      !member_number(r, o, path, "matmul_fraction_fp8", FALSE, TRUE, 1.0,
                     &spec.matmul_fraction_fp8) ||
      !member_number(r, o, path, "attention_fraction", FALSE, TRUE, 1.0,
                     &spec.attention_fraction) ||
      !member_number(r, o, path, "attention_bwd_fraction", FALSE, TRUE, 1.0,
                     &spec.attention_bwd_fraction))
    return NULL;
  static const char *const fractions[] = { "matmul_fraction", "matmul_fraction_fp8",
                                           "attention_fraction", "attention_bwd_fraction" };
  const double values[] = { spec.matmul_fraction, spec.matmul_fraction_fp8,
                            spec.attention_fraction, spec.attention_bwd_fraction };
  for (size_t i = 0; i < G_N_ELEMENTS(fractions); i++)
    if (values[i] > 1) {
      g_autofree char *where = sim_json_place_key(path, fractions[i]);
      sim_json_fail(r, SIM_ERROR_INVALID, where, "expected a fraction of the peak, at most 1");
      return NULL;
    }
  if (gib > MAX_MEMORY_GIB) {
    g_autofree char *where = sim_json_place_key(path, "memory_GiB");
    sim_json_fail(r, SIM_ERROR_INVALID, where, "%g GiB is more than the %d GiB a GPU may have", gib,
                  MAX_MEMORY_GIB);
    return NULL;
  }
  spec.mem_capacity = (int64_t)llround(gib * GIB);
  return sim_device_spec_intern(&spec);
}

static gboolean parse_gpu(Reader *r, JsonObject *node, const char *path, SimMachineDesc *d)
{
  JsonNode *n = json_object_get_member(node, "gpu");
  if (!n)
    return sim_json_missing(r, path, "gpu", "a GPU type name or a spec object");
  g_autofree char *where = sim_json_place_key(path, "gpu");
  if (JSON_NODE_HOLDS_VALUE(n) && json_node_get_value_type(n) == G_TYPE_STRING) {
    d->spec = lookup_device(r, n, where);
    d->spec_inline = FALSE;
  } else if (JSON_NODE_HOLDS_OBJECT(n)) {
    d->spec = parse_inline_gpu(r, json_node_get_object(n), where);
    d->spec_inline = TRUE;
  } else {
    g_autofree char *got = sim_json_describe(n);
    return sim_json_fail(r, SIM_ERROR_PARSE, where,
                         "expected a GPU type name or a spec object, got %s", got);
  }
  return d->spec != NULL;
}

/* ---------------------------------------------------------------------------------- */
/* The node: fabric, PCIe tree, NICs                                                   */

const char *const sim_machine_fabric_names[] = { "pcie", "nvswitch", "nvlink-mesh", NULL };

static gboolean parse_pairs(Reader *r, JsonObject *f, const char *path, SimMachineDesc *d)
{
  JsonNode *pn = json_object_get_member(f, "pairs");
  if (!pn)
    return sim_json_missing(r, path, "pairs", "an array of [gpu, gpu, links]");
  g_autofree char *ppath = sim_json_place_key(path, "pairs");
  JsonArray *pa = get_array(r, pn, ppath);
  if (!pa)
    return FALSE;
  int n = (int)json_array_get_length(pa);
  if (n == 0)
    return sim_json_fail(r, SIM_ERROR_INVALID, ppath,
                         "expected at least one pair of GPUs, got none");
  d->n_pairs = n;
  d->pairs = g_new0(SimNvlinkPair, n);
  /* seen[a * gpus + b] is the pair index + 1, to name the earlier pair in errors. */
  g_autofree int *seen = g_new0(int, (size_t)d->gpus * d->gpus);
  for (int i = 0; i < n; i++) {
    g_autofree char *ipath = sim_json_place_index(ppath, i);
    JsonArray *e = get_array(r, json_array_get_element(pa, i), ipath);
    if (!e)
      return FALSE;
    int len = (int)json_array_get_length(e);
    if (len != 2 && len != 3)
      return sim_json_fail(r, SIM_ERROR_PARSE, ipath, "expected [gpu, gpu] or [gpu, gpu, links], "
                           "got %d elements", len);
    int v[3] = { 0, 0, 1 };
    for (int k = 0; k < len; k++) {
      g_autofree char *kpath = sim_json_place_index(ipath, k);
      if (!node_int(r, json_array_get_element(e, k), kpath, k < 2 ? 0 : 1,
                    k < 2 ? d->gpus - 1 : 64, &v[k]))
        return FALSE;
    }
    if (v[0] == v[1])
      return sim_json_fail(r, SIM_ERROR_INVALID, ipath, "expected two different GPUs, got %d twice",
                           v[0]);
    int a = MIN(v[0], v[1]), b = MAX(v[0], v[1]);
    if (seen[a * d->gpus + b])
      return sim_json_fail(r, SIM_ERROR_INVALID, ipath,
                           "GPUs %d and %d are already paired at %s[%d]", a, b, ppath,
                           seen[a * d->gpus + b] - 1);
    seen[a * d->gpus + b] = i + 1;
    d->pairs[i] = (SimNvlinkPair){ a, b, v[2] };
  }
  return TRUE;
}

static gboolean parse_fabric(Reader *r, JsonObject *node, const char *path, SimMachineDesc *d)
{
  JsonNode *fn = json_object_get_member(node, "fabric");
  d->fabric = SIM_FABRIC_PCIE;
  if (!fn)
    return TRUE;
  g_autofree char *fpath = sim_json_place_key(path, "fabric");
  JsonObject *f = get_object(r, fn, fpath);
  if (!f)
    return FALSE;
  const char *type = NULL;
  if (!member_string(r, f, fpath, "type", TRUE, &type))
    return FALSE;
  int kind = -1;
  for (int i = 0; sim_machine_fabric_names[i]; i++)
    if (!strcmp(type, sim_machine_fabric_names[i]))
      kind = i;
  if (kind < 0) {
    g_autofree char *where = sim_json_place_key(fpath, "type");
    g_autofree char *known = g_strjoinv(", ", (char **)sim_machine_fabric_names);
    return sim_json_fail(r, SIM_ERROR_UNKNOWN, where, "unknown fabric '%s'; known fabrics: %s",
                         type, known);
  }
  d->fabric = kind;
  switch (d->fabric) {
  case SIM_FABRIC_PCIE: {
    static const char *const keys[] = { "type", NULL };
    return sim_json_check_keys(r, f, fpath, keys);
  }
  case SIM_FABRIC_NVSWITCH: {
    static const char *const keys[] = { "type", "bandwidth_GBps", "bandwidth_Gbps",
                                        "latency_us", NULL };
    d->fabric_latency = DEFAULT_NVSWITCH_LATENCY;
    return sim_json_check_keys(r, f, fpath, keys) &&
           member_bandwidth(r, f, fpath, "bandwidth", TRUE, &d->fabric_bandwidth) &&
           member_latency(r, f, fpath, "latency_us", &d->fabric_latency);
  }
  case SIM_FABRIC_NVLINK_MESH: {
    static const char *const keys[] = { "type", "link_bandwidth_GBps", "link_bandwidth_Gbps",
                                        "latency_us", "pairs", NULL };
    d->fabric_latency = DEFAULT_NVLINK_LATENCY;
    return sim_json_check_keys(r, f, fpath, keys) &&
           member_bandwidth(r, f, fpath, "link_bandwidth", TRUE, &d->fabric_bandwidth) &&
           member_latency(r, f, fpath, "latency_us", &d->fabric_latency) &&
           parse_pairs(r, f, fpath, d);
  }
  }
  return TRUE;
}

/* "switches": a number (GPUs and sockets split evenly, in order) or a list of
 * {"gpus": [...], "socket": k} / {"gpus": [...], "parent": s}. */
static gboolean parse_switch_list(Reader *r, JsonArray *sa, const char *spath, SimMachineDesc *d)
{
  int n = (int)json_array_get_length(sa);
  if (n == 0)
    return sim_json_fail(r, SIM_ERROR_INVALID, spath,
                         "expected at least one PCIe switch, got none");
  d->n_switches = n;
  d->switches = g_new0(SimPcieSwitchDesc, n);
  for (int g = 0; g < d->gpus; g++)
    d->gpu_switch[g] = -1;
  for (int s = 0; s < n; s++) {
    g_autofree char *ipath = sim_json_place_index(spath, s);
    JsonObject *so = get_object(r, json_array_get_element(sa, s), ipath);
    if (!so)
      return FALSE;
    static const char *const keys[] = { "gpus", "socket", "parent", NULL };
    if (!sim_json_check_keys(r, so, ipath, keys))
      return FALSE;
    SimPcieSwitchDesc *sw = &d->switches[s];
    sw->parent = -1;
    sw->socket = 0;
    if (json_object_has_member(so, "socket") && json_object_has_member(so, "parent")) {
      g_autofree char *where = sim_json_place_key(ipath, "parent");
      return sim_json_fail(r, SIM_ERROR_PARSE, where, "give either socket or parent, not both");
    }
    if (!member_int(r, so, ipath, "socket", FALSE, 0, d->sockets - 1, &sw->socket))
      return FALSE;
    if (json_object_has_member(so, "parent")) {
      /* Parents come earlier in the list, which rules out cycles. */
      if (s == 0) {
        g_autofree char *where = sim_json_place_key(ipath, "parent");
        return sim_json_fail(r, SIM_ERROR_INVALID, where, "expected the index of an earlier "
                             "switch, but this is the first one");
      }
      if (!member_int(r, so, ipath, "parent", FALSE, 0, s - 1, &sw->parent))
        return FALSE;
    }
    JsonNode *gn = json_object_get_member(so, "gpus");
    if (!gn)
      continue;
    g_autofree char *gpath = sim_json_place_key(ipath, "gpus");
    JsonArray *ga = get_array(r, gn, gpath);
    if (!ga)
      return FALSE;
    for (guint k = 0; k < json_array_get_length(ga); k++) {
      g_autofree char *kpath = sim_json_place_index(gpath, (int)k);
      int gpu = 0;
      if (!node_int(r, json_array_get_element(ga, k), kpath, 0, d->gpus - 1, &gpu))
        return FALSE;
      if (d->gpu_switch[gpu] >= 0)
        return sim_json_fail(r, SIM_ERROR_INVALID, kpath, "GPU %d is already on switch %d", gpu,
                             d->gpu_switch[gpu]);
      d->gpu_switch[gpu] = s;
    }
  }
  for (int g = 0; g < d->gpus; g++)
    if (d->gpu_switch[g] < 0)
      return sim_json_fail(r, SIM_ERROR_INVALID, spath, "GPU %d is on no switch; every GPU of the "
                           "node needs one", g);
  return TRUE;
}

static gboolean parse_pcie(Reader *r, JsonObject *node, const char *path, SimMachineDesc *d)
{
  JsonNode *pn = json_object_get_member(node, "pcie");
  if (!pn)
    return sim_json_missing(r, path, "pcie", "an object with at least bandwidth_GBps");
  g_autofree char *ppath = sim_json_place_key(path, "pcie");
  JsonObject *p = get_object(r, pn, ppath);
  if (!p)
    return FALSE;
  static const char *const keys[] = {
    "bandwidth_GBps", "bandwidth_Gbps", "latency_us", "sockets", "switches",
    "intersocket_bandwidth_GBps", "intersocket_bandwidth_Gbps", "intersocket_latency_us", NULL,
  };
  d->pcie_latency = DEFAULT_PCIE_LATENCY;
  d->intersocket_latency = DEFAULT_INTERSOCKET_LATENCY;
  d->sockets = 1;
  if (!sim_json_check_keys(r, p, ppath, keys) ||
      !member_bandwidth(r, p, ppath, "bandwidth", TRUE, &d->pcie_bandwidth) ||
      !member_latency(r, p, ppath, "latency_us", &d->pcie_latency) ||
      !member_int(r, p, ppath, "sockets", FALSE, 1, 8, &d->sockets))
    return FALSE;
  if (!member_bandwidth(r, p, ppath, "intersocket_bandwidth", d->sockets > 1,
                        &d->intersocket_bandwidth) ||
      !member_latency(r, p, ppath, "intersocket_latency_us", &d->intersocket_latency))
    return FALSE;

  d->gpu_switch = g_new0(int, d->gpus);
  JsonNode *sn = json_object_get_member(p, "switches");
  g_autofree char *spath = sim_json_place_key(ppath, "switches");
  if (sn && JSON_NODE_HOLDS_ARRAY(sn))
    return parse_switch_list(r, json_node_get_array(sn), spath, d);
  int n = 1;
  if (sn && !node_int(r, sn, spath, 1, d->gpus, &n))
    return FALSE;
  d->n_switches = n;
  d->switches = g_new0(SimPcieSwitchDesc, n);
  for (int s = 0; s < n; s++)
    d->switches[s] = (SimPcieSwitchDesc){ .parent = -1, .socket = s * d->sockets / n };
  for (int g = 0; g < d->gpus; g++)
    d->gpu_switch[g] = g * n / d->gpus;
  return TRUE;
}

static gboolean parse_nics(Reader *r, JsonObject *node, const char *path, SimMachineDesc *d)
{
  JsonNode *nn = json_object_get_member(node, "nics");
  if (!nn)
    return TRUE;
  g_autofree char *npath = sim_json_place_key(path, "nics");
  JsonObject *o = get_object(r, nn, npath);
  if (!o)
    return FALSE;
  static const char *const keys[] = { "count", "bandwidth_Gbps", "bandwidth_GBps", "switches",
                                      NULL };
  if (!sim_json_check_keys(r, o, npath, keys) ||
      !member_int(r, o, npath, "count", TRUE, 1, 128, &d->n_nics) ||
      !member_bandwidth(r, o, npath, "bandwidth", TRUE, &d->nic_bandwidth))
    return FALSE;
  d->nic_switch = g_new0(int, d->n_nics);
  JsonNode *sn = json_object_get_member(o, "switches");
  if (!sn) {
    for (int k = 0; k < d->n_nics; k++)
      d->nic_switch[k] = k * d->n_switches / d->n_nics;
    return TRUE;
  }
  g_autofree char *spath = sim_json_place_key(npath, "switches");
  JsonArray *sa = get_array(r, sn, spath);
  if (!sa)
    return FALSE;
  if ((int)json_array_get_length(sa) != d->n_nics)
    return sim_json_fail(r, SIM_ERROR_INVALID, spath, "expected the switch of each of the %d "
                         "NICs, got %u entries", d->n_nics, json_array_get_length(sa));
  for (int k = 0; k < d->n_nics; k++) {
    g_autofree char *kpath = sim_json_place_index(spath, k);
    if (!node_int(r, json_array_get_element(sa, k), kpath, 0, d->n_switches - 1,
                  &d->nic_switch[k]))
      return FALSE;
  }
  return TRUE;
}

static gboolean parse_node(Reader *r, JsonObject *root, SimMachineDesc *d)
{
  JsonNode *nn = json_object_get_member(root, "node");
  if (!nn)
    return sim_json_missing(r, "", "node", "an object describing one node");
  JsonObject *node = get_object(r, nn, "node");
  if (!node)
    return FALSE;
  static const char *const keys[] = { "gpu", "gpus", "fabric", "pcie", "nics", NULL };
  return sim_json_check_keys(r, node, "node", keys) && parse_gpu(r, node, "node", d) &&
         member_int(r, node, "node", "gpus", TRUE, 1, MAX_GPUS_PER_NODE, &d->gpus) &&
         parse_fabric(r, node, "node", d) && parse_pcie(r, node, "node", d) &&
         parse_nics(r, node, "node", d);
}

/* ---------------------------------------------------------------------------------- */
/* The network                                                                         */

const char *const sim_machine_network_names[] = {
  "none", "single-switch", "fat-tree", "rail-optimized", NULL,
};

static gboolean parse_network(Reader *r, JsonObject *root, SimMachineDesc *d)
{
  JsonNode *nn = json_object_get_member(root, "network");
  d->network = SIM_NETWORK_NONE;
  if (!nn) {
    if (d->count > 1)
      return sim_json_fail(r, SIM_ERROR_PARSE, "network", "missing; a machine of %d nodes needs a "
                           "network between them", d->count);
    return TRUE;
  }
  JsonObject *o = get_object(r, nn, "network");
  if (!o)
    return FALSE;
  const char *type = NULL;
  if (!member_string(r, o, "network", "type", TRUE, &type))
    return FALSE;
  int kind = -1;
  for (int i = 1; sim_machine_network_names[i]; i++)
    if (!strcmp(type, sim_machine_network_names[i]))
      kind = i;
  if (kind < 0)
    return sim_json_fail(r, SIM_ERROR_UNKNOWN, "network.type", "unknown network '%s'; known "
                         "networks: single-switch, fat-tree, rail-optimized", type);
  d->network = kind;
  if (d->n_nics == 0)
    return sim_json_fail(r, SIM_ERROR_PARSE, "node.nics",
                         "missing; nodes need NICs to reach the network");

  static const char *const single_keys[] = { "type", "latency_us", NULL };
  static const char *const tree_keys[] = {
    "type", "latency_us", "nodes_per_leaf", "spines", "oversubscription", "bandwidth_Gbps",
    "bandwidth_GBps", "pxn", NULL,
  };
  d->network_latency = DEFAULT_NETWORK_LATENCY;
  d->network_bandwidth = d->nic_bandwidth;
  d->oversubscription = 1.0;
  d->nodes_per_leaf = 0;
  d->spines = 0;
  if (!sim_json_check_keys(r, o, "network", d->network == SIM_NETWORK_SINGLE_SWITCH ? single_keys
                                                                          : tree_keys) ||
      !member_latency(r, o, "network", "latency_us", &d->network_latency))
    return FALSE;
  if (d->network == SIM_NETWORK_SINGLE_SWITCH)
    return TRUE;
  if (!member_int(r, o, "network", "nodes_per_leaf", d->network == SIM_NETWORK_FAT_TREE, 1,
                  G_MAXINT, &d->nodes_per_leaf) ||
      !member_int(r, o, "network", "spines", FALSE, 1, 65536, &d->spines) ||
      !member_bandwidth(r, o, "network", "bandwidth", FALSE, &d->network_bandwidth))
    return FALSE;
  JsonNode *pn = json_object_get_member(o, "pxn");
  if (pn) {
    if (!JSON_NODE_HOLDS_VALUE(pn) || json_node_get_value_type(pn) != G_TYPE_BOOLEAN)
      return sim_json_fail(r, SIM_ERROR_INVALID, "network.pxn", "expected true or false");
    if (d->network != SIM_NETWORK_RAIL_OPTIMIZED)
      return sim_json_fail(r, SIM_ERROR_INVALID, "network.pxn", "only a rail-optimized "
                           "network has rails to relay to");
    d->no_pxn = !json_node_get_boolean(pn);
  }
  JsonNode *on = json_object_get_member(o, "oversubscription");
  if (on) {
    double v = 0;
    if (!node_number(r, on, "network.oversubscription", FALSE, 1.0, &v))
      return FALSE;
    if (v < 1.0)
      return sim_json_fail(r, SIM_ERROR_INVALID, "network.oversubscription", "expected a factor "
                           ">= 1 (1 is full bisection), got %g", v);
    d->oversubscription = v;
  }
  return TRUE;
}

/* ---------------------------------------------------------------------------------- */
/* The file                                                                            */

void sim_machine_desc_free(SimMachineDesc *d)
{
  if (!d)
    return;
  g_free(d->name);
  g_free(d->description);
  g_free(d->pairs);
  g_free(d->switches);
  g_free(d->gpu_switch);
  g_free(d->nic_switch);
  g_free(d);
}

G_DEFINE_AUTOPTR_CLEANUP_FUNC(SimMachineDesc, sim_machine_desc_free)

SimMachineDesc *sim_machine_desc_parse(const char *text, const char *filename,
                                       int count_override, GError **error)
{
  g_return_val_if_fail(text != NULL, NULL);
  Reader rd = SIM_JSON_READER(filename ? filename : "<machine>", error);
  Reader *r = &rd;

  g_autoptr(JsonParser) parser = json_parser_new();
  JsonObject *root = sim_json_read_root(r, parser, text, "parasol-machine");
  if (!root || !sim_json_check_format(r, root, "parasol-machine", 1))
    return NULL;
  static const char *const keys[] = {
    "format", "version", "name", "description", "node", "count", "network", NULL,
  };
  if (!sim_json_check_keys(r, root, "", keys))
    return NULL;

  g_autoptr(SimMachineDesc) d = g_new0(SimMachineDesc, 1);
  const char *name = NULL, *description = NULL;
  d->count = 1;
  if (!member_string(r, root, "", "name", TRUE, &name) ||
      !member_text(r, root, "", "description", FALSE, TRUE, &description) ||
      !member_int(r, root, "", "count", FALSE, 1, G_MAXINT, &d->count))
    return NULL;
  d->name = g_strdup(name);
  d->description = g_strdup(description ? description : "");
  if (count_override > 0 && count_override != d->count) {
    d->count = count_override;
    g_free(d->name);
    d->name = g_strdup_printf("%s:%d", name, count_override);
  }

  if (!parse_node(r, root, d))
    return NULL;
  if ((int64_t)d->count * d->gpus > MAX_DEVICES) {
    sim_json_fail(r, SIM_ERROR_INVALID, "count", "%d nodes of %d GPUs exceed the %d GPUs a "
                  "machine may have", d->count, d->gpus, MAX_DEVICES);
    return NULL;
  }
  if (!parse_network(r, root, d))
    return NULL;
  return g_steal_pointer(&d);
}

/* ---------------------------------------------------------------------------------- */
/* Public entry points                                                                 */

SimMachine *sim_machine_from_json(const char *text, const char *filename,
                                  int node_count_override, GError **error)
{
  g_return_val_if_fail(text != NULL, NULL);
  SimMachineDesc *d = sim_machine_desc_parse(text, filename, node_count_override, error);
  return d ? sim_machine_build(d) : NULL;
}

char *sim_machine_to_json(const SimMachine *m)
{
  g_return_val_if_fail(m != NULL, NULL);
  return g_strdup(m->json);
}
