/* candle.c — CANDLE Uno, the drug-response model of the ECP CANDLE project, as FlexFlow
 * (examples/cpp/candle_uno) and Unity (OSDI'22) evaluate it.
 *
 * Uno predicts tumour growth from a cell line's gene expression and two drugs' molecular
 * descriptors and fingerprints.  Each of the five feature inputs runs through its own
 * encoder tower of dense layers (FlexFlow builds a tower per input, where the Keras
 * original shares one between the two drugs); the two drug doses join unencoded; the
 * concatenation then goes through dense layers to a single response value.  All dense
 * layers are 4192 wide, without bias, with ReLU and dropout 0.1.  The many independent
 * towers make it Unity's example of operators worth placing on different devices. */
#include "zoo.h"

#define DROPOUT 0.1

/* The inputs, in FlexFlow's (sorted) order, with their widths and whether an encoder
 * tower reads them. */
static const struct {
  const char *name;
  int64_t width;
  gboolean encoded;
} uno_features[] = {
  { "cell.rnaseq", 942, TRUE },
  { "dose1", 1, FALSE },
  { "dose2", 1, FALSE },
  { "drug1.descriptors", 5270, TRUE },
  { "drug1.fingerprints", 2048, TRUE },
  { "drug2.descriptors", 5270, TRUE },
  { "drug2.fingerprints", 2048, TRUE },
};

static int dense_dropout(SimGraph *g, const char *prefix, int l, int x, int64_t width)
{
  SimZooName n;
  x = sim_graph_linear(g, sim_zoo_name(&n, "%s.fc%d", prefix, l), x, width, FALSE,
                       SIM_UNARY_RELU);
  return sim_graph_dropout(g, sim_zoo_name(&n, "%s.dropout%d", prefix, l), x, DROPOUT);
}

static SimGraph *build_candle_uno(const SimZooModel *model, const SimZooArgs *a,
                                  GError **error)
{
  int64_t batch = sim_zoo_arg(a, "batch");
  int64_t hidden = sim_zoo_arg(a, "hidden");
  int feature_layers = sim_zoo_arg_int(a, "feature_layers");
  int layers = sim_zoo_arg_int(a, "layers");

  g_autoptr(SimGraph) g = sim_graph_new(model->name);
  enum { N = G_N_ELEMENTS(uno_features) };
  int encoded[N];
  for (int i = 0; i < N; i++) {
    int64_t dims[] = { batch, uno_features[i].width };
    int x = sim_graph_input(g, uno_features[i].name, SIM_DTYPE_FP32, 2, dims);
    for (int l = 0; uno_features[i].encoded && l < feature_layers; l++)
      x = dense_dropout(g, uno_features[i].name, l, x, hidden);
    encoded[i] = x;
  }
  int x = sim_graph_concat(g, "concat", 1, N, encoded);
  for (int l = 0; l < layers && sim_zoo_going(g); l++)
    x = dense_dropout(g, "top", l, x, hidden);
  x = sim_graph_linear(g, "output", x, 1, FALSE, SIM_UNARY_IDENTITY);
  int64_t ldims[] = { batch, 1 };
  int growth = sim_graph_input(g, "growth", SIM_DTYPE_FP32, 2, ldims);
  sim_graph_mse_loss(g, "loss", x, growth);
  return g_steal_pointer(&g);
}

static const SimModelParam candle_uno_params[] = {
  { "batch", 64, "global batch size of one iteration" },
  { "hidden", 4192, "units of every dense layer" },
  { "feature_layers", 8, "dense layers of each feature encoder" },
  { "layers", 4, "dense layers after the concatenation" },
  { NULL, 0, NULL },
};

const SimZooModel sim_zoo_candle_models[] = {
  { "candle-uno",
    "CANDLE Uno as in FlexFlow/Unity: 5 towers of 8 x 4192, 4 dense layers (821 M params)",
    candle_uno_params, build_candle_uno },
  { NULL, NULL, NULL, NULL },
};
