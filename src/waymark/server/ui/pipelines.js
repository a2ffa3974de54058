// The Pipelines page: every pipeline run whose runner reports here (`report_to`,
// docs/pipeline.md), drawn from the same status `waymark pipeline status --json`
// prints: the stages and edges as a graph with each edge's generation and lag, the
// stages' counters, who holds each shard, and the edges' placements over time.
import { api, serverNow } from "./api.js";
import { fmtInt, fmtSpan, h } from "./dom.js";
import { chart, layout, s } from "./svg.js";

const fmtTime = (ms) => (ms ? new Date(ms).toISOString().replace("T", " ").slice(0, 23) : "—");

// The declared edges with their placed parts (one, or one per shard of the consumer).
function edgeSummaries(report) {
  const byEdge = new Map();
  for (const [placed, e] of Object.entries(report.edges)) {
    if (!byEdge.has(e.edge)) byEdge.set(e.edge, []);
    byEdge.get(e.edge).push({ placed, ...e });
  }
  return byEdge;
}

function stageTotals(report, name) {
  const keys = Object.keys(report.stages).filter((k) => k === name || k.startsWith(`${name}.`));
  const reports = keys.map((k) => report.stages[k]).filter(Boolean);
  return {
    processed: reports.reduce((n, r) => n + r.processed, 0),
    done: reports.length === keys.length && reports.every((r) => r.done),
    started: reports.length > 0,
  };
}

// Stages as boxes, a box per sink topic, an arrow per edge labelled with its
// generation(s) and lag (the sum over its parts; "?" when a server did not answer).
export function pipelineGraph(report) {
  const topology = report.topology;
  const parts = edgeSummaries(report);
  const links = [];
  for (const [name, stage] of Object.entries(topology)) {
    for (const edge of stage.outputs) {
      const dest = Object.keys(topology).find((n) => topology[n].input === edge);
      if (dest) links.push({ source: name, dest, edge });
    }
    if (stage.sink) links.push({ source: name, dest: `sink:${stage.sink}`, edge: null });
  }
  const names = [...Object.keys(topology), ...new Set(links.filter((l) => !l.edge).map((l) => l.dest))];
  const at = layout(names, links);
  const box = { w: 190, h: 48, gapX: 210, gapY: 40 };
  const cols = Math.max(1, ...[...at.values()].map((p) => p.col + 1));
  const rows = Math.max(1, ...[...at.values()].map((p) => p.row + 1));
  const width = 40 + cols * (box.w + box.gapX) - box.gapX;
  const height = 60 + rows * (box.h + box.gapY) - box.gapY;
  const pos = (n) => ({ x: 20 + at.get(n).col * (box.w + box.gapX), y: 30 + at.get(n).row * (box.h + box.gapY) });
  const defs = s("defs", {}, s("marker", { id: "pipe-arrow", viewBox: "0 0 10 10", refX: 10, refY: 5,
    markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" }, s("path", { d: "M0,0L10,5L0,10z", fill: "#8a9099" })));
  const arrows = links.map((l) => {
    const a = pos(l.source);
    const b = pos(l.dest);
    const x1 = a.x + box.w;
    const y1 = a.y + box.h / 2;
    const x2 = b.x;
    const y2 = b.y + box.h / 2;
    const mid = (x1 + x2) / 2;
    const d = `M${x1},${y1}C${mid},${y1} ${mid},${y2} ${x2},${y2}`;
    if (!l.edge) {
      return s("g", { class: "edge" }, s("path", { d, "marker-end": "url(#pipe-arrow)" }));
    }
    const placed = parts.get(l.edge) || [];
    const gens = [...new Set(placed.map((p) => p.generation))].sort((x, y) => x - y);
    const lags = placed.map((p) => p.lag);
    const lag = lags.some((v) => v === null) ? "?" : fmtInt(lags.reduce((n, v) => n + v, 0));
    const shards = placed.length > 1 ? ` · ${placed.length} shards` : "";
    const label = `gen ${gens.join("/") || "—"} · lag ${lag}`;
    const lagging = lags.some((v) => v > 0);
    return s("g", { class: `edge${lagging ? " lagging" : ""}`, "data-testid": "pipeline-edge", "data-edge": l.edge },
      s("title", {}, placed.map((p) => `${p.placed}: generation ${p.generation} on ${p.server ?? "—"}, lag ${p.lag ?? "?"}`).join("\n")),
      s("path", { d, "marker-end": "url(#pipe-arrow)" }),
      s("text", { x: mid, y: (y1 + y2) / 2 - 8, "text-anchor": "middle" }, `${l.edge}${shards}`),
      s("text", { x: mid, y: (y1 + y2) / 2 + 16, "text-anchor": "middle", "data-testid": "pipeline-edge-label" }, label));
  });
  const nodes = names.map((n) => {
    const p = pos(n);
    if (n.startsWith("sink:")) {
      return s("g", { class: "node queue", "data-testid": "pipeline-sink" },
        s("rect", { x: p.x, y: p.y, width: box.w, height: box.h, rx: 6 }),
        s("text", { x: p.x + 10, y: p.y + 19 }, n.slice(5)),
        s("text", { x: p.x + 10, y: p.y + 36, class: "muted" }, "sink topic"));
    }
    const stage = topology[n];
    const totals = stageTotals(report, n);
    const kind = stage.events !== null ? `source of ${fmtInt(stage.events)}` : stage.instances > 1 ? `${stage.instances} instances` : "";
    const state = totals.done ? "done" : totals.started ? "running" : "not started";
    return s("g", { class: "node", "data-testid": "pipeline-node", "data-stage": n },
      s("rect", { x: p.x, y: p.y, width: box.w, height: box.h, rx: 6 }),
      s("text", { x: p.x + 10, y: p.y + 19 }, `${n}${kind ? ` · ${kind}` : ""}`),
      s("text", { x: p.x + 10, y: p.y + 36, class: "muted" }, `${fmtInt(totals.processed)} processed · ${state}`));
  });
  return s("svg", { class: "graph", width, height, viewBox: `0 0 ${width} ${height}`, "data-testid": "pipeline-graph" },
    defs, arrows, nodes);
}

function edgesTable(report) {
  return h("table", {},
    h("thead", {}, h("tr", {}, ["edge", "generation", "server", "topic", "consumer", "lag (items)", "lag (packs)"].map((c) => h("th", {}, c)))),
    h("tbody", {}, Object.entries(report.edges).map(([placed, e]) => h("tr", { "data-testid": "pipeline-edge-row", "data-edge": placed },
      h("td", {}, placed), h("td", { class: "num", "data-testid": "edge-generation" }, String(e.generation)),
      h("td", {}, e.server ?? "(not placed)"), h("td", {}, h("code", {}, e.topic ?? "—")),
      h("td", {}, e.consumer), h("td", { class: "num", "data-testid": "edge-lag" }, e.lag === null ? "—" : fmtInt(e.lag)),
      h("td", { class: "num" }, e.lag_packs == null ? "—" : fmtInt(e.lag_packs))))));
}

function stagesTable(report) {
  return h("table", {},
    h("thead", {}, h("tr", {}, ["stage", "processed", "relocations", "replayed", "restarts", "dead letters", "held by", "state"].map((c) => h("th", {}, c)))),
    h("tbody", {}, Object.entries(report.stages).map(([key, r]) => {
      const holder = key in report.shards ? report.shards[key] : undefined;
      const held = holder === undefined ? "" : holder ? `${holder.owner} (epoch ${holder.epoch})` : "nobody yet";
      const state = !r ? "not started" : r.done ? "done" : r.last_error ? `running (last error: ${r.last_error.slice(0, 120)})` : "running";
      return h("tr", { "data-testid": "pipeline-stage-row", "data-stage": key },
        h("td", {}, key), h("td", { class: "num" }, r ? fmtInt(r.processed) : "—"),
        h("td", { class: "num" }, r ? String(r.relocations) : "—"), h("td", { class: "num" }, r ? fmtInt(r.replayed) : "—"),
        h("td", { class: "num" }, r ? String(r.restarts) : "—"), h("td", { class: "num" }, r ? fmtInt(r.dead_lettered) : "—"),
        h("td", { "data-testid": "shard-holder" }, held), h("td", {}, state));
    })));
}

// Each edge's placements, oldest first: a generation above 1 is a move.
function placementsTable(report) {
  if (!report.placements.length) return h("p", { class: "muted" }, "No edge placed yet.");
  return h("table", {},
    h("thead", {}, h("tr", {}, ["placed at (UTC)", "edge", "generation", "server", ""].map((c) => h("th", {}, c)))),
    h("tbody", {}, report.placements.map((p) => h("tr", { "data-testid": "placement", "data-edge": p.edge, "data-generation": p.generation },
      h("td", {}, fmtTime(p.placed_ms)), h("td", {}, p.edge), h("td", { class: "num" }, String(p.generation)),
      h("td", {}, p.server), h("td", {}, p.generation > 1 ? h("span", { class: "badge warn" }, "relocated") : "first placement")))));
}

// Each edge's lag (as placed) over the last reports the server kept: one chart per
// edge part, its points at the server's receipt times on this browser's clock. A gap
// is a report whose edge server did not answer.
function lagCharts(history) {
  const skew = Date.now() - serverNow();
  const placed = [...new Set(history.flatMap((sample) => Object.keys(sample.lags)))].sort();
  if (!placed.length) return h("p", { class: "muted" }, "No lag reported yet.");
  return h("div", { class: "charts" }, placed.map((name) => {
    const samples = history.filter((p) => name in p.lags).map((p) => ({ t: p.reported_ms + skew, v: p.lags[name] }));
    const drawn = chart(samples, { title: `${name} lag`, testid: "edge-lag-chart" });
    drawn.setAttribute("data-edge", name);
    drawn.setAttribute("data-samples", String(samples.filter((p) => p.v !== null).length));
    return drawn;
  }));
}

// Done (every stage finished: its runners stop reporting, and that is no alarm), or
// stale (they stopped before the end: the numbers are their last, not the state now).
function stateBadge(report, stale) {
  const stages = Object.values(report.stages);
  if (stages.length && stages.every((r) => r && r.done)) {
    return h("span", { class: "badge", "data-testid": "pipeline-done" }, stale ? "done (no longer reporting)" : "done");
  }
  return stale ? h("span", { class: "badge warn", "data-testid": "pipeline-stale" }, "stale: stopped reporting") : "";
}

export async function pipelinesPage(view, { every, signal }) {
  const body = h("div", {});
  view.replaceChildren(h("h1", {}, "Pipelines"),
    h("p", { class: "muted" }, "Pipelines whose runners report here (report_to in the pipeline file, or waymark pipeline run --report-to). The same status as waymark pipeline status --json."),
    body);
  await every(2000, async () => {
    const { pipelines } = await api("GET", "/v0/pipelines", undefined, signal);
    if (!pipelines.length) {
      body.replaceChildren(h("p", { class: "muted", "data-testid": "no-pipelines" }, "No pipeline reports to this server."));
      return;
    }
    body.replaceChildren(...pipelines.map(({ report, age_ms: age, stale, lag_history: history }) => h("section", { "data-testid": "pipeline", "data-pipeline": report.pipeline },
      h("h2", {}, `${report.pipeline}`, h("span", { class: "muted" }, ` run ${report.run ?? "—"} · reported ${fmtSpan(Math.round(age / 1000))} ago `),
        stateBadge(report, stale)),
      pipelineGraph(report),
      h("h2", {}, "Edges"), edgesTable(report),
      h("h2", {}, "Lag over time"), lagCharts(history ?? []),
      h("h2", {}, "Stages"), stagesTable(report),
      h("h2", {}, "Placements over time"), placementsTable(report))));
  });
}
