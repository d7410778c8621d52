/* machine-json.c — being written. */
#include "sim-private.h"
