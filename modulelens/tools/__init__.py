"""Things done *with* captures: profile, verify a candidate, diff versions (and kernel export)."""
