// flashhop public C++ API: exact attention, forward and backward, on NVIDIA Hopper (sm_90a).
//
// Conventions (as FlashAttention):
//   Q   (batch, seqlen_q, nheads,    d)
//   K   (batch, seqlen_k, nheads_kv, d)
//   V   (batch, seqlen_k, nheads_kv, dv)
//   O   (batch, seqlen_q, nheads,    dv)
//   LSE (batch, nheads, seqlen_q), float32, natural log; optional.
// Strides are in elements; the last dimension must be contiguous and every other stride must give
// 16-byte aligned rows and stay below 2^40 bytes (size-1 dimensions take any stride). O and LSE
// share no memory with any other tensor (Q, K and V may share theirs). nheads % nheads_kv == 0
// (GQA / MQA). batch and the sequence lengths may be 0. Head dims (d, dv): 64, 96, 128, 192, 256
// with dv = d, and (192, 128).
//
// Masks are aligned to the bottom-right corner, as FlashAttention's: with offset = seqlen_k - seqlen_q,
// causal lets query i attend to keys j <= i + offset; a sliding window (window_left, window_right)
// to keys i + offset - window_left <= j <= i + offset + window_right, -1 meaning unbounded on that
// side. Causal with a window is the window with window_right = 0. A fully masked row gives O = 0
// and LSE = -inf.
//
// Variable-length (packed) batches, as FlashAttention-3's varlen forward: with cu_seqlens_q and
// cu_seqlens_k (ForwardArgs), the sequences of a batch lie one after another along the first
// dimension, and the batch is cu_seqlens_q.shape[0] - 1:
//   Q   (total_q, nheads,    d)
//   K   (total_k, nheads_kv, d)
//   V   (total_k, nheads_kv, dv)
//   O   (total_q, nheads,    dv)
//   LSE (nheads, total_q), float32; optional.
// Sequence b is rows cu_seqlens_q[b] .. cu_seqlens_q[b + 1] of Q and O (columns of LSE) and rows
// cu_seqlens_k[b] .. cu_seqlens_k[b + 1] of K and V, of which only the first seqused_q[b] /
// seqused_k[b] are used where those are given; the masks align each sequence's own corner. O and
// LSE rows outside the used rows are left as they are. The rows of K and V past a sequence's used
// keys, up to total_k, may be read (and weighed by zero), so they must hold finite values. Every
// mask, soft-capping, GQA (with packed rows: pack_gqa) and head dim of the fixed-length forward.
// A batch of fewer query tiles than the device has SMs (decoding) is split by keys (num_splits):
// each split writes a partial result into the workspace and a combine kernel merges them. The
// backward takes the same layout (BackwardArgs' cu_seqlens); there, q's and dout's rows past a
// sequence's used queries are read too (and weighed by zero), and must hold finite values.
//
// Paged KV cache, as FlashAttention-3's page_table: with page_table (ForwardArgs), the queries are
// a variable-length batch as above (cu_seqlens_q) and K and V are a cache of pages
//   K   (num_pages, page_size, nheads_kv, d)
//   V   (num_pages, page_size, nheads_kv, dv)
//   page_table (batch, max_pages), int32
// Key j of sequence b is row j % page_size of page page_table[b][j / page_size]; seqused_k[b]
// says how many keys sequence b has (cu_seqlens_k is not given). Any page size from 1 up, an even
// one where d or dv is 96; pages may be shared and in any order. Rows of a sequence's last page past its keys
// may be read (and weighed by zero), so they must hold finite values; page ids outside
// [0, num_pages) read as zeros, never memory outside the pages. A contiguous cache
// (batch_cache, seqlen_cache, nheads_kv, d) is the paged one with page_size = seqlen_cache and
// one page per sequence (page_table[b][0] = the cache entry of sequence b).
//
// Every call is asynchronous on the caller's stream, allocates nothing and keeps no global state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include <cuda_runtime_api.h>

namespace flashhop {

// kInt32: cu_seqlens and seqused only; kFloat8E4M3 (e4m3, finite only: PyTorch's float8_e4m3fn):
// quantize_fp8's output, and FP8 attention's q, k and v (ForwardArgs).
enum class DType { kFloat16, kBFloat16, kFloat32, kInt32, kFloat8E4M3 };

// Size in bytes of one element of `dtype`.
std::size_t dtype_size(DType dtype);
// "float16", "bfloat16", "float32", "int32", "float8_e4m3fn".
const char* dtype_name(DType dtype);

inline constexpr int kMaxRank = 4;

// A strided view of device memory. Unused trailing entries of shape/stride are ignored.
struct TensorDesc {
  void* data = nullptr;
  DType dtype = DType::kBFloat16;
  int rank = 0;
  std::int64_t shape[kMaxRank] = {};
  std::int64_t stride[kMaxRank] = {};  // in elements
  int device = 0;                       // CUDA device ordinal that holds `data`
};

// Builds a descriptor with contiguous (row-major) strides.
TensorDesc make_contiguous(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                           int device = 0);

enum class StatusCode {
  kSuccess = 0,
  kInvalidArgument = 1,  // the call's arguments break the conventions above
  kNotSupported = 2,     // valid, but not built or not implemented (e.g. a head dim)
  kCudaError = 3,        // the CUDA runtime reported an error
};

struct Status {
  StatusCode code = StatusCode::kSuccess;
  std::string message;  // empty on success; otherwise names the argument, the value and what was expected

  bool ok() const { return code == StatusCode::kSuccess; }
  static Status success() { return {}; }
};

// GQA / MQA (nheads > nheads_kv): whether the query heads that share a KV head are packed into the
// rows of one query tile, so that one CTA serves the whole group and reads its K/V once. This pays
// when seqlen_q is short (decoding: seqlen_q * nheads / nheads_kv rows fill tiles that seqlen_q
// rows alone would leave mostly empty). kAuto packs when nheads > nheads_kv and packing fills the
// query tiles better; kOn always packs (with nheads == nheads_kv each group is one head).
enum class PackGqa { kAuto = 0, kOff = 1, kOn = 2 };

// The most splits by keys of a variable-length or paged call (ForwardArgs::num_splits).
inline constexpr int kMaxSplits = 256;

struct ForwardArgs {
  TensorDesc q, k, v, o;
  std::optional<TensorDesc> lse;             // written when present
  std::optional<float> softmax_scale;        // default 1 / sqrt(d)
  bool causal = false;
  int window_left = -1, window_right = -1;   // sliding window; -1: unbounded (with causal, window_right is 0 or -1)
  float softcap = 0.f;                       // > 0: scores s = softmax_scale q.k become softcap * tanh(s / softcap)
  PackGqa pack_gqa = PackGqa::kAuto;

  // Variable-length batches (the layout above). cu_seqlens_q and cu_seqlens_k: both or neither;
  // contiguous int32 (batch + 1) on q's device, the cumulative sequence lengths (entry 0 usually 0,
  // non-decreasing, none past total_q, respectively total_k). seqused_q / seqused_k: only with them,
  // contiguous int32 (batch), how many rows of each sequence's slot are used. max_seqlen_q and
  // max_seqlen_k: with cu_seqlens, bounds >= 1 on every sequence's length (FlashAttention-3's
  // max_seqlen; the kernels' grid is sized by them); without, 0.
  // The library cannot read device memory while it validates: it checks these tensors' descriptors
  // only. The kernels read the values defensively: offsets clamped to [0, total], a decreasing pair
  // as an empty sequence, seqused clamped to the slot, lengths past max_seqlen cut at max_seqlen.
  std::optional<TensorDesc> cu_seqlens_q, cu_seqlens_k;
  std::optional<TensorDesc> seqused_q, seqused_k;
  int max_seqlen_q = 0, max_seqlen_k = 0;
  // A paged KV cache (the layout above): int32 (batch, max_pages) on q's device, its last dimension
  // contiguous; with cu_seqlens_q and seqused_k, without cu_seqlens_k. max_seqlen_k bounds the
  // sequences' keys as with cu_seqlens_k.
  std::optional<TensorDesc> page_table;
  // Left padding of the keys, as FlashAttention-3's cache_leftpad: contiguous int32 (batch); sequence
  // b's keys start leftpad_k[b] rows into its slot (its pages, or its rows of the packed K and V), and
  // run to the slot's seqused_k[b] (or its end): seqused_k - leftpad_k keys. With cu_seqlens_k, or
  // with a page table of one page per sequence (a contiguous cache).
  std::optional<TensorDesc> leftpad_k;
  // Splits by keys of each query tile of a variable-length or paged call, as FlashAttention-3's
  // num_splits: 0 lets the library choose (it splits batches of fewer query tiles than the
  // device's SMs, such as decoding, about as many ways as fill the SMs, each split at least 4 key
  // tiles long); 1 splits nothing; n in [2, kMaxSplits] splits every query tile's keys n ways.
  // The splits' partial results take workspace (forward_workspace_size). A fixed-length call takes
  // 0 or 1: it splits its last round of tiles by keys itself.
  int num_splits = 0;
  // FP8, as FlashAttention-3's: q, k and v float8_e4m3fn, o bfloat16, and optional descales, float32
  // (batch, nheads_kv) with any strides (0 broadcasts one value; none: 1): the scores of (batch, KV
  // head) are softmax_scale q_descale k_descale times q.k of the e4m3 values, and its rows of O are
  // v_descale times softmax(scores) V. P is quantized to e4m3 for P V. Fixed-length batches; every
  // mask, soft-capping, head dim and packed GQA rows (pack_gqa).
  std::optional<TensorDesc> q_descale, k_descale, v_descale;
  // FP8 block scaling, instead of the descales: all three, float32, one scale per block of
  // kFp8ScaleBlockRows rows of a head (quantize_fp8's kPerBlock descales): q_block_scale (batch,
  // nheads, ceil(seqlen_q / 128)), k_block_scale and v_block_scale (batch, nheads_kv,
  // ceil(seqlen_k / 128)), any non-negative strides; row i of head h is its e4m3 value times
  // scale[b][h][i / 128]. Head dims whose FP8 key tiles divide the blocks: all but 192; unpacked
  // rows (pack_gqa kOn is refused, kAuto does not pack).
  std::optional<TensorDesc> q_block_scale, k_block_scale, v_block_scale;
};

// Bytes of device workspace `forward` needs for these arguments (validates them first): none
// without query rows; 4 with a causal or window mask (the counter of the kernel's tile queue);
// without a mask at head dims 96 and 128, and at 64 on its 64-row tiles (packed GQA rows, short
// query sequences), when the tiles leave a last round (or a single one, as in decoding) that pays
// to split over the device's SMs by keys, room for the split's partial results (for the current
// device's SM count, up to about 20 MB); else 0. With cu_seqlens (and a page table or not): none
// without sequences or query rows, else the tile list of the variable-length scheduler (16 bytes
// and 12 per sequence and 4 more), and where the call is split by keys, after it (256-byte
// aligned) the splits' partial results: num_splits * total_q * nheads * (head_dim_v + 1) floats.
Status forward_workspace_size(const ForwardArgs& args, std::size_t* bytes);

// O = softmax(scale * Q K^T [masked]) V, and LSE per query row.
// `workspace` must hold at least forward_workspace_size() bytes of device memory, 16-byte aligned
// (may be null when that is 0); forward initialises it on `stream`, and no other call in flight may
// use it at the same time.
// On any error nothing is launched and the message says what was wrong.
Status forward(const ForwardArgs& args, void* workspace, std::size_t workspace_bytes,
               cudaStream_t stream);

// Checks the arguments without touching the device (used by forward; exposed for tests and bindings).
Status validate_forward(const ForwardArgs& args);

// The merge of partial attention results over splits of the keys, as FlashAttention-3's
// flash_attn_combine: split s holds, for each (row, head), its output normalised by its own softmax
// sums and its LSE (natural log; -inf where the split saw no key). Then
//   lse = log sum_s exp(lse_s),  out = sum_s exp(lse_s - lse) out_s,
// summed in split order (bitwise reproducible); a row that no split saw gives out = 0, lse = -inf.
// Rows are any (batch, seqlen) flattened, as the variable-length layout's.
struct CombineArgs {
  TensorDesc out_partial;         // (num_splits, rows, nheads, head_dim_v), float32
  TensorDesc lse_partial;         // (num_splits, rows, nheads), float32
  TensorDesc out;                 // (rows, nheads, head_dim_v): bfloat16, float16 or float32
  std::optional<TensorDesc> lse;  // (nheads, rows), float32; written when present
};
// The last dimension of each contiguous; head_dim_v from 1 to 512; num_splits >= 1; out and lse
// share no memory with any other tensor. On any error nothing is launched.
Status combine(const CombineArgs& args, cudaStream_t stream);
// Checks the arguments without touching the device.
Status validate_combine(const CombineArgs& args);

// Appending new keys and values to a paged KV cache (the layout above; a contiguous cache is one
// page per sequence) with the rotary embedding, as FlashAttention-3's flash_attn_with_kvcache does
// with k, v, rotary_cos and rotary_sin before it attends: new row i of sequence b goes to key
// cache_seqlens[b] + i of its pages, K rotated at position p_b + i, where p_b is rotary_seqlens[b]
// (default cache_seqlens[b]); V as it is. The queries may be rotated at the same positions into
// q_rotated: query i at p_b + i where positions advance (causal or local attention), else all at
// p_b. The rotary embedding turns the pairs of elements (2j, 2j + 1) (interleaved, GPT-J) or
// (j, j + rotary_dim / 2) (GPT-NeoX) of the first rotary_dim elements of each head by the angle
// whose cosine and sine are row p of the tables, column j: x0' = x0 cos - x1 sin,
// x1' = x0 sin + x1 cos. The library cannot read device memory while it validates; the kernel reads
// the values defensively: a new row whose key lies past its sequence's pages, or on a page id
// outside [0, num_pages), is not written, and a row whose position lies outside the tables is
// written unrotated. Attend afterwards with seqused_k = cache_seqlens + the new rows.
struct AppendKvArgs {
  TensorDesc k_cache, v_cache;    // (num_pages, page_size, nheads_kv, head_dim / head_dim_v): written
  TensorDesc page_table;          // int32 (batch, max_pages)
  TensorDesc cache_seqlens;       // int32 (batch): each sequence's keys before the append
  TensorDesc k_new, v_new;        // (total_new, nheads_kv, head_dim / head_dim_v), the cache's dtype
  TensorDesc cu_seqlens_new;      // int32 (batch + 1): sequence b's new rows are cu[b] .. cu[b + 1]
  std::optional<TensorDesc> rotary_cos, rotary_sin;  // both or neither: (seqlen_ro, rotary_dim / 2), the
                                                     // cache's dtype; rotary_dim even, <= head_dim
  bool rotary_interleaved = true;
  std::optional<TensorDesc> rotary_seqlens;          // int32 (batch): the first new token's position
  std::optional<TensorDesc> q, q_rotated;            // both or neither: (total_q, nheads, head_dim)
  std::optional<TensorDesc> cu_seqlens_q;            // int32 (batch + 1), with q
  bool q_positions_advance = false;
};
// On any error nothing is launched and nothing is written.
Status append_kv(const AppendKvArgs& args, cudaStream_t stream);
// Checks the arguments without touching the device.
Status validate_append_kv(const AppendKvArgs& args);

// The backward pass of a forward call: from its inputs (q, k, v and the options), its output o and
// LSE, and the gradient dout of o, the gradients dq, dk and dv (shapes, dtypes and conventions of q,
// k and v; with GQA / MQA, dk and dv sum over each KV head's query heads). softmax_scale, causal,
// the window and softcap must be the forward call's. A query row that saw no key gets dq = 0.
// A variable-length batch (cu_seqlens as in ForwardArgs, without a page table, leftpad or packed
// rows) takes the packed layout: q, dq (total_q, nheads, d), k, dk (total_k, nheads_kv, d), lse
// (nheads, total_q); the rows of dq, dk and dv outside every sequence's used rows are left as they
// are.
struct BackwardArgs {
  TensorDesc q, k, v, o;
  TensorDesc dout;  // (batch, seqlen_q, nheads, dv), like o
  TensorDesc lse;   // (batch, nheads, seqlen_q), float32, the forward's
  TensorDesc dq, dk, dv;
  std::optional<TensorDesc> cu_seqlens_q, cu_seqlens_k;  // int32 (batch + 1): both or neither
  std::optional<TensorDesc> seqused_q, seqused_k;        // int32 (batch), only with them
  int max_seqlen_q = 0, max_seqlen_k = 0;                // with them, the forward call's bounds; else 0
  std::optional<float> softmax_scale;  // default 1 / sqrt(d)
  bool causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0.f;
  // dq accumulated in a fixed order, so that repeated calls are bitwise identical (dk and dv always
  // are); without it, in the order the key tiles finish.
  bool deterministic = false;
};

// Bytes of device workspace `backward` needs (validates the arguments first): per query row of
// every head two floats and d floats of dq accumulation, each sequence's rows rounded up to 64, and
// with `deterministic` one int per 64 rows of every head (of max_seqlen_q rows per sequence in a
// variable-length batch).
Status backward_workspace_size(const BackwardArgs& args, std::size_t* bytes);

// dq, dk and dv on `stream`; `workspace` as for forward (at least backward_workspace_size() bytes,
// 16-byte aligned, not in use by another call in flight). On any error nothing is launched.
Status backward(const BackwardArgs& args, void* workspace, std::size_t workspace_bytes, cudaStream_t stream);

// Checks the arguments without touching the device.
Status validate_backward(const BackwardArgs& args);

// FP8 (e4m3) quantization of attention inputs, for FP8 attention with FlashAttention-3's descale
// tensors: out = e4m3(y / descale), so that y ~= out * descale, where y is x, or with hadamard_signs
// each row of x rotated: y = H (s * x). H is the Walsh-Hadamard transform on blocks of b elements, b
// the largest power of two dividing head_dim (64, 32, 128, 64, 256 for head dims 64, 96, 128, 192,
// 256), block-diagonal and scaled by 1 / sqrt(b); s is +1 where hadamard_signs >= 0 and -1
// elsewhere (the library cannot read the values while it validates, so any value is taken). H is
// orthogonal: the same signs on Q and K leave Q K^T unchanged in exact arithmetic, and spread a
// row's outliers over its block (FlashAttention-3's incoherent processing). descale = amax / 448
// (448: the largest e4m3 value), amax the largest |y| of the scaling group; a group whose amax is 0
// gets descale 1 (and out 0). The conversion rounds to nearest even and saturates at +-448; a
// non-finite value of x leaves its group's results undefined.
inline constexpr float kFp8E4m3Max = 448.f;
// The rows of one kPerBlock scale.
inline constexpr int kFp8ScaleBlockRows = 128;

// The scaling groups of quantize_fp8, and the shape of descale (float32, its last dimension contiguous):
//   kPerTensor: (1), one scale for x.
//   kPerHead:   (batch, groups), groups dividing nheads; head h is in group h / (nheads / groups), so
//               that groups = nheads_kv gives Q FlashAttention-3's (batch, nheads_kv) descale shape
//               (K and V take groups = their nheads).
//   kPerBlock:  (batch, nheads, ceil(seqlen / kFp8ScaleBlockRows)): block i of a head is its rows
//               128 i .. 128 i + 127.
enum class Fp8Scaling { kPerTensor = 0, kPerHead = 1, kPerBlock = 2 };

struct QuantizeFp8Args {
  TensorDesc x;        // (batch, seqlen, nheads, head_dim): bfloat16 or float16
  TensorDesc out;      // x's shape, float8_e4m3fn: written
  TensorDesc descale;  // float32, the shape of `scaling`: written
  Fp8Scaling scaling = Fp8Scaling::kPerTensor;
  std::optional<TensorDesc> hadamard_signs;  // float32 (head_dim): rotate the rows
};
// head_dim 64, 96, 128, 192 or 256; x and out any strides with the last dimension contiguous and
// 16-byte aligned rows; hadamard_signs contiguous; out and descale share no memory with any other
// tensor. The per-tensor and per-head scales read x twice (an amax pass, then the quantization), the
// per-block ones once. On any error nothing is launched.
Status quantize_fp8(const QuantizeFp8Args& args, cudaStream_t stream);
// Checks the arguments without touching the device.
Status validate_quantize_fp8(const QuantizeFp8Args& args);

}  // namespace flashhop
