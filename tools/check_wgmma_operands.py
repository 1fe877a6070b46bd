#!/usr/bin/env python3
"""Checks the SASS of sm90 kernels for writes to registers that an in-flight wgmma still reads.

A wgmma (SASS: HGMMA) whose A operand comes from registers reads them while it runs, until a
`wgmma.wait_group` (SASS: WARPGROUP.DEPBAR.LE gsb0, N) retires it. ptxas does not reserve those
registers beyond the HGMMA that names them: once the program no longer reads their values, it may
give them to other values while the HGMMA still runs, and the GEMM then reads whatever lands there
(a wrong O, different from run to run). Source code keeps them reserved by reading them again
after the wait (fwd_mainloop.h, the second P buffer). This tool finds the writes that break it.

For each kernel function in the files given (objects, archives or executables, through
`cuobjdump --dump-sass`), it follows the control-flow graph with the set of wgmma groups that may
be in flight at each instruction: an HGMMA with a register A operand adds its four registers to
the open group, the HGMMA that carries `gsb0` closes the group, WARPGROUP.DEPBAR.LE gsb0, N keeps
the newest N groups; where paths join, the groups are merged newest with newest. Any instruction
that writes one of those registers is reported. Exit status: 0 clean, 1 hazards found, 2 on usage
errors, 77 (skipped) when no cuobjdump or nvdisasm can be found.

Usage: check_wgmma_operands.py [--cuobjdump PATH] FILE...
       check_wgmma_operands.py --sass FILE.sass   (a saved `cuobjdump --dump-sass` listing)
"""

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys

SKIPPED = 77
MAX_GROUPS = 8  # older groups are merged into one; no kernel keeps more than two in flight

INSTRUCTION = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
FUNCTION = re.compile(r"^\s*Function : (\S+)")
PREDICATE = re.compile(r"^@!?U?P(?:T|\d+)$")
REGISTER = re.compile(r"^R(\d+)$")
# Instructions whose first operand is read, not written.
NO_REGISTER_DESTINATION = ("ST", "RED", "BAR", "WARPSYNC", "BRA", "BRX", "JMP", "CALL", "EXIT", "RET",
                           "BSSY", "BSYNC", "NOP", "MEMBAR", "FENCE", "ERRBAR", "CCTL", "DEPBAR",
                           "WARPGROUP", "YIELD", "NANOSLEEP", "UTMA", "UBLKCP")


def find_cuobjdump(given):
    """The cuobjdump to use: the given one, on PATH, beside nvcc, or from the PyPI wheel
    nvidia-cuda-cuobjdump (nvidia/cu13/bin); None if there is none."""
    if given:
        return given if os.access(given, os.X_OK) else None
    found = shutil.which("cuobjdump")
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and os.access(os.path.join(home, "bin", "cuobjdump"), os.X_OK):
            return os.path.join(home, "bin", "cuobjdump")
    nvcc = shutil.which("nvcc")
    if nvcc and os.access(os.path.join(os.path.dirname(nvcc), "cuobjdump"), os.X_OK):
        return os.path.join(os.path.dirname(nvcc), "cuobjdump")
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        for cuda in ("cu13", "cu12", "cuda_cuobjdump"):
            candidate = os.path.join(root, cuda, "bin", "cuobjdump")
            if os.access(candidate, os.X_OK):
                return candidate
    return None


def parse_functions(lines):
    """{function name: [(address, predicated, opcode, operands)]} of a SASS listing."""
    functions, current = {}, None
    for line in lines:
        match = FUNCTION.match(line)
        if match:
            current = functions.setdefault(match.group(1), [])
            continue
        match = INSTRUCTION.match(line)
        if not match or current is None:
            continue
        text = match.group(2).strip()
        predicated = False
        first = text.split(None, 1)[0]
        if PREDICATE.match(first):
            predicated = first not in ("@PT", "@UPT")
            text = text.split(None, 1)[1] if " " in text else ""
        parts = text.split(None, 1)
        if not parts:
            continue
        operands = [o.strip() for o in parts[1].split(",")] if len(parts) > 1 else []
        current.append((int(match.group(1), 16), predicated, parts[0], operands))
    return functions


def written_registers(opcode, operands):
    """The general registers that an instruction writes (its destination), as numbers."""
    if not operands or opcode.startswith(NO_REGISTER_DESTINATION) or opcode.startswith("HGMMA"):
        return []
    destination = operands[0]
    # A predicate first, then the register result: SHFL (in-bounds flag), LOP3 (predicate output).
    if PREDICATE.match("@" + destination) and len(operands) > 1 and opcode.startswith(("SHFL", "LOP3")):
        destination = operands[1]
    match = REGISTER.match(destination)
    if not match:
        return []
    suffixes = opcode.split(".")
    width = 1
    if "64" in suffixes or "WIDE" in suffixes or opcode.startswith("CS2R"):
        width = 2
    if "128" in suffixes:
        width = 4
    if opcode.startswith("LDSM") and suffixes[-1] in ("2", "4"):
        width = int(suffixes[-1])
    first = int(match.group(1))
    return list(range(first, first + width))


class State:
    """The wgmma groups that may be in flight: closed groups, oldest first, and the open one."""

    def __init__(self, groups=(), open_group=frozenset()):
        self.groups = tuple(groups)
        self.open = frozenset(open_group)

    def key(self):
        return self.groups, self.open

    def busy(self):
        registers = set(self.open)
        for group in self.groups:
            registers |= group
        return registers

    def merged(self, other):
        longest = max(len(self.groups), len(other.groups))
        groups = []
        for age in range(longest, 0, -1):  # align newest with newest
            group = frozenset()
            for state in (self, other):
                if age <= len(state.groups):
                    group |= state.groups[-age]
            groups.append(group)
        return State(groups, self.open | other.open)


def transfer(state, instruction, hazards, function):
    """The state after one instruction; writes to busy registers go to `hazards`."""
    address, _, opcode, operands = instruction
    groups, open_group = list(state.groups), set(state.open)
    if opcode.startswith("HGMMA"):
        if len(operands) > 1 and REGISTER.match(operands[1]):
            first = int(REGISTER.match(operands[1]).group(1))
            open_group |= set(range(first, first + 4))
        if "gsb0" in operands:
            groups.append(frozenset(open_group))
            open_group = set()
            if len(groups) > MAX_GROUPS:
                groups[:2] = [groups[0] | groups[1]]
        return State(groups, open_group)
    if opcode.startswith("WARPGROUP.DEPBAR") and len(operands) == 2 and operands[0] == "gsb0":
        keep = int(operands[1], 16)
        return State(groups[len(groups) - keep:] if keep else (), open_group)
    busy = state.busy()
    for register in written_registers(opcode, operands):
        if register in busy:
            hazards.append((function, address, opcode, operands, register))
    return state


def successors(instructions, index, address_index):
    """Indices of the instructions that may follow instruction `index`."""
    _, predicated, opcode, operands = instructions[index]
    following = [index + 1] if index + 1 < len(instructions) else []
    if opcode.startswith(("BRA", "CALL")):
        targets = [address_index[int(o, 16)] for o in operands if re.fullmatch(r"0x[0-9a-f]+", o)
                   and int(o, 16) in address_index]
        conditional = predicated or any(PREDICATE.match("@" + o) for o in operands) or opcode.startswith("CALL")
        return targets + (following if conditional or not targets else [])
    if opcode.startswith(("EXIT", "RET")) and not predicated:
        return []
    return following


def check_function(name, instructions):
    """(hazards, register-A HGMMAs) of one function."""
    address_index = {address: i for i, (address, _, _, _) in enumerate(instructions)}
    states = {0: State()} if instructions else {}
    work = [0] if instructions else []
    while work:  # fixpoint of the may-be-in-flight state at each instruction's entry
        index = work.pop()
        state = transfer(states[index], instructions[index], [], name)
        for nxt in successors(instructions, index, address_index):
            old = states.get(nxt)
            new = state if old is None else old.merged(state)
            if old is None or new.key() != old.key():
                states[nxt] = new
                work.append(nxt)
    hazards = []
    for index, state in sorted(states.items()):
        transfer(state, instructions[index], hazards, name)
    register_a = sum(1 for _, _, op, ops in instructions if op.startswith("HGMMA") and len(ops) > 1
                     and REGISTER.match(ops[1]))
    return hazards, register_a


def check_listing(lines, out=sys.stdout):
    """Checks every function of a SASS listing; returns the number of hazards."""
    total, functions = 0, parse_functions(lines)
    for name, instructions in functions.items():
        hazards, register_a = check_function(name, instructions)
        total += len(hazards)
        for _, address, opcode, operands, register in hazards[:20]:
            print(f"{name}: {address:#06x} {opcode} {', '.join(operands)} writes R{register}, "
                  "a register A operand of a wgmma that may still run", file=out)
        if len(hazards) > 20:
            print(f"{name}: {len(hazards) - 20} more", file=out)
        if register_a:
            print(f"{name}: {register_a} register-A HGMMAs, {len(hazards)} hazards", file=out)
    print(f"{len(functions)} functions, {total} hazards", file=out)
    return total


def disassembler(given):
    """(cuobjdump, its environment) for --dump-sass, or None (said why) when a tool is missing.
    cuobjdump disassembles with nvdisasm, from PATH or NVDISASM_PATH; the wheels put it beside."""
    cuobjdump = find_cuobjdump(given)
    if cuobjdump is None:
        print(f"no cuobjdump found ({given or 'CUDA toolkit, or pip install nvidia-cuda-cuobjdump'}): skipped")
        return None
    environment = dict(os.environ)
    if os.access(os.path.join(os.path.dirname(cuobjdump), "nvdisasm"), os.X_OK):
        environment.setdefault("NVDISASM_PATH", os.path.dirname(cuobjdump))
    elif not shutil.which("nvdisasm") and "NVDISASM_PATH" not in environment:
        print("no nvdisasm found (CUDA toolkit, or pip install nvidia-cuda-nvdisasm): skipped")
        return None
    return cuobjdump, environment


def dump_listings(paths, given):
    """(0, [each file's `cuobjdump --dump-sass` lines]); (SKIPPED, []) without a disassembler and
    (2, []) when a dump fails, each said why."""
    tools = disassembler(given)
    if tools is None:
        return SKIPPED, []
    cuobjdump, environment = tools
    listings = []
    for path in paths:
        dump = subprocess.run([cuobjdump, "--dump-sass", path], capture_output=True, text=True, env=environment)
        if dump.returncode != 0:
            print(f"{cuobjdump} --dump-sass {path} failed: {dump.stderr.strip()}", file=sys.stderr)
            return 2, []
        listings.append(dump.stdout.splitlines())
    return 0, listings


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cuobjdump", help="the cuobjdump to use (default: found on PATH, beside nvcc or "
                        "in the nvidia-cuda-cuobjdump wheel)")
    parser.add_argument("--sass", action="store_true", help="the files are SASS listings")
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    for path in args.files:
        if not os.path.exists(path):
            print(f"{path}: no such file", file=sys.stderr)
            return 2
    total = 0
    if args.sass:
        for path in args.files:
            with open(path) as listing:
                total += check_listing(listing)
        return 1 if total else 0
    status, listings = dump_listings(args.files, args.cuobjdump)
    if status:
        return status
    for listing in listings:
        total += check_listing(listing)
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
