"""The field types request models are built from, each defined once: strict numbers, bounded strings, sane days.

FastAPI validates a request body in pydantic's lax mode, which reads `true` as 1 and `"64"` or `64.0` as 64, and
a `str` field takes any length (issue 34 items 4 and 5: a 100,000-character tag was stored). Every number a user
sends is therefore strict here, and every free string has a bound and, where it names something, a charset; a
value outside them is a 422 at its field. The types say nothing about what a value means: an operator's dims,
a kind's budget and the like are checked by the models that use them.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    Strict,
    StringConstraints,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError, core_schema

from service.models.shape import DIM_NAME_PATTERN, MAX_DIM, MAX_SHAPE_DIMS

# -- numbers --------------------------------------------------------------------------------------------------

Int = Annotated[int, Strict()]  # a JSON integer: not a bool, a string or a float, even 64.0
Flag = Annotated[bool, Strict()]  # true or false: not 0, 1, "true" or "yes"
# A finite JSON number: an integer is a number too, a bool or a string is not; NaN, ±Infinity and 1e400 (which
# Python's json reads as inf) are refused.
Real = Annotated[float, Strict(), Field(allow_inf_nan=False)]
Size = Annotated[int, Strict(), Field(ge=1, le=MAX_DIM)]  # a dimension's size


def _decimal_text(value: Any) -> Any:
    """JSON object keys are strings, so a number used as a key (a histogram's value of a dim) arrives as text:
    only plain ASCII digits are one here. Pydantic's own parsing also takes " 61", "+61", "6_1" and "61.0"."""
    if isinstance(value, str):
        if not re.fullmatch(r"[0-9]{1,10}", value):
            raise PydanticCustomError("int_parsing", "a size as an object key is written in ASCII digits, e.g. 61")
        return int(value)
    return value


SizeKey = Annotated[Size, BeforeValidator(_decimal_text)]  # a size as an object key: "61"

# -- strings --------------------------------------------------------------------------------------------------

# A name from one of the service's registries: operators, job kinds, target platforms.
RegistryName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]{0,31}$")]
DimName = Annotated[str, StringConstraints(pattern=f"^{DIM_NAME_PATTERN}$")]  # M, N, KH; also attribute names
Shape = Annotated[dict[DimName, Size], Field(max_length=MAX_SHAPE_DIMS)]  # a concrete shape: {"B": 2, "M": 61}
# A key a user or a worker chooses: tags, a target's details and metadata.
Key = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.:/-]{1,64}$")]
HexId = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{1,64}$")]  # a workload hash, a target fingerprint
Text = Annotated[str, StringConstraints(max_length=200)]  # free text a person reads: a host, where a config came from
Label = Annotated[str, StringConstraints(min_length=1, max_length=200)]  # free text naming a thing: a model's op
TagValue = Annotated[str, StringConstraints(max_length=256)]
Tags = Annotated[dict[Key, TagValue], Field(max_length=16)]
# A document carried as text, e.g. an IRModule's JSON: larger than the request body cap's default on purpose, so
# the cap (KERNELFLEET_MAX_BODY_BYTES) is what limits it in practice.
Document = Annotated[str, StringConstraints(min_length=1, max_length=1 << 22)]


@dataclass(frozen=True)
class ScalarBounds:
    """Bounds on the members of a union of scalars, checked after the union rather than on each member: a value
    of no member's type then gets one error per member under its plain label (int, bool, str), which the API
    merges into one error at the field (service.api.errors); a constrained member would be labelled otherwise."""

    max_chars: int
    low: int
    high: int

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_after_validator_function(self._check, handler(source))

    def __get_pydantic_json_schema__(self, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        # each keyword applies to its own type only, so one set documents every member
        return {**handler(schema), "maxLength": self.max_chars, "minimum": self.low, "maximum": self.high}

    def _check(self, value: Any) -> Any:
        if isinstance(value, str) and len(value) > self.max_chars:
            raise PydanticCustomError(
                "string_too_long", "String should have at most {max_length} characters", {"max_length": self.max_chars}
            )
        if isinstance(value, int) and not isinstance(value, bool) and not self.low <= value <= self.high:
            raise PydanticCustomError(
                "int_range", "Integer should be in {low}..{high}", {"low": self.low, "high": self.high}
            )
        return value


JSON_SAFE_INT = 2**53  # the largest integer every JSON reader holds exactly
# An operator attribute: a bool flag, a small int (conv2d's stride) or a choice (dense's activation).
AttrValue = Annotated[Int | Flag | str, ScalarBounds(64, 0, 64)]
# A detail a worker detected about its hardware: a GPU's name, its L2 bytes, a driver branch.
DetailValue = Annotated[Int | str, ScalarBounds(256, -JSON_SAFE_INT, JSON_SAFE_INT)]
# How a model's op gets a dim: a size, or an expression of the model's dynamic inputs (batch*seq).
DimExpr = Annotated[Int | str, ScalarBounds(200, 1, MAX_DIM)]

# -- days -----------------------------------------------------------------------------------------------------

EARLIEST_DAY = dt.date(2020, 1, 1)  # before the service existed: no fleet ran kernels then


def _sane_day(day: dt.date) -> dt.date:
    """From EARLIEST_DAY to the day after the service's UTC today: a host whose clock runs slightly ahead at
    midnight reports tomorrow; a date further out (or year 1) is a bug on the sender's side."""
    latest = dt.datetime.now(dt.UTC).date() + dt.timedelta(days=1)
    if not EARLIEST_DAY <= day <= latest:
        raise PydanticCustomError(
            "date_range",
            "{day} is outside {earliest}..{latest} (the day after today, UTC)",
            {"day": day.isoformat(), "earliest": EARLIEST_DAY.isoformat(), "latest": latest.isoformat()},
        )
    return day


def _day_text(value: Any) -> Any:
    """A day as JSON writes it, YYYY-MM-DD, or a date: pydantic would also read a number as seconds since 1970."""
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        return value
    if isinstance(value, str) and re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", value):
        return value
    raise PydanticCustomError("date_type", "a day is written YYYY-MM-DD, e.g. 2026-11-27")


Day = Annotated[dt.date, BeforeValidator(_day_text), AfterValidator(_sane_day)]
