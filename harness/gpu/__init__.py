"""What the GPU says during a run, and whether there is one: Xid numbers (:mod:`.xid`), NVML
(:mod:`.nvml`), the kernel log (:mod:`.kernlog`), the per-trial watch (:mod:`.watch`) with its
helper process (:mod:`.watchproc`), and the backend probe (:mod:`.probe`). The run's parent loads
no GPU library: the probe and the NVML watching run in child processes."""
