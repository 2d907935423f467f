#!/usr/bin/python3
"""The device order in `sluice compare`: every method's best configuration searched in both
orders (the default, `search.orders` = "both") against the order every plan used before
2026-12-02 (`"tp-cp-pp-dp"`: a replica's pipeline stages on neighbouring devices, the gradient
rings of a stage across nodes). docs/benchmarks.md, "Device order".

For each scenario of bench/scenarios/ whose name contains --only (default: the multi-node
DynaPipe rows, "16gpu"), runs `sluice compare --scenario` twice, the second time on a copy of
the scenario with "search": {"orders": "tp-cp-pp-dp"}, and prints one Markdown row per
(scenario, method): tokens/s (simulated, every batch of the run; a method that failed a batch
shows its k/n), the ratio, and both configurations. The compare figures are simulated and
deterministic; only the search's wall time depends on the machine.

Usage: bench/device_order.py [--sluice build/sluice] [--only 16gpu] [--methods M,...]
"""
import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile


def describe(own):
    c = own.get("config") or {}
    p = c.get("parallel") or {}
    if not p:
        return own.get("state", "-")
    text = f"dp {p['dp']} x pp {p['pp']} x tp {p['tp']}"
    if p.get("cp", 1) > 1:
        text += f" x cp {p['cp']}"
    if p.get("vpp", 1) > 1:
        text += f" x vpp {p['vpp']}"
    text += f", ZeRO-{p['zero']}"
    if "order" in p:
        text += f", order {p['order']}"
    return text + f", {c.get('schedule', '-')}, {c.get('batching', '-')}"


def run(sluice, scenario, out, methods):
    cmd = [sluice, "compare", "--scenario", scenario, "--no-html", "--out", out]
    if methods:
        cmd += ["--methods", methods]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr}")
    return json.load(open(os.path.join(out, "results.json")))


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--sluice", default="build/sluice")
    ap.add_argument("--only", default="16gpu")
    ap.add_argument("--methods", default="")
    a = ap.parse_args()
    print("| scenario | method | tokens/s, tp-cp-pp-dp only | tokens/s, both orders | ratio | "
          "configuration, tp-cp-pp-dp only | configuration, both orders |")
    print("|---|---|---:|---:|---:|---|---|")
    ratios = {}
    with tempfile.TemporaryDirectory() as tmp:
        for path in sorted(glob.glob(os.path.join(here, "scenarios", "*.json"))):
            sc = json.load(open(path))
            if a.only not in sc["name"]:
                continue
            old = dict(sc)
            old["search"] = dict(sc.get("search", {}), orders="tp-cp-pp-dp")
            old_path = os.path.join(tmp, sc["name"] + "-old.json")
            json.dump(old, open(old_path, "w"))
            before = run(a.sluice, old_path, os.path.join(tmp, "old"), a.methods)
            after = run(a.sluice, path, os.path.join(tmp, "both"), a.methods)
            for b, n in zip(before["own"], after["own"]):
                assert b["method"] == n["method"]
                total = len(n["batches"])

                def cell(o):
                    t = f"{o['tokens_per_s']:,.0f}" if o["state"] == "ok" else o["state"]
                    if o["state"] == "ok" and o["ok_batches"] != total:
                        t += f" ({o['ok_batches']}/{total} ran)"
                    return t

                ratio = ""
                if b["state"] == "ok" and n["state"] == "ok" and b["tokens_per_s"] > 0:
                    r = n["tokens_per_s"] / b["tokens_per_s"]
                    ratios.setdefault(n["method"], []).append(r)
                    ratio = f"{r:.3f}x"
                name = sc["name"].removeprefix("dynapipe-")
                print(f"| {name} | {n['method']} | {cell(b)} | {cell(n)} | {ratio} | "
                      f"{describe(b)} | {describe(n)} |")
            sys.stdout.flush()
    for method, rs in ratios.items():
        print(f"\n{method}: median {statistics.median(rs):.3f}x, min {min(rs):.3f}x, "
              f"max {max(rs):.3f}x over {len(rs)} rows", end="")
    print()


if __name__ == "__main__":
    main()
