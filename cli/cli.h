/* cli.h — what the command files of the parasol program share: the command table,
 * exit statuses, loading models and machines from options, and number formatting. */
#pragma once

#include <signal.h>

#include "parasol-sim.h"

/* Exit statuses: 0 done, 1 the work failed, 2 bad input or usage, 3 the simulated plan
 * does not fit in GPU memory (simulate; docs/inputs.md). */
enum { CLI_EXIT_OK = 0, CLI_EXIT_FAILURE = 1, CLI_EXIT_USAGE = 2, CLI_EXIT_NO_FIT = 3 };

/* The model and machine every command takes without --model and --machine: GPT-2 small
 * (the zoo's gpt) on a DGX A100.  exec and validate, which run the plan for real, take
 * the same model shrunk to a size the CPU back end runs in a second
 * (CLI_DEFAULT_EXEC_PARAMS). */
#define CLI_DEFAULT_MODEL "gpt"
#define CLI_DEFAULT_MACHINE "dgx-a100"
#define CLI_DEFAULT_EXEC_PARAMS "layers=2,hidden=64,heads=4,seq=16,vocab=128,batch=8"

typedef struct {
  const char *name;
  const char *summary;
  int (*run)(int argc, char **argv);
} CliCommand;

/* Prints "parasol: MESSAGE" on stderr and returns the exit status for @error: 2 for bad
 * input (parse, invalid, unknown, I/O), 1 for a failure of the work.  Frees @error. */
int cli_report_error(GError *error);
/* Parses @argv with @ctx; on bad usage prints the message and returns FALSE. */
gboolean cli_parse_options(GOptionContext *ctx, int *argc, char ***argv);
/* Prints a usage error ("parasol CMD: MESSAGE") and returns 2. */
int cli_usage_error(const char *command, const char *fmt, ...) G_GNUC_PRINTF(2, 3);

/* Builds a model from a zoo name or a graph file, with --param values (each "k=v" or
 * "k1=v1,k2=v2"); NULL @params is allowed. */
SimGraph *cli_load_model(const char *name, char **params, GError **error);

/* "1.23 G", "456 M", "7.80 k" */
char *cli_format_count(double v);
/* "1.50 GiB" */
char *cli_format_bytes(double bytes);
/* "12.3 ms", "4.56 s", "789 us" */
char *cli_format_time(double seconds);

/* Whether stderr is a terminal (progress lines are shown only then). */
/* An option's value as a whole number in [@lo, @hi], or a GOptionError that names the
 * option and the range. */
gboolean cli_option_int(const char *name, const char *value, gint64 lo, gint64 hi, gint64 *out,
                        GError **error);
/* An option's value as a finite number; @what says what was expected when it is not one or
 * @ok_fn refuses it. */
gboolean cli_option_real(const char *name, const char *value, gboolean (*ok_fn)(double),
                         const char *what, double *out, GError **error);
/* A list of devices as an option gives it: ids and ranges "a-b", a range with a step
 * "a-b:s", separated by commas ("0-1023:64,5"), appended to @out.  Each must lie in
 * 0..@n_devices-1, and the list may not be empty. */
gboolean cli_parse_devices(const char *name, const char *spec, int n_devices, GArray *out,
                           GError **error);
/* Ctrl-C for long work: the first SIGINT sets the flag cli_interrupted() reads (the work
 * stops at its next check and keeps what it has); a second one ends the program as usual.
 * cli_interrupt_release() puts the default back. */
void cli_interrupt_catch(void);
void cli_interrupt_release(void);
const volatile sig_atomic_t *cli_interrupted(void);
gboolean cli_stderr_is_tty(void);

/* Prints the object @b has built on stdout as indented JSON (--json). */
struct _JsonBuilder;
void cli_print_json(struct _JsonBuilder *b);

/* Creates the folder that @path (a file to be written) lies in, where it is missing. */
gboolean cli_make_parent(const char *path, GError **error);
/* Whether @path (NULL: nothing to write) can be written as a file is (a temporary beside
 * it, renamed): not a directory or device, in a folder that takes new files.  Outputs are
 * checked so before long work, which would otherwise be lost at its end. */
gboolean cli_check_output(const char *path, GError **error);
/* How a command that a signal stopped says so: "terminated (SIGTERM)" or "interrupted". */
const char *cli_signal_text(int signo);
/* Closes @f, written to @path: FALSE with an error naming @path when a write or the close
 * failed (a full disk). */
gboolean cli_close_output(FILE *f, const char *path, GError **error);

/* The start of a gnuplot script that draws a 960x600 PNG @png titled @title: the
 * terminal (pngcairo where gnuplot has it, png otherwise), the output and the title,
 * each string quoted for gnuplot. */
char *cli_gnuplot_preamble(const char *png, const char *title);
/* @text as a gnuplot string literal. */
char *cli_gnuplot_quote(const char *text);

/* Draws @png from the gnuplot script @gp when gnuplot is installed, and says on stderr
 * what COMMAND wrote (@data, the script, the figure) or how to draw it elsewhere. */
void cli_run_gnuplot(const char *command, const char *data, const char *gp, const char *png);

/* The commands (cmd-NAME.c). */
int cmd_models(int argc, char **argv);
int cmd_model(int argc, char **argv);
int cmd_import(int argc, char **argv);
int cmd_machines(int argc, char **argv);
int cmd_machine(int argc, char **argv);

/* The commands (one file each). */
int cmd_simulate(int argc, char **argv);
int cmd_search(int argc, char **argv);
int cmd_compare(int argc, char **argv);
int cmd_profile(int argc, char **argv);
int cmd_exec(int argc, char **argv);
int cmd_validate(int argc, char **argv);
