// A peer that lives in a child process, driven from bench.mjs like a local one.
//
// Why: onnxruntime-web reads ort.env.wasm.numThreads once per process (see ort.mjs), so its
// one-thread and two-thread runs cannot share a process. createRemotePeer(path, options)
// forks remote-child.mjs, which imports the peer module at `path` and calls
// createPeer(options) there. Everything stays under bench.mjs's control, one step at a time:
//   prepare  the inputs are sent over (structured clone), the child sets the variant up;
//   run      the child runs it once and times it itself (performance.now() and
//            process.cpuUsage() around the call), so the IPC does not count; the output comes
//            back only when asked for (the check run), already in [B, H, L, E] layout;
//   dispose  the child releases the variant.
// While one peer runs, the others (and the parent) wait, so the round-robin timing holds.
import { fork } from 'node:child_process';
import { fileURLToPath } from 'node:url';

export async function createRemotePeer(modulePath, options = {}) {
  const child = fork(fileURLToPath(new URL('./remote-child.mjs', import.meta.url)), [], {
    serialization: 'advanced',                     // typed arrays cross as such
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
  });
  const pending = new Map();
  let nextId = 1;
  let exited = null;
  child.on('message', ({ id, ok, value, error }) => {
    const p = pending.get(id);
    if (!p) return;
    pending.delete(id);
    if (ok) p.resolve(value); else p.reject(new Error(error));
  });
  child.on('exit', (code, signal) => {
    exited = `the child process (pid ${child.pid}) exited${signal ? ` on ${signal}` : ` with code ${code}`}`;
    for (const p of pending.values()) p.reject(new Error(exited));
    pending.clear();
  });
  const call = (cmd, args = {}) => new Promise((resolve, reject) => {
    if (exited) { reject(new Error(exited)); return; }
    const id = nextId++;
    pending.set(id, { resolve, reject });
    child.send({ id, cmd, ...args });
  });

  let info;
  try {
    info = await call('init', { modulePath: new URL(modulePath, import.meta.url).href, options });
  } catch (e) {
    child.kill();
    throw e;
  }
  return {
    ...info,                                       // name, version, threads, config, limits
    remote: { pid: child.pid },
    // After a run, onnxruntime-web's pool thread spins before it sleeps: ≈ 15 ms of CPU in the
    // 20 ms after each two-thread run, the same in the 200 ms after (measured with cpuMs()).
    // bench.mjs waits this long after each of this peer's timed runs, so that the spin does
    // not take a core from the peer that runs next.
    settleMs: (info.threads ?? 1) > 1 ? 30 : 0,
    /** Total CPU time of the child process so far (all its threads), in ms. */
    cpuMs: () => call('cpu'),
    variants: async (s) => (await call('variants', { shape: s })).map((v, index) => ({
      ...v,
      prepare: async (inputs) => {
        const handle = await call('prepare', { shape: s, index, inputs });
        const runner = {
          selfTimed: true,                         // run() sets lastMs / lastCpuMs
          lastMs: NaN,
          lastCpuMs: NaN,
          run: async (wantOutput = true) => {
            const r = await call('run', { handle, wantOutput });
            runner.lastMs = r.ms;
            runner.lastCpuMs = r.cpuMs;
            return r.output;
          },
          dispose: () => call('dispose', { handle }),
        };
        return runner;
      },
    })),
    dispose: async () => {
      if (exited) return;
      try { await call('exit'); } catch { /* it exits as it answers */ }
      if (!exited) child.kill();
    },
  };
}
