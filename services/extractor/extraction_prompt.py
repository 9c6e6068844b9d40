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

With custom entity types (more than the default one) or edge types, which engram does not use,
the builder returns graphiti's own prompt and the schema is graphiti's.

The offline rules model (engram/models/rules_llm) reads ``<PREVIOUS MESSAGES>`` and
``<CURRENT MESSAGES>`` from this prompt as from graphiti's (the blocks keep their names and
content; previous episodes without their timestamps, which no rule reads), and answers
``CombinedExtraction`` (this response model keeps graphiti's class name); without an
``<ENTITY TYPES>`` block it assumes the one default type, as graphiti's list says.

Budget: :data:`FIXED_TOKEN_BUDGET` for everything but the turn, the previous episodes and the
custom instructions (tests/services/extractor/test_extraction_prompt.py).
"""

from __future__ import annotations

import json
from typing import Any

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

CUSTOM_RULE = "They come from the owner of this graph and win over the rules above."

FIXED_TOKEN_BUDGET = 700
"""cl100k tokens of the prompt without the turn, the previous episodes and the custom instructions,
schema included (622 when written); tests keep it under this."""


class LeanEntity(BaseModel):
    name: str
    entity_type_id: SkipJsonSchema[int] = 0


class LeanFact(BaseModel):
    source_entity_name: str
    target_entity_name: str
    relation_type: str
    fact: str


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
    """``schema`` with every ``$ref`` inlined and ``title``/``description`` dropped."""
    defs = schema.get("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return walk(defs[ref.rsplit("/", 1)[1]])
            return {k: walk(v) for k, v in node.items() if k not in ("$defs", "title", "description")}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    return walk(schema)


def _engram_applies(context: dict[str, Any]) -> bool:
    types = context.get("entity_types") or []
    return len(types) == 1 and types[0].get("entity_type_id") == 0 and not context.get("edge_types")


def build_prompt(context: dict[str, Any]) -> ChatPrompt:
    """engram's combined extraction prompt for graphiti's context (graphiti's own prompt when the
    context has custom entity or edge types)."""
    if not _engram_applies(context):
        return ChatPrompt.from_messages(graphiti_extract_message(context))
    custom = (context.get("custom_extraction_instructions") or "").strip()
    custom_section = f"\n<CUSTOM INSTRUCTIONS>\n{custom}\n</CUSTOM INSTRUCTIONS>\n{CUSTOM_RULE}\n" if custom else ""
    previous = [{"content": ep["content"]} for ep in context.get("previous_episodes") or []]
    user = f"""{INSTRUCTIONS}
{custom_section}
<PREVIOUS MESSAGES>
{to_prompt_json(previous)}
</PREVIOUS MESSAGES>

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


def engram_clients(clients: Any) -> Any:
    """``clients`` for the combined extraction call: engram's prompt and its lean schema."""
    return clients.model_copy(update={"prompt_library": PROMPT_LIBRARY,
                                      "llm_client": LeanSchemaLLMClient(clients.llm_client)})


def schema_text() -> str:
    """The schema as graphiti's client appends it to the prompt (for token counts)."""
    return json.dumps(LeanCombinedExtraction.model_json_schema())
