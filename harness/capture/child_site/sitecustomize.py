"""Run at the start of every Python child of a watched program (this folder is first on the
PYTHONPATH that `gpurace watch`'s boot hands its children): the child is watched into an events
file of its own (:func:`harness.capture.children.watch_child`), then the ``sitecustomize`` this
one stands in front of, if the interpreter has one, runs as it would have. Nothing here may
stop the child: any failure leaves it unwatched.
"""

import importlib.machinery
import importlib.util
import os
import sys

try:
    from harness.capture.children import watch_child

    watch_child()
except Exception:  # noqa: S110 - a child that cannot be watched runs unwatched
    pass

_here = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.machinery.PathFinder.find_spec(
    "sitecustomize", [p for p in sys.path if os.path.abspath(p or ".") != _here])
if _spec is not None and _spec.loader is not None:
    _module = importlib.util.module_from_spec(_spec)
    sys.modules["sitecustomize"] = _module
    _spec.loader.exec_module(_module)
