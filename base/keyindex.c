/* keyindex.c — hashing of byte strings, and numbers for fixed-size byte keys
 * (SimKeyIndex): each key gets the next number the first time it is seen.  The lowering dedupes regions and transfers this way
 * thousands of times per search step; a hash table of GBytes allocated a key, a table
 * and its nodes for each.  Here the keys live in one array, the table is open addressing
 * kept at most half full, and clearing forgets the keys but keeps the memory. */
#include "base.h"

#include <string.h>

uint64_t sim_hash_bytes(const void *data, size_t len)
{
  /* Eight bytes at a time (keys run to kilobytes: a collective's flows).  A long key is
   * hashed by its length, its first and its last 512 bytes: keys that differ only in
   * between share a bucket and equality tells them apart. */
  const uint8_t *d = data;
  uint64_t h = 0x9e3779b97f4a7c15u ^ len;
  size_t parts[2][2] = { { 0, len }, { 0, 0 } };
  if (len > 1024) {
    parts[0][1] = 512;
    parts[1][0] = len - 512;
    parts[1][1] = len;
  }
  for (int p = 0; p < 2; p++) {
    size_t i = parts[p][0], end = parts[p][1];
    for (; i + 8 <= end; i += 8) {
      uint64_t w;
      memcpy(&w, d + i, 8);
      h = (h ^ w) * 0xff51afd7ed558ccdu;
      h ^= h >> 32;
    }
    for (; i < end; i++)
      h = (h ^ d[i]) * 0x100000001b3u;
  }
  return h;
}

void sim_key_index_init(SimKeyIndex *ki, size_t key_size)
{
  memset(ki, 0, sizeof *ki);
  ki->key_size = key_size;
}

void sim_key_index_clear(SimKeyIndex *ki)
{
  /* Only the slots the keys took. */
  for (guint i = 0; i < ki->n; i++)
    ki->table[ki->pos[i]] = 0;
  ki->n = 0;
}

void sim_key_index_free(SimKeyIndex *ki)
{
  g_free(ki->keys);
  g_free(ki->pos);
  g_free(ki->value);
  g_free(ki->table);
  g_free(ki->hash);
  memset(ki, 0, sizeof *ki);
}

static guint find_slot(const SimKeyIndex *ki, const void *key, uint64_t h, gboolean *found)
{
  guint s = (guint)(h ^ (h >> 29)) & ki->mask;
  for (;;) {
    int32_t e = ki->table[s];
    if (e == 0) {
      *found = FALSE;
      return s;
    }
    if (!memcmp(ki->keys + (size_t)(e - 1) * ki->key_size, key, ki->key_size)) {
      *found = TRUE;
      return s;
    }
    s = (s + 1) & ki->mask;
  }
}

static void grow(SimKeyIndex *ki)
{
  guint size = ki->table ? 2 * (ki->mask + 1) : 64;
  g_free(ki->table);
  ki->table = g_new0(int32_t, size);
  ki->mask = size - 1;
  ki->cap = size / 2;
  ki->keys = g_realloc(ki->keys, (size_t)ki->cap * ki->key_size);
  ki->pos = g_renew(guint, ki->pos, ki->cap);
  ki->value = g_renew(int32_t, ki->value, ki->cap);
  ki->hash = g_renew(uint64_t, ki->hash, ki->cap);
  for (guint i = 0; i < ki->n; i++) {
    const uint8_t *k = ki->keys + (size_t)i * ki->key_size;
    gboolean found;
    guint s = find_slot(ki, k, ki->hash[i], &found);
    ki->table[s] = (int32_t)i + 1;
    ki->pos[i] = s;
  }
}

guint sim_key_index_get(SimKeyIndex *ki, const void *key, gboolean *added)
{
  return sim_key_index_get_hashed(ki, key, sim_hash_bytes(key, ki->key_size), added);
}

guint sim_key_index_get_hashed(SimKeyIndex *ki, const void *key, uint64_t h, gboolean *added)
{
  if (ki->n == ki->cap)
    grow(ki);
  gboolean found;
  guint s = find_slot(ki, key, h, &found);
  if (found) {
    *added = FALSE;
    return (guint)ki->table[s] - 1;
  }
  guint i = ki->n++;
  memcpy(ki->keys + (size_t)i * ki->key_size, key, ki->key_size);
  ki->table[s] = (int32_t)i + 1;
  ki->pos[i] = s;
  ki->hash[i] = h;
  ki->value[i] = 0;
  *added = TRUE;
  return i;
}

guint sim_bytes_hash(gconstpointer p)
{
  gsize len;
  const uint8_t *d = g_bytes_get_data((GBytes *)p, &len);
  uint64_t h = sim_hash_bytes(d, len);
  return (guint)(h ^ (h >> 29));
}

gboolean sim_bytes_lookup(GHashTable *table, const void *data, size_t len, gpointer *value)
{
  GBytes *probe = g_bytes_new_static(data, len);
  gboolean found = g_hash_table_lookup_extended(table, probe, NULL, value);
  g_bytes_unref(probe);
  return found;
}
