"""Hardware platforms, one module each, looked up by target kind.

Adding a platform: write `service/tuning/platforms/<name>.py` with a `Platform` subclass and add its
line to `PLATFORMS` below (or register it from a plugin module named in KERNELFLEET_PLUGINS).
"""

from __future__ import annotations

import os

from service.models import TargetSpec
from service.registry import Registry
from service.tuning.platforms.base import Platform, TVMPlatform, VendorTiming

PLATFORMS: Registry[Platform] = Registry(
    "platform",
    {
        "llvm": "service.tuning.platforms.llvm:LLVMPlatform",
        "cuda": "service.tuning.platforms.cuda:CUDAPlatform",
        "gemmini": "service.tuning.platforms.gemmini:GemminiPlatform",
    },
)


def platform_for(target: TargetSpec | str) -> Platform:
    """The platform of a target (or of a target kind); KeyError names the known kinds."""
    return PLATFORMS.get(target if isinstance(target, str) else target.kind)


def queue_for(target: TargetSpec) -> str:
    """The Celery queue whose workers run on exactly this target's hardware."""
    return platform_for(target).queue(target)


def tvm_target(target: TargetSpec) -> dict[str, object]:
    """The dict TVM 0.27 takes as `tvm.target.Target(...)`; ValueError for a platform TVM does not compile for."""
    platform = platform_for(target)
    if not isinstance(platform, TVMPlatform):
        raise ValueError(f"{target.kind} targets are not compiled by TVM")
    return platform.tvm_target(target)


def host_platform() -> tuple[Platform, TargetSpec]:
    """The platform this host's worker serves and the host's target on it.

    `KERNELFLEET_WORKER_PLATFORM` picks one; otherwise the detected platform with the highest priority
    (a GPU host serves its GPU queue only, so CPU jobs never land on it and GPU jobs never on a CPU host).
    """
    chosen = os.environ.get("KERNELFLEET_WORKER_PLATFORM")
    if chosen:
        platform = PLATFORMS.get(chosen)
        target = platform.detect()
        if target is None:
            raise RuntimeError(f"KERNELFLEET_WORKER_PLATFORM={chosen} but this host has no such hardware")
        return platform, target
    found = [(p, t) for p in sorted(PLATFORMS.all(), key=lambda p: -p.detect_priority) if (t := p.detect())]
    if not found:
        raise RuntimeError("this host matches no registered platform")
    return found[0]


__all__ = [
    "PLATFORMS",
    "Platform",
    "TVMPlatform",
    "VendorTiming",
    "host_platform",
    "platform_for",
    "queue_for",
    "tvm_target",
]
