"""Transcripts and LLM doubles for the session close stage's tests."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
from typing import Any

from graphiti_core.llm_client.client import LLMClient
from graphiti_core.llm_client.config import LLMConfig, ModelSize

from engram.models.rules_llm import RulesExtractorClient
from engram.schemas.memory import SessionSegmentClosed, TranscriptLine
from engram.schemas.messages import ScopeKeys

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)


def line(i: int, role: str, text: str) -> TranscriptLine:
    return TranscriptLine(message_id=f"m{i}", role=role, text=text, timestamp=T0 + timedelta(minutes=i))  # type: ignore[arg-type]


ENGLISH = [
    line(1, "user", "Hi! I'm a software engineer and I work on a Django project. My favourite editor is Neovim."),
    line(2, "assistant", "Nice. For authentication you could use JWT or OAuth2."),
    line(3, "tool", '{"result": "pytest passed"}'),
    line(4, "user", "Let's go with JWT instead of OAuth2, it is simpler. Please answer in English. Call me Sam."),
    line(5, "assistant", "Good choice. We'll use bcrypt for password hashing. You still need to implement token refresh."),
    line(6, "system", "The assistant is helpful."),
    line(7, "user", "Right, token refresh is the next step. I prefer short answers."),
]
TURKISH = [
    line(1, "user", "Merhaba, ben yazılım mühendisiyim ve Django projesi üzerinde çalışıyorum."),
    line(2, "assistant", "Kimlik doğrulama için JWT veya OAuth2 kullanabilirsiniz."),
    line(3, "user", "OAuth2 yerine JWT tercih ettim, daha basit. Lütfen Türkçe cevap ver. En sevdiğim renk mavi."),
    line(4, "assistant", "Tamam, JWT kullanacağız. Parolalar için bcrypt öneririm."),
    line(5, "user", "Token yenileme henüz yapılmadı, sonra bakacağız. İstanbul'da yaşıyorum."),
]
TOOL_ONLY = [line(1, "tool", '{"rows": 3}'), line(2, "system", "You are terse."), line(3, "user", "   ")]


def segment(session: str, transcript: list[TranscriptLine], *, segment: int = 0, user: str | None = None,
            reason: str = "token_limit") -> SessionSegmentClosed:
    return SessionSegmentClosed(
        session_id=session, segment=segment, segment_id=f"{session}-0-{segment}", reason=reason,  # type: ignore[arg-type]
        token_count=30_000, message_count=len(transcript), opened_at=T0, closed_at=T0 + timedelta(hours=segment + 1),
        scopes=ScopeKeys(user=user), transcript=transcript,
    )


class CountingLLM(RulesExtractorClient):
    """The rules model, counting calls per prompt name; ``fail``: prompt names that raise,
    ``garbage``: prompt names answered with JSON that matches no response model, ``gate``: an
    event every call waits for (to hold a close in flight)."""

    def __init__(self, *, fail: tuple[str, ...] = (), garbage: tuple[str, ...] = (),
                 gate: asyncio.Event | None = None) -> None:
        super().__init__()
        self.fail, self.garbage, self.gate = fail, garbage, gate
        self.by_prompt: dict[str, int] = {}
        self.prompts: list[tuple[str, str]] = []  # (prompt name, the user message)

    async def generate_response(self, messages: list[Any], response_model: Any = None, max_tokens: int | None = None,
                                model_size: ModelSize = ModelSize.medium, group_id: str | None = None,
                                prompt_name: str | None = None, **kwargs: Any) -> dict[str, Any]:
        name = prompt_name or "?"
        self.by_prompt[name] = self.by_prompt.get(name, 0) + 1
        self.prompts.append((name, messages[-1].content))
        if self.gate is not None:
            await self.gate.wait()
        if name in self.fail:
            raise RuntimeError("the LLM is down")
        if name in self.garbage:
            return {"preferences": "not a list", "narrative": 7, "notes": {"x": 1}}
        return await super().generate_response(messages, response_model, max_tokens, model_size, group_id,
                                               prompt_name, **kwargs)


class UnparsableJSONLLM(LLMClient):
    """A client whose provider answered text that is not JSON (what json.loads raises)."""

    def __init__(self) -> None:
        super().__init__(LLMConfig(model="broken"), cache=False)
        self.calls = 0

    async def generate_response(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.calls += 1
        import json

        return json.loads("{preferences: [oops")

    async def _generate_response(self, *args: Any, **kwargs: Any) -> dict[str, Any]:  # pragma: no cover
        raise NotImplementedError
