// Runtime arguments become template arguments here, once: dtype -> element type, head dim ->
// constant, causal -> mask policy. Configurations left out of the build (FLASHHOP_DTYPES,
// FLASHHOP_HEAD_DIMS) answer kNotSupported.
#include <string>
#include <type_traits>

#include "api/forward_params.h"
#include "kernels/sm90/fwd_launch.h"

namespace flashhop::detail {
namespace {

template <class Element, int kHeadDim>
Status launch_with_mask(ForwardParams const& p, cudaStream_t stream) {
  return p.causal ? sm90::launch_forward<Element, kHeadDim, sm90::CausalMask>(p, stream)
                  : sm90::launch_forward<Element, kHeadDim, sm90::NoMask>(p, stream);
}

Status not_built(ForwardParams const& p) {
  return {StatusCode::kNotSupported, std::string("forward kernel for dtype ") + dtype_name(p.dtype) +
                                         " and head_dim " + std::to_string(p.head_dim) +
                                         " is not compiled into this build (see FLASHHOP_DTYPES and "
                                         "FLASHHOP_HEAD_DIMS)"};
}

// Which (element, head dim) pairs this build compiled; CMake defines FLASHHOP_HAS_FWD_*.
template <class Element, int kHeadDim>
struct IsBuilt : std::false_type {};
#if defined(FLASHHOP_HAS_FWD_BF16_HDIM64)
template <> struct IsBuilt<cutlass::bfloat16_t, 64> : std::true_type {};
#endif
#if defined(FLASHHOP_HAS_FWD_BF16_HDIM128)
template <> struct IsBuilt<cutlass::bfloat16_t, 128> : std::true_type {};
#endif
#if defined(FLASHHOP_HAS_FWD_BF16_HDIM256)
template <> struct IsBuilt<cutlass::bfloat16_t, 256> : std::true_type {};
#endif
#if defined(FLASHHOP_HAS_FWD_FP16_HDIM64)
template <> struct IsBuilt<cutlass::half_t, 64> : std::true_type {};
#endif
#if defined(FLASHHOP_HAS_FWD_FP16_HDIM128)
template <> struct IsBuilt<cutlass::half_t, 128> : std::true_type {};
#endif
#if defined(FLASHHOP_HAS_FWD_FP16_HDIM256)
template <> struct IsBuilt<cutlass::half_t, 256> : std::true_type {};
#endif

template <class Element, int kHeadDim>
Status launch_if_built(ForwardParams const& p, cudaStream_t stream) {
  if constexpr (IsBuilt<Element, kHeadDim>::value) {
    return launch_with_mask<Element, kHeadDim>(p, stream);
  } else {
    return not_built(p);
  }
}

template <class Element>
Status launch_with_head_dim(ForwardParams const& p, cudaStream_t stream) {
  switch (p.head_dim) {
    case 64:
      return launch_if_built<Element, 64>(p, stream);
    case 128:
      return launch_if_built<Element, 128>(p, stream);
    case 256:
      return launch_if_built<Element, 256>(p, stream);
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
