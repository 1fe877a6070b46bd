#!/usr/bin/env python3
"""flashhop-bench against peers, one peers-grid cell at a time, in interleaved rounds: each round
runs the contenders of a cell (flashhop's variants, then the peers) in an order rotated by one from
the round before, all with the peers table's timing (100 calls and 2 s of warm-up, median of 500).
A single pass of the peers table runs flashhop's whole sweep before the peers, and the GPU's clock
under its power limit drifts between the two by a few percent, on short cells by up to 15% from one
pass to the next; rounds side by side rank two libraries that close (docs/PERFORMANCE.md,
Method).

Usage, on the GPU machine (FA3 importable for the fa3 peer: scripts/gpu_run.sh's install_fa3, or
PYTHONPATH at the unpacked wheel of scripts/fetch_peers.sh):
  tools/peer_rounds.py --bench build/tools/flashhop-bench --rounds 3 128:16384:1 256:8192:1
  tools/peer_rounds.py --bench B --peers cudnn,cudnn_lse --variant flashhop= --variant no-lse=--no-lse \\
      --clocks 64:512:1
A cell is D:SEQLEN:CAUSAL (0 or 1) of the peers grid: batch 16384 / SEQLEN, 2048 / D heads, bf16.
--peers: of tools/peers_sdpa.py's backends (cudnn, cudnn_lse, fa2, fa3; default fa3), timed in this
process through its functions, on rotated input sets that span three L2 caches, as in the peers
table. --variant NAME=FLAGS (repeatable; default flashhop=): a flashhop contender, flashhop-bench
run once per cell and round with FLAGS added (it measures its GEMM first). --clocks: nvidia-smi
samples the SM clock and the board power every 20 ms; each run gets the medians over the last
0.5 s before its end (its warm-up's tail and its timed calls), less 0.1 s for the process exit.
"""
import argparse
import re
import shlex
import statistics
import subprocess
import threading
import time

import torch

import peers_sdpa as P

WARMUP, WARMUP_MS, ITERS = 100, 2000.0, 500
CLOCK_WINDOW_S, EXIT_S = 0.5, 0.1


def flashhop_tflops(bench, flags, c):
    args = [bench, "--batch", str(c["batch"]), "--seqlen", str(c["seqlen_q"]), "--nheads", str(c["nheads"]),
            "--head-dim", str(c["head_dim"]), "--warmup", str(WARMUP), "--warmup-ms", str(WARMUP_MS),
            "--iters", str(ITERS)]
    args += ["--causal"] if c["causal"] else []
    out = subprocess.run(args + flags, capture_output=True, text=True, check=True).stdout
    return float(re.findall(r"([0-9.]+) TFLOP/s", out)[-1])  # the cell's line comes after the GEMM's


def peer_tflops(backend, l2_bytes, c):
    sets = P.input_sets(c, l2_bytes)
    ms = P.time_backend(backend, c, sets, WARMUP, ITERS, WARMUP_MS).ms
    return P.forward_flops(c) / (ms * 1e-3) / 1e12


class ClockSampler:
    """nvidia-smi in the background, one (time, SM MHz, watts) sample every 20 ms, each stamped as a
    reader thread receives it."""

    def __init__(self):
        self.process = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits", "-lms", "20"],
            stdout=subprocess.PIPE, text=True, bufsize=1)
        self.samples = []
        self.reader = threading.Thread(target=self.read, daemon=True)
        self.reader.start()

    def read(self):
        for line in self.process.stdout:
            fields = [x.strip() for x in line.split(",")]
            try:
                self.samples.append((time.time(), float(fields[0]), float(fields[1])))
            except (ValueError, IndexError):
                continue

    def window(self, end):
        """Median SM clock and power over [end - EXIT_S - CLOCK_WINDOW_S, end - EXIT_S]."""
        inside = [s for s in list(self.samples) if end - EXIT_S - CLOCK_WINDOW_S <= s[0] <= end - EXIT_S]
        if not inside:
            return None
        return statistics.median(s[1] for s in inside), statistics.median(s[2] for s in inside)

    def stop(self):
        self.process.terminate()
        self.process.wait()
        self.reader.join()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bench", required=True, help="the flashhop-bench binary")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--peers", default="fa3", help="comma-separated, of " + ", ".join(P.KNOWN_BACKENDS))
    parser.add_argument("--variant", action="append", metavar="NAME=FLAGS",
                        help="a flashhop contender: flashhop-bench with FLAGS added (default flashhop=)")
    parser.add_argument("--clocks", action="store_true", help="each run's SM clock and power (nvidia-smi)")
    parser.add_argument("cells", nargs="+", help="D:SEQLEN:CAUSAL, e.g. 128:16384:1")
    args = parser.parse_args()
    peers = args.peers.split(",")
    if unknown := [p for p in peers if p not in P.KNOWN_BACKENDS]:
        parser.error(f"unknown peers {unknown}")
    if "fa3" in peers and P.FA3_MISSING:
        raise SystemExit(f"peer_rounds.py: {P.FA3_MISSING}")
    variants = {}
    for text in args.variant or ["flashhop="]:
        name, sep, flags = text.partition("=")
        if not sep or not name:
            parser.error(f"--variant expects NAME=FLAGS, got '{text}'")
        variants[name] = shlex.split(flags)
    cells = [tuple(int(x) for x in cell.split(":")) for cell in args.cells]
    l2_bytes = torch.cuda.get_device_properties(0).L2_cache_size
    contenders = [(name, lambda c, flags=flags: flashhop_tflops(args.bench, flags, c))
                  for name, flags in variants.items()]
    contenders += [(P.BACKEND_TITLES[p], lambda c, p=p: peer_tflops(p, l2_bytes, c)) for p in peers]
    names = [name for name, _ in contenders]
    results = {cell: {name: [] for name in names} for cell in cells}
    clocks = {cell: {name: [] for name in names} for cell in cells}
    sampler = ClockSampler() if args.clocks else None
    try:
        for r in range(args.rounds):
            order = contenders[r % len(contenders):] + contenders[:r % len(contenders)]
            for cell in cells:
                c = P.peers_cell(cell[0], cell[1], bool(cell[2]))
                for name, run in order:
                    results[cell][name].append(run(c))
                    if sampler:
                        clocks[cell][name].append(sampler.window(time.time()))
                line = "  ".join(f"{name} {results[cell][name][-1]:.1f}" for name in names)
                print(f"round {r + 1} d {cell[0]} s {cell[1]} causal {cell[2]}: {line}", flush=True)
    finally:
        if sampler:
            sampler.stop()

    ratios = [(v, p) for v in variants for p in names[len(variants):]]
    print("\nTFLOP/s per round (in the order run: rotated each round); ratios of the medians over rounds\n")
    print("| d | causal | seqlen | " + " | ".join(names + [f"{v} / {p}" for v, p in ratios]) + " |")
    print("|---|---|---|" + "---|" * (len(names) + len(ratios)))
    for (d, s, causal), v in results.items():
        cells_text = [" / ".join(f"{x:.0f}" for x in v[name]) for name in names]
        ratio_text = [f"{statistics.median(v[a]) / statistics.median(v[b]):.3f}" for a, b in ratios]
        print(f"| {d} | {'yes' if causal else 'no'} | {s} | " + " | ".join(cells_text + ratio_text) + " |")
    if sampler:
        print("\nSM clock (MHz) and board power (W) per round: medians of each run's last 0.5 s\n")
        print("| d | causal | seqlen | " + " | ".join(names) + " |")
        print("|---|---|---|" + "---|" * len(names))
        for (d, s, causal), v in clocks.items():
            cells_text = [" / ".join(f"{w[0]:.0f} MHz {w[1]:.0f} W" if w else "-" for w in v[name])
                          for name in names]
            print(f"| {d} | {'yes' if causal else 'no'} | {s} | " + " | ".join(cells_text) + " |")


if __name__ == "__main__":
    main()
