/* parasol-sim.h — the public interface of libsim.
 *
 * libsim holds everything needed to predict how long one training iteration of a
 * deep neural network takes on a machine under a parallelization strategy: the graph
 * IR and its operator catalogue, the model zoo, the machine model, strategies, the
 * lowering to a task graph, the discrete-event engine with its network and collective
 * models, the cost models, memory accounting, delta simulation, reports and traces.
 *
 * Types are opaque unless they are small values (shapes, regions, specs) that callers
 * build on the stack.  Errors on input and I/O are reported through GError in the
 * SIM_ERROR domain; misuse of the API is caught by g_return_val_if_fail.
 *
 * The interface comes in parts, one a subsystem, each including the ones before it:
 * parasol-sim-core.h (errors, input files, tensors), -graph.h (operator catalogue and
 * graphs), -zoo.h (model zoo and import), -machine.h (devices and machines), -cost.h
 * (cost models), -strategy.h (strategies), -simulate.h (simulation, reports, sessions)
 * and -plan.h (plans for executors).  Including this header includes them all.
 */
#pragma once

#include "parasol-sim-core.h"
#include "parasol-sim-graph.h"
#include "parasol-sim-zoo.h"
#include "parasol-sim-machine.h"
#include "parasol-sim-cost.h"
#include "parasol-sim-strategy.h"
#include "parasol-sim-simulate.h"
#include "parasol-sim-plan.h"
