"""Searches over runs of trials: exploring a scenario's interleavings (``explore``) and
shrinking a failure to its smallest scenario (``minimize``)."""
