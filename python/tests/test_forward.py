"""flashhop's results against an fp32 reference: odd shapes, GQA, causal, dtypes, head dims,
strided inputs, and the scaled_dot_product_attention layout."""
import pytest

torch = pytest.importorskip("torch")

import flashhop  # noqa: E402
from helpers import assert_matches_reference, random_qkv, requires_hopper, skip_unless_built  # noqa: E402

pytestmark = requires_hopper

# (seqlen_q, seqlen_k): single rows, partial tiles around the 128-row tile, many tiles,
# seqlen_q != seqlen_k both ways, and empty sequences.
SEQLENS = [(1, 1), (7, 7), (113, 113), (127, 127), (128, 128), (129, 129), (1000, 1000), (127, 129), (129, 127),
           (113, 203), (203, 113), (1, 1000), (1000, 1), (0, 7), (7, 0), (0, 0)]
DTYPES = [torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen_q,seqlen_k", SEQLENS)
def test_matches_reference(seqlen_q, seqlen_k, causal, head_dim, dtype):
    q, k, v = random_qkv(2, seqlen_q, seqlen_k, 4, 2, head_dim, dtype)
    out, lse = skip_unless_built(flashhop.flash_attn_func, q, k, v, causal=causal, return_attn_probs=True)
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert_matches_reference(out, lse, q, k, v, causal=causal)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_long_sequence(causal):
    q, k, v = random_qkv(1, 4097, 4097, 2, 1, 128)
    out, lse = skip_unless_built(flashhop.flash_attn_func, q, k, v, causal=causal, return_attn_probs=True)
    assert_matches_reference(out, lse, q, k, v, causal=causal)


@pytest.mark.parametrize("nheads,nheads_kv", [(8, 8), (8, 2), (6, 3), (8, 1)])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(256, 256), (113, 203), (203, 113)])
def test_grouped_query_attention(seqlen_q, seqlen_k, causal, nheads, nheads_kv):
    q, k, v = random_qkv(3, seqlen_q, seqlen_k, nheads, nheads_kv, 128)
    out, lse = skip_unless_built(flashhop.flash_attn_func, q, k, v, causal=causal, return_attn_probs=True)
    assert_matches_reference(out, lse, q, k, v, causal=causal)


@pytest.mark.parametrize("softmax_scale", [0.01, 0.3, 1.0])
def test_softmax_scale(softmax_scale):
    q, k, v = random_qkv(2, 150, 150, 4, 4, 128)
    out, lse = skip_unless_built(flashhop.flash_attn_func, q, k, v, softmax_scale, return_attn_probs=True)
    assert_matches_reference(out, lse, q, k, v, softmax_scale=softmax_scale)


def test_causal_window_is_causal():
    q, k, v = random_qkv(2, 100, 180, 4, 4, 128)
    causal = skip_unless_built(flashhop.flash_attn_func, q, k, v, causal=True)
    assert torch.equal(flashhop.flash_attn_func(q, k, v, window_size=(-1, 0)), causal)


def _strided_inputs(layout, batch, seqlen, nheads, head_dim):
    """q, k, v as views with one kind of stride that the kernels accept."""
    def randn(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
    if layout == "packed_qkv":  # row stride 3 * nheads * head_dim
        return randn(batch, seqlen, 3, nheads, head_dim).unbind(2)
    if layout == "bhsd_transposed":
        return tuple(randn(batch, nheads, seqlen, head_dim).transpose(1, 2) for _ in range(3))
    if layout == "padded_rows":  # a storage offset and padding after each row
        return tuple(randn(batch, seqlen, nheads, head_dim + 64)[..., 64:] for _ in range(3))
    big = randn(batch + 1, seqlen + 5, 2 * nheads, head_dim)  # head strides, offsets in every dimension
    return big[1:, 3:3 + seqlen, ::2], big[:-1, 5:, 1::2], big[1:, :seqlen, :nheads]


@pytest.mark.parametrize("layout", ["packed_qkv", "bhsd_transposed", "padded_rows", "sliced"])
def test_strided_inputs(layout):
    q, k, v = _strided_inputs(layout, 2, 177, 4, 128)
    assert not q.is_contiguous()
    out, lse = skip_unless_built(flashhop.flash_attn_func, q, k, v, causal=True, return_attn_probs=True)
    assert out.is_contiguous()
    assert_matches_reference(out, lse, q, k, v, causal=True)
    contiguous_out = flashhop.flash_attn_func(q.contiguous(), k.contiguous(), v.contiguous(), causal=True)
    assert torch.equal(out, contiguous_out)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(113, 113), (64, 200), (200, 64)])
@pytest.mark.parametrize("nheads_kv", [8, 2])
def test_scaled_dot_product_attention_layout(seqlen_q, seqlen_k, is_causal, nheads_kv):
    query, key, value = (t.transpose(1, 2) for t in random_qkv(2, seqlen_q, seqlen_k, 8, nheads_kv, 128))
    out = skip_unless_built(flashhop.scaled_dot_product_attention, query, key, value, is_causal=is_causal,
                            enable_gqa=nheads_kv != 8)
    assert out.shape == query.shape
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    assert_matches_reference(out.transpose(1, 2), None, q, k, v, causal=is_causal, top_left=True)
