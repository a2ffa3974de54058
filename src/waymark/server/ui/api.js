// The console's only way to the server: the public /v0 API, with the user's token
// (docs/console.md, "Tokens and scopes").

const TOKEN_KEY = "waymark.token";

export function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

export function setToken(secret) {
  if (secret) sessionStorage.setItem(TOKEN_KEY, secret);
  else sessionStorage.removeItem(TOKEN_KEY);
}

function headers(extra = {}) {
  const secret = token();
  return secret ? { ...extra, Authorization: `Bearer ${secret}` } : extra;
}

export class ApiError extends Error {
  constructor(status, code, message) {
    super(`${status} ${code}: ${message}`);
    this.status = status;
    this.code = code;
  }
}

// The server's clock as of its last answer (its Date header, to the second; +500 ms
// for the part of the second it drops), so "12 s ago" and lease deadlines, which are
// server timestamps, do not depend on the browser's clock.
let skewMs = 0;

export function serverNow() {
  return Date.now() + skewMs;
}

export const topicPath = (name) => `/v0/topics/${encodeURIComponent(name)}`;

// One JSON request; a refusal is an ApiError with the spec's code.
export async function api(method, path, body, signal) {
  const init = { method, headers: headers(body === undefined ? {} : { "Content-Type": "application/json" }), signal };
  if (body !== undefined) init.body = JSON.stringify(body);
  const response = await fetch(path, init);
  const date = response.headers.get("date");
  if (date) skewMs = Date.parse(date) + 500 - Date.now();
  const text = await response.text();
  const parsed = text ? JSON.parse(text) : null;
  if (!response.ok) {
    const error = (parsed && parsed.error) || {};
    throw new ApiError(response.status, error.code || "error", error.message || response.statusText);
  }
  return parsed;
}

// Every topic's state (those the token may read): GET /v0/topics answers a page at a
// time, by name; next_after names the next page.
export async function allTopics(signal) {
  let topics = [];
  let after = null;
  for (;;) {
    const query = after === null ? "" : `?after=${encodeURIComponent(after)}`;
    const page = await api("GET", `/v0/topics${query}`, undefined, signal);
    topics = topics.concat(page.topics);
    if (!page.next_after) return topics;
    after = page.next_after;
  }
}

// Everything, when the server has no token support yet (404) or auth is off.
const OPEN = { name: null, scopes: ["admin", "read:*", "write:*", "delete:*", "queue:*"], auth: false };

// Asked once per token: a token's scopes do not change while it is in use.
let known = { secret: null, identity: null };

export async function whoami() {
  const secret = token();
  if (known.secret === secret && known.identity) return known.identity;
  let identity;
  try {
    identity = await api("GET", "/v0/auth/whoami");
  } catch (error) {
    if (!(error instanceof ApiError && error.status === 404)) throw error;
    identity = OPEN;
  }
  known = { secret, identity };
  return identity;
}

// The one glob syntax (docs/globs.md), as the server matches it (waymark.protocol.globs,
// Python's fnmatchcase): the whole name, case-sensitive; `*` any run of characters, `?`
// one, `[abc]`, `[a-z]` one of a set, `[!abc]` one not in it; `/` and `.` are ordinary.
// globMatcher compiles the pattern once, for a caller that tests many names.
export function globMatcher(glob) {
  let re = "";
  for (let i = 0; i < glob.length; i++) {
    const c = glob[i];
    if (c === "*") re += "[^]*";
    else if (c === "?") re += "[^]";
    else if (c === "[") {
      let j = i + 1;
      if (glob[j] === "!") j++;
      if (glob[j] === "]") j++;
      while (j < glob.length && glob[j] !== "]") j++;
      if (j >= glob.length) {
        re += "\\[";  // no closing bracket: a literal "["
        continue;
      }
      let set = glob.slice(i + 1, j).replace(/[\\\]\[^&~|]/g, (m, at) => (m === "^" && at > 0 ? m : `\\${m}`));
      if (set.startsWith("!")) set = set.length === 1 ? "" : `^${set.slice(1)}`;
      re += set === "" ? "[^]" : `[${set}]`;
      i = j;
    } else re += c.replace(/[.+?^${}()|[\]\\/*-]/g, "\\$&");
  }
  try {
    const compiled = new RegExp(`^(?:${re})$`);
    return (name) => compiled.test(name);
  } catch {
    return () => false;  // a set such as [z-a] that matches nothing
  }
}

export const globMatches = (glob, name) => globMatcher(glob)(name);

export const isGlob = (text) => /[*?[]/.test(text);

// What the token may do: `kind` is read, write, delete or queue; admin may do anything.
export function allowed(identity, kind, topic = "*") {
  return identity.scopes.some((scope) => {
    if (scope === "admin") return true;
    const [scopeKind, glob] = scope.split(":", 2);
    return scopeKind === kind && glob !== undefined && globMatches(glob, topic);
  });
}

export const isAdmin = (identity) => identity.scopes.includes("admin");

// Server-Sent Events over fetch (EventSource cannot send the Authorization header).
// Calls onEvent({event, id, data}) per event until `signal` aborts or the stream ends.
export async function stream(path, onEvent, signal) {
  const response = await fetch(path, { headers: headers({ Accept: "text/event-stream" }), signal });
  if (!response.ok) {
    const body = await response.json().catch(() => ({}));
    const error = body.error || {};
    throw new ApiError(response.status, error.code || "error", error.message || response.statusText);
  }
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const event = { event: "message", id: null, data: "" };
      for (const line of block.split("\n")) {
        if (line.startsWith(":")) continue; // a heartbeat comment
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        const text = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
        if (field === "event") event.event = text;
        else if (field === "id") event.id = text;
        else if (field === "data") event.data += (event.data ? "\n" : "") + text;
      }
      if (event.data) onEvent(event);
    }
  }
}
