// The check of a tensor that lives in host memory.
#pragma once

#include <cstdint>

#include "core/check_limits.h"
#include "core/check_semantics.h"

namespace nanhunt {

// Counts NaN, infinities, near-max, underflow and the largest magnitude of
// `count` values of `format` stored contiguously at `data`. The order of
// values does not matter, so any dense block of memory can be passed.
// Thread-safe; reads `data` only; never allocates.
CheckCounts CheckHostBuffer(Format format, const void* data, int64_t count,
                            const CheckLimits& limits);


// The counts of one scalar argument (a Python float given to an op), as a
// tensor of one value would have them. max_abs_bits stays 0: scalars are
// described by their value.
CheckCounts CountScalar(double value);

}  // namespace nanhunt
