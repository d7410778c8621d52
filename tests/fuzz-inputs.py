#!/usr/bin/env python3
"""fuzz-inputs.py PARASOL [COUNT] [SEED]: hostile input files and numbers for every reader.

Each input is a valid file (strategy, graph, machine, profile, calibration, batch) with one
mutation of a class that once crashed or misled a reader: deep nesting, integers beyond 64
bits and numbers beyond a double, NUL bytes, cut or flipped bytes, unknown keys, values of
the wrong type; or a path that is no file (/dev/zero, a folder, a pipe); or an option given
a special number.  The program must end within its time with status 0, 1 or 2, a message
on status 2, and nothing from a sanitizer or GLib's critical checks.  Prints the inputs
tried, the crashes and the hangs, and exits 1 when there was either."""
import os
import random
import re
import subprocess
import sys
import tempfile

TIMEOUT_S = 30
MLP = ["--model", "mlp", "--param", "layers=2,hidden=64,input=32,classes=16,batch=8",
       "--machine", "dgx-a100:1"]
GRAPH = """{"format": "parasol-graph", "version": 1, "name": "hand", "tokens_per_sample": 1,
 "ops": [
  {"name": "x", "type": "input", "inputs": [], "attrs": {"shape": [8, 32]}},
  {"name": "fc1", "type": "linear", "inputs": ["x"], "attrs": {"out_features": 64}},
  {"name": "act", "type": "unary", "inputs": ["fc1"], "attrs": {"kind": "relu"}},
  {"name": "fc2", "type": "linear", "inputs": ["act"], "attrs": {"out_features": 16}},
  {"name": "y", "type": "input", "inputs": [], "attrs": {"shape": [8]}},
  {"name": "loss", "type": "cross_entropy", "inputs": ["fc2", "y"]}
 ]}
"""
SPECIAL = ["9223372036854775808", "-9223372036854775809", "9223372036854775807",
           "18446744073709551616", "99999999999999999999999999", "1e400", "-1e400", "1e308",
           "-1e308", "4.9e-324", "1e-400", "NaN", "Infinity", "-0", "0", "-1", "2147483648",
           "-2147483649", "0.5", "1e15", "123456789012345678901234567890e-10"]
NON_FILES = ["/dev/zero", "/dev/null", "/dev/urandom", "DIR", "FIFO"]
SANITIZER = re.compile(r"AddressSanitizer|UndefinedBehaviorSanitizer|runtime error:|"
                       r"LeakSanitizer|CRITICAL|GLib-WARNING|\*\* WARNING")


def mutate(text, rng):
    """One mutation of @text (bytes) and its class."""
    kind = rng.choice(["deep", "number", "nul", "cut", "flip", "key", "type", "deep-string"])
    n = len(text)
    at = rng.randrange(n + 1)
    if kind == "deep":
        depth = rng.choice([257, 1000, 100000])
        opener = rng.choice([b"[", b"{\"a\":"])
        return text[:at] + opener * depth + text[at:], kind
    if kind == "deep-string":
        # Brackets inside a string are no nesting: the file must read as before or fail
        # for its content.
        return text.replace(b'"mlp"', b'"' + b"[" * 5000 + b'"', 1), kind
    if kind == "number":
        nums = [m for m in re.finditer(rb"-?\d+(\.\d+)?([eE][-+]?\d+)?", text)]
        if not nums:
            return text, kind
        m = rng.choice(nums)
        return text[:m.start()] + rng.choice(SPECIAL).encode() + text[m.end():], kind
    if kind == "nul":
        return text[:at] + b"\0" + text[at:], kind
    if kind == "cut":
        return text[:at], kind
    if kind == "flip":
        b = bytearray(text)
        for _ in range(rng.randint(1, 4)):
            if b:
                b[rng.randrange(len(b))] = rng.randrange(256)
        return bytes(b), kind
    if kind == "key":
        i = text.find(b"{")
        if i < 0:
            return text, kind
        return text[:i + 1] + b'"unknown_key": 1, ' + text[i + 1:], kind
    # type: a value of another type in place of a number or a string
    vals = [m for m in re.finditer(rb'(:\s*)(-?\d+(\.\d+)?|"[^"]*")', text)]
    if not vals:
        return text, kind
    m = rng.choice(vals)
    new = rng.choice([b"[]", b"{}", b"null", b"true", b'"x"', b"[[[]]]"])
    return text[:m.start(2)] + new + text[m.end(2):], kind


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    prog = sys.argv[1]
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    rng = random.Random(int(sys.argv[3]) if len(sys.argv) > 3 else 1)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    work = tempfile.mkdtemp(prefix="parasol-fuzz-")
    # Inputs that crashed are kept here (removed when empty).
    crash_dir = tempfile.mkdtemp(prefix="parasol-fuzz-crashes-")
    os.mkdir(os.path.join(work, "DIR"))
    os.mkfifo(os.path.join(work, "FIFO"))

    strategy = os.path.join(work, "seed-strategy.json")
    subprocess.run([prog, "simulate", *MLP, "--dp", "1", "--save-strategy", strategy],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def read(*p):
        with open(os.path.join(root, *p), "rb") as f:
            return f.read()

    # kind: (seed text, the command given the file)
    kinds = {
        "strategy": (open(strategy, "rb").read(),
                     lambda f: ["simulate", *MLP, "--strategy", f]),
        "graph": (GRAPH.encode(), lambda f: ["simulate", "--model", f, "--machine", "dgx-a100:1"]),
        "machine": (read("data", "machines", "dgx-a100.json"),
                    lambda f: ["machine", "show", f]),
        "calibration": (read("data", "calibration", "pytorch.json"),
                        lambda f: ["simulate", *MLP, "--calibration", f]),
        "profile": (read("data", "profiles", "h200", "ops.json"),
                    lambda f: ["profile", "show", f]),
        "batch": (("--dp 1\n--strategy " + strategy + "\n--bucket-mb 25\n").encode(),
                  lambda f: ["simulate", *MLP, "--batch", f]),
    }
    options = [("simulate", "--bucket-mb"), ("simulate", "--global-batch"),
               ("simulate", "--microbatches"), ("simulate", "--dp"),
               ("simulate", "--microbatch-size"), ("search", "--budget")]

    tried = crashes = hangs = 0
    classes = {}
    for i in range(count):
        r = rng.random()
        if r < 0.1:
            kind = rng.choice(list(kinds))
            name = rng.choice(NON_FILES)
            path = os.path.join(work, name) if name in ("DIR", "FIFO") else name
            args, what = kinds[kind][1](path), "non-file"
        elif r < 0.2:
            cmd, opt = rng.choice(options)
            value = rng.choice(SPECIAL + ["1e99", "1e99s", "inf", "nan", "-inf"])
            args = [cmd, *MLP, opt, value]
            if cmd == "search":
                # A budget it takes (2147483648 evaluations) would search for hours: a
                # second term bounds it, after the first has been read.
                args[-1] += ",5evals"
            what = "option"
        else:
            kind = rng.choice(list(kinds))
            seed, command = kinds[kind]
            text, what = mutate(seed, rng)
            path = os.path.join(work, "input-%d" % i)
            with open(path, "wb") as f:
                f.write(text)
            args = command(path)
        classes[what] = classes.get(what, 0) + 1
        tried += 1
        try:
            p = subprocess.run([prog, *args], capture_output=True, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            hangs += 1
            print("hang (over %d s): %s" % (TIMEOUT_S, " ".join(args)))
            continue
        err = p.stderr.decode("utf-8", "replace")
        if p.returncode not in (0, 1, 2, 3) or SANITIZER.search(err) or \
           (p.returncode == 2 and not err.strip() and b'"error"' not in p.stdout):
            crashes += 1
            kept = ""
            if what not in ("non-file", "option"):
                kept = os.path.join(crash_dir, "crash-%d" % crashes)
                os.rename(path, kept)
                args = [kept if a == path else a for a in args]
            print("crash (status %d): %s\n  %s" % (p.returncode, " ".join(args), err[-500:]))
        elif what not in ("non-file", "option"):
            os.unlink(path)
    subprocess.run(["rm", "-rf", work])
    if not os.listdir(crash_dir):
        os.rmdir(crash_dir)
    print("inputs: %d tried (%s), %d crashes, %d hangs" %
          (tried, ", ".join("%s %d" % kv for kv in sorted(classes.items())), crashes, hangs))
    sys.exit(1 if crashes or hangs else 0)


if __name__ == "__main__":
    main()
