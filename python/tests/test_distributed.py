"""flashhop.distributed against attention over the whole sequence, forward and backward: the ring and
all-gather schedules with every rank a thread of one process (CPU tensors and a float64 PyTorch
backend; on a Hopper GPU flashhop's kernels in bf16), the same over gloo with 2 and 4 processes,
and over NCCL where a machine has two GPUs or more."""
import math
import queue
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import flashhop  # noqa: E402
import flashhop.distributed as fd  # noqa: E402
from helpers import (HOPPER, assert_matches_reference, attention_reference, check_gradients,  # noqa: E402
                     requires_hopper, skip_unless_built, visible_keys)

TIMEOUT_S = 60


class ReferenceBackend:
    """flashhop.distributed's backend interface in float64 PyTorch, on any device: the forward is
    helpers.attention_reference; the backward applies attention's gradient formulas with the given
    (global) out and lse, as the kernels do: P = exp(S - lse), dV = P^T dO, dS = P (dP - D) with
    D = rowsum(dO O), dQ = scale dS K, dK = scale dS^T Q, dK and dV summed over each KV group."""

    def __init__(self, softmax_scale=None, softcap=0.0, deterministic=False):
        self.softmax_scale = softmax_scale
        self.softcap = softcap

    def forward(self, q, k, v, window):
        out, lse = attention_reference(q, k, v, self.softmax_scale, window_size=window, softcap=self.softcap)
        return out.to(q.dtype), lse

    def backward(self, dout, q, k, v, out, lse, window):
        batch, seqlen_q, nheads, head_dim = q.shape
        seqlen_k, nheads_kv = k.shape[1:3]
        group = nheads // nheads_kv
        scale = 1.0 / math.sqrt(head_dim) if self.softmax_scale is None else self.softmax_scale
        q64, dout64, out64 = (t.double() for t in (q, dout, out))
        k64, v64 = (t.double().repeat_interleave(group, dim=2) for t in (k, v))
        scores = torch.einsum("bqhd,bkhd->bhqk", q64, k64) * scale
        if self.softcap > 0:
            capped = torch.tanh(scores / self.softcap)
            scores = self.softcap * capped
        visible = visible_keys(seqlen_q, seqlen_k, window_size=window, device=q.device)
        probs = torch.exp(scores - lse.double()[..., None]).masked_fill(~visible, 0.0)
        delta = (dout64 * out64).sum(-1).transpose(1, 2)[..., None]
        grad_scores = probs * (torch.einsum("bqhd,bkhd->bhqk", dout64, v64) - delta)
        if self.softcap > 0:
            grad_scores = grad_scores * (1 - capped**2)
        dq = torch.einsum("bhqk,bkhd->bqhd", grad_scores, k64) * scale
        dk = torch.einsum("bhqk,bqhd->bkhd", grad_scores, q64) * scale
        dv = torch.einsum("bhqk,bqhd->bkhd", probs, dout64)

        def per_kv_head(grad):
            return grad.view(batch, seqlen_k, nheads_kv, group, grad.shape[3]).sum(3)

        return dq.to(q.dtype), per_kv_head(dk).to(k.dtype), per_kv_head(dv).to(v.dtype)


class _Ranks:
    """What the threads of a simulated process group share: an inbox per rank and a meeting point
    for collectives."""

    def __init__(self, world_size):
        self.inboxes = [queue.Queue() for _ in range(world_size)]
        self.barrier = threading.Barrier(world_size, timeout=TIMEOUT_S)
        self.slots = [None] * world_size
        self.calls = []


class _Arrival:
    def __init__(self, inbox):
        self._inbox = inbox

    def wait(self):
        return self._inbox.get(timeout=TIMEOUT_S)


class SimulatedRing:
    """Rank `rank` of a process group whose ranks are threads of this process: the interface of
    flashhop.distributed.ProcessGroupRing, tensors copied as a transfer would; the calls are logged
    in the shared _Ranks."""

    def __init__(self, rank, ranks):
        self.rank = rank
        self.world_size = len(ranks.inboxes)
        self._ranks = ranks

    def exchange(self, tensors):
        self._log("exchange")
        self._ranks.inboxes[(self.rank + 1) % self.world_size].put([t.clone() for t in tensors])
        return _Arrival(self._ranks.inboxes[self.rank])

    def all_gather(self, tensor):
        self._log("all_gather")
        return [t.clone() for t in self._collective(tensor)]

    def reduce_scatter(self, tensors):
        self._log("reduce_scatter")
        return sum(parts[self.rank] for parts in self._collective(tensors))

    def _log(self, call):
        if self.rank == 0:
            self._ranks.calls.append(call)

    def _collective(self, contribution):
        self._ranks.slots[self.rank] = contribution
        self._ranks.barrier.wait()
        contributions = list(self._ranks.slots)
        self._ranks.barrier.wait()  # nobody overwrites a slot before every rank has read them all
        return contributions


def simulate(world_size, function):
    """function(rank, ring) for every rank on threads of this process, with rings of one simulated
    process group; the results in rank order, and the calls of rank 0 to its ring."""
    ranks = _Ranks(world_size)
    with ThreadPoolExecutor(world_size) as pool:
        futures = [pool.submit(function, rank, SimulatedRing(rank, ranks)) for rank in range(world_size)]
        return [future.result(timeout=TIMEOUT_S) for future in futures], ranks.calls


def shard(x, rank, world_size, layout, dim=1):
    return fd.zigzag_shard(x, dim, rank, world_size) if layout == "zigzag" else x.chunk(world_size, dim)[rank]


def unshard(shards, layout, dim=1):
    return fd.zigzag_unshard(shards, dim) if layout == "zigzag" else torch.cat(shards, dim)


def full_inputs(seed, seqlen, nheads, nheads_kv, head_dim, head_dim_v, dtype=torch.float64, device="cpu"):
    """q, k, v and an output gradient of one sequence (batch 2), the same on every rank for a seed."""
    generator = torch.Generator(device).manual_seed(seed)

    def randn(heads, dim):
        return torch.randn(2, seqlen, heads, dim, generator=generator, device=device, dtype=dtype)

    return randn(nheads, head_dim), randn(nheads_kv, head_dim), randn(nheads_kv, head_dim_v), randn(nheads, head_dim_v)


def ring_attention_with_gradients(rank, ring, q, k, v, dout, layout, options):
    """This rank's out, lse, dq, dk, dv of the whole sequence's q, k, v, dout (autograd)."""
    q, k, v = (shard(t, rank, ring.world_size, layout).requires_grad_() for t in (q, k, v))
    out, lse = fd.ring_flash_attn_func(q, k, v, ring, return_attn_probs=True, layout=layout, **options)
    out.backward(shard(dout, rank, ring.world_size, layout))
    return out.detach(), lse, q.grad, k.grad, v.grad


def assert_matches_whole_sequence(results, q, k, v, dout, layout, options, tolerance=1e-10):
    """The ranks' results, unsharded, against float64 attention of the whole sequence and its
    autograd gradients."""
    results = [unshard(parts, layout, dim=2 if name == "lse" else 1)
               for name, parts in zip(("out", "lse", "dq", "dk", "dv"), zip(*results))]
    reference_options = {name: value for name, value in options.items() if name in ("softmax_scale", "causal",
                                                                                      "window_size", "softcap")}
    inputs = [t.detach().double().requires_grad_() for t in (q, k, v)]
    out, lse = attention_reference(*inputs, **reference_options)
    out.backward(dout.double())
    expected = [out, lse, *(t.grad for t in inputs)]
    for name, got, want in zip(("out", "lse", "dq", "dk", "dv"), results, expected):
        error = (got.double() - want.detach()).abs().max().item()
        assert error <= tolerance, f"{name}: max error {error:.3g} > {tolerance:.3g} ({options}, {layout})"


# (nheads, nheads_kv, head_dim, head_dim_v)
HEADS = {"mha": (4, 4, 8, 8), "gqa": (4, 2, 8, 8), "mqa_dv": (6, 1, 8, 4)}
# Over 48 positions: shards of 12 to 48, chunks of 6 to 24; the windows cross their edges.
MASKS = {
    "full": {},
    "causal": dict(causal=True),
    "window13_4": dict(window_size=(13, 4)),
    "causal_window20": dict(causal=True, window_size=(20, -1)),
    "window_right9": dict(window_size=(-1, 9)),
}


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("layout", fd.LAYOUTS)
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("method", ["ring", "all_gather"])
@pytest.mark.parametrize("heads", HEADS)
def test_simulated_ranks(world_size, layout, mask, method, heads):
    q, k, v, dout = full_inputs(world_size, 48, *HEADS[heads])
    options = dict(MASKS[mask], method=method, backend=ReferenceBackend)
    results, calls = simulate(world_size, lambda rank, ring: ring_attention_with_gradients(
        rank, ring, q, k, v, dout, layout, options))
    assert_matches_whole_sequence(results, q, k, v, dout, layout, options)
    assert ("all_gather" in calls) == (method == "all_gather")


@pytest.mark.parametrize("method", ["ring", "all_gather"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_simulated_ranks_softcap_and_scale(causal, method):
    q, k, v, dout = full_inputs(7, 40, *HEADS["gqa"])
    options = dict(causal=causal, method=method, softcap=1.5, softmax_scale=0.7, backend=ReferenceBackend)
    results, _ = simulate(4 if causal else 5, lambda rank, ring: ring_attention_with_gradients(
        rank, ring, q, k, v, dout, "contiguous", options))
    assert_matches_whole_sequence(results, q, k, v, dout, "contiguous", options)


@pytest.mark.parametrize("heads,world_size,method", [
    ((4, 4, 8, 8), 2, "ring"), ((4, 2, 8, 8), 2, "ring"), ((8, 1, 8, 8), 4, "all_gather"),
    ((8, 1, 8, 8), 8, "ring"), ((6, 1, 8, 4), 4, "all_gather")])
def test_auto_method_gathers_small_kv(heads, world_size, method):
    """all-gather when world_size * nheads_kv * (head_dim + head_dim_v) <= nheads * head_dim."""
    q, k, v, dout = full_inputs(3, 2 * 8, *heads)
    options = dict(causal=True, backend=ReferenceBackend)
    results, calls = simulate(world_size, lambda rank, ring: ring_attention_with_gradients(
        rank, ring, q, k, v, dout, "zigzag", options))
    assert ("all_gather" in calls) == (method == "all_gather")
    assert_matches_whole_sequence(results, q, k, v, dout, "zigzag", options)


def test_zigzag_shards():
    x = torch.arange(16).view(1, 16)
    shards = [fd.zigzag_shard(x, 1, rank, 4) for rank in range(4)]
    assert shards[0].tolist() == [[0, 1, 14, 15]] and shards[3].tolist() == [[6, 7, 8, 9]]
    assert torch.equal(fd.zigzag_unshard(shards, 1), x)
    with pytest.raises(ValueError, match=r"x.shape\[1\] = 16: expected a multiple of 2 \* world_size = 6"):
        fd.zigzag_shard(x, 1, 0, 3)


@pytest.mark.parametrize("arguments,message", [
    (dict(window_size=(8, -2)), r"window_size = \(8, -2\): expected \(left, right\), each -1 \(unbounded\) or >= 0"),
    (dict(window_size=(8,)), r"window_size = \(8,\): expected \(left, right\)"),
    (dict(layout="striped"), r"layout = 'striped': expected one of \('zigzag', 'contiguous'\)"),
    (dict(method="allgather"), r"method = 'allgather': expected one of \('auto', 'ring', 'all_gather'\)"),
])
def test_bad_arguments(arguments, message):
    q, k, v, _ = full_inputs(0, 8, *HEADS["mha"])
    ring = SimulatedRing(0, _Ranks(1))
    with pytest.raises(ValueError, match=message):
        fd.ring_flash_attn_func(q, k, v, ring, backend=ReferenceBackend, **arguments)


def test_bad_shards():
    q, k, v, _ = full_inputs(0, 6, *HEADS["mha"])
    ring = SimulatedRing(0, _Ranks(1))
    with pytest.raises(ValueError, match=r"seqlen of q, k, v = 6, 4, 4: expected shards of one sequence"):
        fd.ring_flash_attn_func(q, k[:, :4], v[:, :4], ring, backend=ReferenceBackend)
    with pytest.raises(ValueError, match=r"q.shape\[1\] = 5: .* expected an even seqlen"):
        fd.ring_flash_attn_func(q[:, :5], k[:, :5], v[:, :5], ring, backend=ReferenceBackend)
    with pytest.raises(ValueError, match=r"k.rank = 3: expected 4"):
        fd.ring_flash_attn_func(q, k[0], v, ring, backend=ReferenceBackend)


# Cases of the multi-process tests: (seed, layout, options, heads).
PROCESS_CASES = [
    (1, "zigzag", dict(causal=True, method="ring"), "gqa"),
    (2, "contiguous", dict(causal=True, method="ring"), "mha"),
    (3, "zigzag", dict(causal=False, method="ring", softcap=1.5, window_size=(21, 5)), "mha"),
    (4, "zigzag", dict(causal=True, method="all_gather"), "mqa_dv"),
    (5, "contiguous", dict(causal=False, method="all_gather"), "gqa"),
]


def _process_group_worker(rank, world_size, backend, store, dtype):
    """One rank of the multi-process tests: every case of PROCESS_CASES over a real process group, on
    the CPU with the float64 backend (gloo) or on GPU `rank` with flashhop's (NCCL), each rank
    checking its shards against attention of the whole sequence on its own device."""
    device = "cpu" if backend == "gloo" else f"cuda:{rank}"
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world_size)
    try:
        for seed, layout, options, heads in PROCESS_CASES:
            nheads, nheads_kv, head_dim, head_dim_v = HEADS[heads] if backend == "gloo" else (8, 2, 128, 128)
            q, k, v, dout = full_inputs(seed, 32 * world_size, nheads, nheads_kv, head_dim, head_dim_v, dtype, device)
            if backend == "gloo":
                options = dict(options, backend=ReferenceBackend)
            result = ring_attention_with_gradients(rank, fd.ProcessGroupRing(), q, k, v, dout, layout, options)
            gathered = [[torch.empty_like(t) for _ in range(world_size)] for t in result]
            for parts, t in zip(gathered, result):
                dist.all_gather(parts, t.contiguous())
            if backend == "gloo":
                assert_matches_whole_sequence(list(zip(*gathered)), q, k, v, dout, layout, options)
            else:
                _assert_matches_one_gpu(list(zip(*gathered)), q, k, v, dout, layout, options)
    finally:
        dist.destroy_process_group()


def _spawn(world_size, backend, tmp_path, dtype):
    mp.spawn(_process_group_worker, args=(world_size, backend, str(tmp_path / "store"), dtype), nprocs=world_size)


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed with gloo")
@pytest.mark.parametrize("world_size", [2, 4])
def test_gloo_processes(world_size, tmp_path):
    _spawn(world_size, "gloo", tmp_path, torch.float64)


def _assert_matches_one_gpu(results, q, k, v, dout, layout, options):
    """The ranks' bf16 results, unsharded, within FlashAttention's rule of the float64 reference: out
    and lse as one GPU's flashhop call is held, the gradients as flashhop's backward."""
    out, lse, *grads = [unshard(parts, layout, dim=2 if i == 1 else 1) for i, parts in enumerate(zip(*results))]
    attention_options = {name: options[name] for name in ("causal", "window_size", "softcap") if name in options}
    assert_matches_reference(out, lse, q, k, v, **attention_options)
    check_gradients(q, k, v, dout, grads, **attention_options)


# flash_attn_func's window_size of each mask, over 512 positions per rank.
GPU_WINDOWS = {"full": (-1, -1), "causal": (-1, 0), "window300_70": (300, 70), "causal_window700": (700, 0)}


@requires_hopper
@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("layout", fd.LAYOUTS)
@pytest.mark.parametrize("mask", GPU_WINDOWS)
@pytest.mark.parametrize("method", ["ring", "all_gather"])
def test_simulated_ranks_flashhop(world_size, layout, mask, method):
    """The schedules of the simulated ranks with flashhop's kernels in bf16 on one GPU. The autograd
    engine runs the backward of every graph on CUDA tensors on one thread per device, where one
    rank's backward would wait for another's forever: the ranks call the schedule's forward and
    backward functions themselves."""
    q, k, v, dout = full_inputs(world_size, 512 * world_size, 8, 2, 64, 64, torch.bfloat16, "cuda")
    window = GPU_WINDOWS[mask]
    skip_unless_built(flashhop.flash_attn_func, q, k, v, window_size=window)
    forward, backward = ((fd._ring_forward, fd._ring_backward) if method == "ring" else
                         (fd._all_gather_forward, fd._all_gather_backward))
    backend = fd.FlashhopBackend()

    def rank_result(rank, ring):
        q_local, k_local, v_local, dout_local = (shard(t, rank, world_size, layout) for t in (q, k, v, dout))
        if method == "ring":
            out, lse = forward(ring, backend, q_local, k_local, v_local, window, layout)
            grads = backward(ring, backend, dout_local, q_local, k_local, v_local, out, lse, window, layout)
        else:
            out, lse, k_full, v_full = forward(ring, backend, q_local, k_local, v_local, window, layout)
            grads = backward(ring, backend, dout_local, q_local, k_full, v_full, out, lse, window, layout)
        return (out, lse, *grads)

    results, _ = simulate(world_size, rank_result)
    _assert_matches_one_gpu(results, q, k, v, dout, layout, dict(window_size=window))


@requires_hopper
@pytest.mark.skipif(not HOPPER or torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.skipif(not dist.is_available() or not dist.is_nccl_available(), reason="needs torch.distributed with NCCL")
@pytest.mark.parametrize("world_size", [2, 4])
def test_nccl_processes(world_size, tmp_path):
    if torch.cuda.device_count() < world_size:
        pytest.skip(f"needs {world_size} GPUs")
    _spawn(world_size, "nccl", tmp_path, torch.bfloat16)

