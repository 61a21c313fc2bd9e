"""MetaSchedule builder for CPU and CUDA targets.

TVM 0.27's default LocalBuilder re-imports `tvm.s_tir.tensor_intrin` (about 15 s) in every fresh
build process, which made most builds time out here (../shared/research/tvm.md §0.2). This build
function skips that import; it lives in an importable module so MetaSchedule's worker processes can
unpickle it by reference.
"""

from __future__ import annotations

from typing import Any


def fast_build(mod: Any, target: Any, _params: Any) -> Any:
    from tvm.driver import build as tvm_build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return tvm_build(mod, target=target)  # a runtime.Module, which MetaSchedule can export


def fast_build_cuda(mod: Any, target: Any, params: Any) -> Any:
    """`fast_build` under the async-copy PassContext, so the pipelines MetaSchedule's CUDA rules annotate
    get real `cp.async` copies where the arch has them, sm_80+ (../shared/research/gpu.md §3: 182/192
    built, against 3/128 with the default builder)."""
    import tvm

    from service.tuning.builder.cuda import pass_config
    from service.tuning.cuda_toolchain import configure_cuda_compile

    configure_cuda_compile()  # in MetaSchedule's build process too: nvcc through TVM's callback
    # the target scope tells the compile callback which arch to build for (a GPU host would guess from its
    # device; a build host has none)
    with target, tvm.transform.PassContext(config=pass_config(str(target.attrs.get("arch", "")))):
        return fast_build(mod, target, params)


def make_builder(max_workers: int = 2, timeout_sec: int = 60, cuda: bool = False) -> Any:
    from tvm.s_tir.meta_schedule.builder import LocalBuilder

    f_build = fast_build_cuda if cuda else fast_build
    return LocalBuilder(f_build=f_build, max_workers=max_workers, timeout_sec=timeout_sec)
