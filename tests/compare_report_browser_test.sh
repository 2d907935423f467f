#!/usr/bin/env bash
# Renders `sluice compare`'s HTML report for two small comparisons and checks, in headless
# Chromium at a 1,400 px wide window, what a reader sees (item 7 of the "honest numbers" issue):
#   - nothing overflows horizontally: the page, and every table (the configuration column used
#     to hide behind a scrollbar);
#   - the header's facts (model, cluster, cost, data, lost, ...) are separate rows, not run
#     together;
#   - a bar whose method failed batches is marked partial and its label says "k/n batches ran",
#     with the label inside the chart;
#   - the timeline legend draws all-reduce, reduce-scatter and all-gather in distinct colours;
#   - screenshots of both pages are taken (kept in $KEEP_DIR when set, to look at).
# A layout probe (a <script> that measures the page and writes JSON into the DOM) is appended to
# a copy of each report; the reports themselves stay script-free.
#
#   tests/compare_report_browser_test.sh PATH/TO/sluice [PYTHON]
#
# Needs Chromium (scripts/setup.sh; or set CHROMIUM=/path/to/it). Without it the test fails.
set -u
sluice="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
python="${2:-python3}"
here="$(cd "$(dirname "$0")" && pwd)"

source "$here/browser_lib.sh"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
keep="${KEEP_DIR:-$tmp}"
mkdir -p "$keep"

# A: the shipped small scenario with every default method (the widest tables), 2 batches.
if ! "$sluice" compare --scenario "$here/../examples/compare-small.json" --iterations 2 \
    --methods packing,token-budget,multipack,dynapipe,hydraulis,sluice --closed-form \
    --out "$tmp/a" >"$tmp/a.log" 2>&1; then
  echo "FAIL: sluice compare (A) failed:"; tail -20 "$tmp/a.log"; exit 1
fi
# B: examples/compare-failing-batches.json, web text clipped at 8192 tokens on 30 GB, scored on
# the first two batches only: multipack's choice (ZeRO-2: reduce-scatter and all-gather in its
# timeline) fails the batches with an 8K sample, so its bar covers only some of the 20 batches.
cp "$here/../examples/compare-failing-batches.json" "$tmp/failing.json"
if ! "$sluice" compare --scenario "$tmp/failing.json" --out "$tmp/b" >"$tmp/b.log" 2>&1; then
  echo "FAIL: sluice compare (B) failed:"; tail -20 "$tmp/b.log"; exit 1
fi

probe='<script>
(function () {
  const rect = (e) => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  const root = document.documentElement;
  const out = {client: root.clientWidth, scroll: root.scrollWidth, tables: [], facts: [], bars: [], legend: []};
  for (const w of document.querySelectorAll(".table-wrap")) {
    out.tables.push({id: w.querySelector("table").id, scroll: w.scrollWidth, client: w.clientWidth});
  }
  for (const dt of document.querySelectorAll(".facts dt")) {
    out.facts.push({label: dt.textContent, dt: rect(dt), dd: rect(dt.nextElementSibling),
                    text: dt.nextElementSibling.textContent});
  }
  for (const g of document.querySelectorAll(".sluice-bar-chart g.bar")) {
    const note = g.querySelector(".bar-note");
    const svg = g.ownerSVGElement;
    const bb = note ? note.getBBox() : null;
    out.bars.push({cls: g.getAttribute("class"), label: g.querySelector(".bar-label").textContent,
                   note: note ? note.textContent : "", note_right: bb ? bb.x + bb.width : 0,
                   width: svg.viewBox.baseVal.width});
  }
  for (const g of document.querySelectorAll(".sluice-timeline .legend > g")) {
    const swatch = g.querySelector("rect");
    out.legend.push({text: g.querySelector("text").textContent,
                     fill: swatch ? swatch.getAttribute("fill") : ""});
  }
  const pre = document.createElement("pre");
  pre.id = "layout-probe";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>'

for page in a b; do
  PROBE="$probe" "$python" -c '
import os, sys
page = open(sys.argv[1], encoding="utf-8").read()
open(sys.argv[2], "w", encoding="utf-8").write(page.replace("</body>", os.environ["PROBE"] + "</body>"))
' "$tmp/$page/report.html" "$tmp/$page-probe.html"
  for mode in dom shot; do
    if [ "$mode" = dom ]; then
      args=(--window-size=1400,1000 --dump-dom "file://$tmp/$page-probe.html")
      out="$tmp/$page-dom.html"
    else
      args=(--window-size=1400,2600 --hide-scrollbars --screenshot="$keep/compare-$page-1400.png"
            "file://$tmp/$page/report.html")
      out=/dev/null
    fi
    if ! timeout 60 "$chromium" --headless --no-sandbox --disable-gpu --no-first-run \
        --disable-extensions --user-data-dir="$tmp/profile-$page-$mode" "${args[@]}" \
        >"$out" 2>"$tmp/chromium-$page-$mode.log"; then
      echo "FAIL: $chromium could not load $page ($mode); its log:"
      tail -20 "$tmp/chromium-$page-$mode.log"
      exit 1
    fi
  done
done

"$python" - "$tmp/a-dom.html" "$tmp/b-dom.html" "$keep" <<'EOF'
import html, json, os, re, sys

failures = []

def check(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else ": " + detail))
    if not ok:
        failures.append(name)

def probe(path):
    text = open(path, encoding="utf-8").read()
    m = re.search(r'<pre id="layout-probe">(.*?)</pre>', text, re.S)
    if not m:
        check(f"{os.path.basename(path)}: the layout probe ran", False, "no probe output")
        return None
    return json.loads(html.unescape(m.group(1)))

for name, path in [("A", sys.argv[1]), ("B", sys.argv[2])]:
    p = probe(path)
    if p is None:
        continue
    check(f"{name}: a 1,400 px window", 1350 <= p["client"] <= 1400, str(p["client"]))
    check(f"{name}: the page does not scroll sideways", p["scroll"] <= p["client"],
          f'{p["scroll"]} > {p["client"]}')
    wide = [t for t in p["tables"] if t["scroll"] > t["client"] + 1]
    check(f"{name}: no table overflows (every column visible)", p["tables"] and not wide,
          json.dumps(wide))
    labels = [f["label"] for f in p["facts"]]
    check(f"{name}: the header has its facts", all(
        k in labels for k in ("model", "cluster", "cost", "data", "lost", "search")), str(labels))
    rows_apart = all(a["dd"][3] <= b["dd"][1] + 0.5 for a, b in zip(p["facts"], p["facts"][1:]))
    beside = all(f["dd"][0] >= f["dt"][2] and abs(f["dd"][1] - f["dt"][1]) < 4 for f in p["facts"])
    check(f"{name}: each fact is its own row, its value beside its label", rows_apart and beside,
          json.dumps(p["facts"])[:400])
    clipped = [b for b in p["bars"] if b["note"] and b["note_right"] > b["width"] + 0.5]
    check(f"{name}: bar labels lie inside the chart", p["bars"] and not clipped, json.dumps(clipped))
    if name == "B":
        partial = [b for b in p["bars"] if "partial" in b["cls"].split()]
        check("B: the bar of a run that failed batches is partial and says k/n",
              len(partial) == 1 and partial[0]["label"] == "multipack" and
              re.search(r"\b\d+/20 batches ran\b", partial[0]["note"]), json.dumps(p["bars"]))
        whole = [b for b in p["bars"] if b["label"] == "both"]
        check("B: a complete run's bar is not marked", whole and "partial" not in whole[0]["cls"]
              and "batches ran" not in whole[0]["note"], json.dumps(whole))
        colours = {}
        for item in p["legend"]:
            colours.setdefault(item["text"], set()).add(item["fill"])
        want = ["reduce-scatter", "all-gather"]
        check("B: the timelines show reduce-scatter and all-gather", all(w in colours for w in want),
              str(sorted(colours)))
        if all(w in colours for w in want):
            fills = {k: v for k, v in colours.items() if k in want + ["all-reduce"]}
            distinct = all(len(v) == 1 for v in fills.values()) and \
                len(set().union(*fills.values())) == len(fills)
            check("B: all-reduce, reduce-scatter and all-gather have distinct colours", distinct,
                  str(fills))
for page in ("a", "b"):
    shot = os.path.join(sys.argv[3], f"compare-{page}-1400.png")
    check(f"screenshot {os.path.basename(shot)} taken", os.path.getsize(shot) > 10000
          if os.path.exists(shot) else False, shot)

print(f"{len(failures)} failed" if failures else "all checks passed")
sys.exit(1 if failures else 0)
EOF
