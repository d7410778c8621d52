/* heap.h — the one min-heap of parasol: a four-ary heap (half the levels of a binary one,
 * and a node's children share cache lines) over an array of any element type, ordered by
 * a strict order @less(const Type *, const Type *).  With a total order (ties broken by a
 * sequence number or an id) the order of the pops does not depend on the heap's shape.
 *
 * SIM_HEAP_DEFINE(name, Type, less) defines, for an array the caller owns (g_free it):
 *   void name_push(Type **v, int *n, int *cap, Type x)   adds x, growing the array
 *   Type name_pop(Type *v, int *n)                        removes the least (*n > 0)
 * The simulator's event queue (sim/engine.c) and the executor's task order
 * (exec/compile.c) use it. */
#pragma once

#include <glib.h>

#define SIM_HEAP_DEFINE(name, Type, less)                                                     \
  static inline void name##_push(Type **v, int *n, int *cap, Type x)                           \
  {                                                                                            \
    if (*n == *cap) {                                                                          \
      *cap = *cap ? *cap * 2 : 1024;                                                           \
      *v = g_renew(Type, *v, *cap);                                                            \
    }                                                                                          \
    Type *h_ = *v;                                                                             \
    int i_ = (*n)++;                                                                           \
    while (i_ > 0) {                                                                           \
      int p_ = (i_ - 1) / 4;                                                                   \
      if (!less(&x, &h_[p_]))                                                                  \
        break;                                                                                 \
      h_[i_] = h_[p_];                                                                         \
      i_ = p_;                                                                                 \
    }                                                                                          \
    h_[i_] = x;                                                                                \
  }                                                                                            \
  static inline Type name##_pop(Type *h_, int *n)                                              \
  {                                                                                            \
    Type top_ = h_[0];                                                                         \
    Type last_ = h_[--*n];                                                                     \
    int n_ = *n, i_ = 0;                                                                       \
    for (;;) {                                                                                 \
      int c_ = 4 * i_ + 1;                                                                     \
      if (c_ >= n_)                                                                            \
        break;                                                                                 \
      int end_ = MIN(c_ + 4, n_), m_ = c_;                                                     \
      for (int k_ = c_ + 1; k_ < end_; k_++)                                                   \
        if (less(&h_[k_], &h_[m_]))                                                            \
          m_ = k_;                                                                             \
      if (!less(&h_[m_], &last_))                                                              \
        break;                                                                                 \
      h_[i_] = h_[m_];                                                                         \
      i_ = m_;                                                                                 \
    }                                                                                          \
    if (n_ > 0)                                                                                \
      h_[i_] = last_;                                                                          \
    return top_;                                                                               \
  }
