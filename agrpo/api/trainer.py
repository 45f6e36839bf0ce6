"""`AsyncGRPOTrainer(model=..., reward_funcs=..., train_dataset=...).train()`, as in TRL.

The trainer runs as an `agrpo run` job: the constructor's pieces become one config file in
`<output_dir>/api/` (callables by reference, an in-memory dataset written once as JSONL,
the tokenizer saved), and `train()` starts vLLM, reward, trainer and rollout, shows
progress and returns when training is done. Callables follow TRL's rule: module-level
functions, functools.partial or callable instances; lambdas and closures raise TypeError.
What differs from TRL is in docs/from-trl.md.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from agrpo.rewards import builtin_entry
from agrpo.services.common.config.model import AgrpoConfig
from agrpo.services.common.imports import dump_pickled, spawn_sys_path

from .peft_config import peft_section


class AsyncGRPOConfig(AgrpoConfig):
    """TRL's AsyncGRPOConfig: every parameter with its name and default (docs/config.md)."""


def _main_file() -> str | None:
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    return str(Path(path).resolve()) if path else None


def reference(obj: Any, where: Path, what: str) -> str:
    """How the services find `obj`: its name, `module:attr`, `script.py:attr` or a pickle."""
    if isinstance(obj, str):
        return obj
    name = getattr(obj, "__qualname__", "")
    if inspect.isfunction(obj) and ("<lambda>" in name or "<locals>" in name):
        raise TypeError(f"{what} {name!r} is a lambda or a closure, which the services cannot load "
                        "(TRL pickles them and fails too): use a module-level function, "
                        "functools.partial or a callable class instance")
    if (inspect.isfunction(obj) or inspect.isclass(obj)) and "." not in name:
        module = obj.__module__
        if module == "__main__":
            main = _main_file()
            if main is None:
                raise TypeError(f"{what} {name!r} is defined in an interactive session: put it in a module")
            return f"{main}:{name}"
        return f"{module}:{name}"
    if not callable(obj):
        raise TypeError(f"{what} {obj!r} is not callable")
    return dump_pickled(obj, where / f"{what.replace(' ', '_')}_{id(obj):x}.pkl", _main_file())


class AsyncGRPOTrainer:
    """Asynchronous GRPO on this machine, with TRL's constructor."""

    def __init__(self, model: str, reward_funcs: Callable | str | list | None = None,
                 args: AgrpoConfig | None = None, train_dataset: Any = None, processing_class: Any = None,
                 callbacks: list | None = None, optimizers: tuple = (None, None), peft_config: Any = None,
                 tools: list | None = None,
                 environment_factory: Any = None, rollout_worker: Any = None, weight_transfer: Any = None):
        for name, value in (("callbacks", callbacks), ("rollout_worker", rollout_worker),
                            ("weight_transfer", weight_transfer)):
            if value:
                raise NotImplementedError(f"{name} is not supported: agrpo's services replace it "
                                          "(docs/from-trl.md)")
        if optimizers != (None, None):
            raise NotImplementedError("optimizers is not supported: set optim and its arguments in args")
        if not isinstance(model, str):
            raise TypeError("model must be a model folder (a string), as in TRL's AsyncGRPOTrainer")
        self.model, self.args = model, args or AsyncGRPOConfig()
        self.reward_funcs = [] if reward_funcs is None else (
            list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs])
        self.train_dataset, self.processing_class = train_dataset, processing_class
        self.tools, self.environment_factory = list(tools or []), environment_factory
        self.peft = peft_section(peft_config) if peft_config is not None else None
        self.api_dir = Path(self.args.resolved_output_dir) / "api"

    def _dataset(self) -> dict:
        """Config of the dataset: a path as given, an in-memory one written once as JSONL."""
        data, ds = self.train_dataset, self.args.dataset.model_dump(exclude_none=True)
        if data is None:
            return ds
        if isinstance(data, (str, Path)):
            path = str(data)
            return {"path": "json", "data_files": path} if path.endswith((".json", ".jsonl")) else {"path": path}
        out = self.api_dir / "train.jsonl"
        out.parent.mkdir(parents=True, exist_ok=True)
        if hasattr(data, "to_json"):
            data.to_json(str(out), lines=True, force_ascii=False)
        else:  # an IterableDataset (or any iterable of rows): written whole
            import json

            with out.open("w") as f:
                for row in data:
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
        return {**ds, "path": "json", "data_files": str(out), "split": "train"}

    def config(self) -> Path:
        """Write the job's config file; return its path."""
        raw = self.args.model_dump(mode="json", exclude_unset=True)
        raw.update(model=str(Path(self.model).resolve()) if Path(self.model).exists() else self.model,
                   dataset=self._dataset(), output_dir=str(Path(self.args.resolved_output_dir).resolve()),
                   sys_path=list(dict.fromkeys([*self.args.sys_path, *spawn_sys_path()])))
        if self.reward_funcs:  # agrpo.rewards' functions run as the built-ins they call
            raw["reward_funcs"] = [builtin_entry(f) or {"name": reference(f, self.api_dir, "reward function")}
                                   for f in self.reward_funcs]
        if self.peft is not None:
            raw["peft"] = self.peft
        if self.tools:
            raw["tools"] = [reference(t, self.api_dir, "tool") for t in self.tools]
        if self.environment_factory is not None:
            env = self.environment_factory
            raw["environment_factory"] = ({k: reference(v, self.api_dir, "environment") for k, v in env.items()}
                                          if isinstance(env, dict) else reference(env, self.api_dir, "environment"))
        if self.processing_class is not None:
            tok_dir = self.api_dir / "tokenizer"
            self.processing_class.save_pretrained(str(tok_dir))
            raw["tokenizer"] = str(tok_dir)
        path = self.api_dir / "agrpo.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
        return path

    def train(self) -> int:
        """Run the job to the end; raises RuntimeError when it fails, and KeyboardInterrupt (as
        any Python call interrupted by Ctrl-C) once an interrupted job has stopped everything."""
        from agrpo.launcher.job import Job, JobOptions
        from agrpo.services.common.config import load_config
        from agrpo.services.common.preflight import INTERRUPTED_EXIT

        path = self.config()
        cfg = load_config(["--config", str(path)], {})
        status = Job(cfg, JobOptions(path)).run()
        if status == INTERRUPTED_EXIT:
            print(f"[run] interrupted: every process it started has been stopped; checkpoints in "
                  f"{cfg.resolved_output_dir} (resume_from_checkpoint=True continues from the latest)",
                  file=sys.stderr)
            raise KeyboardInterrupt
        if status != 0:
            raise RuntimeError(f"training failed (status {status}); logs in {Path(cfg.resolved_output_dir) / 'logs'}")
        return status
