"""Minimal valid instances of arbitrary pydantic response models (defaults, empty
lists/strings/dicts, ``None`` for optionals, 0/False for numbers/bools): the answer to every
response model the client has no handler for.
"""

from __future__ import annotations

import enum
import types as _pytypes
import typing
from datetime import datetime
from typing import Any

from pydantic import BaseModel


def _minimal_value(annotation: Any, depth: int = 0) -> Any:
    if depth > 6:
        return None
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation is type(None):
        return None
    if origin is typing.Union or origin is _pytypes.UnionType:
        if type(None) in args:
            return None
        return _minimal_value(args[0], depth + 1)
    if origin is typing.Annotated:
        return _minimal_value(args[0], depth + 1)
    if origin is typing.Literal:
        return args[0]
    if origin in (list, set, frozenset, tuple) or annotation in (list, set, frozenset, tuple):
        return []
    if origin is dict or annotation is dict:
        return {}
    if isinstance(annotation, type):
        if issubclass(annotation, BaseModel):
            return minimal_instance(annotation, depth + 1)
        if issubclass(annotation, enum.Enum):
            return next(iter(annotation)).value
        if issubclass(annotation, bool):
            return False
        if issubclass(annotation, int):
            return 0
        if issubclass(annotation, float):
            return 0.0
        if issubclass(annotation, str):
            return ""
        if issubclass(annotation, datetime):
            return None
    return None


def minimal_instance(model: type[BaseModel], depth: int = 0) -> dict[str, Any]:
    """The smallest valid instance of ``model`` as a dict: defaults where the model has them,
    else empty containers/strings, ``None`` for optionals, 0/False for numbers and bools."""
    data: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        if not info.is_required():
            continue
        key = info.alias or name
        data[key] = _minimal_value(info.annotation, depth)
    try:
        return model.model_validate(data).model_dump(mode="json")
    except Exception:  # a constrained field we could not satisfy: return the raw guess
        return data
