// The Writers page: exactly-once sink writers, their epochs and last published batch.
import { api } from "./api.js";
import { fmtInt, h } from "./dom.js";

export async function writersPage(view, { every, signal }) {
  const table = h("div", {});
  view.replaceChildren(h("h1", {}, "Writers"),
    h("p", { class: "muted" }, "A writer's epoch fences every stage and publish of its earlier runs."), table);
  await every(2000, async () => {
    const { writers } = await api("GET", "/v0/writers", undefined, signal);
    if (!writers.length) {
      table.replaceChildren(h("p", { class: "muted" }, "No exactly-once writers have opened a run."));
      return;
    }
    const rows = writers.flatMap((w) => (w.topics.length ? w.topics : [null]).map((t) =>
      h("tr", { "data-writer": w.writer },
        h("td", {}, w.writer), h("td", { class: "num" }, fmtInt(w.epoch)),
        h("td", {}, t ? h("a", { href: `#/topic/${encodeURIComponent(t.topic)}` }, t.topic) : "—"),
        h("td", { class: "num" }, t && t.last_batch_id !== null ? fmtInt(t.last_batch_id) : "—"),
        h("td", { class: "num" }, t && t.count ? `${fmtInt(t.first_seq)}…${fmtInt(t.first_seq + t.count - 1)}` : "—"),
        h("td", { class: "num" }, t ? fmtInt(t.staged_parts) : "—"))));
    table.replaceChildren(h("table", {},
      h("thead", {}, h("tr", {}, ["writer", "epoch", "topic", "last published batch", "its seqs", "staged parts"].map((c) => h("th", {}, c)))),
      h("tbody", {}, rows)));
  });
}
