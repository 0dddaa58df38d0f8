#!/usr/bin/env bash
# Prepare, on a machine with PyPI and Debian's archive, what tools/gpu_device_run.sh needs on
# the offline GPU host, in .cache/gpukit/ (git-ignored), and check that one device call can
# carry it (the tree that travels + the kit <= 64 MiB):
#   edged-gpukit-site.tar.xz  onnxruntime-gpu 1.31.1 (sm_90 kernels only) and edged's pure
#                             dependencies the host lacks: ../shared/gpukit/build_kit.sh, as is
#   edged-gpu-extras.tar.xz   mosquitto 2.0 built from Debian's source with nothing beyond
#                             glibc >= 2.34 (the host has no broker), PP-OCR cls (from the
#                             rapidocr-onnxruntime wheel), and the commit being checked
# Usage: bash tools/gpu_kit.sh        (GPUKIT=path/to/shared/gpukit if not at ../shared/gpukit;
#        REBUILD=1 rebuilds the ORT kit; the extras are rebuilt every time, mosquitto kept)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
KIT=.cache/gpukit
GPUKIT=${GPUKIT:-$ROOT/../shared/gpukit}
LIMIT=$((64 << 20))
mkdir -p "$KIT/extras/bin" "$KIT/extras/ppocr"

if [ ! -f "$KIT/edged-gpukit-site.tar.xz" ] || [ "${REBUILD:-0}" = 1 ]; then
    [ -f "$GPUKIT/build_kit.sh" ] || { echo "no $GPUKIT/build_kit.sh: set GPUKIT"; exit 2; }
    bash "$GPUKIT/build_kit.sh" "$KIT"
    rm -f "$KIT/device_check.sh" "$KIT/ort_paths.py"  # the shared first draft; not carried
fi

build_mosquitto() {  # Debian's source, without TLS, websockets, systemd, libwrap, DLT, cJSON
    local work codename
    work=$(mktemp -d)
    # shellcheck disable=SC1091  # the running system's
    codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
    mkdir -p "$work/parts" "$work/lists/partial" "$work/cache/archives/partial"
    printf 'Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: %s\nComponents: main\n' \
        "$codename" > "$work/parts/src.sources"
    local apt=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$work/parts"
               -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache"
               -o Debug::NoLocking=1 -o APT::Sandbox::User=root)
    apt-get "${apt[@]}" -qq update
    (cd "$work" && apt-get "${apt[@]}" -qq source --download-only mosquitto)
    tar -C "$work" -xzf "$work"/mosquitto_*.orig.tar.gz
    nice make -s -C "$work"/mosquitto-*/src -j2 WITH_TLS=no WITH_TLS_PSK=no WITH_CJSON=no \
        WITH_DOCS=no WITH_WEBSOCKETS=no WITH_SYSTEMD=no WITH_WRAP=no WITH_DLT=no WITH_SRV=no \
        WITH_EC=no WITH_STATIC_LIBRARIES=no WITH_SHARED_LIBRARIES=no >"$work/build.log" 2>&1 ||
        { tail -30 "$work/build.log"; exit 2; }
    strip -o "$KIT/extras/bin/mosquitto" "$work"/mosquitto-*/src/mosquitto
    rm -rf "$work"
}
[ -x "$KIT/extras/bin/mosquitto" ] || build_mosquitto
if ldd "$KIT/extras/bin/mosquitto" | grep -vE 'linux-vdso|libc\.so|libm\.so|ld-linux' | grep -q .; then
    echo "mosquitto links more than glibc:"; ldd "$KIT/extras/bin/mosquitto"; exit 2
fi

PY=${PYTHON:-$ROOT/.venv/bin/python}
cls=$("$PY" -c 'from tools.bench.assets import PPOCR_CLS, ppocr_model; print(ppocr_model(PPOCR_CLS))')
cp "$cls" "$KIT/extras/ppocr/"
dirty=$(git status --porcelain --untracked-files=no | wc -l)
echo "$(git rev-parse HEAD)$([ "$dirty" = 0 ] || echo "+$dirty-changed-files")" > "$KIT/extras/commit.txt"
tar -C "$KIT/extras" --owner=0 --group=0 --sort=name -cJf "$KIT/edged-gpu-extras.tar.xz" .

# What one device call sends: tracked and untracked-not-ignored files, shared/ if the checkout
# has one, and the carried kit.
tree=$( { git ls-files -z; git ls-files -z --others --exclude-standard; } |
        xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
shared=0
[ -d shared ] && shared=$(du -sb shared | cut -f1)
site=$(stat -c %s "$KIT/edged-gpukit-site.tar.xz")
extras=$(stat -c %s "$KIT/edged-gpu-extras.tar.xz")
total=$((tree + shared + site + extras))
printf '%-34s %12s B\n' "tree (tracked + untracked)" "$tree" "shared/" "$shared" \
    "edged-gpukit-site.tar.xz" "$site" "edged-gpu-extras.tar.xz" "$extras" \
    "total" "$total" "limit (64 MiB)" "$LIMIT" "left" "$((LIMIT - total))"
rm -f "$KIT"/edged-gpukit-site.tar.xz.part*
if [ "$total" -le "$LIMIT" ]; then
    cat <<EOT

Ready. The device call (docs/gpu-device-run.md):
  run(command="bash tools/gpu_device_run.sh",
      carry=["$KIT/edged-gpukit-site.tar.xz", "$KIT/edged-gpu-extras.tar.xz"], timeout_s=600)
EOT
    exit 0
fi
# Over one call: the kit in two halves, one per call on the same warm machine.
half=$(( (site + 1) / 2 ))
first=$((tree + shared + half))
second=$((tree + shared + site - half + extras))
printf '%-34s %12s B\n' "call 1 (tree + half the kit)" "$first" \
    "call 2 (tree + half + extras)" "$second"
if [ "$first" -gt "$LIMIT" ] || [ "$second" -gt "$LIMIT" ]; then
    echo "OVER even in two calls: the tree is too big (docs/gpu-device-run.md)"; exit 1
fi
split -b "$half" -d -a 1 "$KIT/edged-gpukit-site.tar.xz" "$KIT/edged-gpukit-site.tar.xz.part"
cat <<EOT

Ready, in two calls on the same warm machine, the second within 30 s of the first
(docs/gpu-device-run.md):
  run(command="bash tools/gpu_device_run.sh",
      carry=["$KIT/edged-gpukit-site.tar.xz.part0"], timeout_s=120)
  run(command="bash tools/gpu_device_run.sh",
      carry=["$KIT/edged-gpukit-site.tar.xz.part1", "$KIT/edged-gpu-extras.tar.xz"],
      timeout_s=600)
EOT
