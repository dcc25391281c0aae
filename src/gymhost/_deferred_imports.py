"""nemo-gym's training-time dependencies, imported when first used instead of when a resources server is.

``import nemo_gym.base_resources_server`` imports pandas and scipy.stats (reward profiling), wandb (W&B logging),
Hydra (the launcher's command line) and, on 0.4.0, Ray at the top of modules every resources server imports, though
serving one never calls into them: about half of a server's start and memory (benchmarks/README.md, "Start-up
imports"). Python has no lazy imports before 3.15 (PEP 810), so gymhost gives the Gym modules that do it
(``DEFERRING_MODULES``) the same, and no others: while one of them runs its top level, an ``import x`` or ``from x
import y`` of a package in ``DEFERRED_PACKAGES`` binds a stand-in; the stand-in's first use (a call, an attribute, an
``isinstance``, a base class, formatting) imports the real object and puts it in the module's globals in the
stand-in's place, so later uses are the real thing. A module-level use (0.4.0's ``global_config`` sets an attribute
of ``wandb.util``) just imports it then. What a stand-in cannot pass for is the object's identity and type before its
first use.

Where nemo-gym is installed without its training-time dependencies (the image: ``deploy/container``), one more
thing stands in the way: 0.7.0's ``global_config`` asks the installed version of Ray at import, for the launcher's
pins. A deferring module's ``from importlib.metadata import version`` binds a ``version`` that answers
``NOT_INSTALLED`` for a package of ``DEFERRED_PACKAGES`` that is not installed, and what ``importlib.metadata`` answers
for everything else.

Upstream could drop all of this by importing those packages inside the functions that use them (or, from Python
3.15, with ``lazy import``): docs/architecture.md.
"""

from __future__ import annotations

import builtins
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import re
import sys
import threading
import types
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["DEFERRED_PACKAGES", "DEFERRING_MODULES", "NOT_INSTALLED", "defer_httpx_cli", "defer_training_imports"]

# Packages a resources server does not need to serve (measured with -X importtime on nemo-gym 0.4.0 and 0.7.0): rich
# is only the launcher's help and warnings (``config_types`` imports ``rich.markdown``, and with it markdown-it).
DEFERRED_PACKAGES = frozenset({"pandas", "scipy", "wandb", "ray", "hydra", "rich"})
# The Gym modules whose top level imports them; nothing else is touched.
DEFERRING_MODULES = frozenset(
    {
        "nemo_gym.global_config",
        "nemo_gym.server_utils",
        "nemo_gym.reward_profile",
        "nemo_gym.rollout_collection",
        "nemo_gym.config_types",
    }
)
# The version a deferring module reads of a deferred package that is not installed: PEP 440, and saying so.
NOT_INSTALLED = "0+not.installed"


# The distributions ``DEFERRED_PACKAGES`` come in (hydra is Hydra's import name; its distribution hydra-core).
_DEFERRED_DISTRIBUTIONS = frozenset({*DEFERRED_PACKAGES, "hydra-core"})


def _version(distribution_name: str) -> str:
    """``importlib.metadata.version``, but ``NOT_INSTALLED`` for a missing distribution of a deferred package."""
    try:
        return importlib.metadata.version(distribution_name)
    except importlib.metadata.PackageNotFoundError:
        if re.sub(r"[-_.]+", "-", distribution_name).lower() in _DEFERRED_DISTRIBUTIONS:
            return NOT_INSTALLED
        raise


class _Deferred:
    """A name a deferring module imported, standing in for the object until its first use."""

    __slots__ = ("_attribute", "_module_name", "_owner")

    def __init__(self, module_name: str, attribute: str | None, owner: dict[str, Any]) -> None:
        object.__setattr__(self, "_module_name", module_name)
        object.__setattr__(self, "_attribute", attribute)
        object.__setattr__(self, "_owner", owner)

    def _resolve(self) -> Any:
        module_name: str = object.__getattribute__(self, "_module_name")
        attribute: str | None = object.__getattribute__(self, "_attribute")
        owner: dict[str, Any] = object.__getattribute__(self, "_owner")
        module = importlib.import_module(module_name)
        if attribute is None:  # `import a.b` binds `a`
            value = sys.modules[module_name.partition(".")[0]]
        elif hasattr(module, attribute):
            value = getattr(module, attribute)
        else:  # `from a import b` where b is a submodule not imported yet, as the import statement does
            value = importlib.import_module(f"{module_name}.{attribute}")
        for name, bound in list(owner.items()):
            if bound is self:
                owner[name] = value
        return value

    def __getattr__(self, name: str) -> Any:
        return getattr(self._resolve(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._resolve(), name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self._resolve(), name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._resolve()(*args, **kwargs)

    def __getitem__(self, key: Any) -> Any:
        return self._resolve()[key]

    def __instancecheck__(self, instance: Any) -> bool:
        return isinstance(instance, self._resolve())

    def __subclasscheck__(self, subclass: type) -> bool:
        return issubclass(subclass, self._resolve())

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[Any, ...]:
        return (self._resolve(),)

    def __repr__(self) -> str:
        return repr(self._resolve())

    def __str__(self) -> str:
        return str(self._resolve())

    def __format__(self, spec: str) -> str:
        return format(self._resolve(), spec)


class _Import:
    """``builtins.__import__`` while a deferring module's top level runs: defers that top level's imports of
    ``DEFERRED_PACKAGES`` and passes every other import (other modules', other threads') through unchanged."""

    def __init__(self, original: Any) -> None:
        self.original = original
        self.top_levels: set[types.CodeType] = set()

    def __call__(
        self,
        name: str,
        globals: Mapping[str, Any] | None = None,
        locals: Mapping[str, Any] | None = None,
        fromlist: Sequence[str] | None = (),
        level: int = 0,
    ) -> Any:
        top_level = level == 0 and isinstance(globals, dict) and sys._getframe(1).f_code in self.top_levels
        if top_level and name == "importlib.metadata" and fromlist and "version" in fromlist:
            module = self.original(name, globals, locals, fromlist, level)
            # Only the names it has: for one it lacks, the import statement raises its own ImportError.
            names = {attribute: getattr(module, attribute) for attribute in fromlist if hasattr(module, attribute)}
            return types.SimpleNamespace(**{**names, "version": _version})
        deferred = top_level and name.partition(".")[0] in DEFERRED_PACKAGES and "*" not in (fromlist or ())
        if not deferred:
            return self.original(name, globals, locals, fromlist, level)
        assert isinstance(globals, dict)
        if not fromlist:
            return _Deferred(name, None, globals)
        return types.SimpleNamespace(**{attribute: _Deferred(name, attribute, globals) for attribute in fromlist})


_lock = threading.RLock()
_import: _Import | None = None


class _DeferringLoader(importlib.machinery.SourceFileLoader):
    def exec_module(self, module: types.ModuleType) -> None:
        global _import
        code = self.get_code(module.__name__)
        if code is None:  # pragma: no cover - a source file always has code
            raise ImportError(f"no code for {module.__name__}", name=module.__name__)
        with _lock:
            if _import is None:
                _import = _Import(builtins.__import__)
                builtins.__import__ = _import
            current = _import
            current.top_levels.add(code)
        try:
            exec(code, module.__dict__)
        finally:
            with _lock:
                current.top_levels.discard(code)
                if not current.top_levels and _import is current:
                    if builtins.__import__ is current:
                        builtins.__import__ = current.original
                    _import = None


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in DEFERRING_MODULES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and type(spec.loader) is importlib.machinery.SourceFileLoader and spec.origin:
            spec.loader = _DeferringLoader(fullname, spec.origin)
        return spec


_FINDER = _Finder()


def defer_training_imports() -> None:
    """Make the Gym modules in ``DEFERRING_MODULES`` import ``DEFERRED_PACKAGES`` at first use (idempotent); to
    take effect, called before nemo-gym is imported."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def defer_httpx_cli() -> None:
    """httpx imports its command-line client (``httpx._main``: rich's console, progress and syntax, and Pygments)
    whenever rich, Pygments and click are installed, as they are with gymhost (``gymhost top``), though nothing
    gymhost or a server runs calls it. Before httpx is first imported, its ``_main`` is a stand-in whose ``main``
    imports the real module and runs it, so ``httpx.main`` (the ``httpx`` command's entry point) still works; nothing
    else of ``httpx._main`` is httpx's API. Does nothing once httpx is imported, or where the client could not be
    imported anyway (httpx then says how to install it, as ever)."""
    if "httpx" in sys.modules or "httpx._main" in sys.modules:
        return
    if any(importlib.util.find_spec(package) is None for package in ("rich", "pygments", "click")):
        return
    stand_in = types.ModuleType("httpx._main", "httpx's command-line client, imported when httpx.main is called")
    stand_in.__spec__ = importlib.machinery.ModuleSpec("httpx._main", None)

    def main(*args: Any, **kwargs: Any) -> Any:
        if sys.modules.get("httpx._main") is stand_in:
            sys.modules.pop("httpx._main", None)
        return importlib.import_module("httpx._main").main(*args, **kwargs)

    stand_in.main = main  # type: ignore[attr-defined]
    sys.modules["httpx._main"] = stand_in
