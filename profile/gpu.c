/* gpu.c — the entry points of the GPU measurements and the naming of GPUs; the work is
 * done in profile/cuda when the build has it, and fails with a clear message when not. */
#include "profile-private.h"
#include "parasol-config.h"

#include <string.h>

gboolean profile_have_cuda(void)
{
  return PARASOL_HAVE_GPU;
}

ProfileRunner *profile_runner_cuda_new(int device, const char *device_name, GError **error)
{
  g_return_val_if_fail(device >= 0, NULL);
  return profile_cuda_runner_new(device, device_name, error);
}

gboolean profile_measure_collectives(ProfileDb *db, const char *gpu, const ProfileCollOptions *o,
                                     GError **error)
{
  g_return_val_if_fail(db != NULL && o != NULL, FALSE);
  g_return_val_if_fail(o->kind >= 0 && o->kind < PROFILE_COLL_COUNT, FALSE);
  if (o->n_gpus < 2 && o->kind != PROFILE_COLL_SENDRECV) {
    g_set_error(error, PROFILE_ERROR, PROFILE_ERROR_INVALID,
                "%s over %d GPU: a collective needs at least 2",
                profile_coll_kind_name(o->kind), o->n_gpus);
    return FALSE;
  }
  if (!(o->min_bytes >= 1.0) || o->max_bytes < o->min_bytes) {
    g_set_error(error, PROFILE_ERROR, PROFILE_ERROR_INVALID,
                "sizes from %g to %g bytes: expected 1 <= min <= max", o->min_bytes,
                o->max_bytes);
    return FALSE;
  }
  return profile_cuda_measure_collectives(db, gpu, o, error);
}

char *profile_gpu_name_from_vendor(const char *vendor_name)
{
  g_return_val_if_fail(vendor_name != NULL, NULL);
  /* "NVIDIA A100-SXM4-80GB" -> "a100-sxm4-80gb", then shorter prefixes until the device
   * library knows one: "NVIDIA H100 80GB HBM3" ends at "h100-80gb" (an alias of
   * h100-sxm). */
  g_autofree char *s = g_ascii_strdown(vendor_name, -1);
  g_strstrip(s);
  const char *p = s;
  if (g_str_has_prefix(p, "nvidia "))
    p += strlen("nvidia ");
  if (g_str_has_prefix(p, "tesla "))
    p += strlen("tesla ");
  g_autofree char *name = g_strdup(p);
  for (char *c = name; *c; c++)
    if (*c == ' ' || *c == '_')
      *c = '-';
  g_autofree char *probe = g_strdup(name);
  for (;;) {
    const SimDeviceSpec *spec = sim_device_library_lookup(probe);
    if (spec)
      return g_strdup(spec->name);
    char *dash = strrchr(probe, '-');
    if (!dash)
      break;
    *dash = '\0';
  }
  return g_steal_pointer(&name);
}
