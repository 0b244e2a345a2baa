"""``python -m harness.cli``: the console script ``gpurace``."""

from harness.cli import main

main()
