// Placeholder replaced by the kernel dispatch.
#include "api/forward_params.h"
namespace flashhop::detail {
Status launch_forward_sm90(const ForwardParams&, cudaStream_t) {
  return {StatusCode::kNotSupported, "no kernels compiled"};
}
}  // namespace flashhop::detail
