// Inline SVG: the small time-series charts and the router graph.

const NS = "http://www.w3.org/2000/svg";

export function s(tag, attrs = {}, ...children) {
  const el = document.createElementNS(NS, tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value !== undefined && value !== null) el.setAttribute(key, String(value));
  }
  for (const child of children.flat()) {
    if (child !== undefined && child !== null) {
      el.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
  }
  return el;
}

// A line chart of samples [{t, v}] over the last `spanMs`, labelled with the latest value.
export function chart(samples, { title, unit = "", spanMs = 5 * 60_000, width = 280, height = 70, testid } = {}) {
  const pad = { top: 14, right: 6, bottom: 12, left: 6 };
  const now = Date.now();
  const points = samples.filter((p) => p.v !== null && now - p.t <= spanMs);
  const max = Math.max(1, ...points.map((p) => p.v));
  const x = (t) => pad.left + (width - pad.left - pad.right) * (1 - (now - t) / spanMs);
  const y = (v) => height - pad.bottom - (height - pad.top - pad.bottom) * (v / max);
  const last = points.length ? points[points.length - 1].v : null;
  const line = points.map((p, i) => `${i ? "L" : "M"}${x(p.t).toFixed(1)},${y(p.v).toFixed(1)}`).join("");
  const area = points.length > 1
    ? `${line}L${x(points[points.length - 1].t).toFixed(1)},${height - pad.bottom}L${x(points[0].t).toFixed(1)},${height - pad.bottom}Z`
    : "";
  const shown = last === null ? "—" : `${last >= 100 ? Math.round(last) : last.toFixed(1)}${unit}`;
  return s("svg", { class: "chart", width, height, viewBox: `0 0 ${width} ${height}`, role: "img",
    "aria-label": `${title}: ${shown}`, "data-testid": testid },
  s("text", { x: pad.left, y: 10 }, `${title}  ${shown}`),
  s("text", { x: width - pad.right, y: height - 2, "text-anchor": "end" }, `max ${Math.round(max)}${unit}`),
  s("text", { x: pad.left, y: height - 2 }, `-${Math.round(spanMs / 60_000)} min`),
  s("line", { x1: pad.left, x2: width - pad.right, y1: height - pad.bottom, y2: height - pad.bottom, stroke: "#d9dad6" }),
  area ? s("path", { class: "area", d: area }) : null,
  line ? s("path", { class: "line", d: line }) : null,
  points.length ? s("circle", { class: "dot", r: 2.5, cx: x(points[points.length - 1].t), cy: y(last) }) : null);
}

// Columns by depth from the sources (a cycle stops where it closes), rows in name order.
export function layout(names, edges) {
  const depth = new Map(names.map((n) => [n, 0]));
  for (let round = 0; round < names.length; round += 1) {
    let changed = false;
    for (const e of edges) {
      const want = depth.get(e.source) + 1;
      if (want > depth.get(e.dest) && want < names.length) { depth.set(e.dest, want); changed = true; }
    }
    if (!changed) break;
  }
  const columns = new Map();
  for (const n of names) {
    const d = depth.get(n);
    if (!columns.has(d)) columns.set(d, []);
    columns.get(d).push(n);
  }
  const at = new Map();
  for (const [d, members] of columns) members.forEach((n, row) => at.set(n, { col: d, row }));
  return at;
}

// The forwarding graph: a box per topic, an arrow per router labelled with its
// guarantee, filter and lag (records committed to the source and not yet forwarded).
export function routerGraph(routers, topics, { onTopic } = {}) {
  const names = [...new Set(routers.flatMap((r) => [r.source, r.dest]))].sort();
  const at = layout(names, routers);
  const box = { w: 170, h: 40, gapX: 230, gapY: 50 };
  const cols = Math.max(1, ...[...at.values()].map((p) => p.col + 1));
  const rows = Math.max(1, ...[...at.values()].map((p) => p.row + 1));
  const width = 20 + cols * (box.w + box.gapX) - box.gapX + 20;
  const height = 20 + rows * (box.h + box.gapY) - box.gapY + 40;
  const pos = (n) => ({ x: 20 + at.get(n).col * (box.w + box.gapX), y: 30 + at.get(n).row * (box.h + box.gapY) });
  const byName = new Map(topics.map((t) => [t.name, t]));
  const defs = s("defs", {}, s("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5,
    markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" }, s("path", { d: "M0,0L10,5L0,10z", fill: "#8a9099" })));
  const edges = routers.map((r, i) => {
    const a = pos(r.source);
    const b = pos(r.dest);
    const lag = r.lag;
    const x1 = a.x + box.w;
    const y1 = a.y + box.h / 2;
    let x2 = b.x;
    const y2 = b.y + box.h / 2;
    let d;
    if (r.source === r.dest || b.x <= a.x) { // backwards (a cycle): loop below the boxes
      x2 = b.x + box.w / 2;
      const low = Math.max(a.y, b.y) + box.h + 18 + 6 * i;
      d = `M${a.x + box.w / 2},${a.y + box.h}C${a.x + box.w / 2},${low} ${x2},${low} ${x2},${b.y + box.h}`;
    } else {
      const mid = (x1 + x2) / 2;
      d = `M${x1},${y1}C${mid},${y1} ${mid},${y2} ${x2},${y2}`;
    }
    const filter = r.filter ? ` · filter ${describeFilter(r.filter)}` : "";
    const lx = (x1 + x2) / 2;
    const ly = (y1 + y2) / 2 - 6;
    return s("g", { class: `edge ${r.guarantee}${lag > 0 ? " lagging" : ""}`, "data-router": r.name },
      s("title", {}, `${r.name}: ${r.source} → ${r.dest}, ${r.guarantee}${filter}, lag ${lag}`),
      s("path", { d, "marker-end": "url(#arrow)" }),
      s("text", { x: lx, y: ly, "text-anchor": "middle" }, `${r.name} · ${r.guarantee.replace(/_/g, "-")}`),
      s("text", { x: lx, y: ly + 24, "text-anchor": "middle" }, `lag ${lag}${filter}`));
  });
  const nodes = names.map((n) => {
    const p = pos(n);
    const t = byName.get(n);
    const node = s("g", { class: `node${t && t.type === "queue" ? " queue" : ""}`, "data-topic": n, cursor: "pointer" },
      s("rect", { x: p.x, y: p.y, width: box.w, height: box.h, rx: 6 }),
      s("text", { x: p.x + 10, y: p.y + 17 }, n.length > 22 ? `${n.slice(0, 21)}…` : n),
      s("text", { x: p.x + 10, y: p.y + 32, class: "muted" }, t ? `head ${t.head_seq} · ${t.durability}` : "not created"));
    if (onTopic) node.addEventListener("click", () => onTopic(n));
    return node;
  });
  return s("svg", { class: "graph", width, height, viewBox: `0 0 ${width} ${height}`, "data-testid": "router-graph" },
    defs, edges, nodes);
}

export function describeFilter(filter) {
  const parts = [];
  // A tag rule is "X" or ["tag", "Eq", "X"] or ["tag", "Glob", "X*"] (docs/http-api.md).
  if (filter.tag) parts.push(`tag ${typeof filter.tag === "string" ? filter.tag : filter.tag[2]}`);
  if (filter.node) parts.push(`node ∈ ${filter.node.join(",")}`);
  if (filter.not_node) parts.push(`node ∉ ${filter.not_node.join(",")}`);
  return parts.join(" ");
}
