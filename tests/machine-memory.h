/* machine-memory.h — a test's copy of a machine whose GPUs have another memory size
 * (shared by test-simulate.c and fuzz-plans.c). */
#pragma once

#include <json-glib/json-glib.h>
#include "parasol-sim.h"

/* @m with GPUs of @bytes of memory each: its description, the GPU given inline as the
 * machine's own GPU with that memory.  NULL with @error where the copy does not load. */
static inline SimMachine *machine_with_memory(const SimMachine *m, double bytes, GError **error)
{
  g_autofree char *text = sim_machine_to_json(m);
  g_autoptr(JsonParser) parser = json_parser_new();
  if (!json_parser_load_from_data(parser, text, -1, error))
    return NULL;
  JsonObject *desc = json_node_get_object(json_parser_get_root(parser));
  JsonObject *node = json_object_get_object_member(desc, "node");
  g_autofree char *gpu = g_strdup(json_object_get_string_member(node, "gpu"));
  JsonObject *spec = json_object_new();
  json_object_set_string_member(spec, "name", "small");
  json_object_set_string_member(spec, "base", gpu);
  json_object_set_double_member(spec, "memory_GiB", bytes / (1024.0 * 1024 * 1024));
  json_object_set_object_member(node, "gpu", spec);
  g_autofree char *small = json_to_string(json_parser_get_root(parser), FALSE);
  return sim_machine_from_json(small, "small.json", 0, error);
}
