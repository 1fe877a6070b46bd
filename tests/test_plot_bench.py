"""Tests of tools/plot_bench.py on a small run in the files' own layouts (tests/fixtures/plot_bench_*.json:
flashhop-bench --json and tools/peers_sdpa.py --json of four peers-grid cells at d = 64 and 128), and
on docs/data's bundle. The loading and matching run everywhere; drawing needs matplotlib. Exit
status 77 (skipped) when matplotlib is missing and nothing failed."""

import importlib.util
import json
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
sys.path.insert(0, os.path.join(ROOT, "tools"))
import plot_bench as tool  # noqa: E402

BENCH = os.path.join(HERE, "fixtures", "plot_bench_bench.json")
PEERS = os.path.join(HERE, "fixtures", "plot_bench_peers.json")
DOCS_DATA = os.path.join(ROOT, "docs", "data")
HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def load(*paths):
    reports = []
    for path in paths:
        with open(path) as f:
            reports += tool.reports_of(json.load(f))
    return reports


class Loading(unittest.TestCase):
    def test_cells_match_across_the_two_reports(self):
        cells, series = tool.collect(load(BENCH, PEERS), "tflops")
        self.assertEqual(series, ["flashhop", "fa3", "cudnn", "fa2"])
        self.assertEqual(len(cells), 8)
        cell = cells[(128, 128, "none", 1024, 1024, 16, 16, 16, "bf16")]
        self.assertEqual(cell["flashhop"], (520, False))
        self.assertAlmostEqual(cell["cudnn"][0], 494, places=2)
        self.assertAlmostEqual(tool.ratio_to_best_peer(cell), 520 / 530.4, places=3)

    def test_failures_skips_and_errors(self):
        cells, _ = tool.collect(load(BENCH, PEERS), "tflops")
        failed_check = cells[(64, 64, "causal", 1024, 1024, 16, 32, 32, "bf16")]
        self.assertEqual(failed_check["flashhop"], (260, True))
        self.assertIsNone(failed_check["fa3"][0])  # FA3 not installed: skipped
        errored = cells[(128, 128, "causal", 512, 512, 32, 16, 16, "bf16")]
        self.assertIsNone(errored["flashhop"][0])
        self.assertIsNone(cells[(128, 128, "none", 512, 512, 32, 16, 16, "bf16")]["fa2"][0])

    def test_panels_and_masks(self):
        cells, _ = tool.collect(load(BENCH), "tflops")
        panels = tool.panels_of(cells)
        self.assertEqual(sorted(panels), [(64, 64, "causal"), (64, 64, "none"), (128, 128, "causal"),
                                          (128, 128, "none")])
        self.assertEqual([k[3] for k in panels[(64, 64, "none")]], [512, 1024])
        self.assertEqual(tool.mask_of({"causal": True, "window_left": 1024, "window_right": 0, "softcap": 30}),
                         "causal w(1024,0) softcap 30")
        self.assertEqual(tool.mask_of({"causal": False, "window_left": -1, "window_right": 1024}), "w(-1,1024)")

    def test_gqa_variants_are_series_of_their_own(self):
        with open(BENCH) as f:
            report = json.load(f)
        for r, pack in zip(report["results"], ("on", "off")):
            r["config"]["pack_gqa"] = pack
        report["results"] = report["results"][:2]
        _, series = tool.collect([report], "kv_tbps")
        self.assertEqual(series, ["flashhop, pack off", "flashhop, pack on"])

    def test_forward_bundles_hold_both_reports(self):
        for name in sorted(os.listdir(DOCS_DATA)):
            if name.startswith("forward_") and name.endswith(".json"):
                reports = load(os.path.join(DOCS_DATA, name))
                self.assertEqual(sorted(r["tool"] for r in reports), ["flashhop-bench", "peers_sdpa.py"], name)

    def test_not_a_report(self):
        with self.assertRaises(ValueError):
            tool.reports_of({"tool": "something else"})


@unittest.skipUnless(HAVE_MATPLOTLIB, "matplotlib is not installed")
class Drawing(unittest.TestCase):
    def test_writes_a_png(self):
        with tempfile.TemporaryDirectory() as folder:
            out = os.path.join(folder, "bench.png")
            tool.main([BENCH, PEERS, "-o", out, "--title", "fixture"])
            with open(out, "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
            tool.main([BENCH, "-o", out, "--peers", ""])
            tool.main([BENCH, PEERS, "-o", out, "--metric", "kv_tbps", "--peers", "fa3"])


if __name__ == "__main__":
    result = unittest.main(exit=False).result
    if not result.wasSuccessful():
        sys.exit(1)
    sys.exit(0 if HAVE_MATPLOTLIB else 77)
