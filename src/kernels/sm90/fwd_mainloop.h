// Mainloop of the sm90 forward kernel: the producer half (TMA loads of Q once and of K/V tiles into
// a ring of shared-memory stages) and the consumer half (S = Q K^T and O += P V by wgmma, with the
// online softmax in between). One CTA computes one 128-row query tile of one head.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/gemm/collective/builders/sm90_common.inl>
#include <cutlass/pipeline/pipeline.hpp>

#include "api/forward_params.h"
#include "kernels/sm90/barriers.h"
#include "kernels/sm90/gmma_utils.h"
#include "kernels/sm90/mask.h"
#include "kernels/sm90/softmax.h"
#include "kernels/sm90/tile_config.h"

namespace flashhop::sm90 {

template <class Element_, int kHeadDim_, class Mask_>
struct ForwardMainloop {
  using Element = Element_;
  using Mask = Mask_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr ForwardTileConfig kTile = forward_tile_config(kHeadDim, Mask::kIsCausal);
  static constexpr int kBlockM = kTile.block_m;
  static constexpr int kBlockN = kTile.block_n;
  static constexpr int kStages = kTile.stages;
  static_assert(kBlockM == 64 * kConsumerWarpGroups, "each consumer warpgroup owns one 64-row wgmma atom");
  using MmaTurns = MmaScheduler<kTile.mma_pingpong>;

  using BlockM = cute::Int<kBlockM>;
  using BlockN = cute::Int<kBlockN>;
  using HeadDim = cute::Int<kHeadDim>;
  using TileShapeQK = cute::Shape<BlockM, BlockN, HeadDim>;  // (M, N, K) of S = Q K^T
  using TileShapePV = cute::Shape<BlockM, HeadDim, BlockN>;  // (M, N, K) of O = P V
  // The consumer warpgroups split M: warpgroup c computes rows [64 c, 64 c + 64) of the tile.
  using ConsumerAtomLayout = cute::Layout<cute::Shape<cute::Int<kConsumerWarpGroups>, cute::_1, cute::_1>>;

  using TiledMmaQK = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float, TileShapeQK>(), ConsumerAtomLayout{}));
  // P comes from registers (the converted S accumulator); V^T is read with d contiguous (MN-major).
  using TiledMmaPV = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<Element, Element, float, TileShapePV, cute::GMMA::Major::K,
                                 cute::GMMA::Major::MN>(),
      ConsumerAtomLayout{}));

  // Shared-memory tiles in the wgmma K-major swizzled layouts, d contiguous as in global memory.
  using SmemLayoutQ = decltype(cute::tile_to_shape(
      cutlass::gemm::collective::detail::ss_smem_selector<cute::GMMA::Major::K, Element, BlockM, HeadDim>(),
      cute::Shape<BlockM, HeadDim>{}));  // (kBlockM, d)
  using SmemLayoutKV = decltype(cute::tile_to_shape(
      cutlass::gemm::collective::detail::ss_smem_selector<cute::GMMA::Major::K, Element, BlockN, HeadDim>(),
      cute::Shape<BlockN, HeadDim, cute::Int<kStages>>{}));  // (kBlockN, d, stage)
  // V^T on V's buffer: (d, kBlockN, stage), the B operand of O = P V.
  using SmemLayoutVt = decltype(cute::composition(
      SmemLayoutKV{}, cute::make_ordered_layout(cute::Shape<HeadDim, BlockN, cute::Int<kStages>>{},
                                                cute::Step<cute::_2, cute::_1, cute::_3>{})));

  // TMA tiles are 128-byte swizzled: their buffers start on 1024-byte boundaries.
  struct SharedStorage {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> q;  // O in the epilogue
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutKV>, 1024> k;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutKV>, 1024> v;
  };

  // O gets a buffer of its own when it fits next to Q and the K/V rings (d <= 128): the producer can
  // then refill Q as soon as the last S GEMM has read it, while the epilogue still runs.
  static constexpr bool kSeparateO =
      2 * cute::cosize_v<SmemLayoutQ> * sizeof(Element) + 2 * cute::cosize_v<SmemLayoutKV> * sizeof(Element) +
          2048 <=
      227 * 1024;

  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  using PipelineState = typename Pipeline::PipelineState;
  static constexpr std::uint32_t kQBytes = cute::size(SmemLayoutQ{}) * sizeof(Element);
  static constexpr std::uint32_t kKVTileBytes =
      cute::size(cute::take<0, 2>(SmemLayoutKV{})) * sizeof(Element);

  // Global tensors as TMA sees them: (seqlen, d, heads, batch), 64-bit strides, d contiguous.
  using GmemShape = cute::Shape<int32_t, HeadDim, int32_t, int32_t>;
  using GmemStride = cute::Stride<int64_t, cute::_1, int64_t, int64_t>;
  using GmemTensor = decltype(cute::make_tensor(cute::make_gmem_ptr(static_cast<Element const*>(nullptr)),
                                                GmemShape{}, GmemStride{}));
  using TmaQ = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, GmemTensor{}, SmemLayoutQ{},
                                            cute::Shape<BlockM, HeadDim>{}, cute::_1{}));
  using TmaKV = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, GmemTensor{},
                                             cute::take<0, 2>(SmemLayoutKV{}),
                                             cute::Shape<BlockN, HeadDim>{}, cute::_1{}));

  struct Params {
    TmaQ tma_q;
    TmaKV tma_k, tma_v;
    int seqlen_q, seqlen_k, nheads, nheads_kv, batch;
    int heads_per_kv_head;  // GQA group size
    float softmax_scale;
    float softmax_scale_log2;
  };

  static Params to_params(detail::ForwardParams const& p) {
    using namespace cute;
    // TMA descriptors need non-empty extents and a non-null address; with seqlen_k == 0 no key tile
    // is ever loaded (n_block_end is 0), so K and V borrow Q's address and a length of one.
    bool const no_keys = p.seqlen_k == 0;
    auto gmem = [&](void const* ptr, int seqlen, int heads, int64_t row, int64_t head, int64_t batch) {
      return make_tensor(make_gmem_ptr(static_cast<Element const*>(ptr)),
                         make_shape(seqlen, HeadDim{}, heads, p.batch), make_stride(row, _1{}, head, batch));
    };
    auto mQ = gmem(p.q, p.seqlen_q, p.nheads, p.q_row_stride, p.q_head_stride, p.q_batch_stride);
    auto mK = gmem(no_keys ? p.q : p.k, no_keys ? 1 : p.seqlen_k, p.nheads_kv, p.k_row_stride,
                   p.k_head_stride, p.k_batch_stride);
    auto mV = gmem(no_keys ? p.q : p.v, no_keys ? 1 : p.seqlen_k, p.nheads_kv, p.v_row_stride,
                   p.v_head_stride, p.v_batch_stride);
    float constexpr kLog2e = 1.4426950408889634f;
    return {make_tma_copy(SM90_TMA_LOAD{}, mQ, SmemLayoutQ{}, Shape<BlockM, HeadDim>{}, _1{}),
            make_tma_copy(SM90_TMA_LOAD{}, mK, take<0, 2>(SmemLayoutKV{}), Shape<BlockN, HeadDim>{}, _1{}),
            make_tma_copy(SM90_TMA_LOAD{}, mV, take<0, 2>(SmemLayoutKV{}), Shape<BlockN, HeadDim>{}, _1{}),
            p.seqlen_q,
            p.seqlen_k,
            p.nheads,
            p.nheads_kv,
            p.batch,
            p.nheads / p.nheads_kv,
            p.softmax_scale,
            p.softmax_scale * kLog2e};
  }

  static CUTLASS_DEVICE void prefetch_tma_descriptors(Params const& params) {
    cute::prefetch_tma_descriptor(params.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_v.get_tma_descriptor());
  }

  // Producer, one thread, for one tile that visits key tiles [0, n_block_end): the K and V of key
  // tiles n_block_end - 1 down to 0, each into the next free stage of its ring, and Q. The first
  // K/V pair goes out before Q, whose buffer may still hold the previous tile's O: `wait_q_free`
  // returns once the epilogue has released it.
  template <class WaitQFree>
  static CUTLASS_DEVICE void load(Params const& params, SharedStorage& smem, cutlass::arch::ClusterTransactionBarrier& q_full,
                                  Pipeline& pipeline_k, Pipeline& pipeline_v, PipelineState& write, int m_block,
                                  int head, int batch, int n_block_end, WaitQFree const& wait_q_free) {
    using namespace cute;
    Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), SmemLayoutQ{});   // (kBlockM, d)
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), SmemLayoutKV{});  // (kBlockN, d, stage)
    Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), SmemLayoutKV{});  // (kBlockN, d, stage)
    int const head_kv = head / params.heads_per_kv_head;
    Tensor mQ = params.tma_q.get_tma_tensor(make_shape(params.seqlen_q, HeadDim{}, params.nheads, params.batch));
    Tensor mK = params.tma_k.get_tma_tensor(
        make_shape(cute::max(params.seqlen_k, 1), HeadDim{}, params.nheads_kv, params.batch));
    Tensor mV = params.tma_v.get_tma_tensor(
        make_shape(cute::max(params.seqlen_k, 1), HeadDim{}, params.nheads_kv, params.batch));
    Tensor gQ = local_tile(mQ(_, _, head, batch), Shape<BlockM, HeadDim>{}, make_coord(m_block, _0{}));  // (kBlockM, d)
    Tensor gK = local_tile(mK(_, _, head_kv, batch), Shape<BlockN, HeadDim>{}, make_coord(_, _0{}));  // (kBlockN, d, n)
    Tensor gV = local_tile(mV(_, _, head_kv, batch), Shape<BlockN, HeadDim>{}, make_coord(_, _0{}));  // (kBlockN, d, n)

    auto tma_q = params.tma_q.get_slice(_0{});
    auto tma_k = params.tma_k.get_slice(_0{});
    auto tma_v = params.tma_v.get_slice(_0{});
    Tensor tQgQ = tma_q.partition_S(gQ);  // (TMA, TMA_M, TMA_D)
    Tensor tQsQ = tma_q.partition_D(sQ);
    Tensor tKgK = tma_k.partition_S(gK);  // (TMA, TMA_N, TMA_D, n)
    Tensor tKsK = tma_k.partition_D(sK);  // (TMA, TMA_N, TMA_D, stage)
    Tensor tVgV = tma_v.partition_S(gV);
    Tensor tVsV = tma_v.partition_D(sV);

    auto load_kv = [&](int n_block) {
      pipeline_k.producer_acquire(write);
      copy(params.tma_k.with(*pipeline_k.producer_get_barrier(write)), tKgK(_, _, _, n_block),
           tKsK(_, _, _, write.index()));
      pipeline_v.producer_acquire(write);
      copy(params.tma_v.with(*pipeline_v.producer_get_barrier(write)), tVgV(_, _, _, n_block),
           tVsV(_, _, _, write.index()));
      ++write;
    };
    load_kv(n_block_end - 1);
    wait_q_free();
    using BarrierType = cutlass::arch::ClusterTransactionBarrier::ValueType;
    q_full.arrive_and_expect_tx(kQBytes);
    copy(params.tma_q.with(reinterpret_cast<BarrierType&>(q_full)), tQgQ, tQsQ);
    for (int n_block = n_block_end - 2; n_block >= 0; --n_block) load_kv(n_block);
  }

  // Consumer warpgroup `consumer` (thread_idx in [0, 256) over both consumers): accumulates the
  // unnormalised O of its 64 rows into `o_accum` and the row statistics into `softmax`. `q_phase`
  // is the phase of q_full that this tile's Q completes; `k_read` is the next K/V stage to read and
  // is left past this tile's key tiles. `q_read_done()` is called once this warpgroup's last S GEMM
  // has retired, i.e. it no longer reads Q.
  //
  // Intra-warpgroup overlap: S of key tile n is issued before P V of key tile n + 1, so the softmax
  // of tile n runs while the tensor cores do P V; the rescale of O that this softmax owes is paid
  // in the next step, while the next S GEMM runs and before the next P V.
  template <class OAccum, class Softmax, class QReadDone>
  static CUTLASS_DEVICE void mma(Params const& params, SharedStorage& smem, Mask const& mask,
                                 cutlass::arch::ClusterTransactionBarrier& q_full, int q_phase,
                                 Pipeline& pipeline_k, Pipeline& pipeline_v, PipelineState& k_read,
                                 OAccum& o_accum, Softmax& softmax, int thread_idx, int consumer, int m_block,
                                 int n_block_end, QReadDone const& q_read_done) {
    using namespace cute;
    Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), SmemLayoutKV{});
    Tensor sVt = make_tensor(make_smem_ptr(smem.v.data()), SmemLayoutVt{});  // (d, kBlockN, stage)

    TiledMmaQK mma_qk;
    TiledMmaPV mma_pv;
    auto thr_qk = mma_qk.get_thread_slice(thread_idx);
    auto thr_pv = mma_pv.get_thread_slice(thread_idx);
    Tensor tSrQ = thr_qk.partition_fragment_A(sQ);   // (MMA, MMA_M, MMA_K) smem descriptors
    Tensor tSrK = thr_qk.partition_fragment_B(sK);   // (MMA, MMA_N, MMA_K, stage)
    Tensor tOrV = thr_pv.partition_fragment_B(sVt);  // (MMA, MMA_N, MMA_K, stage)
    // (row, col) within the score tile of each of this thread's S elements, in the rowcol view.
    Tensor coords = rowcol_view(thr_qk.partition_C(make_identity_tensor(Shape<BlockM, BlockN>{})));

    int const row_offset = m_block * kBlockM;
    int const first_masked = mask.template first_masked_n_block<kBlockM, kBlockN>(m_block);
    auto scores_of = [&](auto& s_accum, int n_block, auto needs_mask) {
      Tensor scores = rowcol_view(s_accum);  // (rows, cols)
      if constexpr (decltype(needs_mask)::value) apply_mask(mask, scores, coords, row_offset, n_block * kBlockN);
      return scores;
    };

    // P, the converted probabilities of the previous tile, as the register A operand of P V.
    Tensor s_first = partition_fragment_C(mma_qk, Shape<BlockM, BlockN>{});  // (MMA, MMA_M, MMA_N)
    Tensor p_regs = make_tensor<Element>(accumulator_as_a_operand(s_first.layout()));

    q_full.wait(q_phase);
    int n_block = n_block_end - 1;
    MmaTurns::wait_turn(consumer);
    pipeline_k.consumer_wait(k_read);
    warpgroup_gemm</*kZeroInit=*/true, /*kWait=*/-1>(mma_qk, tSrQ, tSrK(_, _, _, k_read.index()), s_first);
    MmaTurns::pass_turn(consumer);
    warpgroup_wait<0>();
    pipeline_k.consumer_release(k_read);
    {
      Tensor scores = n_block >= first_masked ? scores_of(s_first, n_block, true_type{})
                                              : scores_of(s_first, n_block, false_type{});
      softmax.template update</*kIsFirst=*/true>(scores);
      convert_fragment_into(s_first, p_regs);
    }
    PipelineState v_read = k_read;  // V of the previous key tile, consumed by the pending P V
    ++k_read;

    // The factor that takes O from the previous running max to the current one, owed after each
    // softmax and paid before the next P V (while the tensor cores run the next S GEMM).
    // O is still zero before the first P V, so any factor will do there.
    typename Softmax::RowValues o_scale = Softmax::unit_factors();
    auto step = [&](int n_block, auto needs_mask) {
      Tensor s_accum = partition_fragment_C(mma_qk, Shape<BlockM, BlockN>{});
      MmaTurns::wait_turn(consumer);
      pipeline_k.consumer_wait(k_read);
      warpgroup_gemm<true, -1>(mma_qk, tSrQ, tSrK(_, _, _, k_read.index()), s_accum);
      Softmax::rescale(rowcol_view(o_accum), o_scale);
      pipeline_v.consumer_wait(v_read);
      warpgroup_gemm<false, -1>(mma_pv, p_regs, tOrV(_, _, _, v_read.index()), o_accum);
      MmaTurns::pass_turn(consumer);
      warpgroup_wait<1>();  // S retired; P V may still run
      pipeline_k.consumer_release(k_read);
      Tensor scores = scores_of(s_accum, n_block, needs_mask);
      o_scale = softmax.template update</*kIsFirst=*/false>(scores);
      warpgroup_wait<0>();  // P V retired: p_regs is free again
      pipeline_v.consumer_release(v_read);
      convert_fragment_into(s_accum, p_regs);
      v_read = k_read;
      ++k_read;
    };
    // Walking down, the masked key tiles (diagonal, sequence end) come first.
    for (--n_block; n_block >= 0 && n_block >= first_masked; --n_block) step(n_block, true_type{});
    for (; n_block >= 0; --n_block) step(n_block, false_type{});

    q_read_done();
    Softmax::rescale(rowcol_view(o_accum), o_scale);
    pipeline_v.consumer_wait(v_read);
    warpgroup_gemm<false, 0>(mma_pv, p_regs, tOrV(_, _, _, v_read.index()), o_accum);
    pipeline_v.consumer_release(v_read);
  }
};

}  // namespace flashhop::sm90
