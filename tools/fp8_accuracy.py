#!/usr/bin/env python3
"""The FlashAttention-3 paper's FP8 accuracy experiment on flashhop's FP8 forward: Q, K and V drawn
from N(0, 1) with 0.1% of their entries from N(0, 10^2) (outlier features); the RMSE of O against
float64 attention of the bf16 values, for each way of scaling the e4m3 inputs (quantize_fp8):
per-tensor descales, per-head descales, block scales (one per 128 rows of a head), and block scales
with incoherent processing (the same random-sign Hadamard rotation of Q and K, which leaves Q K^T
unchanged). Prints a markdown table and writes --json.

  PYTHONPATH=<flashhop> python3 tools/fp8_accuracy.py [--batch 2 --seqlen 4096 --nheads 16 --head-dim 128]
"""
import argparse
import json
import math

import torch

import flashhop


def outlier_normal(shape, generator):
    """N(0, 1), with 0.1% of the entries from N(0, 10^2), in bfloat16."""
    x = torch.randn(shape, generator=generator, device="cuda")
    outliers = torch.rand(shape, generator=generator, device="cuda") < 1e-3
    return torch.where(outliers, 10 * torch.randn(shape, generator=generator, device="cuda"), x).to(torch.bfloat16)


def reference(q, k, v):
    """float64 attention of the bf16 values, FlashAttention's layout."""
    q, k, v = (t.double().transpose(1, 2) for t in (q, k, v))
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    return (torch.softmax(scores, dim=-1) @ v).transpose(1, 2)


def fp8_attention(q, k, v, scaling, signs=None):
    """flashhop's FP8 forward of q, k, v quantized by quantize_fp8 with `scaling`; `signs` rotates
    q and k (incoherent processing)."""
    batch, nheads_kv = q.shape[0], k.shape[2]
    if scaling == "per_block":
        (q8, qs), (k8, ks) = (flashhop.quantize_fp8(t, "per_block", hadamard_signs=signs) for t in (q, k))
        v8, vs = flashhop.quantize_fp8(v, "per_block")
        return flashhop.flash_attn_func(q8, k8, v8, q_block_scale=qs, k_block_scale=ks, v_block_scale=vs)
    groups = {"per_head": nheads_kv, "per_tensor": None}[scaling]
    q8, qd = flashhop.quantize_fp8(q, scaling, groups=groups)
    k8, kd = flashhop.quantize_fp8(k, scaling)
    v8, vd = flashhop.quantize_fp8(v, scaling)
    if scaling == "per_tensor":  # one value, broadcast to FlashAttention-3's (batch, nheads_kv)
        qd, kd, vd = (d.reshape(1, 1).expand(batch, nheads_kv) for d in (qd, kd, vd))
    return flashhop.flash_attn_func(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seqlen", type=int, default=4096)
    parser.add_argument("--nheads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    generator = torch.Generator(device="cuda").manual_seed(args.seed)
    shape = (args.batch, args.seqlen, args.nheads, args.head_dim)
    q, k, v = (outlier_normal(shape, generator) for _ in range(3))
    expected = reference(q, k, v)
    signs = flashhop.hadamard_signs(args.head_dim, seed=args.seed, device="cuda")
    rows = {}
    for name, scaling, rotate in (("per-tensor descale", "per_tensor", False), ("per-head descale", "per_head", False),
                                  ("block scaling", "per_block", False),
                                  ("block scaling + incoherent processing", "per_block", True)):
        out = fp8_attention(q, k, v, scaling, signs if rotate else None)
        rows[name] = (out.double() - expected).pow(2).mean().sqrt().item()
    bf16 = flashhop.flash_attn_func(q, k, v)
    rows["bf16 (no FP8)"] = (bf16.double() - expected).pow(2).mean().sqrt().item()
    print(f"{torch.cuda.get_device_name()}; batch {args.batch}, seqlen {args.seqlen}, nheads {args.nheads}, "
          f"d {args.head_dim}; RMSE of O against float64 attention of the bf16 inputs")
    print("| scaling | RMSE | per-tensor / this |")
    print("|---|---|---|")
    for name, rmse in rows.items():
        print(f"| {name} | {rmse:.3e} | {rows['per-tensor descale'] / rmse:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "args": vars(args), "rmse": rows}, f, indent=1)


if __name__ == "__main__":
    main()
