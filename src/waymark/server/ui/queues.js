// The Queues page: ready / in flight / dead-lettered counts, the oldest lease, and a
// redrive of dead letters for tokens with the queue scope.
import { allTopics, allowed, api, serverNow, topicPath } from "./api.js";
import { fmtInt, fmtSpan, h, sortableTable } from "./dom.js";
import { record, values } from "./samples.js";
import { chart } from "./svg.js";

const state = { sort: "name", desc: false };

// The oldest lease's deadline against the server's clock (docs/queues.md).
function oldestLease(queue) {
  const deadline = queue.earliest_lease_deadline;
  if (deadline === null || deadline === undefined) return "—";
  const s = Math.round((deadline - serverNow()) / 1000);
  return s >= 0 ? `expires in ${fmtSpan(s)}` : `expired ${fmtSpan(-s)} ago (reclaimed at next claim)`;
}

export async function queuesPage(view, { identity, every, signal }) {
  const table = h("div", {});
  const charts = h("div", { class: "charts" });
  const message = h("p", { class: "muted", "data-testid": "redrive-result" });
  view.replaceChildren(h("h1", {}, "Queues"), charts, table, message);
  let queues = [];
  const redrive = async (name) => {
    try {
      const done = await api("POST", `${topicPath(name)}/redrive`, {});
      message.textContent = `${name}: redrove ${fmtInt(done.redriven)} dead letters`;
    } catch (error) {
      message.textContent = `${name}: ${error.message}`;
    }
  };
  const columns = [
    { key: "name", label: "queue", render: (t) => h("a", { href: `#/topic/${encodeURIComponent(t.name)}` }, t.name) },
    { key: "ready", label: "ready", num: true, value: (t) => t.queue.ready, render: (t) => fmtInt(t.queue.ready) },
    { key: "in_flight", label: "leased", num: true, value: (t) => t.queue.in_flight, render: (t) => fmtInt(t.queue.in_flight) },
    { key: "dead_lettered", label: "dead-lettered", num: true, value: (t) => t.queue.dead_lettered, render: (t) => fmtInt(t.queue.dead_lettered) },
    { key: "parked", label: "parked", num: true, value: (t) => t.queue.dead_letter_parked,
      render: (t) => [fmtInt(t.queue.dead_letter_parked), t.queue.dead_letter_error
        ? h("div", { class: "badge warn" }, `${t.queue.dead_letter_error.code}: ${t.queue.dead_letter_error.message}`) : ""] },
    { key: "oldest", label: "oldest lease", value: (t) => t.queue.earliest_lease_deadline ?? Infinity,
      render: (t) => oldestLease(t.queue) },
    { key: "dead_letter", label: "dead letter topic", value: (t) => t.config.dead_letter ?? "", render: (t) => t.config.dead_letter ?? "—" },
    { key: "redrive", label: "", value: (t) => t.name, render: (t) => (t.config.dead_letter && allowed(identity, "queue", t.name)
      ? h("button", { type: "button", "data-testid": "redrive", onclick: () => redrive(t.name) }, "Redrive") : "") },
  ];
  const draw = () => {
    if (!queues.length) {
      table.replaceChildren(h("p", { class: "muted" }, "No queue topics (a topic created with type \"queue\")."));
      charts.replaceChildren();
      return;
    }
    table.replaceChildren(sortableTable(columns, queues, state, draw, (t) => ({ "data-topic": t.name })));
    charts.replaceChildren(...queues.slice(0, 4).map((t) => chart(values(`ready:${t.name}`), { title: `${t.name} ready` })));
  };
  await every(2000, async () => {
    const topics = await allTopics(signal);
    queues = topics.filter((t) => t.type === "queue");
    for (const q of queues) record(`ready:${q.name}`, q.queue.ready);
    draw();
  });
}
