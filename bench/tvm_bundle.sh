#!/usr/bin/env bash
# Packs TVM 0.27 (compiler + CUDA runtime, Python 3.12 wheels) into .gpu-bundle/tvm.tar.xz for a GPU machine that
# reaches no package registry. Everything travels in ONE 64 MiB transfer with the working tree (about 3 MiB), so
# the bundle leaves out what building and running CUDA kernels never reads: CUTLASS's headers, relax's model
# frontends (an empty package stays: relax imports it), TVM's and tvm-ffi's C++ sources and third-party headers,
# and the web runtime (tvm-ffi's testing library stays: `import tvm_ffi` loads it). That, and a 512 MiB xz
# dictionary (the 259 MB libtvm_compiler.so compresses better when xz sees it whole), bring it from ~61.4 MiB
# (../shared/tools/tvm-gpu-bundle.sh) to ~60.3 MiB.
# Checked here when a Python 3.12 is found ($PY312 or pyenv's): the pruned package imports and builds a GEMM
# and a GEMV uKernel to CUDA source (no GPU needed). About 4 minutes on 2 cores (xz -9e).
#   bash bench/tvm_bundle.sh [OUT_DIR]        (default .gpu-bundle)
set -euo pipefail
out=$(realpath -m "${1:-.gpu-bundle}")
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    -d "$work/whl" apache-tvm==0.27.0.post1 apache-tvm-ffi==0.1.14.post1
mkdir -p "$work/site"
for w in "$work"/whl/*.whl; do (cd "$work/site" && unzip -q -o "$w"); done
site="$work/site"
rm -rf "$site/tvm/3rdparty/cutlass" "$site/tvm/relax/frontend" "$site/tvm/src" "$site/tvm/web" \
    "$site/tvm_ffi/3rdparty" "$site/tvm_ffi/src"
mkdir -p "$site/tvm/relax/frontend" && : >"$site/tvm/relax/frontend/__init__.py"
py312="${PY312:-$(ls "$HOME"/.pyenv/versions/3.12*/bin/python3.12 2>/dev/null | head -1 || true)}"
if [[ -n "$py312" ]]; then
    "$py312" -m venv "$work/venv" && "$work/venv/bin/pip" install -q numpy ml_dtypes typing_extensions psutil cloudpickle
    PYTHONPATH="$site:$repo:$repo/clients/python" "$work/venv/bin/python" - <<'PY'
import tvm
from service.tuning.tuners.pipeline.gemv import build_gemv, default_gemv
from service.tuning.builder.cuda import cuda_target
from service.tuning.tuners.pipeline.schedule import GemmTile, build_gemm, cuda_source

target = cuda_target("sm_90a")
gemm = cuda_source(build_gemm(GemmTile.from_label("16x32x64_t4x4i_s3a_p4"), 2304, 768, target))
gemv = cuda_source(build_gemv(default_gemv(2304, 768), 2304, 768, target))
assert "__global__" in gemm and "__global__" in gemv
print(f"pruned TVM {tvm.__version__} imports and builds a GEMM and a GEMV uKernel under Python 3.12")
PY
else
    echo "no Python 3.12 here: the pruned bundle was not import-checked (set PY312)" >&2
fi
mkdir -p "$out"
(cd "$site" && tar cf - . | xz --lzma2=preset=9e,dict=512MiB -T1 >"$out/tvm.tar.xz")
ls -la "$out/tvm.tar.xz"
