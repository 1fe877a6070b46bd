// flashhop-bench: times flashhop::forward (or, with --bwd, flashhop::backward) on one configuration
// or on a named sweep, next to the cuBLAS bf16 GEMM rate measured in the same run, and with --check
// compares each forward output with the CPU reference (bench_check.h says how). `flashhop-bench
// --help` lists the flags.
//
// Method (the tool library's device/METHOD.md): random normal inputs drawn on the device, fresh for
// every configuration; as many input sets as it takes to exceed three times the L2 cache, rotated
// between calls, so that no timed call finds its inputs in L2; warm-up calls (by count and, with
// --warmup-ms, by time), then one CUDA event pair around each timed call and the median. FLOPs
// follow FlashAttention: 2 * b * h * pairs * (d + dv), where pairs is sq * sk without a mask,
// sq * sk / 2 for the causal mask with sq == sk (the convention the peers' numbers use; also when
// that mask is given as the window (-1, 0)), and otherwise (causal with sq != sk, sliding windows)
// the exact count of (query, key) pairs the bottom-right aligned band leaves visible. Soft-capping
// adds nothing to the count. The backward's FLOPs are 2.5 times the forward's (FlashAttention's
// convention: five GEMMs of the forward's size for its two). K/V bandwidth, for every configuration: the bytes of K and V,
// b * sk * h_kv * (d + dv) * element size, over the time, as if each were read once; the figure
// that bounds decoding (PEERS.md), only a lower bound on the traffic where several query tiles read
// the same K/V.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include "bench_check.h"
#include "bench_device.h"
#include "flashhop/flashhop.h"
#include "reference/attention_ref.h"

namespace flashhop::bench {
namespace {

constexpr int kGemmSize = 8192;
constexpr int kMaxInputSets = 64;
constexpr double kL2Multiple = 3.0;  // rotated inputs span at least this many L2 caches

struct Config {
  int batch = 4, seqlen_q = 4096, seqlen_k = 4096, nheads = 16, nheads_kv = 16, head_dim = 128, head_dim_v = 128;
  DType dtype = DType::kBFloat16;
  bool causal = false;
  int window_left = -1, window_right = -1;  // as in ForwardArgs: -1 is unbounded
  float softcap = 0.f;
  PackGqa pack_gqa = PackGqa::kAuto;
};

struct Options {
  std::vector<Config> configs;
  std::string sweep;  // empty for a single configuration
  bool check = false;
  bool lse = true;  // the timed calls write LSE (--no-lse: they pass none, as an inference call would)
  bool backward = false;  // --bwd: time the backward of each configuration's forward call
  int warmup = 10, iters = 50;
  double warmup_ms = 0;  // the warm-up lasts at least this long too (bench_device.h: WarmUp)
  std::string json_path;
  std::uint64_t seed = 0;
};

struct Result {
  Config config;
  std::string error;  // empty when the configuration ran
  double ms = 0, tflops = 0, kv_tbps = 0;
  int input_sets = 0;
  std::optional<CheckResult> check;
};

const char* short_dtype(DType dtype) { return dtype == DType::kFloat16 ? "fp16" : "bf16"; }

// The --pack-gqa values and their modes.
constexpr std::pair<const char*, PackGqa> kPackGqaNames[] = {
    {"auto", PackGqa::kAuto}, {"on", PackGqa::kOn}, {"off", PackGqa::kOff}};

const char* pack_gqa_name(PackGqa mode) {
  for (const auto& [name, value] : kPackGqaNames) {
    if (value == mode) return name;
  }
  return "?";
}

void print_usage(std::FILE* out) {
  std::fprintf(out,
      "Usage: flashhop-bench [configuration | --sweep NAME] [--bwd | --check] [--no-lse] [--iters N] [--warmup N]\n"
      "                      [--warmup-ms MS] [--seed N] [--json FILE]\n"
      "Configuration (defaults in brackets):\n"
      "  --batch N [4]  --seqlen N [4096] (or --seqlen-q N --seqlen-k N)  --nheads N [16]\n"
      "  --nheads-kv N [= nheads]  --head-dim N [128]  --head-dim-v N [= head dim]\n"
      "  --dtype bf16|fp16 [bf16]  --causal  --window-left N [-1]  --window-right N [-1]\n"
      "                    (sliding window, bottom-right aligned; -1: unbounded)\n"
      "  --softcap X [0]   scores s become X * tanh(s / X); 0: off\n"
      "  --pack-gqa auto|on|off [auto]  query heads that share a KV head packed into one query tile\n"
      "                    (ForwardArgs::pack_gqa; auto: packed where that fills the tiles better)\n"
      "Sweeps:\n"
      "  --sweep peers     the grid of PEERS.md: d in {64,128,256}, nheads = 2048/d, seqlen in\n"
      "                    {512,...,16384} with batch = 16384/seqlen, causal no/yes, bf16\n"
      "  --sweep features  bf16, seqlen 8192, batch 2, 16 heads: d = 128 full, causal, causal with\n"
      "                    window (1024, 0), window (1024, 1024), softcap 30 full and causal; and\n"
      "                    d = 96, 192 and 192 with dv = 128, full and causal\n"
      "  --sweep gqa       bf16, d = 128, 32 query / 8 KV heads, each with --pack-gqa on and off:\n"
      "                    decode (seqlen_q 1) batch 64 x seqlen_k 32768 and batch 8 x 8192; seqlen_q\n"
      "                    16 and 128, seqlen_k 8192, batch 8, causal no/yes\n"
      "                    With a sweep, --head-dim N and --causal keep only its configurations with\n"
      "                    that head dim, or causal ones, and --no-mask those without a mask\n"
      "Other:\n"
      "  --bwd             time the backward (dq, dk, dv from the forward's o, lse and a random dout;\n"
      "                    FLOPs 2.5 x the forward's); its correctness is the GPU tests' (no --check)\n"
      "  --check           compare O and LSE with the CPU double-precision reference\n"
      "  --no-lse          the timed calls pass no LSE output (the checked call still writes it)\n"
      "  --iters N [50]    timed calls per configuration (median reported); --warmup N [10]\n"
      "  --warmup-ms MS [0]  the warm-up also lasts at least MS milliseconds (wall clock)\n"
      "  --seed N          seed of the random inputs [drawn at start, printed]\n"
      "  --json FILE       write every result as JSON\n"
      "Exit status: 0 when every configuration ran (and passed --check); 1 otherwise; 2 on bad flags.\n");
}

std::vector<Config> peers_sweep() {
  std::vector<Config> configs;
  for (int head_dim : {64, 128, 256}) {
    for (bool causal : {false, true}) {
      for (int seqlen : {512, 1024, 2048, 4096, 8192, 16384}) {
        Config c;
        c.batch = 16384 / seqlen;
        c.seqlen_q = c.seqlen_k = seqlen;
        c.nheads = c.nheads_kv = 2048 / head_dim;
        c.head_dim = c.head_dim_v = head_dim;
        c.causal = causal;
        configs.push_back(c);
      }
    }
  }
  return configs;
}

// What flashhop does beyond the peers grid, each at one size (bf16, batch 2, seqlen 8192, 16 heads):
// the masks and soft-capping at d = 128, then the other head dims without and with the causal mask.
std::vector<Config> features_sweep() {
  struct Variant {
    int head_dim, head_dim_v;
    bool causal;
    int window_left, window_right;
    float softcap;
  };
  constexpr Variant kVariants[] = {
      {128, 128, false, -1, -1, 0.f},     {128, 128, true, -1, -1, 0.f},   {128, 128, true, 1024, 0, 0.f},
      {128, 128, false, 1024, 1024, 0.f}, {128, 128, false, -1, -1, 30.f}, {128, 128, true, -1, -1, 30.f},
      {96, 96, false, -1, -1, 0.f},       {96, 96, true, -1, -1, 0.f},     {192, 192, false, -1, -1, 0.f},
      {192, 192, true, -1, -1, 0.f},      {192, 128, false, -1, -1, 0.f},  {192, 128, true, -1, -1, 0.f},
  };
  std::vector<Config> configs;
  for (const Variant& variant : kVariants) {
    Config c;
    c.batch = 2;
    c.seqlen_q = c.seqlen_k = 8192;
    c.nheads = c.nheads_kv = 16;
    c.head_dim = variant.head_dim;
    c.head_dim_v = variant.head_dim_v;
    c.causal = variant.causal;
    c.window_left = variant.window_left;
    c.window_right = variant.window_right;
    c.softcap = variant.softcap;
    configs.push_back(c);
  }
  return configs;
}

// GQA decoding and short-query prefill (bf16, d = 128, 32 query / 8 KV heads), each shape with the
// query heads of a KV group packed into one query tile and not: decode at PEERS.md's batch 64 x 32k
// keys and at batch 8 x 8k, then 16 and 128 queries on 8k keys, batch 8, without and with causal.
std::vector<Config> gqa_sweep() {
  struct Shape {
    int batch, seqlen_q, seqlen_k;
    bool causal;
  };
  constexpr Shape kShapes[] = {
      {64, 1, 32768, false}, {8, 1, 8192, false},  {8, 16, 8192, false},
      {8, 16, 8192, true},   {8, 128, 8192, false}, {8, 128, 8192, true},
  };
  std::vector<Config> configs;
  for (const Shape& shape : kShapes) {
    for (PackGqa pack_gqa : {PackGqa::kOn, PackGqa::kOff}) {
      Config c;
      c.batch = shape.batch;
      c.seqlen_q = shape.seqlen_q;
      c.seqlen_k = shape.seqlen_k;
      c.nheads = 32;
      c.nheads_kv = 8;
      c.causal = shape.causal;
      c.pack_gqa = pack_gqa;
      configs.push_back(c);
    }
  }
  return configs;
}

// Parses the command line; on a bad flag prints why and returns nothing.
std::optional<Options> parse_options(int argc, char** argv) {
  Options options;
  Config config;
  std::optional<int> seqlen, seqlen_q, seqlen_k, nheads_kv, head_dim_v;
  bool head_dim_given = false;
  bool seed_given = false;
  bool no_mask = false;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    std::optional<std::string> value;
    if (const auto eq = flag.find('='); eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag.resize(eq);
    }
    auto next_value = [&]() -> std::optional<std::string> {
      if (value) return value;
      if (i + 1 < argc) return std::string(argv[++i]);
      std::fprintf(stderr, "flashhop-bench: %s needs a value\n", flag.c_str());
      return std::nullopt;
    };
    auto int_at_least = [&](long minimum, int* out) {
      const auto text = next_value();
      if (!text) return false;
      char* end = nullptr;
      const long parsed = std::strtol(text->c_str(), &end, 10);
      if (text->empty() || *end != '\0' || parsed < minimum || parsed > (1l << 30)) {
        std::fprintf(stderr, "flashhop-bench: %s expects an integer from %ld to 2^30, got '%s'\n", flag.c_str(),
                     minimum, text->c_str());
        return false;
      }
      *out = int(parsed);
      return true;
    };
    auto positive_int = [&](int* out) { return int_at_least(1, out); };
    int number = 0;
    if (flag == "--help" || flag == "-h") {
      print_usage(stdout);
      std::exit(0);
    } else if (flag == "--batch") {
      if (!positive_int(&config.batch)) return std::nullopt;
    } else if (flag == "--seqlen" || flag == "--seqlen-q" || flag == "--seqlen-k") {
      if (!positive_int(&number)) return std::nullopt;
      (flag == "--seqlen" ? seqlen : flag == "--seqlen-q" ? seqlen_q : seqlen_k) = number;
    } else if (flag == "--nheads") {
      if (!positive_int(&config.nheads)) return std::nullopt;
    } else if (flag == "--nheads-kv") {
      if (!positive_int(&number)) return std::nullopt;
      nheads_kv = number;
    } else if (flag == "--head-dim") {
      if (!positive_int(&config.head_dim)) return std::nullopt;
      head_dim_given = true;
    } else if (flag == "--head-dim-v") {
      if (!positive_int(&number)) return std::nullopt;
      head_dim_v = number;
    } else if (flag == "--dtype") {
      const auto text = next_value();
      if (!text) return std::nullopt;
      if (*text == "bf16") {
        config.dtype = DType::kBFloat16;
      } else if (*text == "fp16") {
        config.dtype = DType::kFloat16;
      } else {
        std::fprintf(stderr, "flashhop-bench: --dtype expects bf16 or fp16, got '%s'\n", text->c_str());
        return std::nullopt;
      }
    } else if (flag == "--causal") {
      config.causal = true;
    } else if (flag == "--no-mask") {
      no_mask = true;
    } else if (flag == "--window-left") {
      if (!int_at_least(-1, &config.window_left)) return std::nullopt;
    } else if (flag == "--window-right") {
      if (!int_at_least(-1, &config.window_right)) return std::nullopt;
    } else if (flag == "--softcap") {
      const auto text = next_value();
      if (!text) return std::nullopt;
      char* end = nullptr;
      const float parsed = std::strtof(text->c_str(), &end);
      if (text->empty() || *end != '\0' || !std::isfinite(parsed) || parsed < 0) {
        std::fprintf(stderr, "flashhop-bench: --softcap expects a finite number >= 0, got '%s'\n", text->c_str());
        return std::nullopt;
      }
      config.softcap = parsed;
    } else if (flag == "--pack-gqa") {
      const auto text = next_value();
      if (!text) return std::nullopt;
      const auto known = std::find_if(std::begin(kPackGqaNames), std::end(kPackGqaNames),
                                      [&](const auto& entry) { return *text == entry.first; });
      if (known == std::end(kPackGqaNames)) {
        std::fprintf(stderr, "flashhop-bench: --pack-gqa expects auto, on or off, got '%s'\n", text->c_str());
        return std::nullopt;
      }
      config.pack_gqa = known->second;
    } else if (flag == "--sweep") {
      const auto text = next_value();
      if (!text) return std::nullopt;
      if (*text != "peers" && *text != "features" && *text != "gqa") {
        std::fprintf(stderr, "flashhop-bench: unknown sweep '%s' (known: peers, features, gqa)\n", text->c_str());
        return std::nullopt;
      }
      options.sweep = *text;
    } else if (flag == "--check") {
      options.check = true;
    } else if (flag == "--bwd") {
      options.backward = true;
    } else if (flag == "--no-lse") {
      options.lse = false;
    } else if (flag == "--iters") {
      if (!positive_int(&options.iters)) return std::nullopt;
    } else if (flag == "--warmup") {
      const auto text = next_value();
      if (!text) return std::nullopt;
      options.warmup = std::max(0, std::atoi(text->c_str()));
    } else if (flag == "--warmup-ms") {
      const auto text = next_value();
      if (!text) return std::nullopt;
      options.warmup_ms = std::max(0.0, std::atof(text->c_str()));
    } else if (flag == "--seed") {
      const auto text = next_value();
      if (!text) return std::nullopt;
      options.seed = std::strtoull(text->c_str(), nullptr, 0);
      seed_given = true;
    } else if (flag == "--json") {
      const auto text = next_value();
      if (!text) return std::nullopt;
      options.json_path = *text;
    } else {
      std::fprintf(stderr, "flashhop-bench: unknown flag '%s' (see --help)\n", argv[i]);
      return std::nullopt;
    }
  }
  if (options.backward && options.check) {
    std::fprintf(stderr, "flashhop-bench: --check compares forward outputs; with --bwd the GPU tests "
                         "(BackwardGpu.*) check the gradients\n");
    return std::nullopt;
  }
  config.seqlen_q = seqlen_q.value_or(seqlen.value_or(config.seqlen_q));
  config.seqlen_k = seqlen_k.value_or(seqlen.value_or(config.seqlen_k));
  config.nheads_kv = nheads_kv.value_or(config.nheads);
  config.head_dim_v = head_dim_v.value_or(config.head_dim);
  if (options.sweep.empty()) {
    options.configs = {config};
  } else {
    options.configs = options.sweep == "peers"      ? peers_sweep()
                      : options.sweep == "features" ? features_sweep()
                                                    : gqa_sweep();
    const auto unselected = [&](const Config& c) {
      const bool masked = c.causal || c.window_left >= 0 || c.window_right >= 0;
      return (head_dim_given && c.head_dim != config.head_dim) || (config.causal && !c.causal) ||
             (no_mask && masked);
    };
    options.configs.erase(std::remove_if(options.configs.begin(), options.configs.end(), unselected),
                          options.configs.end());
  }
  if (!seed_given) options.seed = (std::uint64_t(std::random_device{}()) << 32) | std::random_device{}();
  return options;
}

reference::AttentionShape attention_shape(const Config& c) {
  reference::AttentionShape shape;
  shape.batch = c.batch, shape.seqlen_q = c.seqlen_q, shape.seqlen_k = c.seqlen_k;
  shape.nheads = c.nheads, shape.nheads_kv = c.nheads_kv;
  shape.head_dim = c.head_dim, shape.head_dim_v = c.head_dim_v;
  return shape;
}

// What the call does to the scores, with the scale forward() defaults to: 1/sqrt(d) rounded to float.
reference::ScoreOptions score_options(const Config& c) {
  reference::ScoreOptions score;
  score.softmax_scale = static_cast<float>(1.0 / std::sqrt(double(c.head_dim)));
  score.softcap = c.softcap;
  score.causal = c.causal;
  score.window_left = c.window_left;
  score.window_right = c.window_right;
  return score;
}

// Visible (query, key) pairs per head, by the FLOP convention in this file's header comment.
double attended_pairs(const Config& c) {
  const int right = c.causal ? 0 : c.window_right;
  const double full = double(c.seqlen_q) * c.seqlen_k;
  if (c.window_left < 0 && right < 0) return full;
  if (c.window_left < 0 && right == 0 && c.seqlen_q == c.seqlen_k) return full / 2;
  const reference::AttentionShape shape = attention_shape(c);
  const reference::ScoreOptions options = score_options(c);
  double pairs = 0;
  for (std::int64_t i = 0; i < c.seqlen_q; ++i) {
    const reference::VisibleKeys keys = reference::visible_keys(shape, options, i);
    pairs += double(keys.end - keys.begin);
  }
  return pairs;
}

double forward_flops(const Config& c) {
  return 2.0 * c.batch * c.nheads * attended_pairs(c) * (c.head_dim + c.head_dim_v);
}

double backward_flops(const Config& c) { return 2.5 * forward_flops(c); }

// The bytes of K and V, by the bandwidth convention in this file's header comment.
double kv_bytes(const Config& c) {
  return double(c.batch) * c.seqlen_k * c.nheads_kv * (c.head_dim + c.head_dim_v) * dtype_size(c.dtype);
}

// The device tensors of one forward call, contiguous in flashhop's layout, and with --bwd those of
// its backward (dout random, the gradients written by the timed calls).
struct InputSet {
  DeviceBuffer q, k, v, o, lse;
  ForwardArgs args;
  DeviceBuffer dout, dq, dk, dv;
  BackwardArgs backward;
};

InputSet make_input_set(const Config& c, std::uint64_t seed, cudaStream_t stream) {
  const std::int64_t q_elems = std::int64_t(c.batch) * c.seqlen_q * c.nheads * c.head_dim;
  const std::int64_t k_elems = std::int64_t(c.batch) * c.seqlen_k * c.nheads_kv * c.head_dim;
  const std::int64_t v_elems = std::int64_t(c.batch) * c.seqlen_k * c.nheads_kv * c.head_dim_v;
  const std::int64_t o_elems = std::int64_t(c.batch) * c.seqlen_q * c.nheads * c.head_dim_v;
  const std::int64_t lse_elems = std::int64_t(c.batch) * c.nheads * c.seqlen_q;
  const std::size_t elem = dtype_size(c.dtype);
  InputSet set{DeviceBuffer(q_elems * elem), DeviceBuffer(k_elems * elem), DeviceBuffer(v_elems * elem),
               DeviceBuffer(o_elems * elem), DeviceBuffer(lse_elems * sizeof(float)), {}, {}, {}, {}, {}, {}};
  fill_random_normal(set.q.data(), q_elems, c.dtype, seed * 4 + 0, stream);
  fill_random_normal(set.k.data(), k_elems, c.dtype, seed * 4 + 1, stream);
  fill_random_normal(set.v.data(), v_elems, c.dtype, seed * 4 + 2, stream);

  int device = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  set.args.q = make_contiguous(set.q.data(), c.dtype, {c.batch, c.seqlen_q, c.nheads, c.head_dim}, device);
  set.args.k = make_contiguous(set.k.data(), c.dtype, {c.batch, c.seqlen_k, c.nheads_kv, c.head_dim}, device);
  set.args.v = make_contiguous(set.v.data(), c.dtype, {c.batch, c.seqlen_k, c.nheads_kv, c.head_dim_v}, device);
  set.args.o = make_contiguous(set.o.data(), c.dtype, {c.batch, c.seqlen_q, c.nheads, c.head_dim_v}, device);
  set.args.lse = make_contiguous(set.lse.data(), DType::kFloat32, {c.batch, c.nheads, c.seqlen_q}, device);
  set.args.causal = c.causal;
  set.args.window_left = c.window_left;
  set.args.window_right = c.window_right;
  set.args.softcap = c.softcap;
  set.args.pack_gqa = c.pack_gqa;
  return set;
}

// Adds the backward's tensors to `set`, whose forward call has written o and lse.
void add_backward(const Config& c, std::uint64_t seed, cudaStream_t stream, InputSet* set) {
  const std::size_t elem = dtype_size(c.dtype);
  set->dout = DeviceBuffer(set->o.bytes());
  set->dq = DeviceBuffer(set->q.bytes());
  set->dk = DeviceBuffer(set->k.bytes());
  set->dv = DeviceBuffer(set->v.bytes());
  fill_random_normal(set->dout.data(), std::int64_t(set->o.bytes() / elem), c.dtype, seed * 4 + 3, stream);
  const ForwardArgs& f = set->args;
  BackwardArgs& b = set->backward;
  b.q = f.q, b.k = f.k, b.v = f.v, b.o = f.o, b.lse = *f.lse;
  b.dout = f.o, b.dout.data = set->dout.data();
  b.dq = f.q, b.dq.data = set->dq.data();
  b.dk = f.k, b.dk.data = set->dk.data();
  b.dv = f.v, b.dv.data = set->dv.data();
  b.causal = f.causal, b.window_left = f.window_left, b.window_right = f.window_right, b.softcap = f.softcap;
}

std::size_t input_set_bytes(const Config& c) {
  const std::size_t elem = dtype_size(c.dtype);
  const std::size_t q_and_o = std::size_t(c.batch) * c.seqlen_q * c.nheads * (c.head_dim + c.head_dim_v) * elem;
  const std::size_t k_and_v = std::size_t(c.batch) * c.seqlen_k * c.nheads_kv * (c.head_dim + c.head_dim_v) * elem;
  return q_and_o + k_and_v + std::size_t(c.batch) * c.nheads * c.seqlen_q * sizeof(float);
}

// With --bwd a set also holds dout, dq, dk and dv: twice q, k, v and o.
std::size_t set_bytes_of(const Config& c, bool backward) { return input_set_bytes(c) * (backward ? 2 : 1); }

template <typename T>
std::vector<T> copy_to_host(const DeviceBuffer& buffer) {
  std::vector<T> host(buffer.bytes() / sizeof(T));
  cuda_check(cudaMemcpy(host.data(), buffer.data(), buffer.bytes(), cudaMemcpyDeviceToHost),
             "cudaMemcpy device to host");
  return host;
}

// Runs one configuration: the check call (outputs poisoned first), then the timed calls.
Result run_config(const Config& c, const Options& options, std::uint64_t seed, cudaStream_t stream) {
  Result result;
  result.config = c;
  try {
    int device = 0;
    cuda_check(cudaGetDevice(&device), "cudaGetDevice");
    int l2_bytes = 0;
    cuda_check(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device), "L2 cache size");
    std::size_t free_bytes = 0, total_bytes = 0;
    cuda_check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
    const std::size_t set_bytes = set_bytes_of(c, options.backward);
    const double wanted = std::ceil(kL2Multiple * l2_bytes / double(set_bytes));
    // Rotating sets may take at most half of the free memory; one set always.
    const double affordable = std::floor(0.5 * double(free_bytes) / double(set_bytes));
    result.input_sets = int(std::clamp(std::min(wanted, affordable), 1.0, double(kMaxInputSets)));

    std::vector<InputSet> sets;
    for (int s = 0; s < result.input_sets; ++s) sets.push_back(make_input_set(c, seed + s, stream));

    std::size_t workspace_bytes = 0;
    if (const Status status = forward_workspace_size(sets[0].args, &workspace_bytes); !status.ok()) {
      result.error = "forward_workspace_size: " + status.message;
      return result;
    }
    DeviceBuffer workspace(workspace_bytes);

    auto call = [&](int i) {
      const Status status = forward(sets[i % sets.size()].args, workspace.data(), workspace_bytes, stream);
      if (!status.ok()) throw BenchError("forward: " + status.message);
      cuda_check(cudaGetLastError(), "after forward");
    };

    if (options.backward) {
      // Each set's forward runs once, untimed, for its o and lse; then the backward calls are timed.
      for (int s = 0; s < result.input_sets; ++s) {
        call(s);
        add_backward(c, seed + s, stream, &sets[s]);
      }
      std::size_t backward_bytes = 0;
      if (const Status status = backward_workspace_size(sets[0].backward, &backward_bytes); !status.ok()) {
        result.error = "backward_workspace_size: " + status.message;
        return result;
      }
      DeviceBuffer backward_workspace(backward_bytes);
      auto backward_call = [&](int i) {
        const Status status = flashhop::backward(sets[i % sets.size()].backward, backward_workspace.data(),
                                                 backward_bytes, stream);
        if (!status.ok()) throw BenchError("backward: " + status.message);
        cuda_check(cudaGetLastError(), "after backward");
      };
      result.ms = median_time_ms(backward_call, {options.warmup, options.warmup_ms}, options.iters, stream);
      result.tflops = backward_flops(c) / (result.ms * 1e-3) / 1e12;
      result.kv_tbps = kv_bytes(c) / (result.ms * 1e-3) / 1e12;
      return result;
    }

    if (options.check) {
      poison(sets[0].o, stream);
      poison(sets[0].lse, stream);
      call(0);
      cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize after the checked call");
      HostTensors host;
      host.dtype = c.dtype;
      host.q = copy_to_host<std::uint16_t>(sets[0].q);
      host.k = copy_to_host<std::uint16_t>(sets[0].k);
      host.v = copy_to_host<std::uint16_t>(sets[0].v);
      host.o = copy_to_host<std::uint16_t>(sets[0].o);
      host.lse = copy_to_host<float>(sets[0].lse);
      result.check = check_forward(attention_shape(c), score_options(c), host);
    }
    if (!options.lse) {
      for (InputSet& set : sets) set.args.lse.reset();
    }

    result.ms = median_time_ms(call, {options.warmup, options.warmup_ms}, options.iters, stream);
    result.tflops = forward_flops(c) / (result.ms * 1e-3) / 1e12;
    result.kv_tbps = kv_bytes(c) / (result.ms * 1e-3) / 1e12;
  } catch (const BenchError& error) {
    result.error = error.what();
    // A failed launch can leave work or an error behind; start the next configuration clean.
    cudaStreamSynchronize(stream);
    cudaGetLastError();
  }
  return result;
}

bool result_ok(const Result& r) { return r.error.empty() && (!r.check || r.check->passed); }

// "128", or "192x128" where dv differs from d.
std::string head_dims(const Config& c) {
  return std::to_string(c.head_dim) + (c.head_dim_v != c.head_dim ? "x" + std::to_string(c.head_dim_v) : "");
}

// The mask and soft-capping in a few words: "none", "causal", "w(61,17)", "causal w(300,0) softcap 30".
// Under causal the window's right side is 0 whatever window_right says, so a window shows only when it
// adds a bound.
std::string mask_name(const Config& c) {
  std::ostringstream out;
  const char* separator = "";
  auto add = [&](const auto&... parts) {
    out << separator;
    (out << ... << parts);
    separator = " ";
  };
  if (c.causal) add("causal");
  if (c.window_left >= 0 || (!c.causal && c.window_right >= 0)) {
    add("w(", c.window_left, ",", c.causal ? 0 : c.window_right, ")");
  }
  if (c.softcap > 0) add("softcap ", c.softcap);
  const std::string name = out.str();
  return name.empty() ? "none" : name;
}

std::string describe(const Config& c) {
  std::ostringstream out;
  out << "b=" << c.batch << " sq=" << c.seqlen_q << " sk=" << c.seqlen_k << " h=" << c.nheads << "/"
      << c.nheads_kv << " d=" << head_dims(c) << " " << short_dtype(c.dtype);
  if (const std::string mask = mask_name(c); mask != "none") out << " " << mask;
  if (c.pack_gqa != PackGqa::kAuto) out << " pack-gqa=" << pack_gqa_name(c.pack_gqa);
  return out.str();
}

// One line per result, written as each configuration finishes.
void print_progress(const Result& r, double gemm_tflops) {
  if (!r.error.empty()) {
    std::printf("%-58s ERROR %s\n", describe(r.config).c_str(), r.error.c_str());
  } else {
    std::printf("%-58s %9.3f ms %7.1f TFLOP/s %5.1f%% of GEMM %6.2f TB/s K/V  (%d input set%s)\n",
                describe(r.config).c_str(), r.ms, r.tflops, 100 * r.tflops / gemm_tflops, r.kv_tbps,
                r.input_sets, r.input_sets == 1 ? "" : "s");
  }
  if (r.check) {
    const CheckResult& k = *r.check;
    std::printf("    check %s: O max|err| %.3g (tol %.3g = 2 x baseline %.3g + atol%s), rel L2 %.3g; "
                "LSE max|err| %.3g (tol %.3g)",
                k.passed ? "PASS" : "FAIL", k.o_max_abs_err, k.o_tolerance, k.o_baseline_max_abs_err,
                r.config.softcap > 0 ? " + softcap term" : "", k.o_rel_l2_err, k.lse_max_abs_err, k.lse_tolerance);
    if (k.nonfinite_o || k.nan_lse || k.lse_inf_mismatch) {
      std::printf("; non-finite O %lld, NaN LSE %lld, -inf LSE mismatches %lld", (long long)k.nonfinite_o,
                  (long long)k.nan_lse, (long long)k.lse_inf_mismatch);
    }
    std::printf("\n    compared: %s\n", k.scope.c_str());
  }
  std::fflush(stdout);
}

// Where a sweep stands, on stderr so that stdout's table and the JSON stay as they are: configurations
// done of all, the time so far, and the time left at the mean pace so far (a guess: configurations
// differ in their check's and their calls' time).
void print_sweep_progress(std::size_t done, std::size_t total, std::chrono::steady_clock::time_point start) {
  if (total < 2) return;
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr, "[%zu/%zu] %.0f s so far, about %.0f s left\n", done, total, elapsed,
               elapsed / double(done) * double(total - done));
}

// The closing table: one row per configuration; a pack GQA column when some configuration sets it.
void print_table(const std::vector<Result>& results, double gemm_tflops, bool check) {
  const bool pack = std::any_of(results.begin(), results.end(),
                                [](const Result& r) { return r.config.pack_gqa != PackGqa::kAuto; });
  std::printf("\n| d (x dv) | mask | seqlen_q | seqlen_k | batch | heads (q/kv) | dtype |%s ms | TFLOP/s | of GEMM "
              "| K/V TB/s |%s\n",
              pack ? " pack GQA |" : "", check ? " check |" : "");
  std::printf("|---|---|---|---|---|---|---|%s---|---|---|---|%s\n", pack ? "---|" : "", check ? "---|" : "");
  for (const Result& r : results) {
    const Config& c = r.config;
    std::printf("| %s | %s | %d | %d | %d | %d/%d | %s | ", head_dims(c).c_str(), mask_name(c).c_str(), c.seqlen_q,
                c.seqlen_k, c.batch, c.nheads, c.nheads_kv, short_dtype(c.dtype));
    if (pack) std::printf("%s | ", pack_gqa_name(c.pack_gqa));
    if (r.error.empty()) {
      std::printf("%.3f | %.1f | %.1f%% | %.2f |", r.ms, r.tflops, 100 * r.tflops / gemm_tflops, r.kv_tbps);
    } else {
      std::printf("error | - | - | - |");
    }
    if (check) {
      std::printf(" %s |", !r.check ? "-" : r.check->passed ? "pass" : "FAIL");
    }
    std::printf("\n");
  }
}

// ---- JSON ------------------------------------------------------------------------------------

std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (const char ch : text) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", ch);
      out += escaped;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

// JSON has no NaN or infinity: those become null.
std::string json_number(double value) {
  if (!std::isfinite(value)) return "null";
  char text[32];
  std::snprintf(text, sizeof text, "%.6g", value);
  return text;
}

struct DeviceInfo {
  std::string name;
  int sm_count = 0, l2_bytes = 0, cc_major = 0, cc_minor = 0, runtime_version = 0, driver_version = 0;
  std::size_t memory_bytes = 0;
};

void write_json(const std::string& path, const Options& options, const DeviceInfo& device,
                double gemm_tflops, const std::vector<Result>& results) {
  std::ofstream out(path);
  out << "{\n  \"tool\": \"flashhop-bench\",\n";
  out << "  \"device\": {\"name\": " << json_string(device.name) << ", \"compute_capability\": \""
      << device.cc_major << "." << device.cc_minor << "\", \"sm_count\": " << device.sm_count
      << ", \"l2_bytes\": " << device.l2_bytes << ", \"memory_bytes\": " << device.memory_bytes
      << ", \"cuda_runtime\": " << device.runtime_version << ", \"cuda_driver\": " << device.driver_version
      << "},\n";
  out << "  \"sweep\": " << (options.sweep.empty() ? "null" : json_string(options.sweep)) << ",\n";
  out << "  \"seed\": " << options.seed << ", \"warmup\": " << options.warmup
      << ", \"warmup_ms\": " << json_number(options.warmup_ms) << ", \"iters\": " << options.iters
      << ", \"lse\": " << (options.lse ? "true" : "false") << ", \"pass\": \""
      << (options.backward ? "backward" : "forward") << "\",\n";
  out << "  \"flops_convention\": \"" << (options.backward ? "2.5 x " : "")
      << "2*b*h*pairs*(d+dv); pairs = sq*sk without a mask, causal sq==sk: sq*sk/2, "
         "other masks: exact count of the bottom-right band\",\n";
  out << "  \"kv_bandwidth_convention\": \"b*sk*h_kv*(d+dv)*element bytes / time: K and V counted once\",\n";
  out << "  \"gemm\": {\"m\": " << kGemmSize << ", \"n\": " << kGemmSize << ", \"k\": " << kGemmSize
      << ", \"dtype\": \"bf16\", \"tflops\": " << json_number(gemm_tflops) << "},\n";
  out << "  \"results\": [";
  for (std::size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    const Config& c = r.config;
    out << (i ? ",\n" : "\n") << "    {\"config\": {\"batch\": " << c.batch << ", \"seqlen_q\": " << c.seqlen_q
        << ", \"seqlen_k\": " << c.seqlen_k << ", \"nheads\": " << c.nheads << ", \"nheads_kv\": "
        << c.nheads_kv << ", \"head_dim\": " << c.head_dim << ", \"head_dim_v\": " << c.head_dim_v
        << ", \"dtype\": \"" << short_dtype(c.dtype) << "\", \"causal\": " << (c.causal ? "true" : "false")
        << ", \"window_left\": " << c.window_left << ", \"window_right\": " << c.window_right
        << ", \"softcap\": " << json_number(c.softcap) << ", \"pack_gqa\": \"" << pack_gqa_name(c.pack_gqa)
        << "\"},\n";
    out << "     \"status\": " << (r.error.empty() ? "\"ok\"" : "\"error\"")
        << ", \"error\": " << (r.error.empty() ? "null" : json_string(r.error));
    if (r.error.empty()) {
      out << ", \"ms\": " << json_number(r.ms) << ", \"tflops\": " << json_number(r.tflops)
          << ", \"fraction_of_gemm\": " << json_number(r.tflops / gemm_tflops)
          << ", \"kv_tbps\": " << json_number(r.kv_tbps) << ", \"input_sets\": " << r.input_sets;
    }
    out << ",\n     \"check\": ";
    if (!r.check) {
      out << "null}";
      continue;
    }
    const CheckResult& k = *r.check;
    out << "{\"passed\": " << (k.passed ? "true" : "false") << ", \"scope\": " << json_string(k.scope)
        << ", \"o_max_abs_err\": " << json_number(k.o_max_abs_err)
        << ", \"o_baseline_max_abs_err\": " << json_number(k.o_baseline_max_abs_err)
        << ", \"o_tolerance\": " << json_number(k.o_tolerance)
        << ", \"o_rel_l2_err\": " << json_number(k.o_rel_l2_err)
        << ", \"lse_max_abs_err\": " << json_number(k.lse_max_abs_err)
        << ", \"lse_baseline_max_abs_err\": " << json_number(k.lse_baseline_max_abs_err)
        << ", \"lse_tolerance\": " << json_number(k.lse_tolerance)
        << ", \"nonfinite_o\": " << k.nonfinite_o << ", \"nan_lse\": " << k.nan_lse
        << ", \"lse_inf_mismatch\": " << k.lse_inf_mismatch << "}}";
  }
  out << "\n  ]\n}\n";
  if (!out) throw BenchError("could not write " + path);
}

DeviceInfo query_device() {
  DeviceInfo info;
  int device = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  cudaDeviceProp prop{};
  cuda_check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  info.name = prop.name;
  info.sm_count = prop.multiProcessorCount;
  info.l2_bytes = prop.l2CacheSize;
  info.cc_major = prop.major;
  info.cc_minor = prop.minor;
  info.memory_bytes = prop.totalGlobalMem;
  cuda_check(cudaRuntimeGetVersion(&info.runtime_version), "cudaRuntimeGetVersion");
  cuda_check(cudaDriverGetVersion(&info.driver_version), "cudaDriverGetVersion");
  return info;
}

int run(const Options& options) {
  int device_count = 0;
  if (const cudaError_t error = cudaGetDeviceCount(&device_count); error != cudaSuccess || device_count == 0) {
    std::fprintf(stderr, "flashhop-bench: no CUDA device (%s)\n",
                 error != cudaSuccess ? cudaGetErrorString(error) : "device count is 0");
    return 1;
  }
  const DeviceInfo device = query_device();
  std::printf("device: %s, sm_%d%d, %d SMs, L2 %d MiB, CUDA runtime %d, driver %d\n", device.name.c_str(),
              device.cc_major, device.cc_minor, device.sm_count, device.l2_bytes >> 20,
              device.runtime_version, device.driver_version);
  std::printf("%s; seed %llu, %d warm-up calls (and at least %.0f ms) + %d timed calls per configuration, "
              "median; LSE %s\n",
              options.backward ? "backward (FLOPs 2.5 x the forward's)" : "forward", (unsigned long long)options.seed,
              options.warmup, options.warmup_ms, options.iters, options.lse ? "written" : "not written by the timed calls");

  cudaStream_t stream = nullptr;
  cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  const double gemm_tflops =
      measure_gemm_bf16_tflops(kGemmSize, {options.warmup, options.warmup_ms}, options.iters, stream);
  std::printf("cuBLAS bf16 GEMM %dx%dx%d: %.1f TFLOP/s (median)\n\n", kGemmSize, kGemmSize, kGemmSize,
              gemm_tflops);

  std::vector<Result> results;
  const auto sweep_start = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < options.configs.size(); ++i) {
    // Each configuration draws its own inputs; sets within one are spaced by their index.
    const std::uint64_t seed = options.seed + i * std::uint64_t(kMaxInputSets);
    results.push_back(run_config(options.configs[i], options, seed, stream));
    print_progress(results.back(), gemm_tflops);
    print_sweep_progress(i + 1, options.configs.size(), sweep_start);
  }
  cudaStreamDestroy(stream);

  print_table(results, gemm_tflops, options.check);
  if (!options.json_path.empty()) {
    write_json(options.json_path, options, device, gemm_tflops, results);
    std::printf("\nwrote %s\n", options.json_path.c_str());
  }
  const auto failed = std::count_if(results.begin(), results.end(), [](const Result& r) { return !result_ok(r); });
  if (failed > 0) {
    std::printf("%lld of %zu configurations failed (error or check)\n", (long long)failed, results.size());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace flashhop::bench

int main(int argc, char** argv) {
  const auto options = flashhop::bench::parse_options(argc, argv);
  if (!options) return 2;
  try {
    return flashhop::bench::run(*options);
  } catch (const flashhop::bench::BenchError& error) {
    std::fprintf(stderr, "flashhop-bench: %s\n", error.what());
    return 1;
  }
}
