/* cmd-models.c — `parasol models` lists the model zoo; `parasol model show` describes one
 * model (a zoo name with its parameters, or a graph file): its operators and tensors,
 * parameter count and FLOPs. */
#include "cli.h"
#include "parasol-search.h"

#include <json-glib/json-glib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------- */
/* parasol models                                                                      */

static void models_json(gboolean with_params)
{
  g_autoptr(JsonBuilder) b = json_builder_new();
  json_builder_begin_array(b);
  for (int i = 0; i < sim_zoo_n_models(); i++) {
    const char *name = sim_zoo_model_name(i);
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "name");
    json_builder_add_string_value(b, name);
    json_builder_set_member_name(b, "description");
    json_builder_add_string_value(b, sim_zoo_model_description(i));
    if (with_params) {
      json_builder_set_member_name(b, "params");
      json_builder_begin_array(b);
      for (const SimModelParam *p = sim_zoo_model_params(name); p->name; p++) {
        json_builder_begin_object(b);
        json_builder_set_member_name(b, "name");
        json_builder_add_string_value(b, p->name);
        json_builder_set_member_name(b, "default");
        json_builder_add_int_value(b, p->value);
        json_builder_set_member_name(b, "help");
        json_builder_add_string_value(b, p->help);
        json_builder_end_object(b);
      }
      json_builder_end_array(b);
    }
    json_builder_end_object(b);
  }
  json_builder_end_array(b);
  g_autoptr(JsonNode) root = json_builder_get_root(b);
  g_autofree char *text = json_to_string(root, TRUE);
  printf("%s\n", text);
}

int cmd_models(int argc, char **argv)
{
  gboolean json = FALSE, with_params = FALSE;
  GOptionEntry entries[] = {
    { "params", 'p', 0, G_OPTION_ARG_NONE, &with_params,
      "Also list each model's parameters with their defaults", NULL },
    { "json", 0, 0, G_OPTION_ARG_NONE, &json, "Print a JSON array", NULL },
    { NULL, 0, 0, 0, NULL, NULL, NULL },
  };
  g_set_prgname("parasol models");
  g_autoptr(GOptionContext) ctx = g_option_context_new("- list the models of the zoo");
  g_option_context_set_description(ctx,
      "Every model takes --param batch=N (the global batch of one iteration) and the\n"
      "parameters --params lists.  'parasol model show NAME' describes one model.\n");
  g_option_context_add_main_entries(ctx, entries, NULL);
  if (!cli_parse_options(ctx, &argc, &argv))
    return CLI_EXIT_USAGE;
  if (argc > 1)
    return cli_usage_error("models", "unexpected argument '%s'", argv[1]);

  if (json) {
    models_json(with_params);
    return CLI_EXIT_OK;
  }
  int width = 0;
  for (int i = 0; i < sim_zoo_n_models(); i++)
    width = MAX(width, (int)strlen(sim_zoo_model_name(i)));
  for (int i = 0; i < sim_zoo_n_models(); i++) {
    const char *name = sim_zoo_model_name(i);
    printf("%-*s  %s\n", width, name, sim_zoo_model_description(i));
    if (!with_params)
      continue;
    for (const SimModelParam *p = sim_zoo_model_params(name); p->name; p++)
      printf("%-*s    %s=%" G_GINT64_FORMAT "  %s\n", width, "", p->name, p->value, p->help);
  }
  return CLI_EXIT_OK;
}

/* ---------------------------------------------------------------------------------- */
/* parasol model show                                                                  */

/* The parameters a zoo model was built with: its defaults overridden by --param. */
static SimModelParams *resolved_params(const char *name, char **params)
{
  const SimModelParam *table = sim_zoo_model_params(name);
  if (!table)
    return NULL;
  SimModelParams *given = sim_model_params_new();
  for (char **it = params; it && *it; it++)
    sim_model_params_parse(given, *it, NULL);
  SimModelParams *all = sim_model_params_new();
  for (const SimModelParam *p = table; p->name; p++) {
    int64_t v = p->value;
    sim_model_params_lookup(given, p->name, &v);
    sim_model_params_set(all, p->name, v);
  }
  sim_model_params_free(given);
  return all;
}

static void add_shape(JsonBuilder *b, SimShape s)
{
  json_builder_begin_array(b);
  for (int d = 0; d < s.ndim; d++)
    json_builder_add_int_value(b, s.dims[d]);
  json_builder_end_array(b);
}

static void show_json(const SimGraph *g, const char *name, const SimModelParams *params)
{
  g_autoptr(JsonBuilder) b = json_builder_new();
  json_builder_begin_object(b);
  json_builder_set_member_name(b, "name");
  json_builder_add_string_value(b, sim_graph_get_name(g));
  json_builder_set_member_name(b, "source");
  json_builder_add_string_value(b, params ? "zoo" : name);
  if (params) {
    json_builder_set_member_name(b, "params");
    json_builder_begin_object(b);
    for (const SimModelParam *p = sim_zoo_model_params(name); p->name; p++) {
      int64_t v = 0;
      sim_model_params_lookup(params, p->name, &v);
      json_builder_set_member_name(b, p->name);
      json_builder_add_int_value(b, v);
    }
    json_builder_end_object(b);
  }
  json_builder_set_member_name(b, "batch");
  json_builder_add_int_value(b, sim_graph_batch_size(g));
  json_builder_set_member_name(b, "tokens_per_sample");
  json_builder_add_int_value(b, sim_graph_tokens_per_sample(g));
  json_builder_set_member_name(b, "parameters");
  json_builder_add_int_value(b, sim_graph_n_params(g));
  json_builder_set_member_name(b, "forward_flops");
  json_builder_add_double_value(b, sim_graph_forward_flops(g));
  json_builder_set_member_name(b, "backward_flops");
  json_builder_add_double_value(b, sim_graph_backward_flops(g));
  json_builder_set_member_name(b, "ops");
  json_builder_add_int_value(b, sim_graph_n_ops(g));
  json_builder_set_member_name(b, "tensors");
  json_builder_add_int_value(b, sim_graph_n_tensors(g));

  json_builder_set_member_name(b, "operators");
  json_builder_begin_array(b);
  for (int op = 0; op < sim_graph_n_ops(g); op++) {
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "name");
    json_builder_add_string_value(b, sim_graph_op_name(g, op));
    json_builder_set_member_name(b, "type");
    json_builder_add_string_value(b, sim_op_type_name(sim_graph_op_type(g, op)));
    json_builder_set_member_name(b, "inputs");
    json_builder_begin_array(b);
    for (int i = 0; i < sim_graph_op_n_inputs(g, op); i++)
      json_builder_add_string_value(b, sim_graph_tensor_name(g, sim_graph_op_input(g, op, i)));
    json_builder_end_array(b);
    json_builder_set_member_name(b, "outputs");
    json_builder_begin_array(b);
    for (int i = 0; i < sim_graph_op_n_outputs(g, op); i++) {
      int t = sim_graph_op_output(g, op, i);
      json_builder_begin_object(b);
      json_builder_set_member_name(b, "name");
      json_builder_add_string_value(b, sim_graph_tensor_name(g, t));
      json_builder_set_member_name(b, "shape");
      add_shape(b, sim_graph_tensor_shape(g, t));
      json_builder_set_member_name(b, "dtype");
      json_builder_add_string_value(b, sim_dtype_name(sim_graph_tensor_dtype(g, t)));
      json_builder_end_object(b);
    }
    json_builder_end_array(b);
    json_builder_set_member_name(b, "weights");
    json_builder_begin_array(b);
    for (int i = 0; i < sim_graph_op_n_weights(g, op); i++)
      add_shape(b, sim_graph_op_weight_shape(g, op, i));
    json_builder_end_array(b);
    json_builder_set_member_name(b, "parameters");
    json_builder_add_int_value(b, sim_graph_op_n_params(g, op));
    json_builder_set_member_name(b, "forward_flops");
    json_builder_add_double_value(b, sim_graph_op_forward_flops(g, op));
    json_builder_set_member_name(b, "backward_flops");
    json_builder_add_double_value(b, sim_graph_op_backward_flops(g, op));
    if (sim_graph_op_is_checkpoint(g, op)) {
      json_builder_set_member_name(b, "checkpoint");
      json_builder_add_boolean_value(b, TRUE);
    }
    if (sim_graph_op_is_selective_recompute(g, op)) {
      json_builder_set_member_name(b, "selective_recompute");
      json_builder_add_boolean_value(b, TRUE);
    }
    json_builder_end_object(b);
  }
  json_builder_end_array(b);
  json_builder_end_object(b);

  g_autoptr(JsonNode) root = json_builder_get_root(b);
  g_autofree char *text = json_to_string(root, TRUE);
  printf("%s\n", text);
}

/* "[64, 3, 224, 224]" for the first output; "[..] +2" when the op has more outputs. */
static char *op_output_text(const SimGraph *g, int op)
{
  SimShape s = sim_graph_tensor_shape(g, sim_graph_op_output(g, op, 0));
  g_autofree char *shape = sim_shape_to_string(&s);
  int extra = sim_graph_op_n_outputs(g, op) - 1;
  return extra > 0 ? g_strdup_printf("%s +%d", shape, extra) : g_strdup(shape);
}

static void show_text(const SimGraph *g, const char *name, const SimModelParams *params,
                      gboolean brief, gboolean tensors)
{
  g_autofree char *n_params = cli_format_count((double)sim_graph_n_params(g));
  g_autofree char *fwd = cli_format_count(sim_graph_forward_flops(g));
  g_autofree char *bwd = cli_format_count(sim_graph_backward_flops(g));
  printf("model        %s (%s)\n", sim_graph_get_name(g), params ? "zoo" : name);
  if (params) {
    printf("params      ");
    for (const SimModelParam *p = sim_zoo_model_params(name); p->name; p++) {
      int64_t v = 0;
      sim_model_params_lookup(params, p->name, &v);
      printf(" %s=%" G_GINT64_FORMAT, p->name, v);
    }
    printf("\n");
  }
  printf("parameters   %s (%" G_GINT64_FORMAT ")\n", n_params, sim_graph_n_params(g));
  printf("batch        %" G_GINT64_FORMAT, sim_graph_batch_size(g));
  if (sim_graph_tokens_per_sample(g) > 1)
    printf(" x %" G_GINT64_FORMAT " tokens", sim_graph_tokens_per_sample(g));
  printf("\n");
  printf("forward      %sFLOP per iteration\n", fwd);
  printf("backward     %sFLOP per iteration\n", bwd);
  printf("operators    %d\n", sim_graph_n_ops(g));
  printf("tensors      %d\n", sim_graph_n_tensors(g));
  if (brief)
    return;

  int name_w = 8, type_w = 4, out_w = 6;
  for (int op = 0; op < sim_graph_n_ops(g); op++) {
    g_autofree char *out = op_output_text(g, op);
    name_w = MAX(name_w, (int)strlen(sim_graph_op_name(g, op)));
    type_w = MAX(type_w, (int)strlen(sim_op_type_name(sim_graph_op_type(g, op))));
    out_w = MAX(out_w, (int)strlen(out));
  }
  printf("\n%5s  %-*s  %-*s  %-*s  %12s  %14s\n", "#", name_w, "operator", type_w, "type",
         out_w, "output", "params", "forward FLOP");
  for (int op = 0; op < sim_graph_n_ops(g); op++) {
    g_autofree char *out = op_output_text(g, op);
    double f = sim_graph_op_forward_flops(g, op);
    g_autofree char *flops = f > 0 ? cli_format_count(f) : g_strdup("0");
    printf("%5d  %-*s  %-*s  %-*s  %12" G_GINT64_FORMAT "  %14s\n", op, name_w,
           sim_graph_op_name(g, op), type_w, sim_op_type_name(sim_graph_op_type(g, op)),
           out_w, out, sim_graph_op_n_params(g, op), flops);
  }
  if (!tensors)
    return;

  int tname_w = 6;
  for (int t = 0; t < sim_graph_n_tensors(g); t++)
    tname_w = MAX(tname_w, (int)strlen(sim_graph_tensor_name(g, t)));
  printf("\n%5s  %-*s  %-5s  %-24s  %s\n", "#", tname_w, "tensor", "dtype", "shape",
         "consumers");
  for (int t = 0; t < sim_graph_n_tensors(g); t++) {
    SimShape s = sim_graph_tensor_shape(g, t);
    g_autofree char *shape = sim_shape_to_string(&s);
    printf("%5d  %-*s  %-5s  %-24s ", t, tname_w, sim_graph_tensor_name(g, t),
           sim_dtype_name(sim_graph_tensor_dtype(g, t)), shape);
    for (int i = 0; i < sim_graph_tensor_n_consumers(g, t); i++)
      printf(" %s", sim_graph_op_name(g, sim_graph_tensor_consumer(g, t, i)));
    printf("\n");
  }
}

static int model_show(int argc, char **argv)
{
  g_auto(GStrv) params = NULL;
  gboolean json = FALSE, brief = FALSE, tensors = FALSE, substitutions = FALSE;
  g_autofree char *rewrites_file = NULL, *save = NULL;
  GOptionEntry entries[] = {
    { "param", 'p', 0, G_OPTION_ARG_STRING_ARRAY, &params,
      "Set a model parameter (repeatable; also k1=v1,k2=v2; values take k, M, G)", "K=V" },
    { "json", 0, 0, G_OPTION_ARG_NONE, &json, "Print a JSON object", NULL },
    { "brief", 'b', 0, G_OPTION_ARG_NONE, &brief, "Print the totals only, not the operators",
      NULL },
    { "tensors", 't', 0, G_OPTION_ARG_NONE, &tensors, "Also list the tensors", NULL },
    { "rewrites", 0, 0, G_OPTION_ARG_FILENAME, &rewrites_file,
      "Apply the graph rewrites a strategy file records (parasol search --algo subst --out)",
      "FILE" },
    { "save", 0, 0, G_OPTION_ARG_FILENAME, &save,
      "Write the model, rewritten if --rewrites is given, as a graph file", "FILE" },
    { "substitutions", 0, 0, G_OPTION_ARG_NONE, &substitutions,
      "List the graph rewrites the substitution search may apply (verified rules only)",
      NULL },
    { NULL, 0, 0, 0, NULL, NULL, NULL },
  };
  g_set_prgname("parasol model show");
  g_autoptr(GOptionContext) ctx = g_option_context_new("NAME|FILE - describe a model");
  g_option_context_set_description(ctx,
      "NAME is a zoo model ('parasol models' lists them), FILE a graph file\n"
      "(\"format\": \"parasol-graph\").  Prints the parameter count, the FLOPs of one\n"
      "iteration's forward and backward passes and a table of the operators.\n\n"
      "--rewrites applies the graph rewrites of a strategy file, --save writes the\n"
      "result as a graph file that --model reads (a search on the rewritten graph).\n\n"
      "Example: parasol model show gpt --param layers=24,hidden=2048,heads=16 --brief\n");
  g_option_context_add_main_entries(ctx, entries, NULL);
  if (!cli_parse_options(ctx, &argc, &argv))
    return CLI_EXIT_USAGE;
  if (argc < 2)
    return cli_usage_error("model show",
                           "expected a model name or a graph file; 'parasol models' lists "
                           "the names");
  if (argc > 2)
    return cli_usage_error("model show", "unexpected argument '%s'", argv[2]);

  const char *name = argv[1];
  GError *error = NULL;
  g_autoptr(SimGraph) g = cli_load_model(name, params, &error);
  if (!g)
    return cli_report_error(error);
  if (rewrites_file) {
    g_auto(GStrv) rewrites = sim_strategy_file_rewrites(rewrites_file, &error);
    if (!rewrites)
      return cli_report_error(error);
    if (rewrites[0]) {
      SimGraph *r = search_rewrite_graph(g, (const char *const *)rewrites, &error);
      if (!r)
        return cli_report_error(error);
      sim_graph_free(g);
      g = r;
    }
  }
  if (save) {
    g_autofree char *text = sim_graph_to_json(g);
    if (!g_file_set_contents(save, text, -1, &error))
      return cli_report_error(error);
  }
  g_autoptr(SimModelParams) resolved = resolved_params(name, params);
  if (substitutions) {
    g_auto(GStrv) names = search_rewrites_list(g);
    printf("%u rewrites apply to %s:\n", g_strv_length(names), sim_graph_get_name(g));
    for (char **it = names; *it; it++)
      printf("  %s\n", *it);
    return CLI_EXIT_OK;
  }
  if (json)
    show_json(g, name, resolved);
  else
    show_text(g, name, resolved, brief, tensors);
  return CLI_EXIT_OK;
}

/* ---------------------------------------------------------------------------------- */
/* parasol model export                                                                */

static int model_export(int argc, char **argv)
{
  g_auto(GStrv) params = NULL;
  g_autofree char *out = NULL;
  GOptionEntry entries[] = {
    { "param", 'p', 0, G_OPTION_ARG_STRING_ARRAY, &params,
      "Set a model parameter (repeatable; also k1=v1,k2=v2; values take k, M, G)", "K=V" },
    { "output", 'o', 0, G_OPTION_ARG_FILENAME, &out,
      "Write the graph to FILE (default: standard output)", "FILE" },
    { NULL, 0, 0, 0, NULL, NULL, NULL },
  };
  g_set_prgname("parasol model export");
  g_autoptr(GOptionContext) ctx = g_option_context_new("NAME|FILE - write a model as a graph file");
  g_option_context_set_description(ctx,
      "Writes the model as a graph file (\"format\": \"parasol-graph\", docs/formats.md)\n"
      "that --model FILE reads back to the same operators, shapes and weights.\n\n"
      "Example: parasol model export resnet-50 --param batch=64 -o resnet-50.json\n");
  g_option_context_add_main_entries(ctx, entries, NULL);
  if (!cli_parse_options(ctx, &argc, &argv))
    return CLI_EXIT_USAGE;
  if (argc < 2)
    return cli_usage_error("model export",
                           "expected a model name or a model file; 'parasol models' lists "
                           "the names");
  if (argc > 2)
    return cli_usage_error("model export", "unexpected argument '%s'", argv[2]);
  GError *error = NULL;
  g_autoptr(SimGraph) g = cli_load_model(argv[1], params, &error);
  if (!g)
    return cli_report_error(error);
  if (out && strcmp(out, "-") != 0) {
    if (!sim_graph_save(g, out, &error))
      return cli_report_error(error);
    return CLI_EXIT_OK;
  }
  g_autofree char *text = sim_graph_to_json(g);
  fputs(text, stdout);
  return CLI_EXIT_OK;
}

/* ---------------------------------------------------------------------------------- */
/* parasol model substitutions                                                         */

static int model_substitutions(int argc, char **argv)
{
  gboolean list = FALSE;
  GOptionEntry entries[] = {
    { "list", 'l', 0, G_OPTION_ARG_NONE, &list,
      "Also list every rule with its verdict and its measured error", NULL },
    { NULL, 0, 0, 0, NULL, NULL, NULL },
  };
  g_set_prgname("parasol model substitutions");
  g_autoptr(GOptionContext) ctx =
    g_option_context_new("- generate and verify the graph substitutions the search uses");
  g_option_context_set_description(ctx,
      "Generates the substitution rules (search/subst-gen.c) over small operator patterns,\n"
      "runs each source pattern and its rewrite with the CPU executor on random inputs and\n"
      "weights, and prints the set's size, how many rules were verified and rejected, and\n"
      "the time taken.  `parasol search --algo subst` applies the verified rules only.\n\n"
      "Example: parasol model substitutions --list\n");
  g_option_context_add_main_entries(ctx, entries, NULL);
  if (!cli_parse_options(ctx, &argc, &argv))
    return CLI_EXIT_USAGE;
  if (argc > 1)
    return cli_usage_error("model substitutions", "unexpected argument '%s'", argv[1]);
  g_autofree char *text = search_substitution_set_describe(list);
  fputs(text, stdout);
  return CLI_EXIT_OK;
}

static void model_usage(FILE *out)
{
  fprintf(out, "Usage: parasol model COMMAND [OPTIONS]\n\n"
               "Commands:\n"
               "  show NAME|FILE     operators, tensors, parameter count and FLOPs of a model\n"
               "  export NAME|FILE   the model as a graph file that --model reads back\n"
               "  substitutions      generate and verify the graph substitutions\n\n"
               "Run 'parasol model COMMAND --help' for the options of a command.\n");
}

int cmd_model(int argc, char **argv)
{
  if (argc < 2) {
    model_usage(stderr);
    return CLI_EXIT_USAGE;
  }
  const char *sub = argv[1];
  if (!strcmp(sub, "--help") || !strcmp(sub, "-h") || !strcmp(sub, "help")) {
    model_usage(stdout);
    return CLI_EXIT_OK;
  }
  if (!strcmp(sub, "show"))
    return model_show(argc - 1, argv + 1);
  if (!strcmp(sub, "export"))
    return model_export(argc - 1, argv + 1);
  if (!strcmp(sub, "substitutions"))
    return model_substitutions(argc - 1, argv + 1);
  return cli_usage_error("model", "unknown command '%s'; 'parasol model --help' lists them",
                         sub);
}
