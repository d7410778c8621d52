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
/* Ring steps, for a graph whose chains will be merged and whose rings' links only the
 * simulated flows and the shadows they meet show (a brief run's, simulate.c): a
 * tensor-parallel reduction that one simulated shard alone waits for, lowered by its
 * collective as a whole node's one flow, becomes a compute task of that shard's device
 * for the time its flow takes alone, placed on the stream right after the shard's task
 * (lower-tensors.c, ring_step()).  Three tasks (the flow and two join points) become
 * one, which the merging takes into the stream's runs.  @waits: tensor-parallel
 * overlap's waits (the part of a collective its GEMM does not hide, a delay of their
 * device) are lowered as steps of their stream likewise (lower-tensors.c, add_wait()).
 * Call before sim_lowering_build(); then sim_lowering_settle_ring_steps() after the
 * assembly. */
void sim_lowering_ring_steps(SimLowering *lw, gboolean rings, gboolean waits);
/* After the assembly of a graph with ring steps: makes each step run as its ring would
 * (a wait, as its delay would: kept where the stream runs it between a task it waits for
 * and the next task, which waits for it; a delay again elsewhere).
 * A step ends when its ring would where the ring runs alone and the stream waits for it,
 * and for nothing else, between the task it follows and the next (in the graph with the
 * ring, nothing runs on the device meanwhile).  That holds for every step of a device
 * whose steps all sit between the task they follow and the first that waits for them
 * (so that its rings run one at a time), and whose rings' links no flow and no other
 * device's ring crosses.  The steps of any other device run as their rings' flows. */
void sim_lowering_settle_ring_steps(SimLowering *lw);
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
