// Host entry of the sm90 forward kernel of one (element type, recipe: fwd_recipes.h) configuration.
// Defined in fwd_launch_impl.h and instantiated once per generated file under instantiations/.
#pragma once

#include <cuda_runtime_api.h>

#include "flashhop/flashhop.h"
#include "kernels/sm90/fwd_params.h"
#include "kernels/sm90/fwd_recipes.h"

namespace flashhop::sm90 {

template <class Element, int kRecipe>
Status launch_forward(ForwardParams const& p, cudaStream_t stream);

// The same recipe over a variable-length batch (ForwardParams' cu_seqlens; varlen.h): instantiated
// by the generated files of the recipes that variable-length batches use (plan.cpp).
template <class Element, int kRecipe>
Status launch_varlen_forward(ForwardParams const& p, cudaStream_t stream);

// The combine kernel (combine.cu) with O of type Element: cutlass::bfloat16_t, cutlass::half_t or float.
template <class Element>
Status launch_combine(CombineParams const& p, cudaStream_t stream);

}  // namespace flashhop::sm90
