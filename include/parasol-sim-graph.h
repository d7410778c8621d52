/* parasol-sim-graph.h — part of libsim's public interface (parasol-sim.h, which includes
 * every part): the operator catalogue and graphs: builders, attributes, queries, totals,
 * iteration spaces, shard regions, JSON. */
#pragma once

#include "parasol-sim-core.h"

G_BEGIN_DECLS

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
/* Sets every mixture-of-experts operator's "capacity_factor" (@capacity_factor, 0 or
 * more; 0: dropless) and "imbalance" (@imbalance, 1 or more), each where not NaN
 * (sim/ops/moe.c).  FALSE with @error, changing nothing, for a value out of range or a
 * graph without such an operator. */
SIM_PUBLIC gboolean sim_graph_set_moe_routing(SimGraph *g, double capacity_factor,
                                              double imbalance, GError **error);

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

G_DEFINE_AUTOPTR_CLEANUP_FUNC(SimGraph, sim_graph_free)
G_DEFINE_AUTOPTR_CLEANUP_FUNC(SimAttrs, sim_attrs_free)

G_END_DECLS
