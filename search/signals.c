/* signals.c — Ctrl-C and SIGTERM for searches, and watches: a thread that cancels a
 * problem's simulations at a deadline or at a signal (parasol-search.h).  driver.c asks
 * both whether a search should stop. */
#include "search-private.h"

#include <signal.h>
#include <string.h>

/* ---------------------------------------------------------------------------------- */
/* Ctrl-C                                                                             */

/* Ctrl-C and SIGTERM: the first asks the searches to stop and the command to wrap up
 * (write the best plan); a second is counted and changes nothing (the plan is still
 * written); a third kills the process as the signal would have. */
static atomic_int signals_seen;
static atomic_int signal_first;
static atomic_int signals_caught;
static struct sigaction old_int, old_term;

static void on_signal(int sig)
{
  int n = atomic_fetch_add(&signals_seen, 1) + 1;
  int zero = 0;
  atomic_compare_exchange_strong(&signal_first, &zero, sig);
  if (n >= 3) {
    signal(sig, SIG_DFL);
    raise(sig);
  }
}

void search_signals_catch(void)
{
  if (atomic_exchange(&signals_caught, 1))
    return;
  atomic_store(&signals_seen, 0);
  atomic_store(&signal_first, 0);
  struct sigaction action;
  memset(&action, 0, sizeof action);
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, &old_int);
  sigaction(SIGTERM, &action, &old_term);
}

void search_signals_release(void)
{
  if (!atomic_exchange(&signals_caught, 0))
    return;
  sigaction(SIGINT, &old_int, NULL);
  sigaction(SIGTERM, &old_term, NULL);
}

int search_signals_seen(void)
{
  return atomic_load(&signals_seen);
}

int search_signals_first(void)
{
  return atomic_load(&signal_first);
}

/* ---------------------------------------------------------------------------------- */
/* Watches: a thread that cancels a problem's simulations at a deadline or a signal     */

struct _SearchWatch {
  SearchProblem *problem;
  atomic_int fired;
  gint64 deadline_us;
  gboolean signals;
  GMutex lock;
  GCond cond;
  gboolean quit;
  GThread *thread;
};

static void watch_fire(SearchWatch *w)
{
  if (!atomic_exchange(&w->fired, 1))
    atomic_fetch_add(&w->problem->cancel->flag, 1);
}

static gpointer watch_thread(gpointer data)
{
  SearchWatch *w = data;
  g_mutex_lock(&w->lock);
  while (!w->quit) {
    gint64 now = g_get_monotonic_time();
    if ((w->deadline_us > 0 && now >= w->deadline_us) ||
        (w->signals && atomic_load(&signals_seen) > 0)) {
      watch_fire(w);
      break;
    }
    /* Signals are polled every 10 ms; the deadline is met to the microsecond. */
    gint64 until = now + 10000;
    if (w->deadline_us > 0 && w->deadline_us < until)
      until = w->deadline_us;
    g_cond_wait_until(&w->cond, &w->lock, until);
  }
  g_mutex_unlock(&w->lock);
  return NULL;
}

SearchWatch *search_watch_new(SearchProblem *p, gint64 deadline_us, gboolean signals)
{
  g_return_val_if_fail(p != NULL, NULL);
  SearchWatch *w = g_new0(SearchWatch, 1);
  w->problem = search_problem_ref(p);
  atomic_init(&w->fired, 0);
  w->deadline_us = deadline_us;
  w->signals = signals;
  g_mutex_init(&w->lock);
  g_cond_init(&w->cond);
  if (signals && atomic_load(&signals_seen) > 0)
    watch_fire(w);
  else if (deadline_us > 0 && g_get_monotonic_time() >= deadline_us)
    watch_fire(w);
  else if (deadline_us > 0 || signals)
    w->thread = g_thread_new("search-watch", watch_thread, w);
  return w;
}

gboolean search_watch_fired(const SearchWatch *w)
{
  g_return_val_if_fail(w != NULL, FALSE);
  return atomic_load(&w->fired) != 0;
}

/* Stops the watch's thread and takes back its cancellation: the problem's simulations
 * run again (except for another watch's that has fired). */
void search_watch_stop(SearchWatch *w)
{
  if (w->thread) {
    g_mutex_lock(&w->lock);
    w->quit = TRUE;
    g_cond_signal(&w->cond);
    g_mutex_unlock(&w->lock);
    g_thread_join(w->thread);
    w->thread = NULL;
  }
  if (atomic_exchange(&w->fired, 0))
    atomic_fetch_sub(&w->problem->cancel->flag, 1);
}

void search_watch_free(SearchWatch *w)
{
  if (!w)
    return;
  search_watch_stop(w);
  search_problem_unref(w->problem);
  g_mutex_clear(&w->lock);
  g_cond_clear(&w->cond);
  g_free(w);
}

/* Whether search_signals_catch() holds the signals now. */
gboolean search_signals_caught(void)
{
  return atomic_load(&signals_caught) != 0;
}
