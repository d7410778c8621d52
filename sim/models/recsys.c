/* recsys.c — recommendation models: DLRM (MLPerf's configuration) and Alibaba's XDL as
 * FlexFlow and Unity run it.
 *
 * Both are dominated by embedding tables that do not fit one device and by small dense
 * layers that do, which is why FlexFlow and Unity place each table on its own device
 * and keep the dense part data parallel.  Every table therefore is its own operator with
 * its own index input, as in FlexFlow's examples/cpp/DLRM and examples/cpp/XDL. */
#include "zoo.h"

/* Dense layers with bias and ReLU except the last, whose activation is @last_act. */
static int mlp_stack(SimGraph *g, const char *prefix, int x, int n, const int64_t *widths,
                     gboolean bias, SimUnaryKind last_act)
{
  SimZooName name;
  for (int i = 0; i < n; i++)
    x = sim_graph_linear(g, sim_zoo_name(&name, "%s.fc%d", prefix, i), x, widths[i], bias,
                         i == n - 1 ? last_act : SIM_UNARY_RELU);
  return x;
}

/* Table @i looked up with ids [b, bag].  With @bag 0 each sample looks up one row and
 * the result keeps a dimension for it, [b, 1, dim], ready to be stacked; otherwise the
 * @bag rows of each sample are summed (EmbeddingBag) into [b, dim]. */
static int table_lookup(SimGraph *g, int i, int64_t batch, int64_t bag, int64_t rows,
                        int64_t dim, gboolean sparse)
{
  SimZooName n;
  int64_t dims[] = { batch, MAX(bag, 1) };
  int ids = sim_graph_input(g, sim_zoo_name(&n, "sparse%d", i), SIM_DTYPE_INT64, 2, dims);
  g_autoptr(SimAttrs) attrs = sim_attrs_new(SIM_OP_EMBEDDING);
  sim_zoo_attr_int(g, attrs, "vocab", rows);
  sim_zoo_attr_int(g, attrs, "dim", dim);
  sim_zoo_attr_int(g, attrs, "bags", bag > 0);
  sim_zoo_attr_int(g, attrs, "sparse", sparse);
  return sim_zoo_add_op(g, SIM_OP_EMBEDDING, sim_zoo_name(&n, "emb%d", i), 1, &ids, attrs);
}

/* ---------------------------------------------------------------------------------- */
/* DLRM (Naumov et al. 2019) in the MLPerf training configuration on Criteo Terabyte:
 * facebookresearch/dlrm with --max-ind-range=40000000: 26 tables of dimension 128,
 * bottom MLP 13-512-256-128, dot interaction, top MLP 479-1024-1024-512-256-1. */

/* Rows of the 26 categorical features of Criteo Terabyte, hashed into 40 M rows. */
static const int64_t criteo_tb_rows[26] = {
  39884406, 39043, 17289, 7420, 20263, 3, 7120, 1543, 63, 38532951, 2953546, 403346, 10,
  2208, 11938, 155, 4, 976, 14, 39979771, 25641295, 39664984, 585935, 12972, 108, 36,
};

static SimGraph *build_dlrm(const SimZooModel *model, const SimZooArgs *a, GError **error)
{
  int64_t batch = sim_zoo_arg(a, "batch");
  int64_t dim = sim_zoo_arg(a, "dim");
  int64_t cap = sim_zoo_arg(a, "rows");
  if (sim_zoo_arg(a, "gradients") > 2) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                "model '%s': gradients is %" G_GINT64_FORMAT "; expected 1 (sparse) or 2 (dense)",
                model->name, sim_zoo_arg(a, "gradients"));
    return NULL;
  }
  enum { TABLES = G_N_ELEMENTS(criteo_tb_rows), FEATURES = TABLES + 1 };

  g_autoptr(SimGraph) g = sim_graph_new(model->name);
  int64_t ddims[] = { batch, 13 };
  int dense = sim_graph_input(g, "dense", SIM_DTYPE_FP32, 2, ddims);
  const int64_t bottom_widths[] = { 512, 256, dim };
  int bottom = mlp_stack(g, "bottom", dense, 3, bottom_widths, TRUE, SIM_UNARY_RELU);

  /* The feature vectors, bottom MLP first: Z [b, 27, dim]. */
  int z_parts[FEATURES];
  int64_t one_row[] = { batch, 1, dim };
  z_parts[0] = sim_graph_reshape(g, "bottom.expand", bottom, 3, one_row);
  for (int i = 0; i < TABLES; i++)
    z_parts[i + 1] = table_lookup(g, i, batch, 0, MIN(criteo_tb_rows[i], cap), dim,
                                  sim_zoo_arg(a, "gradients") == 1);
  int z = sim_graph_concat(g, "interact.stack", 1, FEATURES, z_parts);

  /* Dot interaction: all pairwise dot products Z Z^T [b, 27, 27], of which DLRM keeps
   * the 351 below the diagonal.  Row i of the flattened matrix holds i kept entries
   * followed by 27 - i dropped ones, so a split into alternating dropped and kept
   * pieces (27, 1, 26, 2, 25, ..., 26, 1) selects them. */
  int zz = sim_graph_matmul(g, "interact.dot", z, z, TRUE);
  int64_t flat[] = { batch, FEATURES * FEATURES };
  zz = sim_graph_reshape(g, "interact.flatten", zz, 2, flat);
  int64_t sizes[2 * FEATURES - 1];
  int pieces[2 * FEATURES - 1];
  int n_sizes = 0;
  sizes[n_sizes++] = FEATURES;                 /* row 0: nothing below its diagonal    */
  for (int i = 1; i < FEATURES; i++) {
    sizes[n_sizes++] = i;                      /* row i, columns 0 .. i-1: kept        */
    sizes[n_sizes++] = FEATURES - i;           /* row i's diagonal and beyond: dropped */
  }
  sim_zoo_split(g, "interact.tril", zz, 1, n_sizes, sizes, pieces);
  int top_parts[FEATURES + 1];
  top_parts[0] = bottom;
  for (int i = 1; i < FEATURES; i++)
    top_parts[i] = pieces[2 * i - 1];
  /* NVIDIA's implementation pads the top MLP's input (dim + 351 = 479 columns) with a
   * zero column to a multiple of 8 for the tensor cores (parameter align): the last row's
   * one dropped entry stands for that column. */
  int n_top = FEATURES;
  int64_t width = dim + FEATURES * (FEATURES - 1) / 2, align = sim_zoo_arg(a, "align");
  if (align > 1 && (width + 1) % align == 0)
    top_parts[n_top++] = pieces[2 * FEATURES - 2];
  int x = sim_graph_concat(g, "interact.concat", 1, n_top, top_parts);

  const int64_t top_widths[] = { 1024, 1024, 512, 256, 1 };
  x = mlp_stack(g, "top", x, 5, top_widths, TRUE, SIM_UNARY_SIGMOID);
  /* DLRM trains with binary cross-entropy on the click probability; the catalogue's
   * mean squared error has the same shapes and an equally negligible cost. */
  int64_t ldims[] = { batch, 1 };
  int clicks = sim_graph_input(g, "clicks", SIM_DTYPE_FP32, 2, ldims);
  sim_graph_mse_loss(g, "loss", x, clicks);
  return g_steal_pointer(&g);
}

/* ---------------------------------------------------------------------------------- */
/* XDL (Jiang et al., Alibaba 2019) as FlexFlow's examples/cpp/XDL/xdl.cc builds it for
 * Unity: sparse features looked up in large tables (4 x 1 M rows of 64 by default) and
 * summed over each sample's bag of ids, concatenated (4 x 64 = 256 features), then
 * dense layers 256-256-2 without bias (xdl.cc's --arch-mlp 256-256-256-2 lists the
 * input width first), sigmoid on the output and a mean-squared-error loss. */

static SimGraph *build_xdl(const SimZooModel *model, const SimZooArgs *a, GError **error)
{
  int64_t batch = sim_zoo_arg(a, "batch");
  int tables = sim_zoo_arg_int(a, "tables");
  int64_t rows = sim_zoo_arg(a, "rows");
  int64_t dim = sim_zoo_arg(a, "dim");
  int layers = sim_zoo_arg_int(a, "layers");
  int64_t hidden = sim_zoo_arg(a, "hidden");

  g_autoptr(SimGraph) g = sim_graph_new(model->name);
  g_autofree int *embs = g_new(int, tables);
  for (int i = 0; i < tables && sim_zoo_going(g); i++)
    embs[i] = table_lookup(g, i, batch, sim_zoo_arg(a, "bag"), rows, dim, FALSE);
  int x = sim_graph_concat(g, "concat", 1, tables, embs);

  g_autofree int64_t *widths = g_new(int64_t, layers + 1);
  for (int i = 0; i < layers && sim_zoo_going(g); i++)
    widths[i] = hidden;
  widths[layers] = 2;
  x = mlp_stack(g, "mlp", x, layers + 1, widths, FALSE, SIM_UNARY_SIGMOID);
  int64_t ldims[] = { batch, 2 };
  int labels = sim_graph_input(g, "labels", SIM_DTYPE_FP32, 2, ldims);
  sim_graph_mse_loss(g, "loss", x, labels);
  return g_steal_pointer(&g);
}

/* ---------------------------------------------------------------------------------- */

static const SimModelParam dlrm_params[] = {
  /* facebookresearch/dlrm bench/run_and_time.sh trains Terabyte with batches of 2048. */
  { "batch", 2048, "global batch size of one iteration" },
  { "dim", 128, "embedding dimension (and width of the bottom MLP's output)" },
  { "rows", 40000000, "cap on the rows of each table (MLPerf's --max-ind-range)" },
  { "align", 8, "the top MLP's input padded by a column to a multiple of this when one column "
                "does it (NVIDIA's implementation: 479 -> 480); 1: not padded" },
  { "gradients", 1, "1: sparse table gradients, each update touching the looked-up rows only "
                    "(DLRM's and NVIDIA's implementations); 2: dense" },
  { NULL, 0, NULL },
};

static const SimModelParam xdl_params[] = {
  { "batch", 2048, "global batch size of one iteration" },
  { "tables", 4, "embedding tables (sparse features)" },
  { "rows", 1000000, "rows of each table" },
  { "dim", 64, "embedding dimension" },
  { "bag", 1, "ids each sample looks up per table, summed (xdl.cc --embedding-bag-size)" },
  { "layers", 2, "hidden dense layers" },
  { "hidden", 256, "units of the hidden dense layers" },
  { NULL, 0, NULL },
};

const SimZooModel sim_zoo_recsys_models[] = {
  { "dlrm", "DLRM, MLPerf Criteo Terabyte config: 26 tables x 128, dot interaction (24 B params)",
    dlrm_params, build_dlrm },
  { "xdl", "Alibaba XDL as in FlexFlow/Unity: 4 tables of 1 M x 64, dense 256-256-2 (256 M params)",
    xdl_params, build_xdl },
  { NULL, NULL, NULL, NULL },
};
