"""Feature-hashing embedder behind graphiti's EmbedderClient interface.

Deterministic and dependency-free: lower-cased word unigrams and bigrams plus character
trigrams of each word are hashed (blake2b, signed) into ``dim`` buckets and L2-normalised.
It captures lexical overlap only — no synonyms, no meaning — so it is the embedder for fast
tests and an offline fallback, not a substitute for a real model (ENGRAM_EMBEDDER_PROVIDER=minilm
runs all-MiniLM-L6-v2 locally, engram/models/minilm_embedder.py).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable

from graphiti_core.embedder.client import EmbedderClient

_WORD = re.compile(r"[\w][\w.\-/]*", re.UNICODE)


def _bucket(feature: str, dim: int) -> tuple[int, float]:
    digest = hashlib.blake2b(feature.encode("utf-8"), digest_size=8).digest()
    value = int.from_bytes(digest, "little")
    return value % dim, (1.0 if (value >> 63) & 1 else -1.0)


def _features(text: str) -> Iterable[tuple[str, float]]:
    words = [w.lower() for w in _WORD.findall(text)]
    for w in words:
        yield "w:" + w, 1.0
        padded = f"^{w}$"
        for i in range(len(padded) - 2):
            yield "c:" + padded[i : i + 3], 0.25  # trigrams: tolerant to inflection and typos
    for a, b in zip(words, words[1:]):
        yield f"b:{a} {b}", 0.5


def hash_embed(text: str, dim: int) -> list[float]:
    vec = [0.0] * dim
    for feature, weight in _features(text):
        index, sign = _bucket(feature, dim)
        vec[index] += sign * weight
    norm = math.sqrt(sum(v * v for v in vec))
    return [v / norm for v in vec] if norm else vec


def first_text(input_data: str | list[str] | Iterable[int] | Iterable[Iterable[int]]) -> str | None:
    """The text graphiti's ``EmbedderClient.create`` means: it passes a one-element list of strings
    (like its OpenAI embedder, embed the first); token-id input is joined to text (every local
    embedder here has its own tokenizer). None for empty input."""
    if isinstance(input_data, str):
        return input_data
    items = list(input_data)
    if not items:
        return None
    first = items[0]
    if isinstance(first, str):
        return first
    if isinstance(first, int):
        return " ".join(map(str, items))
    return " ".join(map(str, first))


class HashingEmbedder(EmbedderClient):
    def __init__(self, dim: int = 256) -> None:
        if dim < 8:
            raise ValueError("dim must be at least 8")
        self.dim = dim

    async def create(self, input_data: str | list[str] | Iterable[int] | Iterable[Iterable[int]]) -> list[float]:
        text = first_text(input_data)
        return [0.0] * self.dim if text is None else hash_embed(text, self.dim)

    async def create_batch(self, input_data_list: list[str]) -> list[list[float]]:
        return [hash_embed(text, self.dim) for text in input_data_list]
