// The C++ entry points: validate, plan, check the device side of the arguments, then dispatch.
#include "flashhop/flashhop.h"

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>

#include "api/dispatch.h"
#include "api/nvtx.h"
#include "api/plan.h"

namespace flashhop {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat8E4M3:
      return 1;
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat32:
      return "float32";
    case DType::kInt32:
      return "int32";
    case DType::kFloat8E4M3:
      return "float8_e4m3fn";
  }
  return "unknown";
}

TensorDesc make_contiguous(void* data, DType dtype, std::initializer_list<std::int64_t> shape, int device) {
  TensorDesc desc;
  desc.data = data;
  desc.dtype = dtype;
  desc.device = device;
  // A rank above kMaxRank is recorded as given (so validation can name it); only kMaxRank sizes fit.
  desc.rank = static_cast<int>(shape.size());
  const int stored = std::min(desc.rank, kMaxRank);
  std::copy_n(shape.begin(), stored, desc.shape);
  // Row-major; a size-0 dimension counts as 1 (as in PyTorch) so that every stride stays positive.
  std::int64_t stride = 1;
  for (int d = stored - 1; d >= 0; --d) {
    desc.stride[d] = stride;
    stride *= std::max<std::int64_t>(desc.shape[d], 1);
  }
  return desc;
}

namespace {

// Every workspace starts on this boundary (the split round's partial results move as float4).
constexpr std::size_t kWorkspaceAlignment = 16;

Status cuda_error(const char* what, cudaError_t error) {
  return {StatusCode::kCudaError, std::string(what) + ": " + cudaGetErrorString(error)};
}

// A tensor's pointer and whether the call reads or writes anything through it.
struct DevicePointer {
  const char* name;
  const void* data;
  bool has_elements;
};

// Kernels launch on the current device: the tensors' device must be it.
Status check_current_device(int device) {
  int current = -1;
  if (cudaError_t error = cudaGetDevice(&current); error != cudaSuccess) return cuda_error("cudaGetDevice", error);
  if (current != device) {
    return {StatusCode::kInvalidArgument, "q.device = " + std::to_string(device) +
                                              ": expected the current CUDA device (" + std::to_string(current) +
                                              "); call cudaSetDevice first"};
  }
  return Status::success();
}

// Every pointer with elements must be memory of the current device `device` (or managed memory). An
// empty tensor is never dereferenced, and its pointer may be null or one past an allocation (an
// empty slice), which the runtime attributes to no device: only pointers with elements are asked.
Status check_device_memory(int device, std::initializer_list<DevicePointer> pointers) {
  for (const auto& [name, data, has_elements] : pointers) {
    if (!has_elements) continue;
    cudaPointerAttributes attributes{};
    if (cudaError_t error = cudaPointerGetAttributes(&attributes, data); error != cudaSuccess) {
      cudaGetLastError();  // the failed query must not surface later as a launch error
      return cuda_error((std::string(name) + ": cudaPointerGetAttributes").c_str(), error);
    }
    const bool on_device = attributes.type == cudaMemoryTypeDevice && attributes.device == device;
    if (!on_device && attributes.type != cudaMemoryTypeManaged) {
      std::ostringstream message;
      message << name << " = " << data << ": expected memory of CUDA device " << device << ", got ";
      if (attributes.type == cudaMemoryTypeDevice) {
        message << "memory of device " << attributes.device;
      } else {
        message << (attributes.type == cudaMemoryTypeHost ? "pinned host memory" : "unregistered host memory");
      }
      return {StatusCode::kInvalidArgument, message.str()};
    }
  }
  return Status::success();
}

// The caller's workspace against the `required` bytes that `size_query` reports.
Status check_workspace(const void* workspace, std::size_t workspace_bytes, std::size_t required,
                       const char* size_query) {
  if (workspace_bytes < required || (required > 0 && workspace == nullptr)) {
    return {StatusCode::kInvalidArgument, "workspace_bytes = " + std::to_string(workspace_bytes) +
                                              ": expected a workspace of at least " + std::to_string(required) +
                                              " bytes (" + size_query + ")"};
  }
  if (required > 0 && reinterpret_cast<std::uintptr_t>(workspace) % kWorkspaceAlignment != 0) {
    std::ostringstream message;
    message << "workspace = " << workspace << ": expected an address aligned to " << kWorkspaceAlignment << " bytes";
    return {StatusCode::kInvalidArgument, message.str()};
  }
  return Status::success();
}

// One attribute of `device`; a CUDA error naming it where the device cannot be asked.
Status device_attribute(int device, cudaDeviceAttr attribute, const char* name, int* value) {
  if (cudaError_t error = cudaDeviceGetAttribute(value, attribute, device); error != cudaSuccess) {
    cudaGetLastError();  // the failed query's error is not a later call's
    return cuda_error((std::string("cudaDeviceGetAttribute(") + name + ")").c_str(), error);
  }
  return Status::success();
}

// The device's SM count and L2 size.
Status read_device_facts(int device, detail::DeviceFacts* facts) {
  int l2_bytes = 0;
  if (Status status = device_attribute(device, cudaDevAttrMultiProcessorCount, "cudaDevAttrMultiProcessorCount",
                                       &facts->num_sms);
      !status.ok()) {
    return status;
  }
  if (Status status = device_attribute(device, cudaDevAttrL2CacheSize, "cudaDevAttrL2CacheSize", &l2_bytes);
      !status.ok()) {
    return status;
  }
  facts->l2_bytes = l2_bytes;
  return Status::success();
}

// The kernels run on compute capability 9.0 only (sm_90a code does not run on later GPUs either).
Status check_compute_capability(int device) {
  int major = 0, minor = 0;
  if (Status status = device_attribute(device, cudaDevAttrComputeCapabilityMajor,
                                       "cudaDevAttrComputeCapabilityMajor", &major);
      !status.ok()) {
    return status;
  }
  if (Status status = device_attribute(device, cudaDevAttrComputeCapabilityMinor,
                                       "cudaDevAttrComputeCapabilityMinor", &minor);
      !status.ok()) {
    return status;
  }
  return detail::check_compute_capability(major, minor);
}

}  // namespace

Status forward_workspace_size(const ForwardArgs& args, std::size_t* bytes) {
  if (bytes == nullptr) return {StatusCode::kInvalidArgument, "bytes = null: expected a pointer to write the size to"};
  if (Status status = validate_forward(args); !status.ok()) return status;
  // Without a device to ask, no round is split, and the kernel, given no workspace, splits none.
  detail::DeviceFacts device;
  if (!read_device_facts(args.q.device, &device).ok()) device = {};
  const detail::ForwardPlan plan = detail::plan_forward(args, device);
  // The profiler's range (nvtx.h): it marks the query in the timeline, named by its plan.
  const detail::ScopedRange range("forward_workspace_size", plan);
  *bytes = plan.workspace_bytes;
  return Status::success();
}

Status forward(const ForwardArgs& args, void* workspace, std::size_t workspace_bytes, cudaStream_t stream) {
  if (Status status = validate_forward(args); !status.ok()) return status;
  // Argument errors come before the device's: the workspace is checked against the plan for the
  // facts that could be read (none where the device cannot be asked), then the device's error, if any.
  detail::DeviceFacts device;
  const Status device_status = read_device_facts(args.q.device, &device);
  detail::ForwardPlan plan = detail::plan_forward(args, device_status.ok() ? device : detail::DeviceFacts{});
  // The profiler's range, named by the plan, until the call returns (nvtx.h).
  const detail::ScopedRange range("forward", plan);
  // A variable-length batch without kernels for it: said before any device check, as what this
  // build lacks, not what the device does.
  if (plan.varlen && !detail::varlen_forward_kernel_compiled(plan.dtype, plan.recipe)) {
    return detail::launch_varlen_forward(plan, stream);
  }

  const std::size_t required = plan.workspace_bytes;
  if (Status status = check_workspace(workspace, workspace_bytes, required, "forward_workspace_size"); !status.ok()) {
    return status;
  }
  if (Status status = check_current_device(args.q.device); !status.ok()) return status;
  if (!device_status.ok()) return device_status;
  if (Status status = check_compute_capability(args.q.device); !status.ok()) return status;
  plan.params.workspace = required > 0 ? workspace : nullptr;
  const sm90::ForwardParams& p = plan.params;
  const bool rows = p.batch > 0 && p.seqlen_q > 0, keys = p.batch > 0 && p.seqlen_k > 0;
  if (Status status = check_device_memory(args.q.device, {{"q.data", p.q, rows},
                                                          {"k.data", p.k, keys},
                                                          {"v.data", p.v, keys},
                                                          {"o.data", p.o, rows},
                                                          {"lse.data", p.lse, p.lse != nullptr && rows},
                                                          {"workspace", p.workspace, p.workspace != nullptr},
                                                          {"q_descale.data", p.q_descale, p.q_descale != nullptr},
                                                          {"k_descale.data", p.k_descale, p.k_descale != nullptr},
                                                          {"v_descale.data", p.v_descale, p.v_descale != nullptr},
                                                          {"q_block_scale.data", p.q_block_scale.data,
                                                           p.q_block_scale.data != nullptr},
                                                          {"k_block_scale.data", p.k_block_scale.data,
                                                           p.k_block_scale.data != nullptr},
                                                          {"v_block_scale.data", p.v_block_scale.data,
                                                           p.v_block_scale.data != nullptr}});
      !status.ok()) {
    return status;
  }
  if (plan.varlen) {
    const detail::VarlenPlan& varlen = *plan.varlen;
    if (Status status = check_device_memory(args.q.device, {{"cu_seqlens_q.data", varlen.cu_seqlens_q, true},
                                                            {"cu_seqlens_k.data", varlen.cu_seqlens_k,
                                                             varlen.cu_seqlens_k != nullptr},
                                                            {"page_table.data", plan.params.page_table,
                                                             plan.params.page_table != nullptr && varlen.batch > 0},
                                                            {"seqused_q.data", varlen.seqused_q,
                                                             varlen.seqused_q != nullptr && varlen.batch > 0},
                                                            {"seqused_k.data", varlen.seqused_k,
                                                             varlen.seqused_k != nullptr && varlen.batch > 0},
                                                            {"leftpad_k.data", varlen.leftpad_k,
                                                             varlen.leftpad_k != nullptr && varlen.batch > 0}});
        !status.ok()) {
      return status;
    }
  }

  // No query rows: O and LSE are empty. (With seqlen_k == 0 the kernel still runs: it writes O = 0
  // and LSE = -inf.)
  if (plan.params.batch == 0 || plan.params.seqlen_q == 0) return Status::success();

  if (Status status = plan.varlen ? detail::launch_varlen_forward(plan, stream) : detail::launch_forward(plan, stream);
      !status.ok()) {
    return status;
  }
  if (cudaError_t error = cudaGetLastError(); error != cudaSuccess) return cuda_error("forward kernel launch", error);
  return Status::success();
}

Status backward_workspace_size(const BackwardArgs& args, std::size_t* bytes) {
  if (bytes == nullptr) return {StatusCode::kInvalidArgument, "bytes = null: expected a pointer to write the size to"};
  if (Status status = validate_backward(args); !status.ok()) return status;
  const detail::BackwardPlan plan = detail::plan_backward(args);
  const detail::ScopedRange range("backward_workspace_size", plan);
  *bytes = static_cast<std::size_t>(plan.workspace.bytes);
  return Status::success();
}

Status backward(const BackwardArgs& args, void* workspace, std::size_t workspace_bytes, cudaStream_t stream) {
  if (Status status = validate_backward(args); !status.ok()) return status;
  detail::BackwardPlan plan = detail::plan_backward(args);
  const detail::ScopedRange range("backward", plan);
  const auto required = static_cast<std::size_t>(plan.workspace.bytes);
  if (Status status = check_workspace(workspace, workspace_bytes, required, "backward_workspace_size"); !status.ok()) {
    return status;
  }
  if (Status status = check_current_device(args.q.device); !status.ok()) return status;
  if (Status status = check_compute_capability(args.q.device); !status.ok()) return status;
  const sm90::BackwardParams& p = plan.params;
  const bool rows = p.batch > 0 && p.seqlen_q > 0, keys = p.batch > 0 && p.seqlen_k > 0;
  if (Status status = check_device_memory(args.q.device, {{"q.data", p.q, rows},
                                                          {"k.data", p.k, keys},
                                                          {"v.data", p.v, keys},
                                                          {"o.data", p.o, rows},
                                                          {"dout.data", p.dout, rows},
                                                          {"lse.data", p.lse, rows},
                                                          {"dq.data", p.dq, rows},
                                                          {"dk.data", p.dk, keys},
                                                          {"dv.data", p.dv, keys},
                                                          {"workspace", workspace, required > 0},
                                                          {"cu_seqlens_q.data", p.cu_seqlens_q,
                                                           p.cu_seqlens_q != nullptr},
                                                          {"cu_seqlens_k.data", p.cu_seqlens_k,
                                                           p.cu_seqlens_k != nullptr},
                                                          {"seqused_q.data", p.seqused_q,
                                                           p.seqused_q != nullptr && p.batch > 0},
                                                          {"seqused_k.data", p.seqused_k,
                                                           p.seqused_k != nullptr && p.batch > 0}});
      !status.ok()) {
    return status;
  }
  // Nothing to compute without a batch or without both queries and keys, but gradients to clear:
  // dq = 0 without keys, dk = dv = 0 without queries (the kernels' empty walks write them).
  if (p.batch == 0 || (p.seqlen_q == 0 && p.seqlen_k == 0)) return Status::success();
  if (required > 0) plan.bind_workspace(workspace);
  if (Status status = detail::launch_backward(plan, stream); !status.ok()) return status;
  if (cudaError_t error = cudaGetLastError(); error != cudaSuccess) return cuda_error("backward kernel launch", error);
  return Status::success();
}

Status combine(const CombineArgs& args, cudaStream_t stream) {
  if (Status status = validate_combine(args); !status.ok()) return status;
  const int device = args.out_partial.device;
  if (Status status = check_current_device(device); !status.ok()) return status;
  const TensorDesc& op = args.out_partial;
  const TensorDesc& lp = args.lse_partial;
  const bool rows = op.shape[1] > 0 && op.shape[2] > 0;
  if (Status status = check_device_memory(device, {{"out_partial.data", op.data, rows},
                                                   {"lse_partial.data", lp.data, rows},
                                                   {"out.data", args.out.data, rows},
                                                   {"lse.data", args.lse ? args.lse->data : nullptr,
                                                    args.lse.has_value() && rows}});
      !status.ok()) {
    return status;
  }
  if (!rows) return Status::success();
  if (Status status = check_compute_capability(device); !status.ok()) return status;
  // One batch entry of `rows` rows; the stride of a dimension of size 1 is never followed.
  sm90::CombineParams p;
  p.o_partial = static_cast<const float*>(op.data);
  p.lse_partial = static_cast<const float*>(lp.data);
  p.o = args.out.data;
  p.lse = args.lse ? static_cast<float*>(args.lse->data) : nullptr;
  p.num_splits = static_cast<int>(op.shape[0]);
  p.batch = 1;
  p.seqlen = static_cast<int>(op.shape[1]);
  p.nheads = static_cast<int>(op.shape[2]);
  p.head_dim_v = static_cast<int>(op.shape[3]);
  p.o_partial_split_stride = op.stride[0];
  p.o_partial_row_stride = op.stride[1];
  p.o_partial_head_stride = op.stride[2];
  p.lse_partial_split_stride = lp.stride[0];
  p.lse_partial_row_stride = lp.stride[1];
  p.lse_partial_head_stride = lp.stride[2];
  p.o_row_stride = args.out.stride[0];
  p.o_head_stride = args.out.stride[1];
  if (args.lse) {
    p.lse_head_stride = args.lse->stride[0];
    p.lse_row_stride = args.lse->stride[1];
  }
  const detail::ScopedRange range("combine", p);
  return detail::launch_combine(p, args.out.dtype, stream);
}

Status append_kv(const AppendKvArgs& args, cudaStream_t stream) {
  if (Status status = validate_append_kv(args); !status.ok()) return status;
  const int device = args.k_cache.device;
  if (Status status = check_current_device(device); !status.ok()) return status;
  const auto data = [](const std::optional<TensorDesc>& t) { return t ? t->data : nullptr; };
  const bool rows = args.k_new.shape[0] > 0, queries = args.q && args.q->shape[0] > 0;
  const bool batch = args.cu_seqlens_new.shape[0] > 1;
  if (Status status = check_device_memory(device, {{"k_cache.data", args.k_cache.data, rows},
                                                   {"v_cache.data", args.v_cache.data, rows},
                                                   {"page_table.data", args.page_table.data, rows},
                                                   {"cache_seqlens.data", args.cache_seqlens.data, batch},
                                                   {"k.data", args.k_new.data, rows},
                                                   {"v.data", args.v_new.data, rows},
                                                   {"cu_seqlens_new.data", args.cu_seqlens_new.data, true},
                                                   {"rotary_cos.data", data(args.rotary_cos),
                                                    args.rotary_cos.has_value()},
                                                   {"rotary_sin.data", data(args.rotary_sin),
                                                    args.rotary_sin.has_value()},
                                                   {"rotary_seqlens.data", data(args.rotary_seqlens),
                                                    args.rotary_seqlens.has_value() && batch},
                                                   {"q.data", data(args.q), queries},
                                                   {"q_rotated.data", data(args.q_rotated), queries},
                                                   {"cu_seqlens_q.data", data(args.cu_seqlens_q), args.q.has_value()}});
      !status.ok()) {
    return status;
  }
  if (!batch || (!rows && !queries)) return Status::success();
  if (Status status = check_compute_capability(device); !status.ok()) return status;
  // The stride of a dimension of size 1 is never followed.
  const auto stride = [](const TensorDesc& t, int d) { return t.shape[d] > 1 ? t.stride[d] : 0; };
  sm90::AppendKvParams p;
  p.k_cache = args.k_cache.data;
  p.v_cache = args.v_cache.data;
  p.k_page_stride = stride(args.k_cache, 0);
  p.k_row_stride = stride(args.k_cache, 1);
  p.k_head_stride = stride(args.k_cache, 2);
  p.v_page_stride = stride(args.v_cache, 0);
  p.v_row_stride = stride(args.v_cache, 1);
  p.v_head_stride = stride(args.v_cache, 2);
  p.num_pages = static_cast<int>(args.k_cache.shape[0]);
  p.page_size = static_cast<int>(args.k_cache.shape[1]);
  p.page_table = static_cast<const int*>(args.page_table.data);
  p.page_table_stride = stride(args.page_table, 0);
  p.max_pages = static_cast<int>(args.page_table.shape[1]);
  p.cache_seqlens = static_cast<const int*>(args.cache_seqlens.data);
  p.k_new = args.k_new.data;
  p.v_new = args.v_new.data;
  p.k_new_row_stride = stride(args.k_new, 0);
  p.k_new_head_stride = stride(args.k_new, 1);
  p.v_new_row_stride = stride(args.v_new, 0);
  p.v_new_head_stride = stride(args.v_new, 1);
  p.cu_seqlens_new = static_cast<const int*>(args.cu_seqlens_new.data);
  p.batch = static_cast<int>(args.cu_seqlens_new.shape[0] - 1);
  p.total_new = static_cast<int>(args.k_new.shape[0]);
  p.nheads_kv = static_cast<int>(args.k_cache.shape[2]);
  p.head_dim = static_cast<int>(args.k_cache.shape[3]);
  p.head_dim_v = static_cast<int>(args.v_cache.shape[3]);
  if (args.rotary_cos) {
    p.rotary_cos = args.rotary_cos->data;
    p.rotary_sin = args.rotary_sin->data;
    p.rotary_cos_stride = stride(*args.rotary_cos, 0);
    p.rotary_sin_stride = stride(*args.rotary_sin, 0);
    p.seqlen_ro = static_cast<int>(args.rotary_cos->shape[0]);
    p.rotary_dim = static_cast<int>(2 * args.rotary_cos->shape[1]);
    p.rotary_interleaved = args.rotary_interleaved;
    p.rotary_seqlens = static_cast<const int*>(data(args.rotary_seqlens));
  }
  if (args.q) {
    p.q = args.q->data;
    p.q_rotated = args.q_rotated->data;
    p.q_row_stride = stride(*args.q, 0);
    p.q_head_stride = stride(*args.q, 1);
    p.q_rotated_row_stride = stride(*args.q_rotated, 0);
    p.q_rotated_head_stride = stride(*args.q_rotated, 1);
    p.cu_seqlens_q = static_cast<const int*>(args.cu_seqlens_q->data);
    p.total_q = static_cast<int>(args.q->shape[0]);
    p.nheads = static_cast<int>(args.q->shape[1]);
    p.q_positions_advance = args.q_positions_advance;
  }
  const detail::ScopedRange range("append_kv", p);
  return detail::launch_append_kv(p, args.k_cache.dtype, stream);
}

Status quantize_fp8(const QuantizeFp8Args& args, cudaStream_t stream) {
  if (Status status = validate_quantize_fp8(args); !status.ok()) return status;
  const int device = args.x.device;
  if (Status status = check_current_device(device); !status.ok()) return status;
  const sm90::Fp8QuantizeParams p = detail::plan_quantize_fp8(args);
  const bool elements = std::int64_t{p.batch} * p.seqlen * p.nheads > 0;
  std::int64_t scales = 1;
  for (int d = 0; d < args.descale.rank; ++d) scales *= args.descale.shape[d];
  if (Status status = check_device_memory(device, {{"x.data", p.x, elements},
                                                   {"out.data", p.out, elements},
                                                   {"descale.data", p.descale, scales > 0},
                                                   {"hadamard_signs.data", p.hadamard_signs,
                                                    p.hadamard_signs != nullptr}});
      !status.ok()) {
    return status;
  }
  if (scales == 0) return Status::success();
  if (Status status = check_compute_capability(device); !status.ok()) return status;
  const detail::ScopedRange range("quantize_fp8", p);
  return detail::launch_quantize_fp8(p, args.x.dtype, stream);
}

}  // namespace flashhop
