"""The PyTorch operators flashhop::fwd, flashhop::bwd, flashhop::varlen_fwd, flashhop::varlen_bwd,
flashhop::paged_fwd, flashhop::append_kv (which writes into its KV cache arguments), flashhop::combine and
flashhop::quantize_fp8, registered with torch.library.

Their fake implementations give torch.compile the output shapes without running anything, so a
compiled model traces through them with no graph break. The CUDA implementation allocates through
the caching allocator and launches on the current stream, so CUDA graphs capture it.
"""
from typing import Optional, Tuple

import torch

from . import _c_api

_LAYOUTS = {"q": "(batch, seqlen_q, nheads, head_dim)", "v": "(batch, seqlen_k, nheads_kv, head_dim_v)"}


def _out_dtype(q):
    """O's dtype: q's, or bfloat16 for FP8 (float8_e4m3fn) inputs, as FlashAttention-3's."""
    return torch.bfloat16 if q.dtype == torch.float8_e4m3fn else q.dtype


def _empty_outputs(q, v):
    """out (batch, seqlen_q, nheads, head_dim_v) in _out_dtype(q) and lse (batch, nheads, seqlen_q)
    in float32. The library checks every other property of the arguments; only the ranks that these
    shapes are read from are checked here, before anything is allocated."""
    for name, tensor in (("q", q), ("v", v)):
        if tensor.dim() != 4:
            raise ValueError(f"flashhop: {name}.rank = {tensor.dim()}: expected 4 {_LAYOUTS[name]}")
    batch, seqlen_q, nheads, _ = q.shape
    out = q.new_empty((batch, seqlen_q, nheads, v.shape[3]), dtype=_out_dtype(q))
    lse = q.new_empty((batch, nheads, seqlen_q), dtype=torch.float32)
    return out, lse


@torch.library.custom_op("flashhop::fwd", mutates_args=())
def fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: Optional[float], causal: bool,
        window_left: int, window_right: int, softcap: float,
        pack_gqa: Optional[bool] = None, deterministic: bool = False, q_descale: Optional[torch.Tensor] = None,
        k_descale: Optional[torch.Tensor] = None, v_descale: Optional[torch.Tensor] = None,
        q_block_scale: Optional[torch.Tensor] = None, k_block_scale: Optional[torch.Tensor] = None,
        v_block_scale: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """out = softmax(S) v and lse = logsumexp(S) per query row, in FlashAttention's layout, for the
    scores S = softmax_scale * q k^T, soft-capped to softcap * tanh(S / softcap) when softcap > 0,
    with -inf where masked. Masks are aligned to the bottom-right corner: query i sees the keys j
    with i + offset - window_left <= j <= i + offset + window_right, offset = seqlen_k - seqlen_q,
    -1 leaving a side unbounded; causal is window_right = 0 (window_right > 0 with it is an error).
    pack_gqa packs the query heads that share a KV head into one query tile: None lets the library
    choose, True always, False never; the result is the same attention. deterministic is for the
    backward: dq accumulated in a fixed order. FP8: float8_e4m3fn q, k and v, with optional float32
    (batch, nheads_kv) descales, or block scales (batch, heads, ceil(seqlen / 128)); out is bfloat16
    (forward only)."""
    # Registered for every device type so that a tensor elsewhere gets this message rather than the
    # dispatcher's "could not run with arguments from the CPU backend".
    for name, tensor in (("q", q), ("k", k), ("v", v), ("q_descale", q_descale), ("k_descale", k_descale),
                         ("v_descale", v_descale), ("q_block_scale", q_block_scale),
                         ("k_block_scale", k_block_scale), ("v_block_scale", v_block_scale)):
        if tensor is not None and tensor.device.type != "cuda":
            raise ValueError(f"flashhop: {name} is on {tensor.device}: expected a CUDA tensor")
    out, lse = _empty_outputs(q, v)
    with torch.cuda.device(q.device):
        _c_api.forward(q, k, v, out, lse, softmax_scale, causal, window_left, window_right, softcap, pack_gqa,
                       q_descale, k_descale, v_descale, q_block_scale, k_block_scale, v_block_scale)
    return out, lse


@fwd.register_fake
def _fwd_fake(q, k, v, softmax_scale, causal, window_left, window_right, softcap, pack_gqa=None, deterministic=False,
              q_descale=None, k_descale=None, v_descale=None, q_block_scale=None, k_block_scale=None,
              v_block_scale=None):
    return _empty_outputs(q, v)


@torch.library.custom_op("flashhop::bwd", mutates_args=())
def bwd(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
        lse: torch.Tensor, softmax_scale: Optional[float], causal: bool, window_left: int, window_right: int,
        softcap: float, deterministic: bool = False) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of q, k and v from the gradient of out, for the forward call with these options
    (out and lse its outputs); deterministic accumulates dq in a fixed order (bitwise repeatable)."""
    grad_q, grad_k, grad_v = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    grad_out = _readable_rows(grad_out)
    with torch.cuda.device(q.device):
        _c_api.backward(grad_out, q, k, v, out, lse, grad_q, grad_k, grad_v, softmax_scale, causal, window_left,
                        window_right, softcap, deterministic)
    return grad_q, grad_k, grad_v


def _readable_rows(grad_out):
    """grad_out as the kernels read it: 16-byte aligned rows (TMA) with a contiguous last dimension,
    a step along every other one. Autograd hands over broadcast gradients (stride 0, e.g. of
    out.sum()) and slices of wider tensors as they are."""
    last = grad_out.dim() - 1
    row_multiple = 16 // grad_out.element_size()
    if grad_out.data_ptr() % 16 != 0 or any(
            stride != 1 if d == last else stride == 0 or stride % row_multiple != 0
            for d, (size, stride) in enumerate(zip(grad_out.shape, grad_out.stride())) if size > 1):
        return grad_out.contiguous()
    return grad_out


@bwd.register_fake
def _bwd_fake(grad_out, q, k, v, out, lse, softmax_scale, causal, window_left, window_right, softcap,
              deterministic=False):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _save_for_backward(ctx, inputs, output):
    # bwd takes no pack_gqa (it only schedules the forward) and no FP8 scales (FP8 has no backward).
    q, k, v, *options, _pack_gqa, deterministic, _qd, _kd, _vd, _qb, _kb, _vb = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.options = options  # softmax_scale, causal, window_left, window_right, softcap
    ctx.deterministic = deterministic


def _fwd_backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse = ctx.saved_tensors
    if q.dtype == torch.float8_e4m3fn:
        raise NotImplementedError("flashhop: FP8 (float8_e4m3fn) attention has no backward")
    grad_q, grad_k, grad_v = torch.ops.flashhop.bwd(grad_out, q, k, v, out, lse, *ctx.options, ctx.deterministic)
    # None for the options, pack_gqa, deterministic, the three descales and the three block scales.
    return (grad_q, grad_k, grad_v) + (None,) * (len(ctx.options) + 8)


fwd.register_autograd(_fwd_backward, setup_context=_save_for_backward)


_VARLEN_LAYOUTS = {"q": "(total_q, nheads, head_dim)", "v": "(total_k, nheads_kv, head_dim_v)"}


def _empty_varlen_outputs(q, v):
    """out (total_q, nheads, head_dim_v) in _out_dtype(q) and lse (nheads, total_q) in float32,
    FlashAttention-3's variable-length layout; as _empty_outputs, only the ranks these shapes are
    read from are checked here."""
    for name, tensor in (("q", q), ("v", v)):
        if tensor.dim() != 3:
            raise ValueError(f"flashhop: {name}.rank = {tensor.dim()}: expected 3 {_VARLEN_LAYOUTS[name]} "
                             "with cu_seqlens")
    total_q, nheads, _ = q.shape
    out = q.new_empty((total_q, nheads, v.shape[2]), dtype=_out_dtype(q))
    lse = q.new_empty((nheads, total_q), dtype=torch.float32)
    return out, lse


@torch.library.custom_op("flashhop::varlen_fwd", mutates_args=())
def varlen_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
               cu_seqlens_k: torch.Tensor, seqused_q: Optional[torch.Tensor], seqused_k: Optional[torch.Tensor],
               max_seqlen_q: int, max_seqlen_k: int, softmax_scale: Optional[float], causal: bool, window_left: int,
               window_right: int, softcap: float, pack_gqa: Optional[bool] = None,
               deterministic: bool = False, q_descale: Optional[torch.Tensor] = None,
               k_descale: Optional[torch.Tensor] = None,
               v_descale: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """flashhop::fwd over a packed batch: sequence b is rows cu_seqlens_q[b]:cu_seqlens_q[b + 1] of
    q (total_q, nheads, head_dim) and rows cu_seqlens_k[b]:cu_seqlens_k[b + 1] of k and v (total_k,
    nheads_kv, head_dim[_v]), of which the first seqused_q[b] / seqused_k[b] are used where given;
    masks align to each sequence's own bottom-right corner. max_seqlen_q / max_seqlen_k bound the
    lengths (>= 1). Returns out (total_q, nheads, head_dim_v) and lse (nheads, total_q); rows past
    seqused_q are left as torch.empty made them. deterministic is for the backward (varlen_bwd).
    FP8: float8_e4m3fn q, k and v with optional float32 (batch, nheads_kv) descales; out is bfloat16
    (forward only)."""
    tensors = (("q", q), ("k", k), ("v", v), ("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k),
               ("seqused_q", seqused_q), ("seqused_k", seqused_k), ("q_descale", q_descale),
               ("k_descale", k_descale), ("v_descale", v_descale))
    for name, tensor in tensors:
        if tensor is not None and tensor.device.type != "cuda":
            raise ValueError(f"flashhop: {name} is on {tensor.device}: expected a CUDA tensor")
    out, lse = _empty_varlen_outputs(q, v)
    with torch.cuda.device(q.device):
        _c_api.varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k,
                              out, lse, softmax_scale, causal, window_left, window_right, softcap, pack_gqa,
                              descales=(q_descale, k_descale, v_descale))
    return out, lse


@varlen_fwd.register_fake
def _varlen_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k,
                     softmax_scale, causal, window_left, window_right, softcap, pack_gqa=None, deterministic=False,
                     q_descale=None, k_descale=None, v_descale=None):
    return _empty_varlen_outputs(q, v)


@torch.library.custom_op("flashhop::varlen_bwd", mutates_args=())
def varlen_bwd(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
               lse: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
               seqused_q: Optional[torch.Tensor], seqused_k: Optional[torch.Tensor], max_seqlen_q: int,
               max_seqlen_k: int, softmax_scale: Optional[float], causal: bool, window_left: int, window_right: int,
               softcap: float, deterministic: bool = False) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """flashhop::bwd over a packed batch, for the varlen_fwd call with these arguments (out and lse
    its outputs). The rows of the gradients outside every sequence's used rows are 0."""
    grad_q, grad_k, grad_v = (torch.zeros(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    with torch.cuda.device(q.device):
        _c_api.backward(_readable_rows(grad_out), q, k, v, out, lse, grad_q, grad_k, grad_v, softmax_scale, causal,
                        window_left, window_right, softcap, deterministic, cu_seqlens_q, cu_seqlens_k, seqused_q,
                        seqused_k, max_seqlen_q, max_seqlen_k)
    return grad_q, grad_k, grad_v


@varlen_bwd.register_fake
def _varlen_bwd_fake(grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q,
                     max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap, deterministic=False):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _varlen_save_for_backward(ctx, inputs, output):
    # varlen_bwd takes no pack_gqa and no descales (FP8 has no backward).
    q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, *options, _pack_gqa, deterministic = inputs[:-3]
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k)
    ctx.options = options  # max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap
    ctx.deterministic = deterministic


def _varlen_fwd_backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse, *indices = ctx.saved_tensors
    if q.dtype == torch.float8_e4m3fn:
        raise NotImplementedError("flashhop: FP8 (float8_e4m3fn) attention has no backward")
    grad_q, grad_k, grad_v = torch.ops.flashhop.varlen_bwd(grad_out, q, k, v, out, lse, *indices, *ctx.options,
                                                          ctx.deterministic)
    # None for the index tensors, the options, pack_gqa, deterministic and the three descales.
    return (grad_q, grad_k, grad_v) + (None,) * (len(indices) + len(ctx.options) + 5)


varlen_fwd.register_autograd(_varlen_fwd_backward, setup_context=_varlen_save_for_backward)


@torch.library.custom_op("flashhop::paged_fwd", mutates_args=())
def paged_fwd(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
              cu_seqlens_q: torch.Tensor, seqused_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int,
              softmax_scale: Optional[float], causal: bool, window_left: int, window_right: int,
              softcap: float, pack_gqa: Optional[bool] = None, num_splits: int = 0,
              leftpad_k: Optional[torch.Tensor] = None, q_descale: Optional[torch.Tensor] = None,
              k_descale: Optional[torch.Tensor] = None,
              v_descale: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """flashhop::varlen_fwd's queries over a paged KV cache: k_cache and v_cache (num_pages,
    page_size, nheads_kv, head_dim[_v]); key j of sequence b is row j % page_size of page
    page_table[b, j // page_size], and sequence b has seqused_k[b] keys (from row leftpad_k[b] on,
    where given: one page per sequence). num_splits: splits by keys (0: the library chooses).
    FP8: a float8_e4m3fn cache and q, descales as varlen_fwd's. Returns out (total_q, nheads,
    head_dim_v) and lse (nheads, total_q)."""
    tensors = (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("page_table", page_table),
               ("cu_seqlens_q", cu_seqlens_q), ("seqused_k", seqused_k), ("q_descale", q_descale),
               ("k_descale", k_descale), ("v_descale", v_descale))
    for name, tensor in tensors:
        if tensor is not None and tensor.device.type != "cuda":
            raise ValueError(f"flashhop: {name} is on {tensor.device}: expected a CUDA tensor")
    if v_cache.dim() != 4:
        raise ValueError(f"flashhop: v_cache.rank = {v_cache.dim()}: expected 4 "
                         "(num_pages, page_size, nheads_kv, head_dim_v)")
    out, lse = _empty_varlen_outputs(q, v_cache[0])
    with torch.cuda.device(q.device):
        _c_api.varlen_forward(q, k_cache, v_cache, cu_seqlens_q, None, None, seqused_k, max_seqlen_q, max_seqlen_k,
                              out, lse, softmax_scale, causal, window_left, window_right, softcap, pack_gqa,
                              page_table=page_table, num_splits=num_splits, leftpad_k=leftpad_k,
                              descales=(q_descale, k_descale, v_descale))
    return out, lse


@paged_fwd.register_fake
def _paged_fwd_fake(q, k_cache, v_cache, page_table, cu_seqlens_q, seqused_k, max_seqlen_q, max_seqlen_k,
                    softmax_scale, causal, window_left, window_right, softcap, pack_gqa=None, num_splits=0,
                    leftpad_k=None, q_descale=None, k_descale=None, v_descale=None):
    return _empty_varlen_outputs(q, v_cache[0])


@torch.library.custom_op("flashhop::append_kv", mutates_args=("k_cache", "v_cache"))
def append_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor, cache_seqlens: torch.Tensor,
              k: torch.Tensor, v: torch.Tensor, cu_seqlens_new: torch.Tensor, rotary_cos: Optional[torch.Tensor],
              rotary_sin: Optional[torch.Tensor], rotary_interleaved: bool, rotary_seqlens: Optional[torch.Tensor],
              q: Optional[torch.Tensor], cu_seqlens_q: Optional[torch.Tensor],
              q_positions_advance: bool) -> torch.Tensor:
    """Writes k and v (total_new, nheads_kv, head_dim[_v]) into the paged cache k_cache / v_cache
    (num_pages, page_size, nheads_kv, head_dim[_v]): new row i of sequence b (rows cu_seqlens_new[b]
    on) at key cache_seqlens[b] + i of its pages (page_table), K rotated at position
    rotary_seqlens[b] (default cache_seqlens[b]) + i where rotary_cos / rotary_sin are given.
    Returns q (total_q, nheads, head_dim) rotated at those positions (query i at + i where
    q_positions_advance, else all at + 0), or an empty tensor without q."""
    for name, tensor in (("k_cache", k_cache), ("v_cache", v_cache), ("page_table", page_table),
                         ("cache_seqlens", cache_seqlens), ("k", k), ("v", v), ("cu_seqlens_new", cu_seqlens_new)):
        if tensor.device.type != "cuda":
            raise ValueError(f"flashhop: {name} is on {tensor.device}: expected a CUDA tensor")
    q_rotated = torch.empty_like(q) if q is not None else k.new_empty((0,))
    with torch.cuda.device(k_cache.device):
        _c_api.append_kv(k_cache, v_cache, page_table, cache_seqlens, k, v, cu_seqlens_new, rotary_cos, rotary_sin,
                         rotary_interleaved, rotary_seqlens, q, q_rotated if q is not None else None, cu_seqlens_q,
                         q_positions_advance)
    return q_rotated


@append_kv.register_fake
def _append_kv_fake(k_cache, v_cache, page_table, cache_seqlens, k, v, cu_seqlens_new, rotary_cos, rotary_sin,
                    rotary_interleaved, rotary_seqlens, q, cu_seqlens_q, q_positions_advance):
    return torch.empty_like(q) if q is not None else k.new_empty((0,))


def _empty_combine_outputs(out_partial, out_dtype):
    """out (rows, nheads, head_dim_v) in out_dtype and lse (nheads, rows) in float32."""
    if out_partial.dim() != 4:
        raise ValueError(f"flashhop: out_partial.rank = {out_partial.dim()}: expected 4 (num_splits, rows, nheads, "
                         "head_dim_v)")
    _, rows, nheads, head_dim_v = out_partial.shape
    out = out_partial.new_empty((rows, nheads, head_dim_v), dtype=out_dtype)
    lse = out_partial.new_empty((nheads, rows), dtype=torch.float32)
    return out, lse


@torch.library.custom_op("flashhop::combine", mutates_args=())
def combine(out_partial: torch.Tensor, lse_partial: torch.Tensor,
            out_dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    """The merge of partial results over splits by keys (flashhop.h's combine): out_partial
    (num_splits, rows, nheads, head_dim_v) and lse_partial (num_splits, rows, nheads), float32, each
    split's output normalised by its own sums; returns out (rows, nheads, head_dim_v) in out_dtype and
    lse (nheads, rows)."""
    for name, tensor in (("out_partial", out_partial), ("lse_partial", lse_partial)):
        if tensor.device.type != "cuda":
            raise ValueError(f"flashhop: {name} is on {tensor.device}: expected a CUDA tensor")
    out, lse = _empty_combine_outputs(out_partial, out_dtype)
    with torch.cuda.device(out_partial.device):
        _c_api.combine(out_partial, lse_partial, out, lse)
    return out, lse


@combine.register_fake
def _combine_fake(out_partial, lse_partial, out_dtype):
    return _empty_combine_outputs(out_partial, out_dtype)


# The rows of one per-block scale (flashhop.h's kFp8ScaleBlockRows).
FP8_SCALE_BLOCK_ROWS = 128


def _empty_quantize_outputs(x, scaling, groups):
    """out (x's shape, float8_e4m3fn) and descale (float32) of `scaling`: (1,) per tensor, (batch,
    groups) per head (groups None: one per head), (batch, nheads, ceil(seqlen / 128)) per block. As
    _empty_outputs, only what these shapes are read from is checked here; the library checks the rest."""
    if scaling not in _c_api.FP8_SCALINGS:
        raise ValueError(f"flashhop: scaling = {scaling!r}: expected 'per_tensor', 'per_head' or 'per_block'")
    if groups is not None and scaling != "per_head":
        raise ValueError(f"flashhop: groups = {groups!r} with scaling = {scaling!r}: expected groups only with "
                         "'per_head'")
    if groups is not None and groups < 1:
        raise ValueError(f"flashhop: groups = {groups!r}: expected an int >= 1 that divides nheads")
    if x.dim() != 4:
        raise ValueError(f"flashhop: x.rank = {x.dim()}: expected 4 (batch, seqlen, nheads, head_dim)")
    batch, seqlen, nheads, _ = x.shape
    shapes = {"per_tensor": (1,), "per_head": (batch, nheads if groups is None else groups),
              "per_block": (batch, nheads, -(-seqlen // FP8_SCALE_BLOCK_ROWS))}
    out = x.new_empty(x.shape, dtype=torch.float8_e4m3fn)
    descale = x.new_empty(shapes[scaling], dtype=torch.float32)
    return out, descale


@torch.library.custom_op("flashhop::quantize_fp8", mutates_args=())
def quantize_fp8(x: torch.Tensor, scaling: str, groups: Optional[int],
                 hadamard_signs: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """x (batch, seqlen, nheads, head_dim), float16 or bfloat16, as e4m3 values out (float8_e4m3fn)
    and float32 scales descale, x ~= out * descale (flashhop.h's quantize_fp8), each row first
    rotated by the Walsh-Hadamard transform of hadamard_signs * x where those are given. scaling:
    'per_tensor' (descale (1,)), 'per_head' (descale (batch, groups), head h in group
    h // (nheads // groups), groups None: nheads) or 'per_block' (descale (batch, nheads,
    ceil(seqlen / 128)))."""
    for name, tensor in (("x", x), ("hadamard_signs", hadamard_signs)):
        if tensor is not None and tensor.device.type != "cuda":
            raise ValueError(f"flashhop: {name} is on {tensor.device}: expected a CUDA tensor")
    out, descale = _empty_quantize_outputs(x, scaling, groups)
    with torch.cuda.device(x.device):
        _c_api.quantize_fp8(x, out, descale, scaling, hadamard_signs)
    return out, descale


@quantize_fp8.register_fake
def _quantize_fp8_fake(x, scaling, groups, hadamard_signs):
    return _empty_quantize_outputs(x, scaling, groups)
