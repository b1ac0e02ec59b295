#!/bin/bash
# Build the archive the device runs (real-sglang.sh, glm5-arch.sh) carry to the device machine: sglang
# 0.5.17 and the wheels its paths need beyond the device image (scripts/device/sglang-0.5.17-bundle.txt,
# pinned with sha256), installed flat with `uv pip install --target`, trimmed to what SM90 loads, and
# packed with xz into one file under the 64 MiB a device call carries.
#
# Usage: scripts/device/build-sglang-bundle.sh [OUT_DIR]     (default .cache/real-sglang/bundle)
# Needs: this checkout's .venv (uv, pip) and the network to PyPI (or pip's configured mirror).
# Output: OUT_DIR/sglang-site.tar.xz with site/ (PYTHONPATH for the server) and tools/ (pytest-testinfra)
#         OUT_DIR/SHA256SUMS, OUT_DIR/wheels.txt
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
REQS="$ROOT/scripts/device/sglang-0.5.17-bundle.txt"
OUT=$(realpath -m "${1:-$ROOT/.cache/real-sglang/bundle}")
STAGE="${SGLANG_BUNDLE_STAGE:-$ROOT/.cache/real-sglang}"
WHL="$STAGE/whl"
PY="$ROOT/.venv/bin/python"
UV="$ROOT/.venv/bin/uv"
[ -x "$UV" ] || { echo "build-sglang-bundle: no $UV (run scripts/setup first)" >&2; exit 2; }

# 1. The pinned wheels, each checked against its sha256 (already downloaded ones are re-checked).
mkdir -p "$WHL"
"$PY" -m pip download -q --no-deps --require-hashes --only-binary=:all: \
  --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
  --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_26_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64 \
  --platform any -d "$WHL" -r "$REQS" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }

# 2. Install flat (no venv: the device's /opt/torch/.venv provides torch, triton, numpy, ...).
BUILD=$(mktemp -d)
trap 'rm -rf "$BUILD"' EXIT
SITE="$BUILD/site"; TOOLS="$BUILD/tools"
wheels=(); tools=()
while read -r req _; do
  case "$req" in ''|'#'*) continue ;; esac
  name=${req%%==*}; version=${req#*==}
  file=$(ls "$WHL"/$(echo "$name" | tr - _)-"$version"-*.whl 2>/dev/null | head -1 || true)
  [ -n "$file" ] || { echo "build-sglang-bundle: no wheel for $req in $WHL" >&2; exit 1; }
  if [ "$name" = pytest-testinfra ]; then tools+=("$file"); else wheels+=("$file"); fi
done < "$REQS"
uv_install() {  # target, wheels...
  local target=$1; shift
  "$UV" pip install -q --target "$target" --python-version 3.12 --python-platform x86_64-manylinux_2_34 \
    --no-deps --no-compile --no-index "$@"
}
uv_install "$SITE" "${wheels[@]}"
uv_install "$TOOLS" "${tools[@]}"

# 3. Trim what SM90 never loads: sgl_kernel/sm100 (SM90 loads sgl_kernel/sm90/common_ops) and FA3's
#    flash_ops (1 GiB: the GLM-5 run avoids it with SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD=0).
#    flashmla_ops (14 MiB, sm_90/100 cubins) stays: GLM-5's DSA backends on SM90 are FlashMLA's.
cd "$SITE"
rm -rf sgl_kernel/flash_ops.abi3.so sgl_kernel/sm100 \
       sgl_kernel/infllm_ops.cpython-310-x86_64-linux-gnu.so
rm -rf xgrammar/lib xgrammar/include                                   # static lib + headers, not used at run time
rm -rf sglang/multimodal_gen \
       sglang/srt/server/_core.*.so sglang/srt/grpc/_core.*.so sglang/srt/multimodal/_core.*.so \
       sglang/kernels/ops/moe/trtllm_lora_temp/data
# Kept: flashinfer/data (the JIT sources: the first forward JIT-compiles RMSNorm with the device's nvcc)
# and tvm_ffi whole (sglang JIT-builds rope / activation / KV-store kernels through it at run time).
find "$SITE" "$TOOLS" -name '__pycache__' -type d -prune -exec rm -rf {} +
find "$SITE" "$TOOLS" -path '*.dist-info/licenses/*' -delete 2>/dev/null || true  # RECORD/METADATA stay: tvm_ffi reads RECORD
rm -rf "$SITE/bin" "$TOOLS/bin"

# 4. Pack.
mkdir -p "$OUT"
printf '%s\n' "${wheels[@]}" "${tools[@]}" | xargs -n1 basename > "$OUT/wheels.txt"
du -sb "$SITE" "$TOOLS" | awk '{printf "%s: %.1f MiB unpacked\n", $2, $1/1048576}'
tar -C "$BUILD" --owner=0 --group=0 --sort=name -cf - site tools | xz -9 -T"$(nproc)" -c > "$OUT/sglang-site.tar.xz.part"
mv "$OUT/sglang-site.tar.xz.part" "$OUT/sglang-site.tar.xz"
(cd "$OUT" && sha256sum sglang-site.tar.xz > SHA256SUMS)
ls -l "$OUT/sglang-site.tar.xz" | awk '{printf "sglang-site.tar.xz: %.2f MiB\n", $5/1048576}'
