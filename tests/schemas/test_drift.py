"""The generated JSON Schema files and AsyncAPI document must match the pydantic models."""

from __future__ import annotations

import json

import jsonschema
import pytest
import yaml

from engram.schemas import ALL_MODELS, ChatMessage
from engram.schemas.export import ASYNCAPI_FILE, CHANNELS, JSON_DIR, drifted_files


def test_generated_files_match_the_models() -> None:
    drift = drifted_files()
    assert not drift, f"regenerate with `python -m engram.schemas.export`: {[p.name for p in drift]}"


def test_every_model_has_a_schema_version_and_a_file() -> None:
    for model in ALL_MODELS:
        assert "schema_version" in model.model_fields, model.__name__
        assert (JSON_DIR / f"{model.__name__}.schema.json").exists()


def test_asyncapi_names_every_subject_and_points_at_existing_schemas() -> None:
    doc = yaml.safe_load(ASYNCAPI_FILE.read_text())
    assert doc["asyncapi"].startswith("3.")
    assert {c["address"] for c in doc["channels"].values()} == {a for a, _, _ in CHANNELS.values()}
    for message in doc["components"]["messages"].values():
        ref = message["payload"].get("$ref")
        if ref:
            assert (ASYNCAPI_FILE.parent / ref).exists(), ref


def test_json_schema_validates_what_a_non_python_publisher_would_send() -> None:
    schema = json.loads((JSON_DIR / "ChatMessage.schema.json").read_text())
    good = {"message_id": "m-1", "session_id": "abc", "role": "user", "content": "hi",
            "timestamp": "2026-01-01T00:00:00Z", "scopes": {"workspace": "repo"}}
    jsonschema.validate(good, schema)
    ChatMessage.model_validate(good)
    for bad in ({**good, "role": "robot"}, {**good, "session_id": "a.b"}, {k: v for k, v in good.items() if k != "content"}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
