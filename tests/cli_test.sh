#!/usr/bin/env bash
# End-to-end checks of the `sluice` binary: exit codes (0 ok, 1 failed run, 2 bad usage or
# input) and that error messages name the file, the field and the allowed values.
#
#   tests/cli_test.sh PATH/TO/sluice
set -u
sluice="$1"
. "$(dirname "$0")/cli_lib.sh"

# Usage.
expect help 0 "Subcommands:" -- --help
expect no-subcommand 2 "subcommand is required" --
expect unknown-subcommand 2 "" -- frobnicate
expect data-help 0 "stats" -- data --help
expect unknown-flag 2 "--bogus" -- data stats --bogus

# data stats
expect stats-default 0 "mixture-4task: 30,000 samples" -- data stats
expect stats-preset-flag 0 "gcide-define: 20,000 samples" -- data stats --data gcide-define --no-histogram
expect stats-generator 0 "web: 1,000 samples" -- data stats web --samples 1000 --seed 3
expect stats-unknown 2 "no-such-data.*(mixture-4task|presets)" -- data stats no-such-data
printf '{"input_len": 5, "target_len": 2}\n{"input_len": -3}\n' >"$tmp/bad.jsonl"
expect stats-bad-line 2 "bad.jsonl:2" -- data stats "$tmp/bad.jsonl"
printf 'input,target\n5,2\n' >"$tmp/cols.csv"
expect stats-csv-columns 0 "1 samples|1 sample" -- data stats "$tmp/cols.csv" --input-field input --target-field target --task-field ""
expect stats-bad-format 2 "format" -- data stats "$tmp/cols.csv" --format yaml
expect presets 0 "mixture-4task" -- data presets

# cost show / cost fit
expect cost-show-default 0 "profiled" -- cost show
expect cost-show-point 0 "encoder" -- cost show --model gpt-6.7b --tp 2 --seqlen 2048 --mbs 4
expect cost-show-t5 0 "decoder" -- cost show --model t5-11b --seqlen 512 --dec-seqlen 128 --mbs 2
expect cost-show-analytic 0 "analytic" -- cost show --model llama-7b --cluster h100-80g:8 --seqlen 4096 --mbs 1
expect cost-show-file 0 "analytic" -- cost show --model "$(dirname "$0")/../examples/model-gpt-1.3b.json" --seqlen 1024 --mbs 2
expect cost-show-bad-model 2 "gpt-6.7b" -- cost show --model gpt-7b
expect cost-show-bad-tp 2 "tp" -- cost show --model gpt-6.7b --tp 3
expect cost-show-bad-recompute 2 "none|selective|full" -- cost show --recompute some
expect cost-show-infeasible 0 "infeasible" -- cost show --model gpt-6.7b --seqlen 8192 --mbs 64
printf '{"name": "m", "kind": "decoder-only", "layers": 2, "hidden": 64, "heads": 2, "kv_heads": 2, "ffn_hidden": 256, "vocab": 100, "max_position": 128, "colour": 1}\n' >"$tmp/model.json"
expect cost-show-unknown-key 2 "model.json.*colour" -- cost show --model "$tmp/model.json"
expect cost-show-bad-cluster 2 "a100-40g" -- cost show --cluster tpu:8
expect cost-fit 0 "mean" -- cost fit

# batch
expect batch-default 0 "summary over 3 global batches" -- batch --iterations 3
expect batch-every-method 0 "predicted throughput" -- batch --method hydraulis+dynapipe --iterations 2 --show 0
expect batch-t5 0 "x[0-9]+ " -- batch --model t5-11b --parallel dp=1,pp=8,zero=1 --data flan-like --max-seqlen 1024 --tokens-per-batch 16384 --iterations 2 --method dynapipe
expect batch-t5-hydraulis 0 "x[0-9]+x[0-9]+ varlen" -- batch --model t5-11b --parallel dp=1,pp=8,zero=1 --data flan-like --max-seqlen 512 --iterations 1 --method hydraulis
expect batch-t5-megatron-gbp 2 "decoder-only" -- batch --model t5-11b --parallel dp=1,pp=8,zero=1 --data flan-like --max-seqlen 512 --iterations 1 --method megatron-gbp
expect batch-bad-method 2 "allowed: 'padding'" -- batch --method fastest
expect batch-bad-iterations 2 "--iterations" -- batch --iterations many
expect batch-seqlen-too-long 2 "max position" -- batch --max-seqlen 100000
expect batch-states-oom 2 "model states" -- batch --parallel dp=8
expect batch-all-oom 1 "no plan that fits memory" -- batch --parallel dp=1,pp=8 --memory-limit 20000 --max-seqlen 8192 --data long-context --samples 50 --iterations 1 --method padding
expect batch-bad-long 2 "clip" -- batch --long keep
# Number flags reject nan, inf and out-of-range values naming what is allowed.
expect batch-memory-nan 2 "--memory-limit: 'nan' is not allowed; allowed: a size in MB" -- batch --memory-limit nan
expect batch-mbs-negative 2 "--mbs: '-1' is not allowed; allowed: an integer >= 0" -- batch --mbs -1
expect plan-memory-inf 2 "--memory-limit: 'inf' is not allowed" -- plan --memory-limit inf
expect cost-show-mbs-zero 2 "--mbs: '0' is not allowed; allowed: an integer >= 1" -- cost show --mbs 0
expect cost-fit-sharpness-nan 2 "--fixed-sharpness: 'nan' is not allowed" -- cost fit --fixed-sharpness nan
expect stats-samples-negative 2 "--samples: '-5' is not allowed" -- data stats --samples -5
expect compare-dynamic-screen-one 2 "--dynamic-screen: '1' is not allowed; allowed: off, or a margin in \\[0, 1\\)" -- compare --dynamic-screen 1
expect compare-dynamic-screen-nan 2 "--dynamic-screen: 'nan' is not allowed" -- compare --dynamic-screen nan

# Lost data: how many samples and tokens were clipped or dropped, and why (item 4 of "honest
# numbers"); tiny inputs warn, an input with no batch says why.
expect plan-lost-clipped 0 "lost: +[0-9,]+ of 30,000 samples \([0-9.]+%\) longer than max seqlen 2048 were clipped, removing [0-9,]+ of [0-9,]+ tokens \([0-9.]+%\)" -- plan --iterations 1 --show 0
expect batch-lost-dropped 0 "lost: +[0-9,]+ of 30,000 samples .* were dropped with their" -- batch --iterations 1 --long drop
printf '5000\n6000\n' >"$tmp/long.txt"
expect plan-all-dropped 2 "--data: '.*long.txt' yields no global batch of 65536 tokens: all 2 samples were dropped: 2 longer than max seqlen 2048 \(long samples are dropped\)" -- plan --data "$tmp/long.txt" --long drop
expect batch-all-dropped 2 "all 2 samples were dropped" -- batch --data "$tmp/long.txt" --long drop
printf '100\n' >"$tmp/one.txt"
expect batch-one-sample-warns 0 "warning: the data yields only 1 global batch, fewer than the 20 asked for" -- batch --data "$tmp/one.txt"
expect batch-one-sample-idles 0 "warning: 1 of 1 global batches hold fewer samples than dp x pp = 8" -- batch --data "$tmp/one.txt"
expect plan-one-sample-dp 2 "global batch 0: a global batch of 1 sample cannot feed 2 data-parallel replicas" -- plan --data "$tmp/one.txt"
expect plan-one-sample-warns 0 "warning: 1 of 1 global batches hold fewer samples than dp x pp = 4" -- plan --data "$tmp/one.txt" --parallel dp=1,pp=4,zero=1

# The memory reserve is one field, shared by every planning subcommand and carried by the plan.
expect plan-reserve-default 0 "memory limit 38655 MB \(the device's 42950 MB less a 4295 MB reserve\)" -- plan --iterations 1 --show 0
expect batch-reserve-flag 0 "memory limit 41950 MB \(the device's 42950 MB less a 1000 MB reserve\)" -- batch --iterations 1 --memory-reserve 1000
expect plan-reserve-with-limit 2 "--memory-reserve: applies only without --memory-limit" -- plan --memory-limit 36000 --memory-reserve 1000
expect plan-reserve-written 0 "wrote" -- plan --iterations 1 --memory-reserve 1000 --out "$tmp/reserve-plan.json"
check plan-reserve-in-file grep -q '"memory_reserve_mb": *1000' "$tmp/reserve-plan.json"
expect simulate-reserve 0 "limit 41,950 MB|41,950" -- simulate "$tmp/reserve-plan.json"
expect simulate-reserve-flag 0 "41,950|limit" -- simulate "$tmp/reserve-plan.json" --memory-reserve 1000
expect simulate-reserve-with-limit 2 "--memory-reserve: applies only without --memory-limit" -- simulate "$tmp/reserve-plan.json" --memory-limit 30000 --memory-reserve 1000

# plan, plan check, plan csv
expect plan-default 0 "makespan .* bubble" -- plan --iterations 2 --out "$tmp/plan.json"
expect plan-default-names 0 "plans written to .*plan-<batch>\.json.*e\.g\. .*plan-0\.json" -- plan --iterations 2 --show 0 --out "$tmp/plan.json"
expect plan-check 0 "valid plan of gpt-6.7b" -- plan check "$tmp/plan-0.json"
expect plan-out-no-folder 2 "--out .*the folder .*no-such-dir. does not exist" -- plan --iterations 2 --out "$tmp/no-such-dir/plan.json"
expect plan-check-several 0 "plan-1\.json: valid plan" -- plan check "$tmp/plan-0.json" "$tmp/plan-1.json"
expect plan-check-set-hint 2 "plan\.json: no such file; .*plan-<batch>\.json \(2 here, e\.g\. .*plan-0\.json\).*--iterations 1" -- plan check "$tmp/plan.json"
expect simulate-set-hint 2 "plan-<batch>\.json" -- simulate "$tmp/plan.json"
expect plan-csv 0 "^0F0,0F1" -- plan csv "$tmp/plan-0.json"
expect plan-csv-comms 0 "SEND_F0" -- plan csv "$tmp/plan-0.json" --comms
expect plan-csv-bad-replica 2 "allowed: 0..1" -- plan csv "$tmp/plan-0.json" --replica 5
for s in gpipe zb-h1 adaptive; do
  expect "plan-$s" 0 "1 planned" -- plan --schedule "$s" --iterations 1 --parallel dp=1,pp=8,zero=1 --show 0
done
expect plan-interleaved 0 "1 planned" -- plan --schedule interleaved --parallel dp=1,pp=4,vpp=2,zero=1 --memory-limit 40000 --iterations 1 --show 0
# Interleaved rounds: 19 micro-batches per replica (not a multiple of pp = 4) run in flexible
# rounds, recorded in the plan, which checks, simulates and optimizes like any other.
expect plan-interleaved-flexible 0 "replica 0 \(interleaved-flex schedule" -- plan --schedule interleaved --parallel dp=2,pp=4,vpp=2,zero=1 --memory-limit 40000 --iterations 1 --interleaved-rounds flexible --show 1 --out "$tmp/flex.json"
check plan-flexible-recorded grep -q '"schedule": *"interleaved-flex"' "$tmp/flex.json"
expect plan-flexible-check 0 "valid plan" -- plan check "$tmp/flex.json"
expect plan-flexible-simulate 0 "^iteration" -- simulate "$tmp/flex.json"
expect plan-flexible-optimize 0 "wrote" -- optimize "$tmp/flex.json" --out "$tmp/flex-o.json" --data mixture-4task --steps 5 --budget-ms 100000
expect plan-padded-rounds 0 "replica 0 \(interleaved schedule" -- plan --schedule interleaved --parallel dp=2,pp=4,vpp=2,zero=1 --memory-limit 40000 --iterations 1 --interleaved-rounds padded --show 1
expect plan-bad-rounds 2 "--interleaved-rounds.*allowed: padded, flexible, auto" -- plan --schedule interleaved --interleaved-rounds flex
expect plan-msgpack 0 "wrote" -- plan --iterations 1 --out "$tmp/plan.msgpack"
expect plan-check-msgpack 0 "valid plan" -- plan check "$tmp/plan.msgpack"
expect plan-bad-schedule 2 "1f1b" -- plan --schedule zigzag
expect plan-gpipe-vpp 2 "vpp" -- plan --schedule gpipe --parallel dp=1,pp=4,vpp=2,zero=1
# Context parallelism: planned (and checked) on dp x pp x tp x cp devices; decoder-only models.
expect plan-cp 0 "1 planned" -- plan --parallel dp=1,pp=2,tp=2,cp=2,zero=1 --iterations 1 --show 0
expect plan-cp-t5 2 "cp = 2 needs a decoder-only model" -- plan --model t5-11b --parallel pp=4,cp=2 --iterations 1
expect plan-cp-devices 2 "dp\\*pp\\*tp\\*cp = 2\\*2\\*2\\*2 = 16 devices" -- plan --parallel dp=2,pp=2,tp=2,cp=2 --iterations 1
printf '{"format": "sluice-plan/1"}' >"$tmp/empty-plan.json"
expect plan-check-incomplete 2 "empty-plan.json" -- plan check "$tmp/empty-plan.json"
expect plan-check-missing 2 "no-such-plan.json" -- plan check "$tmp/no-such-plan.json"
# JSON nested 100,000 deep or with a duplicate key: a clear message from every reader, no crash.
/usr/bin/python3 -c 'import sys; sys.stdout.write("{\"name\": " + "[" * 100000 + "]" * 100000 + "}")' >"$tmp/deep.json"
expect deep-model 2 "deep.json: values nested deeper than 64 levels" -- cost show --model "$tmp/deep.json"
expect deep-plan 2 "deep.json: values nested deeper than 64 levels" -- plan check "$tmp/deep.json"
expect deep-cluster 2 "deep.json: values nested deeper than 64 levels" -- cost show --cluster "$tmp/deep.json"
printf '{"name": "m", "name": "n"}' >"$tmp/dup.json"
expect duplicate-key 2 "dup.json: field 'name' is given twice" -- cost show --model "$tmp/dup.json"
# Slot ids are dense: a plan naming slot 2^31 - 1 is rejected before anything is sized by it.
/usr/bin/python3 - "$tmp/plan-0.json" "$tmp/huge-slots.json" <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))
offset = (1 << 31) - 64
for prog in plan["ranks"]:
    prog["buffer_slots"] += offset
    for ins in prog["instructions"]:
        for key in ("in", "out"):
            if key in ins:
                ins[key] = [s + offset for s in ins[key]]
json.dump(plan, open(sys.argv[2], "w"))
PY
expect plan-check-huge-slots 2 "buffer slots but allocates only .* slot ids must be dense" -- plan check "$tmp/huge-slots.json"

finish
