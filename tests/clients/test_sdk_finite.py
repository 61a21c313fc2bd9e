"""The SDK names a non-finite number in a request body instead of failing inside httpx (issue 10, item 1)."""

from __future__ import annotations

import math

import pytest

from kernelfleet import Client
from kernelfleet.errors import InvalidRequest


@pytest.mark.parametrize("number", [math.nan, math.inf, -math.inf])
def test_non_finite_numbers_are_named_before_anything_is_sent(number: float) -> None:
    client = Client("http://127.0.0.1:9", api_key="kf_unused", retries=0)  # nothing listens: nothing may be sent
    dist = {"kind": "zipf", "dim": "M", "low": 1, "high": 64, "s": number}
    with pytest.raises(InvalidRequest, match=r"body\.distribution\.s") as info:
        client.submit({"op": "dense", "dims": {"N": 8, "K": 8}, "symbolic": ["M"]}, {"kind": "llvm"}, dist)
    assert info.value.status == 422 and info.value.detail == [
        {"loc": ["body", "distribution", "s"], "msg": f"{number} is not a finite number", "type": "finite_number"}
    ]
    batch = {"batch_id": "b", "records": [{"shape": {"M": 1}, "calls": 1, "kernel_seconds": number}]}
    with pytest.raises(InvalidRequest, match=r"body\.records\.0\.kernel_seconds"):
        client._request("POST", "/v1/telemetry", json=batch)
