"""The Gemmini co-design space: layers, hardware configs and per-layer mappings (BACO §6.3.2).

A layer is one conv2d in BACO's dims D = {N, P, Q, C, K, R, S} (GEMM: P = Q = R = S = 1 with N = M rows,
C = reduction, K = output columns; GEMV additionally N = 1). A mapping gives tile sizes in elements for
each dim; the loop order is the one `gemmini.h` hard-codes (tiled_matmul_outer: i0 → j0 → k0; tiled_conv:
b → porow → pocol → poch → krow → kcol → kch, reduction innermost), so it is recorded, not searched.
A hardware config that cannot hold a mapping's tiles is rejected with the reason (`fit`), never clipped.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

Dataflow = Literal["WS", "OS"]
DIMS = ("N", "P", "Q", "C", "K", "R", "S")
# the loop nests gemmini.h's explicit-tiling entry points run (outermost first)
LOOP_ORDER = {"gemm": ("N", "K", "C"), "conv": ("N", "P", "Q", "K", "R", "S", "C")}

MAX_DIM = 128  # BACO: PE array ≤ 128×128
ARRAY_DIMS = (4, 8, 16, 32, 64, 128)  # Gemmini's mesh is square (GemminiConfigs.scala asserts it)
BUS_WIDTHS = (64, 128, 256, 512)  # dma_buswidth in bits
SP_KIB = (1, 8192)  # scratchpad capacity range, 1 KiB steps
ACC_KIB = (1, 4096)  # accumulator capacity range, 1 KiB steps
SP_BANKS, ACC_BANKS = 4, 2  # Gemmini defaults, kept fixed (BACO does not vary them)


def ceil_to(x: int, m: int) -> int:
    return -(-x // m) * m


@dataclass(frozen=True)
class Layer:
    """One operator; `weight` is its occurrence count in the network (BACO Eq. 6.6)."""

    name: str
    op: Literal["gemm", "conv"]
    N: int
    P: int
    Q: int
    C: int
    K: int
    R: int = 1
    S: int = 1
    stride: int = 1
    weight: int = 1

    @staticmethod
    def gemm(name: str, M: int, N: int, K: int, weight: int = 1) -> Layer:
        """C[M,N] = A[M,K]·B[K,N] as tiled_matmul sees it: I = M, J = N, K = K."""
        return Layer(name, "gemm", N=M, P=1, Q=1, C=K, K=N, weight=weight)

    @staticmethod
    def conv(
        name: str,
        H: int,
        W: int,
        CI: int,
        CO: int,
        KH: int,
        KW: int,
        stride: int = 1,
        padding: int = 0,
        batch: int = 1,
        weight: int = 1,
    ) -> Layer:
        P = (H + 2 * padding - KH) // stride + 1
        Q = (W + 2 * padding - KW) // stride + 1
        if P < 1 or Q < 1:
            raise ValueError(f"conv {name}: empty output for {H}x{W} with a {KH}x{KW} kernel")
        return Layer(name, "conv", N=batch, P=P, Q=Q, C=CI, K=CO, R=KH, S=KW, stride=stride, weight=weight)

    def size(self, d: str) -> int:
        return int(getattr(self, d))

    @property
    def macs(self) -> int:
        return math.prod(self.size(d) for d in DIMS)

    @property
    def label(self) -> str:
        if self.op == "gemm":
            return f"gemm M={self.N} N={self.K} K={self.C}"
        return f"conv {self.P}x{self.Q} C={self.C} K={self.K} {self.R}x{self.S} s{self.stride}"

    def in_rows(self, p: int) -> int:
        return (p - 1) * self.stride + self.R

    def in_cols(self, q: int) -> int:
        return (q - 1) * self.stride + self.S


@dataclass(frozen=True)
class HwConfig:
    """The Gemmini generator knobs the search varies (everything else stays at `defaultConfig`)."""

    dim: int = 16  # meshRows = meshColumns (tileRows = tileColumns = 1)
    sp_kib: int = 256
    acc_kib: int = 64
    dataflow: Dataflow = "WS"
    dma_buswidth: int = 128

    def problem(self) -> str | None:
        """Why Gemmini's generator would not build this config, or None."""
        if self.dim not in ARRAY_DIMS:
            return f"array dim {self.dim} not in {ARRAY_DIMS} (square, ≤ {MAX_DIM}×{MAX_DIM})"
        if self.dma_buswidth not in BUS_WIDTHS:
            return f"dma_buswidth {self.dma_buswidth} not in {BUS_WIDTHS}"
        if not SP_KIB[0] <= self.sp_kib <= SP_KIB[1]:
            return f"scratchpad {self.sp_kib} KiB outside {SP_KIB[0]}..{SP_KIB[1]} KiB"
        if not ACC_KIB[0] <= self.acc_kib <= ACC_KIB[1]:
            return f"accumulator {self.acc_kib} KiB outside {ACC_KIB[0]}..{ACC_KIB[1]} KiB"
        # gemmini_params.h: BANK_ROWS and ACC_ROWS must come out whole
        if (self.sp_kib * 1024) % (SP_BANKS * self.dim):
            return f"scratchpad {self.sp_kib} KiB does not split into {SP_BANKS} banks of {self.dim}-byte rows"
        if (self.acc_kib * 1024) % (ACC_BANKS * self.dim * 4):
            return f"accumulator {self.acc_kib} KiB does not split into {ACC_BANKS} banks of {self.dim}×int32 rows"
        return None

    @property
    def sp_bytes(self) -> int:
        return self.sp_kib * 1024

    @property
    def acc_bytes(self) -> int:
        return self.acc_kib * 1024

    @property
    def bank_rows(self) -> int:
        return self.sp_bytes // (SP_BANKS * self.dim)

    @property
    def acc_rows(self) -> int:
        return self.acc_bytes // (self.dim * 4)

    @property
    def double_buffered(self) -> bool:
        return self.dataflow == "WS"  # gemmini.h double-buffers WS only

    def generator_config(self) -> dict[str, Any]:
        """The full GemminiArrayConfig this point builds: the key of its bitstream."""
        return {
            "meshRows": self.dim,
            "meshColumns": self.dim,
            "tileRows": 1,
            "tileColumns": 1,
            "dataflow": self.dataflow,
            "sp_capacity_kib": self.sp_kib,
            "acc_capacity_kib": self.acc_kib,
            "sp_banks": SP_BANKS,
            "acc_banks": ACC_BANKS,
            "dma_buswidth": self.dma_buswidth,
            "dma_maxbytes": 64,
            "max_in_flight_mem_reqs": 16,
            "inputType": "SInt8",
            "accType": "SInt32",
        }

    @staticmethod
    def from_generator_config(cfg: dict[str, Any]) -> HwConfig:
        return HwConfig(
            dim=int(cfg["meshRows"]) * int(cfg.get("tileRows", 1)),
            sp_kib=int(cfg["sp_capacity_kib"]),
            acc_kib=int(cfg["acc_capacity_kib"]),
            dataflow=cfg["dataflow"],
            dma_buswidth=int(cfg["dma_buswidth"]),
        )

    def key(self) -> str:
        blob = json.dumps(self.generator_config(), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


DEFAULT_HW = HwConfig()  # BACO's Gemmini-Default: 16×16, 256 KiB scratchpad, 64 KiB accumulator, WS, 128-bit bus


@dataclass(frozen=True)
class Mapping:
    """Tile sizes in elements per dim (the DRAM-level block each outer iteration moves)."""

    tiles: dict[str, int] = field(default_factory=dict)

    def t(self, d: str) -> int:
        return int(self.tiles.get(d, 1))

    def with_tile(self, d: str, v: int) -> Mapping:
        return replace(self, tiles={**self.tiles, d: v})

    def to_dict(self) -> dict[str, Any]:
        return dict(self.tiles)


@dataclass(frozen=True)
class Footprint:
    sp_bytes: int  # one buffer's worth: input + weight tiles, rows padded to DIM
    acc_bytes: int  # the output tile's int32 partial sums


def footprint(hw: HwConfig, layer: Layer, m: Mapping) -> Footprint:
    d = hw.dim
    tc, tk = ceil_to(m.t("C"), d), ceil_to(m.t("K"), d)
    pix_in = m.t("N") * layer.in_rows(m.t("P")) * layer.in_cols(m.t("Q"))
    if layer.op == "gemm":
        pix_in = ceil_to(m.t("N"), d)  # tiled_matmul moves whole DIM-row blocks of A
    inputs = pix_in * tc
    weights = m.t("R") * m.t("S") * tc * tk
    acc = ceil_to(m.t("N") * m.t("P") * m.t("Q"), d) * tk * 4
    return Footprint(sp_bytes=inputs + weights, acc_bytes=acc)


def fit(hw: HwConfig, layer: Layer, m: Mapping) -> str | None:
    """Why `hw` cannot run `layer` with mapping `m` (as gemmini.h's asserts would say), or None."""
    hw_problem = hw.problem()
    if hw_problem:
        return hw_problem
    if layer.op == "conv" and hw.dataflow == "OS":
        return 'gemmini.h\'s tiled_conv rejects OS ("Gemmini convs do not currently support OS")'
    for d in DIMS:
        t, size = m.t(d), layer.size(d)
        if t < 1:
            return f"tile {d}={t} must be ≥ 1"
        limit = ceil_to(size, hw.dim) if (layer.op == "gemm" and d in ("N", "C", "K")) else size
        if t > limit:
            return f"tile {d}={t} exceeds the (padded) dimension {limit}"
        if layer.op == "gemm" and d in ("N", "C", "K") and t % hw.dim:
            return f"tile {d}={t} is not a multiple of DIM={hw.dim} (tiled_matmul tiles in DIM blocks)"
    fp = footprint(hw, layer, m)
    buffers = 2 if hw.double_buffered else 1
    if fp.sp_bytes * buffers > hw.sp_bytes:
        return (
            f"tiles need {fp.sp_bytes * buffers} B of scratchpad ({buffers} buffer(s)) but the config has "
            f"{hw.sp_bytes} B ({hw.sp_kib} KiB)"
        )
    if fp.acc_bytes * buffers > hw.acc_bytes:
        return (
            f"tiles need {fp.acc_bytes * buffers} B of accumulator ({buffers} buffer(s)) but the config has "
            f"{hw.acc_bytes} B ({hw.acc_kib} KiB)"
        )
    return None


def minimal_hw(hw: HwConfig, layers: list[Layer], mappings: list[Mapping]) -> HwConfig:
    """BACO's "infer minimal HW config": the smallest scratchpad/accumulator (1 KiB steps, bank-aligned)
    that still holds every layer's tiles under `hw`'s array and dataflow."""
    buffers = 2 if hw.double_buffered else 1
    fps = [footprint(hw, lay, m) for lay, m in zip(layers, mappings, strict=True)]
    sp = max(1, -(-max(f.sp_bytes for f in fps) * buffers // 1024))
    acc = max(1, -(-max(f.acc_bytes for f in fps) * buffers // 1024))
    out = replace(hw, sp_kib=max(sp, SP_KIB[0]), acc_kib=max(acc, ACC_KIB[0]))
    while out.problem() and out.sp_kib < SP_KIB[1]:  # bank split not whole: grow by 1 KiB steps
        out = replace(out, sp_kib=out.sp_kib + 1)
    while out.problem() and out.acc_kib < ACC_KIB[1]:
        out = replace(out, acc_kib=out.acc_kib + 1)
    return out


# -- gemmini.h's own heuristics: the "default tiling" baseline ---------------------------------------
def default_matmul_tiles(hw: HwConfig, layer: Layer) -> Mapping:
    """tiled_matmul_auto (gemmini.h L1231–L1300): start from the double-buffered square-ish tile, then grow
    J, I, K by one DIM block while scratchpad and accumulator still fit."""
    d = hw.dim
    dim_i, dim_j, dim_k = (ceil_to(layer.size(x), d) // d for x in ("N", "K", "C"))
    db = hw.double_buffered
    max_spad_rows = SP_BANKS * hw.bank_rows // (2 if db else 1)
    max_acc_rows = hw.acc_rows // (2 if db else 1)
    mats_in_acc = max_acc_rows // d
    mats_in_partition = (SP_BANKS * hw.bank_rows // 2 // (2 if db else 1)) // d
    max_ij = max(1, math.isqrt(mats_in_acc))
    max_k = max(1, mats_in_partition // max_ij)
    ti, tj, tk = min(dim_i, max_ij), min(dim_j, max_ij), min(dim_k, max_k)

    def spad_rows(i: int, j: int, k: int) -> int:
        return (i * k + k * j) * d

    while True:
        grew = False
        if spad_rows(ti, tj + 1, tk) <= max_spad_rows and ti * (tj + 1) * d <= max_acc_rows and tj + 1 <= dim_j:
            tj, grew = tj + 1, True
        if spad_rows(ti + 1, tj, tk) <= max_spad_rows and (ti + 1) * tj * d <= max_acc_rows and ti + 1 <= dim_i:
            ti, grew = ti + 1, True
        if spad_rows(ti, tj, tk + 1) <= max_spad_rows and tk + 1 <= dim_k:
            tk, grew = tk + 1, True
        if not grew:
            break
    return Mapping({"N": ti * d, "K": tj * d, "C": tk * d, "P": 1, "Q": 1, "R": 1, "S": 1})


def default_conv_tiles(hw: HwConfig, layer: Layer) -> Mapping:
    """tiled_conv_auto's idea: start from the whole layer and shrink the largest tile factor until the
    tiles fit (it decrements the biggest of batches/porows/pocols/pochs/kchs; kernel rows/cols last)."""
    m = Mapping({d: layer.size(d) for d in DIMS})
    if hw.dataflow == "OS":
        return m  # no conv mapping exists on OS (fit says why)
    order = ("N", "P", "Q", "K", "C")
    while fit(hw, layer, m) is not None:
        shrinkable = [d for d in order if m.t(d) > 1]
        if not shrinkable:
            shrinkable = [d for d in ("R", "S") if m.t(d) > 1]
            if not shrinkable:
                break
        d = max(shrinkable, key=lambda x: (m.t(x), -order.index(x) if x in order else 0))
        m = m.with_tile(d, m.t(d) - 1)
    return m


def default_mapping(hw: HwConfig, layer: Layer) -> Mapping:
    return default_matmul_tiles(hw, layer) if layer.op == "gemm" else default_conv_tiles(hw, layer)


def tile_choices(hw: HwConfig, layer: Layer, d: str) -> list[int]:
    """Candidate tile sizes for one dim: DIM multiples for matmul dims, otherwise divisors-ish of the size
    (powers of two and the full size), so searches stay small and tiles stay realistic."""
    size = layer.size(d)
    if layer.op == "gemm" and d in ("N", "C", "K"):
        blocks = ceil_to(size, hw.dim) // hw.dim
        vals = {b * hw.dim for b in _pow2_upto(blocks)} | {blocks * hw.dim}
        return sorted(vals)
    if layer.op == "gemm":
        return [1]
    vals = set(_pow2_upto(size)) | {size} | {v for v in range(1, size + 1) if size % v == 0 and v <= 64}
    return sorted(vals)


def _pow2_upto(n: int) -> list[int]:
    out, v = [], 1
    while v <= n:
        out.append(v)
        v *= 2
    return out
