"""An EmbedderClient wrapper that embeds each text once and sends what it lacks in few calls.

graphiti-core asks its embedder several times while one turn is extracted: the entity names for
the dedupe search (``resolve_extracted_nodes``), the facts for the edge search and again after
resolution (``resolve_extracted_edges``, twice: resolved and invalidated facts), the new entities'
names again before the save, and engram the turn's own text (recall's dense search over past
turns). Measured with the rules model and the hashing embedder on LoCoMo conv-26 (3 sessions):
2.47 calls and 3.43 texts per turn, 5 calls and ~7 texts for a turn with facts, where every name
and fact was embedded twice.

:class:`BatchingEmbedder` answers every ``create``/``create_batch`` from a bounded LRU of recent
vectors, and sends the texts it lacks to the wrapped embedder in one ``create_batch``; misses
asked for while that batch is being collected (concurrent callers in the same event-loop turn,
e.g. graphiti's ``semaphore_gather`` of the resolved and invalidated facts) join it. With
:meth:`BatchingEmbedder.prefetch` the extractor embeds the turn, its entity names and its facts in
ONE call right after extraction (services/extractor/pipeline.py), before graphiti asks for any of
them; graphiti-core itself is unchanged, it just finds the vectors ready.

What still costs a call of its own: a text first seen after the prefetch, i.e. an existing fact
graphiti re-embeds after resolution (a duplicate merged into an older fact, or an invalidated
one) when that fact was not embedded by this process within the LRU's reach (e.g. after a
restart); both are asked for at once and make one call together.

Bounds: ``max_entries`` vectors (default 4,096: ~12.6 MB at 384 dimensions, 8 bytes a value,
kept exact), keyed by a 16-byte hash of the text (a long turn is not kept as a key). Only the
stored-text side is cached: ``create_query`` (an e5 question) is not wrapped.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

from graphiti_core.embedder.client import EmbedderClient

log = logging.getLogger(__name__)

DEFAULT_MAX_ENTRIES = 4096


def _key(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def _single_text(input_data: Any) -> str | None:  # noqa: ANN401 - graphiti's create() input
    """The text a ``create`` call embeds when it is text (graphiti passes ``[text]``); None for
    token ids or empty input, which go to the wrapped embedder as they are."""
    if isinstance(input_data, str):
        return input_data
    if isinstance(input_data, list) and input_data and isinstance(input_data[0], str):
        return input_data[0]
    return None


class BatchingEmbedder(EmbedderClient):
    """``inner``'s vectors, each text embedded once (LRU of ``max_entries``), misses batched."""

    def __init__(self, inner: EmbedderClient, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.inner = inner
        self.max_entries = max_entries
        self._vectors: OrderedDict[bytes, array] = OrderedDict()
        self._pending: dict[bytes, tuple[str, asyncio.Future[array]]] = {}
        self._flush: asyncio.Task[None] | None = None
        self.calls = 0  # create_batch calls sent to ``inner``
        self.texts = 0  # texts in them

    @staticmethod
    def around(embedder: EmbedderClient) -> BatchingEmbedder:
        """``embedder`` itself when it already is one (its cache is shared), else a new wrapper."""
        return embedder if isinstance(embedder, BatchingEmbedder) else BatchingEmbedder(embedder)

    async def create(self, input_data: Any) -> list[float]:  # noqa: ANN401 - graphiti's signature
        text = _single_text(input_data)
        if text is None:
            return await self.inner.create(input_data)
        return (await self._vectors_of([text]))[0]

    async def create_batch(self, input_data_list: list[str]) -> list[list[float]]:
        return await self._vectors_of(input_data_list)

    async def prefetch(self, texts: Iterable[str]) -> None:
        """Embed every text of ``texts`` not cached yet, in one call, so later requests for them
        cost none. Best effort: a failure is logged and left to the later requests, which raise
        as they would have without the prefetch."""
        wanted = [t for t in dict.fromkeys(texts) if t]
        if not wanted:
            return
        try:
            await self._vectors_of(wanted)
        except Exception as exc:  # noqa: BLE001 - the callers that need the vectors ask again
            log.warning("embedding prefetch failed (%s); the texts are embedded when asked for", type(exc).__name__)

    def _cached(self, key: bytes) -> array | None:
        vector = self._vectors.get(key)
        if vector is not None:
            self._vectors.move_to_end(key)
        return vector

    def _keep(self, key: bytes, vector: array) -> None:
        self._vectors[key] = vector
        self._vectors.move_to_end(key)
        while len(self._vectors) > self.max_entries:
            self._vectors.popitem(last=False)

    async def _vectors_of(self, texts: Sequence[str]) -> list[list[float]]:
        loop = asyncio.get_running_loop()
        keys = [_key(t) for t in texts]
        found: dict[bytes, array] = {}
        waiting: dict[bytes, asyncio.Future[array]] = {}
        for key, text in zip(keys, texts, strict=True):
            if key in found or key in waiting:
                continue
            vector = self._cached(key)
            if vector is not None:
                found[key] = vector
                continue
            pending = self._pending.get(key)
            if pending is None:
                pending = (text, loop.create_future())
                self._pending[key] = pending
            waiting[key] = pending[1]
        if waiting and self._flush is None:
            # A task starts after every callback already queued on the loop: callers gathered
            # with this one register their misses first and share the batch.
            self._flush = loop.create_task(self._send())
        for key, future in waiting.items():
            # shield: a cancelled caller must not cancel the batch other callers wait for
            found[key] = await asyncio.shield(future)
        return [found[key].tolist() for key in keys]

    async def _send(self) -> None:
        batch, self._pending, self._flush = self._pending, {}, None
        texts = [text for text, _ in batch.values()]
        try:
            vectors = await self.inner.create_batch(texts)
            if len(vectors) != len(texts):
                raise ValueError(f"embedder returned {len(vectors)} vectors for {len(texts)} texts")
        except asyncio.CancelledError:
            for _, future in batch.values():
                future.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - handed to every caller waiting for this batch
            for _, future in batch.values():
                if not future.done():
                    future.set_exception(exc)
                    future.exception()  # retrieved: a caller that stopped at an earlier text never awaits it
            return
        self.calls += 1
        self.texts += len(texts)
        for (key, (_, future)), vector in zip(batch.items(), vectors, strict=True):
            kept = array("d", vector)
            self._keep(key, kept)
            if not future.done():
                future.set_result(kept)
