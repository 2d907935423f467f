#!/usr/bin/env bash
# End-to-end checks of `sluice optimize` and --optimize-budget-ms: exit codes (0 written, 2 bad
# usage or input), the output path checked before the search and never the input, messages that
# name the flag and the allowed values, an optimized plan that passes `sluice plan check` and
# simulates no longer than its input, and recompute moves with --data.
#
#   tests/optimize_cli_test.sh PATH/TO/sluice
set -u
sluice="$1"
. "$(dirname "$0")/cli_lib.sh"

# The default scenario (gpt-6.7b, dp 2 x pp 4, mixture-4task), one batch.
"$sluice" plan --iterations 1 --show 0 --out "$tmp/plan.json" >/dev/null 2>&1
check plan-made test -s "$tmp/plan.json"

expect optimize-help 0 "--budget-ms" -- optimize --help
expect optimize-ok 0 "simulated iteration .* -> .*shorter" -- optimize "$tmp/plan.json" --out "$tmp/o.json" --steps 20 --budget-ms 100000 --seed 3
check optimized-valid "$sluice" plan check "$tmp/o.json"
# Deterministic for a seed when the step bound ends the search.
"$sluice" optimize "$tmp/plan.json" --out "$tmp/o2.json" --steps 20 --budget-ms 100000 --seed 3 >/dev/null 2>&1
check optimize-deterministic cmp -s "$tmp/o.json" "$tmp/o2.json"
# Never longer than the input, by the simulator with the same collectives.
before="$("$sluice" simulate "$tmp/plan.json" --collectives closed-form | sed -n 's/^iteration \([0-9.]*\) ms.*/\1/p')"
after="$("$sluice" simulate "$tmp/o.json" --collectives closed-form | sed -n 's/^iteration \([0-9.]*\) ms.*/\1/p')"
check optimize-not-longer awk -v a="$after" -v b="$before" 'BEGIN { exit !(a != "" && a <= b) }'
expect optimize-greedy-msgpack 0 "search greedy" -- optimize "$tmp/plan.json" --out "$tmp/o.msgpack" --search greedy --steps 10 --budget-ms 100000
expect optimize-recompute 0 "wrote" -- optimize "$tmp/plan.json" --out "$tmp/o3.json" --data mixture-4task --steps 10 --budget-ms 100000
# With --data the micro-batch order is searched too (the plan relowered), and the time per kind of
# candidate is printed; deterministic for a seed when the step and estimate bounds end the search.
expect optimize-order 0 "kind reorder-microbatches: [0-9]+ tried" -- optimize "$tmp/plan.json" --out "$tmp/o5.json" --data mixture-4task --steps 10 --budget-ms 100000 --order-estimates 400
check optimize-order-valid "$sluice" plan check "$tmp/o5.json"
"$sluice" optimize "$tmp/plan.json" --out "$tmp/o6.json" --data mixture-4task --steps 10 --budget-ms 100000 --order-estimates 400 >/dev/null 2>&1
check optimize-order-deterministic cmp -s "$tmp/o5.json" "$tmp/o6.json"
expect optimize-order-exhaustive 0 "wrote" -- optimize "$tmp/plan.json" --out "$tmp/o7.json" --data mixture-4task --steps 1 --budget-ms 100000 --order-exhaustive-up-to 4
expect optimize-order-bad 2 "--order-exhaustive-up-to" -- optimize "$tmp/plan.json" --out "$tmp/x.json" --data mixture-4task --order-exhaustive-up-to 11
expect optimize-order-estimates-bad 2 "--order-estimates" -- optimize "$tmp/plan.json" --out "$tmp/x.json" --order-estimates -1
expect optimize-order-share 0 "kind reorder-microbatches: [0-9]+ tried" -- optimize "$tmp/plan.json" --out "$tmp/o8.json" --data mixture-4task --steps 10 --budget-ms 100000 --order-estimates 400 --order-share 0.3
expect optimize-order-share-zero 2 "--order-share: .*allowed: a number in \\(0, 1\\]" -- optimize "$tmp/plan.json" --out "$tmp/x.json" --order-share 0
expect optimize-order-share-big 2 "--order-share" -- optimize "$tmp/plan.json" --out "$tmp/x.json" --order-share 1.5
expect optimize-placed-order-share 0 "wrote" -- optimize "$tmp/plan.json" --out "$tmp/o9.json" --data mixture-4task --steps 10 --budget-ms 100000 --order-estimates 400 --placed-order-share 0
expect optimize-placed-order-share-big 2 "--placed-order-share: .*allowed: a number in \\[0, 1\\]" -- optimize "$tmp/plan.json" --out "$tmp/x.json" --placed-order-share 1.5
expect optimize-placed-order-share-negative 2 "--placed-order-share" -- optimize "$tmp/plan.json" --out "$tmp/x.json" --placed-order-share -0.1
# dPRO's uniform draw of candidates, beside the default draw by kind.
expect optimize-draw-uniform 0 "wrote" -- optimize "$tmp/plan.json" --out "$tmp/o10.json" --steps 10 --budget-ms 100000 --draw uniform
check optimize-draw-uniform-valid "$sluice" plan check "$tmp/o10.json"
# --data is clipped at --max-seqlen (default 2048, as the plan's); a plan longer than it was made
# with a larger one.
expect optimize-max-seqlen 0 "wrote" -- optimize "$tmp/plan.json" --out "$tmp/o4.json" --data mixture-4task --max-seqlen 2048 --steps 10 --budget-ms 100000
expect optimize-max-seqlen-short 2 "made with a larger --max-seqlen" -- optimize "$tmp/plan.json" --out "$tmp/x.json" --data mixture-4task --max-seqlen 256
expect optimize-max-seqlen-bad 2 "--max-seqlen" -- optimize "$tmp/plan.json" --out "$tmp/x.json" --data mixture-4task --max-seqlen 0

# Bad usage and input: exit 2, one message naming the flag or file.
expect optimize-no-out 2 "--out is required" -- optimize "$tmp/plan.json"
expect optimize-onto-input 2 "--out" -- optimize "$tmp/plan.json" --out "$tmp/plan.json"
check input-intact "$sluice" plan check "$tmp/plan.json"
expect optimize-bad-dir 2 "--out" -- optimize "$tmp/plan.json" --out "$tmp/no/such/dir/o.json"
expect optimize-bad-search 2 "allowed values are mcmc, greedy" -- optimize "$tmp/plan.json" --out "$tmp/x.json" --search sa
expect optimize-bad-draw 2 "allowed values are by-kind, uniform" -- optimize "$tmp/plan.json" --out "$tmp/x.json" --draw random
expect optimize-bad-collectives 2 "allowed values are stepwise, closed-form" -- optimize "$tmp/plan.json" --out "$tmp/x.json" --collectives exact
expect optimize-zero-budget 2 "--budget-ms" -- optimize "$tmp/plan.json" --out "$tmp/x.json" --budget-ms 0
expect optimize-bad-steps 2 "--steps" -- optimize "$tmp/plan.json" --out "$tmp/x.json" --steps -1
expect optimize-missing-plan 2 "no-such-plan.json" -- optimize "$tmp/no-such-plan.json" --out "$tmp/x.json"
echo '{"format": "sluice-plan/1"}' > "$tmp/broken.json"
expect optimize-broken-plan 2 "broken.json" -- optimize "$tmp/broken.json" --out "$tmp/x.json"
check nothing-written test ! -e "$tmp/x.json"

# The planner option: plan prints the optimizer's summary; 0 keeps it off.
expect plan-optimize 0 "optimizer: mean simulated iteration" -- plan --iterations 1 --show 0 --optimize-budget-ms 20
expect plan-optimize-bad 2 "--optimize-budget-ms" -- plan --iterations 1 --optimize-budget-ms -5

finish optimize_cli_test
