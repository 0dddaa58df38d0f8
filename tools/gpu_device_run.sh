#!/usr/bin/env bash
# edged's device check and GPU benchmarks on an offline GPU host, in ONE command of ~5 minutes
# (docs/gpu-device-run.md says how it is called). Run from the repository root, with the two
# files tools/gpu_kit.sh made carried to .cache/gpukit/:
#   bash tools/gpu_device_run.sh
# Steps, each bounded and each run even when an earlier one failed:
#   1. tools/gpu_selftest.py --require-gpu   every GPU path, the daemon end to end (~2 min)
#   2. python -m tools.bench gpu             the GPU benchmarks (~2 min)
#   3. pytest tests/gpu                      the hardware tests (the check itself not again)
#   4. tools/gpu_check/results.py            gpu-results.json + summary.md
# Into $OUT (at most 8 files come back): run.log, selftest.json, edged-e2e.log, gpu.json,
# pytest-gpu.txt, gpu-results.json, summary.md. Exit status: the self-test's.
# DRY_RUN=1 (a machine without a GPU, to try all of this first): the Python environment at
# hand instead of the kit's (PY, default .venv/bin/python), no --require-gpu; the carried
# mosquitto and PP-OCR model are still what the steps use. STEPS=selftest,bench,pytest picks
# steps (a rerun of one part). UNPACK_ONLY=1 unpacks the kit and stops. A kit carried in two
# halves (gpu_kit.sh splits it when the tree and the kit do not fit one call): the call with
# the first half stores it under /tmp and stops; the call with the second runs
# (docs/gpu-device-run.md).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 2
KIT=${KIT:-.cache/gpukit}
OUT=${OUT:-/tmp/edged-gpu-out}
SITE=${SITE:-/tmp/edged-gpu-site}
EXTRAS=$SITE-extras
mkdir -p "$OUT" "$SITE" "$EXTRAS"
exec > >(tee "$OUT/run.log") 2>&1
T0=$(date +%s)
log() { echo "== [$(( $(date +%s) - T0 ))s] $*"; }

unpack() {  # archive folder: tar's xz, else Python's (an image without xz)
    tar -C "$2" -xJf "$1" 2>/dev/null || python3 -c \
        'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$1" "$2"
}
DRY=${DRY_RUN:-0}
PY=${PY:-python3}
REQUIRE=--require-gpu
if [ "$DRY" = 1 ]; then
    PY=${PY/#python3/$ROOT/.venv/bin/python}
    REQUIRE=
    log "DRY RUN with $PY: no kit, no --require-gpu"
fi
STEPS=",${STEPS:-selftest,bench,pytest},"
if [ "$DRY" != 1 ]; then
    log "unpack the kit into $SITE"
    if [ ! -f "$SITE/.unpacked" ]; then
        archive="$KIT/edged-gpukit-site.tar.xz"
        if [ ! -f "$archive" ]; then
            # The kit in two halves (tools/gpu_kit.sh splits it when the tree and the kit do
            # not fit one call): each call stores the half it carried under /tmp, which stays
            # on the warm machine; the call that has both joins them.
            PARTS=${PARTS:-/tmp/edged-gpu-parts}
            mkdir -p "$PARTS"
            for part in "$KIT"/edged-gpukit-site.tar.xz.part*; do
                [ -f "$part" ] && cp "$part" "$PARTS/"
            done
            if [ ! -f "$PARTS/edged-gpukit-site.tar.xz.part0" ] ||
                    [ ! -f "$PARTS/edged-gpukit-site.tar.xz.part1" ]; then
                log "half of the kit stored in $PARTS: call again with the other half"
                exit 0
            fi
            cat "$PARTS"/edged-gpukit-site.tar.xz.part0 "$PARTS"/edged-gpukit-site.tar.xz.part1 \
                > "$PARTS/edged-gpukit-site.tar.xz"
            archive="$PARTS/edged-gpukit-site.tar.xz"
        fi
        unpack "$archive" "$SITE" || { echo "unpacking the kit failed"; exit 2; }
        touch "$SITE/.unpacked"
    fi
    export PYTHONPATH="$SITE:$ROOT"
else
    export PYTHONPATH="$ROOT"
fi
if [ "${UNPACK_ONLY:-0}" = 1 ]; then log "unpacked; the next call runs the steps"; exit 0; fi
[ -f "$KIT/edged-gpu-extras.tar.xz" ] ||
    { echo "$KIT/edged-gpu-extras.tar.xz is missing: carry it (docs/gpu-device-run.md)"; exit 2; }
log "unpack the extras into $EXTRAS"
unpack "$KIT/edged-gpu-extras.tar.xz" "$EXTRAS" || { echo "unpacking the extras failed"; exit 2; }
export PATH="$EXTRAS/bin:$PATH" EDGED_PPOCR_DIR="$EXTRAS/ppocr"
EDGED_COMMIT=$(cat "$EXTRAS/commit.txt" 2>/dev/null || echo unknown)
export PYTHONUNBUFFERED=1 EDGED_COMMIT
# onnxruntime-gpu's CUDA EP links libcudart/libcublas(Lt).so.13 and libcurand.so.10 and
# dlopens libcudnn.so.9 and libcufft.so.12: the image's CUDA 13 wheels hold them, but nothing
# puts them on the loader's path without this.
NV=$("$PY" -c 'import nvidia; print(list(nvidia.__path__)[0])' 2>/dev/null)
CU="$NV/cu13/lib"; DNN="$NV/cudnn/lib"
if [ "$DRY" != 1 ] && { [ ! -e "$CU/libcudart.so.13" ] || [ ! -e "$DNN/libcudnn.so.9" ]; }; then
    CU=$(dirname "$(find /opt /usr -name 'libcublasLt.so.13*' 2>/dev/null | head -1)")
    DNN=$(dirname "$(find /opt /usr -name 'libcudnn.so.9*' 2>/dev/null | head -1)")
fi
export LD_LIBRARY_PATH="$CU:$DNN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

log "env (commit $EDGED_COMMIT)"
echo "CUDA 13 libraries: $CU; cuDNN 9: $DNN"
echo /dev/nvidia*  # tests/conftest.py skips @gpu tests without /dev/nvidia[0-9]
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv 2>&1
command -v mosquitto; mosquitto -h 2>&1 | head -1
"$PY" - <<'PY' 2>&1
import importlib.metadata as md
import onnxruntime as ort
print("onnxruntime", ort.__version__, "from", ort.__file__, ort.get_available_providers())
for d in ("onnxruntime-gpu", "cuda-bindings", "nvidia-ml-py", "nvidia-cudnn-cu13", "numpy",
          "onnx", "opencv-python-headless", "paho-mqtt", "uvloop", "pytest"):
    try:
        print(" ", d, md.version(d))
    except md.PackageNotFoundError:
        print(" ", d, "absent")
PY

selftest=0
if [[ $STEPS == *,selftest,* ]]; then
    log "1. tools/gpu_selftest.py $REQUIRE"
    # shellcheck disable=SC2086  # $REQUIRE is one flag or none
    timeout -k 10 230 "$PY" tools/gpu_selftest.py $REQUIRE --quick --out "$OUT/selftest.json" \
        --daemon-log "$OUT/edged-e2e.log"
    selftest=$?
    echo "rc=$selftest"
fi
if [[ $STEPS == *,bench,* ]]; then
    log "2. python -m tools.bench gpu"
    timeout -k 10 220 "$PY" -m tools.bench gpu --out "$OUT"
    echo "rc=$?"
fi
if [[ $STEPS == *,pytest,* ]]; then
    log "3. pytest tests/gpu"
    # The kit has no pytest-xdist or pytest-cov: the project's addopts (-n auto) are replaced.
    PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 timeout -k 10 80 "$PY" -m pytest -p pytest_timeout \
        -o addopts="--strict-markers -ra" \
        -p no:cacheprovider -q -rs tests/gpu --deselect \
        tests/gpu/test_device_check_gpu.py::test_device_check_when_gpu_present_every_gpu_section_passes \
        > "$OUT/pytest-gpu.txt" 2>&1
    echo "rc=$?"; tail -15 "$OUT/pytest-gpu.txt"
fi

log "4. results"
"$PY" tools/gpu_check/results.py "$OUT" > /dev/null
echo "rc=$?"; head -4 "$OUT/summary.md"
grep -E "\| FAIL \|" "$OUT/summary.md" | cut -c1-300
log "done: $(cd "$OUT" && echo *)"
exit "$selftest"
