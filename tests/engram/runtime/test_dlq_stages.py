"""`engram dlq list/replay --stage` takes only a stage that dead-letters (issue 23): an unknown one
(a typo) used to list nothing, or replay nothing, and exit 0 as if the queue were empty."""

from __future__ import annotations

import asyncio
import importlib
import json
import subprocess
from pathlib import Path

import nats
import pytest

from engram.runtime import dlq
from engram.cli.commands import DLQ_STAGE_HELP
from engram.settings import EngramSettings
from engram.runtime.topology import Topology, ensure_topology
from tests.engram.cli.test_cli_errors import assert_one_clear_line, run
from tests.engram.cli.test_cli_up import ENGRAM, _env

SERVICES_THAT_DEAD_LETTER = ("turn_detector", "extractor", "summary_gate", "sessions")


@pytest.mark.parametrize("command", ["list", "replay"])
def test_unknown_stage_is_refused_with_the_valid_ones(command: str, tmp_path: Path) -> None:
    # no stack at tmp_path: the refusal comes before any connection is tried
    out = run("dlq", command, "--stage", "bogus", "--data-dir", str(tmp_path))
    assert out.returncode == 2, out.stdout + out.stderr
    assert_one_clear_line(out, "--stage", "'bogus'", "use one of", *dlq.STAGES)


def test_stages_are_the_services_that_dead_letter() -> None:
    stages = {importlib.import_module(f"services.{name}.app").STAGE for name in SERVICES_THAT_DEAD_LETTER}
    assert stages == set(dlq.STAGES)
    assert all(stage in DLQ_STAGE_HELP for stage in dlq.STAGES)  # --help names every one


async def test_a_known_stage_filters(clean_nats: str, tmp_path: Path) -> None:
    nc = await nats.connect(clean_nats)
    try:
        js = nc.jetstream()
        await ensure_topology(js, Topology.from_settings(EngramSettings(nats_url=clean_nats)))
        await dlq.dead_letter(js, stage="extractor", reason="schema", detail="d", subject="engram.episode.0.g1",
                              payload=b"{}", headers={}, source_id="1")
    finally:
        await nc.close()

    def listed(stage: str) -> list[str]:
        out = subprocess.run([*ENGRAM, "dlq", "list", "--json", "--stage", stage, "--data-dir", str(tmp_path)],
                             capture_output=True, text=True, env={**_env(), "ENGRAM_NATS_URL": clean_nats}, timeout=60)
        assert out.returncode == 0, out.stderr
        return [row["stage"] for row in json.loads(out.stdout)]

    assert await asyncio.to_thread(listed, "extractor") == ["extractor"]
    assert await asyncio.to_thread(listed, "sessions") == []
