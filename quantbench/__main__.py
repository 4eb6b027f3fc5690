"""`python -m quantbench` is the `quantbench` command (for machines where the script is not on PATH)."""

from quantbench.cli import main

main()
