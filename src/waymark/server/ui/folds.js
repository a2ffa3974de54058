// The Folds page: every KV fold node that reports to this server (docs/reports.md) —
// its cursor, lag behind the bucket, last export pointer, whether it holds the export
// lease or stands by, its bootstrap (progress while it runs, then the artifact it
// started from) and when it last reported —
// and each node's lag over the last minutes. A node that stopped reporting is marked
// stale: its numbers are the last it sent, not the fold's state now.
import { api } from "./api.js";
import { fmtBytes, fmtInt, fmtSpan, h } from "./dom.js";
import { record, values } from "./samples.js";
import { chart } from "./svg.js";

const seen = (f) => `${fmtSpan(Math.round(f.age_ms / 1000))} ago`;

function exportCell(e) {
  if (!e) return h("span", { class: "muted" }, "none");
  const at = new Date(e.time_ms).toISOString().replace("T", " ").slice(0, 19);
  return h("span", { title: e.payload }, `cursor ${fmtInt(e.cursor)} at ${at} UTC `,
    h("code", { class: "muted" }, e.payload));
}

function roleCell(f) {
  if (f.role === "exporter") return h("span", { class: "badge" }, "exporter");
  if (f.role === "standby") return h("span", {}, "standby", h("span", { class: "muted" }, ` (${f.lease_holder ?? "another node"} holds the lease)`));
  return h("span", { class: "muted" }, "—");
}

const RESTORE_STEPS = { download: "downloading", verify: "verifying", open: "opening" };

function restoreCell(r) {
  if (!r) return h("span", { class: "muted" }, "—");
  if (r.phase === "done") return h("span", { title: r.artifact }, `from ${r.artifact} at cursor ${fmtInt(r.cursor)}`);
  const pct = r.total_bytes ? Math.floor((100 * r.done_bytes) / r.total_bytes) : 0;
  const amount = r.phase === "open" ? "" : ` ${fmtBytes(r.done_bytes)} of ${fmtBytes(r.total_bytes)} (${pct}%)`;
  return h("span", { title: r.artifact }, h("progress", { value: r.done_bytes, max: r.total_bytes || 1 }),
    ` ${RESTORE_STEPS[r.phase] ?? r.phase} ${r.artifact}${amount}`);
}

export async function foldsPage(view, { every, signal }) {
  const cards = h("div", { class: "cards" });
  const charts = h("div", { class: "charts" });
  const table = h("div", {});
  view.replaceChildren(h("h1", {}, "Folds"),
    h("p", { class: "muted" }, "KV fold nodes started with --report-to this server. Lag: updates in the bucket not folded yet, as of the node's last report."),
    cards, h("h2", {}, "Lag"), charts, table);
  await every(2000, async () => {
    const { folds } = await api("GET", "/v0/folds", undefined, signal);
    for (const f of folds) if (!f.stale) record(`fold:${f.fold}/${f.node}`, f.lag);
    const stale = folds.filter((f) => f.stale).length;
    cards.replaceChildren(
      h("div", { class: "card", "data-testid": "folds-count" }, h("div", { class: "label" }, "fold nodes"), h("div", { class: "value" }, fmtInt(folds.length))),
      h("div", { class: "card", "data-testid": "folds-stale" }, h("div", { class: "label" }, "stale"),
        h("div", { class: "value" }, stale ? h("span", { class: "badge warn" }, fmtInt(stale)) : "0")));
    if (!folds.length) {
      charts.replaceChildren();
      table.replaceChildren(h("p", { class: "muted" }, "No fold has reported to this server (waymark fold --report-to URL)."));
      return;
    }
    charts.replaceChildren(...folds.map((f) => chart(values(`fold:${f.fold}/${f.node}`),
      { title: `${f.fold} @ ${f.node} lag`, testid: `fold-chart-${f.fold}-${f.node}` })));
    table.replaceChildren(h("table", {},
      h("thead", {}, h("tr", {}, ["fold", "node", "backend", "bucket", "cursor", "bucket seq", "lag", "last export", "export role", "bootstrap", "last report"].map((c) => h("th", {}, c)))),
      h("tbody", {}, folds.map((f) => h("tr", { "data-fold": `${f.fold}/${f.node}`, class: f.stale ? "stale" : "" },
        h("td", {}, f.fold), h("td", {}, f.node), h("td", {}, f.backend), h("td", {}, f.bucket),
        h("td", { class: "num", "data-testid": "fold-cursor" }, fmtInt(f.cursor)),
        h("td", { class: "num" }, fmtInt(f.bucket_seq)),
        h("td", { class: "num", "data-testid": "fold-lag" }, f.lag ? h("span", { class: "badge warn" }, fmtInt(f.lag)) : "0"),
        h("td", { "data-testid": "fold-export" }, exportCell(f.export)),
        h("td", { "data-testid": "fold-role" }, roleCell(f)),
        h("td", { "data-testid": "fold-restore" }, restoreCell(f.restore)),
        h("td", { "data-testid": "fold-seen" }, seen(f), " ",
          f.stale ? h("span", { class: "badge warn", "data-testid": "fold-stale" }, "stale: stopped reporting") : ""))))));
  });
}
