"""``model.algorithm: custom``: the party's own training code behind the model seam.

``model.entry`` names a Python object as ``package.module:attribute`` (importable at the
party) or ``path/to/file.py:attribute`` (relative paths are taken from the job file's folder).
The object is either a :class:`confide.ml.base.FederatedModel` instance or a callable that
returns one; a callable gets ``model.options`` as keyword arguments. The adapters make the
usual cases a few lines:

* :class:`confide.ml.torch_adapter.TorchModel`: a ``torch.nn.Module`` plus the user's own
  training function (``examples/pytorch_digits/`` is a plain PyTorch model written the way a
  PyTorch user writes it).
* :class:`confide.ml.sklearn_adapter.SklearnModel`: a scikit-learn linear estimator with
  ``partial_fit`` and ``coef_`` / ``intercept_``.

The code runs with the party's own privileges, at the party: it is the party's code, not
something the controller or the developer can push into a hospital.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from confide.errors import InvalidParameterError

__all__ = ["build", "load_entry"]


def load_entry(entry: str, *, who: str = "this party", field: str = "model.entry") -> Any:
    """The object ``entry`` names (``module:attr`` or ``file.py:attr``); errors name ``field``."""
    location, _, attribute = entry.rpartition(":")
    if not location or not attribute:
        raise InvalidParameterError(f"{who}: {field} must look like 'package.module:attribute', got {entry!r}")
    try:
        if location.endswith(".py"):
            path = Path(location)
            if not path.is_file():
                raise InvalidParameterError(f"{who}: {field} file {str(path)!r} does not exist")
            name = f"confide_user_{abs(hash(str(path.resolve())))}"
            spec = importlib.util.spec_from_file_location(name, path)
            if spec is None or spec.loader is None:
                raise InvalidParameterError(f"{who}: {field} file {str(path)!r} is not a Python module")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(location)
    except InvalidParameterError:
        raise
    except Exception as error:  # noqa: BLE001 - the user's module failed to import: say so, with its message
        raise InvalidParameterError(
            f"{who}: {field} {entry!r} cannot be imported: {type(error).__name__}: {error}"
        ) from None
    target: Any = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            close = difflib.get_close_matches(part, [n for n in dir(target) if not n.startswith("_")], n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise InvalidParameterError(f"{who}: {field} {entry!r}: {location} has no attribute {attribute!r}{hint}")
        target = getattr(target, part)
    return target


def build(spec: Any, *, seed: int, party_id: str, **_options: Any) -> Any:
    """The seam's factory for ``model.algorithm: custom``."""
    who = f"party {party_id!r}"
    target = load_entry(spec.entry, who=who)
    if hasattr(target, "fit") and hasattr(target, "get_weights"):
        return target
    if not callable(target):
        raise InvalidParameterError(f"{who}: model.entry {spec.entry!r} is neither a model nor a factory")
    try:
        return target(**spec.options)
    except TypeError as error:
        raise InvalidParameterError(f"{who}: model.entry {spec.entry!r} refused model.options: {error}") from None
