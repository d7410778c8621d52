/* cuda-desc.h — describing an operator call of the graph for the CUDA operator library
 * (parasol-cuda.h): what the profiler's CUDA runner and the executor's CUDA back end
 * both need from the graph. */
#pragma once

#include "parasol-cuda.h"
#include "parasol-sim.h"

G_BEGIN_DECLS

/* The GPU operator library's errors, as pcu_desc_init() and pcu_set_error() report them
 * (its users translate them: the profiler into PROFILE_ERROR with the same codes, the
 * executor into EXEC_ERROR). */
#define PCU_ERROR (pcu_error_quark())
GQuark pcu_error_quark(void);
typedef enum {
  PCU_ERROR_NO_MEMORY,    /* the device's memory ran out                               */
  PCU_ERROR_UNSUPPORTED,  /* the library cannot run the call                           */
  PCU_ERROR_INVALID,      /* the call's arguments are wrong                            */
  PCU_ERROR_DEVICE,       /* any other failure of the device or of CUDA                */
} PcuError;

/* Fills @a for op @op of @g on the shard [lo, hi) of its iteration space: the type, the
 * attributes, the regions of every tensor (sim_graph_op_shard_region), which shards add
 * biases, the dropout hash inputs, and the phase FORWARD.  The views are left empty for
 * the caller; @dtype is the floating-point type the call computes in.  FALSE with
 * PCU_ERROR_UNSUPPORTED for what the library cannot run (too many tensors). */
gboolean pcu_desc_init(PcuOpArgs *a, const SimGraph *g, int op, const int64_t *lo,
                       const int64_t *hi, int dtype, GError **error);

/* Whether the shard [lo, hi) splits a dimension its outputs are not indexed by, so that
 * its outputs are partial sums (or, for cross entropy, statistics to merge). */
gboolean pcu_desc_splits_reduction(const SimGraph *g, int op, const int64_t *lo,
                                   const int64_t *hi);

/* The FNV-1a hash of @name, as exec_hash_uniform() hashes operator names. */
uint64_t pcu_name_hash(const char *name);

/* The PcuDType of a SimDType: integers become int64, as the executor stores them. */
int pcu_dtype_of(SimDType t);

/* A message for a failed call: the library's own, prefixed by what failed. */
void pcu_set_error(GError **error, PcuContext *ctx, PcuStatus s, const char *what);

G_END_DECLS
