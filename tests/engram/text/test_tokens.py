"""The cl100k token counter (engram/text/tokens.py): exact counts, prepared offline (checked in a
subprocess with the network blocked), a corrupt cache replaced, a chars/4 fallback with a warning."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engram.text import tokens
from engram.text.tokens import CL100K_SHA256, CL100K_URL, estimate_tokens, token_counter

REPO = Path(__file__).resolve().parents[3]
COUNT = token_counter()


def test_token_counter_counts_real_cl100k_tokens() -> None:
    assert COUNT is not estimate_tokens
    assert COUNT("hello world") == 2
    assert COUNT("tiktoken is great!") == 6  # OpenAI cookbook's cl100k example
    assert COUNT(" " * 40) == 1  # a chars/4 estimate would say 10
    assert COUNT("<|endoftext|>") > 1  # special-token text is ordinary text, no exception
    assert COUNT("") == 0
    assert token_counter() is COUNT  # prepared once


def test_token_counter_prepares_cache_offline_in_a_fresh_process(tmp_path: Path) -> None:
    cache = tmp_path / "tiktoken-cache"
    code = (
        "import json, socket\n"
        "def blocked(*a, **k):\n"
        "    raise OSError('network access attempted')\n"
        "socket.socket.connect = blocked\n"
        "socket.create_connection = blocked\n"
        "socket.getaddrinfo = blocked\n"
        "from engram.text.tokens import estimate_tokens, token_counter\n"
        "c = token_counter()\n"
        "print(json.dumps([c is not estimate_tokens, c('hello world'), c('tiktoken is great!')]))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("DATA_GYM_CACHE_DIR", "TIKTOKEN_CACHE_DIR")}
    env.update(TIKTOKEN_CACHE_DIR=str(cache), PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [True, 2, 6]
    assert "unavailable" not in proc.stderr
    cached = cache / hashlib.sha1(CL100K_URL.encode()).hexdigest()
    assert hashlib.sha256(cached.read_bytes()).hexdigest() == CL100K_SHA256


def test_prepare_replaces_a_corrupt_cache_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    bad = tmp_path / hashlib.sha1(CL100K_URL.encode()).hexdigest()
    bad.write_bytes(b"not an encoding")
    assert tokens._prepare_cl100k_cache() == str(bad)
    assert hashlib.sha256(bad.read_bytes()).hexdigest() == CL100K_SHA256
    assert [p.name for p in tmp_path.iterdir()] == [bad.name]  # no temp files left


def test_token_counter_falls_back_to_chars_over_4_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(not_a_dir))
    with caplog.at_level(logging.WARNING, logger="engram.tokens"):
        counter = token_counter.__wrapped__()  # bypass the per-process cache
    assert counter is estimate_tokens
    assert "characters/4" in caplog.text
    assert [estimate_tokens(t) for t in ("", "abcd", "abcde")] == [0, 1, 2]
