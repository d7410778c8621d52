/* enumerate.c — the distinct shard shapes a model can take on a machine.
 *
 * A shard's time depends only on its shapes, dtype and attributes, which its shard key
 * names, so a profile needs one measurement per distinct key, not one per operator and
 * configuration: the 24 identical layers of a transformer share their keys, and so do
 * configurations that cut an operator into equal pieces along different device views.
 * The configurations are those search/configs.c offers: a degree for each splittable
 * dimension that divides it, with a product that divides the number of devices. */
#include "profile-private.h"

#include <string.h>

typedef struct {
  int op;
  int64_t extent[SIM_MAX_DIMS + 4];
  char *key;
} Shape;

struct _ProfileShapes {
  GArray *shapes;            /* Shape                                                 */
  int n_configs;
};

#define MAX_ITER (SIM_MAX_DIMS + 4)

typedef struct {
  const SimGraph *g;
  int op, nd;
  int64_t size[MAX_ITER];
  gboolean split[MAX_ITER];
  int n_devices;
  int max_shapes;
  ProfileShapes *out;
  GHashTable *seen;          /* key -> TRUE                                           */
} Enum;

static gboolean has_work(const SimGraph *g, int op)
{
  SimWork w = { 0 };
  sim_graph_op_work(g, op, NULL, SIM_PASS_FORWARD, &w);
  if (w.n > 0)
    return TRUE;
  sim_graph_op_work(g, op, NULL, SIM_PASS_BACKWARD, &w);
  return w.n > 0;
}

static void add_shape(Enum *en, const int64_t *extent)
{
  en->out->n_configs++;
  char *key = sim_graph_op_shard_key(en->g, en->op, extent);
  if (g_hash_table_contains(en->seen, key) ||
      (en->max_shapes > 0 && (int)en->out->shapes->len >= en->max_shapes)) {
    g_free(key);
    return;
  }
  Shape s = { .op = en->op, .key = key };
  memcpy(s.extent, extent, sizeof(int64_t) * (size_t)en->nd);
  g_array_append_val(en->out->shapes, s);
  g_hash_table_add(en->seen, key);
}

static void degrees(Enum *en, int d, int product, int64_t *extent)
{
  if (d == en->nd) {
    add_shape(en, extent);
    return;
  }
  int room = en->n_devices / product;
  for (int k = 1; k <= room; k++) {
    if (room % k)
      continue;
    if (k > 1 && (!en->split[d] || en->size[d] % k))
      continue;
    extent[d] = en->size[d] / k;
    degrees(en, d + 1, product * k, extent);
  }
  extent[d] = en->size[d];
}

static void shard_key_free(gpointer p)
{
  Shape *s = p;
  g_free(s->key);
}

ProfileShapes *profile_enumerate_shapes(const SimGraph *g, const ProfileEnumerateOptions *o)
{
  g_return_val_if_fail(g != NULL && o != NULL && o->n_devices >= 1, NULL);
  ProfileShapes *out = g_new0(ProfileShapes, 1);
  out->shapes = g_array_new(FALSE, TRUE, sizeof(Shape));
  g_array_set_clear_func(out->shapes, shard_key_free);
  Enum en = {
    .g = g,
    .n_devices = o->n_devices,
    .max_shapes = o->max_shapes,
    .out = out,
    /* The keys are owned by the shapes. */
    .seen = g_hash_table_new(g_str_hash, g_str_equal),
  };
  static const int one = 1;
  const int *mbs = o->microbatches && o->n_microbatches > 0 ? o->microbatches : &one;
  int n_mbs = o->microbatches && o->n_microbatches > 0 ? o->n_microbatches : 1;
  for (int op = 0; op < sim_graph_n_ops(g); op++) {
    if (sim_graph_op_type(g, op) == SIM_OP_INPUT || !has_work(g, op))
      continue;
    en.op = op;
    en.nd = sim_graph_op_n_dims(g, op);
    g_assert(en.nd >= 1 && en.nd <= MAX_ITER);
    for (int i = 0; i < n_mbs; i++) {
      int mb = mbs[i];
      gboolean ok = mb >= 1;
      for (int d = 0; ok && d < en.nd; d++) {
        int64_t size = sim_graph_op_dim_size(g, op, d);
        /* Micro-batches cut the sample dimension (dimension 0) before any degree. */
        if (sim_graph_op_dim_role(g, op, d) == SIM_ROLE_SAMPLE && d == 0) {
          ok = size % mb == 0;
          size /= mb;
        }
        en.size[d] = size;
        en.split[d] = sim_graph_op_dim_splittable(g, op, d) && size > 1;
      }
      if (!ok)
        continue;
      /* A fused activation cannot take partial sums: strategies never split the
       * reduction under one (sim's validation refuses it), so neither does this. */
      if (sim_graph_op_fused_nonlinear(g, op))
        for (int d = 0; d < en.nd; d++)
          if (sim_graph_op_dim_role(g, op, d) == SIM_ROLE_REDUCTION)
            en.split[d] = FALSE;
      int64_t extent[MAX_ITER];
      memcpy(extent, en.size, sizeof extent);
      degrees(&en, 0, 1, extent);
    }
  }
  g_hash_table_unref(en.seen);
  return out;
}

void profile_shapes_free(ProfileShapes *s)
{
  if (!s)
    return;
  g_array_unref(s->shapes);
  g_free(s);
}

int profile_shapes_n(const ProfileShapes *s)
{
  g_return_val_if_fail(s != NULL, 0);
  return (int)s->shapes->len;
}

int profile_shapes_op(const ProfileShapes *s, int i)
{
  g_return_val_if_fail(s != NULL && i >= 0 && i < (int)s->shapes->len, -1);
  return g_array_index(s->shapes, Shape, i).op;
}

const int64_t *profile_shapes_extent(const ProfileShapes *s, int i)
{
  g_return_val_if_fail(s != NULL && i >= 0 && i < (int)s->shapes->len, NULL);
  return g_array_index(s->shapes, Shape, i).extent;
}

const char *profile_shapes_key(const ProfileShapes *s, int i)
{
  g_return_val_if_fail(s != NULL && i >= 0 && i < (int)s->shapes->len, NULL);
  return g_array_index(s->shapes, Shape, i).key;
}

int profile_shapes_n_configs(const ProfileShapes *s)
{
  g_return_val_if_fail(s != NULL, 0);
  return s->n_configs;
}
