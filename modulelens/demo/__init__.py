"""The `modulelens demo` job: a small recommendation model trained under capture."""
