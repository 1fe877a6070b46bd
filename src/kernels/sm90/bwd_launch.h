// Host entry of the sm90 backward kernels of one (element type, recipe: bwd_recipes.h)
// configuration. Defined in bwd_launch_impl.h and instantiated once per generated file.
#pragma once

#include <cuda_runtime_api.h>

#include "flashhop/flashhop.h"
#include "kernels/sm90/bwd_params.h"
#include "kernels/sm90/bwd_recipes.h"

namespace flashhop::sm90 {

template <class Element, int kRecipe>
Status launch_backward(BackwardParams const& p, cudaStream_t stream);

}  // namespace flashhop::sm90
