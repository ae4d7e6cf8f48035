"""Speed benchmarks (also run by `multispec bench ...` and the scripts under benchmarks/)."""
