// The split last round of the non-causal kernel: equal tiles dealt round robin over the CTAs leave
// a last round of r < ctas tiles (all the tiles, where they are fewer than the CTAs: decoding, or
// few heads over long keys), which would keep ctas - r SMs idle for a whole tile. Instead the
// key tiles of those r tiles (`steps` of them in all) are cut into one contiguous run per CTA,
// floor(c x steps / ctas) to floor((c + 1) x steps / ctas): CTA c computes one or two parts (at most
// two, as a run is shorter than a tile), each a partial O and LSE over some of a tile's key tiles;
// the CTA that finishes a tile's last part merges the parts (split_combine.h) and stores O.
// Host-includable (no CuTe): the API sizes the workspace with it.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cutlass/cutlass.h>

#include "kernels/sm90/fwd_recipe.h"

namespace flashhop::sm90 {

struct SplitRound {
  int whole_tiles = 0;  // tiles dealt whole, round robin: the first whole_tiles tile indices
  int key_tiles = 0;    // key tiles of every tile
  int steps = 0;        // key tiles of the split tiles in all; 0: nothing is split
  int ctas = 1;         // the grid
  // steps = steps_per_cta x ctas + steps_rest, so that first_step takes 32-bit arithmetic: each
  // role of a CTA maps its parts several times before its first load, and a 64-bit division is a
  // subroutine of about 190 instructions on the path to the first load (decision log D60).
  int steps_per_cta = 0;
  int steps_rest = 0;

  // The largest grid for which first_step's products stay within 32 bits (c x steps_rest < ctas^2).
  static constexpr int kMaxCtas = 46340;

  // Splitting shortens the last round from key_tiles key tiles to steps / ctas, saving
  // key_tiles x (ctas - rest) / ctas of them; each CTA pays for it with up to two parts' start (Q
  // load, a first GEMM that nothing overlaps) and end (the partial O written, the merge), which
  // outweighs fewer saved key tiles (decision log D122).
  static constexpr int kMinSavedKeyTiles = 6;

  // num_tiles tiles of key_tiles key tiles each on a persistent grid of up to ctas CTAs (one per
  // SM, or two where two fit). The last round is split where `policy` allows, when each CTA gets at
  // least one key tile of it and when that saves kMinSavedKeyTiles; the grid is then all ctas CTAs,
  // else no more than the tiles. The kernel's scheduler runs this plan and the API sizes the
  // workspace for it, so both call it.
  static SplitRound plan(int num_tiles, int key_tiles, int ctas, SplitPolicy policy) {
    int const rounds = num_tiles / ctas, rest = num_tiles % ctas;
    std::int64_t const steps = std::int64_t{rest} * key_tiles;
    std::int64_t const saved_times_ctas = std::int64_t{key_tiles} * (ctas - rest);
    bool const allowed = policy == SplitPolicy::kLastRound || (policy == SplitPolicy::kSingleRound && rounds == 0);
    if (!allowed || rest == 0 || steps < ctas || steps > INT32_MAX || ctas > kMaxCtas ||
        saved_times_ctas < std::int64_t{kMinSavedKeyTiles} * ctas) {
      return {num_tiles, key_tiles, 0, num_tiles < ctas ? num_tiles : ctas};
    }
    int const split_steps = static_cast<int>(steps);
    return {rounds * ctas, key_tiles, split_steps, ctas, split_steps / ctas, split_steps % ctas};
  }

  CUTLASS_HOST_DEVICE bool splits() const { return steps > 0; }
  CUTLASS_HOST_DEVICE int split_tiles() const { return steps / key_tiles; }
  // CTA c's run of split key tiles begins at this step (steps count tile by tile, key tile fastest):
  // floor(c x steps / ctas), for c in [0, ctas].
  CUTLASS_HOST_DEVICE int first_step(int cta) const {
    return cta * steps_per_cta + cta * steps_rest / ctas;
  }
  // The CTA whose run holds step s: the largest c with first_step(c) <= s. That is floor(s x ctas /
  // steps) or one more (steps >= ctas); the estimate in floats is off by less than one from that.
  CUTLASS_HOST_DEVICE int cta_of_step(int step) const {
    int cta = static_cast<int>(static_cast<float>(step) * static_cast<float>(ctas) / static_cast<float>(steps));
    cta = cta < 0 ? 0 : cta > ctas - 1 ? ctas - 1 : cta;
    while (cta > 0 && first_step(cta) > step) --cta;
    while (cta + 1 < ctas && first_step(cta + 1) <= step) ++cta;
    return cta;
  }

  // Part k (0 or 1) of CTA c's run: key tiles [key_begin, key_end) of split tile `tile` (0 for the
  // first split tile). `exists` is false for a second part that CTA c does not have.
  struct Part {
    bool exists;
    int tile, key_begin, key_end;
  };
  CUTLASS_HOST_DEVICE Part part(int cta, int k) const {
    int const begin = first_step(cta), end = first_step(cta + 1);
    int const tile = begin / key_tiles + k;
    int const tile_begin = tile * key_tiles;
    int const from = k == 0 ? begin : tile_begin;
    int const to = end < tile_begin + key_tiles ? end : tile_begin + key_tiles;
    return {from < to, tile, from - tile_begin, to - tile_begin};
  }

  // The parts of split tile t, in key order: CTAs first_cta .. first_cta + count - 1, the first of
  // which has it as its second part (k = 1) when `first_is_second`, every other as its first.
  struct Parts {
    int first_cta, count;
    bool first_is_second;
  };
  CUTLASS_HOST_DEVICE Parts parts_of(int tile) const {
    int const first = cta_of_step(tile * key_tiles), last = cta_of_step((tile + 1) * key_tiles - 1);
    return {first, last - first + 1, first_step(first) < tile * key_tiles};
  }
  // Workspace slot of CTA c's part k.
  static CUTLASS_HOST_DEVICE int slot(int cta, int k) { return 2 * cta + k; }
};

// The workspace of a split round, for `consumers` warpgroups of 64 query rows and dv columns of O:
// one int counter per (split tile, warpgroup), zeroed before the kernel, then per (slot, warpgroup)
// the part's normalised O and its rows' LSE as each of the warpgroup's 128 threads holds them
// (dv / 2 values of O and 2 row LSEs per thread, in the wgmma accumulator layout), as floats.
struct SplitWorkspace {
  static constexpr int kThreads = 128;
  static constexpr int kRowsPerThread = 2;
  static constexpr std::size_t kAlignment = 256;

  static constexpr int partial_floats(int dv) { return kThreads * (dv / 2 + kRowsPerThread); }
  static std::size_t counter_bytes(SplitRound const& plan, int consumers) {
    std::size_t const bytes = std::size_t(plan.split_tiles()) * consumers * sizeof(int);
    return (bytes + kAlignment - 1) / kAlignment * kAlignment;
  }
  // Bytes in all (0 when nothing is split).
  static std::size_t bytes(SplitRound const& plan, int consumers, int dv) {
    if (!plan.splits()) return 0;
    return counter_bytes(plan, consumers) +
           std::size_t(SplitRound::slot(plan.ctas, 0)) * consumers * partial_floats(dv) * sizeof(float);
  }
};

}  // namespace flashhop::sm90
