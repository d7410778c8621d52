/* distributed.h — one search shared among MPI ranks (distributed.c, docs/distributed.md).
 *
 * The work of a shared search is divided by task index, never by timing: in a round of
 * parallel tasks (MCMC chains, expert plans, neighbours of the Megatron refinement, the
 * trials of an operator in the local search, alpa's stage programs) task i runs on rank
 * i mod ranks, on that rank's share of the --threads workers.  After each
 * round the ranks exchange what the tasks found (search_dist_share), the evaluations they
 * counted and their best strategies (search_dist_sync), so that every rank holds what one
 * process would: the same plan for the same seed, threads and evaluation budget however
 * many ranks ran it.  Every decision that leads to an exchange is one the ranks agree on
 * (search_dist_any), so that they all make the same exchanges in the same order.
 *
 * Where the search is not shared (no MPI, one rank, an algorithm that does not divide
 * its work, or after a rank was lost) every function does what one process does: tasks
 * run here, exchanges do nothing, and the agreed values are this rank's own. */
#pragma once

#include "search-private.h"

/* Called by search_run() around the algorithm: whether @root's search is shared (MPI
 * started with more than one rank, sharing on, and an algorithm that divides its work),
 * and the last exchange of the evaluations and the best once it has returned. */
void search_dist_begin(SearchContext *root);
void search_dist_end(SearchContext *root);

/* Whether @ctx's search is shared now. */
gboolean search_dist_on(const SearchContext *ctx);
/* Where @ctx's search is shared: the contexts on @p, a problem that every rank searches
 * together at this point (subst's rewritten graphs), share their work as those on the
 * search's own problem do, until the next call (NULL: none). */
void search_dist_also(const SearchContext *ctx, const SearchProblem *p);
/* Whether this rank runs task @i of a round. */
gboolean search_dist_mine(const SearchContext *ctx, int i);
/* The most threads search_dist_parallel() runs tasks on here: this rank's share of the
 * context's threads (all of them when not shared). */
int search_dist_threads(const SearchContext *ctx);
/* Runs the tasks of [0, @n) this rank owns on its share of the context's threads (all of
 * them, on all threads, when not shared). */
void search_dist_parallel(SearchContext *ctx, int n, void (*fn)(int i, gpointer data),
                          gpointer data);
/* After a round of @n tasks: the @size bytes at @base + i * @stride that task i's rank
 * wrote, copied to every rank. */
void search_dist_share(const SearchContext *ctx, int n, void *base, size_t stride,
                       size_t size);
/* After a round: the evaluations its tasks counted, summed over the ranks, and the best
 * strategy of @ctx (and of its root), the best of the ranks' (ties by key), on every rank. */
void search_dist_sync(SearchContext *ctx);
/* @local on this rank, or'ed over the ranks. */
gboolean search_dist_any(const SearchContext *ctx, gboolean local);
/* search_context_should_stop(), agreed: TRUE on every rank when it is on one. */
gboolean search_dist_should_stop(const SearchContext *ctx);
