/* test-gpu-loading.c — how the CUDA libraries are loaded (suite unit, GPU builds only;
 * needs no GPU).  cuBLAS is not linked into parasol: loading it costs every process
 * about 0.1 s and 210 MB before main() runs, so gpu/cublas-load.c opens it when
 * the first GPU context needs it.  These tests check that a program linked with the
 * profiler starts without it and that the loader then finds every function it forwards. */
#include <criterion/criterion.h>
#include <link.h>
#include <string.h>

#include "parasol-cuda.h"

static int find_cublas(struct dl_phdr_info *info, size_t size, void *data)
{
  if (info->dlpi_name && strstr(info->dlpi_name, "/libcublas.so"))
    *(int *)data = 1;
  return 0;
}

static int cublas_loaded(void)
{
  int found = 0;
  dl_iterate_phdr(find_cublas, &found);
  return found;
}

Test(loading, cublas_is_opened_on_first_use)
{
  /* Linked with the whole CUDA part, and yet not loaded at start. */
  cr_expect_eq(cublas_loaded(), 0, "libcublas was loaded before anything asked for it");
  const char *why = pcu_cublas_load();
  cr_assert_null(why, "%s", why);
  cr_expect_eq(cublas_loaded(), 1, "pcu_cublas_load() succeeded without loading libcublas");
  /* A second call finds it ready. */
  cr_expect_null(pcu_cublas_load());
}
