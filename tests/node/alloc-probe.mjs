// Child-process helper of errors.test.mjs (not a test file itself): runs one call that must
// fail to allocate, then a small call that must still be correct, and prints the outcome as
// one JSON line. Run in its own process because a wasm trap in a worker thread of the
// threaded build takes the whole Node process down, which would end the Jest run.
//
//   node alloc-probe.mjs <threads | default> <Lq> <Lk> <E>
import { createAttention } from '../../dist/index.js';
import { maxRelError, randomTensor, referenceSdpa } from './reference.mjs';

const [threadsArg, lqArg, lkArg, eArg] = process.argv.slice(2);
const Lq = Number(lqArg), Lk = Number(lkArg), E = Number(eArg);
const attn = await createAttention(threadsArg === 'default' ? {} : { threads: Number(threadsArg) });
const result = { threads: attn.threads, error: null, stillWorks: false, smallError: null };
try {
  // Constant values (what matters is the sizes; millions of keys drawn at random would be slow).
  const t = (L) => ({ data: new Float32Array(L * E).fill(0.5), dims: [1, 1, L, E] });
  attn.sdpa(t(Lq), t(Lk), t(Lk), { returnWeights: true });
} catch (e) {
  result.error = { name: e?.constructor?.name ?? typeof e, message: String(e?.message ?? e) };
}
try {
  const q = randomTensor([2, 4, 5, 3], 4), k = randomTensor([2, 2, 7, 3], 5), v = randomTensor([2, 2, 7, 6], 6);
  const options = { isCausal: true, returnWeights: true };
  const got = attn.sdpa(q, k, v, options);
  const ref = referenceSdpa(q, k, v, options);
  result.smallError = Math.max(maxRelError(got.output.data, ref.output), maxRelError(got.weights.data, ref.weights));
  result.stillWorks = result.smallError <= 2e-5;
} catch (e) {
  result.smallError = String(e?.message ?? e);
}
attn.dispose();
process.stdout.write(`${JSON.stringify(result)}\n`);
