// When work is worth splitting over threads: one fact, shared by forward() (src/sdpa.cc) and
// the packed sequences (src/sdpa-packed.cc).
#pragma once

namespace sdpa {

// Below this many multiply-adds (~0.2 ms on one core) the work runs on the calling thread
// alone: waking workers costs more than it saves, and on a busy machine a descheduled
// worker can delay a tiny call by a whole scheduling quantum.
constexpr double kMinParallelMultiplyAdds = 4e6;

}  // namespace sdpa
