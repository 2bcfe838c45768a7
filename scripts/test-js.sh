#!/usr/bin/env bash
# The Jest suite (tests/node/) on the built package, once per instruction set:
#   1. the portable SIMD128 build: Node with relaxed SIMD off (Node 20 as it is; a Node that
#      has it on by default gets scripts/node-relaxed-simd.sh off's flag);
#   2. the relaxed-SIMD build: Node with relaxed SIMD on (scripts/node-relaxed-simd.sh), where
#      createAttention() picks sdpa-relaxed.wasm / sdpa-mt-relaxed.wasm.
# SDPA_TEST_ISA tells tests/node/isa.test.mjs which build each run must have picked. Extra
# arguments go to both Jest runs.
set -euo pipefail
cd "$(dirname "$0")/.."
jest=node_modules/jest/bin/jest.js
off=$(bash scripts/node-relaxed-simd.sh off)
echo "test-js: Jest on the portable build (simd128, node ${off:-(no flag needed)})" >&2
SDPA_TEST_ISA=simd128 node --experimental-vm-modules $off "$jest" "$@"
flag=$(bash scripts/node-relaxed-simd.sh)
echo "test-js: Jest on the relaxed-SIMD build (node ${flag:-(no flag needed)})" >&2
SDPA_TEST_ISA=relaxed-simd node --experimental-vm-modules $flag "$jest" "$@"
