#!/usr/bin/env bash
# Native fuzzing of the kernel with libFuzzer (tests/fuzz/: one target per *-fuzz.cc):
#   sdpa      forward() and the split-K path on random problems, against the double reference;
#             packed sequences (forward_packed), each sequence bitwise forward() on it alone
#   kv_cache  appends (float32 -> float16 narrowing), truncations and attention on a KV cache
#   backward  forward() then backward() on random problems (1, 2, 3 threads: the fused and the
#             split kernels, bitwise equal), against the double reference gradients; packed
#             sequences (backward_packed), each sequence bitwise backward() on it alone
# Usage: bash scripts/fuzz.sh [--seconds N] [target ...]     (npm run fuzz -- --seconds N)
#   N seconds of fuzzing PER TARGET (default 60), after the build (clang++-19, libFuzzer,
#   AddressSanitizer, UBSan; build/fuzz/cmake, rebuilt only when sources changed).
# Each target starts from its committed seed corpus tests/fuzz/corpus/<target>/ (read only)
# plus the working corpus build/fuzz/corpus/<target>/, where libFuzzer keeps the new inputs
# it finds (gitignored, kept between runs). The seeds: seed-* are a set cover of the edges
# reached by 300 random 40-119 byte inputs (libFuzzer -set_cover_merge=1 -use_counters=0;
# random bytes decode to random problems, see tests/fuzz/fuzz-values.h); regression-* are the
# inputs that found bugs (and their minimised forms), kept so that they are rerun every time.
# Before fuzzing, build/fuzz/cmake/fuzz_checker_cases runs the oracles' own regression cases
# (tests/fuzz/checker-cases.cc: correct results an oracle once rejected).
# A failing input is saved under build/fuzz/artifacts/; the script then exits non-zero,
# printing the path and the command that reproduces it. At the end: one line per target
# (executions, seconds, exec/s, corpus size, coverage) and build/fuzz/summary.json.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=60
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --seconds=*) seconds="${1#--seconds=}"; shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) targets+=("$1"); shift ;;
  esac
done
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [ "$seconds" -lt 1 ]; then
  echo "fuzz: --seconds wants a whole number of seconds >= 1, not '$seconds'" >&2
  exit 2
fi
if [ ${#targets[@]} -eq 0 ]; then
  for f in tests/fuzz/*-fuzz.cc; do
    name=$(basename "$f" -fuzz.cc)
    targets+=("${name//-/_}")
  done
fi

cxx=clang++-19
if ! command -v "$cxx" >/dev/null 2>&1 || [ -z "$(ls /usr/lib/llvm-19/lib/clang/19/lib/linux/libclang_rt.fuzzer-*.a 2>/dev/null)" ]; then
  echo "fuzz: needs $cxx and its libFuzzer runtime (Debian: clang-19, libclang-rt-19-dev): run bash scripts/setup.sh" >&2
  exit 1
fi

out=build/fuzz
build_started=$(date +%s)
# Configured every time (about 2 s): a configure that failed once (e.g. before SIMDe was
# installed) leaves a CMakeCache.txt behind.
cmake -S tests/fuzz -B "$out/cmake" -DCMAKE_CXX_COMPILER="$cxx" >/dev/null
cmake --build "$out/cmake" -j"$(nproc)" >"$out/build.log" 2>&1 || { cat "$out/build.log" >&2; echo "fuzz: build failed" >&2; exit 1; }
build_seconds=$(( $(date +%s) - build_started ))
echo "fuzz: built in ${build_seconds} s" >&2
# The oracles' own regression cases first (tests/fuzz/checker-cases.cc): a correct result
# they once rejected must pass.
"$out/cmake/fuzz_checker_cases" >&2 || { echo "fuzz: an oracle rejects one of its regression cases (tests/fuzz/checker-cases.cc)" >&2; exit 1; }
echo "fuzz: fuzzing ${#targets[@]} target(s), ${seconds} s each" >&2

mkdir -p "$out/artifacts" "$out/logs"
summary_lines=()
json_entries=()
failed=0
for target in "${targets[@]}"; do
  binary="$out/cmake/fuzz_$target"
  seeds="tests/fuzz/corpus/$target"
  work="$out/corpus/$target"
  log="$out/logs/$target.log"
  if [ ! -x "$binary" ]; then
    echo "fuzz: no target '$target' (expected $binary)" >&2
    exit 2
  fi
  mkdir -p "$work" "$seeds"
  started=$(date +%s)
  status=0
  # -max_len: a few KB (the targets draw bulk values from a seed, not from the input);
  # -timeout: one input over 30 s is a hang; the first corpus directory receives new inputs.
  "$binary" -max_total_time="$seconds" -max_len=4096 -timeout=30 -rss_limit_mb=4096 \
    -print_final_stats=1 -artifact_prefix="$out/artifacts/$target-" \
    "$work" "$seeds" >"$log" 2>&1 || status=$?
  elapsed=$(( $(date +%s) - started ))
  executions=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  per_second=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  # The last status line: "#N DONE cov: C ft: F corp: U/Sb ..." (or the last "pulse"/"NEW").
  last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
  coverage=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  features=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corpus=$(sed -n 's/.* corp: \([0-9]*\)\/.*/\1/p' <<<"$last")
  line=$(printf '%-9s %9s executions in %4d s (%6s exec/s), corpus %5s inputs, coverage %5s edges, %6s features' \
    "$target" "${executions:-?}" "$elapsed" "${per_second:-?}" "${corpus:-?}" "${coverage:-?}" "${features:-?}")
  summary_lines+=("$line")
  json_entries+=("$(printf '    {"target": "%s", "ok": %s, "executions": %s, "seconds": %d, "exec_per_second": %s, "corpus_inputs": %s, "coverage_edges": %s, "features": %s}' \
    "$target" "$([ $status -eq 0 ] && echo true || echo false)" "${executions:-null}" "$elapsed" "${per_second:-null}" \
    "${corpus:-null}" "${coverage:-null}" "${features:-null}")")
  if [ $status -ne 0 ]; then
    failed=1
    artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
    echo "" >&2
    grep -E -A3 '==== fuzz check failed|ERROR: (AddressSanitizer|UndefinedBehaviorSanitizer|libFuzzer)|runtime error' "$log" | head -20 >&2 || true
    echo "fuzz: $target FAILED (libFuzzer exit $status); log: $log" >&2
    if [ -n "$artifact" ]; then
      echo "fuzz: failing input: $artifact" >&2
      echo "fuzz: reproduce:     $binary $artifact" >&2
      echo "fuzz: minimise:      $binary -minimize_crash=1 -max_total_time=60 -exact_artifact_path=$artifact.min $artifact" >&2
    fi
  fi
done

{
  echo "{"
  echo "  \"date\": \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\","
  echo "  \"seconds_per_target\": $seconds,"
  echo "  \"build_seconds\": $build_seconds,"
  echo "  \"compiler\": \"$($cxx --version | head -1)\","
  echo "  \"targets\": ["
  for n in "${!json_entries[@]}"; do
    sep=","
    [ "$n" -eq $(( ${#json_entries[@]} - 1 )) ] && sep=""
    echo "${json_entries[$n]}$sep"
  done
  echo "  ]"
  echo "}"
} >"$out/summary.json"

echo "fuzz: summary (also $out/summary.json)"
for line in "${summary_lines[@]}"; do echo "  $line"; done
exit $failed
