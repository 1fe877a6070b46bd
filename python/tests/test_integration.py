"""flashhop inside PyTorch's machinery: operator registration, torch.compile(fullgraph=True),
CUDA graph capture and replay, autograd."""
import pytest

torch = pytest.importorskip("torch")

import flashhop  # noqa: E402
from helpers import random_qkv, requires_hopper, skip_unless_built  # noqa: E402


def test_fake_implementation_gives_output_shapes():
    q = torch.empty(2, 5, 8, 192, dtype=torch.bfloat16, device="meta")
    k = torch.empty(2, 9, 2, 192, dtype=torch.bfloat16, device="meta")
    v = torch.empty(2, 9, 2, 128, dtype=torch.bfloat16, device="meta")
    for out, lse in [torch.ops.flashhop.fwd(q, k, v, None, True, 4, 0, 30.0),
                     torch.ops.flashhop.fwd(q, k, v, None, True, 4, 0, 30.0, pack_gqa=True)]:
        assert (out.shape, out.dtype) == ((2, 5, 8, 128), torch.bfloat16)
        assert (lse.shape, lse.dtype) == ((2, 8, 5), torch.float32)


@requires_hopper
def test_opcheck():
    q, k, v = random_qkv(2, 100, 130, 4, 2, 128)
    for causal in (False, True):
        skip_unless_built(flashhop.flash_attn_func, q, k, v, causal=causal)
    # (softmax_scale, causal, window_left, window_right, softcap)
    for options in [(None, True, -1, -1, 0.0), (0.5, False, -1, -1, 0.0), (None, False, 16, 8, 30.0),
                    (None, True, 32, 0, 5.0)]:
        torch.library.opcheck(torch.ops.flashhop.fwd.default, (q, k, v, *options))


@requires_hopper
def test_opcheck_pack_gqa():
    q, k, v = random_qkv(2, 5, 300, 12, 3, 128)
    for pack_gqa in [None, True, False]:
        skip_unless_built(flashhop.flash_attn_func, q, k, v, causal=True, pack_gqa=pack_gqa)
    for pack_gqa in [None, True, False]:
        torch.library.opcheck(torch.ops.flashhop.fwd.default, (q, k, v, None, True, -1, 0, 0.0, pack_gqa))


@requires_hopper
def test_opcheck_head_dim_v():
    q, k, v = random_qkv(2, 100, 130, 4, 2, 192, head_dim_v=128)
    skip_unless_built(flashhop.flash_attn_func, q, k, v)
    torch.library.opcheck(torch.ops.flashhop.fwd.default, (q, k, v, None, False, -1, 20, 0.0))


class Attention(torch.nn.Module):
    """A self-attention block that hands flashhop strided views of one projection; `attention`
    are flash_attn_func's keyword arguments."""

    def __init__(self, dim=256, nheads=4, nheads_kv=2, head_dim=128, **attention):
        super().__init__()
        self.heads = (nheads, nheads_kv, nheads_kv)
        self.head_dim = head_dim
        self.attention = attention
        self.qkv = torch.nn.Linear(dim, sum(self.heads) * head_dim)
        self.proj = torch.nn.Linear(nheads * head_dim, dim)

    def forward(self, x):
        batch, seqlen, _ = x.shape
        q, k, v = self.qkv(x).view(batch, seqlen, -1, self.head_dim).split(self.heads, dim=2)
        out = flashhop.flash_attn_func(q, k, v, **self.attention)
        return self.proj(out.reshape(batch, seqlen, -1))


# flash_attn_func's keyword arguments in the models that the tests compile.
ATTENTION = {"causal": {"causal": True}, "window_softcap": {"window_size": (48, 16), "softcap": 20.0},
             "causal_pack_gqa": {"causal": True, "pack_gqa": True}}


def _model(attention):
    return Attention(**ATTENTION[attention]).to(device="cuda", dtype=torch.bfloat16)


@requires_hopper
@pytest.mark.parametrize("attention", ATTENTION)
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_compile_fullgraph(mode, attention):
    torch._dynamo.reset()
    model = _model(attention).eval()
    with torch.no_grad():
        skip_unless_built(model, torch.randn(2, 100, 256, device="cuda", dtype=torch.bfloat16))
    compiled = torch.compile(model, fullgraph=True, dynamic=True, mode=mode)
    with torch.no_grad():
        for seqlen in (100, 37, 100):  # a second length runs without a new trace (dynamic shapes)
            x = torch.randn(2, seqlen, 256, device="cuda", dtype=torch.bfloat16)
            torch.testing.assert_close(compiled(x), model(x), atol=2e-2, rtol=2e-2)


@requires_hopper
@pytest.mark.parametrize("attention", ATTENTION)
def test_compiled_training_step_matches_eager(attention):
    torch._dynamo.reset()
    model = _model(attention)
    x = torch.randn(2, 64, 256, device="cuda", dtype=torch.bfloat16)
    skip_unless_built(lambda: model(x).float().square().mean().backward())
    eager_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    torch.compile(model, fullgraph=True)(x).float().square().mean().backward()
    for eager_grad, p in zip(eager_grads, model.parameters()):
        torch.testing.assert_close(p.grad, eager_grad, atol=2e-2, rtol=2e-2)


@requires_hopper
def test_cuda_graph_replay_matches_eager():
    shape = (2, 300, 333, 8, 2, 128)
    static_inputs = random_qkv(*shape)
    skip_unless_built(flashhop.flash_attn_func, *static_inputs, causal=True)
    # Warm up outside the capture, on a side stream, as torch.cuda.graph asks.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        flashhop.flash_attn_func(*static_inputs, causal=True)
    torch.cuda.current_stream().wait_stream(side)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = flashhop.flash_attn_func(*static_inputs, causal=True, return_attn_probs=True)
    for _ in range(2):
        inputs = random_qkv(*shape)
        for static, fresh in zip(static_inputs, inputs):
            static.copy_(fresh)
        graph.replay()
        expected_out, expected_lse = flashhop.flash_attn_func(*inputs, causal=True, return_attn_probs=True)
        assert torch.equal(out, expected_out)
        assert torch.equal(lse, expected_lse)


@requires_hopper
def test_cuda_graph_of_forward_and_backward_matches_eager():
    """A training step's attention, forward and backward, captured as one CUDA graph (the gradients
    allocated inside the capture, as torch.cuda.graph's whole-network example does) and replayed on
    fresh inputs: bitwise the eager results, with the deterministic backward."""
    shape = (2, 300, 333, 8, 2, 64)
    static = [t.requires_grad_() for t in random_qkv(*shape)]
    static_dout = torch.randn(2, 300, 8, 64, device="cuda", dtype=torch.bfloat16)

    def step(inputs, dout):
        out = flashhop.flash_attn_func(*inputs, causal=True, deterministic=True)
        out.backward(dout)
        return out

    skip_unless_built(step, static, static_dout)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            for t in static:
                t.grad = None
            step(static, static_dout)
    torch.cuda.current_stream().wait_stream(side)
    for t in static:
        t.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = step(static, static_dout)

    for _ in range(2):
        fresh, fresh_dout = random_qkv(*shape), torch.randn_like(static_dout)
        with torch.no_grad():
            for s, f in zip(static, fresh):
                s.copy_(f)
        static_dout.copy_(fresh_dout)
        graph.replay()
        eager = [f.requires_grad_() for f in fresh]
        assert torch.equal(static_out, step(eager, fresh_dout))
        for s, e in zip(static, eager):
            assert torch.equal(s.grad, e.grad)
