"""Programmatic noise filter (no LLM): shrink verbose message content, keep what matters for memory.

Rules, applied in this order (each one only rewrites the lines it matched):

1. ``stack_trace`` -- a Python traceback (``Traceback (most recent call last):`` ... final
   ``XxxError: message``) or a JS/Java stack (an error line followed by two or more
   ``    at fn (file:line)`` frames, ``... N more`` and ``Caused by:`` lines) becomes one line:
   ``[stack trace: ValueError: bad value (at app.py:42)]``. The location is the innermost frame
   (last Python frame, first JS/Java frame), reduced to the file's base name.
2. ``repeats_collapsed`` -- ``collapse_repeats_min`` or more consecutive lines that are identical
   once digits, sizes, durations, spinner glyphs and progress bars are normalised
   (``Downloading... 10%``, ``Downloading... 20%``) become the last one plus
   `` [repeated N times]`` (N = lines in the run).
3. ``code_truncated`` -- a fenced block (```` ``` ```` or ``~~~``) with more than
   ``max_code_block_lines`` lines keeps its fence, info string and first ``code_head_lines``
   lines, then ``[... N lines truncated]`` and the closing fence.
4. ``tool_outcome`` -- tool output (role ``tool`` or :func:`reduce_tool_output`) longer than
   ``max_tool_output_chars`` keeps only error/failure lines, summary-like lines
   (passed/warning/exit code/total ...) and its last lines; each gap becomes
   ``[... N lines dropped]`` and over-long kept lines are cut.
5. ``size_capped`` -- anything still longer than ``max_chars`` keeps its head and tail around
   ``[... truncated N chars]``; the result is never longer than ``max_chars``. This is a hard
   cap, not a summary: the default (2 MiB of characters) equals ENGRAM_TURN_MAX_MESSAGE_BYTES's
   default and the service sets it to that setting, so a message engram accepted (its JSON within
   the byte cap, and characters never outnumber bytes) is kept whole, however long; the
   extractor chunks a long episode for the LLM (services/extractor/chunking.py).

Short ordinary prose matches none of the rules and comes back byte-identical.

Limits: detection is by shape, not by understanding. Identical-after-normalisation lines are
collapsed wherever they occur, so three list items that differ only in a number collapse too.
Only Python, JS (V8) and Java stack shapes are recognised (no Go/Rust panics, no .NET); an
incomplete Python traceback without its final exception line is left as is; chained
exceptions collapse trace by trace. Carriage-return progress redraws inside one line are not
split. Lines rewritten by a rule end in ``\\n`` even if the input used ``\\r\\n``. Size counts
are in characters (code points), not bytes or tokens.

The filter is total (any ``str`` in, no exception) and linear: work is line by line with
anchored, bounded regular expressions, and over-long lines skip the per-line parsers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

REDUCTION_KINDS: tuple[str, ...] = ("stack_trace", "repeats_collapsed", "code_truncated", "tool_outcome", "size_capped")

_TOOL_TAIL_LINES = 5  # always keep the last lines of tool output: that is where outcomes print
_TOOL_MAX_PRIMARY_LINES = 40  # error/failure lines kept at most (first and last halves)
_TOOL_MAX_SUMMARY_LINES = 20  # summary-like lines kept at most (the last ones)
_TOOL_MAX_LINE_CHARS = 300  # a kept line longer than this is cut (minified JSON, base64 ...)
_MAX_PARSED_LINE_CHARS = 2000  # longer lines are never a frame/header: keeps parsing linear
_MAX_MESSAGE_CHARS = 300  # exception message kept in a collapsed stack trace


@dataclass(frozen=True)
class NoiseSettings:
    max_code_block_lines: int = 30  # fenced code blocks longer than this keep a head
    code_head_lines: int = 12
    max_tool_output_chars: int = 1500  # tool output longer than this is reduced to its outcome
    max_chars: int = 2 * 1024 * 1024  # hard cap for one message after filtering (rule 5)
    collapse_repeats_min: int = 3  # >= this many consecutive near-identical status lines collapse

    def __post_init__(self) -> None:
        if not 0 <= self.code_head_lines <= self.max_code_block_lines:
            raise ValueError("need 0 <= code_head_lines <= max_code_block_lines")
        if self.max_tool_output_chars < 1:
            raise ValueError("max_tool_output_chars must be positive")
        if self.max_chars < 64:
            raise ValueError("max_chars must be at least 64 (room for the truncation marker)")
        if self.collapse_repeats_min < 2:
            raise ValueError("collapse_repeats_min must be at least 2")


@dataclass(frozen=True)
class NoiseResult:
    text: str
    reductions: tuple[str, ...]  # names from REDUCTION_KINDS, in the order applied


def filter_noise(text: str, *, role: str, settings: NoiseSettings = NoiseSettings()) -> NoiseResult:
    """Apply the noise rules to one message; ``role == "tool"`` also reduces output to its outcome."""
    # Every line rule needs at least two lines and the size rules a long text: most chat
    # messages are one short line (a test checks this shortcut changes no result).
    if "\n" not in text and len(text) <= settings.max_chars and (
        role != "tool" or len(text) <= settings.max_tool_output_chars
    ):
        return NoiseResult(text, ())
    return _apply_all_rules(text, role, settings)


def _apply_all_rules(text: str, role: str, settings: NoiseSettings) -> NoiseResult:
    reductions: list[str] = []
    lines = text.split("\n")

    for name, rule in (
        ("stack_trace", _collapse_python_tracebacks),
        ("stack_trace", _collapse_frame_traces),
        ("repeats_collapsed", lambda ls: _collapse_repeats(ls, settings.collapse_repeats_min)),
        ("code_truncated", lambda ls: _truncate_code_blocks(ls, settings)),
    ):
        rewritten = rule(lines)
        if rewritten is not None:
            lines = rewritten
            _note(reductions, name)

    result = "\n".join(lines) if reductions else text
    if role == "tool" and len(result) > settings.max_tool_output_chars:
        outcome = _reduce_to_outcome(result.split("\n"))
        if outcome is not None:
            result = "\n".join(outcome)
            _note(reductions, "tool_outcome")
    capped = _cap_size(result, settings.max_chars)
    if capped is not None:
        result = capped
        _note(reductions, "size_capped")
    return NoiseResult(result, tuple(reductions))


def reduce_tool_output(text: str, settings: NoiseSettings = NoiseSettings()) -> NoiseResult:
    """Filter a tool result: every rule of :func:`filter_noise` plus the outcome reduction."""
    return filter_noise(text, role="tool", settings=settings)


def _note(reductions: list[str], name: str) -> None:
    if name not in reductions:
        reductions.append(name)


def _line_body(line: str) -> str:
    return line[:-1] if line.endswith("\r") else line


def _base_name(path: str) -> str:
    return re.split(r"[/\\]", path)[-1] or path


def _shorten(message: str, limit: int) -> str:
    return message if len(message) <= limit else message[:limit] + "..."


# --------------------------------------------------------------------------- stack traces

_PY_TRACEBACK_HEADER = re.compile(r"([ \t]*)Traceback \(most recent call last\):[ \t]*")
_PY_FRAME = re.compile(r'[ \t]+File "([^"\r\n]*)", line (\d+)')
_PY_EXCEPTION = re.compile(r"([A-Za-z_][\w.]*)(?::[ \t]?(.*))?")


def _collapse_python_tracebacks(lines: list[str]) -> list[str] | None:
    out: list[str] = []
    changed = False
    i = 0
    while i < len(lines):
        header = _PY_TRACEBACK_HEADER.fullmatch(_line_body(lines[i])) if len(lines[i]) < 200 else None
        collapsed = _parse_python_traceback(lines, i, header.group(1)) if header else None
        if collapsed is None:
            out.append(lines[i])
            i += 1
            continue
        summary, next_index = collapsed
        out.append(summary)
        changed = True
        i = next_index
    return out if changed else None


def _parse_python_traceback(lines: list[str], start: int, indent: str) -> tuple[str, int] | None:
    """Return (summary line, index after the trace) for a traceback whose header is at ``start``."""
    j = start + 1
    innermost: tuple[str, str] | None = None
    while j < len(lines):
        line = lines[j]
        if not (line.startswith(indent) and line[len(indent) : len(indent) + 1] in (" ", "\t")):
            break
        if len(line) <= _MAX_PARSED_LINE_CHARS:
            frame = _PY_FRAME.match(line, len(indent))
            if frame:
                innermost = (frame.group(1), frame.group(2))
        j += 1
    if innermost is None or j >= len(lines) or not lines[j].startswith(indent):
        return None
    exception = _PY_EXCEPTION.fullmatch(_line_body(lines[j])[len(indent) :][:_MAX_PARSED_LINE_CHARS])
    if exception is None:
        return None
    error = exception.group(1)
    if exception.group(2):
        error += ": " + _shorten(exception.group(2).strip(), _MAX_MESSAGE_CHARS)
    location = f"{_base_name(innermost[0])}:{innermost[1]}"
    return f"{indent}[stack trace: {error} (at {location})]", j + 1


# JS (V8) and Java frames: "    at fn (/app/x.js:10:5)", "    at /app/x.js:10:5", "\tat a.B.c(B.java:10)".
_FRAME = re.compile(
    r"[ \t]+at[ \t]+(?:[^\r\n]*?\((?P<p1>[^()\r\n]*?):(?P<l1>\d+)(?::\d+)?\)"
    r"|(?P<p2>[^\s()]+?):(?P<l2>\d+)(?::\d+)?"
    r"|[^\r\n]*\((?:native|Native Method|Unknown Source|<anonymous>)\))[ \t]*"
)
_FRAME_FILLER = re.compile(r"[ \t]+\.\.\. \d+ (?:more|common frames omitted)[ \t]*")
_CAUSED_BY = re.compile(r"[ \t]*Caused by:[ \t]*(.+)")
_ERROR_HEADER = re.compile(r"(?:Error|Exception|Throwable|Uncaught|panic|Fatal|FATAL)")


def _frame_location(line: str) -> str | None:
    if len(line) > _MAX_PARSED_LINE_CHARS:
        return None
    frame = _FRAME.fullmatch(_line_body(line))
    if frame is None:
        return None
    path, number = (frame.group("p1"), frame.group("l1")) if frame.group("p1") else (frame.group("p2"), frame.group("l2"))
    return f"{_base_name(path)}:{number}" if path else ""


def _collapse_frame_traces(lines: list[str]) -> list[str] | None:
    out: list[str] = []
    changed = False
    i = 0
    while i < len(lines):
        if _frame_location(lines[i]) is None:
            out.append(lines[i])
            i += 1
            continue
        frames, innermost, cause, end = _scan_frames(lines, i)
        if frames < 2:
            out.extend(lines[i:end])
            i = end
            continue
        header = out[-1] if out else ""
        has_header = (
            len(header) <= _MAX_PARSED_LINE_CHARS
            and not header.startswith("[stack trace:")
            and _ERROR_HEADER.search(header) is not None
        )
        if has_header:
            out.pop()
            what = _shorten(_line_body(header).strip(), _MAX_MESSAGE_CHARS)
        else:
            what = f"{frames} frames"
        if cause:
            what += "; caused by: " + _shorten(cause, _MAX_MESSAGE_CHARS)
        where = f" (at {innermost})" if innermost else ""
        out.append(f"[stack trace: {what}{where}]")
        changed = True
        i = end
    return out if changed else None


def _scan_frames(lines: list[str], start: int) -> tuple[int, str, str, int]:
    """Scan a run of frame lines from ``start``: (frames, innermost location, last cause, end)."""
    frames = 0
    innermost = ""
    cause = ""
    j = start
    while j < len(lines):
        location = _frame_location(lines[j])
        if location is not None:
            frames += 1
            innermost = innermost or location
            j += 1
            continue
        body = _line_body(lines[j])
        if len(body) > _MAX_PARSED_LINE_CHARS:
            break
        caused = _CAUSED_BY.fullmatch(body)
        if _FRAME_FILLER.fullmatch(body) or (caused and j + 1 < len(lines) and _frame_location(lines[j + 1]) is not None):
            cause = caused.group(1).strip() if caused else cause
            j += 1
            continue
        break
    return frames, innermost, cause, j


# --------------------------------------------------------------------------- repeated lines

# Normalisation is applied to the whole text at once (C-speed), never across a newline, so the
# normalised lines stay aligned with the original ones.
_NORMALISERS: tuple[tuple[re.Pattern[str], str], ...] = (
    # The lookbehinds start a number only at its first digit: no quadratic retries in digit runs.
    (re.compile(r"(?<![\d.,])\d+(?:[.,]\d+)?[ \t]*(?:[kKMGTP]i?)?B(?:/s|ps)?\b"), "0B"),  # 1.2 MB, 950kB/s
    (re.compile(r"(?<![\d.,])\d+(?:[.,]\d+)?(?:ms|s|sec|m|min|h)\b"), "0s"),  # 12ms, 3.4s
    (re.compile(r"\d+"), "0"),
    (re.compile(r"[\u2800-\u28ff\u2580-\u259f\u2500-\u257f\u25d0-\u25d3\u25f4-\u25f7|/\\\-]"), ""),  # spinners, bars
    (re.compile(r"[=#>.*·•]{2,}"), ""),  # progress bars and trailing dots
    (re.compile(r"[ \t\r\f\v]+"), " "),
    (re.compile(r"\[ ?\]"), "[]"),  # what is left of a progress bar "[=====>    ]"
    (re.compile(r"(?m)^ | $"), ""),
)
_HAS_LETTER = re.compile(r"[^\W\d_]")


def _normalise_status(text: str) -> str:
    for pattern, replacement in _NORMALISERS:
        text = pattern.sub(replacement, text)
    return text


def _collapse_repeats(lines: list[str], min_run: int) -> list[str] | None:
    normalised = _normalise_status("\n".join(lines)).split("\n")
    in_source_code = _source_code_mask(lines)
    out: list[str] = []
    changed = False
    i = 0
    while i < len(lines):
        j = i + 1
        while j < len(lines) and normalised[j] == normalised[i] and in_source_code[j] == in_source_code[i]:
            j += 1
        run = j - i
        if run >= min_run and not in_source_code[i] and _is_status_line(lines[i], normalised[i]):
            out.append(_with_suffix(lines[j - 1], f" [repeated {run} times]"))
            changed = True
        else:
            out.extend(lines[i:j])
        i = j
    return out if changed else None


# Fenced blocks labelled with one of these hold terminal output, where repeats are noise; any
# other label is source code, where ``x1 = f(1)``, ``x2 = f(2)`` ... must survive.
_OUTPUT_FENCE_LABELS = frozenset({"", "text", "txt", "plaintext", "console", "shell", "sh", "bash", "zsh", "log", "output", "terminal"})


def _source_code_mask(lines: list[str]) -> list[bool]:
    mask = [False] * len(lines)
    for open_index, close_index, label in _fenced_blocks(lines):
        if label.lower() not in _OUTPUT_FENCE_LABELS:
            mask[open_index + 1 : close_index] = [True] * (close_index - open_index - 1)
    return mask


def _is_status_line(line: str, normalised: str) -> bool:
    # Blank lines, rules and table rows are structure, not status output.
    return not line.lstrip().startswith("|") and _HAS_LETTER.search(normalised) is not None


def _with_suffix(line: str, suffix: str) -> str:
    return line[:-1] + suffix + "\r" if line.endswith("\r") else line + suffix


# --------------------------------------------------------------------------- code blocks

# The label cannot contain whitespace and the rest must start with it: no ambiguous split.
_FENCE_OPEN = re.compile(r"( {0,3})(`{3,}|~{3,})[ \t]*([^`\s]*)(?:[ \t][^`\r\n]*)?")


def _fenced_blocks(lines: list[str]) -> list[tuple[int, int, str]]:
    """(opening index, closing index or len(lines) if unclosed, first word of the info string)."""
    blocks: list[tuple[int, int, str]] = []
    i = 0
    while i < len(lines):
        fence = _FENCE_OPEN.fullmatch(_line_body(lines[i])) if len(lines[i]) <= _MAX_PARSED_LINE_CHARS else None
        if fence is None:
            i += 1
            continue
        close = _find_closing_fence(lines, i + 1, fence.group(2))
        blocks.append((i, close, fence.group(3)))
        i = close + 1
    return blocks


def _find_closing_fence(lines: list[str], start: int, opening: str) -> int:
    closing = re.compile(r" {0,3}" + re.escape(opening[0]) + "{" + str(len(opening)) + r",}[ \t]*")
    for j in range(start, len(lines)):
        if len(lines[j]) <= _MAX_PARSED_LINE_CHARS and closing.fullmatch(_line_body(lines[j])):
            return j
    return len(lines)


def _truncate_code_blocks(lines: list[str], settings: NoiseSettings) -> list[str] | None:
    out: list[str] = []
    copied_up_to = 0
    for open_index, close_index, _label in _fenced_blocks(lines):
        body_lines = close_index - open_index - 1
        if body_lines <= settings.max_code_block_lines:
            continue
        head_end = open_index + 1 + settings.code_head_lines
        indent = lines[open_index][: len(lines[open_index]) - len(lines[open_index].lstrip(" "))]
        out.extend(lines[copied_up_to:head_end])
        out.append(f"{indent}[... {body_lines - settings.code_head_lines} lines truncated]")
        copied_up_to = close_index  # the closing fence (if any) is copied with what follows
    if not out:
        return None
    out.extend(lines[copied_up_to:])
    return out


# --------------------------------------------------------------------------- tool outcome

_PRIMARY_OUTCOME = re.compile(
    r"(?i)\b(?:errors?|exceptions?|fail(?:ed|ure|ures|s|ing)?|fatal|panic(?:ked)?|traceback|denied|refused|"
    r"timed out|not found|segmentation fault|abort(?:ed)?|critical)\b|\[stack trace"
)
_SUMMARY_OUTCOME = re.compile(
    r"(?i)\b(?:passed|succeeded|success(?:ful(?:ly)?)?|warn(?:ing|ings)?|exit(?:ed)? (?:code|status|with)|"
    r"returned non-zero|summary|total|finished|completed|done|ok|\d+ (?:passed|failed|errors?|tests?|skipped))\b"
)


def _reduce_to_outcome(lines: list[str]) -> list[str] | None:
    primary = [i for i, line in enumerate(lines) if _PRIMARY_OUTCOME.search(line[:_MAX_PARSED_LINE_CHARS])]
    summary = [i for i, line in enumerate(lines) if _SUMMARY_OUTCOME.search(line[:_MAX_PARSED_LINE_CHARS])]
    half = _TOOL_MAX_PRIMARY_LINES // 2
    if len(primary) > _TOOL_MAX_PRIMARY_LINES:
        primary = primary[:half] + primary[-half:]
    summary = summary[-_TOOL_MAX_SUMMARY_LINES:]
    last_content = len(lines)
    while last_content > 0 and not lines[last_content - 1].strip():
        last_content -= 1
    tail = range(max(0, last_content - _TOOL_TAIL_LINES), len(lines))  # trailing blank lines ride along
    kept = sorted(set(primary) | set(summary) | set(tail))

    out: list[str] = []
    previous = -1
    for index in kept:
        _append_gap(out, index - previous - 1)
        out.append(_cut_line(lines[index]))
        previous = index
    _append_gap(out, len(lines) - previous - 1)
    return out if out != lines else None


def _append_gap(out: list[str], dropped: int) -> None:
    if dropped > 0:
        out.append(f"[... {dropped} lines dropped]")


def _cut_line(line: str) -> str:
    if len(line) <= _TOOL_MAX_LINE_CHARS:
        return line
    return line[:_TOOL_MAX_LINE_CHARS] + f" [... truncated {len(line) - _TOOL_MAX_LINE_CHARS} chars]"


# --------------------------------------------------------------------------- size cap


def _cap_marker(removed: int) -> str:
    return f"\n[... truncated {removed} chars]\n"


def _cap_size(text: str, max_chars: int) -> str | None:
    """Keep head (3/4) and tail (1/4) of the budget around an exact marker; None if it fits."""
    if len(text) <= max_chars:
        return None
    budget = max_chars - len(_cap_marker(len(text)))  # marker for the largest possible count
    head = budget * 3 // 4
    tail = budget - head
    removed = len(text) - head - tail
    return text[:head] + _cap_marker(removed) + text[len(text) - tail :]

