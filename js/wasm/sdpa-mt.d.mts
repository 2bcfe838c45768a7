// The threaded build (dist/wasm/sdpa-mt.mjs) has the same surface as the single-threaded one.
export * from './sdpa.mjs';
export { default } from './sdpa.mjs';
