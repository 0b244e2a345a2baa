"""What trials come to: how each trial ended and what a variant's trials add up to
(``outcome``), and how sure a rate is (``rates``, Wilson intervals). The race detector, the
runner and the capture all speak in these records, so they sit below all three."""
