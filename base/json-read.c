/* json-read.c — the one JSON reader of parasol's files (json-read.h). */
#include "json-read.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>

gboolean sim_json_check_limits(const char *text, gssize length, GError **error)
{
  g_return_val_if_fail(text != NULL, FALSE);
  gsize len = length < 0 ? strlen(text) : (gsize)length;
  int depth = 0, line = 1, column = 1;
  gboolean in_string = FALSE;
  for (gsize i = 0; i < len; i++, column++) {
    char c = text[i];
    if (c == '\n') {
      line++;
      column = 0;
      continue;
    }
    if (in_string) {
      if (c == '\\' && i + 1 < len && text[i + 1] != '\n') {
        i++;
        column++;
      } else if (c == '"') {
        in_string = FALSE;
      }
      continue;
    }
    if (c == '"') {
      in_string = TRUE;
    } else if (c == '-' || g_ascii_isdigit(c)) {
      /* json-glib wraps integers beyond 64 bits around (9223372036854775808 becomes
       * -9223372036854775808) and reads 1e400 as infinity: both are refused here. */
      gsize start = i, j = i + (c == '-');
      gboolean integer = TRUE, exponent = FALSE;
      while (j < len && (g_ascii_isdigit(text[j]) || text[j] == '.' || text[j] == 'e' ||
                         text[j] == 'E' || text[j] == '+' || text[j] == '-')) {
        integer = integer && g_ascii_isdigit(text[j]);
        exponent = exponent || text[j] == 'e' || text[j] == 'E';
        j++;
      }
      /* Only long integers and numbers with an exponent or hundreds of digits can be out of
       * range: the common short ones are not converted. */
      gboolean huge = FALSE;
      if ((integer && j - start > 18) || exponent || j - start > 300) {
        g_autofree char *number = g_strndup(text + start, j - start);
        errno = 0;
        if (integer) {
          g_ascii_strtoll(number, NULL, 10);
          huge = errno == ERANGE;
        } else {
          huge = !isfinite(g_ascii_strtod(number, NULL));
        }
      }
      if (huge) {
        g_autofree char *number = g_strndup(text + start, MIN(j - start, 41));
        g_set_error(error, JSON_PARSER_ERROR, JSON_PARSER_ERROR_INVALID_DATA,
                    "<data>:%d:%d: Parse error: %.40s%s is too large (parasol reads %s)",
                    line, column, number, strlen(number) > 40 ? "..." : "",
                    integer ? "integers from -9223372036854775808 to 9223372036854775807"
                            : "numbers of magnitude up to about 1.8e308");
        return FALSE;
      }
      column += (int)(j - 1 - i);
      i = j - 1;
    } else if (c == '[' || c == '{') {
      if (++depth > SIM_JSON_MAX_DEPTH) {
        /* The form of json-glib's own messages, which the readers turn into theirs. */
        g_set_error(error, JSON_PARSER_ERROR, JSON_PARSER_ERROR_PARSE,
                    "<data>:%d:%d: Parse error: nested deeper than %d levels of arrays and "
                    "objects (the most parasol reads)",
                    line, column, SIM_JSON_MAX_DEPTH);
        return FALSE;
      }
    } else if ((c == ']' || c == '}') && depth > 0) {
      depth--;
    }
  }
  return TRUE;
}

gboolean sim_json_parse(JsonParser *parser, const char *text, gssize length, GError **error)
{
  g_return_val_if_fail(parser != NULL && text != NULL, FALSE);
  return sim_json_check_limits(text, length, error) &&
         json_parser_load_from_data(parser, text, length, error);
}

gboolean sim_json_fail(const SimJsonReader *r, int code, const char *place, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  g_autofree char *msg = g_strdup_vprintf(fmt, ap);
  va_end(ap);
  if (!r->error)
    return FALSE;
  if (r->file && place && *place)
    g_set_error(r->error, r->domain, code, "%s: %s: %s", r->file, place, msg);
  else if (r->file)
    g_set_error(r->error, r->domain, code, "%s: %s", r->file, msg);
  else if (place && *place)
    g_set_error(r->error, r->domain, code, "%s: %s", place, msg);
  else
    g_set_error_literal(r->error, r->domain, code, msg);
  return FALSE;
}

char *sim_json_place_key(const char *place, const char *key)
{
  return place && *place ? g_strdup_printf("%s.%s", place, key) : g_strdup(key);
}

char *sim_json_place_index(const char *place, guint i)
{
  return g_strdup_printf("%s[%u]", place ? place : "", i);
}

char *sim_json_describe(JsonNode *n)
{
  if (!n)
    return g_strdup("nothing");
  if (JSON_NODE_HOLDS_NULL(n))
    return g_strdup("null");
  if (JSON_NODE_HOLDS_OBJECT(n))
    return g_strdup("an object");
  if (JSON_NODE_HOLDS_ARRAY(n))
    return g_strdup("an array");
  GType t = json_node_get_value_type(n);
  if (t == G_TYPE_INT64)
    return g_strdup_printf("%" G_GINT64_FORMAT, json_node_get_int(n));
  if (t == G_TYPE_DOUBLE) {
    char buf[G_ASCII_DTOSTR_BUF_SIZE];
    return g_strdup(g_ascii_formatd(buf, sizeof buf, "%g", json_node_get_double(n)));
  }
  if (t == G_TYPE_BOOLEAN)
    return g_strdup(json_node_get_boolean(n) ? "true" : "false");
  const char *s = json_node_get_string(n);
  if (s && strlen(s) > 40)
    return g_strdup_printf("\"%.40s...\"", s);
  return g_strdup_printf("\"%s\"", s ? s : "");
}

gboolean sim_json_is_number(JsonNode *n)
{
  if (!n || !JSON_NODE_HOLDS_VALUE(n))
    return FALSE;
  GType t = json_node_get_value_type(n);
  return t == G_TYPE_INT64 || t == G_TYPE_DOUBLE;
}

/* "expected WHAT, got VALUE" at @place. */
static gboolean expected(const SimJsonReader *r, int code, const char *place, const char *what,
                         JsonNode *n)
{
  g_autofree char *got = sim_json_describe(n);
  return sim_json_fail(r, code, place, "expected %s, got %s", what, got);
}

JsonObject *sim_json_read_root(const SimJsonReader *r, JsonParser *parser, const char *text,
                               const char *format)
{
  g_autoptr(GError) syntax = NULL;
  if (!sim_json_parse(parser, text, -1, &syntax)) {
    /* json-glib says "<data>:LINE:COLUMN: Parse error: WHAT"; the file's name replaces
     * "<data>" and the place is followed by WHAT alone. */
    const char *msg = syntax->message;
    if (g_str_has_prefix(msg, "<data>:"))
      msg += strlen("<data>:");
    const char *rest = strstr(msg, ": ");
    if (rest && rest > msg && g_ascii_isdigit(msg[0])) {
      g_autofree char *where = g_strndup(msg, (gsize)(rest - msg));
      msg = rest + 2;
      if (g_str_has_prefix(msg, "Parse error: "))
        msg += strlen("Parse error: ");
      g_autofree char *file_where = g_strdup_printf("%s:%s", r->file, where);
      SimJsonReader at = *r;
      at.file = file_where;
      sim_json_fail(&at, r->parse, NULL, "%s", msg);
    } else {
      sim_json_fail(r, r->parse, NULL, "%s", msg);
    }
    return NULL;
  }
  JsonNode *root = json_parser_get_root(parser);
  if (!root || !JSON_NODE_HOLDS_OBJECT(root)) {
    g_autofree char *what = g_strdup_printf("a JSON object with \"format\": \"%s\"", format);
    expected(r, r->parse, NULL, what, root);
    return NULL;
  }
  return json_node_get_object(root);
}

gboolean sim_json_check_format(const SimJsonReader *r, JsonObject *root, const char *format,
                               int version)
{
  g_autofree char *quoted = g_strdup_printf("\"%s\"", format);
  JsonNode *f = json_object_get_member(root, "format");
  if (!f)
    return sim_json_missing(r, "", "format", quoted);
  const char *s = NULL;
  if (!sim_json_string(r, f, "format", &s))
    return FALSE;
  if (strcmp(s, format) != 0)
    return expected(r, r->parse, "format", quoted, f);
  JsonNode *v = json_object_get_member(root, "version");
  g_autofree char *want = g_strdup_printf("%d", version);
  if (!v)
    return sim_json_missing(r, "", "version", want);
  if (!sim_json_is_number(v) || json_node_get_double(v) != version) {
    g_autofree char *got = sim_json_describe(v);
    return sim_json_fail(r, r->parse, "version",
                         "expected %d, got %s (this parasol reads version %d)", version, got,
                         version);
  }
  return TRUE;
}

gboolean sim_json_check_keys(const SimJsonReader *r, JsonObject *o, const char *place,
                             const char *const *allowed)
{
  g_autoptr(GList) members = json_object_get_members(o);
  for (GList *l = members; l; l = l->next) {
    const char *key = l->data;
    if (g_strv_contains(allowed, key))
      continue;
    g_autofree char *where = sim_json_place_key(place, key);
    g_autofree char *list = g_strjoinv(", ", (char **)allowed);
    return sim_json_fail(r, r->parse, where, "unknown key; expected one of: %s", list);
  }
  return TRUE;
}

gboolean sim_json_missing(const SimJsonReader *r, const char *place, const char *key,
                          const char *what)
{
  g_autofree char *where = sim_json_place_key(place, key);
  return sim_json_fail(r, r->parse, where, "missing; expected %s", what);
}

gboolean sim_json_object(const SimJsonReader *r, JsonNode *n, const char *place, JsonObject **out)
{
  if (!n || !JSON_NODE_HOLDS_OBJECT(n))
    return expected(r, r->parse, place, "an object", n);
  *out = json_node_get_object(n);
  return TRUE;
}

gboolean sim_json_array(const SimJsonReader *r, JsonNode *n, const char *place, JsonArray **out)
{
  if (!n || !JSON_NODE_HOLDS_ARRAY(n))
    return expected(r, r->parse, place, "an array", n);
  *out = json_node_get_array(n);
  return TRUE;
}

gboolean sim_json_string(const SimJsonReader *r, JsonNode *n, const char *place, const char **out)
{
  if (!n || !JSON_NODE_HOLDS_VALUE(n) || json_node_get_value_type(n) != G_TYPE_STRING)
    return expected(r, r->parse, place, "a string", n);
  *out = json_node_get_string(n);
  return TRUE;
}

gboolean sim_json_bool(const SimJsonReader *r, JsonNode *n, const char *place, gboolean *out)
{
  if (!n || !JSON_NODE_HOLDS_VALUE(n) || json_node_get_value_type(n) != G_TYPE_BOOLEAN)
    return expected(r, r->parse, place, "true or false", n);
  *out = json_node_get_boolean(n);
  return TRUE;
}

gboolean sim_json_int(const SimJsonReader *r, JsonNode *n, const char *place, int64_t lo,
                      int64_t hi, int64_t *out)
{
  /* Beyond 2^53 a double is no longer a whole number of one; json-glib reads integers as
   * int64 exactly. */
  gboolean whole = FALSE;
  int64_t v = 0;
  if (n && JSON_NODE_HOLDS_VALUE(n)) {
    GType t = json_node_get_value_type(n);
    if (t == G_TYPE_INT64) {
      v = json_node_get_int(n);
      whole = TRUE;
    } else if (t == G_TYPE_DOUBLE) {
      double d = json_node_get_double(n);
      whole = isfinite(d) && d == floor(d) && fabs(d) <= 9.0e15;
      v = whole ? (int64_t)d : 0;
    }
  }
  g_autofree char *what =
    lo <= G_MININT && hi >= G_MAXINT ? g_strdup("an integer")
    : hi >= G_MAXINT && (!whole || v < lo)
      ? g_strdup_printf("an integer >= %" G_GINT64_FORMAT, lo)
      : g_strdup_printf("an integer from %" G_GINT64_FORMAT " to %" G_GINT64_FORMAT, lo, hi);
  if (!whole)
    return expected(r, r->parse, place, what, n);
  if (v < lo || v > hi)
    return expected(r, r->invalid, place, what, n);
  *out = v;
  return TRUE;
}

gboolean sim_json_number(const SimJsonReader *r, JsonNode *n, const char *place, double min,
                         gboolean min_allowed, double *out)
{
  char buf[G_ASCII_DTOSTR_BUF_SIZE];
  g_autofree char *what =
    min == 0 && min_allowed ? g_strdup("a number >= 0")
    : min == 0             ? g_strdup("a positive number")
                           : g_strdup_printf("a number %s %s", min_allowed ? ">=" : ">",
                                             g_ascii_formatd(buf, sizeof buf, "%g", min));
  if (!sim_json_is_number(n))
    return expected(r, r->parse, place, what, n);
  double v = json_node_get_double(n);
  if (!isfinite(v) || v < min || (!min_allowed && v == min))
    return expected(r, r->invalid, place, what, n);
  *out = v;
  return TRUE;
}

gboolean sim_json_enum(const SimJsonReader *r, JsonNode *n, const char *place,
                       int (*from_name)(const char *), const char *valid, int *out)
{
  const char *name = NULL;
  if (!sim_json_string(r, n, place, &name))
    return FALSE;
  int v = from_name(name);
  if (v < 0)
    return sim_json_fail(r, r->unknown, place, "unknown value '%s'; expected one of: %s",
                         name, valid);
  *out = v;
  return TRUE;
}
