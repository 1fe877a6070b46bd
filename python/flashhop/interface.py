"""The public functions: FlashAttention-3's `flash_attn_func` and a drop-in for
torch.nn.functional.scaled_dot_product_attention. Arguments that the kernels do not support yet
raise NotImplementedError, never get ignored."""
import torch

from . import _ops  # noqa: F401  (registers torch.ops.flashhop.*)

# FlashAttention's window (left, right), -1 = unbounded, that equals a causal mask.
_CAUSAL_WINDOW = (-1, 0)
_NO_WINDOW = (-1, -1)


def flash_attn_func(q, k, v, softmax_scale=None, causal=False, *, window_size=_NO_WINDOW, softcap=0.0,
                    return_attn_probs=False):
    """Exact attention in FlashAttention's layout, as FlashAttention-3's function of this name.

    q: (batch, seqlen_q, nheads, head_dim); k, v: (batch, seqlen_k, nheads_kv, head_dim), float16
    or bfloat16 CUDA tensors, any strides with the last dimension contiguous; nheads a multiple of
    nheads_kv (GQA / MQA). head_dim: 64, 128 or 256.
    softmax_scale: default 1 / sqrt(head_dim).
    causal: mask aligned to the bottom-right corner (query i sees keys j <= i + seqlen_k - seqlen_q).
    window_size: only (-1, -1) (none) and (-1, 0) (the same as causal) are supported yet.
    softcap: only 0.0 (off) is supported yet.
    Returns out (batch, seqlen_q, nheads, head_dim), and with return_attn_probs also
    softmax_lse (batch, nheads, seqlen_q) in float32 (natural log), as FlashAttention-3 does.
    A query row that sees no key gets out = 0 and softmax_lse = -inf.
    """
    window_size = tuple(window_size)
    if window_size == _CAUSAL_WINDOW:
        causal = True
    elif window_size != _NO_WINDOW:
        raise NotImplementedError(
            f"flashhop: window_size = {window_size}: local (sliding-window) attention is not supported yet; "
            "use (-1, -1), or (-1, 0) for causal")
    if softcap != 0.0:
        raise NotImplementedError(f"flashhop: softcap = {softcap}: soft-capping is not supported yet; use 0.0")
    out, softmax_lse = torch.ops.flashhop.fwd(q, k, v, softmax_scale, causal)
    return (out, softmax_lse) if return_attn_probs else out


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
