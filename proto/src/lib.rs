//! Generated CSI code.
