"""The benchmark's report: the markdown table, the attention-cost plot, the JSON file."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from benchmarks.common import HEADLINE, PEERS, Spread

log = logging.getLogger(__name__)


def _peer_attention(name: str, config: dict[str, Any]) -> str:
    """The peer's name for the scoring function it runs."""
    if name == "joeynmt":
        decoder = config["model"]["decoder"]
        if decoder["type"] == "transformer":  # its heads score with scaled dot products only
            return "Transformer, scaled dot"
        return str(decoder["attention"])
    return str(config["global_attention"])


def peer_report(
    name: str, attention: str, runs: list[dict[str, Any]], ours: dict[str, Any]
) -> dict[str, Any]:
    """One peer's part of the report: its runs, the median of each headline figure, and ours
    against it (``ratios``; above 1 means we are better: ours / theirs for rates and BLEU,
    theirs / ours for memory and seconds)."""
    peer: dict[str, Any] = {"name": name, "title": PEERS[name], "attention": attention}
    ratios = {}
    for key in HEADLINE:
        peer[key] = Spread.of([run.get(key) for run in runs]).median
        # A count of parameters is no better or worse: shown, not compared.
        if key != "parameters" and ours.get(key) and peer[key]:
            lower_is_better = key in ("peak_rss_mb", "time_to_bleu95_s", "startup_s")
            ratios[key] = peer[key] / ours[key] if lower_is_better else ours[key] / peer[key]
    peer["ratios"] = ratios
    peer["runs"] = runs
    return peer


def markdown_table(report: dict[str, Any], costs: dict[str, dict[str, dict[int, Spread]]]) -> str:
    """The report as markdown: a table of ours (and each peer's, then ours / each peer's) and one
    of the scoring costs."""
    ours = report["ours_runs"]
    peers = report.get("peers", [])
    decoder = report["model"]["decoder"].rsplit(".", 1)[-1]
    attention = report["model"]["attention"].rsplit(".", 1)[-1]
    rows = [
        ("train target tok/s", "train_tgt_tok_per_s", 0),
        ("train sentences/s", "train_sent_per_s", 0),
        ("start-up s", "startup_s", 1),
        ("peak RSS MB (training)", "peak_rss_mb", 0),
        ("peak GPU memory MB (training)", "peak_gpu_mb", 0),
        ("greedy sentences/s", "greedy_sent_per_s", 0),
        ("beam-5 sentences/s", "beam5_sent_per_s", 0),
        (f"time to dev BLEU ≥ {report['bleu_target']:g}, s", "time_to_bleu95_s", 1),
        ("dev BLEU at the end (greedy)", "dev_bleu", 1),
        ("parameters", "parameters", 0),
    ]
    gpu = report["machine"].get("gpu")
    if gpu is None:  # a CPU run has no GPU memory row
        rows = [row for row in rows if row[1] != "peak_gpu_mb"]
    where = f", {gpu}" if gpu else ""
    header = f"| | seq2seq ({decoder}, {attention}{where}) |"
    header += "".join(f" {peer['title']} ({peer['attention']}) |" for peer in peers)
    # One peer: "ratio", as before; more: "ours / PEER" for each.
    header += "".join(
        " ratio |" if len(peers) == 1 else f" ours / {peer['title']} |" for peer in peers
    )
    lines = [header, "|---|---|" + "---|" * 2 * len(peers)]
    sizes = report["model"].get("sizes")
    if sizes:  # the model kind and sizes, above the table
        settings = ", ".join(f"{key} {value}" for key, value in sizes.items())
        lines[:0] = [f"Model: {report['model']['kind']} ({settings}).", ""]
    for label, key, digits in rows:
        line = f"| {label} | {Spread.of([run.get(key) for run in ours]).text(digits)} |"
        for peer in peers:
            line += f" {Spread.of([run.get(key) for run in peer['runs']]).text(digits)} |"
        for peer in peers:
            ratio = peer["ratios"].get(key)
            line += f" {ratio:.2f}× |" if ratio else " |"
        lines.append(line)
    lengths = sorted(
        {length for by_name in costs.values() for spread in by_name.values() for length in spread}
    )
    lines += [
        "",
        f"Scoring functions, forward + backward ms at B=64, H=256, S=T=L{where} (median of the "
        "repeats):",
        "",
    ]
    lines.append("| scoring | mode | " + " | ".join(f"L={length}" for length in lengths) + " |")
    lines.append("|---|---|" + "---|" * len(lengths))
    for mode, by_name in costs.items():
        for name, by_length in by_name.items():
            cells = " | ".join(f"{by_length[length].median:.2f}" for length in lengths)
            lines.append(f"| {name} | {mode} | {cells} |")
    return "\n".join(lines) + "\n"


def plot_attention_costs(costs: dict[str, dict[str, dict[int, Spread]]], path: Path) -> None:
    """Forward + backward ms against L for every scoring function, both modes, log-log."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6.4, 4.2))
    for mode, style in [("parallel", "-"), ("stepwise", "--")]:
        for index, (name, by_length) in enumerate(costs[mode].items()):
            lengths = sorted(by_length)
            axis.plot(
                lengths,
                [by_length[length].median or 0.0 for length in lengths],
                style,
                marker="o",
                color=f"C{index}",
                label=f"{name} ({mode})",
            )
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel("S = T (tokens)")
    axis.set_ylabel("forward + backward, ms")
    axis.set_title("Attention cost vs length (B=64, H=256)")
    axis.legend(fontsize=7, ncol=2)
    axis.grid(True, which="both", alpha=0.3)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)


def write_report(report: dict[str, Any], json_path: Path) -> None:
    json_path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


# A smoke test of every code path in seconds (CI), not a measurement.
