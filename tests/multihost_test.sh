#!/usr/bin/env bash
# A two-host `sluice train`: two network namespaces joined by a veth pair, with private
# addresses used only inside them (10.213.7.1 and 10.213.7.2), two ranks in each, dp 2 x pp 2
# across them. Checks that:
#   - the job trains and its losses equal the one-host run's (--nproc 4 on 127.0.0.1);
#   - the store (rank 0, MASTER_ADDR=10.213.7.1) and every Gloo socket listen on their host's
#     address only, never on 0.0.0.0 / [::] (`ss -ltn` in each namespace during the run);
#   - the Gloo device follows the route to MASTER_ADDR (host 1, no flag) and --iface (host 2).
# Needs root (CAP_NET_ADMIN) to create namespaces: otherwise it prints why and exits 77
# (ctest: skipped).
#
#   tests/multihost_test.sh PATH/TO/sluice
set -u
sluice="$(readlink -f "$1")"
tag="sl$$"
ns1="$tag-h1"
ns2="$tag-h2"
tmp="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  ip netns del "$ns1" 2>/dev/null
  ip netns del "$ns2" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT

if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null || ! ip netns add "$ns1" 2>"$tmp/err"; then
  echo "SKIP: cannot create network namespaces (needs root and iproute2): $(cat "$tmp/err" 2>/dev/null)"
  exit 77
fi
ip netns add "$ns2" || exit 1
ip link add "${tag}a" type veth peer name "${tag}b" || exit 1
ip link set "${tag}a" netns "$ns1"
ip link set "${tag}b" netns "$ns2"
ip -n "$ns1" addr add 10.213.7.1/24 dev "${tag}a"
ip -n "$ns2" addr add 10.213.7.2/24 dev "${tag}b"
for ns in "$ns1" "$ns2"; do
  ip -n "$ns" link set lo up
done
ip -n "$ns1" link set "${tag}a" up
ip -n "$ns2" link set "${tag}b" up

port=29555
common=(train --model gpt-tiny --parallel dp=2,pp=2 --data mixture-4task --tokens-per-batch 1200
        --max-seqlen 96 --memory-limit 55 --iterations 3 --threads 1 --timeout 60 --seed 7)
failed=0

# Two hosts: ranks 0 and 1 on host 1 (the store's), 2 and 3 on host 2.
start=$(date +%s.%N)
for r in 0 1 2 3; do
  ns=$ns1
  extra=()
  if [ "$r" -ge 2 ]; then ns=$ns2; extra=(--iface "${tag}b"); fi
  ip netns exec "$ns" env RANK=$r WORLD_SIZE=4 LOCAL_RANK=$((r % 2)) LOCAL_WORLD_SIZE=2 \
    MASTER_ADDR=10.213.7.1 MASTER_PORT=$port \
    "$sluice" "${common[@]}" "${extra[@]}" --run-id two-hosts \
    $([ "$r" = 0 ] && echo --metrics "$tmp/two.jsonl") >"$tmp/rank$r.log" 2>&1 &
  pids+=($!)
done
# While it runs: every socket that listens in either namespace (Gloo's listen only while
# pairs connect, so sample until the ranks exit).
: >"$tmp/ss1.txt"
: >"$tmp/ss2.txt"
any_running() {  # a background rank that has not exited (zombies do not count)
  local p st
  for p in "$@"; do
    st=$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null)
    [ -n "$st" ] && [ "$st" != Z ] && return 0
  done
  return 1
}
sample_until=$(( $(date +%s) + 120 ))
while any_running "${pids[@]}" && [ "$(date +%s)" -lt "$sample_until" ]; do
  ip netns exec "$ns1" ss -Hltn >>"$tmp/ss1.txt"
  ip netns exec "$ns2" ss -Hltn >>"$tmp/ss2.txt"
  sleep 0.02
done
sort -u -o "$tmp/ss1.txt" "$tmp/ss1.txt"
sort -u -o "$tmp/ss2.txt" "$tmp/ss2.txt"
rc_all=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || { echo "rank $i exited with $?"; rc_all=1; }
done
pids=()
echo "two-host run: $(echo "$(date +%s.%N) - $start" | bc) s"
if [ "$rc_all" != 0 ]; then
  echo "FAIL two-host run:"; tail -n 5 "$tmp"/rank*.log; failed=$((failed + 1))
else
  echo "ok   two-host run (dp 2 x pp 2, ranks 0-1 in $ns1, 2-3 in $ns2)"
fi
echo "listened in host 1 (sampled during the run):"; cat "$tmp/ss1.txt"
echo "listened in host 2 (sampled during the run):"; cat "$tmp/ss2.txt"
if grep -q "10.213.7.1:$port " "$tmp/ss1.txt"; then
  echo "ok   store listens on 10.213.7.1:$port"
else
  echo "FAIL store not listening on 10.213.7.1:$port"; failed=$((failed + 1))
fi
# Every listening socket (the store and Gloo's) is bound to its host's address only.
bad=$(awk '{print $4}' "$tmp/ss1.txt" | grep -v '^10\.213\.7\.1:' ; \
      awk '{print $4}' "$tmp/ss2.txt" | grep -v '^10\.213\.7\.2:')
if [ -z "$bad" ]; then
  echo "ok   nothing listens on a wildcard address (0.0.0.0, [::], *)"
else
  echo "FAIL sockets on other addresses: $bad"; failed=$((failed + 1))
fi

# One host: the same job with --nproc 4 on 127.0.0.1.
MASTER_PORT=$port "$sluice" "${common[@]}" --nproc 4 --metrics "$tmp/one.jsonl" >"$tmp/one.log" 2>&1 \
  || { echo "FAIL one-host run"; tail -n 5 "$tmp/one.log"; failed=$((failed + 1)); }
if /usr/bin/python3 - "$tmp/one.jsonl" "$tmp/two.jsonl" <<'EOF'
import json, sys
one = [json.loads(l)["loss"] for l in open(sys.argv[1])]
two = [json.loads(l)["loss"] for l in open(sys.argv[2])]
print("losses one host:", one)
print("losses two hosts:", two)
ok = len(one) == 3 and len(one) == len(two) and all(abs(a - b) <= 1e-6 * abs(a) for a, b in zip(one, two))
sys.exit(0 if ok else 1)
EOF
then
  echo "ok   losses equal the one-host run"
else
  echo "FAIL losses differ"; failed=$((failed + 1))
fi
echo
echo "multihost: $failed failed"
[ "$failed" -eq 0 ]
