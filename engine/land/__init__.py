"""The landing path: sources, decoders, typed landing and pipeline runs."""
