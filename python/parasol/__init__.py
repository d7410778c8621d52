"""parasol from Python: models, machines and strategies; simulation; search.

A thin layer over libparasol (ctypes; docs/library.md):

    import parasol
    model = parasol.Model("resnet-50")
    machine = parasol.Machine("dgx-a100")
    report = parasol.simulate(model, machine)            # the JSON report, as a dict
    result = parasol.search(model, machine, "mcmc", budget="200evals", seed=1)
    rows = parasol.compare(["mlp", "resnet-50"], "dgx-a100", ["mcmc", "dp"])

A search algorithm written in Python subclasses SearchAlgorithm; the C driver runs it as
it runs the built-in ones, with the same budget, log and Ctrl-C.
"""
import ctypes
import json
import math
import os
import random

from . import _lib
from ._lib import lib

__all__ = ["Error", "zoo_params", "Model", "Machine", "Strategy", "Problem", "Config", "Context",
           "SearchAlgorithm", "SearchResult", "models", "machines", "algorithms",
           "simulate", "search", "compare", "register", "load_plugin", "PRECISIONS"]

__version__ = "0.1.0"

# The float dtype of a model's activations and weights under each precision, as
# `parasol simulate --precision` sets it (cli/sim-options.c): SimDType values.
_FP32, _FP16, _BF16 = 0, 1, 2
PRECISIONS = {"mixed-fp16": _FP16, "mixed-bf16": _BF16, "fp32": _FP32, "tf32": _FP32,
              "fp8": _BF16}
# SimPrecision values (include/parasol-sim.h).
_SIM_PRECISION = {"fp32": 0, "mixed-fp16": 1, "mixed-bf16": 2, "tf32": 3, "fp8": 4}
DEFAULT_MODEL = "gpt"
DEFAULT_MACHINE = "dgx-a100"


class Error(Exception):
    """An error of the library: its message names the file, place and expectation."""


def _check(ok, err):
    if not ok:
        message = err.contents.message.decode() if err else "failed"
        if err:
            _lib.glib.g_error_free(err)
        raise Error(message)


def _err():
    return _lib.GErrorP()


def _b(text):
    return None if text is None else os.fsencode(text) if isinstance(text, os.PathLike) \
        else str(text).encode()


def zoo_params(name):
    """A zoo model's parameters with their defaults: {name: (value, help)}; {} for a name
    that is not in the zoo."""
    p = lib.sim_zoo_model_params(_b(name))
    out = {}
    i = 0
    while p and p[i].name:
        out[p[i].name.decode()] = (p[i].value, p[i].help.decode() if p[i].help else "")
        i += 1
    return out


class Model:
    """A zoo model or a graph file, with integer parameters (layers=4, batch=64) and the
    float dtype of a precision (mixed-fp16, the CLI's default).  As the program does, a
    zoo transformer whose vocabulary is not given is padded as Megatron pads it, to a
    multiple of 128 x tp (the library's sim_model_params_pad_vocab()); `vocab_padding` is
    then (default, padded), else None."""

    def __init__(self, name=DEFAULT_MODEL, precision="mixed-fp16", tp=1, **params):
        if precision not in PRECISIONS:
            raise Error("precision '%s': expected one of %s" % (precision,
                                                                 ", ".join(PRECISIONS)))
        self.vocab_padding = None
        pp = lib.sim_model_params_new()
        try:
            for k, v in params.items():
                err = _err()
                _check(lib.sim_model_params_parse(pp, ("%s=%s" % (k, v)).encode(),
                                                  ctypes.byref(err)), err)
            vocab, padded = ctypes.c_int64(), ctypes.c_int64()
            if lib.sim_model_params_pad_vocab(pp, _b(name), int(tp), ctypes.byref(vocab),
                                              ctypes.byref(padded)):
                self.vocab_padding = (vocab.value, padded.value)
            err = _err()
            self._ptr = lib.sim_model_load(_b(name), pp, ctypes.byref(err))
            _check(self._ptr, err)
        finally:
            lib.sim_model_params_free(pp)
        lib.sim_graph_set_float_dtype(self._ptr, PRECISIONS[precision])
        self.precision = precision

    @classmethod
    def _borrow(cls, ptr, owner):
        m = cls.__new__(cls)
        m._ptr, m._owner, m.precision = ptr, owner, None
        return m

    def __del__(self):
        if getattr(self, "_ptr", None) and not hasattr(self, "_owner"):
            lib.sim_graph_free(self._ptr)
            self._ptr = None

    name = property(lambda self: lib.sim_graph_get_name(self._ptr).decode())
    n_ops = property(lambda self: lib.sim_graph_n_ops(self._ptr))
    n_params = property(lambda self: lib.sim_graph_n_params(self._ptr))
    batch_size = property(lambda self: lib.sim_graph_batch_size(self._ptr))

    def op_name(self, op):
        return lib.sim_graph_op_name(self._ptr, op).decode()

    def to_json(self):
        """The graph file (docs/formats.md) as a dict."""
        return json.loads(_lib.take_string(lib.sim_graph_to_json(self._ptr)))

    def __repr__(self):
        return "<parasol.Model %s: %d ops, %d parameters>" % (self.name, self.n_ops,
                                                               self.n_params)


class Machine:
    """A library machine ("dgx-a100", "dgx-a100:4" for four nodes) or a machine file."""

    def __init__(self, name=DEFAULT_MACHINE):
        err = _err()
        self._ptr = lib.sim_machine_load(_b(name), ctypes.byref(err))
        _check(self._ptr, err)

    def __del__(self):
        if getattr(self, "_ptr", None):
            lib.sim_machine_free(self._ptr)
            self._ptr = None

    name = property(lambda self: lib.sim_machine_get_name(self._ptr).decode())
    n_devices = property(lambda self: lib.sim_machine_n_devices(self._ptr))
    n_nodes = property(lambda self: lib.sim_machine_n_nodes(self._ptr))

    def to_json(self):
        return json.loads(_lib.take_string(lib.sim_machine_to_json(self._ptr)))

    def __repr__(self):
        return "<parasol.Machine %s: %d GPUs>" % (self.name, self.n_devices)


def _model(m):
    return m if isinstance(m, Model) else Model(m)


def _machine(m):
    return m if isinstance(m, Machine) else Machine(m)


class Strategy:
    """A parallelization strategy of a model on a machine."""

    def __init__(self, ptr, model, machine):
        self._ptr, self.model, self.machine = ptr, model, machine

    def __del__(self):
        if getattr(self, "_ptr", None):
            lib.sim_strategy_free(self._ptr)
            self._ptr = None

    @classmethod
    def data_parallel(cls, model, machine, n_devices=None):
        """Every operator data parallel over the first n_devices GPUs (default all)."""
        err = _err()
        n = machine.n_devices if n_devices is None else n_devices
        p = lib.sim_strategy_data_parallel(model._ptr, machine._ptr, n, ctypes.byref(err))
        _check(p, err)
        return cls(p, model, machine)

    @classmethod
    def megatron(cls, model, machine, tp=1, pp=1, dp=None, microbatches=None,
                 bucket_mb=25, precision=None):
        """A Megatron-style plan, built as `parasol simulate --tp --pp --dp` builds it
        (cli/sim-options.c): dp defaults to the GPUs tp and pp leave; micro-batches to one,
        or four per stage for a pipeline, as far as the batch divides; gradients
        all-reduced in bucket_mb MB buckets during the backward pass.  With the defaults,
        data parallelism over every GPU: `parasol simulate`'s default plan."""
        o = lib.sim_megatron_options_default()
        n = machine.n_devices
        if dp is None:
            if n % (tp * pp):
                raise Error("tp %d x pp %d = %d GPUs do not divide the machine's %d; give dp "
                            "to use fewer" % (tp, pp, tp * pp, n))
            dp = n // (tp * pp)
        o.dp, o.tp, o.pp = dp, tp, pp
        if microbatches is None:
            per_replica = model.batch_size // max(dp, 1)
            microbatches = 4 * pp if pp > 1 else 1
            while microbatches > 1 and per_replica % microbatches:
                microbatches -= 1
        o.microbatches = microbatches
        o.sync.bucket_bytes = int(bucket_mb * 1e6)
        o.memory.precision = _SIM_PRECISION[precision or model.precision or "mixed-fp16"]
        err = _err()
        p = lib.sim_strategy_megatron(model._ptr, machine._ptr, ctypes.byref(o),
                                      ctypes.byref(err))
        _check(p, err)
        return cls(p, model, machine)

    @classmethod
    def load(cls, path, model, machine):
        """A strategy file (docs/formats.md)."""
        err = _err()
        p = lib.sim_strategy_load(_b(path), model._ptr, machine._ptr, ctypes.byref(err))
        _check(p, err)
        return cls(p, model, machine)

    @classmethod
    def from_json(cls, data, model, machine):
        text = data if isinstance(data, str) else json.dumps(data)
        err = _err()
        p = lib.sim_strategy_from_json(text.encode(), b"<python>", model._ptr, machine._ptr,
                                       ctypes.byref(err))
        _check(p, err)
        return cls(p, model, machine)

    def copy(self):
        return Strategy(lib.sim_strategy_copy(self._ptr), self.model, self.machine)

    def degrees(self, op):
        """The degrees of operator op's iteration dimensions."""
        d = lib.sim_strategy_op_degrees(self._ptr, op)
        return [d[i] for i in range(6)]

    def to_json(self):
        return json.loads(_lib.take_string(lib.sim_strategy_to_json(self._ptr,
                                                                    self.model._ptr)))

    def save(self, path):
        err = _err()
        _check(lib.sim_strategy_save(self._ptr, self.model._ptr, _b(path), ctypes.byref(err)),
               err)


def models():
    """The zoo: [(name, description)] in the order of `parasol models`."""
    return [(lib.sim_zoo_model_name(i).decode(), lib.sim_zoo_model_description(i).decode())
            for i in range(lib.sim_zoo_n_models())]


def machines():
    """The names of the machines in the library."""
    v = lib.sim_machine_library_names()
    names = []
    i = 0
    while v[i]:
        names.append(v[i].decode())
        i += 1
    _lib.glib.g_strfreev(ctypes.cast(v, ctypes.c_void_p))
    return names


def simulate(model=DEFAULT_MODEL, machine=DEFAULT_MACHINE, strategy=None):
    """Simulates one training iteration and returns the report as `parasol simulate
    --json` prints it (iteration_time_s, fits, peak_memory_bytes, devices, ...).  The
    default strategy is `parasol simulate`'s: data parallelism over every GPU
    (Strategy.megatron()); a path loads a strategy file."""
    model, machine = _model(model), _machine(machine)
    if strategy is None:
        strategy = Strategy.megatron(model, machine)
    elif not isinstance(strategy, Strategy):
        strategy = Strategy.load(strategy, model, machine)
    cost = lib.sim_cost_model_new_roofline(None)
    try:
        err = _err()
        r = lib.sim_simulate(model._ptr, machine._ptr, strategy._ptr, cost, None,
                             ctypes.byref(err))
        _check(r, err)
        try:
            return json.loads(_lib.take_string(lib.sim_report_to_json(r)))
        finally:
            lib.sim_report_free(r)
    finally:
        lib.sim_cost_model_free(cost)


# --------------------------------------------------------------------------------------
# Search

class Config:
    """One parallel configuration of an operator: a degree per iteration dimension on
    the n consecutive devices from start."""

    def __init__(self, problem, op, index, ptr):
        self._problem, self.op, self.index, self._ptr = problem, op, index, ptr

    degrees = property(lambda self: list(self._ptr.contents.degree))
    start = property(lambda self: self._ptr.contents.start)
    n = property(lambda self: self._ptr.contents.n)

    def __str__(self):
        return _lib.take_string(lib.search_problem_config_to_string(self._problem._ptr,
                                                                    self.op, self._ptr))

    __repr__ = __str__


class Problem:
    """What a search works on: the model, the machine and each operator's candidate
    configurations."""

    def __init__(self, ptr, model, machine):
        self._ptr, self.model, self.machine = ptr, model, machine

    @property
    def n_ops(self):
        return self.model.n_ops

    def n_configs(self, op):
        return lib.search_problem_n_configs(self._ptr, op)

    def config(self, op, i):
        return Config(self, op, i, lib.search_problem_config(self._ptr, op, i))

    def configs(self, op):
        return [self.config(op, i) for i in range(self.n_configs(op))]

    def config_of(self, strategy, op):
        """The index of the configuration strategy gives op (-1 if not a candidate)."""
        return lib.search_problem_config_of(self._ptr, strategy._ptr, op)

    def apply(self, strategy, op, config):
        """Gives operator op the configuration config in strategy."""
        err = _err()
        _check(lib.search_problem_apply_config(self._ptr, strategy._ptr, op, config._ptr,
                                               ctypes.byref(err)), err)

    def new_strategy(self):
        return Strategy(lib.search_problem_new_strategy(self._ptr), self.model, self.machine)

    def data_parallel(self):
        err = _err()
        p = lib.search_problem_data_parallel(self._ptr, ctypes.byref(err))
        _check(p, err)
        return Strategy(p, self.model, self.machine)


class Context:
    """The context a search algorithm runs in: its problem, budget and seed."""

    def __init__(self, ptr, problem):
        self._ptr, self.problem = ptr, problem
        self.seed = lib.search_context_get_seed(ptr)
        # One generator per run, from the run's seed: a seed reproduces a search.
        self.random = random.Random(self.seed)

    def evaluate(self, strategy):
        """Simulates strategy, counting one evaluation: its iteration time in seconds,
        or inf when it is infeasible (out of memory, invalid)."""
        return lib.search_context_evaluate(self._ptr, strategy._ptr)

    def should_stop(self):
        """True once the budget is spent or the user interrupted (Ctrl-C)."""
        return bool(lib.search_context_should_stop(self._ptr))

    def set_current(self, cost):
        lib.search_context_set_current(self._ptr, cost)

    evals = property(lambda self: lib.search_context_get_evals(self._ptr))
    evals_left = property(lambda self: lib.search_context_evals_left(self._ptr))
    elapsed = property(lambda self: lib.search_context_elapsed(self._ptr))

    def best(self):
        """The best time any evaluation found so far (inf when none)."""
        return lib.search_context_get_best(self._ptr, None)

    def option(self, key, default=None):
        """An algorithm option ("key=value" in search(options=...))."""
        v = lib.search_context_get_option(self._ptr, key.encode())
        return default if v is None else v.decode()


class SearchAlgorithm:
    """A search algorithm in Python.  Subclasses set `name` and `description` and define
    run(ctx), which proposes strategies, evaluates them with ctx.evaluate() and returns
    once ctx.should_stop() says so; the driver keeps the best.  run() is called once, on
    the thread that called search(), whatever search(threads=) says: docs/library.md
    ("A search algorithm in Python") says why."""

    name = None
    description = None

    def run(self, ctx):
        raise NotImplementedError


# name -> [SearchAlgorithm struct, C callback, Python instance, last exception]
_registered = {}
_problems = {}  # problem pointer -> Problem, while a search runs
_left_running = []  # what searches left running at their deadline still read


def _make_callback(entry):
    def run(self_ptr, ctx_ptr, error):
        try:
            pptr = lib.search_context_get_problem(ctx_ptr)
            problem = _problems.get(pptr)
            if problem is None:
                raise Error("a Python search algorithm runs only through parasol.search()")
            entry[2].run(Context(ctx_ptr, problem))
            return 1
        except BaseException as e:  # noqa: B902 - reported to the driver, raised again
            entry[3] = e
            msg = "%s: %s" % (type(e).__name__, e)
            _lib.glib.g_set_error_literal(error, lib.search_error_quark(),
                                          _lib.SEARCH_ERROR_FAILED, msg.encode())
            return 0
    return _lib.RUN_FUNC(run)


def register(algorithm):
    """Registers a SearchAlgorithm instance under its name for search() and compare().
    Registering another instance under the same name replaces the Python side."""
    lib.search_register_builtins()
    name, desc = algorithm.name, algorithm.description
    if not name or not desc:
        raise Error("a search algorithm needs a name and a description")
    if name in _registered:
        _registered[name][2] = algorithm
        return
    entry = [None, None, algorithm, None]
    entry[1] = _make_callback(entry)
    entry[0] = _lib.SearchAlgorithm(api_version=_lib.SEARCH_ALGORITHM_API_VERSION,
                                    name=name.encode(), description=desc.encode(),
                                    run=entry[1])
    err = _err()
    _check(lib.search_register(ctypes.byref(entry[0]), ctypes.byref(err)), err)
    _registered[name] = entry


def load_plugin(path):
    """Loads a search plugin (a shared object, docs/extending.md); returns its name."""
    lib.search_register_builtins()
    err = _err()
    a = lib.search_load_plugin(_b(path), ctypes.byref(err))
    _check(a, err)
    return ctypes.cast(a, ctypes.POINTER(_lib.SearchAlgorithm)).contents.name.decode()


def algorithms():
    """The registered algorithms: [(name, description)]."""
    lib.search_register_builtins()
    out = []
    for i in range(lib.search_n_algorithms()):
        a = lib.search_algorithm_get(i).contents
        out.append((a.name.decode(), a.description.decode()))
    return out


class SearchResult:
    """What a search found: time (s, inf when nothing fit), strategy (None then), evals,
    elapsed (s), interrupted, and improvements [(wall s, evals, best s)]."""

    def __repr__(self):
        return "<parasol.SearchResult %s: %.6g s after %d evaluations>" % (
            self.algorithm, self.time, self.evals)


def search(model=DEFAULT_MODEL, machine=DEFAULT_MACHINE, algorithm="mcmc", budget="200evals",
           seed=0, threads=1, log=None, options=None, progress=False):
    """Runs a registered search algorithm (a name, or a SearchAlgorithm instance, which is
    registered first) with a budget ("30s", "2m", "500evals", or a number of
    evaluations), a seed and, optionally, a CSV log of improvements.  Ctrl-C stops the
    search, which keeps its best."""
    model, machine = _model(model), _machine(machine)
    lib.search_register_builtins()
    if isinstance(algorithm, SearchAlgorithm):
        register(algorithm)
        algorithm = algorithm.name
    algo = lib.search_lookup(algorithm.encode())
    if not algo:
        raise Error("unknown search algorithm '%s'; expected one of %s" % (
            algorithm, ", ".join(n for n, _ in algorithms())))
    o = lib.search_run_options_default()
    err = _err()
    _check(lib.search_parse_budget(str(budget).encode(), ctypes.byref(o), ctypes.byref(err)),
           err)
    o.seed = int(seed)
    o.threads = int(threads)
    o.log_path = _b(log)
    o.progress = bool(progress)
    o.handle_sigint = True
    opts = ["%s=%s" % kv for kv in (options or {}).items()]
    arr = (ctypes.c_char_p * (len(opts) + 1))(*[s.encode() for s in opts], None)
    o.options = arr
    cost = lib.sim_cost_model_new_roofline(None)
    pptr = lib.search_problem_new(model._ptr, machine._ptr, cost)
    problem = Problem(pptr, model, machine)
    _problems[pptr] = problem
    entry = _registered.get(algorithm)
    if entry:
        entry[3] = None
    try:
        err = _err()
        r = lib.search_run(algo, pptr, ctypes.byref(o), ctypes.byref(err))
        if not r and entry and entry[3] is not None:
            if err:
                _lib.glib.g_error_free(err)
            raise entry[3]
        _check(r, err)
        try:
            res = SearchResult()
            res.algorithm = algorithm
            res.seed = int(seed)
            res.model, res.machine = model.name, machine.name
            res.time = lib.search_result_get_time(r)
            res.evals = lib.search_result_get_evals(r)
            res.elapsed = lib.search_result_get_elapsed(r)
            res.interrupted = bool(lib.search_result_get_interrupted(r))
            le = lib.search_result_get_log_error(r)
            res.log_error = le.decode() if le else None
            res.improvements = []
            for i in range(lib.search_result_n_improvements(r)):
                w, e, b = ctypes.c_double(), ctypes.c_int64(), ctypes.c_double()
                lib.search_result_get_improvement(r, i, ctypes.byref(w), ctypes.byref(e),
                                                  ctypes.byref(b))
                res.improvements.append((w.value, e.value, b.value))
            s = lib.search_result_get_strategy(r)
            res.strategy = None
            if s and lib.search_result_get_graph(r) == model._ptr:
                res.strategy = Strategy(lib.sim_strategy_copy(s), model, machine)
            elif s:
                # Found on a rewritten graph: the strategy as JSON, with its rewrites.
                g = lib.search_result_get_graph(r)
                res.strategy_json = json.loads(_lib.take_string(
                    lib.sim_strategy_to_json(s, g)))
            return res
        finally:
            lib.search_result_free(r)
    finally:
        del _problems[pptr]
        if lib.search_algorithms_left_running() > 0:
            # An algorithm left running at its deadline still reads the problem, its cost
            # model, graph and machine: they are kept until the interpreter ends.
            _left_running.append((pptr, cost, model, machine, problem))
        else:
            lib.search_problem_unref(pptr)
            lib.sim_cost_model_free(cost)


def compare(models=(DEFAULT_MODEL,), machine=DEFAULT_MACHINE, algorithms=("mcmc", "dp"),
            budget="200evals", seeds=(0,), threads=1):
    """Runs every algorithm with every seed on every model: a list of dicts (model,
    machine, algorithm, seed, time_s, evals, elapsed_s), time_s inf when nothing fit."""
    machine = _machine(machine)
    rows = []
    for name in models:
        model = _model(name)
        for algo in algorithms:
            for seed in seeds:
                r = search(model, machine, algo, budget=budget, seed=seed, threads=threads)
                rows.append({"model": model.name, "machine": machine.name,
                             "algorithm": r.algorithm, "seed": seed, "time_s": r.time,
                             "evals": r.evals, "elapsed_s": r.elapsed})
    return rows
