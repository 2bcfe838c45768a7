#!/usr/bin/env bash
# Builds the package into dist/: the wasm module (Emscripten, -msimd128, Embind) and the
# TypeScript API. Incremental: CMake and tsc rebuild only what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
export NODE_PATH=/usr/share/nodejs  # Emscripten 3.1.6 (Debian) finds acorn there

if [ ! -f build/wasm/CMakeCache.txt ]; then
  emcmake cmake -S . -B build/wasm -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CROSSCOMPILING_EMULATOR=/usr/bin/node >/dev/null
fi
cmake --build build/wasm -j2
npx tsc -p tsconfig.json
cp js/wasm/sdpa.d.mts js/wasm/sdpa-mt.d.mts js/wasm/sdpa-relaxed.d.mts js/wasm/sdpa-mt-relaxed.d.mts dist/wasm/
# sdpa-mt.worker.js is CommonJS; the package is "type": "module". Its Node branch requires
# fs and worker_threads: the "browser" map tells bundlers (webpack) there is nothing to bundle.
printf '{ "type": "commonjs", "browser": { "fs": false, "worker_threads": false } }\n' > dist/wasm/package.json
echo "build: dist/ ready ($(stat -c %s dist/wasm/sdpa.wasm) bytes of wasm)" >&2
