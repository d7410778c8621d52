/* strategy-build.c — being written. */
#include "sim-private.h"
