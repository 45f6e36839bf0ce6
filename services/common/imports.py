"""User code by reference: the one loader for reward functions, tools and environments.

User code resolves as in a child that multiprocessing's spawn started from the user's script:
the job's `sys_path` (the script's own sys.path, handed over by the Python API; `agrpo run`
adds the folder of its config file) goes first on sys.path (`adopt_sys_path`), then the
working directory, as with `python -m`.

A reference is one of:
- `package.module:attr.path`: imported from those folders;
- `path/to/script.py:attr`: the script is loaded as module `__mp_main__`, as
  multiprocessing's spawn does, so its `if __name__ == "__main__":` block does not run
  (how `agrpo.AsyncGRPOTrainer` refers to functions defined in the training script);
- `pickle:path/to/file.pkl`: an object pickled by the Python API (a functools.partial, a
  callable instance); its script, if any, is loaded first as above so the pickle resolves.
"""

from __future__ import annotations

import importlib
import importlib.machinery
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


class UserCodeNotFound(ImportError):
    """A reference's module is on none of the folders searched (one line naming them)."""


def adopt_sys_path(folders: list[str]) -> None:
    """Put the job's folders first on sys.path, in order (those already there stay where they are)."""
    missing = [str(Path(f).resolve()) for f in folders if str(Path(f).resolve()) not in sys.path]
    sys.path[:0] = list(dict.fromkeys(missing))


def spawn_sys_path() -> list[str]:
    """This process's sys.path as a spawned child would get it: absolute folders ('' is the
    working directory), the interpreter's own (stdlib, site-packages) left out."""
    own = {str(Path(p).resolve()) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    out = []
    for entry in sys.path:
        folder = Path(entry or os.getcwd()).resolve()
        if folder.is_dir() and not any(str(folder).startswith(o + os.sep) or str(folder) == o for o in own):
            out.append(str(folder))
    return list(dict.fromkeys(out))


def missing_module(ref: str, folders: list[str]) -> str | None:
    """Why `ref`'s module cannot be found from `folders` (then sys.path), without importing it;
    None when it can (or the reference is not a module's: a script, a pickle, a built-in name)."""
    target, sep, _ = ref.rpartition(":")
    if not sep or ref.startswith("pickle:"):
        return None
    if target.endswith(".py"):
        return None if Path(target).is_file() else f"no file {target}"
    top = target.split(".")[0]
    searched = list(dict.fromkeys([*(str(Path(f).resolve()) for f in folders), os.getcwd()]))
    if importlib.machinery.PathFinder.find_spec(top, [*searched, *sys.path]) is not None or top in sys.modules:
        return None
    return f"no module named {top!r} in {', '.join(searched)} (nor on PYTHONPATH)"


def _import_module(name: str):
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not (name == exc.name or name.startswith(exc.name + ".")):
            raise  # the user's module was found; something it imports is missing
        searched = ", ".join(spawn_sys_path()) or "no folder"
        raise UserCodeNotFound(f"no module named {exc.name!r} in {searched} "
                               "(a module beside the script or config, on PYTHONPATH or the job's sys_path)",
                               name=exc.name) from None



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
