"""Settings that every process shares."""

from __future__ import annotations

from pathlib import Path

import pytest

from engram.settings import EngramSettings


def test_nats_credentials_file_reaches_every_connection(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    creds = tmp_path / "nats.creds"
    monkeypatch.setenv("ENGRAM_NATS_CREDS", str(creds))
    assert EngramSettings().nats_options() == {"user_credentials": str(creds)}
    monkeypatch.delenv("ENGRAM_NATS_CREDS")
    assert EngramSettings().nats_options() == {}


def test_unset_nats_url_names_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="ENGRAM_NATS_URL"):
        EngramSettings(data_dir=tmp_path).resolved_nats_url()
