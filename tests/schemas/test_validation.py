"""schemas/validation.py: a rejection names where, never what the sender wrote (names included)."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from engram.schemas import ChatMessage
from engram.schemas.validation import error_locations


def rejection(model: type[BaseModel], data: object) -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        model.model_validate(data)
    return caught.value


def test_field_paths_and_error_types_are_named() -> None:
    exc = rejection(ChatMessage, {"session_id": "s", "message_id": "m", "role": "bogus", "content": "secret text",
                                  "timestamp": "2026-01-01T00:00:00Z"})
    assert error_locations(exc) == "role: literal_error"


def test_an_unknown_fields_name_is_not_repeated() -> None:
    """A dead letter's detail header named the field: ``"x\\r\\nNats-Rollup: all"``, or any text."""
    exc = rejection(ChatMessage, {"my password is hunter2": 1, "session_id": "s", "message_id": "m", "role": "user",
                                  "content": "c", "timestamp": "2026-01-01T00:00:00Z"})
    assert error_locations(exc) == "<key>: extra_forbidden"


def test_a_key_of_a_mapping_is_not_repeated() -> None:
    class Holder(BaseModel):  # "metadata": a field name of engram's schemas, so shown
        metadata: dict[str, int]

    exc = rejection(Holder, {"metadata": {"alice's diagnosis": "many"}})
    assert error_locations(exc) == "metadata.<key>: int_parsing"


def test_the_list_is_cut_and_an_empty_location_is_the_root() -> None:
    exc = rejection(ChatMessage, {})
    assert error_locations(exc, 2).count(";") == 1
    assert error_locations(rejection(ChatMessage, 5), root="body") == "body: model_type"
