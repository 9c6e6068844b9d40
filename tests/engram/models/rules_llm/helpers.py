"""Shared inputs for the rules extractor's tests: turns, entity types, and graphiti's own prompt builders."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from graphiti_core.prompts import prompt_library
from graphiti_core.prompts.models import Message
from graphiti_core.utils.maintenance.node_operations import _build_entity_types_context
from pydantic import BaseModel


REF = datetime(2023, 5, 8, 13, 56, tzinfo=timezone.utc)


CODING_TURN = """user: I get ModuleNotFoundError: No module named 'httpx' when I run pytest on src/app.py. We pin pydantic==2.14 in pyproject.toml.

assistant: Run `pip install httpx` and add httpx 0.28 to pyproject.toml. I fixed src/app.py so it imports httpx lazily.
```
Traceback (most recent call last):
  File "src/app.py", line 3, in <module>
    import httpx
ModuleNotFoundError: No module named 'httpx'
```
Also /etc/nginx/nginx.conf had OSError: [Errno 98] Address already in use."""


CHAT_TURN = """user (Caroline): I went to a LGBTQ support group yesterday and it was so powerful. It is great.

assistant (Melanie): Wow, that's cool, Caroline! I love painting and my kids love pottery. We moved to Sweden in May 2023 and I work at Google."""


class File(BaseModel):
    """Source files, configuration files, documents, directories."""


class Tool(BaseModel):
    """CLI commands, programs, services."""


class Error(BaseModel):
    """Exceptions, failing tests, error codes."""


class Concept(BaseModel):
    """Libraries, frameworks, patterns."""


class Person(BaseModel):
    """A human being."""


class Place(BaseModel):
    """A location."""


CODING_TYPES = {"File": File, "Tool": Tool, "Error": Error, "Concept": Concept}


CHAT_TYPES = {"Person": Person, "Place": Place}


def combined_messages(
    content: str,
    entity_types: dict[str, type[BaseModel]] | None = None,
    instructions: str = "",
    previous: list[str] | None = None,
) -> list[Message]:
    # the context extract_nodes_and_edges builds (combined_extraction.py)
    context = {
        "episode_content": content,
        "previous_episodes": [{"content": p, "timestamp": REF.isoformat()} for p in previous or []],
        "custom_extraction_instructions": instructions,
        "entity_types": _build_entity_types_context(entity_types),
        "edge_types": [],
        "strict_edge_types": False,
    }
    return prompt_library.extract_nodes_and_edges.extract_message(context)


def type_ids(entity_types: dict[str, type[BaseModel]] | None) -> dict[str, int]:
    return {t["entity_type_name"]: t["entity_type_id"] for t in _build_entity_types_context(entity_types)}


def triples(response: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {(e["source_entity_name"], e["relation_type"], e["target_entity_name"]) for e in response["edges"]}


def fact_of(response: dict[str, Any], source: str, relation: str, target: str) -> str:
    for e in response["edges"]:
        if (e["source_entity_name"], e["relation_type"], e["target_entity_name"]) == (source, relation, target):
            return e["fact"]
    raise AssertionError(f"no fact {source} -{relation}-> {target} in {triples(response)}")


def resolve_edge_messages(new: str, existing: list[str], candidates: list[str]) -> list[Message]:
    # the context _dedupe_extracted_edge builds: continuous idx over both lists
    context = {
        "existing_edges": [{"idx": i, "fact": f} for i, f in enumerate(existing)],
        "new_edge": new,
        "edge_invalidation_candidates": [{"idx": len(existing) + i, "fact": f} for i, f in enumerate(candidates)],
    }
    return prompt_library.dedupe_edges.resolve_edge(context)
