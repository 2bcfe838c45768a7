// The test oracle: attention written as plainly as possible, in double precision, with
// the full [Lq, Lk] score matrix. Not the product path; never used by the package.
#pragma once

#include <vector>

#include "sdpa.h"

namespace sdpa {

// Reads the problem's inputs (p.output and p.weights are ignored) and returns
//   output  [B, Hq, Lq, Ev] dense, and, when `weights` is non-null, weights [B, Hq, Lq, Lk].
std::vector<double> reference_forward(const Problem& p, std::vector<double>* weights);

}  // namespace sdpa
