//! Jepsen-style harness (being written).
