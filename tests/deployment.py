"""deploy/kubernetes as the tests read it: gymhost.yaml's documents, and its Deployment as the confined overlay
(deploy/kubernetes/confined) patches it, with the JSON patch kustomize applies, applied here by jsonpatch. The
manifests tier validates both; the container tier runs the image as each runs it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

__all__ = ["CONFINED", "MANIFEST", "confined_deployment", "documents", "manifest", "seccomp_profile"]

KUBERNETES = Path(__file__).resolve().parent.parent / "deploy" / "kubernetes"
MANIFEST = KUBERNETES / "gymhost.yaml"
CONFINED = KUBERNETES / "confined"

Document = dict[str, Any]


def documents(path: Path = MANIFEST) -> list[Document]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def manifest(kind: str) -> Document:
    """gymhost.yaml's one document of ``kind``."""
    found = [doc for doc in documents() if doc.get("kind") == kind]
    assert len(found) == 1, f"{MANIFEST.name} should have one {kind}, has {len(found)}"
    return found[0]


def confined_deployment() -> Document:
    """The Deployment ``kubectl apply -k deploy/kubernetes/confined`` makes."""
    import jsonpatch  # the tiers that read the overlay have it (dev's extra, the manifests venv); collecting needs none

    overlay = yaml.safe_load((CONFINED / "kustomization.yaml").read_text())
    base = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    assert overlay["resources"] == [".."], overlay
    assert base["resources"] == [MANIFEST.name], base
    (patch,) = overlay["patches"]
    assert patch["target"] == {"kind": "Deployment", "name": "gymhost"}, patch
    operations = yaml.safe_load((CONFINED / patch["path"]).read_text())
    patched: Document = jsonpatch.apply_patch(manifest("Deployment"), operations)
    return patched


def seccomp_profile(deployment: Document) -> Path | None:
    """The file of a Deployment's Localhost seccomp profile, shipped beside the overlay (None: not Localhost)."""
    profile = deployment["spec"]["template"]["spec"]["securityContext"]["seccompProfile"]
    if profile["type"] != "Localhost":
        return None
    return CONFINED / profile["localhostProfile"]
