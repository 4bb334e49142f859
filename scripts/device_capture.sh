#!/usr/bin/env bash
# Real 2-GPU captures of the bundled engine (profkit.engine) for sample_traces/ and accuracy tests.
#
# Run on a lent 2xH200 machine from the repo root (profkit is not pip-installed; cwd makes it
# importable), with .nsys-libs carried (../shared/device/fetch-nsys-libs.sh, once, here):
#     device run, kind nvidia-h200-x2, carry [".nsys-libs"], command: bash scripts/device_capture.sh
# Writes into $OUT (at most 8 files of <= 16 MiB come back), one tarball per capture:
#     torch_clean.tar.gz      torch.profiler, clean          trace/rank{r}.pt.trace.json.gz + truth + timings
#     torch_straggler.tar.gz  torch.profiler, rank 1 slow    (sleep + slow_schedule on rank 1)
#     nsys_clean.tar.gz       Nsight Systems SQLite (+ .nsys-rep when it fits) + truth + timings
#     nsys_straggler.tar.gz   Nsight Systems, rank 1 slow
#     torch_split.tar.gz      torch.profiler, --split-procs (engine core + worker per rank), rank 1 slow
#     capture.log             everything printed, sizes at the end
# Each capture: WARMUP warm-up steps, then a WINDOW-step profiler window on every rank.
# DEVICE=cpu runs the same captures on CPU (a dry run of this script; nsys then fails).
# One failed capture does not stop the others; the exit status is the number that failed.
#
# MODE=capture makes the same kind of captures through `profkit capture` instead (profkit spans in
# every rank plus torch.profiler or nsys, one step window on every rank, a manifest), for
# sample_traces/engine-dep2-h200-capture/:
#     pk_torch_clean.tar.gz   profkit capture --torch --steps A:B
#     pk_nsys_clean.tar.gz    profkit capture --nsys --steps A:B (nsys found by profkit itself)
#     pk_nsys_straggler.tar.gz  same, rank 1 sleeps 15 ms every 4th step (skipped if time is short)
# MODE=faults RANKS=4: the same through `profkit capture`, clean and with FAULTS (below), --torch
# and --nsys: pk_torch_clean, pk_torch_faults, pk_nsys_clean, pk_nsys_faults.
# Carry .whl (nvtx, orjson for Python 3.12) too: profkit's spans are NVTX ranges only with nvtx.
set -x
OUT=${OUT:-/tmp/profkit-capture}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/capture.log") 2>&1

export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
RANKS=${RANKS:-2}
WARMUP=${WARMUP:-10}
WINDOW=${WINDOW:-20}
STEPS=$((WARMUP + WINDOW + 2))
A=$WARMUP
B=$((WARMUP + WINDOW))
STRAGGLER=(--inject "sleep:rank=1,every=4,ms=15,start=$((A + 2))"
           --inject "slow_schedule:rank=1,every=4,ms=10,start=$((A + 4))")
# MODE=faults (DEP4 / DEP8, sample_traces/engine-dep4-h200-capture/): two ranks faulted differently,
# a real GC pause on rank 1 and a slow scheduler on rank 2, on interleaved steps.
FAULTS=(--inject "gc:rank=1,every=4,ms=20,start=$((A + 2))"
        --inject "slow_schedule:rank=2,every=4,ms=15,start=$((A + 4))")
ENGINE=(python3 -m profkit.engine --ranks "$RANKS" --steps "$STEPS" --device "${DEVICE:-cuda}" --seed 1)
WORK=/tmp/profkit-capture-work
rm -rf "$WORK"; mkdir -p "$WORK"
LIMIT=$((15 * 1024 * 1024))  # stay under the 16 MiB per returned file
FAILED=0

nvidia-smi -L || true
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.device_count(), "GPUs")'

# Nsight Systems: binary off PATH, and its importer needs libdw/libelf from the carried .debs.
NSYS=${NSYS:-/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys}
if ls .nsys-libs/*.deb >/dev/null 2>&1; then
  mkdir -p /tmp/dw && for f in .nsys-libs/*.deb; do dpkg -x "$f" /tmp/dw; done
  export LD_LIBRARY_PATH=/tmp/dw/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
else
  echo "WARNING: .nsys-libs not carried: nsys export to SQLite may fail (libdw.so.1 missing)"
fi

pack() {  # pack NAME DIR [optional big file]: tarball in $OUT, dropping the optional file if too big
  local name=$1 dir=$2 optional=${3:-}
  tar -C "$dir" -czf "$OUT/$name.tar.gz" --exclude="$(basename "${optional:-__none__}")" .
  if [ -n "$optional" ] && [ -f "$optional" ]; then
    tar -C "$dir" -czf "$WORK/$name.with.tar.gz" .
    if [ "$(stat -c %s "$WORK/$name.with.tar.gz")" -le "$LIMIT" ]; then
      mv "$WORK/$name.with.tar.gz" "$OUT/$name.tar.gz"
    else
      echo "$name: $(basename "$optional") left out (tarball over 15 MiB)"
    fi
  fi
  if [ "$(stat -c %s "$OUT/$name.tar.gz")" -gt "$LIMIT" ]; then
    echo "$name: tarball over 15 MiB; keeping only truth and timings"
    tar -C "$dir" -czf "$OUT/$name.tar.gz" --wildcards --exclude='*.sqlite' --exclude='*.nsys-rep' \
      --exclude='*.pt.trace.json.gz' .
  fi
}

torch_capture() {  # torch_capture NAME [engine args...]
  local name=$1; shift
  local dir=$WORK/$name
  mkdir -p "$dir"
  timeout 150 "${ENGINE[@]}" --out "$dir" --truth "$dir/truth.json" \
    --torch-profile "$dir/trace" --profile-steps "$A:$B" "$@" || { echo "FAILED: $name"; FAILED=$((FAILED + 1)); }
  pack "$name" "$dir"
}

nsys_capture() {  # nsys_capture NAME [engine args...]
  local name=$1; shift
  local dir=$WORK/$name
  mkdir -p "$dir"
  if [ ! -x "$NSYS" ]; then echo "FAILED: $name (no nsys at $NSYS)"; FAILED=$((FAILED + 1)); return; fi
  timeout 200 "$NSYS" profile -t cuda,nvtx,osrt --trace-fork-before-exec=true \
    --capture-range=cudaProfilerApi --capture-range-end=stop -o "$dir/$name" -f true \
    "${ENGINE[@]}" --out "$dir" --truth "$dir/truth.json" --cuda-profiler-steps "$A:$B" "$@" \
    || { echo "FAILED: $name (profile)"; FAILED=$((FAILED + 1)); }
  if [ -f "$dir/$name.nsys-rep" ]; then
    timeout 120 "$NSYS" export --type sqlite -o "$dir/$name.sqlite" -f true "$dir/$name.nsys-rep" \
      || { echo "FAILED: $name (export)"; FAILED=$((FAILED + 1)); }
  fi
  pack "$name" "$dir" "$dir/$name.nsys-rep"
}

pk_capture() {  # pk_capture NAME [profkit capture flags] -- [engine args]: profkit capture of the engine
  local name=$1; shift
  local dir=$WORK/$name flags=()
  while [ "$1" != "--" ]; do flags+=("$1"); shift; done; shift
  if [ "$SECONDS" -gt "${TIME_LEFT_S:-330}" ]; then echo "SKIPPED: $name (${SECONDS} s used)"; return; fi
  timeout 240 python3 -m profkit.cli.capture -o "$dir" "${flags[@]}" -- \
    "${ENGINE[@]}" --out "$dir/engine" --truth "$dir/engine/truth.json" "$@" \
    || { echo "FAILED: $name"; FAILED=$((FAILED + 1)); }
  ls -laR "$dir" | head -40
  pack "$name" "$dir" "$dir/nsys/report.nsys-rep"
}

if [ "${MODE:-engine}" = capture ] || [ "${MODE:-engine}" = faults ]; then
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  fi
  python3 -c 'import nvtx; print("nvtx", nvtx.enabled())' || echo "WARNING: no nvtx: profkit spans are not NVTX ranges"
fi
if [ "${MODE:-engine}" = faults ]; then
  pk_capture pk_torch_clean --torch --steps "$A:$B" --
  pk_capture pk_torch_faults --torch --steps "$A:$B" -- "${FAULTS[@]}"
  pk_capture pk_nsys_clean --nsys --steps "$A:$B" --
  pk_capture pk_nsys_faults --nsys --steps "$A:$B" -- "${FAULTS[@]}"
elif [ "${MODE:-engine}" = capture ]; then
  pk_capture pk_torch_clean --torch --steps "$A:$B" --
  pk_capture pk_nsys_clean --nsys --steps "$A:$B" --
  pk_capture pk_nsys_straggler --nsys --steps "$A:$B" -- --inject "sleep:rank=1,every=4,ms=15,start=$((A + 2))"
else
  torch_capture torch_clean
  torch_capture torch_straggler "${STRAGGLER[@]}"
  nsys_capture nsys_clean
  nsys_capture nsys_straggler "${STRAGGLER[@]}"
  [ -n "${SKIP_SPLIT:-}" ] || torch_capture torch_split --split-procs "${STRAGGLER[@]}"
fi

for d in "$WORK"/*/; do ls -la "$d" "$d"trace 2>/dev/null; done
ls -la "$OUT"
du -sh "$OUT"
echo "captures failed: $FAILED"
exit "$FAILED"
