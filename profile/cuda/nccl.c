/* nccl.c — collective entries of a profile database from NCCL measurements
 * (collectives.cu): every size from the smallest to the largest, doubling. */
#include "../profile-private.h"
#include "cuda-desc.h"

gboolean profile_cuda_measure_collectives(ProfileDb *db, const char *gpu,
                                          const ProfileCollOptions *o, GError **error)
{
  char msg[1024] = "";
  int present = pcu_device_count(msg, sizeof msg);
  if (present < 0) {
    g_set_error(error, PROFILE_ERROR, PROFILE_ERROR_DEVICE, "no usable GPU: %s", msg);
    return FALSE;
  }
  int need = o->kind == PROFILE_COLL_SENDRECV ? MAX(o->n_gpus, 2) : o->n_gpus;
  if (need > present) {
    g_set_error(error, PROFILE_ERROR, PROFILE_ERROR_INVALID,
                "%s over %d GPUs: only %d present", profile_coll_kind_name(o->kind), need,
                present);
    return FALSE;
  }
  g_autofree char *name = NULL;
  if (gpu) {
    name = g_strdup(gpu);
  } else {
    char desc[2048] = "";
    pcu_device_describe(0, desc, sizeof desc);
    const char *vendor = "GPU";
    g_auto(GStrv) lines = g_strsplit(desc, "\n", -1);
    for (int i = 0; lines[i]; i++)
      if (g_str_has_prefix(lines[i], "name="))
        vendor = lines[i] + 5;
    name = profile_gpu_name_from_vendor(vendor);
  }
  int reps = MAX(o->repetitions, 1);
  g_autofree double *t = g_new(double, reps);
  g_autofree char *source = g_strdup_printf("parasol profile collectives: NCCL %s over %d GPUs "
                                            "of one process", profile_coll_kind_name(o->kind),
                                            need);
  for (double bytes = o->min_bytes; bytes <= o->max_bytes * (1 + 1e-9); bytes *= 2) {
    PcuStatus s = pcu_nccl_measure((int)o->kind, need, (size_t)bytes, MAX(o->warmup, 0), reps, t,
                                   msg, sizeof msg);
    if (s != PCU_OK) {
      g_set_error(error, PROFILE_ERROR,
                  s == PCU_ERR_NO_MEMORY ? PROFILE_ERROR_NO_MEMORY : PROFILE_ERROR_DEVICE,
                  "%s of %.0f bytes over %d GPUs: %s", profile_coll_kind_name(o->kind), bytes,
                  need, msg);
      return FALSE;
    }
    double median = profile_median(t, reps);
    ProfileCollEntry e = {
      .gpu = name,
      .kind = o->kind,
      .n_gpus = need,
      .bytes = bytes,
      .median = median,
      .min = t[0],
      .max = t[reps - 1],
      .repetitions = reps,
      .source = source,
    };
    profile_db_add_collective(db, &e);
  }
  return TRUE;
}
