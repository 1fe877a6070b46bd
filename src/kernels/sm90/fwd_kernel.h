// The sm90 forward kernel: wires the tile scheduler, the mainloop (producer and consumer halves)
// and the epilogue, and assigns warp roles and register budgets. Persistent: each CTA loops over
// its work tiles, the K/V pipeline states running on from tile to tile.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "kernels/sm90/barriers.h"
#include "kernels/sm90/epilogue.h"
#include "kernels/sm90/fwd_mainloop.h"
#include "kernels/sm90/fwd_params.h"
#include "kernels/sm90/softmax.h"
#include "kernels/sm90/split_combine.h"
#include "kernels/sm90/tile_scheduler.h"

namespace flashhop::sm90 {

template <class Mainloop_, class Epilogue_>
struct ForwardKernel {
  using Mainloop = Mainloop_;
  using Epilogue = Epilogue_;
  using Mask = typename Mainloop::Mask;
  using Element = typename Mainloop::Element;
  using Pipeline = typename Mainloop::Pipeline;
  static constexpr bool kVarlen = Mainloop::kVarlen;
  // Equal tiles are dealt statically in query-tile order; causal and window tiles from a queue, as
  // are a variable-length batch's, from its tile list.
  static constexpr bool kQueue = Mask::kIsLocal || kVarlen;
  using Scheduler = cute::conditional_t<
      kVarlen, VarlenScheduler, cute::conditional_t<Mask::kIsLocal, CausalScheduler, StaticPersistentScheduler>>;
  // Equal tiles of a fixed-length batch split their last round over the CTAs (split_round.h) as the
  // recipe allows, when the workspace holds it.
  static constexpr SplitPolicy kSplitPolicy = kVarlen ? SplitPolicy::kNone : Mainloop::kRecipe.split;
  static_assert(!kQueue || kSplitPolicy == SplitPolicy::kNone, "queued tiles split no round");
  // A variable-length batch's O goes out row by row (a TMA store would write past the sequence).
  static_assert(!kVarlen || !Epilogue::kTakeTurns, "variable-length batches store O from a buffer of their own or Q's");
  static constexpr bool kSplitRound = kSplitPolicy != SplitPolicy::kNone;
  using SplitMerge = SplitCombine<Mainloop::kHeadDimV, Mainloop::kConsumerWarpGroups>;
  // A part of a split tile may store nothing for one warpgroup and O for the other, which would
  // break the turns of an O buffer taken in turn.
  static_assert(!(kSplitRound && Epilogue::kTakeTurns), "a split round with an O buffer taken in turn");

  struct NoStorage {};
  // FP8's ring of transposed V (Vt): a base, so that the other kernels' storage stays as it is.
  struct VtRingStorage {
    typename Mainloop::PipelineV::SharedStorage pipeline_vt;  // full/empty barriers of the Vt ring
  };
  struct SharedStorage : cute::conditional_t<Mainloop::kFp8, VtRingStorage, NoStorage> {
    typename Mainloop::SharedStorage tensors;
    cute::conditional_t<Epilogue::kOwnBuffer, typename Epilogue::SharedStorage, NoStorage> epilogue;
    cutlass::arch::ClusterTransactionBarrier q_full;  // Q landed in shared memory
    cutlass::arch::ClusterBarrier q_free;             // Q's buffer may be refilled
    typename Pipeline::SharedStorage pipeline_k;      // full/empty barriers of the K ring
    typename Pipeline::SharedStorage pipeline_v;      // full/empty barriers of the V ring
    TileRing tiles;                                   // the queue's tile indices (causal and window masks)
  };
  static constexpr int kSharedBytes = sizeof(SharedStorage);
  static constexpr int kThreads = Mainloop::Roles::kThreads;
  // The roles that walk the tiles besides producer thread 0: every consumer thread, the lanes of
  // the warp that gathers packed Q, and the threads that transpose V (FP8).
  static constexpr int kTileReaders = Mainloop::Roles::kConsumerThreads + (Mainloop::kPackGqa ? 32 : 0) +
                                      Mainloop::Roles::kTransposeThreads;
  using Tile = cute::conditional_t<kVarlen, VarlenTile, ForwardTile>;
  static_assert(kSharedBytes <= 227 * 1024, "tile configuration exceeds the 227 KB of shared memory per CTA");
  // The persistent grids count on kCtasPerSm CTAs per SM: 228 KB per SM, 1 KB of it reserved per CTA.
  static_assert(Mainloop::Roles::kCtasPerSm * (kSharedBytes + 1024) <= 228 * 1024,
                "the CTAs that the persistent grid puts on one SM do not fit its shared memory");

  struct Params {
    typename Mainloop::Params mainloop;
    typename Epilogue::Params epilogue;
    Mask mask;
    typename Scheduler::Params scheduler;
    typename SplitMerge::Params split;  // null pointers unless the scheduler splits a round
  };

  static Params to_params(ForwardParams const& p) {
    // The persistent grids take kCtasPerSm CTAs per SM.
    typename Scheduler::Params const scheduler = make_scheduler_params(p, p.num_sms * Mainloop::Roles::kCtasPerSm);
    typename SplitMerge::Params split{nullptr, nullptr};
    if constexpr (kSplitRound) split = SplitMerge::to_params(p.workspace, scheduler.split);
    return {Mainloop::to_params(p), Epilogue::to_params(p), make_mask(p), scheduler, split};
  }

  // For a variable-length batch, the mask of the longest sequences, whose band widths the masks of
  // each sequence take (tile_mask).
  static Mask make_mask(ForwardParams const& p) {
    if constexpr (Mask::kIsLocal) {
      return {p.seqlen_q, p.seqlen_k, p.window_left, p.window_right};
    } else {
      return {p.seqlen_q, p.seqlen_k};
    }
  }

  // The mask of a tile: a fixed-length batch's is the call's, a variable-length batch's tile has its
  // sequence's (by overload: a copy only for the latter).
  static CUTLASS_DEVICE Mask const& tile_mask(Params const& params, ForwardTile) { return params.mask; }
  static CUTLASS_DEVICE Mask tile_mask(Params const& params, VarlenTile const& tile) {
    Mask mask = params.mask;
    mask.seqlen_q = tile.span.seqlen_q;
    mask.seqlen_k = tile.span.seqlen_k;
    return mask;
  }
  // The tile's sequence in O and LSE, its first query and its tile rows, for the epilogue.
  static CUTLASS_DEVICE OutputRows row_span(Params const& params, Tile const& tile) {
    if constexpr (kVarlen) {
      return {tile.span.q_begin, params.mainloop.rows.rows_of(tile.span.seqlen_q)};
    } else {
      return {};
    }
  }
  static CUTLASS_DEVICE RowOffsets row_offsets(Tile const& tile) {
    if constexpr (kVarlen) {
      return {tile.span.q_begin, tile.span.k_begin, tile.span.seqlen_k};
    } else {
      return {};
    }
  }

  // ctas: the persistent grid's size at most.
  static typename Scheduler::Params make_scheduler_params(ForwardParams const& p, int ctas) {
    int const heads = Mainloop::Rows::tile_heads(p.nheads, p.nheads_kv);
    if constexpr (kVarlen) {
      std::int64_t const bound = std::int64_t{num_m_blocks(p)} * heads * p.batch * p.num_splits;
      return Scheduler::to_params(static_cast<int*>(p.workspace), p.batch, heads, p.num_splits, bound, ctas,
                                  sequences_of(p));
    } else if constexpr (Mask::kIsLocal) {
      // The K and V of one KV head, which the scheduler's tail group keeps in L2.
      std::int64_t const kv_bytes =
          std::int64_t{p.seqlen_k} * (Mainloop::kHeadDim + Mainloop::kHeadDimV) * sizeof(Element);
      return Scheduler::to_params(num_m_blocks(p), heads, p.batch, static_cast<int*>(p.workspace), ctas,
                                  kv_bytes, heads / p.nheads_kv, p.l2_bytes);
    } else {
      int const key_tiles = (p.seqlen_k + Mainloop::kBlockN - 1) / Mainloop::kBlockN;
      return Scheduler::to_params(num_m_blocks(p), heads, p.batch, ctas, key_tiles,
                                  p.workspace != nullptr ? kSplitPolicy : SplitPolicy::kNone);
    }
  }

  static VarlenSequences sequences_of(ForwardParams const& p) {
    return {p.cu_seqlens_q, p.cu_seqlens_k, p.seqused_q, p.seqused_k, p.leftpad_k,
            p.total_q,      p.total_k,      p.seqlen_q,  p.seqlen_k};
  }

  static int num_m_blocks(ForwardParams const& p) {
    int const rows = Mainloop::Rows::make(p.seqlen_q, p.nheads, p.nheads_kv).rows;
    return (rows + Mainloop::kBlockM - 1) / Mainloop::kBlockM;
  }

  // Calls visit(index, take_next) for each of the CTA's tiles in order; take_next() returns the
  // NextTile after it, the same on every call. A role calls take_next where it needs to know that
  // tile; walk_tiles calls it after `visit` otherwise. With the queue, producer thread 0 (`taker`)
  // takes the index once it has issued the tile's loads, and the other roles get it through `ring`.
  // tile_loads(index): whether tile `index` loads anything.
  template <class TileLoads, class Visit>
  static CUTLASS_DEVICE void walk_tiles(typename Scheduler::Params const& scheduler, TileRing& ring, bool taker,
                                        TileLoads const& tile_loads, Visit const& visit) {
    int first;
    if constexpr (kQueue) {
      first = Scheduler::first_tile(scheduler);
    } else {
      first = Scheduler::template first_tile<kSplitRound>(scheduler, blockIdx.x);
    }
    for (int index = first, t = 0; Scheduler::has_tile(scheduler, index); ++t) {
      NextTile next{-1, false};
      bool have_next = false;
      auto const take_next = [&] {
        if (have_next) return next;
        have_next = true;
        if constexpr (kQueue) {
          if (taker) {
            int const taken = Scheduler::take_next_tile(scheduler);
            next = {taken, tile_loads(taken)};
            ring.publish(t, next);
          } else {
            next = ring.take(t);
          }
        } else {
          int const following = Scheduler::template next_tile<kSplitRound>(scheduler, blockIdx.x, index);
          next = {following, tile_loads(following)};
        }
        return next;
      };
      // One call site of `visit`: it inlines the role's whole tile, and two copies made ptxas spill.
      visit(index, take_next);
      index = take_next().index;
    }
  }

  // The ring the consumers read V^T from: with FP8 Vt's, else V's.
  template <class VtRing>
  static CUTLASS_DEVICE auto& v_read_ring(VtRing& vt_ring, Pipeline& pipeline_v) {
    if constexpr (Mainloop::kFp8) {
      return vt_ring;
    } else {
      return pipeline_v;
    }
  }

  CUTLASS_DEVICE void operator()(Params const& params, unsigned char* smem_buf) const {
    using namespace cute;
    SharedStorage& shared = *reinterpret_cast<SharedStorage*>(smem_buf);
    using Roles = typename Mainloop::Roles;
    int const warp_group = cutlass::canonical_warp_group_idx();  // 0: producer, 1 ..: consumers
    // The key tiles of tile `index`: those its mask leaves, or a part's or a split's share of them.
    auto const key_blocks = [&](int index, Tile const& tile) {
      KeyBlocks blocks = Mainloop::key_blocks(params.mainloop, tile_mask(params, tile), tile.m_block);
      if constexpr (kVarlen) {
        // Split s of n takes the key tiles from s / n to (s + 1) / n of the way; some may get none.
        int const splits = params.scheduler.num_splits;
        if (splits > 1) {
          std::int64_t const count = cute::max(blocks.end - blocks.begin, 0);
          int const begin = blocks.begin;
          blocks.begin = begin + static_cast<int>(count * tile.split / splits);
          blocks.end = begin + static_cast<int>(count * (tile.split + 1) / splits);
        }
      }
      if constexpr (kSplitRound) {
        if (Scheduler::is_part(params.scheduler, index)) {
          SplitRound::Part const part = Scheduler::part(params.scheduler, index);
          blocks.begin = part.key_begin;
          blocks.end = part.key_end;
        }
      }
      return blocks;
    };
    // A tile whose query rows see no key loads nothing; its epilogue still writes O = 0, LSE = -inf.
    auto const tile_loads = [&](int index) {
      return Scheduler::has_tile(params.scheduler, index) &&
             !key_blocks(index, Scheduler::tile(params.scheduler, index)).empty();
    };

    // q_free is arrived by each consumer warpgroup (Epilogue::kQFreeArrivalsPerWarpGroup threads of
    // it): once its rows of O have been stored from Q's buffer, or, with a buffer of its own for O,
    // once it no longer reads Q.
    if (threadIdx.x == 0) {
      shared.q_full.init(Mainloop::kQFullArrivals);
      shared.q_free.init(Roles::kConsumers * Epilogue::kQFreeArrivalsPerWarpGroup);
      if constexpr (kQueue) shared.tiles.init(kTileReaders);
    }
    auto const pipeline_params = [&](std::uint32_t tile_bytes, int consumers) {
      typename Pipeline::Params ring;
      ring.transaction_bytes = tile_bytes;
      ring.role = warp_group == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
      ring.is_leader = threadIdx.x == 0;
      ring.num_consumers = consumers;
      return ring;
    };
    // The constructors initialise the barriers (warp 0) and fence the initialisation. With FP8 the
    // transposer warps read V's ring, and the consumers Vt's.
    int const v_readers = Mainloop::kFp8 ? Roles::kTransposeThreads : Roles::kConsumerThreads;
    bool const transposer = warp_group == 0 && cutlass::canonical_warp_idx_sync() >= Roles::kFirstTransposeWarp;
    Pipeline pipeline_k(shared.pipeline_k, pipeline_params(Mainloop::kKTileBytes, Roles::kConsumerThreads),
                        Shape<_1, _1, _1>{});
    typename Pipeline::Params v_ring = pipeline_params(Mainloop::kVTileBytes, v_readers);
    if constexpr (Mainloop::kFp8) {
      if (transposer) v_ring.role = Pipeline::ThreadCategory::Consumer;  // V's readers, in the producer warpgroup
    }
    Pipeline pipeline_v(shared.pipeline_v, v_ring, Shape<_1, _1, _1>{});
    auto vt_ring = [&] {
      if constexpr (Mainloop::kFp8) {
        using PipelineV = typename Mainloop::PipelineV;
        typename PipelineV::Params ring;
        ring.role = transposer ? PipelineV::ThreadCategory::Producer : PipelineV::ThreadCategory::Consumer;
        ring.producer_arv_count = Roles::kTransposeThreads;
        ring.consumer_arv_count = Roles::kConsumerThreads;
        return PipelineV(shared.pipeline_vt, ring);
      } else {
        return NoStorage{};
      }
    }();
    // The ring the consumers read V^T from.
    auto& pipeline_v_read = v_read_ring(vt_ring, pipeline_v);
    // Every barrier is initialised before any thread waits on or arrives at one.
    __syncthreads();

    // Q's buffer is handed back and forth once per loading tile: the tile before a loading tile
    // releases it (q_free), the producer refills it (q_full). Both sides walk the same tiles and
    // count the hand-overs the same way, so neither runs two phases ahead of the other.
    if (warp_group == 0) {
      cutlass::arch::warpgroup_reg_dealloc<Roles::kProducerRegisters>();
      // Calls load(tile, blocks, wait_q_free, take_next) for each of the CTA's tiles that loads
      // anything (take_next as in walk_tiles).
      auto const for_each_loading_tile = [&](bool taker, auto const& load) {
        int q_free_phase = 0;
        bool first = true;
        walk_tiles(params.scheduler, shared.tiles, taker, tile_loads, [&](int index, auto const& take_next) {
          Tile const tile = Scheduler::tile(params.scheduler, index);
          KeyBlocks const blocks = key_blocks(index, tile);
          // The CTA's first tile finds the buffer unused; later ones wait until the tile before releases it.
          auto const wait_q_free = [&] {
            if (first) return;
            shared.q_free.wait(q_free_phase);
            q_free_phase ^= 1;
          };
          if (!blocks.empty()) load(tile, blocks, wait_q_free, take_next);
          first = false;
        });
      };
      // Thread 0 issues the TMA loads of K and V (and of Q unless packed); warp 1 gathers packed Q.
      if (threadIdx.x == 0) {
        Mainloop::prefetch_tma_descriptors(params.mainloop);
        typename Mainloop::PipelineState write = cutlass::make_producer_start_state<Pipeline>();
        for_each_loading_tile(/*taker=*/true, [&](Tile const& tile, KeyBlocks const& blocks,
                                                  auto const& wait_q_free, auto const& take_next) {
          Mainloop::load(params.mainloop, shared.tensors, shared.q_full, pipeline_k, pipeline_v, write, tile.m_block,
                         tile.head, tile.batch, blocks, wait_q_free, row_offsets(tile));
          // The next tile is taken here rather than after the walk's step: the same place, as load
          // returns once it has issued the tile's last K/V.
          if constexpr (Mainloop::kPrefetchNextQ) {
            NextTile const next = take_next();
            if (next.loads) {
              Tile const following = Scheduler::tile(params.scheduler, next.index);
              Mainloop::prefetch_q(params.mainloop, following.m_block, following.head, following.batch,
                                   row_offsets(following));
            }
          }
        });
      }
      // With FP8 warps 2 and 3 transpose each V stage into Vt's ring, tile by tile in load order.
      if constexpr (Mainloop::kFp8) {
        if (transposer) {
          int const thread = threadIdx.x - Roles::kFirstTransposeWarp * 32;
          typename Mainloop::PipelineState v_read;
          typename Mainloop::PipelineState vt_write = cutlass::make_producer_start_state<typename Mainloop::PipelineV>();
          for_each_loading_tile(/*taker=*/false, [&](Tile const&, KeyBlocks const& blocks, auto const&, auto const&) {
            Mainloop::transpose_v(shared.tensors, pipeline_v, vt_ring, v_read, vt_write, blocks.end - blocks.begin,
                                  thread);
          });
        }
      }
      if constexpr (Mainloop::kPackGqa) {
        if (cutlass::canonical_warp_idx_sync() == 1) {
          int const lane = threadIdx.x % 32;
          for_each_loading_tile(/*taker=*/false, [&](Tile const& tile, KeyBlocks const&,
                                                     auto const& wait_q_free, auto const&) {
            wait_q_free();
            Mainloop::load_q_packed(params.mainloop, shared.tensors, shared.q_full, tile, lane);
          });
        }
      }
    } else {
      cutlass::arch::warpgroup_reg_alloc<Roles::kConsumerRegisters>();
      int const consumer = warp_group - 1;
      int const thread_idx = threadIdx.x - kThreadsPerWarpGroup;
      typename Mainloop::PipelineState read;
      int q_full_phase = 0;
      Mainloop::MmaTurns::init(consumer);
      Epilogue::init(thread_idx);
      walk_tiles(params.scheduler, shared.tiles, /*taker=*/false, tile_loads, [&](int index, auto const& take_next) {
        Tile const tile = Scheduler::tile(params.scheduler, index);
        KeyBlocks const blocks = key_blocks(index, tile);
        // Whether the next tile loads, so that the producer waits for this tile to release Q's
        // buffer (q_free). Statically dealt tiles know it at once; from the queue it is known once
        // producer thread 0 has taken the next index, after issuing this tile's last loads.
        bool release_q = false;
        if constexpr (Mainloop::kReleaseQInWalk) release_q = take_next().loads;
        // With its own O buffer, Q is free once this warpgroup's S GEMMs are done (or at once when
        // the tile loads nothing). With kReleaseQInWalk called inside the walk's last step: kept small.
        auto const q_read_done = [&] {
          if constexpr (!Mainloop::kReleaseQInWalk) release_q = take_next().loads;
          if (Epilogue::kOwnBuffer && release_q && thread_idx % kThreadsPerWarpGroup == 0) shared.q_free.arrive();
        };
        // For a warpgroup that stores nothing of the tile: O never passes through Q's buffer, so the
        // warpgroup is done with it (with a buffer of its own for O, q_read_done released it).
        auto const release_q_without_store = [&] {
          if (!Epilogue::kOwnBuffer && release_q &&
              thread_idx % kThreadsPerWarpGroup < Epilogue::kQFreeArrivalsPerWarpGroup) {
            shared.q_free.arrive();
          }
        };
        // A warpgroup whose rows all lie past the last row computes and stores nothing.
        if constexpr (Mainloop::kSkipRowsPastEnd) {
          if (Mainloop::rows_past_end(params.mainloop, tile, consumer)) {
            if (!blocks.empty()) {
              Mainloop::skip_tile(shared.q_full, q_full_phase, pipeline_k, pipeline_v_read, read, consumer, blocks);
              q_full_phase ^= 1;
            }
            q_read_done();
            release_q_without_store();
            return;
          }
        }
        typename Mainloop::TiledMmaPV mma_pv;
        Tensor o_accum = partition_fragment_C(mma_pv, Shape<typename Mainloop::BlockM, typename Mainloop::HeadDimV>{});
        clear(o_accum);
        constexpr int kRows = decltype(size<0>(rowcol_view(o_accum)))::value;
        typename Mainloop::TileScales const scales =
            Mainloop::tile_scales(params.mainloop, tile.head, params.mainloop.rows.kv_head(tile.head), tile.batch,
                                  tile.m_block, consumer);
        OnlineSoftmax<kRows, Mainloop::kRecipe.softmax_chains> softmax(scales.score_scale_log2);
        // The rows' LSE, and O normalised: by the mainloop where it finalizes under its last P V
        // (kTotalsUnderLastPV), else after the branch below (inside it, ptxas would move the
        // finalize above the last P V's wait).
        typename decltype(softmax)::RowValues lse;
        auto const finalize = [&] {
          auto const totals = softmax.totals(scales.score_scale);
          decltype(softmax)::rescale(rowcol_view(o_accum), Mainloop::scale_rows(totals.inv_sum, scales.o_scale));
          lse = totals.lse;
        };
        if (!blocks.empty()) {
          Mainloop::mma(params.mainloop, shared.tensors, tile_mask(params, tile), shared.q_full, q_full_phase,
                        pipeline_k, pipeline_v_read, read, o_accum, softmax, thread_idx, consumer, tile.m_block,
                        blocks, q_read_done, lse, scales);
          q_full_phase ^= 1;
        } else {
          q_read_done();
          if constexpr (Mainloop::kTotalsUnderLastPV) finalize();
        }
        if constexpr (!Mainloop::kTotalsUnderLastPV) finalize();
        if constexpr (kSplitRound) {
          // A part of a split tile: unless it is the tile's first part in key order, which takes
          // over the merged O and LSE of all parts, it stores nothing.
          int const rows = Mainloop::rows_in_warpgroup(params.mainloop, tile, consumer);
          if (Scheduler::is_part(params.scheduler, index) &&
              !SplitMerge::merge(params.split, params.scheduler.split, Scheduler::part(params.scheduler, index),
                                 index - params.scheduler.num_tiles, rows, o_accum, lse, thread_idx, consumer)) {
            release_q_without_store();
            return;
          }
        }
        if constexpr (kVarlen) {
          // A split by keys leaves its partial result for the combine kernel, not O.
          if (params.scheduler.num_splits > 1) {
            Epilogue::store_partial(params.epilogue, o_accum, lse, thread_idx, tile.m_block, tile.head, tile.split,
                                    row_span(params, tile));
            release_q_without_store();
            return;
          }
        }
        typename Epilogue::Element* const smem_o = [&] {
          if constexpr (Epilogue::kOwnBuffer) {
            return shared.epilogue.o.data();
          } else {
            return shared.tensors.q.data();
          }
        }();
        Epilogue::store(params.epilogue, smem_o, o_accum, lse, thread_idx, tile.m_block, tile.head, tile.batch,
                        shared.q_free, release_q, row_span(params, tile));
      });
      Mainloop::MmaTurns::finish(consumer);
      Epilogue::finish(thread_idx);
    }
  }
};

template <class Kernel>
__global__ void __launch_bounds__(Kernel::kThreads, Kernel::Mainloop::Roles::kCtasPerSm)
    forward_kernel(CUTE_GRID_CONSTANT typename Kernel::Params const params) {
  extern __shared__ __align__(1024) unsigned char smem_buf[];
  Kernel{}(params, smem_buf);
}

}  // namespace flashhop::sm90
