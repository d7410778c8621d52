/* lower.h — the lowering (lower.c): (graph, strategy, machine) -> task graph, block by
 * block.  Internal to libsim. */
#pragma once

#include "collective.h"

G_BEGIN_DECLS

typedef struct _SimLowering SimLowering;

/* Prepares the lowering of @g under @s on @m.  @simulated (n_devices flags, may be NULL
 * for all) names the devices whose compute tasks are built: the representatives when
 * symmetric devices are folded.  The strategy is read, not copied: it must outlive the
 * lowering, and sim_lowering_update_op() must follow any change to it. */
SimLowering *sim_lowering_new(const SimGraph *g, const SimMachine *m, const SimStrategy *s,
                              SimCostModel *cost, const SimOptions *o, const SimCollParams *cp,
                              const uint8_t *simulated);
/* Makes the lowering record what copies, reductions and synchronizations mean (for
 * executors); call before sim_lowering_build(). */
void sim_lowering_record_semantics(SimLowering *lw, gboolean on);
/* Lowers @n micro-batches of the strategy's size (its micro-batch count divides the batch)
 * instead of all of them; call before sim_lowering_build().  For the extrapolation of a
 * schedule's steady state (steady.h). */
void sim_lowering_set_microbatch_count(SimLowering *lw, int n);
/* Leaves out the dependencies between two compute tasks of one device whose stream
 * already runs them in that order (a backward on its forward, a consumer on its producer
 * there): what sim_taskgraph_merge_chains() removes first, never built for a graph that
 * will be merged (simulate.c).  Call before sim_lowering_build(). */
void sim_lowering_drop_implied_edges(SimLowering *lw, gboolean on);
void sim_lowering_free(SimLowering *lw);
/* Builds every block. */
void sim_lowering_build(SimLowering *lw);
/* Rebuilds what the configurations of the @n operators @ops touch: their own tasks, the
 * transfers and reductions of their input and output tensors, and the gradient
 * synchronization. */
void sim_lowering_update_ops(SimLowering *lw, const int *ops, int n);
SimTaskGraph *sim_lowering_taskgraph(SimLowering *lw);
/* Iteration range and tensor regions of a shard, in micro-batch coordinates. */
void sim_lowering_shard_range(const SimLowering *lw, int op, int shard, int64_t *lo, int64_t *hi);
void sim_lowering_shard_region(const SimLowering *lw, int op, int shard, SimTensorRole role,
                               int i, SimRegion *out);
SimShape sim_lowering_tensor_shape(const SimLowering *lw, int op, SimTensorRole role, int i);
/* TRUE if a simulated task needed data from a device that is not simulated: folding does
 * not hold for this strategy and the lowering must be redone unfolded. */
gboolean sim_lowering_fold_violated(const SimLowering *lw);
/* Model FLOPs of one iteration (forward and backward, no recomputation). */
double sim_lowering_model_flops(const SimLowering *lw);

G_END_DECLS
