// Attention off the main thread: createAttentionWorker() runs an Attention instance in a
// worker_threads Worker (a Web Worker in browsers), behind promises. While a long call runs in
// the worker, this thread's event loop keeps turning: a 10 ms timer counts its ticks.
//   node examples/node/worker.mjs
import { createAttention, createAttentionWorker } from 'sdpa-wasm';

// A long self-attention: B=1, 16 heads, 2048 tokens, head size 64 (about 0.3–1 s on one core).
const [B, H, L, E] = [1, 16, 2048, 64];
let seed = 7;
const random = () => ((seed = (seed * 1664525 + 1013904223) >>> 0) / 2 ** 32) * 2 - 1;
const tensor = () => ({ data: Float32Array.from({ length: B * H * L * E }, random), dims: [B, H, L, E] });
const [query, key, value] = [tensor(), tensor(), tensor()];

const worker = await createAttentionWorker({ threads: 1 });
// transfer: true moves the buffers to the worker instead of copying them; the arrays passed are
// then empty. Here they are copies (made before the clock starts), as the originals are used
// again below.
const copies = structuredClone({ query, key, value });
let ticks = 0;
const timer = setInterval(() => ticks++, 10);
const t0 = performance.now();
const { output } = await worker.sdpa(copies.query, copies.key, copies.value, { isCausal: true, transfer: true });
const ms = performance.now() - t0;
clearInterval(timer);
console.log(`worker: output dims [${output.dims.join(', ')}], ${ms.toFixed(0)} ms, ` +
  `threads ${worker.threads}; the copies' query.data.length is now ${copies.query.data.length} (transferred)`);
// A thread blocked for the whole call would see no tick (at most one, on its way out); how many
// of the ms / 10 it sees depends on the machine's load, not on the package.
console.log(`the main thread's 10 ms timer fired ${ticks} times meanwhile (${ticks > 1 ? 'not blocked' : 'BLOCKED'})`);

// The same call on this thread gives the same bits (and blocks the timer while it runs).
const attn = await createAttention({ threads: 1 });
const direct = attn.sdpa(query, key, value, { isCausal: true }).output.data;
const same = direct.every((x, i) => Object.is(x, output.data[i]));
console.log(`direct call on the main thread: ${same ? 'bitwise equal' : 'DIFFERENT'}`);
attn.dispose();
await worker.dispose();  // the worker ends; Node exits by itself
