#!/usr/bin/env bash
# Compiler wrapper for the relaxed-SIMD builds (CMakeLists.txt passes it to emcc with
# --compiler-wrapper). emcc 3.1.6 runs its own clang 14, whose headers lack
# wasm_f32x4_relaxed_madd and which emits an obsolete FMA opcode; this runs Debian's clang 19
# instead, with emcc's flags (its sysroot, defines, -mllvm -disable-lsr) and -mrelaxed-simd.
#   $1     the clang emcc chose (/usr/bin/clang++-14 or clang-14)
#   $2...  its arguments
# Drops -mllvm -enable-emscripten-sjlj (clang 19 names it differently; the sources use neither
# exceptions nor setjmp).
set -euo pipefail
compiler="$1"
shift
case "$(basename "$compiler")" in
  clang++*) clang=clang++-19 ;;
  *) clang=clang-19 ;;
esac
args=()
while [ $# -gt 0 ]; do
  if [ "$1" = "-mllvm" ] && [ "${2:-}" = "-enable-emscripten-sjlj" ]; then
    shift 2
    continue
  fi
  args+=("$1")
  shift
done
exec "$clang" "${args[@]}" -mrelaxed-simd
