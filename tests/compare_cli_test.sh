#!/usr/bin/env bash
# End-to-end checks of `sluice compare`: the default scenario, scenario files and folders, the
# files it writes, exit codes (0 ok, 1 failed or interrupted run, 2 bad usage or input), error
# messages naming the file, the field and the allowed values, and Ctrl-C.
#
#   tests/compare_cli_test.sh PATH/TO/sluice
set -u
sluice="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"  # absolute: some cases run elsewhere
here="$(cd "$(dirname "$0")" && pwd)"
. "$(dirname "$0")/cli_lib.sh"

quick=(--iterations 2 --score-batches 1 --simulate-top 1)

# Usage.
expect help 0 "scenario-dir" -- compare --help
expect both-sources 2 "--scenario and --scenario-dir" -- compare --scenario a.json --scenario-dir b
expect bad-iterations 2 "--iterations" -- compare --iterations many
expect bad-method 2 "--methods.*fastest.*allowed.*'packing'" -- compare --methods packing,fastest
expect bad-model 2 "--model.*gpt-6.7b" -- compare --model gpt-7b "${quick[@]}" --out "$tmp/never-made"
check failed-run-leaves-no-folder test ! -e "$tmp/never-made"
expect seqlen-too-long 2 "--max-seqlen.*max position" -- compare --max-seqlen 100000 "${quick[@]}"
expect memory-above-device 2 "--memory-limit.*exceeds" -- compare --memory-limit 90000 "${quick[@]}"
expect memory-nan 2 "--memory-limit: 'nan' is not allowed; allowed: a size in MB" -- compare --memory-limit nan
expect tokens-zero 2 "--tokens-per-batch: '0' is not allowed; allowed: an integer >= 1" -- compare --tokens-per-batch 0
expect seed-negative 2 "--seed: '-1' is not allowed" -- compare --seed -1
expect seed-too-big 2 "--seed: 18446744073709551615 is out of range; allowed: 0..9223372036854775807" -- compare --seed 18446744073709551615
expect bad-long 2 "--long: 'keep' is not allowed; allowed: clip, drop" -- compare --long keep
expect iterations-zero 2 "--iterations: '0' is not a positive integer or 'all'" -- compare --iterations 0
expect methods-twice 2 "^sluice: error: --methods: method 'packing' is listed twice" -- compare --methods packing,packing
expect methods-empty 2 "--methods: unknown method ''" -- compare --methods packing,
expect bad-cp 2 "--cp '1,x': 'x' is not allowed; allowed: comma-separated integers" -- compare --cp 1,x
expect bad-ep 2 "--ep '2,0': '0' is not allowed; allowed: comma-separated integers in 1..1048576" -- compare --ep 2,0
# Expert-parallel degrees no configuration can run are refused up front, naming the allowed ones.
expect ep-not-dividing-experts 2 "--ep: ep = 3 cannot run: ep must divide moe.experts = 4 of model 'gpt-tiny-moe' .* \(allowed: 1, 2, 4\)" -- compare --model gpt-tiny-moe --cluster cpu:8 --ep 3,2 --iterations 1
expect ep-dense-model 2 "--ep: ep = 2 cannot run: model 'gpt-tiny' is dense .*\(allowed: 1\)" -- compare --model gpt-tiny --cluster cpu:8 --ep 2 --iterations 1
expect bad-moe-overlap 2 "--moe-overlap 'fast' is not an MoE overlap; allowed: none, tutel, megatron, dw, partition, lancet, lancet-megatron, off" -- compare --moe-overlap fast
# Expert parallelism: --ep in the search (the ep 2 configurations appear among the candidates),
# the all-to-all columns per method row, in results.json and the report's all-to-all timeline
# row; lancet's rewrite exposes less all-to-all than the segmented plans with nothing overlapped.
moe=(--model gpt-tiny-moe --cluster a100-40g:2 --samples 2000 --tokens-per-batch 16384 --max-seqlen 1024 --methods packing,padding --reference packing "${quick[@]}")
expect moe-ep-search 0 "Each method under its own best configuration" -- compare "${moe[@]}" --ep 1,2 --out "$tmp/moe-search"
check moe-ep-search-configs python3 -c "
import json, sys
r = json.load(open(sys.argv[1]))
assert r['scenario']['search']['ep'] == [1, 2], r['scenario']['search']
for x in r['own']:
    b = x['batches'][0]
    if x['config']['parallel'].get('ep', 1) == 2:
        assert x['all_to_all_ms'] > 0 and b['all_to_all_ms'] > 0, x
    else:
        assert 'all_to_all_ms' not in x and 'all_to_all_ms' not in b, x
" "$tmp/moe-search/results.json"
expect moe-none 0 "method +tokens/s .* all-to-all ms +exposed a2a ms " -- compare "${moe[@]}" --parallel dp=2,ep=2 --moe-overlap none --out "$tmp/moe-none"
expect moe-lancet 0 "packing .* dp 2 x pp 1 x tp 1 x ep 2," -- compare "${moe[@]}" --parallel dp=2,ep=2 --moe-overlap lancet --out "$tmp/moe-lancet"
check moe-exposed-all-to-all python3 -c "
import json, sys
none = json.load(open(sys.argv[1]))
lan = json.load(open(sys.argv[2]))
assert lan['scenario']['moe_overlap'] == 'lancet' and none['scenario']['moe_overlap'] == 'none'
for n, l in zip(none['own'], lan['own']):
    assert n['method'] == l['method'] and n['config']['parallel']['ep'] == 2
    assert 0 < n['exposed_all_to_all_ms'] <= n['all_to_all_ms'] + 1e-9, n
    assert 0 <= l['exposed_all_to_all_ms'] < n['exposed_all_to_all_ms'], (l, n)
    mean = sum(b['exposed_all_to_all_ms'] for b in l['batches']) / len(l['batches'])
    assert abs(mean - l['exposed_all_to_all_ms']) < 1e-9, (mean, l)
" "$tmp/moe-none/results.json" "$tmp/moe-lancet/results.json"
check moe-report-timeline grep -q "rank 0 all-to-all" "$tmp/moe-lancet/report.html"
check moe-report-columns grep -q "exposed a2a ms" "$tmp/moe-lancet/report.html"
expect too-many-devices 2 "--parallel: .*16 devices, but the cluster has 8" -- compare --parallel dp=16 "${quick[@]}" --out "$tmp/x"
expect too-many-devices-controlled 2 "--controlled: .*16 devices, but the cluster has 8" -- compare --controlled dp=16 "${quick[@]}" --out "$tmp/x"
# --parallel fixes every method's configuration (as for every other command); --controlled only
# the controlled comparison's.
expect parallel-fixes-every-method 0 "dp 4 x pp 2" -- compare --parallel dp=4,pp=2,zero=1 --methods packing,dynapipe,sluice "${quick[@]}" --out "$tmp/fixed"
check parallel-every-method-configuration python3 -c "
import json, sys
r = json.load(open(sys.argv[1]))
runs = r['own'] + r['controlled']
confs = {(c['dp'], c['pp'], c.get('tp', 1)) for c in [x['config']['parallel'] for x in runs if x['config']]}
assert len(runs) == 6 and confs == {(4, 2, 1)}, confs
assert (r['controlled_config']['dp'], r['controlled_config']['pp']) == (4, 2), r['controlled_config']
" "$tmp/fixed/results.json"
# sluice-hetero: a heterogeneous row beside the others; the controlled comparison falls to the
# last method of one configuration (sluice), and the hetero row says it is not part of it.
expect hetero-row 0 "sluice-hetero .*heterogeneous: .* \\+ " -- compare --methods packing,sluice,sluice-hetero --cp 1,2 "${quick[@]}" --out "$tmp/hetero"
check hetero-row-results python3 -c "
import json, sys
r = json.load(open(sys.argv[1]))
own = {x['method']: x for x in r['own']}
ctl = {x['method']: x for x in r['controlled']}
h = own['sluice-hetero']
assert h['state'] == 'ok' and h['config'] is None and len(h['hetero']['replicas']) == 2, h['state']
assert h['ok_batches'] == 2 and 0 < h['fraction_of_ideal'] <= h['fraction_of_length_aware'], h
assert ctl['sluice-hetero']['state'] == 'not-run', ctl['sluice-hetero']
assert r['controlled_config'] is not None
" "$tmp/hetero/results.json"
# sluice-dynamic with its screen off: every strategy planned on every batch, and the run says so.
expect dynamic-screen-off 0 "sluice-dynamic .*per batch among [0-9]+ strategies, [0-9]+ switches, screen off: " -- compare --methods sluice,sluice-dynamic --cp 1,2 "${quick[@]}" --dynamic-screen off --out "$tmp/dyn"
check dynamic-screen-off-results python3 -c "
import json, sys
r = json.load(open(sys.argv[1]))
d = {x['method']: x for x in r['own']}['sluice-dynamic']
assert d['screen_margin'] == 'off' and all('screened' not in b for b in d['batches']), d
" "$tmp/dyn/results.json"
expect dynamic-refresh-unknown 2 "^sluice: error: --dynamic-refresh 'lazy': allowed values are quick, full" -- compare --methods sluice-dynamic "${quick[@]}" --dynamic-refresh lazy --out "$tmp/x"
expect no-devices 2 "--cluster: cluster 'a100-40g:0': the device count must be in \[1, " -- compare --cluster a100-40g:0 "${quick[@]}" --out "$tmp/x"
expect help-defaults 0 "--samples INT=0 " -- compare --help
# Every flag of `compare --help` shows its default ("=VALUE" or "default: ...").
check help-every-default python3 -c "
import re, subprocess, sys
text = subprocess.run([sys.argv[1], 'compare', '--help'], capture_output=True, text=True).stdout
opts = re.split(r'\n  (?=--)', text.split('Options:', 1)[1])
flags = [(o.split()[0], o.split('\n')[0].split('  ')[0], o) for o in opts if o.startswith('--')]
assert len(flags) >= 20, flags
bad = [f for f, head, o in flags if not re.search(r'=[^=,|]*$', head) and 'default' not in o]
assert not bad, bad
" "$sluice"

# The default scenario (fewer batches): tables, files, the report's path.
expect default 0 "report: .*/default-out/report.html" -- compare "${quick[@]}" --out "$tmp/default-out"
# A relative --out prints absolute paths, so the report can be opened from anywhere.
cd "$tmp"
expect relative-out 0 "^report: $tmp/rel-out/report.html$" -- compare "${quick[@]}" --methods packing,dynapipe --out rel-out
cd - >/dev/null
check default-results test -s "$tmp/default-out/results.json"
check default-report grep -q "sluice-bar-chart" "$tmp/default-out/report.html"
check default-timelines grep -q "sluice-timeline" "$tmp/default-out/report.html"
check default-format grep -q '"format": "sluice-compare/1"' "$tmp/default-out/results.json"
check default-not-partial grep -q '"partial": false' "$tmp/default-out/results.json"
expect default-tables 0 "Controlled: every method on dp" -- compare "${quick[@]}" --no-html --out "$tmp/o2"
check no-html test ! -e "$tmp/o2/report.html"

# Scenario files: the shipped example, flags overriding it, strict validation.
expect example 0 "scenario: compare-small" -- \
  compare --scenario "$here/../examples/compare-small.json" --out "$tmp/example"
expect example-override 0 "1 batches|, 1 batches" -- \
  compare --scenario "$here/../examples/compare-small.json" --iterations 1 --out "$tmp/override"
printf '{"model": "gpt-6.7b", "colour": 1}\n' >"$tmp/bad-key.json"
expect unknown-key 2 "bad-key.json.*colour.*(allowed|known)" -- compare --scenario "$tmp/bad-key.json"
printf '{"methods": ["packing", {"name": "x", "batching": ["dynapipe"], "schedules": ["zigzag"]}]}\n' >"$tmp/bad-schedule.json"
expect bad-schedule 2 "bad-schedule.json.*methods\[1\].schedules.*zb-h1" -- \
  compare --scenario "$tmp/bad-schedule.json"
printf '{"iterations": 0}\n' >"$tmp/bad-iter.json"
expect bad-iterations-file 2 "bad-iter.json.*iterations.*all" -- compare --scenario "$tmp/bad-iter.json"
printf '{"max_seqlen": 100000}\n' >"$tmp/long.json"
expect seqlen-file 2 "long.json: field 'max_seqlen'" -- compare --scenario "$tmp/long.json"
expect missing-file 2 "nope.json" -- compare --scenario "$tmp/nope.json"
expect scenario-is-folder 2 "$tmp: is a folder; expected a file" -- compare --scenario "$tmp"
printf 'models: [gpt]\n' >"$tmp/yaml.json"
expect not-json 2 "yaml.json:1:1: not valid JSON" -- compare --scenario "$tmp/yaml.json"
printf '{"tokens_per_batch": "lots"}\n' >"$tmp/type.json"
expect wrong-type 2 "type.json: field 'tokens_per_batch': must be an integer in \[1, " -- compare --scenario "$tmp/type.json"
printf '{"memory_limit_mb": -5}\n' >"$tmp/neg.json"
expect negative-memory 2 "neg.json: field 'memory_limit_mb': must be a number in \[0, " -- compare --scenario "$tmp/neg.json"
printf '{"controlled": {"dp": 4, "pp": 4}}\n' >"$tmp/impossible.json"
expect impossible-config 2 "impossible.json: field 'controlled': .*16 devices, but the cluster has 8" -- \
  compare --scenario "$tmp/impossible.json" "${quick[@]}" --out "$tmp/x"
printf '{"name": "../../escape"}\n' >"$tmp/escape.json"
expect name-escapes 2 "escape.json: field 'name': '../../escape' is not allowed; allowed: a folder name" -- \
  compare --scenario "$tmp/escape.json"
# The output folder is checked before the run: a file in its way fails at once.
: >"$tmp/a-file"
expect out-unwritable 2 "^sluice: error: --out '$tmp/a-file/sub': cannot create the folder" -- \
  compare --out "$tmp/a-file/sub" --iterations 1

# Methods that cannot run are shown, not dropped.
expect t5-unsupported 0 "megatron-gbp +unsupported" -- \
  compare --model t5-11b --data flan-like --samples 2000 --tokens-per-batch 8192 --max-seqlen 512 \
  --methods packing,megatron-gbp,hydraulis,dynapipe --reference packing "${quick[@]}" --no-html \
  --out "$tmp/t5"
expect all-oom 1 "no method fits memory" -- \
  compare --memory-limit 2000 --methods packing,dynapipe "${quick[@]}" --no-html --out "$tmp/oom"
check all-oom-results grep -q '"state": "out-of-memory"' "$tmp/oom/results.json"

# Failed batches count (docs/compare.md, "Failed batches"): examples/compare-failing-batches.json,
# web text clipped at 8192 tokens on 30 GB, scored on the first two (short) batches only: multipack
# picks a configuration that fails the batches with an 8K sample. Its tokens/s is marked k/n, the
# note says how failures count, and the method whose space holds that configuration keeps its own
# complete run instead of adopting it.
failing="$here/../examples/compare-failing-batches.json"
expect failed-batches-marked 0 "multipack +[0-9,]+ \([0-9]+/20 ran\)" -- \
  compare --scenario "$failing" --no-html --out "$tmp/wide"
expect failed-batches-note 0 "tokens/s counts every batch: a failed batch" -- \
  compare --scenario "$failing" --no-html --out "$tmp/wide"
check failed-batches-not-adopted /usr/bin/python3 -c "
import json, sys
r = json.load(open(sys.argv[1]))
runs = {m['method']: m for m in r['own']}
d, b = runs['multipack'], runs['both']
assert 0 < d['ok_batches'] < 20 and d['untrained_tokens'] > 0, d['ok_batches']
assert abs(d['tokens_per_s'] - d['ran_tokens_per_s'] * d['ok_batches'] / 20) < 1e-6 * d['tokens_per_s']
assert d['ran_tokens_per_s'] > b['tokens_per_s'], (d['ran_tokens_per_s'], b['tokens_per_s'])
assert b['ok_batches'] == 20 and b['adopted_from'] == '', b['adopted_from']
assert r['score_batches'] == [0, 1], r['score_batches']
" "$tmp/wide/results.json"
# Scoring the longest and densest batches as well (the default): multipack runs all 20.
expect failed-batches-extremes 0 "multipack +[0-9,]+ +1.00x .* 20/20" -- \
  compare --scenario "$failing" --score-extremes --no-html --out "$tmp/wide2"
expect score-batches-bad 2 "--score-batches: 'some' is not allowed; allowed: an integer in 1..64, or 'all'" -- \
  compare --score-batches some

# Lost data and tiny inputs: the terminal says what was clipped, results.json counts it, a one-sample
# input runs with warnings on stderr, and an input with no batch says why.
expect lost-data 0 "lost: +[0-9,]+ of 30,000 samples \([0-9.]+%\) longer than max seqlen 2048 were clipped" -- \
  compare "${quick[@]}" --methods packing --no-html --out "$tmp/lost"
check lost-data-results /usr/bin/python3 -c "
import json, sys
d = json.load(open(sys.argv[1]))['data_loss']
assert d['samples'] == 30000 and 0 < d['clipped_samples'] < 30000, d
assert d['kept_tokens'] == d['tokens'] - d['clipped_tokens'], d
" "$tmp/lost/results.json"
printf '100\n' >"$tmp/one.txt"
"$sluice" compare --data "$tmp/one.txt" --methods packing "${quick[@]}" --no-html --out "$tmp/one" \
  >"$tmp/one.out" 2>"$tmp/one.err"
check one-sample-runs test $? -eq 0
check one-sample-warns grep -q "^warning: the run's global batches hold only 1 sample in all, fewer than the 8 devices" "$tmp/one.err"
check one-sample-warns-batches grep -q "^warning: the data yields only 1 global batch, fewer than the 2 asked for" "$tmp/one.err"
check one-sample-warnings-in-results grep -q '"warnings": \[' "$tmp/one/results.json"
printf '5000\n6000\n' >"$tmp/long.txt"
expect all-dropped 2 "--data: '.*long.txt' yields no global batch of 65536 tokens: all 2 samples were dropped: 2 longer than max seqlen 2048 \(long samples are dropped\)" -- \
  compare --data "$tmp/long.txt" --long drop "${quick[@]}"

# The memory reserve: without --memory-limit the budget is the device's memory less the reserve
# (default 2 GiB + 5%: 38,655 of an A100-40GB's 42,950 MB); --memory-reserve overrides it; an
# explicit limit is the budget as given, and a reserve beside it is an error.
expect reserve-default 0 "memory limit 38655 MB per device \(the device's 42950 MB less a 4295 MB reserve\)" -- \
  compare "${quick[@]}" --methods packing,dynapipe --no-html --out "$tmp/reserve"
check reserve-peaks /usr/bin/python3 -c "
import json, sys
r = json.load(open(sys.argv[1]))
assert abs(r['memory_limit_mb'] - 38654.705664) < 1e-6, r['memory_limit_mb']
peaks = [m['peak_memory_mb'] for m in r['own'] + r['controlled'] if m['ok_batches']]
assert peaks and max(peaks) <= r['memory_limit_mb'], peaks
" "$tmp/reserve/results.json"
expect reserve-flag 0 "memory limit 40950 MB per device \(the device's 42950 MB less a 2000 MB reserve\)" -- \
  compare "${quick[@]}" --methods packing --memory-reserve 2000 --no-html --out "$tmp/reserve2"
expect reserve-with-limit 2 "--memory-reserve: applies only without --memory-limit" -- \
  compare --memory-limit 36000 --memory-reserve 2000 "${quick[@]}"
expect reserve-too-big 2 "--memory-reserve: 50000 MB leaves nothing of the 42950 MB" -- \
  compare --memory-reserve 50000 "${quick[@]}"
printf '{"memory_reserve_mb": 3000, "methods": ["packing"], "controlled": "packing"}\n' >"$tmp/reserve.json"
expect reserve-file 0 "less a 3000 MB reserve" -- \
  compare --scenario "$tmp/reserve.json" "${quick[@]}" --no-html --out "$tmp/reserve3"

# A folder of scenarios: one sub-folder each and a summary table.
mkdir -p "$tmp/dir"
printf '{"name": "a", "tokens_per_batch": 8192, "max_seqlen": 512, "methods": ["packing", "dynapipe"], "controlled": "dynapipe", "search": {"pp": [1, 2], "score_batches": 1, "simulate_top": 1}}\n' >"$tmp/dir/a.json"
printf '{"name": "b", "tokens_per_batch": 8192, "max_seqlen": 1024, "methods": ["packing", "dynapipe"], "controlled": "dynapipe", "search": {"pp": [1, 2], "score_batches": 1, "simulate_top": 1}}\n' >"$tmp/dir/b.json"
expect scenario-dir 0 "\| b \| [^|]+ \| [0-9,]+ \| 1.00x" -- compare --scenario-dir "$tmp/dir" --iterations 1 --out "$tmp/dir-out"
check dir-results test -s "$tmp/dir-out/a/results.json" -a -s "$tmp/dir-out/b/report.html"
check dir-summary grep -q "| b |" "$tmp/dir-out/summary.md"
printf '{"bogus": 1}\n' >"$tmp/dir/c.json"
expect scenario-dir-bad 2 "c.json.*bogus" -- compare --scenario-dir "$tmp/dir" --out "$tmp/dir-out2"
mkdir -p "$tmp/empty"
expect scenario-dir-empty 2 "no \*.json" -- compare --scenario-dir "$tmp/empty"
mkdir -p "$tmp/twins"
printf '{"name": "same"}\n' >"$tmp/twins/a.json"
printf '{"name": "same"}\n' >"$tmp/twins/b.json"
expect scenario-dir-same-name 2 "a.json and .*b.json both have the name 'same'" -- compare --scenario-dir "$tmp/twins"

# Ctrl-C: a long run stops after the current batch, writes partial results and says so. The
# signal goes once the run has begun ("scenario:" is printed after the handler is installed; a
# fixed delay raced the startup on a slower machine), at most 60 s later.
"$sluice" compare --iterations all --no-html --out "$tmp/int" >"$tmp/int.log" 2>&1 &
pid=$!
for _ in $(seq 600); do
  grep -q "^scenario:" "$tmp/int.log" 2>/dev/null && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
sleep 1
kill -INT "$pid" 2>/dev/null
wait "$pid"
rc=$?
check interrupt-exit-code test "$rc" -eq 1
check interrupt-message grep -q "partial" "$tmp/int.log"
check interrupt-results grep -q '"partial": true' "$tmp/int/results.json"

# One vocabulary: --collectives as for `sluice simulate`; --closed-form is its deprecated alias.
expect collectives-closed-form 0 "wrote" -- \
  compare "${quick[@]}" --methods packing --collectives closed-form --no-html --out "$tmp/cf"
check collectives-in-results grep -q '"collectives": "closed-form"' "$tmp/cf/results.json"
expect collectives-deprecated-alias 0 "wrote" -- \
  compare "${quick[@]}" --methods packing --closed-form --no-html --out "$tmp/cf2"
check collectives-alias-in-results grep -q '"collectives": "closed-form"' "$tmp/cf2/results.json"
expect collectives-bad 2 "--collectives" -- compare --collectives ring "${quick[@]}" --out "$tmp/cf3"

finish
