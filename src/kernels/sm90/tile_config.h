// Tile sizes of the sm90 forward kernel: one constexpr function, each choice with its reason.
// Host-includable (no CuTe), so the host tests can check the selection.
#pragma once

#include <cstdint>

namespace flashhop::sm90 {

struct ForwardTileConfig {
  int block_m;  // query rows per CTA: 64 (one wgmma M atom) per consumer warpgroup, of two or three
  int block_n;  // key rows per K/V stage: the N of S = Q K^T and the K of O = P V
  int stages;   // depth of the K and V shared-memory rings
  bool mma_pingpong;  // order the consumers' GEMM issue round robin with named barriers (MmaScheduler)
  int softmax_chains = 1;  // interleaved dependency chains of each row's max and sum (softmax.h)
  // With a mask, the masked key tiles are masked by warp column chunks (mask.h, fwd_mainloop.h).
  bool mask_by_chunks = false;
};

// Which of a head dim's sets of tiles a call takes, where it has more than one (has_own_tiles):
// by the width of the band (wide_band_keys) or, at some head dims, by the query rows.
enum class TileChoice : std::uint8_t {
  kNarrowBand,  // the middle query row sees fewer than wide_band_keys(d) keys
  kWideBand,    // it sees at least that many (without a mask: seqlen_k does)
  kShortRows,   // too few query rows to fill the tall tiles (d = 64 without a mask, d = 128)
};

// The tile choice of the kernels that take none (packed GQA rows, and head dims whose tiles do not
// depend on it): narrow bands with a mask, wide without (the unmasked kernel's rows see all keys,
// mostly many).
constexpr TileChoice default_tile_choice(bool local) {
  return local ? TileChoice::kNarrowBand : TileChoice::kWideBand;
}

// Whether head dim d has tiles of its own for short query rows (64 rows, two CTAs per SM): d = 64
// without a mask and d = 128 (tile_choice says when rows are short).
constexpr bool has_short_row_tiles(int head_dim, bool local) {
  return (head_dim <= 64 && !local) || (head_dim > 96 && head_dim <= 128);
}

// 228 KB of shared memory per SM, of which one CTA may use 227 KB. The CTA holds Q (block_m x d),
// `stages` K tiles (block_n x d) and `stages` V tiles (block_n x dv); O (block_m x dv) gets a buffer
// of its own where it fits, else it reuses Q's.
// Registers per consumer thread (after setmaxnreg: 240 with two consumer warpgroups, 160 with
// three, 232 with one): S = block_n / 2 floats, O = dv / 2 floats, P = block_n / 4 packed
// registers, plus the next S while softmax of the current one runs.
// The tiles depend on d, the mask kind and the tile choice alone (d = 192 serves dv = 192 and 128);
// `local`: a causal or sliding-window mask (LocalMask); `choice` (tile_choice below): whether the
// query rows see many keys (wide_band_keys): with a mask, the band's middle row does; without one,
// each row sees all seqlen_k keys, a band as wide as the keys; or whether the query rows are too
// few for the tall tiles. Some head dims take tiles of their own for some choices: d = 64 taller
// query tiles for wide bands, d = 256 64-key tiles for narrow ones, d = 128 masking by chunks on
// narrow bands; d = 64 without a mask and d = 128 shorter query tiles for short rows. Packed GQA
// rows (`pack_gqa`) take no such choice (default_tile_choice); at d = 64 they have tiles of their
// own.
constexpr ForwardTileConfig forward_tile_config(int head_dim, bool local, TileChoice choice, bool pack_gqa) {
  // Short query rows take the default choice's tiles where the head dim has none of its own.
  if (choice == TileChoice::kShortRows && !has_short_row_tiles(head_dim, local)) choice = default_tile_choice(local);
  bool const wide_band = choice == TileChoice::kWideBand;
  bool const short_rows = choice == TileChoice::kShortRows;
  if (head_dim <= 64) {
    // Non-causal: three consumer warpgroups (192 query rows, 160 registers each: S 64 + P 32 + O 32
    // live floats), so each K/V tile serves 1.5 times the rows and each warpgroup's softmax hides
    // behind two others' GEMMs. smem: Q 24 KB + 2 x (K 16 KB + V 16 KB) + O 24 KB = 112 KB.
    // H200, same session, against two warpgroups with N = 192: +17% at seqlen 512, +11% at 1k,
    // +7% at 16k (512 TFLOP/s); 3 stages instead of 2 changed nothing.
    // Causal and local: two warpgroups of 128 x 128; a 192-row tile wastes more of the diagonal
    // tiles. Wide bands (wide_band_keys) take the 192-row tile: H200, same session, causal, against
    // 128 x 128: 512 -11%, 1k -16%, 2k -3%, 4k -1%, 8k +4%, 16k +3%. Once its warpgroups skip the
    // edge key tiles and the padding rows that they do not need (fwd_mainloop.h), another session,
    // causal against 128 x 128: 512 -6%, 1k -3 to -4%, 2k +4%, 4k +5 to +6%; window (1024, 0) at 8k
    // +3.5%; and against the 192-row tile without the skips, 8k and 16k +1 to +2%.
    // Softmax chains: a running max or sum over a thread's 32 columns is a chain of 32 dependent
    // instructions per row, which the two rows of a thread and the three warps of a scheduler
    // cannot hide (ncu, non-causal 16k: the fixed-latency "wait" stall the largest, 25% of the
    // samples, with the tensor pipe 58% busy). Four chains, H200, same session: non-causal +2 to
    // +4% at every length (16k 503 -> 521 TFLOP/s); the band kernels lost 1-7% (the wide one
    // spilled 88 bytes instead of 40), so they keep one.
    // Packed GQA rows: 64-row tiles with one consumer warpgroup and two CTAs per SM (WarpGroups;
    // smem: Q 8 KB + 2 x (K 16 KB + V 16 KB) + O 8 KB = 80 KB each), so that one CTA's tile
    // boundary (Q gathered by cp.async, O stored row by row) overlaps the other's key tiles. H200,
    // same session, against the tiles below: 8 x 128 queries on 1024 keys, 32 / 8 heads, causal
    // +11%, without a mask +43%; 4 x 16 queries on 8192 keys, 32 / 4 heads, causal +19%. Unpacked
    // rows lost on them (each K/V tile then serves 64 rows): causal 512 level, 1k to 4k -2 to -6%;
    // without a mask, seqlen 512 / 1k / 2k -9 / -7 / -15%, but not where the query rows fill the
    // 192-row tiles badly (tile_choice: short rows): those take them too.
    // Masks by chunks everywhere (d = 64's softmax is as long as its GEMMs; fwd_mainloop.h).
    if (pack_gqa || (!local && short_rows)) return {64, 128, 2, false, local ? 1 : 4, true};
    if (!local) return {192, 128, 2, true, 4, true};
    if (wide_band) return {192, 128, 2, true, 1, true};
    return {128, 128, 2, true, 1, true};
  }
  if (head_dim <= 96) {
    // As d = 64, whose N = 192 the registers still allow: S 96 + P 48 + O 48 live floats.
    // smem: Q 24 KB + 2 x (K 36 KB + V 36 KB) + O 24 KB = 192 KB.
    return {128, local ? 128 : 192, 2, true};
  }
  if (head_dim <= 128) {
    // smem: Q 32 KB + 2 x (K 32 KB + V 32 KB) + O 32 KB = 192 KB. Registers: S 64 + P 32 + O 64 live
    // floats. Non-causal N = 176 (full-width wgmma, O aliased on Q), H200, same session, against 128:
    // 16k 639 vs 626 TFLOP/s, 4k 600 vs 617, 1k 495 vs 540, 512 397 vs 444, so 128.
    // Four softmax chains without a mask, as d = 64 (H200, same session, against one: 512 -2.4%,
    // 1k +4.3%, 2k +2.0%, 4k to 16k level; at d = 256 level everywhere, so one there).
    // Short query sequences (tile_choice: the query rows, not the keys) take 64 x 64 tiles with one
    // consumer warpgroup and two CTAs per SM, as d = 64's (smem: Q 16 KB + 2 x (K 16 KB + V 16 KB) +
    // O 16 KB = 96 KB each). H200, same session, against 128 x 128, batch 8: 32 heads (MHA), 64
    // causal queries over 1024 keys +16%, 150 over 1024 +10%, 192 over 8192 +3% (causal +8%), 16
    // causal over 8192 +4%, decoding level (bound by K/V bandwidth); 32 query heads on 8 KV heads
    // unpacked, 1 or 16 queries over 8192 keys +44 to +52%. Where the rows fill 128-row tiles, 0.80
    // to 0.90 without a mask and 0.84 to 1.01 causal (seqlen 512 to 16k). Packed GQA rows keep
    // 128 x 128: on 64 x 64 tiles they gained 2.5 to 17% on decoding and over 1024 keys, but lost 5
    // to 16% on 32 to 128 queries over 2048 to 8192 keys and 6% on one sequence over 32k keys.
    // Narrow bands mask by chunks: H200, two sessions, causal against masking every column: 512
    // +3.2 / +0.6%, 1k +3.1 / +1.1%, 2k level / +1.2%; window (1024, 0) at 8k +3.8 / +1.7%; but
    // 16k -1.3% (in the first; wide bands, which keep masking every column). Packed rows keep
    // masking every column (not measured).
    if (!pack_gqa && short_rows) return {64, 64, 2, false, local ? 1 : 4};
    return {128, 128, 2, true, local ? 1 : 4, local && !pack_gqa && choice == TileChoice::kNarrowBand};
  }
  if (head_dim <= 192) {
    // The widest N (a multiple of 16) that fits two stages: dv = 192: Q 48 KB + 2 x (K 42 KB +
    // V 42 KB) = 216 KB with O aliased on Q; dv = 128: Q 48 + 2 x (42 + 28) + O 32 = 220 KB.
    return {128, 112, 2, true};
  }
  // d = 256: Q 64 KB + 2 x (K 40 KB + V 40 KB) = 224 KB, the most that fits with O aliased on Q;
  // on 64-key tiles, 192 KB leave room for one warpgroup's rows of O (32 KB), which the two
  // consumer warpgroups take in turn without a mask (fwd_mainloop.h, kTakeTurnsO).
  // O alone takes 128 registers per thread, so S stays small (40 floats). Ping-pong on against off
  // (H200, same session): non-causal 1k 575 vs 564 TFLOP/s, 16k 691 vs 694; causal 1k 353 vs 341,
  // 16k 671 vs 667; d = 192, 4k: 664 vs 660. Kept on for both.
  // Narrow bands take key tiles of 64: 512 keys are then 8 whole tiles instead of 7 with the last
  // 40% full, and the diagonal wastes less. H200, same session, 64 against 80: causal 512 +8.4%,
  // 1k +4.5%, 2k +3.5%, 4k -3.8%, 16k -4.8%; sliding window (256, 256) at 8k +4.8%, (1024, 0)
  // -1.0%; without a mask 512 +5%, 1k to 16k level to -1.4%. As taken for bands (64 for narrow
  // ones, 80 from wide_band_keys), against 80 throughout, another session: causal 512 +10%, 1k
  // +4.1%, 2k -1.9% (within that run's noise), 4k to 16k level. Without a mask the same split by
  // seqlen_k, 64 below wide_band_keys, against 80 throughout (H200, same session): 512 +5.3%, 1k
  // +0.5%.
  if (!wide_band) return {128, 64, 2, true};
  return {128, 80, 2, true};
}

// Tile rows per tile head (seqlen_q, or seqlen_q * g packed; 64-bit for the API's overflow checks)
// and tile heads (query heads, or KV heads packed). The kernel's tiles and the API's workspace plan
// (flashhop.cpp) both count with these (query_rows.h maps the rows).
constexpr std::int64_t tile_rows_per_head(int seqlen_q, int nheads, int nheads_kv, bool pack_gqa) {
  return pack_gqa ? std::int64_t{seqlen_q} * (nheads / nheads_kv) : seqlen_q;
}
constexpr int tile_heads_of(int nheads, int nheads_kv, bool pack_gqa) { return pack_gqa ? nheads_kv : nheads; }

// CTAs of a persistent grid per SM: two with one consumer warpgroup (64-row tiles, each CTA taking
// half the SM's registers), else one. The kernel's scheduler and the API's workspace size both plan
// for num_sms times this many CTAs.
constexpr int ctas_per_sm(int consumer_warpgroups) { return consumer_warpgroups == 1 ? 2 : 1; }

constexpr bool operator==(ForwardTileConfig const& a, ForwardTileConfig const& b) {
  return a.block_m == b.block_m && a.block_n == b.block_n && a.stages == b.stages &&
         a.mma_pingpong == b.mma_pingpong && a.softmax_chains == b.softmax_chains &&
         a.mask_by_chunks == b.mask_by_chunks;
}

// How a kernel takes the call's soft-capping (softcap > 0): one kernel for both, which branches
// on it per tile walk, or a kernel per choice that holds only that choice's code (launch_forward
// picks by the call's softcap).
enum class SoftcapChoice : std::uint8_t { kAtRunTime, kNone, kSoftcap };

// Whether a configuration compiles a kernel per soft-capping choice (two kernels in its file):
// d = 64 without a mask on 192-row tiles, whose walk loops, with both choices compiled in one
// kernel, ran 1 to 3% slower without soft-capping (H200, PERFORMANCE.md, forty-second session:
// a build without soft-capping code, 4 rounds, seqlen 512 +1.2%, 1k and 2k +3.3%, 4k to 16k +1.7
// to +2.2%) than in a kernel of their own; and d = 128 without a mask on 128-row tiles (H200,
// forty-third session, 4 rounds against one kernel for both: 16k +2.8% in every round, 8k +0.7%,
// 4k +0.4%, 2k / 1k / 512 -0.6 / -0.4 / -1.0%; soft-capped 1k / 8k +0.9 / +1.9%). d = 256's
// kernels and the band kernels of d = 64 and 128 timed level with a kernel per choice (same
// session); d = 96 and 192 were not timed.
constexpr bool softcap_per_kernel(int head_dim, bool local, TileChoice choice, bool pack_gqa) {
  bool const own_kernels = head_dim <= 64 || (head_dim > 96 && head_dim <= 128);
  return own_kernels && !local && !pack_gqa && choice == TileChoice::kWideBand;
}

// A band is wide when its middle query row sees at least this many keys (make_forward_params):
// causal with seqlen_q = seqlen_k from 2k at d = 64, where its 192-row tiles gain, and from 4k at
// d = 256, where the 80-key tiles win back (see above), and at d = 128, where masking by chunks
// lost at 16k; without a mask, from seqlen_k 2048 at d = 256.
constexpr int wide_band_keys(int head_dim) { return head_dim <= 64 ? 1024 : 2048; }

// `rows` rounded up to whole tiles of `tile` rows.
constexpr long long padded_rows(int rows, int tile) { return (rows + tile - 1ll) / tile * tile; }

// The tile choice of unpacked rows (forward_tile_config's `choice`): whether the middle query row
// sees at least wide_band_keys(d) keys (without a mask, seqlen_k), except where a head dim has
// shorter query tiles for short query sequences (64 rows, two CTAs per SM):
// - d = 64 without a mask: short rows unless seqlen_q fills the 192-row tiles to at least 4/5 (a
//   192-row tile holding 128 queries fills two thirds). H200, same session, batch 8 x 32 heads
//   over 1024 / 8192 keys, 64-row against 192-row tiles: seqlen_q 64 (fill 1/3) +61 / +66%; 128
//   and 256 (2/3) +16 / +16% and +18 / +12%; 192 and 384 (full) -13 / -17% and -16 / -19%: even
//   near a fill of 0.83.
// - d = 128, with or without a mask: short rows where 128-row tiles pad seqlen_q to more than 5/4
//   of the rows that 64-row tiles pad it to, since full 64-row tiles ran at 0.80 to 0.90 of the
//   128-row ones without a mask (forward_tile_config): up to 64 queries and from 129 to 192.
constexpr TileChoice tile_choice(int head_dim, bool local, int seqlen_q, int middle_row_keys) {
  if (has_short_row_tiles(head_dim, local)) {
    bool const short_rows = head_dim <= 64 ? 5ll * seqlen_q < 4 * padded_rows(seqlen_q, 192)
                                           : 4 * padded_rows(seqlen_q, 128) > 5 * padded_rows(seqlen_q, 64);
    if (short_rows) return TileChoice::kShortRows;
    if (head_dim <= 64) return TileChoice::kWideBand;  // d = 64 without a mask: by the rows alone
  }
  return middle_row_keys >= wide_band_keys(head_dim) ? TileChoice::kWideBand : TileChoice::kNarrowBand;
}

// Whether head dim d has tiles of its own for `choice`, other than default_tile_choice's (one
// kernel more per dtype and mask kind).
constexpr bool has_own_tiles(int head_dim, bool local, TileChoice choice) {
  return !(forward_tile_config(head_dim, local, choice, false) ==
           forward_tile_config(head_dim, local, default_tile_choice(local), false));
}

}  // namespace flashhop::sm90
