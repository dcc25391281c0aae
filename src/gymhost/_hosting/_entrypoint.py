"""Import a folder's entrypoint and find the server class Gym's launcher would run.

Gym runs ``python app.py`` with the folder on ``PYTHONPATH``, so the class is whichever one the file's
``if __name__ == "__main__": X.run_webserver()`` block names. Importing the file instead of running it skips that
block, so the name is read from the source; a file without one falls back to the single concrete
``SimpleResourcesServer`` subclass it defines.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib
import importlib.machinery
import importlib.util
import inspect
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from .._exceptions import FolderError, ServerClassError
from ._folder import ServerSpec

__all__ = ["find_server_class", "import_entrypoint", "own_siblings"]


def import_entrypoint(spec: ServerSpec) -> ModuleType:
    """Import the entrypoint file, with its folder importable the way Gym's launcher makes it.

    The folder becomes the package ``resources_servers.<folder>`` when it sits in a Gym root (the name Gym's
    multi-worker mode imports it by, and the one sibling servers use in ``from resources_servers.x import``),
    else ``gymhost_folders.<folder>``, so relative imports work too. A different folder already registered
    under that name gets a package name of its own rather than being confused with it.

    Top-level sibling imports (``from util import x``, as Gym's launcher allows by putting the folder on
    ``PYTHONPATH``) resolve to this folder's files even when another folder already imported a module of the
    same name into this process; see ``own_siblings``.
    """
    package = _register_package(spec.folder)
    name = f"{package}.{spec.entrypoint.stem}"
    existing = sys.modules.get(name)
    if existing is not None and _same_file(getattr(existing, "__file__", None), spec.entrypoint):
        return existing
    module_spec = importlib.util.spec_from_file_location(name, spec.entrypoint)
    if module_spec is None or module_spec.loader is None:
        raise FolderError(f"{spec.entrypoint}: not an importable Python file")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        with own_siblings(spec.folder, package):
            module_spec.loader.exec_module(module)
    except ModuleNotFoundError as error:
        del sys.modules[name]
        hint = "; install the folder's requirements.txt" if (spec.folder / "requirements.txt").exists() else ""
        raise FolderError(f"{spec.entrypoint}: importing it failed: {error}{hint}") from error
    except Exception as error:
        del sys.modules[name]
        raise FolderError(f"{spec.entrypoint}: importing it failed: {error!r}") from error
    return module


def find_server_class(spec: ServerSpec, module: ModuleType) -> type[Any]:
    """The class the entrypoint's ``__main__`` block runs, else its only concrete resources server."""
    from nemo_gym.base_resources_server import SimpleResourcesServer

    named = _run_webserver_target(spec.entrypoint)
    if named is not None:
        cls = getattr(module, named, None)
        if not (inspect.isclass(cls) and issubclass(cls, SimpleResourcesServer)):
            raise ServerClassError(
                f"{spec.entrypoint}: its __main__ block runs {named}.run_webserver(), "
                "but that is not a SimpleResourcesServer subclass"
            )
        return cls

    defined = [
        cls
        for cls in vars(module).values()
        if inspect.isclass(cls)
        and cls.__module__ == module.__name__
        and issubclass(cls, SimpleResourcesServer)
        and not inspect.isabstract(cls)
    ]
    if len(defined) == 1:
        return defined[0]
    if not defined:
        raise ServerClassError(
            f"{spec.entrypoint}: no resources-server class; expected a concrete SimpleResourcesServer subclass "
            "or an 'if __name__ == \"__main__\": YourServer.run_webserver()' block"
        )
    names = ", ".join(sorted(cls.__name__ for cls in defined))
    raise ServerClassError(
        f"{spec.entrypoint}: several resources-server classes ({names}); name one in an "
        "'if __name__ == \"__main__\": YourServer.run_webserver()' block"
    )


def _run_webserver_target(entrypoint: Path) -> str | None:
    """``X`` in ``if __name__ == "__main__": X.run_webserver()``, read from the source."""
    tree = ast.parse(entrypoint.read_text(encoding="utf-8"), filename=str(entrypoint))
    for node in tree.body:
        if isinstance(node, ast.If) and _is_main_guard(node.test):
            for inner in ast.walk(node):
                if (
                    isinstance(inner, ast.Call)
                    and isinstance(inner.func, ast.Attribute)
                    and inner.func.attr == "run_webserver"
                    and isinstance(inner.func.value, ast.Name)
                ):
                    return inner.func.value.id
    return None


def _is_main_guard(test: ast.expr) -> bool:
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and len(test.comparators) == 1
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value == "__main__"
    )


def _register_package(folder: Path) -> str:
    """Register ``folder`` as a package in ``sys.modules`` and return its dotted name."""
    base = (
        f"resources_servers.{folder.name}"
        if folder.parent.name == "resources_servers"
        else f"gymhost_folders.{folder.name}"
    )
    digest = hashlib.sha1(str(folder).encode()).hexdigest()[:8]
    for name in (base, f"gymhost_folders.{folder.name}_{digest}"):
        existing = sys.modules.get(name)
        if existing is None:
            _create_package(name, folder)
            return name
        if any(_same_file(path, folder) for path in getattr(existing, "__path__", [])):
            return name
    raise FolderError(f"{folder}: cannot register it as a package; two folders claim the name {base}")


def _create_package(name: str, folder: Path) -> None:
    parent = name.rpartition(".")[0]
    if parent not in sys.modules:
        try:
            importlib.import_module(parent)  # resources_servers is a namespace package in Gym installs
        except ImportError:
            namespace = ModuleType(parent)
            namespace.__path__ = []
            sys.modules[parent] = namespace
    init = folder / "__init__.py"
    package_spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
    if init.is_file():
        package_spec = (
            importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(folder)]) or package_spec
        )
    package_spec.submodule_search_locations = [str(folder)]
    package = importlib.util.module_from_spec(package_spec)
    sys.modules[name] = package
    if package_spec.loader is not None:
        try:
            package_spec.loader.exec_module(package)
        except Exception as error:
            del sys.modules[name]
            raise FolderError(f"{init}: importing it failed: {error!r}") from error


@contextlib.contextmanager
def own_siblings(folder: Path, package: str) -> Iterator[None]:
    """While the entrypoint imports, its folder comes first on ``sys.path`` and owns its top-level sibling names.

    Two Gym folders may both have a ``util.py``. The one imported second would otherwise get the first one's
    ``util`` from ``sys.modules``. So for the import, modules of those names that came from elsewhere step aside;
    afterwards this folder's are also registered under its package (``<package>.util``) and the earlier owners get
    their names back. The folder stays on ``sys.path`` (at the end, so it shadows nothing installed) for imports
    a server makes later, at request time; a module name two folders share resolves there to the first folder.
    """
    siblings = {p.stem for p in folder.glob("*.py")} | {p.parent.name for p in folder.glob("*/__init__.py")}
    siblings.discard("__init__")
    displaced = {
        name: sys.modules.pop(name)
        for name in list(sys.modules)
        if name.partition(".")[0] in siblings and not _inside(sys.modules[name], folder)
    }
    root = folder.parent.parent if folder.parent.name == "resources_servers" else None
    entries = [str(folder)] + ([str(root)] if root is not None else [])
    for entry in reversed(entries):
        sys.path.insert(0, entry)
    try:
        yield
    finally:
        for entry in entries:
            sys.path.remove(entry)
            if entry not in sys.path:
                sys.path.append(entry)
        for name in list(sys.modules):
            module = sys.modules[name]
            if name.partition(".")[0] in siblings and _inside(module, folder):
                sys.modules.setdefault(f"{package}.{name}", module)
                if name in displaced:
                    sys.modules[name] = displaced.pop(name)
        sys.modules.update(displaced)


def _inside(module: ModuleType, folder: Path) -> bool:
    location = getattr(module, "__file__", None)
    return location is not None and Path(location).resolve().is_relative_to(folder)


def _same_file(module_file: str | None, path: Path) -> bool:
    return module_file is not None and Path(module_file).resolve() == path.resolve()
