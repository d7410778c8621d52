/* no-cuda.c — what the GPU measurements answer in a build without the CUDA part. */
#include "profile-private.h"

static void no_cuda(GError **error)
{
  g_set_error(error, PROFILE_ERROR, PROFILE_ERROR_DEVICE,
              "this parasol was built without CUDA (configure with -Dgpu=enabled on a "
              "machine with the CUDA toolkit, cuBLAS, cuDNN and NCCL)");
}

ProfileRunner *profile_cuda_runner_new(int device, const char *device_name, GError **error)
{
  no_cuda(error);
  return NULL;
}

gboolean profile_cuda_measure_collectives(ProfileDb *db, const char *gpu,
                                          const ProfileCollOptions *o, GError **error)
{
  no_cuda(error);
  return FALSE;
}
