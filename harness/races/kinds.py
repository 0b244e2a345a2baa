"""Op kinds the race detector words its findings by, named where the capture makes them too:
this module imports nothing, so a capture source can name a kind without loading the
detector."""

COLLECTIVE = "kernel:c10d."
"""How a captured collective's kind begins (``kernel:c10d.allreduce``): it runs on its process
group's own stream, ordered after by the program's wait on its work."""
FUNCTIONAL_COLLECTIVE = COLLECTIVE + "functional."
"""How a functional collective's kind begins (``kernel:c10d.functional.all_reduce``): ordered
after only by ``wait_tensor`` of its result."""
GRAPH_BRANCH = "'s graph branch "
"""How a replayed CUDA graph's branch stream is named: the replay stream's name, this, and the
name of the stream that captured the branch (``s1's graph branch s2``)."""
