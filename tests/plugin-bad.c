/* plugin-bad.c — plugins that misbehave, for test-search.  Built with -DFUTURE_VERSION: a
 * struct of another interface version, whose slot where this version keeps the name holds
 * no string; else an algorithm whose run fails without setting an error. */
#include "parasol-search.h"

__attribute__((visibility("default"))) const void *parasol_search_plugin_init(void);

#ifdef FUTURE_VERSION
static const struct {
  int api_version;
  gsize flags[6];
} future = { 99, { 1, 2, 3, 4, 5, 6 } };

const void *parasol_search_plugin_init(void)
{
  return &future;
}
#else
static gboolean silent_run(const SearchAlgorithm *self, SearchContext *ctx, GError **error)
{
  (void)self;
  (void)ctx;
  (void)error;
  return FALSE;
}

static const SearchAlgorithm silent = {
  .api_version = SEARCH_ALGORITHM_API_VERSION,
  .name = "silent-failure",
  .description = "fails without saying why (a test plugin)",
  .run = silent_run,
};

const void *parasol_search_plugin_init(void)
{
  return &silent;
}
#endif
