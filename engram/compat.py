"""Every place engram relies on a library's private API, in one module.

engram pins its libraries (pyproject.toml, requirements.lock). Where a pinned library offers no
public way to do what engram needs, the private attribute, method or function is used here and
only here, one function per hook, each with what it does, why there is no public API and the
version it was written against. tests/engram/test_compat.py checks every hook against the
installed library (the attribute exists, the signature and the behaviour engram relies on are
unchanged), so upgrading a pin fails those tests loudly instead of breaking a service quietly.

Hooks (library, pinned version, private name):

* FastStream 0.7.8: ``_create_subscription`` of a NATS pull subscriber (:func:`stop_fetching`)
  and ``AsgiFastStream.not_found`` (:func:`route_unmatched_http`);
* graphiti-core 0.31.1: FalkorDriver's ``_get_graph`` (:func:`falkor_graph`), a driver's
  ``_database`` (:func:`driver_database`) and ``_init_task`` (:func:`take_index_build`),
  ``dedup_helpers._normalize_string_exact`` (:func:`normalize_name_exact`),
  ``edge_operations._apply_temporal_invalidation`` (:func:`wrap_temporal_invalidation`);
* graphiti-core 0.31.1 LLMClient helpers that engram's OpenAI-compatible client (which
  replaces ``generate_response``) keeps using: ``_generate_response_with_retry``
  (:func:`generate_with_retry`), ``_apply_attribute_extraction_preamble``
  (:func:`apply_attribute_extraction_preamble`), ``_clean_input`` (:func:`clean_llm_input`) and
  OpenAIGenericClient's ``_strip_code_fences`` (:func:`strip_code_fences`);
* bm25s 0.3.16: ``scoring._select_idf_scorer`` / ``_select_tfc_scorer``
  (:func:`bm25_idf_scorer`, :func:`bm25_tfc_scorer`);
* nats-py 2.16.0: a ``JetStreamContext``'s connection ``_nc`` (:func:`jetstream_connection`).

Not hooks, though the names start with an underscore: graphiti's ``LLMClient._generate_response``
is the abstract method its documentation tells an LLMClient subclass to implement (engram's
rules model, OpenAI-compatible client, recall's no-LLM stand-in and the delegating wrappers do),
so it is a subclass contract; the test module still checks that contract. Public API replaced
what used to reach in elsewhere: FastStream's ``broker.connection`` (instead of
``broker.config.connection_state``, see engram/runtime/service.py :func:`~engram.runtime.service.jetstream`) and
nats-py's ``Client.connected_server_version`` (instead of ``_server_info``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

Asgi = Callable[[Any, Any, Any], Awaitable[None]]


# --------------------------------------------------------------------------------- FastStream


async def _never_fetch() -> None:
    """Stands in for the subscriber's ``_create_subscription``: engram's CapacityPuller fetches."""


def stop_fetching(subscriber: Any) -> None:
    """Keep a FastStream NATS pull subscriber registered (handler, middlewares, AsyncAPI entry,
    ``subscriber.consume``) but stop it from creating its pull subscription and fetch loop.

    Why private: FastStream 0.7.8 creates the subscription and starts its fetch task in the
    subscriber's ``_create_subscription``, called by ``start()`` whenever a handler is
    registered; there is no option to register a handler without FastStream fetching for it.
    engram's :class:`~engram.runtime.service.CapacityPuller` pulls instead (only when a slot is free) and
    hands each message to the public ``subscriber.consume``. Raises when the method is gone, so
    an upgrade cannot leave two pullers running.
    """
    if not callable(getattr(type(subscriber), "_create_subscription", None)):
        raise RuntimeError(f"{type(subscriber).__name__} has no _create_subscription to replace (FastStream changed)")
    subscriber._create_subscription = _never_fetch


def route_unmatched_http(app: Any, http: Asgi) -> None:
    """Send every HTTP request that none of ``app``'s own routes matches to ``http`` (another ASGI
    app); other scopes (websocket) keep FastStream's answer.

    Why private: FastStream 0.7.8's ``AsgiFastStream`` matches its routes (``/metrics``,
    ``/healthz`` ...) by exact path and answers anything else with its ``not_found`` method; it
    has no mount or fallback option, and wrapping the app from outside would hide the
    ``AsgiFastStream`` (lifespan, ``run``) that the service runner needs. So ``not_found`` is
    replaced on this instance.
    """
    if not callable(getattr(app, "not_found", None)):
        raise RuntimeError(f"{type(app).__name__} has no not_found to replace (FastStream changed)")
    fallback = app.not_found

    async def not_found(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            await http(scope, receive, send)
        else:
            await fallback(scope, receive, send)

    app.not_found = not_found


# --------------------------------------------------------------------------------- graphiti-core


def falkor_graph(driver: Any) -> Any:
    """The raw FalkorDB graph (``falkordb.asyncio.AsyncGraph``) a FalkorDriver targets.

    Why private: graphiti-core 0.31.1's FalkorDriver exposes its client (``driver.client``) but
    the graph it targets only through ``_get_graph(None)`` (the name is ``_database``). engram
    queries the raw graph for what graphiti has no call for (the vector index on facts, its
    queries), and raw, because ``driver.execute_query`` logs every failure as an error.
    """
    return driver._get_graph(None)


def driver_database(driver: Any) -> str | None:
    """The database (FalkorDB: graph name) a graphiti driver targets, None when it has none.

    Why private: graphiti-core 0.31.1 stores it as ``GraphDriver._database`` and offers
    ``with_database``/``clone`` to change it, but no getter.
    """
    return getattr(driver, "_database", None)


def take_index_build(driver: Any) -> asyncio.Task[Any] | None:
    """The index build a graphiti driver's constructor scheduled (None when none was), handed to
    the caller: the driver forgets it, so the caller awaits or cancels it.

    Why private: graphiti-core 0.31.1's FalkorDriver and Neo4jDriver constructors schedule
    ``build_indices_and_constraints()`` as a task (``_init_task``) when a loop is running, and
    nothing public awaits it. A failure there (server down at that moment) would stick to the
    driver; engram awaits it once, and builds again itself on the next call if it failed.
    """
    task = getattr(driver, "_init_task", None)
    if task is not None:
        driver._init_task = None
    return task


def normalize_name_exact(name: str) -> str:
    """graphiti's exact-name key: lower case, runs of whitespace collapsed, stripped.

    Why private: graphiti-core 0.31.1 keys its own exact-name dedup with
    ``dedup_helpers._normalize_string_exact``; engram's merge of materialized endpoint nodes must
    match graphiti's keys exactly, so it calls the same function rather than a copy that could
    drift from it.
    """
    from graphiti_core.utils.maintenance.dedup_helpers import _normalize_string_exact

    return _normalize_string_exact(name)


TemporalInvalidation = Callable[[Any, list[Any]], list[Any]]


def wrap_temporal_invalidation(wrap: Callable[[TemporalInvalidation], TemporalInvalidation]) -> None:
    """Replace graphiti's date rule for contradicted facts with ``wrap(graphiti's rule)``, once
    (a second call is a no-op: the wrapper carries ``__engram_wraps__``).

    The rule, ``_apply_temporal_invalidation(resolved_edge, contradicted_candidates)``, ends the
    contradicted facts that started before the new fact, or ends the new fact itself when a
    contradicted one started after it, and returns the facts it ended.

    Why private: graphiti-core 0.31.1 applies it inside ``resolve_extracted_edges`` (engram's
    extractor calls that for dedupe and contradiction) after the LLM's contradiction answer and
    returns neither the candidates nor a hook; the function is looked up in its module's globals
    at each call, so replacing the module attribute changes what ``resolve_extracted_edges``
    does. engram's wrapper (services/extractor/told_later.py) changes the outcome only while the
    extractor has set the episode's reference time, and calls graphiti's rule otherwise.
    """
    from graphiti_core.utils.maintenance import edge_operations

    current = edge_operations._apply_temporal_invalidation
    if getattr(current, "__engram_wraps__", None) is not None:
        return
    wrapper = wrap(current)
    wrapper.__engram_wraps__ = current  # type: ignore[attr-defined]
    edge_operations._apply_temporal_invalidation = wrapper


# --------------------------------------------------------------------------------- graphiti LLMClient
# engram/models/openai_compat.py replaces graphiti's ``generate_response`` (per-prompt output
# caps, one stricter retry on a cut answer, structured-output fallback) but keeps graphiti's own
# behaviour around the HTTP call through these helpers; no public API exposes them.


async def generate_with_retry(client: Any, messages: list[Any], response_model: Any, *, max_tokens: int,
                              model_size: Any, model: str | None) -> dict[str, Any]:
    """``client._generate_response`` under graphiti's retry policy (4 attempts, random exponential
    wait, on rate limits, 5xx, empty and non-JSON answers).

    Why private: graphiti-core 0.31.1 applies that policy (tenacity) only in
    ``LLMClient._generate_response_with_retry``, which its ``generate_response`` calls.
    """
    return await client._generate_response_with_retry(messages, response_model, max_tokens=max_tokens,
                                                      model_size=model_size, model=model)


def apply_attribute_extraction_preamble(client: Any, messages: list[Any], attribute_extraction: bool) -> None:
    """Add graphiti's strict framing to the system message of attribute-extraction calls (no-op
    otherwise). Why private: graphiti-core 0.31.1 does it in
    ``LLMClient._apply_attribute_extraction_preamble`` from ``generate_response`` only."""
    client._apply_attribute_extraction_preamble(messages, attribute_extraction)


def clean_llm_input(client: Any, text: str) -> str:
    """Text without invalid unicode, zero-width and control characters (newlines and tabs kept),
    as graphiti sends it. Why private: graphiti-core 0.31.1's ``LLMClient._clean_input``."""
    return client._clean_input(text)


def strip_code_fences(client: Any, text: str) -> str:
    """A JSON answer without the markdown fence local servers wrap it in. Why private:
    graphiti-core 0.31.1's ``OpenAIGenericClient._strip_code_fences``."""
    return client._strip_code_fences(text)


# --------------------------------------------------------------------------------- nats-py


def jetstream_connection(js: Any) -> Any:
    """The ``nats.aio.client.Client`` a nats-py ``JetStreamContext`` publishes through.

    Why private: nats-py 2.16.0's ``JetStreamContext`` keeps the connection it was made from
    (``nc.jetstream()``) as ``_nc`` and has no getter. engram/runtime/dlq.py sizes a dead letter by the
    connection's public ``max_payload`` (the server's limit) and is handed only the context by
    every stage. Raises when the attribute is gone, rather than let a dead letter be sized by a
    guess.
    """
    connection = getattr(js, "_nc", None)
    if connection is None:
        raise RuntimeError(f"{type(js).__name__} has no _nc connection (nats-py changed)")
    return connection


# --------------------------------------------------------------------------------- bm25s


def bm25_idf_scorer(method: str) -> Callable[..., float]:
    """bm25s's idf function for ``method`` (robertson, lucene, atire, bm25l, bm25+), called
    ``idf(df, N=n_docs)``.

    Why private: bm25s 0.3.16 builds its score matrix inside ``BM25.index`` from a tokenized
    corpus; recall builds the same matrix from term counts it already has, with bm25s's own
    formulas (``scoring._select_idf_scorer``) so scores stay identical to bm25s's.
    """
    from bm25s.scoring import _select_idf_scorer

    return _select_idf_scorer(method)


def bm25_tfc_scorer(method: str) -> Callable[..., Any]:
    """bm25s's term-frequency component for ``method``, called with keyword arguments
    ``tf_array, l_d, l_avg, k1, b, delta`` (numpy arrays or scalars).

    Why private: as :func:`bm25_idf_scorer` (``scoring._select_tfc_scorer``).
    """
    from bm25s.scoring import _select_tfc_scorer

    return _select_tfc_scorer(method)
