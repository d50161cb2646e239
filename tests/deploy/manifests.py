"""Shared helpers of the deploy checks: the repository's facts (driver name, version, image
names) and the Kubernetes manifests as Python objects."""

import pathlib
import re

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"


def driver_name():
    """PLUGIN_NAME of driver/src/identity.rs: what GetPluginInfo returns."""
    text = (ROOT / "driver" / "src" / "identity.rs").read_text()
    return re.search(r'pub const PLUGIN_NAME: &str = "([^"]+)";', text).group(1)


def version():
    """The workspace version (Cargo.toml), the images' tag."""
    text = (ROOT / "Cargo.toml").read_text()
    section = text.split("[workspace.package]", 1)[1]
    return re.search(r'^version = "([^"]+)"', section, re.M).group(1)


def images():
    """{"cli": "NAME:TAG", "node": "NAME:TAG"} as scripts/build-images.sh builds them."""
    env = dict(
        line.split("=", 1)
        for line in (ROOT / "deploy" / "images.env").read_text().splitlines()
        if line and not line.startswith("#")
    )
    tag = version()
    return {"cli": f"{env['EDGEVOL_IMAGE_CLI']}:{tag}", "node": f"{env['EDGEVOL_IMAGE_NODE']}:{tag}"}


def kustomization():
    return yaml.safe_load((K8S / "kustomization.yaml").read_text())


def documents():
    """Every object of the kustomization's resources, as (file name, object)."""
    out = []
    for name in kustomization()["resources"]:
        for doc in yaml.safe_load_all((K8S / name).read_text()):
            if doc is not None:
                out.append((name, doc))
    return out


def find(docs, kind, name=None):
    found = [d for _, d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert found, f"no {kind} {name or ''} in the manifests"
    return found
