// The recipe of a compiled backward kernel configuration (the table, bwd_recipes.h, is generated
// from tools/backward_recipes.py). Host-includable (no CuTe).
#pragma once

#include "kernels/sm90/fwd_recipe.h"

namespace flashhop::sm90 {

// Field order is the generated table's (tools/generate_instantiations.py checks it).
struct BackwardRecipe {
  const char* name;  // "hdim<d>[x<dv>]_<mask>"
  int head_dim;      // d of Q, K, dQ and dK
  int head_dim_v;    // dv of V, O, dO and dV
  MaskKind mask;
  int block_m;       // query rows per step of the walk over query tiles
  int block_n;       // key rows per CTA: 64 per consumer warpgroup
  int stages;        // depth of the Q and dO shared-memory rings

  constexpr int consumer_warpgroups() const { return block_n / 64; }
  constexpr bool local() const { return mask == MaskKind::kLocal; }
};

}  // namespace flashhop::sm90
