/* alloc.c — memory for large flat arrays (base.h): at 8 MiB and more, aligned to 2 MiB
 * and marked for transparent huge pages. */
#include "base.h"

#include <stdlib.h>
#include <sys/mman.h>

gpointer sim_large_alloc(size_t bytes)
{
  if (bytes < 4 * SIM_HUGE_PAGE)
    return g_malloc(MAX(bytes, 1));
  size_t rounded = (bytes + SIM_HUGE_PAGE - 1) & ~(SIM_HUGE_PAGE - 1);
  void *p = NULL;
  if (posix_memalign(&p, SIM_HUGE_PAGE, rounded) != 0)
    g_error("out of memory: %zu bytes", rounded);
#ifdef MADV_HUGEPAGE
  /* Advice only: without transparent huge pages the memory is ordinary. */
  (void)madvise(p, rounded, MADV_HUGEPAGE);
#endif
  return p;
}

gpointer sim_large_renew(gpointer old, size_t bytes)
{
  g_free(old);
  return sim_large_alloc(bytes);
}
