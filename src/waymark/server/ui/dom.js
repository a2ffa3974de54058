// Small DOM and formatting helpers shared by the pages.
import { serverNow } from "./api.js";

// h("td", {class: "num"}, "12"): an element with attributes and children.
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

export function fmtInt(n) {
  return n === null || n === undefined ? "—" : Number(n).toLocaleString("en-US");
}

export function fmtBytes(n) {
  if (n < 1024) return `${n} B`;
  const units = ["KiB", "MiB", "GiB", "TiB"];
  let value = n / 1024;
  let i = 0;
  while (value >= 1024 && i < units.length - 1) { value /= 1024; i += 1; }
  return `${value.toFixed(value < 10 ? 1 : 0)} ${units[i]}`;
}

export function fmtRate(perSecond) {
  if (perSecond === null || perSecond === undefined) return "—";
  return perSecond >= 100 ? `${Math.round(perSecond)}/s` : `${perSecond.toFixed(1)}/s`;
}

// A server timestamp (ms) as "12 s ago"; 0 means never.
export function fmtAgo(ts, now = serverNow()) {
  if (!ts) return "never";
  const s = Math.round((now - ts) / 1000);
  if (s < 0) return `in ${fmtSpan(-s)}`;
  return `${fmtSpan(s)} ago`;
}

export function fmtSpan(s) {
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min`;
  if (s < 86400) return `${Math.floor(s / 3600)} h`;
  return `${Math.floor(s / 86400)} d`;
}

export function card(label, value, testid) {
  return h("div", { class: "card", "data-testid": testid },
    h("div", { class: "label" }, label), h("div", { class: "value" }, value));
}

// A sortable, filterable table: columns are {key, label, value(row), render(row), num}.
export function sortableTable(columns, rows, state, onChange, rowAttrs = () => ({})) {
  const col = columns.find((c) => c.key === state.sort) || columns[0];
  const value = col.value || ((row) => row[col.key]);
  const sorted = [...rows].sort((a, b) => {
    const x = value(a);
    const y = value(b);
    const order = x < y ? -1 : x > y ? 1 : 0;
    return state.desc ? -order : order;
  });
  const head = h("tr", {}, columns.map((c) => h("th", {
    class: `sortable${c.key === col.key ? (state.desc ? " sorted-desc" : " sorted-asc") : ""}`,
    "data-key": c.key,
    onclick: () => {
      state.desc = c.key === state.sort ? !state.desc : false;
      state.sort = c.key;
      onChange();
    },
  }, c.label)));
  const body = sorted.map((row) => h("tr", rowAttrs(row), columns.map((c) =>
    h("td", { class: [c.num ? "num" : "", c.key].join(" ").trim() },
      c.render ? c.render(row) : (c.value || ((r) => r[c.key]))(row)))));
  return h("table", {}, h("thead", {}, head), h("tbody", {}, body));
}
