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
# # The attention explorer in a notebook
#
# The page `seq2seq explore` writes, inline: the same script and data in a sandboxed iframe, nothing fetched. It shows the model at `SEQ2SEQ_MODEL` (a checkpoint or bundle, e.g. a toy run's `RUN/checkpoints/best.ckpt`), or one trained here in about half a minute.

# %%
import importlib.util, subprocess, sys
if importlib.util.find_spec("seq2seq") is None:  # a fresh environment: install the toolkit beside this notebook
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", ".."])

import os
import shutil
import seq2seq

MODEL = os.environ.get("SEQ2SEQ_MODEL")
if MODEL is None:  # a small model of the toy task, trained now (afresh each time it runs)
    shutil.rmtree("runs/explorer", ignore_errors=True)
    MODEL = seq2seq.train("data.train_size=6000", "data.val_size=100", "data.test_size=100",
                          "trainer.max_epochs=3", "logger=csv", "trainer.enable_progress_bar=false",
                          "run_dir=runs/explorer")
MODEL

# %%
sentences = ["the dog sees a cat .", "a small bird sings ."]
seq2seq.explore({"toy": MODEL}, sentences, beam_size=3)

# %% [markdown]
# Hover a cell (or click a map and use the arrow keys): the weight reads at the top. `seq2seq.explore` takes up to four models (runs, translators, checkpoint or bundle paths), references (`refs=[...]`) and gold alignments (`align=[...]`), as `seq2seq explore` does; `.save("page.html")` writes the page to a file.
