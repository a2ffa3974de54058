// One topic: watermarks, config, rate charts, a live tail over SSE (tombstones stand
// out with their reason and gap), jump to a seq, filter by tag or node, and a
// permanent delete behind a confirmation for tokens with the delete scope.
import { allowed, api, isAdmin, isGlob, stream, topicPath } from "./api.js";
import { card, fmtAgo, fmtBytes, fmtInt, h } from "./dom.js";
import { historyRates, record, values } from "./samples.js";
import { chart } from "./svg.js";
import { producePanel, searchPanel } from "./tools.js";

const TAIL_ROWS = 500; // rows kept in the tail; older ones scroll away
const BACKLOG = 50; // records shown from before the head when the tail starts

function tombstoneRow(t) {
  return h("div", { class: "row tombstone", "data-testid": "tombstone", "data-seq": t.$seq },
    h("span", {}, `#${t.$seq}`),
    h("span", {},
      h("span", { class: "reason", "data-testid": "tombstone-reason" }, t.reason),
      ` — records ${fmtInt(t.gap_from)}…${fmtInt(t.gap_to)} are gone`,
      t.missed_estimate ? ` (about ${fmtInt(t.missed_estimate)} missed)` : ""));
}

function recordRow(r) {
  return h("div", { class: "row record", "data-testid": "record", "data-seq": r.$seq },
    h("span", {}, `#${r.$seq}`),
    h("span", { class: "muted" }, new Date(r.$ts).toISOString().replace("T", " ").slice(0, 23)),
    h("span", {}, r.$tag ?? ""),
    h("span", { class: "muted" }, r.$node ?? ""),
    h("span", { class: "data" }, JSON.stringify(r.data)));
}

function deletePanel(name, onDone) {
  const before = h("input", { type: "number", min: 0, placeholder: "seq", "aria-label": "delete before seq", "data-testid": "delete-before" });
  const tag = h("input", { type: "text", placeholder: "tag or glob (customer:*)", "aria-label": "delete tag", "data-testid": "delete-tag" });
  const message = h("span", { class: "muted", "data-testid": "delete-result" });
  const confirmRow = h("div", { class: "toolbar", hidden: true });
  const selector = () => {
    const body = {};
    if (before.value !== "") body.before_seq = Number(before.value);
    const t = tag.value.trim();
    if (t) body.match = isGlob(t) ? ["tag", "Glob", t] : ["tag", "Eq", t];
    return body;
  };
  const describe = (body) => [
    body.before_seq !== undefined ? `every record with seq < ${body.before_seq}` : "every record",
    body.match ? ` whose tag ${body.match[1] === "Glob" ? "matches the glob" : "is"} "${body.match[2]}"` : "",
  ].join("");
  const ask = h("button", { class: "danger", type: "button", "data-testid": "delete", onclick: () => {
    const body = selector();
    if (body.before_seq === undefined && !body.match) {
      message.textContent = "give a seq, a tag, or both";
      return;
    }
    confirmRow.replaceChildren(
      h("strong", {}, `Permanently delete ${describe(body)} from ${name}? This cannot be undone.`),
      h("button", { class: "danger confirm", type: "button", "data-testid": "delete-confirm", onclick: async () => {
        confirmRow.hidden = true;
        try {
          const done = await api("POST", `${topicPath(name)}/delete`, body);
          message.textContent = `deleted ${fmtInt(done.deleted)} records; earliest seq now ${fmtInt(done.earliest_seq)}`;
          onDone();
        } catch (error) {
          message.textContent = error.message;
        }
      } }, "Delete permanently"),
      h("button", { type: "button", onclick: () => { confirmRow.hidden = true; } }, "Cancel"));
    confirmRow.hidden = false;
  } }, "Delete…");
  return h("section", { class: "panel danger", "data-testid": "delete-panel" },
    h("h2", {}, "Delete records"),
    h("div", { class: "toolbar" }, "before seq", before, "tag", tag, ask, message),
    confirmRow);
}

// The config fields an admin may change here (docs/topics.md); the rest keep their value.
const EDITABLE = {
  ttl_ms: "number", cap_records: "number", cap_bytes: "number", discard: ["old", "reject"],
  idempotency_window_ms: "number",
};

// An admin's config form: PUT /v0/topics/{topic} with the fields changed, nothing else.
// Built once: a poll does not overwrite what the user is typing.
function configForm(name, config, onDone) {
  const current = config();
  const inputs = Object.entries(EDITABLE).map(([key, kind]) => {
    const input = Array.isArray(kind)
      ? h("select", { name: key, "aria-label": key }, kind.map((v) => h("option", { value: v, selected: current[key] === v }, v)))
      : h("input", { type: "number", name: key, "aria-label": key, value: current[key] });
    return [key, input];
  });
  const message = h("span", { class: "muted", "data-testid": "config-result" });
  const form = h("form", { class: "toolbar", "data-testid": "config-form" },
    inputs.map(([key, input]) => h("label", {}, `${key} `, input)),
    h("button", { type: "submit" }, "Save config"), message);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const patch = {};
    const now = config();
    for (const [key, input] of inputs) {
      const value = EDITABLE[key] === "number" ? Number(input.value) : input.value;
      if (input.value !== "" && value !== now[key]) patch[key] = value;
    }
    if (!Object.keys(patch).length) {
      message.textContent = "nothing changed";
      return;
    }
    try {
      await api("PUT", topicPath(name), patch);
      message.textContent = `saved ${Object.keys(patch).join(", ")}`;
      await onDone();
      for (const [key, input] of inputs) input.value = config()[key];
    } catch (error) {
      message.textContent = error.message;
    }
  });
  return form;
}

export async function topicPage(view, { name, identity, every, signal }) {
  const title = h("h1", {}, name);
  const cards = h("div", { class: "cards" });
  const charts = h("div", { class: "charts" });
  const config = h("table", { "data-testid": "config" });
  const tail = h("div", { class: "tail", "data-testid": "tail" });
  const tailState = h("span", { class: "muted", "data-testid": "tail-state" }, "connecting");
  const jump = h("input", { type: "number", min: 0, placeholder: "seq", "aria-label": "jump to seq", "data-testid": "jump-seq" });
  const tagFilter = h("input", { type: "search", placeholder: "tag", "aria-label": "filter by tag", "data-testid": "tail-tag" });
  const nodeFilter = h("input", { type: "search", placeholder: "node", "aria-label": "filter by node", "data-testid": "tail-node" });
  const canDelete = allowed(identity, "delete", name);
  let topic = await api("GET", `${topicPath(name)}?touch=false`, undefined, signal);
  const configSlot = h("div", {});
  if (isAdmin(identity)) {
    configSlot.append(configForm(name, () => topic.config, async () => {
      topic = await api("GET", `${topicPath(name)}?touch=false`);
      drawState();
    }));
  }
  let history = null; // the server's append-rate history of this topic
  const loadHistory = async () => {
    history = await api("GET", `${topicPath(name)}/history`, undefined, signal);
  };
  let tailAbort = null;
  let rows = []; // events of the tail, oldest first

  const visible = (event) => {
    if (event.$type === "tombstone") return true; // a gap concerns every reader
    const tag = tagFilter.value.trim();
    const node = nodeFilter.value.trim();
    return (!tag || (event.$tag ?? "").includes(tag)) && (!node || (event.$node ?? "") === node);
  };
  const rowOf = (e) => (e.$type === "tombstone" ? tombstoneRow(e) : recordRow(e));
  const drawTail = () => {
    tail.replaceChildren(...rows.filter(visible).map(rowOf));
    tail.scrollTop = tail.scrollHeight;
  };
  // A busy topic's events are appended one by one, the oldest rows dropped: no redraw.
  const addToTail = (event) => {
    rows.push(event);
    if (rows.length > TAIL_ROWS) rows.splice(0, rows.length - TAIL_ROWS);
    if (visible(event)) tail.append(rowOf(event));
    while (tail.childElementCount > TAIL_ROWS) tail.firstElementChild.remove();
    tail.scrollTop = tail.scrollHeight;
  };
  const startTail = (fromSeq) => {
    if (tailAbort) tailAbort.abort();
    const abort = (tailAbort = new AbortController());
    signal.addEventListener("abort", () => abort.abort());
    rows = [];
    drawTail();
    let cursor = { epoch: topic.epoch, seq: fromSeq };
    const run = async () => {
      while (!abort.signal.aborted) {
        tailState.textContent = `live from seq ${cursor.seq + 1}`;
        try {
          await stream(`${topicPath(name)}/watch?from_seq=${cursor.seq}&epoch=${cursor.epoch}`, (event) => {
            if (event.event === "error") {
              tailState.textContent = JSON.parse(event.data).error.message;
              return;
            }
            const [epoch, seq] = event.id.split(":").map(Number);
            cursor = { epoch, seq };
            addToTail(JSON.parse(event.data));
          }, abort.signal);
        } catch (error) {
          if (abort.signal.aborted) return;
          tailState.textContent = `reconnecting: ${error.message}`;
        }
        await new Promise((resolve) => setTimeout(resolve, 1000));
      }
    };
    run();
  };
  const drawState = () => {
    title.replaceChildren(name, " ", h("span", { class: "badge" }, topic.type), " ",
      h("span", { class: "badge" }, topic.durability),
      topic.recovering ? h("span", { class: "badge warn" }, "recovering") : "");
    cards.replaceChildren(
      card("head seq", fmtInt(topic.head_seq), "head-seq"),
      card("earliest seq", fmtInt(topic.earliest_seq), "earliest-seq"),
      card("assigned head", fmtInt(topic.assigned_head_seq)),
      card("evict floor", fmtInt(topic.evict_floor)),
      card("records", fmtInt(topic.count)),
      card("bytes", fmtBytes(topic.bytes)),
      card("epoch", fmtInt(topic.epoch)),
      card("last write", fmtAgo(topic.last_write_ts)),
      card("last read", fmtAgo(topic.last_read_ts)),
      ...(topic.durability === "fsync" ? [card("fsync", `${topic.fsync_ms} ms`)] : []));
    charts.replaceChildren(
      chart(historyRates(history), { title: "appends", unit: "/s", testid: "rate-chart" }),
      chart(values(`count:${name}`), { title: "records held" }));
    record(`count:${name}`, topic.count);
    config.replaceChildren(h("tbody", {}, Object.entries(topic.config).map(([key, value]) =>
      h("tr", {}, h("th", {}, key), h("td", {}, value === null ? "—" : String(value))))));
  };

  view.replaceChildren(
    h("p", {}, h("a", { href: "#/topics" }, "← Topics")), title, cards, charts,
    h("h2", {}, "Live tail"),
    h("div", { class: "toolbar" },
      "jump to seq", jump,
      h("button", { type: "button", "data-testid": "jump", onclick: () => {
        if (jump.value !== "") startTail(Math.max(0, Number(jump.value) - 1));
      } }, "Go"),
      h("button", { type: "button", onclick: () => startTail(Math.max(0, topic.head_seq - BACKLOG)) }, "Latest"),
      "tag", tagFilter, "node", nodeFilter, tailState),
    tail,
    ...(allowed(identity, "write", name) ? [producePanel(name, async () => {
      topic = await api("GET", `${topicPath(name)}?touch=false`);
      drawState();
    })] : []),
    searchPanel(name, () => topic.epoch),
    ...(canDelete ? [deletePanel(name, async () => {
      topic = await api("GET", `${topicPath(name)}?touch=false`);
      drawState();
    })] : []),
    h("h2", {}, "Config"), configSlot, config);
  tagFilter.addEventListener("input", drawTail);
  nodeFilter.addEventListener("input", drawTail);
  await loadHistory();
  drawState();
  startTail(Math.max(0, topic.head_seq - BACKLOG));
  await every(2000, async () => {
    topic = await api("GET", `${topicPath(name)}?touch=false`, undefined, signal);
    await loadHistory();
    drawState();
  });
}
