#!/usr/bin/env bash
# Installs what the build and tests need, only where it is missing, on Debian/Ubuntu:
#   apt: emscripten (emcc 3.1.6 with clang/lld/binaryen), clang-19 and lld-19 (the relaxed-SIMD
#        builds: scripts/clang19-relaxed.sh), clang-19's libFuzzer runtime (scripts/fuzz.sh),
#        cmake, g++, GoogleTest, SIMDe, wabt
#   npm: the locked devDependencies (npm ci), when node_modules is missing or stale.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v emcc >/dev/null 2>&1 || need+=(emscripten)
command -v clang++-19 >/dev/null 2>&1 || need+=(clang-19)
command -v wasm-ld-19 >/dev/null 2>&1 || need+=(lld-19)
ls /usr/lib/llvm-19/lib/clang/19/lib/linux/libclang_rt.fuzzer-*.a >/dev/null 2>&1 || need+=(libclang-rt-19-dev)
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v g++ >/dev/null 2>&1 || need+=(g++)
command -v make >/dev/null 2>&1 || need+=(make)
[ -f /usr/include/gtest/gtest.h ] || need+=(libgtest-dev)
[ -f /usr/include/simde/wasm/simd128.h ] || need+=(libsimde-dev)
command -v wasm2wat >/dev/null 2>&1 || need+=(wabt)
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]} with apt-get" >&2
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${need[@]}"
fi

if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  echo "setup: npm ci" >&2
  npm ci --no-audit --no-fund
fi
