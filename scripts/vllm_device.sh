#!/usr/bin/env bash
# Real vLLM 0.26 on one H200 under profkit: the captures of sample_traces/vllm-0.26-h200/ and the
# overhead benchmark (benchmarks/vllm_overhead.py). Runs on the lent GPU machine from the repo root.
#
# Here, once: bash ../shared/device/vllm/build-bundle.sh (-> .vllm-bundle/), ../shared/device/fetch-nsys-libs.sh
# (-> .nsys-libs/), and the cp312 wheels of nvtx and orjson in .whl/ (see the device tool's README).
# The tracked sample_traces/ (40+ MB) does not fit beside the bundle: move it out for the call.
#     device run, carry [".vllm-bundle", ".nsys-libs", ".whl"], command: MODE=captures bash scripts/vllm_device.sh
# MODE=captures writes one tarball per capture into $OUT (each <= 15 MiB):
#     torch_clean, torch_faults   profkit capture --torch --steps $A:$B (torch.profiler in the worker)
#     nsys_clean, nsys_faults     profkit capture --nsys --steps $A:$B (Nsight Systems, SQLite export)
#     native_clean, native_faults vLLM's own torch profiler (profiler_config), no profkit at all
# faults: a real gc.collect() over a large heap inside Scheduler.update_from_output every 5th step and
# a sleep inside Scheduler.schedule every 7th (scripts/vllm_workload.py), with their measured truth.
# MODE=overhead runs benchmarks/vllm_overhead.py (plain vs profkit capture, alternating).
set -x
OUT=${OUT:-/tmp/vllm-device-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/device.log") 2>&1
REPO=$PWD
export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}   # profkit from the checkout, in every process
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
python3 -c 'import nvtx, orjson; print("nvtx", nvtx.__version__ if hasattr(nvtx, "__version__") else "?", "orjson", orjson.__version__)' \
  || echo "WARNING: nvtx/orjson missing"
NSYS=${NSYS:-/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys}
export PROFKIT_NSYS=$NSYS
if ls .nsys-libs/*.deb >/dev/null 2>&1; then
  mkdir -p /tmp/dw && for f in .nsys-libs/*.deb; do dpkg -x "$f" /tmp/dw; done
  export LD_LIBRARY_PATH=/tmp/dw/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
fi
nvidia-smi -L || true
RUN=(bash .vllm-bundle/run-on-device.sh)
"${RUN[@]}"   # unpack + check_env once

PROMPTS=${PROMPTS:-64}
TOKENS=${TOKENS:-400}
A=${A:-170}
B=${B:-230}
FAULTS=(--fault "gc:every=5,ms=${GC_MS:-40},start=${FAULT_START:-120}"
        --fault "sleep:every=7,ms=${SLEEP_MS:-30},start=${FAULT_START:-120}")
WORK=/tmp/vllm-work
LIMIT=$((15 * 1024 * 1024))
FAILED=0
rm -rf "$WORK"; mkdir -p "$WORK"

pack() {  # pack NAME: $WORK/NAME -> $OUT/NAME.tar.gz (the .nsys-rep only when it fits)
  local name=$1
  tar -C "$WORK" -czf "$OUT/$name.tar.gz" "$name"
  if [ "$(stat -c %s "$OUT/$name.tar.gz")" -gt "$LIMIT" ]; then
    echo "$name: over 15 MiB with the .nsys-rep; packing without it"
    tar -C "$WORK" -czf "$OUT/$name.tar.gz" --exclude='*.nsys-rep' "$name"
  fi
  ls -la "$OUT/$name.tar.gz"
}

wanted() {  # ONLY="torch_clean native_clean" runs just those
  [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]]
}

capture() {  # capture NAME [profkit capture flags] -- [workload args]
  local name=$1; shift
  wanted "$name" || return 0
  local dir=$WORK/$name flags=()
  while [ "$1" != "--" ]; do flags+=("$1"); shift; done; shift
  if [ "$SECONDS" -gt "${TIME_LEFT_S:-480}" ]; then echo "SKIPPED: $name (${SECONDS} s used)"; return; fi
  mkdir -p "$dir/truth"
  local t0=$SECONDS
  VLLM_WORKLOAD_TRUTH_DIR=$dir/truth timeout 200 "${RUN[@]}" python3 -m profkit.cli.capture -o "$dir" "${flags[@]}" -- \
    python3 scripts/vllm_workload.py --prompts "$PROMPTS" --max-tokens "$TOKENS" --timings "$dir/truth/workload.timings.json" "$@" \
    || { echo "FAILED: $name"; FAILED=$((FAILED + 1)); }
  echo "$name took $((SECONDS - t0)) s"
  find "$dir" -maxdepth 2 | head -30
  pack "$name"
}

native() {  # native NAME [workload args]: vLLM's own torch profiler, no profkit
  local name=$1; shift
  wanted "$name" || return 0
  local dir=$WORK/$name
  if [ "$SECONDS" -gt "${TIME_LEFT_S:-480}" ]; then echo "SKIPPED: $name (${SECONDS} s used)"; return; fi
  mkdir -p "$dir/truth"
  local t0=$SECONDS
  VLLM_WORKLOAD_TRUTH_DIR=$dir/truth timeout 200 "${RUN[@]}" python3 scripts/vllm_workload.py \
    --prompts "$PROMPTS" --max-tokens "$TOKENS" --timings "$dir/truth/workload.timings.json" \
    --native-profile "$dir/trace" --native-steps "${NATIVE_STEPS:-150:210}" "$@" \
    || { echo "FAILED: $name"; FAILED=$((FAILED + 1)); }
  echo "$name took $((SECONDS - t0)) s"
  find "$dir" | head -20
  pack "$name"
}

case "${MODE:-captures}" in
  captures)
    capture torch_clean --torch --steps "$A:$B" --
    capture torch_faults --torch --steps "$A:$B" -- "${FAULTS[@]}"
    capture nsys_faults --nsys --steps "$A:$B" -- "${FAULTS[@]}"
    capture nsys_clean --nsys --steps "$A:$B" --
    native native_faults "${FAULTS[@]}"
    native native_clean
    ;;
  overhead)
    "${RUN[@]}" python3 benchmarks/vllm_overhead.py --out "$OUT/vllm_overhead.json" ${OVERHEAD_ARGS:-} \
      || FAILED=$((FAILED + 1))
    ;;
esac
ls -la "$OUT"
echo "failed: $FAILED; ${SECONDS} s"
exit "$FAILED"
