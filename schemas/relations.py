"""The canonical relation vocabulary (seed 003): a small set of relation names given to
extraction (templates/default-session-turn.md, promotions) and used at recall time, where the
synonyms an LLM or the rules extractor produce are mapped onto them."""

from __future__ import annotations

import re

CANONICAL_RELATIONS: dict[str, tuple[str, ...]] = {
    # planning
    "DEPENDS_ON": ("REQUIRES", "NEEDS", "RELIES_ON", "DEPENDS"),
    "BLOCKED_BY": ("BLOCKED", "WAITING_ON", "WAITS_FOR"),
    "DECIDED": ("CHOSE", "DECIDED_TO", "SELECTED", "PICKED", "OPTED_FOR"),
    "RISK": ("RISKS", "THREATENS"),
    "MITIGATED_BY": ("MITIGATES", "ADDRESSED_BY"),
    "DONE": ("COMPLETED", "FINISHED", "RESOLVED"),
    "TODO": ("PLANS_TO", "WILL", "NEEDS_TO"),
    # code
    "TOUCHES": ("EDITS", "MODIFIES", "CHANGED", "UPDATED"),
    "DEFINED_IN": ("DECLARED_IN", "LOCATED_IN_FILE", "IN_FILE"),
    "USES": ("USING", "USE", "EMPLOYS", "UTILIZES", "RUNS_WITH"),
    "FIXES": ("FIXED", "RESOLVES", "REPAIRS", "PATCHES"),
    "CAUSES": ("CAUSED", "LEADS_TO", "RESULTS_IN", "TRIGGERS"),
    "TESTED_BY": ("TESTS", "COVERED_BY", "VERIFIED_BY"),
    # agent work
    "RAN": ("EXECUTED", "RUNS", "RAN_COMMAND"),
    "GENERATED": ("CREATED", "PRODUCED", "WROTE"),
    "FAILED_WITH": ("FAILS_WITH", "ERRORED_WITH", "RAISED", "THREW"),
    "VALIDATED_BY": ("CONFIRMED_BY", "APPROVED_BY"),
    # people
    "PREFERS": ("LIKES", "PREFERRED", "FAVORS"),
}
_SYNONYMS = {syn: canon for canon, syns in CANONICAL_RELATIONS.items() for syn in (canon, *syns)}


def canonical_relation(name: str | None) -> str | None:
    """The canonical relation for ``name`` (case and separators ignored), else ``name`` unchanged."""
    if not name:
        return name
    key = re.sub(r"[^A-Z0-9]+", "_", name.upper()).strip("_")
    return _SYNONYMS.get(key, name)


def vocabulary_text() -> str:
    """One line for prompts: the canonical names, comma-separated."""
    return ", ".join(CANONICAL_RELATIONS)
