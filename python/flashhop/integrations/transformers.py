"""flashhop as an attention implementation of Hugging Face transformers (5.x):

    import flashhop.integrations.transformers
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="flashhop", dtype=torch.bfloat16)

Importing this module registers `attention_forward` as "flashhop" with transformers'
AttentionInterface, and transformers' FlashAttention mask function as "flashhop" with its
AttentionMaskInterface: models then hand the attention a 2-D padding mask (batch, seqlen_k), True
where a key is a token, or None, and describe causality, sliding windows and soft-capping by
arguments, as they do for FlashAttention; no 4-D mask is built.

Padded batches, and packed sequences (position ids that restart, or cu_seq_lens from a data
collator), run through `varlen_attention`: one call of flashhop's variable-length kernels, forward
and backward.
What flashhop cannot compute falls back to PyTorch with a warning, once per reason: tensors off the
GPU, dtypes other than float16 / bfloat16, head dims without kernels, dropout, a 4-D mask or a
position bias (those go to transformers' SDPA function as they are).
"""
import functools
import math
import warnings
import weakref

import torch
from transformers import AttentionInterface, modeling_utils
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

from .. import flash_attn_func, flash_attn_varlen_func
from .._support import unsupported_reason

NAME = "flashhop"

# The reasons already warned about (each warns once per process).
_warned = set()

# The last position ids read on the host, their version and the bounds found in them: the layers
# of one forward share the tensor, so the host waits for the GPU once per forward, not per layer.
_last_bounds = (None, None, None)


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, sliding_window=None,
                      softcap=None, is_causal=None, **kwargs):
    """transformers' attention function: query (batch, nheads, seqlen_q, head_dim), key and value
    (batch, nheads_kv, seqlen_k, head_dim), nheads a multiple of nheads_kv; returns (out, None) with
    out (batch, seqlen_q, nheads, head_dim_v), as transformers' FlashAttention and SDPA functions do.
    attention_mask: None, the 2-D padding mask of flashhop's mask function, or a 4-D mask that the
    caller built (which goes to SDPA). is_causal: default module.is_causal; the causal mask is
    aligned to the bottom-right corner (the last query sees the last key), so a query block after
    a KV cache sees the whole cache. sliding_window: with causal, a query sees itself and the
    sliding_window - 1 keys before it (transformers' masks). softcap: Gemma 2's logit soft-capping.
    scaling: the softmax scale. kwargs: position_ids (packed sequences), cu_seq_lens_q /
    cu_seq_lens_k (sequences packed by a data collator); transformers' other keyword arguments are
    not about attention and are ignored."""
    if kwargs.get("s_aux") is not None:
        raise NotImplementedError("flashhop: s_aux (attention sinks) is not supported")
    if (attention_mask is not None and attention_mask.dim() == 4) or kwargs.get("position_bias") is not None:
        _warn_once("a 4-D attention mask or a position bias, given to transformers' SDPA attention")
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, softcap=softcap, **kwargs)
    causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # (batch, seqlen, nheads, head_dim)
    options = dict(softmax_scale=scaling, causal=causal, window_size=_window_size(sliding_window, causal),
                   softcap=0.0 if softcap is None else softcap)
    reason = "dropout" if dropout > 0.0 else unsupported_reason(q, k, v)
    if reason is None:
        attend = functools.partial(flash_attn_func, **options)
    else:
        _warn_once(reason)
        attend = functools.partial(torch_attention, dropout_p=dropout, **options)
    return _attention(q, k, v, attention_mask, attend, **kwargs), None


def _attention(q, k, v, attention_mask, attend, position_ids=None, cu_seq_lens_q=None, cu_seq_lens_k=None,
               **kwargs):
    """attend over the batch in FlashAttention's layout, keeping sequences apart: the padded rows
    of a 2-D mask, the sequences packed into one row, or the dense batch."""
    if attention_mask is not None:
        return padded_attention(q, k, v, attention_mask, attend)
    if cu_seq_lens_q is not None and cu_seq_lens_k is not None:
        packed = (t.reshape(-1, *t.shape[2:]) for t in (q, k, v))
        return varlen_attention(*packed, cu_seq_lens_q, cu_seq_lens_k, attend).view(q.shape[:3] + v.shape[3:])
    bounds = _packed_sequence_bounds(position_ids, q, k)
    if bounds is not None:
        return varlen_attention(q[0], k[0], v[0], bounds, bounds, attend)[None]
    return attend(q, k, v)


def padded_attention(q, k, v, attention_mask, attend):
    """Attention over a padded batch, with transformers' FlashAttention conventions: q (batch,
    seqlen_q, nheads, head_dim), k and v (batch, seqlen_k, nheads_kv, head_dim[_v]), attention_mask
    (batch, seqlen_k) bool or integer, nonzero where a key is a token. Keys past the mask's length
    are not read (a static cache's empty slots). Queries: those of the mask where seqlen_q =
    seqlen_k; the only one of each row where seqlen_q = 1; otherwise the mask's last seqlen_q
    columns (left padding). Each sequence's tokens are taken out of the padding, attended by
    varlen_attention, and put back; padding rows of the output are 0."""
    if attention_mask.dim() != 2 or attention_mask.is_floating_point():
        raise ValueError(f"flashhop: attention_mask is a {attention_mask.dim()}-D {attention_mask.dtype} tensor: "
                         "expected a 2-D bool or integer padding mask (batch, seqlen_k)")
    keys = attention_mask.bool()
    batch, seqlen_q = q.shape[:2]
    k, v = k[:, :keys.shape[1]], v[:, :keys.shape[1]]
    if seqlen_q == keys.shape[1]:
        queries = keys
    elif seqlen_q == 1:
        queries = torch.ones(batch, 1, dtype=torch.bool, device=keys.device)
    else:
        queries = keys[:, -seqlen_q:]
    index_q, cu_seqlens_q = _unpad_index(queries)
    index_k, cu_seqlens_k = _unpad_index(keys)
    out = varlen_attention(_gather(q, index_q), _gather(k, index_k), _gather(v, index_k), cu_seqlens_q, cu_seqlens_k,
                           attend)
    padded = out.new_zeros((batch * seqlen_q,) + out.shape[1:])
    padded[index_q] = out
    return padded.view((batch, seqlen_q) + out.shape[1:])


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, attend):
    """flash_attn_varlen_func's computation: q (total_q, nheads, head_dim), k and v (total_k,
    nheads_kv, head_dim[_v]), sequence i being rows cu_seqlens_q[i]:cu_seqlens_q[i + 1] of q and
    likewise of k and v; attend(q, k, v) attends one sequence, batch 1 in FlashAttention's layout.
    Where attend is flashhop's, one call of flashhop's variable-length kernels (differentiable);
    else (PyTorch's fallback) one sequence at a time. Returns (total_q, nheads, head_dim_v); a
    sequence without keys gets 0."""
    bounds_q, bounds_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    if getattr(attend, "func", None) is flash_attn_func:
        longest = lambda bounds: max([end - start for start, end in zip(bounds, bounds[1:])] + [1])  # noqa: E731
        return flash_attn_varlen_func(q, k, v, cu_seqlens_q.to(torch.int32), cu_seqlens_k.to(torch.int32),
                                      longest(bounds_q), longest(bounds_k), **attend.keywords)
    outs = []
    for (start_q, end_q), (start_k, end_k) in zip(zip(bounds_q, bounds_q[1:]), zip(bounds_k, bounds_k[1:])):
        if end_q == start_q or end_k == start_k:
            outs.append(q.new_zeros((end_q - start_q, q.shape[1], v.shape[2])))
        else:
            outs.append(attend(q[None, start_q:end_q], k[None, start_k:end_k], v[None, start_k:end_k])[0])
    return torch.cat(outs)


def torch_attention(q, k, v, softmax_scale=None, causal=False, *, window_size=(-1, -1), softcap=0.0, dropout_p=0.0):
    """flash_attn_func's attention (its layout, bottom-right masks) computed by PyTorch, with
    dropout: through torch's scaled_dot_product_attention, or where softcap > 0, which it lacks, as
    transformers' eager attention computes it (scores soft-capped in the inputs' dtype, softmax in
    at least float32)."""
    seqlen_q, nheads, head_dim = q.shape[1:]
    seqlen_k, nheads_kv = k.shape[1:3]
    diagonal = torch.arange(seqlen_q, device=q.device)[:, None] + seqlen_k - seqlen_q
    key = torch.arange(seqlen_k, device=q.device)[None, :]
    left, right = window_size[0], 0 if causal else window_size[1]
    visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=q.device)
    if left >= 0:
        visible &= key >= diagonal - left
    if right >= 0:
        visible &= key <= diagonal + right
    group = nheads // nheads_kv
    query = q.transpose(1, 2)
    key_, value = (t.transpose(1, 2).repeat_interleave(group, dim=1) for t in (k, v))
    scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else softmax_scale
    if softcap > 0:
        scores = softcap * torch.tanh(query @ key_.transpose(2, 3) * scale / softcap)
        probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1,
                              dtype=torch.promote_types(query.dtype, torch.float32))
        out = torch.nn.functional.dropout(probs.to(query.dtype), p=dropout_p, training=dropout_p > 0) @ value
    else:
        out = torch.nn.functional.scaled_dot_product_attention(query, key_, value, attn_mask=visible,
                                                               dropout_p=dropout_p, scale=scale)
    return out.transpose(1, 2)


def _window_size(sliding_window, causal):
    """flash_attn_func's window_size for transformers' sliding window: its causal mask shows query i
    the keys j with i - sliding_window < j <= i (masking_utils.sliding_window_overlay), its
    bidirectional one those with |i - j| <= sliding_window."""
    if sliding_window is None:
        return (-1, -1)
    return (sliding_window - 1, 0) if causal else (sliding_window, sliding_window)


def _unpad_index(mask):
    """The flat (batch * seqlen) indices of a padding mask's tokens, and cu_seqlens over its rows."""
    index = mask.flatten().nonzero().flatten()
    cu_seqlens = torch.nn.functional.pad(mask.sum(dim=1, dtype=torch.int32).cumsum(0, dtype=torch.int32), (1, 0))
    return index, cu_seqlens


def _gather(t, index):
    return t.reshape(-1, *t.shape[2:])[index]


def _packed_sequence_bounds(position_ids, q, k):
    """cu_seqlens of the sequences packed into a batch of one row, where its position ids restart
    (transformers' _is_packed_sequence, which FlashAttention's path uses); None where they count
    up without a restart, or cannot describe packing. Reads the ids on the host, as that check
    does, once per tensor of ids (_last_bounds)."""
    global _last_bounds
    if position_ids is None or position_ids.dim() != 2 or q.shape[0] != 1:
        return None
    if q.shape[1] == 1 or q.shape[1] != k.shape[1]:
        return None
    last_ids, last_version, last_bounds = _last_bounds
    if last_ids is not None and last_ids() is position_ids and last_version == position_ids._version:
        return last_bounds
    positions = position_ids[0]
    first = positions.min()
    bounds = None
    if not torch.equal(positions, torch.arange(positions.numel(), device=positions.device) + first):
        starts = (positions == first).nonzero().flatten()
        end = torch.tensor([positions.numel()], device=positions.device)
        bounds = torch.cat([starts, end]).to(torch.int32)
    _last_bounds = (weakref.ref(position_ids), position_ids._version, bounds)
    return bounds


def _warn_once(reason):
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(f"flashhop: {reason}: attention runs in PyTorch instead (warned once per reason)",
                      stacklevel=3)


def _skip_flash_preload():
    """transformers takes every attention implementation whose name contains "flash" for a
    FlashAttention package and, when a model is built, imports it by name
    (modeling_utils.lazy_import_flash_attention), which fails for "flashhop": there is nothing to
    import. Its other FlashAttention behaviour (2-D masks kept, as this integration needs) stays.
    The wrapper returns for "flashhop" and passes every other name on."""
    preload = modeling_utils.lazy_import_flash_attention

    @functools.wraps(preload)
    def lazy_import_flash_attention(implementation, *args, **kwargs):
        if implementation == NAME:
            return None
        return preload(implementation, *args, **kwargs)

    modeling_utils.lazy_import_flash_attention = lazy_import_flash_attention


AttentionInterface.register(NAME, attention_forward)
AttentionMaskInterface.register(NAME, flash_attention_mask)
_skip_flash_preload()
