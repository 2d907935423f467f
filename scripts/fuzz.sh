#!/usr/bin/env bash
# Builds the libFuzzer targets (clang-14, ASan + UBSan + LeakSanitizer) in build-fuzz/ and
# runs each for SECONDS (default 300), starting from the seed corpus in fuzz/corpus/<target>/.
# Exits non-zero if any target finds a crash, a leak, undefined behaviour or a hang (libFuzzer
# -timeout).
#
#   bash scripts/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-300}"
shift || true
targets=("$@")
if ((${#targets[@]} == 0)); then
  targets=(model_config_fuzzer cost_table_fuzzer data_reader_fuzzer schedule_csv_fuzzer
           plan_json_fuzzer simulate_fuzzer compare_scenario_fuzzer)
fi

bash scripts/setup.sh --fuzz >/dev/null
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER=clang++-14 -DSLUICE_FUZZ=ON \
  -DSLUICE_BUILD_TESTS=OFF -DSLUICE_BUILD_BENCH=OFF >/dev/null
cmake --build build-fuzz --target "${targets[@]}"

status=0
for t in "${targets[@]}"; do
  work="build-fuzz/corpus/$t"
  mkdir -p "$work"
  seeds="fuzz/corpus/$t"
  echo "== $t: ${seconds}s"
  # UBSan only reports by default; halt_on_error makes undefined behaviour a crash libFuzzer saves.
  if ! ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
      "build-fuzz/fuzz/$t" -max_total_time="$seconds" \
      -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="build-fuzz/$t-" "$work" $( [ -d "$seeds" ] && echo "$seeds" ) \
      2>"build-fuzz/$t.log"; then
    echo "   FAILED: see build-fuzz/$t.log and build-fuzz/$t-* artifacts"
    status=1
  fi
  grep -E '^stat::number_of_executed_units|^#[0-9]+.*DONE' "build-fuzz/$t.log" | tail -2 | \
    sed 's/^/   /'
done
exit $status
