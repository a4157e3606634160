"""Choose the beam size and length penalty on a validation set (never on test): a BLEU table.

The installed command ``seq2seq tune`` is the same program (seq2seq/commands/tune.py).
"""

from seq2seq.cli import run
from seq2seq.commands.tune import main

if __name__ == "__main__":
    run(main)
