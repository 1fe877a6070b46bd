// Dispatch: a plan's (dtype, recipe) to the compiled kernels that run it.
#pragma once

#include <cuda_runtime_api.h>

#include "api/plan.h"
#include "kernels/sm90/append_kv.h"
#include "kernels/sm90/fp8_quantize.h"
#include "flashhop/flashhop.h"

namespace flashhop::detail {

// Launches the kernel of plan.dtype and plan.recipe on `stream`; kNotSupported when this build did
// not compile it.
Status launch_forward(const ForwardPlan& plan, cudaStream_t stream);

// kNotSupported, naming both, unless the kernels run on a device of compute capability major.minor.
Status check_compute_capability(int major, int minor);

// Whether this build compiled the kernel of `dtype` and recipe index `recipe`.
bool forward_kernel_compiled(DType dtype, int recipe);

// The forward of a variable-length batch (plan.varlen set) on `stream`; kNotSupported when this
// build did not compile its kernel.
Status launch_varlen_forward(const ForwardPlan& plan, cudaStream_t stream);
bool varlen_forward_kernel_compiled(DType dtype, int recipe);

// The backward's kernels of plan.dtype and plan.recipe on `stream` (workspace bound); kNotSupported
// when this build did not compile them.
Status launch_backward(const BackwardPlan& plan, cudaStream_t stream);

// The append kernel (flashhop::append_kv) for a cache of `dtype`.
Status launch_append_kv(const sm90::AppendKvParams& params, DType dtype, cudaStream_t stream);

// The quantization kernels (flashhop::quantize_fp8) for x of `dtype`.
Status launch_quantize_fp8(const sm90::Fp8QuantizeParams& params, DType dtype, cudaStream_t stream);

// The combine kernel (flashhop::combine) with O of `dtype`.
Status launch_combine(const sm90::CombineParams& params, DType dtype, cudaStream_t stream);
bool backward_kernel_compiled(DType dtype, int recipe);

}  // namespace flashhop::detail
