// The Routers page: the forwarding graph (source → dest, guarantee, filter, lag) and
// each router's lag over the last minutes. Lag is the source's head seq minus the
// router's forward cursor: records committed to the source and not yet forwarded.
import { allTopics, api, isAdmin } from "./api.js";
import { fmtInt, h } from "./dom.js";
import { record, values } from "./samples.js";
import { chart, describeFilter, routerGraph } from "./svg.js";

export async function routersPage(view, { identity, every, signal }) {
  const graph = h("div", {});
  const charts = h("div", { class: "charts" });
  const table = h("div", {});
  const message = h("p", { class: "muted", "data-testid": "router-result" });
  view.replaceChildren(h("h1", {}, "Routers"), graph, h("h2", {}, "Lag"), charts, table, message);
  let confirming = null; // the router whose delete waits for its confirmation
  let poll = async () => {};
  const redraw = () => poll().catch((error) => { message.textContent = error.message; });
  // Deleting a router stops forwarding; copies already in dest remain (docs/routers.md).
  const control = (r) => {
    if (!isAdmin(identity)) return "";
    if (confirming !== r.name) {
      return h("button", { type: "button", class: "danger", "data-testid": "router-delete",
        onclick: () => { confirming = r.name; redraw(); } }, "Delete…");
    }
    return h("span", {}, `Stop forwarding ${r.source} → ${r.dest}? Copies already made stay. `,
      h("button", { type: "button", class: "danger confirm", "data-testid": "router-delete-confirm", onclick: async () => {
        confirming = null;
        try {
          await api("DELETE", `/v0/routers/${encodeURIComponent(r.name)}`);
          message.textContent = `deleted router ${r.name}`;
        } catch (error) {
          message.textContent = error.message;
        }
        redraw();
      } }, "Delete router"),
      h("button", { type: "button", onclick: () => { confirming = null; redraw(); } }, "Cancel"));
  };
  await every(2000, poll = async () => {
    const [{ routers }, topics] = await Promise.all([
      api("GET", "/v0/routers", undefined, signal), allTopics(signal)]);
    const heads = new Map(topics.map((t) => [t.name, t.head_seq]));
    for (const r of routers) {
      r.lag = Math.max(0, (heads.get(r.source) ?? r.cursor) - r.cursor);
      record(`lag:${r.name}`, r.lag);
    }
    if (!routers.length) {
      graph.replaceChildren(h("p", { class: "muted" }, "No routers."));
      charts.replaceChildren();
      table.replaceChildren();
      return;
    }
    graph.replaceChildren(routerGraph(routers, topics, {
      onTopic: (name) => { window.location.hash = `#/topic/${encodeURIComponent(name)}`; },
    }));
    charts.replaceChildren(...routers.map((r) => chart(values(`lag:${r.name}`), { title: `${r.name} lag` })));
    table.replaceChildren(h("table", {},
      h("thead", {}, h("tr", {}, ["router", "source", "dest", "guarantee", "filter", "cursor", "lag", "source trimmed", ""].map((c) => h("th", {}, c)))),
      h("tbody", {}, routers.map((r) => h("tr", { "data-router": r.name },
        h("td", {}, r.name), h("td", {}, r.source), h("td", {}, r.dest), h("td", {}, r.guarantee),
        h("td", {}, r.filter ? describeFilter(r.filter) : "—"), h("td", { class: "num" }, fmtInt(r.cursor)),
        h("td", { class: "num" }, fmtInt(r.lag)), h("td", { class: "num" }, fmtInt(r.source_trimmed)),
        h("td", {}, control(r)))))));
  });
}
