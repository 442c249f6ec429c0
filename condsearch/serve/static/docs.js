// The API docs at /docs: this server's operations, read from its /openapi.json and written out as
// text. Nothing comes from elsewhere (Swagger UI's page loads its code from a CDN: blank offline).
// The API key is the one the search page keeps for this tab, or /docs#key=KEY.
"use strict";

(() => {
  const KEY_HEADER = "X-API-Key"; // condsearch.serve.config.API_KEY_HEADER
  const KEY_SAVED = "condsearch-api-key"; // the search page's sessionStorage entry
  const METHODS = ["get", "post", "put", "patch", "delete"];

  const byId = (id) => document.getElementById(id);
  const statusLine = byId("status");

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

  function key() {
    for (const part of location.hash.slice(1).split("&")) {
      if (!part.startsWith("key=")) continue;
      history.replaceState(null, "", location.pathname + location.search);
      try {
        return decodeURIComponent(part.slice(4));
      } catch {
        return part.slice(4);
      }
    }
    try {
      return sessionStorage.getItem(KEY_SAVED) || "";
    } catch {
      return "";
    }
  }

  function resolve(schema, api) {
    // one level of "$ref": "#/components/schemas/Name", as FastAPI writes them
    const ref = schema && typeof schema.$ref === "string" ? schema.$ref : null;
    if (!ref || !ref.startsWith("#/components/schemas/")) return schema || {};
    const name = ref.slice("#/components/schemas/".length);
    return { title: name, ...((api.components && api.components.schemas && api.components.schemas[name]) || {}) };
  }

  function typeOf(schema, api) {
    const s = resolve(schema, api);
    if (schema && schema.$ref) return s.title || "object";
    if (Array.isArray(s.anyOf)) return s.anyOf.map((x) => typeOf(x, api)).join(" | ");
    if (s.type === "array") return `array of ${typeOf(s.items, api)}`;
    return s.type || "any";
  }

  function fields(schema, api) {
    const s = resolve(schema, api);
    const props = s.properties || {};
    const required = new Set(s.required || []);
    const list = element("dl", undefined, "fields");
    for (const [name, prop] of Object.entries(props)) {
      const p = resolve(prop, api);
      const def = p.default !== undefined ? ` = ${JSON.stringify(p.default)}` : "";
      list.append(element("dt", `${name}: ${typeOf(prop, api)}${required.has(name) ? " (required)" : def}`));
      list.append(element("dd", p.description || prop.description || ""));
    }
    return list;
  }

  function operation(path, method, op, api) {
    const section = element("section", undefined, "operation");
    section.append(element("h2", `${method.toUpperCase()} ${path}`));
    if (op.summary) section.append(element("p", op.summary, "summary"));
    if (op.description) section.append(element("p", op.description, "text"));
    const body = op.requestBody && op.requestBody.content && op.requestBody.content["application/json"];
    if (body) {
      section.append(element("h3", "Request body (JSON)"));
      section.append(fields(body.schema, api));
    }
    const responses = Object.entries(op.responses || {});
    if (responses.length) {
      section.append(element("h3", "Responses"));
      const list = element("dl", undefined, "fields");
      for (const [code, response] of responses) {
        const json = response.content && response.content["application/json"];
        const shape = json && json.schema ? `: ${typeOf(json.schema, api)}` : "";
        list.append(element("dt", `${code}${shape}`), element("dd", response.description || ""));
      }
      section.append(list);
      for (const [code, response] of responses) {
        const json = response.content && response.content["application/json"];
        const schema = json && json.schema ? resolve(json.schema, api) : null;
        if (code.startsWith("2") && schema && schema.properties) {
          section.append(element("h3", `${code}: ${schema.title || "the answer"}`), fields(json.schema, api));
        }
      }
    }
    return section;
  }

  async function show() {
    say("Reading /openapi.json…");
    const headers = new Headers();
    const given = key();
    if (given) headers.set(KEY_HEADER, Array.from(new TextEncoder().encode(given), (b) => String.fromCharCode(b)).join(""));
    const response = await fetch("openapi.json", { headers, cache: "no-store", credentials: "omit" });
    if (response.status === 401) {
      say("This server needs an API key: open the search page, enter it there, and come back (or open /docs#key=KEY).", true);
      return;
    }
    if (!response.ok) {
      say(`Cannot read /openapi.json: HTTP ${response.status}`, true);
      return;
    }
    const api = await response.json();
    const info = api.info || {};
    byId("title").textContent = `${info.title || "API"} ${info.version || ""}`.trim();
    if (info.description) byId("description").prepend(element("span", `${info.description} `));
    const sections = [];
    for (const [path, item] of Object.entries(api.paths || {})) {
      for (const method of METHODS) if (item[method]) sections.push(operation(path, method, item[method], api));
    }
    byId("operations").replaceChildren(...sections);
    say(`${sections.length} operations. Every error answers {"error": "one line"} with a 4xx or 5xx status.`);
  }

  show().catch((error) => say(`Cannot show the API: ${error.message}`, true));
})();
