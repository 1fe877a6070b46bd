#include "bench_check.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <thread>
#include <utility>

#include <cuda_fp16.h>

#include "reference/tolerance.h"

namespace flashhop::bench {
namespace {

constexpr int kRowBlocks = 16;  // row blocks sampled per pair when whole heads do not fit

float decode(DType dtype, std::uint16_t bits) {
  if (dtype == DType::kFloat16) {
    __half_raw raw;
    raw.x = bits;
    return __half2float(__half(raw));
  }
  const std::uint32_t wide = std::uint32_t(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof value);
  return value;
}

bool is_nonfinite(DType dtype, std::uint16_t bits) {
  const std::uint16_t exponent_mask = dtype == DType::kFloat16 ? 0x7C00 : 0x7F80;
  return (bits & exponent_mask) == exponent_mask;
}

struct RowBlock {
  int row_begin, row_end;
};

// The compared part: every block of rows, in every listed (batch, head) pair.
struct CheckPlan {
  std::vector<std::pair<int, int>> pairs;
  std::vector<RowBlock> blocks;
  std::string scope;
};

// Index k of n evenly spaced integers from 0 to last (both included).
std::int64_t spaced(std::int64_t k, std::int64_t n, std::int64_t last) {
  return n <= 1 ? 0 : (k * last + (n - 1) / 2) / (n - 1);
}

CheckPlan plan_check(const reference::AttentionShape& s) {
  // Multiply-adds of one query row against every key: an upper bound under any mask.
  const double row_macs = double(s.seqlen_k) * (s.head_dim + s.head_dim_v);
  const double pair_macs = row_macs * s.seqlen_q;
  // Each pair also copies and converts its K and V, which costs about as much as 16 query rows:
  // with a few query rows (decoding) that, not the multiply-adds, bounds the pairs.
  const double pair_cost = row_macs * (s.seqlen_q + 16);
  const std::int64_t all_pairs = std::int64_t(s.batch) * s.nheads;

  std::int64_t pairs = all_pairs;
  if (pair_cost * double(all_pairs) > kCheckBudgetMacs) {
    pairs = std::min(all_pairs, std::max<std::int64_t>(2, std::int64_t(kCheckBudgetMacs / pair_cost)));
  }
  const bool whole_heads = pair_macs * double(pairs) <= kCheckBudgetMacs;
  const int blocks = whole_heads ? 1 : std::min(kRowBlocks, s.seqlen_q);
  const int block_rows =
      whole_heads ? s.seqlen_q
                  : int(std::clamp<double>(kCheckBudgetMacs / (double(pairs) * blocks * row_macs), 1,
                                           s.seqlen_q / blocks));

  CheckPlan plan;
  std::string pair_list;
  for (std::int64_t p = 0; p < pairs; ++p) {
    const std::int64_t pair = spaced(p, pairs, all_pairs - 1);
    plan.pairs.emplace_back(int(pair / s.nheads), int(pair % s.nheads));
    pair_list += (p ? ", (" : " (") + std::to_string(pair / s.nheads) + "," +
                 std::to_string(pair % s.nheads) + ")";
  }
  for (int b = 0; b < blocks; ++b) {
    const int begin = int(spaced(b, blocks, s.seqlen_q - block_rows));
    plan.blocks.push_back({begin, begin + block_rows});
  }

  if (pairs == all_pairs) {
    plan.scope = "all " + std::to_string(all_pairs) + " (batch, head) pairs";
  } else {
    plan.scope = std::to_string(pairs) + " of " + std::to_string(all_pairs) +
                 " (batch, head) pairs, evenly spaced" + (pairs <= 4 ? ":" + pair_list : "");
  }
  if (whole_heads) {
    plan.scope += ", all query rows";
  } else {
    plan.scope += ", " + std::to_string(blocks * block_rows) + " of " + std::to_string(s.seqlen_q) +
                  " query rows in " + std::to_string(blocks) + " evenly spaced blocks";
  }
  return plan;
}

// Keeps NaN once seen, so that a NaN error can never pass a `<=` tolerance test.
void update_max(double* current, double value) {
  if (std::isnan(value) || value > *current) *current = value;
}

struct ErrorStats {
  double o_err = 0, o_baseline_err = 0, o_sq_diff = 0, o_sq_ref = 0;
  double lse_err = 0, lse_baseline_err = 0;
  std::int64_t lse_inf_mismatch = 0;
  double max_abs_v = 0;  // over the V rows the compared rows see
  double max_abs_o_ref = 0;

  void merge(const ErrorStats& other) {
    update_max(&o_err, other.o_err);
    update_max(&o_baseline_err, other.o_baseline_err);
    o_sq_diff += other.o_sq_diff;
    o_sq_ref += other.o_sq_ref;
    update_max(&max_abs_v, other.max_abs_v);
    update_max(&max_abs_o_ref, other.max_abs_o_ref);
    update_max(&lse_err, other.lse_err);
    update_max(&lse_baseline_err, other.lse_baseline_err);
    lse_inf_mismatch += other.lse_inf_mismatch;
  }
};

// The error of one LSE value against the reference: -inf must match -inf exactly (a mismatch is
// counted and is an infinite error).
double lse_error(double value, double ref, std::int64_t* inf_mismatch) {
  const bool ref_inf = std::isinf(ref) && ref < 0;
  const bool value_inf = std::isinf(value) && value < 0;
  if (ref_inf || value_inf) {
    if (ref_inf == value_inf) return 0.0;
    ++*inf_mismatch;
    return std::numeric_limits<double>::infinity();
  }
  return std::abs(value - ref);
}

// The mask of the sub-problem made of the rows of `block` and the keys [key_begin, key_end) they see
// (key_end > key_begin) that hides exactly what `options` hides on these rows of the full problem.
// Every row's visible keys lie in [key_begin, key_end), the first row's first to the last row's end,
// as both ends move right row by row; so clipping the band to the sub-problem's keys is clipping it to
// [0, seqlen_k). The sub-problem aligns its diagonal to its own bottom-right corner, `shift` keys right
// of where the full problem's diagonal falls: shift = key_end - (last row's diagonal + 1)
// = min(right width, seqlen_q - row_end) >= 0, an unbounded width counting as infinite (key_end is the
// last row's diagonal + right + 1, clipped to seqlen_k). Widening the left side and narrowing the right
// side by `shift` puts the band back in place, and the right side stays >= 0. An unbounded side stays
// unbounded: there the band reaches key 0 = key_begin, or key seqlen_k - 1 = key_end - 1.
reference::ScoreOptions sub_problem_options(const reference::AttentionShape& s, const reference::ScoreOptions& options,
                                            const RowBlock& block, std::int64_t key_end) {
  const std::int64_t last_diagonal = std::int64_t(block.row_end) - 1 + s.seqlen_k - s.seqlen_q;
  const std::int64_t shift = key_end - (last_diagonal + 1);
  const int right = options.causal ? 0 : options.window_right;
  reference::ScoreOptions sub = options;
  sub.causal = false;
  sub.window_left = options.window_left < 0 ? -1 : int(options.window_left + shift);
  sub.window_right = right < 0 ? -1 : int(right - shift);
  return sub;
}

// Runs the reference and the baseline on one block of rows of every planned pair, the pairs stacked
// as the batch of one contiguous sub-problem, and accumulates the errors into `stats`.
void compare_block(const reference::AttentionShape& s, const reference::ScoreOptions& options, const HostTensors& t,
                   const CheckPlan& plan, const RowBlock& block, ErrorStats* stats) {
  const int rows = block.row_end - block.row_begin;
  const std::int64_t key_begin = reference::visible_keys(s, options, block.row_begin).begin;
  const std::int64_t key_end = reference::visible_keys(s, options, block.row_end - 1).end;
  const int keys = int(key_end - key_begin);
  const int heads_per_kv_head = s.nheads / s.nheads_kv;
  const std::size_t d = s.head_dim, dv = s.head_dim_v, n = plan.pairs.size();

  std::vector<float> q(n * rows * d), k(n * keys * d), v(n * keys * dv);
  for (std::size_t p = 0; p < n; ++p) {
    const auto [batch, head] = plan.pairs[p];
    const std::size_t head_kv = head / heads_per_kv_head;
    for (int i = 0; i < rows; ++i) {
      const std::size_t src = ((std::size_t(batch) * s.seqlen_q + block.row_begin + i) * s.nheads + head) * d;
      for (std::size_t c = 0; c < d; ++c) q[(p * rows + i) * d + c] = decode(t.dtype, t.q[src + c]);
    }
    for (int j = 0; j < keys; ++j) {
      const std::size_t src = (std::size_t(batch) * s.seqlen_k + key_begin + j) * s.nheads_kv + head_kv;
      for (std::size_t c = 0; c < d; ++c) k[(p * keys + j) * d + c] = decode(t.dtype, t.k[src * d + c]);
      for (std::size_t c = 0; c < dv; ++c) {
        const float value = decode(t.dtype, t.v[src * dv + c]);
        v[(p * keys + j) * dv + c] = value;
        update_max(&stats->max_abs_v, std::abs(value));
      }
    }
  }

  // A block that sees no key at all is fully masked: O = 0 and LSE = -inf by convention.
  std::vector<double> o_ref(n * rows * dv, 0.0);
  std::vector<double> lse_ref(n * rows, -std::numeric_limits<double>::infinity());
  std::vector<float> o_base(n * rows * dv, 0.f);
  std::vector<float> lse_base(n * rows, -std::numeric_limits<float>::infinity());
  if (keys > 0) {
    reference::AttentionShape sub;
    sub.batch = int(n), sub.seqlen_q = rows, sub.seqlen_k = keys, sub.nheads = 1, sub.nheads_kv = 1;
    sub.head_dim = s.head_dim, sub.head_dim_v = s.head_dim_v;
    const reference::ScoreOptions sub_options = sub_problem_options(s, options, block, key_end);
    reference::attention_forward(sub, q.data(), k.data(), v.data(), sub_options, &o_ref, &lse_ref);
    reference::attention_forward_low_precision(sub, q.data(), k.data(), v.data(), sub_options, t.dtype, &o_base,
                                               &lse_base);
  }

  for (std::size_t p = 0; p < n; ++p) {
    const auto [batch, head] = plan.pairs[p];
    for (int i = 0; i < rows; ++i) {
      const int row = block.row_begin + i;
      const std::size_t sub_row = p * rows + i;
      const std::size_t o_src = ((std::size_t(batch) * s.seqlen_q + row) * s.nheads + head) * dv;
      for (std::size_t c = 0; c < dv; ++c) {
        const double ref = o_ref[sub_row * dv + c];
        const double diff = double(decode(t.dtype, t.o[o_src + c])) - ref;
        update_max(&stats->o_err, std::abs(diff));
        update_max(&stats->o_baseline_err, std::abs(double(o_base[sub_row * dv + c]) - ref));
        update_max(&stats->max_abs_o_ref, std::abs(ref));
        stats->o_sq_diff += diff * diff;
        stats->o_sq_ref += ref * ref;
      }
      const std::size_t lse_src = (std::size_t(batch) * s.nheads + head) * s.seqlen_q + row;
      update_max(&stats->lse_err, lse_error(t.lse[lse_src], lse_ref[sub_row], &stats->lse_inf_mismatch));
      std::int64_t baseline_mismatch = 0;
      update_max(&stats->lse_baseline_err, lse_error(lse_base[sub_row], lse_ref[sub_row], &baseline_mismatch));
    }
  }
}

}  // namespace

CheckResult check_forward(const reference::AttentionShape& shape, const reference::ScoreOptions& options,
                          const HostTensors& tensors) {
  CheckResult result;
  for (std::uint16_t bits : tensors.o) result.nonfinite_o += is_nonfinite(tensors.dtype, bits);
  for (float value : tensors.lse) result.nan_lse += std::isnan(value);

  const CheckPlan plan = plan_check(shape);
  result.scope = plan.scope;

  // The reference spreads each call over the cores by itself, in tasks of 16 rows of one head; run
  // blocks side by side only as far as one call leaves cores idle.
  const std::size_t cores = std::max(1u, std::thread::hardware_concurrency());
  const std::size_t tasks_per_block =
      plan.pairs.size() * std::size_t((plan.blocks[0].row_end - plan.blocks[0].row_begin + 15) / 16);
  const std::size_t workers = std::clamp<std::size_t>(cores / tasks_per_block, 1, plan.blocks.size());

  ErrorStats total;
  std::mutex total_mutex;
  std::atomic<std::size_t> next{0};
  auto worker = [&] {
    ErrorStats local;
    for (std::size_t b = next++; b < plan.blocks.size(); b = next++) {
      compare_block(shape, options, tensors, plan, plan.blocks[b], &local);
    }
    const std::lock_guard<std::mutex> lock(total_mutex);
    total.merge(local);
  };
  std::vector<std::thread> pool;
  for (std::size_t w = 1; w < workers; ++w) pool.emplace_back(worker);
  worker();
  for (auto& thread : pool) thread.join();

  result.o_max_abs_err = total.o_err;
  result.o_baseline_max_abs_err = total.o_baseline_err;
  result.o_tolerance = reference::o_tolerance(tensors.dtype, total.o_baseline_err, total.max_abs_o_ref,
                                              options.softcap, total.max_abs_v);
  result.o_rel_l2_err = std::sqrt(total.o_sq_diff / std::max(total.o_sq_ref, 1e-300));
  result.lse_max_abs_err = total.lse_err;
  result.lse_baseline_max_abs_err = total.lse_baseline_err;
  result.lse_tolerance = reference::lse_tolerance(total.lse_baseline_err, options.softcap);
  result.lse_inf_mismatch = total.lse_inf_mismatch;
  result.passed = result.nonfinite_o == 0 && result.nan_lse == 0 && result.lse_inf_mismatch == 0 &&
                  result.o_max_abs_err <= result.o_tolerance &&
                  result.lse_max_abs_err <= result.lse_tolerance;
  return result;
}

}  // namespace flashhop::bench
