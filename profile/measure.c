/* measure.c — timing operator shards with a runner: warm-up, repetitions, medians.
 *
 * The median of the timed runs is what the database keeps: one slow run (a page fault,
 * a clock change, another process) moves it far less than it moves a mean, and it is
 * what the executor's timelines are compared with (METHOD.md, "Time properly"). */
#include "profile-private.h"

void profile_runner_free(ProfileRunner *r)
{
  if (!r)
    return;
  if (r->klass && r->klass->release)
    r->klass->release(r);
  if (r->klass && r->klass->finalize)
    r->klass->finalize(r);
  g_free(r);
}

const char *profile_runner_device_name(ProfileRunner *r)
{
  g_return_val_if_fail(r != NULL && r->klass != NULL && r->klass->device_name != NULL, NULL);
  return r->klass->device_name(r);
}

ProfileMeasureOptions profile_measure_options_default(void)
{
  return (ProfileMeasureOptions){
    .warmup = 3,
    .repetitions = 10,
    .min_seconds = 0.0,
    .max_repetitions = 1000,
    .backward = TRUE,
    .update = FALSE,
  };
}

/* Whether the caller asked the measurement to stop; sets PROFILE_ERROR_INTERRUPTED. */
static gboolean stopped(const ProfileMeasureOptions *o, GError **error)
{
  if (!o->stop || !*o->stop)
    return FALSE;
  g_set_error(error, PROFILE_ERROR, PROFILE_ERROR_INTERRUPTED, "interrupted");
  return TRUE;
}

/* Times @pass of the prepared shard and adds its entry. */
static const ProfileOpEntry *time_pass(ProfileRunner *r, ProfileDb *db, const SimGraph *g,
                                       int op, const int64_t *extent, SimPass pass,
                                       const ProfileMeasureOptions *o, GError **error)
{
  int warmup = MAX(o->warmup, 0);
  int reps = MAX(o->repetitions, 1);
  int cap = MAX(o->max_repetitions, reps);
  if (warmup > 0) {
    g_autofree double *w = g_new(double, warmup);
    if (!r->klass->run(r, pass, warmup, w, error))
      return NULL;
  }
  g_autoptr(GArray) times = g_array_new(FALSE, FALSE, sizeof(double));
  double total = 0.0;
  int batch = reps;
  while (batch > 0) {
    if (stopped(o, error))
      return NULL;
    g_autofree double *t = g_new(double, batch);
    if (!r->klass->run(r, pass, batch, t, error))
      return NULL;
    for (int i = 0; i < batch; i++)
      total += t[i];
    g_array_append_vals(times, t, (guint)batch);
    /* With a time budget, repeat in growing batches until it is spent or the cap hit. */
    int have = (int)times->len;
    if (o->min_seconds <= 0.0 || total >= o->min_seconds || have >= cap)
      break;
    double per = total / have;
    int want = per > 0.0 ? (int)MIN((o->min_seconds - total) / per + 1, (double)cap) : cap;
    batch = MIN(MAX(want, 1), cap - have);
  }
  double *v = (double *)times->data;
  int n = (int)times->len;
  double median = profile_median(v, n);
  SimWork work = { 0 };
  sim_graph_op_work(g, op, extent, pass, &work);
  g_autofree char *key = sim_graph_op_shard_key(g, op, extent);
  const char *gpu = r->klass->device_name(r);
  ProfileOpEntry e = {
    .gpu = gpu,
    .key = key,
    .pass = pass,
    .median = median,
    .min = v[0],
    .max = v[n - 1],
    .repetitions = n,
    .flops = sim_work_flops(&work),
    .bytes = sim_work_bytes(&work),
    .n_kernels = work.n,
    .kernels = work.k,
  };
  profile_db_add_op(db, &e);
  return profile_db_find_op(db, gpu, key, pass);
}

static void add_notes(ProfileRunner *r, ProfileDb *db)
{
  if (!r->klass->device_notes)
    return;
  const char *const *notes = r->klass->device_notes(r);
  const char *gpu = r->klass->device_name(r);
  for (int i = 0; notes && notes[i] && notes[i + 1]; i += 2)
    profile_db_set_device_note(db, gpu, notes[i], notes[i + 1]);
}

const ProfileOpEntry *profile_measure_op(ProfileRunner *r, ProfileDb *db, const SimGraph *g,
                                         int op, const int64_t *extent, SimPass pass,
                                         const ProfileMeasureOptions *o, GError **error)
{
  g_return_val_if_fail(r != NULL && r->klass != NULL && db != NULL && g != NULL, NULL);
  g_return_val_if_fail(op >= 0 && op < sim_graph_n_ops(g), NULL);
  ProfileMeasureOptions def = profile_measure_options_default();
  if (!o)
    o = &def;
  if (!r->klass->prepare(r, g, op, extent, error))
    return NULL;
  const ProfileOpEntry *e = time_pass(r, db, g, op, extent, pass, o, error);
  if (r->klass->release)
    r->klass->release(r);
  if (e)
    add_notes(r, db);
  return e;
}

static gboolean has_weights(const SimGraph *g, int op)
{
  return sim_graph_op_n_weights(g, op) > 0 && sim_graph_op_weight_owner(g, op) == op;
}

int profile_measure_shapes(ProfileRunner *r, ProfileDb *db, const SimGraph *g,
                           const ProfileShapes *shapes, const ProfileMeasureOptions *o,
                           ProfileProgressFunc progress, gpointer user_data, int *n_skipped,
                           GError **error)
{
  g_return_val_if_fail(r != NULL && db != NULL && g != NULL && shapes != NULL, -1);
  ProfileMeasureOptions def = profile_measure_options_default();
  if (!o)
    o = &def;
  int added = 0, skipped = 0;
  int n = profile_shapes_n(shapes);
  for (int i = 0; i < n && !(o->stop && *o->stop); i++) {
    int op = profile_shapes_op(shapes, i);
    const int64_t *extent = profile_shapes_extent(shapes, i);
    SimPass passes[SIM_PASS_COUNT];
    int n_passes = 0;
    passes[n_passes++] = SIM_PASS_FORWARD;
    if (o->backward)
      passes[n_passes++] = SIM_PASS_BACKWARD;
    if (o->update && has_weights(g, op))
      passes[n_passes++] = SIM_PASS_UPDATE;
    g_autoptr(GError) e = NULL;
    gboolean ok = r->klass->prepare(r, g, op, extent, &e);
    for (int p = 0; ok && p < n_passes; p++) {
      SimWork w = { 0 };
      sim_graph_op_work(g, op, extent, passes[p], &w);
      if (w.n == 0)
        continue;
      if (time_pass(r, db, g, op, extent, passes[p], o, &e))
        added++;
      else
        ok = FALSE;
    }
    if (r->klass->release)
      r->klass->release(r);
    /* Stopped in the middle of this shape: the passes timed to the end are kept (each
     * entry stands alone), the one under way is not. */
    if (!ok && e && g_error_matches(e, PROFILE_ERROR, PROFILE_ERROR_INTERRUPTED))
      break;
    if (!ok) {
      /* A device that fails outright fails every later shape too: stop and say why.  An
       * operator the runner lacks, or one too large for the device, is only skipped. */
      if (e && e->domain == PROFILE_ERROR && e->code == PROFILE_ERROR_DEVICE) {
        g_propagate_error(error, g_steal_pointer(&e));
        if (n_skipped)
          *n_skipped = skipped;
        return -1;
      }
      g_printerr("parasol: skipping %s (%s): %s\n", profile_shapes_key(shapes, i),
                 sim_graph_op_name(g, op), e ? e->message : "failed");
      skipped++;
    }
    if (progress)
      progress(i + 1, n, profile_shapes_key(shapes, i), user_data);
  }
  add_notes(r, db);
  if (n_skipped)
    *n_skipped = skipped;
  return added;
}
