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

import csi_wire as w

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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--proxy", required=True)
    ap.add_argument("--node", required=True)
    args = ap.parse_args()
    check_node(args.node)
    print(check_proxy(args.proxy))


if __name__ == "__main__":
    sys.exit(main())
