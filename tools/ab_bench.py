#!/usr/bin/env python3
"""Same-session A/B timing of flashhop-bench binaries (the tool library's METHOD.md: predict, change,
measure, side by side). Runs each binary with the same flags in turn, round after round, so that
all of them see the same card state, and prints one table: per configuration, each binary's TFLOP/s
in every round, and the median over rounds relative to the first binary. Even rounds run the
binaries in reverse order, so that a drift of the card's state within a round (each run is a whole
sweep) does not always favour the same binary; to see how large that drift is, give one binary
twice under two names.

  tools/ab_bench.py [--rounds N] [--bench-args "FLAGS"] [--out DIR] NAME=BINARY [NAME=BINARY ...]

FLAGS are flashhop-bench's (default: the peers sweep with a warm-up of 100 calls and at least 2 s,
then 500 timed calls, as scripts/gpu_run.sh times it); each run writes DIR/NAME_rR.json
(flashhop-bench --json) and .log.
A configuration that a binary was not built for (flashhop-bench reports an error) shows as "-".
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile


def config_key(config):
    """A configuration's label: head dims, mask, shape and the pack-GQA choice when set."""
    dims = str(config["head_dim"])
    if config["head_dim_v"] != config["head_dim"]:
        dims += f"x{config['head_dim_v']}"
    mask = "causal" if config["causal"] else "none"
    if config["window_left"] >= 0 or config["window_right"] >= 0:
        mask = f"window({config['window_left']},{config['window_right']})"
    if config["softcap"]:
        mask += f" softcap {config['softcap']:g}"
    label = (f"d {dims} {mask} b {config['batch']} sq {config['seqlen_q']} sk {config['seqlen_k']} "
             f"h {config['nheads']}/{config['nheads_kv']} {config['dtype']}")
    if config["pack_gqa"] != "auto":
        label += f" pack {config['pack_gqa']}"
    return label


def parse_binary(text):
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=BINARY, got '{text}'")
    if not os.access(path, os.X_OK):
        raise argparse.ArgumentTypeError(f"{path} is not an executable file")
    return name, path


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("binaries", nargs="+", type=parse_binary, metavar="NAME=BINARY")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each binary, interleaved (default 2)")
    parser.add_argument("--bench-args", default="--sweep peers --warmup 100 --warmup-ms 2000 --iters 500",
                        help="flashhop-bench flags for every run")
    parser.add_argument("--out", help="folder for the runs' JSON and logs (default: a temporary one)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    names = [name for name, _ in args.binaries]
    if len(set(names)) != len(names):
        parser.error("binary names must differ")
    out = args.out or tempfile.mkdtemp(prefix="ab_bench_")
    os.makedirs(out, exist_ok=True)

    tflops = {}  # (config label, name) -> [TFLOP/s per round]
    order = []   # config labels in the sweep's order
    for round_index in range(1, args.rounds + 1):
        in_turn = args.binaries if round_index % 2 == 1 else args.binaries[::-1]
        for name, binary in in_turn:
            stem = os.path.join(out, f"{name}_r{round_index}")
            command = [binary, *shlex.split(args.bench_args), "--json", stem + ".json"]
            with open(stem + ".log", "w") as log:
                status = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode
            print(f"round {round_index} {name}: exit {status} ({stem}.log)", file=sys.stderr, flush=True)
            if not os.path.exists(stem + ".json"):
                continue
            with open(stem + ".json") as f:
                results = json.load(f)["results"]
            for result in results:
                label = config_key(result["config"])
                if label not in order:
                    order.append(label)
                if result["status"] == "ok":
                    tflops.setdefault((label, name), []).append(result["tflops"])

    base = names[0]
    print("| configuration | " + " | ".join(names) + " | " +
          " | ".join(f"{name} / {base}" for name in names[1:]) + " |")
    print("|---|" + "---|" * (2 * len(names) - 1))
    for label in order:
        cells, medians = [], {}
        for name in names:
            values = tflops.get((label, name), [])
            cells.append(" / ".join(f"{v:.0f}" for v in values) if values else "-")
            if values:
                medians[name] = statistics.median(values)
        ratios = [f"{medians[name] / medians[base]:.3f}" if name in medians and base in medians else "-"
                  for name in names[1:]]
        print(f"| {label} | " + " | ".join(cells + ratios) + " |")
    print(f"\nruns in {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
