"""The audit's outputs: a JSON summary and a self-contained HTML report.

The HTML page has no scripts and no external resources: charts are inline SVG, styles
are inline, so it works offline and can be mailed or archived as one file.
"""

from __future__ import annotations

import json
from html import escape
from pathlib import Path
from typing import Any

BAR = "#2f6fb0"
BAD = "#c0392b"
GOOD = "#2e8b57"


def write_json(summary: dict[str, Any], path: str | Path) -> None:
    Path(path).write_text(json.dumps(summary, indent=2, sort_keys=True, default=str) + "\n")


def _num(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".") if abs(value) < 1e6 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return escape(str(value))


def bar_chart(
    title: str,
    items: list[tuple[str, float | None]],
    colors: list[str] | None = None,
    unit: str = "",
) -> str:
    """A horizontal bar chart as inline SVG; a None value is drawn as no bar and "-"."""
    width, label_w, row_h = 720, 230, 24
    height = 34 + row_h * max(1, len(items))
    top = max((v for _, v in items if v is not None), default=0) or 1
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{width}" height="{height}" '
        f'role="img" aria-label="{escape(title)}">',
        f'<text x="0" y="16" font-size="14" font-weight="bold">{escape(title)}</text>',
    ]
    if not items:
        parts.append('<text x="0" y="44" font-size="12" fill="#666">nothing to show</text>')
    for i, (label, value) in enumerate(items):
        y = 28 + i * row_h
        if value is None:
            parts.append(
                f'<text x="0" y="{y + 15}" font-size="12">{escape(label[:34])}</text>'
                f'<text x="{label_w}" y="{y + 15}" font-size="12">-</text>'
            )
            continue
        w = 0 if value <= 0 else max(2, int((width - label_w - 90) * value / top))
        color = (colors or [])[i] if colors and i < len(colors) else BAR
        parts.append(
            f'<text x="0" y="{y + 15}" font-size="12">{escape(label[:34])}</text>'
            f'<rect x="{label_w}" y="{y + 3}" width="{w}" height="{row_h - 7}" fill="{color}"/>'
            f'<text x="{label_w + w + 6}" y="{y + 15}" font-size="12">{_num(value)}{unit}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _columns(rows: list[dict[str, Any]]) -> list[str]:
    """Every column of ``rows``, in order of first appearance: rows of one finding kind
    may differ in shape (a ``duplicated`` seq has a source, a duplicated ID an entry_id)."""
    cols: dict[str, None] = {}
    for row in rows:
        cols.update(dict.fromkeys(row))
    return list(cols)


def _fraction(value: Any) -> str:
    """A fraction as a percentage, never rounded up to 100% (or down to 0%) unless it is."""
    if value is None:
        return "-"
    number = float(value)
    for digits in range(1, 9):
        text = f"{number * 100:.{digits}f}"
        if (number >= 1 or float(text) < 100) and (number <= 0 or float(text) > 0):
            return f"{text}%"
    return f"{number * 100:g}%"


def _table(rows: list[dict[str, Any]], limit: int = 50) -> str:
    if not rows:
        return "<p class='none'>none</p>"
    cols = _columns(rows[:limit])
    head = "".join(f"<th>{escape(c)}</th>" for c in cols)
    body = "".join(
        "<tr>" + "".join(f"<td>{_cell(r.get(c))}</td>" for c in cols) + "</tr>"
        for r in rows[:limit]
    )
    more = f"<p>{len(rows) - limit} more in the JSON summary</p>" if len(rows) > limit else ""
    return f"<table><tr>{head}</tr>{body}</table>{more}"


def _cell(value: Any) -> str:
    if isinstance(value, list | dict):
        return escape(json.dumps(value, default=str)[:300])
    return _num(value)


_STYLE = """
body { font-family: sans-serif; margin: 24px; color: #222; background: #fff; }
h1 { font-size: 22px; } h2 { font-size: 17px; margin-top: 28px; }
table { border-collapse: collapse; font-size: 12px; margin: 6px 0; }
td, th { border: 1px solid #ccc; padding: 3px 6px; text-align: left; }
.status { font-size: 16px; font-weight: bold; padding: 8px; color: #fff; display: inline-block; }
.fail { background: #c0392b; } .pass { background: #2e8b57; }
.grid { display: flex; flex-wrap: wrap; gap: 24px; } .none { color: #666; }
"""


def render_html(summary: dict[str, Any]) -> str:
    findings = summary["findings"]
    failed = set(summary.get("failed", []))
    totals = summary.get("totals", {})
    kinds = sorted(findings, key=lambda k: (-findings[k]["count"], k))
    finding_chart = bar_chart(
        "Findings by kind",
        [(k, findings[k]["count"]) for k in kinds],
        [BAD if k in failed else (BAR if findings[k]["count"] else GOOD) for k in kinds],
    )
    backlog = summary.get("backlog", [])
    backlog_chart = bar_chart(
        "Pending entries by type and destination",
        [(f"{r['type']} -> {r['destination']}", r["pending"]) for r in backlog[:20]],
    )
    ages = summary.get("ages", {})
    age_chart = bar_chart(
        "Age of pending entries (seconds)"
        + ("" if ages.get("pending") else ": no pending entry has a date"),
        [
            (p, None if ages.get(p) is None else float(ages[p]))
            for p in ("p50", "p90", "p99", "max")
        ],
        unit=" s",
    )
    limit = summary.get("config", {}).get("size_limit") or 1
    hist = summary.get("size_histogram", [])
    size_chart = bar_chart(
        f"Documents by size (tenths of {limit / 1024 / 1024:.0f} MiB)",
        [(f"{10 * r['bucket']}-{10 * r['bucket'] + 10}%", r["documents"]) for r in hist],
        [BAD if r["bucket"] >= 8 else BAR for r in hist],
    )
    parts_chart = bar_chart(
        "Pending entries per partition",
        [
            (
                f"partition {r['partition']}"
                + ("" if r.get("documents", 1) else " (no documents)"),
                r["pending"] or 0,
            )
            for r in summary.get("partitions", [])[:64]
        ],
    )
    dead = summary.get("dead_letters")
    dead_chart = (
        bar_chart("Dead letters by error", [(r["error"], r["count"]) for r in dead[:20]])
        if dead is not None
        else ""
    )
    status = (
        f"<span class='status fail'>FAILED: {escape(', '.join(sorted(failed)))}</span>"
        if failed
        else "<span class='status pass'>PASSED</span>"
    )
    sizes = summary.get("sizes", {})
    expected = totals.get("expected_documents")
    figures: dict[str, str] = {
        "documents read": _num(totals.get("documents")),
        "documents in the collection": (
            f"{_num(expected)} (counted by the database apart from Spark: more than were read "
            "means some were not read, an unread_documents finding)"
            if expected is not None
            else "- (not counted: no manifest or count for this source)"
        ),
        "pending entries": _num(totals.get("pending_entries")),
        "documents with pending entries": _num(totals.get("documents_with_pending")),
        "largest document (bytes)": _num(sizes.get("max")),
        "headroom under 16 MiB at max": _fraction(sizes.get("headroom_mongodb_max")),
        "headroom under 2 MiB at p99": _fraction(sizes.get("headroom_cosmos_p99")),
        "headroom under 2 MiB at max": _fraction(sizes.get("headroom_cosmos_max")),
        "inbox size p99 / max": f"{_num(summary.get('inbox_fill', {}).get('p99'))} / "
        f"{_num(summary.get('inbox_fill', {}).get('max'))}",
    }
    rec = summary.get("reconciliation")
    if rec is not None:
        figures["messages reconciled"] = escape(reconciliation_text(rec))
    fig_rows = "".join(f"<tr><th>{escape(k)}</th><td>{v}</td></tr>" for k, v in figures.items())
    detail = "".join(
        f"<h3>{escape(k)} ({findings[k]['count']}, threshold "
        f"{_num(findings[k]['threshold'])})</h3>{_table(summary['rows'].get(k, []))}"
        for k in kinds
        if findings[k]["count"]
    )
    source = "".join(
        f"<tr><th>{escape(str(k))}</th><td>{escape(str(v))}</td></tr>"
        for k, v in (summary.get("source") or {}).items()
        if v is not None
    )
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        "<title>docoutbox audit</title>"
        f"<style>{_STYLE}</style></head><body>"
        f"<h1>docoutbox audit</h1><p>as of {escape(str(summary.get('generated_at')))}</p>"
        f"<table class='source'>{source}</table>"
        f"{status}<table>{fig_rows}</table>"
        f"<div class='grid'>{finding_chart}{backlog_chart}{age_chart}{size_chart}"
        f"{parts_chart}{dead_chart}</div>"
        f"<h2>Findings</h2>{detail or '<p>none</p>'}"
        "</body></html>\n"
    )


def write_html(summary: dict[str, Any], path: str | Path) -> None:
    Path(path).write_text(render_html(summary))


def reconciliation_text(rec: dict[str, Any]) -> str:
    """What reconciliation could and could not verify, in one paragraph."""
    text = (
        f"{rec['reconciled']:,} of {rec['emitted']:,} emitted messages reconciled "
        f"({rec['by_exact_marks']:,} by exact marks, {rec['by_id_window']:,} by ID window, "
        f"{rec['pending']:,} pending, {rec['dead_letters']:,} dead letters); "
        f"lost {rec['lost']:,}, duplicated {rec['duplicated']:,}, "
        f"unexpected {rec['unexpected']:,}"
    )
    if rec["unverifiable"]:
        text += (
            f"; {rec['unverifiable']:,} could not be verified: their consumers keep no exact "
            "marks for their stream, only an ID window, which no longer holds their ID (or "
            "the IDs are not deterministic). Exact de-duplication "
            "(InboxPolicy(exact=True)) makes every message verifiable"
        )
    return text
