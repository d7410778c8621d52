/* sim-private.h — struct bodies and internal helpers shared by the files of libsim.
 * Nothing outside sim/ includes this header: other components use parasol-sim.h. */
#pragma once

#include "parasol-sim.h"

G_BEGIN_DECLS

/* ---------------------------------------------------------------------------------- */
/* Operator attributes                                                                 */

#define SIM_MAX_ATTRS 16
#define SIM_MAX_ITER 8      /* dimensions of an operator's iteration space            */
#define SIM_MAX_WEIGHTS 8

typedef enum {
  SIM_ATTR_INT,
  SIM_ATTR_BOOL,
  SIM_ATTR_FLOAT,
  SIM_ATTR_INTS,    /* up to SIM_MAX_DIMS integers (kernel sizes, shapes, permutations) */
  SIM_ATTR_ENUM,    /* one of the names in SimAttrSpec.enum_names, stored as its index  */
} SimAttrType;

typedef struct {
  const char *name;
  SimAttrType type;
  double default_value;              /* INT, BOOL, FLOAT, ENUM (index)                  */
  const char *const *enum_names;     /* ENUM: NULL-terminated                            */
  gboolean required;                 /* no default: the builder must set it              */
} SimAttrSpec;

typedef struct {
  gboolean set;
  int n;                             /* INTS: number of values                           */
  int64_t i[SIM_MAX_DIMS];           /* INT, BOOL, ENUM in i[0]; INTS in i[0..n)          */
  double f;                          /* FLOAT                                            */
} SimAttrValue;

struct _SimAttrs {
  SimOpType type;
  SimAttrValue v[SIM_MAX_ATTRS];     /* indexed like the class's attribute specs          */
};

/* ---------------------------------------------------------------------------------- */
/* The iteration space of an operator and the way its tensors are indexed             */

/* Convention: iteration dimension 0 of every operator is its sample dimension, the
 * batch, and the lowering divides it by the number of micro-batches. */
typedef struct {
  char name[12];                     /* "b", "s", "cout", "heads", "k", ...              */
  SimDimRole role;
  int64_t size;
  gboolean splittable;
} SimIterDim;

/* How one dimension of a tensor is indexed by the iteration space: for a shard whose
 * iteration dimensions cover [lo, hi), the tensor index along this dimension is
 *   dim * stride + kdim * dilation - shift,
 * so the tensor range is the image of the box, clipped to [0, size).  dim == -1 means
 * the whole tensor dimension is touched by every shard.  kdim == -1 means no kernel
 * term.  Identity: dim = d, stride 1, kdim -1, shift 0.  A convolution's input rows:
 * dim = ho, stride = sh, kdim = kh, dilation = dh, shift = ph.  A concat input i:
 * dim = axis, shift = offset of input i. */
typedef struct {
  int8_t dim;
  int8_t kdim;
  int32_t stride;
  int32_t dilation;
  int64_t shift;
} SimDimMap;

typedef struct {
  int ndim;                          /* the tensor's rank                                */
  SimDimMap map[SIM_MAX_DIMS];
} SimTensorMap;

typedef struct {
  int ndims;
  SimIterDim dims[SIM_MAX_ITER];
  /* Maps of the inputs, weights and outputs, n_inputs + n_weights + n_outputs of them, in
   * that order; see sim_space_input_map() and friends. */
  SimTensorMap *maps;
} SimIterSpace;

/* ---------------------------------------------------------------------------------- */
/* Graph                                                                               */

typedef struct _SimOp SimOp;

struct _SimOp {
  int id;
  SimOpType type;
  char *name;
  SimAttrValue attrs[SIM_MAX_ATTRS];
  int n_inputs;
  int *inputs;                       /* tensor ids                                       */
  SimShape *in_shape;                /* copies of the input shapes, for the catalogue     */
  SimDType *in_dtype;
  int n_outputs;
  int *outputs;                      /* tensor ids                                       */
  SimShape *out_shape;               /* set by the class's infer()                        */
  SimDType *out_dtype;
  int n_weights;
  SimShape w_shape[SIM_MAX_WEIGHTS]; /* set by infer()                                    */
  SimDType w_dtype;
  SimIterSpace space;                /* set by the class's space() after infer()          */
  gboolean selective_recompute;
  gboolean checkpoint;
  int weight_owner;                  /* the op whose weights this one uses; itself if none */
  gboolean data_input;               /* input 0 is the model's data (an input op's output):
                                      * frameworks compute no gradient for it             */
};

typedef struct {
  int id;
  char *name;
  SimShape shape;
  SimDType dtype;
  int producer;                      /* op id                                            */
  int producer_slot;                 /* output index in the producer                      */
  GArray *consumers;                 /* op ids (int), in insertion order                  */
} SimTensor;

struct _SimGraph {
  char *name;
  GPtrArray *ops;                    /* SimOp*                                           */
  GPtrArray *tensors;                /* SimTensor*                                       */
  GHashTable *op_names;              /* name -> op id + 1                                */
  GError *sticky_error;
  int64_t tokens_per_sample;
  int name_counter[SIM_OP_COUNT];
};

/* Orders ints for qsort(), without the overflow of a subtraction. */
static inline int sim_int_cmp(const void *a, const void *b)
{
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

static inline SimOp *sim_graph_op_get(const SimGraph *g, int op)
{
  return (SimOp *)g->ops->pdata[op];
}

static inline SimTensor *sim_graph_tensor_get(const SimGraph *g, int t)
{
  return (SimTensor *)g->tensors->pdata[t];
}

static inline const SimTensorMap *sim_space_input_map(const SimOp *op, int i)
{
  return &op->space.maps[i];
}
static inline const SimTensorMap *sim_space_weight_map(const SimOp *op, int i)
{
  return &op->space.maps[op->n_inputs + i];
}
static inline const SimTensorMap *sim_space_output_map(const SimOp *op, int i)
{
  return &op->space.maps[op->n_inputs + op->n_weights + i];
}

/* Allocates op->space.maps for the op's tensors and sets every map to "whole tensor"
 * (dim -1) with the tensor's rank; space() implementations then fill in the maps. */
void sim_space_init(SimOp *op, int ndims);
/* Sets iteration dimension @d. */
void sim_space_dim(SimOp *op, int d, const char *name, SimDimRole role, int64_t size,
                   gboolean splittable);
/* Sets identity indexing: tensor dimension @tdim of @map is iteration dimension @d. */
void sim_map_identity(SimTensorMap *map, int tdim, int d);
/* Sets the full affine form (see SimDimMap). */
void sim_map_affine(SimTensorMap *map, int tdim, int d, int stride, int kdim, int dilation,
                    int64_t shift);

/* Whether iteration dimension @d indexes the tensor of @map (as a position or a kernel
 * offset), and whether a shard of @o split @degree ways leaves that tensor partial sums:
 * the rule behind sim_graph_op_tensor_partial() (shard.c). */
gboolean sim_map_indexed_by(const SimTensorMap *map, int d);
gboolean sim_map_partial(const SimOp *o, const int *degree, const SimTensorMap *map);
/* sim_graph_op_fused_nonlinear() on the op itself (shard.c). */
gboolean sim_op_fused_nonlinear(const SimOp *o);

/* The region of a tensor with @shape, indexed by @map, touched by the shard whose
 * iteration dimensions cover [lo[d], hi[d]). */
void sim_map_project(const SimTensorMap *map, const SimShape *shape, const int64_t *lo,
                     const int64_t *hi, SimRegion *out);

/* Sets op->n_outputs and allocates outputs, out_shape, out_dtype (op-support.c). */
void sim_op_set_n_outputs(SimOp *op, int n);

/* ---------------------------------------------------------------------------------- */
/* The operator catalogue: one entry per operator type                                */

typedef struct {
  SimOpType type;
  const char *name;
  const char *description;
  const SimAttrSpec *attrs;          /* n_attrs entries                                  */
  int n_attrs;
  int min_inputs, max_inputs;        /* max_inputs -1: any number                        */

  /* Required.  Checks the attributes and input shapes (op->in_shape, op->in_dtype) and
   * sets the outputs (sim_op_set_n_outputs, out_shape, out_dtype) and the weights
   * (n_weights, w_shape, w_dtype).  Errors name the operator and say what was expected. */
  gboolean (*infer)(SimOp *op, GError **error);

  /* Required.  Declares the iteration space and the maps of every tensor. */
  void (*space)(SimOp *op);

  /* Required.  The kernels one shard runs in @pass, for iteration extents @extent
   * (SIM_PASS_UPDATE is handled by the catalogue from the weights; classes see only
   * FORWARD and BACKWARD).  Backward includes the data and the weight gradients. */
  void (*work)(const SimOp *op, const int64_t *extent, SimPass pass, SimWork *work);

  /* Required.  Bytes of activations one shard keeps from its forward pass for its
   * backward pass (inputs, outputs, masks, statistics). */
  int64_t (*saved_bytes)(const SimOp *op, const int64_t *extent);

  /* Optional.  Under selective recomputation: the work recomputed before the backward
   * pass and the bytes then kept from the forward pass.  NULL: an op marked for selective
   * recomputation is recomputed whole and keeps only its inputs. */
  void (*selective)(const SimOp *op, const int64_t *extent, SimWork *recompute,
                    int64_t *kept_bytes);
} SimOpClass;

const SimOpClass *sim_op_class(SimOpType type);
/* The index of attribute @name in @c's specification, or -1 (sim/attrs.c). */
int sim_op_class_attr_index(const SimOpClass *c, const char *name);

/* Helpers for classes. */
int64_t sim_op_attr_int(const SimOp *op, const char *name);
double sim_op_attr_float(const SimOp *op, const char *name);
const SimAttrValue *sim_op_attr(const SimOp *op, const char *name);
/* The product of @extent over the dimensions of the iteration space. */
int64_t sim_extent_volume(const SimOp *op, const int64_t *extent);
/* The length of tensor dimension @m spans for a shard of extents @extent, at most the
 * dimension's @size. */
static inline int64_t sim_map_dim_len(const SimDimMap *m, int64_t size,
                                      const int64_t *extent)
{
  if (m->dim < 0)
    return size;
  if (extent[m->dim] <= 0 || (m->kdim >= 0 && extent[m->kdim] <= 0))
    return 0;
  int64_t len = (extent[m->dim] - 1) * m->stride + 1;
  if (m->kdim >= 0)
    len += (extent[m->kdim] - 1) * m->dilation;
  return MIN(len, size);
}
/* The number of elements of @map's tensor touched by a shard of extents @extent: the
 * product over mapped dimensions of the extent (identity maps) or of the projected range,
 * and of the full size for unmapped dimensions. */
int64_t sim_map_numel(const SimTensorMap *map, const SimShape *shape, const int64_t *extent);
void sim_work_add(SimWork *w, SimKernel k);
SimKernel sim_kernel_gemm(SimDType dt, int64_t batch, int64_t m, int64_t n, int64_t k);
SimKernel sim_kernel_memory(SimDType dt, double flops, double bytes);
/* The table rows a sparse embedding's update touches in a shard of extent @e (at most
 * one per lookup; *@width gets the shard's columns), or -1 for any other op
 * (sim/ops/embedding.c). */
int64_t sim_embedding_sparse_rows(const SimOp *op, const int64_t *e, int64_t *width);
/* The token rows the experts of a mixture-of-experts shard of extent @e process (NULL:
 * the whole op), with its capacity or its imbalance (sim/ops/moe.c). */
int64_t sim_moe_shard_rows(const SimOp *op, const int64_t *extent);
/* @extent, or the sizes of the op's iteration dimensions written into @full (which holds
 * SIM_MAX_ITER entries) when @extent is NULL: classes accept NULL for "the whole op". */
const int64_t *sim_op_extent(const SimOp *op, const int64_t *extent, int64_t *full);
/* Sets @error to "op 'NAME' (TYPE): MESSAGE", the form every infer() error takes
 * (ops/catalogue.c, which names the types). */
void sim_op_set_error(const SimOp *op, GError **error, int code, const char *fmt, ...)
  G_GNUC_PRINTF(4, 5);
gboolean sim_dtype_is_float(SimDType t);
/* FLOPs per element of an element-wise function, forward or backward. */
double sim_unary_flops(SimUnaryKind k, gboolean backward);
/* NULL-terminated names of the SimUnaryKind and SimDType values, in enum order, for the
 * enumerated attributes that take them. */
extern const char *const sim_unary_kind_names[];
extern const char *const sim_dtype_names[];
/* Names of iteration dimensions: "b", "d1", "d2", ... for dimension @d of an element-wise
 * space, and "s" (@n == 1) or "s1", "s2", ... for the @i-th of @n middle dimensions. */
const char *sim_dim_generic_name(int d);
const char *sim_dim_seq_name(int i, int n);
/* Checks that input @i of @op is floating point, else sets an infer() error. */
gboolean sim_op_check_float(const SimOp *op, int i, GError **error);
/* Checks that input @i of @op has a rank in [@min, @max], else sets an infer() error. */
gboolean sim_op_check_rank(const SimOp *op, int i, int min, int max, GError **error);

/* Per-family catalogue entries (sim/ops/). */
extern const SimOpClass sim_op_input_class;
extern const SimOpClass sim_op_linear_class;
extern const SimOpClass sim_op_matmul_class;
extern const SimOpClass sim_op_conv2d_class;
extern const SimOpClass sim_op_pool2d_class;
extern const SimOpClass sim_op_batchnorm_class;
extern const SimOpClass sim_op_layernorm_class;
extern const SimOpClass sim_op_embedding_class;
extern const SimOpClass sim_op_unary_class;
extern const SimOpClass sim_op_binary_class;
extern const SimOpClass sim_op_softmax_class;
extern const SimOpClass sim_op_dropout_class;
extern const SimOpClass sim_op_concat_class;
extern const SimOpClass sim_op_split_class;
extern const SimOpClass sim_op_reshape_class;
extern const SimOpClass sim_op_transpose_class;
extern const SimOpClass sim_op_attention_class;
extern const SimOpClass sim_op_lstm_class;
extern const SimOpClass sim_op_cross_entropy_class;
extern const SimOpClass sim_op_mse_loss_class;
extern const SimOpClass sim_op_rmsnorm_class;
extern const SimOpClass sim_op_gated_mlp_class;
extern const SimOpClass sim_op_moe_class;

/* ---------------------------------------------------------------------------------- */
/* Machines                                                                            */

typedef enum {
  SIM_VERTEX_GPU,
  SIM_VERTEX_NVSWITCH,
  SIM_VERTEX_PCIE_SWITCH,
  SIM_VERTEX_HOST,        /* a CPU socket's host bridge / root complex                */
  SIM_VERTEX_NIC,
  SIM_VERTEX_NET_SWITCH,  /* InfiniBand or Ethernet switch                            */
} SimVertexKind;

typedef struct {
  SimVertexKind kind;
  int node;               /* -1 for network switches                                  */
  int device;             /* GPU vertices: the device index; -1 otherwise              */
  char *name;
  GArray *out_links;      /* link ids leaving this vertex                              */
} SimVertex;

typedef struct {
  SimLinkKind kind;
  int src, dst;           /* vertex ids; links are directed                           */
  double bandwidth;       /* bytes/s                                                  */
  double latency;         /* seconds                                                  */
  char *name;
} SimLink;

typedef struct {
  int vertex;             /* its GPU vertex                                           */
  int node;
  int local_rank;
  const SimDeviceSpec *spec;
} SimDevice;

typedef struct {
  int n_links;
  int *links;
  double bandwidth;       /* bottleneck                                                */
  double latency;         /* sum over hops                                            */
  int src, dst;           /* its devices (machine.c's cache of larger machines checks them) */
} SimRoute;

struct _SimMachine {
  char *name;
  char *description;
  int n_nodes;
  int n_devices;
  SimDevice *devices;
  GArray *vertices;       /* SimVertex                                                */
  GArray *links;          /* SimLink                                                  */
  GHashTable *routes;     /* (src * n_devices + dst) -> SimRoute*, filled lazily        */
  GMutex route_lock;      /* routes are filled from search worker threads too           */
  /* The same routes by (src * n_devices + dst), read without the lock once set (machines
   * of up to 4,096 GPUs: at most 128 MiB of address space, touched where used); NULL
   * for larger ones. */
  SimRoute **route_table;
  /* For larger machines: the routes last looked up, by a hash of (src, dst), each entry
   * overwritten by the next route of the same hash and read without the lock (a route
   * never changes once made). */
  SimRoute **route_cache;
  char *json;             /* the description it was loaded from, for round trips        */
};

/* The cached route from @src to @dst (links, bottleneck, latency), valid while the
 * machine lives: one lookup where the public functions take several. */
const SimRoute *sim_machine_route_info(const SimMachine *m, int src, int dst);
/* The GPU of @src's node through whose NIC a message from @src to @dst leaves (NCCL's PXN
 * on a rail-optimized network: the GPU of @dst's rail), or -1 where it leaves through
 * @src's own (machine.c, build_pxn()). */
int sim_machine_pxn_relay(const SimMachine *m, int src, int dst);

/* The PCIe links from device @dev up to the host socket above it (@to_host) or back
 * down, in order, into @links (at most @max); returns how many there are.  The socket's
 * index in its node: sim_machine_host_socket(). */
int sim_machine_host_links(const SimMachine *m, int dev, gboolean to_host, int *links, int max);
int sim_machine_host_socket(const SimMachine *m, int dev);

/* Device specs that are not in the library (from a machine file) live as long as the
 * process: the loader interns them here. */
const SimDeviceSpec *sim_device_spec_intern(const SimDeviceSpec *spec);

/* A machine as its file describes it (data/machines/README.md): one node type, a count of
 * nodes, and the network between them.  machine-json.c reads and writes it, machine.c
 * expands it into vertices and links.  Bandwidths are bytes/s per direction, latencies
 * seconds per link. */
typedef enum {
  SIM_FABRIC_PCIE,          /* no GPU-to-GPU fabric: peers talk over the PCIe tree      */
  SIM_FABRIC_NVSWITCH,      /* every GPU has one link to a switch, each direction       */
  SIM_FABRIC_NVLINK_MESH,   /* explicit GPU pairs joined by some number of NVLinks      */
} SimFabricKind;

typedef enum {
  SIM_NETWORK_NONE,         /* a single node                                            */
  SIM_NETWORK_SINGLE_SWITCH,
  SIM_NETWORK_FAT_TREE,
  SIM_NETWORK_RAIL_OPTIMIZED,
} SimNetworkKind;

typedef struct {
  int a, b;                 /* local GPU indices, a < b                                 */
  int links;                /* NVLink bricks between them                               */
} SimNvlinkPair;

typedef struct {
  int parent;               /* the upstream PCIe switch, or -1 under a socket           */
  int socket;               /* the socket when parent is -1                             */
} SimPcieSwitchDesc;

typedef struct {
  char *name;
  char *description;
  int count;                /* nodes                                                    */

  const SimDeviceSpec *spec;
  gboolean spec_inline;     /* written back as an object, not by name                   */
  int gpus;                 /* per node                                                 */

  SimFabricKind fabric;
  double fabric_bandwidth;  /* NVSwitch: per GPU; mesh: per NVLink brick                */
  double fabric_latency;
  int n_pairs;
  SimNvlinkPair *pairs;

  int sockets;
  int n_switches;
  SimPcieSwitchDesc *switches;
  int *gpu_switch;          /* gpus entries: the PCIe switch of each GPU                */
  double pcie_bandwidth, pcie_latency;
  double intersocket_bandwidth, intersocket_latency;

  int n_nics;               /* per node                                                 */
  int *nic_switch;          /* n_nics entries                                           */
  double nic_bandwidth;

  SimNetworkKind network;
  int nodes_per_leaf;       /* fat-tree and rail-optimized                              */
  int spines;               /* 0 where no spine is needed                               */
  double oversubscription;
  double network_bandwidth; /* switch-to-switch ports                                   */
  double network_latency;
  /* Rail-optimized: messages to another rail leave through the destination's rail, not
   * through PXN (machine.c, build_pxn()); the "pxn" key of the network, TRUE by default. */
  gboolean no_pxn;
} SimMachineDesc;

/* Parses and checks a machine file; @count_override > 0 replaces its "count".  Errors name
 * @filename and the JSON path of the offending value. */
SimMachineDesc *sim_machine_desc_parse(const char *text, const char *filename,
                                       int count_override, GError **error);
void sim_machine_desc_free(SimMachineDesc *d);
/* The canonical JSON of @d: every default written out, so that reading it back gives the
 * same machine. */
char *sim_machine_desc_to_json(const SimMachineDesc *d);
/* Expands @d (taken) into a machine. */
SimMachine *sim_machine_build(SimMachineDesc *d);

/* ---------------------------------------------------------------------------------- */
/* Strategies                                                                          */

/* What a strategy remembers of each operator of the graph it was made for: its name, type
 * and iteration space.  With it sim_strategy_set_op() checks a configuration and names the
 * operator in its errors without the graph at hand, and a strategy never points at a graph
 * that may be freed before it.  Built once by sim_strategy_new() and shared, read-only and
 * reference counted, by every copy, so copying a strategy in a search loop stays cheap. */
typedef struct {
  const char *name;        /* in the layout's own storage                              */
  SimOpType type;
  int ndims;
  SimIterDim dims[SIM_MAX_ITER];
} SimStrategyOpInfo;

typedef struct {
  int n_ops;
  char *graph_name;
  int64_t batch;           /* sim_graph_batch_size() of the graph                      */
  SimStrategyOpInfo *ops;
} SimStrategyLayout;

typedef struct {
  int degree[SIM_MAX_ITER];
  int n_shards;            /* product of the degrees, times replicas                   */
  int *devices;            /* n_shards entries                                        */
  /* Copies of every shard computed redundantly on several devices (Megatron runs layer
   * norms, dropouts and residual adds on every tensor-parallel rank).  Shard index =
   * coordinate index * replicas + copy: copies are the fastest-varying.  0 means 1. */
  int replicas;
} SimOpConfig;

struct _SimStrategy {
  int n_ops;
  int n_devices;           /* of the machine it was made for                          */
  SimOpConfig *ops;
  int n_stages;            /* 1 when there is no pipeline                              */
  int *op_stage;           /* n_ops                                                    */
  int **stage_devices;     /* n_stages arrays                                          */
  int *stage_n_devices;
  int microbatches;
  SimSchedule schedule;
  int chunks;
  SimSyncOptions sync;
  SimMemoryOptions memory;
  gboolean sequence_parallel;
  /* Megatron's scatter-gather of pipeline messages: the tensor-parallel ranks that hold
   * an activation (or gradient) each send 1/n of it to the next stage, whose ranks
   * all-gather the parts. */
  gboolean scatter_gather;
  /* Transformer Engine's overlap of tensor-parallel communication with GEMMs (Megatron's
   * --tp-comm-overlap, NeMo's tp_comm_overlap): under sequence parallelism, each
   * all-gather into a tensor-parallel op and each reduce-scatter of its partial sums runs
   * in chunks pipelined with the GEMM that consumes or produces it (lower-tensors.c). */
  gboolean tp_comm_overlap;
  /* Its parameters (sim_strategy_set_tp_overlap()). */
  SimTpOverlap tp_overlap;
  /* Context parallelism (sim_strategy_set_context_parallel()): 0 or 1 none. */
  int cp;
  /* Graph rewrites the strategy was found with (names of substitutions, in order); the
   * search applies them to the model before the configurations refer to it. */
  GPtrArray *rewrites;
  /* What the strategy knows of its graph's operators (shared, immutable). */
  SimStrategyLayout *layout;
};

/* Model chunks per device group: the chunks of an interleaved schedule, else 1 (a stage
 * is then its own device group). */
static inline int sim_strategy_chunks_per_group(const SimStrategy *s)
{
  return s->schedule == SIM_SCHEDULE_INTERLEAVED && s->chunks > 1 ? s->chunks : 1;
}

/* Shard @s's coordinates along each iteration dimension (row-major, last fastest). */
void sim_config_shard_coords(const SimOpConfig *c, int ndims, int shard, int *coords);
/* The iteration range of shard coordinates @coords of @op whose sample dimensions are
 * divided further into @microbatches. */
void sim_config_shard_range(const SimOp *op, const SimOpConfig *c, const int *coords,
                            int microbatches, int64_t *lo, int64_t *hi);

/* Fills @info from operator @op of @g (the name is borrowed from the graph). */
void sim_strategy_op_info_fill(const SimGraph *g, int op, SimStrategyOpInfo *info);
/* Checks one operator's configuration against its iteration space: a degree >= 1 for each
 * of its dimensions and 1 beyond them, 1 on dimensions that cannot be split, degrees that
 * divide their dimensions (the sample dimension, dimension 0, per micro-batch), n_shards
 * equal to the product of the degrees and devices in [0, @n_devices).  On failure sets
 * @error with a message that names the operator and, when @where is not NULL, stores the
 * part of the configuration at fault ("degrees.n", "devices[3]"; transfer full). */
gboolean sim_strategy_check_config(const SimStrategyOpInfo *info, const SimOpConfig *c,
                                   int microbatches, int n_devices, char **where,
                                   GError **error);

/* Like sim_strategy_set_op(), with every shard computed redundantly by @replicas copies
 * on distinct devices (SimOpConfig.replicas): @devices holds the product of the degrees
 * times @replicas entries, the copies of a shard next to each other.  sim_strategy_set_op()
 * is this with one copy. */
gboolean sim_strategy_set_op_replicated(SimStrategy *s, int op, const int *degrees,
                                        int replicas, const int *devices, GError **error);
int sim_strategy_op_replicas(const SimStrategy *s, int op);

/* Options that the public header does not expose yet. */
void sim_strategy_set_sequence_parallel(SimStrategy *s, gboolean on);
void sim_strategy_set_scatter_gather(SimStrategy *s, gboolean on);
gboolean sim_strategy_get_scatter_gather(const SimStrategy *s);
void sim_strategy_set_tp_comm_overlap(SimStrategy *s, gboolean on);

/* Enumerations by name (the others are in parasol-sim.h); -1 for unknown names. */
const char *sim_optimizer_name(SimOptimizer o);
int sim_optimizer_from_name(const char *name);

/* Appends @str to @s as a JSON string, quoted and escaped (the writers share it). */
void sim_json_append_string(GString *s, const char *str);

/* The names of the parameters given, in order; NULL-terminated (g_strfreev). */
char **sim_model_params_names(const SimModelParams *p);

/* The shared JSON reader (base/json-read.h) of a libsim file: SIM_ERROR, with
 * SIM_ERROR_PARSE, SIM_ERROR_INVALID and SIM_ERROR_UNKNOWN for its checks. */
#define SIM_JSON_READER(file_, error_)                                                    \
  { .file = (file_), .error = (error_), .domain = SIM_ERROR, .parse = SIM_ERROR_PARSE,    \
    .invalid = SIM_ERROR_INVALID, .unknown = SIM_ERROR_UNKNOWN }

/* Utilities shared by the JSON readers: errors that name file and place. */
void sim_set_error_at(GError **error, int code, const char *filename, const char *place,
                      const char *fmt, ...) G_GNUC_PRINTF(5, 6);

G_END_DECLS
