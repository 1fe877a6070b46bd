// The append kernel (append_kv.h): one CTA per new key / value row or query row. A row finds its
// sequence by a binary search of its cumulative lengths, its position (the sequence's first new
// token's, plus its index among the new rows; a query's plus its index only where positions
// advance), and writes each element of every head: rotated where the element lies within
// rotary_dim, copied otherwise. Rotation in float: x0' = x0 cos - x1 sin, x1' = x0 sin + x1 cos over
// the pairs (2j, 2j + 1) (interleaved) or (j, j + rotary_dim / 2).
#include <string>

#include <cutlass/numeric_types.h>

#include "kernels/sm90/append_kv.h"

namespace flashhop::sm90 {
namespace {

constexpr int kThreads = 128;

// The last b in [0, batch) with cu[b] <= row.
__device__ int sequence_of(int const* cu, int batch, int row) {
  int low = 0, high = batch - 1;
  while (low < high) {
    int const mid = (low + high + 1) / 2;
    if (__ldg(cu + mid) <= row) {
      low = mid;
    } else {
      high = mid - 1;
    }
  }
  return low;
}

// Writes one row of `heads` heads of `dim` elements from src to dst, rotated at `position` where
// the tables hold it (cos null, or a position outside them: copied).
template <class Element>
__device__ void write_row(AppendKvParams const& p, Element const* src, std::int64_t src_head_stride, Element* dst,
                          std::int64_t dst_head_stride, int heads, int dim, int position, bool rotate) {
  rotate = rotate && p.rotary_cos != nullptr && position >= 0 && position < p.seqlen_ro;
  int const half = p.rotary_dim / 2;
  auto const* cos_row = static_cast<Element const*>(p.rotary_cos) + (rotate ? position * p.rotary_cos_stride : 0);
  auto const* sin_row = static_cast<Element const*>(p.rotary_sin) + (rotate ? position * p.rotary_sin_stride : 0);
  for (int i = threadIdx.x; i < heads * dim; i += kThreads) {
    int const head = i / dim, c = i - head * dim;
    Element const* x = src + head * src_head_stride;
    float value;
    if (rotate && c < p.rotary_dim) {
      int j, first, second;
      bool is_first;
      if (p.rotary_interleaved) {
        j = c / 2;
        first = 2 * j;
        second = first + 1;
        is_first = c % 2 == 0;
      } else {
        j = c < half ? c : c - half;
        first = j;
        second = j + half;
        is_first = c < half;
      }
      float const cos = static_cast<float>(cos_row[j]), sin = static_cast<float>(sin_row[j]);
      float const x0 = static_cast<float>(x[first]), x1 = static_cast<float>(x[second]);
      value = is_first ? x0 * cos - x1 * sin : x0 * sin + x1 * cos;
    } else {
      value = static_cast<float>(x[c]);
    }
    dst[head * dst_head_stride + c] = static_cast<Element>(value);
  }
}

template <class Element>
__global__ void __launch_bounds__(kThreads) append_kv_kernel(AppendKvParams const p) {
  int row = blockIdx.x;
  bool const is_query = row >= p.total_new;
  if (is_query) row -= p.total_new;
  int const* cu = is_query ? p.cu_seqlens_q : p.cu_seqlens_new;
  int const b = sequence_of(cu, p.batch, row);
  if (row < __ldg(cu + b) || row >= __ldg(cu + b + 1)) return;  // a row of no sequence (offsets past the rows)
  int const index = row - __ldg(cu + b);
  int const cached = __ldg(p.cache_seqlens + b);
  int const first_position = p.rotary_seqlens != nullptr ? __ldg(p.rotary_seqlens + b) : cached;
  if (is_query) {
    int const position = first_position + (p.q_positions_advance ? index : 0);
    write_row(p, static_cast<Element const*>(p.q) + row * p.q_row_stride, p.q_head_stride,
              static_cast<Element*>(p.q_rotated) + row * p.q_rotated_row_stride, p.q_rotated_head_stride, p.nheads,
              p.head_dim, position, true);
    return;
  }
  // The new row's place in the cache: key cached + index of the sequence; nothing is written past
  // its pages or to a page id outside the cache.
  std::int64_t const key = std::int64_t{cached} + index;
  if (cached < 0 || key >= std::int64_t{p.max_pages} * p.page_size) return;
  int const page = __ldg(p.page_table + b * p.page_table_stride + key / p.page_size);
  if (page < 0 || page >= p.num_pages) return;
  int const page_row = static_cast<int>(key % p.page_size);
  write_row(p, static_cast<Element const*>(p.k_new) + row * p.k_new_row_stride, p.k_new_head_stride,
            static_cast<Element*>(p.k_cache) + page * p.k_page_stride + page_row * p.k_row_stride, p.k_head_stride,
            p.nheads_kv, p.head_dim, first_position + index, true);
  write_row(p, static_cast<Element const*>(p.v_new) + row * p.v_new_row_stride, p.v_new_head_stride,
            static_cast<Element*>(p.v_cache) + page * p.v_page_stride + page_row * p.v_row_stride, p.v_head_stride,
            p.nheads_kv, p.head_dim_v, 0, false);
}

}  // namespace

template <class Element>
Status launch_append_kv(AppendKvParams const& p, cudaStream_t stream) {
  std::int64_t const rows = std::int64_t{p.total_new} + (p.q != nullptr ? p.total_q : 0);
  if (p.batch == 0 || rows == 0) return Status::success();
  append_kv_kernel<Element><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(p);
  if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) {
    return {StatusCode::kCudaError, std::string("append kernel launch: ") + cudaGetErrorString(err)};
  }
  return Status::success();
}

template Status launch_append_kv<cutlass::bfloat16_t>(AppendKvParams const&, cudaStream_t);
template Status launch_append_kv<cutlass::half_t>(AppendKvParams const&, cudaStream_t);
template Status launch_append_kv<cutlass::float_e4m3_t>(AppendKvParams const&, cudaStream_t);

}  // namespace flashhop::sm90
