"""The OpenEnv protocol backend: OpenEnv servers at a URL, and agent-env bundles served by agent-env's OpenEnv app."""
