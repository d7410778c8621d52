/* lower-private.h — what the lowering's files share: lower.c (operator layouts, task
 * references, the pipeline schedule, the lowering itself), lower-tensors.c (a tensor's
 * reductions and transfers, expert parallelism's all-to-all) and lower-sync.c (the gradient
 * synchronization: buckets, ZeRO, their collectives).  lower.c's header comment describes
 * the whole. */
#pragma once

#include "lower.h"
#include "taskgraph.h"
#include "collective.h"
#include "base.h"

typedef struct {
  gboolean is_input;       /* data sources have no tasks                             */
  int n_shards, n_in, n_out;
  const int *dev;          /* the strategy's device of every shard                   */
  int *cidx;               /* index among the simulated shards, or -1                 */
  int n_sim;
  SimRegion *in_reg;       /* [shard * n_in + i], in micro-batch coordinates           */
  SimRegion *out_reg;      /* [shard * n_out + j]                                     */
  gboolean *out_partial;   /* per output: shards hold partial sums                     */
  gboolean *in_partial;    /* per input: gradients computed by shards are partial      */
  double *t_f, *t_b, *t_r, *t_u;
  int64_t *a_f, *a_r;      /* bytes kept by forward, by recompute, per shard            */
  int64_t *w_elems;        /* weight elements per shard                                */
  gboolean recompute;
  gboolean has_weights;
  uint16_t k_f, k_b, k_r;      /* kernels per pass, for the host's issue time         */
  /* Under tensor-parallel communication overlap (SimStrategy.tp_comm_overlap), per
   * shard: the times of the forward's first and last GEMM and of the backward's first and
   * last ([4 * shard + TP_GEMM_*]), shares of t_f and t_b; NULL otherwise. */
  double *t_gemm;
  /* The shard's device's streaming multiprocessors (0: not known). */
  int sms;
  /* Context parallelism's ring (lower.c, ring_attention()): its steps n (0: the op is no
   * ring), whether the recomputation runs one too, per shard the shard that sends it
   * blocks and the time of the attention kernels forward and backward, and the bytes of
   * one shard's keys and values. */
  int ring;
  gboolean ring_r;
  int *ring_prev;
  double *core_f, *core_b;
  double ring_bytes;
  int op;                  /* the operator laid out                                   */
  int stage;
  int block;
  uint32_t pos_b, pos_r;   /* places in the backward order                             */
} OpLay;

struct _SimLowering {
  const SimGraph *g;
  const SimMachine *m;
  const SimStrategy *s;
  SimCostModel *cost;
  SimOptions o;
  SimCollParams cp;
  uint8_t *simulated;
  int n_ops, n_dev;
  /* M: the micro-batches lowered; M_size: the strategy's, which set each one's size.  They
   * differ only where the steady state of a schedule is extrapolated (sim/steady.c). */
  int M, M_size;
  OpLay *ops;
  int *tensor_block;
  int sync_block;
  /* The collectives of the gradient synchronization, a block each, in the order of the
   * last build, and a key describing each (a rebuild reuses the blocks of collectives it
   * finds unchanged). */
  GArray *coll_blocks;        /* int                                                    */
  struct OpSync *op_sync;     /* per op: its synchronization items, kept between builds */
  GHashTable *coll_keys;      /* GBytes key -> block + 1                                */
  GArray **sharers;           /* per op: the ops that use its weights, or NULL          */
  uint64_t *rank_f, *rank_b;  /* [stage * M + mb]: place of the unit on its device      */
  uint64_t rank_update;
  int *seg;
  int last_checkpoint;
  SimTaskGraph *tg;
  gboolean record;            /* record what tasks mean, for executors                  */
  gboolean fold_violated;
  double model_flops;
  SimKeyIndex regions;        /* scratch: lower_group_holders() numbers distinct regions       */
  SimKeyIndex transfers;      /* scratch: a tensor's transfers already made (deliver())  */
  /* Scratch: the factor on the bytes of the flows and reductions being built, below 1
   * where expert parallelism moves only the routed tokens (routed_fraction()). */
  double byte_scale;
  /* Scratch: where above 0, the partial sums being reduced are an expert group's outputs
   * (or its input's gradients) that reach the shards' tokens by an all-to-all carrying
   * this routed fraction of them (routed_fraction(), expert_all_to_all()). */
  double expert_a2a;
  gboolean drop_implied;      /* sim_lowering_drop_implied_edges()                       */
  /* Ring steps (sim_lowering_ring_steps(), lower-tensors.c): on; the steps made, and
   * the distinct rings met (keyed by their members), with their links in
   * SimTaskGraph.step_links and the time a ring alone took last. */
  gboolean ring_steps, wait_steps;
  GArray *steps;              /* RingStep (a wait's: ring -1)                            */
  SimKeyIndex step_rings;
  GArray *step_ring;          /* StepRing, by key number                                 */
  struct _SimNet *step_net;
};

/* A ring lowered as a step of its device's stream: the step and its ring (StepRing); or a
 * wait of tensor-parallel overlap lowered so (ring -1: add_wait() in lower-tensors.c). */
typedef struct {
  SimTaskRef task;
  int32_t ring, device;
  double bytes, latency;      /* the ring's flow's (sim_collective_node_ring_flow())     */
} RingStep;

enum { STEP_RING_MAX = 16 };

typedef struct {
  gboolean ok;                /* the ring lowers as a whole node's one flow              */
  int32_t links_off, n_links; /* in SimTaskGraph.step_links                              */
  int32_t devs[STEP_RING_MAX], n_devs; /* its members in ring order                     */
  double ring_latency;        /* sim_collective_node_ring()'s                            */
  double bytes, latency, time; /* the last flow's, and how long it took alone            */
} StepRing;

/* A set of shards that hold the same region of a tensor. */

typedef struct {
  SimRegion region;
  int *members;    /* shard indices */
  int n;
  int *devs;       /* their distinct devices, in shard order */
  int n_devs;
  gboolean any_sim;
} Holders;

/* What lower_group_holders() compares: a region and a tag. */

typedef struct {
  SimRegion r;
  int tag;
} RegionKey;

/* The key of a transfer: source, destination and region.  Consumers on one device that
 * need the same data from another share one transfer (the activation crosses a stage
 * boundary once); in the backward pass the gradients they produce on one device add up
 * there and cross once. */

typedef struct {
  int src, dst, ndim;
  int64_t lo[SIM_MAX_DIMS], hi[SIM_MAX_DIMS];
} TransferKey;

/* A transfer made for one micro-batch and pass of a tensor: which of them (see
 * lower_build_tensor_block()) and the transfer. */

typedef struct {
  int which;
  int scaled;      /* built under a byte scale: not shared with unscaled transfers */
  TransferKey tk;
} SentKey;

/* What one op adds to the synchronization (its items, its exchanges with the owner of
 * weights it shares, its weights' memory per device); it depends on the op's layout, its
 * owner's and its users', so a delta rebuild recomputes it for those only. */
struct OpSync {
  gboolean valid;
  GArray *items;       /* SyncItem */
  GArray *ties;        /* SyncItem */
  GArray *mem;         /* MemAdd   */
  GArray *offload;     /* OffloadItem: the shards' updates on the host */
};

enum { P_F, P_B, P_R };

enum { TP_GEMM_FIRST_F, TP_GEMM_LAST_F, TP_GEMM_FIRST_B, TP_GEMM_LAST_B };

/* Whether the lowering overlaps sequence parallelism's collectives with their GEMMs. */
static inline gboolean lower_tp_overlap(const SimLowering *lw)
{
  return lw->s->tp_comm_overlap && lw->s->sequence_parallel && !lw->record;
}

static inline SimTaskRef ref_compute(const SimLowering *lw, const OpLay *l, int pass, int mb,
                                     int sh)
{
  int base = pass == P_F ? 0 : pass == P_B ? 1 : 2;
  return (SimTaskRef){ l->block, (base * lw->M + mb) * l->n_sim + l->cidx[sh] };
}

static inline SimTaskRef ref_update(const SimLowering *lw, const OpLay *l, int sh)
{
  int base = l->recompute ? 3 : 2;
  return (SimTaskRef){ l->block, base * lw->M * l->n_sim + l->cidx[sh] };
}

/* Under context parallelism's ring, the first task of the op's block after its compute
 * and update tasks that belongs to the ring of (@pass, @mb): per (pass, micro-batch), the
 * ring's n attention steps, n join points and n - 1 flows, each for every simulated shard
 * (lower.c, build_ring()). */
static inline int ring_index(const SimLowering *lw, const OpLay *l, int pass, int mb, int off,
                             int sh)
{
  int passes = l->recompute ? 3 : 2;
  int base = (passes * lw->M + (l->has_weights ? 1 : 0)) * l->n_sim;
  int q = pass == P_F ? 0 : pass == P_B ? 1 : 2;
  return base + ((q * lw->M + mb) * (3 * l->ring - 1) + off) * l->n_sim + l->cidx[sh];
}

static inline gboolean ring_pass(const OpLay *l, int pass)
{
  return l->ring > 1 && (pass != P_R || l->ring_r);
}

/* The task whose end is the end of compute task (@l, @pass, @mb, @sh): the task itself,
 * or the last step of its ring. */
static inline SimTaskRef ref_done(const SimLowering *lw, const OpLay *l, int pass, int mb,
                                  int sh)
{
  if (!ring_pass(l, pass))
    return ref_compute(lw, l, pass, mb, sh);
  return (SimTaskRef){ l->block, ring_index(lw, l, pass, mb, l->ring - 1, sh) };
}

/* The key of compute task (@l, @pass, @mb) on its device's stream, which runs its tasks
 * in key order (build_op_block()). */
static inline uint64_t stream_key(const SimLowering *lw, const OpLay *l, int pass, int mb)
{
  size_t u = (size_t)l->stage * lw->M + mb;
  /* Even: the odd key after a task's is a ring step's that follows it (ring_step()). */
  if (pass == P_F)
    return lw->rank_f[u] << 32 | 2 * (uint32_t)(l - lw->ops);
  return lw->rank_b[u] << 32 | 2 * (pass == P_B ? l->pos_b : l->pos_r);
}

/* Declares that compute task (@a, @pa, @mba, shard @sa) comes before (@b, @pb, @mbb, shard
 * @sb), unless the lowering drops implied edges and one device's stream runs @b after @a
 * (a higher key: sim_taskgraph_merge_chains() would remove the edge; where keys are equal
 * it decides). */
static inline void depend_compute(SimLowering *lw, int block, const OpLay *a, int pa, int mba,
                                  int sa, const OpLay *b, int pb, int mbb, int sb)
{
  if (lw->drop_implied && a->dev[sa] == b->dev[sb] &&
      stream_key(lw, b, pb, mbb) > stream_key(lw, a, pa, mba))
    return;
  sim_taskgraph_depend(lw->tg, block, ref_done(lw, a, pa, mba, sa),
                       ref_compute(lw, b, pb, mbb, sb));
}

/* lower.c */
int64_t lower_region_bytes(const SimRegion *r, SimDType dt);

/* lower-tensors.c */
GArray *lower_group_holders(SimKeyIndex *seen, const OpLay *l, const SimRegion *regs, int stride,
                            int offset, const int *tags);
void lower_holders_free(GArray *groups);
void lower_zero1_update_share(SimLowering *lw, OpLay *l, const SimRegion *wr, int reps);
void lower_build_tensor_block(SimLowering *lw, int t);

/* lower-sync.c */
void lower_op_sync_invalidate(SimLowering *lw, int x);
gboolean lower_lowering_cancelled(const SimLowering *lw, int i);
void lower_build_sync_block(SimLowering *lw);
