/* parasol-sim-plan.h — part of libsim's public interface (parasol-sim.h, which includes
 * every part): plans: the lowered task graph with what each task means, for executors. */
#pragma once

#include "parasol-sim-simulate.h"

G_BEGIN_DECLS

/* ---------------------------------------------------------------------------------- */
/* Plans: the lowered task graph with what each task means, for executors               */

/* A plan is the task graph sim_simulate() times (without folding, collectives as
 * flows), with the meaning of every task an executor must carry out.  Executors run the
 * tasks in dependency order, compute tasks of one device in its stream order, and can
 * then compare their measured times with the simulator's, task by task. */
typedef struct _SimPlan SimPlan;

typedef enum {
  SIM_PLAN_COMPUTE,        /* op's shard in a pass, on device                            */
  SIM_PLAN_COPY,           /* region of tensor (or its gradient) from device to peer      */
  SIM_PLAN_REDUCE,         /* sum the partial values of region of tensor (or its gradient)
                            * held by devices; every one of them ends with the sum; one
                            * device means partial results of its shards add up in place  */
  SIM_PLAN_SYNC,           /* sum the weight gradients of ops over devices (ZeRO-1: reduce-
                            * scatter them); an op that shares another's weights sums its
                            * copy's gradients with the owner's                           */
  SIM_PLAN_GATHER_PARAMS,  /* after a sharded update, gather the weights of ops            */
  SIM_PLAN_TIMING,         /* a flow or delay that only times a collective                 */
  SIM_PLAN_JOIN,           /* a join point                                               */
} SimPlanKind;


typedef struct {
  SimPlanKind kind;
  SimPass pass;            /* COMPUTE: forward, backward or update; REDUCE (see op)       */
  gboolean recompute;      /* COMPUTE: a forward pass recomputed before the backward       */
  int device, peer;        /* COMPUTE: device; COPY: source and destination               */
  /* COMPUTE: the op, shard and micro-batch (-1 for updates).  COPY: the op whose results
   * move (the producer for values, the consumer for gradients) and the micro-batch.
   * REDUCE: likewise the op whose shards' partial results are summed, the micro-batch,
   * and in @pass and @recompute the pass that computed them. */
  int op, shard, mb;
  int tensor;              /* COPY, REDUCE                                                */
  gboolean grad;           /* COPY, REDUCE: the gradient of the tensor                      */
  SimRegion region;        /* COPY, REDUCE: in micro-batch coordinates (see below)          */
  int n_devices;           /* REDUCE, SYNC, GATHER_PARAMS                                  */
  const int *devices;
  /* SYNC, GATHER_PARAMS: the ops whose weights.  COPY: the ops whose results it carries:
   * the producer for values; for gradients every consumer on the source device whose
   * contributions to the region it sums (consumers on one device send once). */
  int n_ops;
  const int *ops;
  gboolean sharded;        /* SYNC: reduce-scatter                                        */
  double predicted;        /* COMPUTE: the cost model's seconds; COPY: bytes / route bandwidth */
  double bytes;            /* COPY, TIMING flows                                          */
  gboolean relay;          /* COPY: passed on by a device that received it (scatter-gather) */
} SimPlanTask;

/* Lowers @s for execution.  @cost may be NULL (the roofline model). */
SIM_PUBLIC SimPlan *sim_plan_new(const SimGraph *g, const SimMachine *m, const SimStrategy *s,
                                 SimCostModel *cost, GError **error);
SIM_PUBLIC void sim_plan_free(SimPlan *p);
SIM_PUBLIC int sim_plan_n_tasks(const SimPlan *p);
SIM_PUBLIC void sim_plan_task(const SimPlan *p, int task, SimPlanTask *out);
SIM_PUBLIC int sim_plan_n_predecessors(const SimPlan *p, int task);
SIM_PUBLIC int sim_plan_n_successors(const SimPlan *p, int task);
SIM_PUBLIC int sim_plan_successor(const SimPlan *p, int task, int k);
/* The compute tasks of @device in the order its stream runs them. */
SIM_PUBLIC int sim_plan_stream_length(const SimPlan *p, int device);
SIM_PUBLIC int sim_plan_stream_task(const SimPlan *p, int device, int k);
SIM_PUBLIC int sim_plan_microbatches(const SimPlan *p);
SIM_PUBLIC int sim_plan_n_devices(const SimPlan *p);
/* Regions are in micro-batch coordinates: along the dimensions that the op's sample
 * dimension (iteration dimension 0) indexes, index i of micro-batch mb is sample
 * mb * (batch / microbatches) + i of the whole tensor. */
SIM_PUBLIC void sim_plan_shard_range(const SimPlan *p, int op, int shard, int64_t *lo,
                                     int64_t *hi);
SIM_PUBLIC void sim_plan_shard_region(const SimPlan *p, int op, int shard, SimTensorRole role,
                                      int i, SimRegion *out);
/* Which copy of its shard coordinates shard @shard of @op is, for ops computed redundantly
 * on several devices (Megatron's layer norms on every tensor-parallel rank): 0 .. copies
 * - 1; 0 for ops that are not replicated.  Copies synchronize their weight gradients with
 * the same copy of the other shards only. */
SIM_PUBLIC int sim_plan_shard_copy(const SimPlan *p, int op, int shard);
/* The micro-batch shape of tensor @i of @role of @op (its sample dimensions divided). */
SIM_PUBLIC SimShape sim_plan_tensor_shape(const SimPlan *p, int op, SimTensorRole role, int i);
SIM_PUBLIC const SimStrategy *sim_plan_get_strategy(const SimPlan *p);
SIM_PUBLIC const SimGraph *sim_plan_get_graph(const SimPlan *p);
/* The simulator's timeline of the plan (task ids are the plan's). */
SIM_PUBLIC SimReport *sim_plan_simulate(SimPlan *p, GError **error);
/* Writes a timeline measured on the plan (per task start and end, seconds; -1 for tasks
 * not run) in the trace format of sim_report_write_trace(). */
SIM_PUBLIC gboolean sim_plan_write_trace(const SimPlan *p, const double *start, const double *end,
                                         const char *path, GError **error);

G_DEFINE_AUTOPTR_CLEANUP_FUNC(SimPlan, sim_plan_free)

G_END_DECLS
