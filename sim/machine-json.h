/* machine-json.h — what the reader (machine-json.c) and the writer (machine-json-write.c)
 * of machine files share: the units of the keys and the names of dtypes and fabrics.
 * Internal to libsim. */
#pragma once

#include "sim-private.h"

/* Units of the keys: a value read from KEY_GBps is multiplied by GBPS, and so on.  The
 * writer checks that its text multiplied by the same factor gives back the same double,
 * so a file written out reads back to the identical machine. */
#define GBPS 1e9             /* GB/s  -> bytes/s */
#define GBITPS 1.25e8        /* Gb/s  -> bytes/s */
#define TFLOPS 1e12
#define USEC 1e-6
#define GIB 1073741824.0

/* The keys of peak_TFLOPS indexed by SimDType, and the names of the fabrics and of the
 * networks as the description numbers them (machine-json.c). */
extern const char *const sim_machine_dtype_keys[SIM_DTYPE_COUNT];
extern const char *const sim_machine_fabric_names[];
extern const char *const sim_machine_network_names[];
