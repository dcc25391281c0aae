"""Serving: sockets, uvicorn or hypercorn, the accept loop, worker processes and folders served by processes of
their own. The only package that starts processes for the core."""
