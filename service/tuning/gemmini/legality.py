"""Which hardware configs Gemmini's generator can build: its `require`/`assert`s as small rules.

Each rule re-expresses one check of the generator (ucb-bar/gemmini at commit
8c3f9923a44a2fe2c7930587be297d6d4f8c09ca; line numbers below are of that commit) in terms of the knobs
`HwConfig` carries, and returns why it fails or None. `violations(cfg)` runs them all; the space samples and
mutates only into configs with no violation, and the search's evaluator refuses to score one that has any.

Quantities as the generator derives them (GemminiConfigs.scala L106–L113, Scala integer division):
  sp_bank_entries  = sp_capacity_KiB  · 1024 · 8 / (sp_banks  · DIM · inputType.width)
  acc_bank_entries = acc_capacity_KiB · 1024 · 8 / (acc_banks · DIM · accType.width)
  USABLE_SP_TILES  = sp_banks · sp_bank_entries / DIM − 2,  TOTAL_ACC_TILES = acc_banks · acc_bank_entries / DIM

Checks left out because no knob here can break them: acc_singleported sub-banks (L115, single-ported
accumulator is not a knob), I/O_TILE_BYTE_WIDTH powers of two (L246–L249: they follow from DIM and the
widths being powers of two, both checked), num_counter (L271), mvin scale widths (L279–L280), the opcode
(L341), LocalAddr's address width (LocalAddr.scala L27: 32-bit local addresses; reached only past 2^27 rows,
far outside the capacity bounds the space uses).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class HwConfig(Protocol):
    """What the rules read of a config (space.HwConfig has it; this module imports nothing of the space)."""

    @property
    def dim(self) -> int: ...
    @property
    def sp_kib(self) -> int: ...
    @property
    def acc_kib(self) -> int: ...
    @property
    def input_bits(self) -> int: ...
    @property
    def acc_bits(self) -> int: ...
    @property
    def sp_banks(self) -> int: ...
    @property
    def acc_banks(self) -> int: ...


WIDTHS = (8, 16, 32, 64)  # GemminiConfigs.scala L326/L328


def is_pow2(n: int) -> bool:
    """chisel3.util.isPow2: n > 0 and a single bit set (so 0 is not a power of two)."""
    return n > 0 and n & (n - 1) == 0


def sp_bank_entries(cfg: HwConfig) -> int:
    return cfg.sp_kib * 1024 * 8 // (cfg.sp_banks * cfg.dim * cfg.input_bits)


def acc_bank_entries(cfg: HwConfig) -> int:
    return cfg.acc_kib * 1024 * 8 // (cfg.acc_banks * cfg.dim * cfg.acc_bits)


# -- the rules ------------------------------------------------------------------------------------------
def dim_at_least_2(cfg: HwConfig) -> str | None:
    """GemminiConfigs.scala L196 and L276: DIM ≥ 2."""
    if cfg.dim < 2:
        return f"array dim {cfg.dim} < 2 (GemminiConfigs.scala L276)"
    return None


def dim_pow2(cfg: HwConfig) -> str | None:
    """GemminiConfigs.scala L277: the array's dimension is a power of two."""
    if not is_pow2(cfg.dim):
        return f"array dim {cfg.dim} is not a power of two (GemminiConfigs.scala L277)"
    return None


def element_widths(cfg: HwConfig) -> str | None:
    """GemminiConfigs.scala L326 and L328 (header generation): input and accumulator widths in {8,16,32,64}.
    (weightType = inputType, L105, is structural here: HwConfig has one input width; see generator_violations.)"""
    for name, bits in (("inputType", cfg.input_bits), ("accType", cfg.acc_bits)):
        if bits not in WIDTHS:
            return f"{name} width {bits} not in {WIDTHS} (GemminiConfigs.scala L326/L328)"
    return None


def input_width_in_header(cfg: HwConfig) -> str | None:
    """GemminiConfigs.scala L285 with L366: gemmini_params.h's elem_t limits are written for inputType, which
    asserts a width ≤ 32 bits (64-bit inputs pass L326 but fail here)."""
    if cfg.input_bits > 32:
        return f"inputType width {cfg.input_bits} > 32: the header's limits assert fails (GemminiConfigs.scala L285)"
    return None


def sp_bank_rows_pow2(cfg: HwConfig) -> str | None:
    """GemminiConfigs.scala L273 (and LocalAddr.scala L47): scratchpad bank rows are a power of two."""
    rows = sp_bank_entries(cfg)
    if not is_pow2(rows):
        return f"scratchpad bank rows {rows} is not a power of two (GemminiConfigs.scala L273)"
    return None


def sp_bank_rows_multiple_of_dim(cfg: HwConfig) -> str | None:
    """GemminiConfigs.scala L274: scratchpad bank rows are a multiple of DIM."""
    rows = sp_bank_entries(cfg)
    if rows % cfg.dim:
        return f"scratchpad bank rows {rows} is not a multiple of DIM={cfg.dim} (GemminiConfigs.scala L274)"
    return None


def acc_bank_rows_pow2(cfg: HwConfig) -> str | None:
    """LocalAddr.scala L48 (address arithmetic, instantiated by every Gemmini): accumulator bank rows are a
    power of two. GemminiConfigs.scala itself only asks for a multiple of DIM (L278)."""
    rows = acc_bank_entries(cfg)
    if not is_pow2(rows):
        return f"accumulator bank rows {rows} is not a power of two (LocalAddr.scala L48)"
    return None


def acc_bank_rows_multiple_of_dim(cfg: HwConfig) -> str | None:
    """GemminiConfigs.scala L278: accumulator bank rows are a multiple of DIM."""
    rows = acc_bank_entries(cfg)
    if rows % cfg.dim:
        return f"accumulator bank rows {rows} is not a multiple of DIM={cfg.dim} (GemminiConfigs.scala L278)"
    return None


def sp_tiles_cover_acc_tiles(cfg: HwConfig) -> str | None:
    """GemminiConfigs.scala L255–L258: USABLE_SP_TILES (total − 2) ≥ TOTAL_ACC_TILES."""
    usable = cfg.sp_banks * sp_bank_entries(cfg) // cfg.dim - 2
    acc = cfg.acc_banks * acc_bank_entries(cfg) // cfg.dim
    if usable < acc:
        return f"scratchpad has {usable} usable DIM×DIM tiles < {acc} accumulator tiles (GemminiConfigs.scala L257)"
    return None


def whole_capacity(cfg: HwConfig) -> str | None:
    """Not a generator check but its arithmetic (L108/L112 truncate): a capacity that does not split into
    whole rows would build a smaller memory than the config names; refused so the config is what is built."""
    if (cfg.sp_kib * 1024 * 8) % (cfg.sp_banks * cfg.dim * cfg.input_bits):
        return f"scratchpad {cfg.sp_kib} KiB does not split into whole {cfg.sp_banks}-bank rows of DIM elements"
    if (cfg.acc_kib * 1024 * 8) % (cfg.acc_banks * cfg.dim * cfg.acc_bits):
        return f"accumulator {cfg.acc_kib} KiB does not split into whole {cfg.acc_banks}-bank rows of DIM sums"
    return None


RULES: tuple[Callable[[HwConfig], str | None], ...] = (
    dim_at_least_2,
    dim_pow2,
    element_widths,
    input_width_in_header,
    whole_capacity,
    sp_bank_rows_pow2,
    sp_bank_rows_multiple_of_dim,
    acc_bank_rows_pow2,
    acc_bank_rows_multiple_of_dim,
    sp_tiles_cover_acc_tiles,
)
_NEEDS_VALID_SHAPE = frozenset({dim_at_least_2, dim_pow2, element_widths})


def violations(cfg: HwConfig) -> list[str]:
    """Every generator check `cfg` fails (empty: Gemmini can build it). The capacity rules need a valid
    array and widths to be computed, so they are skipped once those fail."""
    out = [why for rule in RULES if rule in _NEEDS_VALID_SHAPE and (why := rule(cfg))]
    if out:
        return out
    return [why for rule in RULES if rule not in _NEEDS_VALID_SHAPE and (why := rule(cfg))]


RULE_FIELD: dict[Callable[[HwConfig], str | None], str] = {
    dim_at_least_2: "dim",
    dim_pow2: "dim",
    element_widths: "input_bits",
    input_width_in_header: "input_bits",
    whole_capacity: "sp_kib",
    sp_bank_rows_pow2: "sp_kib",
    sp_bank_rows_multiple_of_dim: "sp_kib",
    acc_bank_rows_pow2: "acc_kib",
    acc_bank_rows_multiple_of_dim: "acc_kib",
    sp_tiles_cover_acc_tiles: "sp_kib",
}


def field_violations(cfg: HwConfig) -> list[tuple[str, str]]:
    """`violations` with the HwConfig field each one is about (for a 422 that names the field)."""
    shape = [(RULE_FIELD[r], why) for r in RULES if r in _NEEDS_VALID_SHAPE and (why := r(cfg))]
    if shape:
        return shape
    return [(RULE_FIELD[r], why) for r in RULES if r not in _NEEDS_VALID_SHAPE and (why := r(cfg))]


def legal(cfg: HwConfig) -> bool:
    return not violations(cfg)
