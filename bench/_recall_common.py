"""Shared by bench/recall_quality.py and bench/recall.py: LoCoMo questions and their evidence ids,
sentences for synthetic facts, percentiles, and a recall request over NATS."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench._smoke import locomo_path
from schemas import RecallRequest, RecallResponse, subjects

LOCOMO = locomo_path()  # ENGRAM_LOCOMO, else ../shared/data/locomo/locomo7.json
# LoCoMo's QA categories (as numbered in the released JSON): 5 (adversarial, unanswerable) is
# left out by the benches.
CATEGORY_NAMES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
_SESSION_KEY = re.compile(r"^session_(\d+)$")
_DIA_ID = re.compile(r"D:?(\d+):(\d+)")


def load_conversations(path: Path = LOCOMO) -> list[dict]:
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, list) else [data]


def evidence_ids(evidence: Iterable[str], sample: str) -> frozenset[str]:
    """engram message ids (``<sample>:<dia_id>``) of a question's evidence. The dataset has a few
    malformed entries ("D8:6; D9:17", "D:11:26", "D"): every well-formed dia id in them counts."""
    out = set()
    for raw in evidence:
        for session, turn in _DIA_ID.findall(str(raw)):
            out.add(f"{sample}:D{session}:{turn}")
    return frozenset(out)


@dataclass(frozen=True)
class Question:
    sample: str
    text: str
    category: int
    evidence: frozenset[str]


def questions(conversation: dict, categories: Sequence[int] = (1, 2, 3, 4)) -> list[Question]:
    sample = conversation.get("sample_id", "conv")
    return [
        Question(sample, str(qa["question"]), int(qa["category"]), evidence_ids(qa.get("evidence") or [], sample))
        for qa in conversation.get("qa", [])
        if int(qa["category"]) in categories
    ]


def session_turns(conversation: dict) -> list[tuple[int, list[dict]]]:
    conv = conversation["conversation"]
    out = [(int(m.group(1)), turns) for key, turns in conv.items()
           if (m := _SESSION_KEY.match(key)) and isinstance(turns, list)]
    return sorted(out, key=lambda x: x[0])


def percentile(values: Sequence[float], p: float) -> float:
    """Linear-interpolated percentile (numpy's default), p in [0, 100]."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * p / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


async def ask(nc, request: RecallRequest, timeout: float = 60.0) -> RecallResponse:  # noqa: ANN001
    reply = await nc.request(subjects.RECALL, request.model_dump_json().encode(), timeout=timeout)
    return RecallResponse.model_validate_json(reply.data)
