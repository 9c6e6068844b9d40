"""Where a message breaks its contract, in words safe to store: field paths and error types.

Dead letters (``Engram-Dlq-Detail``), ``bad_request`` answers and log lines name the failing
fields. pydantic's messages may quote the input, so only the location and the error type are
used; and a location may itself be sender-chosen (an unknown field's name, a key of a
dict-valued field), so any path element that is not a field name of an engram schema is shown as
``<key>``. What the sender wrote never reaches the detail, names included.
"""

from __future__ import annotations

import functools

from pydantic import BaseModel, ValidationError


@functools.cache
def _field_names() -> frozenset[str]:
    """Every field name and alias of every pydantic model defined in the schemas package."""
    from . import memory, messages, relations  # noqa: F401 - imported for their models

    names: set[str] = set()
    stack = list(BaseModel.__subclasses__())
    seen: set[type] = set()
    while stack:
        model = stack.pop()
        if model in seen:
            continue
        seen.add(model)
        stack.extend(model.__subclasses__())
        if model.__module__.startswith(f"{__package__}."):  # this copy of the contract only
            for name, info in model.model_fields.items():
                names.update(n for n in (name, info.alias) if n)
    return frozenset(names)


def _element(part: object) -> str:
    if isinstance(part, int) or part == "[key]" or part in _field_names():
        return str(part)
    return "<key>"


def error_locations(exc: ValidationError, limit: int = 10, root: str = "<root>") -> str:
    """``"messages.0.role: literal_error; <key>: extra_forbidden"``: the first ``limit`` errors."""
    return "; ".join(f"{'.'.join(_element(p) for p in e['loc']) or root}: {e['type']}" for e in exc.errors()[:limit])
