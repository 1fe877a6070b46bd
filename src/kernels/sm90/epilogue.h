// Epilogue of the sm90 forward kernel: the normalised O accumulator goes registers -> shared memory
// (stmatrix) -> global memory (one TMA store, which also clips rows past seqlen_q; with packed GQA
// rows, 16-byte stores by every consumer thread, each row to its own head); LSE is written per row
// by the thread that owns it. O passes through a buffer of its own where shared memory has
// room (Mainloop::kSeparateO), else through Q's buffer, which the mainloop no longer reads then.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "api/forward_params.h"
#include "kernels/sm90/barriers.h"
#include "kernels/sm90/gmma_utils.h"

namespace flashhop::sm90 {

template <class Mainloop>
struct ForwardEpilogue {
  using Element = typename Mainloop::Element;
  using BlockM = typename Mainloop::BlockM;
  using HeadDimV = typename Mainloop::HeadDimV;
  using TiledMmaPV = typename Mainloop::TiledMmaPV;
  using Rows = typename Mainloop::Rows;
  static constexpr bool kPackGqa = Mainloop::kPackGqa;
  // Sharing Q's buffer, each consumer warpgroup writes only the rows its own Q K^T GEMMs read
  // (Mainloop checks that O's layout allows this), so no cross-warpgroup hazard arises.
  using SmemLayoutO = typename Mainloop::SmemLayoutO;  // (kBlockM, dv)
  static constexpr bool kOwnBuffer = Mainloop::kSeparateO;
  struct SharedStorage {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutO>, 1024> o;
  };
  using GmemTensor = typename Mainloop::GmemTensorV;
  using TmaO = decltype(cute::make_tma_copy(cute::SM90_TMA_STORE{}, GmemTensor{}, SmemLayoutO{},
                                            cute::Shape<BlockM, HeadDimV>{}, cute::_1{}));

  struct Params {
    TmaO tma_o;  // unpacked O
    float* lse;  // (batch, nheads, seqlen_q) or null
    int64_t lse_batch_stride, lse_head_stride, lse_row_stride;
    int seqlen_q, nheads, batch;
    Rows rows;
    // Packed O, scattered row by row: (batch, seqlen_q, nheads, dv) with these strides.
    Element* o;
    int64_t o_batch_stride, o_row_stride, o_head_stride;
  };

  static Params to_params(detail::ForwardParams const& p) {
    using namespace cute;
    auto mO = make_tensor(make_gmem_ptr(static_cast<Element const*>(p.o)),
                          make_shape(p.seqlen_q, HeadDimV{}, p.nheads, p.batch),
                          make_stride(p.o_row_stride, _1{}, p.o_head_stride, p.o_batch_stride));
    return {make_tma_copy(SM90_TMA_STORE{}, mO, SmemLayoutO{}, Shape<BlockM, HeadDimV>{}, _1{}),
            p.lse,
            p.lse_batch_stride,
            p.lse_head_stride,
            p.lse_row_stride,
            p.seqlen_q,
            p.nheads,
            p.batch,
            Rows::make(p.seqlen_q, p.nheads, p.nheads_kv),
            static_cast<Element*>(p.o),
            p.o_batch_stride,
            p.o_row_stride,
            p.o_head_stride};
  }

  // o_accum: this thread's normalised O fragment; lse: its rows' LSE (rowcol order); `head`: the
  // tile head (query_rows.h). thread_idx in [0, 256) over both consumer warpgroups. In Q's buffer
  // (no kOwnBuffer), when `release_q` is set, the producer is waiting on `q_free` to load the next
  // tile's Q there.
  template <class OAccum, class RowValues>
  static CUTLASS_DEVICE void store(Params const& params, Element* smem_o, OAccum const& o_accum,
                                   RowValues const& lse, int thread_idx, int m_block, int head, int batch,
                                   cutlass::arch::ClusterBarrier& q_free, bool release_q) {
    using namespace cute;
    TiledMmaPV mma_pv;
    auto thr_pv = mma_pv.get_thread_slice(thread_idx);

    if (params.lse != nullptr && thread_idx % 4 == 0) {  // lane 0 of each quad holds its rows' LSE
      Tensor coords = rowcol_view(thr_pv.partition_C(make_identity_tensor(Shape<BlockM, HeadDimV>{})));
      float* lse_batch = params.lse + batch * params.lse_batch_stride;
      CUTLASS_PRAGMA_UNROLL
      for (int m = 0; m < size<0>(coords); ++m) {
        int const tile_row = m_block * BlockM::value + get<0>(coords(m, 0));
        if (tile_row < params.rows.rows) {
          typename Rows::Row const at = params.rows.locate(tile_row, head);
          lse_batch[at.head * params.lse_head_stride + at.query * params.lse_row_stride] = lse[m];
        }
      }
    }

    Tensor sO = make_tensor(make_smem_ptr(smem_o), SmemLayoutO{});  // (kBlockM, dv)
    if constexpr (kOwnBuffer) {
      // The previous tile's TMA store (or, packed, its threads' reads) may still be reading the buffer.
      if (!kPackGqa && thread_idx == 0) tma_store_wait<0>();
      cutlass::arch::NamedBarrier::sync(kConsumerThreads, static_cast<unsigned>(ForwardBarrier::kEpilogue));
    }
    Tensor o_regs = make_tensor<Element>(o_accum.layout());
    convert_fragment_into(o_accum, o_regs);
    auto smem_copy_o = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_pv);
    auto thr_copy_o = smem_copy_o.get_thread_slice(thread_idx);
    Tensor tOrO = thr_copy_o.retile_S(o_regs);  // ((Atom, AtomNum), MMA_M, MMA_N)
    Tensor tOsO = thr_copy_o.partition_D(sO);
    copy(smem_copy_o, tOrO, tOsO);
    if constexpr (kPackGqa) {
      store_packed(params, sO, thread_idx, m_block, head, batch, q_free, release_q);
      return;
    }
    // stmatrix writes through the generic proxy; the TMA store reads through the async proxy.
    cutlass::arch::fence_view_async_shared();
    cutlass::arch::NamedBarrier::sync(kConsumerThreads, static_cast<unsigned>(ForwardBarrier::kEpilogue));

    if (thread_idx == 0) {
      Tensor mO = params.tma_o.get_tma_tensor(make_shape(params.seqlen_q, HeadDimV{}, params.nheads, params.batch));
      Tensor gO = local_tile(mO(_, _, head, batch), Shape<BlockM, HeadDimV>{}, make_coord(m_block, _0{}));
      auto tma_o = params.tma_o.get_slice(_0{});
      copy(params.tma_o, tma_o.partition_S(sO), tma_o.partition_D(gO));
      tma_store_arrive();
      if constexpr (!kOwnBuffer) {
        tma_store_wait<0>();  // the TMA has read all of O from shared memory
        if (release_q) q_free.arrive();
      }
    }
    if constexpr (!kOwnBuffer) {
      // No consumer may write the next tile's O into the buffer before the TMA has read this one.
      cutlass::arch::NamedBarrier::sync(kConsumerThreads, static_cast<unsigned>(ForwardBarrier::kEpilogue));
    }
  }

  // Packed rows, from sO (kBlockM, dv) once every consumer has written its part: 16-byte copies,
  // consecutive threads along a row, each row to its own query head; rows past the last query are
  // left out.
  template <class SmemTensorO>
  static CUTLASS_DEVICE void store_packed(Params const& params, SmemTensorO const& sO, int thread_idx, int m_block,
                                          int head, int batch, cutlass::arch::ClusterBarrier& q_free,
                                          bool release_q) {
    cutlass::arch::NamedBarrier::sync(kConsumerThreads, static_cast<unsigned>(ForwardBarrier::kEpilogue));
    // 16 bytes are contiguous in every swizzled layout here (the swizzles permute 16-byte units).
    constexpr int kChunk = 16 / sizeof(Element);
    constexpr int kChunksPerRow = HeadDimV::value / kChunk;
    Element* o_batch = params.o + batch * params.o_batch_stride;
    CUTLASS_PRAGMA_NO_UNROLL
    for (int i = thread_idx; i < BlockM::value * kChunksPerRow; i += kConsumerThreads) {
      int const row = i / kChunksPerRow, col = i % kChunksPerRow * kChunk;
      int const tile_row = m_block * BlockM::value + row;
      if (tile_row >= params.rows.rows) break;  // rows only grow with i
      typename Rows::Row const at = params.rows.locate(tile_row, head);
      *reinterpret_cast<uint4*>(o_batch + at.query * params.o_row_stride + at.head * params.o_head_stride + col) =
          *reinterpret_cast<uint4 const*>(&sO(row, col));
    }
    if constexpr (!kOwnBuffer) {
      // Every thread has read its part of O before the producer may load the next Q over it.
      cutlass::arch::NamedBarrier::sync(kConsumerThreads, static_cast<unsigned>(ForwardBarrier::kEpilogue));
      if (release_q && thread_idx == 0) q_free.arrive();
    }
  }

  // After the last tile: the CTA's shared memory must outlive the TMA's reads of it.
  static CUTLASS_DEVICE void finish(int thread_idx) {
    if (thread_idx == 0) cute::tma_store_wait<0>();
  }
};

}  // namespace flashhop::sm90
