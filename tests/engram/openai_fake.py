"""A scripted OpenAI-compatible ``/v1/chat/completions`` server for tests: uvicorn on a random
loopback port in a thread, so a real ``openai`` client (and engram's LLM client around it) talks
HTTP to it.

Behaviour per request, in this order:
- ``refuse``: response-format types answered with HTTP 400, as servers without ``json_schema``
  support do (e.g. {"json_schema"});
- ``script``: a queue of per-request outcomes, popped first: ``"length"`` answers a cut-off body
  with ``finish_reason="length"``, ``"500"`` an HTTP 500, ``"ok"`` a normal answer;
- otherwise ``answer(body)``: the JSON text of the message, by default graphiti's prompts answered
  by engram's offline rules extractor (so graphiti and engram's pipeline work against it).
Every request body is kept in ``requests``.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from engram.embedded import free_port

Answer = Callable[[dict], Awaitable[str]]
_SCHEMA_IN_PROMPT = re.compile(r"Respond with a JSON object in the following format:\n\n(\{.*\})", re.S)


def _response_models() -> dict[str, type[BaseModel]]:
    from graphiti_core.prompts.lib import BUILTIN_PROMPT_SPECS

    from services.summary_gate.summarize import EntitySummaries

    models: dict[str, type[BaseModel]] = {"EntitySummaries": EntitySummaries}
    for spec in BUILTIN_PROMPT_SPECS.values():
        if getattr(spec, "response_model", None) is not None:
            models[spec.response_model.__name__] = spec.response_model
    return models


def rules_answer() -> Answer:
    """Answers graphiti's prompts as engram's offline rules extractor would (the response model is
    found from the json_schema name, or from the schema's title in the prompt)."""
    from graphiti_core.prompts.models import Message

    from engram.models.rules_llm import RulesExtractorClient

    rules, models = RulesExtractorClient(), _response_models()

    async def answer(body: dict) -> str:
        fmt = body.get("response_format") or {}
        name = (fmt.get("json_schema") or {}).get("name")
        if name is None:
            found = _SCHEMA_IN_PROMPT.search(body["messages"][-1]["content"])
            name = json.loads(found.group(1)).get("title") if found else None
        messages = [Message(role=m["role"], content=m["content"]) for m in body["messages"]]
        return json.dumps(rules.respond(messages, models.get(name or "")))

    return answer


class FakeOpenAI:
    def __init__(self, answer: Answer | None = None) -> None:
        self.requests: list[dict] = []
        self.script: list[str] = []
        self.refuse: set[str] = set()
        self.answer = answer or rules_answer()
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> JSONResponse:
            body = await request.json()
            self.requests.append(body)
            kind = (body.get("response_format") or {}).get("type", "none")
            if kind in self.refuse:
                return JSONResponse({"error": {"message": f"response_format type {kind} is not supported",
                                               "type": "invalid_request_error"}}, status_code=400)
            outcome = self.script.pop(0) if self.script else "ok"
            if outcome == "500":
                return JSONResponse({"error": {"message": "boom", "type": "server_error"}}, status_code=500)
            if outcome == "length":
                content, finish, n = '{"extracted_entities": [{"name": "loop", "entity_type_id": 0}, {"na', "length", body.get("max_tokens", 0)
            else:
                content, finish, n = await self.answer(body), "stop", 7
            return JSONResponse({
                "id": f"fake-{len(self.requests)}", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "finish_reason": finish, "message": {"role": "assistant", "content": content}}],
                "usage": {"prompt_tokens": 10, "completion_tokens": n, "total_tokens": 10 + n},
            })

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def bodies(self, response_format_type: str | None = None) -> list[dict[str, Any]]:
        return [b for b in self.requests
                if response_format_type is None or (b.get("response_format") or {}).get("type") == response_format_type]


@contextmanager
def running(fake: FakeOpenAI) -> Iterator[FakeOpenAI]:
    thread = threading.Thread(target=fake.server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not fake.server.started:
        assert time.monotonic() < deadline, "fake OpenAI server did not start"
        time.sleep(0.05)
    try:
        yield fake
    finally:
        fake.server.should_exit = True
        thread.join(5)
