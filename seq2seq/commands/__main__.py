"""``python -m seq2seq.commands COMMAND ARGS``: the installed ``seq2seq`` command."""

from seq2seq.commands import main

main()
