// Variable-length batches (flashhop.h's packed layout): where each sequence lies in the packed
// tensors, and the tile list from which the persistent forward CTAs take their tiles, the longest
// sequences first (VarlenScheduler, tile_scheduler.h). A prepare kernel of one CTA writes the list
// into the workspace before the forward kernel runs.
//
// The list's layout is VarlenTileList's (fwd_params.h).
#pragma once

#include <cstdint>

#include <cub/block/block_scan.cuh>
#include <cutlass/cutlass.h>
#include <cutlass/fast_math.h>

#include "kernels/sm90/fwd_params.h"

namespace flashhop::sm90 {

// One sequence: its first row in the packed Q and O, and in K and V, and its lengths.
struct SequenceSpan {
  int q_begin, k_begin;
  int seqlen_q, seqlen_k;
};

// The caller's cumulative lengths, read defensively (the host cannot check device memory):
// offsets clamped to [0, total], a decreasing pair read as an empty sequence, seqused clamped to
// the slot, lengths cut at the bounds max_seqlen. Without cu_seqlens_k (a paged KV cache), each
// sequence's slot is all of total_k, its capacity, from row 0 of its pages. With leftpad_k, a
// sequence's keys start that many rows into its used rows (clamped to them).
struct VarlenSequences {
  int const* cu_seqlens_q;
  int const* cu_seqlens_k;  // or null
  int const* seqused_q;     // or null
  int const* seqused_k;     // or null
  int const* leftpad_k;     // or null
  int total_q, total_k;
  int max_seqlen_q, max_seqlen_k;

  static CUTLASS_DEVICE int clamp(int value, int low, int high) {
    return value < low ? low : (value > high ? high : value);
  }
  // Sequence b's first row and length in one of the packed tensors.
  static CUTLASS_DEVICE void slot(int const* cu_seqlens, int const* seqused, int b, int total, int bound, int& begin,
                                  int& length) {
    if (cu_seqlens == nullptr) {
      begin = 0;
      length = total;
    } else {
      begin = clamp(__ldg(cu_seqlens + b), 0, total);
      length = clamp(__ldg(cu_seqlens + b + 1), begin, total) - begin;
    }
    if (seqused != nullptr) length = clamp(__ldg(seqused + b), 0, length);
    length = length < bound ? length : bound;
  }
  CUTLASS_DEVICE SequenceSpan span(int b) const {
    SequenceSpan s;
    slot(cu_seqlens_q, seqused_q, b, total_q, max_seqlen_q, s.q_begin, s.seqlen_q);
    if (leftpad_k == nullptr) {
      slot(cu_seqlens_k, seqused_k, b, total_k, max_seqlen_k, s.k_begin, s.seqlen_k);
    } else {
      int used;
      slot(cu_seqlens_k, seqused_k, b, total_k, total_k, s.k_begin, used);
      int const pad = clamp(__ldg(leftpad_k + b), 0, used);
      s.k_begin += pad;
      s.seqlen_k = used - pad < max_seqlen_k ? used - pad : max_seqlen_k;
    }
    return s;
  }
};

// The prepare kernel's arguments.
struct VarlenPrepareParams {
  VarlenSequences sequences;
  int batch;
  int block_m;          // tile rows
  int rows_per_query;   // tile rows per query: heads per KV head with packed rows, else 1
  int tile_heads;       // query heads, or KV heads with packed rows
  int num_splits;       // tiles per query tile: its splits by keys (ForwardParams::num_splits)
  int* list;            // VarlenTileList in the workspace
};

// One CTA of kThreads threads. Sorting ranks each sequence against all others: batch^2 / kThreads
// comparisons a thread (about 1k for 1024 sequences), over keys staged in tile_start and scratch;
// the scan then reads each sequence's queries from scratch.
template <int kThreads>
__global__ void __launch_bounds__(kThreads) varlen_prepare_kernel(VarlenPrepareParams const params) {
  int const batch = params.batch;
  int* const order = params.list + VarlenTileList::kOrder;
  int* const tile_start = params.list + VarlenTileList::tile_start(batch);
  int* const queries = params.list + VarlenTileList::scratch(batch);
  for (int b = threadIdx.x; b < batch; b += kThreads) {
    SequenceSpan const s = params.sequences.span(b);
    tile_start[b] = s.seqlen_k;
    queries[b] = s.seqlen_q;
  }
  __syncthreads();
  // Rank of b: the sequences with more keys, or as many and more queries, or equal and a lower index.
  for (int b = threadIdx.x; b < batch; b += kThreads) {
    std::int64_t const mine = (std::int64_t{tile_start[b]} << 32) | queries[b];
    int rank = 0;
    for (int c = 0; c < batch; ++c) {
      std::int64_t const other = (std::int64_t{tile_start[c]} << 32) | queries[c];
      rank += other > mine || (other == mine && c < b);
    }
    order[rank] = b;
  }
  __syncthreads();  // every thread has read the staged keys and written its ranks
  // tile_start: an exclusive scan of the sorted sequences' tiles, kThreads at a time.
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  int carry = 0;
  for (int first = 0; first < batch; first += kThreads) {
    int const p = first + threadIdx.x;
    int tiles = 0;
    if (p < batch) {
      int const rows = queries[order[p]] * params.rows_per_query;
      tiles = (rows + params.block_m - 1) / params.block_m * params.tile_heads * params.num_splits;
    }
    int start, chunk_total;
    Scan(scan_storage).ExclusiveSum(tiles, start, chunk_total);
    if (p < batch) tile_start[p] = carry + start;
    carry += chunk_total;
    __syncthreads();  // scan_storage is reused
  }
  if (threadIdx.x == 0) {
    tile_start[batch] = carry;
    params.list[VarlenTileList::kNumTiles] = carry;
    params.list[VarlenTileList::kCounter] = 0;
  }
}

}  // namespace flashhop::sm90
