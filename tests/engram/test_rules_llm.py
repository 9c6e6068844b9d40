"""The rules extractor behind graphiti's LLMClient: every response model graphiti's extraction
pipeline asks for, answered from prompts built by graphiti's own prompt library."""

from __future__ import annotations

import enum
import os
from datetime import datetime, timezone
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

os.environ.setdefault("GRAPHITI_TELEMETRY_ENABLED", "false")

from graphiti_core.cross_encoder.client import CrossEncoderClient  # noqa: E402
from graphiti_core.driver.driver import GraphDriver  # noqa: E402
from graphiti_core.graphiti_types import GraphitiClients  # noqa: E402
from graphiti_core.nodes import EpisodeType, EpisodicNode  # noqa: E402
from graphiti_core.prompts import prompt_library  # noqa: E402
from graphiti_core.prompts.dedupe_edges import EdgeDuplicate  # noqa: E402
from graphiti_core.prompts.dedupe_nodes import NodeDuplicate, NodeResolutions  # noqa: E402
from graphiti_core.prompts.extract_edges import BatchEdgeTimestamps, EdgeTimestamps, ExtractedEdges  # noqa: E402
from graphiti_core.prompts.extract_nodes import ExtractedEntities, SummarizedEntities  # noqa: E402
from graphiti_core.prompts.extract_nodes_and_edges import CombinedExtraction  # noqa: E402
from graphiti_core.prompts.models import Message  # noqa: E402
from graphiti_core.prompts.summarize_nodes import Summary  # noqa: E402
from graphiti_core.tracer import NoOpTracer  # noqa: E402
from graphiti_core.utils.maintenance.combined_extraction import extract_nodes_and_edges  # noqa: E402
from graphiti_core.utils.maintenance.node_operations import _build_entity_types_context  # noqa: E402
from graphiti_core.utils.text_utils import concatenate_timeline  # noqa: E402

from engram.models.hashing_embedder import HashingEmbedder  # noqa: E402
from engram.models.rules_llm import (  # noqa: E402
    MAX_ENTITIES_PER_MESSAGE,
    STOPWORDS,
    CallRecord,
    RulesExtractorClient,
    is_safe_entity_name,
    third_person,
)

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


# --- CombinedExtraction ------------------------------------------------------------------------


async def test_combined_extraction_coding_turn() -> None:
    client = RulesExtractorClient()
    response = await client.generate_response(
        combined_messages(CODING_TURN, CODING_TYPES),
        response_model=CombinedExtraction,
        prompt_name="extract_nodes_and_edges.extract_message",
    )
    CombinedExtraction.model_validate(response)
    ids = type_ids(CODING_TYPES)
    types = {e["name"]: e["entity_type_id"] for e in response["extracted_entities"]}
    assert list(types)[:2] == ["User", "Assistant"]  # speakers first
    expected = {
        "src/app.py": "File",
        "pyproject.toml": "File",
        "/etc/nginx/nginx.conf": "File",
        "pytest": "Tool",
        "pip": "Tool",
        "httpx": "Concept",
        "pydantic": "Concept",
        "pydantic==2.14": "Concept",
        "httpx 0.28": "Concept",
        "ModuleNotFoundError": "Error",
        "OSError: [Errno 98]": "Error",
    }
    for name, type_name in expected.items():
        assert types.get(name) == ids[type_name], (name, types)
    # "Traceback" is only a fallback when no error type is named; the errno message is no name
    assert "Traceback" not in types and "Address" not in types

    got = triples(response)
    assert ("User", "RUNS", "pytest") in got
    assert ("User", "RUNS", "src/app.py") in got
    assert ("pydantic", "USES_VERSION", "pydantic==2.14") in got
    assert ("httpx", "USES_VERSION", "httpx 0.28") in got
    assert ("pip", "INSTALLED", "httpx") in got
    assert ("Assistant", "FIXES", "src/app.py") in got
    assert ("ModuleNotFoundError", "OCCURRED_IN", "src/app.py") in got
    assert ("/etc/nginx/nginx.conf", "RELATES_TO", "OSError: [Errno 98]") in got
    # first person becomes the speaker, so each fact stands alone
    assert fact_of(response, "User", "RUNS", "pytest") == (
        "User gets ModuleNotFoundError: No module named 'httpx' when User runs pytest on src/app.py."
    )
    assert all(e["episode_indices"] == [0] for e in response["edges"])
    assert client.failures == {} and client.unhandled == {}


async def test_combined_extraction_locomo_chat_turn() -> None:
    client = RulesExtractorClient()
    response = await client.generate_response(combined_messages(CHAT_TURN, CHAT_TYPES), response_model=CombinedExtraction)
    ids = type_ids(CHAT_TYPES)
    types = {e["name"]: e["entity_type_id"] for e in response["extracted_entities"]}
    assert types["Caroline"] == ids["Person"] and types["Melanie"] == ids["Person"]
    assert types["Sweden"] == ids["Place"]
    assert types["LGBTQ support group"] == ids["Entity"]
    assert types["Melanie's kids"] == ids["Person"]
    assert "May 2023" in types and "Google" in types and "painting" in types and "pottery" in types
    got = triples(response)
    assert ("Caroline", "ATTENDED", "LGBTQ support group") in got
    assert ("Melanie", "LIKES", "painting") in got
    assert ("Melanie's kids", "LIKES", "pottery") in got
    assert ("Melanie", "LIVES_IN", "Sweden") in got
    assert ("Melanie", "WORKS_AT", "Google") in got
    # "Wow, that's cool, Caroline!": Caroline is the listener, not an argument -- no fact
    assert not any({s, t} == {"Melanie", "Caroline"} for s, _, t in got)
    assert fact_of(response, "Caroline", "ATTENDED", "LGBTQ support group") == (
        "Caroline went to a LGBTQ support group yesterday and it was so powerful."
    )
    assert fact_of(response, "Melanie", "LIKES", "painting") == "Melanie loves painting and Melanie's kids love pottery."
    assert not any(n in types for n in ("It", "Wow", "I", "We"))


async def test_only_current_messages_are_extracted() -> None:
    # engram's template examples (custom instructions) and previous messages name things too
    instructions = "Use specific names (`services/extractor/preprocessing.py`, `pytest`, `KeyError: 'group_id'`)."
    previous = ["user (Caroline): I use Django and live in Paris.", "assistant: Run `ruff check src/`."]
    content = "user (Caroline): Hi Melanie, I fixed app/main.py with mypy."
    response = await RulesExtractorClient().generate_response(
        combined_messages(content, CODING_TYPES, instructions, previous), response_model=CombinedExtraction
    )
    assert {e["name"] for e in response["extracted_entities"]} == {"Caroline", "Melanie", "app/main.py", "mypy"}
    assert ("Caroline", "FIXES", "app/main.py") in triples(response)


async def test_combined_extraction_without_custom_types_uses_the_default_type() -> None:
    response = await RulesExtractorClient().generate_response(combined_messages(CHAT_TURN), response_model=CombinedExtraction)
    assert {e["entity_type_id"] for e in response["extracted_entities"]} == {0}
    assert ("Caroline", "ATTENDED", "LGBTQ support group") in triples(response)


async def test_combined_extraction_multi_episode_indices_and_context_episodes() -> None:
    def episode(content: str, day: int) -> EpisodicNode:
        return EpisodicNode(
            name=f"e{day}", group_id="g", source=EpisodeType.message, source_description="chat",
            content=content, valid_at=datetime(2023, 5, day, tzinfo=timezone.utc),
        )

    first = episode("Caroline: I moved to Boston.", 1)
    context_only = episode("Melanie: I visited Tokyo.", 2)
    second = episode("Caroline: I work at Google.", 3)
    content = concatenate_timeline([first, second], [first, context_only, second])
    assert "[CONTEXT EPISODE]" in content
    response = await RulesExtractorClient().generate_response(combined_messages(content), response_model=CombinedExtraction)
    names = {e["name"] for e in response["extracted_entities"]}
    assert "Tokyo" not in names and "Melanie" not in names  # context is never extracted from
    by_triple = {(e["source_entity_name"], e["relation_type"], e["target_entity_name"]): e["episode_indices"] for e in response["edges"]}
    assert by_triple[("Caroline", "LIVES_IN", "Boston")] == [0]
    assert by_triple[("Caroline", "WORKS_AT", "Google")] == [1]


# --- the separate two-call path ----------------------------------------------------------------


async def test_extracted_entities_then_extracted_edges() -> None:
    client = RulesExtractorClient()
    nodes_context = {
        "episode_content": CHAT_TURN,
        "episode_timestamp": REF.isoformat(),
        "previous_episodes": [{"content": "Caroline: Hi Melanie!", "timestamp": REF.isoformat()}],
        "custom_extraction_instructions": "",
        "entity_types": _build_entity_types_context(CHAT_TYPES),
        "source_description": "chat",
    }
    entities = await client.generate_response(
        prompt_library.extract_nodes.extract_message(nodes_context),
        response_model=ExtractedEntities,
        prompt_name="extract_nodes.extract_message",
    )
    ExtractedEntities.model_validate(entities)
    names = [e["name"] for e in entities["extracted_entities"]]
    assert names[:2] == ["Caroline", "Melanie"]
    assert {"LGBTQ support group", "Sweden", "Google", "pottery"} <= set(names)
    assert all(e["episode_indices"] == [0] for e in entities["extracted_entities"])

    # the edge prompt gets graphiti's node list; endpoints must come from it only
    given = [n for n in names if n != "Google"] + ["It", "Paris"]
    edges_context = {
        "episode_content": CHAT_TURN,
        "nodes": [{"name": n, "entity_types": ["Entity"]} for n in given],
        "previous_episodes": [],
        "reference_time": REF,
        "edge_types": [],
        "strict_edge_types": False,
        "custom_extraction_instructions": "",
    }
    edges = await client.generate_response(
        prompt_library.extract_edges.edge(edges_context), response_model=ExtractedEdges, prompt_name="extract_edges.edge"
    )
    ExtractedEdges.model_validate(edges)
    endpoints = {e["source_entity_name"] for e in edges["edges"]} | {e["target_entity_name"] for e in edges["edges"]}
    assert endpoints <= set(given) - {"It", "Paris"}
    by_triple = {(e["source_entity_name"], e["relation_type"], e["target_entity_name"]): e for e in edges["edges"]}
    attended = by_triple[("Caroline", "ATTENDED", "LGBTQ support group")]
    assert attended["valid_at"] == "2023-05-07T00:00:00Z"  # "yesterday" relative to REFERENCE_TIME
    assert by_triple[("Melanie", "LIVES_IN", "Sweden")]["valid_at"] == "2023-05-01T00:00:00Z"
    assert ("Melanie's kids", "LIKES", "pottery") in by_triple
    assert [c.prompt_name for c in client.calls] == ["extract_nodes.extract_message", "extract_edges.edge"]


async def test_extract_text_and_json_prompts() -> None:
    client = RulesExtractorClient()
    base = {
        "episode_timestamp": REF.isoformat(),
        "previous_episodes": [],
        "custom_extraction_instructions": "",
        "entity_types": _build_entity_types_context(CODING_TYPES),
        "source_description": "notes",
    }
    text = await client.generate_response(
        prompt_library.extract_nodes.extract_text({**base, "episode_content": "The deploy uses docker compose and reads deploy/nginx.conf."}),
        response_model=ExtractedEntities,
    )
    assert {e["name"] for e in text["extracted_entities"]} == {"docker compose", "deploy/nginx.conf"}
    as_json = await client.generate_response(
        prompt_library.extract_nodes.extract_json({**base, "episode_content": '{"user": "Jordan Lee", "service": "FastAPI on Kubernetes", "file": "app/main.py"}'}),
        response_model=ExtractedEntities,
    )
    assert {"Jordan Lee", "FastAPI", "Kubernetes", "app/main.py"} <= {e["name"] for e in as_json["extracted_entities"]}


# --- node dedupe -------------------------------------------------------------------------------


async def test_node_resolutions() -> None:
    extracted = ["Caroline", "LGBTQ support groups", "Sweden", "Java", "pyproject.toml", "Dr. Who?"]
    context = {
        "extracted_nodes": [
            {"id": i, "name": n, "entity_type": ["Entity", "Tool"] if n == "Java" else ["Entity"], "entity_type_description": "x"}
            for i, n in enumerate(extracted)
        ],
        "existing_nodes": [
            {"candidate_id": 0, "name": "lgbtq support group", "entity_types": ["Entity"], "summary": ""},
            {"candidate_id": 1, "name": "CAROLINE", "entity_types": ["Entity", "Person"], "summary": "Caroline likes art"},
            {"candidate_id": 2, "name": "Swedish", "entity_types": ["Entity"], "summary": ""},
            {"candidate_id": 3, "name": "Java", "entity_types": ["Entity", "Place"], "summary": "An island"},
            {"candidate_id": 4, "name": "pyproject.toml", "entity_types": ["Entity"], "summary": ""},
            {"candidate_id": 5, "name": "Dr Who", "entity_types": ["Entity"], "summary": ""},
        ],
        "episode_content": CHAT_TURN,
        "previous_episodes": [],
    }
    response = await RulesExtractorClient().generate_response(
        prompt_library.dedupe_nodes.nodes(context), response_model=NodeResolutions, prompt_name="dedupe_nodes.nodes"
    )
    resolutions = NodeResolutions.model_validate(response).entity_resolutions
    assert [r.id for r in resolutions] == list(range(len(extracted)))
    assert [r.name for r in resolutions] == extracted
    # case, plural "s", punctuation: duplicates; a similar word or a different type: not
    assert [r.duplicate_candidate_id for r in resolutions] == [1, 0, -1, -1, 4, 5]


async def test_node_duplicate_single_prompt() -> None:
    context = {
        "previous_episodes": [],
        "episode_content": CHAT_TURN,
        "extracted_node": {"name": "Melanie", "entity_types": ["Entity"]},
        "entity_type_description": {},
        "existing_nodes": [{"candidate_id": 0, "name": "Mel", "entity_types": ["Entity"]}, {"candidate_id": 1, "name": "melanie", "entity_types": ["Entity"]}],
    }
    response = await RulesExtractorClient().generate_response(prompt_library.dedupe_nodes.node(context), response_model=NodeDuplicate)
    assert NodeDuplicate.model_validate(response).duplicate_candidate_id == 1


# --- edge dedupe and contradictions ------------------------------------------------------------


def resolve_edge_messages(new: str, existing: list[str], candidates: list[str]) -> list[Message]:
    # the context _dedupe_extracted_edge builds: continuous idx over both lists
    context = {
        "existing_edges": [{"idx": i, "fact": f} for i, f in enumerate(existing)],
        "new_edge": new,
        "edge_invalidation_candidates": [{"idx": len(existing) + i, "fact": f} for i, f in enumerate(candidates)],
    }
    return prompt_library.dedupe_edges.resolve_edge(context)


@pytest.mark.parametrize(
    ("new", "existing", "candidates", "duplicates", "contradicted"),
    [
        # same normalised text: duplicate
        ("Caroline moved to Sweden in May 2023", ["Caroline moved to Sweden in May 2023.", "Caroline likes Sweden."], [], [0], []),
        # polarity
        ("Caroline no longer uses Vim.", ["Caroline uses Vim."], ["Caroline loves painting."], [], [0]),
        ("Caroline stopped using Vim.", [], ["Caroline uses Vim.", "Caroline uses Emacs for notes."], [], [0]),
        ("User does not use Docker anymore.", ["User uses Docker for deploys."], [], [], [0]),
        # replacement
        ("User switched from requests to httpx.", [], ["User uses requests for HTTP calls.", "User uses pytest."], [], [0]),
        ("User uses httpx instead of requests.", [], ["User uses requests."], [], [0]),
        ("Caroline moved from Boston to Austin.", [], ["Caroline lives in Boston.", "Caroline works at Google."], [], [0]),
        # single-valued relations with a different object
        ("Caroline lives in Austin.", ["Caroline lives in Boston."], [], [], [0]),
        ("Alice works at Acme Corp as a senior engineer.", ["Alice works at Acme Corp as a software engineer."], [], [], [0]),
        ("Caroline works at Google.", [], ["Melanie works at Apple.", "Caroline lives in Boston."], [], []),
        # versions of one package
        ("User upgraded pydantic to 2.15.", [], ["User pinned pydantic==2.14 in pyproject.toml.", "User pinned httpx==0.28."], [], [0]),
        # compatible facts: neither
        ("Bob ran 3 miles on Wednesday.", ["Bob ran 5 miles on Tuesday."], [], [], []),
        ("Caroline loves painting.", [], ["Caroline loves pottery.", "Caroline uses Vim."], [], []),
    ],
)
async def test_edge_duplicate(new: str, existing: list[str], candidates: list[str], duplicates: list[int], contradicted: list[int]) -> None:
    response = await RulesExtractorClient().generate_response(
        resolve_edge_messages(new, existing, candidates), response_model=EdgeDuplicate, prompt_name="dedupe_edges.resolve_edge"
    )
    assert EdgeDuplicate.model_validate(response) == EdgeDuplicate(duplicate_facts=duplicates, contradicted_facts=contradicted)


async def test_contradicted_index_counts_across_both_lists() -> None:
    response = await RulesExtractorClient().generate_response(
        resolve_edge_messages("Caroline no longer lives in Boston.", ["Caroline likes Boston."], ["Caroline visited Paris.", "Caroline lives in Boston."]),
        response_model=EdgeDuplicate,
    )
    assert response == {"duplicate_facts": [], "contradicted_facts": [2]}


# --- timestamps --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fact", "valid_at", "invalid_at"),
    [
        ("Caroline went to a LGBTQ support group yesterday.", "2023-05-07T00:00:00Z", None),
        ("Caroline moved to Sweden on 2022-03-04.", "2022-03-04T00:00:00Z", None),
        ("Caroline moved to Sweden on 8 May 2021.", "2021-05-08T00:00:00Z", None),
        ("Caroline moved to Sweden on May 8, 2021.", "2021-05-08T00:00:00Z", None),
        ("Melanie painted a lake sunrise in May 2022.", "2022-05-01T00:00:00Z", None),
        ("Melanie painted a lake sunrise last year.", "2022-01-01T00:00:00Z", None),
        ("Melanie started pottery 3 weeks ago.", "2023-04-17T00:00:00Z", None),
        ("Melanie worked at Google from 2019-01-01 until March 2021.", "2019-01-01T00:00:00Z", "2021-03-01T00:00:00Z"),
        ("The server is down until 2023-06-01.", None, "2023-06-01T00:00:00Z"),
        ("Melanie loves painting.", None, None),
    ],
)
async def test_edge_timestamps(fact: str, valid_at: str | None, invalid_at: str | None) -> None:
    messages = prompt_library.extract_edges.extract_timestamps({"fact": fact, "reference_time": REF.isoformat()})
    response = await RulesExtractorClient().generate_response(messages, response_model=EdgeTimestamps)
    assert response == {"valid_at": valid_at, "invalid_at": invalid_at}


async def test_batch_edge_timestamps_keep_order_and_per_fact_reference() -> None:
    facts = [
        {"fact": "Caroline went to a support group yesterday.", "reference_time": REF.isoformat()},
        {"fact": "Caroline went to a support group yesterday.", "reference_time": "2020-01-10T08:00:00+00:00"},
        {"fact": "Melanie loves painting.", "reference_time": REF.isoformat()},
        {"fact": "Caroline went to a support group yesterday.", "reference_time": "unknown"},
    ]
    response = await RulesExtractorClient().generate_response(
        prompt_library.extract_edges.extract_timestamps_batch({"facts": facts}), response_model=BatchEdgeTimestamps
    )
    assert [t["valid_at"] for t in response["timestamps"]] == ["2023-05-07T00:00:00Z", "2020-01-09T00:00:00Z", None, None]


# --- anything else -----------------------------------------------------------------------------


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


# --- stopwords, caps, determinism ------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "safe"),
    [
        ("Is", False), ("It", False), ("This", False), ("The", False), ("I", False), ("We", False),
        ("IT", False), ("it's", False), ("I'm", False), ("It Is", False), ("  the ", False), ("x", False),
        ("...", False), ("a" * 81, False), ("Caroline", True), ("src/app.py", True), ("The Beatles", True),
        ("pydantic==2.14", True), ("Is It Real", True),
    ],
)
def test_is_safe_entity_name(name: str, safe: bool) -> None:
    assert is_safe_entity_name(name) is safe


async def test_stopword_only_names_are_never_extracted() -> None:
    content = (
        "user: It is what it is. This is it. The end. Is it? We did. I am. They were. "
        "That Is The One. `It` and `This`. THE IT IS.\n\nassistant: It works. Those are here. You and I."
    )
    client = RulesExtractorClient()
    response = await client.generate_response(combined_messages(content), response_model=CombinedExtraction)
    assert {e["name"] for e in response["extracted_entities"]} == {"User", "Assistant"}
    entities = await client.generate_response(
        prompt_library.extract_nodes.extract_message(
            {"episode_content": content, "previous_episodes": [], "custom_extraction_instructions": "",
             "entity_types": _build_entity_types_context(None), "source_description": ""}
        ),
        response_model=ExtractedEntities,
    )
    assert {e["name"] for e in entities["extracted_entities"]} == {"User", "Assistant"}


CASED_STOPWORDS = sorted(STOPWORDS) + [w.capitalize() for w in sorted(STOPWORDS)] + [w.upper() for w in sorted(STOPWORDS)]
VOCAB = CASED_STOPWORDS + (
    "Caroline Melanie Sweden Google src/app.py pyproject.toml pytest `pip install httpx` pydantic==2.14 "
    "ModuleNotFoundError OSError: [Errno 98] Traceback went to loves uses moved to works at my dad "
    "8 May 2023 yesterday ``` `x` LGBTQ support group"
).split() + [".", ",", "!", "?", ":", ";", "\n", "\n\n", "user:", "assistant (Bob):", "Caroline:", "'", '"', "(", ")", "-"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(VOCAB), max_size=80), st.text(max_size=60))
def test_random_text_never_yields_unsafe_names(words: list[str], noise: str) -> None:
    client = RulesExtractorClient()
    content = " ".join(words) + " " + noise
    response = client.respond(combined_messages(content), CombinedExtraction)
    CombinedExtraction.model_validate(response)
    names = [e["name"] for e in response["extracted_entities"]]
    assert len(names) == len({n.lower() for n in names})
    for name in names:
        assert is_safe_entity_name(name), name
        assert name.strip().lower() not in STOPWORDS
    for edge in response["edges"]:
        assert edge["source_entity_name"] in names and edge["target_entity_name"] in names
        assert edge["source_entity_name"] != edge["target_entity_name"]
        assert 0 < len(edge["fact"]) <= 300
        assert edge["relation_type"] == edge["relation_type"].upper()
    assert client.failures == {}


async def test_caps_on_entities_per_message_and_fact_length() -> None:
    files = " ".join(f"src/mod{i}.py" for i in range(40))
    long_tail = " and then " + "very " * 100 + "long."
    content = f"user: I changed {files} today{long_tail}\n\nassistant: I ran pytest on src/extra.py."
    response = await RulesExtractorClient().generate_response(combined_messages(content), response_model=CombinedExtraction)
    names = [e["name"] for e in response["extracted_entities"]]
    user_files = [n for n in names if n.startswith("src/mod")]
    assert len(user_files) == MAX_ENTITIES_PER_MESSAGE - 1  # the speaker counts too
    assert "src/extra.py" in names and "pytest" in names  # the next message has its own budget
    assert all(len(e["fact"]) <= 300 for e in response["edges"])
    assert any(e["fact"].endswith("...") for e in response["edges"])


async def test_same_prompt_same_answer() -> None:
    a, b = RulesExtractorClient(), RulesExtractorClient()
    for content in (CODING_TURN, CHAT_TURN):
        first = await a.generate_response(combined_messages(content, CODING_TYPES), response_model=CombinedExtraction)
        again = await a.generate_response(combined_messages(content, CODING_TYPES), response_model=CombinedExtraction)
        other = await b.generate_response(combined_messages(content, CODING_TYPES), response_model=CombinedExtraction)
        assert first == again == other
        assert first["edges"]
    dup = [await c.generate_response(resolve_edge_messages("User switched from requests to httpx.", [], ["User uses requests."]), response_model=EdgeDuplicate) for c in (a, b)]
    assert dup[0] == dup[1] == {"duplicate_facts": [], "contradicted_facts": [0]}


def test_third_person_rewrite() -> None:
    assert third_person("I love painting and my kids love pottery.", "Melanie") == "Melanie loves painting and Melanie's kids love pottery."
    assert third_person("I'm swamped, I've been busy and I fixed it for me.", "Bob") == "Bob is swamped, Bob has been busy and Bob fixed it for Bob."
    assert third_person("I also go there.", "Ann") == "Ann also goes there."
    assert third_person("I love it.", None) == "I love it."


# --- token accounting --------------------------------------------------------------------------


async def test_token_accounting_records_every_call() -> None:
    words = lambda text: len(text.split())  # noqa: E731
    client = RulesExtractorClient(count_tokens=words)
    messages = combined_messages(CHAT_TURN)
    response = await client.generate_response(messages, response_model=CombinedExtraction, prompt_name="extract_nodes_and_edges.extract_message")
    assert len(client.calls) == 1
    record = client.calls[0]
    assert isinstance(record, CallRecord)
    assert record.prompt_name == "extract_nodes_and_edges.extract_message"
    assert record.response_model == "CombinedExtraction"
    # generate_response appended the JSON schema and the language note to the messages it sent
    assert "Respond with a JSON object" in messages[-1].content
    assert record.prompt_tokens == sum(words(m.content) for m in messages)
    import json

    assert record.completion_tokens == words(json.dumps(response, ensure_ascii=False))
    usage = client.token_tracker.get_usage()["extract_nodes_and_edges.extract_message"]
    assert (usage.call_count, usage.total_input_tokens, usage.total_output_tokens) == (1, record.prompt_tokens, record.completion_tokens)


async def test_default_token_counter_is_a_real_tokenizer_or_says_it_estimates() -> None:
    client = RulesExtractorClient()
    await client.generate_response([Message(role="system", content="s"), Message(role="user", content="hello world")], response_model=Summary)
    assert client.token_counting in ("cl100k", "chars/4")
    assert client.calls[0].prompt_tokens > 0 and client.calls[0].response_model == "Summary"


# --- graphiti's own extraction function, end to end --------------------------------------------


class NoOpCrossEncoder(CrossEncoderClient):
    async def rank(self, query: str, passages: list[str]) -> list[tuple[str, float]]:
        return [(p, 0.0) for p in passages]


class UnusedDriver(GraphDriver):
    """Satisfies GraphitiClients' type check; any use fails the test."""

    provider = None  # type: ignore[assignment]

    def _fail(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("extract_nodes_and_edges must not touch the graph driver")

    execute_query = session = close = delete_all_indexes = build_indices_and_constraints = _fail  # type: ignore[assignment]


async def test_graphiti_extract_nodes_and_edges_end_to_end() -> None:
    llm = RulesExtractorClient()
    clients = GraphitiClients(
        driver=UnusedDriver(), llm_client=llm, embedder=HashingEmbedder(), cross_encoder=NoOpCrossEncoder(), tracer=NoOpTracer()
    )
    episode = EpisodicNode(
        name="turn-1", group_id="engram-test", source=EpisodeType.message, source_description="chat turn",
        content=CHAT_TURN, valid_at=REF,
    )
    nodes, edges, index_map = await extract_nodes_and_edges(clients, episode, previous_episodes=[], entity_types=CHAT_TYPES)
    by_name = {n.name: n for n in nodes}
    assert {"Caroline", "Melanie", "LGBTQ support group", "Sweden", "Google", "painting", "pottery"} <= set(by_name)
    assert "Person" in by_name["Caroline"].labels and "Place" in by_name["Sweden"].labels
    assert all(is_safe_entity_name(n.name) for n in nodes)
    names = {n.uuid: n.name for n in nodes}
    got = {(names[e.source_node_uuid], e.name, names[e.target_node_uuid]): e for e in edges}
    attended = got[("Caroline", "ATTENDED", "LGBTQ support group")]
    assert attended.episodes == [episode.uuid]
    assert attended.valid_at == datetime(2023, 5, 7, tzinfo=timezone.utc)  # from the timestamp batch call
    assert got[("Melanie", "LIVES_IN", "Sweden")].valid_at == datetime(2023, 5, 1, tzinfo=timezone.utc)
    # a fact is its whole sentence, so the sentence's date dates every fact drawn from it
    assert got[("Melanie", "WORKS_AT", "Google")].valid_at == datetime(2023, 5, 1, tzinfo=timezone.utc)
    assert got[("Melanie", "LIKES", "painting")].valid_at is None
    assert set(index_map) == {n.uuid for n in nodes}
    # one combined call plus one timestamp batch; nothing unanswered
    assert [c.response_model for c in llm.calls] == ["CombinedExtraction", "BatchEdgeTimestamps"]
    assert [c.prompt_name for c in llm.calls] == ["extract_nodes_and_edges.extract_message", "extract_edges.extract_timestamps_batch"]
    assert llm.failures == {} and llm.unhandled == {}


async def test_redaction_placeholders_never_become_entities() -> None:
    turn = ("user (Ada): Deploy it to staging with DATABASE_URL=postgres://app:[REDACTED:url_password]@db:5432/x "
            "and the key [REDACTED:openai_key] please.\n\nassistant: Deployed to staging with Terraform.")
    response = await RulesExtractorClient().generate_response(
        combined_messages(turn, CODING_TYPES), response_model=CombinedExtraction,
        prompt_name="extract_nodes_and_edges.extract_message",
    )
    names = [e["name"] for e in response["extracted_entities"]]
    assert names, "nothing extracted"
    assert not [n for n in names if "REDACTED" in n.upper()], names


async def test_greetings_with_a_name_are_not_facts() -> None:
    turn = ("user (Caroline): Wow, Melanie! Thanks, Melanie! I went to a LGBTQ support group yesterday "
            "and it was so powerful.\n\nassistant (Melanie): Hey Caroline! Totally agree, Caroline.")
    response = await RulesExtractorClient().generate_response(
        combined_messages(turn, CHAT_TYPES), response_model=CombinedExtraction,
        prompt_name="extract_nodes_and_edges.extract_message",
    )
    facts = [e["fact"] for e in response["edges"]]
    assert facts, "the support-group sentence should still give a fact"
    assert any("support group" in f for f in facts)
    assert not [f for f in facts if f.rstrip("!.").split(",")[0].strip().lower() in {"wow", "thanks", "hey", "totally agree"}], facts


def test_first_person_negations_survive_the_third_person_rewrite() -> None:
    """Found by a summary-gate test: "I no longer live in Boston" became "Alice noes longer live
    in Boston", which lost the negation, so the old fact was never invalidated."""
    from engram.models.rules_llm import contradicts, third_person

    assert third_person("I no longer live in Boston.", "Alice") == "Alice no longer lives in Boston."
    assert third_person("I do not like tea.", "Alice") == "Alice does not like tea."
    assert third_person("I never go there.", "Alice") == "Alice never goes there."
    assert contradicts("Alice no longer lives in Boston.", "Alice lives in Boston.")


def test_a_name_used_to_address_the_listener_is_no_argument() -> None:
    from engram.models.rules_llm import _Mention, _vocative

    def mention(text: str, name: str) -> _Mention:
        start = text.index(name)
        return _Mention(name.lower(), start, start + len(name), "person")

    for text, name in [("Thanks, Melanie!", "Melanie"), ("Wow, Caroline, way to go!", "Caroline"),
                       ("Caroline, did you see it?", "Caroline"), ("Hey Mel!", "Mel")]:
        assert _vocative(text, mention(text, name)), text
    for text, name in [("I met Caroline at the park.", "Caroline"), ("Caroline went to Boston.", "Caroline"),
                       ("I painted it for Melanie.", "Melanie")]:
        assert not _vocative(text, mention(text, name)), text
