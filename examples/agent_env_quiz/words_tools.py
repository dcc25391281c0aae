"""The env `words`'s MCP server: two tools, one of which always fails."""

from mcp.server.fastmcp import FastMCP

server = FastMCP("words", log_level="WARNING")


@server.tool()
def shout(text: str) -> str:
    """The text in capitals, with an exclamation mark."""
    return text.upper() + "!"


@server.tool()
def fail(reason: str) -> str:
    """Always fails, with the reason."""
    raise ValueError(reason)
