// Embind surface of the wasm module: plain numbers in, status out. No math here.
// The TypeScript layer (js/) validates the user's input, copies tensors into the wasm heap,
// writes a ProblemDesc with their addresses (byte offsets into the heap) and strides (in
// elements) into the module's argument block, passes the block's address, and turns a
// non-ok status into an exception.
#include <emscripten/bind.h>
#include <emscripten/val.h>
#include <malloc.h>

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <type_traits>

#include "kv-cache.h"
#include "math/f16-f32-cvt-wasmsimd.h"
#include "parallel/thread-pool.h"
#include "sdpa-backward.h"
#include "sdpa-packed.h"
#include "sdpa.h"

namespace {

// Every field is one 4-byte word (int32, uint32 or float; flags are 0 or 1), so that JS
// writes it with one store at the offset argument_layout() reports (see there).
struct ProblemDesc {
  int32_t batch, qHeads, kvHeads, qLen, kvLen, headDim, valueDim;
  int32_t kvType;  // sdpa::KvType: 0 float32, 1 float16, 2 float16 without Inf/NaN halves, 3 bfloat16
  uint32_t query, key, value, output, weights, mask, causalOffsets, keyLengths;
  uint32_t logsumexp;  // sdpa::Problem::logsumexp: [B, Hq, Lq] written by forward(), 0 for none
  uint32_t keyStarts;  // sdpa::Problem::key_starts: [B], 0 for none
  uint32_t sinks;      // sdpa::Problem::sinks: [Hq], 0 for none
  uint32_t alibiSlopes;  // sdpa::Problem::alibi_slopes: [Hq] or [B, Hq], 0 for none
  int32_t alibiStrideB;  // sdpa::Problem::alibi_stride_b: 0 ([Hq]) or Hq ([B, Hq])
  uint32_t dropoutThreshold;  // sdpa::Problem::dropout_threshold: 0 for no dropout
  uint32_t dropoutSeed;       // sdpa::Problem::dropout_seed
  int32_t dropoutBatchBase;   // sdpa::Problem::dropout_batch_base
  int32_t dropoutHeadBase;    // sdpa::Problem::dropout_head_base
  int32_t dropoutRowBase;     // sdpa::Problem::dropout_row_base
  int32_t qStrideB, qStrideH, qStrideL, kStrideB, kStrideH, kStrideL;
  int32_t vStrideB, vStrideH, vStrideL, oStrideB, oStrideH, oStrideL;
  int32_t maskKind, maskStrideB, maskStrideH, maskStrideQ, maskStrideK;
  float scale, softcap;
  int32_t causal;  // 0 or 1
  int32_t causalOffset;
  int32_t slidingWindow;  // sdpa::Problem::sliding_window: 0 none, else W >= 1 (causal)
  int32_t readKvInOrder;  // 0 or 1: sdpa::Problem::read_kv_in_order (K/V resident: a KV cache)
};

template <typename T>
T* at(uint32_t address) {
  return reinterpret_cast<T*>(static_cast<uintptr_t>(address));
}

sdpa::Problem to_problem(const ProblemDesc& d) {
  sdpa::Problem p;
  p.batch = d.batch;
  p.q_heads = d.qHeads;
  p.kv_heads = d.kvHeads;
  p.q_len = d.qLen;
  p.kv_len = d.kvLen;
  p.head_dim = d.headDim;
  p.value_dim = d.valueDim;
  p.query = at<const float>(d.query);
  p.q_stride_b = d.qStrideB, p.q_stride_h = d.qStrideH, p.q_stride_l = d.qStrideL;
  p.kv_type = static_cast<sdpa::KvType>(d.kvType);
  p.key = at<const void>(d.key);
  p.k_stride_b = d.kStrideB, p.k_stride_h = d.kStrideH, p.k_stride_l = d.kStrideL;
  p.value = at<const void>(d.value);
  p.v_stride_b = d.vStrideB, p.v_stride_h = d.vStrideH, p.v_stride_l = d.vStrideL;
  p.output = at<float>(d.output);
  p.o_stride_b = d.oStrideB, p.o_stride_h = d.oStrideH, p.o_stride_l = d.oStrideL;
  p.weights = at<float>(d.weights);
  p.scale = d.scale;
  p.softcap = d.softcap;
  p.mask_kind = static_cast<sdpa::MaskKind>(d.maskKind);
  p.mask = at<const void>(d.mask);
  p.mask_stride_b = d.maskStrideB, p.mask_stride_h = d.maskStrideH;
  p.mask_stride_q = d.maskStrideQ, p.mask_stride_k = d.maskStrideK;
  p.causal = d.causal != 0;
  p.causal_offset = d.causalOffset;
  p.causal_offsets = at<const int32_t>(d.causalOffsets);
  p.sliding_window = d.slidingWindow;
  p.key_lengths = at<const int32_t>(d.keyLengths);
  p.key_starts = at<const int32_t>(d.keyStarts);
  p.sinks = at<const float>(d.sinks);
  p.alibi_slopes = at<const float>(d.alibiSlopes);
  p.alibi_stride_b = d.alibiStrideB;
  p.dropout_threshold = d.dropoutThreshold;
  p.dropout_seed = d.dropoutSeed;
  p.dropout_batch_base = d.dropoutBatchBase;
  p.dropout_head_base = d.dropoutHeadBase;
  p.dropout_row_base = d.dropoutRowBase;
  p.read_kv_in_order = d.readKvInOrder != 0;
  p.logsumexp = at<float>(d.logsumexp);
  return p;
}

// The backward pass's own operands (src/sdpa-backward.h); the forward's are a ProblemDesc
// (its `output` is the forward's output O, read).
struct BackwardDesc {
  uint32_t logsumexp, gradOutput, dQuery, dKey, dValue;
  int32_t goStrideB, goStrideH, goStrideL, dqStrideB, dqStrideH, dqStrideL;
  int32_t dkStrideB, dkStrideH, dkStrideL, dvStrideB, dvStrideH, dvStrideL;
  uint32_t dMask;   // 0 for none
  uint32_t dSinks;  // sdpa::BackwardProblem::d_sinks: [Hq], 0 for none
  int32_t maskGradParts;  // sdpa::BackwardProblem::mask_grad_parts: 0 for the kernel's choice
};

// The argument blocks. A call's ProblemDesc (and BackwardDesc) is not converted from a JS
// object by Embind (a value_object took about 5 µs per call, two calls per KV cache step:
// half the time of a small step) but written by JS straight into these blocks, in wasm
// memory, one store per field at the offsets argument_layout() reports; the functions below
// take the blocks' addresses. Calls are synchronous and never re-enter, so one block of each
// per module is enough (js/kernel-args.ts writes it right before each call). Static storage,
// not the heap: the leak tests' heap bytes in use do not see it.
ProblemDesc problem_block;
BackwardDesc backward_block;

struct FieldLayout {
  const char* name;
  uint32_t offset;
  bool is_float;  // float32; else a 32-bit integer (int32 or uint32: JS stores the same bits)
};

template <typename T>
constexpr bool is_float_word() {
  static_assert(sizeof(T) == 4 && (std::is_integral_v<T> || std::is_same_v<T, float>),
                "argument block fields are 4-byte integers or floats");
  return std::is_same_v<T, float>;
}

#define SDPA_FIELD(Struct, field) \
  FieldLayout { #field, offsetof(Struct, field), is_float_word<decltype(Struct::field)>() }

constexpr FieldLayout kProblemFields[] = {
    SDPA_FIELD(ProblemDesc, batch),       SDPA_FIELD(ProblemDesc, qHeads),        SDPA_FIELD(ProblemDesc, kvHeads),
    SDPA_FIELD(ProblemDesc, qLen),        SDPA_FIELD(ProblemDesc, kvLen),         SDPA_FIELD(ProblemDesc, headDim),
    SDPA_FIELD(ProblemDesc, valueDim),    SDPA_FIELD(ProblemDesc, kvType),        SDPA_FIELD(ProblemDesc, query),
    SDPA_FIELD(ProblemDesc, key),         SDPA_FIELD(ProblemDesc, value),         SDPA_FIELD(ProblemDesc, output),
    SDPA_FIELD(ProblemDesc, weights),     SDPA_FIELD(ProblemDesc, mask),          SDPA_FIELD(ProblemDesc, causalOffsets),
    SDPA_FIELD(ProblemDesc, keyLengths),  SDPA_FIELD(ProblemDesc, logsumexp),     SDPA_FIELD(ProblemDesc, keyStarts),
    SDPA_FIELD(ProblemDesc, sinks),       SDPA_FIELD(ProblemDesc, alibiSlopes),   SDPA_FIELD(ProblemDesc, alibiStrideB),
    SDPA_FIELD(ProblemDesc, dropoutThreshold), SDPA_FIELD(ProblemDesc, dropoutSeed), SDPA_FIELD(ProblemDesc, dropoutBatchBase),
    SDPA_FIELD(ProblemDesc, dropoutHeadBase), SDPA_FIELD(ProblemDesc, dropoutRowBase),
    SDPA_FIELD(ProblemDesc, qStrideB),
    SDPA_FIELD(ProblemDesc, qStrideH),    SDPA_FIELD(ProblemDesc, qStrideL),      SDPA_FIELD(ProblemDesc, kStrideB),
    SDPA_FIELD(ProblemDesc, kStrideH),    SDPA_FIELD(ProblemDesc, kStrideL),      SDPA_FIELD(ProblemDesc, vStrideB),
    SDPA_FIELD(ProblemDesc, vStrideH),    SDPA_FIELD(ProblemDesc, vStrideL),      SDPA_FIELD(ProblemDesc, oStrideB),
    SDPA_FIELD(ProblemDesc, oStrideH),    SDPA_FIELD(ProblemDesc, oStrideL),      SDPA_FIELD(ProblemDesc, maskKind),
    SDPA_FIELD(ProblemDesc, maskStrideB), SDPA_FIELD(ProblemDesc, maskStrideH),   SDPA_FIELD(ProblemDesc, maskStrideQ),
    SDPA_FIELD(ProblemDesc, maskStrideK), SDPA_FIELD(ProblemDesc, scale),         SDPA_FIELD(ProblemDesc, softcap),
    SDPA_FIELD(ProblemDesc, causal),      SDPA_FIELD(ProblemDesc, causalOffset),  SDPA_FIELD(ProblemDesc, slidingWindow),
    SDPA_FIELD(ProblemDesc, readKvInOrder),
};
constexpr FieldLayout kBackwardFields[] = {
    SDPA_FIELD(BackwardDesc, logsumexp), SDPA_FIELD(BackwardDesc, gradOutput), SDPA_FIELD(BackwardDesc, dQuery),
    SDPA_FIELD(BackwardDesc, dKey),      SDPA_FIELD(BackwardDesc, dValue),     SDPA_FIELD(BackwardDesc, goStrideB),
    SDPA_FIELD(BackwardDesc, goStrideH), SDPA_FIELD(BackwardDesc, goStrideL),  SDPA_FIELD(BackwardDesc, dqStrideB),
    SDPA_FIELD(BackwardDesc, dqStrideH), SDPA_FIELD(BackwardDesc, dqStrideL),  SDPA_FIELD(BackwardDesc, dkStrideB),
    SDPA_FIELD(BackwardDesc, dkStrideH), SDPA_FIELD(BackwardDesc, dkStrideL),  SDPA_FIELD(BackwardDesc, dvStrideB),
    SDPA_FIELD(BackwardDesc, dvStrideH), SDPA_FIELD(BackwardDesc, dvStrideL),  SDPA_FIELD(BackwardDesc, dMask),
    SDPA_FIELD(BackwardDesc, dSinks),    SDPA_FIELD(BackwardDesc, maskGradParts),
};
#undef SDPA_FIELD
// All fields are words: a struct as large as its listed fields has every field listed (the
// JS test "argument layout" checks that no name is listed twice and that JS fills each).
static_assert(sizeof(ProblemDesc) == 4 * std::size(kProblemFields), "list every ProblemDesc field once");
static_assert(sizeof(BackwardDesc) == 4 * std::size(kBackwardFields), "list every BackwardDesc field once");

template <size_t N>
emscripten::val block_layout(const void* block, const FieldLayout (&fields)[N]) {
  emscripten::val list = emscripten::val::array();
  for (const FieldLayout& f : fields) {
    emscripten::val entry = emscripten::val::object();
    entry.set("name", emscripten::val(f.name));
    entry.set("offset", f.offset);
    entry.set("isFloat", f.is_float);
    list.call<void>("push", entry);
  }
  emscripten::val layout = emscripten::val::object();
  layout.set("address", static_cast<uint32_t>(reinterpret_cast<uintptr_t>(block)));
  layout.set("fields", list);
  return layout;
}

// { problem, backward }: each { address, fields: [{ name, offset, isFloat }] }, read once
// per module by js/kernel-args.ts.
emscripten::val argument_layout() {
  emscripten::val layout = emscripten::val::object();
  layout.set("problem", block_layout(&problem_block, kProblemFields));
  layout.set("backward", block_layout(&backward_block, kBackwardFields));
  return layout;
}

const ProblemDesc& problem_at(uint32_t address) { return *at<const ProblemDesc>(address); }
const BackwardDesc& backward_at(uint32_t address) { return *at<const BackwardDesc>(address); }

sdpa::BackwardProblem to_backward(const ProblemDesc& d, const BackwardDesc& g) {
  sdpa::BackwardProblem p;
  p.forward = to_problem(d);
  p.logsumexp = at<const float>(g.logsumexp);
  p.grad_output = at<const float>(g.gradOutput);
  p.go_stride_b = g.goStrideB, p.go_stride_h = g.goStrideH, p.go_stride_l = g.goStrideL;
  p.d_query = at<float>(g.dQuery);
  p.dq_stride_b = g.dqStrideB, p.dq_stride_h = g.dqStrideH, p.dq_stride_l = g.dqStrideL;
  p.d_key = at<float>(g.dKey);
  p.dk_stride_b = g.dkStrideB, p.dk_stride_h = g.dkStrideH, p.dk_stride_l = g.dkStrideL;
  p.d_value = at<float>(g.dValue);
  p.dv_stride_b = g.dvStrideB, p.dv_stride_h = g.dvStrideH, p.dv_stride_l = g.dvStrideL;
  p.d_mask = at<float>(g.dMask);
  p.d_sinks = at<float>(g.dSinks);
  p.mask_grad_parts = g.maskGradParts;
  return p;
}

double scratch_floats(uint32_t desc, int32_t threads) {
  return static_cast<double>(sdpa::scratch_floats(to_problem(problem_at(desc)), threads));
}

// The module's thread pool, created on the first call with threads > 1 (and recreated if
// the count changes). Only the threaded build (-pthread) may ask for threads > 1.
sdpa::ThreadPool* pool_for(int32_t threads) {
  static std::unique_ptr<sdpa::ThreadPool> pool;
  if (threads <= 1) return nullptr;
  if (pool == nullptr || pool->threads() != threads) {
    pool.reset();
    pool = std::make_unique<sdpa::ThreadPool>(threads);
  }
  return pool.get();
}

int32_t forward(uint32_t desc, uint32_t scratch, double scratch_floats, int32_t threads) {
  return static_cast<int32_t>(sdpa::forward(to_problem(problem_at(desc)), at<float>(scratch),
                                            static_cast<uint64_t>(scratch_floats), pool_for(threads)));
}

double backward_scratch_floats(uint32_t desc, uint32_t grad, int32_t threads) {
  return static_cast<double>(sdpa::backward_scratch_floats(to_backward(problem_at(desc), backward_at(grad)), threads));
}

int32_t mask_grad_parts(uint32_t desc, uint32_t grad) {
  return sdpa::backward_mask_grad_parts(to_backward(problem_at(desc), backward_at(grad)));
}

int32_t backward(uint32_t desc, uint32_t grad, uint32_t scratch, double scratch_floats, int32_t threads) {
  return static_cast<int32_t>(sdpa::backward(to_backward(problem_at(desc), backward_at(grad)), at<float>(scratch),
                                             static_cast<uint64_t>(scratch_floats), pool_for(threads)));
}

// Packed sequences (src/sdpa-packed.h): the argument block describes the whole packed problem
// (batch 1, q_len Tq, kv_len Tk; causalOffsets [S] when per sequence); the starts are [S + 1]
// int32 each.
sdpa::PackedProblem to_packed(uint32_t desc, int32_t sequences, uint32_t q_starts, uint32_t k_starts) {
  return {to_problem(problem_at(desc)), sequences, at<const int32_t>(q_starts), at<const int32_t>(k_starts)};
}

sdpa::PackedBackwardProblem to_packed_backward(uint32_t desc, uint32_t grad, int32_t sequences, uint32_t q_starts,
                                               uint32_t k_starts) {
  return {to_backward(problem_at(desc), backward_at(grad)), sequences, at<const int32_t>(q_starts),
          at<const int32_t>(k_starts)};
}

double packed_scratch_floats(uint32_t desc, int32_t sequences, uint32_t q_starts, uint32_t k_starts, int32_t threads) {
  return static_cast<double>(sdpa::packed_scratch_floats(to_packed(desc, sequences, q_starts, k_starts), threads));
}

int32_t forward_packed(uint32_t desc, int32_t sequences, uint32_t q_starts, uint32_t k_starts, uint32_t scratch,
                       double scratch_floats, int32_t threads) {
  return static_cast<int32_t>(sdpa::forward_packed(to_packed(desc, sequences, q_starts, k_starts), at<float>(scratch),
                                                   static_cast<uint64_t>(scratch_floats), pool_for(threads)));
}

double packed_backward_scratch_floats(uint32_t desc, uint32_t grad, int32_t sequences, uint32_t q_starts,
                                      uint32_t k_starts, int32_t threads) {
  return static_cast<double>(
      sdpa::packed_backward_scratch_floats(to_packed_backward(desc, grad, sequences, q_starts, k_starts), threads));
}

// d_sinks_by_sequence: [S, Hq] for each sequence's d_sinks (sdpa-packed.h), 0 for none.
int32_t backward_packed(uint32_t desc, uint32_t grad, int32_t sequences, uint32_t q_starts, uint32_t k_starts,
                        uint32_t d_sinks_by_sequence, uint32_t scratch, double scratch_floats, int32_t threads) {
  sdpa::PackedBackwardProblem p = to_packed_backward(desc, grad, sequences, q_starts, k_starts);
  p.d_sinks_by_sequence = at<float>(d_sinks_by_sequence);
  return static_cast<int32_t>(
      sdpa::backward_packed(p, at<float>(scratch), static_cast<uint64_t>(scratch_floats), pool_for(threads)));
}

bool reads_keys_in_place(uint32_t desc) { return sdpa::reads_keys_in_place(to_problem(problem_at(desc))); }

bool query_heads_keep_bits(uint32_t desc, int32_t first, int32_t count) {
  return sdpa::query_heads_keep_bits(to_problem(problem_at(desc)), first, count);
}

int32_t least_query_rows(uint32_t desc, int32_t at_least) {
  return sdpa::least_query_rows(to_problem(problem_at(desc)), at_least);
}

int32_t segment_count(uint32_t desc) { return sdpa::segment_count(to_problem(problem_at(desc))); }

double segment_scratch_floats(uint32_t desc) {
  return static_cast<double>(sdpa::segment_scratch_floats(to_problem(problem_at(desc))));
}

double segment_partials_floats(uint32_t desc) {
  return static_cast<double>(sdpa::segment_partials_floats(to_problem(problem_at(desc))));
}

// A streamed decode (sdpa.h, forward_segment) of a problem that is one (batch, KV head):
// the description (an argument block's address) is read once, then only addresses move, per
// (batch, KV head) the rows of Q, output, mask, offsets, key lengths and starts, the KV group's sinks
// and ALiBi slopes, and the pair's batch and first query head in the dropout mask,
// per segment K and V.
class SegmentStream {
 public:
  explicit SegmentStream(uint32_t desc) : p_(to_problem(problem_at(desc))) {}

  void set_pair(uint32_t query, uint32_t output, uint32_t mask, uint32_t causal_offsets, uint32_t key_lengths,
                uint32_t key_starts, uint32_t sinks, uint32_t alibi_slopes, int32_t dropout_batch_base,
                int32_t dropout_head_base) {
    p_.query = at<const float>(query);
    p_.output = at<float>(output);
    p_.mask = at<const void>(mask);
    p_.causal_offsets = at<const int32_t>(causal_offsets);
    p_.key_lengths = at<const int32_t>(key_lengths);
    p_.key_starts = at<const int32_t>(key_starts);
    p_.sinks = at<const float>(sinks);
    p_.alibi_slopes = at<const float>(alibi_slopes);
    p_.dropout_batch_base = dropout_batch_base;
    p_.dropout_head_base = dropout_head_base;
  }

  int32_t forward(int32_t segment, uint32_t key, uint32_t value, uint32_t partials, uint32_t scratch,
                  double scratch_floats) {
    p_.key = at<const void>(key);
    p_.value = at<const void>(value);
    return static_cast<int32_t>(sdpa::forward_segment(p_, segment, at<float>(partials), at<float>(scratch),
                                                      static_cast<uint64_t>(scratch_floats)));
  }

  int32_t merge(uint32_t partials) {
    return static_cast<int32_t>(sdpa::merge_segments(p_, at<const float>(partials)));
  }

 private:
  sdpa::Problem p_;
};

// KV cache writes (src/kv-cache.h): rows [B, H, L, D] from `src` into `dst`, both with
// element strides; types are sdpa::KvType values (0 float32, 1 float16, 2 float16 known to
// hold no Inf or NaN, 3 bfloat16).
int32_t copy_rows(uint32_t dst, int32_t dst_type, double dst_b, double dst_h, double dst_l, uint32_t src,
                  int32_t src_type, double src_b, double src_h, double src_l, int32_t batch, int32_t heads,
                  int32_t rows, int32_t dim) {
  sdpa::RowBlock to{at<void>(dst), static_cast<sdpa::KvType>(dst_type), static_cast<int64_t>(dst_b),
                    static_cast<int64_t>(dst_h), static_cast<int64_t>(dst_l)};
  sdpa::RowBlock from{at<void>(src), static_cast<sdpa::KvType>(src_type), static_cast<int64_t>(src_b),
                      static_cast<int64_t>(src_h), static_cast<int64_t>(src_l)};
  return static_cast<int32_t>(sdpa::copy_rows(to, from, batch, heads, rows, dim));
}

// sdpa::halves_have_inf_nan: runs of halves in a float16 cache's storage (byte address, counts
// in halves).
bool halves_have_inf_nan(uint32_t first, double run_stride, int32_t runs, double run_length) {
  return sdpa::halves_have_inf_nan(at<const uint16_t>(first), static_cast<int64_t>(run_stride), runs,
                                   static_cast<int64_t>(run_length));
}

// sdpa::f16_widen_in_place: a Float16Array's `count` values, copied as raw halves into the
// upper half of the float32 block at byte address `block`, widened there (js/memory.ts).
void widen_halves_in_place(uint32_t block, double count) {
  sdpa::f16_widen_in_place(at<float>(block), static_cast<int64_t>(count));
}

// Bytes of the wasm heap in malloc'd blocks right now: the leak tests compare it before
// and after (a leak of any size shows, where probing for a free block's address may not).
double heap_bytes_in_use() { return static_cast<double>(mallinfo().uordblks); }

std::string status_name(int32_t status) {
  return sdpa::status_name(static_cast<sdpa::Status>(status));
}

}  // namespace

EMSCRIPTEN_BINDINGS(sdpa_wasm) {
  emscripten::function("argumentLayout", &argument_layout);
  emscripten::function("scratchFloats", &scratch_floats);
  emscripten::function("backwardScratchFloats", &backward_scratch_floats);
  emscripten::function("backward", &backward);
  emscripten::function("maskGradParts", &mask_grad_parts);
  emscripten::function("forward", &forward);
  emscripten::function("packedScratchFloats", &packed_scratch_floats);
  emscripten::function("forwardPacked", &forward_packed);
  emscripten::function("packedBackwardScratchFloats", &packed_backward_scratch_floats);
  emscripten::function("backwardPacked", &backward_packed);
  emscripten::function("readsKeysInPlace", &reads_keys_in_place);
  emscripten::function("queryHeadsKeepBits", &query_heads_keep_bits);
  emscripten::function("leastQueryRows", &least_query_rows);
  emscripten::function("segmentKeys", &sdpa::segment_keys);
  emscripten::function("segmentCount", &segment_count);
  emscripten::function("segmentScratchFloats", &segment_scratch_floats);
  emscripten::function("segmentPartialsFloats", &segment_partials_floats);
  emscripten::class_<SegmentStream>("SegmentStream")
      .constructor<uint32_t>()
      .function("setPair", &SegmentStream::set_pair)
      .function("forward", &SegmentStream::forward)
      .function("merge", &SegmentStream::merge);
  emscripten::function("copyRows", &copy_rows);
  emscripten::function("halvesHaveInfNaN", &halves_have_inf_nan);
  emscripten::function("widenHalvesInPlace", &widen_halves_in_place);
  emscripten::function("statusName", &status_name);
  emscripten::function("heapBytesInUse", &heap_bytes_in_use);
}
