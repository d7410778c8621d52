/* cmd-import.c — `parasol import MODEL.onnx`: an ONNX model as a parasol graph file
 * (sim/onnx.c does the work; docs/import.md). */
#include "cli.h"

#include <string.h>

int cmd_import(int argc, char **argv)
{
  g_auto(GStrv) params = NULL;
  g_autofree char *out = NULL;
  gboolean check = FALSE;
  GOptionEntry entries[] = {
    { "output", 'o', 0, G_OPTION_ARG_FILENAME, &out,
      "Write the graph file here (default: standard output)", "FILE" },
    { "param", 'p', 0, G_OPTION_ARG_STRING_ARRAY, &params,
      "Size of a symbolic input dimension, e.g. batch=64 (repeatable; also k1=v1,k2=v2)",
      "K=V" },
    { "check", 0, 0, G_OPTION_ARG_NONE, &check,
      "Only list the operators the importer does not support (exit status 2 if any)", NULL },
    { NULL, 0, 0, 0, NULL, NULL, NULL },
  };
  g_set_prgname("parasol import");
  g_autoptr(GOptionContext) ctx = g_option_context_new("MODEL.onnx - import an ONNX model");
  g_option_context_set_description(ctx,
      "Reads the shapes of an ONNX model (weights may be left out: export_params=False)\n"
      "and writes it as a parasol graph file.  Symbolic input dimensions take their\n"
      "sizes from --param.  --model MODEL.onnx imports the same way wherever a model is\n"
      "taken.  tools/torch2parasol.py exports a PyTorch module and imports it.\n\n"
      "Example: parasol import resnet50.onnx --param batch=64 -o resnet50.json\n");
  g_option_context_add_main_entries(ctx, entries, NULL);
  if (!cli_parse_options(ctx, &argc, &argv))
    return CLI_EXIT_USAGE;
  if (argc < 2)
    return cli_usage_error("import", "expected an ONNX file");
  if (argc > 2)
    return cli_usage_error("import", "unexpected argument '%s'", argv[2]);
  const char *path = argv[1];
  GError *error = NULL;
  if (!sim_onnx_available()) {
    g_autoptr(SimGraph) none = sim_onnx_import(path, NULL, &error);
    return cli_report_error(error);
  }

  if (check) {
    g_auto(GStrv) missing = sim_onnx_check(path, &error);
    if (!missing)
      return cli_report_error(error);
    if (missing[0]) {
      printf("%s: operators the importer does not support:\n", path);
      for (char **it = missing; *it; it++)
        printf("  %s\n", *it);
      return CLI_EXIT_USAGE;
    }
    /* Every operator type is known; the import itself may still refuse an attribute. */
    g_autoptr(SimGraph) g = cli_load_model(path, params, &error);
    if (!g)
      return cli_report_error(error);
    g_autofree char *n_params = cli_format_count((double)sim_graph_n_params(g));
    printf("%s: every operator is supported: %d parasol operators, %s parameters "
           "(%" G_GINT64_FORMAT ")\n", path, sim_graph_n_ops(g), n_params,
           sim_graph_n_params(g));
    return CLI_EXIT_OK;
  }

  g_autoptr(SimGraph) g = cli_load_model(path, params, &error);
  if (!g)
    return cli_report_error(error);
  if (out && strcmp(out, "-") != 0) {
    if (!sim_graph_save(g, out, &error))
      return cli_report_error(error);
    g_autofree char *n_params = cli_format_count((double)sim_graph_n_params(g));
    g_printerr("parasol: %s: %d operators, %s parameters (%" G_GINT64_FORMAT "), batch %"
               G_GINT64_FORMAT " -> %s\n", path, sim_graph_n_ops(g), n_params,
               sim_graph_n_params(g), sim_graph_batch_size(g), out);
    return CLI_EXIT_OK;
  }
  g_autofree char *text = sim_graph_to_json(g);
  fputs(text, stdout);
  return CLI_EXIT_OK;
}
