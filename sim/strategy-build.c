/* strategy-build.c — strategies built from a few numbers: data parallelism, and the
 * Megatron-LM plan of tensor, pipeline and data parallelism (Shoeybi et al. 2019,
 * Narayanan et al. 2021).
 *
 * The Megatron builder reads the graph's structure, never its operator names: which linear
 * layers pair up as column- then row-parallel follows from the way their outputs flow
 * through element-wise operators into the next linear layer, and which dimension each
 * operator splits follows from the roles of its iteration space.  It therefore applies to
 * any transformer-like graph the zoo or a file provides. */
#include "sim-private.h"

/* ---------------------------------------------------------------------------------- */
/* Data parallelism                                                                   */

static int largest_divisor_at_most(int64_t size, int n)
{
  for (int k = n; k > 1; k--)
    if (size % k == 0)
      return k;
  return 1;
}

SimStrategy *sim_strategy_data_parallel(const SimGraph *g, const SimMachine *m, int n_devices,
                                        GError **error)
{
  g_return_val_if_fail(g != NULL && m != NULL, NULL);

  int have = sim_machine_n_devices(m);
  if (n_devices < 1 || n_devices > have) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                "data parallelism over %d devices, but machine '%s' has %d", n_devices,
                sim_machine_get_name(m), have);
    return NULL;
  }
  g_autoptr(SimStrategy) s = sim_strategy_new(g, m);
  int n_ops = sim_graph_n_ops(g);
  g_autofree int *devices = g_new(int, n_devices);
  for (int i = 0; i < n_devices; i++)
    devices[i] = i;
  for (int op = 0; op < n_ops; op++) {
    const SimStrategyOpInfo *info = &s->layout->ops[op];
    int degrees[SIM_MAX_ITER];
    for (int d = 0; d < SIM_MAX_ITER; d++)
      degrees[d] = 1;
    /* An operator whose samples do not split n ways (a batch of 12 over 8 devices) runs
     * on as many devices as divide it, rather than not at all. */
    if (info->ndims > 0 && info->dims[0].splittable)
      degrees[0] = largest_divisor_at_most(info->dims[0].size, n_devices);
    if (!sim_strategy_set_op(s, op, degrees, devices, error))
      return NULL;
  }
  g_autofree int *op_stage = g_new0(int, MAX(n_ops, 1));
  const int *groups[1] = { devices };
  if (!sim_strategy_set_stages(s, 1, op_stage, groups, &n_devices, error))
    return NULL;
  if (!sim_strategy_validate(s, g, m, error))
    return NULL;
  return g_steal_pointer(&s);
}

/* ---------------------------------------------------------------------------------- */
/* Megatron                                                                           */

SimMegatronOptions sim_megatron_options_default(void)
{
  return (SimMegatronOptions){
    .dp = 1, .tp = 1, .pp = 1,
    .microbatches = 0,
    .microbatch_size = 1,
    .schedule = SIM_SCHEDULE_1F1B,
    .chunks = 1,
    .sequence_parallel = FALSE,
    /* Megatron overlaps the gradient all-reduce with the backward pass; one collective
     * per weight keeps the plan independent of a bucket size the user did not choose. */
    .sync = { .algorithm = SIM_ALLREDUCE_RING, .bucket_bytes = 0, .overlap = TRUE },
    /* Megatron trains in mixed precision with Adam; recomputation is opt-in. */
    .memory = { .recompute = SIM_RECOMPUTE_NONE, .zero1 = FALSE,
                .precision = SIM_PRECISION_MIXED_FP16, .optimizer = SIM_OPTIMIZER_ADAM },
    .ep = 1,
    .cp = 1,
    .tp_overlap = sim_tp_overlap_default(),
  };
}

/* How an operator takes part in tensor parallelism. */
typedef enum {
  TP_REPLICATED,   /* whole, computed by every rank of the tensor-parallel group       */
  TP_COLUMN,       /* a linear split on its parameter dimension (outputs)              */
  TP_ROW,          /* a linear split on its reduction dimension (inputs): partial sums */
  TP_HEADS,        /* attention split by heads                                        */
  TP_FFN,          /* a gated MLP or the experts of a MoE split on their width: the
                      gate and up projections column-, the down projection row-parallel
                      (Megatron-Core's expert tensor parallelism equal to tp)           */
  TP_VOCAB,        /* embedding split on its vocabulary                                */
  TP_FEATURES,     /* element-wise op between a column and a row linear (or the head
                      and the loss): split like its producer's output                */
  TP_LOSS,         /* cross entropy split on its classes                               */
  TP_SEQUENCE,     /* with sequence parallelism: split on the sequence                 */
} TpRole;

/* Whether an output of @op goes straight into a vocabulary-parallel loss (the output head). */
static gboolean feeds_loss(const SimGraph *g, int op, const TpRole *role)
{
  for (int l = 0; l < sim_graph_n_ops(g); l++) {
    if (role[l] != TP_LOSS)
      continue;
    for (int i = 0; i < sim_graph_op_n_inputs(g, l); i++)
      if (sim_graph_tensor_producer(g, sim_graph_op_input(g, l, i)) == op)
        return TRUE;
  }
  return FALSE;
}

static gboolean is_elementwise(SimOpType t)
{
  return t == SIM_OP_UNARY || t == SIM_OP_DROPOUT || t == SIM_OP_BINARY;
}

static int first_dim_with_role(const SimOp *op, SimDimRole role)
{
  for (int d = 0; d < op->space.ndims; d++)
    if (op->space.dims[d].role == role)
      return d;
  return -1;
}

/* The iteration dimension that indexes the last (feature) dimension of tensor map @map. */
static int last_dim_of(const SimTensorMap *map)
{
  return map->ndim > 0 ? map->map[map->ndim - 1].dim : -1;
}

/* Attention's parameter dimensions are its heads and the width of one head; only the
 * heads are independent of each other, and the catalogue declares them splittable. */
static int heads_dim(const SimOp *op)
{
  for (int d = 0; d < op->space.ndims; d++)
    if (op->space.dims[d].role == SIM_ROLE_PARAMETER && op->space.dims[d].splittable)
      return d;
  return -1;
}

/* A gated MLP's or a mixture of experts' width f: the last splittable parameter dimension
 * (a MoE's experts come before it). */
static int ffn_dim(const SimOp *op)
{
  for (int d = op->space.ndims - 1; d >= 0; d--)
    if (op->space.dims[d].role == SIM_ROLE_PARAMETER && op->space.dims[d].splittable)
      return d;
  return -1;
}

/* What the output of a linear layer flows into, through element-wise operators. */
typedef struct {
  GArray *linears;   /* op ids, distinct                                              */
  GArray *losses;    /* cross-entropy op ids                                          */
  GArray *path;      /* element-wise op ids passed through                            */
  gboolean other;    /* reaches any other kind of operator (or the graph's end)       */
} Reach;

static void reach_clear(Reach *r)
{
  g_array_set_size(r->linears, 0);
  g_array_set_size(r->losses, 0);
  g_array_set_size(r->path, 0);
  r->other = FALSE;
}

static void add_unique(GArray *a, int v)
{
  for (guint i = 0; i < a->len; i++)
    if (g_array_index(a, int, i) == v)
      return;
  g_array_append_val(a, v);
}

static void reach_from(const SimGraph *g, int op, Reach *r)
{
  reach_clear(r);
  g_autoptr(GArray) stack = g_array_new(FALSE, FALSE, sizeof(int));
  g_array_append_val(stack, op);
  while (stack->len) {
    int cur = g_array_index(stack, int, stack->len - 1);
    g_array_set_size(stack, stack->len - 1);
    for (int o = 0; o < sim_graph_op_n_outputs(g, cur); o++) {
      int t = sim_graph_op_output(g, cur, o);
      int nc = sim_graph_tensor_n_consumers(g, t);
      if (nc == 0 && cur != op)
        r->other = TRUE;
      for (int c = 0; c < nc; c++) {
        int next = sim_graph_tensor_consumer(g, t, c);
        SimOpType type = sim_graph_op_type(g, next);
        if (type == SIM_OP_LINEAR) {
          add_unique(r->linears, next);
        } else if (type == SIM_OP_CROSS_ENTROPY) {
          add_unique(r->losses, next);
        } else if (is_elementwise(type)) {
          guint before = r->path->len;
          add_unique(r->path, next);
          if (r->path->len > before)
            g_array_append_val(stack, next);
        } else {
          r->other = TRUE;
        }
      }
    }
  }
}

static SimUnaryKind linear_activation(const SimGraph *g, int op)
{
  return (SimUnaryKind)sim_op_attr_int(sim_graph_op_get(g, op), "activation");
}

/* Assigns a tensor-parallel role to every operator from the graph's structure. */
static void assign_tp_roles(const SimGraph *g, gboolean sequence_parallel, TpRole *role)
{
  int n_ops = sim_graph_n_ops(g);
  Reach r = { g_array_new(FALSE, FALSE, sizeof(int)), g_array_new(FALSE, FALSE, sizeof(int)),
              g_array_new(FALSE, FALSE, sizeof(int)), FALSE };
  for (int op = 0; op < n_ops; op++) {
    switch (sim_graph_op_type(g, op)) {
    case SIM_OP_ATTENTION: role[op] = TP_HEADS; break;
    case SIM_OP_GATED_MLP:
    case SIM_OP_MOE: role[op] = TP_FFN; break;
    case SIM_OP_EMBEDDING: role[op] = TP_VOCAB; break;
    default: role[op] = TP_REPLICATED; break;
    }
  }
  for (int a = 0; a < n_ops; a++) {
    if (sim_graph_op_type(g, a) != SIM_OP_LINEAR || role[a] != TP_REPLICATED)
      continue;
    reach_from(g, a, &r);
    if (r.other)
      continue;
    if (r.linears->len == 0 && r.losses->len > 0) {
      /* The output head: its logits go to the loss, which is then vocabulary-parallel. */
      role[a] = TP_COLUMN;
      for (guint i = 0; i < r.losses->len; i++)
        role[g_array_index(r.losses, int, i)] = TP_LOSS;
    } else if (r.linears->len == 1 && r.losses->len == 0) {
      int b = g_array_index(r.linears, int, 0);
      /* A row-parallel linear holds partial sums until the reduction after it: a fused
       * activation there (an MLP of relu layers) would apply to the partial sums. */
      if (role[b] == TP_COLUMN || linear_activation(g, b) != SIM_UNARY_IDENTITY)
        continue;
      /* Megatron's MLP (and any linear feeding exactly one linear): the first splits its
       * outputs, the second its inputs, so nothing moves between them and one reduction
       * of the second's partial sums ends the block.  A second source of the same row-
       * parallel linear (a gated MLP's gate and up projections) is column-parallel too. */
      role[a] = TP_COLUMN;
      role[b] = TP_ROW;
    } else {
      continue;
    }
    for (guint i = 0; i < r.path->len; i++)
      role[g_array_index(r.path, int, i)] = TP_FEATURES;
  }
  if (sequence_parallel) {
    for (int op = 0; op < n_ops; op++) {
      SimOpType t = sim_graph_op_type(g, op);
      if (role[op] == TP_REPLICATED &&
          (t == SIM_OP_LAYERNORM || t == SIM_OP_RMSNORM || is_elementwise(t)))
        role[op] = TP_SEQUENCE;
    }
  }
  g_array_unref(r.linears);
  g_array_unref(r.losses);
  g_array_unref(r.path);
}

/* The dimension operator @op splits over the tensor-parallel group for @role, or -1. */
static int tp_dim(const SimGraph *g, int op, TpRole role)
{
  const SimOp *o = sim_graph_op_get(g, op);
  switch (role) {
  case TP_COLUMN: return first_dim_with_role(o, SIM_ROLE_PARAMETER);
  case TP_ROW: return first_dim_with_role(o, SIM_ROLE_REDUCTION);
  case TP_HEADS: return heads_dim(o);
  case TP_FFN: return ffn_dim(o);
  case TP_VOCAB: return first_dim_with_role(o, SIM_ROLE_REDUCTION);
  case TP_FEATURES: return o->n_outputs > 0 ? last_dim_of(sim_space_output_map(o, 0)) : -1;
  case TP_LOSS: return o->n_inputs > 0 ? last_dim_of(sim_space_input_map(o, 0)) : -1;
  case TP_SEQUENCE: return first_dim_with_role(o, SIM_ROLE_ATTRIBUTE);
  case TP_REPLICATED: return -1;
  }
  return -1;
}

static const char *tp_role_what(TpRole role)
{
  switch (role) {
  case TP_COLUMN: return "column-parallel";
  case TP_ROW: return "row-parallel";
  case TP_HEADS: return "split by heads";
  case TP_FFN: return "split on its ffn width";
  case TP_FEATURES: return "split on features between tensor-parallel linears";
  default: return "tensor-parallel";
  }
}

/* Whether the experts are laid out by their own degrees (an expert tensor-parallel degree
 * other than tp), place_experts(). */
static gboolean own_expert_layout(const SimMegatronOptions *o)
{
  return o->etp > 0 && o->etp != o->tp;
}

static gboolean check_options(const SimGraph *g, const SimMachine *m, const SimMegatronOptions *o,
                              GError **error)
{
  if (o->dp < 1 || o->tp < 1 || o->pp < 1) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                "dp %d, tp %d, pp %d: every degree must be at least 1", o->dp, o->tp, o->pp);
    return FALSE;
  }
  if (o->etp < 0) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                "etp %d: the expert tensor-parallel degree must be at least 1 (0: tp)", o->etp);
    return FALSE;
  }
  if (own_expert_layout(o)) {
    /* Megatron-Core's expert groups: ep x etp ranks of a stage, whole tensor-parallel
     * groups (so that a group routes the tokens of whole replicas), dividing the stage. */
    int ep = MAX(o->ep, 1), etp = o->etp, group = ep * etp;
    if (o->ep < 0 || group % o->tp != 0 || (o->dp * o->tp) % group != 0) {
      g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                  "ep %d x etp %d = %d: an expert group must be a multiple of tp %d that "
                  "divides dp %d x tp %d", o->ep, etp, group, o->tp, o->dp, o->tp);
      return FALSE;
    }
    if (MAX(o->cp, 1) > 1) {
      g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                  "etp %d with cp %d: expert tensor parallelism other than tp %d is not "
                  "modelled with context parallelism", etp, o->cp, o->tp);
      return FALSE;
    }
  } else if (o->ep < 0 || (o->ep > 1 && o->dp % o->ep != 0)) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                "ep %d: the expert-parallel degree must divide dp %d", o->ep, o->dp);
    return FALSE;
  }
  if (o->cp < 0) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                "cp %d: the context-parallel degree must be at least 1", o->cp);
    return FALSE;
  }
  if (o->tp_overlap.chunks < 0 || o->tp_overlap.sms_attention < 0 ||
      o->tp_overlap.sms_other < 0) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                "tensor-parallel overlap: chunks %d, SMs %d and %d: none may be negative",
                o->tp_overlap.chunks, o->tp_overlap.sms_attention, o->tp_overlap.sms_other);
    return FALSE;
  }
  int64_t need = (int64_t)o->dp * o->tp * o->pp * MAX(o->cp, 1);
  if (need > sim_machine_n_devices(m)) {
    if (o->cp > 1)
      g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                  "dp %d x tp %d x pp %d x cp %d = %" G_GINT64_FORMAT " devices, but machine "
                  "'%s' has %d", o->dp, o->tp, o->pp, o->cp, need, sim_machine_get_name(m),
                  sim_machine_n_devices(m));
    else
      g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                  "dp %d x tp %d x pp %d = %" G_GINT64_FORMAT " devices, but machine '%s' has %d",
                  o->dp, o->tp, o->pp, need, sim_machine_get_name(m), sim_machine_n_devices(m));
    return FALSE;
  }
  if (o->schedule < SIM_SCHEDULE_GPIPE || o->schedule > SIM_SCHEDULE_INTERLEAVED) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID, "unknown pipeline schedule %d",
                (int)o->schedule);
    return FALSE;
  }
  if (o->schedule == SIM_SCHEDULE_INTERLEAVED && o->chunks < 1) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                "%d model chunks per pipeline stage: at least one needed", o->chunks);
    return FALSE;
  }
  if (o->microbatches < 0 || (o->microbatches == 0 && o->microbatch_size < 1)) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                "%d micro-batches of %" G_GINT64_FORMAT " samples: both must be positive "
                "(0 micro-batches means batch / (dp x micro-batch size))",
                o->microbatches, o->microbatch_size);
    return FALSE;
  }
  if (sim_graph_batch_size(g) < 1) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID, "model '%s' has no batch dimension",
                sim_graph_get_name(g));
    return FALSE;
  }
  return TRUE;
}

/* The number of micro-batches: each data-parallel replica runs batch / dp samples, in
 * micro-batches of microbatch_size samples, unless the caller fixes their number. */
static gboolean count_microbatches(const SimGraph *g, const SimMegatronOptions *o,
                                   int64_t *out, GError **error)
{
  const int dp = o->dp;
  int64_t batch = sim_graph_batch_size(g);
  int64_t mb = o->microbatches;
  if (mb == 0 && o->microbatch_size > batch) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                "micro-batches of %" G_GINT64_FORMAT " samples exceed the batch of %"
                G_GINT64_FORMAT " samples", o->microbatch_size, batch);
    return FALSE;
  }
  if (mb == 0) {
    int64_t per = (int64_t)dp * o->microbatch_size;
    if (batch % per != 0) {
      g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                  "the batch of %" G_GINT64_FORMAT " samples does not split into dp %d "
                  "replicas x micro-batches of %" G_GINT64_FORMAT " samples",
                  batch, dp, o->microbatch_size);
      return FALSE;
    }
    mb = batch / per;
  }
  if (mb > G_MAXINT || batch % mb != 0 || (batch / mb) % dp != 0) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                "the batch of %" G_GINT64_FORMAT " samples does not split into %" G_GINT64_FORMAT
                " micro-batches over dp %d replicas",
                batch, mb, dp);
    return FALSE;
  }
  *out = mb;
  return TRUE;
}

/* The model chunk of every op (@op_stage), for @n_chunks chunks (pp x chunks per stage).
 * Layers: the ops up to and including each checkpoint mark form one layer.  Ops before
 * the first layer's end (the embedding) thus belong to the first layer, ops after the
 * last mark (final norm, head, loss) to the last stage. */
static gboolean assign_chunks(const SimGraph *g, int pp, int chunks, int *op_stage,
                              GError **error)
{
  const int n_ops = sim_graph_n_ops(g);
  const char *model = sim_graph_get_name(g);
  g_autoptr(GArray) marks = g_array_new(FALSE, FALSE, sizeof(int));
  g_array_set_size(marks, n_ops);
  g_array_set_size(marks, sim_graph_layer_ends(g, (int *)(void *)marks->data));
  int n_layers = (int)marks->len;
  int n_chunks = pp * chunks;
  if (n_chunks > 1 && n_layers == 0) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                "model '%s' has no layers (no checkpoint marks, no cut that one tensor "
                "crosses), so it cannot be split into %d pipeline stages",
                model, n_chunks);
    return FALSE;
  }
  if (n_chunks > n_layers && n_chunks > 1) {
    if (chunks > 1)
      g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                  "pp %d x %d chunks = %d model chunks, but model '%s' has %d layers", pp,
                  chunks, n_chunks, model, n_layers);
    else
      g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                  "pp %d stages, but model '%s' has %d layers", pp, model, n_layers);
    return FALSE;
  }

  /* Model chunk c holds layers [c L / C, (c+1) L / C): as even as the counts allow.  With
   * the interleaved schedule chunk c runs on pipeline rank c % pp (Narayanan et al. 2021,
   * section 2.2.2), which is stage c's group in sim_strategy_set_stages()' convention. */
  g_autofree int *layer_chunk = g_new0(int, MAX(n_layers, 1));
  for (int l = 0; l < n_layers; l++)
    layer_chunk[l] = (int)((int64_t)l * n_chunks / n_layers);
  gboolean marked = FALSE;
  for (int op = 0; op < n_ops && !marked; op++)
    marked = sim_graph_op_is_checkpoint(g, op);
  if (!marked && n_layers > 0 && n_chunks > 1) {
    /* Layers found where one tensor crosses (sim/layers.c) differ in size (a CNN's stem
     * convolutions against its blocks), so they are dealt out by forward FLOPs: each goes
     * to the chunk its middle falls in, every chunk keeping at least one. */
    g_autofree double *w = g_new0(double, n_layers + 1);
    double total = 0;
    for (int op = 0, l = 0; op < n_ops; op++) {
      while (l < n_layers && op > g_array_index(marks, int, l))
        l++;
      double f = sim_graph_op_forward_flops(g, op);
      w[l] += f;
      total += f;
    }
    double before = 0;
    for (int l = 0; l < n_layers && total > 0; l++) {
      int c = (int)((before + w[l] / 2) * n_chunks / total);
      before += w[l];
      int prev = l > 0 ? layer_chunk[l - 1] : 0;
      c = l == 0 ? 0 : CLAMP(c, prev, prev + 1);
      layer_chunk[l] = MAX(MIN(c, n_chunks - 1), n_chunks - (n_layers - l));
    }
  }
  int layer = 0;
  for (int op = 0; op < n_ops; op++) {
    while (layer < n_layers && op > g_array_index(marks, int, layer))
      layer++;
    op_stage[op] = layer >= n_layers ? n_chunks - 1 : layer_chunk[layer];
  }
  /* Data sources (token ids, labels) enter where they are first used: Megatron feeds the
   * labels to the last stage only. */
  for (int op = 0; op < n_ops; op++) {
    if (sim_graph_op_type(g, op) != SIM_OP_INPUT)
      continue;
    int first = -1;
    for (int k = 0; k < sim_graph_op_n_outputs(g, op); k++) {
      int t = sim_graph_op_output(g, op, k);
      for (int c = 0; c < sim_graph_tensor_n_consumers(g, t); c++) {
        int st = op_stage[sim_graph_tensor_consumer(g, t, c)];
        first = first < 0 ? st : MIN(first, st);
      }
    }
    if (first >= 0)
      op_stage[op] = first;
  }
  return TRUE;
}

/* Ranks: tensor fastest, then data, then pipeline (Megatron's order: its data-parallel
 * groups stride by tp inside a block of dp * tp ranks per stage, its pipeline groups by
 * the world size over pp), so a tensor-parallel group is tp consecutive devices, inside
 * one node when tp divides its size, and a stage holds dp * tp consecutive devices.
 * Context parallelism sits between tensor and data parallelism (Megatron-Core's order):
 * d counts dp * cp, context rank c of replica r being d = r cp + c. */
static int megatron_rank(int dp, int cp, int tp, int d, int p, int t)
{
  return p * (dp * cp * tp) + d * tp + t;
}

/* A mixture-of-experts op laid out as Megatron-Core lays out its experts with an expert
 * tensor-parallel degree etp of its own ("MoE parallel folding"): the dp x tp ranks of
 * stage @p, in their order, form dp tp / (ep etp) expert-data-parallel groups of ep x etp
 * consecutive ranks, etp fastest.  Shard (sample group i, experts j, width t) sits on
 * stage rank i ep etp + j etp + t.  An expert group being a multiple of tp
 * (check_options()), sample group i is exactly the samples of the replicas whose ranks
 * form group i: the group exchanges the tokens its own ranks hold (split by position
 * over each replica's tensor-parallel ranks under sequence parallelism), an all-to-all
 * inside the group (sim/lower-tensors.c, routed_fraction()). */
static gboolean place_experts(SimStrategy *s, const SimMegatronOptions *o, int op, int p,
                              int *devices, GError **error)
{
  const SimStrategyOpInfo *info = &s->layout->ops[op];
  const int dp = o->dp, tp = o->tp, ep = MAX(o->ep, 1), etp = o->etp;
  const int groups = dp * tp / (ep * etp);
  const SimIterDim *xd = &info->dims[2], *fd = &info->dims[3];
  if (xd->size % ep != 0 || fd->size % etp != 0) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                "ep %d and etp %d must divide the %" G_GINT64_FORMAT " experts of width %"
                G_GINT64_FORMAT " of op '%s'", ep, etp, xd->size, fd->size, info->name);
    return FALSE;
  }
  int degrees[SIM_MAX_ITER];
  for (int d = 0; d < SIM_MAX_ITER; d++)
    degrees[d] = 1;
  degrees[0] = groups;
  degrees[2] = ep;
  degrees[3] = etp;
  int n = 0;
  for (int i = 0; i < groups; i++)
    for (int j = 0; j < ep; j++)
      for (int t = 0; t < etp; t++)
        devices[n++] = p * (dp * tp) + (i * ep + j) * etp + t;
  return sim_strategy_set_op_replicated(s, op, degrees, 1, devices, error);
}

/* Op @op's degrees and devices in @s: its samples over dp, its experts over ep, its
 * tensor-parallel dimension (@role) over tp, its positions over cp, on pipeline rank
 * @stage % pp.  @devices has room for dp x cp x tp. */
static gboolean place_op(SimStrategy *s, const SimGraph *g, const SimMegatronOptions *o,
                         int op, const TpRole *role, int stage, int *devices, GError **error)
{
  const int dp = o->dp, tp = o->tp, pp = o->pp, cp = MAX(o->cp, 1);
  const SimStrategyOpInfo *info = &s->layout->ops[op];
  int degrees[SIM_MAX_ITER];
  for (int d = 0; d < SIM_MAX_ITER; d++)
    degrees[d] = 1;
  if (info->ndims > 0)
    degrees[0] = dp;
  else if (dp > 1) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                "op '%s' (%s) has no sample dimension to split over dp %d replicas",
                info->name, sim_op_type_name(info->type), dp);
    return FALSE;
  }

  if (info->type == SIM_OP_MOE && own_expert_layout(o))
    return place_experts(s, o, op, stage % pp, devices, error);

  /* Expert parallelism: the experts over ep consecutive data-parallel replicas, the
   * samples over the dp / ep groups of them.  Shard (sample group i, experts j, width t)
   * is shard (i ep + j) t of the row-major order, so it sits on replica i ep + j. */
  gboolean expert_split = FALSE;
  if (o->ep > 1 && info->type == SIM_OP_MOE) {
    const SimIterDim *xd = &info->dims[2];
    if (xd->size % o->ep != 0) {
      g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                  "ep %d does not divide the %" G_GINT64_FORMAT " experts of op '%s'",
                  o->ep, xd->size, info->name);
      return FALSE;
    }
    degrees[0] = dp / o->ep;
    degrees[2] = o->ep;
    expert_split = TRUE;
  }

  int x = tp > 1 ? tp_dim(g, op, role[op]) : -1;
  if (x > 0 && x < info->ndims) {
    const SimIterDim *dim = &info->dims[x];
    gboolean fits = dim->splittable && dim->size % tp == 0;
    if (!fits && (role[op] == TP_COLUMN || role[op] == TP_ROW || role[op] == TP_HEADS ||
                  role[op] == TP_FFN || role[op] == TP_FEATURES)) {
      /* Megatron requires these splits; an uneven one would not be Megatron's plan.
       * Megatron pads its vocabulary so that the output layer splits (to a multiple of
       * 128 x tp): say so when that is the op refused. */
      g_autofree char *hint = NULL;
      if (role[op] == TP_COLUMN && feeds_loss(g, op, role)) {
        int64_t unit = 128 * (int64_t)tp;
        hint = g_strdup_printf("; Megatron pads the vocabulary to a multiple of 128 x tp:"
                               " --param vocab=%" G_GINT64_FORMAT,
                               (dim->size + unit - 1) / unit * unit);
      }
      g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                  "tp %d does not divide dimension '%s' (size %" G_GINT64_FORMAT
                  ") of op '%s' (%s), which the plan makes %s%s",
                  tp, dim->name, dim->size, info->name, sim_op_type_name(info->type),
                  tp_role_what(role[op]), hint ? hint : "");
      return FALSE;
    }
    /* A vocabulary, a loss or a sequence that tp does not divide stays whole. */
    if (fits)
      degrees[x] = tp;
  }

  /* An op that does not split over the tensor-parallel group runs on every rank of it,
   * as Megatron runs layer norms, dropouts and residual adds: tp copies of each data-
   * parallel shard.  Either way shard (d, t) sits on rank (d, p, t): a split op's tensor
   * coordinate is the fastest-varying, as a replicated op's copy is. */
  int p = stage % pp;
  gboolean split = (x > 0 && x < SIM_MAX_ITER && degrees[x] > 1) || expert_split;
  int replicas = split ? 1 : tp;
  /* Context parallelism splits the positions further (chunk c of the sequence, split
   * tp ways inside it under sequence parallelism); an op without positions that
   * divide runs on every context rank. */
  gboolean cp_split = FALSE;
  if (cp > 1) {
    int sd = first_dim_with_role(sim_graph_op_get(g, op), SIM_ROLE_ATTRIBUTE);
    if (sd > 0 && sd < info->ndims && info->dims[sd].splittable &&
        info->dims[sd].size % ((int64_t)degrees[sd] * cp) == 0) {
      degrees[sd] *= cp;
      cp_split = TRUE;
    } else {
      replicas *= cp;
    }
    /* Shards in row-major order of their coordinates, copies fastest: the context
     * coordinate comes after the tensor one where the tensor split is on an earlier
     * dimension or the op is repeated over the context ranks. */
    gboolean t_first = split && (!cp_split || x < sd);
    int n = 0;
    if (expert_split && cp_split) {
      /* Shard (sample group i, positions c, experts j, width t) on context rank c of
       * replica i ep + j: each expert group exchanges tokens among the replicas of one
       * context rank. */
      int ep = o->ep, tw = x > 0 && x < SIM_MAX_ITER && degrees[x] > 1 ? tp : 1;
      for (int i = 0; i < dp / ep; i++)
        for (int c = 0; c < cp; c++)
          for (int j = 0; j < ep; j++)
            for (int t = 0; t < tw; t++)
              devices[n++] = megatron_rank(dp, cp, tp, (i * ep + j) * cp + c, p, t);
    } else {
      for (int d = 0; d < dp; d++)
        for (int a = 0; a < (t_first ? tp : cp); a++)
          for (int b = 0; b < (t_first ? cp : tp); b++)
            devices[n++] = t_first ? megatron_rank(dp, cp, tp, d * cp + b, p, a)
                                   : megatron_rank(dp, cp, tp, d * cp + a, p, b);
    }
  } else {
    for (int d = 0; d < dp; d++)
      for (int t = 0; t < tp; t++)
        devices[d * tp + t] = megatron_rank(dp, cp, tp, d, p, t);
  }
  return sim_strategy_set_op_replicated(s, op, degrees, replicas, devices, error);
}

/* Stage c runs on the devices of pipeline rank c % pp: every (data, tensor) pair. */
static gboolean set_stage_groups(SimStrategy *s, const SimMegatronOptions *o, int n_chunks,
                                 const int *op_stage, GError **error)
{
  const int dp = o->dp, tp = o->tp, pp = o->pp, cp = MAX(o->cp, 1);
  g_autofree int *groups_flat = g_new(int, (gsize)n_chunks * dp * cp * tp);
  g_autofree const int **groups = g_new(const int *, n_chunks);
  g_autofree int *group_n = g_new(int, n_chunks);
  for (int c = 0; c < n_chunks; c++) {
    int *grp = groups_flat + (gsize)c * dp * cp * tp;
    int n = 0;
    for (int d = 0; d < dp * cp; d++)
      for (int t = 0; t < tp; t++)
        grp[n++] = megatron_rank(dp, cp, tp, d, c % pp, t);
    groups[c] = grp;
    group_n[c] = n;
  }
  return sim_strategy_set_stages(s, n_chunks, op_stage, groups, group_n, error);
}

SimStrategy *sim_strategy_megatron(const SimGraph *g, const SimMachine *m,
                                   const SimMegatronOptions *o, GError **error)
{
  g_return_val_if_fail(g != NULL && m != NULL && o != NULL, NULL);
  if (!check_options(g, m, o, error))
    return NULL;
  const int chunks = o->schedule == SIM_SCHEDULE_INTERLEAVED ? o->chunks : 1;
  const int n_chunks = o->pp * chunks, n_ops = sim_graph_n_ops(g);
  const int cp = MAX(o->cp, 1);
  int64_t mb;
  if (!count_microbatches(g, o, &mb, error))
    return NULL;
  g_autofree int *op_stage = g_new0(int, MAX(n_ops, 1));
  if (!assign_chunks(g, o->pp, chunks, op_stage, error))
    return NULL;

  g_autoptr(SimStrategy) s = sim_strategy_new(g, m);
  g_autofree TpRole *role = g_new0(TpRole, MAX(n_ops, 1));
  if (o->tp > 1)
    assign_tp_roles(g, o->sequence_parallel, role);
  g_autofree int *devices = g_new(int, (gsize)o->dp * cp * o->tp);
  for (int op = 0; op < n_ops; op++)
    if (!place_op(s, g, o, op, role, op_stage[op], devices, error))
      return NULL;
  if (!set_stage_groups(s, o, n_chunks, op_stage, error))
    return NULL;

  sim_strategy_set_microbatches(s, (int)mb);
  sim_strategy_set_schedule(s, o->schedule, chunks);
  sim_strategy_set_sync(s, &o->sync);
  sim_strategy_set_memory(s, &o->memory);
  sim_strategy_set_sequence_parallel(s, o->sequence_parallel);
  sim_strategy_set_scatter_gather(s, o->scatter_gather);
  sim_strategy_set_tp_comm_overlap(s, o->tp_comm_overlap);
  sim_strategy_set_tp_overlap(s, &o->tp_overlap);
  sim_strategy_set_context_parallel(s, cp);
  if (!sim_strategy_validate(s, g, m, error))
    return NULL;
  return g_steal_pointer(&s);
}

SimStrategy *sim_strategy_megatron_fit(const SimGraph *g, const SimMachine *m,
                                       const SimMegatronOptions *o, SimCostModel *cost,
                                       const SimOptions *so, SimReport **report,
                                       int64_t *microbatch_size)
{
  g_return_val_if_fail(g != NULL && m != NULL && o != NULL && report != NULL, NULL);
  *report = NULL;
  int64_t per = sim_graph_batch_size(g) / MAX(sim_machine_n_devices(m), 1);
  for (int64_t k = per / 2; k >= 1; k /= 2) {
    if (per % k)
      continue;
    SimMegatronOptions ok = *o;
    ok.microbatches = 0;
    ok.microbatch_size = k;
    g_autoptr(SimStrategy) s = sim_strategy_megatron(g, m, &ok, NULL);
    g_autoptr(SimReport) r = s ? sim_simulate(g, m, s, cost, so, NULL) : NULL;
    if (!r || !sim_report_fits(r))
      continue;
    *report = g_steal_pointer(&r);
    if (microbatch_size)
      *microbatch_size = k;
    return g_steal_pointer(&s);
  }
  return NULL;
}
