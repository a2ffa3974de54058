// The Folds page: every KV fold node that reports to this server (docs/reports.md) —
// its cursor, lag behind the bucket, last export pointer, whether it holds the export
// lease or stands by, its bootstrap (progress while it runs, then the artifact it
// started from) and when it last reported —
// and each node's lag over the last minutes. A node that stopped reporting is marked
// stale: its numbers are the last it sent, not the fold's state now. A node that ended
// says so in its final report: stopped or failed (with the error), shown with what it
// did while it ran.
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

function endedBadge(s) {
  return s.outcome === "failed"
    ? h("span", { class: "badge warn", "data-testid": "fold-ended" }, "failed")
    : h("span", { class: "badge", "data-testid": "fold-ended" }, "stopped");
}

// The final reports of the nodes that ended: one line each, newest first.
function finalReports(folds) {
  const ended = folds.filter((f) => f.stopped).sort((a, b) => b.stopped.time_ms - a.stopped.time_ms);
  if (!ended.length) return [];
  return [h("h2", {}, "Final reports"), h("table", { "data-testid": "fold-final-reports" },
    h("thead", {}, h("tr", {}, ["fold", "node", "outcome", "ended", "ran", "updates applied", "exports", "cursor", "lag at the end", "error"].map((c) => h("th", {}, c)))),
    h("tbody", {}, ended.map((f) => h("tr", { "data-final": `${f.fold}/${f.node}` },
      h("td", {}, f.fold), h("td", {}, f.node), h("td", {}, endedBadge(f.stopped)),
      h("td", {}, `${new Date(f.stopped.time_ms).toISOString().replace("T", " ").slice(0, 19)} UTC`),
      h("td", { class: "num" }, fmtSpan(Math.round(f.stopped.ran_ms / 1000))),
      h("td", { class: "num", "data-testid": "final-applied" }, fmtInt(f.stopped.applied)),
      h("td", { class: "num", "data-testid": "final-exports" }, fmtInt(f.stopped.exports)),
      h("td", { class: "num", "data-testid": "final-cursor" }, fmtInt(f.cursor)),
      h("td", { class: "num" }, fmtInt(f.lag)),
      h("td", { "data-testid": "final-error" }, f.stopped.message ?? "")))))];
}

export async function foldsPage(view, { every, signal }) {
  const cards = h("div", { class: "cards" });
  const charts = h("div", { class: "charts" });
  const table = h("div", {});
  const finals = h("div", {});
  view.replaceChildren(h("h1", {}, "Folds"),
    h("p", { class: "muted" }, "KV fold nodes started with --report-to this server. Lag: updates in the bucket not folded yet, as of the node's last report."),
    cards, h("h2", {}, "Lag"), charts, table, finals);
  await every(2000, async () => {
    const { folds } = await api("GET", "/v0/folds", undefined, signal);
    for (const f of folds) if (!f.stale && !f.stopped) record(`fold:${f.fold}/${f.node}`, f.lag);
    finals.replaceChildren(...finalReports(folds));
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
          f.stopped ? endedBadge(f.stopped) : "",
          f.stale ? h("span", { class: "badge warn", "data-testid": "fold-stale" }, "stale: stopped reporting") : ""))))));
  });
}
