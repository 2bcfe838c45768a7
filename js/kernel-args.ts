// The kernel's call descriptions, ProblemDesc and BackwardDesc (src/bindings/embind.cc), reach
// it through the module's argument blocks: each field is stored into wasm memory at the offset
// the module reports (argumentLayout(), read once per module), and the call gets the block's
// address. Embind's conversion of a JS object (value_object) cost about 5 µs per call; a KV
// cache step makes two such calls, which was half the time of a small step (one head, 16 keys).
// Write a block right before the call that reads it: the module has one block of each kind,
// and the next call's description overwrites it (calls are synchronous and never re-enter).
import { heap } from './memory.js';
import type { ArgumentBlock, BackwardDesc, ProblemDesc, SdpaModule } from './wasm/sdpa.mjs';

type Field = ArgumentBlock['fields'][number];

/** The ProblemDesc fields that hold addresses in wasm memory. */
const ADDRESS_FIELDS = ['query', 'key', 'value', 'output', 'weights', 'mask', 'causalOffsets', 'keyLengths',
  'logsumexp', 'keyStarts', 'sinks', 'alibiSlopes'] as const;

interface Blocks {
  problem: ArgumentBlock;
  backward: ArgumentBlock;
  /** The problem block's ADDRESS_FIELDS, in that order. */
  problemAddresses: Field[];
}

const blocksOf = new WeakMap<SdpaModule, Blocks>();

function blocks(module: SdpaModule): Blocks {
  let b = blocksOf.get(module);
  if (b === undefined) {
    const { problem, backward } = module.argumentLayout();
    const problemAddresses = ADDRESS_FIELDS.map((name) => {
      const field = problem.fields.find((f) => f.name === name);
      if (field === undefined) throw new Error(`sdpa-wasm: internal error: ProblemDesc has no field ${name}`);
      return field;
    });
    b = { problem, backward, problemAddresses };
    blocksOf.set(module, b);
  }
  return b;
}

function write(module: SdpaModule, block: ArgumentBlock, values: object, what: string): number {
  const { i32, f32 } = heap(module);  // fresh views: memory may have grown since the last call
  const record = values as Record<string, number | boolean | undefined>;
  const { fields } = block;
  // The descriptions are built with their keys in the module's order (describeProblem, the
  // backward's BackwardDesc): then one for-in pass reads them, which V8 does through the
  // object's cached key list; a keyed read by name per field cost 1.5 µs per call. Any other
  // order, or a key too many or too few, takes the lookup by name below.
  let i = 0;
  for (const key in record) {
    const field = fields[i];
    if (field === undefined || key !== field.name) break;
    store(i32, f32, block.address, field, record[key], what);
    i++;
  }
  if (i !== fields.length) {
    for (const field of fields) store(i32, f32, block.address, field, record[field.name], what);
  }
  return block.address;
}

function store(i32: Int32Array, f32: Float32Array, address: number, field: Field,
  value: number | boolean | undefined, what: string): void {
  if (value === undefined) throw new Error(`sdpa-wasm: internal error: ${what}.${field.name} is not set`);
  const word = (address + field.offset) >>> 2;
  // int32 and uint32 fields alike: an Int32Array store keeps the low 32 bits. (A whole call's
  // description, written to size and choose its way, may hold strides past 32 bits along axes
  // of one, never used; the descriptions that run have their own: slices.ts, the decode's pairs.)
  if (field.isFloat) f32[word] = +value;
  else i32[word] = +value;
}

/** Writes `desc` into the module's ProblemDesc block; its address, for the next call. */
export function problemArg(module: SdpaModule, desc: ProblemDesc): number {
  return write(module, blocks(module).problem, desc, 'ProblemDesc');
}

/**
 * Rewrites only the address fields (query, key, value, output, ...) of the ProblemDesc block
 * from `desc`; its address. For a description written by problemArg() whose addresses were
 * filled in since (a call sizes its scratch from the description, then allocates): the other
 * fields are still in the block, as no call has run in between.
 */
export function problemAddressesArg(module: SdpaModule, desc: ProblemDesc): number {
  const { problem, problemAddresses } = blocks(module);
  const { i32, f32 } = heap(module);  // fresh views: the allocations may have grown memory
  for (let i = 0; i < ADDRESS_FIELDS.length; i++) {
    store(i32, f32, problem.address, problemAddresses[i], desc[ADDRESS_FIELDS[i]], 'ProblemDesc');
  }
  return problem.address;
}

/** Writes `grad` into the module's BackwardDesc block; its address, for the next call. */
export function backwardArg(module: SdpaModule, grad: BackwardDesc): number {
  return write(module, blocks(module).backward, grad, 'BackwardDesc');
}

/** The field names of each block, as the module lists them (for tests). */
export function argumentFieldNames(module: SdpaModule): { problem: string[]; backward: string[] } {
  const b = blocks(module);
  return { problem: b.problem.fields.map((f) => f.name), backward: b.backward.fields.map((f) => f.name) };
}
