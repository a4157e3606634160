"""Alignment error rate (AER) of a model's attention against gold word alignments.

The installed command ``seq2seq align`` is the same program (seq2seq/commands/align.py).
"""

from seq2seq.cli import run
from seq2seq.commands.align import main

if __name__ == "__main__":
    run(main)
