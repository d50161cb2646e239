"""gRPC C-core (Python's grpcio) over edgevol's unix sockets, as a CO written with it would call.

grpcio sends the percent-encoded socket path as :authority; without the fix in edgevol-uds,
h2 resets every such stream (StatusCode.INTERNAL, RST_STREAM PROTOCOL_ERROR). Through
`edgevol proxy` this also replays Kubernetes' CreateVolume with external-provisioner's
--extra-create-metadata parameters, and a secret key that must be refused.

Usage: grpcio_unix.py --proxy SOCKET --node SOCKET
"""

import argparse
import sys

import grpc
import hcl2
import yaml

import check_orchestrators as co
import csi_wire as w
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


def create(ch, name, size, caps, params, requisite):
    """CreateVolume: the volume's id, or the gRPC status code of the refusal."""
    request = w.create_volume(name, size, caps, params, requisite)
    try:
        volume = w.decode(call(ch, "/csi.v1.Controller/CreateVolume", request)[1][0])
        return volume[2][0].decode()
    except grpc.RpcError as e:
        return e.code()


def appliance_id(ch):
    info = call(ch, "/csi.v1.Identity/GetPluginInfo")
    return w.decode_map(info.get(3, []))["appliance-id"]


def replay_kubernetes(ch, box):
    """external-provisioner's CreateVolume for deploy/kubernetes' StorageClass and example claim."""
    sc = yaml.safe_load((m.K8S / "storageclass.yaml").read_text())
    # What the pinned provisioner sends: its parameter rules, --extra-create-metadata's keys.
    version = next(c["image"].rsplit(":", 1)[1] for _, d in m.documents()
                   if d["kind"] == "Deployment" for c in d["spec"]["template"]["spec"]["containers"]
                   if "/csi-provisioner:" in c["image"])
    fs, params = sidecars.provisioner_create_parameters(
        sc["parameters"], version, ("data", "default", "pvc-replay-k8s"))
    got = create(ch, "pvc-replay-k8s", 1 << 30, [w.capability("SINGLE_NODE_WRITER", fs)], params,
                 {"edgevol.io/appliance": box})
    assert isinstance(got, str), f"Kubernetes' CreateVolume refused: {got}"
    print("ok: Kubernetes StorageClass CreateVolume (extra metadata, topology) accepted")


def replay_nomad(ch, box):
    """`nomad volume create deploy/nomad/volume.hcl`: its capabilities, parameters, topology."""
    vol = co.unquote(hcl2.load(open(co.NOMAD / "volume.hcl")))
    fs = vol["mount_options"][0]["fs_type"]
    caps = []
    for cap in vol["capability"]:
        mode = o.NOMAD[cap["access_mode"]]
        caps.append(w.capability(mode, fs if cap["attachment_mode"] == "file-system" else None))
    got = create(ch, "nomad-replay-" + vol["id"], 64 << 20, caps, vol["parameters"][0],
                 {"edgevol.io/appliance": box})
    assert isinstance(got, str), f"Nomad's CreateVolume refused: {got}"
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
                assert isinstance(got, str), f"swarm {scope}/{sharing}/{kind}: refused {got}"
            else:
                assert got == grpc.StatusCode.INVALID_ARGUMENT, f"swarm {scope}/{sharing}/{kind}: {got}"
            n += 1
    print(f"ok: {n} Swarm scope x sharing x type combinations answered as the README says")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--proxy", required=True)
    ap.add_argument("--node", required=True)
    args = ap.parse_args()
    check_node(args.node)
    print(check_proxy(args.proxy))
    with grpc.insecure_channel("unix:" + args.proxy) as ch:
        box = appliance_id(ch)
        replay_kubernetes(ch, box)
        replay_nomad(ch, box)
        replay_swarm(ch, box)


if __name__ == "__main__":
    sys.exit(main())
