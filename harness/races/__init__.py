"""The race detector: happens-before over an op log, from either source that makes one: a
scenario's trials (the run's workers attach it to their device) and a captured program
(``gpurace watch`` feeds it the translated capture)."""
