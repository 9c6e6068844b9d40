"""The prompt blocks the rules client reads must be in graphiti's prompts: fails when graphiti
renames, drops or reformats one.

Each case renders a prompt with graphiti's own prompt library (and engram's combined extraction
and summary-gate prompt builders) from the context graphiti's code passes, answers it, and records every block the
handler looked up (``prompts._block``): the blocks found must be exactly the expected ones, and
the text blocks must hold what the context put there. Every response model the client handles
has a case, so a new handler without one fails too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from graphiti_core.nodes import EpisodeType, EpisodicNode
from graphiti_core.prompts import prompt_library
from graphiti_core.prompts.dedupe_edges import EdgeDuplicate
from graphiti_core.prompts.dedupe_nodes import NodeDuplicate, NodeResolutions
from graphiti_core.prompts.extract_edges import BatchEdgeTimestamps, EdgeTimestamps, ExtractedEdges
from graphiti_core.prompts.extract_nodes import ExtractedEntities
from graphiti_core.prompts.extract_nodes_and_edges import CombinedExtraction
from graphiti_core.prompts.models import Message
from graphiti_core.utils.maintenance.node_operations import _build_entity_types_context
from graphiti_core.utils.text_utils import concatenate_timeline
from pydantic import BaseModel

from engram.models.rules_llm import RulesExtractorClient, prompts
from engram.schemas.memory import TranscriptLine
from engram.services.extractor.dedupe_batch import DedupeQuestion, EdgeDuplicates, batch_messages
from engram.services.extractor.extraction_prompt import build_prompt
from engram.services.sessions.close import HybridSessionSummary, UserFacts, facts_messages, summary_messages
from engram.services.summary_gate.store import ActiveFact, NodeView
from engram.services.summary_gate.summarize import EntitySummaries, build_messages
from tests.engram.models.rules_llm.helpers import CHAT_TURN, CHAT_TYPES, REF

PREVIOUS = [{"content": "user (Caroline): Hi Melanie!", "timestamp": REF.isoformat()}]
FACT = "Caroline went to a LGBTQ support group yesterday."
JSON_EPISODE = '{"user": "Jordan Lee", "service": "FastAPI on Kubernetes"}'
TEXT_EPISODE = "The deploy uses docker compose and reads deploy/nginx.conf."
SESSION_TRANSCRIPT = [TranscriptLine(message_id="m1", role="user", text="My favourite editor is Neovim.", timestamp=REF)]


def timeline() -> str:
    """The episode content graphiti's combined extraction sends: two episodes, one context."""

    def episode(content: str, day: int) -> EpisodicNode:
        return EpisodicNode(name=f"e{day}", group_id="g", source=EpisodeType.message, source_description="chat",
                            content=content, valid_at=REF.replace(day=day))

    first, context, second = episode(CHAT_TURN, 1), episode("Melanie: I visited Tokyo.", 2), episode("Caroline: I work at Google.", 3)
    return concatenate_timeline([first, second], [first, context, second])


def nodes_context(content: str) -> dict[str, Any]:
    # the context extract_nodes builds (node_operations.extract_nodes)
    return {
        "episode_content": content,
        "episode_timestamp": REF.isoformat(),
        "previous_episodes": PREVIOUS,
        "custom_extraction_instructions": "",
        "entity_types": _build_entity_types_context(CHAT_TYPES),
        "source_description": "chat",
    }


@dataclass(frozen=True)
class Case:
    prompt: str  # graphiti's prompt name
    model: type[BaseModel]
    messages: Callable[[], list[Message]]
    found: frozenset[str]  # the blocks the handler must find
    text: dict[str, str]  # block -> what it must hold, for the blocks read as text


CASES = [
    Case(
        # engram's own combined prompt (services/extractor/extraction_prompt.py): no ENTITY TYPES block
        # (the rules client then assumes the one default type), the same two message blocks
        "engram: extract_nodes_and_edges.extract_message", CombinedExtraction,
        lambda: build_prompt({
            "episode_content": CHAT_TURN, "previous_episodes": PREVIOUS, "custom_extraction_instructions": "x",
            "entity_types": _build_entity_types_context(None), "edge_types": [], "strict_edge_types": False,
        }).as_messages(),
        frozenset({"CURRENT MESSAGES", "PREVIOUS MESSAGES"}),
        {"CURRENT MESSAGES": CHAT_TURN, "PREVIOUS MESSAGES": '[{"content": "user (Caroline): Hi Melanie!"}]'},
    ),
    Case(
        "extract_nodes_and_edges.extract_message", CombinedExtraction,
        lambda: prompt_library.extract_nodes_and_edges.extract_message({
            "episode_content": timeline(), "previous_episodes": PREVIOUS, "custom_extraction_instructions": "",
            "entity_types": _build_entity_types_context(CHAT_TYPES), "edge_types": [], "strict_edge_types": False,
        }),
        frozenset({"CURRENT MESSAGES", "ENTITY TYPES", "PREVIOUS MESSAGES"}),
        {"CURRENT MESSAGES": timeline()},
    ),
    Case(
        "extract_nodes.extract_message", ExtractedEntities,
        lambda: prompt_library.extract_nodes.extract_message(nodes_context(CHAT_TURN)),
        frozenset({"CURRENT MESSAGE", "ENTITY TYPES", "PREVIOUS MESSAGES"}),
        {"CURRENT MESSAGE": CHAT_TURN},
    ),
    Case(
        "extract_nodes.extract_text", ExtractedEntities,
        lambda: prompt_library.extract_nodes.extract_text(nodes_context(TEXT_EPISODE)),
        frozenset({"TEXT", "ENTITY TYPES"}),
        {"TEXT": TEXT_EPISODE},
    ),
    Case(
        "extract_nodes.extract_json", ExtractedEntities,
        lambda: prompt_library.extract_nodes.extract_json(nodes_context(JSON_EPISODE)),
        frozenset({"JSON", "ENTITY TYPES"}),
        {"JSON": JSON_EPISODE},
    ),
    Case(
        "extract_edges.edge", ExtractedEdges,
        lambda: prompt_library.extract_edges.edge({
            "episode_content": CHAT_TURN, "nodes": [{"name": n, "entity_types": ["Entity"]} for n in ("Caroline", "LGBTQ support group")],
            "previous_episodes": [p["content"] for p in PREVIOUS], "reference_time": REF, "edge_types": [],
            "strict_edge_types": False, "custom_extraction_instructions": "",
        }),
        frozenset({"CURRENT_MESSAGE", "REFERENCE_TIME", "ENTITIES", "PREVIOUS_MESSAGES"}),
        {"CURRENT_MESSAGE": CHAT_TURN},
    ),
    Case(
        "dedupe_nodes.nodes", NodeResolutions,
        lambda: prompt_library.dedupe_nodes.nodes({
            "extracted_nodes": [{"id": 0, "name": "Caroline", "entity_type": ["Entity"], "entity_type_description": "x"}],
            "existing_nodes": [{"candidate_id": 0, "name": "caroline", "entity_types": ["Entity"], "summary": ""}],
            "episode_content": CHAT_TURN, "previous_episodes": [],
        }),
        frozenset({"ENTITIES", "EXISTING ENTITIES"}),
        {},
    ),
    Case(
        "dedupe_nodes.node", NodeDuplicate,
        lambda: prompt_library.dedupe_nodes.node({
            "previous_episodes": [], "episode_content": CHAT_TURN, "entity_type_description": {},
            "extracted_node": {"name": "Melanie", "entity_types": ["Entity"]},
            "existing_nodes": [{"candidate_id": 0, "name": "melanie", "entity_types": ["Entity"]}],
        }),
        frozenset({"NEW ENTITY", "EXISTING ENTITIES"}),
        {},
    ),
    Case(
        "dedupe_edges.resolve_edge", EdgeDuplicate,
        lambda: prompt_library.dedupe_edges.resolve_edge({
            "existing_edges": [{"idx": 0, "fact": "Caroline lives in Boston."}], "new_edge": "Caroline lives in Austin.",
            "edge_invalidation_candidates": [{"idx": 1, "fact": "Caroline works at Google."}],
        }),
        frozenset({"EXISTING FACTS", "FACT INVALIDATION CANDIDATES", "NEW FACT"}),
        {"NEW FACT": "Caroline lives in Austin."},
    ),
    Case(
        # engram's batched dedupe (services/extractor/dedupe_batch.py): one JSON question a line
        "dedupe_edges.resolve_edges", EdgeDuplicates,
        lambda: batch_messages([
            DedupeQuestion("Caroline lives in Austin.", [(0, "Caroline lives in Boston.")], [(1, "Caroline works at Google.")]),
            DedupeQuestion("Melanie paints.", [], [(0, "Melanie plays the violin.")]),
        ]),
        frozenset({"QUESTIONS"}),
        {},
    ),
    Case(
        "extract_edges.extract_timestamps", EdgeTimestamps,
        lambda: prompt_library.extract_edges.extract_timestamps({"fact": FACT, "reference_time": REF.isoformat()}),
        frozenset({"FACT", "REFERENCE TIME"}),
        {"FACT": FACT},
    ),
    Case(
        "extract_edges.extract_timestamps_batch", BatchEdgeTimestamps,
        lambda: prompt_library.extract_edges.extract_timestamps_batch({"facts": [{"fact": FACT, "reference_time": REF.isoformat()}]}),
        frozenset({"FACTS"}),
        {},
    ),
    Case(
        "summary_gate.refresh", EntitySummaries,
        lambda: build_messages(
            [NodeView(uuid="u", name="Caroline", summary="", meta=None, facts=[ActiveFact(uuid="f", fact=FACT)])],  # type: ignore[arg-type]
            max_facts=10, max_chars=300,
        ),
        frozenset({"ENTITIES"}),
        {},
    ),
    Case(
        "sessions.summary", HybridSessionSummary,
        lambda: summary_messages(SESSION_TRANSCRIPT, ["An earlier session."], 500),
        frozenset({"TRANSCRIPT"}),
        {},
    ),
    Case(
        "sessions.facts", UserFacts,
        lambda: facts_messages(SESSION_TRANSCRIPT, 300),
        frozenset({"TRANSCRIPT"}),
        {},
    ),
]


def blocks_read(messages: list[Message], model: type[BaseModel], monkeypatch: pytest.MonkeyPatch) -> dict[str, str | None]:
    """Every block the handler for ``model`` looked up while answering, with what it got."""
    read: dict[str, str | None] = {}
    real = prompts._block

    def recording(prompt: str, tag: str) -> str | None:
        read[tag] = real(prompt, tag)
        return read[tag]

    with monkeypatch.context() as m:
        m.setattr(prompts, "_block", recording)
        client = RulesExtractorClient()
        client.respond(messages, model)
    assert client.failures == {} and client.unhandled == {}
    return read


def test_every_handled_response_model_has_a_case() -> None:
    assert {c.model.__name__ for c in CASES} == set(prompts.HANDLERS)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.prompt)
def test_graphiti_prompts_hold_the_blocks_the_handlers_read(case: Case, monkeypatch: pytest.MonkeyPatch) -> None:
    read = blocks_read(case.messages(), case.model, monkeypatch)
    found = {tag for tag, text in read.items() if text is not None}
    assert found == case.found, f"{case.prompt}: found {sorted(found)}, looked for {sorted(read)}"
    for tag, expected in case.text.items():
        assert read[tag] is not None and read[tag].strip() == expected.strip(), tag


def test_a_renamed_block_is_noticed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above can fail: the same prompt with one tag renamed loses that block."""
    case = next(c for c in CASES if c.prompt == "extract_nodes_and_edges.extract_message")
    renamed = [Message(role=m.role, content=m.content.replace("CURRENT MESSAGES>", "CURRENT_EPISODES>")) for m in case.messages()]
    found = {tag for tag, text in blocks_read(renamed, case.model, monkeypatch).items() if text is not None}
    assert "CURRENT MESSAGES" not in found and found != case.found
