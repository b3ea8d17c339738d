"""Constants of the on-disk capture format (documented in docs/format.md)."""

FORMAT_NAME = "modulelens.capture"
FORMAT_VERSION = 1
