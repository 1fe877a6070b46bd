"""Context parallelism: one exact attention over a sequence sharded across the ranks of a
torch.distributed process group, forward and backward.

    import flashhop.distributed as fd
    q, k, v = (fd.zigzag_shard(t, 1, rank, world_size) for t in (q_full, k_full, v_full))
    out = fd.ring_flash_attn_func(q, k, v, causal=True)   # this rank's shard of the output

Each rank holds a shard of the sequence, in FlashAttention's layout (batch, local_seqlen, nheads,
head_dim). The ring: K/V shards travel round the ranks by point-to-point transfers while each rank
attends its queries to the shard in hand; the partial outputs merge exactly through their LSE in
fp32. The backward runs the same ring with the merged (global) output and LSE, and the gradients of
K and V travel round it back to their owner. With GQA, when K and V of the whole sequence are small,
all-gathering them once and making one call per local query chunk is the other method.

Masks: causal, sliding windows, softcap, over the whole sequence. Communication is
torch.distributed (NCCL on GPUs, gloo on the CPUs); the attention of each block (local queries
against keys of one shard) goes through a backend object, by default flashhop's operators.
docs/DESIGN.md explains the schedule.
"""
import math
from typing import NamedTuple

import torch
import torch.distributed as dist

from . import _ops  # noqa: F401  (registers torch.ops.flashhop.*)

LAYOUTS = ("zigzag", "contiguous")
METHODS = ("auto", "ring", "all_gather")


class FlashhopBackend:
    """The attention of one block (local queries against keys of one shard): flashhop's operators
    on CUDA tensors.

    A backend is built with the call's options and has two methods, which any replacement (such as
    the tests' float64 PyTorch attention on CPU tensors) provides alike, window being flashhop's
    (left, right), aligned to the block's bottom-right corner, -1 unbounded, (-1, 0) causal:
    forward(q, k, v, window) -> (out, lse): out in q's dtype, lse (batch, nheads, seqlen_q) in float32
    or wider;
    backward(dout, q, k, v, out, lse, window) -> (dq, dk, dv) in the inputs' dtypes, for the given out
    and lse, which in the ring are those of the whole attention, not of the block.
    """

    def __init__(self, softmax_scale=None, softcap=0.0, deterministic=False):
        self.softmax_scale = softmax_scale
        self.softcap = softcap
        self.deterministic = deterministic

    def _mask(self, window):
        """(causal, window_left, window_right) as the operators take them; causal is window_right = 0."""
        return window[1] == 0, window[0], window[1]

    def forward(self, q, k, v, window):
        return torch.ops.flashhop.fwd(q, k, v, self.softmax_scale, *self._mask(window), self.softcap, None,
                                      self.deterministic)

    def backward(self, dout, q, k, v, out, lse, window):
        return torch.ops.flashhop.bwd(dout, q, k, v, out, lse, self.softmax_scale, *self._mask(window),
                                      self.softcap, self.deterministic)


class _Transfer:
    """Tensors on their way from the previous rank; wait() returns them once they have arrived."""

    def __init__(self, requests, received, sent, stream):
        self._requests = requests
        self._received = received
        self._sent = sent  # kept alive until the transfer is over: the caching allocator must not reuse them
        self._stream = stream

    def wait(self):
        for request in self._requests:
            request.wait()
        if self._stream is not None:
            torch.cuda.current_stream(self._stream.device).wait_stream(self._stream)
        self._sent = None
        return self._received


_COMMUNICATION_STREAMS = {}


def _communication_stream(device):
    if device not in _COMMUNICATION_STREAMS:
        _COMMUNICATION_STREAMS[device] = torch.cuda.Stream(device)
    return _COMMUNICATION_STREAMS[device]


class ProcessGroupRing:
    """The ranks of a torch.distributed process group as a ring: rank r sends to r + 1 and receives
    from r - 1. The ring functions use this interface only (rank, world_size, exchange, all_gather,
    reduce_scatter), so that another implementation of it can stand in for the process group: the
    tests run every rank as a thread of one process that way."""

    def __init__(self, group=None):
        self.group = dist.group.WORLD if group is None else group
        self.rank = dist.get_rank(self.group)
        self.world_size = dist.get_world_size(self.group)
        # P2P operations take global ranks.
        self._next = dist.get_global_rank(self.group, (self.rank + 1) % self.world_size)
        self._previous = dist.get_global_rank(self.group, (self.rank - 1) % self.world_size)

    def exchange(self, tensors):
        """Starts sending `tensors` to the next rank and receiving as many tensors of the same shapes
        from the previous one; on CUDA on a stream of its own, after the work queued so far on the
        current stream, so that the transfer overlaps the attention queued after it."""
        tensors = [t.contiguous() for t in tensors]
        received = [torch.empty_like(t) for t in tensors]
        operations = [dist.P2POp(dist.isend, t, self._next, self.group) for t in tensors]
        operations += [dist.P2POp(dist.irecv, t, self._previous, self.group) for t in received]
        if tensors[0].is_cuda:
            stream = _communication_stream(tensors[0].device)
            stream.wait_stream(torch.cuda.current_stream(tensors[0].device))
            with torch.cuda.stream(stream):
                requests = dist.batch_isend_irecv(operations)
        else:
            stream = None
            requests = dist.batch_isend_irecv(operations)
        return _Transfer(requests, received, tensors, stream)

    def all_gather(self, tensor):
        """Every rank's `tensor`, in rank order."""
        tensor = tensor.contiguous()
        gathered = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(gathered, tensor, group=self.group)
        return gathered

    def reduce_scatter(self, tensors):
        """The sum over the ranks of their tensors[rank]; `tensors` holds one tensor per rank, all of
        the same shape."""
        out = torch.empty_like(tensors[0])
        dist.reduce_scatter_tensor(out, torch.cat(tensors), group=self.group)
        return out


def zigzag_shard(x, dim, rank, world_size):
    """Rank `rank`'s shard of the full sequence x in the zigzag layout: of 2 * world_size equal
    chunks along `dim`, chunks rank and 2 * world_size - 1 - rank, concatenated, so that under a
    causal mask every rank has the same work."""
    chunks = 2 * world_size
    if x.shape[dim] % chunks != 0:
        raise ValueError(f"flashhop: x.shape[{dim}] = {x.shape[dim]}: expected a multiple of 2 * world_size = "
                         f"{chunks} for the zigzag layout")
    parts = x.chunk(chunks, dim)
    return torch.cat([parts[rank], parts[chunks - 1 - rank]], dim)


def zigzag_unshard(shards, dim):
    """The full sequence from the zigzag shards of every rank, in rank order (zigzag_shard's inverse)."""
    halves = [shard.chunk(2, dim) for shard in shards]
    return torch.cat([first for first, _ in halves] + [second for _, second in reversed(halves)], dim)


def _shard(x, dim, rank, world_size, layout):
    return zigzag_shard(x, dim, rank, world_size) if layout == "zigzag" else x.chunk(world_size, dim)[rank]


def _unshard(shards, dim, layout):
    return zigzag_unshard(shards, dim) if layout == "zigzag" else torch.cat(shards, dim)


class _Block(NamedTuple):
    """Which local queries attend to which keys of the shard in hand, under which mask: window
    (left, right) as flashhop's, aligned to the block's bottom-right corner, -1 unbounded, (-1, 0)
    causal."""
    queries: slice
    keys: slice
    window: tuple


_ALL = slice(None)
_FULL = (-1, -1)
_CAUSAL = (-1, 0)


class _Chunk(NamedTuple):
    """A run of consecutive positions of the sequence held by one rank."""
    start: int  # in the whole sequence
    local: int  # in the rank's shard
    length: int


def _chunks(rank, world_size, seqlen, layout):
    if layout == "contiguous":
        return [_Chunk(rank * seqlen, 0, seqlen)]
    half = seqlen // 2
    return [_Chunk(rank * half, 0, half), _Chunk((2 * world_size - 1 - rank) * half, half, half)]


def _band_block(queries, keys, window):
    """The block for the chunk pair (queries, keys) when the query at position p sees the keys at
    p - left .. p + right (-1 unbounded), or None if it sees none of them. flashhop has no argument for
    the chunks' positions, but its band is aligned to the bottom-right corner of the call: the block
    is the bounding box of the visible pairs, whose bottom-right corner always lies on the band (the
    last query of the box sees the last key of the box, or the box would end earlier), and its window
    is the band's edges taken relative to that corner."""
    left, right = (math.inf if width < 0 else width for width in window)
    # Visible pairs (i, j) of chunk-local indices: low <= j - i <= high.
    low, high = queries.start - keys.start - left, queries.start - keys.start + right
    q_begin, q_end = max(0, -high), min(queries.length, keys.length - low)
    k_begin, k_end = max(0, low), min(keys.length, queries.length + high)
    if q_begin >= q_end or k_begin >= k_end:
        return None
    corner = k_end - q_end  # j - i at the box's bottom-right corner: the diagonal the call's window is measured from
    block_left, block_right = corner - low, high - corner
    # Widths that reach past the block are unbounded, so that fully visible blocks run unmasked.
    block_window = (-1 if block_left >= k_end - k_begin - 1 else int(block_left),
                    -1 if block_right >= q_end - q_begin - 1 else int(block_right))
    return _Block(slice(queries.local + q_begin, queries.local + q_end),
                  slice(keys.local + k_begin, keys.local + k_end), block_window)


def _ring_blocks(rank, source, world_size, seqlen, window, layout):
    """The blocks that the queries of `rank` attend to in the K/V shard of `source`. Without a window
    every pair of shards is at most one call: for non-causal attention the whole shards; for causal,
    the rank's own shard is the causal diagonal (seqlen_q == seqlen_k), and with the contiguous
    layout an earlier shard is fully visible and a later one hidden. In the zigzag layout (chunks r
    and 2W-1-r of 2W), an earlier rank's first chunk lies before both local chunks and its second
    after both: all local queries see the first half of its shard; a later rank's chunks both lie
    between the local ones: the second half of the local queries sees all of its shard. With a
    window, one block per pair of chunks."""
    if window == _FULL:
        return [_Block(_ALL, _ALL, _FULL)]
    if window != _CAUSAL:
        return [block for queries in _chunks(rank, world_size, seqlen, layout)
                for keys in _chunks(source, world_size, seqlen, layout)
                if (block := _band_block(queries, keys, window)) is not None]
    if source == rank:
        return [_Block(_ALL, _ALL, _CAUSAL)]
    if layout == "contiguous":
        return [_Block(_ALL, _ALL, _FULL)] if source < rank else []
    half = seqlen // 2
    if source < rank:
        return [_Block(_ALL, slice(0, half), _FULL)]
    return [_Block(slice(half, None), _ALL, _FULL)]


def _accumulator_dtype(tensor):
    """fp32 for the kernels' 16-bit dtypes; wider inputs (a reference backend's) keep their precision."""
    return torch.promote_types(tensor.dtype, torch.float32)


def _merge(out, lse, block_out, block_lse):
    """out, lse (the accumulators, updated in place) <- the attention over the keys of both: lse the
    log-sum-exp of the two, out the two outputs weighted by exp(their lse - lse)."""
    merged = torch.logaddexp(lse, block_lse)
    # Rows that saw no key in either stay at lse = -inf and out = 0 rather than exp(-inf + inf) = NaN.
    shift = merged.masked_fill(merged == float("-inf"), 0.0)

    def weight(part_lse):
        return torch.exp(part_lse - shift).transpose(1, 2).unsqueeze(-1)  # (batch, seqlen, nheads, 1)

    out.mul_(weight(lse)).add_(block_out.to(out.dtype) * weight(block_lse))
    lse.copy_(merged)


def _empty_result(q, v):
    """out = 0 and lse = -inf (no key seen yet) in the accumulators' dtype."""
    batch, seqlen_q, nheads, _ = q.shape
    accumulator = _accumulator_dtype(q)
    out = q.new_zeros((batch, seqlen_q, nheads, v.shape[3]), dtype=accumulator)
    lse = q.new_full((batch, nheads, seqlen_q), float("-inf"), dtype=accumulator)
    return out, lse


def _ring_forward(ring, backend, q, k, v, window, layout):
    out, lse = _empty_result(q, v)
    kv = (k, v)
    for step in range(ring.world_size):
        source = (ring.rank - step) % ring.world_size
        if step + 1 < ring.world_size:
            transfer = ring.exchange(kv)
        for block in _ring_blocks(ring.rank, source, ring.world_size, q.shape[1], window, layout):
            rows, keys = block.queries, block.keys
            block_out, block_lse = backend.forward(q[:, rows], kv[0][:, keys], kv[1][:, keys], block.window)
            _merge(out[:, rows], lse[:, :, rows], block_out, block_lse)
        if step + 1 < ring.world_size:
            kv = transfer.wait()
    return out.to(q.dtype), lse


def _ring_backward(ring, backend, dout, q, k, v, out, lse, window, layout):
    """dq accumulates here in fp32; the gradients of the K/V shard in hand accumulate in fp32 buffers
    that follow the shard round the ring, one step behind it, and reach its owner after the last step."""
    dq = torch.zeros_like(q, dtype=_accumulator_dtype(q))
    kv = (k, v)
    for step in range(ring.world_size):
        source = (ring.rank - step) % ring.world_size
        if step + 1 < ring.world_size:
            kv_transfer = ring.exchange(kv)
        # Computed before the gradients of this shard arrive from the previous rank, which they overlap.
        block_grads = []
        for block in _ring_blocks(ring.rank, source, ring.world_size, q.shape[1], window, layout):
            rows, keys = block.queries, block.keys
            block_dq, block_dk, block_dv = backend.backward(dout[:, rows], q[:, rows], kv[0][:, keys],
                                                            kv[1][:, keys], out[:, rows], lse[:, :, rows],
                                                            block.window)
            dq[:, rows] += block_dq
            block_grads.append((keys, block_dk, block_dv))
        if step == 0:
            dk, dv = (torch.zeros_like(t, dtype=_accumulator_dtype(t)) for t in kv)
        else:
            dk, dv = dkv_transfer.wait()
        for keys, block_dk, block_dv in block_grads:
            dk[:, keys] += block_dk
            dv[:, keys] += block_dv
        dkv_transfer = ring.exchange((dk, dv))
        if step + 1 < ring.world_size:
            kv = kv_transfer.wait()
    dk, dv = dkv_transfer.wait()
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, ring, backend, window, layout):
        out, lse = _ring_forward(ring, backend, q, k, v, window, layout)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.schedule = (ring, backend, window, layout)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        ring, backend, window, layout = ctx.schedule
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _ring_backward(ring, backend, dout, q, k, v, out, lse, window, layout)
        return dq, dk, dv, None, None, None, None


def _gathered_blocks(rank, world_size, seqlen, window, layout):
    """The blocks of the all-gather method, the keys being those of the whole sequence in order: one
    call without a mask, else one per local chunk (causal: the keys up to the chunk's end)."""
    if window == _FULL:
        return [_Block(_ALL, _ALL, _FULL)]
    sequence = _Chunk(0, 0, world_size * seqlen)
    return [block for queries in _chunks(rank, world_size, seqlen, layout)
            if (block := _band_block(queries, sequence, window)) is not None]


def _all_gather_forward(ring, backend, q, k, v, window, layout):
    k_full, v_full = (_unshard(ring.all_gather(t), 1, layout) for t in (k, v))
    out, lse = _empty_result(q, v)
    for block in _gathered_blocks(ring.rank, ring.world_size, q.shape[1], window, layout):
        rows, keys = block.queries, block.keys
        out[:, rows], lse[:, :, rows] = backend.forward(q[:, rows], k_full[:, keys], v_full[:, keys], block.window)
    return out.to(q.dtype), lse, k_full, v_full


def _all_gather_backward(ring, backend, dout, q, k_full, v_full, out, lse, window, layout):
    dq = torch.zeros_like(q)
    dk_full, dv_full = (torch.zeros_like(t, dtype=_accumulator_dtype(t)) for t in (k_full, v_full))
    for block in _gathered_blocks(ring.rank, ring.world_size, q.shape[1], window, layout):
        rows, keys = block.queries, block.keys
        dq[:, rows], dk, dv = backend.backward(dout[:, rows], q[:, rows], k_full[:, keys], v_full[:, keys],
                                               out[:, rows], lse[:, :, rows], block.window)
        dk_full[:, keys] += dk
        dv_full[:, keys] += dv
    dk, dv = (ring.reduce_scatter([_shard(t, 1, r, ring.world_size, layout) for r in range(ring.world_size)])
              for t in (dk_full, dv_full))
    return dq, dk.to(k_full.dtype), dv.to(v_full.dtype)


class _AllGatherAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, ring, backend, window, layout):
        out, lse, k_full, v_full = _all_gather_forward(ring, backend, q, k, v, window, layout)
        # The gathered K and V are kept for the backward rather than gathered again.
        ctx.save_for_backward(q, k_full, v_full, out, lse)
        ctx.schedule = (ring, backend, window, layout)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        ring, backend, window, layout = ctx.schedule
        q, k_full, v_full, out, lse = ctx.saved_tensors
        dq, dk, dv = _all_gather_backward(ring, backend, dout, q, k_full, v_full, out, lse, window, layout)
        return dq, dk, dv, None, None, None, None


def _all_gather_pays(q, k, v, world_size):
    """The all-gather method when K and V of the whole sequence take no more memory than the local
    Q (GQA with few KV heads, few ranks). Both methods move the same bytes; the all-gather makes
    fewer, larger calls but holds the whole K and V and does not overlap the transfer."""
    return world_size * k.shape[2] * (k.shape[3] + v.shape[3]) <= q.shape[2] * q.shape[3]


def ring_flash_attn_func(q, k, v, group=None, softmax_scale=None, causal=False, softcap=0.0, deterministic=False,
                         return_attn_probs=False, layout="zigzag", *, window_size=(-1, -1), method="auto",
                         backend=FlashhopBackend):
    """Exact attention over a sequence sharded across the ranks of `group`, in FlashAttention's layout;
    the arguments and the result are this rank's shards.

    q: (batch, seqlen, nheads, head_dim); k: (batch, seqlen, nheads_kv, head_dim); v: (batch, seqlen,
    nheads_kv, head_dim_v): the rank's shard of the sequence, of the same length on every rank, in
    `layout`: "zigzag" (zigzag_shard: every rank has the same causal work; seqlen must be even) or
    "contiguous" (rank r holds positions [r * seqlen, (r + 1) * seqlen)). Differentiable: the
    gradients of k and v reach the rank that holds them.
    group: a torch.distributed process group (default: the world), or an object with the interface of
    ProcessGroupRing.
    softmax_scale, causal, window_size, softcap, deterministic: as flash_attn_func, over the whole
    sequence (queries and keys of one sequence, so the masks' alignment does not matter).
    method: "ring" passes the K/V shards round the ring, overlapped with the attention; "all_gather"
    gathers the whole K and V on every rank once (suits GQA with few KV heads); "auto" chooses the
    all-gather when the whole K and V take no more memory than the local Q.
    backend: called with (softmax_scale, softcap, deterministic), it gives the object that computes
    each block (FlashhopBackend's interface); the default runs flashhop's operators on CUDA tensors.
    Returns out (batch, seqlen, nheads, head_dim_v), and with return_attn_probs also softmax_lse
    (batch, nheads, seqlen) in float32, as flash_attn_func.
    """
    window = tuple(window_size)
    if len(window) != 2 or any(width < -1 for width in window):
        raise ValueError(f"flashhop: window_size = {window}: expected (left, right), each -1 (unbounded) or >= 0")
    if causal:
        window = (window[0], 0)  # as flash_attn_func
    if layout not in LAYOUTS:
        raise ValueError(f"flashhop: layout = {layout!r}: expected one of {LAYOUTS}")
    if method not in METHODS:
        raise ValueError(f"flashhop: method = {method!r}: expected one of {METHODS}")
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if tensor.dim() != 4:
            raise ValueError(f"flashhop: {name}.rank = {tensor.dim()}: expected 4 (batch, seqlen, nheads, head_dim)")
    if k.shape[1] != q.shape[1] or v.shape[1] != q.shape[1]:
        raise ValueError(f"flashhop: seqlen of q, k, v = {q.shape[1]}, {k.shape[1]}, {v.shape[1]}: expected shards "
                         "of one sequence, of equal length")
    if layout == "zigzag" and q.shape[1] % 2 != 0:
        raise ValueError(f"flashhop: q.shape[1] = {q.shape[1]}: the zigzag layout holds two equal chunks per rank; "
                         "expected an even seqlen")
    ring = group if hasattr(group, "exchange") else ProcessGroupRing(group)
    if method == "auto":
        method = "all_gather" if _all_gather_pays(q, k, v, ring.world_size) else "ring"
    function = _AllGatherAttention if method == "all_gather" else _RingAttention
    out, lse = function.apply(q, k, v, ring, backend(softmax_scale, softcap, deterministic), window, layout)
    return (out, lse) if return_attn_probs else out
