"""A deterministic rules extractor behind graphiti-core's ``LLMClient`` interface.

**This is not a language model.** :class:`RulesExtractorClient` is engram's offline default
"LLM": it reads the prompt text that graphiti-core 0.31 builds, finds the blocks it needs
(``<CURRENT MESSAGES>``, ``<ENTITY TYPES>``, ``<ENTITIES>``, ``<EXISTING FACTS>``, ...) and
answers with regexes and word lists. No model, no network, no randomness: the same prompt
always gets the same answer. It exists so that engram runs (and its tests run) with no model
at hand; its recall and precision are far below a real LLM's.

One module per concern (each module's docstring says what it does and its limits):

* :mod:`.client`: the ``LLMClient`` (dispatch on ``response_model.__name__``, token accounting);
* :mod:`.prompts`: reading graphiti's prompt blocks and one handler per response model;
* :mod:`.episodes`: episodes -> speaker blocks -> sentences;
* :mod:`.entities`: entity candidates, their categories and ``entity_type_id``;
* :mod:`.relations` (verbs -> relations, negation and change cues) and :mod:`.facts`
  (clauses -> facts); :mod:`.extraction` runs entities then facts over a document;
* :mod:`.coreference`: "it" -> the one thing named just before (same message or the previous
  one, incl. the last of PREVIOUS MESSAGES), only when exactly one candidate fits;
* :mod:`.dates`: dates and relative time expressions, ``valid_at``/``invalid_at``;
* :mod:`.dedupe`: node and edge resolution, contradictions;
* :mod:`.changes`: change phrases ("switched S to Y", "replaced X with Y", "Y instead of X",
  "no longer") that end an earlier fact, for :mod:`.dedupe`;
* :mod:`.summaries`: engram's summary-gate answers;
* :mod:`.minimal`: minimal valid instances for response models it does not handle;
* :mod:`.vocabulary` (word lists) and :mod:`.text` (limits and small text helpers).

Response models answered (see :data:`.prompts.HANDLERS`):

* ``CombinedExtraction`` (``extract_nodes_and_edges.extract_message``): entities + facts from
  ``<CURRENT MESSAGES>`` in one pass. ``[CONTEXT EPISODE]`` sections and PREVIOUS MESSAGES are
  never extracted from: previous messages teach speaker names (to type them Person), and the
  last one is where a referring "it" in the first current message may find its thing. With
  engram's ``<REFERENCE TIME>`` / ``<KNOWN FACTS>`` blocks each fact also gets its dates and the
  known facts it restates or replaces, by the timestamp and ``resolve_edge`` rules below
  (:func:`.prompts.answer_turn_context`).
* ``ExtractedEntities`` (``extract_nodes.extract_message`` / ``extract_text`` / ``extract_json``)
  and ``ExtractedEdges`` (``extract_edges.edge``; endpoints are only names from the prompt's
  ``<ENTITIES>`` list, ``valid_at``/``invalid_at`` by the timestamp rules against
  ``<REFERENCE_TIME>``): the same logic split in two.
* ``NodeResolutions`` (``dedupe_nodes.nodes``) and ``NodeDuplicate`` (``dedupe_nodes.node``),
  ``EdgeDuplicate`` (``dedupe_edges.resolve_edge``): see :mod:`.dedupe`; ``EdgeDuplicates``
  (engram's batched ``dedupe_edges.resolve_edges``, services/extractor/dedupe_batch.py): each of
  its questions by the same rule.
* ``EdgeTimestamps`` / ``BatchEdgeTimestamps``: dates mentioned in the fact text, else nulls.
* ``EntitySummaries`` (engram's summary-gate prompt): see :mod:`.summaries`.
* anything else (summaries, attributes, ``response_model=None``): a minimal valid instance
  built from the pydantic model (defaults, empty lists/strings/dicts, ``None`` for optionals,
  0/False for numbers/bools), counted in ``self.unhandled[<model name>]``.

Known limits (heuristics, not language understanding):

* coreference is narrow (:mod:`.coreference`): "I/me/my/we" -> speaker, and a referring "it"
  ("I bought it", "it stands for ...") -> the one thing named just before, when exactly one
  fits and its clause names nothing else; "she", "they", "that", "the city" are never resolved;
* capitalised-word detection misses lower-case names, takes capitalised common words
  mid-sentence ("the Best day"), and drops a name that only ever starts sentences ("Jordan
  went home."); nicknames are separate entities ("Mel" vs "Melanie");
  person/place/organisation typing is cue-based and often falls back to ``Entity``;
* the tool/library vocabulary is fixed; unknown tools are found only in backticks or install
  commands; lower-case objects are taken only after a few verbs;
* relations come from the nearest mapped verb, so long sentences with several verbs, lists,
  or nested clauses get coarse or wrong relations and actors; "and" between two clauses is not
  split; the third-person rewrite of "I <verb>" is a suffix rule;
* dates: no times of day outside ISO timestamps, no ranges other than "from X to Y"/"until X", relative
  expressions in English and common Turkish forms only (engram/text/temporal.py's rules), years alone only after "in/since/..."
* contradictions are lexical: paraphrases ("resides in" vs "lives in" work, "left Boston for
  Austin" does not), and the 75% overlap threshold can both miss and over-fire; change phrases
  (:mod:`.changes`) need the subject in the same words; measured on a labelled change /
  restatement / unrelated corpus by ``bench/fact_changes.py``;
* prompt parsing relies on graphiti 0.31's tag names (tests/engram/models/rules_llm/
  test_prompt_blocks.py fails when they change); a message containing a closing tag such as
  ``</CURRENT MESSAGES>`` cuts its block short.
"""

from engram.models.rules_llm.changes import supersedes
from engram.models.rules_llm.client import CallRecord, RulesExtractorClient
from engram.models.rules_llm.dates import fact_timestamps, find_dates
from engram.models.rules_llm.dedupe import contradicts, resolve_edge, resolve_node
from engram.models.rules_llm.facts import third_person
from engram.models.rules_llm.minimal import minimal_instance
from engram.models.rules_llm.relations import VERB_RELATIONS
from engram.models.rules_llm.text import (
    MAX_ENTITIES,
    MAX_ENTITIES_PER_MESSAGE,
    MAX_FACT_CHARS,
    MAX_FACTS,
    MAX_NAME_CHARS,
    is_safe_entity_name,
)
from engram.models.rules_llm.vocabulary import STOPWORDS

__all__ = [
    "MAX_ENTITIES",
    "MAX_ENTITIES_PER_MESSAGE",
    "MAX_FACTS",
    "MAX_FACT_CHARS",
    "MAX_NAME_CHARS",
    "CallRecord",
    "RulesExtractorClient",
    "STOPWORDS",
    "VERB_RELATIONS",
    "contradicts",
    "fact_timestamps",
    "find_dates",
    "is_safe_entity_name",
    "minimal_instance",
    "resolve_edge",
    "resolve_node",
    "supersedes",
    "third_person",
]
