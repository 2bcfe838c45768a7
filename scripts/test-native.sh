#!/usr/bin/env bash
# Native build of the same kernel source (SIMDe emulates wasm SIMD), with AddressSanitizer
# and UBSan, and its GoogleTest suite through ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
# Configured every time (2 s): a configure that failed once leaves a CMakeCache.txt behind.
cmake -S . -B build/native -DCMAKE_BUILD_TYPE=Debug -DSDPA_SANITIZE=ON >/dev/null
cmake --build build/native -j2
ctest --test-dir build/native --output-on-failure
