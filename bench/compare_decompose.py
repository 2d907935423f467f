#!/usr/bin/env python3
"""Where each method's device time goes against the length-aware bound, from `sluice compare`
results files (docs/benchmarks.md, issue 16).

For every run of every results.json given: tokens/s, the ratio to a reference method, fractions
of both bounds, micro-batches run at a smaller cp, and the device time split into
  useful                       (the fraction of the ideal bound),
  length-inherent kernel eff.  (what the length-aware bound itself spends beyond useful work:
                                 its fraction minus the useful share; no method recovers it),
  excess kernel eff.           (the rest of the kernel-efficiency share: shapes below the rate
                                 their sequences' lengths allow: cp/tp/pp splits, small pieces),
  padding, recompute, exposed comm, imbalance, bubble (as `sluice compare` splits them).
The parts after the first two are what a better plan could still win; 1 / (the length-aware
fraction) is the most any method could gain over this one.

Usage: bench/compare_decompose.py [--reference METHOD] RESULTS.json...
"""
import argparse
import json
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reference", default="megatron-gbp")
    ap.add_argument("results", nargs="+")
    args = ap.parse_args()
    cols = ["tok/s", f"/ {args.reference}", "of ideal", "of length-aware", "max gain",
            "cp splits", "useful", "length-inh.", "excess kernel", "padding", "recompute",
            "exposed comm", "imbalance", "bubble"]
    print("| scenario | method | " + " | ".join(cols) + " | configuration |")
    print("|---|---|" + "---:|" * len(cols) + "---|")
    for path in args.results:
        with open(path) as f:
            d = json.load(f)
        name = d["scenario"].get("name", path)
        runs = d["own"]
        ref = next((r for r in runs if r["method"] == args.reference and r["tokens_per_s"] > 0),
                   None)
        for r in runs:
            if r["state"] != "ok" or r["tokens_per_s"] <= 0:
                print(f"| {name} | {r['method']} | {r['state']}: {r.get('reason', '')[:60]} |")
                continue
            b = r["breakdown"]
            fla = r.get("fraction_of_length_aware", 0.0)
            inherent = max(0.0, fla - b["useful"])
            excess = b["kernel"] - inherent
            splits = sum(x.get("cp_splits", 0) for x in r["batches"])
            mbs = sum(x["micro_batches"] for x in r["batches"])
            ratio = r["tokens_per_s"] / ref["tokens_per_s"] if ref else 0.0
            cfg = r.get("config") or {}
            par = cfg.get("parallel", {})
            desc = (" x ".join(f"{k} {par[k]}" for k in ("dp", "pp", "tp", "cp", "vpp")
                               if par.get(k, 1) > 1 or k == "dp") +
                    f", {cfg.get('schedule', '')}, {cfg.get('batching', '')}"
                    + (", dynamic cp" if cfg.get("dynamic_cp") else "")) if par else ""
            vals = [f"{r['tokens_per_s']:,.0f}", f"{ratio:.2f}x", f"{r['fraction_of_ideal']:.2f}",
                    f"{fla:.2f}", f"{1 / fla:.2f}x" if fla > 0 else "-", f"{splits}/{mbs}"]
            vals += [f"{100 * v:.1f}%" for v in (b["useful"], inherent, excess, b["padding"],
                                                 b["recompute"], b["comm"], b["imbalance"],
                                                 b["bubble"])]
            print(f"| {name} | {r['method']} | " + " | ".join(vals) + f" | {desc} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
