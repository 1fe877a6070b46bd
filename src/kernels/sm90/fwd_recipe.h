// The recipe of a compiled forward kernel configuration: every choice that tells one configuration
// from another, in named fields. The table of recipes (fwd_recipes.h) is generated from
// tools/forward_recipes.py, which documents each field's rule and each row's reason; the kernel
// templates, the plan, dispatch, validation and CMake all read it. Host-includable (no CuTe).
#pragma once

#include <cstdint>

namespace flashhop::sm90 {

enum class MaskKind : std::uint8_t {
  kNone,   // every query sees every key (NoMask: only the last key tile is clipped)
  kLocal,  // a causal or sliding-window band (LocalMask)
};

// Which of a head dim's tiles a call takes where it has more than one (plan.cpp chooses).
enum class TileChoice : std::uint8_t {
  kNarrowBand,  // the middle query row sees fewer than wide_band_keys(d) keys
  kWideBand,    // it sees at least that many (without a mask: seqlen_k does)
  kShortRows,   // too few query rows to fill the tall tiles
};

// How a consumer warpgroup walks the key tiles of a query tile (ForwardMainloop::walk_key_tiles).
enum class LoopShape : std::uint8_t {
  kSingle,                  // one loop, which branches on the mask per key tile
  kPerKind,                 // a loop per kind of key tile; soft-capping branched on inside
  kWholeTilesPerSoftcap,    // edge loops branch on soft-capping; whole tiles' loop once per choice
  kPerSoftcap,              // the whole walk once per soft-capping choice (no mask)
};

// Where the epilogue stages O in shared memory.
enum class OBuffer : std::uint8_t {
  kOwn,        // a buffer of its own
  kTakeTurns,  // one warpgroup's rows, which the two consumer warpgroups take in turn
  kInQ,        // Q's buffer, once the tile's S GEMMs have read Q
};

// Which round of equal tiles is split over the CTAs by keys (split_round.h).
enum class SplitPolicy : std::uint8_t { kNone, kSingleRound, kLastRound };

// Field order is the generated table's (tools/generate_instantiations.py checks it).
struct ForwardRecipe {
  const char* name;              // "hdim<d>[x<dv>]_<mask>[_packgqa|_<choice>]"
  int head_dim;                  // d of Q and K
  int head_dim_v;                // dv of V and O
  MaskKind mask;
  bool pack_gqa;                 // the query heads of a KV group packed into the tile rows
  TileChoice tile_choice;        // the choice this recipe serves
  int block_m;                   // query rows per CTA: 64 (one wgmma M atom) per consumer warpgroup
  int block_n;                   // key rows per K / V stage
  int stages;                    // depth of the K and V shared-memory rings
  bool mma_pingpong;             // consumers' GEMM issue ordered round robin (MmaScheduler)
  int softmax_chains;            // interleaved dependency chains of each row's max and sum
  bool mask_by_chunks;           // band tiles masked by warp column chunks of 32 keys (mask.h)
  LoopShape loop_shape;
  bool softcap_per_kernel;       // a kernel per soft-capping choice instead of a run-time branch
  bool fp8;                      // e4m3 Q, K and V (bfloat16 O), V transposed by producer warps
  OBuffer o_buffer;
  bool release_q_in_walk;        // Q's buffer released in the walk's last step, not after the walk
  bool prefetch_next_q;          // the next tile's Q prefetched into L2 by the producer
  bool totals_under_last_pv;     // row totals computed while the last P V runs
  bool skip_rows_past_end;       // a warpgroup whose rows all lie past the last row skips the tile
  bool skip_unseen_key_tiles;    // a warpgroup skips the band's edge key tiles its rows do not see
  SplitPolicy split;
  bool varlen;                   // also compiled for variable-length batches (the call's recipe then)
  int ptxas_register_usage_level;  // -1: ptxas's default (CMake passes the others per file)

  constexpr int consumer_warpgroups() const { return block_m / 64; }
  constexpr bool local() const { return mask == MaskKind::kLocal; }
};

// The tile choice a recipe of packed rows (and a head dim without tiles of its own for a choice)
// takes: narrow bands with a mask, wide without (the unmasked rows see all keys).
constexpr TileChoice default_tile_choice(bool local) {
  return local ? TileChoice::kNarrowBand : TileChoice::kWideBand;
}

// CTAs of a persistent grid per SM: two with one consumer warpgroup (64-row tiles, each CTA taking
// half the SM's registers), else one. The kernel's scheduler and the plan's workspace size both
// plan for num_sms times this many CTAs.
constexpr int ctas_per_sm(int consumer_warpgroups) { return consumer_warpgroups == 1 ? 2 : 1; }

// Tile rows per tile head (seqlen_q, or seqlen_q * g packed; 64-bit for the plan's bounds) and tile
// heads (query heads, or KV heads packed). The kernel and the plan count tiles with these.
constexpr std::int64_t tile_rows_per_head(int seqlen_q, int nheads, int nheads_kv, bool pack_gqa) {
  return pack_gqa ? std::int64_t{seqlen_q} * (nheads / nheads_kv) : seqlen_q;
}
constexpr int tile_heads_of(int nheads, int nheads_kv, bool pack_gqa) { return pack_gqa ? nheads_kv : nheads; }

}  // namespace flashhop::sm90
