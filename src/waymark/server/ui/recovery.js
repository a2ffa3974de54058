// The Recovery page: every receipt-keeping client that reports to this server
// (docs/reports.md) — its low watermark, how many change checkpoints it is behind the
// newest one, its range receipts and pending checkpoints — and each client's
// "behind" over the last minutes.
import { api } from "./api.js";
import { fmtInt, fmtSpan, h } from "./dom.js";
import { record, values } from "./samples.js";
import { chart } from "./svg.js";

export async function recoveryPage(view, { every, signal }) {
  const cards = h("div", { class: "cards" });
  const charts = h("div", { class: "charts" });
  const table = h("div", {});
  view.replaceChildren(h("h1", {}, "Recovery"),
    h("p", { class: "muted" }, "Receipt recovery clients (RecoveryService) reporting to this server. Behind: change checkpoint ids after the client's watermark, up to the newest — what a restart walks back over."),
    cards, h("h2", {}, "Behind"), charts, table);
  await every(2000, async () => {
    const { clients, newest_checkpoint: newest } = await api("GET", "/v0/recovery/clients", undefined, signal);
    for (const c of clients) record(`behind:${c.client}`, c.behind);
    const behind = clients.filter((c) => c.behind > 0).length;
    cards.replaceChildren(
      h("div", { class: "card", "data-testid": "newest-checkpoint" }, h("div", { class: "label" }, "newest checkpoint"), h("div", { class: "value" }, fmtInt(newest))),
      h("div", { class: "card" }, h("div", { class: "label" }, "clients"), h("div", { class: "value" }, fmtInt(clients.length))),
      h("div", { class: "card", "data-testid": "clients-behind" }, h("div", { class: "label" }, "behind"), h("div", { class: "value" }, fmtInt(behind))));
    if (!clients.length) {
      charts.replaceChildren();
      table.replaceChildren(h("p", { class: "muted" }, "No recovery client has reported to this server."));
      return;
    }
    charts.replaceChildren(...clients.map((c) => chart(values(`behind:${c.client}`), { title: `${c.client} behind (checkpoints)` })));
    table.replaceChildren(h("table", {},
      h("thead", {}, h("tr", {}, ["client", "watermark", "behind", "range receipts", "pending checkpoints", "last report"].map((c) => h("th", {}, c)))),
      h("tbody", {}, clients.map((c) => h("tr", { "data-client": c.client },
        h("td", {}, c.client),
        h("td", { class: "num", "data-testid": "client-watermark" }, c.watermark === null ? "none" : fmtInt(c.watermark)),
        h("td", { class: "num", "data-testid": "client-behind" }, c.behind ? h("span", { class: "badge warn" }, fmtInt(c.behind)) : "0"),
        h("td", { class: "num" }, fmtInt(c.range_receipts)), h("td", { class: "num" }, fmtInt(c.pending)),
        h("td", {}, `${fmtSpan(Math.round(c.age_ms / 1000))} ago `,
          c.stale ? h("span", { class: "badge warn", "data-testid": "client-stale" }, "stale: stopped reporting") : "",
          // Its service stopped (docs/semantics/recovery.md §3.6): why, on hover.
          c.failed ? h("span", { class: "badge warn", "data-testid": "client-failed", title: c.failed }, "failed") : ""))))));
  });
}
