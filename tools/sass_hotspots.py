#!/usr/bin/env python3
"""Where a kernel's warps spend their time, from ncu's per-instruction stall sampling.

  tools/sass_hotspots.py SOURCE_CSV [--top N] [--min-share PERCENT]

SOURCE_CSV is `ncu --import REPORT --page source --csv --print-source sass` of a report taken with
`--section SourceCounters`. Prints the stall reasons over the whole kernel, then the kernel cut into
runs of consecutive instructions with the same execution count (in a persistent kernel: the code
that runs once per CTA, once per tile, once per key tile, ...) with each run's share of the samples
and its hottest instructions, then the N hottest instructions. Shares are of all warp samples,
every warp role included.
"""
import argparse
import collections
import csv
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"

# One SASS instruction: its position in the listing, its text, its warp samples, how often it ran,
# and its samples per stall reason.
Instruction = collections.namedtuple("Instruction", "index text samples executed stalls")


def read_instructions(path):
    """The kernel's instructions in listing order."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header_at = next((i for i, row in enumerate(rows) if row and row[0] == "Address"), None)
    if header_at is None:
        sys.exit(f"{path}: no 'Address' header row (expected ncu --page source --csv output)")
    header = rows[header_at]
    column = {name: i for i, name in enumerate(header)}
    for name in ("Source", SAMPLES, EXECUTED):
        if name not in column:
            sys.exit(f"{path}: no '{name}' column (was the report taken with --section SourceCounters?)")
    reasons = [name for name in header if name.startswith("stall_") and not name.endswith("(Not Issued)")]
    number = lambda text: int(text) if text.strip().lstrip("-").isdigit() else 0
    instructions = []
    for row in rows[header_at + 1:]:
        if len(row) < len(header):
            continue
        stalls = {reason[len("stall_"):]: number(row[column[reason]]) for reason in reasons}
        instructions.append(Instruction(len(instructions), row[column["Source"]].strip(),
                                        number(row[column[SAMPLES]]), number(row[column[EXECUTED]]), stalls))
    return instructions


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=15, help="hottest instructions to list (default 15)")
    parser.add_argument("--min-share", type=float, default=0.3,
                        help="leave out runs below this share of the samples, in percent (default 0.3)")
    args = parser.parse_args()

    instructions = read_instructions(args.csv)
    total = sum(i.samples for i in instructions)
    if total == 0:
        sys.exit(f"{args.csv}: no warp samples")
    share = lambda samples: 100.0 * samples / total

    reasons = collections.Counter()
    for i in instructions:
        reasons.update(i.stalls)
    print(f"{len(instructions)} instructions, {total} warp samples")
    print("stall reasons: " + ", ".join(f"{reason} {share(n):.1f}%" for reason, n in reasons.most_common(8) if n))

    print("\nruns of equal execution count (first-last instruction, executions, share, hottest):")
    runs = []
    for instruction in instructions:
        if runs and runs[-1][-1].executed == instruction.executed:
            runs[-1].append(instruction)
        else:
            runs.append([instruction])
    for run in runs:
        samples = sum(i.samples for i in run)
        if share(samples) < args.min_share:
            continue
        hottest = sorted(run, key=lambda i: -i.samples)[:3]
        print(f"  [{run[0].index:5d}-{run[-1].index:5d}] x{run[0].executed:<9d} {share(samples):5.1f}%  " +
              " | ".join(f"{i.text[:44]} {share(i.samples):.1f}%" for i in hottest if i.samples))

    print(f"\n{args.top} hottest instructions (index, share, executions, main stall reasons):")
    for i in sorted(instructions, key=lambda i: -i.samples)[:args.top]:
        main_reasons = ", ".join(f"{r} {share(n):.1f}" for r, n in collections.Counter(i.stalls).most_common(2) if n)
        print(f"  {i.index:5d} {share(i.samples):5.1f}% x{i.executed:<9d} {i.text[:56]:56s} {main_reasons}")


if __name__ == "__main__":
    main()
