"""The public functions: FlashAttention-3's `flash_attn_func`, `flash_attn_varlen_func` and
`flash_attn_with_kvcache`, a drop-in for torch.nn.functional.scaled_dot_product_attention,
`sdpa_override`, which routes torch's own function to it, and `quantize_fp8` / `hadamard_signs`, the
FP8 inputs of FP8 attention. Arguments that the kernels do not support yet raise
NotImplementedError, never get ignored."""
import contextlib

import torch

from . import _ops  # noqa: F401  (registers torch.ops.flashhop.*)
from ._support import unsupported_reason


def flash_attn_func(q, k, v, softmax_scale=None, causal=False, *, window_size=(-1, -1), softcap=0.0,
                    pack_gqa=None, deterministic=False, return_attn_probs=False, q_descale=None, k_descale=None,
                    v_descale=None, q_block_scale=None, k_block_scale=None, v_block_scale=None):
    """Exact attention in FlashAttention's layout, as FlashAttention-3's function of this name.

    q: (batch, seqlen_q, nheads, head_dim); k: (batch, seqlen_k, nheads_kv, head_dim); v: (batch,
    seqlen_k, nheads_kv, head_dim_v); float16 or bfloat16 CUDA tensors, any strides with the last
    dimension contiguous; nheads a multiple of nheads_kv (GQA / MQA). (head_dim, head_dim_v): (64, 64),
    (96, 96), (128, 128), (192, 192), (192, 128) or (256, 256).
    softmax_scale: default 1 / sqrt(head_dim).
    Masks are aligned to the bottom-right corner; with offset = seqlen_k - seqlen_q:
    causal: query i sees keys j <= i + offset.
    window_size: (left, right), a sliding window: query i sees keys j with
    i + offset - left <= j <= i + offset + right; -1 leaves a side unbounded, (-1, -1) is no window
    and (-1, 0) is causal. As in FlashAttention-3, causal sets right to 0 whatever it was.
    softcap: > 0 caps the scores s = softmax_scale * q.k to softcap * tanh(s / softcap) before the
    mask and the softmax; 0.0 is off.
    pack_gqa: with GQA / MQA (nheads > nheads_kv), whether the query heads that share a KV head are
    packed into the rows of one query tile, which pays for short seqlen_q (decoding). None lets the
    library choose (it packs when that fills the query tiles better), True always packs,
    False never does; the result is the same attention either way.
    deterministic: the backward accumulates dq in a fixed order, so that repeated backward calls are
    bitwise identical (dk and dv always are); differentiable through torch.ops.flashhop.bwd.
    FP8, as FlashAttention-3's: q, k and v float8_e4m3fn, and q_descale, k_descale, v_descale
    None (1) or float32 (batch, nheads_kv) CUDA tensors: the scores are softmax_scale * q_descale *
    k_descale * q.k of the e4m3 values, out is v_descale * softmax(scores) v, in bfloat16 (forward
    only). Or, instead of the descales, block scales (flashhop's, not with pack_gqa=True): float32
    q_block_scale (batch, nheads, ceil(seqlen_q / 128)), k_block_scale and v_block_scale (batch,
    nheads_kv, ceil(seqlen_k / 128)), one per 128 rows of a head, as quantize_fp8(scaling="per_block")
    gives them (head dims other than 192).
    Returns out (batch, seqlen_q, nheads, head_dim_v), and with return_attn_probs also
    softmax_lse (batch, nheads, seqlen_q) in float32 (natural log, of the capped scores), as
    FlashAttention-3 does. A query row that sees no key gets out = 0 and softmax_lse = -inf.
    """
    window_left, window_right = _window(window_size, causal)
    out, softmax_lse = torch.ops.flashhop.fwd(q, k, v, softmax_scale, causal, window_left, window_right, softcap,
                                              pack_gqa, deterministic, q_descale, k_descale, v_descale,
                                              q_block_scale, k_block_scale, v_block_scale)
    return (out, softmax_lse) if return_attn_probs else out


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q=None,
                           seqused_k=None, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                           pack_gqa=None, deterministic=False, return_attn_probs=False, q_descale=None,
                           k_descale=None, v_descale=None):
    """Exact attention over a packed batch of sequences of different lengths, as
    FlashAttention-3's function of this name; differentiable through torch.ops.flashhop.varlen_bwd.

    q: (total_q, nheads, head_dim); k: (total_k, nheads_kv, head_dim); v: (total_k, nheads_kv,
    head_dim_v); dtypes, head dims and strides as flash_attn_func's.
    cu_seqlens_q, cu_seqlens_k: int32 (batch + 1) CUDA tensors; sequence b is rows
    cu_seqlens_q[b]:cu_seqlens_q[b + 1] of q and rows cu_seqlens_k[b]:cu_seqlens_k[b + 1] of k and v.
    max_seqlen_q, max_seqlen_k: ints, at least the longest sequence's length (0 for a batch of empty
    sequences).
    seqused_q, seqused_k: None, or int32 (batch) CUDA tensors: only the first seqused[b] rows of
    sequence b's slot are used; the other rows are read too (weighed by zero) and must be finite.
    softmax_scale, causal, window_size, softcap, pack_gqa: as flash_attn_func's, each sequence's mask
    aligned to its own bottom-right corner. deterministic: as flash_attn_func's; the gradients' rows
    outside every sequence's used rows are 0.
    q_descale, k_descale, v_descale: FP8 inputs' descales, (batch, nheads_kv), as flash_attn_func's
    (block scales are for fixed-length batches).
    Returns out (total_q, nheads, head_dim_v), and with return_attn_probs also softmax_lse (nheads,
    total_q) in float32, as FlashAttention-3 does.
    """
    window_left, window_right = _window(window_size, causal)
    for name, tensor in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"flashhop: {name} = {tensor!r}: expected an int32 tensor of batch + 1 offsets")
    for name, tensor in (("seqused_q", seqused_q), ("seqused_k", seqused_k)):
        if tensor is not None and not isinstance(tensor, torch.Tensor):
            raise ValueError(f"flashhop: {name} = {tensor!r}: expected None or an int32 tensor of batch lengths")
    bounds = []
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"flashhop: {name} = {value!r}: expected an int >= 0, the longest sequence's length")
        # The library takes a bound >= 1; 0 (every sequence empty) is bounded by 1 as well.
        bounds.append(max(value, 1))
    out, softmax_lse = torch.ops.flashhop.varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k,
                                                     *bounds, softmax_scale, causal, window_left, window_right,
                                                     softcap, pack_gqa, deterministic, q_descale, k_descale,
                                                     v_descale)
    return (out, softmax_lse) if return_attn_probs else out


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, page_table=None,
                            cu_seqlens_q=None, cu_seqlens_k_new=None, max_seqlen_q=None, rotary_seqlens=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, num_splits=0, pack_gqa=None, return_softmax_lse=False,
                            q_descale=None, k_descale=None, v_descale=None):
    """Attention of new queries over a KV cache, as FlashAttention-3's function of this name, for
    decoding and chunked prefill.

    q: (batch, seqlen_q, nheads, head_dim), or with cu_seqlens_q (total_q, nheads, head_dim) and
    max_seqlen_q, the queries of sequence b being rows cu_seqlens_q[b]:cu_seqlens_q[b + 1].
    k_cache, v_cache: a contiguous cache (batch_cache, seqlen_cache, nheads_kv, head_dim[_v]),
    sequence b reading entry cache_batch_idx[b] (default b); or with page_table (batch, max_pages)
    int32 a paged cache (num_pages, page_size, nheads_kv, head_dim[_v]), key j of sequence b being
    row j % page_size of page page_table[b, j // page_size]. Any page size from 1 up (at head dim 96 an
    even one, a multiple of 4 in e4m3; even in e4m3 at head dims 64 and 192).
    cache_seqlens: int, or int32 (batch) tensor: the keys of each sequence in the cache (default:
    the whole cache entry, seqlen_cache or max_pages * page_size).
    softmax_scale, causal, window_size, softcap: as flash_attn_func's, each sequence's mask aligned to
    its own bottom-right corner (its last query sees its last key).
    num_splits: splits of each query tile's keys, as FA3's: 0 lets flashhop choose (it splits
    batches too small to fill the GPU, such as decoding a few sequences), 1 splits nothing, n in
    [2, 256] splits n ways; the splits' partial results merge in a second kernel.
    pack_gqa: None (flashhop chooses), True or False: whether the query heads that share a KV head
    share its query tiles (and read its keys once).
    k, v: new keys and values (batch, seqlen_new, nheads_kv, head_dim[_v]), or with
    cu_seqlens_k_new (total_new, nheads_kv, head_dim[_v]): written into the cache in place after each
    sequence's cache_seqlens keys (a tensor then), and attended with them.
    rotary_cos, rotary_sin: (seqlen_ro, rotary_dim / 2) in q's dtype, with k and v: the new keys are
    rotated at positions rotary_seqlens[b] (default cache_seqlens[b]) + i, and q at the same
    positions (query i at + i with a causal or local mask, else all at + 0), pairs (2j, 2j + 1)
    with rotary_interleaved, else (j, j + rotary_dim / 2). Outside CUDA-graph capture, a cache too
    small for the new rows, or tables shorter than the positions, raise ValueError and write
    nothing (the check reads the positions back, one synchronisation); under capture the kernel
    leaves such rows out of the cache and unrotated.
    cache_leftpad: int32 (batch), contiguous caches only: sequence b's keys are rows
    cache_leftpad[b] .. cache_seqlens[b] of its cache entry (positions stay the rows').
    FP8: q and the cache float8_e4m3fn (k and v too, appended as they are: no rotary tables), with
    q_descale, k_descale, v_descale as flash_attn_func's, (batch, nheads_kv); out is bfloat16.
    Returns out in q's layout with head_dim_v, and with return_softmax_lse also softmax_lse in
    float32: (batch, nheads, seqlen_q), or (nheads, total_q) with cu_seqlens_q.
    """
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 0:
        raise ValueError(f"flashhop: num_splits = {num_splits!r}: expected an int >= 0 (0: the kernels choose)")
    window_left, window_right = _window(window_size, causal)
    for name, tensor in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"flashhop: {name} = {tensor!r}: expected a tensor")
    if k_cache.dim() != 4:
        raise ValueError(f"flashhop: k_cache.rank = {k_cache.dim()}: expected 4 (batch_cache, seqlen_cache, "
                         "nheads_kv, head_dim) or, with page_table, (num_pages, page_size, nheads_kv, head_dim)")
    device = q.device
    if cu_seqlens_q is None:
        if q.dim() != 4:
            raise ValueError(f"flashhop: q.rank = {q.dim()}: expected 4 (batch, seqlen_q, nheads, head_dim) "
                             "without cu_seqlens_q")
        batch, seqlen_q = q.shape[0], q.shape[1]
        cu_seqlens = torch.arange(batch + 1, dtype=torch.int32, device=device) * seqlen_q
        queries = q.reshape(batch * seqlen_q, q.shape[2], q.shape[3])
        bound_q = seqlen_q
    else:
        if not isinstance(cu_seqlens_q, torch.Tensor):
            raise ValueError(f"flashhop: cu_seqlens_q = {cu_seqlens_q!r}: expected an int32 tensor of batch + 1 "
                             "offsets")
        if isinstance(max_seqlen_q, bool) or not isinstance(max_seqlen_q, int) or max_seqlen_q < 0:
            raise ValueError(f"flashhop: max_seqlen_q = {max_seqlen_q!r}: expected an int >= 0 with cu_seqlens_q")
        batch, cu_seqlens, queries, bound_q = cu_seqlens_q.shape[0] - 1, cu_seqlens_q, q, max_seqlen_q
    if page_table is None:
        # A contiguous cache is a paged one of one page per cache entry.
        if cache_batch_idx is None:
            if k_cache.shape[0] < batch:
                raise ValueError(f"flashhop: k_cache.shape[0] (batch_cache) = {k_cache.shape[0]}: expected >= "
                                 f"{batch} (the batch) without cache_batch_idx")
            entries = torch.arange(batch, dtype=torch.int32, device=device)
        else:
            if not isinstance(cache_batch_idx, torch.Tensor) or cache_batch_idx.dim() != 1 \
                    or cache_batch_idx.shape[0] != batch:
                raise ValueError(f"flashhop: cache_batch_idx: expected an int32 tensor of {batch} cache entries")
            entries = cache_batch_idx.to(torch.int32)
        table = entries.view(batch, 1)
    else:
        if cache_batch_idx is not None:
            raise ValueError("flashhop: cache_batch_idx is given with page_table: expected one of them (the page "
                             "table names each sequence's pages)")
        if cache_leftpad is not None:
            raise NotImplementedError("flashhop: cache_leftpad is given with page_table: left padding applies to "
                                      "contiguous caches only, as FlashAttention-3's")
        table = page_table
    capacity = table.shape[1] * k_cache.shape[1]
    if cache_seqlens is None:
        keys = torch.full((batch,), capacity, dtype=torch.int32, device=device)
    elif isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool):
        keys = torch.full((batch,), cache_seqlens, dtype=torch.int32, device=device)
    elif isinstance(cache_seqlens, torch.Tensor):
        keys = cache_seqlens
    else:
        raise ValueError(f"flashhop: cache_seqlens = {cache_seqlens!r}: expected None, an int or an int32 tensor "
                         "of batch key counts")
    if k is not None or v is not None or rotary_cos is not None or rotary_sin is not None:
        queries, keys = _append(queries, cu_seqlens, k_cache, v_cache, table, keys, k, v, cu_seqlens_k_new,
                                rotary_cos, rotary_sin, rotary_interleaved, rotary_seqlens,
                                causal or window_size != (-1, -1), batch)
    elif cu_seqlens_k_new is not None or rotary_seqlens is not None:
        raise ValueError("flashhop: cu_seqlens_k_new and rotary_seqlens are given without k and v: expected them "
                         "only with new keys and values")
    out, softmax_lse = torch.ops.flashhop.paged_fwd(queries, k_cache, v_cache, table, cu_seqlens, keys,
                                                    max(bound_q, 1), max(capacity, 1), softmax_scale, causal,
                                                    window_left, window_right, softcap, pack_gqa, num_splits,
                                                    cache_leftpad, q_descale, k_descale, v_descale)
    if cu_seqlens_q is None:
        out = out.view(batch, q.shape[1], q.shape[2], out.shape[2])
        softmax_lse = softmax_lse.view(q.shape[2], batch, q.shape[1]).permute(1, 0, 2)
    return (out, softmax_lse) if return_softmax_lse else out


def _append(queries, cu_seqlens_q, k_cache, v_cache, table, keys, k, v, cu_seqlens_k_new, rotary_cos, rotary_sin,
            rotary_interleaved, rotary_seqlens, positions_advance, batch):
    """flash_attn_with_kvcache's append: k / v into the cache after `keys` keys of each sequence, the
    rotary embedding on them and on the queries. Returns the queries to attend with and the keys of
    each sequence after the append."""
    if k is None or v is None:
        raise ValueError("flashhop: flash_attn_with_kvcache: k and v (the new keys and values) come together, and "
                         "rotary_cos / rotary_sin only with them")
    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError("flashhop: rotary_cos and rotary_sin: expected both or neither")
    if not isinstance(keys, torch.Tensor) or keys.dtype != torch.int32:
        raise ValueError("flashhop: cache_seqlens: expected an int32 tensor of batch key counts with k and v")
    if cu_seqlens_k_new is None:
        if k.dim() != 4 or v.dim() != 4:
            raise ValueError(f"flashhop: k.rank = {k.dim()}, v.rank = {v.dim()}: expected 4 (batch, seqlen_new, "
                             "nheads_kv, head_dim) without cu_seqlens_k_new")
        if k.shape[0] != batch:
            raise ValueError(f"flashhop: k.shape[0] = {k.shape[0]}: expected the batch, {batch}")
        seqlen_new = k.shape[1]
        cu_new = torch.arange(batch + 1, dtype=torch.int32, device=k.device) * seqlen_new
        k_rows, v_rows = k.reshape(-1, *k.shape[2:]), v.reshape(-1, *v.shape[2:])
    else:
        cu_new, k_rows, v_rows = cu_seqlens_k_new, k, v
    new = cu_new[1:] - cu_new[:-1]
    rotary = rotary_cos is not None
    if not torch.cuda.is_current_stream_capturing():
        # The last key written and the last position rotated, against the cache and the tables.
        first = rotary_seqlens if rotary_seqlens is not None else keys
        counts = torch.stack([(keys + new).max(), (first + torch.maximum(new, cu_seqlens_q[1:] - cu_seqlens_q[:-1]))
                              .max()]).tolist() if batch > 0 else [0, 0]
        capacity = table.shape[1] * k_cache.shape[1]
        if counts[0] > capacity:
            raise ValueError(f"flashhop: cache_seqlens + the new rows reach {counts[0]} keys: expected <= {capacity}, "
                             "the cache's keys per sequence")
        if rotary and counts[1] > rotary_cos.shape[0]:
            raise ValueError(f"flashhop: rotary_cos.shape[0] (seqlen_ro) = {rotary_cos.shape[0]}: expected >= "
                             f"{counts[1]}, the positions of the new keys and queries")
    rotated = torch.ops.flashhop.append_kv(k_cache, v_cache, table, keys, k_rows, v_rows, cu_new, rotary_cos,
                                           rotary_sin, rotary_interleaved, rotary_seqlens,
                                           queries if rotary else None, cu_seqlens_q if rotary else None,
                                           positions_advance)
    return (rotated if rotary else queries), keys + new


def _window(window_size, causal):
    """(window_left, window_right) from FlashAttention's window_size; causal sets the right side to 0,
    as FlashAttention-3 does (the library itself rejects causal with a window to the right)."""
    window_size = tuple(window_size)
    if len(window_size) != 2:
        raise ValueError(f"flashhop: window_size = {window_size}: expected (left, right)")
    window_left, window_right = window_size
    return window_left, 0 if causal else window_right


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    """torch.nn.functional.scaled_dot_product_attention with its layout and meaning, for 4-D
    inputs: query (batch, nheads, seqlen_q, head_dim), key and value (batch, nheads_kv, seqlen_k,
    head_dim); returns (batch, nheads, seqlen_q, head_dim). As there, is_causal aligns the mask to
    the top-left corner (query i sees keys j <= i) and nheads != nheads_kv needs enable_gqa=True.
    attn_mask and dropout are not supported. Error messages from the library name dimensions in
    FlashAttention's layout (batch, seqlen, nheads, head_dim), which these inputs are viewed as.
    """
    if attn_mask is not None:
        raise NotImplementedError("flashhop: attn_mask is not supported; only is_causal masks")
    if dropout_p != 0.0:
        raise NotImplementedError(f"flashhop: dropout_p = {dropout_p}: dropout is not supported; use 0.0")
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        if tensor.dim() != 4:
            raise ValueError(f"flashhop: {name}.rank = {tensor.dim()}: expected 4 (batch, nheads, seqlen, head_dim)")
    if query.shape[1] != key.shape[1] and not enable_gqa:
        raise ValueError(f"flashhop: query has {query.shape[1]} heads and key {key.shape[1]}: "
                         "pass enable_gqa=True for grouped-query attention")
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    out = _top_left_causal(q, k, v, scale) if is_causal else flash_attn_func(q, k, v, scale)
    return out.transpose(1, 2)


def _top_left_causal(q, k, v, scale):
    """Causal attention with the mask aligned to the top-left corner, from the bottom-right one."""
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    if seqlen_q <= seqlen_k:
        # No query sees a key past seqlen_q - 1; without those keys the two alignments coincide.
        return flash_attn_func(q, k[:, :seqlen_q], v[:, :seqlen_q], scale, causal=True)
    # The first seqlen_k queries form a square causal block; every later query sees all keys.
    head = flash_attn_func(q[:, :seqlen_k], k, v, scale, causal=True)
    tail = flash_attn_func(q[:, seqlen_k:], k, v, scale)
    return torch.cat([head, tail], dim=1)


@contextlib.contextmanager
def sdpa_override():
    """Within the block, torch.nn.functional.scaled_dot_product_attention runs the calls that
    flashhop computes through scaled_dot_product_attention above, and passes every other call on,
    unchanged, to the function it replaced. flashhop takes 4-D CUDA float16 / bfloat16 inputs with
    the head dims flash_attn_func lists, no attn_mask, dropout_p = 0, any is_causal, scale and
    enable_gqa. The replaced function comes back on exit, on an exception too; blocks nest. The
    replacement is of the module attribute, process-wide:
    other threads see it while the block runs, and code that bound the function to a name of its
    own before the block (`from torch.nn.functional import scaled_dot_product_attention`) keeps
    calling torch's."""
    replaced = torch.nn.functional.scaled_dot_product_attention

    def routed(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kwargs):
        if _routable(query, key, value, attn_mask, dropout_p, kwargs):
            return scaled_dot_product_attention(query, key, value, is_causal=is_causal, scale=scale,
                                                enable_gqa=kwargs.get("enable_gqa", False))
        return replaced(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                        scale=scale, **kwargs)

    torch.nn.functional.scaled_dot_product_attention = routed
    try:
        yield
    finally:
        torch.nn.functional.scaled_dot_product_attention = replaced


def _routable(query, key, value, attn_mask, dropout_p, kwargs):
    """Whether an SDPA call is one flashhop computes; calls torch would reject go to torch, which
    explains them."""
    tensors = (query, key, value)
    if set(kwargs) - {"enable_gqa"} or attn_mask is not None or dropout_p != 0.0:
        return False
    if not all(isinstance(t, torch.Tensor) and not t.is_nested and t.dim() == 4 for t in tensors):
        return False
    batch, nheads, _, _ = query.shape
    _, nheads_kv, seqlen_k, _ = key.shape
    if key.shape[0] != batch or value.shape[:3] != (batch, nheads_kv, seqlen_k):
        return False
    if nheads != nheads_kv and not (kwargs.get("enable_gqa", False) and nheads % nheads_kv == 0):
        return False
    return unsupported_reason(query, key, value) is None


def flash_attn_combine(out_partial, lse_partial, out=None, out_dtype=None):
    """Merges attention computed over splits of the keys, as FlashAttention-3's function of this
    name: out_partial (num_splits, batch, seqlen, nheads, head_dim_v) and lse_partial (num_splits,
    batch, seqlen, nheads), float32, each split's output normalised by its own softmax sums and its
    LSE (-inf where it saw no key); or the variable-length layout without the batch dimension.
    Returns (out, lse): out (batch, seqlen, nheads, head_dim_v) in out_dtype (default: out_partial's
    float32), written into `out` where given, and lse (batch, seqlen, nheads) (or (total, nheads))."""
    for name, tensor in (("out_partial", out_partial), ("lse_partial", lse_partial)):
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"flashhop: {name} = {tensor!r}: expected a tensor")
    if out_partial.dim() not in (4, 5) or lse_partial.dim() != out_partial.dim() - 1:
        raise ValueError(f"flashhop: out_partial.rank = {out_partial.dim()}, lse_partial.rank = {lse_partial.dim()}: "
                         "expected 5 and 4 (num_splits, batch, seqlen, nheads[, head_dim_v]) or 4 and 3 "
                         "(num_splits, total, nheads[, head_dim_v])")
    if out_dtype is None:
        out_dtype = out.dtype if out is not None else out_partial.dtype
    lead = out_partial.shape[1:-2]  # (batch, seqlen) or (total,)
    rows = 1
    for size in lead:
        rows *= size
    splits, nheads, head_dim_v = out_partial.shape[0], out_partial.shape[-2], out_partial.shape[-1]
    merged, lse = torch.ops.flashhop.combine(out_partial.reshape(splits, rows, nheads, head_dim_v),
                                             lse_partial.reshape(splits, rows, nheads), out_dtype)
    merged = merged.view(*lead, nheads, head_dim_v)
    lse = lse.t().reshape(*lead, nheads)
    if out is not None:
        out.copy_(merged)
        merged = out
    return merged, lse


def quantize_fp8(x, scaling="per_head", groups=None, hadamard_signs=None):
    """x as FP8 (e4m3) values and their scales, the inputs of FP8 attention with FlashAttention-3's
    descale tensors: returns (x_fp8, descale) with x ~= x_fp8 * descale (per group of values, as
    broadcast below), descale = amax / 448 of the group (1 where the group is all zeros), x_fp8
    rounded to nearest even and saturated at +-448.

    x: (batch, seqlen, nheads, head_dim), a float16 or bfloat16 CUDA tensor, any strides with the
    last dimension contiguous; head_dim 64, 96, 128, 192 or 256.
    scaling: 'per_head' (descale (batch, groups): head h belongs to group h // (nheads // groups);
    groups defaults to nheads, and groups = nheads_kv gives queries FlashAttention-3's
    (batch, nheads_kv) q_descale), 'per_tensor' (descale (1,)) or 'per_block' (descale
    (batch, nheads, ceil(seqlen / 128)), one scale per 128 rows of a head).
    hadamard_signs: None, or a float32 (head_dim,) CUDA tensor of +-1 (hadamard_signs()): each row
    is first rotated, x -> H (signs * x), H the Walsh-Hadamard transform on blocks of the largest
    power of two dividing head_dim, scaled to be orthogonal. Rotating q and k with the same signs
    leaves q k^T unchanged and spreads outliers, so that e4m3 keeps more of each row (incoherent
    processing, FlashAttention-3 section 3.3); v is not rotated. The kernel takes the sign of each
    value, a value >= 0 as +1.
    """
    # The operator's schema would turn a bool or a float into an int.
    if groups is not None and (isinstance(groups, bool) or not isinstance(groups, int)):
        raise ValueError(f"flashhop: groups = {groups!r}: expected None or an int >= 1 that divides nheads")
    return torch.ops.flashhop.quantize_fp8(x, scaling, groups, hadamard_signs)


def hadamard_signs(head_dim, seed=0, device="cuda"):
    """A random vector of head_dim values +1.0 / -1.0 (float32) for quantize_fp8's rotation, the same
    for the same seed on every device and every run (drawn on the CPU)."""
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 1:
        raise ValueError(f"flashhop: head_dim = {head_dim!r}: expected an int >= 1")
    generator = torch.Generator(device="cpu").manual_seed(seed)
    bits = torch.randint(0, 2, (head_dim,), generator=generator)
    return (2.0 * bits - 1.0).to(dtype=torch.float32, device=device)
