"""deploy/nomad and deploy/swarm parse and carry what the orchestrators need: the
Nomad plugin jobs (csi_plugin blocks, the node task privileged with the host's /dev, /sys,
/etc/nvme and state directory, sockets where the binaries listen) and the volume specification
(capabilities edgevol accepts, topology); the Swarm plugin's config.json (both CSI interface
types, its socket where the entrypoint listens, mounts, devices, capabilities), and the
documentation's scope x sharing table matching seed 004 and edgevol's refusals.

Usage: check_orchestrators.py  (exit 1 on any failure)
"""

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

import hcl2

import fleet
import hcl_eval
import manifests as m
import orchestrators as o
import sidecars

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
        return {unquote(k): unquote(x) for k, x in v.items() if not k.startswith("__")}
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


def site_vars():
    """deploy/nomad/site.vars.hcl: the variables both plugin jobs are run with."""
    return load(NOMAD / "site.vars.hcl")


def job_args(path, variables):
    """The task's args as Nomad evaluates them with `variables` (defaults filled in), after
    checking the variables are the ones the job declares and every required one is given."""
    declared = {}
    for block in load(path).get("variable", []):
        (name, body), = block.items()
        declared[name] = body
    unknown = set(variables) - set(declared)
    assert not unknown, f"{path.name}: variables {unknown} are not declared"
    values = {n: b["default"] for n, b in declared.items() if "default" in b}
    values.update(variables)
    missing = set(declared) - set(values)
    assert not missing, f"{path.name}: variables {missing} have no value"
    _, _, task = plugin_task(path)
    return hcl_eval.evaluate(only(task["config"])["args"], values)


def flags(args, name):
    return [a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")]


@check
def nomad_plugin_jobs():
    images = m.images()
    plugin_ids = set()
    site = site_vars()
    assert site["appliances"], "site.vars.hcl lists no appliance"
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
        args = job_args(path, site)
        socket = flag(args, listen_flag)
        assert socket == f"unix://{plugin['mount_dir']}/csi.sock", f"{path.name}: {socket}"
        if kind == "controller":
            assert args[0] == "proxy"
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
            assert flag(args, "node-id-file").startswith("/etc/nvme/")
            assert flag(args, "state-dir") == "/var/lib/edgevol-node"
    assert plugin_ids == {"edgevol"}, plugin_ids


@check
def nomad_jobs_serve_every_appliance_of_the_site():
    """Both jobs with the site's appliances, with one appliance, with a server name: the
    proxy gets ID=HOST:PORT per appliance; the node the same and a topology segment each."""
    controller, node = NOMAD / "controller.nomad.hcl", NOMAD / "node.nomad.hcl"
    for appliances in (site_vars()["appliances"], {"box-7": "192.0.2.10:9500"},
                       {"a": "h1:9500", "b": "[fd00::2]:9500", "c": "h3:9500"}):
        want = [f"{i}={a}" for i, a in sorted(appliances.items())]
        proxy = job_args(controller, {"appliances": appliances})
        assert flags(proxy, "appliance") == want, proxy
        assert not flags(proxy, "server-name"), "an empty server_name must leave the flag out"
        args = job_args(node, {"appliances": appliances})
        assert flags(args, "appliance") == want, args
        topology = [f"{fleet.APPLIANCE_KEY}={i}" for i in sorted(appliances)]
        assert flags(args, "topology") == topology, args
        assert not flags(args, "appliance-server-name"), args
    named = {"appliances": {"box-7": "h:1"}, "server_name": "edgevol"}
    assert flags(job_args(controller, named), "server-name") == ["edgevol"]
    assert flags(job_args(node, named), "appliance-server-name") == ["edgevol"]


def nomad_topologies(vol):
    """The segments of a volume specification's required topologies (ORed), in order."""
    return [t["segments"] for t in only(only(vol["topology_request"])["required"])["topology"]]


def nomad_volumes():
    return sorted(NOMAD.glob("volume*.hcl"))


@check
def nomad_volume_specification():
    site = site_vars()["appliances"]
    client = fleet.node_topology(sorted(site))
    accepted = sidecars.edgevol_parameter_keys(m.ROOT)
    replicated = 0
    for path in nomad_volumes():
        vol = load(path)
        assert vol["type"] == "csi" and vol["plugin_id"] == "edgevol", path.name
        assert vol["capability"], f"{path.name}: no capability"
        params = only(vol["parameters"])
        required = nomad_topologies(vol)
        # Each required topology as a term: the proxy's rules for replicas and appliances.
        terms = [{"matchLabelExpressions": [{"key": k, "values": [v]} for k, v in t.items()]}
                 for t in required]
        try:
            n = fleet.check_class({"metadata": {"name": path.name}, "parameters": params,
                                   "allowedTopologies": terms}, sorted(site), accepted)
        except fleet.Refused as e:
            raise AssertionError(f"{path.name}: {e}") from e
        replicated += n > 1
        for cap in vol["capability"]:
            mode = o.NOMAD[cap["access_mode"]]
            kind = {"file-system": "mount", "block-device": "block"}[cap["attachment_mode"]]
            assert o.accepted(mode, kind), f"{path.name}: edgevol refuses {cap}"
            assert n == 1 or mode not in o.MULTI_WRITER, f"{path.name}: replicated with {mode}"
        assert only(vol["mount_options"])["fs_type"] in ("ext4", "xfs")
        # The node job's clients (every appliance of the site) satisfy a requested topology.
        assert any(all(client.get(k) == v for k, v in t.items()) for t in required), \
            f"{path.name}: topologies {required} match no client ({client})"
    assert replicated, "no replicated Nomad volume example"


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
    names = [e["name"] for e in config["env"]]
    assert names == ["EDGEVOL_APPLIANCES", "EDGEVOL_APPLIANCE", "EDGEVOL_APPLIANCE_ID",
                     "EDGEVOL_SERVER_NAME"], names
    for env in config["env"]:
        assert env["settable"] == ["value"] and env["value"] == "", env
        assert f"${{{env['name']}" in entry, f"the entrypoint does not read {env['name']}"


def run_entrypoint(env, controller):
    """deploy/swarm's entrypoint under busybox sh, its paths moved into a scratch directory and
    edgevol/edgevol-node replaced by stubs that record their arguments: (exit code, stderr,
    {binary: argv}). `controller`: the node holds the controller certificate (a manager)."""
    busybox = shutil.which("busybox")
    assert busybox, "busybox is needed to run the Swarm entrypoint (apt-get install busybox-static)"
    with tempfile.TemporaryDirectory() as d:
        text = (SWARM / "edgevol-swarm-plugin").read_text()
        text = (text.replace("/usr/bin/", f"{d}/bin/").replace("/bin/busybox", busybox)
                .replace("/etc/edgevol", f"{d}/etc").replace("/run/", f"{d}/run/"))
        script = pathlib.Path(d, "entrypoint")
        script.write_text(text)
        os.makedirs(f"{d}/bin")
        os.makedirs(f"{d}/etc")
        if controller:
            pathlib.Path(d, "etc", "controller.pem").write_text("")
        for name in ("edgevol", "edgevol-node"):
            stub = pathlib.Path(d, "bin", name)
            # Each stub lives on a while after recording its arguments: the entrypoint stops
            # the other process as soon as one ends, which could otherwise come before the
            # other had recorded anything (seen once on a busy machine).
            stub.write_text(f"#!{busybox} sh\nfor a in \"$@\"; do echo \"$a\"; done > {d}/argv.{name}\n"
                            f"exec {busybox} sleep 2\n")
            stub.chmod(0o755)
        # A file the unquoted appliance list would glob to, were globbing left on.
        pathlib.Path(d, "box-8=8:9500").write_text("")
        run = subprocess.run([busybox, "sh", str(script)], cwd=d, capture_output=True, text=True,
                             timeout=30, env={"PATH": "/usr/bin:/bin", **env})
        argv = {}
        for name in ("edgevol", "edgevol-node"):
            path = pathlib.Path(d, f"argv.{name}")
            if path.exists():
                argv[name] = path.read_text().splitlines()
        return run.returncode, run.stderr, argv


def pairs(argv, flag):
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]


@check
def swarm_entrypoint_serves_every_appliance():
    site = {"EDGEVOL_APPLIANCES": "box-7=192.0.2.7:9500  box-8=[fd00::8]:9500"}
    want = ["box-7=192.0.2.7:9500", "box-8=[fd00::8]:9500"]
    rc, err, argv = run_entrypoint(site, controller=True)
    assert set(argv) == {"edgevol", "edgevol-node"}, (rc, err, argv)
    proxy, node = argv["edgevol"], argv["edgevol-node"]
    assert proxy[0] == "proxy" and pairs(proxy, "--appliance") == want, proxy
    assert pairs(proxy, "--node-socket") == [pairs(node, "--endpoint")[0]], (proxy, node)
    assert not pairs(proxy, "--server-name"), proxy
    assert pairs(node, "--appliance") == want, node
    assert pairs(node, "--topology") == ["edgevol.io/appliance=box-7", "edgevol.io/appliance=box-8"], node
    # One appliance, the form of the first releases, on a worker: as before.
    one = {"EDGEVOL_APPLIANCE": "192.0.2.10:9500", "EDGEVOL_APPLIANCE_ID": "box-7",
           "EDGEVOL_SERVER_NAME": "edgevol"}
    rc, err, argv = run_entrypoint(one, controller=False)
    assert set(argv) == {"edgevol-node"}, (rc, err, argv)
    node = argv["edgevol-node"]
    assert pairs(node, "--appliance") == ["192.0.2.10:9500"], node
    assert pairs(node, "--topology") == ["edgevol.io/appliance=box-7"], node
    assert pairs(node, "--appliance-server-name") == ["edgevol"], node
    assert pairs(node, "--endpoint")[0].endswith("/run/docker/plugins/csi.sock"), node
    rc, err, argv = run_entrypoint({**one, "EDGEVOL_APPLIANCE_ID": ""}, controller=True)
    assert rc != 0 and not argv and "EDGEVOL_APPLIANCE_ID" in err, (rc, err, argv)
    rc, err, argv = run_entrypoint({}, controller=True)
    assert rc != 0 and not argv and "EDGEVOL_APPLIANCES=" in err, (rc, err, argv)
    rc, err, argv = run_entrypoint({"EDGEVOL_APPLIANCES": "box-7=h:1 192.0.2.8:9500"}, controller=True)
    assert rc == 2 and not argv and "'192.0.2.8:9500': expected ID=HOST:PORT" in err, (rc, err, argv)


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
