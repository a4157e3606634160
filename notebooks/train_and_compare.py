# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Train and compare: additive against scaled dot-product attention, and sparsemax
#
# Two scoring functions, and additive attention with sparsemax in place of the softmax (weights that can be exactly 0), two seeds each, on the toy task (a made-up language with gold word alignments), each trained in about half a minute on two laptop cores. Then the comparison as `seq2seq compare` makes it — each run, the groups with a 95 % interval over seeds, paired tests — and the attention of all three on the same sentences, with the gold links, in the explorer.

# %%
import importlib.util, subprocess, sys
if importlib.util.find_spec("seq2seq") is None:  # a fresh environment: install the toolkit beside this notebook
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", ".."])

import json
import shutil
import seq2seq
from seq2seq.explorer.data import snapshot_sentences

# The command line's overrides: the default model on 6,000 toy sentences for 3 epochs.
SMALL = ["data.train_size=6000", "data.val_size=100", "data.test_size=100", "trainer.max_epochs=3",
         "logger=csv", "trainer.enable_progress_bar=false"]

# %%
# Every group names the same keys, so that the comparison names the groups by them.
SETTINGS = {"additive": ["attention=additive", "attention.normalizer=softmax"],
            "scaled_dot": ["attention=scaled_dot", "attention.normalizer=softmax"],
            "additive-sparsemax": ["attention=additive", "attention.normalizer=sparsemax"]}
shutil.rmtree("runs/compare", ignore_errors=True)  # this notebook's own runs, afresh each time it runs
runs = {}
for name, overrides in SETTINGS.items():
    for seed in [1, 2]:
        runs[name, seed] = seq2seq.train(*SMALL, *overrides, f"seed={seed}",
                                         f"run_dir=runs/compare/{name}-{seed}")
runs

# %% [markdown]
# Each run is a directory (`run.directory`) with its resolved config, checkpoints, `metrics.csv` (`run.metrics()`) and the test set's hypotheses. `seq2seq.compare` groups them by config but the seed:

# %%
seq2seq.compare(list(runs.values()), samples=200)

# %% [markdown]
# With two seeds an interval is wide; `beyond seed spread` says whether the two groups' intervals are apart. Now the attention itself, on the validation sentences training looked at, with their gold links (the same tokens for every model, so a difference map compares two of them cell by cell; sparsemax's exact zeros are hatched):

# %%
snapshot = sorted((runs["additive", 1].directory / "attention").glob("explorer-step-*.json"))[-1]
sources, references, gold = snapshot_sentences(json.loads(snapshot.read_text()))
seq2seq.explore({name: runs[name, 1] for name in SETTINGS}, sources, references, gold)

# %% [markdown]
# Hover a cell (or click a map and use the arrow keys) to read a weight; the menus switch to the decoding map or a √w scale. To go further: `attention.normalizer=entmax15`, `attention.window=local_m` or `attention.coverage=true` as one more setting ([docs/attention.md](../docs/attention.md)); [your own attention](your_own_attention.ipynb) trains a scoring function written in a cell.
