//! The edgevol CSI node plugin (a later issue).
