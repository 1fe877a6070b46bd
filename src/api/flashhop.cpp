// The C++ entry points: validate, check the device side of the arguments, then dispatch.
#include "flashhop/flashhop.h"

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>

#include "api/forward_params.h"
#include "kernels/sm90/split_round.h"
#include "kernels/sm90/tile_config.h"

namespace flashhop {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kFloat32:
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

// With a band, the tile queue's counter (tile_scheduler.h). Without one, the counters and partial
// results of the split last round (split_round.h), planned for the device's SM count as the kernel
// plans it; none where no round splits, or where the SM count cannot be read (then the kernel,
// given no workspace, splits nothing either).
std::size_t required_workspace_bytes(const detail::ForwardParams& params) {
  if (params.local) return sizeof(int);
  if (params.seqlen_q == 0) return 0;
  int num_sms = 0;
  if (cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, params.device) != cudaSuccess) {
    cudaGetLastError();  // the failed query's error is not this call's
    return 0;
  }
  const sm90::ForwardTileConfig tile =
      sm90::forward_tile_config(params.head_dim, /*local=*/false, params.tile_choice, params.pack_gqa);
  const int consumers = tile.block_m / 64;
  const sm90::SplitPolicy policy = sm90::split_policy(params.head_dim, consumers, params.pack_gqa);
  if (policy == sm90::SplitPolicy::kNone) return 0;
  const std::int64_t rows =
      sm90::tile_rows_per_head(params.seqlen_q, params.nheads, params.nheads_kv, params.pack_gqa);
  const std::int64_t num_tiles = (rows + tile.block_m - 1) / tile.block_m *
                                 sm90::tile_heads_of(params.nheads, params.nheads_kv, params.pack_gqa) * params.batch;
  if (num_tiles > INT32_MAX) return 0;
  const sm90::SplitRound plan = sm90::SplitRound::plan(static_cast<int>(num_tiles),
                                                       (params.seqlen_k + tile.block_n - 1) / tile.block_n,
                                                       num_sms * sm90::ctas_per_sm(consumers), policy);
  return sm90::SplitWorkspace::bytes(plan, consumers, params.head_dim_v);
}

Status cuda_error(const char* what, cudaError_t error) {
  return {StatusCode::kCudaError, std::string(what) + ": " + cudaGetErrorString(error)};
}

// Kernels launch on the current device, so every pointer must live there (or be managed memory).
Status check_device_memory(const detail::ForwardParams& params) {
  int current = -1;
  if (cudaError_t error = cudaGetDevice(&current); error != cudaSuccess) return cuda_error("cudaGetDevice", error);
  if (current != params.device) {
    return {StatusCode::kInvalidArgument, "q.device = " + std::to_string(params.device) +
                                              ": expected the current CUDA device (" + std::to_string(current) +
                                              "); call cudaSetDevice first"};
  }
  // An empty tensor is never dereferenced, and its pointer may be null or one past an allocation
  // (an empty slice), which the runtime attributes to no device. Validation guarantees batch, head
  // counts and head dims >= 1, so only a sequence length of 0 empties a tensor.
  const struct {
    const char* name;
    const void* data;
    bool has_elements;
  } pointers[] = {{"q.data", params.q, params.seqlen_q > 0},
                  {"k.data", params.k, params.seqlen_k > 0},
                  {"v.data", params.v, params.seqlen_k > 0},
                  {"o.data", params.o, params.seqlen_q > 0},
                  {"lse.data", params.lse, params.lse != nullptr && params.seqlen_q > 0},
                  {"workspace", params.workspace, params.workspace != nullptr}};
  for (const auto& [name, data, has_elements] : pointers) {
    if (!has_elements) continue;
    cudaPointerAttributes attributes{};
    if (cudaError_t error = cudaPointerGetAttributes(&attributes, data); error != cudaSuccess) {
      cudaGetLastError();  // the failed query must not surface later as a launch error
      return cuda_error((std::string(name) + ": cudaPointerGetAttributes").c_str(), error);
    }
    const bool on_device = attributes.type == cudaMemoryTypeDevice && attributes.device == current;
    if (!on_device && attributes.type != cudaMemoryTypeManaged) {
      std::ostringstream message;
      message << name << " = " << data << ": expected memory of CUDA device " << current << ", got ";
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

}  // namespace

Status forward_workspace_size(const ForwardArgs& args, std::size_t* bytes) {
  if (bytes == nullptr) return {StatusCode::kInvalidArgument, "bytes = null: expected a pointer to write the size to"};
  if (Status status = validate_forward(args); !status.ok()) return status;
  *bytes = required_workspace_bytes(detail::make_forward_params(args));
  return Status::success();
}

Status forward(const ForwardArgs& args, void* workspace, std::size_t workspace_bytes, cudaStream_t stream) {
  if (Status status = validate_forward(args); !status.ok()) return status;
  detail::ForwardParams params = detail::make_forward_params(args);

  const std::size_t required = required_workspace_bytes(params);
  if (workspace_bytes < required || (required > 0 && workspace == nullptr)) {
    return {StatusCode::kInvalidArgument, "workspace_bytes = " + std::to_string(workspace_bytes) +
                                              ": expected a workspace of at least " + std::to_string(required) +
                                              " bytes (forward_workspace_size)"};
  }
  if (required > 0 && reinterpret_cast<std::uintptr_t>(workspace) % kWorkspaceAlignment != 0) {
    std::ostringstream message;
    message << "workspace = " << workspace << ": expected an address aligned to " << kWorkspaceAlignment << " bytes";
    return {StatusCode::kInvalidArgument, message.str()};
  }
  params.workspace = required > 0 ? workspace : nullptr;
  if (Status status = check_device_memory(params); !status.ok()) return status;

  // No query rows: O and LSE are empty. (With seqlen_k == 0 the kernel still runs: it writes O = 0
  // and LSE = -inf.)
  if (params.seqlen_q == 0) return Status::success();

  if (Status status = detail::launch_forward_sm90(params, stream); !status.ok()) return status;
  if (cudaError_t error = cudaGetLastError(); error != cudaSuccess) return cuda_error("forward kernel launch", error);
  return Status::success();
}

}  // namespace flashhop
