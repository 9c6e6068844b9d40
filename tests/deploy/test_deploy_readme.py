"""deploy/README.md covers every service, not only the turn-detector it was first written for: each
service `engram up` runs has a row in its services table and in the compose ports table, and every
alert rule in prometheus/alerts.yml is in its alerts table."""

from __future__ import annotations

from pathlib import Path

import yaml

from engram.stack.supervisor import SERVICES

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "deploy" / "README.md").read_text()


def table_first_cells(heading_text: str) -> list[str]:
    """First cells of the first markdown table after ``heading_text``."""
    after = README.split(heading_text, 1)[1]
    table: list[str] = []
    for line in after.splitlines():
        if line.startswith("|"):
            table.append(line)
        elif table:
            break
    return [line.split("|")[1].strip() for line in table[2:]]


def test_every_service_is_described() -> None:
    services = table_first_cells("One image runs every service")
    assert [s.strip("`") for s in services] == list(SERVICES)
    compose = table_first_cells("## docker compose")
    assert set(SERVICES) <= {c.split(" ")[0] for c in compose}


def test_every_alert_is_listed() -> None:
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())
    alerts = [rule["alert"] for group in rules["groups"] for rule in group["rules"] if "alert" in rule]
    listed = [cell.strip("`") for cell in table_first_cells("## Alerts")]
    assert listed == alerts


def test_every_stream_and_kv_bucket_is_described() -> None:
    """The streams section lists what engram/runtime/topology.py declares, in its order, and the compose
    table names the NATS image docker-compose.yml runs."""
    from engram.settings import EngramSettings
    from engram.runtime.topology import Topology

    topology = Topology.from_settings(EngramSettings())
    assert [c.strip("`") for c in table_first_cells("## Streams and KV buckets")] == [s.name for s in topology.streams()]
    section = README.split("## Streams and KV buckets", 1)[1].split("\n## ", 1)[0]
    buckets = [line.split("|")[1].strip().strip("`") for line in section.splitlines() if line.startswith("| `engram_")]
    assert buckets == [kv.bucket for kv in topology.kv_buckets()]
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert f"nats (`{compose['services']['nats']['image']}`" in README
