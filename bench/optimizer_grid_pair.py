#!/usr/bin/env python3
# Copyright 2026 The sluice Authors. SPDX-License-Identifier: Apache-2.0
"""Summaries of bench/optimizer_scenarios.py tables: one run (A) or two side by side (A and B).

Usage: bench/optimizer_grid_pair.py A16.md,A08.md [B16.md,B08.md]

Prints, per run, the median gain over the rows, the rows at >= 5%, the slowest batch and the
batches past 50 ms; with two runs, the rows where B is shorter or longer than A and the mean gain
of each. Rows without a figure (no planned batch) are left out and counted.
"""
import re
import statistics
import sys


def rows(paths):
    gains, slowest, missing, oom = {}, {}, 0, [0, 0]
    for path in paths.split(","):
        for line in open(path):
            m = re.search(r"(\d+) of (\d+) global batches out of memory", line)
            if m:
                oom[0] += int(m.group(1))
                oom[1] += int(m.group(2))
            if not (line.startswith("| gpt") or line.startswith("| t5")):
                continue
            c = [x.strip() for x in line.split("|")]
            if c[7] == "-":
                missing += 1
                continue
            gains[(c[1], c[2])] = float(c[7].rstrip("%"))
            slowest[(c[1], c[2])] = float(re.search(r"\(([\d.]+)\)", c[9]).group(1))
    return gains, slowest, missing, oom


def summary(name, gains, slowest, missing, oom):
    over = sum(s > 50 for s in slowest.values())
    print(f"{name}: {len(gains)} rows ({missing} without a figure), median gain "
          f"{statistics.median(gains.values()):.2f}%, {sum(g >= 5 for g in gains.values())} rows "
          f">= 5%, mean gain {statistics.mean(gains.values()):.3f}%, slowest batch "
          f"{max(slowest.values()):.1f} ms, {over} rows with a batch past 50 ms, {oom[0]} of {oom[1]} "
          f"global batches out of memory (not planned, not optimized)")


a = rows(sys.argv[1])
summary("A", *a)
if len(sys.argv) > 2:
    b = rows(sys.argv[2])
    summary("B", *b)
    keys = sorted(set(a[0]) & set(b[0]))
    print(f"B against A on {len(keys)} rows: {sum(b[0][k] > a[0][k] for k in keys)} shorter, "
          f"{sum(b[0][k] < a[0][k] for k in keys)} longer")
