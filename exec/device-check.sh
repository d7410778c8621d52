#!/bin/bash
# device-check.sh — every GPU check of parasol, in one call of a lent GPU machine.
#
# The GPU machine may have CUDA, cuBLAS, cuDNN and NCCL (as PyTorch's wheels bring them)
# but no GLib, json-glib or Criterion and no package registry, so the programs are built
# on a build machine and copied there with the libraries they need:
#
#   exec/device-check.sh prepare        # build machine: build with CUDA into build-device/
#                                       # and pack the programs and libraries into .device/
#   bash exec/device-check.sh run       # GPU machine, from a copy of the repository that
#                                       # holds .device/ (at most ten minutes)
#   exec/device-check.sh summary DIR    # print the summary of a run's files again
#
# On the GPU machine, `run` does, each step under a time limit so that the whole stays
# well inside ten minutes:
#   1. the gpu test suite (CUDA kernels against the CPU reference, LLaMA's operators
#      among them: RMS norm, gated MLPs, grouped-query attention with rotary embeddings,
#      the mixture of experts; training steps, LLaMA's and the mixture's on one GPU and
#      ring attention emulated on one GPU among them; the profiler's runner, NCCL when
#      there are two GPUs);
#   2. `parasol profile ops` of gpt, resnet-50 and bert-base in fp16 on one GPU (and
#      gpt's shards on eight), and of the models `parasol validate` runs, in fp32, with
#      the weight update, into one profile database;
#   3. `parasol profile compare`: every fp16 shard measured again against the database
#      (exact and leave-one-out interpolation) and the roofline, default and calibrated;
#   4. `parasol profile calibrate` on the database;
#   5. `parasol validate` of single-GPU plans of the three models in fp32 with the
#      database as cost model, and `parasol simulate` of the same with the roofline;
#   6. `parasol validate` of mixed-precision training iterations of resnet-50 and
#      bert-base priced by the analytic model with the executor's calibration
#      (iterations.csv), against the executed ones;
#   7. a summary of predicted against measured, per operator and per iteration.
# It leaves at most nine files under $OUT: h200-profile.json (the database),
# compare.csv, validate.csv, validate-tasks.csv, iterations.csv, summary.md,
# calibrate.txt, perf.csv and device-check.log (with the test results).  Commit the database as
# data/profiles/h200/ops.json with its notes in data/profiles/README.md.
set -u -o pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
pack="$here/.device"

die() {
  echo "device-check: $*" >&2
  exit 1
}

# ---------------------------------------------------------------------------------------
# prepare: build here, pack for there

prepare() {
  cd "$here" || die "no repository at $here"
  command -v nvcc >/dev/null || die "nvcc is not on the PATH: the CUDA toolkit is needed to build"
  grep -qx '/.device/' .git/info/exclude 2>/dev/null || echo '/.device/' >>.git/info/exclude
  if [ ! -d build-device ]; then
    meson setup build-device -Dgpu=enabled -Dmpi=disabled -Dbuildtype=release \
      -Db_ndebug=true || die "meson setup failed"
  fi
  ninja -C build-device cli/parasol tests/test-gpu tests/test-gpu-inproc || die "the build failed"
  rm -rf "$pack"
  mkdir -p "$pack/bin" "$pack/lib"
  cp build-device/cli/parasol build-device/tests/test-gpu build-device/tests/test-gpu-inproc "$pack/bin/"
  strip --strip-unneeded "$pack/bin/"* 2>/dev/null
  # Every library the programs load, except the C runtime, which the machine has in a
  # newer version, and CUDA's, which come from its toolkit and PyTorch's wheels.
  ldd "$pack/bin/parasol" "$pack/bin/test-gpu" | awk '/=> \// { print $3 }' | sort -u |
    grep -Ev '/(libc|libm|libpthread|libdl|librt|libresolv|libutil|ld-linux[^/]*|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libcudnn[^/]*|libnccl|libnvidia[^/]*)\.so' |
    while read -r lib; do cp -L "$lib" "$pack/lib/"; done
  du -sh "$pack"
  echo "device-check: packed $(ls "$pack/lib" | wc -l) libraries; copy the repository with .device/ to the GPU machine and run 'bash exec/device-check.sh run' there"
}

# ---------------------------------------------------------------------------------------
# summary: predicted against measured, from a run's files

summary() {
  python3 - "$1" <<'EOF'
import csv, json, os, statistics, sys

out = sys.argv[1]
lines = ["# parasol on the lent GPU: predicted against measured", ""]

def rows(name):
    path = os.path.join(out, name)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return list(csv.DictReader(f))

def errs(pairs):
    e = [abs(p / m - 1) for p, m in pairs if p > 0 and m > 0]
    if not e:
        return "-", "-", "-", 0
    within = sum(x <= 0.10 for x in e) / len(e)
    return f"{100 * statistics.median(e):.1f}%", f"{100 * within:.0f}%", f"{100 * max(e):.0f}%", len(e)

# Per operator shard, measured again against each prediction.
cmp = rows("compare.csv")
if cmp:
    lines += ["## Operator shards (fp16): a fresh measurement against the predictions", "",
              "| model | prediction | shards | median error | within 10% | worst |",
              "| --- | --- | ---: | ---: | ---: | ---: |"]
    for model in sorted({r["model"] for r in cmp}):
        rs = [r for r in cmp if r["model"] == model]
        for col, what in (("profile_s", "profile database"),
                          ("interpolated_loo_s", "interpolation, own entry left out"),
                          ("roofline_s", "roofline, default"),
                          ("roofline_calibrated_s", "roofline, calibrated")):
            med, within, worst, n = errs([(float(r[col]), float(r["measured_s"])) for r in rs])
            if n:
                lines.append(f"| {model} | {what} | {n} | {med} | {within} | {worst} |")
    lines.append("")

# Per task of the executed plans.
tasks = rows("validate-tasks.csv")
if tasks:
    lines += ["## Compute tasks of single-GPU plans (fp32, executor): predicted with the "
              "profile database against measured", "",
              "| model | tasks | median error | within 10% | worst |",
              "| --- | ---: | ---: | ---: | ---: |"]
    for model in sorted({r["model"] for r in tasks}):
        pairs = []
        for r in tasks:
            if r["model"] != model or r["kind"] != "compute":
                continue
            try:
                p = float(r["predicted_end_s"]) - float(r["predicted_start_s"])
                m = float(r["measured_end_s"]) - float(r["measured_start_s"])
            except (KeyError, ValueError):
                continue
            pairs.append((p, m))
        med, within, worst, n = errs(pairs)
        lines.append(f"| {model} | {n} | {med} | {within} | {worst} |")
    lines.append("")

val = rows("validate.csv")
if val:
    lines += ["## Iterations of single-GPU plans (fp32)", "",
              "| model | predicted, profile | predicted, roofline | measured | error, profile | error, roofline |",
              "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in val:
        if r["class"] != "iteration":
            continue
        p, m = float(r["predicted_s"]), float(r["measured_s"])
        rf = float(r.get("roofline_s") or 0)
        er = f"{100 * (rf / m - 1):+.1f}%" if rf > 0 and m > 0 else "-"
        lines.append(f"| {r['model']} | {1e3 * p:.2f} ms | {1e3 * rf:.2f} ms | {1e3 * m:.2f} ms | "
                     f"{100 * (p / m - 1):+.1f}% | {er} |")
    lines.append("")

db = os.path.join(out, "h200-profile.json")
if os.path.exists(db):
    with open(db) as f:
        d = json.load(f)
    for gpu, notes in d.get("devices", {}).items():
        lines.append(f"Device {gpu}: " + ", ".join(f"{k} {v}" for k, v in sorted(notes.items())))
    lines.append(f"Profile database: {len(d.get('ops', []))} operator entries.")
text = "\n".join(lines) + "\n"
with open(os.path.join(out, "summary.md"), "w") as f:
    f.write(text)
print(text)
EOF
}

# ---------------------------------------------------------------------------------------
# run: on the GPU machine

start=$SECONDS
budget=${PARASOL_DEVICE_BUDGET:-540}

# Runs a step unless the time is spent: its output goes to the log, or its standard
# output to the file that STEP_OUT names.
step() {
  local limit=$1 name=$2
  shift 2
  local left=$((budget - (SECONDS - start)))
  if [ "$left" -le 20 ]; then
    echo "== $name: skipped, $((SECONDS - start)) s spent" | tee -a "$log"
    return 1
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name (at $((SECONDS - start)) s, limit $limit s)" | tee -a "$log"
  timeout -k 10 "$limit" "$@" >>"${STEP_OUT:-$log}" 2>>"$log"
  local rc=$?
  [ $rc -ne 0 ] && echo "== $name: exit status $rc" | tee -a "$log"
  return $rc
}

run() {
  out=${OUT:-$here/device-out}
  mkdir -p "$out"
  log="$out/device-check.log"
  work=$(mktemp -d)
  : >"$log"
  [ -x "$pack/bin/parasol" ] || die "no $pack/bin/parasol: run 'exec/device-check.sh prepare' on the build machine and copy .device/ here"
  libs="$pack/lib"
  for d in /opt/torch/.venv/lib/python3*/site-packages/nvidia/*/lib \
           /usr/local/lib/python3*/dist-packages/nvidia/*/lib /usr/local/cuda/lib64; do
    [ -d "$d" ] && libs="$libs:$d"
  done
  # Only the carried programs see the carried libraries: the machine's own tools keep
  # theirs.
  libs="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  P=(env "LD_LIBRARY_PATH=$libs" "$pack/bin/parasol")
  {
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
    nvcc --version 2>/dev/null | tail -1
    ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/*/ 2>/dev/null
  } >>"$log" 2>&1
  if ! "${P[@]}" --version >>"$log" 2>&1; then
    env "LD_LIBRARY_PATH=$libs" ldd "$pack/bin/parasol" >>"$log" 2>&1
    cp "$log" "$out/" 2>/dev/null
    die "the carried parasol does not start here (see ldd in $log)"
  fi

  # 1. The gpu test suite.
  # Criterion's child processes are refused in some sandboxes ("Could not spawn test
  # instance"): then the same tests run in one process.
  if ! step 200 "gpu tests" env "LD_LIBRARY_PATH=$libs" "$pack/bin/test-gpu" --jobs 1 --verbose &&
    grep -q "Could not spawn test instance" "$log"; then
    step 200 "gpu tests, in one process" env "LD_LIBRARY_PATH=$libs" "$pack/bin/test-gpu-inproc"
  fi

  # 2. Profiles: fp16 as models train, and fp32 for the plans the executor runs.
  db="$work/h200-profile.json"
  common=(--backend cuda --gpu h200 -o "$db" --merge --warmup 3 --repetitions 15)
  step 150 "profile gpt (fp16, 1 GPU)" "${P[@]}" profile ops -m gpt --precision fp16 -x h200-1 "${common[@]}" --update
  step 150 "profile resnet-50 (fp16, 1 GPU)" "${P[@]}" profile ops -m resnet-50 --precision fp16 -x h200-1 "${common[@]}" --update
  step 150 "profile bert-base (fp16, 1 GPU)" "${P[@]}" profile ops -m bert-base --precision fp16 -x h200-1 "${common[@]}" --update
  step 120 "profile gpt shards (fp16, 8 GPUs)" "${P[@]}" profile ops -m gpt --precision fp16 -x h200 --max-shapes 240 "${common[@]}" --repetitions 7
  v_gpt=(-m gpt)
  v_resnet=(-m resnet-50 -p batch=32)
  v_bert=(-m bert-base -p batch=16)
  step 120 "profile gpt (fp32, validate)" "${P[@]}" profile ops "${v_gpt[@]}" --precision fp32 -x h200-1 "${common[@]}" --update
  step 120 "profile resnet-50 (fp32, validate)" "${P[@]}" profile ops "${v_resnet[@]}" --precision fp32 -x h200-1 "${common[@]}" --update
  step 120 "profile bert-base (fp32, validate)" "${P[@]}" profile ops "${v_bert[@]}" --precision fp32 -x h200-1 "${common[@]}" --update
  [ -f "$db" ] && cp "$db" "$out/h200-profile.json"

  # 3. Every fp16 shard measured again against the predictions.
  echo "model,op,pass,key,measured_s,profile_s,profile_lookup,interpolated_loo_s,roofline_s,roofline_calibrated_s" >"$out/compare.csv"
  for m in gpt resnet-50 bert-base; do
    if step 90 "compare $m" "${P[@]}" profile compare -m "$m" --precision fp16 -x h200-1 \
        --backend cuda --gpu h200 --db "$db" --csv "$work/compare-$m.csv" --repetitions 15; then
      tail -n +2 "$work/compare-$m.csv" | sed "s/^/$m,/" >>"$out/compare.csv"
    fi
  done

  # GFLOP/s and GB/s of every fp16 shard of gpt, one GPU.
  step 60 "perf gpt (fp16)" "${P[@]}" profile perf -m gpt --precision fp16 -x h200-1 \
    --backend cuda --gpu h200 --spec h200-1 --budget-ms 40 --csv "$out/perf.csv"

  # 4. The roofline fitted to the database.
  STEP_OUT="$out/calibrate.txt" step 60 "calibrate" "${P[@]}" profile calibrate --db "$db" --gpu h200 \
    --machine h200-1 --worst 15

  # 5. Single-GPU plans executed against their predictions.
  echo "model,class,predicted_s,measured_s,roofline_s" >"$out/validate.csv"
  first=1
  for name in gpt resnet bert; do
    case $name in
      gpt) args=("${v_gpt[@]}") ;;
      resnet) args=("${v_resnet[@]}") ;;
      bert) args=("${v_bert[@]}") ;;
    esac
    STEP_OUT="$work/simulate-$name.json" step 30 "simulate $name (roofline)" "${P[@]}" simulate \
      "${args[@]}" -x h200-1 --precision fp32 --json
    roof=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["iteration_time_s"])' \
      "$work/simulate-$name.json" 2>/dev/null)
    if step 150 "validate $name" "${P[@]}" validate "${args[@]}" -x h200-1 --precision fp32 \
        --profile "$db" --profile-gpu h200 --backend cuda --steps 3 -o "$work/validate-$name"; then
      tail -n +2 "$work/validate-$name.csv" |
        awk -F, -v m="$name" -v r="${roof:-0}" '{ print m "," $0 "," ($1 == "iteration" ? r : "") }' >>"$out/validate.csv"
      if [ $first = 1 ]; then
        head -1 "$work/validate-$name-tasks.csv" | sed 's/^/model,/' >"$out/validate-tasks.csv"
        first=0
      fi
      tail -n +2 "$work/validate-$name-tasks.csv" | sed "s/^/$name,/" >>"$out/validate-tasks.csv"
    fi
  done

  # 6. Training iterations in mixed precision (resnet-50 at 64 images, bert-base at 16
  # sequences of 512), executed, against the analytic model alone (no profile) with the
  # executor's calibration (data/calibration/parasol-cuda-h200.json, fitted by
  # experiments/check-kernels on half of an earlier H200 profile).
  echo "model,class,predicted_s,measured_s" >"$out/iterations.csv"
  for name in resnet bert; do
    case $name in
      resnet) args=(-m resnet-50 -p batch=64) ;;
      bert) args=(-m bert-base -p batch=16) ;;
    esac
    if step 150 "iteration $name (fp16, analytic)" "${P[@]}" validate "${args[@]}" -x h200-1 \
        --precision mixed-fp16 --attention fused --calibration "$here/data/calibration/parasol-cuda-h200.json" \
        --backend cuda --steps 3 -o "$work/iteration-$name"; then
      tail -n +2 "$work/iteration-$name.csv" | cut -d, -f1-3 | sed "s/^/$name,/" >>"$out/iterations.csv"
    fi
  done

  # 7. What it all says.
  echo "== done in $((SECONDS - start)) s" | tee -a "$log"
  summary "$out" | tee -a "$log"
  rm -rf "$work"
}

case ${1:-} in
  prepare) prepare ;;
  run) run ;;
  summary) summary "${2:?usage: device-check.sh summary DIR}" ;;
  *)
    sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 2
    ;;
esac
