/* taskgraph.h — the lowered form of (graph, strategy, machine): tasks, dependencies and
 * stream orders.  Internal to libsim.
 *
 * The task graph is built in blocks: the tasks of one operator (every shard, pass and
 * micro-batch), the transfers of one tensor between its producer and a consumer, the
 * gradient synchronization of one bucket.  A dependency names its ends as (block, index)
 * so that a block can be rebuilt alone when a strategy changes a few operators (delta
 * simulation); sim_taskgraph_assemble() then lays all blocks out in flat arrays, which is
 * what the engine reads.  The modules around it have their own headers: collective.h,
 * network.h, lower.h, engine.h, report.h, and util.h for what they share. */
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

/* One of a block's distinct rings (sim_taskgraph_add_ring_flow()): where its links start
 * in the block's extra array, how many, its member count and first member, and what its
 * user may note (collective.c: a whole node's ring, checked, and its latency). */
typedef struct {
  int32_t off, links, n, first;
  gboolean checked;
  double latency;
} SimBlockRing;

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
  /* The block's distinct rings (NULL until its first): a tensor's reductions repeat over
   * every replica's tensor-parallel group, micro-batch after micro-batch, so that a ring
   * is mostly one the block has made before (128 replicas' groups take turns).  They
   * are found by their members through @ring_table, open addressing over ring numbers
   * plus one (0: empty), its size @ring_mask + 1, a power of two, kept at most half
   * full. */
  SimBlockRing *ring;
  int32_t n_ring, cap_ring;
  int32_t *ring_table;
  uint32_t ring_mask;
} SimTaskBlock;

typedef struct {
  int n_devices;
  GPtrArray *blocks;   /* SimTaskBlock*                                               */
  int n_dead;          /* blocks freed and not yet made again                           */
  /* The live blocks in the order assembly lays them out; NULL: slot order.  A lowering
   * that reuses blocks across rebuilds sets it, so that the flat graph does not depend
   * on which slots its blocks happened to get. */
  GArray *order;       /* int                                                          */
  /* Static memory per device (weights, gradients, optimizer states, buffers).       */
  int64_t *static_mem;
  /* Host memory per device: the states of its offloaded optimizer (SimMemoryOptions). */
  int64_t *host_mem;
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
  /* Per device: the last set of coll_devs that began with it, which a collective over the
   * same devices shares (the sets repeat micro-batch after micro-batch). */
  GArray **coll_last;
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
  /* Per step (indexed as @chain_dur): the ring a merged run took in there (an index into
   * @rings, whose links and members stay in @extra), or -1 for a task's step. */
  int32_t *chain_ring;
  SimTask *rings;
  size_t n_rings;
  /* Task ids a caller follows through the merging, which renumbers them (-1: merged
   * away): the shadows of a folding that the run must verify, and their originals
   * (simulate.c). */
  int32_t *watch;
  size_t n_watch;
  /* The links of the rings lowered as steps of a stream (lower-tensors.c, ring_step()), or
   * NULL: no flow of the graph stands for them, and folding counts them as a simulated
   * flow's (fold.c, shadows_to_keep()). */
  GArray *step_links;    /* int                                                        */
  /* A flag the assembly and the merging (taskgraph-merge.c) poll, or NULL: a search past
   * its deadline raises it (SimOptions.cancel), and they then stop where they are, leaving
   * the graph only to be freed. */
  const atomic_int *cancel;
} SimTaskGraph;

/* Whether SimTaskGraph.cancel is raised. */
static inline gboolean sim_taskgraph_cancelled(const SimTaskGraph *tg)
{
  return tg->cancel && atomic_load(tg->cancel);
}

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
/* Ends the sharing: every block takes its tasks into its own array (the assembly does
 * when blocks were freed; taskgraph-assemble.c). */
void sim_taskgraph_unshare_tasks(SimTaskGraph *tg);
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
 * counts and the per-device stream orders.  FALSE where SimTaskGraph.cancel was raised:
 * the assembly stopped between two of its passes, and the graph is only to be freed. */
gboolean sim_taskgraph_assemble(SimTaskGraph *tg);
/* After an assembly that is the last: frees what the blocks hold (their tasks, edges and
 * stream entries now live in the flat arrays), so that a one-shot simulation does not
 * keep two copies of its graph while the engine runs.  The graph can no longer be
 * changed or assembled again. */
void sim_taskgraph_release_blocks(SimTaskGraph *tg);
static inline int32_t sim_taskgraph_id(const SimTaskGraph *tg, SimTaskRef r)
{
  return ((SimTaskBlock *)tg->blocks->pdata[r.block])->offset + r.index;
}

/* After assembly: the links of flow @f (a whole collective's, or its route's), @k of them. */
const int32_t *sim_taskgraph_flow_links(const SimTaskGraph *tg, const SimMachine *m,
                                        const SimTask *f, int *k);

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
                                       const SimMachine *m, const int *members, int n, double bytes,
                                       double latency, int op, int mb, int coll);
/* The entry of @block's ring over @members (in that order) in SimTaskBlock.ring, or -1
 * (then sim_taskgraph_add_ring_flow() works out its links). */
int sim_taskgraph_ring_find(SimTaskGraph *tg, int block, const int *members, int n);
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

G_END_DECLS
