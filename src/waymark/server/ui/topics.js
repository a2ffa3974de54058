// The Topics page: every topic's state, sortable and filterable, with its append rate.
import { allTopics, api, isAdmin, topicPath } from "./api.js";
import { card, fmtAgo, fmtBytes, fmtInt, fmtRate, h, sortableTable } from "./dom.js";
import { headKey, historyRates, latestRate, recordTopics } from "./samples.js";
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

// An admin's form to create a topic: PUT /v0/topics/{name} with the fields given. It
// never updates an existing topic (a PUT would): the name is looked up first.
function createForm(onDone) {
  const name = h("input", { type: "text", placeholder: "name", "aria-label": "new topic name", "data-testid": "create-name", required: true });
  const type = h("select", { "aria-label": "new topic type", "data-testid": "create-type" },
    ["log", "queue"].map((v) => h("option", { value: v }, v)));
  const durability = h("select", { "aria-label": "new topic durability", "data-testid": "create-durability" },
    h("option", { value: "" }, "server default"), ["ephemeral", "memory", "disk", "fsync"].map((v) => h("option", { value: v }, v)));
  const numbers = ["ttl_ms", "cap_records", "cap_bytes"].map((key) =>
    [key, h("input", { type: "number", min: 0, placeholder: key, "aria-label": `new topic ${key}`, "data-testid": `create-${key}` })]);
  const message = h("span", { class: "muted", "data-testid": "create-result" });
  const form = h("form", { class: "toolbar", "data-testid": "create-form" },
    "New topic", name, type, durability, numbers.map(([, input]) => input),
    h("button", { type: "submit", "data-testid": "create" }, "Create"), message);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const topic = name.value.trim();
    const body = { type: type.value };
    if (durability.value) body.durability = durability.value;
    for (const [key, input] of numbers) if (input.value !== "") body[key] = Number(input.value);
    try {
      await api("GET", `${topicPath(topic)}?touch=false`);
      message.textContent = `${topic} exists already: change its config on its page`;
      return;
    } catch (error) {
      if (error.status !== 404) {
        message.textContent = error.message;
        return;
      }
    }
    try {
      await api("PUT", topicPath(topic), body);
      message.textContent = `created ${topic}`;
      name.value = "";
      await onDone();
    } catch (error) {
      message.textContent = error.message; // the server's code, e.g. invalid_topic_name
    }
  });
  return form;
}

export async function topicsPage(view, { identity, every, signal }) {
  const filter = h("input", { type: "search", placeholder: "filter by name, type or durability",
    "aria-label": "filter topics", value: state.filter, "data-testid": "topic-filter" });
  const summary = h("div", { class: "cards" });
  const charts = h("div", { class: "charts" });
  const table = h("div", {});
  const refresh = async () => {
    topics = await allTopics(signal);
    recordTopics(topics);
    draw();
  };
  view.replaceChildren(h("h1", {}, "Topics"), summary, charts,
    ...(isAdmin(identity) ? [createForm(refresh)] : []),
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
    charts.replaceChildren(...busiest.map(({ topic, history }) =>
      chart(historyRates(history), { title: `${topic.name} appends`, unit: "/s" })));
  };
  // The busiest topics' rates over the last minutes, from the server's history.
  let busiest = [];
  const loadBusiest = async () => {
    const top = [...topics].sort((a, b) => (latestRate(headKey(b)) || 0) - (latestRate(headKey(a)) || 0)
      || b.last_write_ts - a.last_write_ts).slice(0, 4);
    busiest = await Promise.all(top.map(async (topic) => ({
      topic, history: await api("GET", `${topicPath(topic.name)}/history`, undefined, signal).catch(() => null) })));
  };
  filter.addEventListener("input", () => { state.filter = filter.value; draw(); });
  await every(2000, async () => {
    topics = await allTopics(signal);
    recordTopics(topics);
    await loadBusiest();
    draw();
  });
}
