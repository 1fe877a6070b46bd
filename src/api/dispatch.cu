// Runtime arguments become template arguments here, once: dtype -> element type, (head dim,
// head dim of V) -> constants, mask -> policy, packed GQA rows -> a flag, the tile choice -> an enum.
// Configurations left out of the build (FLASHHOP_DTYPES, FLASHHOP_HEAD_DIMS) answer kNotSupported.
#include <string>
#include <type_traits>

#include "api/forward_params.h"
#include "kernels/sm90/fwd_launch.h"
#include "kernels/sm90/tile_config.h"

namespace flashhop::detail {
namespace {

Status not_built(ForwardParams const& p) {
  return {StatusCode::kNotSupported, std::string("forward kernel for dtype ") + dtype_name(p.dtype) +
                                         " and head_dim " + std::to_string(p.head_dim) + ", head_dim_v " +
                                         std::to_string(p.head_dim_v) +
                                         " is not compiled into this build (see FLASHHOP_DTYPES and "
                                         "FLASHHOP_HEAD_DIMS)"};
}

// Which (element, d, dv) configurations this build compiled; CMake defines FLASHHOP_HAS_FWD_*.
template <class Element, int kHeadDim, int kHeadDimV>
struct IsBuilt : std::false_type {};
#define FLASHHOP_BUILT(Element, kHeadDim, kHeadDimV) \
  template <>                                        \
  struct IsBuilt<Element, kHeadDim, kHeadDimV> : std::true_type {};
#if defined(FLASHHOP_HAS_FWD_BF16_HDIM64)
FLASHHOP_BUILT(cutlass::bfloat16_t, 64, 64)
#endif
#if defined(FLASHHOP_HAS_FWD_BF16_HDIM96)
FLASHHOP_BUILT(cutlass::bfloat16_t, 96, 96)
#endif
#if defined(FLASHHOP_HAS_FWD_BF16_HDIM128)
FLASHHOP_BUILT(cutlass::bfloat16_t, 128, 128)
#endif
#if defined(FLASHHOP_HAS_FWD_BF16_HDIM192)
FLASHHOP_BUILT(cutlass::bfloat16_t, 192, 192)
#endif
#if defined(FLASHHOP_HAS_FWD_BF16_HDIM192X128)
FLASHHOP_BUILT(cutlass::bfloat16_t, 192, 128)
#endif
#if defined(FLASHHOP_HAS_FWD_BF16_HDIM256)
FLASHHOP_BUILT(cutlass::bfloat16_t, 256, 256)
#endif
#if defined(FLASHHOP_HAS_FWD_FP16_HDIM64)
FLASHHOP_BUILT(cutlass::half_t, 64, 64)
#endif
#if defined(FLASHHOP_HAS_FWD_FP16_HDIM96)
FLASHHOP_BUILT(cutlass::half_t, 96, 96)
#endif
#if defined(FLASHHOP_HAS_FWD_FP16_HDIM128)
FLASHHOP_BUILT(cutlass::half_t, 128, 128)
#endif
#if defined(FLASHHOP_HAS_FWD_FP16_HDIM192)
FLASHHOP_BUILT(cutlass::half_t, 192, 192)
#endif
#if defined(FLASHHOP_HAS_FWD_FP16_HDIM192X128)
FLASHHOP_BUILT(cutlass::half_t, 192, 128)
#endif
#if defined(FLASHHOP_HAS_FWD_FP16_HDIM256)
FLASHHOP_BUILT(cutlass::half_t, 256, 256)
#endif
#undef FLASHHOP_BUILT

// Unpacked rows of tile choice kChoice: on the head dim's own tiles for it where it has some, else on
// the default choice's.
template <class Element, int kHeadDim, int kHeadDimV, class Mask, sm90::TileChoice kChoice>
Status launch_unpacked(ForwardParams const& p, cudaStream_t stream) {
  constexpr bool kOwn = sm90::has_own_tiles(kHeadDim, Mask::kIsLocal, kChoice);
  constexpr sm90::TileChoice kLaunched = kOwn ? kChoice : sm90::default_tile_choice(Mask::kIsLocal);
  return sm90::launch_forward<Element, kHeadDim, kHeadDimV, Mask, false, kLaunched>(p, stream);
}

template <class Element, int kHeadDim, int kHeadDimV, class Mask>
Status launch_with_mask(ForwardParams const& p, cudaStream_t stream) {
  using sm90::TileChoice;
  // Packed rows always take the default choice (make_forward_params).
  if (p.pack_gqa) {
    return sm90::launch_forward<Element, kHeadDim, kHeadDimV, Mask, true, sm90::default_tile_choice(Mask::kIsLocal)>(
        p, stream);
  }
  switch (p.tile_choice) {
    case TileChoice::kWideBand:
      return launch_unpacked<Element, kHeadDim, kHeadDimV, Mask, TileChoice::kWideBand>(p, stream);
    case TileChoice::kShortRows:
      return launch_unpacked<Element, kHeadDim, kHeadDimV, Mask, TileChoice::kShortRows>(p, stream);
    case TileChoice::kNarrowBand:
      break;
  }
  return launch_unpacked<Element, kHeadDim, kHeadDimV, Mask, TileChoice::kNarrowBand>(p, stream);
}

template <class Element, int kHeadDim, int kHeadDimV>
Status launch_if_built(ForwardParams const& p, cudaStream_t stream) {
  if constexpr (IsBuilt<Element, kHeadDim, kHeadDimV>::value) {
    return p.local ? launch_with_mask<Element, kHeadDim, kHeadDimV, sm90::LocalMask>(p, stream)
                   : launch_with_mask<Element, kHeadDim, kHeadDimV, sm90::NoMask>(p, stream);
  } else {
    return not_built(p);
  }
}

template <class Element>
Status launch_with_head_dim(ForwardParams const& p, cudaStream_t stream) {
  switch (p.head_dim) {
    case 64:
      return launch_if_built<Element, 64, 64>(p, stream);
    case 96:
      return launch_if_built<Element, 96, 96>(p, stream);
    case 128:
      return launch_if_built<Element, 128, 128>(p, stream);
    case 192:
      return p.head_dim_v == 128 ? launch_if_built<Element, 192, 128>(p, stream)
                                 : launch_if_built<Element, 192, 192>(p, stream);
    case 256:
      return launch_if_built<Element, 256, 256>(p, stream);
    default:
      return not_built(p);
  }
}

}  // namespace

Status launch_forward_sm90(ForwardParams const& p, cudaStream_t stream) {
  switch (p.dtype) {
    case DType::kBFloat16:
      return launch_with_head_dim<cutlass::bfloat16_t>(p, stream);
    case DType::kFloat16:
      return launch_with_head_dim<cutlass::half_t>(p, stream);
    default:
      return not_built(p);
  }
}

}  // namespace flashhop::detail
