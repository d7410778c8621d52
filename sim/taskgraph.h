/* taskgraph.h — the lowered form of (graph, strategy, machine): tasks, dependencies and
 * stream orders, and the engine that times them.  Internal to libsim.
 *
 * The task graph is built in blocks: the tasks of one operator (every shard, pass and
 * micro-batch), the transfers of one tensor between its producer and a consumer, the
 * gradient synchronization of one bucket.  A dependency names its ends as (block, index)
 * so that a block can be rebuilt alone when a strategy changes a few operators (delta
 * simulation); sim_taskgraph_assemble() then lays all blocks out in flat arrays, which is
 * what the engine reads. */
#pragma once

#include "sim-private.h"

G_BEGIN_DECLS

typedef enum {
  SIM_TASK_COMPUTE,   /* runs on its device's compute stream for @duration             */
  SIM_TASK_FLOW,      /* moves @bytes from @device to @peer along the route; shares links */
  SIM_TASK_DELAY,     /* waits @duration without holding a resource (protocol latency) */
  SIM_TASK_NOP,       /* a join point                                                */
} SimTaskKind;

typedef enum {
  SIM_CLASS_FORWARD,
  SIM_CLASS_BACKWARD,
  SIM_CLASS_RECOMPUTE,
  SIM_CLASS_UPDATE,
  SIM_CLASS_TRANSFER,    /* activations and gradients between operators (p2p)        */
  SIM_CLASS_REDUCTION,   /* partial sums of split reductions (tensor parallelism)     */
  SIM_CLASS_GRAD_SYNC,   /* gradient all-reduce / reduce-scatter over replicas         */
  SIM_CLASS_PARAM_SYNC,  /* parameter all-gather after a sharded optimizer step        */
  SIM_CLASS_COUNT
} SimTaskClass;

const char *sim_task_class_name(SimTaskClass c);

/* 64 bytes, a cache line: a large model's graph holds millions of tasks, twice while it is
 * assembled.  Fields that only compute tasks or only flows use share their place (read
 * them for that kind only). */
typedef struct {
  uint8_t kind;        /* SimTaskKind                                                 */
  uint8_t cls;         /* SimTaskClass                                                */
  uint16_t n_links;    /* a collective's flow: the links it crosses (0 for a pair)    */
  int32_t device;      /* compute, delay: the device; flow: the source; nop: -1        */
  int32_t peer;        /* flow: the destination device; compute: a merged run's steps
                        * in SimTaskGraph.chain, or -1 (sim_taskgraph_merge_chains())  */
  int32_t op;          /* the operator, or -1                                         */
  int32_t mb;          /* the micro-batch, or -1                                      */
  int32_t shard;       /* the shard of the operator, or -1                             */
  double duration;     /* compute and delay: seconds; flow: latency added to the route's */
  union {
    struct {           /* compute tasks                                               */
      int64_t mem_alloc; /* bytes allocated on @device when the task starts           */
      int64_t mem_free;  /* bytes released on @device when the task ends              */
    };
    struct {           /* flows                                                       */
      double bytes;
      int32_t coll;      /* a collective's flows: its id in the task graph, or -1      */
      int32_t links_off; /* a collective's flow: its links (then members) in extra     */
    };
  };
  uint16_t n_members;  /* a collective's flow: its devices, after its links in extra   */
  uint16_t n_kernels;  /* compute: kernels the host issues for it                      */
  /* Filled by assembly (the predecessor counts are SimTaskGraph.n_pred): */
  int32_t succ_off;    /* into SimTaskGraph.succ                                      */
  int32_t n_succ;
} SimTask;
G_STATIC_ASSERT(sizeof(SimTask) == 64);

/* A flow's bytes, 0 for any other task. */
static inline double sim_task_bytes(const SimTask *t)
{
  return t->kind == SIM_TASK_FLOW ? t->bytes : 0;
}

/* A reference to a task before assembly. */
typedef struct {
  int32_t block;
  int32_t index;
} SimTaskRef;

typedef struct {
  SimTaskRef from, to;
} SimTaskEdge;

/* An entry of a compute stream: the stream of @device runs its entries in @key order. */
typedef struct {
  uint64_t key;
  int32_t device;
  int32_t index;       /* task in the block                                           */
} SimStreamEntry;

/* What a task means for an executor (recorded only when asked: the simulator needs
 * none of it).  A copy moves @region of @tensor (or of its gradient) from the task's
 * device to its peer; a reduction sums the partial values of @region over @devs, which
 * all end with the sum; a weight synchronization sums (or reduce-scatters, or after a
 * sharded update all-gathers) the weight gradients of @ops over @devs. */
typedef enum {
  SIM_SEM_COPY,
  SIM_SEM_REDUCE,
  SIM_SEM_SYNC,
  SIM_SEM_GATHER_PARAMS,
} SimSemKind;

typedef struct {
  int32_t index;       /* the task in its block                                       */
  uint8_t kind;        /* SimSemKind                                                  */
  uint8_t grad;        /* the gradient of the tensor, not its value                    */
  uint8_t relay;       /* a copy passed on by a device that received it (scatter-gather) */
  uint8_t coll;        /* SimCollKind of a synchronization                             */
  int32_t tensor;
  SimRegion region;
  int32_t n_devs;
  int32_t *devs;
  int32_t n_ops;
  int32_t *ops;
} SimTaskSem;

#define SIM_BLOCK_RINGS 8

typedef struct {
  GArray *tasks;       /* SimTask                                                     */
  GArray *sem;         /* SimTaskSem, when the lowering records meanings                */
  GArray *edges;       /* SimTaskEdge: dependencies this block declares                */
  GArray *stream;      /* SimStreamEntry                                              */
  GArray *extra;       /* int32: link and member lists of collectives' flows           */
  gboolean live;       /* FALSE for a block slot that is free                          */
  gboolean changed;    /* cleared, rebuilt or freed since the last assembly             */
  int32_t offset;      /* first global task id, after assembly                          */
  /* Where the last assembly put the block's tasks and links; an unchanged block that
   * lands there again is not copied again. */
  int32_t last_offset, last_extra;
  gboolean placed;
  /* With shared tasks (sim_taskgraph_share_tasks()): the block's tasks are
   * SimTaskGraph.shared[sh_start, sh_start + sh_len) and @tasks stays empty. */
  gboolean shared;
  int64_t sh_start;    /* -1 until the block's first task                               */
  int32_t sh_len;
  /* The block's last few distinct rings (sim_taskgraph_add_ring_flow()): where each
   * one's links start in @extra, how many, and its member count (0: none). */
  struct {
    int32_t off, links, n;
  } ring[SIM_BLOCK_RINGS];
  int32_t ring_next;    /* the entry the next new ring replaces                          */
} SimTaskBlock;

typedef struct {
  int n_devices;
  GPtrArray *blocks;   /* SimTaskBlock*                                               */
  /* The live blocks in the order assembly lays them out; NULL: slot order.  A lowering
   * that reuses blocks across rebuilds sets it, so that the flat graph does not depend
   * on which slots its blocks happened to get. */
  GArray *order;       /* int                                                          */
  /* Static memory per device (weights, gradients, optimizer states, buffers).       */
  int64_t *static_mem;
  /* The flat form, valid after sim_taskgraph_assemble(): */
  int n_tasks;
  SimTask *task;
  int32_t *succ;       /* successor ids, by task.succ_off                              */
  int n_succ_total;
  int32_t *stream;     /* compute task ids per device in run order                      */
  int32_t *extra;      /* the blocks' extra arrays, one after the other                 */
  int32_t *stream_off; /* n_devices + 1 entries                                       */
  gboolean dirty;      /* blocks changed since the last assembly                        */
  /* Capacities of the flat arrays, which later assemblies reuse (a delta simulation
   * assembles once per run). */
  size_t cap_task, cap_extra, cap_succ, cap_stream;
  /* Predecessor counts in a dense array (the engine's starting point), and the tasks
   * without predecessors in id order. */
  int32_t *n_pred;
  /* Per task: 1 for the join point or delay that releases a group of flows which wait for
   * nothing else and all release one and the same task (the flows of a collective's
   * phase).  The engine may run such a group as a whole (engine.c). */
  uint8_t *group_head;
  int32_t *roots;
  int n_roots;
  size_t cap_roots;
  /* The streams of the last assembly, sorted (SortedEntry arrays per device): a later
   * assembly merges in only the entries of changed blocks. */
  GArray **sorted;
  /* The devices of every collective, by id, when tracked (folding needs them). */
  gboolean track_collectives;
  GPtrArray *coll_devs;  /* GArray of int, or NULL when not tracked                    */
  /* Shared tasks (sim_taskgraph_share_tasks()): every block's tasks in one mapping, in the
   * order they were added, a block's all together while it is the one being filled. */
  gboolean sharing;
  SimTask *shared;
  size_t n_shared;       /* tasks                                                      */
  size_t shared_bytes;   /* mapped                                                     */
  size_t task_mapped;    /* bytes, when @task is that mapping handed over (else 0)     */
  /* The steps of merged runs of compute tasks, when kept (sim_taskgraph_merge_chains()). */
  struct SimChainStep *chain;
  size_t n_chain;
  /* The durations of merged runs' tasks, indexed as @chain (by a head's peer), the last
   * of each run stored negated (its sign bit set, -0.0 for an empty task): the engine
   * adds them one by one to the run's start, so that the run ends at the very instant
   * (to the bit) its tasks would one after the other. */
  double *chain_dur;
  size_t n_chain_dur;
} SimTaskGraph;

/* One task of a merged run, for a run that stops at the first task over memory: where it
 * starts after the run does, and the bytes it takes and gives back (@last on the run's
 * last). */
typedef struct SimChainStep {
  double offset;
  int64_t mem_alloc, mem_free;
  int32_t last;
} SimChainStep;

SimTaskGraph *sim_taskgraph_new(int n_devices);
void sim_taskgraph_free(SimTaskGraph *tg);
/* Returns a new empty block's id (reusing free slots). */
int sim_taskgraph_block_new(SimTaskGraph *tg);
/* Empties a block and frees its slot; references into it become invalid. */
void sim_taskgraph_block_free(SimTaskGraph *tg, int block);
/* Empties a block but keeps its id. */
void sim_taskgraph_block_clear(SimTaskGraph *tg, int block);
static inline SimTaskBlock *sim_taskgraph_block(SimTaskGraph *tg, int block)
{
  return (SimTaskBlock *)tg->blocks->pdata[block];
}
/* Makes room in @block for that many more tasks, edges and stream entries (a block
 * that knows its size grows without reallocating). */
void sim_taskgraph_block_reserve(SimTaskGraph *tg, int block, int n_tasks, int n_edges,
                                 int n_stream);
/* For a graph built once and run once: blocks keep their tasks in one mapping, in the
 * order they are added, and assembly moves them into place there instead of copying them
 * into a fresh array (a million-task graph faulted in and copied hundreds of megabytes).
 * Call before any task is added.  Blocks filled one after the other stay in the mapping;
 * a task added to a block that was filled before, or a block cleared, ends the sharing
 * (every block gets its own array again), which costs time, not correctness. */
void sim_taskgraph_share_tasks(SimTaskGraph *tg);
/* A block's tasks and their number, shared or not. */
static inline guint sim_block_n_tasks(const SimTaskBlock *b)
{
  return b->shared ? (guint)b->sh_len : b->tasks->len;
}
static inline const SimTask *sim_block_tasks(const SimTaskGraph *tg, const SimTaskBlock *b)
{
  if (b->shared)
    return b->sh_start >= 0 ? tg->shared + b->sh_start : tg->shared;
  return (const SimTask *)(const void *)b->tasks->data;
}
/* Appends a task to @block; returns its reference. */
SimTaskRef sim_taskgraph_add(SimTaskGraph *tg, int block, const SimTask *t);
/* Declares that @to cannot start before @from ends; the edge belongs to @block. */
void sim_taskgraph_depend(SimTaskGraph *tg, int block, SimTaskRef from, SimTaskRef to);
/* Places compute task @t of @block on the stream of @device with order @key. */
void sim_taskgraph_stream_add(SimTaskGraph *tg, int block, int device, uint64_t key, int index);
/* Lays out all live blocks in flat arrays: global ids, successor lists, predecessor
 * counts and the per-device stream orders. */
void sim_taskgraph_assemble(SimTaskGraph *tg);
/* After an assembly that is the last: frees what the blocks hold (their tasks, edges and
 * stream entries now live in the flat arrays), so that a one-shot simulation does not
 * keep two copies of its graph while the engine runs.  The graph can no longer be
 * changed or assembled again. */
void sim_taskgraph_release_blocks(SimTaskGraph *tg);
static inline int32_t sim_taskgraph_id(const SimTaskGraph *tg, SimTaskRef r)
{
  return ((SimTaskBlock *)tg->blocks->pdata[r.block])->offset + r.index;
}

/* Records what task @index of @block means (the record's pointers are taken). */
void sim_taskgraph_sem_add(SimTaskGraph *tg, int block, const SimTaskSem *sem);

/* Appends a flow of a whole collective to @block: @bytes per member over the @n_links
 * links of @links (each once), after @latency, for the @n members @members. */
SimTaskRef sim_taskgraph_add_collective_flow(SimTaskGraph *tg, int block, SimTaskClass cls,
                                             const int *links, int n_links, const int *members,
                                             int n, double bytes, double latency, int op, int mb,
                                             int coll);
/* The same for a ring over @members: the links of each member's route to the next, in
 * ring order, read from @m. */
SimTaskRef sim_taskgraph_add_ring_flow(SimTaskGraph *tg, int block, SimTaskClass cls,
                                       SimMachine *m, const int *members, int n, double bytes,
                                       double latency, int op, int mb, int coll);
/* The links and members of a collective's flow, after assembly. */
static inline const int32_t *sim_task_links(const SimTaskGraph *tg, const SimTask *t)
{
  return tg->extra + t->links_off;
}
static inline const int32_t *sim_task_members(const SimTaskGraph *tg, const SimTask *t)
{
  return tg->extra + t->links_off + t->n_links;
}

/* Task constructors. */
SimTask sim_task_compute(SimTaskClass cls, int device, int op, int shard, int mb,
                         double duration);
SimTask sim_task_flow(SimTaskClass cls, int src, int dst, double bytes, int op, int mb);
SimTask sim_task_delay(SimTaskClass cls, int device, double duration);
SimTask sim_task_nop(void);

/* ---------------------------------------------------------------------------------- */
/* Collectives (collective.c): appended to a block as flows, delays and join points.    */

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
 * nothing else, become one task each (taskgraph.c).  The engine's timeline is then the
 * unmerged one's, its merged tasks spanning their runs, provided that the host never
 * delays a kernel (no host times, no blocking sends: see simulate.c).  Renumbers the
 * tasks; returns how many were merged into the task before them.  @keep_steps keeps each
 * run's steps (SimTaskGraph.chain), for an engine that stops at the first task over
 * memory, which then stops when the unmerged run would.  With @m (links at their
 * capacities under @cp), the rings of collectives lowered as a flow per rank first become
 * one flow each where that is exact (see merge_rings() in taskgraph.c); @chains FALSE
 * merges only those. */
int sim_taskgraph_merge_chains(SimTaskGraph *tg, gboolean chains, gboolean keep_steps,
                               SimMachine *m, const SimCollParams *cp);

/* Whether every flow of @tg that crosses several links as a whole (a ring's one flow) keeps
 * to links that no other flow crosses, except whole flows over the same ranks in the same
 * ring order (see whole_node_rings). */
gboolean sim_taskgraph_rings_private(const SimTaskGraph *tg, SimMachine *m);

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
void sim_collective_lower(SimTaskGraph *tg, int block, SimMachine *m, const SimCollective *c,
                          SimTaskRef *start, SimTaskRef *end);

/* The same, without join points where the collective is one flow (SIM_DETAIL_COLLECTIVE,
 * a ring of one channel): *start is then its fixed cost's delay or the flow, *end the
 * flow.  A third fewer tasks for the tensor-parallel reductions of large models. */
void sim_collective_lower_bare(SimTaskGraph *tg, int block, SimMachine *m,
                               const SimCollective *c, SimTaskRef *start, SimTaskRef *end);

/* The analytic duration of a collective without contention: what the FLOWS level yields
 * on an idle machine (used by tests and by search heuristics). */
double sim_collective_time(SimMachine *m, SimCollKind kind, SimAllreduceAlgo algo,
                           const SimCollParams *cp, const int *devices, int n, double bytes);

/* ---------------------------------------------------------------------------------- */
/* The network (network.c): flows on routes sharing links by max-min fairness.          */

typedef struct _SimNet SimNet;

/* Called when a flow's predicted end time changes. */
typedef void (*SimNetRescheduleFunc)(void *user, int flow_task, double end_time);

/* Links carry flows at sim_coll_link_capacity() (@cp NULL: their full bandwidth). */
SimNet *sim_net_new(SimMachine *m, const SimCollParams *cp);
void sim_net_free(SimNet *net);
void sim_net_reset(SimNet *net);
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

/* ---------------------------------------------------------------------------------- */
/* Lowering (lower.c): (graph, strategy, machine) -> task graph, block by block.        */

typedef struct _SimLowering SimLowering;

/* Prepares the lowering of @g under @s on @m.  @simulated (n_devices flags, may be NULL
 * for all) names the devices whose compute tasks are built: the representatives when
 * symmetric devices are folded.  The strategy is read, not copied: it must outlive the
 * lowering, and sim_lowering_update_op() must follow any change to it. */
SimLowering *sim_lowering_new(const SimGraph *g, SimMachine *m, const SimStrategy *s,
                              SimCostModel *cost, const SimOptions *o, const SimCollParams *cp,
                              const uint8_t *simulated);
/* Makes the lowering record what copies, reductions and synchronizations mean (for
 * executors); call before sim_lowering_build(). */
void sim_lowering_record_semantics(SimLowering *lw, gboolean on);
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

/* ---------------------------------------------------------------------------------- */
/* The engine (engine.c)                                                              */

typedef struct {
  double *start;       /* per task, seconds; -1 if it never ran                       */
  double *end;
  int32_t *crit;       /* the task whose end let this one start, or -1                 */
  double makespan;
  int64_t *peak_mem;   /* per device                                                  */
  double *link_bytes;  /* per link                                                    */
  int n_tasks_run;
  gboolean deadlock;   /* some tasks never became ready (a cycle or a bad stream order) */
  gboolean cut;        /* stopped at the bound (sim_engine_set_bound()): the iteration
                        * takes longer than makespan, which is a lower bound        */
  size_t cap;          /* the tasks start, end and crit have room for (engine-owned)   */
} SimTimeline;

typedef struct _SimEngine SimEngine;

/* A stack of ints that grows by doubling: the engine's and the network solver's work
 * lists, pushed to and cleared millions of times a search without a call per element.
 * Zeroed it is empty; clearing is n = 0; g_free(v) frees it. */
typedef struct {
  int *v;
  int n, cap;
} SimIntStack;

/* Memory for a large flat array (a task graph's tasks, the engine's per-task state): at
 * 8 MiB and more it is aligned to 2 MiB and marked for transparent huge pages, so that
 * its first touch costs a fault per 2 MiB instead of per 4 KiB page (a million-task
 * graph touches gigabytes of fresh memory once).  Freed with g_free(); the contents of a
 * block passed to sim_large_renew() are not kept. */
gpointer sim_large_alloc(size_t bytes);
gpointer sim_large_renew(gpointer old, size_t bytes);

static inline void sim_int_stack_push(SimIntStack *a, int x)
{
  if (a->n == a->cap) {
    a->cap = a->cap ? 2 * a->cap : 64;
    a->v = g_renew(int, a->v, a->cap);
  }
  a->v[a->n++] = x;
}

/* A fast hash of a GBytes, for keys of hundreds of bytes and more (g_bytes_hash goes byte
 * by byte). */
guint sim_bytes_hash(gconstpointer bytes);
/* The hash under it, of @len bytes (keyindex.c). */
uint64_t sim_hash_bytes(const void *data, size_t len);

/* Numbers for fixed-size byte keys, 0, 1, 2... in the order they are first seen, each
 * with an int32 value for the caller (keyindex.c).  Clearing keeps the memory. */
typedef struct {
  size_t key_size;
  uint8_t *keys;      /* n keys, one after the other                                  */
  guint *pos;         /* per key: its slot in the table                               */
  int32_t *value;     /* per key: the caller's, 0 when added                          */
  int32_t *table;     /* key number + 1, or 0 for a free slot                          */
  guint n, cap, mask;
} SimKeyIndex;

void sim_key_index_init(SimKeyIndex *ki, size_t key_size);
void sim_key_index_clear(SimKeyIndex *ki);
void sim_key_index_free(SimKeyIndex *ki);
/* The number of @key (key_size bytes), added if new (@added says which). */
guint sim_key_index_get(SimKeyIndex *ki, const void *key, gboolean *added);
/* Looks the @len bytes at @data up in @table (keyed by GBytes) without copying them: TRUE
 * if found, with its value in @value (unless NULL). */
gboolean sim_bytes_lookup(GHashTable *table, const void *data, size_t len, gpointer *value);

/* Transfers run at the links' capacity under @cp (NULL: their full bandwidth). */
SimEngine *sim_engine_new(SimMachine *m, const SimCollParams *cp);
/* The host's time to issue one kernel (SimOptions.host_kernel_time); 0 by default. */
void sim_engine_set_host_kernel_time(SimEngine *e, double seconds);
/* The host's time between two steps of a device's schedule (SimOptions.host_step_time):
 * a step is one micro-batch's forward, or its backward with the recomputation it needs,
 * or the optimizer update. */
void sim_engine_set_host_step_time(SimEngine *e, double seconds);
/* SimOptions.blocking_sends. */
void sim_engine_set_blocking_sends(SimEngine *e, gboolean on);
/* The engine's network remembers the rates it works out across runs, in at most @bytes
 * (sim_net_set_memory): what a delta session's engine does. */
void sim_engine_remember_rates(SimEngine *e, size_t bytes);
/* Both host times from @o (the simulations' way to set them). */
void sim_engine_set_host_times(SimEngine *e, const SimOptions *o);
void sim_engine_free(SimEngine *e);
/* Runs the assembled task graph from time 0 and fills @tl (whose arrays it allocates,
 * sized for the graph, or reuses from the timeline's last run when they are large
 * enough).  Deterministic: equal-time events run in the order they were
 * scheduled. */
void sim_engine_run(SimEngine *e, const SimTaskGraph *tg, SimTimeline *tl);
/* Runs stop once the iteration is known to end past @seconds (INFINITY, the default:
 * never): the next event lies beyond it, or a device's stream still has more compute to
 * run than time is left.  The timeline is then cut, its makespan a lower bound of the
 * iteration's, above @seconds.
 * A search that only needs to know whether a candidate beats a threshold saves the rest
 * of the run; up to the bound, the run is the unbounded one. */
void sim_engine_set_bound(SimEngine *e, double seconds);
/* Whether a run stops, cut, at the first task that takes a device past its memory
 * capacity (or at the start, when its static memory already does). */
void sim_engine_set_stop_at_overflow(SimEngine *e, gboolean on);
void sim_timeline_clear(SimTimeline *tl);

G_END_DECLS

/* The task graph and timeline of a session's last run (delta.c), for tests. */
const SimTaskGraph *sim_session_taskgraph(SimSession *ss);
const SimTimeline *sim_session_timeline(SimSession *ss);

/* ---------------------------------------------------------------------------------- */
/* Reports (report.c)                                                                   */

G_BEGIN_DECLS

typedef struct {
  char *name;
  double bytes;
  double utilization;
} SimLinkUse;

struct _SimReport {
  char *model;
  char *machine_name;
  SimMachine *machine;        /* for traces: valid while the machine lives            */
  int n_devices;
  int n_ops;
  char **op_names;            /* n_ops, for traces                                     */
  double iteration_time;
  int64_t batch;
  int64_t tokens_per_sample;
  double model_flops;         /* per iteration                                          */
  double peak_flops;          /* summed over the devices the plan uses, at the graph's
                              * compute dtype                                           */
  int n_used;                 /* devices that compute or hold memory in the plan         */
  gboolean fits;
  int64_t *peak_mem;
  int64_t *capacity;
  double *compute, *comm, *overlap, *idle;
  int64_t n_tasks;
  double crit[SIM_CLASS_COUNT + 1]; /* the last entry: waiting                          */
  SimLinkUse *links;          /* the busiest, most used first                          */
  int n_links;
  char *folding;
  SimDetail detail;
  int microbatches, n_stages;  /* n_stages counts model chunks (stages x chunks)      */
  int chunks;                  /* model chunks per device group (interleaved), else 1  */
  SimSchedule schedule;
  /* The timeline, when kept: */
  int64_t n_records;
  SimTask *tasks;
  int32_t *extra;             /* links and members of collectives' flows                */
  double *start, *end;
};

/* Builds a report from a finished run.  @rep_of maps every device to the simulated device
 * whose timeline stands for it (NULL: itself). */
SimReport *sim_report_build(const SimGraph *g, SimMachine *m, const SimStrategy *s,
                            const SimTaskGraph *tg, const SimTimeline *tl, const int *rep_of,
                            const char *folding, const SimOptions *o, double model_flops);

G_END_DECLS
