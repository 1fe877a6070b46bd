"""flashhop's results against a float64 reference: odd shapes, GQA, packed GQA, causal masks,
sliding windows, soft-capping, dtypes, head dims, strided inputs, and the scaled_dot_product_attention
layout."""
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
# (head_dim, head_dim_v): every pair the kernels are written for.
HEAD_DIMS = [(64, 64), (96, 96), (128, 128), (192, 192), (192, 128), (256, 256)]
HEAD_DIM_IDS = ["64", "96", "128", "192", "192x128", "256"]

# flash_attn_func's mask arguments: windows bounded on both sides, on the left only (with and
# without causal), on the right only, and the forms that equal causal. With causal, FlashAttention-3
# ignores window_size[1]: (5, 40) with causal is the window (5, 0).
WINDOWS = {
    "window16_16": {"window_size": (16, 16)},
    "diagonal": {"window_size": (0, 0)},
    "window200_7": {"window_size": (200, 7)},
    "left33": {"window_size": (33, -1)},
    "left33_causal": {"window_size": (33, -1), "causal": True},
    "left33_right0": {"window_size": (33, 0)},
    "right20": {"window_size": (-1, 20)},
    "right0": {"window_size": (-1, 0)},
    "window5_40_causal": {"window_size": (5, 40), "causal": True},
}

# (softcap, softmax_scale): with the default scale the scores are about unit size, so a cap of 1
# bends most of them and one of 30 almost none; with scale 1 they reach about 50.
SOFTCAPS = [(1.0, None), (30.0, None), (5.0, 1.0), (50.0, 1.0)]

# Each kind of mask and soft-capping, for the tests that sweep other dimensions.
FEATURES = {
    "full": {},
    "causal": {"causal": True},
    "window61_17": {"window_size": (61, 17)},
    "left33_causal": {"window_size": (33, -1), "causal": True},
    "right20": {"window_size": (-1, 20)},
    "softcap": {"softcap": 1.5},
    "softcap_causal": {"softcap": 1.5, "causal": True},
    "softcap_window61_17": {"softcap": 1.5, "window_size": (61, 17)},
}


def _run(q, k, v, softmax_scale=None, **options):
    """flashhop's out and lse, skipping the test when the build lacks the kernel."""
    return skip_unless_built(flashhop.flash_attn_func, q, k, v, softmax_scale, return_attn_probs=True, **options)


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("head_dim,head_dim_v", HEAD_DIMS, ids=HEAD_DIM_IDS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen_q,seqlen_k", SEQLENS)
def test_matches_reference(seqlen_q, seqlen_k, causal, head_dim, head_dim_v, dtype):
    q, k, v = random_qkv(2, seqlen_q, seqlen_k, 4, 2, head_dim, dtype, head_dim_v)
    out, lse = _run(q, k, v, causal=causal)
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert_matches_reference(out, lse, q, k, v, causal=causal)


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("seqlen_q,seqlen_k", SEQLENS)
def test_sliding_window(seqlen_q, seqlen_k, window, dtype):
    q, k, v = random_qkv(2, seqlen_q, seqlen_k, 4, 2, 128, dtype)
    out, lse = _run(q, k, v, **WINDOWS[window])
    assert_matches_reference(out, lse, q, k, v, **WINDOWS[window])


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("mask", ["full", "causal", "window61_17", "left33_causal"])
@pytest.mark.parametrize("softcap,softmax_scale", SOFTCAPS)
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(1, 1), (7, 7), (113, 113), (129, 127), (113, 203), (203, 113),
                                               (1000, 1000), (1, 1000), (7, 0)])
def test_softcap(seqlen_q, seqlen_k, softcap, softmax_scale, mask, dtype):
    q, k, v = random_qkv(2, seqlen_q, seqlen_k, 4, 2, 128, dtype)
    out, lse = _run(q, k, v, softmax_scale, softcap=softcap, **FEATURES[mask])
    assert_matches_reference(out, lse, q, k, v, softmax_scale=softmax_scale, softcap=softcap, **FEATURES[mask])


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("head_dim,head_dim_v", HEAD_DIMS, ids=HEAD_DIM_IDS)
@pytest.mark.parametrize("features", FEATURES)
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(113, 203), (203, 113), (257, 257)])
def test_head_dims(seqlen_q, seqlen_k, features, head_dim, head_dim_v, dtype):
    q, k, v = random_qkv(2, seqlen_q, seqlen_k, 4, 2, head_dim, dtype, head_dim_v)
    out, lse = _run(q, k, v, **FEATURES[features])
    assert out.shape == (2, seqlen_q, 4, head_dim_v)
    assert_matches_reference(out, lse, q, k, v, **FEATURES[features])


@pytest.mark.parametrize("features", ["full", "causal", "window61_17", "softcap_causal"])
def test_long_sequence(features):
    q, k, v = random_qkv(1, 4097, 4097, 2, 1, 128)
    out, lse = _run(q, k, v, **FEATURES[features])
    assert_matches_reference(out, lse, q, k, v, **FEATURES[features])


def test_long_sequence_wide_window():
    """Many key tiles between the two edges of the band, seqlen_q != seqlen_k, soft-capping."""
    q, k, v = random_qkv(1, 3001, 4097, 2, 1, 128)
    options = {"window_size": (1500, 300), "softcap": 10.0}
    out, lse = _run(q, k, v, **options)
    assert_matches_reference(out, lse, q, k, v, **options)


@pytest.mark.parametrize("nheads,nheads_kv", [(8, 8), (8, 2), (6, 3), (8, 1)])
@pytest.mark.parametrize("features", ["full", "causal", "window61_17", "left33_causal", "softcap_window61_17"])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(256, 256), (113, 203), (203, 113)])
def test_grouped_query_attention(seqlen_q, seqlen_k, features, nheads, nheads_kv):
    q, k, v = random_qkv(3, seqlen_q, seqlen_k, nheads, nheads_kv, 128)
    out, lse = _run(q, k, v, **FEATURES[features])
    assert_matches_reference(out, lse, q, k, v, **FEATURES[features])


# pack_gqa: the query heads of a KV group packed into the rows of one query tile. Short seqlen_q, where
# packing pays (auto packs), with packed rows from 3 to 616 (not multiples of 128), and seqlen_k from 1
# (most rows see no key under causal) to several key tiles.
PACK_GQA = [None, True, False]
PACK_GQA_IDS = ["auto", "on", "off"]
PACK_GQA_HEADS = [(8, 1), (12, 3), (6, 2)]


@pytest.mark.parametrize("pack_gqa", PACK_GQA, ids=PACK_GQA_IDS)
@pytest.mark.parametrize("nheads,nheads_kv", PACK_GQA_HEADS)
@pytest.mark.parametrize("features", ["causal", "window61_17", "softcap_causal"])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(1, 1000), (5, 300), (77, 1), (77, 1000)])
def test_pack_gqa(seqlen_q, seqlen_k, features, nheads, nheads_kv, pack_gqa):
    q, k, v = random_qkv(2, seqlen_q, seqlen_k, nheads, nheads_kv, 128)
    out, lse = _run(q, k, v, pack_gqa=pack_gqa, **FEATURES[features])
    assert_matches_reference(out, lse, q, k, v, **FEATURES[features])


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("head_dim,head_dim_v", HEAD_DIMS, ids=HEAD_DIM_IDS)
@pytest.mark.parametrize("features", ["full", "softcap_window61_17"])
def test_pack_gqa_head_dims(features, head_dim, head_dim_v, dtype):
    """Every packed kernel: each dtype and head dim, without a mask and with one."""
    q, k, v = random_qkv(2, 77, 300, 12, 3, head_dim, dtype, head_dim_v)
    out, lse = _run(q, k, v, pack_gqa=True, **FEATURES[features])
    assert_matches_reference(out, lse, q, k, v, **FEATURES[features])


@pytest.mark.parametrize("nheads,nheads_kv", PACK_GQA_HEADS)
@pytest.mark.parametrize("features", ["causal", "softcap_window61_17"])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(5, 1000), (77, 300)])
def test_pack_gqa_on_equals_off(seqlen_q, seqlen_k, features, nheads, nheads_kv):
    """Packed and unpacked results differ by no more than the tolerance lets either miss the reference."""
    q, k, v = random_qkv(2, seqlen_q, seqlen_k, nheads, nheads_kv, 128)
    on = _run(q, k, v, pack_gqa=True, **FEATURES[features])
    off = _run(q, k, v, pack_gqa=False, **FEATURES[features])
    assert_matches_reference(*on, q, k, v, expected=off, **FEATURES[features])


@pytest.mark.parametrize("softmax_scale", [0.0, 0.01, 0.3, 1.0])
def test_softmax_scale(softmax_scale):
    q, k, v = random_qkv(2, 150, 150, 4, 4, 128)
    out, lse = _run(q, k, v, softmax_scale)
    assert_matches_reference(out, lse, q, k, v, softmax_scale=softmax_scale)


def test_causal_window_is_causal():
    q, k, v = random_qkv(2, 100, 180, 4, 4, 128)
    causal = skip_unless_built(flashhop.flash_attn_func, q, k, v, causal=True)
    assert torch.equal(flashhop.flash_attn_func(q, k, v, window_size=(-1, 0)), causal)


def test_causal_sets_the_right_of_the_window_to_0():
    q, k, v = random_qkv(2, 100, 180, 4, 4, 128)
    window = skip_unless_built(flashhop.flash_attn_func, q, k, v, window_size=(30, 0))
    assert torch.equal(flashhop.flash_attn_func(q, k, v, causal=True, window_size=(30, 45)), window)
    assert torch.equal(flashhop.flash_attn_func(q, k, v, causal=True, window_size=(30, -1)), window)


@pytest.mark.parametrize("seqlen_q,seqlen_k", [(100, 180), (180, 100)])
def test_window_past_the_sequences_is_no_window(seqlen_q, seqlen_k):
    """A side that reaches past every key is unbounded; widths past int32 included."""
    q, k, v = random_qkv(2, seqlen_q, seqlen_k, 4, 4, 128)
    full = skip_unless_built(flashhop.flash_attn_func, q, k, v)
    for window_size in [(seqlen_k - 1, seqlen_q - 1), (seqlen_k + 5, 2**40), (2**31, 2**31 - 1)]:
        assert torch.equal(flashhop.flash_attn_func(q, k, v, window_size=window_size), full), window_size
    causal = flashhop.flash_attn_func(q, k, v, causal=True)
    assert torch.equal(flashhop.flash_attn_func(q, k, v, causal=True, window_size=(2**40, -1)), causal)


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


@pytest.mark.parametrize("features", ["causal", "softcap_window61_17"])
@pytest.mark.parametrize("layout", ["packed_qkv", "bhsd_transposed", "padded_rows", "sliced"])
def test_strided_inputs(layout, features):
    q, k, v = _strided_inputs(layout, 2, 177, 4, 128)
    assert not q.is_contiguous()
    out, lse = _run(q, k, v, **FEATURES[features])
    assert out.is_contiguous()
    assert_matches_reference(out, lse, q, k, v, **FEATURES[features])
    contiguous_out = flashhop.flash_attn_func(q.contiguous(), k.contiguous(), v.contiguous(), **FEATURES[features])
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


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_batch_zero_gives_empty_outputs(is_causal):
    query, key, value = (t.transpose(1, 2) for t in random_qkv(0, 33, 65, 8, 2, 128))
    out = skip_unless_built(flashhop.scaled_dot_product_attention, query, key, value, is_causal=is_causal,
                            enable_gqa=True)
    assert out.shape == query.shape
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    out, lse = flashhop.flash_attn_func(q, k, v, causal=is_causal, return_attn_probs=True)
    assert out.shape == q.shape and lse.shape == (0, 8, 33)
