"""Fixtures the SDK's torch tests share."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# the SDK under test is this checkout's: a git worktree sharing a venv whose editable install points at another
# checkout would otherwise import that one's kernelfleet (the service is imported from the working directory)
_SDK = str(Path(__file__).resolve().parents[2] / "clients" / "python")
if _SDK not in sys.path:
    sys.path.insert(0, _SDK)


@pytest.fixture
def two_threads() -> Iterator[None]:
    """PyTorch on two threads for the test, the caller's count back after it."""
    import torch  # only the tests that ask for it need torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)
