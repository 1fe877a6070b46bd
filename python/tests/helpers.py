"""Shared by the flashhop tests: the GPU requirement, a float64 reference and FlashAttention's
tolerance rule. Imported by the test modules after they have skipped themselves without torch."""
import math

import pytest
import torch

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
requires_hopper = pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU (sm_90) and a CUDA build of PyTorch")


def random_qkv(batch, seqlen_q, seqlen_k, nheads, nheads_kv, head_dim, dtype=torch.bfloat16, head_dim_v=None):
    """Fresh random q, k, v in FlashAttention's layout on the current GPU; v's head dim is
    head_dim_v, by default head_dim."""
    def randn(*shape):
        return torch.randn(*shape, device="cuda", dtype=dtype)
    return (randn(batch, seqlen_q, nheads, head_dim), randn(batch, seqlen_k, nheads_kv, head_dim),
            randn(batch, seqlen_k, nheads_kv, head_dim if head_dim_v is None else head_dim_v))


def visible_keys(seqlen_q, seqlen_k, causal=False, window_size=(-1, -1), top_left=False, device=None):
    """(seqlen_q, seqlen_k) booleans, True where query i sees key j. Query i's diagonal is key
    i + seqlen_k - seqlen_q (aligned to the bottom-right corner), or with top_left key i (as torch's
    scaled_dot_product_attention). causal hides the keys right of the diagonal; the window
    (left, right) those more than left before it or more than right after it, -1 leaving that side
    unbounded."""
    diagonal = torch.arange(seqlen_q, device=device)[:, None] + (0 if top_left else seqlen_k - seqlen_q)
    key = torch.arange(seqlen_k, device=device)[None, :]
    visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    left, right = window_size
    if causal:
        visible &= key <= diagonal
    if left >= 0:
        visible &= key >= diagonal - left
    if right >= 0:
        visible &= key <= diagonal + right
    return visible


def attention_reference(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                        top_left=False, dtype=torch.float64):
    """Plain PyTorch attention in `dtype` over FlashAttention's layout: out (batch, seqlen_q,
    nheads, head_dim_v) in `dtype` and lse (batch, nheads, seqlen_q) in `dtype`, at least float32.
    In float64 it is the reference; in the inputs' dtype it is the same-precision baseline of the
    tolerance rule. The scores are soft-capped with torch.tanh when softcap > 0, then masked where
    visible_keys() is False."""
    seqlen_q, nheads, head_dim = q.shape[1:]
    seqlen_k, nheads_kv = k.shape[1:3]
    scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else softmax_scale
    group = nheads // nheads_kv
    q = q.to(dtype)
    k = k.to(dtype).repeat_interleave(group, dim=2)
    v = v.to(dtype).repeat_interleave(group, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    visible = visible_keys(seqlen_q, seqlen_k, causal, window_size, top_left, q.device)
    scores = scores.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(scores.to(torch.promote_types(dtype, torch.float32)), dim=-1)
    # A row that sees no key: softmax gives NaN, the kernels give 0.
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return torch.einsum("bhqk,bkhd->bqhd", probs, v), lse


def _assert_within(name, got, expected, reference, baseline, abs_term):
    """max |got - expected| <= 2 max |baseline - reference| + abs_term, with -inf where the
    reference has -inf and no NaN anywhere."""
    got, expected, reference, baseline = got.double(), expected.double(), reference.double(), baseline.double()
    assert got.shape == reference.shape, f"{name}: shape {tuple(got.shape)}, expected {tuple(reference.shape)}"
    assert not got.isnan().any(), f"{name}: NaN in the result"
    infinite = reference.isinf()
    assert torch.equal(got.isinf(), infinite), f"{name}: -inf at other positions than in the reference"
    if infinite.all():
        return
    error = (got - expected)[~infinite].abs().max().item()
    baseline_error = (baseline - reference)[~infinite].abs().max().item()
    assert error <= 2 * baseline_error + abs_term, (
        f"{name}: max error {error:.3g} > 2 x {baseline_error:.3g} (same-precision PyTorch) + {abs_term:.3g}")


def assert_matches_reference(out, lse, q, k, v, softcap=0.0, expected=None, **options):
    """FlashAttention's rule: flashhop's error against the float64 reference is at most twice that
    of plain attention in the inputs' precision, plus one unit of that precision (out) or a small
    fp32 term (lse). Soft-capping adds the error of the kernels' tanh (tanh.approx.f32, relative
    error below 2^-10.987), which moves a capped score by up to about softcap * 2^-11: that much
    to lse, and through the softmax weights twice that times max |v| to out.
    expected: another result (out, lse) of the same call, to be matched within that same bound
    instead of the reference."""
    out_ref, lse_ref = attention_reference(q, k, v, softcap=softcap, **options)
    out_base, lse_base = attention_reference(q, k, v, softcap=softcap, dtype=q.dtype, **options)
    out_expected, lse_expected = (out_ref, lse_ref) if expected is None else expected
    score_error = softcap * 2**-11
    max_abs_v = v.abs().max().item() if v.numel() else 0.0
    _assert_within("out", out, out_expected, out_ref, out_base, torch.finfo(q.dtype).eps + 2 * score_error * max_abs_v)
    if lse is not None:
        _assert_within("lse", lse, lse_expected, lse_ref, lse_base, 1e-4 + score_error)


def reference_gradients(q, k, v, dout, dtype, **options):
    """dq, dk, dv in `dtype`: autograd through attention_reference in that dtype."""
    inputs = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    out, _ = attention_reference(*inputs, dtype=dtype, **options)
    out.backward(dout.to(dtype))
    return [t.grad for t in inputs]


def check_gradients(q, k, v, dout, got, **options):
    """got = (dq, dk, dv) under FlashAttention's rule: the error against the float64 reference at most
    twice that of the same autograd in the inputs' precision, plus a unit of that precision times the
    gradient's size."""
    reference = reference_gradients(q, k, v, dout, torch.float64, **options)
    baseline = reference_gradients(q, k, v, dout, q.dtype, **options)
    unit = torch.finfo(q.dtype).eps
    for name, g, ref, base in zip(("dq", "dk", "dv"), got, reference, baseline):
        assert g.shape == ref.shape and g.dtype == q.dtype, name
        assert not g.isnan().any(), f"{name}: NaN"
        error = (g.double() - ref).abs().max().item() if ref.numel() else 0.0
        base_error = (base.double() - ref).abs().max().item() if ref.numel() else 0.0
        bound = 2 * base_error + unit * max(1.0, ref.abs().max().item() if ref.numel() else 0.0)
        assert error <= bound, f"{name}: max error {error:.3g} > 2 x {base_error:.3g} + {bound - 2 * base_error:.3g}"


def skip_unless_built(call, *args, **kwargs):
    """call(*args, **kwargs), skipping the test when the installed build left out the kernel it
    needs (FLASHHOP_DTYPES / FLASHHOP_HEAD_DIMS)."""
    try:
        return call(*args, **kwargs)
    except NotImplementedError as error:
        if "not compiled into this build" in str(error):
            pytest.skip(str(error))
        raise
