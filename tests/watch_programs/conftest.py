"""The watch programs are scripts for `gpurace watch` on a GPU, not tests: collect none."""

collect_ignore_glob = ["*.py"]
