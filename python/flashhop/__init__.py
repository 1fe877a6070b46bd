"""flashhop: exact attention kernels (forward and backward) for NVIDIA Hopper GPUs, as PyTorch operators.

    import flashhop
    out = flashhop.flash_attn_func(q, k, v, causal=True)           # (batch, seqlen, nheads, head_dim)
    out = flashhop.scaled_dot_product_attention(q, k, v, is_causal=True)  # (batch, nheads, seqlen, head_dim)
    with flashhop.sdpa_override():  # torch.nn.functional.scaled_dot_product_attention runs flashhop's
        out = model(x)

The Hugging Face transformers integration is flashhop.integrations.transformers (imported on its own).

The operators are torch.ops.flashhop.fwd and torch.ops.flashhop.bwd (its gradients),
torch.ops.flashhop.varlen_fwd and varlen_bwd behind flash_attn_varlen_func (packed batches of
sequences of different lengths), torch.ops.flashhop.paged_fwd behind flash_attn_with_kvcache (queries
over a contiguous or paged KV cache), torch.ops.flashhop.combine behind flash_attn_combine (the
merge of results over splits of the keys) and torch.ops.flashhop.quantize_fp8 behind quantize_fp8 (FP8
inputs and their descale tensors for FP8 attention).
"""
try:
    import torch  # noqa: F401
except ImportError as error:
    raise ImportError("flashhop needs PyTorch: install torch (a CUDA build) first") from error

from .interface import (flash_attn_combine, flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache,
                        hadamard_signs, quantize_fp8, scaled_dot_product_attention, sdpa_override)

__all__ = ["flash_attn_combine", "flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache",
           "hadamard_signs", "quantize_fp8", "scaled_dot_product_attention", "sdpa_override"]
