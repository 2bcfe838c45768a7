// The child-process side of remote.mjs: hosts one peer (createPeer(options) of the module it
// is told to import) and answers bench.mjs's requests one at a time.
let peer = null;
const variantsByShape = new Map();   // shape id → that shape's variants (functions stay here)
const runners = new Map();
let nextHandle = 1;

const cpuMs = () => { const c = process.cpuUsage(); return (c.user + c.system) / 1000; };

// A variant description without its functions, for the parent.
const describe = ({ prepare, toBhsd, ...rest }) => rest;

async function handle(msg) {
  switch (msg.cmd) {
    case 'init': {
      peer = await (await import(msg.modulePath)).createPeer(msg.options);
      const { name, version, threads, config, maxRunSeconds, budgetSeconds, minRunsFloor, priorGflops } = peer;
      return { name, version, threads, config, maxRunSeconds, budgetSeconds, minRunsFloor, priorGflops };
    }
    case 'variants': {
      const variants = await peer.variants(msg.shape);
      variantsByShape.set(msg.shape.id, variants);
      return variants.map(describe);
    }
    case 'prepare': {
      // The deserialised typed arrays are views into one buffer that holds the whole message,
      // at offsets that are not 16-byte aligned. Fed to onnxruntime-web as they are, its decode
      // runs took 3x as long (shape (d), one thread: ≈ 85 ms against ≈ 25 ms; copying such a
      // view into wasm memory is the likely cost). Each input gets an array of its own here,
      // like the ones makeInputs() gives the local peers.
      const inputs = Object.fromEntries(Object.entries(msg.inputs).map(([name, t]) => [name, { ...t, data: t.data.slice() }]));
      const runner = await variantsByShape.get(msg.shape.id)[msg.index].prepare(inputs, msg.shape);
      const handle = nextHandle++;
      runners.set(handle, runner);
      return handle;
    }
    case 'run': {
      const runner = runners.get(msg.handle);
      const c0 = process.cpuUsage();
      const t0 = performance.now();
      let output = await runner.run();
      const ms = performance.now() - t0;
      const c = process.cpuUsage(c0);
      if (!msg.wantOutput) output = undefined;
      else if (runner.toBhsd) output = runner.toBhsd(output);
      return { ms, cpuMs: (c.user + c.system) / 1000, output };
    }
    case 'dispose': {
      const runner = runners.get(msg.handle);
      runners.delete(msg.handle);
      await runner?.dispose?.();
      return null;
    }
    case 'cpu':
      return cpuMs();
    case 'exit':
      try { await peer?.dispose?.(); } finally { setImmediate(() => process.exit(0)); }
      return null;
    default:
      throw new Error(`remote-child: unknown request ${msg.cmd}`);
  }
}

process.on('message', async (msg) => {
  try {
    process.send({ id: msg.id, ok: true, value: await handle(msg) });
  } catch (e) {
    process.send({ id: msg.id, ok: false, error: String(e?.message ?? e) });
  }
});
// The parent went away (finished or crashed): nothing left to do here.
process.on('disconnect', () => process.exit(0));
