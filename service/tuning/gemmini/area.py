"""Area of a Gemmini configuration, resource budgets, and CACTI per-access SRAM energies (issue 23, item 1).

area = scratchpad + accumulator (CACTI 7 at their real bank geometry, `sram.py`)
     + (PE array (DIM² × one PE: MAC + its registers) + scale units (one per column, and mvin's four)) / utilisation
     + controller/host-interface overhead (a cited fraction of the above).

Every constant below names its source. Figures marked [recalled] are quoted from the cited paper from
memory, not re-read in this change (the sandbox has no access to the PDFs): check them before publishing.

Node: 45 nm by default. It is the node of the per-operation areas we cite (Horowitz, ISSCC 2014) and one
CACTI has parameters for, so no logic scaling is involved at the default. At 22/32 nm the logic areas are
scaled by (node/45)² (ideal Dennard area scaling, an approximation; CACTI models the SRAM at the node itself).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.tuning.gemmini.space import ACC_BANKS, DEFAULT_HW, SP_BANKS, HwConfig
from service.tuning.gemmini.sram import Ports, SramCost, sram_cost

TECH_NM = 45
REF_NM = 45  # the node of the logic figures below

# -- Gemmini datapath widths (GemminiConfigs.defaultConfig, which HwConfig.generator_config keeps) ---------
INPUT_BITS = 8  # inputType = SInt(8.W): one scratchpad element
ACC_BITS = 32  # accType = SInt(32.W): one accumulator element
SPATIAL_OUT_BITS = 20  # spatialArrayOutputType = SInt(20.W): the partial sum travelling down a column

# -- logic areas at 45 nm ------------------------------------------------------------------------------
# M. Horowitz, "Computing's energy problem (and what we can do about it)", ISSCC 2014, the 45 nm
# area table [recalled]: 8-bit multiply 282 µm², 32-bit add 137 µm² (8-bit add 36 µm², 32-bit multiply
# 3495 µm²). An int8 × int8 MAC with an int32 accumulate = one 8-bit multiplier + one 32-bit adder.
MULT8_UM2 = 282.0
ADD32_UM2 = 137.0
MAC_UM2 = MULT8_UM2 + ADD32_UM2
# The same table [recalled]: fp32 add 4184 µm², fp32 multiply 7700 µm² (the scale units below).
FP32_ADD_UM2 = 4184.0
FP32_MULT_UM2 = 7700.0
# Nangate 45 nm Open Cell Library (the FreePDK45 standard cells), DFF_X1 cell area 4.522 µm² [recalled].
DFF_UM2 = 4.522
RECALLED = ("mac", "dff", "fp")  # the [recalled] cell areas a claim must survive scaling (issue 36 item 2)


@contextlib.contextmanager
def recalled_scaled(mac: float = 1.0, dff: float = 1.0, fp: float = 1.0) -> Iterator[None]:
    """The area model with its recalled cell areas scaled (MAC_UM2 × mac, DFF_UM2 × dff, the fp32 adder and
    multiplier × fp) while the block runs: the robustness check of an equal-area claim (issue 36 item 2 asks ×0.5
    and ×2). Budgets computed inside the block (`default_budget`) scale with them, so "equal area" keeps its
    meaning. Not thread-safe (module state)."""
    global MAC_UM2, DFF_UM2, FP32_ADD_UM2, FP32_MULT_UM2
    if min(mac, dff, fp) <= 0:
        raise ValueError(f"scales must be positive, not mac={mac}, dff={dff}, fp={fp}")
    saved = MAC_UM2, DFF_UM2, FP32_ADD_UM2, FP32_MULT_UM2
    MAC_UM2, DFF_UM2 = saved[0] * mac, saved[1] * dff
    FP32_ADD_UM2, FP32_MULT_UM2 = saved[2] * fp, saved[3] * fp
    try:
        yield
    finally:
        MAC_UM2, DFF_UM2, FP32_ADD_UM2, FP32_MULT_UM2 = saved


# Registers per PE, counted from Gemmini's RTL (ucb-bar/gemmini, src/main/scala/gemmini/):
#  PE.scala: two stationary registers c1, c2 of cType = weightType (8 bits) in a WS-only build, accType
#            (32 bits) otherwise (OS holds the partial sums in the PE);
#  Mesh.scala: with tileRows = tileColumns = 1 every PE gets one pipeline stage (tile_latency + 1 = 1) on
#            in_a (inputType, 8 b), in_b (outputType, 20 b), in_d (8 b) and the control/valid/id/last
#            signals (shift 5 b + dataflow 1 + propagate 1 + valid 1 + last 1 + id ≈ 3 b = 12 b).
PIPE_BITS = INPUT_BITS + SPATIAL_OUT_BITS + INPUT_BITS + 12


def pe_registers(hw: HwConfig) -> int:
    stationary = INPUT_BITS if hw.dataflow == "WS" else ACC_BITS
    return 2 * stationary + PIPE_BITS


def pe_area_um2(hw: HwConfig, tech_nm: int = TECH_NM) -> float:
    """One PE (MAC + registers) at `tech_nm`, as synthesised cells (before placement: see UTILISATION)."""
    return (MAC_UM2 + pe_registers(hw) * DFF_UM2) * (tech_nm / REF_NM) ** 2


# -- scale units: logic that grows with DIM -------------------------------------------------------------
# GemminiConfigs.defaultConfig (ucb-bar/gemmini, re-read in this change):
#   acc_scale_args  = ScaleArguments(<INToRecFN → MulAddRecFN → RecFNToIN>, latency 8, Float(8, 24), -1, ...):
#                     num_scale_units = -1 builds one unit per column of the array, i.e. DIM units;
#   mvin_scale_args = ScaleArguments(<the same chain>, latency 4, Float(8, 24), 4, ...): four units, any DIM.
# One unit is priced as an fp32 multiplier + an fp32 adder (MulAddRecFN fuses them; the int<->fp converters
# are not priced, so this is a floor) + `latency` pipeline stages of one fp32 value each.
ACC_SCALE_LATENCY = 8
MVIN_SCALE_UNITS = 4
MVIN_SCALE_LATENCY = 4
FP32_BITS = 32


def scale_unit_um2(latency: int, tech_nm: int = TECH_NM) -> float:
    return (FP32_MULT_UM2 + FP32_ADD_UM2 + latency * FP32_BITS * DFF_UM2) * (tech_nm / REF_NM) ** 2


def scale_units_um2(hw: HwConfig, tech_nm: int = TECH_NM) -> float:
    """The accumulator's per-column scale units and mvin's four, as synthesised cells."""
    acc = hw.dim * scale_unit_um2(ACC_SCALE_LATENCY, tech_nm)
    return acc + MVIN_SCALE_UNITS * scale_unit_um2(MVIN_SCALE_LATENCY, tech_nm)


# -- placement: standard cells do not tile the floor plan -------------------------------------------------
# The OpenROAD flow scripts place their nangate45 systolic-array design (flow/designs/nangate45/tpu/config.mk)
# at CORE_UTILIZATION = 60 (%; ibex: 50): cell area is 60 % of the placed core, the rest is whitespace for
# routing, buffering and clock tree. Applied to the logic only: CACTI's SRAM areas are whole macros already.
UTILISATION = 0.60


def placed_logic_mm2(hw: HwConfig, tech_nm: int = TECH_NM) -> tuple[float, float]:
    """(PE array, scale units) in mm² of placed core."""
    pes = hw.dim * hw.dim * pe_area_um2(hw, tech_nm) / 1e6 / UTILISATION
    return pes, scale_units_um2(hw, tech_nm) / 1e6 / UTILISATION


# -- controller, DMA, TLB, ROB, im2col/transposer, interconnect -----------------------------------------
# N. P. Jouppi et al., "In-Datacenter Performance Analysis of a Tensor Processing Unit", ISCA 2017, Fig. 2
# (TPU v1 floor plan, share of die) [recalled]: Unified Buffer 29 %, Matrix Multiply Unit 24 %, Accumulators
# 6 %, Activation Pipeline 6 %, Control 2 %, Host Interface 2 % (the rest: DRAM/PCIe PHYs and I/O, which a
# Gemmini tile does not contain). The activation pipeline's counterpart (the scale units) is modelled above;
# what is left — control and host interface, 4 % — is taken relative to the array, SRAMs and activation (65 %):
OVERHEAD_FRACTION = (2 + 2) / (29 + 24 + 6 + 6)  # ≈ 0.062 of (PE array + scale units + scratchpad + accumulator)


# -- SRAMs ---------------------------------------------------------------------------------------------
def scratchpad_sram(hw: HwConfig, tech_nm: int = TECH_NM, cache_file: Path | None = None) -> SramCost:
    """sp_banks banks, each row DIM × inputType bits (gemmini_params.h: BANK_ROWS rows of DIM bytes)."""
    return sram_cost(hw.sp_bytes, SP_BANKS, hw.dim * INPUT_BITS, tech_nm, cache_file)


# The accumulator is two-ported in defaultConfig: it accumulates, reading a row while writing another in the same
# cycle (one exclusive read and one exclusive write port per bank); a single-ported macro was priced before, and
# CACTI gives the two-port one about 2.1x its area at 4-8 KiB (issue 36, re-checked against GemminiConfigs.scala).
ACC_PORTS: Ports = (0, 1, 1)


def accumulator_sram(hw: HwConfig, tech_nm: int = TECH_NM, cache_file: Path | None = None) -> SramCost:
    """acc_banks banks, each row DIM × accType bits, each macro with a read and a write port (ACC_PORTS)."""
    return sram_cost(hw.acc_bytes, ACC_BANKS, hw.dim * ACC_BITS, tech_nm, cache_file, ACC_PORTS)


def area_breakdown(hw: HwConfig, tech_nm: int = TECH_NM, cache_file: Path | None = None) -> dict[str, float]:
    """mm² per component and the total."""
    sp = scratchpad_sram(hw, tech_nm, cache_file).area_mm2
    acc = accumulator_sram(hw, tech_nm, cache_file).area_mm2
    pes, scale = placed_logic_mm2(hw, tech_nm)
    overhead = OVERHEAD_FRACTION * (sp + acc + pes + scale)
    return {
        "scratchpad_mm2": sp,
        "accumulator_mm2": acc,
        "pe_array_mm2": pes,
        "scale_units_mm2": scale,
        "overhead_mm2": overhead,
        "total_mm2": sp + acc + pes + scale + overhead,
    }


def config_area_mm2(hw: HwConfig, tech_nm: int = TECH_NM, cache_file: Path | None = None) -> float:
    return area_breakdown(hw, tech_nm, cache_file)["total_mm2"]


# -- per-access energies for the ZigZag backend ----------------------------------------------------------
def sram_energies(hw: HwConfig, tech_nm: int = TECH_NM, cache_file: Path | None = None) -> dict[str, Any]:
    """pJ per row access (one bank, one row: DIM elements) for the scratchpad and the accumulator, from the
    same CACTI runs as the area — what the zigzag backend puts in its accelerator instead of model.py's
    Table 6.3 fits."""
    sp = scratchpad_sram(hw, tech_nm, cache_file)
    acc = accumulator_sram(hw, tech_nm, cache_file)
    return {
        "source": sp.source,
        "tech_nm": tech_nm,
        "scratchpad": {"row_bits": sp.row_width_bits, "read_pj": sp.read_pj, "write_pj": sp.write_pj},
        "accumulator": {"row_bits": acc.row_width_bits, "read_pj": acc.read_pj, "write_pj": acc.write_pj},
    }


# -- budgets -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ResourceBudget:
    """What a configuration may use; None = unconstrained. `fits` is the search's filter."""

    area_mm2: float | None = None
    max_pes: int | None = None
    max_sram_kib: int | None = None  # scratchpad + accumulator
    max_buswidth: int | None = None
    tech_nm: int = TECH_NM
    label: str = "custom"

    def why_not(self, hw: HwConfig) -> str | None:
        if self.max_pes is not None and hw.dim * hw.dim > self.max_pes:
            return f"{hw.dim * hw.dim} PEs > {self.max_pes}"
        if self.max_sram_kib is not None and hw.sp_kib + hw.acc_kib > self.max_sram_kib:
            return f"{hw.sp_kib + hw.acc_kib} KiB SRAM > {self.max_sram_kib} KiB"
        if self.max_buswidth is not None and hw.dma_buswidth > self.max_buswidth:
            return f"{hw.dma_buswidth}-bit bus > {self.max_buswidth}"
        if self.area_mm2 is not None:
            logic = (1 + OVERHEAD_FRACTION) * sum(placed_logic_mm2(hw, self.tech_nm))
            if logic > self.area_mm2:  # already over without any SRAM: skip the CACTI runs
                return f"logic alone {logic:.3f} mm² > {self.area_mm2:.3f} mm² at {self.tech_nm} nm"
            area = config_area_mm2(hw, self.tech_nm)
            if area > self.area_mm2 * (1 + 1e-9):
                return f"{area:.3f} mm² > {self.area_mm2:.3f} mm² at {self.tech_nm} nm"
        return None

    def fits(self, hw: HwConfig) -> bool:
        return self.why_not(hw) is None

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "area_mm2": self.area_mm2,
            "max_pes": self.max_pes,
            "max_sram_kib": self.max_sram_kib,
            "max_buswidth": self.max_buswidth,
            "tech_nm": self.tech_nm,
        }


def default_budget(tech_nm: int = TECH_NM) -> ResourceBudget:
    """Equal resources: no more area than Gemmini's default configuration, nor a wider DMA bus (the bus costs
    no modelled area, but it is the SoC's, not the accelerator's, to widen)."""
    return ResourceBudget(
        area_mm2=config_area_mm2(DEFAULT_HW, tech_nm),
        max_buswidth=DEFAULT_HW.dma_buswidth,
        tech_nm=tech_nm,
        label="default-area",
    )


UNCONSTRAINED = ResourceBudget(label="unconstrained")
