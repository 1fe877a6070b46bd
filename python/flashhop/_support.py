"""Which calls the kernels can take, for the callers that choose between flashhop and PyTorch's
attention before calling (sdpa_override, the transformers integration). The library remains the
authority on every argument; these are the facts that decide a fallback."""
import torch

DTYPES = (torch.float16, torch.bfloat16)
# (head_dim, head_dim_v) of the kernels, forward and backward.
HEAD_DIMS = {(64, 64), (96, 96), (128, 128), (192, 192), (192, 128), (256, 256)}


def unsupported_reason(q, k, v):
    """None where the kernels compute attention over q, k and v and its gradients (either layout:
    the head dim is last in both); otherwise why not, in a few words that name the property."""
    tensors = (q, k, v)
    for t in tensors:
        if t.device.type != "cuda":
            return f"tensors on {t.device.type}"
    if q.dtype not in DTYPES:
        return f"dtype {q.dtype}"
    if any(t.dtype != q.dtype for t in tensors):
        return "q, k and v of different dtypes"
    for t in tensors:
        if t.stride(-1) != 1:
            return "a head dim that is not contiguous"
    head_dims = (q.shape[-1], v.shape[-1])
    if k.shape[-1] != q.shape[-1] or head_dims not in HEAD_DIMS:
        return f"head dims {head_dims}"
    return None
