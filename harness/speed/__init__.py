"""Where the harness's time goes: profiles of a run's trials by the part of gpurace (or of the
device's libraries) that spent it, for the speed work the benchmark's ratios call for."""
