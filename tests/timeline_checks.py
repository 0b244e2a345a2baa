"""Checks of the pictures an incident carries, shared by the CPU and GPU tests: the Chrome trace
(timeline.json) by the Trace Event Format's rules, and report.html as a page that needs no
network, its SVG's lanes and highlighted ops."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

PHASES = {"X", "M", "s", "f"}


def check_chrome_trace(doc: dict[str, Any], findings: list[dict[str, Any]]) -> dict[str, Any]:
    """The document's events obey the format (what ui.perfetto.dev and chrome://tracing need)
    and mark each finding's racing pair; returns what a test may look at further."""
    events = doc["traceEvents"]
    assert isinstance(events, list) and events
    names: dict[int, str] = {}
    slices: dict[int, list[dict[str, Any]]] = {}
    for e in events:
        assert e["ph"] in PHASES, e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name", "thread_sort_index"), e
            if e["name"] == "thread_name":
                names[e["tid"]] = e["args"]["name"]
        elif e["ph"] == "X":
            assert isinstance(e["name"], str) and e["name"]
            assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0, e
            assert isinstance(e["dur"], (int, float)) and e["dur"] > 0, e
            assert isinstance(e["args"]["seq"], int), e
            slices.setdefault(e["tid"], []).append(e)
    assert set(slices) <= set(names), "every slice's track is named"
    flows: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
    for e in events:
        if e["ph"] in ("s", "f"):
            assert e["cat"] in ("event", "race"), e
            pair = flows.setdefault((e["cat"], e["id"]), {})
            assert e["ph"] not in pair, f"a flow's {e['ph']} twice: {e}"
            pair[e["ph"]] = e
            # bound to a slice of its track that encloses its time
            assert any(x["ts"] <= e["ts"] <= x["ts"] + x["dur"] for x in slices[e["tid"]]), e
    assert all(set(pair) == {"s", "f"} for pair in flows.values()), "flows pair up"
    by_seq = {x["args"]["seq"]: x for xs in slices.values() for x in xs}
    for f in findings:
        for side in ("first", "second"):
            marked = by_seq[f[side]["seq"]]
            assert marked["cat"] == "race" and marked["cname"] == "terrible", marked
    races = [pair for (cat, _), pair in flows.items() if cat == "race"]
    assert len(races) == len(findings)
    return {"tracks": names, "slices": by_seq, "flows": flows}


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def check_report_html(folder: Path) -> dict[str, Any]:
    """report.html parses as HTML, fetches nothing (no script, no external resource), and its
    SVG (well-formed XML) has a lane for the host and each stream of the last ops, and marks
    exactly the findings' ops; returns the lanes and the marked seqs."""
    text = (folder / "report.html").read_text()
    report = json.loads((folder / "report.json").read_text())
    page = _Page()
    page.feed(text)
    page.close()
    tags = [tag for tag, _ in page.tags]
    assert "script" not in tags and "link" not in tags and "img" not in tags
    for tag, attrs in page.tags:
        for key in ("src", "href"):
            value = attrs.get(key) or ""
            assert not value.startswith(("http:", "https:", "//")), (tag, attrs)
    svg_text = text[text.index("<svg"):text.index("</svg>") + len("</svg>")]
    svg = ET.fromstring(svg_text)
    ns = "{http://www.w3.org/2000/svg}"
    lanes = [g.get("data-lane") for g in svg.iter(f"{ns}g") if g.get("class") == "lane"]
    shown_ops = report["last_ops"][-60:]
    streams = {op["stream"] for op in shown_ops if op["stream"] != "host"}
    threads = {f"host · {op['detail']['thread']}" for op in shown_ops
               if op["stream"] == "host" and (op.get("detail") or {}).get("thread")}
    assert lanes[0] == "host" and set(lanes) == {"host"} | threads | streams, (lanes, streams)
    marked = {int(g.get("data-seq")) for g in svg.iter(f"{ns}g") if g.get("class") == "op race"}
    shown = {op["seq"] for op in report["last_ops"][-60:]}
    want = {f[side]["seq"] for f in report.get("findings") or [] for side in ("first", "second")}
    assert marked == want & shown, (marked, want)
    return {"lanes": lanes, "marked": marked}
