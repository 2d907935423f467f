#!/usr/bin/env bash
# Loads the example HTML report (every block type) in headless Chromium and checks the DOM the
# browser built from it: the charts by class, the table, the timeline's bars and rows, tooltips,
# axis ticks, and that text which looks like markup stayed text.
#
#   tests/html_report_browser_test.sh PATH/TO/report_example [PYTHON]
#
# Needs Chromium: `sudo apt-get install chromium` on Debian/Ubuntu (or set CHROMIUM=/path/to/it).
# Without it the test fails rather than skips, so that CI notices a missing browser.
set -u
example="$1"
python="${2:-python3}"

source "$(dirname "$0")/browser_lib.sh"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

counts="$("$example" "$tmp/report.html")" || { echo "FAIL: $example exited with $?"; exit 1; }
echo "example: $counts"

# A private profile keeps parallel runs apart; --dump-dom prints the DOM after parsing.
if ! timeout 60 "$chromium" --headless --no-sandbox --disable-gpu --no-first-run \
    --disable-extensions --user-data-dir="$tmp/profile" --dump-dom "file://$tmp/report.html" \
    >"$tmp/dom.html" 2>"$tmp/chromium.log"; then
  echo "FAIL: $chromium could not load the report; its log:"
  tail -20 "$tmp/chromium.log"
  exit 1
fi

"$python" - "$tmp/dom.html" "$counts" <<'EOF'
import sys
from html.parser import HTMLParser

dom_path, counts_line = sys.argv[1], sys.argv[2]
want = dict(kv.split("=") for kv in counts_line.split())
failures = []

def check(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else ": " + detail))
    if not ok:
        failures.append(name)

class Dom(HTMLParser):
    """Element tree as (tag, attrs, children, text) tuples; enough to count and inspect."""
    VOID = {"meta", "link", "br", "img", "input", "hr", "col", "source", "wbr", "area", "base"}
    def __init__(self):
        super().__init__()
        self.root = {"tag": "#root", "attrs": {}, "children": [], "text": "", "parent": None}
        self.cur = self.root
    def handle_starttag(self, tag, attrs):
        node = {"tag": tag, "attrs": dict(attrs), "children": [], "text": "", "parent": self.cur}
        self.cur["children"].append(node)
        if tag not in self.VOID:
            self.cur = node
    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in self.VOID:
            self.cur = self.cur["parent"]
    def handle_endtag(self, tag):
        node = self.cur
        while node is not None and node["tag"] != tag:
            node = node["parent"]
        if node is not None:
            self.cur = node["parent"]
    def handle_data(self, data):
        self.cur["text"] += data

def walk(node):
    yield node
    for c in node["children"]:
        yield from walk(c)

def classes(node):
    return node["attrs"].get("class", "").split()

def text(node):
    return node["text"] + "".join(text(c) for c in node["children"])

dom = Dom()
dom.feed(open(dom_path, encoding="utf-8").read())
nodes = list(walk(dom.root))
check("page parsed", len(nodes) > 100, f"{len(nodes)} elements")

svgs = [n for n in nodes if n["tag"] == "svg"]
for kind, key in [("sluice-timeline", "timelines"), ("sluice-line-chart", "line_charts"),
                  ("sluice-bar-chart", "bar_charts"), ("sluice-distribution", "distributions")]:
    found = [s for s in svgs if kind in classes(s)]
    check(f"svg.{kind} count", len(found) == int(want[key]), f"{len(found)} != {want[key]}")
for s in svgs:
    first = s["children"][0]["tag"] if s["children"] else None
    check(f"svg#{s['attrs'].get('id')} has an id and a <title> first",
          bool(s["attrs"].get("id")) and first == "title", f"first child {first}")
ids = [n["attrs"]["id"] for n in nodes if "id" in n["attrs"]]
check("ids are unique", len(ids) == len(set(ids)), str(sorted(ids)))

tables = [n for n in nodes if n["tag"] == "table" and "sluice-table" in classes(n)]
check("table count", len(tables) == int(want["tables"]), f"{len(tables)} != {want['tables']}")
if tables:
    heads = [n for n in walk(tables[0]) if n["tag"] == "th"]
    cells = [n for n in walk(tables[0]) if n["tag"] == "td"]
    check("table has header cells and body cells", len(heads) > 0 and len(cells) > 0)
    check("numeric columns are right-aligned",
          any("num" in classes(c) for c in cells) and any("num" not in classes(c) for c in cells))

bar_groups = [n for n in nodes if n["tag"] == "g" and "tl-bars" in classes(n)]
bars = [c for g in bar_groups for c in g["children"] if c["tag"] == "rect"]
check("timeline bar count", len(bars) == int(want["bars"]), f"{len(bars)} != {want['bars']}")
check("every bar has a tooltip",
      all(b["children"] and b["children"][0]["tag"] == "title" and text(b).strip() for b in bars))
check("bar groups have a fill", all(g["attrs"].get("fill", "").startswith("#") for g in bar_groups))
rows = [n for n in nodes if n["tag"] == "g" and "tl-row" in classes(n)]
check("timeline row count", len(rows) == int(want["rows"]), f"{len(rows)} != {want['rows']}")
labels = [text(n) for n in nodes if n["tag"] == "g" and "tl-bar-labels" in classes(n)]
check("labels drawn inside bars", any("F0" in l or "B0" in l for l in labels))

legends = [text(n) for n in nodes if n["tag"] == "g" and "legend" in classes(n)]
check("timeline legend names the categories",
      any("forward" in l and "backward" in l and "all-reduce" in l for l in legends))
axes = [n for n in nodes if n["tag"] == "g" and "x-axis" in classes(n)]
check("x axes have tick labels",
      axes and all(len([t for t in walk(a) if t["tag"] == "text"]) >= 3 for a in axes))
y_axes = [n for n in nodes if n["tag"] == "g" and "y-axis" in classes(n)]
check("y axes have tick labels",
      y_axes and all(len([t for t in walk(a) if t["tag"] == "text"]) >= 3 for a in y_axes))

series = [n for n in nodes if n["tag"] == "g" and "series" in classes(n)]
check("line series drawn as paths", series and all(
    any(c["tag"] in ("path", "g") for c in s["children"]) for s in series))
check("limit line drawn", any("limit" in classes(n) for n in nodes if n["tag"] == "g"))
missing = [n for n in nodes if n["tag"] == "g" and "missing" in classes(n)]
check("missing bar drawn hatched and labelled", missing and any(
    r["attrs"].get("fill", "").startswith("url(#") for m in missing for r in m["children"]))
boxes = [n for n in nodes if n["tag"] == "g" and "box" in classes(n)]
check("one box per distribution group", len(boxes) >= 2, f"{len(boxes)} boxes")

check("markup-like text stayed text",
      not any(n["tag"] == "script" for n in nodes) and
      any("<script>alert" in n["text"] for n in nodes if n["tag"] == "p"))
check("nothing loaded from the network",
      not any(n["tag"] in ("link", "img", "iframe") for n in nodes) and
      not any(a.startswith("http") for n in nodes for k, a in n["attrs"].items()
              if k in ("src", "href") and a))

print(f"{len(failures)} failed" if failures else "all checks passed")
sys.exit(1 if failures else 0)
EOF
