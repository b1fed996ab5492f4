//! raptor-routing: see the crate README.
