"""The scripted OpenAI-compatible server of the client tests: bench/llm_simulator.py (uvicorn on
a random loopback port, answers by engram's offline rules model) with the script vocabulary these
tests were written in. Kept so they read as before; new tests use the simulator directly.

- ``refuse``: response-format types answered with HTTP 400 (e.g. {"json_schema"});
- ``script``: per-request outcomes, in order: ``"length"`` a cut-off body with
  ``finish_reason="length"``, ``"500"`` an HTTP 500, ``"ok"`` a normal answer;
- ``answer(body)``: the JSON text of a normal answer (default: the rules model's).
Every request body is kept in ``requests``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from bench.llm_simulator import Answer, LLMSimulator, ok, server_error, truncated

_SCRIPT = {"length": truncated, "500": lambda: server_error(500), "ok": ok}


class FakeOpenAI(LLMSimulator):
    def __init__(self, answer: Answer | None = None) -> None:
        super().__init__(answer=answer, keep_bodies=True)

    @property
    def requests(self) -> list[dict[str, Any]]:
        return self.bodies

    @property
    def script(self) -> list[str]:
        return [f.kind for f in self._queue]

    @script.setter
    def script(self, outcomes: list[str]) -> None:
        with self._lock:
            self._queue = [_SCRIPT[o]() for o in outcomes]


@contextmanager
def running(fake: FakeOpenAI) -> Iterator[FakeOpenAI]:
    with fake:
        yield fake
