#!/usr/bin/env bash
# Installs what the build and tests need, only where it is missing, on Debian/Ubuntu:
#   apt: emscripten (emcc 3.1.6 with clang/lld/binaryen), clang-19 (the relaxed-SIMD builds'
#        compiler: scripts/clang19-relaxed.sh; emcc's own wasm-ld links them, so no lld-19),
#        clang-19's libFuzzer runtime (scripts/fuzz.sh), cmake, g++, GoogleTest, SIMDe
#   npm: the locked devDependencies (npm ci), when node_modules is missing or stale.
# The build uses Debian's Emscripten 3.1.6 (/usr/bin/emcc; scripts/build.sh), whatever else is on
# PATH: its output is post-processed as 3.1.6 writes it (scripts/minify-glue.mjs, patch-pool-worker.mjs).
set -euo pipefail
cd "$(dirname "$0")/.."

# Node itself is not installed here (npm is already running this): it must be 20 or newer
# (package.json's engines; Debian 12's own nodejs is 18, which npm would only warn about).
node_major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$node_major" -lt 20 ]; then
  echo "setup: Node $(node --version) is too old: sdpa-wasm needs Node 20 or newer (e.g. from nodejs.org or NodeSource)" >&2
  exit 1
fi

need=()
[ -x /usr/bin/emcc ] || need+=(emscripten)
command -v clang++-19 >/dev/null 2>&1 || need+=(clang-19)
ls /usr/lib/llvm-19/lib/clang/19/lib/linux/libclang_rt.fuzzer-*.a >/dev/null 2>&1 || need+=(libclang-rt-19-dev)
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v g++ >/dev/null 2>&1 || need+=(g++)
command -v make >/dev/null 2>&1 || need+=(make)
[ -f /usr/include/gtest/gtest.h ] || need+=(libgtest-dev)
[ -f /usr/include/simde/wasm/simd128.h ] || need+=(libsimde-dev)
if [ ${#need[@]} -gt 0 ]; then
  bash scripts/apt-install.sh setup "${need[@]}"
fi

# --include=dev: with NODE_ENV=production (many Node images) npm ci would leave them out.
if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ] \
  || [ ! -x node_modules/.bin/tsc ]; then
  echo "setup: npm ci" >&2
  npm ci --include=dev --no-audit --no-fund
fi
