"""Check an attention you wrote: its properties on random inputs, and the bug that fits a failure.

The installed command ``seq2seq check`` is the same program (seq2seq/commands/check.py).
"""

from seq2seq.cli import run
from seq2seq.commands.check import main

if __name__ == "__main__":
    run(main)
