"""The built-in derive tasks' engines: ``transcribe`` (speech to text) and ``link_preview``."""
