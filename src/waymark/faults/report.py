"""A campaign's report: ``report.json`` and ``index.html`` (docs/faults.md, "The report").

The page is self-contained: the schedule, each checker's verdict, throughput and
append latency over time as inline SVG with the faults marked, and the time to
recover per fault kind (p50/p99). No script, no external file.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from waymark.faults.campaign import CampaignResult
from waymark.faults.schedule import FaultKind

COLOURS = {
    FaultKind.SERVER_KILL: "#d62728",
    FaultKind.SERVER_PAUSE: "#ff7f0e",
    FaultKind.FOLD_KILL: "#9467bd",
    FaultKind.FOLD_PAUSE: "#8c564b",
    FaultKind.CONSUMER_KILL: "#e377c2",
    FaultKind.CONSUMER_PAUSE: "#bcbd22",
    FaultKind.NET_CUT: "#1f77b4",
    FaultKind.NET_LATENCY: "#17becf",
    FaultKind.S3_PAUSE: "#2ca02c",
    FaultKind.DISK_FULL: "#7f7f7f",
    FaultKind.EDGE_KILL: "#aec7e8",
    FaultKind.CLOCK_JUMP: "#98df8a",
    FaultKind.EDGE_PAUSE: "#6b6ecf",
    FaultKind.PIPELINE_KILL: "#e7ba52",
    FaultKind.PIPELINE_PAUSE: "#ad494a",
    FaultKind.NATS_KILL: "#393b79",
    FaultKind.NATS_PAUSE: "#8ca252",
    FaultKind.SPARK_KILL: "#ff9896",
    FaultKind.SPARK_PAUSE: "#c5b0d5",
}


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank percentile (``q`` in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(math.ceil(q / 100 * len(ordered)) - 1, 0)]


def per_kind(result: CampaignResult) -> dict[str, dict[str, Any]]:
    """Per fault kind: count, time to recover p50/p99 (seconds), faults never recovered
    from, those that found their target exited (did nothing), and the violations (the
    campaign's, as faults overlap none of them alone)."""
    violations = sum(1 for v in result.verdicts if not v.ok)
    out: dict[str, dict[str, Any]] = {}
    for kind in FaultKind:
        mine = [a for a in result.applied if a.fault.kind is kind]
        if not mine:
            continue
        noops = sum(1 for a in mine if a.noop)
        times = [a.recovered_s for a in mine if a.recovered_s is not None and not a.noop]
        p50, p99 = percentile(times, 50), percentile(times, 99)
        out[str(kind)] = {
            "count": len(mine),
            "recover_p50_s": None if p50 is None else round(p50, 3),
            "recover_p99_s": None if p99 is None else round(p99, 3),
            "not_recovered": len(mine) - noops - len(times),
            "noops": noops,
            "violations": violations,
        }
    return out


def timeline(result: CampaignResult, bin_s: float = 1.0) -> list[dict[str, Any]]:
    """Per ``bin_s`` of the run: acknowledged appends per second, their latency p50 and
    max (ms), and NATS writes per second."""
    n = max(math.ceil(result.seconds / bin_s), 1)
    acks: list[list[float]] = [[] for _ in range(n)]
    nats = [0] * n
    for t, latency in result.observations.acks:
        acks[min(int(t / bin_s), n - 1)].append(latency * 1000)
    for t, _ in result.observations.nats_acks:
        nats[min(int(t / bin_s), n - 1)] += 1
    return [
        {"t": round(i * bin_s, 3), "appends_per_s": len(a) / bin_s,
         "latency_p50_ms": percentile(a, 50), "latency_max_ms": max(a, default=None),
         "nats_writes_per_s": nats[i] / bin_s}
        for i, a in enumerate(acks)
    ]  # fmt: skip


def to_json(result: CampaignResult) -> dict[str, Any]:
    return {
        "seed": result.seed,
        "seconds": result.seconds,
        "ok": result.ok,
        "components": result.components,
        "left_out": result.left_out,
        "verdicts": [v.to_json() for v in result.verdicts],
        "per_kind": per_kind(result),
        "schedule": [a.to_json() for a in result.applied],
        "acknowledged": len(result.observations.acked),
        "errors": len(result.observations.errors),
        "timeline": timeline(result),
    }


def write(result: CampaignResult, directory: Path) -> Path:
    """Write ``report.json`` and ``index.html`` into ``directory``; the page's path."""
    directory.mkdir(parents=True, exist_ok=True)
    data = to_json(result)
    (directory / "report.json").write_text(json.dumps(data, indent=1))
    page = directory / "index.html"
    page.write_text(render(data))
    return page


def _plot(data: dict[str, Any], field: str, label: str, height: int = 160) -> str:
    """One line chart over the run, with each fault a shaded band in its kind's colour."""
    width, left, bottom = 900, 50, 20
    seconds = max(float(data["seconds"]), 1.0)
    points = [(row["t"], row[field]) for row in data["timeline"] if row[field] is not None]
    top = max((v for _, v in points), default=1.0) or 1.0

    def x(t: float) -> float:
        return left + (width - left - 10) * t / seconds

    def y(v: float) -> float:
        return 10 + (height - bottom - 10) * (1 - v / top)

    bands = "".join(
        f'<rect x="{x(f["injected_s"]):.1f}" y="10" '
        f'width="{max(x(f["lifted_s"]) - x(f["injected_s"]), 1):.1f}" '
        f'height="{height - bottom - 10}" fill="{COLOURS[FaultKind(f["kind"])]}" opacity="0.25">'
        f"<title>{html.escape(f['kind'])} at {f['injected_s']}s</title></rect>"
        for f in data["schedule"]
    )
    line = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in points)
    ticks = "".join(
        f'<text x="{x(t):.1f}" y="{height - 4}" font-size="10" text-anchor="middle">{t:g}s</text>'
        for t in range(0, int(seconds) + 1, max(int(seconds) // 10, 1))
    )
    return (
        f'<svg width="{width}" height="{height}" role="img" aria-label="{html.escape(label)}">'
        f'<text x="4" y="12" font-size="11">{html.escape(label)} (max {top:,.0f})</text>{bands}'
        f'<polyline points="{line}" fill="none" stroke="#333" stroke-width="1.2"/>{ticks}</svg>'
    )


def render(data: dict[str, Any]) -> str:
    esc = html.escape
    verdicts = "".join(
        f'<tr class="{"ok" if v["ok"] else "bad"}"><td>{"PASS" if v["ok"] else "FAIL"}</td>'
        f"<td>{esc(v['name'])}</td><td>{esc(v['summary'])}</td>"
        f"<td><code>{esc(json.dumps(v['examples'])[:300])}</code></td></tr>"
        for v in data["verdicts"]
    )
    kinds = "".join(
        f'<tr><td><span style="color:{COLOURS[FaultKind(k)]}">■</span> {esc(k)}</td>'
        f"<td>{s['count']}</td><td>{s['recover_p50_s']}</td><td>{s['recover_p99_s']}</td>"
        f"<td>{s['not_recovered']}</td><td>{s['noops']}</td><td>{s['violations']}</td></tr>"
        for k, s in data["per_kind"].items()
    )
    schedule = "".join(
        f"<tr><td>{f['injected_s']}</td><td>{esc(f['kind'])}</td><td>{f['duration_s']}</td>"
        f"<td>{f['latency_ms'] or f.get('jump_ms') or ''}</td>"
        f"<td>{esc(f['noop'] or '') or f['recovered_s']}</td></tr>"
        for f in data["schedule"]
    )
    verdict = "every checker passed" if data["ok"] else "VIOLATIONS FOUND"
    head = f"<title>waymark fault campaign, seed {data['seed']}</title><style>{STYLE}</style>"
    return "\n".join([
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">{head}</head><body>',
        f"<h1>Fault campaign: {esc(verdict)}</h1>",
        f"<p>Seed {data['seed']}, {data['seconds']:g} s, {len(data['schedule'])} faults, "
        f"{data['acknowledged']:,} acknowledged appends, {data['errors']:,} failed attempts "
        "(retried).</p>",
        f"<p>In the flow: {esc('; '.join(data['components']))}.<br>"
        f"Not in it yet: {esc('; '.join(data['left_out']))}.</p>",
        "<h2>Checkers</h2>",
        _table(["", "checker", "result", "examples"], verdicts),
        "<h2>Time to recover per fault kind (seconds from the lift to the first progress)</h2>",
        _table(["kind", "count", "p50", "p99", "not recovered", "no-ops",
                "violations (whole run)"], kinds),
        "<h2>Over time</h2>",
        _plot(data, "appends_per_s", "acknowledged appends per second"),
        _plot(data, "latency_max_ms", "append latency, max per second (ms)"),
        _plot(data, "nats_writes_per_s", "NATS bucket writes per second"),
        "<h2>Schedule</h2>",
        _table(["injected (s)", "kind", "duration (s)", "latency or jump (ms)",
                "recovered after (s), or why it did nothing"],
               schedule),
        "</body></html>\n",
    ])  # fmt: skip


STYLE = (
    "body{font-family:sans-serif;max-width:960px;margin:2em auto}"
    "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px}"
    "tr.bad{background:#fdd}tr.ok td:first-child{color:green}"
)


def _table(header: list[str], rows: str) -> str:
    return "<table><tr>" + "".join(f"<th>{h}</th>" for h in header) + f"</tr>{rows}</table>"
