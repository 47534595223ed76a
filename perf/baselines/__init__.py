"""Reference services the benchmark compares against; not part of the product."""
