//! edgevol core: the `no_std` volume manager.
#![no_std]
#![forbid(unsafe_code)]
