"""How Nomad and Docker Swarm ask for access, as CSI access modes, and what edgevol accepts:
shared by the file checks (check_orchestrators.py) and the replay against the appliance
(grpcio_unix.py)."""

# Swarm's --scope x --sharing (seed 004, "Volume Sharing"): the CSI access mode swarmkit sends,
# or None where Docker itself refuses the combination.
SWARM = {
    ("single", "none"): "SINGLE_NODE_WRITER",
    ("single", "readonly"): "SINGLE_NODE_READER_ONLY",
    ("single", "onewriter"): "SINGLE_NODE_WRITER",
    ("single", "all"): "SINGLE_NODE_WRITER",
    ("multi", "none"): None,
    ("multi", "readonly"): "MULTI_NODE_READER_ONLY",
    ("multi", "onewriter"): "MULTI_NODE_SINGLE_WRITER",
    ("multi", "all"): "MULTI_NODE_MULTI_WRITER",
}

# Nomad's access_mode values.
NOMAD = {
    "single-node-reader-only": "SINGLE_NODE_READER_ONLY",
    "single-node-writer": "SINGLE_NODE_WRITER",
    "multi-node-reader-only": "MULTI_NODE_READER_ONLY",
    "multi-node-single-writer": "MULTI_NODE_SINGLE_WRITER",
    "multi-node-multi-writer": "MULTI_NODE_MULTI_WRITER",
}

# Modes with a writer on several nodes: refused for mounted volumes (ext4/xfs are not cluster
# filesystems: appliance/src/csi/capability.rs), accepted as raw block volumes.
MULTI_WRITER = {"MULTI_NODE_SINGLE_WRITER", "MULTI_NODE_MULTI_WRITER"}


def accepted(mode, volume_type):
    """Whether edgevol accepts a CSI access mode for a mount or block volume."""
    return volume_type == "block" or mode not in MULTI_WRITER
