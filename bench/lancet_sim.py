#!/usr/bin/python3
"""Lancet's settings in the simulator: exposed all-to-all and iteration time of MoE plans under
the MoE overlap rewrites (passes/moe_overlap.h, issue #18).

For each setting it writes the model (GPT-2-style MoE, an MoE layer every 2nd layer), plans one
global batch of fixed 512-token samples with `sluice plan` (padding, recompute none, analytic cost
model on the a100-80g preset: p4de nodes of 8 A100-80GB, NVLink 300 GB/s, 6.25 GB/s EFA per GPU),
and runs `sluice simulate PLAN --moe-overlap all`, which simulates the plan rewritten by each of
none, tutel, megatron, dw, partition, lancet and lancet-megatron. Each setting runs twice: one micro-batch per GPU
(Lancet's batch) and two half micro-batches (planned under a 20 GB limit to get two; simulated
at the device's 80 GB), which Megatron's B/F interleaving needs.

Usage, from the repository root:  /usr/bin/python3 bench/lancet_sim.py [--sluice build/sluice]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

SETTINGS = [
    # name, layers, hidden, ffn, experts, top_k, gpus, batch per GPU
    ("gpt2-moe 12L/768 top-1", 12, 768, 3072, 8, 1, 8, 48),
    ("gpt2-moe 12L/768 top-1", 12, 768, 3072, 16, 1, 16, 48),
    ("gpt2-moe 24L/1024 top-1", 24, 1024, 4096, 8, 1, 8, 24),
    ("gpt2-moe 24L/1024 top-1", 24, 1024, 4096, 16, 1, 16, 24),
    ("large 24L/1024 64e top-2", 24, 1024, 4096, 64, 2, 32, 24),
]
OVERLAPS = ["none", "tutel", "megatron", "dw", "partition", "lancet", "lancet-megatron"]
ROW = re.compile(r"^(none|tutel|megatron|dw|partition|lancet-megatron|lancet)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)"
                 r"\s+([\d.]+)x\s+([\d.]+)%\s*(.*)$")


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout}\n{p.stderr}")
    return p.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sluice", default="build/sluice")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="sluice-lancet-")
    lengths = os.path.join(work, "len512.txt")
    with open(lengths, "w") as f:
        f.write("512\n" * 4096)
    results = []
    for name, layers, hidden, ffn, experts, top_k, gpus, batch in SETTINGS:
        model = {"name": "gpt2-moe", "kind": "decoder-only", "layers": layers, "hidden": hidden,
                 "heads": 16, "ffn_hidden": ffn, "vocab": 50257, "max_position": 1024,
                 "mlp": "gelu", "tied_embeddings": True,
                 "moe": {"experts": experts, "top_k": top_k, "capacity_factor": 1.25,
                         "layer_interval": 2}}
        model_file = os.path.join(work, f"model-{layers}-{experts}.json")
        with open(model_file, "w") as f:
            json.dump(model, f)
        for micro in (1, 2):
            plan = os.path.join(work, f"plan-{layers}-{experts}-{gpus}-{micro}.json")
            cmd = [args.sluice, "plan", "--model", model_file, "--cluster", f"a100-80g:{gpus}",
                   "--parallel", f"dp={gpus},ep={gpus}", "--data", lengths,
                   "--tokens-per-batch", str(batch * 512 * gpus), "--max-seqlen", "512",
                   "--method", "padding", "--recompute", "none", "--cost", "analytic",
                   "--iterations", "1", "--show", "1", "--out", plan]
            if micro == 2:
                cmd += ["--memory-limit", "20000" if layers == 12 else "16000"]
            out = run(cmd)
            got = len(re.findall(r"^\s+mb\s+\d+:", out.split("replica 1")[0], re.M))
            sim = run([args.sluice, "simulate", plan, "--memory-limit", "80000",
                       "--moe-overlap", "all"])
            rows = {}
            for line in sim.splitlines():
                m = ROW.match(line.strip())
                if m:
                    rows[m.group(1)] = {"iter_ms": float(m.group(2)), "a2a_ms": float(m.group(3)),
                                        "exposed_ms": float(m.group(4)),
                                        "speedup": float(m.group(5)),
                                        "exposed_pct": float(m.group(6)), "note": m.group(7)}
            if sorted(rows) != sorted(OVERLAPS):
                sys.exit(f"could not read the overlap table of {plan}:\n{sim}")
            results.append((f"{name}, {gpus} GPUs, {got} x {batch // got} seq/GPU", rows))
    print(f"{'setting':<48} {'overlap':<16} {'iter ms':>9} {'a2a ms':>8} {'exposed ms':>11} "
          f"{'exposed vs none':>16} {'speedup':>8}  note")
    for setting, rows in results:
        for o in OVERLAPS:
            r = rows[o]
            print(f"{setting:<48} {o:<16} {r['iter_ms']:>9.1f} {r['a2a_ms']:>8.1f} "
                  f"{r['exposed_ms']:>11.1f} {r['exposed_pct'] - 100:>+15.1f}% "
                  f"{r['speedup']:>7.3f}x  {r['note'][:60]}")
    # The goals of issue 18 for Lancet's passes, then for sluice's best rewrite: Lancet's passes
    # alone or composed with Megatron's B/F interleaving (lancet-megatron, pp = 1).
    met = {}
    for variant in ("lancet", "best of lancet, lancet-megatron"):
        print(f"\ngoals ({variant}: >= 77% less exposed all-to-all than none, >= 1.3x, ahead of "
              "tutel and megatron):")
        met[variant] = True
        for setting, rows in results:
            name = "lancet"
            if variant != "lancet" and rows["lancet-megatron"]["iter_ms"] < rows["lancet"]["iter_ms"]:
                name = "lancet-megatron"
            lan = rows[name]
            less = 100 - lan["exposed_pct"]
            ahead = all(lan["iter_ms"] < rows[o]["iter_ms"] for o in ("tutel", "megatron"))
            ok = less >= 77 and lan["speedup"] >= 1.3 and ahead
            met[variant] = met[variant] and ok
            print(f"  {setting:<48} {name:<15} {less:5.1f}% less exposed, {lan['speedup']:.3f}x, "
                  f"ahead of tutel/megatron: {'yes' if ahead else 'no'} -> "
                  f"{'met' if ok else 'NOT met'}")
    print(f"all goals met: lancet {'yes' if met['lancet'] else 'no'}, best of lancet and "
          f"lancet-megatron {'yes' if met['best of lancet, lancet-megatron'] else 'no'} "
          f"(work files in {work})")

if __name__ == "__main__":
    main()
