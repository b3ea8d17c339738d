"""Capture: constructor tracking, the tracer, and the `modulelens run` bootstrap."""

from modulelens.errors import CaptureWarning
from modulelens.tracing.api import capture
from modulelens.tracing.init_tracking import get_init_record, track_init
from modulelens.tracing.options import PayloadPolicy, Recording
from modulelens.tracing.tracer import Tracer

__all__ = ["CaptureWarning", "PayloadPolicy", "Recording", "Tracer", "capture", "get_init_record", "track_init"]
