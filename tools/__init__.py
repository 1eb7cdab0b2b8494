"""Tools that write the repository's generated files (docs/reference, k8s/)."""
