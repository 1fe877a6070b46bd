"""flashhop.quantize_fp8 and flashhop.hadamard_signs: the FP8 (e4m3) inputs of FP8 attention. Argument
checks, the fake implementation's shapes and the C API struct run anywhere; the GPU tests compare
with a float64 torch reference (the rotation by an explicit Hadamard matrix, descale = amax / 448,
e4m3 rounding to nearest) and check that rotated, dequantized q k^T keeps the original scores."""
import ctypes
import math

import pytest

torch = pytest.importorskip("torch")

import flashhop  # noqa: E402
from helpers import requires_hopper  # noqa: E402

SCALINGS = ("per_tensor", "per_head", "per_block")


def _meta(batch=2, seqlen=300, nheads=8, head_dim=128):
    return torch.empty(batch, seqlen, nheads, head_dim, dtype=torch.bfloat16, device="meta")


# ---- arguments, anywhere ----------------------------------------------------------------------

@pytest.mark.parametrize("scaling, groups, shape", [
    ("per_tensor", None, (1,)), ("per_head", None, (2, 8)), ("per_head", 2, (2, 2)), ("per_block", None, (2, 8, 3))])
def test_fake_implementation_gives_output_shapes(scaling, groups, shape):
    out, descale = flashhop.quantize_fp8(_meta(), scaling, groups)
    assert (out.shape, out.dtype) == ((2, 300, 8, 128), torch.float8_e4m3fn)
    assert (descale.shape, descale.dtype) == (shape, torch.float32)


def test_default_is_one_scale_per_head():
    _, descale = flashhop.quantize_fp8(_meta())
    assert descale.shape == (2, 8)


@pytest.mark.parametrize("kwargs, message", [
    (dict(scaling="per_row"), r"scaling = 'per_row': expected 'per_tensor', 'per_head' or 'per_block'"),
    (dict(scaling="per_tensor", groups=2), r"groups = 2 with scaling = 'per_tensor': expected groups only with "
                                           r"'per_head'"),
    (dict(groups=0), r"groups = 0: expected an int >= 1 that divides nheads"),
    (dict(groups=2.0), r"groups = 2.0: expected None or an int >= 1"),
    (dict(groups=True), r"groups = True: expected None or an int >= 1"),
])
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        flashhop.quantize_fp8(_meta(), **kwargs)


def test_rank_is_checked_before_allocating():
    with pytest.raises(ValueError, match=r"x.rank = 3: expected 4 \(batch, seqlen, nheads, head_dim\)"):
        flashhop.quantize_fp8(_meta()[0])


def test_cpu_tensors_are_rejected():
    x = torch.randn(1, 4, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="flashhop: x is on cpu: expected a CUDA tensor"):
        flashhop.quantize_fp8(x)


def test_hadamard_signs_are_reproducible():
    signs = flashhop.hadamard_signs(128, device="cpu")
    assert signs.dtype == torch.float32 and signs.shape == (128,)
    assert set(signs.tolist()) == {-1.0, 1.0}
    assert torch.equal(signs, flashhop.hadamard_signs(128, device="cpu"))
    assert torch.equal(signs, flashhop.hadamard_signs(128, seed=0, device="cpu"))
    assert not torch.equal(signs, flashhop.hadamard_signs(128, seed=1, device="cpu"))
    with pytest.raises(ValueError, match=r"head_dim = 0: expected an int >= 1"):
        flashhop.hadamard_signs(0)


def test_traced_through_the_fake_implementation():
    """make_fx in fake mode, as torch.compile's tracing does: the operator is in the graph and its
    outputs' shapes come from the fake implementation."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def quantize(x, signs):
        return flashhop.quantize_fp8(x, "per_block", hadamard_signs=signs)

    x = torch.randn(2, 200, 4, 64, dtype=torch.bfloat16)
    graph = make_fx(quantize, tracing_mode="fake")(x, flashhop.hadamard_signs(64, device="cpu"))
    assert "flashhop.quantize_fp8" in str(graph.graph)
    outputs = [node.meta["val"] for node in graph.graph.nodes if node.op == "call_function"
               and "quantize_fp8" in str(node.target)]
    out, descale = outputs[0]
    assert out.shape == (2, 200, 4, 64) and out.dtype == torch.float8_e4m3fn and descale.shape == (2, 4, 2)


def test_c_api_struct_carries_the_fields():
    """The ctypes struct lays its fields out as flashhop_quantize_fp8_args_t does: the library, which
    validates host descriptors before it asks for a device, names each field's problem."""
    from flashhop import _c_api

    def describe(tensor):  # as _c_api._describe, on device 0 for the host tensors
        desc = _c_api._Tensor(data=tensor.data_ptr(), dtype=_c_api._DTYPES[tensor.dtype], rank=tensor.dim(),
                              device=0)
        for d in range(tensor.dim()):
            desc.shape[d], desc.stride[d] = tensor.shape[d], tensor.stride(d)
        return desc

    x = torch.randn(2, 300, 8, 128, dtype=torch.bfloat16)
    out = torch.empty(x.shape, dtype=torch.float8_e4m3fn)
    signs = flashhop.hadamard_signs(128, device="cpu")

    def call(descale, scaling, signs_tensor=signs):
        pointer = ctypes.pointer(describe(signs_tensor)) if signs_tensor is not None else None
        args = _c_api._QuantizeFp8Args(x=describe(x), out=describe(out), descale=describe(descale),
                                       scaling=scaling, hadamard_signs=pointer)
        _c_api._check(_c_api._library.flashhop_quantize_fp8(ctypes.byref(args), None))

    per_head = torch.empty(2, 4)
    with pytest.raises(ValueError, match=r"descale.rank = 2: expected 3 \(batch, nheads, num_blocks\) with "
                                         r"per-block scaling"):
        call(per_head, _c_api.FP8_SCALINGS["per_block"])
    with pytest.raises(ValueError, match=r"descale.shape\[1\] \(groups\) = 3: nheads \(8\) must be a multiple of it"):
        call(torch.empty(2, 3), _c_api.FP8_SCALINGS["per_head"])
    with pytest.raises(ValueError, match=r"hadamard_signs.shape\[0\] \(head_dim\) = 64: expected 128"):
        call(per_head, _c_api.FP8_SCALINGS["per_head"], signs[:64])
    with pytest.raises(ValueError, match=r"scaling = 5: expected FLASHHOP_FP8_PER_TENSOR \(0\)"):
        call(per_head, 5)
    # Valid: the library then asks the device (none here: a CUDA error; on a GPU, host memory is named).
    with pytest.raises((RuntimeError, ValueError), match="cudaGetDevice|x.data"):
        call(per_head, _c_api.FP8_SCALINGS["per_head"], None)


# ---- against a float64 reference, on a Hopper GPU ------------------------------------------------

def _hadamard(block, device):
    """Sylvester's Walsh-Hadamard matrix of `block` rows, scaled to be orthogonal, in float64."""
    h = torch.ones(1, 1, dtype=torch.float64, device=device)
    while h.shape[0] < block:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(block)


def _rotated(x, signs):
    """x (..., head_dim) -> H (s * x) in float64, H block-diagonal on the largest power of two
    dividing head_dim, s = +1 where signs >= 0."""
    y = x.double()
    if signs is None:
        return y
    d = y.shape[-1]
    block = d & -d
    y = y * torch.where(signs >= 0, 1.0, -1.0).double()
    return (y.reshape(*y.shape[:-1], d // block, block) @ _hadamard(block, y.device)).reshape(y.shape)


def _reference(x, scaling, groups, signs):
    """(y / descale, descale) in float64, descale in quantize_fp8's layout."""
    y = _rotated(x, signs)
    batch, seqlen, nheads, d = y.shape
    magnitude = y.abs()
    if scaling == "per_tensor":
        amax = magnitude.amax().reshape(1)
        broadcast = amax.reshape(1, 1, 1, 1)
    elif scaling == "per_head":
        groups = nheads if groups is None else groups
        amax = magnitude.reshape(batch, seqlen, groups, nheads // groups, d).amax(dim=(1, 3, 4))
        broadcast = amax.repeat_interleave(nheads // groups, dim=1)[:, None, :, None]
    else:
        blocks = -(-seqlen // 128)
        padded = torch.nn.functional.pad(magnitude, (0, 0, 0, 0, 0, blocks * 128 - seqlen))
        amax = padded.reshape(batch, blocks, 128, nheads, d).amax(dim=(2, 4)).transpose(1, 2)  # (batch, nheads, blocks)
        broadcast = amax.transpose(1, 2).repeat_interleave(128, dim=1)[:, :seqlen, :, None]
    descale = torch.where(amax > 0, amax / 448, torch.ones_like(amax))
    broadcast = torch.where(broadcast > 0, broadcast / 448, torch.ones_like(broadcast))
    return y / broadcast, descale


def _half_step(v):
    """Half the e4m3 step at |v|: the largest error of a correct rounding."""
    exponent = torch.floor(torch.log2(v.abs().clamp(min=2.0**-6, max=448.0))).clamp(min=-6)
    return torch.exp2(exponent - 3) / 2


def _check(x, scaling, groups, signs):
    out, descale = flashhop.quantize_fp8(x, scaling, groups, signs)
    scaled, expected_descale = _reference(x, scaling, groups, signs)
    rotated = signs is not None
    assert descale.shape == expected_descale.shape
    torch.testing.assert_close(descale.double(), expected_descale, rtol=1e-5 if rotated else 2e-7, atol=0)
    d = x.shape[-1]
    block = d & -d
    # The float error of the kernel's rotation, in units of y / descale (test_fp8_quantize_gpu.cpp).
    rotation_error = 2.0**-24 * math.log2(block) * math.sqrt(block) * 448 if rotated else 0.0
    got = out.double()
    assert not got.isnan().any()
    error = (got - scaled.clamp(-448, 448)).abs()
    allowed = _half_step(scaled) + 1e-5 * scaled.abs() + rotation_error
    assert (error <= allowed).all(), f"{(error > allowed).sum().item()} values off by more than half an e4m3 step"
    return out, descale


@requires_hopper
@pytest.mark.parametrize("scaling", SCALINGS)
@pytest.mark.parametrize("rotate", [False, True], ids=["plain", "hadamard"])
@pytest.mark.parametrize("head_dim", [64, 96, 128, 192, 256])
@pytest.mark.parametrize("seqlen", [1, 129, 1000])
def test_matches_reference(scaling, rotate, head_dim, seqlen):
    torch.manual_seed(head_dim + seqlen)
    x = torch.randn(2, seqlen, 4, head_dim, device="cuda", dtype=torch.bfloat16)
    x[..., 5] *= 30  # an outlier channel
    x[1, :, :2] = 0  # a group of zeros per head with groups = 2: descale 1
    signs = flashhop.hadamard_signs(head_dim, seed=seqlen) if rotate else None
    _check(x, scaling, 2 if scaling == "per_head" else None, signs)


@requires_hopper
@pytest.mark.parametrize("scaling", SCALINGS)
def test_float16_and_strided(scaling):
    """x as the query heads of a fused (batch, seqlen, 8 + 2 + 2 heads, 128) projection."""
    qkv = torch.randn(3, 300, 12, 128, device="cuda", dtype=torch.float16)
    _check(qkv[:, :, :8], scaling, None, flashhop.hadamard_signs(128))


@requires_hopper
def test_groups_follow_gqa():
    """groups = nheads_kv: query head h takes the scale of KV head h // (nheads // nheads_kv), as
    FlashAttention-3's (batch, nheads_kv) q_descale."""
    q = torch.randn(2, 100, 8, 128, device="cuda", dtype=torch.bfloat16)
    q[:, :, 5] *= 100  # heads 4 .. 7 share KV head 1
    _, descale = flashhop.quantize_fp8(q, "per_head", groups=2)
    expected = q.float().abs().reshape(2, 100, 2, 4, 128).amax(dim=(1, 3, 4)) / 448
    torch.testing.assert_close(descale, expected, rtol=2e-7, atol=0)
    assert (descale[:, 1] > 10 * descale[:, 0]).all()


@requires_hopper
@pytest.mark.parametrize("head_dim", [64, 96, 128, 192, 256])
def test_rotated_scores_match(head_dim):
    """q and k rotated with the same signs, quantized per head and dequantized, give q k^T of the
    original values within e4m3's error (0.5% expected in the root mean square, 5% allowed)."""
    torch.manual_seed(head_dim)
    q = torch.randn(1, 200, 8, head_dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 300, 2, head_dim, device="cuda", dtype=torch.bfloat16)
    q[..., 3] *= 20
    k[..., 3] *= 20
    signs = flashhop.hadamard_signs(head_dim, seed=7)
    q8, q_descale = flashhop.quantize_fp8(q, "per_head", groups=2, hadamard_signs=signs)
    k8, k_descale = flashhop.quantize_fp8(k, "per_head", hadamard_signs=signs)
    q_deq = q8.double() * q_descale.double().repeat_interleave(4, dim=1)[:, None, :, None]
    k_deq = (k8.double() * k_descale.double()[:, None, :, None]).repeat_interleave(4, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double().repeat_interleave(4, dim=2))
    deq_scores = torch.einsum("bqhd,bkhd->bhqk", q_deq, k_deq)
    error = (deq_scores - scores).pow(2).mean().sqrt()
    assert error <= 0.05 * scores.pow(2).mean().sqrt()


@requires_hopper
@pytest.mark.parametrize("scaling", SCALINGS)
@pytest.mark.parametrize("seqlen", [0, 130])
def test_zeros_give_descale_one(scaling, seqlen):
    x = torch.zeros(2, seqlen, 4, 128, device="cuda", dtype=torch.bfloat16)
    out, descale = flashhop.quantize_fp8(x, scaling, hadamard_signs=flashhop.hadamard_signs(128))
    assert (descale == 1).all()
    assert (out.float() == 0).all()


@requires_hopper
def test_opcheck():
    x = torch.randn(2, 150, 4, 128, device="cuda", dtype=torch.bfloat16)
    signs = flashhop.hadamard_signs(128)
    for scaling, groups, hadamard in [("per_head", 2, signs), ("per_tensor", None, None), ("per_block", None, signs)]:
        torch.library.opcheck(torch.ops.flashhop.quantize_fp8.default, (x, scaling, groups, hadamard))


@requires_hopper
def test_cuda_graph_replay():
    """The per-tensor scale's three launches (reset, amax, quantize) are captured and replayed."""
    x = torch.randn(2, 1000, 8, 128, device="cuda", dtype=torch.bfloat16)
    signs = flashhop.hadamard_signs(128)
    expected = flashhop.quantize_fp8(x, "per_tensor", hadamard_signs=signs)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = flashhop.quantize_fp8(x, "per_tensor", hadamard_signs=signs)
    x.mul_(2)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured[0].view(torch.uint8), expected[0].view(torch.uint8))
    torch.testing.assert_close(captured[1], 2 * expected[1], rtol=0, atol=0)
