// Mainloop of the sm90 forward kernel: the producer half (TMA loads of Q once and of K/V tiles into
// a ring of shared-memory stages) and the consumer half (S = Q K^T and O += P V by wgmma, with the
// online softmax in between). One CTA computes one query tile (64 rows per consumer warpgroup) of
// one head at a time (with kPackGqa, of one KV head's group of query heads: query_rows.h).
// Q and K have head dim d (kHeadDim), V and O head dim dv (kHeadDimV). FP8 (an 8-bit Element:
// e4m3 Q, K and V with FlashAttention-3's descales, O in bfloat16) quantizes P to e4m3 for P V and
// reads V^T from a ring of its own, which producer warps fill (fp8_transpose.h).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/cuda_host_adapter.hpp>
#include <cutlass/gemm/collective/builders/sm90_common.inl>
#include <cutlass/pipeline/pipeline.hpp>

#include "flashhop/flashhop.h"
#include "kernels/sm90/barriers.h"
#include "kernels/sm90/fp8_transpose.h"
#include "kernels/sm90/fwd_params.h"
#include "kernels/sm90/fwd_recipes.h"
#include "kernels/sm90/gmma_utils.h"
#include "kernels/sm90/mask.h"
#include "kernels/sm90/query_rows.h"
#include "kernels/sm90/softmax.h"

namespace flashhop::sm90 {

// How a kernel takes the call's soft-capping (softcap > 0): one kernel for both, which branches
// on it per walk, or a kernel per choice that holds only that choice's code (the recipe's
// softcap_per_kernel; launch_forward picks by the call's softcap).
enum class SoftcapChoice : std::uint8_t { kAtRunTime, kNone, kSoftcap };

// The first rows of a tile's sequence in the packed Q and K / V of a variable-length batch, or in
// its pages of a paged KV cache (0 for fixed-length batches, whose TMA coordinates name the batch
// entry instead), and its keys (read from a paged KV cache only).
struct RowOffsets {
  int q = 0, k = 0;
  int keys = 0;
};

// kRecipe_: an index into kForwardRecipes (fwd_recipes.h), which fixes every choice below.
// kVarlen_: for variable-length batches (varlen.h): TMA over the packed tensors, offset per tile.
template <class Element_, int kRecipe_, SoftcapChoice kSoftcapChoice_ = SoftcapChoice::kAtRunTime,
          bool kVarlen_ = false>
struct ForwardMainloop {
  static constexpr ForwardRecipe kRecipe = kForwardRecipes[kRecipe_];
  using Element = Element_;
  static constexpr bool kFp8 = sizeof(Element) == 1;
  using ElementO = cute::conditional_t<kFp8, cutlass::bfloat16_t, Element>;  // of O
  using Mask = cute::conditional_t<kRecipe.local(), LocalMask, NoMask>;
  static constexpr bool kPackGqa = kRecipe.pack_gqa;
  static constexpr bool kVarlen = kVarlen_;
  using Rows = QueryRows<kPackGqa>;
  static constexpr int kHeadDim = kRecipe.head_dim;
  static constexpr int kHeadDimV = kRecipe.head_dim_v;
  static constexpr SoftcapChoice kSoftcapChoice = kSoftcapChoice_;
  static constexpr int kBlockM = kRecipe.block_m;
  static constexpr int kBlockN = kRecipe.block_n;
  static constexpr int kStages = kRecipe.stages;
  // Each consumer warpgroup owns one 64-row wgmma atom of the query tile.
  static_assert(kBlockM % 64 == 0, "the query tile is a whole number of 64-row wgmma atoms");
  static constexpr int kConsumerWarpGroups = kBlockM / 64;
  using Roles = WarpGroups<kConsumerWarpGroups, kFp8>;
  using MmaTurns = MmaScheduler<kRecipe.mma_pingpong, kConsumerWarpGroups>;

  using BlockM = cute::Int<kBlockM>;
  using BlockN = cute::Int<kBlockN>;
  using HeadDim = cute::Int<kHeadDim>;
  using HeadDimV = cute::Int<kHeadDimV>;
  using TileShapeQK = cute::Shape<BlockM, BlockN, HeadDim>;   // (M, N, K) of S = Q K^T
  using TileShapePV = cute::Shape<BlockM, HeadDimV, BlockN>;  // (M, N, K) of O = P V
  // The consumer warpgroups split M: warpgroup c computes rows [64 c, 64 c + 64) of the tile.
  using ConsumerAtomLayout = cute::Layout<cute::Shape<cute::Int<kConsumerWarpGroups>, cute::_1, cute::_1>>;

  using TiledMmaQK =
      decltype(cute::make_tiled_mma(full_width_ss_op<Element, TileShapeQK>(), ConsumerAtomLayout{}));
  // P comes from registers (the converted S accumulator); V^T is read with d contiguous (MN-major),
  // or with FP8 from Vt's ring with the keys contiguous (K-major: 8-bit wgmma takes nothing else).
  using TiledMmaPV = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<Element, Element, float, TileShapePV, cute::GMMA::Major::K,
                                 kFp8 ? cute::GMMA::Major::K : cute::GMMA::Major::MN>(),
      ConsumerAtomLayout{}));
  // One wgmma spans the whole N of each GEMM: a narrower atom re-reads the A operand once per
  // N slice (from shared memory for Q K^T), which starves the tensor cores.
  static_assert(cute::size<1>(typename TiledMmaQK::AtomShape_MNK{}) == kBlockN, "Q K^T needs one wgmma of N = kBlockN");
  static_assert(cute::size<1>(typename TiledMmaPV::AtomShape_MNK{}) == kHeadDimV, "P V needs one wgmma of N = dv");

  // Shared-memory tiles in the wgmma K-major swizzled layouts, d contiguous as in global memory.
  using SmemLayoutQ = decltype(cute::tile_to_shape(
      cutlass::gemm::collective::detail::ss_smem_selector<cute::GMMA::Major::K, Element, BlockM, HeadDim>(),
      cute::Shape<BlockM, HeadDim>{}));  // (kBlockM, d)
  using SmemLayoutK = decltype(cute::tile_to_shape(
      cutlass::gemm::collective::detail::ss_smem_selector<cute::GMMA::Major::K, Element, BlockN, HeadDim>(),
      cute::Shape<BlockN, HeadDim, cute::Int<kStages>>{}));  // (kBlockN, d, stage)
  using SmemLayoutV = decltype(cute::tile_to_shape(
      cutlass::gemm::collective::detail::ss_smem_selector<cute::GMMA::Major::K, Element, BlockN, HeadDimV>(),
      cute::Shape<BlockN, HeadDimV, cute::Int<kStages>>{}));  // (kBlockN, dv, stage)
  // V^T, the B operand of O = P V: (dv, kBlockN, stage) on V's buffer, or with FP8 a ring of its
  // own, K-major, its keys in P's column order (fp8_key_of).
  using SmemLayoutVtOnV = decltype(cute::composition(
      SmemLayoutV{}, cute::make_ordered_layout(cute::Shape<HeadDimV, BlockN, cute::Int<kStages>>{},
                                               cute::Step<cute::_2, cute::_1, cute::_3>{})));
  using SmemLayoutVtOwn = decltype(cute::tile_to_shape(
      cutlass::gemm::collective::detail::ss_smem_selector<cute::GMMA::Major::K, Element, HeadDimV, BlockN>(),
      cute::Shape<HeadDimV, BlockN, cute::Int<kStages>>{}));
  using SmemLayoutVt = cute::conditional_t<kFp8, SmemLayoutVtOwn, SmemLayoutVtOnV>;
  // O in the epilogue, in the layout Q's would have with dv columns.
  using SmemLayoutO = decltype(cute::tile_to_shape(
      cutlass::gemm::collective::detail::ss_smem_selector<cute::GMMA::Major::K, ElementO, BlockM, HeadDimV>(),
      cute::Shape<BlockM, HeadDimV>{}));  // (kBlockM, dv)

  // TMA tiles are 128-byte swizzled: their buffers start on 1024-byte boundaries.
  struct QKVStorage {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> q;  // O in the epilogue
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>, 1024> k;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutV>, 1024> v;
  };
  struct QKVVtStorage : QKVStorage {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutVtOwn>, 1024> vt;
  };
  using SharedStorage = cute::conditional_t<kFp8, QKVVtStorage, QKVStorage>;

  // One consumer warpgroup's rows of O, in the same swizzled layout.
  using SmemLayoutOOneWarpGroup = decltype(cute::tile_to_shape(
      cutlass::gemm::collective::detail::ss_smem_selector<cute::GMMA::Major::K, ElementO, cute::_64, HeadDimV>(),
      cute::Shape<cute::_64, HeadDimV>{}));  // (64, dv)
  static constexpr int kQKVBytes =
      (cute::cosize_v<SmemLayoutQ> + cute::cosize_v<SmemLayoutK> + cute::cosize_v<SmemLayoutV>) * sizeof(Element) +
      (kFp8 ? cute::cosize_v<SmemLayoutVtOwn> * int{sizeof(Element)} : 0);
  // O's buffer (the recipe's o_buffer), next to Q, the K / V rings and 2 KB for the barriers.
  static constexpr bool kSeparateO = kRecipe.o_buffer == OBuffer::kOwn;
  static constexpr bool kTakeTurnsO = kRecipe.o_buffer == OBuffer::kTakeTurns;
  static_assert(!kSeparateO || kQKVBytes + cute::cosize_v<SmemLayoutO> * sizeof(ElementO) + 2048 <= 227 * 1024,
                "O's own buffer does not fit");
  // 16-bit O does not fit in 8-bit Q's buffer.
  static_assert(!kFp8 || kSeparateO, "FP8 stages O in a buffer of its own");
  // A query tile is one block of block scaling's query scales.
  static_assert(!kFp8 || kFp8ScaleBlockRows % 64 == 0, "a warpgroup's 64 query rows in one scale block");
  // The turns go between two warpgroups that each store all their rows (unpacked, no split merge).
  static_assert(!kTakeTurnsO || (kConsumerWarpGroups == 2 && !kPackGqa && !Mask::kIsLocal &&
                                 kQKVBytes + cute::cosize_v<SmemLayoutOOneWarpGroup> * sizeof(ElementO) + 2048 <=
                                     227 * 1024),
                "O's buffer taken in turn needs two unpacked, unmasked warpgroups and room for one's rows");
  // Whether O passes through a buffer other than Q's.
  static constexpr bool kOOutsideQ = kSeparateO || kTakeTurnsO;
  // Whether a consumer warpgroup skips the edge key tiles its own rows do not see (mma). A skipped
  // tile's stages go back while the P V owed from the tile before still holds its V stage, so two
  // skips in a row would wait, with two stages, for a stage that only that P V frees. With two
  // warpgroups there is at most one: the upper one's rows end at most 64 keys before the lower
  // one's (less with packed rows), the lower one's start at most 64 after, and a tile of 64 keys
  // or more fits that gap once at most; the upper one skips only on the right edge, the lower
  // only on the left. With three warpgroups (192 rows) the same holds on key tiles of at least 128.
  static constexpr bool kSkipUnseenTiles = kRecipe.skip_unseen_key_tiles;
  static_assert(!kSkipUnseenTiles || (Mask::kIsLocal && kConsumerWarpGroups > 1 &&
                                      kBlockN >= 64 * (kConsumerWarpGroups - 1) && kBlockN < kBlockM),
                "skipping unseen key tiles needs at most one such tile between two warpgroups' rows");
  // Whether a band's masked key tiles are masked by chunks of 32 keys per warp (mask.h,
  // apply_mask_by_chunks), so that the softmax skips the chunks that hold no key of the warp's rows:
  // on a causal diagonal of 128 x 128 the upper warpgroup's warps see at most 2 of 4 chunks, and
  // each warp's rows cut only 1 or 2.
  static constexpr bool kMaskByChunks = Mask::kIsLocal && kRecipe.mask_by_chunks;
  static constexpr int kMaskChunk = 32;
  // Whether the walk's last step, not the end of the walk, releases Q (see the walk in mma). Not
  // from a tile queue (variable-length batches): the consumers would ask for the next tile before
  // the walk, which the producer publishes only once it has issued all of this tile's loads.
  static constexpr bool kReleaseQInWalk = kRecipe.release_q_in_walk && !kVarlen;
  static_assert(!kReleaseQInWalk || kOOutsideQ, "Q can be released in the walk only where O leaves it alone");
  // Else (not kOOutsideQ) O is written into Q's buffer. Each consumer warpgroup may write only the
  // bytes of the rows its own Q K^T GEMMs read: true when O's layout is Q's restricted to the first
  // dv columns, i.e. equal, or with swizzle atoms of 64 columns stacked over all rows before the
  // next 64 columns.
  static_assert(kOOutsideQ || kHeadDimV == kHeadDim || (kHeadDim % 64 == 0 && kHeadDimV % 64 == 0),
                "O cannot share Q's buffer with these head dims");
  // Where O is written into Q's buffer, the next tile's Q can load only once the tile's O store has
  // read that buffer out, so the producer prefetches it into L2 as soon as it knows the tile
  // (prefetch_q): the load after the store then reads L2, not DRAM.
  static constexpr bool kPrefetchNextQ = kRecipe.prefetch_next_q;
  static_assert(!kPrefetchNextQ || (!kOOutsideQ && !kPackGqa), "the prefetch serves unpacked Q loaded by TMA");
  // Whether the row totals that normalise O (Softmax::totals) are computed while the tensor cores
  // run the tile's last P V rather than after it.
  static constexpr bool kTotalsUnderLastPV = kRecipe.totals_under_last_pv;

  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  using PipelineState = typename Pipeline::PipelineState;
  // The ring the consumers read V^T from: V's, or with FP8 Vt's, filled by the transposer warps.
  using PipelineV = cute::conditional_t<kFp8, cutlass::PipelineAsync<kStages>, Pipeline>;
  static_assert(cute::is_same_v<typename PipelineV::PipelineState, PipelineState>, "one stage count for the rings");
  using Transposer = cute::conditional_t<
      kFp8, VTransposer<kBlockN, kHeadDimV, Roles::kTransposeThreads, SmemLayoutV, SmemLayoutVt>, void>;
  static constexpr std::uint32_t kQBytes = cute::size(SmemLayoutQ{}) * sizeof(Element);
  static constexpr std::uint32_t kKTileBytes = cute::size(cute::take<0, 2>(SmemLayoutK{})) * sizeof(Element);
  static constexpr std::uint32_t kVTileBytes = cute::size(cute::take<0, 2>(SmemLayoutV{})) * sizeof(Element);

  // Global tensors as TMA sees them: (seqlen, head dim, heads, batch), 64-bit strides, head dim
  // contiguous.
  template <class Dim>
  using GmemTensorOf = decltype(cute::make_tensor(cute::make_gmem_ptr(static_cast<Element const*>(nullptr)),
                                                  cute::Shape<int32_t, Dim, int32_t, int32_t>{},
                                                  cute::Stride<int64_t, cute::_1, int64_t, int64_t>{}));
  using GmemTensorQK = GmemTensorOf<HeadDim>;  // Q, K
  using GmemTensorV = GmemTensorOf<HeadDimV>;  // V, O
  using TmaQ = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, GmemTensorQK{}, SmemLayoutQ{},
                                            cute::Shape<BlockM, HeadDim>{}, cute::_1{}));
  using TmaK = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, GmemTensorQK{}, cute::take<0, 2>(SmemLayoutK{}),
                                            cute::Shape<BlockN, HeadDim>{}, cute::_1{}));
  using TmaV = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, GmemTensorV{}, cute::take<0, 2>(SmemLayoutV{}),
                                            cute::Shape<BlockN, HeadDimV>{}, cute::_1{}));

  // A paged KV cache (variable-length kernels, calls with a page table): each key tile is gathered
  // from its sequence's pages by TMA copies of box_rows rows and one swizzle atom's columns, into
  // the tile's stage at those rows and columns. box_rows is a power of two that divides both the
  // page size and kBlockN, so that a box never crosses a page, and whose rows of the atom fill
  // whole 128 bytes, the alignment of a TMA destination. TMA swizzles by the destination's address
  // bits, so the boxes land as one copy of the whole tile would.
  static constexpr int kChunkK = cute::size<1>(
      cutlass::gemm::collective::detail::ss_smem_selector<cute::GMMA::Major::K, Element, BlockN, HeadDim>());
  static constexpr int kChunkV = cute::size<1>(
      cutlass::gemm::collective::detail::ss_smem_selector<cute::GMMA::Major::K, Element, BlockN, HeadDimV>());
  // The fewest rows a box may have: the atom's row bytes times this fill 128 bytes.
  static constexpr int kMinBoxRows = 128 / (cute::min(kChunkK, kChunkV) * int{sizeof(Element)});
  struct NoPages {};
  struct PagedKV {
    cute::TmaDescriptor k, v;  // (d or dv, page_size, nheads_kv, num_pages), boxes (chunk, box_rows, 1, 1)
    int const* page_table;     // null: K and V are packed rows
    int64_t table_stride;
    int page_size, box_rows;
  };

  // FP8's descales (ForwardParams): the scores of (batch, KV head) are q_descale k_descale times
  // those of the e4m3 values, O v_descale times.
  struct NoDescales {};
  struct Fp8Descales {
    float const* q;  // or null: 1
    float const* k;
    float const* v;
    int64_t q_batch_stride, q_head_stride, k_batch_stride, k_head_stride, v_batch_stride, v_head_stride;
    // Block scaling instead (ForwardParams): q's of blocks of 128 queries, k's and v's of 128 keys.
    ForwardParams::BlockScales q_block, k_block, v_block;
  };

  struct Params {
    TmaQ tma_q;  // unpacked Q
    TmaK tma_k;
    TmaV tma_v;
    // The TMA extents: for variable-length batches the packed tensors' rows and a batch of one.
    int seqlen_q, seqlen_k, nheads, nheads_kv, batch;
    Rows rows;  // a fixed-length batch's; a variable-length batch's per sequence by rows_of
    // Packed Q, gathered row by row: (batch, seqlen_q, nheads, d) with these strides.
    Element const* q;
    int64_t q_batch_stride, q_row_stride, q_head_stride;
    // The softmax runs on kept scores: s = q.k, or tanh(s * softcap_prescale) with soft-capping.
    // score_scale turns a kept score into the softmax's exponent (natural log units).
    bool softcap;
    float softcap_prescale;  // softmax_scale / softcap
    float score_scale;       // softmax_scale, or softcap with soft-capping
    float score_scale_log2;  // score_scale * log2(e)
    // Last, so that the fixed-length kernels' other parameters keep their places.
    cute::conditional_t<kVarlen, PagedKV, NoPages> paged;
    cute::conditional_t<kFp8, Fp8Descales, NoDescales> descales;
  };

  static Params to_params(ForwardParams const& p) {
    using namespace cute;
    // TMA descriptors need non-empty extents and a non-null address; with seqlen_k == 0 no key tile
    // is ever loaded (n_block_end is 0), so K and V borrow Q's address and a length of one.
    int const batch = kVarlen ? 1 : p.batch;
    int const seqlen_q = kVarlen ? p.total_q : p.seqlen_q;
    int const seqlen_k = kVarlen ? p.total_k : p.seqlen_k;
    bool const no_keys = seqlen_k == 0;
    auto gmem = [&](void const* ptr, auto dim, int seqlen, int heads, int64_t row, int64_t head, int64_t batch_stride) {
      return make_tensor(make_gmem_ptr(static_cast<Element const*>(ptr)), make_shape(seqlen, dim, heads, batch),
                         make_stride(row, _1{}, head, batch_stride));
    };
    auto mQ = gmem(p.q, HeadDim{}, seqlen_q, p.nheads, p.q_row_stride, p.q_head_stride, p.q_batch_stride);
    auto mK = gmem(no_keys ? p.q : p.k, HeadDim{}, no_keys ? 1 : seqlen_k, p.nheads_kv, p.k_row_stride,
                   p.k_head_stride, p.k_batch_stride);
    auto mV = gmem(no_keys ? p.q : p.v, HeadDimV{}, no_keys ? 1 : seqlen_k, p.nheads_kv, p.v_row_stride,
                   p.v_head_stride, p.v_batch_stride);
    float constexpr kLog2e = 1.4426950408889634f;
    bool const softcap = p.softcap > 0.f;
    float const score_scale = softcap ? p.softcap : p.softmax_scale;
    return {make_tma_copy(SM90_TMA_LOAD{}, mQ, SmemLayoutQ{}, Shape<BlockM, HeadDim>{}, _1{}),
            make_tma_copy(SM90_TMA_LOAD{}, mK, take<0, 2>(SmemLayoutK{}), Shape<BlockN, HeadDim>{}, _1{}),
            make_tma_copy(SM90_TMA_LOAD{}, mV, take<0, 2>(SmemLayoutV{}), Shape<BlockN, HeadDimV>{}, _1{}),
            seqlen_q,
            seqlen_k,
            p.nheads,
            p.nheads_kv,
            batch,
            Rows::make(p.seqlen_q, p.nheads, p.nheads_kv),
            static_cast<Element const*>(p.q),
            p.q_batch_stride,
            p.q_row_stride,
            p.q_head_stride,
            softcap,
            softcap ? p.softmax_scale / p.softcap : 0.f,
            score_scale,
            score_scale * kLog2e,
            paged_kv(p),
            descales_of(p)};
  }

  static auto descales_of(ForwardParams const& p) {
    if constexpr (kFp8) {
      return Fp8Descales{p.q_descale,
                         p.k_descale,
                         p.v_descale,
                         p.q_descale_batch_stride,
                         p.q_descale_head_stride,
                         p.k_descale_batch_stride,
                         p.k_descale_head_stride,
                         p.v_descale_batch_stride,
                         p.v_descale_head_stride,
                         p.q_block_scale,
                         p.k_block_scale,
                         p.v_block_scale};
    } else {
      return NoDescales{};
    }
  }

  // The scales of one tile's scores and O: the call's, and with FP8 its (batch, KV head)'s descales
  // folded in (as FlashAttention-3: softcap's argument and the softmax's exponent scale by
  // q_descale k_descale, O by v_descale). With block scales, key tile n's scores are multiplied by
  // the warpgroup's query block scale times the key block scale, and its P by its value block scale
  // over the head's largest (tile_factors), which O's normalisation takes back (o_scale): P stays
  // in [0, 256], inside e4m3's range.
  struct NoBlockScales {};
  struct TileBlockScales {
    float q;                            // the query block scale of the warpgroup's rows
    float const* k;                     // the head's key block scales, or null without block scaling
    float const* v;                     // its value block scales
    int64_t k_stride, v_stride;
    float inv_v_max;                    // 1 / the head's largest value block scale (0 where that is 0)
  };
  struct TileScales {
    float softcap_prescale;  // softmax_scale / softcap
    float score_scale;       // a kept score's exponent in natural-log units, per unit of the kept score
    float score_scale_log2;  // the same in log2 units
    float o_scale;           // v_descale, or the largest value block scale
    cute::conditional_t<kFp8, TileBlockScales, NoBlockScales> blocks;
  };
  // The key block of key tile n_block: key tiles lie in one block of 128 keys (validation).
  static CUTLASS_DEVICE int key_block(int n_block) { return n_block * kBlockN / kFp8ScaleBlockRows; }
  static CUTLASS_DEVICE TileScales tile_scales(Params const& params, int head, int head_kv, int batch, int m_block,
                                               int consumer) {
    if constexpr (kFp8) {
      Fp8Descales const& d = params.descales;
      auto const read = [&](float const* at, int64_t batch_stride, int64_t head_stride) {
        return at == nullptr ? 1.f : __ldg(at + batch * batch_stride + head_kv * head_stride);
      };
      float const qk = read(d.q, d.q_batch_stride, d.q_head_stride) * read(d.k, d.k_batch_stride, d.k_head_stride);
      // Soft-capped, the kept score tanh(s softcap_prescale) takes the descales inside the tanh;
      // else the kept score is s itself and the exponent's scale takes them.
      float const kept = params.softcap ? 1.f : qk;
      TileScales scales{params.softcap_prescale * qk, params.score_scale * kept, params.score_scale_log2 * kept,
                        read(d.v, d.v_batch_stride, d.v_head_stride), {1.f, nullptr, nullptr, 0, 0, 1.f}};
      // Block scales come with fixed-length batches only (validation).
      if (!kVarlen && d.k_block.data != nullptr) {
        TileBlockScales& b = scales.blocks;
        // The warpgroup's rows lie in one block; rows all past the last query take the last block's
        // scale (their output is never stored), so that no read leaves the scales.
        int const q_blocks = (params.seqlen_q + kFp8ScaleBlockRows - 1) / kFp8ScaleBlockRows;
        int const q_block = min((m_block * kBlockM + 64 * consumer) / kFp8ScaleBlockRows, q_blocks - 1);
        b.q = __ldg(d.q_block.data + batch * d.q_block.batch_stride + head * d.q_block.head_stride +
                    q_block * d.q_block.block_stride);
        b.k = d.k_block.data + batch * d.k_block.batch_stride + head_kv * d.k_block.head_stride;
        b.v = d.v_block.data + batch * d.v_block.batch_stride + head_kv * d.v_block.head_stride;
        b.k_stride = d.k_block.block_stride;
        b.v_stride = d.v_block.block_stride;
        // The head's largest value block scale: each lane reads every 32nd block, the warp (all of
        // whose lanes get here) takes the maximum.
        float v_max = 0.f;
        int const blocks = (params.seqlen_k + kFp8ScaleBlockRows - 1) / kFp8ScaleBlockRows;
        CUTLASS_PRAGMA_NO_UNROLL
        for (int i = threadIdx.x % 32; i < blocks; i += 32) v_max = fmaxf(v_max, __ldg(b.v + i * b.v_stride));
        CUTLASS_PRAGMA_UNROLL
        for (int lanes = 16; lanes > 0; lanes /= 2) v_max = fmaxf(v_max, __shfl_xor_sync(0xffffffff, v_max, lanes));
        b.inv_v_max = v_max > 0.f ? 1.f / v_max : 0.f;
        scales.o_scale = v_max;
      }
      return scales;
    } else {
      return {params.softcap_prescale, params.score_scale, params.score_scale_log2, 1.f, {}};
    }
  }
  // The softmax's factors of key tile n_block (softmax.h): with FP8 block scales its scores times
  // the warpgroup's query block scale times the key block scale, its P times its value block scale
  // over the head's largest; unit factors without block scales, none for 16-bit kernels. Factors of 0
  // (blocks of zeros) are kept just above: -inf stays -inf, and P's share of the row sum survives
  // the division by its factor (such P rounds to 0 in e4m3 all the same).
  static CUTLASS_DEVICE auto tile_factors(TileScales const& scales, int n_block) {
    if constexpr (kFp8) {
      if (scales.blocks.k == nullptr) return TileFactors{1.f, 0.f, 1.f};
      float const score = scales.blocks.q * __ldg(scales.blocks.k + key_block(n_block) * scales.blocks.k_stride);
      float const p = fmaxf(__ldg(scales.blocks.v + key_block(n_block) * scales.blocks.v_stride) *
                                scales.blocks.inv_v_max, 0x1p-64f);
      return TileFactors{fmaxf(score, 0x1p-126f), fast_log2(p), fast_reciprocal(p)};
    } else {
      return NoTileFactors{};
    }
  }
  // The factors the softmax takes: soft-capped, apply_softcap took the score factor already.
  template <class Factors>
  static CUTLASS_DEVICE Factors softmax_factors(Factors factors, bool softcapped) {
    if constexpr (cute::is_same_v<Factors, TileFactors>) {
      if (softcapped) factors.score = 1.f;
    }
    return factors;
  }
  // The soft-capping prescale of a tile with these factors.
  template <class Factors>
  static CUTLASS_DEVICE float softcap_prescale(TileScales const& scales, Factors const& factors) {
    if constexpr (cute::is_same_v<Factors, TileFactors>) {
      return scales.softcap_prescale * factors.score;
    } else {
      return scales.softcap_prescale;
    }
  }

  // The paged-cache part of the parameters: page_table null without a page table, and also where a
  // descriptor could not be encoded (launch_kernel reports it).
  static auto paged_kv(ForwardParams const& p) {
    if constexpr (kVarlen) {
      PagedKV paged{};
      if (p.page_table == nullptr) return paged;
      // The largest power of two that divides both the page size and the key tile, at most 256
      // rows (a TMA box's limit); validation kept it at kMinBoxRows or more.
      int box_rows = 1;
      while (box_rows < 256 && p.page_size % (2 * box_rows) == 0 && kBlockN % (2 * box_rows) == 0) box_rows *= 2;
      paged.page_size = p.page_size;
      paged.box_rows = box_rows;
      paged.table_stride = p.page_table_stride;
      if (box_rows >= kMinBoxRows &&
          encode_pages<kChunkK>(paged.k, p.k, kHeadDim, p, p.k_row_stride, p.k_head_stride, p.k_batch_stride,
                                box_rows) &&
          encode_pages<kChunkV>(paged.v, p.v, kHeadDimV, p, p.v_row_stride, p.v_head_stride, p.v_batch_stride,
                                box_rows)) {
        paged.page_table = p.page_table;
      }
      return paged;
    } else {
      return NoPages{};
    }
  }

  // The TMA descriptor of paged K or V (`cols` wide, strides in elements): dimensions (cols,
  // page_size, nheads_kv, num_pages), boxes of one swizzle atom's kChunk columns and box_rows rows,
  // swizzled as the atom. A stride of a dimension of size 1 may be 0 (never followed); TMA takes
  // 16 bytes there.
  template <int kChunk>
  static bool encode_pages(cute::TmaDescriptor& desc, void const* base, int cols, ForwardParams const& p,
                           int64_t row_stride, int64_t head_stride, int64_t page_stride, int box_rows) {
    auto const bytes = [](int64_t stride) {
      return static_cast<cuuint64_t>(stride == 0 ? 16 : stride * int64_t{sizeof(Element)});
    };
    constexpr int kChunkBytes = kChunk * int{sizeof(Element)};
    static_assert(kChunkBytes == 128 || kChunkBytes == 64 || kChunkBytes == 32, "a swizzled atom's row");
    CUtensorMapSwizzle const swizzle = kChunkBytes == 128  ? CU_TENSOR_MAP_SWIZZLE_128B
                                       : kChunkBytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                                                           : CU_TENSOR_MAP_SWIZZLE_32B;
    cuuint64_t dims[4] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(p.page_size),
                          static_cast<cuuint64_t>(p.nheads_kv), static_cast<cuuint64_t>(p.num_pages)};
    cuuint64_t strides[3] = {bytes(row_stride), bytes(head_stride), bytes(page_stride)};
    cuuint32_t box[4] = {kChunk, static_cast<cuuint32_t>(box_rows), 1, 1};
    cuuint32_t element_strides[4] = {1, 1, 1, 1};
    CUresult const result = CUTLASS_CUDA_DRIVER_WRAPPER_CALL(cuTensorMapEncodeTiled)(
        &desc, cute::TMA::to_CUtensorMapDataType<Element>(), 4, const_cast<void*>(base), dims, strides, box,
        element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return result == CUDA_SUCCESS;
  }

  static CUTLASS_DEVICE void prefetch_tma_descriptors(Params const& params) {
    if constexpr (!kPackGqa) cute::prefetch_tma_descriptor(params.tma_q.get_tma_descriptor());
    if constexpr (kVarlen) {
      if (params.paged.page_table != nullptr) {
        cute::prefetch_tma_descriptor(&params.paged.k);
        cute::prefetch_tma_descriptor(&params.paged.v);
        return;
      }
    }
    cute::prefetch_tma_descriptor(params.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_v.get_tma_descriptor());
  }

  // Key tiles of query tile m_block. Its rows past the last query are computed but never stored;
  // their queries count too.
  static CUTLASS_DEVICE KeyBlocks key_blocks(Params const& params, Mask const& mask, int m_block) {
    int const first_row = m_block * kBlockM;
    return mask.template key_blocks<kBlockN>(params.rows.query(first_row),
                                             params.rows.query(first_row + kBlockM - 1));
  }

  // Whether a consumer warpgroup whose rows all lie past the last tile row skips the tile
  // (skip_tile), as in the last query tile of a KV head with packed rows (decoding: g rows in a
  // tile of 128).
  static constexpr bool kSkipRowsPastEnd = kRecipe.skip_rows_past_end;
  // How many of consumer warpgroup `consumer`'s 64 rows of query tile m_block exist (at most 0:
  // none), and whether they all lie past the last row.
  // `tile`: a ForwardTile, or a VarlenTile, whose sequence's queries are its rows.
  template <class Tile>
  static CUTLASS_DEVICE int rows_in_warpgroup(Params const& params, Tile const& tile, int consumer) {
    if constexpr (kVarlen) {
      return params.rows.rows_of(tile.span.seqlen_q) - (tile.m_block * kBlockM + consumer * 64);
    } else {
      return params.rows.rows - (tile.m_block * kBlockM + consumer * 64);
    }
  }
  template <class Tile>
  static CUTLASS_DEVICE bool rows_past_end(Params const& params, Tile const& tile, int consumer) {
    return rows_in_warpgroup(params, tile, consumer) <= 0;
  }

  // q_full completes once per Q tile: on one arrival plus the TMA's bytes, or, packed, on one
  // arrival per lane of the warp that gathers Q (load_q_packed).
  static constexpr int kQFullArrivals = kPackGqa ? 32 : 1;

  // The rows of (head, batch) in the coordinates of a TMA tensor (seqlen, d, heads, batch): from
  // row `offset` on for a variable-length batch's sequence.
  template <class TmaTensor>
  static CUTLASS_DEVICE auto sequence_rows(TmaTensor const& tensor, int head, int batch, int offset) {
    using namespace cute;
    if constexpr (kVarlen) {
      return domain_offset(make_coord(offset, _0{}), tensor(_, _, head, 0));
    } else {
      return tensor(_, _, head, batch);
    }
  }

  // Query tile m_block of (head, batch) in the coordinates of Q's TMA: (kBlockM, d).
  static CUTLASS_DEVICE auto query_tile(Params const& params, int m_block, int head, int batch, RowOffsets offsets) {
    using namespace cute;
    Tensor mQ = params.tma_q.get_tma_tensor(make_shape(params.seqlen_q, HeadDim{}, params.nheads, params.batch));
    return local_tile(sequence_rows(mQ, head, batch, offsets.q), Shape<BlockM, HeadDim>{}, make_coord(m_block, _0{}));
  }

  // Producer, one thread, for one tile that visits key tiles [blocks.begin, blocks.end): the K and
  // V of key tile blocks.first(), then of blocks.end - 1 down to blocks.begin but that one, each
  // into the next free stage of its ring, and Q unless packed. The first K/V pair goes out before
  // Q, whose buffer may still hold the previous tile's O: `wait_q_free` returns once the epilogue
  // has released it.
  template <class WaitQFree>
  static CUTLASS_DEVICE void load(Params const& params, SharedStorage& smem, cutlass::arch::ClusterTransactionBarrier& q_full,
                                  Pipeline& pipeline_k, Pipeline& pipeline_v, PipelineState& write, int m_block,
                                  int head, int batch, KeyBlocks const& blocks, WaitQFree const& wait_q_free,
                                  RowOffsets offsets = {}) {
    using namespace cute;
    int const head_kv = params.rows.kv_head(head);
    if constexpr (kVarlen) {
      if (params.paged.page_table != nullptr) {
        load_tile(params, smem, q_full, m_block, head, batch, blocks, wait_q_free, offsets, [&](int n_block) {
          pipeline_k.producer_acquire(write);
          load_pages<SmemLayoutK, kChunkK, kHeadDim>(params.paged, params.paged.k,
                                                     pipeline_k.producer_get_barrier(write), smem.k.data(),
                                                     write.index(), n_block, batch, head_kv, offsets);
          pipeline_v.producer_acquire(write);
          load_pages<SmemLayoutV, kChunkV, kHeadDimV>(params.paged, params.paged.v,
                                                      pipeline_v.producer_get_barrier(write), smem.v.data(),
                                                      write.index(), n_block, batch, head_kv, offsets);
          ++write;
        });
        return;
      }
    }
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), SmemLayoutK{});  // (kBlockN, d, stage)
    Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), SmemLayoutV{});  // (kBlockN, dv, stage)
    int const seqlen_k = cute::max(params.seqlen_k, 1);  // as in to_params
    Tensor mK = params.tma_k.get_tma_tensor(make_shape(seqlen_k, HeadDim{}, params.nheads_kv, params.batch));
    Tensor mV = params.tma_v.get_tma_tensor(make_shape(seqlen_k, HeadDimV{}, params.nheads_kv, params.batch));
    Tensor gK = local_tile(sequence_rows(mK, head_kv, batch, offsets.k), Shape<BlockN, HeadDim>{},
                           make_coord(_, _0{}));  // (kBlockN, d, n)
    Tensor gV = local_tile(sequence_rows(mV, head_kv, batch, offsets.k), Shape<BlockN, HeadDimV>{},
                           make_coord(_, _0{}));  // (kBlockN, dv, n)
    auto tma_k = params.tma_k.get_slice(_0{});
    auto tma_v = params.tma_v.get_slice(_0{});
    Tensor tKgK = tma_k.partition_S(gK);  // (TMA, TMA_N, TMA_D, n)
    Tensor tKsK = tma_k.partition_D(sK);  // (TMA, TMA_N, TMA_D, stage)
    Tensor tVgV = tma_v.partition_S(gV);
    Tensor tVsV = tma_v.partition_D(sV);
    load_tile(params, smem, q_full, m_block, head, batch, blocks, wait_q_free, offsets, [&](int n_block) {
      pipeline_k.producer_acquire(write);
      copy(params.tma_k.with(*pipeline_k.producer_get_barrier(write)), tKgK(_, _, _, n_block),
           tKsK(_, _, _, write.index()));
      pipeline_v.producer_acquire(write);
      copy(params.tma_v.with(*pipeline_v.producer_get_barrier(write)), tVgV(_, _, _, n_block),
           tVsV(_, _, _, write.index()));
      ++write;
    });
  }

  // load's order of one tile's copies, with load_kv(n_block) the K and V of key tile n_block.
  template <class WaitQFree, class LoadKV>
  static CUTLASS_DEVICE void load_tile(Params const& params, SharedStorage& smem,
                                       cutlass::arch::ClusterTransactionBarrier& q_full, int m_block, int head,
                                       int batch, KeyBlocks const& blocks, WaitQFree const& wait_q_free,
                                       RowOffsets offsets, LoadKV const& load_kv) {
    using namespace cute;
    Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), SmemLayoutQ{});  // (kBlockM, d)
    Tensor gQ = query_tile(params, m_block, head, batch, offsets);          // (kBlockM, d)
    auto tma_q = params.tma_q.get_slice(_0{});
    Tensor tQgQ = tma_q.partition_S(gQ);  // (TMA, TMA_M, TMA_D)
    Tensor tQsQ = tma_q.partition_D(sQ);
    int const first_block = blocks.first();
    load_kv(first_block);
    if constexpr (!kPackGqa) {
      wait_q_free();
      using BarrierType = cutlass::arch::ClusterTransactionBarrier::ValueType;
      q_full.arrive_and_expect_tx(kQBytes);
      copy(params.tma_q.with(reinterpret_cast<BarrierType&>(q_full)), tQgQ, tQsQ);
    }
    // Not unrolled: each load waits for a free stage anyway, and the producer has 24 registers.
    CUTLASS_PRAGMA_NO_UNROLL
    for (int n_block = blocks.end - 1; n_block >= blocks.begin; --n_block) {
      if (n_block != first_block) load_kv(n_block);
    }
  }

  // Producer, one thread: key tile n_block of sequence `sequence` and KV head head_kv from a paged
  // cache (PagedKV) into `stage` of the ring at `buffer` (SmemLayout: (kBlockN, kCols, stage)). The
  // sequence's keys are rows keys.k .. keys.k + keys.keys of its pages (keys.k > 0: left padding,
  // validated to one page per sequence, so that a box that is not box-aligned never crosses into
  // another page: past the page TMA reads zeros). Boxes past the sequence's keys read page -1,
  // outside the pages, which TMA fills with zeros (a stale stage could hold non-finite values that
  // P = 0 would still multiply); so do page ids past num_pages or negative, and nothing outside the
  // pages is read. One page id at a time: the producer's 24 registers hold no more without
  // spilling, and a tile's ids share a cache line or few.
  template <class SmemLayout, int kChunk, int kCols>
  static CUTLASS_DEVICE void load_pages(PagedKV const& paged, cute::TmaDescriptor const& desc, uint64_t* barrier,
                                        Element* buffer, int stage, int n_block, int sequence, int head_kv,
                                        RowOffsets const& keys_at) {
    auto const offset = cute::get_nonswizzle_portion(SmemLayout{});
    int const* const table = paged.page_table + sequence * paged.table_stride;
    int const first_key = keys_at.k + n_block * kBlockN, keys = keys_at.k + keys_at.keys;
    int page_index = first_key / paged.page_size;
    int page_row = first_key - page_index * paged.page_size;
    CUTLASS_PRAGMA_NO_UNROLL
    for (int row = 0; row < kBlockN; row += paged.box_rows) {
      int const page = first_key + row < keys ? __ldg(table + page_index) : -1;
      CUTLASS_PRAGMA_UNROLL
      for (int col = 0; col < kCols; col += kChunk) {
        cute::SM90_TMA_LOAD_4D::copy(&desc, barrier, static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_NORMAL),
                                     buffer + offset(row, col, stage), col, page_row, head_kv, page);
      }
      page_row += paged.box_rows;
      if (page_row >= paged.page_size) {
        page_row -= paged.page_size;
        ++page_index;
      }
    }
  }

  // Producer, one thread: asks L2 for query tile m_block of (head, batch) by a TMA prefetch, without
  // a barrier or a destination (kPrefetchNextQ).
  static CUTLASS_DEVICE void prefetch_q(Params const& params, int m_block, int head, int batch,
                                         RowOffsets offsets = {}) {
    auto tma_q = params.tma_q.get_slice(cute::_0{});
    cute::prefetch(params.tma_q, tma_q.partition_S(query_tile(params, m_block, head, batch, offsets)));
  }

  // Producer warp, packed Q only (lane in [0, 32)): gathers the tile's rows, each from its own query
  // head, into Q's buffer by 16-byte cp.async copies, lanes along a row; the rows past the last
  // query that a GEMM reads are zeroed, those of a warpgroup that skips the tile (rows_past_end)
  // left as they are. The caller has waited for the buffer to be free. `tile`: a ForwardTile, or a
  // VarlenTile, whose sequence's queries start at row span.q_begin of the packed Q.
  template <class Tile>
  static CUTLASS_DEVICE void load_q_packed(Params const& params, SharedStorage& smem,
                                           cutlass::arch::ClusterTransactionBarrier& q_full, Tile const& tile,
                                           int lane) {
    int const m_block = tile.m_block, head = tile.head, batch = tile.batch;
    using namespace cute;
    static_assert(kPackGqa);
    Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), SmemLayoutQ{});  // (kBlockM, d)
    // 16 bytes are contiguous in every swizzled layout here (the swizzles permute 16-byte units).
    constexpr int kChunk = 16 / sizeof(Element);
    constexpr int kChunksPerRow = kHeadDim / kChunk;
    int const first_row = m_block * kBlockM;
    int rows;  // that exist
    Element const* q_batch = params.q + batch * params.q_batch_stride;
    if constexpr (kVarlen) {
      rows = cute::min(int{kBlockM}, params.rows.rows_of(tile.span.seqlen_q) - first_row);
      q_batch += int64_t{tile.span.q_begin} * params.q_row_stride;
    } else {
      rows = cute::min(int{kBlockM}, params.rows.rows - first_row);
    }
    int const read_rows = kSkipRowsPastEnd ? cute::min(int{kBlockM}, (rows + 63) / 64 * 64) : kBlockM;
    // The rows that exist, then the zeroes, which need no row lookup: the consumers wait for the
    // whole of Q before their first GEMM (faster than one loop that branches per chunk).
    CUTLASS_PRAGMA_NO_UNROLL
    for (int i = lane; i < rows * kChunksPerRow; i += 32) {
      int const row = i / kChunksPerRow, col = i % kChunksPerRow * kChunk;
      typename Rows::Row const at = params.rows.locate(first_row + row, head);
      Element const* src = q_batch + at.query * params.q_row_stride + at.head * params.q_head_stride + col;
      SM80_CP_ASYNC_CACHEGLOBAL<uint4>::copy(*reinterpret_cast<uint4 const*>(src),
                                              *reinterpret_cast<uint4*>(&sQ(row, col)));
    }
    CUTLASS_PRAGMA_NO_UNROLL
    for (int i = rows * kChunksPerRow + lane; i < read_rows * kChunksPerRow; i += 32) {
      *reinterpret_cast<uint4*>(&sQ(i / kChunksPerRow, i % kChunksPerRow * kChunk)) = make_uint4(0, 0, 0, 0);
    }
    cp_async_wait<0>();
    // The rows were written through the generic proxy; the S GEMMs read them through the async proxy.
    cutlass::arch::fence_view_async_shared();
    q_full.arrive();
  }

  // V^T's buffer: V's, or with FP8 Vt's.
  static CUTLASS_DEVICE Element* vt_buffer(SharedStorage& smem) {
    if constexpr (kFp8) {
      return smem.vt.data();
    } else {
      return smem.v.data();
    }
  }

  // Row factors times o_scale (FP8's v_descale; the others' 1 needs nothing).
  template <class RowValues>
  static CUTLASS_DEVICE RowValues scale_rows(RowValues values, float o_scale) {
    if constexpr (kFp8) {
      CUTLASS_PRAGMA_UNROLL
      for (std::size_t m = 0; m < values.size(); ++m) values[m] *= o_scale;
    }
    return values;
  }

  // P of a key tile's scores as the register A operand of P V: converted to the element type, with
  // FP8 in the A fragment's column order (accumulator_as_fp8_a_operand).
  template <class SAccum>
  static CUTLASS_DEVICE auto make_p_regs(SAccum const& s_accum) {
    if constexpr (kFp8) {
      return cute::make_tensor<Element>(cute::make_layout(cute::shape(accumulator_as_fp8_a_operand(s_accum.layout()))));
    } else {
      return cute::make_tensor<Element>(accumulator_as_a_operand(s_accum.layout()));
    }
  }
  template <class SAccum, class PRegs>
  static CUTLASS_DEVICE void convert_p(SAccum const& s_accum, PRegs& p_regs) {
    if constexpr (kFp8) {
      cute::Tensor scores = cute::make_tensor(s_accum.data(), accumulator_as_fp8_a_operand(s_accum.layout()));
      cute::Tensor ordered = cute::make_tensor<float>(p_regs.layout());  // register renaming, no data movement
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < cute::size(ordered); ++i) ordered(i) = scores(i);
      convert_fragment_into(ordered, p_regs);
    } else {
      convert_fragment_into(s_accum, p_regs);
    }
  }

  // Transposer warps (FP8), thread in [0, Roles::kTransposeThreads): the V stages of a tile's
  // `key_tiles` key tiles, in load order, transposed into Vt's stages. The V stage goes back to the
  // producer once read; the Vt stage to the consumers once written and fenced.
  static CUTLASS_DEVICE void transpose_v(SharedStorage& smem, Pipeline& pipeline_v, PipelineV& pipeline_vt,
                                         PipelineState& v_read, PipelineState& vt_write, int key_tiles,
                                         int thread) {
    static_assert(kFp8);
    // Byte pointers into shared memory (no swizzled pointer): the transposer adds swizzled offsets.
    std::uint8_t const* const v = reinterpret_cast<std::uint8_t const*>(smem.v.data());
    std::uint8_t* const vt = reinterpret_cast<std::uint8_t*>(smem.vt.data());
    typename Transposer::LaneOffsets const mine = Transposer::offsets_of(thread);
    CUTLASS_PRAGMA_NO_UNROLL
    for (int i = 0; i < key_tiles; ++i) {
      pipeline_v.consumer_wait(v_read);
      pipeline_vt.producer_acquire(vt_write);
      Transposer::transpose(v + Transposer::kStageBytes * v_read.index(),
                            vt + Transposer::kStageBytes * vt_write.index(), mine);
      cutlass::arch::fence_view_async_shared();  // generic-proxy writes, read by wgmma
      pipeline_vt.producer_commit(vt_write);
      pipeline_v.consumer_release(v_read);
      ++v_read;
      ++vt_write;
    }
  }

  // A key tile that consumer warpgroup `consumer` computes nothing for: its turn at the tensor
  // cores is passed on at once (the turns go round robin, so each warpgroup takes one per key
  // tile), and its K and V stages (at k_read, which moves on) are handed back once they have
  // landed: released earlier, the arrivals would count into the stages' previous use, which
  // another warpgroup may still be reading.
  static CUTLASS_DEVICE void skip_key_tile(Pipeline& pipeline_k, PipelineV& pipeline_v, PipelineState& k_read,
                                           int consumer) {
    MmaTurns::wait_turn(consumer);
    MmaTurns::pass_turn(consumer);
    pipeline_k.consumer_wait(k_read);
    pipeline_k.consumer_release(k_read);
    pipeline_v.consumer_wait(k_read);
    pipeline_v.consumer_release(k_read);
    ++k_read;
  }

  // Consumer warpgroup `consumer`, whose rows all lie past the last row (rows_past_end), over the
  // key tiles `blocks` (not empty) of a tile: computes nothing and skips every key tile, so that
  // the tensor cores serve the other warpgroups alone. It waits for Q all the same, so that its
  // release of Q's buffer does not run ahead of the tile's load. `q_phase` and `k_read` as in mma.
  static CUTLASS_DEVICE void skip_tile(cutlass::arch::ClusterTransactionBarrier& q_full, int q_phase,
                                       Pipeline& pipeline_k, PipelineV& pipeline_v, PipelineState& k_read,
                                       int consumer, KeyBlocks const& blocks) {
    q_full.wait(q_phase);
    CUTLASS_PRAGMA_NO_UNROLL
    for (int n_block = blocks.begin; n_block < blocks.end; ++n_block) {
      skip_key_tile(pipeline_k, pipeline_v, k_read, consumer);
    }
  }

  // The key walk of one kind of key tile each, down from n_block (which they leave past their
  // tiles): step(n_block, needs_mask, softcap) computes a key tile, edge_step(n_block, softcap) a
  // masked one that this warpgroup's rows may not see; `softcap` is a bool, or true_type /
  // false_type in a walk compiled per soft-capping choice.
  // The tiles cut by the band's right edge (the diagonal, the end of the keys):
  template <class EdgeStep, class Softcap>
  static CUTLASS_DEVICE void right_edge_tiles(KeyBlocks const& blocks, int& n_block, EdgeStep const& edge_step,
                                              Softcap softcap) {
    for (; n_block >= blocks.begin && n_block >= blocks.right_masked_from; --n_block) edge_step(n_block, softcap);
  }
  // The whole tiles, but the highest one, which the first step took:
  template <class Step, class Softcap>
  static CUTLASS_DEVICE void whole_tiles(KeyBlocks const& blocks, int first_block, int& n_block, Step const& step,
                                         Softcap softcap) {
    if (n_block == first_block) --n_block;
    for (; n_block >= blocks.begin && (!Mask::kIsLocal || n_block >= blocks.left_masked_below); --n_block) {
      step(n_block, cute::false_type{}, softcap);
    }
  }
  // The tiles cut by the band's left edge:
  template <class EdgeStep, class Softcap>
  static CUTLASS_DEVICE void left_edge_tiles(KeyBlocks const& blocks, int& n_block, EdgeStep const& edge_step,
                                             Softcap softcap) {
    if constexpr (Mask::kIsLocal) {
      for (; n_block >= blocks.begin; --n_block) edge_step(n_block, softcap);
    }
  }
  template <class Step, class EdgeStep, class Softcap>
  static CUTLASS_DEVICE void walk_by_kind(KeyBlocks const& blocks, int first_block, int& n_block, Step const& step,
                                         EdgeStep const& edge_step, Softcap softcap) {
    right_edge_tiles(blocks, n_block, edge_step, softcap);
    whole_tiles(blocks, first_block, n_block, step, softcap);
    left_edge_tiles(blocks, n_block, edge_step, softcap);
  }

  // The key tiles of a query tile after its first (first_block), from n_block down to blocks.begin,
  // in the recipe's loop shape (LoopShape: which loops are compiled, and how often, decides what
  // ptxas can keep in registers; the evidence per recipe is in tools/forward_recipes.py).
  // softcapped() returns the call's soft-capping as a bool, or as a type where the kernel serves
  // one choice; needs_mask(n_block) whether key tile n_block is cut by the band.
  template <class Step, class EdgeStep, class Softcapped, class NeedsMask>
  static CUTLASS_DEVICE void walk_key_tiles(KeyBlocks const& blocks, int first_block, int& n_block, Step const& step,
                                            EdgeStep const& edge_step, Softcapped const& softcapped,
                                            NeedsMask const& needs_mask) {
    using cute::false_type;
    using cute::true_type;
    constexpr LoopShape kShape = kRecipe.loop_shape;
    static_assert(Mask::kIsLocal || kShape == LoopShape::kPerKind || kShape == LoopShape::kPerSoftcap,
                  "without a mask the walk has no edge tiles to shape");
    if constexpr (kShape == LoopShape::kSingle) {
      for (; n_block >= blocks.begin; --n_block) {
        if (n_block == first_block) continue;
        if (needs_mask(n_block)) {
          edge_step(n_block, softcapped());
        } else {
          step(n_block, false_type{}, softcapped());
        }
      }
    } else if constexpr (kShape == LoopShape::kPerKind) {
      walk_by_kind(blocks, first_block, n_block, step, edge_step, softcapped());
    } else if constexpr (kShape == LoopShape::kWholeTilesPerSoftcap) {
      right_edge_tiles(blocks, n_block, edge_step, softcapped());
      if (softcapped()) {
        whole_tiles(blocks, first_block, n_block, step, true_type{});
      } else {
        whole_tiles(blocks, first_block, n_block, step, false_type{});
      }
      left_edge_tiles(blocks, n_block, edge_step, softcapped());
    } else if constexpr (kSoftcapChoice != SoftcapChoice::kAtRunTime) {
      walk_by_kind(blocks, first_block, n_block, step, edge_step, softcapped());  // the kernel's one choice
    } else if (softcapped()) {
      walk_by_kind(blocks, first_block, n_block, step, edge_step, true_type{});
    } else {
      walk_by_kind(blocks, first_block, n_block, step, edge_step, false_type{});
    }
  }

  // Consumer warpgroup `consumer` (thread_idx in [0, 128 x consumers) over all consumers):
  // accumulates O of its 64 rows into `o_accum` and the row statistics into `softmax`, over the key
  // tiles `blocks` (not empty). Where kTotalsUnderLastPV it also normalises O and sets `lse` (as
  // Softmax::finalize); else the caller finalizes. `q_phase` is the phase of q_full that this
  // tile's Q completes; `k_read` is the next K/V stage to read and is left past this tile's key
  // tiles. `q_read_done()` is called once this warpgroup's last S GEMM has retired, i.e. it no
  // longer reads Q.
  //
  // Intra-warpgroup overlap: S of key tile n is issued before P V of key tile n + 1, so the softmax
  // of tile n runs while the tensor cores do P V; the rescale of O that this softmax owes is paid
  // in the next step, while the next S GEMM runs and before the next P V.
  template <class OAccum, class Softmax, class QReadDone>
  static CUTLASS_DEVICE void mma(Params const& params, SharedStorage& smem, Mask const& mask,
                                 cutlass::arch::ClusterTransactionBarrier& q_full, int q_phase,
                                 Pipeline& pipeline_k, PipelineV& pipeline_v, PipelineState& k_read,
                                 OAccum& o_accum, Softmax& softmax, int thread_idx, int consumer, int m_block,
                                 KeyBlocks const& blocks, QReadDone const& q_read_done,
                                 typename Softmax::RowValues& lse, TileScales const& scales) {
    using namespace cute;
    Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), SmemLayoutK{});
    Tensor sVt = make_tensor(make_smem_ptr(vt_buffer(smem)), SmemLayoutVt{});  // (dv, kBlockN, stage)

    TiledMmaQK mma_qk;
    TiledMmaPV mma_pv;
    auto thr_qk = mma_qk.get_thread_slice(thread_idx);
    // The shared-memory descriptors come from the warpgroup's slice: an SS wgmma's operand layouts
    // do not depend on the thread within the warpgroup, so they equal the thread slice's, but
    // `consumer` is warp-uniform (canonical_warp_group_idx) where thread_idx is not. ptxas then keeps
    // Q's descriptors in uniform registers; from the thread slice it held them in vector registers
    // and moved a pair over (R2UR) before every S wgmma.
    auto warpgroup_qk = mma_qk.get_slice(consumer * kThreadsPerWarpGroup);
    auto warpgroup_pv = mma_pv.get_slice(consumer * kThreadsPerWarpGroup);
    Tensor tSrQ = warpgroup_qk.partition_fragment_A(sQ);   // (MMA, MMA_M, MMA_K) smem descriptors
    Tensor tSrK = warpgroup_qk.partition_fragment_B(sK);   // (MMA, MMA_N, MMA_K, stage)
    Tensor tOrV = warpgroup_pv.partition_fragment_B(sVt);  // (MMA, MMA_N, MMA_K, stage)
    // (row, col) within the score tile of each of this thread's S elements, in the rowcol view.
    Tensor coords = rowcol_view(thr_qk.partition_C(make_identity_tensor(Shape<BlockM, BlockN>{})));

    int const row_offset = m_block * kBlockM;
    // The query of each of this thread's score rows: computed once per tile where packed rows take a
    // division (held in registers across the key tiles), else on the spot.
    constexpr int kThreadRows = decltype(size<0>(coords))::value;
    cute::array<int, kThreadRows> packed_row_queries;
    if constexpr (kPackGqa) {
      CUTLASS_PRAGMA_UNROLL
      for (int m = 0; m < kThreadRows; ++m) {
        packed_row_queries[m] = params.rows.query(row_offset + get<0>(coords(m, 0)));
      }
    }
    auto const query_of = [&](int m) {
      if constexpr (kPackGqa) {
        return packed_row_queries[m];
      } else {
        return row_offset + get<0>(coords(m, 0));
      }
    };
    // Whether the scores are soft-capped: params.softcap, a uniform branch (bool), or known at
    // compile time (true_type / false_type) where the kernel serves one choice.
    auto const softcapped = [&] {
      if constexpr (kSoftcapChoice == SoftcapChoice::kNone) {
        return false_type{};
      } else if constexpr (kSoftcapChoice == SoftcapChoice::kSoftcap) {
        return true_type{};
      } else {
        return params.softcap;
      }
    };
    // The kept scores of key tile n_block: soft-capped, then masked. `softcap` as softcapped()
    // returns it, or known at compile time in a loop compiled per choice.
    auto scores_of = [&](auto& s_accum, int n_block, auto needs_mask, auto softcap, auto const& factors) {
      Tensor scores = rowcol_view(s_accum);  // (rows, cols)
      if (softcap) apply_softcap(scores, softcap_prescale(scales, factors));
      if constexpr (decltype(needs_mask)::value) apply_mask(mask, scores, coords, query_of, n_block * kBlockN);
      return scores;
    };
    // The softmax of key tile n_block (is_first: the tile's first), masked by chunks where
    // kMaskByChunks.
    // `factors`: tile_factors(scales, n_block), read before the S GEMM, so that the block scales'
    // loads run under it.
    auto softmax_update = [&](auto is_first, auto& s_accum, int n_block, auto needs_mask, auto softcap,
                              auto const& factors) {
      if constexpr (decltype(needs_mask)::value && kMaskByChunks) {
        static_assert(!(kFp8 && decltype(needs_mask)::value), "FP8 tiles are not masked by chunks");
        Tensor scores = scores_of(s_accum, n_block, false_type{}, softcap, factors);
        auto const columns = apply_mask_by_chunks<kMaskChunk>(mask, scores, coords, query_of, n_block * kBlockN);
        return softmax.template update<decltype(is_first)::value>(scores, columns);
      } else {
        Tensor scores = scores_of(s_accum, n_block, needs_mask, softcap, factors);
        return softmax.template update<decltype(is_first)::value>(scores, softmax_factors(factors, softcap));
      }
    };
    auto needs_mask = [&](int n_block) {
      return n_block >= blocks.right_masked_from || n_block < blocks.left_masked_below;
    };
    // The key tiles this warpgroup's own 64 rows see. With a band, an edge tile of the query tile
    // may hold no key of them (64-key tiles on the diagonal: the upper warpgroup's rows end a tile
    // before the lower one's); such a step would add P = 0 and leave the row statistics as they
    // are, so the warpgroup skips its GEMMs and softmax (skip_step) and gets the same bits.
    KeyBlocks const own_blocks = [&] {
      if constexpr (kSkipUnseenTiles) {
        int const first_row = row_offset + consumer * 64;
        return mask.template key_blocks<kBlockN>(params.rows.query(first_row), params.rows.query(first_row + 63));
      } else {
        return blocks;
      }
    }();
    auto sees_none = [&](int n_block) {
      return kSkipUnseenTiles && (n_block >= own_blocks.end || n_block < own_blocks.begin);
    };

    // P, the converted probabilities of the previous tile, as the register A operand of P V.
    Tensor s_first = partition_fragment_C(mma_qk, Shape<BlockM, BlockN>{});  // (MMA, MMA_M, MMA_N)
    Tensor p_regs = make_p_regs(s_first);

    q_full.wait(q_phase);
    int const first_block = blocks.first();
    int n_block = first_block;
    auto const first_factors = tile_factors(scales, n_block);
    MmaTurns::wait_turn(consumer);
    pipeline_k.consumer_wait(k_read);
    warpgroup_gemm</*kZeroInit=*/true, /*kWait=*/-1>(mma_qk, tSrQ, tSrK(_, _, _, k_read.index()), s_first);
    MmaTurns::pass_turn(consumer);
    warpgroup_wait<0>();
    pipeline_k.consumer_release(k_read);
    // Masked by chunks, the first softmax has a masked and an unmasked copy; elsewhere the mask
    // choice only selects the scores, and one copy of the softmax follows (the unmasked kernels'
    // machine code as before the chunks).
    if constexpr (kMaskByChunks) {
      if (needs_mask(n_block)) {
        softmax_update(/*is_first=*/true_type{}, s_first, n_block, true_type{}, softcapped(), first_factors);
      } else {
        softmax_update(/*is_first=*/true_type{}, s_first, n_block, false_type{}, softcapped(), first_factors);
      }
    } else {
      Tensor scores = needs_mask(n_block) ? scores_of(s_first, n_block, true_type{}, softcapped(), first_factors)
                                          : scores_of(s_first, n_block, false_type{}, softcapped(), first_factors);
      softmax.template update</*kIsFirst=*/true>(scores, softmax_factors(first_factors, softcapped()));
    }
    convert_p(s_first, p_regs);
    PipelineState v_read = k_read;  // V of the previous key tile, consumed by the pending P V
    ++k_read;
    // The walk: key tiles blocks.end - 1 down to blocks.begin, but first_block. Its last S GEMM is
    // this warpgroup's last read of Q. Where kReleaseQInWalk, the step that waits for it calls
    // q_read_done, so that the next tile's Q loads while the last softmax, P V and epilogue run.
    // Not with a band: there q_read_done reads the tile queue's next index, which inside the step
    // lengthens every step.
    n_block = first_block == blocks.end - 1 ? blocks.end - 2 : blocks.end - 1;
    int const last_walked = first_block == blocks.begin ? blocks.begin + 1 : blocks.begin;

    // The factor that takes O from the previous running max to the current one, owed after each
    // softmax and paid before the next P V (while the tensor cores run the next S GEMM).
    // O is still zero before the first P V, so any factor will do there.
    typename Softmax::RowValues o_scale = Softmax::unit_factors();
    auto step = [&](int n_block, auto needs_mask, auto softcap) {
      Tensor s_accum = partition_fragment_C(mma_qk, Shape<BlockM, BlockN>{});
      auto const factors = tile_factors(scales, n_block);
      MmaTurns::wait_turn(consumer);
      pipeline_k.consumer_wait(k_read);
      warpgroup_gemm<true, -1>(mma_qk, tSrQ, tSrK(_, _, _, k_read.index()), s_accum);
      Softmax::rescale(rowcol_view(o_accum), o_scale);
      pipeline_v.consumer_wait(v_read);
      warpgroup_gemm<false, -1>(mma_pv, p_regs, tOrV(_, _, _, v_read.index()), o_accum);
      MmaTurns::pass_turn(consumer);
      warpgroup_wait<1>();  // S retired; P V may still run
      pipeline_k.consumer_release(k_read);
      if constexpr (kReleaseQInWalk) {
        if (n_block == last_walked) q_read_done();
      }
      o_scale = softmax_update(/*is_first=*/false_type{}, s_accum, n_block, needs_mask, softcap, factors);
      warpgroup_wait<0>();  // P V retired: p_regs is free again
      pipeline_v.consumer_release(v_read);
      convert_p(s_accum, p_regs);
      v_read = k_read;
      ++k_read;
    };
    // A key tile of the query tile that this warpgroup's rows do not see (skip_key_tile). The P V
    // owed from the previous tile waits for the next step.
    auto skip_step = [&] { skip_key_tile(pipeline_k, pipeline_v, k_read, consumer); };
    // Only edge tiles can be unseen by one warpgroup: a whole tile is seen by every row of the tile.
    auto edge_step = [&](int n_block, auto softcap) {
      if (sees_none(n_block)) {
        skip_step();
      } else {
        step(n_block, true_type{}, softcap);
      }
    };
    walk_key_tiles(blocks, first_block, n_block, step, edge_step, softcapped, needs_mask);

    if (!kReleaseQInWalk || blocks.end - blocks.begin == 1) q_read_done();
    Softmax::rescale(rowcol_view(o_accum), o_scale);
    pipeline_v.consumer_wait(v_read);
    warpgroup_gemm<false, -1>(mma_pv, p_regs, tOrV(_, _, _, v_read.index()), o_accum);
    if constexpr (kTotalsUnderLastPV) {
      // The row sums are final: their quad reductions, reciprocals and logarithms run under the last P V.
      auto const totals = softmax.totals(scales.score_scale);
      warpgroup_wait<0>();
      pipeline_v.consumer_release(v_read);
      Softmax::rescale(rowcol_view(o_accum), scale_rows(totals.inv_sum, scales.o_scale));
      lse = totals.lse;
    } else {
      warpgroup_wait<0>();
      pipeline_v.consumer_release(v_read);
    }
  }
};

}  // namespace flashhop::sm90
