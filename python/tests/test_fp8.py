"""FP8 attention through flash_attn_func (FlashAttention-3's signature: float8_e4m3fn q, k, v with
q_descale, k_descale, v_descale; bfloat16 out). The fake implementation's shapes run anywhere; the
GPU tests compare with attention of the dequantized inputs in float64, under a bound of P's e4m3
rounding (a relative 2^-4 of each probability: |out - ref| <= 2^-4 max |v| per row, plus bfloat16's
rounding of out), and skip where the build left the kernel out."""
import pytest

torch = pytest.importorskip("torch")

import flashhop  # noqa: E402
from helpers import attention_reference, requires_hopper, skip_unless_built  # noqa: E402

E4M3 = torch.float8_e4m3fn


def _fp8_inputs(batch, seqlen_q, seqlen_k, nheads, nheads_kv, head_dim, device="cuda", seed=0):
    """e4m3 q, k, v (16 x a standard normal, rounded) and float32 (batch, nheads_kv) descales in
    [0.02, 0.1], so that the dequantized inputs are of order one."""
    generator = torch.Generator(device="cpu").manual_seed(seed)

    def e4m3(*shape):
        return (16 * torch.randn(*shape, generator=generator)).to(E4M3).to(device)

    def descale():
        return (0.02 + 0.08 * torch.rand(batch, nheads_kv, generator=generator)).to(device)
    q = e4m3(batch, seqlen_q, nheads, head_dim)
    k = e4m3(batch, seqlen_k, nheads_kv, head_dim)
    v = e4m3(batch, seqlen_k, nheads_kv, head_dim)
    return q, k, v, descale(), descale(), descale()


def _dequantized(x, descale):
    """x (batch, seqlen, heads, d) times its (batch, KV head)'s descale, in float64."""
    group = x.shape[2] // descale.shape[1]
    return x.double() * descale.double().repeat_interleave(group, dim=1)[:, None, :, None]


def test_fake_implementation_gives_a_bfloat16_out():
    q, k, v, qd, kd, vd = _fp8_inputs(2, 5, 7, 4, 2, 64, device="meta")
    out, lse = torch.ops.flashhop.fwd(q, k, v, None, True, -1, 0, 0.0, None, False, qd, kd, vd)
    assert (out.shape, out.dtype) == ((2, 5, 4, 64), torch.bfloat16)
    assert (lse.shape, lse.dtype) == ((2, 4, 5), torch.float32)


@requires_hopper
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_matches_attention_of_the_dequantized_inputs(causal, head_dim):
    q, k, v, qd, kd, vd = _fp8_inputs(2, 300, 500, 8, 2, head_dim)
    out, lse = skip_unless_built(flashhop.flash_attn_func, q, k, v, causal=causal, q_descale=qd, k_descale=kd,
                                 v_descale=vd, return_attn_probs=True)
    assert out.dtype == torch.bfloat16
    q64, k64, v64 = _dequantized(q, qd), _dequantized(k, kd), _dequantized(v, vd)
    expected, expected_lse = attention_reference(q64, k64, v64, causal=causal, dtype=torch.float64)
    bound = 2 ** -4 * v64.abs().amax().item() + 2 ** -8 * expected.abs().amax().item()
    assert (out.double() - expected).abs().max().item() <= bound
    torch.testing.assert_close(lse.double(), expected_lse, atol=1e-3, rtol=1e-4)


@requires_hopper
def test_no_descales_mean_one():
    q, k, v, *_ = _fp8_inputs(1, 128, 128, 2, 2, 128)
    out = skip_unless_built(flashhop.flash_attn_func, q, k, v)
    expected, _ = attention_reference(q.double(), k.double(), v.double(), dtype=torch.float64)
    bound = 2 ** -4 * v.double().abs().amax().item() + 2 ** -8 * expected.abs().amax().item()
    assert (out.double() - expected).abs().max().item() <= bound


@requires_hopper
def test_has_no_backward():
    q, k, v, *_ = _fp8_inputs(1, 64, 64, 2, 2, 128)
    q = q.requires_grad_() if q.dtype.is_floating_point else q
    out = skip_unless_built(flashhop.flash_attn_func, q, k, v)
    with pytest.raises((NotImplementedError, RuntimeError)):
        out.float().sum().backward()
