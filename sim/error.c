/* error.c — the SIM_ERROR domain and messages that name the file and the place. */
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
