/* parasol-profile.h — the public interface of libprofile.
 *
 * libprofile turns measurements of real kernels and collectives into something the
 * simulator can use (docs/cost-model.md):
 * - a profile database: the measured time of operator shards (keyed by device, shard
 *   key and pass) and of collectives (keyed by device, kind, GPU count and bytes), read
 *   from and written to JSON ("format": "parasol-profile"), merged across files;
 * - a cost model that answers from the database, exactly or by interpolation, and hands
 *   what it does not know to a fallback (the roofline model);
 * - calibration: the roofline model's efficiencies fitted to a database, and the
 *   bandwidth efficiency and step latency of ring collectives fitted to measured ones;
 * - enumeration of the distinct shard shapes a model and a machine can produce, which is
 *   what `parasol profile ops` measures;
 * - measurement: runners that execute one operator shard (on the CPU here, with CUDA when
 *   built with it), and the driver that warms them up, repeats them and keeps medians.
 *
 * Errors on input, I/O and devices are reported through GError in the PROFILE_ERROR
 * domain; misuse of the API is caught by g_return_val_if_fail. */
#pragma once

#include "parasol-sim.h"

#include <signal.h>

G_BEGIN_DECLS

#define PROFILE_PUBLIC __attribute__((visibility("default")))

/* ---------------------------------------------------------------------------------- */
/* Errors                                                                              */

#define PROFILE_ERROR (profile_error_quark())
typedef enum {
  PROFILE_ERROR_PARSE,        /* malformed file: JSON syntax, wrong format or version      */
  PROFILE_ERROR_INVALID,      /* well-formed but impossible: negative time, bad kind        */
  PROFILE_ERROR_IO,           /* a file could not be read or written                        */
  PROFILE_ERROR_UNSUPPORTED,  /* an operator or collective the runner cannot execute        */
  PROFILE_ERROR_DEVICE,       /* the device failed: none present, a CUDA or NCCL error      */
  PROFILE_ERROR_NO_MEMORY,    /* the device has too little memory for what was asked        */
  PROFILE_ERROR_INTERRUPTED,  /* the measurement was asked to stop (ProfileMeasureOptions.stop) */
} ProfileErrorCode;
PROFILE_PUBLIC GQuark profile_error_quark(void);

/* ---------------------------------------------------------------------------------- */
/* The profile database                                                                */

/* The measured time of one operator shard in one pass on one device.  @key is
 * sim_graph_op_shard_key() of the shard, which names the operator type, the shard's
 * tensor shapes, its dtype and its attributes.  @flops and @bytes are the work of the
 * shard in the pass as sim_graph_op_work() counts it, and @kernels its kernels; both are
 * optional (0, NULL) and serve interpolation and calibration. */
typedef struct {
  const char *gpu;
  const char *key;
  SimPass pass;
  double median, min, max;   /* seconds                                                 */
  int repetitions;
  double flops, bytes;
  int n_kernels;
  const SimKernel *kernels;
} ProfileOpEntry;

typedef enum {
  PROFILE_COLL_ALLREDUCE,
  PROFILE_COLL_ALLGATHER,
  PROFILE_COLL_REDUCE_SCATTER,
  PROFILE_COLL_SENDRECV,     /* one buffer from one GPU to another                       */
  PROFILE_COLL_COUNT
} ProfileCollKind;

/* "all-reduce", "all-gather", "reduce-scatter", "send-recv". */
PROFILE_PUBLIC const char *profile_coll_kind_name(ProfileCollKind k);
/* The kind named @name (also "allreduce", "allgather", "reducescatter", "sendrecv"), or
 * -1. */
PROFILE_PUBLIC int profile_coll_kind_from_name(const char *name);

/* The measured time of one collective over @n_gpus GPUs of one kind.  @bytes is the
 * buffer size as NCCL's tests count it: the whole buffer each rank holds for all-reduce,
 * the gathered output for all-gather, the input for reduce-scatter, the message for
 * send-recv. */
typedef struct {
  const char *gpu;
  ProfileCollKind kind;
  int n_gpus;
  double bytes;
  double median, min, max;   /* seconds                                                 */
  int repetitions;
  const char *source;        /* where the figures come from; may be NULL               */
} ProfileCollEntry;

typedef struct _ProfileDb ProfileDb;

PROFILE_PUBLIC ProfileDb *profile_db_new(void);
PROFILE_PUBLIC void profile_db_free(ProfileDb *db);

/* Reads a database file, or every *.json file of a directory and of its subdirectories
 * (data/profiles holds one per device), merged in name order.  Errors name the file and
 * the place in it ("h200/ops.json: ops[3].median: expected a positive number"). */
PROFILE_PUBLIC ProfileDb *profile_db_load(const char *path, GError **error);
PROFILE_PUBLIC ProfileDb *profile_db_from_json(const char *text, const char *filename,
                                               GError **error);
/* Writes the database as JSON, one entry per line in a stable order, so that two
 * versions of a file diff by entry. */
PROFILE_PUBLIC char *profile_db_to_json(const ProfileDb *db);
PROFILE_PUBLIC gboolean profile_db_save(const ProfileDb *db, const char *path, GError **error);
/* Adds every entry and note of @src to @dst; an entry with the key of one already in
 * @dst replaces it (the later measurement wins). */
PROFILE_PUBLIC void profile_db_merge(ProfileDb *dst, const ProfileDb *src);

/* A one-line description, the sources of the figures and free-form notes per device
 * (the GPU's full name, driver and library versions, the date of the measurements). */
PROFILE_PUBLIC void profile_db_set_description(ProfileDb *db, const char *text);
PROFILE_PUBLIC const char *profile_db_get_description(const ProfileDb *db);
PROFILE_PUBLIC void profile_db_add_source(ProfileDb *db, const char *source);
PROFILE_PUBLIC int profile_db_n_sources(const ProfileDb *db);
PROFILE_PUBLIC const char *profile_db_source(const ProfileDb *db, int i);
PROFILE_PUBLIC void profile_db_set_device_note(ProfileDb *db, const char *gpu, const char *name,
                                               const char *value);
/* The note or NULL (transfer none). */
PROFILE_PUBLIC const char *profile_db_get_device_note(const ProfileDb *db, const char *gpu,
                                                      const char *name);
/* The devices with entries or notes, sorted (transfer full; g_strfreev). */
PROFILE_PUBLIC char **profile_db_devices(const ProfileDb *db);

/* Operator entries.  profile_db_add_op() copies @e (strings and kernels too) and
 * replaces an entry of the same (gpu, key, pass). */
PROFILE_PUBLIC void profile_db_add_op(ProfileDb *db, const ProfileOpEntry *e);
PROFILE_PUBLIC int profile_db_n_ops(const ProfileDb *db);
/* Entry @i in the order profile_db_to_json() writes them (transfer none: valid until the
 * database changes). */
PROFILE_PUBLIC const ProfileOpEntry *profile_db_op(const ProfileDb *db, int i);
PROFILE_PUBLIC const ProfileOpEntry *profile_db_find_op(const ProfileDb *db, const char *gpu,
                                                        const char *key, SimPass pass);

/* How a time was found. */
typedef enum {
  PROFILE_LOOKUP_NONE,         /* not in the database: ask the fallback                  */
  PROFILE_LOOKUP_EXACT,        /* an entry of the same key                               */
  PROFILE_LOOKUP_INTERPOLATED, /* between two entries (below)                            */
} ProfileLookup;

/* The time of the shard @extent of op @op of @g in @pass on @gpu (NULL @extent: the
 * whole op).  An entry of the shard's key answers exactly.  Otherwise the database
 * interpolates between two entries of the same operator type, dtype and attributes
 * whose shapes equal the shard's in all but some dimensions, the same ones for both,
 * where one entry is smaller and the other larger than the shard in every one of them:
 * the shard lies on the segment between them, as when only the batch or one split
 * dimension changed.  The time is interpolated linearly in the work: FLOPs for operators
 * whose work has GEMM-like kernels, bytes for the others; of several such pairs, the
 * closest (the smallest ratio of their work) wins.  Nothing is extrapolated.  Returns the
 * seconds, or -1 with PROFILE_LOOKUP_NONE; @how may be NULL. */
PROFILE_PUBLIC double profile_db_lookup_op(const ProfileDb *db, const char *gpu,
                                           const SimGraph *g, int op, const int64_t *extent,
                                           SimPass pass, ProfileLookup *how);

/* Collective entries.  profile_db_add_collective() copies @e and replaces an entry of
 * the same (gpu, kind, n_gpus, bytes). */
PROFILE_PUBLIC void profile_db_add_collective(ProfileDb *db, const ProfileCollEntry *e);
PROFILE_PUBLIC int profile_db_n_collectives(const ProfileDb *db);
PROFILE_PUBLIC const ProfileCollEntry *profile_db_collective(const ProfileDb *db, int i);
/* The time of @kind over @n_gpus GPUs of @gpu on @bytes: an exact entry, or linear
 * interpolation in bytes between the two nearest sizes measured for that GPU count.
 * Returns -1 with PROFILE_LOOKUP_NONE outside the measured sizes. */
PROFILE_PUBLIC double profile_db_lookup_collective(const ProfileDb *db, const char *gpu,
                                                   ProfileCollKind kind, int n_gpus,
                                                   double bytes, ProfileLookup *how);

/* ---------------------------------------------------------------------------------- */
/* The profile cost model                                                              */

/* A cost model whose op_time answers from @db (exactly, then by interpolation) and
 * answers negative otherwise, so that sim_cost_model_op_time() asks @fallback, which the
 * model takes over (sim_cost_model_free() frees both).  NULL @fallback means the default
 * roofline model.  Entries are looked up for @gpu when it is given, so that a machine
 * whose devices carry another name (a custom spec) uses a named profile; NULL @gpu looks
 * them up under each device's spec name.  @db is copied.  Lookups are cached and the
 * model may be called from several threads at once. */
PROFILE_PUBLIC SimCostModel *profile_cost_model_new(const ProfileDb *db, const char *gpu,
                                                    SimCostModel *fallback);
/* What the model answered so far: exact hits, interpolations and misses handed to the
 * fallback, counted over distinct (shard, pass) queries.  FALSE if @m is not a profile
 * cost model. */
PROFILE_PUBLIC gboolean profile_cost_model_stats(SimCostModel *m, int *exact, int *interpolated,
                                                 int *missed);

/* ---------------------------------------------------------------------------------- */
/* Calibration                                                                         */

/* The result of fitting the roofline efficiencies to the operator entries of one device:
 * the least-squares fit of log(predicted) to log(measured) over every entry that carries
 * its kernels.  An efficiency no entry depends on keeps its starting value and its
 * @fitted flag is FALSE. */
typedef struct {
  SimRooflineParams params;
  gboolean fitted[5];        /* gemm, conv, memory, gather, recurrent                    */
  int n_entries;
  double rms_log_before;     /* root mean square of log(predicted / measured)            */
  double rms_log_after;
  double mean_abs_error_before;  /* mean |predicted - measured| / measured               */
  double mean_abs_error_after;
  double worst_error_after;      /* the largest |predicted - measured| / measured         */
} ProfileCalibration;

/* Fits the efficiencies of @start (NULL: the defaults) to the entries of @gpu in @db on a
 * device of spec @dev.  The tile quantization settings of @start are kept.  Fails with
 * PROFILE_ERROR_INVALID when no entry of @gpu has kernels. */
PROFILE_PUBLIC gboolean profile_calibrate_roofline(const ProfileDb *db, const char *gpu,
                                                   const SimDeviceSpec *dev,
                                                   const SimRooflineParams *start,
                                                   ProfileCalibration *out, GError **error);
/* The residual of entry @i of @db (log(predicted / measured)) under @params, or NAN when
 * the entry has no kernels: for reports of the worst-fitting shards. */
PROFILE_PUBLIC double profile_calibration_residual(const ProfileDb *db, int i,
                                                   const SimDeviceSpec *dev,
                                                   const SimRooflineParams *params);

/* The parameters of the simulator's ring collectives (sim/collective.c) fitted to the
 * measured collectives of @kind on @gpu: a ring of n ranks takes steps * (latency + a)
 * + steps * (bytes / n) / (bandwidth * efficiency), with 2(n - 1) steps for all-reduce,
 * n - 1 for all-gather and reduce-scatter, and one step carrying the whole buffer for
 * send-recv.  @link_bandwidth (bytes/s) and @link_latency (s) are the route bottleneck
 * bandwidth and latency between ring neighbours on the machine the measurements come
 * from (sim_machine_bandwidth() and sim_machine_latency()).  The fit minimizes the
 * relative error, so small and large messages count alike. */
typedef struct {
  double bandwidth_efficiency;   /* SimOptions.coll_bandwidth_efficiency                 */
  double step_latency;           /* SimOptions.coll_step_latency, seconds                 */
  int n_points;
  double mean_abs_error;         /* mean |predicted - measured| / measured                */
  double worst_error;
} ProfileCollFit;

PROFILE_PUBLIC gboolean profile_db_fit_collective(const ProfileDb *db, const char *gpu,
                                                  ProfileCollKind kind, double link_bandwidth,
                                                  double link_latency, ProfileCollFit *out,
                                                  GError **error);

/* Reads the output of NCCL's tests as CSV files named like "allreduce_8gpu.csv" (one per
 * GPU count, columns size(B), count, type, then time(ns) and busbw(GB/s) for one or more
 * repetitions) from @dir, and adds their points as entries of @gpu with @source.  The
 * kind comes from the file name ("allreduce", "allgather", "reducescatter",
 * "sendrecv"). */
PROFILE_PUBLIC gboolean profile_db_import_nccl_tests(ProfileDb *db, const char *dir,
                                                     const char *gpu, const char *source,
                                                     GError **error);

/* ---------------------------------------------------------------------------------- */
/* Shard shapes                                                                        */

typedef struct {
  int n_devices;            /* degrees multiply to a divisor of this                     */
  const int *microbatches;  /* micro-batch counts that divide the sample dimension; NULL:
                             * only 1                                                    */
  int n_microbatches;
  int max_shapes;           /* stop after this many (0: no limit)                       */
} ProfileEnumerateOptions;

/* The distinct shard shapes of the operators of @g: for every operator with work, every
 * choice of degrees over its splittable dimensions that divide them and whose product
 * divides @o->n_devices, and every micro-batch count of @o (which divides the sample
 * dimension first), as the search can choose them (search/configs.c).  Shapes with the
 * same shard key are listed once, under the first operator that has them. */
typedef struct _ProfileShapes ProfileShapes;
PROFILE_PUBLIC ProfileShapes *profile_enumerate_shapes(const SimGraph *g,
                                                       const ProfileEnumerateOptions *o);
PROFILE_PUBLIC void profile_shapes_free(ProfileShapes *s);
PROFILE_PUBLIC int profile_shapes_n(const ProfileShapes *s);
PROFILE_PUBLIC int profile_shapes_op(const ProfileShapes *s, int i);
/* The extents of the iteration dimensions of shape @i (transfer none). */
PROFILE_PUBLIC const int64_t *profile_shapes_extent(const ProfileShapes *s, int i);
PROFILE_PUBLIC const char *profile_shapes_key(const ProfileShapes *s, int i);
/* How many (operator, configuration) pairs the distinct shapes stand for. */
PROFILE_PUBLIC int profile_shapes_n_configs(const ProfileShapes *s);

/* ---------------------------------------------------------------------------------- */
/* Runners: executing one operator shard                                               */

typedef struct _ProfileRunner ProfileRunner;

/* A runner is a struct of function pointers (docs/extending.md).  New slots go at the end. */
#define PROFILE_RUNNER_API_VERSION 1
typedef struct {
  int api_version;          /* PROFILE_RUNNER_API_VERSION                                */
  const char *name;         /* "cpu", "cuda"                                            */
  /* Required: the device the runner measures, as entries are filed ("cpu", "h200"). */
  const char *(*device_name)(ProfileRunner *self);
  /* Required: allocates and fills the tensors of the shard @extent of op @op of @g.
   * FALSE with PROFILE_ERROR_UNSUPPORTED for an operator it cannot run, or
   * PROFILE_ERROR_NO_MEMORY when the shard does not fit in the device's memory, or
   * PROFILE_ERROR_DEVICE when the device fails. */
  gboolean (*prepare)(ProfileRunner *self, const SimGraph *g, int op, const int64_t *extent,
                      GError **error);
  /* Required: runs @pass of the prepared shard @n times, one after the other, and writes
   * the seconds of each run to @seconds. */
  gboolean (*run)(ProfileRunner *self, SimPass pass, int n, double *seconds, GError **error);
  /* Optional: releases what prepare took. */
  void (*release)(ProfileRunner *self);
  /* Optional: releases the runner's private data. */
  void (*finalize)(ProfileRunner *self);
  /* Optional: notes on the device and its libraries for the database ("name", "driver",
   * "cuda", ...), as a NULL-terminated list of name, value pairs (transfer none). */
  const char *const *(*device_notes)(ProfileRunner *self);
} ProfileRunnerClass;

struct _ProfileRunner {
  const ProfileRunnerClass *klass;
  void *priv;
};

PROFILE_PUBLIC void profile_runner_free(ProfileRunner *r);
PROFILE_PUBLIC const char *profile_runner_device_name(ProfileRunner *r);

/* The CPU runner: executes the kernels of the shard's work (sim_graph_op_work()) with
 * plain reference code on this processor, one thread: GEMMs and convolutions as blocked
 * matrix products of their m x n x k in fp32, recurrent kernels as their steps of
 * products, memory, gather and optimizer kernels as streaming passes that read and write
 * their bytes and do their arithmetic.  It times what the cost model prices, so a
 * database of "cpu" entries can be checked against the roofline model of a CPU spec.
 * @device_name names its entries ("cpu" when NULL). */
PROFILE_PUBLIC ProfileRunner *profile_runner_cpu_new(const char *device_name);

/* The CUDA runner (built with -Dgpu): runs each operator shard with cuBLAS, cuDNN and
 * the executor's own kernels on GPU @device, timed with CUDA events.  @device_name names
 * its entries (NULL: derived from the GPU's name, "h200" for an NVIDIA H200).  Returns
 * NULL with PROFILE_ERROR_DEVICE when no usable GPU is present or the build has no CUDA
 * part. */
PROFILE_PUBLIC ProfileRunner *profile_runner_cuda_new(int device, const char *device_name,
                                                      GError **error);
/* Whether this build has the CUDA part. */
PROFILE_PUBLIC gboolean profile_have_cuda(void);

/* ---------------------------------------------------------------------------------- */
/* Measuring                                                                           */

typedef struct {
  int warmup;               /* runs before timing (default 3)                           */
  int repetitions;          /* timed runs (default 10)                                  */
  double min_seconds;       /* repeat until this much time is timed (0: only @repetitions) */
  int max_repetitions;      /* cap for @min_seconds (default 1000)                      */
  gboolean backward;        /* measure the backward pass too (default TRUE)             */
  gboolean update;          /* measure the weight update of ops with weights (default FALSE) */
  /* When given and it becomes non-zero (a SIGINT handler sets it), the measurement stops
   * between runs: the shape under way is dropped and what was measured before is kept. */
  const volatile sig_atomic_t *stop;
} ProfileMeasureOptions;

PROFILE_PUBLIC ProfileMeasureOptions profile_measure_options_default(void);

/* Measures op @op's shard @extent of @g in @pass with @r and adds the entry (the
 * median, minimum and maximum of the timed runs, and the shard's work) to @db under the
 * runner's device.  Returns the entry (transfer none: valid until @db changes) or NULL
 * with @error set. */
PROFILE_PUBLIC const ProfileOpEntry *profile_measure_op(ProfileRunner *r, ProfileDb *db,
                                                        const SimGraph *g, int op,
                                                        const int64_t *extent, SimPass pass,
                                                        const ProfileMeasureOptions *o,
                                                        GError **error);

/* Called after each shape: @done of @total, the key just measured. */
typedef void (*ProfileProgressFunc)(int done, int total, const char *key, gpointer user_data);

/* Measures every shape of @shapes in the passes @o asks for and adds the entries to @db,
 * with the runner's device notes.  A shape the runner cannot run (unsupported, or out of
 * device memory) is skipped and counted in @n_skipped with a warning on stderr; a device
 * error stops the measurement and is returned.  When @o->stop is set, the measurement
 * ends early with the shapes measured so far, which is not an error (@progress has been
 * told of each shape done).  Returns the number of entries added. */
PROFILE_PUBLIC int profile_measure_shapes(ProfileRunner *r, ProfileDb *db, const SimGraph *g,
                                          const ProfileShapes *shapes,
                                          const ProfileMeasureOptions *o,
                                          ProfileProgressFunc progress, gpointer user_data,
                                          int *n_skipped, GError **error);

/* ---------------------------------------------------------------------------------- */
/* Collectives on the GPUs of this host                                                */

typedef struct {
  ProfileCollKind kind;
  int n_gpus;               /* GPUs 0..n-1 of this host                                 */
  double min_bytes, max_bytes;  /* sizes: powers of two from min to max                 */
  int warmup, repetitions;
} ProfileCollOptions;

/* Measures @o->kind with NCCL over the first @o->n_gpus GPUs of this process (one
 * communicator per GPU, driven by one thread in a group call) and adds the entries to
 * @db under @gpu (NULL: derived from the GPU's name).  PROFILE_ERROR_DEVICE when the
 * build has no CUDA part or fewer GPUs are present. */
PROFILE_PUBLIC gboolean profile_measure_collectives(ProfileDb *db, const char *gpu,
                                                    const ProfileCollOptions *o,
                                                    GError **error);

/* The device name entries of a GPU are filed under, from its marketing name: "NVIDIA
 * H200" gives "h200", "NVIDIA A100-SXM4-80GB" gives "a100-80gb", as the device library
 * spells them where it knows them (transfer full). */
PROFILE_PUBLIC char *profile_gpu_name_from_vendor(const char *vendor_name);

G_DEFINE_AUTOPTR_CLEANUP_FUNC(ProfileDb, profile_db_free)
G_DEFINE_AUTOPTR_CLEANUP_FUNC(ProfileShapes, profile_shapes_free)
G_DEFINE_AUTOPTR_CLEANUP_FUNC(ProfileRunner, profile_runner_free)

G_END_DECLS
