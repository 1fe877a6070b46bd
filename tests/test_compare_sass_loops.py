"""Tests of tools/compare_sass_loops.py on small SASS listings."""

import io
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import compare_sass_loops as tool  # noqa: E402
from test_check_wgmma_operands import listing  # noqa: E402


BODY = ["FFMA R4, R5, R6, R7", "MUFU.EX2 R8, R4", "FMNMX R9, R8, R9, !PT", "F2FP.BF16.F32.PACK_AB R10, R8, R9"]


def loop_listing(body, name="kernel"):
    """MOV, then body, then a branch back to the body's first instruction (0x10), then EXIT."""
    return listing("MOV R1, c[0x0][0x28]", *body, "@P0 BRA 0x10", "EXIT", name=name)


def rows(a, b, shortest=2, longest=100):
    return tool.compare(a, b, shortest, longest, out=io.StringIO())


class CompareSassLoops(unittest.TestCase):
    def test_same_schedule_is_one(self):
        result = rows(loop_listing(BODY), loop_listing(BODY))
        self.assertEqual([(length_a, length_b, ratio) for _, length_a, length_b, ratio in result], [(5, 5, 1.0)])

    def test_reordered_or_renamed_schedule_is_below_one(self):
        reordered = [BODY[1], BODY[0]] + BODY[2:]
        renamed = [text.replace("R9", "R11") for text in BODY]
        for other in (reordered, renamed):
            (_, _, _, ratio), = rows(loop_listing(BODY), loop_listing(other))
            self.assertLess(ratio, 1.0)
            self.assertGreater(ratio, 0.0)

    def test_loop_length_window_and_forward_branches(self):
        self.assertEqual(rows(loop_listing(BODY), loop_listing(BODY), shortest=6), [])
        self.assertEqual(rows(loop_listing(BODY), loop_listing(BODY), longest=4), [])
        forward = listing("MOV R1, c[0x0][0x28]", "@P0 BRA 0x30", *BODY, "EXIT")
        self.assertEqual(rows(forward, forward), [])

    def test_only_functions_in_both_listings(self):
        self.assertEqual(rows(loop_listing(BODY, name="a"), loop_listing(BODY, name="b")), [])


if __name__ == "__main__":
    unittest.main()
