// A minimal ONNX model writer: just enough protobuf (onnx.proto3 field numbers) to build the
// attention graphs the onnxruntime-web peer runs, in memory, without any dependency.
//
// Protobuf wire format: each field is a key varint (field_number << 3 | wire_type) then
// either a varint (wire type 0), 4 bytes (5, fixed32) or a length and bytes (2).

const varint = (value) => {
  let x = BigInt.asUintN(64, BigInt(value));  // negative int64s are 10-byte two's complement
  const out = [];
  do {
    let b = Number(x & 0x7fn);
    x >>= 7n;
    if (x) b |= 0x80;
    out.push(b);
  } while (x);
  return out;
};
const key = (field, wire) => varint((field << 3) | wire);
const fInt = (field, value) => [...key(field, 0), ...varint(value)];
const fBytes = (field, bytes) => [...key(field, 2), ...varint(bytes.length), ...bytes];
const fStr = (field, s) => fBytes(field, [...new TextEncoder().encode(s)]);
const fFloat = (field, x) => {
  const b = new Uint8Array(4);
  new DataView(b.buffer).setFloat32(0, x, true);
  return [...key(field, 5), ...b];
};

export const DataType = { FLOAT: 1, INT32: 6, INT64: 7, BOOL: 9 };

// AttributeProto: name 1, f 2, i 3, ints 8, type 20 (FLOAT 1, INT 2, INTS 7).
function attribute(name, value) {
  if (Array.isArray(value)) return [...fStr(1, name), ...value.flatMap((v) => fInt(8, v)), ...fInt(20, 7)];
  if (Number.isInteger(value) && !Object.is(value, -0)) return [...fStr(1, name), ...fInt(3, value), ...fInt(20, 2)];
  return [...fStr(1, name), ...fFloat(2, value), ...fInt(20, 1)];
}
// Floats must be marked as such when integral (e.g. scale 1): wrap them with floatAttr().
export const floatAttr = (x) => ({ float: x });

/** NodeProto: input 1, output 2, name 3, op_type 4, attribute 5, domain 7. */
export function node(opType, inputs, outputs, attrs = {}, domain = '') {
  const bytes = [
    ...inputs.flatMap((s) => fStr(1, s)), ...outputs.flatMap((s) => fStr(2, s)),
    ...fStr(3, `${opType}_${outputs[0]}`), ...fStr(4, opType),
  ];
  for (const [name, v] of Object.entries(attrs)) {
    const a = v !== null && typeof v === 'object' && 'float' in v
      ? [...fStr(1, name), ...fFloat(2, v.float), ...fInt(20, 1)]
      : attribute(name, v);
    bytes.push(...fBytes(5, a));
  }
  if (domain) bytes.push(...fStr(7, domain));
  return bytes;
}

/**
 * ValueInfoProto (name 1, type 2) → TypeProto.tensor_type 1 → elem_type 1, shape 2 → dim 1 →
 * dim_value 1 (a number) or dim_param 2 (a string: a symbolic dimension, left to the runtime).
 */
export function tensorInfo(name, dims, elemType = DataType.FLOAT) {
  const shape = dims.flatMap((d) => fBytes(1, typeof d === 'string' ? fStr(2, d) : fInt(1, d)));
  const tensorType = [...fInt(1, elemType), ...fBytes(2, shape)];
  return [...fStr(1, name), ...fBytes(2, fBytes(1, tensorType))];
}

/** TensorProto: dims 1, data_type 2, name 8, raw_data 9 (little-endian bytes). */
export function initializer(name, typedArray, dims, dataType) {
  const raw = new Uint8Array(typedArray.buffer, typedArray.byteOffset, typedArray.byteLength);
  return [...dims.flatMap((d) => fInt(1, d)), ...fInt(2, dataType), ...fStr(8, name), ...fBytes(9, raw)];
}

/**
 * ModelProto: ir_version 1, producer_name 2, graph 7, opset_import 8 (domain 1, version 2).
 * GraphProto: node 1, name 2, initializer 5, input 11, output 12.
 */
export function model({ nodes, inputs, outputs, initializers = [], opsets, irVersion = 10, name = 'g' }) {
  const graph = [
    ...nodes.flatMap((n) => fBytes(1, n)), ...fStr(2, name),
    ...initializers.flatMap((t) => fBytes(5, t)),
    ...inputs.flatMap((v) => fBytes(11, v)), ...outputs.flatMap((v) => fBytes(12, v)),
  ];
  const bytes = [
    ...fInt(1, irVersion), ...fStr(2, 'sdpa-wasm-bench'), ...fBytes(7, graph),
    ...Object.entries(opsets).flatMap(([domain, version]) => fBytes(8, [...(domain ? fStr(1, domain) : []), ...fInt(2, version)])),
  ];
  return Uint8Array.from(bytes);
}
