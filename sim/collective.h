/* collective.h — collectives (collective.c): appended to a task graph's block as flows,
 * delays and join points; how well they use the links.  Internal to libsim. */
#pragma once

#include "taskgraph.h"

G_BEGIN_DECLS

typedef enum {
  SIM_COLL_ALLREDUCE,
  SIM_COLL_REDUCE_SCATTER,
  SIM_COLL_ALLGATHER,
} SimCollKind;

/* How well collectives use the links: NCCL reaches a fraction of the link bandwidth and
 * pays a fixed cost per algorithm step (calibrated from measurements; see roofline.c). */
typedef struct {
  double bandwidth_efficiency;  /* achieved fraction of the bottleneck link bandwidth */
  double net_efficiency;        /* the same on NIC and network links (InfiniBand,
                                 * Ethernet); 0: bandwidth_efficiency                 */
  double step_latency;          /* seconds per algorithm step, beyond link latency    */
  double base_latency;          /* seconds per collective: launch and handshake       */
  const SimCollTable *allreduce_table; /* measured all-reduces inside a node, or NULL  */
  /* SIM_DETAIL_FLOWS: a ring over every GPU of one node whose ranks' routes are alike
   * (one latency, distinct links of one capacity) is lowered as the whole ring's one flow.
   * Exact only if no other flow crosses its links (sim_taskgraph_rings_private()), which
   * the caller checks after lowering (simulate.c, SimOptions.merge_rings). */
  gboolean whole_node_rings;
} SimCollParams;

SimCollParams sim_coll_params_default(void);
/* The defaults, with what @o overrides. */
SimCollParams sim_coll_params_from_options(const SimOptions *o);
/* The bandwidth transfers reach on @link: its own times the efficiency of its kind in @cp
 * (NULL: all of it). */
double sim_coll_link_capacity(const SimMachine *m, const SimCollParams *cp, int link);

/* After the last assembly: runs of compute tasks of one class and micro-batch that follow
 * each other on a stream, each the only successor of the one before and waiting for
 * nothing else, become one task each (taskgraph-merge.c).  The engine's timeline is then
 * the unmerged one's, its merged tasks spanning their runs, provided that the host never
 * delays a kernel (no host times, no blocking sends: see simulate.c).  Renumbers the
 * tasks; returns how many were merged into the task before them.  @keep_steps keeps each
 * run's steps (SimTaskGraph.chain), for an engine that stops at the first task over
 * memory, which then stops when the unmerged run would.  With @m (links at their
 * capacities under @cp), the rings of collectives lowered as a flow per rank first become
 * one flow each where that is exact (see merge_rings() in taskgraph-merge.c); @chains
 * FALSE merges only those.  With @absorb (and @chains and @m) a ring that a stream waits
 * for alone between two of its tasks of one class becomes a step of their run
 * (absorbable_rings() in taskgraph-merge.c), kept in SimTaskGraph.rings for the report;
 * only where the engine runs groups of flows.  Returns -1 where SimTaskGraph.cancel was
 * raised while it ran: it stopped there, and the graph is only to be freed. */
int sim_taskgraph_merge_chains(SimTaskGraph *tg, gboolean chains, gboolean keep_steps,
                               const SimMachine *m, const SimCollParams *cp, gboolean absorb);
/* The same for a run that reports only its time and memory (sim_simulate_brief()): runs
 * may also span classes, and rings are taken in without keeping them. */
int sim_taskgraph_merge_chains_brief(SimTaskGraph *tg, gboolean chains, gboolean keep_steps,
                                     const SimMachine *m, const SimCollParams *cp);

/* Whether every flow of @tg that crosses several links as a whole (a ring's one flow) keeps
 * to links that no other flow crosses, except whole flows over the same ranks in the same
 * ring order (see whole_node_rings). */
gboolean sim_taskgraph_rings_private(const SimTaskGraph *tg, const SimMachine *m);

/* One collective to lower: @kind over @devices (n of them, in ring order) moving @bytes
 * (the full buffer size per device), with @algo for all-reduces, at @detail, for
 * operator @op and micro-batch @mb (-1: none) of task class @cls. */
typedef struct {
  SimCollKind kind;
  SimAllreduceAlgo algo;
  SimDetail detail;
  const SimCollParams *params;
  SimTaskClass cls;
  const int *devices;
  int n;
  double bytes;
  int op, mb;
} SimCollective;

/* Appends collective @c to @block.  Returns the references of its start and end join
 * points: make the producers precede *start and the consumers follow *end. */
void sim_collective_lower(SimTaskGraph *tg, int block, const SimMachine *m, const SimCollective *c,
                          SimTaskRef *start, SimTaskRef *end);

/* The same, without join points where the collective is one flow (SIM_DETAIL_COLLECTIVE,
 * a ring of one channel): *start is then its fixed cost's delay or the flow, *end the
 * flow.  A third fewer tasks for the tensor-parallel reductions of large models. */
void sim_collective_lower_bare(SimTaskGraph *tg, int block, const SimMachine *m,
                               const SimCollective *c, SimTaskRef *start, SimTaskRef *end);

/* Whether @c, lowered by sim_collective_lower_bare() with bytes to move, is two join
 * points around the one flow of a whole node's ring (SimCollParams.whole_node_rings) and
 * nothing else, whatever its bytes: then @links holds the ring's links from the first
 * member on (@n_links of at most @cap; FALSE where they do not fit) and @hop_latency
 * its longest hop's latency. */
gboolean sim_collective_node_ring(const SimMachine *m, const SimCollective *c, int32_t *links,
                                  int cap, int *n_links, double *hop_latency);
/* That flow's bytes and latency, as the lowering gives them, for @c's bytes. */
void sim_collective_node_ring_flow(const SimCollective *c, double hop_latency, double *bytes,
                                   double *latency);

/* The analytic duration of a collective without contention: what the FLOWS level yields
 * on an idle machine (used by tests and by search heuristics). */
double sim_collective_time(const SimMachine *m, SimCollKind kind, SimAllreduceAlgo algo,
                           const SimCollParams *cp, const int *devices, int n, double bytes);

G_END_DECLS
