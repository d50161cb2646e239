"""Shared helpers of the deploy checks: the repository's facts (driver name, version, image
names) and the Kubernetes manifests as Python objects: the base kustomization and its overlays
rendered (resources, then strategic merge patches), each with the Kubernetes versions it is
for."""

import pathlib
import re

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"

# What each kustomization is for: the Kubernetes minor versions (low, high) the README
# promises, and the non-GA APIs its header tells the operator to turn on.
VARIANTS = {
    "deploy/kubernetes": (K8S, ((1, 34), (1, 36)), ()),
    "deploy/kubernetes/overlays/k8s-1.31-1.33": (
        K8S / "overlays" / "k8s-1.31-1.33", ((1, 31), (1, 33)), ("storage.k8s.io/v1beta1",)),
    # The base plus changed-block tracking for backup applications (opt-in).
    "deploy/kubernetes/snapshot-metadata": (K8S / "snapshot-metadata", ((1, 34), (1, 36)), ()),
}


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


def kustomization(path=K8S):
    return yaml.safe_load((path / "kustomization.yaml").read_text())


def documents(path=K8S):
    """Every object the kustomization at `path` renders, as (file name, object): its resources
    (files, or directories holding a kustomization) with its patches applied. Only the
    kustomize features deploy/kubernetes uses are understood; anything else is an error."""
    k = kustomization(path)
    known = {"apiVersion", "kind", "namespace", "resources", "patches", "images"}
    assert set(k) <= known, f"{path}: kustomization fields {set(k) - known} not understood here"
    out = []
    for name in k["resources"]:
        target = (path / name).resolve()
        if target.is_dir():
            out.extend(documents(target))
            continue
        for doc in yaml.safe_load_all(target.read_text()):
            if doc is not None:
                out.append((name, doc))
    if "namespace" in k:
        for _, doc in out:
            if doc["kind"] not in CLUSTER_SCOPED:
                doc["metadata"]["namespace"] = k["namespace"]
    for patch in k.get("patches", []):
        assert set(patch) == {"path"}, f"{path}: only file patches are understood: {patch}"
        for doc in yaml.safe_load_all((path / patch["path"]).read_text()):
            strategic_merge(out, doc)
    return out


CLUSTER_SCOPED = {"Namespace", "CSIDriver", "StorageClass", "ClusterRole", "ClusterRoleBinding",
                  "VolumeSnapshotClass", "VolumeAttributesClass"}


def strategic_merge(docs, patch):
    """Applies a strategic merge patch to the object it names (kind, name, namespace): maps
    merge, lists of named maps (containers, volumes) merge by name, other values replace."""
    meta = patch["metadata"]
    targets = [d for _, d in docs if d["kind"] == patch["kind"]
               and d["metadata"]["name"] == meta["name"]
               and d["metadata"].get("namespace") == meta.get("namespace")]
    assert len(targets) == 1, f"patch for {patch['kind']} {meta} matches {len(targets)} objects"
    _merge(targets[0], patch)


def _merge(into, patch):
    for key, value in patch.items():
        assert not key.startswith("$"), f"patch directive {key} not understood here"
        old = into.get(key)
        if isinstance(value, dict) and isinstance(old, dict):
            _merge(old, value)
        elif (isinstance(value, list) and isinstance(old, list) and value
              and all(isinstance(v, dict) and "name" in v for v in value + old)):
            by_name = {v["name"]: v for v in old}
            for item in value:
                if item["name"] in by_name:
                    _merge(by_name[item["name"]], item)
                else:
                    old.append(item)
        else:
            into[key] = value


def find(docs, kind, name=None):
    found = [d for _, d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert found, f"no {kind} {name or ''} in the manifests"
    return found


def main(argv):
    """manifests.py VARIANT OUT: the variant's objects as one YAML stream in OUT (for
    kubernetes-validate); with no argument, the variants and their Kubernetes ranges."""
    if not argv:
        for name, (_, (low, high), _) in VARIANTS.items():
            print(name, f"{low[0]}.{low[1]}", f"{high[0]}.{high[1]}")
        return 0
    variant, out = argv
    path = VARIANTS[variant][0]
    with open(out, "w") as f:
        yaml.safe_dump_all([d for _, d in documents(path)], f, sort_keys=False)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
