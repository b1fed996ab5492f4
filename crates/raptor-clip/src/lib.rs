//! raptor-clip: see the crate README.
