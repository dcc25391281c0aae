"""What one gymhost process is, whatever it serves: its identity, its signing secret, its drain, and forwarding to the
process that owns a session."""
