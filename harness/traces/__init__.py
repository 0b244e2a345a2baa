"""What reads and writes traces: op traces (``optrace``: one device action a line), the flight
recorder that writes them from a worker that may die (``flight``), request-level tickets
(``ticket``, their records in ``requests``), and the JSON Lines checks they share (``jsonl``)."""
