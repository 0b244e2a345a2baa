"""What the project's makers run, not its users: the JSON Schemas' builder
(``python -m harness.tools.schemas``), which reads every layer to describe its documents and so
stands above them all."""
