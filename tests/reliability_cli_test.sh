#!/usr/bin/env bash
# Hostile inputs and failing writes, end to end (issue "Reliability": inputs that never crash,
# writes that never destroy). Every case names its exit code and message:
#   - outputs: checked before the work, never onto an input (device + inode), '' refused, a failed
#     write (file-size limit, full device) leaves the previous file and names the path;
#   - reads: devices refused, files over the per-kind limit refused;
#   - flags: integers parsed as integers (--seed 1e23), --samples bounded, nan refused;
#   - files: JSON nested 100,000 deep and duplicate keys in every reader, too-slow links, plans
#     whose shapes the model cannot take (plan check, simulate, train);
#   - allocation failures (ulimit -v) reported at the command's edge, exit 1, no trace.
#
#   tests/reliability_cli_test.sh PATH/TO/sluice
set -u
sluice="$1"
. "$(dirname "$0")/cli_lib.sh"
python=python3
# A file-size limit must fail the write, not kill the shell's children before sluice sees it.
trap '' XFSZ

scenario=(--cluster a100-40g:2 --parallel pp=2 --tokens-per-batch 4096 --max-seqlen 512
          --iterations 1)
tiny=(--model gpt-tiny "${scenario[@]}" --show 0)
"$sluice" plan "${tiny[@]}" --out "$tmp/p.json" >/dev/null 2>&1
check plan-made test -s "$tmp/p.json"
cp "$tmp/p.json" "$tmp/p.saved"
same_as_saved() { cmp -s "$tmp/p.json" "$tmp/p.saved"; }

# --- Outputs never onto an input ------------------------------------------------------------
expect simulate-json-onto-plan 2 "^sluice: error: --json '$tmp/p.json' and the plan file '$tmp/p.json' are the same file" -- \
  simulate "$tmp/p.json" --json "$tmp/p.json"
check simulate-json-onto-plan-kept same_as_saved
expect simulate-trace-onto-plan 2 "--trace '.*' and the plan file" -- simulate "$tmp/p.json" --trace "$tmp/./p.json"
expect csv-onto-plan 2 "^sluice: error: --out '$tmp/p.json' and the plan file '$tmp/p.json' are the same file" -- \
  plan csv "$tmp/p.json" --out "$tmp/p.json"
ln "$tmp/p.json" "$tmp/hard-link.json"
expect csv-onto-hard-link 2 "--out '$tmp/hard-link.json' and the plan file '$tmp/p.json' are the same file" -- \
  plan csv "$tmp/p.json" --out "$tmp/hard-link.json"
ln -s "$tmp/p.json" "$tmp/sym-link.json"
expect csv-onto-symlink 2 "are the same file" -- plan csv "$tmp/sym-link.json" --out "$tmp/p.json"
check csv-onto-plan-kept same_as_saved
cat >"$tmp/model.json" <<'EOF'
{"name": "m", "layers": 2, "hidden": 64, "heads": 2, "ffn_hidden": 256, "vocab": 1000,
 "max_position": 512}
EOF
cp "$tmp/model.json" "$tmp/model.saved"
expect plan-out-onto-model 2 "^sluice: error: --out '$tmp/model.json' and --model '$tmp/model.json' are the same file" -- \
  plan "${scenario[@]}" --model "$tmp/model.json" --out "$tmp/model.json"
check plan-out-onto-model-kept cmp -s "$tmp/model.json" "$tmp/model.saved"

# --- Output paths checked before the work, '' refused ----------------------------------------
expect plan-out-empty 2 "^--out: the path is empty; allowed: a path" -- plan --out ''
expect csv-out-empty 2 "^--out: the path is empty" -- plan csv "$tmp/p.json" --out ''
expect simulate-json-empty 2 "^--json: the path is empty" -- simulate "$tmp/p.json" --json ''
expect simulate-trace-empty 2 "^--trace: the path is empty" -- simulate "$tmp/p.json" --trace ''
expect simulate-report-empty 2 "^--report: the path is empty" -- simulate "$tmp/p.json" --report ''
expect compare-out-empty 2 "^--out: the path is empty" -- compare --out ''
# Before the work: no batch is planned, and plan csv fails on --out before reading its plan.
expect plan-out-missing-folder 2 "^sluice: error: --out '/nonexistent-sluice/p.json': the folder '/nonexistent-sluice' does not exist$" -- \
  plan "${tiny[@]}" --out /nonexistent-sluice/p.json
expect csv-out-missing-folder 2 "^sluice: error: --out '/nonexistent-sluice/o.csv': the folder" -- \
  plan csv "$tmp/no-such-plan.json" --out /nonexistent-sluice/o.csv
expect plan-out-is-folder 2 "--out '$tmp': is a folder" -- plan "${tiny[@]}" --out "$tmp"

# --- A failed write leaves the previous file -------------------------------------------------
# (the plan is ~3 KB; the limit is 1 KiB)
out="$( (ulimit -f 1; "$sluice" plan "${tiny[@]}" --out "$tmp/p.json") 2>&1)"
rc=$?
check failed-write-exit-1 test "$rc" -eq 1
check failed-write-message grep -Eq "^sluice: error: --out: $tmp/p.json: write failed \(File too large\); the previous file \(if any\) is unchanged$" <<<"$out"
check failed-write-kept same_as_saved
check failed-write-no-temporary-file test -z "$(ls "$tmp" | grep '\.tmp-')"
if [ -w /dev/full ]; then
  expect write-to-full-device 1 "^sluice: error: --out: /dev/full: write failed \(No space left on device\)$" -- \
    plan "${tiny[@]}" --out /dev/full
  expect simulate-json-to-full-device 1 "^sluice: error: --json: /dev/full: write failed" -- \
    simulate "$tmp/p.json" --json /dev/full
fi
expect write-to-dev-null 0 "wrote /dev/null" -- simulate "$tmp/p.json" --json /dev/null
check dev-null-still-a-device test -c /dev/null

# --- Reads are bounded -----------------------------------------------------------------------
expect plan-check-dev-zero 2 "^sluice: error: /dev/zero: is a character device; expected a regular file \(or a pipe\)$" -- \
  plan check /dev/zero
expect simulate-dev-zero 2 "/dev/zero: is a character device" -- simulate /dev/zero
truncate -s 1100M "$tmp/huge.json"
expect plan-over-limit 2 "huge.json: the file has 1153433600 bytes; a plan file may hold at most 1 GiB \(1073741824 bytes\)$" -- \
  plan check "$tmp/huge.json"
truncate -s 300M "$tmp/huge-model.json"
expect model-over-limit 2 "huge-model.json: the file has 314572800 bytes; a configuration file may hold at most 256 MiB" -- \
  plan --model "$tmp/huge-model.json"
rm -f "$tmp/huge.json" "$tmp/huge-model.json"

# --- Flags ----------------------------------------------------------------------------------
expect data-samples-huge 2 "^--samples: '2000000000' is not allowed; allowed: an integer in \[0, 100000000\]" -- \
  data stats web --samples 2000000000
expect plan-samples-huge 2 "^--samples: '2000000000' is not allowed; allowed: an integer in \[0, 100000000\]" -- \
  plan --data web --samples 2000000000
expect compare-samples-huge 2 "^--samples: '2000000000' is not allowed" -- compare --samples 2000000000
expect simulate-samples-huge 2 "^--samples: '2000000000' is not allowed" -- \
  simulate "$tmp/p.json" --data web --samples 2000000000
expect seed-float 2 "^--seed: '1e23' is not an integer; allowed: an integer >= 0" -- data stats web --seed 1e23
expect seed-fraction 2 "^--seed: '2.5' is not an integer" -- plan --seed 2.5
expect seed-negative 2 "^--seed: '-1' is not allowed; allowed: an integer >= 0" -- plan --seed -1
expect seed-past-64-bits 2 "^--seed: 18446744073709551616 is out of range; allowed: 0..9223372036854775807" -- plan --seed 18446744073709551616
expect tokens-float 2 "^--tokens-per-batch: '1e5' is not an integer" -- plan --tokens-per-batch 1e5
expect memory-limit-nan 2 "^--memory-limit: 'nan' is not allowed" -- plan --memory-limit nan
expect compute-scale-nan 2 "field 'compute_scale' is nan; allowed: a finite number > 0" -- \
  simulate "$tmp/p.json" --compute-scale nan

# --- Allocation failures are reported at the command's edge ----------------------------------
out="$( (ulimit -v 2000000; "$sluice" data stats web --samples 100000000) 2>&1)"
rc=$?
check bad-alloc-exit-1 test "$rc" -eq 1
check bad-alloc-message grep -Eq "^sluice: error: data stats: out of memory: the inputs ask for more memory than this machine gives" <<<"$out"
check bad-alloc-one-line test "$(wc -l <<<"$out")" -eq 1

# --- Files: nesting, duplicate keys, ranges, shapes beyond the model -------------------------
"$python" - "$tmp" <<'EOF'
import sys
tmp = sys.argv[1]
open(f"{tmp}/deep.json", "w").write("[" * 100000 + "]" * 100000)
open(f"{tmp}/deep-object.json", "w").write('{"a":' * 100000 + "1" + "}" * 100000)
open(f"{tmp}/deep-open.json", "w").write("[" * 100000)
open(f"{tmp}/dup-model.json", "w").write(
    '{"name": "m", "layers": 2, "layers": 3, "hidden": 64, "heads": 2, "ffn_hidden": 256, '
    '"vocab": 1000, "max_position": 512}')
open(f"{tmp}/deep.jsonl", "w").write('{"input_len": 5, "x": ' + "[" * 100000 + "]" * 100000 + "}\n")
EOF
# Plans begin with '{' (or a MessagePack map): only the nested object reaches their JSON parser.
expect deep-object-plan 2 "deep-object.json: values nested deeper than 64 levels" -- plan check "$tmp/deep-object.json"
expect deep-object-simulate 2 "deep-object.json: values nested deeper than 64 levels" -- simulate "$tmp/deep-object.json"
for f in deep deep-object deep-open; do
  expect "$f-model" 2 "$f.json: values nested deeper than 64 levels" -- plan --model "$tmp/$f.json"
  expect "$f-cluster" 2 "$f.json: values nested deeper than 64 levels" -- plan --cluster "$tmp/$f.json"
  expect "$f-parallel" 2 "$f.json: values nested deeper than 64 levels" -- plan --parallel "$tmp/$f.json"
  expect "$f-cost-table" 2 "$f.json: values nested deeper than 64 levels" -- \
    plan --cost "profiled:$tmp/$f.json"
  expect "$f-scenario" 2 "$f.json: values nested deeper than 64 levels" -- compare --scenario "$tmp/$f.json"
done
expect deep-jsonl 0 "samples" -- data stats "$tmp/deep.jsonl"
expect duplicate-key-model 2 "dup-model.json: field 'layers' is given twice" -- plan --model "$tmp/dup-model.json"
"$python" -c "
import sys; t = open(sys.argv[1]).read()
open(sys.argv[2], 'w').write(t.replace('{', '{\"format\": \"sluice-plan/1\", ', 1))" "$tmp/p.json" "$tmp/dup-plan.json"
expect duplicate-key-plan 2 "dup-plan.json: field 'format' is given twice" -- plan check "$tmp/dup-plan.json"

cat >"$tmp/slow-link.json" <<'EOF'
{"name": "c", "device": {"name": "d", "peak_tflops": 100, "memory_gib": 40, "hbm_gb_per_s": 1000},
 "nodes": 2, "devices_per_node": 4,
 "intra_node": {"bandwidth_gb_per_s": 100, "latency_us": 3},
 "inter_node": {"bandwidth_gb_per_s": 1e-15, "latency_us": 10}}
EOF
expect slow-link 2 "slow-link.json: field 'inter_node.bandwidth_gb_per_s': must be a number in \[0.001, 1000000\], got 1e-15" -- \
  plan --cluster "$tmp/slow-link.json" --iterations 1

# A plan whose micro-batches are longer than its model's max_position (512 tokens here, 64 for
# the model): refused by plan check, simulate and train before anything is sized.
"$python" -c "
import json, sys
p = json.load(open(sys.argv[1])); p['model']['max_position'] = 64
json.dump(p, open(sys.argv[2], 'w'))" "$tmp/p.json" "$tmp/long.json"
expect max-position-plan-check 2 "long.json: plan check: replica 0 micro-batch 0: seqlen [0-9]+ is longer than the model's max_position 64 \(gpt-tiny\); allowed: lengths in \[1, 64\]" -- \
  plan check "$tmp/long.json"
expect max-position-simulate 2 "long.json: plan check: replica 0 micro-batch 0: seqlen [0-9]+ is longer than the model's max_position 64" -- \
  simulate "$tmp/long.json" --no-check
if "$sluice" --help | grep -Eq "^  train "; then  # a build with libtorch
  expect max-position-train 2 "long.json: plan check: replica 0 micro-batch 0: seqlen [0-9]+ is longer than the model's max_position 64" -- \
    train --model gpt-tiny "${scenario[@]}" --nproc 2 --plan "$tmp/long.json" --timeout 30
  expect train-plan-with-optimizer 2 "^sluice: error: --optimize-budget-ms with --plan: the plan files run as they are" -- \
    train --model gpt-tiny "${scenario[@]}" --nproc 2 --plan "$tmp/p.json" --optimize-budget-ms 10
  # With --plan the run (and its progress line) counts the plan files, not --iterations.
  expect train-plan-progress-total 0 "^training .* 2/2 " -- \
    train --model gpt-tiny --cluster a100-40g:2 --parallel pp=2 --tokens-per-batch 4096 \
    --max-seqlen 512 --iterations 20 --nproc 2 --plan "$tmp/p.json" "$tmp/p.json" --timeout 60
  # The host allocator's policy is named before anything runs, and every run says which is used.
  expect train-host-allocator-unknown 2 "^sluice: error: --host-allocator: 'jemalloc' is not a host allocator policy \(allowed: cache, system\)" -- \
    train --model gpt-tiny --nproc 2 --host-allocator jemalloc
  expect train-host-allocator-system 0 "^host allocator: system \(the C library's own policy\)" -- \
    train --model gpt-tiny --cluster a100-40g:2 --parallel pp=2 --tokens-per-batch 4096 \
    --max-seqlen 512 --nproc 2 --plan "$tmp/p.json" --host-allocator system --timeout 60
  # Output paths are checked before anything is planned or launched.
  expect train-metrics-no-folder 2 "^sluice: error: --metrics '/nonexistent-sluice/m.jsonl': the folder '/nonexistent-sluice' does not exist" -- \
    train --model gpt-tiny --nproc 2 --metrics /nonexistent-sluice/m.jsonl
  expect train-trace-dir-is-file 2 "^sluice: error: --trace-dir '$tmp/p.json': cannot create the folder" -- \
    train --model gpt-tiny --nproc 2 --trace-dir "$tmp/p.json"
  expect train-dump-dir-is-file 2 "^sluice: error: --dump-dir '$tmp/p.json': cannot create the folder" -- \
    train --model gpt-tiny --nproc 2 --dump-dir "$tmp/p.json"
  # A run that fails keeps what ran: every surviving rank's trace, and the metrics lines so far,
  # which replace the previous metrics file whole (no temporary file is left behind).
  echo old >"$tmp/fail-metrics.jsonl"
  expect train-fails-at-iteration-3 1 "rank 1" -- \
    train --model gpt-tiny --nproc 2 --parallel pp=2 --iterations 5 --fault 1:3:exit --timeout 10 \
    --trace-dir "$tmp/fail-trace" --metrics "$tmp/fail-metrics.jsonl"
  check failed-run-trace-rank-0 "$python" -c "
import json, sys
events = json.load(open(sys.argv[1]))['traceEvents']
assert any(e.get('ph') == 'X' for e in events), 'no timed event'" "$tmp/fail-trace/trace-rank-0.json"
  check failed-run-metrics-replaced "$python" -c "
import json, sys
lines = open(sys.argv[1]).read().splitlines()
assert lines and lines[0] != 'old', lines[:1]
its = [json.loads(l)['iteration'] for l in lines]
assert its == list(range(len(its))) and 1 <= len(its) <= 3, its" "$tmp/fail-metrics.jsonl"
  check failed-run-no-temporary-files test -z "$(ls "$tmp" | grep -F .tmp-)"
fi

# --- profile (builds with libtorch only) -----------------------------------------------------
if "$sluice" --help | grep -Eq "^  profile "; then  # a build with libtorch
  expect profile-nan 2 "^--max-activation-mb: 'nan' is not allowed; allowed: a size in MB in \[0, 1e9\]" -- \
    profile --max-activation-mb nan --out "$tmp/t.json"
  expect profile-out-empty 2 "^--out: the path is empty" -- profile --out ''
  expect profile-out-onto-model 2 "^sluice: error: --out '$tmp/model.json' and --model '$tmp/model.json' are the same file" -- \
    profile --model "$tmp/model.json" --out "$tmp/model.json"
  # Checked before the model is even resolved: the unknown model is not what is reported.
  expect profile-out-first 2 "^sluice: error: --out '/nonexistent-sluice/t.json': the folder" -- \
    profile --model no-such-model --out /nonexistent-sluice/t.json
  # A model too big for the memory given: libtorch's c10::Error is caught at the command's edge
  # and reported on one line, exit 1.
  echo '{"name": "big", "kind": "decoder-only", "layers": 2, "hidden": 16384, "heads": 128,
    "kv_heads": 128, "ffn_hidden": 65536, "vocab": 50257, "max_position": 2048, "mlp": "gelu",
    "tied_embeddings": true}' >"$tmp/big-model.json"
  out="$( (ulimit -v 6000000; "$sluice" profile --model "$tmp/big-model.json" --mbs 1 --seqlen 64 \
           --repeats 1 --warmup 0 --out "$tmp/big-table.json") 2>&1)"
  rc=$?
  check profile-too-big-exit-1 test "$rc" -eq 1
  check profile-too-big-message grep -Eq "^sluice: error: profile: out of memory: .*allocate" <<<"$out"
  check profile-too-big-no-trace test -z "$(grep -E 'frame #|Exception raised from' <<<"$out")"
  check profile-too-big-no-file test ! -e "$tmp/big-table.json"
fi

finish reliability
