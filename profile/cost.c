/* cost.c — the profile cost model: the time of an operator shard as a profile database
 * measured it, exactly or interpolated, stacked on a fallback that prices what the
 * database does not know (sim/cost.c says how stacks work).
 *
 * Searches ask for the same few thousand shards millions of times, so answers are
 * cached by (device, pass, shard key); a miss is cached too, as a negative time, which
 * sends the shard straight to the fallback next time. */
#include "profile-private.h"

typedef struct {
  ProfileDb *db;
  char *gpu;                  /* NULL: each device's spec name                         */
  GMutex lock;                /* guards the cache and the database's lazy index         */
  GHashTable *cache;          /* index key -> double seconds (negative: miss)           */
  int exact, interpolated, missed;
} ProfileModel;

static double profile_op_time(SimCostModel *self, const SimDeviceSpec *dev, const SimGraph *g,
                              int op, const int64_t *extent, SimPass pass)
{
  ProfileModel *pm = self->priv;
  const char *gpu = pm->gpu ? pm->gpu : dev->name;
  if (!gpu)
    return -1.0;
  g_autofree char *key = sim_graph_op_shard_key(g, op, extent);
  char *ik = profile_op_index_key(gpu, pass, key);
  g_mutex_lock(&pm->lock);
  double *hit = g_hash_table_lookup(pm->cache, ik);
  if (hit) {
    double t = *hit;
    g_mutex_unlock(&pm->lock);
    g_free(ik);
    return t;
  }
  ProfileLookup how = PROFILE_LOOKUP_NONE;
  double t = profile_db_lookup_op(pm->db, gpu, g, op, extent, pass, &how);
  if (how == PROFILE_LOOKUP_EXACT)
    pm->exact++;
  else if (how == PROFILE_LOOKUP_INTERPOLATED)
    pm->interpolated++;
  else
    pm->missed++;
  g_hash_table_insert(pm->cache, ik, g_memdup2(&t, sizeof t));
  g_mutex_unlock(&pm->lock);
  return t;
}

/* The kernels of a shard the database does not know are priced by the fallback, which
 * the constructor guarantees. */
static double profile_kernel_time(SimCostModel *self, const SimDeviceSpec *dev,
                                  const SimKernel *k)
{
  return sim_cost_model_kernel_time(self->fallback, dev, k);
}

static void profile_finalize(SimCostModel *self)
{
  ProfileModel *pm = self->priv;
  profile_db_free(pm->db);
  g_free(pm->gpu);
  g_hash_table_unref(pm->cache);
  g_mutex_clear(&pm->lock);
  g_free(pm);
  self->priv = NULL;
}

static const SimCostModelClass profile_class = {
  .api_version = SIM_COST_MODEL_API_VERSION,
  .name = "profile",
  .kernel_time = profile_kernel_time,
  .op_time = profile_op_time,
  .finalize = profile_finalize,
};

SimCostModel *profile_cost_model_new(const ProfileDb *db, const char *gpu,
                                     SimCostModel *fallback)
{
  g_return_val_if_fail(db != NULL, NULL);
  ProfileModel *pm = g_new0(ProfileModel, 1);
  pm->db = profile_db_new();
  profile_db_merge(pm->db, db);
  pm->gpu = g_strdup(gpu);
  g_mutex_init(&pm->lock);
  pm->cache = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
  /* sim_cost_model_free() releases the stack with g_free(), so the model is allocated
   * with g_new0 (sim/cost.c). */
  SimCostModel *m = g_new0(SimCostModel, 1);
  m->klass = &profile_class;
  m->priv = pm;
  m->fallback = fallback ? fallback : sim_cost_model_new_roofline(NULL);
  return m;
}

gboolean profile_cost_model_stats(SimCostModel *m, int *exact, int *interpolated, int *missed)
{
  g_return_val_if_fail(m != NULL, FALSE);
  if (m->klass != &profile_class)
    return FALSE;
  ProfileModel *pm = m->priv;
  g_mutex_lock(&pm->lock);
  if (exact)
    *exact = pm->exact;
  if (interpolated)
    *interpolated = pm->interpolated;
  if (missed)
    *missed = pm->missed;
  g_mutex_unlock(&pm->lock);
  return TRUE;
}
