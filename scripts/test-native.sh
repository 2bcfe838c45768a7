#!/usr/bin/env bash
# Native build of the same kernel source (SIMDe emulates wasm SIMD), with AddressSanitizer
# and UBSan, and its GoogleTest suite through ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f build/native/CMakeCache.txt ]; then
  cmake -S . -B build/native -DCMAKE_BUILD_TYPE=Debug -DSDPA_SANITIZE=ON >/dev/null
fi
cmake --build build/native -j2
ctest --test-dir build/native --output-on-failure
