"""Write a generated toy task's splits as text files: {split}.src, {split}.tgt, {split}.align.

The installed command ``seq2seq toy-data`` is the same program (seq2seq/commands/toy_data.py).
"""

from seq2seq.cli import run
from seq2seq.commands.toy_data import main

if __name__ == "__main__":
    run(main)
