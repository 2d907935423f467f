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
#      per-iteration time, real tokens and peak resident memory (--metrics);
#   5. a table: real tokens/s measured and predicted per run, the ratios to the first run (the
#      baseline), peak memory.
# Iterations every run planned are compared; the first of them is warm-up (not counted).
#
# Usage, from the repository root, knobs as environment variables (defaults below):
#   SLUICE=build-prof-rel/sluice TABLE=cpu-table.json ITERS=16 bench/runtime_compare.sh
set -euo pipefail

SLUICE=${SLUICE:-build-prof-rel/sluice}
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
PORT=${PORT:-29710}
PY=${PY:-/usr/bin/python3}
CORES=$(nproc)
THREADS=$(( CORES / NPROC > 0 ? CORES / NPROC : 1 ))

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
    --out "$dir/plan.json" > "$dir/plan.log" 2>&1
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
  method=${run%%:*} schedule=${run#*:}
  dir="$OUT/$method-$schedule"
  plans=()
  for b in $common_batches; do
    plans+=("$dir/plan-$b.json")
    "$SLUICE" simulate "$dir/plan-$b.json" --data "$DATA" --samples "$SAMPLES" --seed 0 \
      --json "$dir/sim-$b.json" > /dev/null
  done
  echo "== $method / $schedule: train ${#plans[@]} iterations on $NPROC processes"
  MASTER_PORT=$PORT "$SLUICE" train "${COMMON[@]}" --method "$method" --schedule "$schedule" \
    --nproc "$NPROC" --threads "$THREADS" --plan "${plans[@]}" \
    --metrics "$dir/metrics.jsonl" > "$dir/train.log" 2>&1 || {
      echo "runtime_compare: training failed, see $dir/train.log" >&2; exit 1; }
  PORT=$((PORT + 1))
done

echo "load average after training: $(cut -d' ' -f1-3 /proc/loadavg)"
"$PY" - "$OUT" "${#names[@]}" "${names[@]}" $common_batches <<'EOF'
import json, sys
out, n = sys.argv[1], int(sys.argv[2])
runs, batches = sys.argv[3:3 + n], sys.argv[3 + n:]
rows = {}
for run in runs:
    d = f"{out}/{run}"
    metrics = [json.loads(l) for l in open(f"{d}/metrics.jsonl") if l.strip()]
    sims = [json.load(open(f"{d}/sim-{b}.json")) for b in batches]
    assert len(metrics) == len(sims), (run, len(metrics), len(sims))
    # The first iteration is warm-up for both the measurement and the prediction.
    m, s = metrics[1:], sims[1:]
    meas_t = sum(x["time_s"] for x in m); meas_tok = sum(x["tokens"] for x in m)
    pred_t = sum(x["iteration_time_ns"] for x in s) * 1e-9; pred_tok = sum(x["real_tokens"] for x in s)
    rows[run] = dict(
        iters=len(m), mbs=sum(x["micro_batches"] for x in m) / len(m),
        meas=meas_tok / meas_t, pred=pred_tok / pred_t,
        rss=max(x["peak_rss_bytes"] for x in metrics) / 1e6,
        pmem=max(r["peak_memory_bytes"] for x in sims for r in x["ranks"]) / 1e6)
print()
print(f"{'plan':<20} {'iters':>5} {'mb/iter':>7} {'measured tok/s':>15} {'predicted tok/s':>16}"
      f" {'pred/meas':>9} {'peak RSS MB':>12} {'pred. peak MB':>13}")
for run, r in rows.items():
    print(f"{run:<20} {r['iters']:>5} {r['mbs']:>7.1f} {r['meas']:>15.0f} {r['pred']:>16.0f}"
          f" {r['pred'] / r['meas']:>9.2f} {r['rss']:>12.0f} {r['pmem']:>13.1f}")
print()
base = rows[runs[0]]
for run in runs[1:]:
    r = rows[run]
    print(f"{run} / {runs[0]}: measured {r['meas'] / base['meas']:.3f}x, "
          f"predicted {r['pred'] / base['pred']:.3f}x")
print("peak RSS: the largest resident set of any rank (libtorch and the process included); "
      "predicted: the simulator's per-rank peak (model states + activations + buffers)")
EOF
