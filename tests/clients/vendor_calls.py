"""Record which vendor library each routed call runs: `kernelfleet.vendor.dense_call` wrapped so that every call of
the calls it makes appends its library's name (tests of the SDK, the tuner's timing and the demo share it)."""

from __future__ import annotations

import pytest

from kernelfleet import vendor
from kernelfleet.epilogue import Epilogue


def record_library_calls(monkeypatch: pytest.MonkeyPatch, log: list[str]) -> None:
    real = vendor.dense_call

    def recorded(library: str, epilogue: Epilogue) -> vendor.DenseCall:
        call = real(library, epilogue)
        return lambda *a: log.append(library) or call(*a)

    monkeypatch.setattr(vendor, "dense_call", recorded)
