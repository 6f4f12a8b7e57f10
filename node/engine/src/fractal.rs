//! The fractal tree (Bε-tree) engine. Under construction in issue 3.
