#!/usr/bin/env bash
# Prints the Node flag that turns on WebAssembly relaxed SIMD where this Node needs one
# (Node 20: --experimental-wasm-relaxed-simd; Node 22+ has it on and prints nothing). The flag
# is a V8 option, which NODE_OPTIONS refuses: callers put it on the node command line.
set -euo pipefail
probe='WebAssembly.validate(new Uint8Array([0,97,115,109,1,0,0,0,1,5,1,96,0,1,123,3,2,1,0,10,61,1,59,0,253,12,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,253,12,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,253,12,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,253,133,2,11]))'
if node -e "process.exit(${probe} ? 0 : 1)"; then
  exit 0
fi
if node --experimental-wasm-relaxed-simd -e "process.exit(${probe} ? 0 : 1)" 2>/dev/null; then
  echo "--experimental-wasm-relaxed-simd"
  exit 0
fi
echo "node-relaxed-simd: this Node cannot run relaxed SIMD" >&2
exit 1
