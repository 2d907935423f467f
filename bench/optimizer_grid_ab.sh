#!/bin/bash
# Copyright 2026 The sluice Authors. SPDX-License-Identifier: Apache-2.0
# Two sluice builds on the DynaPipe grid, side by side: each run puts A's and B's 16-GPU halves on
# the two cores at once, then their 8-GPU halves (cores swapped), and swaps the cores again on the
# next run; bench/optimizer_grid_pair.py summarizes each run.
# Usage: bench/optimizer_grid_ab.sh SLUICE_A SLUICE_B OUT_PREFIX RUNS
set -euo pipefail
A=$1 B=$2 P=$3 N=$4
here=$(cd "$(dirname "$0")" && pwd)
for i in $(seq 1 "$N"); do
  if (( i % 2 )); then ca=0 cb=1; else ca=1 cb=0; fi
  taskset -c $ca "$here/optimizer_scenarios.py" --sluice "$A" --budget-ms 50 --only 16gpu > "${P}A16_$i.md" &
  taskset -c $cb "$here/optimizer_scenarios.py" --sluice "$B" --budget-ms 50 --only 16gpu > "${P}B16_$i.md" &
  wait
  taskset -c $cb "$here/optimizer_scenarios.py" --sluice "$A" --budget-ms 50 --only 08gpu > "${P}A08_$i.md" &
  taskset -c $ca "$here/optimizer_scenarios.py" --sluice "$B" --budget-ms 50 --only 08gpu > "${P}B08_$i.md" &
  wait
  echo "run $i:"
  /usr/bin/python3 "$here/optimizer_grid_pair.py" "${P}A16_$i.md,${P}A08_$i.md" "${P}B16_$i.md,${P}B08_$i.md"
done
