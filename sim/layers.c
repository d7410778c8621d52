/* layers.c — where a graph's layers end, for pipeline stages.
 *
 * A graph marks the end of each layer with "checkpoint" (the zoo's transformers, a graph
 * file).  Where it marks none (the zoo's CNNs, imported models), the layer ends are the
 * cuts that exactly one tensor crosses: after op i, one tensor made by ops 0..i (other
 * than an input's) is read by ops after i, so a pipeline cut there sends one activation
 * forward and one gradient back.  Inside a residual block the shortcut crosses too, so
 * blocks stay whole.  A cut before an op without weights (the ReLU after a residual add,
 * a pooling, a flatten) that is itself followed by a cut is dropped, so that such an op
 * joins the layer before it rather than forming a layer of its own. */
#include "sim-private.h"

static gboolean is_input(const SimGraph *g, int op)
{
  return sim_graph_op_type(g, op) == SIM_OP_INPUT;
}

int sim_graph_layer_ends(const SimGraph *g, int *ends)
{
  g_return_val_if_fail(g != NULL, 0);
  int n = sim_graph_n_ops(g), count = 0;
  for (int op = 0; op < n; op++)
    if (sim_graph_op_is_checkpoint(g, op)) {
      if (ends)
        ends[count] = op;
      count++;
    }
  if (count > 0 || n < 2)
    return count;

  /* diff[i]: tensors that start crossing the cut after op i, minus those that stop. */
  g_autofree int *diff = g_new0(int, n + 1);
  for (int op = 0; op < n; op++) {
    if (is_input(g, op))
      continue;
    for (int k = 0; k < sim_graph_op_n_outputs(g, op); k++) {
      int t = sim_graph_op_output(g, op, k), last = op;
      for (int c = 0; c < sim_graph_tensor_n_consumers(g, t); c++)
        last = MAX(last, sim_graph_tensor_consumer(g, t, c));
      if (last > op) {
        diff[op]++;
        diff[last]--;
      }
    }
  }
  /* The next op that is not an input, after each op; n when there is none. */
  g_autofree int *next = g_new(int, n + 1);
  next[n] = n;
  for (int op = n - 1; op >= 0; op--)
    next[op] = op + 1 < n && !is_input(g, op + 1) ? op + 1 : next[op + 1 < n ? op + 1 : n];
  g_autofree gboolean *cut = g_new0(gboolean, n + 1);
  int crossing = 0;
  for (int op = 0; op < n; op++) {
    crossing += diff[op];
    cut[op] = crossing == 1 && !is_input(g, op) && next[op] < n;
  }
  for (int op = 0; op < n; op++) {
    if (!cut[op])
      continue;
    int j = next[op];
    if (sim_graph_op_n_weights(g, j) == 0 && cut[j])
      continue;
    if (ends)
      ends[count] = op;
    count++;
  }
  return count;
}
