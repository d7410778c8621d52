/* json-read.h — the one JSON reader of parasol's files (machine, strategy, graph, profile).
 *
 * A reader names its file; every check that fails says where in the file and what it
 * expected, in one form: "FILE: PLACE: expected WHAT, got VALUE", PLACE being the JSON path
 * of the value ("node.fabric.bandwidth_GBps", "ops[3].median", "" for the document).
 * Unknown keys are refused against the list of the keys an object may have, so a typo
 * cannot silently leave a default in place.  The getters return FALSE with the error set;
 * they never set it twice (GError's rule).
 *
 * The errors are in the reader's GError domain, with the reader's code for each kind of
 * check: @parse for a value of the wrong type, an unknown or missing key and a syntax
 * error, @invalid for a value out of range, @unknown for an unknown name.  The simulator's
 * readers take SIM_ERROR and its codes (sim_json_reader() in sim/sim-private.h); the
 * profile database's take PROFILE_ERROR_PARSE for all three. */
#pragma once

#include <glib.h>
#include <json-glib/json-glib.h>
#include <stdint.h>

G_BEGIN_DECLS

/* The most levels of arrays and objects a JSON text may nest (json-glib's parser recurses
 * once per level, so deeper text would overflow the stack).  parasol-sim-core.h states the
 * same limit to libsim's users; a C compiler refuses the two if they ever differ. */
#define SIM_JSON_MAX_DEPTH 256

typedef struct {
  const char *file;  /* named first in every message (none when NULL)                 */
  GError **error;
  GQuark domain;     /* of every error                                                */
  int parse;         /* the code of a wrong type, an unknown or missing key, a syntax error */
  int invalid;       /* of a value out of range                                       */
  int unknown;       /* of an unknown name                                            */
} SimJsonReader;

/* Refuses @text (of @length bytes, or up to its NUL when -1) nested deeper than
 * SIM_JSON_MAX_DEPTH, with an integer beyond 64 bits or a number beyond a double's range,
 * which json-glib would take as other values; the error is a JSON_PARSER_ERROR in
 * json-glib's own form, "<data>:LINE:COLUMN: Parse error: ...". */
gboolean sim_json_check_limits(const char *text, gssize length, GError **error);
/* sim_json_check_limits(), then json-glib's parser. */
gboolean sim_json_parse(JsonParser *parser, const char *text, gssize length, GError **error);

/* Sets the error "FILE: PLACE: MESSAGE" (no PLACE when NULL or empty) with @code of the
 * reader's domain; returns FALSE. */
gboolean sim_json_fail(const SimJsonReader *r, int code, const char *place, const char *fmt,
                       ...) G_GNUC_PRINTF(4, 5);

/* The place of member @key of the value at @place ("a.b", or "b" at the top), and of its
 * element @i ("a[3]"). */
char *sim_json_place_key(const char *place, const char *key);
char *sim_json_place_index(const char *place, guint i);

/* What a value is, for "got ...": null, an object, an array, or the value itself (numbers
 * as written, strings quoted and cut after 40 characters). */
char *sim_json_describe(JsonNode *n);
gboolean sim_json_is_number(JsonNode *n);

/* Parses @text (sim_json_parse()) into @parser and returns its root object.  A syntax
 * error reads "FILE:LINE:COLUMN: WHAT"; anything but an object "FILE: expected a JSON
 * object with "format": "FORMAT", got ...". */
JsonObject *sim_json_read_root(const SimJsonReader *r, JsonParser *parser, const char *text,
                               const char *format);

/* The root's "format" is @format and its "version" is @version; both must be there. */
gboolean sim_json_check_format(const SimJsonReader *r, JsonObject *root, const char *format,
                               int version);

/* Refuses a key of @o outside @allowed (NULL-terminated): "PLACE.KEY: unknown key; expected
 * one of: A, B, C". */
gboolean sim_json_check_keys(const SimJsonReader *r, JsonObject *o, const char *place,
                             const char *const *allowed);

/* "PLACE.KEY: missing; expected WHAT". */
gboolean sim_json_missing(const SimJsonReader *r, const char *place, const char *key,
                          const char *what);

/* Typed getters: the value @n at @place (NULL @n: absent, "got nothing"). */
gboolean sim_json_object(const SimJsonReader *r, JsonNode *n, const char *place, JsonObject **out);
gboolean sim_json_array(const SimJsonReader *r, JsonNode *n, const char *place, JsonArray **out);
gboolean sim_json_string(const SimJsonReader *r, JsonNode *n, const char *place, const char **out);
gboolean sim_json_bool(const SimJsonReader *r, JsonNode *n, const char *place, gboolean *out);
/* A whole number (1 and 1.0 alike) from @lo to @hi; "an integer >= LO" when @hi is G_MAXINT
 * or more, "an integer from LO to HI" otherwise. */
gboolean sim_json_int(const SimJsonReader *r, JsonNode *n, const char *place, int64_t lo,
                      int64_t hi, int64_t *out);
/* A finite number above @min, or equal to it with @min_allowed: "a number >= 0", "a
 * positive number", "a number >= MIN", "a number > MIN". */
gboolean sim_json_number(const SimJsonReader *r, JsonNode *n, const char *place, double min,
                         gboolean min_allowed, double *out);
/* A string that @from_name knows (>= 0); otherwise "unknown value 'X'; expected one of:
 * @valid" (the reader's @unknown code). */
gboolean sim_json_enum(const SimJsonReader *r, JsonNode *n, const char *place,
                       int (*from_name)(const char *), const char *valid, int *out);

G_END_DECLS
