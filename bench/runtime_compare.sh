#!/usr/bin/env bash
# runtime_compare.sh: the packing plan against sluice's dynamic plans (DynaPipe's micro-batching
# with the adaptive and the 1F1B schedule), trained for real on NPROC local CPU processes
# (pp = NPROC) and predicted by the simulator from this machine's own cost table, side by side
# (issue #7).
#
#   1. `sluice profile` measures the runtime's layers on this machine (1 thread per rank when
#      NPROC ranks share the cores) unless TABLE names an existing table;
#   2. `sluice plan` makes the plans of every run for the same global batches, priced with
#      that table (--cost profiled:TABLE) on a cluster spec of this machine (CLUSTER);
#   3. `sluice simulate` predicts each plan (iteration time, real tokens, per-rank peak memory);
#   4. `sluice train --plan ...` executes exactly those plans (--nproc NPROC, Gloo) and records
#      per-iteration time, real tokens, peak tensor bytes and peak resident memory (--metrics);
#   5. a table: real tokens/s measured and predicted per run, the ratios to the first run (the
#      baseline), peak tensor memory measured and predicted, peak resident memory.
# Iterations every run planned are compared; the first of them is warm-up (not counted).
#
# Usage, from the repository root, knobs as environment variables (defaults below):
#   SLUICE=build/sluice TABLE=cpu-table.json ITERS=16 bench/runtime_compare.sh
# TABLE: a layer-cost-table/1 file from `sluice profile` measured on this machine (with
# --threads cores/NPROC); unset, the script measures one first (about 5 minutes). The figures in
# docs/benchmarks.md were taken with a Release build (SLUICE=build-prof-rel/sluice).
set -euo pipefail

SLUICE=${SLUICE:-build/sluice}
OUT=${OUT:-/tmp/sluice-runtime-compare}
MODEL=${MODEL:-gpt-tiny}
NPROC=${NPROC:-2}
DATA=${DATA:-mixture-4task}
SAMPLES=${SAMPLES:-4000}
TOKENS=${TOKENS:-4096}
MAXLEN=${MAXLEN:-512}
ITERS=${ITERS:-6}
CLUSTER=${CLUSTER:-examples/cluster-cpu-2.json}
TABLE=${TABLE:-}
# method:schedule pairs; the first is the baseline the others are compared with.
RUNS=(${RUNS:-packing:1f1b dynapipe:adaptive dynapipe:1f1b})
REPEATS=${REPEATS:-3}
PORT=${PORT:-29710}
PY=${PY:-/usr/bin/python3}
CORES=$(nproc)
THREADS=$(( CORES / NPROC > 0 ? CORES / NPROC : 1 ))

if [[ ! -x "$SLUICE" ]]; then
  echo "runtime_compare: SLUICE=$SLUICE is not an executable; build sluice with libtorch" \
    "(scripts/setup.sh, cmake --build build --target sluice) or set SLUICE to its path" >&2
  exit 2
fi
if [[ -n "$TABLE" && ! -f "$TABLE" ]]; then
  echo "runtime_compare: TABLE=$TABLE: no such file; give a table from \`sluice profile --out" \
    "FILE\` measured on this machine, or leave TABLE unset to measure one first" >&2
  exit 2
fi
mkdir -p "$OUT"
echo "runtime_compare: $(date -u '+%F %T UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg)," \
  "$NPROC ranks x $THREADS thread(s), $MODEL, $DATA, $TOKENS tokens per batch"
if [[ -z "$TABLE" ]]; then
  TABLE="$OUT/table-$MODEL.json"
  echo "== profiling $MODEL on this machine ($THREADS intra-op thread(s), as each of $NPROC ranks)"
  "$SLUICE" profile --model "$MODEL" --threads "$THREADS" \
    --mbs 1,2,4,8,16,32,64,128 --seqlen 32,64,128,256,512 --recompute none,selective,full \
    --repeats 5 --warmup 2 --max-activation-mb 1200 --out "$TABLE"
fi

COMMON=(--model "$MODEL" --cluster "$CLUSTER" --parallel "pp=$NPROC" --data "$DATA"
        --samples "$SAMPLES" --tokens-per-batch "$TOKENS" --max-seqlen "$MAXLEN"
        --iterations "$ITERS" --cost "profiled:$TABLE" --seed 0)
for run in "${RUNS[@]}"; do
  method=${run%%:*} schedule=${run#*:}
  dir="$OUT/$method-$schedule"
  rm -rf "$dir" && mkdir -p "$dir"
  echo "== $method / $schedule: plan"
  "$SLUICE" plan "${COMMON[@]}" --method "$method" --schedule "$schedule" --show 0 \
    --out "$dir/plan.json" > "$dir/plan.log" 2>&1 || {
      echo "runtime_compare: planning $method / $schedule failed ($dir/plan.log):" >&2
      tail -5 "$dir/plan.log" >&2; exit 1; }
done

# Batches every run planned (a batch one of them could not fit is left out of all).
common_batches=""
names=()
for run in "${RUNS[@]}"; do
  name="${run%%:*}-${run#*:}"
  names+=("$name")
  batches=$(ls "$OUT/$name" | sed -n 's/^plan-\([0-9]*\)\.json$/\1/p' | sort)
  if [[ -z "$common_batches" && "$name" == "${names[0]}" ]]; then
    common_batches="$batches"
  else
    common_batches=$(comm -12 <(echo "$common_batches") <(echo "$batches"))
  fi
done
common_batches=$(echo "$common_batches" | sort -n | tr '\n' ' ')
if [[ -z "${common_batches// /}" ]]; then
  echo "runtime_compare: no global batch was planned by every run (see $OUT/*/plan.log)" >&2
  exit 1
fi

for run in "${RUNS[@]}"; do
  dir="$OUT/${run%%:*}-${run#*:}"
  for b in $common_batches; do
    "$SLUICE" simulate "$dir/plan-$b.json" --data "$DATA" --samples "$SAMPLES" --seed 0 \
      --json "$dir/sim-$b.json" > "$dir/sim-$b.log" 2>&1 || {
        echo "runtime_compare: simulating $dir/plan-$b.json failed ($dir/sim-$b.log):" >&2
        tail -5 "$dir/sim-$b.log" >&2; exit 1; }
  done
done
# Round-robin over the runs, REPEATS times, so that a noisy stretch of the machine does not fall
# on one method only; the table reports the median over the repeats.
for ((rep = 1; rep <= REPEATS; rep++)); do
  for run in "${RUNS[@]}"; do
    method=${run%%:*} schedule=${run#*:}
    dir="$OUT/$method-$schedule"
    plans=()
    for b in $common_batches; do plans+=("$dir/plan-$b.json"); done
    echo "== $method / $schedule: train ${#plans[@]} iterations on $NPROC processes" \
      "(repeat $rep of $REPEATS)"
    MASTER_PORT=$PORT "$SLUICE" train "${COMMON[@]}" --method "$method" --schedule "$schedule" \
      --nproc "$NPROC" --threads "$THREADS" --plan "${plans[@]}" \
      --metrics "$dir/metrics-$rep.jsonl" > "$dir/train-$rep.log" 2>&1 || {
        echo "runtime_compare: training failed, see $dir/train-$rep.log" >&2; exit 1; }
    PORT=$((PORT + 1))
  done
done

echo "load average after training: $(cut -d' ' -f1-3 /proc/loadavg)"
"$PY" - "$OUT" "$REPEATS" "${#names[@]}" "${names[@]}" $common_batches <<'EOF'
import json, statistics, sys
out, repeats, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
runs, batches = sys.argv[4:4 + n], sys.argv[4 + n:]
rows = {}
for run in runs:
    d = f"{out}/{run}"
    sims = [json.load(open(f"{d}/sim-{b}.json")) for b in batches]
    # The first iteration is warm-up for both the measurement and the prediction.
    s = sims[1:]
    pred_t = sum(x["iteration_time_ns"] for x in s) * 1e-9
    pred_tok = sum(x["real_tokens"] for x in s)
    meas, rss, tens = [], [], []
    for rep in range(1, repeats + 1):
        metrics = [json.loads(l) for l in open(f"{d}/metrics-{rep}.jsonl") if l.strip()]
        assert len(metrics) == len(sims), (run, rep, len(metrics), len(sims))
        m = metrics[1:]
        meas.append(sum(x["tokens"] for x in m) / sum(x["time_s"] for x in m))
        rss.append(max(x["peak_rss_bytes"] for x in metrics) / 1e6)
        tens.append(max(x.get("peak_tensor_bytes", -1) for x in metrics) / 1e6)
        mbs = sum(x["micro_batches"] for x in m) / len(m)
    rows[run] = dict(iters=len(s), mbs=mbs, meas=statistics.median(meas), lo=min(meas),
                     hi=max(meas), pred=pred_tok / pred_t, rss=max(rss), tens=max(tens),
                     pmem=max(r["peak_memory_bytes"] for x in sims for r in x["ranks"]) / 1e6)
print()
print(f"{'plan':<18} {'iters':>5} {'mb/iter':>7} {'measured tok/s (min-max)':>25}"
      f" {'predicted tok/s':>15} {'pred/meas':>9} {'peak tensors MB':>15} {'pred. peak MB':>13}"
      f" {'peak RSS MB':>11}")
for run, r in rows.items():
    measured = f"{r['meas']:.0f} ({r['lo']:.0f}-{r['hi']:.0f})"
    print(f"{run:<18} {r['iters']:>5} {r['mbs']:>7.1f} {measured:>25} {r['pred']:>15.0f}"
          f" {r['pred'] / r['meas']:>9.2f} {r['tens']:>15.1f} {r['pmem']:>13.1f} {r['rss']:>11.0f}")
print(f"(measured: median over {repeats} repeats of real tokens / training time)")
print()
base = rows[runs[0]]
for run in runs[1:]:
    r = rows[run]
    print(f"{run} / {runs[0]}: measured {r['meas'] / base['meas']:.3f}x, "
          f"predicted {r['pred'] / base['pred']:.3f}x")
print("peak tensors: the most CPU tensor bytes any rank held at once (parameters, gradients, "
      "AdamW states, activations, transfer buffers); predicted: the simulator's per-rank peak "
      "(model states + activations + buffers); peak RSS: the largest resident set of any rank "
      "(libtorch and the process included)")
EOF
