"""gymhost serve runs uvicorn's ``Server`` with its own accept loop and drain (``_serving._run._DrainingUvicorn``),
which overrides ``startup`` and ``handle_exit`` and relies on what uvicorn's other methods do with them: ``_serve``
shuts down whatever ``startup`` started; ``main_loop`` and ``on_tick`` stop on ``should_exit``; ``shutdown`` and
``_wait_tasks_to_complete`` close and await ``self.servers`` (the acceptors, the hand-off receiver and the listen
watch), use ``server_state`` and ``force_exit`` and shut the ``lifespan`` down; ``capture_signals`` installs
``handle_exit`` and raises the signals it recorded again. Those are uvicorn's internals, not its API: a uvicorn
release that changes them must be read before it is allowed (pyproject.toml bounds uvicorn to the versions read).
This test fails when they change, naming what to read."""

from __future__ import annotations

import ast
import hashlib
import inspect
from pathlib import Path

import pytest
import uvicorn
import uvicorn.server

pytestmark = pytest.mark.unit

OVERRIDDEN = ("startup", "handle_exit")
RELIED_ON = ("_serve", "main_loop", "on_tick", "shutdown", "_wait_tasks_to_complete", "capture_signals")
# Fingerprint of those methods' source -> the uvicorn versions that have it, each read against _run.py. (0.45 to 0.49
# differ from 0.50 in startup alone, but their `uvicorn --workers N` restarts a worker that fails to start for ever,
# where asgi.py's refusal of foreign workers needs it to stop: pyproject.toml's bound starts at 0.50.) 0.55.0
# changed shutdown's timeout idiom alone (asyncio.timeout for asyncio.wait_for).
READ = {
    "6e16fae7868285ec": "0.50.0 to 0.54.0",
    "3060889e3c4482f2": "0.55.0",
}


def test_the_uvicorn_internals_gymhost_overrides_are_the_ones_it_was_written_against() -> None:
    # Read from uvicorn's file, not from the class: other tests may patch the class's methods while they run.
    text = Path(uvicorn.server.__file__).read_text()
    (server,) = [node for node in ast.parse(text).body if isinstance(node, ast.ClassDef) and node.name == "Server"]
    methods = {node.name: node for node in server.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}
    names = OVERRIDDEN + RELIED_ON
    missing = [name for name in names if name not in methods]
    assert not missing, f"uvicorn {uvicorn.__version__}: Server has no {', '.join(missing)}; read _serving/_run.py"
    source = "\n".join(ast.get_source_segment(text, methods[name]) or "" for name in names)
    fingerprint = hashlib.sha256(source.encode()).hexdigest()[:16]
    assert fingerprint in READ, (
        f"uvicorn {uvicorn.__version__}: Server.{', Server.'.join(names)} are not the ones _serving/_run.py's "
        f"_DrainingUvicorn was checked against (fingerprint {fingerprint}). Read them against it, then add the "
        "fingerprint to READ and widen pyproject.toml's bound."
    )


def test_the_protocol_classes_take_what_startup_gives_them() -> None:
    """``_DrainingUvicorn.startup`` builds uvicorn's HTTP protocols as uvicorn does, with these keywords."""
    from uvicorn.protocols.http.h11_impl import H11Protocol
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    for protocol in (H11Protocol, HttpToolsProtocol):
        assert {"config", "server_state", "app_state", "_loop"} <= set(inspect.signature(protocol).parameters)
