#!/usr/bin/env python3
"""Times flashhop.quantize_fp8 (bf16 / fp16 to e4m3 with its descale) on the GPU machine, beside a
device-to-device copy of the same tensor in the same run, and prints a markdown table.

For each shape (--shapes, default (1, 16384, 32, 128) and (4, 8192, 8, 128)) and dtype: torch's
x.clone(), then quantize_fp8 with each scaling (per_tensor, per_head, per_block), without and with
the Hadamard rotation (flashhop.hadamard_signs), and torch's own per-tensor quantization (amax,
scale, clamp, cast) as a peer. Every call is captured in a CUDA graph and the timed calls replay it
(host time is not what is measured); the median of event-timed replays after a warm-up of at least
--warmup-ms. Bandwidth counts the bytes a call must read and write, once each: x (2 bytes an
element) and the e4m3 values (1 byte) and descale for the quantizations, x twice for the copy. The
last column is the quantization's bandwidth over the copy's. The per-tensor and per-head scales
read x twice (an amax pass, then the quantization: docs/DESIGN.md), so at these sizes, larger
than the L2 cache, they cannot pass about 60% of the copy's figure; per_block reads x once.
--json FILE keeps the results.
"""
import argparse
import json
import subprocess

import torch

import flashhop
from decode_bench import graphed, median_ms

SCALINGS = ("per_tensor", "per_head", "per_block")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def torch_per_tensor(x):
    """PyTorch's per-tensor e4m3 quantization: descale = amax / 448, values clamped, then cast."""
    descale = (x.abs().amax().float() / 448).clamp(min=torch.finfo(torch.float32).tiny)
    return (x.float() / descale).clamp(-448, 448).to(torch.float8_e4m3fn), descale


def parse_shapes(text):
    shapes = []
    for item in text.split(","):
        shape = tuple(int(size) for size in item.lower().split("x"))
        if len(shape) != 4:
            raise argparse.ArgumentTypeError(f"{item}: expected BATCHxSEQLENxNHEADSxHEAD_DIM")
        shapes.append(shape)
    return shapes


def commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", type=parse_shapes, default=parse_shapes("1x16384x32x128,4x8192x8x128"),
                        help="comma-separated BATCHxSEQLENxNHEADSxHEAD_DIM")
    parser.add_argument("--dtypes", default="bf16", help="comma-separated: bf16, fp16")
    parser.add_argument("--warmup-ms", type=float, default=300.0)
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--json", help="write the results to this file")
    args = parser.parse_args()

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, flashhop commit {commit()}")
    rows = []
    for dtype_name in args.dtypes.split(","):
        dtype = DTYPES[dtype_name]
        for shape in args.shapes:
            torch.manual_seed(0)
            x = torch.randn(shape, device="cuda", dtype=dtype)
            signs = flashhop.hadamard_signs(shape[3])
            x_bytes = x.numel() * x.element_size()
            replay, _ = graphed(lambda: x.clone())
            copy_ms = median_ms(replay, args.warmup_ms, args.iters)
            copy_gbs = 2 * x_bytes / (copy_ms * 1e-3) / 1e9
            cells = [("torch copy (x.clone())", "", copy_ms, copy_gbs)]
            calls = [(f"flashhop {scaling}", rotate,
                      lambda scaling=scaling, rotate=rotate: flashhop.quantize_fp8(
                          x, scaling, hadamard_signs=signs if rotate else None))
                     for scaling in SCALINGS for rotate in (False, True)]
            calls.append(("torch per_tensor", False, lambda: torch_per_tensor(x)))
            for name, rotate, call in calls:
                replay, (out, descale) = graphed(call)
                ms = median_ms(replay, args.warmup_ms, args.iters)
                moved = x_bytes + out.numel() * out.element_size() + descale.numel() * descale.element_size()
                cells.append((name, "hadamard" if rotate else "none", ms, moved / (ms * 1e-3) / 1e9))
            for name, rotation, ms, gbs in cells:
                rows.append(dict(dtype=dtype_name, shape=list(shape), call=name, rotation=rotation, ms=ms, gbs=gbs,
                                 of_copy=gbs / copy_gbs))

    print()
    print("| dtype | shape (b, s, h, d) | call | rotation | time (us) | GB/s | of copy |")
    print("|---|---|---|---|---:|---:|---:|")
    for row in rows:
        shape = "x".join(str(size) for size in row["shape"])
        print(f"| {row['dtype']} | {shape} | {row['call']} | {row['rotation']} | {row['ms'] * 1e3:.1f} | "
              f"{row['gbs']:.0f} | {row['of_copy']:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, commit=commit(),
                           warmup_ms=args.warmup_ms, iters=args.iters, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
