/* distributed.c — one search shared among MPI ranks (distributed.h, docs/distributed.md).
 *
 * MPI starts only when a command asks (search_mpi_start) and mpirun started more than one
 * process; the exchanges go over a copy of MPI_COMM_WORLD whose errors return to the
 * caller.  Each exchange is a non-blocking collective completed by polling, so that a
 * rank waiting for the others still notices a signal: it then waits a short grace for
 * them (mpirun passes Ctrl-C to every rank, and they all come to the exchange) and, if
 * they do not come, gives the sharing up (a rank was lost) and ends the search with what
 * it has.  With a budget in seconds the wait also ends a grace past the deadline.  A rank
 * that waits longer than a moment looks whether the other ranks on its host are still
 * running (their process ids, gathered at the start): where one is gone (mpirun
 * --enable-recovery leaves the others running) it gives the sharing up at once.  Ranks on
 * other hosts are heard instead: every rank sends the others a word twice a second from a
 * thread of its own, and a waiting rank that has heard nothing from one for the rank
 * timeout gives the sharing up and names it. */
#include "distributed.h"
#include "parasol-config.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if PARASOL_HAVE_MPI
#include <json-glib/json-glib.h>
#include <mpi.h>
#endif

/* How long a rank that saw a signal, or whose deadline passed, waits for the others at an
 * exchange before it gives the sharing up.  After a signal the wait is short: where a
 * rank died, mpirun sends the others SIGTERM and, a little later, SIGKILL, and rank 0
 * must have written its plan by then. */
#define SIGNAL_GIVE_UP_US G_GINT64_CONSTANT(500000)
#define DEADLINE_GIVE_UP_US G_GINT64_CONSTANT(1000000)
/* A rank waiting at an exchange longer than this looks, every as often, whether the ranks
 * on its own host are still running (mpirun --enable-recovery leaves the others waiting
 * for a rank that died). */
#define LIVENESS_US G_GINT64_CONSTANT(200000)
/* How often every rank sends the others a word, from a thread of its own, so that a rank
 * waiting at an exchange hears whether they are still there wherever they run; and how
 * long it waits without a word from one before it gives the sharing up (--rank-timeout). */
#define BEAT_US G_GINT64_CONSTANT(500000)
#define DEFAULT_RANK_TIMEOUT_S 30.0
#define BEAT_TAG 7

/* Where a rank runs: processes with the same place see each other's process ids. */
typedef struct {
  char place[192];   /* host name, boot id and process-id namespace                     */
  gint64 pid;
} Peer;

static struct {
  gboolean started;          /* MPI initialized here, more than one rank              */
  gboolean finished;
  int rank, size;
  gboolean sharing;          /* search_run() shares its search (search_mpi_set_shared) */
  SearchContext *root;       /* the search shared now, or NULL                        */
  const SearchProblem *also; /* another problem every rank searches (search_dist_also) */
  gboolean lost;             /* the sharing was given up                              */
  gint64 task_evals;         /* counted by this rank's tasks since the last sync      */
  gint64 task_cut;
  int local_threads;
  gint64 exchanges;
  gint64 exchange_us;
  gint64 exchange_cpu_ns;    /* CPU time of the thread waiting in them                */
  char *note;
  Peer *peers;               /* every rank's, after search_mpi_start                  */
  gint64 last_look;          /* the last look at the peers' processes                 */
  double rank_timeout;       /* seconds without a word from a rank; 0: no limit       */
  gboolean host_check;       /* look at the processes of the ranks on this host       */
  /* The words between ranks (the beat thread): when each rank was last heard from. */
  _Atomic gint64 *heard;
  GThread *beat;
  GMutex beat_lock;
  GCond beat_cond;
  gboolean beat_stop;
  /* Every MPI call holds this lock: the search thread and the beat thread share MPI
   * (MPI_THREAD_SERIALIZED). */
  GMutex mpi_lock;
#if PARASOL_HAVE_MPI
  MPI_Comm comm;
  MPI_Comm beat_comm;
  MPI_Request *beat_req;
#endif
} dist = { .rank = 0, .size = 1, .sharing = TRUE, .rank_timeout = DEFAULT_RANK_TIMEOUT_S,
           .host_check = TRUE };

void search_mpi_set_rank_timeout(double seconds)
{
  dist.rank_timeout = seconds > 0 ? seconds : 0;
}

int search_mpi_rank(void)
{
  return dist.rank;
}

int search_mpi_size(void)
{
  return dist.size;
}

void search_mpi_set_shared(gboolean shared)
{
  dist.sharing = shared;
}

const char *search_mpi_note(void)
{
  return dist.note;
}

void search_mpi_stats(gint64 *exchanges, double *seconds, double *cpu_seconds)
{
  if (exchanges)
    *exchanges = dist.exchanges;
  if (seconds)
    *seconds = (double)dist.exchange_us / 1e6;
  if (cpu_seconds)
    *cpu_seconds = (double)dist.exchange_cpu_ns / 1e9;
}

/* The number of processes mpirun (Open MPI, MPICH/Hydra, Slurm's PMI) started, 1 if none. */
static int launched_size(void)
{
  const char *vars[] = { "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_NTASKS" };
  for (guint i = 0; i < G_N_ELEMENTS(vars); i++) {
    const char *v = g_getenv(vars[i]);
    if (v && atoi(v) > 0)
      return atoi(v);
  }
  return 1;
}

static void note(const char *fmt, ...) G_GNUC_PRINTF(1, 2) G_GNUC_UNUSED;
static void note(const char *fmt, ...)
{
  if (dist.note)
    return;
  va_list ap;
  va_start(ap, fmt);
  dist.note = g_strdup_vprintf(fmt, ap);
  va_end(ap);
}

#if PARASOL_HAVE_MPI

static gint64 thread_cpu_ns(void)
{
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (gint64)t.tv_sec * 1000000000 + t.tv_nsec;
}

static gboolean wait_for(MPI_Request *req);
static gboolean allgather(const void *in, void *out, int bytes);

/* This process's place: host name, boot id and process-id namespace, so that processes in
 * other containers or on other machines of the same name do not count as local. */
static void own_place(Peer *me)
{
  g_autofree char *boot = NULL;
  if (g_file_get_contents("/proc/sys/kernel/random/boot_id", &boot, NULL, NULL))
    g_strstrip(boot);
  g_autofree char *ns = g_file_read_link("/proc/self/ns/pid", NULL);
  memset(me, 0, sizeof *me);
  snprintf(me->place, sizeof me->place, "%s|%s|%s", g_get_host_name(), boot ? boot : "",
           ns ? ns : "");
  me->pid = (gint64)getpid();
}

/* FALSE where process @pid is gone or a zombie. */
static gboolean process_alive(gint64 pid)
{
  if (kill((pid_t)pid, 0) != 0 && errno == ESRCH)
    return FALSE;
  char path[64];
  snprintf(path, sizeof path, "/proc/%" G_GINT64_FORMAT "/stat", pid);
  g_autofree char *stat = NULL;
  if (!g_file_get_contents(path, &stat, NULL, NULL))
    return TRUE;
  const char *end = strrchr(stat, ')');
  return !(end && end[1] == ' ' && (end[2] == 'Z' || end[2] == 'X'));
}

/* A rank on this rank's host whose process has ended, or -1. */
static int dead_peer(void)
{
  if (!dist.peers || !dist.host_check)
    return -1;
  const Peer *me = &dist.peers[dist.rank];
  for (int r = 0; r < dist.size; r++)
    if (r != dist.rank && !strcmp(dist.peers[r].place, me->place) &&
        !process_alive(dist.peers[r].pid))
      return r;
  return -1;
}

/* Receives the words that have come (under the MPI lock): their senders are heard now. */
static void hear(void)
{
  for (;;) {
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, BEAT_TAG, dist.beat_comm, &flag, &st) != MPI_SUCCESS ||
        !flag)
      return;
    char word;
    if (MPI_Recv(&word, 1, MPI_BYTE, st.MPI_SOURCE, BEAT_TAG, dist.beat_comm,
                 MPI_STATUS_IGNORE) != MPI_SUCCESS)
      return;
    if (st.MPI_SOURCE >= 0 && st.MPI_SOURCE < dist.size)
      atomic_store(&dist.heard[st.MPI_SOURCE], g_get_monotonic_time());
  }
}

/* The beat thread: a word to every other rank (the last one sent, where it has gone),
 * and the words from them received, every BEAT_US. */
static gpointer beat_thread(gpointer data)
{
  static const char word = 1;
  g_mutex_lock(&dist.beat_lock);
  while (!dist.beat_stop) {
    g_mutex_unlock(&dist.beat_lock);
    g_mutex_lock(&dist.mpi_lock);
    for (int r = 0; r < dist.size; r++) {
      if (r == dist.rank)
        continue;
      int done = 1;
      if (dist.beat_req[r] != MPI_REQUEST_NULL &&
          MPI_Test(&dist.beat_req[r], &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
        dist.beat_req[r] = MPI_REQUEST_NULL;
        done = 0;
      }
      if (done && MPI_Isend(&word, 1, MPI_BYTE, r, BEAT_TAG, dist.beat_comm,
                            &dist.beat_req[r]) != MPI_SUCCESS)
        dist.beat_req[r] = MPI_REQUEST_NULL;
    }
    hear();
    g_mutex_unlock(&dist.mpi_lock);
    g_mutex_lock(&dist.beat_lock);
    gint64 until = g_get_monotonic_time() + BEAT_US;
    while (!dist.beat_stop && g_cond_wait_until(&dist.beat_cond, &dist.beat_lock, until))
      ;
  }
  g_mutex_unlock(&dist.beat_lock);
  return NULL;
}

/* Stops the beat thread (within BEAT_US). */
static void stop_beats(void)
{
  if (!dist.beat)
    return;
  g_mutex_lock(&dist.beat_lock);
  dist.beat_stop = TRUE;
  g_cond_signal(&dist.beat_cond);
  g_mutex_unlock(&dist.beat_lock);
  g_thread_join(g_steal_pointer(&dist.beat));
}

/* The ranks not heard from for longer than the rank timeout, as text ("1, 3"), or NULL. */
static char *silent_ranks(gint64 now)
{
  if (dist.rank_timeout <= 0 || !dist.heard)
    return NULL;
  g_mutex_lock(&dist.mpi_lock);
  hear();
  g_mutex_unlock(&dist.mpi_lock);
  GString *out = NULL;
  gint64 limit = (gint64)(dist.rank_timeout * 1e6);
  for (int r = 0; r < dist.size; r++)
    if (r != dist.rank && now - atomic_load(&dist.heard[r]) > limit) {
      if (!out)
        out = g_string_new(NULL);
      g_string_append_printf(out, "%s%d", out->len ? ", " : "", r);
    }
  return out ? g_string_free(out, FALSE) : NULL;
}

static void finish(void)
{
  if (!dist.started || dist.finished)
    return;
  dist.finished = TRUE;
  /* After a lost rank MPI_Finalize would wait for it: the process ends without it. */
  if (dist.lost) {
    stop_beats();
    return;
  }
  /* The ranks that finish first (all but rank 0, which writes the results) wait here,
   * asleep, rather than in MPI_Finalize, which polls. */
  MPI_Request req;
  g_mutex_lock(&dist.mpi_lock);
  int rc = MPI_Ibarrier(dist.comm, &req);
  g_mutex_unlock(&dist.mpi_lock);
  if (rc != MPI_SUCCESS || !wait_for(&req))
    return;
  stop_beats();
  MPI_Comm_free(&dist.beat_comm);
  MPI_Comm_free(&dist.comm);
  MPI_Finalize();
}

gboolean search_mpi_start(GError **error)
{
  if (dist.started || launched_size() <= 1)
    return TRUE;
  int inited = 0, provided = 0;
  MPI_Initialized(&inited);
  if (!inited && MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
    g_set_error(error, SEARCH_ERROR, SEARCH_ERROR_FAILED, "MPI_Init_thread failed");
    return FALSE;
  }
  if (inited)
    MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_SERIALIZED) {
    g_set_error(error, SEARCH_ERROR, SEARCH_ERROR_FAILED,
                "this MPI supports only single-threaded programs; a shared search calls MPI "
                "from its search thread (MPI_THREAD_SERIALIZED or better is needed)");
    return FALSE;
  }
  MPI_Comm_dup(MPI_COMM_WORLD, &dist.comm);
  MPI_Comm_set_errhandler(dist.comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(dist.comm, &dist.rank);
  MPI_Comm_size(dist.comm, &dist.size);
  dist.started = TRUE;
  atexit(finish);
  Peer me;
  own_place(&me);
  dist.peers = g_new0(Peer, dist.size);
  if (!allgather(&me, dist.peers, (int)sizeof me))
    g_clear_pointer(&dist.peers, g_free);
  /* PARASOL_MPI_NO_HOST_CHECK: every other rank counts as on another host, where only the
   * rank timeout sees that it is gone (how the tests show that timeout). */
  dist.host_check = !g_getenv("PARASOL_MPI_NO_HOST_CHECK");
  MPI_Comm_dup(MPI_COMM_WORLD, &dist.beat_comm);
  MPI_Comm_set_errhandler(dist.beat_comm, MPI_ERRORS_RETURN);
  dist.beat_req = g_new(MPI_Request, dist.size);
  dist.heard = g_new(_Atomic gint64, dist.size);
  gint64 now = g_get_monotonic_time();
  for (int r = 0; r < dist.size; r++) {
    dist.beat_req[r] = MPI_REQUEST_NULL;
    atomic_init(&dist.heard[r], now);
  }
  dist.beat = g_thread_new("mpi-beat", beat_thread, NULL);
  return TRUE;
}

/* Gives the sharing up: the search goes on (and ends) with what this rank has. */
static void give_up(const char *why)
{
  dist.lost = TRUE;
  note("rank %d gave the sharing up: %s; the search ended with the best found by this rank "
       "and the exchanges before", dist.rank, why);
  if (dist.root)
    atomic_store(&dist.root->interrupted, 1);
}

/* Completes @req, polling: FALSE (the sharing given up) on an error, or when a signal came
 * or the deadline passed and the others do not come within GIVE_UP_US. */
static gboolean wait_for(MPI_Request *req)
{
  gint64 t0 = g_get_monotonic_time(), cpu0 = thread_cpu_ns();
  gint64 since = 0;   /* when a signal or the deadline was first seen waiting */
  for (int spins = 0;; spins++) {
    int done = 0;
    g_mutex_lock(&dist.mpi_lock);
    int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
    g_mutex_unlock(&dist.mpi_lock);
    if (rc != MPI_SUCCESS) {
      give_up("an exchange failed");
      return FALSE;
    }
    if (done) {
      dist.exchange_us += g_get_monotonic_time() - t0;
      dist.exchange_cpu_ns += thread_cpu_ns() - cpu0;
      return TRUE;
    }
    gint64 now = g_get_monotonic_time();
    if (now - t0 >= LIVENESS_US && now - dist.last_look >= LIVENESS_US) {
      dist.last_look = now;
      int dead = dead_peer();
      if (dead >= 0) {
        g_autofree char *why = g_strdup_printf("rank %d ended (its process %" G_GINT64_FORMAT
                                               " is gone)", dead, dist.peers[dead].pid);
        give_up(why);
        return FALSE;
      }
      g_autofree char *silent = silent_ranks(now);
      if (silent) {
        g_autofree char *why = g_strdup_printf(
          "no word from rank%s %s for %g s (--rank-timeout); it may have ended",
          strchr(silent, ',') ? "s" : "", silent, dist.rank_timeout);
        give_up(why);
        return FALSE;
      }
    }
    SearchContext *root = dist.root;
    gboolean late = search_signals_seen() > 0 ||
                    (root && root->deadline < G_MAXDOUBLE &&
                     now >= root->t0 + (gint64)(root->deadline * 1e6));
    if (late && since == 0)
      since = now;
    if (since > 0 &&
        now - since > (search_signals_seen() ? SIGNAL_GIVE_UP_US : DEADLINE_GIVE_UP_US)) {
      give_up(search_signals_seen() ? "the other ranks did not come to an exchange after a "
                                      "signal"
                                    : "the other ranks did not come to an exchange by the "
                                      "deadline");
      return FALSE;
    }
    /* Short waits first (an exchange usually completes within microseconds), then sleeps. */
    if (spins > 64)
      g_usleep(spins > 4096 ? 10000 : spins > 1024 ? 1000 : 100);
  }
}

static gboolean allreduce(const void *in, void *out, int n, MPI_Datatype type, MPI_Op op)
{
  MPI_Request req;
  g_mutex_lock(&dist.mpi_lock);
  int rc = MPI_Iallreduce(in, out, n, type, op, dist.comm, &req);
  g_mutex_unlock(&dist.mpi_lock);
  if (rc != MPI_SUCCESS) {
    give_up("an exchange failed");
    return FALSE;
  }
  return wait_for(&req);
}

static gboolean allgather(const void *in, void *out, int bytes)
{
  MPI_Request req;
  g_mutex_lock(&dist.mpi_lock);
  int rc = MPI_Iallgather(in, bytes, MPI_BYTE, out, bytes, MPI_BYTE, dist.comm, &req);
  g_mutex_unlock(&dist.mpi_lock);
  if (rc != MPI_SUCCESS) {
    give_up("an exchange failed");
    return FALSE;
  }
  return wait_for(&req);
}

static gboolean bcast(void *buf, int n, MPI_Datatype type, int from)
{
  MPI_Request req;
  g_mutex_lock(&dist.mpi_lock);
  int rc = MPI_Ibcast(buf, n, type, from, dist.comm, &req);
  g_mutex_unlock(&dist.mpi_lock);
  if (rc != MPI_SUCCESS) {
    give_up("an exchange failed");
    return FALSE;
  }
  return wait_for(&req);
}

char **search_mpi_gather_text(const char *text)
{
  if (!dist.started || dist.lost || dist.size <= 1) {
    char **one = g_new0(char *, 2);
    one[0] = g_strdup(text);
    return one;
  }
  int len = (int)strlen(text) + 1;
  g_autofree int *lens = g_new0(int, dist.size);
  g_autofree int *at = g_new0(int, dist.size);
  MPI_Request req;
  g_mutex_lock(&dist.mpi_lock);
  int rc = MPI_Igather(&len, 1, MPI_INT, lens, 1, MPI_INT, 0, dist.comm, &req);
  g_mutex_unlock(&dist.mpi_lock);
  if (rc != MPI_SUCCESS || !wait_for(&req))
    return NULL;
  int total = 0;
  for (int r = 0; r < dist.size; r++) {
    at[r] = total;
    total += lens[r];
  }
  g_autofree char *all = g_malloc(MAX(total, 1));
  g_mutex_lock(&dist.mpi_lock);
  rc = MPI_Igatherv(text, len, MPI_CHAR, all, lens, at, MPI_CHAR, 0, dist.comm, &req);
  g_mutex_unlock(&dist.mpi_lock);
  if (rc != MPI_SUCCESS || !wait_for(&req))
    return NULL;
  if (dist.rank != 0)
    return NULL;
  char **out = g_new0(char *, dist.size + 1);
  for (int r = 0; r < dist.size; r++)
    out[r] = g_strdup(all + at[r]);
  return out;
}

#else /* !PARASOL_HAVE_MPI */

gboolean search_mpi_start(GError **error)
{
  if (launched_size() <= 1)
    return TRUE;
  g_set_error(error, SEARCH_ERROR, SEARCH_ERROR_INVALID,
              "started by mpirun with %d processes, but this parasol was built without MPI "
              "(meson option mpi, docs/distributed.md); run it alone", launched_size());
  return FALSE;
}

char **search_mpi_gather_text(const char *text)
{
  char **one = g_new0(char *, 2);
  one[0] = g_strdup(text);
  return one;
}

#endif

/* ---------------------------------------------------------------------------------- */
/* A shared search                                                                    */

/* The algorithms that divide their work among ranks: their every decision that leads to an
 * exchange is agreed.  The others run whole on every rank. */
static gboolean divides_work(const SearchAlgorithm *a, const SearchContext *root)
{
  static const char *const divide[] = { "mcmc", "expert", "beam", "megatron", "dp", "optcnn",
                                         "pipeline", "alpa", "exhaustive" };
  for (guint i = 0; i < G_N_ELEMENTS(divide); i++)
    if (!strcmp(a->name, divide[i]))
      return TRUE;
  /* subst, where its inner algorithm (default dp) divides its work: the rewritten graphs'
   * searches are shared as that algorithm shares them, the rewrites' first times divided
   * among the ranks (substitutions.c). */
  if (!strcmp(a->name, "subst")) {
    const char *inner = search_context_get_option(root, "inner");
    const SearchAlgorithm *in = search_lookup(inner ? inner : "dp");
    return in && in != a && divides_work(in, root);
  }
  return FALSE;
}

void search_dist_begin(SearchContext *root)
{
  dist.root = NULL;
  dist.also = NULL;
  if (!dist.started || dist.lost || !dist.sharing || dist.size <= 1 ||
      !divides_work(root->algo, root) || *search_problem_get_rewrites(root->problem))
    return;
  dist.root = root;
  dist.task_evals = dist.task_cut = 0;
  dist.local_threads = MAX(1, (root->threads + dist.size - 1) / dist.size);
}

gboolean search_dist_on(const SearchContext *ctx)
{
  return dist.root && !dist.lost && ctx->root == dist.root &&
         (ctx->problem == dist.root->problem || (dist.also && ctx->problem == dist.also));
}

void search_dist_also(const SearchContext *ctx, const SearchProblem *p)
{
  if (dist.root && ctx->root == dist.root)
    dist.also = p;
}

int search_dist_threads(const SearchContext *ctx)
{
  return search_dist_on(ctx) ? dist.local_threads : MAX(1, ctx->threads);
}

gboolean search_dist_mine(const SearchContext *ctx, int i)
{
  return !search_dist_on(ctx) || i % dist.size == dist.rank;
}

typedef struct {
  const int *tasks;
  int n;
  atomic_int next;
  void (*fn)(int i, gpointer data);
  gpointer data;
} Owned;

static gpointer owned_worker(gpointer data)
{
  Owned *o = data;
  for (;;) {
    int k = atomic_fetch_add(&o->next, 1);
    if (k >= o->n)
      break;
    o->fn(o->tasks[k], o->data);
  }
  return NULL;
}

void search_dist_parallel(SearchContext *ctx, int n, void (*fn)(int i, gpointer data),
                          gpointer data)
{
  if (!search_dist_on(ctx)) {
    search_context_parallel(ctx, n, fn, data);
    return;
  }
  SearchContext *root = ctx->root;
  g_autofree int *tasks = g_new(int, MAX(n, 1));
  int mine = 0;
  for (int i = dist.rank; i < n; i += dist.size)
    tasks[mine++] = i;
  gint64 e0 = atomic_load(&root->evals), c0 = atomic_load(&root->cut_evals);
  Owned o = { .tasks = tasks, .n = mine, .fn = fn, .data = data };
  atomic_init(&o.next, 0);
  int workers = MIN(dist.local_threads, mine);
  GThread **threads = g_new(GThread *, MAX(workers - 1, 1));
  for (int w = 0; w < workers - 1; w++)
    threads[w] = g_thread_new("search-worker", owned_worker, &o);
  owned_worker(&o);
  for (int w = 0; w < workers - 1; w++)
    g_thread_join(threads[w]);
  g_free(threads);
  dist.task_evals += atomic_load(&root->evals) - e0;
  dist.task_cut += atomic_load(&root->cut_evals) - c0;
}

#if PARASOL_HAVE_MPI

void search_dist_share(const SearchContext *ctx, int n, void *base, size_t stride, size_t size)
{
  if (!search_dist_on(ctx) || n <= 0)
    return;
  /* Every rank contributes its tasks' bytes and zeros elsewhere: or'ed, each task's. */
  g_autofree uint8_t *in = g_malloc0((gsize)n * size);
  g_autofree uint8_t *out = g_malloc0((gsize)n * size);
  for (int i = dist.rank; i < n; i += dist.size)
    memcpy(in + (size_t)i * size, (uint8_t *)base + (size_t)i * stride, size);
  if (!allreduce(in, out, (int)((size_t)n * size), MPI_BYTE, MPI_BOR))
    return;
  for (int i = 0; i < n; i++)
    if (i % dist.size != dist.rank)
      memcpy((uint8_t *)base + (size_t)i * stride, out + (size_t)i * size, size);
}

typedef struct {
  double cost;
  guint64 key;
} Best;

/* The problem the strategy in @json is a plan for: @p where it records @p's rewrites, else
 * @p rewritten by those that follow them (subst's graphs; transfer full). */
static SearchProblem *problem_of(SearchProblem *p, const char *json, const char *from,
                                 GError **error)
{
  g_autoptr(JsonParser) parser = json_parser_new();
  if (!json_parser_load_from_data(parser, json, -1, error))
    return NULL;
  JsonNode *root = json_parser_get_root(parser);
  JsonObject *o = JSON_NODE_HOLDS_OBJECT(root) ? json_node_get_object(root) : NULL;
  JsonArray *rw = o && json_object_has_member(o, "rewrites")
                    ? json_object_get_array_member(o, "rewrites") : NULL;
  guint n = rw ? json_array_get_length(rw) : 0;
  const char *const *have = search_problem_get_rewrites(p);
  guint k = 0;
  for (; have[k]; k++)
    if (k >= n || g_strcmp0(have[k], json_array_get_string_element(rw, k))) {
      g_set_error(error, SEARCH_ERROR, SEARCH_ERROR_FAILED,
                  "%s: its rewrites do not continue this rank's graph", from);
      return NULL;
    }
  SearchProblem *cur = search_problem_ref(p);
  for (; k < n; k++) {
    const char *name = json_array_get_string_element(rw, k);
    SimGraph *g = name ? search_rewrite_apply(cur->g, name, error) : NULL;
    if (!g) {
      if (!name)
        g_set_error(error, SEARCH_ERROR, SEARCH_ERROR_FAILED, "%s: a rewrite is not a name",
                    from);
      search_problem_unref(cur);
      return NULL;
    }
    SearchProblem *next = search_problem_derive(cur, g, name);
    search_problem_unref(cur);
    cur = next;
  }
  return cur;
}

/* @c's best becomes the best of the ranks' (the smallest cost, then key, then rank). */
static void exchange_best(SearchContext *c)
{
  SearchContext *root = c->root;
  Best me;
  g_mutex_lock(&root->lock);
  me.cost = c->best_cost;
  me.key = c->best ? c->best_key : G_MAXUINT64;
  /* A plan for @c's problem, or for one of its rewritten graphs (subst): where another
   * problem holds the best (a part of the machine), it is not sent. */
  gboolean sendable = c->best && (c->best_problem == c->problem ||
                                  g_strv_length((char **)search_problem_get_rewrites(
                                    c->best_problem)) >
                                    g_strv_length((char **)search_problem_get_rewrites(
                                      c->problem)));
  g_autofree char *json = sendable ? sim_strategy_to_json(c->best, c->best_problem->g) : NULL;
  g_mutex_unlock(&root->lock);
  g_autofree Best *all = g_new(Best, dist.size);
  if (!allgather(&me, all, (int)sizeof me))
    return;
  int w = -1;
  gboolean same = TRUE;
  for (int r = 0; r < dist.size; r++) {
    if (r > 0 && (all[r].cost != all[0].cost || all[r].key != all[0].key))
      same = FALSE;
    if (isfinite(all[r].cost) &&
        (w < 0 || all[r].cost < all[w].cost ||
         (all[r].cost == all[w].cost && all[r].key < all[w].key)))
      w = r;
  }
  if (w < 0 || same)
    return;
  int len = dist.rank == w && json ? (int)strlen(json) + 1 : 0;
  if (!bcast(&len, 1, MPI_INT, w) || len == 0)
    return;
  g_autofree char *text = dist.rank == w ? g_steal_pointer(&json) : g_malloc(len);
  if (!bcast(text, len, MPI_CHAR, w))
    return;
  if (me.cost == all[w].cost && me.key == all[w].key)
    return;
  g_autoptr(GError) error = NULL;
  g_autofree char *from = g_strdup_printf("the best plan of rank %d", w);
  SearchProblem *p = problem_of(c->problem, text, from, &error);
  g_autoptr(SimStrategy) s = p ? sim_strategy_from_json(text, from, p->g, p->m, &error) : NULL;
  if (!s) {
    if (p)
      search_problem_unref(p);
    give_up(error->message);
    return;
  }
  search_context_record(c, p, s, all[w].cost, all[w].key);
  search_problem_unref(p);
}

void search_dist_sync(SearchContext *ctx)
{
  if (!search_dist_on(ctx))
    return;
  SearchContext *root = ctx->root;
  gint64 mine[2] = { dist.task_evals, dist.task_cut }, sum[2];
  if (!allreduce(mine, sum, 2, MPI_INT64_T, MPI_SUM))
    return;
  atomic_fetch_add(&root->evals, sum[0] - mine[0]);
  atomic_fetch_add(&root->cut_evals, sum[1] - mine[1]);
  dist.task_evals = dist.task_cut = 0;
  exchange_best(ctx);
  if (ctx != root && search_dist_on(ctx))
    exchange_best(root);
  dist.exchanges++;
}

gboolean search_dist_any(const SearchContext *ctx, gboolean local)
{
  if (!search_dist_on(ctx))
    return local;
  int in = local ? 1 : 0, out = 0;
  if (!allreduce(&in, &out, 1, MPI_INT, MPI_MAX))
    return TRUE;
  return out != 0;
}

gboolean search_dist_should_stop(const SearchContext *ctx)
{
  if (!search_dist_on(ctx))
    return search_context_should_stop(ctx);
  SearchContext *root = ctx->root;
  /* [0]: this context stops; [1]: the whole search stops here (a signal, the deadline),
   * with the signal and the rank (signal << 16 | rank). */
  int sig = search_signals_first();
  gboolean whole = atomic_load(&root->interrupted) || search_signals_seen() > 0 ||
                   (root->watch && search_watch_fired(root->watch)) ||
                   search_context_should_stop(root);
  int in[3] = { search_context_should_stop(ctx) ? 1 : 0, whole ? 1 : 0,
                sig > 0 ? (sig << 16) | dist.rank : 0 };
  int out[3] = { 0, 0, 0 };
  if (!allreduce(in, out, 3, MPI_INT, MPI_MAX))
    return TRUE;
  if (out[1] && !whole)
    atomic_store(&root->interrupted, 1);
  if (out[2] && !sig)
    note("%s on rank %d: every rank stopped and the best plan of them all was kept",
         (out[2] >> 16) == SIGTERM ? "SIGTERM" : (out[2] >> 16) == SIGINT ? "SIGINT"
                                                                         : "a signal",
         out[2] & 0xffff);
  return out[0] != 0 || out[1] != 0;
}

#else /* !PARASOL_HAVE_MPI */

void search_dist_share(const SearchContext *ctx, int n, void *base, size_t stride, size_t size)
{
}

void search_dist_sync(SearchContext *ctx)
{
}

gboolean search_dist_any(const SearchContext *ctx, gboolean local)
{
  return local;
}

gboolean search_dist_should_stop(const SearchContext *ctx)
{
  return search_context_should_stop(ctx);
}

#endif

void search_dist_end(SearchContext *root)
{
  if (search_dist_on(root))
    search_dist_sync(root);
  dist.root = NULL;
  dist.also = NULL;
}
