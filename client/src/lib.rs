//! ftkv client (under construction).
