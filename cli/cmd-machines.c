/* cmd-machines.c — `parasol machines` lists the embedded machine library; `parasol machine
 * show` describes one machine (a library name, NAME:NODES, or a machine file): its nodes and
 * devices with their spec, its links, and the GPU-to-GPU bandwidths its routes give. */
#include "cli.h"

#include <json-glib/json-glib.h>
#include <math.h>
#include <string.h>

/* Machines with more links than this show node 0 and its network cables only (the other
 * nodes repeat node 0), unless --all-links is given. */
#define MAX_LINKS_LISTED 256
/* Machines with more devices than this show the matrix of node 0 and inter-node rows. */
#define MAX_MATRIX_DEVICES 16

/* The first sentence of a description, without "Sources: ...". */
static char *first_sentence(const char *text)
{
  const char *end = strstr(text, ". ");
  if (!end)
    end = text + strlen(text);
  while (end > text && end[-1] == '.')
    end--;
  return g_strndup(text, (gsize)(end - text));
}

/* ---------------------------------------------------------------------------------- */
/* parasol machines                                                                    */

int cmd_machines(int argc, char **argv)
{
  gboolean json = FALSE;
  GOptionEntry entries[] = {
    { "json", 0, 0, G_OPTION_ARG_NONE, &json, "Print a JSON array", NULL },
    { NULL, 0, 0, 0, NULL, NULL, NULL },
  };
  g_set_prgname("parasol machines");
  g_autoptr(GOptionContext) ctx = g_option_context_new("- list the machines of the library");
  g_option_context_set_description(ctx,
      "Every machine loads by name, and NAME:N gives N nodes of its node type\n"
      "(dgx-a100:64 is 512 GPUs).  'parasol machine show NAME' describes one.\n");
  g_option_context_add_main_entries(ctx, entries, NULL);
  if (!cli_parse_options(ctx, &argc, &argv))
    return CLI_EXIT_USAGE;
  if (argc > 1)
    return cli_usage_error("machines", "unexpected argument '%s'", argv[1]);

  g_auto(GStrv) names = sim_machine_library_names();
  g_autoptr(JsonBuilder) b = json_builder_new();
  json_builder_begin_array(b);
  int width = 4;
  for (char **n = names; *n; n++)
    width = MAX(width, (int)strlen(*n));
  if (!json)
    printf("%-*s  %7s  %s\n", width, "name", "devices", "description");
  for (char **n = names; *n; n++) {
    GError *error = NULL;
    g_autoptr(SimMachine) m = sim_machine_load(*n, &error);
    if (!m)
      return cli_report_error(error);
    g_autofree char *desc = sim_machine_library_description(*n);
    g_autofree char *line = first_sentence(desc ? desc : "");
    if (!json) {
      printf("%-*s  %7d  %s\n", width, *n, sim_machine_n_devices(m), line);
      continue;
    }
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "name");
    json_builder_add_string_value(b, *n);
    json_builder_set_member_name(b, "description");
    json_builder_add_string_value(b, desc ? desc : "");
    json_builder_set_member_name(b, "nodes");
    json_builder_add_int_value(b, sim_machine_n_nodes(m));
    json_builder_set_member_name(b, "devices");
    json_builder_add_int_value(b, sim_machine_n_devices(m));
    json_builder_set_member_name(b, "gpu");
    json_builder_add_string_value(b, sim_machine_device_spec(m, 0)->name);
    json_builder_end_object(b);
  }
  json_builder_end_array(b);
  if (json) {
    g_autoptr(JsonNode) root = json_builder_get_root(b);
    g_autofree char *text = json_to_string(root, TRUE);
    printf("%s\n", text);
  }
  return CLI_EXIT_OK;
}

/* ---------------------------------------------------------------------------------- */
/* What `machine show` prints, text and JSON alike                                     */

/* Links that share kind, bandwidth and latency, counted. */
typedef struct {
  SimLinkKind kind;
  double bandwidth, latency;
  int count;
} LinkGroup;

static GArray *link_groups(const SimMachine *m)
{
  GArray *groups = g_array_new(FALSE, FALSE, sizeof(LinkGroup));
  for (int l = 0; l < sim_machine_n_links(m); l++) {
    SimLinkKind k = sim_machine_link_kind(m, l);
    double bw = sim_machine_link_bandwidth(m, l), lat = sim_machine_link_latency(m, l);
    guint i = 0;
    for (; i < groups->len; i++) {
      LinkGroup *g = &g_array_index(groups, LinkGroup, i);
      if (g->kind == k && g->bandwidth == bw && g->latency == lat) {
        g->count++;
        break;
      }
    }
    if (i == groups->len) {
      LinkGroup g = { k, bw, lat, 1 };
      g_array_append_val(groups, g);
    }
  }
  return groups;
}

/* Links of node 0 and the cables between its NICs and the network, recognized by their
 * names ("node0/gpu0->nvswitch", "rail2.leaf0->node0/nic2"). */
static gboolean link_touches_node0(const SimMachine *m, int l)
{
  const char *name = sim_machine_link_name(m, l);
  return g_str_has_prefix(name, "node0/") || strstr(name, "->node0/") != NULL;
}

static gboolean list_all_links(const SimMachine *m, gboolean all_links)
{
  return all_links || sim_machine_n_links(m) <= MAX_LINKS_LISTED;
}

/* The devices of the matrix: all of them on small machines, else node 0's. */
static int matrix_size(const SimMachine *m)
{
  int n = sim_machine_n_devices(m);
  return n <= MAX_MATRIX_DEVICES ? n : sim_machine_node_n_devices(m, 0);
}

/* Rows from device 0 to the GPUs of other nodes, when the matrix does not cover them: to
 * node 1, and to the last node when there are more than two (it may sit under another
 * leaf). */
static int inter_node_targets(const SimMachine *m, int *nodes)
{
  int n_nodes = sim_machine_n_nodes(m);
  if (sim_machine_n_devices(m) <= MAX_MATRIX_DEVICES || n_nodes < 2)
    return 0;
  nodes[0] = 1;
  if (n_nodes == 2)
    return 1;
  nodes[1] = n_nodes - 1;
  return 2;
}

static int node_first_device(const SimMachine *m, int node)
{
  return node * sim_machine_node_n_devices(m, 0);
}

/* ---------------------------------------------------------------------------------- */
/* Text                                                                                */

static void print_spec(const SimDeviceSpec *s)
{
  g_autofree char *mem = cli_format_bytes((double)s->mem_capacity);
  g_autofree char *launch = cli_format_time(s->launch_overhead);
  printf("gpu          %s (%s)\n", s->vendor_name, s->name);
  printf("             peak TFLOP/s:");
  for (int t = 0; t < SIM_DTYPE_COUNT; t++) {
    if (s->peak_flops[t] > 0)
      printf(" %s %.4g", sim_dtype_name(t), s->peak_flops[t] / 1e12);
    else
      printf(" %s -", sim_dtype_name(t));
  }
  printf("\n             memory %s at %.4g GB/s, %d SMs, launch %s\n", mem,
         s->mem_bandwidth / 1e9, s->sm_count, launch);
  printf("             source: %s\n", s->source);
}

static void print_matrix(const SimMachine *m, const char *title,
                         double (*metric)(const SimMachine *, int, int),
                         double scale, const char *fmt)
{
  int n = matrix_size(m);
  int per_node = sim_machine_node_n_devices(m, 0);
  printf("\n%s\n%8s", title, "");
  for (int b = 0; b < n; b++)
    printf(" %6d", b);
  printf("\n");
  for (int a = 0; a < n; a++) {
    printf("%8d", a);
    for (int b = 0; b < n; b++) {
      if (a == b) {
        printf(" %6s", "-");
        continue;
      }
      char cell[32];
      g_snprintf(cell, sizeof cell, fmt, metric(m, a, b) * scale);
      printf(" %6s", cell);
    }
    printf("\n");
  }
  int nodes[2];
  int rows = inter_node_targets(m, nodes);
  for (int r = 0; r < rows; r++) {
    int first = node_first_device(m, nodes[r]);
    printf("  0 -> node %d (devices %d..%d):", nodes[r], first, first + per_node - 1);
    for (int b = 0; b < per_node; b++) {
      char cell[32];
      g_snprintf(cell, sizeof cell, fmt, metric(m, 0, first + b) * scale);
      printf(" %s", cell);
    }
    printf("\n");
  }
}

static void show_text(const SimMachine *m, gboolean all_links)
{
  const SimDeviceSpec *spec = sim_machine_device_spec(m, 0);
  int n_nodes = sim_machine_n_nodes(m), per_node = sim_machine_node_n_devices(m, 0);
  const char *desc = "";
  g_autofree char *json = sim_machine_to_json(m);
  g_autoptr(JsonParser) parser = json_parser_new();
  if (json_parser_load_from_data(parser, json, -1, NULL))
    desc = json_object_get_string_member_with_default(
      json_node_get_object(json_parser_get_root(parser)), "description", "");
  g_autofree char *line = first_sentence(desc);

  printf("machine      %s\n", sim_machine_get_name(m));
  if (*line)
    printf("description  %s\n", line);
  printf("nodes        %d x %d GPUs = %d devices (device d is GPU d %% %d of node d / %d)\n",
         n_nodes, per_node, sim_machine_n_devices(m), per_node, per_node);
  print_spec(spec);

  printf("links        %d directed (a full-duplex cable is two)\n", sim_machine_n_links(m));
  g_autoptr(GArray) groups = link_groups(m);
  for (guint i = 0; i < groups->len; i++) {
    const LinkGroup *g = &g_array_index(groups, LinkGroup, i);
    printf("  %6d x %-12s %8.4g GB/s %7.3g us\n", g->count, sim_link_kind_name(g->kind),
           g->bandwidth / 1e9, g->latency * 1e6);
  }

  gboolean all = list_all_links(m, all_links);
  int name_w = 4;
  for (int l = 0; l < sim_machine_n_links(m); l++)
    if (all || link_touches_node0(m, l))
      name_w = MAX(name_w, (int)strlen(sim_machine_link_name(m, l)));
  printf("\n%s\n", all ? "Links:" : "Links of node 0 and its network cables (the other nodes "
                                    "repeat node 0; --all-links lists every link):");
  printf("%7s  %-*s  %-12s %10s %9s\n", "#", name_w, "link", "kind", "GB/s", "us");
  for (int l = 0; l < sim_machine_n_links(m); l++) {
    if (!all && !link_touches_node0(m, l))
      continue;
    printf("%7d  %-*s  %-12s %10.4g %9.3g\n", l, name_w, sim_machine_link_name(m, l),
           sim_link_kind_name(sim_machine_link_kind(m, l)), sim_machine_link_bandwidth(m, l) / 1e9,
           sim_machine_link_latency(m, l) * 1e6);
  }

  if (sim_machine_n_devices(m) < 2)
    return;
  print_matrix(m, sim_machine_n_devices(m) <= MAX_MATRIX_DEVICES
                    ? "GPU-to-GPU bandwidth (GB/s per direction, route bottleneck):"
                    : "GPU-to-GPU bandwidth of node 0 (GB/s per direction, route bottleneck):",
               sim_machine_bandwidth, 1e-9, "%.3g");
  print_matrix(m, "GPU-to-GPU latency (us, summed over the route's links):",
               sim_machine_latency, 1e6, "%.3g");
}

/* ---------------------------------------------------------------------------------- */
/* JSON                                                                                */

static void add_link_json(JsonBuilder *b, const SimMachine *m, int l)
{
  json_builder_begin_object(b);
  json_builder_set_member_name(b, "id");
  json_builder_add_int_value(b, l);
  json_builder_set_member_name(b, "name");
  json_builder_add_string_value(b, sim_machine_link_name(m, l));
  json_builder_set_member_name(b, "kind");
  json_builder_add_string_value(b, sim_link_kind_name(sim_machine_link_kind(m, l)));
  json_builder_set_member_name(b, "bandwidth_GBps");
  json_builder_add_double_value(b, sim_machine_link_bandwidth(m, l) / 1e9);
  json_builder_set_member_name(b, "latency_us");
  json_builder_add_double_value(b, sim_machine_link_latency(m, l) * 1e6);
  json_builder_end_object(b);
}

/* A row of bandwidths (GB/s) from @src to @n devices from @first; null for itself. */
static void add_row_json(JsonBuilder *b, const SimMachine *m, int src, int first, int n)
{
  json_builder_begin_array(b);
  for (int d = first; d < first + n; d++) {
    if (d == src)
      json_builder_add_null_value(b);
    else
      json_builder_add_double_value(b, sim_machine_bandwidth(m, src, d) / 1e9);
  }
  json_builder_end_array(b);
}

static void show_json(const SimMachine *m, gboolean all_links)
{
  const SimDeviceSpec *s = sim_machine_device_spec(m, 0);
  g_autoptr(JsonBuilder) b = json_builder_new();
  json_builder_begin_object(b);
  json_builder_set_member_name(b, "name");
  json_builder_add_string_value(b, sim_machine_get_name(m));
  json_builder_set_member_name(b, "nodes");
  json_builder_add_int_value(b, sim_machine_n_nodes(m));
  json_builder_set_member_name(b, "gpus_per_node");
  json_builder_add_int_value(b, sim_machine_node_n_devices(m, 0));
  json_builder_set_member_name(b, "devices");
  json_builder_add_int_value(b, sim_machine_n_devices(m));

  json_builder_set_member_name(b, "gpu");
  json_builder_begin_object(b);
  json_builder_set_member_name(b, "name");
  json_builder_add_string_value(b, s->name);
  json_builder_set_member_name(b, "vendor_name");
  json_builder_add_string_value(b, s->vendor_name);
  json_builder_set_member_name(b, "peak_TFLOPS");
  json_builder_begin_object(b);
  for (int t = 0; t < SIM_DTYPE_COUNT; t++) {
    json_builder_set_member_name(b, sim_dtype_name(t));
    json_builder_add_double_value(b, s->peak_flops[t] / 1e12);
  }
  json_builder_end_object(b);
  json_builder_set_member_name(b, "memory_bandwidth_GBps");
  json_builder_add_double_value(b, s->mem_bandwidth / 1e9);
  json_builder_set_member_name(b, "memory_bytes");
  json_builder_add_int_value(b, s->mem_capacity);
  json_builder_set_member_name(b, "sm_count");
  json_builder_add_int_value(b, s->sm_count);
  json_builder_set_member_name(b, "launch_overhead_us");
  json_builder_add_double_value(b, s->launch_overhead * 1e6);
  json_builder_set_member_name(b, "source");
  json_builder_add_string_value(b, s->source);
  json_builder_end_object(b);

  /* The description the machine was loaded from, every default written out. */
  g_autofree char *desc_text = sim_machine_to_json(m);
  g_autoptr(JsonParser) parser = json_parser_new();
  if (json_parser_load_from_data(parser, desc_text, -1, NULL)) {
    json_builder_set_member_name(b, "description");
    json_builder_add_value(b, json_node_copy(json_parser_get_root(parser)));
  }

  json_builder_set_member_name(b, "n_links");
  json_builder_add_int_value(b, sim_machine_n_links(m));
  json_builder_set_member_name(b, "link_groups");
  json_builder_begin_array(b);
  g_autoptr(GArray) groups = link_groups(m);
  for (guint i = 0; i < groups->len; i++) {
    const LinkGroup *g = &g_array_index(groups, LinkGroup, i);
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "kind");
    json_builder_add_string_value(b, sim_link_kind_name(g->kind));
    json_builder_set_member_name(b, "bandwidth_GBps");
    json_builder_add_double_value(b, g->bandwidth / 1e9);
    json_builder_set_member_name(b, "latency_us");
    json_builder_add_double_value(b, g->latency * 1e6);
    json_builder_set_member_name(b, "count");
    json_builder_add_int_value(b, g->count);
    json_builder_end_object(b);
  }
  json_builder_end_array(b);

  gboolean all = list_all_links(m, all_links);
  json_builder_set_member_name(b, "links_listed");
  json_builder_add_string_value(b, all ? "all" : "node0");
  json_builder_set_member_name(b, "links");
  json_builder_begin_array(b);
  for (int l = 0; l < sim_machine_n_links(m); l++)
    if (all || link_touches_node0(m, l))
      add_link_json(b, m, l);
  json_builder_end_array(b);

  int n = matrix_size(m);
  json_builder_set_member_name(b, "bandwidth_GBps");
  json_builder_begin_object(b);
  json_builder_set_member_name(b, "devices");
  json_builder_begin_array(b);
  for (int d = 0; d < n; d++)
    json_builder_add_int_value(b, d);
  json_builder_end_array(b);
  json_builder_set_member_name(b, "matrix");
  json_builder_begin_array(b);
  for (int a = 0; a < n; a++)
    add_row_json(b, m, a, 0, n);
  json_builder_end_array(b);
  int nodes[2];
  int rows = inter_node_targets(m, nodes);
  json_builder_set_member_name(b, "inter_node");
  json_builder_begin_array(b);
  for (int r = 0; r < rows; r++) {
    int first = node_first_device(m, nodes[r]);
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "from");
    json_builder_add_int_value(b, 0);
    json_builder_set_member_name(b, "node");
    json_builder_add_int_value(b, nodes[r]);
    json_builder_set_member_name(b, "first_device");
    json_builder_add_int_value(b, first);
    json_builder_set_member_name(b, "row");
    add_row_json(b, m, 0, first, sim_machine_node_n_devices(m, nodes[r]));
    json_builder_end_object(b);
  }
  json_builder_end_array(b);
  json_builder_end_object(b);
  json_builder_end_object(b);

  g_autoptr(JsonNode) root = json_builder_get_root(b);
  g_autofree char *text = json_to_string(root, TRUE);
  printf("%s\n", text);
}

/* ---------------------------------------------------------------------------------- */
/* parasol machine show                                                                */

static int machine_show(int argc, char **argv)
{
  gboolean json = FALSE, all_links = FALSE;
  GOptionEntry entries[] = {
    { "json", 0, 0, G_OPTION_ARG_NONE, &json, "Print a JSON object", NULL },
    { "all-links", 'a', 0, G_OPTION_ARG_NONE, &all_links,
      "List every link, not only node 0's, on large machines", NULL },
    { NULL, 0, 0, 0, NULL, NULL, NULL },
  };
  g_set_prgname("parasol machine show");
  g_autoptr(GOptionContext) ctx = g_option_context_new("NAME|FILE - describe a machine");
  g_option_context_set_description(ctx,
      "NAME is a machine of the library ('parasol machines' lists them), NAME:N the same\n"
      "with N nodes, FILE a machine file (\"format\": \"parasol-machine\", described in\n"
      "data/machines/README.md).  Prints the nodes, the GPU's spec, the links with their\n"
      "bandwidth and latency, and the GPU-to-GPU bandwidth of the routes.\n\n"
      "Example: parasol machine show dgx-a100:4\n");
  g_option_context_add_main_entries(ctx, entries, NULL);
  if (!cli_parse_options(ctx, &argc, &argv))
    return CLI_EXIT_USAGE;
  if (argc < 2)
    return cli_usage_error("machine show", "expected a machine name or a machine file; "
                           "'parasol machines' lists the names");
  if (argc > 2)
    return cli_usage_error("machine show", "unexpected argument '%s'", argv[2]);

  GError *error = NULL;
  g_autoptr(SimMachine) m = sim_machine_load(argv[1], &error);
  if (!m)
    return cli_report_error(error);
  if (json)
    show_json(m, all_links);
  else
    show_text(m, all_links);
  return CLI_EXIT_OK;
}

static void machine_usage(FILE *out)
{
  fprintf(out, "Usage: parasol machine COMMAND [OPTIONS]\n\n"
               "Commands:\n"
               "  show NAME|FILE   nodes, devices, links and GPU-to-GPU bandwidths of a machine\n\n"
               "Run 'parasol machine COMMAND --help' for the options of a command.\n");
}

int cmd_machine(int argc, char **argv)
{
  if (argc < 2) {
    machine_usage(stderr);
    return CLI_EXIT_USAGE;
  }
  const char *sub = argv[1];
  if (!strcmp(sub, "--help") || !strcmp(sub, "-h") || !strcmp(sub, "help")) {
    machine_usage(stdout);
    return CLI_EXIT_OK;
  }
  if (!strcmp(sub, "show"))
    return machine_show(argc - 1, argv + 1);
  return cli_usage_error("machine", "unknown command '%s'; 'parasol machine --help' lists them",
                         sub);
}
