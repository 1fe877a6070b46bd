// The backward kernels' arguments: validated BackwardArgs, flattened by the plan (src/api/plan.cpp).
#pragma once

#include <cstdint>

namespace flashhop::sm90 {

struct BackwardParams {
  const void* q = nullptr;     // (batch, seqlen_q, nheads, head_dim)
  const void* k = nullptr;     // (batch, seqlen_k, nheads_kv, head_dim)
  const void* v = nullptr;     // (batch, seqlen_k, nheads_kv, head_dim_v)
  const void* o = nullptr;     // (batch, seqlen_q, nheads, head_dim_v)
  const void* dout = nullptr;  // (batch, seqlen_q, nheads, head_dim_v)
  const float* lse = nullptr;  // (batch, nheads, seqlen_q)
  void* dq = nullptr;          // like q
  void* dk = nullptr;          // like k
  void* dv = nullptr;          // like v

  int batch = 0, seqlen_q = 0, seqlen_k = 0, nheads = 0, nheads_kv = 0;
  int head_dim = 0, head_dim_v = 0;

  // A variable-length batch (flashhop.h's packed layout), else null: batch sequences, seqlen_q and
  // seqlen_k the bounds max_seqlen_q and max_seqlen_k (cut at the totals; the band's unbounded
  // sides are written against them), total_q and total_k the packed tensors' rows, the batch
  // strides 0.
  int const* cu_seqlens_q = nullptr;  // (batch + 1)
  int const* cu_seqlens_k = nullptr;  // (batch + 1)
  int const* seqused_q = nullptr;     // (batch) or null
  int const* seqused_k = nullptr;     // (batch) or null
  int total_q = 0, total_k = 0;

  // Strides in elements, per (batch, seq, head); the last dimension is contiguous (size-1
  // dimensions normalised as the forward's).
  std::int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  std::int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  std::int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  std::int64_t o_batch_stride = 0, o_row_stride = 0, o_head_stride = 0;
  std::int64_t do_batch_stride = 0, do_row_stride = 0, do_head_stride = 0;
  std::int64_t dq_batch_stride = 0, dq_row_stride = 0, dq_head_stride = 0;
  std::int64_t dk_batch_stride = 0, dk_row_stride = 0, dk_head_stride = 0;
  std::int64_t dv_batch_stride = 0, dv_row_stride = 0, dv_head_stride = 0;
  std::int64_t lse_batch_stride = 0, lse_head_stride = 0, lse_row_stride = 0;

  float softmax_scale = 1.f;
  float softcap = 0.f;
  // The band as ForwardParams has it (both >= 0; an unbounded side reaches past every key).
  int window_left = 0, window_right = 0;
  bool local = false;
  // dQ accumulated in a fixed order (n_block ascending) under per-block semaphores.
  bool deterministic = false;

  // Workspace parts (BackwardWorkspace): per head and row block, LSE in log2 units (+inf where
  // the row sees no key or lies past its sequence's queries) and D = rowsum(dO * O) of each row, and
  // the fp32 dQ accumulator of the block in the main kernel's fragment order; one semaphore per
  // (batch, head, query block) with `deterministic`.
  float* lse_log2 = nullptr;
  float* delta = nullptr;
  float* dq_accum = nullptr;
  int* dq_semaphore = nullptr;
};

// Where each part of the backward workspace lies, for query blocks of row_block rows (the recipe's
// block_m, its kernels' query tile). Each head holds blocks_per_head blocks: a fixed-length batch's
// sequences ceil(seqlen_q / row_block) blocks each, one after another; in a variable-length batch
// sequence b's blocks start at block floor((cu_seqlens_q[b] + row_block b) / row_block), so that no
// two sequences share a block.
struct BackwardWorkspace {
  std::int64_t blocks_per_head;
  std::int64_t lse_offset, delta_offset, dq_accum_offset, semaphore_offset, bytes;

  static constexpr std::int64_t align(std::int64_t bytes) { return (bytes + 255) / 256 * 256; }

  // seqlen_q: the sequences' bound; total_q: a variable-length batch's rows, or -1.
  static constexpr BackwardWorkspace plan(int batch, int nheads, int seqlen_q, std::int64_t total_q, int head_dim,
                                          bool deterministic, int row_block) {
    auto const blocks = [row_block](std::int64_t rows) { return (rows + row_block - 1) / row_block; };
    BackwardWorkspace w{};
    std::int64_t const sequence_blocks = blocks(seqlen_q);
    w.blocks_per_head = total_q < 0 ? batch * sequence_blocks : blocks(total_q) + batch;
    std::int64_t const rows = std::int64_t{nheads} * w.blocks_per_head * row_block;
    w.lse_offset = 0;
    w.delta_offset = align(rows * 4);
    w.dq_accum_offset = w.delta_offset + align(rows * 4);
    w.semaphore_offset = w.dq_accum_offset + align(rows * head_dim * 4);
    w.bytes = w.semaphore_offset + (deterministic ? align(std::int64_t{batch} * nheads * sequence_blocks * 4) : 0);
    return w;
  }
};

}  // namespace flashhop::sm90
