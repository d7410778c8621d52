/* network.h — the network (network.c): flows on routes sharing links by max-min
 * fairness.  Internal to libsim. */
#pragma once

#include "collective.h"

G_BEGIN_DECLS

typedef struct _SimNet SimNet;

/* Called when a flow's predicted end time changes. */
typedef void (*SimNetRescheduleFunc)(void *user, int flow_task, double end_time);

/* Links carry flows at sim_coll_link_capacity() (@cp NULL: their full bandwidth). */
SimNet *sim_net_new(const SimMachine *m, const SimCollParams *cp);
void sim_net_free(SimNet *net);
void sim_net_reset(SimNet *net);
/* sim_net_reset() for a net whose flows since its last reset all crossed only the links
 * @links[i] (@n_links[i] each, i < @n): the same state, without a pass over every link
 * and route of the machine. */
void sim_net_reset_links(SimNet *net, const int *const *links, const int *n_links, int n);
/* The net remembers the rates of the components it solves, across runs too, in at most
 * @bytes (0: not at all, the default; SIM_NET_MEMORY: what a delta session's engine
 * gives it), and gives them again when a component comes back (see network.c).  It pays
 * in long-lived engines.  Only while no flow is active. */
/* 64 MiB: a 64-GPU search's working set (half as much made a 300-evaluation MCMC search
 * of inception-v3 4% slower, a quarter 1.5 times slower). */
#define SIM_NET_MEMORY ((size_t)64 << 20)
void sim_net_set_memory(SimNet *net, size_t bytes);
/* How many solves the net's memory has answered. */
int64_t sim_net_memory_hits(const SimNet *net);
/* After a solve whose component held at least half the active flows, and @min_flows or
 * more, the next @solves solves take every active flow as their component instead of
 * searching for theirs, unless the active flows have doubled meanwhile
 * (SIM_NET_WHOLE_RUN and SIM_NET_WHOLE_MIN by default; 0 solves: always search).
 * Filling components together gives each the rates it gets alone, bit for bit, so this
 * changes what a solve costs, not what it finds: on MCMC over 256 GPUs the network's
 * solves were 60% of the run, and most of their components were the whole network. */
#define SIM_NET_WHOLE_RUN 16
#define SIM_NET_WHOLE_MIN 64
void sim_net_set_whole_run(SimNet *net, int solves, int min_flows);
/* How many solves took the whole network without searching. */
int64_t sim_net_whole_solves(const SimNet *net);
/* Starts flow @task of @bytes along the @n_links links of @links at time @now; returns
 * its slot. */
int sim_net_add(SimNet *net, int task, const int *links, int n_links, double bytes, double now);
/* The same, for bytes already counted on the links (a flow that resumes). */
int sim_net_resume(SimNet *net, int task, const int *links, int n_links, double bytes,
                   double now);
/* Counts @bytes on each of the @n_links links of @links, as sim_net_add() does. */
void sim_net_account(SimNet *net, const int *links, int n_links, double bytes);
/* Whether flows cross @link now. */
gboolean sim_net_link_busy(const SimNet *net, int link);
/* The bytes the flow in @slot had left when its rate last changed, and that rate. */
void sim_net_flow_state(const SimNet *net, int slot, double *remaining, double *rate);
/* Removes the finished flow in @slot. */
void sim_net_remove(SimNet *net, int slot, double now);
/* Recomputes the rates of the flows whose links changed and reports new end times. */
void sim_net_update(SimNet *net, double now, SimNetRescheduleFunc fn, void *user);
/* Bytes carried by each link so far (n_links entries). */
const double *sim_net_link_bytes(const SimNet *net);
int sim_net_n_active(const SimNet *net);

G_END_DECLS
