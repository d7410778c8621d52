/* delta.c — being written. */
#include "sim-private.h"
