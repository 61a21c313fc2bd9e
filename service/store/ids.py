"""Job and model ids as users type them: the full id, or any unique prefix of it (as git takes commit ids).

The CLI's tables show ids that a narrow terminal truncates; a prefix that names one row is as good as its id.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.store.tables import JobRow, ModelRow

MIN_PREFIX_CHARS = 4  # shorter prefixes match too much of a busy store to be worth resolving
SHOWN_CANDIDATES = 5  # an ambiguous prefix's answer names this many of its matches


class UnknownId(LookupError):
    """No row has this id, or an id starting with it (among the rows the caller may see)."""


class AmbiguousId(LookupError):
    """Several rows' ids start with this prefix; `candidates` holds some of them, in id order."""

    def __init__(self, given: str, candidates: list[str]) -> None:
        super().__init__(f"{given!r} is the start of several ids: {', '.join(candidates)}")
        self.candidates = candidates


def resolve_id(
    session: Session, table: type[JobRow] | type[ModelRow], given: str, owner_key_id: str | None = None
) -> str:
    """The full id of the one row of `table` whose id is `given` or starts with it (at least MIN_PREFIX_CHARS).

    With `owner_key_id` only that key's rows are candidates, so a key that may read only its own rows learns
    nothing of others' ids. Raises UnknownId when none matches, AmbiguousId when several do."""
    owned = () if owner_key_id is None else (table.owner_key_id == owner_key_id,)
    exact = session.scalar(select(table.id).where(table.id == given, *owned))
    if exact is not None:
        return exact
    if len(given) < MIN_PREFIX_CHARS:
        raise UnknownId(given)
    # autoescape: a '%' or '_' typed by the user is a literal character, not a LIKE wildcard
    query = select(table.id).where(table.id.startswith(given, autoescape=True), *owned)
    matches = list(session.scalars(query.order_by(table.id).limit(SHOWN_CANDIDATES + 1)))
    if not matches:
        raise UnknownId(given)
    if len(matches) > 1:
        raise AmbiguousId(given, matches[:SHOWN_CANDIDATES])
    return matches[0]
