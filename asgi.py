"""``GYMHOST_FOLDER=path/to/folder uvicorn asgi:app`` (or ``hypercorn asgi:app``) from a checkout.

The app is built by ``gymhost.create_app`` from the folder named in ``GYMHOST_FOLDER``; see ``gymhost.asgi``.
"""

from gymhost.asgi import app

__all__ = ["app"]
