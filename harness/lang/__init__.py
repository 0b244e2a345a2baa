"""The scenario language: what a scenario or suite file may say (``vocabulary``: every step op
and its arguments), how YAML is read with each node's line and column (``yamlnodes``), the
step list checked against the world it names (``steplist``, with what each variant has named in
``scope``, what kvcore would refuse in ``capacity`` and CUDA graphs' captures in ``graphs``), the
loader (``scenario``) and the frozen records it makes (``model``), what a scenario's world costs
(``footprint``), and where a name on the command line is found (``targets``)."""
