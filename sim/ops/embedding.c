/* embedding.c — table lookups: ids [b] or [b, s] -> [b, (s,) dim], and with "bags" the
 * pooled lookups of recommendation models (EmbeddingBag, mode sum): ids [b, n] -> [b, dim],
 * the sum of the n rows each sample looks up.
 *
 * Iteration dimensions: b (sample), s (attribute; the positions) or n (reduction; the
 * lookups of a bag, summed), d (parameter: the embedding columns) and v (reduction: the
 * vocabulary).  The table [vocab, dim] is indexed by (v, d); the output is not indexed by
 * v, so splitting v is the vocabulary-parallel embedding of Megatron: each shard looks up
 * the ids that fall in its rows, writes zeros for the others, and the partial outputs are
 * summed. */
#include "../sim-private.h"

enum { E_VOCAB, E_DIM, E_BAGS, E_DTYPE, E_SPARSE };

static const SimAttrSpec attrs[] = {
  [E_VOCAB] = { "vocab", SIM_ATTR_INT, 0, NULL, TRUE },
  [E_DIM] = { "dim", SIM_ATTR_INT, 0, NULL, TRUE },
  [E_BAGS] = { "bags", SIM_ATTR_BOOL, 0, NULL, FALSE },
  /* The table's and the output's dtype: nothing floating point flows in to take it from. */
  [E_DTYPE] = { "dtype", SIM_ATTR_ENUM, SIM_DTYPE_FP32, sim_dtype_names, FALSE },
  /* Sparse gradients (PyTorch's sparse=True, recommenders' tables): the backward writes
   * the looked-up rows' gradients only, and the update touches only those rows. */
  [E_SPARSE] = { "sparse", SIM_ATTR_BOOL, 0, NULL, FALSE },
};

static gboolean infer(SimOp *op, GError **error)
{
  const SimShape *ids = &op->in_shape[0];
  gboolean bags = op->attrs[E_BAGS].i[0] != 0;
  int64_t vocab = op->attrs[E_VOCAB].i[0], dim = op->attrs[E_DIM].i[0];
  SimDType dt = (SimDType)op->attrs[E_DTYPE].i[0];
  if (op->in_dtype[0] != SIM_DTYPE_INT32 && op->in_dtype[0] != SIM_DTYPE_INT64) {
    sim_op_set_error(op, error, SIM_ERROR_INVALID, "the ids are %s, not int32 or int64",
                     sim_dtype_name(op->in_dtype[0]));
    return FALSE;
  }
  if (!sim_op_check_rank(op, 0, bags ? 2 : 1, 2, error))
    return FALSE;
  if (vocab < 1 || dim < 1 || !sim_dtype_is_float(dt)) {
    sim_op_set_error(op, error, SIM_ERROR_INVALID,
                     "a table of %" G_GINT64_FORMAT " rows of %" G_GINT64_FORMAT " %s: both "
                     "sizes must be positive and the dtype floating point",
                     vocab, dim, sim_dtype_name(dt));
    return FALSE;
  }
  SimShape out = { .ndim = bags ? 2 : ids->ndim + 1 };
  out.dims[0] = ids->dims[0];
  if (!bags && ids->ndim == 2)
    out.dims[1] = ids->dims[1];
  out.dims[out.ndim - 1] = dim;
  sim_op_set_n_outputs(op, 1);
  op->out_shape[0] = out;
  op->out_dtype[0] = dt;
  op->n_weights = 1;
  op->w_shape[0] = sim_shape_make(2, (int64_t[]){ vocab, dim });
  op->w_dtype = dt;
  return TRUE;
}

/* Dimension indices: b, then s or n when the ids have two dimensions, then d and v. */
static inline int dim_d(const SimOp *op)
{
  return op->in_shape[0].ndim;
}

static void space(SimOp *op)
{
  const SimShape *ids = &op->in_shape[0];
  gboolean bags = op->attrs[E_BAGS].i[0] != 0;
  int d = dim_d(op), v = d + 1;
  sim_space_init(op, d + 2);
  sim_space_dim(op, 0, "b", SIM_ROLE_SAMPLE, ids->dims[0], TRUE);
  if (ids->ndim == 2)
    sim_space_dim(op, 1, bags ? "n" : "s", bags ? SIM_ROLE_REDUCTION : SIM_ROLE_ATTRIBUTE,
                  ids->dims[1], TRUE);
  sim_space_dim(op, d, "d", SIM_ROLE_PARAMETER, op->attrs[E_DIM].i[0], TRUE);
  sim_space_dim(op, v, "v", SIM_ROLE_REDUCTION, op->attrs[E_VOCAB].i[0], TRUE);
  SimTensorMap *mi = &op->space.maps[0], *mw = &op->space.maps[1], *my = &op->space.maps[2];
  for (int t = 0; t < ids->ndim; t++)
    sim_map_identity(mi, t, t);
  sim_map_identity(mw, 0, v);
  sim_map_identity(mw, 1, d);
  sim_map_identity(my, 0, 0);
  if (!bags && ids->ndim == 2)
    sim_map_identity(my, 1, 1);
  sim_map_identity(my, my->ndim - 1, d);
}

static void work(const SimOp *op, const int64_t *e, SimPass pass, SimWork *w)
{
  gboolean bags = op->attrs[E_BAGS].i[0] != 0;
  int d = dim_d(op), v = d + 1;
  SimDType dt = op->w_dtype;
  double es = sim_dtype_size(dt), is = sim_dtype_size(op->in_dtype[0]);
  double lookups = (double)e[0] * (op->in_shape[0].ndim == 2 ? e[1] : 1);
  double D = (double)e[d];
  double out = bags ? (double)e[0] * D : lookups * D;
  /* A vocabulary shard finds its rows for its share of the ids, uniformly spread. */
  double hit = (double)e[v] / (double)op->attrs[E_VOCAB].i[0];
  SimKernel k = {
    .kind = SIM_KERNEL_GATHER,
    .dtype = dt,
    .m = (int64_t)lookups,
    .n = e[d],
    .k = 1,
    .batch = 1,
    .steps = 1,
  };
  if (pass == SIM_PASS_FORWARD) {
    /* Reads the ids and the rows looked up, writes the output (bags sum their rows). */
    k.flops = bags ? lookups * D * hit : 0;
    k.bytes = lookups * is + lookups * D * hit * es + out * es;
    sim_work_add(w, k);
    return;
  }
  if (op->attrs[E_SPARSE].i[0]) {
    /* A sparse gradient: the ids and a copy of each lookup's gradient row (bags spread
     * the sample's gradient over its rows), written as they come. */
    double rows = lookups * hit;
    k.flops = 0;
    k.bytes = lookups * is + out * es + rows * (D * es + is);
    sim_work_add(w, k);
    return;
  }
  /* PyTorch's dense embedding backward zero-fills the table's gradient, then adds each
   * looked-up row's gradient into it (a read-modify-write per lookup). */
  sim_work_add(w, sim_kernel_memory(dt, 0, (double)e[v] * D * es));
  k.flops = lookups * D * hit;
  k.bytes = lookups * is + lookups * D * es + 2 * lookups * D * hit * es;
  sim_work_add(w, k);
}

int64_t sim_embedding_sparse_rows(const SimOp *op, const int64_t *e, int64_t *width)
{
  if (op->type != SIM_OP_EMBEDDING || !op->attrs[E_SPARSE].i[0])
    return -1;
  int d = dim_d(op), v = d + 1;
  *width = e[d];
  double lookups = (double)e[0] * (op->in_shape[0].ndim == 2 ? e[1] : 1);
  double hit = (double)e[v] / (double)op->attrs[E_VOCAB].i[0];
  return (int64_t)MIN(lookups * hit, (double)e[v]);
}

static int64_t saved_bytes(const SimOp *op, const int64_t *extent)
{
  int64_t full[SIM_MAX_ITER];
  const int64_t *e = sim_op_extent(op, extent, full);
  /* Only the ids: the gradient flows into the table rows they name. */
  return sim_map_numel(sim_space_input_map(op, 0), &op->in_shape[0], e) *
         sim_dtype_size(op->in_dtype[0]);
}

const SimOpClass sim_op_embedding_class = {
  .type = SIM_OP_EMBEDDING,
  .name = "embedding",
  .description = "table lookup of token ids, or summed bags of lookups (recommenders)",
  .attrs = attrs,
  .n_attrs = G_N_ELEMENTS(attrs),
  .min_inputs = 1,
  .max_inputs = 1,
  .infer = infer,
  .space = space,
  .work = work,
  .saved_bytes = saved_bytes,
};
