"""Secret scrubbing for chat message text: the turn-detector scrubs every message before it
leaves, and ``engram dlq`` / ``engram promote`` scrub what they show or publish (shared, so it
lives in engram/, below the services).

Every secret found is replaced by a typed placeholder ``[REDACTED:<kind>]`` while the
surrounding structure stays readable: assignments keep their key (``password=[REDACTED:password]``),
URLs keep scheme, user and host (``postgres://app:[REDACTED:url_password]@db:5432/x``),
authorization headers keep their scheme (``Authorization: Bearer [REDACTED:bearer_token]``) and a
PEM private key block is replaced as a whole.

Why hand-written: detect-secrets (and similar scanners) are file/line *scanners* built around
plugins and entropy heuristics that report findings; they do not rewrite text, do not tell
which span inside a line to replace, and their entropy checks flag hashes, UUIDs and base64
payloads that are not secrets. Here we need a deterministic, dependency-free *replacer* over
free-form chat text, so the patterns are explicit ``re`` expressions, each written to scan in
linear time (anchored run starts, bounded or unambiguous repeats, no nested quantifiers).

How it works: rules run in a fixed order, most specific first (PEM block, provider-prefixed
tokens, JWT, AWS secret key assignment, ADO/ODBC ``Password=...;``, URL userinfo, authorization
headers, then generic ``key=value`` assignments; an AWS secret key told in prose is looked for
before the assignments and again after them, its context read with placeholders left out).
Every rule refuses values that already contain a placeholder, so a secret is counted once, by the
most specific kind, and scrubbing is idempotent (``scrub(scrub(x)) == scrub(x)``).

Known limits (kept deliberately, to avoid redacting ordinary prose and code):
- Only secrets with a recognisable shape or a telling key are found. A bare password in prose
  ("the password is hunter2", ``--password hunter2``, ``-phunter2``) or a random high-entropy
  string with no key is *not* detected; there is no entropy scoring.
- Generic assignments need a key ending in a known name (password, passwd, pwd, passphrase,
  ``*_pass``, secret, ``*_secret_key``, token, api_key/apikey, access_key, auth_key,
  private_key). Values that look like code or placeholders are left alone: ``None``/``null``/
  booleans, calls and subscripts (``getpass()``, ``os.environ["X"]``), dotted references,
  snake_case identifiers, ``$VAR``/``${VAR}``/``{x}``/``<x>``/``[x]``/``%s`` templates, masks
  (``***``, ``xxxx``), paths, values equal to the key name and values under 4 characters.
- After ``:`` or a spaced ``=`` an unquoted value is only taken when it has secret texture
  (a digit, a symbol, an inner capital, or 20+ characters); so ``password: hunter`` in YAML is
  missed, while ``password: hunter2`` is caught. Quoted values are always taken (except the
  placeholder shapes above), which may over-redact UI strings such as ``"token": "Session expired"``.
- An unquoted value ends at whitespace or one of ``"'`,;&``; trailing ``.)]}>`` is treated as
  surrounding punctuation. A password containing those characters is only partly redacted
  unless it is quoted or in an ADO/ODBC connection string.
- For linear time the rules judge a value by its first 256 characters (an accepted value is
  still redacted to its end); quoted values longer than 1024 characters, URL passwords longer
  than 256 and ``{...}`` ODBC values longer than 256 are not considered at all.
- Provider token shapes are the documented public prefixes; a provider changing its format, or
  a token split over lines, is missed. An unterminated PEM block is redacted up to the end of
  its base64 lines; text between a BEGIN line and the next END line is always removed.
- Cookies, ``Set-Cookie``, Slack webhook URLs and cloud credential files other than AWS are
  not covered specifically (a ``token=``/``secret=`` inside them still is).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any
from dataclasses import dataclass

SECRET_KINDS: tuple[str, ...] = (
    "private_key",
    "anthropic_key",
    "openai_key",
    "github_token",
    "gitlab_token",
    "slack_token",
    "stripe_key",
    "google_api_key",
    "huggingface_token",
    "npm_token",
    "aws_access_key_id",
    "jwt",
    "aws_secret_access_key",
    "connection_string_password",
    "url_password",
    "bearer_token",
    "basic_auth",
    "password",
    "secret",
    "token",
    "api_key",
)

_PLACEHOLDER_PREFIX = "[REDACTED:"


@dataclass(frozen=True)
class ScrubResult:
    text: str
    counts: dict[str, int]  # kind -> number of replacements (only kinds that occurred)


def placeholder(kind: str) -> str:
    return f"{_PLACEHOLDER_PREFIX}{kind}]"


# A rule finds candidate matches; its locator decides which span is the secret and of which
# kind, or None to leave the candidate alone (the scan then resumes one character later).
SecretSpan = tuple[int, int, str]
Locator = Callable[[re.Match[str]], SecretSpan | None]


@dataclass(frozen=True)
class _Rule:
    pattern: re.Pattern[str]
    locate: Locator


_PLACEHOLDER_RE = re.compile(r"\[REDACTED:([a-z_]+)\]")


def _widen_over_placeholders(text: str, start: int, end: int, counts: dict[str, int]) -> tuple[int, int]:
    """A later rule's span may cover part of an earlier rule's placeholder (``_authToken=`` whose
    value runs into a redacted Google key): take such placeholders whole into the new span and
    stop counting them, so one secret is one placeholder and one count."""
    for m in _PLACEHOLDER_RE.finditer(text, max(0, start - 64), min(len(text), end + 64)):
        if m.start() < end and m.end() > start:
            start, end = min(start, m.start()), max(end, m.end())
            kind = m.group(1)
            if counts.get(kind, 0) > 0:
                counts[kind] -= 1
                if counts[kind] == 0:
                    del counts[kind]
    return start, end


def _replace_spans(text: str, rule: _Rule, counts: dict[str, int]) -> str:
    pieces: list[str] = []
    copied_up_to = 0
    search_from = 0
    while search_from <= len(text):
        match = rule.pattern.search(text, search_from)
        if match is None:
            break
        span = rule.locate(match)
        if span is None:
            search_from = match.start() + 1
            continue
        start, end, kind = span
        start, end = _widen_over_placeholders(text, max(start, copied_up_to), end, counts)
        pieces.append(text[copied_up_to:start])
        pieces.append(placeholder(kind))
        copied_up_to = end
        search_from = max(end, match.end())
        counts[kind] = counts.get(kind, 0) + 1
    if not pieces:
        return text
    pieces.append(text[copied_up_to:])
    return "".join(pieces)


# --------------------------------------------------------------------------- value heuristics

_CODE_LITERALS = frozenset(
    {"none", "null", "nil", "true", "false", "undefined", "yes", "no", "on", "off", "empty", "nan", "required"}
)
_MASK = re.compile(r"[*xX•.#?_\-]+")
_TEMPLATE_START = ("$", "%", "{", "<", "!")  # $VAR ${VAR} %s {x} {{x}} <x> !vault (YAML tag)
_PLACEHOLDER_WORDS = re.compile(r"(?i)(?:your|insert|replace|enter|example|dummy|placeholder|redacted)(?:[_\- ]|$)")
_CALL_OR_SUBSCRIPT = re.compile(r"[A-Za-z_][\w.]*[(\[]")
_DOTTED_REFERENCE = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
_SNAKE_IDENTIFIER = re.compile(r"_*[A-Za-z]+(?:_+[A-Za-z]+)+_*")
_PATH = re.compile(r"(?:~|\.{1,2})?/[\w.\-]+(?:/[\w.\-]*)*|[A-Za-z]:\\.*")
_SECRET_TEXTURE = re.compile(r"\d|[^\w\s]|.[A-Z]")
_BARE_TRAILING_PUNCTUATION = ".)]}>"


def _is_placeholder(value: str, key: str) -> bool:
    lowered = value.lower()
    return (
        _PLACEHOLDER_PREFIX in value
        or value.startswith(_TEMPLATE_START)
        or (value[0] == "[" and value[-1] == "]")
        or _MASK.fullmatch(value) is not None
        or _PLACEHOLDER_WORDS.match(value) is not None
        or lowered in _CODE_LITERALS
        or lowered == key.lower()
        or lowered == _key_basename(key)
    )


def _key_basename(key: str) -> str:
    return re.split(r"[_.\-]", key.lower())[-1]


def _looks_like_code(value: str) -> bool:
    return (
        _CALL_OR_SUBSCRIPT.match(value) is not None
        or _DOTTED_REFERENCE.fullmatch(value) is not None
        or _SNAKE_IDENTIFIER.fullmatch(value) is not None
        or _PATH.fullmatch(value) is not None
    )


def _is_literal_secret(value: str, *, key: str, kind: str, quoted: bool, weak_context: bool) -> bool:
    """Whether an assigned value looks like a literal secret rather than code or a placeholder."""
    if len(value) < 4 or _is_placeholder(value, key):
        return False
    if value.isdigit() and kind not in ("password", "connection_string_password"):
        return False  # max_token=4096, secret: 0
    if quoted:
        return value == value.strip()  # "password: " + pw is string concatenation, not a value
    if _looks_like_code(value):
        return False
    return not weak_context or len(value) >= 20 or _SECRET_TEXTURE.search(value) is not None


# Regexes look at most this far into an unquoted value, so a rejected candidate costs O(1) and
# the scan stays linear; an *accepted* value that reaches the bound is then extended to its end
# (which is consumed, so that is linear too). Quoted values are taken up to 1024 characters.
_MAX_SCANNED_VALUE = 256
_BARE_VALUE_REST = re.compile(r"[^\s\"'`,;&]*")


def _extend(rest: re.Pattern[str], text: str, position: int, trim: Callable[[str], str]) -> int:
    tail = rest.match(text, position)
    return position + len(trim(tail.group())) if tail else position


def _strip_bare_punctuation(text: str, start: int, end: int) -> int:
    while end > start and text[end - 1] in _BARE_TRAILING_PUNCTUATION:
        end -= 1
    return end


# --------------------------------------------------------------------------- PEM blocks

_PEM_BEGIN = re.compile(r"-----BEGIN[ A-Z0-9]{0,40}PRIVATE KEY(?: BLOCK)?-----")
_PEM_END = re.compile(r"-----END[ A-Z0-9]{0,40}PRIVATE KEY(?: BLOCK)?-----")
# Body of an unterminated block: following base64 or header lines (real or JSON-escaped breaks).
_PEM_BODY = re.compile(
    r"(?:(?:[ \t]+|(?:\r?\n|\\n){1,2})(?:[A-Za-z0-9+/=]{4,}|(?:Proc-Type|DEK-Info):[^\r\n\\]*)(?=[ \t]|\r|\n|\\n|$))*"
)


def _redact_pem_blocks(text: str, counts: dict[str, int]) -> str:
    pieces: list[str] = []
    copied_up_to = 0
    end_exists = True  # once no END follows, none follows later BEGINs either: stays linear
    search_from = 0
    while True:
        begin = _PEM_BEGIN.search(text, search_from)
        if begin is None:
            break
        end = _PEM_END.search(text, begin.end()) if end_exists else None
        if end is not None:
            block_end = end.end()
        else:
            end_exists = False
            body = _PEM_BODY.match(text, begin.end())
            block_end = body.end() if body else begin.end()
        pieces.append(text[copied_up_to : begin.start()])
        pieces.append(placeholder("private_key"))
        copied_up_to = search_from = block_end
        counts["private_key"] = counts.get("private_key", 0) + 1
    if not pieces:
        return text
    pieces.append(text[copied_up_to:])
    return "".join(pieces)


# --------------------------------------------------------------------------- token shapes

# Left boundary: a token must not continue a longer identifier (``xghp_...`` is not a token).
_LB = r"(?<![A-Za-z0-9_\-])"


def _whole_match(kind: str) -> Locator:
    return lambda match: (match.start(), match.end(), kind)


def _token_rule(pattern: str, kind: str) -> _Rule:
    return _Rule(re.compile(_LB + pattern), _whole_match(kind))


_TOKEN_RULES: tuple[_Rule, ...] = (
    _token_rule(r"sk-ant-[A-Za-z0-9_\-]{20,}", "anthropic_key"),
    # Real OpenAI keys always contain digits; requiring one spares long hyphenated slugs.
    _token_rule(r"sk-(?:proj-|svcacct-|admin-)?(?=[A-Za-z_\-]*\d)[A-Za-z0-9_\-]{20,}", "openai_key"),
    _token_rule(r"(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,})", "github_token"),
    _token_rule(r"glpat-[A-Za-z0-9_\-]{20,}", "gitlab_token"),
    _token_rule(r"xox[abprs]-(?=[A-Za-z\-]*\d)[A-Za-z0-9\-]{10,}", "slack_token"),
    _token_rule(r"(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{10,}", "stripe_key"),
    _token_rule(r"AIza[A-Za-z0-9_\-]{35}(?![A-Za-z0-9_\-])", "google_api_key"),
    _token_rule(r"hf_[A-Za-z0-9]{30,}", "huggingface_token"),
    _token_rule(r"npm_[A-Za-z0-9]{36}(?![A-Za-z0-9])", "npm_token"),
    _Rule(re.compile(r"(?<![A-Za-z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])"), _whole_match("aws_access_key_id")),
    _token_rule(r"eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{4,}\.[A-Za-z0-9_\-]*", "jwt"),
)

# --------------------------------------------------------------------------- keyed secrets

_SEPARATOR = r"[ \t]*(?::=|=>|=(?!=)|:(?![:=]))[ \t]*"

_AWS_SECRET_ASSIGNMENT = re.compile(
    r"(?i)(?<![A-Za-z0-9_.\-])(?:[A-Za-z0-9_.\-]*?[_.\-])?(?:aws_?)?secret_?(?:access_?)?key[\"']?"
    + _SEPARATOR
    + r"[\"']?(?P<value>[A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])"
)


def _locate_aws_secret(match: re.Match[str]) -> SecretSpan | None:
    return match.start("value"), match.end("value"), "aws_secret_access_key"


# An AWS secret access key told in prose ("use AKIA... with secret wJalr...", "the secret key is
# wJalr..."): 40 base64 characters with both cases and a digit, '/' or '+' (a git SHA is lowercase
# hex, a word has no digit), with "secret"/"aws"/"credential" or an access key id close before it,
# or an access key id close after it. The window is bounded, so each candidate costs O(1).
_AWS_SECRET_SHAPE = re.compile(r"(?<![A-Za-z0-9/+=])(?P<value>[A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])")
_AWS_KEY_ID_MARK = "\x00AKID\x00"  # an access key id, redacted or not, in a context window
_AWS_SECRET_BEFORE = re.compile(r"(?i)secret|aws|credential|\x00AKID\x00|(?:AKIA|ASIA)[A-Z0-9]{16}")
_AWS_SECRET_AFTER = re.compile(r"\x00AKID\x00|(?:AKIA|ASIA)[A-Z0-9]{16}")
_AWS_SECRET_WINDOW = 80
# raw characters read around a candidate before placeholders and other candidates are left out:
# room for a few of them (a placeholder is at most ~35 characters) and still the window's 80
_AWS_SECRET_READ = 400


def _context(raw: str) -> str:
    """A context window's text as both scrubs of a text see it: placeholders left out (a kind's
    name, "secret" in ``[REDACTED:secret]``, says nothing about what follows, and a first scrub
    had the value there instead), but an access key id's kept as a mark; other 40-character
    candidates left out too (the first scrub saw them, the second may see their placeholder)."""
    raw = _PLACEHOLDER_RE.sub(lambda m: _AWS_KEY_ID_MARK if m.group(1) == "aws_access_key_id" else "", raw)
    return _AWS_SECRET_SHAPE.sub("", raw)


def _locate_aws_secret_in_prose(match: re.Match[str]) -> SecretSpan | None:
    value = match.group("value")
    if not (any(c.isupper() for c in value) and any(c.islower() for c in value)
            and any(c.isdigit() or c in "/+" for c in value)):
        return None
    if value[0] == "/" or "//" in value or value.count("/") > 4:
        return None  # a path of exactly 40 characters ("s3://bucket/Some/Path"), not a key
    text = match.string
    before = _context(text[max(0, match.start() - _AWS_SECRET_READ) : match.start()])[-_AWS_SECRET_WINDOW:]
    after = _context(text[match.end() : match.end() + _AWS_SECRET_READ])[:_AWS_SECRET_WINDOW]
    if _AWS_SECRET_BEFORE.search(before) is None and _AWS_SECRET_AFTER.search(after) is None:
        return None
    return match.start("value"), match.end("value"), "aws_secret_access_key"


# ``.env`` / shell style ``NAME=value`` whose UPPER_CASE name ends in a word that says secret
# (``SIGNING_KEY``, ``SMTP_CREDENTIALS``, ``export DB_PASS=...``): the generic assignment rule
# below needs a longer telling name (``api_key``, ``*_secret_key``), because a lowercase
# ``key=value`` in prose or code is rarely a secret; an upper-case env name ending in KEY is.
_ENV_ASSIGNMENT = re.compile(
    r"(?<![A-Za-z0-9_.\-$])(?P<key>[A-Z][A-Z0-9_]{0,80})[ \t]*=(?!=)[ \t]*"
    r"(?:\"(?P<dq>[^\"\r\n]{1,1024})\"|'(?P<sq>[^'\r\n]{1,1024})'|(?P<bare>[^\s\"'`,;&]{1,256}))"
)
_ENV_SECRET_WORDS = frozenset({"KEY", "SECRET", "TOKEN", "PASSWORD", "PASSWD", "PASS", "PWD", "PASSPHRASE",
                               "CREDENTIAL", "CREDENTIALS", "APIKEY", "SECRETKEY", "PRIVATEKEY", "AUTH"})
_ENV_NOT_SECRET = frozenset({"PUBLIC_KEY", "PUBLISHABLE_KEY", "SORT_KEY", "PRIMARY_KEY", "FOREIGN_KEY",
                             "PARTITION_KEY", "CACHE_KEY", "ROUTING_KEY", "SHARD_KEY", "HOTKEY"})


def _env_kind(key: str) -> str | None:
    last = key.rstrip("_").rsplit("_", 1)[-1]
    if last not in _ENV_SECRET_WORDS or any(key.endswith(name) for name in _ENV_NOT_SECRET):
        return None
    return assignment_kind(key) or ("password" if last in ("PASS", "PWD") else "secret")


def _locate_env_assignment(match: re.Match[str]) -> SecretSpan | None:
    key = match.group("key")
    kind = _env_kind(key)
    if kind is None:
        return None
    return _assigned_value(match, key, kind, weak_context=False, inside_literal_check=False)


def _assigned_value(match: re.Match[str], key: str, kind: str, *, weak_context: bool,
                    inside_literal_check: bool) -> SecretSpan | None:
    """The span of an assignment's value (groups ``dq``, ``sq`` or ``bare``) when it is a literal
    secret. ``inside_literal_check``: a quoted value followed by an identifier character means the
    "key" sat inside a string literal (``"password: " + x + "y"``): no assignment."""
    text = match.string
    for group in ("dq", "sq"):
        if match.group(group) is not None:
            if inside_literal_check and _IDENTIFIER_CHAR.match(text[match.end() : match.end() + 1]):
                return None
            if not _is_literal_secret(match.group(group), key=key, kind=kind, quoted=True, weak_context=False):
                return None
            return match.start(group), match.end(group), kind
    start, scanned_end = match.start("bare"), match.end("bare")
    end = _strip_bare_punctuation(text, start, scanned_end)
    if not _is_literal_secret(text[start:end], key=key, kind=kind, quoted=False, weak_context=weak_context):
        return None
    if scanned_end - start == _MAX_SCANNED_VALUE:
        end = _extend(_BARE_VALUE_REST, text, scanned_end, lambda rest: rest.rstrip(_BARE_TRAILING_PUNCTUATION))
    return start, end, kind


# ADO.NET / ODBC: ``Server=x;User Id=y;Password=p w;`` or ``PWD={p;w}``. Values may hold spaces.
_CONNECTION_PASSWORD = re.compile(
    r"(?i)(?<![A-Za-z0-9_.\-])(?:password|pwd)[ \t]*=(?!=)[ \t]*"
    r"(?P<value>\{[^}\r\n]{0,256}\}|[^;\r\n\"'{][^;\r\n\"']{0,255})"
)
_CONNECTION_VALUE_REST = re.compile(r"[^;\r\n\"']*")
_CONNECTION_FIELD = re.compile(
    r"(?i)(?:^|[;\"'\s])(?:server|data source|host|database|initial catalog|uid|user id|user|username|"
    r"driver|dsn|port|address|addr|provider)[ \t]*="
)


def _locate_connection_password(match: re.Match[str]) -> SecretSpan | None:
    text = match.string
    start = match.start("value")
    value = match.group("value").rstrip(" \t")
    end = start + len(value)
    inner = value[1:-1] if value.startswith("{") else value
    if not inner or _is_placeholder(inner, "password") or _looks_like_code(inner):
        return None
    if value.count(")") > value.count("("):
        return None  # connect(host=h, password=pw); -- a call's keyword argument, not a string
    # The field must sit between ';' separators (or open/close a quoted connection string).
    before = text[max(0, match.start() - 40) : match.start()].rstrip(" \t")
    opens_field = before == "" or before.endswith((";", '"', "'"))
    closes_field = text.startswith(";", end) or text.startswith(";", match.end())
    if not (opens_field or closes_field):
        return None
    window = text[max(0, match.start() - 300) : min(len(text), end + 300)]
    if ";" not in window or _CONNECTION_FIELD.search(window) is None:
        return None
    if len(match.group("value")) == _MAX_SCANNED_VALUE and not value.startswith("{"):
        end = _extend(_CONNECTION_VALUE_REST, text, match.end("value"), lambda rest: rest.rstrip(" \t"))
    return start, end, "connection_string_password"


# ``scheme://user:password@host``; the password runs to the last ``@`` of the authority.
_URL_USERINFO = re.compile(
    r"(?<![A-Za-z0-9+.\-])[A-Za-z][A-Za-z0-9+.\-]{0,30}://[^\s:/?#@\"'<>]{0,128}:(?P<value>[^\s/?#\"'<>]{1,256})@(?=[\w\[])"
)


def _locate_url_password(match: re.Match[str]) -> SecretSpan | None:
    value = match.group("value")
    if _is_placeholder(value, "password"):
        return None
    return match.start("value"), match.end("value"), "url_password"


_AUTH_HEADER = re.compile(
    r"(?i)(?<![A-Za-z0-9_\-])(?:(?P<header>(?:proxy-)?authorization)[\"']?[ \t]*[:=][ \t]*[\"']?)?"
    r"(?P<scheme>bearer|basic|token)[ \t]+(?P<value>[A-Za-z0-9._~+/\-]+=*)"
)
_HAS_DIGIT = re.compile(r"\d")


def _locate_auth_header(match: re.Match[str]) -> SecretSpan | None:
    value = match.group("value")
    scheme = match.group("scheme").lower()
    if _MASK.fullmatch(value):
        return None
    if match.group("header") is not None:
        if len(value) < 3:
            return None
        kind = "basic_auth" if scheme == "basic" else "bearer_token"
    elif scheme == "bearer" and len(value) >= 16 and _HAS_DIGIT.search(value):
        kind = "bearer_token"  # "Bearer <long token>" outside a header; prose has no digits there
    else:
        return None
    return match.start("value"), match.end("value"), kind


# Generic ``key = value``: key names end in a telling word; quoted (JSON, code) or bare values.
_ASSIGNMENT = re.compile(
    r"""(?ix)
    (?<![A-Za-z0-9_.\-])
    (?P<key>[A-Za-z0-9_.\-]*?(?:passw(?:or)?d|passphrase|pwd|pass|token
        |secret(?:[_.\-]?access)?(?:[_.\-]?key)?|api[_.\-]?key|access[_.\-]?key|auth[_.\-]?key|private[_.\-]?key))
    [\"']?
    (?:[ \t]*:[ \t]*(?:str|bytes|string|SecretStr|Optional\[str\])[ \t]*(?==))?   # "password: str = ..."
    (?P<sep>[ \t]*(?::=|=>|=(?!=)|:(?![:=]))[ \t]*)
    (?:"(?P<dq>(?:[^"\\\r\n]|\\.){0,1024})"
      |'(?P<sq>(?:[^'\\\r\n]|\\.){0,1024})'
      |(?P<bare>[^\s"'`,;&]{1,256}))
    """
)


def assignment_kind(key: str) -> str | None:
    """Kind for a key name (``DB_PASSWORD`` -> password, ``clientSecret`` -> secret), or None."""
    lowered = key.lower()
    if lowered.endswith(("password", "passwd", "passphrase", "pwd")):
        return "password"
    if lowered.endswith("pass"):
        # ``db_pass``/``dbPass`` yes; ``bypass``/``compass`` no.
        standalone = len(lowered) == 4 or lowered[-5] in "_.-" or (key[-4] == "P" and key[-5].islower())
        return "password" if standalone else None
    compact = re.sub(r"[_.\-]", "", lowered)
    if compact.endswith("privatekey"):
        return "private_key"
    if compact.endswith(("secretaccesskey", "secretkey", "secret")):
        return "secret"
    if compact.endswith("token"):
        return "token"
    if compact.endswith(("apikey", "accesskey", "authkey")):
        return "api_key"
    return None


_IDENTIFIER_CHAR = re.compile(r"\w")


def _locate_assignment(match: re.Match[str]) -> SecretSpan | None:
    key = match.group("key")
    kind = assignment_kind(key)
    if kind is None:
        return None
    separator = match.group("sep")
    weak_context = separator.strip() == ":" or separator != separator.strip()
    return _assigned_value(match, key, kind, weak_context=weak_context, inside_literal_check=True)


_AWS_SECRET_IN_PROSE = _Rule(_AWS_SECRET_SHAPE, _locate_aws_secret_in_prose)
_KEYED_RULES: tuple[_Rule, ...] = (
    _Rule(_AWS_SECRET_ASSIGNMENT, _locate_aws_secret),
    _AWS_SECRET_IN_PROSE,  # before the assignments: its kind wins ("AWS_SECRET=<40 characters>")
    _Rule(_CONNECTION_PASSWORD, _locate_connection_password),
    _Rule(_URL_USERINFO, _locate_url_password),
    _Rule(_AUTH_HEADER, _locate_auth_header),
    _Rule(_ASSIGNMENT, _locate_assignment),
    _Rule(_ENV_ASSIGNMENT, _locate_env_assignment),
    # and again last: it reads the text around a candidate, which a second scrub sees with every
    # other rule's placeholders in it, so the first must too (found by the idempotence property
    # test: 'KEY=000:"<40 characters>' was left by the first scrub and taken by the second)
    _AWS_SECRET_IN_PROSE,
)


# Every rule above needs one of these substrings (a token prefix, a telling key, a URL scheme
# separator, an auth scheme or a PEM header). Most chat text contains none, and one search is
# ~20x cheaper than running every rule; tests/.../test_secrets.py checks that the result with
# and without this shortcut is identical.
_TRIGGER = re.compile(
    r"(?i)sk-|gh[pousr]_|github_pat_|glpat-|xox|sk_|rk_|aiza|hf_|npm_|akia|asia|eyj|-----begin"
    r"|secret|key|pass|pwd|token|://|bearer|basic|authoriz|aws|credential|auth"
)


def scrub_secrets(text: str) -> ScrubResult:
    """Replace every detected secret in ``text`` by ``[REDACTED:<kind>]``; see the module limits."""
    if not _TRIGGER.search(text):
        return ScrubResult(text, {})
    return _scrub_all_rules(text)


def _scrub_all_rules(text: str) -> ScrubResult:
    counts: dict[str, int] = {}
    scrubbed = _redact_pem_blocks(text, counts)
    for rule in (*_TOKEN_RULES, *_KEYED_RULES):
        scrubbed = _replace_spans(scrubbed, rule, counts)
    return ScrubResult(scrubbed, counts)


def scrub_keyed_value(key: str, value: str) -> ScrubResult:
    """A value stored under a name (a preference, a metadata field, a JSON member): redacted whole
    when the name says it holds a secret and the value looks like a literal one (a preference
    ``aws_secret_access_key`` -> ``wJalr...``, whose value alone has no context), else scrubbed as
    text like any other."""
    kind = assignment_kind(key) or _env_kind(key.upper().replace("-", "_").replace(".", "_"))
    if kind == "secret" and re.sub(r"[_.\-]", "", key.lower()).endswith("secretaccesskey"):
        kind = "aws_secret_access_key"
    stripped = value.strip()
    if kind is not None and stripped and _is_literal_secret(stripped, key=key, kind=kind, quoted=True,
                                                            weak_context=False):
        return ScrubResult(placeholder(kind), {kind: 1})
    return scrub_secrets(value)


def scrub_json(value: Any, key: str | None = None) -> tuple[Any, dict[str, int]]:
    """Secrets scrubbed from a decoded JSON document, string by string, each member's value judged
    with its name (:func:`scrub_keyed_value`); the structure is kept, so the result is still valid
    JSON of the same shape. Returns the document and the counts by kind (empty: unchanged)."""
    counts: dict[str, int] = {}

    def walk(item: Any, name: str | None) -> Any:
        if isinstance(item, str):
            result = scrub_keyed_value(name, item) if name else scrub_secrets(item)
            for kind, n in result.counts.items():
                counts[kind] = counts.get(kind, 0) + n
            return result.text
        if isinstance(item, list):
            return [walk(v, name) for v in item]
        if isinstance(item, dict):
            return {k: walk(v, k if isinstance(k, str) else None) for k, v in item.items()}
        return item

    return walk(value, key), counts
