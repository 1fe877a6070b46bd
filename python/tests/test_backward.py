"""flashhop's gradients against autograd through the float64 reference (helpers.attention_reference),
under FlashAttention's rule: the error may be twice that of the same autograd in the inputs'
precision, plus a unit of that precision times the gradient's size."""
import pytest

torch = pytest.importorskip("torch")

import flashhop  # noqa: E402
from helpers import check_gradients, random_qkv, requires_hopper, skip_unless_built  # noqa: E402

pytestmark = requires_hopper

FEATURES = {
    "full": {},
    "causal": {"causal": True},
    "window61_17": {"window_size": (61, 17)},
    "softcap_causal": {"softcap": 1.5, "causal": True},
}


def _gradients(q, k, v, dout, **options):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = skip_unless_built(flashhop.flash_attn_func, q, k, v, **options)
    out.backward(dout)
    return q.grad, k.grad, v.grad


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("head_dim", [64, 96, 128, 192, 256])
@pytest.mark.parametrize("features", FEATURES)
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(1, 1), (113, 203), (203, 113), (255, 255)])
def test_gradients(seqlen_q, seqlen_k, features, head_dim, dtype):
    q, k, v = random_qkv(2, seqlen_q, seqlen_k, 4, 2, head_dim, dtype=dtype)
    dout = torch.randn(2, seqlen_q, 4, head_dim, device="cuda", dtype=dtype)
    got = _gradients(q, k, v, dout, **FEATURES[features])
    check_gradients(q, k, v, dout, got, **FEATURES[features])


@pytest.mark.parametrize("head_dim", [64, 96, 128, 192, 256])
def test_gradients_from_an_unaligned_output_gradient(head_dim):
    """dout a slice of a wider tensor, its rows off 16-byte boundaries: copied before the kernels."""
    q, k, v = random_qkv(2, 203, 113, 4, 2, head_dim)
    dout = torch.randn(2, 203, 4, head_dim + 1, device="cuda", dtype=q.dtype)[..., :head_dim]
    got = _gradients(q, k, v, dout, causal=True)
    check_gradients(q, k, v, dout, got, causal=True)


def test_deterministic_gradients_are_bitwise_identical():
    q, k, v = random_qkv(2, 500, 700, 8, 2, 128)
    dout = torch.randn_like(q)
    first = _gradients(q, k, v, dout, causal=True, deterministic=True)
    for _ in range(10):
        again = _gradients(q, k, v, dout, causal=True, deterministic=True)
        assert all(torch.equal(a, b) for a, b in zip(first, again))


def test_scaled_dot_product_attention_is_differentiable():
    query, key, value = (t.transpose(1, 2).detach().requires_grad_() for t in random_qkv(2, 100, 100, 4, 4, 64))
    out = skip_unless_built(flashhop.scaled_dot_product_attention, query, key, value, is_causal=True)
    dout = torch.randn_like(out)
    out.backward(dout)
    q, k, v = (t.detach().transpose(1, 2) for t in (query, key, value))
    got = [t.grad.transpose(1, 2) for t in (query, key, value)]
    check_gradients(q, k, v, dout.transpose(1, 2), got, causal=True)
