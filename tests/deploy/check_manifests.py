"""Consistency of deploy/kubernetes with the code, with itself and with the CSI sidecars'
rules: every sidecar's --csi-address is the socket edgevol listens on in the same pod; the
registrar's kubelet path is the DaemonSet's host path; the CSIDriver name is GetPluginInfo's;
edgevol's images are the ones scripts/build-images.sh builds; the StorageClass passes
external-provisioner's parameter rules and edgevol's; each sidecar, with its flags and feature
gates, runs on every Kubernetes version its kustomization is for and reaches the
VolumeAttributesClass API there (sidecars.py); the RBAC covers each sidecar's upstream rules at
the pinned version; the VolumeSnapshotClass fits its CRD schema; the SnapshotMetadataService is
the one the csi-snapshot-metadata sidecar reads (API version, vendored CRD and its schema,
audience, the Service in front of the sidecar, its TLS pair). The checks also run on what 0.1.0
shipped and on likely mistakes (fixtures/) and must refuse them, with the sidecars' own messages.

Usage: check_manifests.py  (exit 1 on any failure)
"""

import base64
import json
import pathlib
import posixpath
import re
import sys

import jsonschema
import yaml

import fleet
import manifests as m
import sidecars as sc_rules

HERE = pathlib.Path(__file__).resolve().parent
CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def pod_spec(workload):
    return workload["spec"]["template"]["spec"]


def arg(container, flag):
    """The value of --flag=VALUE in a container's args, or None."""
    for a in container.get("args", []):
        if a.startswith(f"--{flag}="):
            return a.split("=", 1)[1]
    return None


def volume_path(spec, container, path):
    """(volume name, path inside the volume) of a container path, through its volumeMounts."""
    best = None
    for mount in container.get("volumeMounts", []):
        mp = mount["mountPath"].rstrip("/")
        if path == mp or path.startswith(mp + "/"):
            if best is None or len(mp) > len(best[1]):
                best = (mount["name"], mp)
    assert best, f"{container['name']}: {path} is on no volume"
    name, mp = best
    assert any(v["name"] == name for v in spec["volumes"]), f"volume {name} not declared"
    return name, posixpath.relpath(path, mp)


def edgevol_socket(spec):
    """The socket the pod's edgevol container serves: (volume, path inside it)."""
    for c in spec["containers"]:
        if c["image"].split(":")[0] in {i.split(":")[0] for i in m.images().values()}:
            listen = arg(c, "listen") or arg(c, "endpoint")
            assert listen and listen.startswith("unix://"), f"{c['name']}: no unix socket"
            return c, volume_path(spec, c, listen[len("unix://"):])
    raise AssertionError("no edgevol container in the pod")


@check
def kustomization_lists_every_manifest_once():
    k = m.kustomization()
    files = sorted(p.name for p in m.K8S.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(k["resources"]) == files, f"resources {k['resources']} != files {files}"
    assert k["namespace"] == "edgevol"
    for _, doc in m.documents():
        ns = doc["metadata"].get("namespace")
        assert ns in (None, "edgevol"), f"{doc['kind']} {doc['metadata']['name']} in {ns}"


@check
def sidecars_reach_the_edgevol_socket():
    for variant, (path, _, _) in m.VARIANTS.items():
        docs = m.documents(path)
        for kind in ("Deployment", "DaemonSet"):
            for w in m.find(docs, kind):
                spec = pod_spec(w)
                served, socket = edgevol_socket(spec)
                sidecars = [c for c in spec["containers"] if arg(c, "csi-address")]
                assert sidecars, f"{variant}: {kind} {w['metadata']['name']}: no sidecar"
                for c in sidecars:
                    got = volume_path(spec, c, arg(c, "csi-address"))
                    assert got == socket, \
                        f"{variant}: {c['name']} dials {got}, {served['name']} listens on {socket}"


@check
def registrar_path_is_the_daemonset_host_path():
    ds = m.find(m.documents(), "DaemonSet")[0]
    spec = pod_spec(ds)
    _, (volume, inside) = edgevol_socket(spec)
    host = next(v for v in spec["volumes"] if v["name"] == volume)["hostPath"]["path"]
    registrar = next(c for c in spec["containers"] if "node-driver-registrar" in c["image"])
    assert arg(registrar, "kubelet-registration-path") == posixpath.join(host, inside)
    assert host == f"/var/lib/kubelet/plugins/{m.driver_name()}", host
    reg = volume_path(spec, registrar, "/registration")
    reg_host = next(v for v in spec["volumes"] if v["name"] == reg[0])["hostPath"]["path"]
    assert reg_host == "/var/lib/kubelet/plugins_registry", reg_host


@check
def driver_name_is_get_plugin_info():
    docs = m.documents()
    name = m.driver_name()
    driver = m.find(docs, "CSIDriver")[0]
    assert driver["metadata"]["name"] == name
    assert driver["spec"]["attachRequired"] is True
    assert driver["spec"]["volumeLifecycleModes"] == ["Persistent"]
    assert driver["spec"]["fsGroupPolicy"] == "File"
    for sc in fleet.storage_classes(docs):
        assert sc["provisioner"] == name
        assert sc["parameters"]["provisioning"] == "thin"
        assert sc["parameters"][sc_rules.FSTYPE_KEY] == "ext4"
    for vsc in snapshot_classes():
        assert vsc["driver"] == name
    vac = yaml.safe_load((m.K8S / "examples" / "volumeattributesclass.yaml").read_text())
    assert vac["driverName"] == name
    limits = (m.ROOT / "appliance" / "src" / "qos" / "limits.rs").read_text()
    keys = set(re.findall(r'^\s*\(?\s*"(max\w+)",', limits, re.M))
    assert keys and set(vac["parameters"]) <= keys, f"VAC keys {set(vac['parameters'])} not in {keys}"


@check
def images_are_the_built_ones():
    built = m.images()
    seen = set()
    for _, doc in m.documents():
        if doc["kind"] not in ("Deployment", "DaemonSet"):
            continue
        for c in pod_spec(doc)["containers"]:
            image = c["image"]
            if image.startswith("localhost/"):
                assert image in built.values(), f"{c['name']}: {image} is not built ({built})"
                seen.add(image)
            else:
                assert image.startswith("registry.k8s.io/sig-storage/"), image
    assert seen == set(built.values()), f"unused built images: {set(built.values()) - seen}"
    for entry in m.kustomization()["images"]:
        assert f"{entry['name']}:{entry['newTag']}" in built.values(), entry


SNAPSHOT_CLASS = m.K8S / "snapshots" / "volumesnapshotclass.yaml"
FIXTURES = HERE / "fixtures"


def snapshot_classes():
    """The VolumeSnapshotClass, applied on its own once the snapshot CRDs exist."""
    docs = [d for d in yaml.safe_load_all(SNAPSHOT_CLASS.read_text()) if d is not None]
    assert [d["kind"] for d in docs] == ["VolumeSnapshotClass"], SNAPSHOT_CLASS
    return docs


def sidecar_containers(docs):
    """(name, version, container) of every upstream sidecar in the workloads."""
    out = []
    for _, w in docs:
        if w["kind"] not in ("Deployment", "DaemonSet"):
            continue
        for c in pod_spec(w)["containers"]:
            if c["image"].startswith("registry.k8s.io/sig-storage/"):
                name, version = c["image"].rsplit("/", 1)[1].split(":")
                out.append((name, version, c))
    return out


def check_sidecars(docs, k8s_range, opt_in):
    """Refused (sidecars.Refused) unless every sidecar, with the flags it is started with (its
    args and exec probes running its binary), runs on the whole range."""
    for name, version, c in sidecar_containers(docs):
        sc_rules.check_container(name, version, c.get("args", []), k8s_range, opt_in)
        probe = c.get("livenessProbe", {}).get("exec", {}).get("command", [])
        if probe:
            sc_rules.check_container(name, version, probe[1:], k8s_range, opt_in)


def check_storage_classes(docs, classes=None):
    """Refused unless each StorageClass (default: the rendered ones) passes the provisioner's
    parameter rules and edgevol accepts what the provisioner sends: the proxy serving the
    ConfigMap's fleet.toml takes `replicas` and the appliances the rest (fleet.check_class);
    returns the filesystems."""
    provisioners = [(v, c) for n, v, c in sidecar_containers(docs) if n == "csi-provisioner"]
    assert len(provisioners) == 1, f"one external-provisioner expected, found {provisioners}"
    version, container = provisioners[0]
    default_fs = arg(container, "default-fstype") or ""
    accepted = sc_rules.edgevol_parameter_keys(m.ROOT)
    fleet_ids = [a[0] for a in fleet.fleet_of(docs)]
    out = []
    for sc in classes if classes is not None else m.find(docs, "StorageClass"):
        fs, params = sc_rules.provisioner_create_parameters(
            sc.get("parameters", {}), version, ("data", "default", "pvc-1"))
        try:
            fleet.check_class(dict(sc, parameters=params), fleet_ids, accepted)
        except fleet.Refused as e:
            raise sc_rules.Refused(str(e)) from e
        out.append(fs or default_fs)
    return out


@check
def sidecars_run_on_the_promised_kubernetes_versions():
    for variant, (path, k8s_range, opt_in) in m.VARIANTS.items():
        docs = m.documents(path)
        try:
            check_sidecars(docs, k8s_range, opt_in)
        except sc_rules.Refused as e:
            raise AssertionError(f"{variant}: {e}") from e


@check
def storage_class_passes_the_provisioner_and_edgevol():
    for variant, (path, _, _) in m.VARIANTS.items():
        docs = m.documents(path)
        try:
            fs = check_storage_classes(docs, fleet.storage_classes(docs))
        except sc_rules.Refused as e:
            raise AssertionError(f"{variant}: {e}") from e
        assert fs and all(f in ("ext4", "xfs") for f in fs), f"{variant}: filesystems {fs}"


def refused(fn, *args):
    """The message fn(*args) is refused with; fails if it is accepted."""
    try:
        fn(*args)
    except sc_rules.Refused as e:
        return str(e)
    raise AssertionError(f"{fn.__name__} accepted {args!r}")


@check
def the_checks_refuse_what_0_1_0_shipped():
    base = m.documents()
    old_sc = yaml.safe_load((FIXTURES / "storageclass-0.1.0.yaml").read_text())
    msg = refused(check_storage_classes, [d for d in base if d[1]["kind"] != "StorageClass"]
                  + [("storageclass.yaml", old_sc)])
    assert msg == 'fstype specified in parameters with both "fstype" and "csi.storage.k8s.io/fstype" keys', msg
    # Each old sidecar on its own: the resizer (and the provisioner) read v1beta1 classes.
    old_controller = yaml.safe_load((FIXTURES / "controller-0.1.0.yaml").read_text())
    _, k8s_range, opt_in = m.VARIANTS["deploy/kubernetes"]
    refusals = {}
    for name, version, c in sidecar_containers([("controller.yaml", old_controller)]):
        try:
            sc_rules.check_container(name, version, c.get("args", []), k8s_range, opt_in)
        except sc_rules.Refused as e:
            refusals[name] = str(e)
    assert "watches storage.k8s.io/v1beta1" in refusals.get("csi-provisioner", ""), refusals
    msg = refusals.get("csi-resizer")
    assert msg == ("csi-resizer:v1.14.0 watches storage.k8s.io/v1beta1 VolumeAttributesClass, "
                   "which Kubernetes 1.34 does not serve by default"), msg


@check
def the_parameter_rules_refuse_what_the_provisioner_refuses():
    ok = {"provisioning": "thin", sc_rules.FSTYPE_KEY: "xfs"}
    assert sc_rules.provisioner_create_parameters(ok, "v6.2.1")[0] == "xfs"
    for params, want in (
        ({"FSTYPE": "ext4", sc_rules.FSTYPE_KEY: "ext4"}, "both"),
        ({"fsType": "ext4", "fstype": "ext4"}, "differ only in case"),
        ({"Provisioning": "thin", "provisioning": "thick"}, "differ only in case"),
        ({sc_rules.PREFIX + "pvc/name": "x"}, "unknown parameter key"),
        ({sc_rules.PREFIX + "fsType": "ext4"}, "unknown parameter key"),
    ):
        msg = refused(sc_rules.provisioner_create_parameters, params, "v6.2.1")
        assert want in msg, (params, msg)
    # Keys the provisioner strips: secrets, controller-modify only from v6.2.0.
    modify = {sc_rules.PREFIX + "controller-modify-secret-name": "s"}
    assert sc_rules.provisioner_create_parameters(modify, "v6.2.1")[1] == {}
    refused(sc_rules.provisioner_create_parameters, modify, "v5.3.0")
    # A gate the binary does not know, or a minimum above the range, or a beta API not opted in.
    msg = refused(sc_rules.check_container, "csi-resizer", "v2.2.1",
                  ["--feature-gates=VolumeAttributesClass=true,Bogus=true"], ((1, 34), (1, 36)))
    assert "unrecognized feature gate 'Bogus'" in msg, msg
    msg = refused(sc_rules.check_container, "csi-provisioner", "v5.3.0",
                  ["--feature-gates=HonorPVReclaimPolicy=false"], ((1, 31), (1, 33)))
    assert "locked" in msg, msg
    msg = refused(sc_rules.check_container, "csi-provisioner", "v6.2.1", [], ((1, 31), (1, 33)))
    assert "needs Kubernetes 1.34" in msg, msg
    msg = refused(sc_rules.check_container, "csi-resizer", "v1.14.0", [], ((1, 31), (1, 33)))
    assert "does not serve by default" in msg, msg
    msg = refused(sc_rules.check_container, "csi-resizer", "v2.2.1", [], ((1, 31), (1, 36)))
    assert "storage.k8s.io/v1 VolumeAttributesClass" in msg and "1.31 does not have" in msg, msg


def sidecar_versions(docs):
    out = {}
    for kind in ("Deployment", "DaemonSet"):
        for w in m.find(docs, kind):
            for c in pod_spec(w)["containers"]:
                if c["image"].startswith("registry.k8s.io/sig-storage/"):
                    name, version = c["image"].rsplit("/", 1)[1].split(":")
                    assert out.setdefault(name, version) == version, f"{name}: two versions"
    return out


def granted(docs, role_kind, binding_kind, account):
    """Every (apiGroup, resource, verb) the account gets from role_kind through binding_kind."""
    roles = {r["metadata"]["name"]: r for r in m.find(docs, role_kind)}
    out = set()
    for b in m.find(docs, binding_kind):
        if not any(s["kind"] == "ServiceAccount" and s["name"] == account for s in b["subjects"]):
            continue
        assert b["roleRef"]["kind"] == role_kind, b["metadata"]["name"]
        for rule in roles[b["roleRef"]["name"]]["rules"]:
            for g in rule["apiGroups"]:
                for r in rule["resources"]:
                    for v in rule["verbs"]:
                        out.add((g, r, v))
    return out


@check
def rbac_covers_each_sidecars_upstream_rules():
    upstream = json.loads((HERE / "upstream-rbac.json").read_text())
    for variant, (path, _, _) in m.VARIANTS.items():
        docs = m.documents(path)
        deployment = m.find(docs, "Deployment")[0]
        account = pod_spec(deployment)["serviceAccountName"]
        cluster = granted(docs, "ClusterRole", "ClusterRoleBinding", account)
        namespaced = granted(docs, "Role", "RoleBinding", account)
        for name, version in sidecar_versions(docs).items():
            rules = upstream.get(name, {}).get(version)
            assert rules, f"{variant}: {name} {version}: no upstream rules recorded"
            for scope, have in (("cluster", cluster), ("namespaced", namespaced)):
                for group, resource, verbs in rules[scope]:
                    missing = [v for v in verbs if (group, resource, v) not in have]
                    assert not missing, f"{variant}: {name}: {scope} {group}/{resource} lacks {missing}"


@check
def provisioner_sends_extra_metadata_and_node_plugin_has_its_host():
    docs = m.documents()
    spec = pod_spec(m.find(docs, "Deployment")[0])
    prov = next(c for c in spec["containers"] if "csi-provisioner" in c["image"])
    assert "--extra-create-metadata" in prov["args"]
    proxy, _ = edgevol_socket(spec)
    assert proxy["args"][0] == "proxy"
    spec = pod_spec(m.find(docs, "DaemonSet")[0])
    node, _ = edgevol_socket(spec)
    assert node["securityContext"]["privileged"] is True
    mounts = {mt["mountPath"]: mt for mt in node["volumeMounts"]}
    assert mounts["/var/lib/kubelet"].get("mountPropagation") == "Bidirectional"
    hosts = {v["name"]: v.get("hostPath", {}).get("path") for v in spec["volumes"]}
    for path, host in (("/dev", "/dev"), ("/sys", "/sys"), ("/etc/nvme", "/etc/nvme")):
        assert hosts[mounts[path]["name"]] == host, path
    # modprobe and modules.dep read the host's modules; a host without them still runs the pod.
    modules = mounts["/lib/modules"]
    assert modules.get("readOnly") is True, "/lib/modules must be read-only"
    volume = next(v for v in spec["volumes"] if v["name"] == modules["name"])["hostPath"]
    assert volume == {"path": "/lib/modules", "type": "DirectoryOrCreate"}, volume
    for flag, where in (("node-id-file", "/etc/nvme"), ("hostid-file", "/etc/nvme"), ("state-dir", "/var/lib/edgevol-node")):
        value = arg(node, flag)
        volume, _ = volume_path(spec, node, value)
        assert hosts[volume] and value.startswith(where), f"--{flag}={value} is not on the host"


def container(docs, kind, image_key):
    """The edgevol container of the Deployment or DaemonSet, and its pod spec."""
    spec = pod_spec(m.find(docs, kind)[0])
    image = m.images()[image_key]
    return next(c for c in spec["containers"] if c["image"] == image), spec


def args_of(c, flag):
    return [a.split("=", 1)[1] for a in c.get("args", []) if a.startswith(f"--{flag}=")]


@check
def controller_serves_the_fleet_of_the_configmap():
    fleet.check_code_facts()
    for variant, (path, _, _) in m.VARIANTS.items():
        docs = m.documents(path)
        appliances = fleet.fleet_of(docs)
        proxy, spec = container(docs, "Deployment", "cli")
        assert proxy["args"][0] == "proxy"
        assert not args_of(proxy, "appliance"), f"{variant}: appliances outside fleet.toml"
        (config,) = args_of(proxy, "config")
        volume, inside = volume_path(spec, proxy, config)
        source = next(v for v in spec["volumes"] if v["name"] == volume)["configMap"]
        assert source["name"] == "edgevol-config", source
        items = {i["path"]: i["key"] for i in source.get("items", [])}
        assert items.get(inside) == "fleet.toml", f"{variant}: --config={config} is {items}"
        assert appliances, variant


@check
def node_plugin_reaches_every_appliance_of_the_fleet():
    for variant, (path, _, _) in m.VARIANTS.items():
        docs = m.documents(path)
        appliances = fleet.fleet_of(docs)
        node, _ = container(docs, "DaemonSet", "node")
        topology = args_of(node, "topology")
        want = [f"{fleet.APPLIANCE_KEY}={ident}" for ident, _, _ in appliances]
        assert [t for t in topology if t.startswith(fleet.APPLIANCE_KEY + "=")] == want, \
            f"{variant}: edgevol-node --topology {topology}, fleet.toml {want}"
        enrol = args_of(node, "appliance")
        want = [f"{ident}={address}" for ident, address, _ in appliances]
        assert enrol == want, f"{variant}: edgevol-node --appliance {enrol}, fleet.toml {want}"
        # edgevol-node has one certificate name for all appliances (or each address's host).
        names = {name for _, _, name in appliances}
        node_name = args_of(node, "appliance-server-name")
        assert names == {None} or (len(names) == 1 and node_name == list(names)), \
            f"{variant}: fleet.toml server names {names}, edgevol-node {node_name}"
        # Every class is usable on the DaemonSet's nodes (WaitForFirstConsumer picks one).
        segment = fleet.node_topology([ident for ident, _, _ in appliances])
        for sc in fleet.storage_classes(docs):
            assert fleet.accessibility_requirements(sc, segment) is not None, \
                f"{variant}: StorageClass {sc['metadata']['name']} matches no edgevol node ({segment})"


def fleet_refused(fn, *args):
    try:
        fn(*args)
    except fleet.Refused as e:
        return str(e)
    raise AssertionError(f"{fn.__name__} accepted {args!r}")


@check
def the_fleet_rules_refuse_what_edgevol_refuses():
    two = '[[appliance]]\nid = "a"\naddress = "h1:1"\n[[appliance]]\nid = "b"\naddress = "h2:1"\n'
    assert [a[0] for a in fleet.parse_fleet(two)] == ["a", "b"]
    for text, want in (
        ("", "no appliance"),
        ('[[appliance]]\nid = "a"\naddres = "h:1"\n', "unknown ['addres']"),
        ('[[appliance]]\nid = "Box"\naddress = "h:1"\n', "[a-z0-9-]"),
        (two.replace('"b"', '"a"'), "id a given twice"),
        (two.replace("h2:1", "h1:1"), "h1:1 given twice"),
        ('proxy = 1\n' + two, "unknown keys"),
    ):
        msg = fleet_refused(fleet.parse_fleet, text)
        assert want in msg, (text, msg)
    keys = sc_rules.edgevol_parameter_keys(m.ROOT)

    def sc(params, *terms):
        return {"metadata": {"name": "t"}, "parameters": params,
                "allowedTopologies": [{"matchLabelExpressions": t} for t in terms]}

    both = [{"key": "appliance.edgevol.io/a", "values": ["true"]},
            {"key": "appliance.edgevol.io/b", "values": ["true"]}]
    assert fleet.check_class(sc({"replicas": "2"}, both), ["a", "b"], keys) == 2
    assert fleet.check_class(sc({"replicas": "2"}), ["a", "b"], keys) == 2
    for cls, ids, want in (
        (sc({"replicas": "4"}), ["a", "b"], "expected 1, 2 or 3"),
        (sc({"replicas": "2"}), ["a"], "forwards untouched"),
        (sc({"replicas": "3"}, both), ["a", "b"], "fleet.toml has 2"),
        (sc({"replicas": "2"}, both[:1], both[1:]), ["a", "b"], "reach 2 appliances"),
        (sc({"replicas": "2"}, [{"key": "edgevol.io/appliance", "values": ["a"]}]), ["a", "b"], "reach 2"),
        (sc({}, [{"key": "edgevol.io/appliance", "values": ["c"]}]), ["a", "b"], "['c'] are not in fleet.toml"),
        (sc({}, [{"key": "appliance.edgevol.io/a", "values": ["yes"]}]), ["a"], "only as 'true'"),
        (sc({"replicass": "2"}), ["a", "b"], "refuses parameters ['replicass']"),
    ):
        msg = fleet_refused(fleet.check_class, cls, ids, keys)
        assert want in msg, (cls, msg)
    # A node reaching two appliances reports a presence key for each and the plain key for its
    # home box (the first): a class on the plain key (what one-box sites used) still matches
    # it for the home box, not for the other; one on the presence key does.
    segment = fleet.node_topology(["a", "b"])
    plain = [{"key": "edgevol.io/appliance", "values": ["a"]}]
    assert fleet.accessibility_requirements(sc({}, plain), segment) == ([{"edgevol.io/appliance": "a"}],) * 2
    plain_b = [{"key": "edgevol.io/appliance", "values": ["b"]}]
    assert fleet.accessibility_requirements(sc({}, plain_b), segment) is None
    assert fleet.segment_appliances(segment) == {"a", "b"}, "presence keys decide, not the home key"
    only_a = {"appliance.edgevol.io/a": "true"}
    assert fleet.accessibility_requirements(sc({}, both[:1]), segment) == ([only_a], [only_a])
    assert fleet.node_topology(["a"]) == {"appliance.edgevol.io/a": "true", "edgevol.io/appliance": "a"}
    # The provisioner's requisite: terms ORed, values distributed; preferred from the node's.
    req, pref = fleet.accessibility_requirements(sc({}, plain, both[1:], both), segment)
    assert req == [{"edgevol.io/appliance": "a"}, {"appliance.edgevol.io/b": "true"},
                   {"appliance.edgevol.io/a": "true", "appliance.edgevol.io/b": "true"}], req
    assert pref == req, "the node (home box a) matches the first term"
    assert fleet.flatten([{"matchLabelExpressions": [{"key": "k", "values": ["1", "2"]},
                                                     {"key": "j", "values": ["x"]}]}]) == \
        [{"k": "1", "j": "x"}, {"k": "2", "j": "x"}]


@check
def volume_snapshot_class_fits_its_crd_schema():
    schema = json.loads((HERE / "schemas" / "volumesnapshotclass-v1.json").read_text())
    for vsc in snapshot_classes():
        jsonschema.validate(vsc, schema)
    bad = dict(snapshot_classes()[0], deletionPolicy="Keep")
    try:
        jsonschema.validate(bad, schema)
        raise AssertionError("the CRD schema accepted deletionPolicy: Keep")
    except jsonschema.ValidationError:
        pass


SNAPSHOT_METADATA = m.K8S / "snapshot-metadata"
SMS_FILE = SNAPSHOT_METADATA / "snapshotmetadataservice.yaml"
SMS_CRD_FILE = SNAPSHOT_METADATA / "cbt.storage.k8s.io_snapshotmetadataservices.yaml"
# The caCert of snapshotmetadataservice.yaml until the operator puts the CA there (docs).
CA_PLACEHOLDER = "CA_PEM_BASE64"
SIDECAR_GRPC_PORT = 50051  # external-snapshot-metadata's --port default
SIDECAR_HEALTH = ("/health", 8080)  # served whatever the flags (v1.0.0, #190)


def one_document(path):
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert len(docs) == 1, f"{path}: {len(docs)} documents"
    return docs[0]


def crd_schema(crd, version):
    """The openAPIV3Schema of `version` in `crd` as JSON Schema, closed as the API server's
    strict field validation is (unknown fields refused, metadata left to the server)."""
    entry = next(v for v in crd["spec"]["versions"] if v["name"] == version)
    schema = json.loads(json.dumps(entry["schema"]["openAPIV3Schema"]))

    def close(node, top):
        if node.get("type") == "object" and "properties" in node:
            node.setdefault("additionalProperties", False)
            for name, child in node["properties"].items():
                if not (top and name == "metadata"):
                    close(child, False)

    close(schema, True)
    return schema


def byte_format():
    """format: byte as the API server checks it: base64."""
    checker = jsonschema.FormatChecker()

    @checker.checks("byte", raises=(ValueError, TypeError))
    def _(value):
        base64.b64decode(value, validate=True)
        return True

    return checker


def check_snapshot_metadata(docs, sms, crd):
    """Refused (sidecars.Refused) unless the SnapshotMetadataService `sms` is one the pinned
    csi-snapshot-metadata sidecar of `docs` reads (API version, the CRD `crd` serving it, its
    schema), named after the driver, with the sidecar's audience, and its address the Service in
    front of the sidecar's gRPC port; and the sidecar has its TLS pair and health probe."""
    found = [(n, v, c) for n, v, c in sidecar_containers(docs) if n == "csi-snapshot-metadata"]
    if len(found) != 1:
        raise sc_rules.Refused(f"one csi-snapshot-metadata sidecar expected, found {len(found)}")
    name, version, c = found[0]
    sc_rules.check_custom_resource(name, version, sms, crd)
    try:
        jsonschema.validate(sms, crd_schema(crd, sms["apiVersion"].split("/")[1]),
                            format_checker=byte_format())
    except jsonschema.ValidationError as e:
        raise sc_rules.Refused(f"{sms['kind']} {sms['metadata'].get('name')}: {e.message}") from e
    spec = sms["spec"]
    if sms["metadata"]["name"] != m.driver_name():
        raise sc_rules.Refused(f"the {sms['kind']} is {sms['metadata']['name']}; backup "
                               f"applications look it up by the driver name {m.driver_name()}")
    audience = arg(c, "audience")
    if audience is not None and audience != spec["audience"]:
        raise sc_rules.Refused(f"the sidecar checks tokens for audience {audience}, the "
                               f"{sms['kind']} tells clients {spec['audience']}")
    grpc_port = int(arg(c, "port") or SIDECAR_GRPC_PORT)
    workload = next(w for _, w in docs if w["kind"] == "Deployment"
                    and c in pod_spec(w)["containers"])
    labels = workload["spec"]["template"]["metadata"]["labels"]
    named = {p["name"]: p["containerPort"] for p in c.get("ports", []) if "name" in p}
    addresses = []
    for svc in (d for _, d in docs if d["kind"] == "Service"):
        if not svc["spec"]["selector"].items() <= labels.items():
            continue
        for p in svc["spec"]["ports"]:
            target = p.get("targetPort", p["port"])
            if named.get(target, target) == grpc_port:
                addresses.append(f"{svc['metadata']['name']}.{svc['metadata']['namespace']}:{p['port']}")
    if spec["address"] not in addresses:
        raise sc_rules.Refused(f"the {sms['kind']} address {spec['address']} is no Service in "
                               f"front of the sidecar's port {grpc_port} ({addresses})")
    pod = pod_spec(workload)
    for flag, key in (("tls-cert", "tls.crt"), ("tls-key", "tls.key")):
        path = arg(c, flag)
        if path is None:
            raise sc_rules.Refused(f"the sidecar has no --{flag} (it refuses to start)")
        volume, inside = volume_path(pod, c, path)
        source = next(v for v in pod["volumes"] if v["name"] == volume).get("secret")
        if source is None or inside != key:
            raise sc_rules.Refused(f"--{flag}={path} is not {key} of a kubernetes.io/tls Secret")
    probe = c.get("readinessProbe", {}).get("httpGet", {})
    if (probe.get("path"), named.get(probe.get("port"), probe.get("port"))) != SIDECAR_HEALTH:
        raise sc_rules.Refused(f"the sidecar's readiness probe {probe} is not its {SIDECAR_HEALTH}")


def filled_in(sms):
    """The SnapshotMetadataService as the operator applies it: the CA in caCert (docs' sed)."""
    assert sms["spec"]["caCert"] == CA_PLACEHOLDER, sms["spec"]["caCert"]
    ca = b"-----BEGIN CERTIFICATE-----\n(the sidecar's CA)\n-----END CERTIFICATE-----\n"
    return dict(sms, spec=dict(sms["spec"], caCert=base64.b64encode(ca).decode()))


@check
def snapshot_metadata_files_are_each_applied_once():
    k = m.kustomization(SNAPSHOT_METADATA)
    listed = [r for r in k["resources"] if r != ".."] + [p["path"] for p in k["patches"]]
    on_their_own = [SMS_FILE.name, SMS_CRD_FILE.name]
    files = sorted(p.name for p in SNAPSHOT_METADATA.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(listed + on_their_own) == files, f"{listed} + {on_their_own} != {files}"
    assert k["resources"][0] == "..", "snapshot-metadata builds on deploy/kubernetes"
    # The vendored CRD, strictly, against every Kubernetes version the variant is for.
    import kubernetes_validate

    crd = one_document(SMS_CRD_FILE)
    assert crd["kind"] == "CustomResourceDefinition", crd["kind"]
    _, (low, high), _ = m.VARIANTS["deploy/kubernetes/snapshot-metadata"]
    for minor in sc_rules.minors(low, high):
        kubernetes_validate.validate(crd, f"{minor[0]}.{minor[1]}.0", strict=True)


@check
def snapshot_metadata_service_is_what_the_sidecar_reads():
    docs = m.documents(SNAPSHOT_METADATA)
    sms, crd = one_document(SMS_FILE), one_document(SMS_CRD_FILE)
    try:
        check_snapshot_metadata(docs, filled_in(sms), crd)
    except sc_rules.Refused as e:
        raise AssertionError(str(e)) from e
    # Applied without the CA, the API server refuses it (format: byte), so a forgotten step
    # cannot register an endpoint nobody can verify.
    msg = refused(check_snapshot_metadata, docs, sms, crd)
    assert "is not a 'byte'" in msg, msg
    # Only this variant runs the sidecar: the others never depend on the CRD or the TLS Secret.
    for variant, (path, _, _) in m.VARIANTS.items():
        if path != SNAPSHOT_METADATA:
            assert "csi-snapshot-metadata" not in sidecar_versions(m.documents(path)), variant


@check
def the_snapshot_metadata_checks_refuse_a_wrong_api_version_or_flag():
    docs = m.documents(SNAPSHOT_METADATA)
    crd = one_document(SMS_CRD_FILE)
    old = one_document(FIXTURES / "snapshotmetadataservice-v1alpha1.yaml")
    msg = refused(check_snapshot_metadata, docs, old, crd)
    assert msg == ("csi-snapshot-metadata:v1.1.0 reads cbt.storage.k8s.io/v1beta1 "
                   "SnapshotMetadataService, not cbt.storage.k8s.io/v1alpha1"), msg
    # A CRD that has the version only deprecated, or not at all, is refused too.
    stale = json.loads(json.dumps(crd))
    for v in stale["spec"]["versions"]:
        v["storage"] = v["name"] == "v1alpha1"
    msg = refused(sc_rules.check_custom_resource, "csi-snapshot-metadata", "v1.1.0",
                  one_document(SMS_FILE), stale)
    assert "deprecated or unstored" in msg, msg
    # The other sidecars' --leader-election, copied: the binary refuses to start.
    patch = one_document(FIXTURES / "snapshot-metadata-leader-election.yaml")
    (name, version, c), = sidecar_containers([("sidecar.yaml", patch)])
    _, k8s_range, opt_in = m.VARIANTS["deploy/kubernetes/snapshot-metadata"]
    msg = refused(sc_rules.check_container, name, version, c["args"], k8s_range, opt_in)
    assert msg.startswith("csi-snapshot-metadata:v1.1.0: flag '--leader-election' is not one of"), msg
    # Why the 1.31-1.33 overlay leaves it out: not every version it is for runs it.
    _, k8s_range, opt_in = m.VARIANTS["deploy/kubernetes/overlays/k8s-1.31-1.33"]
    msg = refused(sc_rules.check_container, name, version, [], k8s_range, opt_in)
    assert msg == "csi-snapshot-metadata:v1.1.0 needs Kubernetes 1.33, the range starts at 1.31", msg


def main():
    failed = 0
    for fn in CHECKS:
        try:
            fn()
            print(f"ok: {fn.__name__}")
        except (AssertionError, KeyError, StopIteration, fleet.Refused) as e:
            failed += 1
            print(f"FAILED: {fn.__name__}: {e}")
    print(f"{len(CHECKS) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
