/* network.c — flows on routes that share links by max-min fairness.
 *
 * A flow may cross one link several times (one flow standing for a whole collective
 * whose ring passes a bridge twice); it then counts that many times on the link, which
 * is weighted max-min fairness with integer weights.
 *
 * A flow holds its remaining bytes as of the last time its rate changed; between
 * changes it drains at a constant rate, so the engine needs to hear only about flows
 * whose rate changes.  When flows start or end, only the connected component of links
 * and flows around them is re-solved, by progressive filling (SimGrid's max-min model,
 * network_cm02): raise every flow's rate together until a link saturates, fix the flows
 * crossing it, and repeat with what capacity is left.
 *
 * The rates the filling gives a component depend only on the routes of its flows: in
 * each round every flow fixed subtracts the same share from its links, so neither the
 * order of the links nor that of the flows changes a bit of the result, and components
 * that do not meet come out the same whether filled together or apart.  A net with
 * memory (sim_net_set_memory: a delta session's, whose engine lives from run to run)
 * therefore keeps what it worked out, with every route interned as a number by its
 * links: the rates of each component by its routes in slot order, and, when the
 * component held every active flow, the rate of each route by the multiset of routes
 * (a hash of which adding and removing flows keeps up to date, so that no component
 * search is needed to find it).  When the same traffic comes back, the rates come from
 * memory: on MCMC over 64 GPUs, about half the solves find the whole network in memory
 * and half of the rest their component.  Either way the engine hears of the new rates
 * in slot order, so it runs the same events, bit for bit, with memory or without. */
#include "network.h"
#include "collective.h"
#include "base.h"

#include <math.h>
#include <string.h>

typedef struct {
  int task;           /* -1 when the slot is free */
  int n_links;
  int route;          /* the links' number in SimNet.routes */
  uint8_t fixed;
  uint8_t in_comp;
  uint8_t level;      /* the round of the filling that fixed it */
  const int *links;
  double rate;
  int *pos;           /* the flow's index in each of its links' lists */
  double remaining;
  double next_rate;   /* the filling's result, handed out once it is done */
  double last;
} Flow;

typedef struct {
  int *flows;         /* slots of the active flows on this link */
  int *hop;           /* for each, the index of this link in the flow's route */
  int n, cap;
  double capacity;
  double rem;
  double share;       /* rem / cnt, in the current round of the filling */
  int cnt;
  gboolean dirty;
  gboolean in_comp;
} Link;

/* A sequence of ints with its hash, as a hash table key. */
typedef struct {
  guint hash;
  int n;
  int v[];
} IntSeq;

/* Rates worked out before: components by their routes in slot order (IntSeq -> double
 * rates) and the wholes (guint64 hash -> Whole*, chained), with what they take. */
typedef struct {
  GHashTable *comps;
  GHashTable *wholes;
  size_t bytes;
} Memory;

struct _SimNet {
  const SimMachine *machine;
  int n_links;
  Link *link;
  Flow *flow;
  int n_flows, cap_flows;
  SimIntStack free_slots;
  SimIntStack dirty_links;
  SimIntStack comp_links;
  SimIntStack comp_flows;
  SimIntStack tied;        /* links at the smallest share in a round of the filling */
  double *link_bytes;
  int n_active;
  /* Routes by their links (IntSeq -> its number + 1), with memory on. */
  GHashTable *routes;
  gboolean remember;  /* sim_net_set_memory() */
  size_t limit;       /* what the memory may take, both halves */
  int64_t recalled;   /* solves answered from memory (sim_net_memory_hits) */
  int *key;           /* scratch: where each distinct route of a component first stands */
  int key_cap;
  /* The active flows as a multiset of routes: how many flows each route carries, and a
   * hash of the whole that adding or removing a flow updates; the rates of each such
   * multiset that was one component when it was solved (guint64 hash -> Whole*, chained). */
  int *route_count;
  int route_cap;
  guint64 whole_hash;
  Memory mem[2];      /* [0] what was solved lately, [1] what was solved before that */
  int *stamp;         /* per route, scratch for listing a component's routes once */
  int stamp_now;
  double *route_rate; /* per route, scratch for handing out a remembered whole's rates */
  uint8_t *mark;      /* per slot, scratch for putting a component in slot order */
  int mark_cap;
  int *sort;          /* scratch for the same */
  int sort_cap;
  IntSeq *probe;      /* scratch for a component's key */
  int probe_cap;
  /* Solves left that take the whole network as their component without searching: set
   * to whole_run when a search found a component of at least half the active flows and
   * of whole_min or more, while the active flows stay under twice whole_base (their
   * number then). */
  int whole_turns;
  int whole_run;
  int whole_min;
  int whole_base;
  int64_t whole_solves;  /* solves that did so (sim_net_whole_solves) */
};

/* A component's rates: the few values the filling's rounds gave (one a round) and, for
 * each flow in slot order, which of them it got. */
typedef struct {
  int n;
  double value[];     /* then uint8_t level[flows] */
} Rates;

static inline uint8_t *rates_level(Rates *r)
{
  return (uint8_t *)(r->value + r->n);
}

/* The rates of every active flow when the active flows formed one component: the
 * distinct routes, how many flows each carried and the rate each got (level[] of
 * value[]). */
typedef struct Whole {
  guint64 hash;
  int n_active;
  int n;
  struct Whole *next;   /* another multiset with the same hash */
  int *route;
  int *count;
  uint8_t *level;
  int n_values;
  double *value;
} Whole;

static guint int_seq_hash(const int *v, int n)
{
  guint32 h = 2166136261u ^ (guint32)n;
  for (int i = 0; i < n; i++)
    h = (h ^ (guint32)v[i]) * 16777619u;
  return h;
}

static guint int_seq_hash_func(gconstpointer k)
{
  return ((const IntSeq *)k)->hash;
}

static gboolean int_seq_equal(gconstpointer a, gconstpointer b)
{
  const IntSeq *x = a, *y = b;
  return x->hash == y->hash && x->n == y->n &&
         memcmp(x->v, y->v, (size_t)x->n * sizeof(int)) == 0;
}

static IntSeq *int_seq_new(const int *v, int n, guint hash)
{
  IntSeq *k = g_malloc(sizeof(IntSeq) + (size_t)n * sizeof(int));
  k->hash = hash;
  k->n = n;
  memcpy(k->v, v, (size_t)n * sizeof(int));
  return k;
}

/* A route's share of a multiset's hash (splitmix64's finalizer: sums of these rarely
 * collide, and a collision only costs a comparison). */
static inline guint64 route_hash(int route)
{
  guint64 x = (guint64)route * 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

static void whole_free(gpointer p)
{
  Whole *w = p;
  while (w) {
    Whole *next = w->next;
    g_free(w->route);
    g_free(w->count);
    g_free(w->level);
    g_free(w->value);
    g_free(w);
    w = next;
  }
}

static void memory_init(Memory *m)
{
  m->comps = g_hash_table_new_full(int_seq_hash_func, int_seq_equal, g_free, g_free);
  m->wholes = g_hash_table_new_full(g_int64_hash, g_int64_equal, NULL, whole_free);
  m->bytes = 0;
}

static void memory_destroy(Memory *m)
{
  g_hash_table_destroy(m->comps);
  g_hash_table_destroy(m->wholes);
}

/* Components of more flows than this are not remembered: on a search over 256 GPUs they
 * hold up to a hundred thousand flows, a key each as large, and hardly ever come back
 * (their wholes, a rate per distinct route, are still kept). */
#define COMP_MEMORY_MAX 4096

static inline size_t comp_bytes(const IntSeq *key, const Rates *r)
{
  return sizeof(IntSeq) + (size_t)key->n * (sizeof(int) + 1) + sizeof(Rates) +
         (size_t)r->n * sizeof(double) + 64;
}

static inline size_t whole_bytes(const Whole *w)
{
  return sizeof(Whole) + (size_t)w->n * (2 * sizeof(int) + 1) +
         (size_t)w->n_values * sizeof(double) + 96;
}

/* Counts @bytes more in the recent memory, first making it the older one (and forgetting
 * the older) if that would overfill it: when the recent half is full, the older half is
 * forgotten and the recent one takes its place (what is found in the older half moves
 * back to the recent one), so the rates in use stay and the rest go. */
static void memory_grow(SimNet *net, size_t bytes)
{
  if (net->mem[0].bytes + bytes > net->limit / 2) {
    Memory t = net->mem[1];
    g_hash_table_remove_all(t.comps);
    g_hash_table_remove_all(t.wholes);
    t.bytes = 0;
    net->mem[1] = net->mem[0];
    net->mem[0] = t;
  }
  net->mem[0].bytes += bytes;
}

/* The rates of the component @probe, or NULL. */
static Rates *comp_recall(SimNet *net, const IntSeq *probe)
{
  Rates *r = g_hash_table_lookup(net->mem[0].comps, probe);
  if (r)
    return r;
  gpointer k, v;
  if (!g_hash_table_steal_extended(net->mem[1].comps, probe, &k, &v))
    return NULL;
  size_t b = comp_bytes(k, v);
  net->mem[1].bytes -= b;
  memory_grow(net, b);
  g_hash_table_insert(net->mem[0].comps, k, v);
  return v;
}

/* Keeps @rates (the table's from now on) as those of the component @key. */
static void comp_remember(SimNet *net, IntSeq *key, Rates *rates)
{
  memory_grow(net, comp_bytes(key, rates));
  g_hash_table_insert(net->mem[0].comps, key, rates);
}

static void whole_remember_one(SimNet *net, Whole *w)
{
  memory_grow(net, whole_bytes(w));
  Whole *head = g_hash_table_lookup(net->mem[0].wholes, &w->hash);
  if (head) {
    w->next = head->next;
    head->next = w;
  } else {
    w->next = NULL;
    g_hash_table_insert(net->mem[0].wholes, &w->hash, w);
  }
}

/* The whole in @t that is the multiset of the active flows, or NULL. */
static const Whole *whole_find(const SimNet *net, GHashTable *t)
{
  const Whole *w = g_hash_table_lookup(t, &net->whole_hash);
  for (; w; w = w->next) {
    if (w->n_active != net->n_active)
      continue;
    int i = 0;
    while (i < w->n && net->route_count[w->route[i]] == w->count[i])
      i++;
    if (i == w->n)
      return w;
  }
  return NULL;
}

/* The number of the route made of @links. */
static int route_id(SimNet *net, const int *links, int n_links)
{
  IntSeq *probe = g_alloca(sizeof(IntSeq) + (size_t)n_links * sizeof(int));
  probe->hash = int_seq_hash(links, n_links);
  probe->n = n_links;
  memcpy(probe->v, links, (size_t)n_links * sizeof(int));
  gpointer id = g_hash_table_lookup(net->routes, probe);
  if (id)
    return GPOINTER_TO_INT(id) - 1;
  int n = (int)g_hash_table_size(net->routes);
  g_hash_table_insert(net->routes, int_seq_new(links, n_links, probe->hash),
                      GINT_TO_POINTER(n + 1));
  if (n >= net->route_cap) {
    int cap = MAX(64, 2 * net->route_cap);
    net->route_count = g_renew(int, net->route_count, cap);
    net->stamp = g_renew(int, net->stamp, cap);
    net->route_rate = g_renew(double, net->route_rate, cap);
    for (int i = net->route_cap; i < cap; i++) {
      net->route_count[i] = 0;
      net->stamp[i] = 0;
    }
    net->route_cap = cap;
  }
  return n;
}

SimNet *sim_net_new(const SimMachine *m, const SimCollParams *cp)
{
  SimNet *net = g_new0(SimNet, 1);
  net->machine = m;
  net->n_links = sim_machine_n_links(m);
  net->link = g_new0(Link, net->n_links > 0 ? net->n_links : 1);
  for (int l = 0; l < net->n_links; l++)
    net->link[l].capacity = sim_coll_link_capacity(m, cp, l);
  net->link_bytes = g_new0(double, net->n_links > 0 ? net->n_links : 1);
  net->routes = g_hash_table_new_full(int_seq_hash_func, int_seq_equal, g_free, NULL);
  memory_init(&net->mem[0]);
  memory_init(&net->mem[1]);
  net->whole_run = SIM_NET_WHOLE_RUN;
  net->whole_min = SIM_NET_WHOLE_MIN;
  return net;
}

/* Forgets @net's flows (their routes' counts are the caller's). */
static void forget_flows(SimNet *net)
{
  for (int i = 0; i < net->n_flows; i++)
    g_free(net->flow[i].pos);
  net->n_flows = 0;
  net->n_active = 0;
  net->free_slots.n = 0;
  net->dirty_links.n = 0;
  net->whole_turns = 0;
  net->whole_hash = 0;
}

/* Forgets what link @l carried. */
static void forget_link(SimNet *net, int l)
{
  net->link[l].n = 0;
  net->link[l].dirty = FALSE;
  net->link[l].in_comp = FALSE;
  net->link_bytes[l] = 0;
}

void sim_net_reset(SimNet *net)
{
  forget_flows(net);
  for (int r = 0; r < net->route_cap; r++)
    net->route_count[r] = 0;
  for (int l = 0; l < net->n_links; l++)
    forget_link(net, l);
}

void sim_net_reset_links(SimNet *net, const int *const *links, const int *n_links, int n)
{
  /* A flow still under way holds its route's count; an ended one gave it back. */
  for (int i = 0; i < net->n_flows; i++)
    if (net->flow[i].task >= 0 && net->flow[i].route >= 0)
      net->route_count[net->flow[i].route] = 0;
  forget_flows(net);
  for (int i = 0; i < n; i++)
    for (int h = 0; h < n_links[i]; h++)
      forget_link(net, links[i][h]);
}

void sim_net_free(SimNet *net)
{
  if (!net)
    return;
  for (int i = 0; i < net->n_flows; i++)
    g_free(net->flow[i].pos);
  for (int l = 0; l < net->n_links; l++) {
    g_free(net->link[l].flows);
    g_free(net->link[l].hop);
  }
  g_free(net->link);
  g_free(net->flow);
  g_free(net->free_slots.v);
  g_free(net->dirty_links.v);
  g_free(net->comp_links.v);
  g_free(net->comp_flows.v);
  g_free(net->tied.v);
  g_free(net->link_bytes);
  g_hash_table_destroy(net->routes);
  memory_destroy(&net->mem[0]);
  memory_destroy(&net->mem[1]);
  g_free(net->key);
  g_free(net->route_count);
  g_free(net->stamp);
  g_free(net->route_rate);
  g_free(net->mark);
  g_free(net->sort);
  g_free(net->probe);
  g_free(net);
}

static void mark_dirty(SimNet *net, int l)
{
  if (!net->link[l].dirty) {
    net->link[l].dirty = TRUE;
    sim_int_stack_push(&net->dirty_links, l);
  }
}

/* Forgets which links changed: a solve that takes them all has no use for the list. */
static void clear_dirty(SimNet *net)
{
  for (int i = 0; i < net->dirty_links.n; i++)
    net->link[net->dirty_links.v[i]].dirty = FALSE;
  net->dirty_links.n = 0;
}

int sim_net_add(SimNet *net, int task, const int *links, int n_links, double bytes, double now)
{
  sim_net_account(net, links, n_links, bytes);
  return sim_net_resume(net, task, links, n_links, bytes, now);
}

void sim_net_account(SimNet *net, const int *links, int n_links, double bytes)
{
  for (int h = 0; h < n_links; h++)
    net->link_bytes[links[h]] += bytes;
}

gboolean sim_net_link_busy(const SimNet *net, int link)
{
  return net->link[link].n > 0;
}

void sim_net_flow_state(const SimNet *net, int slot, double *remaining, double *rate)
{
  *remaining = net->flow[slot].remaining;
  *rate = net->flow[slot].rate;
}

int sim_net_resume(SimNet *net, int task, const int *links, int n_links, double bytes,
                   double now)
{
  int slot;
  if (net->free_slots.n) {
    slot = net->free_slots.v[--net->free_slots.n];
  } else {
    if (net->n_flows == net->cap_flows) {
      net->cap_flows = net->cap_flows ? net->cap_flows * 2 : 64;
      net->flow = g_renew(Flow, net->flow, net->cap_flows);
    }
    slot = net->n_flows++;
    net->flow[slot].pos = NULL;
    net->flow[slot].n_links = 0;
  }
  Flow *f = &net->flow[slot];
  if (f->n_links < n_links || !f->pos) {
    g_free(f->pos);
    f->pos = g_new(int, n_links > 0 ? n_links : 1);
  }
  f->task = task;
  f->links = links;
  f->n_links = n_links;
  f->route = -1;
  if (net->remember) {
    f->route = route_id(net, links, n_links);
    net->route_count[f->route]++;
    net->whole_hash += route_hash(f->route);
  }
  f->remaining = bytes;
  f->rate = 0.0;
  f->last = now;
  f->fixed = FALSE;
  f->in_comp = FALSE;
  for (int h = 0; h < n_links; h++) {
    Link *l = &net->link[links[h]];
    if (l->n == l->cap) {
      l->cap = l->cap ? l->cap * 2 : 8;
      l->flows = g_renew(int, l->flows, l->cap);
      l->hop = g_renew(int, l->hop, l->cap);
    }
    f->pos[h] = l->n;
    l->hop[l->n] = h;
    l->flows[l->n++] = slot;
    mark_dirty(net, links[h]);
  }
  net->n_active++;
  return slot;
}

void sim_net_remove(SimNet *net, int slot, double now)
{
  Flow *f = &net->flow[slot];
  for (int h = 0; h < f->n_links; h++) {
    Link *l = &net->link[f->links[h]];
    /* Swap-remove, and tell the moved entry its new position on this link (through
     * the hop it stands for: a flow may cross a link more than once, a collective's
     * ring through a shared bridge). */
    int p = f->pos[h];
    int last = --l->n;
    l->flows[p] = l->flows[last];
    l->hop[p] = l->hop[last];
    net->flow[l->flows[p]].pos[l->hop[p]] = p;
    mark_dirty(net, f->links[h]);
  }
  f->task = -1;
  if (f->route >= 0) {
    net->route_count[f->route]--;
    net->whole_hash -= route_hash(f->route);
  }
  net->n_active--;
  sim_int_stack_push(&net->free_slots, slot);
}

/* Gives flow @f the rate @r from @now on, settling the bytes it drained at its old rate,
 * and reports its new end if the rate changed. */
static inline void set_rate(Flow *f, double r, double now, SimNetRescheduleFunc fn, void *user)
{
  if (r == f->rate)
    return;
  f->remaining -= f->rate * (now - f->last);
  if (f->remaining < 0)
    f->remaining = 0;
  f->last = now;
  f->rate = r;
  fn(user, f->task, f->rate > 0 ? now + f->remaining / f->rate : INFINITY);
}

/* If the active flows, as a multiset of routes, are one that was solved as a single
 * component, hands every flow the rate its route got then (in slot order) and says so.
 * The rates a run holds are always the max-min rates of its components, bit for bit
 * those a single filling over every flow would give (flows of separate components never
 * meet in the filling), so the rates from memory are those the solve would find. */
static gboolean whole_recall(SimNet *net, double now, SimNetRescheduleFunc fn, void *user)
{
  const Whole *w = whole_find(net, net->mem[0].wholes);
  if (!w) {
    const Whole *old = whole_find(net, net->mem[1].wholes);
    if (!old)
      return FALSE;
    /* Kept in the recent memory from now on (a copy: the older one may go meanwhile). */
    Whole *c = g_new(Whole, 1);
    *c = *old;
    c->route = g_memdup2(old->route, (size_t)old->n * sizeof(int));
    c->count = g_memdup2(old->count, (size_t)old->n * sizeof(int));
    c->level = g_memdup2(old->level, (size_t)old->n);
    c->value = g_memdup2(old->value, (size_t)old->n_values * sizeof(double));
    whole_remember_one(net, c);
    w = c;
  }
  for (int i = 0; i < w->n; i++)
    net->route_rate[w->route[i]] = w->value[w->level[i]];
  clear_dirty(net);
  for (int s = 0; s < net->n_flows; s++) {
    Flow *f = &net->flow[s];
    if (f->task >= 0)
      set_rate(f, net->route_rate[f->route], now, fn, user);
  }
  return TRUE;
}

/* Remembers the rates of the active flows, which form one component (@rates in the
 * order of comp_flows). */
static void whole_remember(SimNet *net, Rates *rates)
{
  const SimIntStack *cf = &net->comp_flows;
  const uint8_t *level = rates_level(rates);
  if (net->key_cap < cf->n) {
    net->key_cap = MAX(cf->n, 2 * net->key_cap);
    net->key = g_renew(int, net->key, net->key_cap);
  }
  net->stamp_now++;
  int n = 0;
  for (int i = 0; i < cf->n; i++) {
    int r = net->flow[cf->v[i]].route;
    if (net->stamp[r] != net->stamp_now) {
      net->stamp[r] = net->stamp_now;
      net->key[n++] = i;
    }
  }
  Whole *w = g_new(Whole, 1);
  w->hash = net->whole_hash;
  w->n_active = net->n_active;
  w->n = n;
  w->next = NULL;
  w->route = g_new(int, n);
  w->count = g_new(int, n);
  w->level = g_new(uint8_t, n);
  w->n_values = rates->n;
  w->value = g_memdup2(rates->value, (size_t)rates->n * sizeof(double));
  for (int k = 0; k < n; k++) {
    int i = net->key[k];
    w->route[k] = net->flow[cf->v[i]].route;
    w->count[k] = net->route_count[w->route[k]];
    w->level[k] = level[i];
  }
  whole_remember_one(net, w);
}

/* Puts the component's flows in slot order, the order in which the engine hears of their
 * new rates whichever way they were found: by insertion when it is small, by marks over
 * the slots when it holds a good part of them, else by a radix sort on the slots' bytes. */
static void comp_in_slot_order(SimNet *net)
{
  SimIntStack *cf = &net->comp_flows;
  int n = cf->n;
  if (n <= 32) {
    int *v = cf->v;
    for (int i = 1; i < n; i++) {
      int x = v[i], j = i;
      for (; j > 0 && v[j - 1] > x; j--)
        v[j] = v[j - 1];
      v[j] = x;
    }
    return;
  }
  if ((size_t)n * 16 >= (size_t)net->n_flows) {
    if (net->mark_cap < net->n_flows) {
      net->mark_cap = MAX(net->n_flows, 2 * net->mark_cap);
      net->mark = g_renew(uint8_t, net->mark, net->mark_cap);
      memset(net->mark, 0, (size_t)net->mark_cap);
    }
    for (int i = 0; i < n; i++)
      net->mark[cf->v[i]] = 1;
    int k = 0;
    for (int s = 0; s < net->n_flows; s++)
      if (net->mark[s]) {
        net->mark[s] = 0;
        cf->v[k++] = s;
      }
    return;
  }
  if (net->sort_cap < n) {
    net->sort_cap = MAX(n, 2 * net->sort_cap);
    net->sort = g_renew(int, net->sort, net->sort_cap);
  }
  int *a = cf->v, *b = net->sort;
  for (int shift = 0; shift < 32 && (net->n_flows - 1) >> shift; shift += 8) {
    int count[257] = { 0 };
    for (int i = 0; i < n; i++)
      count[((a[i] >> shift) & 255) + 1]++;
    for (int d = 0; d < 256; d++)
      count[d + 1] += count[d];
    for (int i = 0; i < n; i++)
      b[count[(a[i] >> shift) & 255]++] = a[i];
    int *t = a;
    a = b;
    b = t;
  }
  if (a != cf->v)
    memcpy(cf->v, a, (size_t)n * sizeof(int));
}

static void solve_component(SimNet *net, double now, SimNetRescheduleFunc fn, void *user);

/* A flow alone on its links (the common case: a collective inside a node, a transfer on
 * an idle route) gets what the filling's one round would give it: the smallest of its
 * links' capacities over the times it crosses each. */
static void solve_alone(SimNet *net, Flow *f, double now, SimNetRescheduleFunc fn, void *user)
{
  double share = INFINITY;
  for (int h = 0; h < f->n_links; h++) {
    const Link *l = &net->link[f->links[h]];
    double s = l->capacity / l->n;
    if (s < share)
      share = s;
  }
  set_rate(f, MAX(share, 0), now, fn, user);
}

/* Takes every active flow that crosses a link, in slot order, and every link that carries
 * one, as the component to fill: what a network that has lately been one component holds,
 * found without the search.  Filling several components together gives each the rates it
 * would get alone, so this changes no rate, only what the solve costs. */
static void whole_as_component(SimNet *net)
{
  SimIntStack *cl = &net->comp_links, *cf = &net->comp_flows;
  cl->n = 0;
  cf->n = 0;
  clear_dirty(net);
  for (int s = 0; s < net->n_flows; s++)
    if (net->flow[s].task >= 0 && net->flow[s].n_links > 0)
      sim_int_stack_push(cf, s);
  for (int l = 0; l < net->n_links; l++)
    if (net->link[l].n > 0)
      sim_int_stack_push(cl, l);
}

void sim_net_update(SimNet *net, double now, SimNetRescheduleFunc fn, void *user)
{
  if (!net->dirty_links.n)
    return;
  if (net->remember && net->n_active > 1 && whole_recall(net, now, fn, user)) {
    net->recalled++;
    return;
  }
  SimIntStack *cl = &net->comp_links, *cf = &net->comp_flows;
  if (net->whole_turns > 0 && net->n_active > 1 && net->n_active <= 2 * net->whole_base) {
    /* The last component searched held most of the network: fill it all. */
    net->whole_turns--;
    net->whole_solves++;
    whole_as_component(net);
    if (cf->n == 1)
      solve_alone(net, &net->flow[cf->v[0]], now, fn, user);
    else if (cf->n > 1)
      solve_component(net, now, fn, user);
    return;
  }
  /* The component: every link reachable from a dirty link through shared flows. */
  cl->n = 0;
  cf->n = 0;
  for (int i = 0; i < net->dirty_links.n; i++) {
    int l = net->dirty_links.v[i];
    net->link[l].dirty = FALSE;
    /* A link that a flow left empty has nothing to share. */
    if (net->link[l].n > 0 && !net->link[l].in_comp) {
      net->link[l].in_comp = TRUE;
      sim_int_stack_push(cl, l);
    }
  }
  net->dirty_links.n = 0;
  for (int i = 0; i < cl->n; i++) {
    Link *l = &net->link[cl->v[i]];
    for (int k = 0; k < l->n; k++) {
      int s = l->flows[k];
      Flow *f = &net->flow[s];
      if (f->in_comp)
        continue;
      f->in_comp = TRUE;
      sim_int_stack_push(cf, s);
      for (int h = 0; h < f->n_links; h++) {
        Link *l2 = &net->link[f->links[h]];
        if (!l2->in_comp) {
          l2->in_comp = TRUE;
          sim_int_stack_push(cl, f->links[h]);
        }
      }
    }
  }
  /* The component is found in the order the links became dirty and their flows were
   * added, which the event order fixes: the filling, and its rounding, are deterministic
   * without sorting. */

  int *links = cl->v;
  int nl = cl->n;
  for (int i = 0; i < nl; i++)
    net->link[links[i]].in_comp = FALSE;
  if (cf->n == 1) {
    net->flow[cf->v[0]].in_comp = FALSE;
    solve_alone(net, &net->flow[cf->v[0]], now, fn, user);
    return;
  }
  int nf = cf->n;
  if (nf == 0)
    return;
  for (int i = 0; i < nf; i++)
    net->flow[cf->v[i]].in_comp = FALSE;
  comp_in_slot_order(net);
  /* A large component of most of the network: the next few solves take the whole network
   * without searching (sim_net_set_whole_run()), then a search looks again; sooner if the
   * network doubles meanwhile.  (Small components cost little to find, and filling a
   * network that has grown around a small one costs more than finding it.) */
  gboolean most = nf >= net->whole_min && 2 * (int64_t)nf >= net->n_active;
  net->whole_turns = most ? net->whole_run : 0;
  net->whole_base = net->n_active;
  solve_component(net, now, fn, user);
}

/* Fills the component in comp_links and comp_flows (the flows in slot order), or recalls
 * its rates, and hands them out in slot order. */
static void solve_component(SimNet *net, double now, SimNetRescheduleFunc fn, void *user)
{
  SimIntStack *cl = &net->comp_links, *cf = &net->comp_flows;
  int *links = cl->v;
  int nl = cl->n;
  int nf = cf->n;
  /* The component's key: its flows' routes, in slot order. */
  IntSeq *probe = NULL;
  Rates *rates = NULL, *unkept = NULL;
  if (net->remember && nf <= COMP_MEMORY_MAX) {
    if (net->probe_cap < nf) {
      net->probe_cap = MAX(nf, 2 * net->probe_cap);
      g_free(net->probe);
      net->probe = g_malloc(sizeof(IntSeq) + (size_t)net->probe_cap * sizeof(int));
    }
    probe = net->probe;
    probe->n = nf;
    for (int i = 0; i < nf; i++)
      probe->v[i] = net->flow[cf->v[i]].route;
    probe->hash = int_seq_hash(probe->v, nf);
    rates = comp_recall(net, probe);
  }
  if (rates) {
    net->recalled++;
    const uint8_t *level = rates_level(rates);
    for (int i = 0; i < nf; i++)
      set_rate(&net->flow[cf->v[i]], rates->value[level[i]], now, fn, user);
  } else {
    for (int i = 0; i < nl; i++) {
      Link *l = &net->link[links[i]];
      l->rem = l->capacity;
      l->cnt = l->n;
    }
    int unfixed = nf;
    for (int i = 0; i < nf; i++)
      net->flow[cf->v[i]].fixed = FALSE;
    /* Each round fixes the flows of every link whose fair share is the smallest: in exact
     * arithmetic fixing one of them leaves the others' shares where they were, and
     * symmetric collectives have many such links.  Links left without unfixed flows drop
     * out of the scan, which keeps its order. */
    SimIntStack *tied = &net->tied;
    double value[256];
    int rounds = 0;
    int n_live = nl;
    while (unfixed > 0 && n_live > 0) {
      double share = INFINITY;
      int k = 0;
      for (int i = 0; i < n_live; i++) {
        Link *l = &net->link[links[i]];
        if (l->cnt <= 0)
          continue;
        links[k++] = links[i];
        l->share = l->rem / l->cnt;
        if (l->share < share)
          share = l->share;
      }
      n_live = k;
      if (n_live == 0)
        break;
      tied->n = 0;
      for (int i = 0; i < n_live; i++)
        if (net->link[links[i]].share == share)
          sim_int_stack_push(tied, links[i]);
      if (share < 0)
        share = 0;
      if (rounds < 256)
        value[rounds] = share;
      for (int t = 0; t < tied->n; t++) {
        Link *bl = &net->link[tied->v[t]];
        for (int q = 0; q < bl->n; q++) {
          Flow *f = &net->flow[bl->flows[q]];
          if (f->fixed)
            continue;
          f->fixed = TRUE;
          unfixed--;
          f->next_rate = share;
          f->level = (uint8_t)MIN(rounds, 255);
          for (int h = 0; h < f->n_links; h++) {
            Link *l2 = &net->link[f->links[h]];
            l2->rem -= share;
            l2->cnt--;
          }
        }
      }
      rounds++;
    }
    /* Every flow crosses a link, which stays in the scan until its flows are fixed. */
    for (int i = 0; i < nf; i++) {
      Flow *f = &net->flow[cf->v[i]];
      set_rate(f, f->next_rate, now, fn, user);
    }
    if (!net->remember || rounds > 256)
      return;   /* (more distinct rates than a level can tell apart: not remembered) */
    rates = g_malloc(sizeof(Rates) + (size_t)rounds * sizeof(double) + (size_t)nf);
    rates->n = rounds;
    memcpy(rates->value, value, (size_t)rounds * sizeof(double));
    uint8_t *level = rates_level(rates);
    for (int i = 0; i < nf; i++)
      level[i] = net->flow[cf->v[i]].level;
    if (probe)
      comp_remember(net, int_seq_new(probe->v, nf, probe->hash), rates);
    else
      unkept = rates;   /* too large to remember by its routes; its whole still is */
  }
  if (nf == net->n_active)
    whole_remember(net, rates);
  g_free(unkept);
}

void sim_net_set_whole_run(SimNet *net, int solves, int min_flows)
{
  net->whole_run = MAX(solves, 0);
  net->whole_min = MAX(min_flows, 2);
  net->whole_turns = MIN(net->whole_turns, net->whole_run);
}

int64_t sim_net_whole_solves(const SimNet *net)
{
  return net->whole_solves;
}

void sim_net_set_memory(SimNet *net, size_t bytes)
{
  g_return_if_fail(net->n_active == 0);
  net->remember = bytes > 0;
  net->limit = bytes;
}

int64_t sim_net_memory_hits(const SimNet *net)
{
  return net->recalled;
}

const double *sim_net_link_bytes(const SimNet *net)
{
  return net->link_bytes;
}

int sim_net_n_active(const SimNet *net)
{
  return net->n_active;
}
