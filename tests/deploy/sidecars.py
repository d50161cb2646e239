"""The Kubernetes CSI sidecars' rules that deploy/kubernetes must follow, as their release notes
and code state them: how external-provisioner treats StorageClass parameters, which flags and
feature gates each pinned version accepts, and which Kubernetes versions (and
VolumeAttributesClass API, custom resource versions) each needs. check_manifests.py applies them
to the manifests.

Sources (kubernetes-csi repositories): external-provisioner pkg/controller/controller.go
(removePrefixedParameters, the fstype lookup in Provision) and CHANGELOG-6.x; each sidecar's
release page ("Minimum Kubernetes version") and CHANGELOG; pkg/features/features.go and
cmd/*/main.go for gates and flags; external-snapshot-metadata's CHANGELOG, pkg/sidecar/sidecar.go
and client/config/crd for its flags and the SnapshotMetadataService API version.
"""

import pathlib
import re
from dataclasses import dataclass, field

PREFIX = "csi.storage.k8s.io/"
FSTYPE_KEY = PREFIX + "fstype"

# The secret parameters external-provisioner resolves and strips: PREFIX + kind + "secret-name"
# or "secret-namespace". controller-modify- from v6.2.0 (#1440).
_SECRET_KINDS = ("", "provisioner-", "controller-publish-", "node-stage-", "node-publish-",
                 "controller-expand-", "node-expand-")
_SECRET_KINDS_V6_2 = _SECRET_KINDS + ("controller-modify-",)


def _secret_keys(kinds):
    return {f"{PREFIX}{k}secret-{n}" for k in kinds for n in ("name", "namespace")}


# The PREFIX keys each provisioner version knows: stripped before CreateVolume. Any other key
# under PREFIX fails provisioning ("found unknown parameter key ... with reserved namespace").
PROVISIONER_KEYS = {
    "v5.3.0": {FSTYPE_KEY} | _secret_keys(_SECRET_KINDS),
    "v6.2.1": {FSTYPE_KEY} | _secret_keys(_SECRET_KINDS_V6_2),
}

# What --extra-create-metadata adds after stripping (so a StorageClass naming one is refused).
EXTRA_METADATA = (PREFIX + "pvc/name", PREFIX + "pvc/namespace", PREFIX + "pv/name")


class Refused(Exception):
    """A sidecar (or edgevol) refuses the object; the message is the one it gives."""


def provisioner_create_parameters(params, version, claim=None):
    """What external-provisioner `version` makes of a StorageClass's parameters:
    (fs_type, the parameters of CreateVolume), or Refused with its error. `claim` is
    (PVC name, PVC namespace, PV name) for --extra-create-metadata, or None without it."""
    if version not in PROVISIONER_KEYS:
        raise Refused(f"external-provisioner {version}: its parameter keys are not recorded here")
    # Kubernetes keeps keys that differ only in case apart; the provisioner's fstype lookup and
    # people reading the class do not. One spelling per key.
    seen = {}
    for key in params:
        other = seen.setdefault(key.lower(), key)
        if other != key:
            raise Refused(f"parameters {other!r} and {key!r} differ only in case")
    # Provision(): the deprecated "fstype" matched without regard to case, the prefixed key
    # exactly; more than one is a permanent failure.
    found = [k for k in params if k.lower() == "fstype" or k == FSTYPE_KEY]
    if len(found) > 1:
        raise Refused(f'fstype specified in parameters with both "fstype" and "{FSTYPE_KEY}" keys')
    fs_type = params[found[0]] if found else ""
    # removePrefixedParameters(): PREFIX matched exactly (case-sensitive).
    out = {}
    for key, value in params.items():
        if key.startswith(PREFIX):
            if key not in PROVISIONER_KEYS[version]:
                raise Refused(f'found unknown parameter key "{key}" with reserved namespace {PREFIX}')
        else:
            out[key] = value
    if claim is not None:
        out.update(zip(EXTRA_METADATA, claim))
    return fs_type, out


def edgevol_parameter_keys(root):
    """The StorageClass keys edgevol's CreateVolume accepts (appliance/src/csi/params.rs)."""
    text = (pathlib.Path(root) / "appliance" / "src" / "csi" / "params.rs").read_text()
    keys = set(re.findall(r'^\s*"(\w+)" =>', text, re.M))
    assert keys, "no parameter keys found in params.rs"
    return keys | set(EXTRA_METADATA)


@dataclass(frozen=True)
class Sidecar:
    """One pinned sidecar version. k8s_min: its release page's minimum Kubernetes version.
    vac: the storage.k8s.io VolumeAttributesClass version it reads, if any. gates: its feature
    gates (features.go) with the value each is locked to (None: settable). flags: the flags of
    its main.go the manifests may use. apis: the other built-in (kind, group/version) it reads
    or writes (its RBAC). crs: the custom resources it reads, as (kind, group/version): the one
    API version of each its release reads. source: where this row comes from."""

    k8s_min: tuple
    vac: str | None
    gates: dict = field(default_factory=dict)
    flags: frozenset = frozenset()
    source: str = ""
    apis: tuple = ()
    crs: tuple = ()


_PROVISIONER_FLAGS = frozenset({"csi-address", "extra-create-metadata", "default-fstype",
                                "leader-election", "timeout", "feature-gates", "http-endpoint"})
_COMMON_FLAGS = frozenset({"csi-address", "leader-election", "timeout", "http-endpoint"})
_LEASE = ("Lease", "coordination.k8s.io/v1")
_PROVISIONER_APIS = (("CSINode", "storage.k8s.io/v1"), ("VolumeAttachment", "storage.k8s.io/v1"),
                     ("CSIStorageCapacity", "storage.k8s.io/v1"), _LEASE)
_ATTACHER_APIS = (("CSINode", "storage.k8s.io/v1"), ("VolumeAttachment", "storage.k8s.io/v1"),
                  _LEASE)
# external-snapshot-metadata: pkg/sidecar/sidecar.go's flags, --audience (v0.2.0, #162) and
# --disable-metrics (v1.0.0, #190; /health is served on :8080 from then on, whatever the flags).
# No leader election and no feature gates.
_SNAPSHOT_METADATA_FLAGS = frozenset({
    "csi-address", "timeout", "port", "tls-cert", "tls-key", "audience", "http-endpoint",
    "metrics-path", "disable-metrics", "max-streaming-duration-min", "kube-api-qps",
    "kube-api-burst", "kubeconfig"})

SIDECARS = {
    ("csi-provisioner", "v6.2.1"): Sidecar(
        (1, 34), "storage.k8s.io/v1",
        {"Topology": None, "CrossNamespaceVolumeDataSource": None, "VolumeAttributesClass": None},
        _PROVISIONER_FLAGS,
        "release v6.2.1: minimum Kubernetes 1.34 (storage/v1 VolumeAttributesClass); v6.0.0 "
        "VolumeAttributesClass GA; v6.2.0 removed the HonorPVReclaimPolicy gate",
        _PROVISIONER_APIS),
    ("csi-provisioner", "v5.3.0"): Sidecar(
        (1, 20), "storage.k8s.io/v1beta1",
        {"Topology": None, "HonorPVReclaimPolicy": True, "CrossNamespaceVolumeDataSource": None,
         "VolumeAttributesClass": None},
        _PROVISIONER_FLAGS,
        "releases v3.0-v5.x: minimum Kubernetes 1.20; v1beta1 VolumeAttributesClass until v6.0.0",
        _PROVISIONER_APIS),
    ("csi-attacher", "v4.12.0"): Sidecar(
        (1, 17), None, {}, _COMMON_FLAGS,
        "releases v3.0-v4.x: minimum Kubernetes 1.17; v4.10/v4.11 notes: dependencies only; "
        "v4.12.0 (2026-05-21): its notes are not in the reference corpus, public deployments "
        "(democratic-csi, aws-ebs-csi-driver, Longhorn, Rook) run it with these same flags",
        _ATTACHER_APIS),
    ("csi-snapshotter", "v8.6.0"): Sidecar(
        (1, 25), None, {"CSIVolumeGroupSnapshot": None}, _COMMON_FLAGS,
        "releases v8.x: minimum Kubernetes 1.25; v8.6.0: VolumeGroupSnapshot v1", (_LEASE,)),
    ("csi-resizer", "v2.2.1"): Sidecar(
        (1, 16), "storage.k8s.io/v1",
        {"AnnotateFsResize": None, "RecoverVolumeExpansionFailure": None,
         "VolumeAttributesClass": None, "ReleaseLeaderElectionOnExit": None},
        _COMMON_FLAGS | {"feature-gates"},
        "release v2.2.1: minimum Kubernetes 1.16, recommended 1.34; v2.0.0: VolumeAttributesClass "
        "GA through storage.k8s.io/v1 (needs Kubernetes 1.34)", (_LEASE,)),
    ("csi-resizer", "v1.14.0"): Sidecar(
        (1, 16), "storage.k8s.io/v1beta1",
        {"AnnotateFsResize": None, "RecoverVolumeExpansionFailure": None,
         "VolumeAttributesClass": None},
        _COMMON_FLAGS | {"feature-gates"},
        "release v1.14.0: minimum Kubernetes 1.16, recommended 1.32; watches v1beta1 "
        "VolumeAttributesClasses", (_LEASE,)),
    ("csi-snapshot-metadata", "v1.1.0"): Sidecar(
        (1, 33), None, {}, _SNAPSHOT_METADATA_FLAGS,
        "kubernetes-csi docs: minimum Kubernetes 1.33 (changed-block tracking alpha there, beta "
        "from 1.36); v1.0.0 notes: SnapshotMetadataService cbt.storage.k8s.io/v1beta1, v1alpha1 "
        "support removed (#215), /health on :8080 (#190); v1.1.0 notes: Kubernetes 1.36 "
        "libraries, no flag or API change",
        (("TokenReview", "authentication.k8s.io/v1"),
         ("SubjectAccessReview", "authorization.k8s.io/v1")),
        (("SnapshotMetadataService", "cbt.storage.k8s.io/v1beta1"),)),
    ("csi-node-driver-registrar", "v2.17.0"): Sidecar(
        (1, 13), None, {}, frozenset({"csi-address", "kubelet-registration-path", "mode",
                                      "http-endpoint"}),
        "release pages v2.x: minimum Kubernetes 1.13; v2.15-v2.17 notes: dependencies only"),
    ("livenessprobe", "v2.19.0"): Sidecar(
        (1, 13), None, {}, frozenset({"csi-address", "http-endpoint", "probe-timeout"}),
        "release v2.19.0: minimum Kubernetes 1.13; v2.17-v2.19 notes: no flag removed"),
}


def minors(low, high):
    """Kubernetes minor versions from low to high, as (1, n)."""
    return [(1, n) for n in range(low[1], high[1] + 1)]


def api_exists(group_version, kind, minor):
    """Whether Kubernetes `minor` has `kind` at `group_version` (kubernetes-validate's schemas,
    which include APIs off by default)."""
    import kubernetes_validate

    schemas = pathlib.Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    group, version = group_version.split("/")
    name = f"{kind.lower()}-{group.split('.')[0]}-{version}.json"
    d = schemas / f"v{minor[0]}.{minor[1]}.0-local-strict"
    assert d.is_dir(), f"kubernetes-validate has no schemas for {minor}"
    return (d / name).exists()


def served_by_default(group_version):
    """Alpha and beta APIs are off unless the API server enables them (--runtime-config)."""
    return not re.search(r"v\d+(alpha|beta)\d+$", group_version)


def check_container(name, version, args, k8s_range, opt_in_apis=()):
    """Refused unless sidecar `name` at `version` runs with `args` on every Kubernetes minor in
    k8s_range and reaches its VolumeAttributesClass API there (a non-GA API only when listed
    in opt_in_apis: the variant documents turning it on)."""
    row = SIDECARS.get((name, version))
    if row is None:
        raise Refused(f"{name}:{version} is not in the sidecar table (read its release notes, "
                      "features.go and main.go, then add a row)")
    low, high = k8s_range
    if row.k8s_min > low:
        raise Refused(f"{name}:{version} needs Kubernetes {row.k8s_min[0]}.{row.k8s_min[1]}, "
                      f"the range starts at {low[0]}.{low[1]}")
    for a in args:
        flag, _, value = a[2:].partition("=")
        if not a.startswith("--") or flag not in row.flags:
            raise Refused(f"{name}:{version}: flag {a!r} is not one of {sorted(row.flags)}")
        if flag == "feature-gates":
            for gate in value.split(","):
                g, _, v = gate.partition("=")
                if g not in row.gates:
                    raise Refused(f"{name}:{version}: unrecognized feature gate {g!r} "
                                  "(the binary refuses to start)")
                locked = row.gates[g]
                if locked is not None and (v.lower() == "true") != locked:
                    raise Refused(f"{name}:{version}: feature gate {g} is locked to {locked}")
    for kind, group_version in row.apis:
        for minor in minors(low, high):
            if not api_exists(group_version, kind, minor):
                raise Refused(f"{name}:{version} uses {group_version} {kind}, which Kubernetes "
                              f"{minor[0]}.{minor[1]} does not have")
    if row.vac:
        for minor in minors(low, high):
            if not api_exists(row.vac, "VolumeAttributesClass", minor):
                raise Refused(f"{name}:{version} watches {row.vac} VolumeAttributesClass, "
                              f"which Kubernetes {minor[0]}.{minor[1]} does not have")
            if not served_by_default(row.vac) and row.vac not in opt_in_apis:
                raise Refused(f"{name}:{version} watches {row.vac} VolumeAttributesClass, "
                              f"which Kubernetes {minor[0]}.{minor[1]} does not serve by default")


def check_custom_resource(name, version, obj, crd):
    """Refused unless sidecar `name` at `version` reads custom resource `obj` (a kind of its
    crs row, at the API version its release reads) and `crd` (the CustomResourceDefinition the
    cluster gets) serves that version as its stored, not deprecated, one."""
    row = SIDECARS.get((name, version))
    if row is None:
        raise Refused(f"{name}:{version} is not in the sidecar table")
    kind = obj.get("kind")
    want = dict(row.crs).get(kind)
    if want is None:
        raise Refused(f"{name}:{version} reads no {kind}")
    if obj.get("apiVersion") != want:
        raise Refused(f"{name}:{version} reads {want} {kind}, not {obj.get('apiVersion')}")
    group, ver = want.split("/")
    spec = crd["spec"]
    if spec["group"] != group or spec["names"]["kind"] != kind:
        raise Refused(f"the CRD defines {spec['group']} {spec['names']['kind']}, not {want} {kind}")
    served = {v["name"]: v for v in spec["versions"]}
    entry = served.get(ver)
    if entry is None or not entry.get("served"):
        raise Refused(f"the {kind} CRD does not serve {want}")
    if not entry.get("storage") or entry.get("deprecated"):
        raise Refused(f"the {kind} CRD serves {want} only as a deprecated or unstored version")
