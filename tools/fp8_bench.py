#!/usr/bin/env python3
"""FP8 forward beside FlashAttention-3's FP8 forward (the fa3-fwd wheel) in one run, on the peers
grid: d 64 / 128 / 256 (nheads * d = 2048), causal and not, seqlen 512 .. 16k at 16k tokens
(batch = 16384 / seqlen), e4m3 q, k, v with per-(batch, KV head) descales, bfloat16 out; flashhop's
FP8 with block scales (one per 128 rows of a head) and its bf16 forward of the same shape alongside. CUDA-graph replays, median of --iters after --warmup-ms;
FLOPs 4 * batch * nheads * seqlen^2 * d (halved with causal). Prints a markdown table (TFLOP/s)
and writes --json.

  PYTHONPATH=<flashhop>:<fa3 wheel> python3 tools/fp8_bench.py [--seqlens 512,...] [--json F]
"""
import argparse
import json

import torch

import flashhop
from decode_bench import fa3_fwd_interface, time_graphed


def cell(head_dim, causal, seqlen, args):
    batch, nheads = 16384 // seqlen, 2048 // head_dim
    generator = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=generator)
    q16, k16, v16 = (randn(batch, seqlen, nheads, head_dim) for _ in range(3))
    q, k, v = (t.to(torch.float8_e4m3fn) for t in (q16, k16, v16))
    descale = torch.ones(batch, nheads, device="cuda", dtype=torch.float32)
    block_scale = torch.ones(batch, nheads, (seqlen + 127) // 128, device="cuda", dtype=torch.float32)
    flops = 4 * batch * nheads * seqlen * seqlen * head_dim / (2 if causal else 1)
    results = {}
    calls = {
        "flashhop fp8": lambda: flashhop.flash_attn_func(q, k, v, causal=causal, q_descale=descale,
                                                         k_descale=descale, v_descale=descale),
        "flashhop fp8 block": lambda: flashhop.flash_attn_func(q, k, v, causal=causal, q_block_scale=block_scale,
                                                               k_block_scale=block_scale, v_block_scale=block_scale),
        "flashhop bf16": lambda: flashhop.flash_attn_func(q16, k16, v16, causal=causal),
    }
    if fa3_fwd_interface is not None:
        calls["FA3 fp8"] = lambda: fa3_fwd_interface.flash_attn_func(q, k, v, causal=causal, q_descale=descale,
                                                                     k_descale=descale, v_descale=descale)
    for name, call in calls.items():
        timed = time_graphed(name, call, args)
        results[name] = None if timed is None else flops / (timed[0] * 1e-3) / 1e12
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384")
    parser.add_argument("--head-dims", default="64,128,256")
    parser.add_argument("--warmup-ms", type=float, default=500.0)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    print(f"{torch.cuda.get_device_name()}; TFLOP/s, CUDA-graph replays")
    names = ["flashhop fp8", "FA3 fp8", "flashhop fp8 block", "flashhop bf16"]
    print("| d | causal | seqlen (batch) | " + " | ".join(names) + " | fp8 / FA3 fp8 | block / per head |")
    print("|---|---|---|" + "---|" * (len(names) + 2))
    rows = []
    for head_dim in map(int, args.head_dims.split(",")):
        for causal in (False, True):
            for seqlen in map(int, args.seqlens.split(",")):
                r = cell(head_dim, causal, seqlen, args)
                rows.append({"head_dim": head_dim, "causal": causal, "seqlen": seqlen, **r})
                value = [f"{r[n]:.0f}" if r.get(n) else "n/a" for n in names]
                ratios = [f"{r[a] / r[b]:.3f}" if r.get(a) and r.get(b) else "n/a"
                          for a, b in (("flashhop fp8", "FA3 fp8"), ("flashhop fp8 block", "flashhop fp8"))]
                print(f"| {head_dim} | {causal} | {seqlen} ({16384 // seqlen}) | " + " | ".join(value + ratios) + " |",
                      flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
