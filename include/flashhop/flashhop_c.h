/* flashhop C API: a thin layer over flashhop.h for other languages and frameworks.
 * No exceptions cross it; every function returns a status code, and the message of the last
 * failed call on this thread is available from flashhop_last_error(). */
#ifndef FLASHHOP_C_H
#define FLASHHOP_C_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  FLASHHOP_SUCCESS = 0,
  FLASHHOP_INVALID_ARGUMENT = 1,
  FLASHHOP_NOT_SUPPORTED = 2,
  FLASHHOP_CUDA_ERROR = 3,
  FLASHHOP_INTERNAL_ERROR = 4
} flashhop_status_t;

/* FLASHHOP_INT32: cu_seqlens and seqused only; FLASHHOP_FLOAT8_E4M3 (float8_e4m3fn): flashhop_quantize_fp8's
 * output, and FP8 attention's q, k and v. */
typedef enum {
  FLASHHOP_FLOAT16 = 0,
  FLASHHOP_BFLOAT16 = 1,
  FLASHHOP_FLOAT32 = 2,
  FLASHHOP_INT32 = 3,
  FLASHHOP_FLOAT8_E4M3 = 4
} flashhop_dtype_t;

/* flashhop::PackGqa */
typedef enum { FLASHHOP_PACK_GQA_AUTO = 0, FLASHHOP_PACK_GQA_OFF = 1, FLASHHOP_PACK_GQA_ON = 2 } flashhop_pack_gqa_t;

typedef struct {
  void* data;
  flashhop_dtype_t dtype;
  int rank;
  int64_t shape[4];
  int64_t stride[4]; /* in elements */
  int device;
} flashhop_tensor_t;

/* A zero-initialised struct asks for plain attention with the default scale; the fields mean what
 * flashhop::ForwardArgs's do (flashhop.h). New fields are appended, with 0 / NULL meaning what the
 * struct meant without them (the variable-length fields: a fixed-length call). The struct carries
 * no size: a program built against an older header must be rebuilt with this one. */
typedef struct {
  flashhop_tensor_t q, k, v, o;
  const flashhop_tensor_t* lse; /* NULL: not written */
  int use_softmax_scale;        /* 0: default 1/sqrt(d); 1: softmax_scale applies (0 included) */
  float softmax_scale;          /* with use_softmax_scale: the scale of the scores, >= 0 */
  int causal;                   /* 0 or 1 */
  int use_window;               /* 0: no sliding window; 1: window_left and window_right apply */
  int window_left;              /* with use_window: keys left of the diagonal, -1 unbounded */
  int window_right;             /* with use_window: keys right of the diagonal, -1 unbounded */
  float softcap;                /* 0: off; > 0: scores s become softcap * tanh(s / softcap) */
  flashhop_pack_gqa_t pack_gqa; /* 0 (FLASHHOP_PACK_GQA_AUTO): packed when it fills query tiles better */
  /* Variable-length (packed) batches: q, k, v and o 3-D, lse (nheads, total_q). NULL / 0: fixed length. */
  const flashhop_tensor_t* cu_seqlens_q; /* int32 (batch + 1); with cu_seqlens_k */
  const flashhop_tensor_t* cu_seqlens_k; /* int32 (batch + 1); with cu_seqlens_q */
  const flashhop_tensor_t* seqused_q;    /* NULL, or int32 (batch) with cu_seqlens */
  const flashhop_tensor_t* seqused_k;    /* NULL, or int32 (batch) with cu_seqlens */
  int max_seqlen_q;                      /* with cu_seqlens: >= 1, a bound on the query lengths; else 0 */
  int max_seqlen_k;                      /* with cu_seqlens: >= 1, a bound on the key lengths; else 0 */
  /* A paged KV cache: k and v (num_pages, page_size, nheads_kv, d); with cu_seqlens_q and seqused_k. */
  const flashhop_tensor_t* page_table; /* NULL, or int32 (batch, max_pages) */
  int num_splits; /* splits by keys of a variable-length or paged call: 0 chosen, 1 none, n <= 256 */
  const flashhop_tensor_t* leftpad_k; /* NULL, or int32 (batch): each sequence's first key row */
  /* FP8 (q, k, v FLASHHOP_FLOAT8_E4M3, o bfloat16): NULL (1), or float32 (batch, nheads_kv) descales. */
  const flashhop_tensor_t* q_descale;
  const flashhop_tensor_t* k_descale;
  const flashhop_tensor_t* v_descale;
  /* FP8 block scaling: NULL, or all three float32 (batch, heads, ceil(seqlen / 128)). */
  const flashhop_tensor_t* q_block_scale;
  const flashhop_tensor_t* k_block_scale;
  const flashhop_tensor_t* v_block_scale;
} flashhop_forward_args_t;

flashhop_status_t flashhop_forward_workspace_size(const flashhop_forward_args_t* args, size_t* bytes);
flashhop_status_t flashhop_forward(const flashhop_forward_args_t* args, void* workspace,
                                   size_t workspace_bytes, cudaStream_t stream);
/* flashhop::BackwardArgs (flashhop.h); the options must be the forward call's. A zero-initialised
 * options part (use_softmax_scale .. deterministic) is plain attention with the default scale. */
typedef struct {
  flashhop_tensor_t q, k, v, o, dout, lse;
  flashhop_tensor_t dq, dk, dv;
  int use_softmax_scale; /* as in flashhop_forward_args_t */
  float softmax_scale;
  int causal;
  int use_window;
  int window_left;
  int window_right;
  float softcap;
  int deterministic; /* 0 or 1: dq accumulated in a fixed order (bitwise repeatable) */
  /* Variable-length (packed) batches, as in flashhop_forward_args_t: q, k, v, o, dout, dq, dk, dv
   * 3-D, lse (nheads, total_q). NULL / 0: fixed length. */
  const flashhop_tensor_t* cu_seqlens_q;
  const flashhop_tensor_t* cu_seqlens_k;
  const flashhop_tensor_t* seqused_q;
  const flashhop_tensor_t* seqused_k;
  int max_seqlen_q;
  int max_seqlen_k;
} flashhop_backward_args_t;

flashhop_status_t flashhop_backward_workspace_size(const flashhop_backward_args_t* args, size_t* bytes);
flashhop_status_t flashhop_backward(const flashhop_backward_args_t* args, void* workspace,
                                    size_t workspace_bytes, cudaStream_t stream);

/* flashhop::append_kv (flashhop.h): new keys and values into a paged cache, with the rotary embedding.
 * Optional tensors are NULL where not given. */
typedef struct {
  flashhop_tensor_t k_cache, v_cache;     /* (num_pages, page_size, nheads_kv, d / dv): written */
  flashhop_tensor_t page_table;           /* int32 (batch, max_pages) */
  flashhop_tensor_t cache_seqlens;        /* int32 (batch) */
  flashhop_tensor_t k_new, v_new;         /* (total_new, nheads_kv, d / dv) */
  flashhop_tensor_t cu_seqlens_new;       /* int32 (batch + 1) */
  const flashhop_tensor_t* rotary_cos;    /* (seqlen_ro, rotary_dim / 2), with rotary_sin */
  const flashhop_tensor_t* rotary_sin;
  int rotary_interleaved;                 /* 0 or 1 */
  const flashhop_tensor_t* rotary_seqlens; /* int32 (batch) */
  const flashhop_tensor_t* q;             /* (total_q, nheads, d), with q_rotated and cu_seqlens_q */
  const flashhop_tensor_t* q_rotated;
  const flashhop_tensor_t* cu_seqlens_q;
  int q_positions_advance;                /* 0 or 1 */
} flashhop_append_kv_args_t;

flashhop_status_t flashhop_append_kv(const flashhop_append_kv_args_t* args, cudaStream_t stream);

/* flashhop::combine (flashhop.h): the merge of partial results over splits by keys. */
typedef struct {
  flashhop_tensor_t out_partial; /* float32 (num_splits, rows, nheads, head_dim_v) */
  flashhop_tensor_t lse_partial; /* float32 (num_splits, rows, nheads) */
  flashhop_tensor_t out;         /* (rows, nheads, head_dim_v): bfloat16, float16 or float32 */
  const flashhop_tensor_t* lse;  /* NULL, or float32 (nheads, rows) */
} flashhop_combine_args_t;

flashhop_status_t flashhop_combine(const flashhop_combine_args_t* args, cudaStream_t stream);

/* flashhop::Fp8Scaling */
typedef enum {
  FLASHHOP_FP8_PER_TENSOR = 0,
  FLASHHOP_FP8_PER_HEAD = 1,
  FLASHHOP_FP8_PER_BLOCK = 2
} flashhop_fp8_scaling_t;

/* flashhop::quantize_fp8 (flashhop.h): x to e4m3 with its descale, optionally rotated. */
typedef struct {
  flashhop_tensor_t x;                      /* (batch, seqlen, nheads, head_dim): bfloat16 or float16 */
  flashhop_tensor_t out;                    /* x's shape, FLASHHOP_FLOAT8_E4M3: written */
  flashhop_tensor_t descale;                /* float32: (1), (batch, groups) or (batch, nheads, num_blocks) */
  flashhop_fp8_scaling_t scaling;           /* 0 (FLASHHOP_FP8_PER_TENSOR): one scale */
  const flashhop_tensor_t* hadamard_signs;  /* NULL, or float32 (head_dim): rotate the rows */
} flashhop_quantize_fp8_args_t;

flashhop_status_t flashhop_quantize_fp8(const flashhop_quantize_fp8_args_t* args, cudaStream_t stream);

/* Message of the last failed call on this thread; "" when the last call succeeded. */
const char* flashhop_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* FLASHHOP_C_H */
