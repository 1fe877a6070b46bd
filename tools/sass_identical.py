#!/usr/bin/env python3
"""Whether two builds of one kernel file hold the same machine code: the kernels' SASS of two
objects, paired by length (their mangled names differ when template arguments are renamed),
compared instruction by instruction with addresses and symbol names masked. Exit 1 on a difference.
Usage: sass_identical.py OBJECT_A OBJECT_B   (CUOBJDUMP: the cuobjdump to use)"""
import re, subprocess, sys, os, difflib
CUOBJ = os.environ.get("CUOBJDUMP", "cuobjdump")
def funcs(path):
    out = subprocess.run([CUOBJ, "--dump-sass", path], capture_output=True, text=True).stdout
    fs = []; cur = None
    for line in out.splitlines():
        if "Function :" in line:
            cur = []; fs.append(cur); continue
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s*(.*?)\s*;", line)
        if m and cur is not None:
            ins = re.sub(r"0x[0-9a-f]+", "ADDR", m.group(1))
            ins = re.sub(r"\w*_Z\w+", "SYM", ins)
            cur.append(ins)
    return fs
a, b = sys.argv[1], sys.argv[2]
fa, fb = funcs(a), funcs(b)
fa.sort(key=len); fb.sort(key=len)
if len(fa) != len(fb):
    print(f"{os.path.basename(b)}: {len(fa)} vs {len(fb)} functions"); sys.exit(1)
bad = 0
for x, y in zip(fa, fb):
    if x != y:
        r = difflib.SequenceMatcher(None, x, y, autojunk=False).ratio()
        print(f"{os.path.basename(b)}: function of {len(x)} vs {len(y)} instructions differs, ratio {r:.4f}")
        bad += 1
if not bad: print(f"{os.path.basename(b)}: identical ({len(fa)} functions, {sum(map(len, fa))} instructions)")
sys.exit(1 if bad else 0)
