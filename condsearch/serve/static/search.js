// The search page of `condsearch serve`: list the indexed conditions (GET indexes), pick a corpus,
// ask one query under two conditions (POST query, once per column) and show both rankings
// side by side (as tabs on a phone). A condition box takes any text, the indexed conditions
// suggested; one the corpus has no index for is built by the server (a router corpus), the page
// showing its progress (GET builds/ID) until it answers. The search lives in the URL's fragment (q, corpus, a, b, k, z),
// so it can be shared and Back returns to the one before; an API key never goes there.
// It is a client of the JSON API like any other. Every text the server sends goes into the page
// through textContent or an Option's text, never parsed as HTML.
"use strict";

(() => {
  const KEY_HEADER = "X-API-Key"; // condsearch.serve.config.API_KEY_HEADER
  const KEY_SAVED = "condsearch-api-key"; // sessionStorage: this tab only, gone when it closes
  const UNREADABLE_SHARE = 0.5; // a query with more unknown tokens ([UNK]) than this is flagged
  const POLL_MS = 500; // how often a build's progress is asked for
  const MAX_K = 1000; // condsearch.serve.refusals.MAX_K: the server answers no more per query
  const SAME_CONDITION = "Conditions A and B are the same condition: pick two different ones to compare.";

  const byId = (id) => document.getElementById(id);
  const form = byId("search");
  const queryBox = byId("query");
  const kBox = byId("k");
  const keyBox = byId("key");
  const keyDetails = byId("key-box");
  const corpusPicker = byId("corpus");
  const calibratedBox = byId("calibrated");
  const statusLine = byId("status");
  const answered = byId("answered");
  const scoreNote = byId("score-note");
  const tabs = byId("tabs");
  const tabButtons = [byId("tab-left"), byId("tab-right")];
  const results = byId("results");
  const pickers = [byId("left"), byId("right")]; // free text, the corpus's conditions suggested
  const suggestions = byId("conditions");
  const columns = [byId("left-results"), byId("right-results")];

  let indexes = new Map(); // an index name -> {condition, corpus, rows, model, head, mode, router, background}
  let pending = null; // the AbortController of the search in flight
  let reading = null; // the listing being read, if any: a focus while it runs asks nothing more

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

  // ------------------------------------------------------------------ the URL's fragment

  function fragmentParts() {
    // Not URLSearchParams: its form decoding turns "+" into a space, and base64 keys hold "+".
    // Percent escapes are decoded (the browser writes non-ASCII so); a value that is not valid
    // percent-encoding (a lone "%") is taken as written.
    const parts = [];
    for (const part of location.hash.slice(1).split("&")) {
      const eq = part.indexOf("=");
      if (eq < 0) continue;
      const raw = part.slice(eq + 1);
      let value;
      try {
        value = decodeURIComponent(raw);
      } catch {
        value = raw;
      }
      parts.push([part.slice(0, eq), value, part]);
    }
    return parts;
  }

  function fragmentValue(name) {
    const found = fragmentParts().find(([n]) => n === name);
    return found ? found[1] : null;
  }

  function keyFromFragment() {
    const key = fragmentValue("key");
    if (key !== null) {
      // take the key out of the address bar and this history entry (a fragment never reaches a server)
      const rest = fragmentParts().filter(([n]) => n !== "key").map(([, , part]) => part);
      history.replaceState(null, "", location.pathname + location.search + (rest.length ? `#${rest.join("&")}` : ""));
    }
    return key;
  }

  function searchFragment(state) {
    const parts = [["q", state.query], ["corpus", state.corpus], ["a", state.left], ["b", state.right]];
    if (state.k !== null) parts.push(["k", String(state.k)]);
    if (state.calibrated) parts.push(["z", "1"]);
    return "#" + parts.map(([n, v]) => `${n}=${encodeURIComponent(v)}`).join("&");
  }

  function stateFromFragment() {
    const query = fragmentValue("q");
    if (query === null) return null;
    return {
      query,
      corpus: fragmentValue("corpus"),
      left: fragmentValue("a"),
      right: fragmentValue("b"),
      k: fragmentValue("k"),
      calibrated: fragmentValue("z") === "1",
    };
  }

  // ------------------------------------------------------------------ the API key

  function headerValue(key) {
    // fetch sends each character of a header value as one byte; the server compares the key's UTF-8 bytes
    return Array.from(new TextEncoder().encode(key), (b) => String.fromCharCode(b)).join("");
  }

  function saveKey(key) {
    try {
      sessionStorage.setItem(KEY_SAVED, key);
    } catch {
      // storage may be off; the key still works until the page is left
    }
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

  // ------------------------------------------------------------------ corpora and conditions

  function loadIndexes(quiet = false) {
    if (quiet && reading) return reading;
    const read = readIndexes(quiet).finally(() => {
      if (reading === read) reading = null;
    });
    reading = read;
    return read;
  }

  async function readIndexes(quiet) {
    if (!quiet) say("Reading the indexes…");
    let got;
    try {
      got = await call("indexes");
    } catch (error) {
      if (!quiet) say(`Cannot ask the server: ${error.message}`, true);
      return false;
    }
    if (got.status === 401) {
      keyDetails.open = true;
      keyBox.focus();
      say("This server needs an API key: enter it under “API key”.", true);
      return false;
    }
    if (got.status !== 200) {
      if (!quiet) say(`Cannot list the indexes: ${got.body.error}`, true);
      return false;
    }
    const listed = Array.isArray(got.body.indexes) ? got.body.indexes : [];
    const usable = listed.filter(
      (i) => typeof i.condition === "string" && typeof i.index === "string" && typeof i.corpus === "string",
    );
    indexes = new Map(
      usable.map((i) => [
        i.index,
        {
          condition: i.condition,
          corpus: i.corpus,
          rows: i.rows,
          model: String(i.model ?? ""),
          head: String(i.head ?? ""),
          mode: String(i.mode ?? ""),
          router: String(i.router ?? ""),
          background: typeof i.score_background === "object" && i.score_background !== null
            && Object.keys(i.score_background).length > 0,
        },
      ]),
    );
    fillCorpora();
    const damaged = listed.length - usable.length;
    const note = damaged ? ` (${damaged} damaged: run condsearch verify)` : "";
    if (!usable.length) {
      say(`No indexes to search yet${note}: build some with condsearch index.`, true);
    } else if (!quiet) {
      const n = corpusPicker.options.length;
      const corpora = n === 1 ? "one corpus" : `${n} corpora`;
      say(`${usable.length} ${usable.length === 1 ? "index" : "indexes"} of ${corpora}${note}. Type a query and pick two conditions.`);
    }
    return usable.length > 0;
  }

  function conditionsOf(corpus) {
    return [...indexes].filter(([, i]) => i.corpus === corpus);
  }

  function fillCorpora(wanted = null) {
    const counts = new Map();
    for (const i of indexes.values()) counts.set(i.corpus, (counts.get(i.corpus) || 0) + 1);
    const names = [...counts.keys()].sort();
    const before = wanted ?? corpusPicker.value;
    corpusPicker.replaceChildren(...names.map((name) => new Option(name, name)));
    // by default the first corpus with two conditions to compare
    const fallback = names.find((name) => counts.get(name) > 1) ?? names[0] ?? "";
    corpusPicker.value = counts.has(before) ? before : fallback;
    fillConditions();
  }

  function fillConditions(wanted = [null, null]) {
    const corpus = corpusPicker.value;
    const own = conditionsOf(corpus);
    suggestions.replaceChildren(...own.map(([, i]) => new Option(i.condition, i.condition)));
    const indexedElsewhere = (text) => [...indexes.values()].some((i) => i.condition === text && i.corpus !== corpus);
    pickers.forEach((picker, side) => {
      // what was typed stays, unless it is empty or a suggestion of another corpus
      const before = wanted[side] !== null ? wanted[side] : picker.value;
      const fallback = own[Math.min(side, own.length - 1)];
      const keep = before.trim() !== "" && (indexNamed(corpus, before) !== null || !indexedElsewhere(before));
      picker.value = keep ? before : fallback ? fallback[1].condition : "";
    });
    showAddCommand(own);
  }

  function indexNamed(corpus, condition) {
    const found = conditionsOf(corpus).find(([, i]) => i.condition === condition);
    return found ? found[0] : null;
  }

  function chosenIndex(picker) {
    // the index of the condition typed, or a condition to build: {condition, corpus, background: false}
    const corpus = corpusPicker.value;
    const condition = picker.value.trim();
    if (!corpus || !condition) return null;
    const name = indexNamed(corpus, condition);
    return name !== null ? indexes.get(name) : { condition, corpus, background: false, built: false };
  }

  function shellWord(text) {
    // a word a POSIX shell reads back as text: as it is when plain, else in single quotes
    return /^[A-Za-z0-9_.,:@%+=\/-]+$/.test(text) ? text : `'${text.replaceAll("'", "'\\''")}'`;
  }

  function showAddCommand(own) {
    const corpus = corpusPicker.value || "CORPUS";
    const first = own.length ? own[0][1] : null;
    // the mode always: the default of condsearch index may not be the mode these indexes were built in;
    // the corpus's name and the server's folder, or the index is another corpus's, or in another folder
    const mode = first && first.mode ? ` --mode ${first.mode}` : "";
    byId("add-file").textContent = corpus;
    byId("add-command").textContent =
      `condsearch index FILE -c "the new condition"${mode} --name ${shellWord(corpus)} --index-dir INDEX_DIR`;
    // a router index's vectors are made by its router, as a CASE index's by its head
    const made = first && first.mode === "csr" ? `router ${first.router}` : `head ${first ? first.head : ""}`;
    byId("add-model").textContent = first ? `model ${first.model}, ${made}, mode ${first.mode}` : "none yet";
    byId("add-typed").hidden = !(first && first.mode === "csr");
  }

  function refresh() {
    // one GET /indexes (the server re-reads its folder at most every half second): a condition
    // indexed while the page is open is offered without a reload
    loadIndexes(true);
  }

  // ------------------------------------------------------------------ searching

  async function ask(query, index, k, calibrated, signal, onProgress) {
    const request = { query, condition: index.condition, corpus: index.corpus };
    if (k !== null) request.k = k;
    if (calibrated) request.calibrated = true;
    try {
      for (;;) {
        const got = await call("query", {
          method: "POST",
          headers: { "Content-Type": "application/json" },
          body: JSON.stringify(request),
          signal,
        });
        if (got.status !== 202) return got.status === 200 ? { answer: got.body } : { error: got.body.error };
        // the server builds this condition's index: follow the job, then ask again
        const failed = await followBuild(got.body, signal, onProgress);
        if (failed !== null) return { error: failed };
      }
    } catch (error) {
      return error.name === "AbortError" ? { aborted: true } : { error: `cannot ask the server: ${error.message}` };
    }
  }

  async function followBuild(job, signal, onProgress) {
    // poll GET builds/ID until the build is done (null) or failed (its one-line error)
    const path = `builds/${encodeURIComponent(String(job.job))}`;
    for (;;) {
      onProgress(job);
      if (job.status === "done") return null;
      if (job.status === "failed") return String(job.error ?? "the build failed");
      await new Promise((resolve, reject) => {
        const stop = () => {
          clearTimeout(timer);
          reject(new DOMException("replaced by a newer search", "AbortError"));
        };
        const timer = setTimeout(() => {
          signal.removeEventListener("abort", stop);
          resolve();
        }, POLL_MS);
        signal.addEventListener("abort", stop, { once: true });
      });
      const got = await call(path, { signal });
      if (got.status !== 200) return got.body.error;
      job = got.body;
    }
  }

  function buildProgress(job) {
    const rows = Number(job.rows) || 0;
    const done = Math.min(Number(job.rows_done) || 0, rows);
    const waiting = job.status === "queued" ? " (waiting for another build to finish)" : "";
    return `Building “${job.condition}” for corpus ${job.corpus}: ${done.toLocaleString("en")} of `
      + `${rows.toLocaleString("en")} rows…${waiting}`;
  }

  function readK() {
    if (kBox.value === "") return null; // the server's default
    const k = Number(kBox.value);
    return Number.isInteger(k) && k >= 1 && k <= MAX_K ? k : undefined;
  }

  function sameCondition(a, b) {
    // as the server names an index: composed, single spaces, no ends (an uncased model's case is
    // told apart after the search, by the index that answered)
    const norm = (text) => text.normalize("NFC").replace(/[\u200b-\u200f\u2060\ufeff]/g, "").replace(/\s+/g, " ").trim();
    return norm(a) === norm(b);
  }

  function clearResults() {
    if (pending) pending.abort();
    pending = null;
    columns.forEach((column) => column.replaceChildren());
    answered.textContent = "";
    scoreNote.hidden = true;
    tabs.hidden = true;
  }

  function refuse(text) {
    clearResults(); // results left under a refused search would seem to answer it
    say(text, true);
  }

  async function search(push = true) {
    const query = queryBox.value;
    const chosen = pickers.map(chosenIndex);
    const k = readK();
    if (!query.trim()) return refuse("Type a query.");
    if (chosen.some((c) => !c)) return refuse("Pick a corpus and two conditions (type or choose them).");
    if (k === undefined) return refuse(`k must be a whole number from 1 to ${MAX_K.toLocaleString("en")}.`);
    if (sameCondition(chosen[0].condition, chosen[1].condition)) return refuse(SAME_CONDITION);
    const calibrated = calibratedBox.checked;
    const corpus = chosen[0].corpus;
    const fragment = searchFragment({ query, corpus, left: chosen[0].condition, right: chosen[1].condition, k, calibrated });
    if (push && fragment !== location.hash) history.pushState(null, "", fragment);
    if (pending) pending.abort(); // a newer search replaces one still running
    const controller = (pending = new AbortController());
    const building = chosen.filter((c) => c.built === false).map((c) => `“${c.condition}”`);
    say(building.length ? `Searching… (${building.join(" and ")} is not indexed yet: the server builds it first)` : "Searching…");
    const progress = [null, null]; // each column's build in progress, shown in the status line
    const onProgress = (side) => (job) => {
      if (controller !== pending) return;
      progress[side] = job.status === "done" || job.status === "failed" ? null : buildProgress(job);
      const lines = [...new Set(progress.filter(Boolean))];
      if (lines.length) say(lines.join(" "));
    };
    const got = await Promise.all(
      chosen.map((index, side) =>
        ask(query, index, k, calibrated && index.background, controller.signal, onProgress(side)),
      ),
    );
    if (controller !== pending) return;
    pending = null;
    if (chosen.some((c) => c.built === false)) loadIndexes(true); // offer what was built
    if (got.every((g) => g.answer) && got[0].answer.index === got[1].answer.index) {
      return refuse(SAME_CONDITION); // two spellings of one condition (an uncased model reads "Color" as "color")
    }
    const hits = got.map((g) => (g.answer && g.answer.results && g.answer.results[0] ? g.answer.results[0].results : null));
    const sameCorpus = hits.every(Boolean) && got[0].answer.corpus === got[1].answer.corpus;
    const idSets = hits.map((h) => new Set((h || []).map((hit) => idKey(hit.id))));
    columns.forEach((column, side) =>
      render(column, chosen[side], got[side], sameCorpus ? idSets[1 - side] : null, calibrated),
    );
    answered.textContent = `Results for “${query}” in corpus ${corpus}`;
    scoreNote.hidden = false;
    tabButtons.forEach((button, side) => (button.textContent = `${side ? "B" : "A"}: ${chosen[side].condition}`));
    tabs.hidden = false;
    if (sameCorpus) {
      const shared = [...idSets[0]].filter((id) => idSets[1].has(id)).length;
      const most = Math.max(hits[0].length, hits[1].length);
      say(`Corpus ${got[0].answer.corpus} answered: ${shared} of ${most} results appear under both conditions.`);
    } else {
      say(got.some((g) => g.error) ? "A search failed; see its column." : `Corpus ${corpus} answered.`, got.some((g) => g.error));
    }
  }

  function idKey(id) {
    return `${typeof id}:${id}`; // the id 7 and the id "7" are different rows
  }

  function render(column, index, got, otherIds, calibrated) {
    const heading = element("h2", index.condition);
    if (got.error !== undefined) {
      column.replaceChildren(heading, element("p", got.error, "error"));
      return;
    }
    const answer = got.answer;
    const hits = answer.results[0].results;
    let meta = `top ${hits.length} of ${answer.rows} rows · corpus ${answer.corpus}`;
    if (calibrated && !index.background && index.built !== false) {
      meta += " · no z: this index records no score background (index it again to record one)";
    }
    const parts = [heading, element("p", meta, "meta")];
    const share = Array.isArray(answer.unknown_tokens) ? answer.unknown_tokens[0] : null;
    if (typeof share === "number" && share > UNREADABLE_SHARE) {
      parts.push(
        element(
          "p",
          `The model cannot read this query: ${Math.round(share * 100)}% of its tokens are unknown to its vocabulary ` +
            "([UNK]), so these results answer little of what it says.",
          "unreadable",
        ),
      );
    }
    const list = element("ol", undefined, "hits");
    for (const hit of hits) {
      const item = element("li");
      const shared = otherIds !== null && otherIds.has(idKey(hit.id));
      if (shared) item.classList.add("shared");
      const head = element("div", undefined, "hit-head");
      head.append(element("span", `#${hit.rank}`, "rank"), element("span", Number(hit.score).toFixed(4), "score"));
      if (typeof hit.z === "number") head.append(element("span", `z ${hit.z.toFixed(2)}`, "z"));
      head.append(element("span", String(hit.id), "id"));
      if (shared) head.append(element("span", "in both", "badge"));
      item.append(head, element("p", hit.text, "text"));
      list.append(item);
    }
    parts.push(list);
    column.replaceChildren(...parts);
  }

  function showTab(side) {
    results.dataset.show = side ? "right" : "left";
    tabButtons.forEach((button, i) => button.setAttribute("aria-selected", String(i === side)));
  }

  // ------------------------------------------------------------------ the URL's search

  function restore(state) {
    if (state.corpus !== null && [...corpusPicker.options].some((o) => o.value === state.corpus)) {
      corpusPicker.value = state.corpus;
    }
    fillConditions([state.left, state.right]);
    queryBox.value = state.query;
    kBox.value = state.k ?? "";
    calibratedBox.checked = state.calibrated;
  }

  function followFragment() {
    const given = keyFromFragment();
    if (given !== null && given !== keyBox.value) {
      keyBox.value = given;
      saveKey(given);
      loadIndexes().then(followFragment);
      return;
    }
    const state = stateFromFragment();
    if (state === null) {
      clearResults();
      return;
    }
    restore(state);
    search(false).catch((error) => say(`The search failed: ${error.message}`, true));
  }

  // ------------------------------------------------------------------ wiring

  form.noValidate = true; // the page says what is wrong (a browser's bubble left the old results up)
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    search().catch((error) => say(`The search failed: ${error.message}`, true));
  });
  corpusPicker.addEventListener("change", () => fillConditions());
  for (const box of [corpusPicker, ...pickers]) box.addEventListener("focus", refresh);
  tabButtons.forEach((button, side) => button.addEventListener("click", () => showTab(side)));
  window.addEventListener("popstate", followFragment);
  keyBox.addEventListener("change", () => {
    saveKey(keyBox.value);
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
  if (given !== null) saveKey(given);
  showTab(0);
  queryBox.focus(); // type at once (a server that wants a key moves the focus to its box)
  loadIndexes().then((ok) => {
    if (ok && stateFromFragment() !== null) followFragment();
  });
})();
