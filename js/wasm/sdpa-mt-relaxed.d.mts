// The relaxed-SIMD builds (dist/wasm/sdpa-relaxed.mjs, sdpa-mt-relaxed.mjs) have the same surface.
export * from './sdpa.mjs';
export { default } from './sdpa.mjs';
