// The benchmark panel's inputs, in a module worker of their own: at the largest shape Q, K and V
// are 3 × 67M floats (3 × 256 MiB), and making them, copying them for every call and comparing
// the two outputs would each hold the page's thread for seconds.
// Messages in, each with an `id` that the reply repeats:
//   { type: 'make', dims, seed }  makes Q, K, V (unit noise, streams 1, 2, 3 of `seed`) and keeps them;
//   { type: 'copy' }              replies { tensors: [Q, K, V] }, fresh copies, their buffers moved;
//   { type: 'compare', a, b }     replies { maxDifference } (max |a[i] − b[i]|, NaN if any is NaN);
//   { type: 'clear' }             forgets the inputs (frees their memory).
// A failure replies { error }. (Messages posted before the module has loaded wait for it.)
import { noiseTensor } from './seeded.mjs';

let inputs = null;

self.addEventListener('message', ({ data }) => {
  const { id, type } = data;
  try {
    if (type === 'make') {
      inputs = null;  // the last shape's arrays can go before the new ones are made
      inputs = [1, 2, 3].map((stream) => noiseTensor(data.dims, data.seed, stream));
      self.postMessage({ id });
    } else if (type === 'copy') {
      if (inputs === null) throw new Error('no inputs made');
      const tensors = inputs.map((t) => ({ data: t.data.slice(), dims: t.dims }));
      self.postMessage({ id, tensors }, tensors.map((t) => t.data.buffer));
    } else if (type === 'compare') {
      const { a, b } = data;
      let diff = 0;
      for (let x = 0; x < a.length; x++) diff = Math.max(diff, Math.abs(a[x] - b[x]));
      self.postMessage({ id, maxDifference: diff });
    } else if (type === 'clear') {
      inputs = null;
      self.postMessage({ id });
    } else {
      throw new Error(`unknown request ${type}`);
    }
  } catch (error) {
    self.postMessage({ id, error: String(error?.message ?? error) });
  }
});
