"""`python -m condsearch`: the command line, the same as the `condsearch` script."""

from condsearch.cli import main

main()
