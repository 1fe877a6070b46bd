// The sm90 backward kernels. From Q, K, V, O, dO and the forward's LSE they compute dQ, dK and dV:
//
//   preprocess   per query row, D = rowsum(dO * O) and LSE in log2 units, into the workspace; the
//                query block's dQ accumulator cleared;
//   main         one CTA per key tile (kBlockN keys) of one KV head: K and V stay in shared
//                memory while the CTA walks the query tiles (kBlockM rows) of every query head of
//                the KV group that see one of its keys. Per query tile, consumer warpgroup w owns
//                key rows [64 w, 64 w + 64) (DkvSplit::kKeyRows) and computes
//                  S^T = K Q^T, dP^T = V dO^T                     (wgmma, both operands in smem)
//                  P^T = exp(S^T - LSE), dS^T = P^T (dP^T - D)   (registers; softcap's derivative)
//                  dV += P^T dO, dK += dS^T Q                     (wgmma, P^T and dS^T from registers)
//                and, once both warpgroups' dS^T are in shared memory, its half of
//                  dQ = dS K                                      (wgmma, both operands in smem)
//                (64 query rows of a 128-row tile, or half of the columns of a 64-row one),
//                which it stores into its span of a shared-memory buffer for the writer warp to add
//                into the fp32 accumulator in global memory by a bulk reduction (in n_block order
//                under a semaphore with `deterministic`). dK and dV sum over the KV group's query
//                heads in registers: no atomics, the same order in every call.
//                With DkvSplit::kColumns (large head dims) the warpgroups share 64 key rows: w
//                computes S^T and dP^T for half of the query columns, and, from P^T and dS^T in
//                shared memory, half of the columns of dV, dK and dQ;
//   postprocess  dQ = softmax_scale * accumulator, converted to the element type.
//
// A variable-length batch (BackwardParams' cu_seqlens) runs the same kernels on the grid of its
// bounds: each CTA reads its sequence's rows and lengths (varlen.h) and returns at once where its
// tile lies past them; TMA reads the packed tensors from the sequence's first row (the rows past
// the sequence weigh zero: their keys are masked, their queries' LSE is +inf).
//
// In the producer warpgroup, one warp loads Q with its LSE and dO with its D into rings of kStages
// stages (TMA, bulk copies, mbarrier pipelines) and another, the writer warp, adds the consumers'
// dQ into the accumulator. Scores are kept unscaled as in the forward (softmax.h): s = q.k, or
// t = tanh(q.k * softmax_scale / softcap) with soft-capping, and softmax_scale (times 1 - t^2)
// comes in at the end: dQ and dK are scaled once, in the postprocess and the epilogue.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/gemm/collective/builders/sm90_common.inl>
#include <cutlass/pipeline/pipeline.hpp>

#include "kernels/sm90/barriers.h"
#include "kernels/sm90/bwd_params.h"
#include "kernels/sm90/bwd_recipes.h"
#include "kernels/sm90/gmma_utils.h"
#include "kernels/sm90/mask.h"
#include "kernels/sm90/softmax.h"
#include "kernels/sm90/tile_scheduler.h"
#include "kernels/sm90/varlen.h"

namespace flashhop::sm90 {

// cp.reduce.async.bulk: adds `bytes` of fp32 values from shared memory into global memory, element
// by element and atomically, in the bulk-async group that tma_store_arrive() commits. The lines
// are kept in L2 last (the other key tiles' CTAs add into the same query tile).
CUTLASS_DEVICE void bulk_reduce_add(float* gmem, float const* smem, int bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.L2::cache_hint.add.f32 [%0], [%1], %2, %3;\n"
               :
               : "l"(gmem), "r"(cute::cast_smem_ptr_to_uint(smem)), "r"(bytes),
                 "l"(static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_LAST))
               : "memory");
}

// Waits until every committed bulk-async group has completed its writes (tma_store_wait waits only
// until the sources have been read).
CUTLASS_DEVICE void bulk_wait_complete() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

// A load that later reads and writes of this thread cannot overtake (the semaphores' waits).
CUTLASS_DEVICE int load_acquire(int const* address) {
  int value;
  asm volatile("ld.global.acquire.gpu.b32 %0, [%1];\n" : "=r"(value) : "l"(address) : "memory");
  return value;
}

// Two adjacent elements, converted, in one 4-byte store (`at` is 4-byte aligned).
template <class Element>
CUTLASS_DEVICE void store_pair(Element* at, float first, float second) {
  cutlass::Array<Element, 2> pair;
  pair[0] = Element(first);
  pair[1] = Element(second);
  *reinterpret_cast<cutlass::Array<Element, 2>*>(at) = pair;
}

template <class Element_, int kRecipe_, bool kSoftcap_>
struct BackwardKernel {
  static constexpr BackwardRecipe kRecipe = kBackwardRecipes[kRecipe_];
  using Element = Element_;
  static constexpr bool kSoftcap = kSoftcap_;
  using Mask = cute::conditional_t<kRecipe.local(), LocalMask, NoMask>;
  static constexpr int kHeadDim = kRecipe.head_dim;
  static constexpr int kHeadDimV = kRecipe.head_dim_v;
  static constexpr int kBlockM = kRecipe.block_m;
  static constexpr int kBlockN = kRecipe.block_n;
  static constexpr int kStages = kRecipe.stages;
  static constexpr int kConsumers = kRecipe.consumer_warpgroups();
  static constexpr bool kSplitColumns = kRecipe.split == DkvSplit::kColumns;
  // Two consumer warpgroups: each takes half of dQ (64 of 128 query rows, or with 64-row query
  // tiles a wgmma atom of N = d / 2 columns), and either 64 key rows of their own or, splitting
  // columns, half of dV's and dK's.
  static_assert(kConsumers == 2 && kBlockN == (kSplitColumns ? 64 : 64 * kConsumers),
                "two consumer warpgroups on 64 key rows each, or sharing 64");
  static_assert(kHeadDim % (8 * kConsumers) == 0 && kHeadDimV % (8 * kConsumers) == 0,
                "columns split into wgmma widths");
  using Roles = WarpGroups<kConsumers>;
  static constexpr int kThreads = Roles::kThreads;
  static constexpr int kConsumerThreads = Roles::kConsumerThreads;

  using BlockM = cute::Int<kBlockM>;
  using BlockN = cute::Int<kBlockN>;
  using HeadDim = cute::Int<kHeadDim>;
  using HeadDimV = cute::Int<kHeadDimV>;
  using Stages = cute::Int<kStages>;
  // Consumer warpgroup w: dQ's query rows [64 w, 64 w + 64) of a 128-row tile, or its columns
  // [w d / 2, (w + 1) d / 2) of a 64-row one; key rows [64 w, 64 w + 64) of S^T, dP^T, dV and dK,
  // or with kSplitColumns, query columns [32 w, 32 w + 32) of S^T and dP^T and the w-th half of
  // the columns of dV and dK.
  using KeyRowsAtoms = cute::Layout<cute::Shape<cute::Int<kConsumers>, cute::_1, cute::_1>>;
  using ColumnAtoms = cute::Layout<cute::Shape<cute::_1, cute::Int<kConsumers>, cute::_1>>;
  using ScoreAtoms = cute::conditional_t<kSplitColumns, ColumnAtoms, KeyRowsAtoms>;
  using ScoreAtomCols = cute::Int<kSplitColumns ? kBlockM / kConsumers : kBlockM>;

  template <class TileShape, cute::GMMA::Major kMajorA = cute::GMMA::Major::K,
            cute::GMMA::Major kMajorB = cute::GMMA::Major::K>
  using SsMma = decltype(cute::GMMA::ss_op_selector<Element, Element, float, TileShape, kMajorA, kMajorB>());
  template <class TileShape>  // A from registers (K-major), B read with its N dimension contiguous
  using RsMma = decltype(cute::GMMA::rs_op_selector<Element, Element, float, TileShape, cute::GMMA::Major::K,
                                                    cute::GMMA::Major::MN>());
  // dV += P^T dO and dK += dS^T Q: P^T and dS^T from registers, or with kSplitColumns from shared
  // memory (K-major: the query columns contiguous), B with its N dimension contiguous.
  template <int kCols>
  using DkvMma = cute::conditional_t<
      kSplitColumns,
      decltype(cute::make_tiled_mma(SsMma<cute::Shape<BlockN, cute::Int<kCols / kConsumers>, BlockM>,
                                          cute::GMMA::Major::K, cute::GMMA::Major::MN>{},
                                    ColumnAtoms{})),
      decltype(cute::make_tiled_mma(RsMma<cute::Shape<BlockN, cute::Int<kCols>, BlockM>>{}, KeyRowsAtoms{}))>;
  using TiledMmaS = decltype(cute::make_tiled_mma(SsMma<cute::Shape<BlockN, ScoreAtomCols, HeadDim>>{}, ScoreAtoms{}));
  using TiledMmaDP = decltype(cute::make_tiled_mma(SsMma<cute::Shape<BlockN, ScoreAtomCols, HeadDimV>>{}, ScoreAtoms{}));
  using TiledMmaDV = DkvMma<kHeadDimV>;
  using TiledMmaDK = DkvMma<kHeadDim>;
  // dQ's rows split where the tile has a wgmma atom's 64 for each warpgroup: each reads its half
  // of dS from shared memory instead of all of it (K^T's bytes read are the same either way).
  static constexpr bool kDqSplitRows = kBlockM == 64 * kConsumers;
  using TiledMmaDQ = decltype(cute::make_tiled_mma(
      SsMma<cute::Shape<BlockM, cute::Int<kDqSplitRows ? kHeadDim : kHeadDim / kConsumers>, BlockN>,
            cute::GMMA::Major::MN, cute::GMMA::Major::MN>{},
      cute::conditional_t<kDqSplitRows, KeyRowsAtoms, ColumnAtoms>{}));

  // Q and dO rings, K and V: the wgmma K-major swizzled layouts, head dim contiguous as in global
  // memory. The transposed views read the same bytes with the head dim as N (MN-major B operands).
  // Splitting columns, each warpgroup's half of them must start on a swizzle atom: where the half
  // is not a multiple of 64 columns (d = 192), the 64-byte swizzle's atoms of 32.
  template <class Rows, class Cols>
  using KMajor = cute::conditional_t<
      kSplitColumns && (Cols::value / kConsumers) % 64 != 0,
      decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW64_Atom<Element>{}, cute::Shape<Rows, Cols>{})),
      decltype(cutlass::gemm::collective::detail::ss_smem_selector<cute::GMMA::Major::K, Element, Rows, Cols>())>;
  using SmemLayoutQ = decltype(cute::tile_to_shape(KMajor<BlockM, HeadDim>{}, cute::Shape<BlockM, HeadDim, Stages>{}));
  using SmemLayoutDO =
      decltype(cute::tile_to_shape(KMajor<BlockM, HeadDimV>{}, cute::Shape<BlockM, HeadDimV, Stages>{}));
  using SmemLayoutK = decltype(cute::tile_to_shape(KMajor<BlockN, HeadDim>{}, cute::Shape<BlockN, HeadDim>{}));
  using SmemLayoutV = decltype(cute::tile_to_shape(KMajor<BlockN, HeadDimV>{}, cute::Shape<BlockN, HeadDimV>{}));
  using SmemLayoutQt = decltype(cute::composition(
      SmemLayoutQ{}, cute::make_ordered_layout(cute::Shape<HeadDim, BlockM, Stages>{},
                                               cute::Step<cute::_2, cute::_1, cute::_3>{})));  // (d, kBlockM, stage)
  using SmemLayoutDOt = decltype(cute::composition(
      SmemLayoutDO{}, cute::make_ordered_layout(cute::Shape<HeadDimV, BlockM, Stages>{},
                                                cute::Step<cute::_2, cute::_1, cute::_3>{})));  // (dv, kBlockM, stage)
  using SmemLayoutKt = decltype(cute::composition(
      SmemLayoutK{}, cute::make_ordered_layout(cute::Shape<HeadDim, BlockN>{}, cute::Step<cute::_2, cute::_1>{})));
  // dS as the A operand of dQ = dS K: (kBlockM, kBlockN) with the query rows contiguous (MN-major),
  // so that the consumers store their dS^T fragments (key rows, query columns) untransposed, by
  // stmatrix. Steps take the kDsStages buffers in turn: a step writes its dS^T while the other
  // warpgroup's GEMMs of the step before may still read theirs.
  static constexpr int kDsStages = 2;
  using DsStages = cute::Int<kDsStages>;
  using SmemLayoutDS = decltype(cute::tile_to_shape(
      cutlass::gemm::collective::detail::ss_smem_selector<cute::GMMA::Major::MN, Element, BlockM, BlockN>(),
      cute::Shape<BlockM, BlockN, DsStages>{}));
  using SmemLayoutDSt = decltype(cute::composition(
      SmemLayoutDS{}, cute::make_ordered_layout(cute::Shape<BlockN, BlockM, DsStages>{},
                                                cute::Step<cute::_2, cute::_1, cute::_3>{})));  // (kBlockN, kBlockM, stage)

  // dQ of one query tile in the order of the consumers' fragments: each consumer warpgroup's
  // columns are one contiguous span of kDqSpanFloats, which it reduces into the accumulator on its
  // own; in it, value j of the chunk c of four of the warpgroup's thread t lies at
  // (c kThreadsPerWarpGroup + t) 4 + j, so that each chunk is one conflict-free 16-byte store per
  // thread. The workspace's accumulator keeps this order; the postprocess undoes it.
  static constexpr int kDqFragment = kBlockM * kHeadDim / kConsumerThreads;
  static_assert(kDqFragment % 4 == 0, "dQ fragments in chunks of four");
  static constexpr int kDqTileFloats = kBlockM * kHeadDim;
  static constexpr int kDqSpanFloats = kDqTileFloats / kConsumers;
  // The float4 index of chunk c of consumer thread `thread_idx` (in [0, kConsumerThreads)).
  static CUTLASS_DEVICE int dq_chunk(int c, int thread_idx) {
    return thread_idx / kThreadsPerWarpGroup * (kDqSpanFloats / 4) + c * kThreadsPerWarpGroup +
           thread_idx % kThreadsPerWarpGroup;
  }

  // TMA tiles are 128-byte swizzled: their buffers start on 1024-byte boundaries.
  struct SharedStorage {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>, 1024> k;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutV>, 1024> v;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutDO>, 1024> dout;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutDS>, 1024> ds;
    // P^T, laid out as dS (kSplitColumns; a placeholder otherwise)
    cute::array_aligned<Element, kSplitColumns ? cute::cosize_v<SmemLayoutDS> : 8, 1024> pt;
    cute::array_aligned<float, kDqTileFloats, 128> dq;
    cute::array_aligned<float, kStages * kBlockM, 16> lse_log2;  // per Q stage
    cute::array_aligned<float, kStages * kBlockM, 16> delta;     // per dO stage
    cutlass::arch::ClusterTransactionBarrier kv_full;
    typename cutlass::PipelineTmaAsync<kStages>::SharedStorage pipeline_q;
    typename cutlass::PipelineTmaAsync<kStages>::SharedStorage pipeline_do;
  };
  static constexpr int kSharedBytes = sizeof(SharedStorage);
  static_assert(kSharedBytes <= 227 * 1024, "backward tiles exceed the 227 KB of shared memory per CTA");

  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  using PipelineState = typename Pipeline::PipelineState;
  static constexpr std::uint32_t kRowValuesBytes = kBlockM * sizeof(float);
  static constexpr std::uint32_t kQStageBytes = kBlockM * kHeadDim * sizeof(Element) + kRowValuesBytes;
  static constexpr std::uint32_t kDOStageBytes = kBlockM * kHeadDimV * sizeof(Element) + kRowValuesBytes;
  static constexpr std::uint32_t kKVBytes = kBlockN * (kHeadDim + kHeadDimV) * sizeof(Element);

  // Named barriers of the consumers (ids offset past CUTLASS's reserved ones by NamedBarrier).
  static constexpr unsigned kDsReadyBarrier = 0;  // both warpgroups' dS^T are in shared memory
  // Between consumer warpgroup w and the writer warp, about w's span of the dQ buffer: + w.
  static constexpr unsigned kDqFullBarrier = 1;               // written, to be added
  static constexpr unsigned kDqEmptyBarrier = 1 + kConsumers;  // read by the last reduction
  static constexpr unsigned kDqHandoverThreads = kThreadsPerWarpGroup + 32;
  static constexpr int kDqWriterWarp = 1;  // of the producer warpgroup (warp 0 loads)

  template <class Dim>
  using GmemTensorOf = decltype(cute::make_tensor(cute::make_gmem_ptr(static_cast<Element const*>(nullptr)),
                                                  cute::Shape<int32_t, Dim, int32_t, int32_t>{},
                                                  cute::Stride<int64_t, cute::_1, int64_t, int64_t>{}));
  using TmaQ =
      decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, GmemTensorOf<HeadDim>{}, cute::take<0, 2>(SmemLayoutQ{}),
                                   cute::Shape<BlockM, HeadDim>{}, cute::_1{}));
  using TmaDO =
      decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, GmemTensorOf<HeadDimV>{}, cute::take<0, 2>(SmemLayoutDO{}),
                                   cute::Shape<BlockM, HeadDimV>{}, cute::_1{}));
  using TmaK = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, GmemTensorOf<HeadDim>{}, SmemLayoutK{},
                                            cute::Shape<BlockN, HeadDim>{}, cute::_1{}));
  using TmaV = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, GmemTensorOf<HeadDimV>{}, SmemLayoutV{},
                                            cute::Shape<BlockN, HeadDimV>{}, cute::_1{}));

  // One sequence of the batch: its first rows in the packed tensors (0 in a fixed-length batch,
  // whose TMA coordinate batch_coord names the batch entry instead), its lengths, and its first
  // query block in the workspace (BackwardWorkspace).
  struct Sequence {
    int q_begin, k_begin;
    int seqlen_q, seqlen_k;
    int batch_coord;
    int64_t first_block;
  };

  // Where the batch's sequences lie, for the three kernels.
  struct Batch {
    VarlenSequences sequences;  // cu_seqlens_q null in a fixed-length batch
    int seqlen_q, seqlen_k;     // the fixed-length batch's lengths, or the bounds
    int nheads;
    int m_blocks;               // query blocks of seqlen_q
    int64_t blocks_per_head;    // of the workspace

    static Batch of(BackwardParams const& p) {
      VarlenSequences sequences{p.cu_seqlens_q, p.cu_seqlens_k, p.seqused_q, p.seqused_k, nullptr,
                                p.total_q,      p.total_k,      p.seqlen_q,  p.seqlen_k};
      BackwardWorkspace const workspace = BackwardWorkspace::plan(
          p.batch, p.nheads, p.seqlen_q, p.cu_seqlens_q != nullptr ? p.total_q : -1, p.head_dim, false, kBlockM);
      return {sequences, p.seqlen_q, p.seqlen_k, p.nheads, (p.seqlen_q + kBlockM - 1) / kBlockM,
              workspace.blocks_per_head};
    }
    CUTLASS_DEVICE Sequence sequence(int b) const {
      if (sequences.cu_seqlens_q == nullptr) return {0, 0, seqlen_q, seqlen_k, b, int64_t{b} * m_blocks};
      SequenceSpan const s = sequences.span(b);
      return {s.q_begin, s.k_begin, s.seqlen_q, s.seqlen_k, 0, (int64_t{s.q_begin} + int64_t{b} * kBlockM) / kBlockM};
    }
    // The workspace's query block m_block of `head` in sequence s.
    CUTLASS_DEVICE int64_t row_block(Sequence const& s, int head, int m_block) const {
      return head * blocks_per_head + s.first_block + m_block;
    }
    // Its semaphore (`deterministic`): one per (batch, head, query block of seqlen_q).
    CUTLASS_DEVICE int64_t semaphore(int b, int head, int m_block) const {
      return (int64_t{b} * nheads + head) * m_blocks + m_block;
    }
  };

  struct Params {
    TmaQ tma_q;
    TmaDO tma_do;
    TmaK tma_k;
    TmaV tma_v;
    Mask mask;  // of seqlen_q and seqlen_k; a sequence's takes its own lengths
    Batch rows;
    int q_rows, k_rows, tma_batch;  // the TMA tensors' extents
    int nheads_kv;
    BackwardOrder order;  // of the CTAs (work_of)
    float const* lse_log2;  // (nheads, blocks_per_head * kBlockM)
    float const* delta;
    float* dq_accum;    // (nheads, blocks_per_head, kDqTileFloats)
    int* dq_semaphore;  // (batch, nheads, m_blocks) with `deterministic`, else null
    Element* dk;
    int64_t dk_batch_stride, dk_row_stride, dk_head_stride;
    Element* dv;
    int64_t dv_batch_stride, dv_row_stride, dv_head_stride;
    float softmax_scale;
    float softcap_prescale;  // softmax_scale / softcap
    float score_scale_log2;  // (softcap, or softmax_scale) * log2(e): a kept score's exponent in log2 units
  };

  static Mask make_mask(BackwardParams const& p) {
    if constexpr (Mask::kIsLocal) {
      return {p.seqlen_q, p.seqlen_k, p.window_left, p.window_right};
    } else {
      return {p.seqlen_q, p.seqlen_k};
    }
  }

  static Params to_params(BackwardParams const& p) {
    using namespace cute;
    // A variable-length batch's tensors are one batch entry of all their rows.
    bool const varlen = p.cu_seqlens_q != nullptr;
    int const tma_batch = varlen ? 1 : p.batch;
    int const queries = varlen ? p.total_q : p.seqlen_q;
    // TMA descriptors need non-empty extents: without query rows the walk is empty (no Q or dO is
    // loaded), and Q and dO borrow K's address and a length of one.
    bool const no_queries = queries == 0;
    auto gmem = [&](void const* ptr, auto dim, int seqlen, int heads, int64_t row, int64_t head, int64_t batch) {
      return make_tensor(make_gmem_ptr(static_cast<Element const*>(ptr)), make_shape(seqlen, dim, heads, tma_batch),
                         make_stride(row, _1{}, head, batch));
    };
    int const q_rows = no_queries ? 1 : queries;
    int const k_rows = varlen ? p.total_k : p.seqlen_k;
    auto mQ =
        gmem(no_queries ? p.k : p.q, HeadDim{}, q_rows, p.nheads, p.q_row_stride, p.q_head_stride, p.q_batch_stride);
    auto mDO = gmem(no_queries ? p.v : p.dout, HeadDimV{}, q_rows, p.nheads, p.do_row_stride, p.do_head_stride,
                    p.do_batch_stride);
    auto mK = gmem(p.k, HeadDim{}, k_rows, p.nheads_kv, p.k_row_stride, p.k_head_stride, p.k_batch_stride);
    auto mV = gmem(p.v, HeadDimV{}, k_rows, p.nheads_kv, p.v_row_stride, p.v_head_stride, p.v_batch_stride);
    float constexpr kLog2e = 1.4426950408889634f;
    bool const softcap = p.softcap > 0.f;
    return {make_tma_copy(SM90_TMA_LOAD{}, mQ, take<0, 2>(SmemLayoutQ{}), Shape<BlockM, HeadDim>{}, _1{}),
            make_tma_copy(SM90_TMA_LOAD{}, mDO, take<0, 2>(SmemLayoutDO{}), Shape<BlockM, HeadDimV>{}, _1{}),
            make_tma_copy(SM90_TMA_LOAD{}, mK, SmemLayoutK{}, Shape<BlockN, HeadDim>{}, _1{}),
            make_tma_copy(SM90_TMA_LOAD{}, mV, SmemLayoutV{}, Shape<BlockN, HeadDimV>{}, _1{}),
            make_mask(p),
            Batch::of(p),
            q_rows,
            k_rows,
            tma_batch,
            p.nheads_kv,
            BackwardOrder{(p.seqlen_k + kBlockN - 1) / kBlockN, p.batch * p.nheads_kv, section_of(p)},
            p.lse_log2,
            p.delta,
            p.dq_accum,
            p.deterministic ? p.dq_semaphore : nullptr,
            static_cast<Element*>(p.dk),
            p.dk_batch_stride,
            p.dk_row_stride,
            p.dk_head_stride,
            static_cast<Element*>(p.dv),
            p.dv_batch_stride,
            p.dv_row_stride,
            p.dv_head_stride,
            p.softmax_scale,
            softcap ? p.softmax_scale / p.softcap : 0.f,
            (softcap ? p.softcap : p.softmax_scale) * kLog2e};
  }

  // The (batch entry, KV head) pairs whose CTAs interleave (BackwardOrder), as many as keep their
  // query heads' Q, dO and dQ accumulator within kL2Bytes. Only where walks differ in length (a
  // causal key tile sees every query tile after it), and from kLptMinKeys keys on: one pair
  // otherwise, whose key tiles then share every load from L2 (on short walks the sections' spread
  // loads cost more than the order gains, D162).
  static constexpr int64_t kL2Bytes = int64_t{40} << 20;
  static constexpr int kLptMinKeys = 2048;
  static int section_of(BackwardParams const& p) {
    if constexpr (!Mask::kIsLocal) return 1;
    if (p.seqlen_k < kLptMinKeys) return 1;
    int64_t const pair_bytes = int64_t{p.nheads / p.nheads_kv} * p.seqlen_q *
                               ((kHeadDim + kHeadDimV) * int64_t{sizeof(Element)} + kHeadDim * int64_t{sizeof(float)});
    return BackwardOrder::section_for(pair_bytes, p.batch * p.nheads_kv, kL2Bytes);
  }

  // The CTA's key tile, KV head and batch entry.
  struct Work {
    int n_block, head_kv, batch;
  };
  static CUTLASS_DEVICE Work work_of(Params const& params) {
    BackwardOrder::Slot const slot = params.order(blockIdx.x);
    return {slot.n_block, slot.pair % params.nheads_kv, slot.pair / params.nheads_kv};
  }

  // The query tiles that key tile n_block visits (a mask's query_blocks on its real keys).
  static CUTLASS_DEVICE QueryBlocks query_blocks(Mask const& mask, int n_block) {
    int const first_key = n_block * kBlockN;
    int const last_key = cute::min(first_key + kBlockN, mask.seqlen_k) - 1;
    return mask.template query_blocks<kBlockM>(first_key, last_key);
  }

  // Producer, one thread: K and V once, then per step the query tile's Q with its LSE and dO with its D.
  static CUTLASS_DEVICE void load(Params const& params, SharedStorage& shared, Pipeline& pipeline_q,
                                  Pipeline& pipeline_do, Work const& work, Sequence const& seq,
                                  QueryBlocks const& blocks, int steps) {
    using namespace cute;
    cute::prefetch_tma_descriptor(params.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_do.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_v.get_tma_descriptor());
    Tensor sQ = make_tensor(make_smem_ptr(shared.q.data()), SmemLayoutQ{});
    Tensor sDO = make_tensor(make_smem_ptr(shared.dout.data()), SmemLayoutDO{});
    Tensor sK = make_tensor(make_smem_ptr(shared.k.data()), SmemLayoutK{});
    Tensor sV = make_tensor(make_smem_ptr(shared.v.data()), SmemLayoutV{});
    int const nheads = params.rows.nheads;
    Tensor mQ = params.tma_q.get_tma_tensor(make_shape(params.q_rows, HeadDim{}, nheads, params.tma_batch));
    Tensor mDO = params.tma_do.get_tma_tensor(make_shape(params.q_rows, HeadDimV{}, nheads, params.tma_batch));
    Tensor mK = params.tma_k.get_tma_tensor(make_shape(params.k_rows, HeadDim{}, params.nheads_kv, params.tma_batch));
    Tensor mV = params.tma_v.get_tma_tensor(make_shape(params.k_rows, HeadDimV{}, params.nheads_kv, params.tma_batch));
    // The sequence's rows of a head (from its first row in a variable-length batch).
    auto rows_of = [&](auto const& tensor, int head, int first_row) {
      return domain_offset(make_coord(first_row, _0{}), tensor(_, _, head, seq.batch_coord));
    };
    auto tma_q = params.tma_q.get_slice(_0{});
    auto tma_do = params.tma_do.get_slice(_0{});
    auto tma_k = params.tma_k.get_slice(_0{});
    auto tma_v = params.tma_v.get_slice(_0{});

    Tensor gK = local_tile(rows_of(mK, work.head_kv, seq.k_begin), Shape<BlockN, HeadDim>{},
                           make_coord(work.n_block, _0{}));
    Tensor gV = local_tile(rows_of(mV, work.head_kv, seq.k_begin), Shape<BlockN, HeadDimV>{},
                           make_coord(work.n_block, _0{}));
    using BarrierType = cutlass::arch::ClusterTransactionBarrier::ValueType;
    shared.kv_full.arrive_and_expect_tx(kKVBytes);
    copy(params.tma_k.with(reinterpret_cast<BarrierType&>(shared.kv_full)), tma_k.partition_S(gK),
         tma_k.partition_D(sK));
    copy(params.tma_v.with(reinterpret_cast<BarrierType&>(shared.kv_full)), tma_v.partition_S(gV),
         tma_v.partition_D(sV));

    int const group = nheads / params.nheads_kv;
    int const m_count = blocks.end - blocks.begin;
    PipelineState write = cutlass::make_producer_start_state<Pipeline>();
    CUTLASS_PRAGMA_NO_UNROLL
    for (int step = 0; step < steps; ++step) {
      int const head = work.head_kv * group + step / m_count;
      int const m_block = blocks.begin + step % m_count;
      int64_t const row_values = params.rows.row_block(seq, head, m_block) * kBlockM;
      Tensor gQ = local_tile(rows_of(mQ, head, seq.q_begin), Shape<BlockM, HeadDim>{}, make_coord(m_block, _0{}));
      Tensor gDO =
          local_tile(rows_of(mDO, head, seq.q_begin), Shape<BlockM, HeadDimV>{}, make_coord(m_block, _0{}));

      pipeline_q.producer_acquire(write);
      BarrierType* q_barrier = pipeline_q.producer_get_barrier(write);
      copy(params.tma_q.with(*q_barrier), tma_q.partition_S(gQ), tma_q.partition_D(sQ)(_, _, _, write.index()));
      SM90_BULK_COPY_G2S::copy(params.lse_log2 + row_values, q_barrier,
                               shared.lse_log2.data() + write.index() * kBlockM, kRowValuesBytes);
      pipeline_do.producer_acquire(write);
      BarrierType* do_barrier = pipeline_do.producer_get_barrier(write);
      copy(params.tma_do.with(*do_barrier), tma_do.partition_S(gDO), tma_do.partition_D(sDO)(_, _, _, write.index()));
      SM90_BULK_COPY_G2S::copy(params.delta + row_values, do_barrier, shared.delta.data() + write.index() * kBlockM,
                               kRowValuesBytes);
      ++write;
    }
  }

  // Writer warp: per step, each consumer warpgroup's span of dQ from the buffer into the
  // accumulator in global memory by one bulk reduction, issued by one lane; with `deterministic`,
  // the query tile's turn awaited first (every lower key tile that visits it has added its spans:
  // each adds 1 to the semaphore once they are complete). The span goes back to its warpgroup once
  // the reduction has read it.
  static CUTLASS_DEVICE void write_dq(Params const& params, SharedStorage& shared, Work const& work,
                                      Sequence const& seq, Mask const& mask, QueryBlocks const& blocks, int steps) {
    bool const issuer = cute::elect_one_sync();
    int const group = params.rows.nheads / params.nheads_kv;
    int const m_count = blocks.end - blocks.begin;
    CUTLASS_PRAGMA_NO_UNROLL
    for (int step = 0; step < steps; ++step) {
      int const head = work.head_kv * group + step / m_count;
      int const m_block = blocks.begin + step % m_count;
      float* accum = params.dq_accum + params.rows.row_block(seq, head, m_block) * kDqTileFloats;
      int* semaphore = params.dq_semaphore != nullptr
                           ? params.dq_semaphore + params.rows.semaphore(work.batch, head, m_block)
                           : nullptr;
      if (semaphore != nullptr && issuer) {
        int const last_query = cute::min(m_block * kBlockM + kBlockM, seq.seqlen_q) - 1;
        int const turn = work.n_block - mask.template key_blocks<kBlockN>(m_block * kBlockM, last_query).begin;
        while (load_acquire(semaphore) < turn) {
        }
      }
      CUTLASS_PRAGMA_UNROLL
      for (int w = 0; w < kConsumers; ++w) {
        cutlass::arch::NamedBarrier::sync(kDqHandoverThreads, kDqFullBarrier + w);
        if (issuer) {
          bulk_reduce_add(accum + w * kDqSpanFloats, shared.dq.data() + w * kDqSpanFloats,
                          kDqSpanFloats * sizeof(float));
          cute::tma_store_arrive();
        }
      }
      if (semaphore != nullptr && issuer) {
        bulk_wait_complete();
        __threadfence();
        atomicAdd(semaphore, 1);
      }
      if (step + 1 < steps) {  // the consumers await the spans' return before their next step only
        static_assert(kConsumers == 2, "spans returned in issue order");
        if (issuer) cute::tma_store_wait<1>();
        __syncwarp();
        cutlass::arch::NamedBarrier::arrive(kDqHandoverThreads, kDqEmptyBarrier);
        if (issuer) cute::tma_store_wait<0>();
        __syncwarp();
        cutlass::arch::NamedBarrier::arrive(kDqHandoverThreads, kDqEmptyBarrier + 1);
      }
    }
    if (issuer) cute::tma_store_wait<0>();  // the last reductions have read the buffer before the CTA exits
  }

  // Consumers: thread_idx in [0, kConsumerThreads), consumer the warpgroup (0 or 1).
  static CUTLASS_DEVICE void compute(Params const& params, SharedStorage& shared, Pipeline& pipeline_q,
                                     Pipeline& pipeline_do, Work const& work, Sequence const& seq, Mask const& mask,
                                     QueryBlocks const& blocks, int steps, int thread_idx, int consumer) {
    using namespace cute;
    Tensor sQ = make_tensor(make_smem_ptr(shared.q.data()), SmemLayoutQ{});
    Tensor sQt = make_tensor(make_smem_ptr(shared.q.data()), SmemLayoutQt{});
    Tensor sDO = make_tensor(make_smem_ptr(shared.dout.data()), SmemLayoutDO{});
    Tensor sDOt = make_tensor(make_smem_ptr(shared.dout.data()), SmemLayoutDOt{});
    Tensor sK = make_tensor(make_smem_ptr(shared.k.data()), SmemLayoutK{});
    Tensor sKt = make_tensor(make_smem_ptr(shared.k.data()), SmemLayoutKt{});
    Tensor sV = make_tensor(make_smem_ptr(shared.v.data()), SmemLayoutV{});
    Tensor sDS = make_tensor(make_smem_ptr(shared.ds.data()), SmemLayoutDS{});
    Tensor sDSt = make_tensor(make_smem_ptr(shared.ds.data()), SmemLayoutDSt{});
    Tensor sPt = make_tensor(make_smem_ptr(shared.pt.data()), SmemLayoutDSt{});

    TiledMmaS mma_s;
    TiledMmaDP mma_dp;
    TiledMmaDV mma_dv;
    TiledMmaDK mma_dk;
    TiledMmaDQ mma_dq;
    // Shared-memory descriptors from the warpgroup's slice (warp-uniform), as in the forward.
    int const warpgroup_thread = consumer * kThreadsPerWarpGroup;
    Tensor tSrK = mma_s.get_slice(warpgroup_thread).partition_fragment_A(sK);  // (MMA, MMA_M, MMA_K)
    Tensor tSrQ = mma_s.get_slice(warpgroup_thread).partition_fragment_B(sQ);  // (MMA, MMA_N, MMA_K, stage)
    Tensor tDPrV = mma_dp.get_slice(warpgroup_thread).partition_fragment_A(sV);
    Tensor tDPrDO = mma_dp.get_slice(warpgroup_thread).partition_fragment_B(sDO);  // (..., stage)
    Tensor tDVrDOt = mma_dv.get_slice(warpgroup_thread).partition_fragment_B(sDOt);
    Tensor tDKrQt = mma_dk.get_slice(warpgroup_thread).partition_fragment_B(sQt);
    // P^T and dS^T as the A operands of dV and dK (kSplitColumns only)
    Tensor tDVrPt = mma_dv.get_slice(warpgroup_thread).partition_fragment_A(sPt);    // (..., ds stage)
    Tensor tDKrDSt = mma_dk.get_slice(warpgroup_thread).partition_fragment_A(sDSt);  // (..., ds stage)
    Tensor tDQrDS = mma_dq.get_slice(warpgroup_thread).partition_fragment_A(sDS);    // (..., ds stage)
    Tensor tDQrKt = mma_dq.get_slice(warpgroup_thread).partition_fragment_B(sKt);

    auto thr_s = mma_s.get_thread_slice(thread_idx);
    // (key row, query column) within the tile of each of this thread's S^T elements.
    Tensor coords = thr_s.partition_C(make_identity_tensor(Shape<BlockN, BlockM>{}));
    // dS^T's and P^T's fragments into their buffers by stmatrix: 16-byte rows of 8 query columns.
    auto store_scores = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_s);
    auto thr_store_scores = store_scores.get_thread_slice(thread_idx);
    Tensor tSsDSt = thr_store_scores.partition_D(sDSt);  // (CPY, CPY_N, CPY_M, ds stage)
    Tensor tSsPt = thr_store_scores.partition_D(sPt);

    Tensor dv_accum = partition_fragment_C(mma_dv, Shape<BlockN, HeadDimV>{});
    Tensor dk_accum = partition_fragment_C(mma_dk, Shape<BlockN, HeadDim>{});
    clear(dv_accum);
    clear(dk_accum);

    int const m_count = blocks.end - blocks.begin;
    int const first_key = work.n_block * kBlockN;
    if (steps > 0) shared.kv_full.wait(0);
    PipelineState read;
    CUTLASS_PRAGMA_NO_UNROLL
    for (int step = 0; step < steps; ++step) {
      int const m_block = blocks.begin + step % m_count;  // of query head head_kv * group + step / m_count
      int const stage = read.index();

      Tensor s_accum = partition_fragment_C(mma_s, Shape<BlockN, BlockM>{});
      Tensor dp_accum = partition_fragment_C(mma_dp, Shape<BlockN, BlockM>{});
      pipeline_q.consumer_wait(read);
      warpgroup_gemm<true, -1>(mma_s, tSrK, tSrQ(_, _, _, stage), s_accum);
      pipeline_do.consumer_wait(read);
      warpgroup_gemm<true, -1>(mma_dp, tDPrV, tDPrDO(_, _, _, stage), dp_accum);

      // P^T = exp2(kept score * score_scale_log2 - LSE_log2); 0 where masked, at keys past
      // seqlen_k (their zero-filled K would give exp2(-LSE_log2), which can overflow), and in query
      // rows past seqlen_q or that see no key (LSE_log2 = +inf there). Only tiles that some query
      // does not wholly see need the per-element mask.
      warpgroup_wait<1>();
      float const* lse_log2 = shared.lse_log2.data() + stage * kBlockM;
      bool const whole_tile = first_key + kBlockN <= seq.seqlen_k &&
                              mask.sees_whole_tile(m_block * kBlockM, kBlockM, first_key, kBlockN);
      Tensor dtanh = make_fragment_like(s_accum);  // 1 - t^2, with soft-capping
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(s_accum); ++i) {
        int const col = get<1>(coords(i));
        float kept = s_accum(i);
        if constexpr (kSoftcap) {
          kept = fast_tanh(kept * params.softcap_prescale);
          dtanh(i) = 1.f - kept * kept;
        }
        s_accum(i) = fast_exp2(fmaf(kept, params.score_scale_log2, -lse_log2[col]));
      }
      if (!whole_tile) {
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(s_accum); ++i) {
          RowKeys const keys = mask.row_keys(m_block * kBlockM + get<1>(coords(i)));
          int const key = first_key + get<0>(coords(i));
          if (key < keys.begin || key >= keys.end) s_accum(i) = 0.f;
        }
      }
      // dS^T = P^T (dP^T - D) (1 - t^2), without softmax_scale.
      warpgroup_wait<0>();
      float const* delta = shared.delta.data() + stage * kBlockM;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(dp_accum); ++i) {
        float ds = s_accum(i) * (dp_accum(i) - delta[get<1>(coords(i))]);
        if constexpr (kSoftcap) ds *= dtanh(i);
        dp_accum(i) = ds;
      }
      Tensor p_regs = make_tensor<Element>(accumulator_as_a_operand(s_accum.layout()));
      convert_fragment_into(s_accum, p_regs);
      Tensor ds_regs = make_tensor<Element>(accumulator_as_a_operand(dp_accum.layout()));
      convert_fragment_into(dp_accum, ds_regs);
      if constexpr (!kSplitColumns) warpgroup_gemm<false, -1>(mma_dv, p_regs, tDVrDOt(_, _, _, stage), dv_accum);

      // dS^T (and P^T) into this step's buffers: both warpgroups' GEMMs of two steps ago, the last
      // to read them, were complete when they passed the last step's kDsReadyBarrier.
      int const ds_stage = step % kDsStages;
      if constexpr (kSplitColumns) {  // the same registers, C's layout
        copy(store_scores, thr_store_scores.retile_S(make_tensor(p_regs.data(), s_accum.layout())),
             tSsPt(_, _, _, ds_stage));
      }
      copy(store_scores, thr_store_scores.retile_S(make_tensor(ds_regs.data(), dp_accum.layout())),
           tSsDSt(_, _, _, ds_stage));
      cutlass::arch::fence_view_async_shared();  // generic-proxy writes, read by wgmma
      cutlass::arch::NamedBarrier::sync(kConsumerThreads, kDsReadyBarrier);

      Tensor dq = partition_fragment_C(mma_dq, Shape<BlockM, HeadDim>{});
      if constexpr (kSplitColumns) {
        // dV's and dK's GEMMs first: the stage goes back to the producer as soon as they have read
        // its dO and Q (d = 256 has one), so that dQ's trip to the accumulator overlaps the next load.
        warpgroup_gemm<false, -1>(mma_dv, tDVrPt(_, _, _, ds_stage), tDVrDOt(_, _, _, stage), dv_accum);
        warpgroup_gemm<false, -1>(mma_dk, tDKrDSt(_, _, _, ds_stage), tDKrQt(_, _, _, stage), dk_accum);
        warpgroup_gemm<true, -1>(mma_dq, tDQrDS(_, _, _, ds_stage), tDQrKt, dq);
        warpgroup_wait<1>();
        pipeline_q.consumer_release(read);
        pipeline_do.consumer_release(read);
        warpgroup_wait<0>();
      } else {
        // dQ's GEMM before dK's, so that its span goes into the accumulator while dK's runs.
        warpgroup_gemm<true, -1>(mma_dq, tDQrDS(_, _, _, ds_stage), tDQrKt, dq);
        warpgroup_gemm<false, -1>(mma_dk, ds_regs, tDKrQt(_, _, _, stage), dk_accum);
        warpgroup_wait<1>();  // dV's GEMM (issued first) and dQ's
        pipeline_do.consumer_release(read);  // the stage's dO is read: its next load may start
      }
      warpgroup_fence_operand(dq);

      // The warpgroup's span of dQ into its buffer, once the writer warp's last reduction has read
      // it (nothing to wait for at the first step), then handed to the writer warp.
      if (step > 0) cutlass::arch::NamedBarrier::sync(kDqHandoverThreads, kDqEmptyBarrier + consumer);
      float4* dq_chunks = reinterpret_cast<float4*>(shared.dq.data());
      CUTLASS_PRAGMA_UNROLL
      for (int c = 0; c < kDqFragment / 4; ++c) {
        dq_chunks[dq_chunk(c, thread_idx)] = make_float4(dq(4 * c), dq(4 * c + 1), dq(4 * c + 2), dq(4 * c + 3));
      }
      cutlass::arch::fence_view_async_shared();  // generic-proxy writes, read by the bulk reduction
      cutlass::arch::NamedBarrier::arrive(kDqHandoverThreads, kDqFullBarrier + consumer);
      if constexpr (!kSplitColumns) {
        warpgroup_wait<0>();  // dK's GEMM has read this stage's Q
        pipeline_q.consumer_release(read);
      }
      ++read;
    }

    store_rows<kHeadDim>(dk_accum, mma_dk, params.dk, params.dk_batch_stride, params.dk_row_stride,
                         params.dk_head_stride, params.softmax_scale, work, seq, thread_idx);
    store_rows<kHeadDimV>(dv_accum, mma_dv, params.dv, params.dv_batch_stride, params.dv_row_stride,
                          params.dv_head_stride, 1.f, work, seq, thread_idx);
  }

  // dK or dV (kCols columns, scaled by `scale`) from the accumulator into global memory, the key
  // rows below the sequence's seqlen_k, two adjacent columns per store.
  template <int kCols, class Accum, class TiledMma>
  static CUTLASS_DEVICE void store_rows(Accum const& accum, TiledMma const& mma, Element* out, int64_t batch_stride,
                                        int64_t row_stride, int64_t head_stride, float scale, Work const& work,
                                        Sequence const& seq, int thread_idx) {
    using namespace cute;
    Tensor coords = mma.get_thread_slice(thread_idx).partition_C(make_identity_tensor(Shape<BlockN, Int<kCols>>{}));
    Element* base = out + work.batch * batch_stride + work.head_kv * head_stride + seq.k_begin * row_stride;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size(accum); i += 2) {
      int const row = work.n_block * kBlockN + get<0>(coords(i));
      if (row < seq.seqlen_k) {
        store_pair(base + row * row_stride + get<1>(coords(i)), accum(i) * scale, accum(i + 1) * scale);
      }
    }
  }

  CUTLASS_DEVICE void operator()(Params const& params, unsigned char* smem_buf) const {
    using namespace cute;
    SharedStorage& shared = *reinterpret_cast<SharedStorage*>(smem_buf);
    int const warp_group = cutlass::canonical_warp_group_idx();  // 0: producer, 1 ..: consumers
    Work const work = work_of(params);
    Sequence const seq = params.rows.sequence(work.batch);
    if (work.n_block * kBlockN >= seq.seqlen_k) return;  // past a shorter sequence's keys
    Mask mask = params.mask;
    mask.seqlen_q = seq.seqlen_q;
    mask.seqlen_k = seq.seqlen_k;
    QueryBlocks const blocks = query_blocks(mask, work.n_block);
    int const steps = blocks.empty() ? 0 : (params.rows.nheads / params.nheads_kv) * (blocks.end - blocks.begin);

    if (threadIdx.x == 0) shared.kv_full.init(1);
    auto const pipeline_params = [&](std::uint32_t stage_bytes) {
      typename Pipeline::Params ring;
      ring.transaction_bytes = stage_bytes;
      ring.role = warp_group == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
      ring.is_leader = threadIdx.x == 0;
      ring.num_consumers = kConsumerThreads;
      return ring;
    };
    Pipeline pipeline_q(shared.pipeline_q, pipeline_params(kQStageBytes), Shape<_1, _1, _1>{});
    Pipeline pipeline_do(shared.pipeline_do, pipeline_params(kDOStageBytes), Shape<_1, _1, _1>{});
    __syncthreads();  // every barrier is initialised before any thread waits on or arrives at one

    if (warp_group == 0) {
      cutlass::arch::warpgroup_reg_dealloc<Roles::kProducerRegisters>();
      int const warp = cutlass::canonical_warp_idx_sync() % 4;
      if (threadIdx.x == 0 && steps > 0) load(params, shared, pipeline_q, pipeline_do, work, seq, blocks, steps);
      if (warp == kDqWriterWarp && steps > 0) write_dq(params, shared, work, seq, mask, blocks, steps);
    } else {
      cutlass::arch::warpgroup_reg_alloc<Roles::kConsumerRegisters>();
      compute(params, shared, pipeline_q, pipeline_do, work, seq, mask, blocks, steps,
              threadIdx.x - kThreadsPerWarpGroup, warp_group - 1);
    }
  }

  // ---- preprocess and postprocess: one CTA of kConsumerThreads threads per query tile of a head ----

  struct RowParams {
    Element const* o;
    Element const* dout;
    float const* lse;
    Element* dq;
    int64_t o_batch_stride, o_row_stride, o_head_stride;
    int64_t do_batch_stride, do_row_stride, do_head_stride;
    int64_t lse_batch_stride, lse_head_stride, lse_row_stride;
    int64_t dq_batch_stride, dq_row_stride, dq_head_stride;
    Batch rows;
    float softmax_scale;
    float* lse_log2;
    float* delta;
    float* dq_accum;
  };

  static RowParams to_row_params(BackwardParams const& p) {
    return {static_cast<Element const*>(p.o),
            static_cast<Element const*>(p.dout),
            p.lse,
            static_cast<Element*>(p.dq),
            p.o_batch_stride,
            p.o_row_stride,
            p.o_head_stride,
            p.do_batch_stride,
            p.do_row_stride,
            p.do_head_stride,
            p.lse_batch_stride,
            p.lse_head_stride,
            p.lse_row_stride,
            p.dq_batch_stride,
            p.dq_row_stride,
            p.dq_head_stride,
            Batch::of(p),
            p.softmax_scale,
            p.lse_log2,
            p.delta,
            p.dq_accum};
  }

  // The query tile of a row-block CTA (query tiles fastest), its sequence, and whether the tile
  // holds rows of it (a variable-length batch's shorter sequences have fewer).
  struct RowBlock {
    int m_block, head, batch;
    Sequence seq;
    CUTLASS_DEVICE bool empty() const { return m_block * kBlockM >= seq.seqlen_q; }
  };
  static CUTLASS_DEVICE RowBlock row_block_of(RowParams const& params) {
    int const index = blockIdx.x;
    int const m_blocks = params.rows.m_blocks, nheads = params.rows.nheads;
    int const batch = index / m_blocks / nheads;
    return {index % m_blocks, index / m_blocks % nheads, batch, params.rows.sequence(batch)};
  }

  // D = rowsum(dO * O) and LSE * log2(e) of the tile's rows (rows past the sequence's queries get
  // D = 0 and +inf, as do rows that see no key); the tile's dQ accumulator cleared. The rows go in
  // passes of kRowsPerPass, kThreadsPerRow threads a row (a power of two, so that a row's threads
  // are adjacent lanes of one warp), each loading kVectorsPerThread 16-byte pieces of O and of dO
  // (their rows are 16-byte aligned: validate.cpp); every load is issued before the first sum.
  static CUTLASS_DEVICE void preprocess(RowParams const& params) {
    constexpr int kVec = 16 / sizeof(Element);
    constexpr int kVectorsPerRow = kHeadDimV / kVec;
    constexpr int kThreadsPerRow = cute::min(32, kVectorsPerRow & -kVectorsPerRow);
    constexpr int kVectorsPerThread = kVectorsPerRow / kThreadsPerRow;
    constexpr int kRowsPerPass = kConsumerThreads / kThreadsPerRow;
    static_assert(kHeadDimV % kVec == 0 && kBlockM % kRowsPerPass == 0, "whole rows, whole passes");
    constexpr int kPasses = kBlockM / kRowsPerPass;
    using Vector = cutlass::AlignedArray<Element, kVec>;
    RowBlock const at = row_block_of(params);
    if (at.empty()) return;
    int64_t const block = params.rows.row_block(at.seq, at.head, at.m_block);
    float4* accum = reinterpret_cast<float4*>(params.dq_accum + block * kDqTileFloats);
    for (int i = threadIdx.x; i < kDqTileFloats / 4; i += kConsumerThreads) accum[i] = make_float4(0.f, 0.f, 0.f, 0.f);

    Element const* o = params.o + at.batch * params.o_batch_stride + at.head * params.o_head_stride;
    Element const* dout = params.dout + at.batch * params.do_batch_stride + at.head * params.do_head_stride;
    float const* lse = params.lse + at.batch * params.lse_batch_stride + at.head * params.lse_head_stride;
    float const kInf = cutlass::platform::numeric_limits<float>::infinity();
    int const lane_in_row = threadIdx.x % kThreadsPerRow;
    int const tile_row = threadIdx.x / kThreadsPerRow;  // in the first pass
    Vector o_pieces[kPasses][kVectorsPerThread], do_pieces[kPasses][kVectorsPerThread];
    float row_lse[kPasses];
    CUTLASS_PRAGMA_UNROLL
    for (int pass = 0; pass < kPasses; ++pass) {
      int const row = at.m_block * kBlockM + tile_row + pass * kRowsPerPass;
      int64_t const packed_row = at.seq.q_begin + row;
      row_lse[pass] = row < at.seq.seqlen_q ? lse[packed_row * params.lse_row_stride] : -kInf;
      CUTLASS_PRAGMA_UNROLL
      for (int v = 0; v < kVectorsPerThread; ++v) {
        int const col = (v * kThreadsPerRow + lane_in_row) * kVec;
        if (row < at.seq.seqlen_q) {
          o_pieces[pass][v] = *reinterpret_cast<Vector const*>(o + packed_row * params.o_row_stride + col);
          do_pieces[pass][v] = *reinterpret_cast<Vector const*>(dout + packed_row * params.do_row_stride + col);
        } else {
          o_pieces[pass][v].fill(Element(0));
          do_pieces[pass][v].fill(Element(0));
        }
      }
    }
    CUTLASS_PRAGMA_UNROLL
    for (int pass = 0; pass < kPasses; ++pass) {
      float sum = 0.f;
      CUTLASS_PRAGMA_UNROLL
      for (int v = 0; v < kVectorsPerThread; ++v) {
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < kVec; ++j) sum += float(o_pieces[pass][v][j]) * float(do_pieces[pass][v][j]);
      }
      CUTLASS_PRAGMA_UNROLL
      for (int offset = kThreadsPerRow / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffff, sum, offset);
      if (lane_in_row == 0) {
        int64_t const at_row = block * kBlockM + tile_row + pass * kRowsPerPass;
        params.delta[at_row] = sum;
        // +inf where no key is seen (LSE = -inf) or past the sequence: P = 0 there
        params.lse_log2[at_row] = row_lse[pass] == -kInf ? kInf : row_lse[pass] * 1.4426950408889634f;
      }
    }
  }

  // dQ = softmax_scale * accumulator of the tile's rows below the sequence's seqlen_q. Thread t
  // reads the values that consumer thread t added (TiledMmaDQ's fragment) and puts them, converted,
  // into the tile's rows in shared memory; then the rows go out in 16-byte pieces, consecutive
  // threads along a row (the fragment's own 4-byte pairs, 8 rows a warp, would use half of each
  // 32-byte sector). Rows are padded by 16 bytes, so that the fragment's 8 rows a store take
  // different banks.
  static constexpr int kDqRowPitch = kHeadDim + 16 / sizeof(Element);
  static CUTLASS_DEVICE void postprocess(RowParams const& params) {
    using namespace cute;
    __shared__ alignas(16) Element tile[kBlockM * kDqRowPitch];
    RowBlock const at = row_block_of(params);
    if (at.empty()) return;
    int const m_block = at.m_block, head = at.head, batch = at.batch;
    int const thread_idx = threadIdx.x;
    int64_t const block = params.rows.row_block(at.seq, head, m_block);
    float4 const* accum = reinterpret_cast<float4 const*>(params.dq_accum + block * kDqTileFloats);
    TiledMmaDQ mma_dq;
    Tensor coords = mma_dq.get_thread_slice(thread_idx).partition_C(make_identity_tensor(Shape<BlockM, HeadDim>{}));
    static_assert(decltype(size(coords))::value == kDqFragment);
    CUTLASS_PRAGMA_UNROLL
    for (int c = 0; c < kDqFragment / 4; ++c) {
      float4 const chunk = accum[dq_chunk(c, thread_idx)];
      float const values[4] = {chunk.x, chunk.y, chunk.z, chunk.w};
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < 4; j += 2) {
        store_pair(tile + get<0>(coords(4 * c + j)) * kDqRowPitch + get<1>(coords(4 * c + j)),
                   values[j] * params.softmax_scale, values[j + 1] * params.softmax_scale);
      }
    }
    __syncthreads();
    Element* dq = params.dq + batch * params.dq_batch_stride + head * params.dq_head_stride +
                  (at.seq.q_begin + int64_t{m_block} * kBlockM) * params.dq_row_stride;
    int const rows = cute::min(int{kBlockM}, at.seq.seqlen_q - m_block * kBlockM);
    // 16-byte stores: dQ's rows are 16-byte aligned (validate.cpp)
    constexpr int kPieces = kHeadDim * sizeof(Element) / 16;  // per row
    for (int i = thread_idx; i < rows * kPieces; i += kConsumerThreads) {
      int const row = i / kPieces, col = i % kPieces * (16 / sizeof(Element));
      *reinterpret_cast<uint4*>(dq + row * params.dq_row_stride + col) =
          *reinterpret_cast<uint4 const*>(tile + row * kDqRowPitch + col);
    }
  }
};

template <class Kernel>
__global__ void __launch_bounds__(Kernel::kThreads, 1)
    backward_kernel(CUTE_GRID_CONSTANT typename Kernel::Params const params) {
  extern __shared__ __align__(1024) unsigned char smem_buf[];
  Kernel{}(params, smem_buf);
}

template <class Kernel>
__global__ void __launch_bounds__(Kernel::kConsumerThreads)
    backward_preprocess_kernel(CUTE_GRID_CONSTANT typename Kernel::RowParams const params) {
  Kernel::preprocess(params);
}

template <class Kernel>
__global__ void __launch_bounds__(Kernel::kConsumerThreads)
    backward_postprocess_kernel(CUTE_GRID_CONSTANT typename Kernel::RowParams const params) {
  Kernel::postprocess(params);
}

}  // namespace flashhop::sm90
