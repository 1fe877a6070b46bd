// The CPU reference against results worked out by hand, and against the direct formula (no max
// subtraction, no blocking) on small random inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "reference/attention_ref.h"
#include "test_utils.h"

namespace flashhop_test {
namespace {

using flashhop::reference::AttentionShape;
using flashhop::reference::ScoreOptions;

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Result {
  std::vector<double> o, lse;
};

ScoreOptions scaled(double scale, bool causal) {
  ScoreOptions options;
  options.softmax_scale = scale;
  options.causal = causal;
  return options;
}

Result run_reference(const AttentionShape& s, const std::vector<float>& q, const std::vector<float>& k,
                     const std::vector<float>& v, const ScoreOptions& options) {
  Result result;
  flashhop::reference::attention_forward(s, q.data(), k.data(), v.data(), options, &result.o, &result.lse);
  return result;
}
Result run_reference(const AttentionShape& s, const std::vector<float>& q, const std::vector<float>& k,
                     const std::vector<float>& v, double scale, bool causal) {
  return run_reference(s, q, k, v, scaled(scale, causal));
}

std::int64_t o_index(const AttentionShape& s, int b, int i, int h, int c) {
  return ((std::int64_t{b} * s.seqlen_q + i) * s.nheads + h) * s.head_dim_v + c;
}
std::int64_t lse_index(const AttentionShape& s, int b, int h, int i) {
  return (std::int64_t{b} * s.nheads + h) * s.seqlen_q + i;
}
std::int64_t kv_index(const AttentionShape& s, int b, int j, int h, int c, int dim) {
  return ((std::int64_t{b} * s.seqlen_k + j) * s.nheads_kv + h) * dim + c;
}

std::vector<float> sized(const AttentionShape& s, int seqlen, int heads, int dim, float value = 0.f) {
  return std::vector<float>(static_cast<std::size_t>(s.batch) * seqlen * heads * dim, value);
}

std::vector<float> random_values(std::size_t count, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::vector<float> values(count);
  for (float& value : values) value = normal(rng);
  return values;
}

// Attention straight from its definition: O = sum_j exp(s_j) v_j / sum_j exp(s_j), LSE = log sum_j
// exp(s_j), over the keys j that pass every bound of `options` (j - i - (seqlen_k - seqlen_q) <= 0
// when causal, <= window_right, >= -window_left), with s_j soft-capped when asked. Fine for small
// scores only.
Result direct_formula(const AttentionShape& s, const std::vector<float>& q, const std::vector<float>& k,
                      const std::vector<float>& v, const ScoreOptions& options) {
  Result result;
  result.o.assign(static_cast<std::size_t>(s.batch) * s.seqlen_q * s.nheads * s.head_dim_v, 0.0);
  result.lse.assign(static_cast<std::size_t>(s.batch) * s.nheads * s.seqlen_q, -kInf);
  const int group = s.nheads / s.nheads_kv;
  for (int b = 0; b < s.batch; ++b) {
    for (int h = 0; h < s.nheads; ++h) {
      for (int i = 0; i < s.seqlen_q; ++i) {
        double sum_exp = 0;
        std::vector<double> weighted(s.head_dim_v, 0.0);
        for (int j = 0; j < s.seqlen_k; ++j) {
          const int distance = j - (i + s.seqlen_k - s.seqlen_q);  // keys right of the diagonal
          if (options.causal && distance > 0) continue;
          if (options.window_right >= 0 && distance > options.window_right) continue;
          if (options.window_left >= 0 && -distance > options.window_left) continue;
          double dot = 0;
          for (int c = 0; c < s.head_dim; ++c) {
            dot += double{q[((std::int64_t{b} * s.seqlen_q + i) * s.nheads + h) * s.head_dim + c]} *
                   k[kv_index(s, b, j, h / group, c, s.head_dim)];
          }
          double score = options.softmax_scale * dot;
          if (options.softcap > 0) score = options.softcap * std::tanh(score / options.softcap);
          const double e = std::exp(score);
          sum_exp += e;
          for (int c = 0; c < s.head_dim_v; ++c) weighted[c] += e * v[kv_index(s, b, j, h / group, c, s.head_dim_v)];
        }
        if (sum_exp == 0) continue;
        for (int c = 0; c < s.head_dim_v; ++c) result.o[o_index(s, b, i, h, c)] = weighted[c] / sum_exp;
        result.lse[lse_index(s, b, h, i)] = std::log(sum_exp);
      }
    }
  }
  return result;
}

TEST(Reference, SingleKeyGivesItsValueRow) {
  const AttentionShape s{1, 3, 1, 2, 1, 4, 3};
  std::mt19937 rng(1);
  const std::vector<float> q = random_values(3 * 2 * 4, rng), k = random_values(4, rng), v = random_values(3, rng);
  const double scale = 0.7;
  for (bool causal : {false, true}) {
    const Result r = run_reference(s, q, k, v, scale, causal);
    for (int i = 0; i < 3; ++i) {
      for (int h = 0; h < 2; ++h) {
        // Causal from the bottom-right: only the last query row (i = 2) sees the single key.
        if (causal && i < 2) {
          EXPECT_EQ(r.lse[lse_index(s, 0, h, i)], -kInf);
          for (int c = 0; c < 3; ++c) EXPECT_EQ(r.o[o_index(s, 0, i, h, c)], 0.0);
          continue;
        }
        double dot = 0;
        for (int c = 0; c < 4; ++c) dot += double{q[(i * 2 + h) * 4 + c]} * k[c];
        EXPECT_NEAR(r.lse[lse_index(s, 0, h, i)], scale * dot, 1e-12);
        for (int c = 0; c < 3; ++c) EXPECT_NEAR(r.o[o_index(s, 0, i, h, c)], v[c], 1e-12);
      }
    }
  }
}

// With q = 0 every score is 0, so each row averages the values of the keys it sees and its LSE is
// log(number of keys seen).
void expect_mean_of_visible_values(int seqlen_q, int seqlen_k, bool causal) {
  SCOPED_TRACE(::testing::Message() << "seqlen_q " << seqlen_q << " seqlen_k " << seqlen_k << " causal " << causal);
  const AttentionShape s{2, seqlen_q, seqlen_k, 1, 1, 8, 2};
  std::mt19937 rng(2);
  const std::vector<float> q = sized(s, seqlen_q, 1, 8), k = random_values(2 * seqlen_k * 8, rng);
  const std::vector<float> v = random_values(2 * seqlen_k * 2, rng);
  const Result r = run_reference(s, q, k, v, 1.0, causal);
  for (int b = 0; b < 2; ++b) {
    for (int i = 0; i < seqlen_q; ++i) {
      const int visible = causal ? std::clamp(i + seqlen_k - seqlen_q + 1, 0, seqlen_k) : seqlen_k;
      if (visible == 0) {
        EXPECT_EQ(r.lse[lse_index(s, b, 0, i)], -kInf) << "row " << i;
      } else {
        EXPECT_NEAR(r.lse[lse_index(s, b, 0, i)], std::log(double(visible)), 1e-12) << "row " << i;
      }
      for (int c = 0; c < 2; ++c) {
        double mean = 0;
        for (int j = 0; j < visible; ++j) mean += v[kv_index(s, b, j, 0, c, 2)] / double(visible);
        EXPECT_NEAR(r.o[o_index(s, b, i, 0, c)], mean, 1e-12) << "row " << i;
      }
    }
  }
}

TEST(Reference, UniformScoresAverageAllValues) { expect_mean_of_visible_values(5, 9, false); }
TEST(Reference, CausalBottomRightWithMoreKeysThanQueries) { expect_mean_of_visible_values(3, 7, true); }
TEST(Reference, CausalBottomRightWithMoreQueriesThanKeys) { expect_mean_of_visible_values(7, 3, true); }
TEST(Reference, CausalSquareIsLowerTriangular) { expect_mean_of_visible_values(20, 20, true); }

TEST(Reference, MoreQueriesThanKeysCausalMasksLeadingRowsFully) {
  const AttentionShape s{1, 6, 2, 1, 1, 4, 4};
  std::mt19937 rng(3);
  const Result r = run_reference(s, random_values(24, rng), random_values(8, rng), random_values(8, rng), 0.5, true);
  // Row i sees keys j <= i - 4: rows 0..3 none.
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(r.lse[i], -kInf) << i;
    for (int c = 0; c < 4; ++c) EXPECT_EQ(r.o[o_index(s, 0, i, 0, c)], 0.0) << i;
  }
  for (int i = 4; i < 6; ++i) EXPECT_TRUE(std::isfinite(r.lse[i])) << i;
}

TEST(Reference, GroupedQueryHeadsReadTheirKvHead) {
  // 6 query heads over 3 kv heads: heads 0,1 -> kv 0; 2,3 -> kv 1; 4,5 -> kv 2.
  const AttentionShape s{1, 2, 4, 6, 3, 2, 1};
  const std::vector<float> q = sized(s, 2, 6, 2);
  std::vector<float> k = sized(s, 4, 3, 2), v = sized(s, 4, 3, 1);
  for (int j = 0; j < 4; ++j) {
    for (int kv = 0; kv < 3; ++kv) v[kv_index(s, 0, j, kv, 0, 1)] = float(100 * kv + j);
  }
  const Result r = run_reference(s, q, k, v, 1.0, false);
  for (int h = 0; h < 6; ++h) {
    const double mean_of_kv_head = 100.0 * (h / 2) + 1.5;  // mean of j = 0..3 is 1.5
    for (int i = 0; i < 2; ++i) EXPECT_NEAR(r.o[o_index(s, 0, i, h, 0)], mean_of_kv_head, 1e-12) << "head " << h;
  }
}

TEST(Reference, NoKeysGiveZeroOutputAndMinusInfinityLse) {
  const AttentionShape s{2, 3, 0, 4, 2, 8, 8};
  std::mt19937 rng(4);
  for (bool causal : {false, true}) {
    const Result r = run_reference(s, random_values(2 * 3 * 4 * 8, rng), {}, {}, 1.0, causal);
    ASSERT_EQ(r.o.size(), 2u * 3 * 4 * 8);
    ASSERT_EQ(r.lse.size(), 2u * 4 * 3);
    for (double o : r.o) EXPECT_EQ(o, 0.0);
    for (double lse : r.lse) EXPECT_EQ(lse, -kInf);
  }
}

TEST(Reference, NoQueriesGiveEmptyOutputs) {
  const AttentionShape s{1, 0, 5, 2, 2, 4, 4};
  std::mt19937 rng(5);
  const Result r = run_reference(s, {}, random_values(40, rng), random_values(40, rng), 1.0, true);
  EXPECT_TRUE(r.o.empty());
  EXPECT_TRUE(r.lse.empty());
}

TEST(Reference, LargeScoresDoNotOverflow) {
  // Scores 0, 1000, 2000: exp overflows without the max subtraction; softmax is one-hot on key 2.
  const AttentionShape s{1, 1, 3, 1, 1, 1, 2};
  const std::vector<float> q = {1.f}, k = {0.f, 1.f, 2.f}, v = {1.f, 2.f, 3.f, 4.f, 5.f, 6.f};
  const Result r = run_reference(s, q, k, v, 1000.0, false);
  EXPECT_NEAR(r.lse[0], 2000.0, 1e-9);
  EXPECT_NEAR(r.o[0], 5.0, 1e-12);
  EXPECT_NEAR(r.o[1], 6.0, 1e-12);
}

TEST(Reference, SoftcapBoundsTheScore) {
  // One key with score 1000 * 2 = 2000: capped at 30 * tanh(2000 / 30), i.e. 30 up to rounding.
  const AttentionShape s{1, 1, 2, 1, 1, 1, 1};
  const std::vector<float> q = {2.f}, k = {1.f, 0.f}, v = {1.f, 0.f};
  ScoreOptions options = scaled(1000.0, false);
  options.softcap = 30.0;
  const Result r = run_reference(s, q, k, v, options);
  const double capped = 30.0 * std::tanh(2000.0 / 30.0);
  EXPECT_NEAR(r.lse[0], std::log(std::exp(capped) + 1.0), 1e-12);
  EXPECT_NEAR(r.o[0], std::exp(capped) / (std::exp(capped) + 1.0), 1e-12);
}

TEST(Reference, SlidingWindowSeesItsBandOnly) {
  // q = 0: each row averages the keys in its band. 4 queries over 6 keys (diagonal offset 2),
  // window (1, 1): row i sees keys i + 1 .. i + 3, clipped to 0 .. 5.
  const AttentionShape s{1, 4, 6, 1, 1, 2, 1};
  const std::vector<float> q(8, 0.f), k(12, 0.5f), v = {0.f, 1.f, 2.f, 3.f, 4.f, 5.f};
  ScoreOptions options = scaled(1.0, false);
  options.window_left = options.window_right = 1;
  const Result r = run_reference(s, q, k, v, options);
  const double expected_o[] = {2.0, 3.0, 4.0, 4.5};  // keys {1,2,3}, {2,3,4}, {3,4,5}, {4,5}
  const double expected_count[] = {3, 3, 3, 2};
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(r.o[i], expected_o[i], 1e-12) << "row " << i;
    EXPECT_NEAR(r.lse[i], std::log(expected_count[i]), 1e-12) << "row " << i;
  }
}

TEST(Reference, MatchesDirectFormula) {
  std::mt19937 rng(6);
  // Row counts around the reference's block of 16 query rows, uneven key counts, GQA, batch 2,
  // head_dim_v != head_dim.
  for (const AttentionShape& s : {AttentionShape{2, 37, 41, 4, 2, 8, 5}, AttentionShape{1, 16, 16, 3, 1, 6, 6},
                                  AttentionShape{2, 45, 17, 2, 2, 4, 7}, AttentionShape{1, 17, 50, 4, 4, 5, 3}}) {
    const std::vector<float> q = random_values(std::size_t(s.batch) * s.seqlen_q * s.nheads * s.head_dim, rng);
    const std::vector<float> k = random_values(std::size_t(s.batch) * s.seqlen_k * s.nheads_kv * s.head_dim, rng);
    const std::vector<float> v = random_values(std::size_t(s.batch) * s.seqlen_k * s.nheads_kv * s.head_dim_v, rng);
    // Causal, windows on either or both sides, soft-capping alone and with a window.
    std::vector<ScoreOptions> variants(7, scaled(0.4, false));
    variants[1].causal = true;
    variants[2].window_left = 3;
    variants[2].window_right = 2;
    variants[3].causal = true;
    variants[3].window_left = 5;
    variants[4].window_right = 4;
    variants[5].softcap = 0.7;
    variants[6].softcap = 0.7;
    variants[6].window_left = 2;
    variants[6].window_right = 6;
    for (std::size_t variant = 0; variant < variants.size(); ++variant) {
      SCOPED_TRACE(::testing::Message() << "batch " << s.batch << " seqlen_q " << s.seqlen_q << " seqlen_k "
                                        << s.seqlen_k << " variant " << variant);
      const Result got = run_reference(s, q, k, v, variants[variant]);
      const Result expected = direct_formula(s, q, k, v, variants[variant]);
      ASSERT_EQ(got.o.size(), expected.o.size());
      ASSERT_EQ(got.lse.size(), expected.lse.size());
      for (std::size_t i = 0; i < got.o.size(); ++i) EXPECT_NEAR(got.o[i], expected.o[i], 1e-12) << "o[" << i << "]";
      for (std::size_t i = 0; i < got.lse.size(); ++i) {
        if (std::isinf(expected.lse[i])) {
          EXPECT_EQ(got.lse[i], expected.lse[i]) << "lse[" << i << "]";
        } else {
          EXPECT_NEAR(got.lse[i], expected.lse[i], 1e-12) << "lse[" << i << "]";
        }
      }
    }
  }
}

TEST(LowPrecisionReference, Float32MatchesDoubleReference) {
  const AttentionShape s{2, 33, 47, 4, 2, 16, 16};
  std::mt19937 rng(7);
  const std::vector<float> q = random_values(2 * 33 * 4 * 16, rng), k = random_values(2 * 47 * 2 * 16, rng);
  const std::vector<float> v = random_values(2 * 47 * 2 * 16, rng);
  for (bool causal : {false, true}) {
    const Result exact = run_reference(s, q, k, v, 0.25, causal);
    std::vector<float> o, lse;
    flashhop::reference::attention_forward_low_precision(s, q.data(), k.data(), v.data(), scaled(0.25, causal),
                                                         DType::kFloat32, &o, &lse);
    ASSERT_EQ(o.size(), exact.o.size());
    ASSERT_EQ(lse.size(), exact.lse.size());
    for (std::size_t i = 0; i < o.size(); ++i) EXPECT_NEAR(o[i], exact.o[i], 1e-5) << i;
    for (std::size_t i = 0; i < lse.size(); ++i) EXPECT_NEAR(lse[i], exact.lse[i], 1e-5) << i;
  }
}

TEST(LowPrecisionReference, RoundsProbabilitiesAndOutput) {
  // Scores 0 and -x: P = (1, e^-x) with e^-x rounded to the dtype before P V, while the row sum keeps
  // the float value: O = round((v0 + round(e^-x) v1) / (1 + e^-x)).
  const AttentionShape s{1, 1, 2, 1, 1, 1, 1};
  const std::vector<float> q = {1.f}, k = {0.f, -1.f}, v = {0.3f, 0.7f};
  const float x = 0.337f;
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    std::vector<float> o, lse;
    flashhop::reference::attention_forward_low_precision(s, q.data(), k.data(), v.data(), scaled(x, false), dtype,
                                                         &o, &lse);
    const float p1 = std::exp(-x);
    const float expected = round_to(dtype, (0.3f + round_to(dtype, p1) * 0.7f) / (1.f + p1));
    EXPECT_EQ(o[0], expected) << flashhop::dtype_name(dtype);
    EXPECT_NE(round_to(dtype, p1), p1) << "the case must exercise the rounding";
    EXPECT_NEAR(lse[0], std::log(1.0 + std::exp(-double{x})), 1e-6);
  }
}

}  // namespace
}  // namespace flashhop_test
