"""The agentenv protocol backend: gymhost bundles (in-process, forked process instances), agentenv servers at URLs."""
