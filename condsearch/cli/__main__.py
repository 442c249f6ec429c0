from condsearch.cli import main

main()
