"""An OpenAI-compatible LLM server that misbehaves on cue: for tests and benchmarks (bench/chaos.py).

A real ``openai`` client (engram's ``ENGRAM_LLM_PROVIDER=openai`` path, or anything else that
speaks the API) talks HTTP to it on a random loopback port. It answers graphiti's and engram's
prompts with engram's offline rules model (engram/models/rules_llm), so extraction results are
realistic and deterministic, and it injects faults from a schedule:

==================  ==============================================================================
fault               what the client gets
==================  ==============================================================================
``rate_limit``      HTTP 429 with ``Retry-After: <s>`` (the SDK waits that long, then retries)
``server_error``    HTTP 500 / 502 / 503 (``status``), an OpenAI-style error body
``hang``            no answer for ``seconds`` (set it past the client's timeout), then the answer
``slow``            the right answer after ``seconds`` (a slow model within the timeout)
``invalid_json``    ``finish_reason=stop`` and a body that is not JSON (prose around a brace)
``truncated``       the first half of the right answer, ``finish_reason=length``
``schema``          valid JSON that violates the response model (every field of the wrong type)
``empty``           ``finish_reason=stop`` and an empty message
==================  ==============================================================================

API (thread-safe enough for one test or bench driving it)::

    with LLMSimulator() as sim:                  # uvicorn in a daemon thread, 127.0.0.1:<random>
        settings = LLMSettings(provider="openai", base_url=sim.base_url, model="sim")
        sim.schedule(rate_limit(retry_after_s=1), times=2)   # the next 2 chat requests
        sim.schedule(truncated(prompt="ExtractedEdges"))     # the next request for that model
        sim.default = ok()                       # requests with no scheduled fault (or mix())
        sim.mix(0.1, [server_error(503), slow(0.5)], seed=7) # random faults, for chaos runs
        sim.latency_s = 0.2                      # added to every answer
        sim.count("rate_limit"), sim.count(), sim.served  # what was served, in order

A scheduled fault with ``prompt`` set waits for a request whose response model has that name
(the ``json_schema`` name, or the title of the schema graphiti puts in the prompt). Faults
apply to ``/v1/chat/completions`` unless made with ``path=EMBEDDINGS``: then the HTTP-level ones
(rate_limit, server_error, hang, slow) apply to ``/v1/embeddings``, which answers engram's
hashing vectors (``sim.embeddings_default``). ``/v1/models`` lists the served model names.
Nothing of a request's content is logged. How engram's services end under each fault:
docs/reliability.md, "LLM faults".

Run standalone: ``python -m bench.llm_simulator --port 8000 --fault-rate 0.2`` (Ctrl-C or SIGTERM stops it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import signal
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

FaultKind = Literal["ok", "rate_limit", "server_error", "hang", "slow", "invalid_json", "truncated", "schema", "empty"]
FAULT_KINDS: tuple[str, ...] = FaultKind.__args__  # type: ignore[attr-defined]
CHAT = "/v1/chat/completions"
EMBEDDINGS = "/v1/embeddings"
_SCHEMA_IN_PROMPT = re.compile(r"Respond with a JSON object in the following format:\n\n(\{.*\})", re.S)


@dataclass(frozen=True)
class Fault:
    kind: FaultKind = "ok"
    status: int = 500  # server_error
    retry_after_s: float = 1.0  # rate_limit
    seconds: float = 0.0  # hang, slow
    prompt: str | None = None  # only a request for this response model (None: any request)
    path: str = "/v1/chat/completions"  # or EMBEDDINGS: rate_limit, server_error, hang and slow apply there


def ok(prompt: str | None = None) -> Fault:
    return Fault("ok", prompt=prompt)


def rate_limit(retry_after_s: float = 1.0, prompt: str | None = None, path: str = CHAT) -> Fault:
    return Fault("rate_limit", retry_after_s=retry_after_s, prompt=prompt, path=path)


def server_error(status: int = 500, prompt: str | None = None, path: str = CHAT) -> Fault:
    if not 500 <= status < 600:
        raise ValueError("server_error needs a 5xx status")
    return Fault("server_error", status=status, prompt=prompt, path=path)


def hang(seconds: float = 3600.0, prompt: str | None = None, path: str = CHAT) -> Fault:
    return Fault("hang", seconds=seconds, prompt=prompt, path=path)


def slow(seconds: float, prompt: str | None = None, path: str = CHAT) -> Fault:
    return Fault("slow", seconds=seconds, prompt=prompt, path=path)


def invalid_json(prompt: str | None = None) -> Fault:
    return Fault("invalid_json", prompt=prompt)


def truncated(prompt: str | None = None) -> Fault:
    return Fault("truncated", prompt=prompt)


def schema_violation(prompt: str | None = None) -> Fault:
    return Fault("schema", prompt=prompt)


def empty(prompt: str | None = None) -> Fault:
    return Fault("empty", prompt=prompt)


@dataclass
class Served:
    """One request as served: when, which endpoint, which response model, which fault, HTTP status."""

    at: float
    path: str
    prompt: str | None
    kind: str
    status: int
    max_tokens: int | None = None


def response_models() -> dict[str, type[BaseModel]]:
    """The response models the rules model answers: graphiti's prompts, the summary gate's and
    the session close stage's."""
    from graphiti_core.prompts.lib import BUILTIN_PROMPT_SPECS

    from engram.services.sessions.close import HybridSessionSummary, UserFacts
    from engram.services.summary_gate.summarize import EntitySummaries

    models: dict[str, type[BaseModel]] = {m.__name__: m for m in (EntitySummaries, HybridSessionSummary, UserFacts)}
    for spec in BUILTIN_PROMPT_SPECS.values():
        model = getattr(spec, "response_model", None)
        if model is not None:
            models.setdefault(model.__name__, model)
    return models


def response_model_name(body: dict[str, Any]) -> str | None:
    """The response model a chat request asks for: the json_schema name, else the title of the
    schema in the last message (json_object / prompt modes)."""
    fmt = body.get("response_format") or {}
    name = (fmt.get("json_schema") or {}).get("name")
    if name:
        return str(name)
    messages = body.get("messages") or []
    found = _SCHEMA_IN_PROMPT.search(str(messages[-1].get("content", ""))) if messages else None
    if found:
        try:
            return json.loads(found.group(1)).get("title")
        except ValueError:
            return None
    return None


def violate(value: Any) -> Any:
    """``value`` with every field of the wrong type (lists become strings, strings numbers, ...)."""
    if isinstance(value, dict):
        return {k: _wrong_type(v) for k, v in value.items()} or {"unexpected": "field"}
    return {"unexpected": "field"}


def _wrong_type(value: Any) -> Any:
    if isinstance(value, list):
        return "not a list"
    if isinstance(value, str):
        return {"not": "a string"}
    if isinstance(value, bool | int | float):
        return "not a number"
    if isinstance(value, dict):
        return ["not", "an", "object"]
    return ["unexpected"]


Answer = Callable[[dict[str, Any]], Awaitable[str]]


class LLMSimulator:
    """``answer``: the JSON text for a chat request body, instead of the rules model's answer.
    ``keep_bodies``: keep every chat request body in ``bodies`` (tests of what the client sends;
    off by default: prompts are kilobytes each). ``refuse``: ``response_format`` types answered
    with HTTP 400, as servers without e.g. ``json_schema`` support do (before any fault)."""

    def __init__(self, *, model_names: Iterable[str] = ("sim",), embedding_dim: int = 256,
                 answer: Answer | None = None, keep_bodies: bool = False) -> None:
        from engram.models.rules_llm import RulesExtractorClient

        self.custom_answer = answer
        self.keep_bodies = keep_bodies
        self.bodies: list[dict[str, Any]] = []
        self.refuse: set[str] = set()
        self.default: Fault = ok()
        self.embeddings_default: Fault = Fault(path=EMBEDDINGS)
        self.latency_s = 0.0
        self.served: list[Served] = []
        self.model_names = list(model_names)
        self.embedding_dim = embedding_dim
        self._queue: list[Fault] = []
        self._lock = threading.Lock()
        self._mix: tuple[float, list[Fault], random.Random] | None = None
        self._rules = RulesExtractorClient()
        self._models = response_models()
        self._stopping = threading.Event()
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self.server = uvicorn.Server(uvicorn.Config(self._app(), log_level="warning", timeout_graceful_shutdown=2,
                                                    access_log=False))

    # ---------------------------------------------------------------- schedule and counts
    def schedule(self, *faults: Fault, times: int = 1) -> None:
        """Queue ``faults`` (``times`` over) for the next chat requests, in order."""
        with self._lock:
            self._queue.extend(list(faults) * times)

    def clear(self) -> None:
        with self._lock:
            self._queue.clear()
            self._mix = None
        self.default = ok()
        self.embeddings_default = Fault(path=EMBEDDINGS)

    def mix(self, rate: float, faults: Iterable[Fault], *, seed: int = 0) -> None:
        """Requests with no scheduled fault get one of ``faults`` with probability ``rate``."""
        self._mix = (rate, list(faults), random.Random(seed))

    @property
    def pending(self) -> int:
        """Scheduled faults not served yet."""
        return len(self._queue)

    def count(self, kind: str | None = None, *, path: str = CHAT, prompt: str | None = None) -> int:
        return sum(1 for s in list(self.served)
                   if s.path == path and (kind is None or s.kind == kind) and (prompt is None or s.prompt == prompt))

    def _next_fault(self, prompt: str | None, path: str = CHAT) -> Fault:
        with self._lock:
            for i, fault in enumerate(self._queue):
                if fault.path == path and (fault.prompt is None or fault.prompt == prompt):
                    return self._queue.pop(i)
            if self._mix is not None:
                rate, faults, rng = self._mix
                mine = [f for f in faults if f.path == path]
                if mine and rng.random() < rate:
                    return rng.choice(mine)
        default = self.default if path == CHAT else self.embeddings_default
        return default if default.path == path else Fault(path=path)

    # ---------------------------------------------------------------- lifecycle
    @property
    def port(self) -> int:
        assert self._sock is not None, "start() first"
        return self._sock.getsockname()[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, port: int = 0) -> LLMSimulator:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", port))  # bound here: no race for a "free" port
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._sock]},
                                        name="llm-simulator", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("LLM simulator did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self._stopping.set()  # hung requests end now
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)
        if self._sock is not None:
            self._sock.close()

    def __enter__(self) -> LLMSimulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---------------------------------------------------------------- HTTP
    async def _wait(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while not self._stopping.is_set() and time.monotonic() < end:
            await asyncio.sleep(min(0.05, max(0.0, end - time.monotonic())))

    def _answer(self, body: dict[str, Any], prompt: str | None) -> dict[str, Any]:
        from graphiti_core.prompts.models import Message

        messages = [Message(role=m.get("role", "user"), content=str(m.get("content", ""))) for m in body.get("messages", [])]
        return self._rules.respond(messages, self._models.get(prompt or ""))

    async def _http_fault(self, fault: Fault, path: str, prompt: str | None, max_tokens: int | None) -> JSONResponse | None:
        """Records the request; the error response of an HTTP-level fault, or None after the
        fault's and the simulator's delay (the caller answers)."""
        status = 429 if fault.kind == "rate_limit" else fault.status if fault.kind == "server_error" else 200
        self.served.append(Served(time.monotonic(), path, prompt, fault.kind, status, max_tokens))
        if fault.kind == "rate_limit":
            return JSONResponse({"error": {"message": "Rate limit reached, retry later", "type": "rate_limit_exceeded",
                                           "code": "rate_limit_exceeded"}}, status_code=429,
                                headers={"retry-after": f"{fault.retry_after_s:g}"})
        if fault.kind == "server_error":
            return JSONResponse({"error": {"message": "The server had an error processing your request",
                                           "type": "server_error"}}, status_code=fault.status)
        if fault.kind in ("hang", "slow"):
            await self._wait(fault.seconds)
        if self.latency_s:
            await self._wait(self.latency_s)
        return None

    def _app(self) -> FastAPI:
        app = FastAPI(title="engram LLM simulator")

        @app.get("/v1/models")
        async def models() -> JSONResponse:
            return JSONResponse({"object": "list", "data": [
                {"id": name, "object": "model", "created": 0, "owned_by": "engram-simulator"} for name in self.model_names]})

        @app.post(EMBEDDINGS)
        async def embeddings(request: Request) -> JSONResponse:
            from engram.models.hashing_embedder import hash_embed

            body = await request.json()
            fault = self._next_fault(None, EMBEDDINGS)
            failed = await self._http_fault(fault, EMBEDDINGS, None, None)
            if failed is not None:
                return failed
            inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
            dim = int(body.get("dimensions") or self.embedding_dim)
            return JSONResponse({"object": "list", "model": body.get("model", "sim"), "usage": {
                "prompt_tokens": len(inputs), "total_tokens": len(inputs)}, "data": [
                {"object": "embedding", "index": i, "embedding": hash_embed(text if isinstance(text, str) else str(text), dim)}
                for i, text in enumerate(inputs)]})

        @app.post(CHAT)
        async def chat(request: Request) -> JSONResponse:
            body = await request.json()
            if self.keep_bodies:
                self.bodies.append(body)
            kind = (body.get("response_format") or {}).get("type", "none")
            if kind in self.refuse:
                self.served.append(Served(time.monotonic(), CHAT, None, "refused", 400, body.get("max_tokens")))
                return JSONResponse({"error": {"message": f"response_format type {kind} is not supported",
                                               "type": "invalid_request_error"}}, status_code=400)
            prompt = response_model_name(body)
            fault = self._next_fault(prompt)
            failed = await self._http_fault(fault, CHAT, prompt, body.get("max_tokens"))
            if failed is not None:
                return failed
            answer = await self.custom_answer(body) if self.custom_answer else json.dumps(self._answer(body, prompt))
            finish, n_out = "stop", max(1, len(answer) // 4)
            if fault.kind == "invalid_json":
                answer = "Sure! Here is the JSON you asked for: {" + answer[:40]
            elif fault.kind == "truncated":
                answer, finish, n_out = answer[: max(1, len(answer) // 2)], "length", int(body.get("max_tokens") or n_out)
            elif fault.kind == "schema":
                try:
                    answer = json.dumps(violate(json.loads(answer)))
                except ValueError:  # a custom answer that is not JSON
                    answer = json.dumps(violate(None))
            elif fault.kind == "empty":
                answer = ""
            return JSONResponse({
                "id": f"sim-{len(self.served)}", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model", "sim"),
                "choices": [{"index": 0, "finish_reason": finish, "message": {"role": "assistant", "content": answer}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": n_out, "total_tokens": 1 + n_out},
            })

        return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--latency-s", type=float, default=0.0)
    parser.add_argument("--fault-rate", type=float, default=0.0, help="share of chat requests given a random fault")
    parser.add_argument("--faults", default="rate_limit,server_error,invalid_json,truncated,slow",
                        help="comma-separated kinds for --fault-rate")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    sim = LLMSimulator()
    sim.latency_s = args.latency_s
    kinds = {"rate_limit": rate_limit(1.0), "server_error": server_error(503), "hang": hang(3600.0), "slow": slow(2.0),
             "invalid_json": invalid_json(), "truncated": truncated(), "schema": schema_violation(), "empty": empty()}
    if args.fault_rate:
        sim.mix(args.fault_rate, [kinds[k] for k in args.faults.split(",") if k], seed=args.seed)
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    sim.start(args.port)
    print(f"LLM simulator at {sim.base_url} (ENGRAM_LLM_PROVIDER=openai ENGRAM_LLM_BASE_URL={sim.base_url})", flush=True)
    done.wait()
    sim.stop()


if __name__ == "__main__":
    main()
