"""The capture format: typed JSON metadata plus content-addressed raw tensor payloads."""

from modulelens.format.shape_only import ShapeOnly
from modulelens.format.spec import FORMAT_NAME, FORMAT_VERSION
from modulelens.format.values import Unrecorded, register_codec, register_state_codec

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "ShapeOnly", "Unrecorded", "register_codec", "register_state_codec"]
