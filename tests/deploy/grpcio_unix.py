"""gRPC C-core (Python's grpcio) over edgevol's unix sockets, as a CO written with it would call.

grpcio sends the percent-encoded socket path as :authority; without the fix in edgevol-uds,
h2 resets every such stream (StatusCode.INTERNAL, RST_STREAM PROTOCOL_ERROR). Through
`edgevol proxy` in front of one appliance this also replays Kubernetes' CreateVolume with
external-provisioner's --extra-create-metadata parameters, a secret key that must be refused,
and each orchestrator's CreateVolume of a one-box site. Through the proxy serving
deploy/kubernetes' fleet.toml (--fleet-proxy), with the node plugin started with the
DaemonSet's --topology flags, it replays every StorageClass (the examples too) and Nomad
volume specification as the pinned external-provisioner or Nomad sends them for that node, and
checks where each volume lands and that the node can use it.

Usage: grpcio_unix.py --proxy SOCKET --fleet-proxy SOCKET --node SOCKET
"""

import argparse
import sys

import grpc
import hcl2
import yaml

import check_orchestrators as co
import csi_wire as w
import fleet
import manifests as m
import orchestrators as o
import sidecars

DRIVER = "csi.edgevol.io"


def call(channel, method, request=b""):
    fn = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
    return w.decode(fn(request, timeout=20))


def plugin_name(channel):
    info = call(channel, "/csi.v1.Identity/GetPluginInfo")
    return info[1][0].decode()


def check_node(path):
    # No grpc.default_authority option: the client's own default, the socket path.
    with grpc.insecure_channel("unix:" + path) as ch:
        assert plugin_name(ch) == DRIVER
        caps = call(ch, "/csi.v1.Node/NodeGetCapabilities")
        assert caps.get(1), "NodeGetCapabilities returned no capability"
        print(f"ok: node plugin {path}: GetPluginInfo and NodeGetCapabilities over grpcio")


def check_proxy(path):
    metadata = {
        "csi.storage.k8s.io/pvc/name": "grpcio-claim",
        "csi.storage.k8s.io/pvc/namespace": "deploy-test",
        "csi.storage.k8s.io/pv/name": "pvc-grpcio",
    }
    with grpc.insecure_channel("unix:" + path) as ch:
        assert plugin_name(ch) == DRIVER
        cap = w.capability("SINGLE_NODE_WRITER", "ext4")
        request = w.create_volume("pvc-grpcio", 16 << 20, [cap], {"provisioning": "thin", **metadata})
        volume = w.decode(call(ch, "/csi.v1.Controller/CreateVolume", request)[1][0])
        context = w.decode_map(volume.get(3, []))
        for k, v in metadata.items():
            assert context.get(k) == v, f"volume_context lacks {k}={v}: {context}"
        volume_id = volume[2][0].decode()

        secret = {"csi.storage.k8s.io/provisioner-secret-name": "s3cr3t-name"}
        try:
            call(ch, "/csi.v1.Controller/CreateVolume", w.create_volume("pvc-secret", 16 << 20, [cap], secret))
            raise AssertionError("a csi.storage.k8s.io secret key was accepted")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
            assert "secret" in e.details() and "s3cr3t-name" not in e.details(), e.details()
        print(f"ok: proxy {path}: GetPluginInfo, CreateVolume with extra metadata, secret key refused")
        return volume_id


def create(ch, name, size, caps, params, requisite, preferred=()):
    """CreateVolume: the Volume ({number: [values]}), or the gRPC status code of the refusal."""
    request = w.create_volume(name, size, caps, params, requisite, preferred)
    try:
        return w.decode(call(ch, "/csi.v1.Controller/CreateVolume", request)[1][0])
    except grpc.RpcError as e:
        return e.code()


def node_segment(path):
    """The topology NodeGetInfo reports."""
    with grpc.insecure_channel("unix:" + path) as ch:
        info = call(ch, "/csi.v1.Node/NodeGetInfo")
    return w.decode_map(w.decode(info[3][0]).get(1, [])) if 3 in info else {}


def provisioner_version():
    return next(c["image"].rsplit(":", 1)[1] for _, d in m.documents()
                if d["kind"] == "Deployment" for c in d["spec"]["template"]["spec"]["containers"]
                if "/csi-provisioner:" in c["image"])


def landed(volume, requisite, replicas, node):
    """Checks a created volume: `replicas` legs on distinct appliances that one requisite
    segment allows, and an accessible topology (the PV's node affinity) the node matches."""
    volume_id = volume[2][0].decode()
    legs = volume_id.split("+")
    boxes = [fleet.appliance_of(leg) for leg in legs]
    assert len(legs) == replicas and len(set(boxes)) == replicas, f"{volume_id}: legs {boxes}"
    allowed = [fleet.segment_appliances(s) for s in requisite]
    assert any(a is None or set(boxes) <= a for a in allowed), f"{volume_id} on {boxes}, requisite {requisite}"
    segments = [w.decode_map(w.decode(t).get(1, [])) for t in volume.get(5, [])]
    assert any(all(node.get(k) == v for k, v in s.items()) for s in segments), \
        f"{volume_id}: accessible topology {segments} matches no term of the node {node}"
    return volume_id, boxes


def replay_kubernetes(ch, node):
    """external-provisioner's CreateVolume for deploy/kubernetes' StorageClass (and the example
    claim), for a node of a one-box site, through a proxy serving that appliance alone."""
    sc = yaml.safe_load((m.K8S / "storageclass.yaml").read_text())
    # What the pinned provisioner sends: its parameter rules, --extra-create-metadata's keys.
    fs, params = sidecars.provisioner_create_parameters(
        sc["parameters"], provisioner_version(), ("data", "default", "pvc-replay-k8s"))
    requisite, preferred = fleet.accessibility_requirements(sc, node)
    got = create(ch, "pvc-replay-k8s", 1 << 30, [w.capability("SINGLE_NODE_WRITER", fs)], params,
                 requisite, preferred)
    assert isinstance(got, dict), f"Kubernetes' CreateVolume refused: {got}"
    landed(got, requisite, 1, node)
    print("ok: Kubernetes StorageClass CreateVolume (extra metadata, topology) accepted by one appliance")
    # A replicated class needs the proxy of several: one appliance alone refuses `replicas`.
    replicated = yaml.safe_load((m.K8S / "examples" / "storageclass-replicated.yaml").read_text())
    _, params = sidecars.provisioner_create_parameters(replicated["parameters"], provisioner_version())
    got = create(ch, "pvc-replay-k8s-replicated", 1 << 30, [w.capability("SINGLE_NODE_WRITER", fs)],
                 params, None)
    assert got == grpc.StatusCode.INVALID_ARGUMENT, f"one appliance answered replicas with {got}"
    print("ok: a proxy serving one appliance forwards replicas untouched, and the appliance refuses it")


def nomad_requests(path):
    """`nomad volume create PATH`: (name, capabilities, parameters, requisite segments)."""
    vol = co.unquote(hcl2.load(open(path)))
    fs = vol["mount_options"][0]["fs_type"]
    caps = []
    for cap in vol["capability"]:
        mode = o.NOMAD[cap["access_mode"]]
        caps.append(w.capability(mode, fs if cap["attachment_mode"] == "file-system" else None))
    return "nomad-replay-" + vol["id"], caps, vol["parameters"][0], co.nomad_topologies(vol)


def replay_nomad(ch, node):
    """`nomad volume create deploy/nomad/volume.hcl` on a one-box site."""
    name, caps, params, requisite = nomad_requests(co.NOMAD / "volume.hcl")
    got = create(ch, name, 64 << 20, caps, params, requisite)
    assert isinstance(got, dict), f"Nomad's CreateVolume refused: {got}"
    landed(got, requisite, 1, node)
    print(f"ok: Nomad volume specification CreateVolume ({len(caps)} capabilities) accepted")


def replay_swarm(ch, box):
    """`docker volume create --scope S --sharing H --type T`: each combination Docker sends,
    accepted or refused (INVALID_ARGUMENT) as the README's table says."""
    n = 0
    for (scope, sharing), mode in o.SWARM.items():
        if mode is None:
            continue
        for kind in ("mount", "block"):
            cap = w.capability(mode, "ext4" if kind == "mount" else None)
            got = create(ch, f"swarm-{scope}-{sharing}-{kind}", 16 << 20, [cap], {},
                         {"edgevol.io/appliance": box})
            if o.accepted(mode, kind):
                assert isinstance(got, dict), f"swarm {scope}/{sharing}/{kind}: refused {got}"
            else:
                assert got == grpc.StatusCode.INVALID_ARGUMENT, f"swarm {scope}/{sharing}/{kind}: {got}"
            n += 1
    print(f"ok: {n} Swarm scope x sharing x type combinations answered as the README says")


def replay_fleet(path, node_path):
    """Every StorageClass of deploy/kubernetes (examples too) and every Nomad volume
    specification, through the proxy serving fleet.toml, for the DaemonSet's node."""
    docs = m.documents()
    ids = [a[0] for a in fleet.fleet_of(docs)]
    node = node_segment(node_path)
    assert node == fleet.node_topology(ids), f"NodeGetInfo {node}, expected {fleet.node_topology(ids)}"
    print(f"ok: the node plugin with the DaemonSet's flags reports {node}")
    version = provisioner_version()
    key = fleet.replicas_param()
    seen = set()
    with grpc.insecure_channel("unix:" + path) as ch:
        for sc in fleet.storage_classes(docs):
            name = "pvc-fleet-" + sc["metadata"]["name"]
            fs, params = sidecars.provisioner_create_parameters(
                sc["parameters"], version, ("data", "default", name))
            requisite, preferred = fleet.accessibility_requirements(sc, node)
            replicas = int(params.get(key, "1"))
            got = create(ch, name, 1 << 30, [w.capability("SINGLE_NODE_WRITER", fs)], params,
                         requisite, preferred)
            assert isinstance(got, dict), f"StorageClass {sc['metadata']['name']}: CreateVolume refused: {got}"
            volume_id, boxes = landed(got, requisite, replicas, node)
            seen |= set(boxes)
            # Idempotent by name: the provisioner's retry gets the same volume.
            again = create(ch, name, 1 << 30, [w.capability("SINGLE_NODE_WRITER", fs)], params,
                           requisite, preferred)
            assert isinstance(again, dict) and again[2][0].decode() == volume_id, again
            print(f"ok: StorageClass {sc['metadata']['name']}: {volume_id} on {', '.join(boxes)}")
        for spec in co.nomad_volumes():
            name, caps, params, requisite = nomad_requests(spec)
            replicas = int(params.get(key, "1"))
            got = create(ch, name, 64 << 20, caps, params, requisite)
            assert isinstance(got, dict), f"{spec.name}: CreateVolume refused: {got}"
            volume_id, boxes = landed(got, requisite, replicas, node)
            seen |= set(boxes)
            print(f"ok: Nomad {spec.name}: {volume_id} on {', '.join(boxes)}")
    assert seen == set(ids), f"the replay used {sorted(seen)} of {ids}"


def appliance_id(ch):
    info = call(ch, "/csi.v1.Identity/GetPluginInfo")
    return w.decode_map(info.get(3, []))["appliance-id"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--proxy", required=True, help="edgevol proxy serving one appliance")
    ap.add_argument("--fleet-proxy", required=True, help="edgevol proxy serving fleet.toml")
    ap.add_argument("--node", required=True)
    args = ap.parse_args()
    check_node(args.node)
    print(check_proxy(args.proxy))
    with grpc.insecure_channel("unix:" + args.proxy) as ch:
        box = appliance_id(ch)
        one_box = fleet.node_topology([box])
        replay_kubernetes(ch, one_box)
        replay_nomad(ch, one_box)
        replay_swarm(ch, box)
    replay_fleet(args.fleet_proxy, args.node)


if __name__ == "__main__":
    sys.exit(main())
