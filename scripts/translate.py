"""Translate text: one output line per input line, in order, streamed.

The installed command ``seq2seq translate`` is the same program (seq2seq/commands/translate.py).
"""

from seq2seq.cli import run
from seq2seq.commands.translate import main

if __name__ == "__main__":
    run(main)
