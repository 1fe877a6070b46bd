#include "reference/fp8_quantize_ref.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace flashhop::reference {
namespace {

// e4m3: 3 mantissa bits, exponent bias 7; the smallest normal exponent is -6, below which the
// values are multiples of 2^-9.
constexpr int kMantissaBits = 3;
constexpr int kMinNormalExponent = -6;
constexpr int kExponentBias = 7;

// The spacing of e4m3 values around |v| (v finite, below 512).
double quantum_of(double v) {
  int exponent = 0;
  std::frexp(std::fabs(v), &exponent);  // |v| = m 2^exponent, m in [0.5, 1); 0 for v = 0
  return std::ldexp(1.0, std::max(exponent - 1, kMinNormalExponent) - kMantissaBits);
}

}  // namespace

double round_to_e4m3(double v) {
  if (std::isnan(v)) return v;
  const double magnitude = std::fabs(v);
  if (magnitude >= 2 * kFp8E4m3Max) return std::copysign(kFp8E4m3Max, v);
  const double quantum = quantum_of(v);
  // |v| / quantum is exact (a power of two); nearbyint rounds half to even in the default mode.
  const double rounded = std::min<double>(std::nearbyint(magnitude / quantum) * quantum, kFp8E4m3Max);
  return std::copysign(rounded, v);
}

double e4m3_value(std::uint8_t bits) {
  const int exponent = (bits >> kMantissaBits) & 0xf;
  const int mantissa = bits & ((1 << kMantissaBits) - 1);
  double magnitude;
  if (exponent == 0xf && mantissa == 0x7) {
    magnitude = std::numeric_limits<double>::quiet_NaN();
  } else if (exponent == 0) {
    magnitude = std::ldexp(mantissa, kMinNormalExponent - kMantissaBits);
  } else {
    magnitude = std::ldexp(1.0 + std::ldexp(mantissa, -kMantissaBits), exponent - kExponentBias);
  }
  return (bits & 0x80) != 0 ? -magnitude : magnitude;
}

double e4m3_half_ulp(double v) { return quantum_of(std::min<double>(std::fabs(v), kFp8E4m3Max)) / 2; }

int hadamard_block(int head_dim) { return head_dim & -head_dim; }

void hadamard_rotate(const float* signs, int head_dim, double* row) {
  for (int i = 0; i < head_dim; ++i) {
    if (!(signs[i] >= 0.f)) row[i] = -row[i];
  }
  const int block = hadamard_block(head_dim);
  const double normalisation = 1.0 / std::sqrt(static_cast<double>(block));
  for (double* x = row; x < row + head_dim; x += block) {
    for (int h = 1; h < block; h *= 2) {
      for (int i = 0; i < block; i += 2 * h) {
        for (int j = i; j < i + h; ++j) {
          const double a = x[j], b = x[j + h];
          x[j] = a + b;
          x[j + h] = a - b;
        }
      }
    }
    for (int i = 0; i < block; ++i) x[i] *= normalisation;
  }
}

std::int64_t descale_entries(const QuantizeShape& shape, Fp8Scaling scaling, int groups) {
  switch (scaling) {
    case Fp8Scaling::kPerTensor:
      return 1;
    case Fp8Scaling::kPerHead:
      return std::int64_t{shape.batch} * groups;
    case Fp8Scaling::kPerBlock:
      return std::int64_t{shape.batch} * shape.nheads *
             ((shape.seqlen + kFp8ScaleBlockRows - 1) / kFp8ScaleBlockRows);
  }
  return 0;
}

std::int64_t descale_index(const QuantizeShape& shape, Fp8Scaling scaling, int groups, int batch, int row, int head) {
  switch (scaling) {
    case Fp8Scaling::kPerTensor:
      return 0;
    case Fp8Scaling::kPerHead:
      return std::int64_t{batch} * groups + head / (shape.nheads / groups);
    case Fp8Scaling::kPerBlock: {
      const int blocks = (shape.seqlen + kFp8ScaleBlockRows - 1) / kFp8ScaleBlockRows;
      return (std::int64_t{batch} * shape.nheads + head) * blocks + row / kFp8ScaleBlockRows;
    }
  }
  return 0;
}

Quantized quantize_fp8(const QuantizeShape& shape, const float* x, Fp8Scaling scaling, int groups, const float* signs) {
  const int d = shape.head_dim;
  const std::int64_t elements = std::int64_t{shape.batch} * shape.seqlen * shape.nheads * d;
  Quantized result;
  result.y.assign(x, x + elements);
  std::vector<double> amax(static_cast<std::size_t>(descale_entries(shape, scaling, groups)), 0.0);
  std::vector<std::int64_t> entry_of_row;  // (batch, seqlen, nheads) rows, row-major
  for (int b = 0; b < shape.batch; ++b) {
    for (int s = 0; s < shape.seqlen; ++s) {
      for (int h = 0; h < shape.nheads; ++h) {
        double* row = &result.y[entry_of_row.size() * d];
        if (signs != nullptr) hadamard_rotate(signs, d, row);
        const std::int64_t entry = descale_index(shape, scaling, groups, b, s, h);
        for (int i = 0; i < d; ++i) amax[entry] = std::max(amax[entry], std::fabs(row[i]));
        entry_of_row.push_back(entry);
      }
    }
  }
  result.descale.resize(amax.size());
  for (std::size_t i = 0; i < amax.size(); ++i) result.descale[i] = amax[i] > 0 ? amax[i] / kFp8E4m3Max : 1.0;
  result.scaled.resize(result.y.size());
  result.quantized.resize(result.y.size());
  for (std::size_t i = 0; i < result.y.size(); ++i) {
    result.scaled[i] = result.y[i] / result.descale[entry_of_row[i / d]];
    result.quantized[i] = round_to_e4m3(result.scaled[i]);
  }
  return result;
}

}  // namespace flashhop::reference
