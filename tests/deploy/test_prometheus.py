"""The monitoring parts, run for real where they run here (issue 27, item 6): Debian's `prometheus`
package (2.42, with promtool). `.ci/run` installs it; without it these tests skip and say why.

- `promtool check rules` and `promtool test rules` on the shipped alert rules: every alert has
  series that fire it and series that must not (deploy/prometheus/alerts.test.yml).
- A real Prometheus scrapes `engram up`'s services, evaluates the shipped rules against them, and
  finds every service up, exporting engram_* series, with no alert firing.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from engram.stack.embedded import free_port
from engram.stack.supervisor import SERVICES

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "alerts.test.yml"
PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not found: Debian's prometheus package is not installed (.ci/run installs it)")


def _alert_names() -> list[str]:
    groups = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    return [rule["alert"] for group in groups for rule in group["rules"] if "alert" in rule]


@needs_promtool
def test_the_alert_rules_are_valid() -> None:
    checked = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(_alert_names())} rules found" in checked.stdout


@needs_promtool
def test_the_alert_rules_fire_on_the_series_they_should_and_only_those() -> None:
    tested = subprocess.run([PROMTOOL, "test", "rules", str(RULE_TESTS)], capture_output=True, text=True,
                            timeout=120, cwd=RULE_TESTS.parent)
    assert tested.returncode == 0, tested.stdout[-4000:] + tested.stderr[-2000:]
    assert "SUCCESS" in tested.stdout


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    """The unit tests cover each alert both ways (no promtool needed to check the file itself)."""
    suite = yaml.safe_load(RULE_TESTS.read_text(encoding="utf-8"))
    assert suite["rule_files"] == ["alerts.yml"]
    fires: set[str] = set()
    quiet: set[str] = set()
    for test in suite["tests"]:
        for case in test.get("promql_expr_test", []):
            named = set(re.findall(r"Engram\w+", case["expr"]))
            if case["exp_samples"]:
                fires |= {name for sample in case["exp_samples"]
                          for name in re.findall(r'alertname="(\w+)"', sample["labels"])}
            else:
                quiet |= named
    alerts = set(_alert_names())
    assert alerts - fires == set(), "alerts no series fires"
    assert alerts - quiet == set(), "alerts never checked quiet"


def _api(base: str, path: str, **params: str) -> dict:
    url = f"{base}/api/v1/{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
    with urllib.request.urlopen(url, timeout=10) as answer:  # noqa: S310 - loopback, test-owned
        body = json.loads(answer.read())
    assert body["status"] == "success", body
    return body["data"]


def _scrape_config(services: dict[str, dict], rules: Path) -> dict:
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [{
            "job_name": "engram",
            "metrics_path": "/metrics",
            "static_configs": [{"targets": [urllib.parse.urlsplit(svc["url"]).netloc], "labels": {"service": name}}
                               for name, svc in services.items()],
        }],
    }


@pytest.mark.slow
@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not found: Debian's prometheus package is not "
                    "installed (.ci/run installs it)")
def test_a_real_prometheus_scrapes_engram_up(tmp_path: Path) -> None:
    from tests.engram.cli.test_cli_up import Up

    up = Up(tmp_path / "engram")
    prometheus = None
    try:
        services = up.runtime["services"]
        assert set(services) == set(SERVICES)
        config = tmp_path / "prometheus.yml"
        config.write_text(yaml.safe_dump(_scrape_config(services, RULES)), encoding="utf-8")
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 - closed below
        prometheus = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}", "--web.enable-lifecycle"],
            stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 90
        while True:
            assert prometheus.poll() is None, (tmp_path / "prometheus.log").read_text()[-3000:]
            try:
                targets = _api(base, "targets")["activeTargets"]
                if len(targets) == len(SERVICES) and all(t["health"] == "up" for t in targets):
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"targets not all up: {[(t['labels'], t['health'], t['lastError']) for t in targets]}"
            time.sleep(0.5)

        up_values = {r["metric"]["service"]: r["value"][1] for r in _api(base, "query", query='up{job="engram"}')["result"]}
        assert up_values == {name: "1" for name in SERVICES}
        with_engram_series = {r["metric"]["service"] for r in _api(
            base, "query", query='count by (service) ({__name__=~"engram_.+", job="engram"})')["result"]}
        assert with_engram_series == set(SERVICES)

        time.sleep(3)  # a few rule evaluations against the live series
        groups = _api(base, "rules")["groups"]
        assert {rule["name"] for g in groups for rule in g["rules"]} == set(_alert_names())
        assert all(rule["health"] == "ok" for g in groups for rule in g["rules"]), [
            (rule["name"], rule.get("lastError")) for g in groups for rule in g["rules"] if rule["health"] != "ok"]
        # a healthy idle stack: nothing pending or firing among the rules whose series it exports
        active = [a["labels"]["alertname"] for a in _api(base, "alerts")["alerts"]]
        assert active == [], active
    finally:
        if prometheus is not None:
            prometheus.terminate()
            prometheus.wait(30)
        assert up.stop() == 0
