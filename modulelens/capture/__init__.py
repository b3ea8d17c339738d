"""Capture: constructor tracking, the tracer, and the `modulelens run` bootstrap."""

from modulelens.capture.api import capture
from modulelens.capture.init_tracking import get_init_record, track_init
from modulelens.capture.tracer import CaptureWarning, Tracer

__all__ = ["CaptureWarning", "Tracer", "capture", "get_init_record", "track_init"]
