/* json-read.h — the one JSON reader of parasol's files (machine, strategy, graph, profile).
 *
 * A reader names its file; every check that fails says where in the file and what it
 * expected, in one form: "FILE: PLACE: expected WHAT, got VALUE", PLACE being the JSON path
 * of the value ("node.fabric.bandwidth_GBps", "ops[3].median", "" for the document).
 * Unknown keys are refused against the list of the keys an object may have, so a typo
 * cannot silently leave a default in place.  The getters return FALSE with the error set;
 * they never set it twice (GError's rule).
 *
 * Errors are SIM_ERROR with a code per check (SIM_ERROR_PARSE for a value of the wrong
 * type or an unknown key, SIM_ERROR_INVALID for one out of range, SIM_ERROR_UNKNOWN for an
 * unknown name), or, when @domain is set, @domain and @code for every check (the profile
 * database's PROFILE_ERROR_PARSE). */
#pragma once

#include <glib.h>
#include <json-glib/json-glib.h>
#include <stdint.h>

G_BEGIN_DECLS

typedef struct {
  const char *file;  /* named first in every message */
  GError **error;
  GQuark domain;     /* 0: SIM_ERROR with each check's code */
  int code;          /* with @domain: the code of every error */
} SimJsonReader;

/* Sets the error "FILE: PLACE: MESSAGE" (no PLACE when NULL or empty); returns FALSE. */
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

/* Parses @text (sim_json_load(): no nesting beyond SIM_JSON_MAX_DEPTH, no number beyond a
 * double) into @parser and returns its root object.  A syntax error reads
 * "FILE:LINE:COLUMN: WHAT"; anything but an object "FILE: expected a JSON object with
 * "format": "FORMAT", got ...". */
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
 * @valid" (SIM_ERROR_UNKNOWN). */
gboolean sim_json_enum(const SimJsonReader *r, JsonNode *n, const char *place,
                       int (*from_name)(const char *), const char *valid, int *out);

G_END_DECLS
