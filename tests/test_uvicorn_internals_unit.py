"""gymhost serve runs uvicorn's ``Server`` with its own accept loop and drain (``_serving._run._DrainingUvicorn``),
which overrides ``startup`` and ``handle_exit`` and relies on what ``shutdown``, ``_serve`` and ``main_loop`` do with
them (``self.servers`` closed and awaited, ``server_state``, ``lifespan``, ``should_exit`` and ``force_exit``). Those
are uvicorn's internals, not its API: a uvicorn release that changes them must be read before it is allowed
(pyproject.toml bounds uvicorn to the versions read). This test fails when they change, naming what to read."""

from __future__ import annotations

import ast
import hashlib
import inspect
from pathlib import Path

import pytest
import uvicorn
import uvicorn.server

pytestmark = pytest.mark.unit

# uvicorn version -> fingerprint of the methods below, for each version gymhost's _run was read against.
READ = {"0.54.0": "4a525b9fc594e68f"}
METHODS = ("startup", "shutdown", "handle_exit", "_serve", "main_loop")


def test_the_uvicorn_internals_gymhost_overrides_are_the_ones_it_was_written_against() -> None:
    # Read from uvicorn's file, not from the class: other tests may patch the class's methods while they run.
    text = Path(uvicorn.server.__file__).read_text()
    (server,) = [node for node in ast.parse(text).body if isinstance(node, ast.ClassDef) and node.name == "Server"]
    methods = {node.name: node for node in server.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}
    source = "\n".join(ast.get_source_segment(text, methods[name]) or "" for name in METHODS)
    fingerprint = hashlib.sha256(source.encode()).hexdigest()[:16]
    assert READ.get(uvicorn.__version__) == fingerprint, (
        f"uvicorn {uvicorn.__version__}: Server.{', Server.'.join(METHODS)} are not the ones "
        f"_serving/_run.py's _DrainingUvicorn was checked against (fingerprint {fingerprint}). Read them against it, "
        "then add the version to READ and widen pyproject.toml's bound."
    )


def test_the_protocol_classes_take_what_startup_gives_them() -> None:
    """``_DrainingUvicorn.startup`` builds uvicorn's HTTP protocols as uvicorn does, with these keywords."""
    from uvicorn.protocols.http.h11_impl import H11Protocol
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    for protocol in (H11Protocol, HttpToolsProtocol):
        assert {"config", "server_state", "app_state", "_loop"} <= set(inspect.signature(protocol).parameters)
