"""Tests of tools/check_wgmma_operands.py on small SASS listings of the shapes the kernels take."""

import io
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import check_wgmma_operands as checker  # noqa: E402


def listing(*instructions, name="kernel"):
    """A cuobjdump-style listing of one function, instructions 16 bytes apart from 0."""
    lines = [f"\t\tFunction : {name}"]
    for i, text in enumerate(instructions):
        lines.append(f"        /*{i * 16:04x}*/                   {text} ;   /* 0x0000000000000000 */")
    return lines


def hazards(*instructions):
    return checker.check_listing(listing(*instructions), out=io.StringIO())


S_GEMM = ("HGMMA.64x128x16.F32.BF16 R24, gdesc[UR20], RZ, !UPT",
          "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR24], R24, gsb0")
PV_GEMM = ("HGMMA.64x128x16.F32.BF16 R88, R152, gdesc[UR8], R88",
           "HGMMA.64x128x16.F32.BF16 R88, R156, gdesc[UR12], R88, gsb0")


class CheckWgmmaOperands(unittest.TestCase):
    def test_write_before_the_wait_is_a_hazard(self):
        self.assertEqual(hazards("WARPGROUP.ARRIVE", *PV_GEMM, "MUFU.EX2 R153, R40", "EXIT"), 1)

    def test_write_after_the_wait_is_not(self):
        self.assertEqual(hazards("WARPGROUP.ARRIVE", *PV_GEMM, "WARPGROUP.DEPBAR.LE gsb0, 0x0",
                                 "MUFU.EX2 R153, R40", "F2FP.BF16.F32.PACK_AB R156, R41, R40", "EXIT"), 0)

    def test_reads_and_other_registers_are_not(self):
        self.assertEqual(hazards(*PV_GEMM, "FMUL R40, R152, R153", "STS [R152], R153", "MOV R160, R4", "EXIT"), 0)

    def test_wide_writes_cover_their_registers(self):
        self.assertEqual(hazards(*PV_GEMM, "LDS.128 R148, [R2]", "EXIT"), 0)  # R148..R151: none busy
        self.assertEqual(hazards(*PV_GEMM, "LDS.128 R149, [R2]", "EXIT"), 1)  # R149..R152
        self.assertEqual(hazards(*PV_GEMM, "IMAD.WIDE R151, R2, 0x4, R4", "EXIT"), 1)

    def test_wait_for_one_group_leaves_the_newest_in_flight(self):
        # S issued, then P V, then a wait for S: P V may still run.
        self.assertEqual(hazards(*S_GEMM, *PV_GEMM, "WARPGROUP.DEPBAR.LE gsb0, 0x1", "FADD R154, R24, R25", "EXIT"), 1)
        # P V issued, then S, then a wait for P V: it retired.
        self.assertEqual(hazards(*PV_GEMM, *S_GEMM, "WARPGROUP.DEPBAR.LE gsb0, 0x1", "FADD R154, R24, R25", "EXIT"), 0)

    def test_hazard_across_the_back_edge(self):
        # P V issued at the loop's end; the loop's top writes its registers before the wait.
        self.assertEqual(hazards("MOV R152, R4",                  # 0x00
                                 "WARPGROUP.DEPBAR.LE gsb0, 0x0",  # 0x10
                                 *PV_GEMM,                         # 0x20, 0x30
                                 "@P0 BRA 0x0",                    # 0x40
                                 "EXIT"), 1)
        self.assertEqual(hazards("WARPGROUP.DEPBAR.LE gsb0, 0x0", "MOV R152, R4", *PV_GEMM, "@P0 BRA 0x0",
                                 "WARPGROUP.DEPBAR.LE gsb0, 0x0", "EXIT"), 0)

    def test_hazard_on_a_path_that_skips_the_wait(self):
        self.assertEqual(hazards(*PV_GEMM,                         # 0x00, 0x10
                                 "@P0 BRA 0x40",                   # 0x20
                                 "WARPGROUP.DEPBAR.LE gsb0, 0x0",  # 0x30
                                 "MOV R152, R4",                   # 0x40
                                 "EXIT"), 1)
        self.assertEqual(hazards(*PV_GEMM, "WARPGROUP.DEPBAR.LE gsb0, 0x0", "@P0 BRA 0x50", "NOP",
                                 "NOP", "MOV R152, R4", "EXIT"), 0)

    def test_unconditional_branch_does_not_fall_through(self):
        self.assertEqual(hazards(*PV_GEMM, "BRA 0x40", "MOV R152, R4", "WARPGROUP.DEPBAR.LE gsb0, 0x0",
                                 "MOV R152, R4", "EXIT"), 0)


if __name__ == "__main__":
    unittest.main()
