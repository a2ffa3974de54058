// Rates and lag sampled in the browser from the API: the server keeps counters (head
// seqs, bytes, router cursors), the console keeps the last minutes of them. Append
// rates come from the server's own history instead (GET /v0/topics/{topic}/history),
// so they survive a reload (docs/console.md, "Rate history").

const KEEP_MS = 5 * 60_000;
const series = new Map(); // key -> [{t, v}] of raw counter values

export function record(key, value, t = Date.now()) {
  let points = series.get(key);
  if (!points) series.set(key, (points = []));
  points.push({ t, v: value });
  while (points.length && t - points[0].t > KEEP_MS) points.shift();
}

// The counter's values as they were sampled (a gauge such as lag).
export function values(key) {
  return series.get(key) || [];
}

// The counter's rate per second between consecutive samples. A counter that went
// down (a recreated topic) starts over rather than showing a negative rate.
export function rates(key) {
  const points = values(key);
  const out = [];
  for (let i = 1; i < points.length; i += 1) {
    const dt = (points[i].t - points[i - 1].t) / 1000;
    const dv = points[i].v - points[i - 1].v;
    if (dt > 0) out.push({ t: points[i].t, v: dv >= 0 ? dv / dt : 0 });
  }
  return out;
}

export function latestRate(key) {
  const r = rates(key);
  return r.length ? r[r.length - 1].v : null;
}

// Every topic's head seq and bytes, from one list (a page calls this on each poll).
export function recordTopics(topics, t = Date.now()) {
  for (const topic of topics) {
    record(`head:${topic.name}:${topic.epoch}`, topic.head_seq, t);
    record(`bytes:${topic.name}:${topic.epoch}`, topic.bytes, t);
  }
}

export const headKey = (topic) => `head:${topic.name}:${topic.epoch}`;
export const bytesKey = (topic) => `bytes:${topic.name}:${topic.epoch}`;

// Appends per second between the server's history points ([t_ms, head_seq, bytes]).
export function historyRates(history) {
  const out = [];
  const points = history ? history.samples : [];
  for (let i = 1; i < points.length; i += 1) {
    const dt = (points[i][0] - points[i - 1][0]) / 1000;
    const dv = points[i][1] - points[i - 1][1];
    if (dt > 0) out.push({ t: points[i][0], v: dv >= 0 ? dv / dt : 0 });
  }
  return out;
}
