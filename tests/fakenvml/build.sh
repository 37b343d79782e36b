#!/usr/bin/env bash
# Builds the stand-in NVML: tests/fakenvml/build.sh OUTDIR [--without-memory-v2] -> OUTDIR/libnvidia-ml.so.1
#
# --without-memory-v2: the library lacks nvmlDeviceGetMemoryInfo_v2 (the symbol
# is not there at all), as drivers before 510 lack it; use its own OUTDIR.
#
# Compiles against the official nvml.h shipped by the nvidia-nvml-dev wheel
# (found through the `nvidia` Python package of ${PYTHON:-python3}) and links
# Debian's cJSON (apt-get install libcjson-dev). Rebuilds only when a source,
# this script or the header is newer than the library. Safe to run
# concurrently: the library is written to a temporary name and renamed.
set -euo pipefail

defines=()
if [[ $# -eq 2 && "$2" == "--without-memory-v2" ]]; then
    defines+=(-DFK_WITHOUT_MEMORY_V2)
elif [[ $# -ne 1 ]]; then
    echo "usage: $0 OUTDIR [--without-memory-v2]" >&2
    exit 2
fi

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
outdir="$1"
mkdir -p "$outdir"
outdir="$(cd "$outdir" && pwd)"
lib="$outdir/libnvidia-ml.so.1"
python="${PYTHON:-python3}"
cc="${CC:-cc}"

nvml_h="$("$python" - <<'EOF'
import importlib.util, pathlib, sys
found = []
try:
    spec = importlib.util.find_spec("nvidia")
except ImportError:
    spec = None
for root in (spec.submodule_search_locations or []) if spec else []:
    found += sorted(pathlib.Path(root).glob("*/include/nvml.h"))
if not found:
    sys.exit("nvml.h not found: install the nvidia-nvml-dev package (pip) in this Python")
print(found[-1])
EOF
)"

if [[ ! -f /usr/include/cjson/cJSON.h ]]; then
    echo "cJSON headers missing: apt-get install -y libcjson-dev" >&2
    exit 1
fi

sources=("$here/api.c" "$here/config.c" "$here/counts.c" "$here/node.c" "$here/tools.c" "$here/topo.c" "$here/health.c")
inputs=("${sources[@]}" "$here/fakenvml.h" "${BASH_SOURCE[0]}" "$nvml_h")

if [[ -f "$lib" ]]; then
    stale=0
    for f in "${inputs[@]}"; do
        if [[ "$f" -nt "$lib" ]]; then
            stale=1
            break
        fi
    done
    if [[ $stale -eq 0 ]]; then
        exit 0
    fi
fi

work="$(mktemp -d "$outdir/.fakenvml-build.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# Names the library accepts for faults, brands and architectures, taken from
# the header itself so that every constant it defines is known.
grep -oE '^[[:space:]]*NVML_ERROR_[A-Z0-9_]+[[:space:]]*=' "$nvml_h" \
    | sed -E 's/^[[:space:]]*NVML_ERROR_([A-Z0-9_]+).*/FK_ERR(\1)/' >"$work/fakenvml_errors.inc"
grep -oE '^[[:space:]]*NVML_BRAND_[A-Z0-9_]+[[:space:]]*=' "$nvml_h" \
    | sed -E 's/^[[:space:]]*NVML_BRAND_([A-Z0-9_]+).*/FK_BRAND(\1)/' | grep -v 'FK_BRAND(COUNT)' \
    >"$work/fakenvml_brands.inc"
grep -oE '^#define NVML_DEVICE_ARCH_[A-Z0-9_]+[[:space:]]' "$nvml_h" \
    | sed -E 's/^#define NVML_DEVICE_ARCH_([A-Z0-9_]+).*/FK_ARCH(\1)/' >"$work/fakenvml_archs.inc"

"$cc" -std=gnu11 -O2 -Wall -Wextra -Werror -fPIC -shared -fvisibility=hidden ${defines[@]+"${defines[@]}"} \
    -I "$(dirname "$nvml_h")" -I "$work" -I "$here" \
    -Wl,-soname,libnvidia-ml.so.1 -Wl,-z,defs \
    -o "$work/libnvidia-ml.so.1" "${sources[@]}" -lcjson -lm -lpthread

mv -f "$work/libnvidia-ml.so.1" "$lib"
