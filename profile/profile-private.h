/* profile-private.h — the bodies of libprofile's types and the helpers its files share. */
#pragma once

#include "parasol-profile.h"

/* An operator entry as the database keeps it: the public view plus the storage its
 * strings and kernels point into. */
typedef struct {
  ProfileOpEntry e;
  char *gpu, *key;
  SimKernel *kernels;
} OpRecord;

typedef struct {
  ProfileCollEntry e;
  char *gpu, *source;
} CollRecord;

struct _ProfileDb {
  char *description;
  GPtrArray *sources;         /* char *                                                  */
  GHashTable *notes;          /* gpu -> (GHashTable name -> value)                       */
  GPtrArray *ops;             /* OpRecord *, in insertion order                          */
  GHashTable *op_index;       /* "gpu\x1fpass\x1fkey" -> OpRecord *                       */
  GPtrArray *colls;           /* CollRecord *                                            */
  GHashTable *coll_index;     /* "gpu\x1fkind\x1fn\x1fbytes" -> CollRecord *              */
  gboolean sorted;            /* ops and colls are in the order of profile_db_op()        */
  GHashTable *families;       /* interpolation index, built on demand (db.c)            */
};

/* "gpu\x1fpass\x1fkey" (transfer full). */
char *profile_op_index_key(const char *gpu, SimPass pass, const char *key);

/* Sorts the entries into their canonical order if they are not (the order of the file
 * and of profile_db_op()).  Logically const: it only reorders. */
void profile_db_sort(ProfileDb *db);
/* Drops the interpolation index after a change. */
void profile_db_invalidate(ProfileDb *db);

/* The name of a kernel kind in files ("gemm", "conv", ...) and back (-1 if unknown). */
int profile_kernel_kind_from_name(const char *name);
/* The pass named @name ("forward", "backward", "update") or -1. */
int profile_pass_from_name(const char *name);

/* Whether the work has a kernel bound by arithmetic (GEMM, convolution, recurrent):
 * such shards are interpolated in FLOPs, the others in bytes. */
gboolean profile_work_is_compute(const SimWork *w);

/* The median of @n values (sorts them). */
double profile_median(double *v, int n);
/* strcmp() of two char * held in an array, for qsort() and g_ptr_array_sort() (db.c). */
int profile_compare_strings(const void *a, const void *b);

/* The CUDA part (profile/cuda), or stand-ins that fail when the build has none. */
ProfileRunner *profile_cuda_runner_new(int device, const char *device_name, GError **error);
gboolean profile_cuda_measure_collectives(ProfileDb *db, const char *gpu,
                                          const ProfileCollOptions *o, GError **error);
