"""flashhop.sdpa_override(): which torch.nn.functional.scaled_dot_product_attention calls go to
flashhop, that the others reach torch unchanged, and that torch's function comes back."""
import pytest

torch = pytest.importorskip("torch")

import flashhop  # noqa: E402
from flashhop import interface  # noqa: E402
from helpers import requires_hopper, skip_unless_built  # noqa: E402

F = torch.nn.functional
TORCH_SDPA = F.scaled_dot_product_attention


@pytest.fixture
def routed_calls(monkeypatch):
    """The calls that the override hands to flashhop, recorded (their keyword arguments) on their
    way through."""
    calls = []

    def recording(*args, **kwargs):
        calls.append(kwargs)
        return flashhop.scaled_dot_product_attention(*args, **kwargs)

    monkeypatch.setattr(interface, "scaled_dot_product_attention", recording)
    return calls


def _qkv(device, dtype=torch.bfloat16, nheads=4, nheads_kv=4, seqlen_q=40, seqlen_k=40, head_dim=64):
    """q, k, v in torch's layout (batch, nheads, seqlen, head_dim)."""
    return (torch.randn(2, nheads, seqlen_q, head_dim, device=device, dtype=dtype),
            torch.randn(2, nheads_kv, seqlen_k, head_dim, device=device, dtype=dtype),
            torch.randn(2, nheads_kv, seqlen_k, head_dim, device=device, dtype=dtype))


def test_restores_torch_function_on_exit_and_on_exception():
    with flashhop.sdpa_override():
        assert F.scaled_dot_product_attention is not TORCH_SDPA
    assert F.scaled_dot_product_attention is TORCH_SDPA
    with pytest.raises(KeyError):
        with flashhop.sdpa_override():
            raise KeyError("inside the block")
    assert F.scaled_dot_product_attention is TORCH_SDPA


def test_nested_blocks_restore_in_order():
    with flashhop.sdpa_override():
        outer = F.scaled_dot_product_attention
        with flashhop.sdpa_override():
            assert F.scaled_dot_product_attention not in (outer, TORCH_SDPA)
        assert F.scaled_dot_product_attention is outer
    assert F.scaled_dot_product_attention is TORCH_SDPA


def test_cpu_calls_go_to_torch(routed_calls):
    q, k, v = _qkv("cpu")
    mask = torch.rand(40, 40) > 0.3
    calls = [((q, k, v), {}), ((q, k, v), dict(is_causal=True, scale=0.3)), ((q, k, v), dict(attn_mask=mask)),
             ((q, k[:, :2], v[:, :2]), dict(enable_gqa=True))]
    with flashhop.sdpa_override():
        with flashhop.sdpa_override():
            got = [F.scaled_dot_product_attention(*inputs, **options) for inputs, options in calls]
    assert routed_calls == []
    for g, (inputs, options) in zip(got, calls):
        assert torch.equal(g, TORCH_SDPA(*inputs, **options))


def test_torch_errors_reach_the_caller():
    q, k, v = _qkv("cpu", nheads_kv=2)
    with flashhop.sdpa_override(), pytest.raises(RuntimeError):
        F.scaled_dot_product_attention(q, k, v)  # 4 query heads, 2 KV heads, no enable_gqa


@requires_hopper
@pytest.mark.parametrize("case", ["full", "causal", "causal_longer_q", "gqa", "scale"])
def test_supported_calls_go_to_flashhop(routed_calls, case):
    shapes = {"causal_longer_q": dict(seqlen_q=70, seqlen_k=40), "gqa": dict(nheads=8, nheads_kv=2)}
    options = {"causal": dict(is_causal=True), "causal_longer_q": dict(is_causal=True),
               "gqa": dict(enable_gqa=True, is_causal=True), "scale": dict(scale=0.05)}
    q, k, v = _qkv("cuda", **shapes.get(case, {}))
    skip_unless_built(flashhop.flash_attn_func, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    with flashhop.sdpa_override():
        got = F.scaled_dot_product_attention(q, k, v, **options.get(case, {}))
    assert len(routed_calls) == 1
    expected = TORCH_SDPA(q.float(), k.float(), v.float(), **options.get(case, {}))
    torch.testing.assert_close(got.float(), expected, atol=2e-2, rtol=2e-2)


@requires_hopper
def test_gradients_through_a_routed_call(routed_calls):
    q, k, v = (t.requires_grad_() for t in _qkv("cuda"))
    skip_unless_built(flashhop.flash_attn_func, *(t.detach().transpose(1, 2) for t in (q, k, v)))
    with flashhop.sdpa_override():
        F.scaled_dot_product_attention(q, k, v, is_causal=True).float().square().sum().backward()
    got = [t.grad for t in (q, k, v)]
    inputs = [t.detach().float().requires_grad_() for t in (q, k, v)]
    TORCH_SDPA(*inputs, is_causal=True).square().sum().backward()
    assert len(routed_calls) == 1
    for g, t in zip(got, inputs):
        torch.testing.assert_close(g.float(), t.grad, atol=5e-2, rtol=5e-2)


@requires_hopper
@pytest.mark.parametrize("case", ["mask", "dropout", "float32", "head_dim_80", "rank_3"])
def test_unsupported_calls_go_to_torch(routed_calls, case):
    q, k, v = _qkv("cuda", dtype=torch.float32 if case == "float32" else torch.bfloat16,
                   head_dim={"head_dim_80": 80}.get(case, 64))
    options = {"mask": dict(attn_mask=torch.ones(40, 40, dtype=torch.bool, device="cuda")),
               "dropout": dict(dropout_p=0.5)}.get(case, {})
    if case == "rank_3":
        q, k, v = q[0], k[0], v[0]
    with flashhop.sdpa_override():
        F.scaled_dot_product_attention(q, k, v, **options)
    assert routed_calls == []
