// CPU reference of flashhop::quantize_fp8 in double precision: the rotation by the plain fast
// Walsh-Hadamard transform, the groups' amax and descale, and round-to-nearest-even e4m3 values
// coded bit by bit, independent of cuda_fp8.h. For the tests.
#pragma once

#include <cstdint>
#include <vector>

#include "flashhop/flashhop.h"

namespace flashhop::reference {

// The e4m3 (float8_e4m3fn) value nearest to v, ties to the even mantissa, saturated at +-448
// (the conversion with satfinite); NaN stays NaN.
double round_to_e4m3(double v);

// The value of the e4m3 code `bits` (NaN for 0x7f and 0xff).
double e4m3_value(std::uint8_t bits);

// Half the distance from |v| to the next e4m3 value away from 0: the largest error of a correct
// rounding of v, below 448.
double e4m3_half_ulp(double v);

// The Hadamard block of a head dim: the largest power of two dividing it.
int hadamard_block(int head_dim);

// row (head_dim values) -> H (s * row), s = +1 where signs[i] >= 0 and -1 elsewhere (NaN
// included), H the Walsh-Hadamard transform on blocks of hadamard_block(head_dim) values, scaled
// by 1 / sqrt(block).
void hadamard_rotate(const float* signs, int head_dim, double* row);

struct QuantizeShape {
  int batch = 1, seqlen = 0, nheads = 1, head_dim = 0;
};

// descale's entries, contiguous in the layout of `scaling` (flashhop.h): 1, batch * groups, or
// batch * nheads * ceil(seqlen / kFp8ScaleBlockRows).
std::int64_t descale_entries(const QuantizeShape& shape, Fp8Scaling scaling, int groups);
// The entry of element row `row` of head `head` of batch entry `batch` in that layout; `groups`
// counts only per head.
std::int64_t descale_index(const QuantizeShape& shape, Fp8Scaling scaling, int groups, int batch, int row, int head);

struct Quantized {
  std::vector<double> y;          // x's shape: x, or rotated
  std::vector<double> descale;    // descale_entries(): amax / 448, 1 where amax is 0
  std::vector<double> scaled;     // x's shape: y / the descale of its group, exactly
  std::vector<double> quantized;  // x's shape: round_to_e4m3(scaled)
};

// x contiguous (batch, seqlen, nheads, head_dim); signs null (no rotation) or head_dim values.
Quantized quantize_fp8(const QuantizeShape& shape, const float* x, Fp8Scaling scaling, int groups, const float* signs);

}  // namespace flashhop::reference
