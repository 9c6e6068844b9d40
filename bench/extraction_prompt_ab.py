"""Bench only, outside CI: graphiti's combined extraction prompt against engram's own
(services/extractor/extraction_prompt.py) on a few LoCoMo turns, with a real model.

The offline rules model reads neither prompt's prose, so only a model can say whether the shorter
prompt loses anything. For each turn of a small slice (bench/extraction_quality.py's slice: the
tuning conversations' first turns, in round-robin order, only turns that LoCoMo has observations
for), each variant's prompt is built from the same context (the turn, its 2 previous turns as
previous episodes, the variant's preprocessing template as custom instructions) and sent ONCE
through engram's own client (engram/models/openai_compat.py: JSON schema output, caps, retries):

- ``graphiti``: graphiti's prompt and response model (engram before this prompt), with
  ``--graphiti-template`` (default: the current default template);
- ``engram``: engram's prompt and lean schema (:class:`LeanSchemaLLMClient`), current template.

Only the extraction call: no graph, no dedupe, no timestamps. Per variant it prints valid answers,
entities, facts and prompt tokens, and writes the facts as bench/extraction_quality.py records
(``--out-dir``/<variant>.jsonl), scored the same way as a full run:

    python bench/local_llm.py --model qwen2.5-coder-1.5b --dir /tmp/m15 --port 8080 &   # another venv
    ENGRAM_LLM_MAX_TOKENS_BY_PROMPT='{"extract_nodes_and_edges.extract_message": 1024}' \\
      python bench/extraction_prompt_ab.py --llm-base-url http://127.0.0.1:8080/v1 --llm-model qwen15 \\
      --turns 8 --graphiti-template old-template.md --out-dir /tmp/ab
    python bench/extraction_quality.py --score-only /tmp/ab/graphiti.jsonl
    python bench/extraction_quality.py --score-only /tmp/ab/engram.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("GRAPHITI_TELEMETRY_ENABLED", "false")

from bench import _smoke  # noqa: E402
from bench._recall_common import TUNING_SPLIT, load_conversations  # noqa: E402
from bench.extraction_quality import TurnRecord, build_slice, round_robin  # noqa: E402

VARIANTS = ("graphiti", "engram")


def context_for(turns: list[Any], i: int, template: str) -> dict[str, Any]:
    """graphiti's combined-extraction context for ``turns[i]`` (its conversation's 2 previous turns)."""
    from graphiti_core.utils.maintenance.node_operations import _build_entity_types_context

    turn = turns[i]
    previous = [t for t in turns if t.sample == turn.sample and turn.index - 2 <= t.index < turn.index]
    return {
        "episode_content": turn.episode.content,
        "previous_episodes": [{"content": t.episode.content,
                               "timestamp": t.episode.reference_time.isoformat()} for t in previous],
        "custom_extraction_instructions": template,
        "entity_types": _build_entity_types_context(None),
        "edge_types": [],
        "strict_edge_types": False,
    }


async def ask(llm: Any, variant: str, context: dict[str, Any]) -> tuple[dict[str, Any] | None, str, int]:
    """(answer or None, error type, prompt tokens as built, before any schema is added)."""
    from graphiti_core.prompts import prompt_library
    from graphiti_core.prompts.extract_nodes_and_edges import CombinedExtraction

    from engram.text.tokens import token_counter
    from engram.services.extractor.extraction_prompt import PROMPT_NAME, LeanSchemaLLMClient, build_prompt

    if variant == "graphiti":
        messages, client = prompt_library.extract_nodes_and_edges.extract_message(context), llm
    else:
        messages, client = build_prompt(context).as_messages(), LeanSchemaLLMClient(llm)
    tokens = token_counter()("\n".join(m.content for m in messages))
    try:
        answer = await client.generate_response(messages, response_model=CombinedExtraction, prompt_name=PROMPT_NAME)
        CombinedExtraction(**answer)  # what graphiti does with it
        return answer, "", tokens
    except Exception as exc:  # counted, the run goes on
        return None, type(exc).__name__, tokens


async def main(args: argparse.Namespace) -> int:
    logging.disable(logging.WARNING)
    from engram.models.factory import LLMSettings, build_llm
    from engram.services.extractor.preprocessing import ExtractionSettings, validate_at_startup

    _smoke.require_locomo(args.locomo)
    conversations = load_conversations(args.locomo)
    samples = [s for s in args.samples.split(",") if s]
    turns = build_slice(args.locomo, conversations, samples, args.per_conversation)
    chosen = [t for t in round_robin(turns) if t.observations][args.skip: args.turns]
    current = validate_at_startup(ExtractionSettings()) or ""
    templates = {"graphiti": args.graphiti_template.read_text(encoding="utf-8").strip() if args.graphiti_template
                 else current, "engram": current}
    llm = build_llm(LLMSettings(provider="openai", base_url=args.llm_base_url, model=args.llm_model,
                                api_key=args.llm_api_key))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    variants = [v for v in args.variants.split(",") if v]
    for variant in variants:
        out = args.out_dir / f"{variant}.jsonl"
        valid = entities = facts = tokens = 0
        seconds = 0.0
        with out.open("w", encoding="utf-8") as f:
            for turn in chosen:
                start = time.monotonic()
                answer, error, n = await ask(llm, variant, context_for(turns, turns.index(turn), templates[variant]))
                took = time.monotonic() - start
                seconds += took
                tokens += n
                got = answer or {"extracted_entities": [], "edges": []}
                valid += answer is not None
                entities += len(got["extracted_entities"])
                facts += len(got["edges"])
                record = TurnRecord(turn.sample, turn.index, list(turn.speakers), turn.message_ids, turn.observations,
                                    facts=[{"fact": e["fact"], "source": e["source_entity_name"],
                                            "target": e["target_entity_name"]} for e in got["edges"]],
                                    llm_calls=1, input_tokens=n, seconds=took, failed=error)
                f.write(json.dumps(asdict(record)) + "\n")
                f.flush()
                print(f"  {variant} {turn.sample}#{turn.index}: {'ok' if answer else error}, "
                      f"{len(got['extracted_entities'])} entities, {len(got['edges'])} facts, {n} prompt tokens, "
                      f"{took:.0f}s", flush=True)
        k = len(chosen)
        print(f"{variant}: valid {valid}/{k}, {entities / k:.2f} entities/turn, {facts / k:.2f} facts/turn, "
              f"{tokens / k:.0f} prompt tokens/turn (before the schema), {seconds / k:.0f} s/turn -> {out}", flush=True)
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--locomo", type=Path, default=_smoke.locomo_path())
    p.add_argument("--samples", default=",".join(TUNING_SPLIT), help="comma-separated tuning conversations")
    p.add_argument("--per-conversation", type=int, default=15, help="turns read per conversation")
    p.add_argument("--turns", type=int, default=8, help="turns asked (those with observations, round robin)")
    p.add_argument("--skip", type=int, default=0, help="leave out the first N of those turns (resume a run)")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--graphiti-template", type=Path, help="custom instructions of the graphiti variant")
    p.add_argument("--llm-base-url", required=True)
    p.add_argument("--llm-model", default="local")
    p.add_argument("--llm-api-key", default=os.environ.get("ENGRAM_LLM_API_KEY", "unused"))
    p.add_argument("--out-dir", type=Path, required=True)
    return p


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main(parser().parse_args())))
