//! Devices behind edgevol-core.
