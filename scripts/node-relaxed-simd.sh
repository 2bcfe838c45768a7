#!/usr/bin/env bash
# Prints the Node flag that turns WebAssembly relaxed SIMD on where this Node needs one
# (Node 20: --experimental-wasm-relaxed-simd; Node 22+ has it on and prints nothing), or with
# `off`, the flag that turns it off where it is on by default (Node 22+:
# --no-experimental-wasm-relaxed-simd; Node 20 prints nothing). Each is checked by validating a
# module that uses f32x4.relaxed_madd. The flags are V8 options, which NODE_OPTIONS refuses:
# callers put them on the node command line.
set -euo pipefail
probe='WebAssembly.validate(new Uint8Array([0,97,115,109,1,0,0,0,1,5,1,96,0,1,123,3,2,1,0,10,61,1,59,0,253,12,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,253,12,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,253,12,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,253,133,2,11]))'
if [ "${1:-on}" = off ]; then
  node -e "process.exit(${probe} ? 1 : 0)" && exit 0
  if node --no-experimental-wasm-relaxed-simd -e "process.exit(${probe} ? 1 : 0)" 2>/dev/null; then
    echo "--no-experimental-wasm-relaxed-simd"
    exit 0
  fi
  echo "node-relaxed-simd: this Node cannot turn relaxed SIMD off" >&2
  exit 1
fi
if node -e "process.exit(${probe} ? 0 : 1)"; then
  exit 0
fi
if node --experimental-wasm-relaxed-simd -e "process.exit(${probe} ? 0 : 1)" 2>/dev/null; then
  echo "--experimental-wasm-relaxed-simd"
  exit 0
fi
echo "node-relaxed-simd: this Node cannot run relaxed SIMD" >&2
exit 1
