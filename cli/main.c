/* main.c — the parasol program: dispatches to one command file per command. */
#include "cli.h"
#include "parasol-config.h"

#include <errno.h>
#include <locale.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* One line per command; the command files live beside this one (cmd-NAME.c). */
static const CliCommand commands[] = {
  /* commands: keep this list in the order `parasol --help` shows them */
  { "models", "list the models of the zoo", cmd_models },
  { "model", "describe a model: operators, parameters, FLOPs", cmd_model },
  { "import", "an ONNX model as a graph file (--model FILE.onnx imports it too)", cmd_import },
  { "machines", "list the machines of the library", cmd_machines },
  { "machine", "describe a machine: devices, links, bandwidths", cmd_machine },
  { "simulate", "predict one training iteration of a model on a machine", cmd_simulate },
  { "search", "find a fast parallelization strategy with a search algorithm", cmd_search },
  { "compare", "compare search algorithms on one problem and budget (CSV and plot)", cmd_compare },
  { "profile", "measure operators and collectives into a profile database", cmd_profile },
  { "exec", "run training steps of a plan on a back end (cpu, cuda)", cmd_exec },
  { "validate", "predicted against measured time of one plan, per class of task", cmd_validate },
  { NULL, NULL, NULL },
};

static void print_help(FILE *out)
{
  fprintf(out,
          "Usage: parasol COMMAND [OPTIONS]\n\n"
          "Finds fast ways to parallelize the training of deep neural networks and\n"
          "predicts how fast they run.\n\nCommands:\n");
  for (size_t i = 0; commands[i].name; i++)
    fprintf(out, "  %-12s %s\n", commands[i].name, commands[i].summary);
  fprintf(out, "\nOptions:\n  --help       this text\n  --version    the version\n\n"
               "Run 'parasol COMMAND --help' for the options of a command.\n");
}

/* Every command's output goes to stdout: a write that failed there (a full disk, a closed
 * file) ends the program with status 2 and a message rather than 0 and a lost result. */
static void check_stdout(void)
{
  int e = 0;
  gboolean bad = ferror(stdout) != 0;
  if (fflush(stdout) != 0) {
    e = errno;
    bad = TRUE;
  }
  if (bad) {
    fprintf(stderr, "parasol: cannot write the output (standard output)%s%s\n", e ? ": " : "",
            e ? g_strerror(e) : "");
    _exit(CLI_EXIT_USAGE);
  }
}

int main(int argc, char **argv)
{
  atexit(check_stdout);
  setlocale(LC_ALL, "");
  setlocale(LC_NUMERIC, "C");
  if (argc < 2) {
    print_help(stderr);
    return CLI_EXIT_USAGE;
  }
  const char *name = argv[1];
  if (!strcmp(name, "--help") || !strcmp(name, "-h") || !strcmp(name, "help")) {
    print_help(stdout);
    return CLI_EXIT_OK;
  }
  if (!strcmp(name, "--version") || !strcmp(name, "-V")) {
    printf("parasol %s\n", PARASOL_VERSION);
    return CLI_EXIT_OK;
  }
  for (size_t i = 0; commands[i].name; i++)
    if (!strcmp(commands[i].name, name))
      return commands[i].run(argc - 1, argv + 1);
  g_printerr("parasol: unknown command '%s'; 'parasol --help' lists the commands\n", name);
  return CLI_EXIT_USAGE;
}
