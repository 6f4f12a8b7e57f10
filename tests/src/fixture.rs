//! Cluster fixture (being written).
