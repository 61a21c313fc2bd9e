#!/usr/bin/env bash
# The GPU checks in one command. On this (CPU) host:   bash bench/gpu_session.sh pack
#   packs TVM 0.27 with ../shared/tools/tvm-gpu-bundle.sh into the git-ignored .gpu-bundle/ (about 61 MiB,
#   the GPU machine reaches no package registry) and prints the command to run there.
# On the GPU machine, from the repository root, with .gpu-bundle/ carried along:   bash bench/gpu_session.sh run
#   unpacks TVM, shows the GPU, runs the GPU tests (codegen + nvcc, kernels on the GPU, dispatcher vs torch
#   at T = 1..128, 131, 257, 512, device tensors in and out) and bench/gpu_dynamic_bert.py (qkv, 32
#   MetaSchedule trials per shape: about 8 minutes on an H100), and writes everything under $OUT (default
#   ./gpu-results). `run-tests` / `run-bench` do one half each (for 10-minute command limits); extra
#   arguments go to the benchmark (e.g. --layers all --ms-trials 128).
# Needs there: python3.12 with torch (CUDA), numpy, pytest, psutil, cloudpickle (the H100 image has them)
# and nvcc on PATH; not pydantic, fastapi or celery (the tests and the benchmark import without them).
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-}"
shift || true
bundle=.gpu-bundle/tvm.tar.xz

case "$mode" in
pack)
    if [[ ! -f "$bundle" ]]; then
        bash "${TVM_GPU_BUNDLE_SCRIPT:-../shared/tools/tvm-gpu-bundle.sh}" .gpu-bundle
    fi
    ls -la "$bundle"
    echo "on the GPU machine (carry .gpu-bundle):  bash bench/gpu_session.sh run"
    ;;
run | run-tests | run-bench)
    out="${OUT:-$PWD/gpu-results}"
    mkdir -p "$out"
    if ! python3 -c "import tvm" 2>/dev/null; then
        [[ -f "$bundle" ]] || { echo "no TVM and no $bundle: run 'bash bench/gpu_session.sh pack' first" >&2; exit 2; }
        site=$(mktemp -d)
        tar xJf "$bundle" -C "$site"
        export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    fi
    export PYTHONPATH="$PWD:$PWD/clients/python${PYTHONPATH:+:$PYTHONPATH}"
    nvidia-smi | tee "$out/nvidia-smi.txt"
    python3 -c "import tvm; print('tvm', tvm.__version__, 'cuda', tvm.runtime.enabled('cuda'), tvm.cuda(0).exist)" \
        | tee "$out/tvm.txt"
    tests_rc=0
    if [[ "$mode" != run-bench ]]; then
        # pydantic-free test modules only (the GPU machine has no service stack); -p no:cacheprovider: the
        # tree may be read-only. A failing test does not stop the benchmark.
        set +e
        python3 -m pytest -p no:cacheprovider -q -rs -k "not sampled_sketch and not full_ukernel_job" \
            tests/tuning/gpu/test_on_gpu.py tests/tuning/gpu/test_codegen.py tests/tuning/gpu/test_gpu_rules.py \
            2>&1 | tee "$out/pytest.txt"
        tests_rc=${PIPESTATUS[0]}
        set -e
    fi
    if [[ "$mode" != run-tests ]]; then
        python3 bench/gpu_dynamic_bert.py --ms-trials 32 --out "$out/gpu_dynamic_bert.json" "$@" 2>&1 \
            | tee "$out/bench.txt"
    fi
    echo "tests rc=$tests_rc; results in $out"
    exit "$tests_rc"
    ;;
*)
    echo "usage: bash bench/gpu_session.sh pack|run|run-tests|run-bench [benchmark args]" >&2
    exit 2
    ;;
esac
