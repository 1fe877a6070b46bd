// Epilogue of the sm90 forward kernel: the normalised O accumulator goes registers -> shared memory
// (stmatrix) -> global memory (a TMA store, which also clips rows past seqlen_q; with packed GQA
// rows, 16-byte stores by every thread, each row to its own head); LSE is written per row by the
// thread that owns it. O passes through a buffer of its own where shared memory has room
// (Mainloop::kSeparateO); else through a buffer of one warpgroup's rows that the two consumer
// warpgroups take in turn (Mainloop::kTakeTurnsO); else through Q's buffer, which the mainloop no
// longer reads then. Each consumer warpgroup stores its own 64 rows and synchronises only with
// itself (in turn, with the other's store of the tile before), so one warpgroup's epilogue runs
// while the other still computes (the ping-pong offset survives the tile boundary).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "kernels/sm90/barriers.h"
#include "kernels/sm90/fwd_params.h"
#include "kernels/sm90/gmma_utils.h"

namespace flashhop::sm90 {

// The tile's rows of O (kBlockM, dv) as the consumer warpgroups write them: O's layout, or with a
// buffer taken in turn, every warpgroup's 64 rows on the same buffer: ((64, warpgroups), dv). (A
// function, so that the composition is formed only where it is valid.)
template <bool kTakeTurns, class SmemLayoutO, class SmemLayoutOBuffer, class BlockM, class HeadDimV>
constexpr auto o_tile_layout() {
  if constexpr (kTakeTurns) {
    using WarpGroups = cute::Int<BlockM::value / 64>;
    return cute::composition(SmemLayoutOBuffer{},
                             cute::Layout<cute::Shape<cute::Shape<cute::_64, WarpGroups>, HeadDimV>,
                                          cute::Stride<cute::Stride<cute::_1, cute::_0>, cute::_64>>{});
  } else {
    return SmemLayoutO{};
  }
}

// A variable-length batch's sequence: its first row in the packed O (and LSE) and its tile rows
// (its queries, times the heads per KV head with packed rows).
struct OutputRows {
  int begin = 0, rows = 0;
};

template <class Mainloop>
struct ForwardEpilogue {
  using Element = typename Mainloop::ElementO;  // of O
  using BlockM = typename Mainloop::BlockM;
  using HeadDimV = typename Mainloop::HeadDimV;
  using TiledMmaPV = typename Mainloop::TiledMmaPV;
  using Rows = typename Mainloop::Rows;
  static constexpr bool kPackGqa = Mainloop::kPackGqa;
  static constexpr bool kVarlen = Mainloop::kVarlen;
  // O stored row by row by every thread (store_rows): each packed row to its own head, and a
  // variable-length sequence's rows only (a TMA store of 64 rows would write into the next one).
  static constexpr bool kRowStores = kPackGqa || kVarlen;
  // Sharing Q's buffer, each consumer warpgroup writes only the rows its own Q K^T GEMMs read
  // (Mainloop checks that O's layout allows this), so no cross-warpgroup hazard arises.
  using SmemLayoutO = typename Mainloop::SmemLayoutO;  // (kBlockM, dv)
  // Whether O leaves Q's buffer alone, and whether its buffer holds one warpgroup's rows, taken in
  // turn (OBufferTurns).
  static constexpr bool kOwnBuffer = Mainloop::kOOutsideQ;
  static constexpr bool kTakeTurns = Mainloop::kTakeTurnsO;
  using SmemLayoutOBuffer =
      cute::conditional_t<kTakeTurns, typename Mainloop::SmemLayoutOOneWarpGroup, SmemLayoutO>;
  // Arrivals on q_free per consumer warpgroup and hand-over of Q's buffer. Rows of O stored row by
  // row from Q's buffer are read by every thread (store_rows), and each thread arrives after its
  // own reads, so that each arrival releases exactly the reads it orders (one elected arrival after
  // a named barrier leaves racecheck hazards against the next Q's cp.async writes). Elsewhere one thread of
  // each warpgroup arrives: after its TMA store has read O, or once its warpgroup's S GEMMs no
  // longer read Q (no generic-proxy reads of the buffer to order).
  static constexpr int kQFreeArrivalsPerWarpGroup = !kOwnBuffer && kRowStores ? kThreadsPerWarpGroup : 1;
  struct SharedStorage {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutOBuffer>, 1024> o;
  };
  // One consumer warpgroup's rows as the TMA store reads them: O's layout restricted to 64 rows
  // (the warpgroups' rows interleave: all lie in every 64-column block of swizzle atoms; each is
  // one 8 KB box per block), or the whole buffer taken in turn.
  using WarpGroupM = cute::Int<64>;
  using SmemLayoutOWarpGroup = cute::conditional_t<
      kTakeTurns, SmemLayoutOBuffer,
      decltype(cute::composition(SmemLayoutO{},
                                 cute::Layout<cute::Shape<WarpGroupM, HeadDimV>, cute::Stride<cute::_1, BlockM>>{}))>;
  // The tile's rows as the consumers write them (stmatrix).
  using SmemLayoutOTile = decltype(o_tile_layout<kTakeTurns, SmemLayoutO, SmemLayoutOBuffer, BlockM, HeadDimV>());
  // O in global memory as TMA sees it: (seqlen, dv, heads, batch), dv contiguous.
  using GmemTensor = decltype(cute::make_tensor(cute::make_gmem_ptr(static_cast<Element const*>(nullptr)),
                                                cute::Shape<int32_t, HeadDimV, int32_t, int32_t>{},
                                                cute::Stride<int64_t, cute::_1, int64_t, int64_t>{}));
  using TmaO = decltype(cute::make_tma_copy(cute::SM90_TMA_STORE{}, GmemTensor{}, SmemLayoutOWarpGroup{},
                                            cute::Shape<WarpGroupM, HeadDimV>{}, cute::_1{}));

  struct NoPartials {};
  // A variable-length batch split by keys: the splits' partial results (VarlenSplitPartials).
  struct SplitPartials {
    float* o;    // (num_splits, total_q, nheads, dv)
    float* lse;  // (num_splits, total_q, nheads)
    int total_q;
  };

  struct Params {
    TmaO tma_o;  // unpacked O
    float* lse;  // (batch, nheads, seqlen_q) or null
    int64_t lse_batch_stride, lse_head_stride, lse_row_stride;
    int seqlen_q, nheads, batch;
    Rows rows;
    // Packed O, scattered row by row: (batch, seqlen_q, nheads, dv) with these strides.
    Element* o;
    int64_t o_batch_stride, o_row_stride, o_head_stride;
    // Last, so that the fixed-length kernels' other parameters keep their places.
    cute::conditional_t<kVarlen, SplitPartials, NoPartials> partials;
  };

  static Params to_params(ForwardParams const& p) {
    using namespace cute;
    // A variable-length batch's O is stored row by row; its TMA descriptor, never used, spans the
    // packed rows as a batch of one (a dimension of stride 0 must have size 1).
    auto mO = make_tensor(make_gmem_ptr(static_cast<Element const*>(p.o)),
                          make_shape(kVarlen ? p.total_q : p.seqlen_q, HeadDimV{}, p.nheads, kVarlen ? 1 : p.batch),
                          make_stride(p.o_row_stride, _1{}, p.o_head_stride, p.o_batch_stride));
    return {make_tma_copy(SM90_TMA_STORE{}, mO, SmemLayoutOWarpGroup{}, Shape<WarpGroupM, HeadDimV>{}, _1{}),
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
            p.o_head_stride,
            partials_of(p)};
  }

  static auto partials_of(ForwardParams const& p) {
    if constexpr (kVarlen) {
      if (p.num_splits <= 1 || p.workspace == nullptr) return SplitPartials{nullptr, nullptr, p.total_q};
      using Layout = VarlenSplitPartials;
      return SplitPartials{Layout::o(p.workspace, p.batch),
                           Layout::lse(p.workspace, p.batch, p.num_splits, p.total_q, p.nheads, HeadDimV::value),
                           p.total_q};
    } else {
      return NoPartials{};
    }
  }

  // A split by keys of a variable-length batch's tile (kVarlen): this thread's rows of its
  // normalised O and their LSE go to split `split`'s partial results, in floats, straight from the
  // accumulator (two adjacent columns per float2), for the combine kernel. Rows past `sequence`'s
  // tile rows are left out.
  template <class OAccum, class RowValues>
  static CUTLASS_DEVICE void store_partial(Params const& params, OAccum const& o_accum, RowValues const& lse,
                                           int thread_idx, int m_block, int head, int split, OutputRows sequence) {
    using namespace cute;
    static_assert(kVarlen);
    TiledMmaPV mma_pv;
    auto thr_pv = mma_pv.get_thread_slice(thread_idx);
    Tensor coords = rowcol_view(thr_pv.partition_C(make_identity_tensor(Shape<BlockM, HeadDimV>{})));
    Tensor o = rowcol_view(o_accum);
    static_assert(decltype(size<1>(o))::value % 2 == 0, "the accumulator holds column pairs");
    int64_t const split_rows = int64_t{split} * params.partials.total_q + sequence.begin;
    CUTLASS_PRAGMA_UNROLL
    for (int m = 0; m < size<0>(o); ++m) {
      int const tile_row = m_block * BlockM::value + get<0>(coords(m, 0));
      if (tile_row >= sequence.rows) continue;
      typename Rows::Row const at = params.rows.locate(tile_row, head);
      int64_t const row = (split_rows + at.query) * params.nheads + at.head;
      if (thread_idx % 4 == 0) params.partials.lse[row] = lse[m];  // lane 0 of each quad holds the rows' LSE
      float* const o_row = params.partials.o + row * HeadDimV::value;
      CUTLASS_PRAGMA_UNROLL
      for (int n = 0; n < size<1>(o); n += 2) {
        // In the wgmma accumulator, a thread's values n and n + 1 of a row are adjacent columns.
        *reinterpret_cast<float2*>(o_row + get<1>(coords(m, n))) = make_float2(o(m, n), o(m, n + 1));
      }
    }
  }

  // o_accum: this thread's normalised O fragment; lse: its rows' LSE (rowcol order); `head`: the
  // tile head (query_rows.h); `sequence`: a variable-length batch's rows (its batch stride is 0).
  // thread_idx in [0, 128 x consumers) over all consumer warpgroups. In Q's buffer (no kOwnBuffer), when
  // `release_q` is set, the producer is waiting on `q_free` (kQFreeArrivalsPerWarpGroup per
  // warpgroup) to load the next tile's Q there.
  template <class OAccum, class RowValues>
  static CUTLASS_DEVICE void store(Params const& params, Element* smem_o, OAccum const& o_accum,
                                   RowValues const& lse, int thread_idx, int m_block, int head, int batch,
                                   cutlass::arch::ClusterBarrier& q_free, bool release_q, OutputRows sequence = {}) {
    using namespace cute;
    TiledMmaPV mma_pv;
    auto thr_pv = mma_pv.get_thread_slice(thread_idx);

    if (params.lse != nullptr && thread_idx % 4 == 0) {  // lane 0 of each quad holds its rows' LSE
      Tensor coords = rowcol_view(thr_pv.partition_C(make_identity_tensor(Shape<BlockM, HeadDimV>{})));
      float* lse_batch = params.lse + batch * params.lse_batch_stride;
      if constexpr (kVarlen) lse_batch += sequence.begin * params.lse_row_stride;
      CUTLASS_PRAGMA_UNROLL
      for (int m = 0; m < size<0>(coords); ++m) {
        int const tile_row = m_block * BlockM::value + get<0>(coords(m, 0));
        if (tile_row < (kVarlen ? sequence.rows : params.rows.rows)) {
          typename Rows::Row const at = params.rows.locate(tile_row, head);
          lse_batch[at.head * params.lse_head_stride + at.query * params.lse_row_stride] = lse[m];
        }
      }
    }

    int const consumer = thread_idx / kThreadsPerWarpGroup;
    bool const leader = thread_idx % kThreadsPerWarpGroup == 0;  // issues and waits for the warpgroup's TMA store
    Tensor sO = make_tensor(make_smem_ptr(smem_o), SmemLayoutOTile{});  // (kBlockM, dv)
    if constexpr (kTakeTurns) {
      // The other warpgroup's TMA store has read the buffer (and ours of the tile before had, too).
      OBufferTurns::wait(consumer);
    } else if constexpr (kOwnBuffer) {
      // This warpgroup's previous TMA store (or, row by row, its threads' reads) may still read its rows.
      if (!kRowStores && leader) tma_store_wait<0>();
      sync_epilogue(consumer);
    }
    Tensor o_regs = make_tensor<Element>(o_accum.layout());
    convert_fragment_into(o_accum, o_regs);
    auto smem_copy_o = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_pv);
    auto thr_copy_o = smem_copy_o.get_thread_slice(thread_idx);
    Tensor tOrO = thr_copy_o.retile_S(o_regs);  // ((Atom, AtomNum), MMA_M, MMA_N)
    Tensor tOsO = thr_copy_o.partition_D(sO);
    copy(smem_copy_o, tOrO, tOsO);
    if constexpr (kRowStores) {
      store_rows(params, sO, thread_idx, m_block, head, batch, sequence, q_free, release_q);
      return;
    }
    // stmatrix writes through the generic proxy; the TMA store reads through the async proxy.
    cutlass::arch::fence_view_async_shared();
    sync_epilogue(consumer);

    if (leader) {
      Tensor mO = params.tma_o.get_tma_tensor(make_shape(params.seqlen_q, HeadDimV{}, params.nheads, params.batch));
      Tensor gO = local_tile(mO(_, _, head, batch), Shape<WarpGroupM, HeadDimV>{},
                             make_coord(m_block * Mainloop::kConsumerWarpGroups + consumer, _0{}));  // (64, dv)
      Tensor sO_rows = [&] {  // (64, dv)
        if constexpr (kTakeTurns) {
          return make_tensor(make_smem_ptr(smem_o), SmemLayoutOWarpGroup{});
        } else {
          return local_tile(sO, Shape<WarpGroupM, HeadDimV>{}, make_coord(consumer, _0{}));
        }
      }();
      auto tma_o = params.tma_o.get_slice(_0{});
      copy(params.tma_o, tma_o.partition_S(sO_rows), tma_o.partition_D(gO));
      tma_store_arrive();
      if constexpr (!kOwnBuffer || kTakeTurns) {
        tma_store_wait<0>();  // the TMA has read this warpgroup's rows of O from shared memory
        if (!kOwnBuffer && release_q) q_free.arrive();
      }
    }
    if constexpr (kTakeTurns) {
      // The other warpgroup may write the buffer now: warp 0 passes it on once its leader saw the read.
      if (thread_idx % kThreadsPerWarpGroup < 32) {
        __syncwarp();
        OBufferTurns::pass(consumer);
      }
    }
    if constexpr (!kOwnBuffer) {
      // No thread may write the next tile's O into these rows before the TMA has read this one.
      sync_epilogue(consumer);
    }
  }

  // Row by row (kRowStores): this warpgroup's 64 rows of sO (kBlockM, dv) once all its threads
  // have written them, by 16-byte copies, consecutive threads along a row, each row to its own
  // query head; rows past the head's last are left out. A variable-length batch's sequence
  // (`sequence`) starts at its first row of the packed O.
  template <class SmemTensorO>
  static CUTLASS_DEVICE void store_rows(Params const& params, SmemTensorO const& sO, int thread_idx, int m_block,
                                        int head, int batch, OutputRows sequence,
                                        cutlass::arch::ClusterBarrier& q_free, bool release_q) {
    int const consumer = thread_idx / kThreadsPerWarpGroup;
    sync_epilogue(consumer);
    // 16 bytes are contiguous in every swizzled layout here (the swizzles permute 16-byte units).
    constexpr int kChunk = 16 / sizeof(Element);
    constexpr int kChunksPerRow = HeadDimV::value / kChunk;
    int const first_row = consumer * WarpGroupM::value;
    Element* o_batch = params.o + batch * params.o_batch_stride;
    if constexpr (kVarlen) o_batch += int64_t{sequence.begin} * params.o_row_stride;
    CUTLASS_PRAGMA_NO_UNROLL
    for (int i = thread_idx % kThreadsPerWarpGroup; i < WarpGroupM::value * kChunksPerRow; i += kThreadsPerWarpGroup) {
      int const row = first_row + i / kChunksPerRow, col = i % kChunksPerRow * kChunk;
      int const tile_row = m_block * BlockM::value + row;
      if (tile_row >= (kVarlen ? sequence.rows : params.rows.rows)) break;  // rows only grow with i
      typename Rows::Row const at = params.rows.locate(tile_row, head);
      *reinterpret_cast<uint4*>(o_batch + at.query * params.o_row_stride + at.head * params.o_head_stride + col) =
          *reinterpret_cast<uint4 const*>(&sO(row, col));
    }
    if constexpr (!kOwnBuffer) {
      // The producer loads the next Q over these rows once every thread has read its chunks of O;
      // the next tile's O (when that tile loads nothing, so no Q comes between) waits for this
      // warpgroup's reads at the barrier.
      sync_epilogue(consumer);
      if (release_q) q_free.arrive();
    }
  }

  // Before the first tile; thread_idx as in store.
  static CUTLASS_DEVICE void init(int thread_idx) {
    if constexpr (kTakeTurns) {
      if (thread_idx < 32) OBufferTurns::init();  // warp 0 of consumer 0
    }
  }

  // After the last tile: the CTA's shared memory must outlive the TMA's reads of it.
  static CUTLASS_DEVICE void finish(int thread_idx) {
    if (thread_idx % kThreadsPerWarpGroup == 0) cute::tma_store_wait<0>();
    if constexpr (kTakeTurns) OBufferTurns::finish(thread_idx / kThreadsPerWarpGroup);
  }
};

}  // namespace flashhop::sm90
