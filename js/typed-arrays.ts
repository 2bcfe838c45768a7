// What a typed array or an ArrayBuffer is, read from the engine's internal slots: one place for
// these reads, used by the checks (validate.ts) and by the worker's calling side (worker.ts).
//
// A caller's typed array is an object that may carry properties of its own: an own `length`,
// `byteLength`, `buffer`, `byteOffset`, `Symbol.toStringTag`, `set`, `slice`, `constructor` or
// iterator would stand in for the prototype's if read as properties. TypedArray.prototype's and
// ArrayBuffer.prototype's getters, captured here at load, read the internal slots instead, and a
// view made here over the same memory (ownView) carries nothing of the caller's object. Tag-based
// checks also work across realms (iframes, Jest's vm contexts), unlike instanceof.
import type { Float16ArrayType } from './types.js';

const typedArrayPrototype = Object.getPrototypeOf(Int8Array.prototype) as object;
const typedArrayGetter = (key: PropertyKey) => Object.getOwnPropertyDescriptor(typedArrayPrototype, key)!.get!;
const typedArrayName = typedArrayGetter(Symbol.toStringTag);
const typedArrayLength = typedArrayGetter('length');
const typedArrayBuffer = typedArrayGetter('buffer');
const typedArrayByteOffset = typedArrayGetter('byteOffset');
const arrayBufferByteLength = Object.getOwnPropertyDescriptor(ArrayBuffer.prototype, 'byteLength')!.get!;
const arrayBufferDetached = Object.getOwnPropertyDescriptor(ArrayBuffer.prototype, 'detached')?.get;  // not in Node 20

/** The engine's Float16Array constructor, if it has one. */
const Float16ArrayConstructor = (globalThis as unknown as { Float16Array?: Float32ArrayConstructor }).Float16Array;

/** The typed arrays the API takes: data, masks, raw halves, per-batch integers, and float data as halves (Float16Array). */
export type TypedArray = Float32Array | Uint16Array | Uint8Array | Int32Array | Float16ArrayType;
type ViewConstructor = Float32ArrayConstructor | Uint16ArrayConstructor | Uint8ArrayConstructor | Int32ArrayConstructor;
/** Each TypedArray type's constructor, by its name (Float16Array's where the engine has it). */
const VIEW_TYPES: Readonly<Record<string, ViewConstructor>> = {
  Float32Array, Uint16Array, Uint8Array, Int32Array,
  ...(Float16ArrayConstructor === undefined ? {} : { Float16Array: Float16ArrayConstructor }),
};

/** A typed array's type name ('Float32Array', …) from its internal slot; undefined for anything else (a DataView too). */
export const viewTag = (x: unknown): string | undefined => (ArrayBuffer.isView(x) ? typedArrayName.call(x) as string | undefined : undefined);
/** A typed array's element count, from its internal slot (0 once its buffer is detached). */
export const lengthOf = (view: ArrayBufferView): number => typedArrayLength.call(view) as number;
/** A typed array's buffer (ArrayBuffer or SharedArrayBuffer), from its internal slot. */
export const bufferOf = (view: ArrayBufferView): ArrayBufferLike => typedArrayBuffer.call(view) as ArrayBufferLike;
/** A typed array's byte offset into its buffer, from its internal slot. */
export const byteOffsetOf = (view: ArrayBufferView): number => typedArrayByteOffset.call(view) as number;

export const isFloat32Array = (x: unknown): x is Float32Array => viewTag(x) === 'Float32Array';
export const isUint16Array = (x: unknown): x is Uint16Array => viewTag(x) === 'Uint16Array';
export const isUint8Array = (x: unknown): x is Uint8Array => viewTag(x) === 'Uint8Array';
export const isInt32Array = (x: unknown): x is Int32Array => viewTag(x) === 'Int32Array';
export const isFloat16Array = (x: unknown): x is Float16ArrayType => viewTag(x) === 'Float16Array';

/** The IEEE half bits of a Float16Array's elements: a Uint16Array over the same bytes (from its internal slots). */
export const halfBitsOf = (view: Float16ArrayType): Uint16Array =>
  new Uint16Array(bufferOf(view) as ArrayBuffer, byteOffsetOf(view), lengthOf(view));
/** The constructor of a typed array's own type (one of TypedArray), from its internal slot. */
const typeOf = (view: TypedArray): ViewConstructor => VIEW_TYPES[typedArrayName.call(view) as string]!;

/** One of the API's typed array types (TypedArray above). */
export const isApiTypedArray = (x: unknown): x is TypedArray => Object.hasOwn(VIEW_TYPES, viewTag(x) ?? '');

/** Whether `x` is an ArrayBuffer (not a SharedArrayBuffer), by its internal slot. */
export function isArrayBuffer(x: unknown): x is ArrayBuffer {
  try {
    arrayBufferByteLength.call(x);  // throws for anything else, a SharedArrayBuffer included
    return true;
  } catch {
    return false;
  }
}

/** An ArrayBuffer's byte length, from its internal slot (0 once detached). */
export const byteLengthOf = (buffer: ArrayBuffer): number => arrayBufferByteLength.call(buffer) as number;

/**
 * Whether a view's buffer is detached (transferred, e.g. by a worker call with
 * `{ transfer: true }`): it then reads as length 0. Engines without ArrayBuffer.prototype.detached
 * cannot tell that from an empty buffer, so both count.
 */
export function detachedOrEmpty(view: ArrayBufferView): boolean {
  const buffer = bufferOf(view);
  if (!isArrayBuffer(buffer)) return false;  // a SharedArrayBuffer cannot be detached
  return arrayBufferDetached?.call(buffer) === true || byteLengthOf(buffer) === 0;
}

/**
 * A new view of a typed array's elements [0, length) (the same memory), of its type, with
 * nothing of the caller's object but its internal slots: what a call copies and sizes its
 * allocations from, whatever properties the object itself carries.
 */
export function ownView<T extends TypedArray>(view: T, length = lengthOf(view)): T {
  return new (typeOf(view))(bufferOf(view) as ArrayBuffer, byteOffsetOf(view), length) as T;
}

/** The bytes of one element of a typed array's type (from its internal slot, not the object's BYTES_PER_ELEMENT). */
export const elementBytesOf = (view: TypedArray): number => typeOf(view).BYTES_PER_ELEMENT;

/**
 * Whether two typed arrays over the same buffer object have bytes in common. Views over two
 * different buffer objects count as apart (SharedArrayBuffer objects may still alias: callers
 * that must know say so).
 */
export function sharesBytes(a: TypedArray, b: TypedArray): boolean {
  if (bufferOf(a) !== bufferOf(b)) return false;
  const [aStart, bStart] = [byteOffsetOf(a), byteOffsetOf(b)];
  return aStart < bStart + lengthOf(b) * elementBytesOf(b) && bStart < aStart + lengthOf(a) * elementBytesOf(a);
}

/** A view of `length` elements of `view`'s type over `buffer` from `byteOffset` (a moved buffer). */
export function viewLike<T extends TypedArray>(view: T, buffer: ArrayBuffer, byteOffset: number, length: number): T {
  return new (typeOf(view))(buffer, byteOffset, length) as T;
}

/** A copy of a typed array's elements in a new buffer of its own (no property of the object read). */
export function copyOf<T extends TypedArray>(view: T): T {
  return new (typeOf(view))(ownView(view)) as T;
}
