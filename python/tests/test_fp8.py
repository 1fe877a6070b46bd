"""FP8 attention through flash_attn_func (FlashAttention-3's signature: float8_e4m3fn q, k, v with
q_descale, k_descale, v_descale; bfloat16 out). The fake implementation's shapes run anywhere; the
GPU tests compare with attention of the dequantized inputs in float64, under a bound of P's e4m3
rounding (a relative 2^-4 of each probability: |out - ref| <= 2^-4 max |v| per row, plus bfloat16's
rounding of out), and skip where the build left the kernel out. LSE (and the probabilities in out)
also carry the scores' error from the e4m3 wgmma's accumulator, bounded in _score_error."""
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


def _score_error(q64, k64):
    """A bound on the error of any score softmax_scale * q . k computed by e4m3 wgmmas: their float
    accumulator keeps 13 mantissa bits, truncated after each step of 32 products, so each of the
    head_dim / 32 steps drops less than 2^-13 of the running sum, itself at most sum |q_c k_c|."""
    head_dim = q64.shape[-1]
    group = q64.shape[2] // k64.shape[2]
    abs_dots = torch.einsum("bqhd,bkhd->bhqk", q64.abs(), k64.abs().repeat_interleave(group, dim=2))
    return head_dim // 32 * 2 ** -13 * head_dim ** -0.5 * abs_dots.amax().item()


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
    score_error = _score_error(q64, k64)
    bound = (2 ** -4 + 2 * score_error) * v64.abs().amax().item() + 2 ** -8 * expected.abs().amax().item()
    assert (out.double() - expected).abs().max().item() <= bound
    torch.testing.assert_close(lse.double(), expected_lse, atol=1e-3 + score_error, rtol=1e-4)


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


def test_fake_varlen_and_paged_implementations_give_a_bfloat16_out():
    q, k, v, qd, kd, vd = _fp8_inputs(1, 12, 20, 4, 2, 64, device="meta")
    cu = torch.zeros(3, dtype=torch.int32, device="meta")
    out, lse = torch.ops.flashhop.varlen_fwd(q[0], k[0], v[0], cu, cu, None, None, 8, 12, None, True, -1, 0, 0.0,
                                             None, False, qd, kd, vd)
    assert (out.shape, out.dtype, lse.shape) == ((12, 4, 64), torch.bfloat16, (4, 12))
    table = torch.zeros(2, 3, dtype=torch.int32, device="meta")
    used = torch.zeros(2, dtype=torch.int32, device="meta")
    out, _ = torch.ops.flashhop.paged_fwd(q[0], k.view(4, 5, 2, 64), v.view(4, 5, 2, 64), table, cu, used, 8, 15,
                                          None, True, -1, 0, 0.0, None, 0, None, qd, kd, vd)
    assert (out.shape, out.dtype) == ((12, 4, 64), torch.bfloat16)


def _expect_close_to_dequantized(out, q64, k64, v64, causal):
    """out (seqlen_q, nheads, d) of one sequence against float64 attention of its dequantized rows,
    under the bound of the module docstring."""
    expected, _ = attention_reference(q64[None], k64[None], v64[None], causal=causal, dtype=torch.float64)
    bound = 2 ** -4 * v64.abs().amax().item() + 2 ** -8 * expected.abs().amax().item()
    assert (out.double() - expected[0]).abs().max().item() <= bound


@requires_hopper
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_matches_each_sequence_dequantized(causal):
    lengths_q, lengths_k = [1, 130, 0, 300], [200, 130, 5, 257]
    batch, nheads, nheads_kv, d = len(lengths_q), 8, 2, 128
    q, k, v, *_ = _fp8_inputs(1, sum(lengths_q), sum(lengths_k), nheads, nheads_kv, d)
    *_, qd, kd, vd = _fp8_inputs(batch, 1, 1, nheads_kv, nheads_kv, d, seed=1)  # per (sequence, KV head)
    cu_q, cu_k = ([sum(lengths[:b]) for b in range(batch + 1)] for lengths in (lengths_q, lengths_k))
    out = skip_unless_built(flashhop.flash_attn_varlen_func, q[0], k[0], v[0],
                            torch.tensor(cu_q, dtype=torch.int32, device="cuda"),
                            torch.tensor(cu_k, dtype=torch.int32, device="cuda"), max(lengths_q), max(lengths_k),
                            causal=causal, q_descale=qd, k_descale=kd, v_descale=vd)
    assert out.dtype == torch.bfloat16
    for b in range(batch):
        if lengths_q[b] == 0:
            continue
        rows_q, rows_k = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        q64, k64, v64 = (_dequantized(x[:, rows], scale[b:b + 1])[0]
                         for x, rows, scale in ((q, rows_q, qd), (k, rows_k, kd), (v, rows_k, vd)))
        _expect_close_to_dequantized(out[rows_q], q64, k64, v64, causal)


@requires_hopper
def test_kvcache_appends_and_attends_an_fp8_paged_cache():
    batch, nheads, nheads_kv, d, page, max_pages = 3, 8, 2, 128, 16, 8
    cached, new = [20, 0, 100], 2
    q, _, _, qd, kd, vd = _fp8_inputs(batch, 1, 1, nheads, nheads_kv, d)
    _, k_cache, v_cache, *_ = _fp8_inputs(1, batch * max_pages * page, batch * max_pages * page, 1, nheads_kv, d,
                                          seed=2)
    k_cache = k_cache.view(batch * max_pages, page, nheads_kv, d).contiguous()
    v_cache = v_cache.view(batch * max_pages, page, nheads_kv, d).contiguous()
    _, k_new, v_new, *_ = _fp8_inputs(batch, 1, new, 1, nheads_kv, d, seed=3)
    table = torch.randperm(batch * max_pages, generator=torch.Generator().manual_seed(4)).to(torch.int32)
    table = table.view(batch, max_pages).cuda()
    seqlens = torch.tensor(cached, dtype=torch.int32, device="cuda")
    out = skip_unless_built(flashhop.flash_attn_with_kvcache, q, k_cache, v_cache, k=k_new, v=v_new,
                            cache_seqlens=seqlens, page_table=table, causal=True, q_descale=qd, k_descale=kd,
                            v_descale=vd)
    assert out.dtype == torch.bfloat16
    for b in range(batch):
        keys = cached[b] + new
        rows = [table[b, j // page].item() * page + j % page for j in range(keys)]
        k_seq = k_cache.view(-1, nheads_kv, d)[rows]
        v_seq = v_cache.view(-1, nheads_kv, d)[rows]
        assert torch.equal(k_seq[cached[b]:].view(torch.uint8), k_new[b].view(torch.uint8))
        q64, k64, v64 = (_dequantized(x[None], scale[b:b + 1])[0]
                         for x, scale in ((q[b], qd), (k_seq, kd), (v_seq, vd)))
        _expect_close_to_dequantized(out[b], q64, k64, v64, True)


@requires_hopper
def test_kvcache_refuses_rotary_tables_with_an_fp8_cache():
    q, k, v, *_ = _fp8_inputs(1, 1, 32, 2, 2, 128)
    cos = torch.ones(64, 32, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(Exception, match="rotary_cos with k_cache.dtype = float8_e4m3fn"):
        flashhop.flash_attn_with_kvcache(q, k.clone(), v.clone(), k=k[:, :1], v=v[:, :1], rotary_cos=cos,
                                         rotary_sin=cos, cache_seqlens=torch.tensor([4], dtype=torch.int32,
                                                                                    device="cuda"))
