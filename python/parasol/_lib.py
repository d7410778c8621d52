"""The C library and the declarations of the functions the binding calls (ctypes).

libparasol is found, in order, at $PARASOL_LIBRARY (a path), next to this package when
it was installed with the library (../../libparasol.so.0 from site-packages is not
assumed), and by the dynamic loader's search (libparasol.so.0, then ctypes.util)."""
import ctypes
import ctypes.util
import os

from ctypes import (CFUNCTYPE, POINTER, Structure, c_char_p, c_double, c_int, c_int64,
                    c_uint32, c_uint64, c_void_p)

SONAME = "libparasol.so.0"


class LibraryNotFound(OSError):
    """libparasol could not be loaded."""


def _load():
    path = os.environ.get("PARASOL_LIBRARY")
    candidates = [path] if path else [SONAME, ctypes.util.find_library("parasol")]
    errors = []
    for c in candidates:
        if not c:
            continue
        try:
            return ctypes.CDLL(c)
        except OSError as e:
            errors.append(str(e))
    raise LibraryNotFound(
        "cannot load libparasol (%s); install it (meson install) or set PARASOL_LIBRARY "
        "to the path of libparasol.so" % ("; ".join(errors) or "not found"))


lib = _load()
glib = ctypes.CDLL("libglib-2.0.so.0")

gboolean = c_int


class GError(Structure):
    _fields_ = [("domain", c_uint32), ("code", c_int), ("message", c_char_p)]


GErrorP = POINTER(GError)
GErrorPP = POINTER(GErrorP)


class SimModelParam(Structure):
    _fields_ = [("name", c_char_p), ("value", c_int64), ("help", c_char_p)]


class SearchConfig(Structure):
    """One parallel configuration of an operator (include/parasol-search.h)."""
    _fields_ = [("degree", c_int * 8), ("start", c_int), ("n", c_int)]


class SearchRunOptions(Structure):
    _fields_ = [("time_budget", c_double), ("eval_budget", c_int64), ("seed", c_uint64),
                ("threads", c_int), ("log_path", c_char_p), ("progress", gboolean),
                ("handle_sigint", gboolean), ("options", POINTER(c_char_p)),
                ("deadline_us", c_int64)]


class SimSyncOptions(Structure):
    _fields_ = [("algorithm", c_int), ("bucket_bytes", c_int64), ("overlap", gboolean)]


class SimMemoryOptions(Structure):
    _fields_ = [("recompute", c_int), ("zero1", gboolean), ("precision", c_int),
                ("optimizer", c_int), ("zero2", gboolean), ("zero3", gboolean),
                ("offload", c_double), ("offload_overlap", gboolean)]


class SimTpOverlap(Structure):
    _fields_ = [("chunks", c_int), ("sms_attention", c_int), ("sms_other", c_int)]


class SimMegatronOptions(Structure):
    _fields_ = [("dp", c_int), ("tp", c_int), ("pp", c_int), ("microbatches", c_int),
                ("microbatch_size", c_int64), ("schedule", c_int), ("chunks", c_int),
                ("sequence_parallel", gboolean), ("scatter_gather", gboolean),
                ("sync", SimSyncOptions), ("memory", SimMemoryOptions), ("ep", c_int),
                ("cp", c_int), ("tp_comm_overlap", gboolean), ("tp_overlap", SimTpOverlap),
                ("etp", c_int)]


RUN_FUNC = CFUNCTYPE(gboolean, c_void_p, c_void_p, GErrorPP)


class SearchOptionSpec(Structure):
    _fields_ = [("name", c_char_p), ("help", c_char_p)]


class SearchAlgorithm(Structure):
    _fields_ = [("api_version", c_int), ("name", c_char_p), ("description", c_char_p),
                ("run", RUN_FUNC), ("options", POINTER(SearchOptionSpec)),
                ("user_data", c_void_p)]


SEARCH_ALGORITHM_API_VERSION = 1
SEARCH_ERROR_FAILED = 4

_P = c_void_p


def _decl(name, restype, *argtypes, where=None):
    f = getattr(where or lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)


for _n, _r, _a in [
    # glib
    ("g_free", None, [_P]),
    ("g_strfreev", None, [_P]),
    ("g_error_free", None, [GErrorP]),
    ("g_set_error_literal", None, [GErrorPP, c_uint32, c_int, c_char_p]),
    ("g_rand_free", None, [_P]),
]:
    _decl(_n, _r, *_a, where=glib)

for _n, _r, _a in [
    # models
    ("sim_zoo_n_models", c_int, []),
    ("sim_zoo_model_name", c_char_p, [c_int]),
    ("sim_zoo_model_description", c_char_p, [c_int]),
    ("sim_zoo_model_params", POINTER(SimModelParam), [c_char_p]),
    ("sim_model_params_new", _P, []),
    ("sim_model_params_free", None, [_P]),
    ("sim_model_params_parse", gboolean, [_P, c_char_p, GErrorPP]),
    ("sim_model_params_pad_vocab", gboolean, [_P, c_char_p, c_int, POINTER(c_int64),
                                              POINTER(c_int64)]),
    ("sim_model_load", _P, [c_char_p, _P, GErrorPP]),
    ("sim_graph_free", None, [_P]),
    ("sim_graph_get_name", c_char_p, [_P]),
    ("sim_graph_n_ops", c_int, [_P]),
    ("sim_graph_op_name", c_char_p, [_P, c_int]),
    ("sim_graph_n_params", c_int64, [_P]),
    ("sim_graph_batch_size", c_int64, [_P]),
    ("sim_graph_set_float_dtype", None, [_P, c_int]),
    ("sim_graph_to_json", _P, [_P]),
    # machines
    ("sim_machine_load", _P, [c_char_p, GErrorPP]),
    ("sim_machine_free", None, [_P]),
    ("sim_machine_get_name", c_char_p, [_P]),
    ("sim_machine_n_devices", c_int, [_P]),
    ("sim_machine_n_nodes", c_int, [_P]),
    ("sim_machine_library_names", POINTER(c_char_p), []),
    ("sim_machine_to_json", _P, [_P]),
    # strategies
    ("sim_strategy_free", None, [_P]),
    ("sim_strategy_copy", _P, [_P]),
    ("sim_strategy_data_parallel", _P, [_P, _P, c_int, GErrorPP]),
    ("sim_megatron_options_default", SimMegatronOptions, []),
    ("sim_strategy_megatron", _P, [_P, _P, POINTER(SimMegatronOptions), GErrorPP]),
    ("sim_strategy_load", _P, [c_char_p, _P, _P, GErrorPP]),
    ("sim_strategy_from_json", _P, [c_char_p, c_char_p, _P, _P, GErrorPP]),
    ("sim_strategy_to_json", _P, [_P, _P]),
    ("sim_strategy_save", gboolean, [_P, _P, c_char_p, GErrorPP]),
    ("sim_strategy_op_degrees", POINTER(c_int), [_P, c_int]),
    # simulation
    ("sim_cost_model_new_roofline", _P, [_P]),
    ("sim_cost_model_free", None, [_P]),
    ("sim_simulate", _P, [_P, _P, _P, _P, _P, GErrorPP]),
    ("sim_report_free", None, [_P]),
    ("sim_report_to_json", _P, [_P]),
    # search
    ("search_error_quark", c_uint32, []),
    ("search_register_builtins", None, []),
    ("search_register", gboolean, [POINTER(SearchAlgorithm), GErrorPP]),
    ("search_lookup", _P, [c_char_p]),
    ("search_n_algorithms", c_int, []),
    ("search_algorithm_get", POINTER(SearchAlgorithm), [c_int]),
    ("search_load_plugin", _P, [c_char_p, GErrorPP]),
    ("search_problem_new", _P, [_P, _P, _P]),
    ("search_problem_unref", None, [_P]),
    ("search_problem_get_graph", _P, [_P]),
    ("search_problem_get_machine", _P, [_P]),
    ("search_problem_new_strategy", _P, [_P]),
    ("search_problem_simulate", c_double, [_P, _P, POINTER(_P), GErrorPP]),
    ("search_problem_n_configs", c_int, [_P, c_int]),
    ("search_problem_config", POINTER(SearchConfig), [_P, c_int, c_int]),
    ("search_problem_config_of", c_int, [_P, _P, c_int]),
    ("search_problem_apply_config", gboolean, [_P, _P, c_int, POINTER(SearchConfig),
                                               GErrorPP]),
    ("search_problem_config_to_string", _P, [_P, c_int, POINTER(SearchConfig)]),
    ("search_problem_data_parallel", _P, [_P, GErrorPP]),
    ("search_context_get_problem", _P, [_P]),
    ("search_context_get_seed", c_uint64, [_P]),
    ("search_context_get_evals", c_int64, [_P]),
    ("search_context_evals_left", c_int64, [_P]),
    ("search_context_elapsed", c_double, [_P]),
    ("search_context_should_stop", gboolean, [_P]),
    ("search_context_get_option", c_char_p, [_P, c_char_p]),
    ("search_context_evaluate", c_double, [_P, _P]),
    ("search_context_set_current", None, [_P, c_double]),
    ("search_context_get_best", c_double, [_P, POINTER(_P)]),
    ("search_run_options_default", SearchRunOptions, []),
    ("search_parse_budget", gboolean, [c_char_p, POINTER(SearchRunOptions), GErrorPP]),
    ("search_run", _P, [_P, _P, POINTER(SearchRunOptions), GErrorPP]),
    ("search_result_free", None, [_P]),
    ("search_algorithms_left_running", c_int, []),
    ("search_result_get_strategy", _P, [_P]),
    ("search_result_get_time", c_double, [_P]),
    ("search_result_get_graph", _P, [_P]),
    ("search_result_get_evals", c_int64, [_P]),
    ("search_result_get_elapsed", c_double, [_P]),
    ("search_result_get_interrupted", gboolean, [_P]),
    ("search_result_get_log_error", c_char_p, [_P]),
    ("search_result_n_improvements", c_int, [_P]),
    ("search_result_get_improvement", None, [_P, c_int, POINTER(c_double),
                                             POINTER(c_int64), POINTER(c_double)]),
]:
    _decl(_n, _r, *_a)


def take_string(ptr):
    """A C string the caller owns (transfer full), as str; frees it."""
    if not ptr:
        return None
    try:
        return ctypes.string_at(ptr).decode()
    finally:
        glib.g_free(ptr)
