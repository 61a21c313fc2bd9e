"""A static GPU kernel model: what a CUDA kernel will cost, read from its code, on a host without a GPU.

The H100 first light (../shared/research/gpu-first-light.md §4) explained every measured uKernel time from
the generated code alone: shared-memory wavefronts per shared load (from the index expressions), the SASS
mix and ptxas resources (from nvcc + cuobjdump, pip wheels), the grid against the SM count, and a per-SM
bound — the max of the shared-memory, FFMA-issue and DRAM terms. This package makes that diagnosis code:

    banks      wavefronts one warp-wide shared access takes (the phase and the whole-warp model)
    access     the shared loads, FMAs, launch geometry and DRAM bytes of a scheduled TIR module
    cubin      nvcc -cubin -Xptxas -v and cuobjdump -sass: registers, spills, stack, shared bytes, SASS mix
    bound      the per-SM time bound at a given M, on an `SMSpec` (clocks, lanes, DRAM bandwidth)
    gate       what a candidate must pass before it is ever timed (no spills, no stack, conflict-free loads)

Nothing here needs a GPU or imports Celery, HTTP or the store; TVM and the CUDA wheels are imported lazily.
"""

# Which model a prediction came from (reports print it next to every predicted figure). 2: the tensor-core
# kernels' k-loop latency term, fitted on the H200 session of 2026-11-27 (docs/gpu_model.md); 1: before it.
MODEL_VERSION = 2
