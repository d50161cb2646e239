"""deploy/nomad and deploy/swarm parse and carry what the orchestrators need: the
Nomad plugin jobs (csi_plugin blocks, the node task privileged with the host's /dev, /sys,
/etc/nvme and state directory, sockets where the binaries listen) and the volume specification
(capabilities edgevol accepts, topology); the Swarm plugin's config.json (both CSI interface
types, its socket where the entrypoint listens, mounts, devices, capabilities), and the
documentation's scope x sharing table matching seed 004 and edgevol's refusals.

Usage: check_orchestrators.py  (exit 1 on any failure)
"""

import json
import re
import sys

import hcl2

import manifests as m
import orchestrators as o

NOMAD = m.ROOT / "deploy" / "nomad"
SWARM = m.ROOT / "deploy" / "swarm"
CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def unquote(v):
    """python-hcl2 keeps string quotes and block labels' quotes: strip them, recursively."""
    if isinstance(v, str):
        return v[1:-1] if len(v) >= 2 and v[0] == v[-1] == '"' else v
    if isinstance(v, list):
        return [unquote(x) for x in v]
    if isinstance(v, dict):
        return {unquote(k): unquote(x) for k, x in v.items() if k != "__is_block__"}
    return v


def load(path):
    return unquote(hcl2.load(open(path)))


def only(blocks):
    assert len(blocks) == 1, blocks
    return blocks[0]


def labelled(blocks):
    """A list of {label: body} blocks as one (label, body)."""
    (label, body), = only(blocks).items()
    return label, body


def plugin_task(path):
    job_name, job = labelled(load(path)["job"])
    _, group = labelled(job["group"])
    _, task = labelled(group["task"])
    return job_name, job, task


def flag(args, name):
    vals = [a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")]
    return vals[0] if vals else None


@check
def nomad_plugin_jobs():
    images = m.images()
    plugin_ids = set()
    for path, kind, image, listen_flag in (
        (NOMAD / "controller.nomad.hcl", "controller", images["cli"], "listen"),
        (NOMAD / "node.nomad.hcl", "node", images["node"], "endpoint"),
    ):
        _, job, task = plugin_task(path)
        assert task["driver"] == "docker"
        config = only(task["config"])
        plugin = only(task["csi_plugin"])
        assert plugin["type"] == kind, plugin
        plugin_ids.add(plugin["id"])
        assert config["image"] == image, f"{path.name}: {config['image']} is not {image}"
        socket = flag(config["args"], listen_flag)
        assert socket == f"unix://{plugin['mount_dir']}/csi.sock", f"{path.name}: {socket}"
        if kind == "controller":
            assert config["args"][0] == "proxy"
            assert job["type"] == "service"
        else:
            assert job["type"] == "system", "the node plugin runs on every client"
            assert config["privileged"] is True and config["network_mode"] == "host"
            binds = {b["target"]: b["source"] for b in config["mount"] if b["type"] == "bind"}
            for host in ("/dev", "/sys", "/etc/nvme", "/var/lib/edgevol-node", "/etc/edgevol"):
                assert binds.get(host) == host, f"node task lacks the host's {host}"
            # Read-only, and created when missing (a `volumes` bind; a `mount` bind fails).
            assert "/lib/modules" not in binds, "a mount block fails on a host without /lib/modules"
            assert config.get("volumes") == ["/lib/modules:/lib/modules:ro"], config.get("volumes")
            assert flag(config["args"], "node-id-file").startswith("/etc/nvme/")
            assert flag(config["args"], "state-dir") == "/var/lib/edgevol-node"
            assert flag(config["args"], "topology").startswith("edgevol.io/appliance=")
    assert plugin_ids == {"edgevol"}, plugin_ids


@check
def nomad_volume_specification():
    vol = load(NOMAD / "volume.hcl")
    assert vol["type"] == "csi" and vol["plugin_id"] == "edgevol"
    assert vol["capability"], "no capability"
    for cap in vol["capability"]:
        mode = o.NOMAD[cap["access_mode"]]
        kind = {"file-system": "mount", "block-device": "block"}[cap["attachment_mode"]]
        assert o.accepted(mode, kind), f"edgevol refuses {cap}"
    assert only(vol["mount_options"])["fs_type"] in ("ext4", "xfs")
    segments = only(only(only(vol["topology_request"])["required"])["topology"])["segments"]
    assert list(segments) == ["edgevol.io/appliance"], segments
    assert set(vol["parameters"][0]) <= {"provisioning", "fsType"}


@check
def swarm_plugin_config():
    config = json.loads((SWARM / "config.json").read_text())
    assert sorted(config["interface"]["types"]) == ["docker.csicontroller/1.0", "docker.csinode/1.0"]
    socket = config["interface"]["socket"]
    entry = (SWARM / config["entrypoint"][0].rsplit("/", 1)[1]).read_text()
    assert f"plugin_socket=/run/docker/plugins/{socket}" in entry, "entrypoint listens elsewhere"
    assert "--node-socket" in entry
    assert config["network"]["type"] == "host"
    assert "CAP_SYS_ADMIN" in config["linux"]["capabilities"]
    assert config["linux"]["allowAllDevices"] is True
    assert config["propagatedMount"]
    mounts = {mt["destination"]: mt for mt in config["mounts"]}
    for host in ("/dev", "/sys", "/etc/nvme", "/var/lib/edgevol-node", "/etc/edgevol"):
        assert mounts[host]["source"] == host and mounts[host]["type"] == "bind", host
    # Read-only; its source settable for a host without /lib/modules.
    modules = mounts["/lib/modules"]
    assert "ro" in modules["options"] and modules["settable"] == ["source"], modules
    assert f"{modules['name']}.source=" in modules["description"], modules["description"]
    for name in ("EDGEVOL_APPLIANCE", "EDGEVOL_SERVER_NAME", "EDGEVOL_APPLIANCE_ID"):
        env = next(e for e in config["env"] if e["name"] == name)
        assert env["settable"] == ["value"]
        assert f"${{{name}:?" in entry, f"the entrypoint does not require {name}"


def swarm_table():
    """The documentation's Swarm scope x sharing table (README.md or a docs/ page), as
    {(scope, sharing): [CSI mode, mount, block]}, and the file holding it."""
    for path in [m.ROOT / "README.md", *sorted((m.ROOT / "docs").glob("*.md"))]:
        rows = {}
        for line in path.read_text().splitlines():
            cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
            if len(cells) == 5 and cells[0] in ("single", "multi"):
                rows[(cells[0], cells[1])] = cells[2:]
        if rows:
            return rows, path.relative_to(m.ROOT)
    raise AssertionError("no Swarm scope x sharing table in README.md or docs/*.md")


@check
def docs_swarm_table_matches_seed_004_and_edgevol():
    rows, path = swarm_table()
    assert set(rows) == set(o.SWARM), f"{path} table rows: {sorted(rows)}"
    for key, mode in o.SWARM.items():
        csi, mount, block = rows[key]
        if mode is None:
            assert "refused by Docker" in csi, (key, csi)
            continue
        assert csi == mode, (key, csi)
        for cell, kind in ((mount, "mount"), (block, "block")):
            want = "yes" if o.accepted(mode, kind) else "refused"
            assert cell.startswith(want), (key, kind, cell)


def main():
    failed = 0
    for fn in CHECKS:
        try:
            fn()
            print(f"ok: {fn.__name__}")
        except (AssertionError, KeyError, StopIteration) as e:
            failed += 1
            print(f"FAILED: {fn.__name__}: {e!r}")
    print(f"{len(CHECKS) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
