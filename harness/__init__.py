"""gpurace's engine (see the README); importing it settles where ``reports`` comes from.

gpurace's report renderers are the top-level package ``reports``. A plain folder of that name in
the working directory (an output folder: ``--out reports``) would be taken for a namespace
package and hide it, since the working directory comes first on ``sys.path`` (``python -m``,
pytest, and the workers, which inherit the path) and an editable install's finder is
asked only after it. When that is about to happen, the folder that holds this package goes first.

PYTEST_DONT_REWRITE: pytest marks the packages of every installed plugin (gpurace's among them)
for assertion rewriting, and warns of each one already imported. Under `gpurace watch --
pytest` this one is, and its asserts are not a test's, so pytest is told to leave it alone.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def _own_reports_first() -> None:
    if "reports" in sys.modules:
        return
    root = Path(__file__).resolve().parent.parent
    if not (root / "reports" / "__init__.py").is_file():
        return  # installed without it beside us: nothing to prefer
    spec = importlib.util.find_spec("reports")
    if spec is None or spec.origin is None:  # missing, or a namespace package: a plain folder
        sys.path.insert(0, str(root))


_own_reports_first()
