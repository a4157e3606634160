"""Translate a source file and score it against references with sacreBLEU (BLEU and chrF).

The installed command ``seq2seq evaluate`` is the same program (seq2seq/commands/evaluate.py).
"""

from seq2seq.cli import run
from seq2seq.commands.evaluate import main

if __name__ == "__main__":
    run(main)
