"""User code by reference: the one loader for reward functions, tools and environments.

A reference is one of:
- `package.module:attr.path`: imported (the working directory is importable, as with
  `python -m`, so a module next to the config is found);
- `path/to/script.py:attr`: the script is loaded as module `__mp_main__`, as
  multiprocessing's spawn does, so its `if __name__ == "__main__":` block does not run
  (how `agrpo.AsyncGRPOTrainer` refers to functions defined in the training script);
- `pickle:path/to/file.pkl`: an object pickled by the Python API (a functools.partial, a
  callable instance); its script, if any, is loaded first as above so the pickle resolves.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pickle
import sys
from pathlib import Path
from typing import Any

MAIN_ALIAS = "__mp_main__"


def load_object(ref: str) -> Any:
    """The object a reference names; ValueError for a malformed one."""
    if ref.startswith("pickle:"):
        return _unpickle(Path(ref.removeprefix("pickle:")))
    target, sep, attr_path = ref.rpartition(":")
    if not sep or not target or not attr_path:
        raise ValueError(f"{ref!r}: expected 'module:attr' (or 'script.py:attr')")
    module = load_script(Path(target)) if target.endswith(".py") else _import_module(target)
    obj: Any = module
    for part in attr_path.split("."):
        obj = getattr(obj, part)
    return obj


def _import_module(name: str):
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    return importlib.import_module(name)


def load_script(path: Path):
    """A training script as `__mp_main__` (also `__main__`'s stand-in for unpickling)."""
    loaded = sys.modules.get(MAIN_ALIAS)
    if loaded is not None and getattr(loaded, "__file__", None) == str(path.resolve()):
        return loaded
    spec = importlib.util.spec_from_file_location(MAIN_ALIAS, path.resolve())
    if spec is None or spec.loader is None:
        raise ValueError(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[MAIN_ALIAS] = module
    sys.path.insert(0, str(path.resolve().parent))  # the script's own imports
    spec.loader.exec_module(module)
    return module


def _unpickle(path: Path) -> Any:
    data = pickle.loads(path.read_bytes()) if path.suffix == ".pkl" else None
    if not isinstance(data, dict) or "payload" not in data:
        raise ValueError(f"{path}: not a pickle written by agrpo's Python API")
    if data.get("main_file"):
        main = load_script(Path(data["main_file"]))
        saved = sys.modules.get("__main__")
        sys.modules["__main__"] = main  # objects pickled in the script resolve against it
        try:
            return pickle.loads(data["payload"])
        finally:
            if saved is not None:
                sys.modules["__main__"] = saved
    return pickle.loads(data["payload"])


def dump_pickled(obj: Any, path: Path, main_file: str | None) -> str:
    """Write `obj` for `load_object` (TypeError, as TRL raises, when it cannot be pickled)."""
    try:
        payload = pickle.dumps(obj)
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        raise TypeError(f"{obj!r} cannot be pickled ({exc}): lambdas and closures are not supported; use "
                        "a module-level function, functools.partial or a callable class instance") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps({"payload": payload, "main_file": main_file}))
    return f"pickle:{path.resolve()}"
