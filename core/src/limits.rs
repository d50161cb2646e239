//! Fixed limits. Reaching a count limit is `Error::ResourceExhausted(Limit::..)`; exceeding a size
//! limit of an argument is `Error::InvalidArgument(..)`, as CSI wants.

/// Longest volume, snapshot or group name, in bytes (CSI: 128).
pub const MAX_NAME_LEN: usize = 128;
/// Largest parameter map: the sum of key and value lengths, in bytes (CSI: 4 KiB).
pub const MAX_PARAMETERS_LEN: usize = 4096;
/// Longest NVMe host NQN, in bytes (NVMe base spec: 223).
pub const MAX_NQN_LEN: usize = 223;
/// Volumes in a pool.
pub const MAX_VOLUMES: usize = 16_384;
/// Snapshots in a pool, group snapshot members included.
pub const MAX_SNAPSHOTS: usize = 16_384;
/// Volume groups in a pool.
pub const MAX_GROUPS: usize = 1024;
/// Volumes in one group (so a group snapshot record stays small).
pub const MAX_GROUP_MEMBERS: usize = 256;
/// Group snapshots in a pool.
pub const MAX_GROUP_SNAPSHOTS: usize = 1024;
/// Hosts a volume may be published to at once.
pub const MAX_PUBLISHED_HOSTS: usize = 16;
/// Largest volume, in bytes (1 PiB).
pub const MAX_VOLUME_SIZE: u64 = 1 << 50;
/// Smallest and largest cluster size, in bytes.
pub const MIN_CLUSTER_SIZE: u32 = 4096;
/// See [`MIN_CLUSTER_SIZE`].
pub const MAX_CLUSTER_SIZE: u32 = 64 << 20;
