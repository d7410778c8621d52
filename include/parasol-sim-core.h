/* parasol-sim-core.h — part of libsim's public interface (parasol-sim.h, which includes
 * every part): errors, input files, tensors (shapes, data types, regions) and the limits
 * every reader keeps. */
#pragma once

#include <glib.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>

#define SIM_PUBLIC __attribute__((visibility("default")))

G_BEGIN_DECLS

/* ---------------------------------------------------------------------------------- */
/* Errors                                                                              */

#define SIM_ERROR (sim_error_quark())
typedef enum {
  SIM_ERROR_PARSE,     /* malformed file: JSON syntax, wrong format or version      */
  SIM_ERROR_INVALID,   /* well-formed but impossible: bad shape, degree, bandwidth    */
  SIM_ERROR_UNKNOWN,   /* an unknown name: model, operator, device, machine, option   */
  SIM_ERROR_IO,        /* a file could not be read or written                         */
  SIM_ERROR_OOM,       /* a strategy does not fit in device memory                    */
  SIM_ERROR_CANCELLED, /* a simulation stopped by its cancellation flag (SimOptions)  */
} SimErrorCode;
SIM_PUBLIC GQuark sim_error_quark(void);

/* Input files: every reader of parasol (models, machines, strategies, profiles,
 * calibrations, tables, batches) reads through sim_read_file, which takes files and
 * pipes (not directories or devices such as /dev/zero) of at most SIM_INPUT_MAX_BYTES,
 * without a NUL byte; errors are G_FILE_ERROR with a message that names the file.  JSON
 * is parsed through sim_json_load, which first refuses (sim_json_check) text nested
 * deeper than SIM_JSON_MAX_DEPTH arrays and objects, integers beyond 64 bits and numbers
 * beyond a double's range, which json-glib would take as other values (a JSON_PARSER_ERROR
 * in json-glib's own form, "<data>:LINE:COLUMN: Parse error: ..."). */
#define SIM_INPUT_MAX_BYTES (16 << 20)
#define SIM_JSON_MAX_DEPTH 256
SIM_PUBLIC gboolean sim_read_file(const char *path, char **contents, gsize *length,
                                  GError **error);
/* FALSE with an error naming @filename and the line when @text holds a NUL byte. */
SIM_PUBLIC gboolean sim_check_text(const char *text, gsize length, const char *filename,
                                   GError **error);
SIM_PUBLIC gboolean sim_json_check(const char *text, gssize length, GError **error);
struct _JsonParser;
SIM_PUBLIC gboolean sim_json_load(struct _JsonParser *parser, const char *text, gssize length,
                                  GError **error);

/* ---------------------------------------------------------------------------------- */
/* Tensors: shapes, data types and n-dimensional regions                              */

#define SIM_MAX_DIMS 6
/* The most ops a graph may hold: a bound on what a mistyped size can cost (a model of a
 * hundred million layers would exhaust memory before it said anything). */
#define SIM_GRAPH_MAX_OPS 200000
/* The most GPUs a machine may have (4096 nodes of 8): the simulator's tables and time
 * grow faster than the GPU count, and a mistyped count must fail at once. */
#define SIM_MACHINE_MAX_DEVICES 32768

typedef enum {
  SIM_DTYPE_FP32,
  SIM_DTYPE_FP16,
  SIM_DTYPE_BF16,
  SIM_DTYPE_FP8,
  SIM_DTYPE_INT32,
  SIM_DTYPE_INT64,
  SIM_DTYPE_COUNT
} SimDType;

SIM_PUBLIC const char *sim_dtype_name(SimDType t);
/* Returns the dtype named @name ("fp32", "float16", ...) or -1. */
SIM_PUBLIC int sim_dtype_from_name(const char *name);
SIM_PUBLIC int sim_dtype_size(SimDType t);

typedef struct {
  int ndim;
  int64_t dims[SIM_MAX_DIMS];
} SimShape;

SIM_PUBLIC SimShape sim_shape_make(int ndim, const int64_t *dims);
SIM_PUBLIC int64_t sim_shape_numel(const SimShape *s);
SIM_PUBLIC gboolean sim_shape_equal(const SimShape *a, const SimShape *b);
/* Writes "[64, 3, 224, 224]" into a newly allocated string. */
SIM_PUBLIC char *sim_shape_to_string(const SimShape *s);

/* A box of a tensor: for each dimension the half-open range [lo, hi). */
typedef struct {
  int ndim;
  int64_t lo[SIM_MAX_DIMS];
  int64_t hi[SIM_MAX_DIMS];
} SimRegion;

SIM_PUBLIC SimRegion sim_region_full(const SimShape *s);
SIM_PUBLIC int64_t sim_region_volume(const SimRegion *r);
/* Intersects @a and @b into @out; returns FALSE (and an empty @out) if they are disjoint. */
SIM_PUBLIC gboolean sim_region_intersect(const SimRegion *a, const SimRegion *b, SimRegion *out);
SIM_PUBLIC gboolean sim_region_equal(const SimRegion *a, const SimRegion *b);
SIM_PUBLIC gboolean sim_region_contains(const SimRegion *outer, const SimRegion *inner);

G_END_DECLS
