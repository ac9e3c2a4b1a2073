"""Scripts that write the repository's generated files (run from the repository's root, e.g.
``python -m tools.stan_library --write``); they import the installed package and are not part of it."""
