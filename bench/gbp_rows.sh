#!/usr/bin/env bash
# gbp_rows.sh: issue #16's rows against megatron-gbp (docs/benchmarks.md, 2026-11-25, sixth
# session). The Hydraulis-style 16K run, GPT 8 GPUs at 2K and the 64K run, each one `sluice
# compare` of 3 global batches with: packing, megatron-gbp (its fixed-cp packs and
# megatron-hybrid-cp, the faster kept), two ablations (megatron-gbp-fixed-cp: without hybrid cp;
# sluice-no-gbp: sluice's batchings before global+gbp and global+gbpc were added), sluice,
# sluice-hetero and sluice-dynamic; then bench/compare_decompose.py splits each run's device time
# against the length-aware bound.
#
# Usage, from the repository root (about 10 minutes of compares; each under the build lock):
#   bench/gbp_rows.sh
# Knobs (environment): SLUICE (default build/sluice), OUT (default /tmp/sluice-gbp-rows),
# LOCK (default /tmp/sluice-build.lock; empty: no lock).
set -euo pipefail

SLUICE=${SLUICE:-build/sluice}
OUT=${OUT:-/tmp/sluice-gbp-rows}
LOCK=${LOCK-/tmp/sluice-build.lock}
mkdir -p "$OUT"
/usr/bin/python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
methods = ["packing", "megatron-gbp",
           {"name": "megatron-gbp-fixed-cp", "batching": ["megatron-gbp"],
            "schedules": ["gpipe", "1f1b", "interleaved"]},
           {"name": "sluice-no-gbp", "batching": ["dynapipe", "hydraulis", "hydraulis+dynapipe",
                                                  "multipack", "token-budget", "packing"],
            "dynamic_cp": True},
           "sluice", "sluice-hetero", "sluice-dynamic"]
for src, name in [("bench/scenarios/hydraulis-llama7b-16gpu-len16k.json", "hyd16k"),
                  ("bench/scenarios/dynapipe-gpt-08gpu-len2048-tok065k.json", "gpt8"),
                  ("examples/compare-long-context-64k.json", "long64k")]:
    d = json.load(open(src))
    d["methods"] = methods
    d["reference"] = "megatron-gbp"
    d["iterations"] = 3
    if d["model"].endswith(".json") and not os.path.isabs(d["model"]):
        d["model"] = os.path.abspath(os.path.join(os.path.dirname(src), d["model"]))
    json.dump(d, open(os.path.join(out, name + ".json"), "w"), indent=1)
PY
run() { if [ -n "$LOCK" ]; then flock "$LOCK" "$@"; else "$@"; fi; }
for s in hyd16k gpt8 long64k; do
  cp=(--cp 1,2,4,8)
  [ "$s" = long64k ] && cp=()  # the scenario searches tp 2-8, cp 1-8 itself
  run "$SLUICE" compare --scenario "$OUT/$s.json" "${cp[@]}" --no-html --out "$OUT/$s" \
    > "$OUT/$s.log" 2>&1
  sed -n '/^Each method under/,/^$/p' "$OUT/$s.log"
done
/usr/bin/python3 bench/compare_decompose.py "$OUT"/hyd16k/results.json "$OUT"/gpt8/results.json \
  "$OUT"/long64k/results.json
