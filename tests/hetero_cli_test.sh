#!/usr/bin/env bash
# End-to-end checks of `sluice hetero`: a heterogeneous mix planned and simulated on the default
# scenario (one batch), the search, and bad specs: exit 2 with one message naming the flag, the
# group and field, and the allowed values.
#
#   tests/hetero_cli_test.sh PATH/TO/sluice
set -u
sluice="$1"
. "$(dirname "$0")/cli_lib.sh"

mix='dp=1,tp=4,zero=1;dp=2,tp=2,zero=1'
expect hetero-help 0 "--replicas" -- hetero --help
expect hetero-mix 0 "summary: 1 of 1 batches ran; sluice-hetero [0-9]+ real tokens/s" -- hetero --replicas "$mix" --iterations 1
expect hetero-reduction-groups 0 "layers +0-31 +\+emb \+head .* g1:s0 g2:s0" -- hetero --replicas "$mix" --iterations 1
echo '{"replicas": [{"dp": 1, "tp": 4, "zero": 1}, {"dp": 1, "tp": 2, "pp": 2, "zero": 1}]}' >"$tmp/mix.json"
expect hetero-json 0 "layers +16-31 .* g1:s0 g2:s1" -- hetero --replicas "$tmp/mix.json" --iterations 1
expect hetero-out 0 "wrote $tmp/h.json" -- hetero --replicas "$tmp/mix.json" --iterations 1 --out "$tmp/h.json"
check hetero-out-groups /usr/bin/python3 -c "
import json, sys
h = json.load(open('$tmp/h.json'))
assert h['format'] == 'sluice-hetero-plan/1' and len(h['groups']) == 2, h.keys()
assert [r['first_layer'] for r in h['reductions']] == [0, 16]
assert [[m['stage'] for m in r['members']] for r in h['reductions']] == [[0, 0], [0, 1]]
for i, g in enumerate(h['groups']):
    json.dump(g, open('$tmp/g%d.json' % i, 'w'))
"
check hetero-out-groups-valid "$sluice" plan check "$tmp/g0.json" "$tmp/g1.json"
expect hetero-search 0 "best mix: .* \+ " -- hetero --search --iterations 1 --top 1 --scenario "$(dirname "$0")/../examples/compare-small.json"
# The compare-only fields of a scenario are named, not silently dropped.
expect hetero-ignored-fields 0 "warning: .*compare-small.json: sluice hetero ignores field\(s\) methods " -- hetero --search --iterations 1 --top 1 --scenario "$(dirname "$0")/../examples/compare-small.json"

# Bad specs.
expect hetero-not-covering 2 "--replicas: the replica groups use 6 devices .* has 8; .*allowed: groups summing to 8" -- hetero --replicas 'dp=1,tp=4,zero=1;dp=1,tp=2,zero=1' --iterations 1
expect hetero-bad-key 2 "--replicas: group 2 'dp=2,tq=2': field 'tq'.*allowed keys" -- hetero --replicas 'dp=1,tp=4;dp=2,tq=2' --iterations 1
expect hetero-bad-zero 2 "group 2: field 'zero' is 2 but group 1's is 1.*allowed: 1" -- hetero --replicas 'dp=1,tp=4,zero=1;dp=2,tp=2,zero=2' --iterations 1
expect hetero-zero3 2 "group 1: field 'zero' is 3.*allowed: 0, 1, 2" -- hetero --replicas 'dp=1,tp=4,zero=3;dp=2,tp=2,zero=3' --iterations 1
expect hetero-bad-tp 2 "group 1.*tp = 3" -- hetero --replicas 'dp=1,tp=3;dp=5,tp=1' --iterations 1
expect hetero-no-file 2 "--replicas 'nofile': expected replica groups .* no such file" -- hetero --replicas nofile
expect hetero-states 2 "--replicas: group 2 \(2 x tp 2\).*model states" -- hetero --replicas 'dp=1,tp=4;dp=2,tp=2' --iterations 1
expect hetero-cannot-hold 2 "--replicas: no replica group holds the run's longest sample \(2048 tokens.*allowed: at least one group holding 2048 tokens" -- hetero --replicas 'dp=1,tp=4,memory_limit_mb=27500;dp=1,tp=4,memory_limit_mb=27500' --iterations 3
expect hetero-neither 2 "give exactly one" -- hetero --iterations 1
expect hetero-both 2 "give exactly one" -- hetero --search --replicas "$mix"
echo '{"name": "t5", "model": "t5-11b", "cluster": "a100-40g:8"}' >"$tmp/t5.json"
expect hetero-enc-dec 2 "decoder-only" -- hetero --replicas 'dp=1,tp=4,zero=1;dp=2,tp=2,zero=1' --scenario "$tmp/t5.json"
finish hetero_cli_test
