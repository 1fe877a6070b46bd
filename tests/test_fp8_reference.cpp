// The CPU reference of quantize_fp8 (reference/fp8_quantize_ref.h): its e4m3 rounding against
// cuda_fp8.h's host conversion on every code, every tie and the values around them; the rotation
// against rows worked out by hand and as an orthogonal map; the groups' descale.
#include <gtest/gtest.h>

#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "reference/fp8_quantize_ref.h"

namespace flashhop_test {
namespace {

namespace ref = flashhop::reference;
using flashhop::Fp8Scaling;

// cuda_fp8.h's conversion with satfinite, decoded by the reference.
double cuda_e4m3(double v) { return ref::e4m3_value(__nv_cvt_double_to_fp8(v, __NV_SATFINITE, __NV_E4M3)); }

TEST(Fp8Reference, DecodesEveryCodeAsCudaFp8) {
  for (int code = 0; code < 256; ++code) {
    const double expected =
        static_cast<double>(__half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<std::uint8_t>(code), __NV_E4M3))));
    const double got = ref::e4m3_value(static_cast<std::uint8_t>(code));
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(got)) << code;
    } else {
      EXPECT_EQ(got, expected) << code;
      EXPECT_EQ(std::signbit(got), std::signbit(expected)) << code;
    }
  }
  EXPECT_EQ(ref::e4m3_value(0x7e), 448.0);
  EXPECT_EQ(ref::e4m3_value(0x01), std::ldexp(1.0, -9));
}

// Every code, every midpoint between neighbours (a tie: to the even code), the doubles just
// beside each midpoint, values past 448 (saturated), and random values.
TEST(Fp8Reference, RoundsAsCudaFp8) {
  std::vector<double> values;
  std::vector<double> codes;
  for (int code = 0; code < 0x7f; ++code) codes.push_back(ref::e4m3_value(static_cast<std::uint8_t>(code)));
  for (std::size_t i = 0; i < codes.size(); ++i) {
    values.push_back(codes[i]);
    if (i + 1 < codes.size()) {
      const double midpoint = (codes[i] + codes[i + 1]) / 2;
      values.insert(values.end(), {midpoint, std::nextafter(midpoint, 0.0), std::nextafter(midpoint, 1e9)});
    }
  }
  values.insert(values.end(), {449.0, 463.99, 464.0, 464.01, 479.0, 480.0, 1e6, std::numeric_limits<double>::infinity()});
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> wide(0.0, 500.0), narrow(0.0, 0.02);
  for (int i = 0; i < 20000; ++i) values.insert(values.end(), {wide(rng), narrow(rng)});
  for (double magnitude : values) {
    for (double v : {magnitude, -magnitude}) {
      EXPECT_EQ(ref::round_to_e4m3(v), cuda_e4m3(v)) << v;
      EXPECT_LE(std::fabs(ref::round_to_e4m3(v) - v), ref::e4m3_half_ulp(v) + (std::fabs(v) > 448 ? std::fabs(v) : 0)) << v;
    }
  }
  EXPECT_EQ(ref::round_to_e4m3(1.0625), 1.0);                     // tie: 1.000 is even
  EXPECT_EQ(ref::round_to_e4m3(1.1875), 1.25);                    // tie: 1.010 is even
  EXPECT_EQ(ref::round_to_e4m3(std::ldexp(3.0, -10)), std::ldexp(1.0, -8));  // subnormal tie
  EXPECT_EQ(ref::round_to_e4m3(std::ldexp(1.0, -10)), 0.0);
  EXPECT_EQ(ref::round_to_e4m3(-470.0), -448.0);
  EXPECT_TRUE(std::isnan(ref::round_to_e4m3(std::numeric_limits<double>::quiet_NaN())));
  EXPECT_EQ(ref::e4m3_half_ulp(1.0), 1.0 / 16);
  EXPECT_EQ(ref::e4m3_half_ulp(300.0), 16.0);
  EXPECT_EQ(ref::e4m3_half_ulp(0.001), std::ldexp(1.0, -10));
}

TEST(Fp8Reference, HadamardBlocks) {
  EXPECT_EQ(ref::hadamard_block(64), 64);
  EXPECT_EQ(ref::hadamard_block(96), 32);
  EXPECT_EQ(ref::hadamard_block(128), 128);
  EXPECT_EQ(ref::hadamard_block(192), 64);
  EXPECT_EQ(ref::hadamard_block(256), 256);
}

// H's column j is (-1)^popcount(i & j) / sqrt(b) in row i, within the block of element j.
TEST(Fp8Reference, HadamardOfAUnitVector) {
  for (int d : {64, 96, 128, 192, 256}) {
    const int block = ref::hadamard_block(d);
    for (int j : {0, 5, d / 2 + 3, d - 1}) {
      std::vector<float> signs(d, 1.f);
      signs[j] = -0.5f;  // any negative value flips
      std::vector<double> row(d, 0.0);
      row[j] = 2.0;
      ref::hadamard_rotate(signs.data(), d, row.data());
      const int first = j / block * block;
      for (int i = 0; i < d; ++i) {
        double expected = 0.0;
        if (i >= first && i < first + block) {
          const int parity = __builtin_popcount((i - first) & (j - first)) % 2;
          expected = (parity ? 2.0 : -2.0) / std::sqrt(static_cast<double>(block));
        }
        EXPECT_NEAR(row[i], expected, 1e-15) << "d " << d << " j " << j << " i " << i;
      }
    }
  }
}

// The same signs on two rows keep their dot product (H orthogonal); without signs flipped H is its
// own inverse. Signs of 0, -0 and NaN: +1, +1, -1.
TEST(Fp8Reference, HadamardIsOrthogonal) {
  std::mt19937 rng(3);
  std::normal_distribution<double> normal;
  for (int d : {64, 96, 128, 192, 256}) {
    std::vector<float> signs(d), ones(d, 1.f);
    for (float& s : signs) s = normal(rng) < 0 ? -1.f : 1.f;
    signs[0] = 0.f;
    signs[1] = -0.f;
    signs[2] = std::numeric_limits<float>::quiet_NaN();
    std::vector<double> a(d), b(d);
    for (int i = 0; i < d; ++i) {
      a[i] = normal(rng);
      b[i] = normal(rng);
    }
    double dot = 0.0;
    for (int i = 0; i < d; ++i) dot += a[i] * b[i];
    std::vector<double> ra = a, rb = b;
    ref::hadamard_rotate(signs.data(), d, ra.data());
    ref::hadamard_rotate(signs.data(), d, rb.data());
    double rotated_dot = 0.0;
    for (int i = 0; i < d; ++i) rotated_dot += ra[i] * rb[i];
    EXPECT_NEAR(rotated_dot, dot, 1e-12 * d) << d;
    // Undo: H H = I, then the signs (0 and -0 kept, NaN flipped).
    ref::hadamard_rotate(ones.data(), d, ra.data());
    EXPECT_NEAR(ra[0], a[0], 1e-12);
    EXPECT_NEAR(ra[1], a[1], 1e-12);
    EXPECT_NEAR(ra[2], -a[2], 1e-12);
    for (int i = 3; i < d; ++i) EXPECT_NEAR(ra[i] * signs[i], a[i], 1e-12) << d << " " << i;
  }
}

// descale per group: amax / 448, 1 for a group of zeros; each element y / its group's descale.
TEST(Fp8Reference, GroupsAndTheirDescale) {
  const ref::QuantizeShape shape{2, 130, 4, 64};
  std::vector<float> x(std::size_t(2) * 130 * 4 * 64);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  for (float& v : x) v = normal(rng);
  // Batch entry 1, heads 0 and 1 (group 0 of two groups): zeros.
  for (int s = 0; s < 130; ++s) {
    for (int h = 0; h < 2; ++h) {
      for (int i = 0; i < 64; ++i) x[((std::size_t(130) + s) * 4 + h) * 64 + i] = 0.f;
    }
  }
  const auto amax_of = [&](int b, int h_begin, int h_end, int s_begin, int s_end) {
    double amax = 0.0;
    for (int s = s_begin; s < s_end; ++s) {
      for (int h = h_begin; h < h_end; ++h) {
        for (int i = 0; i < 64; ++i) amax = std::max(amax, std::fabs(double(x[((std::size_t(b) * 130 + s) * 4 + h) * 64 + i])));
      }
    }
    return amax;
  };

  const ref::Quantized per_head = ref::quantize_fp8(shape, x.data(), Fp8Scaling::kPerHead, 2, nullptr);
  ASSERT_EQ(per_head.descale.size(), 4u);
  EXPECT_EQ(per_head.descale[0], amax_of(0, 0, 2, 0, 130) / 448);
  EXPECT_EQ(per_head.descale[1], amax_of(0, 2, 4, 0, 130) / 448);
  EXPECT_EQ(per_head.descale[2], 1.0);
  EXPECT_EQ(per_head.descale[3], amax_of(1, 2, 4, 0, 130) / 448);
  EXPECT_EQ(ref::descale_index(shape, Fp8Scaling::kPerHead, 2, 1, 7, 3), 3);

  const ref::Quantized per_block = ref::quantize_fp8(shape, x.data(), Fp8Scaling::kPerBlock, 0, nullptr);
  ASSERT_EQ(per_block.descale.size(), 2u * 4 * 2);
  EXPECT_EQ(per_block.descale[(0 * 4 + 3) * 2 + 1], amax_of(0, 3, 4, 128, 130) / 448);
  EXPECT_EQ(per_block.descale[(1 * 4 + 1) * 2 + 0], 1.0);
  EXPECT_EQ(ref::descale_index(shape, Fp8Scaling::kPerBlock, 0, 1, 129, 2), (1 * 4 + 2) * 2 + 1);

  const ref::Quantized per_tensor = ref::quantize_fp8(shape, x.data(), Fp8Scaling::kPerTensor, 0, nullptr);
  ASSERT_EQ(per_tensor.descale.size(), 1u);
  EXPECT_EQ(per_tensor.descale[0], std::max(amax_of(0, 0, 4, 0, 130), amax_of(1, 0, 4, 0, 130)) / 448);
  double largest = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(per_tensor.y[i], x[i]);
    EXPECT_EQ(per_tensor.scaled[i], x[i] / per_tensor.descale[0]);
    EXPECT_EQ(per_tensor.quantized[i], ref::round_to_e4m3(per_tensor.scaled[i]));
    largest = std::max(largest, std::fabs(per_tensor.quantized[i]));
  }
  EXPECT_EQ(largest, 448.0);  // the amax element
}

}  // namespace
}  // namespace flashhop_test
