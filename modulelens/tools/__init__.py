"""Things done *with* captures: profile, verify a candidate, diff versions (kernels: modulelens.kernels)."""
