// The recipe of a compiled backward kernel configuration (the table, bwd_recipes.h, is generated
// from tools/backward_recipes.py). Host-includable (no CuTe).
#pragma once

#include "kernels/sm90/fwd_recipe.h"

namespace flashhop::sm90 {

// How the two consumer warpgroups share a key tile. kKeyRows: warpgroup w owns key rows
// [64 w, 64 w + 64) of S^T, dP^T, dV and dK (block_n = 128). kColumns: they share the 64 key rows
// (block_n = 64); warpgroup w computes S^T and dP^T for query columns [32 w, 32 w + 32) and dV
// and dK for head-dim columns [w dv / 2, ...) and [w d / 2, ...), with P^T and dS^T passed through
// shared memory: it halves the dK and dV accumulators of large head dims.
enum class DkvSplit { kKeyRows, kColumns };

// Field order is the generated table's (tools/generate_instantiations.py checks it).
struct BackwardRecipe {
  const char* name;  // "hdim<d>[x<dv>]_<mask>"
  int head_dim;      // d of Q, K, dQ and dK
  int head_dim_v;    // dv of V, O, dO and dV
  MaskKind mask;
  int block_m;       // query rows per step of the walk over query tiles
  int block_n;       // key rows per CTA: 128 with kKeyRows, 64 with kColumns
  int stages;        // depth of the Q and dO shared-memory rings
  DkvSplit split;

  static constexpr int consumer_warpgroups() { return 2; }
  constexpr bool local() const { return mask == MaskKind::kLocal; }
};

}  // namespace flashhop::sm90
