/* mlp.c — the multi-layer perceptron of Unity (OSDI'22).
 *
 * Unity's MLP benchmark (FlexFlow examples/cpp/MLP_Unify/mlp.cc) has two towers that
 * each take a 1024-wide input through 8 dense layers of 8192 units without bias, ReLU
 * between them; the towers' outputs are added and fed to a softmax with sparse
 * categorical cross-entropy.  Its size makes it the paper's showcase for operator
 * (parameter) parallelism: 2 x (1024*8192 + 7*8192^2) = 956.3 M weights. */
#include "zoo.h"

static SimGraph *build_mlp(const SimZooModel *model, const SimZooArgs *a, GError **error)
{
  int64_t batch = sim_zoo_arg(a, "batch");
  int layers = sim_zoo_arg_int(a, "layers");
  int towers = sim_zoo_arg_int(a, "towers");
  int64_t hidden = sim_zoo_arg(a, "hidden");
  int64_t input = sim_zoo_arg(a, "input");
  int64_t classes = sim_zoo_arg(a, "classes");

  g_autoptr(SimGraph) g = sim_graph_new(model->name);
  SimZooName n;
  int sum = -1;
  for (int t = 0; t < towers && sim_zoo_going(g); t++) {
    int64_t dims[] = { batch, input };
    int x = sim_graph_input(g, sim_zoo_name(&n, "input%d", t), SIM_DTYPE_FP32, 2, dims);
    for (int l = 0; l < layers && sim_zoo_going(g); l++) {
      gboolean last = l == layers - 1;
      /* The last layer of each tower produces the logits: no activation, as in Unity. */
      x = sim_graph_linear(g, sim_zoo_name(&n, "tower%d.fc%d", t, l), x,
                           last ? classes : hidden, FALSE,
                           last ? SIM_UNARY_IDENTITY : SIM_UNARY_RELU);
    }
    sum = t == 0 ? x : sim_graph_binary(g, sim_zoo_name(&n, "add%d", t), sum, x,
                                        SIM_BINARY_ADD);
  }
  int64_t ldims[] = { batch };
  int labels = sim_graph_input(g, "labels", SIM_DTYPE_INT32, 1, ldims);
  /* The loss applies the softmax itself (FlexFlow's softmax + sparse cross-entropy). */
  sim_graph_cross_entropy(g, "loss", sum, labels);
  return g_steal_pointer(&g);
}

static const SimModelParam mlp_params[] = {
  { "batch", 64, "global batch size of one iteration" },
  { "layers", 8, "dense layers per tower" },
  { "hidden", 8192, "units of the hidden layers" },
  { "input", 1024, "features of each tower's input" },
  { "classes", 8192, "units of each tower's last layer (the softmax's classes)" },
  { "towers", 2, "parallel towers whose outputs are added" },
  { NULL, 0, NULL },
};

const SimZooModel sim_zoo_mlp_models[] = {
  { "mlp", "Unity's MLP: two towers of 8 dense layers of 8192 units (956 M params)",
    mlp_params, build_mlp },
  { NULL, NULL, NULL, NULL },
};
