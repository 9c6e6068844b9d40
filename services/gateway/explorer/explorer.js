// engram memory explorer: a static page over the gateway's HTTP API (services/gateway/explorer.py).
// Rules: every piece of data is rendered as text (textContent, text nodes; never parsed as markup); search text and other
// content travel in request bodies, never in URLs; every data call carries the key as x-api-key.
// The key is kept in memory only (not in storage): reloading the page asks for it again.
"use strict";

const state = { key: "", group: "", facts: [], entities: [], scope: null };

const $ = (id) => document.getElementById(id);

// An element with text children only: strings become text nodes, never markup.
function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props || {})) {
    if (name === "class") node.className = value;
    else if (name === "onclick") node.addEventListener("click", value);
    else if (name.startsWith("data-")) node.setAttribute(name, value);
    else node[name] = value;
  }
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function status(text, isError) {
  const line = $("status");
  line.textContent = text || "";
  line.className = isError ? "error" : "";
}

// One call to the gateway. Paths are relative (the page may sit behind a path prefix); path
// segments are encoded; `body` is sent as JSON.
async function api(method, path, body) {
  const headers = { accept: "application/json" };
  if (state.key) headers["x-api-key"] = state.key;
  const init = { method, headers, cache: "no-store", referrerPolicy: "no-referrer" };
  if (body !== undefined) {
    headers["content-type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  if (!response.ok) {
    let detail = response.statusText;
    try {
      const data = await response.json();
      detail = typeof data.detail === "string" ? data.detail : JSON.stringify(data.detail);
    } catch (_) { /* not JSON */ }
    const error = new Error(`${response.status}: ${detail}`);
    error.status = response.status;
    throw error;
  }
  return response.status === 204 ? null : response.json();
}

const seg = encodeURIComponent;

function when(value) {
  if (!value) return "";
  const d = new Date(value);
  return isNaN(d) ? String(value) : d.toISOString().slice(0, 16).replace("T", " ") + " UTC";
}

function scopeQuery() {
  const { kind, key } = state.scope;
  return `${kind}=${seg(key)}`;
}

// A modal confirmation; resolves true only when the user pressed Delete.
function confirmDelete(text) {
  const dialog = $("confirm");
  $("confirm-text").textContent = text;
  dialog.returnValue = "";
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
    dialog.showModal();
  });
}

async function remove(what, text, method, path, after) {
  if (!(await confirmDelete(`Delete ${what} “${text}”? This cannot be undone.`))) {
    status(`Kept the ${what}.`);
    return;
  }
  try {
    await api(method, path);
    status(`Deleted the ${what}.`);
    await after();
  } catch (error) {
    status(`Deleting the ${what} failed: ${error.message}`, true);
  }
}

function entityName(uuid) {
  const entity = state.entities.find((e) => e.uuid === uuid);
  return entity ? entity.name : uuid.slice(0, 8);
}

function factText(uuid) {
  const fact = state.facts.find((f) => f.uuid === uuid);
  return fact ? fact.fact : uuid;
}

function factItem(fact) {
  const invalid = Boolean(fact.invalid_at || fact.expired_at);
  const badges = [el("span", { class: "badge" }, fact.name || "fact")];
  if (invalid) badges.push(el("span", { class: "badge invalid" }, "invalidated"));
  const dates = [];
  if (fact.valid_at) dates.push(`valid from ${when(fact.valid_at)}`);
  if (fact.invalid_at) dates.push(`until ${when(fact.invalid_at)}`);
  if (fact.expired_at) dates.push(`expired ${when(fact.expired_at)}`);
  if (fact.created_at) dates.push(`recorded ${when(fact.created_at)}`);
  const ends = fact.source_node_uuid
    ? el("div", { class: "meta" }, `${entityName(fact.source_node_uuid)} → ${entityName(fact.target_node_uuid)}`) : null;
  const by = fact.invalidated_by
    ? el("div", { class: "meta invalidated-by" }, `invalidated by: ${factText(fact.invalidated_by)}`)
    : (fact.invalidated_in ? el("div", { class: "meta invalidated-by" }, `invalidated by episode ${fact.invalidated_in}`) : null);
  return el("li", { class: invalid ? "fact invalid" : "fact", "data-uuid": fact.uuid },
    ...badges, el("span", { class: "text" }, fact.fact),
    el("button", {
      type: "button", class: "delete", title: "Delete this fact",
      onclick: () => remove("fact", fact.fact, "DELETE", `entity-edge/${seg(fact.uuid)}`, afterFactDelete(fact.uuid)),
    }, "Delete"),
    el("div", { class: "meta" }, dates.join(" · ")), ends, by);
}

function afterFactDelete(uuid) {
  return async () => {
    for (const li of document.querySelectorAll("li.fact")) if (li.dataset.uuid === uuid) li.remove();
    await loadGroup();
  };
}

function renderFacts() {
  $("facts").replaceChildren(...(state.facts.length ? state.facts.map(factItem) : [el("li", {}, "No facts yet.")]));
}

function renderEntities() {
  $("entities").replaceChildren(...(state.entities.length ? state.entities.map((entity) => el("li", {},
    el("button", { type: "button", class: "link", onclick: () => showEntity(entity.uuid) }, entity.name),
    el("span", { class: "meta" }, ` ${(entity.labels || []).filter((l) => l !== "Entity").join(", ")}`),
  )) : [el("li", {}, "No entities yet.")]));
}

function showEntity(uuid) {
  const entity = state.entities.find((e) => e.uuid === uuid);
  if (!entity) return;
  $("entity-section").hidden = false;
  $("entity-section").dataset.uuid = uuid;
  $("entity-name").textContent = entity.name;
  $("entity-labels").textContent = `${(entity.labels || []).join(", ")} · created ${when(entity.created_at)}`;
  $("entity-summary").textContent = entity.summary || "(no summary yet)";
  // a typed entity's attributes (its ontology type's fields), shown as text
  const attributes = Object.entries(entity.attributes || {}).filter(([, v]) => v !== null && v !== "");
  $("entity-attributes").hidden = !attributes.length;
  $("entity-attributes").replaceChildren(...attributes.flatMap(([k, v]) => [
    el("dt", {}, k), el("dd", {}, typeof v === "object" ? JSON.stringify(v) : String(v))]));
  const facts = state.facts.filter((f) => f.source_node_uuid === uuid || f.target_node_uuid === uuid);
  $("entity-facts").replaceChildren(...(facts.length ? facts.map(factItem) : [el("li", {}, "No facts among the latest episodes.")]));
  drawNeighbourhood(uuid, facts);
  $("entity-timeline").replaceChildren(...timeline(facts));
  $("entity-section").scrollIntoView({ block: "nearest" });
}

const superseded = (fact) => Boolean(fact.invalid_at || fact.expired_at || fact.invalidated_by || fact.invalidated_in);
const day = (value) => (value ? when(value).slice(0, 10) : "…");

// The entity and its neighbours as a graph (Cytoscape, shipped with the page): facts as edges,
// superseded ones dashed and labelled with their dates. Labels are drawn on a canvas as text.
let graph = null;
function drawNeighbourhood(uuid, facts) {
  if (graph) graph.destroy();
  graph = null;
  const box = $("entity-graph");
  if (typeof cytoscape !== "function" || !facts.length) {
    box.hidden = true;
    return;
  }
  box.hidden = false;
  const ids = new Set([uuid]);
  for (const f of facts) { ids.add(f.source_node_uuid); ids.add(f.target_node_uuid); }
  const nodes = [...ids].map((id) => ({ data: { id, label: entityName(id), centre: id === uuid ? 1 : 0 } }));
  const edges = facts.map((f) => ({
    data: {
      id: `f-${f.uuid}`, source: f.source_node_uuid, target: f.target_node_uuid,
      label: superseded(f) ? `${f.name || "fact"}\n${day(f.valid_at)} → ${day(f.invalid_at || f.expired_at)}` : (f.name || "fact"),
    },
    classes: superseded(f) ? "superseded" : "current",
  }));
  graph = cytoscape({
    container: box,
    elements: [...nodes, ...edges],
    layout: { name: "concentric", concentric: (n) => n.data("centre"), levelWidth: () => 1, minNodeSpacing: 110,
              padding: 20, animate: false },
    style: [
      { selector: "node", style: { label: "data(label)", "background-color": "#6b8cce", color: "#222", "font-size": 11,
                                   "text-valign": "bottom", "text-margin-y": 4, width: 18, height: 18 } },
      { selector: "node[centre = 1]", style: { "background-color": "#d9822b", width: 26, height: 26, "font-weight": "bold" } },
      { selector: "edge", style: { label: "data(label)", "curve-style": "bezier", "target-arrow-shape": "triangle",
                                   "font-size": 9, "text-wrap": "wrap", "text-background-color": "#fcfcff",
                                   "text-background-opacity": 1, width: 2, "line-color": "#556", "target-arrow-color": "#556" } },
      { selector: "edge.superseded", style: { "line-style": "dashed", "line-color": "#aaa", "target-arrow-color": "#aaa", color: "#888" } },
    ],
    userZoomingEnabled: true, wheelSensitivity: 0.2,
  });
}

// How the entity's facts changed: by relation, oldest first, each with its validity span;
// a superseded fact struck through and the fact that replaced it named.
function timeline(facts) {
  if (!facts.length) return [el("li", {}, "No facts among the latest episodes.")];
  const byRelation = new Map();
  for (const f of facts) {
    const key = f.name || "fact";
    if (!byRelation.has(key)) byRelation.set(key, []);
    byRelation.get(key).push(f);
  }
  const start = (f) => f.valid_at || f.created_at || "";
  return [...byRelation.entries()].map(([relation, items]) => el("li", {},
    el("span", { class: "badge" }, relation),
    el("ol", {}, ...items.sort((a, b) => start(a).localeCompare(start(b))).map((f) => el("li",
      { class: superseded(f) ? "superseded" : "current", "data-uuid": f.uuid },
      el("span", { class: "span" }, `${day(f.valid_at)} → ${superseded(f) ? day(f.invalid_at || f.expired_at) : "now"}`),
      el("span", { class: "text" }, f.fact),
      f.invalidated_by ? el("div", { class: "meta" }, `replaced by: ${factText(f.invalidated_by)}`) : null)))));
}

// What extracting the episode cost, as the extractor recorded it (GET /episodes: `extraction`).
function costLine(episode) {
  const cost = episode.extraction;
  if (!cost) return "extraction cost not recorded";
  const n = (value) => Math.round(value).toLocaleString("en-US");
  const stages = cost.stage_ms || {};
  // extract (one combined pass) or extract_nodes + extract_edges (separate and chunked modes)
  const extracting = Object.keys(stages).filter((name) => name.startsWith("extract"));
  const parts = [`${n(cost.llm_calls)} LLM call${cost.llm_calls === 1 ? "" : "s"}`,
    `${n(cost.input_tokens)} in / ${n(cost.output_tokens)} out tokens`];
  if (extracting.length) parts.push(`extract ${n(extracting.reduce((sum, name) => sum + stages[name], 0))} ms`);
  if (stages.total !== undefined) parts.push(`total ${n(stages.total)} ms`);
  return parts.join(" · ");
}

function renderEpisodes(episodes) {
  $("episodes").replaceChildren(...(episodes.length ? episodes.map((episode) => el("li", { class: "episode", "data-uuid": episode.uuid },
    el("div", { class: "meta" }, `${when(episode.valid_at || episode.created_at)} · ${episode.source}`
      + (episode.source_description ? ` · ${episode.source_description}` : "")),
    el("pre", {}, episode.content),
    el("div", { class: "meta" }, `source messages: ${(episode.message_ids || []).join(", ") || "none recorded"}`
      + ` · ${episode.entity_edges.length} facts`),
    el("div", { class: "meta cost" }, costLine(episode)),
    el("button", {
      type: "button", class: "delete",
      onclick: () => remove("episode", episode.name || episode.uuid, "DELETE", `episode/${seg(episode.uuid)}`, loadGroup),
    }, "Delete episode"),
  )) : [el("li", {}, "No episodes yet.")]));
}

function renderSummaryLog(log) {
  $("decisions").replaceChildren(...(log.decisions.length ? log.decisions.map((d) => el("li", { class: "decision" },
    el("span", { class: `badge ${d.decision}` }, d.decision), `${d.node_name || d.node_uuid} · ${d.reason}`,
    el("div", { class: "meta" }, [when(d.decided_at), d.drift === null || d.drift === undefined ? "" : `drift ${d.drift.toFixed(3)}`,
      d.active_facts === null || d.active_facts === undefined ? "" : `${d.active_facts} active facts`].filter(Boolean).join(" · ")),
  )) : [el("li", {}, "No decisions recorded.")]));
  $("audits").replaceChildren(...(log.audits.length ? log.audits.map((a) => el("li", { class: "audit" },
    `${a.node_name} · skipped: ${a.reason}`,
    el("div", { class: "meta" }, [when(a.decided_at), a.drift === null || a.drift === undefined ? "" : `drift ${a.drift.toFixed(3)}`]
      .filter(Boolean).join(" · ")),
    el("div", { class: "summary" }, `kept summary: ${a.kept_summary || "(empty)"}`),
    el("ul", {}, ...a.active_facts.map((f) => el("li", {}, f))),
  )) : [el("li", {}, "No sampled skips (ENGRAM_SUMMARY_AUDIT_SAMPLE_RATE of skips are kept for review).")]));
}

async function loadSummaryLog() {
  // A separate call: the rest of the group view stays usable when the summary log cannot be read.
  try {
    const log = await api("GET", `summary-log/${seg(state.group)}?limit=50`);
    renderSummaryLog(log);
    $("summary-log-status").textContent = `${log.scanned} message(s) read from ENGRAM_SUMMARY.`;
  } catch (error) {
    $("decisions").replaceChildren();
    $("audits").replaceChildren();
    $("summary-log-status").textContent = `The summary-gate's log could not be read: ${error.message}`;
  }
}

// Hide the listed episodes, entities and facts that do not contain the filter text (case aside).
function applyFilter() {
  const needle = $("filter").value.trim().toLowerCase();
  for (const li of document.querySelectorAll("#episodes > li, #entities > li, #facts > li")) {
    li.hidden = Boolean(needle) && !li.textContent.toLowerCase().includes(needle);
  }
}

async function loadGroups() {
  const { group_ids: groups, names = {} } = await api("GET", "groups");
  const select = $("group");
  // a group by its scope and key ("workspace acme") when known, its id after it
  const label = (g) => (names[g] ? `${names[g]} (${g})` : g);
  select.replaceChildren(...(groups.length ? groups.map((g) => el("option", { value: g }, label(g))) : [el("option", { value: "" }, "(no groups)")]));
  if (state.group && groups.includes(state.group)) select.value = state.group;
  status(`${groups.length} group(s).`);
}

async function loadGroup() {
  if (!state.group) return;
  const g = seg(state.group);
  const [episodes, entities, facts] = await Promise.all([
    api("GET", `episodes/${g}?last_n=50`), api("GET", `entities/${g}?limit=200`), api("GET", `facts/${g}?last_n=50`),
  ]);
  state.entities = entities;
  state.facts = facts;
  $("group-view").hidden = false;
  renderEpisodes(episodes);
  renderEntities();
  renderFacts();
  applyFilter();
  await loadSummaryLog();
  const open = $("entity-section").dataset.uuid;
  if (open && !$("entity-section").hidden) showEntity(open);
  document.title = `engram: ${state.group}`;
}

async function search(query) {
  // POST: the query is content, so it travels in the body, never in the URL.
  const { facts } = await api("POST", "search", { query, group_ids: [state.group], max_facts: 20 });
  $("search-results").replaceChildren(...(facts.length ? facts.map(factItem) : [el("li", {}, "Nothing found.")]));
  status(`${facts.length} fact(s) found.`);
}

async function loadUserMemory() {
  const q = scopeQuery();
  const [preferences, notes, sessions] = await Promise.all([
    api("GET", `memory/preferences?${q}`), api("GET", `memory/notes?${q}`), api("GET", `memory/sessions?${q}`),
  ]);
  $("preferences").replaceChildren(...(preferences.length ? preferences.map((p) => el("li", {},
    el("strong", {}, p.key), `: ${p.value}`, el("span", { class: "meta" }, ` (${p.source}, set ${when(p.set_at)})`),
    el("button", {
      type: "button", class: "delete",
      onclick: () => remove("preference", `${p.key}: ${p.value}`, "DELETE", `memory/preferences/${seg(p.key)}?${scopeQuery()}`, loadUserMemory),
    }, "Delete"),
  )) : [el("li", {}, "No preferences.")]));
  $("notes").replaceChildren(...(notes.length ? notes.map((n) => el("li", {},
    n.text, el("span", { class: "meta" }, ` (${n.source}, ${when(n.created_at)})`),
    el("button", {
      type: "button", class: "delete",
      onclick: () => remove("note", n.text, "DELETE", `memory/notes/${seg(n.uuid)}?${scopeQuery()}`, loadUserMemory),
    }, "Delete"),
  )) : [el("li", {}, "No notes.")]));
  $("sessions").replaceChildren(...(sessions.length ? sessions.map((s) => el("li", {},
    el("div", { class: "meta" }, `${s.session_id} #${s.segment} · ${when(s.opened_at)} – ${when(s.closed_at)}`
      + ` · ${s.message_count} messages · ${s.close_reason}`),
    el("div", { class: "summary" }, s.summary || "(no summary)"),
  )) : [el("li", {}, "No closed sessions.")]));
}

function guarded(action) {
  return async (event) => {
    event.preventDefault();
    try {
      await action();
    } catch (error) {
      status(error.status === 401 ? "The gateway wants an API key (or this one is wrong)." : error.message, true);
    }
  };
}

document.addEventListener("DOMContentLoaded", () => {
  $("connect").addEventListener("submit", guarded(async () => {
    state.key = $("api-key").value;
    await loadGroups();
  }));
  $("pick-group").addEventListener("submit", guarded(async () => {
    state.group = $("group").value;
    if (!state.group) return;
    $("entity-section").hidden = true;
    $("search-results").replaceChildren();
    status(`Loading ${state.group} ...`);
    await loadGroup();
    status(`Group ${state.group}: ${state.facts.length} facts, ${state.entities.length} entities.`);
  }));
  $("filter").addEventListener("input", applyFilter);
  $("search").addEventListener("submit", guarded(async () => {
    const query = $("query").value.trim();
    if (query) await search(query);
  }));
  $("pick-scope").addEventListener("submit", guarded(async () => {
    const key = $("scope-key").value.trim();
    if (!key) return;
    state.scope = { kind: $("scope-kind").value, key };
    await loadUserMemory();
  }));
  status("Enter the API key (if the gateway has one) and connect.");
  connectWithoutKeyIfAllowed();
});

// The gateway says whether it wants a key (explorer/auth.json: no data, no secret). Without one
// (`engram up` on loopback) the page connects at once instead of asking for a key nobody has.
async function connectWithoutKeyIfAllowed() {
  try {
    const response = await fetch("explorer/auth.json", { cache: "no-store", referrerPolicy: "no-referrer" });
    if (!response.ok || (await response.json()).api_key_required) return;
  } catch (_) {
    return; // an older gateway: ask as before
  }
  $("api-key").placeholder = "not needed: this gateway has no API key";
  $("api-key").disabled = true;
  await guarded(async () => {
    await loadGroups();
    status("Connected: this gateway needs no API key. Pick a group.");
  })(new Event("submit"));
}
