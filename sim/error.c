/* error.c — the SIM_ERROR domain, messages that name the file and the place, and the
 * string quoting the JSON writers share. */
#include "sim-private.h"

#include <stdarg.h>

G_DEFINE_QUARK(sim-error-quark, sim_error)

void sim_set_error_at(GError **error, int code, const char *filename, const char *place,
                      const char *fmt, ...)
{
  if (!error)
    return;
  va_list ap;
  va_start(ap, fmt);
  g_autofree char *msg = g_strdup_vprintf(fmt, ap);
  va_end(ap);
  if (filename && place && *place)
    g_set_error(error, SIM_ERROR, code, "%s: %s: %s", filename, place, msg);
  else if (filename)
    g_set_error(error, SIM_ERROR, code, "%s: %s", filename, msg);
  else if (place && *place)
    g_set_error(error, SIM_ERROR, code, "%s: %s", place, msg);
  else
    g_set_error_literal(error, SIM_ERROR, code, msg);
}

void sim_json_append_string(GString *s, const char *str)
{
  g_string_append_c(s, '"');
  for (const unsigned char *p = (const unsigned char *)str; *p; p++) {
    switch (*p) {
    case '"': g_string_append(s, "\\\""); break;
    case '\\': g_string_append(s, "\\\\"); break;
    case '\n': g_string_append(s, "\\n"); break;
    case '\t': g_string_append(s, "\\t"); break;
    case '\r': g_string_append(s, "\\r"); break;
    default:
      if (*p < 0x20)
        g_string_append_printf(s, "\\u%04x", *p);
      else
        g_string_append_c(s, (char)*p);
    }
  }
  g_string_append_c(s, '"');
}
