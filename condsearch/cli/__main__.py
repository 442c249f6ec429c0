"""`python -m condsearch.cli`: the command line, the same as `python -m condsearch`."""

from condsearch.cli import main

main()
