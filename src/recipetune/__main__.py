"""``python -m recipetune``: the same command line as ``recipetune``."""

from recipetune.cli import main

main()
