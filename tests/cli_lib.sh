# Shared helpers of the end-to-end CLI test scripts (tests/*_cli_test.sh, tests/cli_test.sh).
# Source it after setting `sluice` (the binary under test); it makes the scratch folder `tmp`
# (removed on exit) and the counters.
#
#   expect NAME RC PATTERN -- ARGS...   runs "$sluice" ARGS, checks the exit code and that the
#                                       combined output matches the extended regex PATTERN
#   check NAME COMMAND...               a shell condition (e.g. on the files a run wrote)
#   finish [LABEL]                      prints the counts; exits non-zero when a case failed
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0

expect() {
  local name="$1" want_rc="$2" pattern="$3"
  shift 4
  local out rc
  out="$("$sluice" "$@" 2>&1)"
  rc=$?
  if [ "$rc" -ne "$want_rc" ]; then
    echo "FAIL $name: exit $rc, want $want_rc; output:"; echo "$out" | tail -20
    failed=$((failed + 1))
  elif ! grep -Eq -- "$pattern" <<<"$out"; then
    echo "FAIL $name: output does not match /$pattern/:"; echo "$out" | tail -20
    failed=$((failed + 1))
  else
    echo "ok   $name"
    passed=$((passed + 1))
  fi
}

check() {
  local name="$1"
  shift
  if "$@"; then
    echo "ok   $name"
    passed=$((passed + 1))
  else
    echo "FAIL $name: $*"
    failed=$((failed + 1))
  fi
}

finish() {
  echo
  echo "${1:+$1: }$passed passed, $failed failed"
  [ "$failed" -eq 0 ]
  exit $?
}
