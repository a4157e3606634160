"""Export a checkpoint as a pickle-free bundle directory for inference.

The installed command ``seq2seq export`` is the same program (seq2seq/commands/export.py).
"""

from seq2seq.cli import run
from seq2seq.commands.export import main

if __name__ == "__main__":
    run(main)
