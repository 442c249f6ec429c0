// The search page of `condsearch serve`: list the indexed conditions (GET indexes), ask one query
// under two of them (POST query, once per column) and show both rankings side by side.
// It is a client of the JSON API like any other. Every text the server sends goes into the page
// through textContent or an Option's text, never parsed as HTML.
"use strict";

(() => {
  const KEY_HEADER = "X-API-Key"; // condsearch.serve.config.API_KEY_HEADER
  const KEY_SAVED = "condsearch-api-key"; // sessionStorage: this tab only, gone when it closes

  const byId = (id) => document.getElementById(id);
  const form = byId("search");
  const queryBox = byId("query");
  const kBox = byId("k");
  const keyBox = byId("key");
  const keyDetails = byId("key-box");
  const statusLine = byId("status");
  const pickers = [byId("left"), byId("right")];
  const columns = [byId("left-results"), byId("right-results")];

  let indexes = new Map(); // an option's value (the index name) -> {condition, corpus, rows}
  let pending = null; // the AbortController of the search in flight

  function element(tag, text, className) {
    const node = document.createElement(tag);
    if (text !== undefined) node.textContent = text;
    if (className) node.className = className;
    return node;
  }

  function say(text, isError = false) {
    statusLine.textContent = text;
    statusLine.classList.toggle("error", isError);
  }

  // ------------------------------------------------------------------ the API key

  function fragmentValue(name) {
    // Not URLSearchParams: its form decoding turns "+" into a space, and base64 keys hold "+".
    // Percent escapes are decoded (the browser writes non-ASCII so); a value that is not valid
    // percent-encoding (a lone "%") is taken as written.
    for (const part of location.hash.slice(1).split("&")) {
      const eq = part.indexOf("=");
      if (eq < 0 || part.slice(0, eq) !== name) continue;
      const raw = part.slice(eq + 1);
      try {
        return decodeURIComponent(raw);
      } catch {
        return raw;
      }
    }
    return null;
  }

  function keyFromFragment() {
    const key = fragmentValue("key");
    if (key !== null) {
      // take the key out of the address bar and this history entry (a fragment never reaches a server)
      history.replaceState(null, "", location.pathname + location.search);
    }
    return key;
  }

  function headerValue(key) {
    // fetch sends each character of a header value as one byte; the server compares the key's UTF-8 bytes
    return Array.from(new TextEncoder().encode(key), (b) => String.fromCharCode(b)).join("");
  }

  async function call(path, init = {}) {
    const headers = new Headers(init.headers);
    if (keyBox.value) {
      try {
        headers.set(KEY_HEADER, headerValue(keyBox.value));
      } catch {
        throw new Error("the API key holds a character no HTTP header can carry (a line break, NUL)");
      }
    }
    const response = await fetch(path, { ...init, headers, cache: "no-store", credentials: "omit" });
    let body;
    try {
      body = await response.json();
    } catch {
      body = {};
    }
    if (typeof body !== "object" || body === null) body = {};
    if (!response.ok && typeof body.error !== "string") body.error = `HTTP ${response.status}`;
    return { status: response.status, body };
  }

  // ------------------------------------------------------------------ the conditions

  async function loadIndexes() {
    say("Reading the indexes…");
    let got;
    try {
      got = await call("indexes");
    } catch (error) {
      say(`Cannot ask the server: ${error.message}`, true);
      return;
    }
    if (got.status === 401) {
      keyDetails.open = true;
      keyBox.focus();
      say("This server needs an API key: enter it under “API key”.", true);
      return;
    }
    if (got.status !== 200) {
      say(`Cannot list the indexes: ${got.body.error}`, true);
      return;
    }
    const listed = Array.isArray(got.body.indexes) ? got.body.indexes : [];
    const usable = listed.filter((i) => typeof i.condition === "string" && typeof i.index === "string");
    const corpora = new Set(usable.map((i) => i.corpus));
    indexes = new Map(usable.map((i) => [i.index, { condition: i.condition, corpus: i.corpus, rows: i.rows }]));
    pickers.forEach((picker, side) => {
      const before = picker.value;
      picker.replaceChildren(
        ...usable.map((i) => new Option(corpora.size > 1 ? `${i.condition} (${i.corpus})` : i.condition, i.index)),
      );
      const fallback = usable[Math.min(side, usable.length - 1)];
      picker.value = indexes.has(before) ? before : fallback ? fallback.index : "";
    });
    const damaged = listed.length - usable.length;
    const note = damaged ? ` (${damaged} damaged: run condsearch verify)` : "";
    if (!usable.length) {
      say(`No indexes to search yet${note}: build some with condsearch index.`, true);
    } else {
      say(`${usable.length} ${usable.length === 1 ? "index" : "indexes"}${note}. Type a query and pick two conditions.`);
    }
  }

  // ------------------------------------------------------------------ searching

  async function ask(query, index, k, signal) {
    const request = { query, condition: index.condition, corpus: index.corpus };
    if (k !== null) request.k = k;
    try {
      const got = await call("query", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify(request),
        signal,
      });
      return got.status === 200 ? { answer: got.body } : { error: got.body.error };
    } catch (error) {
      return error.name === "AbortError" ? { aborted: true } : { error: `cannot ask the server: ${error.message}` };
    }
  }

  function readK() {
    if (kBox.value === "") return null; // the server's default
    const k = Number(kBox.value);
    return Number.isInteger(k) && k >= 1 ? k : undefined;
  }

  async function search() {
    const query = queryBox.value;
    const chosen = pickers.map((p) => indexes.get(p.value));
    const k = readK();
    if (!query.trim()) return say("Type a query.", true);
    if (chosen.some((c) => !c)) return say("Pick two conditions.", true);
    if (k === undefined) return say("k must be a whole number, 1 or more.", true);
    if (pending) pending.abort(); // a newer search replaces one still running
    const controller = (pending = new AbortController());
    say("Searching…");
    const got = await Promise.all(chosen.map((index) => ask(query, index, k, controller.signal)));
    if (controller !== pending) return;
    pending = null;
    const hits = got.map((g) => (g.answer && g.answer.results && g.answer.results[0] ? g.answer.results[0].results : null));
    const sameCorpus = hits.every(Boolean) && got[0].answer.corpus === got[1].answer.corpus;
    const idSets = hits.map((h) => new Set((h || []).map((hit) => idKey(hit.id))));
    columns.forEach((column, side) => render(column, chosen[side], got[side], sameCorpus ? idSets[1 - side] : null));
    if (sameCorpus) {
      const shared = [...idSets[0]].filter((id) => idSets[1].has(id)).length;
      const most = Math.max(hits[0].length, hits[1].length);
      say(`${shared} of ${most} results appear under both conditions.`);
    } else {
      say(got.some((g) => g.error) ? "A search failed; see its column." : "Done.");
    }
  }

  function idKey(id) {
    return `${typeof id}:${id}`; // the id 7 and the id "7" are different rows
  }

  function render(column, index, got, otherIds) {
    const heading = element("h2", index.condition);
    if (got.error !== undefined) {
      column.replaceChildren(heading, element("p", got.error, "error"));
      return;
    }
    const answer = got.answer;
    const hits = answer.results[0].results;
    const meta = `top ${hits.length} of ${answer.rows} rows · corpus ${answer.corpus}`;
    const list = element("ol", undefined, "hits");
    for (const hit of hits) {
      const item = element("li");
      const shared = otherIds !== null && otherIds.has(idKey(hit.id));
      if (shared) item.classList.add("shared");
      const head = element("div", undefined, "hit-head");
      head.append(
        element("span", `#${hit.rank}`, "rank"),
        element("span", Number(hit.score).toFixed(4), "score"),
        element("span", String(hit.id), "id"),
      );
      if (shared) head.append(element("span", "in both", "badge"));
      item.append(head, element("p", hit.text, "text"));
      list.append(item);
    }
    column.replaceChildren(heading, element("p", meta, "meta"), list);
  }

  // ------------------------------------------------------------------ wiring

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    search().catch((error) => say(`The search failed: ${error.message}`, true));
  });
  keyBox.addEventListener("change", () => {
    try {
      sessionStorage.setItem(KEY_SAVED, keyBox.value);
    } catch {
      // storage may be off; the key still works until the page is left
    }
    loadIndexes();
  });

  let saved = null;
  try {
    saved = sessionStorage.getItem(KEY_SAVED);
  } catch {
    saved = null;
  }
  const given = keyFromFragment();
  keyBox.value = given ?? saved ?? "";
  if (given !== null) {
    try {
      sessionStorage.setItem(KEY_SAVED, given);
    } catch {
      // as above
    }
  }
  loadIndexes();
})();
