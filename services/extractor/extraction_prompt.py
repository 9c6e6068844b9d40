"""engram's own combined extraction prompt: graphiti's ``extract_nodes_and_edges.extract_message``
rewritten to carry only what the model needs for one chat turn, and a leaner answer schema.

graphiti's combined prompt is ~2,790 cl100k tokens on a LoCoMo turn (bench/extraction_cost.py):
its fixed instructions (~1,170, much of it about multi-episode batches, ``[CONTEXT EPISODE]``
timelines and ``episode_indices``, which engram never sends: one episode per call), the JSON
schema graphiti's client appends (~550: ``$defs``, titles, descriptions repeating the prose),
engram's template (custom instructions), the one default entity type with its long description
(~110), the previous episodes and the turn. This prompt keeps graphiti's rules that a model
needs for one turn (speakers named, actor as source, self-contained facts with their details, no
pronoun or abstraction entities, no hedges, one fact per statement, previous messages only to
resolve references, language), adds one hint for invalidation (a change is stated as the new
state), and drops the rest. The schema (:class:`LeanCombinedExtraction`) has no descriptions, no
``$defs``, no ``episode_indices`` (graphiti defaults it to ``[0]``: the one episode) and no
``entity_type_id`` (the default ``Entity`` type is the only one engram uses; graphiti gets 0).

How it is wired, with graphiti unchanged:

* :data:`PROMPT_LIBRARY` is graphiti's own prompt-override mechanism
  (``create_prompt_library``): only ``extract_nodes_and_edges.extract_message`` is replaced, and
  only on the clients the combined stage uses (:func:`engram_clients`), so every other prompt is
  built exactly as before;
* :class:`LeanSchemaLLMClient` (the outermost wrapper of that stage's LLM client) hands the
  leaner response model down for engram's prompt (graphiti fixes the response model per prompt
  name), so the schema appended by graphiti's client, or sent as ``response_format`` by
  engram/models/openai_compat.py, is the lean one; the answer is validated against it and
  returned with the defaults filled in, which graphiti's ``CombinedExtraction`` reads.

What a turn adds (:class:`TurnContext`, through :func:`engram_clients`: graphiti builds the
context, so the pipeline hands these to the prompt builder): the turn's REFERENCE TIME, with a rule
asking each fact's ``valid_at`` / ``invalid_at``, and the group's KNOWN FACTS nearest the turn
(services/extractor/pipeline.py ``known_facts_for``), with a rule asking which of them each fact
``restates`` or ``replaces``. graphiti still asks its batched timestamp call and a
``resolve_edge`` call per fact with candidates; services/extractor/local_answers.py answers them
from this call's answer when the model already judged them (``asked_in`` reads back what was
asked), so a turn is one model call where graphiti's stages made three or more. All four fields
are optional in the schema: a model may leave them out, and then "none" is its answer.

With custom entity types (more than the default one) or edge types, which engram does not use,
the builder returns graphiti's own prompt and the schema is graphiti's.

The offline rules model (engram/models/rules_llm) reads ``<PREVIOUS MESSAGES>`` and
``<CURRENT MESSAGES>`` from this prompt as from graphiti's (the blocks keep their names and
content; previous episodes without their timestamps, which no rule reads), and answers
``CombinedExtraction`` (this response model keeps graphiti's class name); without an
``<ENTITY TYPES>`` block it assumes the one default type, as graphiti's list says.

Budget: :data:`FIXED_TOKEN_BUDGET` for everything but the turn, the previous episodes, the
custom instructions and the turn context (tests/services/extractor/test_extraction_prompt.py;
ten known facts, the reference time and their two rules add under 450 tokens).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any, NamedTuple

from graphiti_core.llm_client.config import ModelSize
from graphiti_core.prompts.extract_nodes_and_edges import extract_message as graphiti_extract_message
from graphiti_core.prompts.lib import create_prompt_library
from graphiti_core.prompts.models import ChatPrompt, Message
from graphiti_core.prompts.prompt_helpers import to_prompt_json
from pydantic import BaseModel
from pydantic.json_schema import SkipJsonSchema

from engram.models.delegating import DelegatingLLMClient

PROMPT_NAME = "extract_nodes_and_edges.extract_message"

SYSTEM = (
    "You build the long-term memory of an AI agent: from each conversation turn you extract the entities and "
    "facts the agent will need later. Only they remain, so each fact must stand alone."
)
"""Also how :class:`LeanSchemaLLMClient` recognises engram's prompt (the system message opens with it)."""

INSTRUCTIONS = """Extract the entities and the facts (edges between two entities) stated in CURRENT MESSAGES. PREVIOUS MESSAGES are context: use them only to resolve what the current messages refer to.

Entities:
- Each speaker, by the fullest name given ("User" only when there is none).
- Named people, organizations, places, products, projects, events, works, files, tools and errors; things and activities someone has or does ("road cycling"). The most specific noun phrase, at most 5 words; a possession, pet or creation by a possessive name ("Calvin's guitar").
- Not entities: pronouns and unresolved references ("the city", "this issue"), vague abstractions ("life", "luck", "time"), dates, times, amounts and durations (keep those in the fact), greetings, slogans, example values.
- List each entity once.

Facts:
- Cover every statement with content: preferences, opinions, plans, decisions and reasons, requests, feelings, experiences, advice, results. Skip content-free lines ("Hi!", "Thanks!").
- The actor (who says, does, wants, owns, plans or feels) is the source, what it concerns the target: both names from extracted_entities. Source = target only for a statement about one entity alone ("Evan has a knee injury.").
- fact: one plain sentence that names the entities (no pronouns), keeps the details (numbers, dates, names, versions) and the reason when one is given, and makes sense alone. One statement, one fact: a list in one statement stays in one fact.
- When something changed or ended ("moved to Porto", "stopped using X"), state the new state.
- Only what the messages say: no guesses, hedges ("seems to") or commentary.
- relation_type: an English SCREAMING_SNAKE_CASE label (WORKS_AT, LIVES_IN). Names and facts in the language of the messages."""

DATES = """- valid_at / invalid_at: when the fact began / stopped being true, ISO 8601, only when the messages say when (resolve "yesterday" or "last Friday" against REFERENCE TIME); else leave them out."""
"""Added with a reference time: the fact's dates come with it, so no second call dates them."""

KNOWN_NAMES = """- An entity that is one of KNOWN ENTITIES: write its known name exactly."""
"""Added with known entities: an existing entity is named as the graph names it, so graphiti
resolves it by its exact name and no node dedupe call asks about it."""

KNOWN = """- restates: the id of a KNOWN FACT that says the same thing. replaces: the ids of KNOWN FACTS that this fact shows are no longer true (a change, an end, a contradiction). Leave them out when there are none."""
"""Added with known facts: the fact's relation to what the graph holds comes with it, so no
dedupe call judges it (services/extractor/local_answers.py answers graphiti's from this)."""

CUSTOM_RULE = "They come from the owner of this graph and win over the rules above."

FIXED_TOKEN_BUDGET = 700
"""cl100k tokens of the prompt without the turn, the previous episodes, the custom instructions and
the turn context, schema included (622 when written, 681 with the four optional answer fields);
tests keep it under this."""


KNOWN_FACTS = 10
"""Known facts shown to the extraction call by default (``ENGRAM_EXTRACTION_KNOWN_FACTS``; chosen on
LoCoMo's tuning split, docs/architecture.md "The extraction call judges the facts it sees")."""


class LeanEntity(BaseModel):
    name: str
    entity_type_id: SkipJsonSchema[int] = 0


class LeanFact(BaseModel):
    source_entity_name: str
    target_entity_name: str
    relation_type: str
    fact: str
    # Optional, so a model may leave them out (a grammar-constrained server allows it): asked only
    # with a REFERENCE TIME / KNOWN FACTS block, and then an omitted one means "none".
    valid_at: str | None = None
    invalid_at: str | None = None
    restates: int | None = None
    replaces: list[int] = []


class CombinedExtraction(BaseModel):
    """graphiti's ``CombinedExtraction`` with only what one turn's answer needs (see the module).
    Same class name: the rules model answers by response-model name, and log lines show it."""

    extracted_entities: list[LeanEntity]
    edges: list[LeanFact]

    @classmethod
    def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
        """The schema flattened (no ``$defs``) and without titles: what the model is shown."""
        return compact_schema(super().model_json_schema(*args, **kwargs))


LeanCombinedExtraction = CombinedExtraction


def compact_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with every ``$ref`` inlined, ``title``/``description``/``default`` dropped and
    an optional value's ``anyOf`` of one type and null written as a type list."""
    defs = schema.get("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return walk(defs[ref.rsplit("/", 1)[1]])
            options = node.get("anyOf")
            if (isinstance(options, list) and len(options) == 2 and {"type": "null"} in options
                    and all(set(o) == {"type"} and isinstance(o["type"], str) for o in options)):
                rest = {k: v for k, v in node.items() if k != "anyOf"}
                node = {**rest, "type": [o["type"] for o in options if o["type"] != "null"] + ["null"]}
            return {k: walk(v) for k, v in node.items() if k not in ("$defs", "title", "description", "default")}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    return walk(schema)


def _engram_applies(context: dict[str, Any]) -> bool:
    types = context.get("entity_types") or []
    return len(types) == 1 and types[0].get("entity_type_id") == 0 and not context.get("edge_types")


@dataclass(frozen=True)
class TurnContext:
    """What engram adds to graphiti's context for one turn's extraction call (graphiti builds the
    context, so it comes in through the prompt builder: :func:`engram_clients`)."""

    reference_time: datetime | None = None
    """When the turn was told: the model resolves "yesterday" against it and dates each fact."""
    known_facts: tuple[str, ...] = ()
    """Facts the group already holds that the turn may restate or change, nearest first
    (services/extractor/pipeline.py ``known_facts_for``): their ids are their positions."""
    known_entities: tuple[str, ...] = ()
    """The names of those facts' entities, as the graph holds them."""


def known_facts_json(facts: Iterable[str]) -> str:
    return to_prompt_json([{"id": i, "fact": f} for i, f in enumerate(facts)])


def build_prompt(context: dict[str, Any], turn: TurnContext | None = None) -> ChatPrompt:
    """engram's combined extraction prompt for graphiti's context (graphiti's own prompt when the
    context has custom entity or edge types). With ``turn``: its reference time (the facts' dates
    are asked with them) and its known facts (each fact's ``restates`` / ``replaces`` are asked)."""
    if not _engram_applies(context):
        return ChatPrompt.from_messages(graphiti_extract_message(context))
    turn = turn or TurnContext()
    custom = (context.get("custom_extraction_instructions") or "").strip()
    custom_section = f"\n<CUSTOM INSTRUCTIONS>\n{custom}\n</CUSTOM INSTRUCTIONS>\n{CUSTOM_RULE}\n" if custom else ""
    previous = [{"content": ep["content"]} for ep in context.get("previous_episodes") or []]
    rules = INSTRUCTIONS
    known = ""
    if turn.known_entities:
        # the entity rule goes with the entity rules, before "Facts:"
        rules = rules.replace("\n\nFacts:", "\n" + KNOWN_NAMES + "\n\nFacts:", 1)
        known += f"\n<KNOWN ENTITIES>\n{to_prompt_json(list(turn.known_entities))}\n</KNOWN ENTITIES>\n"
    if turn.known_facts:
        rules += "\n" + KNOWN
        known += f"\n<KNOWN FACTS>\n{known_facts_json(turn.known_facts)}\n</KNOWN FACTS>\n"
    when = ""
    if turn.reference_time is not None:
        rules += "\n" + DATES
        when = f"\n<REFERENCE TIME>\n{turn.reference_time.isoformat()}\n</REFERENCE TIME>\n"
    user = f"""{rules}
{custom_section}
<PREVIOUS MESSAGES>
{to_prompt_json(previous)}
</PREVIOUS MESSAGES>
{known}{when}
<CURRENT MESSAGES>
{context['episode_content']}
</CURRENT MESSAGES>
"""
    return ChatPrompt.from_messages([Message(role="system", content=SYSTEM), Message(role="user", content=user)])


PROMPT_LIBRARY = create_prompt_library({"extract_nodes_and_edges": {"extract_message": build_prompt}})
"""graphiti's prompt library with engram's combined extraction prompt; every other prompt graphiti's."""


def is_engram_prompt(messages: list[Any]) -> bool:
    return bool(messages) and str(getattr(messages[0], "content", "")).startswith(SYSTEM)


class LeanSchemaLLMClient(DelegatingLLMClient):
    """For engram's combined prompt, asks with :class:`LeanCombinedExtraction` instead of graphiti's
    response model and returns the answer validated, with its defaults filled in (graphiti's
    ``CombinedExtraction`` reads it); every other call passes unchanged."""

    async def generate_response(  # type: ignore[override]
        self,
        messages: list[Any],
        response_model: Any = None,
        max_tokens: int | None = None,
        model_size: ModelSize = ModelSize.medium,
        group_id: str | None = None,
        prompt_name: str | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        if prompt_name != PROMPT_NAME or not is_engram_prompt(messages):
            return await super().generate_response(
                messages, response_model, max_tokens, model_size, group_id, prompt_name, **kwargs
            )
        answer = await super().generate_response(
            messages, LeanCombinedExtraction, max_tokens, model_size, group_id, prompt_name, **kwargs
        )
        return LeanCombinedExtraction.model_validate(answer).model_dump(mode="json")


def engram_clients(clients: Any, turn: TurnContext | None = None) -> Any:
    """``clients`` for the combined extraction call: engram's prompt (with ``turn``'s reference
    time and known facts) and its lean schema."""
    library = PROMPT_LIBRARY if turn is None else create_prompt_library(
        {"extract_nodes_and_edges": {"extract_message": partial(build_prompt, turn=turn)}})
    return clients.model_copy(update={"prompt_library": library,
                                      "llm_client": LeanSchemaLLMClient(clients.llm_client)})


_KNOWN_BLOCK = re.compile(r"<KNOWN FACTS>\s*(.*?)\s*</KNOWN FACTS>", re.S)
_KNOWN_NAMES_BLOCK = re.compile(r"<KNOWN ENTITIES>\s*(.*?)\s*</KNOWN ENTITIES>", re.S)
_PREVIOUS_BLOCK = re.compile(r"<PREVIOUS MESSAGES>\s*(.*?)\s*</PREVIOUS MESSAGES>", re.S)
_CURRENT_BLOCK = re.compile(r"<CURRENT MESSAGES>\s*(.*?)\s*</CURRENT MESSAGES>", re.S)


def _json_block(pattern: re.Pattern[str], text: str) -> list[Any]:
    m = pattern.search(text)
    try:
        rows = json.loads(m.group(1)) if m else []
    except ValueError:
        return []
    return rows if isinstance(rows, list) else []


class Asked(NamedTuple):
    """What an engram extraction prompt asked beyond entities and facts."""

    dates: bool
    """Each fact's valid_at / invalid_at (the prompt gave a REFERENCE TIME)."""
    known_facts: list[str]
    """The KNOWN FACTS by id, which a new fact may restate or replace."""
    known_entities: list[str]
    """The KNOWN ENTITIES' names, which the model was asked to use exactly."""


def asked_in(messages: list[Any]) -> Asked:
    """What an engram extraction prompt asked beyond entities and facts (nothing for any other
    prompt). Read back from the prompt by services/extractor/local_answers.py, which sees the call
    but not the pipeline."""
    if not is_engram_prompt(messages):
        return Asked(False, [], [])
    user = str(getattr(messages[-1], "content", ""))
    known = [str(r.get("fact", "")) for r in _json_block(_KNOWN_BLOCK, user) if isinstance(r, dict)]
    names = [str(n) for n in _json_block(_KNOWN_NAMES_BLOCK, user)]
    return Asked("<REFERENCE TIME>" in user, known, names)


def turn_in(messages: list[Any]) -> tuple[str, list[str]] | None:
    """The CURRENT MESSAGES text and the PREVIOUS MESSAGES turns of an engram extraction prompt,
    read back (None for any other prompt, or without a CURRENT MESSAGES block). The last block of
    each: the custom instructions come before them."""
    if not is_engram_prompt(messages):
        return None
    user = str(getattr(messages[-1], "content", ""))
    current = _CURRENT_BLOCK.search(user[user.rfind("<CURRENT MESSAGES>"):])
    if current is None:
        return None
    previous = _json_block(_PREVIOUS_BLOCK, user[user.rfind("<PREVIOUS MESSAGES>"):])
    return current.group(1), [str(r.get("content", "")) for r in previous if isinstance(r, dict)]


def schema_text() -> str:
    """The schema as graphiti's client appends it to the prompt (for token counts)."""
    return json.dumps(LeanCombinedExtraction.model_json_schema())
