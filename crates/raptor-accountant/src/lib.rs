//! raptor-accountant: see the crate README.
