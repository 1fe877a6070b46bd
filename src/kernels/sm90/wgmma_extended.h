// The wgmma instructions of key tile widths outside CuTe's default set (N = 80 at d = 256, 112 at
// d = 192: the recipe table), from CuTe's extended-shapes headers. Included only by the kernel files
// that use them (tools/generate_instantiations.py): those headers double a file's compile time.
// The headers are included directly rather than through CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED, which
// would also change the body of CuTe's selectors in these files only.
#pragma once

#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/arch/mma_sm90_gmma_ext.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/atom/mma_traits_sm90_gmma_ext.hpp>
#include <cutlass/numeric_types.h>

#include "kernels/sm90/gmma_utils.h"

namespace flashhop::sm90 {

template <>
struct ExtendedSsOp<cutlass::bfloat16_t, 80> {
  using type = cute::SM90::GMMA::MMA_64x80x16_F32BF16BF16_SS<cute::GMMA::Major::K, cute::GMMA::Major::K>;
};
template <>
struct ExtendedSsOp<cutlass::half_t, 80> {
  using type = cute::SM90::GMMA::MMA_64x80x16_F32F16F16_SS<cute::GMMA::Major::K, cute::GMMA::Major::K>;
};
template <>
struct ExtendedSsOp<cutlass::bfloat16_t, 112> {
  using type = cute::SM90::GMMA::MMA_64x112x16_F32BF16BF16_SS<cute::GMMA::Major::K, cute::GMMA::Major::K>;
};
template <>
struct ExtendedSsOp<cutlass::half_t, 112> {
  using type = cute::SM90::GMMA::MMA_64x112x16_F32F16F16_SS<cute::GMMA::Major::K, cute::GMMA::Major::K>;
};

}  // namespace flashhop::sm90
