/* collective.c — being written. */
#include "sim-private.h"
