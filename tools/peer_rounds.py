#!/usr/bin/env python3
"""flashhop-bench against FA3, one peers-grid cell at a time, in interleaved rounds: flashhop first
in odd rounds and FA3 first in even ones, both with the peers table's timing (100 calls and 2 s of
warm-up, median of 500). A single pass of the peers table runs flashhop's whole sweep before the
peers, and the GPU's clock under its power limit drifts between the two by a few percent; rounds
side by side rank two libraries that close (docs/PERFORMANCE.md, thirty-fourth session).

Usage, on the GPU machine with FA3 importable (scripts/gpu_run.sh's install_fa3, or PYTHONPATH at the
unpacked wheel of scripts/fetch_peers.sh):
  tools/peer_rounds.py --bench build/tools/flashhop-bench --rounds 3 128:16384:1 256:8192:1
A cell is D:SEQLEN:CAUSAL (0 or 1) of the peers grid: batch 16384 / SEQLEN, 2048 / D heads, bf16.
flashhop-bench runs once per cell and round (it measures its GEMM first); FA3 is timed in this
process through tools/peers_sdpa.py's functions, on rotated input sets that span three L2 caches, as
in the peers table.
"""
import argparse
import re
import statistics
import subprocess

import torch

import peers_sdpa as P

WARMUP, WARMUP_MS, ITERS = 100, 2000.0, 500


def flashhop_tflops(bench, c):
    args = [bench, "--batch", str(c["batch"]), "--seqlen", str(c["seqlen_q"]), "--nheads", str(c["nheads"]),
            "--head-dim", str(c["head_dim"]), "--warmup", str(WARMUP), "--warmup-ms", str(WARMUP_MS),
            "--iters", str(ITERS)]
    args += ["--causal"] if c["causal"] else []
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return float(re.findall(r"([0-9.]+) TFLOP/s", out)[-1])  # the cell's line comes after the GEMM's


def fa3_tflops(l2_bytes, c):
    sets = P.input_sets(c, l2_bytes)
    ms = P.time_backend("fa3", c, sets, WARMUP, ITERS, WARMUP_MS)
    return P.forward_flops(c) / (ms * 1e-3) / 1e12


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bench", required=True, help="the flashhop-bench binary")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("cells", nargs="+", help="D:SEQLEN:CAUSAL, e.g. 128:16384:1")
    args = parser.parse_args()
    if P.FA3_MISSING:
        raise SystemExit(f"peer_rounds.py: {P.FA3_MISSING}")
    cells = [tuple(int(x) for x in cell.split(":")) for cell in args.cells]
    l2_bytes = torch.cuda.get_device_properties(0).L2_cache_size
    results = {cell: {"flashhop": [], "fa3": []} for cell in cells}
    for r in range(args.rounds):
        for cell in cells:
            c = P.peers_cell(cell[0], cell[1], bool(cell[2]))
            runs = [("flashhop", lambda: flashhop_tflops(args.bench, c)), ("fa3", lambda: fa3_tflops(l2_bytes, c))]
            for name, run in (runs if r % 2 == 0 else runs[::-1]):
                results[cell][name].append(run())
            print(f"round {r + 1} d {cell[0]} s {cell[1]} causal {cell[2]}: flashhop "
                  f"{results[cell]['flashhop'][-1]:.1f} FA3 {results[cell]['fa3'][-1]:.1f}", flush=True)
    print("| d | causal | seqlen | flashhop (rounds) | FA3 (rounds) | flashhop / FA3 (medians) |")
    print("|---|---|---|---|---|---|")
    for (d, s, causal), v in results.items():
        ratio = statistics.median(v["flashhop"]) / statistics.median(v["fa3"])
        print(f"| {d} | {'yes' if causal else 'no'} | {s} | " + " / ".join(f"{x:.0f}" for x in v["flashhop"])
              + " | " + " / ".join(f"{x:.0f}" for x in v["fa3"]) + f" | {ratio:.3f} |")


if __name__ == "__main__":
    main()
