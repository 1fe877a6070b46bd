// The C API: converts C structs to the C++ ones, and turns every outcome, exceptions included,
// into a status code plus a per-thread message.
#include "flashhop/flashhop_c.h"

#include <exception>
#include <string>
#include <utility>

#include "flashhop/flashhop.h"

namespace {

thread_local std::string last_error;

// Assigning a message can itself throw (allocation); an empty message is better than an exception
// escaping into C.
void set_last_error(const char* message) noexcept {
  try {
    last_error = message;
  } catch (...) {
    last_error.clear();
  }
}

flashhop_status_t to_c(flashhop::StatusCode code) {
  switch (code) {
    case flashhop::StatusCode::kSuccess:
      return FLASHHOP_SUCCESS;
    case flashhop::StatusCode::kInvalidArgument:
      return FLASHHOP_INVALID_ARGUMENT;
    case flashhop::StatusCode::kNotSupported:
      return FLASHHOP_NOT_SUPPORTED;
    case flashhop::StatusCode::kCudaError:
      return FLASHHOP_CUDA_ERROR;
  }
  return FLASHHOP_INTERNAL_ERROR;
}

// Runs `call` (which returns a flashhop::Status) with nothing allowed to escape.
template <typename Call>
flashhop_status_t guarded(Call&& call) noexcept {
  try {
    const flashhop::Status status = call();
    set_last_error(status.message.c_str());
    return to_c(status.code);
  } catch (const std::exception& e) {
    set_last_error((std::string("internal error: ") + e.what()).c_str());
  } catch (...) {
    set_last_error("internal error: unknown exception");
  }
  return FLASHHOP_INTERNAL_ERROR;
}

flashhop::TensorDesc to_cpp(const flashhop_tensor_t& tensor) {
  flashhop::TensorDesc desc;
  desc.data = tensor.data;
  // Any integer converts; validation names a value that is not a flashhop_dtype_t.
  desc.dtype = static_cast<flashhop::DType>(tensor.dtype);
  desc.rank = tensor.rank;
  for (int d = 0; d < flashhop::kMaxRank; ++d) {
    desc.shape[d] = tensor.shape[d];
    desc.stride[d] = tensor.stride[d];
  }
  desc.device = tensor.device;
  return desc;
}

// A C flag that must be 0 or 1.
flashhop::Status check_flag(const char* name, int value) {
  if (value == 0 || value == 1) return flashhop::Status::success();
  return {flashhop::StatusCode::kInvalidArgument,
          std::string(name) + " = " + std::to_string(value) + ": expected 0 or 1"};
}

// The options both argument structs share (same field names in C and C++), after their flags
// (0 or 1) are checked.
template <typename CArgs, typename CppArgs>
flashhop::Status copy_options(const CArgs& args, CppArgs* out) {
  for (const auto& [name, value] : {std::pair{"causal", args.causal},
                                    std::pair{"use_softmax_scale", args.use_softmax_scale},
                                    std::pair{"use_window", args.use_window}}) {
    if (flashhop::Status status = check_flag(name, value); !status.ok()) return status;
  }
  out->q = to_cpp(args.q);
  out->k = to_cpp(args.k);
  out->v = to_cpp(args.v);
  out->o = to_cpp(args.o);
  if (args.use_softmax_scale == 1) out->softmax_scale = args.softmax_scale;
  out->causal = args.causal == 1;
  if (args.use_window == 1) {
    out->window_left = args.window_left;
    out->window_right = args.window_right;
  }
  out->softcap = args.softcap;
  return flashhop::Status::success();
}

flashhop::Status to_cpp(const flashhop_forward_args_t* args, flashhop::ForwardArgs* out) {
  if (args == nullptr) return {flashhop::StatusCode::kInvalidArgument, "args = null: expected forward arguments"};
  if (flashhop::Status status = copy_options(*args, out); !status.ok()) return status;
  if (args->pack_gqa != FLASHHOP_PACK_GQA_AUTO && args->pack_gqa != FLASHHOP_PACK_GQA_OFF &&
      args->pack_gqa != FLASHHOP_PACK_GQA_ON) {
    return {flashhop::StatusCode::kInvalidArgument, "pack_gqa = " + std::to_string(static_cast<int>(args->pack_gqa)) +
                                                        ": expected FLASHHOP_PACK_GQA_AUTO (0), _OFF (1) or _ON (2)"};
  }
  if (args->lse != nullptr) out->lse = to_cpp(*args->lse);
  out->pack_gqa = static_cast<flashhop::PackGqa>(args->pack_gqa);
  for (const auto& [tensor, field] : {std::pair{args->cu_seqlens_q, &out->cu_seqlens_q},
                                      std::pair{args->cu_seqlens_k, &out->cu_seqlens_k},
                                      std::pair{args->seqused_q, &out->seqused_q},
                                      std::pair{args->seqused_k, &out->seqused_k},
                                      std::pair{args->page_table, &out->page_table},
                                      std::pair{args->leftpad_k, &out->leftpad_k},
                                      std::pair{args->q_descale, &out->q_descale},
                                      std::pair{args->k_descale, &out->k_descale},
                                      std::pair{args->v_descale, &out->v_descale},
                                      std::pair{args->q_block_scale, &out->q_block_scale},
                                      std::pair{args->k_block_scale, &out->k_block_scale},
                                      std::pair{args->v_block_scale, &out->v_block_scale}}) {
    if (tensor != nullptr) *field = to_cpp(*tensor);
  }
  out->max_seqlen_q = args->max_seqlen_q;
  out->max_seqlen_k = args->max_seqlen_k;
  out->num_splits = args->num_splits;
  return flashhop::Status::success();
}

flashhop::Status to_cpp(const flashhop_backward_args_t* args, flashhop::BackwardArgs* out) {
  if (args == nullptr) return {flashhop::StatusCode::kInvalidArgument, "args = null: expected backward arguments"};
  if (flashhop::Status status = copy_options(*args, out); !status.ok()) return status;
  if (flashhop::Status status = check_flag("deterministic", args->deterministic); !status.ok()) return status;
  out->dout = to_cpp(args->dout);
  out->lse = to_cpp(args->lse);
  out->dq = to_cpp(args->dq);
  out->dk = to_cpp(args->dk);
  out->dv = to_cpp(args->dv);
  out->deterministic = args->deterministic == 1;
  for (const auto& [tensor, field] : {std::pair{args->cu_seqlens_q, &out->cu_seqlens_q},
                                      std::pair{args->cu_seqlens_k, &out->cu_seqlens_k},
                                      std::pair{args->seqused_q, &out->seqused_q},
                                      std::pair{args->seqused_k, &out->seqused_k}}) {
    if (tensor != nullptr) *field = to_cpp(*tensor);
  }
  out->max_seqlen_q = args->max_seqlen_q;
  out->max_seqlen_k = args->max_seqlen_k;
  return flashhop::Status::success();
}

}  // namespace

extern "C" {

flashhop_status_t flashhop_forward_workspace_size(const flashhop_forward_args_t* args, size_t* bytes) {
  return guarded([&] {
    flashhop::ForwardArgs cpp_args;
    if (flashhop::Status status = to_cpp(args, &cpp_args); !status.ok()) return status;
    return flashhop::forward_workspace_size(cpp_args, bytes);
  });
}

flashhop_status_t flashhop_forward(const flashhop_forward_args_t* args, void* workspace, size_t workspace_bytes,
                                   cudaStream_t stream) {
  return guarded([&] {
    flashhop::ForwardArgs cpp_args;
    if (flashhop::Status status = to_cpp(args, &cpp_args); !status.ok()) return status;
    return flashhop::forward(cpp_args, workspace, workspace_bytes, stream);
  });
}

flashhop_status_t flashhop_backward_workspace_size(const flashhop_backward_args_t* args, size_t* bytes) {
  return guarded([&] {
    flashhop::BackwardArgs cpp_args;
    if (flashhop::Status status = to_cpp(args, &cpp_args); !status.ok()) return status;
    return flashhop::backward_workspace_size(cpp_args, bytes);
  });
}

flashhop_status_t flashhop_backward(const flashhop_backward_args_t* args, void* workspace, size_t workspace_bytes,
                                    cudaStream_t stream) {
  return guarded([&] {
    flashhop::BackwardArgs cpp_args;
    if (flashhop::Status status = to_cpp(args, &cpp_args); !status.ok()) return status;
    return flashhop::backward(cpp_args, workspace, workspace_bytes, stream);
  });
}

flashhop_status_t flashhop_append_kv(const flashhop_append_kv_args_t* args, cudaStream_t stream) {
  return guarded([&] {
    if (args == nullptr) {
      return flashhop::Status{flashhop::StatusCode::kInvalidArgument, "args = null: expected append arguments"};
    }
    for (const auto& [name, value] : {std::pair{"rotary_interleaved", args->rotary_interleaved},
                                      std::pair{"q_positions_advance", args->q_positions_advance}}) {
      if (flashhop::Status status = check_flag(name, value); !status.ok()) return status;
    }
    flashhop::AppendKvArgs cpp_args;
    cpp_args.k_cache = to_cpp(args->k_cache);
    cpp_args.v_cache = to_cpp(args->v_cache);
    cpp_args.page_table = to_cpp(args->page_table);
    cpp_args.cache_seqlens = to_cpp(args->cache_seqlens);
    cpp_args.k_new = to_cpp(args->k_new);
    cpp_args.v_new = to_cpp(args->v_new);
    cpp_args.cu_seqlens_new = to_cpp(args->cu_seqlens_new);
    for (const auto& [tensor, field] : {std::pair{args->rotary_cos, &cpp_args.rotary_cos},
                                        std::pair{args->rotary_sin, &cpp_args.rotary_sin},
                                        std::pair{args->rotary_seqlens, &cpp_args.rotary_seqlens},
                                        std::pair{args->q, &cpp_args.q},
                                        std::pair{args->q_rotated, &cpp_args.q_rotated},
                                        std::pair{args->cu_seqlens_q, &cpp_args.cu_seqlens_q}}) {
      if (tensor != nullptr) *field = to_cpp(*tensor);
    }
    cpp_args.rotary_interleaved = args->rotary_interleaved == 1;
    cpp_args.q_positions_advance = args->q_positions_advance == 1;
    return flashhop::append_kv(cpp_args, stream);
  });
}

flashhop_status_t flashhop_combine(const flashhop_combine_args_t* args, cudaStream_t stream) {
  return guarded([&] {
    if (args == nullptr) {
      return flashhop::Status{flashhop::StatusCode::kInvalidArgument, "args = null: expected combine arguments"};
    }
    flashhop::CombineArgs cpp_args{to_cpp(args->out_partial), to_cpp(args->lse_partial), to_cpp(args->out), {}};
    if (args->lse != nullptr) cpp_args.lse = to_cpp(*args->lse);
    return flashhop::combine(cpp_args, stream);
  });
}

flashhop_status_t flashhop_quantize_fp8(const flashhop_quantize_fp8_args_t* args, cudaStream_t stream) {
  return guarded([&] {
    if (args == nullptr) {
      return flashhop::Status{flashhop::StatusCode::kInvalidArgument, "args = null: expected quantize arguments"};
    }
    if (args->scaling != FLASHHOP_FP8_PER_TENSOR && args->scaling != FLASHHOP_FP8_PER_HEAD &&
        args->scaling != FLASHHOP_FP8_PER_BLOCK) {
      return flashhop::Status{flashhop::StatusCode::kInvalidArgument,
                              "scaling = " + std::to_string(static_cast<int>(args->scaling)) +
                                  ": expected FLASHHOP_FP8_PER_TENSOR (0), _PER_HEAD (1) or _PER_BLOCK (2)"};
    }
    flashhop::QuantizeFp8Args cpp_args;
    cpp_args.x = to_cpp(args->x);
    cpp_args.out = to_cpp(args->out);
    cpp_args.descale = to_cpp(args->descale);
    cpp_args.scaling = static_cast<flashhop::Fp8Scaling>(args->scaling);
    if (args->hadamard_signs != nullptr) cpp_args.hadamard_signs = to_cpp(*args->hadamard_signs);
    return flashhop::quantize_fp8(cpp_args, stream);
  });
}

const char* flashhop_last_error(void) { return last_error.c_str(); }

}  // extern "C"
