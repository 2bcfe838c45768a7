// Drops the "name" custom section (function names, for profilers and stack traces) from
// .wasm files in place; every other section is copied byte for byte.
//   node scripts/strip-wasm-names.mjs FILE.wasm...
// The relaxed-SIMD builds need it: they are linked without Binaryen (CMakeLists.txt says why),
// which is what strips the names from the portable builds, and wasm-ld keeps them: 44–53 kB
// of each relaxed .wasm a page would download. wasm-ld's --strip-all would drop them too, but
// also the target_features section Emscripten reads after the link (EMCC_READ_METADATA=python).
// Configure with -DSDPA_WASM_NAMES=ON to keep them (V8's profiler then names the functions).
//
// Layout (WebAssembly core spec, binary format): the 8-byte header (magic "\0asm", version 1),
// then sections, each an id byte, its payload's size as unsigned LEB128, the payload. A custom
// section (id 0) starts its payload with its name (LEB128 length, UTF-8 bytes).
import { readFileSync, writeFileSync } from 'node:fs';

const HEADER = [0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00];

// The unsigned LEB128 at bytes[at]: { value, next } (next: the offset after it).
function readU32(bytes, at, file) {
  let value = 0;
  for (let shift = 0; shift < 35; shift += 7) {
    if (at >= bytes.length) throw new Error(`${file}: truncated LEB128 at byte ${at}`);
    const byte = bytes[at++];
    value += (byte & 0x7f) * 2 ** shift;
    if ((byte & 0x80) === 0) return { value, next: at };
  }
  throw new Error(`${file}: LEB128 longer than 5 bytes at byte ${at}`);
}

// The file's bytes without its "name" section(s), and how many bytes that removed.
function withoutNameSection(bytes, file = 'wasm') {
  if (bytes.length < HEADER.length || HEADER.some((b, i) => bytes[i] !== b)) {
    throw new Error(`${file}: not a WebAssembly version 1 binary`);
  }
  const kept = [bytes.subarray(0, HEADER.length)];
  let at = HEADER.length;
  let removed = 0;
  while (at < bytes.length) {
    const start = at;
    const id = bytes[at];
    const size = readU32(bytes, at + 1, file);
    const end = size.next + size.value;
    if (end > bytes.length) throw new Error(`${file}: section at byte ${start} runs past the end`);
    let isName = false;
    if (id === 0) {
      const nameLength = readU32(bytes, size.next, file);
      const name = new TextDecoder().decode(bytes.subarray(nameLength.next, nameLength.next + nameLength.value));
      isName = name === 'name';
    }
    if (isName) removed += end - start;
    else kept.push(bytes.subarray(start, end));
    at = end;
  }
  return { bytes: Buffer.concat(kept), removed };
}

const files = process.argv.slice(2);
if (files.length === 0) {
  console.error('usage: node scripts/strip-wasm-names.mjs FILE.wasm...');
  process.exit(2);
}
for (const file of files) {
  const { bytes, removed } = withoutNameSection(readFileSync(file), file);
  if (removed > 0) writeFileSync(file, bytes);
  console.error(`strip-wasm-names: ${file}: ${removed} bytes of names removed, ${bytes.length} left`);
}
