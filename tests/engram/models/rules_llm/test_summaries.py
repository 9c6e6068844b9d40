"""Entity summaries on engram's summary-gate prompt: exactly the active facts."""

from __future__ import annotations

from graphiti_core.prompts.models import Message

from engram.models.rules_llm import RulesExtractorClient
from engram.models.rules_llm.summaries import summarize_entities
from engram.services.summary_gate.store import ActiveFact, NodeView
from engram.services.summary_gate.summarize import EntitySummaries, build_messages


def test_active_facts_in_order_deduplicated_without_retracted_ones() -> None:
    entities = [
        {"id": 3, "name": "Caroline", "facts": ["Caroline lives in Austin.", "caroline lives in austin", "Caroline paints"],
         "no_longer_true": ["Caroline lives in Boston."], "previous_summary": "Caroline lives in Boston.", "max_chars": 800},
        {"id": 4, "name": "Bob", "facts": ["Bob lives in Boston.", "Bob runs."], "no_longer_true": ["bob lives in boston"], "max_chars": 800},
    ]
    assert summarize_entities(entities) == [
        {"id": 3, "summary": "Caroline lives in Austin. Caroline paints."},
        {"id": 4, "summary": "Bob runs."},
    ]


def test_cut_at_a_sentence_boundary() -> None:
    entity = {"id": 0, "facts": ["One two three.", "Four five six.", "Seven eight nine."], "max_chars": 30}
    assert summarize_entities([entity]) == [{"id": 0, "summary": "One two three. Four five six."}]


async def test_the_summary_gate_prompt_is_answered() -> None:
    node = NodeView(uuid="u", name="Ann", summary="", meta=None, facts=[ActiveFact(uuid="f", fact="Ann uses Vim")])  # type: ignore[arg-type]
    messages: list[Message] = build_messages([node], max_facts=5, max_chars=100)
    response = await RulesExtractorClient().generate_response(messages, response_model=EntitySummaries)
    assert response == {"summaries": [{"id": 0, "summary": "Ann uses Vim."}]}
