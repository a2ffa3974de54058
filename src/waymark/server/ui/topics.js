// The Topics page: every topic's state, sortable and filterable, with its append rate.
import { allTopics } from "./api.js";
import { card, fmtAgo, fmtBytes, fmtInt, fmtRate, h, sortableTable } from "./dom.js";
import { headKey, latestRate, rates, recordTopics } from "./samples.js";
import { chart } from "./svg.js";

const state = { sort: "name", desc: false, filter: "" };

function configSummary(config) {
  const parts = [];
  if (config.ttl_ms) parts.push(`ttl ${config.ttl_ms / 1000} s`);
  if (config.cap_records) parts.push(`cap ${fmtInt(config.cap_records)} rec`);
  if (config.cap_bytes) parts.push(`cap ${fmtBytes(config.cap_bytes)}`);
  if (config.ttl_ms || config.cap_records || config.cap_bytes) parts.push(`discard ${config.discard}`);
  if (config.priority !== null && config.priority !== undefined) parts.push(`priority ${config.priority}`);
  if (config.dead_letter) parts.push(`dead letter ${config.dead_letter}`);
  return parts.join(" · ") || "defaults";
}

const COLUMNS = [
  { key: "name", label: "topic", render: (t) => h("a", { href: `#/topic/${encodeURIComponent(t.name)}` }, t.name) },
  { key: "type", label: "type" },
  { key: "durability", label: "durability" },
  { key: "head_seq", label: "head seq", num: true, render: (t) => fmtInt(t.head_seq) },
  { key: "earliest_seq", label: "earliest seq", num: true, render: (t) => fmtInt(t.earliest_seq) },
  { key: "count", label: "records", num: true, render: (t) => fmtInt(t.count) },
  { key: "bytes", label: "bytes", num: true, render: (t) => fmtBytes(t.bytes) },
  { key: "rate", label: "append rate", num: true, value: (t) => latestRate(headKey(t)) ?? -1,
    render: (t) => fmtRate(latestRate(headKey(t))) },
  { key: "last_write_ts", label: "last write", render: (t) => fmtAgo(t.last_write_ts) },
  { key: "last_read_ts", label: "last read", render: (t) => fmtAgo(t.last_read_ts) },
  { key: "config", label: "config", value: (t) => configSummary(t.config), render: (t) => configSummary(t.config) },
];

export async function topicsPage(view, { every, signal }) {
  const filter = h("input", { type: "search", placeholder: "filter by name, type or durability",
    "aria-label": "filter topics", value: state.filter, "data-testid": "topic-filter" });
  const summary = h("div", { class: "cards" });
  const charts = h("div", { class: "charts" });
  const table = h("div", {});
  view.replaceChildren(h("h1", {}, "Topics"), summary, charts,
    h("div", { class: "toolbar" }, filter), table);
  let topics = [];
  const draw = () => {
    const needle = state.filter.trim().toLowerCase();
    const shown = topics.filter((t) => !needle
      || [t.name, t.type, t.durability].some((v) => v.toLowerCase().includes(needle)));
    table.replaceChildren(sortableTable(COLUMNS, shown, state, draw,
      (t) => ({ "data-topic": t.name })));
    const total = topics.reduce((sum, t) => sum + (latestRate(headKey(t)) || 0), 0);
    summary.replaceChildren(
      card("topics", fmtInt(topics.length), "topic-count"),
      card("records", fmtInt(topics.reduce((sum, t) => sum + t.count, 0))),
      card("bytes", fmtBytes(topics.reduce((sum, t) => sum + t.bytes, 0))),
      card("append rate", fmtRate(total)));
    // The busiest topics' rates over the last minutes.
    const busiest = [...topics].sort((a, b) => (latestRate(headKey(b)) || 0) - (latestRate(headKey(a)) || 0)).slice(0, 4);
    charts.replaceChildren(...busiest.map((t) => chart(rates(headKey(t)), { title: `${t.name} appends`, unit: "/s" })));
  };
  filter.addEventListener("input", () => { state.filter = filter.value; draw(); });
  await every(2000, async () => {
    topics = await allTopics(signal);
    recordTopics(topics);
    draw();
  });
}
