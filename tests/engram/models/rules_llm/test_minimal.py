"""Minimal instances for response models without a handler."""

from __future__ import annotations

import enum
from typing import Literal

from graphiti_core.prompts.extract_nodes import SummarizedEntities
from graphiti_core.prompts.models import Message
from graphiti_core.prompts.summarize_nodes import Summary
from pydantic import BaseModel, Field

from engram.models.rules_llm import RulesExtractorClient


class Mood(enum.Enum):
    HAPPY = "happy"
    SAD = "sad"


class Inner(BaseModel):
    label: str


class Odd(BaseModel):
    title: str
    count: int
    ratio: float
    flag: bool
    kind: Literal["a", "b"]
    mood: Mood
    tags: list[str]
    extra: dict[str, int]
    inner: Inner
    maybe: str | None
    note: str = "default"
    items: list[int] = Field(default_factory=lambda: [1])


async def test_unhandled_models_get_a_minimal_valid_instance_and_are_counted() -> None:
    client = RulesExtractorClient()
    msgs = lambda: [Message(role="system", content="You summarise."), Message(role="user", content="Summarise Caroline.")]  # noqa: E731
    assert await client.generate_response(msgs(), response_model=Summary) == {"summary": ""}
    assert await client.generate_response(msgs(), response_model=SummarizedEntities) == {"summaries": []}
    odd = await client.generate_response(msgs(), response_model=Odd)
    assert Odd.model_validate(odd) == Odd(
        title="", count=0, ratio=0.0, flag=False, kind="a", mood=Mood.HAPPY, tags=[], extra={}, inner=Inner(label=""), maybe=None
    )
    assert await client.generate_response(msgs(), response_model=Summary) == {"summary": ""}
    assert await client.generate_response(msgs()) == {}
    assert client.unhandled == {"Summary": 2, "SummarizedEntities": 1, "Odd": 1, "None": 1}
    assert client.failures == {}
