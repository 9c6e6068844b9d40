"""engram/cli/commands.py helpers tested alone (the commands run end to end in the other test_cli_* files)."""

from __future__ import annotations

import pytest


def test_recall_as_of_reads_a_date_or_a_time() -> None:
    from datetime import datetime, timezone

    import typer

    from engram.cli.commands import _as_of

    assert _as_of(None) is None
    assert _as_of("2026-09-15") == datetime(2026, 9, 15, 23, 59, 59, 999999, tzinfo=timezone.utc)  # the whole day
    assert _as_of("2026-09-15T12:00:00") == datetime(2026, 9, 15, 12, tzinfo=timezone.utc)  # no zone: UTC
    assert _as_of("2026-09-15T12:00:00+02:00").utcoffset().total_seconds() == 7200
    with pytest.raises(typer.BadParameter, match="not an ISO 8601"):
        _as_of("last tuesday")
