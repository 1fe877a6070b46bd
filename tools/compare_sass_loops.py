#!/usr/bin/env python3
"""Compares the instruction schedules of the loops of two builds' kernels, function by function.

A source change, or a compiler option, can make ptxas schedule a kernel's key-tile loops anew: the
loop keeps its instructions but not their order or registers, and that alone can move its speed by
several percent (docs/PERFORMANCE.md, decision log D97 and D98). Before timing a change,
this tool says whether the loops it did not mean to touch kept their schedule.

For each kernel function present in both files (objects, archives or executables, through
`cuobjdump --dump-sass`; or saved listings with --sass), the loops are the spans from a backward
branch's target to the branch, of --min to --max instructions; they are paired in address order.
Each pair gets the ratio of the instruction sequences that Python's difflib finds alike (opcode
and operands, registers included, and whether predicated): 1.000 is the same schedule. Exit
status: 0, 2 on usage errors, 77 (skipped) when no cuobjdump or nvdisasm can be found.

Usage: compare_sass_loops.py [--cuobjdump PATH] [--min N] [--max N] FILE_A FILE_B
       compare_sass_loops.py --sass LISTING_A LISTING_B
"""

import argparse
import difflib
import os
import re
import shutil
import subprocess
import sys

from check_wgmma_operands import dump_listings, parse_functions

TARGET = re.compile(r"^0x[0-9a-f]+$")


def loops(instructions, shortest, longest):
    """The loops of one function, in address order: [instruction texts from target to branch]."""
    texts = [("@P " if predicated else "") + " ".join([opcode] + operands)
             for _, predicated, opcode, operands in instructions]
    index = {address: i for i, (address, *_) in enumerate(instructions)}
    found = []
    for i, (address, _, opcode, operands) in enumerate(instructions):
        if not opcode.startswith("BRA") or not operands or not TARGET.match(operands[-1]):
            continue
        target = int(operands[-1], 16)
        if target < address and target in index and shortest <= i - index[target] + 1 <= longest:
            found.append((index[target], texts[index[target]:i + 1]))
    return [body for _, body in sorted(found)]


def demangled(names):
    """{mangled: readable} through c++filt where it exists."""
    tool = shutil.which("c++filt")
    if not tool or not names:
        return {name: name for name in names}
    result = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True)
    readable = result.stdout.splitlines() if result.returncode == 0 else names
    return dict(zip(names, readable)) if len(readable) == len(names) else {name: name for name in names}


def compare(lines_a, lines_b, shortest, longest, out=sys.stdout):
    """Prints each common function's loop pairs; returns [(function, length a, length b, ratio)]."""
    functions_a, functions_b = parse_functions(lines_a), parse_functions(lines_b)
    common = [name for name in functions_a if name in functions_b]
    names = demangled(common)
    rows = []
    for name in common:
        loops_a = loops(functions_a[name], shortest, longest)
        loops_b = loops(functions_b[name], shortest, longest)
        pairs = []
        for body_a, body_b in zip(loops_a, loops_b):
            ratio = difflib.SequenceMatcher(None, body_a, body_b, autojunk=False).ratio()
            pairs.append(f"{len(body_a)}/{len(body_b)} {ratio:.3f}")
            rows.append((name, len(body_a), len(body_b), ratio))
        label = names[name].replace("flashhop::sm90::", "").replace("cutlass::", "").removeprefix("void ")
        print(f"{label[:120]}\n  loops {len(loops_a)} / {len(loops_b)}: {'  '.join(pairs) or '-'}", file=out)
    only = len(functions_a) + len(functions_b) - 2 * len(common)
    print(f"{len(common)} functions compared, {len(rows)} loop pairs"
          + (f", {only} functions in one file only" if only else ""), file=out)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cuobjdump", help="the cuobjdump to use (default: found on PATH, beside nvcc or "
                        "in the nvidia-cuda-cuobjdump wheel)")
    parser.add_argument("--sass", action="store_true", help="the files are SASS listings")
    parser.add_argument("--min", type=int, default=300, help="shortest loop, in instructions (default 300)")
    parser.add_argument("--max", type=int, default=1500, help="longest loop, in instructions (default 1500)")
    parser.add_argument("files", nargs=2, metavar="FILE")
    args = parser.parse_args()
    for path in args.files:
        if not os.path.exists(path):
            print(f"{path}: no such file", file=sys.stderr)
            return 2
    if args.min < 2 or args.max < args.min:
        print(f"--min {args.min} / --max {args.max}: expected 2 <= min <= max", file=sys.stderr)
        return 2
    if args.sass:
        listings = []
        for path in args.files:
            with open(path) as listing:
                listings.append(listing.read().splitlines())
    else:
        status, listings = dump_listings(args.files, args.cuobjdump)
        if status:
            return status
    compare(listings[0], listings[1], args.min, args.max)
    return 0


if __name__ == "__main__":
    sys.exit(main())
