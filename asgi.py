"""``GYMHOST_FOLDER=path/to/folder uvicorn asgi:app`` (or ``hypercorn asgi:app``) from a checkout.

The app is built as ``gymhost serve`` builds it (``gymhost.Server.load``), from what ``GYMHOST_FOLDER`` names; see
``gymhost.asgi``.
"""

from gymhost.asgi import app

__all__ = ["app"]
