"""Bank wavefronts of one warp-wide shared access: the cases the first light's diagnosis turned on."""

from __future__ import annotations

import pytest

from service.tuning.gpu_model.banks import ideal_wavefronts, wavefronts


def test_broadcast_is_one_wavefront_for_the_warp_and_one_per_phase() -> None:
    assert wavefronts([0] * 32, 16) == (4, 1)


def test_rows_a_multiple_of_128_bytes_apart_serialise_every_lane() -> None:
    # the first light's W tile: lane i reads row i of a 32-float (128-byte) pitch
    assert wavefronts([i * 128 for i in range(32)], 16) == (32, 32)


@pytest.mark.parametrize("pitch_floats", [20, 36, 68])  # an odd number of 16-byte chunks per row
def test_an_odd_chunk_pitch_is_conflict_free(pitch_floats: int) -> None:
    assert wavefronts([i * pitch_floats * 4 for i in range(32)], 16) == (4, 4)


def test_rows_two_apart_conflict_two_fold_even_when_padded() -> None:
    assert wavefronts([2 * i * 36 * 4 for i in range(32)], 16)[0] == 8


def test_consecutive_words_are_ideal_at_every_width() -> None:
    for width in (4, 8, 16):
        assert wavefronts([i * width for i in range(32)], width)[0] == ideal_wavefronts(width)


def test_bad_width_is_refused() -> None:
    with pytest.raises(ValueError, match="bytes per lane"):
        wavefronts([0], 12)
