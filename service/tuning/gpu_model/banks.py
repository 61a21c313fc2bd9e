"""Shared-memory wavefronts of one warp-wide access: 32 banks of 4 bytes, one wavefront per clock per SM.

Two models bracket what the hardware does (both from the CUDA programming guide's bank rules):
  - phase: a 16-byte access is served a quarter-warp at a time (8 lanes × 16 B = 128 B), an 8-byte access
    a half-warp at a time, a 4-byte access the whole warp at once; each phase takes as many wavefronts as
    the most distinct 4-byte words it asks of one bank (lanes reading the same word share it), at least one;
  - warp: the whole warp's request at once — the most distinct words of one bank, but at least the 128-byte
    wavefronts its distinct words fill (a broadcast of one 16-byte vector is then one wavefront, not four).
The ideal — what a conflict-free access of that width takes — is the phase count with no conflicts: 4 for
16-byte, 2 for 8-byte, 1 for 4-byte accesses. On the H100 the measured times sat at the phase model's end
(the research note §4); the warp model is the optimistic end of the band.
"""

from __future__ import annotations

from collections.abc import Sequence

BANKS = 32
WORD = 4  # bytes per bank
WARP = 32
WAVEFRONT_BYTES = BANKS * WORD


def ideal_wavefronts(width_bytes: int) -> int:
    """Wavefronts of a conflict-free warp-wide access of `width_bytes` per lane (4, 8 or 16)."""
    return max(1, width_bytes * WARP // WAVEFRONT_BYTES)


def _conflict_degree(addresses: Sequence[int], width_bytes: int) -> int:
    """The most distinct 4-byte words any one bank is asked for by these lanes."""
    per_bank: dict[int, set[int]] = {}
    for address in addresses:
        first = address // WORD
        for word in range(first, first + max(1, width_bytes // WORD)):
            per_bank.setdefault(word % BANKS, set()).add(word)
    return max((len(words) for words in per_bank.values()), default=0)


def wavefronts(addresses: Sequence[int], width_bytes: int) -> tuple[int, int]:
    """(phase model, warp model) wavefronts of one access: lane i reads `width_bytes` at byte `addresses[i]`.

    Fewer than 32 addresses is a partial warp (the block's last warp)."""
    if width_bytes not in (1, 2, 4, 8, 16):
        raise ValueError(f"a shared access is 1, 2, 4, 8 or 16 bytes per lane, not {width_bytes}")
    lanes_per_phase = WARP // ideal_wavefronts(width_bytes)
    phase = 0
    for start in range(0, len(addresses), lanes_per_phase):
        phase += max(1, _conflict_degree(addresses[start : start + lanes_per_phase], width_bytes))
    words = {a // WORD + i for a in addresses for i in range(max(1, width_bytes // WORD))}
    filled = -(-len(words) // BANKS)
    warp = max(1, _conflict_degree(addresses, width_bytes), filled)
    return phase, warp
