"""The env `calc`'s MCP server: two tools."""

from mcp.server.fastmcp import FastMCP

server = FastMCP("calc", log_level="WARNING")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b
