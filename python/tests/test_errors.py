"""Every bad input gets an exception that names what is wrong, and nothing runs."""
import pytest

torch = pytest.importorskip("torch")

import flashhop  # noqa: E402
from helpers import HOPPER, random_qkv, requires_hopper  # noqa: E402


def _inputs(device="cuda"):
    """Valid q, k, v; on the CPU where there is no GPU, for the checks that come before any launch."""
    if device == "cuda" and not HOPPER:
        device = "cpu"
    shape = (2, 33, 4, 128)
    return tuple(torch.randn(*shape, dtype=torch.bfloat16, device=device) for _ in range(3))


@pytest.mark.parametrize("window_size", [(8,), (1, 2, 3)])
def test_window_size_is_a_pair(window_size):
    with pytest.raises(ValueError, match=r"window_size = \(.*\): expected \(left, right\)"):
        flashhop.flash_attn_func(*_inputs(), window_size=window_size)


def test_sdpa_unsupported_arguments():
    q, k, v = (t.transpose(1, 2) for t in _inputs())
    with pytest.raises(NotImplementedError, match="attn_mask is not supported"):
        flashhop.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(33, 33, dtype=torch.bool))
    with pytest.raises(NotImplementedError, match="dropout_p = 0.1: dropout is not supported"):
        flashhop.scaled_dot_product_attention(q, k, v, dropout_p=0.1)
    with pytest.raises(ValueError, match="pass enable_gqa=True"):
        flashhop.scaled_dot_product_attention(q, k[:, :2], v[:, :2])
    with pytest.raises(ValueError, match=r"query.rank = 3: expected 4 \(batch, nheads, seqlen, head_dim\)"):
        flashhop.scaled_dot_product_attention(q[0], k, v)


def test_cpu_tensors_are_rejected():
    q, k, v = _inputs("cpu")
    with pytest.raises(ValueError, match="flashhop: q is on cpu: expected a CUDA tensor"):
        flashhop.flash_attn_func(q, k, v)


def test_float8_operands_are_named_by_the_library():
    """float8_e4m3fn reaches the library, which takes it for q, k and v together (FP8 attention)
    and names the operand that breaks that; the library validates host descriptors without a device."""
    import ctypes

    from flashhop import _c_api

    def describe(tensor):  # as _c_api._describe, on device 0 for the host tensors
        desc = _c_api._Tensor(data=tensor.data_ptr(), dtype=_c_api._DTYPES[tensor.dtype], rank=tensor.dim(),
                              device=0)
        for d in range(tensor.dim()):
            desc.shape[d], desc.stride[d] = tensor.shape[d], tensor.stride(d)
        return desc

    q, k, v = _inputs("cpu")
    size = ctypes.c_size_t()
    for fp8, message in [("q", r"k.dtype = bfloat16: expected float8_e4m3fn \(the dtype of q\)"),
                         ("k", r"k.dtype = float8_e4m3fn: expected bfloat16 \(the dtype of q\)")]:
        tensors = {"q": q, "k": k, "v": v, "o": torch.empty_like(q)}
        tensors[fp8] = tensors[fp8].to(torch.float8_e4m3fn)
        args = _c_api._ForwardArgs(**{name: describe(t) for name, t in tensors.items()})
        with pytest.raises(ValueError, match=message):
            _c_api._check(_c_api._library.flashhop_forward_workspace_size(ctypes.byref(args), ctypes.byref(size)))


@requires_hopper
def test_tensor_on_the_cpu_among_cuda_ones():
    q, k, v = _inputs()
    with pytest.raises(ValueError, match="flashhop: v is on cpu: expected a CUDA tensor"):
        flashhop.flash_attn_func(q, k, v.cpu())


@requires_hopper
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_tensors_on_different_gpus():
    q, k, v = _inputs()
    with pytest.raises(ValueError, match=r"k.device = 1: expected 0 \(q.device\)"):
        flashhop.flash_attn_func(q, k.to("cuda:1"), v)


# (what to do to valid bf16 inputs (q, k, v), the exception, a pattern of its message)
BAD_INPUTS = {
    "dtype_mismatch": (lambda q, k, v: (q, k.half(), v), ValueError,
                       r"k.dtype = float16: expected bfloat16 \(the dtype of q\)"),
    "float32": (lambda q, k, v: (q.float(), k.float(), v.float()), ValueError,
                "q.dtype = float32: expected float16, bfloat16 or float8_e4m3fn"),
    "float64": (lambda q, k, v: (q.double(), k, v), ValueError,
                "q.dtype = torch.float64: expected torch.float16 or torch.bfloat16"),
    "head_dim_80": (lambda q, k, v: (q[..., :80], k[..., :80], v[..., :80]), NotImplementedError,
                    r"q.shape\[3\] \(head_dim\) = 80: supported head dims are 64, 96, 128, 192 and 256"),
    "head_dim_v": (lambda q, k, v: (q, k, v[..., :64]), NotImplementedError,
                   r"v.shape\[3\] \(head_dim_v\) = 64: expected head_dim \(128\); head_dim_v != head_dim is "
                   r"supported for \(192, 128\) only"),
    "nheads_kv": (lambda q, k, v: (q, k[:, :, :3], v[:, :, :3]), ValueError,
                  r"k.shape\[2\] \(nheads_kv\) = 3: nheads \(4\) must be a multiple of it"),
    "batch": (lambda q, k, v: (q, k[:1], v[:1]), ValueError, r"k.shape\[0\] \(batch\) = 1: expected 2"),
    "seqlen_v": (lambda q, k, v: (q, k, v[:, :7]), ValueError, r"v.shape\[1\] \(seqlen_k\) = 7: expected 33"),
    "rank_q": (lambda q, k, v: (q[0], k, v), ValueError, "q.rank = 3: expected 4"),
    "rank_k": (lambda q, k, v: (q, k[0], v), ValueError, "k.rank = 3: expected 4"),
    "last_dim_strided": (lambda q, k, v: (q, k, torch.cat([v, v], dim=-1)[..., ::2]), ValueError,
                         "v.stride\\[3\\] = 2: expected 1 \\(the last dimension must be contiguous\\)"),
    "unaligned_rows": (lambda q, k, v: (torch.cat([q, q[..., :4]], dim=-1)[..., :128], k, v), ValueError,
                       r"q.stride\[2\] = 132: expected a positive multiple of 8 elements"),
    "broadcast_kv": (lambda q, k, v: (q, k[:, :, :1].expand(-1, -1, 4, -1), v), ValueError,
                     r"k.stride\[2\] = 0: expected a positive multiple of 8 elements"),
}


@requires_hopper
@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input(case):
    make, exception, message = BAD_INPUTS[case]
    with pytest.raises(exception, match=message):
        flashhop.flash_attn_func(*make(*_inputs()))


@requires_hopper
@pytest.mark.parametrize("softmax_scale,message", [
    (-0.5, r"softmax_scale = -0.5: expected a finite value >= 0"),
    (float("nan"), r"softmax_scale = nan: expected a finite value >= 0"),
])
def test_bad_softmax_scale(softmax_scale, message):
    with pytest.raises(ValueError, match=message):
        flashhop.flash_attn_func(*_inputs(), softmax_scale)


@requires_hopper
@pytest.mark.parametrize("window_size,causal,message", [
    ((-2, -1), False, r"window_left = -2: expected -1 \(unbounded\) or a width >= 0"),
    ((4, -3), False, r"window_right = -3: expected -1 \(unbounded\) or a width >= 0"),
    ((-2, 0), True, r"window_left = -2: expected -1 \(unbounded\) or a width >= 0"),
    ((-2**40, 4), False, r"window_left = -1099511627776: expected -1 \(unbounded\) or a width >= 0"),
    ((4, -2**31 - 1), False, r"window_right = -2147483649: expected -1 \(unbounded\) or a width >= 0"),
])
def test_bad_window(window_size, causal, message):
    with pytest.raises(ValueError, match=message):
        flashhop.flash_attn_func(*_inputs(), causal=causal, window_size=window_size)


@requires_hopper
def test_causal_operator_rejects_a_window_to_the_right():
    """flash_attn_func sets the right of the window to 0 with causal, as FlashAttention-3; the
    operator takes the arguments as they are."""
    with pytest.raises(ValueError, match=r"window_right = 4: expected -1 or 0 with causal"):
        torch.ops.flashhop.fwd(*_inputs(), None, True, -1, 4, 0.0)


@requires_hopper
@pytest.mark.parametrize("softcap,message", [
    (-0.5, r"softcap = -0.5: expected a finite value >= 0 \(0: off\)"),
    (-1e-30, r"softcap = -1e-30: expected a finite value >= 0"),
    (float("nan"), r"softcap = nan: expected a finite value >= 0"),
    (float("inf"), r"softcap = inf: expected a finite value >= 0"),
])
def test_bad_softcap(softcap, message):
    with pytest.raises(ValueError, match=message):
        flashhop.flash_attn_func(*_inputs(), softcap=softcap)


@requires_hopper
def test_failed_call_leaves_the_device_usable():
    q, k, v = random_qkv(1, 10, 10, 2, 2, 128)
    with pytest.raises(NotImplementedError):
        flashhop.flash_attn_func(q[..., :80], k[..., :80], v[..., :80])
    flashhop.flash_attn_func(q, k, v)
    torch.cuda.synchronize()
