#!/usr/bin/env bash
# The prepared check for a machine with a real NVIDIA GPU, run from the repository root:
#
#     PY=/path/to/python tests/gpu/gpu_check.sh
#
# Prints the GPU model and driver, one `gpu-agent once --source nvml --dry-run --output json`
# result (or the same through the Python API when the CLI cannot run), the per-tick NVML read
# time (median and p99 over 50 ticks), then runs `pytest -m gpu`. Needs no network: $PY must
# already have the project's dependencies (at least nvidia-ml-py; pytest for the last step).
# Every step runs even if an earlier one failed; the exit status is that of the pytest step.
set -u
PY=${PY:-python3}
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
cd "$(dirname "$0")/../.." || exit 2

echo "== machine"
uname -srm
"$PY" --version
if command -v nvidia-smi >/dev/null 2>&1; then
    timeout 30 nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total,mig.mode.current,temperature.gpu,utilization.gpu \
        --format=csv || true
else
    echo "nvidia-smi: not on PATH"
fi

echo "== gpu model through pynvml"
timeout 60 "$PY" - <<'PYEOF' || echo "pynvml probe failed (exit $?)"
import pynvml

pynvml.nvmlInit()
try:
    print("driver", pynvml.nvmlSystemGetDriverVersion(), "nvml", pynvml.nvmlSystemGetNVMLVersion())
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        try:
            mig = pynvml.nvmlDeviceGetMigMode(h)
        except pynvml.NVMLError as e:
            mig = f"n/a ({e})"
        print(f"gpu {i}: {pynvml.nvmlDeviceGetName(h)} mig={mig}")
finally:
    pynvml.nvmlShutdown()
PYEOF

echo "== gpu-agent once --source nvml --dry-run --output json"
timeout 120 "$PY" -m agent once --source nvml --dry-run --output json
cli_status=$?
if [ "$cli_status" -ne 0 ]; then
    echo "-- the CLI did not run (exit $cli_status); the same through the Python API:"
    timeout 60 "$PY" - <<'PYEOF' || echo "python API failed (exit $?)"
import json
from datetime import UTC, datetime

from agent.aggregate import aggregate
from agent.sources import open_source
from gpu_contract.schema import encode, merge_patch

source = open_source("nvml")
try:
    reading = source.read(datetime.now(UTC))
finally:
    source.close()
annotations = encode(aggregate(reading))
print(json.dumps({"annotations": annotations, "patch": merge_patch(annotations)}, indent=2))
for gpu in reading.gpus:
    print(gpu)
print("lost:", reading.lost, "fatal:", reading.fatal, "error kinds:", reading.error_kinds)
PYEOF
fi

echo "== per-tick NVML read time (NvmlSource.read, 50 ticks)"
timeout 120 "$PY" - <<'PYEOF' || echo "timing failed (exit $?)"
import statistics
import time
from datetime import UTC, datetime

from agent.nvml import NvmlSource


def summary(values_us):
    ordered = sorted(values_us)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return f"median {statistics.median(ordered):8.0f} us   p99 {p99:8.0f} us   max {ordered[-1]:8.0f} us"


source = NvmlSource.open()
try:
    first = source.read(datetime.now(UTC))  # the first tick reads the whole sample buffer
    walls, cpus = [], []
    for _ in range(50):
        time.sleep(0.1)  # let the driver add utilization samples between ticks, as in a daemon
        w, c = time.perf_counter(), time.process_time()
        reading = source.read(datetime.now(UTC))
        walls.append((time.perf_counter() - w) * 1e6)
        cpus.append((time.process_time() - c) * 1e6)
    print(f"gpus read: {len(reading.gpus)} of {reading.device_count}; lost {reading.lost}; fatal {reading.fatal}")
    print("wall per tick:", summary(walls))
    print("cpu  per tick:", summary(cpus))
    print("utilization per gpu (last tick):", [g.utilization for g in reading.gpus])
    print("error kinds (first tick, last tick):", first.error_kinds, reading.error_kinds)
finally:
    source.close()
PYEOF

echo "== where one tick's NVML time goes (cProfile over 20 ticks, top calls by own time)"
timeout 120 "$PY" - <<'PYEOF' || echo "profile failed (exit $?)"
import cProfile
import pstats
import time
from datetime import UTC, datetime

from agent.nvml import NvmlSource

source = NvmlSource.open()
try:
    source.read(datetime.now(UTC))
    profile = cProfile.Profile()
    for _ in range(20):
        time.sleep(0.1)
        profile.enable()
        source.read(datetime.now(UTC))
        profile.disable()
    pstats.Stats(profile).sort_stats("tottime").print_stats(8)
finally:
    source.close()
PYEOF

echo "== pytest -m gpu"
timeout 300 "$PY" -m pytest -m gpu tests/gpu -q -s -p no:cacheprovider
status=$?
echo "== done (pytest exit $status)"
exit $status
