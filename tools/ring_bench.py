#!/usr/bin/env python3
"""Times flashhop.distributed.ring_flash_attn_func on the GPUs of one machine against flashhop's
attention of the whole sequence on one GPU, and prints the scaling.

    torchrun --nproc-per-node 2 tools/ring_bench.py                  # 1M-token causal prefill
    torchrun --nproc-per-node 4 tools/ring_bench.py --mode fwd_bwd --seqlen 262144

Default case (issue 67): batch 1, seqlen 1,048,576 (the whole sequence), 32 query / 8 KV heads,
d = 128, bf16, causal, zigzag layout; --method ring, all_gather or auto (the library's choice).

Method: each rank draws its shard of normal inputs; per timed call, every rank synchronises its
GPU and meets the others at a barrier, then one CUDA event pair brackets the call on each rank
(forward, or forward and backward with a normal output gradient). The per-rank time is the median
over --iters calls after --warmup untimed ones; the step time is the slowest rank's median. The
baseline is flash_attn_func (and its backward) on the whole sequence on rank 0's GPU, timed the same
way while the other ranks wait (--no-baseline skips it: at 1M tokens it takes about 13 s per
forward on an H100). Speed-up = baseline / step time; efficiency = speed-up / ranks. TFLOP/s per
GPU: the forward's 4 * batch * nheads * seqlen^2 * d (2.5 times that more for the backward), halved
for causal, divided among the ranks. A timeline: `nsys profile -t cuda,nvtx,nccl torchrun ...`
(flashhop's kernels carry NVTX ranges of the domain flashhop).
"""
import argparse
import json
import os
import statistics

import torch
import torch.distributed as dist

import flashhop
import flashhop.distributed as fd


def timed_ms(run, warmup, iters, together=True):
    """Median milliseconds of run() on this rank; together: every call started together on all ranks."""
    times = []
    for i in range(warmup + iters):
        torch.cuda.synchronize()
        if together:
            dist.barrier()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        run()
        end.record()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(begin.elapsed_time(end))
    return statistics.median(times)


def attention_call(attention, q, k, v, backward):
    """A call of attention(q, k, v): the forward, or the forward and backward with a fixed gradient."""
    if not backward:
        def forward():
            with torch.no_grad():
                attention(q, k, v)
        return forward
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    dout = torch.randn(*q.shape[:3], v.shape[3], device=q.device, dtype=q.dtype)

    def forward_backward():
        torch.autograd.grad(attention(q, k, v), (q, k, v), dout)
    return forward_backward


def flops(args, backward):
    forward = 4 * args.batch * args.nheads * args.seqlen**2 * args.head_dim / (2 if args.causal else 1)
    return forward * (3.5 if backward else 1.0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seqlen", type=int, default=1 << 20, help="the whole sequence's length")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--nheads", type=int, default=32)
    parser.add_argument("--nheads-kv", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--no-causal", dest="causal", action="store_false")
    parser.add_argument("--layout", choices=fd.LAYOUTS, default="zigzag")
    parser.add_argument("--method", choices=fd.METHODS, default="ring")
    parser.add_argument("--mode", choices=("fwd", "fwd_bwd", "both"), default="both")
    parser.add_argument("--no-baseline", dest="baseline", action="store_false")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--json", metavar="OUT", help="write the results as JSON (rank 0)")
    args = parser.parse_args()

    dist.init_process_group("nccl")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    if args.seqlen % (2 * world_size) != 0:
        parser.error(f"--seqlen {args.seqlen}: expected a multiple of 2 * world_size = {2 * world_size}")
    local = args.seqlen // world_size
    generator = torch.Generator("cuda").manual_seed(rank)

    def randn(seqlen, heads):
        return torch.randn(args.batch, seqlen, heads, args.head_dim, device="cuda", dtype=torch.bfloat16,
                           generator=generator)

    def ring(q, k, v):
        return fd.ring_flash_attn_func(q, k, v, causal=args.causal, layout=args.layout, method=args.method)

    def whole(q, k, v):
        return flashhop.flash_attn_func(q, k, v, causal=args.causal)

    results = []
    for backward in {"fwd": [False], "fwd_bwd": [True], "both": [False, True]}[args.mode]:
        mode = "fwd_bwd" if backward else "fwd"
        shard = (randn(local, args.nheads), randn(local, args.nheads_kv), randn(local, args.nheads_kv))
        rank_ms = timed_ms(attention_call(ring, *shard, backward), args.warmup, args.iters)
        del shard
        every_rank_ms = [None] * world_size
        dist.all_gather_object(every_rank_ms, rank_ms)
        baseline_ms = None
        if args.baseline and rank == 0:
            inputs = (randn(args.seqlen, args.nheads), randn(args.seqlen, args.nheads_kv),
                      randn(args.seqlen, args.nheads_kv))
            baseline_ms = timed_ms(attention_call(whole, *inputs, backward), args.warmup, args.iters, together=False)
            del inputs
        dist.barrier()  # the other ranks wait while rank 0 times the whole sequence
        if rank == 0:
            step_ms = max(every_rank_ms)
            result = dict(vars(args), mode=mode, world_size=world_size, rank_ms=every_rank_ms, step_ms=step_ms,
                          tflops_per_gpu=flops(args, backward) / world_size / step_ms / 1e9,
                          device=torch.cuda.get_device_name(), torch=torch.__version__)
            line = (f"{mode:8} {world_size} GPUs, seqlen {args.seqlen}: ranks "
                    f"{', '.join(f'{t:.1f}' for t in every_rank_ms)} ms, step {step_ms:.1f} ms, "
                    f"{result['tflops_per_gpu']:.0f} TFLOP/s per GPU")
            if baseline_ms is not None:
                result.update(baseline_ms=baseline_ms, speedup=baseline_ms / step_ms,
                              efficiency=baseline_ms / step_ms / world_size)
                line += (f"; one GPU {baseline_ms:.1f} ms: speed-up {result['speedup']:.2f}x "
                         f"(efficiency {result['efficiency']:.0%})")
            print(line, flush=True)
            results.append(result)
    if rank == 0 and args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
