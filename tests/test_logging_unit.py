"""Building a FastMCP app inside ``fastmcp_leaves_logging_alone`` leaves the root logger as the host set it, whether
mcp was imported before the context or inside it; a context in which nothing builds one does not import mcp; a
server's own ``basicConfig`` inside it still takes effect. Each case in a fresh interpreter, where mcp's import state
and the root logger are its own."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.unit

_CHECK = """
import logging, sys
from gymhost._logging import fastmcp_leaves_logging_alone
{before}
with fastmcp_leaves_logging_alone():
    {inside}
assert logging.getLogger().handlers == [], logging.getLogger().handlers
server = sys.modules.get("mcp.server.fastmcp.server")
print("imported" if server else "not imported")
if server is not None:  # the patch is undone with the context: outside it, FastMCP does as it always did
    from mcp.server.fastmcp.utilities.logging import configure_logging
    assert server.configure_logging is configure_logging
"""


def _run(before: str, inside: str) -> str:
    code = textwrap.dedent(_CHECK).format(before=before, inside=inside)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_fastmcp_imported_inside_the_context_leaves_root_logging_alone() -> None:
    assert _run("", "from mcp.server.fastmcp import FastMCP; FastMCP('inside')") == "imported"


def test_fastmcp_imported_before_the_context_leaves_root_logging_alone() -> None:
    assert _run("from mcp.server.fastmcp import FastMCP", "FastMCP('before')") == "imported"


def test_a_context_that_builds_no_fastmcp_app_does_not_import_mcp() -> None:
    assert _run("", "pass") == "not imported"


def test_fastmcp_built_outside_the_context_configures_logging_as_before() -> None:
    """The control: without the context, the same construction does add mcp's handler to the root logger."""
    code = "import logging\nfrom mcp.server.fastmcp import FastMCP\nFastMCP('x')\n"
    code += "print(len(logging.getLogger().handlers))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "1", result.stderr


def test_a_servers_own_basic_config_inside_the_context_still_takes_effect() -> None:
    code = (
        "import logging\nfrom gymhost._logging import fastmcp_leaves_logging_alone\n"
        "with fastmcp_leaves_logging_alone():\n    logging.basicConfig(level=logging.DEBUG)\n"
        "print(len(logging.getLogger().handlers), logging.getLogger().level)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.split() == ["1", str(10)], result.stderr
