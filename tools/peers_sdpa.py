#!/usr/bin/env python3
"""Times PyTorch scaled_dot_product_attention (cuDNN and FlashAttention-2 backends) on the grid of
`flashhop-bench --sweep peers`, in the same way, and prints one side-by-side table.

Grid (PEERS.md): d in {64, 128, 256}, nheads = 2048 / d, seqlen in {512, ..., 16384} with
batch = 16384 / seqlen, causal no / yes, bf16, layout (batch, seqlen, nheads, d) as flashhop takes it,
handed to SDPA as (batch, nheads, seqlen, d) views (transpose(1, 2), no copy).

Method (the tool library's device/METHOD.md, as flashhop-bench): random normal inputs, as many input
sets as it takes to exceed three times the L2 cache, rotated between calls; warm-up calls, then one
CUDA event pair around each timed call and the median. TFLOP/s with the FlashAttention convention,
4 * b * h * sq * sk * d, half for causal. SDPA's causal mask is aligned to the top-left corner,
flashhop's to the bottom-right; they are the same mask when seqlen_q == seqlen_k, which holds on
this grid.

With --flashhop-json FILE (flashhop-bench --json output) the table gets a flashhop column and
flashhop / best peer. Runs on the GPU machine: python3 with torch, nothing else.
"""
import argparse
import json
import math
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "fa2": SDPBackend.FLASH_ATTENTION}
BACKEND_TITLES = {"cudnn": "cuDNN", "fa2": "FA2"}
L2_MULTIPLE = 3  # rotated inputs span at least this many L2 caches
MAX_INPUT_SETS = 64
GEMM_SIZE = 8192


def peers_grid(head_dims, seqlens):
    for head_dim in head_dims:
        for causal in (False, True):
            for seqlen in seqlens:
                yield {"batch": 16384 // seqlen, "seqlen_q": seqlen, "seqlen_k": seqlen,
                       "nheads": 2048 // head_dim, "nheads_kv": 2048 // head_dim,
                       "head_dim": head_dim, "dtype": "bf16", "causal": causal}


def forward_flops(c):
    pairs = c["seqlen_q"] * c["seqlen_k"] / (2 if c["causal"] else 1)
    return 4.0 * c["batch"] * c["nheads"] * pairs * c["head_dim"]


def median_time_ms(launch, warmup, iters):
    """Median of `iters` event-timed calls of launch(i) after `warmup` untimed ones."""
    for i in range(warmup):
        launch(i)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(iters)]
    for i, (start, stop) in enumerate(events):
        start.record()
        launch(warmup + i)
        stop.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(stop) for start, stop in events)


def gemm_tflops(warmup, iters):
    a = torch.randn(GEMM_SIZE, GEMM_SIZE, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(GEMM_SIZE, GEMM_SIZE, device="cuda", dtype=torch.bfloat16)
    ms = median_time_ms(lambda i: torch.matmul(a, b), warmup, iters)
    return 2.0 * GEMM_SIZE ** 3 / (ms * 1e-3) / 1e12


def input_sets(c, l2_bytes):
    """Random (q, k, v) sets in flashhop's layout, enough of them to defeat the L2 cache."""
    b, s, h, d = c["batch"], c["seqlen_q"], c["nheads"], c["head_dim"]
    set_bytes = 4 * b * s * h * d * 2  # q, k, v and the output, bf16
    count = max(1, min(MAX_INPUT_SETS, math.ceil(L2_MULTIPLE * l2_bytes / set_bytes)))
    return [tuple(torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            for _ in range(count)]


def time_backend(backend, c, sets, warmup, iters):
    views = [tuple(t.transpose(1, 2) for t in qkv) for qkv in sets]  # (b, h, s, d), no copy

    def launch(i):
        q, k, v = views[i % len(views)]
        F.scaled_dot_product_attention(q, k, v, is_causal=c["causal"])

    with sdpa_kernel(BACKENDS[backend]):
        return median_time_ms(launch, warmup, iters)


def config_key(c):
    return (c["head_dim"], bool(c["causal"]), c["seqlen_q"], c["seqlen_k"], c["batch"], c["nheads"],
            c["nheads_kv"])


def load_flashhop(path):
    with open(path) as f:
        report = json.load(f)
    return {config_key(r["config"]): r for r in report["results"]}, report


def markdown_table(results, flashhop):
    lines = ["| d | causal | seqlen (batch) | flashhop | cuDNN | FA2 | flashhop / best peer |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        c = r["config"]
        peers = [r["backends"][name].get("tflops") for name in BACKENDS]
        cells = [f"{t:.0f}" if t is not None else "error" for t in peers]
        ours = flashhop.get(config_key(c)) if flashhop is not None else None
        if ours is None:
            ours_cell, ratio_cell = "-", "-"
        elif ours["status"] != "ok":
            ours_cell, ratio_cell = "error", "-"
        else:
            failed = ours.get("check") is not None and not ours["check"]["passed"]
            ours_cell = f"{ours['tflops']:.0f}" + (" (check FAILED)" if failed else "")
            best = max((t for t in peers if t is not None), default=None)
            ratio_cell = f"{ours['tflops'] / best:.2f}" if best else "-"
        lines.append(f"| {c['head_dim']} | {'yes' if c['causal'] else 'no'} | "
                     f"{c['seqlen_q']} ({c['batch']}) | {ours_cell} | {cells[0]} | {cells[1]} | {ratio_cell} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="OUT", help="write every result as JSON")
    parser.add_argument("--flashhop-json", metavar="FILE", help="flashhop-bench --json output to merge")
    parser.add_argument("--head-dims", default="64,128,256", help="subset of the grid's head dims")
    parser.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384",
                        help="subset of the grid's sequence lengths")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--iters", type=int, default=50)
    args = parser.parse_args()

    if not torch.cuda.is_available():
        sys.exit("peers_sdpa.py: no CUDA device visible to torch")
    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    l2_bytes = getattr(props, "L2_cache_size", 50 << 20)
    print(f"device: {props.name}, {props.multi_processor_count} SMs, L2 {l2_bytes >> 20} MiB; "
          f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}")
    gemm = gemm_tflops(args.warmup, args.iters)
    print(f"torch.matmul bf16 {GEMM_SIZE}^3: {gemm:.1f} TFLOP/s (median)\n", flush=True)

    head_dims = [int(x) for x in args.head_dims.split(",")]
    seqlens = [int(x) for x in args.seqlens.split(",")]
    results = []
    for c in peers_grid(head_dims, seqlens):
        sets = input_sets(c, l2_bytes)
        entry = {"config": c, "input_sets": len(sets), "backends": {}}
        for name in BACKENDS:
            try:
                ms = time_backend(name, c, sets, args.warmup, args.iters)
                entry["backends"][name] = {"ms": ms, "tflops": forward_flops(c) / (ms * 1e-3) / 1e12}
            except RuntimeError as error:  # e.g. no kernel of this backend for the configuration
                torch.cuda.synchronize()
                entry["backends"][name] = {"error": str(error).splitlines()[0]}
        del sets
        results.append(entry)
        cells = "  ".join(f"{BACKEND_TITLES[n]} " + (f"{r['ms']:.3f} ms {r['tflops']:.1f} TFLOP/s"
                                                     if "tflops" in r else f"ERROR {r['error']}")
                          for n, r in entry["backends"].items())
        print(f"d={c['head_dim']} causal={'yes' if c['causal'] else 'no'} s={c['seqlen_q']} "
              f"b={c['batch']} h={c['nheads']}: {cells}", flush=True)

    flashhop = None
    if args.flashhop_json:
        flashhop, report = load_flashhop(args.flashhop_json)
        print(f"\nflashhop-bench's cuBLAS bf16 GEMM: {report['gemm']['tflops']} TFLOP/s")
    print("\nTFLOP/s, forward, bf16:\n")
    print(markdown_table(results, flashhop))

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tool": "peers_sdpa.py", "device": props.name, "torch": torch.__version__,
                       "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
                       "gemm_bf16_tflops": gemm, "warmup": args.warmup, "iters": args.iters,
                       "results": results}, f, indent=1)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
