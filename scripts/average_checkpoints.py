"""Average the weights of several checkpoints into one, for evaluate.py, translate.py, export.py.

The installed command ``seq2seq average`` is the same program (seq2seq/commands/average.py).
"""

from seq2seq.cli import run
from seq2seq.commands.average import main

if __name__ == "__main__":
    run(main)
