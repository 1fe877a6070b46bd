#!/usr/bin/env python3
"""Runs FlashAttention-3's forward (the fa3-fwd wheel, scripts/fetch_peers.sh) on one flashhop-bench
configuration a number of times, so that a profiler sees the same shape in both libraries
(scripts/gpu_run.sh's profile stage runs ncu on it next to flashhop-bench).

  tools/fa3_launch.py [--batch N] [--seqlen N | --seqlen-q N --seqlen-k N] [--nheads N]
                      [--nheads-kv N] [--head-dim N] [--causal] [--window-left N]
                      [--window-right N] [--softcap X] [--calls N]

The flags and defaults are flashhop-bench's (bf16, layout (batch, seqlen, heads, d), masks aligned
to the bottom-right corner, -1: an unbounded window side); FA3 is called as tools/peers_sdpa.py
calls it, with num_splits=0 (its own split-KV choice). Its kernel is named `device_kernel` (ncu:
`--kernel-name regex:device_kernel`). Needs torch and the wheel on PYTHONPATH.
"""
import argparse
import sys


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seqlen", type=int, default=4096)
    parser.add_argument("--seqlen-q", type=int)
    parser.add_argument("--seqlen-k", type=int)
    parser.add_argument("--nheads", type=int, default=16)
    parser.add_argument("--nheads-kv", type=int)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--window-left", type=int, default=-1)
    parser.add_argument("--window-right", type=int, default=-1)
    parser.add_argument("--softcap", type=float, default=0.0)
    parser.add_argument("--calls", type=int, default=16, help="forward calls (default 16)")
    args = parser.parse_args(argv)
    args.seqlen_q = args.seqlen if args.seqlen_q is None else args.seqlen_q
    args.seqlen_k = args.seqlen if args.seqlen_k is None else args.seqlen_k
    args.nheads_kv = args.nheads if args.nheads_kv is None else args.nheads_kv
    for name in ("batch", "seqlen_q", "seqlen_k", "nheads", "nheads_kv", "head_dim", "calls"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} expects a positive number, got {getattr(args, name)}")
    if args.nheads % args.nheads_kv != 0:
        parser.error(f"--nheads ({args.nheads}) expects a multiple of --nheads-kv ({args.nheads_kv})")
    return args


def main(argv):
    args = parse_args(argv)
    import torch  # after parsing, so that --help and bad flags need neither torch nor a GPU
    import fa3_fwd_interface

    def tensor(seqlen, heads):
        return torch.randn(args.batch, seqlen, heads, args.head_dim, device="cuda", dtype=torch.bfloat16)

    q = tensor(args.seqlen_q, args.nheads)
    k, v = tensor(args.seqlen_k, args.nheads_kv), tensor(args.seqlen_k, args.nheads_kv)
    for _ in range(args.calls):
        fa3_fwd_interface.flash_attn_func(q, k, v, causal=args.causal,
                                          window_size=(args.window_left, args.window_right),
                                          softcap=args.softcap, num_splits=0)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
