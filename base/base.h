/* base.h — libbase, the small utilities the libraries share: a stack of ints, memory for
 * large flat arrays (alloc.c), hashing of byte strings and an index of fixed-size byte
 * keys (keyindex.c), which the simulator's engine, network solver and lowering use.  The
 * library's other headers: heap.h (the min-heap) and json-read.h (the JSON reader of
 * parasol's files).  Depends on GLib (and json-glib for the reader) only. */
#pragma once

#include <glib.h>
#include <stddef.h>
#include <stdint.h>

G_BEGIN_DECLS

/* A stack of ints that grows by doubling: the engine's and the network solver's work
 * lists, pushed to and cleared millions of times a search without a call per element.
 * Zeroed it is empty; clearing is n = 0; g_free(v) frees it. */
typedef struct {
  int *v;
  int n, cap;
} SimIntStack;

/* Memory for a large flat array (a task graph's tasks, the engine's per-task state): at
 * 8 MiB and more it is aligned to 2 MiB and marked for transparent huge pages, so that
 * its first touch costs a fault per 2 MiB instead of per 4 KiB page (a million-task
 * graph touches gigabytes of fresh memory once).  Freed with g_free(); the contents of a
 * block passed to sim_large_renew() are not kept. */
#define SIM_HUGE_PAGE ((size_t)2 << 20)
gpointer sim_large_alloc(size_t bytes);
gpointer sim_large_renew(gpointer old, size_t bytes);

static inline void sim_int_stack_push(SimIntStack *a, int x)
{
  if (a->n == a->cap) {
    a->cap = a->cap ? 2 * a->cap : 64;
    a->v = g_renew(int, a->v, a->cap);
  }
  a->v[a->n++] = x;
}

/* A fast hash of a GBytes, for keys of hundreds of bytes and more (g_bytes_hash goes byte
 * by byte). */
guint sim_bytes_hash(gconstpointer bytes);
/* The hash under it, of @len bytes (keyindex.c). */
uint64_t sim_hash_bytes(const void *data, size_t len);

/* Numbers for fixed-size byte keys, 0, 1, 2... in the order they are first seen, each
 * with an int32 value for the caller (keyindex.c).  Clearing keeps the memory. */
typedef struct {
  size_t key_size;
  uint8_t *keys;      /* n keys, one after the other                                  */
  guint *pos;         /* per key: its slot in the table                               */
  int32_t *value;     /* per key: the caller's, 0 when added                          */
  int32_t *table;     /* key number + 1, or 0 for a free slot                          */
  uint64_t *hash;     /* per key: its hash                                             */
  guint n, cap, mask;
} SimKeyIndex;

void sim_key_index_init(SimKeyIndex *ki, size_t key_size);
void sim_key_index_clear(SimKeyIndex *ki);
void sim_key_index_free(SimKeyIndex *ki);
/* The number of @key (key_size bytes), added if new (@added says which). */
guint sim_key_index_get(SimKeyIndex *ki, const void *key, gboolean *added);
/* The same, the key's hash given: any function of the key's bytes, the same for equal
 * keys, used for every key of @ki (a key whose tail is always zero needs no hash of it). */
guint sim_key_index_get_hashed(SimKeyIndex *ki, const void *key, uint64_t hash,
                               gboolean *added);
/* Looks the @len bytes at @data up in @table (keyed by GBytes) without copying them: TRUE
 * if found, with its value in @value (unless NULL). */
gboolean sim_bytes_lookup(GHashTable *table, const void *data, size_t len, gpointer *value);

G_END_DECLS
