//! Per-volume quality of service, sans-I/O: the limits a volume's mutable parameters set
//! ([`limits`]), the token bucket that enforces one rate ([`bucket`]) and the per-volume
//! [`limiter`] that admits commands in order across all of the volume's queues. Nothing here
//! reads a clock or sleeps: callers pass the time (nanoseconds since an epoch of their choice)
//! and sleep until [`limiter::Limiter::next_ready`] themselves, so every rule is tested with
//! virtual time. The target's wiring is `crate::nvme::throttle`.

pub mod bucket;
pub mod limiter;
pub mod limits;

pub use bucket::{Bucket, SLICE_NS};
pub use limiter::Limiter;
pub use limits::{Cost, Direction, LimitError, Limits};
