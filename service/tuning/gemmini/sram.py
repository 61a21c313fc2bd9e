"""SRAM area and per-access energy from CACTI 7, through the copy ZigZag (PyPI zigzag-dse) ships.

ZigZag's wrapper `zigzag.hardware.architecture.get_cacti_cost` runs its bundled, prebuilt `cacti` binary on an
input file written by its `CactiConfig`. We use that same `CactiConfig` (its baseline option block, ZigZag's
choices: itrs-hp cells and periphery, UCA, "ram" type, 300 K) and the same binary, but not `get_cacti_cost`
itself, because it (1) `os.chdir`s the whole process into site-packages and writes its input/output files
there, (2) models any row wider than 32 bits as 32-bit macros with an undocumented extra ×2 on the area,
(3) calls `exit()` when CACTI finds no organisation, and (4) has no bank count. Here CACTI runs as a child
process with its working directory set (it reads `tech_params/*.dat` relative to it) and its files in a
temporary directory; ECC is switched off (Gemmini's SyncReadMems have none).

Geometry (Gemmini's, `gemmini_params.h` / `Scratchpad.scala`): a memory of `size_bytes` is `bank_count`
independent banks, each `size_bytes / bank_count` bytes with rows of `row_width_bits`; one access reads or
writes one row of one bank. Each bank is modelled as its own macro — CACTI runs once per bank geometry and
the area is multiplied by the bank count — rather than with CACTI's UCA bank option (that one shares the
decoder/H-tree and interleaves, which Gemmini's banks do not).

Wide rows: a row wider than MACRO_MAX_BITS is built from parallel macros of MACRO_MAX_BITS each (what a
memory compiler, or Chipyard's MacroCompiler mapping a wide SyncReadMem onto library macros, does). CACTI's
periphery model is not usable at very wide rows: measured here at 45 nm, 16 KiB with 4096-bit rows comes
out at 4.44 mm² and 1.56 nJ per read, against 32 × 512 B/128-bit macros at ≈ 0.12 mm² (ZigZag's own
wrapper splits even earlier, at 32 bits). At 512 bits the split hardly matters (32 KiB: 0.115 mm² as one
macro, 0.111 mm² as 4 × 128-bit), so the cap only bites for DIM ≥ 32 accumulators.

Minimum size: CACTI needs ≥ 32 rows per macro (ZigZag's docstring: "the minimum mem_size=64B,
minimum_rows=32"; 256 B with 1024-bit rows fails with "no valid data array organizations found"). A bank
with fewer rows is costed as a 32-row macro (`SramCost.clamped`), i.e. the smallest macro one can build.

Results are cached in memory and in a JSON file (`$KERNELFLEET_CACTI_CACHE`, else
~/.cache/kernelfleet/cacti-<version>.json) keyed by the macro geometry and node; a call takes 0.03–1.2 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import threading
from dataclasses import asdict, dataclass
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

MACRO_MAX_BITS = 128  # widest single macro (see the module docstring)
MIN_ROWS = 32  # CACTI's (and ZigZag's) minimum rows per array
# nodes with a tech_params/<n>nm.dat in ZigZag's CACTI copy (CactiConfig's "technology" option is in µm)
CACTI_NODES_NM = (22, 32, 45, 65, 90)

_lock = threading.Lock()
_memo: dict[str, dict[str, float]] = {}


class CactiError(RuntimeError):
    pass


@dataclass(frozen=True)
class SramCost:
    """One Gemmini memory (all its banks): area, and energy/latency of one row access to one bank."""

    size_bytes: int
    bank_count: int
    row_width_bits: int
    tech_nm: int
    area_mm2: float  # all banks
    read_pj: float  # one row of one bank
    write_pj: float
    access_ns: float
    leakage_mw: float  # all banks, standby
    macros_per_bank: int  # parallel MACRO_MAX_BITS-wide macros making up one row
    clamped: bool  # a bank had fewer than MIN_ROWS rows and was costed as the minimum macro
    source: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@cache
def cacti_dir() -> Path:
    import zigzag

    return Path(zigzag.__file__).parent / "cacti" / "cacti_master"


@cache
def cacti_version() -> str:
    return f"cacti7@zigzag-dse-{metadata.version('zigzag-dse')}"


def cache_path() -> Path:
    env = os.environ.get("KERNELFLEET_CACTI_CACHE")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "kernelfleet" / f"{cacti_version()}.json"


def _load_disk(path: Path) -> dict[str, dict[str, float]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _save_disk(path: Path, entries: dict[str, dict[str, float]]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        merged = {**_load_disk(path), **entries}
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(merged, sort_keys=True, indent=0))
        tmp.replace(path)  # atomic: concurrent writers lose entries at worst, never corrupt the file
    except OSError:
        pass  # a read-only home only costs recomputation


Ports = tuple[int, int, int]  # CACTI's read-write, exclusive read and exclusive write ports of one macro
ONE_RW_PORT: Ports = (1, 0, 0)  # a single-ported SyncReadMem (the scratchpad's banks)


def run_cacti(size_bytes: int, row_bits: int, tech_nm: int, ports: Ports = ONE_RW_PORT) -> dict[str, float]:
    """One CACTI 7 run for a single-bank SRAM macro with `ports` (read-write, read, write): area (mm²),
    read/write energy (pJ), access time (ns), standby leakage (mW). Raises CactiError when CACTI finds no
    organisation."""
    from zigzag.hardware.architecture.get_cacti_cost import CactiConfig

    if tech_nm not in CACTI_NODES_NM:
        raise ValueError(f"technology {tech_nm} nm: CACTI's tech_params cover {CACTI_NODES_NM}")
    if row_bits % 8 or size_bytes * 8 < row_bits * MIN_ROWS:
        raise ValueError(f"macro {size_bytes} B × {row_bits}-bit rows: need whole bytes and ≥ {MIN_ROWS} rows")
    cfg = CactiConfig()  # type: ignore[no-untyped-call]
    cfg.baseline_config = [ln.replace('-Add ECC - "true"', '-Add ECC - "false"') for ln in cfg.baseline_config]
    values = {
        "technology": tech_nm / 1000,
        "cache_size": size_bytes,
        "line_size": row_bits // 8,
        "IO_bus_width": row_bits,
        "mem_type": '"ram"',
        "bank_count": 1,
        "rd_wr_port": ports[0],
        "ex_rd_port": ports[1],
        "ex_wr_port": ports[2],
    }
    user = [opt["string"] + str(values.get(name, opt["default"])) + "\n" for name, opt in cfg.config_options.items()]
    with tempfile.TemporaryDirectory(prefix="cacti-") as td:
        infile = Path(td) / "sram.cfg"
        cfg.write_config(user, str(infile))
        try:
            proc = subprocess.run(
                [str(cacti_dir() / "cacti"), "-infile", str(infile)],
                cwd=cacti_dir(),
                capture_output=True,
                text=True,
                timeout=120,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise CactiError(f"cacti for {size_bytes} B × {row_bits} b at {tech_nm} nm: {exc}") from exc
        out = Path(str(infile) + ".out")
        if not out.exists():
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:]
            raise CactiError(f"cacti for {size_bytes} B × {row_bits} b at {tech_nm} nm failed: {tail}")
        lines = out.read_text().splitlines()
    row = dict(zip([h.strip() for h in lines[0].split(",")], lines[-1].split(","), strict=False))
    return {
        "area_mm2": float(row["Area (mm2)"]),
        "read_pj": float(row["Dynamic read energy (nJ)"]) * 1000,
        "write_pj": float(row["Dynamic write energy (nJ)"]) * 1000,
        "access_ns": float(row["Access time (ns)"]),
        "leakage_mw": float(row["Standby leakage per bank(mW)"]),
    }


def macro_cost(
    size_bytes: int, row_bits: int, tech_nm: int, cache_file: Path | None = None, ports: Ports = ONE_RW_PORT
) -> dict[str, float]:
    """`run_cacti`, memoised in memory and on disk."""
    key = f"{tech_nm}nm/{size_bytes}B/{row_bits}b" + ("" if ports == ONE_RW_PORT else "/ports{}-{}-{}".format(*ports))
    with _lock:
        hit = _memo.get(key)
    if hit is not None:
        return hit
    path = cache_file or cache_path()
    disk = _load_disk(path).get(key)
    if isinstance(disk, dict):
        with _lock:
            _memo[key] = disk
        return disk
    val = run_cacti(size_bytes, row_bits, tech_nm, ports)
    with _lock:
        _memo[key] = val
        _save_disk(path, {key: val})
    return val


def clear_memory_cache() -> None:
    with _lock:
        _memo.clear()


def sram_cost(
    size_bytes: int,
    bank_count: int,
    row_width_bits: int,
    tech_nm: int = 45,
    cache_file: Path | None = None,
    ports: Ports = ONE_RW_PORT,
) -> SramCost:
    """Area of a banked SRAM and the energy of one row access to one bank, from CACTI 7 (see the module doc);
    each bank's macros have `ports` (read-write, read, write)."""
    if size_bytes <= 0 or bank_count <= 0 or row_width_bits <= 0:
        raise ValueError("size, bank count and row width must be positive")
    if size_bytes % bank_count:
        raise ValueError(f"{size_bytes} B does not split into {bank_count} banks")
    bank_bytes = size_bytes // bank_count
    width = min(row_width_bits, MACRO_MAX_BITS)
    if row_width_bits % width:
        raise ValueError(f"row of {row_width_bits} bits is not a whole number of {width}-bit macros")
    macros = row_width_bits // width
    rows = bank_bytes * 8 // row_width_bits
    clamped = rows < MIN_ROWS
    macro_bytes = max(rows, MIN_ROWS) * width // 8
    m = macro_cost(macro_bytes, width, tech_nm, cache_file, ports)
    return SramCost(
        size_bytes=size_bytes,
        bank_count=bank_count,
        row_width_bits=row_width_bits,
        tech_nm=tech_nm,
        area_mm2=m["area_mm2"] * macros * bank_count,
        read_pj=m["read_pj"] * macros,
        write_pj=m["write_pj"] * macros,
        access_ns=m["access_ns"],
        leakage_mw=m["leakage_mw"] * macros * bank_count,
        macros_per_bank=macros,
        clamped=clamped,
        source=cacti_version(),
    )
