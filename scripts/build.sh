#!/usr/bin/env bash
# Builds the package into dist/: the wasm module (Emscripten, -msimd128, Embind) and the
# TypeScript API. Incremental: CMake and tsc rebuild only what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
export NODE_PATH=/usr/share/nodejs  # Emscripten 3.1.6 (Debian) finds acorn there
# Both are set up by scripts/setup.sh (npm start and npm test run it first; npm run build does not).
# Debian's Emscripten 3.1.6, not another emcc on PATH (scripts/setup.sh says why).
if [ ! -x /usr/bin/emcmake ] || [ ! -x node_modules/.bin/tsc ]; then
  echo "build: Emscripten (Debian's, /usr/bin/emcmake) or node_modules (TypeScript) is missing: run npm run setup first" >&2
  exit 1
fi

# Configured every time (2 s): a configure that failed once (say, before setup installed make)
# leaves a CMakeCache.txt behind, and the build's directories must exist (dist/ may have been removed).
/usr/bin/emcmake cmake -S . -B build/wasm -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CROSSCOMPILING_EMULATOR=/usr/bin/node >/dev/null
mkdir -p dist/wasm
cmake --build build/wasm -j2
# tsc only writes: the outputs of a removed or renamed js/*.ts would stay (and be packed) unless removed first.
find dist -maxdepth 1 -type f \( -name '*.js' -o -name '*.d.ts' \) -delete
node_modules/.bin/tsc -p tsconfig.json
cp js/wasm/sdpa.d.mts js/wasm/sdpa-mt.d.mts js/wasm/sdpa-relaxed.d.mts js/wasm/sdpa-mt-relaxed.d.mts dist/wasm/
# sdpa-mt.worker.js is CommonJS; the package is "type": "module". Its Node branch requires
# fs and worker_threads: the "browser" map tells bundlers (webpack) there is nothing to bundle.
printf '{ "type": "commonjs", "browser": { "fs": false, "worker_threads": false } }\n' > dist/wasm/package.json
echo "build: dist/ ready ($(stat -c %s dist/wasm/sdpa.wasm) bytes of wasm)" >&2
