"""Several appliances in deploy/: the appliance list (fleet.toml, the format of `edgevol proxy
--config`, cli/src/fleet_config.rs), the topology keys nodes report (node/src/appliances.rs)
and StorageClasses use, and the `replicas` parameter the proxy consumes before the appliances
see a CreateVolume (cli/src/fleet_replicas.rs). Shared by the manifest checks
(check_manifests.py, check_orchestrators.py) and the replay against dev appliances
(grpcio_unix.py).
"""

import re
import tomllib

import yaml

import manifests as m

APPLIANCE_KEY = "edgevol.io/appliance"
REACH_PREFIX = "appliance.edgevol.io/"
REACHES = "true"
_ID = re.compile(r"^(?!-)[a-z0-9-]{1,32}(?<!-)$")


class Refused(Exception):
    """edgevol (its proxy, node plugin or appliance) refuses the configuration; the message
    says why."""


def _const(path, name):
    """A `pub const NAME: &str = "...";` of a Rust source file."""
    text = (m.ROOT / path).read_text()
    found = re.search(rf'pub const {name}: &str = "([^"]*)";', text)
    assert found, f"{path}: no const {name}"
    return found.group(1)


def code_facts():
    """The keys as driver/src/fleet.rs spells them (the proxy and the node plugin share it)."""
    return {name: _const("driver/src/fleet.rs", name)
            for name in ("APPLIANCE_KEY", "REACH_KEY_PREFIX", "REACHES", "REPLICAS_PARAM")}


def check_code_facts():
    """This module's copies of the keys are the code's: a rename in the code fails the deploy
    checks instead of letting them check the old spelling."""
    facts = code_facts()
    mine = {"APPLIANCE_KEY": APPLIANCE_KEY, "REACH_KEY_PREFIX": REACH_PREFIX, "REACHES": REACHES}
    for name, value in mine.items():
        assert facts[name] == value, f"driver/src/fleet.rs {name} = {facts[name]!r}, checks use {value!r}"


def replicas_param():
    """The StorageClass key the proxy reads and strips: REPLICAS_PARAM, provided the proxy
    still removes it from the legs' CreateVolume (else the appliances would refuse it)."""
    key = code_facts()["REPLICAS_PARAM"]
    proxy = (m.ROOT / "cli" / "src" / "fleet_replicas.rs").read_text()
    assert "parameters.remove(REPLICAS_PARAM)" in proxy, \
        "cli/src/fleet_replicas.rs no longer strips REPLICAS_PARAM from the legs' parameters"
    return key


def check_id(ident):
    if not isinstance(ident, str) or not _ID.match(ident):
        raise Refused(f"appliance id {ident!r}: use 1-32 of [a-z0-9-], not starting or ending with '-'")


def parse_fleet(text):
    """The appliances of an `edgevol proxy --config` file, as [(id, address, server_name)], with
    the rules `edgevol proxy` applies at start: only [[appliance]] tables of id, address and
    an optional server_name; ids valid; at least one; no id or address twice."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise Refused(f"fleet.toml: {e}") from e
    unknown = set(doc) - {"appliance"}
    if unknown:
        raise Refused(f"fleet.toml: unknown keys {sorted(unknown)}")
    out = []
    for a in doc.get("appliance", []):
        if not isinstance(a, dict):
            raise Refused("fleet.toml: appliance must be [[appliance]] tables")
        extra = set(a) - {"id", "address", "server_name"}
        missing = {"id", "address"} - set(a)
        if extra or missing:
            raise Refused(f"fleet.toml: appliance {a}: unknown {sorted(extra)}, missing {sorted(missing)}")
        check_id(a["id"])
        if not re.match(r"^(\[[0-9a-fA-F:.]+\]|[^:\s\[\]]+):\d{1,5}$", a["address"]):
            raise Refused(f"fleet.toml: appliance {a['id']}: address {a['address']!r} is not HOST:PORT")
        out.append((a["id"], a["address"], a.get("server_name")))
    if not out:
        raise Refused("fleet.toml lists no appliance")
    for i, (ident, addr, _) in enumerate(out):
        for other, other_addr, _ in out[:i]:
            if ident == other:
                raise Refused(f"appliance id {ident} given twice")
            if addr == other_addr:
                raise Refused(f"appliance address {addr} given twice")
    return out


def node_topology(appliance_ids, extra=()):
    """What edgevol-node reports for `--topology edgevol.io/appliance=ID` per appliance (and
    other KEY=VALUE segments): a presence key per appliance, and the plain key naming the
    first, the node's home box."""
    out = dict(extra)
    for ident in appliance_ids:
        check_id(ident)
        out[REACH_PREFIX + ident] = REACHES
    if appliance_ids:
        out[APPLIANCE_KEY] = appliance_ids[0]
    return out


def appliances_of_term(term):
    """(appliances a node matching the term is sure to reach, every appliance id it names)
    for one allowedTopologies term (its expressions are ANDed)."""
    reached, named = set(), set()
    for e in term["matchLabelExpressions"]:
        key, values = e["key"], e["values"]
        if key == APPLIANCE_KEY:
            for v in values:
                check_id(v)
            named |= set(values)
            if len(values) == 1:
                reached |= set(values)
        elif key.startswith(REACH_PREFIX):
            ident = key[len(REACH_PREFIX):]
            check_id(ident)
            if values != [REACHES]:
                raise Refused(f"topology key {key}: nodes report it only as {REACHES!r}, not {values}")
            named.add(ident)
            reached.add(ident)
        else:
            raise Refused(f"topology key {key!r} is reported by no edgevol node")
    return reached, named


def check_class(sc, fleet_ids, appliance_keys):
    """Refused unless StorageClass `sc` can provision through a proxy serving `fleet_ids`:
    every appliance its topology names is in the fleet, `replicas` is 1-3 and, above 1, a
    fleet of that many appliances and a term whose nodes reach that many; the parameters left
    once the proxy took `replicas` are keys the appliance accepts. Returns the replicas."""
    terms = sc.get("allowedTopologies", [])
    named, reach = set(), []
    for term in terms:
        r, n = appliances_of_term(term)
        named |= n
        reach.append(r)
    unknown = named - set(fleet_ids)
    if unknown:
        raise Refused(f"StorageClass {sc['metadata']['name']}: appliances {sorted(unknown)} are "
                      f"not in fleet.toml ({sorted(fleet_ids)})")
    params = dict(sc.get("parameters", {}))
    key = replicas_param()
    replicas = params.pop(key, "1")
    if replicas not in ("1", "2", "3"):
        raise Refused(f"parameter {key}={replicas!r}: expected 1, 2 or 3")
    n = int(replicas)
    if n > 1:
        if len(fleet_ids) < 2:
            raise Refused(f"parameter {key}={replicas}: a proxy with one appliance forwards "
                          "untouched, and the appliance refuses it")
        if len(fleet_ids) < n:
            raise Refused(f"parameter {key}={replicas}: fleet.toml has {len(fleet_ids)} appliances")
        if terms and not any(len(r) >= n for r in reach):
            raise Refused(f"StorageClass {sc['metadata']['name']}: {key}={replicas} needs a "
                          f"topology term whose nodes reach {n} appliances (presence keys "
                          f"{REACH_PREFIX}<id>), each leg on its own")
    refused = set(params) - set(appliance_keys)
    if refused:
        raise Refused(f"edgevol refuses parameters {sorted(refused)}")
    return n


def flatten(terms):
    """external-provisioner's flatten(): allowedTopologies terms as CSI segments, each
    expression's values distributed over the term's AND."""
    out = []
    for term in terms:
        segments = [{}]
        for e in term["matchLabelExpressions"]:
            segments = [dict(s, **{e["key"]: v}) for v in e["values"] for s in segments]
        out += segments
    unique = []
    for s in out:
        if s not in unique:
            unique.append(s)
    return unique


def accessibility_requirements(sc, node_segment):
    """(requisite, preferred) as external-provisioner (GenerateAccessibilityRequirements, no
    --strict-topology) sends them when the scheduler picked a node whose edgevol topology is
    `node_segment` (WaitForFirstConsumer), in a cluster of such nodes: the class's flattened
    terms, or the nodes' segments; preferred is that list from the first segment the node
    has. None when no segment fits the node (the scheduler would not pick it)."""
    requisite = flatten(sc["allowedTopologies"]) if sc.get("allowedTopologies") else [dict(node_segment)]
    for i, segment in enumerate(requisite):
        if all(node_segment.get(k) == v for k, v in segment.items()):
            return requisite, requisite[i:] + requisite[:i]
    return None


def appliance_of(volume_id):
    """The appliance a (leg's) volume id names: `box-7-v12` is on box-7."""
    found = re.match(r"^([a-z0-9-]+)-v\d+$", volume_id)
    assert found, f"volume id {volume_id!r} names no appliance"
    return found.group(1)


def segment_appliances(segment):
    """The appliances a requisite segment allows (None: any): its presence keys where it has
    any (the plain key then names only a node's home box), else its plain key."""
    named = {k[len(REACH_PREFIX):] for k, v in segment.items() if k.startswith(REACH_PREFIX) and v == REACHES}
    if not named and APPLIANCE_KEY in segment:
        named.add(segment[APPLIANCE_KEY])
    return named or None


def fleet_of(docs):
    """The fleet.toml of the ConfigMap edgevol-config in rendered manifests."""
    cm = m.find(docs, "ConfigMap", "edgevol-config")[0]
    assert "fleet.toml" in cm["data"], "ConfigMap edgevol-config has no fleet.toml"
    return parse_fleet(cm["data"]["fleet.toml"])


def storage_classes(docs):
    """The kustomization's StorageClasses and the examples' (examples/*.yaml)."""
    out = [d for _, d in docs if d["kind"] == "StorageClass"]
    for path in sorted((m.K8S / "examples").glob("*.yaml")):
        out += [d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == "StorageClass"]
    return out
