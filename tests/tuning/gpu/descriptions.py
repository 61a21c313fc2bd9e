"""Fixed descriptions of three GPUs, as nvidia-smi and TVM's device attributes report them.

The H100 row is what the H100 in ../shared/research/gpu.md reported (driver 580.159.04, CUDA 13.0);
the A100 and T4 rows follow the same format with those parts' published properties.
"""

from __future__ import annotations

from service.tuning.gpu import GPUDescription, describe, parse_smi_cuda_version, parse_smi_query

SMI = {
    "sm_90": "GPU-5e4b1f7a-90aa-4c1e-8f43-0c2d9b7e6a11, NVIDIA H100 80GB HBM3, 9.0, 81559, 580.159.04\n",
    "sm_80": "GPU-0b8d2c44-1a7f-4f0e-9d2b-6e5f4a3c2b10, NVIDIA A100-SXM4-40GB, 8.0, 40960, 535.104.05\n",
    "sm_75": "GPU-7c6a5b4d-3e2f-4a1b-8c9d-0e1f2a3b4c5d, Tesla T4, 7.5, 15360, 470.82.01\n",
}
BANNER = {
    "sm_90": "| NVIDIA-SMI 580.159.04   Driver Version: 580.159.04   CUDA Version: 13.0     |",
    "sm_80": "| NVIDIA-SMI 535.104.05   Driver Version: 535.104.05   CUDA Version: 12.2     |",
    "sm_75": "| NVIDIA-SMI 470.82.01    Driver Version: 470.82.01    CUDA Version: 11.4     |",
}
ATTRS = {
    "sm_90": {
        "sm_count": 132,
        "smem_per_block": 49152,
        "max_threads_per_block": 1024,
        "warp_size": 32,
        "l2_bytes": 52428800,
    },
    "sm_80": {
        "sm_count": 108,
        "smem_per_block": 49152,
        "max_threads_per_block": 1024,
        "warp_size": 32,
        "l2_bytes": 41943040,
    },
    "sm_75": {
        "sm_count": 40,
        "smem_per_block": 49152,
        "max_threads_per_block": 1024,
        "warp_size": 32,
        "l2_bytes": 4194304,
    },
}
ARCHES = tuple(SMI)


def card(arch: str, with_attrs: bool = True) -> GPUDescription:
    (row,) = parse_smi_query(SMI[arch])
    return describe(row, parse_smi_cuda_version(BANNER[arch]), ATTRS[arch] if with_attrs else None, "13.0.88")
