"""A session and the process that owns it: everything that decides, for a request, whose episode it is.

- ``_owner``: the owner stamp a session cookie and an MCP token carry, written and read (signed or not) in one codec;
- ``_identity``: who this process is (replica, worker, start), so whether a stamp is its own, and where the owner of
  one that is not lives;
- ``_signing``: the secret sessions and tokens are signed with, and Gym's MCP tokens signed with it, stamped;
- ``_cookie``: ``GymSessionMiddleware``, Gym's session cookie, per mount, signed, stamped;
- ``_ownership``: ``SessionOwnershipMiddleware``, another process's session sent to its owner or refused as lost;
- ``_forwarding``: a request sent to the process that owns its session (a sibling worker, another replica).

A whole connection handed to its owning worker (``_serving._handoff``) reads the stamp with ``_owner.head_owner``.
"""
