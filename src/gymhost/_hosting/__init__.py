"""Hosting: a Gym folder (or a root of several) in, an ASGI app out. Nothing here binds a socket or starts a process."""
