// Embind surface of the wasm module: plain numbers in, status out. No math here.
// The TypeScript layer (js/) validates the user's input, copies tensors into the wasm heap,
// fills a ProblemDesc with their addresses (byte offsets into the heap) and strides (in
// elements), and turns a non-ok status into an exception.
#include <emscripten/bind.h>
#include <malloc.h>

#include <cstdint>
#include <memory>

#include "kv-cache.h"
#include "parallel/thread-pool.h"
#include "sdpa-backward.h"
#include "sdpa.h"

namespace {

struct ProblemDesc {
  int32_t batch, qHeads, kvHeads, qLen, kvLen, headDim, valueDim;
  int32_t kvType;  // sdpa::KvType: 0 float32, 1 float16 (key and value hold halves)
  uint32_t query, key, value, output, weights, mask, causalOffsets, keyLengths;
  uint32_t logsumexp;  // sdpa::Problem::logsumexp: [B, Hq, Lq] written by forward(), 0 for none
  int32_t qStrideB, qStrideH, qStrideL, kStrideB, kStrideH, kStrideL;
  int32_t vStrideB, vStrideH, vStrideL, oStrideB, oStrideH, oStrideL;
  int32_t maskKind, maskStrideB, maskStrideH, maskStrideQ, maskStrideK;
  float scale, softcap;
  bool causal;
  int32_t causalOffset;
  bool readKvInOrder;  // sdpa::Problem::read_kv_in_order: K/V resident in wasm memory (a KV cache)
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
  p.causal = d.causal;
  p.causal_offset = d.causalOffset;
  p.causal_offsets = at<const int32_t>(d.causalOffsets);
  p.key_lengths = at<const int32_t>(d.keyLengths);
  p.read_kv_in_order = d.readKvInOrder;
  p.logsumexp = at<float>(d.logsumexp);
  return p;
}

// The backward pass's own operands (src/sdpa-backward.h); the forward's are a ProblemDesc
// (its `output` is the forward's output O, read).
struct BackwardDesc {
  uint32_t logsumexp, gradOutput, dQuery, dKey, dValue;
  int32_t goStrideB, goStrideH, goStrideL, dqStrideB, dqStrideH, dqStrideL;
  int32_t dkStrideB, dkStrideH, dkStrideL, dvStrideB, dvStrideH, dvStrideL;
};

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
  return p;
}

double scratch_floats(const ProblemDesc& d, int32_t threads) {
  return static_cast<double>(sdpa::scratch_floats(to_problem(d), threads));
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

int32_t forward(const ProblemDesc& d, uint32_t scratch, double scratch_floats, int32_t threads) {
  return static_cast<int32_t>(sdpa::forward(to_problem(d), at<float>(scratch),
                                            static_cast<uint64_t>(scratch_floats), pool_for(threads)));
}

double backward_scratch_floats(const ProblemDesc& d, const BackwardDesc& g, int32_t threads) {
  return static_cast<double>(sdpa::backward_scratch_floats(to_backward(d, g), threads));
}

int32_t backward(const ProblemDesc& d, const BackwardDesc& g, uint32_t scratch, double scratch_floats,
                 int32_t threads) {
  return static_cast<int32_t>(sdpa::backward(to_backward(d, g), at<float>(scratch),
                                             static_cast<uint64_t>(scratch_floats), pool_for(threads)));
}

bool reads_keys_in_place(const ProblemDesc& d) { return sdpa::reads_keys_in_place(to_problem(d)); }

int32_t segment_count(const ProblemDesc& d) { return sdpa::segment_count(to_problem(d)); }

double segment_scratch_floats(const ProblemDesc& d) {
  return static_cast<double>(sdpa::segment_scratch_floats(to_problem(d)));
}

double segment_partials_floats(const ProblemDesc& d) {
  return static_cast<double>(sdpa::segment_partials_floats(to_problem(d)));
}

// A streamed decode (sdpa.h, forward_segment) of a problem that is one (batch, KV head):
// the description is converted once, then only addresses move, per (batch, KV head) the
// rows of Q, output, mask, offsets and key lengths, per segment K and V. Calls with plain
// numbers only: a ProblemDesc costs microseconds to convert, and a decode makes hundreds.
class SegmentStream {
 public:
  explicit SegmentStream(const ProblemDesc& d) : p_(to_problem(d)) {}

  void set_pair(uint32_t query, uint32_t output, uint32_t mask, uint32_t causal_offsets, uint32_t key_lengths) {
    p_.query = at<const float>(query);
    p_.output = at<float>(output);
    p_.mask = at<const void>(mask);
    p_.causal_offsets = at<const int32_t>(causal_offsets);
    p_.key_lengths = at<const int32_t>(key_lengths);
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
// element strides; types are sdpa::KvType values (0 float32, 1 float16).
int32_t copy_rows(uint32_t dst, int32_t dst_type, double dst_b, double dst_h, double dst_l, uint32_t src,
                  int32_t src_type, double src_b, double src_h, double src_l, int32_t batch, int32_t heads,
                  int32_t rows, int32_t dim) {
  sdpa::RowBlock to{at<void>(dst), static_cast<sdpa::KvType>(dst_type), static_cast<int64_t>(dst_b),
                    static_cast<int64_t>(dst_h), static_cast<int64_t>(dst_l)};
  sdpa::RowBlock from{at<void>(src), static_cast<sdpa::KvType>(src_type), static_cast<int64_t>(src_b),
                      static_cast<int64_t>(src_h), static_cast<int64_t>(src_l)};
  return static_cast<int32_t>(sdpa::copy_rows(to, from, batch, heads, rows, dim));
}

// Bytes of the wasm heap in malloc'd blocks right now: the leak tests compare it before
// and after (a leak of any size shows, where probing for a free block's address may not).
double heap_bytes_in_use() { return static_cast<double>(mallinfo().uordblks); }

std::string status_name(int32_t status) {
  return sdpa::status_name(static_cast<sdpa::Status>(status));
}

}  // namespace

EMSCRIPTEN_BINDINGS(sdpa_wasm) {
  emscripten::value_object<ProblemDesc>("ProblemDesc")
      .field("batch", &ProblemDesc::batch)
      .field("qHeads", &ProblemDesc::qHeads)
      .field("kvHeads", &ProblemDesc::kvHeads)
      .field("qLen", &ProblemDesc::qLen)
      .field("kvLen", &ProblemDesc::kvLen)
      .field("headDim", &ProblemDesc::headDim)
      .field("valueDim", &ProblemDesc::valueDim)
      .field("kvType", &ProblemDesc::kvType)
      .field("query", &ProblemDesc::query)
      .field("key", &ProblemDesc::key)
      .field("value", &ProblemDesc::value)
      .field("output", &ProblemDesc::output)
      .field("weights", &ProblemDesc::weights)
      .field("mask", &ProblemDesc::mask)
      .field("causalOffsets", &ProblemDesc::causalOffsets)
      .field("keyLengths", &ProblemDesc::keyLengths)
      .field("logsumexp", &ProblemDesc::logsumexp)
      .field("qStrideB", &ProblemDesc::qStrideB)
      .field("qStrideH", &ProblemDesc::qStrideH)
      .field("qStrideL", &ProblemDesc::qStrideL)
      .field("kStrideB", &ProblemDesc::kStrideB)
      .field("kStrideH", &ProblemDesc::kStrideH)
      .field("kStrideL", &ProblemDesc::kStrideL)
      .field("vStrideB", &ProblemDesc::vStrideB)
      .field("vStrideH", &ProblemDesc::vStrideH)
      .field("vStrideL", &ProblemDesc::vStrideL)
      .field("oStrideB", &ProblemDesc::oStrideB)
      .field("oStrideH", &ProblemDesc::oStrideH)
      .field("oStrideL", &ProblemDesc::oStrideL)
      .field("maskKind", &ProblemDesc::maskKind)
      .field("maskStrideB", &ProblemDesc::maskStrideB)
      .field("maskStrideH", &ProblemDesc::maskStrideH)
      .field("maskStrideQ", &ProblemDesc::maskStrideQ)
      .field("maskStrideK", &ProblemDesc::maskStrideK)
      .field("scale", &ProblemDesc::scale)
      .field("softcap", &ProblemDesc::softcap)
      .field("causal", &ProblemDesc::causal)
      .field("causalOffset", &ProblemDesc::causalOffset)
      .field("readKvInOrder", &ProblemDesc::readKvInOrder);
  emscripten::value_object<BackwardDesc>("BackwardDesc")
      .field("logsumexp", &BackwardDesc::logsumexp)
      .field("gradOutput", &BackwardDesc::gradOutput)
      .field("dQuery", &BackwardDesc::dQuery)
      .field("dKey", &BackwardDesc::dKey)
      .field("dValue", &BackwardDesc::dValue)
      .field("goStrideB", &BackwardDesc::goStrideB)
      .field("goStrideH", &BackwardDesc::goStrideH)
      .field("goStrideL", &BackwardDesc::goStrideL)
      .field("dqStrideB", &BackwardDesc::dqStrideB)
      .field("dqStrideH", &BackwardDesc::dqStrideH)
      .field("dqStrideL", &BackwardDesc::dqStrideL)
      .field("dkStrideB", &BackwardDesc::dkStrideB)
      .field("dkStrideH", &BackwardDesc::dkStrideH)
      .field("dkStrideL", &BackwardDesc::dkStrideL)
      .field("dvStrideB", &BackwardDesc::dvStrideB)
      .field("dvStrideH", &BackwardDesc::dvStrideH)
      .field("dvStrideL", &BackwardDesc::dvStrideL);
  emscripten::function("scratchFloats", &scratch_floats);
  emscripten::function("backwardScratchFloats", &backward_scratch_floats);
  emscripten::function("backward", &backward);
  emscripten::function("forward", &forward);
  emscripten::function("readsKeysInPlace", &reads_keys_in_place);
  emscripten::function("segmentKeys", &sdpa::segment_keys);
  emscripten::function("segmentCount", &segment_count);
  emscripten::function("segmentScratchFloats", &segment_scratch_floats);
  emscripten::function("segmentPartialsFloats", &segment_partials_floats);
  emscripten::class_<SegmentStream>("SegmentStream")
      .constructor<const ProblemDesc&>()
      .function("setPair", &SegmentStream::set_pair)
      .function("forward", &SegmentStream::forward)
      .function("merge", &SegmentStream::merge);
  emscripten::function("copyRows", &copy_rows);
  emscripten::function("statusName", &status_name);
  emscripten::function("heapBytesInUse", &heap_bytes_in_use);
}
