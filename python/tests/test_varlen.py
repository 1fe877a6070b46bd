"""flash_attn_varlen_func: FlashAttention-3's variable-length forward and its gradients. Its argument
checks and the fake implementations' shapes run anywhere; the GPU tests compare each sequence of a
packed batch with flash_attn_func over that sequence alone (the gradients with the float64
reference), and skip where the build left the kernel out."""
import re

import pytest

torch = pytest.importorskip("torch")

import flashhop  # noqa: E402
from helpers import check_gradients, requires_hopper, skip_unless_built  # noqa: E402


def _packed(lengths_q, lengths_k, nheads=8, nheads_kv=2, head_dim=128, head_dim_v=None, device="cuda",
            dtype=torch.bfloat16):
    """Random packed q (total_q, nheads, head_dim), k and v (total_k, nheads_kv, head_dim[_v]) and the
    int32 cu_seqlens of the lengths."""
    def cumulative(lengths):
        return torch.tensor([0] + lengths, dtype=torch.int32, device=device).cumsum(0, dtype=torch.int32)

    def randn(*shape):
        return torch.randn(*shape, device=device, dtype=dtype)
    total_q, total_k = sum(lengths_q), sum(lengths_k)
    q = randn(total_q, nheads, head_dim)
    k = randn(total_k, nheads_kv, head_dim)
    v = randn(total_k, nheads_kv, head_dim if head_dim_v is None else head_dim_v)
    return q, k, v, cumulative(lengths_q), cumulative(lengths_k)


def _meta_inputs(head_dim_v=128):
    """Three sequences on the meta device: q (10, 8, 192), k and v (30, 2, 192 / head_dim_v)."""
    q, k, v, cu_q, cu_k = _packed([2, 3, 5], [10, 10, 10], head_dim=192, head_dim_v=head_dim_v, device="meta")
    return q, k, v, cu_q, cu_k


# ---- arguments, anywhere ----------------------------------------------------------------------

def _cpu_inputs():
    return _packed([3, 5], [4, 6], device="cpu")


@pytest.mark.parametrize("window_size", [(8,), (1, 2, 3)])
def test_window_size_is_a_pair(window_size):
    q, k, v, cu_q, cu_k = _cpu_inputs()
    with pytest.raises(ValueError, match=r"window_size = \(.*\): expected \(left, right\)"):
        flashhop.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 6, window_size=window_size)


@pytest.mark.parametrize("name, value", [("max_seqlen_q", -1), ("max_seqlen_k", -5), ("max_seqlen_q", 2.5),
                                         ("max_seqlen_k", True), ("max_seqlen_q", None)])
def test_max_seqlen_is_a_non_negative_int(name, value):
    q, k, v, cu_q, cu_k = _cpu_inputs()
    bounds = {"max_seqlen_q": 5, "max_seqlen_k": 6, name: value}
    with pytest.raises(ValueError, match=rf"{name} = {value!r}: expected an int >= 0"):
        flashhop.flash_attn_varlen_func(q, k, v, cu_q, cu_k, **bounds)


@pytest.mark.parametrize("name", ["cu_seqlens_q", "cu_seqlens_k"])
def test_cu_seqlens_are_tensors(name):
    q, k, v, cu_q, cu_k = _cpu_inputs()
    cu = {"cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k, name: [0, 3, 8]}
    with pytest.raises(ValueError, match=rf"{name} = \[0, 3, 8\]: expected an int32 tensor of batch \+ 1 offsets"):
        flashhop.flash_attn_varlen_func(q, k, v, max_seqlen_q=5, max_seqlen_k=6, **cu)


def test_seqused_is_none_or_a_tensor():
    q, k, v, cu_q, cu_k = _cpu_inputs()
    with pytest.raises(ValueError, match=r"seqused_k = \[4, 6\]: expected None or an int32 tensor"):
        flashhop.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 6, seqused_k=[4, 6])


def test_cpu_tensors_are_rejected():
    q, k, v, cu_q, cu_k = _cpu_inputs()
    with pytest.raises(ValueError, match="flashhop: q is on cpu: expected a CUDA tensor"):
        flashhop.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 6)


def test_fake_implementation_gives_output_shapes():
    q, k, v, cu_q, cu_k = _meta_inputs()
    for out, lse in [torch.ops.flashhop.varlen_fwd(q, k, v, cu_q, cu_k, None, None, 5, 10, None, True, 4, 0, 30.0),
                     torch.ops.flashhop.varlen_fwd(q, k, v, cu_q, cu_k, cu_q[1:], cu_k[1:], 5, 10, 0.5, False, -1,
                                                   -1, 0.0, pack_gqa=True)]:
        assert (out.shape, out.dtype) == ((10, 8, 128), torch.bfloat16)
        assert (lse.shape, lse.dtype) == ((8, 10), torch.float32)


def test_return_convention_on_meta_tensors():
    q, k, v, cu_q, cu_k = _meta_inputs(head_dim_v=192)
    out = flashhop.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 10, causal=True)
    assert out.shape == (10, 8, 192)
    out, lse = flashhop.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 0, 0, return_attn_probs=True)
    assert (out.shape, lse.shape, lse.dtype) == ((10, 8, 192), (8, 10), torch.float32)


@pytest.mark.parametrize("name, shape", [("q", (1, 10, 8, 192)), ("v", (30, 192))])
def test_fake_implementation_checks_the_ranks(name, shape):
    inputs = dict(zip(("q", "k", "v", "cu_q", "cu_k"), _meta_inputs()))
    inputs[name] = torch.empty(*shape, dtype=torch.bfloat16, device="meta")
    layout = "(total_q, nheads, head_dim)" if name == "q" else "(total_k, nheads_kv, head_dim_v)"
    with pytest.raises(ValueError, match=re.escape(f"{name}.rank = {len(shape)}: expected 3 {layout}")):
        flashhop.flash_attn_varlen_func(inputs["q"], inputs["k"], inputs["v"], inputs["cu_q"], inputs["cu_k"], 5, 10)


def test_traced_through_the_fake_implementation():
    """make_fx in fake mode, as torch.compile's tracing does: the graph holds the operator and the
    shapes come from the fake implementation, with nothing run."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def attention(q, k, v, cu_q, cu_k):
        return flashhop.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 10, causal=True, return_attn_probs=True)

    inputs = _packed([2, 3, 5], [10, 10, 10], head_dim=64, device="cpu")
    graph = make_fx(attention, tracing_mode="fake")(*inputs)
    assert "flashhop.varlen_fwd" in str(graph.graph)
    outputs = [node.meta["val"] for node in graph.graph.nodes if node.op == "call_function"
               and "varlen_fwd" in str(node.target)]
    out, lse = outputs[0]
    assert out.shape == (10, 8, 64) and lse.shape == (8, 10)


def test_c_api_struct_carries_the_varlen_fields():
    """The ctypes struct lays the appended fields out as flashhop_forward_args_t does: the library,
    which validates host descriptors without a device, reads this call's sequences and bounds (the
    tile list's size: a 16-byte header and 3 ints per sequence and one more) and answers forward
    without a workspace with the workspace it needs (or, where the build left the kernel out, with
    that)."""
    import ctypes

    from flashhop import _c_api
    q, k, v, cu_q, cu_k = _packed([20, 30, 50], [100, 100, 100], device="cpu")
    out = torch.empty_like(q)
    lse = torch.empty(8, 100, dtype=torch.float32)
    seqused_k = torch.tensor([100, 50, 1], dtype=torch.int32)

    def describe(tensor):  # as _c_api._describe, on device 0 for the host tensors
        desc = _c_api._Tensor(data=tensor.data_ptr(), dtype=_c_api._DTYPES[tensor.dtype], rank=tensor.dim(),
                              device=0)
        for d in range(tensor.dim()):
            desc.shape[d], desc.stride[d] = tensor.shape[d], tensor.stride(d)
        return desc

    pointers = {name: ctypes.pointer(describe(t)) for name, t in
                (("lse", lse), ("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k), ("seqused_k", seqused_k))}
    args = _c_api._ForwardArgs(q=describe(q), k=describe(k), v=describe(v), o=describe(out), max_seqlen_q=50,
                               max_seqlen_k=100, **pointers)
    size = ctypes.c_size_t()
    _c_api._check(_c_api._library.flashhop_forward_workspace_size(ctypes.byref(args), ctypes.byref(size)))
    assert size.value == 16 + (3 * 3 + 1) * 4
    with pytest.raises((NotImplementedError, ValueError),
                       match="is not compiled into this build|expected a workspace of at least 56 bytes"):
        _c_api._check(_c_api._library.flashhop_forward(ctypes.byref(args), None, 0, None))
    args.max_seqlen_k = 0
    with pytest.raises(ValueError, match="max_seqlen_k = 0: expected >= 1 with cu_seqlens_k"):
        _c_api._check(_c_api._library.flashhop_forward_workspace_size(ctypes.byref(args), ctypes.byref(size)))


# ---- against flash_attn_func, on a Hopper GPU ----------------------------------------------------

def _per_sequence_reference(q, k, v, cu_q, cu_k, seqused_q=None, seqused_k=None, **options):
    """out and lse of each sequence alone through flash_attn_func, placed at its rows; rows past
    seqused are left NaN and not compared."""
    out = torch.full(q.shape[:2] + v.shape[2:], float("nan"), dtype=q.dtype, device=q.device)
    lse = torch.full((q.shape[1], q.shape[0]), float("nan"), dtype=torch.float32, device=q.device)
    for b in range(cu_q.numel() - 1):
        start_q, start_k = int(cu_q[b]), int(cu_k[b])
        used_q = int(cu_q[b + 1]) - start_q if seqused_q is None else int(seqused_q[b])
        used_k = int(cu_k[b + 1]) - start_k if seqused_k is None else int(seqused_k[b])
        rows = slice(start_q, start_q + used_q)
        keys = slice(start_k, start_k + used_k)
        o, o_lse = flashhop.flash_attn_func(q[None, rows], k[None, keys], v[None, keys], return_attn_probs=True,
                                            **options)
        out[rows], lse[:, rows] = o[0], o_lse[0]
    return out, lse


def _compare(got, expected):
    out, lse = got
    expected_out, expected_lse = expected
    used = ~expected_out.isnan()
    torch.testing.assert_close(out[used], expected_out[used], atol=1e-2, rtol=1e-2)
    used = ~expected_lse.isnan()
    torch.testing.assert_close(lse[used], expected_lse[used], atol=1e-3, rtol=1e-3)


MASKS = {"none": {}, "causal": {"causal": True}, "window": {"window_size": (64, 16)},
         "causal_softcap": {"causal": True, "softcap": 30.0}}


@requires_hopper
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_matches_per_sequence_calls(mask, head_dim):
    lengths_q = [0, 1, 17, 128, 1000, 300]
    lengths_k = [5, 1, 17, 200, 1000, 3000]
    q, k, v, cu_q, cu_k = _packed(lengths_q, lengths_k, head_dim=head_dim)
    got = skip_unless_built(flashhop.flash_attn_varlen_func, q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k),
                            return_attn_probs=True, **MASKS[mask])
    _compare(got, _per_sequence_reference(q, k, v, cu_q, cu_k, **MASKS[mask]))


@requires_hopper
@pytest.mark.parametrize("pack_gqa", [None, True, False])
def test_gqa_and_seqused(pack_gqa):
    lengths_q, lengths_k = [40, 7, 130], [90, 300, 130]
    q, k, v, cu_q, cu_k = _packed(lengths_q, lengths_k, nheads=12, nheads_kv=3)
    seqused_q = torch.tensor([33, 7, 0], dtype=torch.int32, device="cuda")
    seqused_k = torch.tensor([90, 150, 1], dtype=torch.int32, device="cuda")
    got = skip_unless_built(flashhop.flash_attn_varlen_func, q, k, v, cu_q, cu_k, 130, 300, seqused_q=seqused_q,
                            seqused_k=seqused_k, causal=True, pack_gqa=pack_gqa, return_attn_probs=True)
    _compare(got, _per_sequence_reference(q, k, v, cu_q, cu_k, seqused_q, seqused_k, causal=True))


@requires_hopper
def test_empty_batch_and_max_seqlen_zero():
    q, k, v, cu_q, cu_k = _packed([0, 0], [0, 4])
    out, lse = skip_unless_built(flashhop.flash_attn_varlen_func, q, k, v, cu_q, cu_k, 0, 4, return_attn_probs=True)
    assert out.shape == (0, 8, 128) and lse.shape == (8, 0)


@requires_hopper
@pytest.mark.parametrize("change, message", [
    (lambda a: {**a, "cu_seqlens_q": a["cu_seqlens_q"].float()}, r"cu_seqlens_q.dtype = float32: expected int32"),
    (lambda a: {**a, "cu_seqlens_k": a["cu_seqlens_k"][:-1]},
     r"cu_seqlens_k.shape\[0\] \(batch \+ 1\) = 3: expected 4"),
    (lambda a: {**a, "seqused_q": torch.zeros(2, dtype=torch.int32, device="cuda")},
     r"seqused_q.shape\[0\] \(batch\) = 2: expected 3 \(cu_seqlens_q.shape\[0\] - 1\)"),
    (lambda a: {**a, "cu_seqlens_q": a["cu_seqlens_q"].cpu()}, r"cu_seqlens_q is on cpu: expected a CUDA tensor"),
    (lambda a: {**a, "q": a["q"][None]}, r"q.rank = 4: expected 3 \(total_q, nheads, head_dim\)"),
])
def test_bad_arguments_are_named(change, message):
    q, k, v, cu_q, cu_k = _packed([3, 4, 5], [6, 7, 8])
    arguments = change({"q": q, "k": k, "v": v, "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k, "max_seqlen_q": 5,
                        "max_seqlen_k": 8})
    with pytest.raises(ValueError, match=message):
        flashhop.flash_attn_varlen_func(**arguments)


def _gradients(q, k, v, cu_q, cu_k, max_q, max_k, dout, **options):
    """dq, dk and dv of flash_attn_varlen_func through autograd."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = skip_unless_built(flashhop.flash_attn_varlen_func, q, k, v, cu_q, cu_k, max_q, max_k, **options)
    out.backward(dout)
    return q.grad, k.grad, v.grad


def _check_each_sequence(q, k, v, cu_q, cu_k, dout, got, seqused_q=None, seqused_k=None, **options):
    """Each sequence's gradients against the float64 reference of that sequence alone
    (helpers.check_gradients); the rows outside every sequence's used rows 0."""
    dq, dk, dv = got
    used_rows, used_keys = torch.zeros(q.shape[0], dtype=torch.bool), torch.zeros(k.shape[0], dtype=torch.bool)
    for b in range(cu_q.numel() - 1):
        start_q, start_k = int(cu_q[b]), int(cu_k[b])
        used_q = int(cu_q[b + 1]) - start_q if seqused_q is None else int(seqused_q[b])
        used_k = int(cu_k[b + 1]) - start_k if seqused_k is None else int(seqused_k[b])
        rows, keys = slice(start_q, start_q + used_q), slice(start_k, start_k + used_k)
        used_rows[rows], used_keys[keys] = True, True
        if used_q == 0 or used_k == 0:  # dk = dv = 0 without queries, dq = 0 without keys
            for grad in (dq[rows], dk[keys], dv[keys]):
                assert not grad.any()
            continue
        check_gradients(q[None, rows], k[None, keys], v[None, keys], dout[None, rows],
                        (dq[None, rows], dk[None, keys], dv[None, keys]), **options)
    for grad, used in ((dq, used_rows), (dk, used_keys), (dv, used_keys)):
        assert not grad[~used.to(grad.device)].any()


@requires_hopper
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gradients_match_the_reference(mask, head_dim):
    lengths_q = [0, 1, 17, 128, 1000, 300, 65]
    lengths_k = [5, 1, 17, 200, 1000, 3000, 0]
    q, k, v, cu_q, cu_k = _packed(lengths_q, lengths_k, head_dim=head_dim)
    dout = torch.randn_like(q)
    got = _gradients(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), dout, **MASKS[mask])
    _check_each_sequence(q, k, v, cu_q, cu_k, dout, got, **MASKS[mask])


@requires_hopper
@pytest.mark.parametrize("deterministic", [False, True])
def test_gradients_with_gqa_and_seqused(deterministic):
    lengths_q, lengths_k = [40, 7, 130, 64], [90, 300, 130, 64]
    q, k, v, cu_q, cu_k = _packed(lengths_q, lengths_k, nheads=12, nheads_kv=3)
    seqused_q = torch.tensor([33, 7, 0, 64], dtype=torch.int32, device="cuda")
    seqused_k = torch.tensor([90, 150, 1, 0], dtype=torch.int32, device="cuda")
    dout = torch.randn_like(q)
    options = {"causal": True, "seqused_q": seqused_q, "seqused_k": seqused_k}
    got = _gradients(q, k, v, cu_q, cu_k, 130, 300, dout, deterministic=deterministic, **options)
    _check_each_sequence(q, k, v, cu_q, cu_k, dout, got, **options)


@requires_hopper
def test_deterministic_gradients_are_bitwise_identical():
    lengths_q, lengths_k = [500, 3, 700], [700, 900, 64]
    q, k, v, cu_q, cu_k = _packed(lengths_q, lengths_k)
    dout = torch.randn_like(q)
    first = _gradients(q, k, v, cu_q, cu_k, 700, 900, dout, causal=True, deterministic=True)
    for _ in range(10):
        again = _gradients(q, k, v, cu_q, cu_k, 700, 900, dout, causal=True, deterministic=True)
        assert all(torch.equal(a, b) for a, b in zip(first, again))


def test_backward_fake_implementation_gives_gradient_shapes():
    q, k, v, cu_q, cu_k = _meta_inputs()
    out, lse = torch.ops.flashhop.varlen_fwd(q, k, v, cu_q, cu_k, None, None, 5, 10, None, True, -1, 0, 0.0)
    grads = torch.ops.flashhop.varlen_bwd(out, q, k, v, out, lse, cu_q, cu_k, None, None, 5, 10, None, True, -1, 0,
                                          0.0, True)
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]
