"""flash_attn_with_kvcache: FlashAttention-3's attention over a KV cache, contiguous or paged. The
argument checks run anywhere; the GPU tests compare each sequence with flash_attn_func over that
sequence's keys gathered from the cache, and skip where the build left the kernel out."""
import pytest

torch = pytest.importorskip("torch")

import flashhop  # noqa: E402
from helpers import requires_hopper, skip_unless_built  # noqa: E402


# ---- arguments, anywhere ----------------------------------------------------------------------

def _cpu_decode():
    q = torch.randn(2, 1, 8, 128, dtype=torch.bfloat16)
    cache = torch.randn(2, 64, 2, 128, dtype=torch.bfloat16)
    return q, cache, cache.clone()


def test_left_padding_of_paged_caches_is_not_supported():
    q, k_cache, v_cache = _cpu_decode()
    with pytest.raises(NotImplementedError, match="cache_leftpad is given with page_table"):
        flashhop.flash_attn_with_kvcache(q, k_cache, v_cache, cache_leftpad=torch.zeros(2, dtype=torch.int32),
                                         page_table=torch.zeros(2, 1, dtype=torch.int32))


@pytest.mark.parametrize("given, message", [
    ({"k": torch.zeros(2, 1, 2, 128)}, "k and v .* come together"),
    ({"rotary_cos": torch.zeros(8, 32)}, "k and v .* come together"),
    ({"rotary_seqlens": torch.zeros(2, dtype=torch.int32)}, "given without k and v"),
])
def test_append_arguments_come_together(given, message):
    q, k_cache, v_cache = _cpu_decode()
    with pytest.raises(ValueError, match=message):
        flashhop.flash_attn_with_kvcache(q, k_cache, v_cache, **given)


@pytest.mark.parametrize("num_splits", [-1, 1.5, True])
def test_num_splits_is_a_non_negative_int(num_splits):
    q, k_cache, v_cache = _cpu_decode()
    with pytest.raises(ValueError, match="num_splits = .*: expected an int >= 0"):
        flashhop.flash_attn_with_kvcache(q, k_cache, v_cache, num_splits=num_splits)


def test_cache_rank_and_batch_are_checked():
    q, k_cache, v_cache = _cpu_decode()
    with pytest.raises(ValueError, match=r"k_cache.rank = 3: expected 4"):
        flashhop.flash_attn_with_kvcache(q, k_cache[0], v_cache)
    with pytest.raises(ValueError, match=r"k_cache.shape\[0\] \(batch_cache\) = 1: expected >= 2"):
        flashhop.flash_attn_with_kvcache(q, k_cache[:1], v_cache[:1])
    with pytest.raises(ValueError, match="cache_batch_idx is given with page_table"):
        flashhop.flash_attn_with_kvcache(q, k_cache, v_cache, page_table=torch.zeros(2, 1, dtype=torch.int32),
                                         cache_batch_idx=torch.zeros(2, dtype=torch.int32))


def test_cpu_tensors_are_rejected():
    q, k_cache, v_cache = _cpu_decode()
    with pytest.raises(ValueError, match="q is on cpu: expected a CUDA tensor"):
        flashhop.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=10)


# ---- against flash_attn_func, on a Hopper GPU ----------------------------------------------------

def _paged(keys, page_size, nheads_kv=2, head_dim=128, dtype=torch.bfloat16):
    """Each sequence's keys and values (keys[b], nheads_kv, head_dim), and the same laid on shuffled
    pages of a cache with a page table; the cache's other slots hold large values."""
    max_pages = max((n + page_size - 1) // page_size for n in keys) + 1
    num_pages = sum((n + page_size - 1) // page_size for n in keys) + 3
    k_cache = torch.full((num_pages, page_size, nheads_kv, head_dim), 100.0, dtype=dtype, device="cuda")
    v_cache = torch.full((num_pages, page_size, nheads_kv, head_dim), 1000.0, dtype=dtype, device="cuda")
    table = torch.full((len(keys), max_pages), -1, dtype=torch.int32, device="cuda")
    order = torch.randperm(num_pages).tolist()
    ks, vs = [], []
    for b, n in enumerate(keys):
        k = torch.randn(n, nheads_kv, head_dim, dtype=dtype, device="cuda")
        v = torch.randn(n, nheads_kv, head_dim, dtype=dtype, device="cuda")
        for j in range(0, n, page_size):
            page = order.pop()
            table[b, j // page_size] = page
            rows = min(page_size, n - j)
            k_cache[page, :rows], v_cache[page, :rows] = k[j:j + rows], v[j:j + rows]
        ks.append(k)
        vs.append(v)
    return ks, vs, k_cache, v_cache, table


def _reference(q, ks, vs, **options):
    """out (batch, seqlen_q, nheads, head_dim) and lse (batch, nheads, seqlen_q), each sequence alone."""
    outs, lses = [], []
    for b in range(q.shape[0]):
        o, lse = flashhop.flash_attn_func(q[b:b + 1], ks[b][None], vs[b][None], return_attn_probs=True, **options)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


@requires_hopper
@pytest.mark.parametrize("page_size", [1, 16, 64, 256])
@pytest.mark.parametrize("options", [{}, {"causal": True}, {"window_size": (100, 0), "softcap": 20.0}])
@pytest.mark.parametrize("seqlen_q", [1, 4])
def test_paged_cache_matches_per_sequence_calls(page_size, options, seqlen_q):
    keys = [1000, 17, 3000, 300]
    ks, vs, k_cache, v_cache, table = _paged(keys, page_size)
    q = torch.randn(len(keys), seqlen_q, 8, 128, dtype=torch.bfloat16, device="cuda")
    cache_seqlens = torch.tensor(keys, dtype=torch.int32, device="cuda")
    out, lse = skip_unless_built(flashhop.flash_attn_with_kvcache, q, k_cache, v_cache, cache_seqlens=cache_seqlens,
                                 page_table=table, return_softmax_lse=True, **options)
    expected_out, expected_lse = _reference(q, ks, vs, **options)
    torch.testing.assert_close(out, expected_out, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(lse, expected_lse, atol=1e-3, rtol=1e-3)


@requires_hopper
@pytest.mark.parametrize("num_splits, pack_gqa", [(1, False), (1, True), (5, True), (3, False), (0, None)])
@pytest.mark.parametrize("causal", [False, True])
def test_splits_and_packed_heads_give_the_same_attention(num_splits, pack_gqa, causal):
    keys = [1000, 17, 3000, 0]
    ks, vs, k_cache, v_cache, table = _paged(keys, 16)
    q = torch.randn(len(keys), 2, 8, 128, dtype=torch.bfloat16, device="cuda")
    cache_seqlens = torch.tensor(keys, dtype=torch.int32, device="cuda")
    out, lse = skip_unless_built(flashhop.flash_attn_with_kvcache, q, k_cache, v_cache, cache_seqlens=cache_seqlens,
                                 page_table=table, causal=causal, num_splits=num_splits, pack_gqa=pack_gqa,
                                 return_softmax_lse=True)
    expected_out, expected_lse = _reference(q[:3], ks[:3], vs[:3], causal=causal)
    torch.testing.assert_close(out[:3], expected_out, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(lse[:3], expected_lse, atol=1e-3, rtol=1e-3)
    assert torch.all(out[3] == 0) and torch.all(lse[3] == float("-inf"))  # no keys


@requires_hopper
def test_num_splits_past_the_limit_is_named():
    q, k_cache, v_cache = (t.cuda() for t in _cpu_decode())
    with pytest.raises(ValueError, match="num_splits = 300: expected 0 .* to 256"):
        flashhop.flash_attn_with_kvcache(q, k_cache, v_cache, num_splits=300)


@requires_hopper
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_combine_merges_splits_as_fa3(out_dtype):
    splits, batch, seqlen, nheads, dv = 6, 2, 5, 4, 128
    out_partial = torch.randn(splits, batch, seqlen, nheads, dv, device="cuda")
    lse_partial = 3 * torch.randn(splits, batch, seqlen, nheads, device="cuda")
    lse_partial[1::2, 0] = float("-inf")  # splits that saw no key
    lse_partial[:, 1, 0] = float("-inf")  # a row that no split saw
    out, lse = flashhop.flash_attn_combine(out_partial, lse_partial, out_dtype=out_dtype)
    expected_lse = torch.logsumexp(lse_partial.double(), dim=0)
    weights = torch.exp(lse_partial.double() - expected_lse).nan_to_num(0.0)
    expected = (weights[..., None] * out_partial.double()).sum(0)
    assert out.shape == (batch, seqlen, nheads, dv) and out.dtype == out_dtype
    assert lse.shape == (batch, seqlen, nheads)
    tolerance = 1e-5 if out_dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out.double(), expected, atol=tolerance, rtol=tolerance)
    torch.testing.assert_close(lse.double(), expected_lse, atol=1e-5, rtol=1e-5)
    # The variable-length layout, and an output given.
    given = torch.empty(batch * seqlen, nheads, dv, device="cuda", dtype=out_dtype)
    out2, _ = flashhop.flash_attn_combine(out_partial.flatten(1, 2), lse_partial.flatten(1, 2), out=given)
    assert out2 is given
    torch.testing.assert_close(out2, out.flatten(0, 1), atol=0, rtol=0)


def test_combine_checks_ranks():
    with pytest.raises(ValueError, match="out_partial.rank = 3"):
        flashhop.flash_attn_combine(torch.zeros(2, 3, 4), torch.zeros(2, 3))


def _rotate(x, cos, sin, positions, interleaved):
    """x (rows, heads, d) rotated at positions (rows,) with the first 2 * cos.shape[1] dims, in float."""
    rotary_dim = 2 * cos.shape[1]
    c, s_ = cos[positions].float()[:, None], sin[positions].float()[:, None]  # (rows, 1, rotary_dim / 2)
    x = x.float()
    head, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    if interleaved:
        x0, x1 = head[..., 0::2], head[..., 1::2]
        rotated = torch.stack([x0 * c - x1 * s_, x0 * s_ + x1 * c], dim=-1).flatten(-2)
    else:
        x0, x1 = head[..., :rotary_dim // 2], head[..., rotary_dim // 2:]
        rotated = torch.cat([x0 * c - x1 * s_, x0 * s_ + x1 * c], dim=-1)
    return torch.cat([rotated, rest], dim=-1)


@requires_hopper
@pytest.mark.parametrize("page_size", [None, 1, 16])
@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_new", [1, 5])
def test_append_with_rotary_matches_appending_and_rotating_first(page_size, interleaved, causal, seqlen_new):
    """The new keys land in the cache rotated, values as they are, nothing else changes; the output
    equals attention over the cache that PyTorch appended to and rotated first."""
    batch, nheads, nheads_kv, d, rotary_dim = 3, 8, 2, 128, 64
    keys = [700, 0, 33]
    capacity = 1024
    if page_size is None:
        k_cache = torch.randn(batch + 1, capacity, nheads_kv, d, dtype=torch.bfloat16, device="cuda")
        v_cache = torch.randn_like(k_cache)
        table = None
        batch_idx = torch.tensor([2, 0, 3], dtype=torch.int32, device="cuda")
        row_of = lambda b, j: (int(batch_idx[b]), j)  # noqa: E731
    else:
        ks, vs, k_cache, v_cache, table = _paged([capacity] * batch, page_size, nheads_kv, d)
        batch_idx = None
        row_of = lambda b, j: (int(table[b, j // page_size]), j % page_size)  # noqa: E731
    k_before, v_before = k_cache.clone(), v_cache.clone()
    q = torch.randn(batch, seqlen_new, nheads, d, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(batch, seqlen_new, nheads_kv, d, dtype=torch.bfloat16, device="cuda")
    v = torch.randn_like(k)
    angles = torch.rand(2048, rotary_dim // 2, device="cuda") * 6.28
    cos, sin = angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16)
    cache_seqlens = torch.tensor(keys, dtype=torch.int32, device="cuda")
    out = skip_unless_built(flashhop.flash_attn_with_kvcache, q, k_cache, v_cache, k=k, v=v, rotary_cos=cos,
                            rotary_sin=sin, cache_seqlens=cache_seqlens, cache_batch_idx=batch_idx, page_table=table,
                            causal=causal, rotary_interleaved=interleaved)
    for b in range(batch):
        positions = torch.arange(keys[b], keys[b] + seqlen_new, device="cuda")
        k_rotated = _rotate(k[b], cos, sin, positions, interleaved).to(torch.bfloat16)
        expected_k, expected_v = [], []
        for j in range(keys[b] + seqlen_new):
            page, row = row_of(b, j)
            if j >= keys[b]:
                torch.testing.assert_close(k_cache[page, row], k_rotated[j - keys[b]], atol=1e-2, rtol=1e-2)
                assert torch.equal(v_cache[page, row], v[b, j - keys[b]])
                k_before[page, row], v_before[page, row] = k_cache[page, row], v_cache[page, row]
            expected_k.append(k_cache[page, row])
            expected_v.append(v_cache[page, row])
        q_positions = positions if causal else torch.full_like(positions, keys[b])
        q_rotated = _rotate(q[b], cos, sin, q_positions, interleaved).to(torch.bfloat16)
        expected = flashhop.flash_attn_func(q_rotated[None], torch.stack(expected_k)[None],
                                            torch.stack(expected_v)[None], causal=causal)
        torch.testing.assert_close(out[b], expected[0], atol=2e-2, rtol=2e-2)
    # Nothing but the new rows changed.
    assert torch.equal(k_cache, k_before) and torch.equal(v_cache, v_before)


@requires_hopper
def test_append_past_the_cache_or_the_tables_is_named_and_writes_nothing():
    k_cache = torch.zeros(2, 64, 2, 128, dtype=torch.bfloat16, device="cuda")
    v_cache = torch.zeros_like(k_cache)
    q = torch.randn(2, 1, 8, 128, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(2, 1, 2, 128, dtype=torch.bfloat16, device="cuda")
    full = torch.tensor([64, 3], dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="cache_seqlens \\+ the new rows reach 65 keys: expected <= 64"):
        flashhop.flash_attn_with_kvcache(q, k_cache, v_cache, k=k, v=k, cache_seqlens=full)
    cos = torch.ones(10, 32, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="rotary_cos.shape\\[0\\] \\(seqlen_ro\\) = 10: expected >= 41"):
        flashhop.flash_attn_with_kvcache(q, k_cache, v_cache, k=k, v=k, rotary_cos=cos, rotary_sin=cos,
                                         cache_seqlens=torch.tensor([40, 3], dtype=torch.int32, device="cuda"))
    assert not k_cache.any() and not v_cache.any()


@requires_hopper
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("append", [False, True])
def test_left_padded_cache(causal, append):
    """Sequence b's keys are rows leftpad[b] .. cache_seqlens[b] of its entry; new rows go after them,
    rotated at their rows' positions."""
    cache_k = torch.randn(3, 512, 2, 128, dtype=torch.bfloat16, device="cuda")
    cache_v = torch.randn_like(cache_k)
    leftpad, ends = [0, 37, 500], [300, 200, 510]
    q = torch.randn(3, 2, 8, 128, dtype=torch.bfloat16, device="cuda")
    options = {}
    if append:
        k, v = (torch.randn(3, 2, 2, 128, dtype=torch.bfloat16, device="cuda") for _ in range(2))
        angles = torch.rand(1024, 32, device="cuda")
        options = dict(k=k, v=v, rotary_cos=angles.cos().bfloat16(), rotary_sin=angles.sin().bfloat16())
    expected_k, expected_v = cache_k.clone(), cache_v.clone()
    out = skip_unless_built(flashhop.flash_attn_with_kvcache, q, cache_k, cache_v,
                            cache_seqlens=torch.tensor(ends, dtype=torch.int32, device="cuda"),
                            cache_leftpad=torch.tensor(leftpad, dtype=torch.int32, device="cuda"), causal=causal,
                            **options)
    for b in range(3):
        end = ends[b] + (2 if append else 0)
        q_b = q[b]
        if append:
            positions = torch.arange(ends[b], ends[b] + 2, device="cuda")
            cos, sin = options["rotary_cos"], options["rotary_sin"]
            expected_k[b, ends[b]:end] = _rotate(k[b], cos, sin, positions, True).bfloat16()
            expected_v[b, ends[b]:end] = v[b]
            q_positions = positions if causal else torch.full_like(positions, ends[b])
            q_b = _rotate(q[b], cos, sin, q_positions, True).bfloat16()
        expected = flashhop.flash_attn_func(q_b[None], expected_k[b:b + 1, leftpad[b]:end],
                                            expected_v[b:b + 1, leftpad[b]:end], causal=causal)
        torch.testing.assert_close(out[b], expected[0], atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(cache_k, expected_k, atol=1e-2, rtol=1e-2)


@requires_hopper
def test_contiguous_cache_with_batch_index():
    cache_k = torch.randn(5, 512, 2, 128, dtype=torch.bfloat16, device="cuda")
    cache_v = torch.randn(5, 512, 2, 128, dtype=torch.bfloat16, device="cuda")
    batch_idx = torch.tensor([3, 0, 4], dtype=torch.int32, device="cuda")
    keys = [500, 1, 512]
    q = torch.randn(3, 2, 8, 128, dtype=torch.bfloat16, device="cuda")
    out = skip_unless_built(flashhop.flash_attn_with_kvcache, q, cache_k, cache_v,
                            cache_seqlens=torch.tensor(keys, dtype=torch.int32, device="cuda"),
                            cache_batch_idx=batch_idx, causal=True)
    ks = [cache_k[int(i), :n] for i, n in zip(batch_idx, keys)]
    vs = [cache_v[int(i), :n] for i, n in zip(batch_idx, keys)]
    expected, _ = _reference(q, ks, vs, causal=True)
    torch.testing.assert_close(out, expected, atol=1e-2, rtol=1e-2)


@requires_hopper
def test_varlen_queries_over_a_paged_cache():
    keys = [40, 700, 5]
    ks, vs, k_cache, v_cache, table = _paged(keys, 16)
    lengths = [3, 16, 0]
    q = torch.randn(sum(lengths), 8, 128, dtype=torch.bfloat16, device="cuda")
    cu = torch.tensor([0, 3, 19, 19], dtype=torch.int32, device="cuda")
    out = skip_unless_built(flashhop.flash_attn_with_kvcache, q, k_cache, v_cache,
                            cache_seqlens=torch.tensor(keys, dtype=torch.int32, device="cuda"), page_table=table,
                            cu_seqlens_q=cu, max_seqlen_q=16, causal=True)
    for b in range(3):
        rows = slice(int(cu[b]), int(cu[b + 1]))
        if lengths[b] == 0:
            continue
        expected = flashhop.flash_attn_func(q[None, rows], ks[b][None], vs[b][None], causal=True)
        torch.testing.assert_close(out[rows], expected[0], atol=1e-2, rtol=1e-2)


@requires_hopper
def test_readme_serving_loop_runs():
    """The README's serving loop, as written: 500 prompt tokens and 32 decode steps per sequence."""
    import pathlib
    readme = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme[readme.index("Serving from a paged KV cache"):]
    code = section[section.index("```python") + len("```python"):section.index("```\n", section.index("```python") + 9)]
    scope = {}
    skip_unless_built(exec, code, scope)
    assert scope["cache_seqlens"].tolist() == [532] * 4
    assert torch.isfinite(scope["out"].float()).all()
