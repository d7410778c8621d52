/* cli.c — helpers shared by the command files. */
#include "cli.h"

#include <json-glib/json-glib.h>

#include <errno.h>
#include <glib/gstdio.h>
#include <sys/stat.h>
#include <math.h>

#include <stdarg.h>
#include <string.h>
#include <unistd.h>

int cli_report_error(GError *error)
{
  int status = CLI_EXIT_USAGE;
  if (error && error->domain == SIM_ERROR && error->code == SIM_ERROR_OOM)
    status = CLI_EXIT_FAILURE;
  g_printerr("parasol: %s\n", error ? error->message : "unknown error");
  g_clear_error(&error);
  return status;
}

gboolean cli_parse_options(GOptionContext *ctx, int *argc, char ***argv)
{
  g_autoptr(GError) error = NULL;
  if (!g_option_context_parse(ctx, argc, argv, &error)) {
    g_printerr("parasol: %s\n", error->message);
    g_printerr("Try the command with --help.\n");
    return FALSE;
  }
  return TRUE;
}

int cli_usage_error(const char *command, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  g_autofree char *msg = g_strdup_vprintf(fmt, ap);
  va_end(ap);
  g_printerr("parasol %s: %s\n", command, msg);
  return CLI_EXIT_USAGE;
}

SimGraph *cli_load_model(const char *name, char **params, GError **error)
{
  g_autoptr(SimModelParams) p = sim_model_params_new();
  for (char **it = params; it && *it; it++)
    if (!sim_model_params_parse(p, *it, error))
      return NULL;
  return sim_model_load(name, p, error);
}

static char *format_scaled(double v, const char *const *units, double base, int prec)
{
  int i = 0;
  double a = v < 0 ? -v : v;
  while (a >= base && units[i + 1]) {
    a /= base;
    v /= base;
    i++;
  }
  return g_strdup_printf("%.*f %s", prec, v, units[i]);
}

char *cli_format_count(double v)
{
  static const char *const units[] = { "", "k", "M", "G", "T", "P", "E", NULL };
  return format_scaled(v, units, 1000.0, 2);
}

char *cli_format_bytes(double bytes)
{
  static const char *const units[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB", NULL };
  return format_scaled(bytes, units, 1024.0, 2);
}

char *cli_format_time(double s)
{
  double a = s < 0 ? -s : s;
  if (a >= 1.0)
    return g_strdup_printf("%.3f s", s);
  if (a >= 1e-3)
    return g_strdup_printf("%.3f ms", s * 1e3);
  return g_strdup_printf("%.2f us", s * 1e6);
}

gboolean cli_option_int(const char *name, const char *value, gint64 lo, gint64 hi, gint64 *out,
                        GError **error)
{
  char *end = NULL;
  errno = 0;
  gint64 v = g_ascii_strtoll(value, &end, 10);
  if (!*value || *end || errno || v < lo || v > hi) {
    if (hi == G_MAXINT64)
      g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                  "%s %s: expected a whole number of at least %" G_GINT64_FORMAT, name, value,
                  lo);
    else
      g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                  "%s %s: expected a whole number from %" G_GINT64_FORMAT " to %" G_GINT64_FORMAT,
                  name, value, lo, hi);
    return FALSE;
  }
  *out = v;
  return TRUE;
}

gboolean cli_option_real(const char *name, const char *value, gboolean (*ok_fn)(double),
                         const char *what, double *out, GError **error)
{
  char *end = NULL;
  double v = g_ascii_strtod(value, &end);
  if (!*value || *end || !isfinite(v) || !ok_fn(v)) {
    g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE, "%s %s: expected %s", name,
                value, what);
    return FALSE;
  }
  *out = v;
  return TRUE;
}

gboolean cli_parse_devices(const char *name, const char *spec, int n_devices, GArray *out,
                           GError **error)
{
  g_auto(GStrv) parts = g_strsplit(spec, ",", -1);
  for (int i = 0; parts[i]; i++) {
    const char *p = g_strstrip(parts[i]);
    char *end = NULL;
    errno = 0;
    gint64 a = g_ascii_strtoll(p, &end, 10), b = a, step = 1;
    gboolean ok = end != p && !errno;
    if (ok && *end == '-') {
      const char *q = end + 1;
      b = g_ascii_strtoll(q, &end, 10);
      ok = end != q && !errno;
      if (ok && *end == ':') {
        q = end + 1;
        step = g_ascii_strtoll(q, &end, 10);
        ok = end != q && !errno && step >= 1;
      }
    }
    ok = ok && !*end;
    if (!ok || a < 0 || b < a || b >= n_devices) {
      g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                  "%s %s: '%s' is not a device or a range of devices a-b[:step] within 0..%d",
                  name, spec, p, n_devices - 1);
      return FALSE;
    }
    for (gint64 d = a; d <= b; d += step) {
      int v = (int)d;
      g_array_append_val(out, v);
    }
  }
  if (out->len == 0) {
    g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                "%s '%s': expected devices and ranges, as 0-7 or 0,2,4,6", name, spec);
    return FALSE;
  }
  return TRUE;
}

static volatile sig_atomic_t interrupted;

static void on_interrupt(int sig)
{
  interrupted = 1;
}

void cli_interrupt_catch(void)
{
  interrupted = 0;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_interrupt;
  /* A second Ctrl-C is not caught, as in the search driver. */
  sa.sa_flags = SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
}

void cli_interrupt_release(void)
{
  signal(SIGINT, SIG_DFL);
}

const volatile sig_atomic_t *cli_interrupted(void)
{
  return &interrupted;
}

gboolean cli_stderr_is_tty(void)
{
  return isatty(STDERR_FILENO);
}

gboolean cli_make_parent(const char *path, GError **error)
{
  if (!path)
    return TRUE;
  g_autofree char *dir = g_path_get_dirname(path);
  if (g_mkdir_with_parents(dir, 0755) == 0)
    return TRUE;
  int e = errno;
  g_set_error(error, G_FILE_ERROR, g_file_error_from_errno(e), "%s: cannot create the folder: %s",
              dir, g_strerror(e));
  return FALSE;
}

gboolean cli_close_output(FILE *f, const char *path, GError **error)
{
  gboolean bad = ferror(f) != 0;
  int e = bad ? EIO : 0;
  if (fclose(f) != 0 && !bad) {
    bad = TRUE;
    e = errno;
  }
  if (bad)
    g_set_error(error, SIM_ERROR, SIM_ERROR_IO, "cannot write %s: %s", path, g_strerror(e));
  return !bad;
}

gboolean cli_check_output(const char *path, GError **error)
{
  if (!path)
    return TRUE;
  GStatBuf st;
  if (g_stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
    g_set_error(error, G_FILE_ERROR, G_FILE_ERROR_ISDIR, "%s: %s; expected a file to write",
                path, S_ISDIR(st.st_mode) ? "a directory" : "not a regular file");
    return FALSE;
  }
  /* The file is written as a temporary beside it, then renamed: try that now. */
  g_autofree char *dir = g_path_get_dirname(path);
  g_autofree char *probe = g_build_filename(dir, ".parasol-XXXXXX", NULL);
  int fd = g_mkstemp(probe);
  if (fd < 0) {
    int e = errno;
    g_set_error(error, G_FILE_ERROR, g_file_error_from_errno(e), "cannot write %s: %s", path,
                g_strerror(e));
    return FALSE;
  }
  close(fd);
  g_unlink(probe);
  return TRUE;
}

/* gnuplot's single-quoted strings take everything literally but a quote, doubled. */
static void gp_quoted(GString *s, const char *text)
{
  g_string_append_c(s, '\'');
  for (const char *p = text; *p; p++) {
    if (*p == '\'')
      g_string_append_c(s, '\'');
    g_string_append_c(s, *p);
  }
  g_string_append_c(s, '\'');
}

char *cli_gnuplot_quote(const char *text)
{
  GString *s = g_string_new(NULL);
  gp_quoted(s, text);
  return g_string_free(s, FALSE);
}

char *cli_gnuplot_preamble(const char *png, const char *title)
{
  GString *s = g_string_new("if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
                            "  set terminal pngcairo size 960,600 font ',11'\n"
                            "} else {\n"
                            "  set terminal png size 960,600\n"
                            "}\n"
                            "set output ");
  gp_quoted(s, png);
  g_string_append(s, "\nset title ");
  gp_quoted(s, title);
  g_string_append(s, " noenhanced\n");
  return g_string_free(s, FALSE);
}

void cli_run_gnuplot(const char *command, const char *data, const char *gp, const char *png)
{
  g_autofree char *gnuplot = g_find_program_in_path("gnuplot");
  if (!gnuplot) {
    g_printerr("parasol %s: wrote %s and %s; gnuplot is not installed, so run 'gnuplot %s' "
               "where it is to draw %s\n", command, data, gp, gp, png);
    return;
  }
  const char *args[] = { gnuplot, gp, NULL };
  int wait = 0;
  g_autoptr(GError) e = NULL;
  if (g_spawn_sync(NULL, (char **)args, NULL, G_SPAWN_DEFAULT, NULL, NULL, NULL, NULL, &wait, &e) &&
      g_spawn_check_wait_status(wait, e ? NULL : &e))
    g_printerr("parasol %s: wrote %s, %s and %s\n", command, data, gp, png);
  else
    g_printerr("parasol %s: wrote %s and %s; gnuplot failed to draw %s%s%s\n", command, data, gp,
               png, e ? ": " : "", e ? e->message : "");
}

const char *cli_signal_text(int signo)
{
  return signo == SIGTERM ? "terminated (SIGTERM)" : "interrupted";
}

void cli_print_json(JsonBuilder *b)
{
  g_autoptr(JsonGenerator) gen = json_generator_new();
  g_autoptr(JsonNode) root = json_builder_get_root(b);
  json_generator_set_root(gen, root);
  json_generator_set_pretty(gen, TRUE);
  g_autofree char *text = json_generator_to_data(gen, NULL);
  printf("%s\n", text);
}
