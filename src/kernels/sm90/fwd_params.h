// The forward kernels' arguments: validated ForwardArgs, flattened by the plan (src/api/plan.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>

namespace flashhop::sm90 {

// The kernels compute mask bounds up to seqlen_q + seqlen_k plus a query tile in 32 bits, and
// index packed query rows (seqlen_q * nheads / nheads_kv) likewise.
inline constexpr std::int64_t kMaxSeqlenSum = std::numeric_limits<std::int32_t>::max() - 65536;

// The tile schedulers number (query tile, head, batch) in 32 bits, and their indices run past the
// last tile by up to two split parts or one queue fetch per CTA. Counted in tiles of the smallest
// height (one consumer warpgroup's rows), so that the bound holds for every recipe and for packed rows.
inline constexpr std::int64_t kSmallestBlockM = 64;
inline constexpr std::int64_t kMaxQueryTiles = std::numeric_limits<std::int32_t>::max() - 65536;

// A variable-length batch's tile list in the workspace (varlen.h), in ints: the queue's counter
// (indices taken so far), the tiles in all, padding, then order[batch] (sequence indices, longest
// first: most keys, then most queries), tile_start[batch + 1] (the tiles of sequence order[p] are
// tile_start[p] .. tile_start[p + 1], head by head, within a head the last query tile first: the
// longest under a causal band) and scratch[batch] for the sort.
struct VarlenTileList {
  static constexpr int kCounter = 0, kNumTiles = 1, kOrder = 4;
  static constexpr int tile_start(int batch) { return kOrder + batch; }
  static constexpr int scratch(int batch) { return kOrder + 2 * batch + 1; }
  static constexpr std::size_t bytes(int batch) {
    return sizeof(int) * (static_cast<std::size_t>(scratch(batch)) + batch);
  }
};

// A variable-length batch split by keys (ForwardParams::num_splits > 1): after the tile list, the
// splits' partial results, which the combine kernel (combine.h) merges into O and LSE:
// o_partial (num_splits, total_q, nheads, dv) and lse_partial (num_splits, total_q, nheads), floats,
// each split's O normalised by its own row sums.
struct VarlenSplitPartials {
  static constexpr std::size_t kAlignment = 256;
  static constexpr std::size_t o_offset(int batch) {
    return (VarlenTileList::bytes(batch) + kAlignment - 1) / kAlignment * kAlignment;
  }
  static constexpr std::size_t o_bytes(int num_splits, std::int64_t total_q, int nheads, int head_dim_v) {
    return sizeof(float) * static_cast<std::size_t>(num_splits) * static_cast<std::size_t>(total_q) *
           static_cast<std::size_t>(nheads) * static_cast<std::size_t>(head_dim_v);
  }
  static constexpr std::size_t lse_offset(int batch, int num_splits, std::int64_t total_q, int nheads,
                                          int head_dim_v) {
    return o_offset(batch) + o_bytes(num_splits, total_q, nheads, head_dim_v);
  }
  // The partials in a workspace of this layout.
  static float* o(void* workspace, int batch) {
    return reinterpret_cast<float*>(static_cast<unsigned char*>(workspace) + o_offset(batch));
  }
  static float* lse(void* workspace, int batch, int num_splits, std::int64_t total_q, int nheads, int head_dim_v) {
    return reinterpret_cast<float*>(static_cast<unsigned char*>(workspace) +
                                    lse_offset(batch, num_splits, total_q, nheads, head_dim_v));
  }
  // The tile list and both partials.
  static constexpr std::size_t bytes(int batch, int num_splits, std::int64_t total_q, int nheads, int head_dim_v) {
    return lse_offset(batch, num_splits, total_q, nheads, head_dim_v) +
           sizeof(float) * static_cast<std::size_t>(num_splits) * static_cast<std::size_t>(total_q) *
               static_cast<std::size_t>(nheads);
  }
};

struct ForwardParams {
  const void* q = nullptr;  // (batch, seqlen_q, nheads, head_dim)
  const void* k = nullptr;  // (batch, seqlen_k, nheads_kv, head_dim)
  const void* v = nullptr;  // (batch, seqlen_k, nheads_kv, head_dim_v)
  void* o = nullptr;        // (batch, seqlen_q, nheads, head_dim_v)
  float* lse = nullptr;     // (batch, nheads, seqlen_q) or null

  int batch = 0, seqlen_q = 0, seqlen_k = 0, nheads = 0, nheads_kv = 0;

  // Strides in elements, per (batch, seq, head); the last dimension is contiguous. The stride of a
  // dimension of size 1 is never followed, and is written as 0 (TMA accepts strides below 2^40 bytes).
  std::int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  std::int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  std::int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  std::int64_t o_batch_stride = 0, o_row_stride = 0, o_head_stride = 0;
  std::int64_t lse_batch_stride = 0, lse_head_stride = 0, lse_row_stride = 0;

  float softmax_scale = 1.f;
  float softcap = 0.f;  // > 0: scores become softcap * tanh(softmax_scale * q.k / softcap)
  // The visible band, aligned to the bottom-right corner: query i sees keys j with
  // i + seqlen_k - seqlen_q - window_left <= j <= i + seqlen_k - seqlen_q + window_right.
  // Both are >= 0 here: an unbounded side is written as a width that reaches past every key
  // (window_left = seqlen_k, window_right = seqlen_q); causal is window_right = 0.
  int window_left = 0, window_right = 0;
  // With a band, the int counter of the tile queue (CausalScheduler), zeroed before the kernel;
  // without, the split round's counters and partial results (split_round.h) where it splits one;
  // else null.
  void* workspace = nullptr;
  // The device's SM count, which the persistent grids are sized to, and its L2 size in bytes.
  int num_sms = 0;
  std::int64_t l2_bytes = 0;

  // Variable-length batches (flashhop.h's packed layout), else null. Then batch counts the
  // sequences, seqlen_q and seqlen_k are the bounds max_seqlen_q and max_seqlen_k (the band's
  // unbounded sides are written against them), total_q and total_k the packed tensors' rows, the
  // batch strides are 0, and the workspace holds the scheduler's tile list (varlen.h).
  int const* cu_seqlens_q = nullptr;  // (batch + 1)
  int const* cu_seqlens_k = nullptr;  // (batch + 1)
  int const* seqused_q = nullptr;     // (batch) or null
  int const* seqused_k = nullptr;     // (batch) or null
  int const* leftpad_k = nullptr;     // (batch) or null: the first key row of each sequence's slot
  int total_q = 0, total_k = 0;

  // A paged KV cache (flashhop.h), only with cu_seqlens_q, else null. Then k and v are pages
  // (num_pages, page_size, nheads_kv, d) with the page stride as their batch stride, cu_seqlens_k
  // is null, seqused_k holds each sequence's keys and total_k is a sequence's capacity
  // (max_pages * page_size).
  int const* page_table = nullptr;  // (batch, page_table_stride), max_pages used in each row
  std::int64_t page_table_stride = 0;
  int page_size = 0, num_pages = 0, max_pages = 0;

  // A variable-length batch's splits by keys: each query tile's key tiles are cut into num_splits
  // runs, each a tile of its own that writes a partial result (VarlenSplitPartials), merged by the
  // combine kernel. 1: not split.
  int num_splits = 1;

  // FP8 (e4m3 q, k and v; o bfloat16): FlashAttention-3's descales, (batch, nheads_kv) float32 with
  // these strides in elements (0 broadcasts), each null for 1. The scores of (batch, KV head) are
  // q_descale k_descale times those of the e4m3 values, O v_descale times.
  float const* q_descale = nullptr;
  float const* k_descale = nullptr;
  float const* v_descale = nullptr;
  std::int64_t q_descale_batch_stride = 0, q_descale_head_stride = 0;
  std::int64_t k_descale_batch_stride = 0, k_descale_head_stride = 0;
  std::int64_t v_descale_batch_stride = 0, v_descale_head_stride = 0;
  // FP8 block scaling (instead of the descales): float32 scales of blocks of kFp8ScaleBlockRows rows,
  // (batch, nheads, blocks) for q and (batch, nheads_kv, blocks) for k and v, with these strides in
  // elements (0 broadcasts), or null.
  struct BlockScales {
    float const* data = nullptr;
    std::int64_t batch_stride = 0, head_stride = 0, block_stride = 0;
  };
  BlockScales q_block_scale, k_block_scale, v_block_scale;
};

// The combine kernel's arguments (combine.cu): the partial results of num_splits splits by keys,
// each split's O normalised by its own row sums, merged into O and LSE:
//   O = sum over splits of exp(lse_s - lse) O_s, lse = log sum over splits of exp(lse_s),
// summed in split order. Strides in elements; head_dim_v contiguous everywhere.
struct CombineParams {
  float const* o_partial = nullptr;    // (num_splits, batch, seqlen, nheads, head_dim_v)
  float const* lse_partial = nullptr;  // (num_splits, batch, seqlen, nheads)
  void* o = nullptr;                   // (batch, seqlen, nheads, head_dim_v), of the output dtype
  float* lse = nullptr;                // (batch, nheads, seqlen) or null
  int num_splits = 0, batch = 0, seqlen = 0, nheads = 0, head_dim_v = 0;
  std::int64_t o_partial_split_stride = 0, o_partial_batch_stride = 0, o_partial_row_stride = 0,
               o_partial_head_stride = 0;
  std::int64_t lse_partial_split_stride = 0, lse_partial_batch_stride = 0, lse_partial_row_stride = 0,
               lse_partial_head_stride = 0;
  std::int64_t o_batch_stride = 0, o_row_stride = 0, o_head_stride = 0;
  std::int64_t lse_batch_stride = 0, lse_head_stride = 0, lse_row_stride = 0;
  // A variable-length batch (varlen.h's reading of them), else null: sequence b's row r is row
  // cu_seqlens_q[b] + r of the packed tensors (batch strides 0), for r below its used queries and
  // below seqlen (max_seqlen_q); the other rows are left as they are.
  int const* cu_seqlens_q = nullptr;
  int const* seqused_q = nullptr;
  int total_q = 0;
};

// The widest head_dim_v the combine kernel takes.
inline constexpr int kMaxCombineHeadDim = 512;

}  // namespace flashhop::sm90
