"""The explorer's pages, measured: size on disk and first render in headless Chromium.

    python benchmarks/explorer_pages.py --training-run RUN --page explore.html [--repeats 5]

``--training-run RUN`` rewrites ``RUN/attention/explorer.html`` from its newest snapshot as
training writes it (the snapshots before it on the slider) and measures it; ``--page`` measures a
page as it is. First render: from navigation start to the end of the script's first render (its
``explorer-rendered`` performance mark), the median of ``--repeats`` loads, each in a fresh tab,
every request but the page's own refused. Prints a Markdown table (docs/explorer.md)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

from seq2seq.training.callbacks import ATTENTION_DIR, write_training_page


def training_page(run: Path) -> Path:
    directory = run / ATTENTION_DIR
    snapshots = sorted(directory.glob("explorer-step-*.json"))
    if not snapshots:
        sys.exit(f"error: {directory} holds no explorer-step-*.json (was examples.num_samples 0?).")
    return write_training_page(directory, json.loads(snapshots[-1].read_text()), snapshots[-1])


def first_render_ms(browser: Any, path: Path) -> float:
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    refused: list[str] = []

    def only_the_page(route: Any) -> None:
        if route.request.url == path.as_uri():
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    context.route("**/*", only_the_page)
    tab = context.new_page()
    tab.goto(path.as_uri())
    milliseconds = tab.evaluate("performance.getEntriesByName('explorer-rendered')[0].startTime")
    context.close()
    if refused:
        sys.exit(f"error: {path} asked for {refused[0]}")
    return float(milliseconds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--training-run", type=Path, action="append", default=[], metavar="RUN")
    parser.add_argument("--page", type=Path, action="append", default=[], metavar="HTML")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("error: no Chromium (apt-get install chromium).")
    from playwright.sync_api import sync_playwright

    pages = [training_page(run) for run in args.training_run] + args.page
    rows = []
    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        for path in pages:
            times = [first_render_ms(browser, path) for _ in range(args.repeats)]
            rows.append((path, path.stat().st_size, statistics.median(times), max(times)))
        browser.close()
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, headless Chromium")
    print("| page | size | first render, median (max) |\n|---|---|---|")
    for path, size, median, most in rows:
        print(f"| {path} | {size / 1e6:.2f} MB | {median:.0f} ms ({most:.0f}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
