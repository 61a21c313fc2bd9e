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
from collections.abc import Mapping as MappingABC
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

Dataflow = Literal["WS", "OS", "BOTH"]  # the generator's Dataflow.{WS, OS, BOTH}; BOTH is its default
LayerFlow = Literal["WS", "OS"]  # what one layer runs: gemmini.h's tiled_matmul_type_t (WS or OS)
DATAFLOWS: tuple[Dataflow, ...] = ("WS", "OS", "BOTH")
DIMS = ("N", "P", "Q", "C", "K", "R", "S")
# the loop nests gemmini.h's explicit-tiling entry points run (outermost first)
LOOP_ORDER = {"gemm": ("N", "K", "C"), "conv": ("N", "P", "Q", "K", "R", "S", "C")}

MAX_DIM = 128  # BACO: PE array ≤ 128×128
ARRAY_DIMS = (4, 8, 16, 32, 64, 128)  # square powers of two (legality.dim_pow2); 2×2 left out of the search
BUS_WIDTHS = (64, 128, 256, 512)  # dma_buswidth in bits
SP_KIB = (1, 8192)  # scratchpad capacity bounds of the search space (KiB)
ACC_KIB = (1, 4096)  # accumulator capacity bounds of the search space (KiB)
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
    padding: int = 0
    H: int = 0  # input rows/cols as given (0: not recorded; tiled_conv_auto's downsample check needs them)
    W: int = 0

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
        return Layer(
            name,
            "conv",
            N=batch,
            P=P,
            Q=Q,
            C=CI,
            K=CO,
            R=KH,
            S=KW,
            stride=stride,
            weight=weight,
            padding=padding,
            H=H,
            W=W,
        )

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
    dataflow: Dataflow = "BOTH"
    dma_buswidth: int = 128
    input_bits: int = 8  # inputType = weightType (the model counts int8 words; the search keeps 8/32)
    acc_bits: int = 32  # accType

    def violations(self) -> list[str]:
        """Every generator check this config fails (legality.py), empty when Gemmini can build it."""
        from service.tuning.gemmini.legality import violations

        return violations(self)

    def problem(self) -> str | None:
        """Why this config is not a point of the search space: a generator check it fails (legality.py) or a
        bound of the space (array sizes, bus widths, capacity ranges, dataflow names), or None."""
        if self.dataflow not in DATAFLOWS:
            return f"dataflow {self.dataflow!r} not in {DATAFLOWS}"
        bad = self.violations()
        if bad:
            return "; ".join(bad)
        if self.dim not in ARRAY_DIMS:
            return f"array dim {self.dim} not in {ARRAY_DIMS} (square, ≤ {MAX_DIM}×{MAX_DIM})"
        if self.dma_buswidth not in BUS_WIDTHS:
            return f"dma_buswidth {self.dma_buswidth} not in {BUS_WIDTHS}"
        if not SP_KIB[0] <= self.sp_kib <= SP_KIB[1]:
            return f"scratchpad {self.sp_kib} KiB outside {SP_KIB[0]}..{SP_KIB[1]} KiB"
        if not ACC_KIB[0] <= self.acc_kib <= ACC_KIB[1]:
            return f"accumulator {self.acc_kib} KiB outside {ACC_KIB[0]}..{ACC_KIB[1]} KiB"
        return None

    @property
    def sp_banks(self) -> int:
        return SP_BANKS

    @property
    def acc_banks(self) -> int:
        return ACC_BANKS

    @property
    def sp_bytes(self) -> int:
        return self.sp_kib * 1024

    @property
    def acc_bytes(self) -> int:
        return self.acc_kib * 1024

    @property
    def bank_rows(self) -> int:
        """gemmini_params.h BANK_ROWS (sp_bank_entries, GemminiConfigs.scala L107)."""
        return self.sp_kib * 1024 * 8 // (SP_BANKS * self.dim * self.input_bits)

    @property
    def sp_rows(self) -> int:
        return SP_BANKS * self.bank_rows

    @property
    def acc_rows(self) -> int:
        """gemmini_params.h ACC_ROWS (acc_banks × acc_bank_entries)."""
        return ACC_BANKS * (self.acc_kib * 1024 * 8 // (ACC_BANKS * self.dim * self.acc_bits))

    def flows(self, layer: Layer) -> tuple[LayerFlow, ...]:
        """The dataflows `layer` can run with on this hardware: gemmini.h's tiled_matmul takes WS or OS if the
        array has it; tiled_conv exits on OS ("Gemmini convs do not currently support OS", gemmini.h L2217 at
        gemmini-rocc-tests 180c46848eca06933df4a2ab8c1351ba1d005e09), so convs run WS and need WS hardware."""
        return self.flows_for(layer.op)

    def flows_for(self, op: str) -> tuple[LayerFlow, ...]:
        have: tuple[LayerFlow, ...] = ("WS", "OS") if self.dataflow == "BOTH" else (self.dataflow,)
        return tuple(f for f in have if op == "gemm" or f == "WS")

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
            "inputType": f"SInt{self.input_bits}",
            "accType": f"SInt{self.acc_bits}",
        }

    @staticmethod
    def from_generator_config(cfg: dict[str, Any]) -> HwConfig:
        def bits(name: str, default: int) -> int:
            digits = "".join(ch for ch in str(cfg.get(name, "")) if ch.isdigit())
            return int(digits) if digits else default

        return HwConfig(
            dim=int(cfg["meshRows"]) * int(cfg.get("tileRows", 1)),
            sp_kib=int(cfg["sp_capacity_kib"]),
            acc_kib=int(cfg["acc_capacity_kib"]),
            dataflow=cfg["dataflow"],
            dma_buswidth=int(cfg["dma_buswidth"]),
            input_bits=bits("inputType", 8),
            acc_bits=bits("accType", 32),
        )

    def key(self) -> str:
        blob = json.dumps(self.generator_config(), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# Gemmini's own default (GemminiConfigs.defaultConfig, src/main/scala/gemmini/Configs.scala L21–L44 at
# ucb-bar/gemmini 8c3f9923a44a2fe2c7930587be297d6d4f8c09ca): 16×16 array, 256 KiB scratchpad in 4 banks,
# 64 KiB accumulator in 2 banks, Dataflow.BOTH, 128-bit DMA bus, int8 inputs/weights, int32 accumulator.
DEFAULT_HW = HwConfig()


def legal_sp_kibs(dim: int, input_bits: int = 8) -> list[int]:
    """Every scratchpad capacity (whole KiB within SP_KIB) whose bank rows are a power of two and a multiple
    of `dim` (GemminiConfigs.scala L273/L274): rows = dim·2^k, capacity = SP_BANKS·rows·dim·bits/8 bytes."""
    return _legal_kibs(dim, SP_BANKS, input_bits, SP_KIB)


def legal_acc_kibs(dim: int, acc_bits: int = 32) -> list[int]:
    """Every accumulator capacity whose bank rows are a power of two (LocalAddr.scala L48) and a multiple of
    `dim` (GemminiConfigs.scala L278)."""
    return _legal_kibs(dim, ACC_BANKS, acc_bits, ACC_KIB)


def _legal_kibs(dim: int, banks: int, bits: int, bounds: tuple[int, int]) -> list[int]:
    out: list[int] = []
    rows = dim
    while True:
        bytes_ = banks * rows * dim * bits // 8
        if bytes_ > bounds[1] * 1024:
            return out
        if bytes_ % 1024 == 0 and bytes_ // 1024 >= bounds[0]:
            out.append(bytes_ // 1024)
        rows *= 2


@dataclass(frozen=True)
class Mapping:
    """Tile sizes in elements per dim (the DRAM-level block each outer iteration moves), and the dataflow
    the layer runs with: None lets a BOTH array pick per layer the better of the two (`resolve` pins it)."""

    tiles: dict[str, int] = field(default_factory=dict)
    flow: LayerFlow | None = None

    def t(self, d: str) -> int:
        return int(self.tiles.get(d, 1))

    def with_tile(self, d: str, v: int) -> Mapping:
        return replace(self, tiles={**self.tiles, d: v})

    def with_flow(self, flow: LayerFlow | None) -> Mapping:
        return replace(self, flow=flow)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.tiles)


@dataclass(frozen=True)
class Footprint:
    """Scratchpad and accumulator rows one tile needs, as gemmini.h counts them, and their bytes."""

    sp_rows: int
    acc_rows: int
    sp_bytes: int  # one buffer's worth: input + weight tiles, rows of DIM elements
    acc_bytes: int  # the output tile's partial sums


def conv_downsample(layer: Layer) -> bool:
    """tiled_conv_stride_auto's `downsample` (gemmini.h L2666): stride 2, 1×1 kernel, no padding, even input
    (unknown input sizes count as not even), no pooling."""
    return (
        layer.op == "conv"
        and layer.stride == 2
        and layer.R == 1
        and layer.S == 1
        and layer.padding == 0
        and layer.H > 0
        and layer.W > 0
        and layer.H % 2 == 0
        and layer.W % 2 == 0
    )


def conv_rows(
    dim: int, layer: Layer, batches: int, porows: int, pocols: int, ochs: int, krows: int, kcols: int, kchs: int
) -> tuple[int, int]:
    """gemmini.h tiled_conv_total_spad_rows (L1791) for no pooling, no dilation, no transposes: (A+B rows,
    C rows). Note its input-rows estimate orows·stride + krows − 1 (not (orows−1)·stride + krows)."""
    ds = 1 if conv_downsample(layer) else 0
    irows = porows * layer.stride + krows - 1
    icols = pocols * layer.stride + kcols - 1
    a_rows = -(-kchs // dim) * batches * (irows >> ds) * (icols >> ds)
    b_rows = -(-ochs // dim) * kcols * krows * kchs
    c_rows = -(-ochs // dim) * batches * porows * pocols
    return a_rows + b_rows, c_rows


def footprint(hw: HwConfig, layer: Layer, m: Mapping) -> Footprint:
    d = hw.dim
    if layer.op == "gemm":  # tiled_matmul_total_spad_rows / _acc_rows (gemmini.h L1220–L1227)
        ti, tj, tk = (-(-m.t(x) // d) for x in ("N", "K", "C"))
        sp_rows, acc_rows = (ti * tk + tk * tj) * d, ti * tj * d
    else:
        sp_rows, acc_rows = conv_rows(d, layer, *(m.t(x) for x in ("N", "P", "Q", "K", "R", "S", "C")))
    return Footprint(sp_rows, acc_rows, sp_rows * d * hw.input_bits // 8, acc_rows * d * hw.acc_bits // 8)


def double_buffered(layer: Layer, flow: LayerFlow) -> bool:
    """gemmini.h halves the scratchpad and accumulator for double buffering on WS matmuls, and always for
    convs (tiled_conv checks BANK_NUM·BANK_ROWS/2 and ACC_ROWS/2, L2254–L2260)."""
    return layer.op == "conv" or flow == "WS"


def fit_flow(hw: HwConfig, layer: Layer, m: Mapping, flow: LayerFlow) -> str | None:
    """Why `layer` cannot run on `hw` with tiles `m` and dataflow `flow` (as gemmini.h's asserts say), or None."""
    if flow not in hw.flows(layer):
        if layer.op == "conv":
            return 'gemmini.h\'s tiled_conv rejects OS ("Gemmini convs do not currently support OS")'
        return f"dataflow {flow} is not built into a {hw.dataflow} array"
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
    buffers = 2 if double_buffered(layer, flow) else 1
    if fp.sp_rows * buffers > hw.sp_rows:
        return (
            f"tiles need {fp.sp_rows * buffers} scratchpad rows ({buffers} buffer(s), {flow}) but the config has "
            f"{hw.sp_rows} ({hw.sp_kib} KiB)"
        )
    if fp.acc_rows * buffers > hw.acc_rows:
        return (
            f"tiles need {fp.acc_rows * buffers} accumulator rows ({buffers} buffer(s), {flow}) but the config has "
            f"{hw.acc_rows} ({hw.acc_kib} KiB)"
        )
    return None


def candidate_flows(hw: HwConfig, layer: Layer, m: Mapping) -> tuple[LayerFlow, ...]:
    """The dataflows a mapping may run with: its pinned one, else every one the array offers the layer."""
    return (m.flow,) if m.flow is not None else hw.flows(layer)


def fit(hw: HwConfig, layer: Layer, m: Mapping) -> str | None:
    """Why `hw` cannot run `layer` with mapping `m` under any dataflow it may use, or None. An illegal
    hardware config (legality.py) never fits."""
    hw_problem = hw.problem()
    if hw_problem:
        return hw_problem
    flows = candidate_flows(hw, layer, m)
    if not flows:
        if layer.op == "conv":
            return 'gemmini.h\'s tiled_conv rejects OS ("Gemmini convs do not currently support OS")'
        return f"no dataflow of a {hw.dataflow} array runs {layer.op}"
    reasons = [fit_flow(hw, layer, m, f) for f in flows]
    if any(r is None for r in reasons):
        return None
    return reasons[0]


def fitting_flows(hw: HwConfig, layer: Layer, m: Mapping) -> list[LayerFlow]:
    return [f for f in candidate_flows(hw, layer, m) if fit_flow(hw, layer, m, f) is None]


def minimal_hw(hw: HwConfig, layers: list[Layer], mappings: list[Mapping]) -> HwConfig:
    """BACO's "infer minimal HW config": the smallest legal scratchpad/accumulator (legal_sp_kibs /
    legal_acc_kibs, then scratchpad grown until its usable tiles cover the accumulator's) that still holds
    every layer's tiles under `hw`'s array, each layer with the dataflows it can use."""
    sp_need = acc_need = 0
    for lay, m in zip(layers, mappings, strict=True):
        fp = footprint(hw, lay, m)
        flows = fitting_flows(hw, lay, m) or list(candidate_flows(hw, lay, m)) or ["WS"]
        buffers = min(2 if double_buffered(lay, f) else 1 for f in flows)
        sp_need, acc_need = max(sp_need, fp.sp_rows * buffers), max(acc_need, fp.acc_rows * buffers)
    sps = [k for k in legal_sp_kibs(hw.dim, hw.input_bits) if replace(hw, sp_kib=k).sp_rows >= sp_need]
    accs = [k for k in legal_acc_kibs(hw.dim, hw.acc_bits) if replace(hw, acc_kib=k).acc_rows >= acc_need]
    if not sps or not accs:
        return hw
    out = replace(hw, sp_kib=sps[0], acc_kib=accs[0])
    for k in sps:  # USABLE_SP_TILES ≥ TOTAL_ACC_TILES
        out = replace(out, sp_kib=k)
        if out.problem() is None:
            return out
    return hw


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


def generator_violations(gen: MappingABC[str, Any]) -> list[str]:
    """The same checks on a GemminiArrayConfig as a dict (e.g. a FireSim bitstream's recorded config), plus
    the two a dict can break but HwConfig cannot express: a square array (GemminiConfigs.scala L191, L275,
    L325) and weightType = inputType (L105)."""
    rows = int(gen.get("meshRows", 16)) * int(gen.get("tileRows", 1))
    cols = int(gen.get("meshColumns", 16)) * int(gen.get("tileColumns", 1))
    out = []
    if rows != cols:
        out.append(f"array {rows}x{cols} is not square (GemminiConfigs.scala L275)")
    wi, ww = _bits(gen.get("inputType", "SInt8")), _bits(gen.get("weightType", gen.get("inputType", "SInt8")))
    if wi != ww:
        out.append(f"weightType width {ww} != inputType width {wi} (GemminiConfigs.scala L105)")
    if out:
        return out
    try:
        cfg = HwConfig.from_generator_config(dict(gen))
    except (KeyError, ValueError) as exc:
        return [f"not a Gemmini generator config: {exc}"]
    return cfg.violations()


def _bits(type_name: object) -> int:
    digits = "".join(ch for ch in str(type_name) if ch.isdigit())
    return int(digits) if digits else 0
