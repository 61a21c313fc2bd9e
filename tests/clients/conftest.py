"""Fixtures the SDK's torch tests share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture
def two_threads() -> Iterator[None]:
    """PyTorch on two threads for the test, the caller's count back after it."""
    import torch  # only the tests that ask for it need torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)
