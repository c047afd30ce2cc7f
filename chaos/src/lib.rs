//! Fault injection and drills for tandem.

pub mod relay;
