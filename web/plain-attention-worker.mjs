// The benchmark panel's plain-JavaScript side, in a module worker of its own: one run takes
// seconds at the larger shapes, and on the page's thread it would freeze the page for as long.
// Message in: { query, key, value, options } (tensors { data, dims }; the page moves their buffers).
// Message out: { output } (its buffer moved back) or { error }. It posts 'ready' once loaded,
// so the page can start it before timing anything.
import { plainAttention } from './plain-attention.mjs';

self.addEventListener('message', ({ data: { query, key, value, options } }) => {
  let output;
  try {
    output = plainAttention(query, key, value, options);
  } catch (error) {
    self.postMessage({ error: String(error?.message ?? error) });
    return;
  }
  self.postMessage({ output }, [output.buffer]);
});
self.postMessage('ready');
