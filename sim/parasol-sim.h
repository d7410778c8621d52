/* parasol-sim.h — the public interface of libsim.
 *
 * libsim holds everything needed to predict how long one training iteration of a
 * deep neural network takes on a machine under a parallelization strategy: the graph
 * IR and its operator catalogue, the model zoo, the machine model, strategies, the
 * lowering to a task graph, the discrete-event engine with its network and collective
 * models, the cost models, memory accounting, delta simulation, reports and traces.
 *
 * Types are opaque unless they are small values (shapes, regions, specs) that callers
 * build on the stack.  Errors on input and I/O are reported through GError in the
 * SIM_ERROR domain; misuse of the API is caught by g_return_val_if_fail.
 */
#pragma once

#include <glib.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>

G_BEGIN_DECLS

#define SIM_PUBLIC __attribute__((visibility("default")))

/* ---------------------------------------------------------------------------------- */
/* Errors                                                                              */

#define SIM_ERROR (sim_error_quark())
typedef enum {
  SIM_ERROR_PARSE,     /* malformed file: JSON syntax, wrong format or version      */
  SIM_ERROR_INVALID,   /* well-formed but impossible: bad shape, degree, bandwidth    */
  SIM_ERROR_UNKNOWN,   /* an unknown name: model, operator, device, machine, option   */
  SIM_ERROR_IO,        /* a file could not be read or written                         */
  SIM_ERROR_OOM,       /* a strategy does not fit in device memory                    */
  SIM_ERROR_CANCELLED, /* a simulation stopped by its cancellation flag (SimOptions)  */
} SimErrorCode;
SIM_PUBLIC GQuark sim_error_quark(void);

/* Input files: every reader of parasol (models, machines, strategies, profiles,
 * calibrations, tables, batches) reads through sim_read_file, which takes files and
 * pipes (not directories or devices such as /dev/zero) of at most SIM_INPUT_MAX_BYTES,
 * without a NUL byte; errors are G_FILE_ERROR with a message that names the file.  JSON
 * is parsed through sim_json_load, which first refuses (sim_json_check) text nested
 * deeper than SIM_JSON_MAX_DEPTH arrays and objects, integers beyond 64 bits and numbers
 * beyond a double's range, which json-glib would take as other values (a JSON_PARSER_ERROR
 * in json-glib's own form, "<data>:LINE:COLUMN: Parse error: ..."). */
#define SIM_INPUT_MAX_BYTES (16 << 20)
#define SIM_JSON_MAX_DEPTH 256
SIM_PUBLIC gboolean sim_read_file(const char *path, char **contents, gsize *length,
                                  GError **error);
/* FALSE with an error naming @filename and the line when @text holds a NUL byte. */
SIM_PUBLIC gboolean sim_check_text(const char *text, gsize length, const char *filename,
                                   GError **error);
SIM_PUBLIC gboolean sim_json_check(const char *text, gssize length, GError **error);
struct _JsonParser;
SIM_PUBLIC gboolean sim_json_load(struct _JsonParser *parser, const char *text, gssize length,
                                  GError **error);

/* ---------------------------------------------------------------------------------- */
/* Tensors: shapes, data types and n-dimensional regions                              */

#define SIM_MAX_DIMS 6
/* The most ops a graph may hold: a bound on what a mistyped size can cost (a model of a
 * hundred million layers would exhaust memory before it said anything). */
#define SIM_GRAPH_MAX_OPS 200000
/* The most GPUs a machine may have (4096 nodes of 8): the simulator's tables and time
 * grow faster than the GPU count, and a mistyped count must fail at once. */
#define SIM_MACHINE_MAX_DEVICES 32768

typedef enum {
  SIM_DTYPE_FP32,
  SIM_DTYPE_FP16,
  SIM_DTYPE_BF16,
  SIM_DTYPE_FP8,
  SIM_DTYPE_INT32,
  SIM_DTYPE_INT64,
  SIM_DTYPE_COUNT
} SimDType;

SIM_PUBLIC const char *sim_dtype_name(SimDType t);
/* Returns the dtype named @name ("fp32", "float16", ...) or -1. */
SIM_PUBLIC int sim_dtype_from_name(const char *name);
SIM_PUBLIC int sim_dtype_size(SimDType t);

typedef struct {
  int ndim;
  int64_t dims[SIM_MAX_DIMS];
} SimShape;

SIM_PUBLIC SimShape sim_shape_make(int ndim, const int64_t *dims);
SIM_PUBLIC int64_t sim_shape_numel(const SimShape *s);
SIM_PUBLIC gboolean sim_shape_equal(const SimShape *a, const SimShape *b);
/* Writes "[64, 3, 224, 224]" into a newly allocated string. */
SIM_PUBLIC char *sim_shape_to_string(const SimShape *s);

/* A box of a tensor: for each dimension the half-open range [lo, hi). */
typedef struct {
  int ndim;
  int64_t lo[SIM_MAX_DIMS];
  int64_t hi[SIM_MAX_DIMS];
} SimRegion;

SIM_PUBLIC SimRegion sim_region_full(const SimShape *s);
SIM_PUBLIC int64_t sim_region_volume(const SimRegion *r);
/* Intersects @a and @b into @out; returns FALSE (and an empty @out) if they are disjoint. */
SIM_PUBLIC gboolean sim_region_intersect(const SimRegion *a, const SimRegion *b, SimRegion *out);
SIM_PUBLIC gboolean sim_region_equal(const SimRegion *a, const SimRegion *b);
SIM_PUBLIC gboolean sim_region_contains(const SimRegion *outer, const SimRegion *inner);

/* ---------------------------------------------------------------------------------- */
/* The operator catalogue                                                             */

typedef enum {
  SIM_OP_INPUT,        /* a data source (samples, labels): no compute, no weights   */
  SIM_OP_LINEAR,       /* Y = X W (+ b), optional fused activation                  */
  SIM_OP_MATMUL,       /* batched matrix product of two activations                 */
  SIM_OP_CONV2D,
  SIM_OP_POOL2D,
  SIM_OP_BATCHNORM,
  SIM_OP_LAYERNORM,
  SIM_OP_EMBEDDING,
  SIM_OP_UNARY,        /* element-wise: relu, gelu, sigmoid, tanh, exp, identity ...  */
  SIM_OP_BINARY,       /* element-wise: add, sub, mul, div, with broadcasting        */
  SIM_OP_SOFTMAX,
  SIM_OP_DROPOUT,
  SIM_OP_CONCAT,
  SIM_OP_SPLIT,
  SIM_OP_RESHAPE,
  SIM_OP_TRANSPOSE,
  SIM_OP_ATTENTION,    /* multi-head attention with its four projections            */
  SIM_OP_LSTM,         /* an LSTM layer over a chunk of the sequence                */
  SIM_OP_CROSS_ENTROPY,
  SIM_OP_MSE_LOSS,
  SIM_OP_RMSNORM,      /* root-mean-square normalization (LLaMA), scale only          */
  SIM_OP_GATED_MLP,    /* act(x Wg) * (x Wu) then Wd: SwiGLU and the other GLUs        */
  SIM_OP_MOE,          /* a mixture of gated-MLP experts with a top-k router          */
  SIM_OP_COUNT
} SimOpType;

typedef enum {
  SIM_UNARY_IDENTITY,
  SIM_UNARY_RELU,
  SIM_UNARY_GELU,
  SIM_UNARY_SIGMOID,
  SIM_UNARY_TANH,
  SIM_UNARY_EXP,
  SIM_UNARY_SILU,
  SIM_UNARY_SCALE,
  SIM_UNARY_RELU6,     /* min(max(x, 0), 6): MobileNet's clipped ReLU */
  SIM_UNARY_COUNT
} SimUnaryKind;

typedef enum {
  SIM_BINARY_ADD,
  SIM_BINARY_SUB,
  SIM_BINARY_MUL,
  SIM_BINARY_DIV,
  SIM_BINARY_COUNT
} SimBinaryKind;

typedef enum { SIM_POOL_MAX, SIM_POOL_AVG } SimPoolKind;

/* How a framework runs attention's scores, softmax and context (sim/ops/attention.c). */
typedef enum {
  SIM_ATTENTION_FUSED,     /* one fused scale-mask-softmax kernel; scores in memory     */
  SIM_ATTENTION_UNFUSED,   /* PyTorch's eager path: scale, mask, softmax (fp32 under
                            * autocast), dropout, each a kernel; scores in memory        */
  SIM_ATTENTION_MEGATRON,  /* Megatron's FusedScaleMaskSoftmax where its kernel applies
                            * (up to 2,048 keys), else the fp32 unfused path           */
  SIM_ATTENTION_FLASH,     /* FlashAttention: one tiled kernel each way, no scores     */
  SIM_ATTENTION_COUNT
} SimAttentionKernel;

SIM_PUBLIC const char *sim_attention_kernel_name(SimAttentionKernel k);
/* The kernel named @name ("flash", ...), or -1. */
SIM_PUBLIC int sim_attention_kernel_from_name(const char *name);

/* Roles of the dimensions of an operator's iteration space (FlexFlow's SOAP
 * dimensions; docs/architecture.md, "The flow"). */
typedef enum {
  SIM_ROLE_SAMPLE,     /* the batch: splitting it is data parallelism               */
  SIM_ROLE_ATTRIBUTE,  /* spatial or sequence positions                             */
  SIM_ROLE_PARAMETER,  /* output channels, features, heads: splits the weights       */
  SIM_ROLE_REDUCTION,  /* contracted dimensions: splitting gives partial sums        */
  SIM_ROLE_COUNT
} SimDimRole;

SIM_PUBLIC const char *sim_op_type_name(SimOpType t);
/* Returns the operator type named @name ("linear", "conv2d", ...) or -1. */
SIM_PUBLIC int sim_op_type_from_name(const char *name);
SIM_PUBLIC const char *sim_op_type_description(SimOpType t);
SIM_PUBLIC const char *sim_dim_role_name(SimDimRole r);
SIM_PUBLIC const char *sim_unary_kind_name(SimUnaryKind k);
SIM_PUBLIC const char *sim_binary_kind_name(SimBinaryKind k);

/* ---------------------------------------------------------------------------------- */
/* Graphs                                                                              */

typedef struct _SimGraph SimGraph;

SIM_PUBLIC SimGraph *sim_graph_new(const char *name);
SIM_PUBLIC void sim_graph_free(SimGraph *g);
SIM_PUBLIC SimGraph *sim_graph_copy(const SimGraph *g);
SIM_PUBLIC const char *sim_graph_get_name(const SimGraph *g);

/* Graph builders.  Each returns the id of the (first) output tensor, or -1.
 * Errors are sticky, as in cairo: the first error is kept in the graph, later builder
 * calls do nothing and return -1, and sim_graph_check() reports it.  This keeps model
 * builders free of error plumbing.  @name may be NULL for a generated one. */
SIM_PUBLIC int sim_graph_input(SimGraph *g, const char *name, SimDType dtype, int ndim,
                               const int64_t *dims);
SIM_PUBLIC int sim_graph_linear(SimGraph *g, const char *name, int x, int64_t out_features,
                                gboolean bias, SimUnaryKind activation);
/* a[..., m, k] x b[..., k, n]; with @trans_b, b is [..., n, k].  Leading dimensions equal. */
SIM_PUBLIC int sim_graph_matmul(SimGraph *g, const char *name, int a, int b, gboolean trans_b);

typedef struct {
  int64_t out_channels;
  int kernel[2], stride[2], padding[2], dilation[2];
  int groups;
  gboolean bias;
  SimUnaryKind activation;
} SimConvParams;
/* Fills the defaults: stride 1, padding 0, dilation 1, groups 1, no bias, no activation. */
SIM_PUBLIC SimConvParams sim_conv_params(int64_t out_channels, int kh, int kw);
SIM_PUBLIC int sim_graph_conv2d(SimGraph *g, const char *name, int x, const SimConvParams *p);
SIM_PUBLIC int sim_graph_pool2d(SimGraph *g, const char *name, int x, SimPoolKind kind,
                                int kh, int kw, int sh, int sw, int ph, int pw);
SIM_PUBLIC int sim_graph_batchnorm(SimGraph *g, const char *name, int x, gboolean relu);
/* Normalizes over the last dimension. */
SIM_PUBLIC int sim_graph_layernorm(SimGraph *g, const char *name, int x);
/* Root-mean-square normalization over the last dimension, with a scale and no shift. */
SIM_PUBLIC int sim_graph_rmsnorm(SimGraph *g, const char *name, int x);
/* x [b, (s...), d] -> (act(x Wg) * (x Wu)) Wd [b, (s...), d], Wg and Wu [d, ffn], Wd
 * [ffn, d], no biases: SwiGLU with SIM_UNARY_SILU, GeGLU with SIM_UNARY_GELU. */
SIM_PUBLIC int sim_graph_gated_mlp(SimGraph *g, const char *name, int x, int64_t ffn,
                                   SimUnaryKind activation);
/* x [b, s, d] -> a mixture of @experts SwiGLU experts of width @ffn, each token sent to
 * its @top_k best experts by the router's @logits [b, s, experts] (a linear layer of x
 * without bias; softmax over the experts, the top k renormalized).  Further attributes
 * (capacity_factor, imbalance, gate_activation, normalize_top_k): sim/ops/moe.c. */
SIM_PUBLIC int sim_graph_moe(SimGraph *g, const char *name, int x, int logits, int experts,
                             int top_k, int64_t ffn);
SIM_PUBLIC int sim_graph_embedding(SimGraph *g, const char *name, int ids, int64_t vocab,
                                   int64_t dim);
SIM_PUBLIC int sim_graph_unary(SimGraph *g, const char *name, int x, SimUnaryKind kind);
SIM_PUBLIC int sim_graph_binary(SimGraph *g, const char *name, int a, int b, SimBinaryKind kind);
/* Softmax over the last dimension. */
SIM_PUBLIC int sim_graph_softmax(SimGraph *g, const char *name, int x);
SIM_PUBLIC int sim_graph_dropout(SimGraph *g, const char *name, int x, double p);
SIM_PUBLIC int sim_graph_concat(SimGraph *g, const char *name, int axis, int n, const int *xs);
/* Splits @x along @axis into @n parts of @sizes; the parts' ids go to @outs. */
SIM_PUBLIC int sim_graph_split(SimGraph *g, const char *name, int x, int axis, int n,
                               const int64_t *sizes, int *outs);
/* One dimension of @dims may be -1 (inferred). */
SIM_PUBLIC int sim_graph_reshape(SimGraph *g, const char *name, int x, int ndim,
                                 const int64_t *dims);
SIM_PUBLIC int sim_graph_transpose(SimGraph *g, const char *name, int x, const int *perm);
/* Multi-head attention: q [b, sq, d], k and v [b, skv, d]; projections Wq, Wk, Wv, Wo.
 * Pass the same tensor three times for self-attention. */
SIM_PUBLIC int sim_graph_attention(SimGraph *g, const char *name, int q, int k, int v,
                                   int heads, int64_t head_dim, gboolean causal);
/* x [b, s, in]; out [b, s, hidden]. */
SIM_PUBLIC int sim_graph_lstm(SimGraph *g, const char *name, int x, int64_t hidden);
/* logits [..., classes], labels [...] (int); output: the per-sample loss [...]. */
SIM_PUBLIC int sim_graph_cross_entropy(SimGraph *g, const char *name, int logits, int labels);
/* The same loss computed in fp32 from 16-bit logits, in separate passes (Megatron's
 * default: attribute "fp32"). */
SIM_PUBLIC int sim_graph_cross_entropy_fp32(SimGraph *g, const char *name, int logits,
                                            int labels);
SIM_PUBLIC int sim_graph_mse_loss(SimGraph *g, const char *name, int pred, int target);

/* Generic construction by type name and attributes, as the JSON reader does it.
 * @attrs maps attribute names to JsonNode-free values: see SimAttrs below. */
typedef struct _SimAttrs SimAttrs;
SIM_PUBLIC SimAttrs *sim_attrs_new(SimOpType type);
SIM_PUBLIC void sim_attrs_free(SimAttrs *a);
SIM_PUBLIC gboolean sim_attrs_set_int(SimAttrs *a, const char *name, int64_t v, GError **error);
SIM_PUBLIC gboolean sim_attrs_set_ints(SimAttrs *a, const char *name, int n, const int64_t *v,
                                       GError **error);
SIM_PUBLIC gboolean sim_attrs_set_float(SimAttrs *a, const char *name, double v, GError **error);
/* For enumerated attributes ("relu", "max"); also accepts booleans as "true"/"false". */
SIM_PUBLIC gboolean sim_attrs_set_string(SimAttrs *a, const char *name, const char *v,
                                         GError **error);
/* Adds an operator; returns its id or -1 with @error set (the graph's sticky error is
 * not touched).  @attrs is not taken. */
SIM_PUBLIC int sim_graph_add_op(SimGraph *g, SimOpType type, const char *name, int n_inputs,
                                const int *inputs, const SimAttrs *attrs, GError **error);

/* Reports the sticky builder error, if any. */
SIM_PUBLIC gboolean sim_graph_check(const SimGraph *g, GError **error);

/* Reading attributes back, for graph rewrites that rebuild an operator with a change
 * (graph-edit.c).  sim_graph_op_attrs() copies the attributes of an existing op, defaults
 * filled in (transfer full); passed to sim_graph_add_op() with the same inputs it builds
 * the same op.  The getters return FALSE (or -1) for a name the op type lacks or a value
 * of another type: get_int reads integers, booleans (0/1) and enumerations (the index in
 * the enumeration, e.g. a SimUnaryKind); get_ints copies at most @max values and returns
 * how many the list holds. */
SIM_PUBLIC SimAttrs *sim_graph_op_attrs(const SimGraph *g, int op);
SIM_PUBLIC SimOpType sim_attrs_get_type(const SimAttrs *a);
SIM_PUBLIC gboolean sim_attrs_get_int(const SimAttrs *a, const char *name, int64_t *v);
SIM_PUBLIC int sim_attrs_get_ints(const SimAttrs *a, const char *name, int64_t *v, int max);
SIM_PUBLIC gboolean sim_attrs_get_float(const SimAttrs *a, const char *name, double *v);


/* Marks @op as a candidate for selective recomputation (large, cheap activations such as
 * attention scores), as Korthikanti et al. 2022 do. */
SIM_PUBLIC void sim_graph_set_selective_recompute(SimGraph *g, int op, gboolean on);

/* Marks @op as the end of a layer: with full recomputation only the outputs of marked ops
 * are kept between the forward and the backward pass, and the ops after one mark up to the
 * next are recomputed together (Megatron checkpoints every transformer layer). */
SIM_PUBLIC void sim_graph_set_checkpoint(SimGraph *g, int op, gboolean on);
SIM_PUBLIC gboolean sim_graph_op_is_checkpoint(const SimGraph *g, int op);
/* The ops that end a layer, where pipeline stages may be cut, in order: the checkpoint
 * marks, or in a graph that marks none, the ops after which exactly one tensor is live
 * (sim/layers.c).  Writes them to @ends (room for sim_graph_n_ops(), or NULL) and
 * returns how many there are. */
SIM_PUBLIC int sim_graph_layer_ends(const SimGraph *g, int *ends);
SIM_PUBLIC gboolean sim_graph_op_is_selective_recompute(const SimGraph *g, int op);

/* Makes @op use the weights of @owner instead of its own: a tied embedding and output
 * layer, an LSTM layer unrolled over chunks of the sequence.  @op's first weights must
 * hold as many elements as @owner's, in order; further ones (a bias) stay its own.
 * Parameters count once; the gradients of all users are summed before the update, over
 * the network where users sit on different devices. */
SIM_PUBLIC gboolean sim_graph_share_weights(SimGraph *g, int op, int owner, GError **error);
/* The op whose weights @op uses: @op itself unless it shares another's. */
SIM_PUBLIC int sim_graph_op_weight_owner(const SimGraph *g, int op);

/* Rewrites the dtype of every floating-point tensor and weight (fp32 models trained in
 * fp16 mixed precision compute in fp16).  Integer tensors are left alone. */
SIM_PUBLIC void sim_graph_set_float_dtype(SimGraph *g, SimDType dtype);
/* Runs every attention operator of @g with kernel @k (the graph's files and the zoo name
 * one per model; a framework may run another). */
SIM_PUBLIC void sim_graph_set_attention_kernel(SimGraph *g, SimAttentionKernel k);

/* Queries.  Ops are numbered 0..n-1 in insertion order, which is a topological order. */
SIM_PUBLIC int sim_graph_n_ops(const SimGraph *g);
SIM_PUBLIC int sim_graph_n_tensors(const SimGraph *g);
SIM_PUBLIC SimOpType sim_graph_op_type(const SimGraph *g, int op);
SIM_PUBLIC const char *sim_graph_op_name(const SimGraph *g, int op);
SIM_PUBLIC int sim_graph_op_by_name(const SimGraph *g, const char *name);
SIM_PUBLIC int sim_graph_op_n_inputs(const SimGraph *g, int op);
SIM_PUBLIC int sim_graph_op_input(const SimGraph *g, int op, int i);
SIM_PUBLIC int sim_graph_op_n_outputs(const SimGraph *g, int op);
SIM_PUBLIC int sim_graph_op_output(const SimGraph *g, int op, int i);
SIM_PUBLIC int sim_graph_op_n_weights(const SimGraph *g, int op);
SIM_PUBLIC SimShape sim_graph_op_weight_shape(const SimGraph *g, int op, int i);
SIM_PUBLIC int64_t sim_graph_op_n_params(const SimGraph *g, int op);
SIM_PUBLIC SimShape sim_graph_tensor_shape(const SimGraph *g, int t);
SIM_PUBLIC SimDType sim_graph_tensor_dtype(const SimGraph *g, int t);
SIM_PUBLIC const char *sim_graph_tensor_name(const SimGraph *g, int t);
/* The op that produces tensor @t. */
SIM_PUBLIC int sim_graph_tensor_producer(const SimGraph *g, int t);
SIM_PUBLIC int sim_graph_tensor_n_consumers(const SimGraph *g, int t);
SIM_PUBLIC int sim_graph_tensor_consumer(const SimGraph *g, int t, int i);

/* Totals over the whole graph, for one iteration of the full batch. */
SIM_PUBLIC int64_t sim_graph_n_params(const SimGraph *g);
SIM_PUBLIC double sim_graph_forward_flops(const SimGraph *g);
SIM_PUBLIC double sim_graph_backward_flops(const SimGraph *g);
SIM_PUBLIC double sim_graph_op_forward_flops(const SimGraph *g, int op);
SIM_PUBLIC double sim_graph_op_backward_flops(const SimGraph *g, int op);
SIM_PUBLIC double sim_graph_op_bytes(const SimGraph *g, int op); /* forward, read + written */
/* The batch size: the extent of the sample dimension shared by the graph's inputs. */
SIM_PUBLIC int64_t sim_graph_batch_size(const SimGraph *g);
/* Tokens per sample (sequence length) for language models, 1 otherwise. */
SIM_PUBLIC int64_t sim_graph_tokens_per_sample(const SimGraph *g);
SIM_PUBLIC void sim_graph_set_tokens_per_sample(SimGraph *g, int64_t tokens);

/* The iteration space of an operator (docs/architecture.md, "The flow"). */
SIM_PUBLIC int sim_graph_op_n_dims(const SimGraph *g, int op);
SIM_PUBLIC const char *sim_graph_op_dim_name(const SimGraph *g, int op, int d);
SIM_PUBLIC SimDimRole sim_graph_op_dim_role(const SimGraph *g, int op, int d);
SIM_PUBLIC int64_t sim_graph_op_dim_size(const SimGraph *g, int op, int d);
/* FALSE where the operator cannot be split along @d (an LSTM's time steps, say). */
SIM_PUBLIC gboolean sim_graph_op_dim_splittable(const SimGraph *g, int op, int d);

/* Which of an operator's tensors a region query is about. */
typedef enum {
  SIM_TENSOR_INPUT,
  SIM_TENSOR_WEIGHT,
  SIM_TENSOR_OUTPUT,
} SimTensorRole;

/* The region of input, weight or output @i of @op that the shard covering iteration
 * dimensions [lo[d], hi[d]) reads or writes (docs/architecture.md, "The flow"):
 * what a search needs to price the data two configurations exchange without simulating
 * them (shard.c).  Returns FALSE for a tensor the op does not have. */
SIM_PUBLIC gboolean sim_graph_op_shard_region(const SimGraph *g, int op, SimTensorRole role,
                                              int i, const int64_t *lo, const int64_t *hi,
                                              SimRegion *out);

/* The one rule for partial sums (shard.c): tensor @i of @role holds partial sums in a
 * shard of @op when some iteration dimension d split @degree[d] > 1 ways does not index
 * it (the tensor's region does not change along d), so each shard holds a term of a sum
 * over d.  For an output that means a reduction across the shards; for an input, in the
 * backward pass, its gradient.  sim_graph_op_dim_indexes() is the test for one d.
 * FALSE for a tensor the op does not have. */
SIM_PUBLIC gboolean sim_graph_op_dim_indexes(const SimGraph *g, int op, SimTensorRole role,
                                             int i, int d);
SIM_PUBLIC gboolean sim_graph_op_tensor_partial(const SimGraph *g, int op, SimTensorRole role,
                                                int i, const int *degree);
/* Whether @op applies a nonlinear function in its epilogue (an "activation" other than
 * identity or scale, or a fused "relu"): a function of partial sums is not the function
 * of their sum, so such an op cannot split a dimension its output does not depend on. */
SIM_PUBLIC gboolean sim_graph_op_fused_nonlinear(const SimGraph *g, int op);

/* JSON ("format": "parasol-graph", "version": 1).  The reader re-runs shape inference and
 * names the file and the operator in its errors. */
SIM_PUBLIC char *sim_graph_to_json(const SimGraph *g);
SIM_PUBLIC SimGraph *sim_graph_from_json(const char *text, const char *filename, GError **error);
SIM_PUBLIC gboolean sim_graph_save(const SimGraph *g, const char *path, GError **error);
SIM_PUBLIC SimGraph *sim_graph_load(const char *path, GError **error);
/* The same with the batch set to @batch (0: as written): dimension 0 of every input and
 * reshape, the samples by the graph's convention, is scaled from the file's batch. */
SIM_PUBLIC SimGraph *sim_graph_from_json_with_batch(const char *text, const char *filename,
                                                    int64_t batch, GError **error);
SIM_PUBLIC SimGraph *sim_graph_load_with_batch(const char *path, int64_t batch,
                                               GError **error);

/* ---------------------------------------------------------------------------------- */
/* The model zoo                                                                       */

/* A parameter of a zoo model ("batch", "hidden", "layers", ...). */
typedef struct {
  const char *name;
  int64_t value;
  const char *help;
} SimModelParam;

typedef struct _SimModelParams SimModelParams;
SIM_PUBLIC SimModelParams *sim_model_params_new(void);
SIM_PUBLIC void sim_model_params_free(SimModelParams *p);
/* Parses "k=v" or "k1=v1,k2=v2"; values take k/M/G suffixes (1k = 1000). */
SIM_PUBLIC gboolean sim_model_params_parse(SimModelParams *p, const char *text, GError **error);
SIM_PUBLIC void sim_model_params_set(SimModelParams *p, const char *name, int64_t value);
SIM_PUBLIC gboolean sim_model_params_lookup(const SimModelParams *p, const char *name,
                                            int64_t *value);

SIM_PUBLIC int sim_zoo_n_models(void);
SIM_PUBLIC const char *sim_zoo_model_name(int i);
SIM_PUBLIC const char *sim_zoo_model_description(int i);
/* The parameters model @name accepts, with their defaults; NULL-terminated, static. */
SIM_PUBLIC const SimModelParam *sim_zoo_model_params(const char *name);
/* Megatron pads a transformer's vocabulary so that the vocabulary-parallel embedding and
 * output layer split evenly over the tensor-parallel ranks: to a multiple of
 * make-vocab-size-divisible-by (128) x TP (megatron/training/tokenizer's
 * _vocab_size_with_padding, as data/reference/vtrain's runs used it).  When @name is a
 * zoo transformer (it has "vocab" and "heads") whose vocabulary @params leaves at its
 * default, and that default is not such a multiple for @tp (< 1 counts as 1), sets
 * "vocab" in @params to the padded size and returns TRUE with the default in
 * *@vocab_default and the padded size in *@vocab_padded (either may be NULL); otherwise
 * changes nothing and returns FALSE.  The program pads every plan's model this way. */
SIM_PUBLIC gboolean sim_model_params_pad_vocab(SimModelParams *params, const char *name, int tp,
                                               int64_t *vocab_default, int64_t *vocab_padded);
/* Builds zoo model @name ("resnet-50", "gpt3-175b", "gpt") with @params (may be NULL).
 * Unknown names and unknown or out-of-range parameters are SIM_ERROR_UNKNOWN/INVALID. */
SIM_PUBLIC SimGraph *sim_zoo_build(const char *name, const SimModelParams *params,
                                   GError **error);
/* ONNX models (sim/onnx.c): the graph of FILE.onnx, its symbolic input dimensions
 * ("batch", "seq") set from @params.  Without ONNX support built in (protobuf-c), an
 * error says so and sim_onnx_available() is FALSE. */
SIM_PUBLIC gboolean sim_onnx_available(void);
SIM_PUBLIC SimGraph *sim_onnx_import(const char *path, const SimModelParams *params,
                                     GError **error);
/* One line per operator type the importer does not support ("Erf: 2 nodes, the first
 * '/l/Erf'"); an empty list when it supports them all; NULL with @error on a bad file. */
SIM_PUBLIC char **sim_onnx_check(const char *path, GError **error);

/* A zoo name, a graph file or an ONNX file (FILE.onnx).  A zoo model comes in fp16, the
 * float dtype of the program's default precision (mixed fp16; sim_graph_set_float_dtype()
 * sets another), where sim_zoo_build() builds it in fp32; graph and ONNX files keep their
 * own dtypes. */
SIM_PUBLIC SimGraph *sim_model_load(const char *name_or_file, const SimModelParams *params,
                                    GError **error);

/* ---------------------------------------------------------------------------------- */
/* Devices and machines                                                                */

/* The specification of one accelerator, with the source of its figures. */
typedef struct {
  const char *name;               /* "a100-80gb"                                    */
  const char *vendor_name;        /* "NVIDIA A100 SXM4 80GB"                        */
  double peak_flops[SIM_DTYPE_COUNT]; /* dense FLOP/s per dtype (tensor cores where used) */
  double mem_bandwidth;           /* bytes/s of device memory                      */
  int64_t mem_capacity;           /* bytes                                         */
  int sm_count;                   /* streaming multiprocessors, for wave quantization */
  double launch_overhead;         /* seconds per kernel launch                     */
  const char *source;             /* where the figures come from                   */
  /* Dense FLOP/s of fp32 GEMMs and convolutions on the tensor cores in TF32 (Ampere and
   * later); 0 where the device has no TF32, whose fp32 kernels run on the CUDA cores. */
  double tf32_flops;
  /* The most any matrix product reaches on this device, as a fraction of the peak, in
   * 16-bit types and in fp8: the best shape of a search over shapes (0: not measured). */
  double matmul_fraction, matmul_fraction_fp8;
} SimDeviceSpec;

SIM_PUBLIC int sim_device_library_n(void);
SIM_PUBLIC const SimDeviceSpec *sim_device_library_get(int i);
SIM_PUBLIC const SimDeviceSpec *sim_device_library_lookup(const char *name);

typedef enum {
  SIM_LINK_NVLINK,
  SIM_LINK_NVSWITCH,
  SIM_LINK_PCIE,
  SIM_LINK_INTERSOCKET,  /* QPI/UPI between host bridges */
  SIM_LINK_NIC,          /* PCIe switch to NIC           */
  SIM_LINK_NETWORK,      /* NIC to switch, switch to switch (InfiniBand, Ethernet) */
  SIM_LINK_KIND_COUNT
} SimLinkKind;

SIM_PUBLIC const char *sim_link_kind_name(SimLinkKind k);

typedef struct _SimMachine SimMachine;

/* Loads a machine by library name ("dgx-a100", "dgx-a100:64" for 64 nodes) or from a JSON
 * file ("format": "parasol-machine").  Errors name the file and the place in it. */
SIM_PUBLIC SimMachine *sim_machine_load(const char *name_or_file, GError **error);
SIM_PUBLIC SimMachine *sim_machine_from_json(const char *text, const char *filename,
                                             int node_count_override, GError **error);
SIM_PUBLIC void sim_machine_free(SimMachine *m);
SIM_PUBLIC const char *sim_machine_get_name(const SimMachine *m);
/* Names of the machines in the embedded library, with one-line descriptions. */
SIM_PUBLIC char **sim_machine_library_names(void);
SIM_PUBLIC char *sim_machine_library_description(const char *name);

SIM_PUBLIC int sim_machine_n_devices(const SimMachine *m);
SIM_PUBLIC int sim_machine_n_nodes(const SimMachine *m);
SIM_PUBLIC int sim_machine_device_node(const SimMachine *m, int dev);
/* The index of @dev inside its node (0..gpus per node - 1). */
SIM_PUBLIC int sim_machine_device_local_rank(const SimMachine *m, int dev);
SIM_PUBLIC int sim_machine_node_n_devices(const SimMachine *m, int node);
SIM_PUBLIC const SimDeviceSpec *sim_machine_device_spec(const SimMachine *m, int dev);
SIM_PUBLIC int sim_machine_n_links(const SimMachine *m);
SIM_PUBLIC SimLinkKind sim_machine_link_kind(const SimMachine *m, int link);
SIM_PUBLIC double sim_machine_link_bandwidth(const SimMachine *m, int link); /* bytes/s */
SIM_PUBLIC double sim_machine_link_latency(const SimMachine *m, int link);   /* seconds */
/* "node3/gpu2->nvswitch" */
SIM_PUBLIC const char *sim_machine_link_name(const SimMachine *m, int link);
/* The route from device @src to device @dst as directed link ids (transfer none; valid
 * while the machine lives).  @src == @dst gives zero links. */
SIM_PUBLIC const int *sim_machine_route(SimMachine *m, int src, int dst, int *n_links);
/* Bottleneck bandwidth (bytes/s) and summed latency (s) of the route. */
SIM_PUBLIC double sim_machine_bandwidth(SimMachine *m, int src, int dst);
SIM_PUBLIC double sim_machine_latency(SimMachine *m, int src, int dst);
SIM_PUBLIC char *sim_machine_to_json(const SimMachine *m);

/* ---------------------------------------------------------------------------------- */
/* Cost models                                                                         */

/* The kernels an operator shard runs in one pass; the cost model prices each. */
typedef enum {
  SIM_KERNEL_GEMM,        /* batch x (m x k) . (k x n)                                */
  SIM_KERNEL_CONV,        /* implicit GEMM: m = n*ho*wo, n = c_out, k = c_in*kh*kw/g    */
  SIM_KERNEL_MEMORY,      /* element-wise, normalization, softmax: bandwidth bound      */
  SIM_KERNEL_GATHER,      /* embedding lookups and their scatter-add backward           */
  SIM_KERNEL_RECURRENT,   /* an LSTM step loop: GEMMs that run one after the other      */
  SIM_KERNEL_OPTIMIZER,   /* the weight update                                         */
  SIM_KERNEL_ATTENTION,   /* fused (flash) attention: batch = b*heads, m = sq, n = skv,
                           * k = head dim; flags say causal and backward               */
  SIM_KERNEL_KIND_COUNT
} SimKernelKind;

typedef struct {
  SimKernelKind kind;
  SimDType dtype;
  int64_t m, n, k, batch;  /* GEMM-like kernels; batch >= 1                          */
  int64_t steps;           /* recurrent kernels: sequential steps                      */
  double flops;
  double bytes;            /* read + written                                         */
  int flags;               /* SIM_KERNEL_CAUSAL, SIM_KERNEL_BACKWARD (attention)       */
  int op_type;             /* the SimOpType whose work it is, + 1 (0: not known)      */
  int pass;                /* the SimPass it belongs to, when op_type is known        */
} SimKernel;

/* Flags of a fused attention kernel. */
#define SIM_KERNEL_CAUSAL 1   /* a causal mask: the blocks above the diagonal are skipped */
#define SIM_KERNEL_BACKWARD 2 /* the backward kernel (recomputes the scores)              */

SIM_PUBLIC const char *sim_kernel_kind_name(SimKernelKind k);

typedef enum { SIM_PASS_FORWARD, SIM_PASS_BACKWARD, SIM_PASS_UPDATE, SIM_PASS_COUNT } SimPass;
SIM_PUBLIC const char *sim_pass_name(SimPass p);

#define SIM_MAX_KERNELS 16
typedef struct {
  int n;
  SimKernel k[SIM_MAX_KERNELS];
} SimWork;

/* The work of op @op of @g in @pass when its iteration dimensions have the extents
 * @extent (one shard).  NULL @extent means the whole operator. */
SIM_PUBLIC void sim_graph_op_work(const SimGraph *g, int op, const int64_t *extent, SimPass pass,
                                  SimWork *work);
SIM_PUBLIC double sim_work_flops(const SimWork *w);
SIM_PUBLIC double sim_work_bytes(const SimWork *w);
/* A key that identifies the shard's shapes for profile databases, e.g.
 * "linear|x=[8,1024,4096]|w=[4096,1024]|fp16|act=none". */
SIM_PUBLIC char *sim_graph_op_shard_key(const SimGraph *g, int op, const int64_t *extent);

typedef struct _SimCostModel SimCostModel;

/* A cost model is a struct of function pointers (docs/extending.md).  New slots go at the end. */
#define SIM_COST_MODEL_API_VERSION 1
typedef struct {
  int api_version;           /* SIM_COST_MODEL_API_VERSION                          */
  const char *name;
  /* Required: the time of one kernel on @dev, in seconds, launch overhead included. */
  double (*kernel_time)(SimCostModel *self, const SimDeviceSpec *dev, const SimKernel *k);
  /* Optional (NULL: price each kernel of the work): the time of a whole operator shard
   * in @pass, or a negative number when this model does not know it, in which case the
   * kernels of the work are priced by the fallback model. */
  double (*op_time)(SimCostModel *self, const SimDeviceSpec *dev, const SimGraph *g, int op,
                    const int64_t *extent, SimPass pass);
  /* Optional: releases the model's private data. */
  void (*finalize)(SimCostModel *self);
} SimCostModelClass;

struct _SimCostModel {
  const SimCostModelClass *klass;
  SimCostModel *fallback;    /* consulted when op_time answers negative; may be NULL */
  void *priv;
};

/* Roofline efficiencies: achieved fractions of peak FLOP/s and memory bandwidth. */
typedef struct {
  double gemm_efficiency;      /* large, well-shaped GEMMs                              */
  double conv_efficiency;
  double memory_efficiency;    /* streaming kernels                                    */
  double gather_efficiency;
  double recurrent_efficiency;
  gboolean tile_quantization;  /* model tile and wave quantization of GEMMs            */
  /* The output tile of a GEMM thread block.  0 x 0: each GEMM takes the tile shape and the
   * split of its reduction (split-K) that make it fastest, as the libraries' heuristics
   * choose them (roofline.c); otherwise this one tile, never split. */
  int tile_m, tile_n;
  /* A GEMM's fixed cost beyond its launch: filling and draining the tensor-core pipeline,
   * prologue and epilogue.  It makes small GEMMs less efficient than large ones. */
  double gemm_latency;
  /* Each output tile of a GEMM streams its reduction dimension K through a pipeline whose
   * start (filling the shared-memory stages) and end (the epilogue that converts and
   * writes the tile) cost about as much as this many more elements of K: a GEMM's work
   * counts as (K + gemm_k_overhead) / K times its FLOPs.  Short reductions (small hidden
   * sizes, tensor-parallel shards of them, attention's head dimension) lose the most.
   * 0: none. */
  double gemm_k_overhead;
  /* The fraction of its aligned rate a GEMM reaches when one of its dimensions is not a
   * multiple of 16 bytes (8 fp16 or bf16 elements, 4 fp32): cuBLAS's fast tensor-core
   * kernels load 16 bytes at a time and need every leading dimension aligned to it, so an
   * odd vocabulary of 50,257 runs its projection on slower kernels (NVIDIA's Matrix
   * Multiplication Background guide, "Tensor Core Requirements"; nanoGPT pads GPT-2's
   * vocabulary to 50,304 for this).  0 or 1: no penalty. */
  double gemm_unaligned_efficiency;
  /* The most any GEMM reaches, as a fraction of the tensor-core peak, counted in its
   * useful FLOPs (2 M N K): the best shape a device's BLAS runs.  The efficiency above
   * and the tile pipeline's cost describe how the rate grows with K; this caps it where
   * measurement says no shape goes further (A100 SXM: 271.2 of 312 TFLOP/s in bf16,
   * the best of a sweep of shapes in S. Bekman's "Maximum Achievable Matmul FLOPS"
   * table, github.com/stas00/ml-engineering, compute/accelerator).  0: no cap. */
  double gemm_ceiling;
  /* fp32 GEMMs and convolutions run on the tensor cores in TF32 where the device has it
   * (tf32_flops): PyTorch's cudnn.allow_tf32 (on by default) and matmul.allow_tf32, both on
   * in NVIDIA's containers.  Storage and traffic stay fp32. */
  gboolean tf32;
  /* Fused (flash) attention: the achieved fraction of the tensor-core peak in the main
   * loops of the forward and the backward kernels, over the FLOPs they execute. */
  double attention_efficiency;
  double attention_bwd_efficiency;
  /* The linear layers' GEMMs (batch 1, 16-bit) run at the FP8 peak where the device has
   * one: Transformer Engine's FP8 training, whose casts hide in the kernels around them. */
  gboolean fp8;
  /* Tensors in NCHW (PyTorch's default layout), not NHWC (channels_last): cuDNN's
   * tensor-core convolutions (16-bit and TF32) work in NHWC, so each one transposes its
   * input and its output around the kernel, two more passes over both. */
  gboolean conv_nchw;
  /* A framework's own bandwidth-bound kernels per operator type and pass (its dropout,
   * its layer norm's backward...): the fraction of the bandwidth each reaches, 0 where
   * memory_efficiency applies.  Indexed [SimOpType][SimPass]. */
  double memory_efficiency_by_op[SIM_OP_COUNT][SIM_PASS_COUNT];
  /* GEMMs and convolutions on the CUDA cores (fp32 without TF32): the achieved fraction of
   * the fp32 peak, which fused multiply-adds reach more easily than tensor cores reach
   * theirs.  0: gemm_efficiency and conv_efficiency as for the tensor cores. */
  double cuda_core_efficiency;
} SimRooflineParams;

SIM_PUBLIC SimRooflineParams sim_roofline_params_default(void);
/* With @p->fp8, the time the roofline adds to a linear layer's GEMM @k for scaling and
 * casting its two operands to FP8 (sim/roofline.c); 0 for any other kernel. */
SIM_PUBLIC double sim_roofline_fp8_cast_seconds(const SimRooflineParams *p,
                                                const SimDeviceSpec *dev, const SimKernel *k);
SIM_PUBLIC SimCostModel *sim_cost_model_new_roofline(const SimRooflineParams *params);
SIM_PUBLIC void sim_cost_model_free(SimCostModel *m);
SIM_PUBLIC double sim_cost_model_kernel_time(SimCostModel *m, const SimDeviceSpec *dev,
                                             const SimKernel *k);
/* The time of an operator shard in @pass: op_time of the stack if one answers, else the
 * sum of its kernels' times. */
SIM_PUBLIC double sim_cost_model_op_time(SimCostModel *m, const SimDeviceSpec *dev,
                                         const SimGraph *g, int op, const int64_t *extent,
                                         SimPass pass);

/* ---------------------------------------------------------------------------------- */
/* Strategies                                                                          */

typedef enum {
  SIM_SCHEDULE_GPIPE,
  SIM_SCHEDULE_1F1B,
  SIM_SCHEDULE_INTERLEAVED,   /* interleaved 1F1B with several model chunks per stage */
} SimSchedule;

typedef enum {
  SIM_ALLREDUCE_RING,
  SIM_ALLREDUCE_TREE,
  SIM_ALLREDUCE_HIERARCHICAL,
} SimAllreduceAlgo;

typedef enum {
  SIM_RECOMPUTE_NONE,
  SIM_RECOMPUTE_SELECTIVE,
  SIM_RECOMPUTE_FULL,
} SimRecompute;

typedef enum {
  SIM_PRECISION_FP32,
  SIM_PRECISION_MIXED_FP16,  /* fp16 compute, fp32 master weights */
  SIM_PRECISION_MIXED_BF16,
  SIM_PRECISION_TF32,        /* fp32 tensors, GEMMs and convolutions on TF32 tensor cores */
  SIM_PRECISION_FP8,         /* mixed bf16 with the linear layers' GEMMs in FP8
                              * (Transformer Engine), on GPUs that have FP8 */
} SimPrecision;

/* Whether @p trains with 16-bit weights and fp32 master weights. */
#define SIM_PRECISION_IS_MIXED(p) \
  ((p) == SIM_PRECISION_MIXED_FP16 || (p) == SIM_PRECISION_MIXED_BF16 || (p) == SIM_PRECISION_FP8)

typedef enum { SIM_OPTIMIZER_SGD, SIM_OPTIMIZER_ADAM } SimOptimizer;

SIM_PUBLIC const char *sim_schedule_name(SimSchedule s);
SIM_PUBLIC const char *sim_allreduce_algo_name(SimAllreduceAlgo a);
SIM_PUBLIC const char *sim_recompute_name(SimRecompute r);
SIM_PUBLIC const char *sim_precision_name(SimPrecision p);
/* The same enumerations by name, as strategy files and the command line spell them (any
 * case); -1 for an unknown name. */
SIM_PUBLIC int sim_schedule_from_name(const char *name);
SIM_PUBLIC int sim_allreduce_algo_from_name(const char *name);
SIM_PUBLIC int sim_recompute_from_name(const char *name);
SIM_PUBLIC int sim_precision_from_name(const char *name);

typedef struct _SimStrategy SimStrategy;

/* A strategy for @g on @m with every operator on device 0, one stage, one micro-batch. */
SIM_PUBLIC SimStrategy *sim_strategy_new(const SimGraph *g, const SimMachine *m);
SIM_PUBLIC SimStrategy *sim_strategy_copy(const SimStrategy *s);
SIM_PUBLIC void sim_strategy_free(SimStrategy *s);
SIM_PUBLIC gboolean sim_strategy_equal(const SimStrategy *a, const SimStrategy *b);

/* Per-operator configuration: a degree for each iteration dimension and the devices of
 * the shards, in row-major order of the shard coordinates (the last dimension fastest).
 * @devices holds the product of the degrees entries. */
SIM_PUBLIC gboolean sim_strategy_set_op(SimStrategy *s, int op, const int *degrees,
                                        const int *devices, GError **error);
SIM_PUBLIC const int *sim_strategy_op_degrees(const SimStrategy *s, int op);
SIM_PUBLIC const int *sim_strategy_op_devices(const SimStrategy *s, int op, int *n);
SIM_PUBLIC int sim_strategy_op_n_shards(const SimStrategy *s, int op);

/* Pipeline: stage @i owns ops and a device group; sim_strategy_set_stages() replaces all
 * stages.  @op_stage gives the stage of every op; stage i runs on @stage_devices[i]
 * (@stage_n_devices[i] entries).  With the interleaved schedule, stage i runs on device
 * group i % (n_stages / chunks). */
SIM_PUBLIC gboolean sim_strategy_set_stages(SimStrategy *s, int n_stages, const int *op_stage,
                                            const int *const *stage_devices,
                                            const int *stage_n_devices, GError **error);
SIM_PUBLIC int sim_strategy_n_stages(const SimStrategy *s);
SIM_PUBLIC int sim_strategy_op_stage(const SimStrategy *s, int op);
SIM_PUBLIC void sim_strategy_set_microbatches(SimStrategy *s, int n);
SIM_PUBLIC int sim_strategy_get_microbatches(const SimStrategy *s);
SIM_PUBLIC void sim_strategy_set_schedule(SimStrategy *s, SimSchedule sched, int chunks);
SIM_PUBLIC SimSchedule sim_strategy_get_schedule(const SimStrategy *s, int *chunks);
/* Whether the tensor-parallel ranks split the sequence outside their GEMMs (Megatron's
 * sequence parallelism). */
SIM_PUBLIC gboolean sim_strategy_get_sequence_parallel(const SimStrategy *s);
/* Context parallelism (ring attention) over @cp ranks: every self-attention operator whose
 * query positions are split reads only its own positions of the keys and values and
 * receives the others' keys and values around the ring of the shards that split its
 * positions (sim/lower.c); 0 or 1: none (a shard of query positions then reads the whole
 * key and value input, the way an operator split by position reads its inputs).  The
 * Megatron builder sets it with SimMegatronOptions.cp. */
SIM_PUBLIC void sim_strategy_set_context_parallel(SimStrategy *s, int cp);
SIM_PUBLIC int sim_strategy_get_context_parallel(const SimStrategy *s);

typedef struct {
  SimAllreduceAlgo algorithm;
  int64_t bucket_bytes;       /* 0: one collective per weight                        */
  gboolean overlap;           /* start gradient sync during the backward pass        */
} SimSyncOptions;

typedef struct {
  SimRecompute recompute;
  gboolean zero1;             /* shard optimizer states over data-parallel replicas   */
  SimPrecision precision;
  SimOptimizer optimizer;
  /* ZeRO-2: with zero1, the gradients sharded too (each replica keeps the part of the
   * reduce-scattered gradients it updates); the communication is zero1's. */
  gboolean zero2;
  /* ZeRO-3 (FSDP's full sharding): with zero1 and zero2, the weights sharded too.  Each
   * bucket of weights is all-gathered before every micro-batch's forward and again before
   * its backward (one bucket ahead of the compute that needs it, as FSDP prefetches), and
   * its gradients are reduce-scattered after every micro-batch's backward; no all-gather
   * follows the update. */
  gboolean zero3;
} SimMemoryOptions;

SIM_PUBLIC void sim_strategy_set_sync(SimStrategy *s, const SimSyncOptions *o);
SIM_PUBLIC SimSyncOptions sim_strategy_get_sync(const SimStrategy *s);
SIM_PUBLIC void sim_strategy_set_memory(SimStrategy *s, const SimMemoryOptions *o);
SIM_PUBLIC SimMemoryOptions sim_strategy_get_memory(const SimStrategy *s);

/* Graph rewrites (substitutions) the strategy was found with, by name and in the order
 * they were applied; the search records them and applies them to the model before the
 * configurations, which name the rewritten graph's operators, refer to it. */
SIM_PUBLIC void sim_strategy_add_rewrite(SimStrategy *s, const char *name);
SIM_PUBLIC int sim_strategy_n_rewrites(const SimStrategy *s);
SIM_PUBLIC const char *sim_strategy_rewrite(const SimStrategy *s, int i);
SIM_PUBLIC void sim_strategy_clear_rewrites(SimStrategy *s);

/* Validates against the graph and machine: degrees that divide their dimensions (the
 * sample dimension per micro-batch), existing devices, stages that cover every op,
 * consistent device groups.  Messages name the operator and the dimension. */
SIM_PUBLIC gboolean sim_strategy_validate(const SimStrategy *s, const SimGraph *g,
                                          const SimMachine *m, GError **error);
/* The same checks for operator @op alone, and that its shards run on its stage's devices:
 * enough after a change to one operator's configuration (degrees, devices) of a valid
 * strategy. */
SIM_PUBLIC gboolean sim_strategy_validate_op(const SimStrategy *s, const SimGraph *g,
                                             const SimMachine *m, int op, GError **error);

/* JSON ("format": "parasol-strategy", "version": 1).  Operators are named. */
SIM_PUBLIC char *sim_strategy_to_json(const SimStrategy *s, const SimGraph *g);
SIM_PUBLIC SimStrategy *sim_strategy_from_json(const char *text, const char *filename,
                                               const SimGraph *g, const SimMachine *m,
                                               GError **error);
SIM_PUBLIC SimStrategy *sim_strategy_load(const char *path, const SimGraph *g,
                                          const SimMachine *m, GError **error);
SIM_PUBLIC gboolean sim_strategy_save(const SimStrategy *s, const SimGraph *g, const char *path,
                                      GError **error);
/* A strategy file found with graph rewrites ("rewrites") names the rewritten graph's
 * operators.  This reads it in one parse: @rewrite turns @g into the graph the file names
 * (the rewrites it records, in order; libsearch's search_strategy_load() passes its
 * rewriter), and @graph receives that graph (transfer full; a copy of @g when the file
 * records none), against which the strategy is read and validated. */
typedef SimGraph *(*SimGraphRewriteFunc)(const SimGraph *g, const char *const *names,
                                         gpointer data, GError **error);
SIM_PUBLIC SimStrategy *sim_strategy_load_rewritten(const char *path, const SimGraph *g,
                                                    const SimMachine *m,
                                                    SimGraphRewriteFunc rewrite, gpointer data,
                                                    SimGraph **graph, GError **error);

/* The names of the rewrites a strategy file records, in order (an empty list when it
 * records none), without reading the rest of it against a graph: for tools that show the
 * rewritten graph.  NULL with @error naming the file and place when it cannot be read. */
SIM_PUBLIC char **sim_strategy_file_rewrites(const char *path, GError **error);

/* Builders. */
/* Every op data parallel over @n_devices devices starting at device 0 (sample dims split
 * as far as they divide), weights replicated. */
SIM_PUBLIC SimStrategy *sim_strategy_data_parallel(const SimGraph *g, const SimMachine *m,
                                                   int n_devices, GError **error);

typedef struct {
  int dp, tp, pp;
  int microbatches;           /* 0: derived from global batch and micro-batch size    */
  int64_t microbatch_size;    /* samples per micro-batch per data-parallel replica    */
  SimSchedule schedule;
  int chunks;                 /* model chunks per stage (interleaved)                 */
  gboolean sequence_parallel;
  gboolean scatter_gather;    /* pipeline messages split over the tensor-parallel ranks */
  SimSyncOptions sync;
  SimMemoryOptions memory;
  /* Expert parallelism: every mixture-of-experts op splits its experts over @ep of the
   * @dp data-parallel replicas (consecutive ones) and its samples over dp / ep; 0 or 1:
   * none.  Must divide dp and every such op's experts. */
  int ep;
  /* Context parallelism: every op's positions (its first attribute dimension) split over
   * cp ranks between the tensor- and the data-parallel ones (Megatron's order: tp, cp,
   * dp, pp), ops without positions that divide repeated on each; attention as a ring
   * (sim_strategy_set_context_parallel()).  0 or 1: none.  Not with ep. */
  int cp;
} SimMegatronOptions;

SIM_PUBLIC SimMegatronOptions sim_megatron_options_default(void);
/* Megatron-style plan: tensor parallelism inside the group of @tp consecutive devices
 * (column-parallel, then row-parallel linear layers; attention heads split; vocabulary-
 * parallel embedding and loss), @pp pipeline stages of consecutive layers, @dp replicas.
 * Rank order: tensor fastest, then data, then pipeline (Megatron's initialize_model_parallel
 * and DeepSpeed's pipe-data-model topology): a stage's devices are consecutive. */
SIM_PUBLIC SimStrategy *sim_strategy_megatron(const SimGraph *g, const SimMachine *m,
                                              const SimMegatronOptions *o, GError **error);

/* ---------------------------------------------------------------------------------- */
/* Simulation                                                                          */

typedef enum {
  SIM_DETAIL_STEPS,       /* collectives expanded into per-step transfers on real links  */
  SIM_DETAIL_FLOWS,       /* one flow per peer and collective, analytic step latencies   */
  SIM_DETAIL_COLLECTIVE,  /* one flow per collective over all the links it crosses, with
                           * its algorithm's analytic latency                         */
} SimDetail;

SIM_PUBLIC const char *sim_detail_name(SimDetail d);

/* Measured all-reduce times inside one node, by group size and message size
 * (colltable.c): CSV "gpus,bytes,seconds", as nccl-tests' all_reduce_perf measures them. */
#define SIM_COLL_TABLE_MAX_GPUS 64
typedef struct _SimCollTable SimCollTable;
SIM_PUBLIC SimCollTable *sim_coll_table_load(const char *path, GError **error);
SIM_PUBLIC void sim_coll_table_free(SimCollTable *t);
SIM_PUBLIC const char *sim_coll_table_path(const SimCollTable *t);
/* The measured time of an all-reduce of @bytes over @n GPUs, interpolated between the
 * measured sizes; outside their range, the time of the nearest measured size, whose size
 * goes to *at_bytes (else @bytes does).  -1 when no group of @n GPUs was measured. */
SIM_PUBLIC double sim_coll_table_lookup(const SimCollTable *t, int n, double bytes,
                                        double *at_bytes);

typedef struct {
  SimDetail detail;
  gboolean fold;           /* simulate one of each set of symmetric devices            */
  gboolean keep_timeline;  /* record every task's start and end (traces, tests)        */
  /* Collectives: achieved fraction of link bandwidth (0 takes the default) and the fixed
   * cost of one algorithm step (negative takes the default). */
  double coll_bandwidth_efficiency;
  /* The same on NIC and network links (InfiniBand, Ethernet), whose achieved fraction of
   * line rate differs from NVLink's; 0: coll_bandwidth_efficiency. */
  double net_bandwidth_efficiency;
  double coll_step_latency;
  /* The fixed cost of one collective (its kernel's launch and the ranks' handshake);
   * negative takes the default, 0 none. */
  double coll_base_latency;
  /* The host's time to issue one kernel (a framework's dispatch and the launch call).
   * The host issues a device's kernels in stream order and waits for the transfers a
   * task receives from other pipeline stages; a task starts only once issued.  The
   * optimizer step counts no kernel of its own (fused optimizers update many tensors per
   * launch).  0: the host is never the bottleneck. */
  double host_kernel_time;
  /* The host's time between two steps of a device's schedule (a micro-batch's forward
   * or backward, the optimizer step): the training loop's own work before it issues the
   * step's first kernel (fetching the batch, setting up transfers, bookkeeping the loss).
   * 0: none. */
  double host_step_time;
  /* The host blocks after it sends to another device until the transfer has ended, so the
   * device's next kernels are issued only then (Megatron's point-to-point exchange between
   * pipeline stages waits on its requests and then calls torch.cuda.synchronize()).
   * FALSE: sends are asynchronous and the host runs on. */
  gboolean blocking_sends;
  /* Measured all-reduce times (NULL: none).  An all-reduce whose ranks share one node
   * and whose group size the table holds costs the measured time on an idle network:
   * the table sets its fixed cost, the ring's flows still share the links.  Borrowed:
   * it must outlive the simulations that use it. */
  const SimCollTable *allreduce_table;
  /* sim_simulate_brief() only: stop the run, cut, as soon as some device holds more than
   * its memory, which a search that rejects every plan that does not fit needs to know
   * and no more (SimBrief.overflowed then says so).  Reports always run to the end. */
  gboolean stop_at_overflow;
  /* Cancellation (NULL: none): a simulation polls this flag (between the lowering and the
   * run, and every few thousand events of the run) and, once it is nonzero, stops and
   * fails with SIM_ERROR_CANCELLED; a delta session's run ends cut, its time +inf.  A
   * search sets it at its deadline and on a signal, so a long simulation does not outlive
   * the budget.  Borrowed: it must outlive the simulations that use it. */
  const atomic_int *cancel;
  /* Exact accelerations of one simulation (docs/scale.md), on by default; each changes
   * how long a simulation takes, never (beyond a relative 1e-9) what it predicts.
   * merge_chains: a run of compute tasks that follow each other on a device, each
   * waiting only for the one before, runs as one task (not with host times, blocking
   * sends or keep_timeline, which need each task).  merge_rings: a collective's ring
   * lowered as a flow per rank runs as one flow where no other traffic crosses its links
   * (not with keep_timeline). */
  gboolean merge_chains;
  gboolean merge_rings;
  /* steady_state: a 1F1B or interleaved schedule with many micro-batches is simulated over
   * a few of them, and where the middle ones repeat each other exactly, the others are
   * added as whole periods (not with keep_timeline or GPipe; sim_simulate() runs two such
   * runs to measure what a period adds to every figure of the report). */
  gboolean steady_state;
} SimOptions;

SIM_PUBLIC SimOptions sim_options_default(void);

typedef struct _SimReport SimReport;

/* Simulates one training iteration.  Returns NULL with @error set on invalid input; an
 * out-of-memory strategy still yields a report, whose sim_report_fits() is FALSE. */
SIM_PUBLIC SimReport *sim_simulate(const SimGraph *g, SimMachine *m, const SimStrategy *s,
                                   SimCostModel *cost, const SimOptions *o, GError **error);
/* The plan of @o with the largest micro-batch that fits in device memory, for a plan
 * whose one micro-batch per replica does not: micro-batches of half, a quarter, ... of
 * the samples a device holds (those sizes that divide it), each built with
 * sim_strategy_megatron() and simulated with @so, until one fits (strategy-build.c).
 * Returns NULL when none fits; else the strategy, its report in @report and its
 * micro-batch size in @microbatch_size. */
SIM_PUBLIC SimStrategy *sim_strategy_megatron_fit(const SimGraph *g, SimMachine *m,
                                                  const SimMegatronOptions *o,
                                                  SimCostModel *cost, const SimOptions *so,
                                                  SimReport **report, int64_t *microbatch_size);
SIM_PUBLIC void sim_report_free(SimReport *r);
SIM_PUBLIC double sim_report_iteration_time(const SimReport *r);
SIM_PUBLIC double sim_report_throughput(const SimReport *r);      /* samples/s */
SIM_PUBLIC double sim_report_token_throughput(const SimReport *r);
SIM_PUBLIC double sim_report_mfu(const SimReport *r);
SIM_PUBLIC gboolean sim_report_fits(const SimReport *r);
SIM_PUBLIC int64_t sim_report_peak_memory(const SimReport *r, int dev);
SIM_PUBLIC int64_t sim_report_max_peak_memory(const SimReport *r);
SIM_PUBLIC double sim_report_compute_time(const SimReport *r, int dev);
SIM_PUBLIC double sim_report_comm_time(const SimReport *r, int dev);
SIM_PUBLIC int64_t sim_report_n_tasks(const SimReport *r);
SIM_PUBLIC double sim_report_overlap_time(const SimReport *r, int dev);
SIM_PUBLIC double sim_report_idle_time(const SimReport *r, int dev);
SIM_PUBLIC int sim_report_n_devices(const SimReport *r);
/* Whether symmetric devices were folded, in words ("data-parallel replicas and
 * tensor-parallel ranks", "none"). */
SIM_PUBLIC const char *sim_report_folding(const SimReport *r);
/* How the steady state of the schedule was extrapolated, in words ("35 and 36 of 192
 * micro-batches, then 0.0712 s per micro-batch"), or NULL where every micro-batch was
 * simulated (SimOptions.steady_state). */
SIM_PUBLIC const char *sim_report_steady(const SimReport *r);
/* Time of the critical path spent in tasks of @cls ("forward", "backward", "recompute",
 * "update", "transfer", "reduction", "grad-sync", "param-sync") or waiting ("idle"). */
SIM_PUBLIC double sim_report_critical_time(const SimReport *r, const char *cls);
/* The recorded timeline (with keep_timeline): task @i's kind ("compute", "flow", "delay",
 * "nop"), class, device, peer, operator, micro-batch, start and end. */
typedef struct {
  const char *kind;
  const char *cls;
  int device, peer, op, mb, shard;
  double bytes;
  double start, end;
} SimTaskRecord;
SIM_PUBLIC int64_t sim_report_n_records(const SimReport *r);
SIM_PUBLIC gboolean sim_report_record(const SimReport *r, int64_t i, SimTaskRecord *out);
SIM_PUBLIC void sim_report_print(const SimReport *r, FILE *out);
SIM_PUBLIC char *sim_report_to_json(const SimReport *r);
SIM_PUBLIC gboolean sim_report_write_trace(const SimReport *r, const char *path, GError **error);
/* The same, keeping only the tracks of @devices (NULL: all): their compute and
 * communication, and the links of the transfers and collectives they take part in.
 * @n_events, if given, receives the number of timed events written. */
SIM_PUBLIC gboolean sim_report_write_trace_devices(const SimReport *r, const char *path,
                                                   const int *devices, int n_devices,
                                                   int64_t *n_events, GError **error);

/* What a search needs of one simulation, without a report. */
typedef struct {
  double time;        /* the iteration time; after a cut, a lower bound past the bound
                       * (past an overflow, the time the run had reached)                */
  gboolean cut;       /* the run stopped at its bound (or, asked to, at an overflow)     */
  gboolean fits;      /* every device within its memory (as far as the run went)         */
  gboolean overflowed;/* some device over its memory by the end of the run, cut or not   */
  double max_ratio;   /* the largest ratio of peak memory to capacity                    */
} SimBrief;

/* sim_simulate() without the report, folding as it does, with the engine stopping at the
 * first event past @bound seconds (INFINITY: none): a run past the bound ends cut, its
 * time then a lower bound of the iteration time.  With SimOptions.stop_at_overflow it also
 * ends cut, overflowed, when a device first holds more than its memory.  Up to the bound
 * the run is sim_simulate()'s, so a run that is not cut has its time and memory.  FALSE with @error
 * for a strategy that is not valid or whose schedule cannot run. */
SIM_PUBLIC gboolean sim_simulate_brief(const SimGraph *g, SimMachine *m, const SimStrategy *s,
                                       SimCostModel *cost, const SimOptions *o, double bound,
                                       SimBrief *out, GError **error);

/* Delta simulation: a simulator that keeps its task graph and timeline between calls.
 * After sim_session_set_op() changes some operators, sim_session_run() re-lowers and
 * re-simulates only what the changes touch.  Results equal those of sim_simulate(). */
typedef struct _SimSession SimSession;
SIM_PUBLIC SimSession *sim_session_new(const SimGraph *g, SimMachine *m, const SimStrategy *s,
                                       SimCostModel *cost, const SimOptions *o, GError **error);
SIM_PUBLIC void sim_session_free(SimSession *ss);
SIM_PUBLIC gboolean sim_session_set_op(SimSession *ss, int op, const int *degrees,
                                       const int *devices, GError **error);
SIM_PUBLIC double sim_session_run(SimSession *ss);
/* The same, but the engine stops at the first event past @bound seconds: the result is
 * then a lower bound of the iteration time, above @bound, and sim_session_cut() is TRUE
 * (a search that only asks whether a candidate beats a threshold needs no more).  Up to
 * the bound the run is the unbounded one; a later call with a larger bound, or
 * sim_session_run(), sim_session_report() and sim_session_memory(), run it again. */
SIM_PUBLIC double sim_session_run_bounded(SimSession *ss, double bound);
SIM_PUBLIC gboolean sim_session_cut(const SimSession *ss);
SIM_PUBLIC const SimStrategy *sim_session_get_strategy(const SimSession *ss);
SIM_PUBLIC SimReport *sim_session_report(SimSession *ss);
/* What a search needs of the last run without building a report: the largest ratio of a
 * device's peak memory to its capacity, and whether every device fits (as the report's
 * peak_memory_bytes and fits say).  FALSE if the last run deadlocked. */
SIM_PUBLIC gboolean sim_session_memory(SimSession *ss, double *max_ratio, gboolean *fits);
/* Where the last sim_session_run*() spent its wall time, in seconds: re-lowering the
 * changed operators, assembling the flat task graph, running the engine (0 for a phase
 * it did not need).  For benchmarks; the clock costs three reads a run. */
SIM_PUBLIC void sim_session_last_phases(const SimSession *ss, double *relower, double *assemble,
                                        double *engine);

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
SIM_PUBLIC SimPlan *sim_plan_new(const SimGraph *g, SimMachine *m, const SimStrategy *s,
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
G_DEFINE_AUTOPTR_CLEANUP_FUNC(SimGraph, sim_graph_free)
G_DEFINE_AUTOPTR_CLEANUP_FUNC(SimAttrs, sim_attrs_free)
G_DEFINE_AUTOPTR_CLEANUP_FUNC(SimModelParams, sim_model_params_free)
G_DEFINE_AUTOPTR_CLEANUP_FUNC(SimMachine, sim_machine_free)
G_DEFINE_AUTOPTR_CLEANUP_FUNC(SimCostModel, sim_cost_model_free)
G_DEFINE_AUTOPTR_CLEANUP_FUNC(SimStrategy, sim_strategy_free)
G_DEFINE_AUTOPTR_CLEANUP_FUNC(SimReport, sim_report_free)
G_DEFINE_AUTOPTR_CLEANUP_FUNC(SimSession, sim_session_free)

G_END_DECLS
