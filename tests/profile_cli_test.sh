#!/usr/bin/env bash
# End-to-end checks of `sluice profile` (builds with libtorch only): a tiny grid writes a
# layer-cost-table/1 file that `sluice cost show --cost profiled:FILE` and `sluice plan` use, and
# bad flags exit 2 naming the flag and the allowed values.
#
#   tests/profile_cli_test.sh PATH/TO/sluice REPO_ROOT
set -u
sluice="$1"
root="$2"
. "$(dirname "$0")/cli_lib.sh"

table="$tmp/cpu.json"
expect profile-tiny 0 "wrote .*cpu.json \(2 recompute levels" -- profile --model gpt-tiny \
  --mbs 1,2 --seqlen 32,64 --recompute none,full --repeats 1 --warmup 0 --threads 1 --out "$table"
if grep -q 'layer-cost-table/1' "$table" && grep -q '1 intra-op thread' "$table" &&
  grep -q -- '--host-allocator cache' "$table"; then
  echo "ok   profile-file-header"; passed=$((passed + 1))
else
  echo "FAIL profile-file-header: $(head -c 300 "$table")"; failed=$((failed + 1))
fi
expect profile-host-allocator-unknown 2 "^sluice: error: --host-allocator: 'tcmalloc' is not a host allocator policy \(allowed: cache, system\)" -- \
  profile --model gpt-tiny --out "$tmp/unused.json" --host-allocator tcmalloc
expect cost-show-profiled 0 "profiled: .*cpu.json" -- cost show --model gpt-tiny \
  --cluster "$root/examples/cluster-cpu-2.json" --cost "profiled:$table" --seqlen 48 --mbs 2
expect cost-show-outside 0 "infeasible" -- cost show --model gpt-tiny \
  --cluster "$root/examples/cluster-cpu-2.json" --cost "profiled:$table" --seqlen 128 --mbs 2
expect cost-show-other-model 2 "hidden" -- cost show --model gpt-6.7b --cost "profiled:$table"
expect plan-profiled 0 "\(2 planned, 0 out of memory\)" -- plan --model gpt-tiny --cluster \
  "$root/examples/cluster-cpu-2.json" --parallel pp=2 --tokens-per-batch 256 --max-seqlen 64 \
  --iterations 2 --cost "profiled:$table" --show 0

# MoE layers and the all-to-all link (2 local ranks on a random port).
moe="$tmp/moe.json"
a2a="$tmp/a2a-cluster.json"
export MASTER_PORT=$((29950 + RANDOM % 40))
expect profile-moe-a2a 0 "wrote .*moe.json \(1 recompute level" -- profile \
  --model gpt-tiny-moe --mbs 1,2 --seqlen 16,32 --repeats 5 --warmup 1 --threads 1 \
  --all-to-all 2 --cluster-out "$a2a" --out "$moe"
unset MASTER_PORT
if grep -q '"moe_encoder_forward"' "$moe" && grep -q '"intra_node"' "$a2a" &&
   grep -q '"experts_sliced_backward"' "$moe"; then
  echo "ok   profile-moe-files"; passed=$((passed + 1))
else
  echo "FAIL profile-moe-files: $(head -c 300 "$moe") / $(head -c 300 "$a2a")"; failed=$((failed + 1))
fi
expect plan-moe-profiled 0 "\(2 planned, 0 out of memory\)" -- plan --model gpt-tiny-moe \
  --cluster "$a2a" --parallel dp=2,ep=2 --tokens-per-batch 600 --max-seqlen 32 --iterations 2 \
  --cost "profiled:$moe" --show 0 --out "$tmp/moe-plan.json"
# The slice overhead the profile measured travels in the plans (ep > 1) and prices the slices.
expect plan-moe-slice-overhead 0 "measured by the plan's cost model" -- simulate \
  "$tmp/moe-plan-0.json" --moe-overlap all
expect cost-show-moe-table-dense-model 2 "field 'model.moe': the table profiles MoE layers" -- \
  cost show --model gpt-tiny --cost "profiled:$moe" --seqlen 16 --mbs 1
expect bad-all-to-all 2 "--all-to-all: 1 ranks \(allowed: 2 to 8" -- profile --all-to-all 1 \
  --cluster-out "$tmp/c.json" --out "$tmp/x.json"
expect all-to-all-no-cluster-out 2 "--all-to-all: give --cluster-out FILE" -- profile \
  --all-to-all 2 --out "$tmp/x.json"
expect cluster-out-alone 2 "--cluster-out: needs --all-to-all N" -- profile \
  --cluster-out "$tmp/c.json" --out "$tmp/x.json"
expect all-to-all-not-a-number 2 "--all-to-all: 'abc' is not an integer; allowed: 0 \(no all-to-all\) or 2 to 8 local ranks" -- \
  profile --all-to-all abc --cluster-out "$tmp/c.json" --out "$tmp/x.json"
expect all-to-all-huge 2 "--all-to-all: 99999999999999999999 is out of range" -- \
  profile --all-to-all 99999999999999999999 --cluster-out "$tmp/c.json" --out "$tmp/x.json"
# Two outputs on one file not written yet (it used to measure, then overwrite the link).
expect cluster-out-is-out 2 "--cluster-out '.*new-same.json' and --out '.*new-same.json' are the same file" -- \
  profile --all-to-all 2 --cluster-out "$tmp/new-same.json" --out "$tmp/./new-same.json"

# sluice train's number flags (rejected before any process starts).
expect train-lr-nan 2 "--lr: 'nan' is not allowed; allowed: a number in \(0, 1000\]" -- train --lr nan
expect train-threads-negative 2 "--threads: '-1' is not allowed" -- train --threads -1
# sluice train --replicas (heterogeneous replica groups): what the runtime does not run.
expect train-replicas-tp 2 "--replicas: group 2 .*tp = 2 is not run by the runtime's heterogeneous replicas \\(allowed: tp = 1\\)" -- train --replicas 'dp=1,pp=2;dp=1,tp=2'
expect train-replicas-key 2 "--replicas: group 2 'bogus=1': field 'bogus': unknown key" -- train --replicas 'dp=1,pp=2;bogus=1'
expect train-replicas-parallel 2 "--replicas and --parallel: give one" -- train --replicas 'dp=1,pp=2' --parallel dp=2
expect train-replicas-nproc 2 "--replicas: the replica groups .* need 3 processes, but the job has 4" -- train --replicas 'dp=1,pp=2;dp=1' --nproc 4
expect train-replicas-vpp 2 "vpp = 2 is not run .*allowed: vpp = 1" -- train --replicas 'dp=1,pp=2;dp=1,vpp=2'
expect train-replicas-partial 2 "--replicas with --allow-partial" -- train --replicas 'dp=1,pp=2;dp=1' --allow-partial
expect train-replicas-t5 2 "--replicas: heterogeneous replicas support decoder-only models" -- train --model t5-tiny --replicas 'dp=1,pp=2;dp=1'
expect train-cp-t5 2 "--parallel: model .t5-tiny.: cp = 2 needs a decoder-only model" -- train --model t5-tiny --parallel cp=2 --nproc 2
# sluice train --moe-overlap: what the runtime executes (docs/moe.md, "Segmented ops in the runtime").
expect train-moe-overlap-name 2 "--moe-overlap 'bogus' is not an MoE overlap; allowed: none, tutel, megatron, dw, partition, lancet, lancet-megatron" -- train --model gpt-tiny-moe --parallel dp=2,ep=2 --moe-overlap bogus
expect train-moe-overlap-dense 2 "--moe-overlap dw: needs an MoE model with expert parallelism .*model 'gpt-tiny' at ep 1" -- train --moe-overlap dw
expect train-moe-overlap-megatron-pp 2 "--moe-overlap megatron: .*needs pp = 1 \(--parallel has pp = 2\)" -- train --model gpt-tiny-moe --parallel dp=2,pp=2,ep=2 --moe-overlap megatron
expect train-moe-overlap-tutel-zb 2 "--moe-overlap tutel: the runtime runs capacity slices in forward and backward ops, not in a split backward \(--schedule zb-h1" -- train --model gpt-tiny-moe --parallel dp=2,pp=2,ep=2 --schedule zb-h1 --moe-overlap tutel
expect train-moe-overlap-replicas 2 "--replicas with --moe-overlap" -- train --replicas 'dp=1,pp=2;dp=1' --moe-overlap dw
expect bad-mbs 2 "--mbs: micro-batch size 0 is out of range \(allowed: 1 to" -- profile --mbs 0,1 --out "$tmp/x.json"
expect bad-seqlen 2 "--seqlen: .*4097.*max_position" -- profile --seqlen 4097 --out "$tmp/x.json"
expect bad-recompute 2 "--recompute: 'some'.*none, selective, full" -- profile --recompute some --out "$tmp/x.json"
expect bad-repeats 2 "--repeats" -- profile --repeats 0 --out "$tmp/x.json"
expect bad-threads 2 "--threads" -- profile --threads -1 --out "$tmp/x.json"
expect bad-dec-seqlen 2 "--dec-seqlen.*decoder-only" -- profile --dec-seqlen 16 --out "$tmp/x.json"
expect bad-model 2 "SwiGLU" -- profile --model llama-7b --out "$tmp/x.json"
expect no-out 2 "--out" -- profile --mbs 1
expect bad-out-dir 2 "--out '$tmp/missing/x.json': the folder '$tmp/missing' does not exist" -- profile --out "$tmp/missing/x.json"

finish
