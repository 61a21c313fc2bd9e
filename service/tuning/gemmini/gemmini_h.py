"""gemmini.h's own tile choices, re-expressed in Python: the mapping a Gemmini program gets when it calls
`tiled_matmul_auto` or `tiled_conv_auto` and picks nothing itself (the "Gemmini-Default" baseline).

Source: ucb-bar/gemmini-rocc-tests include/gemmini.h at commit 180c46848eca06933df4a2ab8c1351ba1d005e09
(line numbers below are of that commit): tiled_matmul_auto L1231–L1300, tiled_conv_stride_auto L2638–L2800
(tiled_conv_auto L2834 calls it with dense strides). Re-expressed, not copied: the same arithmetic on the
same quantities (BANK_NUM·BANK_ROWS scratchpad rows, ACC_ROWS accumulator rows, DIM), for the cases the
service tunes: no activation-driven special cases (LAYERNORM/SOFTMAX), no pooling, no dilation, no
transposes. A non-square kernel (R ≠ S) uses R for krows and S for kcols (gemmini.h only has kernel_dim).
"""

from __future__ import annotations

import math

from service.tuning.gemmini.model import NetworkCost, flow_cost, network_cost, resolve
from service.tuning.gemmini.space import DEFAULT_HW, HwConfig, Layer, LayerFlow, Mapping, conv_rows, fit, fit_flow


def matmul_auto_tiles(hw: HwConfig, dim_i: int, dim_j: int, dim_k: int, flow: LayerFlow) -> tuple[int, int, int]:
    """tiled_matmul_auto's (tile_I, tile_J, tile_K) in DIM blocks for C[I,J] = A[I,K]·B[K,J]."""
    d = hw.dim
    bi, bj, bk = (-(-x // d) for x in (dim_i, dim_j, dim_k))  # dim_X_padded / DIM
    db = flow == "WS"  # `double_buffered = tiled_matmul_type == WS`
    sp_rows_total, acc_rows_total = hw.sp_rows, hw.acc_rows
    # the start point: the (db_)max_tile_i_j / (db_)max_tile_k macros. Both variants size the K tile from
    # half the scratchpad (partition_rows = BANK_NUM·BANK_ROWS/2), the double-buffered one from half of that
    partition_rows = sp_rows_total // 2 // (2 if db else 1)
    mats_in_partition = partition_rows // d
    mats_in_acc = (acc_rows_total // (2 if db else 1)) // d
    max_ij = math.isqrt(mats_in_acc)  # (size_t)sqrt(...)
    max_k = mats_in_partition // max_ij if max_ij else 0
    ti, tj, tk = min(bi, max_ij), min(bj, max_ij), min(bk, max_k)
    # the growth loop's limits: max_spad_rows / max_acc_rows
    max_spad = sp_rows_total // 2 if db else sp_rows_total
    max_acc = acc_rows_total // 2 if db else acc_rows_total

    def spad(i: int, j: int, k: int) -> int:  # tiled_matmul_total_spad_rows
        return (i * k + k * j) * d

    def acc(i: int, j: int) -> int:  # tiled_matmul_total_acc_rows
        return i * j * d

    while True:  # "Fill scratchpad as much as possible": J, then I, then K, one block each per round
        grew = False
        if spad(ti, tj + 1, tk) <= max_spad and acc(ti, tj + 1) <= max_acc and tj + 1 <= bj:
            tj, grew = tj + 1, True
        if spad(ti + 1, tj, tk) <= max_spad and acc(ti + 1, tj) <= max_acc and ti + 1 <= bi:
            ti, grew = ti + 1, True
        if spad(ti, tj, tk + 1) <= max_spad and tk + 1 <= bk:
            tk, grew = tk + 1, True
        if not grew:
            return ti, tj, tk


def matmul_auto_mapping(hw: HwConfig, layer: Layer, flow: LayerFlow) -> Mapping:
    ti, tj, tk = matmul_auto_tiles(hw, layer.N, layer.K, layer.C, flow)
    d = hw.dim
    return Mapping({"N": ti * d, "K": tj * d, "C": tk * d, "P": 1, "Q": 1, "R": 1, "S": 1}, flow)


# gemmini.h's args[]: batches, porows, pocols, pochs, krows, kcols, kchs
CONV_ARGS = ("N", "P", "Q", "K", "R", "S", "C")
_OCOLS, _OROWS, _OCHS, _ICHS = 2, 1, 3, 6


def conv_auto_args(hw: HwConfig, layer: Layer) -> list[int]:
    """tiled_conv_stride_auto's tile-size search (L2675–L2779): start from the whole layer; while the tiles
    overflow half the scratchpad or half the accumulator, shrink the largest factor (pocols is spared while
    it is ≤ DIM and porows > 1; channel counts drop to the DIM multiple below, others by one); then grow
    pocols while it fits; then grow every factor by one, in order, while anything still fits."""
    d = hw.dim
    full = [layer.size(x) for x in CONV_ARGS]
    args = list(full)
    max_spad, max_acc = hw.sp_rows // 2, hw.acc_rows // 2

    def fits(a: list[int]) -> bool:
        sp, acc = conv_rows(d, layer, *a)
        return sp <= max_spad and acc <= max_acc

    while not fits(args):
        if all(a <= 1 for a in args):  # gemmini.h would shrink a factor to 0 here; nothing runs
            raise ValueError(f"{layer.name}: no conv tile fits a {hw.sp_kib}/{hw.acc_kib} KiB {d}x{d} Gemmini")
        max_val, max_idx = -1, -1
        for i, a in enumerate(args):  # strictly greater: the first of equal factors wins
            if not (i == _OCOLS and a <= d and args[_OROWS] > 1) and a > max_val:
                max_val, max_idx = a, i
        if max_idx in (_OCHS, _ICHS):
            a = args[max_idx]
            a = (a // d) * d if a % d else a - d
            args[max_idx] = a if a != 0 else 1
        else:
            args[max_idx] -= 1
    while True:  # "Check if we can increase ocols"
        cand = list(args)
        cand[_OCOLS] += 1
        if cand[_OCOLS] > full[_OCOLS] or not fits(cand):
            break
        args = cand
    grew = True
    while grew:  # "Check if there are any parameters that we can currently still increase"
        grew = False
        for i in range(len(args)):
            cand = list(args)
            cand[i] += 1
            if cand[i] <= full[i] and fits(cand):
                args, grew = cand, True
    return args


def conv_auto_mapping(hw: HwConfig, layer: Layer) -> Mapping:
    return Mapping(dict(zip(CONV_ARGS, conv_auto_args(hw, layer), strict=True)), "WS")


def auto_mappings(hw: HwConfig, layer: Layer) -> list[Mapping]:
    """gemmini.h's auto tiling for each dataflow `layer` can run with on `hw` (convs: WS only)."""
    out = []
    for flow in hw.flows(layer):
        try:
            out.append(matmul_auto_mapping(hw, layer, flow) if layer.op == "gemm" else conv_auto_mapping(hw, layer))
        except ValueError:
            continue
    return out


def default_mapping(hw: HwConfig, layer: Layer) -> Mapping:
    """The baseline mapping: gemmini.h's auto tiling; on a BOTH array the dataflow (WS or OS, each with its
    own auto tiling) with the lower model EDP. With no dataflow/tiling possible, the whole layer unpinned
    (`fit` then says why it cannot run)."""
    options = [m for m in auto_mappings(hw, layer) if m.flow is not None and fit_flow(hw, layer, m, m.flow) is None]
    if not options:
        return Mapping({x: layer.size(x) for x in CONV_ARGS})
    return min(options, key=lambda m: flow_cost(hw, layer, m, m.flow or "WS").edp)


def default_point(layers: list[Layer], hw: HwConfig = DEFAULT_HW) -> tuple[list[Mapping], NetworkCost]:
    """Gemmini-Default: the default config with gemmini.h's own tiling (tiled_matmul_auto / tiled_conv_auto,
    gemmini_h.py), each GEMM on the BOTH array with the better of WS and OS."""
    maps = [default_mapping(hw, lay) for lay in layers]
    for lay, m in zip(layers, maps, strict=True):
        why = fit(hw, lay, m)
        if why:
            raise ValueError(f"{lay.name}: gemmini.h's default tiling does not fit: {why}")
    maps = [resolve(hw, lay, m) for lay, m in zip(layers, maps, strict=True)]
    return maps, network_cost(hw, layers, maps)
