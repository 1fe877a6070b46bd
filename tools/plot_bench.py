#!/usr/bin/env python3
"""Draws flashhop-bench's results beside its peers' as a PNG chart: one panel per head dim and mask,
the sequence length on the x axis, one bar per contender (flashhop, FA3, cuDNN, FA2) in each cell.

Inputs, any number, told apart by their "tool" field:
  - `flashhop-bench --json FILE` (scripts/gpu_run.sh's bench.json, features.json, gqa.json);
  - `tools/peers_sdpa.py --json FILE` (peers.json, gqa_peers.json): its cells are matched to
    flashhop's by shape and mask, as peers_sdpa.py's --flashhop-json does;
  - a bundle, {"reports": [...]} holding reports of those two kinds, with optional "title" and
    "source" fields (docs/data/).

Usage:
  tools/plot_bench.py gpu_out/bench.json gpu_out/peers.json -o forward.png
  tools/plot_bench.py docs/data/forward_2026-12-05_2d9383c.json -o docs/images/forward.png
  tools/plot_bench.py gpu_out/gqa.json gpu_out/gqa_peers.json --metric kv_tbps -o gqa.png

Above each cell: flashhop's figure over the best peer's of that cell (speed; flashhop's faster
variant where it has several, e.g. packed and unpacked GQA rows). A flashhop bar whose --check
failed is hatched; a configuration that failed has no bar. Needs matplotlib (the loading and
matching need only the standard library).
"""
import argparse
import json
import sys

# Bar order and colours; peers' keys are those of peers_sdpa.py's JSON.
PEERS = ("fa3", "cudnn", "cudnn_lse", "fa2")
TITLES = {"fa3": "FA3", "cudnn": "cuDNN", "cudnn_lse": "cuDNN + LSE", "fa2": "FA2"}
COLOURS = {"flashhop": "#d62728", "flashhop, pack on": "#d62728", "flashhop, pack off": "#ff9896",
           "fa3": "#1f77b4", "cudnn": "#2ca02c", "cudnn_lse": "#98df8a", "fa2": "#7f7f7f"}
METRICS = {"tflops": "TFLOP/s", "kv_tbps": "K/V TB/s"}


def reports_of(document):
    """The flashhop-bench and peers_sdpa.py reports in one parsed JSON file."""
    if "reports" in document:
        return [r for inner in document["reports"] for r in reports_of(inner)]
    if document.get("tool") in ("flashhop-bench", "peers_sdpa.py"):
        return [document]
    raise ValueError(f"not a flashhop-bench or peers_sdpa.py report (tool: {document.get('tool')!r})")


def mask_of(config):
    """The mask as flashhop-bench names it: 'none', 'causal', 'w(L,R)', 'softcap S', combined."""
    parts = []
    causal = bool(config.get("causal"))
    if causal:
        parts.append("causal")
    left, right = config.get("window_left", -1), config.get("window_right", -1)
    if left >= 0 or (not causal and right >= 0):
        parts.append(f"w({left},{0 if causal else right})")
    if (config.get("softcap") or 0) > 0:
        parts.append(f"softcap {config['softcap']:g}")
    return " ".join(parts) or "none"


def shape_key(config):
    """What a peer's cell and flashhop's share: head dims, mask, sizes (not pack_gqa)."""
    d = config["head_dim"]
    return (d, config.get("head_dim_v", d), mask_of(config), config["seqlen_q"], config["seqlen_k"],
            config["batch"], config["nheads"], config["nheads_kv"], config.get("dtype", "bf16"))


def flashhop_series(config):
    pack = config.get("pack_gqa", "auto")
    return "flashhop" if pack == "auto" else f"flashhop, pack {pack}"


def collect(reports, metric):
    """{shape_key: {series: (value or None, check_failed)}}, plus the series in bar order."""
    cells, series = {}, []

    def add(key, name, value, failed=False):
        cells.setdefault(key, {})[name] = (value, failed)
        if name not in series:
            series.append(name)

    for report in reports:
        for r in report["results"]:
            key = shape_key(r["config"])
            if report["tool"] == "flashhop-bench":
                ok = r.get("status") == "ok"
                failed = r.get("check") is not None and not r["check"]["passed"]
                add(key, flashhop_series(r["config"]), r.get(metric) if ok else None, failed)
            else:
                for name, peer in r["backends"].items():
                    add(key, name, peer.get(metric))
    flashhop = sorted(name for name in series if name.startswith("flashhop"))
    peers = [name for name in PEERS if name in series] + sorted(n for n in series if n not in PEERS and n not in flashhop)
    return cells, flashhop + peers


def panels_of(cells):
    """{(d, dv, mask): [shape_key, ...] in x order}; x order by seqlen_q, seqlen_k, batch."""
    panels = {}
    for key in cells:
        panels.setdefault(key[:3], []).append(key)
    for keys in panels.values():
        keys.sort(key=lambda k: (k[3], k[4], k[5]))
    return panels


def ratio_to_best_peer(cell):
    """flashhop's best figure over the best peer's in one cell, or None (higher is better for both
    metrics)."""
    ours = [v for name, (v, _) in cell.items() if name.startswith("flashhop") and v is not None]
    theirs = [v for name, (v, _) in cell.items() if not name.startswith("flashhop") and v is not None]
    return max(ours) / max(theirs) if ours and theirs else None


def x_label(key):
    _, _, _, sq, sk, batch, h, hkv, _ = key
    size = f"{sq}" if sq == sk else f"{sq} x {sk}"
    return f"{size}\n(b {batch})" if h == hkv else f"{size}\n(b {batch}, {h}/{hkv} h)"


def panel_title(panel):
    d, dv, mask = panel
    dims = f"d = {d}" if d == dv else f"d = {d}, dv = {dv}"
    return f"{dims}, {'no mask' if mask == 'none' else mask}"


def default_title(reports, documents):
    for document in documents:
        if document.get("title"):
            return document["title"]
    bench = next((r for r in reports if r["tool"] == "flashhop-bench"), None)
    device = bench["device"]["name"] if bench else next((r.get("device") for r in reports), "")
    sweep = next((r.get("sweep") for r in reports if r.get("sweep")), None)
    return f"flashhop forward{f', {sweep} sweep' if sweep else ''}, bf16, {device}"


def plot(cells, series, metric, title, out_path, columns=None):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = panels_of(cells)
    # Rows: masks in order of first appearance by head dim; columns: head dims. A sweep whose masks
    # differ per head dim (features) falls back to a plain grid.
    head_dims = sorted({p[:2] for p in panels})
    masks = sorted({p[2] for p in panels}, key=lambda m: (m != "none", m != "causal", m))
    grid = [[(d, dv, m) if (d, dv, m) in panels else None for d, dv in head_dims] for m in masks]
    if sum(p is not None for row in grid for p in row) < 0.75 * len(head_dims) * len(masks):
        ordered = sorted(panels, key=lambda p: (p[0], p[1], p[2] != "none", p[2]))
        columns = columns or min(3, len(ordered))
        grid = [ordered[i:i + columns] for i in range(0, len(ordered), columns)]
        grid[-1] += [None] * (columns - len(grid[-1]))
    rows, cols = len(grid), len(grid[0])
    figure, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.4 * rows + 0.6), squeeze=False)
    width = 0.8 / len(series)
    for r, row in enumerate(grid):
        for c, panel in enumerate(row):
            ax = axes[r][c]
            if panel is None:
                ax.set_visible(False)
                continue
            keys = panels[panel]
            top = 0.0
            for i, name in enumerate(series):
                xs, values, hatches = [], [], []
                for x, key in enumerate(keys):
                    value, failed = cells[key].get(name, (None, False))
                    if value is not None:
                        xs.append(x + (i - (len(series) - 1) / 2) * width)
                        values.append(value)
                        hatches.append("//" if failed else "")
                        top = max(top, value)
                bars = ax.bar(xs, values, width, color=COLOURS.get(name),
                              label=TITLES.get(name, name), edgecolor="black", linewidth=0.3)
                for bar, hatch in zip(bars, hatches):
                    bar.set_hatch(hatch)
            for x, key in enumerate(keys):
                ratio = ratio_to_best_peer(cells[key])
                if ratio is not None:
                    ax.text(x, top * 1.02, f"{ratio:.2f}", ha="center", va="bottom", fontsize=7,
                            color="#d62728" if ratio >= 1 else "black")
            ax.set_ylim(0, top * 1.12 if top > 0 else 1)
            ax.set_xticks(range(len(keys)))
            ax.set_xticklabels([x_label(k) for k in keys], fontsize=7)
            ax.set_title(panel_title(panel), fontsize=9)
            ax.tick_params(axis="y", labelsize=7)
            ax.grid(axis="y", linewidth=0.3)
            ax.set_axisbelow(True)
            if c == 0:
                ax.set_ylabel(METRICS[metric], fontsize=8)
    handles, labels = next(ax for row in axes for ax in row if ax.get_visible()).get_legend_handles_labels()
    figure.legend(handles, labels, loc="upper center", ncol=len(series), fontsize=8, frameon=False,
                  bbox_to_anchor=(0.5, 1.0 - 0.35 / figure.get_figheight()))
    figure.suptitle(title + "\n(above each cell: flashhop / best peer)", fontsize=10, y=0.995)
    figure.tight_layout(rect=(0, 0, 1, 1 - 0.05 / figure.get_figheight()))
    figure.savefig(out_path, dpi=110)
    plt.close(figure)
    return sum(p is not None for row in grid for p in row)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", help="flashhop-bench / peers_sdpa.py JSON reports, or bundles")
    parser.add_argument("-o", "--out", default="bench.png", help="PNG to write [bench.png]")
    parser.add_argument("--metric", choices=sorted(METRICS), default="tflops")
    parser.add_argument("--title", help="chart title [from the bundle, else the device and sweep]")
    parser.add_argument("--peers", help=f"peers to draw, comma-separated, of {', '.join(PEERS)} [all present]")
    args = parser.parse_args(argv)

    documents = []
    for path in args.files:
        with open(path) as f:
            documents.append(json.load(f))
    try:
        reports = [r for d in documents for r in reports_of(d)]
    except ValueError as error:
        parser.error(str(error))
    cells, series = collect(reports, args.metric)
    if args.peers is not None:
        keep = set(args.peers.split(",")) if args.peers else set()
        series = [name for name in series if name.startswith("flashhop") or name in keep]
    if not cells:
        sys.exit("plot_bench.py: no results in the input")
    panels = plot(cells, series, args.metric, args.title or default_title(reports, documents), args.out)
    print(f"wrote {args.out}: {panels} panels, {len(cells)} cells, series {', '.join(series)}")


if __name__ == "__main__":
    main()
