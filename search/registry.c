/* registry.c — algorithms by name: the built-ins, registered in one list, and plugins
 * loaded from shared objects through GModule (docs/extending.md). */
#include "search-private.h"
#include "parasol-config.h"

#include <gmodule.h>
#include <string.h>

static GMutex registry_lock;
static GPtrArray *registry;   /* const SearchAlgorithm*, in registration order */

static gboolean valid_name(const char *name)
{
  if (!name || !*name)
    return FALSE;
  for (const char *c = name; *c; c++)
    if (!(g_ascii_islower(*c) || g_ascii_isdigit(*c) || *c == '-' || *c == '_' || *c == '.'))
      return FALSE;
  return TRUE;
}

static gboolean register_locked(const SearchAlgorithm *a, GError **error)
{
  /* Only the version is read from a struct of another version: its other slots may lie
   * elsewhere or hold something else. */
  if (a->api_version != SEARCH_ALGORITHM_API_VERSION) {
    g_set_error(error, SEARCH_ERROR, SEARCH_ERROR_PLUGIN,
                "an algorithm implements search interface version %d; this parasol has "
                "version %d",
                a->api_version, SEARCH_ALGORITHM_API_VERSION);
    return FALSE;
  }
  if (!valid_name(a->name) || !a->description || !a->run) {
    g_set_error(error, SEARCH_ERROR, SEARCH_ERROR_PLUGIN,
                "algorithm '%s' lacks a valid name (lower case letters, digits, '-', '_', "
                "'.'), a description or a run function",
                a->name ? a->name : "?");
    return FALSE;
  }
  if (!registry)
    registry = g_ptr_array_new();
  for (guint i = 0; i < registry->len; i++) {
    const SearchAlgorithm *b = g_ptr_array_index(registry, i);
    if (b == a)
      return TRUE;
    if (strcmp(b->name, a->name) == 0) {
      g_set_error(error, SEARCH_ERROR, SEARCH_ERROR_PLUGIN,
                  "an algorithm named '%s' is already registered", a->name);
      return FALSE;
    }
  }
  g_ptr_array_add(registry, (gpointer)a);
  return TRUE;
}

gboolean search_register(const SearchAlgorithm *a, GError **error)
{
  g_return_val_if_fail(a != NULL, FALSE);
  g_mutex_lock(&registry_lock);
  gboolean ok = register_locked(a, error);
  g_mutex_unlock(&registry_lock);
  return ok;
}

void search_register_builtins(void)
{
  /* Baselines first, then the searches, as `parasol search --list` shows them. */
  static const SearchAlgorithm *const builtins[] = {
    &search_algo_data_parallel,
    &search_algo_expert,
    &search_algo_owt,
    &search_algo_exhaustive,
    &search_algo_mcmc,
    &search_algo_optcnn,
    &search_algo_dp,
    &search_algo_pipeline,
    &search_algo_megatron,
    &search_algo_beam,
    &search_algo_subst,
#if PARASOL_HAVE_GLPK
    &search_algo_alpa,
#endif
  };
  for (gsize i = 0; i < G_N_ELEMENTS(builtins); i++) {
    GError *error = NULL;
    if (!search_register(builtins[i], &error))
      g_error("built-in search algorithm: %s", error->message);
  }
}

const SearchAlgorithm *search_lookup(const char *name)
{
  g_return_val_if_fail(name != NULL, NULL);
  const SearchAlgorithm *found = NULL;
  g_mutex_lock(&registry_lock);
  for (guint i = 0; registry && i < registry->len && !found; i++) {
    const SearchAlgorithm *a = g_ptr_array_index(registry, i);
    if (strcmp(a->name, name) == 0)
      found = a;
  }
  g_mutex_unlock(&registry_lock);
  return found;
}

int search_n_algorithms(void)
{
  g_mutex_lock(&registry_lock);
  int n = registry ? (int)registry->len : 0;
  g_mutex_unlock(&registry_lock);
  return n;
}

const SearchAlgorithm *search_algorithm_get(int i)
{
  g_mutex_lock(&registry_lock);
  const SearchAlgorithm *a = registry && i >= 0 && i < (int)registry->len
                               ? g_ptr_array_index(registry, i) : NULL;
  g_mutex_unlock(&registry_lock);
  return a;
}

const SearchAlgorithm *search_load_plugin(const char *path, GError **error)
{
  g_return_val_if_fail(path != NULL, NULL);
  if (!g_module_supported()) {
    g_set_error(error, SEARCH_ERROR, SEARCH_ERROR_PLUGIN,
                "%s: this system cannot load modules", path);
    return NULL;
  }
  /* A bare file name would make GModule search the library path; a plugin is a file. */
  g_autofree char *file = g_path_is_absolute(path) || strchr(path, '/')
                            ? g_strdup(path) : g_strconcat("./", path, NULL);
  GModule *module = g_module_open(file, G_MODULE_BIND_LOCAL);
  if (!module) {
    g_set_error(error, SEARCH_ERROR, SEARCH_ERROR_PLUGIN, "cannot load plugin %s: %s", path,
                g_module_error());
    return NULL;
  }
  gpointer sym = NULL;
  if (!g_module_symbol(module, SEARCH_PLUGIN_INIT_SYMBOL, &sym) || !sym) {
    g_set_error(error, SEARCH_ERROR, SEARCH_ERROR_PLUGIN,
                "plugin %s does not export %s()", path, SEARCH_PLUGIN_INIT_SYMBOL);
    g_module_close(module);
    return NULL;
  }
  const SearchAlgorithm *a = ((SearchPluginInitFunc)sym)();
  if (!a) {
    g_set_error(error, SEARCH_ERROR, SEARCH_ERROR_PLUGIN, "plugin %s returned no algorithm",
                path);
    g_module_close(module);
    return NULL;
  }
  if (a->api_version != SEARCH_ALGORITHM_API_VERSION) {
    g_set_error(error, SEARCH_ERROR, SEARCH_ERROR_PLUGIN,
                "plugin %s implements search interface version %d; this parasol has version %d "
                "(rebuild the plugin against this parasol's parasol-search.h)",
                path, a->api_version, SEARCH_ALGORITHM_API_VERSION);
    g_module_close(module);
    return NULL;
  }
  GError *e = NULL;
  if (!search_register(a, &e)) {
    g_set_error(error, SEARCH_ERROR, SEARCH_ERROR_PLUGIN, "plugin %s: %s", path, e->message);
    g_error_free(e);
    g_module_close(module);
    return NULL;
  }
  /* The algorithm's code lives in the module, so it stays loaded for the process's life. */
  g_module_make_resident(module);
  return a;
}
