"""The real OpenAI-compatible client path against a simulator served over HTTP on loopback:
structured output, Retry-After honoured on 429, client-side rate limit, embeddings."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from graphiti_core.prompts.models import Message
from pydantic import BaseModel

from engram.stack.embedded import free_port
from engram.models.factory import EmbedderSettings, LLMSettings, build_embedder, build_llm


class Verdict(BaseModel):
    answer: str
    confidence: float


class Simulator:
    def __init__(self) -> None:
        self.requests: list[tuple[float, dict]] = []
        self.fail_first_with_429 = 0
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> JSONResponse:
            body = await request.json()
            self.requests.append((time.monotonic(), body))
            if self.fail_first_with_429 > 0:
                self.fail_first_with_429 -= 1
                return JSONResponse({"error": {"message": "slow down", "type": "rate_limit"}}, status_code=429,
                                    headers={"retry-after": "1"})
            content = json.dumps({"answer": "FastAPI", "confidence": 0.9})
            return JSONResponse({
                "id": "sim-1", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": content}}],
                "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19},
            })

        @app.post("/v1/embeddings")
        async def embeddings(request: Request) -> JSONResponse:
            body = await request.json()
            inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
            return JSONResponse({"object": "list", "model": body["model"],
                                 "data": [{"object": "embedding", "index": i, "embedding": [0.1 * (i + 1)] * 16}
                                          for i, _ in enumerate(inputs)],
                                 "usage": {"prompt_tokens": 1, "total_tokens": 1}})

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


@pytest.fixture
def simulator() -> Iterator[Simulator]:
    sim = Simulator()
    thread = threading.Thread(target=sim.server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not sim.server.started:
        assert time.monotonic() < deadline, "simulator did not start"
        time.sleep(0.05)
    yield sim
    sim.server.should_exit = True
    thread.join(5)


def messages() -> list[Message]:
    return [Message(role="system", content="Answer in JSON."), Message(role="user", content="Which framework?")]


async def test_structured_output_through_the_openai_compatible_path(simulator: Simulator) -> None:
    llm = build_llm(LLMSettings(provider="openai", base_url=simulator.base_url, model="sim-model", api_key="k"))
    out = await llm.generate_response(messages(), response_model=Verdict)
    assert Verdict.model_validate(out) == Verdict(answer="FastAPI", confidence=0.9)
    _, body = simulator.requests[-1]
    assert body["model"] == "sim-model"
    assert body["response_format"]["type"] == "json_schema"  # schema sent as response_format


async def test_retry_after_is_honoured_and_the_call_succeeds(simulator: Simulator) -> None:
    simulator.fail_first_with_429 = 1
    llm = build_llm(LLMSettings(provider="openai", base_url=simulator.base_url, model="m", max_retries=3))
    out = await llm.generate_response(messages(), response_model=Verdict)
    assert out["answer"] == "FastAPI"
    (t429, _), (tok, _) = simulator.requests[-2:]
    assert tok - t429 >= 0.9  # waited for Retry-After: 1


async def test_client_side_rate_limit_spaces_calls(simulator: Simulator) -> None:
    llm = build_llm(LLMSettings(provider="openai", base_url=simulator.base_url, model="m", requests_per_second=5))
    for _ in range(4):
        await llm.generate_response(messages(), response_model=Verdict)
    times = [t for t, _ in simulator.requests[-4:]]
    assert times[-1] - times[0] >= 0.5  # 4 calls at 5/s need >= 3 intervals of 0.2 s


async def test_openai_compatible_embedder(simulator: Simulator) -> None:
    embedder = build_embedder(EmbedderSettings(provider="openai", base_url=simulator.base_url, dim=16, api_key="k"))
    vec = await embedder.create(["hello"])
    assert len(vec) == 16 and vec[0] == pytest.approx(0.1)


def test_defaults_are_offline() -> None:
    from engram.models.hashing_embedder import HashingEmbedder
    from engram.models.rules_llm import RulesExtractorClient

    assert isinstance(build_llm(LLMSettings()), RulesExtractorClient)
    assert isinstance(build_embedder(EmbedderSettings()), HashingEmbedder)
