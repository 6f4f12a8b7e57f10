//! ftkv node (under construction).
