// Appending new keys and values to a paged KV cache with the rotary embedding (flashhop::append_kv):
// the kernel's arguments and launcher. Host-includable (no CuTe).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "flashhop/flashhop.h"

namespace flashhop::sm90 {

// Strides in elements; the last dimension of every tensor is contiguous. One CTA per row: the
// total_new new key / value rows, then the total_q query rows (where q is given).
struct AppendKvParams {
  void* k_cache = nullptr;  // (num_pages, page_size, nheads_kv, d)
  void* v_cache = nullptr;  // (num_pages, page_size, nheads_kv, dv)
  std::int64_t k_page_stride = 0, k_row_stride = 0, k_head_stride = 0;
  std::int64_t v_page_stride = 0, v_row_stride = 0, v_head_stride = 0;
  int num_pages = 0, page_size = 0;
  int const* page_table = nullptr;  // (batch, max_pages)
  std::int64_t page_table_stride = 0;
  int max_pages = 0;
  int const* cache_seqlens = nullptr;  // (batch)
  void const* k_new = nullptr;         // (total_new, nheads_kv, d)
  void const* v_new = nullptr;         // (total_new, nheads_kv, dv)
  std::int64_t k_new_row_stride = 0, k_new_head_stride = 0, v_new_row_stride = 0, v_new_head_stride = 0;
  int const* cu_seqlens_new = nullptr;  // (batch + 1)
  int batch = 0, total_new = 0, nheads_kv = 0, head_dim = 0, head_dim_v = 0;
  // The rotary embedding (cos null: none): tables (seqlen_ro, rotary_dim / 2).
  void const* rotary_cos = nullptr;
  void const* rotary_sin = nullptr;
  std::int64_t rotary_cos_stride = 0, rotary_sin_stride = 0;
  int seqlen_ro = 0, rotary_dim = 0;
  bool rotary_interleaved = true;
  int const* rotary_seqlens = nullptr;  // (batch) or null: the first new token's position, else cache_seqlens
  // Queries rotated at the same positions (q null: none).
  void const* q = nullptr;  // (total_q, nheads, d)
  void* q_rotated = nullptr;
  std::int64_t q_row_stride = 0, q_head_stride = 0, q_rotated_row_stride = 0, q_rotated_head_stride = 0;
  int const* cu_seqlens_q = nullptr;  // (batch + 1)
  int total_q = 0, nheads = 0;
  bool q_positions_advance = false;
};

// The kernel with cache elements of Element: cutlass::bfloat16_t, cutlass::half_t, or
// cutlass::float_e4m3_t (no rotary embedding: validation).
template <class Element>
Status launch_append_kv(AppendKvParams const& p, cudaStream_t stream);

}  // namespace flashhop::sm90
