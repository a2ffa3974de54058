// A topic's tools beside its live tail: produce records, and search the records held
// (by tag, seq range and text) — both through the public API with the user's token
// (docs/console.md, "Produce" and "Search").
import { api, globMatcher, topicPath } from "./api.js";
import { fmtInt, h } from "./dom.js";

const PAGE = 1000; // records a search reads per diff page
const SCAN_BUDGET = 50_000; // records one click scans before it offers to go on
const MAX_HITS = 200; // rows a search shows

// One JSON value per line, each a record's data; an optional tag for all of them.
export function producePanel(name, onDone) {
  const text = h("textarea", { rows: 4, cols: 60, placeholder: '{"id": 1, "name": "first"}\n{"id": 2}',
    "aria-label": "records to append, one JSON value per line", "data-testid": "produce-text" });
  const tag = h("input", { type: "text", placeholder: "tag (optional)", "aria-label": "produce tag", "data-testid": "produce-tag" });
  const message = h("span", { class: "muted", "data-testid": "produce-result" });
  const send = h("button", { type: "button", "data-testid": "produce", onclick: async () => {
    const lines = text.value.split("\n").map((l) => l.trim()).filter(Boolean);
    if (!lines.length) {
      message.textContent = "write one JSON value per line";
      return;
    }
    const records = [];
    for (const [i, line] of lines.entries()) {
      try {
        records.push({ data: JSON.parse(line), ...(tag.value.trim() ? { tag: tag.value.trim() } : {}) });
      } catch (error) {
        message.textContent = `line ${i + 1} is not JSON: ${error.message}`; // nothing sent
        return;
      }
    }
    try {
      const done = await api("POST", `${topicPath(name)}/records`, { records });
      message.textContent = `appended ${fmtInt(done.seqs.length)} record(s) at seq ${fmtInt(done.seqs[0])}…${fmtInt(done.seqs[done.seqs.length - 1])}`;
      text.value = "";
      await onDone();
    } catch (error) {
      message.textContent = error.message; // the server's code: nothing was appended
    }
  } }, "Append");
  return h("section", { class: "panel", "data-testid": "produce-panel" },
    h("h2", {}, "Produce"),
    h("div", { class: "toolbar" }, text),
    h("div", { class: "toolbar" }, "tag", tag, send, message));
}

function hitRow(event) {
  if (event.$type === "tombstone") {
    return h("div", { class: "row tombstone", "data-testid": "search-tombstone" },
      h("span", {}, `#${event.$seq}`),
      h("span", {}, h("span", { class: "reason" }, event.reason), ` — records ${fmtInt(event.gap_from)}…${fmtInt(event.gap_to)} are gone`));
  }
  return h("div", { class: "row record", "data-testid": "search-hit", "data-seq": event.$seq },
    h("span", {}, `#${event.$seq}`), h("span", {}, event.$tag ?? ""),
    h("span", { class: "data" }, JSON.stringify(event.data)));
}

// Reads the topic page by page from a seq and keeps what matches; each click scans at
// most SCAN_BUDGET records, and "Continue" goes on where it stopped. Losses in the
// range (tombstones) are shown too: a search never hides a gap. The read names the
// topic instance the page was opened on, so a seq past the head is not mistaken for a
// recreated topic (docs/semantics/topics.md §5.5).
export function searchPanel(name, epochNow) {
  const tag = h("input", { type: "search", placeholder: "tag pattern, e.g. order.*", "aria-label": "search tag", "data-testid": "search-tag" });
  const from = h("input", { type: "number", min: 0, placeholder: "from seq", "aria-label": "search from seq", "data-testid": "search-from" });
  const to = h("input", { type: "number", min: 0, placeholder: "to seq", "aria-label": "search to seq", "data-testid": "search-to" });
  const text = h("input", { type: "search", placeholder: "text in the data", "aria-label": "search text", "data-testid": "search-text" });
  const status = h("span", { class: "muted", "data-testid": "search-status" });
  const results = h("div", { class: "tail", "data-testid": "search-results" });
  const more = h("button", { type: "button", hidden: true, "data-testid": "search-more" }, "Continue");
  let cursor = null; // where the next page starts: { seq, epoch }
  let scanned = 0;
  let hits = 0;
  let query = null;

  const matches = (r) => (!query.tag || query.tag(r.$tag ?? ""))
    && (!query.text || JSON.stringify(r.data).includes(query.text));

  const scan = async () => {
    more.hidden = true;
    let budget = SCAN_BUDGET;
    try {
      while (budget > 0 && hits < MAX_HITS) {
        const page = await api("POST", `${topicPath(name)}/diff`, {
          from_seq: cursor.seq, limit: Math.min(PAGE, budget), epoch: cursor.epoch });
        const gap = page.tombstone;
        if (gap && (query.to === null || gap.gap_from <= query.to)) results.append(hitRow(gap));
        for (const event of page.records) {
          if (query.to !== null && event.$seq > query.to) { cursor.done = true; break; }
          if (matches(event)) {
            results.append(hitRow(event));
            hits += 1;
            if (hits >= MAX_HITS) { cursor.seq = event.$seq; break; }
          }
          cursor.seq = event.$seq;
        }
        if (!cursor.done && hits < MAX_HITS) cursor.seq = page.next_from_seq;
        cursor.epoch = page.epoch;
        const read = page.records.length;
        scanned += read;
        budget -= read;
        if (cursor.done || page.caught_up || read === 0) { cursor.done = true; break; }
      }
    } catch (error) {
      status.textContent = error.message;
      return;
    }
    const finished = cursor.done || hits >= MAX_HITS;
    status.textContent = `${fmtInt(hits)} match(es) in ${fmtInt(scanned)} record(s) read, up to seq ${fmtInt(cursor.seq)}`
      + (finished ? (hits >= MAX_HITS ? ` (the first ${MAX_HITS} shown)` : "") : " — more to read");
    more.hidden = finished;
  };

  const start = () => {
    // The pattern is compiled once per search, not once per record read.
    query = { tag: tag.value.trim() ? globMatcher(tag.value.trim()) : null, text: text.value, to: to.value === "" ? null : Number(to.value) };
    cursor = { seq: from.value === "" ? 0 : Math.max(0, Number(from.value) - 1), epoch: epochNow() };
    scanned = 0;
    hits = 0;
    results.replaceChildren();
    scan();
  };
  more.addEventListener("click", scan);
  return h("section", { class: "panel", "data-testid": "search-panel" },
    h("h2", {}, "Search"),
    h("div", { class: "toolbar" }, "tag", tag, "seq", from, "to", to, "text", text,
      h("button", { type: "button", "data-testid": "search", onclick: start }, "Search"), more, status),
    results);
}
