"""The few CSI messages the deploy checks send, encoded and decoded by hand (protobuf wire format),
so the checks need no generated code: only field numbers from proto/csi.proto."""

# VolumeCapability.AccessMode.Mode (proto/csi.proto).
MODES = {
    "SINGLE_NODE_WRITER": 1,
    "SINGLE_NODE_READER_ONLY": 2,
    "MULTI_NODE_READER_ONLY": 3,
    "MULTI_NODE_SINGLE_WRITER": 4,
    "MULTI_NODE_MULTI_WRITER": 5,
    "SINGLE_NODE_SINGLE_WRITER": 6,
    "SINGLE_NODE_MULTI_WRITER": 7,
}


def varint(n):
    out = bytearray()
    n &= (1 << 64) - 1  # negative int64 as two's complement
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field(number, value):
    """A length-delimited (bytes, str, message) or varint (int) field."""
    if isinstance(value, int):
        return varint(number << 3) + varint(value)
    if isinstance(value, str):
        value = value.encode()
    return varint(number << 3 | 2) + varint(len(value)) + value


def string_map(number, mapping):
    return b"".join(field(number, field(1, k) + field(2, v)) for k, v in sorted(mapping.items()))


def capability(mode, fs_type=None):
    """A VolumeCapability: mount (with fs_type) when fs_type is given, else block."""
    access = field(3, field(1, MODES[mode]))
    if fs_type is None:
        return field(1, b"") + access
    return field(2, field(1, fs_type)) + access


def create_volume(name, size, caps, parameters, requisite=None, preferred=()):
    """A CreateVolumeRequest; requisite: the topology segment ({key: value}) the volume needs,
    or a list of segments (any one); preferred: segments in order of preference."""
    topology = b""
    if isinstance(requisite, dict):
        requisite = [requisite]
    if requisite or preferred:
        topology = field(7, b"".join(field(1, string_map(1, s)) for s in requisite or [])
                         + b"".join(field(2, string_map(1, s)) for s in preferred))
    return (
        field(1, name)
        + field(2, field(1, size))
        + b"".join(field(3, c) for c in caps)
        + string_map(4, parameters)
        + topology
    )


def delete_volume(volume_id):
    return field(1, volume_id)


def decode(data):
    """A message's fields as {number: [values]} (varints as int, the rest as bytes)."""
    fields, i = {}, 0

    def read_varint():
        nonlocal i
        shift = n = 0
        while True:
            b = data[i]
            i += 1
            n |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return n

    while i < len(data):
        key = read_varint()
        number, kind = key >> 3, key & 7
        if kind == 0:
            value = read_varint()
        elif kind == 2:
            length = read_varint()
            value, i = data[i : i + length], i + length
        elif kind == 1:
            value, i = data[i : i + 8], i + 8
        elif kind == 5:
            value, i = data[i : i + 4], i + 4
        else:
            raise ValueError(f"wire type {kind}")
        fields.setdefault(number, []).append(value)
    return fields


def decode_map(entries):
    out = {}
    for entry in entries:
        f = decode(entry)
        out[f.get(1, [b""])[0].decode()] = f.get(2, [b""])[0].decode()
    return out
