"""Issue 37 item 1: every tuner implements the one interface (tuners/base.py) under the name it is registered by,
and every tuner class in service.tuning.tuners is registered."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import typing

import pytest

import service.tuning.tuners
from service.tuning.tuners.base import StopSignal, Tuner
from service.tuning.tuners.registry import TUNERS


@pytest.mark.parametrize("name", TUNERS.names())
def test_each_registered_tuner_implements_the_interface(name: str) -> None:
    tuner = TUNERS.get(name)
    cls = type(tuner)
    assert tuner.name == name
    assert isinstance(tuner, Tuner)
    assert list(inspect.signature(cls.tune).parameters) == ["self", "task", "sink"]
    hints = typing.get_type_hints(cls.tune)
    assert dataclasses.is_dataclass(hints["task"]), f"{name}: a task is a typed dataclass beside its tuner"
    assert StopSignal in inspect.getmro(hints["sink"]), f"{name}: a sink answers should_stop"
    assert dataclasses.is_dataclass(hints["return"]), f"{name}: an outcome is a typed dataclass"


def test_every_tuner_class_is_registered() -> None:
    registered = {type(tuner) for tuner in TUNERS.all()}
    found = set()
    for module in pkgutil.walk_packages(service.tuning.tuners.__path__, "service.tuning.tuners."):
        for _, cls in inspect.getmembers(importlib.import_module(module.name), inspect.isclass):
            if cls.__module__ == module.name and cls.__name__.endswith("Tuner") and cls is not Tuner:
                found.add(cls)
    assert found == registered


def test_an_unknown_tuner_names_the_registered_ones() -> None:
    with pytest.raises(KeyError, match=r"unknown tuner 'nope'; known: gemmini-baco"):
        TUNERS.get("nope")
