#!/usr/bin/env python3
"""Times the backward pass of flashhop (torch.ops.flashhop.bwd) beside FlashAttention-3's backward
(where its package, flash_attn_interface, imports) and PyTorch SDPA's cuDNN and FlashAttention-2
backends, in one run, on the grid of the peers sweep, and prints one table.

Grid (PEERS.md), bf16, layout (batch, seqlen, nheads, d): d in {64, 128, 256} (those with backward
kernels), nheads = 2048 / d, seqlen in {512, ..., 16384} with batch = 16384 / seqlen, causal no / yes.

Method: fresh normal inputs per cell; the forward runs once untimed (flashhop's forward gives out
and LSE; SDPA's keeps its autograd graph); then warm-up calls (by count and at least --warmup-ms of
wall clock) and --iters timed calls of the backward alone, one CUDA event pair each, the median
reported. flashhop's call is torch.ops.flashhop.bwd on the saved tensors; SDPA's is
torch.autograd.grad of its output with retain_graph, which runs the backend's backward kernels
(and the small reductions autograd adds); FlashAttention-3's is its _flash_attn_backward on its own
forward's out and LSE, into preallocated gradients. TFLOP/s: 2.5 x the forward's 4 * b * h * sq * sk * d,
halved for causal (FlashAttention's convention). Each peer's dq is compared with flashhop's (the
largest absolute difference is printed), so that a column computing something else shows.
Runs on the GPU machine: python3 with torch and the flashhop package importable.
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashhop

SDPA_BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "fa2": SDPBackend.FLASH_ATTENTION}
try:
    import flash_attn_interface as fa3
except ImportError:
    fa3 = None


def cells(head_dims, seqlens):
    for d in head_dims:
        for seqlen in seqlens:
            for causal in (False, True):
                yield {"head_dim": d, "nheads": 2048 // d, "seqlen": seqlen, "batch": 16384 // seqlen, "causal": causal}


def backward_flops(c):
    forward = 4 * c["batch"] * c["nheads"] * c["seqlen"] * c["seqlen"] * c["head_dim"]
    return 2.5 * forward / (2 if c["causal"] else 1)


def median_ms(launch, warmup, iters, warmup_ms):
    for _ in range(warmup):
        launch()
    torch.cuda.synchronize()
    start = time.perf_counter()
    while (time.perf_counter() - start) * 1e3 < warmup_ms:
        launch()
        torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for begin, end in events:
        begin.record()
        launch()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(begin.elapsed_time(end) for begin, end in events)


def time_cell(c, backends, warmup, iters, warmup_ms):
    shape = (c["batch"], c["seqlen"], c["nheads"], c["head_dim"])
    q, k, v, dout = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    result = dict(c)
    out, lse = torch.ops.flashhop.fwd(q, k, v, None, c["causal"], -1, 0 if c["causal"] else -1, 0.0, None, False)
    options = (None, c["causal"], -1, 0 if c["causal"] else -1, 0.0)

    def flashhop_backward():
        return torch.ops.flashhop.bwd(dout, q, k, v, out, lse, *options, False)

    try:
        ours = flashhop_backward()
        ms = median_ms(flashhop_backward, warmup, iters, warmup_ms)
        result["flashhop"] = {"ms": ms, "tflops": backward_flops(c) / ms / 1e9}
    except (NotImplementedError, RuntimeError, ValueError) as error:
        result["flashhop"] = {"error": str(error).splitlines()[0]}
        ours = None
    for backend in backends:
        if backend == "fa3":
            result[backend] = fa3_entry(c, q, k, v, dout, ours, warmup, iters, warmup_ms)
            continue
        inputs = [t.transpose(1, 2).detach().requires_grad_() for t in (q, k, v)]
        grad = dout.transpose(1, 2)
        try:
            with sdpa_kernel(SDPA_BACKENDS[backend]):
                peer_out = F.scaled_dot_product_attention(*inputs, is_causal=c["causal"])

                def peer_backward():
                    return torch.autograd.grad(peer_out, inputs, grad, retain_graph=True)

                grads = peer_backward()
                ms = median_ms(peer_backward, warmup, iters, warmup_ms)
            entry = {"ms": ms, "tflops": backward_flops(c) / ms / 1e9}
            if ours is not None:
                entry["max_dq_difference"] = (grads[0].transpose(1, 2).float() - ours[0].float()).abs().max().item()
            result[backend] = entry
        except RuntimeError as error:
            result[backend] = {"error": str(error).splitlines()[0]}
        del inputs
    return result


def fa3_entry(c, q, k, v, dout, ours, warmup, iters, warmup_ms):
    if fa3 is None:
        return {"error": "flash_attn_interface (FlashAttention-3) does not import"}
    out, lse = fa3.flash_attn_func(q, k, v, causal=c["causal"], return_attn_probs=True)
    grads = [torch.empty_like(t) for t in (q, k, v)]

    def fa3_backward():
        fa3._flash_attn_backward(dout, q, k, v, out, lse, None, None, None, None, None, None, *grads,
                                 None, c["causal"], -1, -1)

    fa3_backward()
    entry = {"ms": median_ms(fa3_backward, warmup, iters, warmup_ms)}
    entry["tflops"] = backward_flops(c) / entry["ms"] / 1e9
    if ours is not None:
        entry["max_dq_difference"] = (grads[0].float() - ours[0].float()).abs().max().item()
    return entry


def cell_text(entry):
    return f"{entry['tflops']:.0f}" if "tflops" in entry else "n/a"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--head-dims", default="64,128,256")
    parser.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384")
    parser.add_argument("--backends", default="fa3,cudnn,fa2")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--warmup-ms", type=float, default=0.0)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--json", metavar="OUT", help="write every result as JSON")
    args = parser.parse_args()
    backends = [b for b in args.backends.split(",") if b]
    grid = list(cells([int(d) for d in args.head_dims.split(",")], [int(s) for s in args.seqlens.split(",")]))
    print(f"# backward, bf16, {torch.cuda.get_device_name()}, TFLOP/s (2.5 x forward FLOPs)")
    print("| d | causal | seqlen | flashhop | " + " | ".join(backends) + " | flashhop / best peer | max dq diff |")
    print("|---|---|---|---|" + "---|" * len(backends) + "---|---|")
    results = []
    for i, c in enumerate(grid):
        r = time_cell(c, backends, args.warmup, args.iters, args.warmup_ms)
        results.append(r)
        peers = [r[b]["tflops"] for b in backends if "tflops" in r[b]]
        ratio = (f"{r['flashhop']['tflops'] / max(peers):.2f}" if peers and "tflops" in r["flashhop"] else "n/a")
        differences = [f"{r[b]['max_dq_difference']:.2g}" for b in backends if "max_dq_difference" in r[b]]
        print(f"| {c['head_dim']} | {'yes' if c['causal'] else 'no'} | {c['seqlen']} | {cell_text(r['flashhop'])} | "
              + " | ".join(cell_text(r[b]) for b in backends) + f" | {ratio} | {', '.join(differences)} |", flush=True)
        for name in ["flashhop"] + backends:
            if "error" in r[name]:
                print(f"  {name}: {r[name]['error']}", flush=True)
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"device": torch.cuda.get_device_name(), "results": results}, out, indent=1)


if __name__ == "__main__":
    main()
