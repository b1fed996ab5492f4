//! raptor-muon: see the crate README.
