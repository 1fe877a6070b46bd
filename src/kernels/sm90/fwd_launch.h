// Host entry of the sm90 forward kernel for one (element type, head dim of Q/K, head dim of V, mask,
// packed GQA rows or not, tile choice: tile_config.h) configuration.
// Defined in fwd_launch_impl.h and instantiated once per generated file under instantiations/.
#pragma once

#include <cutlass/numeric_types.h>

#include "api/forward_params.h"
#include "kernels/sm90/mask.h"
#include "kernels/sm90/tile_config.h"

namespace flashhop::sm90 {

template <class Element, int kHeadDim, int kHeadDimV, class Mask, bool kPackGqa, TileChoice kTileChoice>
Status launch_forward(detail::ForwardParams const& p, cudaStream_t stream);

}  // namespace flashhop::sm90
