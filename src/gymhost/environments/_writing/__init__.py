"""Write time: what ``gymhost write`` and ``gymhost check`` run, and a serving server never does.

``_writer`` reads a source through its kind's backend (``.._registry``) and writes the Gym folder; ``_check`` plays
a written folder's reference solutions. The runtime (the server, its episodes and pool, the protocols' instances) is
the rest of ``environments``; a protocol's subpackage holds both halves of its kind, as ``.._backend`` declares them.
"""
