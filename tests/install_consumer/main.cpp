// Links the installed flashhop and calls the parts of its API that need no GPU: validation and the
// workspace size, of a valid call and of an invalid one, through the C++ and the C API. The tensors
// are descriptors of fake device addresses, which these calls never read. Exits 0 when every result
// is the documented one, else prints what differed and exits 1.
#include <flashhop/flashhop.h>
#include <flashhop/flashhop_c.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

namespace {

int failures = 0;

void expect(bool condition, const std::string& what) {
  if (!condition) {
    std::fprintf(stderr, "install consumer: expected %s\n", what.c_str());
    ++failures;
  }
}

void* fake_address(std::uintptr_t megabytes) { return reinterpret_cast<void*>(megabytes << 20); }

// q (2, 100, 8, 64), k and v (2, 130, 2, 64), o like q, bf16; causal.
flashhop::ForwardArgs causal_gqa_args() {
  using flashhop::DType;
  flashhop::ForwardArgs args;
  args.q = flashhop::make_contiguous(fake_address(1), DType::kBFloat16, {2, 100, 8, 64});
  args.k = flashhop::make_contiguous(fake_address(2), DType::kBFloat16, {2, 130, 2, 64});
  args.v = flashhop::make_contiguous(fake_address(3), DType::kBFloat16, {2, 130, 2, 64});
  args.o = flashhop::make_contiguous(fake_address(4), DType::kBFloat16, {2, 100, 8, 64});
  args.causal = true;
  return args;
}

void check_cpp_api() {
  const flashhop::ForwardArgs args = causal_gqa_args();
  const flashhop::Status valid = flashhop::validate_forward(args);
  expect(valid.ok(), "validate_forward to accept a valid call, got: " + valid.message);

  std::size_t bytes = 0;
  const flashhop::Status sized = flashhop::forward_workspace_size(args, &bytes);
  expect(sized.ok(), "forward_workspace_size to succeed on a valid call, got: " + sized.message);
  expect(bytes > 0, "a workspace (the causal tile queue's counter), got " + std::to_string(bytes) + " bytes");

  flashhop::ForwardArgs bad = args;
  // nheads 8 is no multiple of nheads_kv 3.
  bad.k = flashhop::make_contiguous(bad.k.data, bad.k.dtype, {2, 130, 3, 64});
  bad.v = flashhop::make_contiguous(bad.v.data, bad.v.dtype, {2, 130, 3, 64});
  const flashhop::Status invalid = flashhop::validate_forward(bad);
  expect(invalid.code == flashhop::StatusCode::kInvalidArgument,
         "kInvalidArgument for nheads 8 over nheads_kv 3, got code " + std::to_string(static_cast<int>(invalid.code)));
  expect(invalid.message.find("nheads_kv") != std::string::npos,
         "a message naming nheads_kv, got: " + invalid.message);
}

flashhop_tensor_t c_tensor(std::uintptr_t megabytes, std::int64_t seqlen, std::int64_t nheads) {
  flashhop_tensor_t tensor{};
  tensor.data = fake_address(megabytes);
  tensor.dtype = FLASHHOP_BFLOAT16;
  tensor.rank = 4;
  const std::int64_t shape[4] = {2, seqlen, nheads, 64};
  std::int64_t stride = 1;
  for (int d = 3; d >= 0; --d) {
    tensor.shape[d] = shape[d];
    tensor.stride[d] = stride;
    stride *= shape[d];
  }
  return tensor;
}

void check_c_api() {
  flashhop_forward_args_t args{};
  args.q = c_tensor(1, 100, 8);
  args.k = c_tensor(2, 130, 2);
  args.v = c_tensor(3, 130, 2);
  args.o = c_tensor(4, 100, 8);
  args.causal = 1;
  size_t bytes = 0;
  expect(flashhop_forward_workspace_size(&args, &bytes) == FLASHHOP_SUCCESS,
         std::string("flashhop_forward_workspace_size to succeed, got: ") + flashhop_last_error());

  args.o = c_tensor(4, 100, 4);  // o's nheads must be q's
  expect(flashhop_forward_workspace_size(&args, &bytes) == FLASHHOP_INVALID_ARGUMENT,
         "FLASHHOP_INVALID_ARGUMENT for o with 4 heads where q has 8");
  expect(std::string(flashhop_last_error()).find("o.shape[2]") != std::string::npos,
         std::string("a message naming o.shape[2], got: ") + flashhop_last_error());
}

}  // namespace

int main() {
  check_cpp_api();
  check_c_api();
  if (failures > 0) {
    std::fprintf(stderr, "install consumer: %d check(s) failed\n", failures);
    return 1;
  }
  std::printf("install consumer: flashhop's C++ and C APIs validated a call and sized its workspace\n");
  return 0;
}
