"""The status page's HTML, rendered on the member from the ``/status.json`` document.

The page is readable without JavaScript (the first 25 rows of each table, every section open);
``static/status.js`` then polls ``status.json`` once a second and re-renders the same markup with
paging, a filter box per long table and sections that stay collapsed.  Everything is served by the
member: no CDN, no build step.
"""

from __future__ import annotations

from html import escape
from importlib import resources
from typing import Any

PAGE_ROWS = 25


def static_file(name: str) -> bytes:
    """A file of ``dledger/status/static`` (the page's script and style sheet)."""
    return resources.files("dledger.status").joinpath("static", name).read_bytes()


def fmt(v: Any) -> str:
    if v is None or v == "":
        return "\u2013"
    if v is True:
        return "yes"
    if v is False:
        return "no"
    if isinstance(v, float):
        return str(round(v, 3))
    return str(v)


def _cell(v: Any) -> str:
    cls = ' class="num"' if isinstance(v, (int, float)) and not isinstance(v, bool) else ""
    return f"<td{cls}>{escape(fmt(v))}</td>"


def _kv(pairs: list) -> str:
    items = "".join(f"<dt>{escape(str(k))}</dt><dd>{escape(fmt(v))}</dd>" for k, v in pairs)
    return f'<dl class="kv">{items}</dl>'


def sparkline(values: list, width: int = 240, height: int = 48) -> str:
    """An inline SVG polyline of ``values`` (None: a gap), scaled to the largest."""
    nums = [v for v in values if v is not None]
    top = max(nums) if nums else 0
    pts = []
    for i, v in enumerate(values):
        if v is None:
            continue
        x = i * (width - 2) / (len(values) - 1) + 1 if len(values) > 1 else width / 2
        y = height - 2 - ((v / top) * (height - 4) if top > 0 else 0)
        pts.append(f"{x:.1f},{y:.1f}")
    return (f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}"><polyline fill="none" '
            f'stroke="#2a6fdb" stroke-width="1.5" points="{" ".join(pts)}"/></svg>')


def _spark(label: str, values: list, unit: str) -> str:
    nums = [v for v in values if v is not None]
    now = nums[-1] if nums else None
    top = max(nums) if nums else 0
    return (f'<div class="spark"><div class="label">{escape(label)}: <b>{escape(fmt(now))}</b> {escape(unit)} '
            f"(max {escape(fmt(top))})</div>{sparkline(values)}</div>")


def render_table(t: dict[str, Any]) -> str:
    rows = t["rows"]
    out = [f"<h3>{escape(t['title'])}</h3>"] if t["title"] else []
    if len(rows) > PAGE_ROWS:
        out.append(f'<div class="pager">rows 1\u2013{PAGE_ROWS} of {len(rows)} (more with JavaScript)</div>')
    out.append(f'<table id="table-{escape(t["id"])}"><thead><tr>')
    out += [f"<th>{escape(str(c))}</th>" for c in t["columns"]]
    out.append("</tr></thead><tbody>")
    out += ["<tr>" + "".join(_cell(v) for v in r) + "</tr>" for r in rows[:PAGE_ROWS]]
    if not rows:
        out.append(f'<tr><td colspan="{len(t["columns"])}">none</td></tr>')
    out.append("</tbody></table>")
    return "".join(out)


def render_section(s: dict[str, Any]) -> str:
    body = _kv(s["summary"]) if s["summary"] else ""
    body += "".join(render_table(t) for t in s["tables"])
    return f'<details data-section="{escape(s["id"])}" open><summary>{escape(s["title"])}</summary>{body}</details>'


def _configuration(c: dict[str, Any] | None) -> str:
    """``configuration entry 12 (committed)`` above the members table; nothing for an older document."""
    if not c:
        return ""
    where = "the bootstrap --peers" if c["index"] == 0 else f"entry {c['index']}"
    state = "committed" if c["committed"] else "not committed yet: a change is in flight"
    return f'<p class="sub" id="configuration">configuration {escape(where)} ({state})</p>'


def render_content(doc: dict[str, Any]) -> str:
    """The page's body: what ``status.js`` re-renders on each poll."""
    m = doc["member"]
    role = escape(m["role"])
    usage = None if m["disk_used_ratio"] is None else f"{m['disk_used_ratio'] * 100:.1f}% of the partition"
    out = [f'<h1>dledger group <span id="group">{escape(doc["group"])}</span> \u2014 member '
           f'{escape(doc["self_id"])}</h1>',
           f'<p class="sub">role <b id="role" class="role-{role}">{role}</b>, term <b id="term">{m["term"]}</b>, '
           f'leader <b id="leader">{escape(fmt(m["leader"]))}</b></p>',
           _kv([("log", f"{m['begin']} .. {m['end']} (last term {m['end_term']})"), ("committed", m["committed"]),
                ("applied", m["applied"]), ("pending appends", m["pending"]),
                ("store", f"{m['store_type']}, {m['store_bytes']} bytes"), ("disk used", usage),
                ("disk state", m["disk_problem"] or "ok"), ("store damaged", m["store_damaged"] or "no")]),
           f'<h2>Members</h2>{_configuration(doc.get("configuration"))}'
           '<table id="members"><thead><tr><th>member</th><th>address</th><th>role</th><th>membership</th>'
           "<th>lag (entries)</th><th>last contact (s ago)</th><th>disk</th></tr></thead><tbody>"]
    for r in doc["members"]:
        me = ' class="self"' if r["self"] else ""
        disk = r["disk_problem"] or ("\u2013" if r["role"] == "?" else "ok")
        out.append(f'<tr data-member="{escape(r["id"])}"{me}><td>{escape(r["id"])}'
                   f'{" (this page)" if r["self"] else ""}</td><td>{escape(r["address"])}</td>'
                   f'<td class="role-{escape(r["role"])}">{escape(r["role"])}</td>'
                   f'<td>{escape(fmt(r.get("membership")))}</td>{_cell(r["lag"])}'
                   f'{_cell(r["last_contact_s"])}<td>{escape(disk)}</td></tr>')
    out.append("</tbody></table>")
    s = doc["series"]
    out.append('<h2>Recent history</h2><div class="sparks">' + _spark("committed", s["commits_per_s"], "entries/s")
               + _spark("appended (as leader)", s["appends_per_s"], "entries/s")
               + _spark("append latency p99", s["latency_p99_ms"], "ms")
               + _spark("append latency mean", s["latency_mean_ms"], "ms") + "</div>")
    events = {"id": "events", "title": "",
              "columns": ["when (s ago)", "term", "became", "leader", "reason"],
              "rows": [[round(doc["now"] - e["at"], 1), e["term"], e["role"], e["leader"], e["reason"]]
                       for e in doc["events"]]}
    out.append("<h2>Elections and leadership changes (newest first)</h2>" + render_table(events))
    out += [render_section(sec) for sec in doc["sections"]]
    return "".join(out)


def render_page(doc: dict[str, Any]) -> str:
    """The whole page (``/`` and ``/status``)."""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>dledger {escape(doc['group'])}/{escape(doc['self_id'])} status</title>"
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            '<link rel="stylesheet" href="status.css"></head><body>'
            '<div id="banner" class="banner ok">as served (live updates need JavaScript)</div>'
            f'<div id="content">{render_content(doc)}</div>'
            '<p class="sub">JSON: <a href="status.json">status.json</a> \u00b7 Prometheus: '
            '<a href="metrics">metrics</a></p><script src="status.js"></script></body></html>\n')


def render_unavailable(reason: str) -> str:
    """The page while the member is not built yet (starting) -- the script keeps polling."""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>dledger status</title>"
            '<link rel="stylesheet" href="status.css"></head><body>'
            f'<div id="banner" class="banner stale">{escape(reason)}</div><div id="content"></div>'
            '<script src="status.js"></script></body></html>\n')
