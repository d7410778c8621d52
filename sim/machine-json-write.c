/* machine-json-write.c — machine files written out: a small pretty printer that keeps
 * every number the shortest text that reads back to the same double, and the writer of a
 * machine description (machine-json.c reads them; data/machines/README.md documents the
 * keys). */
#include "machine-json.h"

#include <math.h>
#include <string.h>


/* A small pretty printer: json-glib writes doubles with 17 digits ("0.29999999999999999"),
 * which makes machine files hard to read and diff. */
typedef struct {
  GString *s;
  int depth;
  gboolean has_items[16];
} Writer;

static void w_key(Writer *w, const char *key)
{
  if (w->has_items[w->depth])
    g_string_append_c(w->s, ',');
  w->has_items[w->depth] = TRUE;
  if (w->depth > 0) {
    g_string_append_c(w->s, '\n');
    for (int i = 0; i < w->depth; i++)
      g_string_append(w->s, "  ");
  }
  if (key)
    g_string_append_printf(w->s, "\"%s\": ", key);
}

static void w_open(Writer *w, const char *key, char bracket)
{
  w_key(w, key);
  g_string_append_c(w->s, bracket);
  w->depth++;
  g_assert(w->depth < (int)G_N_ELEMENTS(w->has_items));
  w->has_items[w->depth] = FALSE;
}

static void w_close(Writer *w, char bracket)
{
  gboolean had = w->has_items[w->depth];
  w->depth--;
  if (had) {
    g_string_append_c(w->s, '\n');
    for (int i = 0; i < w->depth; i++)
      g_string_append(w->s, "  ");
  }
  g_string_append_c(w->s, bracket);
}

static void append_escaped(GString *s, const char *text)
{
  g_string_append_c(s, '"');
  for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
    if (*p == '"' || *p == '\\')
      g_string_append_printf(s, "\\%c", *p);
    else if (*p == '\n')
      g_string_append(s, "\\n");
    else if (*p == '\t')
      g_string_append(s, "\\t");
    else if (*p < 0x20)
      g_string_append_printf(s, "\\u%04x", *p);
    else
      g_string_append_c(s, (char)*p);
  }
  g_string_append_c(s, '"');
}

static void w_string(Writer *w, const char *key, const char *v)
{
  w_key(w, key);
  append_escaped(w->s, v);
}

static void w_int(Writer *w, const char *key, int64_t v)
{
  w_key(w, key);
  g_string_append_printf(w->s, "%" G_GINT64_FORMAT, v);
}

/* The shortest text x with x * scale == v, so that reading it back is exact. */
static void append_scaled(GString *s, double v, double scale)
{
  char buf[G_ASCII_DTOSTR_BUF_SIZE];
  for (int prec = 6; prec <= 17; prec++) {
    char fmt[8];
    g_snprintf(fmt, sizeof fmt, "%%.%dg", prec);
    g_ascii_formatd(buf, sizeof buf, fmt, v / scale);
    if (g_ascii_strtod(buf, NULL) * scale == v)
      break;
  }
  g_string_append(s, buf);
}

static void w_number(Writer *w, const char *key, double v, double scale)
{
  w_key(w, key);
  append_scaled(w->s, v, scale);
}

static void w_raw(Writer *w, const char *key, const char *text)
{
  w_key(w, key);
  g_string_append(w->s, text);
}

static char *int_list(const int *v, int n)
{
  GString *s = g_string_new("[");
  for (int i = 0; i < n; i++)
    g_string_append_printf(s, "%s%d", i ? ", " : "", v[i]);
  g_string_append_c(s, ']');
  return g_string_free(s, FALSE);
}

static void write_gpu(Writer *w, const SimMachineDesc *d)
{
  if (!d->spec_inline) {
    w_string(w, "gpu", d->spec->name);
    return;
  }
  const SimDeviceSpec *sp = d->spec;
  w_open(w, "gpu", '{');
  w_string(w, "name", sp->name);
  w_string(w, "vendor_name", sp->vendor_name);
  w_open(w, "peak_TFLOPS", '{');
  for (int t = 0; t < SIM_DTYPE_COUNT; t++)
    w_number(w, sim_machine_dtype_keys[t], sp->peak_flops[t], TFLOPS);
  if (sp->tf32_flops > 0)
    w_number(w, "tf32", sp->tf32_flops, TFLOPS);
  w_close(w, '}');
  w_number(w, "memory_bandwidth_GBps", sp->mem_bandwidth, GBPS);
  /* Capacities are whole bytes: find the shortest GiB figure that rounds back to them. */
  w_key(w, "memory_GiB");
  char buf[G_ASCII_DTOSTR_BUF_SIZE];
  for (int prec = 6; prec <= 17; prec++) {
    char fmt[8];
    g_snprintf(fmt, sizeof fmt, "%%.%dg", prec);
    g_ascii_formatd(buf, sizeof buf, fmt, (double)sp->mem_capacity / GIB);
    if (llround(g_ascii_strtod(buf, NULL) * GIB) == sp->mem_capacity)
      break;
  }
  g_string_append(w->s, buf);
  w_int(w, "sm_count", sp->sm_count);
  w_number(w, "launch_overhead_us", sp->launch_overhead, USEC);
  if (sp->matmul_fraction > 0)
    w_number(w, "matmul_fraction", sp->matmul_fraction, 1.0);
  if (sp->matmul_fraction_fp8 > 0)
    w_number(w, "matmul_fraction_fp8", sp->matmul_fraction_fp8, 1.0);
  if (sp->attention_fraction > 0)
    w_number(w, "attention_fraction", sp->attention_fraction, 1.0);
  if (sp->attention_bwd_fraction > 0)
    w_number(w, "attention_bwd_fraction", sp->attention_bwd_fraction, 1.0);
  w_string(w, "source", sp->source);
  w_close(w, '}');
}

static void write_node(Writer *w, const SimMachineDesc *d)
{
  w_open(w, "node", '{');
  write_gpu(w, d);
  w_int(w, "gpus", d->gpus);

  w_open(w, "fabric", '{');
  w_string(w, "type", sim_machine_fabric_names[d->fabric]);
  if (d->fabric == SIM_FABRIC_NVSWITCH) {
    w_number(w, "bandwidth_GBps", d->fabric_bandwidth, GBPS);
    w_number(w, "latency_us", d->fabric_latency, USEC);
  } else if (d->fabric == SIM_FABRIC_NVLINK_MESH) {
    w_number(w, "link_bandwidth_GBps", d->fabric_bandwidth, GBPS);
    w_number(w, "latency_us", d->fabric_latency, USEC);
    w_open(w, "pairs", '[');
    for (int i = 0; i < d->n_pairs; i++) {
      g_autofree char *p =
        g_strdup_printf("[%d, %d, %d]", d->pairs[i].a, d->pairs[i].b, d->pairs[i].links);
      w_raw(w, NULL, p);
    }
    w_close(w, ']');
  }
  w_close(w, '}');

  w_open(w, "pcie", '{');
  w_number(w, "bandwidth_GBps", d->pcie_bandwidth, GBPS);
  w_number(w, "latency_us", d->pcie_latency, USEC);
  w_int(w, "sockets", d->sockets);
  if (d->sockets > 1) {
    w_number(w, "intersocket_bandwidth_GBps", d->intersocket_bandwidth, GBPS);
    w_number(w, "intersocket_latency_us", d->intersocket_latency, USEC);
  }
  w_open(w, "switches", '[');
  g_autofree int *gpus = g_new(int, d->gpus);
  for (int s = 0; s < d->n_switches; s++) {
    int n = 0;
    for (int g = 0; g < d->gpus; g++)
      if (d->gpu_switch[g] == s)
        gpus[n++] = g;
    g_autofree char *list = int_list(gpus, n);
    g_autofree char *obj =
      d->switches[s].parent >= 0
        ? g_strdup_printf("{ \"parent\": %d, \"gpus\": %s }", d->switches[s].parent, list)
        : g_strdup_printf("{ \"socket\": %d, \"gpus\": %s }", d->switches[s].socket, list);
    w_raw(w, NULL, obj);
  }
  w_close(w, ']');
  w_close(w, '}');

  if (d->n_nics > 0) {
    w_open(w, "nics", '{');
    w_int(w, "count", d->n_nics);
    w_number(w, "bandwidth_Gbps", d->nic_bandwidth, GBITPS);
    g_autofree char *list = int_list(d->nic_switch, d->n_nics);
    w_raw(w, "switches", list);
    w_close(w, '}');
  }
  w_close(w, '}');
}

static void write_network(Writer *w, const SimMachineDesc *d)
{
  if (d->network == SIM_NETWORK_NONE)
    return;
  w_open(w, "network", '{');
  w_string(w, "type", sim_machine_network_names[d->network]);
  if (d->network != SIM_NETWORK_SINGLE_SWITCH) {
    if (d->nodes_per_leaf > 0)
      w_int(w, "nodes_per_leaf", d->nodes_per_leaf);
    /* Spines left out are derived from the node count (README.md), so a file written
     * for one count still describes a sensible network at another. */
    if (d->spines > 0)
      w_int(w, "spines", d->spines);
    w_number(w, "oversubscription", d->oversubscription, 1.0);
    w_number(w, "bandwidth_Gbps", d->network_bandwidth, GBITPS);
    if (d->network == SIM_NETWORK_RAIL_OPTIMIZED)
      w_raw(w, "pxn", d->no_pxn ? "false" : "true");
  }
  w_number(w, "latency_us", d->network_latency, USEC);
  w_close(w, '}');
}

char *sim_machine_desc_to_json(const SimMachineDesc *d)
{
  Writer w = { .s = g_string_new(NULL) };
  w_open(&w, NULL, '{');
  w_string(&w, "format", "parasol-machine");
  w_int(&w, "version", 1);
  w_string(&w, "name", d->name);
  w_string(&w, "description", d->description);
  write_node(&w, d);
  w_int(&w, "count", d->count);
  write_network(&w, d);
  w_close(&w, '}');
  g_string_append_c(w.s, '\n');
  return g_string_free(w.s, FALSE);
}

